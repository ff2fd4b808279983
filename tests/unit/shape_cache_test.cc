// The plan's constant folding and shape caching (SessionOptions::fold_shapes): results equal the
// unfolded session's at every shape, folded steps never run, shape steps run again only when a
// value they read changed.
#include <gtest/gtest.h>

#include <set>

#include "runtime/session.h"
#include "test_util.h"

namespace gaf {
namespace {

using testing::MakeModel;
using testing::MakeNode;
using testing::TensorAttr;
using testing::RandomFloat;

// x [N, 4] -> r = Reshape(x, [1, 4N]) (shape arithmetic on Shape(x)), z = Cast(Range(0, N, 1)):
// both depend on N, so a stale cached value would show.
Model ShapeModel() {
  Graph g;
  g.inputs.push_back(testing::FloatValue("x", {-1, 4}));
  g.SetInitializer("zero", Tensor::Scalar<int64_t>(0));
  g.SetInitializer("step", Tensor::Scalar<int64_t>(1));
  g.SetInitializer("axes", Tensor::FromInt64s({0}));
  g.nodes.push_back(MakeNode("Constant", {}, {"four"}, "four", {TensorAttr("value", Tensor::Scalar<int64_t>(4))}));
  g.nodes.push_back(MakeNode("Constant", {}, {"one"}, "one", {TensorAttr("value", Tensor::FromInt64s({1}))}));
  g.nodes.push_back(MakeNode("Shape", {"x"}, {"s"}, "shape"));
  g.nodes.push_back(MakeNode("Gather", {"s", "zero"}, {"n"}, "gather"));
  g.nodes.push_back(MakeNode("Mul", {"n", "four"}, {"n4"}, "mul"));
  g.nodes.push_back(MakeNode("Unsqueeze", {"n4", "axes"}, {"n4v"}, "unsqueeze"));
  g.nodes.push_back(MakeNode("Concat", {"one", "n4v"}, {"shape2"}, "concat", {testing::IntAttr("axis", 0)}));
  g.nodes.push_back(MakeNode("Reshape", {"x", "shape2"}, {"r"}, "reshape"));
  g.nodes.push_back(MakeNode("Range", {"zero", "n", "step"}, {"range"}, "range"));
  g.nodes.push_back(MakeNode("Cast", {"range"}, {"z"}, "cast", {testing::IntAttr("to", 1)}));
  ValueInfo r{"r", DataType::kFloat}, z{"z", DataType::kFloat};
  g.outputs = {r, z};
  return MakeModel(std::move(g));
}

void ExpectSame(const std::vector<Tensor>& a, const std::vector<Tensor>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].shape(), b[i].shape()) << what << " output " << i;
    EXPECT_EQ(a[i].ToDoubles(), b[i].ToDoubles()) << what << " output " << i;
  }
}

TEST(ShapeCache, ResultsFollowEveryShapeChange) {
  Model m = ShapeModel();
  Session folded(m), plain(m, SessionOptions{.fold_shapes = false});
  uint32_t seed = 1;
  for (int64_t n : {2, 3, 3, 5, 2, 2}) {
    std::map<std::string, Tensor> feeds{{"x", RandomFloat({n, 4}, seed++)}};
    std::vector<Tensor> got = folded.Run(feeds), want = plain.Run(feeds);
    ExpectSame(got, want, "N=" + std::to_string(n));
    EXPECT_EQ(got[0].shape(), (Shape{1, 4 * n}));
    EXPECT_EQ(got[1].numel(), n);
  }
}

