// Products of a few rows by a weight packed into column panels (ops/panel_gemm.h).
#include "ops/panel_gemm.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "ir/simd.h"  // GAF_AVX512
#include "ops/kernel_util.h"
#include "ops/nn_internal.h"  // CeilDiv

namespace gaf {
using nn_detail::CeilDiv;

namespace {

// Rows of one register tile (6 x 4 accumulators + 4 weight vectors + a broadcast fit the 32
// vector registers), and the k-block a weight panel is taken in (64 x 64 floats = 16 KiB: in L1
// for the tiles after the first).
constexpr int kTileRows = 6;
constexpr int64_t kKBlock = 64;
// A single sequential stream per core is held back by the hardware prefetchers (about 9 of the
// 12 GB/s one core reads here, bench/decode_gemv_bench), so the tiles prefetch the next k-block
// between them (into L2) while they work on this one: the stream keeps going while the later
// tiles work from L1. (Prefetching only ahead of each tile left memory idle during all but the
// first; 2 or 4 blocks ahead, or 128-row blocks, were slower.)
// Weight elements x rows below which one thread is faster than waking the team.
constexpr int64_t kPanelMinParallel = int64_t{1} << 18;

// out[r][0:64] (+)= sum over k in [k0, k1) of x[r * ldx + k] * panel[k][0:64], r < R; out rows 64
// floats apart. The sums run over k in order. Iteration i prefetches the 4 lines at pf + i * pf_step
// into L2.
template <int R>
void Tile(const float* x, int64_t ldx, const float* panel, int64_t k0, int64_t k1, float* out, bool first,
          const char* pf, int64_t pf_step) {
#if GAF_AVX512
  // Fully unrolled (GCC at -O2 keeps a loop-indexed accumulator array on the stack otherwise).
  __m512 acc[R][4];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) acc[r][j] = first ? _mm512_setzero_ps() : _mm512_load_ps(out + r * 64 + 16 * j);
  const float* q = panel + k0 * kPanelCols;
  for (int64_t k = k0; k < k1; ++k, q += kPanelCols) {
    constexpr _mm_hint kHint = _MM_HINT_T1;
    _mm_prefetch(pf, kHint), _mm_prefetch(pf + 64, kHint), _mm_prefetch(pf + 128, kHint),
        _mm_prefetch(pf + 192, kHint);
    pf += pf_step;
    const __m512 w0 = _mm512_load_ps(q), w1 = _mm512_load_ps(q + 16), w2 = _mm512_load_ps(q + 32),
                 w3 = _mm512_load_ps(q + 48);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 b = _mm512_set1_ps(x[r * ldx + k]);
      acc[r][0] = _mm512_fmadd_ps(b, w0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(b, w1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(b, w2, acc[r][2]);
      acc[r][3] = _mm512_fmadd_ps(b, w3, acc[r][3]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) _mm512_store_ps(out + r * 64 + 16 * j, acc[r][j]);
#else
  float acc[R][kPanelCols];
  for (int r = 0; r < R; ++r)
    for (int64_t j = 0; j < kPanelCols; ++j) acc[r][j] = first ? 0.f : out[r * 64 + j];
  for (int64_t k = k0; k < k1; ++k) {
    const float* q = panel + k * kPanelCols;
    for (int r = 0; r < R; ++r) {
      const float b = x[r * ldx + k];
#pragma omp simd
      for (int64_t j = 0; j < kPanelCols; ++j) acc[r][j] = std::fma(b, q[j], acc[r][j]);
    }
  }
  for (int r = 0; r < R; ++r) std::memcpy(out + r * 64, acc[r], sizeof(acc[r]));
#endif
}

void TileRows(int rows, const float* x, int64_t ldx, const float* panel, int64_t k0, int64_t k1, float* out,
              bool first, const char* pf, int64_t pf_step) {
  switch (rows) {
    case 1: return Tile<1>(x, ldx, panel, k0, k1, out, first, pf, pf_step);
    case 2: return Tile<2>(x, ldx, panel, k0, k1, out, first, pf, pf_step);
    case 3: return Tile<3>(x, ldx, panel, k0, k1, out, first, pf, pf_step);
    case 4: return Tile<4>(x, ldx, panel, k0, k1, out, first, pf, pf_step);
    case 5: return Tile<5>(x, ldx, panel, k0, k1, out, first, pf, pf_step);
    default: return Tile<6>(x, ldx, panel, k0, k1, out, first, pf, pf_step);
  }
}

// y[0:M, c0:c0+cols] = x * panel, through a block of M x 64 sums: the rows in tiles of nearly
// equal size that take each k-block in turn (from L1 after the first), each tile prefetching its
// share of the next k-block. (Cutting K into 2 or 4 segments read round-robin, for more streams
// per core, was no faster.)
void PanelTask(const float* x, int64_t M, int64_t K, const float* panel, float* y, int64_t ldy, int64_t c0,
               int64_t cols) {
  alignas(64) float out[kPanelMaxRows * kPanelCols];
  const int64_t tiles = CeilDiv(M, kTileRows);
  constexpr int64_t kRowBytes = kPanelCols * sizeof(float);
  for (int64_t k0 = 0; k0 < K; k0 += kKBlock) {
    const int64_t k1 = std::min(K, k0 + kKBlock);
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t m0 = M * t / tiles, m1 = M * (t + 1) / tiles;
      const char* pf = reinterpret_cast<const char*>(panel + k1 * kPanelCols) + t * (kKBlock * kRowBytes / tiles);
      TileRows(static_cast<int>(m1 - m0), x + m0 * K, K, panel, k0, k1, out + m0 * kPanelCols, k0 == 0, pf,
               kRowBytes / tiles);
    }
  }
  for (int64_t m = 0; m < M; ++m) std::memcpy(y + m * ldy + c0, out + m * kPanelCols, sizeof(float) * cols);
}

}  // namespace

PanelWeight::PanelWeight(const float* w, int64_t K, int64_t N)
    : K_(K), N_(N), panels_(CeilDiv(N, kPanelCols)),
      packed_(Tensor::Uninitialized(DataType::kFloat, {panels_, K, kPanelCols})) {
  float* dst = packed_.data<float>();
  ParallelFor(panels_, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t c0 = p * kPanelCols, cols = std::min(kPanelCols, N - c0);
      float* d = dst + p * K * kPanelCols;
      for (int64_t k = 0; k < K; ++k, d += kPanelCols) {
        std::memcpy(d, w + k * N + c0, sizeof(float) * cols);
        if (cols < kPanelCols) std::memset(d + cols, 0, sizeof(float) * (kPanelCols - cols));
      }
    }
  });
}

