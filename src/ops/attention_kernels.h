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

// Whether x / c has the bits of x * (1 / c) for every float x: c is plus or minus a power of two
// whose reciprocal is a normal float (both round the same exact value once). A torch export's
// scores divided by sqrt(head dim) = 8 then take a product, not a division (vdivps: several
// times an FMA's cost).
inline bool ExactReciprocal(float c) {
  int e = 0;
  const float m = std::frexp(c, &e);
  return std::fabs(m) == 0.5f && e >= -125 && e <= 127;
}

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

// The row stride (floats) of a prompt's keys packed transposed ([d, ldt], zero past T) and of its
// score buffers: T rounded up to 16, then to an odd number of 64-byte lines. At a stride of a
// power of two (T = 256, 1024) the scores tile's d rows of a key strip fell into a few L1 sets
// and missed on every pass of the block's row groups.
inline int64_t PackedKeyStride(int64_t T) {
  const int64_t lines = (T + 15) / 16;
  return (lines | 1) * 16;
}

// What a decode step's attention asks for ahead of its reads (DecodeScores, ValuesAvx512 with
// kAhead): the rows it reads, `ahead` bytes ahead into L1 (0: none); and while the scores go, a
// second stream (the head's values, `next_bytes` from `next`) into L2 at the same pace, so that
// the values product finds them there.
struct DecodeAhead {
  int64_t ahead = 0;
  const float* next = nullptr;
  int64_t next_bytes = 0;
};

// Whether a decode step's task (FusedAttention's, ONNX Attention's) asks for its head's rows as
// its kernels go (DecodeAhead) rather than all at its start: where this build's decode kernels
// take the head, and for 2 query rows or more.
// decode_attention_bench, 2 threads, 12 layers at a 2,000-row past, cold, ms a step (as they go
// against all at the start, both with DecodeScores): 4 cache heads of 4 query rows, d 64 (the
// bench Llama) 1.69-1.72 against 1.86 (2.16-2.18 with the scores one dot product at a time); 8
// rows 1.87 against 2.15; 2 rows 1.59 against 1.61; d 128 4.00 against 4.01; but 1 row (16 heads of
// multi-head attention) 6.2-6.8 against 5.84-5.87 (4 to 64 KiB ahead): a row's few multiply-adds
// a byte leave the reads as the only work, and asking for the whole head at once keeps more of
// them in flight. A split cache's segments (DecodeStepsSplit; `--parts 2`, one cache head, 2
// threads, against no requests ahead as before): 4 query rows 0.375-0.389 against 0.468-0.477 ms,
// 8 rows 0.313-0.320 against 0.380-0.398.
inline bool DecodeAheadTakes(int64_t M, int64_t d, int64_t dv) {
  return GAF_ATTENTION_AVX512 && M >= 2 && M <= 16 && (d == 64 || d == 128) && (dv == 64 || dv == 128);
}
inline constexpr int64_t kDecodeAheadBytes = 4096;

#if GAF_ATTENTION_AVX512
// Lines of a stream a kernel asks for ahead of its reads: [done, upto) of `bytes` from p, one
// prefetch a 64-byte line (L1: prefetcht0; else L2: prefetcht1). Returns the new `done`.
template <bool kL1>
inline int64_t PrefetchLines(const char* p, int64_t bytes, int64_t done, int64_t upto) {
  upto = std::min(upto, bytes);
  for (; done < upto; done += 64) {
    if (kL1) _mm_prefetch(p + done, _MM_HINT_T0);
    else _mm_prefetch(p + done, _MM_HINT_T1);
  }
  return done;
}

// C[M, 16*DV] (+)= P[M,T] * V[T, 16*DV] (P rows ldp apart) for MB rows of P at a time: the MB x DV
// sums in registers while V streams by (read once per MB rows: from L2 after the first block).
// kAhead: V's rows asked for `ahead` bytes ahead into L1 (a decode step's values, from memory).
template <int DV, int MB, bool kAhead = false>
inline void ValuesBlock(int64_t mb, int64_t T, const float* P, int64_t ldp, const float* V, float* C, bool accumulate,
                        int64_t ahead = 0, int64_t ldc = 16 * DV) {
  const char* vp = reinterpret_cast<const char*>(V);
  const int64_t v_bytes = T * 16 * DV * static_cast<int64_t>(sizeof(float));
  int64_t asked = 0;
  __m512 acc[MB][DV];
#pragma GCC unroll 16
  for (int i = 0; i < MB; ++i)
#pragma GCC unroll 16
    for (int c = 0; c < DV; ++c)
      acc[i][c] = accumulate && i < mb ? _mm512_loadu_ps(C + i * ldc + 16 * c) : _mm512_setzero_ps();
  for (int64_t t = 0; t < T; ++t) {
    if (kAhead && (t & 3) == 0) asked = PrefetchLines<true>(vp, v_bytes, asked, (t + 4) * 64 * DV + ahead);
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
    for (int c = 0; c < DV; ++c) _mm512_storeu_ps(C + i * ldc + 16 * c, acc[i][c]);
  }
}

