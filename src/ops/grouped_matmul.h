// What the attention plan nodes share (ops/grouped_matmul.cc, ops/fused_attention.cc).
#pragma once

#include <cstdint>
#include <vector>

#include "ir/tensor.h"

namespace gaf {

// Repeat factor r when Reshape(Expand(Unsqueeze(x, 2), e), s) of x = [b, g, t, d] is [b, g*r, t, d]
// with each cache head repeated r times (torch's repeat_kv); 0 otherwise.
int64_t KvRepeat(const Shape& x, const std::vector<int64_t>& e, const std::vector<int64_t>& s);

}  // namespace gaf
