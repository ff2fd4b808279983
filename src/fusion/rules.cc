// Rules as data: the rule-file parser (docs/rule_format.md), chain patterns, presets and the
// "match a rule everywhere" helpers the planner calls.
//
//   rule RMSNormFusion fuse=FusedRMSNorm priority=20 threshold=0.05 preset=user
//     sq   = Pow($x, #2) | Mul($x, $x)
//     var  = ReduceMean(sq) axes=[-1]
//     ...
//   end
//   pair LayerNormalization+Add fuse=FusedLayerNormAdd priority=10
#include "fusion/rules.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "ir/error.h"

namespace gaf {

namespace {

// Nodes one rule (or chain) may have: the largest built-in rule has a dozen; the matcher's
// recursion and the planner's work grow with a rule's size.
constexpr size_t kMaxRuleNodes = 256;

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

bool IsIdentChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.'; }

// Short op names accepted in chains and rule files.
std::string OpAlias(const std::string& op) {
  static const std::map<std::string, std::string> kAliases = {
      {"LayerNorm", "LayerNormalization"}, {"BatchNorm", "BatchNormalization"}, {"BN", "BatchNormalization"},
      {"InstanceNorm", "InstanceNormalization"}, {"GroupNorm", "GroupNormalization"}};
  auto it = kAliases.find(op);
  return it == kAliases.end() ? op : it->second;
}

std::vector<std::string> SplitOps(const std::string& text) {
  std::vector<std::string> ops;
  std::stringstream ss(text);
  std::string op;
  while (std::getline(ss, op, '|')) {
    op = Trim(op);
    if (!op.empty()) ops.push_back(OpAlias(op));
  }
  return ops;
}

// A number as the whole of `text`.
bool ParseNumber(const std::string& text, double* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  *out = std::strtod(text.c_str(), &end);
  return end && *end == '\0';
}

bool LooksNumeric(const std::string& s) {
  return !s.empty() && (std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '-' || s[0] == '+' || s[0] == '.');
}

class RuleParser {
 public:
  RuleParser(const std::string& text, const std::string& source) : text_(text), source_(source) {}

  std::vector<FusionRule> Parse() {
    std::stringstream ss(text_);
    std::string raw;
    int line_no = 0;
    FusionRule* open = nullptr;
    int open_line = 0;
    std::vector<int> node_lines;
    while (std::getline(ss, raw)) {
      ++line_no;
      line_ = line_no;
      std::string line = StripComment(raw);
      if (line.empty()) continue;
      std::string word = line.substr(0, line.find_first_of(" \t"));
      if (open != nullptr) {
        if (word == "end" && Trim(line) == "end") {
          FinishRule(*open, open_line, node_lines);
          open = nullptr;
          continue;
        }
        if (word == "rule" || word == "pair" || word == "chain")
          Throw(fmt::format("rule '{}' (line {}) has no 'end' before this '{}'", open->name, open_line, word));
        if (open->pattern.nodes.size() == kMaxRuleNodes) {
          line_ = open_line;
          Throw(fmt::format("rule '{}' has more than {} nodes (line {} is node {}), more than a rule may have",
                            open->name, kMaxRuleNodes, line_no, kMaxRuleNodes + 1));
        }
        node_lines.push_back(line_no);
        open->pattern.nodes.push_back(ParseNodeLine(line, *open));
        continue;
      }
      if (word == "rule") {
        rules_.push_back(ParseHeader(line.substr(4), /*chain=*/false));
        open = &rules_.back();
        open_line = line_no;
        node_lines.clear();
        ids_.clear();
      } else if (word == "pair" || word == "chain") {
        rules_.push_back(ParseHeader(line.substr(word.size()), /*chain=*/true));
      } else if (word == "end") {
        Throw("'end' without an open rule");
      } else {
        Throw(fmt::format("expected 'rule', 'pair' or 'chain', found '{}'", word));
      }
    }
    if (open != nullptr) {
      line_ = open_line;
      Throw(fmt::format("rule '{}' has no 'end'", open->name));
    }
    std::set<std::string> names;
    for (const FusionRule& r : rules_) {
      if (!names.insert(r.name).second)
        throw Error(fmt::format("{}: two rules are named '{}'", source_, r.name));
    }
    return rules_;
  }

