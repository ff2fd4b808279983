// Products of a few rows by a weight packed into column panels (ops/panel_gemm.h).
#include "ops/panel_gemm.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <utility>
#include <cstring>
#include <vector>

#include "ir/simd.h"  // GAF_AVX512
#include "ops/fast_math.h"
#include "ops/kernel_util.h"
#include "ops/nn_internal.h"  // CeilDiv
#include "ops/panel_tiles.h"
#include "ops/task_team.h"

namespace gaf {
using nn_detail::CeilDiv;

namespace {

// Rows of one register tile (8 rows x 3 vectors of accumulators + 3 weight vectors + a broadcast
// fit the 32 vector registers: M up to 8 takes the weight once with no reuse from L1), and the
// k-block a panel is taken in when several tiles share it (64 x 48 floats = 12 KiB, in L1 for the
// tiles after the first). (Panels of 64 columns with 6-row tiles read 8 rows at 0.83 of the read
// floor against 0.9+ for 4.)
constexpr int kTileRows = 8;
constexpr int64_t kKBlock = 64;
// A single sequential stream per core is held back by the hardware prefetchers (about 9 of the
// 12 GB/s one core reads here, bench/decode_gemv_bench), so the tiles prefetch the next k-block
// between them (into L2) while they work on this one: the stream keeps going while the later
// tiles work from L1. (Prefetching only ahead of each tile left memory idle during all but the
// first; 2 or 4 blocks ahead, 128-row blocks, or K cut into segments read round-robin were not
// faster; into L1 was 5-10% slower at 8 rows, prefetchnta 2x slower.)
// Weight elements x rows below which one thread is faster than waking the team.
constexpr int64_t kPanelMinParallel = int64_t{1} << 18;

// out[r][0:16V] (+)= sum over k in [k0, k1) of x[r * ldx + k] * panel[k][0:16V], r < R, for a panel
// of V vectors (16V floats per k); out rows kPanelCols floats apart. The sums run over k in order.
// Iteration i prefetches the V lines at pf + i * pf_step into L2 (panel_tiles.h KRangeTile).
template <int R, int V>
void Tile(const float* x, int64_t ldx, const float* panel, int64_t k0, int64_t k1, float* out, bool first,
          const char* pf, int64_t pf_step) {
  panel_detail::KRangeTile<float, V, R, V>(x, ldx, panel, k0, k1, out, kPanelCols, first, pf, pf_step);
}

// Full panels a task of M rows takes at once (ops/panel_tiles.h MultiPanelTile: that many streams;
// R * P * 3 accumulators fit the registers up to 24). bench/decode_gemv_bench at one row, 2 threads, an AMD
// EPYC with 70 GB/s of read bandwidth, against the row-major GEMV in the same run: one panel a task
// 0.96x, 2 panels 1.07x, 3 1.12x, 4 1.06-1.22x (four runs), 6 1.05x, 8 1.03x; at 1 thread 2 panels
// 1.04x, 3 1.13x, 4 1.07-1.11x, 6 0.99x.
constexpr int64_t kMultiPanelMaxRows = 4;
constexpr int64_t MultiPanels(int64_t M) { return M <= 2 ? 4 : M <= kMultiPanelMaxRows ? 2 : 1; }

template <int R, int P>
void RowsTileMulti(const float* x, int64_t ldx, const float* panels, int64_t K, float* out, int64_t ldo) {
  panel_detail::MultiPanelTile<float, 3, R, P>(x, ldx, panels, K, K * kPanelCols, kKBlock, out, ldo);
}

// out[0:M, 0:n * kPanelCols] (leading dimension ldo) = x * the n full panels from `panels`
// (M <= kMultiPanelMaxRows, n <= MultiPanels(M)).
void MultiPanelSums(const float* x, int64_t M, int64_t K, const float* panels, int64_t n, float* out, int64_t ldo) {
  using Fn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t);
  // kFns[R - 1][P - 1]
  static constexpr Fn kFns[4][4] = {
      {&RowsTileMulti<1, 1>, &RowsTileMulti<1, 2>, &RowsTileMulti<1, 3>, &RowsTileMulti<1, 4>},
      {&RowsTileMulti<2, 1>, &RowsTileMulti<2, 2>, &RowsTileMulti<2, 3>, &RowsTileMulti<2, 4>},
      {&RowsTileMulti<3, 1>, &RowsTileMulti<3, 2>, nullptr, nullptr},
      {&RowsTileMulti<4, 1>, &RowsTileMulti<4, 2>, nullptr, nullptr}};
  static_assert(MultiPanels(1) <= 4 && MultiPanels(2) <= 4 && MultiPanels(3) <= 2 && MultiPanels(4) <= 2);
  kFns[M - 1][n - 1](x, K, panels, K, out, ldo);
}

// The sums of a multi-panel task (on the stack: at most kMultiPanelMaxRows rows of 4 panels).
constexpr int64_t kMultiLdo = 4 * kPanelCols;

// y[0:M, c0:c0 + n * kPanelCols] = x * the n full panels from `panels` (M <= kMultiPanelMaxRows,
// n <= MultiPanels(M)).
void MultiPanelTask(const float* x, int64_t M, int64_t K, const float* panels, int64_t n, float* y, int64_t ldy,
                    int64_t c0) {
  alignas(64) float out[kMultiPanelMaxRows * kMultiLdo];
  MultiPanelSums(x, M, K, panels, n, out, kMultiLdo);
  for (int64_t m = 0; m < M; ++m) std::memcpy(y + m * ldy + c0, out + m * kMultiLdo, sizeof(float) * n * kPanelCols);
}

using TileFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, bool, const char*, int64_t);

