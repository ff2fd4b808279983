#include "ir/graph.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <functional>
#include <queue>
#include <set>
#include <sstream>
#include <unordered_set>

namespace gaf {

std::string DimsToString(const std::vector<Dim>& dims) {
  std::vector<std::string> parts;
  for (const Dim& d : dims) parts.push_back(d.known() ? std::to_string(d.value) : (d.param.empty() ? "?" : d.param));
  return fmt::format("[{}]", fmt::join(parts, ","));
}

// ---- Node ----

const Attribute* Node::FindAttr(const std::string& attr_name) const {
  for (const Attribute& a : attributes)
    if (a.name == attr_name) return &a;
  return nullptr;
}

int64_t Node::GetInt(const std::string& attr_name, int64_t def) const {
  const Attribute* a = FindAttr(attr_name);
  if (a == nullptr) return def;
  GAF_CHECK(a->type == Attribute::Type::kInt, "{}: attribute '{}' must be an int", Describe(), attr_name);
  return a->i;
}

float Node::GetFloat(const std::string& attr_name, float def) const {
  const Attribute* a = FindAttr(attr_name);
  if (a == nullptr) return def;
  if (a->type == Attribute::Type::kInt) return static_cast<float>(a->i);
  GAF_CHECK(a->type == Attribute::Type::kFloat, "{}: attribute '{}' must be a float", Describe(), attr_name);
  return a->f;
}

std::string Node::GetString(const std::string& attr_name, const std::string& def) const {
  const Attribute* a = FindAttr(attr_name);
  if (a == nullptr) return def;
  GAF_CHECK(a->type == Attribute::Type::kString, "{}: attribute '{}' must be a string", Describe(), attr_name);
  return a->s;
}

std::vector<int64_t> Node::GetInts(const std::string& attr_name, std::vector<int64_t> def) const {
  const Attribute* a = FindAttr(attr_name);
  if (a == nullptr) return def;
  if (a->type == Attribute::Type::kInt) return {a->i};
  GAF_CHECK(a->type == Attribute::Type::kInts, "{}: attribute '{}' must be a list of ints", Describe(), attr_name);
  return a->ints;
}

std::vector<float> Node::GetFloats(const std::string& attr_name, std::vector<float> def) const {
  const Attribute* a = FindAttr(attr_name);
  if (a == nullptr) return def;
  if (a->type == Attribute::Type::kFloat) return {a->f};
  GAF_CHECK(a->type == Attribute::Type::kFloats, "{}: attribute '{}' must be a list of floats", Describe(),
            attr_name);
  return a->floats;
}

std::vector<std::string> Node::GetStrings(const std::string& attr_name, std::vector<std::string> def) const {
  const Attribute* a = FindAttr(attr_name);
  if (a == nullptr) return def;
  GAF_CHECK(a->type == Attribute::Type::kStrings, "{}: attribute '{}' must be a list of strings", Describe(),
            attr_name);
  return a->strings;
}

const Tensor* Node::GetTensor(const std::string& attr_name) const {
  const Attribute* a = FindAttr(attr_name);
  if (a == nullptr) return nullptr;
  GAF_CHECK(a->type == Attribute::Type::kTensor, "{}: attribute '{}' must be a tensor", Describe(), attr_name);
  return &a->t;
}

const Graph* Node::GetGraph(const std::string& attr_name) const {
  const Attribute* a = FindAttr(attr_name);
  if (a == nullptr) return nullptr;
  GAF_CHECK(a->type == Attribute::Type::kGraph, "{}: attribute '{}' must be a graph", Describe(), attr_name);
  return a->g.get();
}

void Node::SetAttr(Attribute a) {
  for (Attribute& x : attributes) {
    if (x.name == a.name) {
      x = std::move(a);
      return;
    }
  }
  attributes.push_back(std::move(a));
}

std::string Node::Describe() const {
  std::string d = domain.empty() ? op_type : domain + "." + op_type;
  if (!name.empty()) return fmt::format("node '{}' ({})", name, d);
  if (!outputs.empty()) return fmt::format("node producing '{}' ({})", outputs[0], d);
  return fmt::format("unnamed node ({})", d);
}

// ---- Graph / Model ----

const Tensor* Graph::FindInitializer(const std::string& value_name) const {
  for (const auto& [n, t] : initializers)
    if (n == value_name) return &t;
  return nullptr;
}
Tensor* Graph::FindInitializer(const std::string& value_name) {
  for (auto& [n, t] : initializers)
    if (n == value_name) return &t;
  return nullptr;
}
void Graph::SetInitializer(const std::string& value_name, Tensor t) {
  if (Tensor* existing = FindInitializer(value_name)) {
    *existing = std::move(t);
    return;
  }
  initializers.emplace_back(value_name, std::move(t));
}
bool Graph::RemoveInitializer(const std::string& value_name) {
  auto it = std::find_if(initializers.begin(), initializers.end(),
                         [&](const auto& p) { return p.first == value_name; });
  if (it == initializers.end()) return false;
  initializers.erase(it);
  return true;
}
const ValueInfo* Graph::FindValueInfo(const std::string& value_name) const {
  for (const auto* list : {&inputs, &outputs, &value_info})
    for (const ValueInfo& v : *list)
      if (v.name == value_name) return &v;
  return nullptr;
}

int64_t Model::OpsetVersion(const std::string& dom) const {
  auto norm = [](const std::string& d) { return d == "ai.onnx" ? std::string() : d; };
  for (const OpsetImport& o : opset_imports)
    if (norm(o.domain) == norm(dom)) return o.version;
  return 0;
}

const Function* Model::FindFunction(const std::string& dom, const std::string& fname) const {
  for (const Function& f : functions)
    if (f.domain == dom && f.name == fname) return &f;
  return nullptr;
}

// ---- GraphIndex ----

GraphIndex::GraphIndex(const Graph& g) {
  for (int n = 0; n < static_cast<int>(g.nodes.size()); ++n) {
    const Node& node = g.nodes[n];
    for (const std::string& o : node.outputs)
      if (!o.empty()) producer_[o] = n;
    for (int s = 0; s < static_cast<int>(node.inputs.size()); ++s)
      if (!node.inputs[s].empty()) consumers_[node.inputs[s]].emplace_back(n, s);
  }
  for (const ValueInfo& v : g.outputs) graph_outputs_[v.name] = true;
}
int GraphIndex::Producer(const std::string& value) const {
  auto it = producer_.find(value);
  return it == producer_.end() ? -1 : it->second;
}
const std::vector<std::pair<int, int>>& GraphIndex::Consumers(const std::string& value) const {
  auto it = consumers_.find(value);
  return it == consumers_.end() ? empty_ : it->second;
}
bool GraphIndex::IsGraphOutput(const std::string& value) const { return graph_outputs_.count(value) > 0; }

// ---- outer-scope analysis ----

static void CollectOuter(const Graph& g, std::unordered_set<std::string> defined, std::set<std::string>& out) {
  for (const ValueInfo& v : g.inputs) defined.insert(v.name);
  for (const auto& [n, t] : g.initializers) defined.insert(n);
  for (const Node& node : g.nodes) {
    for (const std::string& i : node.inputs)
      if (!i.empty() && !defined.count(i)) out.insert(i);
    for (const Attribute& a : node.attributes) {
      if (a.g) CollectOuter(*a.g, defined, out);
      for (const auto& sg : a.graphs) CollectOuter(*sg, defined, out);
    }
    for (const std::string& o : node.outputs)
      if (!o.empty()) defined.insert(o);
  }
  for (const ValueInfo& v : g.outputs)
    if (!defined.count(v.name)) out.insert(v.name);
}

std::vector<std::string> OuterScopeValues(const Graph& g) {
  std::set<std::string> out;
  CollectOuter(g, {}, out);
  return {out.begin(), out.end()};
}

// ---- topological order ----

// Stable: among ready nodes the one first in the current order goes first, so an already sorted
// graph is unchanged. Subgraph reads of outer values count as dependencies of the owning node.
void SortTopologically(Graph& g) {
  const int n = static_cast<int>(g.nodes.size());
  std::unordered_map<std::string, int> producer;
  for (int i = 0; i < n; ++i)
    for (const std::string& o : g.nodes[i].outputs)
      if (!o.empty()) producer[o] = i;
  std::vector<std::vector<int>> users(n);
  std::vector<int> pending(n, 0);
  for (int i = 0; i < n; ++i) {
    std::set<int> deps;
    auto dep = [&](const std::string& v) {
      auto it = producer.find(v);
      if (it != producer.end() && it->second != i) deps.insert(it->second);
    };
    for (const std::string& v : g.nodes[i].inputs)
      if (!v.empty()) dep(v);
    for (const Attribute& a : g.nodes[i].attributes) {
      if (a.g)
        for (const std::string& v : OuterScopeValues(*a.g)) dep(v);
      for (const auto& sg : a.graphs)
        if (sg)
          for (const std::string& v : OuterScopeValues(*sg)) dep(v);
    }
    pending[i] = static_cast<int>(deps.size());
    for (int d : deps) users[d].push_back(i);
  }
  std::priority_queue<int, std::vector<int>, std::greater<int>> ready;
  for (int i = 0; i < n; ++i)
    if (pending[i] == 0) ready.push(i);
  std::vector<int> order;
  while (!ready.empty()) {
    const int i = ready.top();
    ready.pop();
    order.push_back(i);
    for (int u : users[i])
      if (--pending[u] == 0) ready.push(u);
  }
  if (static_cast<int>(order.size()) != n) {
    for (int i = 0; i < n; ++i)
      if (pending[i] > 0) throw Error(fmt::format("graph '{}' has a cycle through {}", g.name, g.nodes[i].Describe()));
  }
  std::vector<Node> sorted;
  sorted.reserve(n);
  for (int i : order) sorted.push_back(std::move(g.nodes[i]));
  g.nodes = std::move(sorted);
}

// ---- verifier ----

static void VerifyGraphInto(const Graph& g, const std::unordered_set<std::string>& outer,
                            const std::string& where, std::vector<std::string>& problems) {
  std::unordered_set<std::string> defined(outer.begin(), outer.end());
  std::unordered_set<std::string> local;
  auto define = [&](const std::string& n, const std::string& what) {
    if (local.count(n)) problems.push_back(fmt::format("{}: value '{}' is defined twice ({})", where, n, what));
    local.insert(n);
    defined.insert(n);
  };
  for (const ValueInfo& v : g.inputs) define(v.name, "graph input");
  for (const auto& [n, t] : g.initializers) {
    if (local.count(n)) continue;  // initializer that is also a graph input (IR < 4 style)
    define(n, "initializer");
  }
  for (const Node& node : g.nodes) {
    for (const std::string& i : node.inputs)
      if (!i.empty() && !defined.count(i))
        problems.push_back(fmt::format("{}: {} reads '{}', which is not defined before it", where,
                                       node.Describe(), i));
    for (const Attribute& a : node.attributes) {
      if (a.g) VerifyGraphInto(*a.g, defined, where + "/" + node.Describe() + "." + a.name, problems);
      for (const auto& sg : a.graphs)
        VerifyGraphInto(*sg, defined, where + "/" + node.Describe() + "." + a.name, problems);
    }
    for (const std::string& o : node.outputs)
      if (!o.empty()) define(o, node.Describe());
  }
  for (const ValueInfo& v : g.outputs)
    if (!defined.count(v.name))
      problems.push_back(fmt::format("{}: graph output '{}' is never produced", where, v.name));
}

std::vector<std::string> VerifyGraph(const Graph& g, const std::vector<std::string>& outer_scope) {
  std::vector<std::string> problems;
  VerifyGraphInto(g, {outer_scope.begin(), outer_scope.end()}, g.name.empty() ? "graph" : "graph '" + g.name + "'",
                  problems);
  return problems;
}

std::vector<std::string> VerifyModel(const Model& m) {
  std::vector<std::string> problems = VerifyGraph(m.graph);
  for (const Function& f : m.functions) {
    Graph body;
    for (const std::string& i : f.inputs) body.inputs.push_back(ValueInfo{i});
    for (const std::string& o : f.outputs) body.outputs.push_back(ValueInfo{o});
    body.nodes = f.nodes;
    body.name = "function " + f.domain + "." + f.name;
    auto p = VerifyGraph(body);
    problems.insert(problems.end(), p.begin(), p.end());
  }
  return problems;
}

// ---- dump ----

static std::string AttrToString(const Attribute& a, int indent);

static std::string TensorSummary(const Tensor& t) {
  std::string s = fmt::format("{}{}", DataTypeName(t.dtype()), ShapeToString(t.shape()));
  if (t.numel() > 0 && t.numel() <= 8 && t.dtype() != DataType::kString) {
    try {
      s += fmt::format("{{{}}}", fmt::join(t.ToDoubles(), ","));
    } catch (const Error&) {
    }
  }
  return s;
}

static std::string AttrToString(const Attribute& a, int indent) {
  using T = Attribute::Type;
  if (!a.ref_attr_name.empty()) return fmt::format("{}=@{}", a.name, a.ref_attr_name);
  switch (a.type) {
    case T::kFloat: return fmt::format("{}={}", a.name, a.f);
    case T::kInt: return fmt::format("{}={}", a.name, a.i);
    case T::kString: return fmt::format("{}=\"{}\"", a.name, a.s);
    case T::kTensor: return fmt::format("{}={}", a.name, TensorSummary(a.t));
    case T::kFloats: return fmt::format("{}=[{}]", a.name, fmt::join(a.floats, ","));
    case T::kInts: return fmt::format("{}=[{}]", a.name, fmt::join(a.ints, ","));
    case T::kStrings: return fmt::format("{}=[\"{}\"]", a.name, fmt::join(a.strings, "\",\""));
    case T::kGraph: return fmt::format("{}=<graph>\n{}", a.name, DumpGraph(*a.g, indent + 4));
    case T::kGraphs: return fmt::format("{}=<{} graphs>", a.name, a.graphs.size());
    case T::kTensors: return fmt::format("{}=<{} tensors>", a.name, a.tensors.size());
    default: return fmt::format("{}=<opaque>", a.name);
  }
}

static std::string ValueInfoToString(const ValueInfo& v) {
  if (!v.non_tensor_type.empty()) return fmt::format("%{}: {}", v.name, v.non_tensor_type);
  return fmt::format("%{}: {}{}", v.name, DataTypeName(v.dtype), v.has_shape ? DimsToString(v.dims) : "[*]");
}

std::string DumpGraph(const Graph& g, int indent) {
  std::string pad(static_cast<size_t>(indent), ' ');
  std::ostringstream os;
  os << pad << "graph " << (g.name.empty() ? "<unnamed>" : g.name) << " {\n";
  for (const ValueInfo& v : g.inputs) os << pad << "  input  " << ValueInfoToString(v) << "\n";
  for (const auto& [n, t] : g.initializers) os << pad << "  init   %" << n << ": " << TensorSummary(t) << "\n";
  for (const Node& node : g.nodes) {
    std::vector<std::string> outs, ins, attrs;
    for (const auto& o : node.outputs) outs.push_back(o.empty() ? "_" : "%" + o);
    for (const auto& i : node.inputs) ins.push_back(i.empty() ? "_" : "%" + i);
    if (!node.name.empty()) attrs.push_back("name=" + node.name);
    for (const Attribute& a : node.attributes) attrs.push_back(AttrToString(a, indent + 2));
    os << pad << "  " << fmt::format("{}", fmt::join(outs, ", ")) << " = "
       << (node.domain.empty() ? "" : node.domain + ".") << node.op_type << "(" << fmt::format("{}", fmt::join(ins, ", "))
       << ")";
    if (!attrs.empty()) os << " {" << fmt::format("{}", fmt::join(attrs, ", ")) << "}";
    os << "\n";
  }
  for (const ValueInfo& v : g.outputs) os << pad << "  output " << ValueInfoToString(v) << "\n";
  os << pad << "}\n";
  return os.str();
}

std::string DumpModel(const Model& m) {
  std::ostringstream os;
  os << "model ir_version=" << m.ir_version << " producer=" << m.producer_name << " " << m.producer_version << "\n";
  for (const OpsetImport& o : m.opset_imports)
    os << "opset " << (o.domain.empty() ? "ai.onnx" : o.domain) << " " << o.version << "\n";
  for (const auto& [k, v] : m.metadata_props) os << "metadata " << k << " = " << v << "\n";
  for (const Function& f : m.functions) {
    os << "function " << f.domain << "." << f.name << "(" << fmt::format("{}", fmt::join(f.inputs, ", ")) << ") -> ("
       << fmt::format("{}", fmt::join(f.outputs, ", ")) << ")\n";
    Graph body;
    body.nodes = f.nodes;
    os << DumpGraph(body, 2);
  }
  os << DumpGraph(m.graph);
  return os.str();
}

}  // namespace gaf
