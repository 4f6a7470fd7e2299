#pragma once
// ScopedEnv: sets (or, with nullptr, unsets) an environment variable for a test's scope and
// puts back what was there, whatever fails in between, so that one test's setting never
// reaches the next. Not thread safe (setenv is not).
#include <stdlib.h>

#include <optional>
#include <string>

namespace ztrain::testing {

class ScopedEnv {
 public:
  ScopedEnv(std::string name, const char* value) : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str())) old_ = old;
    Set(value);
  }
  ~ScopedEnv() { Set(old_ ? old_->c_str() : nullptr); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

  void Set(const char* value) {
    if (value == nullptr) {
      ::unsetenv(name_.c_str());
    } else {
      ::setenv(name_.c_str(), value, 1);
    }
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

}  // namespace ztrain::testing
