// The automatic fuser (TVM-style, on op kinds): fuses what no named rule mentions.
//
// Algorithm (a post-dominator style greedy pass, after TVM's fuse_ops.cc):
//   Visit nodes in reverse topological order. Each node starts a group of its own, then tries to
//   join the group of its consumers. A node p joins group G only when
//     - every consumer of every output of p is in G and no output of p is a graph output
//       (so p's outputs become interior values: nothing outside reads them, and the group stays
//       convex, so fusing cannot create a cycle);
//     - p is not excluded (covered by a named candidate) and has no subgraph attribute;
//     - the kinds combine (OpRegistry kinds, elementwise < broadcast < injective < reduction <
//       contraction < opaque):
//         * elementwise/broadcast p joins any group, except as a direct input of a contraction
//           (no prologue fusion into MatMul/Gemm/Conv);
//         * injective p joins only groups without a reduction/contraction anchor;
//         * a reduction or contraction p becomes the group's anchor when G has none and G holds
//           only elementwise/broadcast ops (its epilogue);
//         * opaque ops never fuse; neither does shape arithmetic (Shape/Size and what is
//           computed from them only, or values declared integer/bool), which is a few int64
//           elements per run that no generated kernel takes.
//   Groups of one node are dropped. The fused op is named after what the group holds:
//   "FusedElementwise" (elementwise/broadcast only), "FusedInjective" (with data movement),
//   "FusedReduction" (a reduction with elementwise prologue/epilogue),
//   "FusedContractionEpilogue" (MatMul/Gemm/Conv with an elementwise epilogue).
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"
#include "ops/kernel.h"

namespace gaf {

struct AutoFusionGroup {
  std::vector<int> nodes;  // graph node indices, topological order
  std::string fused_op;
  OpKind kind = OpKind::kElementwise;  // max kind of its members
  std::string reason;                  // why these nodes form a group, for the decision log
};

// Kind of a node for fusion: the registry's kind; opaque for unknown operators and for nodes
// carrying subgraphs.
OpKind FusionKindOf(const Node& node);

// `excluded[i]` marks nodes the automatic fuser must leave alone (covered by named candidates);
// may be empty.
std::vector<AutoFusionGroup> FindAutoFusionGroups(const Graph& g, const GraphIndex& index,
                                                  const std::vector<bool>& excluded);

}  // namespace gaf
