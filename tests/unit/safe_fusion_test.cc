// Safe fusion and the kernel parity suite: every fused group's generated kernel against the
// reference kernels on the group's real inputs (FuseSafe's precision gate), rollback of a
// deliberately imprecise user rule with reason "precision", verify/bench building blocks.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <cmath>
#include <random>
#include <set>
#include <tuple>

#include "codegen/fused_session.h"
#include "codegen/half_weights.h"
#include "ops/panel_gemm.h"
#include "codegen/safe_fusion.h"
#include "codegen/verify.h"
#include "cost/cost_model.h"
#include "fusion/auto_fusion.h"
#include "fusion/rules.h"
#include "models/cnn.h"
#include "ops/kernel.h"
#include "models/generate.h"
#include "models/llama.h"
#include "onnx_io/onnx_io.h"
#include "test_util.h"

namespace gaf {
namespace {
namespace fs = std::filesystem;
using testing::MakeModel;
using testing::MakeNode;

SafeFusionOptions NoSpeedGate() {
  SafeFusionOptions o;
  o.check_speed = false;  // timing is for benchmarks; unit tests check precision and structure
  o.repeats = 3;
  return o;
}

// Gates every group's kernel, those the runtime's plan would run as its own too (the parity suite
// checks the kernels themselves).
SafeFusionOptions EveryKernel() {
  SafeFusionOptions o = NoSpeedGate();
  o.runtime_plan = false;
  return o;
}

FusionOptions Preset(const std::string& p) {
  FusionOptions o;
  o.preset = p;
  return o;
}

// Prints one parity line per measured kernel and checks the precision gate held for each. A group
// without a kernel for a structural reason ("no generated kernel: ...") is reported and counted;
// a kernel that exists but does not run on its group's inputs is a failure.
int CheckParity(const SafeFusionReport& r, const std::string& what, std::map<std::string, int>* per_rule,
                int* no_kernel = nullptr) {
  int checked = 0;
  for (const SafeKernelResult& k : r.kernels) {
    if (!k.same_as.empty()) continue;
    if (k.reason_kind == "compile") {
      const bool structural = k.reason.rfind("no generated kernel", 0) == 0;
      EXPECT_TRUE(structural) << what << ": " << k.node << ": " << k.reason;
      if (no_kernel != nullptr) ++*no_kernel;
      std::printf("  parity %-28s %-34s no kernel: %s\n", what.c_str(), k.rule.c_str(), k.reason.substr(0, 120).c_str());
      continue;
    }
    ++checked;
    (*per_rule)[k.rule]++;
    std::printf("  parity %-28s %-34s cosine %.8f  max abs err %.3g  %d shape(s)  %s\n", what.c_str(), k.rule.c_str(),
                k.cosine, k.max_abs_error, k.samples, k.kernel.c_str());
    EXPECT_NE(k.reason_kind, "precision") << what << ": " << k.node << ": " << k.reason;
    EXPECT_GE(k.cosine, 0.9999) << what << ": " << k.node;
    EXPECT_EQ(k.samples, r.samples) << what << ": " << k.node;
  }
  return checked;
}

// Two samples of random inputs: the symbolic dims bound as RandomFeeds binds them, and every one
// doubled (sums such as total = past + seq stay consistent), so each kernel runs at two shapes.
// A model that does not run at the doubled dims keeps one sample (printed).
Workload TwoShapes(const Model& m, const std::string& what) {
  Workload w;
  w.source = "random inputs at two bindings of the symbolic dims";
  w.samples.push_back(RandomFeeds(m));
  std::map<std::string, int64_t> doubled;
  for (const ValueInfo& v : m.graph.inputs) {
    auto it = w.samples[0].find(v.name);
    if (it == w.samples[0].end() || !v.has_shape) continue;
    for (size_t d = 0; d < v.dims.size() && d < it->second.shape().size(); ++d)
      if (!v.dims[d].known() && !v.dims[d].param.empty()) doubled[v.dims[d].param] = 2 * it->second.shape()[d];
  }
  if (doubled.empty()) return w;
  Feeds second = RandomFeeds(m, doubled, 1);
  try {
    Session s(m);
    s.Run(second);
    w.samples.push_back(std::move(second));
  } catch (const Error& e) {
    std::printf("  parity %s: one shape only (doubled dims do not run: %s)\n", what.c_str(), e.what());
  }
  return w;
}

FusionOptions WithTwoShapes(const Model& m, const std::string& preset, const std::string& what) {
  FusionOptions o = Preset(preset);
  o.workload = TwoShapes(m, what);
  return o;
}

TEST(SafeFusion, TinyLlamaKernelsPassGatesAndKeepTokens) {
  Model m = BuildLlamaModel(LlamaPreset("tiny"));
  SafeGraphAutoFusion f(m, Preset("transformer"));
  Model fused = f.FuseSafe(NoSpeedGate());
  const SafeFusionReport& r = f.GetSafeFusionReport();
  std::set<std::string> kinds;
  std::map<std::string, std::string> by_runtime;  // rule -> reason
  for (const SafeKernelResult& k : r.kernels) {
    if (k.fused) kinds.insert(k.rule);
    if (k.reason_kind == "runtime") by_runtime[k.rule] = k.reason;
  }
  // Norms and rotary get kernels that pass the gate.
  for (const char* rule : {"RMSNormFusion", "AddRMSNormFusion", "RotaryEmbeddingFusion"})
    EXPECT_TRUE(kinds.count(rule)) << rule << " not kept; report:\n" << r.ToText();
  // Attention over the key/value cache and SwiGLU's products the runtime runs as its own
  // operators (the cache read and appended in place, the gate/up weights packed at load): those
  // groups are rolled back ungated, saying so (their kernels: ShapeGeneric.EveryFusedGroup...).
  EXPECT_NE(by_runtime["AttentionFusion"].find("FusedAttention"), std::string::npos) << r.ToText();
  EXPECT_NE(by_runtime["SwiGLUFusion"].find("GatedMatMul"), std::string::npos) << r.ToText();
  EXPECT_FALSE(kinds.count("AttentionFusion") || kinds.count("SwiGLUFusion")) << r.ToText();
  EXPECT_EQ(r.skipped_by_reason.at("Skip: runtime"), 2 * LlamaPreset("tiny").num_layers) << r.ToText();
  for (double c : r.output_cosine) EXPECT_GE(c, 0.9999);
  EXPECT_GT(r.time_original_ms, 0);
  EXPECT_GT(r.time_fused_ms, 0);
  // The fused model with generated kernels generates the same greedy tokens.
  KernelCompiler compiler;
  FusedRuntime rt = MakeFusedRuntime(fused, {}, compiler);
  Session ref(m);
  GenerateOptions g;
  g.prompt_ids = {5, 17, 42, 7};
  g.max_new_tokens = 12;
  EXPECT_EQ(Generate(*rt.session, g).tokens, Generate(ref, g).tokens);
  int64_t calls = 0, fallbacks = 0;
  for (const auto& e : rt.kernels->entries()) {
    calls += e.calls->load();
    fallbacks += e.fallbacks->load();
  }
  EXPECT_GT(calls, 0);
  EXPECT_EQ(fallbacks, 0) << DescribeFusedKernels(*rt.kernels);
}

// A user rule whose kernel is deliberately imprecise (math=approx: Schraudolph's exp, ~4% error)
// is rolled back with reason "precision"; the same rule with exact math is kept.
TEST(SafeFusion, ImpreciseUserRuleIsRolledBackForPrecision) {
  Graph g;
  g.inputs.push_back(testing::FloatValue("x", {4, 37}));
  g.nodes.push_back(MakeNode("Sigmoid", {"x"}, {"s"}, "sig"));
  g.nodes.push_back(MakeNode("Mul", {"x", "s"}, {"y"}, "mul"));
  g.outputs.push_back(testing::FloatValue("y", {4, 37}));
  Model m = MakeModel(g);
  for (const std::string math : {"approx", "exact"}) {
    FusionOptions o = Preset("none");
    o.auto_fuse = false;
    o.benefit_threshold = 0;
    SafeGraphAutoFusion f(m, o);
    for (FusionRule& r : ParseRules("rule CrudeSiLU fuse=CrudeSiLU priority=50 math=" + math +
                                        "\n  s = Sigmoid($x)\n  y = Mul($x, s)\nend\n",
                                    "user.rules"))
      f.AddFusionRule(r);
    Model out = f.FuseSafe(NoSpeedGate());
    const SafeFusionReport& r = f.GetSafeFusionReport();
    ASSERT_EQ(r.kernels.size(), 1u) << r.ToText();
    const SafeKernelResult& k = r.kernels[0];
    int fused_nodes = 0;
    for (const Node& n : out.graph.nodes) fused_nodes += n.domain == kFusedDomain;
    if (math == "approx") {
      EXPECT_FALSE(k.fused);
      EXPECT_EQ(k.reason_kind, "precision") << k.reason;
      EXPECT_NE(k.reason.find("precision"), std::string::npos);
      EXPECT_GT(k.max_abs_error, 1e-3);
      EXPECT_EQ(fused_nodes, 0);  // rolled back to Sigmoid + Mul
      EXPECT_EQ(r.skipped_by_reason.at("Skip: precision"), 1);
      bool logged = false;
      for (const DecisionRecord& d : f.decision_log().records())
        logged |= d.stage == "safe" && d.reason.find("precision") != std::string::npos;
      EXPECT_TRUE(logged);
    } else {
      EXPECT_TRUE(k.fused) << k.reason;
      EXPECT_LT(k.max_abs_error, 1e-5);
      EXPECT_EQ(fused_nodes, 1);
    }
  }
}

// Parity suite: every built-in rule that fires on the built-in models (incl. odd sizes) and on one
// ONNX Runtime fusion test graph per rule has its kernel checked against the reference kernels.
TEST(SafeFusion, ParitySuiteGeneratedKernelsMatchReference) {
  std::map<std::string, int> per_rule;
  int checked = 0;
  LlamaConfig odd = LlamaPreset("tiny");
  odd.hidden_size = 40;  // rows of 40, head_dim 10, intermediate 97: nothing a multiple of 16
  odd.num_heads = 4;
  odd.num_kv_heads = 2;
  odd.intermediate_size = 97;
  int no_kernel = 0, not_runnable = 0;
  for (const auto& [name, model, preset] :
       std::vector<std::tuple<std::string, Model, std::string>>{{"llama-tiny", BuildLlamaModel(LlamaPreset("tiny")), "transformer"},
                                                              {"llama-odd", BuildLlamaModel(odd), "transformer"},
                                                              {"cnn-tiny", BuildCnnModel(CnnPreset("tiny")), "cnn"}}) {
    SafeGraphAutoFusion f(model, WithTwoShapes(model, preset, name));
    f.FuseSafe(EveryKernel());
    checked += CheckParity(f.GetSafeFusionReport(), name, &per_rule, &no_kernel);
  }
  // Models exported by torch.onnx.export (tests/fixtures/torch): SE blocks (global mean over
  // H,W with keepdims=0), depthwise convs, GELU/LayerNorm transformers; and KV-cache decoders.
  for (const char* name : {"torch/mobile_like", "torch/resnet_like", "torch/bert_like", "torch/gpt2_block",
                           "torch_decoders/llama_kv_opset17", "torch_decoders/gpt2_kv_opset17"}) {
    const fs::path p = fs::path(GAF_SOURCE_DIR) / "tests" / "fixtures" / name / "model.onnx";
    Model m = LoadModel(p.string());
    SafeGraphAutoFusion f(m, WithTwoShapes(m, "all", name));
    f.FuseSafe(EveryKernel());
    checked += CheckParity(f.GetSafeFusionReport(), name, &per_rule, &no_kernel);
  }
  const fs::path dir = testing::OrtFusionDir();
  if (fs::exists(dir)) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".onnx") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    std::set<std::string> covered;
    for (const fs::path& p : files) {
      // Only loading and running the unfused graph may be skipped (contrib ops, unsupported
      // types), and each skip is counted and printed; a failure of fusion itself fails the test.
      Model m;
      FusionOptions o;
      try {
        m = LoadModel(p.string());
        if (testing::InputElements(m) > (int64_t{1} << 20)) continue;
        o = WithTwoShapes(m, "all", p.filename().string());
      } catch (const Error& e) {
        ++not_runnable;
        std::printf("  parity %s: skipped, the unfused graph does not load or run: %s\n", p.filename().string().c_str(),
                    e.what());
        continue;
      }
      GraphAutoFusion probe(m, Preset("all"));
      bool new_rule = false;
      for (const FusionCandidate& c : probe.AnalyzeFusionBenefit())
        new_rule |= c.verdict == Verdict::kFuse && c.rule != "auto" && !covered.count(c.rule);
      if (!new_rule) continue;
      SafeGraphAutoFusion f(m, o);
      f.FuseSafe(EveryKernel());
      for (const SafeKernelResult& k : f.GetSafeFusionReport().kernels) covered.insert(k.rule);
      checked += CheckParity(f.GetSafeFusionReport(), p.filename().string(), &per_rule, &no_kernel);
    }
  } else {
    std::printf("parity: ONNX Runtime's graphs left out: %s\n", testing::SharedSkipMessage(dir).c_str());
  }
  std::printf("parity: %d groups without a kernel (structural reasons, listed above); %d graphs skipped unrunnable\n",
              no_kernel, not_runnable);
  std::printf("parity: %d kernels checked across %zu rules\n", checked, per_rule.size());
  // GPT-2's Where-masked attention (a bool mask read by the generated code) has a kernel.
  EXPECT_TRUE(per_rule.count("AttentionFusion(where-mask)"));
  EXPECT_GT(checked, 15);
  EXPECT_GE(per_rule.size(), 8u);
}

