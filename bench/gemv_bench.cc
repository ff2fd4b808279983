// Batch-1 products y[N] = x[K] * W[K,N] (the decode step of an LLM): the previous static K-split
// kernel ("old", kept here as the baseline) against GemvF32 ("new") and GemvF16 ("f16"), at 1
// and 2 threads, interleaved side by side. Checks the results against double precision first
// and exits non-zero when a check fails.
//
//   build/bench/gemv_bench [repeats]     (default 21; median per variant)
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "ir/tensor.h"
#include "ops/gemv.h"

namespace {

// ---- Baseline: the kernel GemvF32 replaced (rows split statically over the threads, private
// partial sums, a barrier, then a reduction).

void RowAccumulate(float* __restrict acc, const float* __restrict x, const float* __restrict w,
                   int64_t ldw, int64_t k0, int64_t k1, int64_t n) {
  int64_t k = k0;
  for (; k + 4 <= k1; k += 4) {
    const float a0 = x[k], a1 = x[k + 1], a2 = x[k + 2], a3 = x[k + 3];
    const float* __restrict r0 = w + k * ldw;
    const float* __restrict r1 = r0 + ldw;
    const float* __restrict r2 = r1 + ldw;
    const float* __restrict r3 = r2 + ldw;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) acc[j] += a0 * r0[j] + a1 * r1[j] + a2 * r2[j] + a3 * r3[j];
  }
  for (; k < k1; ++k) {
    const float a0 = x[k];
    const float* __restrict r0 = w + k * ldw;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) acc[j] += a0 * r0[j];
  }
}

void OldGemv(const float* x, const float* w, int64_t ldw, float* y, int64_t K, int64_t N,
             bool accumulate) {
  constexpr int64_t kColBlock = 8192;
  int max_threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  int64_t work = K * N;
  int nt = static_cast<int>(std::min<int64_t>({max_threads, std::max<int64_t>(1, work / 32768),
                                               std::max<int64_t>(1, K / 8)}));
  auto run_rows = [&](float* acc, int64_t k0, int64_t k1, bool zero) {
    for (int64_t c0 = 0; c0 < N; c0 += kColBlock) {
      int64_t cn = std::min(kColBlock, N - c0);
      if (zero) std::memset(acc + c0, 0, sizeof(float) * cn);
      RowAccumulate(acc + c0, x, w + c0, ldw, k0, k1, cn);
    }
  };
  if (nt <= 1) {
    run_rows(y, 0, K, !accumulate);
    return;
  }
  std::unique_ptr<float[]> scratch(new float[static_cast<size_t>(nt - 1) * N]);
#pragma omp parallel num_threads(nt)
  {
    int t = omp_get_thread_num();
    int team = omp_get_num_threads();
    int64_t k0 = K * t / team, k1 = K * (t + 1) / team;
    float* acc = t == 0 ? y : scratch.get() + static_cast<int64_t>(t - 1) * N;
    run_rows(acc, k0, k1, t != 0 || !accumulate);
#pragma omp barrier
    int64_t n0 = N * t / team, n1 = N * (t + 1) / team;
    for (int s = 1; s < team; ++s) {
      const float* __restrict p = scratch.get() + static_cast<int64_t>(s - 1) * N;
      float* __restrict yy = y;
#pragma omp simd
      for (int64_t j = n0; j < n1; ++j) yy[j] += p[j];
    }
  }
}

// ---- Checks.

std::mt19937 g_rng(12345);

std::vector<float> Random(int64_t n) {
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> v(n);
  for (float& e : v) e = d(g_rng);
  return v;
}

std::vector<float> Widen(const std::vector<uint16_t>& h) {
  std::vector<float> f(h.size());
  for (size_t i = 0; i < h.size(); ++i) f[i] = gaf::HalfToFloat(h[i]);
  return f;
}

// C[M,N] = A[M,K] * W[K,N] (W with leading dimension ldw), in double.
std::vector<double> Reference(const float* a, const float* w, int64_t ldw, int64_t M, int64_t K,
                              int64_t N) {
  std::vector<double> c(M * N, 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t n = 0; n < N; ++n) c[m * N + n] += double(a[m * K + k]) * w[k * ldw + n];
  return c;
}

