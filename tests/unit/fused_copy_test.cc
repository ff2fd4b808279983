// FusedCopy (ops/fused_copy.cc, made by the session's plan rewrite): trees of Concat, Transpose,
// Slice, Reshape and Flatten give exactly what the operators give, element for element, in one
// pass; what views cannot express, and bad shapes, run the original operators.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <limits>

#include "runtime/session.h"
#include "test_util.h"

namespace gaf {
namespace {

using testing::IntsAttr;
using testing::MakeModel;
using testing::MakeNode;

Tensor Iota(DataType dt, const Shape& shape, int64_t from) {
  Tensor t = Tensor::Uninitialized(dt, shape);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dt == DataType::kFloat) t.data<float>()[i] = static_cast<float>(from + i);
    else if (dt == DataType::kInt64) t.data<int64_t>()[i] = from + i;
    else static_cast<uint8_t*>(t.raw())[i] = static_cast<uint8_t>(from + i);
  }
  return t;
}

void ExpectSameBits(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  ASSERT_EQ(a.shape(), b.shape()) << what;
  EXPECT_EQ(0, std::memcmp(a.raw(), b.raw(), a.nbytes())) << what;
}

ValueInfo Input(const std::string& name, DataType dt, const Shape& shape) {
  ValueInfo v{name, dt, true, {}};
  for (int64_t d : shape) v.dims.push_back(Dim::Known(d));
  return v;
}

// Profiled session options with the plan rewrites on or off.
SessionOptions WithRewrites(bool on) {
  SessionOptions o{.profile = true};
  o.rewrite_products = on;
  return o;
}

// g with the one float output "y", at opset 13.
Model OutputY(Graph g) {
  g.outputs = {ValueInfo{"y", DataType::kFloat}};
  return MakeModel(std::move(g), 13);
}

// A detector head as torch.onnx.export writes it: per level, Concat of the box, objectness and
// class maps (its Shape read too), Reshape to [1, C, H*W] by a shape computed from that Shape,
// then Concat of the levels and Transpose to [1, anchors, C] (the first level past one 128-row tile
// and its class map past the 8x8 blocks).
Model HeadModel(DataType dt) {
  Graph g;
  g.SetInitializer("zero", Tensor::FromInt64s({0}));
  g.SetInitializer("two", Tensor::FromInt64s({2}));
  g.SetInitializer("minus1", Tensor::FromInt64s({-1}));
  std::vector<std::string> levels;
  const std::vector<std::pair<int64_t, int64_t>> sizes = {{16, 12}, {3, 3}, {2, 1}};
  for (size_t l = 0; l < sizes.size(); ++l) {
    const auto [h, w] = sizes[l];
    const std::string p = "l" + std::to_string(l) + "_";
    std::vector<std::string> parts;
    for (auto [name, c] : std::vector<std::pair<const char*, int64_t>>{{"box", 4}, {"obj", 1}, {"cls", 20}}) {
      g.inputs.push_back(Input(p + name, dt, {1, c, h, w}));
      parts.push_back(p + name);
    }
    g.nodes.push_back(MakeNode("Concat", parts, {p + "cat"}, p + "cat", {testing::IntAttr("axis", 1)}));
    g.nodes.push_back(MakeNode("Shape", {p + "cat"}, {p + "shape"}, p + "shape"));
    g.nodes.push_back(MakeNode("Slice", {p + "shape", "zero", "two", "zero"}, {p + "nc"}, p + "nc"));
    g.nodes.push_back(MakeNode("Concat", {p + "nc", "minus1"}, {p + "to"}, p + "to", {testing::IntAttr("axis", 0)}));
    g.nodes.push_back(MakeNode("Reshape", {p + "cat", p + "to"}, {p + "flat"}, p + "flat"));
    levels.push_back(p + "flat");
  }
  g.nodes.push_back(MakeNode("Concat", levels, {"all"}, "all", {testing::IntAttr("axis", 2)}));
  g.nodes.push_back(MakeNode("Transpose", {"all"}, {"y"}, "t", {IntsAttr("perm", {0, 2, 1})}));
  g.outputs = {ValueInfo{"y", dt}};
  return MakeModel(std::move(g), 13);
}

