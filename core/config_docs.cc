// ConfigReferenceMarkdown: docs/config.md generated from the schema and refusal tables, so
// the reference cannot drift from what the parser accepts (ConfigDocsTest checks the file).
#include <sstream>

#include "core/config.h"
#include "core/config_schema.h"

namespace ztrain {
namespace {

using nlohmann::json;

constexpr const char* kIntro = R"(# ztrain configuration reference

<!-- Generated from core/config_schema*.cc and core/config_refusals.cc by
     ConfigReferenceMarkdown(); do not edit by hand. Regenerate with
     ZTRAIN_UPDATE_DOCS=1 ./build/tests/core/config_test --gtest_filter=ConfigDocsTest.* -->

ztrain reads one JSON file with DeepSpeed's keys, names and defaults, plus ztrain's own
sections `model`, `data` and `training`. `ztrain check-config FILE` prints the resolved
config: every key below with its default or derived value filled in.

## How a config is read

- **Strict.** An unknown key is an error naming its JSON path and the nearest known key
  (`zero_optimization.stage3_prefetch_bucketsize: unknown key; did you mean
  "zero_optimization.stage3_prefetch_bucket_size"?`). A value of the wrong type names the
  path and the expected type. All problems are reported together, one per line.
- **Numbers.** Integer keys also accept integral floats such as `5e8`, as DeepSpeed does.
- **`"auto"`.** Keys marked *auto* accept `"auto"`: batch keys count as not given (the batch
  rules derive them); `model.padded_vocab_size` is `vocab_size` rounded up to a multiple of
  128; `data.seq_len` is `model.max_seq_len`; `scheduler.params.warmup_max_lr` is
  `optimizer.params.lr`; `scheduler.params.total_num_steps` is `training.steps`;
  `zero_optimization.reduce_bucket_size` is n_embd², `stage3_prefetch_bucket_size`
  0.9·n_embd², `stage3_param_persistence_threshold` 10·n_embd (Hugging Face's rules);
  `pipeline.stages` is 1; every other `"auto"` is the key's default. `device: "auto"` stays
  in the resolved config: each rank resolves it when it starts, by the GPUs it sees.
- **Batch size**, exactly as DeepSpeed with `world_size` data-parallel ranks:
  `train_batch_size = train_micro_batch_size_per_gpu × gradient_accumulation_steps ×
  world_size`. All three given: they must agree. Two given: the third is derived (integer
  division, then checked). Only `train_batch_size`: accumulation 1, micro batch
  `train_batch_size / world_size`. Only the micro batch: accumulation 1. Neither
  `train_batch_size` nor the micro batch: error.
- **Optimizer.** `type` is matched case-insensitively. `AdamW`, and `Adam` with
  `adam_w_mode: true` (the default), decay weights decoupled from the gradient (AdamW);
  `Adam` with `adam_w_mode: false` adds `weight_decay · w` to the gradient (Adam + L2).
  Without an `optimizer` section ztrain uses AdamW with DeepSpeed's FusedAdam defaults.
- **Parameter groups.** Every parameter belongs to one group, whose settings the optimizer
  step uses: `optimizer.param_groups` is a list of rules, tried in order; a parameter joins
  the first whose `params` globs (fnmatch over ztrain's parameter names, as checkpoints list
  them: `layers.3.mlp.up_proj.weight`, `h.0.ln_1.bias`) match its name and whose `ndim` is
  its number of dimensions (each condition only when given), else the group `default`
  (`optimizer.params` as they are). Frozen parameters (LoRA's base) are the group `frozen`
  and take no step. A group sets `weight_decay` (left out: `optimizer.params.weight_decay`)
  and `lr_scale` (the scheduler's lr times it; 0 holds the group still). **By default
  ztrain decays every parameter but the 1-dimensional ones** (biases and norm weights), as
  Megatron's `no_weight_decay_cond` and the Hugging Face Trainer's
  `get_decay_parameter_names` do: `[{"name": "no_decay", "ndim": 1, "weight_decay": 0.0}]`.
  Set `"param_groups": []` to decay everything; for example, for a Llama,
  `[{"name": "no_decay", "ndim": 1, "weight_decay": 0.0}, {"name": "embeddings", "params":
  ["embed_tokens.weight"], "lr_scale": 0.1}]` also trains the embeddings at a tenth of the
  lr (GPT-2 calls them `wte`). A glob that matches no parameter of the model is an error
  naming it. The run's log lists each group's settings, tensors and elements. Gradient
  clipping and the gradient norm are over all groups together, each element counted once;
  ZeRO shards, offload and checkpoints treat every group alike.
- **Scheduler.** `WarmupLR` warms from `warmup_min_lr` to `warmup_max_lr` (which replaces
  the optimizer lr) and stays there; `WarmupDecayLR` then decays linearly back to
  `warmup_min_lr` at `total_num_steps`; `WarmupCosineLR` scales the optimizer lr: warmup from
  `warmup_min_ratio` to 1, then cosine down to `cos_min_ratio` at `total_num_steps`.
  `warmup_type` `log` (DeepSpeed's default) or `linear`. Without a scheduler the lr is
  constant.
- **Mixed precision.** `bf16.enabled` or `fp16.enabled` (not both) makes the model compute
  in bf16 or fp16; master weights and optimizer state stay fp32. fp16 multiplies the loss by
  a scale, static (`loss_scale` > 0) or dynamic: it starts at 2^`initial_scale_power`, halves
  after `hysteresis` overflowing steps, doubles after `loss_scale_window` clean ones and stays
  >= `min_loss_scale`, as DeepSpeed's. A step whose gradients overflow is skipped; after
  `max_consecutive_skips` skipped steps in a row the run stops with an error naming it.
  `data_types.grad_accum_dtype` null resolves to `fp16` with fp16 (DeepSpeed's fp16 optimizers
  keep fp16 gradients) and to `fp32` otherwise, with bf16 too (DeepSpeed would keep bf16
  gradients: set `"bf16"` for that). `"bfloat16"` is read as `"bf16"`, as DeepSpeed does.
- **Activation checkpointing.** DeepSpeed leaves what to checkpoint to model code; ztrain
  checkpoints whole transformer blocks: with `activation_checkpointing.enabled` every block,
  or those in `blocks`, or the first `number_checkpoints`. A checkpointed block keeps only
  its input in forward and recomputes its activations in backward. `enabled` absent is true
  when the section sets `number_checkpoints` or `blocks`, or `partition_activations` or
  `cpu_checkpointing` to true. The resolved config lists the checkpointed blocks in
  `blocks`. `contiguous_memory_optimization`, `synchronize_checkpoint_boundary` and `profile`
  are accepted and have no effect (see their rows).
- **Refused features.** A DeepSpeed feature ztrain does not run yet parses, but a config
  that turns it on is refused naming the key (see the last table) — never silently ignored.
  Keys that only tune how a feature runs (bucket sizes at stage 0, `aio`, `comms_logger`)
  are accepted.
)";

std::string Cell(std::string s) {
  std::string out;
  for (char c : s) {
    if (c == '|')
      out += "\\|";
    else if (c == '\n')
      out += ' ';
    else
      out += c;
  }
  return out;
}

std::string TypeText(const ConfigKey& k) {
  std::string s(ConfigTypeName(k.type));
  if (!k.choices.empty()) {
    s = "";
    for (const std::string& c : k.choices) s += (s.empty() ? "`" : ", `") + c + "`";
  }
  if (k.nullable) s += ", null";
  if (k.auto_ok) s += ", *auto*";
  return s;
}

std::string DefaultText(const ConfigKey& k) {
  if (k.type == ConfigType::kSection) return "";
  if (k.default_value.is_null()) return k.nullable ? "`null`" : "required";
  std::string s = "`";  // appended, not "`" + ...: GCC 12 warns falsely (-Wrestrict)
  s += k.default_value.dump();
  s += '`';
  return s;
}

std::string DocText(const ConfigKey& k) {
  std::string s = k.doc;
  if (!k.only_for.empty()) {
    std::string types;
    for (const std::string& t : k.only_for) types += (types.empty() ? "" : ", ") + t;
    s += " *(" + types + ")*";
  }
  return s;
}

void KeyTables(std::ostringstream& out) {
  const ConfigSchema& schema = ConfigSchema::Get();
  out << "\n## Keys\n\n### Top level\n\n"
      << "| key | type | default | meaning |\n|---|---|---|---|\n";
  for (const ConfigKey* k : schema.Children("")) {
    if (k->type == ConfigType::kSection) continue;
    out << "| `" << k->path << "` | " << TypeText(*k) << " | " << Cell(DefaultText(*k)) << " | "
        << Cell(DocText(*k)) << " |\n";
  }
  for (const ConfigKey* section : schema.Children("")) {
    if (section->type != ConfigType::kSection) continue;
    out << "\n### `" << section->path << "`\n\n"
        << section->doc << "\n\n"
        << "| key | type | default | meaning |\n|---|---|---|---|\n";
    const std::string prefix = section->path + ".";
    for (const ConfigKey& k : schema.keys()) {
      if (k.path.rfind(prefix, 0) != 0) continue;
      const std::string type = k.type == ConfigType::kSection ? "object" : TypeText(k);
      out << "| `" << k.path << "` | " << type << " | " << Cell(DefaultText(k)) << " | "
          << Cell(DocText(k)) << " |\n";
    }
  }
}

void RefusalTable(std::ostringstream& out) {
  out << "\n## Refused DeepSpeed features\n\n"
      << "These keys parse, but a config that sets them as shown is refused with the message "
         "below, naming the key. Free-form sections (`elasticity`, `autotuning`, "
         "`compression_training`, ...) are refused when any `enabled` inside them is true.\n\n"
      << "| key | refused when | why |\n|---|---|---|\n";
  for (const ConfigRefusal& r : ConfigRefusals()) {
    const size_t slot = r.why.find("{}");  // the offending value; "N" in the reference
    const std::string why =
        slot == std::string::npos ? r.why : r.why.substr(0, slot) + "N" + r.why.substr(slot + 2);
    out << "| `" << r.path << "` | " << Cell(r.when) << " | " << Cell(why) << " |\n";
  }
}

}  // namespace

std::string ConfigReferenceMarkdown() {
  std::ostringstream out;
  out << kIntro;
  KeyTables(out);
  RefusalTable(out);
  out << "\n## The built-in default config\n\n"
      << "`ztrain` without `--config` trains this small GPT on the built-in synthetic corpus "
         "(also in `configs/default.json`):\n\n```json\n"
      << DefaultConfigJson().dump(2) << "\n```\n";
  return out.str();
}

}  // namespace ztrain
