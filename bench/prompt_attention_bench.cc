// A prompt's causal attention on FusedAttention's prompt kernels (ops/attention_kernels.h): every
// head's S query rows against its S keys and values (scores with scale and mask, softmax,
// values), in blocks of 32 query rows, a task each on a team of threads, the last blocks first, as
// the session runs it; against the FMA peak (bench_util.h's chains) in the same process,
// interleaved round by round. Variants:
//
//   per-group      as the session ran it before this bench: keys packed at a stride of T rounded
//                  up to 16 floats, and the scores called once per group of 8 query rows (each
//                  group read all of its key columns from L2), the mask read for every score
//                  (today's score tiles)
//   shared         the keys at PackedKeyStride (an odd number of cache lines), and a block's groups
//                  taking each strip of keys in turn while it is in L1 (ScoresPackedScaled's
//                  group_cols)
//   zero-mask      shared, and no mask read where it is 0 (group_zero): the session's
//
//   prompt_attention_bench [--seq 256,1024] [--heads 16] [--kv-heads 4] [--head-dim 64]
//                          [--threads 1,2] [--rounds 9]
//
// Prints per prompt length and thread count the median ms of one layer's attention per variant,
// its GFLOPS (the multiply-adds the causal blocks compute: scores and values), the FMA peak's
// median GFLOPS in the same rounds, and the ratio; and whether every variant's outputs have the bits
// of the first.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "ops/attention_kernels.h"
#include "ops/copy_kernels.h"
#include "ops/fused_attention.h"
#include "ops/kernel_util.h"

