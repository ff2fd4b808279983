// Contraction and pooling kernels: MatMul, Gemm, MatMulInteger, Einsum, Conv, ConvTranspose,
// MaxPool, AveragePool, LpPool and their global variants.
//
// float32 products go through Sgemm(): oneDNN's dnnl_sgemm, except batch-1 products with a
// row-major [K,N] weight (the decode step of an LLM), which use GemvF32(): a streaming kernel
// that reads the weight once, in tasks taken dynamically by the threads.
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "ops/conv.h"
#include "ops/gemm.h"
#include "ops/gemv.h"
#include "ops/kernel.h"
#include "ops/kernel_util.h"

// AVX-512 F+BW+VL: masked loads of float and half lanes; other machines take portable loops.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define GAF_AVX512 1
#else
#define GAF_AVX512 0
#endif
#if GAF_AVX512 || (defined(__F16C__) && defined(__AVX__))
#include <immintrin.h>
#endif

namespace gaf {
namespace {

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
// GEMV: y[0:N] (+)= x[0:K] * W[K,N], W row-major (leading dimension ldw), float32 or IEEE half.
//
// The rows are cut into at most eight chunks, a number that depends on K only, and the columns
// into pieces of up to kGemvPiece; the (chunk, piece) tasks are handed out to the threads
// dynamically, so a thread that is descheduled just takes fewer of them instead of holding up
// the others at a barrier. A task streams its rows as long contiguous segments (what the
// hardware prefetchers handle best; column blocks of 64-512 were measured 10-20% slower at two
// threads) into a partial sum per chunk; the partial sums are then added into y in chunk order.
// Every column is thus summed in the same order whatever the number of threads, so the result
// does not depend on it.

constexpr int64_t kGemvPiece = 8192;           // columns per task: a 32 KB accumulator row
constexpr int64_t kGemvMinParallel = 1 << 16;  // weight elements below which one thread is faster
// Products of up to this many rows stream the weight once for all rows (GemvPieceRows: 1.1-1.4x
// oneDNN's sgemm on a decoder's 2-8 token prefill here; at 16 rows sgemm is faster, 68 vs 85 ms).
constexpr int64_t kGemvMaxRows = 8;
constexpr int64_t kGemvRowsMinWeight = 1 << 18;  // ... when it has at least this many elements

// Rows per chunk (a multiple of 8): at most 8 chunks, at least 96 rows.
inline int64_t GemvChunkRows(int64_t K) {
  return std::max<int64_t>(96, CeilDiv(CeilDiv(K, 8), 8) * 8);
}

// IEEE half bits to float with integer blends, so that loops of it vectorize (gaf::HalfToFloat
// normalizes subnormals in a loop; a select on a float result would not be if-converted).
inline float HalfBitsToFloat(uint16_t h) {
  const uint32_t em = h & 0x7fffu;
  const uint32_t special = em > 0x7c00u ? 0x7fc00000u : em == 0x7c00u ? 0x7f800000u : 0u;
  const uint32_t normal =  // rebias the exponent; inf stays inf, nan is quieted as in F16C
      ((em << 13) + ((127 - 15) << 23)) | special;
  const uint32_t subnormal =  // zero and subnormals: exact, and a normal float
      std::bit_cast<uint32_t>(static_cast<float>(static_cast<int32_t>(em)) * 0x1p-24f);
  const uint32_t is_subnormal = em < 0x0400u ? ~0u : 0u;
  return std::bit_cast<float>((subnormal & is_subnormal) | (normal & ~is_subnormal) |
                              (uint32_t{h} & 0x8000u) << 16);
}

#if GAF_AVX512
// Lanes of the next 16 elements when `left` remain.
inline __mmask16 Mask16(int64_t left) {
  return left >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << left) - 1);
}
inline __m512 Load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 Load16(const uint16_t* p, __mmask16 m) {
  return _mm512_maskz_cvtph_ps(m, _mm256_maskz_loadu_epi16(m, p));
}
#endif

// dst[0:n] = float(src[0:n]), src IEEE half bits.
void HalfToFloatRow(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
#if GAF_AVX512
  for (; i < n; i += 16) {
    const __mmask16 m = Mask16(n - i);
    _mm512_mask_storeu_ps(dst + i, m, Load16(src + i, m));
  }
#elif defined(__F16C__) && defined(__AVX__)
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
#endif
  for (; i < n; ++i) dst[i] = HalfBitsToFloat(src[i]);
}

// acc[0:n] = sum over k in [k0, k1) of x[k] * w[k, 0:n], n <= kGemvPiece. Rows are taken eight
// at a time from k0 and summed as a fixed pairwise tree before they are added to acc.
template <class T>
void GemvPiece(const float* x, const T* w, int64_t ldw, int64_t k0, int64_t k1, int64_t n,
               float* acc);

// The same for M rows of x at once (x row m at x + m * ldx, its sums at acc + m * n): the weight is
// read once for all of them, and each row's sums are what GemvPiece gives that row alone.
template <class T>
void GemvPieceRows(const float* x, int64_t ldx, int64_t M, const T* w, int64_t ldw, int64_t k0, int64_t k1,
                   int64_t n, float* acc) {
#if GAF_AVX512
  std::fill(acc, acc + M * n, 0.f);
  // Blocks of 8 weight rows x 512 columns (16 KiB of float32: read from memory for the first row
  // of x, from L1 for the others), each x row's 8 values broadcast once per block; the 8 rows are
  // summed as GemvPiece's pairwise tree. (Register tiles of 8 x rows x 32 columns summing k in
  // order were 1.2-1.5x slower here at 4-8 rows.)
  constexpr int64_t kBlock = 512;
  int64_t k = k0;
  for (; k + 8 <= k1; k += 8) {
    const T* r = w + k * ldw;
    for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
      const int64_t j1 = std::min(n, j0 + kBlock);
      for (int64_t row = 0; row < M; ++row) {
        const float* xr = x + row * ldx + k;
        __m512 xv[8];
        for (int u = 0; u < 8; ++u) xv[u] = _mm512_set1_ps(xr[u]);
        float* a = acc + row * n;
        const auto group = [&](int64_t j, __mmask16 m) {
          const auto pair = [&](int u) {
            return _mm512_fmadd_ps(xv[u + 1], Load16(r + (u + 1) * ldw + j, m),
                                   _mm512_mul_ps(xv[u], Load16(r + u * ldw + j, m)));
          };
          const __m512 s = _mm512_add_ps(_mm512_add_ps(pair(0), pair(2)), _mm512_add_ps(pair(4), pair(6)));
          _mm512_mask_storeu_ps(a + j, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, a + j), s));
        };
        int64_t j = j0;
        for (; j + 16 <= j1; j += 16) group(j, 0xffff);
        if (j < j1) group(j, Mask16(j1 - j));
      }
    }
  }
  for (; k < k1; ++k) {
    const T* r = w + k * ldw;
    for (int64_t row = 0; row < M; ++row) {
      const __m512 xk = _mm512_set1_ps(x[row * ldx + k]);
      float* a = acc + row * n;
      for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 m = Mask16(n - j);
        _mm512_mask_storeu_ps(a + j, m, _mm512_fmadd_ps(xk, Load16(r + j, m), _mm512_maskz_loadu_ps(m, a + j)));
      }
    }
  }
#else
  for (int64_t row = 0; row < M; ++row) GemvPiece(x + row * ldx, w, ldw, k0, k1, n, acc + row * n);
#endif
}

template <class T>
void GemvPiece(const float* x, const T* w, int64_t ldw, int64_t k0, int64_t k1, int64_t n,
               float* acc) {
  std::fill(acc, acc + n, 0.f);
  int64_t k = k0;
#if GAF_AVX512
  // The same arithmetic as GemvPieceRows for one row, with the broadcasts hoisted (a separate
  // loop: the general one streams 15% slower at batch 1).
  for (; k + 8 <= k1; k += 8) {
    const T* r = w + k * ldw;
    __m512 xv[8];
    for (int u = 0; u < 8; ++u) xv[u] = _mm512_set1_ps(x[k + u]);
    const auto group = [&](int64_t j, __mmask16 m) {
      const auto pair = [&](int u) {
        return _mm512_fmadd_ps(xv[u + 1], Load16(r + (u + 1) * ldw + j, m),
                               _mm512_mul_ps(xv[u], Load16(r + u * ldw + j, m)));
      };
      const __m512 s = _mm512_add_ps(_mm512_add_ps(pair(0), pair(2)),
                                     _mm512_add_ps(pair(4), pair(6)));
      _mm512_mask_storeu_ps(acc + j, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, acc + j), s));
    };
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) group(j, 0xffff);
    if (j < n) group(j, Mask16(n - j));
  }
  for (; k < k1; ++k) {
    const T* r = w + k * ldw;
    const __m512 xk = _mm512_set1_ps(x[k]);
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 m = Mask16(n - j);
      const __m512 a = _mm512_maskz_loadu_ps(m, acc + j);
      _mm512_mask_storeu_ps(acc + j, m, _mm512_fmadd_ps(xk, Load16(r + j, m), a));
    }
  }
#else
  // Half rows are widened a slice of kSlice columns at a time.
  constexpr int64_t kSlice = 512;
  [[maybe_unused]] alignas(64) float widened[8][kSlice];
  for (; k + 8 <= k1; k += 8) {
    const T* r = w + k * ldw;
    const float x0 = x[k], x1 = x[k + 1], x2 = x[k + 2], x3 = x[k + 3];
    const float x4 = x[k + 4], x5 = x[k + 5], x6 = x[k + 6], x7 = x[k + 7];
    for (int64_t j0 = 0; j0 < n; j0 += kSlice) {
      const int64_t m = std::min(kSlice, n - j0);
      const float* f[8];
      for (int u = 0; u < 8; ++u) {
        if constexpr (std::is_same_v<T, float>) {
          f[u] = r + u * ldw + j0;
        } else {
          HalfToFloatRow(r + u * ldw + j0, widened[u], m);
          f[u] = widened[u];
        }
      }
      float* a = acc + j0;
#pragma omp simd
      for (int64_t j = 0; j < m; ++j)
        a[j] += ((x0 * f[0][j] + x1 * f[1][j]) + (x2 * f[2][j] + x3 * f[3][j])) +
                ((x4 * f[4][j] + x5 * f[5][j]) + (x6 * f[6][j] + x7 * f[7][j]));
    }
  }
  for (; k < k1; ++k) {
    const T* r = w + k * ldw;
    const float xk = x[k];
    for (int64_t j0 = 0; j0 < n; j0 += kSlice) {
      const int64_t m = std::min(kSlice, n - j0);
      const float* f;
      if constexpr (std::is_same_v<T, float>) {
        f = r + j0;
      } else {
        HalfToFloatRow(r + j0, widened[0], m);
        f = widened[0];
      }
      float* a = acc + j0;
#pragma omp simd
      for (int64_t j = 0; j < m; ++j) a[j] += xk * f[j];
    }
  }
#endif
}

// Under CPU contention (other processes on a small shared VM) a team thread that is not
// scheduled holds the end of the parallel region up by a whole time slice, several ms, longer
// than most products take on one thread. When a product on the team took longer than the
// calling thread alone would have, the next products run on the calling thread only: 8 of
// them, doubling up to 1024 while the team keeps losing, then the team is tried again.
class GemvTeamGovernor {
 public:
  bool TeamAllowed() {
    const int left = serial_left_.load(std::memory_order_relaxed);
    if (left <= 0) return true;
    serial_left_.store(left - 1, std::memory_order_relaxed);  // approximate under races: fine
    return false;
  }
  void Report(bool team_lost) {
    if (!team_lost) {
      backoff_.store(kMinBackoff, std::memory_order_relaxed);
      return;
    }
    const int b = backoff_.load(std::memory_order_relaxed);
    serial_left_.store(b, std::memory_order_relaxed);
    backoff_.store(std::min(2 * b, kMaxBackoff), std::memory_order_relaxed);
  }

