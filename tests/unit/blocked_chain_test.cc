// Blocked-layout chains (ops/blocked_chain.h, fusion/layout_chains.h): each kind of CNN block the
// chain runs, against the reference runtime on the same graph: residual blocks (BN folded, a
// residual Add as a post-op), SiLU as Sigmoid+Mul, HardSwish as x*HardSigmoid(x), SE gating,
// depthwise + pointwise, an SPP block, dense blocks whose Concats are written in place, FPN
// upsampling, odd channel counts, batch 2; then the fuser's grouping and the fused model end to end.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>
#include <random>
#include <string>
#include <vector>

#include "codegen/fused_session.h"
#include "fusion/auto_fusion.h"
#include "fusion/layout_chains.h"
#include "ops/blocked_chain.h"
#include "ops/conv_choice.h"
#include "runtime/session.h"
#include "test_util.h"

namespace gaf {
namespace {

using testing::FloatAttr;
using testing::IntAttr;
using testing::IntsAttr;
using testing::MakeNode;

// A graph under construction: nodes, initializers, one 4-D input "x".
struct Net {
  Graph g;
  std::mt19937 rng{11};
  int next = 0;
  std::string Name(const std::string& p) { return p + std::to_string(next++); }
  std::string Const(Shape s, float lo, float hi) {
    std::uniform_real_distribution<float> u(lo, hi);
    Tensor t(DataType::kFloat, s);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
    const std::string n = Name("c");
    g.initializers.emplace_back(n, t);
    return n;
  }
  std::string Op(const std::string& op, std::vector<std::string> ins, std::vector<Attribute> attrs = {}) {
    const std::string out = Name("v");
    g.nodes.push_back(MakeNode(op, std::move(ins), {out}, out + "_" + op, std::move(attrs)));
    return out;
  }
  std::string Conv(const std::string& x, int64_t cin, int64_t cout, int64_t k, int64_t stride = 1, int64_t group = 1,
                   bool bias = true) {
    const float r = 1.5f / std::sqrt(static_cast<float>(cin / group * k * k));
    std::vector<std::string> ins{x, Const({cout, cin / group, k, k}, -r, r)};
    if (bias) ins.push_back(Const({cout}, -0.2f, 0.2f));
    return Op("Conv", ins,
              {IntsAttr("kernel_shape", {k, k}), IntsAttr("strides", {stride, stride}),
               IntsAttr("pads", {k / 2, k / 2, k / 2, k / 2}), IntAttr("group", group)});
  }
  std::string BN(const std::string& x, int64_t c) {
    return Op("BatchNormalization", {x, Const({c}, 0.5f, 1.5f), Const({c}, -0.2f, 0.2f), Const({c}, -0.2f, 0.2f),
                                     Const({c}, 0.5f, 1.5f)},
              {FloatAttr("epsilon", 1e-3f)});
  }
  std::string SiLU(const std::string& x) { return Op("Mul", {x, Op("Sigmoid", {x})}); }
  Model Finish(Shape input, std::vector<std::string> outputs) {
    g.inputs = {testing::FloatValue("x", input)};
    g.outputs.clear();
    for (const auto& o : outputs) {
      ValueInfo v;
      v.name = o;
      v.dtype = DataType::kFloat;
      g.outputs.push_back(v);
    }
    return testing::MakeModel(g, 13);
  }
};

struct Outcome {
  double worst = 0;  // max abs difference to the reference runtime
  BlockedChain::Stats stats;
  std::string described;
};

// Runs the whole graph of `m` as one chain and by the reference runtime on one random input.
Outcome RunAsChain(const Model& m, BlockedChain::Layout layout = BlockedChain::Layout::kBlocked, uint32_t seed = 3) {
  const Graph& g = m.graph;
  std::map<std::string, Tensor> constants;
  for (const auto& [n, t] : g.initializers) constants[n] = t;
  std::vector<std::string> outs;
  for (const auto& o : g.outputs) outs.push_back(o.name);
  std::string why;
  auto chain = BlockedChain::Create(g.nodes, {"x"}, outs, constants, &why);
  EXPECT_TRUE(chain) << why;
  Outcome r;
  if (!chain) return r;
  chain->SetLayout(layout);
  Shape xs;
  for (const Dim& d : g.inputs[0].dims) xs.push_back(d.value);
  Tensor x = testing::RandomFloat(xs, seed, -1.f, 1.f);
  EXPECT_EQ(chain->Prepare({xs}), "");
  std::vector<Tensor> got = chain->Run({&x});
  Session ref(m);
  std::vector<Tensor> want = ref.Run({{"x", x}});  // graph outputs in order
  EXPECT_EQ(got.size(), outs.size());
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    const Tensor& w = want[i];
    EXPECT_EQ(got[i].shape(), w.shape()) << outs[i];
    if (got[i].shape() != w.shape()) continue;
    for (int64_t k = 0; k < w.numel(); ++k)
      r.worst = std::max(r.worst, std::abs(double(got[i].data<float>()[k]) - w.data<float>()[k]));
  }
  r.stats = chain->stats();
  r.described = chain->Describe();
  return r;
}

TEST(BlockedChain, ResidualBlocksFoldBatchNormAndTakeTheAddAsPostOp) {
  Net n;
  std::string x = n.Op("Relu", {n.BN(n.Conv("x", 3, 32, 3, 2, 1, false), 32)});  // stem: 3 channels, NCHW source
  x = n.Op("MaxPool", {x}, {IntsAttr("kernel_shape", {3, 3}), IntsAttr("strides", {2, 2}), IntsAttr("pads", {1, 1, 1, 1})});
  for (int b = 0; b < 2; ++b) {
    std::string y = n.Op("Relu", {n.BN(n.Conv(x, 32, 32, 3, 1, 1, false), 32)});
    y = n.BN(n.Conv(y, 32, 32, 3, 1, 1, false), 32);
    x = n.Op("Relu", {n.Op("Add", {y, x})});
  }
  // A downsampling block: the residual is a strided 1x1 convolution computed after the main path.
  std::string y = n.Op("Relu", {n.Conv(x, 32, 64, 3, 2)});
  y = n.Conv(y, 64, 64, 3);
  x = n.Op("Relu", {n.Op("Add", {y, n.Conv(x, 32, 64, 1, 2)})});
  x = n.Op("GlobalAveragePool", {x});
  Outcome r = RunAsChain(n.Finish({1, 3, 33, 31}, {x}));
  EXPECT_LT(r.worst, 1e-4);
  EXPECT_EQ(r.stats.convs, 8);
  // BN into weights, ReLUs, the residual Adds: only the convolutions, the pools and the output reorder run.
  EXPECT_GE(r.stats.post_ops, 14);
  EXPECT_EQ(r.stats.steps, 8 + 2 + 1);
  EXPECT_EQ(r.stats.reorders_in, 0);  // the stem reads NCHW
  EXPECT_EQ(r.stats.reorders_out, 1);
  EXPECT_EQ(r.stats.residuals_in_place, 3);  // each skip value dies at its Add: summed into its buffer
  // The same on NHWC, and with the layout chosen by measurement (which says what it measured).
  Outcome nhwc = RunAsChain(n.Finish({1, 3, 33, 31}, {x}), BlockedChain::Layout::kNhwc);
  EXPECT_LT(nhwc.worst, 1e-4);
  EXPECT_NE(nhwc.described.find("oneDNN nhwc chain"), std::string::npos) << nhwc.described;
  Outcome measured = RunAsChain(n.Finish({1, 3, 33, 31}, {x}), BlockedChain::Layout::kMeasured);
  EXPECT_LT(measured.worst, 1e-4);
  EXPECT_NE(measured.described.find("(layout measured at "), std::string::npos) << measured.described;
  EXPECT_NE(measured.described.find("thread(s): nChw"), std::string::npos) << measured.described;
  EXPECT_NE(measured.described.find("nhwc "), std::string::npos) << measured.described;
}

TEST(BlockedChain, SiluHardSwishSqueezeExciteAndDepthwise) {
  Net n;
  std::string x = n.SiLU(n.BN(n.Conv("x", 16, 32, 1, 1, 1, false), 32));        // SiLU as exported
  x = n.Op("Mul", {x, n.Op("HardSigmoid", {x}, {FloatAttr("alpha", 1.f / 6), FloatAttr("beta", 0.5f)})});  // HardSwish
  std::string d = n.Op("HardSwish", {n.Conv(x, 32, 32, 3, 2, 32)});               // depthwise, stride 2
  std::string se = n.Op("GlobalAveragePool", {d});
  se = n.Op("Relu", {n.Conv(se, 32, 16, 1)});
  se = n.Op("HardSigmoid", {n.Conv(se, 16, 32, 1)});
  d = n.Op("Mul", {d, se});                                                       // SE gating, [N,C,1,1]
  d = n.Op("Clip", {n.Conv(d, 32, 48, 1), n.Const({}, 0.f, 0.f), n.Const({}, 6.f, 6.f)});
  d = n.Op("LeakyRelu", {n.Op("Tanh", {d})}, {FloatAttr("alpha", 0.1f)});
  d = n.Op("Add", {d, n.Const({1, 48, 1, 1}, -0.5f, 0.5f)});                      // per-channel constant
  Outcome r = RunAsChain(n.Finish({1, 16, 20, 18}, {d}));
  EXPECT_LT(r.worst, 1e-4);
  EXPECT_LT(RunAsChain(n.Finish({1, 16, 20, 18}, {d}), BlockedChain::Layout::kNhwc).worst, 1e-4);
  EXPECT_EQ(r.stats.convs, 5);
  EXPECT_EQ(r.stats.reorders_in, 1);  // a 1x1 convolution reads the blocked copy of the input
  // BN, SiLU and HardSwish pairs, HardSwish, Clip, Tanh and LeakyRelu ride on the convolutions: the
  // steps are the 5 convolutions, the pool and SE Mul, the per-channel Add after the activations,
  // and the reorders in and out; plus the reorders inside the chain where the convolution timed
  // fastest when planned wants another layout (the depthwise one in nhwc on a loaded host: 12 steps,
  // 2 inside, seen under AddressSanitizer in parallel ctest).
  EXPECT_EQ(r.stats.steps, 10 + r.stats.reorders_inside) << r.described;
}

// Dense blocks as torch exports them: every layer concatenates all features so far.
Model DenseNet(int64_t batch, Net& n) {
  std::string x = n.Conv("x", 8, 32, 3);
  for (int block = 0; block < 2; ++block) {
    std::vector<std::string> features{x};
    for (int layer = 0; layer < 3; ++layer) {
      const std::string cat = features.size() == 1 ? features[0] : n.Op("Concat", features, {IntAttr("axis", 1)});
      const int64_t c = 32 + 16 * static_cast<int64_t>(features.size() - 1);
      std::string y = n.Op("Relu", {n.BN(cat, c)});
      y = n.Conv(n.Op("Relu", {n.BN(n.Conv(y, c, 32, 1), 32)}), 32, 16, 3);
      features.push_back(y);
    }
    x = n.Op("Concat", features, {IntAttr("axis", 1)});
    x = n.Op("AveragePool", {n.Conv(n.Op("Relu", {n.BN(x, 80)}), 80, 32, 1)},
             {IntsAttr("kernel_shape", {2, 2}), IntsAttr("strides", {2, 2})});
  }
  return n.Finish({batch, 8, 16, 16}, {x});
}

TEST(BlockedChain, DenseBlocksConcatenateInPlaceAtBatchOne) {
  Net n;
  Outcome r = RunAsChain(DenseNet(1, n));
  EXPECT_LT(r.worst, 1e-4);
  EXPECT_EQ(r.stats.concat_copies, 0);
  EXPECT_GT(r.stats.concat_in_place, 0);
  Net n2;
  Outcome r2 = RunAsChain(DenseNet(2, n2));  // batch 2: channel slices are not contiguous, copies
  EXPECT_LT(r2.worst, 1e-4);
  EXPECT_EQ(r2.stats.concat_in_place, 0);
  Net n3;
  Outcome r3 = RunAsChain(DenseNet(1, n3), BlockedChain::Layout::kNhwc);  // NHWC: Concat primitives
  EXPECT_LT(r3.worst, 1e-4);
  EXPECT_EQ(r3.stats.concat_in_place, 0);
}

TEST(BlockedChain, SppFpnAndOddChannels) {
  Net n;
  std::string x = n.SiLU(n.Conv("x", 3, 32, 3, 2));
  // SPP: the input and three max pools of it, concatenated (the input lives in the Concat's buffer).
  std::vector<std::string> spp{x};
  for (int64_t k : {5, 9, 13})
    spp.push_back(n.Op("MaxPool", {x}, {IntsAttr("kernel_shape", {k, k}), IntsAttr("strides", {1, 1}),
                                        IntsAttr("pads", {k / 2, k / 2, k / 2, k / 2})}));
  x = n.SiLU(n.Conv(n.Op("Concat", spp, {IntAttr("axis", 1)}), 128, 48, 1));
  // FPN: a stride-2 branch upsampled by 2 (nearest, as torch exports it) and concatenated back.
  std::string low = n.SiLU(n.Conv(x, 48, 32, 3, 2));
  std::string up = n.Op("Resize", {low, "", n.Const({4}, 0.f, 0.f)},
                        {testing::StringAttr("mode", "nearest"), testing::StringAttr("coordinate_transformation_mode", "asymmetric"),
                         testing::StringAttr("nearest_mode", "floor")});
  for (auto& [name, t] : n.g.initializers)
    if (t.numel() == 4 && t.shape() == Shape{4}) t = Tensor::FromVector<float>({1, 1, 2, 2}, {4});
  std::string fpn = n.Op("Concat", {up, x}, {IntAttr("axis", 1)});
  // 24 channels: blocks padded.
  std::string out = n.Op("Relu", {n.Conv(fpn, 80, 24, 3)});
  out = n.Op("AveragePool", {n.Conv(out, 24, 24, 3, 1, 24)},
             {IntsAttr("kernel_shape", {3, 3}), IntsAttr("strides", {2, 2}), IntAttr("ceil_mode", 1)});
  Outcome r = RunAsChain(n.Finish({1, 3, 32, 32}, {out, low}));  // two outputs
  EXPECT_LT(r.worst, 1e-4);
  EXPECT_LT(RunAsChain(n.Finish({1, 3, 32, 32}, {out, low}), BlockedChain::Layout::kNhwc).worst, 1e-4);
  EXPECT_EQ(r.stats.reorders_out, 2);
}

TEST(BlockedChain, InputsOfSeveralSizes) {
  Net n;
  std::string x = n.Op("Relu", {n.Conv("x", 16, 32, 3, 2)});
  x = n.Op("Relu", {n.Op("Add", {n.Conv(x, 32, 32, 3), x})});
  Model m = n.Finish({1, 16, -1, -1}, {x});  // symbolic height and width
  std::map<std::string, Tensor> constants;
  for (const auto& [name, t] : m.graph.initializers) constants[name] = t;
  auto chain = BlockedChain::Create(m.graph.nodes, {"x"}, {x}, constants, nullptr);
  ASSERT_TRUE(chain);
  Session ref(m);
  // A detector's images of two sizes, alternating: each size keeps its plan.
  for (int round = 0; round < 4; ++round) {
    const Shape s = round % 2 ? Shape{1, 16, 24, 40} : Shape{1, 16, 17, 23};
    Tensor in = testing::RandomFloat(s, 20 + round, -1.f, 1.f);
    std::vector<Tensor> got = chain->Run({&in}), want = ref.Run({{"x", in}});
    ASSERT_EQ(got[0].shape(), want[0].shape());
    double worst = 0;
    for (int64_t k = 0; k < want[0].numel(); ++k)
      worst = std::max(worst, std::abs(double(got[0].data<float>()[k]) - want[0].data<float>()[k]));
    EXPECT_LT(worst, 1e-4) << "round " << round;
  }
  // Two threads calling with different sizes at once: each call plans and runs under one lock,
  // so neither runs on the other's plan.
  const Shape sa{1, 16, 24, 40}, sb{1, 16, 17, 23};
  Tensor ia = testing::RandomFloat(sa, 31, -1.f, 1.f), ib = testing::RandomFloat(sb, 32, -1.f, 1.f);
  const Tensor wa = ref.Run({{"x", ia}})[0], wb = ref.Run({{"x", ib}})[0];
  std::atomic<int> bad{0};
  auto worker = [&](const Tensor& in, const Tensor& want) {
    for (int i = 0; i < 20; ++i) {
      std::vector<Tensor> got = chain->Run({&in});
      if (got[0].shape() != want.shape()) {
        ++bad;
        continue;
      }
      for (int64_t k = 0; k < want.numel(); ++k)
        if (std::abs(got[0].data<float>()[k] - want.data<float>()[k]) > 1e-4f) {
          ++bad;
          break;
        }
    }
  };
  std::thread ta(worker, std::cref(ia), std::cref(wa)), tb(worker, std::cref(ib), std::cref(wb));
  ta.join();
  tb.join();
  EXPECT_EQ(bad.load(), 0);
}

// oneDNN's Winograd kernels (ops/conv_choice.h) run where its avx512_core kernels do.
// The largest |got - want| and the largest |want| over the elements of two tensors of one shape.
std::pair<double, double> WorstAndScale(const Tensor& got, const Tensor& want) {
  double worst = 0, scale = 0;
  for (int64_t k = 0; k < want.numel(); ++k) {
    worst = std::max(worst, std::abs(double(got.data<float>()[k]) - want.data<float>()[k]));
    scale = std::max(scale, std::abs(double(want.data<float>()[k])));
  }
  return {worst, scale};
}

bool HasWinogradIsa() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

// The names of the Winograd candidates of a 3x3 stride-1 convolution of `c` channels on nChw16c.
std::vector<std::string> WinogradNames(int64_t c, int64_t hw) {
  using tag = dnnl::memory::format_tag;
  const dnnl::memory::desc src({1, c, hw, hw}, dnnl::memory::data_type::f32, tag::nChw16c);
  auto desc = [&](dnnl::algorithm a) {
    return ConvDesc(dnnl::prop_kind::forward_inference, a, src,
                    dnnl::memory::desc({c, c, 3, 3}, dnnl::memory::data_type::f32, tag::any),
                    dnnl::memory::desc({c}, dnnl::memory::data_type::f32, tag::x), src, {1, 1}, {0, 0}, {1, 1}, {1, 1});
  };
  std::vector<std::string> names;
  for (const ConvCandidate& k : ConvCandidates(desc, dnnl::primitive_attr(), true))
    if (k.winograd) names.push_back(k.name);
  return names;
}

// Residual blocks of 3x3 stride-1 convolutions (the layers Winograd is for), on a size no other
// test uses (the process remembers what it timed, by shape).
Model WinogradNet(Net& n) {
  std::string x = n.Op("Relu", {n.BN(n.Conv("x", 32, 32, 3, 1, 1, false), 32)});
  for (int b = 0; b < 2; ++b)
    x = n.Op("Relu", {n.Op("Add", {n.Conv(n.Op("Relu", {n.Conv(x, 32, 32, 3)}), 32, 32, 3), x})});
  return n.Finish({1, 32, 27, 29}, {x});
}

TEST(BlockedChain, WinogradKernelsMatchTheReference) {
  const std::vector<std::string> wino = WinogradNames(32, 28);
  if (!HasWinogradIsa()) GTEST_SKIP() << "no AVX-512: oneDNN has no Winograd convolution here";
  ASSERT_FALSE(wino.empty()) << "oneDNN offered no Winograd kernel for a 3x3 convolution on an AVX-512 machine";
  for (const std::string& name : wino) {
    // A store that remembers this Winograd kernel for every convolution: the planner takes it
    // wherever it is a candidate, without timing anything.
    Net n;
    Model m = WinogradNet(n);
    std::map<std::string, Tensor> constants;
    for (const auto& [c, t] : m.graph.initializers) constants[c] = t;
    auto chain = BlockedChain::Create(m.graph.nodes, {"x"}, {m.graph.outputs[0].name}, constants, nullptr);
    ASSERT_TRUE(chain);
    int puts = 0;
    BlockedChain::LayoutStore store;
    store.get = [&](const std::string&) {
      std::string entry = "nChw16c";
      for (int i = 0; i < 5; ++i) entry += "\n" + name;
      return entry;
    };
    store.put = [&](const std::string&, const std::string&) { ++puts; };
    chain->SetLayoutStore(store);
    Tensor x = testing::RandomFloat({1, 32, 27, 29}, 5, -1.f, 1.f);
    ASSERT_EQ(chain->Prepare({x.shape()}), "");
    const BlockedChain::Stats st = chain->stats();
    EXPECT_EQ(st.convs, 5);
    EXPECT_EQ(st.convs_winograd, 5) << chain->Describe();
    EXPECT_EQ(st.convs_measured, 0);
    EXPECT_EQ(puts, 0);
    EXPECT_NE(chain->Describe().find(name + " x5"), std::string::npos) << chain->Describe();
    const Tensor got = chain->Run({&x})[0];
    const Tensor want = Session(m).Run({{"x", x}})[0];
    ASSERT_EQ(got.shape(), want.shape());
    const auto [worst, scale] = WorstAndScale(got, want);
    EXPECT_GT(scale, 0.5);
    EXPECT_LT(worst, 1e-4 * scale) << name;
  }
}

TEST(BlockedChain, ConvolutionKernelsAreTimedOnceAndRemembered) {
  Net n;
  Model m = WinogradNet(n);
  std::map<std::string, Tensor> constants;
  for (const auto& [c, t] : m.graph.initializers) constants[c] = t;
  std::map<std::string, std::string> kept;
  int puts = 0;
  BlockedChain::LayoutStore store;
  store.get = [&](const std::string& k) { return kept.count(k) ? kept[k] : std::string(); };
  store.put = [&](const std::string& k, const std::string& v) { kept[k] = v, ++puts; };
  auto make = [&]() {
    auto c = BlockedChain::Create(m.graph.nodes, {"x"}, {m.graph.outputs[0].name}, constants, nullptr);
    EXPECT_TRUE(c);
    c->SetLayoutStore(store);
    return c;
  };
  const Shape xs{1, 32, 27, 29};
  auto first = make();
  ASSERT_EQ(first->Prepare({xs}), "");
  const BlockedChain::Stats s1 = first->stats();
  EXPECT_GT(s1.convs_measured, 0) << first->Describe();
  ASSERT_EQ(puts, 1);
  // The entry: the layout, then a kernel per convolution.
  const std::string entry = kept.begin()->second;
  EXPECT_TRUE(entry.rfind("nChw", 0) == 0 || entry.rfind("nhwc", 0) == 0) << entry;
  EXPECT_EQ(std::count(entry.begin(), entry.end(), '\n'), 5) << entry;
  // Another process (another chain on the same store) plans with what was kept: nothing timed,
  // nothing stored, the same kernels.
  auto second = make();
  ASSERT_EQ(second->Prepare({xs}), "");
  EXPECT_EQ(second->stats().convs_measured, 0);
  EXPECT_EQ(second->stats().convs_winograd, s1.convs_winograd);
  EXPECT_EQ(puts, 1);
  auto kernels = [](const std::string& d) { return d.substr(d.find("; convolution kernels")); };
  EXPECT_EQ(kernels(first->Describe()).substr(kernels(first->Describe()).find(':')),
            kernels(second->Describe()).substr(kernels(second->Describe()).find(':')));
  EXPECT_NE(second->Describe().find("layout from an earlier measurement"), std::string::npos) << second->Describe();
  // oneDNN's own choice: nothing timed, no Winograd, nothing stored.
  auto library = make();
  library->SetConvKernels(BlockedChain::ConvKernels::kLibrary);
  library->SetLayout(BlockedChain::Layout::kBlocked);
  ASSERT_EQ(library->Prepare({xs}), "");
  EXPECT_EQ(library->stats().convs_measured, 0);
  EXPECT_EQ(library->stats().convs_winograd, 0);
  // The direct algorithm only: timed, never Winograd.
  auto direct = make();
  direct->SetConvKernels(BlockedChain::ConvKernels::kDirect);
  direct->SetLayout(BlockedChain::Layout::kBlocked);
  ASSERT_EQ(direct->Prepare({xs}), "");
  EXPECT_EQ(direct->stats().convs_winograd, 0);
  EXPECT_EQ(puts, 1);
}

// A strided 3x3 convolution may run on NHWC between two reorders (ConvCandidate::nhwc: oneDNN's
// brgemm kernels): taken from a store that names it, without timing, it computes what the
// reference does.
TEST(BlockedChain, StridedConvolutionOnNhwcMatchesTheReference) {
  using tag = dnnl::memory::format_tag;
  const int64_t c = 32, o = 48, h = 30, w = 31;
  auto desc = [&](dnnl::algorithm a) {
    return ConvDesc(dnnl::prop_kind::forward_inference, a, dnnl::memory::desc({1, c, h, w}, dnnl::memory::data_type::f32, tag::nhwc),
                    dnnl::memory::desc({o, c, 3, 3}, dnnl::memory::data_type::f32, tag::any),
                    dnnl::memory::desc({o}, dnnl::memory::data_type::f32, tag::x),
                    dnnl::memory::desc({1, o, (h + 1) / 2, (w + 1) / 2}, dnnl::memory::data_type::f32, tag::nhwc), {2, 2},
                    {0, 0}, {1, 1}, {1, 1});
  };
  std::vector<ConvCandidate> nhwc;
  AppendNhwcCandidate(desc, dnnl::primitive_attr(), &nhwc);
  if (nhwc.empty()) GTEST_SKIP() << "oneDNN has no optimized NHWC convolution on this machine";
  ASSERT_TRUE(nhwc[0].nhwc);
  ASSERT_NE(nhwc[0].name.find(kNhwcRoundTrip), std::string::npos) << nhwc[0].name;
  Net n;
  const std::string y = n.Op("Relu", {n.BN(n.Conv("x", c, o, 3, 2), o)});
  const std::string z = n.Op("Relu", {n.Conv(y, o, o, 1)});
  Model m = n.Finish({1, c, h, w}, {z});
  std::map<std::string, Tensor> constants;
  for (const auto& [k, t] : m.graph.initializers) constants[k] = t;
  auto chain = BlockedChain::Create(m.graph.nodes, {"x"}, {m.graph.outputs[0].name}, constants, nullptr);
  ASSERT_TRUE(chain);
  BlockedChain::LayoutStore store;
  store.get = [&](const std::string&) { return "nChw16c\n" + nhwc[0].name + "\n-"; };
  store.put = [](const std::string&, const std::string&) {};
  chain->SetLayoutStore(store);
  Tensor x = testing::RandomFloat({1, c, h, w}, 11, -1.f, 1.f);
  ASSERT_EQ(chain->Prepare({x.shape()}), "");
  EXPECT_EQ(chain->stats().convs, 2);
  EXPECT_EQ(chain->stats().reorders_inside, 2) << chain->Describe();
  EXPECT_NE(chain->Describe().find(nhwc[0].name), std::string::npos) << chain->Describe();
  const Tensor got = chain->Run({&x})[0];
  const Tensor want = Session(m).Run({{"x", x}})[0];
  ASSERT_EQ(got.shape(), want.shape());
  const auto [worst, scale] = WorstAndScale(got, want);
  EXPECT_GT(scale, 0.5);
  EXPECT_LT(worst, 1e-4 * scale);
}

// DenseNet's transition (BN, ReLU, 1x1 convolution with a bias, 2x2 average pool): the chain pools
// first and convolves the pooled pixels, with the reference's result; a padded pool, a 3x3
// convolution or a convolution output read twice keep their order.
TEST(BlockedChain, AveragePoolMovesBeforeItsPointwiseConvolution) {
  auto pool = [](Net& n, const std::string& x, std::vector<int64_t> pads) {
    return n.Op("AveragePool", {x}, {IntsAttr("kernel_shape", {2, 2}), IntsAttr("strides", {2, 2}), IntsAttr("pads", pads)});
  };
  struct Case {
    const char* what;
    int moved;
  };
  for (const Case& c : {Case{"transition", 1}, Case{"padded pool", 0}, Case{"3x3 convolution", 0}, Case{"read twice", 0},
                        Case{"on the chain's input", 1}}) {
    Net n;
    const std::string a = std::string(c.what) == "on the chain's input" ? "x" : n.Op("Relu", {n.BN("x", 32)});
    const std::string y = n.Conv(a, 32, 16, std::string(c.what) == "3x3 convolution" ? 3 : 1);
    const std::string z = pool(n, y, std::string(c.what) == "padded pool" ? std::vector<int64_t>{1, 1, 1, 1}
                                                                            : std::vector<int64_t>{0, 0, 0, 0});
    std::vector<std::string> outs{n.Op("Relu", {z})};
    if (std::string(c.what) == "read twice") outs.push_back(n.Op("Sigmoid", {y}));
    Model m = n.Finish({1, 32, 18, 22}, outs);
    std::map<std::string, Tensor> constants;
    for (const auto& [k, t] : m.graph.initializers) constants[k] = t;
    std::vector<std::string> out_names;
    for (const auto& o : m.graph.outputs) out_names.push_back(o.name);
    auto chain = BlockedChain::Create(m.graph.nodes, {"x"}, out_names, constants, nullptr);
    ASSERT_TRUE(chain) << c.what;
    Tensor x = testing::RandomFloat({1, 32, 18, 22}, 13, -1.f, 1.f);
    ASSERT_EQ(chain->Prepare({x.shape()}), "") << c.what;
    const bool moved = chain->Describe().find("1 average pool(s) moved before their 1x1 convolution") != std::string::npos;
    EXPECT_EQ(moved, c.moved == 1) << c.what << ": " << chain->Describe();
    const std::vector<Tensor> got = chain->Run({&x});
    const std::vector<Tensor> want = Session(m).Run({{"x", x}});
    ASSERT_EQ(got.size(), want.size());
    for (size_t o = 0; o < want.size(); ++o) {
      ASSERT_EQ(got[o].shape(), want[o].shape()) << c.what;
      const auto [worst, scale] = WorstAndScale(got[o], want[o]);
      EXPECT_GT(scale, 0.1) << c.what;
      EXPECT_LT(worst, 1e-5 + 1e-4 * scale) << c.what;
    }
  }
}

TEST(ConvChoice, MeasurementKeepsOneDnnsChoiceUnlessAnotherIsFaster) {
  using tag = dnnl::memory::format_tag;
  const dnnl::memory::desc src({1, 32, 28, 28}, dnnl::memory::data_type::f32, tag::nChw16c);
  auto desc = [&](dnnl::algorithm a) {
    return ConvDesc(dnnl::prop_kind::forward_inference, a, src,
                    dnnl::memory::desc({32, 32, 3, 3}, dnnl::memory::data_type::f32, tag::any),
                    dnnl::memory::desc({32}, dnnl::memory::data_type::f32, tag::x), src, {1, 1}, {0, 0}, {1, 1}, {1, 1});
  };
  const std::vector<ConvCandidate> c = ConvCandidates(desc, dnnl::primitive_attr(), true);
  ASSERT_FALSE(c.empty());
  EXPECT_FALSE(c[0].winograd);
  for (const ConvCandidate& k : c) EXPECT_EQ(k.name.find("ref"), std::string::npos) << k.name;
  if (c.size() < 2) GTEST_SKIP() << "one candidate: nothing to choose";
  // A margin no kernel can beat keeps index 0; a margin any can beat takes the fastest timed.
  EXPECT_EQ(MeasureConvCandidates(c, {}, 1.0).index, 0u);
  const ConvChoice any = MeasureConvCandidates(c, {}, -1e9);
  ASSERT_EQ(any.ms.size(), c.size());
  if (any.ms[0] == 0) {  // oneDNN's kernel took past kMaxTimedMs to warm up (a loaded machine): its choice stands
    EXPECT_EQ(any.index, 0u);
    GTEST_SKIP() << "the first candidate's warm-up took past kMaxTimedMs: not timed, oneDNN's choice kept";
  }
  EXPECT_GT(any.ms[0], 0);
  for (size_t i = 0; i < c.size(); ++i) {
    if (any.ms[i] > 0) {
      EXPECT_LE(any.ms[any.index], any.ms[i]);
    }
  }
}

TEST(ConvChoice, SwishPassMatchesTheReference) {
  // Three blocks and a tail (threads share blocks; the vector loop leaves a scalar tail).
  const int64_t n = 3 * 4096 + 13;
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = -100.f + 200.f * static_cast<float>(i) / static_cast<float>(n);
  x[5] = 0.f, x[6] = -0.f, x[7] = 1e-30f, x[8] = 88.5f, x[9] = -88.5f, x[10] = 1e30f;
  std::vector<float> y = x;
  SwishInPlace(y.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i], want = v / (1.0 + std::exp(-v));
    ASSERT_LE(std::abs(y[i] - want), 1e-6 * std::abs(want) + 1e-30) << "x = " << v;
  }
  std::vector<float> nan{std::nanf("")};
  SwishInPlace(nan.data(), 1);
  EXPECT_TRUE(std::isnan(nan[0]));
}

