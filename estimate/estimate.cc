// EstimateMemory and what `ztrain estimate` builds on it: the side-by-side table, models
// given by size, and size strings. The estimate runs the engine itself, shape-only (Note
// [Shape-only engine], estimate/shape_only.h).
#include "estimate/estimate.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "core/buffer.h"
#include "core/error.h"
#include "core/sizes.h"
#include "engine/engine.h"
#include "estimate/estimate_layers.h"
#include "estimate/shape_only.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/tensor/megatron_linears.h"

namespace ztrain {
namespace {

int64_t AlignUp(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

// The config with the options applied, checked for what the estimate needs.
Config ResolveConfig(const Config& config, const EstimateOptions& options) {
  Config c = config;
  ZTRAIN_CHECK_T(ConfigError,
                 c.dp_size >= 1 && c.pipeline_stages >= 1 && c.tensor_parallel_size >= 1,
                 "the layout dp ", c.dp_size, " x pp ", c.pipeline_stages, " x tp ",
                 c.tensor_parallel_size, " is not a layout; check the world size");
  ZTRAIN_CHECK_T(ConfigError,
                 c.train_micro_batch_size_per_gpu >= 1 && c.gradient_accumulation_steps >= 1,
                 "the estimate needs train_micro_batch_size_per_gpu and "
                 "gradient_accumulation_steps (resolved for the world size)");
  if (c.data.seq_len <= 0) c.data.seq_len = c.model.max_seq_len;
  ZTRAIN_CHECK_T(ConfigError, c.data.seq_len >= 1 && c.data.seq_len <= c.model.max_seq_len,
                 "sequence length ", c.data.seq_len, " exceeds model.max_seq_len ",
                 c.model.max_seq_len, "; lower data.seq_len or raise model.max_seq_len");
  ZTRAIN_CHECK_T(ConfigError, options.pp_stage < c.pipeline_stages, "pipeline stage ",
                 options.pp_stage, " does not exist with pipeline.stages ", c.pipeline_stages);
  if (options.checkpointed_blocks) {
    ActivationCheckpointingConfig& ac = c.activation_checkpointing;
    ac.blocks = *options.checkpointed_blocks;
    std::sort(ac.blocks.begin(), ac.blocks.end());
    ac.enabled = !ac.blocks.empty();
  }
  for (int b : c.activation_checkpointing.blocks) {
    ZTRAIN_CHECK_T(ConfigError, b >= 0 && b < c.model.n_layer, "checkpointed block ", b,
                   " is not a block of a model with n_layer ", c.model.n_layer);
  }
  return c;
}

// When pipeline stage `stage`'s sends finish (Note [Shape-only engine]): for each send of its
// instruction list, in order, the poll of the engine's on which it is done: the first
// instruction that starts after the peer began the matching receive (or after the send
// itself ended, if later), on pipeline::Simulate's clock (forward 1, backward 2); 0 for a send
// still in flight at the end of the list (done when the step waits for it).
std::vector<int> SendPolls(const Config& config, int stage) {
  using pipeline::OpType;
  const int stages = config.pipeline_stages;
  if (stages <= 1) return {};
  const auto m = static_cast<int>(config.gradient_accumulation_steps);
  const pipeline::ScheduleKind kind = pipeline::ParseScheduleKind(config.pipeline_schedule);
  const pipeline::Timeline time = pipeline::Simulate(kind, stages, m);
  const std::vector<pipeline::Instruction> list = pipeline::MakeSchedule(kind, stages, stage, m);
  const std::vector<double>& starts = time.start[static_cast<size_t>(stage)];
  std::vector<int> polls;
  for (size_t i = 0; i < list.size(); ++i) {
    const bool forward = list[i].op == OpType::kSendActivation;
    if (!forward && list[i].op != OpType::kSendGrad) continue;
    const int peer = forward ? stage + 1 : stage - 1;
    const std::vector<pipeline::Instruction> theirs = pipeline::MakeSchedule(kind, stages, peer, m);
    const pipeline::Instruction recv{forward ? OpType::kRecvActivation : OpType::kRecvGrad,
                                     list[i].micro_batch};
    const auto j =
        static_cast<size_t>(std::find(theirs.begin(), theirs.end(), recv) - theirs.begin());
    ZTRAIN_ASSERT(j < theirs.size(), "estimate: a send without its receive");
    const double done =
        std::max(time.end[static_cast<size_t>(stage)][i], time.start[static_cast<size_t>(peer)][j]);
    int poll = 0;
    for (size_t k = i + 1; k < list.size() && poll == 0; ++k) {
      if (starts[k] > done) poll = static_cast<int>(k - i);
    }
    polls.push_back(poll);
  }
  return polls;
}

void CopyPeaks(const MemoryTracker& t, std::array<int64_t, kNumMemoryCategories>& peaks,
               int64_t& total) {
  for (int c = 0; c < kNumMemoryCategories; ++c) peaks[c] = t.Peak(static_cast<MemoryCategory>(c));
  total = t.TotalPeak();
}

// Pipeline stage `stage`'s rank (dp and tp rank 0: every rank of a stage holds as much, and
// rank 0's optimizer range holds the weights tied across stages), from a shape-only engine's
// construction, initialisation and one train step.
MemoryEstimate EstimateStage(const Config& config, bool gpu, int stage) {
  // Under context parallelism the gradients' group is dp x cp and each rank holds
  // seq_len / cp tokens of every sample (Note [Context parallelism]).
  const int cp = config.context_parallel_size;
  detail::ShapeOnlyGroup dp(config.dp_size * cp, 0), tp(config.tensor_parallel_size, 0);
  detail::ShapeOnlyGroup pp(config.pipeline_stages, stage, SendPolls(config, stage));
  detail::ShapeOnlyGroup cpg(cp, 0);
  nn::LayerList model = tensor::BuildParallelModel(
      config.model, tp, nn::AdapterPlan(config), config.sequence_parallel, &cpg,
      nn::ParseContextAlgorithm(config.context_parallel_algorithm));
  for (auto& layer : model) layer = detail::Measured(std::move(layer), GradAccumDType(config));
  Engine engine(config, std::move(model), {&dp, &pp, &tp, cp > 1 ? &cpg : nullptr},
                Engine::ShapeOnly{gpu ? Device::Cuda(0) : Device::Cpu()});
  const int64_t b = config.train_micro_batch_size_per_gpu, t = config.data.seq_len / cp;
  // Per-token positions, as the trainer gives them (Note [Packed documents]).
  const bool positions = cp > 1 || config.data.packed_documents;
  detail::ShapeOnlyAllocator host(Device::Cpu(), nullptr);
  const Buffer tokens(host, DType::kI32, {b, t}, MemoryCategory::kActivations);
  const Tensor view = tokens.AsTensor(DType::kI32, {b, t});
  const std::vector<nn::MicroBatch> micro(static_cast<size_t>(config.gradient_accumulation_steps),
                                          nn::MicroBatch{view, view, positions ? view : Tensor()});
  engine.TrainStep(micro);  // every step allocates the same: one is the steady state

  MemoryEstimate e;
  CopyPeaks(engine.memory(), e.peak, e.total_peak);
  CopyPeaks(engine.device_memory(), e.device_peak, e.device_total_peak);
  CopyPeaks(engine.host_memory(), e.host_peak, e.host_total_peak);
  e.pinned_host_peak = engine.pinned_memory().TotalPeak();
  e.nvme_bytes = engine.swap_file_bytes();
  e.dp = config.dp_size;
  e.pp = config.pipeline_stages;
  e.tp = config.tensor_parallel_size;
  e.cp = cp;
  e.pp_stage = stage;
  e.zero_stage = config.zero.stage;
  e.micro_batch = b;
  e.seq_len = config.data.seq_len;
  e.grad_accum = config.gradient_accumulation_steps;
  e.compute_dtype = ComputeDType(config);
  e.gpu = gpu;
  for (const auto& [name, shape] : engine.ModelParameters())
    e.model_parameters += NumElements(shape);
  e.rank_parameters = engine.NumParameters();
  e.padded_elements = engine.PaddedParameters();
  e.shard_elements = e.padded_elements / (e.dp * e.cp);
  const std::vector<int>& blocks = config.activation_checkpointing.blocks;
  for (const auto& layer : engine.layers()) {
    const int block = layer->BlockIndex();
    if (block >= 0 && std::find(blocks.begin(), blocks.end(), block) != blocks.end()) {
      ++e.checkpointed;
    }
  }
  return e;
}

}  // namespace

MemoryEstimate EstimateMemory(const Config& config, const EstimateOptions& options) {
  const Config c = ResolveConfig(config, options);
  const bool gpu = options.gpu.value_or(config.device != "cpu");
  const int first = options.pp_stage >= 0 ? options.pp_stage : 0;
  const int last = options.pp_stage >= 0 ? options.pp_stage : c.pipeline_stages - 1;
  MemoryEstimate worst;
  for (int s = first; s <= last; ++s) {
    MemoryEstimate e;
    try {
      e = EstimateStage(c, gpu, s);
    } catch (const ConfigError&) {
      throw;
    } catch (const InternalError&) {
      throw;
    } catch (const Error& error) {  // what the engine refuses at start, as the config's fault
      throw ConfigError(error.what());
    }
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
