// checkpoint_bench: checkpoint write (Checkpointer::Save) and read (Checkpointer::Resume) in
// GB/s against fio measured in the same run on the same directory with the same pattern.
//
//   checkpoint_bench [--dir DIR] [--model small|124m] [--reps R]
//
// One process, ZeRO stage 0, a GPT-2 trained one step so Adam's m and v are not zero:
// "small" (8 layers, 512 wide, vocab 50257 padded to 50304: ~51M parameters, a ~620 MB
// checkpoint of fp32 values, m and v) or "124m" (GPT-2 124M: ~1.5 GB). Checkpoints go to
// DIR/ckpt_bench/ (keep_last 1), fio's file and a ballast file next to them (~3x the
// checkpoint's size in all); the directory is removed at the end, on error too.
//
// Write: Save(step) creates rank0.bin with one buffered write() per entry (the embedding's
// is 100 MB, a LayerNorm's 2 KB), fsyncs it, writes meta.json and `latest` (fsync'ed and
// renamed), and fsyncs the directories. Reference: fio --rw=write --ioengine=psync
// --direct=0 --bs=8m --end_fsync=1 --fallocate=none (ztrain does not fallocate) into a new
// file of the checkpoint's size rounded up to 8 MiB: buffered writes and the flush to disk,
// as ztrain does; fio's runtime includes the final fsync. Each deletes its previous file
// first (untimed), so neither pays for an unlink or overwrites an old file.
//
// Read: Resume("latest") on a second engine of the same config. It checks rank0.bin's
// CRC-32C (reading the whole file in 8 MiB preads, as fio does), then reads every element the
// engine holds (the file again, from the page cache the first read filled). Before it the
// checkpoint's files are dropped from the page cache (posix_fadvise DONTNEED, the pages being
// clean after the fsyncs; no root needed), so the first read comes from the disk. Reference:
// fio --rw=read --ioengine=psync --direct=0 --bs=8m --invalidate=1 (which drops the cache the
// same way). Resume's GB/s counts the checkpoint's bytes once; the "2 reads" figure counts
// them twice. A breakdown pass then times the two halves alone: the CRC check from a cold
// cache, the load after it (warm, as in Resume), and the load alone from a cold cache.
//
// Every timed pass starts with the same memory just freed (Note [The same fresh memory for
// every pass]). ztrain and fio alternate pass by pass (a disk's speed drifts), and so
// does which of the two goes first; printed are every pass, the best of each and the median
// of the paired ratios (each ztrain pass over the fio pass of the same pair). At the end the
// second engine's parameters are compared bit for bit with the first's.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "core/logging.h"
#include "engine/engine.h"
#include "nn/gpt2.h"
#include "run/checkpointer.h"

namespace ztrain::bench {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kFioBlock = int64_t{8} << 20;  // fio --bs=8m; VerifyFiles reads 8 MiB too

struct Args {
  std::string dir = ".";
  std::string model = "small";
  int reps = 3;
};

bool ParseArgs(int argc, char** argv, Args* a) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--dir") {
      a->dir = v;
    } else if (k == "--model") {
      a->model = v;
    } else if (k == "--reps") {
      a->reps = std::atoi(v.c_str());
    } else {
      return false;
    }
  }
  return argc % 2 == 1 && (a->model == "small" || a->model == "124m") && a->reps > 0;
}

Config MakeConfig(const Args& a, const std::string& root) {
  const bool small = a.model == "small";
  nlohmann::json j = DefaultConfigJson();
  j["model"] = {{"type", "gpt2"},           {"n_layer", small ? 8 : 12},
                {"n_head", small ? 8 : 12}, {"n_embd", small ? 512 : 768},
                {"vocab_size", 50257},      {"padded_vocab_size", 50304},
                {"max_seq_len", 1024}};
  j["data"] = {{"seq_len", 64}};
  j["train_micro_batch_size_per_gpu"] = 2;
  j["gradient_accumulation_steps"] = 1;
  j.erase("train_batch_size");
  j["checkpoint"]["dir"] = root;
  j["checkpoint"]["keep_last"] = 1;
  return ParseConfig(j, 1);
}

