// What the attention plan nodes share (ops/grouped_matmul.cc, ops/fused_attention.cc).
#pragma once

#include <cstdint>
#include <vector>

#include "ir/tensor.h"
#include "ops/attention_kernels.h"

namespace gaf {

// Repeat factor r when Reshape(Expand(Unsqueeze(x, 2), e), s) of x = [b, g, t, d] is [b, g*r, t, d]
// with each cache head repeated r times (torch's repeat_kv); 0 otherwise.
int64_t KvRepeat(const Shape& x, const std::vector<int64_t>& e, const std::vector<int64_t>& s);

// One head of a present cache Concat(past, new) on the cache axis: `tp` past rows then `tn` new
// rows of `w` floats each, into `present` (the past from cache, just read by the product).
void CopyAppendedHead(float* present, const float* past, int64_t tp, const float* cur, int64_t tn, int64_t w);

// C[M,N] (+)= A[M,K] * op(B) (op: transposed when trans_b), A's rows lda apart, C's ldc apart: one
// segment of a cache's rows in an attention product (the decode kernels where this machine and
// shape have them, the library otherwise). GroupedMatMul's appending products and FusedAttention's
// decode steps sum in the same order through it. pf: what a decode step's kernels ask for ahead of
// their reads (DecodeAhead; the AVX-512 kernels take it, the library's products do not).
void AttentionSegment(int64_t M, int64_t N, int64_t K, bool trans_b, const float* A, int64_t lda, const float* B,
                      float* C, int64_t ldc, bool accumulate, const DecodeAhead& pf = {});

}  // namespace gaf
