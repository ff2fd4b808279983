// Generated row kernels against the reference runtime on the same function bodies.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "codegen/compiler.h"
#include "codegen/row_kernel.h"
#include "codegen/row_program.h"
#include "codegen/staged_kernel.h"
#include "ops/gemm.h"
#include "runtime/session.h"
#include "row_case.h"
#include "test_util.h"

namespace gaf {
namespace {
namespace fs = std::filesystem;
using testing::IntAttr;
using testing::MakeNode;

using Case = testing::RowCase;

Tensor Random(Shape s, uint32_t seed, float lo = -2.f, float hi = 2.f) { return testing::RandomFloat(std::move(s), seed, lo, hi); }

Attribute Ints(const std::string& name, std::vector<int64_t> v) {
  Attribute a;
  a.name = name;
  a.type = Attribute::Type::kInts;
  a.ints = std::move(v);
  return a;
}

// Reference: the body as a graph, constants as initializers, run by the Session.
std::vector<Tensor> Reference(const Case& c, int64_t opset = 17) { return testing::RowCaseReference(c, opset); }

GeneratedRowKernel Generate(const Case& c, const std::string& symbol, int64_t opset = 17) {
  return testing::RowCaseGenerate(c, symbol, opset);
}

Case RmsNorm() {
  Case c;
  c.f.name = "FusedRMSNorm";
  c.f.inputs = {"x", "two", "eps", "w"};
  c.f.outputs = {"y"};
  c.f.nodes = {MakeNode("Pow", {"x", "two"}, {"sq"}), MakeNode("ReduceMean", {"sq"}, {"m"}, "", {Ints("axes", {-1})}),
               MakeNode("Add", {"m", "eps"}, {"me"}), MakeNode("Sqrt", {"me"}, {"rs"}),
               MakeNode("Div", {"x", "rs"}, {"n"}), MakeNode("Mul", {"n", "w"}, {"y"})};
  c.inputs = {Random({2, 5, 67}, 1), Tensor::Scalar<float>(2.f), Tensor::Scalar<float>(1e-6f), Random({67}, 2)};
  c.constant = {false, true, true, false};
  return c;
}

Case MaskedSoftmax() {
  Case c;
  c.f.name = "FusedScaledMaskedSoftmax";
  c.f.inputs = {"s", "scale", "mask"};
  c.f.outputs = {"p"};
  c.f.nodes = {MakeNode("Mul", {"scale", "s"}, {"ss"}), MakeNode("Add", {"ss", "mask"}, {"sm"}),
               MakeNode("Softmax", {"sm"}, {"p"}, "", {IntAttr("axis", -1)})};
  Tensor mask = Random({2, 1, 5, 7}, 4, -1.f, 0.f);
  for (int64_t i = 0; i < mask.numel(); i += 3) mask.data<float>()[i] = -3.4e38f;
  c.inputs = {Random({2, 4, 5, 7}, 3), Tensor::Scalar<float>(0.125f), mask};
  c.constant = {false, true, false};
  return c;
}

Case LayerNormAdd() {
  Case c;
  c.f.name = "FusedAddLayerNorm";
  c.f.inputs = {"a", "b", "g", "bias"};
  c.f.outputs = {"sum", "y"};
  Node ln = MakeNode("LayerNormalization", {"sum", "g", "bias"}, {"y"});
  c.f.nodes = {MakeNode("Add", {"a", "b"}, {"sum"}), ln};
  c.inputs = {Random({3, 33}, 5), Random({3, 33}, 6), Random({33}, 7), Random({33}, 8)};
  c.constant = {false, false, false, false};
  return c;
}

Case GeluErf() {
  Case c;
  c.f.name = "FusedGelu";
  c.f.inputs = {"x", "sqrt2", "one", "half"};
  c.f.outputs = {"y"};
  c.f.nodes = {MakeNode("Div", {"x", "sqrt2"}, {"d"}), MakeNode("Erf", {"d"}, {"e"}),
               MakeNode("Add", {"e", "one"}, {"e1"}), MakeNode("Mul", {"x", "e1"}, {"xm"}),
               MakeNode("Mul", {"xm", "half"}, {"y"})};
  c.inputs = {Random({4, 1000}, 9, -5.f, 5.f), Tensor::Scalar<float>(1.4142135f), Tensor::Scalar<float>(1.f),
              Tensor::Scalar<float>(0.5f)};
  c.constant = {false, true, true, true};
  return c;
}

class RowCodegen : public ::testing::Test {
 protected:
  static std::string CacheDir() { return (fs::temp_directory_path() / "gaf_codegen_test_cache").string(); }
};

TEST_F(RowCodegen, GeneratedKernelsMatchTheReference) {
  std::vector<Case> cases = {RmsNorm(), MaskedSoftmax(), LayerNormAdd(), GeluErf()};
  std::vector<GeneratedRowKernel> gens;
  std::vector<KernelSource> sources;
  for (size_t i = 0; i < cases.size(); ++i) {
    gens.push_back(Generate(cases[i], "gaf_test_kernel_" + std::to_string(i)));
    ASSERT_TRUE(gens.back().ok) << cases[i].f.name << ": " << gens.back().reason;
    sources.push_back({gens.back().symbol, gens.back().source});
  }
  KernelCompiler compiler(CacheDir());
  auto lib = compiler.Compile(sources);
  ASSERT_TRUE(lib->errors().empty()) << lib->errors().begin()->second;
  for (size_t i = 0; i < cases.size(); ++i) {
    auto fn = reinterpret_cast<RowKernelFn>(lib->Find(gens[i].symbol));
    ASSERT_NE(fn, nullptr);
    std::vector<const Tensor*> ins;
    for (const Tensor& t : cases[i].inputs) ins.push_back(&t);
    std::vector<Tensor> got = RunRowKernel(fn, gens[i], ins);
    std::vector<Tensor> want = Reference(cases[i]);
    ASSERT_EQ(got.size(), want.size());
    for (size_t o = 0; o < got.size(); ++o) {
      ASSERT_EQ(got[o].shape(), want[o].shape()) << cases[i].f.name;
      for (int64_t e = 0; e < want[o].numel(); ++e)
        ASSERT_NEAR(got[o].data<float>()[e], want[o].data<float>()[e], 2e-6 + 2e-5 * std::fabs(want[o].data<float>()[e]))
            << cases[i].f.name << " output " << o << " element " << e;
    }
  }
  // The same kernels again: served from the cache, nothing compiled.
  auto again = compiler.Compile(sources);
  EXPECT_TRUE(again->from_cache());
}

// A fused function's MatMul by a constant float32 weight runs the packed product a session gives
// such a MatMul node (PreparedMatMul), not the registry's GEMV on the weight as given: the same
// bits as the model run unfused, at one row and at several; the call site's variants (one per
// shape class) hold one packed copy between them.
TEST_F(RowCodegen, ConstantMatMulStagesRunTheSessionsPackedProduct) {
  constexpr int64_t K = 512, N = 512;  // K * N = kPackedMatMulMinWeight
  static_assert(K * N >= kPackedMatMulMinWeight);
  Case c;
  c.f.name = "FusedMatMulRelu";
  c.f.inputs = {"a", "w"};
  c.f.outputs = {"y"};
  c.f.nodes = {MakeNode("MatMul", {"a", "w"}, {"t"}), MakeNode("Relu", {"t"}, {"y"})};
  c.f.opset_imports.push_back({"", 17});
  const Tensor w = Random({K, N}, 21);
  c.constant = {false, true};
  std::vector<StagedKernel> kernels;
  KernelCompiler compiler(CacheDir());
  for (int64_t M : {1, 3}) {
    c.inputs = {Random({M, K}, 22 + static_cast<uint32_t>(M)), w};
    RowKernelRequest req;
    req.function = &c.f;
    req.input_types = {DataType::kFloat, DataType::kFloat};
    req.input_shapes = {c.inputs[0].shape(), w.shape()};
    req.constants = {nullptr, &w};
    StagedKernel k = GenerateStagedKernel(req, "gaf_test_packed_" + std::to_string(M), 17);
    ASSERT_TRUE(k.ok) << k.reason;
    ASSERT_EQ(k.stages.size(), 2u) << k.Describe();
    ASSERT_TRUE(k.stages[0].library) << k.Describe();
    EXPECT_NE(k.stages[0].own_kernel, nullptr) << "no prepared product: " << k.Describe();
    auto lib = compiler.Compile(k.Sources());
    ASSERT_TRUE(k.Bind(*lib)) << k.reason;
    std::vector<Tensor> got = RunStagedKernel(k, {&c.inputs[0], &w}, 2);
    std::vector<Tensor> want = Reference(c);
    ASSERT_EQ(got.size(), 1u);
    ASSERT_EQ(got[0].shape(), want[0].shape());
    for (int64_t e = 0; e < want[0].numel(); ++e)
      ASSERT_EQ(got[0].data<float>()[e], want[0].data<float>()[e]) << "M " << M << " element " << e;
    kernels.push_back(std::move(k));
  }
  // One packed product for both variants: held by each variant's kernel and this lookup.
  const std::shared_ptr<PreparedMatMul> shared = SharedPreparedMatMul(w);
  EXPECT_GE(shared.use_count(), 3);
  EXPECT_EQ(shared->packed_copies(), 1u);
  // Another buffer of the same shape is another weight.
  const Tensor other = Random({K, N}, 23);
  EXPECT_NE(SharedPreparedMatMul(other), shared);
}

TEST_F(RowCodegen, UnsupportedGroupsSayWhy) {
  Case c = RmsNorm();
  c.f.nodes.push_back(MakeNode("MatMul", {"y", "w"}, {"z"}));
  c.f.outputs = {"z"};
  GeneratedRowKernel g = Generate(c, "gaf_test_unsupported");
  EXPECT_FALSE(g.ok);
  EXPECT_NE(g.reason.find("MatMul"), std::string::npos) << g.reason;
  Case r = RmsNorm();
  r.f.nodes[1] = MakeNode("ReduceMean", {"sq"}, {"m"}, "", {Ints("axes", {0})});
  g = Generate(r, "gaf_test_axis0");
  EXPECT_FALSE(g.ok);
  EXPECT_NE(g.reason.find("last axis"), std::string::npos) << g.reason;
}

TEST_F(RowCodegen, CompileErrorsAreReportedPerKernel) {
  KernelCompiler compiler(CacheDir());
  GeneratedRowKernel good = Generate(GeluErf(), "gaf_test_good");
  auto lib = compiler.Compile({{good.symbol, good.source}, {"gaf_test_broken", "this is not C++;"}});
  EXPECT_NE(lib->Find("gaf_test_good"), nullptr);
  EXPECT_EQ(lib->Find("gaf_test_broken"), nullptr);
  ASSERT_EQ(lib->errors().count("gaf_test_broken"), 1u);
  EXPECT_NE(lib->errors().at("gaf_test_broken").find("error"), std::string::npos);
}


// The source depends on the body's structure and the inputs' broadcast classes, never on the
// sizes of the dims: every layer of a model, prefill and (batched) decode share one compiled function.
TEST_F(RowCodegen, SourceDependsOnBroadcastClassesNotOnSizes) {
  auto source_at = [](Case c, const std::vector<Shape>& shapes) {
    for (size_t i = 0; i < shapes.size(); ++i)
      if (!shapes[i].empty()) c.inputs[i] = Random(shapes[i], 10 + static_cast<uint32_t>(i));
    GeneratedRowKernel g = Generate(c, "gaf_test_shapes");
    EXPECT_TRUE(g.ok) << g.reason;
    EXPECT_EQ(g.source.find("at generation"), std::string::npos);
    return g.source;
  };
  // RMSNorm: x full rows, w one row shared by all rows. (With a single row, w's row is x's shape
  // too and is classified as a full row: another class, another source.)
  const std::string rms = source_at(RmsNorm(), {{2, 5, 67}, {}, {}, {67}});
  EXPECT_TRUE(rms == source_at(RmsNorm(), {{1, 9, 4096}, {}, {}, {4096}}));  // prefill at another width
  EXPECT_TRUE(rms == source_at(RmsNorm(), {{4, 1, 4096}, {}, {}, {4096}}));  // decode, batch 4
  EXPECT_TRUE(rms == source_at(RmsNorm(), {{3, 67}, {}, {}, {67}}));        // another rank
  EXPECT_TRUE(rms != source_at(RmsNorm(), {{2, 5, 67}, {}, {}, {2, 5, 67}}));  // w full: another class
  EXPECT_TRUE(rms != source_at(RmsNorm(), {{2, 5, 67}, {}, {}, {2, 5, 1}}));   // w one value per row
  // Softmax with a mask broadcast over the heads (rows through an offset table).
  const std::string sm = source_at(MaskedSoftmax(), {{2, 4, 5, 7}, {}, {2, 1, 5, 7}});
  EXPECT_TRUE(sm == source_at(MaskedSoftmax(), {{3, 12, 9, 130}, {}, {3, 1, 9, 130}}));
  EXPECT_TRUE(sm == source_at(MaskedSoftmax(), {{4, 12, 1, 130}, {}, {4, 1, 1, 130}}));  // decode
  EXPECT_TRUE(sm != source_at(MaskedSoftmax(), {{2, 4, 5, 7}, {}, {1, 1, 1, 7}}));  // one mask row for all rows
  EXPECT_TRUE(sm != source_at(MaskedSoftmax(), {{2, 4, 5, 7}, {}, {2, 4, 5, 7}}));  // a mask per head
}

// Primitive ops come from one table; an op the emitter has no code for fails generation with a
// reason instead of emitting a placeholder value.
TEST_F(RowCodegen, PrimitiveOpsAreOneTableAndUnknownOpsFail) {
  using rowgen::PrimOp;
  for (int k = static_cast<int>(PrimOp::kRelu); k <= static_cast<int>(PrimOp::kWhere); ++k) {
    const rowgen::PrimOpInfo* info = rowgen::InfoOf(static_cast<PrimOp>(k));
    ASSERT_NE(info, nullptr) << k;
    if (info->plain_onnx) {
      EXPECT_EQ(rowgen::PlainOnnxOp(info->name), info);
    }
  }
  EXPECT_EQ(rowgen::InfoOf(PrimOp::kNone), nullptr);
  EXPECT_EQ(rowgen::PlainOnnxOp("RoundHalf"), nullptr);  // internal (Cast to float16), not an ONNX op
  EXPECT_EQ(rowgen::PlainOnnxOp("Relu6"), nullptr);

  Case c;
  c.f.inputs = {"x"};
  c.f.outputs = {"y"};
  c.f.nodes = {MakeNode("RoundHalf", {"x"}, {"y"})};
  c.inputs = {Random({2, 8}, 1)};
  c.constant = {false};
  GeneratedRowKernel bad = Generate(c, "gaf_test_roundhalf");
  EXPECT_FALSE(bad.ok);
  EXPECT_NE(bad.reason.find("operator RoundHalf is not supported"), std::string::npos) << bad.reason;

  // A primitive whose op is unknown to the emitter (kNone) fails in emission.
  c.f.nodes = {MakeNode("Relu", {"x"}, {"y"})};
  RowKernelRequest req;
  req.function = &c.f;
  req.input_types = {DataType::kFloat};
  req.input_shapes = {{2, 8}};
  req.constants = {nullptr};
  GeneratedRowKernel g;
  g.symbol = "gaf_test_unknown_op";
  g.signature.input_bool.assign(1, false);
  rowgen::RowDomainPlan plan;
  rowgen::Lowering lw;
  std::vector<int> input_prim;
  rowgen::RowSchedule sched;
  ASSERT_TRUE(rowgen::PlanRowDomain(req, &g, &plan)) << g.reason;
  ASSERT_TRUE(rowgen::LowerRowBody(req, plan, &g, &lw, &input_prim)) << g.reason;
  ASSERT_EQ(lw.prims.back().kind, rowgen::PrimKind::kUnary);
  lw.prims.back().op = PrimOp::kNone;
  ASSERT_TRUE(rowgen::ClassifyRowPrims(plan, input_prim, &g, &lw)) << g.reason;
  ASSERT_TRUE(rowgen::ScheduleRow(c.f, plan, lw, &g, &sched)) << g.reason;
  EXPECT_FALSE(rowgen::EmitRowKernel(req, lw, input_prim, sched, &g));
  EXPECT_NE(g.reason.find("primitive op"), std::string::npos) << g.reason;
  EXPECT_TRUE(g.source.empty());
}

}  // namespace
}  // namespace gaf
