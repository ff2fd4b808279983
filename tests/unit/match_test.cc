// The pattern matcher (src/match/matcher.cc) and canonicalization (src/match/canonicalize.cc).
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "fusion/rules.h"
#include "match/pattern.h"
#include "runtime/session.h"
#include "test_util.h"

namespace gaf {
namespace {

using testing::FloatValue;
using testing::IntAttr;
using testing::MakeModel;
using testing::MakeNode;
using testing::TensorAttr;

using testing::IntsAttr;

const FusionRule& Rule(const std::string& name) {
  static const std::vector<FusionRule> rules = BuiltinRules();
  for (const FusionRule& r : rules)
    if (r.name == name) return r;
  throw Error("test: no built-in rule " + name);
}

int FindNode(const Graph& g, const std::string& output) {
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (const std::string& o : g.nodes[i].outputs)
      if (o == output) return static_cast<int>(i);
  return -1;
}

// x * (1 / sqrt(mean(x^2) + eps)) * w, written the way the Llama exporter writes it.
// `commuted` swaps every commutative operand pair.
Graph RmsNormGraph(bool commuted) {
  Graph g;
  g.inputs.push_back(FloatValue("x", {2, 8}));
  g.outputs.push_back(FloatValue("y", {2, 8}));
  g.SetInitializer("two", Tensor::Scalar<float>(2.f));
  g.SetInitializer("eps", Tensor::Scalar<float>(1e-6f));
  g.SetInitializer("one", Tensor::Scalar<float>(1.f));
  g.SetInitializer("w", Tensor::FromVector<float>(std::vector<float>(8, 1.5f), {8}));
  auto pair = [&](std::string a, std::string b) {
    return commuted ? std::vector<std::string>{b, a} : std::vector<std::string>{a, b};
  };
  g.nodes.push_back(MakeNode("Pow", {"x", "two"}, {"sq"}, "pow"));
  g.nodes.push_back(MakeNode("ReduceMean", {"sq"}, {"var"}, "mean", {IntsAttr("axes", {-1}), IntAttr("keepdims", 1)}));
  g.nodes.push_back(MakeNode("Add", pair("var", "eps"), {"ve"}, "add"));
  g.nodes.push_back(MakeNode("Sqrt", {"ve"}, {"std"}, "sqrt"));
  g.nodes.push_back(MakeNode("Div", {"one", "std"}, {"inv"}, "div"));
  g.nodes.push_back(MakeNode("Mul", pair("x", "inv"), {"n"}, "mul"));
  g.nodes.push_back(MakeNode("Mul", pair("w", "n"), {"y"}, "scale"));
  return g;
}

TEST(Match, RmsNormPositive) {
  Graph g = RmsNormGraph(false);
  GraphIndex index(g);
  std::string why;
  auto m = MatchAt(g, index, Rule("RMSNormFusion").pattern, 6, &why);
  ASSERT_TRUE(m.has_value()) << why;
  EXPECT_EQ(m->nodes, (std::vector<int>{0, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(m->inputs.at("$x"), "x");
  EXPECT_EQ(m->inputs.at("$weight"), "w");
  EXPECT_NEAR(m->constants.at("#eps"), 1e-6, 1e-12);
  EXPECT_EQ(m->external_outputs, (std::vector<std::string>{"y"}));
  EXPECT_EQ(m->external_inputs, (std::vector<std::string>{"x", "two", "eps", "one", "w"}));
  EXPECT_EQ(m->node_of.at("inv"), 4);
}

TEST(Match, RmsNormCommutedInputs) {
  Graph g = RmsNormGraph(true);
  GraphIndex index(g);
  std::string why;
  auto m = MatchAt(g, index, Rule("RMSNormFusion").pattern, 6, &why);
  ASSERT_TRUE(m.has_value()) << why;
  EXPECT_EQ(m->nodes.size(), 7u);
  EXPECT_EQ(m->inputs.at("$weight"), "w");
}

TEST(Match, RmsNormReciprocalVariant) {
  // 1/sqrt as Reciprocal, and the square as Mul(x, x).
  Graph g = RmsNormGraph(false);
  g.nodes[0] = MakeNode("Mul", {"x", "x"}, {"sq"}, "sq");
  g.nodes[4] = MakeNode("Reciprocal", {"std"}, {"inv"}, "recip");
  GraphIndex index(g);
  std::string why;
  auto m = MatchAt(g, index, Rule("RMSNormFusion").pattern, 6, &why);
  ASSERT_TRUE(m.has_value()) << why;
  EXPECT_EQ(m->nodes.size(), 7u);
}

TEST(Match, InteriorValueUsedOutsideIsRejectedWithReason) {
  Graph g = RmsNormGraph(false);
  g.nodes.push_back(MakeNode("Relu", {"std"}, {"other"}, "spy"));
  g.outputs.push_back(FloatValue("other", {2, 1}));
  GraphIndex index(g);
  std::string why;
  EXPECT_FALSE(MatchAt(g, index, Rule("RMSNormFusion").pattern, 6, &why).has_value());
  EXPECT_NE(why.find("interior value 'std'"), std::string::npos) << why;
  EXPECT_NE(why.find("spy"), std::string::npos) << why;
  EXPECT_NE(why.find("outside the group"), std::string::npos) << why;
}

TEST(Match, InteriorGraphOutputIsRejected) {
  Graph g = RmsNormGraph(false);
  g.outputs.push_back(FloatValue("ve", {2, 1}));
  GraphIndex index(g);
  std::string why;
  EXPECT_FALSE(MatchAt(g, index, Rule("RMSNormFusion").pattern, 6, &why).has_value());
  EXPECT_NE(why.find("'ve'"), std::string::npos) << why;
  EXPECT_NE(why.find("graph output"), std::string::npos) << why;
}

TEST(Match, WrongConstantIsRejectedWithReason) {
  Graph g = RmsNormGraph(false);
  g.SetInitializer("two", Tensor::Scalar<float>(3.f));
  GraphIndex index(g);
  std::string why;
  EXPECT_FALSE(MatchAt(g, index, Rule("RMSNormFusion").pattern, 6, &why).has_value());
  EXPECT_NE(why.find("the constant 3, the pattern needs 2"), std::string::npos) << why;
}

TEST(Match, InputBindingMustBeConsistent) {
  Graph g = RmsNormGraph(false);
  g.inputs.push_back(FloatValue("x2", {2, 8}));
  g.nodes[5] = MakeNode("Mul", {"x2", "inv"}, {"n"}, "mul");
  GraphIndex index(g);
  std::string why;
  EXPECT_FALSE(MatchAt(g, index, Rule("RMSNormFusion").pattern, 6, &why).has_value());
  EXPECT_NE(why.find("$x is already"), std::string::npos) << why;
}

TEST(Match, AxesFromConstantInputAndConstantNodes) {
  // Opset-18 ReduceMean (axes as an input), epsilon from a Constant node, 2 through a Cast.
  Graph g = RmsNormGraph(false);
  g.RemoveInitializer("eps");
  g.RemoveInitializer("two");
  g.SetInitializer("axes", Tensor::FromInt64s({-1}));
  g.SetInitializer("two_d", Tensor::Scalar<double>(2.0));
  std::vector<Node> pre = {
      MakeNode("Constant", {}, {"eps"}, "eps_const", {TensorAttr("value", Tensor::Scalar<float>(1e-5f))}),
      MakeNode("Cast", {"two_d"}, {"two"}, "cast_two", {IntAttr("to", 1)})};
  g.nodes.insert(g.nodes.begin(), pre.begin(), pre.end());
  g.nodes[3] = MakeNode("ReduceMean", {"sq", "axes"}, {"var"}, "mean");
  g.value_info.push_back(FloatValue("sq", {2, 8}));
  GraphIndex index(g);
  std::string why;
  auto m = MatchAt(g, index, Rule("RMSNormFusion").pattern, 8, &why);
  ASSERT_TRUE(m.has_value()) << why;
  EXPECT_NEAR(m->constants.at("#eps"), 1e-5, 1e-10);
  // Axes that are not the last one are rejected with the actual value.
  g.SetInitializer("axes", Tensor::FromInt64s({0}));
  GraphIndex index2(g);
  EXPECT_FALSE(MatchAt(g, index2, Rule("RMSNormFusion").pattern, 8, &why).has_value());
  EXPECT_NE(why.find("attribute 'axes' is [-2]"), std::string::npos) << why;
}

TEST(Match, AttributeDefaultsAndAxisNormalization) {
  Pattern p;
  p.nodes.push_back(PatternNode{"s", {"Softmax"}, {"$x"}, {{"axis", "-1"}}});
  Graph g;
  g.inputs.push_back(FloatValue("x", {2, 3, 4}));
  g.nodes.push_back(MakeNode("Softmax", {"x"}, {"y0"}, "default_axis"));
  g.nodes.push_back(MakeNode("Softmax", {"x"}, {"y1"}, "axis2", {IntAttr("axis", 2)}));
  g.nodes.push_back(MakeNode("Softmax", {"x"}, {"y2"}, "axis1", {IntAttr("axis", 1)}));
  GraphIndex index(g);
  std::string why;
  EXPECT_TRUE(MatchAt(g, index, p, 0, &why).has_value()) << why;  // ONNX default axis = -1
  EXPECT_TRUE(MatchAt(g, index, p, 1, &why).has_value()) << why;  // 2 == -1 for rank 3
  EXPECT_FALSE(MatchAt(g, index, p, 2, &why).has_value());
  EXPECT_NE(why.find("attribute 'axis' is -2, the pattern needs -1"), std::string::npos) << why;
}

TEST(Match, AttributeCaptureMustAgree) {
  Pattern p;
  p.nodes.push_back(PatternNode{"a", {"ReduceMean"}, {"$x"}, {{"axes", "@ax"}}});
  p.nodes.push_back(PatternNode{"b", {"ReduceMean"}, {"a"}, {{"axes", "@ax"}}});
  Graph g;
  g.inputs.push_back(FloatValue("x", {2, 3, 4}));
  g.nodes.push_back(MakeNode("ReduceMean", {"x"}, {"m1"}, "r1", {IntsAttr("axes", {-1})}));
  g.value_info.push_back(FloatValue("m1", {2, 3, 1}));  // rank known: axes 2 and -1 are the same
  g.nodes.push_back(MakeNode("ReduceMean", {"m1"}, {"m2"}, "r2", {IntsAttr("axes", {2})}));
  g.nodes.push_back(MakeNode("ReduceMean", {"x"}, {"m1b"}, "r1b", {IntsAttr("axes", {-1})}));
  g.value_info.push_back(FloatValue("m1b", {2, 3, 1}));
  g.nodes.push_back(MakeNode("ReduceMean", {"m1b"}, {"m3"}, "r3", {IntsAttr("axes", {1})}));
  GraphIndex index(g);
  std::string why;
  auto m = MatchAt(g, index, p, 1, &why);
  ASSERT_TRUE(m.has_value()) << why;
  EXPECT_EQ(m->attrs.at("@ax"), "[-1]");
  EXPECT_FALSE(MatchAt(g, index, p, 3, &why).has_value());
  EXPECT_NE(why.find("attribute 'axes' is [-1] but @ax was [-2] elsewhere in the match"), std::string::npos) << why;
}

TEST(Match, ExportedNodeMayBeUsedOutside) {
  // Add + RMSNorm where the residual sum feeds the next residual Add.
  Graph g = RmsNormGraph(false);
  g.inputs.push_back(FloatValue("a", {2, 8}));
  g.inputs.push_back(FloatValue("b", {2, 8}));
  g.nodes.insert(g.nodes.begin(), MakeNode("Add", {"a", "b"}, {"x"}, "residual"));
  g.inputs.erase(g.inputs.begin());
  g.nodes.push_back(MakeNode("Add", {"x", "y"}, {"next"}, "next_residual"));
  g.outputs = {FloatValue("next", {2, 8})};
  GraphIndex index(g);
  std::string why;
  auto m = MatchAt(g, index, Rule("AddRMSNormFusion").pattern, 7, &why);
  ASSERT_TRUE(m.has_value()) << why;
  EXPECT_EQ(m->nodes.size(), 8u);
  EXPECT_EQ(m->external_outputs, (std::vector<std::string>{"x", "y"}));
  // The plain RMSNorm rule at the same root takes $x = the sum, computed outside: fine too.
  EXPECT_TRUE(MatchAt(g, index, Rule("RMSNormFusion").pattern, 7, &why).has_value()) << why;
}

TEST(Match, ChainPatternAnySlot) {
  Pattern p = ChainPattern("LayerNorm+Add");
  ASSERT_EQ(p.nodes.size(), 2u);
  EXPECT_EQ(p.nodes[0].ops, (std::vector<std::string>{"LayerNormalization"}));
  Graph g;
  g.inputs = {FloatValue("x", {2, 4}), FloatValue("s", {4}), FloatValue("r", {2, 4})};
  g.nodes.push_back(MakeNode("LayerNormalization", {"x", "s"}, {"ln"}, "ln"));
  g.nodes.push_back(MakeNode("Add", {"r", "ln"}, {"y"}, "add"));  // LN output in slot 1
  g.nodes.push_back(MakeNode("Relu", {"y"}, {"z"}, "relu"));
  GraphIndex index(g);
  std::string why;
  auto m = MatchAt(g, index, p, 1, &why);
  ASSERT_TRUE(m.has_value()) << why;
  EXPECT_EQ(m->nodes, (std::vector<int>{0, 1}));
  EXPECT_EQ(m->external_inputs, (std::vector<std::string>{"x", "s", "r"}));
  Pattern alt = ChainPattern("Add+Relu|Clip");
  EXPECT_EQ(alt.nodes[1].ops, (std::vector<std::string>{"Relu", "Clip"}));
  EXPECT_TRUE(MatchAt(g, index, alt, 2, &why).has_value()) << why;
  EXPECT_FALSE(MatchAt(g, index, ChainPattern("Mul+Relu"), 2, &why).has_value());
  EXPECT_NE(why.find("is not Mul"), std::string::npos) << why;
  EXPECT_THROW(ChainPattern("Conv++Relu"), Error);
}

TEST(Match, NodeAlternativesBacktrack) {
  // GELU written x * (1 + erf(x / sqrt2)) * 0.5 (the third root form) and with Mul by 1/sqrt2.
  Graph g;
  g.inputs = {FloatValue("x", {4})};
  g.outputs = {FloatValue("y", {4})};
  g.SetInitializer("inv_sqrt2", Tensor::Scalar<float>(0.70710678f));
  g.SetInitializer("one", Tensor::Scalar<float>(1.f));
  g.SetInitializer("half", Tensor::Scalar<float>(0.5f));
  g.nodes.push_back(MakeNode("Mul", {"inv_sqrt2", "x"}, {"d"}, "scale"));
  g.nodes.push_back(MakeNode("Erf", {"d"}, {"e"}, "erf"));
  g.nodes.push_back(MakeNode("Add", {"one", "e"}, {"a"}, "add"));
  g.nodes.push_back(MakeNode("Mul", {"a", "x"}, {"m"}, "mul"));
  g.nodes.push_back(MakeNode("Mul", {"half", "m"}, {"y"}, "half"));
  GraphIndex index(g);
  std::string why;
  auto m = MatchAt(g, index, Rule("GeluFusion(erf)").pattern, 4, &why);
  ASSERT_TRUE(m.has_value()) << why;
  EXPECT_EQ(m->nodes.size(), 5u);
  // The Erf divisor must be sqrt(2).
  g.SetInitializer("inv_sqrt2", Tensor::Scalar<float>(0.5f));
  GraphIndex index2(g);
  EXPECT_FALSE(MatchAt(g, index2, Rule("GeluFusion(erf)").pattern, 4, &why).has_value());
  EXPECT_NE(why.find("the constant 0.5, the pattern needs 0.70710678"), std::string::npos) << why;
}

TEST(Match, PatternInputInsideGroupIsRejected) {
  // SiLU x * sigmoid(x) must not bind $x to the Sigmoid's own output.
  Graph g;
  g.inputs = {FloatValue("x", {4})};
  g.nodes.push_back(MakeNode("Sigmoid", {"x"}, {"s"}, "sig"));
  g.nodes.push_back(MakeNode("Mul", {"s", "s"}, {"y"}, "sq"));
  GraphIndex index(g);
  std::string why;
  EXPECT_FALSE(MatchAt(g, index, Rule("SiLUFusion").pattern, 1, &why).has_value());
}

TEST(Match, ConstantScalarSources) {
  Graph g;
  g.SetInitializer("c1", Tensor::Scalar<float>(0.5f));
  g.SetInitializer("vec", Tensor::FromVector<float>({1.f, 2.f}, {2}));
  g.SetInitializer("i64", Tensor::Scalar<int64_t>(3));
  g.nodes.push_back(MakeNode("Constant", {}, {"c2"}, "k", {TensorAttr("value", Tensor::Scalar<float>(2.5f))}));
  g.nodes.push_back(MakeNode("Cast", {"i64"}, {"c3"}, "cast", {IntAttr("to", 1)}));
  g.nodes.push_back(MakeNode("Relu", {"c1"}, {"not_const"}, "relu"));
  GraphIndex index(g);
  EXPECT_EQ(ConstantScalar(g, index, "c1"), 0.5);
  EXPECT_EQ(ConstantScalar(g, index, "c2"), 2.5);
  EXPECT_EQ(ConstantScalar(g, index, "c3"), 3.0);
  EXPECT_FALSE(ConstantScalar(g, index, "vec").has_value());
  EXPECT_FALSE(ConstantScalar(g, index, "not_const").has_value());
  EXPECT_FALSE(ConstantScalar(g, index, "missing").has_value());
}

// ---------------- canonicalization ----------------

std::vector<float> RunOne(const Model& m, const std::map<std::string, Tensor>& feeds) {
  Session s(m);
  Tensor t = s.Run(feeds)[0];
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

bool LogMentions(const std::vector<std::string>& log, const std::string& what) {
  return std::any_of(log.begin(), log.end(), [&](const std::string& l) { return l.find(what) != std::string::npos; });
}

TEST(Canonicalize, RemovesIdentityDropoutNoOpCastAndKeepsOutputNames) {
  Graph g;
  g.inputs = {FloatValue("x", {2, 3})};
  g.outputs = {FloatValue("y", {2, 3})};
  g.nodes.push_back(MakeNode("Relu", {"x"}, {"r"}, "relu"));
  g.nodes.push_back(MakeNode("Identity", {"r"}, {"i"}, "ident"));
  g.nodes.push_back(MakeNode("Dropout", {"i"}, {"d"}, "drop"));
  g.nodes.push_back(MakeNode("Cast", {"d"}, {"c"}, "cast_same", {IntAttr("to", 1)}));
  g.nodes.push_back(MakeNode("Cast", {"c"}, {"c16"}, "cast_half", {IntAttr("to", 10)}));
  g.nodes.push_back(MakeNode("Cast", {"c16"}, {"c32"}, "cast_back", {IntAttr("to", 1)}));
  g.nodes.push_back(MakeNode("Identity", {"c32"}, {"y"}, "ident_out"));
  Model m = MakeModel(g);
  Model before = m;
  std::vector<std::string> log = Canonicalize(m);
  EXPECT_TRUE(LogMentions(log, "removed node 'ident' (Identity), an Identity; readers of 'i' now read 'r'")) << fmt::format("{}", fmt::join(log, "\n"));
  EXPECT_TRUE(LogMentions(log, "removed node 'drop' (Dropout), an inference Dropout"));
  EXPECT_TRUE(LogMentions(log, "removed node 'cast_same' (Cast), a Cast to float, which the value already is"));
  EXPECT_TRUE(LogMentions(log, "removed node 'ident_out' (Identity), an Identity; 'c32' is now computed under the graph output's name 'y'"));
  std::vector<std::string> ops;
  for (const Node& n : m.graph.nodes) ops.push_back(n.op_type);
  EXPECT_EQ(ops, (std::vector<std::string>{"Relu", "Cast", "Cast"}));  // the float16 round trip stays
  EXPECT_EQ(m.graph.outputs[0].name, "y");
  EXPECT_EQ(m.graph.nodes.back().outputs[0], "y");
  EXPECT_TRUE(VerifyModel(m).empty());
  Tensor x = Tensor::FromVector<float>({-1, 2, -3, 4, 5, -6}, {2, 3});
  EXPECT_EQ(RunOne(m, {{"x", x}}), RunOne(before, {{"x", x}}));
}

TEST(Canonicalize, PadByZeroGoesOtherPadsStay) {
  Graph g;
  g.inputs = {FloatValue("x", {1, 2, 3, 3})};
  g.outputs = {FloatValue("y", {1, 2, 5, 5})};
  g.initializers.emplace_back("zeros", Tensor::FromInt64s({0, 0, 0, 0, 0, 0, 0, 0}));
  g.initializers.emplace_back("ones", Tensor::FromInt64s({0, 0, 1, 1, 0, 0, 1, 1}));
  g.nodes.push_back(MakeNode("Relu", {"x"}, {"r"}, "relu"));
  g.nodes.push_back(MakeNode("Pad", {"r", "zeros"}, {"p0"}, "pad_zero"));
  g.nodes.push_back(MakeNode("Pad", {"p0", "ones"}, {"y"}, "pad_one"));
  Model m = MakeModel(g, 13);
  Model before = m;
  std::vector<std::string> log = Canonicalize(m);
  EXPECT_TRUE(LogMentions(log, "removed node 'pad_zero' (Pad), a Pad by zero everywhere")) << fmt::format("{}", fmt::join(log, "\n"));
  std::vector<std::string> ops;
  for (const Node& n : m.graph.nodes) ops.push_back(n.op_type);
  EXPECT_EQ(ops, (std::vector<std::string>{"Relu", "Pad"}));
  Tensor x = Tensor::FromVector<float>(std::vector<float>(18, -0.5f), {1, 2, 3, 3});
  for (int i = 0; i < 18; i += 2) x.data<float>()[i] = static_cast<float>(i);
  EXPECT_EQ(RunOne(m, {{"x", x}}), RunOne(before, {{"x", x}}));
}

// A zero Pad of height and width in front of a Conv becomes the Conv's own pads (Keras'
// ZeroPadding2D before a stride-2 convolution, asymmetric; a Conv with pads of its own, one with
// VALID); a Pad of the channels, by another value, read by two nodes, or reflecting, stays.
TEST(Canonicalize, ZeroPadInFrontOfAConvBecomesItsPads) {
  Graph g;
  g.inputs = {FloatValue("x", {1, 4, 9, 9})};
  g.initializers.emplace_back("hw", Tensor::FromInt64s({0, 0, 0, 1, 0, 0, 1, 0}));  // left 1, bottom 1
  g.initializers.emplace_back("chan", Tensor::FromInt64s({0, 1, 0, 0, 0, 1, 0, 0}));
  g.initializers.emplace_back("one", Tensor::FromVector<float>({1.f}, {}));
  auto weight = [&](const std::string& name, int64_t cin) {
    Tensor w(DataType::kFloat, {4, cin, 3, 3});
    for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = static_cast<float>((i * 7) % 11) / 11.f - 0.4f;
    g.initializers.emplace_back(name, w);
  };
  weight("w", 4);
  weight("w6", 6);
  g.nodes.push_back(MakeNode("Pad", {"x", "hw"}, {"p1"}, "pad_keras"));
  g.nodes.push_back(MakeNode("Conv", {"p1", "w"}, {"c1"}, "conv_s2", {IntsAttr("strides", {2, 2})}));
  g.nodes.push_back(MakeNode("Pad", {"c1", "hw"}, {"p2"}, "pad_before_padded"));
  g.nodes.push_back(MakeNode("Conv", {"p2", "w"}, {"c2"}, "conv_padded", {IntsAttr("pads", {1, 1, 1, 1})}));
  g.nodes.push_back(MakeNode("Pad", {"c2", "hw"}, {"p3"}, "pad_before_valid"));
  g.nodes.push_back(MakeNode("Conv", {"p3", "w"}, {"c3"}, "conv_valid", {testing::StringAttr("auto_pad", "VALID")}));
  // These stay: the channels padded, a value other than zero, a second reader, reflect mode.
  g.nodes.push_back(MakeNode("Pad", {"c3", "chan"}, {"q1"}, "pad_channels"));
  g.nodes.push_back(MakeNode("Conv", {"q1", "w6"}, {"d1"}, "conv_after_channels", {IntsAttr("pads", {1, 1, 1, 1})}));
  g.nodes.push_back(MakeNode("Pad", {"d1", "hw", "one"}, {"q2"}, "pad_ones"));
  g.nodes.push_back(MakeNode("Conv", {"q2", "w"}, {"d2"}, "conv_after_ones"));
  g.nodes.push_back(MakeNode("Pad", {"d2", "hw"}, {"q3"}, "pad_two_readers"));
  g.nodes.push_back(MakeNode("Conv", {"q3", "w"}, {"d3"}, "conv_a"));
  g.nodes.push_back(MakeNode("Relu", {"q3"}, {"d4"}, "relu_b"));
  g.nodes.push_back(MakeNode("Pad", {"d3", "hw"}, {"q4"}, "pad_reflect", {testing::StringAttr("mode", "reflect")}));
  g.nodes.push_back(MakeNode("Conv", {"q4", "w"}, {"y"}, "conv_after_reflect"));
  g.outputs = {FloatValue("y", {}), FloatValue("d4", {})};
  g.outputs[0].has_shape = g.outputs[1].has_shape = false;
  Model m = MakeModel(g, 13);
  Model before = m;
  std::vector<std::string> log = Canonicalize(m);
  const std::string all = fmt::format("{}", fmt::join(log, "\n"));
  EXPECT_TRUE(LogMentions(log, "node 'pad_keras' (Pad) (zeros around height and width) -> pads 0,1,1,0 of node 'conv_s2' (Conv)")) << all;
  EXPECT_TRUE(LogMentions(log, "-> pads 1,2,2,1 of node 'conv_padded' (Conv)")) << all;
  EXPECT_TRUE(LogMentions(log, "-> pads 0,1,1,0 of node 'conv_valid' (Conv)")) << all;
  int pads = 0;
  for (const Node& n : m.graph.nodes) pads += n.op_type == "Pad";
  EXPECT_EQ(pads, 4) << all;
  for (const Node& n : m.graph.nodes)
    if (n.name == "conv_valid") EXPECT_EQ(n.GetString("auto_pad", "NOTSET"), "NOTSET");
  EXPECT_TRUE(VerifyModel(m).empty());
  Tensor x(DataType::kFloat, {1, 4, 9, 9});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>((i * 13) % 17) / 17.f - 0.5f;
  EXPECT_EQ(RunOne(m, {{"x", x}}), RunOne(before, {{"x", x}}));
}

// torch.onnx.export computes nn.ZeroPad2d's pads at run time from constants (ConstantOfShape,
// Concat, Reshape, Slice backwards, Transpose, Reshape, Cast): it all folds, and the Pad then
// folds into the Conv. A ConstantOfShape too large to materialize stays.
TEST(Canonicalize, PadsComputedFromConstantsFoldAndTheConvTakesThem) {
  Graph g;
  g.inputs = {FloatValue("x", {1, 2, 6, 6})};
  g.initializers.emplace_back("given", Tensor::FromInt64s({0, 1, 0, 1}));  // F.pad's (left, right, top, bottom)
  g.initializers.emplace_back("missing", Tensor::FromInt64s({4}));
  g.initializers.emplace_back("pairs", Tensor::FromInt64s({-1, 2}));
  g.initializers.emplace_back("start", Tensor::FromInt64s({-1}));
  g.initializers.emplace_back("stop", Tensor::FromInt64s({-(int64_t{1} << 62)}));
  g.initializers.emplace_back("axis0", Tensor::FromInt64s({0}));
  g.initializers.emplace_back("back", Tensor::FromInt64s({-1}));
  g.initializers.emplace_back("flat", Tensor::FromInt64s({-1}));
  g.initializers.emplace_back("huge", Tensor::FromInt64s({int64_t{1} << 40}));
  Tensor w(DataType::kFloat, {3, 2, 3, 3});
  for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = static_cast<float>(i % 5) - 2.f;
  g.initializers.emplace_back("w", w);
  g.nodes.push_back(MakeNode("ConstantOfShape", {"missing"}, {"zeros"}, "fill",
                             {testing::TensorAttr("value", Tensor::FromInt64s({0}))}));
  g.nodes.push_back(MakeNode("Concat", {"given", "zeros"}, {"cat"}, "cat", {IntAttr("axis", 0)}));
  g.nodes.push_back(MakeNode("Reshape", {"cat", "pairs"}, {"r"}, "pairs"));
  g.nodes.push_back(MakeNode("Slice", {"r", "start", "stop", "axis0", "back"}, {"rev"}, "reverse"));
  g.nodes.push_back(MakeNode("Transpose", {"rev"}, {"t"}, "swap", {IntsAttr("perm", {1, 0})}));
  g.nodes.push_back(MakeNode("Reshape", {"t", "flat"}, {"pads"}, "flatten"));
  g.nodes.push_back(MakeNode("Cast", {"pads"}, {"pads64"}, "cast", {IntAttr("to", 7)}));
  g.nodes.push_back(MakeNode("Pad", {"x", "pads64"}, {"p"}, "zero_pad"));
  g.nodes.push_back(MakeNode("Conv", {"p", "w"}, {"y"}, "conv", {IntsAttr("strides", {2, 2})}));
  g.nodes.push_back(MakeNode("ConstantOfShape", {"huge"}, {"big"}, "huge_fill"));
  g.nodes.push_back(MakeNode("Relu", {"big"}, {"big_relu"}, "big_relu"));
  g.outputs = {FloatValue("y", {}), FloatValue("big_relu", {})};
  g.outputs[0].has_shape = g.outputs[1].has_shape = false;
  Model m = MakeModel(g, 13);
  std::vector<std::string> log = Canonicalize(m);
  const std::string all = fmt::format("{}", fmt::join(log, "\n"));
  EXPECT_TRUE(LogMentions(log, "node 'zero_pad' (Pad) (zeros around height and width) -> pads 0,0,1,1 of node 'conv' (Conv)")) << all;
  std::vector<std::string> ops;
  for (const Node& n : m.graph.nodes) ops.push_back(n.op_type);
  EXPECT_EQ(ops, (std::vector<std::string>{"Conv", "ConstantOfShape", "Relu"})) << all;
}

TEST(Canonicalize, SliceOfASliceOnOtherAxesBecomesOneSlice) {
  // The Focus stem as torch.onnx.export writes it: rows then columns, each by a Slice of its own;
  // negative axes, an end past the extent, and an inner Slice read by two outer ones.
  Graph g;
  g.inputs = {FloatValue("x", {1, 3, 8, 6})};
  g.outputs = {FloatValue("y", {1, 12, 4, 3})};
  const int64_t big = std::numeric_limits<int64_t>::max();
  g.initializers.emplace_back("s0", Tensor::FromInt64s({0}));
  g.initializers.emplace_back("s1", Tensor::FromInt64s({1}));
  g.initializers.emplace_back("end", Tensor::FromInt64s({big}));
  g.initializers.emplace_back("rows", Tensor::FromInt64s({-2}));
  g.initializers.emplace_back("cols", Tensor::FromInt64s({3}));
  g.initializers.emplace_back("two", Tensor::FromInt64s({2}));
  std::vector<std::string> parts;
  for (const char* r : {"s0", "s1"}) {
    const std::string rs = std::string("r_") + r;
    g.nodes.push_back(MakeNode("Slice", {"x", r, "end", "rows", "two"}, {rs}, rs));
    for (const char* c : {"s0", "s1"}) {
      const std::string cs = rs + "_c_" + c;
      g.nodes.push_back(MakeNode("Slice", {rs, c, "end", "cols", "two"}, {cs}, cs));
      parts.push_back(cs);
    }
  }
  g.nodes.push_back(MakeNode("Concat", parts, {"y"}, "cat", {IntAttr("axis", 1)}));
  Model m = MakeModel(g, 13);
  Model before = m;
  std::vector<std::string> log = Canonicalize(m);
  const std::string all = fmt::format("{}", fmt::join(log, "\n"));
  EXPECT_TRUE(LogMentions(log, "node 'r_s1_c_s0' (Slice) of node 'r_s1' (Slice) (other axes) -> one Slice of 'x'")) << all;
  std::vector<std::string> ops;
  for (const Node& n : m.graph.nodes) ops.push_back(n.op_type);
  EXPECT_EQ(ops, (std::vector<std::string>{"Slice", "Slice", "Slice", "Slice", "Concat"})) << all;
  for (const Node& n : m.graph.nodes)
    if (n.op_type == "Slice") EXPECT_EQ(n.inputs[0], "x");
  EXPECT_TRUE(VerifyModel(m).empty());
  Tensor x(DataType::kFloat, {1, 3, 8, 6});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(i);
  EXPECT_EQ(RunOne(m, {{"x", x}}), RunOne(before, {{"x", x}}));
}

TEST(Canonicalize, SlicesOnTheSameAxisOrOfAValueReadElsewhereStay) {
  Graph g;
  g.inputs = {FloatValue("x", {4, 6})};
  g.outputs = {FloatValue("y", {2, 3}), FloatValue("z", {2, 6})};
  g.initializers.emplace_back("s1", Tensor::FromInt64s({1}));
  g.initializers.emplace_back("e", Tensor::FromInt64s({3}));
  g.initializers.emplace_back("e5", Tensor::FromInt64s({5}));
  g.initializers.emplace_back("a0", Tensor::FromInt64s({0}));
  g.initializers.emplace_back("a1", Tensor::FromInt64s({1}));
  g.nodes.push_back(MakeNode("Slice", {"x", "s1", "e5", "a0"}, {"rows"}, "rows"));     // rows 1..4
  g.nodes.push_back(MakeNode("Slice", {"rows", "s1", "e", "a0"}, {"rows2"}, "again"));  // the same axis
  g.nodes.push_back(MakeNode("Slice", {"rows2", "s1", "e5", "a1"}, {"y0"}, "cols"));    // rows2 is read by Relu too
  g.nodes.push_back(MakeNode("Relu", {"rows2"}, {"z"}, "relu"));
  g.nodes.push_back(MakeNode("Neg", {"y0"}, {"y1"}, "neg"));
  g.nodes.push_back(MakeNode("Slice", {"y1", "a0", "e", "a1"}, {"y"}, "after_neg"));
  Model m = MakeModel(g, 13);
  std::vector<std::string> log = Canonicalize(m);
  EXPECT_FALSE(LogMentions(log, "one Slice of")) << fmt::format("{}", fmt::join(log, "\n"));
  EXPECT_EQ(m.graph.nodes.size(), 6u);
}

TEST(Canonicalize, TrainingDropoutAndUsedMaskStay) {
  Graph g;
  g.inputs = {FloatValue("x", {4})};
  g.outputs = {FloatValue("y", {4}), FloatValue("mask", {4})};
  g.nodes.push_back(MakeNode("Dropout", {"x"}, {"y", "mask"}, "drop"));
  Model m = MakeModel(g);
  Canonicalize(m);
  EXPECT_EQ(m.graph.nodes.size(), 1u);
}

TEST(Canonicalize, ConstantNodesFoldingAndShapes) {
  Graph g;
  g.inputs = {FloatValue("x", {2, 3})};
  g.outputs = {FloatValue("y", {3, 2})};
  g.SetInitializer("a", Tensor::Scalar<float>(2.f));
  g.nodes.push_back(MakeNode("Constant", {}, {"b"}, "const_b", {TensorAttr("value", Tensor::Scalar<float>(3.f))}));
  g.nodes.push_back(MakeNode("Mul", {"a", "b"}, {"ab"}, "fold_me"));       // 6
  g.nodes.push_back(MakeNode("Sqrt", {"ab"}, {"sab"}, "fold_me_too"));     // sqrt(6)
  g.nodes.push_back(MakeNode("Mul", {"x", "sab"}, {"xs"}, "keep"));
  g.nodes.push_back(MakeNode("Shape", {"x"}, {"shape"}, "shape"));         // known: [2,3]
  g.SetInitializer("flat", Tensor::FromInt64s({6}));
  g.nodes.push_back(MakeNode("Reshape", {"xs", "flat"}, {"f"}, "flatten"));
  g.nodes.push_back(MakeNode("Reshape", {"f", "shape"}, {"back"}, "unflatten"));  // back to x's shape
  g.value_info.push_back(FloatValue("xs", {2, 3}));
  g.nodes.push_back(MakeNode("Transpose", {"back"}, {"y"}, "t", {IntsAttr("perm", {1, 0})}));
  Model m = MakeModel(g);
  Model before = m;
  std::vector<std::string> log = Canonicalize(m);
  std::string all = fmt::format("{}", fmt::join(log, "\n"));
  EXPECT_TRUE(LogMentions(log, "Constant node 'const_b' (Constant) -> initializer 'b'")) << all;
  EXPECT_TRUE(LogMentions(log, "folded constant node 'fold_me' (Mul)")) << all;
  EXPECT_TRUE(LogMentions(log, "folded constant node 'fold_me_too' (Sqrt)")) << all;
  EXPECT_TRUE(LogMentions(log, "folded constant node 'shape' (Shape)")) << all;
  EXPECT_TRUE(LogMentions(log, "removed node 'unflatten' (Reshape), a Reshape back to the shape of 'xs'")) << all;
  std::vector<std::string> ops;
  for (const Node& n : m.graph.nodes) ops.push_back(n.op_type);
  EXPECT_EQ(ops, (std::vector<std::string>{"Mul", "Transpose"})) << all;
  ASSERT_NE(m.graph.FindInitializer("sab"), nullptr);
  EXPECT_NEAR(m.graph.FindInitializer("sab")->data<float>()[0], std::sqrt(6.f), 1e-6);
  EXPECT_EQ(m.graph.FindInitializer("a"), nullptr);  // no longer read by any node
  EXPECT_TRUE(VerifyModel(m).empty());
  Tensor x = Tensor::FromVector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(RunOne(m, {{"x", x}}), RunOne(before, {{"x", x}}));
}

TEST(Canonicalize, SqueezeUnsqueezePairAndExpandAndCse) {
  Graph g;
  g.inputs = {FloatValue("x", {2, 3})};
  g.outputs = {FloatValue("y", {2, 3})};
  g.SetInitializer("ax", Tensor::FromInt64s({1}));
  g.SetInitializer("same", Tensor::FromInt64s({1, 3}));
  g.nodes.push_back(MakeNode("Unsqueeze", {"x", "ax"}, {"u"}, "unsq"));
  g.nodes.push_back(MakeNode("Squeeze", {"u", "ax"}, {"s"}, "sq"));
  g.nodes.push_back(MakeNode("Expand", {"s", "same"}, {"e"}, "expand"));
  g.nodes.push_back(MakeNode("Neg", {"x"}, {"n1"}, "neg1"));
  g.nodes.push_back(MakeNode("Neg", {"x"}, {"n2"}, "neg2"));
  g.nodes.push_back(MakeNode("Add", {"n1", "n2"}, {"a"}, "add"));
  g.nodes.push_back(MakeNode("Add", {"a", "e"}, {"y"}, "out"));
  Model m = MakeModel(g);
  Model before = m;
  std::vector<std::string> log = Canonicalize(m);
  std::string all = fmt::format("{}", fmt::join(log, "\n"));
  EXPECT_TRUE(LogMentions(log, "removed node 'sq' (Squeeze), a Squeeze undoing node 'unsq' (Unsqueeze)")) << all;
  EXPECT_TRUE(LogMentions(log, "removed node 'expand' (Expand), an Expand to the shape the value already has")) << all;
  EXPECT_TRUE(LogMentions(log, "merged duplicate node 'neg2' (Neg) into node 'neg1' (Neg)")) << all;
  EXPECT_TRUE(LogMentions(log, "removed unused node 'unsq' (Unsqueeze)")) << all;
  EXPECT_EQ(m.graph.nodes.size(), 3u) << all;
  int add = FindNode(m.graph, "a");
  ASSERT_GE(add, 0);
  EXPECT_EQ(m.graph.nodes[add].inputs, (std::vector<std::string>{"n1", "n1"}));
  EXPECT_EQ(m.graph.nodes[FindNode(m.graph, "y")].inputs[1], "x");
  Tensor x = Tensor::FromVector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(RunOne(m, {{"x", x}}), RunOne(before, {{"x", x}}));
}

// masked_fill as exporters write it: Where(Expand(mask, Shape(scores)), fill, scores). Where
// broadcasts the mask against scores itself, so the Expand (and its Shape, which would read a value
// inside an attention group) go; an Expand read by an operator that does not read scores stays.
TEST(Canonicalize, ExpandToTheShapeOfABroadcastingReadersInputGoes) {
  Graph g;
  g.inputs = {FloatValue("scores", {-1, 3, 4})};  // a symbolic batch: Shape(scores) does not fold
  ValueInfo mask;
  mask.name = "mask";
  mask.dtype = DataType::kBool;
  mask.has_shape = true;
  mask.dims = {Dim::Known(1), Dim::Known(1), Dim::Known(4)};
  g.inputs.push_back(mask);
  g.outputs = {FloatValue("y", {2, 3, 4}), FloatValue("kept", {2, 3, 4})};
  g.SetInitializer("fill", Tensor::FromVector<float>({-1e4f}, {}));
  g.nodes.push_back(MakeNode("Shape", {"scores"}, {"shp"}, "shape"));
  g.nodes.push_back(MakeNode("Expand", {"mask", "shp"}, {"em"}, "expand"));
  g.nodes.push_back(MakeNode("Where", {"em", "fill", "scores"}, {"y"}, "where"));
  g.nodes.push_back(MakeNode("Cast", {"mask"}, {"mf"}, "cast", {IntAttr("to", 1)}));
  g.nodes.push_back(MakeNode("Expand", {"mf", "shp"}, {"kept"}, "expand_kept"));  // a graph output: stays
  Model m = MakeModel(g);
  Model before = m;
  std::vector<std::string> log = Canonicalize(m);
  std::string all = fmt::format("{}", fmt::join(log, "\n"));
  EXPECT_TRUE(LogMentions(log, "removed node 'expand' (Expand), an Expand to the shape of 'scores'")) << all;
  EXPECT_GE(FindNode(m.graph, "kept"), 0) << all;
  EXPECT_EQ(m.graph.nodes[FindNode(m.graph, "y")].inputs[0], "mask");
  Tensor s = Tensor::FromVector<float>(std::vector<float>(24, 0.5f), {2, 3, 4});
  Tensor mk(DataType::kBool, {1, 1, 4});
  for (int i = 0; i < 4; ++i) mk.data<bool>()[i] = i % 2 == 0;
  EXPECT_EQ(RunOne(m, {{"scores", s}, {"mask", mk}}), RunOne(before, {{"scores", s}, {"mask", mk}}));
}

TEST(Canonicalize, OverridableInitializerIsNotFolded) {
  Graph g;
  g.inputs = {FloatValue("x", {2}), FloatValue("k", {})};
  g.outputs = {FloatValue("y", {2})};
  g.SetInitializer("k", Tensor::Scalar<float>(2.f));  // also a graph input: a feed may override it
  g.SetInitializer("one", Tensor::Scalar<float>(1.f));
  g.nodes.push_back(MakeNode("Add", {"k", "one"}, {"k1"}, "add"));
  g.nodes.push_back(MakeNode("Mul", {"x", "k1"}, {"y"}, "mul"));
  Model m = MakeModel(g);
  Canonicalize(m);
  EXPECT_EQ(m.graph.nodes.size(), 2u);
}

}  // namespace
}  // namespace gaf
