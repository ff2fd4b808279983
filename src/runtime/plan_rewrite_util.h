// What the session's plan rewrites (runtime/plan_rewrite.cc and plan_rewrite_epilogues.cc)
// share: use-def links of the graph being rewritten, the plan nodes' attributes, constant tests,
// and the rewrites of elementwise and normalization epilogues.
#pragma once

#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "ir/graph.h"
#include "runtime/plan_rewrite.h"

namespace gaf::plan_rewrite {

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
  // The node of op `op` (ai.onnx) that alone reads `v`, at input `*slot`, when nothing else
  // (no graph output, no subgraph) reads it.
  const Node* SoleConsumer(const Graph& g, const std::string& v, const char* op, int* slot = nullptr) const {
    const auto& c = index.Consumers(v);
    if (c.size() != 1 || index.IsGraphOutput(v) || read_by_subgraphs.count(v)) return nullptr;
    const Node& n = g.nodes[c[0].first];
    if (n.op_type != op || !n.domain.empty()) return nullptr;
    if (slot != nullptr) *slot = c[0].second;
    return &n;
  }
};

// The `fallback` graph attribute of a plan node (the original operators on its inputs).
Attribute FallbackAttr(std::shared_ptr<Graph> g);
Attribute IntAttr(const char* name, int64_t v);
// The integer values of a constant input (initializer or Constant node) into *out; false when it
// is not one.
bool ConstInts(const Graph& g, const ProductIndex& ix, const std::string& v, std::vector<int64_t>* out);
// Whether v is a constant float32 scalar (one element), and then its value.
bool ConstScalar(const Graph& g, const ProductIndex& ix, const std::string& v, float* value = nullptr);
// Removes the absorbed nodes from g (the others keep their order).
void DropNodes(Graph& g, const std::unordered_set<const Node*>& absorbed);

void FoldSoftmaxEpilogues(Graph& g, int64_t opset, ProductRewrites& stats);
void FoldAttention(Graph& g, ProductRewrites& stats);
void FoldAttentionTransposes(Graph& g, ProductRewrites& stats);
void FoldSiLUGates(Graph& g, ProductRewrites& stats);
void FoldGatedProducts(Graph& g, ProductRewrites& stats);
void FoldResidualProducts(Graph& g, ProductRewrites& stats);
void FoldResidualNorms(Graph& g, ProductRewrites& stats);
void FoldRMSNorms(Graph& g, int64_t opset, ProductRewrites& stats);
void FoldRotaryHalves(Graph& g, ProductRewrites& stats);
void FoldElementwiseChains(Graph& g, ProductRewrites& stats);

}  // namespace gaf::plan_rewrite
