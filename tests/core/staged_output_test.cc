// StagedOutput (Note [Staged outputs]): an output appears whole or not at all, an existing one
// is replaced only when asked and then in one step, leftovers of killed runs are cleaned; and
// CheckOutputIsNoInput judges outputs against inputs by file identity, not spelling.
#include "core/staged_output.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "core/error.h"
#include "tests/expect_error.h"
#include "tests/killed_staging.h"

namespace ztrain {
namespace {

namespace fs = std::filesystem;
using testing::ExpectErrorWith;

class StagedOutputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ztrain_staged_XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static void Write(const fs::path& p, const std::string& text) {
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  // Every file below `root` (relative name -> content).
  static std::map<std::string, std::string> Files(const fs::path& root) {
    std::map<std::string, std::string> files;
    if (!fs::exists(root)) return files;
    if (fs::is_regular_file(root)) {
      std::ifstream in(root);
      files[""] = std::string(std::istreambuf_iterator<char>(in), {});
      return files;
    }
    for (const auto& e : fs::recursive_directory_iterator(root)) {
      if (!e.is_regular_file()) continue;
      std::ifstream in(e.path());
      files[fs::relative(e.path(), root).string()] = std::string(std::istreambuf_iterator<char>(in), {});
    }
    return files;
  }
  // The files directly in `dir` (name -> content): what a reader of the directory sees.
  static std::map<std::string, std::string> TopFiles(const fs::path& dir) {
    std::map<std::string, std::string> files;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.is_regular_file()) files[e.path().filename().string()] = Files(e.path()).at("");
    }
    return files;
  }
  std::string dir_;
};

TEST_F(StagedOutputTest, ANewDirectoryAppearsOnlyWhenCommitted) {
  const std::string out = dir_ + "/export";
  StagedOutput staged(out, StagedOutput::Kind::kDirectory, false, "--out");
  Write(fs::path(staged.path()) / "model.safetensors", "weights");
  EXPECT_FALSE(fs::exists(out)) << "visible before it is whole";
  staged.Commit();
  EXPECT_EQ(Files(out), (std::map<std::string, std::string>{{"model.safetensors", "weights"}}));
  EXPECT_TRUE(StagedOutput::Leftovers(out).empty());
}

TEST_F(StagedOutputTest, AFailureBeforeCommitLeavesThePreviousOutput) {
  const std::string out = dir_ + "/export";
  Write(fs::path(out) / "config.json", "old config");
  Write(fs::path(out) / "model-00001-of-00002.safetensors", "old 1");
  const auto before = Files(out);
  try {
    StagedOutput staged(out, StagedOutput::Kind::kDirectory, true, "--out");
    Write(fs::path(staged.path()) / "model-00001-of-00002.safetensors", "new 1");
    throw IoError("disk full");  // the second shard never comes
  } catch (const IoError&) {
  }
  EXPECT_EQ(Files(out), before);
  EXPECT_TRUE(StagedOutput::Leftovers(out).empty()) << "the staging directory was left behind";
}

TEST_F(StagedOutputTest, AnOutputHoldingFilesIsReplacedOnlyWithOverwriteAndWhole) {
  const std::string out = dir_ + "/export";
  Write(fs::path(out) / "config.json", "another model");
  Write(fs::path(out) / "model.safetensors", "its weights");
  ExpectErrorWith<ConfigError>(
      [&] { StagedOutput(out, StagedOutput::Kind::kDirectory, false, "--out"); },
      {"--out '" + out + "' already holds", "config.json", "model.safetensors", "--overwrite"});
  EXPECT_EQ(Files(out).size(), 2u);
  StagedOutput staged(out, StagedOutput::Kind::kDirectory, true, "--out");
  Write(fs::path(staged.path()) / "adapter_model.safetensors", "adapter");
  EXPECT_EQ(Files(out).at("config.json"), "another model") << "replaced before the commit";
  staged.Commit();
  EXPECT_EQ(Files(out),
            (std::map<std::string, std::string>{{"adapter_model.safetensors", "adapter"}}))
      << "the new output is exactly what was staged: no file of the old one is left";
  EXPECT_TRUE(StagedOutput::Leftovers(out).empty());
}

