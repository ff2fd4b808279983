// Helpers shared by the standalone benchmarks of bench/ (membw, decode_gemv_bench, fma_peak).
#pragma once

#include <cstddef>
#include <cstdlib>
#include <string>
#include <vector>

namespace bench {

// Reads a range as kStreams sub-ranges at once: a single sequential stream per core is held back
// by the prefetchers and line-fill buffers (13.8 GB/s per core on a 2-core VM where a GEMV over
// many weight rows at once reads 18-19), so one stream would put the floor below what kernels reach.
inline constexpr size_t kStreams = 8;

// The sum of p[0:n], read as kStreams concurrent streams.
inline double SumStreams(const float* p, size_t n) {
  constexpr size_t kBlock = 256;  // floats per stream per step (1 KiB)
  const size_t m = n / kStreams / kBlock * kBlock;
  float acc[2][16] = {};
  for (size_t i = 0; i < m; i += kBlock) {
    for (size_t k = 0; k < kStreams; ++k) {
      const float* q = p + k * m + i;
      for (size_t j = 0; j < kBlock; j += 32) {
#pragma omp simd
        for (size_t l = 0; l < 16; ++l) {
          acc[0][l] += q[j + l];
          acc[1][l] += q[j + 16 + l];
        }
      }
    }
  }
  float s = 0.f;
  for (size_t l = 0; l < 16; ++l) s += acc[0][l] + acc[1][l];
  for (size_t i = kStreams * m; i < n; ++i) s += p[i];
  return s;
}

// "1,2,4" -> {1, 2, 4}.
inline std::vector<int> ParseIntList(const std::string& v) {
  std::vector<int> out;
  size_t pos = 0;
  while (pos <= v.size()) {
    size_t c = v.find(',', pos);
    if (c == std::string::npos) c = v.size();
    if (c > pos) out.push_back(std::atoi(v.substr(pos, c - pos).c_str()));
    pos = c + 1;
  }
  return out;
}

}  // namespace bench
