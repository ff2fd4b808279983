#include "codegen/gate_cache.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "codegen/compiler.h"
#include "onnx_io/onnx_io.h"

namespace gaf {

namespace fs = std::filesystem;

GateCache::GateCache(const std::string& cache_root, bool enabled) : enabled_(enabled && !cache_root.empty()) {
  if (enabled_) dir_ = (fs::path(cache_root) / KernelCompiler::TargetName() / "gates").string();
}

std::string GateCache::PathOf(const std::string& key) const {
  return (fs::path(dir_) / fmt::format("{:016x}.json", StableHash(key))).string();
}

std::optional<nlohmann::json> GateCache::Get(const std::string& key) const {
  if (!enabled_) return std::nullopt;
  const std::string path = PathOf(key);
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid() ||
      (st.st_mode & (S_IWGRP | S_IWOTH)) != 0 || st.st_size > (64 << 10))
    return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    nlohmann::json j = nlohmann::json::parse(ss.str());
    // The full key is stored: a hash collision or a file copied in from elsewhere is not a hit.
    if (!j.is_object() || !j.contains("key") || j["key"] != key) return std::nullopt;
    return j;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

void GateCache::Put(const std::string& key, nlohmann::json value) const {
  if (!enabled_) return;
  try {
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec) return;
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::replace, ec);
    value["key"] = key;
    const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    char when[32];
    std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    value["measured_at"] = when;
    WriteFileAtomic(PathOf(key), value.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  } catch (const std::exception&) {
    // A verdict that cannot be stored is measured again next time.
  }
}

}  // namespace gaf
