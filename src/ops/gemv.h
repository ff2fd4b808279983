// Matrix-vector products with a row-major weight, as in the decode step of an LLM, and the
// float16-weight variants: y[0:N] (+)= x[0:K] * W[K,N], W[k][n] at w[k * ldw + n].
//
// The work is split into tasks (row chunks x column pieces) taken dynamically by the OpenMP
// threads (one thread when called inside a parallel region). The split depends on K and N only
// and every output column is summed in a fixed order, so results do not depend on the thread
// count. Accumulation is in float32.
#pragma once

#include <cstdint>

namespace gaf {

// y = x * W, or y += x * W when accumulate.
void GemvF32(const float* x, const float* w, int64_t ldw, float* y, int64_t K, int64_t N,
             bool accumulate);

// y[n] = alpha * sum_k x[k] * W[n][k] + beta * y[n] for n in [0, N): the product by a weight
// stored transposed, [N, K] with W[n][k] at w[n * ldw + k] (Gemm with transB=1 on one row: a
// classifier head), as dot products of W's rows.
void GemvRowsF32(const float* x, const float* w, int64_t ldw, float* y, int64_t K, int64_t N, float alpha,
                 float beta);

// Several products of the same x (the query/key/value or gate/up projections of a decode step):
// y_i = x * W_i, run as one set of tasks over all the weights, so the threads stream them without
// a barrier between products. Each y_i is what GemvF32 gives (same summation order).
struct GemvOutput {
  const float* w;
  int64_t ldw;
  float* y;
  int64_t N;
};
void GemvF32Many(const float* x, int64_t K, const GemvOutput* outs, int count);
// The same for M rows of x (row m at x + m * K; y_i's row m at y_i + m * N_i), each weight read
// once for all rows (meant for a few rows: a small batch's decode step).
void GemvF32ManyRows(const float* x, int64_t M, int64_t K, const GemvOutput* outs, int count);

// As GemvF32 with W stored as IEEE float16 bits, widened to float while streaming.
void GemvF16(const float* x, const uint16_t* w_half, int64_t ldw, float* y, int64_t K, int64_t N,
             bool accumulate);

// Several products of the same M rows of x by float16 weights (the decode step's q/k/v or
// gate/up with float16 storage), as GemvF32ManyRows: one set of tasks, each weight read once for
// all rows; each y_i row is what GemvF16 gives that row alone.
struct GemvHalfOutput {
  const uint16_t* w;
  int64_t ldw;
  float* y;
  int64_t N;
};
void GemvF16ManyRows(const float* x, int64_t M, int64_t K, const GemvHalfOutput* outs, int count);

// dst[i] = float16 bits of src[i], rounded to nearest even (overflow to inf, NaN kept quiet).
void ConvertToHalf(const float* src, uint16_t* dst, int64_t n);

}  // namespace gaf
