#pragma once
// The resolved run configuration (DESIGN.md "Config").
//
// One JSON file with DeepSpeed's keys, names and defaults plus ztrain's own sections
// (model, data, training, pipeline, tensor_parallel). Parsing is strict: an unknown key is a
// ConfigError naming its JSON path and the nearest known key; a wrong type names the path and
// the expected type; "auto" is resolved; the batch triple is validated as DeepSpeed does; a
// DeepSpeed feature that ztrain does not run yet is refused naming its key. The whole
// docs/config.md reference is generated from the same schema table (core/config_schema.h),
// which also lists the refused features (ConfigRefusals) in one place.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace ztrain {

// RoPE scaling as Hugging Face's config.json gives it (rope_scaling): none, "linear" (angles
// divided by factor) or "llama3" (Llama 3.1's long-context bands).
struct RopeScalingConfig {
  std::string type = "none";  // "none", "linear", "llama3", "yarn", "dynamic"
  double factor = 1.0;
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  // The context the model was pretrained with (llama3, yarn; dynamic: where the NTK scaling
  // starts).
  int64_t original_max_position_embeddings = 8192;
  double beta_fast = 32.0;  // yarn: the ramp between extrapolated and interpolated frequencies
  double beta_slow = 1.0;
  double mscale = 0.0;  // yarn: 0 (unset) or DeepSeek's mscale and mscale_all_dim
  double mscale_all_dim = 0.0;
  double attention_factor = 0.0;  // yarn: the factor on cos and sin; 0 derives it from factor
};

struct ModelConfig {
  std::string type = "gpt2";  // a registered family (nn/family.h)
  std::string init_from;      // HF model directory or llm.c model file; empty = random init
  int n_layer = 12;
  int n_head = 12;
  int n_embd = 768;
  int64_t vocab_size = 50257;
  int64_t padded_vocab_size = 50304;  // "auto": vocab_size rounded up to a multiple of 128
  int64_t max_seq_len = 1024;
  // The Llama family's knobs (GPT-2 takes the defaults: n_kv_head = n_head, head_dim =
  // n_embd / n_head, intermediate_size = 4 n_embd, tied embeddings). 0 follows the other
  // sizes (what "auto" resolves to in a config file); read them through the accessors.
  int n_kv_head = 0;
  int head_dim = 0;
  int64_t intermediate_size = 0;  // the MLP's width
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  RopeScalingConfig rope_scaling;
  bool attention_bias = false;  // q, k, v and o projections have biases (Llama, Mistral)
  bool qkv_bias = false;        // q, k and v only (Qwen2)
  bool mlp_bias = false;
  bool tie_word_embeddings = true;
  // Sliding-window attention (Mistral, Qwen2): query i sees keys i - sliding_window + 1 .. i in
  // the layers from max_window_layers on (Qwen2's rule; 0: every layer, Mistral's); 0: none.
  int64_t sliding_window = 0;
  int max_window_layers = 0;

  // The window of layer `l` (0: full causal attention).
  int64_t WindowOf(int l) const { return l >= max_window_layers ? sliding_window : 0; }
  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int head_size() const { return head_dim > 0 ? head_dim : (n_head > 0 ? n_embd / n_head : 0); }
  int64_t mlp_hidden() const {
    return intermediate_size > 0 ? intermediate_size : 4 * int64_t{n_embd};
  }
};

// One dataset of a mixture: data.train as a list of {"path": glob, "weight": w}.
struct DataSourceSpec {
  std::string path;
  double weight = 1;
};

struct DataConfig {
  std::string train;    // glob of llm.c token shards; empty = synthetic corpus (or a mixture)
  std::string val;      // glob; empty = held-out part of the synthetic corpus / no eval
  int64_t seq_len = 0;  // "auto" or absent: model.max_seq_len
  bool shuffle = false;
  std::vector<DataSourceSpec> train_mixture;  // data.train as a list (Note [Data mixture])
  // Note [Packed documents] (data/documents.h): the boundaries' tokens, -1 = the manifest's.
  bool packed_documents = false;
  int64_t document_start_token = -1;
  int64_t document_end_token = -1;

  // No data files: the built-in synthetic corpus.
  bool synthetic() const { return train.empty() && train_mixture.empty(); }
};

