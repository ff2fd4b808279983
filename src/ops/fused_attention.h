// FusedAttention (ops/fused_attention.cc): what a generation's decode steps did with their key and
// value caches, for reports (`autofusion generate`).
#pragma once

#include <cstdint>
#include <vector>

namespace gaf {

// Present caches the fused attention's decode steps made, since the process started (every
// session and thread): appended in place in the past's storage (Tensor::AppendInPlace), moved
// into new storage with room (the first step after a prompt, or the room ran out), or copied into
// a new present (a run that does not make caches with room).
struct CacheAppendCounts {
  int64_t in_place = 0, new_room = 0, copied = 0;
  int64_t total() const { return in_place + new_room + copied; }
};
CacheAppendCounts CacheAppendTotals();

// Rows per head of a new cache with room for a present of t rows: half again, at least 64 more
// (the copies of a generation amortized over the steps that append in place). The fused attention
// and ONNX's Attention (ops/attention_op.cc) make their caches with it.
int64_t CacheRoomFor(int64_t t);

// A prompt's keys an additive mask all but removes (finfo.min, as exporters write a causal mask)
// may be skipped when the scores prove them nothing: mask values at or below kMaskCandidate may
// mark skipped keys, and each skipped score (its mask value plus a bound on |q . k| times the
// scale) must lie more than kZeroMargin below its row's largest computed score, where the
// softmax's exp gives exactly 0 (below -87). FusedAttention and ONNX's Attention skip so.
inline constexpr float kMaskCandidate = -1e4f;
inline constexpr float kZeroMargin = 100.f;
// The largest |k_j| over the t rows of k (d apart), infinity when a row is not finite; *finite:
// whether every value is.
void RowNorms(const float* k, int64_t t, int64_t d, float* max_norm, bool* finite);
// Per row of a float mask [rows, T]: how many leading keys to compute (past them every value is at
// most kMaskCandidate; all T when no value or every one is) and the largest value of the rest
// (-inf for none).
void MaskTails(const float* mask, int64_t rows, int64_t T, std::vector<int64_t>* extent, std::vector<float>* tail);
// The same for one row mr[0, T).
void MaskTail(const float* mr, int64_t T, int64_t* extent, float* tail);
// How many of the first n values of a mask row are 0 or -0 (where adding the mask changes no score).
int64_t MaskZeroLead(const float* mr, int64_t n);

}  // namespace gaf
