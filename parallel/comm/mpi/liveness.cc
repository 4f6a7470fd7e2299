#include "parallel/comm/mpi/liveness.h"

#include <cstdio>

#include "parallel/comm/comm_util.h"

namespace ztrain::comm::detail {
namespace {

constexpr int kPingTag = 1;
constexpr int kPongTag = 2;
// Pings and answers carry this word. Sent from a constant, so that a send whose request was
// freed at once may complete whenever it likes.
constexpr int kWord = 0x7a747270;
// How many members an error message names before it counts the rest.
constexpr size_t kMaxNamed = 8;

std::string Member(int group_rank, const std::vector<int>& world_ranks,
                   const std::vector<std::string>& hosts) {
  const int world =
      group_rank < static_cast<int>(world_ranks.size()) ? world_ranks[group_rank] : group_rank;
  const bool have_host = group_rank < static_cast<int>(hosts.size());
  return StrCat("rank ", world, " (host ", have_host ? hosts[group_rank] : "?", ")");
}

// "a", "a and b", "a, b and c"; past kMaxNamed items, "a, b, ... and 7 more".
std::string JoinList(const std::vector<std::string>& items) {
  std::string out;
  const size_t named = items.size() > kMaxNamed ? kMaxNamed - 1 : items.size();
  for (size_t i = 0; i < named; ++i) {
    if (i > 0) out += (i + 1 == items.size()) ? " and " : ", ";
    out += items[i];
  }
  if (named < items.size()) out += StrCat(" and ", items.size() - named, " more");
  return out;
}

// "rank 2 answered", "ranks 2 and 3 answered", or "the other 41 ranks answered".
std::string Answered(const std::vector<int>& answered, const std::vector<int>& world_ranks) {
  if (answered.size() > kMaxNamed) return StrCat("the other ", answered.size(), " ranks answered");
  std::vector<std::string> names;
  for (int r : answered) names.push_back(std::to_string(world_ranks[r]));
  return StrCat(answered.size() == 1 ? "rank " : "ranks ", JoinList(names), " answered");
}

}  // namespace

LivenessProbe::LivenessProbe(MPI_Comm comm, int rank, int size)
    : comm_(comm),
      rank_(rank),
      size_(size),
      answers_(size, MPI_REQUEST_NULL),
      words_(size, 0),
      answered_(size, false) {}

LivenessProbe::~LivenessProbe() { CancelPending(); }

void LivenessProbe::Answer(bool reply) {
  for (;;) {
    int arrived = 0;
    MPI_Message message;
    MPI_Status status;
    ZTRAIN_MPI_CHECK(MPI_Improbe(MPI_ANY_SOURCE, kPingTag, comm_, &arrived, &message, &status));
    if (!arrived) return;
    int word = 0;
    ZTRAIN_MPI_CHECK(MPI_Mrecv(&word, 1, MPI_INT, &message, MPI_STATUS_IGNORE));
    if (!reply) continue;
    MPI_Request pong;
    ZTRAIN_MPI_CHECK(MPI_Isend(&kWord, 1, MPI_INT, status.MPI_SOURCE, kPongTag, comm_, &pong));
    ZTRAIN_MPI_CHECK(MPI_Request_free(&pong));  // the pinger may be gone: never wait for it
  }
}

void LivenessProbe::Start() {
  active_ = true;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    ZTRAIN_MPI_CHECK(MPI_Irecv(&words_[peer], 1, MPI_INT, peer, kPongTag, comm_, &answers_[peer]));
    MPI_Request ping;
    ZTRAIN_MPI_CHECK(MPI_Isend(&kWord, 1, MPI_INT, peer, kPingTag, comm_, &ping));
    ZTRAIN_MPI_CHECK(MPI_Request_free(&ping));  // a stopped peer never takes it
    ++pending_;
  }
}

bool LivenessProbe::Progress() {
  for (int peer = 0; peer < size_ && pending_ > 0; ++peer) {
    if (answers_[peer] == MPI_REQUEST_NULL) continue;
    int done = 0;
    ZTRAIN_MPI_CHECK(MPI_Test(&answers_[peer], &done, MPI_STATUS_IGNORE));
    if (done) {
      answered_[peer] = true;
      --pending_;
    }
  }
  return pending_ == 0;
}

Liveness LivenessProbe::Finish(double seconds) {
  CancelPending();
  active_ = false;
  Liveness l;
  l.known = true;
  l.seconds = seconds;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    (answered_[peer] ? l.answered : l.silent).push_back(peer);
  }
  return l;
}

void LivenessProbe::CancelPending() noexcept {
  for (MPI_Request& r : answers_) {
    if (r == MPI_REQUEST_NULL) continue;
    // A cancelled receive completes locally, whatever the peer does.
    MPI_Cancel(&r);
    MPI_Wait(&r, MPI_STATUS_IGNORE);
  }
  pending_ = 0;
}

std::string DescribeSilent(const Liveness& l, const std::vector<int>& world_ranks,
                           const std::vector<std::string>& hosts) {
  if (!l.known || l.silent.empty()) return "";
  std::vector<std::string> names;
  for (int r : l.silent) names.push_back(Member(r, world_ranks, hosts));
  const bool one = l.silent.size() == 1;
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%.1f s", l.seconds);
  std::string out =
      StrCat(JoinList(names), one ? " does" : " do", " not answer: ", one ? "it is" : "they are",
             " stopped, hung or too slow");
  if (!l.answered.empty()) out += StrCat("; ", Answered(l.answered, world_ranks));
  return StrCat(out, " (liveness probe, ", seconds, ")");
}

}  // namespace ztrain::comm::detail
