// Blocked-layout chains: the largest convex groups of CNN operators that can all run on oneDNN's
// channel-blocked layout (ops/blocked_chain.h), so that fused they keep that layout from one
// convolution to the next (residual blocks, depthwise + pointwise pairs, CSP, FPN and dense
// blocks) and change layout only at their boundary.
//
// Greedy, in topological order: a node that can run blocked joins the group of one of its
// producers (the largest) unless a path from that group reaches it through a node outside the
// group (which would make the fused group non-convex); otherwise it starts a group. Groups
// without at least two convolutions are dropped (one convolution is what the per-node prepared
// convolution already does).
#pragma once

#include <string>
#include <vector>

#include "cost/cost_model.h"
#include "ir/graph.h"

namespace gaf {

struct LayoutChain {
  std::vector<int> nodes;  // topological order
  int convs = 0;
};

std::vector<LayoutChain> FindLayoutChains(const Graph& g, const GraphIndex& index, const ShapeMap& shapes);

}  // namespace gaf
