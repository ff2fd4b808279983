// Losses (NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss), (de)quantization, detection ops
// (NonMaxSuppression, RoiAlign), GridSample, Det, signal ops (windows, DFT, STFT,
// MelWeightMatrix) and random generators.
#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <limits>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "ops/kernel.h"
#include "ops/kernel_util.h"

namespace gaf {
namespace {

constexpr double kPi = 3.14159265358979323846;

int64_t Product(const Shape& s, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end && i < s.size(); ++i) p *= s[i];
  return p;
}

// Calls fn(I{}) with I = int32_t or int64_t for index-typed tensors.
template <class F>
decltype(auto) DispatchIndex(DataType dt, const Node& node, F&& fn) {
  switch (dt) {
    case DataType::kInt32: return fn(int32_t{});
    case DataType::kInt64: return fn(int64_t{});
    default:
      GAF_UNSUPPORTED("{}: index data type {} is not supported", node.Describe(), DataTypeName(dt));
  }
}

// ---------------------------------------------------------------------------------------------
// Losses
// ---------------------------------------------------------------------------------------------

enum class Reduction { kNone, kSum, kMean };

Reduction ParseReduction(const Node& node) {
  const std::string r = node.GetString("reduction", "mean");
  if (r == "none") return Reduction::kNone;
  if (r == "sum") return Reduction::kSum;
  GAF_CHECK(r == "mean", "{}: invalid reduction '{}' (expected none, sum or mean)", node.Describe(), r);
  return Reduction::kMean;
}

// Validates input [N, C, d1..dk], target [N, d1..dk] and weight [C]; returns N, C, D = prod(d).
void CheckLossShapes(const Node& node, const Tensor& x, const Tensor& target, const Tensor* weight,
                     int64_t* n, int64_t* c, int64_t* d) {
  GAF_CHECK(x.rank() >= 2, "{}: input must have rank >= 2, got shape {}", node.Describe(),
            ShapeToString(x.shape()));
  Shape want(x.shape());
  want.erase(want.begin() + 1);
  GAF_CHECK(target.shape() == want, "{}: target shape {} does not match input shape {} (expected {})",
            node.Describe(), ShapeToString(target.shape()), ShapeToString(x.shape()), ShapeToString(want));
  *n = x.dim(0);
  *c = x.dim(1);
  *d = Product(x.shape(), 2, x.shape().size());
  if (weight != nullptr) {
    GAF_CHECK(weight->rank() == 1 && weight->dim(0) == *c, "{}: weight shape {} must be [{}]",
              node.Describe(), ShapeToString(weight->shape()), *c);
    GAF_CHECK(weight->dtype() == x.dtype(), "{}: weight type {} differs from input type {}",
              node.Describe(), DataTypeName(weight->dtype()), DataTypeName(x.dtype()));
  }
}

// logp: [N, C, D] log-probabilities, target: [N, D]; returns the (reduced) loss.
template <class T, class I>
Tensor NllLoss(const Node& node, const T* logp, const I* target, const T* weight, int64_t n, int64_t c,
               int64_t d, const Shape& target_shape, Reduction red, bool has_ii, int64_t ii) {
  Tensor out_none;
  T* per = nullptr;
  if (red == Reduction::kNone) {
    out_none = Tensor(DataTypeOf<T>(), target_shape);
    per = out_none.data<T>();
  }
  double loss_sum = 0, weight_sum = 0;
  for (int64_t b = 0; b < n; ++b) {
    const T* lp = logp + b * c * d;
    const I* tg = target + b * d;
    for (int64_t j = 0; j < d; ++j) {
      const int64_t t = static_cast<int64_t>(tg[j]);
      double l = 0, w = 0;
      if (!(has_ii && t == ii)) {
        GAF_CHECK(t >= 0 && t < c, "{}: target value {} is out of range [0, {})", node.Describe(), t, c);
        w = weight != nullptr ? static_cast<double>(weight[t]) : 1.0;
        l = -static_cast<double>(lp[t * d + j]) * w;
      }
      if (per != nullptr) per[b * d + j] = static_cast<T>(l);
      loss_sum += l;
      weight_sum += w;
    }
  }
  if (red == Reduction::kNone) return out_none;
  const double v = red == Reduction::kSum ? loss_sum : loss_sum / weight_sum;
  return Tensor::Scalar<T>(static_cast<T>(v));
}

Tensor RunNll(const Node& node, const Tensor& logp, const Tensor& target, const Tensor* weight, int64_t n,
              int64_t c, int64_t d) {
  const Reduction red = ParseReduction(node);
  const bool has_ii = node.HasAttr("ignore_index");
  const int64_t ii = node.GetInt("ignore_index", 0);
  return DispatchFloat(logp.dtype(), node, [&](auto tag) {
    using T = decltype(tag);
    return DispatchIndex(target.dtype(), node, [&](auto itag) {
      using I = decltype(itag);
      return NllLoss<T, I>(node, logp.data<T>(), target.data<I>(), weight ? weight->data<T>() : nullptr, n, c,
                           d, target.shape(), red, has_ii, ii);
    });
  });
}

void NllKernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& target = ctx.input(1);
  const Tensor* weight = ctx.has_input(2) ? ctx.inputs[2] : nullptr;
  int64_t n, c, d;
  CheckLossShapes(ctx.node, x, target, weight, &n, &c, &d);
  ctx.outputs[0] = RunNll(ctx.node, x, target, weight, n, c, d);
}

// Log-softmax over axis 1 of [N, C, D].
template <class T>
void LogSoftmaxAxis1(const T* x, T* y, int64_t n, int64_t c, int64_t d) {
  std::vector<double> mx(static_cast<size_t>(d)), sum(static_cast<size_t>(d));
  for (int64_t b = 0; b < n; ++b) {
    const T* xb = x + b * c * d;
    T* yb = y + b * c * d;
    std::fill(mx.begin(), mx.end(), -std::numeric_limits<double>::infinity());
    std::fill(sum.begin(), sum.end(), 0.0);
    for (int64_t k = 0; k < c; ++k)
      for (int64_t j = 0; j < d; ++j) mx[j] = std::max(mx[j], static_cast<double>(xb[k * d + j]));
    for (int64_t k = 0; k < c; ++k)
      for (int64_t j = 0; j < d; ++j) sum[j] += std::exp(static_cast<double>(xb[k * d + j]) - mx[j]);
    for (int64_t j = 0; j < d; ++j) sum[j] = mx[j] + std::log(sum[j]);
    for (int64_t k = 0; k < c; ++k)
      for (int64_t j = 0; j < d; ++j) yb[k * d + j] = static_cast<T>(static_cast<double>(xb[k * d + j]) - sum[j]);
  }
}

void SoftmaxCrossEntropyKernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& target = ctx.input(1);
  const Tensor* weight = ctx.has_input(2) ? ctx.inputs[2] : nullptr;
  int64_t n, c, d;
  CheckLossShapes(ctx.node, x, target, weight, &n, &c, &d);
  Tensor logp(x.dtype(), x.shape());
  DispatchFloat(x.dtype(), ctx.node, [&](auto tag) {
    using T = decltype(tag);
    LogSoftmaxAxis1<T>(x.data<T>(), logp.data<T>(), n, c, d);
  });
  ctx.outputs[0] = RunNll(ctx.node, logp, target, weight, n, c, d);
  if (ctx.num_outputs() > 1 && ctx.has_output(1)) ctx.outputs[1] = logp;
}

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

// ---------------------------------------------------------------------------------------------
// NonMaxSuppression
// ---------------------------------------------------------------------------------------------

struct BoxCorners {
  float x_min, y_min, x_max, y_max;
};

BoxCorners ToCorners(const float* b, bool center_point) {
  if (center_point) {
    const float hw = b[2] / 2, hh = b[3] / 2;
    return {b[0] - hw, b[1] - hh, b[0] + hw, b[1] + hh};
  }
  return {std::min(b[1], b[3]), std::min(b[0], b[2]), std::max(b[1], b[3]), std::max(b[0], b[2])};
}

bool SuppressByIou(const BoxCorners& a, const BoxCorners& b, float iou_threshold) {
  const float ix_min = std::max(a.x_min, b.x_min), ix_max = std::min(a.x_max, b.x_max);
  if (ix_max <= ix_min) return false;
  const float iy_min = std::max(a.y_min, b.y_min), iy_max = std::min(a.y_max, b.y_max);
  if (iy_max <= iy_min) return false;
  const float inter = (ix_max - ix_min) * (iy_max - iy_min);
  if (inter <= 0.0f) return false;
  const float area_a = (a.x_max - a.x_min) * (a.y_max - a.y_min);
  const float area_b = (b.x_max - b.x_min) * (b.y_max - b.y_min);
  const float uni = area_a + area_b - inter;
  if (area_a <= 0.0f || area_b <= 0.0f || uni <= 0.0f) return false;
  return inter / uni > iou_threshold;
}

void NonMaxSuppressionKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  Tensor boxes_t = ctx.input(0), scores_t = ctx.input(1);
  GAF_CHECK(boxes_t.rank() == 3 && boxes_t.dim(2) == 4, "{}: boxes must have shape [B, N, 4], got {}",
            node.Describe(), ShapeToString(boxes_t.shape()));
  GAF_CHECK(scores_t.rank() == 3 && scores_t.dim(0) == boxes_t.dim(0) && scores_t.dim(2) == boxes_t.dim(1),
            "{}: scores shape {} does not match boxes shape {} (expected [B, C, N])", node.Describe(),
            ShapeToString(scores_t.shape()), ShapeToString(boxes_t.shape()));
  if (boxes_t.dtype() != DataType::kFloat) boxes_t = boxes_t.CastTo(DataType::kFloat);
  if (scores_t.dtype() != DataType::kFloat) scores_t = scores_t.CastTo(DataType::kFloat);
  int64_t max_out = 0;
  if (ctx.has_input(2) && ctx.input(2).numel() > 0) max_out = ctx.input(2).ScalarAsInt64();
  float iou_th = 0.0f;
  if (ctx.has_input(3) && ctx.input(3).numel() > 0) iou_th = static_cast<float>(ctx.input(3).ScalarAsDouble());
  const bool has_score_th = ctx.has_input(4) && ctx.input(4).numel() > 0;
  const float score_th = has_score_th ? static_cast<float>(ctx.input(4).ScalarAsDouble()) : 0.0f;
  const int64_t center = node.GetInt("center_point_box", 0);
  GAF_CHECK(center == 0 || center == 1, "{}: center_point_box must be 0 or 1, got {}", node.Describe(), center);
  const int64_t nb = boxes_t.dim(0), nbox = boxes_t.dim(1), nc = scores_t.dim(1);
  const float* boxes = boxes_t.data<float>();
  const float* scores = scores_t.data<float>();
  std::vector<int64_t> result;
  if (max_out > 0) {
    std::vector<BoxCorners> corners(static_cast<size_t>(nbox));
    std::vector<int64_t> cand;
    std::vector<int64_t> selected;
    for (int64_t b = 0; b < nb; ++b) {
      for (int64_t i = 0; i < nbox; ++i) corners[i] = ToCorners(boxes + (b * nbox + i) * 4, center == 1);
      for (int64_t c = 0; c < nc; ++c) {
        const float* sc = scores + (b * nc + c) * nbox;
        cand.clear();
        for (int64_t i = 0; i < nbox; ++i)
          if (!has_score_th || sc[i] > score_th) cand.push_back(i);
        std::stable_sort(cand.begin(), cand.end(), [&](int64_t a, int64_t bb) { return sc[a] > sc[bb]; });
        selected.clear();
        for (int64_t i : cand) {
          if (static_cast<int64_t>(selected.size()) >= max_out) break;
          bool keep = true;
          for (int64_t s : selected)
            if (SuppressByIou(corners[s], corners[i], iou_th)) {
              keep = false;
              break;
            }
          if (!keep) continue;
          selected.push_back(i);
          result.insert(result.end(), {b, c, i});
        }
      }
    }
  }
  const int64_t num = static_cast<int64_t>(result.size()) / 3;
  Tensor out(DataType::kInt64, {num, 3});
  std::copy(result.begin(), result.end(), out.data<int64_t>());
  ctx.outputs[0] = out;
}

// ---------------------------------------------------------------------------------------------
// RoiAlign
// ---------------------------------------------------------------------------------------------

struct RoiSample {
  int64_t pos[4];
  double w[4];
};

