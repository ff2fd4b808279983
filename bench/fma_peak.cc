// Peak float32 multiply-add rate of this machine: each thread runs 16 independent chains of
// vector FMAs (AVX-512 where the compiler targets it, else AVX2/SSE widths) on registers, no memory
// traffic; median of repeats. The prefill floor of issue 14 is stated against this figure.
//
//   fma_peak [--threads 1,2] [--repeat 9]
//
// Prints JSON: {"results": [{"threads": T, "gflops": median, "gflops_max": best}, ...]}.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_util.h"


int main(int argc, char** argv) {
  std::vector<int> threads{1, 2};
  int repeat = 9;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--repeat") {
      repeat = std::atoi(v.c_str());
    } else if (k == "--threads") {
      threads = bench::ParseIntList(v);
    } else {
      std::fprintf(stderr, "usage: fma_peak [--threads 1,2] [--repeat R]\n");
      return 2;
    }
  }
  const int64_t iters = 20'000'000;
  volatile float sink = 0;
  std::printf("{\"results\": [");
  for (size_t ti = 0; ti < threads.size(); ++ti) {
    const int t = threads[ti];
    std::vector<double> g;
    for (int r = 0; r <= repeat; ++r) {
      float s = 0;
      const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(t) reduction(+ : s)
      s += bench::FmaChains(iters, static_cast<float>(omp_get_thread_num()));
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      sink = sink + s;
      if (r > 0) g.push_back(2.0 * bench::kFmaLanes * bench::kFmaChains * iters * t / sec / 1e9);
    }
    std::sort(g.begin(), g.end());
    std::printf("%s{\"threads\": %d, \"gflops\": %.1f, \"gflops_max\": %.1f}", ti ? ", " : "", t, g[g.size() / 2],
                g.back());
  }
  std::printf("]}\n");
  return 0;
}