 private:
  static constexpr int kMinBackoff = 8, kMaxBackoff = 1024;
  std::atomic<int> serial_left_{0};
  std::atomic<int> backoff_{kMinBackoff};
};
GemvTeamGovernor g_gemv_governor;

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

template <class T>
void GemvMany(const float* x, int64_t ldx, int64_t M, int64_t K, const GemvProduct<T>* ps, int count,
              bool accumulate) {
  if (M <= 0) return;
  if (K <= 0) {
    for (int p = 0; p < count; ++p)
      for (int64_t m = 0; m < M && !accumulate && ps[p].N > 0; ++m)
        std::memset(ps[p].y + m * ps[p].ldy, 0, sizeof(float) * ps[p].N);
    return;
  }
  const int64_t rows = GemvChunkRows(K), chunks = CeilDiv(K, rows);
  // Task t: product p (first_task[p] <= t < first_task[p + 1]), then chunk and piece within it.
  std::vector<int64_t> first_task(count + 1, 0), pieces(count), part_at(count + 1, 0);
  int64_t weights = 0, max_piece = 0;
  for (int p = 0; p < count; ++p) {
    pieces[p] = CeilDiv(std::max<int64_t>(ps[p].N, 0), kGemvPiece);
    first_task[p + 1] = first_task[p] + chunks * pieces[p];
    part_at[p + 1] = part_at[p] + chunks * M * std::max<int64_t>(ps[p].N, 0);
    weights += K * std::max<int64_t>(ps[p].N, 0);
    max_piece = std::max(max_piece, std::min(ps[p].N, kGemvPiece));
  }
  const int64_t tasks = first_task[count];
  if (tasks == 0) return;
  auto locate = [&](int64_t t, int* p, int64_t* c, int64_t* c0) {
    int q = 0;
    while (t >= first_task[q + 1]) ++q;
    const int64_t local = t - first_task[q];
    *p = q;
    *c = local / pieces[q];
    *c0 = (local % pieces[q]) * kGemvPiece;
  };
  auto run = [&](int64_t t, float* acc) {
    int p;
    int64_t c, c0;
    locate(t, &p, &c, &c0);
    const int64_t k0 = c * rows, k1 = std::min(K, c * rows + rows), n = std::min(kGemvPiece, ps[p].N - c0);
    if (M == 1)
      GemvPiece(x, ps[p].w + c0, ps[p].ldw, k0, k1, n, acc);
    else
      GemvPieceRows(x, ldx, M, ps[p].w + c0, ps[p].ldw, k0, k1, n, acc);
  };
  // y[m, c0:c0+n] = y (or 0 for the first chunk unless accumulating) + the chunk's partial sum;
  // acc holds the M rows of the piece, n apart.
  auto fold = [&](int64_t t, const float* acc) {
    int p;
    int64_t c, c0;
    locate(t, &p, &c, &c0);
    const int64_t n = std::min(kGemvPiece, ps[p].N - c0);
    for (int64_t m = 0; m < M; ++m) {
      float* __restrict yy = ps[p].y + m * ps[p].ldy + c0;
      const float* __restrict aa = acc + m * n;
      if (c == 0 && !accumulate) {
        std::memcpy(yy, aa, sizeof(float) * n);
      } else {
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) yy[j] += aa[j];
      }
    }
  };
  thread_local std::vector<float> scratch;
  int nt = omp_in_parallel() || weights * M < kGemvMinParallel ? 1 : omp_get_max_threads();
  nt = static_cast<int>(std::min<int64_t>(nt, tasks));
  if (nt > 1 && !g_gemv_governor.TeamAllowed()) nt = 1;
  if (nt == 1) {
    scratch.resize(std::max<size_t>(scratch.size(), M * max_piece));
    for (int64_t t = 0; t < tasks; ++t) {
      run(t, scratch.data());
      fold(t, scratch.data());
    }
    return;
  }
  // One partial block of M rows per product, chunk and piece (the piece's rows n apart).
  scratch.resize(std::max<size_t>(scratch.size(), part_at[count]));
  float* part = scratch.data();
  auto partial = [&](int64_t t) {
    int p;
    int64_t c, c0;
    locate(t, &p, &c, &c0);
    return part + part_at[p] + c * M * ps[p].N + M * c0;
  };
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  Clock::time_point master_end;
  int64_t master_tasks = 0;
#pragma omp parallel num_threads(nt)
  {
    int64_t mine = 0;
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t t = 0; t < tasks; ++t) {
      run(t, partial(t));
      ++mine;
    }
    if (omp_get_thread_num() == 0) {
      master_end = Clock::now();
      master_tasks = mine;
    }
  }
  // Alone, the calling thread would have taken about its own time scaled to all tasks.
  if (master_tasks > 0) {
    const double team = std::chrono::duration<double>(Clock::now() - start).count();
    const double alone = std::chrono::duration<double>(master_end - start).count() * tasks /
                         static_cast<double>(master_tasks);
    g_gemv_governor.Report(team > alone);
  }
  for (int64_t t = 0; t < tasks; ++t) fold(t, partial(t));
}

template <class T>
void Gemv(const float* x, const T* w, int64_t ldw, float* y, int64_t K, int64_t N, bool accumulate) {
  if (N <= 0) return;
  const GemvProduct<T> p{w, ldw, y, N, N};
  GemvMany(x, K, 1, K, &p, 1, accumulate);
}

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

}  // namespace

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
// Einsum: diagonals, sums and pairwise contractions reduced to batched GEMMs.

template <class T>
struct Labeled {
  std::vector<T> data;
  std::vector<int> labels;
  std::vector<int64_t> dims;
};

// dst (row-major over dims) = src[sum_i idx_i * strides_i].
template <class T>
void StridedCopy(const T* src, const std::vector<int64_t>& dims,
                 const std::vector<int64_t>& strides, T* dst) {
  int64_t n = NumElements(dims);
  if (n == 0) return;
  if (dims.empty()) {
    dst[0] = src[0];
    return;
  }
  size_t r = dims.size();
  int64_t inner = dims[r - 1], is = strides[r - 1];
  std::vector<int64_t> idx(r, 0);
  int64_t off = 0;
  for (int64_t o = 0; o < n; o += inner) {
    for (int64_t j = 0; j < inner; ++j) dst[o + j] = src[off + j * is];
    for (int64_t d = static_cast<int64_t>(r) - 2; d >= 0; --d) {
      if (++idx[d] < dims[d]) {
        off += strides[d];
        break;
      }
      off -= strides[d] * (dims[d] - 1);
      idx[d] = 0;
    }
  }
}

template <class T>
Labeled<T> Permute(const Labeled<T>& x, const std::vector<int>& order_labels) {
  std::vector<int64_t> st = Strides(x.dims);
  Labeled<T> y;
  y.labels = order_labels;
  std::vector<int64_t> ps;
  for (int l : order_labels) {
    size_t i = std::find(x.labels.begin(), x.labels.end(), l) - x.labels.begin();
    y.dims.push_back(x.dims[i]);
    ps.push_back(st[i]);
  }
  if (y.labels == x.labels) {
    y.data = x.data;
    return y;
  }
  y.data.resize(NumElements(y.dims));
  StridedCopy(x.data.data(), y.dims, ps, y.data.data());
  return y;
}

// Sums out the labels for which drop(label) is true.
template <class T, class Pred>
Labeled<T> SumOut(const Labeled<T>& x, Pred drop) {
  std::vector<int> keep, gone;
  for (int l : x.labels) (drop(l) ? gone : keep).push_back(l);
  if (gone.empty()) return x;
  std::vector<int> order = keep;
  order.insert(order.end(), gone.begin(), gone.end());
  Labeled<T> p = Permute(x, order);
  Labeled<T> y;
  y.labels = keep;
  int64_t inner = 1;
  for (size_t i = 0; i < p.dims.size(); ++i) {
    if (i < keep.size()) {
      y.dims.push_back(p.dims[i]);
    } else {
      inner *= p.dims[i];
    }
  }
  int64_t outer = NumElements(y.dims);
  y.data.assign(outer, T{});
  for (int64_t o = 0; o < outer; ++o) {
    T s{};
    const T* row = p.data.data() + o * inner;
    for (int64_t j = 0; j < inner; ++j) s += row[j];
    y.data[o] = s;
  }
  return y;
}

template <class T>
Labeled<T> Contract(const Labeled<T>& a0, const Labeled<T>& b0, const std::vector<int>& keep) {
  auto has = [](const std::vector<int>& v, int l) {
    return std::find(v.begin(), v.end(), l) != v.end();
  };
  Labeled<T> a = SumOut(a0, [&](int l) { return !has(keep, l) && !has(b0.labels, l); });
  Labeled<T> b = SumOut(b0, [&](int l) { return !has(keep, l) && !has(a.labels, l); });
  std::vector<int> bat, ms, ks, ns;
  for (int l : a.labels) {
    if (has(b.labels, l)) {
      (has(keep, l) ? bat : ks).push_back(l);
    } else {
      ms.push_back(l);
    }
  }
  for (int l : b.labels)
    if (!has(a.labels, l)) ns.push_back(l);
  auto dim_of = [](const Labeled<T>& x, int l) {
    return x.dims[std::find(x.labels.begin(), x.labels.end(), l) - x.labels.begin()];
  };
  int64_t nb = 1, M = 1, K = 1, N = 1;
  for (int l : bat) nb *= dim_of(a, l);
  for (int l : ms) M *= dim_of(a, l);
  for (int l : ks) K *= dim_of(a, l);
  for (int l : ns) N *= dim_of(b, l);
  std::vector<int> ao = bat, bo = bat;
  ao.insert(ao.end(), ms.begin(), ms.end());
  ao.insert(ao.end(), ks.begin(), ks.end());
  bo.insert(bo.end(), ks.begin(), ks.end());
  bo.insert(bo.end(), ns.begin(), ns.end());
  Labeled<T> ap = Permute(a, ao), bp = Permute(b, bo);
  Labeled<T> y;
  y.labels = bat;
  y.labels.insert(y.labels.end(), ms.begin(), ms.end());
  y.labels.insert(y.labels.end(), ns.begin(), ns.end());
  for (int l : bat) y.dims.push_back(dim_of(a, l));
  for (int l : ms) y.dims.push_back(dim_of(a, l));
  for (int l : ns) y.dims.push_back(dim_of(b, l));
  y.data.assign(nb * M * N, T{});
  if (nb * M * N > 0) {
    std::vector<int64_t> aoff(nb), boff(nb);
    for (int64_t i = 0; i < nb; ++i) {
      aoff[i] = i * M * K;
      boff[i] = i * K * N;
    }
    BatchedGemm<T>(nb, M, N, K, ap.data.data(), aoff, bp.data.data(), boff, y.data.data());
  }
  return y;
}

struct EinsumSpec {
  std::vector<std::vector<int>> in_labels;  // per operand, one label per dimension
  std::vector<int> out_labels;
};

constexpr int kEllipsisLabel = 256;  // ellipsis dims get labels 256 + j