template <int V, int... Rs>
constexpr std::array<TileFn, sizeof...(Rs)> TilesOfWidth(std::integer_sequence<int, Rs...>) {
  return {&Tile<Rs + 1, V>...};
}
// kTiles[V - 1][R - 1]: the tile of R rows on a panel of V vectors.
constexpr std::array<std::array<TileFn, kTileRows>, 3> kTiles = {
    TilesOfWidth<1>(std::make_integer_sequence<int, kTileRows>{}),
    TilesOfWidth<2>(std::make_integer_sequence<int, kTileRows>{}),
    TilesOfWidth<3>(std::make_integer_sequence<int, kTileRows>{})};
static_assert(kPanelCols == 48);

// out[0:M, 0:kPanelCols] (64-byte aligned, leading dimension kPanelCols) = x * panel (16 * vecs
// floats per k): the rows in tiles of nearly equal size that take each k-block in turn (from L1
// after the first), each tile prefetching its share of the next k-block.
void PanelSums(const float* x, int64_t M, int64_t K, const float* panel, int vecs, float* out) {
  const int64_t tiles = CeilDiv(M, kTileRows), row_bytes = 64 * vecs;
  const int64_t block = tiles == 1 ? K : kKBlock;  // one tile: no reuse to block for
  for (int64_t k0 = 0; k0 < K; k0 += block) {
    const int64_t k1 = std::min(K, k0 + block);
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t m0 = M * t / tiles, m1 = M * (t + 1) / tiles;
      // One tile prefetches kKBlock rows ahead of itself; several, their share of the next k-block.
      const char* pf = tiles == 1 ? reinterpret_cast<const char*>(panel + (k0 + kKBlock) * 16 * vecs)
                                  : reinterpret_cast<const char*>(panel + k1 * 16 * vecs) + t * (kKBlock * row_bytes / tiles);
      kTiles[vecs - 1][m1 - m0 - 1](x + m0 * K, K, panel, k0, k1, out + m0 * kPanelCols, k0 == 0, pf,
                                    row_bytes / tiles);
    }
  }
}

