// Generated row kernels on integer and bool values, input/output views and gathered tables, against
// the reference kernels on the same bodies (issue 12: what real exports put inside fused groups).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>

#include "codegen/compiler.h"
#include "codegen/row_kernel.h"
#include "onnx_io/onnx_io.h"
#include "runtime/session.h"
#include "row_case.h"
#include "test_util.h"

namespace gaf {
namespace {
namespace fs = std::filesystem;
using testing::IntsAttr;
using testing::MakeNode;

using Case = testing::RowCase;

using testing::RandomFloat;

template <class T>
Tensor RandomInt(DataType dt, Shape s, uint32_t seed, int64_t lo, int64_t hi, int64_t offset = 0) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> u(lo, hi);
  Tensor t(dt, std::move(s));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<T>()[i] = static_cast<T>(u(rng) + offset);
  return t;
}

Tensor Int64s(Shape s, std::vector<int64_t> v) {
  Tensor t(DataType::kInt64, std::move(s));
  for (size_t i = 0; i < v.size(); ++i) t.data<int64_t>()[i] = v[i];
  return t;
}

std::vector<Tensor> Reference(const Case& c, int64_t opset = 17) { return testing::RowCaseReference(c, opset); }

GeneratedRowKernel Generate(const Case& c, const std::string& symbol, int64_t opset = 17) {
  return testing::RowCaseGenerate(c, symbol, opset);
}

std::string CacheDir() { return (fs::temp_directory_path() / "gaf_row_int_bool_test_cache").string(); }

// Compiles the generated kernels; returns the library (kept alive by the caller).
std::shared_ptr<const KernelLibrary> Compile(const std::vector<GeneratedRowKernel>& gens) {
  std::vector<KernelSource> sources;
  for (const auto& g : gens) sources.push_back({g.symbol, g.source});
  static KernelCompiler compiler(CacheDir());
  auto lib = compiler.Compile(sources);
  EXPECT_TRUE(lib->errors().empty()) << (lib->errors().empty() ? "" : lib->errors().begin()->second);
  return lib;
}

// Runs kernel k on c's inputs and compares every output with the reference, bit for bit where
// `exact` (integer, bool and selection results are exact), else to a small tolerance.
void ExpectMatches(const KernelLibrary& lib, const GeneratedRowKernel& k, const Case& c, bool exact,
                   const std::string& what) {
  auto fn = reinterpret_cast<RowKernelFn>(lib.Find(k.symbol));
  ASSERT_NE(fn, nullptr) << what;
  std::vector<const Tensor*> ins;
  for (const Tensor& t : c.inputs) ins.push_back(&t);
  std::vector<Tensor> got = RunRowKernel(fn, k, ins);
  std::vector<Tensor> want = Reference(c);
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t o = 0; o < got.size(); ++o) {
    ASSERT_EQ(got[o].shape(), want[o].shape()) << what << " output " << o;
    ASSERT_EQ(want[o].dtype(), DataType::kFloat) << what;
    for (int64_t e = 0; e < want[o].numel(); ++e) {
      const float g = got[o].data<float>()[e], w = want[o].data<float>()[e];
      if (exact)
        ASSERT_EQ(std::memcmp(&g, &w, 4), 0) << what << " output " << o << " element " << e << ": " << g << " vs " << w;
      else
        ASSERT_NEAR(g, w, 2e-6 + 2e-5 * std::fabs(w)) << what << " output " << o << " element " << e;
    }
  }
}

// ---- the causal-mask group of the torch.onnx.export Llama decoder ----