// Conv groups with an elementwise epilogue run it on the conv's tiles: the tile entry point is
// bound (it was silently missing once: the library only resolved the listed symbols, so every
// call took the two-pass fallback), and the fused model matches the original.
TEST(SafeFusion, ConvEpiloguesRunOnTiles) {
  Model m = BuildCnnModel(CnnPreset("tiny"));
  // Per-group kernels: with blocked-layout chains the whole network is one chain (blocked_chain_test.cc).
  FusionOptions o = Preset("cnn");
  o.layout_chains = false;
  SafeGraphAutoFusion f(m, o);
  Model fused = f.Fuse();
  KernelCompiler compiler;
  auto set = CompileFusedKernels(fused, compiler, std::map<std::string, int64_t>{}, "ai.graph_autofusion");
  int tiled = 0;
  for (const auto& e : set->entries()) {
    if (!e.bound) continue;
    for (const auto& st : e.kernel.stages)
      if (st.epilogue_stage >= 0) {
        EXPECT_NE(e.kernel.stages[st.epilogue_stage].tile, nullptr) << e.kernel.Describe();
        ++tiled;
      }
  }
  EXPECT_GT(tiled, 0) << DescribeFusedKernels(*set);
  PrecisionReport p = VerifyPrecision(fused, m);
  EXPECT_TRUE(p.Passes(0.99999, 1e-4)) << p.min_cosine << " " << p.max_abs_error;
}