TEST_F(StagedOutputTest, AnEmptyDirectoryIsTakenWithoutOverwrite) {
  const std::string out = dir_ + "/empty";
  fs::create_directories(out);
  StagedOutput staged(out, StagedOutput::Kind::kDirectory, false, "--out");
  Write(fs::path(staged.path()) / "a", "1");
  staged.Commit();
  EXPECT_EQ(Files(out), (std::map<std::string, std::string>{{"a", "1"}}));
}

TEST_F(StagedOutputTest, AFileIsRenamedIntoPlaceAndADirectoryIsNoFile) {
  const std::string file = dir_ + "/model.bin";
  Write(file, "old");
  ExpectErrorWith<ConfigError>(
      [&] { StagedOutput(file, StagedOutput::Kind::kFile, false, "--out"); },
      {"already holds a file", "--overwrite"});
  {
    StagedOutput staged(file, StagedOutput::Kind::kFile, true, "--out");
    Write(staged.path(), "new");
    EXPECT_EQ(Files(file).at(""), "old");
    staged.Commit();
  }
  EXPECT_EQ(Files(file).at(""), "new");
  ExpectErrorWith<ConfigError>(
      [&] { StagedOutput(dir_, StagedOutput::Kind::kFile, true, "--out"); },
      {"is a directory; this writes one file"});
}

TEST_F(StagedOutputTest, LeftoversOfKilledRunsAreRemovedAndOthersLeft) {
  const std::string out = dir_ + "/export";
  const pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  waitpid(child, nullptr, 0);  // a pid that is gone
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const std::string prefix = dir_ + "/.export.ztrain-staging.";
  const std::string dead = prefix + std::to_string(child) + "@" + host;
  const std::string alive = prefix + std::to_string(getppid()) + "@" + host;
  const std::string remote = prefix + "12@another-host";
  for (const std::string& d : {dead, alive, remote}) Write(fs::path(d) / "shard", "partial");
  Write(dead + ".tmp", "partial file");
  StagedOutput staged(out, StagedOutput::Kind::kDirectory, false, "--out");
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_FALSE(fs::exists(dead + ".tmp"));
  EXPECT_TRUE(fs::exists(alive)) << "a running process's staging was removed";
  EXPECT_TRUE(fs::exists(remote)) << "another host's staging was removed";
}

// Note [Staged file sets]: files beside others in one directory appear together at Commit,
// the earlier set's files the new one lacks go, and other files stay; nothing changes before.
TEST_F(StagedOutputTest, AFileSetReplacesTheEarlierSetAndNothingElse) {
  const std::string out = dir_ + "/data/c.bin";
  for (const char* name : {"c_000000.bin", "c_000001.bin", "c_000002.bin", "notes.txt"}) {
    Write(fs::path(dir_) / "data" / name, std::string("old ") + name);
  }
  const auto earlier = [](const std::string& name) { return name.rfind("c_", 0) == 0; };
  const auto before = TopFiles(dir_ + "/data");
  {
    StagedFileSet staged(out, earlier, "--out");
    Write(staged.PathOf("c_000000.bin"), "new 0");
    // dropped before Commit: a failure
  }
  EXPECT_EQ(TopFiles(dir_ + "/data"), before);
  ExpectErrorWith<IoError>([&] { StagedFileSet(out, earlier, "--out").Commit({"missing"}); },
                           {"nothing was written to", "missing"});
  EXPECT_EQ(TopFiles(dir_ + "/data"), before);
  StagedFileSet staged(out, earlier, "--out");
  Write(staged.PathOf("c_000000.bin"), "new 0");
  Write(staged.PathOf("c_000001.bin"), "new 1");
  Write(staged.PathOf("c.manifest.json"), "manifest");
  EXPECT_EQ(TopFiles(dir_ + "/data"), before) << "visible before the commit";
  EXPECT_EQ(staged.Commit({"c_000000.bin", "c_000001.bin", "c.manifest.json"}),
            std::vector<std::string>{dir_ + "/data/c_000002.bin"});
  EXPECT_EQ(TopFiles(dir_ + "/data"), (std::map<std::string, std::string>{
                                       {"c_000000.bin", "new 0"},
                                       {"c_000001.bin", "new 1"},
                                       {"c.manifest.json", "manifest"},
                                       {"notes.txt", "old notes.txt"}}));
  EXPECT_TRUE(StagedOutput::Leftovers(out).empty());
}