// ldc: C's rows that many floats apart (0: 16 DV, packed; an attention writing its output with the
// heads interleaved, [b, S, H, dv], H dv).
template <int DV, int MB, bool kAhead = false>
inline void ValuesAvx512(int64_t M, int64_t T, const float* P, int64_t ldp, const float* V, float* C, bool accumulate,
                         int64_t ahead = 0, int64_t ldc = 0) {
  if (ldc == 0) ldc = 16 * DV;
  for (int64_t m0 = 0; m0 < M; m0 += MB)
    ValuesBlock<DV, MB, kAhead>(std::min<int64_t>(MB, M - m0), T, P + m0 * ldp, ldp, V, C + m0 * ldc, accumulate,
                                m0 == 0 ? ahead : 0, ldc);
}

// Lane i of the result = the sum of the lanes of v[i] (16 vectors transposed and added in four
// levels: 45 operations for 16 sums). (GCC 12 warns, wherever this is inlined, that the
// intrinsics' undefined pass-through operand may be used uninitialized; it is not used.)
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#pragma GCC diagnostic ignored "-Wuninitialized"
inline __m512 SumEach16(const __m512* v) {
  __m512 t[8], u[4];
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j)
    t[j] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * j], v[2 * j + 1]), _mm512_unpackhi_ps(v[2 * j], v[2 * j + 1]));
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const __m512d a = _mm512_castps_pd(t[2 * j]), b = _mm512_castps_pd(t[2 * j + 1]);
    u[j] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  const __m512 w0 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88), _mm512_shuffle_f32x4(u[0], u[1], 0xDD));
  const __m512 w1 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88), _mm512_shuffle_f32x4(u[2], u[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(w0, w1, 0x88), _mm512_shuffle_f32x4(w0, w1, 0xDD));
}
#pragma GCC diagnostic pop

// Scores C[M, N] (rows ldc apart) = A[M, D] * B[N, D]ᵀ for D a multiple of 16: per query row, 16
// cache rows' dot products one after another (each waits on its multiply-adds' latency), then
// summed across lanes together. The decode kernel before DecodeScores, which gives the same bits
// faster; kept for the widths DecodeScores does not take (and by decode_attention_bench as the
// kernel it replaced).
inline void ScoresRowByRow(int64_t M, int64_t N, int64_t D, const float* A, const float* B, float* C, int64_t ldc) {
  const int64_t chunks = D / 16;
  for (int64_t n0 = 0; n0 < N; n0 += 16) {
    const int64_t nb = std::min<int64_t>(16, N - n0);
    for (int64_t m = 0; m < M; ++m) {
      const float* a = A + m * D;
      __m512 part[16];
      for (int64_t i = 0; i < 16; ++i) {
        __m512 acc = _mm512_setzero_ps();
        if (i < nb) {
          const float* b = B + (n0 + i) * D;
          for (int64_t c = 0; c < chunks; ++c)
            acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + 16 * c), _mm512_loadu_ps(b + 16 * c), acc);
        }
        part[i] = acc;
      }
      _mm512_mask_storeu_ps(C + m * ldc + n0, static_cast<__mmask16>((1u << nb) - 1), SumEach16(part));
    }
  }
}

