// Session plan rewrites of products (see plan_rewrite.h).
#include "runtime/plan_rewrite.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <memory>
#include <unordered_map>
#include <unordered_set>

namespace gaf {
namespace {

// Use-def links (ir's GraphIndex) plus what the rewrites also need: values read by subgraphs
// (outer-scope reads) and constant values.
struct ProductIndex {
  GraphIndex index;
  std::unordered_set<std::string> read_by_subgraphs;
  std::unordered_set<std::string> constants;  // initializers and Constant outputs

  explicit ProductIndex(const Graph& g) : index(g) {
    for (const auto& [n, t] : g.initializers) constants.insert(n);
    for (const Node& n : g.nodes) {
      if (n.op_type == "Constant" && n.domain.empty() && !n.outputs.empty()) constants.insert(n.outputs[0]);
      for (const Attribute& a : n.attributes) {
        std::vector<const Graph*> subs;
        if (a.g) subs.push_back(a.g.get());
        for (const auto& sg : a.graphs) subs.push_back(sg.get());
        for (const Graph* sg : subs)
          for (const std::string& v : OuterScopeValues(*sg)) read_by_subgraphs.insert(v);
      }
    }
  }
  // The node producing `v` when it is op `op` of `domain` (ai.onnx by default) and one input of
  // one node is all that reads `v` (no graph output, no subgraph).
  const Node* SoleProducer(const Graph& g, const std::string& v, const char* op, const char* domain = "") const {
    const int p = index.Producer(v);
    if (p < 0 || index.Consumers(v).size() != 1 || index.IsGraphOutput(v) || read_by_subgraphs.count(v))
      return nullptr;
    const Node& n = g.nodes[p];
    return n.op_type == op && n.domain == domain ? &n : nullptr;
  }
};

// The `fallback` graph attribute of a plan node (the original operators on its inputs).
Attribute FallbackAttr(std::shared_ptr<Graph> g) {
  Attribute a;
  a.name = "fallback";
  a.type = Attribute::Type::kGraph;
  a.g = std::move(g);
  return a;
}

Attribute IntAttr(const char* name, int64_t v) {
  Attribute a;
  a.name = name;
  a.type = Attribute::Type::kInt;
  a.i = v;
  return a;
}

// The integer values of a constant input (initializer or Constant node) into *out; false when it
// is not one.
bool ConstInts(const Graph& g, const ProductIndex& ix, const std::string& v, std::vector<int64_t>* out) {
  if (const Tensor* t = g.FindInitializer(v)) {
    if (t->dtype() != DataType::kInt64 && t->dtype() != DataType::kInt32) return false;
    *out = t->ToInt64s();
    return true;
  }
  const int p = ix.index.Producer(v);
  if (p < 0) return false;
  const Node& n = g.nodes[p];
  if (n.op_type != "Constant" || !n.domain.empty()) return false;
  if (const Tensor* t = n.GetTensor("value"); t != nullptr && (t->dtype() == DataType::kInt64 || t->dtype() == DataType::kInt32)) {
    *out = t->ToInt64s();
    return true;
  }
  if (n.HasAttr("value_ints")) {
    *out = n.GetInts("value_ints");
    return true;
  }
  return false;
}

// Shape(X) with X = Concat(a, b, ...) -> ConcatShape(a, b, ...): the shape without X, whose
// maker (an appending GroupedMatMul, a FusedCopy) may come after it or not make it at all. Its
// fallback graph is the original Concat + Shape.
void MakeConcatShape(Node& shape, const Node& cat) {
  auto fallback = std::make_shared<Graph>();
  fallback->name = shape.name + "/fallback";
  for (const std::string& in : cat.inputs) fallback->inputs.push_back(ValueInfo{in});
  fallback->nodes = {cat, shape};
  fallback->outputs = {ValueInfo{shape.outputs[0]}};
  std::vector<Attribute> attrs;
  Attribute axis;
  axis.name = "axis";
  axis.type = Attribute::Type::kInt;
  axis.i = cat.GetInt("axis", 0);
  attrs.push_back(axis);
  for (const Attribute& a : shape.attributes)
    if (a.name == "start" || a.name == "end") attrs.push_back(a);
  attrs.push_back(FallbackAttr(std::move(fallback)));
  shape.op_type = "ConcatShape";
  shape.domain = kPlanDomain;
  shape.inputs = cat.inputs;
  shape.attributes = std::move(attrs);
}

bool SwapsLastTwo(const std::vector<int64_t>& perm) {
  const size_t r = perm.size();
  if (r < 2) return false;
  for (size_t i = 0; i + 2 < r; ++i)
    if (perm[i] != static_cast<int64_t>(i)) return false;
  return perm[r - 2] == static_cast<int64_t>(r - 1) && perm[r - 1] == static_cast<int64_t>(r - 2);
}

}  // namespace

namespace {

// MatMuls of one input by float32 [K, N] initializers (the query/key/value projections; gate and
// up) become one SiblingMatMul at the first one's place: its inputs are there already.
void GroupSiblings(Graph& g, ProductRewrites& stats) {
  std::unordered_map<std::string, std::vector<size_t>> by_input;
  std::vector<std::string> order;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.op_type != "MatMul" || !n.domain.empty() || n.inputs.size() != 2 || n.outputs.size() != 1) continue;
    const Tensor* w = g.FindInitializer(n.inputs[1]);
    if (w == nullptr || w->dtype() != DataType::kFloat || w->rank() != 2) continue;
    auto [it, fresh] = by_input.try_emplace(n.inputs[0]);
    if (fresh) order.push_back(n.inputs[0]);
    // Siblings share K (a weight of another K would fail MatMul's check).
    if (!it->second.empty() && g.FindInitializer(g.nodes[it->second[0]].inputs[1])->dim(0) != w->dim(0)) continue;
    it->second.push_back(i);
  }
  std::vector<char> drop(g.nodes.size(), 0);
  for (const std::string& a : order) {
    const std::vector<size_t>& idx = by_input[a];
    if (idx.size() < 2) continue;
    Node& first = g.nodes[idx[0]];
    auto fallback = std::make_shared<Graph>();
    fallback->name = first.name + "/fallback";
    Node group;
    group.name = first.name;
    group.op_type = "SiblingMatMul";
    group.domain = kPlanDomain;
    group.inputs = {a};
    fallback->inputs.push_back(ValueInfo{a});
    std::string names;
    for (size_t i : idx) {
      const Node& m = g.nodes[i];
      group.inputs.push_back(m.inputs[1]);
      group.outputs.push_back(m.outputs[0]);
      fallback->inputs.push_back(ValueInfo{m.inputs[1]});
      fallback->nodes.push_back(m);
      fallback->outputs.push_back(ValueInfo{m.outputs[0]});
      names += (names.empty() ? "" : ", ") + m.Describe();
      if (i != idx[0]) drop[i] = 1;
    }
    group.attributes = {FallbackAttr(std::move(fallback))};
    stats.notes.push_back(fmt::format("{} products of {} in one pass over their weights: {}", idx.size(), a, names));
    stats.sibling_groups++;
    stats.siblings += static_cast<int>(idx.size());
    first = std::move(group);
  }
  std::vector<Node> kept;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (!drop[i]) kept.push_back(std::move(g.nodes[i]));
  g.nodes = std::move(kept);
}

