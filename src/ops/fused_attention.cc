// FusedAttention (domain ai.graph_autofusion.plan): attention's three plan nodes as one, as the
// plan rewrite makes it from
//
//   GroupedMatMul(Q, K...) trans_b -> MaskedSoftmax(S [, c] [, mask]) [-> Cast to float]
//     -> GroupedMatMul(P, V...) or MatMul(P, V)
//
//   inputs   the scores product's, then the MaskedSoftmax's after S, then the values product's
//            after P
//   attrs    fallback  the three nodes (four with the Cast), as a graph on those inputs; its
//            outputs are Y, then the present key cache and the present value cache when the
//            products append them
//
// A prompt (at least kMinQueryRows query positions) runs in blocks of kBlockRows query rows of
// one head: the block's scores stay in a buffer of the thread while they are scaled, masked,
// normalized and multiplied by V, so the [b, heads, S, T] scores and probabilities are never
// written out. The key columns at the end of a block's rows that the mask removes (a causal
// mask's future positions, a padded batch row's tail) are not computed. A column is skipped only
// when its mask is at most kMaskCandidate for every row of the block, and a bound on its score
// (|scale| |q| max |k|) shows that the original's probability there is exactly 0 (the Softmax
// kernel's exp of anything below -87 is 0), and only when V's rows are finite (0 * inf is NaN);
// a block whose rows the bound does not clear is computed over the whole cache. So the skipped
// terms are the original's exact zeros; the products' sums may round differently from the
// library's larger products (as GroupedMatMul's decode kernels do). Decode steps (fewer query
// positions) run the three parts per cache head in one parallel region (DecodeSteps); shapes or
// types outside the form run the three nodes' kernels one after another, as before the rewrite.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <unordered_map>
#include <vector>

#include "ops/fused_attention.h"

#include <atomic>

#include "ops/attention_kernels.h"
#include "ops/copy_kernels.h"
#include "ops/gemm.h"
#include "ops/grouped_matmul.h"
#include "ops/kernel.h"
#include "ops/kernel_util.h"

