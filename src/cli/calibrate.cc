// `autofusion calibrate`: measures the host CPU and writes its hardware profile.
//
//   autofusion calibrate [-o profiles/host-cpu.json] [--threads N] [--repeats R]
//
// What is measured (medians of R repeats, after a warm-up run), see docs/cost_model.md:
//   bandwidth_gbs       copy of a large array (bytes read + bytes written per second), all threads;
//                       the pure read rate (a sum over the array) is kept in measurements
//   peak_gflops         float32 MatMul 1024x1024x1024 through our runtime (oneDNN), all threads;
//                       an FMA-bound register kernel's rate is kept in measurements
//   l1/l2/l3_bytes      sysconf(_SC_LEVEL*_CACHE_SIZE), else /sys/devices/system/cpu/cpu0/cache
//   local_memory_bytes  the L2 size (per core): the working set one thread's block must fit in
//   kernel_overhead_us  a chain of 256 Relu nodes on one element in a Session, per node
#include <fmt/format.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cost/cost_model.h"
#include "ir/error.h"
#include "runtime/session.h"
#include "ir/output_file.h"

namespace gaf::cli {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

// Times fn() `repeats` times after one warm-up call; returns the median seconds.
double MedianTime(int repeats, const std::function<void()>& fn) {
  fn();
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    const auto a = Clock::now();
    fn();
    t.push_back(Seconds(a, Clock::now()));
  }
  return Median(t);
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto p = line.find(':');
      if (p != std::string::npos) {
        std::string s = line.substr(p + 1);
        s.erase(0, s.find_first_not_of(" \t"));
        return s;
      }
    }
  }
  return "unknown CPU";
}

std::string Today() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&t));
  return buf;
}

// Size in bytes of the data (or unified) cache of `level` from sysfs; 0 if not found.
double SysfsCacheSize(int level) {
  namespace fs = std::filesystem;
  const fs::path dir = "/sys/devices/system/cpu/cpu0/cache";
  std::error_code ec;
  if (!fs::exists(dir, ec)) return 0;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().filename().string().rfind("index", 0) != 0) continue;
    std::ifstream lv(e.path() / "level"), ty(e.path() / "type"), sz(e.path() / "size");
    int l = 0;
    std::string type, size;
    if (!(lv >> l) || !(ty >> type) || !(sz >> size) || l != level || type == "Instruction") continue;
    double v = std::atof(size.c_str());
    if (size.back() == 'K') v *= 1024;
    if (size.back() == 'M') v *= 1024 * 1024;
    return v;
  }
  return 0;
}

double CacheSize(int level) {
  const int names[] = {_SC_LEVEL1_DCACHE_SIZE, _SC_LEVEL2_CACHE_SIZE, _SC_LEVEL3_CACHE_SIZE};
  const long v = sysconf(names[level - 1]);
  if (v > 0) return static_cast<double>(v);
  return SysfsCacheSize(level);
}

#if defined(__AVX512F__)
constexpr int kLanes = 16;
#else
constexpr int kLanes = 8;
#endif
typedef float VecF __attribute__((vector_size(kLanes * sizeof(float))));

VecF LoadVec(const float* p) {
  VecF v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}

float HorizontalSum(VecF v) {
  float s = 0;
  for (int l = 0; l < kLanes; ++l) s += v[l];
  return s;
}

// ---- Memory bandwidth ----
double g_sink = 0;

// Each thread sums its share of the array as `Streams` streams over contiguous runs, `Block`
// floats of each in turn (one sequential stream per core is held back by the hardware
// prefetchers, which made a single stream read 10-20% below what the decode kernels stream), with
// four independent vector sums so the loads, not the add latency, limit it.
template <int64_t Streams, int64_t Block>
double SumShare(const float* p, int64_t n) {
  const int64_t run = n / Streams / Block * Block;
  VecF s0 = {}, s1 = {}, s2 = {}, s3 = {};
  for (int64_t i = 0; i < run; i += Block)
    for (int64_t k = 0; k < Streams; ++k) {
      const float* q = p + k * run + i;
      for (int64_t j = 0; j < Block; j += 4 * kLanes) {
        s0 += LoadVec(q + j);
        s1 += LoadVec(q + j + kLanes);
        s2 += LoadVec(q + j + 2 * kLanes);
        s3 += LoadVec(q + j + 3 * kLanes);
      }
    }
  float tail = 0;
  for (int64_t i = Streams * run; i < n; ++i) tail += p[i];
  return HorizontalSum(s0 + s1 + s2 + s3) + tail;
}

// Which read pattern is fastest depends on the machine and on what else runs on it (on the shared
// AMD EPYC host, 8 streams of 1 KiB turns read 75-86 GB/s in quiet hours, while under load 4
// streams of 256 B read 57.9 GB/s against 41.5 and the decode products' panels 61): the read
// bandwidth is that of the fastest (the median of `repeats` reads of each).
using SumFn = double (*)(const float*, int64_t);
constexpr SumFn kReadPatterns[] = {&SumShare<8, 256>, &SumShare<4, 64>, &SumShare<2, 256>};

}  // namespace

