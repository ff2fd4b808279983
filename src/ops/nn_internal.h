// Internal to the contraction and pooling kernels (gemv.cc, gemm.cc, matmul.cc, einsum.cc, conv.cc,
// pool.cc and nn.cc, which registers them): integer helpers, the streaming GEMV's task runner, the
// GEMM templates, the spatial geometry of Conv and pooling, the zero-point and scale helpers of the
// quantized kernels, and the kernels RegisterNnKernels registers. Not an interface of gaf_ops.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "ir/graph.h"
#include "ir/tensor.h"
#include "ops/kernel.h"
#include "ops/kernel_util.h"

namespace gaf::nn_detail {

// ------------------------------------------------------------------------------------------
// Small integer helpers.

inline int64_t FloorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
inline int64_t CeilDiv(int64_t a, int64_t b) { return -FloorDiv(-a, b); }

// Range [lo, hi) of k in [0, kmax) such that pos = o * s + off + k * d lies in [0, limit).
// With d == 0 treated as 1.
inline void KernelRange(int64_t base, int64_t d, int64_t kmax, int64_t limit, int64_t* lo,
                        int64_t* hi) {
  // base + k*d >= 0  -> k >= ceil(-base/d); base + k*d <= limit-1 -> k <= floor((limit-1-base)/d)
  int64_t l = std::min<int64_t>(kmax, std::max<int64_t>(0, CeilDiv(-base, d)));
  int64_t h = std::min<int64_t>(kmax, FloorDiv(limit - 1 - base, d) + 1);
  *lo = l;
  *hi = std::max(l, h);
}

// ------------------------------------------------------------------------------------------
// GEMV (gemv.cc).

// Products of up to this many rows stream the weight once for all rows (GemvPieceRows: 1.1-1.4x
// oneDNN's sgemm on a decoder's 2-8 token prefill here; at 16 rows sgemm is faster, 68 vs 85 ms).
constexpr int64_t kGemvMaxRows = 8;
constexpr int64_t kGemvRowsMinWeight = 1 << 18;  // ... when it has at least this many elements

// Products sharing x and K, run as one set of tasks: y_p[m, 0:N_p] (+)= x[m] * W_p for the M rows
// of x (row m at x + m * ldx; y_p's row m at y + m * ldy).
template <class T>
struct GemvProduct {
  const T* w;
  int64_t ldw;
  float* y;
  int64_t N;
  int64_t ldy = 0;
};

// Runs the products (gemv.cc; instantiated for float32 and float16 weights): y_p = x * W_p, or
// y_p += x * W_p when accumulate.
template <class T>
void GemvMany(const float* x, int64_t ldx, int64_t M, int64_t K, const GemvProduct<T>* ps, int count,
              bool accumulate);
extern template void GemvMany<float>(const float* x, int64_t ldx, int64_t M, int64_t K,
                                     const GemvProduct<float>* ps, int count, bool accumulate);
extern template void GemvMany<uint16_t>(const float* x, int64_t ldx, int64_t M, int64_t K,
                                        const GemvProduct<uint16_t>* ps, int count, bool accumulate);

// ------------------------------------------------------------------------------------------
// GEMM (gemm.cc).

// C[M,N] = alpha * op(A) * op(B) + beta * C, row-major.
void Sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// Reference GEMM for non-float32 types (double, integers).
template <class T>
void GemmRef(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const T* A,
             int64_t lda, const T* B, int64_t ldb, double beta, T* C, int64_t ldc) {
  ParallelFor(M, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, N * K)), [&](int64_t m0,
                                                                               int64_t m1) {
    std::vector<T> row(N);
    for (int64_t m = m0; m < m1; ++m) {
      std::fill(row.begin(), row.end(), T{});
      for (int64_t k = 0; k < K; ++k) {
        T a = ta ? A[k * lda + m] : A[m * lda + k];
        if (!tb) {
          const T* b = B + k * ldb;
          T* __restrict rp = row.data();
#pragma omp simd
          for (int64_t n = 0; n < N; ++n) rp[n] += a * b[n];
        } else {
          for (int64_t n = 0; n < N; ++n) row[n] += a * B[n * ldb + k];
        }
      }
      T* c = C + m * ldc;
      for (int64_t n = 0; n < N; ++n) {
        double v = alpha == 1.0 ? static_cast<double>(row[n]) : alpha * static_cast<double>(row[n]);
        if (alpha == 1.0 && beta == 0.0) {
          c[n] = row[n];
        } else if (beta == 0.0) {
          c[n] = static_cast<T>(v);
        } else {
          c[n] = static_cast<T>(v + beta * static_cast<double>(c[n]));
        }
      }
    }
  });
}

