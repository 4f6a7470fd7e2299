#pragma once
// A directory nothing can be written in, for the tests of Note [Preflight]. Root ignores
// permission bits, so as root the directory is made immutable (chattr +i, CAP_LINUX_IMMUTABLE);
// otherwise its mode is 0555. ok() says whether either took (a probe write fails); the
// destructor makes it writable again and removes it.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace ztrain::testing {

class ReadOnlyDir {
 public:
  ReadOnlyDir() {
    std::string t = "/tmp/ztrain_ro_XXXXXX";
    path_ = ::mkdtemp(t.data());
    if (::geteuid() == 0) {
      immutable_ = std::system(("chattr +i " + path_ + " 2>/dev/null").c_str()) == 0;
    } else {
      ::chmod(path_.c_str(), 0555);
    }
    ok_ = !std::ofstream(path_ + "/probe").good();
  }
  ~ReadOnlyDir() {
    if (immutable_) std::system(("chattr -i " + path_ + " 2>/dev/null").c_str());
    ::chmod(path_.c_str(), 0755);
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ReadOnlyDir(const ReadOnlyDir&) = delete;
  ReadOnlyDir& operator=(const ReadOnlyDir&) = delete;

  const std::string& path() const { return path_; }
  bool ok() const { return ok_; }

 private:
  std::string path_;
  bool immutable_ = false;
  bool ok_ = false;
};

}  // namespace ztrain::testing