TEST(FusedCopy, DetectorHeadIsOneCopyEqualToTheOperators) {
  for (DataType dt : {DataType::kFloat, DataType::kInt64, DataType::kUint8}) {
    Model m = HeadModel(dt);
    Session fused(m, WithRewrites(true)), plain(m, WithRewrites(false));
    EXPECT_EQ(fused.product_rewrites().copy_groups, 1);
    EXPECT_EQ(fused.product_rewrites().copies, 8);  // 3 + 1 Concats, 3 Reshapes, the Transpose
    std::map<std::string, Tensor> feeds;
    int64_t from = 0;
    for (const ValueInfo& in : m.graph.inputs) {
      Shape s;
      for (const Dim& d : in.dims) s.push_back(d.value);
      feeds[in.name] = Iota(dt, s, from);
      from += 1000;
    }
    const Tensor a = fused.Run(feeds)[0], b = plain.Run(feeds)[0];
    EXPECT_EQ(a.shape(), (Shape{1, 192 + 9 + 2, 25}));
    ExpectSameBits(a, b, DataTypeName(dt));
    EXPECT_EQ(testing::ProfiledCalls(fused, "FusedCopy"), 1);
    EXPECT_EQ(testing::ProfiledCalls(fused, "Transpose"), 0);  // the fast path ran, not the fallback
    EXPECT_EQ(testing::ProfiledCalls(fused, "Reshape"), 0);
  }
}

TEST(FusedCopy, StridedSlicesIntoAConcat) {
  // The Focus stem written as Slice of Slice (steps 2, ends past the extent), then every other
  // column backwards and a Transpose (pieces no fast path covers: the general copy).
  Graph g;
  g.inputs = {Input("x", DataType::kFloat, {1, 3, 10, 8})};
  const int64_t big = std::numeric_limits<int64_t>::max();
  for (auto [n, v] : std::vector<std::pair<const char*, int64_t>>{{"s0", 0}, {"s1", 1}, {"end", big}, {"a2", 2}, {"a3", 3}, {"two", 2}})
    g.SetInitializer(n, Tensor::FromInt64s({v}));
  g.SetInitializer("rs", Tensor::FromInt64s({-1}));
  g.SetInitializer("re", Tensor::FromInt64s({std::numeric_limits<int64_t>::min()}));
  g.SetInitializer("rstep", Tensor::FromInt64s({-2}));
  // Each column Slice reads a row Slice of its own (an inner value read twice would end a tree).
  std::vector<std::string> parts;
  for (const char* r : {"s0", "s1"})
    for (const char* c : {"s0", "s1"}) {
      const std::string rows = std::string("rows_") + r + "_" + c, o = rows + "_cols";
      g.nodes.push_back(MakeNode("Slice", {"x", r, "end", "a2", "two"}, {rows}, rows));
      g.nodes.push_back(MakeNode("Slice", {rows, c, "end", "a3", "two"}, {o}, o));
      parts.push_back(o);
    }
  g.nodes.push_back(MakeNode("Concat", parts, {"cat"}, "cat", {testing::IntAttr("axis", 1)}));
  g.nodes.push_back(MakeNode("Slice", {"cat", "rs", "re", "a3", "rstep"}, {"rev"}, "rev"));  // columns reversed, every other
  g.nodes.push_back(MakeNode("Transpose", {"rev"}, {"y"}, "t", {IntsAttr("perm", {0, 1, 3, 2})}));
  const Model m = OutputY(std::move(g));
  Session fused(m, WithRewrites(true)), plain(m, WithRewrites(false));
  EXPECT_EQ(fused.product_rewrites().copy_groups, 1);
  const std::map<std::string, Tensor> feeds = {{"x", Iota(DataType::kFloat, {1, 3, 10, 8}, 0)}};
  const Tensor a = fused.Run(feeds)[0], b = plain.Run(feeds)[0];
  ExpectSameBits(a, b, "focus");
  EXPECT_EQ(testing::ProfiledCalls(fused, "Slice"), 0);
}

TEST(FusedCopy, WhatViewsCannotExpressRunsTheOperators) {
  // Reshape of a Concat into rows that cut through both parts: the fallback gives the result.
  Graph g;
  g.inputs = {testing::FloatValue("a", {1, 2, -1}), testing::FloatValue("b", {1, 2, -1})};
  g.SetInitializer("to", Tensor::FromInt64s({3, 4}));
  g.SetInitializer("s", Tensor::FromInt64s({1}));
  g.SetInitializer("e", Tensor::FromInt64s({4}));
  g.nodes.push_back(MakeNode("Concat", {"a", "b"}, {"c"}, "c", {testing::IntAttr("axis", 1)}));
  g.nodes.push_back(MakeNode("Reshape", {"c", "to"}, {"r"}, "r"));
  g.nodes.push_back(MakeNode("Transpose", {"r"}, {"t"}, "t", {IntsAttr("perm", {1, 0})}));
  g.nodes.push_back(MakeNode("Slice", {"t", "s", "e"}, {"y"}, "rows"));
  const Model m = OutputY(std::move(g));
  Session fused(m, WithRewrites(true)), plain(m, WithRewrites(false));
  EXPECT_EQ(fused.product_rewrites().copy_groups, 1);
  std::map<std::string, Tensor> feeds = {{"a", Iota(DataType::kFloat, {1, 2, 3}, 0)},
                                         {"b", Iota(DataType::kFloat, {1, 2, 3}, 100)}};
  ExpectSameBits(fused.Run(feeds)[0], plain.Run(feeds)[0], "reshape across parts");
  EXPECT_EQ(testing::ProfiledCalls(fused, "Transpose"), 1);  // the fallback's operators ran
  // Shapes Concat rejects: its own error, naming the node.
  feeds["b"] = Iota(DataType::kFloat, {1, 2, 4}, 0);
  try {
    fused.Run(feeds);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'c' (Concat)"), std::string::npos) << e.what();
  }
}