template <class T>
void RoiAlignTyped(const Node& node, const T* x, const T* rois, const int64_t* bidx, T* y, int64_t num_rois,
                   int64_t nc, int64_t h, int64_t w, int64_t oh, int64_t ow, int64_t sampling_ratio,
                   double spatial_scale, bool half_pixel, bool max_mode) {
  (void)node;
  const int64_t work = nc * oh * ow * 4;
  ParallelFor(num_rois, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, work)), [&](int64_t rb, int64_t re) {
    std::vector<RoiSample> pre;
    for (int64_t r = rb; r < re; ++r) {
      const T* roi = rois + r * 4;
      const double off = half_pixel ? 0.5 : 0.0;
      const double sw = roi[0] * spatial_scale - off, sh = roi[1] * spatial_scale - off;
      const double ew = roi[2] * spatial_scale - off, eh = roi[3] * spatial_scale - off;
      double rw = ew - sw, rh = eh - sh;
      if (!half_pixel) {
        rw = std::max(rw, 1.0);
        rh = std::max(rh, 1.0);
      }
      const double bh = rh / static_cast<double>(oh), bw = rw / static_cast<double>(ow);
      int64_t gh = sampling_ratio > 0 ? sampling_ratio : static_cast<int64_t>(std::ceil(rh / oh));
      int64_t gw = sampling_ratio > 0 ? sampling_ratio : static_cast<int64_t>(std::ceil(rw / ow));
      gh = std::max<int64_t>(gh, 0);
      gw = std::max<int64_t>(gw, 0);
      const double count = static_cast<double>(std::max<int64_t>(gh * gw, 1));
      pre.assign(static_cast<size_t>(oh * ow * gh * gw), RoiSample{});
      size_t idx = 0;
      for (int64_t ph = 0; ph < oh; ++ph)
        for (int64_t pw = 0; pw < ow; ++pw)
          for (int64_t iy = 0; iy < gh; ++iy)
            for (int64_t ix = 0; ix < gw; ++ix, ++idx) {
              double yy = sh + ph * bh + (iy + 0.5) * bh / static_cast<double>(gh);
              double xx = sw + pw * bw + (ix + 0.5) * bw / static_cast<double>(gw);
              RoiSample& s = pre[idx];
              if (yy < -1.0 || yy > h || xx < -1.0 || xx > w) continue;  // zero weights
              if (yy <= 0) yy = 0;
              if (xx <= 0) xx = 0;
              int64_t yl = static_cast<int64_t>(yy), xl = static_cast<int64_t>(xx), yh, xh;
              if (yl >= h - 1) {
                yh = yl = h - 1;
                yy = static_cast<double>(yl);
              } else {
                yh = yl + 1;
              }
              if (xl >= w - 1) {
                xh = xl = w - 1;
                xx = static_cast<double>(xl);
              } else {
                xh = xl + 1;
              }
              const double ly = yy - yl, lx = xx - xl, hy = 1 - ly, hx = 1 - lx;
              s.pos[0] = yl * w + xl;
              s.pos[1] = yl * w + xh;
              s.pos[2] = yh * w + xl;
              s.pos[3] = yh * w + xh;
              s.w[0] = hy * hx;
              s.w[1] = hy * lx;
              s.w[2] = ly * hx;
              s.w[3] = ly * lx;
            }
      const int64_t b = bidx[r];
      const int64_t gsz = gh * gw;
      for (int64_t c = 0; c < nc; ++c) {
        const T* xc = x + (b * nc + c) * h * w;
        T* yc = y + (r * nc + c) * oh * ow;
        for (int64_t p = 0; p < oh * ow; ++p) {
          const RoiSample* ps = pre.data() + p * gsz;
          double v = 0;
          if (!max_mode) {
            for (int64_t g = 0; g < gsz; ++g) {
              const RoiSample& s = ps[g];
              v += s.w[0] * xc[s.pos[0]] + s.w[1] * xc[s.pos[1]] + s.w[2] * xc[s.pos[2]] + s.w[3] * xc[s.pos[3]];
            }
            v /= count;
          } else {
            // Matches ONNX Runtime: max over samples of the max weighted corner value.
            for (int64_t g = 0; g < gsz; ++g) {
              const RoiSample& s = ps[g];
              double m = std::max(std::max(s.w[0] * xc[s.pos[0]], s.w[1] * xc[s.pos[1]]),
                                  std::max(s.w[2] * xc[s.pos[2]], s.w[3] * xc[s.pos[3]]));
              v = g == 0 ? m : std::max(v, m);
            }
          }
          yc[p] = static_cast<T>(v);
        }
      }
    }
  });
}

void RoiAlignKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  const Tensor& rois = ctx.input(1);
  Tensor bidx = ctx.input(2);
  GAF_CHECK(x.rank() == 4, "{}: X must have rank 4, got shape {}", node.Describe(), ShapeToString(x.shape()));
  GAF_CHECK(rois.rank() == 2 && rois.dim(1) == 4, "{}: rois must have shape [num_rois, 4], got {}",
            node.Describe(), ShapeToString(rois.shape()));
  GAF_CHECK(rois.dtype() == x.dtype(), "{}: rois type {} differs from X type {}", node.Describe(),
            DataTypeName(rois.dtype()), DataTypeName(x.dtype()));
  const int64_t num_rois = rois.dim(0);
  GAF_CHECK(bidx.rank() == 1 && bidx.dim(0) == num_rois, "{}: batch_indices shape {} must be [{}]",
            node.Describe(), ShapeToString(bidx.shape()), num_rois);
  if (bidx.dtype() != DataType::kInt64) bidx = bidx.CastTo(DataType::kInt64);
  const int64_t* bi = bidx.data<int64_t>();
  for (int64_t i = 0; i < num_rois; ++i)
    GAF_CHECK(bi[i] >= 0 && bi[i] < x.dim(0), "{}: batch index {} is out of range [0, {})", node.Describe(),
              bi[i], x.dim(0));
  const std::string mode = node.GetString("mode", "avg");
  GAF_CHECK(mode == "avg" || mode == "max", "{}: invalid mode '{}'", node.Describe(), mode);
  const std::string ctm =
      node.GetString("coordinate_transformation_mode", ctx.opset >= 16 ? "half_pixel" : "output_half_pixel");
  GAF_CHECK(ctm == "half_pixel" || ctm == "output_half_pixel", "{}: invalid coordinate_transformation_mode '{}'",
            node.Describe(), ctm);
  const int64_t oh = node.GetInt("output_height", 1), ow = node.GetInt("output_width", 1);
  GAF_CHECK(oh > 0 && ow > 0, "{}: output_height and output_width must be positive", node.Describe());
  const int64_t sr = node.GetInt("sampling_ratio", 0);
  GAF_CHECK(sr >= 0, "{}: sampling_ratio must be >= 0", node.Describe());
  const double ss = node.GetFloat("spatial_scale", 1.0f);
  const int64_t nc = x.dim(1), h = x.dim(2), w = x.dim(3);
  GAF_CHECK(num_rois == 0 || (h > 0 && w > 0), "{}: X has an empty spatial size", node.Describe());
  Tensor y(x.dtype(), {num_rois, nc, oh, ow});
  DispatchFloat(x.dtype(), node, [&](auto tag) {
    using T = decltype(tag);
    RoiAlignTyped<T>(node, x.data<T>(), rois.data<T>(), bi, y.data<T>(), num_rois, nc, h, w, oh, ow, sr, ss,
                     ctm == "half_pixel", mode == "max");
  });
  ctx.outputs[0] = y;
}

