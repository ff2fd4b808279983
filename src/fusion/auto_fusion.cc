// GraphAutoFusion: canonicalize, load rules and the profile, plan, estimate, rewrite, save.
#include "fusion/auto_fusion.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <set>

#include "fusion/planner.h"
#include "fusion/rewrite.h"
#include "ir/error.h"
#include "match/pattern.h"
#include "onnx_io/onnx_io.h"

namespace gaf {

namespace {

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool LooksLikeFile(const std::string& s) {
  return s.find('/') != std::string::npos || (s.size() > 5 && s.substr(s.size() - 5) == ".json") ||
         std::filesystem::exists(s);
}

}  // namespace

const char* VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kFuse: return "Fuse";
    case Verdict::kSkipLowBenefit: return "Skip: low benefit";
    case Verdict::kSkipLocalMemory: return "Skip: local-memory overflow";
    case Verdict::kSkipPrecision: return "Skip: precision";
    case Verdict::kSkipSpeed: return "Skip: speed";
    case Verdict::kSkipCompile: return "Skip: compile";
    case Verdict::kSkipOverlap: return "Skip: overlap";
    case Verdict::kSkipIllegal: return "Skip: illegal";
    case Verdict::kSkipRuntime: return "Skip: runtime";
    case Verdict::kMaybe: return "Maybe";
  }
  return "?";
}

GraphAutoFusion::GraphAutoFusion(const Model& model, FusionOptions options)
    : original_(model), model_(model), options_(std::move(options)) {
  canon_log_ = Canonicalize(model_);
  hw_ = LooksLikeFile(options_.profile) ? HardwareProfile::Load(options_.profile)
                                        : HardwareProfile::Builtin(options_.profile);

  std::vector<FusionRule> file_rules;
  if (!options_.rules_file.empty()) file_rules = LoadRuleFile(options_.rules_file);
  const std::string preset = Lower(options_.preset);
  if (!options_.fuse_rules.empty()) {
    // Named rules from every built-in rule and the rule file; an unknown "Op1+Op2" name is a chain.
    std::vector<FusionRule> pool = BuiltinRules();
    pool.insert(pool.end(), file_rules.begin(), file_rules.end());
    for (const std::string& want : options_.fuse_rules) {
      auto it = std::find_if(pool.begin(), pool.end(), [&](const FusionRule& r) { return Lower(r.name) == Lower(want); });
      if (it != pool.end()) {
        rules_.push_back(*it);
        continue;
      }
      if (want.find('+') == std::string::npos) {
        std::string names;
        for (const FusionRule& r : pool) names += (names.empty() ? "" : ", ") + r.name;
        throw Error(fmt::format("fuse_rules names an unknown rule '{}'; known rules: {} (or a chain like 'MatMul+Relu')",
                                want, names));
      }
      FusionRule r;
      r.name = want;
      r.pattern = ChainPattern(want);
      std::string fused = "Fused";
      for (char c : want)
        if (c != '+' && c != '|') fused += c;
      r.fuse_pattern = fused;
      r.preset = "user";
      r.source = "fuse_rules";
      rules_.push_back(std::move(r));
    }
  } else {
    if (preset != "none" && !preset.empty()) rules_ = PresetRules(preset);
    rules_.insert(rules_.end(), file_rules.begin(), file_rules.end());
  }
}

void GraphAutoFusion::AddFusionRule(FusionRule rule) {
  GAF_CHECK(!rule.name.empty(), "AddFusionRule: the rule has no name");
  GAF_CHECK(!rule.pattern.nodes.empty(), "AddFusionRule: rule '{}' has an empty pattern", rule.name);
  if (rule.source.empty()) rule.source = "AddFusionRule";
  if (rule.preset.empty()) rule.preset = "user";
  rules_.push_back(std::move(rule));
  analyzed_ = false;
  fused_done_ = false;
}