 private:
  [[noreturn]] void Throw(const std::string& what) const {
    throw Error(fmt::format("{}:{}: {}", source_, line_, what));
  }

  // "//" starts a comment (outside quotes); so does "#" as the first character of a line.
  static std::string StripComment(const std::string& raw) {
    std::string t = Trim(raw);
    if (!t.empty() && t[0] == '#') return "";
    bool quoted = false;
    for (size_t i = 0; i + 1 < t.size(); ++i) {
      if (t[i] == '"') quoted = !quoted;
      if (!quoted && t[i] == '/' && t[i + 1] == '/') return Trim(t.substr(0, i));
    }
    return t;
  }

  // key=value tokens; values may be quoted.
  std::vector<std::pair<std::string, std::string>> KeyValues(const std::string& text, std::string* first_word) {
    std::vector<std::pair<std::string, std::string>> kv;
    size_t i = 0;
    bool first = true;
    while (i < text.size()) {
      while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
      if (i >= text.size()) break;
      size_t start = i;
      while (i < text.size() && !std::isspace(static_cast<unsigned char>(text[i])) && text[i] != '=') ++i;
      std::string key = text.substr(start, i - start);
      if (i >= text.size() || text[i] != '=') {
        if (first && first_word) {
          *first_word = key;
          first = false;
          continue;
        }
        Throw(fmt::format("expected key=value, found '{}'", key));
      }
      first = false;
      ++i;
      std::string value;
      if (i < text.size() && text[i] == '"') {
        size_t close = text.find('"', i + 1);
        if (close == std::string::npos) Throw(fmt::format("unterminated string after '{}='", key));
        value = text.substr(i + 1, close - i - 1);
        i = close + 1;
      } else {
        size_t vs = i;
        while (i < text.size() && !std::isspace(static_cast<unsigned char>(text[i]))) ++i;
        value = text.substr(vs, i - vs);
      }
      kv.emplace_back(key, value);
    }
    return kv;
  }

  FusionRule ParseHeader(const std::string& text, bool chain) {
    FusionRule r;
    std::string first;
    auto kv = KeyValues(text, &first);
    if (first.empty()) Throw(chain ? "a pair/chain line needs the ops, e.g. 'pair Conv+Relu'" : "a rule needs a name");
    r.source = fmt::format("{}:{}", source_, line_);
    r.preset = "user";
    if (chain) {
      r.name = first;
      try {
        r.pattern = ChainPattern(first);
      } catch (const Error& e) {
        Throw(e.what());
      }
    } else {
      r.name = first;
    }
    for (const auto& [key, value] : kv) {
      double num = 0;
      if (key == "fuse") {
        r.fuse_pattern = value;
      } else if (key == "priority") {
        if (!ParseNumber(value, &num) || !std::isfinite(num) || num != std::trunc(num))
          Throw(fmt::format("bad number '{}' for priority (an integer)", value));
        if (std::fabs(num) > 1e9) Throw(fmt::format("priority {} is out of range (-1e9 to 1e9)", value));
        r.priority = static_cast<int>(num);
      } else if (key == "threshold") {
        if (!ParseNumber(value, &num) || !(num >= 0 && num <= 1))
          Throw(fmt::format("bad number '{}' for threshold (a relative saving from 0 to 1, e.g. 0.05)", value));
        r.benefit_threshold = num;
      } else if (key == "preset") {
        r.preset = value;
      } else if (key == "formula") {
        r.formula = value;
      } else if (key == "math") {
        if (value != "exact" && value != "approx") Throw(fmt::format("bad value '{}' for math (exact or approx)", value));
        r.math = value;
      } else if (key == "name" && chain) {
        r.name = value;
      } else {
        Throw(fmt::format("unknown key '{}' (expected fuse, priority, threshold, preset, formula, math{})", key,
                          chain ? ", name" : ""));
      }
    }
    if (r.fuse_pattern.empty()) {
      r.fuse_pattern = "Fused";
      for (char c : r.name)
        if (IsIdentChar(c) && c != '.') r.fuse_pattern += c;
    }
    return r;
  }

