// Note [Frozen regions] is in frozen_regions.h.
#include "parallel/zero/frozen_regions.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "core/logging.h"
#include "kernels/quant.h"
#include "parallel/zero/param_gatherer.h"

namespace ztrain::zero {
namespace {

// A region as 16-bit words: its byte count is even (a multiple of 64), and every backend
// copies and gathers 2-byte elements.
Tensor Words(const Buffer& region, int64_t bytes) {
  return region.AsTensor(DType::kU16, {bytes / 2});
}

}  // namespace

FrozenRegions::FrozenRegions(Options options, comm::Communicator& dp, kernels::Ops& ops,
                             Allocator& staging, Allocator& work, FrozenHooks hooks)
    : options_(options),
      dp_(dp),
      ops_(ops),
      staging_(staging),
      work_(work),
      hooks_(std::move(hooks)) {}

int64_t FrozenRegions::Bytes(const nn::ParamSpec& spec) const {
  if (!spec.quantized()) {
    return NumElements(spec.shape) * static_cast<int64_t>(DTypeSize(options_.compute));
  }
  const int64_t bytes = kernels::LayoutOf(spec.quant, spec.quant_geometry).total;
  ZTRAIN_ASSERT(bytes % 4 == 0, "a quantized blob of ", bytes, " bytes");
  return bytes;
}

void FrozenRegions::AddLayer(int64_t padded, int64_t shard, std::vector<FrozenParam> params) {
  ZTRAIN_ASSERT(padded % 2 == 0 && shard * dp_.size() == padded, "a frozen region of ", padded,
                " bytes in shards of ", shard);
  Region& r = regions_.emplace_back();
  r.padded = padded;
  r.shard = shard;
  r.held = hooks_.allocate(options_.sharded ? shard : padded);
  r.params = std::move(params);
}

Tensor FrozenRegions::View(const Buffer& region, const nn::ParamSpec& spec, int64_t offset) const {
  if (region.data() == nullptr) return Tensor();
  char* at = region.data<char>() + offset;
  if (spec.quantized()) return Tensor(at, DType::kU8, {Bytes(spec)}, region.device());
  return Tensor(at, options_.compute, spec.shape, region.device());
}

comm::WorkPtr FrozenRegions::LaunchGather(size_t l, const Buffer& whole) {
  const Region& r = regions_[l];
  const Tensor out = Words(whole, r.padded);
  const Tensor shard = Words(r.held, r.shard);
  if (r.held.device() == whole.device()) return dp_.AllGather(shard, out);
  // Offloaded to host memory on a device: into this rank's chunk beside the compute.
  const Tensor mine = out.Flat(dp_.rank() * (r.shard / 2), {r.shard / 2});
  return GatherHostShard(dp_, ops_, shard, mine, out);
}

void FrozenRegions::SetHeld(size_t l, const FrozenFill& fill,
                            const std::function<bool(const std::string&)>& only) {
  const Region& r = regions_[l];
  const auto es = static_cast<int64_t>(DTypeSize(options_.compute));
  // The rank's bytes of the region: all of it, or its shard at stage 3.
  const int64_t begin = options_.sharded ? dp_.rank() * r.shard : 0;
  const int64_t len = options_.sharded ? r.shard : r.padded;
  const Tensor region = r.held.AsTensor(DType::kU8, {len});
  for (const FrozenParam& p : r.params) {
    if (only && !only(p.spec.name)) continue;
    // The parameter's bytes [lo, hi) that the rank holds.
    const int64_t bytes = Bytes(p.spec);
    const int64_t lo = std::max(p.offset, begin) - p.offset;
    const int64_t hi = std::min(p.offset + bytes, begin + len) - p.offset;
    if (lo >= hi) continue;
    const Tensor dst = region.Flat(p.offset + lo - begin, {hi - lo});
    if (p.spec.quantized()) {
      SetHeldQuantized(p, lo, hi, dst, fill);
      continue;
    }
    // Its held elements in fp32, one parameter at a time, then rounded into place.
    const Shape full_shape = nn::FullShape(p.spec);
    const int64_t first = lo / es, last = hi / es;
    Buffer staged(staging_, DType::kF32, {last - first}, MemoryCategory::kParameters);
    float* values = staged.data<float>();
    nn::ForEachSliceRun(p.spec.tp, p.spec.shape, [&](int64_t local, int64_t full, int64_t n) {
      const int64_t a = std::max(local, first), b = std::min(local + n, last);
      if (a < b && options_.computes)
        fill(p.spec.name, full_shape, full + (a - local), b - a, values + (a - first));
    });
    ops_.Copy(Tensor(values, DType::kF32, {last - first}),
              Tensor(dst.data(), options_.compute, {last - first}, dst.device()));
    ops_.Synchronize();  // before `staged` goes
  }
}

// The blob from the whole weight, then its held bytes [lo, hi) into `dst`.
void FrozenRegions::SetHeldQuantized(const FrozenParam& p, int64_t lo, int64_t hi,
                                     const Tensor& dst, const FrozenFill& fill) {
  const Shape full_shape = nn::FullShape(p.spec);
  const int64_t bytes = Bytes(p.spec);
  Buffer whole(staging_, DType::kF32, full_shape, MemoryCategory::kParameters);
  Buffer blob(staging_, DType::kU8, {bytes}, MemoryCategory::kParameters);
  if (options_.computes) {
    fill(p.spec.name, full_shape, 0, NumElements(full_shape), whole.data<float>());
    kernels::QuantizeInto(p.spec.quant, p.spec.quant_geometry, whole.data<float>(),
                          blob.data<uint8_t>());
  }
  ops_.Copy(blob.AsTensor(DType::kU8, {bytes}).Flat(lo, {hi - lo}), dst);
  ops_.Synchronize();  // before `blob` goes
}

std::vector<uint8_t> FrozenRegions::Whole(size_t l) {
  const Region& r = regions_[l];
  std::vector<uint8_t> out(static_cast<size_t>(r.padded));
  if (r.padded == 0) return out;
  Buffer gathered;
  const Buffer* whole = &r.held;
  if (options_.sharded) {
    gathered = Buffer(work_, DType::kU8, {r.padded}, MemoryCategory::kParameters);
    hooks_.wait(*LaunchGather(l, gathered));
    whole = &gathered;
  }
  ops_.Copy(whole->AsTensor(DType::kU8, {r.padded}), Tensor(out.data(), DType::kU8, {r.padded}));
  ops_.Synchronize();
  return out;
}

std::vector<float> FrozenRegions::Values(const nn::ParamSpec& spec, int64_t offset,
                                         const std::vector<uint8_t>& region) const {
  std::vector<float> out(static_cast<size_t>(NumElements(spec.shape)));
  if (!options_.computes) return out;
  const Tensor values(out.data(), DType::kF32, spec.shape);
  auto* at = const_cast<uint8_t*>(region.data()) + offset;
  const std::unique_ptr<kernels::Ops> host = kernels::MakeCpuOps();
  if (spec.quantized()) {
    host->Dequantize(Tensor(at, DType::kU8, {Bytes(spec)}), spec.quant, spec.quant_geometry,
                     values);
  } else {
    host->Copy(Tensor(at, options_.compute, spec.shape), values);  // widened
  }
  return out;
}

}  // namespace ztrain::zero