EinsumSpec ParseEinsum(const std::string& eq_raw, const std::vector<const Tensor*>& ins,
                       const Node& node) {
  std::string eq;
  for (char ch : eq_raw)
    if (ch != ' ') eq += ch;
  EinsumSpec spec;
  size_t arrow = eq.find("->");
  std::string lhs = arrow == std::string::npos ? eq : eq.substr(0, arrow);
  std::vector<std::string> terms;
  size_t start = 0;
  while (true) {
    size_t c = lhs.find(',', start);
    terms.push_back(lhs.substr(start, c == std::string::npos ? std::string::npos : c - start));
    if (c == std::string::npos) break;
    start = c + 1;
  }
  GAF_CHECK(terms.size() == ins.size(), "{}: Einsum equation '{}' has {} operands but {} inputs",
            node.Describe(), eq_raw, terms.size(), ins.size());
  // Parse a term into letters and an ellipsis position.
  auto parse_term = [&](const std::string& t, int64_t rank, int64_t* ell_rank_out,
                        int64_t max_ell) {
    std::vector<int> labels;
    size_t e = t.find("...");
    std::string pre = e == std::string::npos ? t : t.substr(0, e);
    std::string post = e == std::string::npos ? "" : t.substr(e + 3);
    for (char ch : pre + post)
      GAF_CHECK(std::isalpha(static_cast<unsigned char>(ch)),
                "{}: invalid character '{}' in Einsum equation '{}'", node.Describe(), ch, eq_raw);
    int64_t nletters = static_cast<int64_t>(pre.size() + post.size());
    int64_t ell = 0;
    if (e != std::string::npos) {
      ell = rank >= 0 ? rank - nletters : max_ell;
      GAF_CHECK(ell >= 0, "{}: Einsum term '{}' does not match input rank {}", node.Describe(), t,
                rank);
    } else {
      GAF_CHECK(rank < 0 || rank == nletters, "{}: Einsum term '{}' does not match input rank {}",
                node.Describe(), t, rank);
    }
    for (char ch : pre) labels.push_back(static_cast<unsigned char>(ch));
    int64_t base = max_ell >= 0 ? max_ell - ell : 0;
    for (int64_t j = 0; j < ell; ++j) labels.push_back(kEllipsisLabel + static_cast<int>(base + j));
    for (char ch : post) labels.push_back(static_cast<unsigned char>(ch));
    if (ell_rank_out) *ell_rank_out = ell;
    return labels;
  };
  int64_t max_ell = 0;
  std::vector<int64_t> ells(terms.size());
  for (size_t i = 0; i < terms.size(); ++i) {
    parse_term(terms[i], ins[i]->rank(), &ells[i], 0);
    max_ell = std::max(max_ell, ells[i]);
  }
  for (size_t i = 0; i < terms.size(); ++i)
    spec.in_labels.push_back(parse_term(terms[i], ins[i]->rank(), nullptr, max_ell));
  if (arrow != std::string::npos) {
    std::string rhs = eq.substr(arrow + 2);
    spec.out_labels = parse_term(rhs, -1, nullptr, max_ell);
    std::vector<int> sorted = spec.out_labels;
    std::sort(sorted.begin(), sorted.end());
    GAF_CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(),
              "{}: Einsum output '{}' repeats a label", node.Describe(), rhs);
  } else {
    for (int64_t j = 0; j < max_ell; ++j) spec.out_labels.push_back(kEllipsisLabel + static_cast<int>(j));
    std::vector<int> count(kEllipsisLabel, 0);
    for (auto& ls : spec.in_labels)
      for (int l : ls)
        if (l < kEllipsisLabel) ++count[l];
    for (int l = 0; l < kEllipsisLabel; ++l)
      if (count[l] == 1) spec.out_labels.push_back(l);
  }
  return spec;
}

template <class T>
void RunEinsum(KernelContext& ctx, const EinsumSpec& spec) {
  const Node& node = ctx.node;
  size_t nin = ctx.num_inputs();
  // Global size of each label (size-1 dims broadcast).
  std::vector<int64_t> size(kEllipsisLabel * 2, -1);
  for (size_t i = 0; i < nin; ++i) {
    const Tensor& t = *ctx.inputs[i];
    for (size_t d = 0; d < spec.in_labels[i].size(); ++d) {
      int l = spec.in_labels[i][d];
      int64_t v = t.dim(static_cast<int64_t>(d));
      if (size[l] < 0 || size[l] == 1) {
        size[l] = v;
      } else {
        GAF_CHECK(v == size[l] || v == 1, "{}: Einsum dimension sizes {} and {} conflict",
                  node.Describe(), size[l], v);
      }
    }
  }
  for (int l : spec.out_labels)
    GAF_CHECK(size[l] >= 0, "{}: Einsum output label does not appear in any input",
              node.Describe());
  std::vector<Labeled<T>> ops;
  for (size_t i = 0; i < nin; ++i) {
    const Tensor& t = *ctx.inputs[i];
    std::vector<int64_t> st = Strides(t.shape());
    // Unique labels (diagonal for repeats), broadcast size-1 dims to the global size.
    Labeled<T> x;
    std::vector<int64_t> xs;
    const auto& ls = spec.in_labels[i];
    for (size_t d = 0; d < ls.size(); ++d) {
      auto it = std::find(x.labels.begin(), x.labels.end(), ls[d]);
      int64_t dimv = t.dim(static_cast<int64_t>(d));
      if (it == x.labels.end()) {
        x.labels.push_back(ls[d]);
        x.dims.push_back(size[ls[d]]);
        xs.push_back(dimv == 1 && size[ls[d]] != 1 ? 0 : st[d]);
      } else {
        size_t j = it - x.labels.begin();
        GAF_CHECK(dimv == x.dims[j], "{}: Einsum diagonal dimensions differ", node.Describe());
        xs[j] += st[d];
      }
    }
    x.data.resize(NumElements(x.dims));
    StridedCopy(t.data<T>(), x.dims, xs, x.data.data());
    ops.push_back(std::move(x));
  }
  auto has = [](const std::vector<int>& v, int l) {
    return std::find(v.begin(), v.end(), l) != v.end();
  };
  // Labels needed after operand i: output labels and those of later operands.
  auto needed_after = [&](size_t i) {
    std::vector<int> keep = spec.out_labels;
    for (size_t j = i + 1; j < ops.size(); ++j)
      for (int l : ops[j].labels)
        if (!has(keep, l)) keep.push_back(l);
    return keep;
  };
  Labeled<T> acc = SumOut(ops[0], [&](int l) {
    std::vector<int> k = needed_after(0);
    return !has(k, l);
  });
  for (size_t i = 1; i < ops.size(); ++i) acc = Contract(acc, ops[i], needed_after(i));
  acc = SumOut(acc, [&](int l) { return !has(spec.out_labels, l); });
  Labeled<T> out = Permute(acc, spec.out_labels);
  Shape oshape;
  for (int l : spec.out_labels) oshape.push_back(size[l]);
  ctx.outputs[0] = Tensor(ctx.inputs[0]->dtype(), oshape);
  if (!out.data.empty()) std::memcpy(ctx.outputs[0].raw(), out.data.data(), sizeof(T) * out.data.size());
}

void EinsumKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  GAF_CHECK(ctx.num_inputs() >= 1, "{}: Einsum needs at least one input", node.Describe());
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    GAF_CHECK(ctx.has_input(i), "{}: Einsum input {} is missing", node.Describe(), i);
    GAF_CHECK(ctx.inputs[i]->dtype() == ctx.inputs[0]->dtype(), "{}: Einsum input types differ",
              node.Describe());
  }
  std::string eq = node.GetString("equation", "");
  GAF_CHECK(!eq.empty(), "{}: Einsum requires the 'equation' attribute", node.Describe());
  EinsumSpec spec = ParseEinsum(eq, ctx.inputs, node);
  DataType dt = ctx.inputs[0]->dtype();
  switch (dt) {
    case DataType::kFloat: return RunEinsum<float>(ctx, spec);
    case DataType::kDouble: return RunEinsum<double>(ctx, spec);
    case DataType::kInt32: return RunEinsum<int32_t>(ctx, spec);
    case DataType::kInt64: return RunEinsum<int64_t>(ctx, spec);
    case DataType::kUint32: return RunEinsum<uint32_t>(ctx, spec);
    case DataType::kUint64: return RunEinsum<uint64_t>(ctx, spec);
    default:
      GAF_UNSUPPORTED("{}: Einsum of type {} is not supported", node.Describe(), DataTypeName(dt));
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

std::vector<int64_t> SpatialAttr(const Node& node, const char* name, size_t nsp, int64_t def) {
  std::vector<int64_t> v = node.GetInts(name, {});
  if (v.empty()) v.assign(nsp, def);
  GAF_CHECK(v.size() == nsp, "{}: attribute '{}' has {} values, expected {}", node.Describe(),
            name, v.size(), nsp);
  return v;
}

// Output size of one spatial axis of a window (kernel k, stride s, dilation d) sliding over `in`
// with pads *pb, *pe (set here for SAME auto_pad). gaf::Error naming the node when the window does
// not fit in a non-empty padded input, or when the sizes overflow.
int64_t WindowOutputSize(const Node& node, size_t axis, int64_t in, int64_t k, int64_t s, int64_t d,
                         const std::string& auto_pad, bool ceil_mode, int64_t* pb, int64_t* pe) {
  const int64_t ek = CheckedAdd(CheckedMul(k - 1, d, "kernel extent"), 1, "kernel extent");
  if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
    const int64_t out = CeilDiv(in, s);
    const int64_t total = std::max<int64_t>(0, CheckedAdd((out - 1) * s, ek, "padded size") - in);
    *pb = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
    *pe = total - *pb;
    return out;
  }
  const int64_t padded = CheckedAdd(CheckedAdd(in, *pb, "padded size"), *pe, "padded size");
  if (in == 0 && padded == 0) return 0;  // an empty input gives an empty output
  GAF_CHECK(padded >= ek,
            "{}: kernel extent {} is larger than the padded input size {} along spatial axis {} (input {}, "
            "pads {}+{})",
            node.Describe(), ek, padded, axis, in, *pb, *pe);
  const int64_t span = padded - ek;
  if (!ceil_mode || auto_pad == "VALID") return span / s + 1;
  int64_t out = CeilDiv(span, s) + 1;
  if ((out - 1) * s >= in + *pb) --out;  // last window must start inside the input
  return out;
}

// Computes output size and pads from the conv/pool attributes (auto_pad, pads, strides,
// dilations, ceil_mode).
Geom MakeGeom(const Node& node, const Shape& x_shape, const std::vector<int64_t>& kernel,
              bool ceil_mode, bool allow_dilations = true) {
  size_t nsp = kernel.size();
  GAF_CHECK(x_shape.size() == nsp + 2, "{}: input of shape {} does not match a {}-D kernel",
            node.Describe(), ShapeToString(x_shape), nsp);
  if (nsp < 1 || nsp > 3)
    GAF_UNSUPPORTED("{}: {} spatial dimensions are not supported (1 to 3)", node.Describe(), nsp);
  std::vector<int64_t> strides = SpatialAttr(node, "strides", nsp, 1);
  std::vector<int64_t> dil = allow_dilations ? SpatialAttr(node, "dilations", nsp, 1)
                                             : std::vector<int64_t>(nsp, 1);
  std::vector<int64_t> pads = node.GetInts("pads", {});
  if (pads.empty()) pads.assign(2 * nsp, 0);
  GAF_CHECK(pads.size() == 2 * nsp, "{}: 'pads' has {} values, expected {}", node.Describe(),
            pads.size(), 2 * nsp);
  std::string auto_pad = node.GetString("auto_pad", "NOTSET");
  Geom g;
  g.nsp = static_cast<int>(nsp);
  size_t off = 3 - nsp;
  for (size_t i = 0; i < nsp; ++i) {
    int64_t in = x_shape[2 + i], k = kernel[i], s = strides[i], d = dil[i];
    GAF_CHECK(k >= 1 && s >= 1 && d >= 1,
              "{}: kernel, strides and dilations must be positive (got {}, {}, {})",
              node.Describe(), k, s, d);
    int64_t pb = 0, pe = 0;
    if (auto_pad == "NOTSET" || auto_pad.empty()) {
      pb = pads[i];
      pe = pads[i + nsp];
      GAF_CHECK(pb >= 0 && pe >= 0, "{}: negative pads are not allowed", node.Describe());
    } else {
      GAF_CHECK(auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER" || auto_pad == "VALID",
                "{}: invalid auto_pad '{}'", node.Describe(), auto_pad);
    }
    const int64_t out = WindowOutputSize(node, i, in, k, s, d, auto_pad, ceil_mode, &pb, &pe);
    g.in[off + i] = in;
    g.out[off + i] = out;
    g.k[off + i] = k;
    g.s[off + i] = s;
    g.d[off + i] = d;
    g.pb[off + i] = pb;
    g.pe[off + i] = pe;
  }
  return g;
}

