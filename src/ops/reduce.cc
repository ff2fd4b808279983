// Reduction-family kernels: Reduce*, ArgMax/ArgMin, Softmax/LogSoftmax/Hardmax, the
// normalizations (LayerNormalization, BatchNormalization, InstanceNormalization,
// GroupNormalization, LpNormalization, MeanVarianceNormalization, LRN), CumSum and TopK.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ops/kernel.h"
#include "ops/kernel_util.h"

namespace gaf {
namespace {

constexpr int64_t kGrain = 32768;     // elements of work per parallel chunk
constexpr int64_t kColBlock = 1024;   // columns accumulated at once (fits L1)

int64_t Prod(const Shape& s, int64_t b, int64_t e) {
  int64_t p = 1;
  for (int64_t i = b; i < e; ++i) p *= s[static_cast<size_t>(i)];
  return p;
}

// Grain (in tasks) for tasks of `work` elements each.
int64_t TaskGrain(int64_t work) { return std::max<int64_t>(1, kGrain / std::max<int64_t>(1, work)); }

// Saturating conversion from double (NaN -> 0 for integers).
template <class T>
T FromDouble(double v) {
  if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(v);
  } else {
    if (std::isnan(v)) return T(0);
    if (v <= static_cast<double>(std::numeric_limits<T>::lowest())) return std::numeric_limits<T>::lowest();
    if (v >= static_cast<double>(std::numeric_limits<T>::max())) return std::numeric_limits<T>::max();
    return static_cast<T>(v);
  }
}

// Branch-free expf (Cephes polynomial, ~1 ulp) that the compiler vectorizes. Inputs above 88
// saturate at exp(88); inputs below -87 return 0. Used where arguments are <= 0 (x - max).
inline float FastExp(float x) {
  float xc = std::min(std::max(x, -87.0f), 88.0f);
  float fx = xc * 1.44269504088896341f;
  // Round to nearest by the 1.5 * 2^23 trick; the integer is read from the sum's low mantissa bits
  // (no float-to-int conversion, which would be undefined for a NaN input).
  const float shifted = fx + 12582912.0f;
  float n = shifted - 12582912.0f;
  float r = xc - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500E-4f;
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  float y = p * r * r + r + 1.0f;
  const uint32_t e = (std::bit_cast<uint32_t>(shifted) - 0x4B400000u + 127u) << 23;
  y *= std::bit_cast<float>(e);
  return x < -87.0f ? 0.0f : y;
}

template <class T>
inline T ExpT(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return FastExp(x);
  } else {
    return std::exp(x);
  }
}

// Copies `in` (row-major `shape`) into `out` with out dim j = in dim perm[j].
template <class T>
void PermuteCopy(const T* in, const Shape& shape, const std::vector<int64_t>& perm, T* out) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  if (rank == 0) {
    out[0] = in[0];
    return;
  }
  std::vector<int64_t> in_strides = Strides(shape);
  Shape oshape(rank);
  std::vector<int64_t> ostr(rank);
  for (int64_t j = 0; j < rank; ++j) {
    oshape[j] = shape[perm[j]];
    ostr[j] = in_strides[perm[j]];
  }
  const int64_t total = NumElements(oshape);
  if (total == 0) return;
  const int64_t inner = oshape[rank - 1], istride = ostr[rank - 1];
  const int64_t rows = total / inner;
  ParallelFor(rows, TaskGrain(inner), [&](int64_t b, int64_t e) {
    std::vector<int64_t> coord(rank, 0);
    int64_t rem = b, off = 0;
    for (int64_t d = rank - 2; d >= 0; --d) {
      coord[d] = rem % oshape[d];
      rem /= oshape[d];
      off += coord[d] * ostr[d];
    }
    for (int64_t r = b; r < e; ++r) {
      T* o = out + r * inner;
      const T* src = in + off;
      if (istride == 1) {
        std::memcpy(o, src, static_cast<size_t>(inner) * sizeof(T));
      } else {
        for (int64_t i = 0; i < inner; ++i) o[i] = src[i * istride];
      }
      for (int64_t d = rank - 2; d >= 0; --d) {
        off += ostr[d];
        if (++coord[d] < oshape[d]) break;
        off -= ostr[d] * oshape[d];
        coord[d] = 0;
      }
    }
  });
}

// ------------------------------------------------------------------------------------------
// Reduce* machinery
// ------------------------------------------------------------------------------------------

enum class Comb { kSum, kProd, kMax, kMin };
enum class Pre { kId, kSquare, kAbs };
enum class Post { kNone, kMean, kSqrt, kLog };

template <class T, Comb C>
constexpr T Identity() {
  if constexpr (C == Comb::kSum) {
    return T(0);
  } else if constexpr (C == Comb::kProd) {
    return T(1);
  } else if constexpr (C == Comb::kMax) {
    if constexpr (std::numeric_limits<T>::has_infinity) return -std::numeric_limits<T>::infinity();
    return std::numeric_limits<T>::lowest();
  } else {
    if constexpr (std::numeric_limits<T>::has_infinity) return std::numeric_limits<T>::infinity();
    return std::numeric_limits<T>::max();
  }
}

template <class T, Comb C>
inline T Combine(T a, T v) {
  if constexpr (C == Comb::kSum) {
    return static_cast<T>(a + v);
  } else if constexpr (C == Comb::kProd) {
    return static_cast<T>(a * v);
  } else if constexpr (C == Comb::kMax) {
    return v > a ? v : a;
  } else {
    return v < a ? v : a;
  }
}

template <class T, Pre P>
inline T PreMap(T v) {
  if constexpr (P == Pre::kSquare) {
    return static_cast<T>(v * v);
  } else if constexpr (P == Pre::kAbs) {
    if constexpr (std::is_signed_v<T>) {
      return v < T(0) ? static_cast<T>(-v) : v;
    } else {
      return v;
    }
  } else {
    return v;
  }
}

template <class T, Post Q>
inline T Finalize(T acc, int64_t n) {
  if constexpr (Q == Post::kMean) {
    if constexpr (std::is_floating_point_v<T>) {
      return acc / static_cast<T>(n);
    } else if constexpr (std::is_unsigned_v<T>) {
      return n == 0 ? T(0) : static_cast<T>(static_cast<uint64_t>(acc) / static_cast<uint64_t>(n));
    } else {
      return n == 0 ? T(0) : static_cast<T>(static_cast<int64_t>(acc) / n);
    }
  } else if constexpr (Q == Post::kSqrt) {
    if constexpr (std::is_floating_point_v<T>) return std::sqrt(acc);
    return FromDouble<T>(std::sqrt(static_cast<double>(acc)));
  } else if constexpr (Q == Post::kLog) {
    if constexpr (std::is_floating_point_v<T>) return std::log(acc);
    return FromDouble<T>(std::log(static_cast<double>(acc)));
  } else {
    return acc;
  }
}

// Reduces a contiguous row (vectorized through omp simd reductions).
template <class T, Comb C, Pre P>
T RowReduce(const T* x, int64_t n) {
  T acc = Identity<T, C>();
  if constexpr (C == Comb::kSum) {
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < n; ++i) acc += PreMap<T, P>(x[i]);
  } else if constexpr (C == Comb::kProd) {
#pragma omp simd reduction(* : acc)
    for (int64_t i = 0; i < n; ++i) acc *= PreMap<T, P>(x[i]);
  } else if constexpr (C == Comb::kMax) {
#pragma omp simd reduction(max : acc)
    for (int64_t i = 0; i < n; ++i) {
      T v = PreMap<T, P>(x[i]);
      acc = v > acc ? v : acc;
    }
    // OpenMP starts a max reduction's private copies at the lowest finite value (clang does; GCC
    // at -inf), so a row of -inf only came out as lowest() in the clang build (ONNX's fully masked
    // attention rows then were not found masked). Such a result is redone in order.
    if constexpr (std::numeric_limits<T>::has_infinity) {
      if (acc == std::numeric_limits<T>::lowest()) {
        acc = Identity<T, C>();
        for (int64_t i = 0; i < n; ++i) acc = Combine<T, C>(acc, PreMap<T, P>(x[i]));
      }
    }
  } else {
#pragma omp simd reduction(min : acc)
    for (int64_t i = 0; i < n; ++i) {
      T v = PreMap<T, P>(x[i]);
      acc = v < acc ? v : acc;
    }
    if constexpr (std::numeric_limits<T>::has_infinity) {  // as for max: +inf only
      if (acc == std::numeric_limits<T>::max()) {
        acc = Identity<T, C>();
        for (int64_t i = 0; i < n; ++i) acc = Combine<T, C>(acc, PreMap<T, P>(x[i]));
      }
    }
  }
  return acc;
}

