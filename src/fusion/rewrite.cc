// Fused ONNX out (see rewrite.h for the before/after picture).
#include "fusion/rewrite.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <queue>
#include <set>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "fusion/auto_fusion.h"
#include "fusion/planner.h"
#include "ir/error.h"

namespace gaf {

namespace {

std::string TensorKey(const Tensor& t) {
  std::string_view bytes(static_cast<const char*>(t.raw()), t.defined() ? t.nbytes() : 0);
  return fmt::format("T{}:{}:{:x}", static_cast<int>(t.dtype()), ShapeToString(t.shape()),
                     std::hash<std::string_view>{}(bytes));
}

// Canonical text of an attribute: two nodes with equal keys compute the same function.
std::string AttrKey(const Attribute& a) {
  std::string s = fmt::format("{}:{}=", a.name, static_cast<int>(a.type));
  switch (a.type) {
    case Attribute::Type::kFloat: s += fmt::format("{}", a.f); break;
    case Attribute::Type::kInt: s += fmt::format("{}", a.i); break;
    case Attribute::Type::kString: s += fmt::format("{:?}", a.s); break;
    case Attribute::Type::kTensor: s += TensorKey(a.t); break;
    case Attribute::Type::kGraph: s += a.g ? DumpGraph(*a.g) : ""; break;
    case Attribute::Type::kFloats:
      for (float f : a.floats) s += fmt::format("{},", f);
      break;
    case Attribute::Type::kInts:
      for (int64_t i : a.ints) s += fmt::format("{},", i);
      break;
    case Attribute::Type::kStrings:
      for (const std::string& x : a.strings) s += fmt::format("{:?},", x);
      break;
    case Attribute::Type::kTensors:
      for (const Tensor& t : a.tensors) s += TensorKey(t) + ",";
      break;
    case Attribute::Type::kGraphs:
      for (const auto& g : a.graphs) s += (g ? DumpGraph(*g) : "") + ",";
      break;
    default: s += fmt::format("opaque{:x}", std::hash<std::string>{}(a.opaque_proto)); break;
  }
  if (!a.ref_attr_name.empty()) s += "@" + a.ref_attr_name;
  return s;
}

std::string BodySignature(const Function& f) {
  std::string s = fmt::format("in{} out{}\n", f.inputs.size(), f.outputs.size());
  for (const Node& n : f.nodes) {
    s += n.domain + "::" + n.op_type + "(";
    for (const std::string& i : n.inputs) s += i + ",";
    s += ")->(";
    for (const std::string& o : n.outputs) s += o + ",";
    s += ")";
    std::vector<std::string> attrs;
    for (const Attribute& a : n.attributes) attrs.push_back(AttrKey(a));
    std::sort(attrs.begin(), attrs.end());
    for (const std::string& a : attrs) s += " " + a;
    s += "\n";
  }
  return s;
}

}  // namespace


Model RewriteFusedGroups(const Model& model, const std::vector<RewriteGroup>& groups, std::vector<RewrittenGroup>* done) {
  Model out = model;
  Graph& g = out.graph;
  const GraphIndex index(g);
  const int n = static_cast<int>(g.nodes.size());
  std::vector<int> group_of(n, -1);
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    GAF_CHECK(groups[gi].nodes.size() >= 1, "fused group {} (rule '{}') has no nodes", gi, groups[gi].rule);
    for (int i : groups[gi].nodes) {
      GAF_CHECK(i >= 0 && i < n, "fused group of rule '{}' names node index {}, outside the graph", groups[gi].rule, i);
      GAF_CHECK(group_of[i] < 0, "{} is in two fused groups (rules '{}' and '{}')", g.nodes[i].Describe(),
                groups[group_of[i]].rule, groups[gi].rule);
      group_of[i] = static_cast<int>(gi);
    }
  }

  std::set<std::string> used_names;  // function names taken in our domain
  for (const Function& f : out.functions)
    if (f.domain == kFusedDomain) used_names.insert(f.name);
  std::map<std::string, std::string> name_of_signature;
  std::set<std::string> node_names;
  for (const Node& nd : g.nodes) node_names.insert(nd.name);
  std::vector<OpsetImport> body_opsets;
  for (const OpsetImport& o : out.opset_imports)
    if (o.domain != kFusedDomain) body_opsets.push_back(o);

  std::unordered_set<std::string> internal_values;
  std::vector<Node> fused_nodes(groups.size());
  std::vector<int> fused_position(groups.size(), -1);
  nlohmann::json summary = nlohmann::json::array();

  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const RewriteGroup& grp = groups[gi];
    std::vector<int> nodes = grp.nodes;
    std::sort(nodes.begin(), nodes.end());
    std::vector<std::string> ins, outs;
    GroupBoundary(g, index, nodes, &ins, &outs);
    GAF_CHECK(!outs.empty(), "fused group of rule '{}' starting at {} produces no value used outside it", grp.rule,
              g.nodes[nodes[0]].Describe());

