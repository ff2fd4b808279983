// Memory read bandwidth: the sum of a large float array (far larger than the caches), with
// 1..T threads (each sums a contiguous share as several concurrent streams, in each of the read
// patterns of bench_util.h, the patterns interleaved repeat by repeat), median of repeats after one
// warm-up pass; the bandwidth is the fastest pattern's.
//
//   membw [--mib 1024] [--threads 1,2] [--repeat 9]
//
// Prints JSON: {"array_bytes": N, "results": [{"threads": 1, "gbps": the fastest pattern's median
// GB/s (1e9 bytes/s), "gbps_min": .., "gbps_max": .. (of that pattern), "pattern": its name,
// "patterns": [{"pattern": name, "gbps": median}, ...]}, ...]}.
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "bench_util.h"

int main(int argc, char** argv) {
  size_t mib = 1024;
  int repeat = 9;
  std::vector<int> threads{1, 2};
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--mib") mib = std::strtoull(v.c_str(), nullptr, 10);
    else if (k == "--repeat") repeat = std::atoi(v.c_str());
    else if (k == "--threads") {
      threads = bench::ParseIntList(v);
    } else {
      std::fprintf(stderr, "usage: membw [--mib N] [--threads 1,2] [--repeat R]\n");
      return 2;
    }
  }
  const size_t n = mib * 1024 * 1024 / sizeof(float);
  // 2 MiB-aligned with transparent huge pages, as the runtime allocates large tensors (ir/tensor.cc):
  // the weights a decode step streams are read through huge pages too.
  const size_t bytes = (n * sizeof(float) + (2u << 20) - 1) / (2u << 20) * (2u << 20);
  float* a = static_cast<float*>(std::aligned_alloc(2u << 20, bytes));
  if (a != nullptr) ::madvise(a, bytes, MADV_HUGEPAGE);
  if (a == nullptr) {
    std::fprintf(stderr, "membw: cannot allocate %zu MiB\n", mib);
    return 1;
  }
  int maxt = *std::max_element(threads.begin(), threads.end());
#pragma omp parallel for num_threads(maxt) schedule(static)
  for (size_t i = 0; i < n; ++i) a[i] = static_cast<float>(i & 1023) * 1e-3f;

  std::printf("{\"array_bytes\": %zu, \"repeats\": %d, \"results\": [", n * sizeof(float), repeat);
  volatile double sink = 0;
  for (size_t ti = 0; ti < threads.size(); ++ti) {
    const int t = threads[ti];
    constexpr size_t kPatterns = std::size(bench::kReadPatterns);
    std::vector<std::vector<double>> gbps(kPatterns);
    for (int r = 0; r <= repeat; ++r) {  // r == 0 is the warm-up
      for (size_t pi = 0; pi < kPatterns; ++pi) {
        const auto sum = bench::kReadPatterns[pi].sum;
        double total = 0;
        auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(t) reduction(+ : total)
        {
          const int id = omp_get_thread_num(), nt = omp_get_num_threads();
          const size_t lo = n * id / nt, hi = n * (id + 1) / nt;
          total += sum(a + lo, hi - lo);
        }
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        sink = sink + total;
        if (r > 0) gbps[pi].push_back(static_cast<double>(n * sizeof(float)) / s / 1e9);
      }
    }
    size_t best = 0;
    for (size_t pi = 0; pi < kPatterns; ++pi) {
      std::sort(gbps[pi].begin(), gbps[pi].end());
      if (gbps[pi][gbps[pi].size() / 2] > gbps[best][gbps[best].size() / 2]) best = pi;
    }
    const std::vector<double>& g = gbps[best];
    std::printf("%s{\"threads\": %d, \"gbps\": %.3f, \"gbps_min\": %.3f, \"gbps_max\": %.3f, \"pattern\": \"%s\", "
                "\"patterns\": [",
                ti ? ", " : "", t, g[g.size() / 2], g.front(), g.back(), bench::kReadPatterns[best].name);
    for (size_t pi = 0; pi < kPatterns; ++pi)
      std::printf("%s{\"pattern\": \"%s\", \"gbps\": %.3f}", pi ? ", " : "", bench::kReadPatterns[pi].name,
                  gbps[pi][gbps[pi].size() / 2]);
    std::printf("]}");
  }
  std::printf("]}\n");
  std::free(a);
  return 0;
}
