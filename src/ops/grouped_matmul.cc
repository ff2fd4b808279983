// GroupedMatMul and SiblingMatMul (domain ai.graph_autofusion.plan): the products a session's
// plan rewrites make from MatMul nodes (runtime/plan_rewrite.h). GroupedMatMul reads a second
// operand the graph copied (transposed, or a key/value cache repeated per query head) in place:
//
//   inputs  A, B [, expand_shape, reshape_shape]
//   attrs   trans_b   1: B is given untransposed; the product reads it as Bᵀ (last two axes)
//           kv_group  1: B is a key/value cache [b, g, t, d] that the graph repeated per query head
//                        (Unsqueeze at axis 2, Expand to [b, g, r, t, d], Reshape to [b, g*r, t, d]);
//                        the product reads each cache head once for its r query heads
//           append    1 (with kv_group): inputs A, past, new, expand_shape, reshape_shape and
//                        outputs (Y, B) with B = Concat(past, new) on axis 2, made in the same pass
//           fallback  the original nodes, as a graph on the node's inputs
//
// With kv_group the query heads of one cache head are r consecutive heads of A, so A viewed as
// [b, g, r*S, K] multiplies each cache head [t, d] in one product of r*S rows. Whenever a run's
// shapes are not of that form (or not float32), the fallback graph runs: the original operators,
// so the result is always MatMul's.
#include <algorithm>
#include <vector>

#include "ops/attention_kernels.h"
#include "ops/gemm.h"
#include "ops/gemv.h"
#include "ops/grouped_matmul.h"
#include "ops/kernel.h"
#include "ops/kernel_util.h"
#include "ops/panel_gemm.h"

