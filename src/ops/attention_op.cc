// ONNX's Attention operator (opsets 23 and 24), as exporters that target recent opsets write a
// transformer's attention, decode steps with a key/value cache included:
//
//   inputs   Q, K, V [, attn_mask, past_key, past_value, nonpad_kv_seqlen (24)]
//            4-D [batch, heads, sequence, head size], or 3-D [batch, sequence, heads * head size]
//            with q_num_heads and kv_num_heads; past_* 4-D
//   outputs  Y [, present_key, present_value, qk_matmul_output]
//   attrs    is_causal, kv_num_heads, q_num_heads, qk_matmul_output_mode, scale, softcap,
//            softmax_precision (float32 here always)
//
// Per cache head (and batch), its query heads' rows together (grouped-query attention: query head
// h reads cache head h / (q_heads / kv_heads)): the scores against the present keys, scaled, soft-
// capped, the mask, causal and padding bias added, a softmax (a row with every key masked gives
// zeros), then the products with the present values. The scores stay in a buffer of the thread
// (unless qk_matmul_output asks for them); the products are those of the fused decode attention
// (AttentionSegment). The present caches: in a generation (KernelContext::cache_room) the new rows
// are appended to the past's storage in place where it has room (as the fused attention does), so
// a decode step does not copy its whole cache.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "ops/attention_kernels.h"
#include "ops/copy_kernels.h"
#include "ops/fused_attention.h"
#include "ops/grouped_matmul.h"
#include "ops/kernel.h"
#include "ops/kernel_util.h"

namespace gaf {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Scores a task holds at once (floats): a long prompt's query rows go in blocks.
constexpr int64_t kScoreFloats = int64_t{1} << 22;
// A prompt (at least kSkipMinRows positions) goes in blocks of kSkipRows query rows, each computing
// the keys its rows may attend.
constexpr int64_t kSkipMinRows = 16;
constexpr int64_t kSkipRows = 64;
// Multiply-adds of a call below which its heads run on the calling thread.
constexpr int64_t kParallelMultiplyAdds = int64_t{1} << 16;


// Asks for n floats from p into L2 (prefetch instructions: no fault, no wait).
void PrefetchRows(const float* p, int64_t n) {
  const char* b = reinterpret_cast<const char*>(p);
  for (int64_t off = 0; off < n * static_cast<int64_t>(sizeof(float)); off += 64) __builtin_prefetch(b + off, 0, 2);
}

// One past the last true of m[0, n) (0: none), eight bytes at a time.
int64_t LastTrue(const bool* m, int64_t n) {
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, m + n - 8, 8);
    if (w != 0) break;
    n -= 8;
  }
  while (n > 0 && !m[n - 1]) --n;
  return n;
}

bool AllFinite(const float* x, int64_t n) {
  bool ok = true;
#pragma omp simd reduction(&& : ok)
  for (int64_t i = 0; i < n; ++i) ok = ok && std::isfinite(x[i]);
  return ok;
}

// The largest of x[0, n) (-inf for none). (A vector max from OpenMP's reduction; under clang its
// lanes start at the lowest finite float, so a row of -inf is redone in order.)
float RowMax(const float* x, int64_t n) {
  float top = kNegInf;
#pragma omp simd reduction(max : top)
  for (int64_t i = 0; i < n; ++i) top = top > x[i] ? top : x[i];
  if (top <= std::numeric_limits<float>::lowest()) {
    top = kNegInf;
    for (int64_t i = 0; i < n; ++i) top = std::max(top, x[i]);
  }
  return top;
}

// row[j] for the true m[j], -inf for the false ones, j in [0, n). (GCC leaves the plain loop
// scalar: a byte compare and a float select per key.)
void SelectRow(float* row, const bool* m, int64_t n) {
  int64_t j = 0;
#if defined(__AVX512BW__) && defined(__AVX512VL__)
  const __m512 neg = _mm512_set1_ps(kNegInf);
  for (; j + 16 <= n; j += 16) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(m + j));
    const __mmask16 k = _mm_test_epi8_mask(b, b);
    _mm512_storeu_ps(row + j, _mm512_mask_blend_ps(k, neg, _mm512_loadu_ps(row + j)));
  }
