// Note [Family name tables]: each family's names, written out here from the anchors
// (transformers' GPT2LMHeadModel and LlamaForCausalLM state_dicts, llm.c's
// gpt2_build_from_checkpoint order), against what the builder, the HF adapter, the llm.c file
// order and LoRA's targets make of the one table.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "nn/family.h"
#include "nn/gpt2.h"
#include "nn/hf_family.h"
#include "nn/llama.h"
#include "nn/llmc_model_file.h"

namespace ztrain::nn {
namespace {

ModelConfig TinyGpt2() {
  ModelConfig m;
  m.n_layer = 2;
  m.n_head = 2;
  m.n_embd = 8;
  m.vocab_size = 10;
  m.padded_vocab_size = 16;
  m.max_seq_len = 4;
  return m;
}

std::set<std::string> ParamNames(const LayerList& layers) {
  std::set<std::string> names;
  for (const auto& layer : layers) {
    for (const ParamSpec& p : layer->Params()) {
      if (p.tied_to.empty()) names.insert(p.name);
    }
  }
  return names;
}

TEST(FamilyNamesTest, Gpt2MatchesGpt2LMHeadModelAndLlmc) {
  const ModelConfig m = TinyGpt2();
  std::vector<std::string> want_hf = {"transformer.wte.weight", "transformer.wpe.weight"};
  std::set<std::string> want_transposed;
  for (int l = 0; l < 2; ++l) {
    const std::string h = "transformer.h." + std::to_string(l) + ".";
    for (const char* name :
         {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
          "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight",
          "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"}) {
      want_hf.push_back(h + name);
    }
    for (const char* conv : {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"}) {
      want_transposed.insert(h + conv + ".weight");
    }
  }
  want_hf.push_back("transformer.ln_f.weight");
  want_hf.push_back("transformer.ln_f.bias");
  std::vector<std::string> got_hf;
  std::set<std::string> got_transposed, mapped;
  for (const HfTensor& t : HfGpt2Layout(m)) {
    got_hf.push_back(t.hf_name);
    mapped.insert(t.param);
    if (t.transposed) {
      got_transposed.insert(t.hf_name);
      EXPECT_EQ(t.hf_shape, (Shape{t.param_shape[1], t.param_shape[0]})) << t.hf_name;
    }
  }
  EXPECT_EQ(got_hf, want_hf);  // in state_dict order
  EXPECT_EQ(got_transposed, want_transposed);
  EXPECT_EQ(mapped, ParamNames(BuildGpt2(m)));             // every parameter once
  EXPECT_EQ(HfGpt2Layout(m)[0].hf_shape, (Shape{10, 8}));  // wte without its padding rows

  // llm.c: wte, wpe, then each kind over all layers (ln1w, ln1b, qkvw, ...), then ln_f.
  const std::vector<std::string> order = LlmcParamOrder(2);
  ASSERT_EQ(order.size(), 2u + 12u * 2u + 2u);
  EXPECT_EQ(order[2], "h.0.ln_1.weight");
  EXPECT_EQ(order[3], "h.1.ln_1.weight");
  EXPECT_EQ(order[4], "h.0.ln_1.bias");
  EXPECT_EQ(order[6], "h.0.attn.c_attn.weight");
  EXPECT_EQ(order[24], "h.0.mlp.c_proj.bias");
  EXPECT_EQ(std::set<std::string>(order.begin(), order.end()), ParamNames(BuildGpt2(m)));
  EXPECT_EQ(FindModelFamily("gpt2").lora_targets, std::vector<std::string>{"c_attn"});
}

TEST(FamilyNamesTest, LlamaMatchesLlamaForCausalLM) {
  ModelConfig m = TinyGpt2();
  m.type = "llama";
  m.n_layer = 1;
  m.n_head = 2;
  m.n_kv_head = 1;
  m.tie_word_embeddings = false;
  std::set<std::string> want = {"model.embed_tokens.weight",
                                "model.layers.0.input_layernorm.weight",
                                "model.layers.0.self_attn.q_proj.weight",
                                "model.layers.0.self_attn.k_proj.weight",
                                "model.layers.0.self_attn.v_proj.weight",
                                "model.layers.0.self_attn.o_proj.weight",
                                "model.layers.0.post_attention_layernorm.weight",
                                "model.layers.0.mlp.gate_proj.weight",
                                "model.layers.0.mlp.up_proj.weight",
                                "model.layers.0.mlp.down_proj.weight",
                                "model.norm.weight",
                                "lm_head.weight"};
  const HfFamily& hf = FindModelFamily("llama").hf;
  std::set<std::string> got, mapped;
  for (const HfTensor& t : hf.layout(m)) {
    got.insert(t.hf_name);
    mapped.insert(t.param);
    EXPECT_FALSE(t.transposed) << t.hf_name;
  }
  EXPECT_EQ(got, want);
  EXPECT_EQ(mapped, ParamNames(BuildModel(m)));
  m.tie_word_embeddings = true;  // the head is the embedding: no lm_head.weight of its own
  want.erase("lm_head.weight");
  got.clear();
  for (const HfTensor& t : hf.layout(m)) got.insert(t.hf_name);
  EXPECT_EQ(got, want);
  EXPECT_EQ(FindModelFamily("llama").lora_targets, (std::vector<std::string>{"q_proj", "v_proj"}));
}

}  // namespace
}  // namespace ztrain::nn
