// Cost model and hardware profiles: FLOPs and bytes of single operators, group figures under a
// fixed test profile, footprint against the local-memory budget, profile files.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <chrono>

#include "cost/cost_model.h"
#include "ir/error.h"
#include "models/cnn.h"
#include "models/llama.h"
#include "onnx_io/onnx_io.h"
#include "runtime/session.h"
#include "test_util.h"

namespace gaf {
namespace {

using testing::FloatValue;
using testing::IntAttr;
using testing::MakeModel;
using testing::MakeNode;

// A fixed profile so that every figure below can be worked out by hand.
HardwareProfile TestProfile() {
  HardwareProfile p;
  p.name = "test";
  p.source = "unit test";
  p.peak_gflops = 100;          // 1e5 FLOPs per microsecond
  p.bandwidth_gbs = 10;         // 1e4 bytes per microsecond
  p.local_memory_bytes = 64 * 1024;
  p.kernel_overhead_us = 1;
  return p;
}

using testing::ErrorOf;

ValueShape F32(Shape s) { return ValueShape{DataType::kFloat, std::move(s), true}; }

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("gaf_cost_test_" + name)).string();
}

TEST(CostNode, MatMulFlopsAndBytes) {
  Node mm = MakeNode("MatMul", {"a", "b"}, {"y"});
  ShapeMap s{{"a", F32({2, 3, 4})}, {"b", F32({4, 5})}, {"y", F32({2, 3, 5})}};
  OpCost c = EstimateNodeCost(mm, s);
  EXPECT_DOUBLE_EQ(c.flops, 2.0 * 2 * 3 * 5 * 4);  // 2*M*N*K over the batch
  EXPECT_DOUBLE_EQ(c.bytes_read, (24 + 20) * 4);
  EXPECT_DOUBLE_EQ(c.bytes_written, 30 * 4);
}

TEST(CostNode, GemmTransposedAndConv) {
  Node gemm = MakeNode("Gemm", {"a", "b", "c"}, {"y"}, "", {IntAttr("transA", 1)});
  ShapeMap s{{"a", F32({7, 3})}, {"b", F32({7, 5})}, {"c", F32({5})}, {"y", F32({3, 5})}};
  EXPECT_DOUBLE_EQ(EstimateNodeCost(gemm, s).flops, 2.0 * 3 * 5 * 7 + 15);  // K = 7 from transA, + C

  // Conv: 2 * N * Cout * Hout * Wout * (Cin/group) * kH * kW, + bias.
  Node conv = MakeNode("Conv", {"x", "w", "bias"}, {"y"}, "", {IntAttr("group", 1)});
  ShapeMap cs{{"x", F32({1, 3, 8, 8})}, {"w", F32({4, 3, 3, 3})}, {"bias", F32({4})}, {"y", F32({1, 4, 8, 8})}};
  EXPECT_DOUBLE_EQ(EstimateNodeCost(conv, cs).flops, 2.0 * 1 * 4 * 8 * 8 * 3 * 3 * 3 + 256);

  // Depthwise: Cin/group = 1.
  ShapeMap ds{{"x", F32({1, 8, 8, 8})}, {"w", F32({8, 1, 3, 3})}, {"y", F32({1, 8, 8, 8})}};
  Node dw = MakeNode("Conv", {"x", "w"}, {"y"}, "", {IntAttr("group", 8)});
  EXPECT_DOUBLE_EQ(EstimateNodeCost(dw, ds).flops, 2.0 * 8 * 8 * 8 * 1 * 9);
}

