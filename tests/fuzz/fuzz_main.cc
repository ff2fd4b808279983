// The libFuzzer entry points of every harness: one of the bodies of fuzz_targets.h, chosen by
// GAF_FUZZ_BODY at build time (tests/fuzz/CMakeLists.txt: fuzz_model, fuzz_fuse, fuzz_rules, fuzz_tensor).
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_targets.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  gaf::fuzz::TightLimits();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gaf::fuzz::GAF_FUZZ_BODY(std::string(reinterpret_cast<const char*>(data), size));
  return 0;
}
