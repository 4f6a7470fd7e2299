#include "parallel/comm/mpi/mpi_runtime.h"

#include <cstdlib>
#include <mutex>

#include "parallel/comm/mpi/mpi_communicator.h"

namespace ztrain::comm {
namespace detail {
namespace {

const char* ThreadLevelName(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return "an unknown thread level";
}

}  // namespace

std::string MpiErrorString(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, len);
}

std::shared_ptr<MpiRuntime> MpiRuntime::Acquire() {
  // MPI itself is process-global state; this mirrors it so that every communicator shares
  // one runtime and the last one finalises (Note [MPI lifetime]).
  static std::mutex mu;
  static std::weak_ptr<MpiRuntime> current;
  std::lock_guard<std::mutex> lock(mu);
  if (auto rt = current.lock()) {
    rt->RequireMultipleThreads("a second world communicator");
    return rt;
  }
  int initialized = 0, finalized = 0;
  ZTRAIN_MPI_CHECK(MPI_Initialized(&initialized));
  ZTRAIN_MPI_CHECK(MPI_Finalized(&finalized));
  ZTRAIN_CHECK(!finalized,
               "MPI was already finalised in this process: create the world "
               "communicator once and keep it for the whole run");
  int level = MPI_THREAD_SINGLE;
  if (initialized) {
    ZTRAIN_MPI_CHECK(MPI_Query_thread(&level));
  } else {
    ZTRAIN_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &level));
  }
  std::shared_ptr<MpiRuntime> rt(new MpiRuntime(!initialized, level));
  ZTRAIN_CHECK(level >= MPI_THREAD_SERIALIZED, "MPI provides only ", ThreadLevelName(level),
               "; ztrain's communicator calls MPI from a worker thread and needs at least "
               "MPI_THREAD_SERIALIZED (MPI_THREAD_MULTIPLE for sub-communicators). ",
               initialized ? "Initialise MPI with MPI_Init_thread(MPI_THREAD_MULTIPLE)"
                           : "Use an MPI built with thread support (OpenMPI: "
                             "--enable-mpi-thread-multiple)");
  current = rt;
  return rt;
}

MpiRuntime::MpiRuntime(bool owns, int thread_level) : owns_(owns), thread_level_(thread_level) {
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
}

MpiRuntime::~MpiRuntime() {
  int finalized = 1;
  MPI_Finalized(&finalized);
  if (owns_ && !finalized && abandoned_.load() == 0) MPI_Finalize();
}

void MpiRuntime::RequireMultipleThreads(const char* why) const {
  ZTRAIN_CHECK_T(CommError, thread_level_ >= MPI_THREAD_MULTIPLE, why,
                 " needs MPI_THREAD_MULTIPLE (one worker thread per communicator), but MPI "
                 "provides only ",
                 ThreadLevelName(thread_level_));
}

MpiComm& MpiComm::operator=(MpiComm&& other) noexcept {
  if (this != &other) {
    Reset();
    comm_ = other.comm_;
    other.comm_ = MPI_COMM_NULL;
  }
  return *this;
}

void MpiComm::Reset() noexcept {
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  comm_ = MPI_COMM_NULL;
}

CommInfo DescribeComm(MPI_Comm comm) {
  CommInfo info;
  info.comm = MpiComm(comm);
  ZTRAIN_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  MPI_Comm ring = MPI_COMM_NULL;
  ZTRAIN_MPI_CHECK(MPI_Comm_dup(comm, &ring));  // inherits MPI_ERRORS_RETURN
  info.ring_comm = MpiComm(ring);
  ZTRAIN_MPI_CHECK(MPI_Comm_rank(comm, &info.rank));
  ZTRAIN_MPI_CHECK(MPI_Comm_size(comm, &info.size));
  MPI_Group group, world_group;
  ZTRAIN_MPI_CHECK(MPI_Comm_group(comm, &group));
  ZTRAIN_MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world_group));
  std::vector<int> ranks(info.size);
  for (int i = 0; i < info.size; ++i) ranks[i] = i;
  info.world_ranks.resize(info.size);
  const int rc = MPI_Group_translate_ranks(group, info.size, ranks.data(), world_group,
                                           info.world_ranks.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  ZTRAIN_MPI_CHECK(rc);
  return info;
}

}  // namespace detail

bool HaveMpi() { return true; }

void AbortWorld(int code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

}  // namespace ztrain::comm