// acc[0..cols) (already initialized) combined with r rows (row stride ld) of x[row][0..cols).
template <class T, Comb C, Pre P>
void ColAccumulate(const T* x, int64_t r, int64_t ld, int64_t cols, T* acc) {
  int64_t j = 0;
  for (; j + 4 <= r; j += 4) {
    const T* r0 = x + j * ld;
    const T* r1 = r0 + ld;
    const T* r2 = r1 + ld;
    const T* r3 = r2 + ld;
#pragma omp simd
    for (int64_t i = 0; i < cols; ++i) {
      const T a = Combine<T, C>(PreMap<T, P>(r0[i]), PreMap<T, P>(r1[i]));
      const T b = Combine<T, C>(PreMap<T, P>(r2[i]), PreMap<T, P>(r3[i]));
      acc[i] = Combine<T, C>(acc[i], Combine<T, C>(a, b));
    }
  }
  for (; j < r; ++j) {
    const T* row = x + j * ld;
#pragma omp simd
    for (int64_t i = 0; i < cols; ++i) acc[i] = Combine<T, C>(acc[i], PreMap<T, P>(row[i]));
  }
}

// acc[0..cols) = reduction over r rows (row stride ld) of x[row][0..cols).
template <class T, Comb C, Pre P>
void ColReduce(const T* x, int64_t r, int64_t ld, int64_t cols, T* acc) {
  const T init = Identity<T, C>();
  for (int64_t i = 0; i < cols; ++i) acc[i] = init;
  ColAccumulate<T, C, P>(x, r, ld, cols, acc);
}

// Element offsets (strides `st`) of every coordinate over the dims listed in `dims`, row-major.
std::vector<int64_t> Offsets(const Shape& sizes, const std::vector<int64_t>& st,
                             const std::vector<int64_t>& dims) {
  std::vector<int64_t> out{0};
  for (int64_t d : dims) {
    std::vector<int64_t> next;
    next.reserve(out.size() * static_cast<size_t>(sizes[d]));
    for (int64_t base : out) {
      for (int64_t i = 0; i < sizes[d]; ++i) next.push_back(base + i * st[d]);
    }
    out.swap(next);
  }
  return out;
}

// Canonical layout of a reduction: [k1, r, k2] with r reduced, or (general) a permutation of
// the compacted shape into [kept..., reduced...].
struct ReducePlan {
  int64_t k1 = 1, r = 1, k2 = 1;
  bool general = false;
  Shape merged;
  std::vector<bool> red;       // per merged dim (general case)
  std::vector<int64_t> perm;   // kept dims then reduced dims (general case)
};

ReducePlan MakeReducePlan(const Shape& shape, const std::vector<bool>& red) {
  std::vector<int64_t> sizes;
  std::vector<bool> flags;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!flags.empty() && flags.back() == red[d]) {
      sizes.back() *= shape[d];
    } else {
      sizes.push_back(shape[d]);
      flags.push_back(red[d]);
    }
  }
  std::string pat;
  for (bool f : flags) pat += f ? 'R' : 'K';
  ReducePlan p;
  if (pat.empty()) {
  } else if (pat == "R") {
    p.r = sizes[0];
  } else if (pat == "K") {
    p.k1 = sizes[0];
  } else if (pat == "KR") {
    p.k1 = sizes[0];
    p.r = sizes[1];
  } else if (pat == "RK") {
    p.r = sizes[0];
    p.k2 = sizes[1];
  } else if (pat == "KRK") {
    p.k1 = sizes[0];
    p.r = sizes[1];
    p.k2 = sizes[2];
  } else {
    p.general = true;
    p.merged = sizes;
    p.red = flags;
    for (size_t i = 0; i < flags.size(); ++i) {
      if (!flags[i]) {
        p.perm.push_back(static_cast<int64_t>(i));
        p.k1 *= sizes[i];
      }
    }
    for (size_t i = 0; i < flags.size(); ++i) {
      if (flags[i]) {
        p.perm.push_back(static_cast<int64_t>(i));
        p.r *= sizes[i];
      }
    }
  }
  return p;
}

// Reduction of an arbitrary pattern of kept/reduced (merged) dims without transposing: the
// innermost dim is reduced as contiguous rows (if reduced) or accumulated as columns (if kept);
// the outer dims are enumerated through precomputed offsets.
template <class T, Comb C, Pre P>
void ReduceGeneral(const T* in, const ReducePlan& p, T* out) {
  const Shape& sz = p.merged;
  const int64_t m = static_cast<int64_t>(sz.size());
  const std::vector<int64_t> st = Strides(sz);
  std::vector<int64_t> kdims, rdims;
  for (int64_t d = 0; d + 1 < m; ++d) (p.red[d] ? rdims : kdims).push_back(d);
  const std::vector<int64_t> koff = Offsets(sz, st, kdims), roff = Offsets(sz, st, rdims);
  const int64_t nk = static_cast<int64_t>(koff.size()), nr = static_cast<int64_t>(roff.size());
  const int64_t inner = sz[m - 1];
  if (p.red[m - 1]) {
    ParallelFor(nk, TaskGrain(nr * inner), [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) {
        T acc = Identity<T, C>();
        const T* base = in + koff[o];
        for (int64_t j = 0; j < nr; ++j) acc = Combine<T, C>(acc, RowReduce<T, C, P>(base + roff[j], inner));
        out[o] = acc;
      }
    });
  } else {
    const int64_t nblk = (inner + kColBlock - 1) / kColBlock;
    ParallelFor(nk * nblk, TaskGrain(nr * std::min(inner, kColBlock)), [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const int64_t o = t / nblk, c0 = (t % nblk) * kColBlock;
        const int64_t cols = std::min(inner, c0 + kColBlock) - c0;
        T* acc = out + o * inner + c0;
        const T init = Identity<T, C>();
        for (int64_t i = 0; i < cols; ++i) acc[i] = init;
        const T* base = in + koff[o] + c0;
        for (int64_t j = 0; j < nr; ++j) ColAccumulate<T, C, P>(base + roff[j], 1, 0, cols, acc);
      }
    });
  }
}

template <class T, Comb C, Pre P, Post Q>
void ReduceTyped(const T* in, const ReducePlan& p, T* out) {
  const int64_t k1 = p.k1, r = p.r, k2 = p.k2;
  if (k1 * k2 == 0) return;
  if (p.general) {
    ReduceGeneral<T, C, P>(in, p, out);
  } else if (k2 == 1) {
    const int nt = omp_get_max_threads();
    if (k1 < nt && nt > 1 && r >= 4 * kGrain) {
      // Few long rows: split each row across threads, then combine the partials.
      const int64_t chunks = std::min<int64_t>(nt * 4, r / kGrain);
      std::vector<T> part(static_cast<size_t>(chunks));
      for (int64_t i = 0; i < k1; ++i) {
        const T* row = in + i * r;
        ParallelFor(chunks, 1, [&](int64_t b, int64_t e) {
          for (int64_t c = b; c < e; ++c) {
            int64_t s0 = r * c / chunks, s1 = r * (c + 1) / chunks;
            part[c] = RowReduce<T, C, P>(row + s0, s1 - s0);
          }
        });
        T acc = Identity<T, C>();
        for (int64_t c = 0; c < chunks; ++c) acc = Combine<T, C>(acc, part[c]);
        out[i] = acc;
      }
    } else {
      ParallelFor(k1, TaskGrain(r), [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) out[i] = RowReduce<T, C, P>(in + i * r, r);
      });
    }
  } else {
    const int64_t nblk = (k2 + kColBlock - 1) / kColBlock;
    ParallelFor(k1 * nblk, TaskGrain(r * std::min(k2, kColBlock)), [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const int64_t i = t / nblk, c0 = (t % nblk) * kColBlock;
        const int64_t c1 = std::min(k2, c0 + kColBlock);
        ColReduce<T, C, P>(in + i * r * k2 + c0, r, k2, c1 - c0, out + i * k2 + c0);
      }
    });
  }
  if constexpr (Q != Post::kNone) {
    const int64_t n = k1 * k2;
    for (int64_t i = 0; i < n; ++i) out[i] = Finalize<T, Q>(out[i], r);
  }
}

