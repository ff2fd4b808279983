// (De)quantization: QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "ops/kernel_util.h"
#include "ops/loss_quant_internal.h"

namespace gaf::loss_quant_detail {
namespace {

// ---------------------------------------------------------------------------------------------
// Quantization
// ---------------------------------------------------------------------------------------------

// Layout of a (de)quantization: per-tensor (channels == 1) or per-axis over `channels`.
struct QuantLayout {
  int64_t outer = 1, channels = 1, inner = 1;
  bool per_axis = false;
};

QuantLayout GetQuantLayout(const Node& node, const Tensor& x, const Tensor& scale, const Tensor* zp) {
  if (node.GetInt("block_size", 0) != 0)
    GAF_UNSUPPORTED("{}: blocked quantization (block_size) is not supported", node.Describe());
  if (zp != nullptr)
    GAF_CHECK(zp->numel() == scale.numel(), "{}: zero point has {} elements but scale has {}",
              node.Describe(), zp->numel(), scale.numel());
  QuantLayout q;
  q.inner = x.numel();
  if (scale.numel() == 1 && scale.rank() <= 1) return q;
  GAF_CHECK(scale.rank() == 1, "{}: scale must be a scalar or 1-D tensor, got shape {}", node.Describe(),
            ShapeToString(scale.shape()));
  GAF_CHECK(x.rank() >= 1, "{}: per-axis scale needs an input of rank >= 1", node.Describe());
  const int64_t axis = NormalizeAxis(node.GetInt("axis", 1), x.rank(), node);
  GAF_CHECK(scale.dim(0) == x.dim(axis), "{}: scale has {} elements but input dimension {} is {}",
            node.Describe(), scale.dim(0), axis, x.dim(axis));
  q.per_axis = true;
  q.outer = Product(x.shape(), 0, static_cast<size_t>(axis));
  q.channels = x.dim(axis);
  q.inner = Product(x.shape(), static_cast<size_t>(axis) + 1, x.shape().size());
  return q;
}

std::vector<float> ToFloats(const Tensor& t) {
  std::vector<double> d = t.ToDoubles();
  return std::vector<float>(d.begin(), d.end());
}

// Runs fn(begin, end, scale_index) over the flat range of x, split by channel for per-axis.
template <class F>
void ForEachQuantChunk(const QuantLayout& q, F&& fn) {
  if (!q.per_axis) {
    ParallelFor(q.inner, 1 << 16, [&](int64_t b, int64_t e) { fn(b, e, int64_t{0}); });
    return;
  }
  const int64_t rows = q.outer * q.channels;
  const int64_t grain = std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, q.inner));
  ParallelFor(rows, grain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) fn(r * q.inner, (r + 1) * q.inner, r % q.channels);
  });
}

template <class Q>
void QuantizeTyped(const float* x, const std::vector<float>& scale, const Tensor* zp, Q* y, const QuantLayout& q) {
  std::vector<float> zpf(scale.size(), 0.0f);
  if (zp != nullptr) {
    const Q* z = zp->data<Q>();
    for (size_t i = 0; i < zpf.size(); ++i) zpf[i] = static_cast<float>(z[i]);
  }
  constexpr float lo = static_cast<float>(std::numeric_limits<Q>::min());
  constexpr float hi = static_cast<float>(std::numeric_limits<Q>::max());
  ForEachQuantChunk(q, [&](int64_t b, int64_t e, int64_t ch) {
    const float s = scale[ch], z = zpf[ch];
    for (int64_t i = b; i < e; ++i) {
      float v = std::nearbyint(x[i] / s) + z;
      v = std::min(std::max(v, lo), hi);
      y[i] = static_cast<Q>(v);
    }
  });
}

// Calls fn(Q{}) for the quantized integer types.
template <class F>
decltype(auto) DispatchQuant(DataType dt, const Node& node, F&& fn) {
  switch (dt) {
    case DataType::kUint8: return fn(uint8_t{});
    case DataType::kInt8: return fn(int8_t{});
    case DataType::kUint16: return fn(uint16_t{});
    case DataType::kInt16: return fn(int16_t{});
    default:
      GAF_UNSUPPORTED("{}: quantized data type {} is not supported", node.Describe(), DataTypeName(dt));
  }
}

}  // namespace

void QuantizeLinearKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x_in = ctx.input(0);
  const Tensor& scale = ctx.input(1);
  const Tensor* zp = ctx.has_input(2) ? ctx.inputs[2] : nullptr;
  GAF_CHECK(x_in.dtype() == DataType::kFloat || x_in.dtype() == DataType::kInt32 ||
                x_in.dtype() == DataType::kDouble,
            "{}: input type {} is not supported", node.Describe(), DataTypeName(x_in.dtype()));
  QuantLayout q = GetQuantLayout(node, x_in, scale, zp);
  DataType out_dt = DataType::kUint8;
  if (zp != nullptr) {
    out_dt = zp->dtype();
  } else if (node.GetInt("output_dtype", 0) != 0) {
    out_dt = static_cast<DataType>(node.GetInt("output_dtype", 0));
  }
  Tensor xf = x_in.dtype() == DataType::kFloat ? x_in : x_in.CastTo(DataType::kFloat);
  std::vector<float> s = ToFloats(scale);
  for (float v : s) GAF_CHECK(v != 0.0f, "{}: scale must not be zero", node.Describe());
  Tensor y(out_dt, x_in.shape());
  DispatchQuant(out_dt, node, [&](auto tag) {
    using Q = decltype(tag);
    QuantizeTyped<Q>(xf.data<float>(), s, zp, y.data<Q>(), q);
  });
  ctx.outputs[0] = y;
}

namespace {

template <class Q>
void DequantizeTyped(const Q* x, const std::vector<float>& scale, const Tensor* zp, float* y,
                     const QuantLayout& q) {
  using W = std::conditional_t<(sizeof(Q) < 4), int32_t, int64_t>;
  std::vector<W> zpw(scale.size(), 0);
  if (zp != nullptr) {
    const Q* z = zp->data<Q>();
    for (size_t i = 0; i < zpw.size(); ++i) zpw[i] = static_cast<W>(z[i]);
  }
  ForEachQuantChunk(q, [&](int64_t b, int64_t e, int64_t ch) {
    const float s = scale[ch];
    const W z = zpw[ch];
    for (int64_t i = b; i < e; ++i) y[i] = static_cast<float>(static_cast<W>(x[i]) - z) * s;
  });
}

}  // namespace

void DequantizeLinearKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  const Tensor& scale = ctx.input(1);
  const Tensor* zp = ctx.has_input(2) ? ctx.inputs[2] : nullptr;
  if (zp != nullptr)
    GAF_CHECK(zp->dtype() == x.dtype(), "{}: zero point type {} differs from input type {}", node.Describe(),
              DataTypeName(zp->dtype()), DataTypeName(x.dtype()));
  QuantLayout q = GetQuantLayout(node, x, scale, zp);
  std::vector<float> s = ToFloats(scale);
  Tensor y(DataType::kFloat, x.shape());
  float* yp = y.data<float>();
  switch (x.dtype()) {
    case DataType::kInt32: DequantizeTyped<int32_t>(x.data<int32_t>(), s, zp, yp, q); break;
    default:
      DispatchQuant(x.dtype(), node, [&](auto tag) {
        using Q = decltype(tag);
        DequantizeTyped<Q>(x.data<Q>(), s, zp, yp, q);
      });
  }
  ctx.outputs[0] = scale.dtype() == DataType::kDouble ? y.CastTo(DataType::kDouble) : y;
}

void DynamicQuantizeLinearKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  GAF_CHECK(x.dtype() == DataType::kFloat, "{}: input type {} is not supported (float expected)",
            node.Describe(), DataTypeName(x.dtype()));
  const float* xp = x.data<float>();
  const int64_t n = x.numel();
  float mn = 0.0f, mx = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    mn = std::min(mn, xp[i]);
    mx = std::max(mx, xp[i]);
  }
  const float scale = mx == mn ? 1.0f : (mx - mn) / 255.0f;
  const float zpf = std::nearbyint(std::min(std::max(0.0f - mn / scale, 0.0f), 255.0f));
  const uint8_t zp = static_cast<uint8_t>(zpf);
  Tensor y(DataType::kUint8, x.shape());
  uint8_t* yp = y.data<uint8_t>();
  ParallelFor(n, 1 << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float v = std::nearbyint(xp[i] / scale) + zpf;
      yp[i] = static_cast<uint8_t>(std::min(std::max(v, 0.0f), 255.0f));
    }
  });
  ctx.outputs[0] = y;
  if (ctx.num_outputs() > 1 && ctx.has_output(1)) ctx.outputs[1] = Tensor::Scalar<float>(scale);
  if (ctx.num_outputs() > 2 && ctx.has_output(2)) ctx.outputs[2] = Tensor::Scalar<uint8_t>(zp);
}

}  // namespace gaf::loss_quant_detail
