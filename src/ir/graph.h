// The graph IR: models, graphs, nodes, attributes and value infos.
//
// Values are identified by name, as in ONNX: a node lists the names of the values it reads and
// writes ("" marks an absent optional input or output). Nodes are kept in topological order.
// GraphIndex gives the producer / consumers of each value when a pass needs use-def links.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ir/tensor.h"

namespace gaf {

struct Graph;

// One dimension of a value's shape: a known size, a symbolic name ("batch"), or unknown.
struct Dim {
  int64_t value = -1;  // >= 0 when known
  std::string param;   // symbolic name when value < 0 (may be empty: unknown)
  bool known() const { return value >= 0; }
  static Dim Known(int64_t v) { return Dim{v, {}}; }
  static Dim Symbolic(std::string p) { return Dim{-1, std::move(p)}; }
};
std::string DimsToString(const std::vector<Dim>& dims);  // "[batch,3,?]"

// Type and shape of a named value (graph input/output or intermediate).
struct ValueInfo {
  std::string name;
  DataType dtype = DataType::kUndefined;
  bool has_shape = false;  // false: rank unknown
  std::vector<Dim> dims;
  std::string doc_string;
  // Non-tensor types (sequence, map, optional) are kept as a short description and are
  // not executable by the runtime.
  std::string non_tensor_type;
};

struct Attribute {
  enum class Type {
    kUndefined = 0,
    kFloat = 1,
    kInt = 2,
    kString = 3,
    kTensor = 4,
    kGraph = 5,
    kFloats = 6,
    kInts = 7,
    kStrings = 8,
    kTensors = 9,
    kGraphs = 10,
    kSparseTensor = 11,
    kSparseTensors = 12,
    kTypeProto = 13,
    kTypeProtos = 14,
  };
  std::string name;
  Type type = Type::kUndefined;
  float f = 0.f;
  int64_t i = 0;
  std::string s;
  Tensor t;
  std::shared_ptr<Graph> g;
  std::vector<float> floats;
  std::vector<int64_t> ints;
  std::vector<std::string> strings;
  std::vector<Tensor> tensors;
  std::vector<std::shared_ptr<Graph>> graphs;
  std::string ref_attr_name;  // inside functions: refers to the caller's attribute
  std::string doc_string;
  // Serialized protobuf for kinds the IR does not model (sparse tensors, type protos),
  // kept so that a round trip preserves them.
  std::string opaque_proto;
};

struct Node {
  std::string name;
  std::string op_type;
  std::string domain;  // "" = ai.onnx
  std::vector<std::string> inputs;
  std::vector<std::string> outputs;
  std::vector<Attribute> attributes;
  std::string doc_string;

  const Attribute* FindAttr(const std::string& attr_name) const;
  bool HasAttr(const std::string& attr_name) const { return FindAttr(attr_name) != nullptr; }
  int64_t GetInt(const std::string& attr_name, int64_t def) const;
  float GetFloat(const std::string& attr_name, float def) const;
  std::string GetString(const std::string& attr_name, const std::string& def) const;
  std::vector<int64_t> GetInts(const std::string& attr_name, std::vector<int64_t> def = {}) const;
  std::vector<float> GetFloats(const std::string& attr_name, std::vector<float> def = {}) const;
  std::vector<std::string> GetStrings(const std::string& attr_name,
                                      std::vector<std::string> def = {}) const;
  const Tensor* GetTensor(const std::string& attr_name) const;
  const Graph* GetGraph(const std::string& attr_name) const;
  void SetAttr(Attribute a);  // replaces an attribute of the same name

  // Number of inputs actually present at position i (non-empty name).
  bool HasInput(size_t i) const { return i < inputs.size() && !inputs[i].empty(); }
  bool HasOutput(size_t i) const { return i < outputs.size() && !outputs[i].empty(); }
  // "name (op_type)" for messages; uses "#index" when the node has no name.
  std::string Describe() const;
};

struct Graph {
  std::string name;
  std::vector<Node> nodes;
  std::vector<ValueInfo> inputs;
  std::vector<ValueInfo> outputs;
  std::vector<ValueInfo> value_info;
  // Initializers in file order; names are unique.
  std::vector<std::pair<std::string, Tensor>> initializers;
  // Sparse initializers are kept verbatim (serialized SparseTensorProto) for round trips.
  std::vector<std::string> sparse_initializers;
  std::string doc_string;

  const Tensor* FindInitializer(const std::string& value_name) const;
  Tensor* FindInitializer(const std::string& value_name);
  void SetInitializer(const std::string& value_name, Tensor t);
  bool RemoveInitializer(const std::string& value_name);
  const ValueInfo* FindValueInfo(const std::string& value_name) const;  // inputs, outputs, value_info
};

struct OpsetImport {
  std::string domain;  // "" or "ai.onnx" = default domain
  int64_t version = 0;
};

// A model-local ONNX function (FunctionProto).
struct Function {
  std::string name;
  std::string domain;
  std::vector<std::string> inputs;
  std::vector<std::string> outputs;
  std::vector<std::string> attributes;  // attribute names the body may reference
  std::vector<Node> nodes;
  std::vector<OpsetImport> opset_imports;
  std::string doc_string;
};

struct Model {
  int64_t ir_version = 8;
  std::vector<OpsetImport> opset_imports;
  std::string producer_name;
  std::string producer_version;
  std::string domain;
  int64_t model_version = 0;
  std::string doc_string;
  std::vector<std::pair<std::string, std::string>> metadata_props;
  std::vector<Function> functions;
  Graph graph;

  // Version of `domain` imported by the model (0 if absent). "" and "ai.onnx" are the same.
  int64_t OpsetVersion(const std::string& domain = "") const;
  const Function* FindFunction(const std::string& domain, const std::string& name) const;
};

// Use-def links of one graph (not of its subgraphs). Rebuild after editing the graph.
class GraphIndex {
 public:
  explicit GraphIndex(const Graph& g);
  // Index of the node producing `value`, or -1 (graph input, initializer, or unknown).
  int Producer(const std::string& value) const;
  // (node index, input slot) pairs reading `value`.
  const std::vector<std::pair<int, int>>& Consumers(const std::string& value) const;
  bool IsGraphOutput(const std::string& value) const;

 private:
  std::unordered_map<std::string, int> producer_;
  std::unordered_map<std::string, std::vector<std::pair<int, int>>> consumers_;
  std::unordered_map<std::string, bool> graph_outputs_;
  std::vector<std::pair<int, int>> empty_;
};

// Names of values from outer scopes that a graph (and its nested subgraphs) reads without
// defining them. Used by control-flow execution and by passes that move subgraphs.
std::vector<std::string> OuterScopeValues(const Graph& g);

// Reorders g.nodes topologically (stable; subgraph reads of outer values are dependencies).
// Exporters sometimes write nodes out of order; ONNX Runtime sorts them too. Throws gaf::Error
// naming a node on a cycle.
void SortTopologically(Graph& g);

// Structural checks: unique value definitions, every input defined before use (outer-scope
// names allowed when `outer_scope` lists them), graph outputs produced, no cycles.
// Returns the list of problems (empty = valid), each naming the node.
std::vector<std::string> VerifyGraph(const Graph& g, const std::vector<std::string>& outer_scope = {});
std::vector<std::string> VerifyModel(const Model& m);

// Human-readable dump, one node per line:
//   %y = MatMul(%x, %w) {name=..., transA=1}
std::string DumpGraph(const Graph& g, int indent = 0);
std::string DumpModel(const Model& m);

}  // namespace gaf
