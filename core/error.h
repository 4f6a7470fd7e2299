#pragma once
// Errors and checks (DESIGN.md "Errors").
//
// ztrain reports every failure as an exception derived from ztrain::Error. User mistakes
// (bad config, bad file, bad shape) go through ZTRAIN_CHECK, whose message must say what was
// wrong and how to fix it; broken internal invariants go through ZTRAIN_ASSERT. Neither ever
// calls exit() or abort(): only launcher/ ends the process.
#include <sstream>
#include <stdexcept>
#include <string>

namespace ztrain {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};
class ConfigError : public Error {
 public:
  using Error::Error;
};
class IoError : public Error {
 public:
  using Error::Error;
};
class CommError : public Error {
 public:
  using Error::Error;
};
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};
class InternalError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <typename... Args>
std::string StrCat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void ThrowAssert(const char* cond, const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace ztrain

// User error: throws ztrain::Error with the message built from the remaining arguments.
#define ZTRAIN_CHECK(cond, ...)                                      \
  do {                                                               \
    if (!(cond)) throw ::ztrain::Error(::ztrain::detail::StrCat(__VA_ARGS__)); \
  } while (0)

// User error of a given Error subclass.
#define ZTRAIN_CHECK_T(type, cond, ...)                             \
  do {                                                              \
    if (!(cond)) throw type(::ztrain::detail::StrCat(__VA_ARGS__)); \
  } while (0)

// Internal invariant: throws ztrain::InternalError naming the condition and location.
#define ZTRAIN_ASSERT(cond, ...)                                                          \
  do {                                                                                    \
    if (!(cond))                                                                          \
      ::ztrain::detail::ThrowAssert(#cond, __FILE__, __LINE__,                            \
                                    ::ztrain::detail::StrCat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)