namespace gaf {

int64_t KvRepeat(const Shape& x, const std::vector<int64_t>& e, const std::vector<int64_t>& s) {
  if (x.size() != 4 || e.size() > 5) return 0;
  const Shape u = {x[0], x[1], 1, x[2], x[3]};
  Shape ex(5);
  for (size_t i = 0; i < 5; ++i) {
    const int64_t want = i + e.size() >= 5 ? e[i + e.size() - 5] : 1;
    if (u[i] == want || want == 1) ex[i] = u[i];
    else if (u[i] == 1 && want > 1) ex[i] = want;
    else return 0;
  }
  if (ex[0] != x[0] || ex[1] != x[1] || ex[3] != x[2] || ex[4] != x[3]) return 0;
  const Shape r = ResolveReshape(ex, s);
  if (r != Shape{x[0], x[1] * ex[2], x[2], x[3]}) return 0;
  return ex[2];
}

namespace {

// C[M,N] = A[M,K] * op(B), row-major, directly: for small products, where a library call costs
// more than the arithmetic (a decode step's attention over a short cache).
void SmallProduct(int64_t M, int64_t N, int64_t K, bool trans_b, const float* __restrict A,
                  const float* __restrict B, float* __restrict C) {
  if (trans_b) {  // C[m,n] = A[m,:] . B[n,:], both rows contiguous
    for (int64_t n = 0; n < N; ++n) {
      const float* b = B + n * K;
      for (int64_t m = 0; m < M; ++m) {
        const float* a = A + m * K;
        float s = 0.f;
#pragma omp simd reduction(+ : s)
        for (int64_t k = 0; k < K; ++k) s += a[k] * b[k];
        C[m * N + n] = s;
      }
    }
    return;
  }
  for (int64_t m = 0; m < M; ++m) {  // C[m,:] = sum_k A[m,k] B[k,:]
    float* c = C + m * N;
    std::fill(c, c + N, 0.f);
    for (int64_t k = 0; k < K; ++k) {
      const float a = A[m * K + k];
      const float* b = B + k * N;
#pragma omp simd
      for (int64_t n = 0; n < N; ++n) c[n] += a * b[n];
    }
  }
}

#if GAF_ATTENTION_AVX512
// Attention scores C[M,N] = A[M,D] * B[N,D]ᵀ for D a multiple of 16 (a decode step: M = the query
// heads of one cache head, N = the cache length): DecodeScores where it takes D, else one cache
// row's dot product at a time (the same sums).
void ScoresAvx512(int64_t M, int64_t N, int64_t D, const float* A, const float* B, float* C, int64_t ldc,
                  const DecodeAhead& pf) {
  if (!DecodeScores(M, N, D, A, B, C, ldc, pf)) ScoresRowByRow(M, N, D, A, B, C, ldc);
}

// The attention products of a decode step or short prompt, when this machine and shape have them:
// false when the caller is to use the library. A's rows are lda apart, C's ldc apart (scores) or
// N (values, which add into C when accumulate). pf: what the kernels ask for ahead of their reads.
bool AttentionProduct(int64_t M, int64_t N, int64_t K, bool trans_b, const float* A, int64_t lda, const float* B,
                      float* C, int64_t ldc, bool accumulate, const DecodeAhead& pf = {}) {
  if (M > 16) return false;
  if (trans_b) {
    if (K % 16 != 0 || K > 256 || lda != K || accumulate) return false;
    ScoresAvx512(M, N, K, A, B, C, ldc, pf);
    return true;
  }
  if (ldc != N) return false;
  const bool ahead = pf.ahead > 0;
  if (N == 64) ahead ? ValuesAvx512<4, 4, true>(M, K, A, lda, B, C, accumulate, pf.ahead)
                     : ValuesAvx512<4, 4>(M, K, A, lda, B, C, accumulate);
  else if (N == 128) ahead ? ValuesAvx512<8, 2, true>(M, K, A, lda, B, C, accumulate, pf.ahead)
                           : ValuesAvx512<8, 2>(M, K, A, lda, B, C, accumulate);
  else return false;
  return true;
}
#else
bool AttentionProduct(int64_t, int64_t, int64_t, bool, const float*, int64_t, const float*, float*, int64_t, bool,
                      const DecodeAhead& = {}) {
  return false;
}
#endif

// Below this many multiply-adds a product is computed by SmallProduct.
constexpr int64_t kSmallProduct = int64_t{1} << 18;
// Below this many multiply-adds in all, the products run on the calling thread.
constexpr int64_t kParallelWork = int64_t{1} << 15;

// C[i] = A[i] * op(B[i]) for `batches` products of [M,K] x [K,N] at the given element strides.
void Products(int64_t batches, int64_t M, int64_t N, int64_t K, bool trans_b, const float* A, int64_t a_stride,
              const float* B, int64_t b_stride, float* C) {
  const int64_t ldb = trans_b ? K : N;
  const bool small = M * N * K <= kSmallProduct;
  auto one = [&](int64_t i) {
    if (AttentionProduct(M, N, K, trans_b, A + i * a_stride, K, B + i * b_stride, C + i * M * N, N, false)) return;
    if (small)
      SmallProduct(M, N, K, trans_b, A + i * a_stride, B + i * b_stride, C + i * M * N);
    else
      SgemmF32(false, trans_b, M, N, K, 1.f, A + i * a_stride, K, B + i * b_stride, ldb, 0.f, C + i * M * N, N);
  };
  // Few, large products: each uses the whole team; many small ones: one per thread.
  const int64_t work = batches * M * N * K;
  if (batches > 1 && M * N * K < (int64_t{1} << 22) && work > kParallelWork) {
    ParallelFor(batches, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t i = b0; i < b1; ++i) one(i);
    });
  } else {
    for (int64_t i = 0; i < batches; ++i) one(i);
  }
}

}  // namespace

// C[M,N] (+)= A[M,K] * op(B) with A's rows lda apart and C's ldc apart (one segment of the cache rows).
void AttentionSegment(int64_t M, int64_t N, int64_t K, bool trans_b, const float* A, int64_t lda, const float* B, float* C,
             int64_t ldc, bool accumulate, const DecodeAhead& pf) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    if (!accumulate)
      for (int64_t m = 0; m < M; ++m) std::fill(C + m * ldc, C + m * ldc + N, 0.f);
    return;
  }
  if (AttentionProduct(M, N, K, trans_b, A, lda, B, C, ldc, accumulate, pf)) return;
  SgemmF32(false, trans_b, M, N, K, 1.f, A, lda, B, trans_b ? K : N, accumulate ? 1.f : 0.f, C, ldc);
}

