#include "codegen/compiler.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <pwd.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "ir/error.h"

namespace gaf {
namespace fs = std::filesystem;

namespace {

constexpr const char* kLibraryName = "libgaf_kernels.so";
// Written after a successful build: "fnv1a64 <hash> <size>", then one line per symbol that failed.
constexpr const char* kManifestName = "libgaf_kernels.sum";
// Part of the cache key: folders of an older layout (no checksum file) are never reused.
constexpr const char* kCacheLayout = "gaf-kernel-cache 2";

std::string RunCommand(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) {
    *status = -1;
    return "cannot start: " + cmd;
  }
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  *status = ::pclose(p);
  return out;
}

// A path as one single-quoted shell word.
std::string ShellQuote(const fs::path& p) {
  std::string q = "'";
  for (char c : p.string()) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string ReadAll(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// False when `p` does not exist; throws unless it is a folder (or a regular file) itself, not a
// symbolic link, owned by the effective user and not writable by group or others.
bool CheckTrusted(const fs::path& p, bool folder) {
  struct stat st;
  if (::lstat(p.c_str(), &st) != 0) {
    if (errno == ENOENT) return false;
    throw Error(fmt::format("{}: kernel cache: cannot stat: {}", p.string(), std::strerror(errno)));
  }
  GAF_CHECK(!S_ISLNK(st.st_mode), "{}: kernel cache: is a symbolic link; refusing to use it", p.string());
  GAF_CHECK(folder ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode), "{}: kernel cache: not a {}", p.string(),
            folder ? "folder" : "regular file");
  GAF_CHECK(st.st_uid == ::geteuid(), "{}: kernel cache: owned by uid {}, not by the effective user (uid {}); refusing to use it",
            p.string(), st.st_uid, ::geteuid());
  GAF_CHECK((st.st_mode & (S_IWGRP | S_IWOTH)) == 0,
            "{}: kernel cache: writable by group or others (mode {:04o}); refusing to use it (chmod go-w, or set "
            "GAF_KERNEL_CACHE to a folder of your own)",
            p.string(), st.st_mode & 07777);
  return true;
}

bool Exists(const fs::path& p) {
  struct stat st;
  return ::lstat(p.c_str(), &st) == 0;
}

// Creates each missing folder on the way to `p` with mode 0700.
void MakeFolders(const fs::path& p) {
  fs::path cur;
  for (const fs::path& part : p) {
    cur /= part;
    if (Exists(cur) || ::mkdir(cur.c_str(), 0700) == 0 || errno == EEXIST) continue;
    throw Error(fmt::format("{}: cannot create the kernel cache folder: {} (set GAF_KERNEL_CACHE to a folder of your own)",
                            cur.string(), std::strerror(errno)));
  }
}

// Seconds to wait for another process's build: $GAF_KERNEL_LOCK_TIMEOUT, default 120.
double LockTimeoutSeconds() {
  const char* env = std::getenv("GAF_KERNEL_LOCK_TIMEOUT");
  if (env == nullptr || *env == '\0') return 120;
  char* end = nullptr;
  const double s = std::strtod(env, &end);
  GAF_CHECK(end != env && *end == '\0' && s >= 0, "GAF_KERNEL_LOCK_TIMEOUT={}: not a number of seconds", env);
  return s;
}

// The build lock of one cache folder, polled (LOCK_NB) until the timeout.
class BuildLock {
 public:
  BuildLock(const fs::path& p, double timeout_s) : fd_(::open(p.c_str(), O_CREAT | O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0600)) {
    GAF_CHECK(fd_ >= 0, "{}: cannot open the kernel build lock: {}", p.string(), std::strerror(errno));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err != EWOULDBLOCK && err != EINTR) Fail(p, std::strerror(err));
      if (std::chrono::steady_clock::now() >= deadline)
        Fail(p, fmt::format("held by another process for more than {} s (a build still running, or a stuck "
                            "process; raise GAF_KERNEL_LOCK_TIMEOUT to wait longer)", timeout_s));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ~BuildLock() {
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
  BuildLock(const BuildLock&) = delete;
  BuildLock& operator=(const BuildLock&) = delete;

 private:
  [[noreturn]] void Fail(const fs::path& p, const std::string& why) {
    ::close(fd_);
    throw Error(fmt::format("{}: kernel build lock: {}", p.string(), why));
  }
  int fd_;
};

std::string Manifest(const std::string& library_bytes, const std::map<std::string, std::string>& errors) {
  std::string m = fmt::format("fnv1a64 {:016x} {}\n", StableHash(library_bytes), library_bytes.size());
  for (const auto& [symbol, message] : errors) m += symbol + "\n";
  return m;
}

// Writes `bytes` to a temporary name beside `p` and renames it into place.
void WriteAtomically(const fs::path& p, const std::string& bytes) {
  const fs::path tmp = p.string() + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << bytes;
    GAF_CHECK(out.good(), "{}: cannot write", tmp.string());
  }
  std::error_code ec;
  fs::rename(tmp, p, ec);
  GAF_CHECK(!ec, "{}: cannot rename into place: {}", p.string(), ec.message());
}

}  // namespace

uint64_t StableHash(const std::string& s, uint64_t h) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

bool IsKernelSymbol(const std::string& s) {
  auto letter = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; };
  if (s.empty() || s.size() > 200 || !letter(s[0])) return false;
  for (char c : s)
    if (!letter(c) && !(c >= '0' && c <= '9')) return false;
  return true;
}

