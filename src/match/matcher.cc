// The pattern matcher: root-anchored, backward, with backtracking.
//
// Algorithm. Matching is a depth-first search over a list of goals "this value must be what this
// pattern slot says". The root's pattern node is bound to the root graph node, its input slots
// become goals, and each goal is solved in turn:
//   - a pattern node id: the value's producer must accept one of the node's forms (op type,
//     attribute constraints, arity); its inputs become new goals. A commutative op with two
//     listed inputs tries both orders; every choice (order, alternative form) is a branch point,
//     and a later failure backtracks to the most recent untried choice.
//   - "$x": binds the value, or checks it equals the earlier binding.
//   - "#2.0" / "#eps": the value must be a scalar constant (equal to 2.0 / captured).
//   - "*": anything.
// When every goal is solved the whole-group checks run (interior values used outside, pattern
// inputs bound to values made inside); a failure there also backtracks. The reason reported on
// failure is the one from the branch that bound the most pattern nodes (the nearest miss).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "ir/error.h"
#include "ir/limits.h"
#include "match/pattern.h"

namespace gaf {

const PatternNode* Pattern::Find(const std::string& id) const {
  for (const PatternNode& n : nodes)
    if (n.id == id) return &n;
  return nullptr;
}

bool IsCommutative(const std::string& op) {
  static const std::set<std::string> kOps = {"Add", "Mul", "Max", "Min", "Sum", "And", "Or", "Xor", "Equal"};
  return kOps.count(op) > 0;
}

namespace {

bool IsConstantNode(const Node& n) { return n.op_type == "Constant" && (n.domain.empty() || n.domain == "ai.onnx"); }

}  // namespace

std::optional<Tensor> ConstantNodeValue(const Node& n) {
  for (const Attribute& a : n.attributes) {
    if (a.name == "value" && a.type == Attribute::Type::kTensor) return a.t;
    if (a.name == "value_float") return Tensor::Scalar<float>(a.f);
    if (a.name == "value_int") return Tensor::Scalar<int64_t>(a.i);
    if (a.name == "value_floats")
      return Tensor::FromVector<float>(a.floats, {static_cast<int64_t>(a.floats.size())});
    if (a.name == "value_ints") return Tensor::FromInt64s(a.ints);
  }
  return std::nullopt;
}

namespace {

// `t` through the Casts met on the way from the constant to the value (innermost last).
std::optional<Tensor> ApplyCasts(std::optional<Tensor> t, const std::vector<const Node*>& casts) {
  for (auto it = casts.rbegin(); it != casts.rend() && t; ++it) {
    if (t->dtype() == DataType::kString) return std::nullopt;
    auto to = static_cast<DataType>((*it)->GetInt("to", 1));
    if (to == DataType::kString || to == DataType::kUndefined) return std::nullopt;
    t = t->CastTo(to);
  }
  return t;
}

}  // namespace

// Walks back through Cast/Identity chains iteratively (a file may make them long).
std::optional<Tensor> ConstantTensor(const Graph& g, const GraphIndex& index, const std::string& value) {
  std::vector<const Node*> casts;
  std::string v = value;
  for (size_t hops = 0; hops <= g.nodes.size(); ++hops) {
    if (v.empty()) return std::nullopt;
    if (const Tensor* t = g.FindInitializer(v)) return ApplyCasts(*t, casts);
    int p = index.Producer(v);
    if (p < 0) return std::nullopt;
    const Node& n = g.nodes[p];
    if (IsConstantNode(n)) return ApplyCasts(ConstantNodeValue(n), casts);
    if ((n.op_type != "Cast" && n.op_type != "Identity") || !n.HasInput(0)) return std::nullopt;
    if (n.op_type == "Cast") casts.push_back(&n);
    v = n.inputs[0];
  }
  return std::nullopt;  // a cycle (an invalid graph)
}

std::optional<double> ConstantScalar(const Graph& g, const GraphIndex& index, const std::string& value) {
  std::optional<Tensor> t = ConstantTensor(g, index, value);
  if (!t || t->numel() != 1 || t->dtype() == DataType::kString) return std::nullopt;
  return t->ScalarAsDouble();
}

namespace {

bool Close(double a, double b, double rel) {
  if (a == b) return true;
  if (std::isnan(a) || std::isnan(b)) return false;
  return std::fabs(a - b) <= rel * std::max(std::fabs(a), std::fabs(b));
}

// Relative tolerance for "#2.0" constants: exporters write truncated constants (sqrt(2) as
// 1.41421 or 1.4142099618911743, sqrt(2/pi) as 0.7978846); matching does not change numerics,
// since the fused function's body keeps the model's own constants.
constexpr double kConstantTolerance = 1e-5;

std::string FormatNumber(double v) { return fmt::format("{:.8g}", v); }

// Parsed attribute value: numbers (a list when `is_list`) or a string.
struct AttrValue {
  bool present = false;
  bool is_list = false;
  bool is_string = false;
  std::vector<double> nums;
  std::string str;

