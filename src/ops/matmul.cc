// MatMul, Gemm, MatMulInteger and QLinearMatMul, and the zero-point and scale helpers of the
// quantized kernels (also used by the quantized convolutions in conv.cc).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "ops/gemm.h"
#include "ops/kernel_util.h"
#include "ops/nn_internal.h"

namespace gaf::nn_detail {
namespace {

// ------------------------------------------------------------------------------------------
// MatMul.

struct MatMulPlan {
  int64_t M = 1, N = 1, K = 1;
  Shape a_batch, b_batch, out_batch, out_shape;
};

MatMulPlan PlanMatMul(const Shape& as, const Shape& bs, const Node& node) {
  GAF_CHECK(!as.empty() && !bs.empty(), "{}: MatMul inputs must have rank >= 1 (got {} and {})",
            node.Describe(), ShapeToString(as), ShapeToString(bs));
  MatMulPlan p;
  bool a1 = as.size() == 1, b1 = bs.size() == 1;
  p.M = a1 ? 1 : as[as.size() - 2];
  int64_t ka = as.back();
  int64_t kb = b1 ? bs[0] : bs[bs.size() - 2];
  p.N = b1 ? 1 : bs.back();
  GAF_CHECK(ka == kb, "{}: MatMul inner dimensions differ: {} x {}", node.Describe(),
            ShapeToString(as), ShapeToString(bs));
  p.K = ka;
  if (as.size() > 2) p.a_batch.assign(as.begin(), as.end() - 2);
  if (bs.size() > 2) p.b_batch.assign(bs.begin(), bs.end() - 2);
  p.out_batch = BroadcastShapes(p.a_batch, p.b_batch, node);
  p.out_shape = p.out_batch;
  if (!a1) p.out_shape.push_back(p.M);
  if (!b1) p.out_shape.push_back(p.N);
  return p;
}

template <class T>
void RunMatMul(const MatMulPlan& p, const T* a, const T* b, T* c) {
  int64_t nb = NumElements(p.out_batch);
  if (nb == 0 || p.M == 0 || p.N == 0) return;
  if (NumElements(p.b_batch) == 1 && NumElements(p.a_batch) == nb) {
    // B shared by all batches: one GEMM with M' = batch * M.
    Gemm<T>(false, false, nb * p.M, p.N, p.K, 1.f, a, p.K, b, p.N, 0.f, c, p.N);
    return;
  }
  std::vector<int64_t> ao = BatchOffsets(p.a_batch, p.M * p.K, p.out_batch);
  std::vector<int64_t> bo = BatchOffsets(p.b_batch, p.K * p.N, p.out_batch);
  BatchedGemm<T>(nb, p.M, p.N, p.K, a, ao, b, bo, c);
}

}  // namespace

void MatMulKernel(KernelContext& ctx) {
  const Tensor& A = ctx.input(0);
  const Tensor& B = ctx.input(1);
  const Node& node = ctx.node;
  GAF_CHECK(A.dtype() == B.dtype(), "{}: MatMul input types differ ({} vs {})", node.Describe(),
            DataTypeName(A.dtype()), DataTypeName(B.dtype()));
  MatMulPlan p = PlanMatMul(A.shape(), B.shape(), node);
  ctx.outputs[0] = Tensor(A.dtype(), p.out_shape);
  Tensor& Y = ctx.outputs[0];
  switch (A.dtype()) {
    case DataType::kFloat: RunMatMul<float>(p, A.data<float>(), B.data<float>(), Y.data<float>()); break;
    case DataType::kDouble: RunMatMul<double>(p, A.data<double>(), B.data<double>(), Y.data<double>()); break;
    case DataType::kInt32: RunMatMul<int32_t>(p, A.data<int32_t>(), B.data<int32_t>(), Y.data<int32_t>()); break;
    case DataType::kInt64: RunMatMul<int64_t>(p, A.data<int64_t>(), B.data<int64_t>(), Y.data<int64_t>()); break;
    case DataType::kUint32: RunMatMul<uint32_t>(p, A.data<uint32_t>(), B.data<uint32_t>(), Y.data<uint32_t>()); break;
    case DataType::kUint64: RunMatMul<uint64_t>(p, A.data<uint64_t>(), B.data<uint64_t>(), Y.data<uint64_t>()); break;
    default:
      GAF_UNSUPPORTED("{}: MatMul of type {} is not supported", node.Describe(),
                      DataTypeName(A.dtype()));
  }
}

namespace {

// ------------------------------------------------------------------------------------------
// Gemm: Y = alpha * op(A) * op(B) + beta * C, C unidirectionally broadcast to [M, N].

template <class T>
void RunGemm(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& A = ctx.input(0);
  const Tensor& B = ctx.input(1);
  const Tensor* C = ctx.has_input(2) ? ctx.inputs[2] : nullptr;
  bool ta = node.GetInt("transA", 0) != 0, tb = node.GetInt("transB", 0) != 0;
  float alpha = node.GetFloat("alpha", 1.f), beta = node.GetFloat("beta", 1.f);
  GAF_CHECK(A.rank() == 2 && B.rank() == 2, "{}: Gemm inputs must be 2-D (got {} and {})",
            node.Describe(), ShapeToString(A.shape()), ShapeToString(B.shape()));
  int64_t M = ta ? A.dim(1) : A.dim(0), K = ta ? A.dim(0) : A.dim(1);
  int64_t kb = tb ? B.dim(1) : B.dim(0), N = tb ? B.dim(0) : B.dim(1);
  GAF_CHECK(K == kb, "{}: Gemm inner dimensions differ: A {} (transA={}) B {} (transB={})",
            node.Describe(), ShapeToString(A.shape()), ta, ShapeToString(B.shape()), tb);
  ctx.outputs[0] = Tensor(A.dtype(), {M, N});
  T* y = ctx.outputs[0].data<T>();
  float gemm_beta = 0.f;
  if (C != nullptr && beta != 0.f && C->numel() > 0) {
    GAF_CHECK(C->dtype() == A.dtype(), "{}: Gemm C type {} differs from A type {}",
              node.Describe(), DataTypeName(C->dtype()), DataTypeName(A.dtype()));
    GAF_CHECK(C->rank() <= 2, "{}: Gemm C must have rank <= 2 (got {})", node.Describe(),
              ShapeToString(C->shape()));
    Shape cs = C->shape();
    while (cs.size() < 2) cs.insert(cs.begin(), 1);
    GAF_CHECK((cs[0] == 1 || cs[0] == M) && (cs[1] == 1 || cs[1] == N),
              "{}: Gemm C of shape {} cannot broadcast to [{},{}]", node.Describe(),
              ShapeToString(C->shape()), M, N);
    const T* c = C->data<T>();
    int64_t rs = cs[0] == 1 ? 0 : cs[1], cst = cs[1] == 1 ? 0 : 1;
    T b = static_cast<T>(beta);
    for (int64_t m = 0; m < M; ++m) {
      T* yr = y + m * N;
      const T* cr = c + m * rs;
      if (cst == 1) {
        if (beta == 1.f) {
          std::memcpy(yr, cr, sizeof(T) * N);
        } else {
          for (int64_t n = 0; n < N; ++n) yr[n] = b * cr[n];
        }
      } else {
        T v = beta == 1.f ? cr[0] : static_cast<T>(b * cr[0]);
        std::fill(yr, yr + N, v);
      }
    }
    gemm_beta = 1.f;
  }
  Gemm<T>(ta, tb, M, N, K, alpha, A.data<T>(), A.dim(1), B.data<T>(), B.dim(1), gemm_beta, y, N);
}

}  // namespace

void GemmKernel(KernelContext& ctx) {
  const Tensor& A = ctx.input(0);
  switch (A.dtype()) {
    case DataType::kFloat: return RunGemm<float>(ctx);
    case DataType::kDouble: return RunGemm<double>(ctx);
    case DataType::kInt32: return RunGemm<int32_t>(ctx);
    case DataType::kInt64: return RunGemm<int64_t>(ctx);
    case DataType::kUint32: return RunGemm<uint32_t>(ctx);
    case DataType::kUint64: return RunGemm<uint64_t>(ctx);
    default:
      GAF_UNSUPPORTED("{}: Gemm of type {} is not supported", ctx.node.Describe(),
                      DataTypeName(A.dtype()));
  }
}

// ------------------------------------------------------------------------------------------
// MatMulInteger: int32 Y = (A - a_zero_point) * (B - b_zero_point).

std::vector<int32_t> ToInt32Values(const Tensor& t, const Node& node, const char* what) {
  std::vector<int32_t> v(t.numel());
  if (t.dtype() == DataType::kUint8) {
    const uint8_t* p = t.data<uint8_t>();
    for (int64_t i = 0; i < t.numel(); ++i) v[i] = p[i];
  } else if (t.dtype() == DataType::kInt8) {
    const int8_t* p = t.data<int8_t>();
    for (int64_t i = 0; i < t.numel(); ++i) v[i] = p[i];
  } else {
    GAF_UNSUPPORTED("{}: {} of type {} is not supported (uint8/int8 only)", node.Describe(), what,
                    DataTypeName(t.dtype()));
  }
  return v;
}

void MatMulIntegerKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& A = ctx.input(0);
  const Tensor& B = ctx.input(1);
  MatMulPlan p = PlanMatMul(A.shape(), B.shape(), node);
  std::vector<int32_t> a = ToInt32Values(A, node, "A");
  std::vector<int32_t> b = ToInt32Values(B, node, "B");
  int64_t M = p.M, N = p.N, K = p.K;
  if (ctx.has_input(2)) {
    const Tensor& za = *ctx.inputs[2];
    GAF_CHECK(za.dtype() == A.dtype(), "{}: a_zero_point type differs from A", node.Describe());
    std::vector<int32_t> z = ToInt32Values(za, node, "a_zero_point");
    if (z.size() == 1) {
      for (auto& v : a) v -= z[0];
    } else {
      // Per-row zero points: one per row of each A matrix.
      GAF_CHECK(static_cast<int64_t>(z.size()) == M && A.rank() >= 2,
                "{}: a_zero_point must be a scalar or have M={} elements (got {})",
                node.Describe(), M, ShapeToString(za.shape()));
      for (size_t i = 0; i < a.size(); ++i) a[i] -= z[(i / K) % M];
    }
  }
  if (ctx.has_input(3)) {
    const Tensor& zb = *ctx.inputs[3];
    GAF_CHECK(zb.dtype() == B.dtype(), "{}: b_zero_point type differs from B", node.Describe());
    std::vector<int32_t> z = ToInt32Values(zb, node, "b_zero_point");
    if (z.size() == 1) {
      for (auto& v : b) v -= z[0];
    } else {
      GAF_CHECK(static_cast<int64_t>(z.size()) == N && B.rank() >= 2,
                "{}: b_zero_point must be a scalar or have N={} elements (got {})",
                node.Describe(), N, ShapeToString(zb.shape()));
      for (size_t i = 0; i < b.size(); ++i) b[i] -= z[i % N];
    }
  }
  ctx.outputs[0] = Tensor(DataType::kInt32, p.out_shape);
  RunMatMul<int32_t>(p, a.data(), b.data(), ctx.outputs[0].data<int32_t>());
}