TEST(BlockedChain, SwishAsAPassMatchesTheReference) {
  // SiLU after a 1x1, a 3x3 and a depthwise convolution (the last post-op of each, whichever
  // layout the chain measures faster).
  Net n;
  std::string x = n.SiLU(n.Conv("x", 16, 32, 1));
  std::string y = n.SiLU(n.Conv(x, 32, 32, 3));
  y = n.SiLU(n.Conv(y, 32, 32, 3, 1, 32));
  Model m = n.Finish({1, 16, 23, 19}, {y});
  std::map<std::string, Tensor> constants;
  for (const auto& [c, t] : m.graph.initializers) constants[c] = t;
  std::map<std::string, std::string> kept;
  BlockedChain::LayoutStore store;
  store.get = [&](const std::string& k) { return kept.count(k) ? kept[k] : std::string(); };
  store.put = [&](const std::string& k, const std::string& v) { kept[k] = v; };
  auto make = [&]() {
    auto c = BlockedChain::Create(m.graph.nodes, {"x"}, {y}, constants, nullptr);
    EXPECT_TRUE(c);
    c->SetLayoutStore(store);
    return c;
  };
  const Shape xs{1, 16, 23, 19};
  ASSERT_EQ(make()->Prepare({xs}), "");
  ASSERT_EQ(kept.size(), 1u);
  // Every convolution's kernel with Swish as a pass instead: what a store would hold where the
  // pass measured faster.
  std::string& entry = kept.begin()->second;
  std::string passes;
  for (size_t at = 0, next; at != std::string::npos; at = next) {
    next = entry.find('\n', at + 1);
    std::string line = entry.substr(at, next == std::string::npos ? std::string::npos : next - at);
    if (at > 0 && line.find(kSwishPass) == std::string::npos) line += kSwishPass;
    passes += line;
  }
  entry = passes;
  auto chain = make();
  ASSERT_EQ(chain->Prepare({xs}), "");
  EXPECT_EQ(chain->stats().swish_passes, 3) << chain->Describe();
  EXPECT_EQ(chain->stats().convs_measured, 0) << chain->Describe();
  Tensor in = testing::RandomFloat(xs, 9, -2.f, 2.f);
  const Tensor got = chain->Run({&in})[0], want = Session(m).Run({{"x", in}})[0];
  ASSERT_EQ(got.shape(), want.shape());
  double worst = 0;
  for (int64_t k = 0; k < want.numel(); ++k)
    worst = std::max(worst, std::abs(double(got.data<float>()[k]) - want.data<float>()[k]));
  EXPECT_LT(worst, 1e-4);
}