#if !GAF_ATTENTION_AVX512
int main() {
  std::printf("prompt_attention_bench: this build has no AVX-512 attention kernels; nothing to measure\n");
  return 0;
}
#else
namespace {

using Clock = std::chrono::steady_clock;

enum Variant { kPerGroup, kShared, kZeroMask, kVariants };
const char* kNames[] = {"per-group", "shared", "zero-mask"};

constexpr int64_t kBlockRows = 32, kGroup = 8;

struct Setup {
  int64_t H, G, d, S;
  std::vector<float> q, k, v, mask, y;  // q, y [H, S, d]; k, v [G, S, d]; mask [S, S] (0 or -inf)
  std::vector<float> kt;                // the keys packed transposed, [G, d, ldt]
  std::vector<int64_t> zeros;           // per mask row, its leading zeros (gaf::MaskZeroLead)
};

// One layer's attention, all heads; returns the multiply-adds (x2) its blocks computed.
double Layer(Setup& s, Variant var, int threads) {
  const int64_t S = s.S, d = s.d, T = S;
  const int64_t ldt = var == kPerGroup ? (T + 15) / 16 * 16 : gaf::PackedKeyStride(T);
  s.kt.resize(static_cast<size_t>(s.G * d * ldt));
  const int64_t blocks = (S + kBlockRows - 1) / kBlockRows, tasks = s.H * blocks;
  double flops = 0;
#pragma omp parallel num_threads(threads) reduction(+ : flops)
  {
#pragma omp for schedule(static)
    for (int64_t g = 0; g < s.G; ++g) {
      float* dst = s.kt.data() + g * d * ldt;
      gaf::Transpose2D(s.k.data() + g * T * d, d, dst, ldt, d, T);
      for (int64_t c = 0; c < d; ++c) std::fill(dst + c * ldt + T, dst + (c + 1) * ldt, 0.f);
    }
    std::vector<float> buf(static_cast<size_t>(kBlockRows * ldt));
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t blk = blocks - 1 - task / s.H, h = task % s.H, kh = h / (s.H / s.G);
      const int64_t s0 = blk * kBlockRows, rows = std::min(kBlockRows, S - s0);
      const float* qb = s.q.data() + (h * S + s0) * d;
      const float* kp = s.kt.data() + kh * d * ldt;
      const float* vb = s.v.data() + kh * T * d;
      int64_t gcols[kBlockRows / kGroup];
      float top[kBlockRows];
      const int64_t groups = (rows + kGroup - 1) / kGroup;
      int64_t cols = 0;
      for (int64_t g = 0; g < groups; ++g) {  // causal: a group's last row's keys, rounded up to 16
        const int64_t last = s0 + std::min(rows, (g + 1) * kGroup);
        gcols[g] = std::min(T, (last + 15) / 16 * 16);
        cols = std::max(cols, gcols[g]);
        flops += 2.0 * std::min(kGroup, rows - g * kGroup) * gcols[g] * d;
      }
      const gaf::ScoreEpilogue epi{2, 1.f / std::sqrt(static_cast<float>(d)), s.mask.data() + s0 * T, T, 1};
      if (var != kPerGroup) {
        int64_t gzero[kBlockRows / kGroup];  // a group's leading zeros of the mask (its first row's: the fewest)
        for (int64_t g = 0; g < groups; ++g) gzero[g] = s.zeros[s0 + g * kGroup];
        gaf::ScoresPackedScaled(rows, cols, d, qb, kp, ldt, buf.data(), ldt, epi, top, gcols,
                                var == kZeroMask ? gzero : nullptr);
      } else {
        for (int64_t g = 0; g < groups; ++g) {
          const int64_t r0 = g * kGroup, gr = std::min(kGroup, rows - r0);
          gaf::ScoreEpilogue eg = epi;
          eg.m += r0 * T;
          gaf::ScoresPackedScaled(gr, gcols[g], d, qb + r0 * d, kp, ldt, buf.data() + r0 * ldt, ldt, eg, top + r0);
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        float* pr = buf.data() + r * ldt;
        const int64_t n = gcols[r / kGroup];
        gaf::SoftmaxRowWithMaxF32(pr, pr, n, top[r]);
        std::fill(pr + n, pr + cols, 0.f);
      }
      float* yb = s.y.data() + (h * S + s0) * d;
      if (d == 64) gaf::ValuesAvx512<4, 6>(rows, cols, buf.data(), ldt, vb, yb, false);
      else gaf::ValuesAvx512<8, 3>(rows, cols, buf.data(), ldt, vb, yb, false);
      flops += 2.0 * rows * cols * d;
    }
  }
  return flops;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> seqs{256, 1024}, threads{1, 2};
  int64_t H = 16, G = 4, d = 64;
  int rounds = 9;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--seq") seqs = bench::ParseIntList(v);
    else if (k == "--threads") threads = bench::ParseIntList(v);
    else if (k == "--heads") H = std::atoll(v.c_str());
    else if (k == "--kv-heads") G = std::atoll(v.c_str());
    else if (k == "--head-dim") d = std::atoll(v.c_str());
    else if (k == "--rounds") rounds = std::atoi(v.c_str());
    else {
      std::fprintf(stderr,
                   "usage: prompt_attention_bench [--seq 256,1024] [--heads 16] [--kv-heads 4] [--head-dim 64] "
                   "[--threads 1,2] [--rounds 9]\n");
      return 2;
    }
  }
  if (G <= 0 || H <= 0 || H % G != 0 || (d != 64 && d != 128)) {
    std::fprintf(stderr, "prompt_attention_bench: heads must be a multiple of kv-heads, head-dim 64 or 128\n");
    return 2;
  }
  std::printf("prompt attention, causal: %lld heads on %lld cache heads, head dim %lld; medians of %d interleaved rounds\n",
              static_cast<long long>(H), static_cast<long long>(G), static_cast<long long>(d), rounds);
  std::printf("%6s %3s |", "seq", "thr");
  for (const char* n : kNames) std::printf(" %10s ms GFLOPS  of peak |", n);
  std::printf(" peak GFLOPS | same bits\n");
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  bool all_same = true;
  for (int S : seqs) {
    Setup s{H, G, d, S, {}, {}, {}, {}, {}, {}};
    s.q.resize(static_cast<size_t>(H * S * d));
    s.k.resize(static_cast<size_t>(G * S * d));
    s.v.resize(s.k.size());
    for (auto* vec : {&s.q, &s.k, &s.v})
      for (float& x : *vec) x = nd(rng);
    s.mask.assign(static_cast<size_t>(S) * S, 0.f);
    for (int64_t i = 0; i < S; ++i)
      for (int64_t j = i + 1; j < S; ++j) s.mask[i * S + j] = -std::numeric_limits<float>::infinity();
    s.y.assign(s.q.size(), 0.f);
    s.zeros.resize(static_cast<size_t>(S));
    for (int64_t i = 0; i < S; ++i) s.zeros[i] = gaf::MaskZeroLead(s.mask.data() + i * S, S);
    for (int t : threads) {
      std::vector<double> ms[kVariants], peak;
      double flops[kVariants] = {};
      std::vector<float> first;
      bool same = true;
      for (int r = 0; r <= rounds; ++r) {  // r == 0 is the warm-up
        for (int var = 0; var < kVariants; ++var) {
          const auto t0 = Clock::now();
          flops[var] = Layer(s, static_cast<Variant>(var), t);
          const double el = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
          if (r > 0) ms[var].push_back(el);
          if (r == 0 && var == 0) first = s.y;
          else if (r == 0 && std::memcmp(first.data(), s.y.data(), first.size() * sizeof(float)) != 0) same = false;
        }
        const long long iters = 2'000'000;
        const auto t0 = Clock::now();
        float sink = 0;
#pragma omp parallel num_threads(t)
        {
          const float x = bench::FmaChains(iters, static_cast<float>(omp_get_thread_num()));
#pragma omp atomic
          sink += x;
        }
        const double el = std::chrono::duration<double>(Clock::now() - t0).count();
        if (sink == 1.2345f) std::printf(" ");  // keeps the chains
        if (r > 0) peak.push_back(2.0 * bench::kFmaLanes * bench::kFmaChains * iters * t / el / 1e9);
      }
      const double p = Median(peak);
      std::printf("%6d %3d |", S, t);
      for (int var = 0; var < kVariants; ++var) {
        const double m = Median(ms[var]), g = flops[var] / m / 1e6;
        std::printf(" %13.3f %6.1f %8.3f |", m, g, g / p);
      }
      std::printf(" %11.1f | %s\n", p, same ? "yes" : "NO");
      all_same = all_same && same;
    }
  }
  return all_same ? 0 : 1;
}
#endif
