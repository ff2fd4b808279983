// Elementwise kernels: unary math and activations, broadcasting binary arithmetic, comparisons
// and logic, variadic Min/Max/Sum/Mean, Clip, Where, Cast and CastLike.
//
// Broadcasting runs through BinaryLoop/WhereLoop: flat loops when shapes match or an operand is
// a scalar, otherwise the output shape is collapsed (adjacent dimensions merged when every input
// is contiguous or broadcast across them) and walked row by row with the innermost dimension as a
// contiguous (stride 1) or broadcast (stride 0) inner loop.
#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "ops/fast_math.h"
#include <vector>

#include "ops/kernel.h"
#include "ops/kernel_util.h"

namespace gaf {
namespace {

// The output of a kernel that writes every element: no zero fill (a pass over memory that was
// about to be overwritten), except for strings, whose elements must be constructed.
Tensor OutputTensor(DataType dt, Shape shape) {
  return dt == DataType::kString ? Tensor(dt, std::move(shape)) : Tensor::Uninitialized(dt, std::move(shape));
}


using gaf_fast::FastErf;
using gaf_fast::FastExp;
using gaf_fast::FastSigmoid;
using gaf_fast::FastTanh;

// GCC 12 at -O2 only vectorizes loops with a known trip count; `omp simd` asks for it explicitly.
#define GAF_SIMD _Pragma("omp simd")

// Elements of work per parallel chunk.
constexpr int64_t kGrain = 16384;

// ---------------------------------------------------------------------------------------------
// Type dispatch helpers beyond kernel_util.h.

template <class F>
decltype(auto) DispatchNumericBool(DataType dt, const Node& node, F&& fn) {
  if (dt == DataType::kBool) return fn(bool{});
  return DispatchNumeric(dt, node, fn);
}

template <class F>
decltype(auto) DispatchInteger(DataType dt, const Node& node, F&& fn) {
  switch (dt) {
    case DataType::kInt64: return fn(int64_t{});
    case DataType::kInt32: return fn(int32_t{});
    case DataType::kInt8: return fn(int8_t{});
    case DataType::kUint8: return fn(uint8_t{});
    case DataType::kInt16: return fn(int16_t{});
    case DataType::kUint16: return fn(uint16_t{});
    case DataType::kUint32: return fn(uint32_t{});
    case DataType::kUint64: return fn(uint64_t{});
    default:
      GAF_UNSUPPORTED("{}: data type {} is not supported (integer types only)", node.Describe(),
                      DataTypeName(dt));
  }
}

template <class F>
decltype(auto) DispatchUnsigned(DataType dt, const Node& node, F&& fn) {
  switch (dt) {
    case DataType::kUint8: return fn(uint8_t{});
    case DataType::kUint16: return fn(uint16_t{});
    case DataType::kUint32: return fn(uint32_t{});
    case DataType::kUint64: return fn(uint64_t{});
    default:
      GAF_UNSUPPORTED("{}: data type {} is not supported (unsigned integer types only)",
                      node.Describe(), DataTypeName(dt));
  }
}

template <class T>
constexpr bool kIsInt = std::is_integral_v<T> && !std::is_same_v<T, bool>;

// Unsigned type wide enough to avoid integer promotion to signed int (wrapping arithmetic).
template <class T>
using WideU = std::conditional_t<(sizeof(T) < 4), uint32_t, std::make_unsigned_t<T>>;

template <class T>
inline T WrapAdd(T a, T b) {
  if constexpr (kIsInt<T>) return static_cast<T>(static_cast<WideU<T>>(a) + static_cast<WideU<T>>(b));
  else return a + b;
}
template <class T>
inline T WrapSub(T a, T b) {
  if constexpr (kIsInt<T>) return static_cast<T>(static_cast<WideU<T>>(a) - static_cast<WideU<T>>(b));
  else return a - b;
}
template <class T>
inline T WrapMul(T a, T b) {
  if constexpr (kIsInt<T>) return static_cast<T>(static_cast<WideU<T>>(a) * static_cast<WideU<T>>(b));
  else return a * b;
}
template <class T>
inline T WrapNeg(T a) {
  if constexpr (kIsInt<T>) return static_cast<T>(WideU<T>{0} - static_cast<WideU<T>>(a));
  else return -a;
}

template <class T>
inline T Exp(T x) {
  if constexpr (std::is_same_v<T, float>) return FastExp(x);
  else return std::exp(x);
}
template <class T>
inline T Tanh(T x) {
  if constexpr (std::is_same_v<T, float>) return FastTanh(x);
  else return std::tanh(x);
}
template <class T>
inline T Erf(T x) {
  if constexpr (std::is_same_v<T, float>) return FastErf(x);
  else return std::erf(x);
}
template <class T>
inline T Sigmoid(T x) {
  if constexpr (std::is_same_v<T, float>) return FastSigmoid(x);
  else return T(1) / (T(1) + std::exp(-x));
}
template <class T>
inline T Softplus(T x) {  // log(1 + e^x) without overflow
  return x > T(0) ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
}

// ---------------------------------------------------------------------------------------------
// Broadcast plan: the output shape with size-1 dimensions dropped and mergeable neighbours
// merged; per input, the element stride of each collapsed dimension (0 where broadcast).

struct BcastPlan {
  std::vector<int64_t> dims;                  // collapsed output dims; last one is the inner loop
  std::vector<std::vector<int64_t>> strides;  // per input, per collapsed dim
};

// Right-aligned element strides of `in` viewed with the shape `out` (0 on broadcast dims).
std::vector<int64_t> InputStrides(const Shape& in, const Shape& out) {
  size_t r = out.size(), ri = in.size();
  std::vector<int64_t> st(r, 0);
  int64_t s = 1;
  for (size_t k = 0; k < ri; ++k) {
    size_t di = ri - 1 - k, d = r - 1 - k;
    st[d] = in[di] == 1 ? 0 : s;
    s *= in[di];
  }
  return st;
}

BcastPlan MakePlan(const Shape& out, const std::vector<const Shape*>& ins) {
  size_t n = ins.size();
  std::vector<std::vector<int64_t>> full(n);
  for (size_t k = 0; k < n; ++k) full[k] = InputStrides(*ins[k], out);
  BcastPlan p;
  p.strides.resize(n);
  // Built innermost-first, reversed at the end.
  for (int64_t d = static_cast<int64_t>(out.size()) - 1; d >= 0; --d) {
    if (out[d] == 1) continue;
    if (!p.dims.empty()) {
      bool merge = true;
      for (size_t k = 0; k < n && merge; ++k) merge = full[k][d] == p.dims.back() * p.strides[k].back();
      if (merge) {
        p.dims.back() *= out[d];
        continue;
      }
    }
    p.dims.push_back(out[d]);
    for (size_t k = 0; k < n; ++k) p.strides[k].push_back(full[k][d]);
  }
  if (p.dims.empty()) {
    p.dims.push_back(1);
    for (size_t k = 0; k < n; ++k) p.strides[k].push_back(0);
  }
  std::reverse(p.dims.begin(), p.dims.end());
  for (auto& s : p.strides) std::reverse(s.begin(), s.end());
  return p;
}

// Calls f(row, offsets) for rows [rb, re) of the plan (a row = one inner-loop run), where
// offsets[k] is input k's element offset of the row start. Index decomposition happens once.
template <size_t N, class F>
void WalkRows(const BcastPlan& p, int64_t rb, int64_t re, F&& f) {
  const int64_t nd = static_cast<int64_t>(p.dims.size()) - 1;  // outer dims
  std::vector<int64_t> idx(static_cast<size_t>(std::max<int64_t>(nd, 1)), 0);
  int64_t off[N] = {};
  int64_t rem = rb;
  for (int64_t j = nd - 1; j >= 0; --j) {
    idx[j] = rem % p.dims[j];
    rem /= p.dims[j];
    for (size_t k = 0; k < N; ++k) off[k] += idx[j] * p.strides[k][j];
  }
  for (int64_t row = rb; row < re; ++row) {
    f(row, static_cast<const int64_t*>(off));
    for (int64_t j = nd - 1; j >= 0; --j) {
      for (size_t k = 0; k < N; ++k) off[k] += p.strides[k][j];
      if (++idx[j] < p.dims[j]) break;
      for (size_t k = 0; k < N; ++k) off[k] -= p.strides[k][j] * p.dims[j];
      idx[j] = 0;
    }
  }
}

// Calls f(out_offset, offsets, count) for each row piece of the output element range [s, e):
// `count` consecutive output elements starting at out_offset, input k starting at offsets[k]
// with the plan's inner stride. Lets a parallel chunk start mid-row.
template <size_t N, class F>
void WalkRange(const BcastPlan& p, int64_t s, int64_t e, F&& f) {
  const int64_t inner = p.dims.back();
  const int64_t rb = s / inner, c0 = s % inner, re = (e + inner - 1) / inner;
  WalkRows<N>(p, rb, re, [&](int64_t row, const int64_t* off) {
    const int64_t b = row == rb ? c0 : 0;
    const int64_t en = std::min(inner, e - row * inner);
    int64_t o2[N];
    for (size_t k = 0; k < N; ++k) o2[k] = off[k] + b * p.strides[k].back();
    f(row * inner + b, static_cast<const int64_t*>(o2), en - b);
  });
}

// Inner loops with restrict-qualified pointers so that they vectorize without alias checks.
template <class TA, class TB, class TO, class Op>
inline void InnerVV(const TA* __restrict a, const TB* __restrict b, TO* __restrict o, int64_t n, Op op) {
  GAF_SIMD for (int64_t i = 0; i < n; ++i) o[i] = op(a[i], b[i]);
}
template <class TA, class TB, class TO, class Op>
inline void InnerVS(const TA* __restrict a, TB b, TO* __restrict o, int64_t n, Op op) {
  GAF_SIMD for (int64_t i = 0; i < n; ++i) o[i] = op(a[i], b);
}
template <class TA, class TB, class TO, class Op>
inline void InnerSV(TA a, const TB* __restrict b, TO* __restrict o, int64_t n, Op op) {
  GAF_SIMD for (int64_t i = 0; i < n; ++i) o[i] = op(a, b[i]);
}
template <class TB, class TO, class Op>
inline void InnerAccV(TO* __restrict o, const TB* __restrict b, int64_t n, Op op) {
  GAF_SIMD for (int64_t i = 0; i < n; ++i) o[i] = op(o[i], b[i]);
}
template <class TB, class TO, class Op>
inline void InnerAccS(TO* __restrict o, TB b, int64_t n, Op op) {
  GAF_SIMD for (int64_t i = 0; i < n; ++i) o[i] = op(o[i], b);
}

// o = op(a, b) with a and b broadcast to the output shape `so`. With kAccum, `a` is the output
// itself (o = op(o, b); `a`/`sa` must be o/so).
template <bool kAccum = false, class TA, class TB, class TO, class Op>
void BinaryLoop(const TA* a, const Shape& sa, const TB* b, const Shape& sb, TO* o, const Shape& so,
                Op op) {
  const int64_t n = NumElements(so);
  if (n == 0) return;
  const int64_t na = NumElements(sa), nb = NumElements(sb);
  // A broadcastable operand with as many elements as the output has the output's layout.
  if (na == n && nb == n) {
    ParallelFor(n, kGrain, [&](int64_t s, int64_t e) {
      if constexpr (kAccum) InnerAccV(o + s, b + s, e - s, op);
      else InnerVV(a + s, b + s, o + s, e - s, op);
    });
    return;
  }
  if (na == n && nb == 1) {
    const TB bv = b[0];
    ParallelFor(n, kGrain, [&](int64_t s, int64_t e) {
      if constexpr (kAccum) InnerAccS(o + s, bv, e - s, op);
      else InnerVS(a + s, bv, o + s, e - s, op);
    });
    return;
  }
  if constexpr (!kAccum) {
    if (na == 1 && nb == n) {
      const TA av = a[0];
      ParallelFor(n, kGrain, [&](int64_t s, int64_t e) { InnerSV(av, b + s, o + s, e - s, op); });
      return;
    }
  }
  const BcastPlan p = MakePlan(so, {&sa, &sb});
  const int64_t ia = p.strides[0].back(), ib = p.strides[1].back();
  ParallelFor(n, kGrain, [&](int64_t s, int64_t e) {
    WalkRange<2>(p, s, e, [&](int64_t oo, const int64_t* off, int64_t cnt) {
      const TA* pa = a + off[0];
      const TB* pb = b + off[1];
      TO* po = o + oo;
      if constexpr (kAccum) {
        if (ib == 1) InnerAccV(po, pb, cnt, op);
        else if (ib == 0) InnerAccS(po, pb[0], cnt, op);
        else for (int64_t i = 0; i < cnt; ++i) po[i] = op(po[i], pb[i * ib]);
      } else {
        if (ia == 1 && ib == 1) InnerVV(pa, pb, po, cnt, op);
        else if (ia == 1 && ib == 0) InnerVS(pa, pb[0], po, cnt, op);
        else if (ia == 0 && ib == 1) InnerSV(pa[0], pb, po, cnt, op);
        else for (int64_t i = 0; i < cnt; ++i) po[i] = op(pa[i * ia], pb[i * ib]);
      }
    });
  });
}

// y = f(x) elementwise over contiguous memory.
template <class TI, class TO, class F>
void UnaryMap(const Tensor& x, Tensor& y, F f) {
  const TI* __restrict in = x.data<TI>();
  TO* __restrict out = y.data<TO>();
  ParallelFor(x.numel(), kGrain, [&](int64_t s, int64_t e) {
    const TI* __restrict pi = in + s;
    TO* __restrict po = out + s;
    const int64_t n = e - s;
    GAF_SIMD for (int64_t i = 0; i < n; ++i) po[i] = f(pi[i]);
  });
}

// ---------------------------------------------------------------------------------------------
// Binary ops.

void CheckSameType(const KernelContext& ctx, const Tensor& a, const Tensor& b) {
  GAF_CHECK(a.dtype() == b.dtype(), "{}: input types differ ({} vs {})", ctx.node.Describe(),
            DataTypeName(a.dtype()), DataTypeName(b.dtype()));
}

struct AddOp {
  template <class T> T operator()(T a, T b) const { return WrapAdd(a, b); }
};
struct SubOp {
  template <class T> T operator()(T a, T b) const { return WrapSub(a, b); }
};
struct MulOp {
  template <class T> T operator()(T a, T b) const { return WrapMul(a, b); }
};
struct DivOp {  // integer division truncates; divisors are checked for zero beforehand
  template <class T> T operator()(T a, T b) const {
    if constexpr (kIsInt<T> && std::is_signed_v<T>) return b == T(-1) ? WrapNeg(a) : static_cast<T>(a / b);
    else return static_cast<T>(a / b);
  }
};
struct MinOp {
  template <class T> T operator()(T a, T b) const { return b < a ? b : a; }
};
struct MaxOp {
  template <class T> T operator()(T a, T b) const { return a < b ? b : a; }
};
struct BitAndOp {
  template <class T> T operator()(T a, T b) const { return static_cast<T>(a & b); }
};
struct BitOrOp {
  template <class T> T operator()(T a, T b) const { return static_cast<T>(a | b); }
};
struct BitXorOp {
  template <class T> T operator()(T a, T b) const { return static_cast<T>(a ^ b); }
};
struct AndOp {
  bool operator()(bool a, bool b) const { return a && b; }
};
struct OrOp {
  bool operator()(bool a, bool b) const { return a || b; }
};
struct XorOp {
  bool operator()(bool a, bool b) const { return a != b; }
};
struct EqualOp {
  template <class T> bool operator()(T a, T b) const { return a == b; }
};
struct LessOp {
  template <class T> bool operator()(T a, T b) const { return a < b; }
};
struct GreaterOp {
  template <class T> bool operator()(T a, T b) const { return a > b; }
};
struct LessEqualOp {
  template <class T> bool operator()(T a, T b) const { return a <= b; }
};
struct GreaterEqualOp {
  template <class T> bool operator()(T a, T b) const { return a >= b; }
};

template <class T>
void CheckNoZeroDivisor(const KernelContext& ctx, const Tensor& b) {
  const T* pb = b.data<T>();
  for (int64_t i = 0; i < b.numel(); ++i)
    GAF_CHECK(pb[i] != T(0), "{}: integer division by zero", ctx.node.Describe());
}

// Same-type numeric inputs, output of the same type.
template <class Op, bool kIntegerOnly = false>
void ArithKernel(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  CheckSameType(ctx, a, b);
  Shape so = BroadcastShapes(a.shape(), b.shape(), ctx.node);
  ctx.outputs[0] = OutputTensor(a.dtype(), so);
  Tensor& y = ctx.outputs[0];
  auto run = [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<Op, DivOp> && kIsInt<T>) CheckNoZeroDivisor<T>(ctx, b);
    BinaryLoop(a.data<T>(), a.shape(), b.data<T>(), b.shape(), y.data<T>(), so, Op{});
  };
  if constexpr (kIntegerOnly) DispatchInteger(a.dtype(), ctx.node, run);
  else DispatchNumeric(a.dtype(), ctx.node, run);
}

// Same-type inputs (numeric, or bool when kBool), bool output.
template <class Op, bool kAllowBool>
void CompareKernel(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  CheckSameType(ctx, a, b);
  Shape so = BroadcastShapes(a.shape(), b.shape(), ctx.node);
  ctx.outputs[0] = OutputTensor(DataType::kBool, so);
  Tensor& y = ctx.outputs[0];
  auto run = [&](auto tag) {
    using T = decltype(tag);
    BinaryLoop(a.data<T>(), a.shape(), b.data<T>(), b.shape(), y.data<bool>(), so, Op{});
  };
  if constexpr (kAllowBool) DispatchNumericBool(a.dtype(), ctx.node, run);
  else DispatchNumeric(a.dtype(), ctx.node, run);
}

template <class Op>
void LogicalKernel(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  GAF_CHECK(a.dtype() == DataType::kBool && b.dtype() == DataType::kBool,
            "{}: inputs must be bool, got {} and {}", ctx.node.Describe(), DataTypeName(a.dtype()),
            DataTypeName(b.dtype()));
  Shape so = BroadcastShapes(a.shape(), b.shape(), ctx.node);
  ctx.outputs[0] = OutputTensor(DataType::kBool, so);
  BinaryLoop(a.data<bool>(), a.shape(), b.data<bool>(), b.shape(), ctx.outputs[0].data<bool>(), so,
             Op{});
}

template <class T>
T IntPow(T base, T exp) {
  if constexpr (std::is_signed_v<T>) {
    if (exp < 0) {
      if (base == 1) return 1;
      if (base == -1) return (exp & 1) ? T(-1) : T(1);
      return 0;  // truncation of 1 / base^|exp| (and 0 for base 0)
    }
  }
  WideU<T> r = 1, bb = static_cast<WideU<T>>(base);
  auto e = static_cast<std::make_unsigned_t<T>>(exp);
  while (e) {
    if (e & 1) r *= bb;
    bb *= bb;
    e >>= 1;
  }
  return static_cast<T>(r);
}

// Pow: output type is the base type; the exponent may have any numeric type.
void PowKernel(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  Shape so = BroadcastShapes(a.shape(), b.shape(), ctx.node);
  ctx.outputs[0] = OutputTensor(a.dtype(), so);
  Tensor& y = ctx.outputs[0];
  DispatchNumeric(a.dtype(), ctx.node, [&](auto tag) {
    using T = decltype(tag);
    const T* pa = a.data<T>();
    T* po = y.data<T>();
    if (b.dtype() == a.dtype()) {
      const T* pb = b.data<T>();
      if constexpr (std::is_floating_point_v<T>) {
        if (b.numel() == 1 && NumElements(so) == a.numel()) {
          const T e = pb[0];
          if (e == T(2)) return UnaryMap<T, T>(a, y, [](T x) { return x * x; });
          if (e == T(3)) return UnaryMap<T, T>(a, y, [](T x) { return x * x * x; });
          if (e == T(1)) return UnaryMap<T, T>(a, y, [](T x) { return x; });
        }
        BinaryLoop(pa, a.shape(), pb, b.shape(), po, so, [](T x, T e) { return std::pow(x, e); });
      } else {
        BinaryLoop(pa, a.shape(), pb, b.shape(), po, so, [](T x, T e) { return IntPow(x, e); });
      }
      return;
    }
    GAF_CHECK(b.dtype() != DataType::kBool && b.dtype() != DataType::kString,
              "{}: exponent type {} is not numeric", ctx.node.Describe(), DataTypeName(b.dtype()));
    // Mixed types: integer exponents of integer bases stay exact; otherwise compute in double.
    if constexpr (kIsInt<T>) {
      if (!IsFloatingPoint(b.dtype())) {
        std::vector<int64_t> e = b.ToInt64s();
        BinaryLoop(pa, a.shape(), e.data(), b.shape(), po, so, [](T x, int64_t ex) {
          return static_cast<T>(IntPow<int64_t>(static_cast<int64_t>(x), ex));
        });
        return;
      }
    }
    std::vector<double> e = b.ToDoubles();
    BinaryLoop(pa, a.shape(), e.data(), b.shape(), po, so,
               [](T x, double ex) { return static_cast<T>(std::pow(static_cast<double>(x), ex)); });
  });
}

// Mod: fmod=0 takes the sign of the divisor (Python %), fmod=1 that of the dividend (C fmod).
void ModKernel(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  CheckSameType(ctx, a, b);
  const bool fmod = ctx.node.GetInt("fmod", 0) != 0;
  Shape so = BroadcastShapes(a.shape(), b.shape(), ctx.node);
  ctx.outputs[0] = OutputTensor(a.dtype(), so);
  Tensor& y = ctx.outputs[0];
  DispatchNumeric(a.dtype(), ctx.node, [&](auto tag) {
    using T = decltype(tag);
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* po = y.data<T>();
    if constexpr (std::is_floating_point_v<T>) {
      if (fmod) {
        BinaryLoop(pa, a.shape(), pb, b.shape(), po, so, [](T x, T m) { return std::fmod(x, m); });
      } else {
        BinaryLoop(pa, a.shape(), pb, b.shape(), po, so, [](T x, T m) {
          T r = std::fmod(x, m);
          return (r != 0 && ((r < 0) != (m < 0))) ? r + m : r;
        });
      }
    } else {
      CheckNoZeroDivisor<T>(ctx, b);
      if constexpr (std::is_signed_v<T>) {
        if (fmod) {
          BinaryLoop(pa, a.shape(), pb, b.shape(), po, so,
                     [](T x, T m) { return m == T(-1) ? T(0) : static_cast<T>(x % m); });
        } else {
          BinaryLoop(pa, a.shape(), pb, b.shape(), po, so, [](T x, T m) {
            if (m == T(-1)) return T(0);
            T r = static_cast<T>(x % m);
            return (r != 0 && ((r < 0) != (m < 0))) ? static_cast<T>(r + m) : r;
          });
        }
      } else {
        BinaryLoop(pa, a.shape(), pb, b.shape(), po, so, [](T x, T m) { return static_cast<T>(x % m); });
      }
    }
  });
}

void BitShiftKernel(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  CheckSameType(ctx, a, b);
  const std::string dir = ctx.node.GetString("direction", "");
  GAF_CHECK(dir == "LEFT" || dir == "RIGHT", "{}: direction must be LEFT or RIGHT, got '{}'",
            ctx.node.Describe(), dir);
  const bool left = dir == "LEFT";
  Shape so = BroadcastShapes(a.shape(), b.shape(), ctx.node);
  ctx.outputs[0] = OutputTensor(a.dtype(), so);
  Tensor& y = ctx.outputs[0];
  DispatchUnsigned(a.dtype(), ctx.node, [&](auto tag) {
    using T = decltype(tag);
    constexpr T kBits = static_cast<T>(sizeof(T) * 8);
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* po = y.data<T>();
    // Shifting by the bit width or more gives 0.
    if (left) {
      BinaryLoop(pa, a.shape(), pb, b.shape(), po, so, [](T x, T s) {
        return s >= kBits ? T(0) : static_cast<T>(static_cast<WideU<T>>(x) << s);
      });
    } else {
      BinaryLoop(pa, a.shape(), pb, b.shape(), po, so,
                 [](T x, T s) { return s >= kBits ? T(0) : static_cast<T>(x >> s); });
    }
  });
}

// PRelu: slope broadcasts unidirectionally to X. Legacy models (opset < 7) give a 1-D slope of
// one value per channel (axis 1).
void PReluKernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& slope = ctx.input(1);
  CheckSameType(ctx, x, slope);
  Shape ss = slope.shape();
  bool ok = ss.size() <= x.shape().size();
  for (size_t k = 0; ok && k < ss.size(); ++k) {
    int64_t ds = ss[ss.size() - 1 - k], dx = x.shape()[x.shape().size() - 1 - k];
    ok = ds == dx || ds == 1;
  }
  if (!ok && ss.size() == 1 && x.rank() >= 2 && ss[0] == x.dim(1)) {
    ss = Shape(static_cast<size_t>(x.rank() - 1), 1);
    ss[0] = x.dim(1);
    ok = true;
  }
  GAF_CHECK(ok, "{}: slope shape {} does not broadcast to input shape {}", ctx.node.Describe(),
            ShapeToString(slope.shape()), ShapeToString(x.shape()));
  ctx.outputs[0] = OutputTensor(x.dtype(), x.shape());
  Tensor& y = ctx.outputs[0];
  DispatchNumeric(x.dtype(), ctx.node, [&](auto tag) {
    using T = decltype(tag);
    BinaryLoop(x.data<T>(), x.shape(), slope.data<T>(), ss, y.data<T>(), x.shape(),
               [](T v, T s) { return v < T(0) ? WrapMul(v, s) : v; });
  });
}

