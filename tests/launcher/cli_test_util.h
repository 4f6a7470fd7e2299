#pragma once
// The ztrain executable run as a user runs it, for the launcher tests: a command line through
// the shell with its exit code and output, and a fixture with a fresh directory.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ztrain {

struct Result {
  int code;
  std::string out;
};

// Runs ztrain (ZTRAIN_BINARY, defined by the test target) with `args` through the shell, capturing
// stdout and, by default, stderr together (`redirect` "2>FILE" keeps stdout alone); `env`
// ("VAR=value ...") is set for it.
inline Result RunZtrain(const std::string& args, const std::string& redirect = "2>&1",
                        const std::string& env = "") {
  const std::string cmd = env + " " + ZTRAIN_BINARY + " " + args + " " + redirect;
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// Hides the GPUs from a run, as on a machine without any.
inline const std::string kNoGpus = "CUDA_VISIBLE_DEVICES=";

inline std::vector<std::string> Lines(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(f, l);) lines.push_back(l);
  return lines;
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ztrain_cli_XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string WriteConfig(const nlohmann::json& j, const std::string& name = "c.json") {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << j.dump(2);
    return path;
  }
  std::string dir_;
};

}  // namespace ztrain