TEST(CostNode, ElementwiseReductionNormalizationAndDataMovement) {
  ShapeMap s{{"x", F32({4, 16})}, {"y", F32({4, 16})}, {"r", F32({4, 1})}, {"shape", {DataType::kInt64, {2}, true}}};
  EXPECT_DOUBLE_EQ(EstimateNodeCost(MakeNode("Relu", {"x"}, {"y"}), s).flops, 64);
  EXPECT_DOUBLE_EQ(EstimateNodeCost(MakeNode("Erf", {"x"}, {"y"}), s).flops, 640);  // transcendental: 10
  EXPECT_DOUBLE_EQ(EstimateNodeCost(MakeNode("ReduceMean", {"x"}, {"r"}), s).flops, 64);  // 1 per input
  EXPECT_DOUBLE_EQ(EstimateNodeCost(MakeNode("Softmax", {"x"}, {"y"}), s).flops, 5 * 64);
  OpCost t = EstimateNodeCost(MakeNode("Transpose", {"x"}, {"y"}), s);
  EXPECT_DOUBLE_EQ(t.flops, 0);
  EXPECT_DOUBLE_EQ(t.bytes_read + t.bytes_written, 2 * 256);
  // Reshape returns a view; Shape reads no data.
  OpCost r = EstimateNodeCost(MakeNode("Reshape", {"x", "shape"}, {"y"}), s);
  EXPECT_DOUBLE_EQ(r.bytes_read + r.bytes_written, 0);
  OpCost sh = EstimateNodeCost(MakeNode("Shape", {"x"}, {"shape"}), s);
  EXPECT_DOUBLE_EQ(sh.bytes_read, 0);
  EXPECT_DOUBLE_EQ(sh.bytes_written, 16);
  // Mul(x, x) reads x once.
  EXPECT_DOUBLE_EQ(EstimateNodeCost(MakeNode("Mul", {"x", "x"}, {"y"}), s).bytes_read, 256);
}

// x[1024] -> Relu -> Exp -> Add(b) -> y under TestProfile(), worked out by hand.
struct Chain {
  Graph g;
  ShapeMap shapes;
};
Chain ElementwiseChain() {
  Chain c;
  c.g.inputs = {FloatValue("x", {1024}), FloatValue("b", {1024})};
  c.g.outputs = {FloatValue("y", {1024})};
  c.g.nodes = {MakeNode("Relu", {"x"}, {"r"}, "relu"), MakeNode("Exp", {"r"}, {"e"}, "exp"),
               MakeNode("Add", {"e", "b"}, {"y"}, "add")};
  for (const char* v : {"x", "b", "r", "e", "y"}) c.shapes[v] = F32({1024});
  return c;
}

TEST(CostGroup, ElementwiseChainFiguresByHand) {
  Chain c = ElementwiseChain();
  GroupCost gc = EstimateGroupCost(c.g, {0, 1, 2}, c.shapes, TestProfile());
  EXPECT_DOUBLE_EQ(gc.flops, 1024 + 10 * 1024 + 1024);
  EXPECT_DOUBLE_EQ(gc.bytes_before, 8192 + 8192 + 12288);
  EXPECT_DOUBLE_EQ(gc.bytes_after, 3 * 4096);  // x, b read once; y written once
  EXPECT_LT(gc.bytes_after, gc.bytes_before);
  EXPECT_EQ(gc.round_trips_before, 2);  // r and e
  EXPECT_EQ(gc.round_trips_after, 0);
  // Memory bound everywhere: bytes / 1e4 per us, + 1 us per kernel.
  EXPECT_NEAR(gc.time_before_us, (0.8192 + 1) + (0.8192 + 1) + (1.2288 + 1), 1e-9);
  EXPECT_NEAR(gc.time_after_us, 1.2288 + 1, 1e-9);
  EXPECT_NEAR(gc.gflops_before, gc.flops / gc.time_before_us / 1e3, 1e-12);
  EXPECT_GT(gc.gflops_after, gc.gflops_before);
  // Block of 4096 elements per thread; three 4 KiB blocks live at every step.
  EXPECT_DOUBLE_EQ(gc.footprint_bytes, 3 * 4096);
  EXPECT_TRUE(gc.fits_local_memory);
  EXPECT_NE(gc.tiling.find("block of 4096 elements"), std::string::npos) << gc.tiling;
  EXPECT_NE(gc.formula.find("max("), std::string::npos) << gc.formula;
}

