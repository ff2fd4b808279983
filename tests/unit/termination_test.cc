// Everything terminates (issue 11): a hostile model or rule file ends in seconds with a one-line
// gaf::Error naming the node, function or rule line, or with a correct result; never a hang, an
// exhausted memory or an overflowed stack. Loop/Scan iterations (--max-loop-iterations), function
// inlining (--max-nodes, nesting, recursion), subgraph nesting, rule matching (max_match_steps),
// rule size and thresholds, and long chains through canonicalization and planning.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "fusion/auto_fusion.h"
#include "fusion/rules.h"
#include "ir/limits.h"
#include "ir/sanitizer.h"
#include "match/pattern.h"
#include "runtime/session.h"
#include "test_util.h"

namespace gaf {
namespace {

using testing::FloatValue;
using testing::MakeModel;
using testing::MakeNode;

// Restores the process-wide limits a test changes.
struct LimitsGuard {
  Limits saved = GlobalLimits();
  ~LimitsGuard() { GlobalLimits() = saved; }
};

ValueInfo ScalarValue(const std::string& name, DataType dt) {
  ValueInfo v;
  v.name = name;
  v.dtype = dt;
  v.has_shape = true;
  return v;
}

Attribute GraphAttr(const std::string& name, Graph g) {
  Attribute a;
  a.name = name;
  a.type = Attribute::Type::kGraph;
  a.g = std::make_shared<Graph>(std::move(g));
  return a;
}

// The message of the gaf::Error `fn` throws ("" when it throws none).
template <typename Fn>
std::string ErrorOf(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Wall-clock bounds here only tell "ends" from "hangs" (what they guard against took minutes or
// forever), so they are generous; sanitizer builds run several times slower and get more slack.
#if GAF_ASAN
constexpr double kSlack = 8.0;
#else
constexpr double kSlack = 2.0;
#endif

// Seconds since t0, divided by the slack: compared with the bound a normal build meets.
double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / kSlack;
}

std::map<std::string, Tensor> OneInput(const std::string& name = "x", float v = 1.5f) {
  return {{name, Tensor::FromVector<float>({v}, {1})}};
}

// ---------------- Loop and Scan ----------------

// y = Loop(M, c, x) with body x + 1; the body's condition is `cond_body` (its nodes first).
Model LoopModel(bool with_trip, int64_t trip, std::vector<Node> cond_nodes, const std::string& cond_out) {
  Graph body;
  body.name = "body";
  body.inputs = {ScalarValue("i", DataType::kInt64), ScalarValue("cond_in", DataType::kBool), FloatValue("x_in", {1})};
  body.nodes = std::move(cond_nodes);
  body.nodes.push_back(MakeNode("Add", {"x_in", "one"}, {"x_out"}));
  body.outputs = {ScalarValue(cond_out, DataType::kBool), FloatValue("x_out", {1})};
  body.initializers.emplace_back("one", Tensor::FromVector<float>({1.f}, {1}));
  body.initializers.emplace_back("big", Tensor::Scalar<int64_t>(int64_t{1} << 62));
  Graph g;
  g.name = "g";
  g.inputs = {FloatValue("x", {1})};
  g.outputs = {FloatValue("y", {1})};
  g.initializers.emplace_back("c", Tensor::Scalar<bool>(true));
  if (with_trip) g.initializers.emplace_back("M", Tensor::Scalar<int64_t>(trip));
  g.nodes.push_back(MakeNode("Loop", {with_trip ? "M" : "", "c", "x"}, {"y"}, "L", {GraphAttr("body", body)}));
  return MakeModel(std::move(g));
}

Model PassThroughLoop(bool with_trip, int64_t trip) {
  return LoopModel(with_trip, trip, {MakeNode("Identity", {"cond_in"}, {"cond_out"})}, "cond_out");
}

TEST(Termination, LoopTripCountPastTheLimitIsAnError) {
  Session s(PassThroughLoop(true, int64_t{1} << 62));
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(ErrorOf([&] { s.Run(OneInput()); }),
            "node 'L' (Loop): trip count 4611686018427387904 is more than the limit of 16777216 iterations "
            "(--max-loop-iterations)");
  EXPECT_LT(SecondsSince(t0), 1.0);
  // The same when the body's condition is a true Constant node.
  Attribute value;
  value.name = "value";
  value.type = Attribute::Type::kTensor;
  value.t = Tensor::Scalar<bool>(true);
  Session constant(LoopModel(true, int64_t{1} << 62, {MakeNode("Constant", {}, {"t"}, "", {value})}, "t"));
  EXPECT_NE(ErrorOf([&] { constant.Run(OneInput()); }).find("is more than the limit"), std::string::npos);
}

TEST(Termination, LoopWithoutTripCountWhoseConditionStaysTrueIsAnError) {
  Session s(PassThroughLoop(false, 0));
  const std::string e = ErrorOf([&] { s.Run(OneInput()); });
  EXPECT_NE(e.find("node 'L' (Loop): has no trip count and its condition stays true"), std::string::npos) << e;
  EXPECT_NE(e.find("--max-loop-iterations"), std::string::npos) << e;
}

TEST(Termination, LoopWithComputedConditionStopsAtTheLimit) {
  LimitsGuard guard;
  GlobalLimits().max_loop_iterations = 1000;
  // cond = i < 2^62: true for every iteration the limit allows.
  Session s(LoopModel(false, 0, {MakeNode("Less", {"i", "big"}, {"cond_out"})}, "cond_out"));
  EXPECT_EQ(ErrorOf([&] { s.Run(OneInput()); }),
            "node 'L' (Loop): still running after 1000 iterations (no trip count, and its condition is still true): "
            "the limit of 1000 iterations (--max-loop-iterations)");
  // Within the limit the same loop runs to its trip count.
  Session ok(LoopModel(true, 1000, {MakeNode("Less", {"i", "big"}, {"cond_out"})}, "cond_out"));
  EXPECT_FLOAT_EQ(ok.Run(OneInput())[0].data<float>()[0], 1001.5f);
}

TEST(Termination, LoopWithinTheLimitRuns) {
  Session s(PassThroughLoop(true, 5));
  EXPECT_FLOAT_EQ(s.Run(OneInput())[0].data<float>()[0], 6.5f);
}

TEST(Termination, AnalyzeAndFuseOfAnEndlessLoopEnd) {
  auto t0 = std::chrono::steady_clock::now();
  GraphAutoFusion f(PassThroughLoop(true, int64_t{1} << 62));
  f.AnalyzeFusionBenefit();  // recording shapes runs the model: the Loop fails at once, declared shapes stand
  EXPECT_EQ(f.Fuse().graph.nodes.size(), 1u);
  EXPECT_LT(SecondsSince(t0), 5.0);
}

// Scan over `length` rows of [length, 2]: the state sums the rows.
Model ScanModel(int64_t length) {
  Graph body;
  body.name = "scan_body";
  body.inputs = {FloatValue("s_in", {2}), FloatValue("row", {2})};
  body.nodes = {MakeNode("Add", {"s_in", "row"}, {"s_out"})};
  body.outputs = {FloatValue("s_out", {2})};
  Graph g;
  g.name = "g";
  g.inputs = {FloatValue("s", {2})};
  g.outputs = {FloatValue("y", {2})};
  g.initializers.emplace_back("rows", Tensor::FromVector<float>(std::vector<float>(length * 2, 1.f), {length, 2}));
  g.nodes.push_back(MakeNode("Scan", {"s", "rows"}, {"y"}, "S",
                             {GraphAttr("body", body), testing::IntAttr("num_scan_inputs", 1)}));
  return MakeModel(std::move(g));
}

TEST(Termination, ScanPastTheLimitIsAnError) {
  LimitsGuard guard;
  GlobalLimits().max_loop_iterations = 100;
  std::map<std::string, Tensor> feeds{{"s", Tensor::FromVector<float>({0.f, 0.f}, {2})}};
  Session over(ScanModel(101));
  EXPECT_EQ(ErrorOf([&] { over.Run(feeds); }),
            "node 'S' (Scan): 101 iterations (the length of its scan inputs) is more than the limit of 100 "
            "iterations (--max-loop-iterations)");
  Session ok(ScanModel(100));
  EXPECT_FLOAT_EQ(ok.Run(feeds)[0].data<float>()[1], 100.f);
}

// ---------------- function inlining ----------------

// Functions f0..f{depth-1} in domain "local": f{i} calls f{i+1} `calls` times in a row, the last
// is a Relu; `recursive_to` >= 0 makes the last one call f{recursive_to} instead.
Model FunctionChain(int depth, int calls, int recursive_to = -1) {
  Model m = MakeModel(Graph{});
  m.opset_imports.push_back({"local", 1});
  for (int i = 0; i < depth; ++i) {
    Function f;
    f.domain = "local";
    f.name = "f" + std::to_string(i);
    f.inputs = {"a"};
    f.outputs = {"b"};
    f.opset_imports = {{"", 17}};
    const bool last = i == depth - 1;
    if (last && recursive_to < 0) {
      f.nodes = {MakeNode("Relu", {"a"}, {"b"})};
    } else {
      const std::string callee = "f" + std::to_string(last ? recursive_to : i + 1);
      for (int k = 0; k < calls; ++k) {
        Node call = MakeNode(callee, {k == 0 ? "a" : "t" + std::to_string(k - 1)},
                             {k == calls - 1 ? "b" : "t" + std::to_string(k)});
        call.domain = "local";
        f.nodes.push_back(std::move(call));
      }
    }
    m.functions.push_back(std::move(f));
  }
  Node call = MakeNode("f0", {"x"}, {"y"}, "call0");
  call.domain = "local";
  m.graph.name = "g";
  m.graph.nodes = {std::move(call)};
  m.graph.inputs = {FloatValue("x", {1})};
  m.graph.outputs = {FloatValue("y", {1})};
  return m;
}

TEST(Termination, FunctionsThatDoubleEachLevelStopAtMaxNodes) {
  // 41 levels of "call the next twice": 2^40 nodes inlined; measured, never expanded.
  auto t0 = std::chrono::steady_clock::now();
  const std::string e = ErrorOf([] { Session s(FunctionChain(41, 2)); });
  EXPECT_NE(e.find("would make more than 4194304 nodes (--max-nodes)"), std::string::npos) << e;
  EXPECT_NE(e.find("inlining function 'local::f"), std::string::npos) << e;
  EXPECT_LT(SecondsSince(t0), 1.0);
  LimitsGuard guard;
  GlobalLimits().max_nodes = 1000;
  EXPECT_NE(ErrorOf([] { Session s(FunctionChain(12, 2)); }).find("--max-nodes"), std::string::npos);
}

TEST(Termination, FunctionsWithinTheLimitsInlineAndRun) {
  Model m = FunctionChain(10, 2);  // 2^9 Relus in a row
  Model inlined = m;
  InlineFunctions(inlined);
  EXPECT_EQ(inlined.graph.nodes.size(), 512u);
  Session s(m);
  EXPECT_FLOAT_EQ(s.Run(OneInput("x", 2.5f))[0].data<float>()[0], 2.5f);
}

TEST(Termination, RecursiveFunctionsAreAnError) {
  EXPECT_EQ(ErrorOf([] { Session s(FunctionChain(1, 1, 0)); }),
            "node producing 'b' (local.f0) calls function 'local::f0', which calls itself (local::f0 -> local::f0): "
            "recursive functions cannot be inlined");
  const std::string e = ErrorOf([] { Session s(FunctionChain(3, 1, 1)); });  // f0 -> f1 -> f2 -> f1
  EXPECT_NE(e.find("calls function 'local::f1', which calls itself (local::f0 -> local::f1 -> local::f2 -> local::f1)"),
            std::string::npos)
      << e;
}

TEST(Termination, FunctionCallsNestedPastTheLimitAreAnError) {
  const std::string e = ErrorOf([] { Session s(FunctionChain(5000, 1)); });
  EXPECT_NE(e.find("function calls nest deeper than 64 levels (local::f0 -> local::f1 -> local::f2 -> ... ->"),
            std::string::npos)
      << e;
  Session ok(FunctionChain(60, 1));
  EXPECT_FLOAT_EQ(ok.Run(OneInput())[0].data<float>()[0], 1.5f);
}

// ---------------- subgraph nesting ----------------

// `depth` If nodes, each in the then-branch of the one above; the innermost yields x.
Graph NestedIfBranch(int depth) {
  Graph g;
  g.name = "branch" + std::to_string(depth);
  const std::string out = "o" + std::to_string(depth);
  g.outputs = {FloatValue(out, {1})};
  if (depth == 0) {
    g.nodes = {MakeNode("Identity", {"x"}, {out})};
    return g;
  }
  Graph leaf;
  leaf.name = "else" + std::to_string(depth);
  leaf.nodes = {MakeNode("Identity", {"x"}, {out})};
  leaf.outputs = {FloatValue(out, {1})};
  g.nodes = {MakeNode("If", {"c"}, {out}, "if" + std::to_string(depth),
                      {GraphAttr("then_branch", NestedIfBranch(depth - 1)), GraphAttr("else_branch", leaf)})};
  return g;
}

Model NestedIfModel(int depth) {
  Graph g = NestedIfBranch(depth);
  g.name = "g";
  g.inputs = {FloatValue("x", {1})};
  g.initializers.emplace_back("c", Tensor::Scalar<bool>(true));
  return MakeModel(std::move(g));
}

TEST(Termination, SubgraphsNestedPastTheLimitAreAnError) {
  Session ok(NestedIfModel(40));
  EXPECT_FLOAT_EQ(ok.Run(OneInput())[0].data<float>()[0], 1.5f);
  EXPECT_EQ(ErrorOf([] { Session s(NestedIfModel(65)); }),
            "graph 'branch0': subgraphs and function calls nest deeper than 64 levels (the nesting limit)");
  LimitsGuard guard;
  GlobalLimits().max_nesting_depth = 4;
  EXPECT_EQ(ErrorOf([] { Session s(NestedIfModel(5)); }),
            "graph 'branch0': subgraphs and function calls nest deeper than 4 levels (the nesting limit)");
}

// ---------------- rules ----------------

std::string RuleError(const std::string& text) {
  return ErrorOf([&] { ParseRules(text, "my.rules"); });
}

// x -> Relu -> a0; a{k} = Add(a{k-1}, a{k-1}): every Add input is the Add below.
Model AddTower(int k) {
  Graph g;
  g.name = "g";
  g.inputs = {FloatValue("x", {1, 8})};
  g.nodes.push_back(MakeNode("Relu", {"x"}, {"a0"}, "r"));
  for (int i = 1; i <= k; ++i) {
    const std::string in = "a" + std::to_string(i - 1);
    g.nodes.push_back(MakeNode("Add", {in, in}, {"a" + std::to_string(i)}, "add" + std::to_string(i)));
  }
  g.outputs = {FloatValue("a" + std::to_string(k), {1, 8})};
  return MakeModel(std::move(g));
}

// Each Add has two forms and two orders that all fit the tower, and the bottom never matches:
// 4^16 branches without a budget.
std::string BacktrackingRule() {
  std::string text = "rule Bomb\n  n0 = Mul($p, $q)\n";
  for (int k = 1; k <= 16; ++k)
    text += fmt::format("  n{} = Add(n{}, $x) | Add($x, n{})\n", k, k - 1, k - 1);
  return text + "end\n";
}

TEST(Termination, BacktrackingRuleGivesUpAfterItsSteps) {
  LimitsGuard guard;
  GlobalLimits().max_match_steps = 200000;
  const Model m = AddTower(16);
  const GraphIndex index(m.graph);
  const std::vector<FusionRule> rules = ParseRules(BacktrackingRule(), "bomb.rules");
  auto t0 = std::chrono::steady_clock::now();
  std::vector<MatchAttempt> tries = TryRule(m.graph, index, rules[0]);
  EXPECT_LT(SecondsSince(t0), 2.0);
  ASSERT_FALSE(tries.empty());
  EXPECT_TRUE(tries.back().gave_up);
  EXPECT_FALSE(tries.back().match.has_value());
  EXPECT_NE(tries.back().reason.find("rule 'Bomb' gave up at node 'add"), std::string::npos) << tries.back().reason;
  EXPECT_NE(tries.back().reason.find("after 200000 matching steps"), std::string::npos) << tries.back().reason;
  for (const MatchAttempt& a : tries) EXPECT_FALSE(a.match.has_value());

  // Through the planner: a skip with its reason in the decision log, never a candidate.
  GraphAutoFusion f(m, FusionOptions{.preset = "none", .auto_fuse = false});
  f.AddFusionRule(rules[0]);
  EXPECT_TRUE(f.AnalyzeFusionBenefit().empty());
  bool logged = false;
  for (const DecisionRecord& r : f.decision_log().records())
    logged |= r.rule == "Bomb" && r.decision == "Skip: gave up" && r.reason.find("gave up") != std::string::npos;
  EXPECT_TRUE(logged);
}

TEST(Termination, MatchingManyInputsNeedsNoDeepRecursion) {
  // One node with 20000 inputs: 20000 goals solved in a loop, not 20000 stack frames.
  Graph g;
  g.name = "g";
  g.inputs = {FloatValue("x", {4})};
  std::vector<std::string> ins(20000, "r");
  std::string args = "$a";
  for (int i = 1; i < 20000; ++i) args += ", $a";
  g.nodes = {MakeNode("Relu", {"x"}, {"r"}), MakeNode("Sum", ins, {"y"}, "sum")};
  g.outputs = {FloatValue("y", {4})};
  const std::vector<FusionRule> rules = ParseRules("rule Wide\n  y = Sum(" + args + ")\nend\n", "wide.rules");
  const GraphIndex index(g);
  std::optional<PatternMatch> m = MatchAt(g, index, rules[0].pattern, 1);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->inputs.at("$a"), "r");
}

TEST(Termination, HugeRuleIsRefusedNamingItsLine) {
  std::string text = "// a rule of 100000 nodes\nrule Huge\n  n0 = Relu($x)\n";
  for (int i = 1; i < 100000; ++i) text += fmt::format("  n{} = Relu(n{})\n", i, i - 1);
  text += "end\n";
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(RuleError(text), "my.rules:2: rule 'Huge' has more than 256 nodes (line 259 is node 257), more than a "
                             "rule may have");
  EXPECT_LT(SecondsSince(t0), 1.0);
  std::string chain = "pair Relu";
  for (int i = 0; i < 300; ++i) chain += "+Relu";
  EXPECT_NE(RuleError(chain + "\n").find("my.rules:1: chain 'Relu+Relu"), std::string::npos);
  EXPECT_NE(RuleError(chain + "\n").find("has more than 256 ops"), std::string::npos);
}

TEST(Termination, LongRulesParseAndCheckCyclesWithoutRecursion) {
  std::string text = "rule Long\n  n0 = Relu($x)\n";
  for (int i = 1; i < 256; ++i) text += fmt::format("  n{} = Relu(n{})\n", i, i - 1);
  EXPECT_EQ(ParseRules(text + "end\n", "my.rules")[0].pattern.nodes.size(), 256u);
  // A cycle through every node but the root.
  std::string cyclic = "rule Cycle\n  n0 = Relu(n254)\n";
  for (int i = 1; i < 256; ++i) cyclic += fmt::format("  n{} = Relu(n{})\n", i, i - 1);
  EXPECT_NE(RuleError(cyclic + "end\n").find("rule 'Cycle': node 'n"), std::string::npos);
  EXPECT_NE(RuleError(cyclic + "end\n").find("is part of a cycle"), std::string::npos);
}

TEST(Termination, BadThresholdsAndPrioritiesAreRefused) {
  for (const char* bad : {"nan", "inf", "-inf", "-0.5", "1.5", "1e999"})
    EXPECT_EQ(RuleError(fmt::format("rule A threshold={}\n  x = Relu($a)\nend\n", bad)),
              fmt::format("my.rules:1: bad number '{}' for threshold (a relative saving from 0 to 1, e.g. 0.05)", bad));
  EXPECT_EQ(RuleError("\npair Conv+Relu threshold=nan\n"),
            "my.rules:2: bad number 'nan' for threshold (a relative saving from 0 to 1, e.g. 0.05)");
  EXPECT_EQ(RuleError("rule A priority=1e300\n  x = Relu($a)\nend\n"), "my.rules:1: priority 1e300 is out of range (-1e9 to 1e9)");
  EXPECT_EQ(RuleError("rule A priority=nan\n  x = Relu($a)\nend\n"), "my.rules:1: bad number 'nan' for priority (an integer)");
  EXPECT_EQ(ParseRules("rule A threshold=0.05 priority=-3\n  x = Relu($a)\nend\n", "my.rules")[0].benefit_threshold, 0.05);
}

// ---------------- long chains ----------------

Model Chain(const std::string& op, int n) {
  Graph g;
  g.name = "g";
  g.inputs = {FloatValue("v0", {1, 64})};
  for (int i = 0; i < n; ++i)
    g.nodes.push_back(MakeNode(op, {"v" + std::to_string(i)}, {"v" + std::to_string(i + 1)}, "n" + std::to_string(i)));
  g.outputs = {FloatValue("v" + std::to_string(n), {1, 64})};
  return MakeModel(std::move(g));
}

TEST(Termination, IdentityChainCanonicalizesInLinearTime) {
  Model m = Chain("Identity", 100000);
  auto t0 = std::chrono::steady_clock::now();
  const std::vector<std::string> log = Canonicalize(m);
  EXPECT_LT(SecondsSince(t0), 3.0);
  ASSERT_EQ(m.graph.nodes.size(), 1u);  // the last one keeps the graph output's name
  EXPECT_EQ(m.graph.nodes[0].inputs[0], "v0");
  EXPECT_EQ(m.graph.nodes[0].outputs[0], "v100000");
  EXPECT_EQ(log.size(), 99999u);
}

TEST(Termination, IdentityChainToAComputedValueKeepsTheOutputName) {
  Model m = Chain("Identity", 1000);
  m.graph.nodes[0].op_type = "Relu";  // v1 = Relu(v0), then 999 Identities to the graph output
  Canonicalize(m);
  ASSERT_EQ(m.graph.nodes.size(), 1u);
  EXPECT_EQ(m.graph.nodes[0].op_type, "Relu");
  EXPECT_EQ(m.graph.nodes[0].outputs[0], "v1000");
}

TEST(Termination, DuplicatesMergeInOneSweep) {
  // 20000 copies of Relu(x) summed: one Relu remains, the Sum reads it 20000 times.
  Graph g;
  g.name = "g";
  g.inputs = {FloatValue("x", {4})};
  std::vector<std::string> copies;
  for (int i = 0; i < 20000; ++i) {
    copies.push_back("r" + std::to_string(i));
    g.nodes.push_back(MakeNode("Relu", {"x"}, {copies.back()}));
  }
  g.nodes.push_back(MakeNode("Sum", copies, {"y"}));
  g.outputs = {FloatValue("y", {4})};
  Model m = MakeModel(std::move(g));
  auto t0 = std::chrono::steady_clock::now();
  Canonicalize(m);
  EXPECT_LT(SecondsSince(t0), 3.0);
  ASSERT_EQ(m.graph.nodes.size(), 2u);
  for (const std::string& in : m.graph.nodes[1].inputs) EXPECT_EQ(in, "r0");
}

TEST(Termination, ConstantThroughALongIdentityChain) {
  Model m = Chain("Identity", 100000);
  m.graph.inputs.clear();
  m.graph.initializers.emplace_back("v0", Tensor::FromVector<float>({2.f}, {1}));
  const GraphIndex index(m.graph);
  std::optional<double> c = ConstantScalar(m.graph, index, "v100000");
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(*c, 2.0);
}

TEST(Termination, ReluChainAnalyzesAndFusesInLinearTime) {
  auto t0 = std::chrono::steady_clock::now();
  GraphAutoFusion f(Chain("Relu", 30000));
  const std::vector<FusionCandidate>& cands = f.AnalyzeFusionBenefit();
  ASSERT_FALSE(cands.empty());
  size_t covered = 0;
  for (const FusionCandidate& c : cands) {
    EXPECT_LE(c.nodes.size(), 256u);
    covered += c.nodes.size();
  }
  EXPECT_EQ(covered, 30000u);
  Model fused = f.Fuse();
  EXPECT_EQ(fused.graph.nodes.size(), cands.size());
  EXPECT_LT(SecondsSince(t0), 10.0);
}

}  // namespace
}  // namespace gaf