  // One alternative form: OPS(args) attr=value ...; stops at a top-level '|' or the end.
  PatternNode ParseForm(const std::string& s, size_t* pos, const std::string& id, bool* escapes) {
    PatternNode pn;
    pn.id = id;
    size_t i = *pos;
    auto skip = [&] {
      while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    };
    skip();
    size_t open = s.find('(', i);
    if (open == std::string::npos) Throw(fmt::format("node '{}': expected Op(inputs), found '{}'", id, s.substr(i)));
    std::string ops_text = s.substr(i, open - i);
    for (char c : ops_text)
      if (!IsIdentChar(c) && c != '|' && !std::isspace(static_cast<unsigned char>(c)))
        Throw(fmt::format("node '{}': bad op name '{}'", id, Trim(ops_text)));
    pn.ops = SplitOps(ops_text);
    if (pn.ops.empty()) Throw(fmt::format("node '{}': no op type before '('", id));
    size_t close = s.find(')', open);
    if (close == std::string::npos) Throw(fmt::format("node '{}': missing ')'", id));
    std::string args = s.substr(open + 1, close - open - 1);
    if (!Trim(args).empty()) {
      std::stringstream as(args);
      std::string a;
      while (std::getline(as, a, ',')) {
        a = Trim(a);
        if (a.empty()) Throw(fmt::format("node '{}': empty input in '({})'", id, args));
        if (a == "...") {
          pn.allow_extra_inputs = true;
          continue;
        }
        if (pn.allow_extra_inputs) Throw(fmt::format("node '{}': '...' must be the last input", id));
        if (a[0] == '#') {
          std::string c = a.substr(1);
          double num = 0;
          if (c.empty()) Throw(fmt::format("node '{}': '#' needs a number or a name", id));
          if (LooksNumeric(c) && !ParseNumber(c, &num)) Throw(fmt::format("node '{}': bad number '{}'", id, a));
          if (!LooksNumeric(c))
            for (char ch : c)
              if (!IsIdentChar(ch)) Throw(fmt::format("node '{}': bad constant name '{}'", id, a));
        } else if (a[0] == '$') {
          if (a.size() == 1) Throw(fmt::format("node '{}': '$' needs a name", id));
        } else if (a != "*") {
          for (char ch : a)
            if (!IsIdentChar(ch) && ch != ':') Throw(fmt::format("node '{}': bad input '{}'", id, a));
        }
        pn.inputs.push_back(a);
      }
    }
    i = close + 1;
    while (true) {
      skip();
      if (i >= s.size() || s[i] == '|') break;
      size_t start = i;
      while (i < s.size() && !std::isspace(static_cast<unsigned char>(s[i])) && s[i] != '=' && s[i] != '|') ++i;
      std::string key = s.substr(start, i - start);
      if (key == "export") {
        *escapes = true;
        continue;
      }
      if (i >= s.size() || s[i] != '=')
        Throw(fmt::format("node '{}': expected attribute=value or 'export', found '{}'", id, key));
      ++i;
      std::string value;
      if (i < s.size() && (s[i] == '[' || s[i] == '"')) {
        char want = s[i] == '[' ? ']' : '"';
        size_t end = s.find(want, i + 1);
        if (end == std::string::npos) Throw(fmt::format("node '{}': attribute '{}' has no closing {}", id, key, want));
        value = s.substr(i, end - i + 1);
        i = end + 1;
      } else {
        size_t vs = i;
        while (i < s.size() && !std::isspace(static_cast<unsigned char>(s[i])) && s[i] != '|') ++i;
        value = s.substr(vs, i - vs);
      }
      if (value.empty()) Throw(fmt::format("node '{}': attribute '{}' has no value", id, key));
      double num = 0;
      if (LooksNumeric(value) && !ParseNumber(value, &num))
        Throw(fmt::format("node '{}': bad number '{}' for attribute '{}'", id, value, key));
      if (value[0] == '[') {
        std::stringstream ls(value.substr(1, value.size() - 2));
        std::string item;
        while (std::getline(ls, item, ','))
          if (!ParseNumber(Trim(item), &num))
            Throw(fmt::format("node '{}': bad number '{}' in attribute '{}'", id, Trim(item), key));
      }
      pn.attrs[key] = value;
    }
    *pos = i;
    return pn;
  }

