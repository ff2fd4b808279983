// The register tile that streams several weight panels side by side, shared by the float32 panels
// (ops/panel_gemm.cc) and the float16 ones (ops/half_panel_gemm.cc): R rows of x by P panels of V
// vectors (16 V weights per k, of type T: float, or float16 bits widened while they stream).
//
// A single sequential stream per core is held back by the hardware prefetchers; reading P panels
// side by side keeps P streams going. A tile of one panel prefetches `pf_rows` rows ahead into L2;
// with two or more, the hardware prefetchers keep up with the streams and the prefetch
// instructions only cost: bench/decode_gemv_bench (AMD EPYC, 2 threads, one row, four panels a
// task; the same run, interleaved) read 73.7 GB/s without them against 67.3 GB/s with them 64 rows
// ahead (41.7 against 35.4 at 1 thread), float16 panels 67.3 against 59.4; two rows alike; at four
// rows the float16 tile (one panel) read 52.8 GB/s with them against 49.0 without.
// A float16 tile of several panels is the exception, with `kNearRows` (a few rows ahead, into L1
// without polluting the other levels, `prefetchnta`): it does four instructions a cache line where
// the float32 tile does one, so the out-of-order window reaches fewer lines ahead, and the near
// prefetch makes up for it. decode_gemv_bench, one row, 2 threads, interleaved in one process:
// 16 rows ahead 5.37-5.57 ms a step against 5.70-5.78 without (4-6% faster; 8 rows alike; 32 rows
// and more slower); at two rows the same (6.60-7.14 against 6.57-7.02). In `generate
// --half-weights` (each weight's product with and without on alternate steps, six processes) the
// products were 1.022x faster (median of six; 0.997-1.10). The float32 tile with the same prefetch was
// 1.09-1.13x slower there (six processes), so it has none.
// Every output element sums over k in order, from zero, in float32, so the bits do not depend on P,
// on R, or on how the rows and panels are split into tasks.
#pragma once

#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <array>
#include <map>
#include <vector>

#include "ir/half.h"
#include "ir/simd.h"  // GAF_AVX512
#include "ops/task_team.h"

namespace gaf::panel_detail {

template <class T>
struct PanelElement;
template <>
struct PanelElement<float> {
  static float Scalar(float v) { return v; }
#if GAF_AVX512
  static __m512 Load(const float* p) { return _mm512_load_ps(p); }
#endif
};
template <>
struct PanelElement<uint16_t> {  // IEEE float16 bits
  static float Scalar(uint16_t v) { return HalfBitsToFloat(v); }
#if GAF_AVX512
  static __m512 Load(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p)));
  }
#endif
};

// out[r * ldo + p * 16V + j] = sum over k in [0, K) in order of x[r * ldx + k] * panel_p[k][j], for
// the P panels at `panels`, `stride` elements apart, each [K][16 V], 64-byte aligned. One panel
// prefetches `pf_rows` rows ahead into L2; several panels `kNearRows` ahead (0: none), above.
template <class T, int V, int R, int P, int kNearRows = 0>
void MultiPanelTile(const float* x, int64_t ldx, const T* panels, int64_t K, int64_t stride, int64_t pf_rows,
                    float* out, int64_t ldo) {
  constexpr int64_t W = 16 * V;
#if GAF_AVX512
  static_assert(R * P * V <= 24, "accumulators beyond the registers");
  constexpr int kLines = static_cast<int>(W * sizeof(T) / 64);  // cache lines per panel row
  __m512 acc[R][P][V];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p)
#pragma GCC unroll 4
      for (int j = 0; j < V; ++j) acc[r][p][j] = _mm512_setzero_ps();
  const T* q = panels;
  for (int64_t k = 0; k < K; ++k, q += W) {
    __m512 b[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) b[r] = _mm512_set1_ps(x[r * ldx + k]);
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      const T* w = q + p * stride;
      // Formed as an integer: the rows ahead may lie past the panel's end (a prefetch never faults).
      [[maybe_unused]] const char* pf = reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(w) + pf_rows * W * sizeof(T));
      if constexpr (P == 1) {
#pragma GCC unroll 4
        for (int l = 0; l < kLines; ++l) _mm_prefetch(pf + 64 * l, _MM_HINT_T1);
      } else if constexpr (kNearRows > 0) {
        const char* near = reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(w) + kNearRows * W * sizeof(T));
