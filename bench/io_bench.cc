// io_bench: sequential write and read of one file through SwapFile, on the io_uring engine and
// on the pread/pwrite fallback, against fio measured in the same run on the same directory
// with the same pattern (target: ztrain >= 0.9x fio).
//
//   io_bench [--dir DIR] [--size-mib N] [--block-kib K] [--queue-depth Q] [--reps R]
//
// Defaults: 1024 MiB in the current directory, 1 MiB pieces, queue depth 8, best of 3 runs
// after a warm-up. Every run uses O_DIRECT (fio: --direct=1), so the page cache plays no part,
// and overwrites a file already written once (fallocate'd extents cost extra on first write).
// The io_uring engine is compared with fio --ioengine=io_uring --iodepth=Q, the one-thread
// fallback with fio --ioengine=psync (one blocking call at a time); ztrain and fio alternate
// run by run, since a disk's speed drifts, and the bench prints both the ratio of the bests and
// the median of the paired ratios (each ztrain pass over the fio pass right after it).
// ztrain's io_uring buffer is registered with the ring, as the swappers' are. The files are
// deleted at the end. Run on an idle disk; on tmpfs the figures measure memory, not a disk.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "core/allocator.h"
#include "core/logging.h"
#include "core/memory_tracker.h"
#include "offload/io/io_buffer.h"
#include "offload/io/io_engine.h"
#include "offload/io/swap_file.h"

namespace ztrain::bench {
namespace {

using offload::IoBuffer;
using offload::IoEngine;
using offload::IoOptions;
using offload::IoWorkPtr;
using offload::SwapFile;

struct Args {
  std::string dir = ".";
  int64_t size_mib = 1024;
  int64_t block_kib = 1024;
  int queue_depth = 8;
  int reps = 3;
};

struct Rates {  // GB/s; < 0 when not measured
  double write = -1;
  double read = -1;
};

bool ParseArgs(int argc, char** argv, Args* a) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--dir") {
      a->dir = v;
    } else if (k == "--size-mib") {
      a->size_mib = std::atoll(v.c_str());
    } else if (k == "--block-kib") {
      a->block_kib = std::atoll(v.c_str());
    } else if (k == "--queue-depth") {
      a->queue_depth = std::atoi(v.c_str());
    } else if (k == "--reps") {
      a->reps = std::atoi(v.c_str());
    } else {
      return false;
    }
  }
  return argc % 2 == 1 && a->size_mib > 0 && a->block_kib > 0 && a->block_kib % 4 == 0 &&
         a->queue_depth > 0 && a->reps > 0;
}

// One engine and one file, written and read whole in requests of one buffer each, all issued
// at once: the engine keeps queue_depth pieces of block_size in flight, in file order, as fio
// does. The buffer is queue_depth x block_size, the memory fio cycles through, so that both
// touch the same amount of memory (it matters where the copy goes through the CPU caches:
// tmpfs, or a virtual disk).
class ZtrainRun {
 public:
  ZtrainRun(const Args& a, bool fallback)
      : bytes_(a.size_mib << 20),
        path_(a.dir + (fallback ? "/io_bench_posix.swap" : "/io_bench_uring.swap")) {
    IoOptions o;
    o.block_size = a.block_kib << 10;
    o.queue_depth = a.queue_depth;
    o.force_fallback = fallback;
    engine_ = IoEngine::Make(o);
    buf_ = IoBuffer(allocator_, std::min<int64_t>(bytes_, o.queue_depth * o.block_size));
    buf_.Register(*engine_);  // as the swappers do; the fallback keeps it plain
    std::mt19937_64 rng(1);
    for (int64_t i = 0; i + 8 <= buf_.capacity(); i += 8) {
      const uint64_t r = rng();
      std::memcpy(buf_.data() + i, &r, 8);
    }
    file_ = SwapFile::Create(*engine_, path_, bytes_);
    Pass(false);  // first write into fallocate'd extents converts them; measure overwrites
  }
  ~ZtrainRun() {
    file_.reset();
    unlink(path_.c_str());
  }
  std::string backend() const {
    return engine_->backend() + (buf_.registered() ? ", registered buffer" : "");
  }
  // GB/s of one pass.
  double Pass(bool read) {
    Timer t;
    std::vector<IoWorkPtr> work;
    const int64_t chunk = buf_.capacity();
    for (int64_t off = 0; off < bytes_; off += chunk) {
      const int64_t n = std::min(chunk, bytes_ - off);
      work.push_back(read ? file_->Read(off, buf_, n) : file_->Write(off, buf_, n));
    }
    for (IoWorkPtr& w : work) w->Wait();
    return GBs(static_cast<double>(bytes_), t.Seconds());
  }

