// The float32 convolution (tiled im2col + GEMM, depthwise planes) against a direct convolution
// written out in the test, over strides, dilations, asymmetric pads, groups, depthwise channel
// multipliers, 1-D/2-D/3-D and batch > 1; and the epilogue contract: every output element is
// handed to the epilogue exactly once, after it is final.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "ops/conv.h"
#include "ops/kernel.h"
#include "test_util.h"

namespace gaf {
namespace {

using testing::IntsAttr;

struct ConvCase {
  int64_t N, C, M, group;
  std::vector<int64_t> in, k, s, d, pads;  // pads: begins then ends
  bool bias;
};

Tensor Random(Shape shape, std::mt19937& rng) {
  Tensor t(DataType::kFloat, std::move(shape));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
  return t;
}

// Direct convolution, double accumulation, 1 to 3 spatial dims padded to 3.
std::vector<double> DirectConv(const ConvCase& c, const Tensor& x, const Tensor& w, const Tensor* b, Shape* out_shape) {
  const size_t nsp = c.in.size(), off = 3 - nsp;
  std::array<int64_t, 3> in{1, 1, 1}, k{1, 1, 1}, s{1, 1, 1}, d{1, 1, 1}, pb{0, 0, 0}, out{1, 1, 1};
  for (size_t i = 0; i < nsp; ++i) {
    in[off + i] = c.in[i];
    k[off + i] = c.k[i];
    s[off + i] = c.s[i];
    d[off + i] = c.d[i];
    pb[off + i] = c.pads[i];
    out[off + i] = (c.in[i] + c.pads[i] + c.pads[i + nsp] - ((c.k[i] - 1) * c.d[i] + 1)) / c.s[i] + 1;
  }
  *out_shape = {c.N, c.M};
  for (size_t i = 0; i < nsp; ++i) out_shape->push_back(out[off + i]);
  const int64_t Cg = c.C / c.group, Mg = c.M / c.group;
  std::vector<double> y;
  const float* X = x.data<float>();
  const float* W = w.data<float>();
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t m = 0; m < c.M; ++m)
      for (int64_t o0 = 0; o0 < out[0]; ++o0)
        for (int64_t o1 = 0; o1 < out[1]; ++o1)
          for (int64_t o2 = 0; o2 < out[2]; ++o2) {
            double acc = b ? b->data<float>()[m] : 0.0;
            const int64_t g = m / Mg;
            for (int64_t ci = 0; ci < Cg; ++ci)
              for (int64_t k0 = 0; k0 < k[0]; ++k0)
                for (int64_t k1 = 0; k1 < k[1]; ++k1)
                  for (int64_t k2 = 0; k2 < k[2]; ++k2) {
                    const int64_t i0 = o0 * s[0] - pb[0] + k0 * d[0], i1 = o1 * s[1] - pb[1] + k1 * d[1],
                                  i2 = o2 * s[2] - pb[2] + k2 * d[2];
                    if (i0 < 0 || i0 >= in[0] || i1 < 0 || i1 >= in[1] || i2 < 0 || i2 >= in[2]) continue;
                    const int64_t c_in = g * Cg + ci;
                    acc += double(X[(((n * c.C + c_in) * in[0] + i0) * in[1] + i1) * in[2] + i2]) *
                           W[(((m * Cg + ci) * k[0] + k0) * k[1] + k1) * k[2] + k2];
                  }
            y.push_back(acc);
          }
  return y;
}

Node ConvNode(const ConvCase& c) {
  std::vector<std::string> ins{"x", "w"};
  if (c.bias) ins.push_back("b");
  return testing::MakeNode("Conv", ins, {"y"}, "conv_under_test",
                           {IntsAttr("strides", c.s), IntsAttr("dilations", c.d), IntsAttr("pads", c.pads),
                            testing::IntAttr("group", c.group)});
}

std::vector<ConvCase> Cases() {
  return {
      {1, 3, 8, 1, {17, 19}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, true},        // odd sizes
      {2, 4, 6, 1, {9, 10}, {3, 2}, {2, 1}, {1, 2}, {0, 1, 2, 0}, true},         // stride, dilation, asym pads
      {1, 6, 6, 6, {15, 13}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, true},        // depthwise, stride 1
      {1, 5, 10, 5, {11, 12}, {3, 3}, {2, 2}, {1, 1}, {1, 0, 0, 1}, false},      // depthwise x2, stride 2
      {2, 4, 4, 4, {9, 9}, {5, 5}, {1, 1}, {2, 2}, {4, 4, 4, 4}, true},          // depthwise, dilated
      {1, 8, 6, 2, {10, 7}, {3, 1}, {1, 1}, {1, 1}, {1, 0, 1, 0}, true},         // grouped, not depthwise
      {1, 16, 24, 1, {56, 56}, {1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}, true},      // pointwise, many tiles
      {1, 32, 16, 1, {30, 30}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, true},      // several tiles
      {2, 3, 5, 1, {40}, {5}, {2}, {1}, {2, 1}, true},                           // 1-D
      {1, 3, 6, 3, {40}, {3}, {1}, {1}, {1, 1}, false},                          // 1-D depthwise
      {1, 2, 3, 1, {5, 6, 7}, {3, 2, 3}, {1, 2, 1}, {1, 1, 2}, {1, 0, 1, 1, 1, 2}, true},  // 3-D
      {1, 4, 4, 4, {4, 5, 6}, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1, 1, 1, 1}, true},  // 3-D depthwise
      // Shapes PreparedConv takes (3x3 and larger, >= 32 output channels, depth >= 64).
      {1, 16, 32, 1, {14, 13}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, true},
      {2, 8, 40, 1, {11, 12}, {3, 3}, {2, 1}, {1, 2}, {0, 1, 2, 0}, false},
      {1, 3, 32, 1, {23, 23}, {7, 7}, {2, 2}, {1, 1}, {3, 3, 3, 3}, true},  // a stem
  };
}

