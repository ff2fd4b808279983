// Rules and presets (src/fusion/rules.cc, builtin_rules.cc): the rule-file parser, the built-in
// rules on the example models, on ONNX Runtime's fusion test graphs and on the ONNX backend
// tests' expanded function bodies.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "fusion/rules.h"
#include "match/pattern.h"
#include "models/cnn.h"
#include "models/llama.h"
#include "onnx_io/onnx_io.h"
#include "test_util.h"

namespace gaf {
namespace {

namespace fs = std::filesystem;

std::string ErrorOf(const std::string& text) {
  try {
    ParseRules(text, "my.rules");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

const FusionRule& Rule(const std::string& name) {
  static const std::vector<FusionRule> rules = BuiltinRules();
  for (const FusionRule& r : rules)
    if (r.name == name) return r;
  throw Error("test: no built-in rule " + name);
}

// Matches per rule name over a canonicalized copy of `model`.
std::map<std::string, std::vector<PatternMatch>> MatchAll(Model model, const std::vector<FusionRule>& rules) {
  InferShapes(model);
  Canonicalize(model);
  GraphIndex index(model.graph);
  std::map<std::string, std::vector<PatternMatch>> out;
  for (const FusionRule& r : rules) {
    std::vector<PatternMatch> m = FindAllMatches(model.graph, index, r);
    if (!m.empty()) out[r.name] = std::move(m);
  }
  return out;
}

size_t Count(const std::map<std::string, std::vector<PatternMatch>>& m, const std::string& rule) {
  auto it = m.find(rule);
  return it == m.end() ? 0 : it->second.size();
}

// ---------------- parser ----------------

TEST(Rules, ParsesRuleAndPair) {
  const char* text = R"(
// a user rule
rule MyRMSNorm fuse=FusedRMSNorm priority=20 threshold=0.05 preset=user formula="x / rms(x) * w"
  sq   = Pow($x, #2) | Mul($x, $x)   // either square
  mean = ReduceMean(sq) axes=[-1] keepdims=1
  ve   = Add(mean, #eps)
  std  = Sqrt(ve)
  n    = Div($x, std)
  y    = Mul(n, $w)
end
pair LayerNorm+Add fuse=FusedLayerNormAdd priority=10
chain Conv+BatchNorm+Relu|Clip name=CBR priority=3
)";
  std::vector<FusionRule> rules = ParseRules(text, "my.rules");
  ASSERT_EQ(rules.size(), 3u);
  const FusionRule& r = rules[0];
  EXPECT_EQ(r.name, "MyRMSNorm");
  EXPECT_EQ(r.fuse_pattern, "FusedRMSNorm");
  EXPECT_EQ(r.priority, 20);
  EXPECT_DOUBLE_EQ(r.benefit_threshold, 0.05);
  EXPECT_EQ(r.preset, "user");
  EXPECT_EQ(r.formula, "x / rms(x) * w");
  EXPECT_EQ(r.source, "my.rules:3");
  ASSERT_EQ(r.pattern.nodes.size(), 6u);
  const PatternNode& sq = r.pattern.nodes[0];
  EXPECT_EQ(sq.ops, (std::vector<std::string>{"Pow"}));
  EXPECT_EQ(sq.inputs, (std::vector<std::string>{"$x", "#2"}));
  ASSERT_EQ(sq.alternatives.size(), 1u);
  EXPECT_EQ(sq.alternatives[0].inputs, (std::vector<std::string>{"$x", "$x"}));
  EXPECT_EQ(r.pattern.nodes[1].attrs.at("axes"), "[-1]");
  EXPECT_EQ(r.pattern.nodes[1].attrs.at("keepdims"), "1");
  EXPECT_EQ(r.pattern.nodes.back().id, "y");
  EXPECT_EQ(rules[1].name, "LayerNorm+Add");
  EXPECT_EQ(rules[1].source, "my.rules:11");
  EXPECT_EQ(rules[1].pattern.nodes[0].ops, (std::vector<std::string>{"LayerNormalization"}));
  EXPECT_EQ(rules[1].preset, "user");
  EXPECT_EQ(rules[2].name, "CBR");
  EXPECT_EQ(rules[2].fuse_pattern, "FusedCBR");
  EXPECT_EQ(rules[2].pattern.nodes.size(), 3u);
  EXPECT_EQ(rules[2].pattern.nodes[2].ops, (std::vector<std::string>{"Relu", "Clip"}));
}

TEST(Rules, ParserErrorsNameFileLineAndProblem) {
  EXPECT_EQ(ErrorOf("rule A fuse=F\n  x = Relu($a)\n  y = Mul(x, z)\nend\n"),
            "my.rules:3: rule 'A': node 'y' reads 'z', which is not a node of the rule (pattern inputs are written "
            "$name, constants #value or #name, anything *)");
  EXPECT_EQ(ErrorOf("rule A\n  x = Relu($a)\n  x = Neg(x)\nend\n"), "my.rules:3: rule 'A': duplicate node id 'x'");
  EXPECT_EQ(ErrorOf("rule A\n  x = Pow($a, #2.5.1)\nend\n"), "my.rules:2: node 'x': bad number '#2.5.1'");
  EXPECT_EQ(ErrorOf("rule A priority=high\n  x = Relu($a)\nend\n"),
            "my.rules:1: bad number 'high' for priority (an integer)");
  EXPECT_EQ(ErrorOf("\n\nrule A\n  x = Relu($a)\n"), "my.rules:3: rule 'A' has no 'end'");
  EXPECT_EQ(ErrorOf("rule A\n  x = Relu($a)\nrule B\n  y = Relu($a)\nend\n"),
            "my.rules:3: rule 'A' (line 1) has no 'end' before this 'rule'");
  EXPECT_EQ(ErrorOf("rule A colour=red\n  x = Relu($a)\nend\n"),
            "my.rules:1: unknown key 'colour' (expected fuse, priority, threshold, preset, formula, math)");
  EXPECT_EQ(ErrorOf("rule A\n  x = Relu($a)\n  y = Neg($a)\nend\n"),
            "my.rules:2: rule 'A': node 'x' does not feed the root 'y' (the last node)");
  EXPECT_EQ(ErrorOf("rule A\n  x = Neg(y)\n  y = Neg(x)\nend\n"), "my.rules:3: rule 'A': node 'y' is part of a cycle");
  EXPECT_EQ(ErrorOf("rule A\nend\n"), "my.rules:1: rule 'A' has no nodes");
  EXPECT_EQ(ErrorOf("fuse A+B\n"), "my.rules:1: expected 'rule', 'pair' or 'chain', found 'fuse'");
  EXPECT_EQ(ErrorOf("rule A\n  x Relu($a)\nend\n"), "my.rules:2: rule 'A': expected 'id = Op(inputs)' or 'end'");
  EXPECT_EQ(ErrorOf("rule A\n  x = Relu($a) axes=[1,b]\nend\n"),
            "my.rules:2: node 'x': bad number 'b' in attribute 'axes'");
  EXPECT_EQ(ErrorOf("pair Conv++Relu\n"),
            "my.rules:1: chain 'Conv++Relu': empty op name (write ops as 'Op1+Op2', alternatives 'Relu|Clip')");
  EXPECT_EQ(ErrorOf("pair A+B\npair A+B\n"), "my.rules: two rules are named 'A+B'");
}

TEST(Rules, ExampleRuleFileLoads) {
  const fs::path dir = fs::path(GAF_SOURCE_DIR) / "rules" / "examples";
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".rules") continue;
    ++files;
    std::vector<FusionRule> rules = LoadRuleFile(e.path().string());
    EXPECT_FALSE(rules.empty()) << e.path();
    for (const FusionRule& r : rules) EXPECT_NE(r.source.find(e.path().filename().string()), std::string::npos);
  }
  EXPECT_GE(files, 1);
  EXPECT_THROW(LoadRuleFile("/nonexistent/x.rules"), Error);
}

// ---------------- built-in rules and presets ----------------

TEST(Rules, BuiltinRulesAndPresets) {
  std::vector<FusionRule> all = BuiltinRules();
  EXPECT_GE(all.size(), 24u);
  std::set<std::string> names;
  std::set<int> priorities;
  for (const FusionRule& r : all) {
    EXPECT_TRUE(names.insert(r.name).second) << r.name;
    EXPECT_TRUE(priorities.insert(r.priority).second) << "priority " << r.priority << " of " << r.name << " repeats";
    EXPECT_EQ(r.source.rfind("builtin:", 0), 0u) << r.source;
    EXPECT_FALSE(r.fuse_pattern.empty());
    EXPECT_FALSE(r.formula.empty()) << r.name;
  }
  size_t sum = 0;
  for (const std::string& p : PresetNames()) {
    std::vector<FusionRule> rules = PresetRules(p);
    EXPECT_GE(rules.size(), 4u) << p;
    for (const FusionRule& r : rules) EXPECT_EQ(r.preset, p);
    sum += rules.size();
  }
  EXPECT_EQ(sum, all.size());
  EXPECT_EQ(PresetRules("all").size(), all.size());
  try {
    PresetRules("vision");
    FAIL() << "no error for an unknown preset";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown preset 'vision' (expected transformer, cnn, rnn"), std::string::npos);
  }
}

TEST(Rules, LlamaEveryNormRotarySwiGluAndAttentionBlockMatches) {
  LlamaConfig c = LlamaPreset("tiny");
  const int64_t L = c.num_layers;
  auto m = MatchAll(BuildLlamaModel(c), PresetRules("transformer"));
  EXPECT_EQ(Count(m, "RMSNormFusion"), static_cast<size_t>(2 * L + 1));
  EXPECT_EQ(Count(m, "AddRMSNormFusion"), static_cast<size_t>(2 * L));  // every norm but the first
  EXPECT_EQ(Count(m, "RotaryEmbeddingFusion"), static_cast<size_t>(2 * L));  // q and k
  EXPECT_EQ(Count(m, "SwiGLUFusion"), static_cast<size_t>(L));
  EXPECT_EQ(Count(m, "AttentionFusion"), static_cast<size_t>(L));
  EXPECT_EQ(Count(m, "ScaledMaskedSoftmaxFusion"), static_cast<size_t>(L));
  EXPECT_EQ(Count(m, "SiLUFusion"), static_cast<size_t>(L));
  EXPECT_EQ(Count(m, "LayerNormFusion"), 0u);
  EXPECT_EQ(Count(m, "GeluFusion(erf)"), 0u);
  for (const PatternMatch& pm : m["RMSNormFusion"]) EXPECT_EQ(pm.nodes.size(), 7u);
  for (const PatternMatch& pm : m["AttentionFusion"]) EXPECT_EQ(pm.nodes.size(), 5u);
  for (const PatternMatch& pm : m["RotaryEmbeddingFusion"]) EXPECT_EQ(pm.nodes.size(), 7u);
}

TEST(Rules, CnnEveryConvBatchNormMatches) {
  Model model = BuildCnnModel(CnnPreset("tiny"));
  auto m = MatchAll(model, PresetRules("cnn"));
  Model canon = model;
  Canonicalize(canon);
  const Graph& g = canon.graph;
  GraphIndex index(g);
  int bn = 0, bn_relu = 0;
  std::set<int> covered;
  for (const char* r : {"ConvBnFusion", "ConvBnReluFusion", "ConvBnAddReluFusion"})
    for (const PatternMatch& pm : m[r]) covered.insert(pm.nodes.begin(), pm.nodes.end());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (g.nodes[i].op_type != "BatchNormalization") continue;
    ++bn;
    EXPECT_TRUE(covered.count(static_cast<int>(i))) << g.nodes[i].Describe();
    const auto& uses = index.Consumers(g.nodes[i].outputs[0]);
    if (uses.size() == 1 && g.nodes[uses[0].first].op_type == "Relu") ++bn_relu;
  }
  EXPECT_GT(bn, 0);
  EXPECT_EQ(Count(m, "ConvBnFusion"), static_cast<size_t>(bn));
  EXPECT_EQ(Count(m, "ConvBnReluFusion"), static_cast<size_t>(bn_relu));
  EXPECT_GT(Count(m, "ConvBnAddReluFusion"), 0u);
  EXPECT_EQ(Count(m, "GemmActivationFusion"), 0u);  // the classifier Gemm has no activation
}

// ---------------- ONNX Runtime's fusion test graphs ----------------

TEST(Rules, OrtFusionGraphs) {
  const fs::path dir = testing::OrtFusionDir();
  if (!fs::exists(dir)) GTEST_SKIP() << testing::SharedSkipMessage(dir);
  std::vector<FusionRule> rules = BuiltinRules();
  std::map<std::string, std::map<std::string, std::vector<PatternMatch>>> found;
  int loaded = 0, unloadable = 0;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".onnx") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const fs::path& f : files) {
    Model model;
    try {
      model = LoadModel(f.string());
    } catch (const Error&) {
      ++unloadable;  // e.g. graphs stored out of topological order
      continue;
    }
    ++loaded;
    auto m = MatchAll(model, rules);
    std::string line;
    for (const auto& [rule, ms] : m) line += fmt::format(" {}x{}", rule, ms.size());
    std::printf("  %-60s%s\n", f.filename().c_str(), line.c_str());
    found[f.stem().string()] = std::move(m);
  }
  std::printf("  %d graphs loaded, %d could not be loaded\n", loaded, unloadable);
  EXPECT_GT(loaded, 150);
  auto expect = [&](const std::string& file, const std::string& rule, size_t n) {
    ASSERT_TRUE(found.count(file)) << file << " was not loaded";
    EXPECT_EQ(Count(found[file], rule), n) << file << ": " << rule;
  };
  expect("layer_norm", "LayerNormFusion", 1);
  expect("layer_norm_with_cast", "LayerNormFusion", 1);  // axes [-2,-1], a no-op Cast inside
  expect("layer_norm_with_cast_4", "LayerNormFusion(no-affine)", 1);  // duplicated Sub merged
  expect("layer_norm_sub_dup", "LayerNormFusion", 1);
  expect("layer_norm_t5", "RMSNormFusion", 1);
  expect("gelu", "GeluFusion(erf)", 1);
  expect("gelu_format2_0", "GeluFusion(erf)", 1);
  expect("gelu_format2_1", "GeluFusion(erf)", 1);
  expect("gelu_format2_1_use_graph_input", "GeluFusion(erf)", 1);
  expect("bias_gelu_fusion", "BiasGeluFusion(erf)", 1);
  expect("fast_gelu", "GeluFusion(tanh-factored)", 1);
  expect("fast_gelu2", "GeluFusion(tanh)", 1);
  expect("bias_onnx_fast_gelu_fusion", "BiasGeluFusion", 1);
  expect("bias_softmax_fusion_simple", "BiasSoftmaxFusion", 1);
  expect("attention_mask_no_cast", "AttentionFusion", 1);  // rank derived through the graph
  expect("attention_symbolic_batch", "AttentionFusion", 1);
  expect("attention_distilbert", "AttentionFusion(prescaled-where-mask)", 1);  // Expand(mask, Shape(scores)) removed
  expect("conv_relu", "ConvActivationFusion", 1);
  expect("conv_clip11", "ConvActivationFusion", 3);
  expect("conv_sigmoid", "ConvActivationFusion", 1);
  expect("conv_leakyrelu", "ConvActivationFusion", 1);
  expect("fuse-conv-bn-no-bias", "ConvBnFusion", 1);
}

// The interior rule on ORT's "do not fuse" graphs: the reason names the outside user.
TEST(Rules, OrtFusionNegativeReasons) {
  const fs::path f = testing::OrtFusionDir() / "gelu_format2_0_with_bias_use_graph_output.onnx";
  if (!fs::exists(f)) GTEST_SKIP() << testing::SharedSkipMessage(f);
  Model model = LoadModel(f.string());
  InferShapes(model);
  Canonicalize(model);
  GraphIndex index(model.graph);
  std::vector<MatchAttempt> tries = TryRule(model.graph, index, Rule("BiasGeluFusion(erf)"));
  bool near_miss = false;
  for (const MatchAttempt& a : tries) {
    EXPECT_FALSE(a.match.has_value());
    if (a.near_miss) {
      near_miss = true;
      EXPECT_NE(a.reason.find("is a graph output"), std::string::npos) << a.reason;
    }
  }
  EXPECT_TRUE(near_miss);
}

// ---------------- ONNX backend tests: expanded function bodies ----------------

TEST(Rules, ExpandedBackendTests) {
  const fs::path dir = "/usr/share/libonnx-testdata/data/node";
  if (!fs::exists(dir)) GTEST_SKIP() << dir << " not found";
  std::vector<FusionRule> rules = BuiltinRules();
  std::map<std::string, int> tried, matched;
  const std::vector<std::pair<std::string, std::string>> families = {
      {"test_layer_normalization_", "LayerNormFusion(var)"},
      {"test_softmax_", "SoftmaxFusion(expanded)"},
      {"test_logsoftmax_", "LogSoftmaxFusion(expanded)"},
      {"test_hardswish", "HardSwishFusion(hardsigmoid)"}};
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.size() < 9 || name.substr(name.size() - 9) != "_expanded") continue;
    for (const auto& [prefix, rule] : families) {
      if (name.rfind(prefix, 0) != 0) continue;
      Model model = LoadModel((e.path() / "model.onnx").string());
      ++tried[rule];
      auto m = MatchAll(model, {Rule(rule)});
      if (Count(m, rule) == 1) ++matched[rule];
      else ADD_FAILURE() << name << ": " << rule << " matched " << Count(m, rule) << " times";
    }
  }
  for (const auto& [rule, n] : tried) std::printf("  %s: %d of %d expanded tests\n", rule.c_str(), matched[rule], n);
  EXPECT_GE(tried["LayerNormFusion(var)"], 10);
  EXPECT_GE(tried["SoftmaxFusion(expanded)"], 5);
}

}  // namespace
}  // namespace gaf
