#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "onnx_io/npy.h"
#include "onnx_io/onnx_io.h"
#include "runtime/session.h"
#include "test_util.h"

namespace gaf {
namespace {
namespace fs = std::filesystem;
using testing::FloatValue;
using testing::MakeModel;
using testing::MakeNode;

fs::path TempDir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("gaf_test_" + name + "_" + std::to_string(::getpid()));
  fs::create_directories(p);
  return p;
}

// y = Relu(x + b) with an initializer, a model-local function, metadata and a subgraph.
Model SampleModel() {
  Graph g;
  g.name = "sample";
  g.inputs.push_back(FloatValue("x", {-1, 4}));
  g.outputs.push_back(FloatValue("y", {-1, 4}));
  g.initializers.emplace_back("b", Tensor::FromVector<float>({1, -2, 3, -4}, {4}));
  g.nodes.push_back(MakeNode("Add", {"x", "b"}, {"s"}, "add0"));
  Node call = MakeNode("MyRelu", {"s"}, {"y"}, "call0");
  call.domain = "local";
  g.nodes.push_back(call);
  Model m = MakeModel(std::move(g));
  m.opset_imports.push_back({"local", 1});
  m.producer_name = "unit-test";
  m.metadata_props.emplace_back("purpose", "round trip");
  Function f;
  f.name = "MyRelu";
  f.domain = "local";
  f.inputs = {"a"};
  f.outputs = {"r"};
  f.nodes.push_back(MakeNode("Relu", {"a"}, {"r"}, "inner"));
  f.opset_imports.push_back({"", 17});
  m.functions.push_back(f);
  return m;
}

TEST(OnnxIo, RoundTripKeepsEverything) {
  Model m = SampleModel();
  std::string bytes = ModelToBytes(m);
  Model r = ModelFromBytes(bytes, ".", "memory");
  EXPECT_EQ(r.producer_name, "unit-test");
  ASSERT_EQ(r.metadata_props.size(), 1u);
  EXPECT_EQ(r.metadata_props[0].second, "round trip");
  ASSERT_EQ(r.functions.size(), 1u);
  EXPECT_EQ(r.functions[0].nodes[0].name, "inner");
  EXPECT_EQ(r.OpsetVersion("local"), 1);
  ASSERT_EQ(r.graph.nodes.size(), 2u);
  EXPECT_EQ(r.graph.nodes[0].name, "add0");
  EXPECT_EQ(r.graph.inputs[0].dims[0].param, "N");
  const Tensor* b = r.graph.FindInitializer("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->data<float>()[3], -4.f);
  // Serializing again gives the same bytes: nothing is lost or reordered.
  EXPECT_EQ(ModelToBytes(r), bytes);
  EXPECT_EQ(CheckModel(r), "");
}

TEST(OnnxIo, FunctionsRunThroughTheirBodies) {
  Session s(SampleModel());
  auto out = s.Run({{"x", Tensor::FromVector<float>({1, 1, 1, 1, -5, 5, -5, 5}, {2, 4})}});
  ASSERT_EQ(out.size(), 1u);
  std::vector<float> want = {2, 0, 4, 0, 0, 3, 0, 1};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(out[0].data<float>()[i], want[i]) << i;
}

TEST(OnnxIo, ExternalDataSaveAndLoad) {
  fs::path dir = TempDir("ext");
  Model m = SampleModel();
  std::vector<float> big(4096);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i);
  m.graph.initializers.emplace_back("unused_big", Tensor::FromVector<float>(big, {4096}));
  SaveOptions opts;
  opts.external_data = true;
  const std::string data = SaveModel(m, (dir / "m.onnx").string(), opts);
  EXPECT_EQ(fs::path(data).parent_path(), dir);
  EXPECT_TRUE(fs::exists(data)) << data;
  EXPECT_EQ(fs::path(data).filename().string().rfind("m.onnx.", 0), 0u) << data;
  EXPECT_LT(fs::file_size(dir / "m.onnx"), 4096u);
  Model r = LoadModel((dir / "m.onnx").string());
  const Tensor* t = r.graph.FindInitializer("unused_big");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->data<float>()[4095], 4095.f);
  fs::remove_all(dir);
}

TEST(OnnxIo, SaveIsAtomicAndLeavesNoTemporaryFiles) {
  fs::path dir = TempDir("atomic");
  SaveModel(SampleModel(), (dir / "m.onnx").string());
  int files = 0;
  for (auto& e : fs::directory_iterator(dir)) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 1);
  fs::remove_all(dir);
}

