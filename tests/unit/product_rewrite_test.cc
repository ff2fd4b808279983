// The session's product rewrites (runtime/plan_rewrite.h): grouped-query attention as
// torch.onnx.export writes it (the key/value cache unsqueezed, expanded and reshaped per query
// head, the keys transposed) runs as GroupedMatMul reading the cache in place, with results equal
// to the graph as written; shapes the fast path does not cover run the original operators; copies
// that something else reads, and constant operands, are left alone.
#include <gtest/gtest.h>

#include <cstring>

#include <array>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "ir/simd.h"  // GAF_AVX512
#include "ops/gemm.h"
#include "runtime/plan_calls.h"
#include "runtime/session.h"
#include "test_util.h"

namespace gaf {
namespace {

using testing::IntsAttr;
using testing::MakeModel;
using testing::MakeNode;
using testing::RandomFloat;

// q [B, 4, S, 8], k and v caches [Bk, 2, T, 8]; y = softmax(q kᵀ) v with the cache repeated for
// the 2 query heads of each cache head. `expand` is the Expand target (broadcast against
// [Bk, 2, 1, T, 8]); with `scores_out` the transposed keys are a graph output as well.
Model GqaModel(std::vector<int64_t> expand, bool keys_out = false, int64_t d = 8) {
  Graph g;
  g.inputs = {testing::FloatValue("q", {-1, 4, -1, d}), testing::FloatValue("kc", {-1, 2, -1, d}),
              testing::FloatValue("vc", {-1, 2, -1, d})};
  g.SetInitializer("axes", Tensor::FromInt64s({2}));
  g.SetInitializer("eshape", Tensor::FromInt64s(expand));
  g.SetInitializer("rshape", Tensor::FromInt64s({0, 4, -1, d}));
  for (const char* c : {"k", "v"}) {
    const std::string x = std::string(c) + "c", p = c;
    g.nodes.push_back(MakeNode("Unsqueeze", {x, "axes"}, {p + "u"}, p + "_unsqueeze"));
    g.nodes.push_back(MakeNode("Expand", {p + "u", "eshape"}, {p + "e"}, p + "_expand"));
    g.nodes.push_back(MakeNode("Reshape", {p + "e", "rshape"}, {p + "r"}, p + "_reshape"));
  }
  g.nodes.push_back(MakeNode("Transpose", {"kr"}, {"kt"}, "k_transpose", {IntsAttr("perm", {0, 1, 3, 2})}));
  g.nodes.push_back(MakeNode("MatMul", {"q", "kt"}, {"s"}, "qk"));
  g.nodes.push_back(MakeNode("Softmax", {"s"}, {"p"}, "softmax", {testing::IntAttr("axis", -1)}));
  g.nodes.push_back(MakeNode("MatMul", {"p", "vr"}, {"y"}, "pv"));
  g.outputs = {ValueInfo{"y", DataType::kFloat}, ValueInfo{"s", DataType::kFloat}};
  if (keys_out) g.outputs.push_back(ValueInfo{"kt", DataType::kFloat});
  return MakeModel(std::move(g), 17);
}

void ExpectClose(const std::vector<Tensor>& a, const std::vector<Tensor>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].shape(), b[i].shape()) << what << " output " << i;
    const std::vector<double> x = a[i].ToDoubles(), y = b[i].ToDoubles();
    double worst = 0;
    for (size_t j = 0; j < x.size(); ++j) worst = std::max(worst, std::abs(x[j] - y[j]));
    EXPECT_LT(worst, 1e-4) << what << " output " << i;
  }
}

std::map<std::string, Tensor> Feeds(int64_t b, int64_t bk, int64_t s, int64_t t, uint32_t seed, int64_t d = 8) {
  return {{"q", RandomFloat({b, 4, s, d}, seed)},
          {"kc", RandomFloat({bk, 2, t, d}, seed + 1)},
          {"vc", RandomFloat({bk, 2, t, d}, seed + 2)}};
}

// A graph of `nodes` on `inputs` (and initializers) with the one float output "y".
Model OutputY(std::vector<ValueInfo> inputs, std::vector<Node> nodes, std::vector<std::pair<std::string, Tensor>> inits = {}) {
  Graph g;
  g.inputs = std::move(inputs);
  for (auto& [name, t] : inits) g.SetInitializer(name, t);
  g.nodes = std::move(nodes);
  g.outputs = {ValueInfo{"y", DataType::kFloat}};
  return MakeModel(std::move(g));
}

// A product by a constant [K, N] weight that makes a graph output (here through a bias Add) reads
// its operand through LastPosition: runs that ask for the last position only get [b, 1, N], equal
// to the last position of a full run; other runs are unchanged. Not where the output is read inside
// the graph, where the weight is not 2-D, or where the name the node would make is taken.
TEST(ProductRewrite, OutputProductsComputeTheLastPositionOnlyWhenAsked) {
  const std::vector<ValueInfo> in{ValueInfo{"x", DataType::kFloat}};
  const std::vector<std::pair<std::string, Tensor>> inits{{"w", RandomFloat({8, 5}, 3)}, {"bias", RandomFloat({5}, 4)}};
  auto model = [&](std::vector<Node> extra) {
    std::vector<Node> nodes{MakeNode("MatMul", {"x", "w"}, {"xw"}, "head"), MakeNode("Add", {"xw", "bias"}, {"y"}, "bias_add")};
    for (Node& n : extra) nodes.push_back(std::move(n));
    return OutputY(in, std::move(nodes), inits);
  };
  const std::map<std::string, Tensor> feeds{{"x", RandomFloat({2, 6, 8}, 5)}};
  {
    Session s(model({}));
    EXPECT_EQ(s.product_rewrites().last_positions, 1);
    const Tensor full = s.Run(feeds)[0], last = s.Run(feeds, {}, false, /*last_position_only=*/true)[0];
    ASSERT_EQ(full.shape(), (Shape{2, 6, 5}));
    ASSERT_EQ(last.shape(), (Shape{2, 1, 5}));
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t j = 0; j < 5; ++j)
        EXPECT_NEAR(last.data<float>()[b * 5 + j], full.data<float>()[(b * 6 + 5) * 5 + j], 1e-5f) << b << "," << j;
    EXPECT_EQ(s.Run(feeds)[0].shape(), (Shape{2, 6, 5}));  // a full run after it
  }
  // The bias sum read by another node too: y is not made from one position.
  EXPECT_EQ(Session(model({MakeNode("Relu", {"xw"}, {"r"}, "relu")})).product_rewrites().last_positions, 0);
  // The name LastPosition would make is a value of the graph already.
  EXPECT_EQ(Session(model({MakeNode("Relu", {"x"}, {"xw/last_position_input"}, "taken")})).product_rewrites().last_positions,
            0);
}

TEST(ProductRewrite, GroupedQueryAttentionReadsTheCacheInPlace) {
  Model m = GqaModel({1, 1, 2, 1, 1});
  SessionOptions on{.profile = true}, off{.profile = true};
  off.rewrite_products = false;
  Session fast(m, on), plain(m, off);
  EXPECT_EQ(fast.product_rewrites().kv_grouped, 2);
  EXPECT_EQ(fast.product_rewrites().transposed, 1);
  EXPECT_EQ(plain.product_rewrites().kv_grouped, 0);
  // Decode (S = 1), prefill, a long cache (the library path), batch 2.
  const std::vector<std::array<int64_t, 3>> shapes = {{1, 1, 1}, {1, 1, 17}, {1, 7, 7}, {1, 64, 700}, {2, 3, 40}};
  uint32_t seed = 10;
  for (const auto& [b, s, t] : shapes) {
    auto feeds = Feeds(b, b, s, t, seed += 3);
    ExpectClose(fast.Run(feeds), plain.Run(feeds), fmt::format("b={} s={} t={}", b, s, t));
  }
  const int64_t runs = static_cast<int64_t>(shapes.size());
  EXPECT_EQ(testing::ProfiledCalls(fast, "GroupedMatMul"), 2 * runs);
  EXPECT_EQ(testing::ProfiledCalls(fast, "Expand"), 0);
  EXPECT_EQ(testing::ProfiledCalls(fast, "Transpose"), 0);
  EXPECT_EQ(testing::ProfiledCalls(fast, "MatMul"), 0);  // the fast path ran: no fallback MatMul
  EXPECT_EQ(testing::ProfiledCalls(plain, "Expand"), 2 * runs);
}

TEST(ProductRewrite, AttentionKernelsOfCommonHeadSizes) {
  // Head sizes 64 and 128 take the dedicated score and value kernels (AVX-512 machines), 48 the
  // scores kernel and the library for the values; every cache length tail (t % 16) is covered.
  for (int64_t d : {64, 128, 48}) {
    Model m = GqaModel({1, 1, 2, 1, 1}, false, d);
    SessionOptions off;
    off.rewrite_products = false;
    Session fast(m), plain(m, off);
    ASSERT_EQ(fast.product_rewrites().kv_grouped, 2);
    uint32_t seed = 60;
    for (const auto& [s, t] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {1, 17}, {1, 300}, {3, 45}, {8, 16}}) {
      auto feeds = Feeds(1, 1, s, t, seed += 3, d);
      ExpectClose(fast.Run(feeds), plain.Run(feeds), fmt::format("d={} s={} t={}", d, s, t));
    }
  }
}

// GqaModel's attention where each cache is Concat(past, new) on axis 2 and also a graph output
// (the present cache, as torch.onnx.export writes a decoder with a KV cache); with `cache_read`
// the key cache is also read by another node (a ReduceSum output); with `shape_read` its length
// is read by a Shape node (start 2, end 3) before the products, an output too.
Model GqaAppendModel(int64_t d, bool cache_read = false, bool shape_read = false) {
  Model m = GqaModel({1, 1, 2, 1, 1}, false, d);
  Graph& g = m.graph;
  g.inputs = {testing::FloatValue("q", {-1, 4, -1, d}), testing::FloatValue("kp", {-1, 2, -1, d}),
              testing::FloatValue("kn", {-1, 2, -1, d}), testing::FloatValue("vp", {-1, 2, -1, d}),
              testing::FloatValue("vn", {-1, 2, -1, d})};
  g.nodes.insert(g.nodes.begin(), MakeNode("Concat", {"vp", "vn"}, {"vc"}, "v_concat", {testing::IntAttr("axis", 2)}));
  g.nodes.insert(g.nodes.begin(), MakeNode("Concat", {"kp", "kn"}, {"kc"}, "k_concat", {testing::IntAttr("axis", -2)}));
  g.outputs.push_back(ValueInfo{"kc", DataType::kFloat});
  g.outputs.push_back(ValueInfo{"vc", DataType::kFloat});
  if (cache_read) {
    g.nodes.push_back(MakeNode("ReduceSum", {"kc"}, {"ks"}, "k_sum"));
    g.outputs.push_back(ValueInfo{"ks", DataType::kFloat});
  }
  if (shape_read) {
    g.nodes.insert(g.nodes.begin() + 2, MakeNode("Shape", {"kc"}, {"klen"}, "k_shape",
                                                 {testing::IntAttr("start", 2), testing::IntAttr("end", 3)}));
    g.outputs.push_back(ValueInfo{"klen", DataType::kInt64});
  }
  return m;
}

