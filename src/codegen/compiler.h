// Batch compilation of generated kernels: every kernel of a model is one source file; all compile
// in one parallel ninja build into one shared library, which is loaded with dlopen. The build
// folder is named by a hash of the sources, the flags, the compiler and the target CPU, so a
// second run with the same kernels compiles nothing. A kernel that fails to compile is reported
// with the compiler's message and left out of the library; the others still load.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace gaf {

struct KernelSource {
  std::string symbol;  // extern "C" entry point, unique within a batch
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
  // cache_root: default $GAF_KERNEL_CACHE, else $HOME/.cache/graph-autofusion/kernels.
  explicit KernelCompiler(std::string cache_root = "");
  // A target name such as "x86_64-znver4" (from the compiler's -march=native resolution).
  static std::string TargetName();
  static std::string CompilerFlags();
  // Compiles all kernels (or reuses the cached build) and loads the library.
  std::shared_ptr<KernelLibrary> Compile(const std::vector<KernelSource>& kernels);

 private:
  std::string cache_root_;
};

}  // namespace gaf
