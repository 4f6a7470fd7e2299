#pragma once
// `ztrain export`: one consolidated model file from a checkpoint written by any layout.
//
// ExportCheckpoint reads the fp32 master values of every parameter from the rank files
// (checking every file's size and checksum first), and writes them as llm.c's model file
// ("llmc": version 3 fp32 or 5 bf16) or as Hugging Face GPT-2 safetensors ("safetensors":
// transformer.* names, Conv1D weights transposed, vocabulary rows unpadded), for which it
// also writes config.json beside the file so that transformers.GPT2LMHeadModel
// .from_pretrained(<that directory>) loads it. `checkpoint` is a step directory
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
};

// format: "llmc" | "safetensors"; dtype: kF32 | kBF16. Throws ConfigError for other values,
// IoError for a missing, corrupt or incomplete checkpoint.
ExportResult ExportCheckpoint(const std::string& checkpoint, const std::string& format,
                              const std::string& out, DType dtype);

}  // namespace ztrain