TEST(FusedCopy, HostileStepsAndShapesGiveTheOperatorsResults) {
  // Steps of INT64_MAX and INT64_MIN (one index taken), and a Reshape target whose product
  // passes 64 bits: the same result, or an error, as the operators, never a wild copy.
  for (int64_t step : {std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()}) {
    for (bool overflow : {false, true}) {
      Graph g;
      g.inputs = {Input("a", DataType::kFloat, {2, 3, 4}), Input("b", DataType::kFloat, {2, 3, 4})};
      const int64_t big = std::numeric_limits<int64_t>::max();
      g.SetInitializer("st", Tensor::FromInt64s({step > 0 ? 1 : -2}));
      g.SetInitializer("en", Tensor::FromInt64s({step > 0 ? big : -big}));
      g.SetInitializer("ax", Tensor::FromInt64s({2}));
      g.SetInitializer("step", Tensor::FromInt64s({step}));
      g.SetInitializer("to", Tensor::FromInt64s(overflow ? std::vector<int64_t>{int64_t{1} << 32, int64_t{1} << 32, 3}
                                                         : std::vector<int64_t>{4, 3}));
      g.nodes.push_back(MakeNode("Concat", {"a", "b"}, {"c"}, "c", {testing::IntAttr("axis", 0)}));
      g.nodes.push_back(MakeNode("Slice", {"c", "st", "en", "ax", "step"}, {"s"}, "s"));
      g.nodes.push_back(MakeNode("Transpose", {"s"}, {"t"}, "t", {IntsAttr("perm", {1, 0, 2})}));
      g.nodes.push_back(MakeNode("Reshape", {"t", "to"}, {"y"}, "r"));
      const Model m = OutputY(std::move(g));
      Session fused(m, WithRewrites(true)), plain(m, WithRewrites(false));
      EXPECT_EQ(fused.product_rewrites().copy_groups, 1);
      const std::map<std::string, Tensor> feeds = {{"a", Iota(DataType::kFloat, {2, 3, 4}, 0)},
                                                   {"b", Iota(DataType::kFloat, {2, 3, 4}, 100)}};
      if (!overflow) {
        ExpectSameBits(fused.Run(feeds)[0], plain.Run(feeds)[0], fmt::format("step {}", step));
      } else {
        EXPECT_THROW(plain.Run(feeds), Error);
        EXPECT_THROW(fused.Run(feeds), Error);
      }
    }
  }
}

TEST(FusedCopy, TwoOperatorsStayAsTheyAre) {
  // A decoder's rotary half swap, Concat(Neg(Slice(x)), Slice(x)): one copy to save at most.
  Graph g;
  g.inputs = {testing::FloatValue("x", {1, 2, 1, 8})};
  g.SetInitializer("h", Tensor::FromInt64s({4}));
  g.SetInitializer("z", Tensor::FromInt64s({0}));
  g.SetInitializer("e", Tensor::FromInt64s({8}));
  g.SetInitializer("ax", Tensor::FromInt64s({3}));
  g.nodes.push_back(MakeNode("Slice", {"x", "h", "e", "ax"}, {"hi"}, "hi"));
  g.nodes.push_back(MakeNode("Neg", {"hi"}, {"nhi"}, "neg"));
  g.nodes.push_back(MakeNode("Slice", {"x", "z", "h", "ax"}, {"lo"}, "lo"));
  g.nodes.push_back(MakeNode("Concat", {"nhi", "lo"}, {"y"}, "cat", {testing::IntAttr("axis", 3)}));
  Session s(OutputY(std::move(g)));
  EXPECT_EQ(s.product_rewrites().copy_groups, 0);
}

}  // namespace
}  // namespace gaf
