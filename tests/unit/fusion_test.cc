// The fusion planner, the automatic fuser, the fused-ONNX rewrite and GraphAutoFusion.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <random>
#include <set>

#include "fusion/auto_fuser.h"
#include "fusion/auto_fusion.h"
#include "fusion/planner.h"
#include "fusion/rewrite.h"
#include "ir/sanitizer.h"
#include "models/cnn.h"
#include "models/llama.h"
#include "onnx_io/onnx_io.h"
#include "runtime/session.h"
#include "test_util.h"

namespace gaf {
namespace {

namespace fs = std::filesystem;
using testing::FloatValue;
using testing::MakeModel;
using testing::MakeNode;

std::map<std::string, Tensor> TestFeeds(const Model& m, uint32_t seed = 1);
void ExpectSameOutputs(const Model& original, const Model& fused, const std::map<std::string, Tensor>& feeds,
                       const std::string& what);

// A fixed hand-made profile keeps verdicts deterministic.
HardwareProfile TestProfile(double local_memory_bytes = 192 * 1024) {
  HardwareProfile hw;
  hw.name = "test";
  hw.peak_gflops = 100;
  hw.bandwidth_gbs = 10;
  hw.local_memory_bytes = local_memory_bytes;
  hw.l1_bytes = 32 * 1024;
  hw.l2_bytes = 1 << 20;
  hw.kernel_overhead_us = 2;
  hw.source = "unit test";
  return hw;
}

ShapeMap ShapesOf(const std::map<std::string, Shape>& m) {
  ShapeMap s;
  for (const auto& [k, v] : m) s[k] = ValueShape{DataType::kFloat, v, true};
  return s;
}

FusionRule Rule(const std::string& name, const std::string& chain, int priority = 0, double threshold = 0.1) {
  FusionRule r;
  r.name = name;
  r.pattern = ChainPattern(chain);
  r.fuse_pattern = "Fused" + name;
  r.priority = priority;
  r.benefit_threshold = threshold;
  r.preset = "user";
  r.source = "test";
  return r;
}

// x[1,4096] -> Relu -> Sigmoid -> y
Graph ReluSigmoidGraph() {
  Graph g;
  g.name = "relu_sigmoid";
  g.inputs.push_back(FloatValue("x", {1, 4096}));
  g.outputs.push_back(FloatValue("y", {1, 4096}));
  g.nodes.push_back(MakeNode("Relu", {"x"}, {"a"}, "relu"));
  g.nodes.push_back(MakeNode("Sigmoid", {"a"}, {"y"}, "sigmoid"));
  return g;
}
const ShapeMap kReluSigmoidShapes = ShapesOf({{"x", {1, 4096}}, {"a", {1, 4096}}, {"y", {1, 4096}}});

TEST(FusionPlanner, FusesWhenSavingMeetsThreshold) {
  Graph g = ReluSigmoidGraph();
  DecisionLog log;
  auto c = PlanFusion(g, {Rule("ReluSigmoid", "Relu+Sigmoid")}, kReluSigmoidShapes, TestProfile(), {}, &log);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].verdict, Verdict::kFuse) << c[0].reason;
  EXPECT_EQ(c[0].node_names, (std::vector<std::string>{"relu", "sigmoid"}));
  EXPECT_EQ(c[0].inputs, (std::vector<std::string>{"x"}));
  EXPECT_EQ(c[0].outputs, (std::vector<std::string>{"y"}));
  EXPECT_GT(c[0].cost.time_before_us, c[0].cost.time_after_us);
  EXPECT_LT(c[0].cost.bytes_after, c[0].cost.bytes_before);
  EXPECT_NE(c[0].reason.find("meets the benefit threshold of 10.0%"), std::string::npos) << c[0].reason;
  ASSERT_EQ(log.records().size(), 1u);
  EXPECT_EQ(log.records()[0].decision, "Fuse");
  EXPECT_TRUE(log.records()[0].has_estimate);
  EXPECT_EQ(log.ForNode("sigmoid").size(), 1u);
  EXPECT_EQ(log.ForRule("relusigmoid").size(), 1u);
}