#endif
  for (; j < n; ++j) row[j] = m[j] ? row[j] : kNegInf;
}

// A [B, H, rows, D] operand in cache layout: head (b, h) starts at data + (b * H + h) * stride.
struct Heads {
  const float* data = nullptr;
  int64_t stride = 0;
};

// What a prompt's blocks may skip. Per cache head: one past its last value row that is not finite
// (0: all finite; keys from there on may be skipped, their probability 0 times a finite value
// adding exactly 0). With a float mask of large finite negatives (mf; finfo.min, as exports write
// an additive causal mask), per mask row the leading keys to compute (past them every value is at
// most kMaskCandidate; all when none or every one is) and the largest value of the rest, and per
// cache head the largest |k| (infinite: no such skipping). See kZeroMargin.
struct KeySkips {
  std::vector<int64_t> finite_from, extent;
  std::vector<float> tail, kmax;
};

KeySkips PrepareKeySkips(const float* mf, int64_t mask_rows, int64_t Tm, Heads kh, Heads vh, int64_t heads,
                         int64_t T, int64_t Dq, int64_t Dv) {
  KeySkips k;
  k.finite_from.assign(static_cast<size_t>(heads), 0);
  ParallelFor(heads, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* v = vh.data + t * vh.stride;
      for (int64_t j = T; j > 0; --j)
        if (!AllFinite(v + (j - 1) * Dv, Dv)) {
          k.finite_from[static_cast<size_t>(t)] = j;
          break;
        }
    }
  });
  if (mf == nullptr) return k;
  MaskTails(mf, mask_rows, Tm, &k.extent, &k.tail);
  k.kmax.resize(static_cast<size_t>(heads));
  ParallelFor(heads, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      bool finite = true;
      RowNorms(kh.data + t * kh.stride, T, Dq, &k.kmax[static_cast<size_t>(t)], &finite);
    }
  });
  return k;
}

// A row's scores [0, cols) after the mask: before `lim` the bool mask's false keys at -inf or the
// float mask added (mask row at mb or mf, `ms` apart; neither: as they are), from `lim` on -inf.
void MaskRow(float* row, int64_t lim, int64_t cols, const bool* mb, const float* mf, int64_t ms) {
  if (mb != nullptr) {
    if (ms == 1) {
      SelectRow(row, mb, lim);
    } else {
      for (int64_t j = 0; j < lim; ++j) row[j] = mb[j * ms] ? row[j] : kNegInf;
    }
  } else if (mf != nullptr) {
    if (ms == 1) {
#pragma omp simd
      for (int64_t j = 0; j < lim; ++j) row[j] += mf[j];
    } else {
      for (int64_t j = 0; j < lim; ++j) row[j] += mf[j * ms];
    }
  }
  std::fill(row + lim, row + cols, kNegInf);
}

// The present cache of past (may be absent) and the new rows `cur` (4-D [B, H, L, D], or 3-D
// [B, L, H * D] when heads3d > 0), as a tensor [B, H, P + L, D]; appended in place to a past
// with room when the run allows it.
Tensor PresentOf(const Tensor* past, const Tensor& cur, int64_t heads3d, int64_t D, bool cache_room,
                 const NodeDescription& where, const char* what) {
  const bool three = cur.rank() == 3;
  const int64_t B = cur.dim(0), H = three ? heads3d : cur.dim(1), L = three ? cur.dim(1) : cur.dim(2);
  if (past != nullptr && (past->rank() != 4 || past->dim(0) != B || past->dim(1) != H || past->dim(3) != D))
    throw Error(fmt::format("{}: {} of shape {} does not match the new rows' [{}, {}, *, {}]", where, what,
                            ShapeToString(past->shape()), B, H, D));
  const int64_t P = past != nullptr ? past->dim(2) : 0;
  const int64_t T = CheckedAdd(P, L, "present cache length");
  const Shape shape{B, H, T, D};
  Tensor present;
  bool in_place = false;
  if (past == nullptr && !three) return cur;  // no cache: the keys as they are
  if (past != nullptr && cache_room) {
    present = past->AppendInPlace(L);
    in_place = present.defined();
    if (!in_place) {
      try {
        present = Tensor::WithCacheRoom(DataType::kFloat, shape, CacheRoomFor(T));
      } catch (const Error&) {  // the room past the memory limit: a cache without room
        present = Tensor::Uninitialized(DataType::kFloat, shape);
      }
    }
  } else {
    present = Tensor::Uninitialized(DataType::kFloat, shape);
  }
  float* dst = present.cache_data<float>();
  const int64_t ds = present.head_stride();
  const float* c = cur.data<float>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      float* o = dst + (b * H + h) * ds;
      if (past != nullptr && !in_place)
        std::copy_n(past->cache_data<float>() + (b * H + h) * past->head_stride(), P * D, o);
      for (int64_t l = 0; l < L; ++l) {
        const float* src = three ? c + ((b * L + l) * H + h) * D : c + ((b * H + h) * L + l) * D;
        std::copy_n(src, D, o + (P + l) * D);
      }
    }
  return present;
}

