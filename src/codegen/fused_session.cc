#include "codegen/fused_session.h"

#include <fmt/format.h>

#include <algorithm>

#include "codegen/half_weights.h"
#include "cost/cost_model.h"

namespace gaf {

std::vector<CallShapes> RecordCallShapes(const Model& model, const Workload& workload, int num_threads) {
  std::vector<CallShapes> out;
  SessionOptions so;
  so.num_threads = num_threads;
  CallShapes* cur = nullptr;
  so.observer = [&cur](const std::string& name, const Tensor& t) {
    ValueType v{t.dtype(), t.shape(), nullptr};
    const bool integer = t.dtype() == DataType::kInt64 || t.dtype() == DataType::kInt32;
    if (integer && t.numel() <= kMaxShapeDataElements) v.value = std::make_shared<const Tensor>(t);
    (*cur)[name] = std::move(v);
  };
  Session session(model, so);
  for (size_t k = 0; k < workload.samples.size(); ++k) {
    out.emplace_back();
    cur = &out.back();
    for (const auto& [name, t] : workload.samples[k]) {
      ValueType v{t.dtype(), t.shape(), nullptr};
      if ((t.dtype() == DataType::kInt64 || t.dtype() == DataType::kInt32) && t.numel() <= kMaxShapeDataElements)
        v.value = std::make_shared<const Tensor>(t);
      (*cur)[name] = std::move(v);
    }
    try {
      session.Run(workload.samples[k]);
    } catch (const Error& e) {
      throw Error(fmt::format("recording the shapes of the fused calls: run {} of {} ({}) failed: {}", k + 1,
                              workload.samples.size(), workload.source.empty() ? "workload" : workload.source, e.what()));
    }
  }
  return out;
}

std::shared_ptr<FusedKernelSet> CompileFusedKernels(const Model& model, KernelCompiler& compiler, const Workload& workload,
                                                    const std::string& domain, HalfWeights half_weights) {
  return FusedKernelSet::Build(model, RecordCallShapes(model, workload), compiler, domain, half_weights);
}

namespace {

// A session running `kernels` for the fused operators (and float16 weight storage when asked).
FusedRuntime WithSession(const Model& model, SessionOptions options, std::shared_ptr<FusedKernelSet> kernels,
                         HalfWeights half_weights) {
  FusedRuntime rt;
  rt.kernels = std::move(kernels);
  options.function_kernels = rt.kernels->Provider();
  UseHalfWeights(options, half_weights);
  rt.session = std::make_unique<Session>(model, options);
  return rt;
}

}  // namespace

FusedRuntime MakeFusedRuntime(const Model& model, SessionOptions options, KernelCompiler& compiler,
                              const Workload& workload, const std::string& domain, HalfWeights half_weights) {
  return WithSession(model, std::move(options), CompileFusedKernels(model, compiler, workload, domain, half_weights),
                     half_weights);
}

std::shared_ptr<FusedKernelSet> CompileFusedKernels(const Model& model, KernelCompiler& compiler,
                                                    const std::map<std::string, int64_t>& dims,
                                                    const std::string& domain, HalfWeights half_weights) {
  // Random inputs may not run a model whose dims were not bound (the caller has no inputs to give):
  // then no shapes are recorded and each call site generates its variants when first called.
  Workload w;
  w.samples.push_back(RandomFeeds(model, dims));
  w.source = "random inputs";
  std::vector<CallShapes> shapes;
  try {
    shapes = RecordCallShapes(model, w);
  } catch (const Error&) {
    shapes.clear();
  }
  return FusedKernelSet::Build(model, shapes, compiler, domain, half_weights);
}

FusedRuntime MakeFusedRuntime(const Model& model, SessionOptions options, KernelCompiler& compiler,
                              const std::map<std::string, int64_t>& dims, const std::string& domain,
                              HalfWeights half_weights) {
  return WithSession(model, std::move(options), CompileFusedKernels(model, compiler, dims, domain, half_weights),
                     half_weights);
}

std::vector<FusedCallStats> FusedCallSummary(const FusedKernelSet& set) {
  // One row per function and status: its call sites summed (call sites that differ are listed
  // separately).
  std::vector<FusedCallStats> rows;
  for (const auto& e : set.entries()) {
    const bool kernel = e.bound || e.generate_when_called;
    std::string status = e.bound ? e.status + ": " + e.kernel.Describe() : e.status;
    auto it = std::find_if(rows.begin(), rows.end(), [&](const FusedCallStats& r) {
      return r.function == e.function && r.status == status && r.kernel == kernel;
    });
    if (it == rows.end()) {
      FusedCallStats r;
      r.function = e.function;
      r.kernel = kernel;
      r.status = status;
      r.variants = e.Bound().size();
      rows.push_back(r);
      it = rows.end() - 1;
    }
    it->sites++;
    it->calls += e.calls->load();
    it->fallbacks += e.fallbacks->load();
    it->generated_at_run_time += e.JitCompiles();
    it->generation_seconds += e.JitSeconds();
    std::lock_guard<std::mutex> lock(e.last_fallback->mu);
    if (!e.last_fallback->reason.empty()) it->last_fallback = e.last_fallback->reason;
    if (!e.last_fallback->declined.empty()) {
      it->declined_sites++;
      it->declined = e.last_fallback->declined;
    }
  }
  return rows;
}

namespace {

// Call sites whose kernel never ran, with why: those the session ran by the plan instead
// (`plan` true), or the others (no kernel, or every call ran the body).
std::vector<std::string> SitesNotRun(const FusedKernelSet& set, bool plan, std::vector<std::string>* nodes) {
  std::vector<std::string> out;
  for (const auto& e : set.entries()) {
    const int64_t calls = e.calls->load(), fallbacks = e.fallbacks->load();
    const bool no_kernel = !e.bound && !e.generate_when_called;
    std::string declined, reason;
    {
      std::lock_guard<std::mutex> lock(e.last_fallback->mu);
      declined = e.last_fallback->declined;
      reason = e.last_fallback->reason;
    }
    const bool by_plan = !no_kernel && calls == 0 && !declined.empty();
    if (by_plan != plan) continue;
    if (!plan && !no_kernel && !(calls > 0 && fallbacks == calls)) continue;
    const std::string why = by_plan     ? "not called: " + declined
                            : no_kernel ? e.status
                                        : fmt::format("{} call(s), all ran the body: {}", calls, reason);
    out.push_back(fmt::format("{} at {}: {}", e.function, e.node, why.substr(0, 300)));
    if (nodes != nullptr) nodes->push_back(e.node);
  }
  return out;
}

}  // namespace

std::vector<std::string> PlanRunCallSites(const FusedKernelSet& set) { return SitesNotRun(set, true, nullptr); }

std::vector<std::string> IdleCallSites(const FusedKernelSet& set, std::vector<std::string>* nodes, bool with_plan) {
  std::vector<std::string> out = SitesNotRun(set, false, nodes);
  if (with_plan) {
    std::vector<std::string> plan = SitesNotRun(set, true, nodes);
    out.insert(out.end(), plan.begin(), plan.end());
  }
  return out;
}

std::string DescribeFusedKernels(const FusedKernelSet& set) {
  std::string s;
  for (const FusedCallStats& r : FusedCallSummary(set)) {
    std::string extra;
    if (r.variants > 1) extra += fmt::format(" [{} variants]", r.variants);
    if (r.generated_at_run_time > 0)
      extra += fmt::format(" [{} variant(s) generated at run time, {:.1f} s]", r.generated_at_run_time, r.generation_seconds);
    s += fmt::format("  {:<28} {:<6} sites {:>3}  calls {:>6}: kernel {:>6}, body (fallbacks) {:>4}  {}{}\n", r.function,
                     r.kernel ? "kernel" : "body", r.sites, r.calls, r.kernel ? r.KernelCalls() : 0, r.fallbacks,
                     r.status, extra);
    if (!r.last_fallback.empty()) s += fmt::format("      last fallback: {}\n", r.last_fallback.substr(0, 300));
    if (r.declined_sites > 0)
      s += fmt::format("      {} site(s) not called: {}\n", r.declined_sites, r.declined.substr(0, 300));
  }
  return s;
}

}  // namespace gaf
