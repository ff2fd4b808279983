#include "cli/inputs.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "ir/error.h"
#include "models/generate.h"
#include "onnx_io/npy.h"
#include "onnx_io/onnx_io.h"

namespace gaf::cli {
namespace fs = std::filesystem;

namespace {

std::vector<std::string> InputNames(const Model& model) {
  std::vector<std::string> names;
  for (const ValueInfo& v : model.graph.inputs)
    if (model.graph.FindInitializer(v.name) == nullptr) names.push_back(v.name);
  return names;
}

std::string Joined(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// The given tensor's dtype and rank (and known dims) against the model's declaration.
void CheckAgainstModel(const Model& model, const std::string& spec, const std::string& name, const Tensor& t) {
  const ValueInfo* v = model.graph.FindValueInfo(name);
  if (v == nullptr) return;
  GAF_CHECK(v->dtype == DataType::kUndefined || t.dtype() == v->dtype,
            "-i {}: input '{}' expects {} but the file holds {}", spec, name, DataTypeName(v->dtype),
            DataTypeName(t.dtype()));
  if (!v->has_shape) return;
  bool ok = t.rank() == static_cast<int64_t>(v->dims.size());
  for (size_t i = 0; ok && i < v->dims.size(); ++i) ok = !v->dims[i].known() || v->dims[i].value == t.shape()[i];
  GAF_CHECK(ok, "-i {}: input '{}' expects shape {} but the file holds {}", spec, name, DimsToString(v->dims),
            ShapeToString(t.shape()));
}

}  // namespace

std::vector<Feeds> ParseInputSpecs(const Model& model, const std::vector<std::string>& specs, bool allow_random) {
  const std::vector<std::string> names = InputNames(model);
  Feeds named;                  // NAME=FILE values
  std::vector<Feeds> folders;   // one per DIR
  std::vector<std::string> folder_specs;
  for (const std::string& s : specs) {
    const size_t eq = s.find('=');
    if (eq == std::string::npos) {
      // A test_data_set_N folder (anything without '=' is taken for one).
      GAF_CHECK(fs::is_directory(s), "-i {}: expected NAME=FILE.npy|FILE.pb or a test_data_set_N folder ({})", s,
                fs::exists(s) ? "not a folder" : "no such folder");
      std::vector<std::pair<std::string, Tensor>> loaded;
      try {
        loaded = LoadTestDataSet(s, names);
      } catch (const UnsupportedError&) {
        throw;
      } catch (const Error& e) {
        const std::string msg = e.what();
        throw Error(msg.rfind(s, 0) == 0 ? "-i " + msg : fmt::format("-i {}: {}", s, msg));
      }
      for (const auto& [n, t] : loaded) CheckAgainstModel(model, s, n, t);
      folders.emplace_back(loaded.begin(), loaded.end());
      folder_specs.push_back(s);
      continue;
    }
    const std::string name = s.substr(0, eq), file = s.substr(eq + 1);
    GAF_CHECK(eq > 0 && !file.empty(), "-i '{}': expected NAME=FILE.npy|FILE.pb", s);
    GAF_CHECK(std::find(names.begin(), names.end(), name) != names.end(),
              "-i {}: the model has no input '{}' (its inputs: {})", s, name, Joined(names));
    GAF_CHECK(!named.count(name), "-i {}: input '{}' is given twice", s, name);
    if (allow_random && file == "random") continue;
    try {
      named[name] = LoadTensorFile(file);
    } catch (const UnsupportedError&) {
      throw;
    } catch (const Error& e) {
      const std::string msg = e.what();
      throw Error(msg.find(file) != std::string::npos ? fmt::format("-i {}: {}", name, msg)
                                                      : fmt::format("-i {}: {}: {}", name, file, msg));
    }
    CheckAgainstModel(model, s, name, named[name]);
  }
  std::vector<Feeds> samples;
  if (folders.empty()) {
    if (!named.empty()) samples.push_back(named);
    return samples;
  }
  for (Feeds& f : folders) {
    for (const auto& [n, t] : named) f[n] = t;
    samples.push_back(std::move(f));
  }
  return samples;
}

Workload LoadWorkload(const Model& model, const std::vector<std::string>& specs,
                      const std::map<std::string, int64_t>& dims, uint32_t seed, bool allow_random) {
  Workload w;
  const std::vector<Feeds> given = ParseInputSpecs(model, specs, allow_random);
  for (size_t i = 0; i < given.size(); ++i) {
    try {
      w.samples.push_back(CompleteFeeds(model, given[i], dims, seed));
    } catch (const UnsupportedError&) {
      throw;
    } catch (const Error& e) {
      throw Error(given.size() == 1 ? fmt::format("-i: {}", e.what())
                                    : fmt::format("-i (sample {} of {}): {}", i + 1, given.size(), e.what()));
    }
  }
  if (!w.samples.empty()) w.source = fmt::format("inputs given with -i: {} sample(s)", w.samples.size());
  return w;
}

bool IsDecoder(const Model& m) {
  std::vector<ValueInfo> inputs;
  for (const ValueInfo& v : m.graph.inputs)
    if (m.graph.FindInitializer(v.name) == nullptr) inputs.push_back(v);
  try {
    DecoderSignature::Discover(inputs, m.graph.outputs);
    return true;
  } catch (const Error&) {
    return false;
  }
}

Workload DecoderWorkload(const Model& model) {
  constexpr int kPromptLength = 8, kDecodeSteps = 3;
  return IsDecoder(model) ? DecoderTraceWorkload(model, kPromptLength, kDecodeSteps, 0) : Workload{};
}

}  // namespace gaf::cli