// An Attention call's mask: bool (true attends) or float (added), its element strides over
// [B, Hq, S, Tm] (right-aligned broadcast; 0 where it broadcasts), Tm <= T its keys (those past
// it masked). No mask: neither pointer, Tm = T.
struct AttentionMask {
  const bool* mb = nullptr;
  const float* mf = nullptr;
  int64_t mst[4] = {0, 0, 0, 0};
  int64_t Tm = 0;
};

AttentionMask MaskOf(const Tensor* mask, int64_t B, int64_t Hq, int64_t S, int64_t T, const NodeDescription& where) {
  AttentionMask m;
  m.Tm = T;
  if (mask == nullptr) return m;
  if (mask->rank() < 1 || mask->rank() > 4)
    throw Error(fmt::format("{}: attn_mask of rank {} (1 to 4)", where, mask->rank()));
  if (mask->dtype() == DataType::kBool) m.mb = mask->data<bool>();
  else if (mask->dtype() == DataType::kFloat) m.mf = mask->data<float>();
  else throw UnsupportedError(fmt::format("{}: attn_mask of type {}", where, DataTypeName(mask->dtype())));
  m.Tm = mask->dim(mask->rank() - 1);
  if (m.Tm > T)
    throw Error(fmt::format("{}: attn_mask has {} keys, more than the {} of the present cache", where, m.Tm, T));
  const int64_t xs[4] = {B, Hq, S, m.Tm};
  int64_t st = 1;
  for (int64_t a = mask->rank() - 1; a >= 0; --a) {
    const int64_t xa = 4 - mask->rank() + a, md = mask->dim(a);
    if (md != xs[xa] && md != 1)
      throw Error(fmt::format("{}: attn_mask of shape {} does not broadcast to [{}, {}, {}, {}]", where,
                              ShapeToString(mask->shape()), B, Hq, S, m.Tm));
    m.mst[xa] = md == 1 ? 0 : st;
    st *= md;
  }
  return m;
}

// What the blocks of one call's query rows read: shapes, operands, settings (see AttentionKernel).
struct AttentionCall {
  int64_t rank, B, Hq, Hkv, r, S, T, Dq, Dv, P;
  bool has_past;
  const float* q;
  float* y;
  float* qk;  // qk_matmul_output, or null
  int64_t qk_mode;
  Heads kh, vh;
  float scale, softcap;
  bool causal, may_skip, packed;
  bool ahead;  // a decode step's blocks over a long cache ask for their rows ahead (DecodeAhead)
  const std::vector<int64_t>* valid;  // nonpad_kv_seqlen clamped to [0, T], or null
  AttentionMask mask;
  const KeySkips* skips;
  const float* kpack;  // with packed: the keys transposed per cache head, [Dq, ldt] each
  int64_t ldt;

