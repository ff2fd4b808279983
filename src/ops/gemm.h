// float32 matrix products (gemm.cc) for kernels outside the contraction kernels (which share
// ops/nn_internal.h), and MatMul by a constant weight prepared for prompts (PreparedMatMul,
// matmul_dnnl.cc).
//
// SgemmF32: C[M,N] = alpha * op(A) * op(B) + beta * C,
// row-major with leading dimensions. Batch-1 products with a row-major [K,N] B take the streaming
// GEMV (ops/gemv.h); the rest go through oneDNN's sgemm. Inside an OpenMP parallel region the
// product runs on the calling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "ops/kernel.h"
#include "ops/panel_gemm.h"

namespace gaf {

void SgemmF32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// Per-batch offsets (in elements) of a [..., R, C] operand whose batch dims `batch_shape` broadcast
// to `out_batch` (MatMul's batch broadcasting), one per output batch in row-major order.
std::vector<int64_t> BatchOffsets(const Shape& batch_shape, int64_t mat_size, const Shape& out_batch);


// A float32 MatMul by a constant [K, N] weight, prepared for prompts and small batches: every row
// count runs on a copy of the weight packed into column panels (ops/panel_gemm.h), made on the first
// product. A few rows stream it at the memory's pace; a prompt's rows run in register tiles over all
// of K (oneDNN's matmul on its own packed weight was no faster, and would be a second copy). A row's
// result has the same bits whatever the row count, so a prompt's rows equal their decode steps'.
// Builds without AVX-512 take oneDNN's matmul from kPackedMatMulMinRows rows (RunLibrary).
class PreparedMatMul {
 public:
  explicit PreparedMatMul(Tensor weight);
  ~PreparedMatMul();
  int64_t K() const { return weight_.dim(0); }
  int64_t N() const { return weight_.dim(1); }
  const Tensor& weight() const { return weight_; }
  // C[M, N] = A[M, K] * W, row-major and contiguous.
  void Run(const float* A, int64_t M, float* C) const;
  // The same product by oneDNN's matmul, on a copy of the weight reordered once into the layout
  // that primitive asks for (one primitive per row count): the prompts of builds without AVX-512,
  // and bench/decode_gemv_bench's reference at more than kPanelMaxRows rows.
  void RunLibrary(const float* A, int64_t M, float* C) const;
  // The panel copy (made on the first call).
  const PanelWeight& panels() const;
  // Copies of the weight made so far: the panel copy, and one per layout a library primitive
  // asked for.
  size_t packed_copies() const;

 private:
  struct Impl;
  Tensor weight_;
  std::unique_ptr<Impl> impl_;
};

// The PreparedMatMul of a weight for kernels made apart from a session's (a fused function's
// MatMul stage, one kernel per call site and shape class): one per weight buffer and shape while
// any of them holds it, so the variants of a call site share one packed copy. It keeps the weight's
// storage, so the buffer is not another weight's while the entry lives.
std::shared_ptr<PreparedMatMul> SharedPreparedMatMul(const Tensor& weight);

// Rows from which PreparedMatMul takes oneDNN's matmul on its packed weight in builds without
// AVX-512 (below, and always with AVX-512: the panels).
inline constexpr int64_t kPackedMatMulMinRows = kPanelMaxRows + 1;
// Weights (elements) from which a MatMul is prepared: below, oneDNN's sgemm on the weight as given
// is as fast, and the matmul primitive (created per row count) and its threads cost more than they
// save; under CPU contention its parallel regions on tiny products made a whole run 100x slower.
inline constexpr int64_t kPackedMatMulMinWeight = int64_t{1} << 18;

// Kernels for a MatMul node (inputs A, W) and a SiblingMatMul node (A, W_1..W_n) of the plan with
// these prepared weights (for SiblingMatMul, null where a weight is not prepared: it takes sgemm);
// other input types run the registry's kernel.
KernelInfo PreparedMatMulKernel(std::shared_ptr<PreparedMatMul> mm);
KernelInfo PreparedSiblingMatMulKernel(std::vector<std::shared_ptr<PreparedMatMul>> mms);
// A ResidualMatMul node (A, W, R: A W + R, a residual Add after the product) with W prepared: R of
// the product's shape is added where each task stores its sums (PanelProduct::add) up to
// kPanelMaxRows rows (a decode step: no Add node to dispatch), in one pass after the product for
// more (a prompt); a broadcast R or other types run the registry's kernel (the MatMul and the Add).
KernelInfo PreparedResidualMatMulKernel(std::shared_ptr<PreparedMatMul> mm);
// The product a ResidualMatMul kernel runs, by a constant [K, N] weight (its prepared float32
// panels, or float16 ones: codegen/half_weights.cc).
struct ResidualProduct {
  int64_t K = 0, N = 0;
  // Whether `run` takes M rows (else the node's registry kernel runs: the MatMul and the Add).
  std::function<bool(int64_t M)> takes;
  // y[M, N] = a[M, K] W, plus add[M, N] where it returns true (added in its tasks); false: y is
  // the product alone and the kernel adds in one pass after it.
  std::function<bool(const float* a, int64_t M, float* y, const float* add)> run;
  // The node's outputs where the addend broadcasts to the product's shape (M rows); unset: the
  // registry's kernel (the fallback graph: the MatMul, the Add, the norm).
  std::function<void(KernelContext& ctx, int64_t M)> broadcast;
};
// The ResidualMatMul node's kernel around `product`: the node's checks and outputs, the product,
// the addend where the product did not add it, and with `norm` the RMSNorm of each row of the sum
// while it is in L1 (ops/rms_norm.cc's arithmetic), in one pass over the rows.
KernelInfo ResidualMatMulKernelOf(ResidualProduct product);
ResidualProduct PreparedResidualProduct(std::shared_ptr<PreparedMatMul> mm);
// A GatedMatMul node (A, W_gate, W_up: SiLU(A W_gate) * (A W_up)) with both weights prepared: the
// rows run on one panel copy of the pair (PanelWeight::GatePair, made on the first call) and apply
// the gate in each task; a prompt without AVX-512 takes the two prepared products, then the gate.
KernelInfo PreparedGatedMatMulKernel(std::shared_ptr<PreparedMatMul> gate, std::shared_ptr<PreparedMatMul> up);

// A Gemm node (Y = alpha * A' * B' + beta * C) with a constant float32 B of at least
// kPackedMatMulMinWeight elements, transA 0 and alpha 1 (torch's Linear, a classifier head): B as
// a [K, N] weight (transposed once when transB), prepared; null for other nodes. Its kernel runs
// the product on the prepared weight and adds beta * C for a C of N values ([N] or [1, N]); other
// inputs run the registry's Gemm.
std::shared_ptr<PreparedMatMul> PrepareGemm(const Node& node, const Tensor& b);
KernelInfo PreparedGemmKernel(std::shared_ptr<PreparedMatMul> mm);

}  // namespace gaf
