// FusedCopy (domain ai.graph_autofusion.plan): a tree of data-movement operators (Concat,
// Transpose, Slice, Reshape, Flatten, Identity) that a session's plan rewrite groups
// (runtime/plan_rewrite.h), run as one pass that copies every element once, from the tree's
// inputs straight to its output.
//
//   inputs    the tree's inputs: data, and the Slice/Reshape parameters
//   fallback  the original operators, as a graph on those inputs
//
// Each run replays the operators on views instead of tensors: a value is a list of pieces, each
// a strided box of one input (offset, extents, strides) placed at a position of the value. Concat
// shifts pieces, Transpose permutes their axes, Slice cuts and strides them, and Reshape merges or
// splits axes that every piece spans whole. The output's pieces are then copied: rows by memcpy,
// every other element by EveryOther4, and pieces whose source runs along another axis by 8x8
// register transposes (ops/copy_kernels.h). A detector head's Concat, Reshape, Concat and
// Transpose thus write their [1, anchors, 85] output once instead of four times.
//
// Anything the views cannot express (a Reshape that cuts through a piece, a string tensor,
// mismatched shapes, zero-sized values) runs the fallback graph, whose operators give the result,
// or the error, they always did.
#include <fmt/format.h>

#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "ops/copy_kernels.h"
#include "ops/kernel.h"
#include "ops/kernel_util.h"