TEST(BlockedChain, RejectsWhatItDoesNotRun) {
  auto none = [](const std::string&) -> const Tensor* { return nullptr; };
  auto no_shape = [](const std::string&) -> const Shape* { return nullptr; };
  EXPECT_NE(BlockedChainRejects(MakeNode("Softmax", {"a"}, {"b"}), none, no_shape), "");
  EXPECT_NE(BlockedChainRejects(MakeNode("Conv", {"a", "w"}, {"b"}), none, no_shape), "");  // weight not constant
  Node resize = MakeNode("Resize", {"a", "", "s"}, {"b"}, "r", {testing::StringAttr("mode", "linear")});
  EXPECT_NE(BlockedChainRejects(resize, none, no_shape).find("nearest"), std::string::npos);
  Shape s24{1, 24, 8, 8};
  auto shape24 = [&](const std::string&) -> const Shape* { return &s24; };
  EXPECT_NE(BlockedChainRejects(MakeNode("Concat", {"a", "b"}, {"c"}, "cat", {IntAttr("axis", 1)}), none, shape24)
                .find("multiple of the 16-channel block"),
            std::string::npos);
  // A chain input that is not 4-D cannot be planned: an error, not a crash.
  Net n;
  std::string y = n.Conv(n.Conv("x", 16, 16, 3), 16, 16, 3);
  Model m = n.Finish({1, 16, 8, 8}, {y});
  std::map<std::string, Tensor> constants;
  for (const auto& [name, t] : m.graph.initializers) constants[name] = t;
  auto chain = BlockedChain::Create(m.graph.nodes, {"x"}, {y}, constants, nullptr);
  ASSERT_TRUE(chain);
  EXPECT_NE(chain->Prepare({{1, 16, 8}}), "");
}