// ---------------------------------------------------------------------------------------------
// Variadic broadcasting ops.

template <class Op, bool kMean = false>
void VariadicKernel(KernelContext& ctx) {
  std::vector<const Tensor*> ins;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    const Tensor* t = ctx.inputs[i];
    GAF_CHECK(t != nullptr, "{}: input {} is missing", ctx.node.Describe(), i);
    ins.push_back(t);
  }
  GAF_CHECK(!ins.empty(), "{}: needs at least one input", ctx.node.Describe());
  for (const Tensor* t : ins) CheckSameType(ctx, *ins[0], *t);
  Shape so = ins.size() == 1 ? ins[0]->shape() : BroadcastShapes(ins, ctx.node);
  ctx.outputs[0] = Tensor(ins[0]->dtype(), so);
  Tensor& y = ctx.outputs[0];
  DispatchNumeric(ins[0]->dtype(), ctx.node, [&](auto tag) {
    using T = decltype(tag);
    T* po = y.data<T>();
    if (ins.size() == 1) {
      std::memcpy(po, ins[0]->data<T>(), ins[0]->nbytes());
    } else {
      BinaryLoop(ins[0]->data<T>(), ins[0]->shape(), ins[1]->data<T>(), ins[1]->shape(), po, so, Op{});
      for (size_t k = 2; k < ins.size(); ++k)
        BinaryLoop<true>(po, so, ins[k]->data<T>(), ins[k]->shape(), po, so, Op{});
    }
    if constexpr (kMean) {
      const T cnt = static_cast<T>(ins.size());
      UnaryMap<T, T>(y, y, [cnt](T v) { return static_cast<T>(v / cnt); });
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Unary ops. Each op is a struct built from the node (for attributes) with a templated call.

struct NoAttrs {
  explicit NoAttrs(const Node&) {}
};

#define GAF_UNARY_OP(Name, expr)                   \
  struct Name : NoAttrs {                          \
    using NoAttrs::NoAttrs;                        \
    template <class T> T operator()(T x) const { return expr; } \
  };

GAF_UNARY_OP(AbsOp, (x < T(0) ? WrapNeg(x) : x))
GAF_UNARY_OP(NegOp, WrapNeg(x))
GAF_UNARY_OP(SignOp, (x > T(0) ? T(1) : (x < T(0) ? static_cast<T>(-1) : x)))
GAF_UNARY_OP(ReluOp, (x < T(0) ? T(0) : x))
GAF_UNARY_OP(FloorOp, std::floor(x))
GAF_UNARY_OP(CeilOp, std::ceil(x))
GAF_UNARY_OP(RoundOp, std::nearbyint(x))  // default rounding mode: half to even
GAF_UNARY_OP(ReciprocalOp, T(1) / x)
GAF_UNARY_OP(SqrtOp, std::sqrt(x))
GAF_UNARY_OP(ExpOp, Exp(x))
GAF_UNARY_OP(LogOp, std::log(x))
GAF_UNARY_OP(ErfOp, Erf(x))
GAF_UNARY_OP(TanhOp, Tanh(x))
GAF_UNARY_OP(SigmoidOp, Sigmoid(x))
GAF_UNARY_OP(SinOp, std::sin(x))
GAF_UNARY_OP(CosOp, std::cos(x))
GAF_UNARY_OP(TanOp, std::tan(x))
GAF_UNARY_OP(AsinOp, std::asin(x))
GAF_UNARY_OP(AcosOp, std::acos(x))
GAF_UNARY_OP(AtanOp, std::atan(x))
GAF_UNARY_OP(SinhOp, std::sinh(x))
GAF_UNARY_OP(CoshOp, std::cosh(x))
GAF_UNARY_OP(AsinhOp, std::asinh(x))
GAF_UNARY_OP(AcoshOp, std::acosh(x))
GAF_UNARY_OP(AtanhOp, std::atanh(x))
GAF_UNARY_OP(SoftplusOp, Softplus(x))
GAF_UNARY_OP(SoftsignOp, x / (T(1) + std::fabs(x)))
GAF_UNARY_OP(MishOp, x * std::tanh(Softplus(x)))
GAF_UNARY_OP(HardSwishOp, x * std::min(T(1), std::max(T(0), x / T(6) + T(0.5))))
GAF_UNARY_OP(BitNotOp, static_cast<T>(~x))
#undef GAF_UNARY_OP

struct LeakyReluOp {
  float alpha;
  explicit LeakyReluOp(const Node& n) : alpha(n.GetFloat("alpha", 0.01f)) {}
  template <class T> T operator()(T x) const { return x < T(0) ? x * T(alpha) : x; }
};
struct EluOp {
  float alpha;
  explicit EluOp(const Node& n) : alpha(n.GetFloat("alpha", 1.f)) {}
  template <class T> T operator()(T x) const { return x < T(0) ? T(alpha) * std::expm1(x) : x; }
};
struct SeluOp {
  float alpha, gamma;
  explicit SeluOp(const Node& n)
      : alpha(n.GetFloat("alpha", 1.67326319217681884765625f)),
        gamma(n.GetFloat("gamma", 1.05070102214813232421875f)) {}
  template <class T> T operator()(T x) const {
    return x <= T(0) ? T(gamma) * (T(alpha) * std::expm1(x)) : T(gamma) * x;
  }
};
struct CeluOp {
  float alpha;
  explicit CeluOp(const Node& n) : alpha(n.GetFloat("alpha", 1.f)) {
    GAF_CHECK(alpha != 0.f, "{}: alpha must be non-zero", n.Describe());
  }
  template <class T> T operator()(T x) const {
    return x > T(0) ? x : T(alpha) * std::expm1(x / T(alpha));
  }
};
struct HardSigmoidOp {
  float alpha, beta;
  explicit HardSigmoidOp(const Node& n) : alpha(n.GetFloat("alpha", 0.2f)), beta(n.GetFloat("beta", 0.5f)) {}
  template <class T> T operator()(T x) const {
    return std::max(T(0), std::min(T(1), T(alpha) * x + T(beta)));
  }
};
struct ThresholdedReluOp {
  float alpha;
  explicit ThresholdedReluOp(const Node& n) : alpha(n.GetFloat("alpha", 1.f)) {}
  template <class T> T operator()(T x) const { return x > T(alpha) ? x : T(0); }
};
struct ShrinkOp {
  float lambd, bias;
  explicit ShrinkOp(const Node& n) : lambd(n.GetFloat("lambd", 0.5f)), bias(n.GetFloat("bias", 0.f)) {}
  template <class T> T operator()(T x) const {
    if constexpr (std::is_floating_point_v<T>) {
      return x < T(-lambd) ? x + T(bias) : (x > T(lambd) ? x - T(bias) : T(0));
    } else {
      double v = static_cast<double>(x);
      return v < -lambd ? static_cast<T>(v + bias) : (v > lambd ? static_cast<T>(v - bias) : T(0));
    }
  }
};
struct GeluOp {
  bool tanh_approx;
  explicit GeluOp(const Node& n) {
    std::string a = n.GetString("approximate", "none");
    if (a != "none" && a != "tanh") GAF_UNSUPPORTED("{}: approximate='{}' is not supported", n.Describe(), a);
    tanh_approx = a == "tanh";
  }
  template <class T> T operator()(T x) const {
    if (tanh_approx) {
      const T k = T(0.7978845608028654);  // sqrt(2/pi)
      return T(0.5) * x * (T(1) + Tanh(k * (x + T(0.044715) * x * x * x)));
    }
    return T(0.5) * x * (T(1) + Erf(x * T(0.7071067811865476)));
  }
};

enum class Types { kFloat, kNumeric, kSigned, kInteger };

template <class Op, Types kTypes>
void UnaryKernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Op op(ctx.node);
  ctx.outputs[0] = OutputTensor(x.dtype(), x.shape());
  Tensor& y = ctx.outputs[0];
  auto run = [&](auto tag) {
    using T = decltype(tag);
    if constexpr (kTypes == Types::kFloat) {
      if constexpr (std::is_floating_point_v<T>) UnaryMap<T, T>(x, y, op);
    } else if constexpr (kTypes == Types::kInteger) {
      if constexpr (kIsInt<T>) UnaryMap<T, T>(x, y, op);
    } else {
      UnaryMap<T, T>(x, y, op);
    }
  };
  if constexpr (kTypes == Types::kFloat) {
    DispatchFloat(x.dtype(), ctx.node, run);
  } else if constexpr (kTypes == Types::kInteger) {
    DispatchInteger(x.dtype(), ctx.node, run);
  } else if constexpr (kTypes == Types::kSigned) {
    switch (x.dtype()) {
      case DataType::kUint8: case DataType::kUint16: case DataType::kUint32: case DataType::kUint64:
        GAF_UNSUPPORTED("{}: data type {} is not supported", ctx.node.Describe(), DataTypeName(x.dtype()));
      default: DispatchNumeric(x.dtype(), ctx.node, run);
    }
  } else {
    DispatchNumeric(x.dtype(), ctx.node, run);
  }
}

void NotKernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  GAF_CHECK(x.dtype() == DataType::kBool, "{}: input must be bool, got {}", ctx.node.Describe(),
            DataTypeName(x.dtype()));
  ctx.outputs[0] = Tensor(DataType::kBool, x.shape());
  UnaryMap<bool, bool>(x, ctx.outputs[0], [](bool v) { return !v; });
}

void IsNaNKernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  ctx.outputs[0] = Tensor(DataType::kBool, x.shape());
  DispatchFloat(x.dtype(), ctx.node, [&](auto tag) {
    using T = decltype(tag);
    UnaryMap<T, bool>(x, ctx.outputs[0], [](T v) { return v != v; });
  });
}

void IsInfKernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const bool pos = ctx.node.GetInt("detect_positive", 1) != 0;
  const bool neg = ctx.node.GetInt("detect_negative", 1) != 0;
  ctx.outputs[0] = Tensor(DataType::kBool, x.shape());
  DispatchFloat(x.dtype(), ctx.node, [&](auto tag) {
    using T = decltype(tag);
    const T inf = std::numeric_limits<T>::infinity();
    const T pinf = pos ? inf : T(0), ninf = neg ? -inf : T(0);  // 0 never equals +-inf
    UnaryMap<T, bool>(x, ctx.outputs[0], [=](T v) { return v == pinf || v == ninf; });
  });
}

// Clip: min/max attributes before opset 11, optional scalar inputs from opset 11.
void ClipKernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  ctx.outputs[0] = OutputTensor(x.dtype(), x.shape());
  Tensor& y = ctx.outputs[0];
  DispatchNumeric(x.dtype(), ctx.node, [&](auto tag) {
    using T = decltype(tag);
    T lo, hi;
    if constexpr (std::is_floating_point_v<T>) {
      lo = -std::numeric_limits<T>::infinity();
      hi = std::numeric_limits<T>::infinity();
    } else {
      lo = std::numeric_limits<T>::lowest();
      hi = std::numeric_limits<T>::max();
    }
    if (ctx.opset < 11) {
      if (ctx.node.HasAttr("min")) lo = static_cast<T>(ctx.node.GetFloat("min", 0.f));
      if (ctx.node.HasAttr("max")) hi = static_cast<T>(ctx.node.GetFloat("max", 0.f));
    } else {
      for (size_t i = 1; i <= 2; ++i) {
        if (!ctx.has_input(i)) continue;
        const Tensor& t = *ctx.inputs[i];
        GAF_CHECK(t.dtype() == x.dtype(), "{}: {} has type {}, expected {}", ctx.node.Describe(),
                  i == 1 ? "min" : "max", DataTypeName(t.dtype()), DataTypeName(x.dtype()));
        GAF_CHECK(t.numel() == 1, "{}: {} must be a scalar, got shape {}", ctx.node.Describe(),
                  i == 1 ? "min" : "max", ShapeToString(t.shape()));
        (i == 1 ? lo : hi) = t.data<T>()[0];
      }
    }
    UnaryMap<T, T>(x, y, [lo, hi](T v) {
      T t = v < lo ? lo : v;
      return t > hi ? hi : t;
    });
  });
}