TEST(CostGroup, InteriorValueUsedOutsideIsAnExternalOutput) {
  Chain c = ElementwiseChain();
  c.g.nodes.push_back(MakeNode("Neg", {"e"}, {"z"}, "neg"));  // e escapes the group {0,1,2}
  c.g.outputs.push_back(FloatValue("z", {1024}));
  c.shapes["z"] = F32({1024});
  GroupCost gc = EstimateGroupCost(c.g, {0, 1, 2}, c.shapes, TestProfile());
  EXPECT_DOUBLE_EQ(gc.bytes_after, 4 * 4096);  // + e written once
  EXPECT_EQ(gc.round_trips_before, 2);
  // The same figures through a shared GraphIndex.
  GraphIndex index(c.g);
  GroupCost again = EstimateGroupCost(c.g, {2, 1, 0}, c.shapes, TestProfile(), index);
  EXPECT_DOUBLE_EQ(again.bytes_after, gc.bytes_after);
  EXPECT_DOUBLE_EQ(again.time_after_us, gc.time_after_us);
}

TEST(CostGroup, MatMulBiasReluTileFootprint) {
  Graph g;
  g.nodes = {MakeNode("MatMul", {"a", "w"}, {"mm"}, "mm"), MakeNode("Add", {"mm", "bias"}, {"s"}, "add"),
             MakeNode("Relu", {"s"}, {"y"}, "relu")};
  g.outputs = {FloatValue("y", {128, 512})};
  ShapeMap s{{"a", F32({128, 256})}, {"w", F32({256, 512})}, {"bias", F32({512})},
             {"mm", F32({128, 512})}, {"s", F32({128, 512})}, {"y", F32({128, 512})}};
  HardwareProfile npu = HardwareProfile::Builtin("ascend910");
  GroupCost gc = EstimateGroupCost(g, {0, 1, 2}, s, npu);
  EXPECT_DOUBLE_EQ(gc.flops, 2.0 * 128 * 512 * 256 + 2 * 128 * 512);
  // Step 0: A panel 64x128 + B panel 128x64 + bias 64 + output tile 64x64 (floats).
  EXPECT_DOUBLE_EQ(gc.footprint_bytes, (8192 + 8192 + 64 + 4096) * 4.0);
  EXPECT_TRUE(gc.fits_local_memory);
  EXPECT_NE(gc.tiling.find("64x64 output tile"), std::string::npos) << gc.tiling;
  EXPECT_EQ(gc.round_trips_before, 2);
}

// mean/var normalization over the last axis, written out op by op (as exporters do).
Model LayerNormModel() {
  Graph g;
  ValueInfo x = FloatValue("x", {4, -1});
  x.dims[1] = Dim::Symbolic("hidden");
  g.inputs = {x};
  ValueInfo y = x;
  y.name = "y";
  g.outputs = {y};
  g.SetInitializer("eps", Tensor::Scalar<float>(1e-5f));
  Attribute axes;
  axes.name = "axes";
  axes.type = Attribute::Type::kInts;
  axes.ints = {-1};
  g.nodes = {MakeNode("ReduceMean", {"x"}, {"mean"}, "mean", {axes}), MakeNode("Sub", {"x", "mean"}, {"d"}, "sub"),
             MakeNode("Mul", {"d", "d"}, {"sq"}, "sq"), MakeNode("ReduceMean", {"sq"}, {"var"}, "var", {axes}),
             MakeNode("Add", {"var", "eps"}, {"ve"}, "add_eps"), MakeNode("Sqrt", {"ve"}, {"std"}, "sqrt"),
             MakeNode("Div", {"d", "std"}, {"y"}, "div")};
  return MakeModel(std::move(g), 17);
}