namespace gaf {
namespace {

constexpr int64_t kGrain = 1 << 15;  // elements of work per parallel chunk (as tensor_ops.cc)

struct Piece {
  int src = 0;             // index of the input it reads
  int64_t offset = 0;      // element offset in that input
  Shape shape;             // extents, per axis of the value
  std::vector<int64_t> strides, start;  // source strides; position in the value
};

struct View {
  Shape shape;
  std::vector<Piece> pieces;
};

// Rounded divisions for b > 0 that cannot overflow (b may be a step near INT64_MAX).
int64_t FloorDiv(int64_t a, int64_t b) { return a / b - (a % b != 0 && a < 0 ? 1 : 0); }
int64_t CeilDivSigned(int64_t a, int64_t b) { return a / b + (a % b != 0 && a > 0 ? 1 : 0); }

std::optional<View> DoConcat(const std::vector<const View*>& ins, int64_t axis) {
  if (ins.empty()) return std::nullopt;
  const int64_t r = static_cast<int64_t>(ins[0]->shape.size());
  if (axis < -r || axis >= r) return std::nullopt;
  if (axis < 0) axis += r;
  View out;
  out.shape = ins[0]->shape;
  out.shape[axis] = 0;
  for (const View* v : ins) {
    if (static_cast<int64_t>(v->shape.size()) != r) return std::nullopt;
    for (int64_t d = 0; d < r; ++d)
      if (d != axis && v->shape[d] != out.shape[d]) return std::nullopt;
    for (Piece p : v->pieces) {
      p.start[axis] += out.shape[axis];
      out.pieces.push_back(std::move(p));
    }
    out.shape[axis] += v->shape[axis];
  }
  return out;
}

std::optional<View> DoTranspose(const View& v, std::vector<int64_t> perm) {
  const size_t r = v.shape.size();
  if (perm.empty())
    for (size_t i = r; i-- > 0;) perm.push_back(static_cast<int64_t>(i));
  if (perm.size() != r) return std::nullopt;
  std::vector<bool> seen(r, false);
  for (int64_t a : perm) {
    if (a < 0 || a >= static_cast<int64_t>(r) || seen[a]) return std::nullopt;
    seen[a] = true;
  }
  View out;
  for (int64_t a : perm) out.shape.push_back(v.shape[a]);
  for (const Piece& p : v.pieces) {
    Piece q{p.src, p.offset, {}, {}, {}};
    for (int64_t a : perm) {
      q.shape.push_back(p.shape[a]);
      q.strides.push_back(p.strides[a]);
      q.start.push_back(p.start[a]);
    }
    out.pieces.push_back(std::move(q));
  }
  return out;
}

// ONNX Slice on one axis of extent dim: the first index, the step and the count taken.
void SliceAxis(int64_t dim, int64_t st, int64_t en, int64_t step, int64_t* first, int64_t* count) {
  if (step > 0) {
    st = std::clamp<int64_t>(st < 0 ? st + dim : st, 0, dim);
    en = std::clamp<int64_t>(en < 0 ? en + dim : en, 0, dim);
    *count = en > st ? CeilDivSigned(en - st, step) : 0;
  } else {
    st = std::clamp<int64_t>(st < 0 ? st + dim : st, -1, dim - 1);
    en = std::clamp<int64_t>(en < 0 ? en + dim : en, -1, dim - 1);
    *count = st > en ? CeilDivSigned(st - en, -step) : 0;
  }
  *first = st;
}

std::optional<View> DoSlice(const View& v, const std::vector<int64_t>& starts, const std::vector<int64_t>& ends,
                            std::vector<int64_t> axes, std::vector<int64_t> steps) {
  const int64_t r = static_cast<int64_t>(v.shape.size());
  const size_t k = starts.size();
  if (ends.size() != k) return std::nullopt;
  if (axes.empty())
    for (size_t i = 0; i < k; ++i) axes.push_back(static_cast<int64_t>(i));
  if (steps.empty()) steps.assign(k, 1);
  if (axes.size() != k || steps.size() != k) return std::nullopt;
  View out = v;
  std::vector<bool> seen(r, false);
  for (size_t i = 0; i < k; ++i) {
    int64_t a = axes[i] < 0 ? axes[i] + r : axes[i];
    // (A step of INT64_MIN has no negation: the operators handle it.)
    if (a < 0 || a >= r || seen[a] || steps[i] == 0 || steps[i] == std::numeric_limits<int64_t>::min())
      return std::nullopt;
    seen[a] = true;
    const int64_t step = steps[i];
    int64_t first = 0, count = 0;
    SliceAxis(v.shape[a], starts[i], ends[i], step, &first, &count);
    std::vector<Piece> kept;
    for (Piece p : out.pieces) {
      // Indices first + j * step (j < count) that fall in [p0, p0 + len).
      const int64_t p0 = p.start[a], len = p.shape[a];
      int64_t lo, hi;
      if (step > 0) {
        lo = std::max<int64_t>(0, CeilDivSigned(p0 - first, step));
        hi = std::min<int64_t>(count, CeilDivSigned(p0 + len - first, step));
      } else {
        lo = std::max<int64_t>(0, CeilDivSigned(first - (p0 + len - 1), -step));
        hi = std::min<int64_t>(count, FloorDiv(first - p0, -step) + 1);
      }
      if (lo >= hi) continue;
      p.offset += (first + lo * step - p0) * p.strides[a];
      // One index taken: its stride is never used (and a huge step would overflow it); more:
      // (hi - lo - 1) * |step| < len, so the product stays within the tensor.
      if (hi - lo > 1) p.strides[a] *= step;
      p.shape[a] = hi - lo;
      p.start[a] = lo;
      kept.push_back(std::move(p));
    }
    out.pieces = std::move(kept);
    out.shape[a] = count;
  }
  return out;
}

// Reshape by groups of axes with equal products: a group that merges or splits axes must be
// spanned whole by every piece, with strides that merge (each the next one's times its extent).
std::optional<View> DoReshape(const View& v, const Shape& to) {
  int64_t n = 1;  // overflow-checked: a target from a file may multiply past 64 bits
  for (int64_t d : to)
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return std::nullopt;
  if (n != NumElements(v.shape)) return std::nullopt;
  View out;
  out.shape = to;
  const size_t ro = v.shape.size(), rn = to.size();
  struct Group {
    size_t o0, o1, n0, n1;
  };
  std::vector<Group> groups;
  size_t i = 0, j = 0;
  while (i < ro || j < rn) {
    Group g{i, i, j, j};
    int64_t po = 1, pn = 1;
    if (i < ro) po *= v.shape[i++];
    if (j < rn) pn *= to[j++];
    while (po != pn) {
      if (po < pn && i < ro) po *= v.shape[i++];
      else if (pn < po && j < rn) pn *= to[j++];
      else return std::nullopt;
    }
    g.o1 = i, g.n1 = j;
    groups.push_back(g);
  }
  for (const Piece& p : v.pieces) {
    Piece q{p.src, p.offset, Shape(rn), std::vector<int64_t>(rn), std::vector<int64_t>(rn)};
    for (const Group& g : groups) {
      if (g.o1 - g.o0 == 1 && g.n1 - g.n0 == 1) {
        q.shape[g.n0] = p.shape[g.o0];
        q.strides[g.n0] = p.strides[g.o0];
        q.start[g.n0] = p.start[g.o0];
        continue;
      }
      // Whole along the group's axes, and the source strides of its axes (extent > 1) merge.
      int64_t inner = 0;
      bool have = false;
      for (size_t a = g.o1; a-- > g.o0;) {
        if (p.start[a] != 0 || p.shape[a] != v.shape[a]) return std::nullopt;
        if (v.shape[a] == 1) continue;
        if (!have) {
          inner = p.strides[a];
          have = true;
        } else if (p.strides[a] != inner) {
          return std::nullopt;
        }
        inner *= v.shape[a];
      }
      // Split: the new axes' strides from the innermost one outwards.
      int64_t s = 0;
      for (size_t a = g.o1; a-- > g.o0;)
        if (v.shape[a] != 1) {
          s = p.strides[a];
          break;
        }
      for (size_t b = g.n1; b-- > g.n0;) {
        q.shape[b] = to[b];
        q.start[b] = 0;
        q.strides[b] = s;
        s *= to[b];
      }
    }
    out.pieces.push_back(std::move(q));
  }
  return out;
}

// Copies a piece: src strides ss, dst strides ds, extents n (elements of es bytes).
void CopyPiece(const char* src, std::vector<int64_t> ss, char* dst, std::vector<int64_t> ds, Shape n, size_t es) {
  // Drop unit axes, then merge axes adjacent in both.
  Shape m;
  std::vector<int64_t> ms, md;
  for (size_t a = 0; a < n.size(); ++a) {
    if (n[a] == 1) continue;
    if (!m.empty() && ms.back() == ss[a] * n[a] && md.back() == ds[a] * n[a]) {
      m.back() *= n[a];
      ms.back() = ss[a];
      md.back() = ds[a];
    } else {
      m.push_back(n[a]);
      ms.push_back(ss[a]);
      md.push_back(ds[a]);
    }
  }
  if (m.empty()) {
    std::memcpy(dst, src, es);
    return;
  }
  const size_t r = m.size();
  const int64_t L = m[r - 1], s_in = ms[r - 1], s_out = md[r - 1];
  // The axis the source runs along (stride 1), when it is not the innermost: 2-D transposes.
  size_t q = r;
  if (es == 4 && s_out == 1 && s_in != 1)
    for (size_t a = 0; a + 1 < r; ++a)
      if (ms[a] == 1) q = a;
  Shape outer;
  std::vector<int64_t> os, od;
  for (size_t a = 0; a + 1 < r; ++a)
    if (a != q) {
      outer.push_back(m[a]);
      os.push_back(ms[a]);
      od.push_back(md[a]);
    }
  const int64_t n_outer = NumElements(outer);
  const int64_t work = q < r ? m[q] * L : L;
  ParallelFor(n_outer, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, work)), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      int64_t rem = t, si = 0, di = 0;
      for (size_t d = outer.size(); d-- > 0;) {
        const int64_t c = rem % outer[d];
        rem /= outer[d];
        si += c * os[d];
        di += c * od[d];
      }
      const char* sp = src + si * static_cast<int64_t>(es);
      char* dp = dst + di * static_cast<int64_t>(es);
      if (q < r) {
        Transpose2D(reinterpret_cast<const uint32_t*>(sp), s_in, reinterpret_cast<uint32_t*>(dp), md[q], m[q], L);
      } else if (s_in == 1 && s_out == 1) {
        std::memcpy(dp, sp, static_cast<size_t>(L) * es);
      } else if (es == 4 && s_in == 2 && s_out == 1) {
        EveryOther4(reinterpret_cast<const uint32_t*>(sp), reinterpret_cast<uint32_t*>(dp), L);
      } else {
        for (int64_t j = 0; j < L; ++j) std::memcpy(dp + j * s_out * es, sp + j * s_in * es, es);
      }
    }
  });
}