void PanelGemmMany(const float* x, int64_t M, int64_t K, const PanelProduct* ps, int count) {
  GAF_CHECK(M >= 1 && M <= kPanelMaxRows, "PanelGemmMany: {} rows (1 to {})", M, kPanelMaxRows);
  std::vector<int64_t> first_task(count + 1, 0);
  int64_t weights = 0;
  for (int i = 0; i < count; ++i) {
    GAF_CHECK(ps[i].w->K() == K, "PanelGemmMany: weight {} has K {} (expected {})", i, ps[i].w->K(), K);
    first_task[i + 1] = first_task[i] + ps[i].w->panels();
    weights += K * ps[i].w->N();
  }
  const int64_t tasks = first_task[count];
  auto run = [&](int64_t t) {
    int i = 0;
    while (t >= first_task[i + 1]) ++i;
    const PanelWeight& w = *ps[i].w;
    const int64_t p = t - first_task[i], c0 = p * kPanelCols;
    PanelTask(x, M, K, w.panel(p), ps[i].y, w.N(), c0, std::min(kPanelCols, w.N() - c0));
  };
  const bool team = !omp_in_parallel() && tasks > 1 && weights * M >= kPanelMinParallel && omp_get_max_threads() > 1;
  if (!team) {
    for (int64_t t = 0; t < tasks; ++t) run(t);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < tasks; ++t) run(t);
}

}  // namespace gaf
