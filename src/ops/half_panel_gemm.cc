// Products by float16 weights packed into column panels (ops/panel_gemm.h, HalfPanelWeight): a
// decode step's few rows streaming several panels at once, and a prompt's rows in whole-K tiles.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "ir/half.h"
#include "ir/simd.h"  // GAF_AVX512
#include "ops/kernel_util.h"
#include "ops/nn_internal.h"  // CeilDiv
#include "ops/panel_gemm.h"
#include "ops/task_team.h"
#include "ops/panel_tiles.h"

namespace gaf {
using nn_detail::CeilDiv;

namespace {

constexpr int64_t W = kHalfPanelCols;
// Rows of k a stream is prefetched ahead (into L2), as the float32 panels' k-block (a tile of one
// panel); a tile of several prefetches kNearRows ahead (ops/panel_tiles.h).
constexpr int64_t kPrefetchRows = 64;
constexpr int kNearRows = 16;
// Weight elements x rows below which one thread is faster than waking the team.
constexpr int64_t kMinParallel = int64_t{1} << 18;

// Panels a task takes side by side for M rows: R * P * 4 accumulators fit the registers to 24.
constexpr int64_t HalfPanelsPerTask(int64_t M) { return M <= 1 ? 4 : M <= 3 ? 2 : 1; }

template <int R, int P>
void HalfTile(const float* x, int64_t ldx, const uint16_t* panels, int64_t K, int64_t stride, float* out,
              int64_t ldo) {
  panel_detail::MultiPanelTile<uint16_t, 4, R, P, kNearRows>(x, ldx, panels, K, stride, kPrefetchRows, out, ldo);
}

using TileFn = void (*)(const float*, int64_t, const uint16_t*, int64_t, int64_t, float*, int64_t);
// kTiles[R - 1][P - 1] (the combinations HalfPanelsPerTask asks for).
constexpr TileFn kTiles[4][4] = {
    {&HalfTile<1, 1>, &HalfTile<1, 2>, &HalfTile<1, 3>, &HalfTile<1, 4>},
    {&HalfTile<2, 1>, &HalfTile<2, 2>, nullptr, nullptr},
    {&HalfTile<3, 1>, &HalfTile<3, 2>, nullptr, nullptr},
    {&HalfTile<4, 1>, nullptr, nullptr, nullptr}};
static_assert(kHalfPanelMaxRows == 4 && HalfPanelsPerTask(1) == 4 && HalfPanelsPerTask(3) == 2 &&
              HalfPanelsPerTask(4) == 1);

// A prompt's rows (more than kHalfPanelMaxRows): tiles of kHalfTileRows rows x the panel's 64
// columns over all of K (panel_tiles.h WholeKTile, float16 widened as it is read), tasks of a
// panel (a gate pair: both) and a range of row tiles (RowRangeTasks). A whole-K tile of float16
// weights ran as fast as the float32 one in a standalone test at 256 rows (0.81-0.84 against
// 0.79-0.81 of the FMA peak, 2 threads, the same minutes), and reads half the bytes.
constexpr int kHalfTileRows = 6;  // 6 rows x 4 vectors: 24 accumulators
static_assert(W == 64);
template <int R>
void HalfRowsTile(const float* x, int64_t ldx, const uint16_t* panel, int64_t K, float* out, int64_t ldo,
                  const char* pf) {
  panel_detail::WholeKTile<uint16_t, 4, R>(x, ldx, panel, K, out, ldo, pf);
}
using RowsTileFn = void (*)(const float*, int64_t, const uint16_t*, int64_t, float*, int64_t, const char*);
constexpr RowsTileFn kRowsTiles[kHalfTileRows] = {&HalfRowsTile<1>, &HalfRowsTile<2>, &HalfRowsTile<3>,
                                                  &HalfRowsTile<4>, &HalfRowsTile<5>, &HalfRowsTile<6>};

void HalfPanelGemmRows(const float* x, int64_t M, int64_t K, const HalfPanelProduct* ps, int count,
                       int64_t weights) {
  struct Unit {
    int w;
    int64_t p;
  };
  std::vector<Unit> units;
  for (int i = 0; i < count; ++i)
    for (int64_t p = 0; p < ps[i].w->panels(); p += ps[i].gated_cols > 0 ? 2 : 1) units.push_back({i, p});
  const std::vector<panel_detail::RowRangeTask> tasks =
      panel_detail::RowRangeTasks(static_cast<int64_t>(units.size()), M, kHalfTileRows);
  auto run = [&](int64_t t, int64_t next_task) {
    const panel_detail::RowRangeTask& task = tasks[t];
    const HalfPanelProduct& prod = ps[units[task.unit].w];
    const HalfPanelWeight& w = *prod.w;
    const int64_t p = units[task.unit].p;
    panel_detail::NextPanels next;  // the panel(s) this thread reads next (panel_tiles.h NextPanelChunk)
    if (next_task >= 0 && tasks[next_task].unit != task.unit) {
      const Unit& u = units[tasks[next_task].unit];
      next.p = ps[u.w].w->panel(u.p);
      next.bytes = (ps[u.w].gated_cols > 0 ? 2 : 1) * K * W * int64_t{sizeof(uint16_t)};
    }
    const bool gated = prod.gated_cols > 0;
    const int64_t calls = (gated ? 2 : 1) * CeilDiv(task.m1 - task.m0, kHalfTileRows);
    int64_t call = 0;
    auto pf = [&] { return panel_detail::NextPanelChunk(next, K, call++, calls); };
    alignas(64) float g[kHalfTileRows * W], u[kHalfTileRows * W];
    for (int64_t m = task.m0; m < task.m1; m += kHalfTileRows) {
      const int64_t r = std::min<int64_t>(kHalfTileRows, task.m1 - m);
      if (const int64_t F = prod.gated_cols; gated) {  // gate panel p, up panel p + 1
        const int64_t c0 = p / 2 * W;
        kRowsTiles[r - 1](x + m * K, K, w.panel(p), K, g, W, pf());
        kRowsTiles[r - 1](x + m * K, K, w.panel(p + 1), K, u, W, pf());
        StoreGated(g, W, u, W, r, std::min(W, F - c0), prod.y + m * F + c0, F);
        continue;
      }
      const int64_t c0 = p * W, cols = std::min(W, w.N() - c0);
      if (cols == W) {  // straight into y
        kRowsTiles[r - 1](x + m * K, K, w.panel(p), K, prod.y + m * w.N() + c0, w.N(), pf());
        continue;
      }
      kRowsTiles[r - 1](x + m * K, K, w.panel(p), K, g, W, pf());
      for (int64_t i = 0; i < r; ++i) std::memcpy(prod.y + (m + i) * w.N() + c0, g + i * W, sizeof(float) * cols);
    }
  };
  panel_detail::RunPanelTasksAhead(static_cast<int64_t>(tasks.size()), weights * M, kMinParallel, run);
}

}  // namespace

HalfPanelWeight::HalfPanelWeight(const float* w, int64_t K, int64_t N)
    : K_(K), N_(N), panels_(CeilDiv(N, W)) {
  packed_ = Tensor(DataType::kFloat16, {K, panels_ * W});  // zeroed: the padding stays 0
  uint16_t* dst = packed_.data<uint16_t>();
  ParallelFor(K, 64, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k)
      for (int64_t p = 0; p < panels_; ++p) {
        const int64_t c0 = p * W, cols = std::min(W, N - c0);
        FloatToHalfRow(w + k * N + c0, dst + p * K * W + k * W, cols);
      }
  });
}

