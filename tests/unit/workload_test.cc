// Workloads: consistent binding of symbolic dims (cost/workload.cc), valid integer inputs, shapes
// recorded on given inputs, test_data_set loading, and a decoder's generation trace.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "cost/cost_model.h"
#include "cost/workload.h"
#include "models/generate.h"
#include "onnx_io/onnx_io.h"
#include "runtime/session.h"
#include "test_util.h"

namespace gaf {
namespace {

namespace fs = std::filesystem;
using testing::ErrorOf;
using testing::MakeModel;
using testing::MakeNode;

fs::path Decoders() { return fs::path(GAF_SOURCE_DIR) / "tests" / "fixtures" / "torch_decoders"; }

Model LoadDecoder(const std::string& name) { return LoadModel((Decoders() / name / "model.onnx").string()); }

const char* kDecoders[] = {"llama_kv_opset17", "gpt2_kv_opset17"};

int64_t MaxOf(const Tensor& t) {
  int64_t m = INT64_MIN;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max<int64_t>(m, static_cast<int64_t>(t.DoubleAt(i)));
  return m;
}

// The torch-exported decoders declare attention_mask [batch, total_sequence_length] and
// past [batch, heads, past_sequence_length, hd] independently: binding each dim on its own made
// the attention's mask Add fail. The present outputs show total = past + seq.
TEST(Workload, TorchDecoderDimsBoundConsistently) {
  for (const char* name : kDecoders) {
    SCOPED_TRACE(name);
    const Model m = LoadDecoder(name);
    const std::map<std::string, int64_t> b = BindDims(m);
    ASSERT_TRUE(b.count("total_sequence_length") && b.count("past_sequence_length") && b.count("sequence_length"));
    EXPECT_EQ(b.at("total_sequence_length"), b.at("past_sequence_length") + b.at("sequence_length"));
    EXPECT_GT(b.at("sequence_length"), 1);
    const Feeds f = CompleteFeeds(m);
    EXPECT_EQ(f.at("attention_mask").dim(1), f.at("past_key_values.0.key").dim(2) + f.at("input_ids").dim(1));
    Session s(m);
    EXPECT_NO_THROW(s.Run(f));
    // RecordShapes (the cost model's shapes) runs on the same binding: no zeros, all known.
    const ShapeMap shapes = RecordShapes(m);
    ASSERT_TRUE(shapes.count("logits"));
    EXPECT_EQ(shapes.at("logits").shape[1], b.at("sequence_length"));
    EXPECT_EQ(shapes.at("present.0.key").shape[2], b.at("total_sequence_length"));
  }
}

// A --dim binding is kept and the others follow it.
TEST(Workload, FixedDimsAreKeptAndOthersFollow) {
  const Model m = LoadDecoder("llama_kv_opset17");
  const auto b = BindDims(m, {}, {{"past_sequence_length", 5}, {"sequence_length", 1}});
  EXPECT_EQ(b.at("past_sequence_length"), 5);
  EXPECT_EQ(b.at("sequence_length"), 1);
  EXPECT_EQ(b.at("total_sequence_length"), 6);
}

TEST(Workload, TokenIdsBelowVocabularyPositionsOffsetByPast) {
  for (const char* name : kDecoders) {
    SCOPED_TRACE(name);
    const Model m = LoadDecoder(name);
    EXPECT_EQ(GatherTableSize(m, "input_ids"), 256);
    const Feeds f = CompleteFeeds(m, {}, {}, 7);
    const Tensor& ids = f.at("input_ids");
    EXPECT_LT(MaxOf(ids), 256);
    bool nonzero = false;
    for (int64_t i = 0; i < ids.numel(); ++i) nonzero |= ids.data<int64_t>()[i] != 0;
    EXPECT_TRUE(nonzero) << "token ids are random below the vocabulary, not all 0";
    const Tensor& pos = f.at("position_ids");
    const int64_t past = f.at("past_key_values.0.key").dim(2);
    for (int64_t i = 0; i < pos.numel(); ++i) EXPECT_EQ(pos.data<int64_t>()[i], past + i);
    const Tensor& mask = f.at("attention_mask");
    for (int64_t i = 0; i < mask.numel(); ++i) EXPECT_EQ(mask.data<int64_t>()[i], 1);
  }
}

// A scalar integer input the model compares with constants (silero VAD's sample rate) gets one.
TEST(Workload, ScalarComparedWithConstantsGetsSuchAValue) {
  Graph g;
  ValueInfo sr;
  sr.name = "sr";
  sr.dtype = DataType::kInt64;
  sr.has_shape = true;
  g.inputs = {sr, testing::FloatValue("x", {2})};
  g.SetInitializer("k16000", Tensor::Scalar<int64_t>(16000));
  g.SetInitializer("k8000", Tensor::Scalar<int64_t>(8000));
  g.nodes.push_back(MakeNode("Equal", {"sr", "k16000"}, {"is16"}));
  g.nodes.push_back(MakeNode("Equal", {"sr", "k8000"}, {"is8"}));
  g.nodes.push_back(MakeNode("Or", {"is16", "is8"}, {"ok"}));
  g.nodes.push_back(MakeNode("Identity", {"x"}, {"y"}));
  g.outputs = {testing::FloatValue("y", {2})};
  const Model m = MakeModel(g);
  const Feeds f = CompleteFeeds(m);
  EXPECT_EQ(f.at("sr").data<int64_t>()[0], 16000);
}

// RecordShapes on given inputs: the shapes are those of the given run, the rest follow them.
TEST(Workload, RecordShapesOnGivenInputs) {
  const Model m = LoadDecoder("gpt2_kv_opset17");
  Feeds given;
  Tensor ids(DataType::kInt64, {1, 3});
  for (int i = 0; i < 3; ++i) ids.data<int64_t>()[i] = 10 + i;
  given["input_ids"] = ids;
  for (const char* kind : {"key", "value"})
    for (int l = 0; l < 2; ++l)
      given[fmt::format("past_key_values.{}.{}", l, kind)] = Tensor(DataType::kFloat, {1, 4, 5, 16});
  const ShapeMap s = RecordShapes(m, given);
  EXPECT_EQ(s.at("logits").shape, (Shape{1, 3, 256}));
  EXPECT_EQ(s.at("present.1.value").shape, (Shape{1, 4, 8, 16}));
  EXPECT_EQ(s.at("attention_mask").shape, (Shape{1, 8}));  // filled: past 5 + 3
  const Feeds f = CompleteFeeds(m, given);
  EXPECT_EQ(f.at("position_ids").data<int64_t>()[0], 5);

  // Wrong dtype, unknown input, disagreeing dims: errors naming the input.
  Feeds bad = given;
  bad["input_ids"] = Tensor(DataType::kFloat, {1, 3});
  EXPECT_NE(ErrorOf([&] { CompleteFeeds(m, bad); }).find("input 'input_ids' expects int64 but was given float"),
            std::string::npos);
  bad = given;
  bad["nope"] = ids;
  EXPECT_NE(ErrorOf([&] { CompleteFeeds(m, bad); }).find("no input 'nope'"), std::string::npos);
  bad = given;
  bad["past_key_values.1.value"] = Tensor(DataType::kFloat, {1, 4, 6, 16});
  const std::string e = ErrorOf([&] { CompleteFeeds(m, bad); });
  EXPECT_NE(e.find("past_sequence_length"), std::string::npos) << e;
}

TEST(Workload, TestDataSetLoadsByName) {
  const Model m = LoadDecoder("llama_kv_opset17");
  std::vector<std::string> names;
  for (const ValueInfo& v : m.graph.inputs) names.push_back(v.name);
  const auto loaded = LoadTestDataSet((Decoders() / "llama_kv_opset17" / "test_data_set_0").string(), names);
  ASSERT_EQ(loaded.size(), names.size());
  Feeds f(loaded.begin(), loaded.end());
  EXPECT_EQ(f.at("input_ids").shape(), (Shape{1, 8}));
  EXPECT_EQ(f.at("past_key_values.0.key").dim(2), 0);
  const auto b = BindDims(m, f);
  EXPECT_EQ(b.at("sequence_length"), 8);
  EXPECT_EQ(b.at("past_sequence_length"), 0);
  EXPECT_EQ(b.at("total_sequence_length"), 8);
  // The recorded logits match PyTorch's (output_0.pb).
  Session s(m);
  const Tensor logits = s.Run(f, {"logits"})[0];
  const Tensor want = LoadTensorPb((Decoders() / "llama_kv_opset17" / "test_data_set_0" / "output_0.pb").string());
  ASSERT_EQ(logits.shape(), want.shape());
  double max_err = 0;
  for (int64_t i = 0; i < want.numel(); ++i) max_err = std::max(max_err, std::abs(logits.DoubleAt(i) - want.DoubleAt(i)));
  EXPECT_LT(max_err, 1e-3);

  EXPECT_NE(ErrorOf([&] { LoadTestDataSet((Decoders() / "missing").string(), names); }).find("not a folder"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { LoadTestDataSet(Decoders().string(), names); }).find("no input_K.pb files"),
            std::string::npos);
}

TEST(Workload, DecoderTraceWorkloadHasPrefillAndGrowingPast) {
  for (const char* name : kDecoders) {
    SCOPED_TRACE(name);
    const Model m = LoadDecoder(name);
    const Workload w = DecoderTraceWorkload(m, 6, 3, 0);
    ASSERT_EQ(w.samples.size(), 4u);
    EXPECT_NE(w.source.find("prefill of 6 tokens + 3 decode steps"), std::string::npos);
    EXPECT_EQ(w.samples[0].at("input_ids").shape(), (Shape{1, 6}));
    EXPECT_EQ(w.samples[0].at("past_key_values.0.key").dim(2), 0);
    for (int k = 1; k <= 3; ++k) {
      const Feeds& f = w.samples[static_cast<size_t>(k)];
      EXPECT_EQ(f.at("input_ids").shape(), (Shape{1, 1}));
      EXPECT_EQ(f.at("past_key_values.1.value").dim(2), 6 + k - 1);  // past grows
      EXPECT_EQ(f.at("attention_mask").dim(1), 6 + k);
      EXPECT_EQ(f.at("position_ids").data<int64_t>()[0], 6 + k - 1);
      EXPECT_LT(MaxOf(f.at("input_ids")), 256);
    }
    // Shapes recorded on prefill and on decode differ.
    EXPECT_NE(RecordShapes(m, w.samples[0]).at("logits").shape, RecordShapes(m, w.samples[2]).at("logits").shape);
  }
}

// An exporter that declares attention_mask float (GPT-2 Megatron exports): generate feeds it so.
TEST(Workload, GenerateFeedsTheDeclaredMaskType) {
  Graph g;
  ValueInfo ids{"input_ids", DataType::kInt64, true, {Dim::Known(1), Dim::Symbolic("seq")}};
  ValueInfo mask{"attention_mask", DataType::kFloat, true, {Dim::Known(1), Dim::Symbolic("total")}};
  ValueInfo past{"past_key_values.0.key", DataType::kFloat, true,
                 {Dim::Known(1), Dim::Symbolic("past"), Dim::Known(4)}};
  g.inputs = {ids, mask, past};
  Tensor table(DataType::kFloat, {16, 4});
  for (int64_t i = 0; i < table.numel(); ++i) table.data<float>()[i] = static_cast<float>((i * 7) % 5);
  g.SetInitializer("table", table);
  g.nodes.push_back(MakeNode("Gather", {"table", "input_ids"}, {"emb"}));
  g.nodes.push_back(MakeNode("Concat", {"past_key_values.0.key", "emb"}, {"present.0.key"}, "cat",
                             {testing::IntAttr("axis", 1)}));
  g.nodes.push_back(MakeNode("MatMul", {"emb", "tableT"}, {"logits"}));
  Tensor tt(DataType::kFloat, {4, 16});
  for (int64_t i = 0; i < tt.numel(); ++i) tt.data<float>()[i] = static_cast<float>((i * 3) % 7);
  g.SetInitializer("tableT", tt);
  g.outputs = {ValueInfo{"logits", DataType::kFloat, true, {Dim::Known(1), Dim::Symbolic("seq"), Dim::Known(16)}},
               ValueInfo{"present.0.key", DataType::kFloat, true,
                         {Dim::Known(1), Dim::Symbolic("total"), Dim::Known(4)}}};
  const Model m = MakeModel(g);
  Session s(m);
  GenerateOptions o;
  o.prompt_ids = {1, 2, 3};
  o.max_new_tokens = 3;
  EXPECT_EQ(ErrorOf([&] { Generate(s, o); }), "");
  const Workload w = DecoderTraceWorkload(m, 3, 2, 0);
  EXPECT_EQ(w.samples[2].at("attention_mask").dtype(), DataType::kFloat);
  // The consistent binding finds total = past + seq from the present output here too.
  const auto b = BindDims(m);
  EXPECT_EQ(b.at("total"), b.at("past") + b.at("seq"));
}

// A model that cannot run at any binding: the error names the node and the dims, and how to bind.
TEST(Workload, FailingRunNamesNodeAndDims) {
  Graph g;
  ValueInfo a{"a", DataType::kFloat, true, {Dim::Symbolic("rows"), Dim::Known(3)}};
  ValueInfo b{"b", DataType::kFloat, true, {Dim::Known(4), Dim::Known(5)}};
  g.inputs = {a, b};
  g.nodes.push_back(MakeNode("MatMul", {"a", "b"}, {"y"}, "mm"));
  g.outputs = {ValueInfo{"y", DataType::kFloat, false, {}}};
  const Model m = MakeModel(g);
  const std::string e = ErrorOf([&] { RecordShapes(m); });
  EXPECT_NE(e.find("node 'mm' (MatMul)"), std::string::npos) << e;
  EXPECT_NE(e.find("rows=1"), std::string::npos) << e;
  EXPECT_NE(e.find("--dim NAME=N"), std::string::npos) << e;
  EXPECT_NE(e.find("-i "), std::string::npos) << e;
}

}  // namespace
}  // namespace gaf
