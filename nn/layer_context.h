#pragma once
// LayerContext: what one layer saved during the forward of one micro-batch.
//
// Owns the saved activations (category kActivations) until Release(); Scratch() hands out
// temporary workspace that lives until the next Release(). Memory comes from the allocator
// the engine gives (a caching allocator, so steady-state steps reuse blocks instead of
// paging). Not thread safe.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "kernels/ops.h"

namespace ztrain::nn {

class LayerContext {
 public:
  // `dtype` is the activations' dtype (the compute dtype of mixed precision: bf16 or fp16;
  // fp32 otherwise). Layers allocate activations and their gradients in it, and keep fp32 for
  // what ops.h fixes as fp32 (layernorm statistics, attention lse, losses).
  LayerContext(kernels::Ops& ops, Allocator& allocator, DType dtype = DType::kF32)
      : ops_(&ops), allocator_(&allocator), dtype_(dtype) {}
  kernels::Ops& ops() const { return *ops_; }
  DType dtype() const { return dtype_; }
  Allocator& allocator() const { return *allocator_; }

  // Allocates a tensor that stays until Release() and can be found again by `key`.
  Tensor Save(const std::string& key, DType dtype, const Shape& shape);
  // A tensor saved under `key` by Forward; throws InternalError if there is none.
  Tensor Saved(const std::string& key) const;
  bool Has(const std::string& key) const { return saved_.count(key) != 0; }
  // Temporary workspace until Release().
  Tensor Scratch(DType dtype, const Shape& shape);
  // Keeps `buffer` (from allocator()) until Release(), as Scratch keeps its own.
  void Hold(Buffer buffer) { scratch_.push_back(std::move(buffer)); }
  // Frees everything saved and all scratch (not the dropout key).
  void Release();
  // LoRA dropout in this micro-batch's forward and backward (Note [LoRA dropout],
  // nn/modules.h): the key of the step and micro-batch (kernels::DropoutKey) and the row of
  // the single-process micro-batch where this one's first token lies. Unset (evaluation, a
  // context the engine did not mark): nothing is dropped.
  struct Dropout {
    uint64_t key = 0;
    int64_t row_offset = 0;
    // Under context parallelism the rows are runs of `run` tokens, pieces of sequences of
    // `whole_run` (kernels::DropoutMask: `runs` per sample, the second `second_run` rows after
    // the first);
    // run 0: one run.
    int64_t run = 0;
    int64_t whole_run = 0;
    int64_t runs = 1;
    int64_t second_run = 0;
  };
  void set_dropout(const Dropout& d) { dropout_ = d; }
  const std::optional<Dropout>& dropout() const { return dropout_; }
  // Bytes currently held (saved + scratch).
  size_t bytes() const;

 private:
  kernels::Ops* ops_;
  Allocator* allocator_;
  DType dtype_;
  std::map<std::string, std::pair<Buffer, Tensor>> saved_;
  std::vector<Buffer> scratch_;
  std::optional<Dropout> dropout_;
};

}  // namespace ztrain::nn