  PatternNode ParseNodeLine(const std::string& line, const FusionRule& r) {
    size_t eq = line.find('=');
    if (eq == std::string::npos) Throw(fmt::format("rule '{}': expected 'id = Op(inputs)' or 'end'", r.name));
    std::string id = Trim(line.substr(0, eq));
    if (id.empty()) Throw(fmt::format("rule '{}': a node line needs an id before '='", r.name));
    for (char c : id)
      if (!IsIdentChar(c)) Throw(fmt::format("rule '{}': bad node id '{}'", r.name, id));
    if (!ids_.insert(id).second) Throw(fmt::format("rule '{}': duplicate node id '{}'", r.name, id));
    std::string rhs = line.substr(eq + 1);
    size_t pos = 0;
    bool escapes = false;
    PatternNode node = ParseForm(rhs, &pos, id, &escapes);
    while (pos < rhs.size() && rhs[pos] == '|') {
      ++pos;
      node.alternatives.push_back(ParseForm(rhs, &pos, id, &escapes));
    }
    node.output_escapes = escapes;
    return node;
  }

  void FinishRule(FusionRule& r, int rule_line, const std::vector<int>& node_lines) {
    line_ = rule_line;
    if (r.pattern.nodes.empty()) Throw(fmt::format("rule '{}' has no nodes", r.name));
    // References must name nodes of the rule.
    std::unordered_map<std::string, int> index;
    for (size_t k = 0; k < r.pattern.nodes.size(); ++k) index[r.pattern.nodes[k].id] = static_cast<int>(k);
    auto refs = [](const PatternNode& n) {
      std::vector<std::string> out;
      std::vector<const PatternNode*> forms = {&n};
      for (const PatternNode& a : n.alternatives) forms.push_back(&a);
      for (const PatternNode* f : forms)
        for (const std::string& in : f->inputs)
          if (in != "*" && in[0] != '$' && in[0] != '#') out.push_back(in.substr(0, in.find(':')));
      return out;
    };
    for (size_t k = 0; k < r.pattern.nodes.size(); ++k) {
      line_ = node_lines[k];
      for (const std::string& ref : refs(r.pattern.nodes[k]))
        if (!index.count(ref))
          Throw(fmt::format("rule '{}': node '{}' reads '{}', which is not a node of the rule (pattern inputs are "
                            "written $name, constants #value or #name, anything *)",
                            r.name, r.pattern.nodes[k].id, ref));
    }
    // No cycles, and every node feeds the root (the last node).
    std::vector<std::vector<int>> reads(r.pattern.nodes.size());
    for (size_t k = 0; k < r.pattern.nodes.size(); ++k)
      for (const std::string& ref : refs(r.pattern.nodes[k])) reads[k].push_back(index[ref]);
    std::vector<int> state = VisitFromRoot(reads, [&](int k) {
      line_ = node_lines[k];
      Throw(fmt::format("rule '{}': node '{}' is part of a cycle", r.name, r.pattern.nodes[k].id));
    });
    for (size_t k = 0; k < r.pattern.nodes.size(); ++k) {
      if (state[k] == 0) {
        line_ = node_lines[k];
        Throw(fmt::format("rule '{}': node '{}' does not feed the root '{}' (the last node)", r.name,
                          r.pattern.nodes[k].id, r.pattern.nodes.back().id));
      }
    }
  }

  // Depth-first from the root (the last node) over `reads`, with an explicit stack: 0 = not
  // reached, 2 = done; `on_cycle(k)` is called (and must throw) when node k reaches itself.
  template <typename OnCycle>
  static std::vector<int> VisitFromRoot(const std::vector<std::vector<int>>& reads, OnCycle&& on_cycle) {
    std::vector<int> state(reads.size(), 0);
    std::vector<std::pair<int, size_t>> stack;  // node, next edge
    const int root = static_cast<int>(reads.size()) - 1;
    state[root] = 1;
    stack.emplace_back(root, 0);
    while (!stack.empty()) {
      auto& [k, next] = stack.back();
      if (next == reads[k].size()) {
        state[k] = 2;
        stack.pop_back();
        continue;
      }
      const int to = reads[k][next++];
      if (state[to] == 1) on_cycle(to);
      if (state[to] == 0) {
        state[to] = 1;
        stack.emplace_back(to, 0);
      }
    }
    return state;
  }

