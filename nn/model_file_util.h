#pragma once
// File helpers shared by the model file readers and writers in nn/ (llm.c model files,
// safetensors). Internal: not part of the public API.
//
// Note [atomic model files]: a model file is written to "<path>.tmp" in the same directory,
// fsynced, closed (close can report a delayed write error) and only then renamed onto
// <path>. rename() within one directory is atomic, so a reader, or a crash at any point,
// sees either the previous file or the complete new one, never a partial model under the
// final name. The directory itself is not fsynced: after a crash the rename may be lost,
// which leaves the old file, not a broken one.
//
// Both classes own a file descriptor (move-only in spirit: not copyable) and are not thread
// safe. Every failure is an IoError naming the file and the OS error.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace ztrain::nn::detail {

// A JSON object from `path` (IoError naming `what` and the path when it cannot be read or is
// no object), and one written atomically (Note [atomic model files]), indented.
nlohmann::json ParseJsonFile(const std::string& path, const char* what);
void WriteJsonFile(const std::string& path, const nlohmann::json& j);

class AtomicFileWriter {
 public:
  // Creates "<path>.tmp"; `what` names the kind of file in errors ("model file").
  AtomicFileWriter(std::string path, std::string what);
  // Removes the temporary file unless Commit() succeeded.
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void Write(const void* data, size_t bytes);
  // fsync, close and rename onto the final path (Note [atomic model files]).
  void Commit();

 private:
  std::string path_, tmp_, what_;
  int fd_ = -1;
  bool committed_ = false;
};

// A file opened for positioned reads.
class InputFile {
 public:
  InputFile(const std::string& path, std::string what);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  int64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Reads exactly `bytes` bytes at `offset`; false when the file ends first.
  bool ReadAt(int64_t offset, void* dst, size_t bytes) const;

 private:
  std::string path_, what_;
  int fd_ = -1;
  int64_t size_ = 0;
};

}  // namespace ztrain::nn::detail