class ConvF32Test : public ::testing::TestWithParam<int> {};

TEST_P(ConvF32Test, MatchesDirectConvolutionAndSeesEveryElementOnce) {
  const int threads = GetParam();
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  std::mt19937 rng(7);
  int index = 0, prepared = 0;
  for (const ConvCase& c : Cases()) {
    SCOPED_TRACE("case " + std::to_string(index++) + ", threads " + std::to_string(threads));
    Shape xs{c.N, c.C}, ws{c.M, c.C / c.group};
    for (int64_t v : c.in) xs.push_back(v);
    for (int64_t v : c.k) ws.push_back(v);
    Tensor x = Random(xs, rng), w = Random(ws, rng), b = Random({c.M}, rng);
    Shape expect_shape;
    std::vector<double> expect = DirectConv(c, x, w, c.bias ? &b : nullptr, &expect_shape);
    Node node = ConvNode(c);

    // Through the registered kernel (what the runtime runs for an unfused Conv).
    KernelContext ctx{node, 17, {&x, &w}, {}, nullptr, threads};
    if (c.bias) ctx.inputs.push_back(&b);
    ctx.outputs.resize(1);
    OpRegistry::Global().Find("", "Conv")->fn(ctx);
    ASSERT_EQ(ctx.outputs[0].shape(), expect_shape);
    double worst = 0;
    for (size_t i = 0; i < expect.size(); ++i)
      worst = std::max(worst, std::abs(double(ctx.outputs[0].data<float>()[i]) - expect[i]));
    EXPECT_LT(worst, 1e-4);

    // With an epilogue: each element is seen exactly once and already holds its final value.
    Tensor y;
    ASSERT_EQ(ConvOutputShape(node, x.shape(), w.shape()), expect_shape);
    const int64_t rows = expect_shape[0] * expect_shape[1], cols = static_cast<int64_t>(expect.size()) / rows;
    std::vector<int> seen(expect.size(), 0);
    std::vector<float> at_epilogue(expect.size(), 0.f);
    std::mutex mu;
    ConvF32(node, x, w, c.bias ? &b : nullptr, &y, [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
      ASSERT_TRUE(0 <= r0 && r0 < r1 && r1 <= rows && 0 <= c0 && c0 < c1 && c1 <= cols);
      std::lock_guard<std::mutex> lock(mu);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t col = c0; col < c1; ++col) {
          ++seen[r * cols + col];
          at_epilogue[r * cols + col] = y.data<float>()[r * cols + col];
        }
    });
    for (size_t i = 0; i < expect.size(); ++i) {
      ASSERT_EQ(seen[i], 1) << "element " << i;
      ASSERT_EQ(at_epilogue[i], y.data<float>()[i]) << "element " << i << " changed after its epilogue";
      ASSERT_NEAR(y.data<float>()[i], expect[i], 1e-4) << "element " << i;
    }

    // The prepared (oneDNN) convolution, where it applies; twice, to use its kept plan.
    if (std::shared_ptr<PreparedConv> pc = PreparedConv::Create(node, w, c.bias ? &b : nullptr)) {
      ++prepared;
      for (int run = 0; run < 2; ++run) {
        Tensor z;
        pc->Run(x, &z);
        ASSERT_EQ(z.shape(), expect_shape);
        for (size_t i = 0; i < expect.size(); ++i) ASSERT_NEAR(z.data<float>()[i], expect[i], 1e-4) << "element " << i;
      }
      // With post-ops, as fused Conv groups use them: + residual, then ReLU; and Clip(-0.5, 0.5).
      Tensor r = Random(expect_shape, rng);
      auto with_sum = PreparedConv::Create(node, w, c.bias ? &b : nullptr,
                                           {{ConvPostOp::kSum}, {ConvPostOp::kRelu}});
      auto with_clip = PreparedConv::Create(node, w, c.bias ? &b : nullptr, {{ConvPostOp::kClip, -0.5f, 0.5f}});
      ASSERT_TRUE(with_sum && with_clip);
      Tensor zs, zc;
      with_sum->Run(x, &zs, &r);
      with_clip->Run(x, &zc);
      for (size_t i = 0; i < expect.size(); ++i) {
        ASSERT_NEAR(zs.data<float>()[i], std::max(0.0, expect[i] + r.data<float>()[i]), 1e-4) << "element " << i;
        ASSERT_NEAR(zc.data<float>()[i], std::clamp(expect[i], -0.5, 0.5), 1e-4) << "element " << i;
      }
    }
  }
  EXPECT_EQ(prepared, 3) << "the cases meant for PreparedConv";
  omp_set_num_threads(saved);
}

