// Helpers for tests: building small graphs by hand.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "ir/error.h"
#include "ir/graph.h"
#include "runtime/session.h"

namespace gaf::testing {

// A float32 tensor of `shape`, uniform in [lo, hi), seeded.
inline Tensor RandomFloat(Shape shape, uint32_t seed, float lo = -2.f, float hi = 2.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  Tensor t(DataType::kFloat, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
  return t;
}

inline Attribute IntAttr(const std::string& name, int64_t v) {
  Attribute a;
  a.name = name;
  a.type = Attribute::Type::kInt;
  a.i = v;
  return a;
}

inline Attribute FloatAttr(const std::string& name, float v) {
  Attribute a;
  a.name = name;
  a.type = Attribute::Type::kFloat;
  a.f = v;
  return a;
}

inline Attribute StringAttr(const std::string& name, std::string v) {
  Attribute a;
  a.name = name;
  a.type = Attribute::Type::kString;
  a.s = std::move(v);
  return a;
}

inline Attribute IntsAttr(const std::string& name, std::vector<int64_t> v) {
  Attribute a;
  a.name = name;
  a.type = Attribute::Type::kInts;
  a.ints = std::move(v);
  return a;
}

inline Attribute TensorAttr(const std::string& name, Tensor t) {
  Attribute a;
  a.name = name;
  a.type = Attribute::Type::kTensor;
  a.t = std::move(t);
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

// y_i = MatMul(x, w_i) for [K, N_i] random float weights of one input x [-1, K] (sibling
// projections: query/key/value), weight i seeded with seed + i.
inline Model SiblingProjections(int64_t K, const std::vector<int64_t>& n, uint32_t seed) {
  Graph g;
  g.inputs = {FloatValue("x", {-1, K})};
  for (size_t i = 0; i < n.size(); ++i) {
    const std::string w = "w" + std::to_string(i), y = "y" + std::to_string(i);
    g.SetInitializer(w, RandomFloat({K, n[i]}, seed + static_cast<uint32_t>(i), -0.1f, 0.1f));
    g.nodes.push_back(MakeNode("MatMul", {"x", w}, {y}, "proj" + std::to_string(i)));
    g.outputs.push_back(ValueInfo{y, DataType::kFloat});
  }
  return MakeModel(std::move(g));
}

// A SwiGLU MLP as exporters write it (gate and up products of one input, Mul(Mul(g, Sigmoid(g)),
// up)): the plan makes one GatedMatMul of the two products and the gate, whose results are the
// original graph's (the products' sums run in another order than the library's: 1e-4) at one row,
// a few, the panels' most, and past them (129: oneDNN's products, then the gate). With the up
// product also a graph output, the products stay siblings and the gate a SiLUGate.
inline Model GatedMlp(int64_t K, int64_t F, bool up_out) {
  Graph g;
  g.inputs = {FloatValue("x", {-1, K})};
  g.SetInitializer("wg", RandomFloat({K, F}, 51, -0.1f, 0.1f));
  g.SetInitializer("wu", RandomFloat({K, F}, 52, -0.1f, 0.1f));
  g.nodes.push_back(MakeNode("MatMul", {"x", "wg"}, {"g"}, "gate_proj"));
  g.nodes.push_back(MakeNode("MatMul", {"x", "wu"}, {"u"}, "up_proj"));
  g.nodes.push_back(MakeNode("Sigmoid", {"g"}, {"s"}, "sigmoid"));
  g.nodes.push_back(MakeNode("Mul", {"g", "s"}, {"silu"}, "silu"));
  g.nodes.push_back(MakeNode("Mul", {"u", "silu"}, {"y"}, "gate"));  // up first: the pair finds the gate
  g.outputs = {ValueInfo{"y", DataType::kFloat}};
  if (up_out) g.outputs.push_back(ValueInfo{"u", DataType::kFloat});
  return MakeModel(std::move(g), 17);
}

// Calls of op type `op` in a session's profile (SessionOptions::profile), 0 when none ran.
inline int64_t ProfiledCalls(const Session& s, const std::string& op) {
  for (const OpProfile& p : s.Profile())
    if (p.op_type == op) return p.calls;
  return 0;
}

// The message of the gaf::Error `fn` throws, "" when it throws none.
inline std::string ErrorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Test data that lives outside the repository: ../shared beside the checkout (ONNX Runtime's fusion
// test graphs under testdata/ort-fusion, ONNX's opset-28 node tests), or GAF_SHARED_DIR in the
// environment. Tests that need it skip with SharedSkipMessage when it is missing: a user's clone
// has no ../shared, and the core suite stands on the fixtures in tests/fixtures.
inline std::filesystem::path SharedDir() {
  if (const char* env = std::getenv("GAF_SHARED_DIR"); env && *env) return env;
  return GAF_SHARED_DIR;
}
inline std::filesystem::path OrtFusionDir() { return SharedDir() / "testdata" / "ort-fusion"; }
inline std::string SharedSkipMessage(const std::filesystem::path& missing) {
  return "needs " + missing.string() +
         " (ONNX Runtime's fusion test graphs, MIT): put the project's shared/ folder beside the "
         "checkout or point GAF_SHARED_DIR at it";
}

}  // namespace gaf::testing