// A Conv that takes the prepared (oneDNN) path with its epilogue as post-ops: bias, residual Add
// (sum) and ReLU inside the library call, no generated pass; equal to the original.
TEST(SafeFusion, ConvEpilogueAsOneDnnPostOps) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  auto random = [&](Shape s) {
    Tensor t(DataType::kFloat, std::move(s));
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
    return t;
  };
  Graph g;
  g.inputs.push_back(testing::FloatValue("x", {1, 16, 12, 12}));
  g.inputs.push_back(testing::FloatValue("r", {1, 32, 12, 12}));
  g.initializers.emplace_back("w", random({32, 16, 3, 3}));
  g.initializers.emplace_back("b", random({32}));
  g.nodes.push_back(MakeNode("Conv", {"x", "w", "b"}, {"c"}, "conv",
                             {testing::IntsAttr("pads", {1, 1, 1, 1}), testing::IntsAttr("kernel_shape", {3, 3})}));
  g.nodes.push_back(MakeNode("Add", {"c", "r"}, {"a"}, "add"));
  g.nodes.push_back(MakeNode("Relu", {"a"}, {"y"}, "relu"));
  g.outputs.push_back(testing::FloatValue("y", {1, 32, 12, 12}));
  Model m = MakeModel(g, 13);
  SafeGraphAutoFusion f(m, Preset("cnn"));
  Model fused = f.FuseSafe(NoSpeedGate());
  const SafeFusionReport& r = f.GetSafeFusionReport();
  ASSERT_EQ(r.kernels.size(), 1u) << r.ToText();
  EXPECT_TRUE(r.kernels[0].fused) << r.kernels[0].reason;
  EXPECT_NE(r.kernels[0].kernel.find("post-ops [bias,sum,relu]"), std::string::npos) << r.kernels[0].kernel;
  EXPECT_GE(r.kernels[0].cosine, 0.99999);
  EXPECT_LE(r.kernels[0].max_abs_error, 1e-4);
  PrecisionReport p = VerifyPrecision(fused, m);
  EXPECT_TRUE(p.Passes(0.99999, 1e-4)) << p.min_cosine << " " << p.max_abs_error;
}

