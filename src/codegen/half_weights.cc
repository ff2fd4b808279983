#include "codegen/half_weights.h"

#include <limits>
#include <map>
#include <mutex>
#include <vector>

#include "ops/gemm.h"
#include "ops/panel_gemm.h"
#include "runtime/plan_rewrite.h"

namespace gaf {

bool ModelRequestsHalfWeights(const Model& model) {
  for (const auto& [k, v] : model.metadata_props)
    if (k == kHalfWeightsMetadataKey) return true;
  return false;
}

namespace {

// A float32 [K, N] weight with its float16 panels (ops/panel_gemm.h), made once, for every row
// count the mode puts on float16 (HalfWeights::kAll: all; kDecode: a decode step's, up to
// kHalfPanelMaxRows), and for kDecode the float32 weight's prepared products for prompts. kAll
// holds no float32 copy: a session with float16 weights then holds the model's float32 weights and
// their float16 panels, not also the float32 panels a prompt would make.
struct HalfCopy {
  int64_t K, N;
  std::unique_ptr<HalfPanelWeight> panels;
  std::shared_ptr<PreparedMatMul> prepared;  // kDecode, from kPackedMatMulMinWeight elements
};

// panels false: no panel copy (a gate pair's weights stream from the pair's copy).
std::shared_ptr<HalfCopy> MakeHalfCopy(const Tensor& weight, HalfWeights mode, bool panels = true) {
  GAF_CHECK(weight.dtype() == DataType::kFloat && weight.shape().size() == 2, "float16 weight storage needs a float32 [K,N] weight");
  auto c = std::make_shared<HalfCopy>();
  c->K = weight.shape()[0];
  c->N = weight.shape()[1];
  if (panels) c->panels = std::make_unique<HalfPanelWeight>(weight.data<float>(), c->K, c->N);
  if (mode != HalfWeights::kAll && c->K * c->N >= kPackedMatMulMinWeight)
    c->prepared = std::make_shared<PreparedMatMul>(weight);
  return c;
}

// kDecode puts on float16 exactly the rows the panels stream (a decode step's).
int64_t MaxHalfRows(HalfWeights mode) {
  return mode == HalfWeights::kAll ? std::numeric_limits<int64_t>::max() : kHalfPanelMaxRows;
}

KernelInfo MatMulKernelOf(std::shared_ptr<HalfCopy> c, HalfWeights mode) {
  const KernelInfo* reference = OpRegistry::Global().Find("", "MatMul");
  KernelInfo info;
  info.domain = "";
  info.op_type = "MatMul";
  info.kind = OpKind::kContraction;
  info.upcast_half = true;
  const int64_t max_rows = MaxHalfRows(mode);
  info.fn = [c, reference, max_rows](KernelContext& ctx) {
    const int64_t K = c->K, N = c->N;
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    if (a.dtype() != DataType::kFloat || a.shape().empty() || a.shape().back() != K || b.shape() != Shape{K, N}) {
      reference->fn(ctx);
      return;
    }
    const int64_t M = a.numel() / K;
    if ((M > max_rows && !c->prepared) || M == 0 || !c->panels) {
      reference->fn(ctx);
      return;
    }
    Shape out = a.shape();
    out.back() = N;
    ctx.outputs[0] = Tensor::Uninitialized(DataType::kFloat, out);
    if (M > max_rows) {
      // Several rows (a prompt) are compute-bound, not bandwidth-bound: the float32 weight's
      // prepared products (panels, or oneDNN's matmul for long prompts) are faster there than
      // widening float16 tiles.
      c->prepared->Run(a.data<float>(), M, ctx.outputs[0].data<float>());
      return;
    }
    const HalfPanelProduct p{c->panels.get(), ctx.outputs[0].data<float>()};
    HalfPanelGemmMany(a.data<float>(), M, K, &p, 1);
  };
  return info;
}

// SiblingMatMul(A, W_1..W_n) of the plan (runtime/plan_rewrite.h): calls of at most max_rows rows
// run every float16 copy in one set of tasks (HalfPanelGemmMany); longer ones (kDecode's prompts)
// take the float32 weights' prepared sibling kernel, as without float16 storage.
KernelInfo SiblingKernelOf(std::vector<std::shared_ptr<HalfCopy>> cs, HalfWeights mode) {
  std::vector<std::shared_ptr<PreparedMatMul>> prepared;
  for (const auto& c : cs) prepared.push_back(c->prepared);
  KernelInfo info = PreparedSiblingMatMulKernel(prepared);
  const int64_t max_rows = MaxHalfRows(mode);
  info.fn = [cs, max_rows, prompt = info.fn](KernelContext& ctx) {
    const Tensor& a = ctx.input(0);
    const int64_t K = cs.front()->K;
    bool ok = a.dtype() == DataType::kFloat && !a.shape().empty() && a.shape().back() == K &&
              ctx.num_inputs() == cs.size() + 1;
    for (size_t i = 0; ok && i < cs.size(); ++i) ok = ctx.input(1 + i).shape() == Shape{K, cs[i]->N};
    const int64_t M = ok && K > 0 ? a.numel() / K : 0;
    if (!ok || M < 1 || M > max_rows) return prompt(ctx);
    for (size_t i = 0; i < cs.size(); ++i) {
      Shape s = a.shape();
      s.back() = cs[i]->N;
      ctx.outputs[i] = Tensor::Uninitialized(DataType::kFloat, s);
    }
    std::vector<HalfPanelProduct> ps;
    for (size_t i = 0; i < cs.size(); ++i) ps.push_back({cs[i]->panels.get(), ctx.outputs[i].data<float>()});
    HalfPanelGemmMany(a.data<float>(), M, K, ps.data(), static_cast<int>(ps.size()));
  };
  return info;
}

// GatedMatMul(A, W_gate, W_up) of the plan (SiLU(A W_gate) * (A W_up)): calls of at most max_rows
// rows run on one float16 copy of the pair (HalfPanelWeight::GatePair) and apply the gate in each
// task; longer ones (kDecode's prompts) the float32 weights' prepared gated kernel.
KernelInfo GatedKernelOf(const Tensor& wg, const Tensor& wu, std::shared_ptr<HalfCopy> g, std::shared_ptr<HalfCopy> u,
                         HalfWeights mode) {
  const KernelInfo* reference = OpRegistry::Global().Find(kPlanDomain, "GatedMatMul");
  KernelInfo info = *reference;
  std::function<void(KernelContext&)> prompt = reference->fn;
  if (g->prepared && u->prepared) prompt = PreparedGatedMatMulKernel(g->prepared, u->prepared).fn;
  auto pair = std::make_shared<HalfPanelWeight>(HalfPanelWeight::GatePair(wg.data<float>(), wu.data<float>(), g->K, g->N));
  const int64_t max_rows = MaxHalfRows(mode);
  info.fn = [g, u, pair, max_rows, prompt](KernelContext& ctx) {
    const Tensor& a = ctx.input(0);
    const int64_t K = g->K, F = g->N;
    const bool ok = a.dtype() == DataType::kFloat && !a.shape().empty() && a.shape().back() == K &&
                    ctx.num_inputs() == 3 && ctx.input(1).shape() == Shape{K, F} && ctx.input(2).shape() == Shape{K, F};
    const int64_t M = ok && K > 0 ? a.numel() / K : 0;
    if (!ok || M < 1 || M > max_rows) return prompt(ctx);
    Shape s = a.shape();
    s.back() = F;
    ctx.outputs[0] = Tensor::Uninitialized(DataType::kFloat, s);
    const HalfPanelProduct p{pair.get(), ctx.outputs[0].data<float>(), F};
    HalfPanelGemmMany(a.data<float>(), M, K, &p, 1);
  };
  return info;
}

// ResidualMatMul(A, W, R [, eps [, gamma]]) of the plan (a residual Add after the product, perhaps
// with the RMSNorm of the sum: runtime/plan_rewrite.h): calls of at most max_rows rows run the
// float16 copy, then the addend and the norm in one pass over the rows (ResidualMatMulKernelOf);
// longer ones (kDecode's prompts) the float32 weight's prepared residual product. An addend that
// broadcasts takes the float16 product, then the node's fallback graph past its MatMul, so that
// every product of a kAll session streams float16 weights as the MatMul alone did.
KernelInfo ResidualKernelOf(std::shared_ptr<HalfCopy> c, const Node& n, HalfWeights mode) {
  const int64_t max_rows = MaxHalfRows(mode);
  ResidualProduct f32;
  if (c->prepared) f32 = PreparedResidualProduct(c->prepared);
  ResidualProduct p;
  p.K = c->K;
  p.N = c->N;
  p.takes = [c, max_rows, f32](int64_t M) { return M <= max_rows ? c->panels != nullptr : f32.run != nullptr; };
  // y = a W on the float16 panels, M >= 1 rows.
  auto half = [c](const float* a, int64_t M, float* y) {
    const HalfPanelProduct hp{c->panels.get(), y};
    HalfPanelGemmMany(a, M, c->K, &hp, 1);
  };
  p.run = [max_rows, f32, half](const float* a, int64_t M, float* y, const float* add) {
    if (M > max_rows) return f32.run(a, M, y, add);
    half(a, M, y);
    return false;
  };
  // The fallback graph {MatMul(A, W), Add, [RMSNorm]} on (A, W, R [, eps, gamma]) without its
  // MatMul: the product becomes its first input.
  std::shared_ptr<const Graph> rest;
  const Graph* g = n.GetGraph("fallback");
  if (g != nullptr && g->nodes.size() >= 2 && g->nodes[0].op_type == "MatMul" && g->nodes[0].outputs.size() == 1 &&
      g->inputs.size() >= 3) {
    auto r = std::make_shared<Graph>(*g);
    const std::string product = r->nodes[0].outputs[0];
    r->nodes.erase(r->nodes.begin());
    r->inputs.erase(r->inputs.begin(), r->inputs.begin() + 2);
    r->inputs.insert(r->inputs.begin(), ValueInfo{product});
    rest = std::move(r);
  }
  const KernelInfo* reference = OpRegistry::Global().Find(kPlanDomain, "ResidualMatMul");
  // (No rows: the registry's kernel makes the empty result.)
  p.broadcast = [c, max_rows, rest, half, fallback = reference->fn](KernelContext& ctx, int64_t M) {
    if (M < 1 || M > max_rows || rest == nullptr || ctx.subgraphs == nullptr || !c->panels) return fallback(ctx);
    Shape s = ctx.input(0).shape();
    s.back() = c->N;
    Tensor product = Tensor::Uninitialized(DataType::kFloat, s);
    half(ctx.input(0).data<float>(), M, product.data<float>());
    std::vector<Tensor> ins = {std::move(product)};
    for (size_t i = 2; i < ctx.num_inputs(); ++i) ins.push_back(ctx.input(i));
    std::vector<Tensor> out = ctx.subgraphs->RunSubgraph(*rest, ins);
    GAF_CHECK(out.size() == ctx.num_outputs(), "{}: its fallback past the product gave {} outputs", ctx.node.Describe(),
              out.size());
    for (size_t i = 0; i < out.size(); ++i) ctx.outputs[i] = std::move(out[i]);
  };
  return ResidualMatMulKernelOf(std::move(p));
}

}  // namespace

KernelInfo HalfWeightMatMulKernel(const Tensor& weight, HalfWeights mode) {
  return MatMulKernelOf(MakeHalfCopy(weight, mode), mode);
}

void UseHalfWeights(SessionOptions& options, HalfWeights mode) {
  if (mode == HalfWeights::kOff) return;
  options.node_kernels = HalfWeightProvider(mode);
  options.node_kernels_take_siblings = true;
  options.node_kernels_take_residuals = true;
}

std::function<std::optional<KernelInfo>(const Node&, const Model&)> HalfWeightProvider(HalfWeights mode) {
  auto copies = std::make_shared<std::map<std::string, std::shared_ptr<HalfCopy>>>();
  auto mu = std::make_shared<std::mutex>();
  return [copies, mu, mode](const Node& n, const Model& m) -> std::optional<KernelInfo> {
    const bool sibling = n.op_type == "SiblingMatMul" && n.domain == kPlanDomain;
    const bool gated = n.op_type == "GatedMatMul" && n.domain == kPlanDomain;
    // ResidualMatMul(A, W, R [, eps [, gamma]]): W the only weight.
    const bool residual = n.op_type == "ResidualMatMul" && n.domain == kPlanDomain;
    if (gated && n.inputs.size() != 3) return std::nullopt;
    if (residual && (n.inputs.size() < 3 || n.inputs.size() > 5)) return std::nullopt;
    if (!sibling && !gated && !residual && (n.op_type != "MatMul" || !n.domain.empty() || n.inputs.size() != 2))
      return std::nullopt;
    if (n.inputs.size() < 2) return std::nullopt;
    std::vector<const Tensor*> ws;
    const size_t weights_end = residual ? 2 : n.inputs.size();
    for (size_t i = 1; i < weights_end; ++i) {
      const Tensor* w = m.graph.FindInitializer(n.inputs[i]);
      if (w == nullptr || w->dtype() != DataType::kFloat || w->shape().size() != 2) return std::nullopt;
      for (const ValueInfo& v : m.graph.inputs)  // an IR < 4 default a feed may override: not a constant
        if (v.name == n.inputs[i]) return std::nullopt;
      if (!ws.empty() && ws.front()->shape()[0] != w->shape()[0]) return std::nullopt;
      ws.push_back(w);
    }
    if (gated && ws[0]->shape() != ws[1]->shape()) return std::nullopt;
    std::lock_guard<std::mutex> lock(*mu);
    std::vector<std::shared_ptr<HalfCopy>> cs;
    for (size_t i = 0; i < ws.size(); ++i) {
      // A gate pair's weights have no panel copies of their own (a separate entry).
      const std::string key = gated ? n.inputs[1 + i] + "#gated" : n.inputs[1 + i];
      auto it = copies->find(key);
      if (it == copies->end()) it = copies->emplace(key, MakeHalfCopy(*ws[i], mode, !gated)).first;
      cs.push_back(it->second);
    }
    if (gated) return GatedKernelOf(*ws[0], *ws[1], cs[0], cs[1], mode);
    if (residual) return ResidualKernelOf(cs.front(), n, mode);
    return sibling ? SiblingKernelOf(std::move(cs), mode) : MatMulKernelOf(cs.front(), mode);
  };
}

}  // namespace gaf
