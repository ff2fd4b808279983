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
    // Transposes join only at a group's boundary (below), not in the middle of one.
    bool capable = node.op_type != "Transpose" && BlockedChainRejects(node, constant, shape_of).empty();
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
  // Transposes at a group's boundary join it (BlockedChain folds them into how it reads its input
  // and writes its output; tf2onnx's NHWC models have one after the image input and one before the
  // head): NHWC to NCHW whose output only the group reads and whose input no path from the group
  // reaches, and NCHW to NHWC of a group value that nothing else reads.
  auto consumers_of = [&](const std::string& v) {
    std::vector<int> c;
    for (const auto& [node, slot] : index.Consumers(v)) c.push_back(node);
    return c;
  };
  for (size_t G = 0; G < members.size(); ++G) {
    std::vector<int> added;
    for (int t = 0; t < n; ++t) {
      const Node& node = g.nodes[t];
      if (group[t] >= 0 || node.op_type != "Transpose" || node.inputs.empty() || node.outputs.empty() ||
          !BlockedChainRejects(node, constant, shape_of).empty() || !data_ok(node.inputs[0]) || !data_ok(node.outputs[0]) ||
          constant(node.inputs[0]) != nullptr)
        continue;
      const std::vector<int64_t> perm = node.GetInts("perm");
      const std::vector<int> readers = consumers_of(node.outputs[0]);
      bool graph_output = false;
      for (const auto& o : g.outputs) graph_output |= o.name == node.outputs[0];
      if (perm == std::vector<int64_t>{0, 3, 1, 2}) {
        const int p = index.Producer(node.inputs[0]);
        const bool only_group_reads = !readers.empty() && !graph_output &&
                                      std::all_of(readers.begin(), readers.end(), [&](int r) { return group[r] == static_cast<int>(G); });
        if (only_group_reads && (p < 0 || p >= n || !reach[p].count(static_cast<int>(G)))) added.push_back(t);
      } else {
        const int p = index.Producer(node.inputs[0]);
        if (p >= 0 && p < n && group[p] == static_cast<int>(G) && consumers_of(node.inputs[0]).size() == 1)
          added.push_back(t);
      }
    }
    for (int t : added) {
      group[t] = static_cast<int>(G);
      members[G].push_back(t);
    }
    std::sort(members[G].begin(), members[G].end());
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