  const std::string& text_;
  std::string source_;
  int line_ = 0;
  std::vector<FusionRule> rules_;
  std::unordered_set<std::string> ids_;  // node ids of the open rule
};

}  // namespace

Pattern ChainPattern(const std::string& chain) {
  Pattern p;
  std::stringstream ss(chain);
  std::string item;
  int k = 0;
  while (std::getline(ss, item, '+')) {
    item = Trim(item);
    std::vector<std::string> ops = SplitOps(item);
    GAF_CHECK(!ops.empty(), "chain '{}': empty op name (write ops as 'Op1+Op2', alternatives 'Relu|Clip')", chain);
    for (const std::string& op : ops)
      for (char c : op)
        GAF_CHECK(IsIdentChar(c), "chain '{}': bad op name '{}'", chain, op);
    GAF_CHECK(static_cast<size_t>(k) < kMaxRuleNodes, "chain '{:.60}...' has more than {} ops, more than a rule may have",
              chain, kMaxRuleNodes);
    PatternNode n;
    n.id = fmt::format("n{}", k);
    n.ops = ops;
    n.allow_extra_inputs = true;
    if (k > 0) {
      n.inputs = {fmt::format("n{}", k - 1)};
      n.input_any_slot = true;
    }
    p.nodes.push_back(std::move(n));
    ++k;
  }
  GAF_CHECK(k >= 1, "chain '{}' names no ops", chain);
  return p;
}

std::vector<FusionRule> ParseRules(const std::string& text, const std::string& source_name) {
  return RuleParser(text, source_name).Parse();
}

std::vector<FusionRule> LoadRuleFile(const std::string& path) {
  std::ifstream f(path);
  GAF_CHECK(f.good(), "cannot open rule file '{}'", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ParseRules(ss.str(), path);
}

std::vector<std::string> PresetNames() { return {"transformer", "cnn", "rnn"}; }

std::vector<FusionRule> PresetRules(const std::string& preset) {
  std::vector<FusionRule> all = BuiltinRules();
  if (preset == "all") return all;
  std::vector<std::string> names = PresetNames();
  GAF_CHECK(std::find(names.begin(), names.end(), preset) != names.end(),
            "unknown preset '{}' (expected transformer, cnn, rnn, all or none)", preset);
  std::vector<FusionRule> out;
  for (FusionRule& r : all)
    if (r.preset == preset) out.push_back(std::move(r));
  return out;
}

namespace {

bool RootAccepts(const PatternNode& root, const std::string& op) {
  if (std::find(root.ops.begin(), root.ops.end(), op) != root.ops.end()) return true;
  for (const PatternNode& a : root.alternatives)
    if (std::find(a.ops.begin(), a.ops.end(), op) != a.ops.end()) return true;
  return false;
}

}  // namespace

std::vector<MatchAttempt> TryRule(const Graph& g, const GraphIndex& index, const FusionRule& rule) {
  std::vector<MatchAttempt> out;
  if (rule.pattern.nodes.empty()) return out;
  const PatternNode& root = rule.pattern.nodes.back();
  MatchBudget budget;  // one for the rule on this graph
  for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i) {
    if (!RootAccepts(root, g.nodes[i].op_type)) continue;
    MatchAttempt a;
    a.root = i;
    a.match = MatchAt(g, index, rule.pattern, i, &a.reason, &budget);
    if (budget.exhausted) {
      a.gave_up = true;
      a.reason = fmt::format("rule '{}' gave up at {} after {} matching steps (the max_match_steps limit of one rule "
                             "on one graph): its pattern backtracks too much; later nodes were not tried",
                             rule.name, g.nodes[i].Describe(), budget.steps_taken);
      out.push_back(std::move(a));
      break;
    }
    // The matcher's whole-group checks word their reasons this way (src/match/matcher.cc).
    a.near_miss = !a.match && (a.reason.rfind("interior value", 0) == 0 || a.reason.rfind("pattern input", 0) == 0);
    out.push_back(std::move(a));
  }
  return out;
}

std::vector<PatternMatch> FindAllMatches(const Graph& g, const GraphIndex& index, const FusionRule& rule) {
  std::vector<PatternMatch> out;
  for (MatchAttempt& a : TryRule(g, index, rule))
    if (a.match) out.push_back(std::move(*a.match));
  return out;
}

}  // namespace gaf
