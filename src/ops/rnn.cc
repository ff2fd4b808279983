#include "ops/kernel.h"
#include "ops/kernel_util.h"

namespace gaf {

void RegisterRnnKernels(OpRegistry& r) {}

}  // namespace gaf
