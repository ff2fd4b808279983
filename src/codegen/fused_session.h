// A session that runs a fused model's fused operators with generated kernels: records the types
// and shapes of the workload's runs (one or more samples: the user's inputs, a decoder's prefill and
// decode steps), generates the variants of every fused call site, compiles them all in one batch
// (cached), and plugs them into a Session. `CompileFusedOperators` of the API is this without the
// session.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "codegen/compiler.h"
#include "codegen/fused_kernels.h"
#include "cost/workload.h"
#include "runtime/session.h"

namespace gaf {

struct FusedRuntime {
  std::shared_ptr<FusedKernelSet> kernels;
  std::unique_ptr<Session> session;
};

// Types, shapes and small integer values (shape data) of every value of `model` in each run of
// `workload`, on the reference path (fused calls run their bodies). gaf::Error naming the sample
// when a run fails.
std::vector<CallShapes> RecordCallShapes(const Model& model, const Workload& workload, int num_threads = 0);

// Generates and compiles the kernels of every fused operator (domain `domain`) of `model`, with a
// variant for each broadcast class its calls take in `workload`.
std::shared_ptr<FusedKernelSet> CompileFusedKernels(const Model& model, KernelCompiler& compiler, const Workload& workload,
                                                    const std::string& domain = "ai.graph_autofusion",
                                                    HalfWeights half_weights = HalfWeights::kOff);
FusedRuntime MakeFusedRuntime(const Model& model, SessionOptions options, KernelCompiler& compiler,
                              const Workload& workload, const std::string& domain = "ai.graph_autofusion",
                              HalfWeights half_weights = HalfWeights::kOff);

// As above on one sample of random inputs (symbolic dims from `dims`, cost/RandomFeeds).
std::shared_ptr<FusedKernelSet> CompileFusedKernels(const Model& model, KernelCompiler& compiler,
                                                    const std::map<std::string, int64_t>& dims = {},
                                                    const std::string& domain = "ai.graph_autofusion",
                                                    HalfWeights half_weights = HalfWeights::kOff);

// The same plus a session running them. half_weights: float16 weight storage for every MatMul
// with a constant [K,N] weight, inside fused kernels and elsewhere (codegen/half_weights.h).
FusedRuntime MakeFusedRuntime(const Model& model, SessionOptions options, KernelCompiler& compiler,
                              const std::map<std::string, int64_t>& dims = {},
                              const std::string& domain = "ai.graph_autofusion", HalfWeights half_weights = HalfWeights::kOff);

// Per fused function (call sites with the same status summed): how its calls ran.
struct FusedCallStats {
  std::string function;
  bool kernel = false;      // a kernel exists (else every call runs the body, inlined)
  std::string status;       // "compiled: <stages>", "cached: ...", or why there is no kernel
  int sites = 0;
  size_t variants = 0;      // of the first site
  int64_t calls = 0;        // calls that reached the kernel hook
  int64_t fallbacks = 0;    // ... of which ran the body
  int64_t generated_at_run_time = 0;
  double generation_seconds = 0;
  std::string last_fallback;  // why the last call that ran the body did
  int declined_sites = 0;     // sites a session ran another way (the runtime's plan), ...
  std::string declined;       // ... and why (KernelInfo::declined)
  // Calls that ran a kernel; a site without a kernel counts none.
  int64_t KernelCalls() const { return calls - fallbacks; }
};
std::vector<FusedCallStats> FusedCallSummary(const FusedKernelSet& set);

// Call sites whose kernel never ran: no kernel (the body runs inlined), every call ran the body, or
// (with `with_plan`) the session ran the call as the runtime's plan rewrote its body
// (runtime/plan_calls.h). One line each: "<function> at <node>: <why>"; `nodes` (optional) gets
// the node names.
std::vector<std::string> IdleCallSites(const FusedKernelSet& set, std::vector<std::string>* nodes = nullptr,
                                       bool with_plan = true);
// Call sites a session ran as the runtime's plan rewrote their bodies instead of by their kernels
// (KernelInfo::declined, never called): "<function> at <node>: <why>".
std::vector<std::string> PlanRunCallSites(const FusedKernelSet& set);

// One line per fused function: name, status (compiled / cached / why not), variants, calls and
// fallbacks (calls that ran the body), variants generated at run time.
std::string DescribeFusedKernels(const FusedKernelSet& set);

}  // namespace gaf
