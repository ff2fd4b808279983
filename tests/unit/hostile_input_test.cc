// Hostile model and input files (issue 11): every one must give a gaf::Error naming what is wrong,
// never a crash, an out-of-bounds access, a huge allocation or a hang. The models are made from
// a serialized IR model plus a hand-encoded initializer appended to its graph (protobuf merges a
// repeated field by appending), so that the initializer can say what the IR would never hold:
// dimensions past 64 bits, data shorter than its dimensions, external data anywhere.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "ir/limits.h"
#include "onnx_io/npy.h"
#include "onnx_io/onnx_io.h"
#include "runtime/session.h"
#include "test_util.h"

namespace gaf {
namespace {
namespace fs = std::filesystem;
using testing::ErrorOf;
using testing::FloatValue;
using testing::IntsAttr;
using testing::MakeModel;
using testing::MakeNode;

// ---- a minimal protobuf encoder ----

std::string Varint(uint64_t v) {
  std::string s;
  do {
    s.push_back(static_cast<char>((v & 0x7f) | (v > 0x7f ? 0x80 : 0)));
    v >>= 7;
  } while (v != 0);
  return s;
}
std::string IntField(int field, uint64_t v) { return Varint(static_cast<uint64_t>(field) << 3) + Varint(v); }
std::string BytesField(int field, const std::string& bytes) {
  return Varint((static_cast<uint64_t>(field) << 3) | 2) + Varint(bytes.size()) + bytes;
}

// TensorProto fields: dims 1, data_type 2, float_data 4, name 8, raw_data 9, external_data 13
// (key 1, value 2), data_location 14 (1 = EXTERNAL).
struct ProtoTensor {
  std::string name = "X";
  std::vector<uint64_t> dims;
  int data_type = 1;  // float
  std::string raw;
  bool has_raw = true;
  std::vector<float> floats;
  std::vector<std::pair<std::string, std::string>> external;

  std::string Encode() const {
    std::string s;
    for (uint64_t d : dims) s += IntField(1, d);
    s += IntField(2, static_cast<uint64_t>(data_type));
    for (float f : floats) {
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      s += Varint((4 << 3) | 5) + std::string(reinterpret_cast<const char*>(&bits), 4);
    }
    s += BytesField(8, name);
    if (!external.empty()) {
      for (const auto& [k, v] : external) s += BytesField(13, BytesField(1, k) + BytesField(2, v));
      s += IntField(14, 1);
    } else if (has_raw) {
      s += BytesField(9, raw);
    }
    return s;
  }
};

// The model `g` (whose nodes may read initializer `t.name`, not defined in `g`) with `t` added.
std::string ModelWith(const Graph& g, const ProtoTensor& t) {
  return ModelToBytes(MakeModel(g, 17)) + BytesField(7, BytesField(5, t.Encode()));
}

// y = op(X, inputs...) for an initializer X (the other inputs are int64 initializers).
Graph OneNode(const std::string& op, std::vector<std::pair<std::string, Tensor>> consts,
              std::vector<Attribute> attrs = {}) {
  Graph g;
  std::vector<std::string> ins{"X"};
  for (auto& [name, t] : consts) {
    ins.push_back(name);
    g.initializers.emplace_back(name, t);
  }
  g.nodes.push_back(MakeNode(op, ins, {"y"}, "hostile_" + op, std::move(attrs)));
  g.outputs.push_back(FloatValue("y", {}));
  g.outputs.back().has_shape = false;
  return g;
}

// Runs the graph made of `nodes` over `g`'s inputs and initializers, output `out`.
std::string RunError(Graph g, std::vector<Node> nodes, const std::string& out,
                     const std::map<std::string, Tensor>& feeds = {}) {
  g.nodes = std::move(nodes);
  g.outputs.push_back(FloatValue(out, {}));
  g.outputs.back().has_shape = false;
  return ErrorOf([&] { Session(MakeModel(g)).Run(feeds); });
}

#define EXPECT_ERROR_HAS(stmt, text) EXPECT_PRED_FORMAT2(::testing::IsSubstring, text, ErrorOf([&] { stmt; }))

// Sets the memory limit for one test.
class ScopedMemoryLimit {
 public:
  explicit ScopedMemoryLimit(int64_t bytes) : old_(GlobalLimits().max_tensor_bytes) {
    GlobalLimits().max_tensor_bytes = bytes;
  }
  ~ScopedMemoryLimit() { GlobalLimits().max_tensor_bytes = old_; }

