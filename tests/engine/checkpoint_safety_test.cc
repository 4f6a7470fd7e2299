// Checkpoints under a stranger's hands: everything a resume reads is checksummed (meta.json
// too), a checkpoint.dir in use by a live run is refused naming it (a killed run leaves no
// stale lock), the config changes since a checkpoint are named (a shape change refused), a
// step never saved says so, a garbage `latest` falls back, and export falls back the same way
// and never writes into what it reads.
#include <gtest/gtest.h>
#include <signal.h>
#include <spdlog/sinks/ostream_sink.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_export.h"
#include "checkpoint_test_util.h"
#include "core/error.h"
#include "core/logging.h"
#include "run/checkpointer.h"
#include "tests/expect_error.h"

namespace ztrain {
namespace {

using namespace checkpoint_test;
using ztrain::testing::ExpectErrorWith;

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Copies the ztrain logger's lines into `out` while it lives.
class LogCapture {
 public:
  explicit LogCapture(std::ostream& out)
      : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(out)) {
    Log().sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& sinks = Log().sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }

 private:
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
};

// meta.json's text with its first `from` replaced by `to` (a hand edit).
void EditMeta(const std::string& path, const std::string& from, const std::string& to) {
  std::string text = ReadText(path);
  const size_t at = text.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  text.replace(at, from.size(), to);
  std::ofstream(path) << text;
}

// A one-digit edit of meta.json's data position used to be accepted.
TEST(CheckpointSafetyTest, AnEditedMetaJsonIsCaughtAndLatestFallsBack) {
  TwoCheckpoints t;
  const std::string meta = t.File(10, checkpoint::kMetaFile);
  EXPECT_NE(ReadText(meta).find("\"meta_crc32c\""), std::string::npos);
  EditMeta(meta, "\"position\": 0", "\"position\": 1");
  ExpectErrorWith<IoError>([&] { t.Resume("10"); },
                           {"step10", "meta.json: checksum", "it was edited or is corrupt"});
  EXPECT_EQ(t.Resume("latest"), 5);  // the newest intact one
  // Removing the checksum of a version-2 file is caught too.
  nlohmann::json j = nlohmann::json::parse(ReadText(meta));
  j.erase("meta_crc32c");
  std::ofstream(meta) << j.dump(2);
  ExpectErrorWith<IoError>([&] { t.Resume("10"); }, {"without its meta_crc32c"});
}

TEST(CheckpointSafetyTest, AGarbageLatestFallsBackLikeACorruptStep) {
  TwoCheckpoints t;
  std::ofstream(t.dir.path + "/" + checkpoint::kLatestFile) << "\x7f\x01garbage, not a step";
  EXPECT_EQ(t.Resume("latest"), 10);  // what latest would have named: the newest intact
  std::ofstream(t.dir.path + "/" + checkpoint::kLatestFile) << "step99999999999999999999999\n";
  EXPECT_EQ(t.Resume("latest"), 10);
  std::ofstream(t.dir.path + "/" + checkpoint::kLatestFile) << "step42\n";  // gone
  EXPECT_EQ(t.Resume("latest"), 10);
  std::string problem;
  EXPECT_EQ(checkpoint::ResumeCandidates(t.dir.path, &problem), (std::vector<int64_t>{10, 5}));
  EXPECT_NE(problem.find("names step42, which is not there"), std::string::npos) << problem;
}

TEST(CheckpointSafetyTest, AStepNeverSavedSaysSoAndNamesTheSavedOnes) {
  TwoCheckpoints t;
  ExpectErrorWith<IoError>(
      [&] { t.Resume("999"); },
      {"there is no checkpoint step999", "never saved", "saved: step5, step10; latest: step10"});
}

// Another live run holding checkpoint.dir is refused at once, naming it; a run that was killed
// (SIGKILL) leaves no lock behind.
TEST(CheckpointSafetyTest, ALiveRunHoldsTheDirectoryAndAKilledOneDoesNot) {
  TempDir dir;
  const Config cfg = MakeConfig(Layout{}, dir.path);
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  if (child == 0) {  // the other run: holds the directory until it is killed
    Engine e(cfg, nn::BuildGpt2(cfg.model));
    Checkpointer ck(cfg, e, nullptr);
    const char ok = 1;
    if (::write(ready[1], &ok, 1) != 1) std::_Exit(1);
    ::pause();
    std::_Exit(0);
  }
  char ok = 0;
  ASSERT_EQ(::read(ready[0], &ok, 1), 1);
  Engine e(cfg, nn::BuildGpt2(cfg.model));
  ExpectErrorWith<ConfigError>(
      [&] { Checkpointer ck(cfg, e, nullptr); },
      {"checkpoint.dir " + dir.path + " is in use by a running job", "pid " + std::to_string(child),
       "job checkpoint_test", "give this run another checkpoint.dir"});
  EXPECT_NE(checkpoint::DirectoryHolder(dir.path).find("pid " + std::to_string(child)),
            std::string::npos);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_EQ(checkpoint::DirectoryHolder(dir.path), "");
  Checkpointer ck(cfg, e, nullptr);  // free again
  ck.Save(0, {});
  ::close(ready[0]);
  ::close(ready[1]);
}

// Note [Config changes on resume]: a shape change is refused with both values; other changes
// are named in one warning, and the run goes on.
TEST(CheckpointSafetyTest, ConfigChangesSinceTheCheckpointAreNamed) {
  TwoCheckpoints t;
  nlohmann::json wider = t.cfg.resolved;
  wider["model"]["n_embd"] = 32;
  const Config w = ParseConfig(wider);
  Engine e(w, nn::BuildGpt2(w.model));
  ExpectErrorWith<ConfigError>([&] { Checkpointer(w, e, nullptr).Resume("latest"); },
                               {"the model's shape differs", "model.n_embd 16 -> 32",
                                "loads only into the model it was saved from"});
  nlohmann::json other = t.cfg.resolved;
  other["training"]["seed"] = 7;
  other["data"]["seq_len"] = 4;
  other["training"]["steps"] = 500;  // extending the run is no change
  // The number an "auto" size stands for (saved as 0) is the same model, no change.
  other["model"]["n_kv_head"] = t.cfg.model.n_head;
  const Config o = ParseConfig(other);
  Engine e2(o, nn::BuildGpt2(o.model));
  std::ostringstream log;
  {
    const LogCapture capture(log);
    EXPECT_EQ(Checkpointer(o, e2, nullptr).Resume("latest").step, 10);
  }
  const std::string text = log.str();
  EXPECT_NE(text.find("with 2 config changes since it was saved (saved -> now): "),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("data.seq_len 8 -> 4"), std::string::npos) << text;
  EXPECT_NE(text.find("training.seed 1337 -> 7"), std::string::npos) << text;
  EXPECT_EQ(text.find("training.steps"), std::string::npos) << text;
  EXPECT_EQ(text.find("n_kv_head"), std::string::npos) << text;
}

// Export picks the checkpoint as a resume does, and never writes into what it reads.
TEST(CheckpointSafetyTest, ExportFallsBackAndNeverOverwritesItsInput) {
  TwoCheckpoints t;
  TempDir out;
  FlipByte(t.File(10, "rank0.bin"), 100);
  const ExportResult r = ExportCheckpoint(t.dir.path, "llmc", out.path + "/m.bin", DType::kF32);
  EXPECT_EQ(r.step, 5);  // latest (10) is corrupt: the newest intact one
  ExpectErrorWith<IoError>(
      [&] { ExportCheckpoint(t.dir.path + "/step10", "llmc", out.path + "/m.bin", DType::kF32); },
      {"step10 is not intact", "rank0.bin"});
  for (const std::string& inside :
       {t.dir.path + "/step5/rank0.bin", t.dir.path + "/model.bin", t.dir.path + "/x/../m.bin"}) {
    ExpectErrorWith<ConfigError>([&] { ExportCheckpoint(t.dir.path, "llmc", inside, DType::kF32); },
                                 {"is inside the checkpoint directory", "write it elsewhere"});
    ExpectErrorWith<ConfigError>(
        [&] { ExportCheckpoint(t.dir.path + "/step5", "llmc", inside, DType::kF32); },
        {"is inside the checkpoint directory"});
  }
  EXPECT_EQ(checkpoint::VerifyFiles(t.dir.path + "/step5",
                                    checkpoint::ReadMeta(t.dir.path + "/step5"), 0, 1),
            "");
}

}  // namespace
}  // namespace ztrain
