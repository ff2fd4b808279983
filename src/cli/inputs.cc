#include "cli/inputs.h"

#include <fmt/format.h>


#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/subprocess.h"
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

// ---- TorchScript files: recognized by their zip layout, exported to ONNX by torch_io.py

#ifndef GAF_TORCH_IO_SCRIPT
#define GAF_TORCH_IO_SCRIPT "python/graph_autofusion/torch_io.py"
#endif

uint32_t Le32(const unsigned char* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}
uint16_t Le16(const unsigned char* p) { return uint16_t(p[0] | p[1] << 8); }

bool IsTorchScriptEntry(const std::string& name) {
  const size_t slash = name.find('/');
  if (slash == std::string::npos || slash == 0) return false;
  const std::string rest = name.substr(slash + 1);
  if (rest.rfind("code/", 0) == 0 && rest.size() > 5) return true;
  const size_t last = name.rfind('/');
  const std::string base = name.substr(last + 1);
  return base == "constants.pkl" || base == "data.pkl";
}

// 1: a TorchScript entry found; 0: the central directory was read and has none; -1: unreadable.
int ScanZipCentralDirectory(std::ifstream& f, uint64_t size) {
  constexpr uint64_t kEocd = 22, kMaxComment = 65535, kMaxDirectory = 64ull << 20;
  if (size < kEocd) return -1;
  const uint64_t tail = std::min<uint64_t>(size, kEocd + kMaxComment);
  std::string buf(tail, '\0');
  f.seekg(static_cast<std::streamoff>(size - tail));
  if (!f.read(buf.data(), static_cast<std::streamsize>(tail))) return -1;
  const auto* b = reinterpret_cast<const unsigned char*>(buf.data());
  int64_t at = -1;
  for (int64_t i = static_cast<int64_t>(tail - kEocd); i >= 0; --i)
    if (b[i] == 'P' && b[i + 1] == 'K' && b[i + 2] == 5 && b[i + 3] == 6) {
      at = i;
      break;
    }
  if (at < 0) return -1;
  const uint64_t entries = Le16(b + at + 10), dir_size = Le32(b + at + 12), dir_offset = Le32(b + at + 16);
  // ZIP64 (0xFFFF.. fields) or a directory out of bounds: not read here.
  if (entries == 0xFFFF || dir_size == 0xFFFFFFFFu || dir_offset == 0xFFFFFFFFu) return -1;
  if (dir_size > kMaxDirectory || dir_offset + dir_size > size) return -1;
  std::string dir(dir_size, '\0');
  f.seekg(static_cast<std::streamoff>(dir_offset));
  if (!f.read(dir.data(), static_cast<std::streamsize>(dir_size))) return -1;
  const auto* d = reinterpret_cast<const unsigned char*>(dir.data());
  uint64_t pos = 0;
  for (uint64_t e = 0; e < entries; ++e) {
    if (pos + 46 > dir_size || Le32(d + pos) != 0x02014b50u) return -1;
    const uint64_t name_len = Le16(d + pos + 28), extra = Le16(d + pos + 30), comment = Le16(d + pos + 32);
    if (pos + 46 + name_len > dir_size) return -1;
    if (IsTorchScriptEntry(std::string(dir.data() + pos + 46, name_len))) return 1;
    pos += 46 + name_len + extra + comment;
  }
  return 0;
}