TEST(FusionPlanner, SkipsLowBenefitWithReason) {
  Graph g = ReluSigmoidGraph();
  auto c = PlanFusion(g, {Rule("ReluSigmoid", "Relu+Sigmoid", 0, 0.99)}, kReluSigmoidShapes, TestProfile(), {}, nullptr);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].verdict, Verdict::kSkipLowBenefit);
  EXPECT_NE(c[0].reason.find("below the benefit threshold of 99.0%"), std::string::npos) << c[0].reason;
  // The global override wins over the rule's threshold.
  PlannerOptions po;
  po.benefit_threshold = 0.0;
  c = PlanFusion(g, {Rule("ReluSigmoid", "Relu+Sigmoid", 0, 0.99)}, kReluSigmoidShapes, TestProfile(), po, nullptr);
  EXPECT_EQ(c[0].verdict, Verdict::kFuse) << c[0].reason;
}

TEST(FusionPlanner, SkipsLocalMemoryOverflowWithReason) {
  Graph g = ReluSigmoidGraph();
  auto c = PlanFusion(g, {Rule("ReluSigmoid", "Relu+Sigmoid")}, kReluSigmoidShapes, TestProfile(16), {}, nullptr);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].verdict, Verdict::kSkipLocalMemory) << c[0].reason;
  EXPECT_FALSE(c[0].cost.fits_local_memory);
  EXPECT_NE(c[0].reason.find("local-memory budget of profile test"), std::string::npos) << c[0].reason;
}

TEST(FusionPlanner, MaybeWhenShapesUnknown) {
  Graph g = ReluSigmoidGraph();
  PlannerOptions po;
  po.shapes_known = false;
  po.shapes_error = "the runtime has no kernel for Foo";
  DecisionLog log;
  auto c = PlanFusion(g, {Rule("ReluSigmoid", "Relu+Sigmoid")}, {}, TestProfile(), po, &log);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].verdict, Verdict::kMaybe);
  EXPECT_NE(c[0].reason.find("the runtime has no kernel for Foo"), std::string::npos) << c[0].reason;
  EXPECT_EQ(log.records()[0].stage, "shapes");
}

TEST(FusionPlanner, SamePriorityOverlapIsAConflictNamingRulesAndNodes) {
  Graph g = ReluSigmoidGraph();
  try {
    PlanFusion(g, {Rule("FirstRule", "Relu+Sigmoid", 3), Rule("SecondRule", "Relu+Sigmoid", 3)}, kReluSigmoidShapes,
               TestProfile(), {}, nullptr);
    FAIL() << "expected a conflict";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'FirstRule'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'SecondRule'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("relu (Relu)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("sigmoid (Sigmoid)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("same priority 3"), std::string::npos) << msg;
  }
}

TEST(FusionPlanner, HigherPriorityWinsAndLoserIsRecorded) {
  // x -> Relu -> Sigmoid -> Tanh -> y: "Relu+Sigmoid" (priority 1) and "Sigmoid+Tanh" (priority 5).
  Graph g = ReluSigmoidGraph();
  g.nodes[1].outputs = {"b"};
  g.nodes.push_back(MakeNode("Tanh", {"b"}, {"y"}, "tanh"));
  ShapeMap s = ShapesOf({{"x", {1, 4096}}, {"a", {1, 4096}}, {"b", {1, 4096}}, {"y", {1, 4096}}});
  DecisionLog log;
  auto c = PlanFusion(g, {Rule("Low", "Relu+Sigmoid", 1), Rule("High", "Sigmoid+Tanh", 5)}, s, TestProfile(), {}, &log);
  ASSERT_EQ(c.size(), 2u);
  const FusionCandidate& low = c[0].rule == "Low" ? c[0] : c[1];
  const FusionCandidate& high = c[0].rule == "High" ? c[0] : c[1];
  EXPECT_EQ(high.verdict, Verdict::kFuse) << high.reason;
  EXPECT_EQ(low.verdict, Verdict::kSkipOverlap);
  EXPECT_NE(low.reason.find("rule 'High' has priority 5, higher than 1"), std::string::npos) << low.reason;
  bool logged = false;
  for (const DecisionRecord& r : log.records()) logged |= r.rule == "Low" && r.decision == "Skip: overlap";
  EXPECT_TRUE(logged);
}

