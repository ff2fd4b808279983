// Fusion rules, presets and the rule file format (docs/rule_format.md).
//
// A rule is: a name, a pattern (a pair "op1+op2", a chain, or a subgraph), the fused op name,
// a priority, a benefit threshold, and the preset it belongs to. Rules never consult the cost
// model: the planner does. Registration is explicit (BuiltinRules() lists them in one place).
#pragma once

#include <string>
#include <vector>

#include "match/pattern.h"

namespace gaf {

struct FusionRule {
  std::string name;          // "LayerNorm+Add", "RMSNormFusion", ...
  Pattern pattern;
  std::string fuse_pattern;  // fused op name, e.g. "FusedRMSNorm"
  int priority = 0;          // higher wins when matches overlap
  double benefit_threshold = 0.0;  // minimum predicted relative time saving (0.05 = 5%)
  std::string preset;        // "transformer", "cnn", "rnn", "user"
  std::string source;        // "builtin" or "file.rules:12"
  std::string formula;       // one line: what the group computes, for reports
  std::string math = "exact";  // "approx": its kernel may use fast low-precision math (gated by FuseSafe)
};

// "op1+op2": op2 consumes op1's output (in any input slot; commutative-aware).
// "op1+op2+op3": a chain. Op names may be alternatives "Relu|Clip".
Pattern ChainPattern(const std::string& chain);

std::vector<FusionRule> BuiltinRules();
// Rules of a preset ("transformer", "cnn", "rnn"); "all" = every built-in rule. Unknown name ->
// gaf::Error listing the presets.
std::vector<FusionRule> PresetRules(const std::string& preset);
// Parses a rule file; errors name the file and line.
std::vector<FusionRule> LoadRuleFile(const std::string& path);
std::vector<FusionRule> ParseRules(const std::string& text, const std::string& source_name);

// Every graph node where `rule` matches, in graph order (matches may overlap; the planner decides).
std::vector<PatternMatch> FindAllMatches(const Graph& g, const GraphIndex& index, const FusionRule& rule);

// One attempt of a rule at a node whose op type the root accepts: the match, or why it failed.
// `near_miss` is true when the operators matched but a whole-group check rejected the match
// (an interior value used outside, a graph output inside), the attempts a decision log records.
// `gave_up` marks the last attempt when the rule spent its step budget (GlobalLimits().
// max_match_steps for the rule on this graph, ir/limits.h): the reason says so and the nodes after
// `root` were not tried.
struct MatchAttempt {
  int root = -1;
  std::optional<PatternMatch> match;
  std::string reason;
  bool near_miss = false;
  bool gave_up = false;
};
std::vector<MatchAttempt> TryRule(const Graph& g, const GraphIndex& index, const FusionRule& rule);

// Names of the built-in presets: "transformer", "cnn", "rnn".
std::vector<std::string> PresetNames();

}  // namespace gaf
