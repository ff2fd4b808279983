// Losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "ops/kernel_util.h"
#include "ops/loss_quant_internal.h"

namespace gaf::loss_quant_detail {
namespace {

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

}  // namespace

void NllKernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& target = ctx.input(1);
  const Tensor* weight = ctx.has_input(2) ? ctx.inputs[2] : nullptr;
  int64_t n, c, d;
  CheckLossShapes(ctx.node, x, target, weight, &n, &c, &d);
  ctx.outputs[0] = RunNll(ctx.node, x, target, weight, n, c, d);
}

namespace {

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

}  // namespace

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

}  // namespace gaf::loss_quant_detail