 private:
  int64_t old_;
};

// A fresh folder per test, removed afterwards.
class HostileFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("gaf_hostile_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& bytes) {
    std::ofstream out(dir_ / name, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return (dir_ / name).string();
  }
  // A model whose float initializer W of `n` elements lives in external data `ext`.
  std::string ExternalModel(std::vector<std::pair<std::string, std::string>> ext, uint64_t n = 4) {
    ProtoTensor t;
    t.name = "W";
    t.dims = {n};
    t.external = std::move(ext);
    Graph g;
    g.nodes.push_back(MakeNode("Identity", {"W"}, {"y"}));
    g.outputs.push_back(FloatValue("y", {static_cast<int64_t>(n)}));
    return Write("model.onnx", ModelWith(g, t));
  }
  static std::string Floats(std::vector<float> v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  }
  fs::path dir_;
};

// ---- 1. sizes: overflow-checked, negative refused, the memory limit ----

TEST(HostileInput, ElementCountsAreOverflowChecked) {
  const int64_t big = int64_t{1} << 32;
  EXPECT_ERROR_HAS(NumElements({big, big}), "more elements than fit in 64 bits");
  EXPECT_ERROR_HAS(NumElements({2, -3}), "negative dimension");
  EXPECT_EQ(NumElements({big, 0, 3}), 0);
  EXPECT_ERROR_HAS(Tensor(DataType::kFloat, {big, big}), "a float tensor of shape [4294967296,4294967296]");
  EXPECT_ERROR_HAS(Tensor::Uninitialized(DataType::kFloat, {big, big}), "more elements than fit in 64 bits");
  EXPECT_ERROR_HAS(Tensor(DataType::kFloat, {-1}), "negative dimension");
  EXPECT_ERROR_HAS(Tensor(DataType::kFloat, {4}).Reshaped({big, big}), "more elements than fit in 64 bits");
  EXPECT_ERROR_HAS(TensorBytes(DataType::kDouble, {int64_t{1} << 61}), "needs more bytes than fit in 64 bits");
  EXPECT_ERROR_HAS(CheckedMul(big, big, "stride"), "stride 4294967296 * 4294967296 overflows");
}

TEST(HostileInput, TensorsPastTheMemoryLimitAreRefused) {
  ScopedMemoryLimit limit(int64_t{1} << 20);
  EXPECT_ERROR_HAS(Tensor(DataType::kFloat, {1024, 1024}),
                   "a float tensor of shape [1024,1024] needs 4 MiB, more than the memory limit 1 MiB (--max-memory)");
  EXPECT_ERROR_HAS(Tensor(DataType::kString, {1 << 20}), "more than the memory limit");
  EXPECT_NO_THROW(Tensor(DataType::kFloat, {512, 512}));
}

TEST(HostileInput, HugeDimsInitializerIsRefusedBeforeScatterNDOrSlice) {
  ProtoTensor t;
  t.dims = {uint64_t{1} << 32, uint64_t{1} << 32};
  t.raw = std::string(64, '\0');  // what an unchecked product (0 elements) would allocate
  Graph scatter = OneNode("ScatterND", {{"i", Tensor::FromVector<int64_t>({0, 5}, {1, 2})}});
  scatter.nodes[0].inputs.push_back("u");
  scatter.initializers.emplace_back("u", Tensor::FromVector<float>({1}, {1}));
  Graph slice = OneNode("Slice", {{"s", Tensor::FromInt64s({0, 0})}, {"e", Tensor::FromInt64s({4, 4})}});
  for (const Graph* g : {&scatter, &slice}) {
    const std::string msg = ErrorOf([&] { ModelFromBytes(ModelWith(*g, t), ".", "huge.onnx"); });
    EXPECT_NE(msg.find("huge.onnx: tensor 'X' of shape [4294967296,4294967296]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("more elements than fit in 64 bits"), std::string::npos) << msg;
  }
  t.dims = {uint64_t{1} << 20, uint64_t{1} << 20};  // fits in 64 bits: 4 TiB, past the limit
  ScopedMemoryLimit limit(int64_t{1} << 30);
  EXPECT_ERROR_HAS(ModelFromBytes(ModelWith(slice, t), ".", "huge.onnx"),
                   "huge.onnx: tensor 'X' of shape [1048576,1048576] needs 4 TiB, more than the memory limit 1 GiB "
                   "(--max-memory)");
  t.dims = {uint64_t{1} << 63};  // negative as int64
  EXPECT_ERROR_HAS(ModelFromBytes(ModelWith(slice, t), ".", "huge.onnx"), "tensor 'X' has a negative dimension");
}

TEST(HostileInput, DataShorterThanDeclaredIsRefusedBeforeAllocating) {
  // A limit no allocation could meet: the error must come from the length check, which runs first
  // (an allocation of 6 GiB would be attempted otherwise).
  ScopedMemoryLimit limit(int64_t{1} << 50);
  Graph g = OneNode("Identity", {});
  ProtoTensor t;
  t.dims = {3, uint64_t{1} << 29};  // 6 GiB of float
  t.raw = "abcd";
  EXPECT_ERROR_HAS(ModelFromBytes(ModelWith(g, t), ".", "short.onnx"),
                   "short.onnx: tensor 'X' has 4 raw bytes, expected 6442450944");
  t.has_raw = false;
  t.floats = {1.f, 2.f};
  EXPECT_ERROR_HAS(ModelFromBytes(ModelWith(g, t), ".", "short.onnx"),
                   "short.onnx: tensor 'X' has 2 values for 1610612736 elements");
  t.dims = {3};
  EXPECT_ERROR_HAS(ModelFromBytes(ModelWith(g, t), ".", "short.onnx"), "has 2 values for 3 elements");
}

TEST(HostileInput, OperatorOutputsPastTheLimitAreErrorsNamingTheNode) {
  ScopedMemoryLimit limit(int64_t{1} << 30);
  Graph g;
  g.inputs.push_back(FloatValue("x", {1}));
  g.initializers.emplace_back("shape", Tensor::FromInt64s({int64_t{1} << 32, int64_t{1} << 32}));
  g.initializers.emplace_back("reps", Tensor::FromInt64s({int64_t{1} << 30}));
  g.initializers.emplace_back("huge_reps", Tensor::FromInt64s({int64_t{1} << 62}));
  const std::map<std::string, Tensor> feeds{{"x", Tensor::FromVector<float>({1}, {1})}};
  std::string msg = RunError(g, {MakeNode("Expand", {"x", "shape"}, {"y"}, "expand")}, "y", feeds);
  EXPECT_NE(msg.find("node 'expand' (Expand): a float tensor of shape [4294967296,4294967296] has more elements"),
            std::string::npos)
      << msg;
  EXPECT_PRED_FORMAT2(::testing::IsSubstring,
                      "node 'tile' (Tile): a float tensor of shape [1073741824] needs 4 GiB, more than the memory "
                      "limit 1 GiB (--max-memory)",
                      RunError(g, {MakeNode("Tile", {"x", "reps"}, {"y"}, "tile")}, "y", feeds));
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "needs more bytes than fit in 64 bits",
                      RunError(g, {MakeNode("Tile", {"x", "huge_reps"}, {"y"}, "tile")}, "y", feeds));
}

TEST(HostileInput, RangeSizesAreChecked) {
  Graph g;
  g.initializers.emplace_back("s", Tensor::Scalar<int64_t>(std::numeric_limits<int64_t>::min()));
  g.initializers.emplace_back("l", Tensor::Scalar<int64_t>(std::numeric_limits<int64_t>::max()));
  g.initializers.emplace_back("d", Tensor::Scalar<int64_t>(1));
  g.initializers.emplace_back("fs", Tensor::Scalar<float>(0));
  g.initializers.emplace_back("fl", Tensor::Scalar<float>(1e30f));
  g.initializers.emplace_back("fd", Tensor::Scalar<float>(1e-30f));
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "has too many elements",
                      RunError(g, {MakeNode("Range", {"s", "l", "d"}, {"y"}, "range")}, "y"));
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "element count 1e+60 is not a valid size",
                      RunError(g, {MakeNode("Range", {"fs", "fl", "fd"}, {"y"}, "range")}, "y"));
}

// ---- 2. .npy files ----

std::string NpyBytes(const std::string& shape, const std::string& data) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + shape + "), }";
  header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
  header.push_back('\n');
  std::string s = std::string("\x93NUMPY\x01\x00", 8);
  s.push_back(static_cast<char>(header.size() & 0xff));
  s.push_back(static_cast<char>(header.size() >> 8));
  return s + header + data;
}