std::map<std::string, Tensor> AppendFeeds(int64_t b, int64_t s, int64_t tp, int64_t tn, uint32_t seed, int64_t d,
                                          int64_t bn = -1) {
  return {{"q", RandomFloat({b, 4, s, d}, seed)},
          {"kp", RandomFloat({b, 2, tp, d}, seed + 1)},
          {"kn", RandomFloat({bn < 0 ? b : bn, 2, tn, d}, seed + 2)},
          {"vp", RandomFloat({b, 2, tp, d}, seed + 3)},
          {"vn", RandomFloat({b, 2, tn, d}, seed + 4)}};
}

TEST(ProductRewrite, ProductsMakeThePresentCacheFromThePastInTheSamePass) {
  for (int64_t d : {64, 8}) {  // the decode kernels (AVX-512 machines), and the library
    Model m = GqaAppendModel(d);
    SessionOptions on{.profile = true}, off{.profile = true};
    off.rewrite_products = false;
    Session fast(m, on), plain(m, off);
    ASSERT_EQ(fast.product_rewrites().appended, 2);
    ASSERT_EQ(fast.product_rewrites().kv_grouped, 2);
    // Decode, a prompt on an empty past, a long past, a prompt after a past, batch 2.
    const std::vector<std::array<int64_t, 4>> shapes = {{1, 1, 16, 1}, {1, 5, 0, 5}, {1, 1, 700, 1}, {1, 4, 9, 4},
                                                        {2, 1, 40, 1}};
    uint32_t seed = 90;
    for (const auto& [b, s, tp, tn] : shapes) {
      const auto feeds = AppendFeeds(b, s, tp, tn, seed += 5, d);
      const std::vector<Tensor> x = fast.Run(feeds), y = plain.Run(feeds);
      const std::string what = fmt::format("d={} b={} s={} past={} new={}", d, b, s, tp, tn);
      ExpectClose(x, y, what);
      ASSERT_EQ(x.size(), 4u);
      EXPECT_EQ(x[2].ToDoubles(), y[2].ToDoubles()) << what;  // the present caches: copies, exactly
      EXPECT_EQ(x[3].ToDoubles(), y[3].ToDoubles()) << what;
    }
    EXPECT_EQ(testing::ProfiledCalls(fast, "Concat"), 0);
    EXPECT_EQ(testing::ProfiledCalls(fast, "MatMul"), 0);
    EXPECT_EQ(testing::ProfiledCalls(fast, "GroupedMatMul"), 2 * static_cast<int64_t>(shapes.size()));
  }
}

// Multi-head attention (GPT-2's layout: as many cache heads as query heads, no repeat): q [B, 2, S,
// d], y = softmax(q · Concat(kp, kn)ᵀ) · Concat(vp, vn), both caches graph outputs. Both products
// make their present cache in the same pass, and the Concats are gone.
TEST(ProductRewrite, MultiHeadProductsMakeThePresentCacheToo) {
  for (int64_t d : {64, 8}) {
    Graph g;
    g.inputs = {testing::FloatValue("q", {-1, 2, -1, d}), testing::FloatValue("kp", {-1, 2, -1, d}),
                testing::FloatValue("kn", {-1, 2, -1, d}), testing::FloatValue("vp", {-1, 2, -1, d}),
                testing::FloatValue("vn", {-1, 2, -1, d})};
    g.nodes = {MakeNode("Concat", {"kp", "kn"}, {"kc"}, "k_concat", {testing::IntAttr("axis", -2)}),
               MakeNode("Concat", {"vp", "vn"}, {"vc"}, "v_concat", {testing::IntAttr("axis", 2)}),
               MakeNode("Transpose", {"kc"}, {"kt"}, "k_transpose", {IntsAttr("perm", {0, 1, 3, 2})}),
               MakeNode("MatMul", {"q", "kt"}, {"s"}, "qk"),
               MakeNode("Softmax", {"s"}, {"p"}, "softmax", {testing::IntAttr("axis", -1)}),
               MakeNode("MatMul", {"p", "vc"}, {"y"}, "pv")};
    g.outputs = {ValueInfo{"y", DataType::kFloat}, ValueInfo{"kc", DataType::kFloat}, ValueInfo{"vc", DataType::kFloat}};
    Model m = MakeModel(std::move(g), 17);
    SessionOptions on{.profile = true}, off;
    off.rewrite_products = false;
    Session fast(m, on), plain(m, off);
    ASSERT_EQ(fast.product_rewrites().appended, 2);
    EXPECT_EQ(fast.product_rewrites().kv_grouped, 0);
    uint32_t seed = 300;
    for (const auto& [b, s, tp, tn] : std::vector<std::array<int64_t, 4>>{{1, 1, 16, 1}, {1, 5, 0, 5}, {2, 1, 300, 1}, {1, 20, 7, 20}}) {
      const std::map<std::string, Tensor> feeds = {{"q", RandomFloat({b, 2, s, d}, seed += 5)},
                                                   {"kp", RandomFloat({b, 2, tp, d}, seed + 1)},
                                                   {"kn", RandomFloat({b, 2, tn, d}, seed + 2)},
                                                   {"vp", RandomFloat({b, 2, tp, d}, seed + 3)},
                                                   {"vn", RandomFloat({b, 2, tn, d}, seed + 4)}};
      const std::vector<Tensor> x = fast.Run(feeds), y = plain.Run(feeds);
      const std::string what = fmt::format("d={} b={} s={} past={} new={}", d, b, s, tp, tn);
      ExpectClose(x, y, what);
      EXPECT_EQ(x[1].ToDoubles(), y[1].ToDoubles()) << what;  // the present caches: copies, exactly
      EXPECT_EQ(x[2].ToDoubles(), y[2].ToDoubles()) << what;
    }
    EXPECT_EQ(testing::ProfiledCalls(fast, "Concat"), 0);
    EXPECT_EQ(testing::ProfiledCalls(fast, "MatMul"), 0);
  }
}

TEST(ProductRewrite, ShapesOfAnAppendedCacheComeFromItsInputs) {
  // torch.onnx.export reads the key cache's shape for repeat_kv's Expand target: those Shape nodes
  // become ConcatShape(past, new), so the product can still make the cache.
  Model m = GqaAppendModel(8, false, /*shape_read=*/true);
  SessionOptions on{.profile = true}, off;
  off.rewrite_products = false;
  Session fast(m, on), plain(m, off);
  ASSERT_EQ(fast.product_rewrites().appended, 2);
  EXPECT_EQ(fast.product_rewrites().shape_readers, 1);
  for (const auto& [tp, tn] : std::vector<std::pair<int64_t, int64_t>>{{5, 1}, {0, 3}}) {
    const auto feeds = AppendFeeds(1, tn, tp, tn, 40 + tp, 8);
    const std::vector<Tensor> x = fast.Run(feeds), y = plain.Run(feeds);
    ExpectClose(x, y, fmt::format("past {} new {}", tp, tn));
    EXPECT_EQ(x.back().ToInt64s(), std::vector<int64_t>{tp + tn});
  }
  EXPECT_EQ(testing::ProfiledCalls(fast, "ConcatShape"), 2);
  EXPECT_EQ(testing::ProfiledCalls(fast, "Concat"), 0);
  // New keys of another batch than the past: Concat's own error, from the fallback graphs.
  const auto bad = AppendFeeds(1, 1, 5, 1, 3, 8, /*bn=*/2);
  const std::string e = testing::ErrorOf([&] { fast.Run(bad); });
  EXPECT_NE(e.find("k_concat"), std::string::npos) << e;
  EXPECT_EQ(e, testing::ErrorOf([&] { plain.Run(bad); }));
}

TEST(ProductRewrite, ConcatShapeGivesTheConcatenatedShapeOrConcatsError) {
  // The node the rewrite makes, on its own: Shape(Concat(a, b)) from the shapes, start 1; shapes
  // Concat rejects run the fallback graph (Concat + Shape), whose error names the Concat.
  auto fallback = std::make_shared<Graph>();
  fallback->inputs = {ValueInfo{"a"}, ValueInfo{"b"}};
  fallback->nodes = {MakeNode("Concat", {"a", "b"}, {"c"}, "cat", {testing::IntAttr("axis", -2)}),
                     MakeNode("Shape", {"c"}, {"y"}, "shp", {testing::IntAttr("start", 1)})};
  fallback->outputs = {ValueInfo{"y"}};
  Node n = MakeNode("ConcatShape", {"a", "b"}, {"y"}, "cs", {testing::IntAttr("axis", -2), testing::IntAttr("start", 1)});
  n.domain = kPlanDomain;
  Attribute fb;
  fb.name = "fallback";
  fb.type = Attribute::Type::kGraph;
  fb.g = fallback;
  n.attributes.push_back(fb);
  Graph g;
  g.inputs = {testing::FloatValue("a", {-1, 2, -1, 8}), testing::FloatValue("b", {-1, 2, -1, 8})};
  g.nodes = {n};
  g.outputs = {ValueInfo{"y", DataType::kInt64}};
  Session s(MakeModel(std::move(g)));
  const auto out = s.Run({{"a", RandomFloat({3, 2, 5, 8}, 1)}, {"b", RandomFloat({3, 2, 4, 8}, 2)}});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].ToInt64s(), (std::vector<int64_t>{2, 9, 8}));
  const std::string e = testing::ErrorOf([&] { s.Run({{"a", RandomFloat({3, 2, 5, 8}, 1)}, {"b", RandomFloat({1, 2, 4, 8}, 2)}}); });
  EXPECT_NE(e.find("cat"), std::string::npos) << e;
}

TEST(ProductRewrite, AppendLeavesACacheReadElsewhereAndFallsBackOnOtherShapes) {
  Session shared(GqaAppendModel(8, /*cache_read=*/true));
  EXPECT_EQ(shared.product_rewrites().appended, 1);  // the value cache only; the key Concat stays
  EXPECT_EQ(shared.product_rewrites().kv_grouped, 2);
  Model m = GqaAppendModel(8);
  SessionOptions on{.profile = true}, off;
  off.rewrite_products = false;
  Session fast(m, on), plain(m, off);
  ExpectClose(shared.Run(AppendFeeds(1, 1, 6, 1, 3, 8)), Session(GqaAppendModel(8, true), off).Run(AppendFeeds(1, 1, 6, 1, 3, 8)),
              "cache read elsewhere");
  // New keys of another batch than the past: the original Concat's error, naming it.
  const std::string e = testing::ErrorOf([&] { fast.Run(AppendFeeds(1, 1, 6, 1, 3, 8, 2)); });
  EXPECT_NE(e.find("k_concat"), std::string::npos) << e;
  EXPECT_EQ(e, testing::ErrorOf([&] { plain.Run(AppendFeeds(1, 1, 6, 1, 3, 8, 2)); }));
}