std::vector<int64_t> IntsOf(const KernelContext& ctx, const std::unordered_map<std::string, int>& formal,
                            const std::string& name, bool* ok) {
  auto it = formal.find(name);
  if (it == formal.end() || !ctx.has_input(it->second)) {
    *ok = false;
    return {};
  }
  const Tensor& t = *ctx.inputs[it->second];
  if (t.dtype() != DataType::kInt64 && t.dtype() != DataType::kInt32) {
    *ok = false;
    return {};
  }
  return t.ToInt64s();
}

// The output view of the fallback graph's operators on views of the inputs; nullopt when some
// operator is not expressible (the fallback then runs).
std::optional<View> Replay(const KernelContext& ctx, const Graph& g, int opset) {
  std::unordered_map<std::string, int> formal;
  for (size_t i = 0; i < g.inputs.size(); ++i) formal[g.inputs[i].name] = static_cast<int>(i);
  std::unordered_map<std::string, View> views;
  auto view_of = [&](const std::string& name) -> const View* {
    if (auto it = views.find(name); it != views.end()) return &it->second;
    auto f = formal.find(name);
    if (f == formal.end() || !ctx.has_input(f->second)) return nullptr;
    const Tensor& t = *ctx.inputs[f->second];
    View v;
    v.shape = t.shape();
    Piece p{f->second, 0, t.shape(), Strides(t.shape()), std::vector<int64_t>(t.shape().size(), 0)};
    v.pieces.push_back(std::move(p));
    return &views.emplace(name, std::move(v)).first->second;
  };
  for (const Node& n : g.nodes) {
    if (n.outputs.size() != 1 || n.inputs.empty()) return std::nullopt;
    const View* x = view_of(n.inputs[0]);
    if (x == nullptr) return std::nullopt;
    std::optional<View> y;
    bool ok = true;
    if (n.op_type == "Concat") {
      std::vector<const View*> ins;
      for (const std::string& in : n.inputs) {
        const View* v = in.empty() ? nullptr : view_of(in);
        if (v == nullptr) return std::nullopt;
        ins.push_back(v);
      }
      y = DoConcat(ins, n.GetInt("axis", 0));
    } else if (n.op_type == "Transpose") {
      y = DoTranspose(*x, n.HasAttr("perm") ? n.GetInts("perm") : std::vector<int64_t>{});
    } else if (n.op_type == "Slice" && opset >= 10 && n.inputs.size() >= 3) {
      auto param = [&](size_t k) { return n.inputs.size() > k && !n.inputs[k].empty() ? IntsOf(ctx, formal, n.inputs[k], &ok) : std::vector<int64_t>{}; };
      const std::vector<int64_t> st = param(1), en = param(2), ax = param(3), sp = param(4);
      if (ok) y = DoSlice(*x, st, en, ax, sp);
    } else if (n.op_type == "Reshape" && opset >= 5 && n.inputs.size() == 2 && n.GetInt("allowzero", 0) == 0) {
      const std::vector<int64_t> s = IntsOf(ctx, formal, n.inputs[1], &ok);
      const Shape to = ok ? ResolveReshape(x->shape, s) : Shape{};
      if (ok && to.size() == s.size()) y = DoReshape(*x, to);  // else invalid: the fallback says why
    } else if (n.op_type == "Flatten") {
      const int64_t r = static_cast<int64_t>(x->shape.size());
      int64_t axis = n.GetInt("axis", 1);
      if (axis < 0) axis += r;
      if (axis >= 0 && axis <= r) {
        int64_t a = 1, b = 1;
        for (int64_t d = 0; d < r; ++d) (d < axis ? a : b) *= x->shape[d];
        y = DoReshape(*x, {a, b});
      }
    } else if (n.op_type == "Identity") {
      y = *x;
    }
    if (!y) return std::nullopt;
    views[n.outputs[0]] = std::move(*y);
  }
  if (g.outputs.size() != 1) return std::nullopt;
  auto it = views.find(g.outputs[0].name);
  if (it == views.end()) return std::nullopt;
  return std::move(it->second);
}

