// Products of a few rows by float16 weights packed into column panels (ops/panel_gemm.h,
// HalfPanelWeight): a decode step with `--half-weights`.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "ir/half.h"
#include "ir/simd.h"  // GAF_AVX512
#include "ops/kernel_util.h"
#include "ops/nn_internal.h"  // CeilDiv
#include "ops/panel_gemm.h"
#include "ops/panel_tiles.h"

namespace gaf {
using nn_detail::CeilDiv;

namespace {

constexpr int64_t W = kHalfPanelCols;
// Rows of k a stream is prefetched ahead (into L2), as the float32 panels' k-block.
constexpr int64_t kPrefetchRows = 64;
// Weight elements x rows below which one thread is faster than waking the team.
constexpr int64_t kMinParallel = int64_t{1} << 18;

// Panels a task takes side by side for M rows: R * P * 4 accumulators fit the registers to 24.
constexpr int64_t HalfPanelsPerTask(int64_t M) { return M <= 1 ? 4 : M <= 3 ? 2 : 1; }

template <int R, int P>
void HalfTile(const float* x, int64_t ldx, const uint16_t* panels, int64_t K, int64_t stride, float* out,
              int64_t ldo) {
  panel_detail::MultiPanelTile<uint16_t, 4, R, P>(x, ldx, panels, K, stride, kPrefetchRows, out, ldo);
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

void HalfPanelGemmMany(const float* x, int64_t M, int64_t K, const HalfPanelProduct* ps, int count) {
  GAF_CHECK(M >= 1 && M <= kHalfPanelMaxRows, "HalfPanelGemmMany: {} rows (1 to {})", M, kHalfPanelMaxRows);
  struct Task {
    int w;
    int64_t p, n;
  };
  const int64_t group = HalfPanelsPerTask(M);
  std::vector<Task> tasks;
  int64_t weights = 0;
  for (int i = 0; i < count; ++i) {
    const HalfPanelWeight& w = *ps[i].w;
    GAF_CHECK(w.K() == K, "HalfPanelGemmMany: weight {} has K {} (expected {})", i, w.K(), K);
    for (int64_t p = 0; p < w.panels(); p += group) tasks.push_back({i, p, std::min(group, w.panels() - p)});
    weights += K * w.N();
  }
  if (K == 0) {
    for (int i = 0; i < count; ++i) std::fill(ps[i].y, ps[i].y + M * ps[i].w->N(), 0.f);
    return;
  }
  auto run = [&](int64_t t) {
    const Task& task = tasks[t];
    const HalfPanelWeight& w = *ps[task.w].w;
    constexpr int64_t ldo = 4 * W;
    alignas(64) float out[kHalfPanelMaxRows * ldo];
    kTiles[M - 1][task.n - 1](x, K, w.panel(task.p), K, K * W, out, ldo);
    const int64_t c0 = task.p * W, cols = std::min(task.n * W, w.N() - c0);
    for (int64_t m = 0; m < M; ++m) std::memcpy(ps[task.w].y + m * w.N() + c0, out + m * ldo, sizeof(float) * cols);
  };
  panel_detail::RunPanelTasks(static_cast<int64_t>(tasks.size()), weights * M, kMinParallel, run);
}

}  // namespace gaf
