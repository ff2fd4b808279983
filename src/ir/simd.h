// The vector instructions the build targets, for the files that use intrinsics (ir/half.cc,
// ops/gemv.cc): GAF_AVX512 is 1 with AVX-512 F+BW+VL (masked loads of float and half lanes),
// and <immintrin.h> is included with AVX-512 or F16C; other machines take portable loops.
#pragma once

#include <cstdint>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define GAF_AVX512 1
#else
#define GAF_AVX512 0
#endif
#if GAF_AVX512 || (defined(__F16C__) && defined(__AVX__))
#include <immintrin.h>
#endif

namespace gaf {

#if GAF_AVX512
// Lanes of the next 16 elements when `left` remain.
inline __mmask16 Mask16(int64_t left) {
  return left >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << left) - 1);
}
#endif

}  // namespace gaf
