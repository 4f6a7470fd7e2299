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
// transposed, vocabulary rows unpadded) with config.json beside it. `checkpoint` is a step directory
// (<checkpoint.dir>/step<N>), which must be intact, or checkpoint.dir itself: its `latest`,
// falling back to the newest intact checkpoint as a resume does (saying so). `out` may not be
// inside the checkpoint directory nor the checkpoint's model.init_from (ConfigError): an
// export never overwrites what it reads. Not collective: one process, any machine that can
// read the files.
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

// format: "hf" | "llmc" | "safetensors"; dtype: kF32 | kBF16 (| kF16 for "hf"). Throws
// ConfigError for other values and for a non-GPT-2 model in llmc/safetensors, IoError for a
// missing, corrupt or incomplete checkpoint.
ExportResult ExportCheckpoint(const std::string& checkpoint, const std::string& format,
                              const std::string& out, DType dtype,
                              int64_t max_shard_bytes = 5'000'000'000);

}  // namespace ztrain