// The group FusedInjective of tests/fixtures/torch_decoders/llama_kv_opset17 as the fuser forms
// it: Unsqueeze(position_ids) -> LessOrEqual(arange, .) -> Unsqueeze(attention_mask) ->
// Greater(., 0) -> And -> Where(., 0, -3.4e38) -> Unsqueeze, its nodes and constants taken from
// the fixture itself.
Case TorchLlamaCausalMask(int64_t batch, int64_t s, int64_t t, uint32_t seed) {
  const fs::path model_path =
      fs::path(GAF_SOURCE_DIR) / "tests" / "fixtures" / "torch_decoders" / "llama_kv_opset17" / "model.onnx";
  Model m = LoadModel(model_path.string());
  std::map<std::string, Tensor> constants;
  for (const Node& n : m.graph.nodes)
    if (n.op_type == "Constant" && n.GetTensor("value") != nullptr) constants[n.outputs[0]] = *n.GetTensor("value");
  const std::vector<std::string> outs = {"/Unsqueeze_4_output_0", "/LessOrEqual_output_0", "/Unsqueeze_5_output_0",
                                         "/Greater_output_0",     "/And_output_0",         "/Where_output_0",
                                         "/Unsqueeze_6_output_0"};
  Case c;
  c.f.name = "FusedInjective";
  std::set<std::string> produced;
  for (const std::string& o : outs)
    for (const Node& n : m.graph.nodes)
      if (!n.outputs.empty() && n.outputs[0] == o) {
        c.f.nodes.push_back(n);
        for (const std::string& in : n.inputs)
          if (!produced.count(in) && std::find(c.f.inputs.begin(), c.f.inputs.end(), in) == c.f.inputs.end())
            c.f.inputs.push_back(in);
        produced.insert(o);
      }
  EXPECT_EQ(c.f.nodes.size(), outs.size());
  c.f.outputs = {outs.back()};
  std::mt19937 rng(seed);
  for (const std::string& in : c.f.inputs) {
    if (constants.count(in)) {
      c.inputs.push_back(constants.at(in));
      c.constant.push_back(true);
      continue;
    }
    c.constant.push_back(false);
    if (in == "position_ids") {
      // Positions of the last s tokens of t (batch rows left-padded by a random amount).
      Tensor p(DataType::kInt64, {batch, s});
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t i = 0; i < s; ++i) p.data<int64_t>()[b * s + i] = t - s + i;
      c.inputs.push_back(p);
    } else if (in == "attention_mask") {
      Tensor a(DataType::kInt64, {batch, t});
      for (int64_t e = 0; e < a.numel(); ++e) a.data<int64_t>()[e] = rng() % 4 == 0 ? 0 : 1;
      c.inputs.push_back(a);
    } else {  // the arange over the total length, Unsqueeze'd twice outside the group: [1,1,t]
      EXPECT_EQ(in, "/Unsqueeze_3_output_0");
      Tensor r(DataType::kInt64, {1, 1, t});
      for (int64_t i = 0; i < t; ++i) r.data<int64_t>()[i] = i;
      c.inputs.push_back(r);
    }
  }
  return c;
}

TEST(RowIntBool, TorchLlamaCausalMaskGroupMatchesTheReferenceAtPrefillAndDecode) {
  const Case prefill = TorchLlamaCausalMask(1, 8, 8, 1), decode = TorchLlamaCausalMask(1, 1, 9, 2);
  const Case batch2 = TorchLlamaCausalMask(2, 5, 7, 3);
  std::vector<GeneratedRowKernel> gens = {Generate(prefill, "gaf_test_mask_prefill"),
                                          Generate(decode, "gaf_test_mask_decode"),
                                          Generate(batch2, "gaf_test_mask_batch2")};
  for (const auto& g : gens) ASSERT_TRUE(g.ok) << g.reason;
  auto lib = Compile(gens);
  ExpectMatches(*lib, gens[0], prefill, true, "prefill S=T=8");
  ExpectMatches(*lib, gens[1], decode, true, "decode S=1 T=9");
  ExpectMatches(*lib, gens[2], batch2, true, "batch 2, S=5 T=7");
  // The prefill kernel at the decode shapes: the views (Unsqueeze of position_ids and
  // attention_mask, Unsqueeze of the result) are applied to the actual shapes at run time.
  ExpectMatches(*lib, gens[0], decode, true, "prefill kernel on decode inputs");
  ExpectMatches(*lib, gens[0], TorchLlamaCausalMask(1, 11, 30, 4), true, "prefill kernel, S=11 T=30");
}

// ---- comparisons, logic, Where and Cast on random int and float inputs ----

