#include "ir/output_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "ir/error.h"

namespace gaf {
namespace fs = std::filesystem;

namespace {

constexpr const char* kTempTag = ".gaf-tmp.";

// Live temporaries, for the signal handler: fixed storage, no allocation in the handler.
constexpr int kSlots = 64;
constexpr size_t kPathMax = 4096;
char g_paths[kSlots][kPathMax];
std::atomic<bool> g_used[kSlots];

int Register(const std::string& path) {
  if (path.size() >= kPathMax) return -1;
  for (int i = 0; i < kSlots; ++i) {
    bool expected = false;
    if (g_used[i].compare_exchange_strong(expected, true)) {
      std::memcpy(g_paths[i], path.c_str(), path.size() + 1);
      return i;
    }
  }
  return -1;  // more than kSlots temporaries at once: removed on error, not on a signal
}

void Unregister(int slot) {
  if (slot >= 0) g_used[slot].store(false);
}

extern "C" void RemoveTempsAndReraise(int sig) {
  for (int i = 0; i < kSlots; ++i)
    if (g_used[i].load()) ::unlink(g_paths[i]);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

std::atomic<uint64_t> g_counter{0};

bool ProcessAlive(long pid) { return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH); }

}  // namespace

void InstallTempFileCleanup() {
  static const bool installed = [] {
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
      struct sigaction sa {};
      sa.sa_handler = RemoveTempsAndReraise;
      sigemptyset(&sa.sa_mask);
      ::sigaction(sig, &sa, nullptr);
    }
    return true;
  }();
  (void)installed;
}

void CheckOutputPath(const std::string& path, const std::vector<std::string>& inputs, bool overwrite,
                     const std::string& what) {
  GAF_CHECK(!path.empty(), "{}: empty file name", what);
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    GAF_CHECK(!S_ISLNK(st.st_mode), "{} {}: is a symbolic link; refusing to replace it (give the file it points to)",
              what, path);
    GAF_CHECK(S_ISREG(st.st_mode), "{} {}: exists and is not a regular file (a folder, device or FIFO); refusing to replace it",
              what, path);
  }
  // The folder it goes into must be there (checked now: the work before the write can take minutes).
  const fs::path parent = fs::path(path).parent_path();
  std::error_code ec;
  GAF_CHECK(parent.empty() || fs::is_directory(parent, ec), "{} {}: the folder {} does not exist", what, path,
            parent.string());
  if (overwrite) return;
  for (const std::string& in : inputs) {
    if (in.empty() || !fs::exists(in, ec)) continue;
    GAF_CHECK(!fs::exists(path, ec) || !fs::equivalent(path, in, ec),
              "{} {}: is the input file {}; refusing to replace it (--overwrite allows it)", what, path, in);
  }
}

void CheckOutputDir(const std::string& dir, const std::string& what) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return;
  GAF_CHECK(!S_ISLNK(st.st_mode) || fs::is_directory(dir), "{} {}: is a symbolic link to something that is not a folder",
            what, dir);
  GAF_CHECK(S_ISDIR(st.st_mode) || S_ISLNK(st.st_mode), "{} {}: exists and is not a folder", what, dir);
}

void RemoveStaleTempFiles(const std::string& dir) {
  std::error_code ec;
  fs::directory_iterator it(dir.empty() ? "." : dir, ec), end;
  for (int seen = 0; !ec && it != end && seen < 100000; it.increment(ec), ++seen) {
    const std::string name = it->path().filename().string();
    const size_t tag = name.find(kTempTag);
    if (name.empty() || name[0] != '.' || tag == std::string::npos) continue;
    const char* p = name.c_str() + tag + std::strlen(kTempTag);
    char* stop = nullptr;
    const long pid = std::strtol(p, &stop, 10);
    if (stop == p || *stop != '.') continue;
    if (!ProcessAlive(pid)) {
      std::error_code rm;
      fs::remove(it->path(), rm);
    }
  }
}

TempFile::TempFile(std::string final_path) : final_(std::move(final_path)) {
  InstallTempFileCleanup();
  const fs::path fin(final_);
  const fs::path dir = fin.parent_path();
  RemoveStaleTempFiles(dir.string());
  temp_ = (dir / ("." + fin.filename().string() + kTempTag + std::to_string(::getpid()) + "." +
                  std::to_string(g_counter.fetch_add(1))))
              .string();
  // O_EXCL: never write through a file (or symlink) someone put at the temporary name.
  const int fd = ::open(temp_.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC | O_NOFOLLOW, 0644);
  GAF_CHECK(fd >= 0, "{}: cannot create a file in {}: {}", final_, dir.empty() ? "." : dir.string(), std::strerror(errno));
  ::close(fd);
  slot_ = Register(temp_);
  out_.open(temp_, std::ios::binary | std::ios::trunc);
  if (!out_.good()) {
    ::unlink(temp_.c_str());
    Unregister(slot_);
    throw Error(fmt::format("{}: cannot open for writing", temp_));
  }
}

TempFile::~TempFile() {
  if (committed_) return;
  out_.close();
  ::unlink(temp_.c_str());
  Unregister(slot_);
}

void TempFile::Write(const void* data, size_t n) {
  const auto* b = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) hash_ = (hash_ ^ b[i]) * 1099511628211ull;
  out_.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
}

void TempFile::Commit(const std::string& rename_to) {
  const std::string dest = rename_to.empty() ? final_ : rename_to;
  out_.flush();
  GAF_CHECK(out_.good(), "{}: write failed (disk full?)", dest);
  out_.close();
  const int fd = ::open(temp_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
  CheckOutputPath(dest, {}, true);  // it may have changed since the command started
  GAF_CHECK(::rename(temp_.c_str(), dest.c_str()) == 0, "{}: cannot rename the finished file into place: {}", dest,
            std::strerror(errno));
  committed_ = true;
  Unregister(slot_);
}

std::string DistinctFileName(const std::string& name, std::set<std::string>& taken) {
  std::string base;
  for (unsigned char c : name) base += (std::isalnum(c) || c == '_' || c == '-' || c == '.') ? static_cast<char>(c) : '_';
  if (base.empty() || base[0] == '.') base = "_" + base;
  if (base.size() > 200) base.resize(200);
  std::string candidate = base;
  for (int64_t k = 2; taken.count(candidate); ++k) candidate = base + "_" + std::to_string(k);
  taken.insert(candidate);
  return candidate;
}

}  // namespace gaf