  // Causal offset of batch row b: a query at index s attends keys j <= s + offset.
  int64_t Offset(int64_t b) const {
    return has_past ? P : valid != nullptr ? (*valid)[static_cast<size_t>(b)] - S : int64_t{0};
  }
  // The keys query row s of head h (batch row b) may attend lie in [0, Allowed(b, h, s)): the
  // rest are -inf by the causal bound, the padding, the mask's width or its own tail.
  int64_t Allowed(int64_t b, int64_t h, int64_t s) const {
    const int64_t* mst = mask.mst;
    int64_t lim = std::min(T, mask.Tm);
    if (causal) lim = std::min(lim, std::max<int64_t>(0, s + Offset(b) + 1));
    if (valid != nullptr) lim = std::min(lim, (*valid)[static_cast<size_t>(b)]);
    const int64_t moff = b * mst[0] + h * mst[1] + s * mst[2];
    if (mask.mb != nullptr && mst[3] == 1)
      lim = LastTrue(mask.mb + moff, lim);
    else if (mask.mb != nullptr)
      while (lim > 0 && !mask.mb[moff + (lim - 1) * mst[3]]) --lim;
    else if (mask.mf != nullptr)
      while (lim > 0 && mask.mf[moff + (lim - 1) * mst[3]] == kNegInf) --lim;
    return lim;
  }
};

