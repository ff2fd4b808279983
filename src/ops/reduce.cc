#include "ops/kernel.h"
#include "ops/kernel_util.h"

namespace gaf {

void RegisterReduceKernels(OpRegistry& r) {}

}  // namespace gaf