struct TrainingConfig {
  int64_t steps = 100;
  uint64_t seed = 1337;
  int64_t eval_interval = 0;  // 0 = no periodic eval
  int64_t eval_batches = 8;
  std::string save_final;  // HF directory (ends in '/' or exists) or llm.c file; empty = none
  std::string output_dir = "runs/ztrain";  // reports (memory, comm); "runs/<job_name>"
  std::string job_name = "ztrain";
  double comm_timeout_s = 300.0;  // a collective waiting longer ends the job
  // A sample printed every sample_interval steps (0 = never), as llm.c does (nn/decoder.h).
  int64_t sample_interval = 0;
  int64_t sample_tokens = 64;
  std::string sample_prompt;
  double sample_temperature = 1.0;  // 0 = greedy
  std::string tokenizer;  // decodes samples; empty = model.init_from's, else byte tokens
};

// ztrain's checkpoints (checkpoint/checkpoint.h).
struct CheckpointConfig {
  std::string dir;        // empty: no checkpoints
  int64_t interval = 0;   // steps between saves; 0: only at the end and on a signal
  int64_t keep_last = 3;  // checkpoints kept
  bool resume = false;    // resume from <dir>/latest
  bool slurm_requeue = true;  // SIGUSR1 in a SLURM job: save, then `scontrol requeue` the job
};

// optimizer.param_groups: one rule of Note [Parameter groups] (optim/param_groups.h). A
// parameter belongs to the first rule that matches it, else to the group "default".
struct ParamGroupRule {
  std::string name;
  std::vector<std::string> params;     // globs over parameter names (fnmatch); empty: any name
  int ndim = 0;                        // > 0: only parameters of that many dimensions
  std::optional<double> weight_decay;  // unset: optimizer.params.weight_decay
  double lr_scale = 1.0;               // times the scheduler's learning rate
};

// What ztrain does without optimizer.param_groups: every 1-dimensional parameter (biases and
// norm weights) takes no weight decay, as Megatron and the Hugging Face Trainer do.
std::vector<ParamGroupRule> DefaultParamGroupRules();

struct OptimizerConfig {
  std::string type = "AdamW";  // "Adam" or "AdamW" as DeepSpeed spells them
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool adam_w_mode = true;  // false only for "Adam" with adam_w_mode: false (L2 decay)
  bool bias_correction = true;
  std::vector<ParamGroupRule> param_groups = DefaultParamGroupRules();
};

struct SchedulerConfig {
  std::string type;  // "" (constant lr), "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 0.001;
  int64_t warmup_num_steps = 1000;
  std::string warmup_type = "log";  // "log" or "linear"
  int64_t total_num_steps = 0;      // WarmupDecayLR, WarmupCosineLR
  double warmup_min_ratio = 0.0;    // WarmupCosineLR
  double cos_min_ratio = 0.0001;    // WarmupCosineLR
};

struct CsvMonitorConfig {
  bool enabled = false;
  std::string output_path;
  std::string job_name = "DeepSpeedJobName";
};

// zero_optimization.offload_param (stage 3): where parameter shards live.
struct OffloadParamConfig {
  std::string device = "none";      // "none", "cpu", "nvme"
  std::string nvme_path;            // swap files go to <nvme_path>/ztrain-<job>/rank<R>/
  int64_t buffer_count = 5;         // swap buffers
  int64_t buffer_size = 100000000;  // elements per swap buffer
  int64_t max_in_cpu = 1000000000;  // elements kept in memory instead of on NVMe
  bool pin_memory = false;
};

// zero_optimization.offload_optimizer (stages 1-3): where fp32 optimizer state lives.
struct OffloadOptimizerConfig {
  std::string device = "none";  // "none", "cpu", "nvme"
  std::string nvme_path;
  int64_t buffer_count = 4;
  bool pin_memory = false;
  bool pipeline_read = false;   // read tile k+1 while Adam runs on tile k
  bool pipeline_write = false;  // write tile k-1 while Adam runs on tile k
};

struct ZeroConfig {
  int stage = 0;
  bool allgather_partitions = true;
  int64_t allgather_bucket_size = 500000000;  // elements
  bool overlap_comm = false;                  // DeepSpeed: null = (stage == 3)
  bool reduce_scatter = true;
  int64_t reduce_bucket_size = 500000000;  // elements
  bool contiguous_gradients = true;
  int64_t sub_group_size = 1000000000;
  int64_t stage3_max_live_parameters = 1000000000;
  int64_t stage3_max_reuse_distance = 1000000000;
  int64_t stage3_prefetch_bucket_size = 50000000;
  int64_t stage3_param_persistence_threshold = 100000;
  OffloadParamConfig offload_param;
  OffloadOptimizerConfig offload_optimizer;
};

