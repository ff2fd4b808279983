// float16 / bfloat16 conversions (see ir/half.h).
#include "ir/half.h"

#include <cmath>
#include <cstring>

#include "ir/simd.h"

namespace gaf {

float HalfToFloat(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400) == 0);
      mant &= 0x3ff;
      bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // inf or nan
    return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0));
  }
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (absx < 0x38800000u) {  // subnormal or zero in half
    // value = absx as float; half subnormal unit = 2^-24
    float af;
    std::memcpy(&af, &absx, 4);
    float scaled = af * 16777216.0f;  // / 2^-24
    uint32_t m = static_cast<uint32_t>(std::nearbyint(scaled));
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t exp = ((absx >> 23) - 127 + 15);
  uint32_t mant = absx & 0x7fffffu;
  uint32_t h = (exp << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // round to nearest even
  return static_cast<uint16_t>(sign | h);
}

void HalfToFloatLoop(const uint16_t* in, float* out, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__) && defined(__AVX__)
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
#endif
  for (; i < n; ++i) out[i] = HalfToFloat(in[i]);
}

void FloatToHalfLoop(const float* in, uint16_t* out, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__) && defined(__AVX__)
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
#endif
  for (; i < n; ++i) out[i] = FloatToHalf(in[i]);
}

// dst[0:n] = float(src[0:n]), src IEEE half bits.
void HalfToFloatRow(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
#if GAF_AVX512
  for (; i < n; i += 16) {
    const __mmask16 m = Mask16(n - i);
    _mm512_mask_storeu_ps(dst + i, m, _mm512_maskz_cvtph_ps(m, _mm256_maskz_loadu_epi16(m, src + i)));
  }
#elif defined(__F16C__) && defined(__AVX__)
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
#endif
  for (; i < n; ++i) dst[i] = HalfBitsToFloat(src[i]);
}

void FloatToHalfRow(const float* src, uint16_t* dst, int64_t n) {
#if GAF_AVX512
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = Mask16(n - i);
    const __m512 f = _mm512_maskz_loadu_ps(m, src + i);
    _mm256_mask_storeu_epi16(
        dst + i, m, _mm512_maskz_cvtps_ph(m, f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
#else
  FloatToHalfLoop(src, dst, n);
#endif
}

}  // namespace gaf