namespace gaf {
namespace {

constexpr int64_t kMinQueryRows = 16;   // fewer query positions (decode steps): DecodeSteps
constexpr int64_t kBlockRows = 32;     // query rows per task
constexpr int64_t kColumnGrain = 16;    // computed key columns: a multiple of this (or all)
// Fewer multiply-adds in a decode step: one thread. `run --profile` at the bench Llama's decode
// shapes (2 threads, 16 heads on 4 cache heads, d 64; us a call, one thread against the team):
// past 16: 18.1 against 19.5; past 64: 33.9 against 28.6; past 128: 60 against 43. (It was 2^15:
// a team from 17 keys on, which woke the second thread for less work than waking it costs.)
constexpr int64_t kParallelMultiplyAdds = int64_t{1} << 16;
constexpr int64_t kMinSplitKeys = 256;  // keys per task, at least, when a decode step splits the cache

// The fallback graph's nodes run one after another on the node's inputs with their registered
// kernels (all tensors float32 or shapes): the plan as it was before the rewrite, without the
// subgraph runner's per-call work. Caches with room are handed to them as contiguous copies.
void RunParts(KernelContext& ctx, const Graph& g) {
  std::unordered_map<std::string, const Tensor*> env;
  std::vector<Tensor> dense(ctx.num_inputs());  // contiguous copies of caches with room: the parts read them whole
  for (size_t i = 0; i < g.inputs.size() && i < ctx.num_inputs(); ++i) {
    const Tensor* t = ctx.inputs[i];
    if (t != nullptr && t->padded()) t = &(dense[i] = t->Dense());
    env[g.inputs[i].name] = t;
  }
  std::vector<std::unique_ptr<std::vector<Tensor>>> made;
  for (const Node& n : g.nodes) {
    const KernelInfo* k = OpRegistry::Global().Find(n.domain, n.op_type);
    GAF_CHECK(k != nullptr, "{}: no kernel for {}", ctx.node.Describe(), n.Describe());
    KernelContext sub{n, ctx.opset, {}, std::vector<Tensor>(n.outputs.size()), ctx.subgraphs, ctx.num_threads};
    for (const std::string& in : n.inputs) {
      auto it = in.empty() ? env.end() : env.find(in);
      sub.inputs.push_back(it == env.end() ? nullptr : it->second);
    }
    k->fn(sub);
    made.push_back(std::make_unique<std::vector<Tensor>>(std::move(sub.outputs)));
    for (size_t i = 0; i < n.outputs.size(); ++i)
      if (!n.outputs[i].empty()) env[n.outputs[i]] = &(*made.back())[i];
  }
  for (size_t i = 0; i < g.outputs.size() && i < ctx.num_outputs(); ++i) {
    auto it = env.find(g.outputs[i].name);
    GAF_CHECK(it != env.end(), "{}: its parts do not make {}", ctx.node.Describe(), g.outputs[i].name);
    ctx.outputs[i] = *it->second;
  }
}

// A key or value cache [b, g, T, d], read by r consecutive query heads per cache head.
struct Cache {
  Tensor t;
  int64_t r = 0;
  bool appended = false;  // t is the present cache the part outputs
  // With appended: the past and new rows, [b, g, tp, d] and [b, g, tn, d]; t holds their
  // concatenation unless the cache was taken with copy = false (then t is only allocated, or with
  // in_place it is the past's storage with room, past rows already there, new rows not yet).
  // The past's heads and t's are past_stride and t_stride elements apart (caches with room:
  // Tensor::head_stride); t is contiguous unless the run makes caches with room.
  const float* past = nullptr;
  const float* cur = nullptr;
  int64_t tp = 0, tn = 0, past_stride = 0, t_stride = 0;
  bool in_place = false;
};

std::atomic<int64_t> g_in_place{0}, g_new_room{0}, g_copied{0};  // CacheAppendTotals


// The cache a product part reads, from its inputs in ctx starting at `first` (the part's second
// input): the appended Concat(past, new) (made here, appended), the repeated cache, or (r = 1) a
// [b, heads, T, d] operand as it is. False when the shapes are not of the part's form. With copy
// false an appended cache's present is allocated but not filled (the caller copies each head);
// then, in a run that makes caches with room (KernelContext::cache_room), the present is the
// past's own storage with the new rows taken in place where it has room (Tensor::AppendInPlace),
// else new storage with room. A past with room is read where it is.
bool CacheOf(const Node& part, const KernelContext& ctx, size_t first, int64_t b, int64_t heads, Cache* c,
             bool copy = true) {
  auto in = [&](size_t i) -> const Tensor* { return first + i < ctx.num_inputs() ? ctx.inputs[first + i] : nullptr; };
  const bool grouped = part.op_type == "GroupedMatMul";
  const bool kv = grouped && part.GetInt("kv_group", 0) != 0, append = grouped && part.GetInt("append", 0) != 0;
  const size_t shapes = append ? 2 : 1;
  if (append) {
    const Tensor* past = in(0);
    const Tensor* cur = in(1);
    if (past == nullptr || cur == nullptr || past->rank() != 4 || cur->rank() != 4 || past->dim(0) != cur->dim(0) ||
        past->dim(1) != cur->dim(1) || past->dim(3) != cur->dim(3))
      return false;
    const int64_t g = past->dim(1), tp = past->dim(2), tn = cur->dim(2), d = past->dim(3);
    const int64_t t = CheckedAdd(tp, tn, "present cache length");
    if (past->dtype() != DataType::kFloat || cur->dtype() != DataType::kFloat) return false;
    const Shape shape{past->dim(0), g, t, d};
    if (!copy && ctx.cache_room) {
      c->t = past->AppendInPlace(tn);
      c->in_place = c->t.defined();
      ++(c->in_place ? g_in_place : g_new_room);
      if (!c->in_place) {
        try {
          c->t = Tensor::WithCacheRoom(DataType::kFloat, shape, CacheRoomFor(t));
        } catch (const Error&) {  // the room past the memory limit: a cache without room
          c->t = Tensor::Uninitialized(DataType::kFloat, shape);
        }
      }
    } else {
      if (!copy) ++g_copied;
      c->t = Tensor::Uninitialized(DataType::kFloat, shape);
    }
    c->appended = true;
    const float* pp = past->cache_data<float>();
    const float* cp = cur->data<float>();
    c->past = pp;
    c->cur = cp;
    c->tp = tp;
    c->tn = tn;
    c->past_stride = past->head_stride();
    c->t_stride = c->t.head_stride();
    float* pr = c->t.cache_data<float>();
    for (int64_t i = 0; copy && i < past->dim(0) * g; ++i)
      CopyAppendedHead(pr + i * c->t_stride, pp + i * c->past_stride, tp, cp + i * tn * d, tn, d);
  } else {
    if (in(0) == nullptr || in(0)->rank() != 4) return false;
    c->t = in(0)->Dense();
  }
  if (c->t.dtype() != DataType::kFloat) return false;
  if (kv) {
    if (in(shapes) == nullptr || in(shapes + 1) == nullptr) return false;
    c->r = KvRepeat(c->t.shape(), in(shapes)->ToInt64s(), in(shapes + 1)->ToInt64s());
  } else {
    c->r = 1;
  }
  return c->r > 0 && c->t.dim(0) == b && c->t.dim(1) * c->r == heads;
}

// The keys [j0, j1) of cache head i, as runs of rows where they are: fn(rows, count, offset of
// the run in [j0, j1)); an appended cache's past rows, then its new rows.
template <class Fn>
void KeyRuns(const Cache& C, int64_t i, int64_t j0, int64_t j1, Fn&& fn) {
  const int64_t w = C.t.dim(3);
  if (!C.appended) {
    fn(C.t.data<float>() + (i * C.t.dim(2) + j0) * w, j1 - j0, 0);
    return;
  }
  const int64_t p0 = std::min(j0, C.tp), p1 = std::min(j1, C.tp);
  if (p1 > p0) fn(C.past + i * C.past_stride + p0 * w, p1 - p0, p0 - j0);
  const int64_t n0 = std::max(j0, C.tp) - C.tp, n1 = std::max(j1, C.tp) - C.tp;
  if (n1 > n0) fn(C.cur + (i * C.tn + n0) * w, n1 - n0, C.tp + n0 - j0);
}

// Row j of cache head i where it is (an appended cache's past or new rows).
const float* RowOf(const Cache& C, int64_t i, int64_t j) {
  const int64_t w = C.t.dim(3);
  if (!C.appended) return C.t.data<float>() + (i * C.t.dim(2) + j) * w;
  return j < C.tp ? C.past + i * C.past_stride + j * w : C.cur + (i * C.tn + j - C.tp) * w;
}

// Whether the values' rows lie beside the keys' in runs of the same rows (KeyRuns splits both
// at the same past length), so that the scores can ask for the values of their rows.
bool SameRuns(const Cache& K, const Cache& V) { return K.appended == V.appended && (!K.appended || K.tp == V.tp); }

// A decode step with fewer cache heads than threads over a long cache (flash-decoding): the cache's
// rows split into `parts` segments, one task per (cache head, segment) over all r*S query rows of
// the head, so each thread reads its share of the cache once (splitting the query heads instead
// reads the whole cache head per thread). A task scales and masks its scores and exponentiates
// them against the segment's own maximum (ExpRowF32), and sums their products by V unnormalized;
// then each row combines its segments, each weighted by exp(segment max - row max), and divides
// by the weighted sum of the exponentials. A segment of -inf scores weighs nothing; a row of
// -inf only is NaN, as Softmax's. Present caches are copied by segment, in parallel.
void DecodeStepsSplit(const Tensor& Q, Cache& K, Cache& V, int64_t scale, float c, const float* mask,
                      const int64_t* mst, Tensor* Y, int64_t parts) {
  const int64_t b = Q.dim(0), H = Q.dim(1), S = Q.dim(2), d = Q.dim(3);
  const int64_t T = K.t.dim(2), dv = V.t.dim(3), g = K.t.dim(1), r = K.r, M = r * S;
  const int64_t tasks = b * g * parts;
  std::vector<float> partial(static_cast<size_t>(tasks * M * dv)), seg_max(static_cast<size_t>(tasks * M)),
      seg_sum(static_cast<size_t>(tasks * M));
  const float* q = Q.data<float>();
  auto task = [&](int64_t t) {
    const int64_t i = t / parts, p = t % parts, bi = i / g, h0 = i % g * r;
    const int64_t j0 = T * p / parts, j1 = T * (p + 1) / parts, n = j1 - j0;
    thread_local std::vector<float> scores;
    if (static_cast<int64_t>(scores.size()) < M * n) scores.resize(static_cast<size_t>(M * n));
    float* sb = scores.data();
    const float* qb = q + (bi * H + h0) * S * d;
    const bool ahead = DecodeAheadTakes(M, d, dv) && SameRuns(K, V);
    KeyRuns(K, i, j0, j1, [&](const float* k, int64_t rows, int64_t off) {
      DecodeAhead pf;
      if (ahead) {
        pf.ahead = kDecodeAheadBytes;
        pf.next = RowOf(V, i, j0 + off);
        pf.next_bytes = rows * dv * static_cast<int64_t>(sizeof(float));
      }
      AttentionSegment(M, rows, d, true, qb, d, k, sb + off, n, false, pf);
    });
    for (int64_t m = 0; m < M; ++m) {
      float* row = sb + m * n;
      const float* mr =
          mask != nullptr ? mask + bi * mst[0] + (h0 + m / S) * mst[1] + m % S * mst[2] + j0 * mst[3] : nullptr;
      ScaleAndMaskRow(row, row, n, scale, c, mr, mst[3]);
      seg_sum[static_cast<size_t>(t * M + m)] = ExpRowF32(row, row, n, &seg_max[static_cast<size_t>(t * M + m)]);
    }
    float* ob = partial.data() + t * M * dv;
    bool first = true;
    KeyRuns(V, i, j0, j1, [&](const float* v, int64_t rows, int64_t off) {
      DecodeAhead pf;
      if (ahead) pf.ahead = kDecodeAheadBytes;
      AttentionSegment(M, dv, rows, false, sb + off, n, v, ob, dv, !first, pf);
      first = false;
    });
    for (Cache* cache : {&K, &V}) {  // this segment's rows of the present
      if (!cache->appended) continue;
      const int64_t w = cache->t.dim(3);
      float* dst = cache->t.cache_data<float>() + i * cache->t_stride + j0 * w;
      KeyRuns(*cache, i, j0, j1, [&](const float* src, int64_t rows, int64_t off) {
        if (!cache->in_place || j0 + off >= cache->tp) std::copy(src, src + rows * w, dst + off * w);
      });
    }
  };
  ParallelFor(tasks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) task(t);
  });
  float* y = Y->data<float>();
  std::vector<float> acc(static_cast<size_t>(dv));
  for (int64_t i = 0; i < b * g; ++i)
    for (int64_t m = 0; m < M; ++m) {
      const size_t first = static_cast<size_t>(i * parts * M + m);
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t p = 0; p < parts; ++p) mx = std::max(mx, seg_max[first + static_cast<size_t>(p * M)]);
      std::fill(acc.begin(), acc.end(), 0.f);
      float total = 0.f;
      for (int64_t p = 0; p < parts; ++p) {
        const size_t at = first + static_cast<size_t>(p * M);
        if (seg_max[at] == -std::numeric_limits<float>::infinity()) continue;
        const float wgt = std::exp(seg_max[at] - mx);
        total += wgt * seg_sum[at];
        const float* o = partial.data() + at * dv;
        for (int64_t k = 0; k < dv; ++k) acc[static_cast<size_t>(k)] += wgt * o[k];
      }
      const int64_t bi = i / g, h0 = i % g * r;
      float* yr = y + ((bi * H + h0) * S + m) * dv;
      for (int64_t k = 0; k < dv; ++k) yr[k] = acc[static_cast<size_t>(k)] / total;
    }
}