KernelLibrary::~KernelLibrary() {
  if (handle_ != nullptr) ::dlclose(handle_);
}

void* KernelLibrary::Find(const std::string& symbol) const {
  auto it = symbols_.find(symbol);
  if (it != symbols_.end()) return it->second;
  // Further entry points of a compiled source (a row kernel's <symbol>_tile): sources that failed
  // are not in the library, so dlsym finds nothing for them.
  if (handle_ == nullptr || errors_.count(symbol)) return nullptr;
  return ::dlsym(handle_, symbol.c_str());
}

// The cache root when none is given: never a shared folder such as /tmp.
static std::string DefaultCacheRoot() {
  if (const char* env = std::getenv("GAF_KERNEL_CACHE"); env != nullptr && *env != '\0') return env;
  std::string home;
  if (const char* env = std::getenv("HOME"); env != nullptr && *env != '\0') home = env;
  else if (const passwd* pw = ::getpwuid(::geteuid()); pw != nullptr && pw->pw_dir != nullptr) home = pw->pw_dir;
  GAF_CHECK(!home.empty(), "no folder for the kernel cache: $HOME is unset and uid {} has no home directory; set "
            "GAF_KERNEL_CACHE to a folder of your own", ::geteuid());
  return home + "/.cache/graph-autofusion/kernels";
}

KernelCompiler::KernelCompiler(std::string cache_root) : cache_root_(std::move(cache_root)) {
  if (cache_root_.empty()) cache_root_ = DefaultCacheRoot();
}

std::string KernelCompiler::CompilerFlags() { return "-O3 -march=native -fPIC -fopenmp -fno-math-errno -std=c++20"; }

std::string KernelCompiler::TargetName() {
  static const std::string name = [] {
    int st = 0;
    std::string out = RunCommand("c++ -march=native -Q --help=target 2>/dev/null | grep -m1 -E '^ +-march='", &st);
    std::string arch = "native";
    auto eq = out.find('=');
    if (st == 0 && eq != std::string::npos) {
      arch = out.substr(eq + 1);
      arch.erase(0, arch.find_first_not_of(" \t"));
      arch.erase(arch.find_last_not_of(" \t\n") + 1);
    }
    return "x86_64-" + arch;
  }();
  return name;
}

// The batch's folder, <root>/<target>/<hash of layout, flags, compiler, target and sources>: created
// (mode 0700) where missing, and checked from the root down.
std::string KernelCompiler::BuildFolder(const std::vector<KernelSource>& kernels) const {
  int st = 0;
  const std::string compiler_version = RunCommand("c++ --version | head -1", &st);
  uint64_t h = StableHash(std::string(kCacheLayout) + "\n" + CompilerFlags() + "\n" + compiler_version + "\n" + TargetName());
  for (const KernelSource& k : kernels) {
    GAF_CHECK(IsKernelSymbol(k.symbol), "kernel symbol '{}' is not a C identifier", k.symbol);
    h = StableHash(k.symbol + "\n" + k.source, h);
  }
  const fs::path root = fs::absolute(cache_root_).lexically_normal();
  const fs::path dir = root / TargetName() / fmt::format("{:016x}", h);
  for (const fs::path& p : {root, root / TargetName(), dir}) {
    MakeFolders(p);
    GAF_CHECK(CheckTrusted(p, true), "{}: kernel cache: the folder disappeared", p.string());
  }
  return dir.string();
}