TEST(ProductRewrite, OtherShapesRunTheOriginalOperators) {
  // The cache's batch of 1 is expanded to the queries' batch of 2: not one cache head per group of
  // query heads, so GroupedMatMul runs its fallback graph.
  Model m = GqaModel({2, 1, 2, 1, 1});
  SessionOptions on{.profile = true}, off;
  off.rewrite_products = false;
  Session fast(m, on), plain(m, off);
  ASSERT_EQ(fast.product_rewrites().kv_grouped, 2);
  auto feeds = Feeds(2, 1, 3, 5, 7);
  ExpectClose(fast.Run(feeds), plain.Run(feeds), "batch-broadcast cache");
  EXPECT_EQ(testing::ProfiledCalls(fast, "Expand"), 2);  // inside the fallback graphs
  EXPECT_EQ(testing::ProfiledCalls(fast, "MatMul"), 2);
  // Invalid shapes give the original operator's error, naming the original node: a cache batch of
  // 3 does not broadcast to 2.
  const std::string e = testing::ErrorOf([&] { fast.Run(Feeds(2, 3, 3, 5, 7)); });
  EXPECT_NE(e.find("k_expand"), std::string::npos) << e;
  EXPECT_EQ(e, testing::ErrorOf([&] { plain.Run(Feeds(2, 3, 3, 5, 7)); }));
}

TEST(ProductRewrite, CopiesReadElsewhereAndConstantsStay) {
  // The transposed keys are a graph output: the Transpose stays, only the values are grouped.
  Session s(GqaModel({1, 1, 2, 1, 1}, /*keys_out=*/true));
  EXPECT_EQ(s.product_rewrites().transposed, 0);
  EXPECT_EQ(s.product_rewrites().kv_grouped, 1);
  auto out = s.Run(Feeds(1, 1, 2, 3, 3));
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[2].shape(), (Shape{1, 4, 8, 3}));

  // MatMul(x, Transpose(W)) with W constant: folded once by the plan, not rewritten.
  Session c(OutputY({testing::FloatValue("x", {3, 4})},
                    {MakeNode("Transpose", {"w"}, {"wt"}, "t", {IntsAttr("perm", {1, 0})}),
                     MakeNode("MatMul", {"x", "wt"}, {"y"}, "mm")},
                    {{"w", RandomFloat({5, 4}, 2)}}));
  EXPECT_EQ(c.product_rewrites().transposed, 0);
}

TEST(ProductRewrite, TransposedOperandWithBroadcastBatch) {
  // y = a [2, 3, 5, 4] x Transpose(b [3, 6, 4]) -> [2, 3, 5, 6]: B read transposed, batch broadcast.
  Model m = OutputY({testing::FloatValue("a", {2, 3, 5, 4}), testing::FloatValue("b", {3, 6, 4})},
                    {MakeNode("Transpose", {"b"}, {"bt"}, "t", {IntsAttr("perm", {0, 2, 1})}),
                     MakeNode("MatMul", {"a", "bt"}, {"y"}, "mm")});
  SessionOptions off;
  off.rewrite_products = false;
  Session fast(m), plain(m, off);
  EXPECT_EQ(fast.product_rewrites().transposed, 1);
  std::map<std::string, Tensor> feeds = {{"a", RandomFloat({2, 3, 5, 4}, 4)}, {"b", RandomFloat({3, 6, 4}, 5)}};
  ExpectClose(fast.Run(feeds), plain.Run(feeds), "broadcast batch");
}

TEST(ProductRewrite, SiblingProductsStreamTheirWeightsInOnePass) {
  const int64_t K = 512;
  Model m = testing::SiblingProjections(K, {600, 130, 130}, 20);
  SessionOptions on{.profile = true}, off;
  off.rewrite_products = false;
  Session fast(m, on), plain(m, off);
  EXPECT_EQ(fast.product_rewrites().sibling_groups, 1);
  EXPECT_EQ(fast.product_rewrites().siblings, 3);
  // Batch 1 (the streaming GEMV over all three weights, w1 and w2 not being prepared: their
  // separate products' results exactly; w0's separate product reads its panels), a few rows (all
  // weights streamed once for all rows: each row equals that row alone), and more rows (the
  // library on packed weights).
  for (int64_t rows : {1, 3, 8, 40}) {
    std::map<std::string, Tensor> feeds = {{"x", RandomFloat({rows, K}, 30 + rows)}};
    const std::vector<Tensor> a = fast.Run(feeds), b = plain.Run(feeds);
    if (rows == 1) {  // the same GEMV, summed in the same order, for the weights not prepared
      for (int i = 1; i < 3; ++i) EXPECT_EQ(a[i].ToDoubles(), b[i].ToDoubles()) << rows << " rows, output " << i;
      ExpectClose(a, b, "1 row");
    } else {  // the separate products of the small weights take the library
      ExpectClose(a, b, fmt::format("{} rows", rows));
    }
    // Against double precision.
    const Tensor& x = feeds["x"];
    const Tensor& w = *m.graph.FindInitializer("w0");
    double worst = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < 600; j += 37) {
        double ref = 0;
        for (int64_t k = 0; k < K; ++k) ref += double(x.data<float>()[r * K + k]) * w.data<float>()[k * 600 + j];
        worst = std::max(worst, std::abs(ref - a[0].data<float>()[r * 600 + j]));
      }
    EXPECT_LT(worst, 1e-4) << rows << " rows";
    if (rows > 1 && rows <= 5) {  // the multi-row GEMV (w1, w2 are not prepared: the registry's SiblingMatMul)
      Tensor row(DataType::kFloat, {1, K});
      std::copy_n(x.data<float>() + K, K, row.data<float>());
      std::map<std::string, Tensor> one = {{"x", row}};
      const std::vector<Tensor> c = fast.Run(one);
      for (int64_t j = 0; j < 600; ++j)
        ASSERT_EQ(c[0].data<float>()[j], a[0].data<float>()[600 + j]) << rows << " rows, column " << j;
    }
  }
  EXPECT_EQ(testing::ProfiledCalls(fast, "SiblingMatMul"), 5);  // 4 batches and the single row of the 3-row check
  EXPECT_EQ(testing::ProfiledCalls(fast, "MatMul"), 0);
}

TEST(PreparedMatMul, PromptsOnAPackedWeightEqualTheReference) {
  // y = x [.., R, 300] * w [300, 900] (>= kPackedMatMulMinWeight elements): the panels (k-blocked
  // tiles to kPanelMaxRows rows, one row too, whole-K tiles above; oneDNN's packed matmul above
  // without AVX-512).
  static_assert(300 * 900 >= kPackedMatMulMinWeight);
  Model m = OutputY({testing::FloatValue("x", {-1, -1, 300})}, {MakeNode("MatMul", {"x", "w"}, {"y"}, "mm")},
                    {{"w", RandomFloat({300, 900}, 40, -0.1f, 0.1f)}});
  SessionOptions off;
  off.prepared_kernels = false;
  Session prepared(m), plain(m, off);
  for (int64_t rows : {1, 5, 9, 16, 40, 130, 9, 130}) {  // again: the cached primitive
    std::map<std::string, Tensor> feeds = {{"x", RandomFloat({2, rows, 300}, 50 + rows)}};
    ExpectClose(prepared.Run(feeds), plain.Run(feeds), fmt::format("{} rows", rows));
  }
}

TEST(PreparedMatMul, AWeightAFeedCanOverrideIsNotPrepared) {
  // An IR < 4 initializer that is also a graph input is only a default: the value fed must be used
  // (a prepared copy of the default would ignore it) at one row, on the panels and the library.
  Model m = OutputY({testing::FloatValue("x", {-1, 300}), testing::FloatValue("w", {300, 900})},
                    {MakeNode("MatMul", {"x", "w"}, {"y"}, "mm")}, {{"w", RandomFloat({300, 900}, 42, -0.1f, 0.1f)}});
  SessionOptions off;
  off.prepared_kernels = false;
  Session s(m), plain(m, off);
  const Tensor fed = RandomFloat({300, 900}, 43, -0.1f, 0.1f);
  for (int64_t rows : {1, 8, 200}) {
    std::map<std::string, Tensor> feeds = {{"x", RandomFloat({rows, 300}, 44 + rows)}, {"w", fed}};
    ExpectClose(s.Run(feeds), plain.Run(feeds), fmt::format("{} rows, fed weight", rows));
    feeds.erase("w");
    ExpectClose(s.Run(feeds), plain.Run(feeds), fmt::format("{} rows, default weight", rows));
  }
}

TEST(PreparedMatMul, PacksOnceOnTheFirstPromptAndMatchesDoublePrecision) {
  const int64_t K = 300, N = 900;
  Tensor w = RandomFloat({K, N}, 41, -0.1f, 0.1f);
  PreparedMatMul mm(w);
  auto check = [&](int64_t rows) {
    Tensor x = RandomFloat({rows, K}, 70 + rows);
    std::vector<float> y(rows * N);
    mm.Run(x.data<float>(), rows, y.data());
    double worst = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < N; j += 7) {
        double ref = 0;
        for (int64_t k = 0; k < K; ++k) ref += double(x.data<float>()[r * K + k]) * w.data<float>()[k * N + j];
        worst = std::max(worst, std::abs(ref - y[r * N + j]));
      }
    EXPECT_LT(worst, 1e-4) << rows << " rows";
  };
  check(1);
  EXPECT_EQ(mm.packed_copies(), 1u);  // the panel copy, on the first product (one row streams it too)
  check(2);
  EXPECT_EQ(mm.packed_copies(), 1u);
  {  // a decode step's row and the same row in a batch of 8 on the panels: the same bits
    Tensor x = RandomFloat({8, K}, 77);
    std::vector<float> all(8 * N), one(N);
    mm.Run(x.data<float>(), 8, all.data());
    mm.Run(x.data<float>() + 5 * K, 1, one.data());
    for (int64_t j = 0; j < N; ++j) ASSERT_EQ(one[j], all[5 * N + j]) << "column " << j;
  }
  check(kPanelMaxRows);
  EXPECT_EQ(mm.packed_copies(), 1u);
  check(kPackedMatMulMinRows);
  // A prompt: the same panel copy with AVX-512; without, the library's copy on the first prompt.
  EXPECT_EQ(mm.packed_copies(), GAF_AVX512 ? 1u : 2u);
  check(200);
  {  // a decode step's row and the same row in a prompt of 200: the same bits (with AVX-512)
    Tensor x = RandomFloat({200, K}, 78);
    std::vector<float> all(200 * N), one(N);
    mm.Run(x.data<float>(), 200, all.data());
    mm.Run(x.data<float>() + 133 * K, 1, one.data());
    if (GAF_AVX512)
      for (int64_t j = 0; j < N; ++j) ASSERT_EQ(one[j], all[133 * N + j]) << "column " << j;
  }
  const size_t copies = mm.packed_copies();  // another row count may ask for another layout
  check(kPackedMatMulMinRows);               // its primitive again: no new copy
  check(200);
  check(3);
  EXPECT_EQ(mm.packed_copies(), copies);
}