TEST(ShapeCache, ConstantsFoldOnceAndShapeStepsRunOnlyWhenTheirInputsChange) {
  Model m = ShapeModel();
  Session s(m, SessionOptions{.profile = true});
  auto run = [&](int64_t n) { s.Run({{"x", RandomFloat({n, 4}, static_cast<uint32_t>(n))}}); };
  run(3);
  EXPECT_EQ(testing::ProfiledCalls(s, "Constant"), 0) << "Constant nodes are folded when the session is made";
  EXPECT_EQ(testing::ProfiledCalls(s, "Range"), 1);
  EXPECT_EQ(testing::ProfiledCalls(s, "Reshape"), 1);
  run(3);  // same shape: Shape runs, what it feeds is reused
  EXPECT_EQ(testing::ProfiledCalls(s, "Shape"), 2);
  EXPECT_EQ(testing::ProfiledCalls(s, "Gather"), 1);
  EXPECT_EQ(testing::ProfiledCalls(s, "Range"), 1);
  EXPECT_EQ(testing::ProfiledCalls(s, "Reshape"), 2) << "Reshape reads x, a graph input: it always runs";
  run(4);  // another shape: the shape steps run again
  EXPECT_EQ(testing::ProfiledCalls(s, "Gather"), 2);
  EXPECT_EQ(testing::ProfiledCalls(s, "Range"), 2);
  EXPECT_EQ(testing::ProfiledCalls(s, "Concat"), 2);
}

TEST(ShapeCache, UnchangedValuesOfAChangedShapeKeepTheirConsumersCached) {
  // Gather of dim 1 (always 4) of a shape whose dim 0 changes: Mul on it stays cached.
  Model m = ShapeModel();
  std::vector<Node> nodes;
  for (Node& n : m.graph.nodes) {
    if (n.name == "gather") n.inputs[1] = "step";  // index 1: the fixed dim
    if (n.name != "reshape") nodes.push_back(n);
  }
  m.graph.nodes = nodes;
  m.graph.outputs.erase(m.graph.outputs.begin());  // z only
  Session s(m, SessionOptions{.profile = true});
  Session plain(m, SessionOptions{.fold_shapes = false});
  for (int64_t n : {2, 3, 6}) {
    std::map<std::string, Tensor> feeds{{"x", RandomFloat({n, 4}, 7)}};
    ExpectSame(s.Run(feeds), plain.Run(feeds), "N=" + std::to_string(n));
  }
  EXPECT_EQ(testing::ProfiledCalls(s, "Shape"), 3);
  EXPECT_EQ(testing::ProfiledCalls(s, "Gather"), 3) << "Gather reads the changed shape";
  EXPECT_EQ(testing::ProfiledCalls(s, "Mul"), 1) << "its result (4) did not change, so Mul was reused";
  EXPECT_EQ(testing::ProfiledCalls(s, "Range"), 1);
}

// Two inputs, each with its own copy of ShapeModel's reshape chain (own constants, own names), as a
// decoder's layers have; `index` is the second chain's Gather index (0: the same as the first's).
Model TwinChains(int64_t index) {
  Graph g;
  g.inputs.push_back(testing::FloatValue("x", {-1, 4}));
  g.inputs.push_back(testing::FloatValue("y", {-1, 4}));
  for (int c = 0; c < 2; ++c) {
    const std::string p = c == 0 ? "a_" : "b_", in = c == 0 ? "x" : "y";
    g.SetInitializer(p + "index", Tensor::Scalar<int64_t>(c == 0 ? 0 : index));
    g.SetInitializer(p + "four", Tensor::Scalar<int64_t>(4));
    g.SetInitializer(p + "axes", Tensor::FromInt64s({0}));
    g.SetInitializer(p + "one", Tensor::FromInt64s({1}));
    g.nodes.push_back(MakeNode("Shape", {in}, {p + "s"}, p + "shape"));
    g.nodes.push_back(MakeNode("Gather", {p + "s", p + "index"}, {p + "n"}, p + "gather"));
    g.nodes.push_back(MakeNode("Mul", {p + "n", p + "four"}, {p + "n4"}, p + "mul"));
    g.nodes.push_back(MakeNode("Unsqueeze", {p + "n4", p + "axes"}, {p + "n4v"}, p + "unsqueeze"));
    g.nodes.push_back(MakeNode("Concat", {p + "one", p + "n4v"}, {p + "shape2"}, p + "concat", {testing::IntAttr("axis", 0)}));
    g.nodes.push_back(MakeNode("Reshape", {in, p + "shape2"}, {p + "r"}, p + "reshape"));
    g.outputs.push_back(ValueInfo{p + "r", DataType::kFloat});
  }
  return MakeModel(std::move(g));
}

