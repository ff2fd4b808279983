// The weight stream of one decode step, cold: the batch-1 products of a Llama decoder's layers
// (q, k, v, o, gate, up, down per layer, then the vocabulary head) over weights far larger than
// the caches, against the machine's read bandwidth measured on the same weights in the same
// process, interleaved round by round. "separate" runs one GemvF32 per product; "siblings" runs
// q/k/v and gate/up as one GemvF32Many each (as the session's SiblingMatMul does).
//
//   decode_gemv_bench [--layers 12] [--hidden 1024] [--kv 256] [--inter 2816] [--vocab 32000]
//                     [--threads 1,2] [--rounds 9]
//
// Prints per thread count the median ms per step and GB/s of each variant, the read floor (the
// same bytes summed by 8 streams per thread, as bench/membw) and the ratio to it.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "ir/tensor.h"
#include "ops/gemv.h"

namespace {

struct Weight {
  gaf::Tensor t;
  int64_t K, N;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int64_t layers = 12, hidden = 1024, kv = 256, inter = 2816, vocab = 32000;  // the `bench` preset
  int rounds = 9;
  std::vector<int> threads{1, 2};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--layers") layers = std::atoll(v.c_str());
    else if (k == "--hidden") hidden = std::atoll(v.c_str());
    else if (k == "--kv") kv = std::atoll(v.c_str());
    else if (k == "--inter") inter = std::atoll(v.c_str());
    else if (k == "--vocab") vocab = std::atoll(v.c_str());
    else if (k == "--rounds") rounds = std::atoi(v.c_str());
    else if (k == "--threads") threads = bench::ParseIntList(v);
    else {
      std::fprintf(stderr, "decode_gemv_bench: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  // Per layer: q k v o gate up down; then the head.
  std::vector<Weight> w;
  auto add = [&](int64_t K, int64_t N) {
    w.push_back({gaf::Tensor::Uninitialized(gaf::DataType::kFloat, {K, N}), K, N});
  };
  for (int64_t l = 0; l < layers; ++l) {
    add(hidden, hidden), add(hidden, kv), add(hidden, kv), add(hidden, hidden);
    add(hidden, inter), add(hidden, inter), add(inter, hidden);
  }
  add(hidden, vocab);
  double bytes = 0;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-0.05f, 0.05f);
  for (Weight& x : w) {
    float* p = x.t.data<float>();
#pragma omp parallel for
    for (int64_t i = 0; i < x.K * x.N; ++i) p[i] = static_cast<float>((i * 2654435761u) % 1000) * 1e-4f - 0.05f;
    bytes += 4.0 * x.K * x.N;
  }
  const int64_t widest = std::max({hidden, inter, vocab});
  std::vector<float> xin(std::max(hidden, inter)), y1(widest), y2(widest), y3(widest);
  for (float& v : xin) v = u(rng);

  auto separate = [&] {
    for (const Weight& x : w) gaf::GemvF32(xin.data(), x.t.data<float>(), x.N, y1.data(), x.K, x.N, false);
  };
  auto siblings = [&] {
    size_t i = 0;
    for (int64_t l = 0; l < layers; ++l, i += 7) {
      const gaf::GemvOutput qkv[3] = {{w[i].t.data<float>(), hidden, y1.data(), hidden},
                                      {w[i + 1].t.data<float>(), kv, y2.data(), kv},
                                      {w[i + 2].t.data<float>(), kv, y3.data(), kv}};
      gaf::GemvF32Many(xin.data(), hidden, qkv, 3);
      gaf::GemvF32(xin.data(), w[i + 3].t.data<float>(), hidden, y1.data(), hidden, hidden, false);
      const gaf::GemvOutput gu[2] = {{w[i + 4].t.data<float>(), inter, y1.data(), inter},
                                     {w[i + 5].t.data<float>(), inter, y2.data(), inter}};
      gaf::GemvF32Many(xin.data(), hidden, gu, 2);
      gaf::GemvF32(xin.data(), w[i + 6].t.data<float>(), hidden, y1.data(), inter, hidden, false);
    }
    gaf::GemvF32(xin.data(), w[i].t.data<float>(), vocab, y1.data(), hidden, vocab, false);
  };
  volatile float sink = 0;
  // The floor: all the weights read once in one parallel sweep, each thread taking an equal share
  // of their bytes in order (across weight boundaries), 8 streams per thread.
  std::vector<int64_t> starts{0};
  for (const Weight& x : w) starts.push_back(starts.back() + x.K * x.N);
  auto floor_read = [&] {
    float s = 0;
#pragma omp parallel reduction(+ : s)
    {
      const int id = omp_get_thread_num(), nt = omp_get_num_threads();
      const int64_t lo = starts.back() * id / nt, hi = starts.back() * (id + 1) / nt;
      for (size_t i = 0; i < w.size(); ++i) {
        const int64_t a = std::max(lo, starts[i]), b = std::min(hi, starts[i + 1]);
        if (a < b) s += static_cast<float>(bench::SumStreams(w[i].t.data<float>() + (a - starts[i]), b - a));
      }
    }
    sink = sink + s;
  };
  auto time = [](auto&& fn) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  std::printf("decode weight stream: %zu products, %.1f MB per step, medians of %d interleaved rounds\n", w.size(),
              bytes / 1e6, rounds);
  std::printf("%4s | %12s %8s | %12s %8s | %12s %8s | %9s %9s\n", "thr", "floor ms", "GB/s", "separate ms", "GB/s",
              "siblings ms", "GB/s", "sep/floor", "sib/floor");
  for (int t : threads) {
    omp_set_num_threads(t);
    std::vector<double> f, a, b;
    separate(), siblings(), floor_read();  // warm-up
    for (int r = 0; r < rounds; ++r) {
      f.push_back(time(floor_read));
      a.push_back(time(separate));
      b.push_back(time(siblings));
    }
    const double mf = Median(f), ma = Median(a), mb = Median(b);
    std::printf("%4d | %12.3f %8.1f | %12.3f %8.1f | %12.3f %8.1f | %9.3f %9.3f\n", t, mf * 1e3, bytes / mf / 1e9,
                ma * 1e3, bytes / ma / 1e9, mb * 1e3, bytes / mb / 1e9, mf / ma, mf / mb);
  }
  return 0;
}
