#include "optim/param_groups.h"

#include <fnmatch.h>

#include "core/error.h"

namespace ztrain::optim {

bool GlobMatches(const std::string& glob, std::string_view name) {
  return fnmatch(glob.c_str(), std::string(name).c_str(), 0) == 0;
}

ParamGroups::ParamGroups(const OptimizerConfig& config) {
  groups_.push_back({"default", true, config.weight_decay, 1.0, {}});
  for (const ParamGroupRule& r : config.param_groups) {
    groups_.push_back({r.name, true, r.weight_decay.value_or(config.weight_decay), r.lr_scale, r});
  }
  groups_.push_back({"frozen", false, 0.0, 0.0, {}});
}

size_t ParamGroups::Assign(std::string_view name, size_t ndim, bool trainable) const {
  if (!trainable) return frozen();
  for (size_t i = 1; i < frozen(); ++i) {
    const ParamGroupRule& r = groups_[i].rule;
    if (r.ndim > 0 && static_cast<size_t>(r.ndim) != ndim) continue;
    bool named = r.params.empty();
    for (const std::string& glob : r.params) named = named || GlobMatches(glob, name);
    if (named) return i;
  }
  return 0;
}

void ParamGroups::CheckEveryGlobMatches(const std::vector<std::string>& trainable,
                                        const std::vector<std::string>& frozen) const {
  std::string problems;
  for (size_t i = 1; i < this->frozen(); ++i) {
    for (const std::string& glob : groups_[i].rule.params) {
      bool matched = false;
      for (const std::string& n : trainable) matched = matched || GlobMatches(glob, n);
      if (matched) continue;
      std::string frozen_match;
      for (const std::string& n : frozen) {
        if (frozen_match.empty() && GlobMatches(glob, n)) frozen_match = n;
      }
      problems += detail::StrCat(
          "\n  optimizer.param_groups[", i - 1, "] (\"", groups_[i].name, "\"): '", glob, "' ",
          frozen_match.empty()
              ? detail::StrCat("matches no parameter of the model (names look like '",
                               trainable.empty() ? std::string("?") : trainable.front(), "', '",
                               trainable.empty() ? std::string("?") : trainable.back(), "')")
              : detail::StrCat("matches only frozen parameters ('", frozen_match,
                               "'), which take no optimizer step"));
    }
  }
  ZTRAIN_CHECK_T(ConfigError, problems.empty(),
                 "a parameter group's glob selects nothing:", problems,
                 "\nFix the glob, or remove it from optimizer.param_groups.");
}

}  // namespace ztrain::optim