// ---- trees of data-movement operators -> FusedCopy ----

bool IsCopy(const Node& n, int64_t opset) {
  if (!n.domain.empty() || n.outputs.size() != 1 || n.inputs.empty() || n.inputs[0].empty()) return false;
  const std::string& op = n.op_type;
  return op == "Concat" || op == "Transpose" || op == "Flatten" || op == "Identity" ||
         (op == "Slice" && opset >= 10 && n.inputs.size() >= 3) ||
         (op == "Reshape" && opset >= 5 && n.inputs.size() == 2 && n.GetInt("allowzero", 0) == 0);
}
bool MovesData(const Node& n) { return n.op_type == "Concat" || n.op_type == "Transpose" || n.op_type == "Slice"; }
size_t DataInputs(const Node& n) { return n.op_type == "Concat" ? n.inputs.size() : 1; }

void GroupCopies(Graph& g, int64_t opset, ProductRewrites& stats) {
  const ProductIndex ix(g);
  const int count = static_cast<int>(g.nodes.size());
  // absorbed_by[i]: the copy node that alone reads node i's output, as data; -1 otherwise.
  std::vector<int> absorbed_by(count, -1);
  std::unordered_map<int, std::vector<int>> shape_readers;  // Shape nodes of an absorbed Concat
  for (int i = 0; i < count; ++i) {
    const Node& n = g.nodes[i];
    if (!IsCopy(n, opset)) continue;
    const std::string& v = n.outputs[0];
    if (ix.index.IsGraphOutput(v) || ix.read_by_subgraphs.count(v)) continue;
    // One copy node reads v as data; Shape nodes may read it too when v is a Concat of values
    // no copy node makes (they become ConcatShape of those values if the tree is fused).
    int reader = -1, data_readers = 0;
    std::vector<int> shapes;
    for (const auto& [c, slot] : ix.index.Consumers(v)) {
      const Node& r = g.nodes[c];
      if (r.op_type == "Shape" && r.domain.empty() && r.inputs.size() == 1 && r.outputs.size() == 1) {
        shapes.push_back(c);
      } else {
        ++data_readers;
        if (IsCopy(r, opset) && static_cast<size_t>(slot) < DataInputs(r)) reader = c;
      }
    }
    if (data_readers != 1 || reader < 0) continue;
    if (!shapes.empty()) {
      bool plain = n.op_type == "Concat";
      for (const std::string& in : n.inputs) {
        const int p = in.empty() ? -1 : ix.index.Producer(in);
        plain &= !in.empty() && (p < 0 || !IsCopy(g.nodes[p], opset));
      }
      if (!plain) continue;
      shape_readers[i] = shapes;
    }
    absorbed_by[i] = reader;
  }
  std::vector<bool> removed(count, false);
  for (int root = 0; root < count; ++root) {
    if (!IsCopy(g.nodes[root], opset) || absorbed_by[root] >= 0) continue;
    std::vector<int> members{root}, stack{root};
    std::vector<std::string> leaves;
    while (!stack.empty()) {
      const Node& n = g.nodes[stack.back()];
      stack.pop_back();
      for (size_t k = 0; k < DataInputs(n); ++k) {
        const int p = n.inputs[k].empty() ? -1 : ix.index.Producer(n.inputs[k]);
        if (p >= 0 && absorbed_by[p] >= 0) {
          members.push_back(p);
          stack.push_back(p);
        } else if (!n.inputs[k].empty()) {
          leaves.push_back(n.inputs[k]);
        }
      }
    }
    int movers = 0;
    for (int m : members) movers += MovesData(g.nodes[m]);
    bool data_leaves = true;  // not shape arithmetic (Shape, Size, ConcatShape) nor constants
    for (const std::string& v : leaves) {
      const int p = ix.index.Producer(v);
      data_leaves &= !ix.constants.count(v) && (p < 0 || (g.nodes[p].op_type != "Shape" && g.nodes[p].op_type != "Size" &&
                                                         g.nodes[p].op_type != "ConcatShape"));
    }
    // Two data-moving operators save at most one copy, and the replay costs a few microseconds
    // more than they do on small tensors (a decoder's rotary Concat(Neg(Slice(x)), Slice(x)) at
    // decode size: about 4.5 us against 2): trees of three or more.
    if (movers < 3 || !data_leaves) continue;
    std::sort(members.begin(), members.end());
    auto fallback = std::make_shared<Graph>();
    fallback->name = g.nodes[root].name + "/fallback";
    std::vector<std::string> formal;
    std::unordered_set<std::string> defined;
    for (int m : members) defined.insert(g.nodes[m].outputs[0]);
    for (int m : members)
      for (const std::string& in : g.nodes[m].inputs)
        if (!in.empty() && !defined.count(in) && std::find(formal.begin(), formal.end(), in) == formal.end())
          formal.push_back(in);
    for (const std::string& f : formal) fallback->inputs.push_back(ValueInfo{f});
    for (int m : members) fallback->nodes.push_back(g.nodes[m]);
    fallback->outputs.push_back(ValueInfo{g.nodes[root].outputs[0]});
    std::vector<std::string> ops;
    for (int m : members) ops.push_back(g.nodes[m].op_type);
    stats.notes.push_back(fmt::format("{}: {} operators ({}) copy each element once, from {}", g.nodes[root].Describe(),
                                      members.size(), fmt::join(ops, ", "), fmt::join(leaves, ", ")));
    ++stats.copy_groups;
    stats.copies += static_cast<int>(members.size());
    for (int m : members) {
      if (m != root) removed[m] = true;
      if (auto it = shape_readers.find(m); it != shape_readers.end())
        for (int c : it->second) MakeConcatShape(g.nodes[c], g.nodes[m]);
    }
    Node& n = g.nodes[root];
    n.op_type = "FusedCopy";
    n.domain = kPlanDomain;
    n.inputs = formal;
    n.attributes = {FallbackAttr(std::move(fallback)), IntAttr("opset", opset)};
  }
  std::vector<Node> kept;
  for (int i = 0; i < count; ++i)
    if (!removed[i]) kept.push_back(std::move(g.nodes[i]));
  g.nodes = std::move(kept);
}