// log(sum(exp(x))) computed as m + log(sum(exp(x - m))) with m the max.
template <class T>
void LogSumExpTyped(const T* in, const ReducePlan& p, T* out) {
  using A = std::conditional_t<std::is_floating_point_v<T>, T, double>;
  const int64_t k1 = p.k1, r = p.r, k2 = p.k2;
  if (k1 * k2 == 0) return;
  auto shift = [](T m) -> A {
    A s = static_cast<A>(m);
    return std::isfinite(s) ? s : A(0);
  };
  if (k2 == 1) {
    ParallelFor(k1, TaskGrain(2 * r), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const T* x = in + i * r;
        const A m = r == 0 ? A(0) : shift(RowReduce<T, Comb::kMax, Pre::kId>(x, r));
        A s = 0;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < r; ++j) s += ExpT<A>(static_cast<A>(x[j]) - m);
        out[i] = FromDouble<T>(static_cast<double>(m + std::log(s)));
      }
    });
  } else {
    ParallelFor(k1, TaskGrain(2 * r * k2), [&](int64_t b, int64_t e) {
      std::vector<T> mx(static_cast<size_t>(k2));
      std::vector<A> m(static_cast<size_t>(k2)), s(static_cast<size_t>(k2));
      for (int64_t i = b; i < e; ++i) {
        const T* x = in + i * r * k2;
        ColReduce<T, Comb::kMax, Pre::kId>(x, r, k2, k2, mx.data());
        for (int64_t c = 0; c < k2; ++c) {
          m[c] = r == 0 ? A(0) : shift(mx[c]);
          s[c] = 0;
        }
        for (int64_t j = 0; j < r; ++j) {
          const T* row = x + j * k2;
#pragma omp simd
          for (int64_t c = 0; c < k2; ++c) s[c] += ExpT<A>(static_cast<A>(row[c]) - m[c]);
        }
        for (int64_t c = 0; c < k2; ++c) {
          out[i * k2 + c] = FromDouble<T>(static_cast<double>(m[c] + std::log(s[c])));
        }
      }
    });
  }
}

enum class ReduceKind { kSum, kMean, kMax, kMin, kProd, kL1, kL2, kLogSum, kLogSumExp, kSumSquare };

template <class T>
void RunReduce(ReduceKind kind, const T* in, const ReducePlan& p, T* out) {
  switch (kind) {
    case ReduceKind::kSum: return ReduceTyped<T, Comb::kSum, Pre::kId, Post::kNone>(in, p, out);
    case ReduceKind::kMean: return ReduceTyped<T, Comb::kSum, Pre::kId, Post::kMean>(in, p, out);
    case ReduceKind::kMax: return ReduceTyped<T, Comb::kMax, Pre::kId, Post::kNone>(in, p, out);
    case ReduceKind::kMin: return ReduceTyped<T, Comb::kMin, Pre::kId, Post::kNone>(in, p, out);
    case ReduceKind::kProd: return ReduceTyped<T, Comb::kProd, Pre::kId, Post::kNone>(in, p, out);
    case ReduceKind::kL1: return ReduceTyped<T, Comb::kSum, Pre::kAbs, Post::kNone>(in, p, out);
    case ReduceKind::kL2: return ReduceTyped<T, Comb::kSum, Pre::kSquare, Post::kSqrt>(in, p, out);
    case ReduceKind::kLogSum: return ReduceTyped<T, Comb::kSum, Pre::kId, Post::kLog>(in, p, out);
    case ReduceKind::kSumSquare:
      return ReduceTyped<T, Comb::kSum, Pre::kSquare, Post::kNone>(in, p, out);
    case ReduceKind::kLogSumExp: return LogSumExpTyped<T>(in, p, out);
  }
}

// Reduces `in` over the dims flagged in `red` into `out` (sized to the kept elements).
template <class T>
void ReduceAxes(ReduceKind kind, const T* in, const Shape& shape, const std::vector<bool>& red,
                T* out) {
  ReducePlan p = MakeReducePlan(shape, red);
  std::vector<T> tmp;
  if (p.general && kind == ReduceKind::kLogSumExp) {
    // [kept..., reduced...] then row reductions.
    tmp.resize(static_cast<size_t>(p.k1 * p.r));
    PermuteCopy(in, p.merged, p.perm, tmp.data());
    in = tmp.data();
    p.general = false;
  }
  RunReduce<T>(kind, in, p, out);
}

// Reads the reduction axes (input 1 or the `axes` attribute) into per-dim flags.
std::vector<bool> ReducedDims(const KernelContext& ctx, int64_t rank) {
  const Node& node = ctx.node;
  std::vector<int64_t> axes;
  if (ctx.has_input(1)) {
    const Tensor& a = *ctx.inputs[1];
    GAF_CHECK(a.dtype() == DataType::kInt64 || a.dtype() == DataType::kInt32,
              "{}: axes input must be int64, got {}", node.Describe(), DataTypeName(a.dtype()));
    GAF_CHECK(a.rank() <= 1, "{}: axes input must be 1-D, got shape {}", node.Describe(),
              ShapeToString(a.shape()));
    axes = a.ToInt64s();
  } else {
    axes = node.GetInts("axes", {});
  }
  std::vector<bool> red(static_cast<size_t>(rank), false);
  if (axes.empty()) {
    if (node.GetInt("noop_with_empty_axes", 0) == 0) red.assign(static_cast<size_t>(rank), true);
    return red;
  }
  for (int64_t a : axes) {
    int64_t ax = NormalizeAxis(a, rank, node);
    GAF_CHECK(!red[ax], "{}: axis {} appears more than once in axes", node.Describe(), a);
    red[ax] = true;
  }
  return red;
}

void ReduceKernel(KernelContext& ctx, ReduceKind kind) {
  const Tensor& x = ctx.input(0);
  const Node& node = ctx.node;
  const bool keepdims = node.GetInt("keepdims", 1) != 0;
  std::vector<bool> red = ReducedDims(ctx, x.rank());
  Shape out_shape;
  for (int64_t d = 0; d < x.rank(); ++d) {
    if (!red[d]) {
      out_shape.push_back(x.dim(d));
    } else if (keepdims) {
      out_shape.push_back(1);
    }
  }
  if (x.dtype() == DataType::kBool && (kind == ReduceKind::kMax || kind == ReduceKind::kMin)) {
    // bool (opset 20): max = any, min = all; reduce the bytes as uint8.
    Tensor y(DataType::kBool, out_shape);
    ReduceAxes<uint8_t>(kind, static_cast<const uint8_t*>(x.raw()), x.shape(), red,
                        static_cast<uint8_t*>(y.raw()));
    ctx.outputs[0] = std::move(y);
    return;
  }
  DispatchNumeric(x.dtype(), node, [&](auto tag) {
    using T = decltype(tag);
    Tensor y(x.dtype(), out_shape);
    ReduceAxes<T>(kind, x.data<T>(), x.shape(), red, y.data<T>());
    ctx.outputs[0] = std::move(y);
  });
}

