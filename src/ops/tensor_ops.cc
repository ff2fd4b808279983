#include "ops/kernel.h"
#include "ops/kernel_util.h"

namespace gaf {

void RegisterTensorKernels(OpRegistry& r) {}

}  // namespace gaf
