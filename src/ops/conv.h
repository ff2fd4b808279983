// float32 convolution with an epilogue hook: the fused kernels of Conv groups apply their
// generated epilogue (bias, residual, activation) to each finished block of the output while
// it is still in cache, instead of in a second pass over the whole tensor.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "ir/graph.h"
#include "ir/tensor.h"
#include "ops/kernel.h"

namespace gaf {

// Called on a finished block of Y viewed as [N*M rows, out_size columns]: rows [r0, r1),
// columns [c0, c1). Blocks are disjoint; calls may come from several threads at once.
using ConvEpilogue = std::function<void(int64_t r0, int64_t r1, int64_t c0, int64_t c1)>;

// Output shape of `node` (Conv) for input and weight shapes; gaf::Error naming the node when
// they do not fit its attributes.
Shape ConvOutputShape(const Node& node, const Shape& x, const Shape& w);

// The geometry of a Conv call, spatial dims right-aligned in 3 slots (unused ones are 1 / 0).
struct ConvGeometry {
  int nsp = 0;
  int64_t group = 1;
  std::array<int64_t, 3> in{1, 1, 1}, out{1, 1, 1}, k{1, 1, 1}, s{1, 1, 1}, d{1, 1, 1}, pb{0, 0, 0}, pe{0, 0, 0};
};
ConvGeometry ConvGeometryOf(const Node& node, const Shape& x, const Shape& w);
// The same for a pooling window `kernel` (MaxPool/AveragePool attributes, ceil_mode included).
ConvGeometry PoolGeometryOf(const Node& node, const Shape& x, const std::vector<int64_t>& kernel);

// A float32 Conv prepared once for a constant weight: oneDNN's convolution on its own blocked
// layouts (brgconv / jit kernels), the weight reordered once, inputs and outputs kept NCHW
// (reordered around each call). Create() returns null where our tiled path is expected to be as
// fast or faster (1x1 and depthwise convolutions, groups, few channels, small outputs, 1-D/3-D),
// or oneDNN has no implementation. Run() handles any input shape (one plan per shape, the last
// kept), and is safe to call from several threads.
// Work oneDNN applies to the convolution's output before writing it (its post-ops), in order:
// adding a residual (the tensor passed to Run), or an activation.
struct ConvPostOp {
  enum Kind { kSum, kRelu, kClip } kind = kRelu;
  float alpha = 0, beta = 0;  // kRelu: slope for negative values (LeakyRelu); kClip: min, max
};

class PreparedConv {
 public:
  static std::shared_ptr<PreparedConv> Create(const Node& node, const Tensor& weight, const Tensor* bias,
                                              std::vector<ConvPostOp> post_ops = {});
  // y = post_ops(conv(x) + bias); `residual` (NCHW, the output's shape) when a kSum post-op is set.
  void Run(const Tensor& x, Tensor* y, const Tensor* residual = nullptr);
  const std::vector<ConvPostOp>& post_ops() const;
  ~PreparedConv();
  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// A KernelInfo running `conv`. For a Conv node (inputs x, w[, b]) the registry's Conv takes the
// calls it does not fit; for a stage of a fused kernel (`fused_stage`: inputs x and the residual
// of a kSum post-op, or none) there is no such fallback, since the post-ops are part of the stage.
KernelInfo PreparedConvKernel(std::shared_ptr<PreparedConv> conv, bool fused_stage = false);

// Y = Conv(X, W, B) for `node`'s attributes (float32). Y is allocated here (not zero-filled)
// unless it already is a float32 tensor of the output shape.
// The output is produced in tiles: per image and group, runs of whole output rows whose im2col
// columns fit in cache, each one GEMM, bias added on the tile; then `epilogue` (may be empty)
// sees the tile. Depthwise convolutions produce one channel plane at a time.
void ConvF32(const Node& node, const Tensor& X, const Tensor& W, const Tensor* B, Tensor* Y,
             const ConvEpilogue& epilogue);

}  // namespace gaf
