#pragma once
// TempDir: a fresh directory (mkdtemp under `parent`, /tmp unless given), removed with its
// contents when the test's scope ends, whatever failed. A failed mkdtemp fails the test.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

namespace ztrain::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "ztrain_test", const std::string& parent = "/tmp") {
    std::string tmpl = parent + "/" + prefix + "_XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) ADD_FAILURE() << "mkdtemp in " << parent << " failed";
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string File(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace ztrain::testing
