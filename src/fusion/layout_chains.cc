#include "fusion/layout_chains.h"

#include <algorithm>
#include <map>
#include <set>

#include "ops/blocked_chain.h"

namespace gaf {

std::vector<LayoutChain> FindLayoutChains(const Graph& g, const GraphIndex& index, const ShapeMap& shapes) {
  const int n = static_cast<int>(g.nodes.size());
  auto constant = [&](const std::string& v) { return g.FindInitializer(v); };
  auto shape_of = [&](const std::string& v) -> const Shape* {
    auto it = shapes.find(v);
    return it != shapes.end() && it->second.known ? &it->second.shape : nullptr;
  };
  // A value the chain reads or writes: float32 with a recorded 4-D shape (constants excepted).
  auto data_ok = [&](const std::string& v) {
    if (v.empty() || constant(v) != nullptr) return true;
    auto it = shapes.find(v);
    return it != shapes.end() && it->second.known && it->second.dtype == DataType::kFloat &&
           it->second.shape.size() == 4;
  };
  std::vector<int> group(n, -1);
  std::vector<std::set<int>> reach(n);  // groups from which a path leads to the node (its own included)
  std::vector<std::vector<int>> members;
  for (int i = 0; i < n; ++i) {
    const Node& node = g.nodes[i];
    std::vector<int> producers;
    for (const std::string& in : node.inputs) {
      if (in.empty()) continue;
      const int p = index.Producer(in);
      if (p >= 0 && p < n) producers.push_back(p);
    }
    for (int p : producers) reach[i].insert(reach[p].begin(), reach[p].end());
    bool capable = BlockedChainRejects(node, constant, shape_of).empty();
    if (capable) {
      if (node.op_type == "Concat" || node.op_type == "Add" || node.op_type == "Mul")
        capable = std::all_of(node.inputs.begin(), node.inputs.end(), data_ok);
      else
        capable = data_ok(node.inputs[0]);
      capable = capable && data_ok(node.outputs[0]);
    }
    if (!capable) continue;
    // Join the largest producer group that no outside path connects to this node.
    int best = -1;
    for (int p : producers) {
      const int G = group[p];
      if (G < 0 || (best >= 0 && members[G].size() <= members[best].size())) continue;
      bool through_outside = false;
      for (int q : producers)
        if (group[q] != G && reach[q].count(G)) through_outside = true;
      if (!through_outside) best = G;
    }
    if (best < 0) {
      best = static_cast<int>(members.size());
      members.emplace_back();
    }
    group[i] = best;
    members[best].push_back(i);
    reach[i].insert(best);
  }
  std::vector<LayoutChain> out;
  for (const auto& m : members) {
    LayoutChain c;
    c.nodes = m;
    for (int i : m) c.convs += g.nodes[i].op_type == "Conv";
    if (c.convs >= 2) out.push_back(std::move(c));
  }
  return out;
}

}  // namespace gaf
