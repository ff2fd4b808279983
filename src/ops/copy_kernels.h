// Register-level copy kernels shared by Slice/Transpose (tensor_ops.cc) and FusedCopy
// (fused_copy.cc): every other 4-byte element, and 8x8 blocks of 4-byte elements transposed.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace gaf {

// dst[j] = src[2 j] for j in [0, n), 4-byte elements (callers check the size: Slice with step 2 on
// the last axis, as the Focus / space-to-depth blocks of YOLO detectors write it).
template <class T>
inline void EveryOther4(const T* src, T* dst, int64_t n) {
  int64_t j = 0;
#ifdef __AVX512F__
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  // A vector pair reads src[2j .. 2j+31]; the last element used is src[2n-2], and the one after
  // it may lie past the tensor's end, so 2j+31 <= 2n-2: j + 16 < n.
  for (; j + 16 < n; j += 16) {
    const __m512i a = _mm512_loadu_si512(src + 2 * j), b = _mm512_loadu_si512(src + 2 * j + 16);
    _mm512_storeu_si512(dst + j, _mm512_permutex2var_epi32(a, even, b));
  }
#endif
  for (; j < n; ++j) dst[j] = src[2 * j];
}

#ifdef __AVX__
// dst[k * dst_stride + c] = src[c * src_stride + k] for an 8x8 block of 4-byte elements.
inline void Transpose8x8(const float* src, int64_t src_stride, float* dst, int64_t dst_stride) {
  __m256 r[8], t[8];
  for (int k = 0; k < 8; ++k) r[k] = _mm256_loadu_ps(src + k * src_stride);
  for (int k = 0; k < 8; k += 2) {
    t[k] = _mm256_unpacklo_ps(r[k], r[k + 1]);
    t[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);
  }
  for (int k = 0; k < 8; k += 4) {
    r[k] = _mm256_shuffle_ps(t[k], t[k + 2], 0x44);
    r[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], 0xEE);
    r[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0x44);
    r[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0xEE);
  }
  for (int k = 0; k < 4; ++k) {
    _mm256_storeu_ps(dst + k * dst_stride, _mm256_permute2f128_ps(r[k], r[k + 4], 0x20));
    _mm256_storeu_ps(dst + (k + 4) * dst_stride, _mm256_permute2f128_ps(r[k], r[k + 4], 0x31));
  }
}
#endif

// out[i * os + j] = in[i + j * is] for i in [0, P), j in [0, L): a 2-D transpose of 4-byte
// elements (the bits, whatever T is), in tiles of 128 x 32 (each input row read in runs of 128,
// long enough for the prefetchers when the input comes from memory) through 8x8 register blocks.
template <class T>
inline void Transpose2D(const T* in, int64_t is, T* out, int64_t os, int64_t P, int64_t L) {
  static_assert(sizeof(T) == 4);
  constexpr int64_t BI = 128, BJ = 32;
  for (int64_t i0 = 0; i0 < P; i0 += BI) {
    const int64_t i1 = i0 + BI < P ? i0 + BI : P;
    for (int64_t j0 = 0; j0 < L; j0 += BJ) {
      const int64_t j1 = j0 + BJ < L ? j0 + BJ : L;
      int64_t i = i0;
#ifdef __AVX__
      for (; i + 8 <= i1; i += 8) {
        int64_t j = j0;
        for (; j + 8 <= j1; j += 8)
          Transpose8x8(reinterpret_cast<const float*>(in + i + j * is), is, reinterpret_cast<float*>(out + i * os + j), os);
        for (; j < j1; ++j)
          for (int64_t k = i; k < i + 8; ++k) out[k * os + j] = in[k + j * is];
      }
#endif
      for (; i < i1; ++i)
        for (int64_t j = j0; j < j1; ++j) out[i * os + j] = in[i + j * is];
    }
  }
}

}  // namespace gaf