TEST(FusionPlanner, SameRuleOverlapKeepsOneMatchWithoutConflict) {
  // Relu -> Relu -> Relu: "Relu+Relu" matches at the second and the third node; they share one.
  Graph g;
  g.inputs.push_back(FloatValue("x", {1, 1024}));
  g.outputs.push_back(FloatValue("y", {1, 1024}));
  g.nodes.push_back(MakeNode("Relu", {"x"}, {"a"}, "r1"));
  g.nodes.push_back(MakeNode("Relu", {"a"}, {"b"}, "r2"));
  g.nodes.push_back(MakeNode("Relu", {"b"}, {"y"}, "r3"));
  ShapeMap s = ShapesOf({{"x", {1, 1024}}, {"a", {1, 1024}}, {"b", {1, 1024}}, {"y", {1, 1024}}});
  auto c = PlanFusion(g, {Rule("ReluRelu", "Relu+Relu")}, s, TestProfile(), {}, nullptr);
  ASSERT_EQ(c.size(), 2u);
  int fused = 0, overlap = 0;
  for (const auto& x : c) {
    fused += x.verdict == Verdict::kFuse;
    overlap += x.verdict == Verdict::kSkipOverlap;
  }
  EXPECT_EQ(fused, 1);
  EXPECT_EQ(overlap, 1);
}

TEST(FusionPlanner, LegalityRejectsCycles) {
  // a = Relu(x); b = Neg(a) outside; c = Add(a, b): the group {Relu, Add} would need Neg inside.
  Graph g;
  g.inputs.push_back(FloatValue("x", {4}));
  g.outputs.push_back(FloatValue("c", {4}));
  g.nodes.push_back(MakeNode("Relu", {"x"}, {"a"}, "relu"));
  g.nodes.push_back(MakeNode("Neg", {"a"}, {"b"}, "neg"));
  g.nodes.push_back(MakeNode("Add", {"a", "b"}, {"c"}, "add"));
  GraphIndex index(g);
  FusionDecision d = CheckFusionLegality(g, index, {0, 2});
  EXPECT_FALSE(d.CanFuse());
  EXPECT_NE(d.Explain().find("cycle"), std::string::npos) << d.Explain();
  EXPECT_TRUE(CheckFusionLegality(g, index, {0, 1, 2}).CanFuse());
}

TEST(AutoFuser, FusesAnElementwiseChain) {
  Graph g;
  g.name = "chain";
  g.inputs.push_back(FloatValue("x", {2, 8}));
  g.outputs.push_back(FloatValue("y", {2, 8}));
  g.initializers.emplace_back("bias", Tensor::FromVector<float>(std::vector<float>(8, 0.5f), {8}));
  g.nodes.push_back(MakeNode("Add", {"x", "bias"}, {"a"}, "add"));
  g.nodes.push_back(MakeNode("Relu", {"a"}, {"b"}, "relu"));
  g.nodes.push_back(MakeNode("Mul", {"b", "b"}, {"c"}, "mul"));
  g.nodes.push_back(MakeNode("Sigmoid", {"c"}, {"y"}, "sigmoid"));
  GraphIndex index(g);
  auto groups = FindAutoFusionGroups(g, index, {});
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].nodes, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(groups[0].fused_op, "FusedElementwise");
  // Excluded nodes split the chain.
  groups = FindAutoFusionGroups(g, index, {false, true, false, false});
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].nodes, (std::vector<int>{2, 3}));

  // The rewrite of the group runs and equals the original.
  Model m = MakeModel(g);
  Model fused = RewriteFusedGroups(m, {{groups[0].nodes, "FusedElementwise", "auto", "test", 1}});
  EXPECT_EQ(CheckModel(fused), "");
  ExpectSameOutputs(m, fused, TestFeeds(m), "elementwise chain");
}

