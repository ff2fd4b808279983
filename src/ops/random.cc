// Random generators: RandomUniform, RandomNormal (and their *Like variants), Bernoulli and
// Multinomial.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <mutex>
#include <random>
#include <vector>

#include "ops/kernel_util.h"
#include "ops/loss_quant_internal.h"

namespace gaf::loss_quant_detail {
namespace {

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

}  // namespace

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

}  // namespace gaf::loss_quant_detail
