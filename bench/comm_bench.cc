// ztrain's AllReduce and ReduceScatter against a plain blocking MPI call of the same size in
// the same run (target: ztrain >= 0.9x MPI). Run under mpirun, e.g.
//   mpirun -np 2 build/bench/comm_bench
// Bandwidth is bus bandwidth as NCCL reports it: all-reduce moves 2(N-1)/N of the buffer
// per rank, reduce-scatter (N-1)/N. Each figure is the best of several trials; a trial's
// time is the slowest rank's, and the two implementations alternate trial by trial.
#include <malloc.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include "bench/bench_util.h"
#include "parallel/comm/comm_util.h"
#include "parallel/comm/mpi/mpi_communicator.h"

namespace ztrain::bench {
namespace {

constexpr int kTrials = 5;
constexpr size_t kBytesPerTrial = size_t{256} << 20;

// Seconds per op of `iters` back-to-back runs of `op`, slowest rank.
double TimeOps(MPI_Comm comm, int iters, const std::function<void()>& op) {
  MPI_Barrier(comm);
  Timer timer;
  for (int i = 0; i < iters; ++i) op();
  double seconds = timer.Seconds() / iters;
  MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, comm);
  return seconds;
}

struct Pair {
  double ztrain = 1e30;
  double mpi = 1e30;
};

Pair Compare(MPI_Comm comm, size_t bytes, const std::function<void()>& ztrain_op,
             const std::function<void()>& mpi_op) {
  const int iters = static_cast<int>(std::max<size_t>(2, kBytesPerTrial / bytes));
  ztrain_op();  // warm-up: pages, MPI connections
  mpi_op();
  Pair best;
  for (int t = 0; t < kTrials; ++t) {
    best.ztrain = std::min(best.ztrain, TimeOps(comm, iters, ztrain_op));
    best.mpi = std::min(best.mpi, TimeOps(comm, iters, mpi_op));
  }
  return best;
}

void Report(int rank, const char* op, size_t bytes, double bus_bytes, Pair t) {
  if (rank != 0) return;
  const double z = GBs(bus_bytes, t.ztrain), m = GBs(bus_bytes, t.mpi);
  std::printf("%-14s %6zu MiB   ztrain %7.2f GB/s   MPI %7.2f GB/s   ratio %.2fx\n", op,
              bytes >> 20, z, m, z / m);
}

int Run() {
  auto world = comm::MakeMpiWorld(std::chrono::minutes(2));
  const int n = world->size(), rank = world->rank();
  MPI_Comm ref;  // the plain-MPI side gets its own communicator, as ztrain has
  MPI_Comm_dup(MPI_COMM_WORLD, &ref);
  if (rank == 0) {
    std::printf("comm_bench: %d ranks, bus bandwidth, best of %d trials\n", n, kTrials);
  }
  for (size_t mib = 1; mib <= 64; mib *= 2) {
    const size_t bytes = mib << 20;
    const int64_t count = static_cast<int64_t>(bytes / sizeof(float)) / n * n;
    FloatArray buf(count), shard(count / n);
    const Tensor t(buf.data(), DType::kF32, {count});
    const Tensor s(shard.data(), DType::kF32, {count / n});
    const double ar_bus = comm::detail::BusBytes(comm::OpKind::kAllReduce, count * 4, n);
    Report(rank, "AllReduce", bytes, ar_bus,
           Compare(
               ref, bytes, [&] { world->AllReduce(t)->Wait(); },
               [&] {
                 MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(count), MPI_FLOAT,
                               MPI_SUM, ref);
               }));
    const double rs_bus = comm::detail::BusBytes(comm::OpKind::kReduceScatter, count * 4, n);
    Report(rank, "ReduceScatter", bytes, rs_bus,
           Compare(
               ref, bytes, [&] { world->ReduceScatter(t, s)->Wait(); },
               [&] {
                 MPI_Reduce_scatter_block(buf.data(), shard.data(), static_cast<int>(count / n),
                                          MPI_FLOAT, MPI_SUM, ref);
               }));
  }
  MPI_Comm_free(&ref);
  return 0;
}

}  // namespace
}  // namespace ztrain::bench

int main() {
  // MPI's blocking collectives malloc and free a full-size temporary per call; glibc hands
  // blocks that large back to the OS, so every call page-faults them in again, which in a VM
  // costs MPI up to 50x. Keeping freed memory in the heap gives the reference its best case
  // (ztrain reuses one scratch buffer and is unaffected).
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  return ztrain::bench::Run();
}