// The speed gate's sign test: wins needed out of n interleaved pairs.
TEST(Verify, SignTestWins) {
  EXPECT_EQ(SignTestWins(15, 0.01), 13);  // P(X >= 13) = 121/32768 = 0.0037, P(X >= 12) = 576/32768 = 0.0176
  EXPECT_EQ(SignTestWins(15, 0.05), 12);
  EXPECT_EQ(SignTestWins(10, 0.01), 10);  // P(X >= 9) = 11/1024 > 1%
  EXPECT_EQ(SignTestWins(7, 0.01), 7);    // 1/128
  EXPECT_EQ(SignTestWins(6, 0.01), 7);    // 1/64 > 1%: no number of wins suffices
  SafeFusionOptions o;
  o.repeats = 5;
  SafeGraphAutoFusion f(BuildLlamaModel(LlamaPreset("tiny")), Preset("transformer"));
  EXPECT_THROW(f.FuseSafe(o), Error);
}

TEST(Verify, PrecisionAndPerformanceOfAFusedModel) {
  Model m = BuildLlamaModel(LlamaPreset("tiny"));
  SafeGraphAutoFusion f(m, Preset("transformer"));
  Model fused = f.Fuse();
  VerifyOptions o;
  o.repeats = 3;
  PrecisionReport p = VerifyPrecision(fused, m, o);
  ASSERT_EQ(p.outputs.size(), m.graph.outputs.size());
  EXPECT_TRUE(p.Passes(0.999, 1e-3)) << p.min_cosine << " " << p.max_abs_error;
  EXPECT_NE(p.kernels.find("kernel"), std::string::npos);
  PerformanceReport perf = VerifyPerformance(fused, o);
  EXPECT_GT(perf.baseline_ms, 0);
  EXPECT_GT(perf.fused_ms, 0);
  // A wrong output is caught: compare against a model whose logits differ.
  double cs = 0, err = 0;
  Tensor a = Tensor::FromVector<float>({1, 2, 3}, {3}), b = Tensor::FromVector<float>({1, 2, 4}, {3});
  CompareTensors(a, b, &cs, &err);
  EXPECT_LT(cs, 0.999);
  EXPECT_FLOAT_EQ(err, 1.0);
}

