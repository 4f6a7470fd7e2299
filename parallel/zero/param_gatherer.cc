// Note [Parameter gatherer] (param_gatherer.h).
#include "parallel/zero/param_gatherer.h"

#include <algorithm>
#include <deque>
#include <exception>
#include <utility>

#include "core/error.h"

namespace ztrain::zero {

ParamGatherer::ParamGatherer(Options options, std::vector<GatherUnit> units, Allocator& memory,
                             GatherHooks hooks)
    : options_(std::move(options)), memory_(memory), hooks_(std::move(hooks)) {
  ZTRAIN_ASSERT(hooks_.gather && hooks_.gather_frozen);
  units_.reserve(units.size());
  for (GatherUnit& u : units) {
    for (size_t need : u.needs) ZTRAIN_ASSERT(need < units.size(), "unit ", need);
    units_.emplace_back().spec = std::move(u);
  }
}

ParamGatherer::~ParamGatherer() {
  for (Unit& u : units_) {
    for (comm::WorkPtr* w : {&u.work, &u.frozen_work}) {
      if (!*w) continue;
      try {
        (*w)->Wait();
      } catch (const std::exception&) {
      }
    }
  }
}

void ParamGatherer::Start(int micro_batches, bool backward) {
  std::vector<bool> phases;
  for (int m = 0; m < micro_batches; ++m) {
    phases.push_back(false);
    if (backward) phases.push_back(true);
  }
  Start(phases);
}

void ParamGatherer::Start(const std::vector<bool>& phases) {
  ReleaseAll();
  layer_at_.clear();
  const size_t n = units_.size();
  for (const bool backward : phases) {
    for (size_t i = 0; i < n; ++i) layer_at_.push_back(backward ? n - 1 - i : i);
  }
  auto it = plans_.find(phases);
  if (it == plans_.end()) {
    // The limits count the trained and the frozen parameters, the frozen ones in elements of
    // the compute dtype.
    std::vector<int64_t> sizes;
    for (const Unit& u : units_) {
      sizes.push_back(u.spec.elements +
                      u.spec.frozen_bytes / static_cast<int64_t>(DTypeSize(options_.dtype)));
    }
    std::vector<UnitUse> uses;
    for (size_t layer : layer_at_) uses.push_back(units_[layer].spec.needs);
    it = plans_.emplace(phases, PlanGathers(sizes, uses, options_.limits)).first;
  }
  plan_ = &it->second;
  position_ = 0;
}

void ParamGatherer::Launch(size_t u) {
  Unit& unit = units_[u];
  unit.unlaunched = false;
  if (unit.spec.elements > 0) unit.work = hooks_.gather(u, unit.whole);
  if (unit.spec.frozen_bytes > 0) unit.frozen_work = hooks_.gather_frozen(u, unit.frozen_whole);
}

void ParamGatherer::BeforeLayer(size_t l) {
  ZTRAIN_ASSERT(plan_ != nullptr && position_ < plan_->actions.size());
  const UnitUse& needs = units_[l].spec.needs;
  for (size_t u : plan_->actions[position_].fetch) {
    Unit& unit = units_[u];
    if (unit.spec.elements > 0) {
      unit.whole =
          Buffer(memory_, options_.dtype, {unit.spec.elements}, MemoryCategory::kParameters);
    }
    if (unit.spec.frozen_bytes > 0) {
      unit.frozen_whole =
          Buffer(memory_, DType::kU8, {unit.spec.frozen_bytes}, MemoryCategory::kParameters);
    }
    unit.unlaunched = true;
    if (!options_.launch_at_use || std::find(needs.begin(), needs.end(), u) != needs.end()) {
      Launch(u);
    }
  }
  if (hooks_.read_ahead) ReadAhead();
  for (size_t u : needs) {
    Unit& unit = units_[u];
    ZTRAIN_ASSERT(unit.spec.elements == 0 || unit.whole.data() != nullptr, "unit ", u,
                  " is not gathered for layer ", l);
    if (unit.unlaunched) Launch(u);
    Wait(unit.work);
    Wait(unit.frozen_work);
  }
}

// The shards of the next gathers to launch, read while this layer computes: the planned
// fetches of the following positions or, launched at use, the units the following positions'
// layers need that are not launched yet (past the plan's end, as the next step needs them).
void ParamGatherer::ReadAhead() {
  int ahead = options_.read_ahead;
  const size_t n = plan_->actions.size();
  const size_t end = position_ + 1 + (options_.read_ahead_wraps ? n - 1 : n - 1 - position_);
  std::vector<size_t> asked;
  for (size_t q = position_ + 1; q < end && ahead > 0; ++q) {
    const bool next_step = q >= n;
    const std::vector<size_t>& units =
        options_.launch_at_use ? units_[layer_at_[q % n]].spec.needs : plan_->actions[q % n].fetch;
    for (size_t u : units) {
      if (ahead <= 0) break;
      const Unit& unit = units_[u];
      const bool launched =
          (unit.work || unit.whole.data() || unit.frozen_whole.data()) && !unit.unlaunched;
      if (options_.launch_at_use && !next_step && launched) continue;
      if (std::find(asked.begin(), asked.end(), u) != asked.end()) continue;
      asked.push_back(u);
      --ahead;
      hooks_.read_ahead(u);
    }
  }
}

void ParamGatherer::AfterLayer() {
  ZTRAIN_ASSERT(plan_ != nullptr && position_ < plan_->actions.size());
  for (size_t u : plan_->actions[position_].release) {
    Unit& unit = units_[u];
    ZTRAIN_ASSERT(!unit.work && !unit.frozen_work);
    unit.whole.Reset();
    unit.frozen_whole.Reset();
    unit.unlaunched = false;
  }
  if (++position_ == plan_->actions.size()) plan_ = nullptr;
}

void ParamGatherer::ReleaseAll() {
  for (Unit& u : units_) {
    Wait(u.work);
    Wait(u.frozen_work);
    u.whole.Reset();
    u.frozen_whole.Reset();
    u.unlaunched = false;  // never launched: nothing to wait for
  }
  plan_ = nullptr;
}

void ParamGatherer::Wait(comm::WorkPtr& work) {
  if (!work) return;
  if (hooks_.wait) {
    hooks_.wait(*work);
  } else {
    work->Wait();
  }
  work.reset();
}

namespace {

// The gather of one rank: the copy beside the ops; waiting for it orders the ops issued after
// the wait after the copy, on the device. Done once waited for.
class CopyBesideWork final : public comm::Work {
 public:
  CopyBesideWork(kernels::Ops& ops, kernels::CopyTicket ticket) : ops_(ops), ticket_(ticket) {}
  ~CopyBesideWork() override {
    try {
      Wait();
    } catch (...) {  // a broken device; nothing left to order
    }
  }
  void Wait() override {
    if (waited_) return;
    waited_ = true;
    ops_.WaitCopy(ticket_);
  }
  bool Done() override { return waited_; }