Shape OutShape(int64_t n, int64_t c, const Geom& g) {
  Shape s{n, c};
  for (int i = 3 - g.nsp; i < 3; ++i) s.push_back(g.out[i]);
  return s;
}

// Rows [r0, r1) of the im2col matrix restricted to output rows [h0, h1) of the flattened
// (depth, height) output rows: col[r, (h - h0) * OW + ow] for r = c * kvol + kernel offset (zero
// where the window hits padding).
template <class T>
void Im2ColRows(const T* x, const Geom& g, T* col, int64_t h0, int64_t h1, int64_t r0, int64_t r1) {
  const int64_t kvol = g.k_size(), isz = g.in_size();
  const int64_t OH = g.out[1], OW = g.out[2], IH = g.in[1], IW = g.in[2];
  const int64_t tc = (h1 - h0) * OW;
  for (int64_t r = r0; r < r1; ++r) {
    int64_t c = r / kvol, kk = r % kvol;
    int64_t kd = kk / (g.k[1] * g.k[2]), kh = (kk / g.k[2]) % g.k[1], kw = kk % g.k[2];
    const T* xc = x + c * isz;
    T* dst = col + r * tc;
    int64_t offw = kw * g.d[2] - g.pb[2];
    int64_t lo, hi;
    KernelRange(offw, g.s[2], OW, IW, &lo, &hi);
    for (int64_t h = h0; h < h1; ++h, dst += OW) {
      int64_t od = h / OH, oh = h % OH;
      int64_t id = od * g.s[0] - g.pb[0] + kd * g.d[0];
      int64_t ih = oh * g.s[1] - g.pb[1] + kh * g.d[1];
      if (id < 0 || id >= g.in[0] || ih < 0 || ih >= IH) {
        std::fill(dst, dst + OW, T{});
        continue;
      }
      const T* src = xc + (id * IH + ih) * IW + offw;
      std::fill(dst, dst + lo, T{});
      if (g.s[2] == 1) {
        std::memcpy(dst + lo, src + lo, sizeof(T) * (hi - lo));
      } else {
        const int64_t sw = g.s[2];
        for (int64_t ow = lo; ow < hi; ++ow) dst[ow] = src[ow * sw];
      }
      std::fill(dst + hi, dst + OW, T{});
    }
  }
}

// col[C*kvol, out_size] from x[C, in...], rows split over the threads.
template <class T>
void Im2Col(const T* x, int64_t C, const Geom& g, T* col) {
  ParallelFor(C * g.k_size(), std::max<int64_t>(1, 32768 / std::max<int64_t>(g.out_size(), 1)),
              [&](int64_t r0, int64_t r1) { Im2ColRows<T>(x, g, col, 0, g.out[0] * g.out[1], r0, r1); });
}

// ------------------------------------------------------------------------------------------
// Conv.

template <class T>
void DepthwiseConv(const T* x, const T* w, const T* bias, T* y, int64_t N, int64_t C,
                   int64_t M, const Geom& g, const ConvEpilogue* epilogue = nullptr) {
  const int64_t mult = M / C, isz = g.in_size(), osz = g.out_size(), kvol = g.k_size();
  const int64_t OD = g.out[0], OH = g.out[1], OW = g.out[2], IH = g.in[1], IW = g.in[2];
  ParallelFor(N * M, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, osz * kvol)),
              [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      int64_t n = p / M, m = p % M, c = m / mult;
      const T* xc = x + (n * C + c) * isz;
      const T* wm = w + m * kvol;
      T* yp = y + p * osz;
      T b = bias ? bias[m] : T{};
      std::fill(yp, yp + osz, b);
      for (int64_t kd = 0; kd < g.k[0]; ++kd)
        for (int64_t kh = 0; kh < g.k[1]; ++kh)
          for (int64_t kw = 0; kw < g.k[2]; ++kw) {
            T wv = wm[(kd * g.k[1] + kh) * g.k[2] + kw];
            int64_t offw = kw * g.d[2] - g.pb[2];
            int64_t lo, hi;
            KernelRange(offw, g.s[2], OW, IW, &lo, &hi);
            for (int64_t od = 0; od < OD; ++od) {
              int64_t id = od * g.s[0] - g.pb[0] + kd * g.d[0];
              if (id < 0 || id >= g.in[0]) continue;
              for (int64_t oh = 0; oh < OH; ++oh) {
                int64_t ih = oh * g.s[1] - g.pb[1] + kh * g.d[1];
                if (ih < 0 || ih >= IH) continue;
                const T* src = xc + (id * IH + ih) * IW + offw;
                T* dst = yp + (od * OH + oh) * OW;
                if (g.s[2] == 1) {
#pragma omp simd
                  for (int64_t ow = lo; ow < hi; ++ow) dst[ow] += wv * src[ow];
                } else {
                  const int64_t sw = g.s[2];
                  for (int64_t ow = lo; ow < hi; ++ow) dst[ow] += wv * src[ow * sw];
                }
              }
            }
          }
      // The plane is still in L1: the fused epilogue reads it there.
      if (epilogue != nullptr && *epilogue) (*epilogue)(p, p + 1, 0, osz);
    }
  });
}

// Depthwise 2-D (or 1-D) float convolution, one channel plane at a time: the plane is copied
// into a zero-bordered scratch plane (no bounds tests in the inner loops), then each output row
// accumulates its kernel taps while it is in L1. (The generic loop above sweeps the whole output
// plane once per kernel tap, with a bounds computation per tap and row.)
void DepthwiseConv2DF32(const float* x, const float* w, const float* bias, float* y, int64_t N,
                        int64_t C, int64_t M, const Geom& g, const ConvEpilogue* epilogue) {
  const int64_t mult = M / C, isz = g.in_size(), osz = g.out_size();
  const int64_t KH = g.k[1], KW = g.k[2], SH = g.s[1], SW = g.s[2], DH = g.d[1], DW = g.d[2];
  const int64_t IH = g.in[1], IW = g.in[2], OH = g.out[1], OW = g.out[2];
  // The scratch plane covers every input position a window reads, padding included.
  const int64_t PH = std::max<int64_t>(IH + g.pb[1], (OH - 1) * SH + (KH - 1) * DH + 1);
  const int64_t PW = std::max<int64_t>(IW + g.pb[2], (OW - 1) * SW + (KW - 1) * DW + 1);
  ParallelFor(N * M, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, osz * KH * KW)),
              [&](int64_t p0, int64_t p1) {
    // Slack after the last row: the stride-1 pass reads up to (KW - 1) * DW past a row's end.
    std::vector<float> pad(static_cast<size_t>(PH * PW + PW + KW * DW)), acc(static_cast<size_t>(OH * PW));
    int64_t loaded = -1;
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t n = p / M, m = p % M, c = m / mult;
      if (n * C + c != loaded) {
        std::fill(pad.begin(), pad.end(), 0.f);
        const float* xc = x + (n * C + c) * isz;
        for (int64_t ih = 0; ih < IH; ++ih)
          std::memcpy(pad.data() + (ih + g.pb[1]) * PW + g.pb[2], xc + ih * IW, sizeof(float) * IW);
        loaded = n * C + c;
      }
      const float* wm = w + m * KH * KW;
      const float b = bias ? bias[m] : 0.f;
      float* yp = y + p * osz;
      if (SH == 1 && SW == 1) {
        // Stride 1: every tap is one contiguous pass over the output laid out with the scratch
        // plane's row pitch (the PW - OW extra columns per row are computed and dropped), so
        // small planes (7x7, 14x14) cost a few long vector loops instead of many short ones.
        const int64_t Q = OH * PW;
        std::fill(acc.begin(), acc.begin() + Q, b);
        for (int64_t kh = 0; kh < KH; ++kh)
          for (int64_t kw = 0; kw < KW; ++kw) {
            const float wv = wm[kh * KW + kw];
            const float* src = pad.data() + kh * DH * PW + kw * DW;
            float* a = acc.data();
#pragma omp simd
            for (int64_t q = 0; q < Q; ++q) a[q] += wv * src[q];
          }
        for (int64_t oh = 0; oh < OH; ++oh) std::memcpy(yp + oh * OW, acc.data() + oh * PW, sizeof(float) * OW);
      } else {
        for (int64_t oh = 0; oh < OH; ++oh) {
          const float* base = pad.data() + oh * SH * PW;
          float* dst = yp + oh * OW;
          std::fill(dst, dst + OW, b);
          for (int64_t kh = 0; kh < KH; ++kh)
            for (int64_t kw = 0; kw < KW; ++kw) {
              const float wv = wm[kh * KW + kw];
              const float* src = base + kh * DH * PW + kw * DW;
              for (int64_t ow = 0; ow < OW; ++ow) dst[ow] += wv * src[ow * SW];
            }
        }
      }
      // The plane is still in L1: the fused epilogue reads it there.
      if (epilogue != nullptr && *epilogue) (*epilogue)(p, p + 1, 0, osz);
    }
  });
}

// Validates Conv attributes against the input and weight shapes and returns the geometry.
Geom ConvGeom(const Node& node, const Shape& xs, const Shape& ws, int64_t* group_out) {
  GAF_CHECK(xs.size() >= 3 && ws.size() == xs.size(),
            "{}: Conv input {} and weight {} ranks are invalid", node.Describe(),
            ShapeToString(xs), ShapeToString(ws));
  int64_t group = node.GetInt("group", 1);
  int64_t C = xs[1], M = ws[0];
  GAF_CHECK(group >= 1 && C % group == 0 && M % group == 0 && ws[1] == C / group,
            "{}: Conv channels do not match: input {}, weight {}, group {}", node.Describe(),
            ShapeToString(xs), ShapeToString(ws), group);
  std::vector<int64_t> kernel(ws.begin() + 2, ws.end());
  std::vector<int64_t> ks = node.GetInts("kernel_shape", {});
  GAF_CHECK(ks.empty() || ks == kernel, "{}: kernel_shape does not match weight shape {}",
            node.Describe(), ShapeToString(ws));
  *group_out = group;
  return MakeGeom(node, xs, kernel, false);
}

