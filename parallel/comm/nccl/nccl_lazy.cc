// NCCL, opened when ztrain first makes an NCCL communicator or asks whether it can (Note [Lazy
// GPU libraries] in core/lazy_library.h): the functions the communicator uses, defined here
// with nccl.h's declarations, each forwarding to the library's own.
#include <nccl.h>

#include <string>

#include "core/lazy_library.h"
#include "parallel/comm/nccl/nccl_runtime.h"

namespace ztrain::comm::detail {

LazyLibrary& NcclLibrary() {
  static LazyLibrary library({"libnccl.so." + std::to_string(NCCL_MAJOR), "libnccl.so"},
                             "NCCL (the GPU collectives)");
  return library;
}

}  // namespace ztrain::comm::detail

namespace {
ztrain::LazyLibrary& Nccl() { return ztrain::comm::detail::NcclLibrary(); }
}  // namespace

extern "C" {

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  ZTRAIN_LAZY_FORWARD(Nccl(), ncclGetUniqueId, uniqueId);
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config) {
  ZTRAIN_LAZY_FORWARD(Nccl(), ncclCommInitRankConfig, comm, nranks, commId, rank, config);
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* config) {
  ZTRAIN_LAZY_FORWARD(Nccl(), ncclCommSplit, comm, color, key, newcomm, config);
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  ZTRAIN_LAZY_FORWARD(Nccl(), ncclCommFinalize, comm);
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  ZTRAIN_LAZY_FORWARD(Nccl(), ncclCommDestroy, comm);
}

ncclResult_t ncclCommAbort(ncclComm_t comm) { ZTRAIN_LAZY_FORWARD(Nccl(), ncclCommAbort, comm); }

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  ZTRAIN_LAZY_FORWARD(Nccl(), ncclCommGetAsyncError, comm, asyncError);
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  ZTRAIN_LAZY_FORWARD(Nccl(), ncclCommCount, comm, count);
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  ZTRAIN_LAZY_FORWARD(Nccl(), ncclCommUserRank, comm, rank);
}

const char* ncclGetErrorString(ncclResult_t result) {
  ZTRAIN_LAZY_FORWARD(Nccl(), ncclGetErrorString, result);
}

const char* ncclGetLastError(ncclComm_t comm) {
  ZTRAIN_LAZY_FORWARD(Nccl(), ncclGetLastError, comm);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  ZTRAIN_LAZY_FORWARD(Nccl(), ncclBroadcast, sendbuff, recvbuff, count, datatype, root, comm,
                      stream);
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  ZTRAIN_LAZY_FORWARD(Nccl(), ncclAllReduce, sendbuff, recvbuff, count, datatype, op, comm,
                      stream);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  ZTRAIN_LAZY_FORWARD(Nccl(), ncclReduceScatter, sendbuff, recvbuff, recvcount, datatype, op,
                      comm, stream);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  ZTRAIN_LAZY_FORWARD(Nccl(), ncclAllGather, sendbuff, recvbuff, sendcount, datatype, comm,
                      stream);
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  ZTRAIN_LAZY_FORWARD(Nccl(), ncclSend, sendbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  ZTRAIN_LAZY_FORWARD(Nccl(), ncclRecv, recvbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclGroupStart() { ZTRAIN_LAZY_FORWARD(Nccl(), ncclGroupStart); }

ncclResult_t ncclGroupEnd() { ZTRAIN_LAZY_FORWARD(Nccl(), ncclGroupEnd); }

}  // extern "C"