// ------------------------------------------------------------------------------------------
// ArgMax / ArgMin
// ------------------------------------------------------------------------------------------

template <class T, bool kIsMax, bool kLast>
int64_t ArgRow(const T* x, int64_t n) {
  const T m = RowReduce<T, kIsMax ? Comb::kMax : Comb::kMin, Pre::kId>(x, n);
  if constexpr (kLast) {
    for (int64_t i = n - 1; i >= 0; --i) {
      if (x[i] == m) return i;
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      if (x[i] == m) return i;
    }
  }
  for (int64_t i = 0; i < n; ++i) {  // only NaNs left: first NaN
    if (x[i] != x[i]) return i;
  }
  return 0;
}

template <class T, bool kIsMax, bool kLast>
void ArgTyped(const T* x, int64_t outer, int64_t n, int64_t inner, int64_t* out) {
  if (inner == 1) {
    ParallelFor(outer, TaskGrain(n), [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) out[o] = ArgRow<T, kIsMax, kLast>(x + o * n, n);
    });
    return;
  }
  ParallelFor(outer, TaskGrain(n * inner), [&](int64_t b, int64_t e) {
    std::vector<T> best(static_cast<size_t>(inner));
    for (int64_t o = b; o < e; ++o) {
      const T* xs = x + o * n * inner;
      int64_t* oi = out + o * inner;
      std::copy(xs, xs + inner, best.begin());
      std::fill(oi, oi + inner, int64_t{0});
      T* bp = best.data();
      for (int64_t j = 1; j < n; ++j) {
        const T* row = xs + j * inner;
#pragma omp simd
        for (int64_t i = 0; i < inner; ++i) {
          const T v = row[i];
          bool better;
          if constexpr (kIsMax) {
            better = kLast ? v >= bp[i] : v > bp[i];
          } else {
            better = kLast ? v <= bp[i] : v < bp[i];
          }
          bp[i] = better ? v : bp[i];
          oi[i] = better ? j : oi[i];
        }
      }
    }
  });
}

template <bool kIsMax>
void ArgKernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Node& node = ctx.node;
  const int64_t rank = std::max<int64_t>(x.rank(), 1);
  const int64_t axis = NormalizeAxis(node.GetInt("axis", 0), rank, node);
  const bool keepdims = node.GetInt("keepdims", 1) != 0;
  const bool last = node.GetInt("select_last_index", 0) != 0;
  Shape xs = x.rank() == 0 ? Shape{1} : x.shape();
  const int64_t n = xs[axis];
  GAF_CHECK(n > 0, "{}: cannot take {} over an empty axis {} of shape {}", node.Describe(),
            kIsMax ? "ArgMax" : "ArgMin", axis, ShapeToString(x.shape()));
  Shape out_shape;
  for (int64_t d = 0; d < x.rank(); ++d) {
    if (d != axis) {
      out_shape.push_back(xs[d]);
    } else if (keepdims) {
      out_shape.push_back(1);
    }
  }
  const int64_t outer = Prod(xs, 0, axis), inner = Prod(xs, axis + 1, rank);
  Tensor y(DataType::kInt64, out_shape);
  DispatchNumeric(x.dtype(), node, [&](auto tag) {
    using T = decltype(tag);
    if (last) {
      ArgTyped<T, kIsMax, true>(x.data<T>(), outer, n, inner, y.data<int64_t>());
    } else {
      ArgTyped<T, kIsMax, false>(x.data<T>(), outer, n, inner, y.data<int64_t>());
    }
  });
  ctx.outputs[0] = std::move(y);
}

// ------------------------------------------------------------------------------------------
// Softmax / LogSoftmax / Hardmax
// ------------------------------------------------------------------------------------------

enum class SoftKind { kSoftmax, kLogSoftmax, kHardmax };

// y = exp(x - m) over a row (y may be x); returns their sum.
template <class T>
inline T ExpSumFromMax(const T* x, T* y, int64_t n, T m) {
  T s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) {
    const T e = ExpT<T>(x[i] - m);
    y[i] = e;
    s += e;
  }
  return s;
}

// Softmax of a row whose maximum m is known: exp(x - m), their sum, then each times 1 / sum.
template <class T>
inline void SoftmaxFromMax(const T* x, T* y, int64_t n, T m) {
  const T inv = T(1) / ExpSumFromMax<T>(x, y, n, m);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] *= inv;
}

template <class T, SoftKind K>
void SoftRow(const T* x, T* y, int64_t n) {
  if constexpr (K == SoftKind::kHardmax) {
    const int64_t idx = ArgRow<T, true, false>(x, n);
    std::fill(y, y + n, T(0));
    y[idx] = T(1);
  } else {
    const T m = RowReduce<T, Comb::kMax, Pre::kId>(x, n);
    if constexpr (K == SoftKind::kSoftmax) {
      SoftmaxFromMax<T>(x, y, n, m);
    } else {
      T s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < n; ++i) s += ExpT<T>(x[i] - m);
      const T off = m + std::log(s);
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] - off;
    }
  }
}

// Softmax over n rows of `cols` columns (row stride ld): one column is one softmax.
template <class T, SoftKind K>
void SoftCols(const T* x, T* y, int64_t n, int64_t ld, int64_t cols, T* m, T* s) {
  if constexpr (K == SoftKind::kHardmax) {
    std::vector<int64_t> idx(static_cast<size_t>(cols), 0);
    for (int64_t i = 0; i < cols; ++i) m[i] = x[i];
    for (int64_t j = 1; j < n; ++j) {
      const T* row = x + j * ld;
      for (int64_t i = 0; i < cols; ++i) {
        if (row[i] > m[i]) {
          m[i] = row[i];
          idx[i] = j;
        }
      }
    }
    for (int64_t j = 0; j < n; ++j) {
      T* yr = y + j * ld;
      for (int64_t i = 0; i < cols; ++i) yr[i] = idx[i] == j ? T(1) : T(0);
    }
  } else {
    ColReduce<T, Comb::kMax, Pre::kId>(x, n, ld, cols, m);
    for (int64_t i = 0; i < cols; ++i) s[i] = 0;
    for (int64_t j = 0; j < n; ++j) {
      const T* xr = x + j * ld;
      T* yr = y + j * ld;
      if constexpr (K == SoftKind::kSoftmax) {
#pragma omp simd
        for (int64_t i = 0; i < cols; ++i) {
          const T e = ExpT<T>(xr[i] - m[i]);
          yr[i] = e;
          s[i] += e;
        }
      } else {
#pragma omp simd
        for (int64_t i = 0; i < cols; ++i) s[i] += ExpT<T>(xr[i] - m[i]);
      }
    }
    if constexpr (K == SoftKind::kSoftmax) {
      for (int64_t i = 0; i < cols; ++i) s[i] = T(1) / s[i];
    } else {
      for (int64_t i = 0; i < cols; ++i) s[i] = m[i] + std::log(s[i]);
    }
    for (int64_t j = 0; j < n; ++j) {
      const T* xr = x + j * ld;
      T* yr = y + j * ld;
      if constexpr (K == SoftKind::kSoftmax) {
#pragma omp simd
        for (int64_t i = 0; i < cols; ++i) yr[i] *= s[i];
      } else {
#pragma omp simd
        for (int64_t i = 0; i < cols; ++i) yr[i] = xr[i] - s[i];
      }
    }
  }
}