struct Batch {
  std::vector<int32_t> tokens, targets;
  nn::MicroBatch mb;
  Batch(int64_t b, int64_t t) : tokens(b * t), targets(b * t) {
    std::mt19937 rng(1);
    std::uniform_int_distribution<int> tok(0, 50256);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = tok(rng), targets[i] = tok(rng);
    mb.tokens = Tensor(tokens.data(), DType::kI32, {b, t});
    mb.targets = Tensor(targets.data(), DType::kI32, {b, t});
  }
};

// Reads `path` whole through `buffer` (into the page cache, where it is not already).
void ReadWhole(const std::string& path, std::vector<char>& buffer) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ZTRAIN_CHECK(fd >= 0, "cannot open ", path, ": ", std::strerror(errno));
  while (::read(fd, buffer.data(), buffer.size()) > 0) {
  }
  ::close(fd);
}

// Drops `path` from the page cache. Its pages must be clean (fsync'ed): DONTNEED leaves
// dirty pages where they are.
void DropFromCache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ZTRAIN_CHECK(fd >= 0, "cannot open ", path, ": ", std::strerror(errno));
  const int ret = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  ZTRAIN_CHECK(ret == 0, "posix_fadvise(DONTNEED) failed on ", path);
}

// The fraction of `path`'s pages in the page cache (mincore), to show the drop worked.
double ResidentFraction(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  const size_t bytes = fs::file_size(path), page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return -1;
  std::vector<unsigned char> in((bytes + page - 1) / page);
  const bool ok = ::mincore(map, bytes, in.data()) == 0;
  ::munmap(map, bytes);
  if (!ok) return -1;
  const auto resident = std::count_if(in.begin(), in.end(), [](unsigned char c) { return c & 1; });
  return static_cast<double>(resident) / static_cast<double>(in.size());
}

int64_t DirectoryBytes(const std::string& dir) {
  int64_t bytes = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file()) bytes += static_cast<int64_t>(e.file_size());
  }
  return bytes;
}

// One fio job's bandwidth in GB/s, or < 0 with *error set.
double RunFio(const std::string& rw, const std::string& path, int64_t bytes, std::string* error) {
  const std::string pattern = rw == "write" ? " --end_fsync=1 --fallocate=none" : " --invalidate=1";
  return FioGBs("--name=checkpoint_bench --ioengine=psync --direct=0 --bs=" +
                    std::to_string(kFioBlock >> 20) + "m --size=" + std::to_string(bytes) +
                    pattern + " --filename=" + path,
                rw, error);
}

double Best(const std::vector<double>& v) {
  return v.empty() ? -1.0 : *std::max_element(v.begin(), v.end());
}

// The two engines and their checkpointers: `saver` trained one step, `loader` resumes.
struct Bench {
  Args args;
  std::string root, fio_file, ballast;
  Config config;
  std::unique_ptr<Engine> saver, loader;
  std::unique_ptr<Checkpointer> save_ck, load_ck;
  int64_t bytes = 0;  // the checkpoint's files (rank0.bin + meta.json)
  std::vector<char> buffer = std::vector<char>(kFioBlock);

  std::string StepDir() const { return root + "/" + checkpoint::StepName(saver->step()); }