// ---------------------------------------------------------------------------------------------
// GridSample (2-D spatial; follows ONNX Runtime's reference implementation)
// ---------------------------------------------------------------------------------------------

enum class GsMode { kNearest, kLinear, kCubic };
enum class GsPad { kZeros, kBorder, kReflection };

double GsDenormalize(double n, int64_t len, bool align_corners) {
  return align_corners ? (n + 1) / 2.0 * static_cast<double>(len - 1)
                       : ((n + 1) * static_cast<double>(len) - 1) / 2.0;
}

double GsReflect(double x, double lo, double hi) {
  const double range = hi - lo;
  if (range <= 0) return lo;
  if (x < lo) {
    const double dx = lo - x;
    const int64_t n = static_cast<int64_t>(dx / range);
    const double r = dx - static_cast<double>(n) * range;
    return n % 2 == 0 ? lo + r : hi - r;
  }
  if (x > hi) {
    const double dx = x - hi;
    const int64_t n = static_cast<int64_t>(dx / range);
    const double r = dx - static_cast<double>(n) * range;
    return n % 2 == 0 ? hi - r : lo + r;
  }
  return x;
}

void GsCubicCoeffs(double x, double c[4]) {
  constexpr double a = -0.75;
  x = std::fabs(x);
  c[0] = ((a * (x + 1) - 5 * a) * (x + 1) + 8 * a) * (x + 1) - 4 * a;
  c[1] = ((a + 2) * x - (a + 3)) * x * x + 1;
  c[2] = ((a + 2) * (1 - x) - (a + 3)) * (1 - x) * (1 - x) + 1;
  c[3] = ((a * (2 - x) - 5 * a) * (2 - x) + 8 * a) * (2 - x) - 4 * a;
}

template <class T>
void GridSampleTyped(const T* x, const T* grid, T* y, int64_t n, int64_t nc, int64_t h, int64_t w, int64_t oh,
                     int64_t ow, GsMode mode, GsPad pad, bool align) {
  const double x_min = align ? 0.0 : -0.5, x_max = align ? w - 1.0 : w - 0.5;
  const double y_min = align ? 0.0 : -0.5, y_max = align ? h - 1.0 : h - 0.5;
  const int64_t opix = oh * ow;
  auto pixel = [&](const T* img, int64_t r, int64_t c) -> double {
    if (pad == GsPad::kZeros) {
      return (c >= 0 && c < w && r >= 0 && r < h) ? static_cast<double>(img[r * w + c]) : 0.0;
    }
    if (pad == GsPad::kReflection) {
      c = static_cast<int64_t>(GsReflect(static_cast<double>(c), x_min, x_max));
      r = static_cast<int64_t>(GsReflect(static_cast<double>(r), y_min, y_max));
    }
    c = std::clamp<int64_t>(c, 0, w - 1);
    r = std::clamp<int64_t>(r, 0, h - 1);
    return static_cast<double>(img[r * w + c]);
  };
  ParallelFor(n * oh, std::max<int64_t>(1, 8192 / std::max<int64_t>(1, ow * nc)), [&](int64_t rb, int64_t re) {
    for (int64_t row = rb; row < re; ++row) {
      const int64_t b = row / oh, oy = row % oh;
      const T* img_b = x + b * nc * h * w;
      for (int64_t ox = 0; ox < ow; ++ox) {
        const T* g = grid + ((b * oh + oy) * ow + ox) * 2;
        double gx = GsDenormalize(static_cast<double>(g[0]), w, align);
        double gy = GsDenormalize(static_cast<double>(g[1]), h, align);
        if (mode == GsMode::kNearest) {
          gx = std::nearbyint(gx);
          gy = std::nearbyint(gy);
        }
        if (gx < x_min || gx > x_max || gy < y_min || gy > y_max) {
          if (pad == GsPad::kBorder) {
            gx = std::clamp(gx, 0.0, static_cast<double>(w - 1));
            gy = std::clamp(gy, 0.0, static_cast<double>(h - 1));
          } else if (pad == GsPad::kReflection) {
            gx = GsReflect(gx, x_min, x_max);
            gy = GsReflect(gy, y_min, y_max);
          }
        }
        if (!std::isfinite(gx) || !std::isfinite(gy) || std::fabs(gx) > 1e15 || std::fabs(gy) > 1e15) {
          for (int64_t c = 0; c < nc; ++c) y[(b * nc + c) * opix + oy * ow + ox] = static_cast<T>(0);
          continue;
        }
        const int64_t out_off = oy * ow + ox;
        if (mode == GsMode::kNearest) {
          const int64_t ix = static_cast<int64_t>(gx), iy = static_cast<int64_t>(gy);
          for (int64_t c = 0; c < nc; ++c)
            y[(b * nc + c) * opix + out_off] = static_cast<T>(pixel(img_b + c * h * w, iy, ix));
        } else if (mode == GsMode::kLinear) {
          const int64_t x1 = static_cast<int64_t>(std::floor(gx)), y1 = static_cast<int64_t>(std::floor(gy));
          const int64_t x2 = x1 + 1, y2 = y1 + 1;
          const double dx2 = x2 - gx, dx1 = gx - x1, dy2 = y2 - gy, dy1 = gy - y1;
          for (int64_t c = 0; c < nc; ++c) {
            const T* img = img_b + c * h * w;
            const double p11 = pixel(img, y1, x1), p12 = pixel(img, y1, x2);
            const double p21 = pixel(img, y2, x1), p22 = pixel(img, y2, x2);
            y[(b * nc + c) * opix + out_off] =
                static_cast<T>(dy2 * (dx2 * p11 + dx1 * p12) + dy1 * (dx2 * p21 + dx1 * p22));
          }
        } else {
          const int64_t x0 = static_cast<int64_t>(std::floor(gx)) - 1;
          const int64_t y0 = static_cast<int64_t>(std::floor(gy)) - 1;
          double cx[4], cy[4];
          GsCubicCoeffs(gx - x0 - 1, cx);
          GsCubicCoeffs(gy - y0 - 1, cy);
          for (int64_t c = 0; c < nc; ++c) {
            const T* img = img_b + c * h * w;
            double v = 0;
            for (int i = 0; i < 4; ++i) {
              double row_v = 0;
              for (int j = 0; j < 4; ++j) row_v += cx[j] * pixel(img, y0 + i, x0 + j);
              v += cy[i] * row_v;
            }
            y[(b * nc + c) * opix + out_off] = static_cast<T>(v);
          }
        }
      }
    }
  });
}

void GridSampleKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  const Tensor& grid = ctx.input(1);
  if (x.rank() != 4)
    GAF_UNSUPPORTED("{}: only 4-D inputs (2-D spatial) are supported, got shape {}", node.Describe(),
                    ShapeToString(x.shape()));
  GAF_CHECK(grid.rank() == 4 && grid.dim(0) == x.dim(0) && grid.dim(3) == 2,
            "{}: grid shape {} must be [N, H_out, W_out, 2] with N = {}", node.Describe(),
            ShapeToString(grid.shape()), x.dim(0));
  GAF_CHECK(grid.dtype() == x.dtype(), "{}: grid type {} differs from X type {}", node.Describe(),
            DataTypeName(grid.dtype()), DataTypeName(x.dtype()));
  const std::string m = node.GetString("mode", ctx.opset >= 20 ? "linear" : "bilinear");
  GsMode mode = GsMode::kLinear;
  if (m == "bilinear" || m == "linear") mode = GsMode::kLinear;
  else if (m == "nearest") mode = GsMode::kNearest;
  else if (m == "bicubic" || m == "cubic") mode = GsMode::kCubic;
  else GAF_CHECK(false, "{}: invalid mode '{}'", node.Describe(), m);
  const std::string p = node.GetString("padding_mode", "zeros");
  GsPad pad = GsPad::kZeros;
  if (p == "zeros") pad = GsPad::kZeros;
  else if (p == "border") pad = GsPad::kBorder;
  else if (p == "reflection") pad = GsPad::kReflection;
  else GAF_CHECK(false, "{}: invalid padding_mode '{}'", node.Describe(), p);
  const bool align = node.GetInt("align_corners", 0) != 0;
  const int64_t n = x.dim(0), nc = x.dim(1), h = x.dim(2), w = x.dim(3), oh = grid.dim(1), ow = grid.dim(2);
  GAF_CHECK(n * nc * oh * ow == 0 || (h > 0 && w > 0), "{}: X has an empty spatial size", node.Describe());
  Tensor y(x.dtype(), {n, nc, oh, ow});
  DispatchFloat(x.dtype(), node, [&](auto tag) {
    using T = decltype(tag);
    GridSampleTyped<T>(x.data<T>(), grid.data<T>(), y.data<T>(), n, nc, h, w, oh, ow, mode, pad, align);
  });
  ctx.outputs[0] = y;
}

// ---------------------------------------------------------------------------------------------
// Det
// ---------------------------------------------------------------------------------------------

template <class T>
double Determinant(const T* a, int64_t m, std::vector<double>& buf) {
  buf.assign(a, a + m * m);
  double det = 1.0;
  for (int64_t k = 0; k < m; ++k) {
    int64_t piv = k;
    for (int64_t i = k + 1; i < m; ++i)
      if (std::fabs(buf[i * m + k]) > std::fabs(buf[piv * m + k])) piv = i;
    if (buf[piv * m + k] == 0.0) return 0.0;
    if (piv != k) {
      for (int64_t j = 0; j < m; ++j) std::swap(buf[k * m + j], buf[piv * m + j]);
      det = -det;
    }
    const double d = buf[k * m + k];
    det *= d;
    for (int64_t i = k + 1; i < m; ++i) {
      const double f = buf[i * m + k] / d;
      if (f == 0.0) continue;
      for (int64_t j = k + 1; j < m; ++j) buf[i * m + j] -= f * buf[k * m + j];
    }
  }
  return det;
}

void DetKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  GAF_CHECK(x.rank() >= 2 && x.dim(-1) == x.dim(-2), "{}: input must have shape [*, M, M], got {}",
            node.Describe(), ShapeToString(x.shape()));
  Shape out_shape(x.shape().begin(), x.shape().end() - 2);
  const int64_t m = x.dim(-1);
  const int64_t batch = NumElements(out_shape);
  Tensor y(x.dtype(), out_shape);
  DispatchFloat(x.dtype(), node, [&](auto tag) {
    using T = decltype(tag);
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
    ParallelFor(batch, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, m * m * m)), [&](int64_t b, int64_t e) {
      std::vector<double> buf;
      for (int64_t i = b; i < e; ++i) yp[i] = static_cast<T>(Determinant<T>(xp + i * m * m, m, buf));
    });
  });
  ctx.outputs[0] = y;
}

// ---------------------------------------------------------------------------------------------
// Signal: windows, DFT, STFT, MelWeightMatrix
// ---------------------------------------------------------------------------------------------

DataType OutputDataType(const Node& node, const char* attr, DataType def) {
  const DataType dt = static_cast<DataType>(node.GetInt(attr, static_cast<int64_t>(def)));
  switch (dt) {
    case DataType::kFloat: case DataType::kDouble: case DataType::kFloat16: case DataType::kBFloat16:
    case DataType::kUint8: case DataType::kInt8: case DataType::kUint16: case DataType::kInt16:
    case DataType::kUint32: case DataType::kInt32: case DataType::kUint64: case DataType::kInt64:
      return dt;
    default:
      GAF_UNSUPPORTED("{}: {} {} is not supported", node.Describe(), attr, static_cast<int>(dt));
  }
}

Tensor DoublesTo(const Tensor& t, DataType dt) { return dt == DataType::kDouble ? t : t.CastTo(dt); }

enum class WindowKind { kHann, kHamming, kBlackman };

void WindowKernel(KernelContext& ctx, WindowKind kind) {
  const Node& node = ctx.node;
  const Tensor& st = ctx.input(0);
  GAF_CHECK(st.numel() == 1, "{}: size must be a scalar", node.Describe());
  const int64_t size = st.ScalarAsInt64();
  GAF_CHECK(size >= 0, "{}: size must be >= 0, got {}", node.Describe(), size);
  const bool periodic = node.GetInt("periodic", 1) != 0;
  const DataType dt = OutputDataType(node, "output_datatype", DataType::kFloat);
  Tensor t(DataType::kDouble, {size});
  double* p = t.data<double>();
  const double denom = static_cast<double>(periodic ? size : size - 1);
  for (int64_t k = 0; k < size; ++k) {
    if (denom <= 0) {
      p[k] = 1.0;
      continue;
    }
    const double a = 2 * kPi * static_cast<double>(k) / denom;
    switch (kind) {
      case WindowKind::kHann: p[k] = 0.5 - 0.5 * std::cos(a); break;
      case WindowKind::kHamming: p[k] = 25.0 / 46.0 - (21.0 / 46.0) * std::cos(a); break;
      case WindowKind::kBlackman: p[k] = 0.42 - 0.5 * std::cos(a) + 0.08 * std::cos(2 * a); break;
    }
  }
  ctx.outputs[0] = DoublesTo(t, dt);
}

