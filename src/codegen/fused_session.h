// A session that runs a fused model's fused operators with generated kernels: records the shapes
// of one run (cost/RecordShapes), generates one kernel per fused function, compiles them all in one
// batch (cached), and plugs them into a Session. `CompileFusedOperators` of the API is this without
// the session.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "codegen/compiler.h"
#include "codegen/fused_kernels.h"
#include "runtime/session.h"

namespace gaf {

struct FusedRuntime {
  std::shared_ptr<FusedKernelSet> kernels;
  std::unique_ptr<Session> session;
};

// Generates and compiles the kernels of every fused operator (domain `domain`) of `model`.
std::shared_ptr<FusedKernelSet> CompileFusedKernels(const Model& model, KernelCompiler& compiler,
                                                    const std::map<std::string, int64_t>& dims = {},
                                                    const std::string& domain = "ai.graph_autofusion",
                                                    HalfWeights half_weights = HalfWeights::kOff);

// The same plus a session running them. half_weights: float16 weight storage for every MatMul
// with a constant [K,N] weight, inside fused kernels and elsewhere (codegen/half_weights.h).
FusedRuntime MakeFusedRuntime(const Model& model, SessionOptions options, KernelCompiler& compiler,
                              const std::map<std::string, int64_t>& dims = {},
                              const std::string& domain = "ai.graph_autofusion", HalfWeights half_weights = HalfWeights::kOff);

// One line per fused function: name, status (compiled / cached / why not), calls and fallbacks.
std::string DescribeFusedKernels(const FusedKernelSet& set);

}  // namespace gaf
