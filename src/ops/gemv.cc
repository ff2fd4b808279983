// GEMV: y[0:N] (+)= x[0:K] * W[K,N] with a row-major weight, float32 or IEEE half (ops/gemv.h).
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "ir/half.h"
#include "ir/simd.h"  // GAF_AVX512, Mask16
#include "ops/gemv.h"
#include "ops/kernel_util.h"
#include "ops/nn_internal.h"

namespace gaf::nn_detail {
namespace {

// ------------------------------------------------------------------------------------------
// GEMV: y[0:N] (+)= x[0:K] * W[K,N], W row-major (leading dimension ldw), float32 or IEEE half.
//
// The rows are cut into at most four chunks, a number that depends on K only, and the columns
// into pieces of up to kGemvPiece; the (chunk, piece) tasks are handed out to the threads
// dynamically, so a thread that is descheduled just takes fewer of them instead of holding up
// the others at a barrier. A task streams its rows (8 streams, GemvPiece) as long contiguous
// segments (what the hardware prefetchers handle best; column blocks of 64-512 were measured
// 10-20% slower at two threads) into a partial sum per chunk; the partial sums are then added into y in chunk order.
// Every column is thus summed in the same order whatever the number of threads, so the result
// does not depend on it.

constexpr int64_t kGemvPiece = 8192;           // columns per task: a 32 KB accumulator row
constexpr int64_t kGemvMinParallel = 1 << 16;  // weight elements below which one thread is faster

// Rows per chunk (a multiple of 8): at most 4 chunks, at least 96 rows. (At most 8 chunks was
// 2-4% slower over a decode step's weights: more partial sums and shorter streams.)
inline int64_t GemvChunkRows(int64_t K) {
  return std::max<int64_t>(96, CeilDiv(CeilDiv(K, 4), 8) * 8);
}

#if GAF_AVX512
inline __m512 Load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 Load16(const uint16_t* p, __mmask16 m) {
  return _mm512_maskz_cvtph_ps(m, _mm256_maskz_loadu_epi16(m, p));
}
#endif

// The rows [k0, k1) of a task are read as 8 streams, stream u over its own contiguous run of
// s = (k1 - k0) / 8 rows from k0 + u * s; step i takes row k0 + u * s + i of every stream. The
// 8 rows of a step are summed as a fixed pairwise tree, ((0+1) + (2+3)) + ((4+5) + (6+7)), and
// then added to the sums; the (k1 - k0) % 8 rows left are added one at a time after, in order.
//
// Streams over runs rather than 8 consecutive rows: rows of float16 weights (and of narrow
// float32 ones) are shorter than a 4 KiB page, and 8 consecutive rows then share pages, which
// the hardware prefetchers track one stream per page. Over a decode step's weights (the bench
// preset: 85 products, 2 threads, one process, interleaved) float16 products took 14.0-15.2 ms
// with consecutive rows and 11.1-11.7 with the runs and a prefetch of the next row of each
// stream into L1, a plain read of the same bytes 9.3-10.1; float32 22.8-22.9 -> 21.5-22.2 ms, the
// read 20.4-21.2. Float16 rows now prefetch each stream 2 KiB ahead into L2 instead (past a
// piece's columns or a stream's end this touches lines the task does not use, harmlessly: a
// prefetch does not fault). On an AMD EPYC (Zen 4, 2 cores, 2026-12-02) the
// same 85 float16 weights in a standalone harness (the tasks as here, medians of 7 interleaved
// rounds, four sittings) took 10.9/11.4/12.2/11.0 ms with it, 12.3/13.0/15.2/13.1 with the next
// row of each stream into L1 (what the Intel VM liked best) and 11.4/11.8/13.1 with none (not run
// in the fourth). For float32 rows no distance (2-8 KiB, into L2) clearly beat none (22.6-23.4
// against 22.7 ms, one sitting; on the Intel VM the next row into L1 was 22.0 against 21.5).
struct GemvSteps {
  int64_t s;        // rows per stream
  int64_t tail0;    // first of the rows left, k0 + 8 * s
  int64_t Row(int64_t k0, int u, int64_t i) const { return k0 + u * s + i; }
  // Step i's 8 weight rows and the x values they are scaled by.
  template <class T>
  void Rows(const T* w, int64_t ldw, const float* x, int64_t k0, int64_t i, const T* r[8], float xs[8]) const {
    for (int u = 0; u < 8; ++u) {
      const int64_t k = Row(k0, u, i);
      r[u] = w + k * ldw;
      xs[u] = x[k];
    }
  }
};
inline GemvSteps GemvStepsOf(int64_t k0, int64_t k1) { return {(k1 - k0) / 8, k0 + (k1 - k0) / 8 * 8}; }

// acc[0:n] = sum over k in [k0, k1) of x[k] * w[k, 0:n], n <= kGemvPiece, in the order above.
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
  const GemvSteps st = GemvStepsOf(k0, k1);
  // Blocks of 8 weight rows x 512 columns (16 KiB of float32: read from memory for the first row
  // of x, from L1 for the others), each x row's 8 values broadcast once per block. (Register
  // tiles of 8 x rows x 32 columns summing k in order were 1.2-1.5x slower here at 4-8 rows.)
  constexpr int64_t kBlock = 512;
  for (int64_t i = 0; i < st.s; ++i) {
    const T* r[8];
    int64_t kr[8];
    for (int u = 0; u < 8; ++u) kr[u] = st.Row(k0, u, i), r[u] = w + kr[u] * ldw;
    for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
      const int64_t j1 = std::min(n, j0 + kBlock);
      for (int64_t row = 0; row < M; ++row) {
        const float* xr = x + row * ldx;
        __m512 xv[8];
        for (int u = 0; u < 8; ++u) xv[u] = _mm512_set1_ps(xr[kr[u]]);
        float* a = acc + row * n;
        const auto group = [&](int64_t j, __mmask16 m) {
          const auto pair = [&](int u) {
            return _mm512_fmadd_ps(xv[u + 1], Load16(r[u + 1] + j, m), _mm512_mul_ps(xv[u], Load16(r[u] + j, m)));
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
  for (int64_t k = st.tail0; k < k1; ++k) {
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
  const GemvSteps st = GemvStepsOf(k0, k1);
#if GAF_AVX512
  // The same arithmetic as GemvPieceRows for one row, with the broadcasts hoisted (a separate
  // loop: the general one streams 15% slower at batch 1).
  constexpr bool kHalf = std::is_same_v<T, uint16_t>;
  for (int64_t i = 0; i < st.s; ++i) {
    const T* r[8];
    float xs[8];
    st.Rows(w, ldw, x, k0, i, r, xs);
    __m512 xv[8];
    for (int u = 0; u < 8; ++u) xv[u] = _mm512_set1_ps(xs[u]);
    const auto group = [&](int64_t j, __mmask16 m) {
      if (kHalf && (j & 31) == 0)  // one 64-byte line (32 halves) of each stream, 2 KiB ahead, into L2
        for (int u = 0; u < 8; ++u)
          _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(r[u] + j) + 2048), _MM_HINT_T1);
      const auto pair = [&](int u) {
        return _mm512_fmadd_ps(xv[u + 1], Load16(r[u + 1] + j, m), _mm512_mul_ps(xv[u], Load16(r[u] + j, m)));
      };
      const __m512 s = _mm512_add_ps(_mm512_add_ps(pair(0), pair(2)),
                                     _mm512_add_ps(pair(4), pair(6)));
      _mm512_mask_storeu_ps(acc + j, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, acc + j), s));
    };
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) group(j, 0xffff);
    if (j < n) group(j, Mask16(n - j));
  }
  for (int64_t k = st.tail0; k < k1; ++k) {
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
  for (int64_t i = 0; i < st.s; ++i) {
    const T* r[8];
    float xs[8];
    st.Rows(w, ldw, x, k0, i, r, xs);
    for (int64_t j0 = 0; j0 < n; j0 += kSlice) {
      const int64_t m = std::min(kSlice, n - j0);
      const float* f[8];
      for (int u = 0; u < 8; ++u) {
        if constexpr (std::is_same_v<T, float>) {
          f[u] = r[u] + j0;
        } else {
          HalfToFloatRow(r[u] + j0, widened[u], m);
          f[u] = widened[u];
        }
      }
      float* a = acc + j0;
#pragma omp simd
      for (int64_t j = 0; j < m; ++j)
        a[j] += ((xs[0] * f[0][j] + xs[1] * f[1][j]) + (xs[2] * f[2][j] + xs[3] * f[3][j])) +
                ((xs[4] * f[4][j] + xs[5] * f[5][j]) + (xs[6] * f[6][j] + xs[7] * f[7][j]));
    }
  }
  for (int64_t k = st.tail0; k < k1; ++k) {
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

}  // namespace

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
  int nt = weights * M < kGemvMinParallel ? 1 : ParallelThreads();
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
  if (TaskTeam* team = TaskTeam::Active()) {  // a decode step led by a team: its threads take the tasks
    team->ForEach(tasks, [&](int64_t t, int64_t) { run(t, partial(t)); });
    for (int64_t t = 0; t < tasks; ++t) fold(t, partial(t));
    return;
  }
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
template void GemvMany<float>(const float* x, int64_t ldx, int64_t M, int64_t K,
                              const GemvProduct<float>* ps, int count, bool accumulate);
template void GemvMany<uint16_t>(const float* x, int64_t ldx, int64_t M, int64_t K,
                                 const GemvProduct<uint16_t>* ps, int count, bool accumulate);

namespace {

template <class T>
void Gemv(const float* x, const T* w, int64_t ldw, float* y, int64_t K, int64_t N, bool accumulate) {
  if (N <= 0) return;
  const GemvProduct<T> p{w, ldw, y, N, N};
  GemvMany(x, K, 1, K, &p, 1, accumulate);
}

}  // namespace
}  // namespace gaf::nn_detail

namespace gaf {

using namespace nn_detail;

void GemvF32(const float* x, const float* w, int64_t ldw, float* y, int64_t K, int64_t N,
             bool accumulate) {
  Gemv(x, w, ldw, y, K, N, accumulate);
}

void GemvRowsF32(const float* x, const float* w, int64_t ldw, float* y, int64_t K, int64_t N, float alpha,
                 float beta) {
  // Eight rows of W per step (eight streams for the prefetchers) share each load of x; each
  // output's sum has a fixed order (16 lanes, then the lanes' tree), so the result does not depend
  // on the thread count.
  constexpr int64_t kRows = 8;
  const int64_t groups = CeilDiv(N, kRows);
  const int nt = omp_in_parallel() || K * N < kGemvMinParallel ? 1 : omp_get_max_threads();
  auto finish = [&](int64_t n, float dot) { y[n] = alpha * dot + (beta == 0.f ? 0.f : beta * y[n]); };
  auto group = [&](int64_t g) {
    const int64_t n0 = g * kRows, rows = std::min<int64_t>(kRows, N - n0);
#if GAF_AVX512
    if (rows == kRows) {
      const float* r = w + n0 * ldw;
      __m512 acc[kRows];
      for (int64_t j = 0; j < kRows; ++j) acc[j] = _mm512_setzero_ps();
      for (int64_t k = 0; k < K; k += 16) {
        const __mmask16 m = Mask16(K - k);
        const __m512 v = _mm512_maskz_loadu_ps(m, x + k);
        for (int64_t j = 0; j < kRows; ++j) acc[j] = _mm512_fmadd_ps(v, _mm512_maskz_loadu_ps(m, r + j * ldw + k), acc[j]);
      }
      for (int64_t j = 0; j < kRows; ++j) {
        alignas(64) float lane[16];
        _mm512_store_ps(lane, acc[j]);
        for (int w = 8; w > 0; w /= 2)  // pairwise: lane i += lane i + w
          for (int l = 0; l < w; ++l) lane[l] += lane[l + w];
        finish(n0 + j, lane[0]);
      }
      return;
    }
#endif
    for (int64_t n = n0; n < n0 + rows; ++n) {
      const float* row = w + n * ldw;
      float dot = 0.f;
      for (int64_t k = 0; k < K; ++k) dot += x[k] * row[k];
      finish(n, dot);
    }
  };
  if (TaskTeam::Active() != nullptr && K * N >= kGemvMinParallel) {  // a team's run: ParallelFor hands it the groups
    ParallelFor(groups, 1, [&](int64_t g0, int64_t g1) {
      for (int64_t g = g0; g < g1; ++g) group(g);
    });
    return;
  }
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t g = 0; g < groups; ++g) group(g);
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

void GemvF16ManyRows(const float* x, int64_t M, int64_t K, const GemvHalfOutput* outs, int count) {
  std::vector<GemvProduct<uint16_t>> ps;
  for (int i = 0; i < count; ++i) ps.push_back({outs[i].w, outs[i].ldw, outs[i].y, outs[i].N, outs[i].N});
  GemvMany(x, K, M, K, ps.data(), count, false);
}

void ConvertToHalf(const float* src, uint16_t* dst, int64_t n) {
  ParallelFor(n, int64_t{1} << 16, [&](int64_t b, int64_t e) { FloatToHalfRow(src + b, dst + b, e - b); });
}

}  // namespace gaf
