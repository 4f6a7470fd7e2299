// The schema table's lookup, and ztrain's own keys (device, model, data, training).
#include "core/config_schema.h"

#include <unordered_map>
#include <utility>

namespace ztrain {

std::string_view ConfigTypeName(ConfigType type) {
  switch (type) {
    case ConfigType::kBool:
      return "boolean";
    case ConfigType::kInt:
      return "integer";
    case ConfigType::kNumber:
      return "number";
    case ConfigType::kString:
      return "string";
    case ConfigType::kStringList:
      return "array of strings";
    case ConfigType::kIntList:
      return "array of integers";
    case ConfigType::kNumberPair:
      return "array of 2 numbers";
    case ConfigType::kStringOrList:
      return "string or array of strings";
    case ConfigType::kIntOrList:
      return "integer or array of integers";
    case ConfigType::kBoolOrString:
      return "boolean or string";
    case ConfigType::kDataSources:
      return "string or array of {\"path\", \"weight\"} objects";
    case ConfigType::kParamGroups:
      return "array of parameter-group objects";
    case ConfigType::kSection:
      return "object";
    case ConfigType::kFreeObject:
      return "object";
  }
  return "?";
}

ConfigKey ConfigKey::Nullable() const {
  ConfigKey k = *this;
  k.nullable = true;
  return k;
}
ConfigKey ConfigKey::Auto() const {
  ConfigKey k = *this;
  k.auto_ok = true;
  return k;
}
ConfigKey ConfigKey::Choices(std::vector<std::string> values) const {
  ConfigKey k = *this;
  k.choices = std::move(values);
  return k;
}
ConfigKey ConfigKey::OnlyFor(std::vector<std::string> types) const {
  ConfigKey k = *this;
  k.only_for = std::move(types);
  return k;
}

ConfigSchema::ConfigSchema(std::vector<ConfigKey> keys) : keys_(std::move(keys)) {}

const ConfigSchema& ConfigSchema::Get() {
  static const ConfigSchema schema = [] {
    std::vector<ConfigKey> keys = detail::DeepSpeedCoreKeys();
    for (auto part : {detail::DeepSpeedOtherKeys(), detail::ZtrainKeys()}) {
      keys.insert(keys.end(), part.begin(), part.end());
    }
    return ConfigSchema(std::move(keys));
  }();
  return schema;
}

const ConfigKey* ConfigSchema::Find(std::string_view path) const {
  // Linear scan: ~200 keys, looked up a few hundred times per parse.
  for (const ConfigKey& k : keys_) {
    if (k.path == path) return &k;
  }
  return nullptr;
}

std::vector<const ConfigKey*> ConfigSchema::Children(std::string_view path) const {
  std::vector<const ConfigKey*> out;
  const std::string prefix = path.empty() ? "" : std::string(path) + ".";
  for (const ConfigKey& k : keys_) {
    if (k.path.size() <= prefix.size() || k.path.compare(0, prefix.size(), prefix) != 0) continue;
    if (k.path.find('.', prefix.size()) == std::string::npos) out.push_back(&k);
  }
  return out;
}

const std::vector<std::string>& SupportedOptimizerTypes() {
  static const std::vector<std::string> types = {"Adam", "AdamW"};
  return types;
}

const std::vector<std::string>& SupportedSchedulerTypes() {
  static const std::vector<std::string> types = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"};
  return types;
}

namespace detail {

ConfigKey Key(std::string path, ConfigType type, nlohmann::json def, std::string doc) {
  ConfigKey k;
  k.path = std::move(path);
  k.type = type;
  k.default_value = std::move(def);
  k.doc = std::move(doc);
  return k;
}

namespace {
using T = ConfigType;
}  // namespace

namespace {

// LoRA in PEFT's LoraConfig names (Note [Adapters and frozen parameters], nn/adapters.h).
std::vector<ConfigKey> LoraKeys() {
  return {
      Key("lora", T::kSection, nullptr,
          "LoRA fine-tuning, in PEFT's `LoraConfig` names: the base model is frozen (no "
          "gradients, no optimizer state, stored in the compute dtype) and each targeted "
          "linear W gets adapters A [r, in] and B [out, r]: y = x W^T + scaling (x A^T) B^T."),
      Key("lora.enabled", T::kBool, nullptr,
          "ztrain: train LoRA adapters. null (absent): true when the config has a `lora` "
          "section.")
          .Nullable(),
      Key("lora.r", T::kInt, 8, "The adapters' rank."),
      Key("lora.lora_alpha", T::kNumber, 8.0, "scaling = lora_alpha / r (or / sqrt(r))."),
      Key("lora.lora_dropout", T::kNumber, 0.0,
          "Dropout on the adapters' input (PEFT's `lora_dropout`), in [0, 1): while training, "
          "each adapter drops each element of its input with this probability and scales "
          "the rest by 1 / (1 - p); evaluation drops nothing. The mask depends on "
          "training.seed, the step, the micro-batch and the element's place in the global "
          "batch only, so every layout draws the same one."),
      Key("lora.target_modules", T::kStringOrList, nullptr,
          "The linears to adapt: names matched as PEFT matches them (a linear whose name is "
          "the entry or ends with `.` + the entry: `q_proj`, `self_attn.v_proj`; GPT-2: "
          "`c_attn`, `c_proj`, `c_fc`), a string matched as a whole against each linear's "
          "Hugging Face module name as a regular expression "
          "(`model.layers.0.self_attn.q_proj`), or `\"all-linear\"`: every linear of the "
          "blocks. null: the family's PEFT default (Llama: `q_proj`, `v_proj`; GPT-2: "
          "`c_attn`).")
          .Nullable(),
      Key("lora.bias", T::kString, "none",
          "Which biases train: `none`, `all` (every bias of the model), `lora_only` (those "
          "of the adapted linears).")
          .Choices({"none", "all", "lora_only"}),
      Key("lora.use_rslora", T::kBool, false,
          "Rank-stabilised LoRA: scaling = lora_alpha / sqrt(r) instead of lora_alpha / r."),
      Key("lora.modules_to_save", T::kStringList, nullptr,
          "Modules trained whole besides the adapters: those whose Hugging Face module name "
          "ends with an entry, as PEFT matches them (`lm_head`, `embed_tokens`, `norm`). Not "
          "with tied embeddings.")
          .Nullable(),
      Key("lora.layers_to_transform", T::kIntOrList, nullptr,
          "Only these blocks (0-based) get adapters; null: every block.")
          .Nullable(),
      Key("lora.init_lora_weights", T::kBoolOrString, true,
          "`true` (PEFT's default): A Kaiming-uniform (bound 1/sqrt(in)), B zero, so training "
          "starts from the base model; `\"gaussian\"`: A normal(0, 1/r), B zero; `false`: "
          "both Kaiming-uniform (a test setting: the start is not the base model)."),
      Key("lora.init_from", T::kString, "",
          "A PEFT adapter directory (adapter_config.json, adapter_model.safetensors) to start "
          "from; its adapter_config.json sets every key above, and a key given here that "
          "disagrees is an error naming both values."),
      Key("lora.task_type", T::kString, "CAUSAL_LM",
          "PEFT's task type; ztrain trains causal language models.")
          .Choices({"CAUSAL_LM"}),
      Key("lora.peft_type", T::kString, "LORA", "PEFT's adapter type.").Choices({"LORA"}),
  };
}

// A quantized frozen base (QLoRA) in bitsandbytes' names, as transformers'
// BitsAndBytesConfig writes them (Note [Quantized base] in nn/adapters.h).
std::vector<ConfigKey> QuantizationKeys() {
  return {
      Key("quantization", T::kSection, nullptr,
          "A quantized frozen base under LoRA (QLoRA), in transformers' `BitsAndBytesConfig` "
          "names: the block linears' weights are quantized while loading, as bitsandbytes "
          "quantizes them, kept (and at ZeRO-3 sharded, gathered and offloaded) quantized, "
          "and dequantized into the compute dtype per linear just before its GEMM. Needs a "
          "`lora` section."),
      Key("quantization.quant_method", T::kString, "bitsandbytes",
          "transformers' name of the method.")
          .Choices({"bitsandbytes"}),
      Key("quantization.load_in_4bit", T::kBool, false,
          "4-bit weights (NF4 or FP4): blocks of 64 consecutive elements, an fp32 absmax per "
          "block, two codes a byte."),
      Key("quantization.load_in_8bit", T::kBool, false,
          "LLM.int8 weights: int8 codes with an fp32 absmax per row (the weight rounded to "
          "fp16 first, as bitsandbytes does). No column is kept in 16 bits: bitsandbytes "
          "keeps weights whole in int8 too; its outlier threshold applies to activations, and "
          "ztrain multiplies every column with the dequantized weight in the compute dtype."),
      Key("quantization.bnb_4bit_quant_type", T::kString, nullptr,
          "`nf4` (QLoRA's NormalFloat) or `fp4`. null: `fp4`, bitsandbytes' default. Only with "
          "load_in_4bit.")
          .Nullable()
          .Choices({"nf4", "fp4"}),
      Key("quantization.bnb_4bit_use_double_quant", T::kBool, nullptr,
          "Double quantization: the absmax values less their mean in 8-bit blocks of 256 "
          "(0.127 bits a weight instead of 0.5). null: false. Only with load_in_4bit.")
          .Nullable(),
      Key("quantization.bnb_4bit_compute_dtype", T::kString, nullptr,
          "The dtype weights are dequantized into: it must be the run's compute dtype "
          "(`bfloat16` with bf16.enabled, `float16` with fp16.enabled, else `float32`). null: "
          "the run's.")
          .Nullable()
          .Choices({"float32", "bfloat16", "float16"}),
      Key("quantization.bnb_4bit_quant_storage", T::kString, "uint8",
          "The packed codes' storage type; ztrain stores bytes.")
          .Choices({"uint8"}),
      Key("quantization.llm_int8_skip_modules", T::kStringList, nullptr,
          "Linears left unquantized (in the compute dtype): a block linear whose Hugging Face "
          "module name is an entry, ends with `.` + an entry, or lies inside a module so named "
          "(`mlp`, `model.layers.0`). The embeddings and the head are never quantized.")
          .Nullable(),
      Key("quantization.llm_int8_threshold", T::kNumber, 6.0,
          "bitsandbytes' outlier threshold for LLM.int8 activations. ztrain computes every "
          "column in the compute dtype, so only the default is accepted."),
      Key("quantization.llm_int8_has_fp16_weight", T::kBool, false,
          "bitsandbytes: keep trainable 16-bit weights beside the int8 ones. Not run: the "
          "quantized base is frozen; train it through the adapters."),
      Key("quantization.llm_int8_enable_fp32_cpu_offload", T::kBool, false,
          "transformers: put modules that do not fit on the CPU in fp32. ztrain places memory "
          "through zero_optimization's offload_param / offload_optimizer instead."),
  };
}

std::vector<ConfigKey> ModelDataTrainingKeys() {
  return {
      Key("device", T::kString, "auto",
          "ztrain: where each rank trains. `auto`: the GPU numbered by the rank's local rank "
          "(its place among the ranks of its node) when the node has a GPU for each of its "
          "ranks, else the CPU; `cpu`; `cuda`: the GPU of the local rank (one rank per GPU), "
          "an error when the node has too few; `cuda:N`: GPU N (one rank per node, or `cuda:0` "
          "when the launcher gives each rank its own GPU). The start log says which and why. "
          "On CUDA the ranks communicate through NCCL."),
      Key("model", T::kSection, nullptr, "ztrain: the model to train."),
      Key("model.type", T::kString, "gpt2",
          "Model family, one of the families `nn/family.cc` registers: `gpt2` (llm.c's GPT-2, "
          "Hugging Face GPT2LMHeadModel) or `llama` (Llama 2/3, Mistral, Qwen2).")
          .Choices({"gpt2", "llama"}),
      Key("model.init_from", T::kString, "",
          "Weights to start from: a Hugging Face model directory (config.json with "
          "model.safetensors, or sharded files with model.safetensors.index.json; F32, BF16 or "
          "F16), whose config.json sets `type` and every shape key below, or an llm.c model "
          "file (`gpt2_124M.bin`), whose header sets the GPT-2 shape. A key given here that "
          "disagrees is an error naming both values. Each rank reads only the elements it "
          "holds. Empty = random init from `training.seed`."),
      Key("model.n_layer", T::kInt, 12, "Number of transformer blocks."),
      Key("model.n_head", T::kInt, 12, "Attention heads per block; must divide `n_embd`."),
      Key("model.n_embd", T::kInt, 768, "Hidden size."),
      Key("model.vocab_size", T::kInt, 50257, "Number of real tokens (GPT-2: 50257)."),
      Key("model.padded_vocab_size", T::kInt, "auto",
          "Embedding rows, >= `vocab_size`; the extra rows are never predicted. `\"auto\"`: "
          "`vocab_size` rounded up to a multiple of 128.")
          .Auto(),
      Key("model.max_seq_len", T::kInt, 1024,
          "Context size: rows of GPT-2's position embedding, the longest sequence Llama takes."),
      Key("model.n_kv_head", T::kInt, "auto",
          "Key/value heads (Llama): each serves `n_head / n_kv_head` consecutive query heads "
          "(grouped-query attention; 1 = multi-query). `\"auto\"`: `n_head` (0 is "
          "refused).")
          .Auto(),
      Key("model.head_dim", T::kInt, "auto",
          "Features per attention head (Llama). `\"auto\"`: `n_embd / n_head` (0 is refused).")
          .Auto(),
      Key("model.intermediate_size", T::kInt, "auto",
          "Width of the MLP (Llama's SwiGLU gate/up). `\"auto\"`: `4 n_embd` (GPT-2's; 0 is "
          "refused).")
          .Auto(),
      Key("model.norm_eps", T::kNumber, 1e-5,
          "Epsilon of the norms (Llama's `rms_norm_eps`; GPT-2's LayerNorm uses 1e-5)."),
      Key("model.rope_theta", T::kNumber, 10000.0, "RoPE base (Llama)."),
      Key("model.rope_scaling", T::kSection, nullptr,
          "RoPE scaling (Llama), Hugging Face's `rope_scaling`."),
      Key("model.rope_scaling.rope_type", T::kString, "none",
          "`none`, `linear` (angles divided by `factor`), `llama3` (Llama 3.1's bands), `yarn` "
          "(YaRN: frequencies blended between extrapolation and interpolation by `factor`, cos "
          "and sin scaled by the attention factor) or `dynamic` (dynamic NTK: past "
          "`original_max_position_embeddings` positions the base grows with the sequence), as "
          "transformers computes them; see docs/long_context.md.")
          .Choices({"none", "linear", "llama3", "yarn", "dynamic"}),
      Key("model.rope_scaling.factor", T::kNumber, 1.0, "Scaling factor."),
      Key("model.rope_scaling.low_freq_factor", T::kNumber, 1.0, "`llama3`: low-frequency factor."),
      Key("model.rope_scaling.high_freq_factor", T::kNumber, 4.0,
          "`llama3`: high-frequency factor."),
      Key("model.rope_scaling.original_max_position_embeddings", T::kInt, 8192,
          "`llama3`, `yarn`: the context the model was pretrained with; `dynamic`: the length "
          "past which the base grows (Hugging Face's `max_position_embeddings`)."),
      Key("model.rope_scaling.beta_fast", T::kNumber, 32.0,
          "`yarn`: rotations where the ramp from extrapolated to interpolated frequencies "
          "starts."),
      Key("model.rope_scaling.beta_slow", T::kNumber, 1.0, "`yarn`: rotations where it ends."),
      Key("model.rope_scaling.mscale", T::kNumber, 0.0,
          "`yarn`: with `mscale_all_dim`, the attention factor is "
          "`(0.1 mscale ln factor + 1) / (0.1 mscale_all_dim ln factor + 1)`; 0: unset."),
      Key("model.rope_scaling.mscale_all_dim", T::kNumber, 0.0, "`yarn`: see `mscale`."),
      Key("model.rope_scaling.attention_factor", T::kNumber, 0.0,
          "`yarn`: the factor on cos and sin; 0 derives it (`0.1 ln factor + 1` for factor > "
          "1, else 1)."),
      Key("model.attention_bias", T::kBool, false,
          "Biases on the q, k, v and o projections (Llama, Mistral: Hugging Face's "
          "`attention_bias`)."),
      Key("model.qkv_bias", T::kBool, false, "Biases on q, k and v only (Qwen2)."),
      Key("model.mlp_bias", T::kBool, false, "Biases on the MLP's projections (Llama)."),
      Key("model.tie_word_embeddings", T::kBool, true,
          "The LM head shares the token embedding (GPT-2 always; Llama-3.2-1B yes, Llama-2/3 "
          "7B/8B no)."),
      Key("model.sliding_window", T::kInt, 0,
          "Sliding-window attention (Llama family): each query sees itself and the "
          "`sliding_window - 1` positions before it (Mistral's and Qwen2's `sliding_window`; "
          "Hugging Face's `kv_idx > q_idx - sliding_window`). 0: full causal attention. "
          "Generation keeps only the window in its KV cache."),
      Key("model.max_window_layers", T::kInt, 0,
          "With `sliding_window`: layers `0 .. max_window_layers - 1` attend fully, the rest "
          "through the window (Qwen2's `max_window_layers`); 0: every layer (Mistral)."),

      Key("data", T::kSection, nullptr, "ztrain: where the tokens come from."),
      Key("data.train", T::kDataSources, "",
          "Glob of llm.c token shards (`.bin`: uint16 tokens, magic 20240520, or uint32 tokens, "
          "magic 20240801; one glob may mix them); empty = the built-in synthetic corpus. Or a "
          "mixture: a list of `{\"path\": glob, \"weight\": w}` (weight > 0, default 1, "
          "normalised to sum 1): every prefix of the run draws each dataset's share of samples "
          "to within one, in an order independent of the layout (docs/data.md, \"Mixing "
          "datasets\")."),
      Key("data.val", T::kString, "",
          "Glob of validation shards; empty = a held-out part of the synthetic corpus when "
          "`data.train` is empty, else no evaluation."),
      Key("data.seq_len", T::kInt, "auto",
          "Tokens per sample, <= `model.max_seq_len`. `\"auto\"`: `model.max_seq_len`.")
          .Auto(),
      Key("data.shuffle", T::kBool, false,
          "Shuffle samples (by `training.seed`, independent of the parallel layout)."),
      Key("data.packed_documents", T::kBool, false,
          "Train on the documents packed in each sample as if each were alone (Hugging Face's "
          "`DataCollatorWithFlattening`): attention stays within a document, RoPE positions "
          "restart at its first token, and no loss is taken where the target is the next "
          "document's first token; the loss is the mean over the global batch's other targets "
          "(docs/long_context.md, \"Packed documents\"). The boundaries are the document tokens "
          "`ztrain data` wrote, read from the corpus manifest, or the two keys below."),
      Key("data.document_start_token", T::kInt, -1,
          "With `packed_documents`: the token each document starts with (`<|endoftext|>` = "
          "50256 in llm.c's GPT-2 shards, `<|begin_of_text|>` = 128000 for Llama-3); -1: from "
          "the corpus manifest."),
      Key("data.document_end_token", T::kInt, -1,
          "With `packed_documents`: the token each document ends with (an EOS appended to each "
          "document), for data without a start token; -1: from the corpus manifest."),

      Key("training", T::kSection, nullptr, "ztrain: the training run."),
      Key("training.steps", T::kInt, 100, "Optimizer steps to run (0 = only evaluate)."),
      Key("training.seed", T::kInt, 1337,
          "Seed of the initial weights and the sample order; the same for every layout."),
      Key("training.eval_interval", T::kInt, 0,
          "Evaluate the validation loss every this many steps (0 = never)."),
      Key("training.eval_batches", T::kInt, 8, "Micro-batches per evaluation."),
      Key("training.save_final", T::kString, "",
          "The model written at the end: a path ending in `/` or an existing directory "
          "gets a Hugging Face model directory (config.json, fp32 safetensors, sharded above "
          "5 GB with an index, generation_config.json, the tokenizer files of a HF "
          "`model.init_from`); any other path an llm.c model file (GPT-2); empty = none. Written "
          "beside the path and put in place whole, replacing an earlier save in one step; a "
          "directory holding other than a model's files is refused."),
      Key("training.job_name", T::kString, "ztrain",
          "Name of the run: names its output directory (and, with offload, its swap files)."),
      Key("training.output_dir", T::kString, "",
          "Directory for reports (memory, communication, csv_monitor); empty = "
          "`runs/<training.job_name>`."),
      Key("training.comm_timeout_s", T::kNumber, 300.0,
          "Seconds a rank waits in one collective before it reports the op and the whole job "
          "is ended (a rank that died, raised or hangs)."),
      Key("training.sample_interval", T::kInt, 0,
          "Print a sample of `sample_tokens` tokens every this many steps and at the end, as "
          "llm.c does (0 = never); the first rank generates it on the CPU with a KV cache "
          "(docs/data.md, \"Text back out\"). Not for LoRA runs (generate from the merged "
          "export: `ztrain generate --checkpoint`)."),
      Key("training.sample_tokens", T::kInt, 64, "Tokens each sample generates."),
      Key("training.sample_prompt", T::kString, "",
          "Text each sample continues, after the model's document tokens (empty: those alone, "
          "as llm.c starts from <|endoftext|>)."),
      Key("training.sample_temperature", T::kNumber, 1.0,
          "Sampling temperature of the samples (0 = greedy); the stream is seeded by "
          "`training.seed` and the step."),
      Key("training.tokenizer", T::kString, "",
          "The tokenizer samples are decoded with (tokenizer.json, a SentencePiece .model, or a "
          "directory); empty = `model.init_from`'s when it holds one, else byte tokens when the "
          "vocabulary is that small, else the ids are printed."),
  };
}

}  // namespace

std::vector<ConfigKey> ZtrainKeys() {
  std::vector<ConfigKey> keys = ModelDataTrainingKeys();
  for (ConfigKey& k : LoraKeys()) keys.push_back(std::move(k));
  for (ConfigKey& k : QuantizationKeys()) keys.push_back(std::move(k));
  return keys;
}

}  // namespace detail
}  // namespace ztrain
