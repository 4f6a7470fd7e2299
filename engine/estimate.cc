// EstimateMemory and what `ztrain estimate` builds on it: the side-by-side table, models
// given by size, and size strings (Note [Memory estimate], estimate_replay.h).
#include "engine/estimate.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "core/error.h"
#include "core/sizes.h"
#include "engine/estimate_replay.h"

namespace ztrain {
namespace {

int64_t AlignUp(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

detail::EstimateInput ResolveInput(const Config& config, const EstimateOptions& options) {
  detail::EstimateInput in;
  in.config = &config;
  in.gpu = options.gpu.value_or(config.device != "cpu");
  in.compute = options.compute_dtype.value_or(ComputeDType(config));
  in.grad = options.grad_accum_dtype.value_or(GradAccumDType(config));
  in.dp = config.dp_size;
  in.pp = config.pipeline_stages;
  in.tp = config.tensor_parallel_size;
  in.micro_batch = config.train_micro_batch_size_per_gpu;
  in.seq_len = config.data.seq_len > 0 ? config.data.seq_len : config.model.max_seq_len;
  in.grad_accum = config.gradient_accumulation_steps;
  ZTRAIN_CHECK_T(ConfigError, in.dp >= 1 && in.pp >= 1 && in.tp >= 1, "the layout dp ", in.dp,
                 " x pp ", in.pp, " x tp ", in.tp, " is not a layout; check the world size");
  ZTRAIN_CHECK_T(ConfigError, in.micro_batch >= 1 && in.grad_accum >= 1,
                 "the estimate needs train_micro_batch_size_per_gpu and "
                 "gradient_accumulation_steps (resolved for the world size)");
  ZTRAIN_CHECK_T(ConfigError, in.seq_len >= 1 && in.seq_len <= config.model.max_seq_len,
                 "sequence length ", in.seq_len, " exceeds model.max_seq_len ",
                 config.model.max_seq_len, "; lower data.seq_len or raise model.max_seq_len");
  in.checkpointed.assign(static_cast<size_t>(std::max(config.model.n_layer, 0)), false);
  for (int b : options.checkpointed_blocks.value_or(config.activation_checkpointing.blocks)) {
    ZTRAIN_CHECK_T(ConfigError, b >= 0 && b < config.model.n_layer, "checkpointed block ", b,
                   " is not a block of a model with n_layer ", config.model.n_layer);
    in.checkpointed[static_cast<size_t>(b)] = true;
  }
  const ActivationCheckpointingConfig& ac = config.activation_checkpointing;
  in.partition_checkpoints = ac.partition_activations && in.tp > 1;
  in.offload_checkpoints = ac.cpu_checkpointing && in.gpu;
  return in;
}

MemoryEstimate EstimateStage(const detail::EstimateInput& in) {
  const detail::StageLayout layout = detail::LayOutStage(in);
  MemoryEstimate e = detail::ReplayRank(in, layout);
  e.dp = in.dp;
  e.pp = in.pp;
  e.tp = in.tp;
  e.pp_stage = in.pp_stage;
  e.zero_stage = in.config->zero.stage;
  e.micro_batch = in.micro_batch;
  e.seq_len = in.seq_len;
  e.grad_accum = in.grad_accum;
  e.compute_dtype = in.compute;
  e.gpu = in.gpu;
  e.model_parameters = layout.model_parameters;
  e.rank_parameters = layout.rank_parameters;
  for (const detail::LayerLayout& l : layout.layers) {
    e.padded_elements += l.padded;
    e.shard_elements += l.shard;
    if (l.kind == detail::LayerLayout::Kind::kBlock &&
        in.checkpointed[static_cast<size_t>(l.block)]) {
      ++e.checkpointed;
    }
  }
  return e;
}

}  // namespace

MemoryEstimate EstimateMemory(const Config& config, const EstimateOptions& options) {
  detail::EstimateInput in = ResolveInput(config, options);
  ZTRAIN_CHECK_T(ConfigError, options.pp_stage < in.pp, "pipeline stage ", options.pp_stage,
                 " does not exist with pipeline.stages ", in.pp);
  const int first = options.pp_stage >= 0 ? options.pp_stage : 0;
  const int last = options.pp_stage >= 0 ? options.pp_stage : in.pp - 1;
  MemoryEstimate worst;
  for (int s = first; s <= last; ++s) {
    in.pp_stage = s;
    MemoryEstimate e = EstimateStage(in);
    if (s == first || e.total_peak > worst.total_peak) worst = e;
  }
  worst.ranks_per_node = std::max(1, std::min(options.gpus_per_node, config.world_size));
  return worst;
}

std::vector<EstimateRow> EstimateTable(const Config& config, const EstimateOptions& options) {
  struct Choice {
    int stage;
    const char* name;
    const char* optimizer;
    const char* param;
  };
  std::vector<Choice> choices = {{0, "none", "none", "none"}};
  for (int s = 1; s <= 3; ++s) {
    choices.push_back({s, "none", "none", "none"});
    choices.push_back({s, "optimizer cpu", "cpu", "none"});
    if (s == 3) choices.push_back({s, "optimizer+param cpu", "cpu", "cpu"});
    choices.push_back({s, "nvme", "nvme", s == 3 ? "nvme" : "none"});
  }
  EstimateOptions plain = options, checkpointed = options;
  plain.checkpointed_blocks = std::vector<int>{};
  std::vector<int> all(static_cast<size_t>(std::max(config.model.n_layer, 0)));
  for (size_t b = 0; b < all.size(); ++b) all[b] = static_cast<int>(b);
  checkpointed.checkpointed_blocks = all;
  std::vector<EstimateRow> rows;
  for (const Choice& choice : choices) {
    Config c = config;
    c.zero.stage = choice.stage;
    c.zero.overlap_comm =
        choice.stage == config.zero.stage ? config.zero.overlap_comm : choice.stage == 3;
    c.zero.offload_optimizer.device = choice.optimizer;
    c.zero.offload_param.device = choice.param;
    // Swap buffers are as large as the largest swapped shard whatever buffer_size says;
    // buffer_size only refuses shards larger than itself.
    c.zero.offload_param.buffer_size = std::numeric_limits<int64_t>::max();
    rows.push_back(
        {choice.stage, choice.name, EstimateMemory(c, plain), EstimateMemory(c, checkpointed)});
  }
  return rows;
}

int64_t Gpt2ParameterCount(const ModelConfig& m) {
  const int64_t c = m.n_embd;
  // ln_1, c_attn, c_proj, ln_2, c_fc, mlp.c_proj
  const std::optional<int64_t> block = SizeSum(SizeProduct({12, c, c}), SizeProduct({13, c}));
  const std::optional<int64_t> n = SizeSum(
      SizeSum(SizeProduct({m.padded_vocab_size, c}), SizeProduct({m.max_seq_len, c})),
      SizeSum(block ? SizeProduct({m.n_layer, *block}) : std::nullopt, SizeProduct({2, c})));
  ZTRAIN_CHECK_T(ConfigError, n.has_value(), "a GPT-2 of ", m.n_layer, " blocks of width ", c,
                 ", vocabulary ", m.padded_vocab_size, " and context ", m.max_seq_len,
                 " has more than ", kMaxElements, " parameters (Note [Size limits]); lower them");
  return *n;
}

ModelConfig ModelFromSize(const ModelSize& size, const ModelConfig& base) {
  ZTRAIN_CHECK_T(ConfigError, size.layers >= 1 && size.hidden >= 1,
                 "a model given by size needs --layers and --hidden (both >= 1), e.g. "
                 "--params 7B --layers 32 --hidden 4096");
  ZTRAIN_CHECK_T(ConfigError, size.layers <= 65536 && size.hidden <= INT32_MAX && size.heads >= 0,
                 "--layers ", size.layers, " or --hidden ", size.hidden,
                 " is out of range (at most 65536 layers, a width of at most 2^31 - 1)");
  ModelConfig m = base;
  m.type = "gpt2";
  m.init_from.clear();
  m.n_layer = size.layers;
  m.n_embd = static_cast<int>(size.hidden);
  m.n_head = size.heads > 0 ? size.heads : static_cast<int>(std::max<int64_t>(1, size.hidden / 64));
  ZTRAIN_CHECK_T(ConfigError, m.n_embd % m.n_head == 0, "--hidden ", m.n_embd,
                 " does not divide into ", m.n_head, " heads; give --heads that divides it");
  m.max_seq_len = size.seq > 0 ? size.seq : base.max_seq_len;
  if (size.vocab > 0) {
    m.vocab_size = size.vocab;
  } else {
    ZTRAIN_CHECK_T(ConfigError, size.params > 0, "give --params or --vocab");
    ModelConfig blocks_only = m;
    blocks_only.padded_vocab_size = 0;
    const int64_t rest = size.params - Gpt2ParameterCount(blocks_only);
    ZTRAIN_CHECK_T(ConfigError, rest >= m.n_embd, "--params ", size.params, " is less than the ",
                   m.n_layer, " blocks of width ", m.n_embd, " and the position embedding hold (",
                   Gpt2ParameterCount(blocks_only), "); raise --params or lower --layers/--hidden");
    m.vocab_size = rest / m.n_embd;
  }
  m.padded_vocab_size = AlignUp(m.vocab_size, 128);  // as "auto" pads it
  return m;
}

int64_t ParseCount(const std::string& text, const std::string& what) {
  const std::string fix = what + " '" + text +
                          "' is not a count; write e.g. 7B, 1.5B, 350M, "
                          "125k or 124475904";
  const char* begin = text.c_str();
  char* end = nullptr;
  const double value = std::strtod(begin, &end);
  ZTRAIN_CHECK_T(ConfigError, end != begin && !text.empty() && !std::isspace(text[0]), fix);
  std::string suffix(end);
  double scale = 1.0;
  if (suffix.size() == 1) {
    switch (std::tolower(static_cast<unsigned char>(suffix[0]))) {
      case 'k':
        scale = 1e3;
        break;
      case 'm':
        scale = 1e6;
        break;
      case 'b':
      case 'g':
        scale = 1e9;
        break;
      case 't':
        scale = 1e12;
        break;
      default:
        scale = 0.0;
    }
  } else if (!suffix.empty()) {
    scale = 0.0;
  }
  const double count = value * scale;
  ZTRAIN_CHECK_T(ConfigError, scale > 0.0 && std::isfinite(count) && count >= 1.0 && count < 9e18,
                 fix);
  return static_cast<int64_t>(std::llround(count));
}

}  // namespace ztrain