#pragma GCC unroll 4
        for (int l = 0; l < kLines; ++l) _mm_prefetch(near + 64 * l, _MM_HINT_NTA);
      }
      __m512 v[V];
#pragma GCC unroll 4
      for (int j = 0; j < V; ++j) v[j] = PanelElement<T>::Load(w + 16 * j);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int j = 0; j < V; ++j) acc[r][p][j] = _mm512_fmadd_ps(b[r], v[j], acc[r][p][j]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p)
#pragma GCC unroll 4
      for (int j = 0; j < V; ++j) _mm512_storeu_ps(out + r * ldo + p * W + 16 * j, acc[r][p][j]);
#else
  (void)pf_rows;
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) {
      float acc[W] = {};
      for (int64_t k = 0; k < K; ++k) {
        const float b = x[r * ldx + k];
        const T* w = panels + p * stride + k * W;
        for (int64_t j = 0; j < W; ++j) acc[j] = std::fma(b, PanelElement<T>::Scalar(w[j]), acc[j]);
      }
      std::memcpy(out + r * ldo + p * W, acc, sizeof(acc));
    }
#endif
}

// The register tile of R rows on one panel of V vectors over the k range [k0, k1):
// out[r * ldo + j] (+)= sum over k in order of x[r * ldx + k] * panel[k][j] for r < R, j < 16 V, the
// panel's rows of type T (float, or float16 bits widened), 64-byte aligned; the sums start from
// zero when `first`, else continue those in out (a later k-block). With kPfLines > 0, iteration i
// asks for the kPfLines lines at pf + i * pf_step in L2 (the k-blocked tiles of a few rows, V lines,
// ops/panel_gemm.cc; a prompt's tiles one line, WholeKTile).
// Each row's broadcast is made where its V FMAs use it: R * V accumulators, V weight vectors and
// one broadcast fit the 32 registers (MultiPanelTile's broadcasts of every row first would not).
// The loops are fully unrolled (GCC at -O2 keeps a loop-indexed accumulator array on the stack
// otherwise).
template <class T, int V, int R, int kPfLines>
void KRangeTile(const float* x, int64_t ldx, const T* panel, int64_t k0, int64_t k1, float* out, int64_t ldo,
                bool first, [[maybe_unused]] const char* pf, [[maybe_unused]] int64_t pf_step) {
  constexpr int64_t W = 16 * V;
#if GAF_AVX512
  static_assert(R * V <= 24, "accumulators beyond the registers");
  __m512 acc[R][V];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < V; ++j) acc[r][j] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(out + r * ldo + 16 * j);
  const T* q = panel + k0 * W;
  for (int64_t k = k0; k < k1; ++k, q += W) {
    if constexpr (kPfLines > 0) {
#pragma GCC unroll 4
      for (int j = 0; j < kPfLines; ++j) _mm_prefetch(pf + 64 * j, _MM_HINT_T1);
      pf += pf_step;
    }
    __m512 w[V];
#pragma GCC unroll 4
    for (int j = 0; j < V; ++j) w[j] = PanelElement<T>::Load(q + 16 * j);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 b = _mm512_set1_ps(x[r * ldx + k]);
#pragma GCC unroll 4
      for (int j = 0; j < V; ++j) acc[r][j] = _mm512_fmadd_ps(b, w[j], acc[r][j]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < V; ++j) _mm512_storeu_ps(out + r * ldo + 16 * j, acc[r][j]);
#else
  for (int r = 0; r < R; ++r) {
    float acc[W];
    for (int64_t j = 0; j < W; ++j) acc[j] = first ? 0.f : out[r * ldo + j];
    for (int64_t k = k0; k < k1; ++k) {
      const float b = x[r * ldx + k];
      for (int64_t j = 0; j < W; ++j) acc[j] = std::fma(b, PanelElement<T>::Scalar(panel[k * W + j]), acc[j]);
    }
    std::memcpy(out + r * ldo, acc, sizeof(acc));
  }
#endif
}