// Asks for the rows of cache head i (past and new) in L2 ahead of their use. In a decode step the
// caches come from memory: the step's weights have streamed through the caches since the last step
// wrote them, and each head's rows are a short stream that the hardware prefetchers only pick up
// after its first misses, so the scores waited on memory row by row (perf, bench Llama at 2
// threads: the attention nodes 2.7% of a float32 step and 5% of a float16-weight one). Timed in
// one `generate` process, the prefetch on every other step (50 new tokens after 16): 12.95 against
// 14.71 us a call, with float16 weights 13.05 against 15.97; at 200 tokens 22.5 against 22.6.
void PrefetchHead(const Cache& C, int64_t i) {
  const int64_t w = C.t.dim(3);
  auto rows = [](const float* p, int64_t n) {
    const char* b = reinterpret_cast<const char*>(p);
    for (int64_t off = 0; off < n * static_cast<int64_t>(sizeof(float)); off += 64) __builtin_prefetch(b + off, 0, 2);  // into L2 (prefetcht1)
  };
  if (!C.appended) {
    rows(C.t.data<float>() + i * C.t.dim(2) * w, C.t.dim(2) * w);
    return;
  }
  rows(C.past + i * C.past_stride, C.tp * w);
  rows(C.cur + i * C.tn * w, C.tn * w);
}

