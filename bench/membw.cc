// Memory read bandwidth: the sum of a large float array (far larger than the caches), with
// 1..T threads (each sums a contiguous share, as 8 concurrent streams), median of repeats after one
// warm-up pass.
//
//   membw [--mib 1024] [--threads 1,2] [--repeat 9]
//
// Prints JSON: {"array_bytes": N, "results": [{"threads": 1, "gbps": median GB/s (1e9 bytes/s),
// "gbps_min": .., "gbps_max": ..}, ...]}.
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
    std::vector<double> gbps;
    for (int r = 0; r <= repeat; ++r) {  // r == 0 is the warm-up
      double total = 0;
      auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(t) reduction(+ : total)
      {
        const int id = omp_get_thread_num(), nt = omp_get_num_threads();
        const size_t lo = n * id / nt, hi = n * (id + 1) / nt;
        total += bench::SumStreams(a + lo, hi - lo);
      }
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      sink = sink + total;
      if (r > 0) gbps.push_back(static_cast<double>(n * sizeof(float)) / s / 1e9);
    }
    std::sort(gbps.begin(), gbps.end());
    std::printf("%s{\"threads\": %d, \"gbps\": %.3f, \"gbps_min\": %.3f, \"gbps_max\": %.3f}", ti ? ", " : "", t,
                gbps[gbps.size() / 2], gbps.front(), gbps.back());
  }
  std::printf("]}\n");
  std::free(a);
  return 0;
}
