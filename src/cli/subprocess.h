// Running helper programs (PyTorch's exporter, ONNX Runtime's benchmark scripts) from the CLI:
// argv without a shell, output into files of a private temporary folder.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace gaf::cli {

// The environment variable's value, or `fallback` when it is unset or empty.
std::string EnvOr(const char* var, const char* fallback);

// A private temporary folder ($TMPDIR, else /tmp; named PREFIX_XXXXXX), removed with everything
// in it.
struct TempDir {
  std::string path;
  explicit TempDir(const std::string& prefix);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

// At most the last `max_bytes` of a file ("" when it cannot be read).
std::string ReadSmallFile(const std::string& path, size_t max_bytes);

// The last non-empty line of `text`, without a leading "error: ".
std::string LastLine(const std::string& text);

// A path as an argument that argument parsers must not take for an option ("./-x" for "-x").
std::string PathArg(const std::string& p);

// Runs argv (no shell) with stdin from /dev/null and stdout/stderr into files; the exit status,
// or -1 with *why set when it could not be started or was killed.
int RunProgram(const std::vector<std::string>& argv, const std::string& out_file, const std::string& err_file,
               std::string* why);

}  // namespace gaf::cli