    std::unordered_map<std::string, std::string> local;
    Function f;
    f.domain = kFusedDomain;
    f.opset_imports = body_opsets;
    for (size_t k = 0; k < ins.size(); ++k) {
      local[ins[k]] = fmt::format("X{}", k);
      f.inputs.push_back(local[ins[k]]);
    }
    for (size_t k = 0; k < outs.size(); ++k) {
      local[outs[k]] = fmt::format("Y{}", k);
      f.outputs.push_back(local[outs[k]]);
    }
    int tmp = 0;
    std::vector<std::string> original;
    for (int i : nodes) {
      const Node& src = g.nodes[i];
      Node b = src;
      b.name = fmt::format("{}_{}", src.op_type, f.nodes.size());
      b.doc_string.clear();
      for (std::string& v : b.inputs)
        if (!v.empty()) v = local.at(v);  // produced earlier in the group or an external input
      for (std::string& v : b.outputs) {
        if (v.empty()) continue;
        auto it = local.find(v);
        if (it == local.end()) {
          internal_values.insert(v);
          it = local.emplace(v, fmt::format("T{}", tmp++)).first;
        }
        v = it->second;
      }
      f.nodes.push_back(std::move(b));
      original.push_back(src.name.empty() ? fmt::format("#{}", i) : src.name);
    }

    const std::string base = grp.fused_op.empty() ? "Fused" + grp.rule : grp.fused_op;
    const std::string sig = BodySignature(f) + "\nmath=" + grp.math;
    std::string fname;
    auto sit = name_of_signature.find(base + "\n" + sig);
    if (sit != name_of_signature.end()) {
      fname = sit->second;
    } else {
      fname = base;
      for (int k = 2; used_names.count(fname); ++k) fname = fmt::format("{}_{}", base, k);
      used_names.insert(fname);
      name_of_signature[base + "\n" + sig] = fname;
      f.name = fname;
      f.doc_string = fmt::format("graph-autofusion fused operator of rule '{}' ({}): the body is the original subgraph.",
                                 grp.rule, grp.rule_source.empty() ? "builtin" : grp.rule_source);
      if (grp.math == "approx") f.doc_string += " kernel-math=approx";
      out.functions.push_back(std::move(f));
    }

    Node fused;
    fused.op_type = fname;
    fused.domain = kFusedDomain;
    fused.inputs = ins;
    fused.outputs = outs;
    const std::string sep = original[0].rfind('/', 0) == 0 ? "" : "/";
    std::string nm = fmt::format("{}{}{}", fname, sep, original[0]);
    for (int k = 2; node_names.count(nm); ++k) nm = fmt::format("{}{}{}_{}", fname, sep, original[0], k);
    node_names.insert(nm);
    fused.name = nm;
    std::vector<std::string> described;
    for (size_t k = 0; k < nodes.size(); ++k)
      described.push_back(fmt::format("{} ({})", original[k], g.nodes[nodes[k]].op_type));
    fused.doc_string = fmt::format("Fused by graph-autofusion: rule '{}' ({}){}; original nodes: {}", grp.rule,
                                   grp.rule_source.empty() ? "builtin" : grp.rule_source,
                                   grp.candidate >= 0 ? fmt::format(", candidate {}", grp.candidate) : "",
                                   fmt::join(described, ", "));
    fused_nodes[gi] = std::move(fused);
    fused_position[gi] = nodes.back();
    summary.push_back({{"node", nm},
                       {"op_type", fname},
                       {"domain", kFusedDomain},
                       {"rule", grp.rule},
                       {"rule_source", grp.rule_source.empty() ? "builtin" : grp.rule_source},
                       {"candidate", grp.candidate},
                       {"original_nodes", original}});
    if (done) done->push_back({nm, fname, grp.rule, grp.candidate, original});
  }

  std::vector<Node> nodes;
  nodes.reserve(n);
  std::vector<int> fused_at(n, -1);
  for (size_t gi = 0; gi < groups.size(); ++gi) fused_at[fused_position[gi]] = static_cast<int>(gi);
  for (int i = 0; i < n; ++i) {
    if (group_of[i] < 0) nodes.push_back(std::move(g.nodes[i]));
    else if (fused_at[i] >= 0) nodes.push_back(std::move(fused_nodes[fused_at[i]]));
  }
  g.nodes = std::move(nodes);
  SortTopologically(g);
  g.value_info.erase(std::remove_if(g.value_info.begin(), g.value_info.end(),
                                    [&](const ValueInfo& v) { return internal_values.count(v.name) > 0; }),
                     g.value_info.end());

  if (!groups.empty()) {
    if (out.OpsetVersion(kFusedDomain) == 0) out.opset_imports.push_back({kFusedDomain, 1});
    out.ir_version = std::max<int64_t>(out.ir_version, 8);  // model-local functions need IR version 8
    nlohmann::json meta{{"producer", "graph-autofusion"},
                        {"fused_groups", static_cast<int>(groups.size())},
                        {"functions", static_cast<int>(name_of_signature.size())},
                        {"groups", summary}};
    auto it = std::find_if(out.metadata_props.begin(), out.metadata_props.end(),
                           [](const auto& kv) { return kv.first == "graph_autofusion"; });
    if (it != out.metadata_props.end()) it->second = meta.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    else out.metadata_props.emplace_back("graph_autofusion", meta.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  }
  return out;
}

}  // namespace gaf