void CopyAppendedHead(float* present, const float* past, int64_t tp, const float* cur, int64_t tn, int64_t w) {
  CopyBytes(present, past, sizeof(float) * tp * w);
  CopyBytes(present + tp * w, cur, sizeof(float) * tn * w);
}

namespace {

// append: B is Concat(past, new) on the cache axis, the present cache, which is also this node's
// second output; with kv_group a cache head serves several query heads (inputs 3 and 4: the repeat's
// Expand and Reshape shapes), without it one (multi-head attention: A and the cache have as many
// heads). Each cache head's product reads its past rows and new rows where they
// are, then copies both into the present (the past rows from cache, just read, with stores that
// bypass the caches): the past crosses memory once, not once for the Concat and again for the
// product. Scores (trans_b) take the two segments as column ranges of each row; values add the
// new rows' terms after the past's, in the same order as over the concatenated cache.
void AppendProducts(KernelContext& ctx, bool trans_b) {
  const Tensor& A = ctx.input(0);
  const Tensor& past = ctx.input(1);
  const Tensor& cur = ctx.input(2);
  const bool kv = ctx.node.GetInt("kv_group", 0) != 0;
  if ((kv && (ctx.num_inputs() < 5 || !ctx.has_input(3) || !ctx.has_input(4))) || ctx.num_outputs() != 2 ||
      A.dtype() != DataType::kFloat || past.dtype() != DataType::kFloat || cur.dtype() != DataType::kFloat ||
      A.rank() != 4 || past.rank() != 4 || cur.rank() != 4 || past.dim(0) != cur.dim(0) || past.dim(1) != cur.dim(1) ||
      past.dim(3) != cur.dim(3))
    return RunPlanFallback(ctx);
  const int64_t b = past.dim(0), g = past.dim(1), tp = past.dim(2), tn = cur.dim(2), d = past.dim(3);
  const int64_t t = CheckedAdd(tp, tn, "present cache length");
  const int64_t r = kv ? KvRepeat({b, g, t, d}, ctx.input(3).ToInt64s(), ctx.input(4).ToInt64s()) : 1;
  const Shape& as = A.shape();
  const int64_t K = trans_b ? d : t, N = trans_b ? t : d;
  if (r <= 0 || as[0] != b || as[1] != g * r || as[3] != K) return RunPlanFallback(ctx);
  const int64_t M = r * as[2];
  Tensor Y = Tensor::Uninitialized(DataType::kFloat, {b, g * r, as[2], N});
  Tensor present = Tensor::Uninitialized(DataType::kFloat, {b, g, t, d});
  const float* a = A.data<float>();
  const float* pp = past.data<float>();
  const float* cp = cur.data<float>();
  float* y = Y.data<float>();
  float* pr = present.data<float>();
  auto head = [&](int64_t i) {
    const float* ai = a + i * M * K;
    float* yi = y + i * M * N;
    if (trans_b) {
      AttentionSegment(M, tp, d, true, ai, d, pp + i * tp * d, yi, t, false);
      AttentionSegment(M, tn, d, true, ai, d, cp + i * tn * d, yi + tp, t, false);
    } else {
      AttentionSegment(M, d, tp, false, ai, t, pp + i * tp * d, yi, d, false);
      AttentionSegment(M, d, tn, false, ai + tp, t, cp + i * tn * d, yi, d, true);
    }
    CopyAppendedHead(pr + i * t * d, pp + i * tp * d, tp, cp + i * tn * d, tn, d);
  };
  const int64_t heads = b * g;
  if (heads > 1 && M * N * K < (int64_t{1} << 22) && heads * M * N * K > kParallelWork) {
    ParallelFor(heads, 1, [&](int64_t h0, int64_t h1) {
      for (int64_t i = h0; i < h1; ++i) head(i);
    });
  } else {
    for (int64_t i = 0; i < heads; ++i) head(i);
  }
  ctx.outputs[0] = Y;
  ctx.outputs[1] = present;
}

void GroupedMatMulKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  if (node.GetInt("append", 0) != 0) return AppendProducts(ctx, node.GetInt("trans_b", 0) != 0);
  const Tensor& A = ctx.input(0);
  const Tensor& B = ctx.input(1);
  const bool trans_b = node.GetInt("trans_b", 0) != 0, kv = node.GetInt("kv_group", 0) != 0;
  if (A.dtype() != DataType::kFloat || B.dtype() != DataType::kFloat || A.rank() < 2 || B.rank() < 2)
    return RunPlanFallback(ctx);
  const Shape& as = A.shape();
  if (kv) {
    if (!ctx.has_input(2) || !ctx.has_input(3) || A.rank() != 4) return RunPlanFallback(ctx);
    const int64_t r = KvRepeat(B.shape(), ctx.input(2).ToInt64s(), ctx.input(3).ToInt64s());
    const int64_t b = B.dim(0), g = B.dim(1), t = B.dim(2), d = B.dim(3);
    const int64_t K = trans_b ? d : t, N = trans_b ? t : d;
    if (r <= 0 || as[0] != b || as[1] != g * r || as[3] != K) return RunPlanFallback(ctx);
    const int64_t S = as[2];
    Tensor Y = Tensor::Uninitialized(DataType::kFloat, {b, g * r, S, N});
    Products(b * g, r * S, N, K, trans_b, A.data<float>(), r * S * K, B.data<float>(), t * d, Y.data<float>());
    ctx.outputs[0] = Y;
    return;
  }
  // Plain MatMul with B read transposed: batch dims broadcast as MatMul's.
  const Shape& bs = B.shape();
  const int64_t M = as[as.size() - 2], K = as.back();
  const int64_t N = trans_b ? bs[bs.size() - 2] : bs.back(), KB = trans_b ? bs.back() : bs[bs.size() - 2];
  if (K != KB) return RunPlanFallback(ctx);  // the fallback names the mismatch
  const Shape ab(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2);
  const Shape ob = BroadcastShapes(ab, bb, node);
  Shape os = ob;
  os.push_back(M);
  os.push_back(N);
  Tensor Y = Tensor::Uninitialized(DataType::kFloat, os);  // no elements when a dim is 0
  const int64_t nb = NumElements(ob);
  if (nb > 0 && M > 0 && N > 0) {
    const std::vector<int64_t> ao = BatchOffsets(ab, M * K, ob), bo = BatchOffsets(bb, N * K, ob);
    const float* a = A.data<float>();
    const float* bp = B.data<float>();
    float* y = Y.data<float>();
    ParallelFor(nb, nb > 1 && M * N * K < (int64_t{1} << 22) ? 1 : nb, [&](int64_t b0, int64_t b1) {
      for (int64_t i = b0; i < b1; ++i)
        SgemmF32(false, trans_b, M, N, K, 1.f, a + ao[i], K, bp + bo[i], trans_b ? K : N, 0.f, y + i * M * N, N);
    });
  }
  ctx.outputs[0] = Y;
}