TEST(CostGroup, RowFootprintOverflowsAscendLocalMemoryOnlyForHugeRows) {
  Model m = LayerNormModel();
  HardwareProfile npu = HardwareProfile::Builtin("ascend910");
  ASSERT_EQ(npu.local_memory_bytes, 192 * 1024);
  std::vector<int> all = {0, 1, 2, 3, 4, 5, 6};

  ShapeMap small = RecordShapes(m, {{"hidden", 1024}});
  ASSERT_TRUE(small.count("var"));
  EXPECT_EQ(small["x"].shape, (Shape{4, 1024}));
  EXPECT_EQ(small["var"].shape, (Shape{4, 1}));
  GroupCost fit = EstimateGroupCost(m.graph, all, small, npu);
  EXPECT_TRUE(fit.fits_local_memory) << fit.footprint_bytes;
  EXPECT_GE(fit.footprint_bytes, 2 * 1024 * 4.0);  // at least x and d rows live together
  EXPECT_LE(fit.footprint_bytes, 4 * 1024 * 4.0 + 64);
  EXPECT_NE(fit.tiling.find("one row of 1024 elements"), std::string::npos) << fit.tiling;
  EXPECT_EQ(fit.round_trips_before, 6);

  ShapeMap huge = RecordShapes(m, {{"hidden", 65536}});
  GroupCost over = EstimateGroupCost(m.graph, all, huge, npu);
  EXPECT_FALSE(over.fits_local_memory) << over.footprint_bytes;
  EXPECT_GT(over.footprint_bytes, npu.local_memory_bytes);
  // An overflowing fused kernel spills its interior values: slower than if it fit.
  EXPECT_NE(over.formula.find("spilled"), std::string::npos) << over.formula;
  EXPECT_GT(over.time_after_us, std::max(over.flops / (npu.peak_gflops * 1e3),
                                         over.bytes_after / (npu.bandwidth_gbs * 1e3)) + npu.kernel_overhead_us);
}

TEST(CostGroup, ContractionFollowedBySoftmaxNeedsWholeRows) {
  Graph g;
  g.nodes = {MakeNode("MatMul", {"q", "k"}, {"s"}, "qk"), MakeNode("Softmax", {"s"}, {"p"}, "softmax", {IntAttr("axis", -1)})};
  g.outputs = {FloatValue("p", {64, 8192})};
  ShapeMap s{{"q", F32({64, 64})}, {"k", F32({64, 8192})}, {"s", F32({64, 8192})}, {"p", F32({64, 8192})}};
  GroupCost gc = EstimateGroupCost(g, {0, 1}, s, HardwareProfile::Builtin("ascend910"));
  EXPECT_NE(gc.tiling.find("64x8192 output tile"), std::string::npos) << gc.tiling;
  EXPECT_FALSE(gc.fits_local_memory);  // 64 x 8192 floats = 2 MiB of scores alone
}

TEST(CostShapes, SymbolicDimsDefaultsAndBindings) {
  Graph g;
  ValueInfo x;
  x.name = "x";
  x.dtype = DataType::kFloat;
  x.has_shape = true;
  x.dims = {Dim::Symbolic("batch"), Dim::Symbolic("sequence_length"), Dim::Known(16)};
  g.inputs = {x};
  ValueInfo y = x;
  y.name = "y";
  g.outputs = {y};
  g.SetInitializer("w", Tensor(DataType::kFloat, {16, 32}));
  g.nodes = {MakeNode("MatMul", {"x", "w"}, {"y"})};
  Model m = MakeModel(g);
  ShapeMap d = RecordShapes(m);
  EXPECT_EQ(d["x"].shape, (Shape{1, 8, 16}));  // batch -> 1, a sequence length -> 8
  EXPECT_EQ(d["y"].shape, (Shape{1, 8, 32}));
  EXPECT_EQ(d["w"].shape, (Shape{16, 32}));    // initializers recorded too
  ShapeMap b = RecordShapes(m, {{"batch", 3}, {"sequence_length", 5}});
  EXPECT_EQ(b["y"].shape, (Shape{3, 5, 32}));
  EXPECT_EQ(b["y"].dtype, DataType::kFloat);
}

// Every value a node of the main graph produces has a recorded shape, for models the runtime runs.
int UnknownOutputs(const Model& m, const ShapeMap& shapes, std::string* first) {
  int unknown = 0;
  for (const Node& n : m.graph.nodes)
    for (const std::string& o : n.outputs)
      if (!o.empty() && (!shapes.count(o) || !shapes.at(o).known)) {
        if (unknown++ == 0 && first) *first = n.Describe() + " -> " + o;
      }
  return unknown;
}

