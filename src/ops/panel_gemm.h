// Products of rows by a constant weight packed into column panels: C[M, N] = A[M, K] * W[K, N]
// (a decode step's row, a small batch, a prompt).
//
// Why: a row-major weight read k by k for a register tile of rows strides by N floats per k (the
// prefetchers lose it), and reading it row by row as the GEMV does keeps the sums in memory (its
// multi-row form is bound by loads and adds at 40-80 GFLOPS at 2 threads here). A panel is kPanelCols columns of W
// for every k, stored contiguously ([k][kPanelCols]; the last panel is as wide as the columns left,
// rounded up to 16 and padded with zeros), so a register tile of up to 8 rows x 48 columns sums over
// all of K with one FMA per weight vector per row while the weight streams in order. Up to
// kPanelMaxRows rows the tiles take K in blocks and prefetch (the memory's pace matters); more rows
// (a prompt) run each 8-row tile over all of K with the panel in L2 (the FMAs' pace matters).
//
// Every element is summed over k in order (no split of K), so results depend neither on the
// thread count nor on how the rows are tiled: a row has the same bits in a prompt as alone.
#pragma once

#include <algorithm>
#include <cstdint>

#include "ir/tensor.h"

namespace gaf {

inline constexpr int64_t kPanelCols = 48;
// Rows up to which the tiles take K in blocks with prefetches (bench/decode_gemv_bench --rows at 2
// threads here, against oneDNN's matmul on its packed weight: 8 and 16 rows 1.3-1.4x faster, 24-96
// rows 1.15-1.28x, 128 rows 1.04x, 256 rows 0.93x); more rows take the whole of K per tile.
inline constexpr int64_t kPanelMaxRows = 128;

class PanelWeight {
 public:
  PanelWeight() = default;
  // Packs w[K, N] (row-major, contiguous), in parallel.
  PanelWeight(const float* w, int64_t K, int64_t N);
  // A SwiGLU MLP's gate and up weights (each [K, F], row-major) as one weight whose panels
  // alternate: gate columns [48q, 48q + 48), then up's same columns, each panel full (zeros past F).
  // Its N() is 2 * 48 * ceil(F / 48). A product by it with PanelProduct::gated_cols = F writes
  // SiLU(x G) * (x U), [M, F]: each task holds both sums of its outputs (in its tile's buffer on
  // the stack) and writes only the gated value.
  static PanelWeight GatePair(const float* gate, const float* up, int64_t K, int64_t F);
  int64_t K() const { return K_; }
  int64_t N() const { return N_; }
  int64_t panels() const { return panels_; }
  // Panel p: columns [p * kPanelCols, +kPanelCols) as vectors(p) * 16 floats per k.
  const float* panel(int64_t p) const { return packed_.data<float>() + p * K_ * kPanelCols; }
  int vectors(int64_t p) const {
    return static_cast<int>((std::min(kPanelCols, N_ - p * kPanelCols) + 15) / 16);
  }
  int64_t bytes() const { return packed_.nbytes(); }

 private:
  int64_t K_ = 0, N_ = 0, panels_ = 0;
  Tensor packed_;
};

struct PanelProduct {
  const PanelWeight* w;
  float* y;  // [M, w->N()] row-major, leading dimension w->N(); [M, gated_cols] for a gate pair
  int64_t gated_cols = 0;  // > 0: w is a GatePair of that many columns; y = SiLU(x G) * (x U)
  // Not null (no gate pair): [M, w->N()] like y, added to the sums where each task stores them,
  // y = x W + add (a residual Add after the product: its bits, the sums read back from L1 instead
  // of a pass over both tensors).
  const float* add = nullptr;
};

// y_i = x[M, K] * W_i for each product (x row m at x + m * K), as one set of tasks (one per panel
// of every weight; for more than kPanelMaxRows rows, one per panel and range of rows) taken
// dynamically by the threads. M must be at least 1 and every
// weight's K the same.
void PanelGemmMany(const float* x, int64_t M, int64_t K, const PanelProduct* ps, int count);

// The same products on float16 storage of the weight (`--half-weights`): panels of kHalfPanelCols
// columns of IEEE float16 bits ([k][kHalfPanelCols], the last panel padded with zeros), widened to
// float32 while they stream. Up to kHalfPanelMaxRows rows (a decode step's) a task takes several
// panels side by side (as PanelGemmMany does for a few rows), so each core keeps several streams
// going; more rows (a prompt) run in whole-K tiles of 6 rows. Each element sums over k in order,
// in float32, so a row has the same bits alone as in a batch or a prompt.
inline constexpr int64_t kHalfPanelCols = 64;
inline constexpr int64_t kHalfPanelMaxRows = 4;

class HalfPanelWeight {
 public:
  HalfPanelWeight() = default;
  // Rounds w[K, N] (row-major, contiguous) to float16 (to nearest even) and packs it, in parallel.
  HalfPanelWeight(const float* w, int64_t K, int64_t N);
  // The gate and up weights as one, panels alternating (as PanelWeight::GatePair, 64 columns).
  static HalfPanelWeight GatePair(const float* gate, const float* up, int64_t K, int64_t F);
  int64_t K() const { return K_; }
  int64_t N() const { return N_; }
  int64_t panels() const { return panels_; }
  const uint16_t* panel(int64_t p) const { return packed_.data<uint16_t>() + p * K_ * kHalfPanelCols; }
  int64_t bytes() const { return static_cast<int64_t>(packed_.nbytes()); }

 private:
  int64_t K_ = 0, N_ = 0, panels_ = 0;
  Tensor packed_;  // float16, 64-byte aligned
};

struct HalfPanelProduct {
  const HalfPanelWeight* w;
  float* y;  // [M, w->N()] row-major; [M, gated_cols] for a gate pair
  int64_t gated_cols = 0;  // > 0: w is a GatePair of that many columns; y = SiLU(x G) * (x U)
};

// y[m, c] = SiLU(g[m * ldg + c]) * u[m * ldu + c] for c < cols, m < M (y's leading dimension ldy):
// the SiLUGate kernel's arithmetic (ops/silu_gate.cc), so the pair's results have its bits.
void StoreGated(const float* g, int64_t ldg, const float* u, int64_t ldu, int64_t M, int64_t cols, float* y,
                int64_t ldy);

// y_i = x[M, K] * W_i for each product, as one set of tasks taken dynamically by the threads;
// M at least 1, every weight's K the same.
void HalfPanelGemmMany(const float* x, int64_t M, int64_t K, const HalfPanelProduct* ps, int count);

}  // namespace gaf