HalfPanelWeight HalfPanelWeight::GatePair(const float* gate, const float* up, int64_t K, int64_t F) {
  HalfPanelWeight hw;
  const int64_t half = CeilDiv(F, W);
  hw.K_ = K;
  hw.N_ = 2 * half * W;
  hw.panels_ = 2 * half;
  hw.packed_ = Tensor(DataType::kFloat16, {K, hw.N_});  // zeroed: the padding stays 0
  uint16_t* dst = hw.packed_.data<uint16_t>();
  ParallelFor(K, 64, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k)
      for (int64_t p = 0; p < hw.panels_; ++p) {
        const int64_t c0 = p / 2 * W, cols = std::min(W, F - c0);
        FloatToHalfRow((p % 2 == 0 ? gate : up) + k * F + c0, dst + p * K * W + k * W, cols);
      }
  });
  return hw;
}

void HalfPanelGemmMany(const float* x, int64_t M, int64_t K, const HalfPanelProduct* ps, int count) {
  GAF_CHECK(M >= 1, "HalfPanelGemmMany: {} rows (at least 1)", M);
  NoteProductRows(M);
  int64_t weights = 0;
  for (int i = 0; i < count; ++i) {
    const HalfPanelWeight& w = *ps[i].w;
    GAF_CHECK(w.K() == K, "HalfPanelGemmMany: weight {} has K {} (expected {})", i, w.K(), K);
    GAF_CHECK(ps[i].gated_cols == 0 || w.N() == 2 * CeilDiv(ps[i].gated_cols, W) * W,
              "HalfPanelGemmMany: weight {} is not a gate pair of {} columns", i, ps[i].gated_cols);
    weights += K * w.N();
  }
  if (K == 0) {  // empty sums (SiLU(0) * 0 for a gate pair)
    for (int i = 0; i < count; ++i)
      std::fill(ps[i].y, ps[i].y + M * (ps[i].gated_cols > 0 ? ps[i].gated_cols : ps[i].w->N()), 0.f);
    return;
  }
  if (M > kHalfPanelMaxRows) return HalfPanelGemmRows(x, M, K, ps, count, weights);
  // Tasks of up to HalfPanelsPerTask(M) panels (a gate pair's: whole pairs, at least two panels),
  // balanced for the threads that claim them (panel_tiles.h BalanceSpanTasks; panels of one size),
  // made once per shape (PanelTaskCache).
  const int threads = panel_detail::TaskThreads();
  std::vector<panel_detail::PanelSpan> own;
  const std::vector<panel_detail::PanelSpan>& tasks = panel_detail::PanelTaskCache::Get(
      M, threads, ps, count, own, [&] {
        const int64_t group = HalfPanelsPerTask(M);
        std::vector<panel_detail::SpanTask> spans;
        for (int i = 0; i < count; ++i) {
          const int64_t g = ps[i].gated_cols > 0 ? std::max<int64_t>(2, group) : group;
          for (int64_t p = 0; p < ps[i].w->panels(); p += g) {
            const int64_t n = std::min(g, ps[i].w->panels() - p);
            spans.push_back({i, p, n, n, ps[i].gated_cols > 0 ? 2 : 1});
          }
        }
        panel_detail::BalanceSpanTasks(spans, threads);
        std::vector<panel_detail::PanelSpan> made;
        made.reserve(spans.size());
        for (const panel_detail::SpanTask& t : spans) made.push_back({t.w, t.p, t.n});
        return made;
      });
  const int64_t panel_bytes = K * W * static_cast<int64_t>(sizeof(uint16_t));  // (ops/task_team.h ReadAhead)
  panel_detail::AnnounceFirstTasks(ps[0].w, static_cast<int64_t>(tasks.size()), panel_bytes, panel_bytes,
                                   [&](int64_t r) {
                                     const panel_detail::PanelSpan& t = tasks[r];
                                     return std::pair<const void*, int64_t>(ps[t.w].w->panel(t.p), t.n);
                                   });
  auto run = [&](int64_t t) {
    const panel_detail::PanelSpan& task = tasks[t];
    const HalfPanelWeight& w = *ps[task.w].w;
    constexpr int64_t ldo = 4 * W;
    alignas(64) float out[kHalfPanelMaxRows * ldo];
    if (kTiles[M - 1][task.n - 1] != nullptr) {
      kTiles[M - 1][task.n - 1](x, K, w.panel(task.p), K, K * W, out, ldo);
    } else {  // a pair at 4 rows: its two panels one after the other
      for (int64_t q = 0; q < task.n; ++q) kTiles[M - 1][0](x, K, w.panel(task.p + q), K, K * W, out + q * W, ldo);
    }
    if (const int64_t F = ps[task.w].gated_cols; F > 0) {
      for (int64_t q = 0; q < task.n / 2; ++q) {
        const int64_t c = (task.p / 2 + q) * W;
        if (c < F)
          StoreGated(out + 2 * q * W, ldo, out + (2 * q + 1) * W, ldo, M, std::min(W, F - c), ps[task.w].y + c, F);
      }
      return;
    }
    const int64_t c0 = task.p * W, cols = std::min(task.n * W, w.N() - c0);
    for (int64_t m = 0; m < M; ++m) std::memcpy(ps[task.w].y + m * w.N() + c0, out + m * ldo, sizeof(float) * cols);
  };
  panel_detail::RunPanelTasks(static_cast<int64_t>(tasks.size()), weights * M, kMinParallel, run);
}

}  // namespace gaf
