// Output files: nothing half-written, nothing lost (ir/output_file.h, SaveModel).
#include "ir/output_file.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "ir/error.h"
#include "onnx_io/onnx_io.h"
#include "test_util.h"

namespace gaf {
namespace {
namespace fs = std::filesystem;

fs::path FreshDir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("gaf_outfile_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

int CountTemps(const fs::path& dir) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.path().filename().string().find(".gaf-tmp.") != std::string::npos;
  return n;
}

std::string Slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(OutputFile, RefusesDestinationsThatAreNotRegularFiles) {
  const fs::path d = FreshDir("refuse");
  std::ofstream(d / "target") << "keep";
  fs::create_symlink(d / "target", d / "link");
  ASSERT_EQ(::mkfifo((d / "fifo").c_str(), 0600), 0);
  fs::create_directories(d / "folder");
  for (const char* n : {"link", "fifo", "folder"}) EXPECT_THROW(CheckOutputPath((d / n).string()), Error) << n;
  EXPECT_THROW(CheckOutputPath("/dev/null"), Error);
  EXPECT_NO_THROW(CheckOutputPath((d / "target").string()));
  EXPECT_NO_THROW(CheckOutputPath((d / "new").string()));
  EXPECT_THROW(WriteFileAtomic((d / "link").string(), "x"), Error);
  EXPECT_EQ(Slurp(d / "target"), "keep");
  EXPECT_TRUE(fs::is_symlink(d / "link"));
  fs::remove_all(d);
}

TEST(OutputFile, RefusesAnInputAsOutputUnlessOverwrite) {
  const fs::path d = FreshDir("input");
  std::ofstream(d / "m.onnx") << "model";
  try {
    CheckOutputPath((d / "." / "m.onnx").string(), {(d / "m.onnx").string()}, false, "-o");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--overwrite"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(CheckOutputPath((d / "m.onnx").string(), {(d / "m.onnx").string()}, true, "-o"));
  EXPECT_NO_THROW(CheckOutputPath((d / "other.onnx").string(), {(d / "m.onnx").string()}, false, "-o"));
  fs::remove_all(d);
}

TEST(OutputFile, TemporaryRemovedUnlessCommitted) {
  const fs::path d = FreshDir("temp");
  {
    TempFile t((d / "a.bin").string());
    t.Write("abc", 3);
    EXPECT_EQ(CountTemps(d), 1);
  }
  EXPECT_EQ(CountTemps(d), 0);
  EXPECT_FALSE(fs::exists(d / "a.bin"));
  {
    TempFile t((d / "a.bin").string());
    t.Write("abc", 3);
    t.Commit();
  }
  EXPECT_EQ(Slurp(d / "a.bin"), "abc");
  EXPECT_EQ(CountTemps(d), 0);
  fs::remove_all(d);
}

TEST(OutputFile, StaleTemporariesOfDeadProcessesAreRemoved) {
  const fs::path d = FreshDir("stale");
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ::waitpid(child, nullptr, 0);  // its pid now names no process
  const fs::path dead = d / (".m.onnx.data.gaf-tmp." + std::to_string(child) + ".0");
  const fs::path alive = d / (".m.onnx.gaf-tmp." + std::to_string(::getpid()) + ".999");
  std::ofstream(dead) << "junk";
  std::ofstream(alive) << "busy";
  std::ofstream(d / "user.tmp.1") << "not ours";
  WriteFileAtomic((d / "out.txt").string(), "x");
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(alive));
  EXPECT_TRUE(fs::exists(d / "user.tmp.1"));
  fs::remove_all(d);
}

TEST(OutputFile, SigtermDuringAWriteRemovesTheTemporary) {
  const fs::path d = FreshDir("signal");
  const pid_t child = ::fork();
  if (child == 0) {
    TempFile t((d / "big.data").string());
    t.Write("partial", 7);
    ::raise(SIGTERM);
    ::_exit(3);  // not reached
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << status;
  EXPECT_EQ(CountTemps(d), 0);
  EXPECT_FALSE(fs::exists(d / "big.data"));
  fs::remove_all(d);
}

Model WeightModel(float value) {
  Graph g;
  g.inputs.push_back(testing::FloatValue("x", {1024}));
  g.outputs.push_back(testing::FloatValue("y", {1024}));
  std::vector<float> w(1024, value);
  g.initializers.emplace_back("w", Tensor::FromVector<float>(w, {1024}));
  g.nodes.push_back(testing::MakeNode("Add", {"x", "w"}, {"y"}, "add"));
  return testing::MakeModel(std::move(g));
}

// The data file is named by its content and written before the model: the model always names
// data that exists and is its own; the old data file goes once the new model is in place.
TEST(OutputFile, ModelAndExternalDataNeverMismatch) {
  const fs::path d = FreshDir("pair");
  SaveOptions so;
  so.external_data = true;
  const std::string first = SaveModel(WeightModel(1.f), (d / "m.onnx").string(), so);
  const std::string second = SaveModel(WeightModel(2.f), (d / "m.onnx").string(), so);
  EXPECT_NE(first, second);
  EXPECT_FALSE(fs::exists(first)) << "the old data file stays behind";
  EXPECT_TRUE(fs::exists(second));
  Model r = LoadModel((d / "m.onnx").string());
  EXPECT_EQ(r.graph.FindInitializer("w")->data<float>()[1000], 2.f);
  EXPECT_EQ(CountTemps(d), 0);
  fs::remove_all(d);
}

TEST(OutputFile, DistinctFileNamesForDistinctTensorNames) {
  std::set<std::string> taken;
  const std::string a = DistinctFileName("a/b", taken), b = DistinctFileName("a_b", taken),
                    c = DistinctFileName("../x", taken), e = DistinctFileName("", taken);
  EXPECT_NE(a, b);
  EXPECT_EQ(c.find('/'), std::string::npos);
  EXPECT_NE(c[0], '.');
  EXPECT_FALSE(e.empty());
}

}  // namespace
}  // namespace gaf
