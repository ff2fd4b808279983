// Shape and data-movement kernels: Reshape, Transpose, Concat, Split, Slice, Gather, Scatter,
// Pad, Resize, ... Data movement dispatches by element size only, so every fixed-size type
// (including float16/bfloat16 and bool) is handled without conversion.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "ops/copy_kernels.h"
#include "ops/kernel.h"
#include "ops/kernel_util.h"

namespace gaf {
namespace {

constexpr int64_t kGrain = 1 << 15;  // elements of work per parallel chunk

// ---------------------------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------------------------

int64_t Product(const Shape& s, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end && i < s.size(); ++i) p *= s[i];
  return p;
}

// Returns an attribute's ints or, from `input_opset` on, the ints of input `idx` (absent -> empty,
// *present = false).
std::vector<int64_t> IntsFromAttrOrInput(const KernelContext& ctx, const char* name, size_t idx,
                                         int64_t input_opset, bool* present) {
  if (ctx.opset >= input_opset) {
    *present = ctx.has_input(idx);
    return *present ? ctx.inputs[idx]->ToInt64s() : std::vector<int64_t>{};
  }
  *present = ctx.node.HasAttr(name);
  return ctx.node.GetInts(name);
}

// Raw bytes of a single value `v` stored as data type dt.
std::vector<uint8_t> ValueBytes(double v, DataType dt, const Node& node) {
  size_t es = DataTypeSize(dt);
  GAF_CHECK(es > 0, "{}: data type {} is not supported", node.Describe(), DataTypeName(dt));
  if (dt == DataType::kString) GAF_UNSUPPORTED("{}: string tensors are not supported", node.Describe());
  Tensor t = Tensor::Scalar<double>(v).CastTo(dt);
  std::vector<uint8_t> b(es);
  std::memcpy(b.data(), t.raw(), es);
  return b;
}

template <class T>
T FromBytes(const std::vector<uint8_t>& b) {
  T v;
  std::memcpy(&v, b.data(), sizeof(T));
  return v;
}

void CheckNotString(const Tensor& t, const Node& node) {
  if (t.dtype() == DataType::kString) GAF_UNSUPPORTED("{}: string tensors are not supported", node.Describe());
}

// Iterates over the "rows" [begin, end) of a row-major index space `dims` (all dims but the last
// of some tensor) keeping a coordinate vector up to date. fn(row, coords).
template <class F>
void ForRows(const Shape& dims, int64_t begin, int64_t end, F&& fn) {
  size_t r = dims.size();
  std::vector<int64_t> c(r, 0);
  int64_t rem = begin;
  for (size_t d = r; d-- > 0;) {
    if (dims[d] > 0) {
      c[d] = rem % dims[d];
      rem /= dims[d];
    }
  }
  for (int64_t row = begin; row < end; ++row) {
    fn(row, c);
    for (size_t d = r; d-- > 0;) {
      if (++c[d] < dims[d]) break;
      c[d] = 0;
    }
  }
}

// Copies the strided view (in + offset, shape, strides in elements) into contiguous `out`.
// Dimensions are coalesced where the view is contiguous; the innermost copy is a memcpy for unit
// stride, a fill for stride 0, every other element by EveryOther4 (ops/copy_kernels.h) for
// 4-byte elements at stride 2, and a strided loop otherwise.
template <class T>
void StridedCopy(const T* in, int64_t offset, const Shape& shape, const std::vector<int64_t>& strides, T* out) {
  Shape s;
  std::vector<int64_t> st;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 0) return;
    if (shape[d] == 1) continue;
    if (!s.empty() && st.back() == strides[d] * shape[d]) {
      s.back() *= shape[d];
      st.back() = strides[d];
    } else {
      s.push_back(shape[d]);
      st.push_back(strides[d]);
    }
  }
  if (s.empty()) {
    out[0] = in[offset];
    return;
  }
  const int64_t inner = s.back(), istride = st.back();
  Shape outer(s.begin(), s.end() - 1);
  const int64_t rows = NumElements(outer);
  ParallelFor(rows, std::max<int64_t>(1, kGrain / inner), [&](int64_t b, int64_t e) {
    ForRows(outer, b, e, [&](int64_t row, const std::vector<int64_t>& c) {
      int64_t off = offset;
      for (size_t d = 0; d < c.size(); ++d) off += c[d] * st[d];
      const T* src = in + off;
      T* dst = out + row * inner;
      if (istride == 1) {
        std::memcpy(dst, src, inner * sizeof(T));
      } else if (istride == 0) {
        std::fill(dst, dst + inner, *src);
      } else if (istride == 2 && sizeof(T) == 4) {
        EveryOther4(src, dst, inner);
      } else {
        for (int64_t j = 0; j < inner; ++j) dst[j] = src[j * istride];
      }
    });
  });
}

// out = transpose(in, perm) for an input of shape in_shape.
template <class T>
void TransposeImpl(const T* in, T* out, const Shape& in_shape, const std::vector<int64_t>& perm) {
  const size_t r0 = in_shape.size();
  if (NumElements(in_shape) == 0) return;
  // Drop size-1 input axes.
  std::vector<int64_t> newidx(r0, -1);
  Shape s1;
  for (size_t i = 0; i < r0; ++i) {
    if (in_shape[i] != 1) {
      newidx[i] = static_cast<int64_t>(s1.size());
      s1.push_back(in_shape[i]);
    }
  }
  std::vector<int64_t> p1;
  for (size_t i = 0; i < r0; ++i)
    if (newidx[perm[i]] >= 0) p1.push_back(newidx[perm[i]]);
  // Merge input axes that stay adjacent and in order in the output.
  std::vector<std::vector<int64_t>> groups;  // in output order, each a run of input axes
  for (size_t i = 0; i < p1.size(); ++i) {
    if (!groups.empty() && groups.back().back() + 1 == p1[i])
      groups.back().push_back(p1[i]);
    else
      groups.push_back({p1[i]});
  }
  std::vector<size_t> order(groups.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return groups[a][0] < groups[b][0]; });
  const size_t r = groups.size();
  Shape s(r);
  std::vector<int64_t> p(r), rank_of(r);
  for (size_t k = 0; k < r; ++k) rank_of[order[k]] = static_cast<int64_t>(k);
  for (size_t k = 0; k < r; ++k) {
    int64_t sz = 1;
    for (int64_t a : groups[order[k]]) sz *= s1[a];
    s[k] = sz;
  }
  for (size_t i = 0; i < r; ++i) p[i] = rank_of[i];
  const int64_t n = NumElements(s);
  if (r <= 1) {
    std::memcpy(out, in, n * sizeof(T));
    return;
  }
  std::vector<int64_t> is = Strides(s);
  Shape oshape(r);
  std::vector<int64_t> vstr(r);
  for (size_t i = 0; i < r; ++i) {
    oshape[i] = s[p[i]];
    vstr[i] = is[p[i]];
  }
  if (p[r - 1] == static_cast<int64_t>(r) - 1) {  // last axis stays contiguous: row copies
    StridedCopy(in, 0, oshape, vstr, out);
    return;
  }
  // Blocked 2-D transpose between output axis q (input's contiguous axis) and the output's last
  // axis, batched over the remaining output axes.
  std::vector<int64_t> os = Strides(oshape);
  size_t q = 0;
  while (p[q] != static_cast<int64_t>(r) - 1) ++q;
  const int64_t P = oshape[q], L = oshape[r - 1];
  const int64_t sa = vstr[r - 1], osq = os[q];
  Shape outer_dims;
  std::vector<int64_t> outer_is, outer_os;
  for (size_t i = 0; i + 1 < r; ++i) {
    if (i == q) continue;
    outer_dims.push_back(oshape[i]);
    outer_is.push_back(vstr[i]);
    outer_os.push_back(os[i]);
  }
  const int64_t n_outer = NumElements(outer_dims);
  // Tiles of 128 input-contiguous elements (Transpose2D's own tile) shared among the threads.
  constexpr int64_t BI = 128;
  const int64_t nib = (P + BI - 1) / BI;
  ParallelFor(n_outer * nib, std::max<int64_t>(1, kGrain / (BI * L)), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      int64_t o = t / nib, ib = t % nib;
      int64_t ibase = 0, obase = 0, rem = o;
      for (size_t d = outer_dims.size(); d-- > 0;) {
        int64_t c = rem % outer_dims[d];
        rem /= outer_dims[d];
        ibase += c * outer_is[d];
        obase += c * outer_os[d];
      }
      const int64_t i0 = ib * BI, i1 = std::min(P, i0 + BI);
      if constexpr (sizeof(T) == 4) {
        Transpose2D(in + ibase + i0, sa, out + obase + i0 * osq, osq, i1 - i0, L);
      } else {  // other sizes: 128 x 32 tiles element by element
        for (int64_t j0 = 0; j0 < L; j0 += 32) {
          const int64_t j1 = std::min(L, j0 + 32);
          for (int64_t i = i0; i < i1; ++i) {
            T* dst = out + obase + i * osq;
            const T* src = in + ibase + i;
            for (int64_t j = j0; j < j1; ++j) dst[j] = src[j * sa];
          }
        }
      }
    }
  });
}

void TransposeTensor(const Tensor& in, Tensor& out, const Shape& in_view, const std::vector<int64_t>& perm,
                     const Node& node) {
  DispatchBySize(in.dtype(), node, [&](auto tag) {
    using T = decltype(tag);
    TransposeImpl(static_cast<const T*>(in.raw()), static_cast<T*>(out.raw()), in_view, perm);
  });
}

// Reads an index, validates it against [-n, n) and normalizes it.
inline int64_t NormIndex(int64_t v, int64_t n, const Node& node, const char* what) {
  GAF_CHECK(v >= -n && v < n, "{}: {} index {} is out of range for dimension {}", node.Describe(), what, v, n);
  return v < 0 ? v + n : v;
}

// A dimension computed in floating point (Resize scales, Range, OneHot depth): gaf::Error when
// it is not finite or past what any tensor could have, instead of an undefined conversion.
int64_t DimFromDouble(double v, const Node& node, const char* what) {
  GAF_CHECK(std::isfinite(v) && v < 0x1p62, "{}: {} {:g} is not a valid size", node.Describe(), what, v);
  return static_cast<int64_t>(v);
}

// ---------------------------------------------------------------------------------------------
// Reshape family (zero copy: outputs share the input's buffer)
// ---------------------------------------------------------------------------------------------

void ReshapeKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  std::vector<int64_t> req;
  if (ctx.opset >= 5) {
    req = ctx.input(1).ToInt64s();
  } else {
    GAF_CHECK(node.HasAttr("shape"), "{}: missing shape attribute", node.Describe());
    req = node.GetInts("shape");
  }
  const bool allowzero = node.GetInt("allowzero", 0) != 0;
  Shape out(req.size());
  int64_t infer = -1, known = 1;
  for (size_t i = 0; i < req.size(); ++i) {
    int64_t v = req[i];
    if (v == -1) {
      GAF_CHECK(infer < 0, "{}: more than one -1 in the requested shape", node.Describe());
      infer = static_cast<int64_t>(i);
      continue;
    }
    if (v == 0 && !allowzero) {
      GAF_CHECK(i < x.shape().size(), "{}: 0 at position {} but the input has rank {}", node.Describe(), i,
                x.rank());
      v = x.shape()[i];
    }
    GAF_CHECK(v >= 0, "{}: invalid dimension {} in the requested shape", node.Describe(), req[i]);
    out[i] = v;
    known = CheckedMul(known, v, "requested shape");
  }
  if (infer >= 0) {
    GAF_CHECK(known != 0 && x.numel() % known == 0, "{}: cannot infer -1 reshaping {} to {}", node.Describe(),
              ShapeToString(x.shape()), ShapeToString(req));
    out[infer] = x.numel() / known;
  }
  GAF_CHECK(NumElements(out) == x.numel(), "{}: cannot reshape {} to {}", node.Describe(),
            ShapeToString(x.shape()), ShapeToString(out));
  ctx.outputs[0] = x.Reshaped(out);
}

void FlattenKernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  int64_t r = x.rank();
  int64_t axis = ctx.node.GetInt("axis", 1);
  GAF_CHECK(axis >= -r && axis <= r, "{}: axis {} is out of range for rank {}", ctx.node.Describe(), axis, r);
  if (axis < 0) axis += r;
  ctx.outputs[0] = x.Reshaped({Product(x.shape(), 0, axis), Product(x.shape(), axis, r)});
}

void SqueezeKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  bool present;
  std::vector<int64_t> axes = IntsFromAttrOrInput(ctx, "axes", 1, 13, &present);
  const int64_t r = x.rank();
  std::vector<bool> drop(r, false);
  if (axes.empty()) {
    for (int64_t i = 0; i < r; ++i) drop[i] = x.shape()[i] == 1;
  } else {
    for (int64_t a : axes) {
      a = NormalizeAxis(a, r, node);
      GAF_CHECK(x.shape()[a] == 1, "{}: cannot squeeze axis {} of size {}", node.Describe(), a, x.shape()[a]);
      drop[a] = true;
    }
  }
  Shape out;
  for (int64_t i = 0; i < r; ++i)
    if (!drop[i]) out.push_back(x.shape()[i]);
  ctx.outputs[0] = x.Reshaped(out);
}

void UnsqueezeKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  bool present;
  std::vector<int64_t> axes = IntsFromAttrOrInput(ctx, "axes", 1, 13, &present);
  GAF_CHECK(present, "{}: axes are required", node.Describe());
  const int64_t r = x.rank() + static_cast<int64_t>(axes.size());
  std::vector<bool> ins(r, false);
  for (int64_t a : axes) {
    a = NormalizeAxis(a, r, node);
    GAF_CHECK(!ins[a], "{}: axis {} is repeated", node.Describe(), a);
    ins[a] = true;
  }
  Shape out(r);
  size_t k = 0;
  for (int64_t i = 0; i < r; ++i) out[i] = ins[i] ? 1 : x.shape()[k++];
  ctx.outputs[0] = x.Reshaped(out);
}

void IdentityKernel(KernelContext& ctx) { ctx.outputs[0] = ctx.input(0); }

// The plan's LastPosition (runtime/plan_rewrite.h): X as it is, or in runs that read only the last
// position (KernelContext::last_position_only) X[:, -1:, :] of a [batch, positions, K] operand.
void LastPositionKernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (!ctx.last_position_only || x.rank() != 3 || x.dim(1) <= 1) {
    ctx.outputs[0] = x;
    return;
  }
  const int64_t b = x.dim(0), s = x.dim(1), k = x.dim(2);
  Tensor y = Tensor::Uninitialized(x.dtype(), {b, 1, k});
  const size_t row = static_cast<size_t>(k) * DataTypeSize(x.dtype());
  const char* src = static_cast<const char*>(x.raw());
  char* dst = static_cast<char*>(y.raw());
  for (int64_t i = 0; i < b; ++i) std::memcpy(dst + i * row, src + (i * s + s - 1) * row, row);
  ctx.outputs[0] = std::move(y);
}

void DropoutKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  if (ctx.opset >= 12 && ctx.has_input(2) && ctx.inputs[2]->numel() > 0 && ctx.inputs[2]->ScalarAsInt64() != 0) {
    double ratio = ctx.has_input(1) && ctx.inputs[1]->numel() > 0 ? ctx.inputs[1]->ScalarAsDouble() : 0.5;
    if (ratio != 0.0) GAF_UNSUPPORTED("{}: training_mode=true (random dropout) is not supported", node.Describe());
  }
  ctx.outputs[0] = x;
  if (ctx.has_output(1)) {
    DataType mdt = ctx.opset >= 10 ? DataType::kBool : x.dtype();
    Tensor m(mdt, x.shape());
    std::vector<uint8_t> one = ValueBytes(1.0, mdt, node);
    DispatchBySize(mdt, node, [&](auto tag) {
      using T = decltype(tag);
      std::fill_n(static_cast<T*>(m.raw()), m.numel(), FromBytes<T>(one));
    });
    ctx.outputs[1] = m;
  }
}

// ---------------------------------------------------------------------------------------------
// Transpose, Concat, Split, Slice
// ---------------------------------------------------------------------------------------------

void TransposeKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  CheckNotString(x, node);
  const int64_t r = x.rank();
  std::vector<int64_t> perm = node.GetInts("perm");
  if (perm.empty()) {
    perm.resize(r);
    for (int64_t i = 0; i < r; ++i) perm[i] = r - 1 - i;
  }
  GAF_CHECK(static_cast<int64_t>(perm.size()) == r, "{}: perm has {} entries for rank {}", node.Describe(),
            perm.size(), r);
  std::vector<bool> seen(r, false);
  Shape out(r);
  for (int64_t i = 0; i < r; ++i) {
    int64_t a = NormalizeAxis(perm[i], r, node);
    GAF_CHECK(!seen[a], "{}: perm repeats axis {}", node.Describe(), a);
    seen[a] = true;
    perm[i] = a;
    out[i] = x.shape()[a];
  }
  // A permutation that keeps the axes longer than 1 in their order (a decode step's [b, 1, h, d] to
  // [b, h, 1, d]) moves no element: the output is the input's buffer under the new shape.
  int64_t last = -1;
  bool in_order = true;
  for (int64_t i = 0; i < r && in_order; ++i) {
    if (out[i] == 1) continue;
    in_order = perm[i] > last;
    last = perm[i];
  }
  if (in_order) {
    ctx.outputs[0] = x.Reshaped(out);
    return;
  }
  ctx.outputs[0] = Tensor::Uninitialized(x.dtype(), out);  // every element is written
  TransposeTensor(x, ctx.outputs[0], x.shape(), perm, node);
}

void ConcatKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  std::vector<const Tensor*> ins;
  for (const Tensor* t : ctx.inputs)
    if (t) ins.push_back(t);
  GAF_CHECK(!ins.empty(), "{}: no inputs", node.Describe());
  const Tensor& x0 = *ins[0];
  CheckNotString(x0, node);
  const int64_t r = x0.rank();
  GAF_CHECK(r > 0, "{}: cannot concatenate scalars", node.Describe());
  const int64_t axis = NormalizeAxis(node.GetInt("axis", ctx.opset < 4 ? 1 : 0), r, node);
  Shape out = x0.shape();
  out[axis] = 0;
  for (const Tensor* t : ins) {
    GAF_CHECK(t->dtype() == x0.dtype(), "{}: inputs have different data types", node.Describe());
    GAF_CHECK(t->rank() == r, "{}: inputs have different ranks", node.Describe());
    for (int64_t d = 0; d < r; ++d)
      GAF_CHECK(d == axis || t->shape()[d] == x0.shape()[d], "{}: input shapes {} and {} differ outside axis {}",
                node.Describe(), ShapeToString(x0.shape()), ShapeToString(t->shape()), axis);
    out[axis] = CheckedAdd(out[axis], t->shape()[axis], "concatenated size");
  }
  Tensor y = Tensor::Uninitialized(x0.dtype(), out);  // the inputs cover every element
  const size_t es = DataTypeSize(x0.dtype());
  const int64_t outer = Product(out, 0, axis), inner = Product(out, axis + 1, r);
  const int64_t out_row = out[axis] * inner * es;
  uint8_t* dst = static_cast<uint8_t*>(y.raw());
  int64_t col = 0;
  for (const Tensor* t : ins) {
    const int64_t chunk = t->shape()[axis] * inner * es;
    const uint8_t* src = static_cast<const uint8_t*>(t->raw());
    if (chunk > 0) {
      ParallelFor(outer, std::max<int64_t>(1, kGrain * 4 / chunk), [&](int64_t b, int64_t e) {
        for (int64_t o = b; o < e; ++o) CopyBytes(dst + o * out_row + col, src + o * chunk, chunk);
      });
    }
    col += chunk;
  }
  ctx.outputs[0] = y;
}

void SplitKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  CheckNotString(x, node);
  const int64_t r = x.rank();
  const int64_t axis = NormalizeAxis(node.GetInt("axis", 0), r, node);
  const int64_t dim = x.shape()[axis];
  const int64_t nout = static_cast<int64_t>(ctx.num_outputs());
  bool present;
  std::vector<int64_t> split = IntsFromAttrOrInput(ctx, "split", 1, 13, &present);
  if (split.empty()) {
    int64_t n = node.GetInt("num_outputs", 0);
    if (n > 0) {
      GAF_CHECK(n == nout, "{}: num_outputs={} but the node has {} outputs", node.Describe(), n, nout);
      int64_t chunk = (dim + n - 1) / n;
      for (int64_t i = 0; i < n; ++i) split.push_back(std::max<int64_t>(0, std::min(chunk, dim - i * chunk)));
    } else {
      GAF_CHECK(nout > 0 && dim % nout == 0, "{}: dimension {} does not split evenly into {} outputs",
                node.Describe(), dim, nout);
      split.assign(nout, dim / nout);
    }
  }
  GAF_CHECK(static_cast<int64_t>(split.size()) == nout, "{}: {} split sizes for {} outputs", node.Describe(),
            split.size(), nout);
  int64_t total = 0;
  for (int64_t s : split) {
    GAF_CHECK(s >= 0, "{}: negative split size {}", node.Describe(), s);
    total += s;
  }
  GAF_CHECK(total == dim, "{}: split sizes sum to {} but the dimension is {}", node.Describe(), total, dim);
  const size_t es = DataTypeSize(x.dtype());
  const int64_t outer = Product(x.shape(), 0, axis), inner = Product(x.shape(), axis + 1, r);
  const int64_t in_row = dim * inner * es;
  const uint8_t* src = static_cast<const uint8_t*>(x.raw());
  int64_t col = 0;
  for (int64_t i = 0; i < nout; ++i) {
    Shape s = x.shape();
    s[axis] = split[i];
    Tensor y(x.dtype(), s);
    const int64_t chunk = split[i] * inner * es;
    uint8_t* dst = static_cast<uint8_t*>(y.raw());
    if (chunk > 0) {
      ParallelFor(outer, std::max<int64_t>(1, kGrain * 4 / chunk), [&](int64_t b, int64_t e) {
        for (int64_t o = b; o < e; ++o) std::memcpy(dst + o * chunk, src + o * in_row + col, chunk);
      });
    }
    col += chunk;
    if (ctx.has_output(i)) ctx.outputs[i] = y;
  }
}

void SliceKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  CheckNotString(x, node);
  const int64_t r = x.rank();
  std::vector<int64_t> starts, ends, axes, steps;
  if (ctx.opset >= 10) {
    starts = ctx.input(1).ToInt64s();
    ends = ctx.input(2).ToInt64s();
    if (ctx.has_input(3)) axes = ctx.inputs[3]->ToInt64s();
    if (ctx.has_input(4)) steps = ctx.inputs[4]->ToInt64s();
  } else {
    starts = node.GetInts("starts");
    ends = node.GetInts("ends");
    axes = node.GetInts("axes");
  }
  GAF_CHECK(starts.size() == ends.size(), "{}: starts and ends have different lengths", node.Describe());
  if (axes.empty()) {
    GAF_CHECK(static_cast<int64_t>(starts.size()) <= r, "{}: more starts than input dimensions", node.Describe());
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  }
  if (steps.empty()) steps.assign(starts.size(), 1);
  GAF_CHECK(axes.size() == starts.size() && steps.size() == starts.size(),
            "{}: starts, ends, axes and steps have different lengths", node.Describe());
  GAF_CHECK(r >= 1 || axes.empty(), "{}: cannot slice a scalar", node.Describe());
  std::vector<int64_t> st(r, 0), sp(r, 1);
  Shape out = x.shape();
  std::vector<bool> seen(r, false);
  for (size_t i = 0; i < axes.size(); ++i) {
    int64_t a = NormalizeAxis(axes[i], r, node);
    GAF_CHECK(!seen[a], "{}: axis {} is repeated", node.Describe(), a);
    seen[a] = true;
    const int64_t dim = x.shape()[a];
    GAF_CHECK(steps[i] != 0, "{}: step must not be 0", node.Describe());
    constexpr int64_t kMaxStep = int64_t{1} << 62;  // avoids overflow; no dimension is that large
    const int64_t step = std::clamp<int64_t>(steps[i], -kMaxStep, kMaxStep);
    int64_t s = starts[i], e = ends[i];
    if (s < 0) s += dim;
    if (e < 0) e += dim;
    if (step > 0) {
      s = std::clamp<int64_t>(s, 0, dim);
      e = std::clamp<int64_t>(e, 0, dim);
      out[a] = e > s ? (e - s + step - 1) / step : 0;
    } else {
      s = std::clamp<int64_t>(s, 0, dim - 1);
      e = std::clamp<int64_t>(e, -1, dim - 1);
      out[a] = s > e ? (s - e - step - 1) / (-step) : 0;
    }
    st[a] = s;
    sp[a] = step;
  }
  Tensor y = Tensor::Uninitialized(x.dtype(), out);  // StridedCopy writes every element
  if (y.numel() > 0) {
    std::vector<int64_t> is = Strides(x.shape()), vs(r);
    int64_t off = 0;
    for (int64_t d = 0; d < r; ++d) {
      off += st[d] * is[d];
      vs[d] = sp[d] * is[d];
    }
    DispatchBySize(x.dtype(), node, [&](auto tag) {
      using T = decltype(tag);
      StridedCopy(static_cast<const T*>(x.raw()), off, out, vs, static_cast<T*>(y.raw()));
    });
  }
  ctx.outputs[0] = y;
}

// ---------------------------------------------------------------------------------------------
// Gather / Scatter family
// ---------------------------------------------------------------------------------------------

void GatherKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  const Tensor& ind = ctx.input(1);
  CheckNotString(x, node);
  const int64_t r = x.rank();
  GAF_CHECK(r > 0, "{}: data must have rank >= 1", node.Describe());
  const int64_t axis = NormalizeAxis(node.GetInt("axis", 0), r, node);
  const int64_t dim = x.shape()[axis];
  std::vector<int64_t> idx = ind.ToInt64s();
  for (int64_t& v : idx) v = NormIndex(v, dim, node, "gather");
  Shape out(x.shape().begin(), x.shape().begin() + axis);
  out.insert(out.end(), ind.shape().begin(), ind.shape().end());
  out.insert(out.end(), x.shape().begin() + axis + 1, x.shape().end());
  Tensor y(x.dtype(), out);
  const int64_t outer = Product(x.shape(), 0, axis), inner = Product(x.shape(), axis + 1, r);
  const int64_t ni = static_cast<int64_t>(idx.size());
  if (y.numel() > 0) {
    DispatchBySize(x.dtype(), node, [&](auto tag) {
      using T = decltype(tag);
      const T* src = static_cast<const T*>(x.raw());
      T* dst = static_cast<T*>(y.raw());
      ParallelFor(outer * ni, std::max<int64_t>(1, kGrain / std::max<int64_t>(inner, 1)), [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) {
          const int64_t o = t / ni, k = t % ni;
          const T* s = src + (o * dim + idx[k]) * inner;
          T* d = dst + t * inner;
          if (inner == 1)
            *d = *s;
          else
            std::memcpy(d, s, inner * sizeof(T));
        }
      });
    });
  }
  ctx.outputs[0] = y;
}

// Calls fn(data_offset, index_position) for every element of `indices` (shape ishape) of a
// GatherElements/ScatterElements over data of shape dshape along `axis`.
template <class F>
void ForElementIndices(const Shape& dshape, const Shape& ishape, int64_t axis, const std::vector<int64_t>& idx,
                       F&& fn) {
  const int64_t r = static_cast<int64_t>(ishape.size());
  if (NumElements(ishape) == 0) return;
  std::vector<int64_t> ds = Strides(dshape);
  if (r == 0) {
    fn(idx[0], 0);
    return;
  }
  const int64_t inner = ishape[r - 1];
  Shape outer(ishape.begin(), ishape.end() - 1);
  const int64_t rows = NumElements(outer);
  const int64_t sa = ds[axis];
  const int64_t sl = axis == r - 1 ? 0 : ds[r - 1];
  ForRows(outer, 0, rows, [&](int64_t row, const std::vector<int64_t>& c) {
    int64_t base = 0;
    for (int64_t d = 0; d + 1 < r; ++d)
      if (d != axis) base += c[d] * ds[d];
    const int64_t* ip = idx.data() + row * inner;
    for (int64_t j = 0; j < inner; ++j) fn(base + j * sl + ip[j] * sa, row * inner + j);
  });
}

// Validates shapes of GatherElements/ScatterElements and returns normalized indices.
std::vector<int64_t> ElementIndices(const Tensor& data, const Tensor& ind, int64_t axis, const Shape& bound,
                                    const Node& node) {
  GAF_CHECK(ind.rank() == data.rank(), "{}: indices rank {} differs from data rank {}", node.Describe(),
            ind.rank(), data.rank());
  for (int64_t d = 0; d < data.rank(); ++d)
    GAF_CHECK(d == axis || ind.shape()[d] <= bound[d], "{}: indices shape {} exceeds data shape {}",
              node.Describe(), ShapeToString(ind.shape()), ShapeToString(data.shape()));
  std::vector<int64_t> idx = ind.ToInt64s();
  const int64_t dim = data.shape()[axis];
  for (int64_t& v : idx) v = NormIndex(v, dim, node, "element");
  return idx;
}

void GatherElementsKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  const Tensor& ind = ctx.input(1);
  CheckNotString(x, node);
  const int64_t r = x.rank();
  GAF_CHECK(r > 0, "{}: data must have rank >= 1", node.Describe());
  const int64_t axis = NormalizeAxis(node.GetInt("axis", 0), r, node);
  std::vector<int64_t> idx = ElementIndices(x, ind, axis, x.shape(), node);
  Tensor y(x.dtype(), ind.shape());
  DispatchBySize(x.dtype(), node, [&](auto tag) {
    using T = decltype(tag);
    const T* src = static_cast<const T*>(x.raw());
    T* dst = static_cast<T*>(y.raw());
    ForElementIndices(x.shape(), ind.shape(), axis, idx, [&](int64_t off, int64_t pos) { dst[pos] = src[off]; });
  });
  ctx.outputs[0] = y;
}

enum class Reduction { kNone, kAdd, kMul, kMax, kMin };

Reduction ParseReduction(const Node& node) {
  std::string s = node.GetString("reduction", "none");
  if (s == "none") return Reduction::kNone;
  if (s == "add") return Reduction::kAdd;
  if (s == "mul") return Reduction::kMul;
  if (s == "max") return Reduction::kMax;
  if (s == "min") return Reduction::kMin;
  GAF_UNSUPPORTED("{}: reduction '{}' is not supported", node.Describe(), s);
}

template <class T>
inline void Reduce(T& dst, T v, Reduction red) {
  switch (red) {
    case Reduction::kNone: dst = v; break;
    case Reduction::kAdd: dst = static_cast<T>(dst + v); break;
    case Reduction::kMul: dst = static_cast<T>(dst * v); break;
    case Reduction::kMax: dst = std::max(dst, v); break;
    case Reduction::kMin: dst = std::min(dst, v); break;
  }
}

// Runs a scatter with reduction: numeric types directly; half types through float.
template <class F>
Tensor ScatterWithReduction(const Tensor& data, const Tensor& updates, Reduction red, const Node& node, F&& body) {
  if (red == Reduction::kNone) {
    Tensor y = data.Clone();
    DispatchBySize(data.dtype(), node, [&](auto tag) {
      using T = decltype(tag);
      body(static_cast<T*>(y.raw()), static_cast<const T*>(updates.raw()), red);
    });
    return y;
  }
  if (IsHalf(data.dtype())) {
    Tensor df = data.CastTo(DataType::kFloat), uf = updates.CastTo(DataType::kFloat);
    Tensor y = df.Clone();
    body(y.data<float>(), uf.data<float>(), red);
    return y.CastTo(data.dtype());
  }
  Tensor y = data.Clone();
  DispatchNumeric(data.dtype(), node, [&](auto tag) {
    using T = decltype(tag);
    body(y.data<T>(), updates.data<T>(), red);
  });
  return y;
}

void ScatterElementsKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  const Tensor& ind = ctx.input(1);
  const Tensor& upd = ctx.input(2);
  CheckNotString(x, node);
  const int64_t r = x.rank();
  GAF_CHECK(r > 0, "{}: data must have rank >= 1", node.Describe());
  GAF_CHECK(upd.shape() == ind.shape(), "{}: updates shape {} differs from indices shape {}", node.Describe(),
            ShapeToString(upd.shape()), ShapeToString(ind.shape()));
  GAF_CHECK(upd.dtype() == x.dtype(), "{}: updates type differs from data type", node.Describe());
  const int64_t axis = NormalizeAxis(node.GetInt("axis", 0), r, node);
  const Reduction red = ParseReduction(node);
  std::vector<int64_t> idx = ElementIndices(x, ind, axis, x.shape(), node);
  ctx.outputs[0] = ScatterWithReduction(x, upd, red, node, [&](auto* dst, const auto* src, Reduction rd) {
    ForElementIndices(x.shape(), ind.shape(), axis, idx,
                      [&](int64_t off, int64_t pos) { Reduce(dst[off], src[pos], rd); });
  });
}

void GatherNDKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  const Tensor& ind = ctx.input(1);
  CheckNotString(x, node);
  const int64_t b = node.GetInt("batch_dims", 0);
  const int64_t r = x.rank(), q = ind.rank();
  GAF_CHECK(r >= 1 && q >= 1, "{}: data and indices must have rank >= 1", node.Describe());
  GAF_CHECK(b >= 0 && b < std::min(r, q), "{}: invalid batch_dims {}", node.Describe(), b);
  for (int64_t d = 0; d < b; ++d)
    GAF_CHECK(x.shape()[d] == ind.shape()[d], "{}: batch dimension {} differs between data and indices",
              node.Describe(), d);
  const int64_t k = ind.shape()[q - 1];
  GAF_CHECK(k >= 1 && k <= r - b, "{}: indices last dimension {} is invalid for data rank {}", node.Describe(), k,
            r);
  Shape out(ind.shape().begin(), ind.shape().end() - 1);
  out.insert(out.end(), x.shape().begin() + b + k, x.shape().end());
  Tensor y(x.dtype(), out);
  const int64_t nb = Product(x.shape(), 0, b);
  const int64_t nper = Product(ind.shape(), b, q - 1);
  const int64_t slice = Product(x.shape(), b + k, r);
  const int64_t batch_stride = Product(x.shape(), b, r);
  std::vector<int64_t> ds = Strides(x.shape());
  std::vector<int64_t> iv = ind.ToInt64s();
  std::vector<int64_t> offs(nb * nper);
  for (int64_t t = 0; t < nb * nper; ++t) {
    int64_t off = (t / std::max<int64_t>(nper, 1)) * batch_stride;
    for (int64_t j = 0; j < k; ++j) off += NormIndex(iv[t * k + j], x.shape()[b + j], node, "gather_nd") * ds[b + j];
    offs[t] = off;
  }
  const size_t es = DataTypeSize(x.dtype());
  const uint8_t* src = static_cast<const uint8_t*>(x.raw());
  uint8_t* dst = static_cast<uint8_t*>(y.raw());
  for (int64_t t = 0; t < nb * nper; ++t) std::memcpy(dst + t * slice * es, src + offs[t] * es, slice * es);
  ctx.outputs[0] = y;
}

void ScatterNDKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  const Tensor& ind = ctx.input(1);
  const Tensor& upd = ctx.input(2);
  CheckNotString(x, node);
  const int64_t r = x.rank(), q = ind.rank();
  GAF_CHECK(q >= 1, "{}: indices must have rank >= 1", node.Describe());
  const int64_t k = ind.shape()[q - 1];
  GAF_CHECK(k <= r, "{}: indices last dimension {} exceeds data rank {}", node.Describe(), k, r);
  Shape ushape(ind.shape().begin(), ind.shape().end() - 1);
  ushape.insert(ushape.end(), x.shape().begin() + k, x.shape().end());
  GAF_CHECK(upd.shape() == ushape, "{}: updates shape {} should be {}", node.Describe(),
            ShapeToString(upd.shape()), ShapeToString(ushape));
  GAF_CHECK(upd.dtype() == x.dtype(), "{}: updates type differs from data type", node.Describe());
  const Reduction red = ParseReduction(node);
  const int64_t n = Product(ind.shape(), 0, q - 1);
  const int64_t slice = Product(x.shape(), k, r);
  std::vector<int64_t> ds = Strides(x.shape());
  std::vector<int64_t> iv = ind.ToInt64s();
  std::vector<int64_t> offs(n);
  for (int64_t t = 0; t < n; ++t) {
    int64_t off = 0;
    for (int64_t j = 0; j < k; ++j) off += NormIndex(iv[t * k + j], x.shape()[j], node, "scatter_nd") * ds[j];
    offs[t] = off;
  }
  ctx.outputs[0] = ScatterWithReduction(x, upd, red, node, [&](auto* dst, const auto* src, Reduction rd) {
    for (int64_t t = 0; t < n; ++t) {
      auto* d = dst + offs[t];
      const auto* s = src + t * slice;
      if (rd == Reduction::kNone) {
        std::memcpy(d, s, slice * sizeof(*d));
      } else {
        for (int64_t j = 0; j < slice; ++j) Reduce(d[j], s[j], rd);
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Expand, Tile, Pad
// ---------------------------------------------------------------------------------------------

void ExpandKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  CheckNotString(x, node);
  std::vector<int64_t> shp = ctx.input(1).ToInt64s();
  Shape out = BroadcastShapes(x.shape(), Shape(shp.begin(), shp.end()), node);
  Tensor y = Tensor::Uninitialized(x.dtype(), out);  // StridedCopy writes every element
  if (y.numel() > 0) {
    std::vector<int64_t> st = BroadcastStrides(x.shape(), out);
    DispatchBySize(x.dtype(), node, [&](auto tag) {
      using T = decltype(tag);
      StridedCopy(static_cast<const T*>(x.raw()), 0, out, st, static_cast<T*>(y.raw()));
    });
  }
  ctx.outputs[0] = y;
}

void TileKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  CheckNotString(x, node);
  GAF_CHECK(ctx.opset >= 6, "{}: Tile-1 (tiles/axis inputs) is not supported", node.Describe());
  std::vector<int64_t> rep = ctx.input(1).ToInt64s();
  const int64_t r = x.rank();
  GAF_CHECK(static_cast<int64_t>(rep.size()) == r, "{}: repeats has {} entries for rank {}", node.Describe(),
            rep.size(), r);
  Shape out(r), view(2 * r);
  std::vector<int64_t> is = Strides(x.shape()), vs(2 * r);
  for (int64_t d = 0; d < r; ++d) {
    GAF_CHECK(rep[d] >= 0, "{}: negative repeat {}", node.Describe(), rep[d]);
    out[d] = CheckedMul(x.shape()[d], rep[d], "tiled size");
    view[2 * d] = rep[d];
    view[2 * d + 1] = x.shape()[d];
    vs[2 * d] = 0;
    vs[2 * d + 1] = is[d];
  }
  Tensor y(x.dtype(), out);
  if (y.numel() > 0) {
    DispatchBySize(x.dtype(), node, [&](auto tag) {
      using T = decltype(tag);
      StridedCopy(static_cast<const T*>(x.raw()), 0, view, vs, static_cast<T*>(y.raw()));
    });
  }
  ctx.outputs[0] = y;
}

void PadKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  CheckNotString(x, node);
  const int64_t r = x.rank();
  const std::string mode = node.GetString("mode", "constant");
  if (mode != "constant" && mode != "reflect" && mode != "edge" && mode != "wrap")
    GAF_UNSUPPORTED("{}: pad mode '{}' is not supported", node.Describe(), mode);
  std::vector<int64_t> pads;
  std::vector<uint8_t> value;
  std::vector<int64_t> axes;
  if (ctx.opset >= 11) {
    pads = ctx.input(1).ToInt64s();
    if (ctx.has_input(2) && ctx.inputs[2]->numel() > 0) {
      const Tensor& cv = *ctx.inputs[2];
      GAF_CHECK(cv.dtype() == x.dtype(), "{}: constant_value type differs from data type", node.Describe());
      value.resize(DataTypeSize(x.dtype()));
      std::memcpy(value.data(), cv.raw(), value.size());
    } else {
      value = ValueBytes(0.0, x.dtype(), node);
    }
    if (ctx.has_input(3)) axes = ctx.inputs[3]->ToInt64s();
  } else {
    pads = node.HasAttr("pads") ? node.GetInts("pads") : node.GetInts("paddings");
    value = ValueBytes(node.GetFloat("value", 0.f), x.dtype(), node);
  }
  if (axes.empty()) {
    for (int64_t d = 0; d < r; ++d) axes.push_back(d);
  }
  const int64_t na = static_cast<int64_t>(axes.size());
  GAF_CHECK(static_cast<int64_t>(pads.size()) == 2 * na, "{}: pads has {} entries, expected {}", node.Describe(),
            pads.size(), 2 * na);
  std::vector<int64_t> pb(r, 0), pe(r, 0);
  for (int64_t i = 0; i < na; ++i) {
    int64_t a = NormalizeAxis(axes[i], r, node);
    pb[a] = pads[i];
    pe[a] = pads[na + i];
  }
  Shape out(r);
  for (int64_t d = 0; d < r; ++d) {
    out[d] = CheckedAdd(CheckedAdd(x.shape()[d], pb[d], "padded size"), pe[d], "padded size");
    GAF_CHECK(out[d] >= 0, "{}: pads make dimension {} negative", node.Describe(), d);
  }
  TensorBytes(x.dtype(), out);  // the memory limit before the index maps are built
  std::vector<std::vector<int64_t>> maps(r);
  for (int64_t d = 0; d < r; ++d) {
    const int64_t n = x.shape()[d];
    GAF_CHECK(mode == "constant" || n > 0 || out[d] == 0, "{}: cannot {}-pad an empty dimension", node.Describe(),
              mode);
    maps[d].resize(out[d]);
    for (int64_t o = 0; o < out[d]; ++o) {
      int64_t i = o - pb[d];
      if (i < 0 || i >= n) {
        if (mode == "constant") {
          i = -1;
        } else if (mode == "edge") {
          i = std::clamp<int64_t>(i, 0, n - 1);
        } else if (mode == "wrap") {
          i = ((i % n) + n) % n;
        } else {  // reflect
          if (n == 1) {
            i = 0;
          } else {
            int64_t period = 2 * (n - 1);
            i = ((i % period) + period) % period;
            if (i >= n) i = period - i;
          }
        }
      }
      maps[d][o] = i;
    }
  }
  Tensor y(x.dtype(), out);
  if (y.numel() == 0) {
    ctx.outputs[0] = y;
    return;
  }
  if (r == 0) {
    ctx.outputs[0] = x.Clone();
    return;
  }
  std::vector<int64_t> is = Strides(x.shape());
  const int64_t inner = out[r - 1], n_last = x.shape()[r - 1];
  const int64_t lo = std::clamp<int64_t>(pb[r - 1], 0, inner), hi = std::clamp<int64_t>(pb[r - 1] + n_last, 0, inner);
  Shape outer(out.begin(), out.end() - 1);
  const std::vector<int64_t>& lmap = maps[r - 1];
  DispatchBySize(x.dtype(), node, [&](auto tag) {
    using T = decltype(tag);
    const T* src = static_cast<const T*>(x.raw());
    T* dst = static_cast<T*>(y.raw());
    const T cv = FromBytes<T>(value);
    ParallelFor(NumElements(outer), std::max<int64_t>(1, kGrain / inner), [&](int64_t b, int64_t e) {
      ForRows(outer, b, e, [&](int64_t row, const std::vector<int64_t>& c) {
        T* d = dst + row * inner;
        int64_t base = 0;
        for (int64_t k = 0; k + 1 < r; ++k) {
          int64_t m = maps[k][c[k]];
          if (m < 0) {
            std::fill(d, d + inner, cv);
            return;
          }
          base += m * is[k];
        }
        const T* s = src + base;
        for (int64_t j = 0; j < lo; ++j) d[j] = lmap[j] < 0 ? cv : s[lmap[j]];
        if (hi > lo) std::memcpy(d + lo, s + (lo - pb[r - 1]), (hi - lo) * sizeof(T));
        for (int64_t j = std::max(hi, lo); j < inner; ++j) d[j] = lmap[j] < 0 ? cv : s[lmap[j]];
      });
    });
  });
  ctx.outputs[0] = y;
}

// ---------------------------------------------------------------------------------------------
// Shape, Size, ConstantOfShape, Constant, Range, EyeLike, Trilu, OneHot, NonZero
// ---------------------------------------------------------------------------------------------

void ShapeKernel(KernelContext& ctx) { ctx.outputs[0] = ShapeSlice(ctx.input(0).shape(), ctx.node); }

void SizeKernel(KernelContext& ctx) { ctx.outputs[0] = Tensor::Scalar<int64_t>(ctx.input(0).numel()); }

void FillBytes(Tensor& t, const void* value, const Node& node) {
  DispatchBySize(t.dtype(), node, [&](auto tag) {
    using T = decltype(tag);
    T v;
    std::memcpy(&v, value, sizeof(T));
    std::fill_n(static_cast<T*>(t.raw()), t.numel(), v);
  });
}

void ConstantOfShapeKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  std::vector<int64_t> shp = ctx.input(0).ToInt64s();
  for (int64_t d : shp) GAF_CHECK(d >= 0, "{}: negative dimension {}", node.Describe(), d);
  const Tensor* v = node.GetTensor("value");
  if (v == nullptr) {
    ctx.outputs[0] = Tensor(DataType::kFloat, Shape(shp.begin(), shp.end()));
    return;
  }
  GAF_CHECK(v->numel() == 1, "{}: value must have one element", node.Describe());
  CheckNotString(*v, node);
  Tensor y(v->dtype(), Shape(shp.begin(), shp.end()));
  FillBytes(y, v->raw(), node);
  ctx.outputs[0] = y;
}

void ConstantKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  if (const Tensor* t = node.GetTensor("value")) {
    ctx.outputs[0] = *t;
  } else if (node.HasAttr("value_float")) {
    ctx.outputs[0] = Tensor::Scalar<float>(node.GetFloat("value_float", 0.f));
  } else if (node.HasAttr("value_floats")) {
    std::vector<float> v = node.GetFloats("value_floats");
    ctx.outputs[0] = Tensor::FromVector<float>(v, {static_cast<int64_t>(v.size())});
  } else if (node.HasAttr("value_int")) {
    ctx.outputs[0] = Tensor::Scalar<int64_t>(node.GetInt("value_int", 0));
  } else if (node.HasAttr("value_ints")) {
    ctx.outputs[0] = Tensor::FromInt64s(node.GetInts("value_ints"));
  } else if (node.HasAttr("value_string") || node.HasAttr("value_strings") || node.HasAttr("sparse_value")) {
    GAF_UNSUPPORTED("{}: string and sparse constants are not supported", node.Describe());
  } else {
    GAF_CHECK(false, "{}: Constant has no value attribute", node.Describe());
  }
}

void RangeKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& s = ctx.input(0);
  const Tensor& l = ctx.input(1);
  const Tensor& d = ctx.input(2);
  GAF_CHECK(s.dtype() == l.dtype() && s.dtype() == d.dtype(), "{}: inputs have different types", node.Describe());
  DispatchNumeric(s.dtype(), node, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<T>) {
      const double start = s.ScalarAsDouble(), limit = l.ScalarAsDouble(), delta = d.ScalarAsDouble();
      GAF_CHECK(delta != 0, "{}: delta must not be 0", node.Describe());
      const double count = std::ceil((limit - start) / delta);
      const int64_t n = count > 0 ? DimFromDouble(count, node, "element count") : 0;
      Tensor y(s.dtype(), {n});
      T* p = y.data<T>();
      const T ts = static_cast<T>(start), td = static_cast<T>(delta);
      for (int64_t i = 0; i < n; ++i) p[i] = ts + static_cast<T>(i) * td;
      ctx.outputs[0] = y;
    } else {
      const int64_t start = s.ScalarAsInt64(), limit = l.ScalarAsInt64(), delta = d.ScalarAsInt64();
      GAF_CHECK(delta != 0, "{}: delta must not be 0", node.Describe());
      int64_t n = 0;
      // In 128 bits: limit - start and the rounding can pass int64 for extreme inputs.
      const __int128 span = static_cast<__int128>(limit) - start;
      __int128 count = 0;
      if (delta > 0 && span > 0) count = (span + delta - 1) / delta;
      if (delta < 0 && span < 0) count = (-span - delta - 1) / -static_cast<__int128>(delta);
      GAF_CHECK(count < (__int128{1} << 62), "{}: Range of {} to {} by {} has too many elements", node.Describe(),
                start, limit, delta);
      n = static_cast<int64_t>(count);
      Tensor y(s.dtype(), {n});
      T* p = y.data<T>();
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(start + static_cast<__int128>(i) * delta);
      ctx.outputs[0] = y;
    }
  });
}

void EyeLikeKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  GAF_CHECK(x.rank() == 2, "{}: input must be 2-D, got {}", node.Describe(), ShapeToString(x.shape()));
  DataType dt = node.HasAttr("dtype") ? static_cast<DataType>(node.GetInt("dtype", 1)) : x.dtype();
  const int64_t k = node.GetInt("k", 0);
  Tensor y(dt, x.shape());
  std::vector<uint8_t> one = ValueBytes(1.0, dt, node);
  const int64_t R = x.shape()[0], C = x.shape()[1];
  DispatchBySize(dt, node, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(y.raw());
    const T v = FromBytes<T>(one);
    for (int64_t i = 0; i < R; ++i) {
      int64_t j = i + k;
      if (j >= 0 && j < C) p[i * C + j] = v;
    }
  });
  ctx.outputs[0] = y;
}

void TriluKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  CheckNotString(x, node);
  GAF_CHECK(x.rank() >= 2, "{}: input must have rank >= 2", node.Describe());
  const int64_t k = ctx.has_input(1) ? ctx.inputs[1]->ScalarAsInt64() : 0;
  const bool upper = node.GetInt("upper", 1) != 0;
  const int64_t R = x.dim(-2), C = x.dim(-1);
  const int64_t nm = Product(x.shape(), 0, x.rank() - 2);
  Tensor y(x.dtype(), x.shape());
  DispatchBySize(x.dtype(), node, [&](auto tag) {
    using T = decltype(tag);
    const T* src = static_cast<const T*>(x.raw());
    T* dst = static_cast<T*>(y.raw());
    ParallelFor(nm * R, std::max<int64_t>(1, kGrain / std::max<int64_t>(C, 1)), [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const int64_t i = t % R;
        // keep columns j with j - i >= k (upper) or j - i <= k (lower); output is zero-initialized
        int64_t j0 = upper ? std::clamp<int64_t>(i + k, 0, C) : 0;
        int64_t j1 = upper ? C : std::clamp<int64_t>(i + k + 1, 0, C);
        if (j1 > j0) std::memcpy(dst + t * C + j0, src + t * C + j0, (j1 - j0) * sizeof(T));
      }
    });
  });
  ctx.outputs[0] = y;
}

void OneHotKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& ind = ctx.input(0);
  const Tensor& dep = ctx.input(1);
  const Tensor& vals = ctx.input(2);
  CheckNotString(vals, node);
  GAF_CHECK(vals.numel() == 2, "{}: values must have 2 elements", node.Describe());
  const double depth_value = dep.ScalarAsDouble();
  GAF_CHECK(depth_value >= 1, "{}: depth must be positive, got {}", node.Describe(), depth_value);
  const int64_t depth = DimFromDouble(depth_value, node, "depth");
  const int64_t r = ind.rank();
  int64_t axis = node.GetInt("axis", -1);
  GAF_CHECK(axis >= -r - 1 && axis <= r, "{}: axis {} out of range", node.Describe(), axis);
  if (axis < 0) axis += r + 1;
  Shape out = ind.shape();
  out.insert(out.begin() + axis, depth);
  const int64_t outer = Product(ind.shape(), 0, axis), inner = Product(ind.shape(), axis, r);
  std::vector<double> iv = ind.ToDoubles();
  Tensor y(vals.dtype(), out);
  DispatchBySize(vals.dtype(), node, [&](auto tag) {
    using T = decltype(tag);
    const T* v = static_cast<const T*>(vals.raw());
    T* p = static_cast<T*>(y.raw());
    std::fill_n(p, y.numel(), v[0]);
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < inner; ++i) {
        int64_t id = static_cast<int64_t>(iv[o * inner + i]);
        if (id < 0) id += depth;
        if (id >= 0 && id < depth) p[(o * depth + id) * inner + i] = v[1];
      }
  });
  ctx.outputs[0] = y;
}

void NonZeroKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  CheckNotString(x, node);
  const int64_t r = x.rank();
  std::vector<int64_t> pos;
  DispatchBySize(x.dtype(), node, [&](auto tag) {
    using T = decltype(tag);
    T mask = static_cast<T>(~T{0});
    if (IsFloatingPoint(x.dtype())) mask = static_cast<T>(mask >> 1);  // ignore the sign bit (-0.0 is zero)
    const T* p = static_cast<const T*>(x.raw());
    for (int64_t i = 0; i < x.numel(); ++i)
      if (p[i] & mask) pos.push_back(i);
  });
  const int64_t nnz = static_cast<int64_t>(pos.size());
  Tensor y(DataType::kInt64, {r, nnz});
  int64_t* o = y.data<int64_t>();
  std::vector<int64_t> st = Strides(x.shape());
  for (int64_t j = 0; j < nnz; ++j) {
    int64_t rem = pos[j];
    for (int64_t d = 0; d < r; ++d) {
      o[d * nnz + j] = rem / st[d];
      rem %= st[d];
    }
  }
  ctx.outputs[0] = y;
}

