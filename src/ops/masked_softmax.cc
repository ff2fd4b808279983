// MaskedSoftmax (domain ai.graph_autofusion.plan): attention's Softmax together with the
// elementwise operators before it, as the plan rewrite makes it from
//
//   Softmax(Add(Div(X, c) or Mul(X, c), mask), axis = last)       (and the forms without one of them)
//
//   inputs  X [, c] [, mask]        c a float scalar (one element), mask broadcast to X's shape
//   attrs   scale  0 none, 1 X / c, 2 X * c;  mask  0 or 1;  axis  Softmax's axis (its opset's default
//           filled in);  fallback  the original nodes, as a graph on the node's inputs
//
// Each row of the last axis is scaled, masked and normalized while it is in L1: one read of X and
// one write of the result instead of three of each (the scores of a 256-token prefill are 4 MB
// per layer). The arithmetic is the original's, operator by operator (true division, the same
// float rounding of each step, the Softmax kernel's row function), so results are bit-identical.
// Shapes or types outside that form (a mask that would enlarge X, a Softmax over another axis,
// a float16 or other non-float32 tensor) run the fallback graph.
#include <algorithm>
#include <vector>

#include "ops/attention_kernels.h"
#include "ops/kernel.h"
#include "ops/kernel_util.h"

namespace gaf {
namespace {

void MaskedSoftmaxKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const int64_t scale = node.GetInt("scale", 0);
  const bool has_mask = node.GetInt("mask", 0) != 0;
  const size_t want = 1 + (scale != 0) + has_mask;
  if (ctx.num_inputs() != want || scale < 0 || scale > 2) return RunPlanFallback(ctx);
  for (size_t i = 0; i < want; ++i)
    if (!ctx.has_input(i) || ctx.input(i).dtype() != DataType::kFloat) return RunPlanFallback(ctx);
  const Tensor& X = ctx.input(0);
  const int64_t rank = X.rank();
  int64_t axis = node.GetInt("axis", -1);
  if (axis < 0) axis += rank;
  if (rank < 1 || axis != rank - 1) return RunPlanFallback(ctx);
  float c = 1.f;
  if (scale != 0) {
    const Tensor& ct = ctx.input(1);
    if (ct.numel() != 1 || ct.rank() > rank) return RunPlanFallback(ctx);
    c = ct.data<float>()[0];
  }
  // The mask's element strides over X's axes (0 where it broadcasts); it may not enlarge X.
  const Shape& xs = X.shape();
  std::vector<int64_t> mstride(static_cast<size_t>(rank), 0);
  const float* mask = nullptr;
  if (has_mask) {
    const Tensor& M = ctx.input(scale != 0 ? 2 : 1);
    if (M.rank() > rank) return RunPlanFallback(ctx);
    int64_t st = 1;
    for (int64_t d = M.rank() - 1; d >= 0; --d) {
      const int64_t xd = rank - M.rank() + d, md = M.dim(d);
      if (md != xs[xd] && md != 1) return RunPlanFallback(ctx);
      mstride[xd] = md == 1 ? 0 : st;
      st *= md;
    }
    mask = M.data<float>();
  }
  const int64_t n = xs[rank - 1];
  const int64_t rows = n > 0 ? X.numel() / n : 0;
  Tensor Y = Tensor::Uninitialized(DataType::kFloat, xs);
  const float* x = X.data<float>();
  float* y = Y.data<float>();
  const int64_t mlast = mstride[rank - 1];
  ParallelFor(rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * n;
      float* yr = y + r * n;
      const float* mr = nullptr;
      if (mask != nullptr) {
        int64_t off = 0, rest = r;  // the row's mask offset from its index over X's leading axes
        for (int64_t d = rank - 2; d >= 0; --d) {
          off += (rest % xs[d]) * mstride[d];
          rest /= xs[d];
        }
        mr = mask + off;
      }
      ScaleAndMaskRow(xr, yr, n, scale, c, mr, mlast);
      SoftmaxRowF32(yr, yr, n);
    }
  });
  ctx.outputs[0] = std::move(Y);
}

}  // namespace

void RegisterSoftmaxEpilogueKernels(OpRegistry& r) {
  // Not upcast: float16/bfloat16 scores run the fallback, whose operators round each step in
  // their own type.
  r.Register({"ai.graph_autofusion.plan", "MaskedSoftmax", OpKind::kReduction, MaskedSoftmaxKernel, false});
}

}  // namespace gaf