  std::string Text() const {
    if (is_string) return fmt::format("\"{}\"", str);
    std::vector<std::string> parts;
    for (double d : nums) parts.push_back(FormatNumber(d));
    if (is_list) return fmt::format("[{}]", fmt::join(parts, ","));
    return parts.empty() ? std::string("?") : parts[0];
  }
};

AttrValue ParseConstraintValue(const std::string& text) {
  AttrValue v;
  v.present = true;
  std::string s = text;
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') {
    v.is_string = true;
    v.str = s.substr(1, s.size() - 2);
    return v;
  }
  if (!s.empty() && s.front() == '[') {
    v.is_list = true;
    GAF_CHECK(s.back() == ']', "attribute constraint '{}' has no closing ']'", text);
    std::string body = s.substr(1, s.size() - 2);
    size_t pos = 0;
    while (pos < body.size()) {
      size_t comma = body.find(',', pos);
      std::string item = body.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
      item.erase(0, item.find_first_not_of(" \t"));
      item.erase(item.find_last_not_of(" \t") + 1);
      if (!item.empty()) {
        char* end = nullptr;
        double d = std::strtod(item.c_str(), &end);
        GAF_CHECK(end && *end == '\0', "attribute constraint '{}': '{}' is not a number", text, item);
        v.nums.push_back(d);
      }
      if (comma == std::string::npos) break;
      pos = comma + 1;
    }
    return v;
  }
  char* end = nullptr;
  double d = std::strtod(s.c_str(), &end);
  if (!s.empty() && end && *end == '\0') {
    v.nums.push_back(d);
    return v;
  }
  v.is_string = true;  // a bare word: a string attribute such as approximate=tanh
  v.str = s;
  return v;
}

// Inputs that carry an attribute in newer opsets (axes of ReduceX since 13/18, Squeeze/Unsqueeze 13).
int AxesInputSlot(const std::string& op) {
  if (op.rfind("Reduce", 0) == 0 || op == "Squeeze" || op == "Unsqueeze") return 1;
  return -1;
}

// ONNX defaults of attributes that patterns constrain (opset 13+ semantics).
std::optional<std::string> DefaultAttr(const std::string& op, const std::string& name) {
  static const std::map<std::pair<std::string, std::string>, std::string> kDefaults = {
      {{"Softmax", "axis"}, "-1"},
      {{"LogSoftmax", "axis"}, "-1"},
      {{"Hardmax", "axis"}, "-1"},
      {{"LayerNormalization", "axis"}, "-1"},
      {{"LayerNormalization", "epsilon"}, "1e-5"},
      {{"BatchNormalization", "epsilon"}, "1e-5"},
      {{"BatchNormalization", "momentum"}, "0.9"},
      {{"InstanceNormalization", "epsilon"}, "1e-5"},
      {{"Gelu", "approximate"}, "\"none\""},
      {{"LeakyRelu", "alpha"}, "0.01"},
      {{"Elu", "alpha"}, "1"},
      {{"Celu", "alpha"}, "1"},
      {{"HardSigmoid", "alpha"}, "0.2"},
      {{"HardSigmoid", "beta"}, "0.5"},
      {{"Gemm", "alpha"}, "1"},
      {{"Gemm", "beta"}, "1"},
      {{"Gemm", "transA"}, "0"},
      {{"Gemm", "transB"}, "0"},
      {{"Flatten", "axis"}, "1"},
      {{"Concat", "axis"}, ""},
      {{"Conv", "group"}, "1"},
      {{"Split", "axis"}, "0"},
      {{"Gather", "axis"}, "0"},
      {{"ReduceMean", "keepdims"}, "1"},
      {{"ReduceSum", "keepdims"}, "1"},
      {{"ReduceMax", "keepdims"}, "1"},
      {{"ReduceMin", "keepdims"}, "1"},
      {{"ReduceProd", "keepdims"}, "1"},
      {{"ReduceL2", "keepdims"}, "1"},
      {{"ReduceSumSquare", "keepdims"}, "1"},
      {{"ReduceLogSumExp", "keepdims"}, "1"},
  };
  auto it = kDefaults.find({op, name});
  if (it == kDefaults.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

AttrValue FromAttribute(const Attribute& a) {
  AttrValue v;
  v.present = true;
  switch (a.type) {
    case Attribute::Type::kFloat: v.nums = {a.f}; break;
    case Attribute::Type::kInt: v.nums = {static_cast<double>(a.i)}; break;
    case Attribute::Type::kString: v.is_string = true; v.str = a.s; break;
    case Attribute::Type::kFloats:
      v.is_list = true;
      for (float f : a.floats) v.nums.push_back(f);
      break;
    case Attribute::Type::kInts:
      v.is_list = true;
      for (int64_t i : a.ints) v.nums.push_back(static_cast<double>(i));
      break;
    case Attribute::Type::kTensor:
      if (a.t.numel() == 1 && a.t.dtype() != DataType::kString) v.nums = {a.t.ScalarAsDouble()};
      else v.present = false;
      break;
    default: v.present = false;
  }
  return v;
}

int RankOf(const Graph& g, const GraphIndex& index, const std::string& value, int depth = 0);

// Number of elements of a 1-D shape value (Expand's and Reshape's shape input): a constant, a
// Shape of a value of known rank, or a Concat of such pieces; -1 when unknown.
int ShapeLength(const Graph& g, const GraphIndex& index, const std::string& value, int depth) {
  if (std::optional<Tensor> t = ConstantTensor(g, index, value)) return static_cast<int>(t->numel());
  int p = index.Producer(value);
  if (p < 0 || depth > 32) return -1;
  const Node& n = g.nodes[p];
  if (n.op_type == "Shape" && n.HasInput(0) && !n.HasAttr("start") && !n.HasAttr("end"))
    return RankOf(g, index, n.inputs[0], depth + 1);
  // Unsqueeze of a scalar (a dim picked out of a Shape by Gather) is one element.
  if (n.op_type == "Unsqueeze" && n.HasInput(0) && RankOf(g, index, n.inputs[0], depth + 1) == 0) {
    const std::vector<int64_t> axes = n.GetInts("axes");
    std::optional<Tensor> t = n.HasInput(1) ? ConstantTensor(g, index, n.inputs[1]) : std::nullopt;
    if (axes.size() == 1 || (t && t->numel() == 1)) return 1;
  }
  if (n.op_type == "Concat") {
    int total = 0;
    for (const std::string& in : n.inputs) {
      int k = in.empty() ? -1 : ShapeLength(g, index, in, depth + 1);
      if (k < 0) return -1;
      total += k;
    }
    return total;
  }
  return -1;
}

// Rank of a value: from initializers and value_info, else derived through its producer for ops
// whose output rank follows from their inputs (models whose shape inference stopped early).
int RankOf(const Graph& g, const GraphIndex& index, const std::string& value, int depth) {
  if (const Tensor* t = g.FindInitializer(value)) return static_cast<int>(t->rank());
  const ValueInfo* vi = g.FindValueInfo(value);
  if (vi && vi->has_shape) return static_cast<int>(vi->dims.size());
  int p = index.Producer(value);
  if (p < 0 || depth > 32) return -1;
  const Node& n = g.nodes[p];
  if (n.outputs.empty() || n.outputs[0] != value || !n.HasInput(0)) return -1;
  static const std::set<std::string> kSameRank = {
      "Relu", "Sigmoid", "Tanh", "Erf", "Exp", "Log", "Sqrt", "Neg", "Abs", "Reciprocal", "Cast", "Identity",
      "Softmax", "LogSoftmax", "Dropout", "LeakyRelu", "Gelu", "Clip", "HardSigmoid", "HardSwish",
      "LayerNormalization", "BatchNormalization", "Conv", "Concat", "Slice", "Softplus", "Elu"};
  static const std::set<std::string> kBroadcast = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min",
                                                   "Where", "And", "Or", "Equal", "MatMul"};
  if (kSameRank.count(n.op_type)) return RankOf(g, index, n.inputs[0], depth + 1);
  if (n.op_type == "Transpose" && n.HasAttr("perm")) return static_cast<int>(n.GetInts("perm").size());
  if (n.op_type == "Shape") return 1;
  if (n.op_type == "Size") return 0;
  if (n.op_type == "Gather" && n.HasInput(1)) {  // rank(data) - 1 + rank(indices)
    const int d = RankOf(g, index, n.inputs[0], depth + 1), i = RankOf(g, index, n.inputs[1], depth + 1);
    return d < 1 || i < 0 ? -1 : d - 1 + i;
  }
  if (n.op_type == "Unsqueeze") {
    const int r = RankOf(g, index, n.inputs[0], depth + 1);
    std::vector<int64_t> axes = n.GetInts("axes");
    if (axes.empty() && n.HasInput(1))
      if (std::optional<Tensor> t = ConstantTensor(g, index, n.inputs[1])) axes = t->ToInt64s();
    return r < 0 || axes.empty() ? -1 : r + static_cast<int>(axes.size());
  }
  if (n.op_type == "Reshape" && n.HasInput(1)) {  // the shape input's length, also when computed
    const int len = ShapeLength(g, index, n.inputs[1], depth + 1);
    if (len >= 0) return len;
  }
  if (n.op_type == "Expand" && n.HasInput(1)) {  // broadcast of the input against the shape
    const int a = RankOf(g, index, n.inputs[0], depth + 1), b = ShapeLength(g, index, n.inputs[1], depth + 1);
    return a < 0 || b < 0 ? -1 : std::max(a, b);
  }
  if (kBroadcast.count(n.op_type)) {
    int r = -1;
    for (const std::string& in : n.inputs) {
      if (in.empty()) continue;
      int ri = RankOf(g, index, in, depth + 1);
      if (ri < 0) return -1;
      r = std::max(r, ri);
    }
    return r;
  }
  if (n.op_type.rfind("Reduce", 0) == 0 && n.GetInt("keepdims", 1) == 1) return RankOf(g, index, n.inputs[0], depth + 1);
  return -1;
}

bool IsAxisAttr(const std::string& name) { return name == "axis" || name == "axes"; }

// The matcher's search state; copied at branch points.
struct State {
  std::map<std::string, int> node_of;
  std::map<int, std::string> id_of;
  std::map<std::string, std::string> inputs;
  std::map<std::string, double> constants;
  std::map<std::string, std::string> attrs;
};

struct Goal {
  std::string spec;   // pattern input text
  std::string value;  // graph value that must satisfy it
  int consumer = -1;  // graph node reading the value (for messages)
  int slot = 0;
};

// Thrown through the search when the step budget is spent.
struct BudgetSpent {};

// Pattern nodes the matcher takes: its recursion is one level per bound pattern node.
constexpr size_t kMaxPatternNodes = 1024;

class Matcher {
 public:
  Matcher(const Graph& g, const GraphIndex& index, const Pattern& p, MatchBudget* budget)
      : g_(g), index_(index), p_(p), budget_(budget) {}

  std::optional<PatternMatch> Run(int root, std::string* why) {
    GAF_CHECK(!p_.nodes.empty(), "pattern has no nodes");
    GAF_CHECK(p_.nodes.size() <= kMaxPatternNodes, "pattern has {} nodes, more than the {} the matcher takes",
              p_.nodes.size(), kMaxPatternNodes);
    GAF_CHECK(root >= 0 && root < static_cast<int>(g_.nodes.size()), "MatchAt: root index {} out of range", root);
    State st;
    std::optional<PatternMatch> result;
    try {
      if (MatchNode(p_.nodes.back(), root, {}, 0, st, &result)) return result;
    } catch (const BudgetSpent&) {
      if (why)
        *why = fmt::format("gave up after {} matching steps (the limit of max_match_steps): the pattern backtracks "
                           "too much on this graph",
                           budget_->steps_taken);
      return std::nullopt;
    }
    if (why) *why = best_reason_.empty() ? "the pattern does not match" : best_reason_;
    return std::nullopt;
  }

 private:
  // One unit of work: a goal solved or a node form tried.
  void Step() {
    if (budget_->steps_taken >= budget_->max_steps) {
      budget_->exhausted = true;
      throw BudgetSpent{};
    }
    ++budget_->steps_taken;
  }

  // Progress of a failed branch: pattern nodes bound, then goals solved in the current list.
  void Fail(const State& st, std::string reason, size_t progress = 0) {
    long depth = static_cast<long>(st.node_of.size()) * 100000 + static_cast<long>(progress);
    if (depth > best_depth_ || best_reason_.empty()) {
      best_depth_ = depth;
      best_reason_ = std::move(reason);
    }
  }

  std::string Where(const Goal& goal) const {
    if (goal.consumer < 0) return fmt::format("value '{}'", goal.value);
    return fmt::format("input {} of {}", goal.slot, g_.nodes[goal.consumer].Describe());
  }

  // Reads the node's value for attribute `name` (attribute, axes input, or ONNX default).
  // Returns false with `why` when it cannot be determined.
  bool ActualAttr(const Node& n, const std::string& name, AttrValue* out, std::string* why) const {
    if (const Attribute* a = n.FindAttr(name)) {
      *out = FromAttribute(*a);
      if (!out->present) *why = fmt::format("{}: attribute '{}' has a type the pattern cannot compare", n.Describe(), name);
      return out->present;
    }
    if (name == "axes" && AxesInputSlot(n.op_type) >= 0) {
      int slot = AxesInputSlot(n.op_type);
      if (!n.HasInput(slot)) {
        if (n.op_type.rfind("Reduce", 0) != 0) {
          *why = fmt::format("{} has no axes", n.Describe());
          return false;
        }
        out->present = true;  // no axes: a reduction over every axis
        out->is_string = true;
        out->str = "all";
        return true;
      }
      std::optional<Tensor> t = ConstantTensor(g_, index_, n.inputs[slot]);
      if (!t) {
        *why = fmt::format("{}: the axes input '{}' is not a constant", n.Describe(), n.inputs[slot]);
        return false;
      }
      out->present = true;
      out->is_list = true;
      for (int64_t v : t->ToInt64s()) out->nums.push_back(static_cast<double>(v));
      return true;
    }
    if (std::optional<std::string> d = DefaultAttr(n.op_type, name)) {
      *out = ParseConstraintValue(*d);
      return true;
    }
    *why = fmt::format("{} has no attribute '{}'", n.Describe(), name);
    return false;
  }

  // Negative axes are normalized with the rank of input 0 when it is known.
  void NormalizeAxes(const Node& n, AttrValue* v) const {
    if (v->is_string || !n.HasInput(0)) return;
    int rank = RankOf(g_, index_, n.inputs[0]);
    if (rank < 0) return;
    for (double& d : v->nums)
      if (d >= 0) d -= rank;  // canonical form: negative
  }

  bool CheckAttrs(const PatternNode& pn, const Node& n, State& st, std::string* why) const {
    for (const auto& [name, text] : pn.attrs) {
      AttrValue actual;
      if (!ActualAttr(n, name, &actual, why)) return false;
      if (IsAxisAttr(name)) NormalizeAxes(n, &actual);
      if (!text.empty() && text[0] == '@') {
        auto it = st.attrs.find(text);
        if (it == st.attrs.end()) {
          st.attrs[text] = actual.Text();
        } else if (it->second != actual.Text()) {
          *why = fmt::format("{}: attribute '{}' is {} but {} was {} elsewhere in the match", n.Describe(), name,
                             actual.Text(), text, it->second);
          return false;
        }
        continue;
      }
      AttrValue want = ParseConstraintValue(text);
      if (IsAxisAttr(name)) NormalizeAxes(n, &want);
      bool ok = want.is_string == actual.is_string;
      if (ok && want.is_string) ok = want.str == actual.str;
      if (ok && !want.is_string) {
        // A scalar constraint also accepts a one-element list ("axes=-1" vs axes=[-1]).
        ok = want.nums.size() == actual.nums.size();
        for (size_t i = 0; ok && i < want.nums.size(); ++i) ok = Close(want.nums[i], actual.nums[i], 1e-5);
      }
      if (!ok) {
        *why = fmt::format("{}: attribute '{}' is {}, the pattern needs {}", n.Describe(), name, actual.Text(),
                           want.Text());
        return false;
      }
    }
    return true;
  }

  static int PresentInputs(const Node& n) {
    int k = static_cast<int>(n.inputs.size());
    while (k > 0 && n.inputs[k - 1].empty()) --k;
    return k;
  }

  // Builds the input goal lists (one per allowed ordering) for form `pn` on node `gi`, or none.
  std::vector<std::vector<Goal>> InputOrders(const PatternNode& pn, int gi, std::string* why) const {
    const Node& n = g_.nodes[gi];
    const int present = PresentInputs(n);
    const int listed = static_cast<int>(pn.inputs.size());
    std::vector<std::vector<Goal>> orders;
    if (pn.input_any_slot && listed == 1) {
      for (int s = 0; s < present; ++s)
        if (!n.inputs[s].empty()) orders.push_back({Goal{pn.inputs[0], n.inputs[s], gi, s}});
      if (orders.empty()) *why = fmt::format("{} has no inputs", n.Describe());
      return orders;
    }
    if (present > listed && !pn.allow_extra_inputs) {
      // The axes input of an op whose axes the pattern constrains counts as part of the constraint.
      int axes_slot = AxesInputSlot(n.op_type);
      bool axes_ok = pn.attrs.count("axes") && axes_slot == listed && present == listed + 1;
      if (!axes_ok) {
        *why = fmt::format("{} has {} inputs, the pattern allows {}", n.Describe(), present, listed);
        return orders;
      }
    }
    std::vector<Goal> base;
    for (int s = 0; s < listed; ++s) {
      const std::string& spec = pn.inputs[s];
      std::string value = s < static_cast<int>(n.inputs.size()) ? n.inputs[s] : std::string();
      if (value.empty()) {
        if (spec == "*") continue;
        *why = fmt::format("{} has no input {}, the pattern needs '{}' there", n.Describe(), s, spec);
        return orders;
      }
      base.push_back(Goal{spec, value, gi, s});
    }
    orders.push_back(base);
    if (listed == 2 && IsCommutative(n.op_type) && base.size() == 2 && base[0].spec != base[1].spec) {
      std::vector<Goal> swapped = base;
      std::swap(swapped[0].value, swapped[1].value);
      std::swap(swapped[0].slot, swapped[1].slot);
      orders.push_back(swapped);
    }
    return orders;
  }

  // Binds pattern node `pn` (any of its forms) to graph node `gi`, then solves its inputs and the
  // remaining goals.
  bool MatchNode(const PatternNode& pn, int gi, const std::vector<Goal>& rest, size_t pos, const State& st,
                 std::optional<PatternMatch>* result) {
    const Node& n = g_.nodes[gi];
    std::vector<const PatternNode*> forms = {&pn};
    for (const PatternNode& alt : pn.alternatives) forms.push_back(&alt);
    for (const PatternNode* form : forms) {
      Step();
      if (std::find(form->ops.begin(), form->ops.end(), n.op_type) == form->ops.end()) {
        Fail(st, fmt::format("{} is not {} (pattern node '{}')", n.Describe(), fmt::join(form->ops, "|"), pn.id));
        continue;
      }
      State s1 = st;
      s1.node_of[pn.id] = gi;
      s1.id_of[gi] = pn.id;
      std::string why;
      if (!CheckAttrs(*form, n, s1, &why)) {
        Fail(s1, why);
        continue;
      }
      std::vector<std::vector<Goal>> orders = InputOrders(*form, gi, &why);
      if (orders.empty()) Fail(s1, why);
      for (const std::vector<Goal>& order : orders) {
        std::vector<Goal> goals(order.begin(), order.end());
        goals.insert(goals.end(), rest.begin() + static_cast<long>(pos), rest.end());
        State s2 = s1;
        if (Solve(goals, 0, s2, result)) return true;
      }
    }
    return false;
  }

  // "#2.0" / "#eps" goals: false (with the reason recorded) when the value does not fit.
  bool SolveConstant(const Goal& goal, size_t pos, State& st) {
    const std::string& spec = goal.spec;
    std::optional<double> c = ConstantScalar(g_, index_, goal.value);
    if (!c) {
      Fail(st, fmt::format("{} ('{}') is not a scalar constant, the pattern needs {}", Where(goal), goal.value, spec), pos);
      return false;
    }
    std::string name = spec.substr(1);
    char* end = nullptr;
    double want = std::strtod(name.c_str(), &end);
    bool numeric = !name.empty() && end && *end == '\0';
    if (numeric) {
      if (Close(*c, want, kConstantTolerance)) return true;
      Fail(st, fmt::format("{} is the constant {}, the pattern needs {}", Where(goal), FormatNumber(*c),
                           FormatNumber(want)), pos);
      return false;
    }
    auto it = st.constants.find(spec);
    if (it != st.constants.end() && !Close(it->second, *c, kConstantTolerance)) {
      Fail(st, fmt::format("{} is the constant {} but {} is already {}", Where(goal), FormatNumber(*c), spec,
                           FormatNumber(it->second)), pos);
      return false;
    }
    st.constants[spec] = *c;
    return true;
  }

  // Solves goals[pos..] on `st`, which the caller owns (it is changed). Goals that leave no
  // choice are solved in this loop; only an unbound pattern node branches (MatchNode), so the
  // recursion is one level per bound pattern node, whatever the number of inputs.
  bool Solve(const std::vector<Goal>& goals, size_t pos, State& st, std::optional<PatternMatch>* result) {
    for (; pos < goals.size(); ++pos) {
      Step();
      const Goal& goal = goals[pos];
      const std::string& spec = goal.spec;
      if (spec == "*") continue;
      if (spec[0] == '$') {
        auto it = st.inputs.find(spec);
        if (it != st.inputs.end() && it->second != goal.value) {
          Fail(st, fmt::format("{} is '{}' but {} is already '{}'", Where(goal), goal.value, spec, it->second), pos);
          return false;
        }
        st.inputs[spec] = goal.value;
        continue;
      }
      if (spec[0] == '#') {
        if (!SolveConstant(goal, pos, st)) return false;
        continue;
      }
      int producer = -1;
      const PatternNode* pn = NodeGoal(goal, pos, st, &producer);
      if (pn == nullptr) return false;
      if (producer < 0) continue;  // already bound to this producer
      return MatchNode(*pn, producer, goals, pos + 1, st, result);
    }
    return Finish(st, result);
  }

  // A pattern node id goal, optionally with an output slot "id:1": the pattern node to bind to
  // *producer, or *producer = -1 when it is already bound to it; nullptr when the goal fails.
  const PatternNode* NodeGoal(const Goal& goal, size_t pos, const State& st, int* producer_out) {
    const std::string& spec = goal.spec;
    std::string id = spec;
    int out_slot = 0;
    if (size_t colon = spec.rfind(':'); colon != std::string::npos) {
      id = spec.substr(0, colon);
      out_slot = std::atoi(spec.c_str() + colon + 1);
    }
    const PatternNode* pn = p_.Find(id);
    GAF_CHECK(pn != nullptr, "pattern refers to unknown node '{}'", id);
    int producer = index_.Producer(goal.value);
    if (producer < 0) {
      Fail(st, fmt::format("{} ('{}') is not produced by a node, the pattern needs {} there", Where(goal),
                           goal.value, fmt::join(pn->ops, "|")), pos);
      return nullptr;
    }
    const Node& pnode = g_.nodes[producer];
    if (out_slot < 0 || out_slot >= static_cast<int>(pnode.outputs.size()) || pnode.outputs[out_slot] != goal.value) {
      Fail(st, fmt::format("{} reads output '{}' of {}, the pattern needs its output {}", Where(goal), goal.value,
                           pnode.Describe(), out_slot), pos);
      return nullptr;
    }
    auto bound = st.node_of.find(id);
    if (bound != st.node_of.end()) {
      if (bound->second != producer) {
        Fail(st, fmt::format("{} comes from {}, but pattern node '{}' is already {}", Where(goal), pnode.Describe(),
                             id, g_.nodes[bound->second].Describe()), pos);
        return nullptr;
      }
      *producer_out = -1;
      return pn;
    }
    if (auto other = st.id_of.find(producer); other != st.id_of.end()) {
      Fail(st, fmt::format("{} is already pattern node '{}', it cannot also be '{}'", pnode.Describe(),
                           other->second, id), pos);
      return nullptr;
    }
    *producer_out = producer;
    return pn;
  }

  // Whole-group checks once every goal is solved.
  bool Finish(const State& st, std::optional<PatternMatch>* result) {
    std::set<int> members;
    for (const auto& [id, gi] : st.node_of) members.insert(gi);
    const int root = st.node_of.at(p_.nodes.back().id);
    for (const auto& [name, value] : st.inputs) {
      int p = index_.Producer(value);
      if (p >= 0 && members.count(p)) {
        Fail(st, fmt::format("pattern input {} would be '{}', which {} inside the group computes", name, value,
                             g_.nodes[p].Describe()), 99999);
        return false;
      }
    }
    for (int gi : members) {
      if (gi == root) continue;
      const PatternNode* pn = p_.Find(st.id_of.at(gi));
      if (pn->output_escapes) continue;
      const Node& n = g_.nodes[gi];
      for (const std::string& out : n.outputs) {
        if (out.empty()) continue;
        if (index_.IsGraphOutput(out)) {
          Fail(st, fmt::format("interior value '{}' of {} (pattern node '{}') is a graph output, so it cannot be "
                               "hidden inside the fused group",
                               out, n.Describe(), pn->id), 99999);
          return false;
        }
        for (const auto& [ci, slot] : index_.Consumers(out)) {
          if (!members.count(ci)) {
            Fail(st, fmt::format("interior value '{}' of {} (pattern node '{}') is also used by {} outside the "
                                 "group, so fusing would have to compute it twice",
                                 out, n.Describe(), pn->id, g_.nodes[ci].Describe()), 99999);
            return false;
          }
        }
      }
    }
    PatternMatch m;
    m.nodes.assign(members.begin(), members.end());  // node order is topological order
    m.node_of = st.node_of;
    m.inputs = st.inputs;
    m.constants = st.constants;
    m.attrs = st.attrs;
    std::set<std::string> seen;
    for (int gi : m.nodes) {
      for (const std::string& in : g_.nodes[gi].inputs) {
        if (in.empty() || seen.count(in)) continue;
        int p = index_.Producer(in);
        if (p >= 0 && members.count(p)) continue;
        seen.insert(in);
        m.external_inputs.push_back(in);
      }
    }
    for (int gi : m.nodes) {
      const Node& n = g_.nodes[gi];
      for (size_t k = 0; k < n.outputs.size(); ++k) {
        const std::string& out = n.outputs[k];
        if (out.empty()) continue;
        bool used_outside = index_.IsGraphOutput(out);
        for (const auto& [ci, slot] : index_.Consumers(out)) used_outside |= !members.count(ci);
        if (used_outside || (gi == root && k == 0)) m.external_outputs.push_back(out);
      }
    }
    *result = std::move(m);
    return true;
  }

  const Graph& g_;
  const GraphIndex& index_;
  const Pattern& p_;
  MatchBudget* budget_;
  long best_depth_ = -1;
  std::string best_reason_;
};

}  // namespace

std::optional<PatternMatch> MatchAt(const Graph& g, const GraphIndex& index, const Pattern& pattern, int root,
                                    std::string* why, MatchBudget* budget) {
  MatchBudget own;
  return Matcher(g, index, pattern, budget != nullptr ? budget : &own).Run(root, why);
}

}  // namespace gaf
