// Attention's row arithmetic and AVX-512 kernels of its products, shared by MaskedSoftmax
// (ops/masked_softmax.cc), GroupedMatMul (ops/grouped_matmul.cc) and
// FusedAttention (ops/fused_attention.cc). GAF_ATTENTION_AVX512 says whether this build has them
// (kernels are compiled for the machine that builds them). The loops over the register tiles are
// unrolled by pragma: at -O2 GCC 12 would keep the accumulators in memory (a third of the speed).
#pragma once

#include <algorithm>
#include <cstdint>

#if defined(__AVX512F__)
#include <immintrin.h>
#define GAF_ATTENTION_AVX512 1
#else
#define GAF_ATTENTION_AVX512 0
#endif

namespace gaf {

// y[0, n) = x scaled (scale 1: x / c, 2: x * c, 0: x as is) plus the mask row m (m_last 1: m[i],
// 0: m[0] for all; none when m is null): MaskedSoftmax's arithmetic, one operator's rounding at a
// time. y may be x.
inline void ScaleAndMaskRow(const float* x, float* y, int64_t n, int64_t scale, float c, const float* m,
                            int64_t m_last) {
  if (scale == 1) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] / c;
  } else if (scale == 2) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * c;
  } else if (x != y) {
    std::copy(x, x + n, y);
  }
  if (m == nullptr) return;
  if (m_last == 1) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] += m[i];
  } else {
    const float m0 = m[0];
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] += m0;
  }
}

#if GAF_ATTENTION_AVX512
// C[M, 16*DV] (+)= P[M,T] * V[T, 16*DV] (P rows ldp apart) for MB rows of P at a time: the MB x DV
// sums in registers while V streams by (read once per MB rows: from L2 after the first block).
template <int DV, int MB>
inline void ValuesBlock(int64_t mb, int64_t T, const float* P, int64_t ldp, const float* V, float* C, bool accumulate) {
  __m512 acc[MB][DV];
#pragma GCC unroll 16
  for (int i = 0; i < MB; ++i)
#pragma GCC unroll 16
    for (int c = 0; c < DV; ++c)
      acc[i][c] = accumulate && i < mb ? _mm512_loadu_ps(C + i * 16 * DV + 16 * c) : _mm512_setzero_ps();
  for (int64_t t = 0; t < T; ++t) {
    __m512 v[DV];
#pragma GCC unroll 16
    for (int c = 0; c < DV; ++c) v[c] = _mm512_loadu_ps(V + t * 16 * DV + 16 * c);
#pragma GCC unroll 16
    for (int i = 0; i < MB; ++i) {
      if (i >= mb) break;
      const __m512 p = _mm512_set1_ps(P[i * ldp + t]);
#pragma GCC unroll 16
      for (int c = 0; c < DV; ++c) acc[i][c] = _mm512_fmadd_ps(p, v[c], acc[i][c]);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MB; ++i) {
    if (i >= mb) break;
#pragma GCC unroll 16
    for (int c = 0; c < DV; ++c) _mm512_storeu_ps(C + i * 16 * DV + 16 * c, acc[i][c]);
  }
}

template <int DV, int MB>
inline void ValuesAvx512(int64_t M, int64_t T, const float* P, int64_t ldp, const float* V, float* C, bool accumulate) {
  for (int64_t m0 = 0; m0 < M; m0 += MB)
    ValuesBlock<DV, MB>(std::min<int64_t>(MB, M - m0), T, P + m0 * ldp, ldp, V, C + m0 * 16 * DV, accumulate);
}

// C[mr rows, ldc apart][32 columns from n0, the first nb] = A[mr rows, D apart] * Bt[D, ldb apart]:
// the MR x 32 sums in registers, each over the D terms in order.
template <int MR>
inline void ScoresTile(int64_t D, const float* A, const float* Bt, int64_t ldb, float* C, int64_t ldc, int64_t nb) {
  const __mmask16 m0 = nb >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << nb) - 1);
  const __mmask16 m1 = nb >= 32 ? 0xFFFF : nb > 16 ? static_cast<__mmask16>((1u << (nb - 16)) - 1) : 0;
  __m512 acc[MR][2];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t k = 0; k < D; ++k) {
    const __m512 b0 = _mm512_maskz_loadu_ps(m0, Bt + k * ldb);
    const __m512 b1 = _mm512_maskz_loadu_ps(m1, Bt + k * ldb + 16);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512 a = _mm512_set1_ps(A[i * D + k]);
      acc[i][0] = _mm512_fmadd_ps(a, b0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(a, b1, acc[i][1]);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    _mm512_mask_storeu_ps(C + i * ldc, m0, acc[i][0]);
    _mm512_mask_storeu_ps(C + i * ldc + 16, m1, acc[i][1]);
  }
}

// Scores C[M, N] (rows ldc apart) = A[M, D] (rows D apart) * Bt[D, N], the keys packed transposed
// (rows ldb apart): 32 key columns at a time stay in L1 while every query row takes them. Tiles
// of 8 rows, then 4, then 1: a one-row tile waits on its FMA's latency at every term (a quarter of
// the speed), so a 32-row block in tiles of 6 spent a fifth of its time on its last two rows.
inline void ScoresPacked(int64_t M, int64_t N, int64_t D, const float* A, const float* Bt, int64_t ldb, float* C,
                         int64_t ldc) {
  for (int64_t n0 = 0; n0 < N; n0 += 32) {
    const int64_t nb = std::min<int64_t>(32, N - n0);
    int64_t i = 0;
    for (; i + 8 <= M; i += 8) ScoresTile<8>(D, A + i * D, Bt + n0, ldb, C + i * ldc + n0, ldc, nb);
    for (; i + 4 <= M; i += 4) ScoresTile<4>(D, A + i * D, Bt + n0, ldb, C + i * ldc + n0, ldc, nb);
    for (; i < M; ++i) ScoresTile<1>(D, A + i * D, Bt + n0, ldb, C + i * ldc + n0, ldc, nb);
  }
}
#endif

}  // namespace gaf