// ---------------------------------------------------------------------------------------------
// Where (any element type, by element size).

template <class T, int SC, int SX, int SY>
inline void WhereInner(const bool* __restrict c, const T* __restrict x, const T* __restrict y,
                       T* __restrict o, int64_t n) {
  GAF_SIMD for (int64_t i = 0; i < n; ++i) o[i] = c[i * SC] ? x[i * SX] : y[i * SY];
}

template <class T, int SC, int SX, int SY>
void WhereRange(const BcastPlan& p, const bool* c, const T* x, const T* y, T* o, int64_t n) {
  ParallelFor(n, kGrain, [&](int64_t s, int64_t e) {
    WalkRange<3>(p, s, e, [&](int64_t oo, const int64_t* off, int64_t cnt) {
      WhereInner<T, SC, SX, SY>(c + off[0], x + off[1], y + off[2], o + oo, cnt);
    });
  });
}

void WhereKernel(KernelContext& ctx) {
  const Tensor& c = ctx.input(0);
  const Tensor& x = ctx.input(1);
  const Tensor& yv = ctx.input(2);
  GAF_CHECK(c.dtype() == DataType::kBool, "{}: condition must be bool, got {}", ctx.node.Describe(),
            DataTypeName(c.dtype()));
  CheckSameType(ctx, x, yv);
  Shape so = BroadcastShapes({&c, &x, &yv}, ctx.node);
  ctx.outputs[0] = OutputTensor(x.dtype(), so);
  Tensor& out = ctx.outputs[0];
  const int64_t n = out.numel();
  if (n == 0) return;
  if (x.dtype() == DataType::kString) {
    const BcastPlan p = MakePlan(so, {&c.shape(), &x.shape(), &yv.shape()});
    const int64_t inner = p.dims.back();
    const int64_t sc = p.strides[0].back(), sx = p.strides[1].back(), sy = p.strides[2].back();
    const bool* pc = c.data<bool>();
    const std::string* px = x.data<std::string>();
    const std::string* py = yv.data<std::string>();
    std::string* po = out.data<std::string>();
    WalkRows<3>(p, 0, n / inner, [&](int64_t row, const int64_t* off) {
      for (int64_t i = 0; i < inner; ++i)
        po[row * inner + i] = pc[off[0] + i * sc] ? px[off[1] + i * sx] : py[off[2] + i * sy];
    });
    return;
  }
  DispatchBySize(x.dtype(), ctx.node, [&](auto tag) {
    using T = decltype(tag);
    const bool* pc = c.data<bool>();
    const T* px = static_cast<const T*>(x.raw());
    const T* py = static_cast<const T*>(yv.raw());
    T* po = static_cast<T*>(out.raw());
    if (c.numel() == n && x.numel() == n && yv.numel() == n) {
      ParallelFor(n, kGrain, [&](int64_t s, int64_t e) {
        WhereInner<T, 1, 1, 1>(pc + s, px + s, py + s, po + s, e - s);
      });
      return;
    }
    const BcastPlan p = MakePlan(so, {&c.shape(), &x.shape(), &yv.shape()});
    const int64_t sc = p.strides[0].back(), sx = p.strides[1].back(), sy = p.strides[2].back();
    // Inner strides are 0 or 1 after collapsing.
    switch (sc * 4 + sx * 2 + sy) {
      case 0: return WhereRange<T, 0, 0, 0>(p, pc, px, py, po, n);
      case 1: return WhereRange<T, 0, 0, 1>(p, pc, px, py, po, n);
      case 2: return WhereRange<T, 0, 1, 0>(p, pc, px, py, po, n);
      case 3: return WhereRange<T, 0, 1, 1>(p, pc, px, py, po, n);
      case 4: return WhereRange<T, 1, 0, 0>(p, pc, px, py, po, n);
      case 5: return WhereRange<T, 1, 0, 1>(p, pc, px, py, po, n);
      case 6: return WhereRange<T, 1, 1, 0>(p, pc, px, py, po, n);
      default: return WhereRange<T, 1, 1, 1>(p, pc, px, py, po, n);
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Cast / CastLike.

template <class D, class S>
inline D ConvertElem(S v) {
  if constexpr (std::is_same_v<S, Half>) {
    return ConvertElem<D>(HalfToFloat(v.bits));
  } else if constexpr (std::is_same_v<S, BFloat16>) {
    return ConvertElem<D>(BFloat16ToFloat(v.bits));
  } else if constexpr (std::is_same_v<D, Half>) {
    return Half{FloatToHalf(static_cast<float>(v))};
  } else if constexpr (std::is_same_v<D, BFloat16>) {
    return BFloat16{FloatToBFloat16(static_cast<float>(v))};
  } else if constexpr (std::is_same_v<D, bool>) {
    return v != S(0);
  } else {
    return static_cast<D>(v);
  }
}

template <class F>
decltype(auto) DispatchCastType(DataType dt, const Node& node, F&& fn) {
  switch (dt) {
    case DataType::kBool: return fn(bool{});
    case DataType::kFloat16: return fn(Half{});
    case DataType::kBFloat16: return fn(BFloat16{});
    default: return DispatchNumeric(dt, node, fn);
  }
}

std::string NumberToString(double v, bool is_float32) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "INF" : "-INF";
  char buf[64];
  std::to_chars_result r = is_float32 ? std::to_chars(buf, buf + sizeof(buf), static_cast<float>(v))
                                      : std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

void CastFromString(const KernelContext& ctx, const Tensor& x, Tensor& y) {
  const std::string* in = x.data<std::string>();
  DispatchCastType(y.dtype(), ctx.node, [&](auto tag) {
    using D = decltype(tag);
    D* out = y.data<D>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const char* s = in[i].c_str();
      char* end = nullptr;
      errno = 0;
      if constexpr (kIsInt<D> && std::is_signed_v<D>) {
        long long v = std::strtoll(s, &end, 10);
        GAF_CHECK(end != s && *end == '\0', "{}: cannot parse '{}' as {}", ctx.node.Describe(), in[i],
                  DataTypeName(y.dtype()));
        out[i] = static_cast<D>(v);
      } else if constexpr (kIsInt<D>) {
        unsigned long long v = std::strtoull(s, &end, 10);
        GAF_CHECK(end != s && *end == '\0', "{}: cannot parse '{}' as {}", ctx.node.Describe(), in[i],
                  DataTypeName(y.dtype()));
        out[i] = static_cast<D>(v);
      } else {
        double v = std::strtod(s, &end);  // accepts "NaN", "INF", "+INF", "-INF"
        GAF_CHECK(end != s && *end == '\0', "{}: cannot parse '{}' as {}", ctx.node.Describe(), in[i],
                  DataTypeName(y.dtype()));
        out[i] = ConvertElem<D>(v);
      }
    }
  });
}

void CastToString(const KernelContext& ctx, const Tensor& x, Tensor& y) {
  std::string* out = y.data<std::string>();
  DispatchCastType(x.dtype(), ctx.node, [&](auto tag) {
    using S = decltype(tag);
    const S* in = x.data<S>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      if constexpr (std::is_same_v<S, bool>) {
        out[i] = std::string(1, in[i] ? '1' : '0');
      } else if constexpr (kIsInt<S>) {
        out[i] = std::to_string(in[i]);
      } else if constexpr (std::is_same_v<S, double>) {
        out[i] = NumberToString(in[i], false);
      } else {
        out[i] = NumberToString(ConvertElem<float>(in[i]), true);
      }
    }
  });
}

void DoCast(KernelContext& ctx, DataType to) {
  const Tensor& x = ctx.input(0);
  ctx.outputs[0] = Tensor(to, x.shape());
  Tensor& y = ctx.outputs[0];
  const int64_t n = x.numel();
  if (n == 0) return;
  if (x.dtype() == to) {
    if (to == DataType::kString) {
      for (int64_t i = 0; i < n; ++i) y.data<std::string>()[i] = x.data<std::string>()[i];
    } else {
      std::memcpy(y.raw(), x.raw(), x.nbytes());
    }
    return;
  }
  if (x.dtype() == DataType::kString) return CastFromString(ctx, x, y);
  if (to == DataType::kString) return CastToString(ctx, x, y);
  if (x.dtype() == DataType::kFloat16 && to == DataType::kFloat) {
    const uint16_t* in = static_cast<const uint16_t*>(x.raw());
    float* out = y.data<float>();
    ParallelFor(n, kGrain, [&](int64_t s, int64_t e) { HalfToFloatLoop(in + s, out + s, e - s); });
    return;
  }
  if (x.dtype() == DataType::kFloat && to == DataType::kFloat16) {
    const float* in = x.data<float>();
    uint16_t* out = static_cast<uint16_t*>(y.raw());
    ParallelFor(n, kGrain, [&](int64_t s, int64_t e) { FloatToHalfLoop(in + s, out + s, e - s); });
    return;
  }
  DispatchCastType(x.dtype(), ctx.node, [&](auto stag) {
    using S = decltype(stag);
    DispatchCastType(to, ctx.node, [&](auto dtag) {
      using D = decltype(dtag);
      UnaryMap<S, D>(x, y, [](S v) { return ConvertElem<D>(v); });
    });
  });
}

void CastKernel(KernelContext& ctx) {
  GAF_CHECK(ctx.node.HasAttr("to"), "{}: missing attribute 'to'", ctx.node.Describe());
  const int64_t to = ctx.node.GetInt("to", 0);
  switch (static_cast<DataType>(to)) {
    case DataType::kFloat: case DataType::kUint8: case DataType::kInt8: case DataType::kUint16:
    case DataType::kInt16: case DataType::kInt32: case DataType::kInt64: case DataType::kString:
    case DataType::kBool: case DataType::kFloat16: case DataType::kDouble: case DataType::kUint32:
    case DataType::kUint64: case DataType::kBFloat16:
      break;
    default:
      GAF_UNSUPPORTED("{}: cast to data type {} is not supported", ctx.node.Describe(), to);
  }
  if (ctx.node.HasAttr("saturate") && ctx.node.GetInt("saturate", 1) == 0) {
    // Only affects float8 targets, which are not supported anyway.
  }
  DoCast(ctx, static_cast<DataType>(to));
}

void CastLikeKernel(KernelContext& ctx) { DoCast(ctx, ctx.input(1).dtype()); }

}  // namespace

void RegisterElementwiseKernels(OpRegistry& r) {
  constexpr auto kE = OpKind::kElementwise;
  constexpr auto kB = OpKind::kBroadcast;
  auto reg = [&](const char* op, OpKind kind, KernelFn fn, bool upcast = true) {
    r.Register({"", op, kind, std::move(fn), upcast});
  };

  // Binary arithmetic and bitwise ops.
  reg("Add", kB, ArithKernel<AddOp>);
  reg("Sub", kB, ArithKernel<SubOp>);
  reg("Mul", kB, ArithKernel<MulOp>);
  reg("Div", kB, ArithKernel<DivOp>);
  reg("Pow", kB, PowKernel);
  reg("Mod", kB, ModKernel);
  reg("BitShift", kB, BitShiftKernel);
  reg("BitwiseAnd", kB, ArithKernel<BitAndOp, true>);
  reg("BitwiseOr", kB, ArithKernel<BitOrOp, true>);
  reg("BitwiseXor", kB, ArithKernel<BitXorOp, true>);
  reg("PRelu", kB, PReluKernel);

  // Logic and comparisons.
  reg("And", kB, LogicalKernel<AndOp>);
  reg("Or", kB, LogicalKernel<OrOp>);
  reg("Xor", kB, LogicalKernel<XorOp>);
  reg("Not", kE, NotKernel);
  reg("Equal", kB, CompareKernel<EqualOp, true>);
  reg("Less", kB, CompareKernel<LessOp, false>);
  reg("Greater", kB, CompareKernel<GreaterOp, false>);
  reg("LessOrEqual", kB, CompareKernel<LessEqualOp, false>);
  reg("GreaterOrEqual", kB, CompareKernel<GreaterEqualOp, false>);

  // Variadic.
  reg("Min", kB, VariadicKernel<MinOp>);
  reg("Max", kB, VariadicKernel<MaxOp>);
  reg("Sum", kB, VariadicKernel<AddOp>);
  reg("Mean", kB, VariadicKernel<AddOp, true>);

  // Unary.
  reg("Abs", kE, UnaryKernel<AbsOp, Types::kNumeric>);
  reg("Neg", kE, UnaryKernel<NegOp, Types::kSigned>);
  reg("Sign", kE, UnaryKernel<SignOp, Types::kNumeric>);
  reg("Relu", kE, UnaryKernel<ReluOp, Types::kSigned>);
  reg("BitwiseNot", kE, UnaryKernel<BitNotOp, Types::kInteger>);
  reg("Floor", kE, UnaryKernel<FloorOp, Types::kFloat>);
  reg("Ceil", kE, UnaryKernel<CeilOp, Types::kFloat>);
  reg("Round", kE, UnaryKernel<RoundOp, Types::kFloat>);
  reg("Reciprocal", kE, UnaryKernel<ReciprocalOp, Types::kFloat>);
  reg("Sqrt", kE, UnaryKernel<SqrtOp, Types::kFloat>);
  reg("Exp", kE, UnaryKernel<ExpOp, Types::kFloat>);
  reg("Log", kE, UnaryKernel<LogOp, Types::kFloat>);
  reg("Erf", kE, UnaryKernel<ErfOp, Types::kFloat>);
  reg("Tanh", kE, UnaryKernel<TanhOp, Types::kFloat>);
  reg("Sigmoid", kE, UnaryKernel<SigmoidOp, Types::kFloat>);
  reg("Sin", kE, UnaryKernel<SinOp, Types::kFloat>);
  reg("Cos", kE, UnaryKernel<CosOp, Types::kFloat>);
  reg("Tan", kE, UnaryKernel<TanOp, Types::kFloat>);
  reg("Asin", kE, UnaryKernel<AsinOp, Types::kFloat>);
  reg("Acos", kE, UnaryKernel<AcosOp, Types::kFloat>);
  reg("Atan", kE, UnaryKernel<AtanOp, Types::kFloat>);
  reg("Sinh", kE, UnaryKernel<SinhOp, Types::kFloat>);
  reg("Cosh", kE, UnaryKernel<CoshOp, Types::kFloat>);
  reg("Asinh", kE, UnaryKernel<AsinhOp, Types::kFloat>);
  reg("Acosh", kE, UnaryKernel<AcoshOp, Types::kFloat>);
  reg("Atanh", kE, UnaryKernel<AtanhOp, Types::kFloat>);
  reg("IsNaN", kE, IsNaNKernel);
  reg("IsInf", kE, IsInfKernel);
  reg("LeakyRelu", kE, UnaryKernel<LeakyReluOp, Types::kFloat>);
  reg("Elu", kE, UnaryKernel<EluOp, Types::kFloat>);
  reg("Selu", kE, UnaryKernel<SeluOp, Types::kFloat>);
  reg("Celu", kE, UnaryKernel<CeluOp, Types::kFloat>);
  reg("HardSigmoid", kE, UnaryKernel<HardSigmoidOp, Types::kFloat>);
  reg("HardSwish", kE, UnaryKernel<HardSwishOp, Types::kFloat>);
  reg("Softplus", kE, UnaryKernel<SoftplusOp, Types::kFloat>);
  reg("Softsign", kE, UnaryKernel<SoftsignOp, Types::kFloat>);
  reg("Mish", kE, UnaryKernel<MishOp, Types::kFloat>);
  reg("Gelu", kE, UnaryKernel<GeluOp, Types::kFloat>);
  reg("ThresholdedRelu", kE, UnaryKernel<ThresholdedReluOp, Types::kFloat>);
  reg("Shrink", kE, UnaryKernel<ShrinkOp, Types::kNumeric>);
  reg("Clip", kE, ClipKernel);

  // Selection and conversion (element-size / own half handling).
  reg("Where", kB, WhereKernel, /*upcast=*/false);
  reg("Cast", kE, CastKernel, /*upcast=*/false);
  reg("CastLike", kE, CastLikeKernel, /*upcast=*/false);
}

}  // namespace gaf
