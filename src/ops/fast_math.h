// Vectorizable float approximations of exp, tanh, sigmoid and erf (the compiler turns loops of
// these into SIMD code; the libm calls it would otherwise emit are scalar). Shared by the reference
// kernels and by generated fused kernels, which embed this file verbatim (so it includes only
// standard headers and defines everything inline in namespace gaf_fast).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace gaf_fast {

inline float Pow2I(int32_t n) { return std::bit_cast<float>(static_cast<int32_t>((n + 127) << 23)); }

// exp(x) = 2^n * e^r with |r| <= ln2/2 and a Cephes polynomial; about 1 ulp.
inline float FastExp(float x) {
  float xc = x < 89.f ? x : 89.f;  // NaN -> 89 here, restored at the end
  xc = xc > -104.f ? xc : -104.f;
  float fn = (xc * 1.44269504088896341f + 12582912.f) - 12582912.f;  // round to nearest
  float r = xc - fn * 0.693359375f;
  r = r - fn * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = p * r * r + r + 1.f;
  int32_t n = static_cast<int32_t>(fn);
  int32_t n1 = n >> 1;
  // Two scale factors keep 2^n representable for subnormal and overflowing results.
  y = y * Pow2I(n1) * Pow2I(n - n1);
  return x == x ? y : x;
}

// Cephes tanhf: odd polynomial below 0.625, 1 - 2/(e^{2|x|}+1) above.
inline float FastTanh(float x) {
  float ax = std::fabs(x);
  float z = x * x;
  float sp = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z +
               1.33314422036e-1f) * z - 3.33332819422e-1f) * z * x + x;
  float e = FastExp(2.f * ax);
  float lp = std::copysign(1.f - 2.f / (e + 1.f), x);
  return ax < 0.625f ? sp : lp;
}

inline float FastSigmoid(float x) { return 1.f / (1.f + FastExp(-x)); }

// erf: Taylor series below 0.5, Abramowitz-Stegun 7.1.26 above (abs error < 2e-7).
inline float FastErf(float x) {
  float ax = std::fabs(x);
  float z = x * x;
  float s = x * (1.1283791671f +
                 z * (-0.3761263890f +
                      z * (0.1128379167f +
                           z * (-0.0268661706f +
                                z * (0.00522397762f + z * (-0.000854832702f + z * 0.000120553362f))))));
  float t = 1.f / (1.f + 0.3275911f * ax);
  float poly = ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t +
                0.254829592f) * t;
  float l = std::copysign(1.f - poly * FastExp(-z), x);
  return ax < 0.5f ? s : l;
}

}  // namespace gaf_fast