// A prompt's register tile (more rows than the streaming tiles take; the FMAs set the pace): the
// tile above over all of K from zero. The panel comes from L2 for every tile but a task's first;
// with `pf` (not null) the tile asks for the K lines from pf on in L2, one a k (NextPanelChunk).
// Each element sums from zero over k in order, as MultiPanelTile's and the k-blocked tiles' do, so
// a row has the same bits in a prompt as alone.
template <class T, int V, int R>
void WholeKTile(const float* x, int64_t ldx, const T* panel, int64_t K, float* out, int64_t ldo, const char* pf) {
  if (pf != nullptr) return KRangeTile<T, V, R, 1>(x, ldx, panel, 0, K, out, ldo, true, pf, 64);
  KRangeTile<T, V, R, 0>(x, ldx, panel, 0, K, out, ldo, true, nullptr, 0);
}

// What a prompt's task reads next from memory: the panel (a gate pair: both, side by side) of the
// task its thread runs after this one, when that is another unit (RunPanelTasksAhead).
struct NextPanels {
  const void* p = nullptr;
  int64_t bytes = 0;
};

// The first tile of a panel waited on the panel from memory: in a standalone copy of the tile loop
// (rdtsc, 2 threads, 48-column panels of K = 1024 from DRAM) the first tile took 2.3x a later
// tile's time. So the task's last tile calls prefetch the next task's panel into L2, one line a k:
// call `call` of `calls` takes the chunk of K lines (K * 64 bytes; a panel of 16 V floats or 64
// halves a k is a whole number of chunks) that leaves the last chunk to the last call, or null.
// With fewer calls than chunks, the first chunks (what the next task reads first). Spread over the
// last three tiles the first tile took 1.2-1.6x; the whole panel during the last tile (too fast for
// one core's reads) 1.6-1.8x; bursts at the starts of the last four tiles 1.75-1.87x.
inline const char* NextPanelChunk(const NextPanels& next, int64_t K, int64_t call, int64_t calls) {
  if (next.p == nullptr || K <= 0) return nullptr;
  const int64_t chunk = K * 64, chunks = (next.bytes + chunk - 1) / chunk;
  const int64_t start = std::max<int64_t>(0, calls - chunks);
  if (call < start || call - start >= chunks) return nullptr;
  return static_cast<const char*>(next.p) + (call - start) * chunk;
}

// A prompt's tasks over `units` panels (or gate pairs) and M rows: (unit, first row, end row), the
// rows in ranges of whole `tile`s. Whole units first, each read from memory once by the thread that
// takes it; the last two per thread in four row ranges each, so that the threads finish together;
// with fewer than four units per thread, every unit split so that there are.
struct RowRangeTask {
  int64_t unit, m0, m1;
};
inline std::vector<RowRangeTask> RowRangeTasks(int64_t units, int64_t M, int64_t tile) {
  const int64_t tiles = (M + tile - 1) / tile, threads = std::max(1, omp_get_max_threads());
  const int64_t base = units >= 4 * threads ? 1 : (4 * threads + std::max<int64_t>(units, 1) - 1) / std::max<int64_t>(units, 1);
  const int64_t tail = std::min(units, 2 * threads);
  std::vector<RowRangeTask> tasks;
  for (int64_t u = 0; u < units; ++u) {
    const int64_t chunks = std::min(tiles, u >= units - tail ? std::max<int64_t>(base, 4) : base);
    for (int64_t c = 0; c < chunks; ++c)
      tasks.push_back({u, tiles * c / chunks * tile, std::min(M, tiles * (c + 1) / chunks * tile)});
  }
  return tasks;
}