// Rows [m0, m0 + M) of cache head g's query rows (batch row b): scores, scale, softcap, mask,
// softmax, values, in the thread's scratch `base` (M rows of the computed keys' scores, then for
// 3-D inputs the gathered query rows and outputs).
void AttendBlock(const AttentionCall& c, int64_t b, int64_t g, int64_t m0, int64_t M, float* base) {
  const int64_t rank = c.rank, Hq = c.Hq, Hkv = c.Hkv, r = c.r, S = c.S, T = c.T, Dq = c.Dq, Dv = c.Dv;
  const int64_t Tm = c.mask.Tm, qk_mode = c.qk_mode;
  const int64_t* mst = c.mask.mst;
  const bool* mb = c.mask.mb;
  const float* mf = c.mask.mf;
  const float* q = c.q;
  float* y = c.y;
  float* qk = c.qk;
  const Heads kh = c.kh, vh = c.vh;
  const float scale = c.scale, softcap = c.softcap;
  const bool causal = c.causal, may_skip = c.may_skip;
  [[maybe_unused]] const bool packed = c.packed;
  const bool ahead = c.ahead && !c.packed && DecodeAheadTakes(M, Dq, Dv);
  [[maybe_unused]] const int64_t ldt = c.ldt;
  const std::vector<int64_t>& finite_from = c.skips->finite_from;
  const std::vector<int64_t>& extent = c.skips->extent;
  const std::vector<float>& tail = c.skips->tail;
  const std::vector<float>& kmax = c.skips->kmax;
  float* sc = base;
  // The query rows (head g * r + m / S, position m % S), and where the outputs go.
  // Row m of the block is row m0 + m of the cache head's M.
  const float* qa;
  float* yo;
  if (rank == 4) {
    qa = q + ((b * Hq + g * r) * S + m0) * Dq;
    yo = y + ((b * Hq + g * r) * S + m0) * Dv;
  } else {
    float* qg = base + M * T;
    for (int64_t m = 0; m < M; ++m) {
      const int64_t mm = m0 + m;
      std::copy_n(q + (b * S + mm % S) * Hq * Dq + (g * r + mm / S) * Dq, Dq, qg + m * Dq);
    }
    qa = qg;
    yo = qg + M * Dq;
  }
  // The key columns computed: [0, cols), the rows' scores cols apart. `exact`: the keys every
  // row has at -inf past them; with `bounded`, cols may stop where the rows' float masks are
  // at most kMaskCandidate, and each row checks that what it skips has probability 0.
  int64_t cols = T, exact = T;
  bool bounded = false;
  const size_t head = static_cast<size_t>(b * Hkv + g);
  if (may_skip) {
    cols = 0;
    for (int64_t m = 0; m < M; ++m) cols = std::max(cols, c.Allowed(b, g * r + (m0 + m) / S, (m0 + m) % S));
    cols = std::min(T, (cols + 15) / 16 * 16);  // whole vectors of keys, as the fused attention computes them
    if (finite_from[head] > cols) cols = T;
    exact = cols;
    if (!extent.empty() && std::isfinite(kmax[head])) {
      int64_t cb = 0;
      for (int64_t m = 0; m < M; ++m) {
        const int64_t h = g * r + (m0 + m) / S, s = (m0 + m) % S;
        const int64_t row = (b * mst[0] + h * mst[1] + s * mst[2]) / Tm;
        cb = std::max(cb, std::min(c.Allowed(b, h, s), extent[static_cast<size_t>(row)]));
      }
      cb = std::min(T, (cb + 15) / 16 * 16);
      if (cb < cols && finite_from[head] <= cb) {
        cols = cb;
        bounded = true;
      }
    }
  }
  for (;;) {
    if (cols > 0) {
#if GAF_ATTENTION_AVX512
      if (packed)
        ScoresPacked(M, cols, Dq, qa, c.kpack + (b * Hkv + g) * Dq * ldt, ldt, sc, cols);
      else
#endif
      {
        // As a decode step's kernels go: the keys ahead, and this head's values into L2 meanwhile.
        DecodeAhead pf;
        if (ahead) {
          pf.ahead = kDecodeAheadBytes;
          pf.next = vh.data + (b * Hkv + g) * vh.stride;
          pf.next_bytes = cols * Dv * static_cast<int64_t>(sizeof(float));
        }
        AttentionSegment(M, cols, Dq, true, qa, Dq, kh.data + (b * Hkv + g) * kh.stride, sc, cols, false, pf);
      }
    }
    bool proven = true;
    for (int64_t m = 0; m < M; ++m) {
      const int64_t h = g * r + (m0 + m) / S, s = (m0 + m) % S;
      float* row = sc + m * cols;
      for (int64_t j = 0; j < cols; ++j) row[j] *= scale;
      if (softcap > 0.f)
        for (int64_t j = 0; j < cols; ++j) row[j] = softcap * std::tanh(row[j] / softcap);
      float* qo = qk != nullptr ? qk + ((b * Hq + h) * S + s) * T : nullptr;  // (cols == T with qk)
      if (qo != nullptr && qk_mode <= 1) std::copy_n(row, cols, qo);
      const int64_t moff = b * mst[0] + h * mst[1] + s * mst[2];
      // The keys before `lim` take the mask; the causal future, the padding and the keys past the
      // mask's width are -inf. (valid[b] and Tm may exceed the computed keys.)
      int64_t lim = std::min(cols, Tm);
      if (causal) lim = std::min(lim, std::max<int64_t>(0, s + c.Offset(b) + 1));
      if (c.valid != nullptr) lim = std::min(lim, (*c.valid)[static_cast<size_t>(b)]);
      MaskRow(row, lim, cols, mb != nullptr ? mb + moff : nullptr, mf != nullptr ? mf + moff : nullptr, mst[3]);
      const float top = RowMax(row, lim);
      if (bounded) {  // what this row skips: at most its mask's largest skipped value plus |scale q . k|
        const float skipped = tail[static_cast<size_t>(moff / Tm)];
        const float* qr = qa + m * Dq;
        float qn = 0.f;
#pragma omp simd reduction(+ : qn)
        for (int64_t i = 0; i < Dq; ++i) qn += qr[i] * qr[i];
        float bound = std::fabs(scale) * std::sqrt(qn) * kmax[head] * 1.001f;
        if (softcap > 0.f) bound = std::min(bound, softcap);
        if (!(skipped + bound + std::fabs(skipped) * 1e-6f < top - kZeroMargin)) {
          proven = false;
          break;
        }
      }
      if (qo != nullptr && qk_mode == 2) std::copy_n(row, cols, qo);
      if (top == kNegInf) {  // every key masked: no weight anywhere
        std::fill(row, row + cols, 0.f);
      } else {
        SoftmaxRowF32(row, row, cols);
      }
      if (qo != nullptr && qk_mode == 3) std::copy_n(row, cols, qo);
    }
    if (proven) break;
    cols = exact;  // some row's skipped keys might weigh: the block again with them
    bounded = false;
  }
  if (cols > 0) {
    const float* vb = vh.data + (b * Hkv + g) * vh.stride;
#if GAF_ATTENTION_AVX512
    if (packed && Dv == 64)
      ValuesAvx512<4, 6>(M, cols, sc, cols, vb, yo, false);
    else if (packed && Dv == 128)
      ValuesAvx512<8, 3>(M, cols, sc, cols, vb, yo, false);
    else
#endif
      AttentionSegment(M, Dv, cols, false, sc, cols, vb, yo, Dv, false,
                       ahead ? DecodeAhead{kDecodeAheadBytes, nullptr, 0} : DecodeAhead{});
  } else {
    std::fill(yo, yo + M * Dv, 0.f);
  }
  if (rank == 3)
    for (int64_t m = 0; m < M; ++m) {
      const int64_t mm = m0 + m;
      std::copy_n(yo + m * Dv, Dv, y + (b * S + mm % S) * Hq * Dv + (g * r + mm / S) * Dv);
    }
}

