// Runs the ONNX backend conformance tests (Debian's libonnx-testdata) on our runtime and compares
// outputs with the stored references.
//
//   gaf_conformance --data /usr/share/libonnx-testdata/data [--filter SUBSTR] [--verbose]
//                   [--min-node-pass N] [--min-converted-pass N]
//
// An operator or type we do not implement is a skip (its reason is printed); a wrong answer, a
// crash-free error or a shape mismatch on a test whose operators we claim is a failure. Exit status
// is non-zero when anything failed or a floor (--min-*) is not met.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "onnx_io/onnx_io.h"
#include "runtime/session.h"

namespace fs = std::filesystem;
using namespace gaf;

namespace {

// ONNX 1.12's test data stores bfloat16 tensors with data type uint16; relabel them when the model
// declares bfloat16 (the bits are the same).
Tensor RelabelBFloat16(const Tensor& t, DataType declared) {
  if (declared != DataType::kBFloat16 || t.dtype() != DataType::kUint16) return t;
  Tensor r(DataType::kBFloat16, t.shape());
  std::memcpy(r.raw(), t.raw(), t.nbytes());
  return r;
}

enum class Outcome { kPass, kFail, kSkip };

struct Result {
  Outcome outcome;
  std::string reason;
};

std::string CompareTensors(const Tensor& got, const Tensor& want, const std::string& name) {
  if (got.shape() != want.shape())
    return fmt::format("output '{}': shape {} != expected {}", name, ShapeToString(got.shape()),
                       ShapeToString(want.shape()));
  if (want.dtype() == DataType::kString) {
    if (got.dtype() != DataType::kString) return fmt::format("output '{}': type mismatch", name);
    for (int64_t i = 0; i < want.numel(); ++i)
      if (got.data<std::string>()[i] != want.data<std::string>()[i])
        return fmt::format("output '{}': string {} differs", name, i);
    return "";
  }
  if (got.dtype() != want.dtype())
    return fmt::format("output '{}': type {} != expected {}", name, DataTypeName(got.dtype()),
                       DataTypeName(want.dtype()));
  std::vector<double> g = got.ToDoubles(), w = want.ToDoubles();
  double rtol = 1e-3, atol = 1e-5;
  if (IsHalf(want.dtype())) {
    rtol = 1e-2;
    atol = 1e-3;
  }
  bool exact = !IsFloatingPoint(want.dtype());
  for (size_t i = 0; i < w.size(); ++i) {
    if (std::isnan(w[i]) && std::isnan(g[i])) continue;
    if (std::isinf(w[i]) && g[i] == w[i]) continue;
    double diff = std::fabs(g[i] - w[i]);
    bool ok = exact ? diff == 0 : diff <= atol + rtol * std::fabs(w[i]);
    if (!ok)
      return fmt::format("output '{}': element {} is {} but expected {} (|diff| {:.3g})", name, i, g[i], w[i], diff);
  }
  return "";
}

Result RunTest(const fs::path& dir) {
  fs::path model_path = dir / "model.onnx";
  Model model;
  try {
    model = LoadModel(model_path.string());
  } catch (const UnsupportedError& e) {
    return {Outcome::kSkip, e.what()};
  } catch (const Error& e) {
    return {Outcome::kFail, std::string("load: ") + e.what()};
  }
  for (const auto* list : {&model.graph.inputs, &model.graph.outputs})
    for (const ValueInfo& v : *list)
      if (!v.non_tensor_type.empty())
        return {Outcome::kSkip, fmt::format("{} value '{}' (non-tensor types not supported)", v.non_tensor_type, v.name)};
  for (const ValueInfo& v : model.graph.outputs)
    if (v.dtype == DataType::kString) return {Outcome::kSkip, "string tensors not supported"};
  // Operators whose outputs are random draws cannot be compared with stored values: their tests
  // check the outputs' shapes and types only and are counted as skips.
  std::string random_op;
  for (const Node& n : model.graph.nodes)
    for (const char* op : {"RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike", "Bernoulli",
                           "Multinomial"})
      if (n.op_type == op) random_op = op;
  std::unique_ptr<Session> session;
  try {
    session = std::make_unique<Session>(model, SessionOptions{});
  } catch (const UnsupportedError& e) {
    return {Outcome::kSkip, e.what()};
  } catch (const Error& e) {
    return {Outcome::kFail, std::string("prepare: ") + e.what()};
  }
  std::vector<fs::path> sets;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory() && e.path().filename().string().rfind("test_data_set_", 0) == 0) sets.push_back(e.path());
  std::sort(sets.begin(), sets.end());
  if (sets.empty()) return {Outcome::kSkip, "no test data sets"};
  for (const fs::path& set : sets) {
    std::map<std::string, Tensor> feeds;
    const auto& ins = session->inputs();
    try {
      for (size_t i = 0;; ++i) {
        fs::path p = set / fmt::format("input_{}.pb", i);
        if (!fs::exists(p)) break;
        GAF_CHECK(i < ins.size(), "more input files than model inputs");
        Tensor t = RelabelBFloat16(LoadTensorPb(p.string()), ins[i].dtype);
        if (ins[i].has_shape) {
          bool fits = t.rank() == static_cast<int64_t>(ins[i].dims.size());
          for (size_t d = 0; fits && d < ins[i].dims.size(); ++d)
            fits = !ins[i].dims[d].known() || ins[i].dims[d].value == t.shape()[d];
          if (!fits)
            return {Outcome::kSkip, fmt::format("test data for input '{}' has shape {}, the model declares {}",
                                                ins[i].name, ShapeToString(t.shape()), DimsToString(ins[i].dims))};
        }
        feeds[ins[i].name] = t;
      }
    } catch (const UnsupportedError& e) {
      return {Outcome::kSkip, e.what()};
    } catch (const Error& e) {
      return {Outcome::kSkip, std::string("input data: ") + e.what()};
    }
    std::vector<Tensor> outs;
    try {
      outs = session->Run(feeds);
    } catch (const UnsupportedError& e) {
      return {Outcome::kSkip, e.what()};
    } catch (const Error& e) {
      return {Outcome::kFail, std::string("run: ") + e.what()};
    } catch (const std::exception& e) {
      return {Outcome::kFail, std::string("run (unexpected exception): ") + e.what()};
    }
    for (size_t i = 0; i < outs.size(); ++i) {
      fs::path p = set / fmt::format("output_{}.pb", i);
      if (!fs::exists(p)) continue;
      Tensor want;
      try {
        want = RelabelBFloat16(LoadTensorPb(p.string()), session->outputs()[i].dtype);
      } catch (const Error& e) {
        return {Outcome::kSkip, std::string("reference data: ") + e.what()};
      }
      if (!random_op.empty()) {
        if (outs[i].shape() != want.shape() || outs[i].dtype() != want.dtype())
          return {Outcome::kFail, fmt::format("output '{}': {}{} != expected {}{}", session->outputs()[i].name,
                                              DataTypeName(outs[i].dtype()), ShapeToString(outs[i].shape()),
                                              DataTypeName(want.dtype()), ShapeToString(want.shape()))};
        continue;
      }
      std::string diff = CompareTensors(outs[i], want, session->outputs()[i].name);
      if (!diff.empty()) return {Outcome::kFail, set.filename().string() + ": " + diff};
    }
  }
  if (!random_op.empty())
    return {Outcome::kSkip, fmt::format("random operator {}: values not comparable (shape and type checked)", random_op)};
  return {Outcome::kPass, ""};
}