// Softmax before opset 13 normalizes over all axes from `axis` on (flattened), and a mean over
// H,W with keepdims=0 drops them: both become one generated row per (n, c) and match the
// reference kernels.
TEST(SafeFusion, FlattenedSoftmaxGlobalMeanAndGlobalPoolKernels) {
  Graph g;
  g.inputs.push_back(testing::FloatValue("x", {2, 3, 4, 5}));
  g.inputs.push_back(testing::FloatValue("b", {3, 4, 5}));  // whole over the normalized axes 1..3
  g.inputs.push_back(testing::FloatValue("s", {1, 3, 1, 1}));
  g.nodes.push_back(MakeNode("Add", {"x", "b"}, {"a"}, "add"));
  g.nodes.push_back(MakeNode("Softmax", {"a"}, {"y"}, "softmax", {testing::IntAttr("axis", 1)}));
  g.nodes.push_back(MakeNode("Mul", {"x", "s"}, {"m"}, "mul"));
  Attribute axes;
  axes.name = "axes";
  axes.type = Attribute::Type::kInts;
  axes.ints = {2, 3};
  g.nodes.push_back(MakeNode("ReduceMean", {"m"}, {"z"}, "mean", {axes, testing::IntAttr("keepdims", 0)}));
  // CNN heads: residual Add + Relu + GlobalAveragePool, and a shifted GlobalMaxPool.
  g.nodes.push_back(MakeNode("Add", {"x", "s"}, {"h"}, "add2"));
  g.nodes.push_back(MakeNode("Relu", {"h"}, {"hr"}, "relu"));
  g.nodes.push_back(MakeNode("GlobalAveragePool", {"hr"}, {"gap"}, "gap"));
  g.nodes.push_back(MakeNode("Sub", {"x", "s"}, {"m2"}, "sub"));
  g.nodes.push_back(MakeNode("GlobalMaxPool", {"m2"}, {"gmp"}, "gmp"));
  g.outputs.push_back(testing::FloatValue("y", {2, 3, 4, 5}));
  g.outputs.push_back(testing::FloatValue("z", {2, 3}));
  g.outputs.push_back(testing::FloatValue("gap", {2, 3, 1, 1}));
  g.outputs.push_back(testing::FloatValue("gmp", {2, 3, 1, 1}));
  Model m = MakeModel(g, 11);
  FusionOptions o = Preset("none");
  o.auto_fuse = false;
  o.benefit_threshold = 0;
  SafeGraphAutoFusion f(m, o);
  for (FusionRule& r : ParseRules("rule BiasSoftmaxAll fuse=BiasSoftmaxAll priority=50\n  a = Add($x, $b)\n  y = Softmax(a)\nend\n"
                                  "rule ScaledMean fuse=ScaledMean priority=50\n  m = Mul($x, $s)\n  z = ReduceMean(m)\nend\n"
                                  "rule AddReluGap fuse=AddReluGap priority=50\n  h = Add($x, $s)\n  hr = Relu(h)\n"
                                  "  gap = GlobalAveragePool(hr)\nend\n"
                                  "rule ShiftedMaxPool fuse=ShiftedMaxPool priority=50\n  m2 = Sub($x, $s)\n  gmp = GlobalMaxPool(m2)\nend\n",
                                  "user.rules"))
    f.AddFusionRule(r);
  Model fused = f.FuseSafe(NoSpeedGate());
  const SafeFusionReport& r = f.GetSafeFusionReport();
  ASSERT_EQ(r.kernels.size(), 4u) << r.ToText();
  for (const SafeKernelResult& k : r.kernels) {
    EXPECT_TRUE(k.fused) << k.rule << ": " << k.reason;
    EXPECT_NE(k.kernel.find("generated"), std::string::npos) << k.kernel;
    EXPECT_GE(k.cosine, 0.9999) << k.rule;
    EXPECT_LE(k.max_abs_error, 1e-5) << k.rule;
  }
  PrecisionReport p = VerifyPrecision(fused, m);
  EXPECT_TRUE(p.Passes(0.9999, 1e-5)) << p.min_cosine << " " << p.max_abs_error;
}

// DistilBERT-style attention: q is scaled before Q*K^T and the mask fills with Where(mask, -inf,
// scores), Softmax with a positive axis: one FusedAttention kernel, equal to the original.
TEST(SafeFusion, PrescaledWhereMaskAttention) {
  Graph g;
  g.inputs.push_back(testing::FloatValue("q", {1, 2, 5, 8}));
  g.inputs.push_back(testing::FloatValue("kt", {1, 2, 8, 5}));
  g.inputs.push_back(testing::FloatValue("v", {1, 2, 5, 8}));
  ValueInfo mask;
  mask.name = "mask";
  mask.dtype = DataType::kBool;
  mask.has_shape = true;
  for (int64_t d : {1, 1, 1, 5}) mask.dims.push_back(Dim::Known(d));
  g.inputs.push_back(mask);
  g.initializers.emplace_back("scale", Tensor::FromVector<float>({2.828427f}, {}));
  g.initializers.emplace_back("fill", Tensor::FromVector<float>({-INFINITY}, {}));
  g.nodes.push_back(MakeNode("Div", {"q", "scale"}, {"qs"}, "div"));
  g.nodes.push_back(MakeNode("MatMul", {"qs", "kt"}, {"qk"}, "qk"));
  g.nodes.push_back(MakeNode("Where", {"mask", "fill", "qk"}, {"m"}, "where"));
  g.nodes.push_back(MakeNode("Softmax", {"m"}, {"p"}, "softmax", {testing::IntAttr("axis", 3)}));
  g.nodes.push_back(MakeNode("MatMul", {"p", "v"}, {"y"}, "pv"));
  g.outputs.push_back(testing::FloatValue("y", {1, 2, 5, 8}));
  Model m = MakeModel(g, 13);
  SafeGraphAutoFusion f(m, Preset("transformer"));
  Model fused = f.FuseSafe(NoSpeedGate());
  const SafeFusionReport& r = f.GetSafeFusionReport();
  ASSERT_EQ(r.kernels.size(), 1u) << r.ToText();
  EXPECT_EQ(r.kernels[0].rule, "AttentionFusion(prescaled-where-mask)") << r.ToText();
  EXPECT_TRUE(r.kernels[0].fused) << r.kernels[0].reason;
  EXPECT_NE(r.kernels[0].kernel.find("library MatMul"), std::string::npos) << r.kernels[0].kernel;
  // Random masks may mask a whole row (NaN in both); the gate compares on the recorded inputs.
  EXPECT_GE(r.kernels[0].cosine, 0.9999);
}

