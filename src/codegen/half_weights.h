// float16 weight storage for products with a constant weight: MatMul(A, W) where W is a float32
// initializer [K, N] runs with a float16 copy of W made once (half the bytes to stream, which is
// what bounds batch-1 decode), widened to float32 while streaming, float32 accumulation
// (ops/panel_gemm.h HalfPanelWeight). Opt-in (`generate/bench/verify --half-weights`, `fuse --safe --half-weights`): it
// changes numerics, so its precision is measured (verify, safe fusion's gate) rather than
// assumed. The model file is not changed (its weights stay float32, portable and exact for other
// runtimes); the fp32 weights stay in memory next to the copies.
#pragma once

#include <functional>
#include <memory>
#include <optional>

#include "ir/graph.h"
#include "ops/kernel.h"
#include "runtime/session.h"

namespace gaf {

// Which products use the float16 copy: none; decode-shaped ones only (A with at most 4 rows; a
// prompt keeps float32 weights, through a float32 panel copy of its own); or every product (what
// --half-weights and a gated model run, and what the precision gate of `fuse --safe
// --half-weights` measures: a prompt's products on the float16 panels too, as fast as float32's
// there, and no float32 copy beside them).
enum class HalfWeights { kOff = 0, kDecode = 1, kAll = 2 };

// Metadata key `fuse --safe --half-weights` writes into a fused model whose float16 weight
// storage passed the precision gate; generate runs such a model with HalfWeights::kAll.
inline constexpr const char* kHalfWeightsMetadataKey = "graph_autofusion.half_weights";
bool ModelRequestsHalfWeights(const Model& model);

// The kernel of MatMul(A, W) with W's float16 copy; A float32 [..., K] with at most 4 rows
// (kDecode) or any number of rows (kAll). Other calls (more rows; another weight shape;
// non-float A) run the reference MatMul on the original float32 inputs.
KernelInfo HalfWeightMatMulKernel(const Tensor& weight, HalfWeights mode = HalfWeights::kAll);

// For SessionOptions::node_kernels: every MatMul of the main graph whose weight is a float32 2-D
// initializer, and the plan's SiblingMatMul, GatedMatMul and ResidualMatMul nodes of such weights
// (the decode step's q/k/v and gate/up streamed as one set of tasks, the residual Adds after o and
// down); copies shared by initializer name.
std::function<std::optional<KernelInfo>(const Node&, const Model&)> HalfWeightProvider(
    HalfWeights mode = HalfWeights::kAll);

// Sets options.node_kernels to HalfWeightProvider(mode), with siblings grouped and residual Adds
// folded into their products (nothing for kOff).
void UseHalfWeights(SessionOptions& options, HalfWeights mode = HalfWeights::kAll);

}  // namespace gaf