// A decode step or a few query positions (fewer than kMinQueryRows): one task per cache head
// (split among its query heads when there are fewer cache heads than threads and the cache is
// short; a long one is split along its rows: DecodeStepsSplit) takes the r*S query
// rows of that head, computes their scores over the cache into a buffer of the thread, scales,
// masks and normalizes them there (MaskedSoftmax's row arithmetic) and multiplies them by V: one
// parallel region for the three parts, the scores never leaving the thread. An appended cache is
// read where its past and new rows are and copied into the present by the head's first task
// (the past from cache, just read). The products sum through AttentionSegment, as the appending
// GroupedMatMul's do.
void DecodeSteps(const Tensor& Q, Cache& K, Cache& V, int64_t scale, float c, const float* mask, const int64_t* mst,
                 Tensor* Y) {
  const int64_t b = Q.dim(0), H = Q.dim(1), S = Q.dim(2), d = Q.dim(3);
  const int64_t T = K.t.dim(2), dv = V.t.dim(3), g = K.t.dim(1), r = K.r;
  const int64_t heads = b * g;
  const int threads = ParallelThreads();
  if (heads < threads && T >= 2 * kMinSplitKeys && heads * r * S * T * (d + dv) > kParallelMultiplyAdds)
    return DecodeStepsSplit(Q, K, V, scale, c, mask, mst, Y,
                            std::min<int64_t>((threads + heads - 1) / heads, T / kMinSplitKeys));
  const int64_t parts = heads >= threads ? 1 : std::min<int64_t>(r, (threads + heads - 1) / heads);
  const float* q = Q.data<float>();
  float* y = Y->data<float>();
  // prefetch: the task asks for its cache head's rows (in a team, or on one thread over a long
  // cache; else every head's rows are asked for at once before the first task): as the kernels
  // go where this build's decode kernels take the head (DecodeAhead: the keys and values 4 KiB
  // ahead, and the values into L2 while the scores go), else all of the head's at the task's start.
  auto task = [&](int64_t t, bool prefetch) {
    const int64_t i = t / parts, p = t % parts, bi = i / g;
    const int64_t h0 = i % g * r + r * p / parts, h1 = i % g * r + r * (p + 1) / parts, M = (h1 - h0) * S;
    const bool ahead = prefetch && DecodeAheadTakes(M, d, dv);
    if (prefetch && !ahead) PrefetchHead(K, i), PrefetchHead(V, i);
    DecodeAhead kpf, vpf;
    if (ahead) {
      kpf.ahead = vpf.ahead = kDecodeAheadBytes;
      const int64_t first_run = V.appended ? V.tp : T;  // the keys' first run (the past's when appended)
      if (SameRuns(K, V) && first_run > 0) {  // its values
        kpf.next = RowOf(V, i, 0);
        kpf.next_bytes = first_run * dv * static_cast<int64_t>(sizeof(float));
      }
    }
    thread_local std::vector<float> scores;
    if (static_cast<int64_t>(scores.size()) < M * T) scores.resize(static_cast<size_t>(M * T));
    float* sb = scores.data();
    const float* qb = q + (bi * H + h0) * S * d;
    float* yb = y + (bi * H + h0) * S * dv;
    if (K.appended) {
      AttentionSegment(M, K.tp, d, true, qb, d, K.past + i * K.past_stride, sb, T, false, kpf);
      AttentionSegment(M, K.tn, d, true, qb, d, K.cur + i * K.tn * d, sb + K.tp, T, false);
    } else {
      AttentionSegment(M, T, d, true, qb, d, K.t.data<float>() + i * T * d, sb, T, false, kpf);
    }
    for (int64_t m = 0; m < M; ++m) {
      float* row = sb + m * T;
      const float* mr = mask != nullptr ? mask + bi * mst[0] + (h0 + m / S) * mst[1] + m % S * mst[2] : nullptr;
      ScaleAndMaskRow(row, row, T, scale, c, mr, mst[3]);
      SoftmaxRowF32(row, row, T);
    }
    if (V.appended) {
      AttentionSegment(M, dv, V.tp, false, sb, T, V.past + i * V.past_stride, yb, dv, false, vpf);
      AttentionSegment(M, dv, V.tn, false, sb + V.tp, T, V.cur + i * V.tn * dv, yb, dv, true);
    } else {
      AttentionSegment(M, dv, T, false, sb, T, V.t.data<float>() + i * T * dv, yb, dv, false, vpf);
    }
    if (p != 0) return;
    for (Cache* cache : {&K, &V}) {
      if (!cache->appended) continue;
      const int64_t w = cache->t.dim(3);
      float* dst = cache->t.cache_data<float>() + i * cache->t_stride;
      const float* cur = cache->cur + i * cache->tn * w;
      if (cache->in_place)  // the past rows are there already
        std::copy(cur, cur + cache->tn * w, dst + cache->tp * w);
      else
        CopyAppendedHead(dst, cache->past + i * cache->past_stride, cache->tp, cur, cache->tn, w);
    }
  };
  const int64_t tasks = heads * parts;
  const bool large = heads * r * S * T * (d + dv) > kParallelMultiplyAdds;
  if (threads > 1 && tasks > 1 && large) {
    ParallelFor(tasks, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) task(t, true);
    });
  } else if (large) {
    for (int64_t t = 0; t < tasks; ++t) task(t, true);
  } else {
    for (int64_t i = 0; i < heads; ++i) PrefetchHead(K, i), PrefetchHead(V, i);  // every head's rows at once
    for (int64_t t = 0; t < tasks; ++t) task(t, false);
  }
}