TEST(PreparedMatMul, TheLibrarysMatmulOnItsPackedWeightMatchesThePanels) {
  // RunLibrary: oneDNN's matmul on its own copy (the prompts of builds without AVX-512, the bench's
  // reference); its primitive is cached per row count.
  const int64_t K = 300, N = 900;
  Tensor w = RandomFloat({K, N}, 45, -0.1f, 0.1f);
  PreparedMatMul mm(w);
  for (int64_t rows : {200, 1, 200}) {
    Tensor x = RandomFloat({rows, K}, 80 + rows);
    std::vector<float> lib(rows * N), panels(rows * N);
    mm.RunLibrary(x.data<float>(), rows, lib.data());
    mm.Run(x.data<float>(), rows, panels.data());
    double worst = 0;
    for (int64_t i = 0; i < rows * N; ++i) worst = std::max(worst, double(std::abs(lib[i] - panels[i])));
    EXPECT_LT(worst, 1e-4) << rows << " rows";
  }
  EXPECT_EQ(mm.packed_copies(), 2u);  // the panels and the library's layout
}

// Attention's scores scaled, masked and normalized: Softmax(Add(Div(q kt, c), mask)) as
// torch.onnx.export writes it. `mul` scales by Mul(c, s) instead; `mask_first` writes Add(mask, d);
// `axis` is the Softmax's (unset: its opset's default); `scaled_out` makes the scaled scores a
// graph output too (then nothing is folded).
Model ScaledSoftmaxModel(bool mul, bool mask_first, int64_t opset = 17, std::optional<int64_t> axis = -1,
                         bool scaled_out = false) {
  Graph g;
  g.inputs = {testing::FloatValue("q", {-1, -1, -1, 8}), testing::FloatValue("kt", {-1, -1, 8, -1}),
              testing::FloatValue("mask", {-1, -1, -1, -1})};
  g.SetInitializer("c", Tensor::FromVector<float>({mul ? 0.3535f : 2.8284f}, {1}));
  g.nodes.push_back(MakeNode("MatMul", {"q", "kt"}, {"s"}, "qk"));
  g.nodes.push_back(mul ? MakeNode("Mul", {"c", "s"}, {"d"}, "scale") : MakeNode("Div", {"s", "c"}, {"d"}, "scale"));
  g.nodes.push_back(MakeNode("Add", mask_first ? std::vector<std::string>{"mask", "d"} : std::vector<std::string>{"d", "mask"},
                             {"a"}, "add_mask"));
  std::vector<Attribute> attrs;
  if (axis) attrs.push_back(testing::IntAttr("axis", *axis));
  g.nodes.push_back(MakeNode("Softmax", {"a"}, {"y"}, "softmax", attrs));
  g.outputs = {ValueInfo{"y", DataType::kFloat}};
  if (scaled_out) g.outputs.push_back(ValueInfo{"d", DataType::kFloat});
  return MakeModel(std::move(g), opset);
}

void ExpectSame(const std::vector<Tensor>& a, const std::vector<Tensor>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].shape(), b[i].shape()) << what;
    const std::vector<double> x = a[i].ToDoubles(), y = b[i].ToDoubles();
    for (size_t j = 0; j < x.size(); ++j)  // a row masked out entirely is NaN in both
      if (!(std::isnan(x[j]) && std::isnan(y[j]))) ASSERT_EQ(x[j], y[j]) << what << " output " << i << " element " << j;
  }
}

std::map<std::string, Tensor> ScoreFeeds(int64_t b, int64_t h, int64_t s, int64_t t, Shape mask, uint32_t seed) {
  Tensor m = RandomFloat(mask, seed + 2, -3.f, 0.f);
  float* mp = m.data<float>();
  for (int64_t i = 0; i < m.numel(); i += 3) mp[i] = -std::numeric_limits<float>::infinity();  // masked out
  return {{"q", RandomFloat({b, h, s, 8}, seed)}, {"kt", RandomFloat({b, h, 8, t}, seed + 1)}, {"mask", m}};
}

TEST(ProductRewrite, SoftmaxTakesTheScaleAndMaskInOnePass) {
  for (bool mul : {false, true})
    for (bool mask_first : {false, true}) {
      Model m = ScaledSoftmaxModel(mul, mask_first);
      SessionOptions on{.profile = true}, off;
      off.rewrite_products = false;
      Session fast(m, on), plain(m, off);
      ASSERT_EQ(fast.product_rewrites().softmax_epilogues, 1);
      EXPECT_EQ(plain.product_rewrites().softmax_epilogues, 0);
      // A causal mask per position, one per batch row and key, a scalar, and row lengths with
      // and without a vector tail.
      const std::vector<std::pair<std::array<int64_t, 4>, Shape>> cases = {
          {{1, 4, 5, 5}, {1, 1, 5, 5}}, {{2, 3, 1, 37}, {2, 1, 1, 37}}, {{1, 2, 16, 16}, {1, 1, 1, 1}},
          {{2, 2, 3, 7}, {1, 2, 3, 7}}, {{1, 1, 9, 33}, {1, 1, 9, 1}}};
      uint32_t seed = 300;
      int runs = 0;
      for (const auto& [d, ms] : cases) {
        auto feeds = ScoreFeeds(d[0], d[1], d[2], d[3], ms, seed += 5);
        ExpectSame(fast.Run(feeds), plain.Run(feeds),
                   fmt::format("mul={} mask_first={} {}x{}x{}x{}", mul, mask_first, d[0], d[1], d[2], d[3]));
        ++runs;
      }
      EXPECT_EQ(testing::ProfiledCalls(fast, "MaskedSoftmax"), runs);
      EXPECT_EQ(testing::ProfiledCalls(fast, "Softmax"), 0);  // no fallback ran
      EXPECT_EQ(testing::ProfiledCalls(fast, mul ? "Mul" : "Div"), 0);
    }
}

TEST(ProductRewrite, SoftmaxEpilogueFallsBackOutsideItsForm) {
  SessionOptions on{.profile = true}, off;
  off.rewrite_products = false;
  {  // A mask that enlarges the scores (broadcast over batch): the original operators run.
    Model m = ScaledSoftmaxModel(false, false);
    Session fast(m, on), plain(m, off);
    auto feeds = ScoreFeeds(1, 2, 4, 6, {3, 2, 4, 6}, 40);
    ExpectSame(fast.Run(feeds), plain.Run(feeds), "enlarging mask");
    EXPECT_EQ(testing::ProfiledCalls(fast, "Softmax"), 1);
  }
  {  // Softmax over another axis, and opset 11's default axis (1: the input coerced to 2-D).
    for (auto [opset, axis] : std::vector<std::pair<int64_t, std::optional<int64_t>>>{{17, 2}, {11, std::nullopt}}) {
      Model m = ScaledSoftmaxModel(false, false, opset, axis);
      Session fast(m, on), plain(m, off);
      ASSERT_EQ(fast.product_rewrites().softmax_epilogues, 1);
      auto feeds = ScoreFeeds(1, 2, 3, 5, {1, 1, 3, 5}, 50);
      ExpectSame(fast.Run(feeds), plain.Run(feeds), fmt::format("opset {}", opset));
      EXPECT_EQ(testing::ProfiledCalls(fast, "Softmax"), 1);
    }
  }
  {  // Opset 11's Softmax on its last axis: the fast path.
    Model m = ScaledSoftmaxModel(false, false, 11, 3);
    Session fast(m, on), plain(m, off);
    auto feeds = ScoreFeeds(1, 2, 3, 5, {1, 1, 3, 5}, 60);
    ExpectSame(fast.Run(feeds), plain.Run(feeds), "opset 11, axis 3");
    EXPECT_EQ(testing::ProfiledCalls(fast, "Softmax"), 0);
  }
  {  // The scaled scores are read by a graph output too: only the mask is folded (the Add reads them).
    Model m = ScaledSoftmaxModel(false, false, 17, -1, true);
    Session fast(m, on), plain(m, off);
    ASSERT_EQ(fast.product_rewrites().softmax_epilogues, 1);
    auto feeds = ScoreFeeds(1, 2, 3, 5, {1, 1, 3, 5}, 70);
    ExpectSame(fast.Run(feeds), plain.Run(feeds), "scaled scores as an output");
    EXPECT_EQ(testing::ProfiledCalls(fast, "Div"), 1);
    EXPECT_EQ(testing::ProfiledCalls(fast, "Softmax"), 0);
  }
}

// A SwiGLU MLP's gate as exporters write it: Mul(Mul(g, Sigmoid(g)), u) with the products before
// it; `swap` writes both Muls the other way round; `silu_out` makes the SiLU a graph output too
// (then only the Sigmoid folds, into a SiLU of its own); `no_gate` leaves the SiLU ungated.
Model SwiGLUModel(bool swap, bool silu_out = false, bool no_gate = false) {
  Graph g;
  g.inputs = {testing::FloatValue("x", {-1, 16}), testing::FloatValue("u", {-1, -1})};
  g.SetInitializer("wg", RandomFloat({16, 24}, 7));
  g.nodes.push_back(MakeNode("MatMul", {"x", "wg"}, {"g"}, "gate_proj"));
  g.nodes.push_back(MakeNode("Sigmoid", {"g"}, {"s"}, "sigmoid"));
  g.nodes.push_back(MakeNode("Mul", swap ? std::vector<std::string>{"s", "g"} : std::vector<std::string>{"g", "s"}, {"silu"},
                             "silu"));
  if (!no_gate)
    g.nodes.push_back(MakeNode("Mul", swap ? std::vector<std::string>{"u", "silu"} : std::vector<std::string>{"silu", "u"},
                               {"y"}, "gate"));
  g.outputs = {ValueInfo{no_gate ? "silu" : "y", DataType::kFloat}};
  if (silu_out && !no_gate) g.outputs.push_back(ValueInfo{"silu", DataType::kFloat});
  return MakeModel(std::move(g), 17);
}