// tf2onnx's NHWC models: a Transpose to NCHW after the image input and one back to NHWC before
// the output fold into the chain's reorders in and out (the input read as nhwc, the output
// written as nhwc), in both layouts, with 3 input channels (the first convolution reads the image
// reordered once, straight into its kernel's layout) and with 16.
TEST(BlockedChain, TransposesAtTheBoundaryFoldIntoItsInputAndOutput) {
  for (int64_t c : {3, 16}) {
    Net n;
    const std::string nchw = n.Op("Transpose", {"x"}, {IntsAttr("perm", {0, 3, 1, 2})});
    std::string y = n.Op("Relu", {n.Conv(nchw, c, 32, 3, 2)});
    y = n.Op("Add", {y, n.Conv(n.Op("Relu", {n.Conv(y, 32, 32, 1)}), 32, 32, 3)});
    const std::string nhwc = n.Op("Transpose", {y}, {IntsAttr("perm", {0, 2, 3, 1})});
    Model m = n.Finish({1, 14, 10, c}, {nhwc});
    for (auto layout : {BlockedChain::Layout::kBlocked, BlockedChain::Layout::kNhwc}) {
      SCOPED_TRACE(fmt::format("{} channels, layout {}", c, layout == BlockedChain::Layout::kBlocked ? "blocked" : "nhwc"));
      const Outcome r = RunAsChain(m, layout);  // output [1, 7, 5, 32], against the reference
      EXPECT_LT(r.worst, 1e-4);
      EXPECT_EQ(r.stats.convs, 3);
      EXPECT_EQ(r.stats.reorders_inside, 0) << r.described;  // the image is reordered at most once
      EXPECT_LE(r.stats.reorders_in, 1) << r.described;
      EXPECT_EQ(r.stats.reorders_out, 1);
    }
  }
  // A Transpose between two of its operators is not folded: the chain is not made.
  Net n;
  const std::string t = n.Op("Transpose", {n.Conv("x", 16, 16, 3)}, {IntsAttr("perm", {0, 2, 3, 1})});
  const std::string y = n.Conv(n.Op("Transpose", {t}, {IntsAttr("perm", {0, 3, 1, 2})}), 16, 16, 3);
  Model m = n.Finish({1, 16, 8, 8}, {y});
  std::map<std::string, Tensor> constants;
  for (const auto& [name, v] : m.graph.initializers) constants[name] = v;
  std::string why;
  EXPECT_FALSE(BlockedChain::Create(m.graph.nodes, {"x"}, {y}, constants, &why));
  EXPECT_NE(why.find("a Transpose inside the chain"), std::string::npos) << why;
  // Neither is another permutation.
  Node other = MakeNode("Transpose", {"a"}, {"b"}, "t", {IntsAttr("perm", {0, 1, 3, 2})});
  EXPECT_NE(BlockedChainRejects(other, [](const std::string&) -> const Tensor* { return nullptr; },
                                [](const std::string&) -> const Shape* { return nullptr; }),
            "");
}

