// float16 weight storage for products with a constant weight: MatMul(A, W) where W is a float32
// initializer [K, N] runs with a float16 copy of W made once (half the bytes to stream, which is
// what bounds batch-1 decode), widened to float32 while streaming, float32 accumulation
// (ops/gemv.h). Opt-in (`generate/bench/verify --half-weights`): it changes numerics, so its
// precision is measured (verify, safe fusion) rather than assumed. The original model is not
// changed; the fp32 weights stay in memory next to the copies.
#pragma once

#include <functional>
#include <memory>
#include <optional>

#include "ir/graph.h"
#include "ops/kernel.h"

namespace gaf {

// The kernel of MatMul(A, W) with W's float16 copy; A float32 [..., K] with at most 4 rows (decode).
// Other calls (more rows: prefill is compute-bound; another weight shape; non-float A) run the
// reference MatMul on the original float32 inputs.
KernelInfo HalfWeightMatMulKernel(const Tensor& weight);

// For SessionOptions::node_kernels: every MatMul of the main graph whose weight is a float32 2-D
// initializer (copies shared by initializer name).
std::function<std::optional<KernelInfo>(const Node&, const Model&)> HalfWeightProvider();

}  // namespace gaf