void FusedAttentionKernel(KernelContext& ctx) {
  const Graph* g = ctx.node.GetGraph("fallback");
  // The parts: the scores product, MaskedSoftmax, perhaps a Cast of the probabilities to float
  // (a no-op on the float32 inputs the paths below take), the values product.
  // With out_transposed, a last part: the Transpose (perm 0, 2, 1, 3) of the values product's result,
  // which the kernel writes as [b, S, H, dv] directly (FoldAttentionTransposes).
  const bool out_t = ctx.node.GetInt("out_transposed", 0) != 0;
  const size_t parts = g != nullptr ? g->nodes.size() - (out_t ? 1 : 0) : 0;
  GAF_CHECK(g != nullptr && (parts == 3 || parts == 4), "{}: no attention parts", ctx.node.Describe());
  const Node& qk = g->nodes[0];
  const Node& sm = g->nodes[1];
  const Node& pv = g->nodes[parts - 1];
  if (out_t && (g->nodes.back().op_type != "Transpose" || g->nodes.back().GetInts("perm") != std::vector<int64_t>{0, 2, 1, 3}))
    return RunParts(ctx, *g);
  for (size_t i = 0; i < ctx.num_inputs(); ++i)
    if (ctx.has_input(i) && ctx.inputs[i]->dtype() != DataType::kFloat && ctx.inputs[i]->dtype() != DataType::kInt64)
      return RunPlanFallback(ctx);  // half types: the parts' own conversions
  const Tensor& Q = ctx.input(0);
  const size_t sm_first = qk.inputs.size(), pv_first = sm_first + sm.inputs.size() - 1;
  const int64_t scale = sm.GetInt("scale", 0);
  const bool has_mask = sm.GetInt("mask", 0) != 0;
  const int64_t axis = sm.GetInt("axis", -1);
  if (Q.dtype() != DataType::kFloat || Q.rank() != 4 || qk.GetInt("trans_b", 0) == 0 ||
      (pv.op_type == "GroupedMatMul" && pv.GetInt("trans_b", 0) != 0) || (axis != -1 && axis != 3) || scale < 0 ||
      scale > 2 || sm.inputs.size() != 1 + (scale != 0) + has_mask || ctx.num_inputs() != pv_first + pv.inputs.size() - 1)
    return RunParts(ctx, *g);
  const int64_t b = Q.dim(0), H = Q.dim(1), S = Q.dim(2), d = Q.dim(3);
  Cache K, V;
  const bool decode = S < kMinQueryRows;
  if (b == 0 || H == 0 || d == 0 || !CacheOf(qk, ctx, 1, b, H, &K, !decode) ||
      !CacheOf(pv, ctx, pv_first, b, H, &V, !decode) || K.t.dim(3) != d || V.t.dim(2) != K.t.dim(2) ||
      K.t.dim(2) == 0 || V.t.dim(3) == 0 || (decode && (K.t.dim(1) != V.t.dim(1) || K.r != V.r)))
    return RunParts(ctx, *g);
  // A decode task's scores buffer holds r x S rows of the cache's length: past 64M floats the parts
  // run instead (their scores tensor goes through the memory limit's check).
  int64_t decode_scores = 0;
  if (decode && (__builtin_mul_overflow(K.r * S, K.t.dim(2), &decode_scores) || decode_scores > (int64_t{1} << 26)))
    return RunParts(ctx, *g);
  const int64_t T = K.t.dim(2), dv = V.t.dim(3), gk = K.t.dim(1), gv = V.t.dim(1);
  float c = 1.f;
  if (scale != 0) {
    const Tensor* ct = ctx.inputs[sm_first];
    if (ct == nullptr || ct->numel() != 1 || ct->dtype() != DataType::kFloat) return RunParts(ctx, *g);
    c = ct->data<float>()[0];
  }
  int64_t scale_op = scale;  // what the scores' epilogue does: a division by c as a product where that is exact
  if (scale == 1 && ExactReciprocal(c)) {
    scale_op = 2;
    c = 1.f / c;
  }
  // The mask's element strides over the scores' axes [b, H, S, T] (0 where it broadcasts).
  int64_t mst[4] = {0, 0, 0, 0};
  const float* mask = nullptr;
  if (has_mask) {
    const Tensor* M = ctx.inputs[sm_first + (scale != 0)];
    if (M == nullptr || M->dtype() != DataType::kFloat || M->rank() > 4) return RunParts(ctx, *g);
    const int64_t xs[4] = {b, H, S, T};
    int64_t st = 1;
    for (int64_t a = M->rank() - 1; a >= 0; --a) {
      const int64_t xa = 4 - M->rank() + a, md = M->dim(a);
      if (md != xs[xa] && md != 1) return RunParts(ctx, *g);
      mst[xa] = md == 1 ? 0 : st;
      st *= md;
    }
    mask = M->data<float>();
  }
  // The output [b, H, S, dv], or with out_transposed [b, S, H, dv]: row s of head h at yrow(bi, h, s).
  Tensor Y = Tensor::Uninitialized(DataType::kFloat, out_t ? Shape{b, S, H, dv} : Shape{b, H, S, dv});
  const int64_t ldy = out_t ? H * dv : dv;
  auto yrow = [&](int64_t bi, int64_t h, int64_t s) {
    return out_t ? ((bi * S + s) * H + h) * dv : ((bi * H + h) * S + s) * dv;
  };
  auto finish = [&] {
    ctx.outputs[0] = std::move(Y);
    size_t o = 1;
    for (const Cache* cache : {&K, &V})
      if (cache->appended && o < ctx.num_outputs()) ctx.outputs[o++] = cache->t;
    GAF_CHECK(o == ctx.num_outputs(), "{}: made {} of its {} outputs", ctx.node.Describe(), o, ctx.num_outputs());
  };
  if (decode) {
    if (!out_t || S == 1) {  // one query row: [b, H, 1, dv] and [b, 1, H, dv] are the same memory
      DecodeSteps(Q, K, V, scale_op, c, mask, mst, &Y);
      return finish();
    }
    Tensor Z = Tensor::Uninitialized(DataType::kFloat, {b, H, S, dv});
    DecodeSteps(Q, K, V, scale_op, c, mask, mst, &Z);
    const float* z = Z.data<float>();
    float* y = Y.data<float>();
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t s = 0; s < S; ++s) std::memcpy(y + yrow(bi, h, s), z + ((bi * H + h) * S + s) * dv, sizeof(float) * dv);
    return finish();
  }
  const float* q = Q.data<float>();
  const float* kc = K.t.data<float>();
  const float* vc = V.t.data<float>();
  float* y = Y.data<float>();

  // The keys packed transposed per key head ([d, ldt], zero past T) for the scores kernel, where
  // this build has it; ldt is also the row length of the score buffers.
  const int64_t ldt = PackedKeyStride(T);
  // The buffer is the calling thread's, kept between calls: a fresh one cost a zeroing of new
  // pages every call (0.25 ms of a 256-token prompt's 1.9 ms here); only the padding is zeroed.
  // (The name kt means each thread's own inside a parallel region: there the pointer kp is read.)
  thread_local std::vector<float> kt;
  float* kp = nullptr;
  if (GAF_ATTENTION_AVX512) {
    const int64_t n = CheckedMul(CheckedMul(b * gk, d, "packed keys"), ldt, "packed keys");
    if (static_cast<int64_t>(kt.size()) < n) kt.resize(static_cast<size_t>(n));
    kp = kt.data();
  }
  // What may be skipped: the largest |k| per key head, whether each value head is finite.
  std::vector<float> kmax(static_cast<size_t>(b * gk));
  std::vector<char> vfinite(static_cast<size_t>(b * gv));
  const bool skipping = mask != nullptr && mst[3] == 1;  // then the mask's rows are T long
  // Per mask row: how many leading columns to keep, and the largest mask value of the rest.
  const int64_t mask_rows = skipping ? ctx.inputs[sm_first + (scale != 0)]->numel() / T : 0;
  std::vector<int64_t> extent(static_cast<size_t>(mask_rows));
  std::vector<float> tail(static_cast<size_t>(mask_rows));
  std::vector<int64_t> zeros(static_cast<size_t>(mask_rows));  // per mask row: its leading 0s, to its extent
  // |score * scale| <= factor * |q| * |k| (with room for the dot product's rounding).
  const float factor = (scale_op == 1 ? 1.f / std::fabs(c) : scale_op == 2 ? std::fabs(c) : 1.f) * 1.001f;
  const int64_t blocks = (S + kBlockRows - 1) / kBlockRows, tasks = b * H * blocks;
  const int threads = std::min<int64_t>(omp_in_parallel() ? 1 : omp_get_max_threads(), tasks);
  if (threads > 1) NoteOwnParallelRegion();
  // One parallel region for the whole call: the keys' packing and what may be skipped first, then
  // the query blocks. As four parallel loops of their own, with the mask tails scanned value by
  // value, that set-up took 120-280 us of a 256-token call's 0.9 ms here; in the region, 55-98 us.
