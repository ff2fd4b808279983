// Helpers for bench/llama_bench.sh, linked against the project's libraries:
//
//   gaf_bench_tool weights MODEL
//       JSON: bytes of initializers one decode step (batch 1, one new token) reads, by category:
//         matmul   every MatMul/Gemm input that is an initializer, in full
//         gather   for a Gather whose data is an initializer: one slice along `axis` per index
//                  (the embedding row and the rotary cos/sin rows of the one new token)
//         other    every other initializer a node reads (norm weights, scalars), in full
//       total = matmul + gather + other. Initializers read by several nodes count once per node
//       (a weight read twice is read twice).
//
//   gaf_bench_tool logits MODEL --prompt-ids 1,2,3 [--threads T] -o FILE.npy
//       The prefill (prompt, empty cache) through our runtime; writes the last position's logits
//       as float32 [vocab] and prints their greedy token.
//
//   gaf_bench_tool rewrites MODEL [-i NAME=FILE.npy ...] [--threads T] [--repeat N]
//       The session's plan rewrites (runtime/plan_rewrite.h) on and off, side by side in one
//       process: two sessions of MODEL (fused operators on their generated kernels, as `run`),
//       their runs interleaved N times (default 41) after a warm-up; JSON with both medians (ms),
//       off / on, and whether the outputs are the same bits.
#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

#include <algorithm>
#include <chrono>
#include <map>

#include "codegen/compiler.h"
#include "codegen/fused_session.h"
#include "cost/workload.h"
#include "ir/error.h"
#include "models/generate.h"
#include "onnx_io/npy.h"
#include "onnx_io/onnx_io.h"
#include "runtime/session.h"

namespace {

using namespace gaf;

std::vector<int64_t> ParseIds(const std::string& s) {
  std::vector<int64_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) ids.push_back(std::stoll(item));
  GAF_CHECK(!ids.empty(), "--prompt-ids: no ids");
  return ids;
}

int Weights(const std::string& path) {
  Model m = LoadModel(path);
  const DecodeStepBytes b = CountDecodeStepBytes(m.graph);
  int64_t all = 0;
  for (const auto& [name, t] : m.graph.initializers) all += static_cast<int64_t>(t.nbytes());
  fmt::print(
      "{{\"model\": \"{}\", \"matmul_bytes\": {}, \"matmul_tensors\": {}, \"gather_row_bytes\": {}, "
      "\"gather_tensors\": {}, \"other_bytes\": {}, \"other_tensors\": {}, \"total_bytes\": {}, "
      "\"all_initializer_bytes\": {}}}\n",
      path, b.matmul, b.matmul_tensors, b.gather, b.gather_tensors, b.other, b.other_tensors,
      b.total(), all);
  return 0;
}

int Logits(const std::string& path, const std::vector<int64_t>& ids, int threads, const std::string& out) {
  Model m = LoadModel(path);
  SessionOptions so;
  so.num_threads = threads;
  Session s(m, so);
  DecoderSignature sig = DecoderSignature::Discover(s.inputs(), s.outputs());
  Tensor logits = ForwardNoCache(s, sig, ids);
  Tensor f = logits.dtype() == DataType::kFloat ? logits : logits.CastTo(DataType::kFloat);
  const int64_t vocab = f.dim(-1);
  const int64_t offset = f.numel() - vocab;
  Tensor last(DataType::kFloat, {vocab});
  std::memcpy(last.data<float>(), f.data<float>() + offset, static_cast<size_t>(vocab) * sizeof(float));
  SaveNpy(last, out);
  fmt::print("{{\"token\": {}, \"vocab\": {}}}\n", ArgmaxLastPosition(logits), vocab);
  return 0;
}

