#include "fusion/decision_log.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>

namespace gaf {

namespace {

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string Join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

}  // namespace

int DecisionLog::Append(DecisionRecord r) {
  r.seq = static_cast<int>(records_.size());
  records_.push_back(std::move(r));
  return records_.back().seq;
}

std::vector<DecisionRecord> DecisionLog::ForNode(const std::string& node_name) const {
  std::vector<DecisionRecord> out;
  for (const DecisionRecord& r : records_)
    if (std::find(r.nodes.begin(), r.nodes.end(), node_name) != r.nodes.end()) out.push_back(r);
  return out;
}

std::vector<DecisionRecord> DecisionLog::ForRule(const std::string& rule) const {
  std::vector<DecisionRecord> out;
  const std::string want = Lower(rule);
  for (const DecisionRecord& r : records_)
    if (Lower(r.rule) == want) out.push_back(r);
  return out;
}

std::string DecisionLog::Format(const DecisionRecord& r) {
  std::string s = fmt::format("#{} [{}] ", r.seq, r.stage);
  if (r.candidate >= 0) s += fmt::format("candidate {} ", r.candidate);
  s += fmt::format("rule {}", r.rule.empty() ? "-" : r.rule);
  if (!r.fused_op.empty()) s += fmt::format(" -> {}", r.fused_op);
  s += fmt::format(": {}\n", r.decision);
  if (!r.nodes.empty()) s += fmt::format("    operators: {}\n    nodes: {}\n", Join(r.op_types, "+"), Join(r.nodes, ", "));
  if (!r.reason.empty()) s += fmt::format("    reason: {}\n", r.reason);
  if (r.has_estimate) {
    s += fmt::format("    estimate: time {:.3f} -> {:.3f} us, memory traffic {:.4f} -> {:.4f} MB", r.time_before_us,
                     r.time_after_us, r.bytes_before / 1e6, r.bytes_after / 1e6);
    if (r.local_memory_bytes > 0)
      s += fmt::format(", on-chip footprint {:.1f} KB of {:.1f} KB", r.footprint_bytes / 1024,
                       r.local_memory_bytes / 1024);
    s += "\n";
  }
  return s;
}

std::string DecisionLog::ToJson(const std::vector<DecisionRecord>& records, int indent) {
  nlohmann::json arr = nlohmann::json::array();
  for (const DecisionRecord& r : records) {
    nlohmann::json j{{"seq", r.seq},       {"stage", r.stage},       {"rule", r.rule},
                     {"fused_op", r.fused_op}, {"nodes", r.nodes},   {"op_types", r.op_types},
                     {"decision", r.decision}, {"reason", r.reason}};
    if (r.candidate >= 0) j["candidate"] = r.candidate;
    if (r.has_estimate) {
      j["time_before_us"] = r.time_before_us;
      j["time_after_us"] = r.time_after_us;
      j["bytes_before"] = r.bytes_before;
      j["bytes_after"] = r.bytes_after;
      j["footprint_bytes"] = r.footprint_bytes;
      j["local_memory_bytes"] = r.local_memory_bytes;
    }
    arr.push_back(std::move(j));
  }
  return arr.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace gaf
