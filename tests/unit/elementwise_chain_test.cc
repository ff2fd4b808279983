// Chains of elementwise operators in one pass (runtime/plan_rewrite_chains.cc ->
// ops/elementwise_chain.cc): an exporter's tanh-GELU after a bias Add, an erf-GELU, a residual Add
// of a bias Add. Results must be bit-identical to the operators run one by one (the session
// without plan rewrites), for full, scalar and row (bias) operands, non-finite values and sizes
// over several tasks; shapes the kernel does not take run the original operators; an intermediate
// value read elsewhere ends a chain; a hostile program is refused with a clear error.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>

#include "runtime/session.h"
#include "test_util.h"

namespace gaf {
namespace {

using testing::MakeModel;
using testing::MakeNode;
using testing::RandomFloat;

void ExpectBitsEqual(const std::vector<Tensor>& a, const std::vector<Tensor>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].shape(), b[i].shape()) << what;
    const float* x = a[i].data<float>();
    const float* y = b[i].data<float>();
    for (int64_t j = 0; j < a[i].numel(); ++j) {
      uint32_t u, v;
      std::memcpy(&u, x + j, 4);
      std::memcpy(&v, y + j, 4);
      ASSERT_EQ(u, v) << what << " output " << i << " element " << j << ": " << x[j] << " vs " << y[j];
    }
  }
}

// h = x + bias ([N] row); y = 0.5 * h * (1 + tanh(c * (h + 0.044715 * h * h * h))) as
// torch.onnx.export writes GPT-2's MLP activation; with `erf`, y = h * 0.5 * (1 + erf(h / sqrt 2))
// (BERT's). With `h_out`, h is a graph output as well.
Model GeluModel(bool erf, int64_t n, bool h_out = false) {
  Graph g;
  g.inputs = {testing::FloatValue("x", {-1, -1, n})};
  g.SetInitializer("bias", RandomFloat({n}, 7, -1.f, 1.f));
  auto scalar = [&](const char* name, float v) { g.SetInitializer(name, Tensor::FromVector<float>({v}, {})); };
  g.nodes.push_back(MakeNode("Add", {"bias", "x"}, {"h"}, "bias_add"));
  if (erf) {
    scalar("rsqrt2", 1.4142135f);
    scalar("one", 1.f);
    scalar("half", 0.5f);
    g.nodes.push_back(MakeNode("Div", {"h", "rsqrt2"}, {"d"}, "div"));
    g.nodes.push_back(MakeNode("Erf", {"d"}, {"e"}, "erf"));
    g.nodes.push_back(MakeNode("Add", {"e", "one"}, {"a"}, "add1"));
    g.nodes.push_back(MakeNode("Mul", {"h", "a"}, {"m"}, "mul"));
    g.nodes.push_back(MakeNode("Mul", {"m", "half"}, {"y"}, "mul_half"));
  } else {
    scalar("c1", 0.044715f);
    scalar("c2", 0.7978846f);
    scalar("one", 1.f);
    scalar("half", 0.5f);
    g.nodes.push_back(MakeNode("Mul", {"h", "h"}, {"h2"}, "sq"));
    g.nodes.push_back(MakeNode("Mul", {"h", "h2"}, {"h3"}, "cube"));
    g.nodes.push_back(MakeNode("Mul", {"c1", "h3"}, {"t1"}, "c1"));
    g.nodes.push_back(MakeNode("Add", {"h", "t1"}, {"t2"}, "inner"));
    g.nodes.push_back(MakeNode("Mul", {"c2", "t2"}, {"t3"}, "c2"));
    g.nodes.push_back(MakeNode("Tanh", {"t3"}, {"t4"}, "tanh"));
    g.nodes.push_back(MakeNode("Add", {"one", "t4"}, {"t5"}, "one_plus"));
    g.nodes.push_back(MakeNode("Mul", {"h", "t5"}, {"t6"}, "times_h"));
    g.nodes.push_back(MakeNode("Mul", {"half", "t6"}, {"y"}, "half"));
  }
  g.outputs = {ValueInfo{"y", DataType::kFloat}};
  if (h_out) g.outputs.push_back(ValueInfo{"h", DataType::kFloat});
  return MakeModel(std::move(g), 17);
}

Tensor WithSpecials(Tensor x) {
  float* p = x.data<float>();
  const float specials[] = {0.f, -0.f, 60.f, -60.f, 1e-30f, std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()};
  for (size_t i = 0; i < std::size(specials) && static_cast<int64_t>(i) < x.numel(); ++i) p[i * 7 % x.numel()] = specials[i];
  return x;
}

TEST(ElementwiseChain, GeluChainsAreOnePassAndBitIdentical) {
  SessionOptions on{.profile = true}, off;
  off.rewrite_products = false;
  for (bool erf : {false, true}) {
    for (int64_t n : {1, 48, 1000}) {  // 1000 columns: blocks end at each row's end (the bias is a row)
      Model m = GeluModel(erf, n);
      Session fast(m, on), plain(m, off);
      ASSERT_EQ(fast.product_rewrites().elementwise_chains, 1);
      EXPECT_EQ(fast.product_rewrites().chained_operators, erf ? 6 : 10);
      EXPECT_EQ(plain.product_rewrites().elementwise_chains, 0);
      int runs = 0;
      for (int64_t rows : {1, 3, 70}) {  // 70 x 1000 elements: several tasks
        std::map<std::string, Tensor> feeds{{"x", WithSpecials(RandomFloat({1, rows, n}, 30 + rows, -6.f, 6.f))}};
        ExpectBitsEqual(fast.Run(feeds), plain.Run(feeds), fmt::format("erf={} n={} rows={}", erf, n, rows));
        ++runs;
      }
      EXPECT_EQ(testing::ProfiledCalls(fast, "ElementwiseChain"), runs);
      EXPECT_EQ(testing::ProfiledCalls(fast, "Mul"), 0);  // the fallback never ran
      EXPECT_EQ(testing::ProfiledCalls(fast, erf ? "Erf" : "Tanh"), 0);
    }
  }
}