// A block of `blocks` x M x kPanelCols sums the thread keeps (64-byte aligned), for more rows than
// the stack holds.
float* ThreadSums(int64_t M, int blocks) {
  thread_local std::vector<float> large;
  const int64_t need = blocks * M * kPanelCols + 16;
  if (static_cast<int64_t>(large.size()) < need) large.resize(static_cast<size_t>(need));
  return large.data() + (16 - reinterpret_cast<uintptr_t>(large.data()) / 4 % 16) % 16;
}

// y[m, c0:c0+cols] += add[m, c0:c0+cols] for m in [m0, m1) (leading dimension ld for both): a
// residual after the sums a task just stored, while they are in L1. No-op without `add`.
void AddRows(const float* add, int64_t ld, int64_t m0, int64_t m1, int64_t c0, int64_t cols, float* y) {
  if (add == nullptr) return;
  for (int64_t m = m0; m < m1; ++m) {
    const float* a = add + m * ld + c0;
    float* yr = y + m * ld + c0;
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) yr[j] += a[j];
  }
}

// y[0:M, c0:c0+cols] = x * panel (16 * vecs floats per k), through a block of M x kPanelCols sums.
void PanelTask(const float* x, int64_t M, int64_t K, const float* panel, int vecs, float* y, int64_t ldy,
               int64_t c0, int64_t cols) {
  // The sums: on the stack for a few rows, else in a block the thread keeps.
  constexpr int64_t kStackRows = 16;
  alignas(64) float small[kStackRows * kPanelCols];
  float* out = M <= kStackRows ? small : ThreadSums(M, 1);
  PanelSums(x, M, K, panel, vecs, out);
  for (int64_t m = 0; m < M; ++m) std::memcpy(y + m * ldy + c0, out + m * kPanelCols, sizeof(float) * cols);
}

// Panels [p, p + n) of a gate pair (PanelWeight::GatePair; p and n even): their sums, then
// y[:, c] = SiLU(gate sums) * up sums for the n / 2 panels' columns below F.
void GatedTask(const float* x, int64_t M, int64_t K, const PanelWeight& w, int64_t p, int64_t n, float* y,
               int64_t F) {
  const int64_t c0 = p / 2 * kPanelCols;
  if (M <= kMultiPanelMaxRows && n <= MultiPanels(M)) {  // the pairs' panels side by side
    alignas(64) float out[kMultiPanelMaxRows * kMultiLdo];
    MultiPanelSums(x, M, K, w.panel(p), n, out, kMultiLdo);
    for (int64_t q = 0; q < n / 2; ++q) {
      const int64_t c = c0 + q * kPanelCols;
      if (c < F)
        StoreGated(out + 2 * q * kPanelCols, kMultiLdo, out + (2 * q + 1) * kPanelCols, kMultiLdo, M,
                   std::min(kPanelCols, F - c), y + c, F);
    }
    return;
  }
  float* g = ThreadSums(M, 2);  // more rows: one panel at a time, n == 2
  float* u = g + M * kPanelCols;
  PanelSums(x, M, K, w.panel(p), 3, g);
  PanelSums(x, M, K, w.panel(p + 1), 3, u);
  StoreGated(g, kPanelCols, u, kPanelCols, M, std::min(kPanelCols, F - c0), y + c0, F);
}