// Scores C[m, n] (rows ldc apart) = A[m, :] . B[n, :] for MR query rows (A's rows 16*DC apart) and
// N cache rows (B's rows 16*DC apart), a decode step's product over a long cache: the query rows
// in registers, 16/MR cache rows at a time, each of the 16 dot products summed over its 16 lanes
// (DC multiply-adds a lane, in the order of the d axis) and then across them (SumEach16), so the
// sums have the bits of ScoresRowByRow's. The 16 sums advance together: one
// dot product at a time waited on its multiply-add's latency.
template <int MR, int DC>
inline void DecodeScoresRows(int64_t N, const float* A, const float* B, float* C, int64_t ldc, const DecodeAhead& pf) {
  constexpr int KG = 16 / MR;  // cache rows a group
  constexpr int64_t kRow = 16 * DC;
  __m512 q[MR][DC];
#pragma GCC unroll 16
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 16
    for (int c = 0; c < DC; ++c) q[m][c] = _mm512_loadu_ps(A + m * kRow + 16 * c);
  const char* bp = reinterpret_cast<const char*>(B);
  const int64_t b_bytes = N * kRow * static_cast<int64_t>(sizeof(float));
  const char* np = reinterpret_cast<const char*>(pf.next);
  int64_t asked = 0, next_asked = 0;
  int64_t n0 = 0;
  for (; n0 + KG <= N; n0 += KG) {
    if (pf.ahead > 0) asked = PrefetchLines<true>(bp, b_bytes, asked, (n0 + KG) * kRow * 4 + pf.ahead);
    if (np != nullptr)  // the same fraction of the second stream as of the rows (in double: no product overflows)
      next_asked = PrefetchLines<false>(
          np, pf.next_bytes, next_asked,
          static_cast<int64_t>(static_cast<double>(pf.next_bytes) * static_cast<double>(n0 + KG) / static_cast<double>(N)));
    __m512 acc[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int k = 0; k < KG; ++k)
#pragma GCC unroll 16
      for (int c = 0; c < DC; ++c) {
        const __m512 b = _mm512_loadu_ps(B + (n0 + k) * kRow + 16 * c);
#pragma GCC unroll 16
        for (int m = 0; m < MR; ++m) acc[m * KG + k] = _mm512_fmadd_ps(q[m][c], b, acc[m * KG + k]);
      }
    alignas(64) float s[16];
    _mm512_store_ps(s, SumEach16(acc));
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m)
#pragma GCC unroll 16
      for (int k = 0; k < KG; ++k) C[m * ldc + n0 + k] = s[m * KG + k];
  }
  for (; n0 < N; ++n0)  // the last rows, one at a time
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) {
      __m512 acc[16];
#pragma GCC unroll 16
      for (int j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
#pragma GCC unroll 16
      for (int c = 0; c < DC; ++c) acc[0] = _mm512_fmadd_ps(q[m][c], _mm512_loadu_ps(B + n0 * kRow + 16 * c), acc[0]);
      alignas(64) float s[16];
      _mm512_store_ps(s, SumEach16(acc));
      C[m * ldc + n0] = s[0];
    }
  if (np != nullptr) PrefetchLines<false>(np, pf.next_bytes, next_asked, pf.next_bytes);
}

// DecodeScoresRows for any M rows (A's rows 16*DC apart): the rows in blocks of 8, 4, 2 and 1,
// each block one pass over B (a block's next pass finds B in L2 when it fits there).
template <int DC>
inline void DecodeScoresOf(int64_t M, int64_t N, const float* A, const float* B, float* C, int64_t ldc,
                           const DecodeAhead& pf) {
  int64_t m = 0;
  for (; m + 8 <= M; m += 8) DecodeScoresRows<8, DC>(N, A + m * 16 * DC, B, C + m * ldc, ldc, m == 0 ? pf : DecodeAhead{});
  for (; m + 4 <= M; m += 4) DecodeScoresRows<4, DC>(N, A + m * 16 * DC, B, C + m * ldc, ldc, m == 0 ? pf : DecodeAhead{});
  for (; m + 2 <= M; m += 2) DecodeScoresRows<2, DC>(N, A + m * 16 * DC, B, C + m * ldc, ldc, m == 0 ? pf : DecodeAhead{});
  for (; m < M; ++m) DecodeScoresRows<1, DC>(N, A + m * 16 * DC, B, C + m * ldc, ldc, m == 0 ? pf : DecodeAhead{});
}