// ---------------------------------------------------------------------------------------------
// DepthToSpace, SpaceToDepth, Compress, ReverseSequence
// ---------------------------------------------------------------------------------------------

void DepthToSpaceKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  CheckNotString(x, node);
  GAF_CHECK(x.rank() == 4, "{}: input must be 4-D", node.Describe());
  const int64_t b = node.GetInt("blocksize", 0);
  const int64_t N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3);
  GAF_CHECK(b > 0 && C % CheckedMul(b, b, "blocksize^2") == 0, "{}: channels {} not divisible by blocksize^2 ({})",
            node.Describe(), C, b);
  const int64_t c = C / (b * b);
  const std::string mode = node.GetString("mode", "DCR");
  Tensor y(x.dtype(), {N, c, CheckedMul(H, b), CheckedMul(W, b)});
  if (mode == "DCR") {
    TransposeTensor(x, y, {N, b, b, c, H, W}, {0, 3, 4, 1, 5, 2}, node);
  } else if (mode == "CRD") {
    TransposeTensor(x, y, {N, c, b, b, H, W}, {0, 1, 4, 2, 5, 3}, node);
  } else {
    GAF_UNSUPPORTED("{}: mode '{}' is not supported", node.Describe(), mode);
  }
  ctx.outputs[0] = y;
}

void SpaceToDepthKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  CheckNotString(x, node);
  GAF_CHECK(x.rank() == 4, "{}: input must be 4-D", node.Describe());
  const int64_t b = node.GetInt("blocksize", 0);
  const int64_t N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3);
  GAF_CHECK(b > 0 && H % b == 0 && W % b == 0, "{}: spatial dims {}x{} not divisible by blocksize {}",
            node.Describe(), H, W, b);
  Tensor y(x.dtype(), {N, CheckedMul(C, CheckedMul(b, b)), H / b, W / b});
  TransposeTensor(x, y, {N, C, H / b, b, W / b, b}, {0, 3, 5, 1, 2, 4}, node);
  ctx.outputs[0] = y;
}

void CompressKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x0 = ctx.input(0);
  CheckNotString(x0, node);
  std::vector<int64_t> cond = ctx.input(1).ToInt64s();
  Tensor x = x0;
  int64_t axis = 0;
  if (node.HasAttr("axis")) {
    axis = NormalizeAxis(node.GetInt("axis", 0), x.rank(), node);
  } else {
    x = x0.Reshaped({x0.numel()});
  }
  const int64_t dim = x.shape()[axis];
  std::vector<int64_t> keep;
  for (size_t i = 0; i < cond.size(); ++i) {
    if (cond[i] == 0) continue;
    GAF_CHECK(static_cast<int64_t>(i) < dim, "{}: condition selects index {} beyond dimension {}",
              node.Describe(), i, dim);
    keep.push_back(static_cast<int64_t>(i));
  }
  Shape out = x.shape();
  out[axis] = static_cast<int64_t>(keep.size());
  Tensor y(x.dtype(), out);
  const size_t es = DataTypeSize(x.dtype());
  const int64_t outer = Product(x.shape(), 0, axis), inner = Product(x.shape(), axis + 1, x.rank()) * es;
  const uint8_t* src = static_cast<const uint8_t*>(x.raw());
  uint8_t* dst = static_cast<uint8_t*>(y.raw());
  const int64_t nk = static_cast<int64_t>(keep.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t k = 0; k < nk; ++k) std::memcpy(dst + (o * nk + k) * inner, src + (o * dim + keep[k]) * inner, inner);
  ctx.outputs[0] = y;
}

void ReverseSequenceKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  CheckNotString(x, node);
  GAF_CHECK(x.rank() >= 2, "{}: input must have rank >= 2", node.Describe());
  const int64_t ta = node.GetInt("time_axis", 0), ba = node.GetInt("batch_axis", 1);
  GAF_CHECK((ta == 0 && ba == 1) || (ta == 1 && ba == 0), "{}: time_axis/batch_axis must be 0/1", node.Describe());
  std::vector<int64_t> lens = ctx.input(1).ToInt64s();
  const int64_t T = x.dim(ta), B = x.dim(ba);
  GAF_CHECK(static_cast<int64_t>(lens.size()) == B, "{}: sequence_lens has {} entries for batch {}",
            node.Describe(), lens.size(), B);
  for (int64_t l : lens)
    GAF_CHECK(l >= 0 && l <= T, "{}: sequence length {} out of range [0, {}]", node.Describe(), l, T);
  const size_t es = DataTypeSize(x.dtype());
  const int64_t inner = Product(x.shape(), 2, x.rank()) * es;
  Tensor y(x.dtype(), x.shape());
  const uint8_t* src = static_cast<const uint8_t*>(x.raw());
  uint8_t* dst = static_cast<uint8_t*>(y.raw());
  auto off = [&](int64_t t, int64_t b) { return (ta == 0 ? t * B + b : b * T + t) * inner; };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      int64_t st = t < lens[b] ? lens[b] - 1 - t : t;
      std::memcpy(dst + off(t, b), src + off(st, b), inner);
    }
  ctx.outputs[0] = y;
}

// ---------------------------------------------------------------------------------------------
// Unique
// ---------------------------------------------------------------------------------------------

void UniqueKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x0 = ctx.input(0);
  const bool sorted = node.GetInt("sorted", 1) != 0;
  Tensor x = x0;
  int64_t axis = 0;
  if (node.HasAttr("axis")) {
    axis = NormalizeAxis(node.GetInt("axis", 0), x.rank(), node);
  } else {
    x = x0.Reshaped({x0.numel()});
  }
  const int64_t r = x.rank();
  const int64_t n = x.shape()[axis];
  const int64_t outer = Product(x.shape(), 0, axis), inner = Product(x.shape(), axis + 1, r);
  auto run = [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(x.raw());
    // Slice k = elements (o, k, i) for all o, i: compared lexicographically.
    auto cmp = [&](int64_t a, int64_t b) -> int {
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t i = 0; i < inner; ++i) {
          T va = p[(o * n + a) * inner + i], vb = p[(o * n + b) * inner + i];
          if (va < vb) return -1;
          if (vb < va) return 1;
        }
      return 0;
    };
    std::vector<int64_t> ord(n);
    std::iota(ord.begin(), ord.end(), 0);
    std::stable_sort(ord.begin(), ord.end(), [&](int64_t a, int64_t b) { return cmp(a, b) < 0; });
    std::vector<int64_t> first, counts, inverse(n);
    std::vector<int64_t> group_of(n);
    for (int64_t i = 0; i < n; ++i) {
      if (i == 0 || cmp(ord[i - 1], ord[i]) != 0) {
        first.push_back(ord[i]);
        counts.push_back(0);
      }
      counts.back()++;
      group_of[ord[i]] = static_cast<int64_t>(first.size()) - 1;
    }
    const int64_t nu = static_cast<int64_t>(first.size());
    std::vector<int64_t> gorder(nu);  // output position -> group
    std::iota(gorder.begin(), gorder.end(), 0);
    if (!sorted) std::sort(gorder.begin(), gorder.end(), [&](int64_t a, int64_t b) { return first[a] < first[b]; });
    std::vector<int64_t> pos_of(nu);
    for (int64_t k = 0; k < nu; ++k) pos_of[gorder[k]] = k;
    Shape ys = x.shape();
    ys[axis] = nu;
    Tensor y(x.dtype(), ys);
    T* yp = static_cast<T*>(y.raw());
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t k = 0; k < nu; ++k)
        std::memcpy(yp + (o * nu + k) * inner, p + (o * n + first[gorder[k]]) * inner, inner * sizeof(T));
    std::vector<int64_t> idx(nu), cnt(nu);
    for (int64_t k = 0; k < nu; ++k) {
      idx[k] = first[gorder[k]];
      cnt[k] = counts[gorder[k]];
    }
    for (int64_t i = 0; i < n; ++i) inverse[i] = pos_of[group_of[i]];
    ctx.outputs[0] = y;
    if (ctx.num_outputs() > 1 && ctx.has_output(1)) ctx.outputs[1] = Tensor::FromInt64s(idx);
    if (ctx.num_outputs() > 2 && ctx.has_output(2)) ctx.outputs[2] = Tensor::FromInt64s(inverse);
    if (ctx.num_outputs() > 3 && ctx.has_output(3)) ctx.outputs[3] = Tensor::FromInt64s(cnt);
  };
  if (x.dtype() == DataType::kBool) {
    run(uint8_t{});
  } else {
    DispatchNumeric(x.dtype(), node, run);
  }
}

// ---------------------------------------------------------------------------------------------
// Resize / Upsample
// ---------------------------------------------------------------------------------------------

struct ResizeParams {
  std::string mode;          // nearest, linear, cubic
  std::string coord;         // coordinate_transformation_mode
  std::string nearest_mode;  // round_prefer_floor, ..., or "simple" (opset < 11)
  double cubic_a = -0.75;
  bool exclude_outside = false;
  double extrapolation = 0.0;
  bool antialias = false;
  std::vector<double> roi;  // 2 * rank (starts then ends), for tf_crop_and_resize
};

// Maps output coordinate x of an axis to the input coordinate.
double OriginalCoord(const ResizeParams& p, int64_t x, double scale, int64_t in, int64_t out, double roi_s,
                     double roi_e) {
  const double len_resized = scale * static_cast<double>(in);
  const std::string& c = p.coord;
  if (c == "half_pixel") return (x + 0.5) / scale - 0.5;
  if (c == "asymmetric") return x / scale;
  if (c == "pytorch_half_pixel") return out > 1 ? (x + 0.5) / scale - 0.5 : 0.0;
  if (c == "align_corners") return len_resized == 1.0 ? 0.0 : x * (in - 1) / (len_resized - 1);
  if (c == "tf_half_pixel_for_nn") return (x + 0.5) / scale;
  if (c == "half_pixel_symmetric") {
    const double adj = out / len_resized;
    const double center = in / 2.0;
    const double offset = center * (1 - adj);
    return offset + (x + 0.5) / scale - 0.5;
  }
  if (c == "tf_crop_and_resize") {
    if (out > 1) return roi_s * (in - 1) + x * (roi_e - roi_s) * (in - 1) / (out - 1);
    return 0.5 * (roi_s + roi_e) * (in - 1);
  }
  return 0;  // validated earlier
}

double CubicWeight(double x, double a) {
  x = std::fabs(x);
  if (x <= 1) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
  return 0;
}

// Interpolation taps of one axis: for each output index, `ntaps` (input index, weight) pairs.
struct AxisTaps {
  int64_t ntaps = 0;
  std::vector<int64_t> idx;
  std::vector<float> w;
  std::vector<uint8_t> oob;  // tf_crop_and_resize: output index maps outside the input
  bool identity = false;
  bool any_oob = false;
};

