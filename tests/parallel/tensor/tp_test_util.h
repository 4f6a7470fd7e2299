#pragma once
// Helpers of the tensor-parallel tests: parameter storage bound the way the engine binds it,
// the whole-parameter test values and their slices, a forward + backward driver that counts
// the collectives, and the comparison criterion.
#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <string>
#include <vector>

#include "core/config.h"
#include "nn/layer.h"
#include "parallel/comm/communicator.h"

namespace ztrain::tensor::test {

inline constexpr uint64_t kSeed = 1234;

// The model of every test: small, yet with several heads per rank at tp 2, one at tp 4, and a
// padded vocabulary whose last slice at tp 4 ([96, 128)) holds no real token.
ModelConfig TinyModel();

// The tp group sizes to test at this world size (the world itself, and pairs at 4 ranks), and
// the group of `tp_size` this rank belongs to (a Split of the world: collective).
std::vector<int> TpSizes();
std::unique_ptr<comm::Communicator> TpGroup(int tp_size);

// The test value of a whole parameter (spec with its whole shape): InitParam from (kSeed,
// name), but biases and layernorm parameters drawn too (1 + noise for norm weights), so that
// a bias added twice or a layernorm gradient lost would show.
std::vector<float> WholeValue(const nn::ParamSpec& whole_spec);
// The elements of `whole` that `spec` (a possibly split parameter) holds, in local order.
std::vector<float> LocalSlice(const nn::ParamSpec& spec, const std::vector<float>& whole);

// Storage for every parameter of a list of layers, filled with the test values (or the rank's
// slice of them) and zeroed gradients; binds every layer. A tied parameter shares its owner's
// storage, found by name or created (filled from the owner's name) when the owner is not in
// the list.
class ParamStore {
 public:
  struct Entry {
    nn::ParamSpec spec;
    std::vector<float> value, grad;
  };
  explicit ParamStore(const std::vector<nn::Layer*>& layers);
  const std::map<std::string, Entry>& entries() const {
    SyncPacked();
    return entries_;
  }
  const Entry& at(const std::string& name) const { return entries().at(name); }

 private:
  // A run of packed parameters (nn::ParamSpec::packed) bound, as the engine binds them, to
  // one contiguous buffer; their entries' gradients are copied back from it when read.
  struct PackedRun {
    std::vector<std::string> names;
    std::vector<float> values, grads;
  };
  Entry& Get(const nn::ParamSpec& spec);
  void SyncPacked() const;
  mutable std::map<std::string, Entry> entries_;  // node-based: views stay valid
  std::deque<PackedRun> runs_;                    // stable addresses
};

// A micro-batch of fixed pseudo-random tokens and targets in [0, vocab).
struct Batch {
  std::vector<int32_t> tokens, targets;
  nn::MicroBatch mb;
  Batch(int64_t b, int64_t t, int64_t vocab);
};

// Deterministic N(0, std) values keyed by `name` (the same on every rank).
std::vector<float> Normal(const std::string& name, int64_t n, float std = 1.0f);

// One forward and backward through `layers` in order. `input` empty: the first layer takes
// the tokens (and gets no input gradient). Collectives issued on `tp` are counted.
struct Pass {
  std::vector<float> output, dinput;
  int64_t forward_all_reduces = 0, backward_all_reduces = 0;
  int64_t forward_ops = 0, backward_ops = 0;  // every kind of collective
  int64_t forward_bytes = 0, backward_bytes = 0;
  int64_t saved_bytes = 0;  // what the layers' contexts hold between forward and backward
};
// `input_shape`: the first layer's input shape when it is not [B, T, C] (a sequence-parallel
// piece's rows); empty: [B, T, input.size() / (B T)], or the tokens.
Pass RunPass(const std::vector<nn::Layer*>& layers, const nn::MicroBatch& mb,
             const std::vector<float>& input, const std::vector<float>& doutput,
             const comm::Communicator* tp, const Shape& input_shape = {});

// Max-abs-diff / max-abs-ref <= tol (see kTol in tp_layers_test.cc). An all-zero reference
// must be matched exactly.
::testing::AssertionResult Close(const std::vector<float>& got, const std::vector<float>& ref,
                                 double tol);

// Every rank of `group` holds bit-identical `v` (max over ranks of v and of -v equal v).
::testing::AssertionResult SameOnAllRanks(comm::Communicator& group, const std::vector<float>& v);

}  // namespace ztrain::tensor::test
