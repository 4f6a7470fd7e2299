#pragma once
// Note [Parameter groups]
// Every parameter belongs to one group, and the optimizer step takes its settings from the
// group: its weight decay and its learning-rate scale (torch's param groups, Megatron's
// no_weight_decay_cond and lr_mult). Groups come from optimizer.param_groups, a list of rules
// tried in order (core/config.h ParamGroupRule): a trainable parameter joins the first rule
// whose globs (when given) match its name and whose ndim (when given) is its number of
// dimensions, else the group "default" (optimizer.params as given). Frozen parameters are the
// group "frozen" and take no step. The default rules keep weight decay off every
// 1-dimensional parameter (biases and norm weights); a rule is the only way a parameter's
// decay is chosen (layers do not choose it).
//
// What does not depend on the group: ZeRO shards, offload and checkpoints hold every
// trainable element alike, and the gradient norm and clipping are over all groups together
// (each element counted once), so a group changes the update of its elements and nothing
// else. Gradients of every group are reduced over the data-parallel group; a group reduced
// over another communicator (experts) comes with the parts that need one.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/config.h"

namespace ztrain::optim {

struct ParamGroup {
  std::string name;
  bool trainable = true;
  double weight_decay = 0.0;  // resolved: the rule's, or optimizer.params.weight_decay
  double lr_scale = 1.0;      // times the scheduler's lr
  ParamGroupRule rule;        // what selects it (empty for "default" and "frozen")
};

class ParamGroups {
 public:
  // Group 0 is "default", then one per rule in order, then "frozen".
  explicit ParamGroups(const OptimizerConfig& config);

  // The index of the group of the parameter `name` with `ndim` dimensions.
  size_t Assign(std::string_view name, size_t ndim, bool trainable) const;
  const ParamGroup& operator[](size_t i) const { return groups_.at(i); }
  size_t size() const { return groups_.size(); }
  size_t frozen() const { return groups_.size() - 1; }

  // Throws ConfigError naming every glob of the rules that matches none of `trainable`
  // (the whole model's trainable parameter names), with the frozen names it matched if any:
  // a glob that selects nothing is a typo, never silently ignored.
  void CheckEveryGlobMatches(const std::vector<std::string>& trainable,
                             const std::vector<std::string>& frozen) const;

 private:
  std::vector<ParamGroup> groups_;
};

// fnmatch(3) without flags: `*` and `?` match any characters, dots included.
bool GlobMatches(const std::string& glob, std::string_view name);

}  // namespace ztrain::optim
