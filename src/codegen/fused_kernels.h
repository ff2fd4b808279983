// Fused execution: generated kernels for the fused operators of a model (calls of model-local
// functions in the fused domain), compiled in one batch and plugged into the runtime through
// SessionOptions::function_kernels. A call whose inputs broadcast differently from the shapes the
// kernel was generated for runs the function body instead (still correct, not fused), and the
// count of such fallbacks is kept so reports can say so.
#pragma once

#include <atomic>
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
};

class FusedKernelSet {
 public:
  struct Entry {
    std::string function;      // function (fused op) name
    std::string node;          // the call site (fused node name)
    StagedKernel kernel;
    bool bound = false;        // the kernel is compiled and usable
    std::string status;        // "compiled", "cached", or why there is no kernel
    Graph body;                // fallback
    std::shared_ptr<std::atomic<int64_t>> calls, fallbacks;
    struct LastFallback {
      std::mutex mu;
      std::string reason;  // why the kernel did not fit the last call that ran the body
    };
    std::shared_ptr<LastFallback> last_fallback = std::make_shared<LastFallback>();
  };

  // Generates a kernel per call site of a fused function from the shapes of its inputs (`shapes`: value
  // name -> type and shape, e.g. recorded by one run), compiles all of them in one batch.
  static std::shared_ptr<FusedKernelSet> Build(const Model& model, const std::map<std::string, ValueType>& shapes,
                                               KernelCompiler& compiler, const std::string& domain,
                                               HalfWeights half_weights = HalfWeights::kOff);

  // For SessionOptions::function_kernels (the set must outlive the session).
  std::function<std::optional<KernelInfo>(const Node&, const Function&)> Provider();

  const std::vector<Entry>& entries() const { return entries_; }  // one per call site
  const Entry* EntryForNode(const std::string& node) const;
  const KernelLibrary* library() const { return library_.get(); }

 private:
  std::vector<Entry> entries_;
  std::map<std::string, size_t> by_node_;
  std::shared_ptr<KernelLibrary> library_;
  std::deque<Tensor> constants_;  // keeps constant inputs alive (stable addresses)
};

}  // namespace gaf
