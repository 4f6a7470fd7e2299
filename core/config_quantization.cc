// The `quantization` section (transformers' BitsAndBytesConfig names): the values the trainer
// cannot use, and the parsed struct. What a quantized base is, is nn/adapters.h's.
#include "core/config_internal.h"

namespace ztrain::detail {
namespace {

using nlohmann::json;

// The run's compute dtype in bnb_4bit_compute_dtype's spelling.
std::string RunComputeDType(const json& t) {
  if (At(t, "bf16.enabled") == true) return "bfloat16";
  if (At(t, "fp16.enabled") == true) return "float16";
  return "float32";
}

// A 4-bit key given without load_in_4bit would leave the base unquantized without a word.
void CheckFourBitKeys(const json& t, bool four_bit, ConfigErrors& errors) {
  for (const char* key : {"quantization.bnb_4bit_quant_type",
                          "quantization.bnb_4bit_use_double_quant",
                          "quantization.bnb_4bit_compute_dtype"}) {
    if (!four_bit && !At(t, key).is_null()) {
      errors.Add(key, "is set but quantization.load_in_4bit is false; set load_in_4bit to true, "
                      "or remove the key");
    }
  }
  const json& dtype = At(t, "quantization.bnb_4bit_compute_dtype");
  if (!dtype.is_string() || dtype == RunComputeDType(t)) return;
  errors.Add("quantization.bnb_4bit_compute_dtype",
             StrCat("is ", ValueText(dtype), " but the run computes in ", RunComputeDType(t),
                    " (bf16.enabled / fp16.enabled); weights are dequantized into the run's "
                    "compute dtype: set it to \"",
                    RunComputeDType(t), "\" or null, or change the run's precision"));
}

}  // namespace

void CheckQuantization(const json& t, ConfigErrors& errors) {
  const bool four = At(t, "quantization.load_in_4bit") == true;
  const bool eight = At(t, "quantization.load_in_8bit") == true;
  if (four && eight) {
    errors.Add("quantization.load_in_8bit",
               "true together with load_in_4bit true; choose one (4-bit: a quarter of bf16's "
               "bytes; 8-bit: half)");
  }
  CheckFourBitKeys(t, four, errors);
  if ((four || eight) && At(t, "lora.enabled") != true) {
    errors.Add(four ? "quantization.load_in_4bit" : "quantization.load_in_8bit",
               "a quantized base is frozen, so nothing would train; add a `lora` section "
               "(QLoRA: adapters over the quantized base), or remove the quantization");
  }
  if (At(t, "quantization.llm_int8_threshold").get<double>() != 6.0) {
    errors.Add("quantization.llm_int8_threshold",
               StrCat("is ", At(t, "quantization.llm_int8_threshold").get<double>(),
                      "; ztrain multiplies every column with the dequantized weight in the "
                      "compute dtype (bitsandbytes' outlier path for all of them), so there is "
                      "no threshold to set: remove the key or give 6.0"));
  }
  if (At(t, "quantization.llm_int8_has_fp16_weight") == true) {
    errors.Add("quantization.llm_int8_has_fp16_weight",
               "true trains the 8-bit weights themselves, which ztrain does not run; the "
               "quantized base is frozen and trains through the lora adapters: set false");
  }
  if (At(t, "quantization.llm_int8_enable_fp32_cpu_offload") == true) {
    errors.Add("quantization.llm_int8_enable_fp32_cpu_offload",
               "is transformers' device_map placement, which ztrain does not use; offload "
               "with zero_optimization.offload_param (the quantized base's shards move to host "
               "memory) and set this false");
  }
  const json& skip = At(t, "quantization.llm_int8_skip_modules");
  if (skip.is_array()) {
    for (const json& name : skip) {
      if (name.get<std::string>().empty()) {
        errors.Add("quantization.llm_int8_skip_modules",
                   "an empty name matches nothing; remove it");
      }
    }
  }
}

QuantizationConfig QuantizationFrom(const json& q) {
  QuantizationConfig c;
  if (q["load_in_8bit"] == true) c.type = "int8";
  if (q["load_in_4bit"] == true) {
    c.type = q["bnb_4bit_quant_type"].is_string() ? q["bnb_4bit_quant_type"].get<std::string>()
                                                   : "fp4";
    c.double_quant = q["bnb_4bit_use_double_quant"] == true;
  }
  if (q["llm_int8_skip_modules"].is_array()) {
    c.skip_modules = q["llm_int8_skip_modules"].get<std::vector<std::string>>();
  }
  return c;
}

}  // namespace ztrain::detail