Case IntBoolOps() {
  Case c;
  c.f.name = "IntBoolOps";
  c.f.inputs = {"a", "b", "x", "y", "m", "big", "zero", "zero32"};
  c.f.outputs = {"o0", "o1", "o2", "o3", "o4", "o5", "o6"};
  auto cast = [](const std::string& in, const std::string& out, DataType to) {
    return MakeNode("Cast", {in}, {out}, "", {testing::IntAttr("to", static_cast<int64_t>(to))});
  };
  c.f.nodes = {
      MakeNode("Less", {"a", "b"}, {"c1"}),
      MakeNode("Equal", {"a", "b"}, {"c2"}),
      MakeNode("Greater", {"x", "y"}, {"c3"}),
      MakeNode("GreaterOrEqual", {"x", "zero"}, {"c4"}),
      MakeNode("LessOrEqual", {"a", "big"}, {"c5"}),
      MakeNode("And", {"c1", "c3"}, {"l1"}),
      MakeNode("Or", {"c2", "c4"}, {"l2"}),
      MakeNode("Xor", {"c5", "l1"}, {"l3"}),
      MakeNode("Not", {"l2"}, {"l4"}),
      MakeNode("Where", {"l3", "x", "y"}, {"o0"}),
      cast("l4", "o1", DataType::kFloat),
      // int64 arithmetic beyond 2^24 stays exact; only the final Cast rounds, as the reference.
      MakeNode("Add", {"a", "b"}, {"ab"}),
      MakeNode("Sub", {"ab", "big"}, {"abs"}),
      cast("abs", "o2", DataType::kFloat),
      cast("x", "xi", DataType::kInt64),
      MakeNode("Where", {"c1", "xi", "a"}, {"wi"}),
      MakeNode("Max", {"wi", "b"}, {"mx"}),
      cast("mx", "o3", DataType::kFloat),
      cast("x", "xb", DataType::kBool),
      cast("xb", "o4", DataType::kFloat),
      // int32 (one row shared by all rows): compared and cast, never added.
      MakeNode("Greater", {"m", "zero32"}, {"c6"}),
      cast("c6", "c6f", DataType::kFloat),
      MakeNode("Mul", {"c6f", "x"}, {"o5"}),
      cast("m", "m64", DataType::kInt64),
      MakeNode("Less", {"m64", "a"}, {"c7"}),
      MakeNode("Where", {"c7", "c3", "c2"}, {"wb"}),
      cast("wb", "wbf", DataType::kFloat16),
      cast("wbf", "o6", DataType::kFloat),
  };
  const int64_t big = (int64_t{1} << 40) + 3;
  Tensor x = RandomFloat({3, 5, 7}, 11, -3.f, 3.f);
  for (int64_t i = 0; i < x.numel(); i += 5) x.data<float>()[i] = 0.f;  // Cast to bool of zeros
  c.inputs = {RandomInt<int64_t>(DataType::kInt64, {3, 5, 7}, 12, -4, 4, big),
              RandomInt<int64_t>(DataType::kInt64, {3, 5, 7}, 13, -4, 4, big),
              x,
              RandomFloat({3, 5, 7}, 14, -3.f, 3.f),
              RandomInt<int32_t>(DataType::kInt32, {7}, 15, -3, 3),
              Tensor::Scalar<int64_t>(big),
              Tensor::Scalar<float>(0.f),
              Tensor::Scalar<int32_t>(0)};
  c.constant = {false, false, false, false, false, true, true, true};
  return c;
}

TEST(RowIntBool, ComparisonsLogicWhereAndCastMatchTheReferenceExactly) {
  Case c = IntBoolOps();
  GeneratedRowKernel g = Generate(c, "gaf_test_int_bool_ops");
  ASSERT_TRUE(g.ok) << g.reason;
  // The integers are read as integers (no float conversion before the Cast).
  EXPECT_NE(g.source.find("const int64_t* __restrict in0"), std::string::npos);
  EXPECT_NE(g.source.find("const int32_t* __restrict in4"), std::string::npos);
  auto lib = Compile({g});
  ExpectMatches(*lib, g, c, true, "generation shapes");
  // Other values and shapes of the same classes.
  Case d = c;
  d.inputs[0] = RandomInt<int64_t>(DataType::kInt64, {2, 9, 7}, 22, -100, 100);
  d.inputs[1] = RandomInt<int64_t>(DataType::kInt64, {2, 9, 7}, 23, -100, 100);
  d.inputs[2] = RandomFloat({2, 9, 7}, 24, -200.f, 200.f);
  d.inputs[3] = RandomFloat({2, 9, 7}, 25);
  d.inputs[4] = RandomInt<int32_t>(DataType::kInt32, {7}, 26, -100, 100);
  ExpectMatches(*lib, g, d, true, "other shapes and values");
}