TEST_F(HostileFiles, NpyWithHugeHeaderIsRefusedWithoutAllocating) {
  const std::string huge = Write("huge.npy", NpyBytes("4294967296, 4294967296", std::string(100, '\0')));
  EXPECT_ERROR_HAS(LoadNpy(huge), "huge.npy: array of shape [4294967296,4294967296] has more elements than fit");
  ScopedMemoryLimit limit(int64_t{1} << 50);  // only the file size check stands in the way
  const std::string big = Write("big.npy", NpyBytes("1048576, 1048576", std::string(100, '\0')));
  EXPECT_ERROR_HAS(LoadNpy(big), "big.npy: truncated data (100 of 4398046511104 bytes)");
  const std::string neg = Write("neg.npy", NpyBytes("-4, 2", std::string(100, '\0')));
  EXPECT_ERROR_HAS(LoadNpy(neg), "neg.npy: .npy shape has an invalid dimension '-4'");
  const std::string word = Write("word.npy", NpyBytes("abc,", std::string(100, '\0')));
  EXPECT_ERROR_HAS(LoadTensorFile(word), "invalid dimension 'abc'");
  const std::string ok = Write("ok.npy", NpyBytes("2, 1", Floats({1.5f, 2.5f})));
  Tensor t = LoadNpy(ok);
  EXPECT_EQ(t.shape(), (Shape{2, 1}));
  EXPECT_FLOAT_EQ(t.data<float>()[1], 2.5f);
  ASSERT_EQ(::mkfifo((dir_ / "fifo.npy").c_str(), 0600), 0);
  EXPECT_ERROR_HAS(LoadTensorFile((dir_ / "fifo.npy").string()), "not a regular file");
}