// ---- attention's scale and mask folded into its Softmax -> MaskedSoftmax ----

// True when v is a float32 constant of one element (an initializer or a Constant node's value).
bool ConstScalar(const Graph& g, const ProductIndex& ix, const std::string& v) {
  const Tensor* t = g.FindInitializer(v);
  if (t == nullptr) {
    const int p = ix.index.Producer(v);
    if (p < 0 || g.nodes[p].op_type != "Constant" || !g.nodes[p].domain.empty()) return false;
    t = g.nodes[p].GetTensor("value");
  }
  return t != nullptr && t->dtype() == DataType::kFloat && t->numel() == 1;
}

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
  if (absorbed.empty()) return;
  std::vector<Node> kept;
  for (Node& n : g.nodes)
    if (!absorbed.count(&n)) kept.push_back(std::move(n));
  g.nodes = std::move(kept);
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
    const Node* sm = ix.SoleProducer(g, pv.inputs[0], "MaskedSoftmax", kPlanDomain);
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
    fallback->nodes = {*qk, *sm, pv};
    for (const std::string& o : outputs) fallback->outputs.push_back(ValueInfo{o});
    stats.notes.push_back(fmt::format("{}: attention with '{}' and '{}' as one node, in blocks of query rows (the "
                                      "scores never written out, keys the mask removes skipped)",
                                      pv.Describe(), qk->name, sm->name));
    ++stats.attention_blocks;
    absorbed.insert(qk);
    absorbed.insert(sm);
    pv.op_type = "FusedAttention";
    pv.domain = kPlanDomain;
    pv.inputs = formal;
    pv.outputs = outputs;
    pv.attributes = {FallbackAttr(std::move(fallback))};
  }
  if (absorbed.empty()) return;
  std::vector<Node> kept;
  for (Node& n : g.nodes)
    if (!absorbed.count(&n)) kept.push_back(std::move(n));
  g.nodes = std::move(kept);
}