// Step profiling (`run --profile`): each step of a chain's plan is timed over the calls made while
// it is on, named by its node and kernel; calls made while it is off add nothing; a plan dropped
// with its chain leaves the profile.
TEST(BlockedChain, StepProfileTimesEachStepByNodeAndKernel) {
  Net n;
  const std::string a = n.Op("Relu", {n.Conv("x", 16, 32, 3)});
  const std::string y = n.Conv(a, 32, 16, 1);
  Model m = n.Finish({1, 16, 12, 12}, {y});
  std::map<std::string, Tensor> constants;
  for (const auto& [name, t] : m.graph.initializers) constants[name] = t;
  auto chain = BlockedChain::Create(m.graph.nodes, {"x"}, {y}, constants, nullptr);
  ASSERT_TRUE(chain);
  chain->SetLayout(BlockedChain::Layout::kBlocked);
  chain->SetConvKernels(BlockedChain::ConvKernels::kLibrary);
  Tensor x(DataType::kFloat, {1, 16, 12, 12});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(i % 7) - 3.f;
  chain->Run({&x});  // planned, not profiled
  auto steps_of_this_chain = [&] {
    std::vector<BlockedChain::StepTime> mine;
    for (const auto& t : BlockedChain::StepProfile(SIZE_MAX))
      if (t.step.find(m.graph.nodes[0].name) != std::string::npos || t.step.find(m.graph.nodes.back().name) != std::string::npos)
        mine.push_back(t);
    return mine;
  };
  EXPECT_TRUE(steps_of_this_chain().empty());
  BlockedChain::SetStepProfiling(true);
  for (int r = 0; r < 3; ++r) chain->Run({&x});
  BlockedChain::SetStepProfiling(false);
  chain->Run({&x});
  const auto mine = steps_of_this_chain();
  // The two convolutions (the Relu is the first one's post-op), and the reorder of the chain's
  // input where the first one reads the blocked layout.
  int convolutions = 0;
  for (const auto& t : mine) {
    EXPECT_EQ(t.calls, 3) << t.step;
    EXPECT_GT(t.seconds, 0) << t.step;
    convolutions += t.step.find("(Conv) [convolution ") != std::string::npos;
    EXPECT_NE(t.step.find(" to 1x"), std::string::npos) << t.step;  // the destination's dims
  }
  EXPECT_EQ(convolutions, 2);
  EXPECT_LE(mine.size(), 3u);
  const auto all = BlockedChain::StepProfile(SIZE_MAX);
  for (size_t i = 1; i < all.size(); ++i) EXPECT_GE(all[i - 1].seconds, all[i].seconds);  // slowest first
  EXPECT_LE(BlockedChain::StepProfile(1).size(), 1u);
  chain.reset();
  EXPECT_TRUE(steps_of_this_chain().empty());
}

