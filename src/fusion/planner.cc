// The fusion planner (algorithm in planner.h).
#include "fusion/planner.h"

#ifndef ONNX_NAMESPACE
#define ONNX_NAMESPACE onnx
#endif
#ifndef ONNX_ML
#define ONNX_ML 1
#endif
#include <onnx/defs/schema.h>

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <map>
#include <set>
#include <unordered_set>

#include "fusion/auto_fuser.h"
#include "fusion/layout_chains.h"
#include "ir/error.h"

namespace gaf {

namespace {

std::string Join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

std::string NodeLabel(const Node& n, int idx) { return n.name.empty() ? fmt::format("#{}", idx) : n.name; }

std::string Percent(double x) { return fmt::format("{:.1f}%", x * 100); }

// Candidate plus the planner's bookkeeping.
struct Work {
  FusionCandidate c;
  int priority = 0;
  double threshold = 0;
  double saving_us = 0;  // time_before - time_after (0 without an estimate)
  bool has_estimate = false;
  int rule_order = 0;
};

// A blocked-layout chain is priced by what it changes: unfused, every convolution changes the
// layout of its input and output (NCHW to blocked and back: a read and a write of each); the
// chain changes it only for its own inputs and outputs. Its operators' own traffic and compute
// are counted unfused on both sides (intermediates still go through main memory, in the blocked
// layout), so the estimate credits no epilogue fusion.
void PriceLayoutChain(const Graph& g, FusionCandidate& c, const ShapeMap& shapes, const HardwareProfile& hw) {
  auto bytes = [&](const std::string& v) {
    auto it = shapes.find(v);
    if (it == shapes.end() || !it->second.known) return 0.0;
    double n = 4;
    for (int64_t d : it->second.shape) n *= static_cast<double>(d);
    return n;
  };
  double per_conv = 0, boundary = 0;
  for (int i : c.nodes)
    if (g.nodes[i].op_type == "Conv") per_conv += 2 * (bytes(g.nodes[i].inputs[0]) + bytes(g.nodes[i].outputs[0]));
  for (const std::string& v : c.inputs)
    if (g.FindInitializer(v) == nullptr) boundary += 2 * bytes(v);
  for (const std::string& v : c.outputs) boundary += 2 * bytes(v);
  GroupCost& k = c.cost;
  const double bw = hw.bandwidth_gbs > 0 ? hw.bandwidth_gbs * 1e3 : 1e4;  // bytes per us
  k.time_after_us = k.time_before_us + boundary / bw;
  k.time_before_us += per_conv / bw;
  k.bytes_after = k.bytes_before + boundary;
  k.bytes_before += per_conv;
  k.round_trips_after = k.round_trips_before;
  k.tiling = "blocked buffers in main memory";
}

void Evaluate(const Graph& g, const GraphIndex& index, const ShapeMap& shapes, const HardwareProfile& hw,
              const PlannerOptions& options, Work* w) {
  FusionCandidate& c = w->c;
  FusionDecision legal = CheckFusionLegality(g, index, c.nodes, options.opsets.empty() ? nullptr : &options.opsets);
  if (!legal) {
    c.verdict = Verdict::kSkipIllegal;
    c.reason = legal.Explain();
    return;
  }
  if (!options.shapes_known) {
    c.verdict = Verdict::kMaybe;
    c.reason = fmt::format(
        "The shapes of the model could not be recorded ({}), so the cost model has no estimate; the group "
        "is legal to fuse but its benefit is unknown.",
        options.shapes_error.empty() ? "no reason given" : options.shapes_error);
    return;
  }
  for (int i : c.nodes) {
    for (const std::string& o : g.nodes[i].outputs) {
      if (o.empty()) continue;
      auto it = shapes.find(o);
      if (it == shapes.end() || !it->second.known) {
        c.verdict = Verdict::kMaybe;
        c.reason = fmt::format(
            "The shape of '{}' (output of {}) is unknown, so the cost model has no estimate; the group is legal "
            "to fuse but its benefit is unknown.",
            o, g.nodes[i].Describe());
        return;
      }
    }
  }
  c.cost = EstimateGroupCost(g, c.nodes, shapes, hw, index);
  if (c.rule == kLayoutChainRule) PriceLayoutChain(g, c, shapes, hw);
  w->has_estimate = true;
  const GroupCost& k = c.cost;
  w->saving_us = k.time_before_us - k.time_after_us;
  const double saving = k.time_before_us > 0 ? w->saving_us / k.time_before_us : 0.0;
  const std::string times = fmt::format("{:.3f} -> {:.3f} us", k.time_before_us, k.time_after_us);
  if (!k.fits_local_memory && c.rule != kLayoutChainRule) {
    c.verdict = Verdict::kSkipLocalMemory;
    c.reason = fmt::format(
        "The fused kernel's on-chip footprint of {:.1f} KB ({}) exceeds the {:.1f} KB local-memory budget of "
        "profile {}; its intermediates would spill to main memory.",
        k.footprint_bytes / 1024, k.tiling.empty() ? "its tiling" : k.tiling, hw.local_memory_bytes / 1024, hw.name);
    return;
  }
  if (saving < w->threshold) {
    c.verdict = Verdict::kSkipLowBenefit;
    c.reason = fmt::format("Predicted saving {} ({}) is below the benefit threshold of {}.", Percent(saving), times,
                           Percent(w->threshold));
    return;
  }
  c.verdict = Verdict::kFuse;
  if (c.rule == kLayoutChainRule) {
    c.reason = fmt::format(
        "Predicted saving {} ({}; memory traffic {:.4f} -> {:.4f} MB) meets the benefit threshold of {}. A blocked-layout "
        "chain keeps its intermediates in main memory in oneDNN's channel-blocked layout, so the local-memory budget "
        "does not apply; it changes layout only at its {} input(s) and {} output(s).",
        Percent(saving), times, k.bytes_before / 1e6, k.bytes_after / 1e6, Percent(w->threshold),
        std::count_if(c.inputs.begin(), c.inputs.end(), [&](const std::string& v) { return g.FindInitializer(v) == nullptr; }),
        c.outputs.size());
    return;
  }
  c.reason = fmt::format(
      "Predicted saving {} ({}; memory traffic {:.4f} -> {:.4f} MB, round trips {} -> {}) meets the benefit threshold "
      "of {}, and the {:.1f} KB footprint fits the {:.1f} KB local memory.",
      Percent(saving), times, k.bytes_before / 1e6, k.bytes_after / 1e6, k.round_trips_before, k.round_trips_after,
      Percent(w->threshold), k.footprint_bytes / 1024, hw.local_memory_bytes / 1024);
}

DecisionRecord RecordOf(const Work& w, const std::string& stage, const HardwareProfile& hw) {
  DecisionRecord r;
  r.candidate = w.c.id;
  r.stage = stage;
  r.rule = w.c.rule;
  r.fused_op = w.c.fused_op;
  r.nodes = w.c.node_names;
  r.op_types = w.c.op_types;
  r.decision = VerdictName(w.c.verdict);
  r.reason = w.c.reason;
  r.has_estimate = w.has_estimate;
  if (w.has_estimate) {
    r.time_before_us = w.c.cost.time_before_us;
    r.time_after_us = w.c.cost.time_after_us;
    r.bytes_before = w.c.cost.bytes_before;
    r.bytes_after = w.c.cost.bytes_after;
    r.footprint_bytes = w.c.cost.footprint_bytes;
    r.local_memory_bytes = hw.local_memory_bytes;
  }
  return r;
}

Work MakeWork(const Graph& g, const GraphIndex& index, std::vector<int> nodes, const std::string& rule,
              const std::string& fused_op, const std::string& source) {
  Work w;
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  w.c.rule = rule;
  w.c.fused_op = fused_op;
  w.c.rule_source = source;
  w.c.nodes = nodes;
  for (int i : nodes) {
    w.c.node_names.push_back(NodeLabel(g.nodes[i], i));
    w.c.op_types.push_back(g.nodes[i].op_type);
  }
  GroupBoundary(g, index, nodes, &w.c.inputs, &w.c.outputs);
  return w;
}

std::string DescribeNodes(const Graph& g, const std::vector<int>& nodes) {
  std::vector<std::string> parts;
  for (int i : nodes) parts.push_back(fmt::format("{} ({})", NodeLabel(g.nodes[i], i), g.nodes[i].op_type));
  return Join(parts, ", ");
}

// A rule whose matching spent its step budget: a skip with the reason, never a match.
DecisionRecord GaveUpRecord(const Graph& g, const FusionRule& rule, const MatchAttempt& a) {
  DecisionRecord r;
  r.stage = "match";
  r.rule = rule.name;
  r.fused_op = rule.fuse_pattern;
  r.nodes = {NodeLabel(g.nodes[a.root], a.root)};
  r.op_types = {g.nodes[a.root].op_type};
  r.decision = "Skip: gave up";
  r.reason = a.reason;
  return r;
}

}  // namespace

void GroupBoundary(const Graph& g, const GraphIndex& index, const std::vector<int>& nodes,
                   std::vector<std::string>* inputs, std::vector<std::string>* outputs) {
  std::unordered_set<int> in_group(nodes.begin(), nodes.end());
  std::unordered_set<std::string> produced, seen;
  for (int i : nodes)
    for (const std::string& o : g.nodes[i].outputs)
      if (!o.empty()) produced.insert(o);
  inputs->clear();
  outputs->clear();
  for (int i : nodes)
    for (const std::string& v : g.nodes[i].inputs)
      if (!v.empty() && !produced.count(v) && seen.insert(v).second) inputs->push_back(v);
  for (int i : nodes) {
    for (const std::string& o : g.nodes[i].outputs) {
      if (o.empty()) continue;
      bool outside = index.IsGraphOutput(o);
      for (const auto& [c, slot] : index.Consumers(o)) outside |= !in_group.count(c);
      if (outside) outputs->push_back(o);
    }
  }
}

FusionDecision CheckFusionLegality(const Graph& g, const GraphIndex& index, const std::vector<int>& nodes,
                                   const std::map<std::string, int64_t>* opsets) {
  if (nodes.size() < 2) return FusionDecision::Forbid("A fused group needs at least two operators.");
  std::unordered_set<int> in_group(nodes.begin(), nodes.end());
  int last = 0;
  for (int i : nodes) {
    if (i < 0 || i >= static_cast<int>(g.nodes.size()))
      return FusionDecision::Forbid(fmt::format("Node index {} is outside the graph.", i));
    const Node& n = g.nodes[i];
    for (const Attribute& a : n.attributes)
      if (a.g || !a.graphs.empty())
        return FusionDecision::Forbid(
            fmt::format("{} carries a subgraph (attribute '{}'); control flow is not fused.", n.Describe(), a.name));
    if (n.domain == kFusedDomain)
      return FusionDecision::Forbid(fmt::format("{} is already a fused operator.", n.Describe()));
    if (opsets != nullptr && (n.domain.empty() || n.domain == "ai.onnx" || n.domain == "ai.onnx.ml")) {
      const std::string dom = n.domain == "ai.onnx" ? "" : n.domain;
      int64_t version = 0;
      for (const auto& [d, v] : *opsets)
        if ((d == "ai.onnx" ? "" : d) == dom) version = v;
      if (version > 0 && onnx::OpSchemaRegistry::Schema(n.op_type, static_cast<int>(version), dom) == nullptr)
        return FusionDecision::Forbid(fmt::format(
            "{} is not an ONNX operator at opset {} (no schema), so it cannot go into a portable function body.",
            n.Describe(), version));
    }
    last = std::max(last, i);
  }
  std::vector<std::string> ins, outs;
  GroupBoundary(g, index, nodes, &ins, &outs);
  if (outs.empty()) return FusionDecision::Forbid("The group produces no value that is used outside it.");
  // Convexity: no path leaves the group and comes back into it (fusing would create a cycle).
  std::vector<int> stack;
  std::unordered_set<int> visited;
  for (const std::string& o : outs)
    for (const auto& [c, slot] : index.Consumers(o))
      if (!in_group.count(c) && c < last && visited.insert(c).second) stack.push_back(c);
  while (!stack.empty()) {
    const int u = stack.back();
    stack.pop_back();
    for (const std::string& o : g.nodes[u].outputs) {
      if (o.empty()) continue;
      for (const auto& [c, slot] : index.Consumers(o)) {
        if (in_group.count(c))
          return FusionDecision::Forbid(fmt::format(
              "Fusing would create a cycle: a value leaves the group, passes through {} and comes back into {}.",
              g.nodes[u].Describe(), g.nodes[c].Describe()));
        if (c < last && visited.insert(c).second) stack.push_back(c);
      }
    }
  }
  return FusionDecision::Allow();
}

std::vector<FusionCandidate> PlanFusion(const Graph& g, const std::vector<FusionRule>& rules, const ShapeMap& shapes,
                                        const HardwareProfile& hw, const PlannerOptions& options, DecisionLog* log) {
  GraphIndex index(g);
  DecisionLog scratch;
  if (log == nullptr) log = &scratch;
  if (!options.shapes_known) {
    DecisionRecord r;
    r.stage = "shapes";
    r.decision = "Info";
    r.reason = fmt::format("Shapes could not be recorded: {}; every candidate is Maybe.", options.shapes_error);
    log->Append(r);
  }

  // 1. Matches of every rule.
  std::vector<Work> works;
  for (size_t ri = 0; ri < rules.size(); ++ri) {
    const FusionRule& rule = rules[ri];
    std::set<std::vector<int>> seen;
    for (MatchAttempt& a : TryRule(g, index, rule)) {
      if (a.gave_up) log->Append(GaveUpRecord(g, rule, a));
      if (!a.match) continue;
      std::vector<int> nodes = a.match->nodes;
      std::sort(nodes.begin(), nodes.end());
      if (nodes.empty() || !seen.insert(nodes).second) continue;
      Work w = MakeWork(g, index, nodes, rule.name, rule.fuse_pattern.empty() ? "Fused" + rule.name : rule.fuse_pattern,
                        rule.source);
      w.priority = rule.priority;
      w.threshold = options.benefit_threshold >= 0 ? options.benefit_threshold : rule.benefit_threshold;
      w.rule_order = static_cast<int>(ri);
      works.push_back(std::move(w));
    }
  }
  // 1b. Blocked-layout chains.
  if (options.layout_chains && options.shapes_known) {
    for (const LayoutChain& lc : FindLayoutChains(g, index, shapes)) {
      Work w = MakeWork(g, index, lc.nodes, kLayoutChainRule, "FusedBlockedChain",
                        "layout planner (oneDNN blocked layout)");
      w.priority = INT_MAX;
      // The same arithmetic with fewer layout changes: any predicted saving is enough (safe
      // fusion's speed gate then measures it).
      w.threshold = options.benefit_threshold >= 0 ? options.benefit_threshold : 0.0;
      w.rule_order = -1;
      works.push_back(std::move(w));
    }
  }
  std::stable_sort(works.begin(), works.end(), [](const Work& a, const Work& b) {
    return a.c.nodes[0] != b.c.nodes[0] ? a.c.nodes[0] < b.c.nodes[0] : a.rule_order < b.rule_order;
  });
  for (size_t i = 0; i < works.size(); ++i) works[i].c.id = static_cast<int>(i) + 1;

  // 2. Conflicts: overlapping matches of different rules with the same priority.
  std::map<int, std::vector<int>> covering;  // node -> works
  for (size_t wi = 0; wi < works.size(); ++wi)
    for (int n : works[wi].c.nodes) covering[n].push_back(static_cast<int>(wi));
  for (const auto& [node, ws] : covering) {
    for (size_t a = 0; a < ws.size(); ++a) {
      for (size_t b = a + 1; b < ws.size(); ++b) {
        const Work& x = works[ws[a]];
        const Work& y = works[ws[b]];
        if (x.c.rule == y.c.rule || x.priority != y.priority) continue;
        throw Error(fmt::format(
            "Fusion rules '{}' ({}) and '{}' ({}) have the same priority {} and match overlapping operators: '{}' "
            "matches {}; '{}' matches {}; both include {}. Give one rule a higher priority or leave one out "
            "(fuse_rules).",
            x.c.rule, x.c.rule_source.empty() ? "builtin" : x.c.rule_source, y.c.rule,
            y.c.rule_source.empty() ? "builtin" : y.c.rule_source, x.priority, x.c.rule, DescribeNodes(g, x.c.nodes),
            y.c.rule, DescribeNodes(g, y.c.nodes), DescribeNodes(g, {node})));
      }
    }
  }

  // 3. Cost and verdict per candidate.
  for (Work& w : works) Evaluate(g, index, shapes, hw, options, &w);

  // 4. Overlaps among the viable candidates: higher priority, then larger saving, wins.
  auto viable = [](const Work& w) { return w.c.verdict == Verdict::kFuse || w.c.verdict == Verdict::kMaybe; };
  std::vector<int> order;
  for (size_t i = 0; i < works.size(); ++i)
    if (viable(works[i])) order.push_back(static_cast<int>(i));
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    const Work& x = works[a];
    const Work& y = works[b];
    if (x.priority != y.priority) return x.priority > y.priority;
    if (x.saving_us != y.saving_us) return x.saving_us > y.saving_us;
    return x.c.nodes.size() > y.c.nodes.size();
  });
  std::map<int, int> owner;  // node -> winning work
  std::vector<std::string> overlap_reason(works.size());
  for (int wi : order) {
    Work& w = works[wi];
    int winner = -1;
    for (int n : w.c.nodes) {
      auto it = owner.find(n);
      if (it != owner.end()) {
        winner = it->second;
        break;
      }
    }
    if (winner < 0) {
      for (int n : w.c.nodes) owner[n] = wi;
      continue;
    }
    const Work& win = works[winner];
    std::string why;
    if (win.priority != w.priority)
      why = fmt::format("rule '{}' has priority {}, higher than {}", win.c.rule, win.priority, w.priority);
    else
      why = fmt::format("it saves more ({:.3f} us vs {:.3f} us)", win.saving_us, w.saving_us);
    w.c.verdict = Verdict::kSkipOverlap;
    w.c.reason = fmt::format("Overlaps candidate {} ({} of rule '{}', first node {}), which wins because {}.",
                             win.c.id, Join(win.c.op_types, "+"), win.c.rule, win.c.node_names[0], why);
  }

  // 5. The automatic fuser over the nodes no named candidate covers.
  if (options.auto_fuse) {
    std::vector<bool> excluded(g.nodes.size(), false);
    for (const Work& w : works)
      for (int n : w.c.nodes) excluded[n] = true;
    int next_id = static_cast<int>(works.size()) + 1;
    for (const AutoFusionGroup& ag : FindAutoFusionGroups(g, index, excluded)) {
      Work w = MakeWork(g, index, ag.nodes, "auto", ag.fused_op, "auto fuser (op kinds)");
      w.priority = INT_MIN;
      w.threshold = options.benefit_threshold >= 0 ? options.benefit_threshold : kAutoBenefitThreshold;
      w.c.id = next_id++;
      Evaluate(g, index, shapes, hw, options, &w);
      if (w.c.verdict == Verdict::kFuse || w.c.verdict == Verdict::kMaybe)
        w.c.reason = fmt::format("Automatic fuser: {}. {}", ag.reason, w.c.reason);
      works.push_back(std::move(w));
    }
  }

  std::vector<FusionCandidate> out;
  for (const Work& w : works) {
    log->Append(RecordOf(w, w.c.rule == "auto" ? "auto" : (w.c.verdict == Verdict::kSkipOverlap ? "overlap" : "plan"), hw));
    out.push_back(w.c);
  }
  return out;
}

}  // namespace gaf
