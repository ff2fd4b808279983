// Fusion decisions and the decision log.
//
// FusionDecision (after XLA's): either "can fuse" or a sentence saying why not. Legality checks
// are flat runs of early returns, each returning a decision with its reason.
//
// DecisionLog: every attempt the planner, the automatic fuser and the rewrite make is appended as
// one record (rule, nodes, decision, reason, predicted times and bytes). Reports and
// `autofusion explain` are views of this one log.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace gaf {

class [[nodiscard]] FusionDecision {
 public:
  static FusionDecision Allow() { return FusionDecision(); }
  static FusionDecision Forbid(std::string reason) { return FusionDecision(std::move(reason)); }
  bool CanFuse() const { return reason_.empty(); }
  explicit operator bool() const { return CanFuse(); }
  const std::string& Explain() const { return reason_; }

 private:
  FusionDecision() = default;
  explicit FusionDecision(std::string reason) : reason_(std::move(reason)) {}
  std::string reason_;  // empty: can fuse
};

struct DecisionRecord {
  int seq = 0;                        // position in the log
  int candidate = -1;                 // candidate id, -1 when the record is about no candidate
  std::string stage;                  // "match", "plan", "overlap", "auto", "rewrite", "shapes"
  std::string rule;                   // rule name ("auto" for the automatic fuser)
  std::string fused_op;
  std::vector<std::string> nodes;     // original node names
  std::vector<std::string> op_types;
  std::string decision;               // VerdictName(...) or "Fused", "Info"
  std::string reason;                 // a sentence a user reads
  bool has_estimate = false;          // the figures below come from the cost model
  double time_before_us = 0, time_after_us = 0;
  double bytes_before = 0, bytes_after = 0;
  double footprint_bytes = 0, local_memory_bytes = 0;
};

class DecisionLog {
 public:
  int Append(DecisionRecord r);  // returns the record's seq
  const std::vector<DecisionRecord>& records() const { return records_; }
  void Clear() { records_.clear(); }

  // Records mentioning the node (by original name) / of the rule (exact name, case-insensitive).
  std::vector<DecisionRecord> ForNode(const std::string& node_name) const;
  std::vector<DecisionRecord> ForRule(const std::string& rule) const;

  // One record as text (several lines) and all records as a JSON array.
  static std::string Format(const DecisionRecord& r);
  static std::string ToJson(const std::vector<DecisionRecord>& records, int indent = 2);

 private:
  std::vector<DecisionRecord> records_;
};

}  // namespace gaf