using Cd = std::complex<double>;

// A length-L DFT: radix-2 FFT when L is a power of two, direct O(L^2) sum otherwise.
class DftPlan {
 public:
  DftPlan(int64_t len, bool inverse) : len_(len), inverse_(inverse), tw_(static_cast<size_t>(len)) {
    const double sign = inverse ? 2.0 : -2.0;
    for (int64_t j = 0; j < len; ++j) {
      const double a = sign * kPi * static_cast<double>(j) / static_cast<double>(len);
      tw_[j] = Cd(std::cos(a), std::sin(a));
    }
    pow2_ = len > 0 && (len & (len - 1)) == 0;
  }
  // Transforms buf (len_ samples, overwritten) and writes the first out_len bins to out.
  void Run(std::vector<Cd>& buf, Cd* out, int64_t out_len) const {
    const double scale = inverse_ ? 1.0 / static_cast<double>(len_) : 1.0;
    if (pow2_) {
      Fft(buf);
      for (int64_t k = 0; k < out_len; ++k) out[k] = buf[k] * scale;
      return;
    }
    for (int64_t k = 0; k < out_len; ++k) {
      Cd s = 0;
      int64_t idx = 0;
      for (int64_t t = 0; t < len_; ++t) {
        s += buf[t] * tw_[idx];
        idx += k;
        if (idx >= len_) idx -= len_;
      }
      out[k] = s * scale;
    }
  }

 private:
  void Fft(std::vector<Cd>& a) const {
    const int64_t n = len_;
    for (int64_t i = 1, j = 0; i < n; ++i) {
      int64_t bit = n >> 1;
      for (; j & bit; bit >>= 1) j ^= bit;
      j ^= bit;
      if (i < j) std::swap(a[i], a[j]);
    }
    for (int64_t len = 2; len <= n; len <<= 1) {
      const int64_t step = n / len, half = len / 2;
      for (int64_t i = 0; i < n; i += len)
        for (int64_t j = 0; j < half; ++j) {
          const Cd u = a[i + j], v = a[i + j + half] * tw_[j * step];
          a[i + j] = u + v;
          a[i + j + half] = u - v;
        }
    }
  }

  int64_t len_;
  bool inverse_;
  bool pow2_ = false;
  std::vector<Cd> tw_;
};

void DftKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  const int64_t r = x.rank();
  GAF_CHECK(r >= 2 && (x.dim(-1) == 1 || x.dim(-1) == 2),
            "{}: input must have rank >= 2 and a last dimension of 1 (real) or 2 (complex), got {}",
            node.Describe(), ShapeToString(x.shape()));
  int64_t axis = 1;
  if (ctx.opset >= 20) {
    axis = ctx.has_input(2) && ctx.input(2).numel() > 0 ? ctx.input(2).ScalarAsInt64() : -2;
  } else {
    axis = node.GetInt("axis", 1);
  }
  if (axis < 0) axis += r;
  GAF_CHECK(axis >= 0 && axis <= r - 2, "{}: axis {} is out of range for input shape {}", node.Describe(), axis,
            ShapeToString(x.shape()));
  const int64_t n = x.dim(axis);
  int64_t len = n;
  if (ctx.has_input(1) && ctx.input(1).numel() > 0) len = ctx.input(1).ScalarAsInt64();
  GAF_CHECK(len >= 1, "{}: dft_length must be >= 1, got {}", node.Describe(), len);
  const bool inverse = node.GetInt("inverse", 0) != 0;
  const bool onesided = node.GetInt("onesided", 0) != 0;
  if (inverse && onesided)
    GAF_UNSUPPORTED("{}: onesided inverse DFT is not supported", node.Describe());
  const int64_t out_len = onesided ? len / 2 + 1 : len;
  const int64_t comp = x.dim(-1);
  const int64_t outer = Product(x.shape(), 0, static_cast<size_t>(axis));
  const int64_t inner = Product(x.shape(), static_cast<size_t>(axis) + 1, static_cast<size_t>(r - 1));
  Shape out_shape = x.shape();
  out_shape[axis] = out_len;
  out_shape.back() = 2;
  Tensor y(x.dtype(), out_shape);
  const DftPlan plan(len, inverse);
  const int64_t used = std::min(n, len);
  DispatchFloat(x.dtype(), node, [&](auto tag) {
    using T = decltype(tag);
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
    const int64_t cost = len * (len < 64 ? len : 64);
    ParallelFor(outer * inner, std::max<int64_t>(1, 65536 / std::max<int64_t>(1, cost)), [&](int64_t b, int64_t e) {
      std::vector<Cd> buf(static_cast<size_t>(len)), out(static_cast<size_t>(out_len));
      for (int64_t p = b; p < e; ++p) {
        const int64_t o = p / inner, i = p % inner;
        std::fill(buf.begin(), buf.end(), Cd(0, 0));
        for (int64_t t = 0; t < used; ++t) {
          const T* s = xp + ((o * n + t) * inner + i) * comp;
          buf[t] = Cd(static_cast<double>(s[0]), comp == 2 ? static_cast<double>(s[1]) : 0.0);
        }
        plan.Run(buf, out.data(), out_len);
        for (int64_t k = 0; k < out_len; ++k) {
          T* d = yp + ((o * out_len + k) * inner + i) * 2;
          d[0] = static_cast<T>(out[k].real());
          d[1] = static_cast<T>(out[k].imag());
        }
      }
    });
  });
  ctx.outputs[0] = y;
}

void StftKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  GAF_CHECK(x.rank() == 3 && (x.dim(2) == 1 || x.dim(2) == 2),
            "{}: signal must have shape [batch, length, 1 or 2], got {}", node.Describe(), ShapeToString(x.shape()));
  const int64_t step = ctx.input(1).ScalarAsInt64();
  GAF_CHECK(step > 0, "{}: frame_step must be positive, got {}", node.Describe(), step);
  const Tensor* window = ctx.has_input(2) && ctx.input(2).numel() > 0 ? ctx.inputs[2] : nullptr;
  int64_t len = -1;
  if (ctx.has_input(3) && ctx.input(3).numel() > 0) len = ctx.input(3).ScalarAsInt64();
  if (window != nullptr) {
    GAF_CHECK(window->rank() == 1, "{}: window must be 1-D, got {}", node.Describe(), ShapeToString(window->shape()));
    if (len < 0) len = window->dim(0);
    GAF_CHECK(window->dim(0) == len, "{}: window length {} differs from frame_length {}", node.Describe(),
              window->dim(0), len);
  }
  GAF_CHECK(len > 0, "{}: frame_length (or a window) is required and must be positive", node.Describe());
  const int64_t batch = x.dim(0), sig = x.dim(1), comp = x.dim(2);
  GAF_CHECK(len <= sig, "{}: frame_length {} exceeds the signal length {}", node.Describe(), len, sig);
  const bool onesided = node.GetInt("onesided", 1) != 0;
  const int64_t frames = 1 + (sig - len) / step;
  const int64_t bins = onesided ? len / 2 + 1 : len;
  std::vector<double> win(static_cast<size_t>(len), 1.0);
  if (window != nullptr) win = window->ToDoubles();
  Tensor y(x.dtype(), {batch, frames, bins, 2});
  const DftPlan plan(len, false);
  DispatchFloat(x.dtype(), node, [&](auto tag) {
    using T = decltype(tag);
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
    ParallelFor(batch * frames, std::max<int64_t>(1, 65536 / (len * std::min<int64_t>(len, 64))),
                [&](int64_t b, int64_t e) {
                  std::vector<Cd> buf(static_cast<size_t>(len)), out(static_cast<size_t>(bins));
                  for (int64_t p = b; p < e; ++p) {
                    const int64_t bi = p / frames, f = p % frames;
                    const T* s = xp + (bi * sig + f * step) * comp;
                    for (int64_t t = 0; t < len; ++t)
                      buf[t] = Cd(static_cast<double>(s[t * comp]) * win[t],
                                  comp == 2 ? static_cast<double>(s[t * comp + 1]) * win[t] : 0.0);
                    plan.Run(buf, out.data(), bins);
                    T* d = yp + p * bins * 2;
                    for (int64_t k = 0; k < bins; ++k) {
                      d[2 * k] = static_cast<T>(out[k].real());
                      d[2 * k + 1] = static_cast<T>(out[k].imag());
                    }
                  }
                });
  });
  ctx.outputs[0] = y;
}

// The mel step divides by num_mel_bins + 2, as the ONNX reference and ONNX Runtime do.
void MelWeightMatrixKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const int64_t num_mel = ctx.input(0).ScalarAsInt64();
  const int64_t dft_len = ctx.input(1).ScalarAsInt64();
  const int64_t rate = ctx.input(2).ScalarAsInt64();
  const float lower = static_cast<float>(ctx.input(3).ScalarAsDouble());
  const float upper = static_cast<float>(ctx.input(4).ScalarAsDouble());
  GAF_CHECK(num_mel > 0 && dft_len > 0 && rate > 0,
            "{}: num_mel_bins, dft_length and sample_rate must be positive", node.Describe());
  const DataType dt = OutputDataType(node, "output_datatype", DataType::kFloat);
  const int64_t spec_bins = dft_len / 2 + 1;
  const float low_mel = 2595.0f * std::log10(1.0f + lower / 700.0f);
  const float high_mel = 2595.0f * std::log10(1.0f + upper / 700.0f);
  const double mel_step = static_cast<double>((high_mel - low_mel) / static_cast<float>(num_mel + 2));
  std::vector<int64_t> fb(static_cast<size_t>(num_mel + 2));
  for (int64_t i = 0; i < num_mel + 2; ++i) {
    const double mel = static_cast<double>(i) * mel_step + static_cast<double>(low_mel);
    const double hz = 700.0 * (std::pow(10.0, mel / 2595.0) - 1.0);
    fb[i] = static_cast<int64_t>(std::floor(static_cast<double>(dft_len + 1) * hz / static_cast<double>(rate)));
  }
  Tensor t(DataType::kDouble, {spec_bins, num_mel});
  double* p = t.data<double>();
  auto at = [&](int64_t j, int64_t i) -> double& {
    GAF_CHECK(j >= 0 && j < spec_bins, "{}: frequency bin {} is out of range [0, {})", node.Describe(), j,
              spec_bins);
    return p[j * num_mel + i];
  };
  for (int64_t i = 0; i < num_mel; ++i) {
    const int64_t lo = fb[i], ce = fb[i + 1], hi = fb[i + 2];
    const int64_t low_to_center = ce - lo;
    if (low_to_center == 0) {
      at(ce, i) = 1.0;
    } else {
      for (int64_t j = lo; j <= ce; ++j) at(j, i) = static_cast<double>(j - lo) / static_cast<double>(low_to_center);
    }
    const int64_t center_to_high = hi - ce;
    if (center_to_high > 0)
      for (int64_t j = ce; j < hi; ++j) at(j, i) = static_cast<double>(hi - j) / static_cast<double>(center_to_high);
  }
  ctx.outputs[0] = DoublesTo(t, dt);
}

// ---------------------------------------------------------------------------------------------
// Random generators. With a `seed` attribute each call is deterministic; otherwise a shared
// generator seeded from std::random_device is used.
// ---------------------------------------------------------------------------------------------

std::mutex& RngMutex() {
  static std::mutex m;
  return m;
}

std::mt19937& SharedRng() {
  static std::mt19937 g{std::random_device{}()};
  return g;
}

template <class F>
void WithRng(const Node& node, F&& fn) {
  if (node.HasAttr("seed")) {
    const double s = std::clamp<double>(node.GetFloat("seed", 0.0f), -9.0e18, 9.0e18);
    std::mt19937 g(static_cast<uint32_t>(static_cast<int64_t>(s)));
    fn(g);
    return;
  }
  std::lock_guard<std::mutex> lock(RngMutex());
  fn(SharedRng());
}

DataType RandomFloatType(const Node& node, DataType def) {
  const DataType dt = static_cast<DataType>(node.GetInt("dtype", static_cast<int64_t>(def)));
  if (dt == DataType::kFloat || dt == DataType::kDouble || dt == DataType::kFloat16 || dt == DataType::kBFloat16)
    return dt;
  GAF_UNSUPPORTED("{}: dtype {} is not supported (float types only)", node.Describe(), static_cast<int>(dt));
}

Shape RandomShape(KernelContext& ctx, bool like) {
  if (like) return ctx.input(0).shape();
  GAF_CHECK(ctx.node.HasAttr("shape"), "{}: missing attribute 'shape'", ctx.node.Describe());
  Shape s = ctx.node.GetInts("shape");
  for (int64_t d : s) GAF_CHECK(d >= 0, "{}: negative dimension in shape", ctx.node.Describe());
  return s;
}