// A prompt's rows (more than kPanelMaxRows): each panel's rows in tiles of kTileRows, each tile
// summing over all of K in registers (panel_tiles.h WholeKTile). The panel comes from L2 (48
// columns of K = 1024 are 192 KiB), put there by the previous task's last tiles (NextPanelChunk);
// the rows of x are read in place. Against the k-blocks above, no tile stores and reloads its sums
// between blocks. bench/prompt_gemm_bench (the bench Llama's products at 256 rows, 2 threads,
// against oneDNN's matmul on its own packed copy, interleaved): before the prefetch, parity
// (0.99-1.05x in six runs, 0.87-0.89 of the FMA peak; the narrow o product 0.95-0.99x, its first
// tiles waiting on memory); with it, 416-419 against 405-407 GFLOPS over a prompt's products (two
// pairs of binaries, alternating). It also saves oneDNN's second copy of every weight.
template <int R, int V>
void FullKTile(const float* x, int64_t ldx, const float* panel, int64_t K, float* out, int64_t ldo, const char* pf) {
  panel_detail::WholeKTile<float, V, R>(x, ldx, panel, K, out, ldo, pf);
}
using FullKFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, const char*);
template <int V, int... Rs>
constexpr std::array<FullKFn, sizeof...(Rs)> FullKTilesOfWidth(std::integer_sequence<int, Rs...>) {
  return {&FullKTile<Rs + 1, V>...};
}
// kFullKTiles[V - 1][R - 1]: R rows on a panel of V vectors.
constexpr std::array<std::array<FullKFn, kTileRows>, 3> kFullKTiles = {
    FullKTilesOfWidth<1>(std::make_integer_sequence<int, kTileRows>{}),
    FullKTilesOfWidth<2>(std::make_integer_sequence<int, kTileRows>{}),
    FullKTilesOfWidth<3>(std::make_integer_sequence<int, kTileRows>{})};

// y[m0:m1, c0:c0 + cols] = x[m0:m1] * panel (vecs vectors; cols <= 16 * vecs), tile by tile: into y
// itself when the panel's columns are all y's, else through a tile on the stack. The last tiles
// prefetch `next` (panel_tiles.h NextPanelChunk).
void FullKRows(const float* x, int64_t K, int64_t m0, int64_t m1, const float* panel, int vecs, float* y,
               int64_t ldy, int64_t c0, int64_t cols, const float* add, const panel_detail::NextPanels& next) {
  alignas(64) float tile[kTileRows * kPanelCols];
  const bool direct = cols == 16 * vecs;
  const int64_t calls = CeilDiv(m1 - m0, kTileRows);
  for (int64_t m = m0, call = 0; m < m1; m += kTileRows, ++call) {
    const int64_t r = std::min<int64_t>(kTileRows, m1 - m);
    float* out = direct ? y + m * ldy + c0 : tile;
    kFullKTiles[vecs - 1][r - 1](x + m * K, K, panel, K, out, direct ? ldy : kPanelCols,
                                 panel_detail::NextPanelChunk(next, K, call, calls));
    if (!direct)
      for (int64_t i = 0; i < r; ++i) std::memcpy(y + (m + i) * ldy + c0, tile + i * kPanelCols, sizeof(float) * cols);
    AddRows(add, ldy, m, m + r, c0, cols, y);
  }
}

// Rows [m0, m1) of a gate pair's panels p (gate) and p + 1 (up): y[:, c] = SiLU(gate) * up for the
// pair's columns below F, a tile at a time; the last tiles prefetch `next`.
void FullKGatedRows(const float* x, int64_t K, int64_t m0, int64_t m1, const PanelWeight& w, int64_t p, float* y,
                    int64_t F, const panel_detail::NextPanels& next) {
  alignas(64) float g[kTileRows * kPanelCols], u[kTileRows * kPanelCols];
  const int64_t c0 = p / 2 * kPanelCols, cols = std::min(kPanelCols, F - c0);
  const int64_t calls = 2 * CeilDiv(m1 - m0, kTileRows);
  for (int64_t m = m0, call = 0; m < m1; m += kTileRows, call += 2) {
    const int64_t r = std::min<int64_t>(kTileRows, m1 - m);
    kFullKTiles[2][r - 1](x + m * K, K, w.panel(p), K, g, kPanelCols,
                          panel_detail::NextPanelChunk(next, K, call, calls));
    kFullKTiles[2][r - 1](x + m * K, K, w.panel(p + 1), K, u, kPanelCols,
                          panel_detail::NextPanelChunk(next, K, call + 1, calls));
    StoreGated(g, kPanelCols, u, kPanelCols, r, cols, y + m * F + c0, F);
  }
}

