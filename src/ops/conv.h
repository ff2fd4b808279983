// float32 convolution with an epilogue hook: the fused kernels of Conv groups apply their
// generated epilogue (bias, residual, activation) to each finished block of the output while
// it is still in cache, instead of in a second pass over the whole tensor.
#pragma once

#include <cstdint>
#include <functional>

#include "ir/graph.h"
#include "ir/tensor.h"

namespace gaf {

// Called on a finished block of Y viewed as [N*M rows, out_size columns]: rows [r0, r1),
// columns [c0, c1). Blocks are disjoint; calls may come from several threads at once.
using ConvEpilogue = std::function<void(int64_t r0, int64_t r1, int64_t c0, int64_t c1)>;

// Output shape of `node` (Conv) for input and weight shapes; gaf::Error naming the node when
// they do not fit its attributes.
Shape ConvOutputShape(const Node& node, const Shape& x, const Shape& w);

// Y = Conv(X, W, B) for `node`'s attributes (float32). Y is allocated here (not zero-filled)
// unless it already is a float32 tensor of the output shape.
// The output is produced in tiles: per image and group, runs of whole output rows whose im2col
// columns fit in cache, each one GEMM, bias added on the tile; then `epilogue` (may be empty)
// sees the tile. Depthwise convolutions produce one channel plane at a time.
void ConvF32(const Node& node, const Tensor& X, const Tensor& W, const Tensor* B, Tensor* Y,
             const ConvEpilogue& epilogue);

}  // namespace gaf
