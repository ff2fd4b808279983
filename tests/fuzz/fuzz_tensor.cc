// libFuzzer harness: .npy and TensorProto readers (tests/fuzz/fuzz_targets.h).
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_targets.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  gaf::fuzz::TightLimits();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gaf::fuzz::TensorInput(std::string(reinterpret_cast<const char*>(data), size));
  return 0;
}
