// Session plan rewrite of chains of elementwise operators (see plan_rewrite.h) -> ElementwiseChain
// (ops/elementwise_chain.cc): after the other rewrites have taken their patterns (RMSNorm, the
// rotary embedding, SiLU gates, attention's scale and mask), the elementwise operators left whose
// intermediate values nothing else reads run as one pass: an exporter's tanh- or erf-GELU, a
// Linear's bias Add with what follows it.
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "ops/elementwise_chain.h"
#include "runtime/plan_rewrite_util.h"

namespace gaf::plan_rewrite {
namespace {

// Operators a chain takes at most (the kernel refuses longer programs).
constexpr size_t kMaxChain = static_cast<size_t>(kMaxChainOps);

// An ai.onnx operator the kernel computes, with its inputs all given and no attributes.
bool ChainCandidate(const Node& n) {
  if (!n.domain.empty() || n.outputs.size() != 1 || n.outputs[0].empty() || !n.attributes.empty()) return false;
  const int64_t op = ChainOpOf(n.op_type);
  if (op < 0 || n.inputs.size() != static_cast<size_t>(ChainOpArity(static_cast<ChainOp>(op)))) return false;
  return std::none_of(n.inputs.begin(), n.inputs.end(), [](const std::string& v) { return v.empty(); });
}

Attribute IntsAttr(const char* name, std::vector<int64_t> v) {
  Attribute a;
  a.name = name;
  a.type = Attribute::Type::kInts;
  a.ints = std::move(v);
  return a;
}

}  // namespace

void FoldElementwiseChains(Graph& g, ProductRewrites& stats) {
  const ProductIndex ix(g);
  std::vector<char> taken(g.nodes.size(), 0);
  std::unordered_set<const Node*> absorbed;
  // From the last node back: a candidate not yet in a chain ends one; the chain grows by the
  // candidates making its inputs whose value only the chain reads (no graph output, no subgraph).
  for (int r = static_cast<int>(g.nodes.size()) - 1; r >= 0; --r) {
    if (taken[r] || !ChainCandidate(g.nodes[r])) continue;
    std::set<int> members{r};
    for (bool grew = true; grew && members.size() < kMaxChain;) {
      grew = false;
      const std::vector<int> now(members.begin(), members.end());
      for (int m : now) {
        for (const std::string& v : g.nodes[m].inputs) {
          const int p = ix.index.Producer(v);
          if (p < 0 || members.count(p) || taken[p] || !ChainCandidate(g.nodes[p]) || ix.index.IsGraphOutput(v) ||
              ix.read_by_subgraphs.count(v) || members.size() >= kMaxChain)
            continue;
          const auto& readers = ix.index.Consumers(v);
          if (std::all_of(readers.begin(), readers.end(), [&](const auto& c) { return members.count(c.first) > 0; })) {
            members.insert(p);
            grew = true;
          }
        }
      }
    }
    if (members.size() < 2) continue;
    // The program, in the graph's order (every member comes before r, which reads them all).
    std::unordered_map<std::string, int64_t> result;  // a member's output -> its instruction
    std::vector<std::string> formal;
    std::unordered_map<std::string, int64_t> input_of;
    std::vector<int64_t> ops, args;
    auto fallback = std::make_shared<Graph>();
    fallback->name = g.nodes[r].name + "/fallback";
    for (int m : members) {
      const Node& n = g.nodes[m];
      ops.push_back(ChainOpOf(n.op_type));
      for (const std::string& v : n.inputs) {
        if (auto it = result.find(v); it != result.end()) {
          args.push_back(-it->second - 1);
          continue;
        }
        auto [it, fresh] = input_of.emplace(v, static_cast<int64_t>(formal.size()));
        if (fresh) formal.push_back(v);
        args.push_back(it->second);
      }
      if (n.inputs.size() == 1) args.push_back(-1);
      result[n.outputs[0]] = static_cast<int64_t>(ops.size()) - 1;
      fallback->nodes.push_back(n);
      taken[m] = 1;
    }
    for (const std::string& f : formal) fallback->inputs.push_back(ValueInfo{f});
    Node& root = g.nodes[r];
    fallback->outputs.push_back(ValueInfo{root.outputs[0]});
    std::string kinds;
    for (int m : members) kinds += (kinds.empty() ? "" : ", ") + g.nodes[m].op_type;
    stats.notes.push_back(fmt::format("{}: {} elementwise operators in one pass ({}) over {}", root.Describe(),
                                      members.size(), kinds, fmt::join(formal, ", ")));
    ++stats.elementwise_chains;
    stats.chained_operators += static_cast<int>(members.size());
    for (int m : members)
      if (m != r) absorbed.insert(&g.nodes[m]);
    root.op_type = "ElementwiseChain";
    root.domain = kPlanDomain;
    root.inputs = formal;
    root.attributes = {IntsAttr("ops", std::move(ops)), IntsAttr("args", std::move(args)),
                       FallbackAttr(std::move(fallback))};
  }
  DropNodes(g, absorbed);
}

}  // namespace gaf::plan_rewrite
