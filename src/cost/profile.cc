// Hardware profiles: JSON files under profiles/ (format in docs/cost_model.md).
//
// Every field is checked on load; an error names the file and the field. Unknown fields are
// errors too, so a misspelled "bandwith_gbs" does not silently fall back to a default.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "cost/cost_model.h"
#include "ir/error.h"
#include "ir/output_file.h"

#ifndef GAF_PROFILES_DIR
#define GAF_PROFILES_DIR "profiles"
#endif

namespace gaf {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kKnownFields[] = {
    "name",       "description", "source",   "peak_gflops",        "peak_gflops_by_dtype",
    "bandwidth_gbs", "local_memory_bytes", "local_memory_note", "l1_bytes", "l2_bytes",
    "l3_bytes",   "kernel_overhead_us", "threads", "measurements",
};

double GetNumber(const json& j, const char* field, const std::string& origin, bool required,
                 double min_value, bool strictly_positive) {
  if (!j.contains(field)) {
    GAF_CHECK(!required, "hardware profile {}: missing required field '{}'", origin, field);
    return 0;
  }
  const json& v = j.at(field);
  GAF_CHECK(v.is_number(), "hardware profile {}: field '{}' must be a number, got {}", origin, field,
            v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  const double d = v.get<double>();
  if (strictly_positive) {
    GAF_CHECK(d > 0, "hardware profile {}: field '{}' must be positive, got {}", origin, field, d);
  } else {
    GAF_CHECK(d >= min_value, "hardware profile {}: field '{}' must be >= {}, got {}", origin, field,
              min_value, d);
  }
  return d;
}

std::string GetString(const json& j, const char* field, const std::string& origin, bool required) {
  if (!j.contains(field)) {
    GAF_CHECK(!required, "hardware profile {}: missing required field '{}'", origin, field);
    return "";
  }
  const json& v = j.at(field);
  GAF_CHECK(v.is_string(), "hardware profile {}: field '{}' must be a string, got {}", origin, field,
            v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  return v.get<std::string>();
}

std::map<std::string, double> GetNumberMap(const json& j, const char* field, const std::string& origin,
                                           bool positive) {
  std::map<std::string, double> out;
  if (!j.contains(field)) return out;
  const json& v = j.at(field);
  GAF_CHECK(v.is_object(), "hardware profile {}: field '{}' must be an object of numbers, got {}", origin,
            field, v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  for (const auto& [k, x] : v.items()) {
    GAF_CHECK(x.is_number(), "hardware profile {}: field '{}.{}' must be a number, got {}", origin, field, k,
              x.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    const double d = x.get<double>();
    GAF_CHECK(!positive || d > 0, "hardware profile {}: field '{}.{}' must be positive, got {}", origin,
              field, k, d);
    out[k] = d;
  }
  return out;
}

}  // namespace

double HardwareProfile::PeakGflopsFor(DataType dt) const {
  if (dt == DataType::kFloat || dt == DataType::kUndefined) return peak_gflops;
  auto it = peak_gflops_by_dtype.find(DataTypeName(dt));
  return it != peak_gflops_by_dtype.end() ? it->second : peak_gflops;
}

HardwareProfile HardwareProfile::Parse(const std::string& json_text, const std::string& origin) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::parse_error& e) {
    throw Error(fmt::format("hardware profile {}: not valid JSON ({})", origin, e.what()));
  }
  GAF_CHECK(j.is_object(), "hardware profile {}: the top level must be a JSON object", origin);
  const std::set<std::string> known(std::begin(kKnownFields), std::end(kKnownFields));
  for (const auto& [k, v] : j.items()) {
    GAF_CHECK(known.count(k) || k.rfind("_", 0) == 0 || k == "notes",
              "hardware profile {}: unknown field '{}' (fields: name, description, source, peak_gflops, "
              "peak_gflops_by_dtype, bandwidth_gbs, local_memory_bytes, local_memory_note, l1_bytes, "
              "l2_bytes, l3_bytes, kernel_overhead_us, threads, measurements)",
              origin, k);
  }
  HardwareProfile p;
  p.name = GetString(j, "name", origin, true);
  GAF_CHECK(!p.name.empty(), "hardware profile {}: field 'name' must not be empty", origin);
  p.description = GetString(j, "description", origin, false);
  p.source = GetString(j, "source", origin, true);
  p.peak_gflops = GetNumber(j, "peak_gflops", origin, true, 0, true);
  p.bandwidth_gbs = GetNumber(j, "bandwidth_gbs", origin, true, 0, true);
  p.local_memory_bytes = GetNumber(j, "local_memory_bytes", origin, true, 0, true);
  p.local_memory_note = GetString(j, "local_memory_note", origin, false);
  p.l1_bytes = GetNumber(j, "l1_bytes", origin, false, 0, false);
  p.l2_bytes = GetNumber(j, "l2_bytes", origin, false, 0, false);
  p.l3_bytes = GetNumber(j, "l3_bytes", origin, false, 0, false);
  p.kernel_overhead_us = GetNumber(j, "kernel_overhead_us", origin, true, 0, false);
  p.threads = static_cast<int>(GetNumber(j, "threads", origin, false, 0, false));
  p.peak_gflops_by_dtype = GetNumberMap(j, "peak_gflops_by_dtype", origin, true);
  p.measurements = GetNumberMap(j, "measurements", origin, false);
  return p;
}

std::string HardwareProfile::ToJson() const {
  json j = json::object();
  j["name"] = name;
  j["description"] = description;
  j["source"] = source;
  j["peak_gflops"] = peak_gflops;
  if (!peak_gflops_by_dtype.empty()) j["peak_gflops_by_dtype"] = peak_gflops_by_dtype;
  j["bandwidth_gbs"] = bandwidth_gbs;
  j["local_memory_bytes"] = local_memory_bytes;
  if (!local_memory_note.empty()) j["local_memory_note"] = local_memory_note;
  j["l1_bytes"] = l1_bytes;
  j["l2_bytes"] = l2_bytes;
  j["l3_bytes"] = l3_bytes;
  j["kernel_overhead_us"] = kernel_overhead_us;
  if (threads > 0) j["threads"] = threads;
  if (!measurements.empty()) j["measurements"] = measurements;
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

HardwareProfile HardwareProfile::Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  GAF_CHECK(in.good(), "hardware profile {}: cannot open the file", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return Parse(ss.str(), path);
}

void HardwareProfile::Save(const std::string& path) const {
  const fs::path p(path);
  if (p.has_parent_path()) {
    std::error_code ec;
    fs::create_directories(p.parent_path(), ec);
  }
  // Through a temporary file and a rename, so an interrupted save never leaves half a profile.
  CheckOutputPath(path, {}, true, "hardware profile");
  TempFile out(path);
  const std::string text = ToJson();
  out.Write(text.data(), text.size());
  out.Commit();
}

std::string HardwareProfile::ProfilesDir() {
  if (const char* env = std::getenv("GAF_PROFILES_DIR"); env != nullptr && *env != '\0') return env;
  return GAF_PROFILES_DIR;
}

std::vector<std::string> HardwareProfile::BuiltinNames() { return {"host-cpu", "ascend910", "h200"}; }

HardwareProfile HardwareProfile::HostDefaults() {
  HardwareProfile p;
  p.name = "host-cpu";
  p.description = "host CPU (conservative defaults)";
  p.source = "defaults, not measured: run autofusion calibrate";
  p.peak_gflops = 50;
  p.bandwidth_gbs = 10;
  p.l1_bytes = 32 * 1024;
  p.l2_bytes = 512 * 1024;
  p.l3_bytes = 8 * 1024 * 1024;
  // Cache sizes the OS reports are facts, not guesses: use them where available.
  if (long l1 = sysconf(_SC_LEVEL1_DCACHE_SIZE); l1 > 0) p.l1_bytes = static_cast<double>(l1);
  if (long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE); l2 > 0) p.l2_bytes = static_cast<double>(l2);
  if (long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE); l3 > 0) p.l3_bytes = static_cast<double>(l3);
  p.local_memory_bytes = p.l2_bytes;
  p.local_memory_note = "L2 cache per core (the working set of one thread's block)";
  p.kernel_overhead_us = 1;
  return p;
}

HardwareProfile HardwareProfile::Builtin(const std::string& name) {
  const std::string path = (fs::path(ProfilesDir()) / (name + ".json")).string();
  if (name == "host-cpu") {
    if (fs::exists(path)) return Load(path);
    return HostDefaults();
  }
  bool known = false;
  for (const std::string& n : BuiltinNames()) known |= (n == name);
  GAF_CHECK(known, "unknown hardware profile '{}': use host-cpu, ascend910, h200 or a path to a profile file",
            name);
  GAF_CHECK(fs::exists(path), "hardware profile '{}': file {} not found (set GAF_PROFILES_DIR to the "
            "folder holding the profiles)", name, path);
  return Load(path);
}

HardwareProfile HardwareProfile::Resolve(const std::string& name_or_path) {
  for (const std::string& n : BuiltinNames())
    if (n == name_or_path) return Builtin(n);
  const bool json_name = name_or_path.size() > 5 && name_or_path.compare(name_or_path.size() - 5, 5, ".json") == 0;
  if (name_or_path.find('/') != std::string::npos || json_name) {
    return Load(name_or_path);
  }
  return Builtin(name_or_path);  // error naming the known profiles
}

}  // namespace gaf