TEST(ProductRewrite, SiLUGateIsOnePassAndBitIdentical) {
  SessionOptions on{.profile = true}, off;
  off.rewrite_products = false;
  for (bool swap : {false, true}) {
    Model m = SwiGLUModel(swap);
    Session fast(m, on), plain(m, off);
    ASSERT_EQ(fast.product_rewrites().silu_gates, 1);
    EXPECT_EQ(fast.product_rewrites().silus, 0);
    EXPECT_EQ(plain.product_rewrites().silu_gates, 0);
    int runs = 0;
    for (int64_t rows : {1, 3, 700}) {  // 700 x 24 elements: more than one task
      Tensor x = RandomFloat({rows, 16}, 90 + rows, -4.f, 4.f);
      if (rows == 3) {  // the sigmoid's saturated ends and non-finite gates
        x.data<float>()[0] = 200.f;
        x.data<float>()[1] = -200.f;
        x.data<float>()[2] = std::numeric_limits<float>::infinity();
        x.data<float>()[3] = std::numeric_limits<float>::quiet_NaN();
      }
      std::map<std::string, Tensor> feeds{{"x", x}, {"u", RandomFloat({rows, 24}, 91 + rows)}};
      ExpectSame(fast.Run(feeds), plain.Run(feeds), fmt::format("swap={} rows={}", swap, rows));
      ++runs;
    }
    EXPECT_EQ(testing::ProfiledCalls(fast, "SiLUGate"), runs);
    EXPECT_EQ(testing::ProfiledCalls(fast, "Sigmoid"), 0);  // no fallback ran
    EXPECT_EQ(testing::ProfiledCalls(fast, "Mul"), 0);
  }
  {  // An up that broadcasts: the fallback, same results.
    Model m = SwiGLUModel(false);
    Session fast(m, on), plain(m, off);
    std::map<std::string, Tensor> feeds{{"x", RandomFloat({5, 16}, 11)}, {"u", RandomFloat({1, 24}, 12)}};
    ExpectSame(fast.Run(feeds), plain.Run(feeds), "broadcast up");
    EXPECT_EQ(testing::ProfiledCalls(fast, "Sigmoid"), 1);
    EXPECT_EQ(testing::ProfiledCalls(fast, "Mul"), 2);
  }
  for (bool silu_out : {true, false}) {  // the SiLU read elsewhere, or not gated: SiLU alone
    Model m = SwiGLUModel(false, silu_out, !silu_out);
    Session fast(m, on), plain(m, off);
    EXPECT_EQ(fast.product_rewrites().silu_gates, 0);
    ASSERT_EQ(fast.product_rewrites().silus, 1);
    std::map<std::string, Tensor> feeds{{"x", RandomFloat({4, 16}, 13)}, {"u", RandomFloat({4, 24}, 14)}};
    ExpectSame(fast.Run(feeds), plain.Run(feeds), fmt::format("silu_out={}", silu_out));
    EXPECT_EQ(testing::ProfiledCalls(fast, "Sigmoid"), 0);
    EXPECT_EQ(testing::ProfiledCalls(fast, "Mul"), silu_out ? 1 : 0);
  }
}

// Attention as a decoder's export writes it: Q·Kᵀ over the key cache (repeated per query head
// with `gqa`; Concat(past, new) and a graph output with `append`), Div by sqrt(d), Add of a
// [b, 1, S, T] mask, Softmax, times the value cache. Nothing else reads the scores or the
// probabilities, so the three become one FusedAttention. With `heads_last`, a Transpose (perm 0 2 1
// 3) of the result to [b, S, H, d] is the output, as before an output projection.
Model MaskedAttentionModel(int64_t d, bool gqa, bool append, bool cast_probs = false, bool heads_last = false) {
  Graph g;
  const int64_t kv = gqa ? 2 : 4;
  g.inputs = {testing::FloatValue("q", {-1, 4, -1, d})};
  for (const char* c : {"k", "v"}) {
    const std::string x = c;
    if (append) {
      g.inputs.push_back(testing::FloatValue(x + "p", {-1, kv, -1, d}));
      g.inputs.push_back(testing::FloatValue(x + "n", {-1, kv, -1, d}));
      g.nodes.push_back(MakeNode("Concat", {x + "p", x + "n"}, {x + "c"}, x + "_concat", {testing::IntAttr("axis", 2)}));
    } else {
      g.inputs.push_back(testing::FloatValue(x + "c", {-1, kv, -1, d}));
    }
  }
  g.inputs.push_back(testing::FloatValue("mask", {-1, 1, -1, -1}));
  g.SetInitializer("c", Tensor::FromVector<float>({std::sqrt(static_cast<float>(d))}, {1}));
  std::string k = "kc", v = "vc";
  if (gqa) {
    g.SetInitializer("axes", Tensor::FromInt64s({2}));
    g.SetInitializer("eshape", Tensor::FromInt64s({1, 1, 2, 1, 1}));
    g.SetInitializer("rshape", Tensor::FromInt64s({0, 4, -1, d}));
    for (const char* c : {"k", "v"}) {
      const std::string x = c;
      g.nodes.push_back(MakeNode("Unsqueeze", {x + "c", "axes"}, {x + "u"}, x + "_unsqueeze"));
      g.nodes.push_back(MakeNode("Expand", {x + "u", "eshape"}, {x + "e"}, x + "_expand"));
      g.nodes.push_back(MakeNode("Reshape", {x + "e", "rshape"}, {x + "r"}, x + "_reshape"));
    }
    k = "kr";
    v = "vr";
  }
  g.nodes.push_back(MakeNode("Transpose", {k}, {"kt"}, "k_transpose", {IntsAttr("perm", {0, 1, 3, 2})}));
  g.nodes.push_back(MakeNode("MatMul", {"q", "kt"}, {"s"}, "qk"));
  g.nodes.push_back(MakeNode("Div", {"s", "c"}, {"sd"}, "scale"));
  g.nodes.push_back(MakeNode("Add", {"sd", "mask"}, {"sa"}, "add_mask"));
  g.nodes.push_back(MakeNode("Softmax", {"sa"}, {cast_probs ? "p32" : "p"}, "softmax", {testing::IntAttr("axis", -1)}));
  // Hugging Face's softmax(..., dtype=torch.float32).to(dtype) in a float32 model, as exported.
  if (cast_probs) g.nodes.push_back(MakeNode("Cast", {"p32"}, {"p"}, "cast_probs", {testing::IntAttr("to", 1)}));
  g.nodes.push_back(MakeNode("MatMul", {"p", v}, {heads_last ? "yh" : "y"}, "pv"));
  if (heads_last)
    g.nodes.push_back(MakeNode("Transpose", {"yh"}, {"y"}, "merge_heads", {IntsAttr("perm", {0, 2, 1, 3})}));
  g.outputs = {ValueInfo{"y", DataType::kFloat}};
  if (append) {
    g.outputs.push_back(ValueInfo{"kc", DataType::kFloat});
    g.outputs.push_back(ValueInfo{"vc", DataType::kFloat});
  }
  return MakeModel(std::move(g), 17);
}

// Feeds for MaskedAttentionModel: s new positions after `past`; the mask is causal (`masked`
// where a key comes after the query) and batch row 1 is left-padded by 3 positions.
std::map<std::string, Tensor> MaskedAttentionFeeds(int64_t d, bool gqa, bool append, int64_t b, int64_t s, int64_t past,
                                                   float masked, uint32_t seed) {
  const int64_t kv = gqa ? 2 : 4, t = past + s;
  std::map<std::string, Tensor> f = {{"q", RandomFloat({b, 4, s, d}, seed)}};
  for (const char* c : {"k", "v"}) {
    const std::string x = c;
    if (append) {
      f[x + "p"] = RandomFloat({b, kv, past, d}, ++seed);
      f[x + "n"] = RandomFloat({b, kv, s, d}, ++seed);
    } else {
      f[x + "c"] = RandomFloat({b, kv, t, d}, ++seed);
    }
  }
  Tensor m = Tensor::Uninitialized(DataType::kFloat, {b, 1, s, t});
  float* mp = m.data<float>();
  for (int64_t i = 0; i < b; ++i)
    for (int64_t r = 0; r < s; ++r)
      for (int64_t j = 0; j < t; ++j) mp[(i * s + r) * t + j] = j > past + r || (i == 1 && j < 3) ? masked : 0.f;
  f["mask"] = m;
  return f;
}

// Outputs equal within the products' rounding, NaN exactly where the original has NaN.
void ExpectCloseWithNaNs(const std::vector<Tensor>& a, const std::vector<Tensor>& b, double tol, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].shape(), b[i].shape()) << what;
    const std::vector<double> x = a[i].ToDoubles(), y = b[i].ToDoubles();
    for (size_t j = 0; j < x.size(); ++j) {
      ASSERT_EQ(std::isnan(x[j]), std::isnan(y[j])) << what << " output " << i << " element " << j;
      if (!std::isnan(y[j])) ASSERT_NEAR(x[j], y[j], tol * std::max(1.0, std::abs(y[j]))) << what << " output " << i << " element " << j;
    }
  }
}

// The heads merged back after attention (Transpose perm 0 2 1 3, read by it alone): the
// FusedAttention writes [b, S, H, d] itself, bit for bit the transposed output of the node without
// it, for prompts (blocks of rows), a few rows after a past (the decode path, then one copy) and one
// row (the same memory); the Transpose does not run.
TEST(ProductRewrite, AttentionWritesTheHeadsMergedLayoutItself) {
  for (const auto& [gqa, append] : std::vector<std::pair<bool, bool>>{{true, true}, {false, false}})
    for (int64_t d : {64, 48}) {
      const std::string form = fmt::format("gqa={} append={} d={}", gqa, append, d);
      SessionOptions on{.profile = true};
      Session merged(MaskedAttentionModel(d, gqa, append, false, true), on),
          apart(MaskedAttentionModel(d, gqa, append), on);
      ASSERT_EQ(merged.product_rewrites().attention_transposed, 1) << form;
      ASSERT_EQ(apart.product_rewrites().attention_transposed, 0) << form;
      uint32_t seed = 1300;
      for (const auto& [b, s, past] :
           std::vector<std::array<int64_t, 3>>{{1, 40, 0}, {2, 33, 7}, {2, 3, 9}, {1, 1, 20}, {2, 70, 0}}) {
        auto feeds = MaskedAttentionFeeds(d, gqa, append, b, s, past, -1e9f, seed += 7);
        const std::vector<Tensor> got = merged.Run(feeds), want = apart.Run(feeds);
        ASSERT_EQ(got.size(), want.size());
        ASSERT_EQ(got[0].shape(), (Shape{b, s, 4, d})) << form;
        const float* y = got[0].data<float>();
        const float* w = want[0].data<float>();
        for (int64_t i = 0; i < b; ++i)
          for (int64_t h = 0; h < 4; ++h)
            for (int64_t r = 0; r < s; ++r)
              ASSERT_EQ(0, std::memcmp(y + ((i * s + r) * 4 + h) * d, w + ((i * 4 + h) * s + r) * d, sizeof(float) * d))
                  << form << " b=" << b << " s=" << s << " past=" << past << " head " << h << " row " << r;
        for (size_t o = 1; o < got.size(); ++o)  // the present caches
          ASSERT_EQ(0, std::memcmp(got[o].data<float>(), want[o].data<float>(), got[o].nbytes())) << form;
      }
      EXPECT_EQ(testing::ProfiledCalls(merged, "Transpose"), 0) << form;
      EXPECT_EQ(testing::ProfiledCalls(merged, "FusedAttention"), 5) << form;
    }
}