// Runs the fused model with its kernels and the original by the reference runtime on input `x`:
// the largest difference of the (single) output, and the fused kernels' calls and fallbacks.
struct FusedOutcome {
  double worst = 0;
  int64_t calls = 0, fallbacks = 0;
  std::string described;
};
FusedOutcome RunFusedAgainstReference(const Model& fused, const Model& original, const Tensor& x) {
  FusedOutcome r;
  KernelCompiler compiler;
  FusedRuntime rt = MakeFusedRuntime(fused, {}, compiler);
  std::vector<Tensor> got = rt.session->Run({{"x", x}});
  Session ref(original);
  std::vector<Tensor> want = ref.Run({{"x", x}});
  EXPECT_EQ(got.size(), 1u);
  if (got.size() != 1 || want.size() != 1) return r;
  EXPECT_EQ(got[0].shape(), want[0].shape());
  if (got[0].shape() != want[0].shape()) return r;
  for (int64_t k = 0; k < want[0].numel(); ++k)
    r.worst = std::max(r.worst, std::abs(double(got[0].data<float>()[k]) - want[0].data<float>()[k]));
  for (const auto& e : rt.kernels->entries()) {
    r.calls += e.calls->load();
    r.fallbacks += e.fallbacks->load();
  }
  r.described = DescribeFusedKernels(*rt.kernels);
  return r;
}

