#include "codegen/verify.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "codegen/fused_session.h"
#include "cost/cost_model.h"
#include "runtime/session.h"

namespace gaf {

// The fewest wins out of n fair-coin pairs whose probability is at most alpha (one-sided sign
// test): the smallest k with P(X >= k) <= alpha for X ~ Binomial(n, 1/2); n + 1 when none is.
int SignTestWins(int n, double alpha) {
  std::vector<double> p(static_cast<size_t>(n) + 1, 0.0);  // P(X = k), by the recurrence C(n,k+1) = C(n,k)(n-k)/(k+1)
  p[0] = std::pow(0.5, n);
  for (int k = 0; k < n; ++k) p[k + 1] = p[k] * (n - k) / (k + 1);
  double tail = 0;
  int need = n + 1;
  for (int k = n; k >= 0; --k) {
    tail += p[k];
    if (tail > alpha) break;
    need = k;
  }
  return need;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double RelativeIqr(std::vector<double> v) {
  if (v.size() < 4) return 0;
  std::sort(v.begin(), v.end());
  double m = Median(v);
  double q1 = v[v.size() / 4], q3 = v[(3 * v.size()) / 4];
  return m > 0 ? (q3 - q1) / m : 0;
}

void CompareTensors(const Tensor& ref, const Tensor& got, double* cosine, double* max_abs) {
  Tensor a = ref.dtype() == DataType::kDouble ? ref : ref.CastTo(DataType::kDouble);
  Tensor b = got.dtype() == DataType::kDouble ? got : got.CastTo(DataType::kDouble);
  const double* x = a.data<double>();
  const double* y = b.data<double>();
  double dot = 0, nx = 0, ny = 0, err = 0;
  bool bad = false;
  for (int64_t i = 0; i < a.numel() && i < b.numel(); ++i) {
    if (std::isfinite(x[i]) != std::isfinite(y[i])) {
      bad = true;
      continue;
    }
    if (!std::isfinite(x[i])) continue;  // both inf/nan: -inf masks and the like
    dot += x[i] * y[i];
    nx += x[i] * x[i];
    ny += y[i] * y[i];
    err = std::max(err, std::fabs(x[i] - y[i]));
  }
  if (bad) {
    *cosine = -1;
    *max_abs = INFINITY;
    return;
  }
  *cosine = (nx == 0 && ny == 0) ? 1.0 : (nx == 0 || ny == 0) ? 0.0 : dot / std::sqrt(nx * ny);
  *max_abs = err;
}

namespace {

std::map<std::string, Tensor> Feeds(const Model& m, const VerifyOptions& o) {
  std::map<std::string, Tensor> feeds = RandomFeeds(m, o.dims, o.seed);
  for (const auto& [name, t] : o.feeds) {
    GAF_CHECK(feeds.count(name), "input '{}' is not an input of the model", name);
    feeds[name] = t;
  }
  return feeds;
}

}  // namespace

PrecisionReport VerifyPrecision(const Model& fused, const Model& original, const VerifyOptions& o) {
  PrecisionReport r;
  std::map<std::string, Tensor> feeds = Feeds(original, o);
  SessionOptions so;
  so.num_threads = o.threads;
  Session ref(original, so);
  std::vector<Tensor> want = ref.Run(feeds);
  FusedRuntime rt;
  std::unique_ptr<Session> plain;
  Session* s = nullptr;
  if (o.use_kernels) {
    KernelCompiler compiler(o.kernel_cache);
    rt = MakeFusedRuntime(fused, so, compiler, o.dims, "ai.graph_autofusion", o.half_weights);
    s = rt.session.get();
  } else {
    plain = std::make_unique<Session>(fused, so);
    s = plain.get();
  }
  std::map<std::string, Tensor> ffeeds;
  for (const ValueInfo& v : s->inputs()) {
    GAF_CHECK(feeds.count(v.name), "the fused model's input '{}' is not an input of the original", v.name);
    ffeeds[v.name] = feeds[v.name];
  }
  std::vector<std::string> names;
  for (const ValueInfo& v : ref.outputs()) names.push_back(v.name);
  std::vector<Tensor> got = s->Run(ffeeds, names);
  for (size_t i = 0; i < names.size(); ++i) {
    OutputPrecision p;
    p.name = names[i];
    p.same_shape = want[i].shape() == got[i].shape();
    if (p.same_shape) {
      CompareTensors(want[i], got[i], &p.cosine, &p.max_abs_error);
      Tensor d = want[i].CastTo(DataType::kDouble);
      for (int64_t k = 0; k < d.numel(); ++k)
        if (std::isfinite(d.data<double>()[k]))
          p.max_abs_reference = std::max(p.max_abs_reference, std::fabs(d.data<double>()[k]));
    } else {
      p.cosine = -1;
      p.max_abs_error = INFINITY;
    }
    r.min_cosine = std::min(r.min_cosine, p.cosine);
    r.max_abs_error = std::max(r.max_abs_error, p.max_abs_error);
    r.outputs.push_back(p);
  }
  if (rt.kernels) r.kernels = DescribeFusedKernels(*rt.kernels);
  return r;
}

PerformanceReport VerifyPerformance(const Model& fused, const VerifyOptions& o) {
  PerformanceReport r;
  r.repeats = std::max(1, o.repeats);
  r.threads = o.threads;
  std::map<std::string, Tensor> feeds = Feeds(fused, o);
  SessionOptions so;
  so.num_threads = o.threads;
  Session baseline(fused, so);  // functions inlined: the unfused operators
  KernelCompiler compiler(o.kernel_cache);
  FusedRuntime rt = MakeFusedRuntime(fused, so, compiler, o.dims, "ai.graph_autofusion", o.half_weights);
  auto time = [&](Session& s) {
    auto t0 = std::chrono::steady_clock::now();
    s.Run(feeds);
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  time(baseline);  // warm-up
  time(*rt.session);
  std::vector<double> b, f;
  for (int i = 0; i < r.repeats; ++i) {  // interleaved: load changes hit both sides alike
    b.push_back(time(baseline));
    f.push_back(time(*rt.session));
  }
  r.baseline_ms = Median(b);
  r.fused_ms = Median(f);
  r.baseline_noise = RelativeIqr(b);
  r.fused_noise = RelativeIqr(f);
  r.speedup = r.fused_ms > 0 ? r.baseline_ms / r.fused_ms : 0;
  r.kernels = DescribeFusedKernels(*rt.kernels);
  return r;
}

}  // namespace gaf
