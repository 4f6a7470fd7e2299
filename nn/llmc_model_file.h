#pragma once
// GPT-2 weights in llm.c's model file format, so weights move between ztrain, llm.c and
// PyTorch (llm.c's train_gpt2.py writes and reads the same file).
//
// Layout: a 256 x int32 header {20240326, version, maxT, V, L, NH, C, Vp, 0...} followed by
// every parameter in llm.c's order: wte[Vp,C], wpe[maxT,C], then for each tensor kind all
// L layers together (ln_1.w, ln_1.b, c_attn.w, c_attn.b, attn.c_proj.w, attn.c_proj.b,
// ln_2.w, ln_2.b, c_fc.w, c_fc.b, mlp.c_proj.w, mlp.c_proj.b), then ln_f.w, ln_f.b.
// Version 3 stores the parameters in fp32, version 5 in bf16 (what train_gpt2.py writes with
// --dtype bfloat16): the fp32 values rounded to nearest even; loading widens them back.
// Writing goes to a temporary file renamed into place, so a crash never leaves a partial
// model under the final name (Note [atomic model files] in nn/model_file_util.h). Errors are
// IoError / ConfigError naming the file.
#include <functional>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/tensor.h"

namespace ztrain::nn {

inline constexpr int kLlmcModelMagic = 20240326;
inline constexpr int kLlmcModelVersion = 3;      // fp32 parameters
inline constexpr int kLlmcModelVersionBf16 = 5;  // bf16 parameters

// Resolves a parameter name ("wte", "h.0.ln_1.weight", ...) to its fp32 tensor.
using ParamLookup = std::function<Tensor(const std::string& name)>;

// The parameter names in llm.c's file order for this model shape.
std::vector<std::string> LlmcParamOrder(int n_layer);

// Writes the model with parameters stored as `dtype`: kF32 (version 3) or kBF16 (version 5).
void SaveLlmcModel(const std::string& path, const ModelConfig& model, const ParamLookup& lookup,
                   DType dtype = DType::kF32);
// Reads the header of an llm.c model file into the sizes it describes.
ModelConfig ReadLlmcModelHeader(const std::string& path);
// The element type of the file's parameters: kF32 (version 3) or kBF16 (version 5).
DType ReadLlmcModelDType(const std::string& path);
// Loads weights into the fp32 tensors `lookup` returns (bf16 files are widened); the file's
// sizes must equal `model`'s (a mismatch names both values).
void LoadLlmcModel(const std::string& path, const ModelConfig& model, const ParamLookup& lookup);

}  // namespace ztrain::nn