// Loads the finished library of lib.dir_ when its bytes match the recorded checksum; false when
// there is none yet or it does not match (it is then rebuilt).
bool KernelCompiler::LoadVerified(const std::vector<KernelSource>& kernels, KernelLibrary& lib) {
  const fs::path dir = lib.dir_, so = dir / kLibraryName, sum = dir / kManifestName;
  if (!CheckTrusted(so, false) || !CheckTrusted(sum, false)) return false;
  std::istringstream manifest(ReadAll(sum));
  std::string line;
  std::getline(manifest, line);
  std::map<std::string, std::string> errors;
  for (std::string sym; std::getline(manifest, sym);) {
    if (!IsKernelSymbol(sym)) return false;  // a damaged checksum file: rebuilt
    errors[sym] = ReadAll(dir / (sym + ".o.log"));
  }
  if (line + "\n" != Manifest(ReadAll(so), {})) return false;
  lib.errors_ = std::move(errors);
  lib.handle_ = ::dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib.handle_ == nullptr) {
    const char* why = ::dlerror();
    throw Error(fmt::format("{}: cannot load: {}", so.string(), why != nullptr ? why : "unknown error"));
  }
  for (const KernelSource& k : kernels)
    if (!lib.errors_.count(k.symbol)) lib.symbols_[k.symbol] = ::dlsym(lib.handle_, k.symbol.c_str());
  return true;
}

// Builds every kernel in lib.dir_ (holding its lock): objects in one ninja run, linked to a
// temporary name, checksummed, renamed into place. False (no library) when every kernel failed.
bool KernelCompiler::Build(const std::vector<KernelSource>& kernels, KernelLibrary& lib) {
  const fs::path dir = lib.dir_;
  std::error_code ec;
  for (const char* stale : {kLibraryName, kManifestName}) fs::remove(dir / stale, ec);
  std::ostringstream ninja;
  ninja << "# Generated by graph-autofusion: one object per fused kernel, linked into one library.\n";
  ninja << "cxxflags = " << CompilerFlags() << "\n";
  ninja << "rule cxx\n  command = c++ $cxxflags -c $in -o $out > $out.log 2>&1 || (cat $out.log; exit 1)\n"
           "  description = CXX $out\n";
  for (const KernelSource& k : kernels) {
    fs::remove(dir / (k.symbol + ".o"), ec);  // a damaged library's objects are not trusted either
    std::ofstream(dir / (k.symbol + ".cc"), std::ios::binary) << k.source;
    ninja << "build " << k.symbol << ".o: cxx " << k.symbol << ".cc\n";
  }
  std::ofstream(dir / "build.ninja") << ninja.str();
  const unsigned jobs = std::max(1u, std::thread::hardware_concurrency());
  int st = 0;
  RunCommand(fmt::format("ninja -C {} -k 0 -j {} > {} 2>&1", ShellQuote(dir), jobs, ShellQuote(dir / "ninja.log")), &st);
  std::string objects;
  for (const KernelSource& k : kernels) {
    if (Exists(dir / (k.symbol + ".o"))) objects += " " + k.symbol + ".o";
    else lib.errors_[k.symbol] = ReadAll(dir / (k.symbol + ".o.log"));
  }
  if (objects.empty()) return false;  // every kernel failed; errors() says why
  const std::string tmp = std::string(kLibraryName) + ".tmp." + std::to_string(::getpid());
  const std::string out = RunCommand(fmt::format("cd {} && c++ -shared -fopenmp -o {} {}", ShellQuote(dir), tmp, objects), &st);
  GAF_CHECK(st == 0, "linking the fused kernels in {} failed: {}", dir.string(), out);
  const std::string manifest = Manifest(ReadAll(dir / tmp), lib.errors_);
  fs::rename(dir / tmp, dir / kLibraryName, ec);
  GAF_CHECK(!ec, "{}: cannot rename the kernel library into place: {}", (dir / kLibraryName).string(), ec.message());
  WriteAtomically(dir / kManifestName, manifest);
  return true;
}

std::shared_ptr<KernelLibrary> KernelCompiler::Compile(const std::vector<KernelSource>& kernels) {
  auto lib = std::make_shared<KernelLibrary>();
  if (kernels.empty()) return lib;
  lib->dir_ = BuildFolder(kernels);
  const auto t0 = std::chrono::steady_clock::now();
  // A cache hit needs no lock. Processes that build the same batch at once (parallel tests, two
  // sessions) take turns: the second finds the library the first built.
  lib->from_cache_ = LoadVerified(kernels, *lib);
  if (!lib->from_cache_) {
    BuildLock lock(fs::path(lib->dir_) / ".lock", LockTimeoutSeconds());
    lib->from_cache_ = LoadVerified(kernels, *lib);
    if (!lib->from_cache_ && Build(kernels, *lib))
      GAF_CHECK(LoadVerified(kernels, *lib), "{}: the kernel library just built does not match its checksum", lib->dir_);
  }
  lib->compile_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return lib;
}

}  // namespace gaf
