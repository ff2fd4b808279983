#include "ops/kernel.h"
#include "ops/kernel_util.h"

namespace gaf {

void RegisterNnKernels(OpRegistry& r) {}

}  // namespace gaf