TEST(CostShapes, ExampleModelsFullyRecordedAndCosted) {
  for (const Model& m : {BuildLlamaModel(LlamaPreset("tiny")), BuildCnnModel(CnnPreset(CnnPresetNames()[0]))}) {
    ShapeMap shapes = RecordShapes(m);
    std::string first;
    EXPECT_EQ(UnknownOutputs(m, shapes, &first), 0) << first;
    const HardwareProfile hw = TestProfile();
    GraphIndex index(m.graph);
    double flops = 0;
    for (int i = 0; i < static_cast<int>(m.graph.nodes.size()); ++i) {
      GroupCost one = EstimateGroupCost(m.graph, {i}, shapes, hw, index);
      // A group of one operator moves what the operator moves (less, if it only reads shapes).
      EXPECT_LE(one.bytes_after, one.bytes_before + 1e-9) << m.graph.nodes[i].Describe();
      EXPECT_EQ(one.round_trips_before, 0);
      flops += one.flops;
    }
    EXPECT_GT(flops, 0);
  }
}

TEST(CostShapes, OrtFusionGraphsRecordEveryOutputTheRuntimeRuns) {
  const std::filesystem::path dir = testing::OrtFusionDir();
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << testing::SharedSkipMessage(dir);
  int ran = 0, failed = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".onnx") continue;
    Model m;
    try {
      m = LoadModel(e.path().string());
    } catch (const Error&) {
      continue;
    }
    // Only graphs the runtime runs as they are (the same bindings RecordShapes uses).
    bool runs = true;
    try {
      Session probe(m);
    } catch (const Error&) {
      runs = false;
    }
    if (!runs) continue;
    // RecordShapes runs the model once: leave out the graphs with multi-GB inputs.
    int64_t largest = 0;
    for (const ValueInfo& v : m.graph.inputs) {
      int64_t n = 1;
      for (const Dim& d : v.dims) n *= d.known() ? d.value : 8;
      largest = std::max(largest, n);
    }
    if (largest > (int64_t{1} << 24)) continue;
    const auto t0 = std::chrono::steady_clock::now();
    ShapeMap shapes;
    try {
      shapes = RecordShapes(m);
    } catch (const Error& err) {
      // No binding of its dims lets the graph run (a training-mode Dropout, a weight no input
      // size fits): an error naming the node, never shapes made up from the declarations.
      EXPECT_NE(std::string(err.what()).find("node"), std::string::npos) << e.path() << ": " << err.what();
      ++failed;
      continue;
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(secs, 5) << e.path();
    std::string first;
    if (UnknownOutputs(m, shapes, &first) == 0) ++ran;
  }
  EXPECT_GT(ran, 100);
  // 23 of the 241 graphs (ORT's test graphs, made to be matched, not run: training Dropout, weights
  // that fit no input) cannot run at any binding tried.
  EXPECT_LT(failed, ran / 5) << failed << " graphs could not be run at any binding tried";
}

TEST(CostProfile, BuiltinsLoadWithSources) {
  HardwareProfile h200 = HardwareProfile::Builtin("h200");
  EXPECT_EQ(h200.local_memory_bytes, 228 * 1024);
  EXPECT_EQ(h200.bandwidth_gbs, 4800);
  EXPECT_GT(h200.PeakGflopsFor(DataType::kBFloat16), 10 * h200.PeakGflopsFor(DataType::kFloat));
  EXPECT_NE(h200.source.find("datasheet"), std::string::npos);
  HardwareProfile npu = HardwareProfile::Builtin("ascend910");
  EXPECT_NE(npu.source.find("original"), std::string::npos);
  HardwareProfile host = HardwareProfile::Builtin("host-cpu");
  EXPECT_EQ(host.name, "host-cpu");
  EXPECT_FALSE(host.source.empty());
  EXPECT_GT(host.local_memory_bytes, 0);
  EXPECT_NE(ErrorOf([] { HardwareProfile::Builtin("tpu9"); }).find("tpu9"), std::string::npos);
  // Resolve: names and paths.
  EXPECT_EQ(HardwareProfile::Resolve("h200").name, "h200");
  EXPECT_NE(ErrorOf([] { HardwareProfile::Resolve("/nonexistent/p.json"); }).find("/nonexistent/p.json"),
            std::string::npos);
}

