// The bodies of the libFuzzer harnesses (tests/fuzz/fuzz_main.cc), shared with the unit test that
// replays every saved crash input (tests/fuzz/regressions/HARNESS/*) in the normal suite. Each
// takes the raw input; a gaf::Error is the expected outcome for a bad one, anything else (a
// signal, a sanitizer report, another exception type) is a bug.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "fusion/auto_fusion.h"
#include "fusion/rules.h"
#include "ir/error.h"
#include "ir/graph.h"
#include "ir/limits.h"
#include "onnx_io/npy.h"
#include "onnx_io/onnx_io.h"
#include "runtime/session.h"

namespace gaf::fuzz {

// Tight limits so that an input asking for too much memory or too many iterations ends quickly.
inline void TightLimits() {
  Limits& l = GlobalLimits();
  l.max_tensor_bytes = int64_t{64} << 20;
  l.max_loop_iterations = 1000;
  l.max_nodes = 20000;
  l.max_match_steps = 200000;
}

// No real folder: external data named by a fuzzed model must not read files.
inline constexpr const char* kNoDir = "/nonexistent-gaf-fuzz-dir";

// One run on small zero inputs (unknown dims bound to 1, known ones capped at 16).
inline void RunOnce(const Model& m) {
  SessionOptions so;
  so.num_threads = 1;
  Session s(m, so);
  std::map<std::string, Tensor> feeds;
  for (const ValueInfo& v : s.inputs()) {
    Shape shape;
    for (const Dim& d : v.dims) shape.push_back(d.known() ? std::min<int64_t>(std::max<int64_t>(d.value, 0), 16) : 1);
    feeds[v.name] = Tensor(v.dtype == DataType::kUndefined ? DataType::kFloat : v.dtype, shape);
  }
  s.Run(feeds);
}

// Model bytes -> import, verifier, ONNX checker, session build and one run.
inline void ModelInput(const std::string& bytes) {
  try {
    Model m = ModelFromBytes(bytes, kNoDir, "fuzz.onnx");
    if (!VerifyModel(m).empty()) return;
    CheckModel(m);
    RunOnce(m);
  } catch (const Error&) {
  }
}

// Mutated models through the fusion engine: canonicalization, matching, planning, the fused-ONNX
// rewrite, and the fused model back through import and the verifier.
inline void FuseInput(const std::string& bytes) {
  try {
    Model m = ModelFromBytes(bytes, kNoDir, "fuzz.onnx");
    if (!VerifyModel(m).empty()) return;
    FusionOptions o;
    o.preset = "all";
    GraphAutoFusion f(m, o);
    f.AnalyzeFusionBenefit();
    Model fused = f.Fuse();
    Model back = ModelFromBytes(ModelToBytes(fused), kNoDir, "fused.onnx");
    VerifyModel(back);
  } catch (const Error&) {
  }
}

// x -> LayerNormalization -> Add -> Relu -> MatMul -> Softmax: something for fuzzed rules to match.
inline const Graph& RuleTestGraph() {
  static const Graph g = [] {
    Graph g;
    auto node = [&](const char* op, std::vector<std::string> in, std::string out) {
      Node n;
      n.op_type = op;
      n.name = out + "_node";
      n.inputs = std::move(in);
      n.outputs = {std::move(out)};
      g.nodes.push_back(n);
    };
    node("LayerNormalization", {"x", "g", "b"}, "ln");
    node("Add", {"ln", "x"}, "add");
    node("Relu", {"add"}, "relu");
    node("MatMul", {"relu", "w"}, "mm");
    node("Softmax", {"mm"}, "y");
    return g;
  }();
  return g;
}

// Rule-file text -> parser, then each rule matched on RuleTestGraph.
inline void RulesInput(const std::string& text) {
  static const GraphIndex index(RuleTestGraph());
  try {
    for (const FusionRule& r : ParseRules(text, "fuzz.rules")) FindAllMatches(RuleTestGraph(), index, r);
  } catch (const Error&) {
  }
}

// .npy (first byte odd) or serialized TensorProto (even) -> reader; the rest is the file's content,
// written to a per-process file since the readers take paths.
inline void TensorInput(const std::string& bytes) {
  if (bytes.empty()) return;
  const bool npy = bytes[0] & 1;
  const std::string path = "/tmp/gaf-fuzz-tensor." + std::to_string(::getpid()) + (npy ? ".npy" : ".pb");
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data() + 1, static_cast<std::streamsize>(bytes.size() - 1));
  try {
    Tensor t = npy ? LoadNpy(path) : LoadTensorPb(path);
    if (t.numel() > 0 && t.dtype() != DataType::kString) (void)t.DoubleAt(t.numel() - 1);
  } catch (const Error&) {
  }
  ::unlink(path.c_str());
}

}  // namespace gaf::fuzz