template <class T>
void Gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda,
          const T* B, int64_t ldb, float beta, T* C, int64_t ldc) {
  if constexpr (std::is_same_v<T, float>) {
    Sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  } else {
    GemmRef<T>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
}

// C[b] = A[b] (MxK) * B[b] (KxN) for each batch b, with per-batch element offsets into A and B;
// C batches are contiguous. Small products run in parallel over the batch.
template <class T>
void BatchedGemm(int64_t batch, int64_t M, int64_t N, int64_t K, const T* A,
                 const std::vector<int64_t>& a_off, const T* B,
                 const std::vector<int64_t>& b_off, T* C) {
  int64_t per = M * N * std::max<int64_t>(K, 1);
  auto one = [&](int64_t b) {
    Gemm<T>(false, false, M, N, K, 1.f, A + a_off[b], K, B + b_off[b], N, 0.f, C + b * M * N, N);
  };
  if (batch > 1 && per < (int64_t{1} << 21)) {
    ParallelFor(batch, std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(per, 1)),
                [&](int64_t b0, int64_t b1) {
                  for (int64_t b = b0; b < b1; ++b) one(b);
                });
  } else {
    for (int64_t b = 0; b < batch; ++b) one(b);
  }
}

// ------------------------------------------------------------------------------------------
// Spatial geometry shared by Conv and pooling. Up to 3 spatial dims, normalized to 3 by
// prepending unit dims (in=1, k=1, s=1, d=1, no padding).

struct Geom {
  int nsp = 0;  // original number of spatial dims
  std::array<int64_t, 3> in{1, 1, 1}, out{1, 1, 1}, k{1, 1, 1}, s{1, 1, 1}, d{1, 1, 1},
      pb{0, 0, 0}, pe{0, 0, 0};
  int64_t in_size() const { return in[0] * in[1] * in[2]; }
  int64_t out_size() const { return out[0] * out[1] * out[2]; }
  int64_t k_size() const { return k[0] * k[1] * k[2]; }
};

// conv.cc: an attribute with one value per spatial dim (`def` for each when absent), the
// geometry of a window, and the output shape.
std::vector<int64_t> SpatialAttr(const Node& node, const char* name, size_t nsp, int64_t def);
// Computes output size and pads from the conv/pool attributes (auto_pad, pads, strides,
// dilations, ceil_mode).
Geom MakeGeom(const Node& node, const Shape& x_shape, const std::vector<int64_t>& kernel,
              bool ceil_mode, bool allow_dilations = true);
// [n, c, out...] for the spatial dims of g.
Shape OutShape(int64_t n, int64_t c, const Geom& g);

// ------------------------------------------------------------------------------------------
// Zero points and scales of the quantized kernels (matmul.cc; used there by MatMulInteger and
// QLinearMatMul, and by ConvInteger and QLinearConv in conv.cc).

// The values of a uint8/int8 tensor as int32; `what` names it in the error for other types.
std::vector<int32_t> ToInt32Values(const Tensor& t, const Node& node, const char* what);
// Values of a uint8/int8 tensor minus its zero point; the zero point is a scalar or has one
// value per index of the axis whose elements are `inner` apart with `axis_size` entries.
std::vector<int32_t> Dequantized(const Tensor& t, const Tensor* zp, int64_t axis_size,
                                 int64_t inner, const Node& node, const char* what);
// Scale values: a scalar, or `n` per-channel values.
std::vector<float> Scales(const Tensor& t, int64_t n, const Node& node, const char* what);
// y = saturate(round_half_even(acc * scale[channel]) + zero_point) for uint8/int8 outputs.
void Requantize(const std::vector<int32_t>& acc, const std::vector<float>& scale, int64_t nch,
                int64_t inner, const Tensor* yzp, Tensor& y, const Node& node);

// ------------------------------------------------------------------------------------------
// The kernels RegisterNnKernels (nn.cc) registers.

void MatMulKernel(KernelContext& ctx);            // matmul.cc
void GemmKernel(KernelContext& ctx);              // matmul.cc
void MatMulIntegerKernel(KernelContext& ctx);     // matmul.cc
void QLinearMatMulKernel(KernelContext& ctx);     // matmul.cc
void EinsumKernel(KernelContext& ctx);            // einsum.cc
void ConvKernel(KernelContext& ctx);              // conv.cc
void ConvIntegerKernel(KernelContext& ctx);       // conv.cc
void QLinearConvKernel(KernelContext& ctx);       // conv.cc
void ConvTransposeKernel(KernelContext& ctx);     // conv.cc
void MaxPoolKernel(KernelContext& ctx);           // pool.cc
void AveragePoolKernel(KernelContext& ctx);       // pool.cc
void LpPoolKernel(KernelContext& ctx);            // pool.cc
void MaxUnpoolKernel(KernelContext& ctx);         // pool.cc
enum class GlobalMode { kAvg, kMax, kLp };
template <GlobalMode kMode>
void GlobalPoolKernel(KernelContext& ctx);        // pool.cc, for the three modes
extern template void GlobalPoolKernel<GlobalMode::kAvg>(KernelContext& ctx);
extern template void GlobalPoolKernel<GlobalMode::kMax>(KernelContext& ctx);
extern template void GlobalPoolKernel<GlobalMode::kLp>(KernelContext& ctx);

}  // namespace gaf::nn_detail
