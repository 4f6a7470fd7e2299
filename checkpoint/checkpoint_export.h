#pragma once
// `ztrain export`: one consolidated model file from a checkpoint written by any layout.
//
// ExportCheckpoint reads the fp32 master values of every parameter from the rank files
// (checking every file's size and checksum first), and writes them as a Hugging Face model
// directory for any family ("hf": nn/hf_checkpoint.h's HfModelWriter, safetensors shards of
// at most max_shard_bytes with an index, config.json, generation_config.json, and the
// tokenizer files of the run's model.init_from when that was a HF directory; one parameter in
// memory at a time), as llm.c's model file ("llmc", GPT-2: version 3 fp32 or 5 bf16) or as
// one Hugging Face GPT-2 safetensors file ("safetensors": transformer.* names, Conv1D weights
// transposed, vocabulary rows unpadded) with config.json beside it. A LoRA run's checkpoint
// (which holds the trained tensors only) exports as its PEFT adapter ("peft": nn/peft.h), or
// with `merge` as the whole model ("hf"): the base of its model.init_from (or of
// training.seed) with each adapter's scaling B A added into its weight and the trained biases
// and modules in place, as PEFT's merge_and_unload computes it. `checkpoint` is a step directory
// (<checkpoint.dir>/step<N>), which must be intact, or checkpoint.dir itself: its `latest`,
// falling back to the newest intact checkpoint as a resume does (saying so). `out` may not be
// inside the checkpoint directory, nor be, lie in or contain the checkpoint's
// model.init_from or lora.init_from (ConfigError): an export never overwrites what it reads.
// The export is staged beside `out` and put in place only when whole (Note [Staged outputs],
// core/staged_output.h); an `out` that holds anything is refused unless `overwrite`, and then
// replaced in one step. Not collective: one process, any machine that can read the files.
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace ztrain {

struct ExportResult {
  std::string checkpoint;  // the step directory read
  int64_t step = 0;
  int64_t parameters = 0;  // elements exported
  int files = 0;           // model files written (safetensors shards for "hf")
};

// format: "hf" | "llmc" | "safetensors" | "peft"; dtype: kF32 | kBF16 (| kF16 for "hf" and
// "peft"). Throws ConfigError for other values, for a non-GPT-2 model in llmc/safetensors,
// for "peft" or `merge` without LoRA and for a LoRA checkpoint in another format; IoError for
// a missing, corrupt or incomplete checkpoint or base.
ExportResult ExportCheckpoint(const std::string& checkpoint, const std::string& format,
                              const std::string& out, DType dtype,
                              int64_t max_shard_bytes = 5'000'000'000, bool merge = false,
                              bool overwrite = false);

}  // namespace ztrain
