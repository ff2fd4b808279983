// RotaryHalf (domain ai.graph_autofusion.plan): rotary position embedding as exporters write
// HF's rotate_half, one pass instead of seven operators, as the plan rewrite makes it from
//
//   Add(Mul(X, cos), Mul(Concat(Neg(Slice(X, h, end)), Slice(X, 0, h), axis=last), sin))
//
//   (each Mul and the Add in either order)
//   inputs  X, cos, sin      cos and sin broadcast to X, with X's last dimension
//           [h1, h2]          with dynamic: the first Slice's end and the second's start, one
//                             integer each (torch.onnx.export computes them from X's shape)
//   attrs   axis  the Slices' axis (it must be X's last at run time);  half  h (X's last
//           dimension must be 2h; with dynamic, h = h1 = h2);  end  the second Slice's end (at
//           least 2h);  dynamic  1 when h is given by the inputs;  fallback  the original nodes,
//           as a graph on the node's inputs
//
// Each element is x * cos + rot * sin with rot = (-x2, x1), both products rounded before the sum
// as the separate operators round them (this file is compiled without contracting a product
// and a sum into one fused multiply-add), so results are bit-identical. Other shapes and types
// run the fallback graph.
#include <vector>

#include "ops/kernel.h"
#include "ops/kernel_util.h"

namespace gaf {
namespace {

// The element strides of t over the axes of a shape `xs` it broadcasts to (0 where it
// broadcasts); false when it would enlarge xs.
bool BroadcastStridesOver(const Tensor& t, const Shape& xs, std::vector<int64_t>* st) {
  const int64_t rank = static_cast<int64_t>(xs.size());
  if (t.rank() > rank) return false;
  st->assign(static_cast<size_t>(rank), 0);
  int64_t s = 1;
  for (int64_t a = t.rank() - 1; a >= 0; --a) {
    const int64_t xa = rank - t.rank() + a, td = t.dim(a);
    if (td != xs[xa] && td != 1) return false;
    (*st)[xa] = td == 1 ? 0 : s;
    s *= td;
  }
  return true;
}

void RotaryHalfKernel(KernelContext& ctx) {
  for (size_t i = 0; i < 3; ++i)
    if (!ctx.has_input(i) || ctx.input(i).dtype() != DataType::kFloat) return RunPlanFallback(ctx);
  const Tensor& X = ctx.input(0);
  const Tensor& C = ctx.input(1);
  const Tensor& S = ctx.input(2);
  const Shape& xs = X.shape();
  const int64_t rank = X.rank();
  int64_t axis = ctx.node.GetInt("axis", -1);
  if (axis < 0) axis += rank;
  int64_t h = ctx.node.GetInt("half", 0);
  const int64_t d = rank > 0 ? xs[rank - 1] : 0;
  if (ctx.node.GetInt("dynamic", 0) != 0) {  // the half computed from the shape: both bounds
    if (!ctx.has_input(3) || !ctx.has_input(4) || ctx.input(3).numel() != 1 || ctx.input(4).numel() != 1 ||
        (ctx.input(3).dtype() != DataType::kInt64 && ctx.input(3).dtype() != DataType::kInt32) ||
        (ctx.input(4).dtype() != DataType::kInt64 && ctx.input(4).dtype() != DataType::kInt32))
      return RunPlanFallback(ctx);
    h = ctx.input(3).ScalarAsInt64();
    if (ctx.input(4).ScalarAsInt64() != h) return RunPlanFallback(ctx);
  }
  std::vector<int64_t> cst, sst;
  if (rank < 1 || axis != rank - 1 || h <= 0 || d % 2 != 0 || h != d / 2 || ctx.node.GetInt("end", 0) < d ||
      !BroadcastStridesOver(C, xs, &cst) || !BroadcastStridesOver(S, xs, &sst) || cst[rank - 1] != 1 ||
      sst[rank - 1] != 1)
    return RunPlanFallback(ctx);
  const int64_t rows = X.numel() / d;
  Tensor Y = Tensor::Uninitialized(DataType::kFloat, xs);
  const float* x = X.data<float>();
  const float* cp = C.data<float>();
  const float* sp = S.data<float>();
  float* y = Y.data<float>();
  ParallelFor(rows, std::max<int64_t>(1, 16384 / d), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      int64_t co = 0, so = 0, rest = r;  // the row's offsets in cos and sin
      for (int64_t a = rank - 2; a >= 0; --a) {
        const int64_t i = rest % xs[a];
        rest /= xs[a];
        co += i * cst[a];
        so += i * sst[a];
      }
      const float* xr = x + r * d;
      const float* cr = cp + co;
      const float* sr = sp + so;
      float* yr = y + r * d;
#pragma omp simd
      for (int64_t i = 0; i < h; ++i) {
        const float a = xr[i] * cr[i], b = -xr[i + h] * sr[i];
        yr[i] = a + b;
      }
#pragma omp simd
      for (int64_t i = h; i < d; ++i) {
        const float a = xr[i] * cr[i], b = xr[i - h] * sr[i];
        yr[i] = a + b;
      }
    }
  });
  ctx.outputs[0] = std::move(Y);
}

}  // namespace

void RegisterRotaryKernels(OpRegistry& r) {
  // Not upcast: half-precision tensors run the fallback, which rounds in their type.
  r.Register({"ai.graph_autofusion.plan", "RotaryHalf", OpKind::kBroadcast, RotaryHalfKernel, false});
}

}  // namespace gaf