// The `aio` sizes the offload I/O engine takes (offload/io/io_engine.cc checks them again for
// code that builds its options by hand); the config refuses others by name.
inline constexpr int64_t kAioAlignment = 4096;  // O_DIRECT's logical block size
inline constexpr int64_t kAioMaxBlockSize = int64_t{1} << 30;
inline constexpr int64_t kAioMaxQueueDepth = 4096;
inline constexpr int64_t kAioMaxThreads = 256;

struct AioConfig {
  int64_t block_size = 1048576;
  int64_t queue_depth = 8;
  int64_t intra_op_parallelism = 1;
  bool single_submit = false;
  bool overlap_events = true;
};

struct CommsLoggerConfig {
  bool enabled = false;
  bool verbose = false;
  bool prof_all = true;
  bool debug = false;
  std::vector<std::string> prof_ops;
};

// Mixed precision (Note [Mixed precision config], core/config_resolve.cc): DeepSpeed's "bf16"
// and "fp16" sections and data_types.grad_accum_dtype. Master weights and optimizer state are
// fp32 in every mode.
struct PrecisionConfig {
  bool bf16 = false;  // bf16.enabled
  bool fp16 = false;  // fp16.enabled; never both
  // fp16's loss scale, as optim::LossScalerOptions takes it (ranges already checked).
  double loss_scale = 0;  // > 0 static, 0 dynamic
  int initial_scale_power = 16;
  int64_t loss_scale_window = 1000;
  int hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1;
  int64_t max_consecutive_skips = 50;  // ztrain: 0 = no limit
  // "fp32", "fp16" or "bf16", resolved: null is fp16 with fp16 training, else fp32; a 16-bit
  // value always equals the compute dtype.
  std::string grad_accum_dtype = "fp32";
};

// Activation checkpointing of transformer blocks (Note [Activation checkpointing config],
// core/config_resolve.cc).
struct ActivationCheckpointingConfig {
  bool enabled = false;
  bool partition_activations = false;  // shard checkpoints across tensor-parallel ranks
  bool cpu_checkpointing = false;      // keep checkpoints in host memory
  int64_t number_checkpoints = 0;      // as given; 0 = not set
  // The blocks checkpointed, ascending, each in [0, model.n_layer); empty when !enabled.
  std::vector<int> blocks;
};

// LoRA fine-tuning in PEFT's LoraConfig names (Note [Adapters and frozen parameters],
// nn/adapters.h); the `lora` section of docs/config.md says what each key does.
struct LoraConfig {
  bool enabled = false;
  int r = 8;
  double lora_alpha = 8.0;
  double lora_dropout = 0.0;
  // target_modules as given: a list of names matched by suffix, or (target_regex) one string,
  // a regular expression over Hugging Face module names, or "all-linear". Both empty: the
  // family's PEFT default.
  std::vector<std::string> target_modules;
  std::string target_regex;
  std::string bias = "none";  // "none", "all", "lora_only"
  bool use_rslora = false;
  std::vector<std::string> modules_to_save;
  std::vector<int> layers_to_transform;    // empty: every block
  std::string init_lora_weights = "true";  // "true", "false", "gaussian"
  std::string init_from;                   // a PEFT adapter directory; empty: initialise
  // The adapters' scaling: lora_alpha / r, or / sqrt(r) with use_rslora.
  double scaling() const;
};

// A quantized frozen base (QLoRA) in bitsandbytes' names (Note [Quantized base],
// nn/adapters.h); the `quantization` section of docs/config.md says what each key does.
struct QuantizationConfig {
  std::string type;           // "": not quantized; "nf4", "fp4" (load_in_4bit) or "int8"
  bool double_quant = false;  // bnb_4bit_use_double_quant
  std::vector<std::string> skip_modules;  // llm_int8_skip_modules
  bool enabled() const { return !type.empty(); }
};

// A value chosen for an "auto" in the config, and why (Note [Resolving "auto"],
// core/config_resolve.cc; the machine-dependent ones in run/run_config.h).
struct AutoChoice {
  std::string path;      // "zero_optimization.reduce_bucket_size"
  nlohmann::json value;  // 589824
  std::string reason;    // "model.n_embd^2, the HF Trainer's rule for the hidden size"
};

