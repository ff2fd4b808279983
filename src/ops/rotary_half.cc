// RotaryHalf (domain ai.graph_autofusion.plan): rotary position embedding as exporters write
// HF's rotate_half, one pass instead of seven operators, as the plan rewrite makes it from
//
//   Add(Mul(X, cos), Mul(Concat(Neg(Slice(X, h, end)), Slice(X, 0, h), axis=last), sin))
//
//   (each Mul and the Add in either order)
//   inputs  X, cos, sin      cos and sin broadcast to X, with X's last dimension
//           [h1, h2]          with dynamic: the first Slice's end and the second's start, one
//                             integer each (torch.onnx.export computes them from X's shape)
//   attrs   axis  the Slices' axis (it must be X's last at run time);  half  h (X's last
//           dimension must be 2h; with dynamic, h = h1 = h2);  end  the second Slice's end (at
//           least 2h);  dynamic  1 when h is given by the inputs;  fallback  the original nodes,
//           as a graph on the node's inputs;  perm (optional)  X is given untransposed: the
//           rotary reads Transpose(X, perm)'s rows where they are (perm keeps the last axis last)
//
// Each element is x * cos + rot * sin with rot = (-x2, x1), both products rounded before the sum
// as the separate operators round them (this file is compiled without contracting a product
// and a sum into one fused multiply-add), so results are bit-identical. Other shapes and types
// run the fallback graph.
#include <string>
#include <vector>

#include "ops/kernel.h"
#include "ops/kernel_util.h"

namespace gaf {
namespace {

// The element strides of t over the axes of a shape `xs` it broadcasts to (0 where it
// broadcasts); false when it would enlarge xs.
bool BroadcastStridesOver(const Tensor& t, const Shape& xs, std::vector<int64_t>* st) {
  const int64_t rank = static_cast<int64_t>(xs.size());
  if (t.rank() > rank) return false;
  st->assign(static_cast<size_t>(rank), 0);
  int64_t s = 1;
  for (int64_t a = t.rank() - 1; a >= 0; --a) {
    const int64_t xa = rank - t.rank() + a, td = t.dim(a);
    if (td != xs[xa] && td != 1) return false;
    (*st)[xa] = td == 1 ? 0 : s;
    s *= td;
  }
  return true;
}

void RotaryHalfKernel(KernelContext& ctx) {
  for (size_t i = 0; i < 3; ++i)
    if (!ctx.has_input(i) || ctx.input(i).dtype() != DataType::kFloat) return RunPlanFallback(ctx);
  const Tensor& X = ctx.input(0);
  const Tensor& C = ctx.input(1);
  const Tensor& S = ctx.input(2);
  const int64_t rank = X.rank();
  // The rows read: X's own, or with perm those of Transpose(X, perm) where they lie in X (pst:
  // X's element stride along each axis of the transposed shape xs).
  const Attribute* perm = ctx.node.FindAttr("perm");
  Shape xs = X.shape();
  std::vector<int64_t> pst = Strides(X.shape());
  if (perm != nullptr) {
    const std::vector<int64_t>& p = perm->ints;
    if (static_cast<int64_t>(p.size()) != rank || rank < 1 || p.back() != rank - 1) return RunPlanFallback(ctx);
    std::vector<bool> seen(static_cast<size_t>(rank), false);
    const std::vector<int64_t> xst = pst;
    for (int64_t i = 0; i < rank; ++i) {
      if (p[i] < 0 || p[i] >= rank || seen[static_cast<size_t>(p[i])]) return RunPlanFallback(ctx);
      seen[static_cast<size_t>(p[i])] = true;
      xs[i] = X.dim(p[i]);
      pst[i] = xst[static_cast<size_t>(p[i])];
    }
  }
  int64_t axis = ctx.node.GetInt("axis", -1);
  if (axis < 0) axis += rank;
  int64_t h = ctx.node.GetInt("half", 0);
  const int64_t d = rank > 0 ? xs[rank - 1] : 0;
  if (ctx.node.GetInt("dynamic", 0) != 0) {  // the half computed from the shape: both bounds
    if (!ctx.has_input(3) || !ctx.has_input(4) || ctx.input(3).numel() != 1 || ctx.input(4).numel() != 1 ||
        (ctx.input(3).dtype() != DataType::kInt64 && ctx.input(3).dtype() != DataType::kInt32) ||
        (ctx.input(4).dtype() != DataType::kInt64 && ctx.input(4).dtype() != DataType::kInt32))
      return RunPlanFallback(ctx);
    h = ctx.input(3).ScalarAsInt64();
    if (ctx.input(4).ScalarAsInt64() != h) return RunPlanFallback(ctx);
  }
  std::vector<int64_t> cst, sst;
  if (rank < 1 || axis != rank - 1 || h <= 0 || d % 2 != 0 || h != d / 2 || ctx.node.GetInt("end", 0) < d ||
      !BroadcastStridesOver(C, xs, &cst) || !BroadcastStridesOver(S, xs, &sst) || cst[rank - 1] != 1 ||
      sst[rank - 1] != 1)
    return RunPlanFallback(ctx);
  const int64_t rows = X.numel() / d;
  Tensor Y = Tensor::Uninitialized(DataType::kFloat, xs);
  const float* x = X.data<float>();
  const float* cp = C.data<float>();
  const float* sp = S.data<float>();
  float* y = Y.data<float>();
  ParallelFor(rows, std::max<int64_t>(1, 16384 / d), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      int64_t co = 0, so = 0, xo = 0, rest = r;  // the row's offsets in cos, sin and X
      for (int64_t a = rank - 2; a >= 0; --a) {
        const int64_t i = rest % xs[a];
        rest /= xs[a];
        co += i * cst[a];
        so += i * sst[a];
        xo += i * pst[a];
      }
      const float* xr = x + xo;
      const float* cr = cp + co;
      const float* sr = sp + so;
      float* yr = y + r * d;
#pragma omp simd
      for (int64_t i = 0; i < h; ++i) {
        const float a = xr[i] * cr[i], b = -xr[i + h] * sr[i];
        yr[i] = a + b;
      }
#pragma omp simd
      for (int64_t i = h; i < d; ++i) {
        const float a = xr[i] * cr[i], b = xr[i - h] * sr[i];
        yr[i] = a + b;
      }
    }
  });
  ctx.outputs[0] = std::move(Y);
}

