// Helpers for tests: building small graphs by hand.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"

namespace gaf::testing {

inline Attribute IntAttr(const std::string& name, int64_t v) {
  Attribute a;
  a.name = name;
  a.type = Attribute::Type::kInt;
  a.i = v;
  return a;
}

inline Attribute IntsAttr(const std::string& name, std::vector<int64_t> v) {
  Attribute a;
  a.name = name;
  a.type = Attribute::Type::kInts;
  a.ints = std::move(v);
  return a;
}

inline Node MakeNode(const std::string& op, std::vector<std::string> ins, std::vector<std::string> outs,
                     std::string name = "", std::vector<Attribute> attrs = {}) {
  Node n;
  n.op_type = op;
  n.inputs = std::move(ins);
  n.outputs = std::move(outs);
  n.name = std::move(name);
  n.attributes = std::move(attrs);
  return n;
}

inline ValueInfo FloatValue(const std::string& name, std::vector<int64_t> dims) {
  ValueInfo v;
  v.name = name;
  v.dtype = DataType::kFloat;
  v.has_shape = true;
  for (int64_t d : dims) v.dims.push_back(d >= 0 ? Dim::Known(d) : Dim::Symbolic("N"));
  return v;
}

// Elements of all graph inputs, unknown dims counted as 2: to skip graphs made to stress sizes.
inline int64_t InputElements(const Model& m) {
  int64_t elements = 0;
  for (const ValueInfo& v : m.graph.inputs) {
    int64_t n = 1;
    for (const Dim& d : v.dims) n *= d.known() ? d.value : 2;
    elements += n;
  }
  return elements;
}

inline Model MakeModel(Graph g, int64_t opset = 17) {
  Model m;
  m.ir_version = 8;
  m.opset_imports.push_back({"", opset});
  m.graph = std::move(g);
  return m;
}

}  // namespace gaf::testing
