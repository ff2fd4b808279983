#include "codegen/verify.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>
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

Workload WorkloadOf(const Model& m, const VerifyOptions& o) {
  if (!o.workload.empty()) return o.workload;
  Workload w;
  Feeds feeds = RandomFeeds(m, o.dims, o.seed);
  for (const auto& [name, t] : o.feeds) {
    GAF_CHECK(feeds.count(name), "input '{}' is not an input of the model", name);
    feeds[name] = t;
  }
  w.samples.push_back(std::move(feeds));
  w.source = o.feeds.empty() ? "random inputs" : "inputs given";
  return w;
}

// The feeds of a sample that are inputs of session `s` (a fused model may have dropped one).
Feeds InputsOf(const Session& s, const Feeds& sample, const char* which) {
  Feeds out;
  for (const ValueInfo& v : s.inputs()) {
    auto it = sample.find(v.name);
    GAF_CHECK(it != sample.end(), "the {} model's input '{}' is not in the workload", which, v.name);
    out[v.name] = it->second;
  }
  return out;
}

}  // namespace

PrecisionReport VerifyPrecision(const Model& fused, const Model& original, const VerifyOptions& o) {
  PrecisionReport r;
  const Workload w = WorkloadOf(original, o);
  r.samples = static_cast<int>(w.samples.size());
  r.workload = w.source;
  SessionOptions so;
  so.num_threads = o.threads;
  so.rewrite_products = o.plan_rewrites;
  Session ref(original, so);
  FusedRuntime rt;
  std::unique_ptr<Session> plain;
  Session* s = nullptr;
  if (o.use_kernels) {
    KernelCompiler compiler(o.kernel_cache);
    rt = MakeFusedRuntime(fused, so, compiler, w, "ai.graph_autofusion", o.half_weights);
    s = rt.session.get();
  } else {
    plain = std::make_unique<Session>(fused, so);
    s = plain.get();
  }
  std::vector<std::string> names;
  for (const ValueInfo& v : ref.outputs()) names.push_back(v.name);
  r.outputs.resize(names.size());
  for (size_t i = 0; i < names.size(); ++i) r.outputs[i].name = names[i];
  for (const Feeds& sample : w.samples) {
    std::vector<Tensor> want = ref.Run(InputsOf(ref, sample, "original"));
    std::vector<Tensor> got = s->Run(InputsOf(*s, sample, "fused"), names);
    for (size_t i = 0; i < names.size(); ++i) {
      OutputPrecision& p = r.outputs[i];
      double cs = 1, err = 0;
      if (want[i].shape() == got[i].shape()) {
        CompareTensors(want[i], got[i], &cs, &err);
        Tensor d = want[i].CastTo(DataType::kDouble);
        for (int64_t k = 0; k < d.numel(); ++k)
          if (std::isfinite(d.data<double>()[k]))
            p.max_abs_reference = std::max(p.max_abs_reference, std::fabs(d.data<double>()[k]));
      } else {
        p.same_shape = false;
        cs = -1;
        err = INFINITY;
      }
      p.cosine = std::min(p.cosine, cs);
      p.max_abs_error = std::max(p.max_abs_error, err);
    }
  }
  for (const OutputPrecision& p : r.outputs) {
    r.min_cosine = std::min(r.min_cosine, p.cosine);
    r.max_abs_error = std::max(r.max_abs_error, p.max_abs_error);
  }
  if (rt.kernels) {
    r.kernels = DescribeFusedKernels(*rt.kernels);
    r.calls = FusedCallSummary(*rt.kernels);
    r.never_ran = IdleCallSites(*rt.kernels, nullptr, /*with_plan=*/false);
    r.run_by_plan = PlanRunCallSites(*rt.kernels);
  }
  return r;
}

PerformanceReport VerifyPerformance(const Model& fused, const VerifyOptions& o) {
  PerformanceReport r;
  r.repeats = std::max(1, o.repeats);
  r.threads = o.threads;
  const Workload w = WorkloadOf(o.original != nullptr ? *o.original : fused, o);
  SessionOptions so;
  so.num_threads = o.threads;
  so.rewrite_products = o.plan_rewrites;
  // Baseline: the original model, or the fused model with its functions inlined (the unfused operators).
  Session baseline(o.original != nullptr ? *o.original : fused, so);
  r.baseline = o.original != nullptr ? "original model" : "fused model with its functions inlined";
  KernelCompiler compiler(o.kernel_cache);
  FusedRuntime rt;
  rt.kernels = CompileFusedKernels(fused, compiler, w, "ai.graph_autofusion", o.half_weights);
  if (o.kernel_hook) rt.kernels->SetCallHook(o.kernel_hook);
  {
    SessionOptions fo = so;
    fo.function_kernels = rt.kernels->Provider();
    UseHalfWeights(fo, o.half_weights);
    rt.session = std::make_unique<Session>(fused, fo);
  }
  std::vector<Feeds> base_feeds, fused_feeds;
  for (const Feeds& sample : w.samples) {
    base_feeds.push_back(InputsOf(baseline, sample, "baseline"));
    fused_feeds.push_back(InputsOf(*rt.session, sample, "fused"));
  }
  auto time = [&](Session& s, const std::vector<Feeds>& feeds) {
    auto t0 = std::chrono::steady_clock::now();
    for (const Feeds& f : feeds) s.Run(f);
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  time(baseline, base_feeds);  // warm-up (also generates any variant the recording missed)
  time(*rt.session, fused_feeds);
  std::vector<double> b, f;
  for (int i = 0; i < r.repeats; ++i) {  // interleaved: load changes hit both sides alike
    // Alternate which side goes first, so neither always runs on a cache the other warmed.
    if (i % 2 == 0) {
      b.push_back(time(baseline, base_feeds));
      f.push_back(time(*rt.session, fused_feeds));
    } else {
      f.push_back(time(*rt.session, fused_feeds));
      b.push_back(time(baseline, base_feeds));
    }
  }
  r.baseline_ms = Median(b);
  r.fused_ms = Median(f);
  r.baseline_noise = RelativeIqr(b);
  r.fused_noise = RelativeIqr(f);
  r.speedup = r.fused_ms > 0 ? r.baseline_ms / r.fused_ms : 0;
  for (size_t i = 0; i < b.size(); ++i) r.pairs_won += f[i] < b[i];
  r.pairs_needed = SignTestWins(static_cast<int>(b.size()), 0.01);
  r.kernels = DescribeFusedKernels(*rt.kernels);
  r.calls = FusedCallSummary(*rt.kernels);
  IdleCallSites(*rt.kernels, &r.idle_nodes);
  return r;
}

}  // namespace gaf
