// Session plan rewrites of epilogues (see plan_rewrite.h): attention's Softmax with its scale
// and mask, attention as one node, SiLU gates.
#include <fmt/format.h>

#include <memory>
#include <unordered_map>
#include <unordered_set>

#include "ops/gemm.h"  // kPackedMatMulMinWeight
#include "runtime/plan_rewrite_util.h"

namespace gaf::plan_rewrite {

// ---- attention's scale and mask folded into its Softmax -> MaskedSoftmax ----

// True when v is a float32 constant of one element (an initializer or a Constant node's value).
// Softmax(Add(Div(X, c) | Mul(X, c), mask)) and the forms without the scale or the mask: one
// MaskedSoftmax (ops/masked_softmax.cc) reading X once, at the Softmax's place.
void FoldSoftmaxEpilogues(Graph& g, int64_t opset, ProductRewrites& stats) {
  const ProductIndex ix(g);
  std::unordered_set<const Node*> absorbed;
  // The scale node making v (Div(X, c) or Mul(X, c) / Mul(c, X), c a constant scalar), read
  // only by its consumer; sets *x, *c and *kind (1 divide, 2 multiply).
  auto scale_of = [&](const std::string& v, std::string* x, std::string* c, int* kind) -> const Node* {
    for (const char* op : {"Div", "Mul"}) {
      const Node* n = ix.SoleProducer(g, v, op);
      if (n == nullptr || n->inputs.size() != 2 || n->outputs.size() != 1) continue;
      for (int k = 0; k < (n->op_type == "Mul" ? 2 : 1); ++k) {
        const std::string& cst = n->inputs[1 - k];
        if (n->inputs[k].empty() || ix.constants.count(n->inputs[k]) || !ConstScalar(g, ix, cst)) continue;
        *x = n->inputs[k];
        *c = cst;
        *kind = n->op_type == "Div" ? 1 : 2;
        return n;
      }
    }
    return nullptr;
  };
  for (Node& sm : g.nodes) {
    if (sm.op_type != "Softmax" || !sm.domain.empty() || sm.inputs.size() != 1 || sm.outputs.size() != 1) continue;
    std::string x = sm.inputs[0], c, mask;
    int kind = 0;
    const Node* add = ix.SoleProducer(g, x, "Add");
    if (add != nullptr && (add->inputs.size() != 2 || add->inputs[0].empty() || add->inputs[1].empty())) add = nullptr;
    const Node* sc = nullptr;
    if (add != nullptr) {
      // X is the side a scale node makes; without one, the first input (a mask that would
      // enlarge it makes the kernel run the fallback).
      int side = 0;
      for (int k = 0; k < 2 && sc == nullptr; ++k)
        if ((sc = scale_of(add->inputs[k], &x, &c, &kind)) != nullptr) side = k;
      if (sc == nullptr) x = add->inputs[0];
      mask = add->inputs[1 - side];
    } else {
      sc = scale_of(x, &x, &c, &kind);
    }
    if (add == nullptr && sc == nullptr) continue;
    auto fallback = std::make_shared<Graph>();
    fallback->name = sm.name + "/fallback";
    std::vector<std::string> formal = {x};
    if (sc != nullptr) formal.push_back(c);
    if (add != nullptr) formal.push_back(mask);
    for (const std::string& f : formal) fallback->inputs.push_back(ValueInfo{f});
    if (sc != nullptr) fallback->nodes.push_back(*sc);
    if (add != nullptr) fallback->nodes.push_back(*add);
    fallback->nodes.push_back(sm);
    fallback->outputs.push_back(ValueInfo{sm.outputs[0]});
    stats.notes.push_back(fmt::format("{}: {}{}the Softmax in one pass over {}", sm.Describe(),
                                      sc != nullptr ? fmt::format("{} by {}, ", sc->op_type, c) : "",
                                      add != nullptr ? fmt::format("Add of {}, ", mask) : "", x));
    ++stats.softmax_epilogues;
    if (sc != nullptr) absorbed.insert(sc);
    if (add != nullptr) absorbed.insert(add);
    const int64_t axis = sm.GetInt("axis", opset < 13 ? 1 : -1);
    sm.op_type = "MaskedSoftmax";
    sm.domain = kPlanDomain;
    sm.inputs = formal;
    sm.attributes = {IntAttr("scale", kind), IntAttr("mask", add != nullptr), IntAttr("axis", axis),
                     FallbackAttr(std::move(fallback))};
  }
  DropNodes(g, absorbed);
}

// ---- Attention: the scores product, MaskedSoftmax and the values product -> FusedAttention ----

// A MaskedSoftmax of a GroupedMatMul's scores (Q·Kᵀ, read by it alone) whose probabilities a
// product by V alone reads (a GroupedMatMul of a repeated cache, or a MatMul): one FusedAttention
// at the values product's place (ops/fused_attention.cc); the three nodes are its fallback.
void FoldAttention(Graph& g, ProductRewrites& stats) {
  const ProductIndex ix(g);
  std::unordered_set<const Node*> absorbed;
  for (Node& pv : g.nodes) {
    const bool grouped = pv.op_type == "GroupedMatMul" && pv.domain == kPlanDomain && pv.GetInt("trans_b", 0) == 0;
    const bool plain = pv.op_type == "MatMul" && pv.domain.empty() && pv.inputs.size() == 2 && pv.outputs.size() == 1;
    if ((!grouped && !plain) || pv.inputs.size() < 2 || pv.inputs[0].empty() || pv.outputs.empty()) continue;
    // A Cast of the probabilities to float between them (Hugging Face's softmax(..., dtype=float32)
    // .to(dtype), as torch.onnx.export writes it for float32 models) is part of the node: a no-op
    // on the float32 inputs its fast paths take, run by the fallback otherwise.
    const Node* cast = ix.SoleProducer(g, pv.inputs[0], "Cast");
    if (cast != nullptr && (cast->inputs.size() != 1 || cast->outputs.size() != 1 ||
                            cast->GetInt("to", 0) != static_cast<int64_t>(DataType::kFloat)))
      cast = nullptr;
    const Node* sm = ix.SoleProducer(g, cast != nullptr ? cast->inputs[0] : pv.inputs[0], "MaskedSoftmax", kPlanDomain);
    if (sm == nullptr || sm->inputs.empty() || sm->outputs.size() != 1) continue;
    const Node* qk = ix.SoleProducer(g, sm->inputs[0], "GroupedMatMul", kPlanDomain);
    if (qk == nullptr || qk->GetInt("trans_b", 0) == 0 || qk->outputs[0] != sm->inputs[0]) continue;
    // The scores product's other outputs (its present cache) move to the values product's place:
    // only the graph's outputs may read them.
    bool moved_read = false;
    for (size_t i = 1; i < qk->outputs.size(); ++i)
      moved_read |= !ix.index.Consumers(qk->outputs[i]).empty() || ix.read_by_subgraphs.count(qk->outputs[i]) > 0;
    if (moved_read) continue;
    std::vector<std::string> formal = qk->inputs, outputs = {pv.outputs[0]};
    formal.insert(formal.end(), sm->inputs.begin() + 1, sm->inputs.end());
    formal.insert(formal.end(), pv.inputs.begin() + 1, pv.inputs.end());
    outputs.insert(outputs.end(), qk->outputs.begin() + 1, qk->outputs.end());
    outputs.insert(outputs.end(), pv.outputs.begin() + 1, pv.outputs.end());
    auto fallback = std::make_shared<Graph>();
    fallback->name = pv.name + "/fallback";
    for (const std::string& f : formal) fallback->inputs.push_back(ValueInfo{f});
    fallback->nodes = {*qk, *sm};
    if (cast != nullptr) fallback->nodes.push_back(*cast);
    fallback->nodes.push_back(pv);
    for (const std::string& o : outputs) fallback->outputs.push_back(ValueInfo{o});
    stats.notes.push_back(fmt::format("{}: attention with '{}' and '{}'{} as one node, in blocks of query rows (the "
                                      "scores never written out, keys the mask removes skipped)",
                                      pv.Describe(), qk->name, sm->name,
                                      cast != nullptr ? fmt::format(" (and the Cast '{}')", cast->name) : ""));
    ++stats.attention_blocks;
    absorbed.insert(qk);
    absorbed.insert(sm);
    if (cast != nullptr) absorbed.insert(cast);
    pv.op_type = "FusedAttention";
    pv.domain = kPlanDomain;
    pv.inputs = formal;
    pv.outputs = outputs;
    pv.attributes = {FallbackAttr(std::move(fallback))};
  }
  DropNodes(g, absorbed);
}

// ---- Transpose(FusedAttention, perm 0 2 1 3) -> FusedAttention writing [b, S, H, dv] ----

// A FusedAttention whose output only a Transpose swapping the heads and query axes reads (the
// heads merged back before the output projection, as exporters write multi-head attention): the
// node writes each query block's rows straight into the transposed layout (attribute
// out_transposed; the Transpose is its fallback's last part), so that copy is never made.
void FoldAttentionTransposes(Graph& g, ProductRewrites& stats) {
  const ProductIndex ix(g);
  std::unordered_set<const Node*> absorbed;
  for (Node& at : g.nodes) {
    if (at.op_type != "FusedAttention" || at.domain != kPlanDomain || at.outputs.empty() ||
        at.GetInt("out_transposed", 0) != 0)
      continue;
    const Node* tr = ix.SoleConsumer(g, at.outputs[0], "Transpose");
    if (tr == nullptr || tr->outputs.size() != 1 || tr->GetInts("perm") != std::vector<int64_t>{0, 2, 1, 3}) continue;
    const Graph* old = at.GetGraph("fallback");
    if (old == nullptr) continue;
    auto fallback = std::make_shared<Graph>(*old);
    fallback->nodes.push_back(*tr);
    fallback->outputs[0] = ValueInfo{tr->outputs[0]};
    stats.notes.push_back(fmt::format("{}: writes its output as {} (heads and query rows swapped) in place of {}",
                                      at.Describe(), tr->outputs[0], tr->Describe()));
    absorbed.insert(tr);
    at.outputs[0] = tr->outputs[0];
    at.attributes = {IntAttr("out_transposed", 1), FallbackAttr(std::move(fallback))};
    ++stats.attention_transposed;
  }
  DropNodes(g, absorbed);
}

// ---- SiLU, and SwiGLU's SiLU(gate) * up -> SiLUGate ----

// Mul(G, Sigmoid(G)) (either order), the Sigmoid read by that Mul alone: one SiLUGate(G), or
// SiLUGate(G, U) at the place of a Mul(that, U) that alone reads it (ops/silu_gate.cc).
void FoldSiLUGates(Graph& g, ProductRewrites& stats) {
  // ONNX's own SwiGLU(A, B) (opset 28) and Swish(X) with alpha 1 are SiLU(A) * B and SiLU(X), with
  // the SiLUGate kernel's arithmetic (ops/transformer_ops.cc): the plan's node, the operator its
  // fallback.
  for (Node& n : g.nodes) {
    if (!n.domain.empty() || (n.op_type != "SwiGLU" && n.op_type != "Swish") || n.outputs.size() != 1 ||
        n.GetFloat("alpha", 1.f) != 1.f || n.inputs.size() != (n.op_type == "SwiGLU" ? 2u : 1u))
      continue;
    bool inputs = true;
    for (const std::string& in : n.inputs) inputs = inputs && !in.empty();
    if (!inputs) continue;
    auto fallback = std::make_shared<Graph>();
    fallback->name = n.name + "/fallback";
    for (const std::string& in : n.inputs) fallback->inputs.push_back(ValueInfo{in});
    fallback->nodes.push_back(n);
    fallback->outputs.push_back(ValueInfo{n.outputs[0]});
    stats.notes.push_back(fmt::format("{}: SiLU of {}{} in one pass", n.Describe(), n.inputs[0],
                                      n.inputs.size() > 1 ? fmt::format(" times {}", n.inputs[1]) : ""));
    ++(n.inputs.size() > 1 ? stats.silu_gates : stats.silus);
    n.op_type = "SiLUGate";
    n.domain = kPlanDomain;
    n.attributes = {FallbackAttr(std::move(fallback))};
  }
  const ProductIndex ix(g);
  struct SiLU {
    const Node* sigmoid;
    std::string gate;
  };
  std::unordered_map<const Node*, SiLU> silus;  // SiLU Muls
  for (const Node& m : g.nodes) {
    if (m.op_type != "Mul" || !m.domain.empty() || m.inputs.size() != 2 || m.outputs.size() != 1) continue;
    for (int k = 0; k < 2; ++k) {
      const Node* s = ix.SoleProducer(g, m.inputs[k], "Sigmoid");
      if (s == nullptr || s->inputs.size() != 1 || s->inputs[0].empty() || s->inputs[0] != m.inputs[1 - k]) continue;
      silus.emplace(&m, SiLU{s, s->inputs[0]});
      break;
    }
  }
  if (silus.empty()) return;
  std::unordered_set<const Node*> absorbed;
  auto rewrite = [&](Node& n, const SiLU& s, const Node* silu_mul, const std::string& up) {
    auto fallback = std::make_shared<Graph>();
    fallback->name = n.name + "/fallback";
    std::vector<std::string> formal = {s.gate};
    if (!up.empty()) formal.push_back(up);
    for (const std::string& f : formal) fallback->inputs.push_back(ValueInfo{f});
    fallback->nodes.push_back(*s.sigmoid);
    if (silu_mul != &n) fallback->nodes.push_back(*silu_mul);
    fallback->nodes.push_back(n);
    fallback->outputs.push_back(ValueInfo{n.outputs[0]});
    stats.notes.push_back(fmt::format("{}: SiLU of {}{} in one pass", n.Describe(), s.gate,
                                      up.empty() ? "" : fmt::format(" times {}", up)));
    absorbed.insert(s.sigmoid);
    if (silu_mul != &n) absorbed.insert(silu_mul);
    n.op_type = "SiLUGate";
    n.domain = kPlanDomain;
    n.inputs = formal;
    n.attributes = {FallbackAttr(std::move(fallback))};
  };
  // Gated first: the SiLU Mul is absorbed into the Mul by U that alone reads it.
  for (Node& m : g.nodes) {
    if (m.op_type != "Mul" || !m.domain.empty() || m.inputs.size() != 2 || m.outputs.size() != 1 || silus.count(&m))
      continue;
    for (int k = 0; k < 2; ++k) {
      const Node* inner = ix.SoleProducer(g, m.inputs[k], "Mul");
      auto it = inner != nullptr ? silus.find(inner) : silus.end();
      if (it == silus.end() || absorbed.count(inner) || m.inputs[1 - k].empty()) continue;
      const SiLU s = it->second;
      rewrite(m, s, inner, m.inputs[1 - k]);
      ++stats.silu_gates;
      break;
    }
  }
  for (Node& m : g.nodes) {
    auto it = silus.find(&m);
    if (it == silus.end() || absorbed.count(&m)) continue;
    const SiLU s = it->second;
    rewrite(m, s, &m, "");
    ++stats.silus;
  }
  DropNodes(g, absorbed);
}

// ---- SiblingMatMul(A, W_gate, W_up) and the SiLUGate of its two outputs -> GatedMatMul ----

// A SiLUGate(G, U) whose G and U are the two outputs of one SiblingMatMul (two constant float32
// weights of one shape), each read by the SiLUGate alone: one GatedMatMul(A, W_gate, W_up) at the
// SiblingMatMul's place, so the gate applies inside the product's tasks (ops/panel_gemm.h
// PanelWeight::GatePair) and G and U are never written out. Its fallback is the two nodes.
void FoldGatedProducts(Graph& g, ProductRewrites& stats) {
  const ProductIndex ix(g);
  std::unordered_set<const Node*> absorbed;
  for (Node& gate : g.nodes) {
    if (gate.op_type != "SiLUGate" || gate.domain != kPlanDomain || gate.inputs.size() != 2 ||
        gate.outputs.size() != 1 || gate.inputs[0] == gate.inputs[1])
      continue;
    const Node* sib = ix.SoleProducer(g, gate.inputs[0], "SiblingMatMul", kPlanDomain);
    if (sib == nullptr || sib != ix.SoleProducer(g, gate.inputs[1], "SiblingMatMul", kPlanDomain) ||
        sib->inputs.size() != 3 || sib->outputs.size() != 2)
      continue;
    const int gi = sib->outputs[0] == gate.inputs[0] ? 0 : 1;  // which product is the gate
    const Tensor* wg = g.FindInitializer(sib->inputs[1 + gi]);
    const Tensor* wu = g.FindInitializer(sib->inputs[2 - gi]);
    if (wg == nullptr || wu == nullptr || wg->dtype() != DataType::kFloat || wu->dtype() != DataType::kFloat ||
        wg->rank() != 2 || wg->shape() != wu->shape())
      continue;
    auto fallback = std::make_shared<Graph>();
    fallback->name = sib->name + "/gated/fallback";
    fallback->inputs = {ValueInfo{sib->inputs[0]}, ValueInfo{sib->inputs[1 + gi]}, ValueInfo{sib->inputs[2 - gi]}};
    fallback->nodes = {*sib, gate};
    fallback->outputs = {ValueInfo{gate.outputs[0]}};
    stats.notes.push_back(fmt::format("{} and {}: SiLU({}) * {} inside the products' tasks (one pass over both weights)",
                                      sib->Describe(), gate.Describe(), gate.inputs[0], gate.inputs[1]));
    Node& n = g.nodes[static_cast<size_t>(ix.index.Producer(gate.inputs[0]))];  // keeps its place
    n.op_type = "GatedMatMul";
    n.inputs = {n.inputs[0], n.inputs[1 + gi], n.inputs[2 - gi]};
    n.outputs = {gate.outputs[0]};
    n.attributes = {FallbackAttr(std::move(fallback))};
    absorbed.insert(&gate);
    ++stats.gated_products;
  }
  DropNodes(g, absorbed);
}

// ---- Add(MatMul(A, W), R) -> ResidualMatMul(A, W, R) ----

// An Add of a MatMul's result (a float32 [K, N] initializer of at least kPackedMatMulMinWeight
// elements as W, the product read by the Add alone) and a value that is not a constant (a
// transformer's residual stream): one ResidualMatMul at the Add's place, so the addend goes in
// where each task of the product stores its sums (ops/gemm.h PreparedResidualMatMulKernel) and the
// product is never written out alone. A constant addend (a bias) is left to the Add. Its
// fallback is the two nodes (a broadcast addend at run time).
void FoldResidualProducts(Graph& g, ProductRewrites& stats) {
  const ProductIndex ix(g);
  std::unordered_set<std::string> fed;
  for (const ValueInfo& v : g.inputs) fed.insert(v.name);
  std::unordered_set<const Node*> absorbed;
  for (Node& add : g.nodes) {
    if (add.op_type != "Add" || !add.domain.empty() || add.inputs.size() != 2 || add.outputs.size() != 1 ||
        add.inputs[0].empty() || add.inputs[1].empty() || add.inputs[0] == add.inputs[1])
      continue;
    for (int k = 0; k < 2; ++k) {
      const Node* mm = ix.SoleProducer(g, add.inputs[k], "MatMul");
      const std::string& r = add.inputs[1 - k];
      if (mm == nullptr || absorbed.count(mm) || mm->inputs.size() != 2 || mm->outputs.size() != 1 ||
          ix.constants.count(r) || fed.count(mm->inputs[1]))
        continue;
      const Tensor* w = g.FindInitializer(mm->inputs[1]);
      if (w == nullptr || w->dtype() != DataType::kFloat || w->rank() != 2 || w->numel() < kPackedMatMulMinWeight)
        continue;
      auto fallback = std::make_shared<Graph>();
      fallback->name = mm->name + "/residual/fallback";
      fallback->inputs = {ValueInfo{mm->inputs[0]}, ValueInfo{mm->inputs[1]}, ValueInfo{r}};
      fallback->nodes = {*mm, add};
      fallback->outputs = {ValueInfo{add.outputs[0]}};
      stats.notes.push_back(fmt::format("{} and {}: {} added where the product's tasks store their sums",
                                        mm->Describe(), add.Describe(), r));
      absorbed.insert(mm);
      const std::vector<std::string> inputs = {mm->inputs[0], mm->inputs[1], r};
      add.name = mm->name;  // the product's name in profiles (the Add leaves the graph)
      add.op_type = "ResidualMatMul";
      add.domain = kPlanDomain;
      add.inputs = inputs;
      add.attributes = {FallbackAttr(std::move(fallback))};
      ++stats.residual_products;
      break;
    }
  }
  DropNodes(g, absorbed);
}

// ---- RMSNorm(ResidualMatMul) -> ResidualMatMul with the norm as a second output ----

// An RMSNorm (of the plan) of a ResidualMatMul's result, whatever else reads that result (the next
// residual Add): the norm moves into the product's node, which then takes eps (and the weight) and
// makes the normalized rows as a second output in the same pass over the rows as the addend (a
// transformer's post-attention and next layer's input norms), so the sum is not read again from
// memory. Its fallback is the ResidualMatMul's with the RMSNorm after it.
void FoldResidualNorms(Graph& g, ProductRewrites& stats) {
  const ProductIndex ix(g);
  std::unordered_set<const Node*> absorbed;
  std::unordered_map<const Node*, const Node*> hoisted;  // Constant node -> the node it moves before
  for (Node& rm : g.nodes) {
    if (rm.op_type != "ResidualMatMul" || rm.domain != kPlanDomain || rm.inputs.size() != 3 ||
        rm.outputs.size() != 1 || rm.GetInt("norm", 0) != 0 || ix.read_by_subgraphs.count(rm.outputs[0]))
      continue;
    const Node* norm = nullptr;
    for (const auto& [c, slot] : ix.index.Consumers(rm.outputs[0])) {
      const Node& n = g.nodes[static_cast<size_t>(c)];
      if (n.op_type == "RMSNorm" && n.domain == kPlanDomain && slot == 0 && n.outputs.size() == 1 &&
          (n.inputs.size() == 2 || n.inputs.size() == 3) && !absorbed.count(&n)) {
        norm = &n;
        break;
      }
    }
    const Graph* old = rm.GetGraph("fallback");
    if (norm == nullptr || old == nullptr) continue;
    // The norm's eps and weight are constants (FoldRMSNorms): initializers, or Constant nodes, which
    // move to just before the product's node that now reads them where they came after it (a torch
    // export writes each Constant right before its reader); a Constant reads nothing, so it may.
    const int at = static_cast<int>(&rm - g.nodes.data());
    bool constant = true;
    std::vector<const Node*> hoist;
    for (size_t i = 1; i < norm->inputs.size(); ++i) {
      const int p = ix.index.Producer(norm->inputs[i]);
      constant = constant && ix.constants.count(norm->inputs[i]) > 0;
      if (p <= at) continue;
      const Node& c = g.nodes[static_cast<size_t>(p)];
      constant = constant && c.op_type == "Constant" && c.domain.empty() && c.inputs.empty();
      hoist.push_back(&c);
    }
    if (!constant) continue;
    for (const Node* c : hoist) hoisted.emplace(c, &rm);  // the first reader in order: the earliest
    auto fallback = std::make_shared<Graph>(*old);
    for (size_t i = 1; i < norm->inputs.size(); ++i) fallback->inputs.push_back(ValueInfo{norm->inputs[i]});
    fallback->nodes.push_back(*norm);
    fallback->outputs.push_back(ValueInfo{norm->outputs[0]});
    stats.notes.push_back(fmt::format("{}: also makes {} ({}) in its pass over the rows", rm.Describe(),
                                      norm->outputs[0], norm->Describe()));
    for (size_t i = 1; i < norm->inputs.size(); ++i) rm.inputs.push_back(norm->inputs[i]);
    rm.outputs.push_back(norm->outputs[0]);
    rm.attributes = {IntAttr("norm", 1), IntAttr("axis", norm->GetInt("axis", -1)),
                     IntAttr("divide", norm->GetInt("divide", 0)), FallbackAttr(std::move(fallback))};
    absorbed.insert(norm);
    ++stats.residual_norms;
  }
  if (hoisted.empty()) return DropNodes(g, absorbed);
  // The nodes in order without the absorbed norms, each hoisted Constant right before its reader.
  std::unordered_map<const Node*, std::vector<const Node*>> before;
  for (const auto& [c, reader] : hoisted) before[reader].push_back(c);
  std::vector<Node> kept;
  kept.reserve(g.nodes.size());
  for (Node& n : g.nodes) {
    if (absorbed.count(&n) || hoisted.count(&n)) continue;
    if (auto it = before.find(&n); it != before.end())
      for (const Node* c : it->second) kept.push_back(*c);
    kept.push_back(std::move(n));
  }
  g.nodes = std::move(kept);
}

// ---- RMSNorm: Pow, ReduceMean, Add(eps), Sqrt, the reciprocal and the Muls -> RMSNorm ----

// Mul(W, Mul(X, Div(1, Sqrt(Add(ReduceMean(Pow(X, 2)), eps))))) and its variants (see
// ops/rms_norm.cc), each value read by the next alone: one RMSNorm at the last node's place.
void FoldRMSNorms(Graph& g, int64_t opset, ProductRewrites& stats) {
  const ProductIndex ix(g);
  std::unordered_set<const Node*> absorbed;
  auto other = [](const Node& n, int slot) -> const std::string& { return n.inputs[1 - slot]; };
  for (Node& rm : g.nodes) {
    if (rm.op_type != "ReduceMean" || !rm.domain.empty() || rm.inputs.empty() || rm.outputs.size() != 1 ||
        rm.GetInt("keepdims", 1) != 1)
      continue;
    std::vector<int64_t> axes;
    if (opset < 18) axes = rm.GetInts("axes");
    else if (rm.inputs.size() != 2 || !ConstInts(g, ix, rm.inputs[1], &axes)) continue;
    if (axes.size() != 1) continue;
    // The squares: Pow(X, 2) or Mul(X, X).
    const Node* sq = ix.SoleProducer(g, rm.inputs[0], "Pow");
    float two = 0.f;
    if (sq != nullptr && (sq->inputs.size() != 2 || !ConstScalar(g, ix, sq->inputs[1], &two) || two != 2.f)) sq = nullptr;
    if (sq == nullptr) {
      sq = ix.SoleProducer(g, rm.inputs[0], "Mul");
      if (sq != nullptr && (sq->inputs.size() != 2 || sq->inputs[0] != sq->inputs[1])) sq = nullptr;
    }
    if (sq == nullptr || sq->inputs[0].empty() || ix.constants.count(sq->inputs[0])) continue;
    const std::string& x = sq->inputs[0];
    int slot = 0;
    const Node* add = ix.SoleConsumer(g, rm.outputs[0], "Add", &slot);
    if (add == nullptr || add->inputs.size() != 2 || !ConstScalar(g, ix, other(*add, slot))) continue;
    const std::string eps = other(*add, slot);
    const Node* sqrt = ix.SoleConsumer(g, add->outputs[0], "Sqrt");
    if (sqrt == nullptr) continue;
    // X / s, X * Reciprocal(s) or X * Div(1, s).
    const Node* recip = nullptr;
    const Node* last = nullptr;
    bool divide = false;
    if (const Node* d = ix.SoleConsumer(g, sqrt->outputs[0], "Div", &slot); d != nullptr && d->inputs.size() == 2) {
      float one = 0.f;
      if (slot == 1 && d->inputs[0] == x) {
        last = d;
        divide = true;
      } else if (slot == 1 && ConstScalar(g, ix, d->inputs[0], &one) && one == 1.f) {
        recip = d;
      }
    } else if (const Node* r = ix.SoleConsumer(g, sqrt->outputs[0], "Reciprocal")) {
      recip = r;
    }
    if (recip != nullptr) {
      const Node* m = ix.SoleConsumer(g, recip->outputs[0], "Mul", &slot);
      if (m != nullptr && m->inputs.size() == 2 && other(*m, slot) == x) last = m;
    }
    if (last == nullptr) continue;
    // The weight: a constant Mul of the normalized row.
    const Node* wm = ix.SoleConsumer(g, last->outputs[0], "Mul", &slot);
    if (wm != nullptr && (wm->inputs.size() != 2 || !ix.constants.count(other(*wm, slot)))) wm = nullptr;
    Node& out = g.nodes[static_cast<size_t>((wm != nullptr ? wm : last) - g.nodes.data())];
    std::vector<const Node*> parts = {sq, &rm, add, sqrt};
    if (recip != nullptr) parts.push_back(recip);
    parts.push_back(last);
    if (wm != nullptr) parts.push_back(wm);
    std::vector<std::string> formal = {x, eps};
    if (wm != nullptr) formal.push_back(other(*wm, slot));
    auto fallback = std::make_shared<Graph>();
    fallback->name = out.name + "/fallback";
    for (const std::string& f : formal) fallback->inputs.push_back(ValueInfo{f});
    for (const Node* n : parts) fallback->nodes.push_back(*n);
    fallback->outputs.push_back(ValueInfo{out.outputs[0]});
    stats.notes.push_back(fmt::format("{}: RMSNorm of {}{} in one pass ({} operators)", out.Describe(), x,
                                      wm != nullptr ? fmt::format(" times {}", formal[2]) : "", parts.size()));
    ++stats.rms_norms;
    for (const Node* n : parts)
      if (n != &out) absorbed.insert(n);
    out.op_type = "RMSNorm";
    out.domain = kPlanDomain;
    out.inputs = formal;
    out.attributes = {IntAttr("axis", axes[0]), IntAttr("divide", divide), FallbackAttr(std::move(fallback))};
  }
  DropNodes(g, absorbed);
}

// ---- rotary embedding with rotate_half -> RotaryHalf ----

// Add(Mul(X, cos), Mul(Concat(Neg(Slice(X, h, end)), Slice(X, 0, h)), sin)) on the last axis
// (see ops/rotary_half.cc), each value read by the next alone: one RotaryHalf at the Add's place.
// h constant, or computed (the two Slices' bounds become the node's fourth and fifth inputs).
void FoldRotaryHalves(Graph& g, ProductRewrites& stats) {
  const ProductIndex ix(g);
  std::unordered_set<const Node*> absorbed;
  // Slice(data, starts, ends, axes [, steps = 1]) of one axis with constant axes and steps; a
  // bound that is not a constant (torch.onnx.export computes the half from the shape) is -1 with
  // its value's name in *dyn_start / *dyn_end.
  auto slice_of = [&](const std::string& v, int64_t* start, int64_t* end, int64_t* axis, std::string* dyn_start,
                      std::string* dyn_end) -> const Node* {
    const Node* s = ix.SoleProducer(g, v, "Slice");
    std::vector<int64_t> b = {-1}, e = {-1}, a, st = {1};
    if (s == nullptr || s->inputs.size() < 4 || s->inputs[1].empty() || s->inputs[2].empty() ||
        !ConstInts(g, ix, s->inputs[3], &a) || (s->inputs.size() > 4 && !s->inputs[4].empty() && !ConstInts(g, ix, s->inputs[4], &st)))
      return nullptr;
    dyn_start->clear();
    dyn_end->clear();
    if (!ConstInts(g, ix, s->inputs[1], &b)) *dyn_start = s->inputs[1];
    if (!ConstInts(g, ix, s->inputs[2], &e)) *dyn_end = s->inputs[2];
    if (b.size() != 1 || e.size() != 1 || a.size() != 1 || st != std::vector<int64_t>{1} ||
        (dyn_start->empty() && b[0] < 0) || (dyn_end->empty() && e[0] < 0))
      return nullptr;
    *start = b[0];
    *end = e[0];
    *axis = a[0];
    return s;
  };
  for (Node& add : g.nodes) {
    if (add.op_type != "Add" || !add.domain.empty() || add.inputs.size() != 2 || add.outputs.size() != 1) continue;
    for (int k = 0; k < 2; ++k) {
      const Node* mb = ix.SoleProducer(g, add.inputs[1 - k], "Mul");
      const Node* ma = ix.SoleProducer(g, add.inputs[k], "Mul");
      if (ma == nullptr || mb == nullptr || ma->inputs.size() != 2 || mb->inputs.size() != 2) continue;
      const Node* cat = nullptr;
      int cs = 0;
      for (; cs < 2 && cat == nullptr; ++cs) cat = ix.SoleProducer(g, mb->inputs[cs], "Concat");
      --cs;
      if (cat == nullptr || cat->inputs.size() != 2 || cat->outputs.size() != 1) continue;
      const Node* neg = ix.SoleProducer(g, cat->inputs[0], "Neg");
      int64_t b1 = 0, e1 = 0, a1 = 0, b2 = 0, e2 = 0, a2 = 0;
      std::string ds1, de1, ds2, de2;  // bounds computed at run time
      const Node* first = slice_of(cat->inputs[1], &b1, &e1, &a1, &ds1, &de1);
      const Node* second = neg != nullptr ? slice_of(neg->inputs[0], &b2, &e2, &a2, &ds2, &de2) : nullptr;
      if (first == nullptr || second == nullptr || first->inputs[0] != second->inputs[0] || !ds1.empty() || b1 != 0 ||
          !de2.empty() || a1 != a2 || (cat->GetInt("axis", 0) != a1 && cat->GetInt("axis", 0) != -1))
        continue;
      // The half: both constant (h, with the second Slice to at least 2h), or both computed (the
      // kernel checks at run time that they are equal and half the axis; the end at least 2h).
      const bool dynamic = !de1.empty();
      if (dynamic ? ds2.empty() : (!ds2.empty() || e1 <= 0 || b2 != e1 || e1 > e2 / 2)) continue;
      const std::string& x = first->inputs[0];
      int xs = -1;
      for (int j = 0; j < 2; ++j)
        if (ma->inputs[j] == x) xs = j;
      if (xs < 0 || ix.constants.count(x)) continue;
      const std::string cos = ma->inputs[1 - xs], sin = mb->inputs[1 - cs];
      std::vector<const Node*> parts = {ma, first, second, neg, cat, mb, &add};
      // X = Transpose(T) keeping the last axis last (torch.onnx.export's [b, s, h, d] to
      // [b, h, s, d] of the projected queries and keys), read by these parts alone: the rotary
      // reads T's rows where they are (attribute perm) and the copy is never made.
      // Shape nodes of X (torch.onnx.export computes the half from it) become TransposeShape(T).
      const Attribute* perm = nullptr;
      const int tp = ix.index.Producer(x);
      std::vector<int> shapes;
      for (const auto& [c, slot] : ix.index.Consumers(x)) {
        const Node& n = g.nodes[static_cast<size_t>(c)];
        if (n.op_type == "Shape" && n.domain.empty() && n.inputs.size() == 1 && n.outputs.size() == 1) shapes.push_back(c);
      }
      if (tp >= 0 && ix.index.Consumers(x).size() == 3 + shapes.size() && !ix.index.IsGraphOutput(x) &&
          !ix.read_by_subgraphs.count(x)) {
        const Node& t = g.nodes[static_cast<size_t>(tp)];
        const Attribute* pa = t.FindAttr("perm");
        if (t.op_type == "Transpose" && t.domain.empty() && t.inputs.size() == 1 && !t.inputs[0].empty() &&
            !absorbed.count(&t) && pa != nullptr && pa->type == Attribute::Type::kInts && !pa->ints.empty() &&
            pa->ints.back() == static_cast<int64_t>(pa->ints.size()) - 1) {
          perm = pa;
          parts.insert(parts.begin(), &t);
          for (int c : shapes) {
            Node& sh = g.nodes[static_cast<size_t>(c)];
            auto shape_fallback = std::make_shared<Graph>();
            shape_fallback->name = sh.name + "/fallback";
            shape_fallback->inputs.push_back(ValueInfo{t.inputs[0]});
            shape_fallback->nodes = {t, sh};
            shape_fallback->outputs.push_back(ValueInfo{sh.outputs[0]});
            std::vector<Attribute> attrs = {*pa, FallbackAttr(std::move(shape_fallback))};
            for (const char* name : {"start", "end"})
              if (const Attribute* a = sh.FindAttr(name)) attrs.push_back(*a);
            sh.op_type = "TransposeShape";
            sh.domain = kPlanDomain;
            sh.inputs = {t.inputs[0]};
            sh.attributes = std::move(attrs);
          }
        }
      }
      std::vector<std::string> formal = {perm != nullptr ? parts[0]->inputs[0] : x, cos, sin};
      if (dynamic) {
        formal.push_back(de1);
        formal.push_back(ds2);
      }
      auto fallback = std::make_shared<Graph>();
      fallback->name = add.name + "/fallback";
      for (const std::string& f : formal) fallback->inputs.push_back(ValueInfo{f});
      for (const Node* n : parts) fallback->nodes.push_back(*n);
      fallback->outputs.push_back(ValueInfo{add.outputs[0]});
      stats.notes.push_back(fmt::format("{}: rotary embedding of {} by {} and {} in one pass{}", add.Describe(), x, cos,
                                        sin, perm != nullptr ? fmt::format(", reading {} transposed in place", formal[0]) : ""));
      if (perm != nullptr) ++stats.rotaries_transposed;
      ++stats.rotaries;
      for (const Node* n : parts)
        if (n != &add) absorbed.insert(n);
      add.op_type = "RotaryHalf";
      add.domain = kPlanDomain;
      add.inputs = formal;
      Attribute perm_attr = perm != nullptr ? *perm : Attribute{};
      add.attributes = {IntAttr("axis", a1), IntAttr("half", dynamic ? 0 : e1), IntAttr("end", e2),
                        IntAttr("dynamic", dynamic), FallbackAttr(std::move(fallback))};
      if (perm != nullptr) add.attributes.push_back(std::move(perm_attr));
      break;
    }
  }
  DropNodes(g, absorbed);
}

}  // namespace gaf::plan_rewrite
