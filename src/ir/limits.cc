#include "ir/limits.h"

#include <unistd.h>

#include <cmath>
#include <cstdlib>

#include "ir/error.h"

namespace gaf {

int64_t PhysicalMemoryBytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<int64_t>(pages) * static_cast<int64_t>(page);
}

Limits& GlobalLimits() {
  static Limits limits = [] {
    Limits l;
    const int64_t ram = PhysicalMemoryBytes();
    l.max_tensor_bytes = ram > 0 ? ram / 2 : int64_t{8} << 30;
    return l;
  }();
  return limits;
}

std::string FormatBytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.3g} {}", v, units[u]);
}

int64_t ParseByteSize(const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  GAF_CHECK(end != text.c_str() && std::isfinite(v) && v > 0, "'{}' is not a size (examples: 4G, 512M, 1000000)", text);
  std::string unit(end);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double scale = 1;
  if (unit.empty() || unit == "B") scale = 1;
  else if (unit == "K" || unit == "KB" || unit == "KIB") scale = 1024.0;
  else if (unit == "M" || unit == "MB" || unit == "MIB") scale = 1024.0 * 1024;
  else if (unit == "G" || unit == "GB" || unit == "GIB") scale = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "TB" || unit == "TIB") scale = 1024.0 * 1024 * 1024 * 1024;
  else throw Error(fmt::format("'{}' is not a size: unknown unit '{}' (use K, M, G or T)", text, unit));
  const double bytes = v * scale;
  GAF_CHECK(bytes < 9.0e18, "'{}' is too large a size", text);
  return static_cast<int64_t>(bytes);
}

}  // namespace gaf