int Rewrites(const std::string& path, const std::vector<std::string>& inputs, int threads, int repeat) {
  Model m = LoadModel(path);
  Feeds given;
  for (const std::string& in : inputs) {
    const size_t eq = in.find('=');
    GAF_CHECK(eq != std::string::npos, "-i expects NAME=FILE.npy, got '{}'", in);
    given[in.substr(0, eq)] = LoadNpy(in.substr(eq + 1));
  }
  const Feeds feeds = CompleteFeeds(m, given);
  Workload w;
  w.samples.push_back(feeds);
  KernelCompiler compiler;
  std::shared_ptr<FusedKernelSet> kernels = CompileFusedKernels(m, compiler, w);
  SessionOptions on;
  on.num_threads = threads;
  on.function_kernels = kernels->Provider();
  SessionOptions off = on;
  off.rewrite_products = false;
  Session a(m, off), b(m, on);
  std::vector<Tensor> ya = a.Run(feeds), yb = b.Run(feeds);  // warm-up (plans, first touches)
  bool same = ya.size() == yb.size();
  for (size_t i = 0; same && i < ya.size(); ++i)
    same = ya[i].dtype() == yb[i].dtype() && ya[i].shape() == yb[i].shape() &&
           std::memcmp(ya[i].raw(), yb[i].raw(), ya[i].nbytes()) == 0;
  std::vector<double> ta, tb;
  auto time = [&](Session& s, std::vector<double>& t) {
    const auto t0 = std::chrono::steady_clock::now();
    s.Run(feeds);
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  };
  for (int r = 0; r < repeat; ++r) {
    if (r % 2 == 0) {
      time(a, ta);
      time(b, tb);
    } else {
      time(b, tb);
      time(a, ta);
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const ProductRewrites& r = b.product_rewrites();
  fmt::print("{{\"model\": \"{}\", \"threads\": {}, \"runs\": {}, \"off_ms\": {:.3f}, \"on_ms\": {:.3f}, "
             "\"off_over_on\": {:.3f}, \"same_outputs\": {}, \"copy_groups\": {}, \"sibling_groups\": {}, "
             "\"transposed\": {}, \"kv_grouped\": {}}}\n",
             path, threads, repeat, median(ta), median(tb), median(ta) / median(tb), same ? "true" : "false",
             r.copy_groups, r.sibling_groups, r.transposed, r.kv_grouped);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::vector<std::string> a(argv + 1, argv + argc);
    if (a.size() == 2 && a[0] == "weights") return Weights(a[1]);
    if (a.size() >= 2 && a[0] == "logits") {
      std::string ids, out;
      int threads = 1;
      for (size_t i = 2; i + 1 < a.size(); i += 2) {
        if (a[i] == "--prompt-ids") ids = a[i + 1];
        else if (a[i] == "--threads") threads = std::atoi(a[i + 1].c_str());
        else if (a[i] == "-o") out = a[i + 1];
        else throw Error(fmt::format("unknown option {}", a[i]));
      }
      GAF_CHECK(!out.empty(), "logits: -o FILE.npy is required");
      return Logits(a[1], ParseIds(ids), threads, out);
    }
    if (a.size() >= 2 && a[0] == "rewrites") {
      std::vector<std::string> inputs;
      int threads = 1, repeat = 41;
      for (size_t i = 2; i + 1 < a.size(); i += 2) {
        if (a[i] == "-i") inputs.push_back(a[i + 1]);
        else if (a[i] == "--threads") threads = std::atoi(a[i + 1].c_str());
        else if (a[i] == "--repeat") repeat = std::max(1, std::atoi(a[i + 1].c_str()));
        else throw Error(fmt::format("unknown option {}", a[i]));
      }
      return Rewrites(a[1], inputs, threads, repeat);
    }
    fmt::print(stderr,
               "usage: gaf_bench_tool weights MODEL | logits MODEL --prompt-ids IDS [--threads T] -o FILE.npy | "
               "rewrites MODEL [-i NAME=FILE.npy ...] [--threads T] [--repeat N]\n");
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "gaf_bench_tool: {}\n", e.what());
    return 1;
  }
}