TEST(RowIntBool, IntegerAndBoolGenerationLimitsAreReasons) {
  auto one = [](Node n, std::vector<Tensor> ins, std::vector<std::string> names) {
    Case c;
    c.f.inputs = names;
    c.f.outputs = {n.outputs[0]};
    c.f.nodes = {n};
    c.inputs = std::move(ins);
    c.constant.assign(c.inputs.size(), false);
    return Generate(c, "gaf_test_limit");
  };
  Tensor i32 = RandomInt<int32_t>(DataType::kInt32, {2, 4}, 1, 0, 9);
  GeneratedRowKernel g = one(MakeNode("Add", {"p", "q"}, {"r"}), {i32, i32}, {"p", "q"});
  EXPECT_FALSE(g.ok);
  EXPECT_NE(g.reason.find("Add on int32 values is not generated"), std::string::npos) << g.reason;
  Tensor i64 = RandomInt<int64_t>(DataType::kInt64, {2, 4}, 2, 0, 9);
  g = one(MakeNode("Add", {"p", "q"}, {"r"}), {i64, i64}, {"p", "q"});
  EXPECT_FALSE(g.ok);  // an int64 output: outputs are float
  EXPECT_NE(g.reason.find("output 'r' is int64_t"), std::string::npos) << g.reason;
  g = one(MakeNode("Exp", {"p"}, {"r"}), {i64}, {"p"});
  EXPECT_FALSE(g.ok);
  EXPECT_NE(g.reason.find("Exp on int64 values"), std::string::npos) << g.reason;
  Tensor f = RandomFloat({2, 4}, 3);
  g = one(MakeNode("Where", {"f", "f", "f"}, {"r"}), {f}, {"f"});
  EXPECT_FALSE(g.ok);
  EXPECT_NE(g.reason.find("Where with a float condition"), std::string::npos) << g.reason;
  Tensor u8(DataType::kUint8, {2, 4});
  g = one(MakeNode("Cast", {"u"}, {"r"}, "", {testing::IntAttr("to", 1)}), {u8}, {"u"});
  EXPECT_FALSE(g.ok);
  EXPECT_NE(g.reason.find("uint8"), std::string::npos) << g.reason;
}

// ---- views: rank changes at the inputs and the output ----

Case Views() {
  Case c;
  c.f.name = "Views";
  c.f.inputs = {"x", "p", "m", "r", "q", "ax2", "ax1", "tq", "ax1b"};
  c.f.outputs = {"out"};
  c.f.nodes = {
      MakeNode("Unsqueeze", {"p", "ax2"}, {"pu"}),    // [B,S] -> [B,S,1]: one value per row
      MakeNode("Unsqueeze", {"m", "ax1"}, {"mu"}),    // [B,T] -> [B,1,T]: rows through a table
      MakeNode("Squeeze", {"r", "ax2"}, {"rs"}),      // [1,T,1] -> [1,T]: one shared row
      MakeNode("Reshape", {"q", "tq"}, {"qr"}),       // [T] -> [1,1,T]
      MakeNode("Cast", {"pu"}, {"pf"}, "", {testing::IntAttr("to", 1)}),
      MakeNode("Mul", {"x", "pf"}, {"a"}),
      MakeNode("Add", {"a", "mu"}, {"b"}),
      MakeNode("Add", {"b", "rs"}, {"c"}),
      MakeNode("Sub", {"c", "qr"}, {"y"}),
      MakeNode("Unsqueeze", {"y", "ax1b"}, {"out"}),  // [B,S,T] -> [B,1,S,T]
  };
  c.inputs = {RandomFloat({2, 3, 5}, 1), RandomInt<int64_t>(DataType::kInt64, {2, 3}, 2, -50, 50),
              RandomFloat({2, 5}, 3),    RandomFloat({1, 5, 1}, 4),
              RandomFloat({5}, 5),       Int64s({1}, {2}),
              Int64s({1}, {1}),          Int64s({3}, {1, 1, 5}),
              Int64s({1}, {1})};
  c.constant = {false, false, false, false, true, true, true, true, true};
  return c;
}

TEST(RowIntBool, InputAndOutputViewsApplyToTheActualShapesAtRunTime) {
  Case c = Views();
  GeneratedRowKernel g = Generate(c, "gaf_test_views");
  ASSERT_TRUE(g.ok) << g.reason;
  EXPECT_EQ(g.input_views[1].size(), 1u);
  EXPECT_EQ(g.output_views[0].size(), 1u);
  EXPECT_EQ(g.signature.inputs[1], RowInputClass::kPerRow);
  EXPECT_EQ(g.signature.inputs[2], RowInputClass::kGeneral);
  auto lib = Compile({g});
  ExpectMatches(*lib, g, c, false, "generation shape");
  // Another batch and sequence length (the Reshape's target is a constant: T stays).
  Case d = c;
  d.inputs[0] = RandomFloat({4, 7, 5}, 11);
  d.inputs[1] = RandomInt<int64_t>(DataType::kInt64, {4, 7}, 12, -50, 50);
  d.inputs[2] = RandomFloat({4, 5}, 13);
  ExpectMatches(*lib, g, d, false, "B=4 S=7");
  // A squeezed axis that is not 1 at run time is an error, not a wrong read.
  Case e = d;
  e.inputs[3] = RandomFloat({1, 5, 2}, 14);
  auto fn = reinterpret_cast<RowKernelFn>(lib->Find(g.symbol));
  std::vector<const Tensor*> ins;
  for (const Tensor& t : e.inputs) ins.push_back(&t);
  EXPECT_NE(testing::ErrorOf([&] { RunRowKernel(fn, g, ins); }).find("Squeeze axis"), std::string::npos);
}