// Short form of a skip reason for the histogram: the op or type it names.
std::string SkipKey(const std::string& reason) {
  auto p = reason.find("unsupported operator ");
  if (p != std::string::npos) {
    auto e = reason.find(' ', p + 21);
    return "unsupported operator " + reason.substr(p + 21, e == std::string::npos ? std::string::npos : e - p - 21);
  }
  return reason.substr(0, 90);
}

}  // namespace

int main(int argc, char** argv) {
  std::string data = "/usr/share/libonnx-testdata/data", filter;
  bool verbose = false;
  int min_node = 0, min_converted = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "missing value for %s\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--data") data = next();
    else if (a == "--filter") filter = next();
    else if (a == "--verbose") verbose = true;
    else if (a == "--min-node-pass") min_node = std::stoi(next());
    else if (a == "--min-converted-pass") min_converted = std::stoi(next());
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (!fs::exists(data)) {
    std::fprintf(stderr, "%s: test data not found (apt-get install libonnx-testdata)\n", data.c_str());
    return 2;
  }
  omp_set_num_threads(std::min(2, omp_get_num_procs()));
  const std::vector<std::string> suites = {"node", "pytorch-converted", "pytorch-operator", "simple"};
  int total_pass = 0, total_fail = 0, total_skip = 0;
  std::map<std::string, std::array<int, 3>> per_suite;
  std::map<std::string, int> skip_hist;
  std::vector<std::string> failures;
  auto start = std::chrono::steady_clock::now();
  for (const std::string& suite : suites) {
    fs::path sdir = fs::path(data) / suite;
    if (!fs::exists(sdir)) continue;
    std::vector<fs::path> tests;
    for (const auto& e : fs::directory_iterator(sdir))
      if (e.is_directory()) tests.push_back(e.path());
    std::sort(tests.begin(), tests.end());
    auto& counts = per_suite[suite];
    counts = {0, 0, 0};
    for (const fs::path& t : tests) {
      std::string name = t.filename().string();
      if (!filter.empty() && name.find(filter) == std::string::npos) continue;
      Result r = RunTest(t);
      const char* tag = r.outcome == Outcome::kPass ? "PASS" : r.outcome == Outcome::kFail ? "FAIL" : "SKIP";
      if (r.outcome == Outcome::kPass) {
        counts[0]++;
        total_pass++;
      } else if (r.outcome == Outcome::kFail) {
        counts[1]++;
        total_fail++;
        failures.push_back(suite + "/" + name + ": " + r.reason);
      } else {
        counts[2]++;
        total_skip++;
        skip_hist[SkipKey(r.reason)]++;
      }
      if (verbose || r.outcome != Outcome::kPass || !filter.empty())
        std::printf("%s %s/%s%s%s\n", tag, suite.c_str(), name.c_str(), r.reason.empty() ? "" : ": ",
                    r.reason.c_str());
      std::fflush(stdout);
    }
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("\n== skip reasons ==\n");
  std::vector<std::pair<int, std::string>> hist;
  for (const auto& [k, v] : skip_hist) hist.emplace_back(v, k);
  std::sort(hist.rbegin(), hist.rend());
  for (const auto& [v, k] : hist) std::printf("%5d  %s\n", v, k.c_str());
  std::printf("\n== per suite ==\n");
  for (const auto& [s, c] : per_suite)
    std::printf("%-18s %d passed, %d failed, %d skipped\n", s.c_str(), c[0], c[1], c[2]);
  if (!failures.empty()) {
    std::printf("\n== failures ==\n");
    for (const auto& f : failures) std::printf("%s\n", f.c_str());
  }
  std::printf("\nconformance (%.1f s): %d passed, %d failed, %d skipped\n", secs, total_pass, total_fail, total_skip);
  int rc = total_fail > 0 ? 1 : 0;
  if (filter.empty()) {
    if (per_suite["node"][0] < min_node) {
      std::printf("FLOOR NOT MET: %d node tests passed, at least %d required\n", per_suite["node"][0], min_node);
      rc = 1;
    }
    if (per_suite["pytorch-converted"][0] < min_converted) {
      std::printf("FLOOR NOT MET: %d pytorch-converted tests passed, at least %d required\n",
                  per_suite["pytorch-converted"][0], min_converted);
      rc = 1;
    }
  }
  return rc;
}
