#pragma once
// A run's model weights in and out of the engine: model.init_from and training.save_final.
//
// Two file kinds: llm.c's model file (GPT-2; every rank reads the whole file and keeps what it
// holds) and a Hugging Face model directory (any family: nn/hf_checkpoint.h), from which each
// rank reads only the elements it holds (Note [Reading only what a rank holds],
// engine/engine_params.cc). A save is collective over the dp, pp and tp groups: the first rank
// of the first stage receives each parameter whole and writes it; for a HF directory it
// holds one shard's bytes at a time, not the model. Errors name the file and the fix.
#include <string>

#include "core/config.h"
#include <memory>

#include "engine/engine.h"
#include "nn/decoder.h"

namespace ztrain {

// What LoadModelWeights read on this rank.
struct LoadedWeights {
  std::string format;         // "llm.c model file" | "Hugging Face directory"
  int64_t bytes_read = 0;     // tensor bytes this rank read
  int64_t bytes_in_file = 0;  // tensor bytes the file holds for the model
};

// Sets every parameter this rank holds from `path` (an llm.c model file or a HF directory).
// LoRA's adapters, which a base model's file does not hold, start from training.seed.
LoadedWeights LoadModelWeights(const std::string& path, const ModelConfig& model, Engine& e);

// A Decoder (nn/decoder.h: generation with a KV cache, fp32 on the CPU) of `model` with its
// weights from `path` (an llm.c model file or a HF directory), read once, without an engine.
std::unique_ptr<nn::Decoder> LoadDecoder(const std::string& path, const ModelConfig& model);

// Sets the tensors a PEFT adapter directory holds (nn/peft.h: the adapters, trained biases,
// modules to save of config.lora), each rank its own elements; the rest keep their values.
LoadedWeights LoadPeftAdapter(const std::string& dir, const Config& config, Engine& e);

// Writes the model to `path`: with LoRA (config.lora.enabled) the PEFT adapter directory of
// its trained tensors (nn/peft.h; the base is model.init_from's); else a HF directory when
// nn::NamesHfModelDir(path) (fp32 tensors, tokenizer files copied from model.init_from when
// it is a HF directory), else an llm.c model file. Returns what was written, for the log.
std::string SaveModelWeights(const std::string& path, const Config& config, Engine& e);

}  // namespace ztrain