// PanelGemmMany for more than kPanelMaxRows rows: tasks of a panel (a gate pair: both) and a range
// of row tiles (panel_tiles.h RowRangeTasks); each task prefetches the panel its thread reads next.
void PanelGemmRows(const float* x, int64_t M, int64_t K, const PanelProduct* ps, int count) {
  struct Unit {
    int w;
    int64_t p;
  };
  std::vector<Unit> units;
  int64_t weights = 0;
  for (int i = 0; i < count; ++i) {
    const PanelWeight& w = *ps[i].w;
    weights += K * w.N();
    const int64_t step = ps[i].gated_cols > 0 ? 2 : 1;
    for (int64_t p = 0; p < w.panels(); p += step) units.push_back({i, p});
  }
  const std::vector<panel_detail::RowRangeTask> tasks =
      panel_detail::RowRangeTasks(static_cast<int64_t>(units.size()), M, kTileRows);
  auto run = [&](int64_t t, int64_t next_task) {
    const panel_detail::RowRangeTask& task = tasks[t];
    const Unit& unit = units[task.unit];
    const PanelProduct& prod = ps[unit.w];
    const PanelWeight& w = *prod.w;
    panel_detail::NextPanels next;
    if (next_task >= 0 && tasks[next_task].unit != task.unit) {  // the same unit's panel is in L2 already
      const Unit& u = units[tasks[next_task].unit];
      const PanelWeight& nw = *ps[u.w].w;
      next.p = nw.panel(u.p);
      next.bytes = ps[u.w].gated_cols > 0 ? 2 * K * kPanelCols * int64_t{sizeof(float)}
                                          : K * 16 * nw.vectors(u.p) * int64_t{sizeof(float)};
    }
    if (prod.gated_cols > 0)
      return FullKGatedRows(x, K, task.m0, task.m1, w, unit.p, prod.y, prod.gated_cols, next);
    const int64_t c0 = unit.p * kPanelCols;
    FullKRows(x, K, task.m0, task.m1, w.panel(unit.p), w.vectors(unit.p), prod.y, w.N(), c0,
              std::min(kPanelCols, w.N() - c0), prod.add, next);
  };
  panel_detail::RunPanelTasksAhead(static_cast<int64_t>(tasks.size()), weights * M, kPanelMinParallel, run);
}

}  // namespace

PanelWeight::PanelWeight(const float* w, int64_t K, int64_t N)
    : K_(K), N_(N), panels_(CeilDiv(N, kPanelCols)),
      packed_(Tensor::Uninitialized(DataType::kFloat, {K * CeilDiv(N, 16) * 16})) {
  // Blocks of kKBlock rows of W (in cache while every panel takes its part), in parallel.
  float* dst = packed_.data<float>();
  ParallelFor(CeilDiv(K, kKBlock), 1, [&](int64_t b0, int64_t b1) {
    for (int64_t k0 = b0 * kKBlock; k0 < std::min(K, b1 * kKBlock); k0 += kKBlock) {
      const int64_t k1 = std::min(K, k0 + kKBlock);
      for (int64_t p = 0; p < panels_; ++p) {
        const int64_t c0 = p * kPanelCols, cols = std::min(kPanelCols, N - c0), width = 16 * vectors(p);
        float* d = dst + c0 * K + k0 * width;
        for (int64_t k = k0; k < k1; ++k, d += width) {
          std::memcpy(d, w + k * N + c0, sizeof(float) * cols);
          if (cols < width) std::memset(d + cols, 0, sizeof(float) * (width - cols));
        }
      }
    }
  });
}

