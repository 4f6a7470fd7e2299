// Note [One config on every rank] (run/config_agreement.h).
#include "run/config_agreement.h"

#include <algorithm>
#include <string>
#include <vector>

#include "core/crc32c.h"
#include "core/error.h"

namespace ztrain {
namespace {

using detail::StrCat;
using nlohmann::json;

constexpr size_t kShownKeys = 6;      // differing keys whose values the message shows
constexpr int64_t kValueBytes = 120;  // of each value

uint32_t Digest(const std::string& text) { return Crc32c(text.data(), text.size(), 0); }

// The value at dotted `path` of `tree` as text ("absent" when it is not there).
std::string ValueAt(const json& tree, const std::string& path) {
  const json* v = ConfigValue(tree, path);
  return v ? v->dump() : "absent";
}

AutoChoice* FindChoice(Config& c, const std::string& path) {
  for (AutoChoice& a : c.auto_choices) {
    if (a.path == path) return &a;
  }
  return nullptr;
}

// `config` parsed again with `patch` merged into its resolved tree; its device and choices kept.
Config Reparse(const Config& config, const json& patch) {
  json j = config.resolved;
  j.merge_patch(patch);
  Config c = ParseConfig(j, config.world_size);
  c.device = config.device;
  c.auto_choices = config.auto_choices;
  return c;
}

// The machine-dependent "auto"s, agreed on by every rank (all take part, whatever their own
// config says, so that the collectives match).
void AgreeOnMachineAutos(Config& config, comm::Communicator& world) {
  const AutoChoice* micro = FindChoice(config, "train_micro_batch_size_per_gpu");
  const AutoChoice* bf16 = FindChoice(config, "bf16.enabled");
  const int32_t mine_micro =
      micro ? static_cast<int32_t>(config.train_micro_batch_size_per_gpu) : INT32_MAX;
  const int32_t mine_bf16 = bf16 ? (config.precision.bf16 ? 1 : 0) : 1;
  const std::vector<int32_t> all = AllGatherInts(world, {mine_micro, mine_bf16});
  int32_t least_micro = INT32_MAX, every_bf16 = 1;
  for (size_t r = 0; r < all.size(); r += 2) {
    least_micro = std::min(least_micro, all[r]);
    every_bf16 = std::min(every_bf16, all[r + 1]);
  }
  const std::string ranks = StrCat(" (agreed by the ", world.size(), " ranks)");
  if (micro && least_micro < mine_micro) {
    config = Reparse(
        config, {{"train_micro_batch_size_per_gpu", least_micro}, {"train_batch_size", nullptr}});
    AutoChoice& a = *FindChoice(config, "train_micro_batch_size_per_gpu");
    a.value = least_micro;
    a.reason =
        StrCat("the smallest any rank found; this rank's own: ", mine_micro, ", ", a.reason, ranks);
  }
  if (bf16 && every_bf16 == 0 && config.precision.bf16) {
    config = Reparse(config, {{"bf16", {{"enabled", false}}}});
    AutoChoice& a = *FindChoice(config, "bf16.enabled");
    a.value = false;
    a.reason = "another rank's hardware does not compute bf16" + ranks;
  }
}

}  // namespace

void AgreeOnConfig(Config& config, comm::Communicator& world) {
  if (world.size() == 1) return;
  AgreeOnMachineAutos(config, world);
  const std::vector<int32_t> digests =
      AllGatherInts(world, {static_cast<int32_t>(Digest(config.resolved.dump()))});
  if (std::all_of(digests.begin(), digests.end(), [&](int32_t d) { return d == digests[0]; })) {
    return;
  }
  // Which keys: one digest per leaf of the schema, the same list on every rank.
  const std::vector<std::string>& paths = ConfigValuePaths();
  std::vector<int32_t> mine;
  for (const std::string& p : paths) {
    mine.push_back(static_cast<int32_t>(Digest(ValueAt(config.resolved, p))));
  }
  const std::vector<int32_t> all = AllGatherInts(world, mine);
  const size_t k = paths.size();
  std::vector<size_t> differing;
  for (size_t i = 0; i < k; ++i) {
    for (int r = 1; r < world.size(); ++r) {
      if (all[static_cast<size_t>(r) * k + i] != all[i]) {
        differing.push_back(i);
        break;
      }
    }
  }
  std::vector<std::string> problems;
  for (size_t d = 0; d < differing.size() && d < kShownKeys; ++d) {
    const std::string& path = paths[differing[d]];
    const std::vector<std::string> values =
        AllGatherText(world, ValueAt(config.resolved, path), kValueBytes);
    std::string line = path + ": differs between ranks: rank 0 has " + values[0];
    for (int r = 1; r < world.size(); ++r) {
      const std::string& v = values[static_cast<size_t>(r)];
      if (v != values[0]) line += StrCat(", rank ", r, " has ", v);
    }
    problems.push_back(line);
  }
  if (differing.size() > kShownKeys) {
    problems.push_back(StrCat("... and ", differing.size() - kShownKeys, " more keys"));
  }
  problems.push_back(StrCat("every rank must run the same config: start all ", world.size(),
                            " ranks from one file (mpirun -np ", world.size(),
                            " ztrain --config FILE), the same on every node"));
  throw InvalidConfig(problems);
}

}  // namespace ztrain
