// ParseConfig: runs the passes of core/config_internal.h and copies the resolved tree into
// the typed Config.
#include "core/config.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>

#include "core/config_internal.h"
#include "core/config_schema.h"
#include "core/error.h"

namespace ztrain {
namespace detail {

using nlohmann::json;

void ConfigErrors::Add(std::string_view path, std::string_view message) {
  lines_.push_back(std::string(path) + ": " + std::string(message));
}

const json* Find(const json& tree, std::string_view path) {
  const json* node = &tree;
  while (!path.empty()) {
    const size_t dot = path.find('.');
    const std::string name(path.substr(0, dot));
    if (!node->is_object() || !node->contains(name)) return nullptr;
    node = &(*node)[name];
    path = dot == std::string_view::npos ? std::string_view() : path.substr(dot + 1);
  }
  return node;
}

json* Find(json& tree, std::string_view path) {
  return const_cast<json*>(Find(static_cast<const json&>(tree), path));
}

const json& At(const json& tree, std::string_view path) {
  const json* v = Find(tree, path);
  ZTRAIN_ASSERT(v != nullptr, "config key ", path, " missing from the resolved tree");
  return *v;
}

json& At(json& tree, std::string_view path) {
  return const_cast<json&>(At(static_cast<const json&>(tree), path));
}

int64_t ClampedInt(const json& v) {
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    return INT64_MAX;
  }
  return v.get<int64_t>();
}

std::string ValueText(const json& v, bool quote) {
  return v.is_string() && !quote ? v.get<std::string>() : v.dump();
}

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

}  // namespace detail

namespace {

using detail::At;
using nlohmann::json;

std::string Str(const json& v) { return v.is_null() ? std::string() : v.get<std::string>(); }

ModelConfig ModelFrom(const json& m) {
  ModelConfig c;
  c.type = m["type"].get<std::string>();
  c.init_from = m["init_from"].get<std::string>();
  c.n_layer = m["n_layer"];
  c.n_head = m["n_head"];
  c.n_embd = m["n_embd"];
  c.vocab_size = m["vocab_size"];
  c.padded_vocab_size = m["padded_vocab_size"];
  c.max_seq_len = m["max_seq_len"];
  c.n_kv_head = m["n_kv_head"];
  c.head_dim = m["head_dim"];
  c.intermediate_size = m["intermediate_size"];
  c.norm_eps = m["norm_eps"];
  c.rope_theta = m["rope_theta"];
  const json& rs = m["rope_scaling"];
  c.rope_scaling.type = rs["rope_type"].get<std::string>();
  c.rope_scaling.factor = rs["factor"];
  c.rope_scaling.low_freq_factor = rs["low_freq_factor"];
  c.rope_scaling.high_freq_factor = rs["high_freq_factor"];
  c.rope_scaling.original_max_position_embeddings = rs["original_max_position_embeddings"];
  c.rope_scaling.beta_fast = rs["beta_fast"];
  c.rope_scaling.beta_slow = rs["beta_slow"];
  c.rope_scaling.mscale = rs["mscale"];
  c.rope_scaling.mscale_all_dim = rs["mscale_all_dim"];
  c.rope_scaling.attention_factor = rs["attention_factor"];
  c.attention_bias = m["attention_bias"];
  c.qkv_bias = m["qkv_bias"];
  c.mlp_bias = m["mlp_bias"];
  c.tie_word_embeddings = m["tie_word_embeddings"];
  c.sliding_window = m["sliding_window"];
  c.max_window_layers = m["max_window_layers"];
  return c;
}

// optimizer.param_groups as normalised by config_validate.cc (every entry has all five keys).
std::vector<ParamGroupRule> ParamGroupRulesFrom(const json& groups) {
  std::vector<ParamGroupRule> rules;
  for (const json& g : groups) {
    ParamGroupRule r;
    r.name = g["name"];
    r.params = g["params"].get<std::vector<std::string>>();
    r.ndim = g["ndim"];
    if (!g["weight_decay"].is_null()) r.weight_decay = g["weight_decay"].get<double>();
    r.lr_scale = g["lr_scale"];
    rules.push_back(std::move(r));
  }
  return rules;
}

}  // namespace

// The schema's default (config_schema_deepspeed.cc) is the one spelling of the rule.
std::vector<ParamGroupRule> DefaultParamGroupRules() {
  return ParamGroupRulesFrom(ConfigSchema::Get().Find("optimizer.param_groups")->default_value);
}

