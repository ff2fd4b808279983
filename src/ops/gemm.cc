// float32 GEMM (ops/gemm.h): Sgemm() runs oneDNN's dnnl_sgemm, except batch-1 products with a
// row-major [K,N] weight (the decode step of an LLM) or a transposed [N,K] one (a classifier's
// Gemm with transB) and products of a few rows by a large weight,
// which use the streaming GEMV (gemv.cc): it reads the weight once, in tasks taken dynamically by
// the threads. The GEMM templates for other types are in ops/nn_internal.h.
#include <oneapi/dnnl/dnnl.h>

#include <vector>

#include "ops/gemm.h"
#include "ops/gemv.h"
#include "ops/kernel_util.h"
#include "ops/nn_internal.h"

namespace gaf::nn_detail {

// ------------------------------------------------------------------------------------------
// GEMM.

// C[M,N] = alpha * op(A) * op(B) + beta * C, row-major.
void Sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) C[m * ldc + n] = beta == 0.f ? 0.f : beta * C[m * ldc + n];
    return;
  }
  if (M == 1 && !tb && (beta == 0.f || beta == 1.f)) {
    const float* x = A;
    std::vector<float> tmp;
    if (ta || alpha != 1.f) {
      tmp.resize(K);
      for (int64_t k = 0; k < K; ++k) tmp[k] = alpha * (ta ? A[k * lda] : A[k]);
      x = tmp.data();
    }
    GemvF32(x, B, ldb, C, K, N, beta == 1.f);
    return;
  }
  if (M == 1 && !ta && tb) {  // one row by a [N, K] weight: dot products of its rows
    GemvRowsF32(A, B, ldb, C, K, N, alpha, beta);
    return;
  }
  // A few rows by a large row-major weight (a short prompt's prefill, a small batch's decode):
  // bandwidth-bound, so the weight is streamed once for all rows.
  if (M <= kGemvMaxRows && !ta && !tb && alpha == 1.f && (beta == 0.f || beta == 1.f) && K * N >= kGemvRowsMinWeight) {
    const GemvProduct<float> p{B, ldb, C, N, ldc};
    GemvMany(A, lda, M, K, &p, 1, beta == 1.f);
    return;
  }
  dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb,
                                beta, C, ldc);
  GAF_CHECK(st == dnnl_success, "oneDNN sgemm failed with status {}", static_cast<int>(st));
}

}  // namespace gaf::nn_detail

namespace gaf {

using namespace nn_detail;

std::vector<int64_t> BatchOffsets(const Shape& batch_shape, int64_t mat_size,
                                  const Shape& out_batch) {
  int64_t nb = NumElements(out_batch);
  std::vector<int64_t> offs(nb);
  std::vector<int64_t> st = BroadcastStrides(batch_shape, out_batch);
  size_t r = out_batch.size();
  std::vector<int64_t> idx(r, 0);
  int64_t off = 0;
  for (int64_t b = 0; b < nb; ++b) {
    offs[b] = off * mat_size;
    for (int64_t d = static_cast<int64_t>(r) - 1; d >= 0; --d) {
      if (++idx[d] < out_batch[d]) {
        off += st[d];
        break;
      }
      off -= st[d] * (out_batch[d] - 1);
      idx[d] = 0;
    }
  }
  return offs;
}

void SgemmF32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  Sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace gaf