// float16 / bfloat16 models: fused groups get kernels (values widened by the runtime, outputs
// narrowed back), and the fused model with its kernels matches the original.
TEST(SafeFusion, HalfPrecisionGroupsGetKernels) {
  // The repository's fixtures (tests/fixtures/make_onnx_fixtures.py) always, ONNX Runtime's
  // graphs as well when ../shared is there.
  const fs::path own = fs::path(GAF_SOURCE_DIR) / "tests" / "fixtures" / "onnx";
  std::vector<fs::path> files = {own / "conv_add_relu_fp16.onnx", own / "bias_softmax_bfloat16.onnx"};
  for (const char* name : {"conv_add_relu_fp16.onnx", "bias_softmax_fusion_bfloat16.onnx"})
    if (fs::exists(testing::OrtFusionDir() / name)) files.push_back(testing::OrtFusionDir() / name);
  for (const fs::path& file : files) {
    const std::string name = file.string();
    Model m = LoadModel(name);
    SafeGraphAutoFusion f(m, Preset("all"));
    Model fused = f.FuseSafe(NoSpeedGate());
    int kept = 0;
    for (const SafeKernelResult& k : f.GetSafeFusionReport().kernels) kept += k.fused;
    EXPECT_GT(kept, 0) << name << "\n" << f.GetSafeFusionReport().ToText();
    PrecisionReport p = VerifyPrecision(fused, m);
    EXPECT_TRUE(p.Passes(0.999, 1e-3)) << name << ": " << p.min_cosine << " " << p.max_abs_error;
    EXPECT_NE(p.kernels.find("kernel"), std::string::npos) << name << ": " << p.kernels;
  }
}

// Groups that mix float32 and float16 values (exporters' Cast-wrapped normalizations): the kernel
// widens the half inputs, rounds every float16-typed value where its operator ends (as the
// unfused operators store them), and writes each output in its own type.
TEST(SafeFusion, MixedPrecisionGroupsGetKernels) {
  std::vector<fs::path> files = {fs::path(GAF_SOURCE_DIR) / "tests" / "fixtures" / "onnx" / "skip_layer_norm_cast_fp16.onnx"};
  const fs::path ort = testing::OrtFusionDir() / "skip_layer_norm_format1_with_cast.onnx";
  if (fs::exists(ort)) files.push_back(ort);
  for (const fs::path& file : files) {
    Model m = LoadModel(file.string());
    SafeGraphAutoFusion f(m, Preset("all"));
    Model fused = f.FuseSafe(NoSpeedGate());
    const SafeFusionReport& r = f.GetSafeFusionReport();
    bool mixed = false;
    for (const SafeKernelResult& k : r.kernels)
      if (k.fused && k.kernel.find("Cast") != std::string::npos) mixed = true;
    EXPECT_TRUE(mixed) << file << ": no kept kernel with a Cast inside\n" << r.ToText();
    PrecisionReport p = VerifyPrecision(fused, m);
    for (const OutputPrecision& o : p.outputs) {
      EXPECT_GE(o.cosine, 0.99999) << file << " " << o.name;
      // Without the per-operator rounding the float16 output C differed by 8.7e-3 (one float16 step).
      EXPECT_LE(o.max_abs_error, 1e-4) << file << " " << o.name;
    }
    EXPECT_NE(p.kernels.find("kernel"), std::string::npos) << file << ": " << p.kernels;
  }
}

// float16 weight storage: products against the float32 reference within float16's precision, for
// decode (one row) and prefill (several rows, on float16 too), odd sizes; a non-matching call falls back.
TEST(HalfWeights, MatMulMatchesFloat32Reference) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (auto [M, K, N] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{1, 37, 53}, {1, 384, 1000}, {3, 65, 17}, {9, 128, 257}}) {
    Tensor a(DataType::kFloat, {1, M, K}), w(DataType::kFloat, {K, N});
    for (int64_t i = 0; i < a.numel(); ++i) a.data<float>()[i] = u(rng);
    for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = u(rng);
    Node n = MakeNode("MatMul", {"a", "w"}, {"y"}, "mm");
    KernelContext ref{n, 17, {&a, &w}, {}, nullptr, 2};
    ref.outputs.resize(1);
    OpRegistry::Global().Find("", "MatMul")->fn(ref);
    KernelInfo half = HalfWeightMatMulKernel(w);
    KernelContext got{n, 17, {&a, &w}, {}, nullptr, 2};
    got.outputs.resize(1);
    half.fn(got);
    ASSERT_EQ(got.outputs[0].shape(), ref.outputs[0].shape());
    double cs = 0, err = 0, scale = 0;
    CompareTensors(ref.outputs[0], got.outputs[0], &cs, &err);
    for (int64_t i = 0; i < ref.outputs[0].numel(); ++i) scale = std::max(scale, std::fabs(double(ref.outputs[0].data<float>()[i])));
    EXPECT_GE(cs, 0.99999) << M << "x" << K << "x" << N;
    EXPECT_LE(err, 2e-3 * scale) << M << "x" << K << "x" << N;
    EXPECT_GT(err, 0.0) << "float16 storage should change the result somewhere (a prompt's rows too)";
  }
}

