// Attention's row arithmetic and AVX-512 kernels of its products, shared by MaskedSoftmax
// (ops/masked_softmax.cc), GroupedMatMul (ops/grouped_matmul.cc) and
// FusedAttention (ops/fused_attention.cc). GAF_ATTENTION_AVX512 says whether this build has them
// (kernels are compiled for the machine that builds them). The loops over the register tiles are
// unrolled by pragma: at -O2 GCC 12 would keep the accumulators in memory (a third of the speed).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

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

// What a prompt block's scores get before they are stored (FusedAttention): MaskedSoftmax's scale
// (1: / c, 2: * c, 0: none) and mask (m: the tile's first row's mask at column 0, rows m_row apart;
// m_last 1: a value per column, 0: m[0] for the row; null: none), one operator's rounding at a time
// as ScaleAndMaskRow; and each row's largest stored value (NaN when a stored value is NaN).
struct ScoreEpilogue {
  int64_t scale = 0;
  float c = 1.f;
  const float* m = nullptr;
  int64_t m_row = 0, m_last = 1;
};

// ScoresTile with the epilogue above on columns [n0, n0 + nb) of the scores: C, and for the tile's
// MR rows the lane-wise maximum of what it stored into rmax[i] and whether it stored a NaN into
// nan[i]. kFull: nb is 32 (the key loads need no mask; masked loads were 10% slower).
template <int MR, bool kFull>
inline void ScoresTileScaled(int64_t D, const float* A, const float* Bt, int64_t ldb, float* C, int64_t ldc,
                             int64_t n0, int64_t nb, const ScoreEpilogue& e, __m512* rmax, bool* nan) {
  const __mmask16 mk[2] = {
      static_cast<__mmask16>(kFull || nb >= 16 ? 0xFFFF : (1u << nb) - 1),
      static_cast<__mmask16>(kFull || nb >= 32 ? 0xFFFF : nb > 16 ? (1u << (nb - 16)) - 1 : 0)};
  __m512 acc[MR][2];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t k = 0; k < D; ++k) {
    const __m512 b0 = kFull ? _mm512_loadu_ps(Bt + k * ldb) : _mm512_maskz_loadu_ps(mk[0], Bt + k * ldb);
    const __m512 b1 = kFull ? _mm512_loadu_ps(Bt + k * ldb + 16) : _mm512_maskz_loadu_ps(mk[1], Bt + k * ldb + 16);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512 a = _mm512_set1_ps(A[i * D + k]);
      acc[i][0] = _mm512_fmadd_ps(a, b0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(a, b1, acc[i][1]);
    }
  }
  const __m512 cv = _mm512_set1_ps(e.c);
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 2
    for (int j = 0; j < 2; ++j) {
      if (mk[j] == 0) continue;
      __m512 v = acc[i][j];
      if (e.scale == 1) v = _mm512_div_ps(v, cv);
      else if (e.scale == 2) v = _mm512_mul_ps(v, cv);
      if (e.m != nullptr) {
        const float* mr = e.m + i * e.m_row;
        v = _mm512_add_ps(v, e.m_last == 1 ? _mm512_maskz_loadu_ps(mk[j], mr + n0 + 16 * j) : _mm512_set1_ps(mr[0]));
      }
      _mm512_mask_storeu_ps(C + i * ldc + 16 * j, mk[j], v);
      nan[i] = nan[i] || _mm512_mask_cmp_ps_mask(mk[j], v, v, _CMP_UNORD_Q) != 0;
      rmax[i] = _mm512_mask_max_ps(rmax[i], mk[j], rmax[i], v);
    }
  }
}

// C[M, N] (rows ldc apart) = the scores of A[M, D] and Bt[D, N] with the epilogue e (ScoresPacked's
// tiles, e.m advanced by e.m_row a row), and top[0, M) each row's largest (-inf when N is 0).
inline void ScoresPackedScaled(int64_t M, int64_t N, int64_t D, const float* A, const float* Bt, int64_t ldb,
                               float* C, int64_t ldc, const ScoreEpilogue& e, float* top) {
  constexpr int64_t kMaxRows = 32;
  if (M > kMaxRows) {  // in parts of rows (FusedAttention's groups are 8)
    for (int64_t i = 0; i < M; i += kMaxRows) {
      ScoreEpilogue ei = e;
      if (ei.m != nullptr) ei.m += i * e.m_row;
      ScoresPackedScaled(std::min(kMaxRows, M - i), N, D, A + i * D, Bt, ldb, C + i * ldc, ldc, ei, top + i);
    }
    return;
  }
  __m512 rmax[kMaxRows];
  bool nan[kMaxRows];
  for (int64_t i = 0; i < M; ++i) {
    rmax[i] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    nan[i] = false;
  }
  auto rows_from = [&](int64_t i) {
    ScoreEpilogue ei = e;
    if (ei.m != nullptr) ei.m += i * e.m_row;
    return ei;
  };
  for (int64_t n0 = 0; n0 < N; n0 += 32) {
    const int64_t nb = std::min<int64_t>(32, N - n0);
    int64_t i = 0;
    for (; i + 8 <= M; i += 8) {
      const ScoreEpilogue ei = rows_from(i);
      if (nb == 32) ScoresTileScaled<8, true>(D, A + i * D, Bt + n0, ldb, C + i * ldc + n0, ldc, n0, nb, ei, rmax + i, nan + i);
      else ScoresTileScaled<8, false>(D, A + i * D, Bt + n0, ldb, C + i * ldc + n0, ldc, n0, nb, ei, rmax + i, nan + i);
    }
    for (; i + 4 <= M; i += 4)
      ScoresTileScaled<4, false>(D, A + i * D, Bt + n0, ldb, C + i * ldc + n0, ldc, n0, nb, rows_from(i), rmax + i, nan + i);
    for (; i < M; ++i)
      ScoresTileScaled<1, false>(D, A + i * D, Bt + n0, ldb, C + i * ldc + n0, ldc, n0, nb, rows_from(i), rmax + i, nan + i);
  }
  for (int64_t i = 0; i < M; ++i) {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, rmax[i]);
    top[i] = nan[i] ? std::numeric_limits<float>::quiet_NaN() : *std::max_element(lanes, lanes + 16);
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