// y[N, M, out...] = conv(x, w) + bias; y must be zero-initialized and sized by ConvGeom.
template <class T>
void ConvCore(const Geom& g, int64_t group, int64_t N, int64_t C, int64_t M, const T* x,
              const T* w, const T* bias, T* y) {
  const int64_t isz = g.in_size(), osz = g.out_size(), kvol = g.k_size();
  const int64_t Cg = C / group, Mg = M / group;
  if (group == C && Cg == 1 && group > 1) {
    DepthwiseConv<T>(x, w, bias, y, N, C, M, g);
    return;
  }
  bool pointwise = kvol == 1 && g.s == std::array<int64_t, 3>{1, 1, 1} &&
                   g.pb == std::array<int64_t, 3>{0, 0, 0} && g.pe == g.pb;
  std::vector<T> col;
  if (!pointwise) col.resize(static_cast<size_t>(Cg * kvol * osz));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t gi = 0; gi < group; ++gi) {
      const T* xg = x + (n * C + gi * Cg) * isz;
      const T* src = xg;
      if (!pointwise) {
        Im2Col<T>(xg, Cg, g, col.data());
        src = col.data();
      }
      T* yg = y + (n * M + gi * Mg) * osz;
      Gemm<T>(false, false, Mg, osz, Cg * kvol, 1.f, w + gi * Mg * Cg * kvol, Cg * kvol, src, osz,
              0.f, yg, osz);
    }
    if (bias) {
      T* yn = y + n * M * osz;
      ParallelFor(M, std::max<int64_t>(1, 32768 / osz), [&](int64_t m0, int64_t m1) {
        for (int64_t m = m0; m < m1; ++m) {
          T b = bias[m];
          T* p = yn + m * osz;
#pragma omp simd
          for (int64_t i = 0; i < osz; ++i) p[i] += b;
        }
      });
    }
  }
}

// Tiled float32 convolution (see ops/conv.h). Per image and group the output rows are cut into
// tiles whose im2col columns take about kTileBytes; each tile is one GEMM from a per-thread
// column buffer that stays in L2, then bias and the epilogue run on the tile while it is hot.
// With enough tiles they run in parallel (one single-threaded GEMM each); with few (deep layers
// on small images) they run in turn and each GEMM uses the threads.
void ConvTiledF32(const Geom& g, int64_t group, int64_t N, int64_t C, int64_t M, const float* x,
                  const float* w, const float* bias, float* y, const ConvEpilogue* epilogue) {
  // Column buffer per tile, and the fewest columns per GEMM (each GEMM packs the weights again).
  constexpr int64_t kTileBytes = 160 * 1024, kMinCols = 128;
  const int64_t isz = g.in_size(), osz = g.out_size(), kvol = g.k_size();
  const int64_t Cg = C / group, Mg = M / group, K = Cg * kvol;
  const int64_t OW = g.out[2], rows = g.out[0] * g.out[1];
  const bool pointwise = kvol == 1 && g.s == std::array<int64_t, 3>{1, 1, 1} &&
                         g.pb == std::array<int64_t, 3>{0, 0, 0} && g.pe == g.pb;
  int64_t per = std::max<int64_t>(1, kTileBytes / (4 * std::max<int64_t>(1, K * OW)));
  per = std::max(per, (kMinCols + OW - 1) / OW);
  per = std::min(per, rows);
  const int64_t tiles = (rows + per - 1) / per;
  const int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
  const bool parallel_tiles = nt > 1 && N * group * tiles >= 2 * nt;
  auto add_bias_and_epilogue = [&](int64_t n, int64_t gi, int64_t m0, int64_t m1, int64_t c0, int64_t c1) {
    float* yt = y + (n * M + gi * Mg) * osz;
    if (bias != nullptr)
      for (int64_t m = m0; m < m1; ++m) {
        const float b = bias[gi * Mg + m];
        float* p = yt + m * osz;
#pragma omp simd
        for (int64_t i = c0; i < c1; ++i) p[i] += b;
      }
    if (epilogue != nullptr && *epilogue) {
      const int64_t r0 = n * M + gi * Mg;
      (*epilogue)(r0 + m0, r0 + m1, c0, c1);
    }
  };
  if (nt == 1 || parallel_tiles) {
    auto run_tile = [&](int64_t n, int64_t gi, int64_t t) {
      const int64_t h0 = t * per, h1 = std::min(rows, h0 + per);
      const int64_t c0 = h0 * OW, c1 = h1 * OW, tc = c1 - c0;
      const float* xg = x + (n * C + gi * Cg) * isz;
      const float* src = xg + c0;
      int64_t ldb = osz;
      thread_local std::vector<float> col;
      if (!pointwise) {
        if (col.size() < static_cast<size_t>(K * tc)) col.resize(static_cast<size_t>(K * tc));
        Im2ColRows<float>(xg, g, col.data(), h0, h1, 0, K);
        src = col.data();
        ldb = tc;
      }
      Sgemm(false, false, Mg, tc, K, 1.f, w + gi * Mg * K, K, src, ldb, 0.f,
            y + (n * M + gi * Mg) * osz + c0, osz);
      add_bias_and_epilogue(n, gi, 0, Mg, c0, c1);
    };
    const int64_t jobs = N * group * tiles;
    if (parallel_tiles) {
#pragma omp parallel for schedule(dynamic, 1)
      for (int64_t j = 0; j < jobs; ++j) run_tile(j / (group * tiles), (j / tiles) % group, j % tiles);
    } else {
      for (int64_t j = 0; j < jobs; ++j) run_tile(j / (group * tiles), (j / tiles) % group, j % tiles);
    }
    return;
  }
  // Few tiles for the threads: the whole image's columns, one GEMM that uses the threads, then
  // bias and epilogue split over the threads by output channel.
  std::vector<float> col;
  if (!pointwise) col.resize(static_cast<size_t>(K * osz));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t gi = 0; gi < group; ++gi) {
      const float* xg = x + (n * C + gi * Cg) * isz;
      const float* src = xg;
      if (!pointwise) {
        Im2Col<float>(xg, Cg, g, col.data());
        src = col.data();
      }
      Sgemm(false, false, Mg, osz, K, 1.f, w + gi * Mg * K, K, src, osz, 0.f, y + (n * M + gi * Mg) * osz, osz);
      ParallelFor(Mg, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, osz)),
                  [&](int64_t m0, int64_t m1) { add_bias_and_epilogue(n, gi, m0, m1, 0, osz); });
    }
}

template <class T>
void RunConv(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& X = ctx.input(0);
  const Tensor& W = ctx.input(1);
  const Tensor* B = ctx.has_input(2) ? ctx.inputs[2] : nullptr;
  GAF_CHECK(W.dtype() == X.dtype(), "{}: Conv weight type differs from input", node.Describe());
  int64_t group = 1;
  Geom g = ConvGeom(node, X.shape(), W.shape(), &group);
  int64_t N = X.dim(0), C = X.dim(1), M = W.dim(0);
  if (B) {
    GAF_CHECK(B->numel() == M && B->dtype() == X.dtype(), "{}: Conv bias must have {} elements",
              node.Describe(), M);
  }
  if constexpr (std::is_same_v<T, float>) {
    ConvF32(node, X, W, B, &ctx.outputs[0], ConvEpilogue());
    return;
  }
  ctx.outputs[0] = Tensor(X.dtype(), OutShape(N, M, g));
  if (ctx.outputs[0].numel() == 0) return;
  ConvCore<T>(g, group, N, C, M, X.data<T>(), W.data<T>(), B ? B->data<T>() : nullptr,
              ctx.outputs[0].data<T>());
}

void ConvKernel(KernelContext& ctx) {
  DataType dt = ctx.input(0).dtype();
  if (dt == DataType::kFloat) return RunConv<float>(ctx);
  if (dt == DataType::kDouble) return RunConv<double>(ctx);
  GAF_UNSUPPORTED("{}: Conv of type {} is not supported", ctx.node.Describe(), DataTypeName(dt));
}

// ------------------------------------------------------------------------------------------
// Quantized convolutions and products: ConvInteger, QLinearConv, QLinearMatMul.

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

// int32 convolution of zero-point-shifted x and w; output shape in *out_shape.
std::vector<int32_t> IntegerConv(const Node& node, const Tensor& X, const Tensor* xzp,
                                 const Tensor& W, const Tensor* wzp, const int32_t* bias,
                                 Shape* out_shape) {
  int64_t group = 1;
  Geom g = ConvGeom(node, X.shape(), W.shape(), &group);
  int64_t N = X.dim(0), C = X.dim(1), M = W.dim(0);
  if (xzp)
    GAF_CHECK(xzp->numel() == 1, "{}: input zero point must be a scalar", node.Describe());
  std::vector<int32_t> x = Dequantized(X, xzp, 1, 1, node, "x");
  std::vector<int32_t> w = Dequantized(W, wzp, M, M > 0 ? W.numel() / M : 1, node, "w");
  *out_shape = OutShape(N, M, g);
  std::vector<int32_t> y(static_cast<size_t>(NumElements(*out_shape)), 0);
  if (!y.empty()) ConvCore<int32_t>(g, group, N, C, M, x.data(), w.data(), bias, y.data());
  return y;
}

void ConvIntegerKernel(KernelContext& ctx) {
  Shape os;
  std::vector<int32_t> y =
      IntegerConv(ctx.node, ctx.input(0), ctx.has_input(2) ? ctx.inputs[2] : nullptr,
                  ctx.input(1), ctx.has_input(3) ? ctx.inputs[3] : nullptr, nullptr, &os);
  ctx.outputs[0] = Tensor(DataType::kInt32, os);
  if (!y.empty()) std::memcpy(ctx.outputs[0].raw(), y.data(), sizeof(int32_t) * y.size());
}

void QLinearConvKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& X = ctx.input(0);
  const Tensor& W = ctx.input(3);
  int64_t M = W.rank() > 0 ? W.dim(0) : 0;
  const int32_t* bias = nullptr;
  if (ctx.has_input(8)) {
    const Tensor& B = *ctx.inputs[8];
    GAF_CHECK(B.dtype() == DataType::kInt32 && B.numel() == M,
              "{}: bias must be int32 with {} elements", node.Describe(), M);
    bias = B.data<int32_t>();
  }
  Shape os;
  std::vector<int32_t> acc = IntegerConv(node, X, &ctx.input(2), W, &ctx.input(5), bias, &os);
  float xs = Scales(ctx.input(1), 1, node, "x_scale")[0];
  float ys = Scales(ctx.input(6), 1, node, "y_scale")[0];
  std::vector<float> scale = Scales(ctx.input(4), M, node, "w_scale");
  for (auto& v : scale) v = v * xs / ys;
  const Tensor& yzp = ctx.input(7);
  ctx.outputs[0] = Tensor(yzp.dtype(), os);
  int64_t inner = os.size() > 2 ? NumElements(Shape(os.begin() + 2, os.end())) : 1;
  Requantize(acc, scale, M, inner, &yzp, ctx.outputs[0], node);
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

// ------------------------------------------------------------------------------------------
// ConvTranspose: col = W^T * X per group, then col2im scatter-add into Y.