TEST(ProductRewrite, AttentionRunsAsOneNodeAndSkipsOnlyKeysWhoseProbabilityIsZero) {
  const float lowest = std::numeric_limits<float>::lowest(), inf = std::numeric_limits<float>::infinity();
  for (const auto& [gqa, append] : std::vector<std::pair<bool, bool>>{{true, true}, {false, false}, {true, false}})
    for (int64_t d : {64, 48}) {
      const std::string form = fmt::format("gqa={} append={} d={}", gqa, append, d);
      Model m = MaskedAttentionModel(d, gqa, append);
      SessionOptions on{.profile = true}, off;
      off.rewrite_products = false;
      Session fast(m, on), plain(m, off);
      ASSERT_EQ(fast.product_rewrites().attention_blocks, 1) << form;
      EXPECT_EQ(plain.product_rewrites().attention_blocks, 0);
      uint32_t seed = 900;
      int runs = 0;
      // Prompts (blocks of rows, the causal tail skipped), a prompt after a past, a decode step
      // (the parts one after another); masks of the lowest float, -inf and -1e9.
      for (const auto& [b, s, past] : std::vector<std::array<int64_t, 3>>{{1, 40, 0}, {2, 33, 7}, {1, 1, 20}, {2, 70, 0}})
        for (float masked : {lowest, -inf, -1e9f}) {
          auto feeds = MaskedAttentionFeeds(d, gqa, append, b, s, past, masked, seed += 7);
          ExpectCloseWithNaNs(fast.Run(feeds), plain.Run(feeds), 1e-5,
                              fmt::format("{} b={} s={} past={} masked={}", form, b, s, past, masked));
          ++runs;
        }
      // A mask of -1e4 over keys whose scores are larger still: the original's probabilities
      // there are not 0, so the bound keeps those columns.
      {
        auto feeds = MaskedAttentionFeeds(d, gqa, append, 1, 64, 0, -1e4f, seed += 7);  // rows 0-31 skip 32-63
        Tensor& k = feeds.count("kn") ? feeds["kn"] : feeds["kc"];
        Tensor& q = feeds["q"];
        std::fill(q.data<float>(), q.data<float>() + q.numel(), 1.f);
        float* kp = k.data<float>();
        const int64_t t = k.dim(2);
        for (int64_t h = 0; h < k.dim(1); ++h)
          for (int64_t j = t - 8; j < t; ++j) std::fill(kp + (h * t + j) * d, kp + (h * t + j + 1) * d, 5000.f);
        ExpectCloseWithNaNs(fast.Run(feeds), plain.Run(feeds), 1e-5, form + " large masked scores");
        ++runs;
      }
      // A NaN in the value cache under the causal mask: 0 * NaN is NaN in the original, so the
      // masked keys are not skipped and the NaNs are the same.
      {
        auto feeds = MaskedAttentionFeeds(d, gqa, append, 1, 64, 0, lowest, seed += 7);
        Tensor& v = feeds.count("vn") ? feeds["vn"] : feeds["vc"];
        v.data<float>()[v.numel() - 1] = std::numeric_limits<float>::quiet_NaN();
        ExpectCloseWithNaNs(fast.Run(feeds), plain.Run(feeds), 1e-5, form + " NaN value");
        ++runs;
      }
      EXPECT_EQ(testing::ProfiledCalls(fast, "FusedAttention"), runs) << form;
      EXPECT_EQ(testing::ProfiledCalls(fast, "MatMul"), 0) << form;  // no fallback graph ran
      EXPECT_EQ(testing::ProfiledCalls(fast, "Softmax"), 0) << form;
    }
}

// Decode steps and a few query positions (fewer than the prompt path's 16) run the three parts per
// cache head in one region: at 1 thread, at 2 (a task per cache head) and at 4 (more threads than
// cache heads: each head's query heads split between tasks, its present copied once).
TEST(ProductRewrite, DecodeAttentionRunsEachCacheHeadInOneTask) {
  const float lowest = std::numeric_limits<float>::lowest();
  for (int threads : {1, 2, 4, 8})
    for (const auto& [gqa, append] : std::vector<std::pair<bool, bool>>{{true, true}, {false, true}, {true, false}})
      for (int64_t d : {64, 48}) {
        const std::string form = fmt::format("threads={} gqa={} append={} d={}", threads, gqa, append, d);
        Model m = MaskedAttentionModel(d, gqa, append);
        SessionOptions on{.profile = true}, off;
        on.num_threads = threads;
        off.rewrite_products = false;
        Session fast(m, on), plain(m, off);
        ASSERT_EQ(fast.product_rewrites().attention_blocks, 1) << form;
        uint32_t seed = 1300;
        int runs = 0;
        for (const auto& [b, s, past] :
             std::vector<std::array<int64_t, 3>>{{1, 1, 20}, {1, 1, 0}, {1, 3, 40}, {2, 1, 300}, {1, 15, 2}, {2, 2, 65},
                                                 // long caches: fewer cache heads than threads split the keys
                                                 {1, 1, 1300}, {1, 2, 700}, {2, 1, 530}}) {
          auto feeds = MaskedAttentionFeeds(d, gqa, append, b, s, past, lowest, seed += 7);
          ExpectCloseWithNaNs(fast.Run(feeds), plain.Run(feeds), 1e-5,
                              fmt::format("{} b={} s={} past={}", form, b, s, past));
          ++runs;
        }
        EXPECT_EQ(testing::ProfiledCalls(fast, "FusedAttention"), runs) << form;
        EXPECT_EQ(testing::ProfiledCalls(fast, "MatMul"), 0) << form;
        EXPECT_EQ(testing::ProfiledCalls(fast, "Softmax"), 0) << form;
      }
}

// torch.onnx.export's Hugging Face attention casts the probabilities to float before the values
// product: the Cast joins the attention node (a prompt, decode steps, a long cache split across
// threads), and the results are the graph's.
TEST(ProductRewrite, AttentionTakesTheCastOfItsProbabilitiesToFloat) {
  for (int threads : {1, 4}) {
    Model m = MaskedAttentionModel(64, /*gqa=*/true, /*append=*/true, /*cast_probs=*/true);
    SessionOptions on{.profile = true}, off;
    on.num_threads = threads;
    off.rewrite_products = false;
    Session fast(m, on), plain(m, off);
    ASSERT_EQ(fast.product_rewrites().attention_blocks, 1);
    uint32_t seed = 5200;
    for (const auto& [b, s, past] : std::vector<std::array<int64_t, 3>>{{1, 1, 20}, {1, 20, 0}, {1, 1, 900}, {2, 2, 65}}) {
      auto feeds = MaskedAttentionFeeds(64, true, true, b, s, past, std::numeric_limits<float>::lowest(), seed += 7);
      ExpectCloseWithNaNs(fast.Run(feeds), plain.Run(feeds), 1e-5,
                          fmt::format("threads={} b={} s={} past={}", threads, b, s, past));
    }
    EXPECT_EQ(testing::ProfiledCalls(fast, "FusedAttention"), 4);
    EXPECT_EQ(testing::ProfiledCalls(fast, "Cast"), 0);
  }
}

// A generation's decode steps (Run's cache_room, as Generate runs them): the attention keeps each
// present cache in storage with room and appends the new rows in place; across 80 steps (past 5
// to 85: the first room of 64 rows runs out, so the storage grows once; and past 600 to 680 with
// the keys split across threads) the outputs equal the
// unrewritten graph's, the caches equal its presents, and most steps reuse the past's storage.
// A past appended to twice keeps its first present intact (the second append copies); a run
// without cache_room hands out contiguous tensors, and a padded cache fed to a graph whose
// kernels read it whole reaches them as a contiguous copy.
TEST(ProductRewrite, DecodeCachesAppendInPlaceWithRoomAndStayCorrect) {
  struct Form {
    bool gqa;
    int64_t b, past;
    int threads;
  };
  // The last: 2 cache heads on 4 threads over 600 rows and more, the keys split (DecodeStepsSplit).
  for (const auto& [gqa, b, past0, threads] : std::vector<Form>{{true, 1, 5, 2}, {false, 2, 5, 2}, {true, 1, 600, 4}}) {
    const int64_t d = 64, kv = gqa ? 2 : 4;
    const std::string form = fmt::format("gqa={} b={} past={} threads={}", gqa, b, past0, threads);
    Model m = MaskedAttentionModel(d, gqa, /*append=*/true);
    SessionOptions on, off;
    on.num_threads = threads;
    off.rewrite_products = false;
    Session fast(m, on), plain(m, off);
    ASSERT_EQ(fast.product_rewrites().attention_blocks, 1) << form;
    uint32_t seed = 4100;
    std::map<std::string, Tensor> feeds = MaskedAttentionFeeds(d, gqa, true, b, 1, past0, 0.f, seed);
    std::map<std::string, Tensor> ref = feeds;
    const void* last = nullptr;
    int same_storage = 0, padded = 0;
    Tensor kept_past, kept_present, kept_values;
    for (int step = 0; step < 80; ++step) {
      const std::vector<Tensor> got = fast.Run(feeds, {}, /*cache_room=*/true);
      const std::vector<Tensor> want = plain.Run(ref);
      const std::string at = fmt::format("{} step {}", form, step);
      ASSERT_EQ(got.size(), 3u) << at;
      ExpectCloseWithNaNs({got[0], got[1].Dense(), got[2].Dense()}, want, 1e-5, at);
      same_storage += got[1].cache_data<float>() == last;
      padded += got[1].padded();
      last = got[1].cache_data<float>();
      if (step == 40) {
        kept_past = feeds["kp"];
        kept_present = got[1];
        kept_values = got[1].Dense().Clone();
      }
      // The next step: the presents become the pasts, one new row and query each.
      const int64_t t = got[1].dim(2);
      feeds["kp"] = got[1];
      feeds["vp"] = got[2];
      ref["kp"] = want[1];
      ref["vp"] = want[2];
      for (auto* f : {&feeds, &ref}) {
        (*f)["q"] = RandomFloat({b, 4, 1, d}, seed + 1);
        (*f)["kn"] = RandomFloat({b, kv, 1, d}, seed + 2);
        (*f)["vn"] = RandomFloat({b, kv, 1, d}, seed + 3);
        (*f)["mask"] = Tensor(DataType::kFloat, {b, 1, 1, t + 1});
      }
      seed += 3;
    }
    // 80 steps: new storage after the first (a dense past) and (past 5) once more when the room
    // of 64 rows runs out; past 600 has room for 300.
    EXPECT_GE(same_storage, 77) << form;
    EXPECT_GE(padded, 70) << form;

    // The step-40 past appended to again: the rows it had given to step 40's present are taken,
    // so this present is a copy, and step 40's present keeps its values.
    std::map<std::string, Tensor> again = feeds;
    again["kp"] = kept_past;
    again["vp"] = kept_past;
    again["mask"] = Tensor(DataType::kFloat, {b, 1, 1, kept_past.dim(2) + 1});
    const std::vector<Tensor> second = fast.Run(again, {}, true);
    EXPECT_NE(second[1].cache_data<float>(), kept_present.cache_data<float>()) << form;
    ExpectCloseWithNaNs({kept_present.Dense()}, {kept_values}, 0, form + " kept present");
    std::map<std::string, Tensor> again_ref = again;
    again_ref["kp"] = kept_past.Dense();
    again_ref["vp"] = kept_past.Dense();
    ExpectCloseWithNaNs({second[0], second[1].Dense()}, {plain.Run(again_ref)[0], plain.Run(again_ref)[1]}, 1e-5,
                        form + " second append");

    // Without cache_room: contiguous outputs. The unrewritten graph given padded caches (its
    // Concat reads them whole) gets contiguous copies and the same values.
    const std::vector<Tensor> plain_out = fast.Run(feeds);
    for (const Tensor& t : plain_out) EXPECT_FALSE(t.padded()) << form;
    if (b * kv > 1) {
      ASSERT_TRUE(feeds["kp"].padded()) << form;
      EXPECT_THROW(feeds["kp"].data<float>(), Error) << form;
    }
    ExpectCloseWithNaNs(plain.Run(feeds), plain.Run(ref), 0, form + " padded feeds to the plain graph");
    ExpectCloseWithNaNs(plain_out, plain.Run(ref), 1e-5, form + " without cache_room");
  }
}

