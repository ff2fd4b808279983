#include "cli/subprocess.h"

#include <fmt/format.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ir/error.h"

extern char** environ;

namespace gaf::cli {
namespace fs = std::filesystem;

std::string EnvOr(const char* var, const char* fallback) {
  const char* v = std::getenv(var);
  return v != nullptr && *v != '\0' ? v : fallback;
}

TempDir::TempDir(const std::string& prefix) {
  std::string tmpl = (fs::path(EnvOr("TMPDIR", "/tmp")) / (prefix + "_XXXXXX")).string();
  if (mkdtemp(tmpl.data()) == nullptr) {
    tmpl = "/tmp/" + prefix + "_XXXXXX";
    GAF_CHECK(mkdtemp(tmpl.data()) != nullptr, "cannot make a temporary folder: {}", std::strerror(errno));
  }
  path = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path, ec);
}

std::string ReadSmallFile(const std::string& path, size_t max_bytes) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return "";
  f.seekg(0, std::ios::end);
  const std::streamoff size = f.tellg();
  if (size <= 0) return "";
  const std::streamoff from = size > static_cast<std::streamoff>(max_bytes) ? size - static_cast<std::streamoff>(max_bytes) : 0;
  f.seekg(from);
  std::string s(static_cast<size_t>(size - from), '\0');
  f.read(s.data(), static_cast<std::streamsize>(s.size()));
  return s;
}

std::string LastLine(const std::string& text) {
  std::istringstream in(text);
  std::string line, last;
  while (std::getline(in, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (!line.empty()) last = line;
  }
  if (last.rfind("error: ", 0) == 0) last = last.substr(7);
  return last;
}

std::string PathArg(const std::string& p) { return !p.empty() && p[0] == '-' ? "./" + p : p; }

int RunProgram(const std::vector<std::string>& argv, const std::string& out_file, const std::string& err_file,
               std::string* why) {
  std::vector<char*> cargv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, out_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&fa, 2, err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, cargv[0], &fa, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    *why = fmt::format("cannot run {}: {}", argv[0], std::strerror(rc));
    return -1;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      *why = fmt::format("waiting for {}: {}", argv[0], std::strerror(errno));
      return -1;
    }
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  *why = WIFSIGNALED(status) ? fmt::format("{} was killed by signal {}", argv[0], WTERMSIG(status))
                             : fmt::format("{} stopped abnormally", argv[0]);
  return -1;
}

}  // namespace gaf::cli