// Within a run, a shape step with the same operator, attributes and constants as one already run,
// reading the same values (Shape: an input of the same shape), takes its outputs (memo_shapes); the
// results are those of every step run, whatever the shapes.
TEST(ShapeCache, StepsOfTheSameShapesAreSharedWithinARun) {
  Model m = TwinChains(0);
  Session s(m, SessionOptions{.profile = true}), plain(m, SessionOptions{.fold_shapes = false});
  Session unshared(m, SessionOptions{.profile = true, .memo_shapes = false});
  uint32_t seed = 1;
  auto run = [&](int64_t nx, int64_t ny) {
    std::map<std::string, Tensor> feeds{{"x", RandomFloat({nx, 4}, seed++)}, {"y", RandomFloat({ny, 4}, seed++)}};
    const std::vector<Tensor> got = s.Run(feeds);
    ExpectSame(got, plain.Run(feeds), fmt::format("x {} y {}", nx, ny));
    ExpectSame(got, unshared.Run(feeds), fmt::format("x {} y {} (unshared)", nx, ny));
    EXPECT_EQ(got[1].shape(), (Shape{1, 4 * ny}));
  };
  run(3, 3);  // the second chain takes the first's values
  EXPECT_EQ(testing::ProfiledCalls(s, "Shape"), 1);
  EXPECT_EQ(testing::ProfiledCalls(s, "Gather"), 1);
  EXPECT_EQ(testing::ProfiledCalls(s, "Concat"), 1);
  EXPECT_EQ(testing::ProfiledCalls(s, "Reshape"), 2) << "Reshape reads data: never shared";
  EXPECT_EQ(testing::ProfiledCalls(unshared, "Gather"), 2);
  EXPECT_EQ(s.shape_memo_hits(), 5) << "the second chain's Shape, Gather, Mul, Unsqueeze and Concat";
  run(5, 2);  // other shapes for each: both chains run
  EXPECT_EQ(testing::ProfiledCalls(s, "Shape"), 3);
  EXPECT_EQ(testing::ProfiledCalls(s, "Gather"), 3);
  EXPECT_EQ(testing::ProfiledCalls(s, "Concat"), 3);
  run(6, 6);
  EXPECT_EQ(testing::ProfiledCalls(s, "Gather"), 4);
  EXPECT_EQ(testing::ProfiledCalls(s, "Concat"), 4);
  // The second chain now checks the first's (its partner's) inputs before any signature: shared
  // while they read the same, not once they do not, and again after.
  const int64_t hits = s.shape_memo_hits();
  run(7, 7);
  EXPECT_EQ(s.shape_memo_hits(), hits + 5);
  run(7, 8);
  EXPECT_EQ(s.shape_memo_hits(), hits + 5) << "other shapes: nothing shared";
  EXPECT_EQ(testing::ProfiledCalls(s, "Concat"), 6) << "the second chain's (the first's did not change)";
  run(9, 9);
  EXPECT_EQ(s.shape_memo_hits(), hits + 10);
  run(9, 9);  // the second chain's Shape takes the first's, the same as its last: the rest is clean
  EXPECT_EQ(s.shape_memo_hits(), hits + 11);
  EXPECT_EQ(testing::ProfiledCalls(s, "Concat"), 7) << "the first chain's, once";
}