// ---- 3. external data stays in the model's folder ----

TEST_F(HostileFiles, ExternalDataNamesWithDotsInsideAreAccepted) {
  Write("weights..bin", Floats({1, 2, 3, 4}));
  fs::create_directories(dir_ / "sub");
  Write("sub/w.bin", Floats({0, 0, 0, 0, 5, 6, 7, 8}));
  Model m = LoadModel(ExternalModel({{"location", "weights..bin"}}));
  EXPECT_FLOAT_EQ(m.graph.initializers[0].second.data<float>()[3], 4.f);
  m = LoadModel(ExternalModel({{"location", "sub/w.bin"}, {"offset", "16"}, {"length", "16"}}));
  EXPECT_FLOAT_EQ(m.graph.initializers[0].second.data<float>()[0], 5.f);
  fs::create_symlink("weights..bin", dir_ / "link.bin");  // a symlink that stays inside is fine
  m = LoadModel(ExternalModel({{"location", "link.bin"}}));
  EXPECT_FLOAT_EQ(m.graph.initializers[0].second.data<float>()[0], 1.f);
}

TEST_F(HostileFiles, ExternalDataOutsideTheFolderIsRefused) {
  fs::create_symlink("/etc/passwd", dir_ / "passwd.bin");
  EXPECT_ERROR_HAS(LoadModel(ExternalModel({{"location", "passwd.bin"}})),
                   "tensor 'W': external location 'passwd.bin' resolves to '/etc/passwd', outside the model's folder");
  fs::create_directories(dir_ / "sub");
  fs::create_directory_symlink("/etc", dir_ / "sub" / "etc");
  EXPECT_ERROR_HAS(LoadModel(ExternalModel({{"location", "sub/etc/passwd"}})), "outside the model's folder");
  EXPECT_ERROR_HAS(LoadModel(ExternalModel({{"location", "../passwd.bin"}})),
                   "external location '../passwd.bin' must be a relative path inside the model's folder");
  EXPECT_ERROR_HAS(LoadModel(ExternalModel({{"location", "sub/../../x.bin"}})), "must be a relative path");
  EXPECT_ERROR_HAS(LoadModel(ExternalModel({{"location", "/etc/passwd"}})), "must be a relative path");
  EXPECT_ERROR_HAS(LoadModel(ExternalModel({{"location", "sub"}})), "sub' is not a regular file");
  EXPECT_ERROR_HAS(LoadModel(ExternalModel({{"location", "missing.bin"}})), "cannot be opened");
}

