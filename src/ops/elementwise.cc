#include "ops/kernel.h"
#include "ops/kernel_util.h"

namespace gaf {

void RegisterElementwiseKernels(OpRegistry& r) {}

}  // namespace gaf