 private:
  int64_t bytes_;
  std::string path_;
  MemoryTracker tracker_;
  HostAllocator allocator_{&tracker_};
  std::unique_ptr<IoEngine> engine_;
  IoBuffer buf_;
  std::unique_ptr<SwapFile> file_;
};

// One fio job's bandwidth in GB/s, or < 0 with *error set.
double RunFio(const Args& a, const std::string& engine, const std::string& rw, std::string* error) {
  return FioGBs("--name=io_bench --ioengine=" + engine + " --direct=1 --bs=" +
                    std::to_string(a.block_kib) + "k --iodepth=" +
                    std::to_string(engine == "psync" ? 1 : a.queue_depth) +
                    " --size=" + std::to_string(a.size_mib) + "m --filename=" + a.dir +
                    "/io_bench_fio_" + engine + ".dat",
                rw, error);
}


void Row(const char* name, Rates r, Rates ref) {
  std::printf("  %-34s %7.2f GB/s %7.2f GB/s", name, r.write, r.read);
  if (ref.write > 0 && ref.read > 0) {
    std::printf("   %5.2fx  %5.2fx", r.write / ref.write, r.read / ref.read);
  }
  std::printf("\n");
}

}  // namespace
}  // namespace ztrain::bench

int main(int argc, char** argv) {
  using namespace ztrain::bench;
  Args a;
  if (!ParseArgs(argc, argv, &a)) {
    std::fprintf(stderr,
                 "usage: io_bench [--dir DIR] [--size-mib N] [--block-kib K (multiple of 4)] "
                 "[--queue-depth Q] [--reps R]\n");
    return 2;
  }
  ztrain::SetLogLevel("warn");
  const std::string fs = FileSystemName(a.dir);
  std::printf(
      "io_bench: %lld MiB sequential in %s (%s), %lld KiB pieces, queue depth %d, O_DIRECT, "
      "best of %d runs after a warm-up\n",
      static_cast<long long>(a.size_mib), a.dir.c_str(), fs.c_str(),
      static_cast<long long>(a.block_kib), a.queue_depth, a.reps);
  if (fs == "tmpfs") std::printf("  note: tmpfs holds files in memory; this is not a disk\n");
  struct Cleanup {  // fio's files, whatever happens
    std::string dir;
    ~Cleanup() {
      for (const char* e : {"io_uring", "psync"}) {
        unlink((dir + "/io_bench_fio_" + std::string(e) + ".dat").c_str());
      }
    }
  } cleanup{a.dir};
  try {
    // The disk's speed drifts (shared virtual disks more than most), so ztrain and fio
    // alternate run by run and each figure is the best of its runs.
    ZtrainRun uring(a, false), posix(a, true);
    std::string fio_error = HaveFio() ? "" : "fio not installed (apt-get install fio)";
    const bool fio = fio_error.empty();
    if (fio) {  // warm-up: lays the files out
      RunFio(a, "io_uring", "write", &fio_error);
      RunFio(a, "psync", "write", &fio_error);
    }
    // Per pass: ztrain's and fio's rates, measured back to back.
    std::vector<double> zu[2], fu[2], zp[2], fp[2];  // [write, read]
    for (const bool read : {false, true}) {
      const char* rw = read ? "read" : "write";
      for (int r = 0; r < a.reps; ++r) {
        zu[read].push_back(uring.Pass(read));
        if (fio && fio_error.empty()) fu[read].push_back(RunFio(a, "io_uring", rw, &fio_error));
        zp[read].push_back(posix.Pass(read));
        if (fio && fio_error.empty()) fp[read].push_back(RunFio(a, "psync", rw, &fio_error));
      }
    }
    auto best = [](const std::vector<double>* v) {
      Rates r;
      for (int rw = 0; rw < 2; ++rw) {
        double& slot = rw ? r.read : r.write;
        for (double x : v[rw]) slot = std::max(slot, x);
      }
      return r;
    };
    std::printf("  %-34s %12s %12s   %s\n", "", "write", "read", "ztrain/fio (write, read)");
    Row("fio io_uring", best(fu), {});
    Row("ztrain io_uring", best(zu), best(fu));
    Row("fio psync (1 call at a time)", best(fp), {});
    Row("ztrain pread/pwrite, 1 thread", best(zp), best(fp));
    if (fio && fio_error.empty()) {
      std::printf("  median of paired passes: io_uring %.2fx write %.2fx read, "
                  "pread/pwrite %.2fx write %.2fx read\n",
                  PairedMedianRatio(zu[0], fu[0]), PairedMedianRatio(zu[1], fu[1]),
                  PairedMedianRatio(zp[0], fp[0]), PairedMedianRatio(zp[1], fp[1]));
    }
    std::printf("  ztrain backends: %s | %s\n", uring.backend().c_str(), posix.backend().c_str());
    if (!fio_error.empty()) std::printf("  fio: %s\n", fio_error.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "io_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
