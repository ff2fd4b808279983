// The transformer operators of recent ONNX opsets, as exporters that target them write a decoder:
//
//   RMSNormalization (23)   Y = X / sqrt(mean(X^2 over axes [axis, rank)) + epsilon) * scale
//   Swish (24)              Y = X * Sigmoid(alpha * X)
//   SwiGLU (28)             Y = Swish(A, alpha) * B
//
// (Attention (23) is in ops/attention_op.cc, RotaryEmbedding (23) in ops/rotary_half.cc.) Each follows the operator's function body in the
// ONNX schema, operator by operator, in float32 (float16 and bfloat16 inputs are computed in float32
// and rounded once at the end). The plan treats SwiGLU with alpha 1 as its SiLUGate
// (runtime/plan_rewrite_epilogues.cc), so a SwiGLU MLP's products take the gate inside their tasks.
#include <cmath>
#include <vector>

#include "ops/fast_math.h"
#include "ops/kernel.h"
#include "ops/kernel_util.h"

namespace gaf {
namespace {

constexpr int64_t kGrain = 1 << 14;  // elements per task of the elementwise loops

int64_t NormalizedAxis(int64_t axis, int64_t rank, const KernelContext& ctx) {
  const int64_t a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= rank)
    throw Error(fmt::format("{}: axis {} is out of range for an input of rank {}", ctx.node.Describe(), axis, rank));
  return a;
}

// The element strides of t over the axes of `shape` it broadcasts to (right-aligned, 0 where it
// broadcasts); throws when it does not broadcast to that shape.
std::vector<int64_t> StridesOver(const Tensor& t, const Shape& shape, const KernelContext& ctx, const char* what) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  if (t.rank() > rank)
    throw Error(fmt::format("{}: {} of shape {} does not broadcast to {}", ctx.node.Describe(), what,
                            ShapeToString(t.shape()), ShapeToString(shape)));
  std::vector<int64_t> st(static_cast<size_t>(rank), 0);
  int64_t s = 1;
  for (int64_t a = t.rank() - 1; a >= 0; --a) {
    const int64_t xa = rank - t.rank() + a, td = t.dim(a);
    if (td != shape[xa] && td != 1)
      throw Error(fmt::format("{}: {} of shape {} does not broadcast to {}", ctx.node.Describe(), what,
                              ShapeToString(t.shape()), ShapeToString(shape)));
    st[xa] = td == 1 ? 0 : s;
    s *= td;
  }
  return st;
}

// t as `count` floats laid out over `shape` (broadcast where t has size 1 or fewer axes).
std::vector<float> BroadcastTo(const Tensor& t, const Shape& shape, const KernelContext& ctx, const char* what) {
  const std::vector<int64_t> st = StridesOver(t, shape, ctx, what);
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  std::vector<float> out(static_cast<size_t>(count));
  const float* src = t.data<float>();
  const int64_t rank = static_cast<int64_t>(shape.size());
  std::vector<int64_t> idx(static_cast<size_t>(rank), 0);
  for (int64_t i = 0; i < count; ++i) {
    int64_t off = 0;
    for (int64_t a = 0; a < rank; ++a) off += idx[a] * st[a];
    out[i] = src[off];
    for (int64_t a = rank - 1; a >= 0; --a) {
      if (++idx[a] < shape[a]) break;
      idx[a] = 0;
    }
  }
  return out;
}