// The fuser takes the Transposes at a chain's boundary into it (tf2onnx's NHWC image in, NHWC
// features out to a ReduceMean head) and the fused model has none left, with the same outputs.
TEST(LayoutChains, BoundaryTransposesJoinTheChain) {
  Net n;
  const std::string nchw = n.Op("Transpose", {"x"}, {IntsAttr("perm", {0, 3, 1, 2})});
  std::string y = n.Op("Relu", {n.Conv(nchw, 3, 16, 3, 2)});
  y = n.Op("Relu", {n.Conv(y, 16, 32, 1)});
  const std::string nhwc = n.Op("Transpose", {y}, {IntsAttr("perm", {0, 2, 3, 1})});
  const std::string pooled = n.Op("ReduceMean", {nhwc}, {IntsAttr("axes", {1, 2}), IntAttr("keepdims", 0)});
  Model m = n.Finish({1, 16, 12, 3}, {pooled});
  GraphAutoFusion fusion(m, FusionOptions{});
  Model fused = fusion.Fuse();
  int chains = 0, transposes = 0;
  for (const Node& node : fused.graph.nodes) {
    chains += node.op_type.rfind("FusedBlockedChain", 0) == 0;
    transposes += node.op_type == "Transpose";
  }
  EXPECT_EQ(chains, 1);
  EXPECT_EQ(transposes, 0);
  const FusedOutcome r = RunFusedAgainstReference(fused, m, testing::RandomFloat({1, 16, 12, 3}, 4, -1.f, 1.f));
  EXPECT_LT(r.worst, 1e-4);
  EXPECT_EQ(r.calls, 1);
  EXPECT_EQ(r.fallbacks, 0);
}

