// RMSNorm (domain ai.graph_autofusion.plan): root-mean-square normalization as exporters write
// it, one pass per row instead of six or seven operators, as the plan rewrite makes it from
//
//   Mul(W, Mul(X, Div(1, Sqrt(Add(ReduceMean(Pow(X, 2), axes=[-1]), eps)))))
//
//   (Pow(X, 2) or Mul(X, X); Reciprocal(s) for Div(1, s), or Div(X, s) for X * (1 / s); W absent
//   or a constant over the last axis; each Mul and the Add in either order)
//
//   inputs  X, eps [, W]
//   attrs   axis  the ReduceMean's axis (it must be X's last at run time);  divide  1: X / s,
//           0: X * (1 / s);  fallback  the original nodes, as a graph on the node's inputs
//
// Each row's squares go to a buffer of the thread and are averaged with ReduceMean's own row
// function; then eps, the square root, the reciprocal and the products, one operator's rounding
// at a time, so results are bit-identical. Other shapes and types run the fallback graph.
#include <cmath>
#include <vector>

#include "ops/kernel.h"
#include "ops/kernel_util.h"

namespace gaf {
namespace {

void RMSNormKernel(KernelContext& ctx) {
  int64_t n = 0;
  for (size_t i = 0; i < ctx.num_inputs(); ++i)
    if (!ctx.has_input(i)) return RunPlanFallback(ctx);
  const Tensor& X = ctx.input(0);
  if (!RMSNormTakes(ctx.node, X, &ctx.input(1), ctx.num_inputs() > 2 ? &ctx.input(2) : nullptr, &n))
    return RunPlanFallback(ctx);
  const float* w = ctx.num_inputs() > 2 ? ctx.input(2).data<float>() : nullptr;
  const float eps = ctx.input(1).data<float>()[0];
  const bool divide = ctx.node.GetInt("divide", 0) != 0;
  const int64_t rows = X.numel() / n;
  Tensor Y = Tensor::Uninitialized(DataType::kFloat, X.shape());
  const float* x = X.data<float>();
  float* y = Y.data<float>();
  ParallelFor(rows, std::max<int64_t>(1, 16384 / n), [&](int64_t r0, int64_t r1) {
    std::vector<float> sq(static_cast<size_t>(n));
    for (int64_t r = r0; r < r1; ++r) RMSNormRowF32(x + r * n, n, eps, w, divide, sq.data(), y + r * n);
  });
  ctx.outputs[0] = std::move(Y);
}

}  // namespace

bool RMSNormTakes(const Node& node, const Tensor& X, const Tensor* E, const Tensor* W, int64_t* n) {
  if (E == nullptr || X.dtype() != DataType::kFloat || E->dtype() != DataType::kFloat ||
      (W != nullptr && W->dtype() != DataType::kFloat))
    return false;
  const int64_t rank = X.rank();
  int64_t axis = node.GetInt("axis", -1);
  if (axis < 0) axis += rank;
  if (rank < 1 || axis != rank - 1 || E->numel() != 1 || E->rank() > rank) return false;
  *n = X.dim(rank - 1);
  // Rows MeanRowF32 refuses (empty ones; 2^17 elements or more, which ReduceMean may split).
  if (*n == 0 || *n >= (int64_t{1} << 17)) return false;
  // W broadcast along the last axis only, not enlarging X.
  return W == nullptr || (W->numel() == *n && W->rank() <= rank && W->rank() >= 1 && W->dim(W->rank() - 1) == *n);
}

void RMSNormRowF32(const float* x, int64_t n, float eps, const float* w, bool divide, float* sq, float* y) {
  float mean = 0.f;
  MeanSquareRowF32(x, n, sq, &mean);
  const float s = std::sqrt(mean + eps);
  if (divide) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] / s;
  } else {
    const float inv = 1.f / s;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * inv;
  }
  if (w != nullptr) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = y[i] * w[i];
  }
}

void RegisterRMSNormKernels(OpRegistry& r) {
  // Not upcast: half-precision normalizations run the fallback, which rounds in their type.
  r.Register({"ai.graph_autofusion.plan", "RMSNorm", OpKind::kReduction, RMSNormKernel, false});
}

}  // namespace gaf