// RMSNorm as exporters write it, in the forms the rewrite takes: `form` 0 Div(1, s) then Mul,
// 1 Reciprocal then Mul, 2 Div(X, s); `mul_square` squares by Mul(X, X); `opset` 18 gives the
// axes as an input; `weight` [n] (or absent: empty).
Model RMSNormModel(int form, bool mul_square, int64_t opset, std::vector<float> weight, int64_t axis = -1) {
  Graph g;
  g.inputs = {testing::FloatValue("x", {-1, -1, -1})};
  g.SetInitializer("two", Tensor::FromVector<float>({2.f}, {}));
  g.SetInitializer("one", Tensor::FromVector<float>({1.f}, {}));
  g.SetInitializer("eps", Tensor::FromVector<float>({1e-6f}, {}));
  g.nodes.push_back(mul_square ? MakeNode("Mul", {"x", "x"}, {"sq"}, "square") : MakeNode("Pow", {"x", "two"}, {"sq"}, "pow"));
  if (opset >= 18) {
    g.SetInitializer("axes", Tensor::FromInt64s({axis}));
    g.nodes.push_back(MakeNode("ReduceMean", {"sq", "axes"}, {"m"}, "mean"));
  } else {
    g.nodes.push_back(MakeNode("ReduceMean", {"sq"}, {"m"}, "mean", {IntsAttr("axes", {axis})}));
  }
  g.nodes.push_back(MakeNode("Add", {"eps", "m"}, {"v"}, "add_eps"));
  g.nodes.push_back(MakeNode("Sqrt", {"v"}, {"s"}, "sqrt"));
  const std::string normed = weight.empty() ? "y" : "n";
  if (form == 0) {
    g.nodes.push_back(MakeNode("Div", {"one", "s"}, {"r"}, "recip"));
    g.nodes.push_back(MakeNode("Mul", {"r", "x"}, {normed}, "scale"));
  } else if (form == 1) {
    g.nodes.push_back(MakeNode("Reciprocal", {"s"}, {"r"}, "recip"));
    g.nodes.push_back(MakeNode("Mul", {"x", "r"}, {normed}, "scale"));
  } else {
    g.nodes.push_back(MakeNode("Div", {"x", "s"}, {normed}, "scale"));
  }
  if (!weight.empty()) {
    g.SetInitializer("w", Tensor::FromVector<float>(weight, {static_cast<int64_t>(weight.size())}));
    g.nodes.push_back(MakeNode("Mul", {"w", "n"}, {"y"}, "weight"));
  }
  g.outputs = {ValueInfo{"y", DataType::kFloat}};
  return MakeModel(std::move(g), opset);
}

TEST(ProductRewrite, RMSNormIsOnePassAndBitIdentical) {
  for (int form : {0, 1, 2})
    for (bool mul_square : {false, true})
      for (int64_t opset : {17, 18})
        for (bool weighted : {true, false}) {
          const int64_t n = 40;
          std::vector<float> w;
          if (weighted)
            for (int64_t i = 0; i < n; ++i) w.push_back(0.5f + 0.03f * static_cast<float>(i));
          const std::string what = fmt::format("form={} mul_square={} opset={} weighted={}", form, mul_square, opset, weighted);
          Model m = RMSNormModel(form, mul_square, opset, w);
          SessionOptions on{.profile = true}, off;
          off.rewrite_products = false;
          Session fast(m, on), plain(m, off);
          ASSERT_EQ(fast.product_rewrites().rms_norms, 1) << what;
          EXPECT_EQ(plain.product_rewrites().rms_norms, 0);
          int runs = 0;
          for (const Shape& shape : std::vector<Shape>{{1, 7, n}, {2, 300, n}, {1, 1, n}}) {
            if (!weighted) {  // other row lengths too
              Shape other = shape;
              other.back() = 1023;
              Tensor x = RandomFloat(other, 77 + runs, -30.f, 30.f);
              ExpectSame(fast.Run({{"x", x}}), plain.Run({{"x", x}}), what + " n=1023");
              ++runs;
            }
            Tensor x = RandomFloat(shape, 50 + runs, -3.f, 3.f);
            x.data<float>()[0] = 0.f;
            ExpectSame(fast.Run({{"x", x}}), plain.Run({{"x", x}}), what);
            ++runs;
          }
          // An all-zero row (the mean is 0, eps alone keeps it finite) and a row with an infinity.
          Tensor z = Tensor::FromVector<float>(std::vector<float>(2 * n, 0.f), {1, 2, n});
          z.data<float>()[n + 3] = std::numeric_limits<float>::infinity();
          ExpectSame(fast.Run({{"x", z}}), plain.Run({{"x", z}}), what + " zero and inf rows");
          ++runs;
          EXPECT_EQ(testing::ProfiledCalls(fast, "RMSNorm"), runs) << what;
          EXPECT_EQ(testing::ProfiledCalls(fast, "ReduceMean"), 0) << what;  // no fallback ran
        }
  // Outside the form at run time: a ReduceMean over the first axis, a weight of other length.
  Model first = RMSNormModel(0, false, 17, {}, 0);
  Model mismatched = RMSNormModel(0, false, 17, std::vector<float>(40, 0.5f));
  SessionOptions on{.profile = true}, off;
  off.rewrite_products = false;
  for (Model* m : {&first, &mismatched}) {
    Session fast(*m, on), plain(*m, off);
    ASSERT_EQ(fast.product_rewrites().rms_norms, 1);
    Tensor x = RandomFloat({1, 3, m == &first ? 16 : 1}, 5);
    ExpectSame(fast.Run({{"x", x}}), plain.Run({{"x", x}}), m == &first ? "axis 0" : "weight of 40 over 1");
    EXPECT_EQ(testing::ProfiledCalls(fast, "ReduceMean"), 1);  // the fallback ran
  }
}

// Rotary embedding as torch.onnx.export writes HF's rotate_half: Add(Mul(x, cos),
// Mul(Concat(Neg(Slice(x, h, end)), Slice(x, 0, h)), sin)); `swapped` writes the Muls and the Add
// with their operands the other way round; `end` is the second Slice's end.
// `dynamic`: the half computed from x's shape, twice, as torch.onnx.export writes x.shape[-1] // 2
// (h is then unused). `transposed`: x = Transpose(t, [0, 2, 1, 3]) of an input t [b, s, heads, d],
// as the projected queries and keys are ([b, heads, s, d]).
Model RotaryModel(bool swapped, int64_t h, int64_t end, bool dynamic = false, bool transposed = false) {
  Graph g;
  g.inputs = {testing::FloatValue(transposed ? "t" : "x", {-1, -1, -1, -1}), testing::FloatValue("cos", {-1, -1, -1}),
              testing::FloatValue("sin", {-1, -1, -1})};
  if (transposed) {
    Attribute perm;
    perm.name = "perm";
    perm.type = Attribute::Type::kInts;
    perm.ints = {0, 2, 1, 3};
    g.nodes.push_back(MakeNode("Transpose", {"t"}, {"x"}, "transpose", {perm}));
  }
  g.SetInitializer("zero", Tensor::FromInt64s({0}));
  g.SetInitializer("end", Tensor::FromInt64s({end}));
  g.SetInitializer("axis", Tensor::FromInt64s({-1}));
  std::string h1 = "half", h2 = "half";
  if (dynamic) {
    g.SetInitializer("last", Tensor::Scalar<int64_t>(-1));
    g.SetInitializer("two", Tensor::Scalar<int64_t>(2));
    g.SetInitializer("axes0", Tensor::FromInt64s({0}));
    g.nodes.push_back(MakeNode("Shape", {"x"}, {"xs"}, "shape"));
    g.nodes.push_back(MakeNode("Gather", {"xs", "last"}, {"xd"}, "gather", {testing::IntAttr("axis", 0)}));
    g.nodes.push_back(MakeNode("Div", {"xd", "two"}, {"xh"}, "div"));
    g.nodes.push_back(MakeNode("Unsqueeze", {"xh", "axes0"}, {"h1"}, "unsqueeze_1"));
    g.nodes.push_back(MakeNode("Unsqueeze", {"xh", "axes0"}, {"h2"}, "unsqueeze_2"));
    h1 = "h1";
    h2 = "h2";
  } else {
    g.SetInitializer("half", Tensor::FromInt64s({h}));
  }
  g.nodes.push_back(MakeNode("Mul", swapped ? std::vector<std::string>{"cos", "x"} : std::vector<std::string>{"x", "cos"},
                             {"a"}, "mul_cos"));
  g.nodes.push_back(MakeNode("Slice", {"x", "zero", h1, "axis"}, {"x1"}, "slice_1"));
  g.nodes.push_back(MakeNode("Slice", {"x", h2, "end", "axis"}, {"x2"}, "slice_2"));
  g.nodes.push_back(MakeNode("Neg", {"x2"}, {"nx2"}, "neg"));
  g.nodes.push_back(MakeNode("Concat", {"nx2", "x1"}, {"rot"}, "concat", {testing::IntAttr("axis", -1)}));
  g.nodes.push_back(MakeNode("Mul", swapped ? std::vector<std::string>{"sin", "rot"} : std::vector<std::string>{"rot", "sin"},
                             {"b"}, "mul_sin"));
  g.nodes.push_back(MakeNode("Add", swapped ? std::vector<std::string>{"b", "a"} : std::vector<std::string>{"a", "b"}, {"y"}, "add"));
  g.outputs = {ValueInfo{"y", DataType::kFloat}};
  return MakeModel(std::move(g), 17);
}