// The threads that will take a product's tasks: the leading team's, else OpenMP's.
inline int TaskThreads() {
  if (TaskTeam* team = TaskTeam::Active()) return team->threads();
  return omp_in_parallel() ? 1 : omp_get_max_threads();
}

// A decode product's task: `n` panels of weight `w` from panel `p`, reading `cost` (in any unit
// common to the product's tasks), divisible into tasks of whole `unit`s of panels (a gate pair's
// two).
struct SpanTask {
  int w;
  int64_t p, n, cost, unit;
};

// The time the last of `threads` threads ends when they claim `tasks` in order, each the next one
// when it is done with its own, at one speed (cost a unit of time).
inline int64_t ClaimedEnd(const std::vector<SpanTask>& tasks, int threads) {
  int64_t load[ReadAhead::kMaxThreads] = {};
  const int t = std::clamp(threads, 1, ReadAhead::kMaxThreads);
  for (const SpanTask& task : tasks) *std::min_element(load, load + t) += task.cost;
  return *std::max_element(load, load + t);
}

// Orders a decode product's tasks largest first (the small ones fill in at the end), then, while
// the team's threads claiming them in order would not end together, splits the smallest divisible
// task in two, as long as each split brings the simulated end nearer (at most 16 splits). A
// product's tasks are few (a bench Llama's attention output: 4-panel tasks of 12 vectors and a
// 1-panel and a 1-vector task, 64 vectors in all): in order, one thread took 36 vectors while the
// other ended at 28 and waited.
inline void BalanceSpanTasks(std::vector<SpanTask>& tasks, int threads) {
  const auto largest_first = [](std::vector<SpanTask>& v) {
    std::stable_sort(v.begin(), v.end(), [](const SpanTask& x, const SpanTask& y) { return x.cost > y.cost; });
  };
  largest_first(tasks);
  if (threads < 2) return;
  int64_t end = ClaimedEnd(tasks, threads);
  for (int split = 0; split < 16; ++split) {
    int64_t pick = -1;
    for (size_t i = 0; i < tasks.size(); ++i)
      if (tasks[i].n >= 2 * tasks[i].unit && (pick < 0 || tasks[i].cost <= tasks[pick].cost)) pick = static_cast<int64_t>(i);
    if (pick < 0) return;
    std::vector<SpanTask> tried = tasks;
    SpanTask& a = tried[pick];
    const int64_t n1 = a.n / a.unit / 2 * a.unit;
    SpanTask b{a.w, a.p + n1, a.n - n1, a.cost - a.cost * n1 / a.n, a.unit};
    a.n = n1;
    a.cost -= b.cost;
    tried.push_back(b);
    largest_first(tried);
    const int64_t e = ClaimedEnd(tried, threads);
    if (e >= end) return;
    end = e;
    tasks = std::move(tried);
  }
}

// A product's tasks: `n` panels of weight `w` from panel `p`.
struct PanelSpan {
  int w;
  int64_t p, n;
};

// A product's task list depends only on its shapes (each weight's columns and whether it is a gate
// pair), the rows (their group) and the threads; a decode step asks for the same few dozen lists
// every step. Making and balancing one took 2.6 us a product on average in the bench Llama's decode
// steps (about 130 us a step, the other thread waiting), so each thread keeps the lists it made,
// by that key (no pointer in it: a list fits any weights of those shapes). Products of more than
// kMaxWeights weights are made every time.
class PanelTaskCache {
 public:
  static constexpr int kMaxWeights = 8;
  using Key = std::array<int64_t, 3 + 2 * kMaxWeights>;  // rows, threads, weights, (columns, gated)...
  // The list for products `ps` (PanelProduct or HalfPanelProduct: each weight's N and gated_cols)
  // at M rows on `threads` threads, made by make() the first time; past kMaxWeights weights made
  // every time, into `own`.
  template <class Product, class Make>
  static const std::vector<PanelSpan>& Get(int64_t M, int threads, const Product* ps, int count,
                                           std::vector<PanelSpan>& own, Make&& make) {
    if (count > kMaxWeights) return own = make();
    Key key{};
    key[0] = M;
    key[1] = threads;
    key[2] = count;
    for (int i = 0; i < count; ++i) {
      key[3 + 2 * i] = ps[i].w->N();
      key[4 + 2 * i] = ps[i].gated_cols > 0;
    }
    thread_local std::map<Key, std::vector<PanelSpan>> lists;
    auto it = lists.find(key);
    if (it != lists.end()) return it->second;
    if (lists.size() >= kMaxLists) lists.clear();
    return lists.emplace(key, make()).first->second;
  }

