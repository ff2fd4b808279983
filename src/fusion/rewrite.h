// Fused ONNX out: each accepted group becomes one node calling a model-local function.
//
//   before                                  after
//   x ─ Pow ─ ReduceMean ─ Add(eps) ─ Sqrt   x ─┐
//   └──────────────────────────── Div ─ Mul   eps ┼─ ai.graph_autofusion::FusedRMSNorm ─ y
//                                      w ─┘   w ─┘      (FunctionProto body = the original nodes)
//
// - op type: the rule's fused op name, made unique per distinct body ("FusedRMSNorm",
//   "FusedRMSNorm_2" when another group of the same rule computes something structurally
//   different, e.g. other attributes); groups with identical bodies share one function;
// - domain kFusedDomain, version 1 added to the model's opset imports;
// - the body's values get function-local names (X0.. inputs, T0.. intermediates, Y0.. outputs);
//   constant initializers the body reads stay graph initializers and are passed as explicit
//   inputs of the node;
// - provenance: the node's doc_string names the rule and the original nodes; the model's
//   metadata_props["graph_autofusion"] holds a JSON summary of all fused groups.
// The graph is re-sorted topologically afterwards; value_info of values that became
// function-internal is dropped.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"

namespace gaf {

struct RewriteGroup {
  std::vector<int> nodes;  // indices into model.graph.nodes
  std::string fused_op;    // base op type name, e.g. "FusedRMSNorm"
  std::string rule;
  std::string rule_source;
  int candidate = -1;
  std::string math = "exact";  // "approx": the rule allows approximate math in its kernel
};

struct RewrittenGroup {
  std::string node_name;   // the fused node
  std::string op_type;     // function name (unique per body)
  std::string rule;
  int candidate = -1;
  std::vector<std::string> original_nodes;
};

// Returns the rewritten model; `done` (optional) receives one entry per group, in input order.
// Groups must not overlap (gaf::Error otherwise, naming the node).
Model RewriteFusedGroups(const Model& model, const std::vector<RewriteGroup>& groups,
                         std::vector<RewrittenGroup>* done = nullptr);


}  // namespace gaf