// Sibling products (q/k/v) with float16 storage: the plan groups them (one SiblingMatMul running
// every float16 copy) and each output is bit for bit the lone float16 product's, at one row, at
// 2-4 rows and in prompts (whole-K tiles); with kDecode a prompt takes the float32 weights, as the
// lone kernel of that mode does.
TEST(HalfWeights, SiblingsStreamTheirCopiesTogether) {
  const int64_t K = 96;
  Model m = testing::SiblingProjections(K, {600, 130, 130}, 50);
  // Each output of `s` on x against the lone float16 kernel of its weight, bit for bit.
  auto expect_lone = [&](Session& s, HalfWeights mode, int64_t rows, uint32_t seed) {
    std::map<std::string, Tensor> feeds = {{"x", testing::RandomFloat({rows, K}, seed)}};
    const std::vector<Tensor> got = s.Run(feeds);
    for (int i = 0; i < 3; ++i) {
      const Tensor& w = *m.graph.FindInitializer("w" + std::to_string(i));
      Node n = MakeNode("MatMul", {"x", "w"}, {"y"}, "mm");
      KernelContext ctx{n, 17, {&feeds["x"], &w}, {}, nullptr, 2};
      ctx.outputs.resize(1);
      HalfWeightMatMulKernel(w, mode).fn(ctx);
      EXPECT_EQ(got[i].ToDoubles(), ctx.outputs[0].ToDoubles()) << rows << " rows, output " << i;
    }
  };
  SessionOptions half{.profile = true};
  UseHalfWeights(half);  // kAll
  Session grouped(m, half);
  EXPECT_EQ(grouped.product_rewrites().siblings, 3);
  for (int64_t rows : {1, 3, 4, 9, 40}) expect_lone(grouped, HalfWeights::kAll, rows, 60 + rows);
  EXPECT_EQ(testing::ProfiledCalls(grouped, "SiblingMatMul"), 5);
  EXPECT_EQ(testing::ProfiledCalls(grouped, "MatMul"), 0);

  // Decode rows only on float16 (kDecode): a prompt's products on the float32 weights.
  SessionOptions decode;
  UseHalfWeights(decode, HalfWeights::kDecode);
  Session d(m, decode);
  for (int64_t rows : {1, 4, 9}) expect_lone(d, HalfWeights::kDecode, rows, 70 + rows);
}

// A SwiGLU gate and up with float16 storage: one GatedMatMul runs on the pair's float16 copy at 1
// to 4 rows and in prompts (9 and 40 rows, whole-K tiles), bit for bit the two lone float16
// products followed by the gate.
TEST(HalfWeights, GatePairStreamsOneCopy) {
  const int64_t K = 96, F = 200;
  Graph g;
  g.inputs = {testing::FloatValue("x", {-1, K})};
  g.SetInitializer("wg", testing::RandomFloat({K, F}, 81, -0.5f, 0.5f));
  g.SetInitializer("wu", testing::RandomFloat({K, F}, 82, -0.5f, 0.5f));
  g.nodes.push_back(MakeNode("MatMul", {"x", "wg"}, {"g"}, "gate_proj"));
  g.nodes.push_back(MakeNode("MatMul", {"x", "wu"}, {"u"}, "up_proj"));
  g.nodes.push_back(MakeNode("Sigmoid", {"g"}, {"s"}, "sigmoid"));
  g.nodes.push_back(MakeNode("Mul", {"g", "s"}, {"silu"}, "silu"));
  g.nodes.push_back(MakeNode("Mul", {"silu", "u"}, {"y"}, "gate"));
  g.outputs = {ValueInfo{"y", DataType::kFloat}};
  Model m = MakeModel(std::move(g), 17);
  SessionOptions half{.profile = true};
  UseHalfWeights(half);
  Session s(m, half);
  ASSERT_EQ(s.product_rewrites().gated_products, 1);
  for (int64_t rows : {1, 3, 4, 9, 40}) {
    std::map<std::string, Tensor> feeds = {{"x", testing::RandomFloat({rows, K}, 90 + rows)}};
    const std::vector<Tensor> got = s.Run(feeds);
    std::vector<Tensor> lone;
    for (const char* w : {"wg", "wu"}) {
      const Tensor& wt = *m.graph.FindInitializer(w);
      Node n = MakeNode("MatMul", {"x", "w"}, {"y"}, "mm");
      KernelContext ctx{n, 17, {&feeds["x"], &wt}, {}, nullptr, 2};
      ctx.outputs.resize(1);
      HalfWeightMatMulKernel(wt).fn(ctx);
      lone.push_back(ctx.outputs[0]);
    }
    Tensor want = Tensor::Uninitialized(DataType::kFloat, {rows, F});
    StoreGated(lone[0].data<float>(), F, lone[1].data<float>(), F, rows, F, want.data<float>(), F);
    EXPECT_EQ(got[0].ToDoubles(), want.ToDoubles()) << rows << " rows";
  }
  EXPECT_EQ(testing::ProfiledCalls(s, "GatedMatMul"), 5);
  EXPECT_EQ(testing::ProfiledCalls(s, "MatMul"), 0);
}

