// The memory estimate's measured layers (estimate/estimate_layers.h).
#include "estimate/estimate_layers.h"

#include <map>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/buffer.h"
#include "core/error.h"
#include "estimate/shape_only.h"
#include "parallel/zero/flat_layout.h"

namespace ztrain::detail {
namespace {

// What a layer allocates for one micro-batch: the allocations a phase does not free live
// until the layer's context is released after its Backward (what Forward saved, the scratch
// Backward keeps).
struct LayerEvents {
  std::vector<AllocEvent> forward, backward;
};

// a + (b - a) (n - 1): the size at micro-batch n of one that is a at 1 and b at 2; ConfigError
// past int64.
int64_t Extrapolate(int64_t a, int64_t b, int64_t n) {
  int64_t grown = 0, out = 0;
  const bool overflow =
      __builtin_mul_overflow(b - a, n - 1, &grown) || __builtin_add_overflow(a, grown, &out);
  ZTRAIN_CHECK_T(ConfigError, !overflow && out >= 0, "a layer's activations at micro-batch ", n,
                 " exceed 2^63 bytes");
  return out;
}

bool SameEvents(const std::vector<AllocEvent>& a, const std::vector<AllocEvent>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].id != b[i].id || a[i].free != b[i].free || a[i].category != b[i].category) {
      return false;
    }
  }
  return true;
}

class MeasuredLayer final : public nn::Layer {
 public:
  MeasuredLayer(std::unique_ptr<nn::Layer> layer, DType grad_dtype)
      : layer_(std::move(layer)), grad_dtype_(grad_dtype) {}
  std::string Name() const override { return layer_->Name(); }
  std::vector<nn::ParamSpec> Params() const override { return layer_->Params(); }
  Shape OutputShape(const Shape& input_shape) const override {
    return layer_->OutputShape(input_shape);
  }
  DType OutputDType(DType activations) const override { return layer_->OutputDType(activations); }
  int BlockIndex() const override { return layer_->BlockIndex(); }
  double ForwardFlopsPerToken(int64_t seq_len) const override {
    return layer_->ForwardFlopsPerToken(seq_len);
  }
  void Forward(const nn::MicroBatch& mb, const Tensor& input, const Tensor&,
               nn::LayerContext& ctx) override {
    Replay(EventsFor(mb, input, ctx).forward, ctx);
  }
  void Backward(const nn::MicroBatch& mb, const Tensor& input, const Tensor&, const Tensor&,
                nn::LayerContext& ctx) override {
    Replay(EventsFor(mb, input, ctx).backward, ctx);
  }

 private:
  const LayerEvents& EventsFor(const nn::MicroBatch& mb, const Tensor& input,
                               const nn::LayerContext& ctx);
  // `positions`: the micro-batch carries per-token positions (packed documents, context
  // parallelism), which some layers read through workspace of their own.
  LayerEvents Measure(const Shape& input_shape, bool first, int64_t seq_len, bool positions,
                      const nn::LayerContext& ctx);
  // `training`: the probe context is marked as the engine marks a training forward's (LoRA
  // dropout saves the dropped input: Note [LoRA dropout] in nn/modules.h).
  LayerEvents MeasureOn(kernels::Ops& ops, const Shape& input_shape, bool first, int64_t seq_len,
                        bool positions, DType act, bool training);
  static void Replay(const std::vector<AllocEvent>& events, nn::LayerContext& ctx);

  std::unique_ptr<nn::Layer> layer_;
  DType grad_dtype_;
  std::map<std::tuple<Shape, DType, bool, bool>, LayerEvents> measured_;
};

const LayerEvents& MeasuredLayer::EventsFor(const nn::MicroBatch& mb, const Tensor& input,
                                            const nn::LayerContext& ctx) {
  const bool positions = mb.positions.defined();
  const auto key =
      std::make_tuple(input.shape(), ctx.dtype(), ctx.dropout().has_value(), positions);
  auto it = measured_.find(key);
  if (it != measured_.end()) return it->second;
  const bool first = input.dtype() == DType::kI32;  // the model's first layer takes tokens
  const int64_t b = input.shape()[0];
  Shape shape = input.shape();
  if (b <= 2) return measured_[key] = Measure(shape, first, mb.T(), positions, ctx);
  shape[0] = 1;
  const LayerEvents one = Measure(shape, first, mb.T(), positions, ctx);
  shape[0] = 2;
  LayerEvents two = Measure(shape, first, mb.T(), positions, ctx);
  if (!SameEvents(one.forward, two.forward) || !SameEvents(one.backward, two.backward)) {
    return measured_[key] = Measure(input.shape(), first, mb.T(), positions, ctx);
  }
  for (size_t i = 0; i < two.forward.size(); ++i) {
    two.forward[i].bytes = Extrapolate(one.forward[i].bytes, two.forward[i].bytes, b);
  }
  for (size_t i = 0; i < two.backward.size(); ++i) {
    two.backward[i].bytes = Extrapolate(one.backward[i].bytes, two.backward[i].bytes, b);
  }
  return measured_[key] = std::move(two);
}