// ---- SiLU, and SwiGLU's SiLU(gate) * up -> SiLUGate ----

// Mul(G, Sigmoid(G)) (either order), the Sigmoid read by that Mul alone: one SiLUGate(G), or
// SiLUGate(G, U) at the place of a Mul(that, U) that alone reads it (ops/silu_gate.cc).
void FoldSiLUGates(Graph& g, ProductRewrites& stats) {
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
  std::vector<Node> kept;
  for (Node& n : g.nodes)
    if (!absorbed.count(&n)) kept.push_back(std::move(n));
  g.nodes = std::move(kept);
}

}  // namespace

ProductRewrites RewriteProducts(Model& model, bool group_siblings) {
  ProductRewrites stats;
  Graph& g = model.graph;
  const int64_t opset = model.OpsetVersion("");
  const ProductIndex ix(g);
  std::unordered_set<const Node*> absorbed;
  for (Node& n : g.nodes) {
    if (n.op_type != "MatMul" || !n.domain.empty() || n.inputs.size() != 2 || n.outputs.size() != 1) continue;
    std::string v = n.inputs[1];
    std::vector<const Node*> chain;  // absorbed nodes, last first
    bool trans = false, kv = false;
    std::string expand_shape, reshape_shape;
    if (const Node* t = ix.SoleProducer(g, v, "Transpose"); t != nullptr && SwapsLastTwo(t->GetInts("perm"))) {
      trans = true;
      chain.push_back(t);
      v = t->inputs[0];
    }
    if (const Node* r = ix.SoleProducer(g, v, "Reshape"); r != nullptr && r->GetInt("allowzero", 0) == 0 &&
                                                           r->inputs.size() == 2 && !r->inputs[1].empty()) {
      const Node* e = ix.SoleProducer(g, r->inputs[0], "Expand");
      const Node* u = e != nullptr && e->inputs.size() == 2 ? ix.SoleProducer(g, e->inputs[0], "Unsqueeze") : nullptr;
      std::vector<int64_t> axes;
      bool have_axes = false;
      if (u != nullptr) {
        if (opset < 13) {
          axes = u->GetInts("axes");
          have_axes = true;
        } else if (u->inputs.size() == 2) {
          have_axes = ConstInts(g, ix, u->inputs[1], &axes);
        }
      }
      // Axis 2 of the rank-5 result: [b, g, t, d] -> [b, g, 1, t, d].
      if (have_axes && axes.size() == 1 && (axes[0] == 2 || axes[0] == -3)) {
        kv = true;
        chain.push_back(r);
        chain.push_back(e);
        chain.push_back(u);
        expand_shape = e->inputs[1];
        reshape_shape = r->inputs[1];
        v = u->inputs[0];
      }
    }
    if ((!trans && !kv) || ix.constants.count(v)) continue;
    // A cache made by Concat(past, new) on its length axis for this product alone (and perhaps
    // as a graph output, the present cache): the product makes it too, reading the past once.
    const Node* cat = nullptr;
    std::vector<int> shape_readers;  // Shape nodes of the cache (they read no data)
    if (kv) {
      const int p = ix.index.Producer(v);
      bool others = false;
      for (const auto& [c, slot] : ix.index.Consumers(v)) {
        const Node& r = g.nodes[c];
        if (&r == chain.back()) continue;
        if (r.op_type == "Shape" && r.domain.empty() && r.inputs.size() == 1) shape_readers.push_back(c);
        else others = true;
      }
      if (p >= 0 && !others && !ix.read_by_subgraphs.count(v)) {
        const Node& c = g.nodes[p];
        const int64_t axis = c.GetInt("axis", 0);
        if (c.op_type == "Concat" && c.domain.empty() && c.inputs.size() == 2 && c.outputs.size() == 1 &&
            (axis == 2 || axis == -2) && !c.inputs[0].empty() && !c.inputs[1].empty() &&
            !ix.constants.count(c.inputs[0]) && !ix.constants.count(c.inputs[1]))
          cat = &c;
      }
    }

    // The original operators, as a graph on the new node's inputs.
    auto fallback = std::make_shared<Graph>();
    fallback->name = n.name + "/fallback";
    std::vector<std::string> formal = {n.inputs[0]};
    if (cat != nullptr) {
      formal.push_back(cat->inputs[0]);
      formal.push_back(cat->inputs[1]);
    } else {
      formal.push_back(v);
    }
    if (kv) {
      formal.push_back(expand_shape);
      formal.push_back(reshape_shape);
    }
    for (const std::string& f : formal) fallback->inputs.push_back(ValueInfo{f});
    if (cat != nullptr) fallback->nodes.push_back(*cat);
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) fallback->nodes.push_back(**it);
    fallback->nodes.push_back(n);
    fallback->outputs.push_back(ValueInfo{n.outputs[0]});
    if (cat != nullptr) fallback->outputs.push_back(ValueInfo{v});

    stats.notes.push_back(fmt::format("{}: reads {} {}{}{}", n.Describe(), v, trans ? "transposed" : "",
                                      kv ? (trans ? ", once per cache head" : "once per cache head") : "",
                                      cat != nullptr ? fmt::format(", and makes it from {} and {} in the same pass{}",
                                                                   cat->inputs[0], cat->inputs[1],
                                                                   shape_readers.empty() ? "" : fmt::format(
                                                                       " ({} Shape node(s) of it take the shape from those)",
                                                                       shape_readers.size()))
                                                     : ""));
    stats.transposed += trans;
    stats.kv_grouped += kv;
    stats.appended += cat != nullptr;
    for (const Node* c : chain) absorbed.insert(c);
    if (cat != nullptr) {
      absorbed.insert(cat);
      n.outputs.push_back(v);
      for (int c : shape_readers) MakeConcatShape(g.nodes[c], *cat);
      stats.shape_readers += static_cast<int>(shape_readers.size());
    }
    n.op_type = "GroupedMatMul";
    n.domain = kPlanDomain;
    n.inputs = formal;
    n.attributes = {IntAttr("trans_b", trans), IntAttr("kv_group", kv), IntAttr("append", cat != nullptr),
                    FallbackAttr(std::move(fallback))};
  }
  if (!absorbed.empty()) {
    std::vector<Node> kept;
    kept.reserve(g.nodes.size() - absorbed.size());
    for (Node& n : g.nodes)
      if (!absorbed.count(&n)) kept.push_back(std::move(n));
    g.nodes = std::move(kept);
  }
  if (group_siblings) GroupSiblings(g, stats);
  GroupCopies(g, opset, stats);
  FoldSoftmaxEpilogues(g, opset, stats);
  FoldAttention(g, stats);
  FoldSiLUGates(g, stats);
  return stats;
}

}  // namespace gaf