TEST(CostProfile, HalfPrecisionUsesItsOwnPeak) {
  HardwareProfile h200 = HardwareProfile::Builtin("h200");
  OpCost c{1e9, 0, 0};  // compute bound
  EXPECT_NEAR(KernelTimeUs(c, h200, DataType::kFloat16), 1e9 / (989000 * 1e3) + h200.kernel_overhead_us, 1e-9);
  EXPECT_NEAR(KernelTimeUs(c, h200, DataType::kFloat), 1e9 / (67000 * 1e3) + h200.kernel_overhead_us, 1e-9);
}

TEST(CostProfile, JsonRoundTrip) {
  HardwareProfile p = TestProfile();
  p.description = "round trip";
  p.l1_bytes = 48 * 1024;
  p.l2_bytes = 1 << 20;
  p.l3_bytes = 32 << 20;
  p.threads = 2;
  p.local_memory_note = "L2 per core";
  p.peak_gflops_by_dtype = {{"bfloat16", 400}};
  p.measurements = {{"read_bandwidth_gbs", 12.5}};
  const std::string path = TempPath("roundtrip.json");
  p.Save(path);
  HardwareProfile q = HardwareProfile::Load(path);
  std::remove(path.c_str());
  EXPECT_EQ(q.name, p.name);
  EXPECT_EQ(q.description, p.description);
  EXPECT_EQ(q.source, p.source);
  EXPECT_DOUBLE_EQ(q.peak_gflops, p.peak_gflops);
  EXPECT_DOUBLE_EQ(q.bandwidth_gbs, p.bandwidth_gbs);
  EXPECT_DOUBLE_EQ(q.local_memory_bytes, p.local_memory_bytes);
  EXPECT_DOUBLE_EQ(q.l1_bytes, p.l1_bytes);
  EXPECT_DOUBLE_EQ(q.l2_bytes, p.l2_bytes);
  EXPECT_DOUBLE_EQ(q.l3_bytes, p.l3_bytes);
  EXPECT_DOUBLE_EQ(q.kernel_overhead_us, p.kernel_overhead_us);
  EXPECT_EQ(q.threads, 2);
  EXPECT_EQ(q.local_memory_note, p.local_memory_note);
  EXPECT_EQ(q.peak_gflops_by_dtype, p.peak_gflops_by_dtype);
  EXPECT_EQ(q.measurements, p.measurements);
  EXPECT_DOUBLE_EQ(q.PeakGflopsFor(DataType::kBFloat16), 400);
}

TEST(CostProfile, BadFilesNameTheFileAndField) {
  const std::string path = TempPath("bad.json");
  auto load_text = [&](const std::string& text) {
    std::ofstream(path) << text;
    return ErrorOf([&] { HardwareProfile::Load(path); });
  };
  const std::string base =
      R"("name": "x", "source": "s", "peak_gflops": 1, "local_memory_bytes": 1, "kernel_overhead_us": 0)";
  std::string e = load_text("{" + base + "}");
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find("'bandwidth_gbs'"), std::string::npos) << e;
  EXPECT_NE(e.find("missing"), std::string::npos) << e;

  e = load_text("{" + base + R"(, "bandwidth_gbs": "fast"})");
  EXPECT_NE(e.find("'bandwidth_gbs' must be a number"), std::string::npos) << e;
  e = load_text("{" + base + R"(, "bandwidth_gbs": -3})");
  EXPECT_NE(e.find("'bandwidth_gbs' must be positive"), std::string::npos) << e;
  e = load_text("{" + base + R"(, "bandwidth_gbs": 3, "bandwith_gbs": 4})");
  EXPECT_NE(e.find("unknown field 'bandwith_gbs'"), std::string::npos) << e;
  e = load_text("{" + base + R"(, "bandwidth_gbs": 3, "peak_gflops_by_dtype": {"float16": "x"}})");
  EXPECT_NE(e.find("'peak_gflops_by_dtype.float16'"), std::string::npos) << e;
  e = load_text("{ not json");
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find("not valid JSON"), std::string::npos) << e;
  EXPECT_TRUE(load_text("{" + base + R"(, "bandwidth_gbs": 3})").empty());
  std::remove(path.c_str());
}

}  // namespace
}  // namespace gaf