 private:
  kernels::Ops& ops_;
  kernels::CopyTicket ticket_;
  bool waited_ = false;
};

}  // namespace

comm::WorkPtr GatherHostShard(comm::Communicator& dp, kernels::Ops& ops, const Tensor& shard,
                              const Tensor& mine, const Tensor& out) {
  if (dp.size() > 1) return dp.AllGather(shard, out);  // copied on the group's stream
  return std::make_shared<CopyBesideWork>(ops, ops.CopyBeside(shard, mine));
}

void GatherUpdatedShards(const std::vector<Tensor>& wholes, comm::Communicator& dp,
                         kernels::Ops& ops, Allocator& memory, int64_t bucket_elements,
                         const std::function<void(comm::Work&)>& wait) {
  struct InFlight {
    Buffer send;
    comm::WorkPtr work;
    int64_t elements;
  };
  std::deque<InFlight> flight;
  int64_t in_flight = 0;
  auto wait_oldest = [&] {
    wait(*flight.front().work);
    in_flight -= flight.front().elements;
    flight.pop_front();
  };
  for (const Tensor& whole : wholes) {
    const int64_t padded = whole.numel(), shard = padded / dp.size();
    if (padded == 0) continue;
    while (!flight.empty() && in_flight + padded > bucket_elements) wait_oldest();
    Buffer send(memory, DType::kF32, Shape{shard}, MemoryCategory::kCommunication);
    const Tensor send_view = send.AsTensor(DType::kF32, {shard});
    ops.Copy(whole.Flat(dp.rank() * shard, {shard}), send_view);
    comm::WorkPtr work = dp.AllGather(send_view, whole);
    flight.push_back({std::move(send), std::move(work), padded});
    in_flight += padded;
  }
  while (!flight.empty()) wait_oldest();
}

}  // namespace ztrain::zero