template <class T, SoftKind K>
void SoftTyped(const T* x, T* y, int64_t outer, int64_t n, int64_t inner) {
  if (n == 0 || outer == 0 || inner == 0) return;
  if (inner == 1) {
    ParallelFor(outer, TaskGrain(3 * n), [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) SoftRow<T, K>(x + o * n, y + o * n, n);
    });
    return;
  }
  const int64_t nblk = (inner + kColBlock - 1) / kColBlock;
  ParallelFor(outer * nblk, TaskGrain(3 * n * std::min(inner, kColBlock)),
              [&](int64_t b, int64_t e) {
                std::vector<T> m(static_cast<size_t>(kColBlock)), s(static_cast<size_t>(kColBlock));
                for (int64_t t = b; t < e; ++t) {
                  const int64_t o = t / nblk, c0 = (t % nblk) * kColBlock;
                  const int64_t c1 = std::min(inner, c0 + kColBlock);
                  const int64_t off = o * n * inner + c0;
                  SoftCols<T, K>(x + off, y + off, n, inner, c1 - c0, m.data(), s.data());
                }
              });
}

template <SoftKind K>
void SoftKernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Node& node = ctx.node;
  const int64_t rank = x.rank();
  int64_t outer, n, inner;
  if (rank == 0) {
    outer = n = inner = 1;
  } else if (ctx.opset < 13) {
    // Input coerced to 2-D [prod(dims[:axis]), prod(dims[axis:])].
    const int64_t axis = NormalizeAxis(node.GetInt("axis", 1), rank, node);
    outer = Prod(x.shape(), 0, axis);
    n = Prod(x.shape(), axis, rank);
    inner = 1;
  } else {
    const int64_t axis = NormalizeAxis(node.GetInt("axis", -1), rank, node);
    outer = Prod(x.shape(), 0, axis);
    n = x.dim(axis);
    inner = Prod(x.shape(), axis + 1, rank);
  }
  DispatchFloat(x.dtype(), node, [&](auto tag) {
    using T = decltype(tag);
    Tensor y(x.dtype(), x.shape());
    SoftTyped<T, K>(x.data<T>(), y.data<T>(), outer, n, inner);
    ctx.outputs[0] = std::move(y);
  });
}

// ------------------------------------------------------------------------------------------
// Normalizations
// ------------------------------------------------------------------------------------------

// Values of `t` converted to T.
template <class T>
std::vector<T> ValuesAs(const Tensor& t) {
  std::vector<T> v(static_cast<size_t>(t.numel()));
  if (t.dtype() == DataTypeOf<T>()) {
    std::copy(t.data<T>(), t.data<T>() + t.numel(), v.begin());
  } else {
    std::vector<double> d = t.ToDoubles();
    for (size_t i = 0; i < d.size(); ++i) v[i] = static_cast<T>(d[i]);
  }
  return v;
}

// `t` broadcast (unidirectionally) to `target`, as a dense vector.
template <class T>
std::vector<T> ExpandTo(const Tensor& t, const Shape& target, const Node& node, const char* what) {
  Shape s = t.shape();
  while (s.size() > target.size() && s.front() == 1) s.erase(s.begin());
  bool ok = s.size() <= target.size();
  for (size_t i = 0; ok && i < s.size(); ++i) {
    const int64_t td = target[target.size() - s.size() + i];
    ok = s[i] == td || s[i] == 1;
  }
  GAF_CHECK(ok, "{}: {} of shape {} does not broadcast to {}", node.Describe(), what,
            ShapeToString(t.shape()), ShapeToString(target));
  std::vector<T> src = ValuesAs<T>(t);
  const int64_t total = NumElements(target);
  if (static_cast<int64_t>(src.size()) == total) return src;
  std::vector<T> out(static_cast<size_t>(total));
  std::vector<int64_t> bs = BroadcastStrides(s, target);
  const int64_t rank = static_cast<int64_t>(target.size());
  std::vector<int64_t> coord(rank, 0);
  int64_t off = 0;
  for (int64_t i = 0; i < total; ++i) {
    out[i] = src[off];
    for (int64_t d = rank - 1; d >= 0; --d) {
      off += bs[d];
      if (++coord[d] < target[d]) break;
      off -= bs[d] * target[d];
      coord[d] = 0;
    }
  }
  return out;
}

// Mean and variance (two-pass) of a contiguous row.
template <class T>
void MeanVar(const T* x, int64_t n, T* mean, T* var) {
  const T m = RowReduce<T, Comb::kSum, Pre::kId>(x, n) / static_cast<T>(n);
  T v = 0;
#pragma omp simd reduction(+ : v)
  for (int64_t i = 0; i < n; ++i) v += (x[i] - m) * (x[i] - m);
  *mean = m;
  *var = v / static_cast<T>(n);
}

void LayerNormKernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& scale = ctx.input(1);
  const Node& node = ctx.node;
  const int64_t rank = x.rank();
  GAF_CHECK(rank >= 1, "{}: input must have rank >= 1", node.Describe());
  const int64_t axis = NormalizeAxis(node.GetInt("axis", -1), rank, node);
  const float eps = node.GetFloat("epsilon", 1e-5f);
  const int64_t rows = Prod(x.shape(), 0, axis), d = Prod(x.shape(), axis, rank);
  const Shape norm_shape(x.shape().begin() + axis, x.shape().end());
  Shape stat_shape(x.shape().begin(), x.shape().begin() + axis);
  stat_shape.resize(static_cast<size_t>(rank), 1);
  DispatchFloat(x.dtype(), node, [&](auto tag) {
    using T = decltype(tag);
    std::vector<T> sc = ExpandTo<T>(scale, norm_shape, node, "Scale");
    std::vector<T> bi;
    if (ctx.has_input(2)) bi = ExpandTo<T>(*ctx.inputs[2], norm_shape, node, "B");
    Tensor y(x.dtype(), x.shape());
    Tensor mean_t, inv_t;
    T* mp = nullptr;
    T* ip = nullptr;
    if (ctx.has_output(1)) {
      mean_t = Tensor(x.dtype(), stat_shape);
      mp = mean_t.data<T>();
    }
    if (ctx.has_output(2)) {
      inv_t = Tensor(x.dtype(), stat_shape);
      ip = inv_t.data<T>();
    }
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
    const T* s = sc.data();
    const T* bb = bi.empty() ? nullptr : bi.data();
    if (d > 0) {
      ParallelFor(rows, TaskGrain(3 * d), [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
          const T* xr = xp + r * d;
          T* yr = yp + r * d;
          T m, v;
          MeanVar(xr, d, &m, &v);
          const T inv = T(1) / std::sqrt(v + static_cast<T>(eps));
          if (mp) mp[r] = m;
          if (ip) ip[r] = inv;
          if (bb) {
#pragma omp simd
            for (int64_t i = 0; i < d; ++i) yr[i] = (xr[i] - m) * inv * s[i] + bb[i];
          } else {
#pragma omp simd
            for (int64_t i = 0; i < d; ++i) yr[i] = (xr[i] - m) * inv * s[i];
          }
        }
      });
    }
    ctx.outputs[0] = std::move(y);
    if (ctx.has_output(1)) ctx.outputs[1] = std::move(mean_t);
    if (ctx.has_output(2)) ctx.outputs[2] = std::move(inv_t);
  });
}

// Applies y = x * a[c] + b[c] over [n, c, s] (or per element of [c*s] when per_elem).
template <class T>
void ChannelAffine(const T* x, T* y, int64_t n, int64_t c, int64_t s, const std::vector<T>& a,
                   const std::vector<T>& b, bool per_elem) {
  ParallelFor(n * c, TaskGrain(s), [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t ch = t % c;
      const T* xr = x + t * s;
      T* yr = y + t * s;
      if (per_elem) {
        const T* ar = a.data() + ch * s;
        const T* br = b.data() + ch * s;
#pragma omp simd
        for (int64_t i = 0; i < s; ++i) yr[i] = xr[i] * ar[i] + br[i];
      } else {
        const T av = a[ch], bv = b[ch];
#pragma omp simd
        for (int64_t i = 0; i < s; ++i) yr[i] = xr[i] * av + bv;
      }
    }
  });
}

