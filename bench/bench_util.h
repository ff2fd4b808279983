// Helpers shared by the standalone benchmarks of bench/ (membw, decode_gemv_bench, fma_peak,
// prompt_gemm_bench).
#pragma once

#include <cstddef>
#include <cstdlib>
#include <string>
#include <vector>

namespace bench {

// Reads p[0:n] as Streams sub-ranges at once, Block floats of each in turn, and returns the sum: a
// single sequential stream per core is held back by the prefetchers and line-fill buffers (13.8
// GB/s per core on a 2-core VM where a GEMV over many weight rows at once reads 18-19), so one
// stream would put the floor below what kernels reach.
template <size_t Streams, size_t Block>
double SumStreamsOf(const float* p, size_t n) {
  const size_t m = n / Streams / Block * Block;
  float acc[2][16] = {};
  for (size_t i = 0; i < m; i += Block) {
    for (size_t k = 0; k < Streams; ++k) {
      const float* q = p + k * m + i;
      for (size_t j = 0; j < Block; j += 32) {
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
  for (size_t i = Streams * m; i < n; ++i) s += p[i];
  return s;
}

// The read patterns a bandwidth floor is measured with; the floor is the fastest. Which is fastest
// depends on the machine and on what else runs on it: on the shared AMD EPYC host (2 threads) 8
// streams of 1 KiB turns read 75-86 GB/s in quiet hours, while under load 4 streams of 256 B read
// 57.9 GB/s against 41.5 for 8 x 1 KiB, and the decode products' panels 61.1 (ops/panel_gemm.h):
// one pattern alone let a product kernel read "faster than the floor".
struct ReadPattern {
  const char* name;
  double (*sum)(const float*, size_t);
};
inline constexpr ReadPattern kReadPatterns[] = {
    {"8 streams x 1 KiB", &SumStreamsOf<8, 256>},
    {"4 streams x 256 B", &SumStreamsOf<4, 64>},
    {"2 streams x 1 KiB", &SumStreamsOf<2, 256>},
};

// The FMA peak's work (bench/fma_peak, the reference of issue 14's prefill floor): 16 independent
// chains of 16-lane multiply-adds on registers, no memory traffic; 2 * 16 * 16 * iters
// floating-point operations. A target that uses it is built with -O3 -mprefer-vector-width=512, as
// fma_peak is, so the chains are full AVX-512 vectors where the machine has them.
inline constexpr int kFmaLanes = 16, kFmaChains = 16;
inline float FmaChains(long long iters, float seed) {
  float acc[kFmaChains][kFmaLanes];
  for (int c = 0; c < kFmaChains; ++c)
    for (int l = 0; l < kFmaLanes; ++l) acc[c][l] = seed + c + l;
  const float a = 0.999999f, b = 1e-7f;
  for (long long i = 0; i < iters; ++i)
    for (int c = 0; c < kFmaChains; ++c) {
#pragma omp simd
      for (int l = 0; l < kFmaLanes; ++l) acc[c][l] = acc[c][l] * a + b;
    }
  float s = 0;
  for (int c = 0; c < kFmaChains; ++c)
    for (int l = 0; l < kFmaLanes; ++l) s += acc[c][l];
  return s;
}

// The Llama dims the decode and prompt benches take (`--layers --hidden --kv --inter --vocab`),
// the `bench` preset's by default. Parse returns false for another option.
struct LlamaDims {
  long long layers = 12, hidden = 1024, kv = 256, inter = 2816, vocab = 32000;
  bool Parse(const std::string& k, const std::string& v) {
    long long* field = k == "--layers" ? &layers
                       : k == "--hidden" ? &hidden
                       : k == "--kv"     ? &kv
                       : k == "--inter"  ? &inter
                       : k == "--vocab"  ? &vocab
                                         : nullptr;
    if (field == nullptr) return false;
    *field = std::atoll(v.c_str());
    return true;
  }
};

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