TEST(AutoFuser, RespectsOutsideConsumersAndContractionPrologues) {
  // e = Exp(x) feeds two separate outputs: it cannot join either.
  Graph g;
  g.inputs.push_back(FloatValue("x", {4, 4}));
  g.inputs.push_back(FloatValue("w", {4, 4}));
  g.outputs.push_back(FloatValue("r", {4, 4}));
  g.outputs.push_back(FloatValue("z", {4, 4}));
  g.nodes.push_back(MakeNode("Exp", {"x"}, {"e"}, "exp"));
  g.nodes.push_back(MakeNode("Relu", {"e"}, {"r"}, "relu"));
  g.nodes.push_back(MakeNode("Neg", {"e"}, {"n"}, "neg"));
  g.nodes.push_back(MakeNode("MatMul", {"n", "w"}, {"m"}, "matmul"));
  g.nodes.push_back(MakeNode("Add", {"m", "x"}, {"s"}, "add"));
  g.nodes.push_back(MakeNode("Tanh", {"s"}, {"z"}, "tanh"));
  GraphIndex index(g);
  auto groups = FindAutoFusionGroups(g, index, {});
  ASSERT_EQ(groups.size(), 1u);
  // MatMul with its epilogue; Neg (a prologue of the MatMul) stays out, Exp has outside consumers.
  EXPECT_EQ(groups[0].nodes, (std::vector<int>{3, 4, 5}));
  EXPECT_EQ(groups[0].fused_op, "FusedContractionEpilogue");
}

TEST(AutoFuser, ReductionWithElementwisePrologueAndEpilogue) {
  // A decomposed softmax: Exp -> ReduceSum -> Div(e, s).
  Graph g;
  g.inputs.push_back(FloatValue("x", {2, 8}));
  g.outputs.push_back(FloatValue("y", {2, 8}));
  g.initializers.emplace_back("axes", Tensor::FromInt64s({-1}));
  g.nodes.push_back(MakeNode("Exp", {"x"}, {"e"}, "exp"));
  g.nodes.push_back(MakeNode("ReduceSum", {"e", "axes"}, {"s"}, "sum"));
  g.nodes.push_back(MakeNode("Div", {"e", "s"}, {"y"}, "div"));
  GraphIndex index(g);
  auto groups = FindAutoFusionGroups(g, index, {});
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].nodes, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(groups[0].fused_op, "FusedReduction");
}

TEST(AutoFuser, LeavesShapeArithmeticAlone) {
  // y = Relu(Reshape(x * 2, Concat(Gather(Shape(x), 0), [-1]))): the Shape -> Gather -> Unsqueeze
  // -> Concat chain computes a few int64 elements; only the float work may be grouped.
  Graph g;
  g.inputs.push_back(FloatValue("x", {2, 3, 4}));
  g.outputs.push_back(FloatValue("y", {2, 12}));
  g.initializers.emplace_back("two", Tensor::FromVector<float>({2.f}, {}));
  g.initializers.emplace_back("zero", Tensor::FromInt64s({0}));
  g.initializers.emplace_back("minus1", Tensor::FromInt64s({-1}));
  g.nodes.push_back(MakeNode("Shape", {"x"}, {"shp"}, "shape"));
  g.nodes.push_back(MakeNode("Gather", {"shp", "zero"}, {"n"}, "gather"));
  g.nodes.push_back(MakeNode("Concat", {"n", "minus1"}, {"newshape"}, "concat", {testing::IntAttr("axis", 0)}));
  g.nodes.push_back(MakeNode("Mul", {"x", "two"}, {"m"}, "mul"));
  g.nodes.push_back(MakeNode("Reshape", {"m", "newshape"}, {"r"}, "reshape"));
  g.nodes.push_back(MakeNode("Relu", {"r"}, {"y"}, "relu"));
  GraphIndex index(g);
  auto groups = FindAutoFusionGroups(g, index, {});
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].nodes, (std::vector<int>{3, 4, 5}));  // Mul, Reshape, Relu; no shape math
}

// ---------------- rewrite ----------------