// ------------------------------------------------------------------------------------------
// Quantized products: QLinearMatMul, and the zero-point and scale helpers it shares with the
// quantized convolutions (conv.cc).

// Values of a uint8/int8 tensor minus its zero point; the zero point is a scalar or has one
// value per index of the axis whose elements are `inner` apart with `axis_size` entries.
std::vector<int32_t> Dequantized(const Tensor& t, const Tensor* zp, int64_t axis_size,
                                 int64_t inner, const Node& node, const char* what) {
  std::vector<int32_t> v = ToInt32Values(t, node, what);
  if (zp == nullptr) return v;
  GAF_CHECK(zp->dtype() == t.dtype(), "{}: zero point of {} has type {}, expected {}",
            node.Describe(), what, DataTypeName(zp->dtype()), DataTypeName(t.dtype()));
  std::vector<int32_t> z = ToInt32Values(*zp, node, "zero point");
  if (z.size() == 1) {
    for (auto& x : v) x -= z[0];
  } else {
    GAF_CHECK(static_cast<int64_t>(z.size()) == axis_size && inner > 0,
              "{}: zero point of {} has {} values, expected 1 or {}", node.Describe(), what,
              z.size(), axis_size);
    for (size_t i = 0; i < v.size(); ++i) v[i] -= z[(static_cast<int64_t>(i) / inner) % axis_size];
  }
  return v;
}

