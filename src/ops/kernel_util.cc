#include "ops/kernel_util.h"

#include <algorithm>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#elif defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace gaf {

void CopyBytes(void* dst_v, const void* src_v, int64_t n) {
  auto* dst = static_cast<uint8_t*>(dst_v);
  const auto* src = static_cast<const uint8_t*>(src_v);
#if defined(__AVX512F__) || defined(__SSE2__)
  if (n >= kStreamingCopyMin) {
    const int64_t head = std::min<int64_t>(n, (64 - reinterpret_cast<uintptr_t>(dst) % 64) % 64);
    std::memcpy(dst, src, head);
    int64_t i = head;
    for (; i + 64 <= n; i += 64) {
#if defined(__AVX512F__)
      _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i), _mm512_loadu_si512(src + i));
#else
      for (int u = 0; u < 4; ++u) {
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16 * u));
        _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16 * u), v);
      }
#endif
    }
    std::memcpy(dst + i, src + i, n - i);
    _mm_sfence();
    return;
  }
#endif
  if (n > 0) std::memcpy(dst, src, n);
}

Tensor ShapeSlice(const Shape& shape, const Node& node) {
  const int64_t r = static_cast<int64_t>(shape.size());
  int64_t s = node.GetInt("start", 0), e = node.GetInt("end", r);
  if (s < 0) s += r;
  if (e < 0) e += r;
  s = std::clamp<int64_t>(s, 0, r);
  e = std::clamp<int64_t>(e, 0, r);
  std::vector<int64_t> v;
  for (int64_t i = s; i < e; ++i) v.push_back(shape[i]);
  return Tensor::FromInt64s(v);
}

int64_t NormalizeAxis(int64_t axis, int64_t rank, const Node& node) {
  GAF_CHECK(axis >= -rank && axis < std::max<int64_t>(rank, 1), "{}: axis {} is out of range for rank {}",
            node.Describe(), axis, rank);
  return axis < 0 ? axis + rank : axis;
}

Shape BroadcastShapes(const Shape& a, const Shape& b, const Node& node) {
  size_t r = std::max(a.size(), b.size());
  Shape out(r);
  for (size_t i = 0; i < r; ++i) {
    int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    GAF_CHECK(da == db || da == 1 || db == 1, "{}: shapes {} and {} cannot be broadcast together", node.Describe(),
              ShapeToString(a), ShapeToString(b));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Shape BroadcastShapes(const std::vector<const Tensor*>& ins, const Node& node) {
  Shape out;
  bool first = true;
  for (const Tensor* t : ins) {
    if (t == nullptr) continue;
    out = first ? t->shape() : BroadcastShapes(out, t->shape(), node);
    first = false;
  }
  return out;
}

std::vector<int64_t> Strides(const Shape& shape) {
  std::vector<int64_t> s(shape.size());
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    s[i] = acc;
    acc = CheckedMul(acc, shape[i], "stride");
  }
  return s;
}

std::vector<int64_t> BroadcastStrides(const Shape& in_shape, const Shape& out_shape) {
  std::vector<int64_t> in_strides = Strides(in_shape);
  std::vector<int64_t> s(out_shape.size(), 0);
  size_t off = out_shape.size() - in_shape.size();
  for (size_t i = 0; i < in_shape.size(); ++i) s[off + i] = in_shape[i] == 1 ? 0 : in_strides[i];
  return s;
}

const Tensor& KernelContext::input(size_t i) const {
  GAF_CHECK(has_input(i), "{}: required input {} is missing", node.Describe(), i);
  return *inputs[i];
}

const char* OpKindName(OpKind k) {
  switch (k) {
    case OpKind::kElementwise: return "elementwise";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kInjective: return "injective";
    case OpKind::kReduction: return "reduction";
    case OpKind::kContraction: return "contraction";
    case OpKind::kOpaque: return "opaque";
  }
  return "?";
}

bool ConstantClipBounds(const Node& n, const std::function<const Tensor*(const std::string&)>& constant, float* lo,
                        float* hi) {
  *lo = -3.402823e38f;
  *hi = 3.402823e38f;
  if (n.HasAttr("min") || n.HasAttr("max")) {
    *lo = n.GetFloat("min", *lo);
    *hi = n.GetFloat("max", *hi);
  }
  for (size_t i = 1; i < n.inputs.size() && i < 3; ++i) {
    if (n.inputs[i].empty()) continue;
    const Tensor* t = constant(n.inputs[i]);
    if (t == nullptr || t->numel() != 1 || t->dtype() != DataType::kFloat) return false;
    (i == 1 ? *lo : *hi) = static_cast<float>(t->ScalarAsDouble());
  }
  return true;
}

Shape ResolveReshape(const Shape& in, const std::vector<int64_t>& shape) {
  Shape out(shape.begin(), shape.end());
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == 0) {
      if (i >= in.size()) return {};
      out[i] = in[i];
    }
    if (out[i] == -1) {
      if (infer >= 0) return {};
      infer = static_cast<int64_t>(i);
      continue;
    }
    if (out[i] < 0 || __builtin_mul_overflow(known, out[i], &known)) return {};  // a file's shape: checked
  }
  const int64_t n = NumElements(in);
  if (infer >= 0) {
    if (known == 0 || n % known != 0) return {};
    out[infer] = n / known;
  }
  return NumElements(out) == n ? out : Shape{};
}

void RunPlanFallback(KernelContext& ctx) {
  const Graph* g = ctx.node.GetGraph("fallback");
  GAF_CHECK(g != nullptr && ctx.subgraphs != nullptr, "{}: no fallback graph", ctx.node.Describe());
  std::vector<Tensor> ins;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) ins.push_back(ctx.has_input(i) ? *ctx.inputs[i] : Tensor());
  std::vector<Tensor> out = ctx.subgraphs->RunSubgraph(*g, ins);
  GAF_CHECK(out.size() == ctx.num_outputs(), "{}: fallback graph gave {} outputs", ctx.node.Describe(), out.size());
  for (size_t i = 0; i < out.size(); ++i) ctx.outputs[i] = std::move(out[i]);
}

}  // namespace gaf