TEST(LayoutChains, FuserGroupsTheNetworkAndTheFusedModelMatches) {
  Net n;
  Model m = DenseNet(1, n);
  // A node the chain does not run splits the graph: Softmax over channels in the middle.
  const std::string mid = m.graph.outputs[0].name;
  Net tail;
  (void)tail;
  Graph& g = m.graph;
  const std::string soft = "soft";
  g.nodes.push_back(MakeNode("Softmax", {mid}, {soft}, "softmax", {IntAttr("axis", 1)}));
  const float r = 0.2f;
  Tensor w(DataType::kFloat, {16, 32, 3, 3});
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-r, r);
  for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = u(rng);
  g.initializers.emplace_back("w_tail", w);
  g.nodes.push_back(MakeNode("Conv", {soft, "w_tail"}, {"t1"}, "tail1", {IntsAttr("pads", {1, 1, 1, 1})}));
  g.nodes.push_back(MakeNode("Relu", {"t1"}, {"t2"}, "tail_relu"));
  Tensor w2(DataType::kFloat, {16, 16, 1, 1});
  for (int64_t i = 0; i < w2.numel(); ++i) w2.data<float>()[i] = u(rng);
  g.initializers.emplace_back("w_tail2", w2);
  g.nodes.push_back(MakeNode("Conv", {"t2", "w_tail2"}, {"out"}, "tail2"));
  g.outputs[0].name = "out";

  GraphAutoFusion fusion(m, FusionOptions{});
  int chains = 0;
  for (const FusionCandidate& c : fusion.AnalyzeFusionBenefit())
    if (c.rule == "blocked-chain") {
      ++chains;
      EXPECT_EQ(c.verdict, Verdict::kFuse) << c.reason;
    }
  EXPECT_EQ(chains, 2);  // before and after the Softmax
  Model fused = fusion.Fuse();
  int fused_nodes = 0;
  for (const Node& node : fused.graph.nodes) fused_nodes += node.op_type.rfind("FusedBlockedChain", 0) == 0;
  std::string report;
  for (const FusionCandidate& c : fusion.AnalyzeFusionBenefit())
    report += c.rule + ": " + VerdictName(c.verdict) + " " + c.reason + "\n";
  EXPECT_EQ(fused_nodes, 2) << report;

  const FusedOutcome run = RunFusedAgainstReference(fused, m, testing::RandomFloat({1, 8, 16, 16}, 9, -1.f, 1.f));
  EXPECT_LT(run.worst, 1e-4);
  // Both chains ran as kernels (no call fell back to the function body).
  EXPECT_EQ(run.calls, 2);
  EXPECT_EQ(run.fallbacks, 0);
  EXPECT_NE(run.described.find("library BlockedChain (oneDNN "), std::string::npos) << run.described;

  // --no-blocked-chains: none.
  FusionOptions off;
  off.layout_chains = false;
  GraphAutoFusion plain(m, off);
  for (const FusionCandidate& c : plain.AnalyzeFusionBenefit()) EXPECT_NE(c.rule, "blocked-chain");
}

}  // namespace
}  // namespace gaf