// Scale values: a scalar, or `n` per-channel values.
std::vector<float> Scales(const Tensor& t, int64_t n, const Node& node, const char* what) {
  std::vector<double> d = t.ToDoubles();
  GAF_CHECK(d.size() == 1 || static_cast<int64_t>(d.size()) == n,
            "{}: {} has {} values, expected 1 or {}", node.Describe(), what, d.size(), n);
  return std::vector<float>(d.begin(), d.end());
}

// y = saturate(round_half_even(acc * scale[channel]) + zero_point) for uint8/int8 outputs.
void Requantize(const std::vector<int32_t>& acc, const std::vector<float>& scale, int64_t nch,
                int64_t inner, const Tensor* yzp, Tensor& y, const Node& node) {
  DataType dt = yzp ? yzp->dtype() : DataType::kUint8;
  int32_t zp = yzp ? static_cast<int32_t>(yzp->ScalarAsInt64()) : 0;
  int32_t lo = dt == DataType::kUint8 ? 0 : -128, hi = dt == DataType::kUint8 ? 255 : 127;
  if (dt != DataType::kUint8 && dt != DataType::kInt8)
    GAF_UNSUPPORTED("{}: output type {} is not supported (uint8/int8 only)", node.Describe(),
                    DataTypeName(dt));
  auto q = [&](size_t i) {
    float sc = scale.size() == 1 ? scale[0] : scale[(static_cast<int64_t>(i) / inner) % nch];
    float r = std::nearbyint(static_cast<float>(acc[i]) * sc) + static_cast<float>(zp);
    return static_cast<int32_t>(std::min<float>(std::max<float>(r, lo), hi));
  };
  if (dt == DataType::kUint8) {
    uint8_t* p = y.data<uint8_t>();
    for (size_t i = 0; i < acc.size(); ++i) p[i] = static_cast<uint8_t>(q(i));
  } else {
    int8_t* p = y.data<int8_t>();
    for (size_t i = 0; i < acc.size(); ++i) p[i] = static_cast<int8_t>(q(i));
  }
}

void QLinearMatMulKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& A = ctx.input(0);
  const Tensor& B = ctx.input(3);
  MatMulPlan p = PlanMatMul(A.shape(), B.shape(), node);
  std::vector<int32_t> a = Dequantized(A, &ctx.input(2), 1, 1, node, "a");
  GAF_CHECK(ctx.input(2).numel() == 1, "{}: a_zero_point must be a scalar", node.Describe());
  std::vector<int32_t> b = Dequantized(B, &ctx.input(5), p.N, 1, node, "b");
  std::vector<int32_t> acc(static_cast<size_t>(NumElements(p.out_shape)), 0);
  RunMatMul<int32_t>(p, a.data(), b.data(), acc.data());
  float as = Scales(ctx.input(1), 1, node, "a_scale")[0];
  float ys = Scales(ctx.input(6), 1, node, "y_scale")[0];
  std::vector<float> scale = Scales(ctx.input(4), p.N, node, "b_scale");
  for (auto& v : scale) v = v * as / ys;
  const Tensor& yzp = ctx.input(7);
  ctx.outputs[0] = Tensor(yzp.dtype(), p.out_shape);
  Requantize(acc, scale, p.N, 1, &yzp, ctx.outputs[0], node);
}

}  // namespace gaf::nn_detail