// A journal left by a killed commit is carried out by the next run, whatever part of it was
// done, and the mixed files are refused to readers until then.
TEST_F(StagedOutputTest, AnInterruptedFileSetCommitIsFinishedFromItsJournal) {
  const std::string out = dir_ + "/c.bin";
  const fs::path staging = testing::KilledRunStaging(out);
  Write(fs::path(dir_) / "c_000000.bin", "new 0");  // already put in place
  Write(fs::path(dir_) / "c_000001.bin", "old 1");
  Write(fs::path(dir_) / "c_000002.bin", "old 2");  // to be removed
  Write(staging / "c_000001.bin", "new 1");
  Write(staging / ".ztrain-commit", "put c_000000.bin\nput c_000001.bin\nremove c_000002.bin\n");
  ExpectErrorWith<ConfigError>(
      [&] { CheckNoUnfinishedCommit({dir_ + "/c_000002.bin"}, "the data"); },
      {"the data file '" + dir_ + "/c_000002.bin' belongs to '" + out + "'", staging.string()});
  EXPECT_NO_THROW(CheckNoUnfinishedCommit({dir_ + "/other.bin"}, "the data"));
  StagedFileSet::FinishInterrupted(out);
  EXPECT_EQ(TopFiles(dir_), (std::map<std::string, std::string>{{"c_000000.bin", "new 0"},
                                                            {"c_000001.bin", "new 1"}}));
  EXPECT_NO_THROW(CheckNoUnfinishedCommit({dir_ + "/c_000000.bin"}, "the data"));
  // A staging directory without a journal was killed before its commit: removed.
  Write(staging / "c_000000.bin", "newer 0");
  StagedFileSet::FinishInterrupted(out);
  EXPECT_FALSE(fs::exists(staging));
  EXPECT_EQ(TopFiles(dir_).at("c_000000.bin"), "new 0");
}

TEST_F(StagedOutputTest, AnOutputIsJudgedAgainstInputsByIdentity) {
  const std::string model = dir_ + "/models/base";
  Write(fs::path(model) / "config.json", "{}");
  fs::create_directory_symlink(model, dir_ + "/link");
  const std::vector<NamedInput> inputs = {{"model.init_from", model}};
  ExpectErrorWith<ConfigError>([&] { CheckOutputIsNoInput(dir_ + "/link", "--out", inputs); },
                               {"--out '" + dir_ + "/link' is model.init_from"});
  ExpectErrorWith<ConfigError>(
      [&] { CheckOutputIsNoInput(dir_ + "/link/merged", "--out", inputs); },
      {"lies inside model.init_from"});
  ExpectErrorWith<ConfigError>(
      [&] { CheckOutputIsNoInput(dir_ + "/models/../models/base/x/y", "--out", inputs); },
      {"lies inside model.init_from"});
  ExpectErrorWith<ConfigError>([&] { CheckOutputIsNoInput(dir_ + "/models", "--out", inputs); },
                               {"contains model.init_from"});
  const std::string file = dir_ + "/adapter.safetensors";
  Write(file, "x");
  fs::create_hard_link(file, dir_ + "/hard");
  ExpectErrorWith<ConfigError>(
      [&] { CheckOutputIsNoInput(dir_ + "/hard", "--out", {{"lora.init_from", file}}); },
      {"is lora.init_from"});
  EXPECT_NO_THROW(CheckOutputIsNoInput(dir_ + "/merged", "--out", inputs));
  EXPECT_NO_THROW(CheckOutputIsNoInput(dir_ + "/models/other", "--out", inputs));
  EXPECT_NO_THROW(CheckOutputIsNoInput(dir_ + "/x", "--out", {{"gone", dir_ + "/missing"}}));
}

}  // namespace
}  // namespace ztrain
