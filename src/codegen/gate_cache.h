// Speed verdicts of the safe-fusion gates, kept per machine target beside the kernel cache, so
// that `fuse --safe` run again on the same model and inputs keeps the same groups instead of
// re-deciding near-break-even groups by the noise of the moment (as autotuners keep their tuning
// logs). Only speed is cached: precision is always measured. An entry is keyed by everything the
// measurement depended on (the target, the thread count, the gate's settings, the kernel's
// generated sources and library stages, the reference operators and the input types and shapes
// of every workload run); `--remeasure` ignores and replaces the entries.
//
// Files: <kernel cache root>/<target>/gates/<key hash>.json, written atomically. An entry that is
// not a regular file owned by this user and writable only by it, is over 64 KiB or does not parse
// is ignored (and measured again).
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace gaf {

class GateCache {
 public:
  // cache_root: the kernel cache root (KernelCompiler::cache_root()); disabled: Get finds nothing,
  // Put stores nothing.
  GateCache(const std::string& cache_root, bool enabled);
  std::optional<nlohmann::json> Get(const std::string& key) const;
  void Put(const std::string& key, nlohmann::json value) const;  // best effort: errors are ignored

 private:
  std::string PathOf(const std::string& key) const;
  std::string dir_;
  bool enabled_ = false;
};

}  // namespace gaf
