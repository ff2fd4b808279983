// The fusion planner: from rule matches to verdicts.
//
//   1. collect the matches of every rule (FindAllMatches), one candidate per match;
//   2. legality (flat early returns, each a sentence): no subgraph-carrying nodes, the group is
//      convex (fusing it creates no cycle);
//   3. cost per candidate (EstimateGroupCost against the profile, on recorded shapes) and a
//      verdict with its reason:
//        Fuse                       saving = (t_before - t_after) / t_before >= threshold and the
//                                   fused kernel's footprint fits the local-memory budget;
//        Skip: local-memory overflow footprint > budget;
//        Skip: low benefit          saving < threshold;
//        Maybe                      shapes unknown, so no estimate;
//   4. overlaps: two overlapping matches of different rules with the same priority are a conflict
//      (gaf::Error naming both rules and the operators); otherwise, among the viable candidates
//      (Fuse or Maybe), higher priority wins, then the larger estimated saving (so overlapping
//      matches of one rule keep the larger saving); each loser is "Skip: overlap" naming the winner;
//   1b. blocked-layout chains (layout_chains.h; rule "blocked-chain", priority above every rule):
//      the cost model prices them like any group, but their intermediates live in main memory in
//      the blocked layout by design, so the local-memory budget does not apply to them;
//   5. the automatic fuser (lowest priority) proposes groups over the nodes no named candidate
//      covers; they go through steps 2-3 under the rule name "auto".
// Every attempt is appended to the decision log.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "cost/cost_model.h"
#include "fusion/auto_fusion.h"
#include "fusion/decision_log.h"
#include "fusion/rules.h"

namespace gaf {

inline constexpr double kAutoBenefitThreshold = 0.05;      // threshold of the automatic fuser's groups
inline constexpr const char* kLayoutChainRule = "blocked-chain";  // rule name of layout chains

struct PlannerOptions {
  double benefit_threshold = -1;  // overrides every rule's threshold when >= 0
  bool auto_fuse = true;
  // Blocked-layout chains (fusion/layout_chains.h) as candidates of the highest priority.
  bool layout_chains = true;
  // Shapes for the cost model; when `shapes_known` is false every candidate is "Maybe" and
  // `shapes_error` says why.
  bool shapes_known = true;
  std::string shapes_error;
  // The model's opset imports (domain -> version). When given, a group whose operator of a
  // standard domain has no ONNX schema at that version is illegal: a function body must be
  // standard ONNX so that other runtimes can inline it.
  std::map<std::string, int64_t> opsets;
};

// Plans fusion of `g` (the canonicalized main graph). Returns every candidate with its verdict
// (ids from 1, in the order of the report). Throws gaf::Error on a rule conflict.
std::vector<FusionCandidate> PlanFusion(const Graph& g, const std::vector<FusionRule>& rules, const ShapeMap& shapes,
                                        const HardwareProfile& hw, const PlannerOptions& options, DecisionLog* log);

// Legality of fusing `nodes` (indices into g.nodes) into one node.
FusionDecision CheckFusionLegality(const Graph& g, const GraphIndex& index, const std::vector<int>& nodes,
                                   const std::map<std::string, int64_t>* opsets = nullptr);

// Values the group reads from outside (first-use order, initializers included) and values it
// produces that are read outside or are graph outputs.
void GroupBoundary(const Graph& g, const GraphIndex& index, const std::vector<int>& nodes,
                   std::vector<std::string>* inputs, std::vector<std::string>* outputs);

}  // namespace gaf