template <class T>
void RunConvTranspose(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& X = ctx.input(0);
  const Tensor& W = ctx.input(1);
  const Tensor* B = ctx.has_input(2) ? ctx.inputs[2] : nullptr;
  GAF_CHECK(X.rank() >= 3 && W.rank() == X.rank(),
            "{}: ConvTranspose input {} and weight {} ranks are invalid", node.Describe(),
            ShapeToString(X.shape()), ShapeToString(W.shape()));
  GAF_CHECK(W.dtype() == X.dtype(), "{}: weight type differs from input", node.Describe());
  size_t nsp = static_cast<size_t>(X.rank() - 2);
  if (nsp > 3)
    GAF_UNSUPPORTED("{}: {} spatial dimensions are not supported (1 to 3)", node.Describe(), nsp);
  int64_t group = node.GetInt("group", 1);
  int64_t N = X.dim(0), C = X.dim(1);
  GAF_CHECK(group >= 1 && C % group == 0 && W.dim(0) == C,
            "{}: ConvTranspose channels do not match: input {}, weight {}, group {}",
            node.Describe(), ShapeToString(X.shape()), ShapeToString(W.shape()), group);
  int64_t Mg = W.dim(1), M = Mg * group, Cg = C / group;
  std::vector<int64_t> kernel(W.shape().begin() + 2, W.shape().end());
  std::vector<int64_t> ks = node.GetInts("kernel_shape", {});
  GAF_CHECK(ks.empty() || ks == kernel, "{}: kernel_shape does not match weight shape {}",
            node.Describe(), ShapeToString(W.shape()));
  std::vector<int64_t> strides = SpatialAttr(node, "strides", nsp, 1);
  std::vector<int64_t> dil = SpatialAttr(node, "dilations", nsp, 1);
  std::vector<int64_t> opad = SpatialAttr(node, "output_padding", nsp, 0);
  std::vector<int64_t> pads = node.GetInts("pads", {});
  std::vector<int64_t> oshape = node.GetInts("output_shape", {});
  std::string auto_pad = node.GetString("auto_pad", "NOTSET");
  if (!oshape.empty()) {
    GAF_CHECK(oshape.size() >= nsp, "{}: output_shape has too few values", node.Describe());
    oshape.erase(oshape.begin(), oshape.end() - nsp);
  }
  bool have_pads = !pads.empty();
  if (pads.empty()) pads.assign(2 * nsp, 0);
  GAF_CHECK(pads.size() == 2 * nsp, "{}: 'pads' has {} values, expected {}", node.Describe(),
            pads.size(), 2 * nsp);
  Geom g;  // here "in" is X's spatial size and "out" is Y's
  g.nsp = static_cast<int>(nsp);
  size_t off = 3 - nsp;
  for (size_t i = 0; i < nsp; ++i) {
    int64_t in = X.dim(2 + i), k = kernel[i], s = strides[i], d = dil[i];
    GAF_CHECK(s >= 1 && d >= 1, "{}: strides and dilations must be positive", node.Describe());
    int64_t ek = CheckedAdd(CheckedMul(k - 1, d, "kernel extent"), 1, "kernel extent");
    int64_t full = CheckedAdd(CheckedAdd(CheckedMul(s, in - 1, "output size"), opad[i], "output size"), ek,
                              "output size");
    int64_t pb, pe, out;
    bool same = auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER";
    if (!oshape.empty() || (same && !have_pads)) {
      out = !oshape.empty() ? oshape[i] : CheckedMul(in, s, "output size");
      int64_t total = 0;
      GAF_CHECK(out >= 0 && !__builtin_sub_overflow(full, out, &total), "{}: invalid output size {}",
                node.Describe(), out);
      if (auto_pad == "SAME_UPPER") {
        pb = FloorDiv(total, 2);
        pe = total - pb;
      } else {
        pe = FloorDiv(total, 2);
        pb = total - pe;
      }
    } else {
      if (auto_pad == "VALID") {
        pb = pe = 0;
      } else {
        pb = pads[i];
        pe = pads[i + nsp];
      }
      GAF_CHECK(!__builtin_sub_overflow(full, CheckedAdd(pb, pe, "pads"), &out), "{}: output size overflows",
                node.Describe());
    }
    GAF_CHECK(out >= 0, "{}: ConvTranspose output size is negative", node.Describe());
    g.in[off + i] = in;
    g.out[off + i] = out;
    g.k[off + i] = k;
    g.s[off + i] = s;
    g.d[off + i] = d;
    g.pb[off + i] = pb;
    g.pe[off + i] = pe;
  }
  if (B) {
    GAF_CHECK(B->numel() == M && B->dtype() == X.dtype(),
              "{}: ConvTranspose bias must have {} elements", node.Describe(), M);
  }
  ctx.outputs[0] = Tensor(X.dtype(), OutShape(N, M, g));
  T* y = ctx.outputs[0].data<T>();
  if (ctx.outputs[0].numel() == 0) return;
  const T* x = X.data<T>();
  const T* w = W.data<T>();
  const int64_t isz = g.in_size(), osz = g.out_size(), kvol = g.k_size();
  const int64_t ID = g.in[0], IH = g.in[1], IW = g.in[2];
  const int64_t OH = g.out[1], OW = g.out[2];
  std::vector<T> col(static_cast<size_t>(Mg * kvol * isz));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t gi = 0; gi < group; ++gi) {
      // col[Mg*kvol, isz] = W_g^T [Mg*kvol, Cg] * X_g [Cg, isz]
      Gemm<T>(true, false, Mg * kvol, isz, Cg, 1.f, w + gi * Cg * Mg * kvol, Mg * kvol,
              x + (n * C + gi * Cg) * isz, isz, 0.f, col.data(), isz);
      T* yg = y + (n * M + gi * Mg) * osz;
      ParallelFor(Mg, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, kvol * isz)),
                  [&](int64_t m0, int64_t m1) {
        for (int64_t m = m0; m < m1; ++m) {
          T* ym = yg + m * osz;
          const T* cm = col.data() + m * kvol * isz;
          for (int64_t kd = 0; kd < g.k[0]; ++kd)
            for (int64_t kh = 0; kh < g.k[1]; ++kh)
              for (int64_t kw = 0; kw < g.k[2]; ++kw) {
                const T* crow = cm + ((kd * g.k[1] + kh) * g.k[2] + kw) * isz;
                int64_t offw = kw * g.d[2] - g.pb[2];
                int64_t lo, hi;
                KernelRange(offw, g.s[2], IW, OW, &lo, &hi);  // iw range with ow in [0, OW)
                for (int64_t id = 0; id < ID; ++id) {
                  int64_t od = id * g.s[0] - g.pb[0] + kd * g.d[0];
                  if (od < 0 || od >= g.out[0]) continue;
                  for (int64_t ih = 0; ih < IH; ++ih) {
                    int64_t oh = ih * g.s[1] - g.pb[1] + kh * g.d[1];
                    if (oh < 0 || oh >= OH) continue;
                    T* dst = ym + (od * OH + oh) * OW + offw;
                    const T* srow = crow + (id * IH + ih) * IW;
                    const int64_t sw = g.s[2];
                    for (int64_t iw = lo; iw < hi; ++iw) dst[iw * sw] += srow[iw];
                  }
                }
              }
          if (B) {
            T b = B->data<T>()[gi * Mg + m];
            for (int64_t i = 0; i < osz; ++i) ym[i] += b;
          }
        }
      });
    }
  }
}

void ConvTransposeKernel(KernelContext& ctx) {
  DataType dt = ctx.input(0).dtype();
  if (dt == DataType::kFloat) return RunConvTranspose<float>(ctx);
  if (dt == DataType::kDouble) return RunConvTranspose<double>(ctx);
  GAF_UNSUPPORTED("{}: ConvTranspose of type {} is not supported", ctx.node.Describe(),
                  DataTypeName(dt));
}

// ------------------------------------------------------------------------------------------
// Pooling.

std::vector<int64_t> PoolKernelShape(const Node& node, const Tensor& X) {
  std::vector<int64_t> k = node.GetInts("kernel_shape", {});
  GAF_CHECK(!k.empty(), "{}: 'kernel_shape' attribute is required", node.Describe());
  GAF_CHECK(X.rank() == static_cast<int64_t>(k.size()) + 2,
            "{}: input of shape {} does not match kernel_shape of {} dims", node.Describe(),
            ShapeToString(X.shape()), k.size());
  return k;
}

// Per output index o along one dim: the valid kernel range [lo, hi) inside the input and
// (for count_include_pad) inside the padded input.
struct DimRanges {
  std::vector<int64_t> base, lo, hi, plo, phi;
};
DimRanges MakeRanges(const Geom& g, int i) {
  DimRanges r;
  for (int64_t o = 0; o < g.out[i]; ++o) {
    int64_t b = o * g.s[i] - g.pb[i], lo, hi, plo, phi;
    KernelRange(b, g.d[i], g.k[i], g.in[i], &lo, &hi);
    KernelRange(b + g.pb[i], g.d[i], g.k[i], g.in[i] + g.pb[i] + g.pe[i], &plo, &phi);
    r.base.push_back(b);
    r.lo.push_back(lo);
    r.hi.push_back(hi);
    r.plo.push_back(plo);
    r.phi.push_back(phi);
  }
  return r;
}

// MaxPool values (no indices) of a float 2-D/1-D pooling whose windows each hold at least one
// input element: each channel plane is copied into a -inf-bordered scratch plane, then every
// output row takes the max over the kernel taps in vector passes with no bounds tests. (The
// generic loop below computes one output element at a time with per-element window bounds.)
void MaxPool2DF32(const float* x, float* y, int64_t planes, const Geom& g) {
  const int64_t KH = g.k[1], KW = g.k[2], SH = g.s[1], SW = g.s[2], DH = g.d[1], DW = g.d[2];
  const int64_t IH = g.in[1], IW = g.in[2], OH = g.out[1], OW = g.out[2], isz = g.in_size(), osz = g.out_size();
  const int64_t PH = std::max<int64_t>(IH + g.pb[1], (OH - 1) * SH + (KH - 1) * DH + 1);
  const int64_t PW = std::max<int64_t>(IW + g.pb[2], (OW - 1) * SW + (KW - 1) * DW + 1);
  ParallelFor(planes, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, osz * KH * KW)), [&](int64_t p0, int64_t p1) {
    std::vector<float> pad(static_cast<size_t>(PH * PW));
    for (int64_t p = p0; p < p1; ++p) {
      std::fill(pad.begin(), pad.end(), -std::numeric_limits<float>::infinity());
      const float* xp = x + p * isz;
      for (int64_t ih = 0; ih < IH; ++ih)
        std::memcpy(pad.data() + (ih + g.pb[1]) * PW + g.pb[2], xp + ih * IW, sizeof(float) * IW);
      float* yp = y + p * osz;
      for (int64_t oh = 0; oh < OH; ++oh) {
        float* dst = yp + oh * OW;
        std::fill(dst, dst + OW, -std::numeric_limits<float>::infinity());
        for (int64_t kh = 0; kh < KH; ++kh)
          for (int64_t kw = 0; kw < KW; ++kw) {
            const float* src = pad.data() + (oh * SH + kh * DH) * PW + kw * DW;
            if (SW == 1) {
#pragma omp simd
              for (int64_t ow = 0; ow < OW; ++ow) dst[ow] = std::max(dst[ow], src[ow]);
            } else {
              for (int64_t ow = 0; ow < OW; ++ow) dst[ow] = std::max(dst[ow], src[ow * SW]);
            }
          }
      }
    }
  });
}