  // Note [The same fresh memory for every pass]: each timed pass starts right after the
  // bench has read the ballast file (the checkpoint's size, written in 8 MiB pieces) into the
  // page cache and dropped it again, so every pass fills its page cache pages from the same
  // memory, just freed. In a VM that hands idle memory back to its host (free page
  // reporting), memory freed a second or more ago is slow to touch again: here buffered
  // write() copied into the page cache at 0.4-0.8 GB/s from such memory and at 5-7 GB/s from
  // pages freed just before, while the fsync of 620 MB took a steady ~0.4 s, so which kind a
  // pass got decided the figure (fio, whose file an earlier cache drop had left uncached, ran
  // 2-3x slower than Save). A pass's own old file will not do: Save's file is cached in small
  // folios (its entries start at unaligned offsets), fio's in large ones, and a cold read
  // into large folios cannot reuse the small ones at once. On bare metal none of this matters.
  void FreshMemory() {
    if (!fs::exists(ballast)) return;  // the warm-up, before the checkpoint's size is known
    ReadWhole(ballast, buffer);
    DropFromCache(ballast);
  }
  void WriteBallast() {
    const int fd = ::open(ballast.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ZTRAIN_CHECK(fd >= 0, "cannot create ", ballast, ": ", std::strerror(errno));
    std::mt19937 rng(1);
    for (char& c : buffer) c = static_cast<char>(rng());
    bool ok = true;
    for (int64_t at = 0; ok && at < bytes; at += kFioBlock) {
      ok = ::write(fd, buffer.data(), buffer.size()) == static_cast<ssize_t>(buffer.size());
    }
    ok = ok && ::fsync(fd) == 0;
    ::close(fd);
    ZTRAIN_CHECK(ok, "cannot write ", ballast, ": ", std::strerror(errno));
  }
  // The files of every step directory: the checkpoint.
  std::vector<std::string> CheckpointFiles() const {
    std::vector<std::string> files;
    for (const auto& d : fs::directory_iterator(root)) {
      if (!d.is_directory()) continue;
      for (const auto& e : fs::directory_iterator(d.path())) files.push_back(e.path());
    }
    return files;
  }
  // Drops the checkpoint from the page cache (for a cold read).
  void DropCheckpoint() const {
    for (const std::string& f : CheckpointFiles()) DropFromCache(f);
  }
  // Seconds of one Save into a new directory, as after training steps.
  double Save() {
    for (const auto& d : fs::directory_iterator(root)) {
      if (d.is_directory()) fs::remove_all(d.path());
    }
    FreshMemory();
    Timer t;
    save_ck->Save(saver->step(), {});
    return t.Seconds();
  }
  // Seconds of one Resume from a cold cache.
  double Resume() {
    DropCheckpoint();
    FreshMemory();
    Timer t;
    const ResumePoint p = load_ck->Resume("latest");
    const double s = t.Seconds();
    ZTRAIN_CHECK(p.step == saver->step(), "resumed step ", p.step, ", saved ", saver->step());
    return s;
  }
  // fio's GB/s writing a new file, or reading it from a cold cache; < 0 with *error set.
  double Fio(const std::string& rw, int64_t fio_bytes, std::string* error) {
    if (rw == "write") fs::remove(fio_file);
    if (rw == "read" && fs::exists(fio_file)) DropFromCache(fio_file);
    FreshMemory();
    return RunFio(rw, fio_file, fio_bytes, error);
  }
  struct Parts {
    double verify, load_warm, load_cold;
  };
  // Resume's halves alone: the CRC check (cold), the load after it, the load from cold.
  Parts TimeParts() {
    const std::string dir = StepDir();
    const nlohmann::json meta = checkpoint::ReadMeta(dir);
    auto load = [&] {
      Timer t;
      checkpoint::ModelIndex index(dir, meta);
      loader->LoadState(index, saver->step());
      return t.Seconds();
    };
    Parts p{};
    DropCheckpoint();
    FreshMemory();
    Timer t;
    const std::string bad = checkpoint::VerifyFiles(dir, meta, 0, 1);
    p.verify = t.Seconds();
    ZTRAIN_CHECK(bad.empty(), "verify failed: ", bad);
    p.load_warm = load();
    DropCheckpoint();
    FreshMemory();
    p.load_cold = load();
    return p;
  }
  // The loader's parameters against the saver's, bit for bit; "" or the first that differs.
  std::string CompareParameters() const {
    for (const std::string& name : saver->ParameterNames()) {
      const Tensor a = saver->Parameter(name), b = loader->Parameter(name);
      if (a.nbytes() != b.nbytes() || std::memcmp(a.data(), b.data(), a.nbytes()) != 0) {
        return name;
      }
    }
    return "";
  }
};

struct Passes {
  std::vector<double> zw, fw, zr, fr;  // GB/s per pass: ztrain / fio, write / read
  std::vector<double> resume_s, verify_s, load_warm_s, load_cold_s;
};

// `reps` passes of: ztrain's write and fio's, then ztrain's read and fio's, each pair run back
// to back, ztrain first in odd passes and fio first in even ones, each from the same state
// (Note [The same fresh memory for every pass]).
Passes Measure(Bench& b, int64_t fio_bytes, std::string* fio_error) {
  const double gb = static_cast<double>(b.bytes) * 1e-9;
  Passes p;
  auto fio = [&](const char* rw, std::vector<double>& out) {
    if (!fio_error->empty()) return;
    const double rate = b.Fio(rw, fio_bytes, fio_error);
    if (fio_error->empty()) out.push_back(rate);
  };
  auto ztrain_write = [&] { p.zw.push_back(gb / b.Save()); };
  auto ztrain_read = [&] {
    p.resume_s.push_back(b.Resume());
    p.zr.push_back(gb / p.resume_s.back());
  };
  for (int r = 0; r < b.args.reps; ++r) {
    if (r % 2 == 0) ztrain_write(), fio("write", p.fw);
    if (r % 2 == 1) fio("write", p.fw), ztrain_write();
    if (r % 2 == 0) ztrain_read(), fio("read", p.fr);
    if (r % 2 == 1) fio("read", p.fr), ztrain_read();
    const Bench::Parts parts = b.TimeParts();
    p.verify_s.push_back(parts.verify);
    p.load_warm_s.push_back(parts.load_warm);
    p.load_cold_s.push_back(parts.load_cold);
  }
  return p;
}

void PrintResults(const Bench& b, const Passes& p, const std::string& fio_error) {
  const double gb = static_cast<double>(b.bytes) * 1e-9;
  auto rate = [](const std::vector<double>& v, size_t i) {
    char s[32] = "    n/a";
    if (i < v.size()) std::snprintf(s, sizeof s, "%.3f GB/s", v[i]);
    return std::string(s);
  };
  std::printf("  pass  ztrain write   fio write  ztrain read    fio read\n");
  for (size_t i = 0; i < p.zw.size(); ++i) {
    std::printf("  %4zu %12s %11s %12s %11s\n", i + 1, rate(p.zw, i).c_str(), rate(p.fw, i).c_str(),
                rate(p.zr, i).c_str(), rate(p.fr, i).c_str());
  }
  std::printf("  %-36s %10s %10s   %s\n", "best of passes", "write", "read",
              "ztrain/fio (write, read)");
  const bool fio = !p.fw.empty() && !p.fr.empty();
  if (fio) {
    std::printf("  %-36s %5.3f GB/s %5.3f GB/s\n", "fio psync 8 MiB buffered", Best(p.fw),
                Best(p.fr));
  }
  std::printf("  %-36s %5.3f GB/s %5.3f GB/s", "ztrain Save / Resume", Best(p.zw), Best(p.zr));
  if (fio) std::printf("   %5.2fx  %5.2fx", Best(p.zw) / Best(p.fw), Best(p.zr) / Best(p.fr));
  std::printf("\n");
  if (fio) {
    std::printf("  median of paired passes: write %.2fx, read %.2fx\n", PairedMedianRatio(p.zw, p.fw),
                PairedMedianRatio(p.zr, p.fr));
  }
  const double resume = Median(p.resume_s);
  std::printf(
      "  Resume reads the checkpoint twice (CRC-32C check, then the load): counting 2 x %.0f "
      "MB, median %.3f s = %.3f GB/s effective\n",
      gb * 1e3, resume, 2 * gb / resume);
  const double verify = Median(p.verify_s), warm = Median(p.load_warm_s),
               cold = Median(p.load_cold_s);
  std::printf(
      "  Resume's parts alone (medians): CRC check from cold cache %.3f s (%.3f GB/s), load "
      "after it %.3f s (%.3f GB/s, from the page cache), load from cold cache %.3f s (%.3f "
      "GB/s)\n",
      verify, gb / verify, warm, gb / warm, cold, gb / cold);
  if (!fio_error.empty()) std::printf("  fio: %s\n", fio_error.c_str());
}

int Run(const Args& a) {
  Bench b;
  b.args = a;
  b.root = a.dir + "/ckpt_bench";
  b.fio_file = b.root + "/fio.dat";
  b.ballast = b.root + "/ballast.dat";
  fs::remove_all(b.root);
  fs::create_directories(b.root);
  struct Cleanup {  // everything the bench wrote, whatever happens
    std::string root;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(root, ec);
    }
  } cleanup{b.root};
  b.config = MakeConfig(a, b.root);
  b.saver = std::make_unique<Engine>(b.config, nn::BuildGpt2(b.config.model));
  b.loader = std::make_unique<Engine>(b.config, nn::BuildGpt2(b.config.model));
  const Batch batch(2, 64);
  b.saver->TrainStep({&batch.mb, 1});  // m and v not zero
  b.save_ck = std::make_unique<Checkpointer>(b.config, *b.saver, nullptr);
  b.load_ck = std::make_unique<Checkpointer>(b.config, *b.loader, nullptr);
  // Warm-up: first touch of the loader's buffers, the checkpoint's size, fio's first file.
  b.Save();
  b.Resume();
  b.bytes = DirectoryBytes(b.StepDir());
  b.WriteBallast();
  b.DropCheckpoint();
  const double resident = ResidentFraction(b.StepDir() + "/" + checkpoint::RankFileName(0));
  const int64_t fio_bytes = (b.bytes + kFioBlock - 1) / kFioBlock * kFioBlock;
  std::string fio_error = HaveFio() ? "" : "fio not installed (apt-get install fio)";
  if (fio_error.empty()) b.Fio("write", fio_bytes, &fio_error);
  std::printf(
      "checkpoint_bench: GPT-2 %s, %lld parameters, checkpoint %.0f MB (fp32 values, Adam m, "
      "v) in %s (%s); fio file %.0f MB; ztrain and fio alternate, %d passes after a warm-up\n"
      "  page cache after a drop: %.1f%% of rank0.bin resident\n",
      a.model.c_str(), static_cast<long long>(b.saver->NumParameters()), b.bytes * 1e-6,
      b.root.c_str(), FileSystemName(a.dir).c_str(), fio_bytes * 1e-6, a.reps, resident * 100);
  const Passes p = Measure(b, fio_bytes, &fio_error);
  PrintResults(b, p, fio_error);
  const std::string differs = b.CompareParameters();
  ZTRAIN_CHECK(differs.empty(), "the resumed engine's ", differs, " differs from the saved one");
  std::printf("  resumed parameters equal the saved ones bit for bit; %s is removed on exit\n",
              b.root.c_str());
  return 0;
}

}  // namespace
}  // namespace ztrain::bench

int main(int argc, char** argv) {
  using namespace ztrain::bench;
  Args a;
  if (!ParseArgs(argc, argv, &a)) {
    std::fprintf(stderr, "usage: checkpoint_bench [--dir DIR] [--model small|124m] [--reps R]\n");
    return 2;
  }
  ztrain::SetLogLevel("warn");
  try {
    return Run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_bench: %s\n", e.what());
    return 1;
  }
}