TEST_F(HostileFiles, FifoAsExternalDataIsRefusedWithoutBlocking) {
  ASSERT_EQ(::mkfifo((dir_ / "fifo.bin").c_str(), 0600), 0);
  const std::string model = ExternalModel({{"location", "fifo.bin"}});
  auto result = std::async(std::launch::async, [&] { return ErrorOf([&] { LoadModel(model); }); });
  if (result.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    // Unblock the reader (open for writing, then close: it sees end of file) so the test ends.
    ::close(::open((dir_ / "fifo.bin").c_str(), O_WRONLY));
    FAIL() << "loading a model whose external data is a FIFO blocked";
  }
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "fifo.bin' is not a regular file", result.get());
}

TEST_F(HostileFiles, ExternalOffsetsAndLengthsAreCheckedNumbers) {
  Write("w.bin", Floats({1, 2, 3, 4}));
  EXPECT_ERROR_HAS(LoadModel(ExternalModel({{"location", "w.bin"}, {"offset", "abc"}})),
                   "model.onnx: tensor 'W': external data offset 'abc' is not a number");
  EXPECT_ERROR_HAS(LoadModel(ExternalModel({{"location", "w.bin"}, {"length", "16x"}})),
                   "tensor 'W': external data length '16x' is not a number");
  EXPECT_ERROR_HAS(LoadModel(ExternalModel({{"location", "w.bin"}, {"offset", "99999999999999999999"}})),
                   "external data offset '99999999999999999999' is too large");
  EXPECT_ERROR_HAS(LoadModel(ExternalModel({{"location", "w.bin"}, {"offset", "-4"}})), "offset -4 is negative");
  EXPECT_ERROR_HAS(LoadModel(ExternalModel({{"location", "w.bin"}, {"offset", "4"}})),
                   "(16 bytes) is too short for 16 bytes at offset 4");
  EXPECT_ERROR_HAS(LoadModel(ExternalModel({{"location", "w.bin"}, {"offset", "9223372036854775807"}})),
                   "is too short");
  EXPECT_ERROR_HAS(LoadModel(ExternalModel({{"location", "w.bin"}, {"length", "8"}})), "external length 8 != 16");
  ScopedMemoryLimit limit(int64_t{1} << 50);  // 6 GiB declared over a 16-byte file: no allocation
  EXPECT_ERROR_HAS(LoadModel(ExternalModel({{"location", "w.bin"}}, uint64_t{3} << 29)), "is too short");
}

// ---- 4. windows larger than their input ----

TEST(HostileInput, ConvOrPoolKernelLargerThanInputIsAnErrorNamingTheNode) {
  Graph g;
  g.inputs.push_back(FloatValue("x", {1, 1, 3, 3}));
  g.initializers.emplace_back("w", Tensor(DataType::kFloat, {2, 1, 5, 5}));
  const std::map<std::string, Tensor> feeds{{"x", Tensor(DataType::kFloat, {1, 1, 3, 3})}};
  EXPECT_PRED_FORMAT2(::testing::IsSubstring,
                      "node 'big_kernel' (Conv): kernel extent 5 is larger than the padded input size 3 along "
                      "spatial axis 0 (input 3, pads 0+0)",
                      RunError(g, {MakeNode("Conv", {"x", "w"}, {"y"}, "big_kernel")}, "y", feeds));
  EXPECT_PRED_FORMAT2(
      ::testing::IsSubstring, "node 'big_pool' (MaxPool): kernel extent 4 is larger than the padded input size 3",
      RunError(g, {MakeNode("MaxPool", {"x"}, {"y"}, "big_pool", {IntsAttr("kernel_shape", {4, 4})})}, "y", feeds));
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "kernel extent 7 is larger",  // dilation 3: (3 - 1) * 3 + 1
                      RunError(g,
                               {MakeNode("AveragePool", {"x"}, {"y"}, "pool",
                                         {IntsAttr("kernel_shape", {3, 3}), IntsAttr("dilations", {3, 3})})},
                               "y", feeds));
  g.nodes.push_back(MakeNode("Conv", {"x", "w"}, {"y"}, "padded", {IntsAttr("pads", {1, 1, 1, 1})}));
  g.outputs.push_back(FloatValue("y", {1, 2, 1, 1}));  // 3 + 1 + 1 = 5: one output position
  EXPECT_EQ(Session(MakeModel(g)).Run(feeds)[0].shape(), (Shape{1, 2, 1, 1}));
}

}  // namespace
}  // namespace gaf