AxisTaps ComputeTaps(const ResizeParams& p, int64_t in, int64_t out, double scale, double roi_s, double roi_e) {
  AxisTaps t;
  const bool linear = p.mode == "linear";
  const double support = linear ? 1.0 : 2.0;
  const double s = (p.antialias && scale < 1.0) ? scale : 1.0;
  const int64_t m = s < 1.0 ? static_cast<int64_t>(-std::floor(-support / s)) : static_cast<int64_t>(support);
  t.ntaps = 2 * m;
  t.idx.resize(out * t.ntaps);
  t.w.resize(out * t.ntaps);
  t.oob.assign(out, 0);
  t.identity = in == out;
  std::vector<double> w(t.ntaps);
  for (int64_t x = 0; x < out; ++x) {
    double xo = OriginalCoord(p, x, scale, in, out, roi_s, roi_e);
    if (p.coord == "tf_crop_and_resize" && (xo < 0 || xo > in - 1)) {
      t.oob[x] = 1;
      t.any_oob = true;
      t.identity = false;
      xo = std::clamp<double>(xo, 0, in - 1);
    }
    const double fl = std::floor(xo), rr = xo - fl;
    double sum = 0;
    for (int64_t i = 1 - m, k = 0; i <= m; ++i, ++k) {
      const double arg = (i - rr) * s;
      double wi = linear ? std::max(0.0, 1.0 - std::fabs(arg)) : CubicWeight(arg, p.cubic_a);
      int64_t id = static_cast<int64_t>(fl) + i;
      if (p.exclude_outside && (id < 0 || id >= in)) wi = 0;
      w[k] = wi;
      sum += wi;
      t.idx[x * t.ntaps + k] = std::clamp<int64_t>(id, 0, in - 1);
    }
    const bool norm = (p.antialias || p.exclude_outside) && sum != 0;
    for (int64_t k = 0; k < t.ntaps; ++k) {
      double wk = norm ? w[k] / sum : w[k];
      t.w[x * t.ntaps + k] = static_cast<float>(wk);
      const int64_t id = t.idx[x * t.ntaps + k];
      if (wk != 0 && !(id == x && wk == 1.0)) t.identity = false;
      if (id == x && wk != 1.0 && wk != 0) t.identity = false;
    }
    if (t.identity) {
      // require weight 1 exactly at index x
      bool found = false;
      for (int64_t k = 0; k < t.ntaps; ++k)
        if (t.idx[x * t.ntaps + k] == x && t.w[x * t.ntaps + k] == 1.0f) found = true;
      if (!found) t.identity = false;
    }
  }
  return t;
}

// One separable interpolation pass along an axis: in [outer, in_dim, inner] -> out [outer, out_dim, inner].
template <class T>
void ResizeAxisPass(const T* in, T* out, int64_t outer, int64_t in_dim, int64_t out_dim, int64_t inner,
                    const AxisTaps& t) {
  const int64_t nt = t.ntaps;
  if (inner == 1) {  // last axis: one output row per outer index
    ParallelFor(outer, std::max<int64_t>(1, kGrain / std::max<int64_t>(out_dim * nt, 1)), [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) {
        const T* base = in + o * in_dim;
        T* dst = out + o * out_dim;
        if (nt == 2) {
          for (int64_t x = 0; x < out_dim; ++x) {
            const int64_t* id = t.idx.data() + 2 * x;
            const float* w = t.w.data() + 2 * x;
            dst[x] = static_cast<T>(w[0]) * base[id[0]] + static_cast<T>(w[1]) * base[id[1]];
          }
        } else {
          for (int64_t x = 0; x < out_dim; ++x) {
            const int64_t* id = t.idx.data() + x * nt;
            const float* w = t.w.data() + x * nt;
            T acc = 0;
            for (int64_t k = 0; k < nt; ++k) acc += static_cast<T>(w[k]) * base[id[k]];
            dst[x] = acc;
          }
        }
      }
    });
    return;
  }
  ParallelFor(outer * out_dim, std::max<int64_t>(1, kGrain / std::max<int64_t>(inner * nt, 1)),
              [&](int64_t b, int64_t e) {
                for (int64_t q = b; q < e; ++q) {
                  const int64_t o = q / out_dim, x = q % out_dim;
                  const int64_t* id = t.idx.data() + x * nt;
                  const float* w = t.w.data() + x * nt;
                  const T* base = in + o * in_dim * inner;
                  T* dst = out + q * inner;
                  const T w0 = static_cast<T>(w[0]);
                  const T* s0 = base + id[0] * inner;
                  for (int64_t i = 0; i < inner; ++i) dst[i] = w0 * s0[i];
                  for (int64_t k = 1; k < nt; ++k) {
                    if (w[k] == 0) continue;
                    const T wk = static_cast<T>(w[k]);
                    const T* sk = base + id[k] * inner;
                    for (int64_t i = 0; i < inner; ++i) dst[i] += wk * sk[i];
                  }
                }
              });
}

// Sets output elements whose coordinate is out of the crop box (on any axis) to `value`.
template <class T>
void FillOutOfBox(T* y, const Shape& out, const std::vector<AxisTaps>& taps, T value) {
  const int64_t r = static_cast<int64_t>(out.size());
  const int64_t inner = out[r - 1];
  Shape outer(out.begin(), out.end() - 1);
  ForRows(outer, 0, NumElements(outer), [&](int64_t row, const std::vector<int64_t>& c) {
    T* d = y + row * inner;
    for (int64_t k = 0; k + 1 < r; ++k)
      if (taps[k].any_oob && taps[k].oob[c[k]]) {
        std::fill(d, d + inner, value);
        return;
      }
    if (taps[r - 1].any_oob)
      for (int64_t j = 0; j < inner; ++j)
        if (taps[r - 1].oob[j]) d[j] = value;
  });
}

template <class T>
Tensor ResizeInterpolate(const Tensor& x, const Shape& out, const std::vector<double>& scales, const ResizeParams& p) {
  const int64_t r = x.rank();
  std::vector<AxisTaps> taps(r);
  bool any_oob = false;
  for (int64_t d = 0; d < r; ++d) {
    taps[d] = ComputeTaps(p, x.shape()[d], out[d], scales[d], p.roi.empty() ? 0.0 : p.roi[d],
                          p.roi.empty() ? 1.0 : p.roi[r + d]);
    any_oob = any_oob || taps[d].any_oob;
  }
  std::vector<int64_t> axes;
  for (int64_t d = 0; d < r; ++d)
    if (!taps[d].identity) axes.push_back(d);
  // Axes that shrink most go first; among equal ratios the innermost (per-element gather) goes first.
  std::sort(axes.begin(), axes.end(), [&](int64_t a, int64_t b) {
    const double ra = static_cast<double>(out[a]) / x.shape()[a], rb = static_cast<double>(out[b]) / x.shape()[b];
    return ra != rb ? ra < rb : a > b;
  });
  Tensor cur = x;
  Shape cs = x.shape();
  if (axes.empty()) cur = x.Clone();
  for (int64_t a : axes) {
    Shape ns = cs;
    ns[a] = out[a];
    Tensor nt(x.dtype(), ns);
    if (nt.numel() > 0)
      ResizeAxisPass<T>(cur.data<T>(), nt.data<T>(), Product(cs, 0, a), cs[a], out[a], Product(cs, a + 1, r),
                        taps[a]);
    cur = nt;
    cs = ns;
  }
  if (any_oob && cur.numel() > 0) FillOutOfBox<T>(cur.data<T>(), out, taps, static_cast<T>(p.extrapolation));
  return cur;
}

int64_t NearestIndex(const ResizeParams& p, double xo, double scale, int64_t in) {
  int64_t i;
  const std::string& m = p.nearest_mode;
  if (m == "simple") {
    i = scale < 1.0 ? static_cast<int64_t>(std::ceil(xo)) : static_cast<int64_t>(xo);
  } else if (m == "round_prefer_floor") {
    i = (xo == std::floor(xo) + 0.5) ? static_cast<int64_t>(std::floor(xo)) : static_cast<int64_t>(std::round(xo));
  } else if (m == "round_prefer_ceil") {
    i = static_cast<int64_t>(std::floor(xo + 0.5));
  } else if (m == "floor") {
    i = static_cast<int64_t>(std::floor(xo));
  } else {
    i = static_cast<int64_t>(std::ceil(xo));
  }
  return std::clamp<int64_t>(i, 0, in - 1);
}

Tensor ResizeNearest(const Tensor& x, const Shape& out, const std::vector<double>& scales, const ResizeParams& p,
                     const Node& node) {
  const int64_t r = x.rank();
  std::vector<std::vector<int64_t>> maps(r);
  for (int64_t d = 0; d < r; ++d) {
    const int64_t in = x.shape()[d];
    maps[d].resize(out[d]);
    for (int64_t o = 0; o < out[d]; ++o) {
      double xo = OriginalCoord(p, o, scales[d], in, out[d], p.roi.empty() ? 0.0 : p.roi[d],
                                p.roi.empty() ? 1.0 : p.roi[r + d]);
      if (p.coord == "tf_crop_and_resize" && (xo < 0 || xo > in - 1))
        maps[d][o] = -1;
      else
        maps[d][o] = NearestIndex(p, xo, scales[d], in);
    }
  }
  Tensor y(x.dtype(), out);
  if (y.numel() == 0) return y;
  if (r == 0) return x.Clone();
  std::vector<uint8_t> ev = ValueBytes(p.extrapolation, x.dtype(), node);
  std::vector<int64_t> is = Strides(x.shape());
  const int64_t inner = out[r - 1];
  Shape outer(out.begin(), out.end() - 1);
  const std::vector<int64_t>& lm = maps[r - 1];
  DispatchBySize(x.dtype(), node, [&](auto tag) {
    using T = decltype(tag);
    const T* src = static_cast<const T*>(x.raw());
    T* dst = static_cast<T*>(y.raw());
    const T fill = FromBytes<T>(ev);
    ParallelFor(NumElements(outer), std::max<int64_t>(1, kGrain / inner), [&](int64_t b, int64_t e) {
      int64_t prev_base = -2;
      ForRows(outer, b, e, [&](int64_t row, const std::vector<int64_t>& c) {
        T* d = dst + row * inner;
        int64_t base = 0;
        for (int64_t k = 0; k + 1 < r; ++k) {
          int64_t m = maps[k][c[k]];
          if (m < 0) {
            base = -1;
            break;
          }
          base += m * is[k];
        }
        if (base == prev_base && row > b) {  // same source row as the previous output row
          std::memcpy(d, d - inner, inner * sizeof(T));
          return;
        }
        prev_base = base;
        if (base < 0) {
          std::fill(d, d + inner, fill);
          return;
        }
        const T* s = src + base;
        for (int64_t j = 0; j < inner; ++j) d[j] = lm[j] < 0 ? fill : s[lm[j]];
      });
    });
  });
  return y;
}

