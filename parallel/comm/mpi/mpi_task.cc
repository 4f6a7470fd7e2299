#include "parallel/comm/mpi/mpi_task.h"

namespace ztrain::comm::detail {

void* Scratch::Get(size_t bytes) {
  if (buffer_.nbytes() < bytes) {
    buffer_.Reset();  // free first: the peak holds one scratch buffer, not two
    buffer_ = Buffer(allocator_, bytes, MemoryCategory::kCommunication);
  }
  return buffer_.data();
}

bool RequestTask::Progress(WorkerContext& ctx) {
  int flag = 0;
  MPI_Status status;
  ZTRAIN_MPI_CHECK(MPI_Test(&request_, &flag, &status));
  if (flag && finish_) finish_(ctx.comm, status);
  return flag != 0;
}

}  // namespace ztrain::comm::detail
