#include "fusion/auto_fuser.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <unordered_map>
#include <unordered_set>

namespace gaf {

namespace {

// Nodes one automatic group may hold: longer runs (a 100k-node chain of Relu) are cut into groups
// of this size, which keeps each group's cost estimate, rewrite and generated kernel small.
constexpr size_t kMaxAutoGroupNodes = 256;

bool HasSubgraph(const Node& n) {
  for (const Attribute& a : n.attributes)
    if (a.g || !a.graphs.empty()) return true;
  return false;
}

bool IsAnchor(OpKind k) { return k == OpKind::kReduction || k == OpKind::kContraction; }

bool IsIntegerOrBool(DataType t) {
  return t == DataType::kInt64 || t == DataType::kInt32 || t == DataType::kInt16 || t == DataType::kInt8 ||
         t == DataType::kUint8 || t == DataType::kUint16 || t == DataType::kUint32 || t == DataType::kUint64 ||
         t == DataType::kBool;
}

// Shape arithmetic (Shape -> Gather -> Unsqueeze -> Concat -> Reshape's shape input, index
// math on int64): a few elements computed once per run, never worth a kernel, and no kernel
// could be generated for it. A node is shape math when it is Shape/Size, when an output is
// declared integer or bool, or when every non-constant input comes from shape math.
std::vector<bool> ShapeMathNodes(const Graph& g, const GraphIndex& index) {
  const int n = static_cast<int>(g.nodes.size());
  std::vector<bool> math(n, false);
  // Declared types (the first declaration wins, as in Graph::FindValueInfo) and initializer
  // names, indexed once: looking them up per node would be quadratic in a long graph.
  std::unordered_map<std::string, DataType> declared;
  for (const auto* list : {&g.inputs, &g.outputs, &g.value_info})
    for (const ValueInfo& v : *list) declared.emplace(v.name, v.dtype);
  std::unordered_set<std::string> initializers;
  for (const auto& [name, t] : g.initializers) initializers.insert(name);
  for (int i = 0; i < n; ++i) {  // nodes are in topological order
    const Node& node = g.nodes[i];
    if (node.op_type == "Shape" || node.op_type == "Size") {
      math[i] = true;
      continue;
    }
    for (const std::string& o : node.outputs)
      if (auto it = o.empty() ? declared.end() : declared.find(o); it != declared.end() && IsIntegerOrBool(it->second))
        math[i] = true;
    if (math[i]) continue;
    bool any = false, all = true;
    for (const std::string& in : node.inputs) {
      if (in.empty() || initializers.count(in)) continue;
      const int p = index.Producer(in);
      if (p < 0) {  // a graph input
        all = false;
        break;
      }
      if (g.nodes[p].op_type == "Constant") continue;
      any = true;
      all &= math[p];
    }
    math[i] = any && all;
  }
  return math;
}

struct GroupState {
  std::vector<int> members;
  int anchor = -1;             // node index of the reduction/contraction, -1 when none
  bool has_injective = false;  // holds data-movement ops
  OpKind max_kind = OpKind::kElementwise;
};

}  // namespace

OpKind FusionKindOf(const Node& node) {
  if (HasSubgraph(node)) return OpKind::kOpaque;
  const KernelInfo* k = OpRegistry::Global().Find(node.domain, node.op_type);
  return k == nullptr ? OpKind::kOpaque : k->kind;
}

std::vector<AutoFusionGroup> FindAutoFusionGroups(const Graph& g, const GraphIndex& index,
                                                  const std::vector<bool>& excluded) {
  const int n = static_cast<int>(g.nodes.size());
  std::vector<OpKind> kind(n);
  const std::vector<bool> shape_math = ShapeMathNodes(g, index);
  for (int i = 0; i < n; ++i) kind[i] = shape_math[i] ? OpKind::kOpaque : FusionKindOf(g.nodes[i]);
  auto is_excluded = [&](int i) { return i < static_cast<int>(excluded.size()) && excluded[i]; };

  std::vector<int> group_of(n, -1);
  std::vector<GroupState> groups;

  // Can node p join group gi (all of p's consumers are already known to be in gi)?
  auto can_join = [&](int p, const GroupState& gs) -> bool {
    const OpKind k = kind[p];
    if (k == OpKind::kOpaque) return false;
    if (k == OpKind::kElementwise || k == OpKind::kBroadcast) {
      if (gs.anchor >= 0 && kind[gs.anchor] == OpKind::kContraction) {
        // No prologue fusion into a contraction: p must not feed the anchor directly.
        const Node& a = g.nodes[gs.anchor];
        for (const std::string& o : g.nodes[p].outputs)
          if (!o.empty() && std::find(a.inputs.begin(), a.inputs.end(), o) != a.inputs.end()) return false;
      }
      return true;
    }
    if (k == OpKind::kInjective) return gs.anchor < 0;
    // Reduction or contraction: becomes the anchor of an epilogue-only group.
    return gs.anchor < 0 && !gs.has_injective;
  };

  for (int p = n - 1; p >= 0; --p) {
    int target = -1;
    if (!is_excluded(p) && kind[p] != OpKind::kOpaque) {
      bool ok = true, any = false;
      for (const std::string& o : g.nodes[p].outputs) {
        if (o.empty()) continue;
        if (index.IsGraphOutput(o)) ok = false;
        for (const auto& [c, slot] : index.Consumers(o)) {
          any = true;
          const int gc = group_of[c];
          if (gc < 0 || (target >= 0 && gc != target)) ok = false;
          else target = gc;
        }
      }
      if (!any || !ok || target < 0 || groups[target].members.size() >= kMaxAutoGroupNodes ||
          !can_join(p, groups[target]))
        target = -1;
    }
    if (target < 0) {
      if (is_excluded(p) || kind[p] == OpKind::kOpaque) continue;  // stays alone, never a group
      target = static_cast<int>(groups.size());
      groups.emplace_back();
    }
    GroupState& gs = groups[target];
    gs.members.push_back(p);
    group_of[p] = target;
    if (IsAnchor(kind[p])) gs.anchor = p;
    if (kind[p] == OpKind::kInjective) gs.has_injective = true;
    gs.max_kind = std::max(gs.max_kind, kind[p]);
  }

  std::vector<AutoFusionGroup> out;
  for (GroupState& gs : groups) {
    if (gs.members.size() < 2) continue;
    // A group of data movement only is not worth a kernel of its own.
    bool any_compute = false;
    for (int m : gs.members) any_compute |= kind[m] != OpKind::kInjective;
    if (!any_compute) continue;
    AutoFusionGroup ag;
    ag.nodes = gs.members;
    std::sort(ag.nodes.begin(), ag.nodes.end());
    ag.kind = gs.max_kind;
    if (gs.anchor >= 0 && kind[gs.anchor] == OpKind::kContraction) {
      ag.fused_op = "FusedContractionEpilogue";
      ag.reason = fmt::format("{} with an elementwise epilogue of {} operator(s); interior values have no consumer outside the group",
                              g.nodes[gs.anchor].op_type, ag.nodes.size() - 1);
    } else if (gs.anchor >= 0) {
      ag.fused_op = "FusedReduction";
      ag.reason = fmt::format("{} with {} elementwise operator(s) before/after it; interior values have no consumer outside the group",
                              g.nodes[gs.anchor].op_type, ag.nodes.size() - 1);
    } else if (gs.has_injective) {
      ag.fused_op = "FusedInjective";
      ag.reason = fmt::format("a region of {} elementwise and data-movement operators; interior values have no consumer outside the group",
                              ag.nodes.size());
    } else {
      ag.fused_op = "FusedElementwise";
      ag.reason = fmt::format("a region of {} elementwise/broadcast operators; interior values have no consumer outside the group",
                              ag.nodes.size());
    }
    out.push_back(std::move(ag));
  }
  std::sort(out.begin(), out.end(), [](const AutoFusionGroup& a, const AutoFusionGroup& b) { return a.nodes[0] < b.nodes[0]; });
  return out;
}

}  // namespace gaf
