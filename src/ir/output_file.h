// Output files written so that nothing is lost or half-written: every file we write goes to a
// temporary name in the destination's folder (".NAME.gaf-tmp.PID.N") and is renamed into place
// once complete; temporaries are removed on error, on SIGINT/SIGTERM/SIGHUP, and (when left by a
// process that died, e.g. kill -9) by the next write into the same folder. Destinations are
// checked first: an existing destination that is not a regular file (a device, a FIFO, a symlink,
// a folder) is refused, and so is writing over one of the command's own input files unless the
// user asked for it.
#pragma once

#include <cstdint>
#include <fstream>
#include <set>
#include <string>
#include <vector>

namespace gaf {

// Refuses `path` as a destination (gaf::Error naming `what`, e.g. "-o"): an existing entry that is
// not a regular file, or the same file as one of `inputs` (unless `overwrite`).
void CheckOutputPath(const std::string& path, const std::vector<std::string>& inputs = {}, bool overwrite = false,
                     const std::string& what = "output");

// Refuses `dir` as an output folder when it exists and is not a folder (or is a symlink).
void CheckOutputDir(const std::string& dir, const std::string& what = "output folder");

// A temporary file that becomes `final_path` on Commit() and is removed otherwise.
class TempFile {
 public:
  explicit TempFile(std::string final_path);
  ~TempFile();
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  std::ofstream& stream() { return out_; }
  const std::string& temp_path() const { return temp_; }
  // Bytes written so far through Write() (and their FNV-1a 64-bit hash).
  void Write(const void* data, size_t n);
  uint64_t hash() const { return hash_; }
  // Flushes, syncs to disk and renames onto `final_path` (or onto `rename_to` when given).
  void Commit(const std::string& rename_to = "");

 private:
  std::string final_;
  std::string temp_;
  std::ofstream out_;
  int slot_ = -1;
  bool committed_ = false;
  uint64_t hash_ = 1469598103934665603ull;
};

// Removes ".*.gaf-tmp.PID.*" files in `dir` whose process is gone.
void RemoveStaleTempFiles(const std::string& dir);

// Installs the SIGINT/SIGTERM/SIGHUP handlers that remove live temporaries (idempotent).
void InstallTempFileCleanup();

// "a/b" -> "a_b": a file name for a tensor name, distinct from every name already in `taken`
// (suffix _2, _3, ... on a collision); the result is added to `taken`.
std::string DistinctFileName(const std::string& name, std::set<std::string>& taken);

}  // namespace gaf
