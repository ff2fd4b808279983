#include "models/builder.h"

#include <utility>

namespace gaf::models {

Attribute IntAttr(const std::string& name, int64_t v) {
  Attribute a;
  a.name = name;
  a.type = Attribute::Type::kInt;
  a.i = v;
  return a;
}

Attribute IntsAttr(const std::string& name, std::vector<int64_t> v) {
  Attribute a;
  a.name = name;
  a.type = Attribute::Type::kInts;
  a.ints = std::move(v);
  return a;
}

Attribute FloatAttr(const std::string& name, float v) {
  Attribute a;
  a.name = name;
  a.type = Attribute::Type::kFloat;
  a.f = v;
  return a;
}

Tensor RandomNormal(std::mt19937& rng, Shape shape, float mean, float stddev) {
  Tensor t(DataType::kFloat, std::move(shape));
  std::normal_distribution<float> dist(mean, stddev);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = dist(rng);
  return t;
}

Tensor RandomUniform(std::mt19937& rng, Shape shape, float lo, float hi) {
  Tensor t(DataType::kFloat, std::move(shape));
  std::uniform_real_distribution<float> dist(lo, hi);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = dist(rng);
  return t;
}

std::string GraphBuilder::Op(const std::string& scope, const std::string& op_type, std::vector<std::string> inputs,
                             std::vector<Attribute> attrs, std::vector<std::string> outputs) {
  std::string base = scope + "/" + op_type;
  int k = name_counts_[base]++;
  Node n;
  n.name = k == 0 ? base : base + "_" + std::to_string(k);
  n.op_type = op_type;
  n.inputs = std::move(inputs);
  n.attributes = std::move(attrs);
  if (outputs.empty()) outputs.push_back(n.name + "_output_0");
  n.outputs = std::move(outputs);
  std::string out = n.outputs[0];
  graph_->nodes.push_back(std::move(n));
  return out;
}

std::string GraphBuilder::Init(const std::string& name, Tensor t) {
  if (init_names_.count(name)) return name;
  init_names_[name] = true;
  graph_->initializers.emplace_back(name, std::move(t));
  return name;
}

int64_t GraphBuilder::num_parameters() const {
  int64_t n = 0;
  for (const auto& [name, t] : graph_->initializers) n += t.numel();
  return n;
}

ValueInfo MakeValueInfo(const std::string& name, DataType dt, std::vector<Dim> dims) {
  ValueInfo v;
  v.name = name;
  v.dtype = dt;
  v.has_shape = true;
  v.dims = std::move(dims);
  return v;
}

}  // namespace gaf::models