struct Agreement {
  double cosine = 1, max_abs = 0;
};
Agreement Compare(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  std::vector<double> x = a.ToDoubles(), y = b.ToDoubles();
  Agreement r;
  if (x.size() != y.size()) return {0, 1e30};
  double dot = 0, nx = 0, ny = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    dot += x[i] * y[i];
    nx += x[i] * x[i];
    ny += y[i] * y[i];
    r.max_abs = std::max(r.max_abs, std::fabs(x[i] - y[i]));
  }
  r.cosine = (nx == 0 && ny == 0) ? 1.0 : dot / std::sqrt(nx * ny + 1e-300);
  return r;
}

// Random feeds for a model's inputs (symbolic dims = 2, integer inputs 0, masks 1).
std::map<std::string, Tensor> TestFeeds(const Model& m, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::set<std::string> inits;
  for (const auto& [n, t] : m.graph.initializers) inits.insert(n);
  std::map<std::string, Tensor> feeds;
  for (const ValueInfo& v : m.graph.inputs) {
    if (inits.count(v.name)) continue;
    Shape shape;
    for (const Dim& d : v.dims) shape.push_back(d.known() ? d.value : 2);
    const bool mask = v.name.find("mask") != std::string::npos;
    Tensor t(DataType::kFloat, shape);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = nd(rng);
    if (v.dtype == DataType::kFloat || v.dtype == DataType::kUndefined) {
      feeds[v.name] = t;
    } else if (v.dtype == DataType::kBool) {
      Tensor b(DataType::kBool, shape);
      for (int64_t i = 0; i < b.numel(); ++i) b.data<bool>()[i] = true;
      feeds[v.name] = b;
    } else if (IsFloatingPoint(v.dtype)) {
      feeds[v.name] = t.CastTo(v.dtype);
    } else {
      Tensor q(DataType::kInt64, shape);
      for (int64_t i = 0; i < q.numel(); ++i) q.data<int64_t>()[i] = mask ? 1 : 0;
      feeds[v.name] = q.CastTo(v.dtype);
    }
  }
  return feeds;
}

void ExpectSameOutputs(const Model& original, const Model& fused, const std::map<std::string, Tensor>& feeds,
                       const std::string& what) {
  std::vector<Tensor> a = Session(original).Run(feeds);
  std::vector<Tensor> b = Session(fused).Run(feeds);
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!IsFloatingPoint(a[i].dtype())) {
      EXPECT_EQ(a[i].ToDoubles(), b[i].ToDoubles()) << what << " output " << i;
      continue;
    }
    Agreement r = Compare(a[i], b[i]);
    EXPECT_GE(r.cosine, 0.9999) << what << " output " << i;
    EXPECT_LE(r.max_abs, 1e-4) << what << " output " << i;
  }
}

TEST(FusionRewrite, FunctionsPerDistinctBodyAndProvenance) {
  // Three LeakyRelu -> Sigmoid chains; the second has another alpha, so its body differs.
  Graph g;
  g.name = "three_chains";
  g.inputs.push_back(FloatValue("x", {3, 5}));
  for (int k = 0; k < 3; ++k) {
    Attribute alpha;
    alpha.name = "alpha";
    alpha.type = Attribute::Type::kFloat;
    alpha.f = k == 1 ? 0.2f : 0.1f;
    g.nodes.push_back(MakeNode("LeakyRelu", {"x"}, {fmt::format("a{}", k)}, fmt::format("leaky{}", k), {alpha}));
    g.nodes.push_back(MakeNode("Sigmoid", {fmt::format("a{}", k)}, {fmt::format("y{}", k)}, fmt::format("sig{}", k)));
    g.outputs.push_back(FloatValue(fmt::format("y{}", k), {3, 5}));
  }
  g.value_info.push_back(FloatValue("a0", {3, 5}));
  Model m = MakeModel(g);
  std::vector<RewrittenGroup> done;
  Model f = RewriteFusedGroups(
      m, {{{0, 1}, "FusedLeakySig", "LeakySig", "test", 1}, {{2, 3}, "FusedLeakySig", "LeakySig", "test", 2},
          {{4, 5}, "FusedLeakySig", "LeakySig", "test", 3}},
      &done);
  EXPECT_EQ(CheckModel(f), "");
  EXPECT_TRUE(VerifyModel(f).empty());
  ASSERT_EQ(f.graph.nodes.size(), 3u);
  ASSERT_EQ(f.functions.size(), 2u);
  EXPECT_EQ(f.graph.nodes[0].op_type, "FusedLeakySig");
  EXPECT_EQ(f.graph.nodes[1].op_type, "FusedLeakySig_2");
  EXPECT_EQ(f.graph.nodes[2].op_type, "FusedLeakySig");
  EXPECT_EQ(f.graph.nodes[0].domain, kFusedDomain);
  EXPECT_EQ(f.OpsetVersion(kFusedDomain), 1);
  EXPECT_NE(f.graph.nodes[1].doc_string.find("leaky1 (LeakyRelu), sig1 (Sigmoid)"), std::string::npos);
  EXPECT_NE(f.graph.nodes[1].doc_string.find("rule 'LeakySig'"), std::string::npos);
  EXPECT_TRUE(f.graph.value_info.empty());  // a0 became function-internal
  bool meta = false;
  for (const auto& [k, v] : f.metadata_props) meta |= k == "graph_autofusion" && v.find("leaky2") != std::string::npos;
  EXPECT_TRUE(meta);
  ASSERT_EQ(done.size(), 3u);
  EXPECT_EQ(done[1].original_nodes, (std::vector<std::string>{"leaky1", "sig1"}));
  ExpectSameOutputs(m, f, TestFeeds(m), "three chains");
  // Round trip through the file format keeps the functions.
  Model back = ModelFromBytes(ModelToBytes(f), "", "fused");
  EXPECT_EQ(back.functions.size(), 2u);
  ExpectSameOutputs(m, back, TestFeeds(m), "three chains, reloaded");
}

