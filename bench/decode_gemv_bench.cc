// The weight stream of one decode step, cold: the batch-1 products of a Llama decoder's layers
// (q, k, v, o, gate, up, down per layer, then the vocabulary head) over weights far larger than
// the caches, against the machine's read bandwidth measured on the same weights in the same
// process, interleaved round by round. At one row, "separate" runs one GemvF32 per product;
// "siblings" runs q/k/v and gate/up as one GemvF32Many each (as the session's SiblingMatMul does).
// At M rows (--rows: a small batch's decode step, a short prompt), "siblings" is the GEMV's
// multi-row form (GemvF32ManyRows, what products by weights that are not prepared take) and
// "separate" PreparedMatMul per product (its panels, one product at a time). "panel" is the
// products on weights packed into column panels (ops/panel_gemm.h) with siblings grouped, as the
// session's SiblingMatMul runs them. (A prompt's rows against oneDNN: bench/prompt_gemm_bench.)
//
//   decode_gemv_bench [--layers 12] [--hidden 1024] [--kv 256] [--inter 2816] [--vocab 32000]
//                     [--threads 1,2] [--rows 1,4,8] [--rounds 9]
//
// Prints per thread count and row count the median ms per step, GB/s and GFLOPS of each variant,
// the read floor (the same bytes summed by each read pattern of bench_util.h, the fastest, as bench/membw) and the ratio of
// each variant to it. At 1-4 rows it also prints the float16 storage of the same weights, row-major
// (GemvF16ManyRows with siblings grouped) and in panels (HalfPanelGemmMany, as the session runs
// `--half-weights`), against the read floor of their bytes.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "ir/tensor.h"
#include "ops/gemm.h"
#include "ops/gemv.h"
#include "ops/panel_gemm.h"

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
  bench::LlamaDims dims;  // the `bench` preset's unless given
  int rounds = 9;
  std::vector<int> threads{1, 2}, row_counts{1};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (dims.Parse(k, v)) continue;
    if (k == "--rounds") rounds = std::atoi(v.c_str());
    else if (k == "--threads") threads = bench::ParseIntList(v);
    else if (k == "--rows") row_counts = bench::ParseIntList(v);
    else {
      std::fprintf(stderr, "decode_gemv_bench: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  const int64_t layers = dims.layers, hidden = dims.hidden, kv = dims.kv, inter = dims.inter, vocab = dims.vocab;
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
  int max_rows = 1;
  for (int m : row_counts) {
    if (m < 1 || m > gaf::kPanelMaxRows) {
      std::fprintf(stderr, "decode_gemv_bench: --rows must be 1 to %lld\n", static_cast<long long>(gaf::kPanelMaxRows));
      return 2;
    }
    max_rows = std::max(max_rows, m);
  }
  std::vector<float> xin(max_rows * std::max(hidden, inter)), y1(max_rows * widest), y2(max_rows * widest),
      y3(max_rows * widest);
  for (float& v : xin) v = u(rng);
  // The float16 copies (as codegen/half_weights makes them), in memory of their own.
  std::vector<gaf::Tensor> halves;
  for (const Weight& x : w) {
    halves.push_back(gaf::Tensor::Uninitialized(gaf::DataType::kFloat16, {x.K, x.N}));
    gaf::ConvertToHalf(x.t.data<float>(), static_cast<uint16_t*>(halves.back().raw()), x.K * x.N);
  }
  std::vector<gaf::PanelWeight> panels;
  std::vector<gaf::HalfPanelWeight> half_panels;  // as codegen/half_weights streams a decode step's
  for (const Weight& x : w) half_panels.emplace_back(x.t.data<float>(), x.K, x.N);
  std::vector<std::unique_ptr<gaf::PreparedMatMul>> prepared;
  const auto pack_start = std::chrono::steady_clock::now();
  for (const Weight& x : w) panels.emplace_back(x.t.data<float>(), x.K, x.N);
  const double pack_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - pack_start).count();
  for (const Weight& x : w) prepared.push_back(std::make_unique<gaf::PreparedMatMul>(x.t));
  int64_t M = 1;  // the row count being measured

  // One step's products in the session's order, each group of siblings through `group` (the
  // products of one x: count weights from index i, each y at y1/y2/y3) and lone products through `one`.
  auto step = [&](auto&& group, auto&& one) {
    size_t i = 0;
    for (int64_t l = 0; l < layers; ++l, i += 7) {
      group(i, 3), one(i + 3), group(i + 4, 2), one(i + 6);
    }
    one(i);
  };
  float* ys[3] = {y1.data(), y2.data(), y3.data()};
  auto separate = [&] {
    for (size_t i = 0; i < w.size(); ++i) {
      if (M == 1) gaf::GemvF32(xin.data(), w[i].t.data<float>(), w[i].N, y1.data(), w[i].K, w[i].N, false);
      else prepared[i]->Run(xin.data(), M, y1.data());
    }
  };
  auto siblings = [&] {
    step(
        [&](size_t i, int n) {
          gaf::GemvOutput outs[3];
          for (int j = 0; j < n; ++j) outs[j] = {w[i + j].t.data<float>(), w[i + j].N, ys[j], w[i + j].N};
          gaf::GemvF32ManyRows(xin.data(), M, w[i].K, outs, n);
        },
        [&](size_t i) {
          const gaf::GemvOutput out{w[i].t.data<float>(), w[i].N, y1.data(), w[i].N};
          gaf::GemvF32ManyRows(xin.data(), M, w[i].K, &out, 1);
        });
  };
  auto panel = [&] {
    step(
        [&](size_t i, int n) {
          gaf::PanelProduct ps[3];
          for (int j = 0; j < n; ++j) ps[j] = {&panels[i + j], ys[j]};
          gaf::PanelGemmMany(xin.data(), M, w[i].K, ps, n);
        },
        [&](size_t i) {
          const gaf::PanelProduct p{&panels[i], y1.data()};
          gaf::PanelGemmMany(xin.data(), M, w[i].K, &p, 1);
        });
  };
  auto half = [&] {
    step(
        [&](size_t i, int n) {
          gaf::GemvHalfOutput outs[3];
          for (int j = 0; j < n; ++j)
            outs[j] = {static_cast<const uint16_t*>(halves[i + j].raw()), w[i + j].N, ys[j], w[i + j].N};
          gaf::GemvF16ManyRows(xin.data(), M, w[i].K, outs, n);
        },
        [&](size_t i) {
          const gaf::GemvHalfOutput out{static_cast<const uint16_t*>(halves[i].raw()), w[i].N, y1.data(), w[i].N};
          gaf::GemvF16ManyRows(xin.data(), M, w[i].K, &out, 1);
        });
  };
  auto half_panel = [&] {
    step(
        [&](size_t i, int n) {
          gaf::HalfPanelProduct ps[3];
          for (int j = 0; j < n; ++j) ps[j] = {&half_panels[i + j], ys[j]};
          gaf::HalfPanelGemmMany(xin.data(), M, w[i].K, ps, n);
        },
        [&](size_t i) {
          const gaf::HalfPanelProduct p{&half_panels[i], y1.data()};
          gaf::HalfPanelGemmMany(xin.data(), M, w[i].K, &p, 1);
        });
  };
  // The panel results against the row-major GEMV's on the last product (the head), as a check.
  auto check = [&] {
    std::vector<float> a(M * w.back().N), b(M * w.back().N);
    const gaf::GemvOutput out{w.back().t.data<float>(), w.back().N, a.data(), w.back().N};
    gaf::GemvF32ManyRows(xin.data(), M, w.back().K, &out, 1);
    const gaf::PanelProduct p{&panels.back(), b.data()};
    gaf::PanelGemmMany(xin.data(), M, w.back().K, &p, 1);
    double worst = 0;
    for (size_t j = 0; j < a.size(); ++j) worst = std::max(worst, static_cast<double>(std::abs(a[j] - b[j])));
    return worst;
  };
  volatile float sink = 0;
  // The floor: all the weights read once in one parallel sweep, each thread taking an equal share
  // of their bytes in order (across weight boundaries), in each read pattern of bench_util.h (the floors take the fastest).
  std::vector<int64_t> starts{0};
  for (const Weight& x : w) starts.push_back(starts.back() + x.K * x.N);
  size_t pattern = 0;  // of bench::kReadPatterns: the floors take the fastest each round (FastestRead)
  auto floor_read = [&] {
    const auto sum = bench::kReadPatterns[pattern].sum;
    float s = 0;
#pragma omp parallel reduction(+ : s)
    {
      const int id = omp_get_thread_num(), nt = omp_get_num_threads();
      const int64_t lo = starts.back() * id / nt, hi = starts.back() * (id + 1) / nt;
      for (size_t i = 0; i < w.size(); ++i) {
        const int64_t a = std::max(lo, starts[i]), b = std::min(hi, starts[i + 1]);
        if (a < b) s += static_cast<float>(sum(w[i].t.data<float>() + (a - starts[i]), b - a));
      }
    }
    sink = sink + s;
  };
  auto floor_half = [&] {  // the float16 bytes, read as floats (half as many)
    const auto sum = bench::kReadPatterns[pattern].sum;
    float s = 0;
#pragma omp parallel reduction(+ : s)
    {
      const int id = omp_get_thread_num(), nt = omp_get_num_threads();
      const int64_t lo = starts.back() / 2 * id / nt, hi = starts.back() / 2 * (id + 1) / nt;
      for (size_t i = 0; i < w.size(); ++i) {
        const int64_t a = std::max(lo, starts[i] / 2), b = std::min(hi, starts[i + 1] / 2);
        if (a < b)
          s += static_cast<float>(
              sum(static_cast<const float*>(halves[i].raw()) + (a - starts[i] / 2), b - a));
      }
    }
    sink = sink + s;
  };
  auto time = [](auto&& fn) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // The read floor of a round: the fastest of the read patterns, each timed once.
  auto fastest_read = [&](auto&& read) {
    double best = 0;
    for (pattern = 0; pattern < std::size(bench::kReadPatterns); ++pattern) {
      const double t = time(read);
      if (pattern == 0 || t < best) best = t;
    }
    pattern = 0;
    return best;
  };
  std::printf("decode weight stream: %zu products, %.1f MB per step, medians of %d interleaved rounds\n", w.size(),
              bytes / 1e6, rounds);
  std::printf("packing the panel copies: %.1f ms (%d threads)\n", pack_s * 1e3, omp_get_max_threads());
  std::printf("%4s %4s | %9s %6s | %9s %6s %6s | %9s %6s %6s | %9s %6s %6s | %7s %7s %7s | %8s\n", "thr", "rows",
              "floor ms", "GB/s", "separ ms", "GB/s", "GFLOPS", "sibl ms", "GB/s", "GFLOPS", "panel ms", "GB/s",
              "GFLOPS", "sep/fl", "sib/fl", "pan/fl", "max diff");
  for (int t : threads) {
    omp_set_num_threads(t);
    for (int m : row_counts) {
      M = m;
      std::vector<double> f, a, b, c;
      separate(), siblings(), panel(), floor_read();  // warm-up (and oneDNN's packing)
      for (int r = 0; r < rounds; ++r) {
        f.push_back(fastest_read(floor_read));
        a.push_back(time(separate));
        b.push_back(time(siblings));
        c.push_back(time(panel));
      }
      std::vector<double> hf, hh, hp;
      const bool halves_run = M <= gaf::kHalfPanelMaxRows;
      if (halves_run) {
        half(), half_panel(), floor_half();
        for (int r = 0; r < rounds; ++r)
          hf.push_back(fastest_read(floor_half)), hh.push_back(time(half)), hp.push_back(time(half_panel));
      }
      const double mf = Median(f), ma = Median(a), mb = Median(b), mc = Median(c), flops = 2.0 * M * bytes / 4;
      std::printf("%4d %4d | %9.3f %6.1f | %9.3f %6.1f %6.0f | %9.3f %6.1f %6.0f | %9.3f %6.1f %6.0f | %7.3f %7.3f %7.3f | %8.1e\n",
                  t, m, mf * 1e3, bytes / mf / 1e9, ma * 1e3, bytes / ma / 1e9, flops / ma / 1e9, mb * 1e3,
                  bytes / mb / 1e9, flops / mb / 1e9, mc * 1e3, bytes / mc / 1e9, flops / mc / 1e9, mf / ma, mf / mb,
                  mf / mc, check());
      if (halves_run)
        std::printf("%4d %4d | float16 weights (%.1f MB): floor %.3f ms (%.1f GB/s), siblings %.3f ms (%.1f GB/s), "
                    "panels %.3f ms (%.1f GB/s), floor / siblings %.3f, floor / panels %.3f\n",
                    t, m, bytes / 2e6, Median(hf) * 1e3, bytes / 2 / Median(hf) / 1e9, Median(hh) * 1e3,
                    bytes / 2 / Median(hh) / 1e9, Median(hp) * 1e3, bytes / 2 / Median(hp) / 1e9,
                    Median(hf) / Median(hh), Median(hf) / Median(hp));
    }
  }
  return 0;
}
