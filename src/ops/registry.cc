#include <mutex>

#include "ops/kernel.h"

namespace gaf {

static void RegisterAllKernels(OpRegistry& r) {
  RegisterElementwiseKernels(r);
  RegisterTensorKernels(r);
  RegisterReduceKernels(r);
  RegisterNnKernels(r);
  RegisterRnnKernels(r);
  RegisterControlFlowKernels(r);
  RegisterLossAndQuantKernels(r);
  RegisterPlanKernels(r);
  RegisterCopyKernels(r);
  RegisterSoftmaxEpilogueKernels(r);
  RegisterSiLUGateKernels(r);
  RegisterElementwiseChainKernels(r);
  RegisterAttentionKernels(r);
  RegisterRMSNormKernels(r);
  RegisterRotaryKernels(r);
  RegisterTransformerKernels(r);
  RegisterAttentionOpKernels(r);
}

OpRegistry& OpRegistry::Global() {
  static OpRegistry* registry = [] {
    auto* r = new OpRegistry();
    RegisterAllKernels(*r);
    return r;
  }();
  return *registry;
}

void OpRegistry::Register(KernelInfo info) {
  if (info.domain == "ai.onnx") info.domain.clear();
  for (KernelInfo& k : kernels_) {
    if (k.domain == info.domain && k.op_type == info.op_type) {
      k = std::move(info);  // a later registration replaces an earlier one
      return;
    }
  }
  kernels_.push_back(std::move(info));
}

const KernelInfo* OpRegistry::Find(const std::string& domain, const std::string& op_type) const {
  const std::string d = domain == "ai.onnx" ? std::string() : domain;
  for (const KernelInfo& k : kernels_)
    if (k.domain == d && k.op_type == op_type) return &k;
  return nullptr;
}

std::vector<const KernelInfo*> OpRegistry::All() const {
  std::vector<const KernelInfo*> out;
  for (const KernelInfo& k : kernels_) out.push_back(&k);
  return out;
}

}  // namespace gaf