template <class T>
void RoundStore(const float* s, T* d, int64_t n) {
  const double lo = static_cast<double>(std::numeric_limits<T>::lowest());
  const double hi = static_cast<double>(std::numeric_limits<T>::max());
  for (int64_t i = 0; i < n; ++i) d[i] = static_cast<T>(std::clamp<double>(std::nearbyint(s[i]), lo, hi));
}

void ResizeImpl(KernelContext& ctx, bool upsample) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  CheckNotString(x, node);
  const int64_t r = x.rank();
  ResizeParams p;
  p.mode = node.GetString("mode", "nearest");
  if (p.mode == "bilinear" || p.mode == "trilinear") p.mode = "linear";
  if (p.mode != "nearest" && p.mode != "linear" && p.mode != "cubic")
    GAF_UNSUPPORTED("{}: mode '{}' is not supported", node.Describe(), p.mode);
  std::vector<double> scales;
  std::vector<int64_t> sizes;
  std::vector<int64_t> axes;
  const bool legacy = upsample || ctx.opset < 11;
  if (legacy) {
    p.coord = "asymmetric";
    p.nearest_mode = "simple";
    if (upsample && ctx.opset < 9) {
      if (!node.HasAttr("scales")) GAF_UNSUPPORTED("{}: Upsample without scales attribute", node.Describe());
      for (float f : node.GetFloats("scales")) scales.push_back(f);
    } else {
      for (double v : ctx.input(1).ToDoubles()) scales.push_back(static_cast<float>(v));
    }
    if (p.mode == "cubic") GAF_UNSUPPORTED("{}: cubic mode before opset 11", node.Describe());
  } else {
    p.coord = node.GetString("coordinate_transformation_mode", "half_pixel");
    static const char* kCoords[] = {"half_pixel", "asymmetric", "pytorch_half_pixel", "align_corners",
                                    "tf_half_pixel_for_nn", "tf_crop_and_resize", "half_pixel_symmetric"};
    if (std::find(std::begin(kCoords), std::end(kCoords), p.coord) == std::end(kCoords))
      GAF_UNSUPPORTED("{}: coordinate_transformation_mode '{}' is not supported", node.Describe(), p.coord);
    p.nearest_mode = node.GetString("nearest_mode", "round_prefer_floor");
    if (p.nearest_mode != "round_prefer_floor" && p.nearest_mode != "round_prefer_ceil" &&
        p.nearest_mode != "floor" && p.nearest_mode != "ceil")
      GAF_UNSUPPORTED("{}: nearest_mode '{}' is not supported", node.Describe(), p.nearest_mode);
    p.cubic_a = node.GetFloat("cubic_coeff_a", -0.75f);
    p.exclude_outside = node.GetInt("exclude_outside", 0) != 0;
    p.extrapolation = node.GetFloat("extrapolation_value", 0.f);
    p.antialias = node.GetInt("antialias", 0) != 0;
    axes = node.GetInts("axes");
    if (ctx.has_input(1) && ctx.inputs[1]->numel() > 0) p.roi = ctx.inputs[1]->ToDoubles();
    if (ctx.has_input(2) && ctx.inputs[2]->numel() > 0)
      for (double v : ctx.inputs[2]->ToDoubles()) scales.push_back(static_cast<float>(v));
    if (ctx.has_input(3) && ctx.inputs[3]->numel() > 0) sizes = ctx.inputs[3]->ToInt64s();
    GAF_CHECK(scales.empty() != sizes.empty(), "{}: exactly one of scales and sizes must be given", node.Describe());
  }
  if (axes.empty())
    for (int64_t d = 0; d < r; ++d) axes.push_back(d);
  for (int64_t& a : axes) a = NormalizeAxis(a, r, node);
  const size_t na = axes.size();
  // Expand per-axis values to all axes.
  std::vector<double> sc(r, 1.0);
  Shape out = x.shape();
  if (!p.roi.empty()) {
    GAF_CHECK(p.roi.size() == 2 * na, "{}: roi has {} entries, expected {}", node.Describe(), p.roi.size(), 2 * na);
    std::vector<double> full(2 * r);
    for (int64_t d = 0; d < r; ++d) {
      full[d] = 0;
      full[r + d] = 1;
    }
    for (size_t i = 0; i < na; ++i) {
      full[axes[i]] = p.roi[i];
      full[r + axes[i]] = p.roi[na + i];
    }
    p.roi = full;
  }
  if (!scales.empty()) {
    GAF_CHECK(scales.size() == na, "{}: scales has {} entries for {} axes", node.Describe(), scales.size(), na);
    for (size_t i = 0; i < na; ++i) {
      GAF_CHECK(scales[i] > 0, "{}: scales must be positive", node.Describe());
      sc[axes[i]] = scales[i];
      out[axes[i]] = DimFromDouble(std::floor(scales[i] * x.shape()[axes[i]]), node, "output size");
    }
  } else {
    GAF_CHECK(sizes.size() == na, "{}: sizes has {} entries for {} axes", node.Describe(), sizes.size(), na);
    const std::string policy = node.GetString("keep_aspect_ratio_policy", "stretch");
    if (policy == "stretch") {
      for (size_t i = 0; i < na; ++i) {
        GAF_CHECK(sizes[i] >= 0, "{}: negative size", node.Describe());
        out[axes[i]] = sizes[i];
        sc[axes[i]] = static_cast<double>(sizes[i]) / static_cast<double>(x.shape()[axes[i]]);
      }
    } else if (policy == "not_larger" || policy == "not_smaller") {
      double s = policy == "not_larger" ? std::numeric_limits<double>::max() : 0.0;
      for (size_t i = 0; i < na; ++i) {
        double v = static_cast<double>(sizes[i]) / x.shape()[axes[i]];
        s = policy == "not_larger" ? std::min(s, v) : std::max(s, v);
      }
      for (size_t i = 0; i < na; ++i) {
        sc[axes[i]] = s;
        out[axes[i]] = DimFromDouble(std::floor(s * x.shape()[axes[i]] + 0.5), node, "output size");
      }
    } else {
      GAF_UNSUPPORTED("{}: keep_aspect_ratio_policy '{}' is not supported", node.Describe(), policy);
    }
  }
  for (int64_t d = 0; d < r; ++d)
    GAF_CHECK(x.shape()[d] > 0 || out[d] == 0, "{}: cannot resize an empty dimension", node.Describe());
  TensorBytes(x.dtype(), out);  // the memory limit before the per-axis taps are built
  if (p.mode == "nearest") {
    ctx.outputs[0] = ResizeNearest(x, out, sc, p, node);
    return;
  }
  if (x.dtype() == DataType::kFloat) {
    ctx.outputs[0] = ResizeInterpolate<float>(x, out, sc, p);
  } else if (x.dtype() == DataType::kDouble) {
    ctx.outputs[0] = ResizeInterpolate<double>(x, out, sc, p);
  } else if (IsHalf(x.dtype())) {
    ctx.outputs[0] = ResizeInterpolate<float>(x.CastTo(DataType::kFloat), out, sc, p).CastTo(x.dtype());
  } else {
    Tensor yf = ResizeInterpolate<float>(x.CastTo(DataType::kFloat), out, sc, p);
    Tensor y(x.dtype(), out);
    DispatchNumeric(x.dtype(), node, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_integral_v<T>) RoundStore<T>(yf.data<float>(), y.data<T>(), y.numel());
    });
    ctx.outputs[0] = y;
  }
}

void ResizeKernel(KernelContext& ctx) { ResizeImpl(ctx, false); }
void UpsampleKernel(KernelContext& ctx) { ResizeImpl(ctx, true); }

}  // namespace

void RegisterTensorKernels(OpRegistry& r) {
  const OpKind kInj = OpKind::kInjective;
  r.Register({"", "Reshape", kInj, ReshapeKernel, false});
  r.Register({"", "Flatten", kInj, FlattenKernel, false});
  r.Register({"", "Squeeze", kInj, SqueezeKernel, false});
  r.Register({"", "Unsqueeze", kInj, UnsqueezeKernel, false});
  r.Register({"", "Transpose", kInj, TransposeKernel, false});
  r.Register({"", "Concat", kInj, ConcatKernel, false});
  r.Register({"", "Split", kInj, SplitKernel, false});
  r.Register({"", "Slice", kInj, SliceKernel, false});
  r.Register({"", "Gather", kInj, GatherKernel, false});
  r.Register({"", "GatherElements", kInj, GatherElementsKernel, false});
  r.Register({"", "GatherND", kInj, GatherNDKernel, false});
  r.Register({"", "ScatterND", kInj, ScatterNDKernel, false});
  r.Register({"", "ScatterElements", kInj, ScatterElementsKernel, false});
  r.Register({"", "Scatter", kInj, ScatterElementsKernel, false});
  r.Register({"", "Expand", kInj, ExpandKernel, false});
  r.Register({"", "Tile", kInj, TileKernel, false});
  r.Register({"", "Pad", kInj, PadKernel, false});
  r.Register({"", "Shape", OpKind::kOpaque, ShapeKernel, false, /*reads_padded_caches=*/true});
  r.Register({"", "Size", OpKind::kOpaque, SizeKernel, false, /*reads_padded_caches=*/true});
  r.Register({"", "ConstantOfShape", OpKind::kOpaque, ConstantOfShapeKernel, false});
  r.Register({"", "Constant", OpKind::kOpaque, ConstantKernel, false});
  r.Register({"", "Identity", OpKind::kElementwise, IdentityKernel, false});
  r.Register({"ai.graph_autofusion.plan", "LastPosition", OpKind::kInjective, LastPositionKernel, false});
  r.Register({"", "Dropout", OpKind::kElementwise, DropoutKernel, false});
  r.Register({"", "Range", OpKind::kOpaque, RangeKernel, true});
  r.Register({"", "Trilu", kInj, TriluKernel, false});
  r.Register({"", "OneHot", kInj, OneHotKernel, false});
  r.Register({"", "NonZero", OpKind::kOpaque, NonZeroKernel, false});
  r.Register({"", "EyeLike", kInj, EyeLikeKernel, false});
  r.Register({"", "DepthToSpace", kInj, DepthToSpaceKernel, false});
  r.Register({"", "SpaceToDepth", kInj, SpaceToDepthKernel, false});
  r.Register({"", "Compress", kInj, CompressKernel, false});
  r.Register({"", "ReverseSequence", kInj, ReverseSequenceKernel, false});
  r.Register({"", "Resize", kInj, ResizeKernel, false});
  r.Register({"", "Upsample", kInj, UpsampleKernel, false});
  r.Register({"", "Unique", OpKind::kOpaque, UniqueKernel, true});
}

}  // namespace gaf