// SiblingMatMul: inputs A, W_1..W_n (float32 [K, N_i] constants), outputs Y_i = MatMul(A, W_i).
// A batch-1 A streams all the weights in one set of GEMV tasks; other batches run each product.
// The products a[M, K] * w_i into outs[i] (weights as given, row-major) in one set of tasks where
// the GEMV takes a few rows.
void SiblingProducts(const float* a, int64_t M, int64_t K, std::vector<GemvOutput>& outs) {
  if (M == 1) {
    GemvF32Many(a, K, outs.data(), static_cast<int>(outs.size()));
    return;
  }
  // Rows up to which siblings whose weights are not prepared take the multi-row GEMV, all weights
  // in one task set (on the bench Llama here: 2-4 rows stream faster that way, 26.6 vs 29.3 ms at
  // 2; 6 rows 33-34 vs 35.6 ms through the library).
  constexpr int64_t kSiblingGemvMaxRows = 5;
  if (M <= kSiblingGemvMaxRows) {
    GemvF32ManyRows(a, M, K, outs.data(), static_cast<int>(outs.size()));
    return;
  }
  for (const GemvOutput& o : outs)
    if (M > 0) SgemmF32(false, false, M, o.N, K, 1.f, a, K, o.w, o.ldw, 0.f, o.y, o.N);
}