// Every operator the chain takes, bit for bit against its own kernel: each unary one on x (with
// non-finite values, zeros and negatives), then Sub and a Div by a row and a scalar, as one chain.
TEST(ElementwiseChain, EveryOperatorEqualsItsKernel) {
  SessionOptions on{.profile = true}, off;
  off.rewrite_products = false;
  const int64_t n = 37;
  for (const char* unary : {"Tanh", "Erf", "Sigmoid", "Exp", "Relu", "Neg", "Abs", "Sqrt"}) {
    Graph g;
    g.inputs = {testing::FloatValue("x", {-1, n})};
    g.SetInitializer("row", RandomFloat({n}, 8, -2.f, 2.f));
    g.SetInitializer("two", Tensor::FromVector<float>({2.f}, {}));
    g.nodes.push_back(MakeNode(unary, {"x"}, {"u"}, "unary"));
    g.nodes.push_back(MakeNode("Sub", {"u", "row"}, {"s"}, "sub"));
    g.nodes.push_back(MakeNode("Div", {"s", "two"}, {"y"}, "div"));
    g.outputs = {ValueInfo{"y", DataType::kFloat}};
    Model m = MakeModel(std::move(g), 17);
    Session fast(m, on), plain(m, off);
    ASSERT_EQ(fast.product_rewrites().chained_operators, 3) << unary;
    std::map<std::string, Tensor> feeds{{"x", WithSpecials(RandomFloat({90, n}, 40, -8.f, 8.f))}};
    ExpectBitsEqual(fast.Run(feeds), plain.Run(feeds), unary);
    EXPECT_EQ(testing::ProfiledCalls(fast, unary), 0) << unary;  // the chain ran, not the fallback
  }
}

TEST(ElementwiseChain, OtherShapesRunTheOperators) {
  SessionOptions on{.profile = true}, off;
  off.rewrite_products = false;
  // x of one column: the bias [5] broadcasts it to five columns, which no input has: the fallback.
  Model m = GeluModel(false, 5);
  m.graph.inputs[0] = testing::FloatValue("x", {-1, -1, -1});
  Session fast(m, on), plain(m, off);
  std::map<std::string, Tensor> feeds{{"x", RandomFloat({2, 3, 1}, 3)}};
  ExpectBitsEqual(fast.Run(feeds), plain.Run(feeds), "x of one column");
  EXPECT_EQ(testing::ProfiledCalls(fast, "Tanh"), 1);
  // A bad broadcast fails as the operators do.
  std::map<std::string, Tensor> bad{{"x", RandomFloat({2, 3, 4}, 4)}};
  EXPECT_THROW(fast.Run(bad), Error);
}

TEST(ElementwiseChain, AValueReadElsewhereEndsTheChain) {
  // h (the bias Add) is also a graph output: it stays its own node; the GELU after it is a chain.
  SessionOptions on, off;
  off.rewrite_products = false;
  Model m = GeluModel(false, 16, /*h_out=*/true);
  Session fast(m, on), plain(m, off);
  ASSERT_EQ(fast.product_rewrites().elementwise_chains, 1);
  EXPECT_EQ(fast.product_rewrites().chained_operators, 9);
  std::map<std::string, Tensor> feeds{{"x", RandomFloat({1, 4, 16}, 5)}};
  ExpectBitsEqual(fast.Run(feeds), plain.Run(feeds), "h read elsewhere");
}

TEST(ElementwiseChain, AHostileProgramIsRefused) {
  // A model file carrying the plan's node: an instruction that reads a later result, an unknown
  // opcode, operands missing, no output.
  struct Case {
    std::vector<int64_t> ops, args;
    std::vector<std::string> outputs;
    const char* message;
  };
  const Case cases[] = {{{0, 2}, {0, -2, 0, 0}, {"y"}, "instruction 0 reads operand -2"},
                        {{99}, {0, 0}, {"y"}, "unknown operator code 99"},
                        {{0, 2}, {0, 0}, {"y"}, "2 instructions with 2 operands"},
                        {{4}, {0, 0}, {"y"}, "instruction 0 reads operand 0"},  // a unary's second operand
                        {{0}, {0, 0}, {}, "has no outputs"}};  // refused when the session is made
  for (const Case& c : cases) {
    Graph g;
    g.inputs = {testing::FloatValue("x", {4})};
    Node n = MakeNode("ElementwiseChain", {"x"}, c.outputs, "chain",
                      {testing::IntsAttr("ops", c.ops), testing::IntsAttr("args", c.args)});
    n.domain = "ai.graph_autofusion.plan";
    g.nodes.push_back(n);
    g.nodes.push_back(MakeNode("Relu", {"x"}, {"z"}, "other"));
    g.outputs = {ValueInfo{"z", DataType::kFloat}};
    if (!c.outputs.empty()) g.outputs.push_back(ValueInfo{"y", DataType::kFloat});
    Model m = MakeModel(std::move(g), 17);
    try {
      Session s(m);
      s.Run({{"x", RandomFloat({4}, 6)}});
      ADD_FAILURE() << c.message << ": ran";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace gaf