// Expand to the domain is a broadcast; rank changes by leading ones inside the body are identities.
TEST(RowIntBool, ExpandIntoTheDomainAndLeadingOnesInsideTheBody) {
  Case c;
  c.f.inputs = {"x", "v", "shape", "ax0"};
  c.f.outputs = {"y"};
  c.f.nodes = {MakeNode("Relu", {"v"}, {"rv"}), MakeNode("Expand", {"rv", "shape"}, {"e"}),
               MakeNode("Unsqueeze", {"e", "ax0"}, {"eu"}), MakeNode("Add", {"x", "eu"}, {"y"})};
  c.inputs = {RandomFloat({1, 4, 6}, 1), RandomFloat({6}, 2), Int64s({2}, {4, 6}), Int64s({1}, {0})};
  c.constant = {false, false, true, true};
  GeneratedRowKernel g = Generate(c, "gaf_test_expand");
  ASSERT_TRUE(g.ok) << g.reason;
  auto lib = Compile({g});
  ExpectMatches(*lib, g, c, false, "expand");
  Case bad = c;
  bad.inputs[2] = Int64s({2}, {8, 6});  // beyond what the inputs span
  g = Generate(bad, "gaf_test_expand_bad");
  EXPECT_FALSE(g.ok);
  EXPECT_NE(g.reason.find("Expand beyond"), std::string::npos) << g.reason;
}

// ---- Gather of a constant table by integer indices ----

TEST(RowIntBool, GatheredTablesMatchTheReferenceAndCheckTheirIndices) {
  // Embedding lookup plus a position embedding (GPT-2's first group).
  Case c;
  c.f.inputs = {"wte", "ids", "wpe", "pos"};
  c.f.outputs = {"h"};
  c.f.nodes = {MakeNode("Gather", {"wte", "ids"}, {"te"}), MakeNode("Gather", {"wpe", "pos"}, {"pe"}),
               MakeNode("Add", {"te", "pe"}, {"h"})};
  c.inputs = {RandomFloat({10, 6}, 1),
              RandomInt<int64_t>(DataType::kInt64, {2, 3}, 2, -10, 9),  // negative: from the end
              RandomFloat({16, 6}, 3),
              RandomInt<int64_t>(DataType::kInt64, {1, 3}, 4, 0, 15)};
  c.constant = {true, false, true, false};
  GeneratedRowKernel g = Generate(c, "gaf_test_gather");
  ASSERT_TRUE(g.ok) << g.reason;
  EXPECT_EQ(g.gather_index[0], 1);
  EXPECT_EQ(g.signature.inputs[0], RowInputClass::kGeneral);

  Case rot;
  rot.f.inputs = {"cos", "pos", "q", "ax1"};
  rot.f.outputs = {"r"};
  rot.f.nodes = {MakeNode("Gather", {"cos", "pos"}, {"pe"}), MakeNode("Unsqueeze", {"pe", "ax1"}, {"peu"}),
                 MakeNode("Mul", {"q", "peu"}, {"r"})};
  rot.inputs = {RandomFloat({16, 6}, 6), RandomInt<int64_t>(DataType::kInt64, {2, 3}, 7, 0, 15),
                RandomFloat({2, 4, 3, 6}, 8), Int64s({1}, {1})};
  rot.constant = {true, false, false, true};
  GeneratedRowKernel gr = Generate(rot, "gaf_test_gather_rotary");
  ASSERT_TRUE(gr.ok) << gr.reason;

  auto lib = Compile({g, gr});
  ExpectMatches(*lib, g, c, true, "embedding");
  ExpectMatches(*lib, gr, rot, true, "rotary table");
  // Other indices and shapes (decode: one token per sequence).
  Case d = c;
  d.inputs[1] = RandomInt<int64_t>(DataType::kInt64, {3, 1}, 12, 0, 9);
  d.inputs[3] = RandomInt<int64_t>(DataType::kInt64, {1, 1}, 13, 0, 15);
  ExpectMatches(*lib, g, d, true, "embedding, decode shapes");
  Case dr = rot;
  dr.inputs[1] = RandomInt<int64_t>(DataType::kInt64, {2, 1}, 14, 0, 15);
  dr.inputs[2] = RandomFloat({2, 4, 1, 6}, 15);
  ExpectMatches(*lib, gr, dr, true, "rotary table, decode shapes");
  // An index out of range is an error (as the reference Gather's), never a read out of bounds.
  Case bad = c;
  bad.inputs[1].data<int64_t>()[4] = 10;
  auto fn = reinterpret_cast<RowKernelFn>(lib->Find(g.symbol));
  std::vector<const Tensor*> ins;
  for (const Tensor& t : bad.inputs) ins.push_back(&t);
  EXPECT_NE(testing::ErrorOf([&] { RunRowKernel(fn, g, ins); }).find("out of range"), std::string::npos);
  bad.inputs[1].data<int64_t>()[4] = -11;
  EXPECT_NE(testing::ErrorOf([&] { RunRowKernel(fn, g, ins); }).find("out of range"), std::string::npos);
  EXPECT_FALSE(testing::ErrorOf([&] { Reference(bad); }).empty());
}