// Inference-mode BatchNormalization: y = (x - mean) / sqrt(var + eps) * scale + B per channel.
void BatchNormKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  if (ctx.opset >= 14) {
    if (node.GetInt("training_mode", 0) != 0) {
      GAF_UNSUPPORTED("{}: training_mode=1 is not supported", node.Describe());
    }
  }
  for (size_t i = 1; i < ctx.num_outputs(); ++i) {
    if (ctx.has_output(i)) {
      GAF_UNSUPPORTED("{}: training outputs (running/saved mean and variance) are not supported",
                      node.Describe());
    }
  }
  if (ctx.opset < 7 && node.GetInt("is_test", 0) == 0 && node.HasAttr("is_test")) {
    GAF_UNSUPPORTED("{}: is_test=0 (training) is not supported", node.Describe());
  }
  GAF_CHECK(x.rank() >= 2, "{}: input must have rank >= 2 (N x C x ...), got shape {}",
            node.Describe(), ShapeToString(x.shape()));
  const float eps = node.GetFloat("epsilon", 1e-5f);
  const int64_t n = x.dim(0), c = x.dim(1), s = Prod(x.shape(), 2, x.rank());
  const bool per_elem = ctx.opset < 9 && node.GetInt("spatial", 1) == 0;
  const int64_t pc = per_elem ? c * s : c;
  const char* names[4] = {"scale", "B", "input_mean", "input_var"};
  for (int i = 1; i <= 4; ++i) {
    const Tensor& t = ctx.input(i);
    GAF_CHECK(t.numel() == pc, "{}: {} has {} elements, expected {}", node.Describe(), names[i - 1],
              t.numel(), pc);
  }
  DispatchFloat(x.dtype(), node, [&](auto tag) {
    using T = decltype(tag);
    std::vector<double> sc = ctx.input(1).ToDoubles(), bi = ctx.input(2).ToDoubles(),
                        mu = ctx.input(3).ToDoubles(), va = ctx.input(4).ToDoubles();
    std::vector<T> a(static_cast<size_t>(pc)), b(static_cast<size_t>(pc));
    for (int64_t i = 0; i < pc; ++i) {
      const double ai = sc[i] / std::sqrt(va[i] + static_cast<double>(eps));
      a[i] = static_cast<T>(ai);
      b[i] = static_cast<T>(bi[i] - mu[i] * ai);
    }
    Tensor y(x.dtype(), x.shape());
    ChannelAffine<T>(x.data<T>(), y.data<T>(), n, c, s, a, b, per_elem);
    ctx.outputs[0] = std::move(y);
  });
}

// Normalizes contiguous groups of `gsize` elements of x ([count groups]); group g of batch item
// uses channel parameters: y = (x - mean) * inv * scale[ch] + bias[ch] with ch_per_group
// channels of `s` elements per group.
template <class T>
void GroupNormTyped(const T* x, T* y, int64_t count, int64_t ch_per_group, int64_t s,
                    int64_t groups_per_item, const std::vector<T>& scale,
                    const std::vector<T>& bias, double eps) {
  const int64_t gsize = ch_per_group * s;
  if (gsize == 0) return;
  ParallelFor(count, TaskGrain(3 * gsize), [&](int64_t lo, int64_t hi) {
    for (int64_t g = lo; g < hi; ++g) {
      const T* xg = x + g * gsize;
      T* yg = y + g * gsize;
      T m, v;
      MeanVar(xg, gsize, &m, &v);
      const T inv = static_cast<T>(1.0 / std::sqrt(static_cast<double>(v) + eps));
      const int64_t c0 = (g % groups_per_item) * ch_per_group;
      for (int64_t k = 0; k < ch_per_group; ++k) {
        const T a = inv * scale[c0 + k];
        const T b = bias[c0 + k] - m * a;
        const T* xr = xg + k * s;
        T* yr = yg + k * s;
#pragma omp simd
        for (int64_t i = 0; i < s; ++i) yr[i] = xr[i] * a + b;
      }
    }
  });
}

void InstanceNormKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  GAF_CHECK(x.rank() >= 2, "{}: input must have rank >= 2 (N x C x ...), got shape {}",
            node.Describe(), ShapeToString(x.shape()));
  const double eps = node.GetFloat("epsilon", 1e-5f);
  const int64_t n = x.dim(0), c = x.dim(1), s = Prod(x.shape(), 2, x.rank());
  GAF_CHECK(ctx.input(1).numel() == c && ctx.input(2).numel() == c,
            "{}: scale and B must have C={} elements, got {} and {}", node.Describe(), c,
            ctx.input(1).numel(), ctx.input(2).numel());
  DispatchFloat(x.dtype(), node, [&](auto tag) {
    using T = decltype(tag);
    std::vector<T> sc = ValuesAs<T>(ctx.input(1)), bi = ValuesAs<T>(ctx.input(2));
    Tensor y(x.dtype(), x.shape());
    GroupNormTyped<T>(x.data<T>(), y.data<T>(), n * c, 1, s, c, sc, bi, eps);
    ctx.outputs[0] = std::move(y);
  });
}

// GroupNormalization: opset 18 has per-group scale/bias ([num_groups]); opset 21 per-channel ([C]).
void GroupNormKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  GAF_CHECK(x.rank() >= 2, "{}: input must have rank >= 2 (N x C x ...), got shape {}",
            node.Describe(), ShapeToString(x.shape()));
  GAF_CHECK(node.HasAttr("num_groups"), "{}: missing required attribute num_groups",
            node.Describe());
  const int64_t g = node.GetInt("num_groups", 1);
  const double eps = node.GetFloat("epsilon", 1e-5f);
  const int64_t n = x.dim(0), c = x.dim(1), s = Prod(x.shape(), 2, x.rank());
  GAF_CHECK(g > 0 && c % g == 0, "{}: channels {} not divisible by num_groups {}", node.Describe(),
            c, g);
  const Tensor& st = ctx.input(1);
  const Tensor& bt = ctx.input(2);
  GAF_CHECK(st.numel() == bt.numel(), "{}: scale and bias sizes differ ({} vs {})",
            node.Describe(), st.numel(), bt.numel());
  bool per_channel;
  if (st.numel() == c && (ctx.opset >= 21 || st.numel() != g)) {
    per_channel = true;
  } else {
    GAF_CHECK(st.numel() == g, "{}: scale has {} elements, expected {} (channels) or {} (groups)",
              node.Describe(), st.numel(), c, g);
    per_channel = false;
  }
  DispatchFloat(x.dtype(), node, [&](auto tag) {
    using T = decltype(tag);
    std::vector<T> sv = ValuesAs<T>(st), bv = ValuesAs<T>(bt);
    std::vector<T> sc(static_cast<size_t>(c)), bi(static_cast<size_t>(c));
    for (int64_t k = 0; k < c; ++k) {
      const int64_t src = per_channel ? k : k / (c / g);
      sc[k] = sv[src];
      bi[k] = bv[src];
    }
    Tensor y(x.dtype(), x.shape());
    GroupNormTyped<T>(x.data<T>(), y.data<T>(), n * g, c / g, s, g, sc, bi, eps);
    ctx.outputs[0] = std::move(y);
  });
}

void LpNormKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  const int64_t rank = std::max<int64_t>(x.rank(), 1);
  const int64_t axis = NormalizeAxis(node.GetInt("axis", -1), rank, node);
  const int64_t p = node.GetInt("p", 2);
  if (p != 1 && p != 2) GAF_UNSUPPORTED("{}: p={} is not supported (only 1 and 2)", node.Describe(), p);
  const Shape xs = x.rank() == 0 ? Shape{1} : x.shape();
  const int64_t outer = Prod(xs, 0, axis), n = xs[axis], inner = Prod(xs, axis + 1, rank);
  DispatchFloat(x.dtype(), node, [&](auto tag) {
    using T = decltype(tag);
    Tensor y(x.dtype(), x.shape());
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
    auto inv_of = [p](T acc) { return acc == T(0) ? T(0) : T(1) / (p == 2 ? std::sqrt(acc) : acc); };
    if (inner == 1) {
      ParallelFor(outer, TaskGrain(2 * n), [&](int64_t b, int64_t e) {
        for (int64_t o = b; o < e; ++o) {
          const T* xr = xp + o * n;
          T* yr = yp + o * n;
          const T acc = p == 2 ? RowReduce<T, Comb::kSum, Pre::kSquare>(xr, n)
                               : RowReduce<T, Comb::kSum, Pre::kAbs>(xr, n);
          const T inv = inv_of(acc);
#pragma omp simd
          for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * inv;
        }
      });
    } else {
      ParallelFor(outer, TaskGrain(2 * n * inner), [&](int64_t b, int64_t e) {
        std::vector<T> acc(static_cast<size_t>(inner));
        for (int64_t o = b; o < e; ++o) {
          const T* xs0 = xp + o * n * inner;
          T* ys0 = yp + o * n * inner;
          if (p == 2) {
            ColReduce<T, Comb::kSum, Pre::kSquare>(xs0, n, inner, inner, acc.data());
          } else {
            ColReduce<T, Comb::kSum, Pre::kAbs>(xs0, n, inner, inner, acc.data());
          }
          for (int64_t i = 0; i < inner; ++i) acc[i] = inv_of(acc[i]);
          for (int64_t j = 0; j < n; ++j) {
            const T* xr = xs0 + j * inner;
            T* yr = ys0 + j * inner;
            const T* a = acc.data();
#pragma omp simd
            for (int64_t i = 0; i < inner; ++i) yr[i] = xr[i] * a[i];
          }
        }
      });
    }
    ctx.outputs[0] = std::move(y);
  });
}

// MeanVarianceNormalization: y = (x - E[x]) / (sqrt(E[x^2] - E[x]^2) + 1e-9) over `axes`
// (the ONNX function body's formula).
void MvnKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  const int64_t rank = x.rank();
  std::vector<int64_t> axes = node.GetInts("axes", {0, 2, 3});
  std::vector<bool> red(static_cast<size_t>(rank), false);
  for (int64_t a : axes) {
    const int64_t ax = NormalizeAxis(a, rank, node);
    GAF_CHECK(!red[ax], "{}: axis {} appears more than once in axes", node.Describe(), a);
    red[ax] = true;
  }
  Shape stat_shape = x.shape();
  for (int64_t d = 0; d < rank; ++d) {
    if (red[d]) stat_shape[d] = 1;
  }
  DispatchFloat(x.dtype(), node, [&](auto tag) {
    using T = decltype(tag);
    const int64_t ns = NumElements(stat_shape);
    std::vector<T> mean(static_cast<size_t>(ns)), sq(static_cast<size_t>(ns));
    const T* xp = x.data<T>();
    ReduceAxes<T>(ReduceKind::kMean, xp, x.shape(), red, mean.data());
    ReduceTyped<T, Comb::kSum, Pre::kSquare, Post::kMean>(xp, MakeReducePlan(x.shape(), red),
                                                          sq.data());
    // mean <- shift, sq <- 1 / (std + eps)
    for (int64_t i = 0; i < ns; ++i) {
      const T var = std::max(sq[i] - mean[i] * mean[i], T(0));
      sq[i] = T(1) / (std::sqrt(var) + static_cast<T>(1e-9));
    }
    Tensor y(x.dtype(), x.shape());
    T* yp = y.data<T>();
    const int64_t total = x.numel();
    if (total > 0) {
      const std::vector<int64_t> bs = BroadcastStrides(stat_shape, x.shape());
      const int64_t inner = x.dim(rank - 1), istride = bs[rank - 1];
      std::vector<int64_t> coord(rank, 0);
      int64_t off = 0;
      for (int64_t r = 0; r < total / inner; ++r) {
        const T* xr = xp + r * inner;
        T* yr = yp + r * inner;
        for (int64_t i = 0; i < inner; ++i) {
          const int64_t k = off + i * istride;
          yr[i] = (xr[i] - mean[k]) * sq[k];
        }
        for (int64_t d = rank - 2; d >= 0; --d) {
          off += bs[d];
          if (++coord[d] < x.dim(d)) break;
          off -= bs[d] * x.dim(d);
          coord[d] = 0;
        }
      }
    }
    ctx.outputs[0] = std::move(y);
  });
}

// LRN: y = x / (bias + alpha / size * sum of x^2 over the channel window)^beta.
void LrnKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  GAF_CHECK(node.HasAttr("size"), "{}: missing required attribute size", node.Describe());
  const int64_t size = node.GetInt("size", 1);
  GAF_CHECK(size > 0, "{}: size must be positive, got {}", node.Describe(), size);
  GAF_CHECK(x.rank() >= 2, "{}: input must have rank >= 2 (N x C x ...), got shape {}",
            node.Describe(), ShapeToString(x.shape()));
  const double alpha = node.GetFloat("alpha", 1e-4f), beta = node.GetFloat("beta", 0.75f),
               bias = node.GetFloat("bias", 1.0f);
  const int64_t n = x.dim(0), c = x.dim(1), s = Prod(x.shape(), 2, x.rank());
  const int64_t lo = (size - 1) / 2, hi = size - 1 - lo;
  DispatchFloat(x.dtype(), node, [&](auto tag) {
    using T = decltype(tag);
    Tensor y(x.dtype(), x.shape());
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
    const T k = static_cast<T>(alpha / static_cast<double>(size));
    const T tb = static_cast<T>(bias), nb = static_cast<T>(-beta);
    ParallelFor(n * c, TaskGrain(s * size), [&](int64_t b, int64_t e) {
      std::vector<T> acc(static_cast<size_t>(s));
      for (int64_t t = b; t < e; ++t) {
        const int64_t ni = t / c, ch = t % c;
        const int64_t c0 = std::max<int64_t>(0, ch - lo), c1 = std::min<int64_t>(c - 1, ch + hi);
        std::fill(acc.begin(), acc.end(), T(0));
        T* a = acc.data();
        for (int64_t cc = c0; cc <= c1; ++cc) {
          const T* xr = xp + (ni * c + cc) * s;
#pragma omp simd
          for (int64_t i = 0; i < s; ++i) a[i] += xr[i] * xr[i];
        }
        const T* xr = xp + t * s;
        T* yr = yp + t * s;
        for (int64_t i = 0; i < s; ++i) yr[i] = xr[i] * std::pow(tb + k * a[i], nb);
      }
    });
    ctx.outputs[0] = std::move(y);
  });
}

// ------------------------------------------------------------------------------------------
// CumSum
// ------------------------------------------------------------------------------------------

template <class T>
void CumSumTyped(const T* x, T* y, int64_t outer, int64_t n, int64_t inner, bool exclusive,
                 bool reverse) {
  ParallelFor(outer, TaskGrain(n * inner), [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o) {
      const T* xs = x + o * n * inner;
      T* ys = y + o * n * inner;
      for (int64_t step = 0; step < n; ++step) {
        const int64_t j = reverse ? n - 1 - step : step;
        const int64_t prev = reverse ? j + 1 : j - 1;
        T* yr = ys + j * inner;
        if (step == 0) {
          if (exclusive) {
            std::fill(yr, yr + inner, T(0));
          } else {
            std::copy(xs + j * inner, xs + (j + 1) * inner, yr);
          }
          continue;
        }
        const T* yp = ys + prev * inner;
        const T* xr = xs + (exclusive ? prev : j) * inner;
#pragma omp simd
        for (int64_t i = 0; i < inner; ++i) yr[i] = static_cast<T>(yp[i] + xr[i]);
      }
    }
  });
}

void CumSumKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  const Tensor& axis_t = ctx.input(1);
  GAF_CHECK(axis_t.numel() == 1, "{}: axis must be a scalar, got shape {}", node.Describe(),
            ShapeToString(axis_t.shape()));
  GAF_CHECK(x.rank() >= 1, "{}: input must have rank >= 1", node.Describe());
  const int64_t axis = NormalizeAxis(axis_t.ScalarAsInt64(), x.rank(), node);
  const bool exclusive = node.GetInt("exclusive", 0) != 0;
  const bool reverse = node.GetInt("reverse", 0) != 0;
  const int64_t outer = Prod(x.shape(), 0, axis), n = x.dim(axis),
                inner = Prod(x.shape(), axis + 1, x.rank());
  DispatchNumeric(x.dtype(), node, [&](auto tag) {
    using T = decltype(tag);
    Tensor y(x.dtype(), x.shape());
    if (inner > 0) CumSumTyped<T>(x.data<T>(), y.data<T>(), outer, n, inner, exclusive, reverse);
    ctx.outputs[0] = std::move(y);
  });
}

// ------------------------------------------------------------------------------------------
// TopK
// ------------------------------------------------------------------------------------------

// Strict orders with NaN treated as the largest value; ties broken by the lower index.
template <class T>
inline bool Greater(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a)) return !std::isnan(b);
    if (std::isnan(b)) return false;
  }
  return a > b;
}

template <class T>
void TopKTyped(const T* x, T* vals, int64_t* idxs, int64_t outer, int64_t n, int64_t inner,
               int64_t k, bool largest) {
  using Item = std::pair<T, int64_t>;
  auto before_largest = [](const Item& p, const Item& q) {
    if (Greater(p.first, q.first)) return true;
    if (Greater(q.first, p.first)) return false;
    return p.second < q.second;
  };
  auto before_smallest = [](const Item& p, const Item& q) {
    if (Greater(q.first, p.first)) return true;
    if (Greater(p.first, q.first)) return false;
    return p.second < q.second;
  };
  ParallelFor(outer * inner, TaskGrain(n * 4), [&](int64_t b, int64_t e) {
    std::vector<Item> items(static_cast<size_t>(n));
    for (int64_t t = b; t < e; ++t) {
      const int64_t o = t / inner, i = t % inner;
      const T* xs = x + o * n * inner + i;
      for (int64_t j = 0; j < n; ++j) items[j] = {xs[j * inner], j};
      auto mid = items.begin() + k;
      if (largest) {
        std::partial_sort(items.begin(), mid, items.end(), before_largest);
      } else {
        std::partial_sort(items.begin(), mid, items.end(), before_smallest);
      }
      T* vo = vals + o * k * inner + i;
      int64_t* io = idxs + o * k * inner + i;
      for (int64_t j = 0; j < k; ++j) {
        vo[j * inner] = items[j].first;
        io[j * inner] = items[j].second;
      }
    }
  });
}

void TopKKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  GAF_CHECK(x.rank() >= 1, "{}: input must have rank >= 1", node.Describe());
  const int64_t axis = NormalizeAxis(node.GetInt("axis", -1), x.rank(), node);
  int64_t k;
  if (ctx.opset < 10 && !ctx.has_input(1)) {
    GAF_CHECK(node.HasAttr("k"), "{}: missing attribute k", node.Describe());
    k = node.GetInt("k", 0);
  } else {
    const Tensor& kt = ctx.input(1);
    GAF_CHECK(kt.numel() == 1, "{}: K must have exactly one element, got shape {}",
              node.Describe(), ShapeToString(kt.shape()));
    k = kt.ScalarAsInt64();
  }
  const bool largest = node.GetInt("largest", 1) != 0;
  const int64_t n = x.dim(axis);
  GAF_CHECK(k >= 0 && k <= n, "{}: k={} out of range for axis {} of size {}", node.Describe(), k,
            axis, n);
  const int64_t outer = Prod(x.shape(), 0, axis), inner = Prod(x.shape(), axis + 1, x.rank());
  Shape out_shape = x.shape();
  out_shape[axis] = k;
  DispatchNumeric(x.dtype(), node, [&](auto tag) {
    using T = decltype(tag);
    Tensor vals(x.dtype(), out_shape);
    Tensor idxs(DataType::kInt64, out_shape);
    if (k > 0) {
      TopKTyped<T>(x.data<T>(), vals.data<T>(), idxs.data<int64_t>(), outer, n, inner, k, largest);
    }
    ctx.outputs[0] = std::move(vals);
    if (ctx.num_outputs() > 1) ctx.outputs[1] = std::move(idxs);
  });
}

void Reg(OpRegistry& r, const char* op, OpKind kind, KernelFn fn) {
  r.Register({"", op, kind, std::move(fn), /*upcast_half=*/true});
}

}  // namespace

void SoftmaxRowF32(const float* x, float* y, int64_t n) { SoftRow<float, SoftKind::kSoftmax>(x, y, n); }

void SoftmaxRowWithMaxF32(const float* x, float* y, int64_t n, float max) { SoftmaxFromMax<float>(x, y, n, max); }

float ExpRowF32(const float* x, float* y, int64_t n, float* max) {
  const float m = RowReduce<float, Comb::kMax, Pre::kId>(x, n);
  *max = m;
  if (m == -std::numeric_limits<float>::infinity()) {  // every value -inf: no weight at all
    std::fill(y, y + n, 0.f);
    return 0.f;
  }
  return ExpSumFromMax<float>(x, y, n, m);
}

bool MeanRowF32(const float* x, int64_t n, float* mean) {
  // ReduceTyped splits rows of at least 4 * kGrain across threads when there are few of them.
  if (n <= 0 || n >= 4 * kGrain) return false;
  *mean = Finalize<float, Post::kMean>(RowReduce<float, Comb::kSum, Pre::kId>(x, n), n);
  return true;
}

bool MeanSquareRowF32(const float* x, int64_t n, float* sq, float* mean) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) sq[i] = x[i] * x[i];
  return MeanRowF32(sq, n, mean);
}

void RegisterReduceKernels(OpRegistry& r) {
  const struct {
    const char* name;
    ReduceKind kind;
  } reduces[] = {
      {"ReduceSum", ReduceKind::kSum},       {"ReduceMean", ReduceKind::kMean},
      {"ReduceMax", ReduceKind::kMax},       {"ReduceMin", ReduceKind::kMin},
      {"ReduceProd", ReduceKind::kProd},     {"ReduceL1", ReduceKind::kL1},
      {"ReduceL2", ReduceKind::kL2},         {"ReduceLogSum", ReduceKind::kLogSum},
      {"ReduceLogSumExp", ReduceKind::kLogSumExp}, {"ReduceSumSquare", ReduceKind::kSumSquare},
  };
  for (const auto& rd : reduces) {
    const ReduceKind kind = rd.kind;
    Reg(r, rd.name, OpKind::kReduction, [kind](KernelContext& ctx) { ReduceKernel(ctx, kind); });
  }
  Reg(r, "ArgMax", OpKind::kReduction, ArgKernel<true>);
  Reg(r, "ArgMin", OpKind::kReduction, ArgKernel<false>);
  Reg(r, "Softmax", OpKind::kReduction, SoftKernel<SoftKind::kSoftmax>);
  Reg(r, "LogSoftmax", OpKind::kReduction, SoftKernel<SoftKind::kLogSoftmax>);
  Reg(r, "Hardmax", OpKind::kReduction, SoftKernel<SoftKind::kHardmax>);
  Reg(r, "LayerNormalization", OpKind::kReduction, LayerNormKernel);
  Reg(r, "BatchNormalization", OpKind::kReduction, BatchNormKernel);
  Reg(r, "InstanceNormalization", OpKind::kReduction, InstanceNormKernel);
  Reg(r, "GroupNormalization", OpKind::kReduction, GroupNormKernel);
  Reg(r, "LpNormalization", OpKind::kReduction, LpNormKernel);
  Reg(r, "MeanVarianceNormalization", OpKind::kReduction, MvnKernel);
  Reg(r, "LRN", OpKind::kReduction, LrnKernel);
  Reg(r, "CumSum", OpKind::kReduction, CumSumKernel);
  Reg(r, "TopK", OpKind::kOpaque, TopKKernel);
}

}  // namespace gaf
