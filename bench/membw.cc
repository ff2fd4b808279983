// Memory read bandwidth: the sum of a large float array (far larger than the caches), with
// 1..T threads (each sums a contiguous share), median of repeats after one warm-up pass.
//
//   membw [--mib 1024] [--threads 1,2] [--repeat 9]
//
// Prints JSON: {"array_bytes": N, "results": [{"threads": 1, "gbps": median GB/s (1e9 bytes/s),
// "gbps_min": .., "gbps_max": ..}, ...]}.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

double SumRange(const float* p, size_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s) simdlen(16)
  for (size_t i = 0; i < n; ++i) s += p[i];
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  size_t mib = 1024;
  int repeat = 9;
  std::vector<int> threads{1, 2};
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--mib") mib = std::strtoull(v.c_str(), nullptr, 10);
    else if (k == "--repeat") repeat = std::atoi(v.c_str());
    else if (k == "--threads") {
      threads.clear();
      size_t pos = 0;
      while (pos <= v.size()) {
        size_t c = v.find(',', pos);
        if (c == std::string::npos) c = v.size();
        if (c > pos) threads.push_back(std::atoi(v.substr(pos, c - pos).c_str()));
        pos = c + 1;
      }
    } else {
      std::fprintf(stderr, "usage: membw [--mib N] [--threads 1,2] [--repeat R]\n");
      return 2;
    }
  }
  const size_t n = mib * 1024 * 1024 / sizeof(float);
  float* a = static_cast<float*>(std::aligned_alloc(64, n * sizeof(float)));
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
        total += SumRange(a + lo, hi - lo);
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