void RMSNormalizationKernel(KernelContext& ctx) {
  const Tensor& X = ctx.input(0);
  const Tensor& W = ctx.input(1);
  if (X.dtype() != DataType::kFloat || W.dtype() != DataType::kFloat)
    throw UnsupportedError(fmt::format("{}: input type {} (float, float16, bfloat16 are supported)",
                                       ctx.node.Describe(), DataTypeName(X.dtype())));
  const int64_t stash = ctx.node.GetInt("stash_type", 1);
  if (stash != 1)
    throw UnsupportedError(fmt::format("{}: stash_type {} (only 1, float32, is supported)", ctx.node.Describe(), stash));
  const int64_t rank = X.rank();
  if (rank == 0) throw Error(fmt::format("{}: X is a scalar (rank 0)", ctx.node.Describe()));
  const int64_t axis = NormalizedAxis(ctx.node.GetInt("axis", -1), rank, ctx);
  const float eps = ctx.node.GetFloat("epsilon", 1e-5f);
  const Shape norm(X.shape().begin() + axis, X.shape().end());
  int64_t n = 1;
  for (int64_t d : norm) n *= d;
  const int64_t rows = n == 0 ? 0 : X.numel() / n;
  // The scale over the normalized shape: as it is when it has that many elements (a valid
  // broadcast of as many elements is the identity), else laid out over it.
  std::vector<float> laid;
  const float* w = W.data<float>();
  if (W.numel() == n) {
    StridesOver(W, norm, ctx, "scale");  // throws for a scale of the wrong shape
  } else {
    laid = BroadcastTo(W, norm, ctx, "scale");
    w = laid.data();
  }
  Tensor Y = Tensor::Uninitialized(DataType::kFloat, X.shape());
  const float* x = X.data<float>();
  float* y = Y.data<float>();
  ParallelFor(rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(n, 1)), [&](int64_t r0, int64_t r1) {
    thread_local std::vector<float> sq;
    if (static_cast<int64_t>(sq.size()) < n) sq.resize(static_cast<size_t>(n));
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * n;
      float* yr = y + r * n;
      float mean = 0.f;
      if (!MeanSquareRowF32(xr, n, sq.data(), &mean)) {  // a row ReduceMean would split: a double sum
        double s = 0;
        for (int64_t i = 0; i < n; ++i) s += sq[i];
        mean = static_cast<float>(s / static_cast<double>(n));
      }
      const float rms = std::sqrt(mean + eps);
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] / rms * w[i];
    }
  });
  ctx.outputs[0] = std::move(Y);
}

void SwishKernel(KernelContext& ctx) {
  const Tensor& X = ctx.input(0);
  if (X.dtype() != DataType::kFloat)
    throw UnsupportedError(fmt::format("{}: input type {} (float, float16, bfloat16 are supported)",
                                       ctx.node.Describe(), DataTypeName(X.dtype())));
  const float alpha = ctx.node.GetFloat("alpha", 1.f);
  Tensor Y = Tensor::Uninitialized(DataType::kFloat, X.shape());
  const float* x = X.data<float>();
  float* y = Y.data<float>();
  ParallelFor(X.numel(), kGrain, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) y[i] = x[i] * gaf_fast::FastSigmoid(alpha * x[i]);
  });
  ctx.outputs[0] = std::move(Y);
}

void SwiGLUKernel(KernelContext& ctx) {
  const Tensor& A = ctx.input(0);
  const Tensor& Bt = ctx.input(1);
  if (A.dtype() != DataType::kFloat || Bt.dtype() != DataType::kFloat)
    throw UnsupportedError(fmt::format("{}: input type {} (float, float16, bfloat16 are supported)",
                                       ctx.node.Describe(), DataTypeName(A.dtype())));
  const float alpha = ctx.node.GetFloat("alpha", 1.f);
  const Shape out = BroadcastShapes(A.shape(), Bt.shape(), ctx.node);
  Tensor Y = Tensor::Uninitialized(DataType::kFloat, out);
  float* y = Y.data<float>();
  if (A.shape() == out && Bt.shape() == out) {
    const float* a = A.data<float>();
    const float* b = Bt.data<float>();
    ParallelFor(Y.numel(), kGrain, [&](int64_t i0, int64_t i1) {
#pragma omp simd
      for (int64_t i = i0; i < i1; ++i) {
        const float swish = a[i] * gaf_fast::FastSigmoid(alpha * a[i]);
        y[i] = swish * b[i];
      }
    });
  } else {  // broadcasting: both operands laid out over the output first
    const std::vector<float> a = BroadcastTo(A, out, ctx, "A");
    const std::vector<float> b = BroadcastTo(Bt, out, ctx, "B");
    for (int64_t i = 0; i < Y.numel(); ++i) {
      const float swish = a[i] * gaf_fast::FastSigmoid(alpha * a[i]);
      y[i] = swish * b[i];
    }
  }
  ctx.outputs[0] = std::move(Y);
}

}  // namespace

void RegisterTransformerKernels(OpRegistry& r) {
  r.Register({"", "RMSNormalization", OpKind::kReduction, RMSNormalizationKernel});
  r.Register({"", "Swish", OpKind::kElementwise, SwishKernel});
  r.Register({"", "SwiGLU", OpKind::kBroadcast, SwiGLUKernel});
}

}  // namespace gaf