template <class T>
void RunMaxPool(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& X = ctx.input(0);
  std::vector<int64_t> kernel = PoolKernelShape(node, X);
  bool ceil_mode = node.GetInt("ceil_mode", 0) != 0;
  int64_t storage_order = node.GetInt("storage_order", 0);
  Geom g = MakeGeom(node, X.shape(), kernel, ceil_mode);
  int64_t N = X.dim(0), C = X.dim(1);
  bool want_idx = ctx.num_outputs() > 1 && ctx.has_output(1);
  if constexpr (std::is_same_v<T, float>) {
    // Every window holds an input element when the pads are smaller than the dilated kernel
    // (then no window lies entirely in padding, whose ONNX value would be 0 rather than -inf).
    bool inside = g.in[0] == 1 && g.k[0] == 1 && !want_idx;
    for (int i = 1; i < 3 && inside; ++i) inside = g.pb[i] < (g.k[i] - 1) * g.d[i] + 1 && g.pe[i] < (g.k[i] - 1) * g.d[i] + 1;
    // ceil_mode may add an output whose window starts in the end padding: MakeGeom keeps the last
    // window starting inside the input, so its taps include input elements.
    if (inside) {
      ctx.outputs[0] = Tensor::Uninitialized(DataType::kFloat, OutShape(N, C, g));
      if (ctx.outputs[0].numel() > 0) MaxPool2DF32(X.data<float>(), ctx.outputs[0].data<float>(), N * C, g);
      return;
    }
  }
  ctx.outputs[0] = Tensor(X.dtype(), OutShape(N, C, g));
  if (want_idx) ctx.outputs[1] = Tensor(DataType::kInt64, OutShape(N, C, g));
  const T* x = X.data<T>();
  T* y = ctx.outputs[0].data<T>();
  int64_t* yi = want_idx ? ctx.outputs[1].data<int64_t>() : nullptr;
  const int64_t isz = g.in_size(), osz = g.out_size();
  const int64_t ID = g.in[0], IH = g.in[1], IW = g.in[2];
  const int64_t OD = g.out[0], OH = g.out[1], OW = g.out[2];
  const DimRanges rd = MakeRanges(g, 0), rh = MakeRanges(g, 1), rw = MakeRanges(g, 2);
  ParallelFor(N * C, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, osz * g.k_size())),
              [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const T* xp = x + p * isz;
      T* yp = y + p * osz;
      for (int64_t od = 0; od < OD; ++od) {
        const int64_t bd = rd.base[od], dlo = rd.lo[od], dhi = rd.hi[od];
        for (int64_t oh = 0; oh < OH; ++oh) {
          const int64_t bh = rh.base[oh], hlo = rh.lo[oh], hhi = rh.hi[oh];
          for (int64_t ow = 0; ow < OW; ++ow) {
            const int64_t bw = rw.base[ow], wlo = rw.lo[ow], whi = rw.hi[ow];
            T best = std::numeric_limits<T>::lowest();
            int64_t arg = -1;
            if (!yi) {
              // Values only: branch-free max over the window.
              const int64_t dw = g.d[2];
              for (int64_t kd = dlo; kd < dhi; ++kd) {
                const int64_t id = bd + kd * g.d[0];
                for (int64_t kh = hlo; kh < hhi; ++kh) {
                  const T* row = xp + (id * IH + bh + kh * g.d[1]) * IW + bw;
                  for (int64_t kw = wlo; kw < whi; ++kw) best = std::max(best, row[kw * dw]);
                }
              }
              if (dhi > dlo && hhi > hlo && whi > wlo) arg = 0;
            } else {
            for (int64_t kd = dlo; kd < dhi; ++kd) {
              int64_t id = bd + kd * g.d[0];
              for (int64_t kh = hlo; kh < hhi; ++kh) {
                int64_t ih = bh + kh * g.d[1];
                const T* row = xp + (id * IH + ih) * IW;
                for (int64_t kw = wlo; kw < whi; ++kw) {
                  int64_t iw = bw + kw * g.d[2];
                  T v = row[iw];
                  if (v > best || arg < 0) {
                    best = v;
                    arg = (id * IH + ih) * IW + iw;
                  }
                }
              }
            }
            }
            int64_t o = (od * OH + oh) * OW + ow;
            if (arg < 0) best = T{};  // window entirely in padding
            yp[o] = best;
            if (yi) {
              int64_t idx = 0;
              if (arg >= 0) {
                if (storage_order == 0) {
                  idx = arg;
                } else {
                  int64_t iw = arg % IW, ih = (arg / IW) % IH, id = arg / (IW * IH);
                  // Column-major over the original spatial dims.
                  if (g.nsp == 3) {
                    idx = id + ih * ID + iw * ID * IH;
                  } else {
                    idx = ih + iw * IH;
                  }
                }
              }
              yi[p * osz + o] = p * isz + idx;
            }
          }
        }
      }
    }
  });
}

void MaxPoolKernel(KernelContext& ctx) {
  DataType dt = ctx.input(0).dtype();
  switch (dt) {
    case DataType::kFloat: return RunMaxPool<float>(ctx);
    case DataType::kDouble: return RunMaxPool<double>(ctx);
    case DataType::kInt8: return RunMaxPool<int8_t>(ctx);
    case DataType::kUint8: return RunMaxPool<uint8_t>(ctx);
    case DataType::kInt32: return RunMaxPool<int32_t>(ctx);
    case DataType::kInt64: return RunMaxPool<int64_t>(ctx);
    default:
      GAF_UNSUPPORTED("{}: MaxPool of type {} is not supported", ctx.node.Describe(),
                      DataTypeName(dt));
  }
}

// AveragePool (lp == 0) and LpPool (lp = p).
template <class T>
void RunAvgLpPool(KernelContext& ctx, bool is_lp) {
  const Node& node = ctx.node;
  const Tensor& X = ctx.input(0);
  std::vector<int64_t> kernel = PoolKernelShape(node, X);
  bool ceil_mode = node.GetInt("ceil_mode", 0) != 0;
  bool include_pad = node.GetInt("count_include_pad", 0) != 0;
  double p_norm = is_lp ? static_cast<double>(node.GetInt("p", 2)) : 0.0;
  Geom g = MakeGeom(node, X.shape(), kernel, ceil_mode);
  int64_t N = X.dim(0), C = X.dim(1);
  ctx.outputs[0] = Tensor(X.dtype(), OutShape(N, C, g));
  const T* x = X.data<T>();
  T* y = ctx.outputs[0].data<T>();
  const int64_t isz = g.in_size(), osz = g.out_size();
  const int64_t IH = g.in[1], IW = g.in[2];
  const int64_t OD = g.out[0], OH = g.out[1], OW = g.out[2];
  const DimRanges rd = MakeRanges(g, 0), rh = MakeRanges(g, 1), rw = MakeRanges(g, 2);
  ParallelFor(N * C, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, osz * g.k_size())),
              [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const T* xp = x + p * isz;
      T* yp = y + p * osz;
      for (int64_t od = 0; od < OD; ++od) {
        const int64_t bd = rd.base[od], dlo = rd.lo[od], dhi = rd.hi[od];
        const int64_t pdlo = rd.plo[od], pdhi = rd.phi[od];
        for (int64_t oh = 0; oh < OH; ++oh) {
          const int64_t bh = rh.base[oh], hlo = rh.lo[oh], hhi = rh.hi[oh];
          const int64_t phlo = rh.plo[oh], phhi = rh.phi[oh];
          for (int64_t ow = 0; ow < OW; ++ow) {
            const int64_t bw = rw.base[ow], wlo = rw.lo[ow], whi = rw.hi[ow];
            const int64_t pwlo = rw.plo[ow], pwhi = rw.phi[ow];
            double acc = 0;
            for (int64_t kd = dlo; kd < dhi; ++kd) {
              int64_t id = bd + kd * g.d[0];
              for (int64_t kh = hlo; kh < hhi; ++kh) {
                int64_t ih = bh + kh * g.d[1];
                const T* row = xp + (id * IH + ih) * IW + bw;
                if (!is_lp) {
                  for (int64_t kw = wlo; kw < whi; ++kw) acc += static_cast<double>(row[kw * g.d[2]]);
                } else if (p_norm == 2.0) {
                  for (int64_t kw = wlo; kw < whi; ++kw) {
                    double v = static_cast<double>(row[kw * g.d[2]]);
                    acc += v * v;
                  }
                } else {
                  for (int64_t kw = wlo; kw < whi; ++kw)
                    acc += std::pow(std::abs(static_cast<double>(row[kw * g.d[2]])), p_norm);
                }
              }
            }
            double r;
            if (is_lp) {
              r = p_norm == 2.0 ? std::sqrt(acc) : p_norm == 1.0 ? acc : std::pow(acc, 1.0 / p_norm);
            } else {
              int64_t cnt = include_pad ? (pdhi - pdlo) * (phhi - phlo) * (pwhi - pwlo)
                                        : (dhi - dlo) * (hhi - hlo) * (whi - wlo);
              r = cnt > 0 ? acc / static_cast<double>(cnt) : 0.0;
            }
            yp[(od * OH + oh) * OW + ow] = static_cast<T>(r);
          }
        }
      }
    }
  });
}

void AveragePoolKernel(KernelContext& ctx) {
  DataType dt = ctx.input(0).dtype();
  if (dt == DataType::kFloat) return RunAvgLpPool<float>(ctx, false);
  if (dt == DataType::kDouble) return RunAvgLpPool<double>(ctx, false);
  GAF_UNSUPPORTED("{}: AveragePool of type {} is not supported", ctx.node.Describe(),
                  DataTypeName(dt));
}

void LpPoolKernel(KernelContext& ctx) {
  DataType dt = ctx.input(0).dtype();
  if (dt == DataType::kFloat) return RunAvgLpPool<float>(ctx, true);
  if (dt == DataType::kDouble) return RunAvgLpPool<double>(ctx, true);
  GAF_UNSUPPORTED("{}: LpPool of type {} is not supported", ctx.node.Describe(), DataTypeName(dt));
}

enum class GlobalMode { kAvg, kMax, kLp };

template <class T>
void RunGlobalPool(KernelContext& ctx, GlobalMode mode) {
  const Node& node = ctx.node;
  const Tensor& X = ctx.input(0);
  GAF_CHECK(X.rank() >= 2, "{}: input must have rank >= 2 (got {})", node.Describe(),
            ShapeToString(X.shape()));
  int64_t N = X.dim(0), C = X.dim(1);
  int64_t sp = 1;
  Shape os{N, C};
  for (int64_t i = 2; i < X.rank(); ++i) {
    sp *= X.dim(i);
    os.push_back(1);
  }
  double p = mode == GlobalMode::kLp ? static_cast<double>(node.GetInt("p", 2)) : 0.0;
  ctx.outputs[0] = Tensor(X.dtype(), os);
  const T* x = X.data<T>();
  T* y = ctx.outputs[0].data<T>();
  ParallelFor(N * C, std::max<int64_t>(1, 32768 / std::max<int64_t>(1, sp)),
              [&](int64_t p0, int64_t p1) {
    for (int64_t c = p0; c < p1; ++c) {
      const T* xp = x + c * sp;
      if (mode == GlobalMode::kMax) {
        T m = sp > 0 ? xp[0] : T{};
        for (int64_t i = 1; i < sp; ++i) m = xp[i] > m ? xp[i] : m;
        y[c] = m;
      } else if (mode == GlobalMode::kAvg) {
        T s{};
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < sp; ++i) s += xp[i];
        y[c] = sp > 0 ? static_cast<T>(s / static_cast<T>(sp)) : T{};
      } else {
        double s = 0;
        if (p == 2.0) {
          for (int64_t i = 0; i < sp; ++i) s += static_cast<double>(xp[i]) * xp[i];
          y[c] = static_cast<T>(std::sqrt(s));
        } else {
          for (int64_t i = 0; i < sp; ++i) s += std::pow(std::abs(static_cast<double>(xp[i])), p);
          y[c] = static_cast<T>(std::pow(s, 1.0 / p));
        }
      }
    }
  });
}