// With x a Transpose of the input (as the projected queries and keys are), the rotary reads the
// input's rows where they are: no Transpose runs, and the Shape the dynamic half is computed from
// becomes TransposeShape of the input.
TEST(ProductRewrite, RotaryHalfIsOnePassAndBitIdentical) {
  for (bool transposed : {false, true})
  for (bool dynamic : {false, true})
  for (bool swapped : {false, true})
    for (int64_t h : {32, 5}) {
      const std::string what = fmt::format("transposed={} dynamic={} swapped={} h={}", transposed, dynamic, swapped, h);
      Model m = RotaryModel(swapped, h, std::numeric_limits<int64_t>::max(), dynamic, transposed);
      SessionOptions on{.profile = true}, off;
      off.rewrite_products = false;
      Session fast(m, on), plain(m, off);
      ASSERT_EQ(fast.product_rewrites().rotaries, 1) << what;
      EXPECT_EQ(fast.product_rewrites().rotaries_transposed, transposed ? 1 : 0) << what;
      EXPECT_EQ(plain.product_rewrites().rotaries, 0);
      // x's shape [b, heads, S, d]; the input t is [b, S, heads, d] when transposed.
      auto input = [&](Shape xs, uint32_t seed, float lo, float hi) {
        if (transposed) std::swap(xs[1], xs[2]);
        return std::map<std::string, Tensor>::value_type{transposed ? "t" : "x", RandomFloat(xs, seed, lo, hi)};
      };
      int runs = 0;
      // cos and sin [1, S, d] broadcast over [b, heads, S, d] (per position), or one row for all.
      for (const auto& [xs, cs] : std::vector<std::pair<Shape, Shape>>{
               {{1, 4, 7, 2 * h}, {1, 7, 2 * h}}, {{2, 3, 1, 2 * h}, {1, 1, 2 * h}}, {{1, 2, 300, 2 * h}, {1, 300, 2 * h}}}) {
        auto feeds = std::map<std::string, Tensor>{input(xs, 40 + runs, -50.f, 50.f),
                                                   {"cos", RandomFloat(cs, 41 + runs)},
                                                   {"sin", RandomFloat(cs, 42 + runs)}};
        ExpectSame(fast.Run(feeds), plain.Run(feeds), what);
        ++runs;
      }
      EXPECT_EQ(testing::ProfiledCalls(fast, "RotaryHalf"), runs) << what;
      EXPECT_EQ(testing::ProfiledCalls(fast, "Concat"), 0) << what;  // no fallback ran
      EXPECT_EQ(testing::ProfiledCalls(fast, "Transpose"), 0) << what;
      EXPECT_EQ(testing::ProfiledCalls(fast, "TransposeShape"), transposed && dynamic ? runs : 0) << what;
      // An x whose last axis is not 2h (the Slices cut it unevenly): the original operators.
      // (A half computed from the shape is half of any even axis: there, an odd one.)
      const int64_t uneven = dynamic ? 2 * h + 1 : 2 * h + 2;
      auto odd = std::map<std::string, Tensor>{input({1, 1, 2, uneven}, 9, -1.f, 1.f),
                                               {"cos", RandomFloat({1, 2, uneven}, 10)},
                                               {"sin", RandomFloat({1, 2, uneven}, 11)}};
      ExpectSame(fast.Run(odd), plain.Run(odd), what + " uneven");
      EXPECT_EQ(testing::ProfiledCalls(fast, "Concat"), 1) << what;
    }
  // A second Slice that stops short of the end is not rotate_half: left alone.
  Session cut(RotaryModel(false, 8, 12));
  EXPECT_EQ(cut.product_rewrites().rotaries, 0);
}

}  // namespace
}  // namespace gaf

namespace gaf {
namespace {

// A fused model's calls: "Sib" takes the query/key-like products of one input (the plan makes
// them one SiblingMatMul on packed weights, which a kernel for the call cannot match), "SibRelu"
// the same plus a Relu the plan leaves alone, "Act" a Relu alone. Only "Sib" is the plan's: a
// session offered a kernel for every call declines that one (saying why) and runs the others'.
TEST(ProductRewrite, CallsThePlanRunsBetterAreInlinedAndTheirKernelsDeclined) {
  const int64_t K = 64, N = 48;
  Graph g;
  g.inputs = {testing::FloatValue("x", {4, K})};
  for (const char* w : {"w0", "w1", "w2", "w3"})
    g.SetInitializer(w, testing::RandomFloat({K, N}, static_cast<uint32_t>(w[1]), -0.1f, 0.1f));
  auto call = [](const std::string& op, std::vector<std::string> ins, std::vector<std::string> outs) {
    Node n = testing::MakeNode(op, std::move(ins), std::move(outs), op + "_call");
    n.domain = "local";
    return n;
  };
  g.nodes.push_back(call("Sib", {"x", "w0", "w1"}, {"q", "k"}));
  g.nodes.push_back(call("SibRelu", {"x", "w2", "w3"}, {"g", "u"}));
  g.nodes.push_back(call("Act", {"q"}, {"r"}));
  for (const char* o : {"k", "g", "u", "r"}) g.outputs.push_back(ValueInfo{o, DataType::kFloat});
  Model m = testing::MakeModel(std::move(g));
  m.opset_imports.push_back({"local", 1});
  auto fn = [&m](const std::string& name, std::vector<Node> nodes) {
    Function f;
    f.name = name;
    f.domain = "local";
    f.inputs = name == "Act" ? std::vector<std::string>{"a"} : std::vector<std::string>{"a", "b", "c"};
    f.outputs = name == "Act" ? std::vector<std::string>{"y"} : std::vector<std::string>{"y", "z"};
    f.nodes = std::move(nodes);
    f.opset_imports.push_back({"", 17});
    m.functions.push_back(std::move(f));
  };
  fn("Sib", {testing::MakeNode("MatMul", {"a", "b"}, {"y"}, "p0"), testing::MakeNode("MatMul", {"a", "c"}, {"z"}, "p1")});
  fn("SibRelu", {testing::MakeNode("MatMul", {"a", "b"}, {"t"}, "p0"), testing::MakeNode("Relu", {"t"}, {"y"}, "act"),
                 testing::MakeNode("MatMul", {"a", "c"}, {"z"}, "p1")});
  fn("Act", {testing::MakeNode("Relu", {"a"}, {"y"}, "act")});

  const std::map<std::string, std::string> planned = CallsThePlanRewrites(m, /*group_siblings=*/true);
  ASSERT_EQ(planned.size(), 1u);
  EXPECT_EQ(planned.begin()->first, "q");  // the call's first output
  EXPECT_NE(planned.begin()->second.find("SiblingMatMul"), std::string::npos) << planned.begin()->second;
  EXPECT_TRUE(CallsThePlanRewrites(m, /*group_siblings=*/false).empty());

  // Kernels offered for every call: each runs the call's body (correct results) and counts.
  std::map<std::string, int> ran, declined;
  std::string why;
  std::map<std::string, Graph> bodies;  // the session keeps a plan per graph: they must outlive it
  for (const Function& f : m.functions) bodies[f.name] = FunctionBodyGraph(f);
  SessionOptions so;
  so.function_kernels = [&](const Node& n, const Function&) -> std::optional<KernelInfo> {
    KernelInfo k;
    k.domain = n.domain;
    k.op_type = n.op_type;
    const std::string op = n.op_type;
    const Graph* body = &bodies.at(op);
    k.fn = [&ran, op, body](KernelContext& ctx) {
      ++ran[op];
      std::vector<Tensor> ins;
      for (const Tensor* t : ctx.inputs) ins.push_back(*t);
      std::vector<Tensor> outs = ctx.subgraphs->RunSubgraph(*body, ins);
      for (size_t i = 0; i < ctx.outputs.size(); ++i) ctx.outputs[i] = outs[i];
    };
    k.declined = [&declined, &why, op](const std::string& w) {
      ++declined[op];
      why = w;
    };
    return k;
  };
  Session fused(m, so);
  Session plain(m);
  const std::map<std::string, Tensor> feeds{{"x", testing::RandomFloat({4, K}, 7)}};
  std::vector<Tensor> got = fused.Run(feeds), want = plain.Run(feeds);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].shape(), want[i].shape()) << i;
    for (int64_t e = 0; e < want[i].numel(); ++e)
      ASSERT_NEAR(got[i].data<float>()[e], want[i].data<float>()[e], 1e-5f) << i << " at " << e;
  }
  EXPECT_EQ(declined, (std::map<std::string, int>{{"Sib", 1}}));
  EXPECT_NE(why.find("SiblingMatMul"), std::string::npos) << why;
  EXPECT_EQ(ran, (std::map<std::string, int>{{"SibRelu", 1}, {"Act", 1}}));
  EXPECT_EQ(fused.product_rewrites().sibling_groups, 1);

  // Without the plan's rewrites every kernel runs.
  ran.clear();
  declined.clear();
  so.rewrite_products = false;
  Session unplanned(m, so);
  unplanned.Run(feeds);
  EXPECT_TRUE(declined.empty());
  EXPECT_EQ(ran, (std::map<std::string, int>{{"Sib", 1}, {"SibRelu", 1}, {"Act", 1}}));
}

// A call whose operators the plan replaces only together with another call's (here one product
// of x, whose sibling is in a call that keeps a Relu) is not the plan's: inlined alone it would
// run as a plain MatMul, so it keeps its kernel.
TEST(ProductRewrite, CallsThePlanRewritesOnlyWithAnotherCallKeepTheirKernels) {
  const int64_t K = 64, N = 48;
  Graph g;
  g.inputs = {testing::FloatValue("x", {4, K})};
  for (const char* w : {"w0", "w1"})
    g.SetInitializer(w, testing::RandomFloat({K, N}, static_cast<uint32_t>(w[1]), -0.1f, 0.1f));
  for (const auto& [op, w, out] : std::vector<std::array<std::string, 3>>{{"P", "w0", "p"}, {"PRelu", "w1", "r"}}) {
    Node n = testing::MakeNode(op, {"x", w}, {out}, op + "_call");
    n.domain = "local";
    g.nodes.push_back(n);
    g.outputs.push_back(ValueInfo{out, DataType::kFloat});
  }
  Model m = testing::MakeModel(std::move(g));
  m.opset_imports.push_back({"local", 1});
  for (const std::string name : {"P", "PRelu"}) {
    Function f;
    f.name = name;
    f.domain = "local";
    f.inputs = {"a", "b"};
    f.outputs = {"y"};
    if (name == "P") {
      f.nodes = {testing::MakeNode("MatMul", {"a", "b"}, {"y"}, "p")};
    } else {
      f.nodes = {testing::MakeNode("MatMul", {"a", "b"}, {"t"}, "p"), testing::MakeNode("Relu", {"t"}, {"y"}, "act")};
    }
    f.opset_imports.push_back({"", 17});
    m.functions.push_back(f);
  }
  // Both inlined, the two products are siblings, and all of P would be the plan's; with PRelu
  // kept as a call (the Relu is left), P's product has no sibling.
  EXPECT_TRUE(CallsThePlanRewrites(m, /*group_siblings=*/true).empty());
}

}  // namespace
}  // namespace gaf