TEST(FusionRewrite, InitializersBecomeExplicitInputsAndOrderIsRepaired) {
  // Group {relu, add}: add also reads the initializer; an outside node between them reads relu's
  // output, so the group has two outputs and the fused node must be placed before that node.
  Graph g;
  g.name = "relu_add";
  g.inputs.push_back(FloatValue("x", {4}));
  g.outputs.push_back(FloatValue("y", {4}));
  g.outputs.push_back(FloatValue("z", {4}));
  g.initializers.emplace_back("w", Tensor::FromVector<float>({1, 2, 3, 4}, {4}));
  g.nodes.push_back(MakeNode("Relu", {"x"}, {"a"}, "relu"));
  g.nodes.push_back(MakeNode("Neg", {"a"}, {"z"}, "neg"));
  g.nodes.push_back(MakeNode("Add", {"a", "w"}, {"y"}, "add"));
  Model m = MakeModel(g);
  Model f = RewriteFusedGroups(m, {{{0, 2}, "FusedReluAdd", "ReluAdd", "test", 1}});
  EXPECT_EQ(CheckModel(f), "");
  ASSERT_EQ(f.graph.nodes.size(), 2u);
  EXPECT_EQ(f.graph.nodes[0].op_type, "FusedReluAdd");
  EXPECT_EQ(f.graph.nodes[0].inputs, (std::vector<std::string>{"x", "w"}));
  EXPECT_EQ(f.graph.nodes[0].outputs, (std::vector<std::string>{"a", "y"}));
  ASSERT_EQ(f.functions.size(), 1u);
  EXPECT_EQ(f.functions[0].inputs, (std::vector<std::string>{"X0", "X1"}));
  ExpectSameOutputs(m, f, TestFeeds(m), "relu add");
  EXPECT_THROW(RewriteFusedGroups(m, {{{0, 2}, "A", "A", "", 1}, {{2, 1}, "B", "B", "", 2}}), Error);
}

// ---------------- GraphAutoFusion end to end ----------------

FusionOptions Preset(const std::string& preset) {
  FusionOptions o;
  o.preset = preset;
  return o;
}

int CountFusedNodes(const Model& m) {
  int n = 0;
  for (const Node& node : m.graph.nodes) n += node.domain == kFusedDomain;
  return n;
}

