#include "runtime/plan_calls.h"

#include <fmt/format.h>

#include <set>
#include <unordered_map>
#include <unordered_set>

#include "runtime/plan_rewrite.h"
#include "runtime/session.h"

namespace gaf {

namespace {

// Plan operators a kernel for a call cannot match: they read operands where they are outside the
// call (a key/value cache, appended in place; its repeat per query head never made) or weights
// packed once at load for products that share an input. The row operators (RMSNorm, RotaryHalf,
// SiLUGate, MaskedSoftmax) are one pass each, as a generated kernel of the same body is.
struct AheadOp {
  const char* op;
  const char* why;
};
constexpr AheadOp kAheadOfKernels[] = {
    {"FusedAttention", "attention reading the key/value cache where it is"},
    {"GroupedMatMul", "a product reading its transposed or repeated operand where it is"},
    {"SiblingMatMul", "products of one input on weights packed at load"},
    {"GatedMatMul", "a SwiGLU MLP's gate and up products on one copy of their weights packed at load, the gate in their tasks"},
};

// Rounds of the trial below: each keeps the calls the last one found and drops the others, so it
// converges in two unless a call's rewrite needed the body of a call that was dropped.
constexpr int kMaxRounds = 8;

std::string CallKey(const Node& n) { return n.outputs.empty() ? n.name : n.outputs[0]; }

// Names of `n` and of every node in its subgraphs, depth first (bounded by the graph's own size:
// the rewrites nest a plan node's originals one level per rewrite).
void CollectNames(const Node& n, std::vector<std::string>* out) {
  out->push_back(n.name);
  for (const Attribute& a : n.attributes) {
    if (a.g)
      for (const Node& m : a.g->nodes) CollectNames(m, out);
    for (const auto& g : a.graphs)
      if (g)
        for (const Node& m : g->nodes) CollectNames(m, out);
  }
}

// One trial: a copy of `model` with the main graph's calls inlined (those in `only`, or all when
// it is null; the others stay calls), rewritten by the plan. Returns the inlined main-graph calls
// every operator of which the rewrites replaced, one of them by an operator in kAheadOfKernels.
std::map<std::string, std::string> Trial(const Model& model, bool group_siblings, bool fold_residuals,
                                         const std::set<std::pair<std::string, std::string>>& top,
                                         const std::set<std::string>* only) {
  // Inline the calls on a copy, recording each expansion's name prefix (the i-th call expanded
  // gets counter i: InlineFunctions asks `keep` right before each expansion, and only then).
  Model trial = model;
  struct Call {
    std::string key;
    bool top = false;
    std::string prefix;
    size_t body = 0, absorbed = 0;
    std::set<std::string> ops;
  };
  std::vector<Call> calls;
  InlineFunctions(trial, [&](const Node& call, const Function& f) {
    const bool is_top = top.count({call.name, CallKey(call)}) > 0;
    if (is_top && only != nullptr && !only->count(CallKey(call))) return true;  // stays a call
    const size_t counter = calls.size();
    calls.push_back({CallKey(call), is_top,
                     fmt::format("{}__{}_{}/", call.name.empty() ? f.name : call.name, f.name, counter)});
    return false;
  });
  std::unordered_map<std::string, size_t> by_prefix;
  for (size_t i = 0; i < calls.size(); ++i)
    if (calls[i].top) by_prefix.emplace(calls[i].prefix, i);
  std::map<std::string, std::string> out;
  if (by_prefix.empty()) return out;
  // The outermost call a node's name places it in (a nested call's prefix extends its caller's).
  auto call_of = [&](const std::string& name) -> Call* {
    for (size_t pos = name.find('/'); pos != std::string::npos; pos = name.find('/', pos + 1)) {
      auto it = by_prefix.find(name.substr(0, pos + 1));
      if (it != by_prefix.end()) return &calls[it->second];
    }
    return nullptr;
  };
  std::vector<std::string> before;
  for (const Node& n : trial.graph.nodes) before.push_back(n.name);

  RewriteProducts(trial, group_siblings, fold_residuals);

  std::unordered_set<std::string> kept_as_is;  // operators the rewrites left
  for (const Node& n : trial.graph.nodes) {
    if (n.domain != kPlanDomain) {
      kept_as_is.insert(n.name);
      continue;
    }
    std::vector<std::string> names;
    CollectNames(n, &names);
    for (const std::string& name : names)
      if (Call* c = call_of(name)) c->ops.insert(n.op_type);
  }
  for (const std::string& name : before)
    if (Call* c = call_of(name)) {
      ++c->body;
      c->absorbed += kept_as_is.count(name) ? 0 : 1;
    }
  for (const Call& c : calls) {
    if (!c.top || c.body == 0 || c.absorbed != c.body || c.ops.empty()) continue;
    std::string ops, why;
    for (const std::string& op : c.ops) ops += (ops.empty() ? "" : ", ") + op;
    for (const AheadOp& a : kAheadOfKernels)
      if (c.ops.count(a.op)) why += (why.empty() ? "" : "; ") + std::string(a.why);
    if (why.empty()) continue;
    out[c.key] = ops + " (" + why + ")";
  }
  return out;
}

}  // namespace

std::map<std::string, std::string> CallsThePlanRewrites(const Model& model, bool group_siblings, bool fold_residuals) {
  if (model.functions.empty()) return {};
  // The main graph's calls, by name and key (a nested call's output may be renamed to its
  // caller's, but its name carries the caller's prefix).
  std::set<std::pair<std::string, std::string>> top;
  for (const Node& n : model.graph.nodes) top.emplace(n.name, CallKey(n));
  // With every call inlined, then with only the calls found so far: a call whose rewrite needed
  // operators of a call that keeps its kernel is dropped, until the set holds.
  std::map<std::string, std::string> found = Trial(model, group_siblings, fold_residuals, top, nullptr);
  for (int round = 0; round < kMaxRounds && !found.empty(); ++round) {
    std::set<std::string> only;
    for (const auto& [key, ops] : found) only.insert(key);
    std::map<std::string, std::string> again = Trial(model, group_siblings, fold_residuals, top, &only);
    if (again.size() == found.size()) return again;  // a subset of `only`, as large: the same calls
    found = std::move(again);
  }
  return {};  // none, or not settled: every call keeps its kernel
}

}  // namespace gaf