 private:
  static constexpr size_t kMaxLists = 1024;
};

// Tells the team leading the run (if any) what a decode product's first tasks read, so that it
// prefetches them at the end of the product before (TaskTeam::Announce): rank r takes task r
// first, its panels side by side. task(r) gives task r's first panel and panel count; panels lie
// `panel_stride` bytes apart and each reads `panel_bytes` from its start.
template <class TaskOf>
void AnnounceFirstTasks(const void* key, int64_t tasks, int64_t panel_stride, int64_t panel_bytes, TaskOf&& task) {
  TaskTeam* team = TaskTeam::Active();
  if (team == nullptr) return;
  FirstReads first[ReadAhead::kMaxThreads];
  const int count = static_cast<int>(std::min<int64_t>({tasks, team->threads(), ReadAhead::kMaxThreads}));
  for (int r = 0; r < count; ++r) {
    const auto [panel, n] = task(r);
    first[r].streams = static_cast<int>(std::min<int64_t>(n, 4));
    first[r].bytes = panel_bytes;
    for (int s = 0; s < first[r].streams; ++s) first[r].p[s] = static_cast<const char*>(panel) + s * panel_stride;
  }
  team->Announce(key, first, count);
}

// fn(t) for every task t in [0, n): taken dynamically by the OpenMP team when there are several and
// `work` (weight elements x rows) reaches `min_parallel`, else in order on the calling thread (also
// inside a parallel region).
// Inside a run led by a TaskTeam (ops/task_team.h), the team's threads take them.
template <class Fn>
void RunPanelTasks(int64_t n, int64_t work, int64_t min_parallel, Fn&& fn) {
  if (TaskTeam* team = TaskTeam::Active(); team != nullptr && n >= 2 && work >= min_parallel) {
    team->ForEach(n, [&](int64_t t, int64_t) { fn(t); });
    return;
  }
  if (omp_in_parallel() || n < 2 || work < min_parallel || omp_get_max_threads() < 2) {
    for (int64_t t = 0; t < n; ++t) fn(t);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < n; ++t) fn(t);
}

// RunPanelTasks, fn(t, next) being told the task its thread takes after t (-1: none), so that t can
// prefetch what next reads: each thread claims its next task when it starts one (from a shared
// counter, in order), so tasks are still handed out dynamically, one held in reserve per thread.
template <class Fn>
void RunPanelTasksAhead(int64_t n, int64_t work, int64_t min_parallel, Fn&& fn) {
  if (TaskTeam* team = TaskTeam::Active(); team != nullptr && n >= 2 && work >= min_parallel) {
    team->ForEach(n, fn, /*ahead=*/true);  // the same claims: each thread's next task when it starts one
    return;
  }
  if (omp_in_parallel() || n < 2 || work < min_parallel || omp_get_max_threads() < 2) {
    for (int64_t t = 0; t < n; ++t) fn(t, t + 1 < n ? t + 1 : -1);
    return;
  }
  int64_t counter = 0;
#pragma omp parallel
  {
    int64_t t;
#pragma omp atomic capture
    t = counter++;
    while (t < n) {
      int64_t next;
#pragma omp atomic capture
      next = counter++;
      fn(t, next < n ? next : -1);
      t = next;
    }
  }
}

}  // namespace gaf::panel_detail