TEST(GraphAutoFusion, HandMadeRuleViaAddFusionRule) {
  Graph g = ReluSigmoidGraph();
  Model m = MakeModel(g);
  FusionOptions o;
  o.preset = "none";
  o.auto_fuse = false;
  o.profile = "h200";
  GraphAutoFusion f(m, o);
  f.AddFusionRule(Rule("ReluSigmoid", "Relu+Sigmoid", 0, 0.0));
  const auto& c = f.AnalyzeFusionBenefit();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].verdict, Verdict::kFuse) << c[0].reason;
  FusionEstimate e = f.EstimateFusionBenefit();
  EXPECT_EQ(e.fused, 1);
  EXPECT_GT(e.time_before_us, e.time_after_us);
  EXPECT_EQ(e.nodes_after, 1);
  Model fused = f.Fuse();
  EXPECT_EQ(CountFusedNodes(fused), 1);
  EXPECT_TRUE(f.fuse_summary().checker_passed);
  EXPECT_EQ(f.fuse_summary().per_rule.at("ReluSigmoid"), 1);
  ExpectSameOutputs(m, fused, TestFeeds(m), "relu sigmoid");
  EXPECT_FALSE(f.decision_log().ForRule("ReluSigmoid").empty());
}

TEST(GraphAutoFusion, UnknownFuseRuleIsAnErrorListingRules) {
  Model m = MakeModel(ReluSigmoidGraph());
  try {
    FusionOptions o;
    o.fuse_rules = {"NoSuchRule"};
    GraphAutoFusion f(m, o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown rule 'NoSuchRule'"), std::string::npos) << e.what();
  }
  // A chain name is accepted as an ad-hoc rule.
  FusionOptions o;
  o.fuse_rules = {"Relu+Sigmoid"};
  o.auto_fuse = false;
  o.benefit_threshold = 0;
  GraphAutoFusion f(m, o);
  ASSERT_EQ(f.AnalyzeFusionBenefit().size(), 1u);
  EXPECT_EQ(f.AnalyzeFusionBenefit()[0].fused_op, "FusedReluSigmoid");
}

std::map<std::string, Tensor> LlamaFeeds(const Model& m) {
  std::map<std::string, Tensor> feeds;
  feeds["input_ids"] = Tensor::FromVector<int64_t>({3, 1, 4, 1, 5}, {1, 5});
  feeds["attention_mask"] = Tensor::FromVector<int64_t>({1, 1, 1, 1, 1, 1, 1}, {1, 7});
  feeds["position_ids"] = Tensor::FromVector<int64_t>({2, 3, 4, 5, 6}, {1, 5});
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (const ValueInfo& v : m.graph.inputs) {
    if (v.name.rfind("past", 0) != 0) continue;
    Tensor t(DataType::kFloat, {1, v.dims[1].value, 2, v.dims[3].value});
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = nd(rng);
    feeds[v.name] = t;
  }
  return feeds;
}

TEST(GraphAutoFusion, TinyLlamaFusedEqualsOriginal) {
  Model m = BuildLlamaModel(LlamaPreset("tiny"));
  GraphAutoFusion f(m, Preset("transformer"));
  Model fused = f.Fuse();
  EXPECT_EQ(CheckModel(fused), "");
  EXPECT_TRUE(f.fuse_summary().checker_passed);
  EXPECT_LT(fused.graph.nodes.size(), m.graph.nodes.size());
  EXPECT_GT(CountFusedNodes(fused), 0);
  ExpectSameOutputs(m, fused, LlamaFeeds(m), "tiny llama");
  // Every RMSNorm (Pow), rotary embedding (Neg), SwiGLU (Sigmoid) and attention softmax is inside
  // a fused group: none is left in the main graph.
  for (const Node& n : fused.graph.nodes)
    for (const char* op : {"Pow", "ReduceMean", "Neg", "Sigmoid", "Softmax"}) EXPECT_NE(n.op_type, op) << n.name;
}

// The analysis grows about linearly with the graph: 48 layers (about 3,000 nodes) against 12, each
// timed three times, interleaved, in this process (the better of the two; no bound on the machine's
// speed, which varies by a third between runs here). Linear is 4x; a pass quadratic in the nodes
// would be 16x.
TEST(GraphAutoFusion, AnalysisGrowsLinearlyWithTheGraph) {
  auto model = [](int layers) {
    LlamaConfig c = LlamaPreset("tiny");
    c.num_layers = layers;
    return BuildLlamaModel(c);
  };
  const Model small = model(12), large = model(48);
  ASSERT_GT(large.graph.nodes.size(), 3000u);
  auto analyse = [](const Model& m, size_t* candidates) {
    const auto t0 = std::chrono::steady_clock::now();
    GraphAutoFusion f(m, Preset("transformer"));
    *candidates = f.AnalyzeFusionBenefit().size();
    f.EstimateFusionBenefit();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  double t_small = 1e9, t_large = 1e9;
  size_t c_small = 0, c_large = 0;
  for (int round = 0; round < 3; ++round) {
    t_small = std::min(t_small, analyse(small, &c_small));
    t_large = std::min(t_large, analyse(large, &c_large));
  }
  EXPECT_GT(c_large, 400u);
  EXPECT_GT(c_large, 3 * c_small) << "candidates grow with the layers";
  EXPECT_LT(t_large / t_small, 8.0) << small.graph.nodes.size() << " nodes " << t_small << " s, "
                                    << large.graph.nodes.size() << " nodes " << t_large << " s";
  std::printf("analysis of %zu nodes: %.3f s, of %zu: %.3f s (%.2fx)\n", small.graph.nodes.size(), t_small,
              large.graph.nodes.size(), t_large, t_large / t_small);
}

TEST(GraphAutoFusion, TinyCnnFusedEqualsOriginal) {
  Model m = BuildCnnModel(CnnPreset("tiny"));
  GraphAutoFusion f(m, Preset("cnn"));
  Model fused = f.Fuse();
  EXPECT_EQ(CheckModel(fused), "");
  EXPECT_GT(CountFusedNodes(fused), 0);
  ExpectSameOutputs(m, fused, TestFeeds(m), "tiny cnn");
  for (const Node& n : fused.graph.nodes) EXPECT_NE(n.op_type, "BatchNormalization") << n.name;
  const fs::path out = fs::temp_directory_path() / fmt::format("gaf_fused_cnn_{}.onnx", ::getpid());
  f.Save(out.string());
  Model back = LoadModel(out.string());
  EXPECT_EQ(back.functions.size(), fused.functions.size());
  fs::remove(out);
}

}  // namespace
}  // namespace gaf