PanelWeight PanelWeight::GatePair(const float* gate, const float* up, int64_t K, int64_t F) {
  PanelWeight pw;
  const int64_t half = CeilDiv(F, kPanelCols);
  pw.K_ = K;
  pw.N_ = 2 * half * kPanelCols;
  pw.panels_ = 2 * half;
  pw.packed_ = Tensor::Uninitialized(DataType::kFloat, {CheckedMul(K, pw.N_, "gate pair weight")});
  float* dst = pw.packed_.data<float>();
  ParallelFor(CeilDiv(K, kKBlock), 1, [&](int64_t b0, int64_t b1) {
    for (int64_t k0 = b0 * kKBlock; k0 < std::min(K, b1 * kKBlock); k0 += kKBlock) {
      const int64_t k1 = std::min(K, k0 + kKBlock);
      for (int64_t p = 0; p < pw.panels_; ++p) {
        const float* src = p % 2 == 0 ? gate : up;
        const int64_t c0 = p / 2 * kPanelCols, cols = std::min(kPanelCols, F - c0);
        float* d = dst + p * kPanelCols * K + k0 * kPanelCols;
        for (int64_t k = k0; k < k1; ++k, d += kPanelCols) {
          std::memcpy(d, src + k * F + c0, sizeof(float) * cols);
          if (cols < kPanelCols) std::memset(d + cols, 0, sizeof(float) * (kPanelCols - cols));
        }
      }
    }
  });
  return pw;
}

void StoreGated(const float* g, int64_t ldg, const float* u, int64_t ldu, int64_t M, int64_t cols, float* y,
                int64_t ldy) {
  for (int64_t m = 0; m < M; ++m) {
    const float* gr = g + m * ldg;
    const float* ur = u + m * ldu;
    float* yr = y + m * ldy;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) {
      const float silu = gr[c] * gaf_fast::FastSigmoid(gr[c]);
      yr[c] = silu * ur[c];
    }
  }
}

namespace {

// The tasks of PanelGemmMany's products at M rows (up to kPanelMaxRows; made once per shape,
// panel_tiles.h PanelTaskCache): (weight, first panel,
// panels). A few rows take up to MultiPanels(M) full panels a task (that many streams); more rows,
// one panel a task (their tiles reuse it from L1). A decode step's (M <= kMultiPanelMaxRows) are
// balanced for the threads that claim them (panel_tiles.h BalanceSpanTasks): the bench Llama's
// attention output and down products (7 tasks) had the leader wait 18.9 us a call for the other
// thread, 3.3 after; q/k/v (13 tasks) 8.6, 3.0 after; those calls took 3% and 1.7% less time
// (interleaved in one process, a loaded host).
std::vector<panel_detail::PanelSpan> RowsTasks(const PanelProduct* ps, int count, int64_t M, int threads) {
  const int64_t group = MultiPanels(M);
  std::vector<panel_detail::SpanTask> spans;
  for (int i = 0; i < count; ++i) {
    const PanelWeight& w = *ps[i].w;
    auto add = [&](int64_t p, int64_t n) {
      int64_t vectors = 0;
      for (int64_t q = p; q < p + n; ++q) vectors += w.vectors(q);
      spans.push_back({i, p, n, vectors, ps[i].gated_cols > 0 ? 2 : 1});
    };
    if (ps[i].gated_cols > 0) {  // whole pairs a task: at least two panels
      const int64_t pairs = std::max<int64_t>(2, group);
      for (int64_t p = 0; p < w.panels(); p += pairs) add(p, std::min(pairs, w.panels() - p));
      continue;
    }
    const int64_t full = w.N() / kPanelCols;  // panels of 3 vectors
    for (int64_t p = 0; p < w.panels();) {
      const int64_t n = p < full ? std::min(group, full - p) : 1;
      add(p, n);
      p += n;
    }
  }
  if (M <= kMultiPanelMaxRows) panel_detail::BalanceSpanTasks(spans, threads);
  std::vector<panel_detail::PanelSpan> tasks;
  tasks.reserve(spans.size());
  for (const panel_detail::SpanTask& t : spans) tasks.push_back({t.w, t.p, t.n});
  return tasks;
}

}  // namespace

