// Fused execution: generated kernels for the fused operators of a model (calls of model-local
// functions in the fused domain), compiled in one batch and plugged into the runtime through
// SessionOptions::function_kernels.
//
// A call site has one or more *variants*: kernels generated for the broadcast classes its inputs
// take in the workload (a decoder's prefill and decode calls, images of several sizes). The code
// depends on those classes and on dtypes, never on the sizes of symbolic dims (rows, row length,
// past length are runtime arguments), so one variant serves every shape of its class. Small integer
// inputs that only feed shape computation (a Slice's ends computed from a Shape) are folded into
// the code, and the variant is guarded by their values. A call that no variant covers gets a new
// one generated, compiled (cached) and added while it waits; the function body runs only where no
// kernel can be generated, and the count and reason of those calls are kept for reports.
#pragma once

#include <atomic>
#include <functional>
#include <optional>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "codegen/compiler.h"
#include "codegen/row_kernel.h"
#include "codegen/staged_kernel.h"
#include "ir/graph.h"
#include "runtime/session.h"

namespace gaf {

struct ValueType {
  DataType dtype = DataType::kUndefined;
  Shape shape;
  // The value, for small integer tensors (shape data such as a Slice's computed ends); else null.
  std::shared_ptr<const Tensor> value;
};
// Type, shape (and small integer values) of the values of one run, by name.
using CallShapes = std::map<std::string, ValueType>;

// Small integer tensors whose values a kernel may be specialized on (at most this many elements).
inline constexpr int64_t kMaxShapeDataElements = 64;

// One kernel of a call site, for one combination of broadcast classes (and shape-data values).
struct KernelVariant {
  StagedKernel kernel;
  // Inputs folded into the code by value (integer shape data): the variant fits a call only when
  // these inputs hold these values.
  std::vector<std::pair<size_t, Tensor>> guards;
  std::shared_ptr<KernelLibrary> library;  // the library its row stages live in (kept loaded)
  bool jit = false;                        // generated at run time for a call no variant covered
};

class FusedKernelSet {
 public:
  struct Entry {
    std::string function;      // function (fused op) name
    std::string node;          // the call site (fused node name)
    StagedKernel kernel;       // the first variant (what reports describe)
    bool bound = false;        // at least one variant is compiled and usable
    bool generate_when_called = false;  // no recorded shapes: variants are generated at the first calls
    std::string status;        // "compiled", "cached", or why there is no kernel
    Graph body;                // fallback
    std::shared_ptr<std::atomic<int64_t>> calls, fallbacks;
    struct LastFallback {
      std::mutex mu;
      std::string reason;  // why the kernel did not fit the last call that ran the body
      // Why a session ran the call another way than by its kernel (KernelInfo::declined): the
      // runtime's plan rewrites its body into its own operators (runtime/plan_calls.h).
      std::string declined;
    };
    std::shared_ptr<LastFallback> last_fallback = std::make_shared<LastFallback>();
    // Variants, and what is needed to generate another at run time.
    struct Variants;
    std::shared_ptr<Variants> variants;

    // The bound variants (a snapshot: variants added later are not in it).
    std::vector<std::shared_ptr<const KernelVariant>> Bound() const;
    int64_t JitCompiles() const;          // variants generated at run time
    double JitSeconds() const;            // time spent generating and compiling them
    // Runs the call with a variant that fits the inputs, generating one when none does and
    // `generate` is true. Returns false, with `reason`, when no kernel can run the call (the
    // caller runs the body). Inputs are float32 where the body has half types (widened).
    // `used`: the index in Bound() of the variant that ran.
    bool Run(const std::vector<const Tensor*>& inputs, int num_threads, bool generate, std::vector<Tensor>* outputs,
             std::string* reason, size_t* used = nullptr) const;
  };

  // Generates the variants of every call site of a fused function from the types and shapes its
  // inputs had in each run of `samples` (value name -> type and shape, e.g. recorded by runs of the
  // workload), compiles all of them in one batch. `compiler` is kept for variants generated at
  // run time (its cache root).
  static std::shared_ptr<FusedKernelSet> Build(const Model& model, const std::vector<CallShapes>& samples,
                                               KernelCompiler& compiler, const std::string& domain,
                                               HalfWeights half_weights = HalfWeights::kOff);
  static std::shared_ptr<FusedKernelSet> Build(const Model& model, const CallShapes& shapes, KernelCompiler& compiler,
                                               const std::string& domain, HalfWeights half_weights = HalfWeights::kOff) {
    return Build(model, std::vector<CallShapes>{shapes}, compiler, domain, half_weights);
  }

  // For SessionOptions::function_kernels (the set must outlive the session).
  std::function<std::optional<KernelInfo>(const Node&, const Function&)> Provider();
  // Test hook: called with the function name before every kernel call the Provider makes (a
  // deliberately slow kernel, to test the gates that must catch one). Set before sessions run.
  void SetCallHook(std::function<void(const std::string& function)> hook) { hook_ = std::move(hook); }

  const std::vector<Entry>& entries() const { return entries_; }  // one per call site
  const Entry* EntryForNode(const std::string& node) const;
  const KernelLibrary* library() const { return library_.get(); }

 private:
  std::vector<Entry> entries_;
  std::map<std::string, size_t> by_node_;
  std::shared_ptr<KernelLibrary> library_;
  std::deque<Tensor> constants_;  // keeps constant inputs alive (stable addresses)
  std::function<void(const std::string&)> hook_;
};

// Whether input `i` of a call of `f` only feeds shape computation in the body (a Slice's starts or
// ends, a Reshape's shape, axes, an Expand's shape): an integer input there may be folded into
// the code by value.
bool FeedsOnlyShapeData(const Function& f, size_t i);

}  // namespace gaf