void GraphAutoFusion::RecordShapesOnce() {
  if (shapes_done_) return;
  shapes_done_ = true;
  try {
    // The workload's first sample when there is one (the user's inputs, a decoder's prefill),
    // else random inputs with consistently bound dims. A failed run is an error naming the node
    // and the dims (cost/workload.cc), kept in shapes_error_: no shapes are made up.
    shapes_ = options_.workload.empty() ? RecordShapes(model_, options_.dims)
                                        : RecordShapes(model_, options_.workload.samples[0]);
    shapes_known_ = true;  // values whose shapes were not recorded make their candidates "Maybe"
  } catch (const std::exception& e) {
    shapes_known_ = false;
    shapes_ = {};
    shapes_error_ = fmt::format("running the model to record shapes failed{}: {}",
                                options_.workload.empty() ? "" : " on " + options_.workload.source, e.what());
  }
}

const std::vector<FusionCandidate>& GraphAutoFusion::AnalyzeFusionBenefit() {
  if (analyzed_) return candidates_;
  RecordShapesOnce();
  PlannerOptions po;
  po.benefit_threshold = options_.benefit_threshold;
  po.auto_fuse = options_.auto_fuse;
  po.layout_chains = options_.layout_chains;
  po.shapes_known = shapes_known_;
  po.shapes_error = shapes_error_;
  for (const OpsetImport& o : model_.opset_imports) po.opsets[o.domain] = o.version;
  log_.Clear();
  for (const std::string& line : canon_log_) {
    DecisionRecord r;
    r.stage = "canonicalize";
    r.decision = "Info";
    r.reason = line;
    log_.Append(r);
  }
  candidates_ = PlanFusion(model_.graph, rules_, shapes_, hw_, po, &log_);
  analyzed_ = true;
  fused_done_ = false;
  return candidates_;
}

FusionEstimate GraphAutoFusion::EstimateFusionBenefit() {
  AnalyzeFusionBenefit();
  FusionEstimate e;
  e.profile = hw_.name;
  const Graph& g = model_.graph;
  e.nodes_before = static_cast<int>(g.nodes.size());
  e.nodes_after = e.nodes_before;
  e.candidates = static_cast<int>(candidates_.size());
  if (!shapes_known_) {
    e.note = fmt::format("No whole-model estimate: {}.", shapes_error_);
  } else {
    int unknown = 0;
    const GraphIndex index(g);
    for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i) {
      bool known = true;
      for (const std::string& o : g.nodes[i].outputs) {
        auto it = shapes_.find(o);
        known &= o.empty() || (it != shapes_.end() && it->second.known);
      }
      if (!known) {
        ++unknown;
        continue;
      }
      const GroupCost c = EstimateGroupCost(g, {i}, shapes_, hw_, index);
      e.time_before_us += c.time_before_us;
      e.bytes_before += c.bytes_before;
    }
    if (unknown > 0) e.note = fmt::format("{} node(s) with unrecorded shapes are left out of the totals.", unknown);
  }
  e.time_after_us = e.time_before_us;
  e.bytes_after = e.bytes_before;
  for (const FusionCandidate& c : candidates_) {
    if (c.verdict != Verdict::kFuse) {
      e.skipped_by_reason[VerdictName(c.verdict)]++;
      continue;
    }
    e.fused++;
    e.time_after_us -= c.cost.time_before_us - c.cost.time_after_us;
    e.bytes_after -= c.cost.bytes_before - c.cost.bytes_after;
    e.nodes_after -= static_cast<int>(c.nodes.size()) - 1;
  }
  e.predicted_speedup = e.time_after_us > 0 ? e.time_before_us / e.time_after_us : 1.0;
  return e;
}

