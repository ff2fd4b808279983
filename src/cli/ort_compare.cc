#include "cli/ort_compare.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/subprocess.h"
#include "onnx_io/npy.h"

namespace gaf::cli {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// `name` in a folder of $PATH ("" when absent).
std::string FindInPath(const std::string& name) {
  std::stringstream path(EnvOr("PATH", "/usr/local/bin:/usr/bin:/bin"));
  std::string d;
  std::error_code ec;
  while (std::getline(path, d, ':'))
    if (!d.empty() && fs::is_regular_file(fs::path(d) / name, ec)) return (fs::path(d) / name).string();
  return "";
}

// Runs a script; its stdout, or false with *why (the script's last stderr line).
bool RunScript(const std::vector<std::string>& argv, std::string* out, std::string* why) {
  TempDir tmp("gaf_ort");
  const std::string so = (fs::path(tmp.path) / "stdout").string(), se = (fs::path(tmp.path) / "stderr").string();
  const int rc = RunProgram(argv, so, se, why);
  if (rc == -1) return false;
  if (rc != 0) {
    *why = LastLine(ReadSmallFile(se, 64 << 10));
    if (why->empty()) *why = fmt::format("{} exited with status {}", argv[1], rc);
    return false;
  }
  *out = ReadSmallFile(so, 1 << 20);
  return true;
}

}  // namespace

OrtComparison::OrtComparison(int threads) : threads_(threads) {
  dir_ = EnvOr("GAF_BENCH_DIR", GAF_BENCH_DIR);
  std::error_code ec;
  const fs::path pkg = fs::path(dir_) / "node_modules" / "onnxruntime-node" / "package.json";
  const std::string node = FindInPath("node");
  if (node.empty()) {
    why_ = "node is not installed (apt-get install nodejs npm)";
    return;
  }
  if (!fs::is_regular_file(fs::path(dir_) / "ort_generate.js", ec) || !fs::is_regular_file(pkg, ec)) {
    why_ = fmt::format("no onnxruntime-node in {} (cd {} && ONNXRUNTIME_NODE_INSTALL=skip npm ci; GAF_BENCH_DIR names "
                       "another bench folder)",
                       (fs::path(dir_) / "node_modules").string(), dir_);
    return;
  }
  try {
    version_ = json::parse(ReadSmallFile(pkg.string(), 1 << 16)).value("version", "");
  } catch (const json::exception&) {
  }
  node_ = node;
}

bool OrtComparison::TimeDecode(const std::string& model, const std::vector<int64_t>& prompt, int tokens,
                               double* seconds, std::vector<int64_t>* out, std::string* why) const {
  std::string ids;
  for (int64_t t : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  std::string text;
  if (!RunScript({node_, (fs::path(dir_) / "ort_generate.js").string(), PathArg(model), "--prompt-ids", ids,
                  "--max-new-tokens", std::to_string(tokens), "--threads", std::to_string(threads_), "--opt", "all",
                  "--repeat", "2"},
                 &text, why))
    return false;
  try {
    const json j = json::parse(text);
    *seconds = j.at("decode_ms_per_token").get<double>() / 1e3;
    *out = j.at("tokens").get<std::vector<int64_t>>();
  } catch (const json::exception& e) {
    *why = fmt::format("ort_generate.js printed no result ({})", e.what());
    return false;
  }
  return true;
}

bool OrtComparison::TimeRuns(const std::string& model, const std::vector<Feeds>& samples, int repeat,
                             double* seconds, std::string* why) const {
  *seconds = 0;
  for (const Feeds& feeds : samples) {
    TempDir tmp("gaf_ort_in");
    std::vector<std::string> argv = {node_, (fs::path(dir_) / "ort_run.js").string(), PathArg(model)};
    int i = 0;
    for (const auto& [name, t] : feeds) {
      const std::string file = (fs::path(tmp.path) / fmt::format("input_{}.npy", i++)).string();
      SaveNpy(t, file);
      argv.push_back("-i");
      argv.push_back(name + "=" + file);
    }
    for (const std::string& a : {std::string("-o"), (fs::path(tmp.path) / "out").string(), std::string("--opt"),
                                 std::string("all"), std::string("--threads"), std::to_string(threads_),
                                 std::string("--repeat"), std::to_string(repeat)})
      argv.push_back(a);
    std::string text;
    if (!RunScript(argv, &text, why)) return false;
    const size_t at = text.find("ort median ms: ");
    if (at == std::string::npos) {
      *why = "ort_run.js printed no time";
      return false;
    }
    try {
      *seconds += std::stod(text.substr(at + 15)) / 1e3;
    } catch (const std::exception&) {
      *why = "ort_run.js printed no time";
      return false;
    }
  }
  return true;
}

}  // namespace gaf::cli