#pragma omp parallel num_threads(threads)
  {
    if (kp != nullptr) {
      // Through register blocks: the element-wise loop wrote rows ldt floats apart for every key
      // (a set-aliasing stride at ldt = 256), which took a quarter of the call.
#pragma omp for schedule(static) nowait
      for (int64_t i = 0; i < b * gk; ++i) {
        float* dst = kp + i * d * ldt;
        Transpose2D(kc + i * T * d, d, dst, ldt, d, T);
        for (int64_t k = 0; k < d; ++k) std::fill(dst + k * ldt + T, dst + (k + 1) * ldt, 0.f);
      }
    }
    if (skipping) {
#pragma omp for schedule(static) nowait
      for (int64_t r = 0; r < mask_rows; ++r) {
        MaskTail(mask + r * T, T, &extent[r], &tail[r]);
        zeros[r] = MaskZeroLead(mask + r * T, extent[r]);
      }
#pragma omp for schedule(static) nowait
      for (int64_t i = 0; i < b * gk; ++i) {
        bool fin = true;
        RowNorms(kc + i * T * d, T, d, &kmax[i], &fin);
      }
#pragma omp for schedule(static) nowait
      for (int64_t i = 0; i < b * gv; ++i) {
        float unused = 0.f;
        bool fin = true;
        RowNorms(vc + i * T * dv, T, dv, &unused, &fin);
        vfinite[i] = fin;
      }
    }
#pragma omp barrier
    std::vector<float> buf(static_cast<size_t>(kBlockRows * ldt));
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      // The last query blocks first: under a causal mask they have the most keys.
      const int64_t blk = blocks - 1 - task / (b * H), bh = task % (b * H), bi = bh / H, h = bh % H;
      const int64_t s0 = blk * kBlockRows, rows = std::min(kBlockRows, S - s0);
      const float* qb = q + ((bi * H + h) * S + s0) * d;
      const int64_t kh = bi * gk + h / K.r, vh = bi * gv + h / V.r;
      [[maybe_unused]] const float* kb = kc + kh * T * d;
      const float* vb = vc + vh * T * dv;
      auto mask_row = [&](int64_t s) { return mask + bi * mst[0] + h * mst[1] + (s0 + s) * mst[2]; };
      // Each group of 8 rows (a scores tile) computes the key columns up to its own rows' extent
      // (under a causal mask, the block's first rows need fewer than its last), the block's
      // probabilities are zero past them, up to the block's widest group.
      constexpr int64_t kGroup = 8;
      int64_t gcols[kBlockRows / kGroup], gzero[kBlockRows / kGroup];
      float top[kBlockRows];
      const int64_t groups = (rows + kGroup - 1) / kGroup;
      const bool may_skip = skipping && vfinite[vh] && std::isfinite(kmax[kh]);
      for (bool whole = !may_skip;; whole = true) {
        int64_t cols = 0;
        for (int64_t g = 0; g < groups; ++g) {
          int64_t keep = T;
          if (!whole) {
            keep = 0;
            for (int64_t s = g * kGroup; s < std::min(rows, (g + 1) * kGroup); ++s)
              keep = std::max(keep, extent[(mask_row(s) - mask) / T]);
            keep = std::min(T, (keep + kColumnGrain - 1) / kColumnGrain * kColumnGrain);
          }
          gcols[g] = keep;
          cols = std::max(cols, keep);
          gzero[g] = T;
          for (int64_t s = g * kGroup; skipping && s < std::min(rows, (g + 1) * kGroup); ++s)
            gzero[g] = std::min(gzero[g], zeros[(mask_row(s) - mask) / T]);
        }
#if GAF_ATTENTION_AVX512
        {
          // Scaled, masked and each row's largest in the tiles' registers (as ScaleAndMaskRow);
          // each group of rows to its own columns.
          static_assert(kGroup == 8, "ScoresPackedScaled's group_cols are per 8 rows");
          const ScoreEpilogue epi{scale_op, c, mask != nullptr ? mask_row(0) : nullptr, mst[2], mst[3]};
          ScoresPackedScaled(rows, cols, d, qb, kp + kh * d * ldt, ldt, buf.data(), ldt, epi, top, gcols,
                             skipping ? gzero : nullptr);
        }
#else
        for (int64_t g = 0; g < groups; ++g) {
          const int64_t r0 = g * kGroup, gr = std::min(kGroup, rows - r0);
          float* out = buf.data() + r0 * ldt;
          SgemmF32(false, true, gr, gcols[g], d, 1.f, qb + r0 * d, d, kb, d, 0.f, out, ldt);
          for (int64_t s = 0; s < gr; ++s) {
            float* yr = out + s * ldt;
            ScaleAndMaskRow(yr, yr, gcols[g], scale_op, c, mask != nullptr ? mask_row(r0 + s) : nullptr, mst[3]);
            top[r0 + s] = -std::numeric_limits<float>::infinity();
            for (int64_t i = 0; i < gcols[g]; ++i) top[r0 + s] = top[r0 + s] > yr[i] ? top[r0 + s] : yr[i];
          }
        }
#endif
        bool cleared = true;
        for (int64_t s = 0; s < rows && mask != nullptr; ++s) {
          if (gcols[s / kGroup] == T) continue;
          // Every skipped score, masked, lies more than kZeroMargin below the row's maximum.
          const float skipped = tail[(mask_row(s) - mask) / T];  // at least the largest of the skipped ones
          float qn = 0.f;
#pragma omp simd reduction(+ : qn)
          for (int64_t i = 0; i < d; ++i) qn += qb[s * d + i] * qb[s * d + i];
          const float bound = factor * std::sqrt(qn) * kmax[kh];
          if (!(skipped + bound + std::fabs(skipped) * 1e-6f < top[s] - kZeroMargin)) cleared = false;
        }
        if (!cleared) continue;  // the whole cache, as the original
        for (int64_t s = 0; s < rows; ++s) {
          float* pr = buf.data() + s * ldt;
          const int64_t n = gcols[s / kGroup];
          SoftmaxRowWithMaxF32(pr, pr, n, top[s]);  // its maximum from the scores tiles
          std::fill(pr + n, pr + cols, 0.f);  // the original's exact zeros there
        }
        float* yb = y + yrow(bi, h, s0);
#if GAF_ATTENTION_AVX512
        if (dv == 64) {
          ValuesAvx512<4, 6>(rows, cols, buf.data(), ldt, vb, yb, false, 0, ldy);
          break;
        }
        if (dv == 128) {
          ValuesAvx512<8, 3>(rows, cols, buf.data(), ldt, vb, yb, false, 0, ldy);
          break;
        }
#endif
        SgemmF32(false, false, rows, dv, cols, 1.f, buf.data(), ldt, vb, dv, 0.f, yb, ldy);
        break;
      }
    }
  }
  finish();
}

}  // namespace