// ONNX's RotaryEmbedding (opset 23), as exporters that target it write rotary position embedding:
// a head's first rotary_embedding_dim values rotated as halves (x1, x2) or interleaved pairs, by cos
// and sin rows read at position_ids from [max_position, >= rot / 2] caches (or given per position,
// [batch, sequence, >= rot / 2]); 4-D [batch, heads, sequence, head] or 3-D [batch, sequence,
// heads * head] input (num_heads). Each product is rounded before its sum, as the operator's
// function body rounds it (this file is compiled without contraction).
void RotaryEmbeddingKernel(KernelContext& ctx) {
  const Tensor& X = ctx.input(0);
  const Tensor& C = ctx.input(1);
  const Tensor& S = ctx.input(2);
  const NodeDescription where{ctx.node};
  if (X.dtype() != DataType::kFloat || C.dtype() != DataType::kFloat || S.dtype() != DataType::kFloat)
    throw UnsupportedError(fmt::format("{}: input type {} (float, float16, bfloat16 are supported)", where,
                                       DataTypeName(X.dtype())));
  const bool interleaved = ctx.node.GetInt("interleaved", 0) != 0;
  const int64_t num_heads = ctx.node.GetInt("num_heads", 0);
  // [B, H, S, D] (4-D) or [B, S, H * D] (3-D, num_heads given); element (b, h, s, d) at
  // b * sb + h * sh + s * ss + d.
  int64_t B, H, L, D, sb, sh, ss;
  if (X.rank() == 4) {
    B = X.dim(0), H = X.dim(1), L = X.dim(2), D = X.dim(3);
    sb = H * L * D, sh = L * D, ss = D;
  } else if (X.rank() == 3) {
    if (num_heads <= 0 || X.dim(2) % num_heads != 0)
      throw Error(fmt::format("{}: a 3-D input needs num_heads dividing its last dimension ({}), got num_heads {}",
                              where, X.dim(2), num_heads));
    B = X.dim(0), L = X.dim(1), H = num_heads, D = X.dim(2) / num_heads;
    sb = L * H * D, sh = D, ss = H * D;
  } else {
    throw Error(fmt::format("{}: input of rank {} (3 or 4 expected)", where, X.rank()));
  }
  int64_t rot = ctx.node.GetInt("rotary_embedding_dim", 0);
  if (rot == 0) rot = D;
  if (rot < 0 || rot > D || rot % 2 != 0)
    throw Error(fmt::format("{}: rotary_embedding_dim {} for a head of {} (even, at most the head)", where, rot, D));
  const int64_t half = rot / 2;
  // cos/sin rows: [max_position, >= half] read at position_ids[b, s], or [B, S, >= half].
  const bool positions = ctx.has_input(3);
  std::vector<int64_t> converted;
  const int64_t* pos = nullptr;
  if (positions) {
    const Tensor& P = ctx.input(3);
    if (P.rank() != 2 || P.dim(0) != B || P.dim(1) != L)
      throw Error(fmt::format("{}: position_ids of shape {} (expected [{}, {}])", where, ShapeToString(P.shape()), B, L));
    if (P.dtype() == DataType::kInt64) {
      pos = P.data<int64_t>();
    } else {
      converted = P.ToInt64s();
      pos = converted.data();
    }
    if (C.rank() != 2 || S.shape() != C.shape() || C.dim(1) < half)
      throw Error(fmt::format("{}: cos/sin caches of shapes {} and {} (expected [max_position, >= {}])", where,
                              ShapeToString(C.shape()), ShapeToString(S.shape()), half));
    for (int64_t i = 0; i < B * L; ++i)
      if (const int64_t p = pos[i]; p < 0 || p >= C.dim(0))
        throw Error(fmt::format("{}: position id {} outside the cos/sin caches' {} rows", where, p, C.dim(0)));
  } else if (C.rank() != 3 || S.shape() != C.shape() || C.dim(0) != B || C.dim(1) != L || C.dim(2) < half) {
    throw Error(fmt::format("{}: cos/sin of shapes {} and {} (expected [{}, {}, >= {}] without position_ids)", where,
                            ShapeToString(C.shape()), ShapeToString(S.shape()), B, L, half));
  }
  const int64_t cw = positions ? C.dim(1) : C.dim(2);
  Tensor Y = Tensor::Uninitialized(DataType::kFloat, X.shape());
  const float* x = X.data<float>();
  const float* cc = C.data<float>();
  const float* sc = S.data<float>();
  float* y = Y.data<float>();
  ParallelFor(B * L, std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(H * D, 1)), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / L, s = i % L;
      const int64_t row = positions ? pos[i] : i;
      const float* c = cc + row * cw;
      const float* sn = sc + row * cw;
      for (int64_t h = 0; h < H; ++h) {
        const float* xh = x + b * sb + h * sh + s * ss;
        float* yh = y + b * sb + h * sh + s * ss;
        if (interleaved) {
          for (int64_t j = 0; j < half; ++j) {
            const float x1 = xh[2 * j], x2 = xh[2 * j + 1];
            const float cx1 = c[j] * x1, sx2 = sn[j] * x2, sx1 = sn[j] * x1, cx2 = c[j] * x2;
            yh[2 * j] = cx1 - sx2;
            yh[2 * j + 1] = sx1 + cx2;
          }
        } else {  // the halves: contiguous, vectorized
#pragma omp simd
          for (int64_t j = 0; j < half; ++j) {
            const float x1 = xh[j], x2 = xh[j + half];
            const float cx1 = c[j] * x1, sx2 = sn[j] * x2, sx1 = sn[j] * x1, cx2 = c[j] * x2;
            yh[j] = cx1 - sx2;
            yh[j + half] = sx1 + cx2;
          }
        }
        for (int64_t d = rot; d < D; ++d) yh[d] = xh[d];
      }
    }
  });
  ctx.outputs[0] = std::move(Y);
}

}  // namespace

void RegisterRotaryKernels(OpRegistry& r) {
  r.Register({"", "RotaryEmbedding", OpKind::kInjective, RotaryEmbeddingKernel});
  // Not upcast: half-precision tensors run the fallback, which rounds in their type.
  r.Register({"ai.graph_autofusion.plan", "RotaryHalf", OpKind::kBroadcast, RotaryHalfKernel, false});
}

}  // namespace gaf
