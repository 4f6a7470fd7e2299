#pragma once
// GPT-2 weights for Hugging Face transformers.
//
// SaveHfGpt2Safetensors writes the model.safetensors of a GPT-2 checkpoint directory:
// with a GPT-2 config.json beside it, transformers.GPT2LMHeadModel.from_pretrained(dir)
// loads it as is. What differs from ztrain's parameters (nn/gpt2.h):
//   - names carry GPT2LMHeadModel's "transformer." prefix ("transformer.h.0.ln_1.weight");
//   - the four linear weights per block (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) are
//     transposed: HF's GPT-2 uses Conv1D, whose weight is [in, out], where ztrain and llm.c
//     store [out, in];
//   - wte keeps only its first vocab_size rows (ztrain pads it to padded_vocab_size);
//   - there is no lm_head.weight: HF ties it to wte, as ztrain does.
// The header's __metadata__ holds {"format": "pt"} (from_pretrained refuses a safetensors
// file without it) and the ztrain model sizes ("ztrain_n_layer", ...). bf16 exports round
// the fp32 parameters to nearest even (core/dtype.h).
//
// The tensor layout is the GPT-2 family's Hugging Face adapter (HfGpt2Layout, nn/gpt2.h);
// a whole HF directory for any family is nn/hf_checkpoint.h's HfModelWriter.
//
// Errors: IoError naming the file; a lookup tensor of the wrong dtype or shape is an Error
// naming the parameter.
#include <string>
#include <vector>

#include "core/config.h"
#include "nn/llmc_model_file.h"

namespace ztrain::nn {

// Writes the model as HF GPT-2 safetensors with `dtype` kF32 or kBF16.
void SaveHfGpt2Safetensors(const std::string& path, const ModelConfig& model,
                           const ParamLookup& lookup, DType dtype);

}  // namespace ztrain::nn
