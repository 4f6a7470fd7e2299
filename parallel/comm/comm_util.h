#pragma once
// Pieces every Communicator backend shares: the byte-accounting formulas, argument checks
// with messages that name the op, group names, and an already-finished Work.
//
// Pure functions (no state), thread safe. The checks throw ztrain::Error.
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "parallel/comm/communicator.h"

namespace ztrain::comm::detail {

using ::ztrain::detail::StrCat;

// Bytes one rank moves for an op whose buffer has `nbytes` (the full buffer for
// reduce-scatter and all-gather) in a group of `n` ranks: the bus convention of
// communicator.h. A group of one moves nothing.
int64_t BusBytes(OpKind kind, int64_t nbytes, int n);
void CountOp(CommStats& stats, OpKind kind, int64_t nbytes, int n);

// Whether an op's output is its own buffer or aliases its rank's chunk of the input.
enum class Alias { kDisjoint, kInPlace };

// Reductions take fp32 or int32; `allow_16bit` adds bf16 and fp16 (the NCCL backend
// reduces them on the device).
void CheckReduce(const Tensor& t, ReduceOp op, bool allow_16bit = false);
// `in` has size * out.numel() elements of out's dtype; out is disjoint from in or exactly
// chunk `rank` of it.
Alias CheckReduceScatter(const Tensor& in, const Tensor& out, ReduceOp op, int rank, int size,
                         bool allow_16bit = false);
// `out` has size * in.numel() elements of in's dtype; in is disjoint from out or exactly
// chunk `rank` of it.
Alias CheckAllGather(const Tensor& in, const Tensor& out, int rank, int size);
// `in` and `out` of one dtype and size, in `size` chunks, disjoint (the same tensor only for a
// group of one).
void CheckAllToAll(const Tensor& in, const Tensor& out, int size);
void CheckRoot(int root, int size);
void CheckPeer(const char* op, int peer, int rank, int size, int tag);
// The op needs host memory (the MPI and self backends).
void CheckHost(const char* op, const Tensor& t);

// "world of 4" for the world (label "world"), else e.g. "dp group of 4 (world ranks 0,2,4,6)";
// long rank lists are shortened.
std::string GroupName(const std::string& label, const std::vector<int>& world_ranks);

// A Work that has finished: Wait() returns, or rethrows `error` when there is one.
WorkPtr FinishedWork(std::exception_ptr error = nullptr);

}  // namespace ztrain::comm::detail