void SiblingMatMulKernel(KernelContext& ctx) {
  const Tensor& A = ctx.input(0);
  const int n = static_cast<int>(ctx.num_inputs()) - 1;
  bool fast = A.dtype() == DataType::kFloat && A.rank() >= 1 && n == static_cast<int>(ctx.num_outputs());
  const int64_t K = A.rank() >= 1 ? A.shape().back() : 0;
  for (int i = 0; fast && i < n; ++i) {
    const Tensor* w = ctx.inputs[1 + i];
    fast = w != nullptr && w->dtype() == DataType::kFloat && w->rank() == 2 && w->dim(0) == K;
  }
  if (!fast || K == 0) return RunPlanFallback(ctx);
  const int64_t M = A.numel() / K;
  std::vector<GemvOutput> outs;
  for (int i = 0; i < n; ++i) {
    const Tensor& w = *ctx.inputs[1 + i];
    Shape s = A.shape();
    s.back() = w.dim(1);
    ctx.outputs[i] = Tensor::Uninitialized(DataType::kFloat, s);
    outs.push_back({w.data<float>(), w.dim(1), ctx.outputs[i].data<float>(), w.dim(1)});
  }
  SiblingProducts(A.data<float>(), M, K, outs);
}

}  // namespace

// ConcatShape (inputs: Concat's; attrs axis, start, end): Shape(Concat(inputs, axis)) with
// Shape's start/end, from the inputs' shapes alone, for the Shape nodes that read a value a plan
// rewrite no longer makes on its own: a cache an appending GroupedMatMul makes (they would
// otherwise need the cache before the product that makes it), a Concat a FusedCopy absorbed.
// Shapes Concat would reject run the original nodes (the `fallback` graph), so the error is
// Concat's.
void ConcatShapeKernel(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const int64_t r = a.rank();
  int64_t axis = ctx.node.GetInt("axis", 0);
  bool ok = r > 0 && axis >= -r && axis < r;
  if (ok && axis < 0) axis += r;
  Shape shape = a.shape();
  for (size_t i = 1; ok && i < ctx.num_inputs(); ++i) {
    ok = ctx.has_input(i);
    if (!ok) break;
    const Tensor& b = *ctx.inputs[i];
    ok = b.rank() == r && a.dtype() == b.dtype();
    for (int64_t d = 0; ok && d < r; ++d) ok = d == axis || a.shape()[d] == b.shape()[d];
    if (ok) shape[axis] = CheckedAdd(shape[axis], b.shape()[axis], "concatenated size");
  }
  if (!ok) return RunPlanFallback(ctx);
  ctx.outputs[0] = ShapeSlice(shape, ctx.node);
}