struct Config {
  // Where this rank trains: "auto", "cpu", "cuda" or "cuda:N" as written in the config. The
  // Trainer resolves it per rank (run/device_select.h) and hands the Engine a concrete
  // "cpu" or "cuda:N".
  std::string device = "auto";
  int64_t train_batch_size = 0;
  int64_t train_micro_batch_size_per_gpu = 0;
  int64_t gradient_accumulation_steps = 0;
  double gradient_clipping = 0.0;  // 0 = no clipping
  int64_t steps_per_print = 10;
  bool wall_clock_breakdown = false;
  ModelConfig model;
  DataConfig data;
  TrainingConfig training;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  CsvMonitorConfig csv_monitor;
  CheckpointConfig checkpoint;
  ZeroConfig zero;
  AioConfig aio;
  CommsLoggerConfig comms_logger;
  PrecisionConfig precision;
  ActivationCheckpointingConfig activation_checkpointing;
  LoraConfig lora;
  QuantizationConfig quantization;
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
  bool memory_breakdown = false;
  bool dump_state = false;
  int pipeline_stages = 1;
  std::string pipeline_partition = "parameters";  // "parameters" | "uniform"
  std::string pipeline_schedule = "1f1b";         // "1f1b" | "gpipe" (lower case)
  int tensor_parallel_size = 1;
  bool sequence_parallel = false;  // tensor_parallel.sequence_parallel
  // context_parallel.size and .algorithm ("ulysses" | "ring"): Note [Context parallelism]
  // (nn/context_parallel.h).
  int context_parallel_size = 1;
  std::string context_parallel_algorithm = "ulysses";
  // ranks in all: dp_size x context_parallel_size x pipeline_stages x tensor_parallel_size
  int world_size = 1;
  int dp_size = 1;          // data-parallel ranks, the size the batch triple was resolved for
  int ranks_on_node = 1;    // this run's ranks on this node (set by the Trainer from the launcher)
  nlohmann::json resolved;  // the full config with every default and "auto" filled in
  std::vector<AutoChoice> auto_choices;  // every "auto" resolved, in schema order
};

// The dtype the model computes in: kBF16, kF16 or kF32.
DType ComputeDType(const Config& config);
// The dtype gradients are accumulated in (data_types.grad_accum_dtype as resolved): kF32, or
// the compute dtype.
DType GradAccumDType(const Config& config);

// The `device` setting taken apart: "auto", "cpu", "cuda" (index -1), or "cuda:N" (index N).
struct DeviceSetting {
  enum class Kind { kAuto, kCpu, kCuda };
  Kind kind = Kind::kAuto;
  int index = -1;  // "cuda:N": N >= 0; otherwise -1
};
// Nullopt when `setting` is none of the accepted spellings (lower case, N a decimal index
// without sign or spaces).
std::optional<DeviceSetting> ParseDeviceSetting(std::string_view setting);
// What the `device` key accepts, for messages.
inline constexpr const char* kDeviceSettings =
    "\"auto\", \"cpu\", \"cuda\" or \"cuda:N\" (N a GPU index: 0, 1, ...)";

// Parses and validates `j` for a world of `world_size` ranks (dp = world_size /
// (pipeline.stages x tensor_parallel.size), the batch triple resolved for dp). Throws
// ConfigError listing every problem found (one per line), not just the first.
Config ParseConfig(const nlohmann::json& j, int world_size = 1);
// ParseConfig's problems, one per line ("json.path: what is wrong and how to fix it"), instead
// of the throw; `out` receives the config when there are none.
std::vector<std::string> ConfigProblems(const nlohmann::json& j, int world_size, Config* out);
// The ConfigError ParseConfig throws for `problems`: a count, then one per line.
ConfigError InvalidConfig(const std::vector<std::string>& problems);
// The dotted paths of every key that holds a value (each schema key but the sections), in the
// schema's order: what two resolved configs are compared by.
const std::vector<std::string>& ConfigValuePaths();
// The value at dotted `path` of a config tree, or null when it is not there.
const nlohmann::json* ConfigValue(const nlohmann::json& tree, std::string_view path);
// Reads a JSON file (syntax errors name the line and column) and parses it.
Config LoadConfigFile(const std::string& path, int world_size = 1);
// Reads a JSON file without parsing it as a config: a ConfigError naming the file when it
// cannot be read, is not JSON (with line:column) or repeats a key in one object.
nlohmann::json ReadConfigJson(const std::string& path);
// The built-in default: a small GPT on the synthetic corpus (used by `ztrain` without
// --config, and as the base of tests).
nlohmann::json DefaultConfigJson();

}  // namespace ztrain
