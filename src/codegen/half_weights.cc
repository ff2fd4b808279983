#include "codegen/half_weights.h"

#include <limits>
#include <map>
#include <mutex>
#include <vector>

#include "ops/gemm.h"
#include "ops/gemv.h"

namespace gaf {

bool ModelRequestsHalfWeights(const Model& model) {
  for (const auto& [k, v] : model.metadata_props)
    if (k == kHalfWeightsMetadataKey) return true;
  return false;
}

KernelInfo HalfWeightMatMulKernel(const Tensor& weight, HalfWeights mode) {
  GAF_CHECK(weight.dtype() == DataType::kFloat && weight.shape().size() == 2, "float16 weight storage needs a float32 [K,N] weight");
  const int64_t K = weight.shape()[0], N = weight.shape()[1];
  auto half = std::make_shared<std::vector<uint16_t>>(static_cast<size_t>(K * N));
  ConvertToHalf(weight.data<float>(), half->data(), K * N);
  const KernelInfo* reference = OpRegistry::Global().Find("", "MatMul");
  KernelInfo info;
  info.domain = "";
  info.op_type = "MatMul";
  info.kind = OpKind::kContraction;
  info.upcast_half = true;
  const int64_t max_rows = mode == HalfWeights::kAll ? std::numeric_limits<int64_t>::max() : 4;
  // Prompts on the float32 weight, packed once on first use (PreparedMatMul, as without float16).
  auto prepared = K * N >= kPackedMatMulMinWeight ? std::make_shared<PreparedMatMul>(weight) : nullptr;
  info.fn = [half, K, N, reference, max_rows, prepared](KernelContext& ctx) {
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    if (a.dtype() != DataType::kFloat || a.shape().empty() || a.shape().back() != K || b.shape() != Shape{K, N}) {
      reference->fn(ctx);
      return;
    }
    const int64_t M = a.numel() / K;
    if (M > max_rows && !prepared) {
      reference->fn(ctx);
      return;
    }
    if (M > max_rows) {
      // Several rows (a prompt) are compute-bound, not bandwidth-bound: the float32 weight's
      // prepared products (panels, or oneDNN's matmul for long prompts) are faster there than
      // widening float16 tiles.
      Shape out = a.shape();
      out.back() = N;
      ctx.outputs[0] = Tensor::Uninitialized(DataType::kFloat, out);
      prepared->Run(a.data<float>(), M, ctx.outputs[0].data<float>());
      return;
    }
    Shape out = a.shape();
    out.back() = N;
    ctx.outputs[0] = Tensor(DataType::kFloat, out);
    if (M == 1) GemvF16(a.data<float>(), half->data(), N, ctx.outputs[0].data<float>(), K, N, false);
    else MatMulF16Weight(a.data<float>(), half->data(), ctx.outputs[0].data<float>(), M, K, N);
  };
  return info;
}

std::function<std::optional<KernelInfo>(const Node&, const Model&)> HalfWeightProvider(HalfWeights mode) {
  auto cache = std::make_shared<std::map<std::string, KernelInfo>>();
  auto mu = std::make_shared<std::mutex>();
  return [cache, mu, mode](const Node& n, const Model& m) -> std::optional<KernelInfo> {
    if (n.op_type != "MatMul" || !n.domain.empty() || n.inputs.size() != 2) return std::nullopt;
    const Tensor* w = m.graph.FindInitializer(n.inputs[1]);
    if (w == nullptr || w->dtype() != DataType::kFloat || w->shape().size() != 2) return std::nullopt;
    for (const ValueInfo& v : m.graph.inputs)  // an IR < 4 default a feed may override: not a constant
      if (v.name == n.inputs[1]) return std::nullopt;
    std::lock_guard<std::mutex> lock(*mu);
    auto it = cache->find(n.inputs[1]);
    if (it == cache->end()) it = cache->emplace(n.inputs[1], HalfWeightMatMulKernel(*w, mode)).first;
    return it->second;
  };
}

}  // namespace gaf