namespace {

OptimizerConfig OptimizerFrom(const json& o) {
  OptimizerConfig c;
  c.type = o["type"].get<std::string>();
  const json& p = o["params"];
  c.lr = p["lr"];
  c.beta1 = p["betas"][0];
  c.beta2 = p["betas"][1];
  c.eps = p["eps"];
  c.weight_decay = p["weight_decay"];
  // DeepSpeed: type AdamW always decouples; Adam decouples unless adam_w_mode is false.
  c.adam_w_mode = c.type == "AdamW" || p["adam_w_mode"].get<bool>();
  c.bias_correction = p["bias_correction"];
  c.param_groups = ParamGroupRulesFrom(o["param_groups"]);
  return c;
}

SchedulerConfig SchedulerFrom(const json& s) {
  SchedulerConfig c;
  c.type = Str(s["type"]);
  const json& p = s["params"];
  c.warmup_min_lr = p.value("warmup_min_lr", c.warmup_min_lr);
  c.warmup_max_lr = p.value("warmup_max_lr", c.warmup_max_lr);
  c.warmup_num_steps = p.value("warmup_num_steps", c.warmup_num_steps);
  c.warmup_type = p.value("warmup_type", c.warmup_type);
  if (p.contains("total_num_steps")) c.total_num_steps = p["total_num_steps"];
  c.warmup_min_ratio = p.value("warmup_min_ratio", c.warmup_min_ratio);
  c.cos_min_ratio = p.value("cos_min_ratio", c.cos_min_ratio);
  return c;
}

ZeroConfig ZeroFrom(const json& z) {
  ZeroConfig c;
  c.stage = z["stage"];
  c.allgather_partitions = z["allgather_partitions"];
  c.allgather_bucket_size = z["allgather_bucket_size"];
  c.overlap_comm = z["overlap_comm"];
  c.reduce_scatter = z["reduce_scatter"];
  c.reduce_bucket_size = z["reduce_bucket_size"];
  c.contiguous_gradients = z["contiguous_gradients"];
  c.sub_group_size = z["sub_group_size"];
  c.stage3_max_live_parameters = z["stage3_max_live_parameters"];
  c.stage3_max_reuse_distance = z["stage3_max_reuse_distance"];
  c.stage3_prefetch_bucket_size = z["stage3_prefetch_bucket_size"];
  c.stage3_param_persistence_threshold = z["stage3_param_persistence_threshold"];
  const json& op = z["offload_param"];
  c.offload_param.device = op["device"].get<std::string>();
  c.offload_param.nvme_path = op["nvme_path"].is_null() ? "" : op["nvme_path"].get<std::string>();
  c.offload_param.buffer_count = op["buffer_count"];
  c.offload_param.buffer_size = op["buffer_size"];
  c.offload_param.max_in_cpu = op["max_in_cpu"];
  c.offload_param.pin_memory = op["pin_memory"];
  const json& oo = z["offload_optimizer"];
  c.offload_optimizer.device = oo["device"].get<std::string>();
  c.offload_optimizer.nvme_path =
      oo["nvme_path"].is_null() ? "" : oo["nvme_path"].get<std::string>();
  c.offload_optimizer.buffer_count = oo["buffer_count"];
  c.offload_optimizer.pin_memory = oo["pin_memory"];
  c.offload_optimizer.pipeline_read = oo["pipeline_read"];
  c.offload_optimizer.pipeline_write = oo["pipeline_write"];
  return c;
}

PrecisionConfig PrecisionFrom(const json& t) {
  PrecisionConfig c;
  const json& f = t["fp16"];
  c.bf16 = At(t, "bf16.enabled");
  c.fp16 = f["enabled"];
  c.loss_scale = f["loss_scale"];
  c.initial_scale_power = f["initial_scale_power"];
  c.loss_scale_window = f["loss_scale_window"];
  c.hysteresis = f["hysteresis"];
  c.consecutive_hysteresis = f["consecutive_hysteresis"];
  c.min_loss_scale = f["min_loss_scale"];
  c.max_consecutive_skips = f["max_consecutive_skips"];
  c.grad_accum_dtype = At(t, "data_types.grad_accum_dtype").get<std::string>();
  return c;
}

ActivationCheckpointingConfig ActivationCheckpointingFrom(const json& a) {
  ActivationCheckpointingConfig c;
  c.enabled = a["enabled"];
  c.partition_activations = a["partition_activations"];
  c.cpu_checkpointing = a["cpu_checkpointing"];
  const json& number = a["number_checkpoints"];
  c.number_checkpoints = number.is_null() ? 0 : number.get<int64_t>();
  if (c.enabled) c.blocks = a["blocks"].get<std::vector<int>>();
  return c;
}

Config ConfigFrom(const json& t, int world_size) {
  Config c;
  c.device = t["device"].get<std::string>();
  c.train_batch_size = t["train_batch_size"];
  c.train_micro_batch_size_per_gpu = t["train_micro_batch_size_per_gpu"];
  c.gradient_accumulation_steps = t["gradient_accumulation_steps"];
  c.gradient_clipping = t["gradient_clipping"];
  c.steps_per_print = t["steps_per_print"];
  c.wall_clock_breakdown = t["wall_clock_breakdown"];
  c.model = ModelFrom(t["model"]);
  const json& d = t["data"];
  c.data = DataConfig{d["train"].is_string() ? d["train"].get<std::string>() : "",
                      d["val"],
                      d["seq_len"],
                      d["shuffle"],
                      {},
                      d["packed_documents"],
                      d["document_start_token"],
                      d["document_end_token"]};
  if (d["train"].is_array()) {
    for (const json& e : d["train"]) c.data.train_mixture.push_back({e["path"], e["weight"]});
  }
  const json& tr = t["training"];
  c.training = TrainingConfig{tr["steps"],          tr["seed"],
                              tr["eval_interval"],  tr["eval_batches"],
                              tr["save_final"],     tr["output_dir"],
                              tr["job_name"],       tr["comm_timeout_s"],
                              tr["sample_interval"], tr["sample_tokens"],
                              tr["sample_prompt"],  tr["sample_temperature"],
                              tr["tokenizer"]};
  c.optimizer = OptimizerFrom(t["optimizer"]);
  c.scheduler = SchedulerFrom(t["scheduler"]);
  const json& csv = t["csv_monitor"];
  c.csv_monitor = CsvMonitorConfig{csv["enabled"], csv["output_path"], csv["job_name"]};
  const json& ck = t["checkpoint"];
  c.checkpoint = CheckpointConfig{ck["dir"], ck["interval"], ck["keep_last"], ck["resume"],
                                  ck["slurm_requeue"]};
  c.zero = ZeroFrom(t["zero_optimization"]);
  const json& aio = t["aio"];
  c.aio = AioConfig{aio["block_size"], aio["queue_depth"], aio["intra_op_parallelism"],
                    aio["single_submit"], aio["overlap_events"]};
  const json& cl = t["comms_logger"];
  c.comms_logger = CommsLoggerConfig{cl["enabled"], cl["verbose"], cl["prof_all"], cl["debug"],
                                     cl["prof_ops"].get<std::vector<std::string>>()};
  c.precision = PrecisionFrom(t);
  c.activation_checkpointing = ActivationCheckpointingFrom(t["activation_checkpointing"]);
  c.lora = detail::LoraFrom(t["lora"]);
  c.quantization = detail::QuantizationFrom(t["quantization"]);
  c.prescale_gradients = t["prescale_gradients"];
  c.gradient_predivide_factor = t["gradient_predivide_factor"];
  c.memory_breakdown = t["memory_breakdown"];
  c.dump_state = t["dump_state"];
  c.pipeline_stages = At(t, "pipeline.stages");
  c.pipeline_partition = At(t, "pipeline.partition");
  std::string schedule = At(t, "pipeline.schedule");
  std::transform(schedule.begin(), schedule.end(), schedule.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  c.pipeline_schedule = schedule;
  c.tensor_parallel_size = At(t, "tensor_parallel.size");
  c.sequence_parallel = At(t, "tensor_parallel.sequence_parallel");
  c.context_parallel_size = At(t, "context_parallel.size");
  c.context_parallel_algorithm = At(t, "context_parallel.algorithm");
  c.world_size = world_size;
  c.dp_size = world_size / (c.pipeline_stages * c.tensor_parallel_size * c.context_parallel_size);
  c.resolved = t;
  return c;
}

// DeepSpeed's older aio.thread_count counts when aio.intra_op_parallelism is not given.
void ResolveAioThreadCount(const json& input, json& tree) {
  if (detail::Find(input, "aio.intra_op_parallelism") || !detail::Find(input, "aio.thread_count")) {
    return;
  }
  At(tree, "aio.intra_op_parallelism") = At(tree, "aio.thread_count");
}

// The data-parallel size: world_size / (pipeline.stages x tensor_parallel.size x
// context_parallel.size). A world that does not divide is an error; the batch is then
// resolved for the whole world so that the other checks still run.
int DataParallelSize(const json& tree, int world_size, detail::ConfigErrors& errors) {
  const json& pp = At(tree, "pipeline.stages");
  const json& tp = At(tree, "tensor_parallel.size");
  const json& cp = At(tree, "context_parallel.size");
  for (const json* size : {&pp, &tp, &cp}) {
    if (!size->is_number_integer() || size->get<int64_t>() < 1) {
      return world_size;  // the range checks name the bad value
    }
  }
  if (world_size < 1) return world_size;
  const int64_t model_parallel = pp.get<int64_t>() * tp.get<int64_t>() * cp.get<int64_t>();
  if (world_size % model_parallel != 0) {
    // Named by the axis a user most likely just set: context parallelism when it is on.
    errors.Add(
        cp.get<int64_t>() > 1 ? "context_parallel.size" : "pipeline.stages",
        detail::StrCat("the world of ", world_size, " ranks does not divide into pipeline.stages ",
                       pp.get<int64_t>(), " x tensor_parallel.size ", tp.get<int64_t>(),
                       " x context_parallel.size ", cp.get<int64_t>(), "; launch a multiple of ",
                       model_parallel, " ranks (dp x cp x pp x tp)"));
    return world_size;
  }
  return static_cast<int>(world_size / model_parallel);
}

}  // namespace

std::optional<DeviceSetting> ParseDeviceSetting(std::string_view setting) {
  using Kind = DeviceSetting::Kind;
  if (setting == "auto") return DeviceSetting{Kind::kAuto, -1};
  if (setting == "cpu") return DeviceSetting{Kind::kCpu, -1};
  if (setting == "cuda") return DeviceSetting{Kind::kCuda, -1};
  constexpr std::string_view kPrefix = "cuda:";
  if (setting.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  const std::string_view digits = setting.substr(kPrefix.size());
  int index = -1;
  const char* end = digits.data() + digits.size();
  // from_chars takes a leading '-'; an index is digits only.
  if (digits.empty() || !std::isdigit(static_cast<unsigned char>(digits[0]))) return std::nullopt;
  const auto [ptr, ec] = std::from_chars(digits.data(), end, index);
  if (ec != std::errc() || ptr != end) return std::nullopt;
  return DeviceSetting{Kind::kCuda, index};
}

DType ComputeDType(const Config& config) {
  if (config.precision.bf16) return DType::kBF16;
  if (config.precision.fp16) return DType::kF16;
  return DType::kF32;
}

DType GradAccumDType(const Config& config) { return ParseDType(config.precision.grad_accum_dtype); }

ConfigError InvalidConfig(const std::vector<std::string>& problems) {
  std::string msg = detail::StrCat("invalid config (", problems.size(),
                                   problems.size() == 1 ? " problem):" : " problems):");
  for (const std::string& line : problems) msg += "\n  " + line;
  return ConfigError(msg);
}

const std::vector<std::string>& ConfigValuePaths() {
  static const std::vector<std::string> paths = [] {
    std::vector<std::string> p;
    for (const ConfigKey& k : ConfigSchema::Get().keys()) {
      if (k.type != ConfigType::kSection) p.push_back(k.path);
    }
    return p;
  }();
  return paths;
}

const nlohmann::json* ConfigValue(const nlohmann::json& tree, std::string_view path) {
  return detail::Find(tree, path);
}

Config ParseConfig(const nlohmann::json& j, int world_size) {
  Config c;
  const std::vector<std::string> problems = ConfigProblems(j, world_size, &c);
  if (!problems.empty()) throw InvalidConfig(problems);
  return c;
}

std::vector<std::string> ConfigProblems(const nlohmann::json& j, int world_size, Config* out) {
  detail::ConfigErrors errors;
  json tree = detail::BuildResolvedTree(j, errors);
  ResolveAioThreadCount(j, tree);
  detail::ResolveLora(j, tree);
  std::vector<AutoChoice> choices;
  detail::ResolveDerived(tree, choices);
  detail::ResolveBatchSize(tree, DataParallelSize(tree, world_size, errors), errors);
  const json* batch = detail::Find(j, "train_batch_size");
  if (batch && *batch == "auto" && errors.empty()) {
    choices.insert(choices.begin(),
                   {"train_batch_size", tree["train_batch_size"],
                    "train_micro_batch_size_per_gpu x gradient_accumulation_steps x "
                    "data-parallel ranks"});
  }
  detail::CheckRefusals(tree, errors);
  detail::CheckRanges(tree, errors);
  if (!errors.empty()) return errors.lines();
  Config c = ConfigFrom(tree, world_size);
  // The "auto"s the config wrote (not the schema defaults that are "auto", e.g. data.seq_len).
  for (AutoChoice& a : choices) {
    const json* v = detail::Find(j, a.path);
    if (v && *v == "auto") c.auto_choices.push_back(std::move(a));
  }
  *out = std::move(c);
  return {};
}

}  // namespace ztrain