// TransposeShape (input T; attrs perm, start, end): Shape(Transpose(T, perm)) with Shape's
// start/end, from T's shape alone, for the Shape nodes of a Transpose's output a plan rewrite no
// longer makes (a RotaryHalf reading T in place). A perm Transpose would reject runs the original
// nodes (the `fallback` graph), so the error is Transpose's.
void TransposeShapeKernel(KernelContext& ctx) {
  const Tensor& t = ctx.input(0);
  const Attribute* perm = ctx.node.FindAttr("perm");
  const int64_t r = t.rank();
  if (perm == nullptr || static_cast<int64_t>(perm->ints.size()) != r) return RunPlanFallback(ctx);
  std::vector<bool> seen(static_cast<size_t>(r), false);
  Shape shape(static_cast<size_t>(r));
  for (int64_t i = 0; i < r; ++i) {
    const int64_t a = perm->ints[static_cast<size_t>(i)];
    if (a < 0 || a >= r || seen[static_cast<size_t>(a)]) return RunPlanFallback(ctx);
    seen[static_cast<size_t>(a)] = true;
    shape[static_cast<size_t>(i)] = t.dim(a);
  }
  ctx.outputs[0] = ShapeSlice(shape, ctx.node);
}

// GatedMatMul (inputs A, W_gate, W_up; attr fallback): SiLU(A W_gate) * (A W_up), a SwiGLU MLP's
// gate and up products with the SiLUGate that reads them (runtime/plan_rewrite.h). Its kernel on
// weights packed at load is the session's (ops/gemm.h PreparedGatedMatMulKernel); this one (weights
// too small to pack) runs the registry's SiblingMatMul products and the SiLUGate arithmetic, the
// same bits as the two nodes; other types and shapes run the nodes it replaced.
void GatedMatMulKernel(KernelContext& ctx) {
  if (ctx.num_inputs() != 3 || ctx.num_outputs() != 1) return RunPlanFallback(ctx);
  const Tensor& A = ctx.input(0);
  const Tensor& wg = ctx.input(1);
  const Tensor& wu = ctx.input(2);
  const int64_t K = A.rank() >= 1 ? A.shape().back() : 0;
  if (A.dtype() != DataType::kFloat || A.rank() < 1 || K == 0 || wg.dtype() != DataType::kFloat ||
      wu.dtype() != DataType::kFloat || wg.rank() != 2 || wg.dim(0) != K || wu.shape() != wg.shape())
    return RunPlanFallback(ctx);
  const int64_t M = A.numel() / K, F = wg.dim(1);
  Tensor G = Tensor::Uninitialized(DataType::kFloat, {M, F}), U = Tensor::Uninitialized(DataType::kFloat, {M, F});
  std::vector<GemvOutput> outs = {{wg.data<float>(), F, G.data<float>(), F}, {wu.data<float>(), F, U.data<float>(), F}};
  SiblingProducts(A.data<float>(), M, K, outs);
  Shape s = A.shape();
  s.back() = F;
  ctx.outputs[0] = Tensor::Uninitialized(DataType::kFloat, s);
  StoreGated(G.data<float>(), F, U.data<float>(), F, M, F, ctx.outputs[0].data<float>(), F);
}

// ResidualMatMul (inputs A, W, R; attr fallback): A W + R, a product with the Add of its result and
// another tensor (a transformer's residual; runtime/plan_rewrite.h). Its kernel on a weight packed
// at load is the session's (ops/gemm.h PreparedResidualMatMulKernel); this one runs the nodes it
// replaced.
void ResidualMatMulKernel(KernelContext& ctx) { RunPlanFallback(ctx); }

void RegisterPlanKernels(OpRegistry& r) {
  r.Register({"ai.graph_autofusion.plan", "TransposeShape", OpKind::kOpaque, TransposeShapeKernel, false});
  r.Register({"ai.graph_autofusion.plan", "ConcatShape", OpKind::kOpaque, ConcatShapeKernel, false,
              /*reads_padded_caches=*/true});
  r.Register({"ai.graph_autofusion.plan", "GroupedMatMul", OpKind::kContraction, GroupedMatMulKernel, true});
  r.Register({"ai.graph_autofusion.plan", "SiblingMatMul", OpKind::kContraction, SiblingMatMulKernel, true});
  r.Register({"ai.graph_autofusion.plan", "GatedMatMul", OpKind::kContraction, GatedMatMulKernel, true});
  r.Register({"ai.graph_autofusion.plan", "ResidualMatMul", OpKind::kContraction, ResidualMatMulKernel, true});
}

}  // namespace gaf
