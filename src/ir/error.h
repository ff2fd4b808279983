// Error types. Input and environment problems throw gaf::Error (a sentence a user reads);
// operators or types we do not implement throw gaf::UnsupportedError, which callers may treat
// as "skip" rather than "wrong".
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace gaf {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

class UnsupportedError : public Error {
 public:
  explicit UnsupportedError(const std::string& msg) : Error(msg) {}
};

}  // namespace gaf

// GAF_CHECK(cond, "format {}", args...): throws gaf::Error when cond is false.
#define GAF_CHECK(cond, ...)                                   \
  do {                                                         \
    if (!(cond)) throw ::gaf::Error(::fmt::format(__VA_ARGS__)); \
  } while (0)

#define GAF_UNSUPPORTED(...) throw ::gaf::UnsupportedError(::fmt::format(__VA_ARGS__))
