// Session plan rewrites of products (see plan_rewrite.h).
#include "runtime/plan_rewrite.h"

#include "runtime/plan_rewrite_util.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <memory>
#include <unordered_map>
#include <unordered_set>

namespace gaf {
namespace plan_rewrite {


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

bool ConstScalar(const Graph& g, const ProductIndex& ix, const std::string& v, float* value) {
  const Tensor* t = g.FindInitializer(v);
  if (t == nullptr) {
    const int p = ix.index.Producer(v);
    if (p < 0 || g.nodes[p].op_type != "Constant" || !g.nodes[p].domain.empty()) return false;
    t = g.nodes[p].GetTensor("value");
  }
  if (t == nullptr || t->dtype() != DataType::kFloat || t->numel() != 1) return false;
  if (value != nullptr) *value = t->data<float>()[0];
  return true;
}

void DropNodes(Graph& g, const std::unordered_set<const Node*>& absorbed) {
  if (absorbed.empty()) return;
  std::vector<Node> kept;
  kept.reserve(g.nodes.size() - std::min(g.nodes.size(), absorbed.size()));
  for (Node& n : g.nodes)
    if (!absorbed.count(&n)) kept.push_back(std::move(n));
  g.nodes = std::move(kept);
}

}  // namespace plan_rewrite

namespace {

using namespace plan_rewrite;

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

}  // namespace

namespace {

// A graph output made by MatMul(A, W) with W a constant [K, N], perhaps through an Add of a
// constant bias of rank 1 or less: A is read through a LastPosition node, which passes it on as it
// is except in a generation's runs (last_position_only), where it keeps A's last position (axis 1
// of a [batch, positions, K] operand). The logits of a 256-token prompt are otherwise a product by
// the vocabulary head over every position (a fifth of the prompt's multiply-adds in the bench
// Llama) of which a generation reads one row.
void MarkLastPositions(Graph& g, ProductRewrites& stats) {
  std::unordered_map<std::string, size_t> producer, readers;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    for (const std::string& o : g.nodes[i].outputs) producer[o] = i;
    for (const std::string& in : g.nodes[i].inputs) ++readers[in];
  }
  std::unordered_set<std::string> outputs;
  for (const ValueInfo& v : g.outputs) outputs.insert(v.name);
  // A name the graph already uses (a value, an input, an initializer) is never made again.
  auto used = [&](const std::string& v) {
    return producer.count(v) > 0 || readers.count(v) > 0 || outputs.count(v) > 0 || g.FindInitializer(v) != nullptr ||
           std::any_of(g.inputs.begin(), g.inputs.end(), [&](const ValueInfo& i) { return i.name == v; });
  };
  auto producer_of = [&](const std::string& v) -> Node* {
    auto p = producer.find(v);
    return p == producer.end() ? nullptr : &g.nodes[p->second];
  };
  auto constant_of_rank = [&](const std::string& v, int64_t max_rank) {
    const Tensor* t = g.FindInitializer(v);
    return t != nullptr && t->rank() <= max_rank;
  };
  std::vector<std::pair<size_t, Node>> inserts;  // (before node i, the LastPosition node)
  std::unordered_set<const Node*> marked;          // an output listed twice marks its product once
  for (const ValueInfo& out : g.outputs) {
    if (readers[out.name] != 0) continue;  // read inside the graph too: every position is needed
    Node* n = producer_of(out.name);
    if (n != nullptr && n->op_type == "Add" && n->domain.empty() && n->inputs.size() == 2) {
      const int bias = constant_of_rank(n->inputs[1], 1) ? 1 : constant_of_rank(n->inputs[0], 1) ? 0 : -1;
      const std::string& product = bias < 0 ? std::string() : n->inputs[static_cast<size_t>(1 - bias)];
      n = bias >= 0 && readers[product] == 1 && !outputs.count(product) ? producer_of(product) : nullptr;
    }
    if (n == nullptr || n->op_type != "MatMul" || !n->domain.empty() || n->inputs.size() != 2 ||
        n->outputs.size() != 1 || g.FindInitializer(n->inputs[0]) != nullptr || !marked.insert(n).second)
      continue;
    const Tensor* w = g.FindInitializer(n->inputs[1]);
    if (w == nullptr || w->rank() != 2) continue;  // a row-wise product of A's leading axes
    const std::string input = n->outputs[0] + "/last_position_input";
    if (used(input)) continue;
    Node last;
    last.op_type = "LastPosition";
    last.domain = kPlanDomain;
    last.name = n->name + "/last_position";
    last.inputs = {n->inputs[0]};
    last.outputs = {input};
    n->inputs[0] = last.outputs[0];
    stats.notes.push_back(fmt::format("{}: the product reads {} through LastPosition (a generation computes {} for the "
                                      "last position only)",
                                      n->name, last.inputs[0], out.name));
    inserts.emplace_back(static_cast<size_t>(n - g.nodes.data()), std::move(last));
  }
  // From the back, so that the earlier positions stay where they are.
  std::sort(inserts.begin(), inserts.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (auto& [at, node] : inserts) g.nodes.insert(g.nodes.begin() + static_cast<std::ptrdiff_t>(at), std::move(node));
  stats.last_positions += static_cast<int>(inserts.size());
}

}  // namespace

ProductRewrites RewriteProducts(Model& model, bool group_siblings, bool fold_residuals) {
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
    if (ix.constants.count(v)) continue;
    // A cache made by Concat(past, new) on its length axis for this product alone (and perhaps
    // as a graph output, the present cache): the product makes it too, reading the past once. A
    // rank-4 cache of as many heads as the queries (multi-head attention: no repeat) too.
    const Node* cat = nullptr;
    std::vector<int> shape_readers;  // Shape nodes of the cache (they read no data)
    {
      const Node* reader = chain.empty() ? &n : chain.back();  // the one node that reads its data
      const int p = ix.index.Producer(v);
      bool others = false;
      for (const auto& [c, slot] : ix.index.Consumers(v)) {
        const Node& r = g.nodes[c];
        if (&r == reader) continue;
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
    if (!trans && !kv && cat == nullptr) continue;

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
  DropNodes(g, absorbed);
  if (group_siblings) GroupSiblings(g, stats);
  GroupCopies(g, opset, stats);
  FoldSoftmaxEpilogues(g, opset, stats);
  FoldAttention(g, stats);
  FoldAttentionTransposes(g, stats);
  FoldSiLUGates(g, stats);
  FoldGatedProducts(g, stats);
  FoldRMSNorms(g, opset, stats);
  FoldRotaryHalves(g, stats);
  if (fold_residuals) {
    FoldResidualProducts(g, stats);
    FoldResidualNorms(g, stats);
  }
  FoldElementwiseChains(g, stats);
  MarkLastPositions(g, stats);
  return stats;
}

}  // namespace gaf