INSTANTIATE_TEST_SUITE_P(Threads, ConvF32Test, ::testing::Values(1, 2));

// MaxPool (float, values only) against a direct max over each window: strides, dilations,
// asymmetric pads, ceil_mode, 1-D; NaN-free random inputs including negative values (the
// padding must never win).
TEST(MaxPoolF32, MatchesDirectMax) {
  struct PoolCase {
    std::vector<int64_t> in, k, s, d, pads;
    int64_t ceil;
  };
  std::vector<PoolCase> cases = {
      {{17, 19}, {3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, 0},   // ResNet stem
      {{10, 9}, {2, 3}, {1, 2}, {1, 1}, {0, 1, 1, 0}, 0},
      {{11, 11}, {3, 3}, {2, 2}, {2, 1}, {2, 1, 0, 1}, 1},  // dilation, ceil_mode
      {{8, 8}, {2, 2}, {2, 2}, {1, 1}, {0, 0, 0, 0}, 1},
      {{30}, {5}, {3}, {1}, {2, 2}, 0},                     // 1-D
  };
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-3.f, -1.f);  // all negative: a zero or -inf leak shows
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const PoolCase& c = cases[ci];
    SCOPED_TRACE("case " + std::to_string(ci));
    const int64_t N = 2, C = 3;
    Shape xs{N, C};
    for (int64_t v : c.in) xs.push_back(v);
    Tensor x(DataType::kFloat, xs);
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = u(rng);
    Node node = testing::MakeNode("MaxPool", {"x"}, {"y"}, "pool",
                                  {IntsAttr("kernel_shape", c.k), IntsAttr("strides", c.s), IntsAttr("dilations", c.d),
                                   IntsAttr("pads", c.pads), testing::IntAttr("ceil_mode", c.ceil)});
    KernelContext ctx{node, 12, {&x}, {}, nullptr, 2};
    ctx.outputs.resize(1);
    OpRegistry::Global().Find("", "MaxPool")->fn(ctx);
    const Tensor& y = ctx.outputs[0];
    const size_t nsp = c.in.size();
    std::vector<int64_t> out(nsp);
    for (size_t i = 0; i < nsp; ++i) {
      const int64_t ek = (c.k[i] - 1) * c.d[i] + 1, span = c.in[i] + c.pads[i] + c.pads[i + nsp] - ek;
      out[i] = c.ceil ? (span + c.s[i] - 1) / c.s[i] + 1 : span / c.s[i] + 1;
      if (c.ceil && (out[i] - 1) * c.s[i] >= c.in[i] + c.pads[i]) --out[i];
      ASSERT_EQ(y.shape()[2 + i], out[i]);
    }
    const int64_t H = nsp == 2 ? c.in[0] : 1, W = c.in[nsp - 1];
    const int64_t OH = nsp == 2 ? out[0] : 1, OW = out[nsp - 1];
    auto at = [&](size_t i, int64_t o, int64_t k) { return o * c.s[i] - c.pads[i] + k * c.d[i]; };
    for (int64_t p = 0; p < N * C; ++p)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          float best = -INFINITY;
          for (int64_t kh = 0; kh < (nsp == 2 ? c.k[0] : 1); ++kh)
            for (int64_t kw = 0; kw < c.k[nsp - 1]; ++kw) {
              const int64_t ih = nsp == 2 ? at(0, oh, kh) : 0, iw = at(nsp - 1, ow, kw);
              if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
              best = std::max(best, x.data<float>()[(p * H + ih) * W + iw]);
            }
          ASSERT_EQ(y.data<float>()[(p * OH + oh) * OW + ow], best) << "plane " << p << " at " << oh << "," << ow;
        }
  }
}

}  // namespace
}  // namespace gaf
