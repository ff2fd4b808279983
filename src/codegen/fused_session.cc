#include "codegen/fused_session.h"

#include <fmt/format.h>

#include "cost/cost_model.h"

namespace gaf {

std::shared_ptr<FusedKernelSet> CompileFusedKernels(const Model& model, KernelCompiler& compiler,
                                                    const std::map<std::string, int64_t>& dims,
                                                    const std::string& domain) {
  std::map<std::string, ValueType> shapes;
  for (const auto& [name, vs] : RecordShapes(model, dims))
    if (vs.known) shapes[name] = ValueType{vs.dtype, vs.shape};
  return FusedKernelSet::Build(model, shapes, compiler, domain);
}

FusedRuntime MakeFusedRuntime(const Model& model, SessionOptions options, KernelCompiler& compiler,
                              const std::map<std::string, int64_t>& dims, const std::string& domain) {
  FusedRuntime rt;
  rt.kernels = CompileFusedKernels(model, compiler, dims, domain);
  options.function_kernels = rt.kernels->Provider();
  rt.session = std::make_unique<Session>(model, options);
  return rt;
}

std::string DescribeFusedKernels(const FusedKernelSet& set) {
  std::string s;
  for (const auto& e : set.entries())
    s += fmt::format("  {:<36} {:<10} calls {:>6}  fallbacks {:>4}  {}\n", e.function,
                     e.bound ? "kernel" : "body", e.calls->load(), e.fallbacks->load(),
                     e.bound ? e.status + ": " + e.kernel.Describe() : e.status);
  return s;
}

}  // namespace gaf