// fuse --safe --half-weights: float16 weight storage is gated end to end with every product on
// float16 weights; kept -> recorded in the model's metadata (and survives a save/load); a gate
// the storage cannot meet -> not kept, reason "precision", no metadata.
TEST(HalfWeights, SafeFusionGatesFloat16Storage) {
  Model m = BuildLlamaModel(LlamaPreset("tiny"));
  SafeFusionOptions o = NoSpeedGate();
  o.half_weights = true;
  SafeGraphAutoFusion f(m, Preset("transformer"));
  Model fused = f.FuseSafe(o);
  const SafeFusionReport& r = f.GetSafeFusionReport();
  ASSERT_TRUE(r.half_weights_tried);
  EXPECT_TRUE(r.half_weights_kept) << r.ToText();
  EXPECT_GE(r.half_weights_cosine, 0.999);
  EXPECT_GT(r.half_weights_max_abs_error, 0.0) << "float16 weights should change the outputs somewhere";
  EXPECT_TRUE(ModelRequestsHalfWeights(fused));
  const fs::path path = fs::temp_directory_path() / "gaf_half_weights_test.onnx";
  f.Save(path.string());
  EXPECT_TRUE(ModelRequestsHalfWeights(LoadModel(path.string())));
  fs::remove(path);

  SafeFusionOptions strict = o;
  strict.max_abs_error = 1e-12;  // below float16's rounding of the weights
  strict.half_weights_rel_error = 1e-12;
  SafeGraphAutoFusion g(m, Preset("transformer"));
  Model rolled = g.FuseSafe(strict);
  const SafeFusionReport& rs = g.GetSafeFusionReport();
  ASSERT_TRUE(rs.half_weights_tried);
  EXPECT_FALSE(rs.half_weights_kept);
  EXPECT_EQ(rs.half_weights_reason.rfind("precision", 0), 0u) << rs.half_weights_reason;
  EXPECT_FALSE(ModelRequestsHalfWeights(rolled));

  // The bound relative to an output's scale: an absolute bound the error exceeds, a relative one
  // (of the outputs' largest magnitudes) it meets.
  SafeFusionOptions relative = o;
  relative.max_abs_error = r.half_weights_max_abs_error / 2;
  relative.half_weights_rel_error = 1.0 / 512;
  SafeGraphAutoFusion h(m, Preset("transformer"));
  h.FuseSafe(relative);
  EXPECT_TRUE(h.GetSafeFusionReport().half_weights_kept) << h.GetSafeFusionReport().ToText();
  EXPECT_GT(h.GetSafeFusionReport().half_weights_error_bound, relative.max_abs_error);

  // The task-level check runs after the precision gate, and its verdict and words are the report's.
  SafeFusionOptions checked = o;
  int calls = 0;
  checked.half_weights_check = [&](const Model&, std::string* what) {
    ++calls;
    *what = "greedy tokens: token 3 of 32 differs";
    return false;
  };
  SafeGraphAutoFusion c(m, Preset("transformer"));
  Model unchecked = c.FuseSafe(checked);
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(c.GetSafeFusionReport().half_weights_kept);
  EXPECT_EQ(c.GetSafeFusionReport().half_weights_reason, "greedy tokens: token 3 of 32 differs");
  EXPECT_FALSE(ModelRequestsHalfWeights(unchecked));
}

// The decoder check of fuse --safe --half-weights: the tiny decoder's greedy tokens are the same
// with float16 weights; a model that is no decoder passes with a note.
TEST(HalfWeights, GreedyTokensCheck) {
  std::string what;
  EXPECT_TRUE(HalfWeightsKeepGreedyTokens(BuildLlamaModel(LlamaPreset("tiny")), 1, &what, 8, 12)) << what;
  EXPECT_EQ(what, "the same 12 greedy tokens as float32 weights on a random prompt of 8 ids");
  EXPECT_TRUE(HalfWeightsKeepGreedyTokens(BuildCnnModel(CnnPreset("tiny")), 1, &what)) << what;
  EXPECT_NE(what.find("not a decoder"), std::string::npos) << what;
  // A head whose weights float16 cannot hold (above 65504: inf) changes the tokens.
  Model big = BuildLlamaModel(LlamaPreset("tiny"));
  Tensor* head = big.graph.FindInitializer("lm_head.weight");
  ASSERT_NE(head, nullptr);
  for (int64_t i = 0; i < head->numel(); ++i) head->data<float>()[i] *= (i % 3 == 0 ? 1e6f : 1.f);
  EXPECT_FALSE(HalfWeightsKeepGreedyTokens(big, 1, &what, 8, 12)) << what;
  EXPECT_EQ(what.rfind("greedy tokens: with float16 weights token ", 0), 0u) << what;
}

}  // namespace
}  // namespace gaf
