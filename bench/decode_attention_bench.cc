// A decode step's attention over a long KV cache, cold (as in a step, where the weights streamed
// through the caches since the last step's attention): all layers' heads, each head's r query rows
// against its T cached keys and values (scores, scale, softmax, values), in the session's
// per-cache-head tasks on a team of threads, against the read floor of the same cache bytes in
// the same process, interleaved round by round. Variants:
//
//   whole-head   the kernels before issue 14's attention work: the head's rows asked for into L2
//                at the task's start (all of them), then the scores one dot product at a time
//                (ScoresRowByRow, ops/attention_kernels.h), the softmax, the values
//   scores       DecodeScores (ops/attention_kernels.h: 16 dot products advancing together) with
//                the whole-head prefetch
//   none         DecodeScores, no requests ahead (a split cache's segments in the session before
//                this change)
//   ahead        DecodeScores and the values asking for their rows 4 KiB ahead, no whole-head prefetch
//   ahead+v      as `ahead`, and the values asked for into L2 while the scores go (the session's
//                decode steps with 2 query rows a cache head or more; with one, `scores`:
//                DecodeAheadTakes in ops/attention_kernels.h)
//
//   decode_attention_bench [--past 256,2000,4000] [--layers 12] [--kv-heads 4] [--group 4]
//                          [--head-dim 64] [--parts 1] [--threads 1,2] [--rounds 9]
//
// --parts P splits each head's cache rows into P segments, a task each (the session's
// DecodeStepsSplit, when cache heads are fewer than threads).
//
// Environment: AHEAD (bytes ahead; the session's kDecodeAheadBytes by default), HOT (set: no eviction between steps, the kernels'
// speed from the caches).
//
// Prints per past length and thread count the median ms per step of each variant, its GB/s over
// the cache bytes, the floor's GB/s (bench_util.h's read patterns over the same caches, cold, the
// fastest) and the ratio; and whether every variant's outputs have the bits of the first.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "ops/attention_kernels.h"
#include "ops/kernel_util.h"