void RandomKernel(KernelContext& ctx, bool normal, bool like) {
  const Node& node = ctx.node;
  const Shape shape = RandomShape(ctx, like);
  DataType def = like ? ctx.input(0).dtype() : DataType::kFloat;
  if (like && !IsFloatingPoint(def)) def = DataType::kFloat;
  const DataType dt = RandomFloatType(node, def);
  Tensor t(DataType::kDouble, shape);
  double* p = t.data<double>();
  const int64_t n = t.numel();
  WithRng(node, [&](std::mt19937& g) {
    if (normal) {
      std::normal_distribution<double> dist(node.GetFloat("mean", 0.0f), node.GetFloat("scale", 1.0f));
      for (int64_t i = 0; i < n; ++i) p[i] = dist(g);
    } else {
      const double lo = node.GetFloat("low", 0.0f), hi = node.GetFloat("high", 1.0f);
      GAF_CHECK(lo <= hi, "{}: low {} is greater than high {}", node.Describe(), lo, hi);
      std::uniform_real_distribution<double> dist(lo, hi);
      for (int64_t i = 0; i < n; ++i) p[i] = dist(g);
    }
  });
  ctx.outputs[0] = DoublesTo(t, dt);
}

void BernoulliKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  GAF_CHECK(IsFloatingPoint(x.dtype()), "{}: input type {} must be floating point", node.Describe(),
            DataTypeName(x.dtype()));
  const DataType dt = static_cast<DataType>(node.GetInt("dtype", static_cast<int64_t>(x.dtype())));
  std::vector<double> prob = x.ToDoubles();
  Tensor t(DataType::kDouble, x.shape());
  double* p = t.data<double>();
  WithRng(node, [&](std::mt19937& g) {
    std::uniform_real_distribution<double> dist(0.0, 1.0);
    for (size_t i = 0; i < prob.size(); ++i) p[i] = dist(g) < prob[i] ? 1.0 : 0.0;
  });
  switch (dt) {
    case DataType::kFloat: case DataType::kDouble: case DataType::kFloat16: case DataType::kBFloat16:
    case DataType::kUint8: case DataType::kInt8: case DataType::kUint16: case DataType::kInt16:
    case DataType::kUint32: case DataType::kInt32: case DataType::kUint64: case DataType::kInt64:
    case DataType::kBool:
      break;
    default:
      GAF_UNSUPPORTED("{}: dtype {} is not supported", node.Describe(), static_cast<int>(dt));
  }
  ctx.outputs[0] = DoublesTo(t, dt);
}

void MultinomialKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  GAF_CHECK(x.rank() == 2, "{}: input must have shape [batch, class_size], got {}", node.Describe(),
            ShapeToString(x.shape()));
  GAF_CHECK(IsFloatingPoint(x.dtype()), "{}: input type {} must be floating point", node.Describe(),
            DataTypeName(x.dtype()));
  const int64_t samples = node.GetInt("sample_size", 1);
  GAF_CHECK(samples >= 0, "{}: sample_size must be >= 0", node.Describe());
  const DataType dt = static_cast<DataType>(node.GetInt("dtype", static_cast<int64_t>(DataType::kInt32)));
  GAF_CHECK(dt == DataType::kInt32 || dt == DataType::kInt64, "{}: dtype must be int32 or int64",
            node.Describe());
  const int64_t batch = x.dim(0), classes = x.dim(1);
  GAF_CHECK(classes > 0 || samples == 0 || batch == 0, "{}: class_size must be positive", node.Describe());
  std::vector<double> logits = x.ToDoubles();
  Tensor out(DataType::kInt64, {batch, samples});
  int64_t* op = out.data<int64_t>();
  WithRng(node, [&](std::mt19937& g) {
    std::uniform_real_distribution<double> dist(0.0, 1.0);
    std::vector<double> cdf(static_cast<size_t>(classes));
    for (int64_t b = 0; b < batch; ++b) {
      const double* l = logits.data() + b * classes;
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t c = 0; c < classes; ++c) mx = std::max(mx, l[c]);
      double total = 0;
      for (int64_t c = 0; c < classes; ++c) {
        total += std::exp(l[c] - mx);
        cdf[c] = total;
      }
      for (int64_t s = 0; s < samples; ++s) {
        const double u = dist(g) * total;
        int64_t k = std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin();
        op[b * samples + s] = std::min(k, classes - 1);
      }
    }
  });
  ctx.outputs[0] = dt == DataType::kInt64 ? out : out.CastTo(DataType::kInt32);
}

}  // namespace

void RegisterLossAndQuantKernels(OpRegistry& r) {
  constexpr auto kO = OpKind::kOpaque;
  auto reg = [&](const char* op, OpKind kind, KernelFn fn) { r.Register({"", op, kind, std::move(fn), true}); };
  reg("NegativeLogLikelihoodLoss", kO, NllKernel);
  reg("SoftmaxCrossEntropyLoss", kO, SoftmaxCrossEntropyKernel);
  reg("QuantizeLinear", OpKind::kElementwise, QuantizeLinearKernel);
  reg("DequantizeLinear", OpKind::kElementwise, DequantizeLinearKernel);
  reg("DynamicQuantizeLinear", kO, DynamicQuantizeLinearKernel);
  reg("NonMaxSuppression", kO, NonMaxSuppressionKernel);
  reg("RoiAlign", kO, RoiAlignKernel);
  reg("GridSample", kO, GridSampleKernel);
  reg("Det", kO, DetKernel);
  reg("HannWindow", kO, [](KernelContext& ctx) { WindowKernel(ctx, WindowKind::kHann); });
  reg("HammingWindow", kO, [](KernelContext& ctx) { WindowKernel(ctx, WindowKind::kHamming); });
  reg("BlackmanWindow", kO, [](KernelContext& ctx) { WindowKernel(ctx, WindowKind::kBlackman); });
  reg("DFT", kO, DftKernel);
  reg("STFT", kO, StftKernel);
  reg("MelWeightMatrix", kO, MelWeightMatrixKernel);
  reg("RandomUniform", kO, [](KernelContext& ctx) { RandomKernel(ctx, false, false); });
  reg("RandomNormal", kO, [](KernelContext& ctx) { RandomKernel(ctx, true, false); });
  reg("RandomUniformLike", kO, [](KernelContext& ctx) { RandomKernel(ctx, false, true); });
  reg("RandomNormalLike", kO, [](KernelContext& ctx) { RandomKernel(ctx, true, true); });
  reg("Bernoulli", kO, BernoulliKernel);
  reg("Multinomial", kO, MultinomialKernel);
}

}  // namespace gaf