namespace gaf {
namespace {

// Every ONNX Runtime fusion test graph the runtime can run: the fused model (preset "all") passes
// the checker when the original does, and its outputs equal the original's.
TEST(GraphAutoFusion, OrtFusionGraphsFusedEqualOriginal) {
  const fs::path dir = testing::OrtFusionDir();
  if (!fs::exists(dir)) GTEST_SKIP() << testing::SharedSkipMessage(dir);
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".onnx") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  int compared = 0, with_fusion = 0, groups = 0;
  for (const fs::path& p : files) {
    Model m;
    std::map<std::string, Tensor> feeds;
    try {
      m = LoadModel(p.string());
      // Graphs made to stress tensor sizes (gigabytes of input) are left to the conformance suites.
      if (testing::InputElements(m) > (int64_t{1} << 22)) continue;
      feeds = TestFeeds(m);
      Session(m).Run(feeds);
    } catch (const Error&) {
      continue;  // the runtime cannot run it (contrib ops, unsupported types)
    }
    GraphAutoFusion f(m, Preset("all"));
    Model fused;
    try {
      fused = f.Fuse();
    } catch (const Error& e) {
      ADD_FAILURE() << p.filename() << ": " << e.what();
      continue;
    }
    if (CheckModel(m).empty()) {
      EXPECT_EQ(CheckModel(fused), "") << p.filename();
    }
    ExpectSameOutputs(m, fused, feeds, p.filename().string());
    ++compared;
    with_fusion += f.fuse_summary().groups > 0;
    groups += f.fuse_summary().groups;
  }
  std::printf("ort-fusion: %d graphs compared, %d with fused groups, %d groups\n", compared, with_fusion, groups);
  EXPECT_GT(compared, 50);
  EXPECT_GT(with_fusion, compared / 2);
}

}  // namespace
}  // namespace gaf
