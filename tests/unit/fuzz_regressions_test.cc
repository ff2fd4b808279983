// Every input a fuzzer once crashed on (tests/fuzz/regressions/HARNESS/*, see scripts/fuzz.sh),
// replayed through the same harness body in the normal suite: each must end in a gaf::Error or a
// result, never a signal or another exception.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../fuzz/fuzz_targets.h"

namespace gaf {
namespace {
namespace fs = std::filesystem;

int Replay(const std::string& harness, void (*body)(const std::string&)) {
  const fs::path dir = fs::path(GAF_SOURCE_DIR) / "tests" / "fuzz" / "regressions" / harness;
  int n = 0;
  if (!fs::exists(dir)) return 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file() || e.path().filename() == "README") continue;
    std::ifstream in(e.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    SCOPED_TRACE(e.path().string());
    EXPECT_NO_THROW(body(bytes));
    ++n;
  }
  return n;
}

TEST(FuzzRegressions, SavedInputsEndCleanly) {
  const Limits saved = GlobalLimits();
  fuzz::TightLimits();
  int n = Replay("model", fuzz::ModelInput) + Replay("fuse", fuzz::FuseInput) + Replay("rules", fuzz::RulesInput) +
          Replay("tensor", fuzz::TensorInput);
  GlobalLimits() = saved;
  std::printf("replayed %d saved fuzz inputs\n", n);
}

}  // namespace
}  // namespace gaf
