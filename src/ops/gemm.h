// float32 matrix products for kernels outside nn.cc: C[M,N] = alpha * op(A) * op(B) + beta * C,
// row-major with leading dimensions. Batch-1 products with a row-major [K,N] B take the streaming
// GEMV (ops/gemv.h); the rest go through oneDNN's sgemm. Inside an OpenMP parallel region the
// product runs on the calling thread.
#pragma once

#include <cstdint>

namespace gaf {

void SgemmF32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

}  // namespace gaf