Model LoadTorchScript(const std::string& path, const std::vector<std::string>& input_specs) {
  GAF_CHECK(!input_specs.empty(),
            "{} is a TorchScript file: give sample inputs (-i NAME=FILE.npy) so it can be exported to ONNX", path);
  std::vector<std::string> inputs;
  for (const std::string& s : input_specs) {
    const size_t eq = s.find('=');
    std::error_code ec;
    if (eq == std::string::npos) {
      GAF_CHECK(!fs::is_directory(s, ec),
                "-i {}: a test_data_set folder is not supported for a TorchScript model ({}); give NAME=FILE.npy", s,
                path);
      GAF_CHECK(fs::is_regular_file(s, ec), "-i {}: no such file", s);
    } else {
      const std::string name = s.substr(0, eq), file = s.substr(eq + 1);
      GAF_CHECK(eq > 0 && !file.empty(), "-i '{}': expected NAME=FILE.npy|FILE.pb", s);
      GAF_CHECK(file != "random",
                "-i {}: a TorchScript model is exported with the inputs given, so '{}' needs a file (NAME=FILE.npy)", s,
                name);
    }
    inputs.push_back("--input=" + s);
  }
  const std::string python = EnvOr("GAF_PYTHON", "/usr/bin/python3");
  const std::string script = EnvOr("GAF_TORCH_IO_SCRIPT", GAF_TORCH_IO_SCRIPT);
  std::error_code ec;
  GAF_CHECK(fs::is_regular_file(script, ec),
            "{} is a TorchScript file: its converter {} is missing (set GAF_TORCH_IO_SCRIPT to torch_io.py)", path,
            script);
  TempDir tmp("gaf_torch");
  const std::string onnx_path = (fs::path(tmp.path) / "model.onnx").string();
  std::vector<std::string> argv = {python, script, "convert", PathArg(path), "-o", onnx_path};
  argv.insert(argv.end(), inputs.begin(), inputs.end());
  std::string why;
  const int rc = RunProgram(argv, (fs::path(tmp.path) / "stdout").string(), (fs::path(tmp.path) / "stderr").string(),
                            &why);
  if (rc == -1 && why.find("No such file") != std::string::npos)
    throw Error(fmt::format("{} is a TorchScript file: converting it needs Python 3 with PyTorch ({}; apt-get install "
                            "python3-torch)", path, why));
  GAF_CHECK(rc != -1, "{} is a TorchScript file: exporting it to ONNX failed: {}", path, why);
  GAF_CHECK(rc != 3, "{} is a TorchScript file: converting it needs PyTorch (apt-get install python3-torch)", path);
  if (rc != 0) {
    std::string line = LastLine(ReadSmallFile((fs::path(tmp.path) / "stderr").string(), 64 << 10));
    if (line.empty()) line = fmt::format("{} exited with status {}", script, rc);
    throw Error(line.rfind(path, 0) == 0 ? line : fmt::format("{}: exporting it to ONNX failed: {}", path, line));
  }
  GAF_CHECK(fs::is_regular_file(onnx_path, ec), "{}: the converter wrote no ONNX model", path);
  std::ifstream f(onnx_path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  GAF_CHECK(f.good() || f.eof(), "{}: cannot read the exported ONNX model", path);
  return ModelFromBytes(bytes, tmp.path, path + " (exported to ONNX)");
}

}  // namespace

bool IsTorchScriptFile(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  const uint64_t size = fs::file_size(path, ec);
  if (ec || size < 4) return false;
  std::ifstream f(path, std::ios::binary);
  std::array<char, 4> magic{};
  if (!f.read(magic.data(), 4) || std::memcmp(magic.data(), "PK\x03\x04", 4) != 0) return false;
  const int scan = ScanZipCentralDirectory(f, size);
  if (scan >= 0) return scan == 1;
  std::string ext = fs::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == ".pt" || ext == ".pth" || ext == ".ts" || ext == ".zip";
}

Model LoadModelArg(const std::string& path, const std::vector<std::string>& input_specs) {
  if (IsTorchScriptFile(path)) return LoadTorchScript(path, input_specs);
  return LoadModel(path);
}

std::vector<Feeds> ParseInputSpecs(const Model& model, const std::vector<std::string>& specs, bool allow_random) {
  const std::vector<std::string> names = InputNames(model);
  Feeds named;                  // NAME=FILE values
  std::vector<Feeds> folders;   // one per DIR
  std::vector<std::string> folder_specs;
  size_t next_position = 0;     // FILE values: the next input in the model's order
  for (const std::string& s : specs) {
    const size_t eq = s.find('=');
    std::error_code ec;
    if (eq == std::string::npos && fs::is_regular_file(s, ec)) {
      // A file by position: the next input not yet taken.
      while (next_position < names.size() && named.count(names[next_position])) ++next_position;
      GAF_CHECK(next_position < names.size(), "-i {}: more inputs given than the model has ({} input(s): {})", s,
                names.size(), Joined(names));
      const std::string& name = names[next_position++];
      try {
        named[name] = LoadTensorFile(s);
      } catch (const UnsupportedError&) {
        throw;
      } catch (const Error& e) {
        const std::string msg = e.what();
        throw Error(msg.find(s) != std::string::npos ? fmt::format("-i {}: {}", name, msg)
                                                     : fmt::format("-i {}: {}: {}", name, s, msg));
      }
      CheckAgainstModel(model, s, name, named[name]);
      continue;
    }
    if (eq == std::string::npos) {
      // A test_data_set_N folder.
      GAF_CHECK(fs::is_directory(s), "-i {}: expected NAME=FILE.npy|FILE.pb, FILE.npy|FILE.pb or a test_data_set_N "
                "folder ({})", s, fs::exists(s) ? "not a folder" : "no such file or folder");
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

HalfWeights ChooseHalfWeights(const Model& model, bool half_weights, bool float32_weights, bool reference_kernels,
                              bool quiet) {
  GAF_CHECK(!(half_weights && float32_weights), "--half-weights and --float32-weights exclude each other");
  const bool from_metadata = !half_weights && !float32_weights && ModelRequestsHalfWeights(model) && !reference_kernels;
  if (from_metadata && !quiet)
    fmt::print("float16 weight storage: on (the model's {} metadata, set by fuse --safe --half-weights after its "
               "precision gate; --float32-weights keeps float32)\n",
               kHalfWeightsMetadataKey);
  return half_weights || from_metadata ? HalfWeights::kAll : HalfWeights::kOff;
}

}  // namespace gaf::cli