// ---- malformed nodes; constants at one row ----

TEST(RowIntBool, MalformedNodesAreReasonsNotCrashes) {
  auto gen = [](std::vector<Node> nodes, std::vector<std::string> ins) {
    Case c;
    c.f.inputs = ins;
    c.f.outputs = {nodes.back().outputs.empty() ? "y" : nodes.back().outputs[0]};
    c.f.nodes = std::move(nodes);
    for (size_t i = 0; i < ins.size(); ++i) c.inputs.push_back(RandomFloat({2, 4}, 1 + static_cast<uint32_t>(i)));
    c.constant.assign(ins.size(), false);
    return Generate(c, "gaf_test_malformed");
  };
  const std::vector<std::pair<std::vector<Node>, std::vector<std::string>>> cases = {
      {{MakeNode("Pow", {"x"}, {"y"})}, {"x"}},
      {{MakeNode("Pow", {"x", ""}, {"y"})}, {"x"}},
      {{MakeNode("Where", {"x", "x"}, {"y"})}, {"x"}},
      {{MakeNode("Clip", {"x", "", "", "x"}, {"y"})}, {"x"}},
      {{MakeNode("BatchNormalization", {"x", "x", "x"}, {"y"})}, {"x"}},
      {{MakeNode("BatchNormalization", {"x", "", "", "", ""}, {"y"})}, {"x"}},
      {{MakeNode("Relu", {}, {"y"})}, {"x"}},
      {{MakeNode("Add", {"x"}, {"y"})}, {"x"}},
      {{MakeNode("Concat", {"x", ""}, {"y"}, "", {testing::IntAttr("axis", -1)})}, {"x"}},
      {{MakeNode("Relu", {"x"}, {})}, {"x"}},
  };
  for (const auto& [nodes, ins] : cases) {
    GeneratedRowKernel g = gen(nodes, ins);
    EXPECT_FALSE(g.ok) << nodes[0].op_type;
    EXPECT_FALSE(g.reason.empty()) << nodes[0].op_type;
  }
  GeneratedRowKernel g = gen({MakeNode("Pow", {"x"}, {"y"})}, {"x"});
  EXPECT_NE(g.reason.find("Pow expects 2 inputs"), std::string::npos) << g.reason;
}

TEST(RowIntBool, ConstantWeightsAtOneRowAreSharedRows) {
  Case c;
  c.f.inputs = {"x", "w"};
  c.f.outputs = {"y"};
  c.f.nodes = {MakeNode("Mul", {"x", "w"}, {"y"})};
  auto source_at = [&](Shape xs) {
    Case d = c;
    d.inputs = {RandomFloat(xs, 1), RandomFloat({1, 1, 16}, 2)};
    d.constant = {false, true};
    GeneratedRowKernel g = Generate(d, "gaf_test_one_row");
    EXPECT_TRUE(g.ok) << g.reason;
    EXPECT_EQ(g.signature.inputs[1], RowInputClass::kRowVec);
    return g.source;
  };
  EXPECT_EQ(source_at({1, 1, 16}), source_at({1, 5, 16}));  // decode and prefill: one source
}

}  // namespace
}  // namespace gaf