void AttentionKernel(KernelContext& ctx) {
  const NodeDescription where{ctx.node};
  const Tensor& Q = ctx.input(0);
  const Tensor& Kin = ctx.input(1);
  const Tensor& Vin = ctx.input(2);
  for (const Tensor* t : {&Q, &Kin, &Vin})
    if (t->dtype() != DataType::kFloat)
      throw UnsupportedError(
          fmt::format("{}: input type {} (float, float16, bfloat16 are supported)", where, DataTypeName(t->dtype())));
  const Tensor* mask = ctx.has_input(3) ? ctx.inputs[3] : nullptr;
  const Tensor* past_k = ctx.has_input(4) ? ctx.inputs[4] : nullptr;
  const Tensor* past_v = ctx.has_input(5) ? ctx.inputs[5] : nullptr;
  const Tensor* nonpad = ctx.has_input(6) ? ctx.inputs[6] : nullptr;
  if ((past_k == nullptr) != (past_v == nullptr))
    throw Error(fmt::format("{}: past_key and past_value come together", where));
  for (const Tensor* t : {past_k, past_v})
    if (t != nullptr && t->dtype() != DataType::kFloat)
      throw UnsupportedError(fmt::format("{}: cache type {}", where, DataTypeName(t->dtype())));

  const int64_t rank = Q.rank();
  if ((rank != 3 && rank != 4) || Kin.rank() != rank || Vin.rank() != rank)
    throw Error(fmt::format("{}: Q, K and V of ranks {}, {}, {} (all 3 or all 4)", where, Q.rank(), Kin.rank(),
                            Vin.rank()));
  const int64_t B = Q.dim(0);
  int64_t Hq, Hkv, S, L, Dq, Dv;
  if (rank == 4) {
    Hq = Q.dim(1), S = Q.dim(2), Dq = Q.dim(3);
    Hkv = Kin.dim(1), L = Kin.dim(2), Dv = Vin.dim(3);
    if (Kin.dim(3) != Dq || Vin.dim(1) != Hkv || Vin.dim(2) != L)
      throw Error(fmt::format("{}: K {} and V {} do not match Q {}", where, ShapeToString(Kin.shape()),
                              ShapeToString(Vin.shape()), ShapeToString(Q.shape())));
  } else {
    Hq = ctx.node.GetInt("q_num_heads", 0), Hkv = ctx.node.GetInt("kv_num_heads", 0);
    if (Hq <= 0 || Hkv <= 0 || Q.dim(2) % Hq != 0 || Kin.dim(2) % Hkv != 0 || Vin.dim(2) % Hkv != 0)
      throw Error(fmt::format("{}: 3-D inputs need q_num_heads and kv_num_heads dividing their last dimensions "
                              "(got {} and {} for Q {}, K {}, V {})",
                              where, Hq, Hkv, ShapeToString(Q.shape()), ShapeToString(Kin.shape()),
                              ShapeToString(Vin.shape())));
    S = Q.dim(1), Dq = Q.dim(2) / Hq, L = Kin.dim(1), Dv = Vin.dim(2) / Hkv;
    if (Kin.dim(2) / Hkv != Dq || Vin.dim(1) != L)
      throw Error(fmt::format("{}: K {} and V {} do not match Q {}", where, ShapeToString(Kin.shape()),
                              ShapeToString(Vin.shape()), ShapeToString(Q.shape())));
  }
  if (Kin.dim(0) != B || Vin.dim(0) != B)
    throw Error(fmt::format("{}: Q, K and V have different batch sizes", where));
  if (Hkv <= 0 || Hq % Hkv != 0)
    throw Error(fmt::format("{}: {} query heads are not a multiple of {} key/value heads", where, Hq, Hkv));
  const int64_t r = Hq / Hkv;

  const Tensor present_k = PresentOf(past_k, Kin, Hkv, Dq, ctx.cache_room, where, "past_key");
  const Tensor present_v = PresentOf(past_v, Vin, Hkv, Dv, ctx.cache_room, where, "past_value");
  const int64_t P = past_k != nullptr ? past_k->dim(2) : 0;
  const int64_t T = present_k.dim(2);
  if (present_v.dim(2) != T) throw Error(fmt::format("{}: past_key and past_value differ in length", where));
  const Heads kh{present_k.cache_data<float>(), present_k.head_stride()};
  const Heads vh{present_v.cache_data<float>(), present_v.head_stride()};

  // Scale, softcap, and what qk_matmul_output holds: 0 or 1 the scaled (and softcapped) scores,
  // 2 with the bias added, 3 the probabilities.
  const float scale = ctx.node.HasAttr("scale") ? ctx.node.GetFloat("scale", 1.f)
                                                 : 1.f / std::sqrt(static_cast<float>(Dq));
  const float softcap = ctx.node.GetFloat("softcap", 0.f);
  const bool causal = ctx.node.GetInt("is_causal", 0) != 0;
  const int64_t qk_mode = ctx.node.GetInt("qk_matmul_output_mode", 0);
  if (qk_mode < 0 || qk_mode > 3)
    throw Error(fmt::format("{}: qk_matmul_output_mode {} (0 to 3)", where, qk_mode));

  const AttentionMask am = MaskOf(mask, B, Hq, S, T, where);
  std::vector<int64_t> valid;  // nonpad_kv_seqlen: keys per batch row
  if (nonpad != nullptr) {
    valid = nonpad->ToInt64s();
    if (static_cast<int64_t>(valid.size()) != B)
      throw Error(fmt::format("{}: nonpad_kv_seqlen has {} values for a batch of {}", where, valid.size(), B));
    for (int64_t& v : valid) v = std::clamp<int64_t>(v, 0, T);  // keys that exist (the offset below stays in range)
  }

  const Shape yshape = rank == 4 ? Shape{B, Hq, S, Dv} : Shape{B, S, Hq * Dv};
  Tensor Y = Tensor::Uninitialized(DataType::kFloat, yshape);
  Tensor QK;
  const bool want_qk = ctx.num_outputs() > 3 && ctx.has_output(3);
  if (want_qk) QK = Tensor::Uninitialized(DataType::kFloat, {B, Hq, S, T});
  const float* q = Q.data<float>();
  float* y = Y.data<float>();
  float* qk = want_qk ? QK.data<float>() : nullptr;

  const int64_t M = r * S;  // query rows per cache head
  // A prompt's rows in blocks of kSkipRows: the key columns that every row of a block has masked
  // with -inf at its end (a causal mask's future, a padded row's tail, a bool mask's false) are
  // not computed, when nothing else needs them (qk_matmul_output). Their probability is exactly 0,
  // so each sum gets the same terms; the values they would multiply must be finite (0 * inf is
  // NaN), else the block takes every key.
  const bool may_skip = !want_qk && S >= kSkipMinRows;
  // Rows whose scores a task holds at once: all of M, or blocks of them under kScoreFloats.
  const int64_t block = std::clamp<int64_t>(std::min(kScoreFloats / std::max<int64_t>(T, 1), may_skip ? kSkipRows : M),
                                            1, std::max<int64_t>(M, 1));
  const KeySkips skips = may_skip ? PrepareKeySkips(am.mf != nullptr && am.mst[3] == 1 ? am.mf : nullptr,
                                                      mask != nullptr ? mask->numel() / std::max<int64_t>(am.Tm, 1) : 0,
                                                      am.Tm, kh, vh, B * Hkv, T, Dq, Dv)
                                    : KeySkips{};
  // Each thread's scores (and, for 3-D inputs, its gathered query rows and outputs), allocated
  // here, on the calling thread, where an allocation past the memory limit is a clean error (not
  // inside the parallel loop, where an exception cannot leave).
  const bool nested = ParallelThreadsNested();
  const int64_t team = nested ? 1 : ParallelThreads();
  const int64_t per_thread = CheckedAdd(CheckedMul(block, T, "attention scores"),
                                        rank == 3 ? CheckedMul(block, CheckedAdd(Dq, Dv), "attention rows") : 0,
                                        "attention scratch");
  Tensor scratch = Tensor::Uninitialized(DataType::kFloat, {team, per_thread});
  // A prompt's blocks score against the keys packed transposed per cache head ([Dq, ldt], zero
  // past T) and multiply the values in register tiles: the fused attention's prompt kernels
  // (ops/attention_kernels.h; each sum over its terms in order, whatever the block).
  const bool packed = GAF_ATTENTION_AVX512 && may_skip && block > 16;
  const int64_t ldt = PackedKeyStride(T);
  Tensor kpack;
  if (packed) {
    kpack = Tensor::Uninitialized(DataType::kFloat,
                                  {B * Hkv, CheckedMul(Dq, ldt, "packed keys")});
    ParallelFor(B * Hkv, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        float* dst = kpack.data<float>() + t * Dq * ldt;
        Transpose2D(kh.data + t * kh.stride, Dq, dst, ldt, Dq, T);
        for (int64_t k = 0; k < Dq; ++k) std::fill(dst + k * ldt + T, dst + (k + 1) * ldt, 0.f);
      }
    });
  }
  // Past the one-thread size the blocks read their caches from memory as they go (DecodeAhead;
  // below it every head's rows are asked for at once, next).
  const bool ahead = B * Hkv * M * T * (Dq + Dv) > kParallelMultiplyAdds;
  const AttentionCall call{rank, B, Hq, Hkv, r, S, T, Dq, Dv, P, past_k != nullptr, q, y, qk, qk_mode, kh, vh,
                           scale, softcap, causal, may_skip, packed, ahead, nonpad != nullptr ? &valid : nullptr,
                           am, &skips, packed ? kpack.data<float>() : nullptr, ldt};
  auto rows = [&](int64_t b, int64_t g, int64_t m0, int64_t M) {
    AttendBlock(call, b, g, m0, M, scratch.data<float>() + (nested ? 0 : omp_get_thread_num()) * per_thread);
  };
  // A task: one block of a cache head's rows (a prompt's heads of one cache head are several
  // tasks, so one or two cache heads still take every thread).
  const int64_t blocks = std::max<int64_t>(1, (M + block - 1) / block);
  auto task = [&](int64_t t) {
    const int64_t b = t / (Hkv * blocks), g = t / blocks % Hkv, m0 = t % blocks * block;
    if (m0 < M) rows(b, g, m0, std::min(block, M - m0));
  };
  const int64_t tasks = B * Hkv * blocks;
  const int64_t work = B * Hkv * M * T * (Dq + Dv);
  if (work <= kParallelMultiplyAdds) {
    // On this thread: every cache head's rows asked for at once (into L2), so their misses overlap
    // instead of each head's rows waiting on memory in turn (a decode step's caches come from
    // memory: the step has streamed the weights through the caches since).
    for (int64_t t = 0; t < B * Hkv; ++t) {
      PrefetchRows(kh.data + t * kh.stride, T * Dq);
      PrefetchRows(vh.data + t * vh.stride, T * Dv);
    }
  }
  ParallelFor(tasks, work > kParallelMultiplyAdds ? 1 : tasks, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) task(t);
  });
  ctx.outputs[0] = std::move(Y);
  if (ctx.num_outputs() > 1 && ctx.has_output(1)) ctx.outputs[1] = present_k;
  if (ctx.num_outputs() > 2 && ctx.has_output(2)) ctx.outputs[2] = present_v;
  if (want_qk) ctx.outputs[3] = std::move(QK);
}

}  // namespace

void RegisterAttentionOpKernels(OpRegistry& r) {
  KernelInfo info{"", "Attention", OpKind::kOpaque, AttentionKernel};
  info.reads_padded_caches = true;  // a generation's past caches with room, read where they are
  r.Register(std::move(info));
}

}  // namespace gaf