void RowNorms(const float* k, int64_t t, int64_t d, float* max_norm, bool* finite) {
  float worst = 0.f;
  bool fin = true;
  for (int64_t j = 0; j < t; ++j) {
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < d; ++i) s += k[j * d + i] * k[j * d + i];
    if (!std::isfinite(s)) fin = false;
    worst = std::max(worst, std::sqrt(s));
  }
  *max_norm = fin ? worst : std::numeric_limits<float>::infinity();
  *finite = fin;
}

void MaskTail(const float* mr, int64_t T, int64_t* extent, float* tail) {
  // Back from the end 16 values at a time while all of them are candidates (a NaN is not one),
  // then value by value.
  int64_t j = T;
  while (j >= 16) {
    bool keep = false;
#pragma omp simd reduction(| : keep)
    for (int64_t i = j - 16; i < j; ++i) keep = keep | !(mr[i] <= kMaskCandidate);
    if (keep) break;
    j -= 16;
  }
  while (j > 0 && mr[j - 1] <= kMaskCandidate) --j;
  if (j == 0) j = T;
  float top = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : top)
  for (int64_t i = j; i < T; ++i) top = top > mr[i] ? top : mr[i];
  *extent = j;
  *tail = top;
}

int64_t MaskZeroLead(const float* mr, int64_t n) {
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    bool nonzero = false;
#pragma omp simd reduction(| : nonzero)
    for (int64_t i = j; i < j + 16; ++i) nonzero = nonzero | (mr[i] != 0.f);
    if (nonzero) break;
  }
  while (j < n && mr[j] == 0.f) ++j;
  return j;
}

void MaskTails(const float* mask, int64_t rows, int64_t T, std::vector<int64_t>* extent, std::vector<float>* tail) {
  extent->resize(static_cast<size_t>(rows));
  tail->resize(static_cast<size_t>(rows));
  ParallelFor(rows, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) MaskTail(mask + r * T, T, &(*extent)[r], &(*tail)[r]);
  });
}

// (A past of no heads may have any length: no room past int64.)
int64_t CacheRoomFor(int64_t t) {
  const int64_t extra = std::max<int64_t>(t / 2, 64);
  return t > std::numeric_limits<int64_t>::max() - extra ? t : t + extra;
}

CacheAppendCounts CacheAppendTotals() { return {g_in_place.load(), g_new_room.load(), g_copied.load()}; }

void RegisterAttentionKernels(OpRegistry& r) {
  // Not upcast: float16/bfloat16 attention runs the fallback, whose operators round in their type.
  r.Register({"ai.graph_autofusion.plan", "FusedAttention", OpKind::kContraction, FusedAttentionKernel, false,
              /*reads_padded_caches=*/true});
}

}  // namespace gaf