void FusedCopyKernel(KernelContext& ctx) {
  const Graph* g = ctx.node.GetGraph("fallback");
  GAF_CHECK(g != nullptr, "{}: no fallback graph", ctx.node.Describe());
  // The default domain's opset (the node's own is the plan domain's).
  std::optional<View> v = Replay(ctx, *g, ctx.node.GetInt("opset", 0));
  DataType dt = DataType::kUndefined;
  bool ok = v.has_value() && NumElements(v->shape) > 0;
  int64_t covered = 0;
  if (ok) {
    for (const Piece& p : v->pieces) {
      const Tensor& t = *ctx.inputs[p.src];
      if (dt == DataType::kUndefined) dt = t.dtype();
      ok &= t.dtype() == dt && dt != DataType::kString;
      covered += NumElements(p.shape);
    }
    ok &= covered == NumElements(v->shape);  // the pieces tile the output
  }
  if (!ok) {
    RunPlanFallback(ctx);
    return;
  }
  Tensor out = Tensor::Uninitialized(dt, v->shape);
  const size_t es = DataTypeSize(dt);
  const std::vector<int64_t> ostr = Strides(v->shape);
  for (const Piece& p : v->pieces) {
    int64_t at = 0;
    for (size_t a = 0; a < ostr.size(); ++a) at += p.start[a] * ostr[a];
    const char* src = static_cast<const char*>(ctx.inputs[p.src]->raw()) + p.offset * static_cast<int64_t>(es);
    CopyPiece(src, p.strides, static_cast<char*>(out.raw()) + at * static_cast<int64_t>(es), ostr, p.shape, es);
  }
  ctx.outputs[0] = std::move(out);
}

}  // namespace

void RegisterCopyKernels(OpRegistry& r) {
  r.Register({"ai.graph_autofusion.plan", "FusedCopy", OpKind::kInjective, FusedCopyKernel, false});
}

}  // namespace gaf