// max |y - ref| / max |ref|.
double RelError(const float* y, const std::vector<double>& ref) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    err = std::max(err, std::fabs(y[i] - ref[i]));
    scale = std::max(scale, std::fabs(ref[i]));
  }
  return scale > 0 ? err / scale : err;
}

int g_failures = 0;

void Expect(bool ok, const char* what) {
  if (!ok) {
    ++g_failures;
    std::printf("FAIL: %s\n", what);
  }
}

void ExpectBelow(double value, double limit, const char* what) {
  if (!(value <= limit)) {
    ++g_failures;
    std::printf("FAIL: %s: %.3g (limit %.3g)\n", what, value, limit);
  }
}

constexpr double kF32Limit = 1e-4, kF16Limit = 2e-3;

// Odd shapes, a padded leading dimension, accumulate, 1 and 2 threads (bit-identical).
void CheckGemvShapes() {
  const int64_t shapes[][2] = {{1, 1}, {7, 33}, {9, 1000}, {100, 17}, {1031, 515}, {3, 70001}};
  double worst32 = 0, worst16 = 0;
  for (const auto& s : shapes) {
    const int64_t K = s[0], N = s[1], ldw = N + 5;
    const std::vector<float> x = Random(K), w = Random(K * ldw), y0 = Random(N);
    std::vector<uint16_t> wh(w.size());
    gaf::ConvertToHalf(w.data(), wh.data(), static_cast<int64_t>(w.size()));
    const std::vector<float> wf = Widen(wh);
    for (bool accumulate : {false, true}) {
      std::vector<double> r32 = Reference(x.data(), w.data(), ldw, 1, K, N);
      std::vector<double> r16 = Reference(x.data(), wf.data(), ldw, 1, K, N);
      for (int64_t n = 0; accumulate && n < N; ++n) {
        r32[n] += y0[n];
        r16[n] += y0[n];
      }
      std::vector<float> first32, first16;
      for (int t : {1, 2}) {
        omp_set_num_threads(t);
        std::vector<float> y32 = y0, y16 = y0;
        gaf::GemvF32(x.data(), w.data(), ldw, y32.data(), K, N, accumulate);
        gaf::GemvF16(x.data(), wh.data(), ldw, y16.data(), K, N, accumulate);
        const double e32 = RelError(y32.data(), r32), e16 = RelError(y16.data(), r16);
        worst32 = std::max(worst32, e32);
        worst16 = std::max(worst16, e16);
        ExpectBelow(e32, kF32Limit, "GemvF32, odd shape");
        ExpectBelow(e16, kF32Limit, "GemvF16, odd shape (vs widened weight)");
        if (t == 1) {
          first32 = y32;
          first16 = y16;
        } else {
          Expect(first32 == y32 && first16 == y16, "same bits at 1 and 2 threads");
        }
      }
    }
  }
  std::printf("odd shapes, accumulate, ldw > N: max rel. error f32 %.2e, f16 (vs widened) %.2e\n",
              worst32, worst16);
}

// Exact float16 rounding of v, in double: nearest even on the half grid, inf past 65520.
double HalfRounded(float v) {
  const double a = std::fabs(double(v));
  if (std::isnan(v)) return v;
  if (a >= 65520.0) return std::copysign(INFINITY, v);
  const int e = std::max(-14, a > 0 ? std::ilogb(a) : -14);
  const double q = std::ldexp(1.0, e - 10);
  return std::copysign(std::nearbyint(a / q) * q, double(v));
}

void CheckConvertToHalf() {
  std::vector<float> v = {0.f, -0.f, 1.f, -2.5f, 65504.f, 65519.99f, 65520.f, -1e6f, 0x1p-24f,
                          0x1p-25f, 0x3p-25f, 0x1p-14f, 0x1.ffcp-15f, 1e-40f, -1e-7f,
                          1.f + 0x1p-11f, 1.f + 0x3p-11f, INFINITY, -INFINITY, NAN};
  std::uniform_int_distribution<uint32_t> bits, exponent(100, 145);
  for (int i = 0; i < 1 << 20; ++i) {
    uint32_t b = bits(g_rng);
    if (i % 2) b = (b & 0x807fffffu) | exponent(g_rng) << 23;  // half of them near the half range
    float f;
    std::memcpy(&f, &b, 4);
    v.push_back(f);
  }
  std::vector<uint16_t> h(v.size());
  gaf::ConvertToHalf(v.data(), h.data(), static_cast<int64_t>(v.size()));
  int64_t bad = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    const float back = gaf::HalfToFloat(h[i]);
    const double want = HalfRounded(v[i]);
    const bool ok = std::isnan(want) ? std::isnan(back)
                                     : back == want && std::signbit(back) == std::signbit(v[i]);
    bad += !ok;
  }
  Expect(bad == 0, "ConvertToHalf rounds every value to nearest even");
  std::printf("ConvertToHalf: %zu values (inf, nan, subnormal, ties, overflow), %lld wrong\n",
              v.size(), static_cast<long long>(bad));
}

