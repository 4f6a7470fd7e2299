#include "parallel/comm/mpi/mpi_runtime.h"

#include <algorithm>
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

// MPI itself is process-global state; this mirrors it so that every communicator shares
// one runtime and the last one finalises (Note [MPI lifetime]), and so that AbortWorld can
// stop the workers (Note [Stopping the workers]).
struct CurrentRuntime {
  std::mutex mu;
  std::weak_ptr<MpiRuntime> runtime;
};

CurrentRuntime& Registry() {
  static CurrentRuntime current;
  return current;
}

// This host's name, cut to a fixed width so that every rank sends the same count.
constexpr int kHostChars = 64;

std::vector<std::string> GatherHosts(MPI_Comm comm, int size) {
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  ZTRAIN_MPI_CHECK(MPI_Get_processor_name(name, &len));
  std::vector<char> mine(kHostChars, '\0'), all(static_cast<size_t>(kHostChars) * size);
  std::copy(name, name + std::min(len, kHostChars - 1), mine.begin());
  ZTRAIN_MPI_CHECK(
      MPI_Allgather(mine.data(), kHostChars, MPI_CHAR, all.data(), kHostChars, MPI_CHAR, comm));
  std::vector<std::string> hosts(size);
  for (int i = 0; i < size; ++i) hosts[i] = std::string(all.data() + i * kHostChars);
  return hosts;
}

}  // namespace

std::string MpiErrorString(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, len);
}

std::shared_ptr<MpiRuntime> MpiRuntime::Acquire() {
  CurrentRuntime& current = Registry();
  std::lock_guard<std::mutex> lock(current.mu);
  if (auto rt = current.runtime.lock()) {
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
  current.runtime = rt;
  return rt;
}

std::shared_ptr<MpiRuntime> MpiRuntime::Current() {
  CurrentRuntime& current = Registry();
  std::lock_guard<std::mutex> lock(current.mu);
  return current.runtime.lock();
}

MpiRuntime::MpiRuntime(bool owns, int thread_level) : owns_(owns), thread_level_(thread_level) {
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
}

MpiRuntime::~MpiRuntime() {
  // Every worker thread holds the runtime, so none is left to call MPI (Note [Stopping the
  // workers]); an abandoned op still pending inside MPI forbids finalising.
  int finalized = 1;
  MPI_Finalized(&finalized);
  if (owns_ && !finalized && abandoned_.load() == 0) MPI_Finalize();
}

void MpiRuntime::CheckIn() {
  std::lock_guard<std::mutex> lock(workers_mu_);
  ++workers_;
}

void MpiRuntime::CheckOut() {
  {
    std::lock_guard<std::mutex> lock(workers_mu_);
    --workers_;
  }
  workers_cv_.notify_all();
}

void MpiRuntime::Park() {
  std::unique_lock<std::mutex> lock(workers_mu_);
  ++parked_;
  workers_cv_.notify_all();
  for (;;) workers_cv_.wait(lock);  // nothing wakes a parked worker: the process ends
}

bool MpiRuntime::StopWorkers(std::chrono::milliseconds limit) {
  stopping_.store(true, std::memory_order_release);
  std::unique_lock<std::mutex> lock(workers_mu_);
  return workers_cv_.wait_for(lock, limit, [&] { return parked_ >= workers_; });
}

void MpiRuntime::NoteStall(Stall stall) {
  std::lock_guard<std::mutex> lock(stall_mu_);
  // Several workers see the same stall; keep its longest view.
  if (stall_ && stall.end - stall_->end < std::chrono::seconds(1)) {
    stall.length = std::max(stall.length, stall_->length);
  }
  stall_ = stall;
}

std::optional<MpiRuntime::Stall> MpiRuntime::LastStall() {
  std::lock_guard<std::mutex> lock(stall_mu_);
  return stall_;
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
  MPI_Comm probe = MPI_COMM_NULL;
  ZTRAIN_MPI_CHECK(MPI_Comm_dup(comm, &probe));
  info.probe_comm = MpiComm(probe);
  ZTRAIN_MPI_CHECK(MPI_Comm_rank(comm, &info.rank));
  ZTRAIN_MPI_CHECK(MPI_Comm_size(comm, &info.size));
  info.hosts = GatherHosts(comm, info.size);
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
  // Note [Stopping the workers]: no worker may be inside MPI while MPI_Abort tears it down.
  if (auto runtime = detail::MpiRuntime::Current()) runtime->StopWorkers(detail::kParkLimit);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

}  // namespace ztrain::comm
