// A small helper for writing graphs the way the PyTorch ONNX exporter names them: nodes are
// "<scope>/<OpType>", "<scope>/<OpType>_1", ... and their outputs "<node name>_output_0".
// Used by the example model builders (llama.cc, cnn.cc).
#pragma once

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace gaf::models {

Attribute IntAttr(const std::string& name, int64_t v);
Attribute IntsAttr(const std::string& name, std::vector<int64_t> v);
Attribute FloatAttr(const std::string& name, float v);

// Tensors of seeded random values.
Tensor RandomNormal(std::mt19937& rng, Shape shape, float mean, float stddev);
Tensor RandomUniform(std::mt19937& rng, Shape shape, float lo, float hi);

class GraphBuilder {
 public:
  explicit GraphBuilder(Graph* graph) : graph_(graph) {}

  // Appends a node "<scope>/<op_type>[_k]" and returns its first output's name. `outputs`
  // overrides the generated output names (e.g. to write a graph output directly).
  std::string Op(const std::string& scope, const std::string& op_type, std::vector<std::string> inputs,
                 std::vector<Attribute> attrs = {}, std::vector<std::string> outputs = {});

  // Adds an initializer (once; a second call with the same name returns the name unchanged).
  std::string Init(const std::string& name, Tensor t);
  std::string Int64s(const std::string& name, const std::vector<int64_t>& v) { return Init(name, Tensor::FromInt64s(v)); }
  std::string Int64Scalar(const std::string& name, int64_t v) { return Init(name, Tensor::Scalar<int64_t>(v)); }
  std::string FloatScalar(const std::string& name, float v) { return Init(name, Tensor::Scalar<float>(v)); }

  int64_t num_parameters() const;  // elements in all initializers

 private:
  Graph* graph_;
  std::map<std::string, int> name_counts_;
  std::map<std::string, bool> init_names_;
};

ValueInfo MakeValueInfo(const std::string& name, DataType dt, std::vector<Dim> dims);

}  // namespace gaf::models