#if !GAF_ATTENTION_AVX512
int main() {
  std::printf("decode_attention_bench: this build has no AVX-512 attention kernels; nothing to measure\n");
  return 0;
}
#else
namespace {

using Clock = std::chrono::steady_clock;

void PrefetchAll(const float* p, int64_t n) {
  const char* b = reinterpret_cast<const char*>(p);
  for (int64_t off = 0; off < n * 4; off += 64) _mm_prefetch(b + off, _MM_HINT_T1);
}

enum Variant { kWholeHead, kScores, kNone, kAhead, kAheadValues, kVariants };
const char* kNames[] = {"whole-head", "scores", "none", "ahead", "ahead+v"};
const int64_t kAheadBytes = std::getenv("AHEAD") ? std::atoll(std::getenv("AHEAD")) : gaf::kDecodeAheadBytes;

struct Setup {
  int64_t layers, g, r, d, T, parts;
  std::vector<float> q, k, v, y;  // q [layers, g, r, d]; k, v [layers, g, T, d]; y [layers, g, parts, r, d]
};

// One task: rows [j0, j1) of a head's cache (all of them, or a segment of a split cache as the
// session's DecodeStepsSplit takes it): scores, scale, softmax over the rows, values into y (a
// split cache's segments are then combined, a few hundred multiply-adds not timed here).
void Task(const Setup& s, Variant var, int64_t l, int64_t h, int64_t p, std::vector<float>& scores) {
  const int64_t M = s.r, d = s.d, j0 = s.T * p / s.parts, T = s.T * (p + 1) / s.parts - j0;
  const float* q = s.q.data() + (l * s.g + h) * M * d;
  const float* k = s.k.data() + ((l * s.g + h) * s.T + j0) * d;
  const float* v = s.v.data() + ((l * s.g + h) * s.T + j0) * d;
  float* y = const_cast<float*>(s.y.data()) + ((l * s.g + h) * s.parts + p) * M * d;
  scores.resize(static_cast<size_t>(M * T));
  float* sb = scores.data();
  if (var == kWholeHead || var == kScores) PrefetchAll(k, T * d), PrefetchAll(v, T * d);
  if (var == kWholeHead) {
    gaf::ScoresRowByRow(M, T, d, q, k, sb, T);
  } else {
    gaf::DecodeAhead pf;
    if (var == kAhead || var == kAheadValues) pf.ahead = kAheadBytes;
    if (var == kAheadValues) pf.next = v, pf.next_bytes = T * d * 4;
    gaf::DecodeScores(M, T, d, q, k, sb, T, pf);
  }
  const float c = 1.f / std::sqrt(static_cast<float>(d));
  for (int64_t m = 0; m < M; ++m) {
    gaf::ScaleAndMaskRow(sb + m * T, sb + m * T, T, 2, c, nullptr, 1);
    gaf::SoftmaxRowF32(sb + m * T, sb + m * T, T);
  }
  const bool ahead = var == kAhead || var == kAheadValues;
  if (d == 64) {
    if (ahead) gaf::ValuesAvx512<4, 4, true>(M, T, sb, T, v, y, false, kAheadBytes);
    else gaf::ValuesAvx512<4, 4>(M, T, sb, T, v, y, false);
  } else {
    if (ahead) gaf::ValuesAvx512<8, 2, true>(M, T, sb, T, v, y, false, kAheadBytes);
    else gaf::ValuesAvx512<8, 2>(M, T, sb, T, v, y, false);
  }
}

// One step: every layer's tasks over a team of `threads` (a layer's tasks split among them).
double Step(const Setup& s, Variant var, int threads) {
  const auto t0 = Clock::now();
#pragma omp parallel num_threads(threads)
  {
    thread_local std::vector<float> scores;
    for (int64_t l = 0; l < s.layers; ++l) {
#pragma omp for schedule(static, 1)
      for (int64_t t = 0; t < s.g * s.parts; ++t) Task(s, var, l, t / s.parts, t % s.parts, scores);
    }
  }
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Evicts the caches: reads a buffer far larger than the last level.
float Flush(const std::vector<float>& junk, int threads) {
  float total = 0.f;
  if (std::getenv("HOT") != nullptr) return total;
#pragma omp parallel for num_threads(threads) reduction(+ : total)
  for (int64_t i = 0; i < static_cast<int64_t>(junk.size()); i += 16) total += junk[i];
  return total;
}

// The floor: the same cache bytes read by the fastest of bench_util.h's patterns, cold.
double FloorMs(const Setup& s, int threads, const std::vector<float>& junk, double* sink) {
  double best = 1e30;
  for (const bench::ReadPattern& pat : bench::kReadPatterns) {
    *sink += Flush(junk, threads);
    const auto t0 = Clock::now();
    double sum = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sum)
    {
      const int n = omp_get_num_threads(), t = omp_get_thread_num();
      for (const std::vector<float>* buf : {&s.k, &s.v}) {
        const size_t per = buf->size() / n;
        sum += pat.sum(buf->data() + t * per, per);
      }
    }
    *sink += sum;
    best = std::min(best, std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> pasts = {256, 2000, 4000}, thread_counts = {1, 2};
  int64_t layers = 12, g = 4, r = 4, d = 64, parts = 1;
  int rounds = 9;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--past") pasts = bench::ParseIntList(v);
    else if (k == "--threads") thread_counts = bench::ParseIntList(v);
    else if (k == "--layers") layers = std::atoll(v.c_str());
    else if (k == "--kv-heads") g = std::atoll(v.c_str());
    else if (k == "--group") r = std::atoll(v.c_str());
    else if (k == "--head-dim") d = std::atoll(v.c_str());
    else if (k == "--parts") parts = std::max<int64_t>(1, std::atoll(v.c_str()));
    else if (k == "--rounds") rounds = std::atoi(v.c_str());
    else {
      std::fprintf(stderr, "decode_attention_bench: unknown option %s\n", k.c_str());
      return 1;
    }
  }
  if (d != 64 && d != 128) {
    std::fprintf(stderr, "decode_attention_bench: --head-dim must be 64 or 128\n");
    return 1;
  }
  const std::vector<float> junk(size_t{64} << 20, 1.f);  // 256 MiB
  double sink = 0;
  std::printf("{\"layers\": %lld, \"kv_heads\": %lld, \"group\": %lld, \"head_dim\": %lld, \"parts\": %lld, "
              "\"rounds\": %d, \"results\": [\n",
              static_cast<long long>(layers), static_cast<long long>(g), static_cast<long long>(r),
              static_cast<long long>(d), static_cast<long long>(parts), rounds);
  bool first_row = true;
  for (int T : pasts) {
    Setup s{layers, g, r, d, T, parts, {}, {}, {}, {}};
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.f, 1.f);
    s.q.resize(static_cast<size_t>(layers * g * r * d));
    s.k.resize(static_cast<size_t>(layers * g * T * d));
    s.v.resize(s.k.size());
    for (float& x : s.q) x = nd(rng);
    for (float& x : s.k) x = nd(rng);
    for (float& x : s.v) x = nd(rng);
    s.y.assign(s.q.size() * static_cast<size_t>(parts), 0.f);
    const double mb = 2.0 * static_cast<double>(s.k.size()) * 4 / 1e6;
    for (int threads : thread_counts) {
      std::vector<std::vector<double>> ms(kVariants);
      std::vector<double> floor;
      std::vector<std::vector<float>> out(kVariants);
      for (int round = 0; round < rounds; ++round) {
        for (int var = 0; var < kVariants; ++var) {
          sink += Flush(junk, threads);
          ms[var].push_back(Step(s, static_cast<Variant>(var), threads));
          if (round == 0) out[var] = s.y;
        }
        floor.push_back(FloorMs(s, threads, junk, &sink));
      }
      auto median = [](std::vector<double> x) {
        std::sort(x.begin(), x.end());
        return x[x.size() / 2];
      };
      const double fl = median(floor);
      for (int var = 0; var < kVariants; ++var) {
        const double m = median(ms[var]);
        const bool same = std::memcmp(out[var].data(), out[0].data(), out[0].size() * 4) == 0;
        std::printf("%s  {\"past\": %d, \"threads\": %d, \"variant\": \"%s\", \"ms\": %.3f, \"gbps\": %.1f, "
                    "\"floor_gbps\": %.1f, \"of_floor\": %.3f, \"same_bits\": %s}",
                    first_row ? "" : ",\n", T, threads, kNames[var], m, mb / m, mb / fl, fl / m, same ? "true" : "false");
        first_row = false;
      }
    }
  }
  std::printf("\n], \"sink\": %g}\n", sink > 0 ? 1.0 : 0.0);
  return 0;
}
#endif