// A different constant is a different step; what follows it is shared again when the values are.
TEST(ShapeCache, StepsWithOtherConstantsAreNotShared) {
  Model m = TwinChains(1);  // the second chain gathers dim 1 (4) where the first gathers dim 0
  Session s(m, SessionOptions{.profile = true}), plain(m, SessionOptions{.fold_shapes = false});
  std::map<std::string, Tensor> feeds{{"x", RandomFloat({4, 4}, 5)}, {"y", RandomFloat({4, 4}, 6)}};
  const std::vector<Tensor> got = s.Run(feeds);
  ExpectSame(got, plain.Run(feeds), "index 1");
  EXPECT_EQ(got[1].shape(), (Shape{1, 16}));
  EXPECT_EQ(testing::ProfiledCalls(s, "Shape"), 1) << "the same input shape: shared";
  EXPECT_EQ(testing::ProfiledCalls(s, "Gather"), 2) << "another index";
  EXPECT_EQ(testing::ProfiledCalls(s, "Mul"), 1) << "both Gathers gave 4: Mul reads the same values";
}

// ShapeModel and w = Add(r, y): a run whose y does not broadcast against r fails after its shape
// steps ran.
Model ShapeModelWithAdd() {
  Model m = ShapeModel();
  m.graph.inputs.push_back(testing::FloatValue("y", {1, -1}));
  m.graph.nodes.push_back(MakeNode("Add", {"r", "y"}, {"w"}, "add"));
  m.graph.outputs.push_back(ValueInfo{"w", DataType::kFloat});
  return m;
}

// The main graph's frame stays between runs with its constants and cached shape values (the steps
// that would make them again are skipped): after a run that failed half-way, the next runs, of
// that shape or the earlier one, still give the unfolded session's results.
TEST(ShapeCache, RunsAfterAFailedRunGiveTheSameResults) {
  Model m = ShapeModelWithAdd();
  Session s(m), plain(m, SessionOptions{.fold_shapes = false});
  uint32_t seed = 1;
  auto feeds = [&](int64_t n, int64_t ny) {
    return std::map<std::string, Tensor>{{"x", RandomFloat({n, 4}, seed++)}, {"y", RandomFloat({1, ny}, seed++)}};
  };
  for (int r = 0; r < 2; ++r) {
    auto f = feeds(3, 12);
    ExpectSame(s.Run(f), plain.Run(f), "N=3");
  }
  EXPECT_THROW(s.Run(feeds(5, 7)), Error) << "y [1, 7] does not broadcast against r [1, 20]";
  for (auto [n, ny] : {std::pair<int64_t, int64_t>{5, 20}, {3, 12}, {3, 12}}) {
    auto f = feeds(n, ny);
    ExpectSame(s.Run(f), plain.Run(f), "after the failed run, N=" + std::to_string(n));
  }
}

// What a run returns is the caller's alone: the resident frame keeps no output that is not a
// constant or a cached shape value.
TEST(ShapeCache, TheResidentFrameKeepsNoOutput) {
  Model m = ShapeModelWithAdd();
  Session s(m);
  for (int r = 0; r < 3; ++r) {
    std::vector<Tensor> out = s.Run({{"x", RandomFloat({2, 4}, 1)}, {"y", RandomFloat({1, 8}, 2)}});
    ASSERT_EQ(out.size(), 3u);
    EXPECT_FALSE(out[2].SharesBuffer()) << "run " << r << ": w is held elsewhere too";
  }
}

TEST(ShapeCache, ObserverSeesFoldedValues) {
  Model m = ShapeModel();
  std::set<std::string> seen;
  SessionOptions o;
  o.observer = [&](const std::string& name, const Tensor&) { seen.insert(name); };
  Session s(m, o);
  s.Run({{"x", RandomFloat({2, 4}, 1)}});
  s.Run({{"x", RandomFloat({2, 4}, 2)}});
  for (const char* v : {"four", "one", "s", "n", "n4", "shape2", "r", "range", "z"}) EXPECT_TRUE(seen.count(v)) << v;
}

}  // namespace
}  // namespace gaf
