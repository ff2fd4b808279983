// The transformer operators of recent ONNX opsets, as exporters that target them write a decoder:
//
//   RMSNormalization (23)   Y = X / sqrt(mean(X^2 over axes [axis, rank)) + epsilon) * scale
//   RotaryEmbedding (23)    rotary position embedding of a head's first rotary_embedding_dim
//                           values (halves, or interleaved pairs), cos/sin from caches
//   Swish (24)              Y = X * Sigmoid(alpha * X)
//   SwiGLU (28)             Y = Swish(A, alpha) * B
//
// (Attention (23) is in ops/attention_op.cc.) Each follows the operator's function body in the
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
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) sq[i] = xr[i] * xr[i];
      float mean = 0.f;
      if (!MeanRowF32(sq.data(), n, &mean)) {  // a row ReduceMean would split: a plain double sum
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

void RotaryEmbeddingKernel(KernelContext& ctx) {
  const Tensor& X = ctx.input(0);
  const Tensor& C = ctx.input(1);
  const Tensor& S = ctx.input(2);
  const NodeDescription where{ctx.node};
  if (X.dtype() != DataType::kFloat || C.dtype() != DataType::kFloat || S.dtype() != DataType::kFloat)
    throw UnsupportedError(fmt::format("{}: input type {} (float, float16, bfloat16 are supported)", where,
                                       DataTypeName(X.dtype())));
  const bool interleaved = ctx.node.GetInt("interleaved", 0) != 0;
  const int64_t num_heads = ctx.node.GetInt("num_heads", 0);
  // [B, H, S, D] (4-D) or [B, S, H * D] (3-D, num_heads given); element (b, h, s, d) at
  // b * sb + h * sh + s * ss + d.
  int64_t B, H, L, D, sb, sh, ss;
  if (X.rank() == 4) {
    B = X.dim(0), H = X.dim(1), L = X.dim(2), D = X.dim(3);
    sb = H * L * D, sh = L * D, ss = D;
  } else if (X.rank() == 3) {
    if (num_heads <= 0 || X.dim(2) % num_heads != 0)
      throw Error(fmt::format("{}: a 3-D input needs num_heads dividing its last dimension ({}), got num_heads {}",
                              where, X.dim(2), num_heads));
    B = X.dim(0), L = X.dim(1), H = num_heads, D = X.dim(2) / num_heads;
    sb = L * H * D, sh = D, ss = H * D;
  } else {
    throw Error(fmt::format("{}: input of rank {} (3 or 4 expected)", where, X.rank()));
  }
  int64_t rot = ctx.node.GetInt("rotary_embedding_dim", 0);
  if (rot == 0) rot = D;
  if (rot < 0 || rot > D || rot % 2 != 0)
    throw Error(fmt::format("{}: rotary_embedding_dim {} for a head of {} (even, at most the head)", where, rot, D));
  const int64_t half = rot / 2;
  // cos/sin rows: [max_position, >= half] read at position_ids[b, s], or [B, S, >= half].
  const bool positions = ctx.has_input(3);
  std::vector<int64_t> converted;
  const int64_t* pos = nullptr;
  if (positions) {
    const Tensor& P = ctx.input(3);
    if (P.rank() != 2 || P.dim(0) != B || P.dim(1) != L)
      throw Error(fmt::format("{}: position_ids of shape {} (expected [{}, {}])", where, ShapeToString(P.shape()), B, L));
    if (P.dtype() == DataType::kInt64) {
      pos = P.data<int64_t>();
    } else {
      converted = P.ToInt64s();
      pos = converted.data();
    }
    if (C.rank() != 2 || S.shape() != C.shape() || C.dim(1) < half)
      throw Error(fmt::format("{}: cos/sin caches of shapes {} and {} (expected [max_position, >= {}])", where,
                              ShapeToString(C.shape()), ShapeToString(S.shape()), half));
    for (int64_t i = 0; i < B * L; ++i)
      if (const int64_t p = pos[i]; p < 0 || p >= C.dim(0))
        throw Error(fmt::format("{}: position id {} outside the cos/sin caches' {} rows", where, p, C.dim(0)));
  } else if (C.rank() != 3 || S.shape() != C.shape() || C.dim(0) != B || C.dim(1) != L || C.dim(2) < half) {
    throw Error(fmt::format("{}: cos/sin of shapes {} and {} (expected [{}, {}, >= {}] without position_ids)", where,
                            ShapeToString(C.shape()), ShapeToString(S.shape()), B, L, half));
  }
  const int64_t cw = positions ? C.dim(1) : C.dim(2);
  Tensor Y = Tensor::Uninitialized(DataType::kFloat, X.shape());
  const float* x = X.data<float>();
  const float* cc = C.data<float>();
  const float* sc = S.data<float>();
  float* y = Y.data<float>();
  ParallelFor(B * L, std::max<int64_t>(1, kGrain / std::max<int64_t>(H * D, 1)), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / L, s = i % L;
      const int64_t row = positions ? pos[i] : i;
      const float* c = cc + row * cw;
      const float* sn = sc + row * cw;
      for (int64_t h = 0; h < H; ++h) {
        const float* xh = x + b * sb + h * sh + s * ss;
        float* yh = y + b * sb + h * sh + s * ss;
        for (int64_t j = 0; j < half; ++j) {
          const int64_t a = interleaved ? 2 * j : j, o = interleaved ? 2 * j + 1 : j + half;
          const float x1 = xh[a], x2 = xh[o];
          const float cx1 = c[j] * x1, sx2 = sn[j] * x2, sx1 = sn[j] * x1, cx2 = c[j] * x2;
          yh[a] = cx1 - sx2;
          yh[o] = sx1 + cx2;
        }
        for (int64_t d = rot; d < D; ++d) yh[d] = xh[d];
      }
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
  r.Register({"", "RotaryEmbedding", OpKind::kInjective, RotaryEmbeddingKernel});
  r.Register({"", "Swish", OpKind::kElementwise, SwishKernel});
  r.Register({"", "SwiGLU", OpKind::kBroadcast, SwiGLUKernel});
}

}  // namespace gaf
