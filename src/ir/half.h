// IEEE float16 and bfloat16 <-> float32 conversions, one element at a time and over arrays
// (F16C / AVX-512 where the build has them). Every non-NaN value converts the same way in all of
// them: float16 and bfloat16 to float32 exactly (subnormals included), float32 to the 16-bit
// types rounded to nearest even, overflow to infinity. They differ in the bits of NaNs only:
//
// - HalfToFloat keeps a float16 NaN's payload as it is (a signalling NaN stays signalling);
//   HalfBitsToFloat, F16C and AVX-512 quiet it (payload kept). FloatToHalf turns every NaN into
//   the quiet NaN 0x7e00 (sign kept); F16C and AVX-512 keep the payload's top 10 bits, quieted.
// - The *Loop functions (the Cast kernel's) convert blocks of 8 with F16C and the rest (the last
//   n % 8 elements, or all of them without F16C) with HalfToFloat / FloatToHalf, so a NaN's bits
//   there depend on where it stands. HalfToFloatRow converts every element the F16C way (AVX-512,
//   or F16C and then HalfBitsToFloat); FloatToHalfRow is AVX-512 on every element where the build
//   has it, FloatToHalfLoop otherwise.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

namespace gaf {

// IEEE half and bfloat16 conversions (round to nearest even).
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);

inline float BFloat16ToFloat(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t FloatToBFloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // nan
  uint32_t lsb = (x >> 16) & 1u;
  x += 0x7fffu + lsb;
  return static_cast<uint16_t>(x >> 16);
}

// IEEE half bits to float with integer blends, so that loops of it vectorize (gaf::HalfToFloat
// normalizes subnormals in a loop; a select on a float result would not be if-converted).
inline float HalfBitsToFloat(uint16_t h) {
  const uint32_t em = h & 0x7fffu;
  const uint32_t special = em > 0x7c00u ? 0x7fc00000u : em == 0x7c00u ? 0x7f800000u : 0u;
  const uint32_t normal =  // rebias the exponent; inf stays inf, nan is quieted as in F16C
      ((em << 13) + ((127 - 15) << 23)) | special;
  const uint32_t subnormal =  // zero and subnormals: exact, and a normal float
      std::bit_cast<uint32_t>(static_cast<float>(static_cast<int32_t>(em)) * 0x1p-24f);
  const uint32_t is_subnormal = em < 0x0400u ? ~0u : 0u;
  return std::bit_cast<float>((subnormal & is_subnormal) | (normal & ~is_subnormal) |
                              (uint32_t{h} & 0x8000u) << 16);
}

// out[0:n] = float(in[0:n]) / float16 bits of in[0:n]: F16C on blocks of 8, HalfToFloat /
// FloatToHalf on the rest (the Cast kernel's conversions).
void HalfToFloatLoop(const uint16_t* in, float* out, int64_t n);
void FloatToHalfLoop(const float* in, uint16_t* out, int64_t n);

// dst[0:n] = float(src[0:n]), src IEEE half bits, every element converted as F16C does (the
// float16-weight GEMV and MatMul widen their weight rows with it).
void HalfToFloatRow(const uint16_t* src, float* dst, int64_t n);
// dst[0:n] = float16 bits of src[0:n]: AVX-512 masked stores for all of them where the build has
// AVX-512 F+BW+VL, FloatToHalfLoop otherwise (ConvertToHalf's conversion).
void FloatToHalfRow(const float* src, uint16_t* dst, int64_t n);

}  // namespace gaf