Model GraphAutoFusion::Fuse() {
  if (fused_done_) return fused_;
  AnalyzeFusionBenefit();
  std::vector<RewriteGroup> groups;
  for (const FusionCandidate& c : candidates_) {
    if (c.verdict != Verdict::kFuse) continue;
    std::string math = "exact";
    for (const FusionRule& r : rules_)
      if (r.name == c.rule) math = r.math;
    groups.push_back({c.nodes, c.fused_op, c.rule, c.rule_source, c.id, math});
  }
  std::vector<RewrittenGroup> done;
  fused_ = RewriteFusedGroups(model_, groups, &done);
  fused_nodes_.clear();
  for (const RewrittenGroup& r : done) fused_nodes_.emplace_back(r.node_name, r.candidate);
  fuse_summary_ = FuseSummary();
  fuse_summary_.groups = static_cast<int>(done.size());
  std::set<std::string> fns;
  for (const RewrittenGroup& r : done) {
    fuse_summary_.per_rule[r.rule]++;
    fns.insert(r.op_type);
    DecisionRecord rec;
    rec.candidate = r.candidate;
    rec.stage = "rewrite";
    rec.rule = r.rule;
    rec.fused_op = r.op_type;
    rec.nodes = r.original_nodes;
    for (const FusionCandidate& c : candidates_)
      if (c.id == r.candidate) rec.op_types = c.op_types;
    rec.decision = "Fused";
    rec.reason = fmt::format("Replaced by node '{}' calling the model-local function {}::{}.", r.node_name, kFusedDomain,
                             r.op_type);
    log_.Append(rec);
  }
  fuse_summary_.functions = static_cast<int>(fns.size());
  fuse_summary_.nodes_original = static_cast<int>(original_.graph.nodes.size());
  fuse_summary_.nodes_before = static_cast<int>(model_.graph.nodes.size());
  fuse_summary_.nodes_after = static_cast<int>(fused_.graph.nodes.size());
  const std::vector<std::string> problems = VerifyModel(fused_);
  GAF_CHECK(problems.empty(), "the fused model is structurally invalid (internal error): {}", problems[0]);
  // A fused model must pass the ONNX checker whenever the model as given does; a model that fails
  // it already (old IR versions, contrib ops, missing shapes) is fused anyway and the message kept.
  const std::string checker = CheckModel(fused_);
  fuse_summary_.checker_passed = checker.empty();
  fuse_summary_.checker_message = checker;
  if (!checker.empty()) {
    const std::string input_checker = CheckModel(original_);
    fuse_summary_.input_checker_passed = input_checker.empty();
    GAF_CHECK(!input_checker.empty(), "the fused model fails the ONNX checker although the input passes it (internal error): {}",
              checker);
  } else {
    fuse_summary_.input_checker_passed = true;  // not checked separately: the fused model passes
  }
  fused_done_ = true;
  return fused_;
}

Model GraphAutoFusion::RollBack(const std::map<int, std::pair<Verdict, std::string>>& rollbacks) {
  for (FusionCandidate& c : candidates_) {
    auto it = rollbacks.find(c.id);
    if (it == rollbacks.end()) continue;
    c.verdict = it->second.first;
    c.reason = it->second.second;
    DecisionRecord rec;
    rec.candidate = c.id;
    rec.stage = "safe";
    rec.rule = c.rule;
    rec.fused_op = c.fused_op;
    rec.nodes = c.node_names;
    rec.op_types = c.op_types;
    rec.decision = std::string("Rolled back (") + VerdictName(c.verdict) + ")";
    rec.reason = c.reason;
    log_.Append(rec);
  }
  fused_done_ = false;
  return Fuse();
}

void GraphAutoFusion::Save(const std::string& path) {
  if (!fused_done_) Fuse();
  // Large weights go to "<file>.<hash>.data" beside the model (as exporters do): protobuf cannot hold
  // over 2 GiB, and loading external data places big tensors in aligned, huge-page memory.
  size_t bytes = 0;
  for (const auto& [name, t] : fused_.graph.initializers) bytes += t.nbytes();
  SaveOptions so;
  so.external_data = bytes >= (size_t{64} << 20);
  SaveModel(fused_, path, so);
}

}  // namespace gaf