void PanelGemmMany(const float* x, int64_t M, int64_t K, const PanelProduct* ps, int count) {
  GAF_CHECK(M >= 1, "PanelGemmMany: {} rows (at least 1)", M);
  NoteProductRows(M);
  int64_t weights = 0;
  for (int i = 0; i < count; ++i) {
    GAF_CHECK(ps[i].w->K() == K, "PanelGemmMany: weight {} has K {} (expected {})", i, ps[i].w->K(), K);
    const PanelWeight& w = *ps[i].w;
    weights += K * w.N();
    GAF_CHECK(ps[i].gated_cols == 0 || ps[i].add == nullptr, "PanelGemmMany: weight {} is a gate pair with an addend", i);
    GAF_CHECK(ps[i].gated_cols == 0 || w.N() == 2 * CeilDiv(ps[i].gated_cols, kPanelCols) * kPanelCols,
              "PanelGemmMany: weight {} is not a gate pair of {} columns", i, ps[i].gated_cols);
  }
  if (K == 0) {  // empty sums (SiLU(0) * 0 for a gate pair)
    for (int i = 0; i < count; ++i) {
      std::fill(ps[i].y, ps[i].y + M * (ps[i].gated_cols > 0 ? ps[i].gated_cols : ps[i].w->N()), 0.f);
      if (ps[i].gated_cols == 0) AddRows(ps[i].add, ps[i].w->N(), 0, M, 0, ps[i].w->N(), ps[i].y);
    }
    return;
  }
  if (M > kPanelMaxRows) return PanelGemmRows(x, M, K, ps, count);
  const int threads = panel_detail::TaskThreads();
  std::vector<panel_detail::PanelSpan> own;
  const std::vector<panel_detail::PanelSpan>& tasks = panel_detail::PanelTaskCache::Get(
      M, threads, ps, count, own, [&] { return RowsTasks(ps, count, M, threads); });
  if (M <= kMultiPanelMaxRows) {  // a decode step's product: the team reads its first tasks ahead
    const int64_t panel_bytes = K * kPanelCols * static_cast<int64_t>(sizeof(float));
    panel_detail::AnnounceFirstTasks(ps[0].w, static_cast<int64_t>(tasks.size()), panel_bytes, panel_bytes,
                                     [&](int64_t r) {
                                       const panel_detail::PanelSpan& t = tasks[r];
                                       return std::pair<const void*, int64_t>(ps[t.w].w->panel(t.p), t.n);
                                     });
  }
  auto run = [&](int64_t t) {
    const panel_detail::PanelSpan& task = tasks[t];
    const PanelWeight& w = *ps[task.w].w;
    if (ps[task.w].gated_cols > 0) return GatedTask(x, M, K, w, task.p, task.n, ps[task.w].y, ps[task.w].gated_cols);
    const int64_t c0 = task.p * kPanelCols;
    if (task.n == 1) {
      const int64_t cols = std::min(kPanelCols, w.N() - c0);
      PanelTask(x, M, K, w.panel(task.p), w.vectors(task.p), ps[task.w].y, w.N(), c0, cols);
      AddRows(ps[task.w].add, w.N(), 0, M, c0, cols, ps[task.w].y);
      return;
    }
    MultiPanelTask(x, M, K, w.panel(task.p), task.n, ps[task.w].y, w.N(), c0);
    AddRows(ps[task.w].add, w.N(), 0, M, c0, task.n * kPanelCols, ps[task.w].y);
  };
  panel_detail::RunPanelTasks(static_cast<int64_t>(tasks.size()), weights * M, kPanelMinParallel, run);
}

}  // namespace gaf
