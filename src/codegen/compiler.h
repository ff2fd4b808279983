// Batch compilation of generated kernels: every kernel of a model is one source file; all compile
// in one parallel ninja build into one shared library, which is loaded with dlopen. The build
// folder is named by a hash of the sources, the flags, the compiler and the target CPU, so a
// second run with the same kernels compiles nothing. A kernel that fails to compile is reported
// with the compiler's message and left out of the library; the others still load.
//
// The cache is trusted only as far as it can be checked: every folder from the cache root down to
// the library, the library and its checksum file must be owned by the effective user and not
// writable by group or others (no symbolic links), else Compile throws gaf::Error naming the path.
// A library whose bytes do not match the checksum recorded after its build (a truncated or
// damaged file) is rebuilt, never loaded. Cache hits take no lock; a build takes the folder's
// lock, waiting at most $GAF_KERNEL_LOCK_TIMEOUT seconds (default 120), and renames the finished
// library into place, so a half-written library is never at the final path.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace gaf {

// FNV-1a, 64 bit: stable across runs and machines (std::hash is not).
uint64_t StableHash(const std::string& s, uint64_t h = 1469598103934665603ull);
// Whether `s` is a C identifier of at most 200 characters (symbols become file names too).
bool IsKernelSymbol(const std::string& s);

struct KernelSource {
  std::string symbol;  // extern "C" entry point, unique within a batch (IsKernelSymbol)
  std::string source;  // complete translation unit
};

class KernelLibrary {
 public:
  ~KernelLibrary();
  void* Find(const std::string& symbol) const;           // null when absent or failed; also finds
                                                         // other entry points of compiled sources
  const std::map<std::string, std::string>& errors() const { return errors_; }  // symbol -> compiler output
  const std::string& directory() const { return dir_; }
  bool from_cache() const { return from_cache_; }
  double compile_seconds() const { return compile_seconds_; }

 private:
  friend class KernelCompiler;
  void* handle_ = nullptr;
  std::string dir_;
  std::map<std::string, void*> symbols_;
  std::map<std::string, std::string> errors_;
  bool from_cache_ = false;
  double compile_seconds_ = 0;
};

class KernelCompiler {
 public:
  // cache_root: default $GAF_KERNEL_CACHE, else $HOME (or the user's home directory from the
  // password database) /.cache/graph-autofusion/kernels; gaf::Error when there is neither.
  explicit KernelCompiler(std::string cache_root = "");
  const std::string& cache_root() const { return cache_root_; }
  // A target name such as "x86_64-znver4" (from the compiler's -march=native resolution).
  static std::string TargetName();
  static std::string CompilerFlags();
  // Compiles all kernels (or reuses the cached build) and loads the library.
  std::shared_ptr<KernelLibrary> Compile(const std::vector<KernelSource>& kernels);

 private:
  std::string BuildFolder(const std::vector<KernelSource>& kernels) const;
  static bool LoadVerified(const std::vector<KernelSource>& kernels, KernelLibrary& lib);
  static bool Build(const std::vector<KernelSource>& kernels, KernelLibrary& lib);
  std::string cache_root_;
};

}  // namespace gaf