template <GlobalMode kMode>
void GlobalPoolKernel(KernelContext& ctx) {
  DataType dt = ctx.input(0).dtype();
  switch (dt) {
    case DataType::kFloat: return RunGlobalPool<float>(ctx, kMode);
    case DataType::kDouble: return RunGlobalPool<double>(ctx, kMode);
    default:
      if (kMode == GlobalMode::kMax) {
        if (dt == DataType::kInt8) return RunGlobalPool<int8_t>(ctx, kMode);
        if (dt == DataType::kUint8) return RunGlobalPool<uint8_t>(ctx, kMode);
      }
      GAF_UNSUPPORTED("{}: type {} is not supported", ctx.node.Describe(), DataTypeName(dt));
  }
}

// MaxUnpool: scatters X into a zero tensor at the flat indices I (as produced by MaxPool).
void MaxUnpoolKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& X = ctx.input(0);
  const Tensor& I = ctx.input(1);
  GAF_CHECK(I.shape() == X.shape(), "{}: indices shape {} differs from input shape {}",
            node.Describe(), ShapeToString(I.shape()), ShapeToString(X.shape()));
  std::vector<int64_t> kernel = PoolKernelShape(node, X);
  size_t nsp = kernel.size();
  std::vector<int64_t> strides = SpatialAttr(node, "strides", nsp, 1);
  std::vector<int64_t> pads = node.GetInts("pads", {});
  if (pads.empty()) pads.assign(2 * nsp, 0);
  GAF_CHECK(pads.size() == 2 * nsp, "{}: 'pads' has {} values, expected {}", node.Describe(),
            pads.size(), 2 * nsp);
  // Indices address the default output shape; a given output_shape keeps coordinates and
  // pads (or crops) at the end of each spatial dim, as the ONNX reference does.
  Shape ds{X.dim(0), X.dim(1)};
  for (size_t i = 0; i < nsp; ++i) {
    GAF_CHECK(strides[i] >= 1 && kernel[i] >= 1 && pads[i] >= 0 && pads[i + nsp] >= 0,
              "{}: kernel and strides must be positive, pads not negative", node.Describe());
    const int64_t full =
        CheckedAdd(CheckedMul(X.dim(2 + i) - 1, strides[i], "output size"), kernel[i], "output size");
    ds.push_back(CheckedAdd(full, -CheckedAdd(pads[i], pads[i + nsp], "pads"), "output size"));
  }
  Shape os = ds;
  if (ctx.has_input(2)) {
    os = ctx.inputs[2]->ToInt64s();
    GAF_CHECK(os.size() == ds.size() && os[0] == X.dim(0) && os[1] == X.dim(1),
              "{}: output_shape {} does not match input {}", node.Describe(), ShapeToString(os),
              ShapeToString(X.shape()));
  }
  for (int64_t v : ds)
    GAF_CHECK(v >= 0, "{}: negative output size {}", node.Describe(), ShapeToString(ds));
  ctx.outputs[0] = Tensor(X.dtype(), os);
  std::vector<int64_t> idx = I.ToInt64s();
  int64_t total = NumElements(ds);
  std::vector<int64_t> dst = Strides(ds), ost = Strides(os);
  DispatchBySize(X.dtype(), node, [&](auto tag) {
    using U = decltype(tag);
    const U* x = static_cast<const U*>(X.raw());
    U* y = static_cast<U*>(ctx.outputs[0].raw());
    for (size_t i = 0; i < idx.size(); ++i) {
      GAF_CHECK(idx[i] >= 0 && idx[i] < total, "{}: index {} is outside the output of {} elements",
                node.Describe(), idx[i], total);
      int64_t rem = idx[i], o = 0;
      bool inside = true;
      for (size_t d = 0; d < ds.size(); ++d) {
        int64_t c = rem / dst[d];
        rem %= dst[d];
        if (c >= os[d]) inside = false;
        o += c * ost[d];
      }
      if (inside) y[o] = x[i];
    }
  });
}

}  // namespace

ConvGeometry ConvGeometryOf(const Node& node, const Shape& x, const Shape& w) {
  ConvGeometry c;
  Geom g = ConvGeom(node, x, w, &c.group);
  c.nsp = g.nsp;
  c.in = g.in;
  c.out = g.out;
  c.k = g.k;
  c.s = g.s;
  c.d = g.d;
  c.pb = g.pb;
  c.pe = g.pe;
  return c;
}

ConvGeometry PoolGeometryOf(const Node& node, const Shape& x, const std::vector<int64_t>& kernel) {
  Geom g = MakeGeom(node, x, kernel, node.GetInt("ceil_mode", 0) != 0);
  ConvGeometry c;
  c.nsp = g.nsp;
  c.in = g.in;
  c.out = g.out;
  c.k = g.k;
  c.s = g.s;
  c.d = g.d;
  c.pb = g.pb;
  c.pe = g.pe;
  return c;
}

Shape ConvOutputShape(const Node& node, const Shape& x, const Shape& w) {
  int64_t group = 1;
  Geom g = ConvGeom(node, x, w, &group);
  return OutShape(x[0], w[0], g);
}

void ConvF32(const Node& node, const Tensor& X, const Tensor& W, const Tensor* B, Tensor* Y,
             const ConvEpilogue& epilogue) {
  GAF_CHECK(X.dtype() == DataType::kFloat && W.dtype() == DataType::kFloat,
            "{}: ConvF32 needs float32 input and weight", node.Describe());
  int64_t group = 1;
  Geom g = ConvGeom(node, X.shape(), W.shape(), &group);
  const int64_t N = X.dim(0), C = X.dim(1), M = W.dim(0);
  if (B != nullptr)
    GAF_CHECK(B->numel() == M && B->dtype() == DataType::kFloat, "{}: Conv bias must have {} elements",
              node.Describe(), M);
  const Shape out = OutShape(N, M, g);
  if (Y->dtype() != DataType::kFloat || Y->shape() != out) *Y = Tensor::Uninitialized(DataType::kFloat, out);
  if (Y->numel() == 0) return;
  const float* bias = B != nullptr ? B->data<float>() : nullptr;
  if (group == C && group > 1 && M % C == 0 && W.dim(1) == 1) {
    if (g.k[0] == 1 && g.in[0] == 1)
      DepthwiseConv2DF32(X.data<float>(), W.data<float>(), bias, Y->data<float>(), N, C, M, g, &epilogue);
    else
      DepthwiseConv<float>(X.data<float>(), W.data<float>(), bias, Y->data<float>(), N, C, M, g,
                           &epilogue);
    return;
  }
  ConvTiledF32(g, group, N, C, M, X.data<float>(), W.data<float>(), bias, Y->data<float>(),
               &epilogue);
}

void SgemmF32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  Sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void GemvF32(const float* x, const float* w, int64_t ldw, float* y, int64_t K, int64_t N,
             bool accumulate) {
  Gemv(x, w, ldw, y, K, N, accumulate);
}

void GemvF32ManyRows(const float* x, int64_t M, int64_t K, const GemvOutput* outs, int count) {
  std::vector<GemvProduct<float>> ps;
  for (int i = 0; i < count; ++i) ps.push_back({outs[i].w, outs[i].ldw, outs[i].y, outs[i].N, outs[i].N});
  GemvMany(x, K, M, K, ps.data(), count, false);
}

void GemvF32Many(const float* x, int64_t K, const GemvOutput* outs, int count) {
  GemvF32ManyRows(x, 1, K, outs, count);
}

void GemvF16(const float* x, const uint16_t* w_half, int64_t ldw, float* y, int64_t K, int64_t N,
             bool accumulate) {
  Gemv(x, w_half, ldw, y, K, N, accumulate);
}

void ConvertToHalf(const float* src, uint16_t* dst, int64_t n) {
  ParallelFor(n, int64_t{1} << 16, [&](int64_t b, int64_t e) {
    int64_t i = b;
#if GAF_AVX512
    for (; i < e; i += 16) {
      const __mmask16 m = Mask16(e - i);
      const __m512 f = _mm512_maskz_loadu_ps(m, src + i);
      _mm256_mask_storeu_epi16(
          dst + i, m, _mm512_maskz_cvtps_ph(m, f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
#elif defined(__F16C__) && defined(__AVX__)
    for (; i + 8 <= e; i += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                       _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < e; ++i) dst[i] = FloatToHalf(src[i]);
  });
}

void MatMulF16Weight(const float* A, const uint16_t* B_half, float* C, int64_t M, int64_t K,
                     int64_t N) {
  if (M <= 0 || N <= 0) return;
  if (M <= 4) {  // decode-sized: stream the weight once per row
    for (int64_t m = 0; m < M; ++m) GemvF16(A + m * K, B_half, N, C + m * N, K, N, false);
    return;
  }
  if (K <= 0) {
    std::memset(C, 0, sizeof(float) * M * N);
    return;
  }
  // Column slabs of B are widened to float into a buffer kept by the calling thread (fresh pages
  // would fault on every call) and multiplied by oneDNN, which threads each product itself.
  // Not from inside a team of ours: oneDNN then runs single-threaded per call, and tiles taken
  // that way were measured 3-4x slower at 2 threads than at 1.
  constexpr int64_t kSlabFloats = int64_t{1} << 20;  // 4 MB
  const int64_t width = std::min(N, std::max<int64_t>(64, kSlabFloats / K / 64 * 64));
  thread_local std::vector<float> slab;
  slab.resize(std::max<size_t>(slab.size(), K * width));
  float* b = slab.data();
  for (int64_t c0 = 0; c0 < N; c0 += width) {
    const int64_t cn = std::min(width, N - c0);
    ParallelFor(K, std::max<int64_t>(1, 16384 / cn), [&](int64_t k0, int64_t k1) {
      for (int64_t k = k0; k < k1; ++k) HalfToFloatRow(B_half + k * N + c0, b + k * cn, cn);
    });
    const dnnl_status_t st = dnnl_sgemm('N', 'N', M, cn, K, 1.f, A, K, b, cn, 0.f, C + c0, N);
    GAF_CHECK(st == dnnl_success, "oneDNN sgemm failed with status {}", static_cast<int>(st));
  }
}

void RegisterNnKernels(OpRegistry& r) {
  r.Register({"", "MatMul", OpKind::kContraction, MatMulKernel, true});
  r.Register({"", "Gemm", OpKind::kContraction, GemmKernel, true});
  r.Register({"", "MatMulInteger", OpKind::kContraction, MatMulIntegerKernel, false});
  r.Register({"", "Einsum", OpKind::kContraction, EinsumKernel, true});
  r.Register({"", "Conv", OpKind::kContraction, ConvKernel, true});
  r.Register({"", "ConvTranspose", OpKind::kContraction, ConvTransposeKernel, true});
  r.Register({"", "MaxPool", OpKind::kReduction, MaxPoolKernel, true});
  r.Register({"", "AveragePool", OpKind::kReduction, AveragePoolKernel, true});
  r.Register({"", "LpPool", OpKind::kReduction, LpPoolKernel, true});
  r.Register({"", "GlobalAveragePool", OpKind::kReduction, GlobalPoolKernel<GlobalMode::kAvg>, true});
  r.Register({"", "GlobalMaxPool", OpKind::kReduction, GlobalPoolKernel<GlobalMode::kMax>, true});
  r.Register({"", "ConvInteger", OpKind::kContraction, ConvIntegerKernel, false});
  r.Register({"", "QLinearConv", OpKind::kContraction, QLinearConvKernel, false});
  r.Register({"", "QLinearMatMul", OpKind::kContraction, QLinearMatMulKernel, false});
  r.Register({"", "MaxUnpool", OpKind::kInjective, MaxUnpoolKernel, false});
  r.Register({"", "GlobalLpPool", OpKind::kReduction, GlobalPoolKernel<GlobalMode::kLp>, true});
}

}  // namespace gaf
