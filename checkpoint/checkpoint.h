#pragma once
// Checkpoint files (docs/architecture.md "Checkpoints"): sharded, layout-free, crash-safe.
//
// <checkpoint.dir>/step<N>/ holds one rank<R>.bin per rank of the run that saved it and one
// meta.json. A rank file is a list of entries, each a piece of one parameter's fp32 master
// values, Adam m or Adam v, addressed by the WHOLE parameter's flat element indices (runs
// [begin, begin + count) of the unsharded, unsplit parameter), followed by its index:
//   data ... | index (JSON) | index bytes (u64 LE) | "ZTCKPT01"
// Every element of the model is in exactly one entry of one file, whatever the layout (dp,
// ZeRO stage, offload, pp, tp) that wrote it, so any layout can read back the elements it
// holds (ModelIndex::Read): shards are re-cut on load. meta.json names the files with their
// sizes and CRC-32C and carries the step, the data position, the config and the layout.
//
// Everything a resume reads is checksummed: each rank file by the CRC-32C meta.json records,
// meta.json by its own "meta_crc32c" (the CRC-32C of its JSON without that key, version 2;
// version 1 checkpoints have none and load with a warning). `latest` is only a pointer: when
// it holds anything but step<N>, the newest intact checkpoint is used instead.
// Crash safety: files are written under temporary names, fsync'ed and renamed; the step
// directory is written as step<N>.partial and renamed once complete; `latest` (a file holding
// "step<N>") is replaced by rename after that. A crash at any point leaves `latest` naming a
// complete checkpoint (or absent), and partial directories are ignored and cleaned up.
// Errors are IoError naming the file and what is wrong with it.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/dir_lock.h"
#include "core/tensor.h"

namespace ztrain::checkpoint {

enum class Kind { kParam, kExpAvg, kExpAvgSq };
const char* KindName(Kind kind);  // "param", "exp_avg", "exp_avg_sq"

// A run of whole-parameter elements: [begin, begin + count).
struct Run {
  int64_t begin = 0;
  int64_t count = 0;
};

std::string StepName(int64_t step);  // "step<N>"
inline constexpr char kMetaFile[] = "meta.json";
inline constexpr int kCheckpointVersion = 2;  // 2: meta.json carries meta_crc32c
inline constexpr char kLatestFile[] = "latest";
std::string RankFileName(int rank);  // "rank<R>.bin"

// Writes one rank file: entries are appended as they come (their data streamed to the file),
// then Finish writes the index and the trailer, fsyncs and renames the file into place.
class ShardWriter {
 public:
  explicit ShardWriter(std::string path);
  ~ShardWriter();  // an unfinished file is removed
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Appends `data`, the elements of `runs` (in order) of parameter `name` (whole shape
  // `full_shape`).
  void Add(const std::string& name, Kind kind, const Shape& full_shape, std::vector<Run> runs,
           const float* data);
  struct Result {
    int64_t bytes = 0;
    uint32_t crc = 0;  // CRC-32C of the whole file
  };
  Result Finish();

 private:
  void Write(const void* data, size_t bytes);

  std::string path_, tmp_;
  int fd_ = -1;
  int64_t offset_ = 0;
  uint32_t crc_ = 0;
  nlohmann::json entries_ = nlohmann::json::array();
};

// The rank files of one checkpoint, opened for reading whole-parameter elements.
class ModelIndex {
 public:
  // Opens every rank file `meta` lists in `dir` and reads their indexes (not their data).
  ModelIndex(const std::string& dir, const nlohmann::json& meta);
  ~ModelIndex();
  ModelIndex(const ModelIndex&) = delete;
  ModelIndex& operator=(const ModelIndex&) = delete;

  // Copies elements [begin, begin + count) of `name`'s `kind` into `out`. Throws IoError
  // naming the checkpoint, the parameter and the elements when the files do not hold them.
  void Read(const std::string& name, Kind kind, int64_t begin, int64_t count, float* out) const;
  // The whole shape of every parameter, in the order the files list them.
  const std::vector<std::pair<std::string, Shape>>& parameters() const { return parameters_; }

 private:
  struct Segment {
    int64_t begin, count;  // whole-parameter elements
    int file;
    int64_t offset;  // byte offset of `begin`'s value in the file
  };
  std::string dir_;
  std::vector<int> fds_;
  std::vector<std::string> paths_;
  std::map<std::pair<std::string, Kind>, std::vector<Segment>> segments_;  // sorted by begin
  std::vector<std::pair<std::string, Shape>> parameters_;
};

// meta.json of the checkpoint in `dir`; IoError when it is missing, not valid or its checksum
// does not match (an edited or corrupt file).
nlohmann::json ReadMeta(const std::string& dir);
// Writes `meta` with its meta_crc32c as dir/meta.json (temporary name, fsync, rename).
void WriteMeta(const std::string& dir, const nlohmann::json& meta);

// Checks rank files `first`, `first + stride`, ... of the checkpoint in `dir` against meta:
// present, of the recorded size, with the recorded CRC-32C. Returns "" or what is wrong,
// naming the file ("rank1.bin: checksum 0x1234abcd, meta.json says 0x9f00aa12 (the file is
// corrupt)").
std::string VerifyFiles(const std::string& dir, const nlohmann::json& meta, int first, int stride);

// The step directories under `root` that have a meta.json, newest (highest step) first.
std::vector<int64_t> ListSteps(const std::string& root);
// The step `latest` names, or -1 when there is no latest file, or when it holds anything but
// step<N> (then `problem`, when given, says what it holds).
int64_t ReadLatest(const std::string& root, std::string* problem = nullptr);
// Note [Choosing a checkpoint]: the steps a resume from latest (or an export of checkpoint.dir)
// tries, in order: the one `latest` names, then every other step directory with a meta.json,
// newest first. A `latest` that is garbage or names a step that is gone is described in
// *latest_problem and skipped, as a corrupt checkpoint is.
std::vector<int64_t> ResumeCandidates(const std::string& root, std::string* latest_problem);
// What an explicit resume of `root` that holds no checkpoint is told (train --resume and
// check-config --resume alike).
std::string NothingToResume(const std::string& root);
// Points `latest` at step<N> (temporary file, fsync, rename, fsync of the directory).
void WriteLatest(const std::string& root, int64_t step);
// Removes all but the `keep` newest step directories, and leftover partial ones; never the
// one `latest` names, and never one whose meta.json `ours` (when given) says is another
// model's (Note [Config changes on resume]): those are kept, and not counted.
void Prune(const std::string& root, int keep,
           const std::function<bool(const nlohmann::json& meta)>& ours = nullptr);

// Makes `root` (a checkpoint.dir) and takes its lock (DirLock, core/dir_lock.h) for `job`:
// ConfigError naming the run that holds it when another live process does.
std::unique_ptr<DirLock> LockDirectory(const std::string& root, const std::string& job);
// The live run holding `root`'s lock ("pid 42 on host h since ..."), or "" when none does;
// asked without taking the lock.
std::string DirectoryHolder(const std::string& root);

// fsync of a directory, so renames inside it survive a crash.
void SyncDirectory(const std::string& dir);

}  // namespace ztrain::checkpoint