// ---- Timing.

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void Bench(int repeats) {
  const int64_t shapes[][2] = {{384, 1024}, {1024, 384},  {384, 8000},
                               {2048, 5632}, {5632, 2048}, {2048, 32000}};
  std::printf("\n%6s %6s %3s | %9s %7s | %9s %7s | %9s %7s | %7s %7s | %9s %9s\n", "K", "N",
              "thr", "old ms", "GB/s", "new ms", "GB/s", "f16 ms", "GB/s", "new/old", "f16/old",
              "err f32", "err f16");
  for (const auto& s : shapes) {
    const int64_t K = s[0], N = s[1];
    const std::vector<float> x = Random(K), w = Random(K * N);
    std::vector<uint16_t> wh(K * N);
    gaf::ConvertToHalf(w.data(), wh.data(), K * N);
    const std::vector<double> ref = Reference(x.data(), w.data(), N, 1, K, N);
    std::vector<float> y_old(N), y_new(N), y_f16(N);
    const std::function<void()> run[3] = {
        [&] { OldGemv(x.data(), w.data(), N, y_old.data(), K, N, false); },
        [&] { gaf::GemvF32(x.data(), w.data(), N, y_new.data(), K, N, false); },
        [&] { gaf::GemvF16(x.data(), wh.data(), N, y_f16.data(), K, N, false); }};
    for (int t : {1, 2}) {
      omp_set_num_threads(t);
      for (const auto& f : run) f(), f();  // warm-up
      std::vector<double> times[3];
      for (int r = 0; r < repeats; ++r) {
        for (int i = 0; i < 3; ++i) {  // rotate the order so that no variant always goes first
          const int v = (r + i) % 3;
          const auto t0 = std::chrono::steady_clock::now();
          run[v]();
          times[v].push_back(
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
      }
      const double e_old = RelError(y_old.data(), ref), e_new = RelError(y_new.data(), ref);
      const double e_f16 = RelError(y_f16.data(), ref);
      ExpectBelow(e_old, kF32Limit, "old kernel");
      ExpectBelow(e_new, kF32Limit, "GemvF32");
      ExpectBelow(e_f16, kF16Limit, "GemvF16 (vs float32 weight)");
      const double old_s = Median(times[0]), new_s = Median(times[1]), f16_s = Median(times[2]);
      const double bytes = 4.0 * K * N;
      std::printf("%6lld %6lld %3d | %9.3f %7.1f | %9.3f %7.1f | %9.3f %7.1f | %7.2f %7.2f | "
                  "%9.1e %9.1e\n",
                  static_cast<long long>(K), static_cast<long long>(N), t, old_s * 1e3,
                  bytes / old_s * 1e-9, new_s * 1e3, bytes / new_s * 1e-9, f16_s * 1e3,
                  bytes / 2 / f16_s * 1e-9, old_s / new_s, old_s / f16_s, e_new, e_f16);
    }
  }
  std::printf("GB/s: weight bytes read (4 per element, 2 for f16); new/old, f16/old: speed-up; "
              "err: max |y - ref| / max |ref|, ref in double from the float32 weight\n");
}

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::max(1, std::atoi(argv[1])) : 21;
  const int threads = omp_get_max_threads();
  CheckConvertToHalf();
  CheckGemvShapes();
  Bench(repeats);
  omp_set_num_threads(threads);
  if (g_failures) {
    std::printf("%d check(s) failed\n", g_failures);
    return 1;
  }
  return 0;
}
