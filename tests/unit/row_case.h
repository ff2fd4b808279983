// Test helpers for the row-kernel generator: a fused body with its inputs, the reference result
// (the body as a graph run by the Session, constants as initializers) and the generated kernel.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "codegen/row_kernel.h"
#include "ir/graph.h"
#include "runtime/session.h"
#include "test_util.h"

namespace gaf::testing {

struct RowCase {
  Function f;
  std::vector<Tensor> inputs;
  std::vector<bool> constant;  // per input: an initializer (folded as a constant), else fed
};

inline std::vector<Tensor> RowCaseReference(const RowCase& c, int64_t opset = 17) {
  Graph g;
  for (size_t i = 0; i < c.f.inputs.size(); ++i) {
    if (c.constant[i]) {
      g.initializers.emplace_back(c.f.inputs[i], c.inputs[i]);
    } else {
      ValueInfo v;
      v.name = c.f.inputs[i];
      v.dtype = c.inputs[i].dtype();
      g.inputs.push_back(v);
    }
  }
  g.nodes = c.f.nodes;
  for (const auto& o : c.f.outputs) {
    ValueInfo v;
    v.name = o;
    g.outputs.push_back(v);
  }
  Session s(MakeModel(g, opset));
  std::map<std::string, Tensor> feeds;
  for (size_t i = 0; i < c.f.inputs.size(); ++i)
    if (!c.constant[i]) feeds[c.f.inputs[i]] = c.inputs[i];
  return s.Run(feeds);
}

inline GeneratedRowKernel RowCaseGenerate(const RowCase& c, const std::string& symbol, int64_t opset = 17) {
  RowKernelRequest req;
  req.function = &c.f;
  req.opset = opset;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    req.input_types.push_back(c.inputs[i].dtype());
    req.input_shapes.push_back(c.inputs[i].shape());
    req.constants.push_back(c.constant[i] ? &c.inputs[i] : nullptr);
  }
  return GenerateRowKernel(req, symbol);
}

}  // namespace gaf::testing
