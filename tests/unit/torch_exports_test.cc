// Models exported by torch.onnx.export (tests/fixtures/make_torch_exports.py) run in our runtime
// and agree with PyTorch's own outputs, stored next to each model.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "onnx_io/npy.h"
#include "onnx_io/onnx_io.h"
#include "runtime/session.h"

namespace gaf {
namespace {
namespace fs = std::filesystem;

fs::path FixtureDir() { return fs::path(GAF_SOURCE_DIR) / "tests" / "fixtures" / "torch"; }

class TorchExport : public ::testing::TestWithParam<std::string> {};

TEST_P(TorchExport, MatchesPyTorch) {
  fs::path dir = FixtureDir() / GetParam();
  Model m = LoadModel((dir / "model.onnx").string());
  Session s(m, SessionOptions{2});
  std::map<std::string, Tensor> feeds;
  for (const ValueInfo& v : s.inputs()) feeds[v.name] = LoadNpy((dir / (v.name + ".npy")).string());
  std::vector<Tensor> outs = s.Run(feeds);
  ASSERT_FALSE(outs.empty());
  for (size_t i = 0; i < outs.size(); ++i) {
    Tensor want = LoadNpy((dir / ("expected_output_" + std::to_string(i) + ".npy")).string());
    ASSERT_EQ(outs[i].shape(), want.shape()) << "output " << i;
    std::vector<double> g = outs[i].ToDoubles(), w = want.ToDoubles();
    double max_err = 0;
    for (size_t k = 0; k < w.size(); ++k) {
      double e = std::fabs(g[k] - w[k]);
      max_err = std::max(max_err, e);
      ASSERT_LE(e, 1e-4 + 1e-3 * std::fabs(w[k])) << GetParam() << " output " << i << " element " << k;
    }
    RecordProperty("max_abs_error_" + std::to_string(i), std::to_string(max_err));
  }
}

std::vector<std::string> Fixtures() {
  std::vector<std::string> names;
  if (fs::exists(FixtureDir()))
    for (const auto& e : fs::directory_iterator(FixtureDir()))
      if (fs::exists(e.path() / "model.onnx")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TorchExport, ::testing::ValuesIn(Fixtures()));

TEST(TorchExportFixtures, ArePresent) { EXPECT_GE(Fixtures().size(), 5u); }

}  // namespace
}  // namespace gaf