// The layer's own Forward and Backward on a micro-batch of input_shape[0] rows, on the
// context's ops and device. A layer that refuses the device (until the CUDA backend runs
// tensor parallelism, the vocabulary-parallel layers loop on the host) is measured on the
// CPU backend, which allocates the same but for the device copies of small host tables.
LayerEvents MeasuredLayer::Measure(const Shape& input_shape, bool first, int64_t seq_len,
                                   bool positions, const nn::LayerContext& ctx) {
  try {
    return MeasureOn(ctx.ops(), input_shape, first, seq_len, positions, ctx.dtype(),
                     ctx.dropout().has_value());
  } catch (const ConfigError&) {
    throw;
  } catch (const InternalError&) {
    throw;
  } catch (const Error&) {
    if (ctx.ops().device().is_cpu()) throw;
    ShapeOps cpu(Device::Cpu());
    return MeasureOn(cpu, input_shape, first, seq_len, positions, ctx.dtype(),
                     ctx.dropout().has_value());
  }
}

// Its parameters (laid out as BuildStorage lays them, so packed runs are contiguous), input,
// output and their gradients are the engine's and are not recorded.
LayerEvents MeasuredLayer::MeasureOn(kernels::Ops& ops, const Shape& input_shape, bool first,
                                     int64_t seq_len, bool positions, DType act, bool training) {
  const Device device = ops.device();
  ShapeOnlyAllocator untraced(device, nullptr, ShapeOnlyAllocator::Backing::kMapped);
  std::vector<Buffer> keep;
  auto tensor = [&](DType dtype, const Shape& shape) {
    keep.emplace_back(untraced, dtype, shape, MemoryCategory::kActivations);
    return keep.back().AsTensor(dtype, shape);
  };
  const std::vector<nn::ParamSpec> specs = layer_->Params();
  zero::ParamPacker packer;
  std::vector<int64_t> offsets;
  for (const nn::ParamSpec& spec : specs) {
    offsets.push_back(packer.Place(NumElements(spec.shape), spec.packed));
  }
  const Tensor flat = tensor(act, {std::max<int64_t>(packer.size(), 1)});
  const Tensor flat_grads = tensor(grad_dtype_, {std::max<int64_t>(packer.size(), 1)});
  std::vector<Tensor> params, grads;
  for (size_t i = 0; i < specs.size(); ++i) {
    // A quantized weight is bound as its blob, a frozen one without a gradient, as the
    // engine binds them (Note [Frozen regions]).
    const int64_t blob =
        specs[i].quantized() ? kernels::LayoutOf(specs[i].quant, specs[i].quant_geometry).total : 0;
    params.push_back(specs[i].quantized() ? tensor(DType::kU8, {blob})
                                          : flat.Flat(offsets[i], specs[i].shape));
    grads.push_back(specs[i].trainable ? flat_grads.Flat(offsets[i], specs[i].shape) : Tensor());
  }
  layer_->Bind(params, grads);
  nn::MicroBatch mb;
  mb.tokens = tensor(DType::kI32, {input_shape[0], seq_len});
  mb.targets = tensor(DType::kI32, {input_shape[0], seq_len});
  if (positions) mb.positions = tensor(DType::kI32, {input_shape[0], seq_len});
  const DType out_dtype = layer_->OutputDType(act);
  const Shape out_shape = layer_->OutputShape(input_shape);
  const Tensor input = first ? mb.tokens : tensor(act, input_shape);
  const Tensor output = tensor(out_dtype, out_shape);
  const Tensor doutput = tensor(out_dtype, out_shape);
  const Tensor dinput = first ? Tensor() : tensor(act, input_shape);
  LayerEvents events;
  ShapeOnlyAllocator traced(device, nullptr, ShapeOnlyAllocator::Backing::kMapped);
  nn::LayerContext probe(ops, traced, act);
  if (training) probe.set_dropout({});
  traced.set_events(&events.forward);
  layer_->Forward(mb, input, output, probe);
  traced.set_events(&events.backward);
  layer_->Backward(mb, input, doutput, dinput, probe);
  traced.set_events(nullptr);
  probe.Release();
  return events;
}

// Allocates and frees through the context as recorded; what a phase leaves allocated stays
// with the context until its Release.
void MeasuredLayer::Replay(const std::vector<AllocEvent>& events, nn::LayerContext& ctx) {
  std::unordered_map<int, Buffer> live;
  for (const AllocEvent& e : events) {
    if (!e.free) {
      live.emplace(e.id, Buffer(ctx.allocator(), static_cast<size_t>(e.bytes), e.category));
      continue;
    }
    ZTRAIN_ASSERT(live.erase(e.id) == 1,
                  "a layer freed in one phase what it allocated in "
                  "another; the estimate replays each phase on its own");
  }
  for (auto& [id, buffer] : live) ctx.Hold(std::move(buffer));
}

}  // namespace

std::unique_ptr<nn::Layer> Measured(std::unique_ptr<nn::Layer> layer, DType grad_dtype) {
  return std::make_unique<MeasuredLayer>(std::move(layer), grad_dtype);
}

}  // namespace ztrain::detail