// C[M, N] for D = 64 or 128 (true), else false (the caller's kernel).
inline bool DecodeScores(int64_t M, int64_t N, int64_t D, const float* A, const float* B, float* C, int64_t ldc,
                         const DecodeAhead& pf) {
  if (D == 64) DecodeScoresOf<4>(M, N, A, B, C, ldc, pf);
  else if (D == 128) DecodeScoresOf<8>(M, N, A, B, C, ldc, pf);
  else return false;
  return true;
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

// ScoresTile with the epilogue above on columns [n0, n0 + nb) of the scores, NV vectors of 16 wide:
// C, and for the tile's MR rows the lane-wise maximum of what it stored into rmax[i] and whether it
// stored a NaN into nan[i]. kFull: nb is 16 NV (the key loads need no mask; masked loads were 10%
// slower).
template <int MR, int NV, bool kFull>
inline void ScoresTileScaled(int64_t D, const float* A, const float* Bt, int64_t ldb, float* C, int64_t ldc,
                             int64_t n0, int64_t nb, const ScoreEpilogue& e, __m512* rmax, bool* nan) {
  __mmask16 mk[NV];
#pragma GCC unroll 4
  for (int j = 0; j < NV; ++j)
    mk[j] = static_cast<__mmask16>(kFull || nb >= 16 * (j + 1) ? 0xFFFF : nb > 16 * j ? (1u << (nb - 16 * j)) - 1 : 0);
  __m512 acc[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < D; ++k) {
    __m512 b[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j)
      b[j] = kFull ? _mm512_loadu_ps(Bt + k * ldb + 16 * j) : _mm512_maskz_loadu_ps(mk[j], Bt + k * ldb + 16 * j);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512 a = _mm512_set1_ps(A[i * D + k]);
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_fmadd_ps(a, b[j], acc[i][j]);
    }
  }
  const __m512 cv = _mm512_set1_ps(e.c);
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
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

// The key columns of a prompt's scores tile (ScoresPackedScaled): 48 read a strip from L2 at
// 181-189 GFLOPS a thread here where 32 read it at 134.
constexpr int64_t kScoreStripFloats = 48;
static_assert(kScoreStripFloats % 16 == 0 && kScoreStripFloats <= 64, "whole vectors, at most 4");

// C[M, N] (rows ldc apart) = the scores of A[M, D] and Bt[D, N] with the epilogue e (ScoresPacked's
// tiles, e.m advanced by e.m_row a row), and top[0, M) each row's largest (-inf when N is 0).
// group_cols (optional, one per 8 rows, each at most N): the columns of each group of 8 rows;
// the others are not computed, stored or counted in top. group_zero (optional, one per 8 rows):
// the leading columns where the mask is 0 (or -0) in every row of the group; tiles inside them do
// not read the mask (a causal mask is 0 below its diagonal: reading it for every head took a
// sixth of the scores' time, the mask rows coming from L3). Adding 0 changes no score but a -0,
// whose exp is the same. Each strip of 32 key columns is taken
// by every group of rows in turn while it is in L1 (FusedAttention called this once per group of
// 8 rows: each group read the whole packed keys from L2, and the scores ran at about 0.6 of
// the FMA peak).
inline void ScoresPackedScaled(int64_t M, int64_t N, int64_t D, const float* A, const float* Bt, int64_t ldb,
                               float* C, int64_t ldc, const ScoreEpilogue& e, float* top,
                               const int64_t* group_cols = nullptr, const int64_t* group_zero = nullptr) {
  constexpr int64_t kMaxRows = 32, kGroup = 8;
  if (M > kMaxRows) {  // in parts of rows
    for (int64_t i = 0; i < M; i += kMaxRows) {
      ScoreEpilogue ei = e;
      if (ei.m != nullptr) ei.m += i * e.m_row;
      ScoresPackedScaled(std::min(kMaxRows, M - i), N, D, A + i * D, Bt, ldb, C + i * ldc, ldc, ei, top + i,
                         group_cols != nullptr ? group_cols + i / kGroup : nullptr,
                         group_zero != nullptr ? group_zero + i / kGroup : nullptr);
    }
    return;
  }
  __m512 rmax[kMaxRows];
  bool nan[kMaxRows];
  for (int64_t i = 0; i < M; ++i) {
    rmax[i] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    nan[i] = false;
  }
  // The columns of the group row i is in.
  auto cols_of = [&](int64_t i) { return group_cols != nullptr ? group_cols[i / kGroup] : N; };
  // The epilogue of the tile at row i, columns [n0, n0 + nb).
  auto epilogue = [&](int64_t i, int64_t n0, int64_t nb) {
    ScoreEpilogue ei = e;
    if (ei.m != nullptr) ei.m += i * e.m_row;
    if (group_zero != nullptr && n0 + nb <= group_zero[i / kGroup]) ei.m = nullptr;
    return ei;
  };
  constexpr int NV = kScoreStripFloats / 16;
  for (int64_t n0 = 0; n0 < N; n0 += kScoreStripFloats) {
    const float* b = Bt + n0;
    int64_t i = 0;
    for (; i + kGroup <= M; i += kGroup) {
      const int64_t nb = std::min<int64_t>(kScoreStripFloats, cols_of(i) - n0);
      if (nb <= 0) continue;
      const ScoreEpilogue ei = epilogue(i, n0, nb);
      if (nb == kScoreStripFloats)
        ScoresTileScaled<8, NV, true>(D, A + i * D, b, ldb, C + i * ldc + n0, ldc, n0, nb, ei, rmax + i, nan + i);
      else
        ScoresTileScaled<8, NV, false>(D, A + i * D, b, ldb, C + i * ldc + n0, ldc, n0, nb, ei, rmax + i, nan + i);
    }
    // The rows after the last whole group: one group's (the last), in tiles of 4, then 1.
    const int64_t nb = i < M ? std::min<int64_t>(kScoreStripFloats, cols_of(i) - n0) : 0;
    if (nb <= 0) continue;
    for (; i + 4 <= M; i += 4)
      ScoresTileScaled<4, NV, false>(D, A + i * D, b, ldb, C + i * ldc + n0, ldc, n0, nb, epilogue(i, n0, nb), rmax + i, nan + i);
    for (; i < M; ++i)
      ScoresTileScaled<1, NV, false>(D, A + i * D, b, ldb, C + i * ldc + n0, ldc, n0, nb, epilogue(i, n0, nb), rmax + i, nan + i);
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