double ReadBandwidthGbs(const Tensor& a, int repeats) {
  const int64_t n = a.numel();
  const float* p = a.data<float>();
  double best = 0;
  for (SumFn sum_share : kReadPatterns) {
    const double t = MedianTime(repeats, [&] {
      double sum = 0;
#pragma omp parallel reduction(+ : sum)
      {
        const int64_t nt = omp_get_num_threads(), tid = omp_get_thread_num();
        const int64_t lo = n * tid / nt, hi = n * (tid + 1) / nt;
        sum += sum_share(p + lo, hi - lo);
      }
      g_sink += sum;
    });
    best = std::max(best, static_cast<double>(n) * sizeof(float) / t / 1e9);
  }
  return best;
}

namespace {

double CopyBandwidthGbs(const std::vector<float>& src, std::vector<float>& dst, int repeats) {
  const int64_t n = static_cast<int64_t>(src.size());
  const float* s = src.data();
  float* d = dst.data();
  const double t = MedianTime(repeats, [&] {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) d[i] = s[i];
    g_sink += d[n / 2];
  });
  return 2.0 * static_cast<double>(n) * sizeof(float) / t / 1e9;  // read + write
}

// ---- Compute rate ----
constexpr int kAccumulators = 12;  // enough independent FMA chains to cover latency x ports

double FmaGflops(int threads, int repeats) {
  constexpr int64_t kIters = 2'000'000;
  const double t = MedianTime(repeats, [&] {
    double total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
      VecF acc[kAccumulators];
      const float seed = static_cast<float>(omp_get_thread_num() + 1) * 1e-3f;
      for (int j = 0; j < kAccumulators; ++j)
        for (int l = 0; l < kLanes; ++l) acc[j][l] = seed * static_cast<float>(j + l);
      VecF m, c;
      for (int l = 0; l < kLanes; ++l) {
        m[l] = 0.999999f;
        c[l] = 1e-7f;
      }
      for (int64_t i = 0; i < kIters; ++i) {
#pragma GCC unroll 16
        for (int j = 0; j < kAccumulators; ++j) acc[j] = acc[j] * m + c;  // one FMA per lane
      }
      for (int j = 0; j < kAccumulators; ++j)
        for (int l = 0; l < kLanes; ++l) total += acc[j][l];
    }
    g_sink += total;
  });
  return 2.0 * kIters * kAccumulators * kLanes * threads / t / 1e9;
}

Model MatMulModel(int64_t n) {
  Model m;
  m.opset_imports.push_back({"", 17});
  Node mm;
  mm.name = "matmul";
  mm.op_type = "MatMul";
  mm.inputs = {"a", "b"};
  mm.outputs = {"y"};
  m.graph.nodes.push_back(mm);
  for (const char* name : {"a", "b"}) {
    ValueInfo v;
    v.name = name;
    v.dtype = DataType::kFloat;
    v.has_shape = true;
    v.dims = {Dim::Known(n), Dim::Known(n)};
    m.graph.inputs.push_back(v);
  }
  ValueInfo y;
  y.name = "y";
  y.dtype = DataType::kFloat;
  m.graph.outputs.push_back(y);
  return m;
}

double MatMulGflops(int threads, int repeats) {
  constexpr int64_t kN = 1024;
  SessionOptions opts;
  opts.num_threads = threads;
  Session s(MatMulModel(kN), opts);
  Tensor a(DataType::kFloat, {kN, kN}), b(DataType::kFloat, {kN, kN});
  for (int64_t i = 0; i < a.numel(); ++i) {
    a.data<float>()[i] = static_cast<float>(i % 7) * 0.1f;
    b.data<float>()[i] = static_cast<float>(i % 5) * 0.1f;
  }
  const std::map<std::string, Tensor> feeds{{"a", a}, {"b", b}};
  const double t = MedianTime(repeats, [&] { s.Run(feeds); });
  return 2.0 * kN * kN * kN / t / 1e9;
}

// ---- Dispatch overhead ----
double DispatchOverheadUs(int threads, int repeats) {
  constexpr int kNodes = 256;
  Model m;
  m.opset_imports.push_back({"", 17});
  std::string prev = "x";
  for (int i = 0; i < kNodes; ++i) {
    Node n;
    n.name = fmt::format("relu_{}", i);
    n.op_type = "Relu";
    n.inputs = {prev};
    prev = i + 1 == kNodes ? "y" : fmt::format("v{}", i);
    n.outputs = {prev};
    m.graph.nodes.push_back(n);
  }
  ValueInfo x;
  x.name = "x";
  x.dtype = DataType::kFloat;
  x.has_shape = true;
  x.dims = {Dim::Known(1)};
  m.graph.inputs.push_back(x);
  ValueInfo y = x;
  y.name = "y";
  m.graph.outputs.push_back(y);
  SessionOptions opts;
  opts.num_threads = threads;
  Session s(m, opts);
  const std::map<std::string, Tensor> feeds{{"x", Tensor::FromVector<float>({0.5f}, {1})}};
  // Several runs per sample so one sample is well above the clock's resolution.
  const double t = MedianTime(repeats, [&] {
    for (int r = 0; r < 10; ++r) s.Run(feeds);
  });
  return t / 10 / kNodes * 1e6;
}

