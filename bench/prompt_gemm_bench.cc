// The weight products of a prompt (prefill) of a Llama decoder at M rows, as the session runs
// them: per layer q/k/v as one set of tasks, o, the SwiGLU gate and up with the gate applied
// (GatedMatMul), down; then the vocabulary head. Each kind on the weights packed into column panels
// (ops/panel_gemm.h, what PreparedMatMul runs) against oneDNN's matmul on its own packed copy
// (PreparedMatMul::RunLibrary; for the gated pair the two products and then the gate, as the
// session ran a prompt before), interleaved round by round with the FMA peak of bench/fma_peak
// measured in the same rounds.
//
//   prompt_gemm_bench [--layers 12] [--hidden 1024] [--kv 256] [--inter 2816] [--vocab 32000]
//                     [--rows 256] [--threads 2] [--rounds 5]
//
// Prints per kind the median ms per prompt of each engine, its GFLOPS and fraction of the FMA
// peak, the ratio, and the largest difference between the two engines' results.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"
#include "ops/gemm.h"
#include "ops/panel_gemm.h"

namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class Fn>
double Seconds(Fn&& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

gaf::Tensor Weight(int64_t K, int64_t N, uint32_t seed) {
  gaf::Tensor t = gaf::Tensor::Uninitialized(gaf::DataType::kFloat, {K, N});
  float* p = t.data<float>();
#pragma omp parallel for
  for (int64_t i = 0; i < K * N; ++i) p[i] = static_cast<float>((i * 2654435761u + seed) % 1000) * 1e-4f - 0.05f;
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  bench::LlamaDims dims;  // the `bench` preset's unless given
  int64_t M = 256;
  int threads = 2, rounds = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (dims.Parse(k, v)) continue;
    if (k == "--rows") M = std::atoll(v.c_str());
    else if (k == "--threads") threads = std::atoi(v.c_str());
    else if (k == "--rounds") rounds = std::atoi(v.c_str());
    else {
      std::fprintf(stderr, "prompt_gemm_bench: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  const int64_t layers = dims.layers, hidden = dims.hidden, kv = dims.kv, inter = dims.inter, vocab = dims.vocab;
  if (layers < 1 || hidden < 1 || kv < 1 || inter < 1 || vocab < 1 || M < 1 || threads < 1 || rounds < 1 ||
      M > 65536 || hidden > 65536 || inter > 65536 || vocab > 1 << 20) {
    std::fprintf(stderr, "prompt_gemm_bench: sizes out of range\n");
    return 2;
  }
  omp_set_num_threads(threads);
  struct Layer {
    std::unique_ptr<gaf::PreparedMatMul> q, k, v, o, gate, up, down;
    gaf::PanelWeight pair;
  };
  std::vector<Layer> ls(layers);
  uint32_t seed = 1;
  for (Layer& l : ls) {
    l.q = std::make_unique<gaf::PreparedMatMul>(Weight(hidden, hidden, seed++));
    l.k = std::make_unique<gaf::PreparedMatMul>(Weight(hidden, kv, seed++));
    l.v = std::make_unique<gaf::PreparedMatMul>(Weight(hidden, kv, seed++));
    l.o = std::make_unique<gaf::PreparedMatMul>(Weight(hidden, hidden, seed++));
    l.gate = std::make_unique<gaf::PreparedMatMul>(Weight(hidden, inter, seed++));
    l.up = std::make_unique<gaf::PreparedMatMul>(Weight(hidden, inter, seed++));
    l.down = std::make_unique<gaf::PreparedMatMul>(Weight(inter, hidden, seed++));
    l.pair = gaf::PanelWeight::GatePair(l.gate->weight().data<float>(), l.up->weight().data<float>(), hidden, inter);
  }
  gaf::PreparedMatMul head(Weight(hidden, vocab, seed++));
  std::vector<float> x(M * std::max(hidden, inter));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 7919) % 2000) * 1e-3f - 1.f;
  // Outputs per engine (compared after the rounds); the gated pair's two products for oneDNN.
  std::vector<float> yq[2], yk[2], yv[2], yo[2], yg[2], yd[2], yh[2], g(M * inter), u(M * inter);
  for (int e = 0; e < 2; ++e) {
    yq[e].resize(M * hidden), yk[e].resize(M * kv), yv[e].resize(M * kv), yo[e].resize(M * hidden);
    yg[e].resize(M * inter), yd[e].resize(M * hidden), yh[e].resize(M * vocab);
  }
  const char* kinds[] = {"q, k, v", "o", "gate, up", "down", "head"};
  const double flops[] = {2.0 * M * hidden * (hidden + 2 * kv) * layers, 2.0 * M * hidden * hidden * layers,
                          2.0 * M * hidden * 2 * inter * layers, 2.0 * M * inter * hidden * layers,
                          2.0 * M * hidden * vocab};
  // kind c of engine e (0: panels, 1: oneDNN) over every layer.
  auto run = [&](int c, int e) {
    const float* a = x.data();
    if (c == 4) return e == 0 ? head.Run(a, M, yh[0].data()) : head.RunLibrary(a, M, yh[1].data());
    for (Layer& l : ls) {
      if (c == 0 && e == 0) {
        const gaf::PanelProduct ps[3] = {{&l.q->panels(), yq[0].data()}, {&l.k->panels(), yk[0].data()},
                                         {&l.v->panels(), yv[0].data()}};
        gaf::PanelGemmMany(a, M, hidden, ps, 3);
      } else if (c == 0) {
        l.q->RunLibrary(a, M, yq[1].data()), l.k->RunLibrary(a, M, yk[1].data()), l.v->RunLibrary(a, M, yv[1].data());
      } else if (c == 1) {
        e == 0 ? l.o->Run(a, M, yo[0].data()) : l.o->RunLibrary(a, M, yo[1].data());
      } else if (c == 2 && e == 0) {
        const gaf::PanelProduct p{&l.pair, yg[0].data(), inter};
        gaf::PanelGemmMany(a, M, hidden, &p, 1);
      } else if (c == 2) {
        l.gate->RunLibrary(a, M, g.data()), l.up->RunLibrary(a, M, u.data());
#pragma omp parallel for
        for (int64_t m = 0; m < M; ++m)
          gaf::StoreGated(g.data() + m * inter, inter, u.data() + m * inter, inter, 1, inter, yg[1].data() + m * inter,
                          inter);
      } else {
        e == 0 ? l.down->Run(a, M, yd[0].data()) : l.down->RunLibrary(a, M, yd[1].data());
      }
    }
  };
  for (int c = 0; c < 5; ++c) run(c, 0), run(c, 1);  // warm-up: the packed copies and primitives
  std::vector<double> t[5][2], peak;
  volatile float sink = 0;
  for (int r = 0; r < rounds; ++r) {
    const long long iters = 20'000'000;
    float s = 0;
    const double sec = Seconds([&] {
#pragma omp parallel reduction(+ : s)
      s += bench::FmaChains(iters, static_cast<float>(omp_get_thread_num()));
    });
    sink = sink + s;
    peak.push_back(2.0 * bench::kFmaLanes * bench::kFmaChains * iters * threads / sec / 1e9);
    for (int c = 0; c < 5; ++c)
      for (int e0 = 0; e0 < 2; ++e0) {
        const int e = (e0 + r) % 2;  // alternate which engine goes first
        t[c][e].push_back(Seconds([&] { run(c, e); }));
      }
  }
  const double fma = Median(peak);
  std::printf("prompt products: %lld rows, %lld layers (hidden %lld, kv %lld, inter %lld) and a head of %lld, "
              "%d threads, medians of %d interleaved rounds\n",
              static_cast<long long>(M), static_cast<long long>(layers), static_cast<long long>(hidden),
              static_cast<long long>(kv), static_cast<long long>(inter), static_cast<long long>(vocab), threads, rounds);
  std::printf("FMA peak (bench/fma_peak's chains, the same rounds): %.1f GFLOPS\n", fma);
  std::printf("%-9s | %9s %7s %5s | %9s %7s %5s | %7s | %8s\n", "kind", "panels ms", "GFLOPS", "peak", "oneDNN ms",
              "GFLOPS", "peak", "speedup", "max diff");
  double tp = 0, tl = 0, all = 0;
  const std::vector<float>* outs[] = {yq, yo, yg, yd, yh};
  for (int c = 0; c < 5; ++c) {
    const double p = Median(t[c][0]), l = Median(t[c][1]);
    tp += p, tl += l, all += flops[c];
    double worst = 0;
    for (size_t i = 0; i < outs[c][0].size(); ++i)
      worst = std::max(worst, static_cast<double>(std::abs(outs[c][0][i] - outs[c][1][i])));
    std::printf("%-9s | %9.2f %7.1f %5.3f | %9.2f %7.1f %5.3f | %6.3fx | %8.1e\n", kinds[c], p * 1e3,
                flops[c] / p / 1e9, flops[c] / p / 1e9 / fma, l * 1e3, flops[c] / l / 1e9, flops[c] / l / 1e9 / fma,
                l / p, worst);
  }
  std::printf("%-9s | %9.2f %7.1f %5.3f | %9.2f %7.1f %5.3f | %6.3fx |\n", "all", tp * 1e3, all / tp / 1e9,
              all / tp / 1e9 / fma, tl * 1e3, all / tl / 1e9, all / tl / 1e9 / fma, tl / tp);
  return 0;
}