TEST(OnnxIo, ClearErrorsForBadFiles) {
  fs::path dir = TempDir("bad");
  EXPECT_THROW(LoadModel((dir / "missing.onnx").string()), Error);
  std::ofstream((dir / "text.onnx").string()) << "this is not a protobuf at all";
  try {
    LoadModel((dir / "text.onnx").string());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("text.onnx"), std::string::npos) << e.what();
  }
  std::ofstream((dir / "empty.onnx").string()).close();
  EXPECT_THROW(LoadModel((dir / "empty.onnx").string()), Error);
  fs::remove_all(dir);
}

TEST(OnnxIo, VerifierNamesTheNode) {
  Graph g;
  g.inputs.push_back(FloatValue("x", {2}));
  g.outputs.push_back(FloatValue("y", {2}));
  g.nodes.push_back(MakeNode("Relu", {"nowhere"}, {"y"}, "bad_relu"));
  auto problems = VerifyGraph(g);
  ASSERT_FALSE(problems.empty());
  EXPECT_NE(problems[0].find("bad_relu"), std::string::npos) << problems[0];
  EXPECT_NE(problems[0].find("nowhere"), std::string::npos) << problems[0];
}

TEST(OnnxIo, UnsupportedOperatorIsNamed) {
  Graph g;
  g.inputs.push_back(FloatValue("x", {2}));
  g.outputs.push_back(FloatValue("y", {2}));
  g.nodes.push_back(MakeNode("NoSuchOp", {"x"}, {"y"}, "mystery"));
  try {
    Session s(MakeModel(g));
    FAIL() << "expected UnsupportedError";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("mystery"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("NoSuchOp"), std::string::npos) << e.what();
  }
}

TEST(OnnxIo, WrongInputShapeOrTypeIsAnError) {
  Session s(SampleModel());
  EXPECT_THROW(s.Run({{"x", Tensor::FromVector<float>({1, 2, 3}, {3})}}), Error);
  EXPECT_THROW(s.Run({{"x", Tensor::FromVector<int64_t>({1, 2, 3, 4}, {1, 4})}}), Error);
  EXPECT_THROW(s.Run({}), Error);
}

TEST(OnnxIo, NpyRoundTrip) {
  fs::path dir = TempDir("npy");
  Tensor t = Tensor::FromVector<float>({1.5f, -2, 3, 4, 5, 6}, {2, 3});
  SaveNpy(t, (dir / "t.npy").string());
  Tensor r = LoadNpy((dir / "t.npy").string());
  EXPECT_EQ(r.shape(), t.shape());
  EXPECT_EQ(r.data<float>()[0], 1.5f);
  fs::remove_all(dir);
}

// Truncated and byte-flipped real exports must give gaf::Error (or run), never crash.
TEST(OnnxIo, CorruptedModelsNeverCrash) {
  // The repository's own torch.onnx.export fixtures always; ONNX Runtime's graphs too when present.
  std::vector<std::string> models;
  const fs::path fixtures = fs::path(GAF_SOURCE_DIR) / "tests" / "fixtures" / "torch";
  for (const char* n : {"bert_like", "lstm_tagger", "mobile_like"}) models.push_back((fixtures / n / "model.onnx").string());
  fs::path shared = testing::OrtFusionDir();
  for (const char* n : {"attention_distilbert.onnx", "bias_gelu_fusion.onnx", "layer_norm_with_cast.onnx"})
    if (fs::exists(shared / n)) models.push_back((shared / n).string());
  std::mt19937 rng(1234);
  int errors = 0, loaded = 0;
  for (const std::string& path : models) {
    std::ifstream in(path, std::ios::binary);
    ASSERT_TRUE(in) << path;
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (int trial = 0; trial < 60; ++trial) {
      std::string b = bytes;
      if (trial % 3 == 0) {
        b.resize(rng() % b.size());
      } else {
        for (int k = 0; k < 1 + trial % 5; ++k) b[rng() % b.size()] ^= static_cast<char>(1 + rng() % 255);
      }
      try {
        Model m = ModelFromBytes(b, ".", "corrupt");
        ++loaded;
        Session s(m);
        std::map<std::string, Tensor> feeds;
        for (const ValueInfo& v : s.inputs()) {
          Shape shape;
          for (const Dim& d : v.dims) shape.push_back(d.known() ? std::min<int64_t>(d.value, 64) : 1);
          feeds[v.name] = Tensor(v.dtype == DataType::kUndefined ? DataType::kFloat : v.dtype, shape);
        }
        s.Run(feeds);
      } catch (const Error&) {
        ++errors;
      }
    }
  }
  EXPECT_GT(errors, 0);
}

}  // namespace
}  // namespace gaf
