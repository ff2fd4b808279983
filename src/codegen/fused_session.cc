#include "codegen/fused_session.h"

#include <fmt/format.h>

#include <algorithm>

#include "codegen/half_weights.h"
#include "cost/cost_model.h"

namespace gaf {

std::shared_ptr<FusedKernelSet> CompileFusedKernels(const Model& model, KernelCompiler& compiler,
                                                    const std::map<std::string, int64_t>& dims,
                                                    const std::string& domain, HalfWeights half_weights) {
  std::map<std::string, ValueType> shapes;
  for (const auto& [name, vs] : RecordShapes(model, dims))
    if (vs.known) shapes[name] = ValueType{vs.dtype, vs.shape};
  return FusedKernelSet::Build(model, shapes, compiler, domain, half_weights);
}

FusedRuntime MakeFusedRuntime(const Model& model, SessionOptions options, KernelCompiler& compiler,
                              const std::map<std::string, int64_t>& dims, const std::string& domain,
                              HalfWeights half_weights) {
  FusedRuntime rt;
  rt.kernels = CompileFusedKernels(model, compiler, dims, domain, half_weights);
  options.function_kernels = rt.kernels->Provider();
  if (half_weights != HalfWeights::kOff) options.node_kernels = HalfWeightProvider(half_weights);
  rt.session = std::make_unique<Session>(model, options);
  return rt;
}

std::string DescribeFusedKernels(const FusedKernelSet& set) {
  // One line per function: its call sites summed; the status and stages of its first call site
  // (call sites that differ are listed separately).
  struct Row {
    std::string function, state, status, last_fallback;
    int sites = 0;
    int64_t calls = 0, fallbacks = 0;
  };
  std::vector<Row> rows;
  for (const auto& e : set.entries()) {
    std::string status = e.bound ? e.status + ": " + e.kernel.Describe() : e.status;
    std::string state = e.bound ? "kernel" : "body";
    auto it = std::find_if(rows.begin(), rows.end(), [&](const Row& r) {
      return r.function == e.function && r.status == status && r.state == state;
    });
    if (it == rows.end()) {
      rows.push_back({e.function, state, status});
      it = rows.end() - 1;
    }
    it->sites++;
    it->calls += e.calls->load();
    it->fallbacks += e.fallbacks->load();
    std::lock_guard<std::mutex> lock(e.last_fallback->mu);
    if (!e.last_fallback->reason.empty()) it->last_fallback = e.last_fallback->reason;
  }
  std::string s;
  for (const Row& r : rows)
  {
    s += fmt::format("  {:<28} {:<6} sites {:>3}  calls {:>6}  fallbacks {:>4}  {}\n", r.function, r.state, r.sites, r.calls,
                     r.fallbacks, r.status);
    if (!r.last_fallback.empty()) s += fmt::format("      last fallback: {}\n", r.last_fallback.substr(0, 300));
  }
  return s;
}

}  // namespace gaf