void RunCalibrate(std::string out, int threads, int repeats) {
  const int max_threads = omp_get_max_threads();
  if (threads <= 0) threads = max_threads;
  GAF_CHECK(repeats >= 1, "calibrate: --repeats must be at least 1, got {}", repeats);
  omp_set_num_threads(threads);
  if (out.empty()) out = (std::filesystem::path(HardwareProfile::ProfilesDir()) / "host-cpu.json").string();
  CheckOutputPath(out, {}, true, "-o");

  HardwareProfile p;
  p.name = "host-cpu";
  const std::string cpu = CpuModel();
  p.description = fmt::format("host CPU: {} ({} threads)", cpu, threads);
  p.threads = threads;
  p.l1_bytes = CacheSize(1);
  p.l2_bytes = CacheSize(2);
  p.l3_bytes = CacheSize(3);
  p.local_memory_bytes = p.l2_bytes > 0 ? p.l2_bytes : 512 * 1024;
  p.local_memory_note = p.l2_bytes > 0 ? "L2 cache per core (the working set of one thread's block)"
                                       : "L2 size unknown: 512 KiB assumed";
  fmt::print("calibrating {} with {} threads, {} repeats each (medians)\n", cpu, threads, repeats);
  fmt::print("  caches: L1d {:.0f} KiB, L2 {:.0f} KiB, L3 {:.0f} KiB\n", p.l1_bytes / 1024, p.l2_bytes / 1024,
             p.l3_bytes / 1024);

  // The array must be far larger than the caches: 4 x L3, between 256 MiB and 1 GiB.
  const double want = std::clamp(4 * p.l3_bytes, 256.0 * (1 << 20), 1024.0 * (1 << 20));
  const size_t n = static_cast<size_t>(want / sizeof(float));
  {
    Tensor a = Tensor::Uninitialized(DataType::kFloat, {static_cast<int64_t>(n)});  // huge pages, as the weights
    std::fill(a.data<float>(), a.data<float>() + n, 1.0f);
    const double read = ReadBandwidthGbs(a, repeats);
    a = Tensor();
    std::vector<float> src(n / 2, 1.0f), dst(n / 2, 0.0f);
    const double copy = CopyBandwidthGbs(src, dst, repeats);
    p.bandwidth_gbs = copy;
    p.measurements["read_bandwidth_gbs"] = read;
    p.measurements["copy_bandwidth_gbs"] = copy;
    p.measurements["bandwidth_array_bytes"] = want;
    fmt::print("  memory: read {:.1f} GB/s, copy {:.1f} GB/s (read + write bytes) over {:.0f} MiB\n", read, copy,
               want / (1 << 20));
  }
  const double fma = FmaGflops(threads, repeats);
  const double matmul = MatMulGflops(threads, repeats);
  p.peak_gflops = matmul;
  p.measurements["fma_gflops"] = fma;
  p.measurements["matmul_1024_gflops"] = matmul;
  fmt::print("  float32: FMA kernel {:.1f} GFLOPS, MatMul 1024^3 {:.1f} GFLOPS (used as peak)\n", fma, matmul);
  const double overhead = DispatchOverheadUs(threads, repeats);
  p.kernel_overhead_us = overhead;
  p.measurements["dispatch_overhead_us"] = overhead;
  fmt::print("  dispatch overhead: {:.2f} us per operator (256 Relu nodes on one element)\n", overhead);
  p.source = fmt::format("measured by autofusion calibrate on {}, {}", cpu, Today());
  p.Save(out);
  fmt::print("wrote {}\n", out);
}

}  // namespace

void AddCalibrateCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("calibrate", "Measure this CPU (bandwidth, compute, caches, dispatch) and write its hardware profile");
  auto out = std::make_shared<std::string>();
  auto threads = std::make_shared<int>(0);
  auto repeats = std::make_shared<int>(7);
  cmd->add_option("-o,--output", *out, "Profile file to write (default: <profiles dir>/host-cpu.json)");
  cmd->add_option("--threads", *threads, "Threads to measure with (default: all cores)");
  cmd->add_option("--repeats", *repeats, "Repeats per measurement; the median is kept (default 7)");
  cmd->callback([=] { RunCalibrate(*out, *threads, *repeats); });
}

}  // namespace gaf::cli
