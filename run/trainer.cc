#include "run/trainer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <tuple>

#include "core/logging.h"
#include "estimate/tune.h"
#include "kernels/cpu/bf16_speed.h"
#include "kernels/cpu/blas_kernel.h"
#include "kernels/quant.h"
#include "nn/gpt2.h"
#include "nn/llmc_model_file.h"
#include "offload/placement.h"
#include "optim/adam.h"
#include "parallel/comm/nccl/nccl_communicator.h"
#include "parallel/tensor/megatron_linears.h"
#include "run/config_agreement.h"
#include "run/model_weights.h"
#include "run/preflight.h"

namespace ztrain {
namespace {

std::unique_ptr<data::DataLoader> MakeLoader(const Config& c, data::Split split, int rank,
                                             int world) {
  const bool mixture = split == data::Split::kTrain && !c.data.train_mixture.empty();
  auto source =
      mixture ? nullptr : data::OpenDataSource(c.data, split, c.model.vocab_size, c.training.seed);
  if (!source && !mixture) return nullptr;
  data::LoaderOptions o;
  o.batch_size = c.train_micro_batch_size_per_gpu;
  o.seq_len = c.data.seq_len;
  o.shuffle = split == data::Split::kTrain && c.data.shuffle;
  o.seed = c.training.seed;
  o.vocab_size = c.model.vocab_size;
  o.rank = rank;
  o.world = world;
  if (mixture) return std::make_unique<data::DataLoader>(data::OpenTrainMixture(c.data), o);
  return std::make_unique<data::DataLoader>(std::move(source), o);
}

// The training data for the start log: a glob, "mixture of 2 datasets: web/*.bin (weight
// 0.7), ...", or the synthetic corpus.
std::string DataDescription(const DataConfig& d) {
  if (d.synthetic()) return "built-in synthetic corpus";
  if (d.train_mixture.empty()) return d.train;
  std::string out = fmt::format("mixture of {} datasets: ", d.train_mixture.size());
  for (size_t i = 0; i < d.train_mixture.size(); ++i) {
    const DataSourceSpec& s = d.train_mixture[i];
    out += fmt::format("{}{} (weight {:g})", i == 0 ? "" : ", ", s.path, s.weight);
  }
  return out;
}

// "parameters 3.31 MiB, gradients ..." over the categories that were ever used; with
// `with_current`, each as current/peak.
std::string MemoryBreakdown(const MemorySnapshot& mem, bool with_current) {
  std::string out;
  for (int c = 0; c < kNumMemoryCategories; ++c) {
    if (mem.peak[c] == 0) continue;
    out += fmt::format(
        "{}{} {}{}", out.empty() ? "" : ", ", MemoryCategoryName(static_cast<MemoryCategory>(c)),
        with_current ? FormatBytes(mem.current[c]) + "/" : "", FormatBytes(mem.peak[c]));
  }
  return out;
}

// Note [BLAS kernel]: the kernel the CPU GEMMs run on, and a warning with the fix when it is
// below the CPU (the ztrain executable chose the right one already; embedding code may not).
void LogBlasKernel() {
  using kernels::BlasKernelCheck;
  const BlasKernelCheck check = kernels::CheckThisBlasKernel();
  const std::string config = kernels::BlasConfig();
  // "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ...": the library and its version.
  const size_t second_space = config.find(' ', config.find(' ') + 1);
  const std::string library = config.substr(0, second_space);
  switch (check.action) {
    case BlasKernelCheck::Action::kKeep:
      Log().info("BLAS: {} {} kernel on this {} CPU{}{}", library, kernels::BlasCoreName(),
                 kernels::IsaLevelName(kernels::CpuIsaLevel()), check.message.empty() ? "" : "; ",
                 check.message);
      return;
    case BlasKernelCheck::Action::kSwitch:
      Log().warn("BLAS: {}: set OPENBLAS_CORETYPE={} in the environment before the program "
                 "starts (OpenBLAS chooses its kernel when it loads; the ztrain executable "
                 "does this itself)",
                 check.message, check.coretype);
      return;
    case BlasKernelCheck::Action::kWarn:
      Log().warn("BLAS: {}", check.message);
      return;
  }
}

// Note [bf16 where it pays]: a bf16.enabled true the user wrote, on a CPU where bf16 matmuls
// measure slower than fp32's, is worth a warning with the figures ("auto" decides by them).
void WarnIfBf16IsSlower(const Config& config) {
  for (const AutoChoice& a : config.auto_choices) {
    if (a.path == "bf16.enabled") return;  // chosen by the measurement itself
  }
  const kernels::Bf16Speed speed =
      kernels::MeasureBf16Speed(config.model.n_embd, config.model.mlp_hidden());
  if (!speed.available || speed.ratio() >= 1.0) return;
  std::string why;
  kernels::Bf16Pays(speed, &why);
  Log().warn("bf16.enabled is true, but on this CPU bf16 is slower than fp32: {}; the run would "
             "be faster in fp32 (bf16.enabled false, or \"auto\", which measures)",
             why);
}

}  // namespace

Trainer::Trainer(Config config, comm::Communicator* world)
    : Trainer(std::move(config), world, DetectLaunchEnv()) {}

Trainer::Trainer(Config config, comm::Communicator* world, const LaunchEnv& launch)
    : config_(std::move(config)), world_(world), device_(SelectDevice(config_.device, launch)) {
  if (world_) AgreeOnConfig(config_, *world_);  // Note [One config on every rank]
  // Note [Preflight]: every path the run will write, before anything trains.
  Preflight(config_,
            PreflightOptions{.create_outputs = true, .open_data = false, .check_locks = false});
  config_.device = device_.device.ToString();
  config_.ranks_on_node = world_ ? launch.local_size : 1;
  Log().info("device: {} ({})", config_.device, device_.reason);
  // Masked attention (kernels::AttentionMask) runs on the CPU kernels only so far: refused here,
  // before anything is built, rather than at the first step.
  ZTRAIN_CHECK_T(ConfigError, device_.device.is_cpu() || config_.model.sliding_window == 0,
                 "model.sliding_window ", config_.model.sliding_window,
                 ": sliding-window "
                 "attention is not yet on ",
                 config_.device,
                 "'s kernels (the CPU has it); "
                 "train with \"device\": \"cpu\", or without the window");
  ZTRAIN_CHECK_T(ConfigError, device_.device.is_cpu() || config_.context_parallel_size == 1,
                 "context_parallel.size ", config_.context_parallel_size,
                 ": context parallelism has not run on ", config_.device,
                 " yet (its exchanges are built for the CPU and checked there; no GPU was at "
                 "hand to check them); train with \"device\": \"cpu\", or without it");
  if (config_.data.packed_documents) {
    ZTRAIN_CHECK_T(ConfigError, device_.device.is_cpu(),
                   "data.packed_documents: attention "
                   "within documents is not yet on ",
                   config_.device,
                   "'s kernels (the CPU has "
                   "it); train with \"device\": \"cpu\", or without packed documents");
    try {
      documents_ = data::ResolveDocumentBoundary(config_.data);
    } catch (const Error& e) {  // a manifest or shard that cannot be read
      throw InvalidConfig({e.what()});
    }
  }
  if (device_.device.is_cpu()) {
    LogBlasKernel();
    if (config_.precision.bf16 && (!world_ || world_->rank() == 0)) WarnIfBf16IsSlower(config_);
  }
  const int world_size = world ? world->size() : 1;
  const int cp = config_.context_parallel_size;
  grid_ = std::make_unique<ProcessGrid>(
      world_size, world_size / (config_.pipeline_stages * config_.tensor_parallel_size * cp),
      config_.pipeline_stages, config_.tensor_parallel_size, cp);
  const ParallelGroups groups = MakeGroups();
  const nn::AdapterPlan plan(config_);
  engine_ = std::make_unique<Engine>(
      config_,
      groups.tp != nullptr
          ? tensor::BuildParallelModel(
                config_.model, *groups.tp, plan, config_.sequence_parallel, groups.cp,
                nn::ParseContextAlgorithm(config_.context_parallel_algorithm))
          : nn::BuildModel(config_.model, nn::MakeWholeLinears(), plan),
      groups,
      config_.model.init_from.empty() ? InitialParameters::kRandom : InitialParameters::kZero);
  if (device_.device.is_cpu() && !config_.precision.bf16) {
    engine_->UseGemmPlan(ChooseStepGemms(config_, world_));
  }
  if (!config_.checkpoint.dir.empty()) {
    checkpointer_ = std::make_unique<Checkpointer>(config_, *engine_, world_);
  }
  if (!config_.model.init_from.empty()) {
    const LoadedWeights w = LoadModelWeights(config_.model.init_from, config_.model, *engine_);
    Log().info("loaded weights from {} ({}): this rank read {} of the model's {} tensor bytes "
               "({:.1f} %)",
               config_.model.init_from, w.format, w.bytes_read, w.bytes_in_file,
               100.0 * static_cast<double>(w.bytes_read) /
                   static_cast<double>(std::max<int64_t>(1, w.bytes_in_file)));
  }
  if (!config_.lora.init_from.empty()) {
    const LoadedWeights w = LoadPeftAdapter(config_.lora.init_from, config_, *engine_);
    Log().info("loaded the LoRA adapter from {}: this rank read {} of its {} tensor bytes",
               config_.lora.init_from, w.bytes_read, w.bytes_in_file);
  }
  if (config_.lora.enabled) {
    Log().info(
        "LoRA: {} of the model's {} parameters train (rank {}, scaling {:g}{}); the base "
        "is frozen",
        engine_->NumTrainableParameters(), engine_->NumParameters(), config_.lora.r,
        config_.lora.scaling(),
        config_.lora.lora_dropout > 0.0
            ? fmt::format(", dropout {:g} on the adapters' input", config_.lora.lora_dropout)
            : "");
  }
  if (config_.lora.enabled) WarnAboutAdapters();
  if (config_.quantization.enabled()) LogQuantizedBase();
  // The loaders check every shard as they open them (Note [Preflight]): a problem there names
  // the key, as check-config does.
  for (const auto& [split, key, loader] :
       {std::tuple{data::Split::kTrain, "data.train", &train_loader_},
        std::tuple{data::Split::kVal, "data.val", &val_loader_}}) {
    try {
      // The ranks of a cp group read the same samples (Note [Context parallelism]).
      *loader = MakeLoader(config_, split, grid_->Coord(world_ ? world_->rank() : 0).dp,
                           grid_->dp_size());
    } catch (const Error& e) {
      throw InvalidConfig({detail::StrCat(key, ": ", e.what())});
    }
  }

  sampler_ = std::make_unique<TrainSampler>(config_);
  const int64_t b = config_.train_micro_batch_size_per_gpu, t = config_.data.seq_len;
  const int64_t gas = config_.gradient_accumulation_steps;
  tokens_.resize(gas * b * t);
  targets_.resize(gas * b * t);
  if (documents_) positions_.resize(gas * b * t);
  for (int64_t i = 0; i < gas; ++i) {
    nn::MicroBatch mb;
    mb.tokens = Tensor(tokens_.data() + i * b * t, DType::kI32, {b, t});
    mb.targets = Tensor(targets_.data() + i * b * t, DType::kI32, {b, t});
    if (documents_) mb.positions = Tensor(positions_.data() + i * b * t, DType::kI32, {b, t});
    micro_batches_.push_back(mb);
  }
}

namespace {

std::string JoinNames(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

// Legitimate but almost surely unintended LoRA setups, said once at start: a QLoRA base of
// random weights (no model.init_from), and an adapter rank above what a layer can hold.
void Trainer::WarnAboutAdapters() const {
  if (world_ && world_->rank() != 0) return;
  if (config_.quantization.enabled() && config_.model.init_from.empty()) {
    Log().warn(
        "quantization ({}) over a randomly initialised base: model.init_from is not set, "
        "so the frozen base is random weights and the adapters learn on noise; QLoRA "
        "fine-tunes a pretrained model: set model.init_from to it",
        config_.quantization.type);
  }
  std::map<std::string, Shape> shapes;
  for (const auto& layer : engine_->layers()) {
    for (const nn::ParamSpec& s : layer->Params()) {
      shapes[s.name] = nn::FullShape(s);  // whole, not a tp slice
    }
  }
  int over = 0;
  std::string first;
  for (const auto& [name, a] : shapes) {
    const std::string suffix = ".lora_A.weight";
    if (name.size() <= suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    const auto b = shapes.find(name.substr(0, name.size() - suffix.size()) + ".lora_B.weight");
    if (b == shapes.end() || a.size() != 2 || b->second.size() != 2) continue;
    const int64_t side = std::min(a[1], b->second[0]);  // [r, in] and [out, r]
    if (a[0] <= side) continue;
    if (over++ == 0)
      first = detail::StrCat(name.substr(0, name.size() - suffix.size()), " (", a[1], " in, ",
                             b->second[0], " out)");
  }
  if (over > 0) {
    Log().warn(
        "lora.r {} is above the smaller side of {} adapted layer{}, e.g. {}: an adapter's "
        "rank cannot exceed min(in, out), so the extra rank only costs memory; give a "
        "smaller r",
        config_.lora.r, over, over == 1 ? "" : "s", first);
  }
}

void Trainer::LogQuantizedBase() const {
  int64_t tensors = 0, weights = 0, blob_bytes = 0;
  for (const auto& layer : engine_->layers()) {
    for (const nn::ParamSpec& s : layer->Params()) {
      if (!s.quantized()) continue;
      ++tensors;
      weights += NumElements(s.shape);
      blob_bytes += kernels::LayoutOf(s.quant, s.quant_geometry).total;
    }
  }
  const QuantizationConfig& q = config_.quantization;
  const DType compute = ComputeDType(config_);
  const int64_t dense = weights * static_cast<int64_t>(DTypeSize(compute));
  const bool sharded = config_.zero.stage == 3 && engine_->dp_size() > 1;
  Log().info(
      "quantization: {}{}: {} linear weights of this {} ({} elements) held as {} "
      "({:.3f} bytes each, {} in {}){}, dequantized layer by layer into {} for the GEMMs{}",
      q.type, q.double_quant ? " with double quantization" : "", tensors,
      engine_->tp_size() > 1 || engine_->pp_size() > 1 ? "rank's piece" : "model", weights,
      FormatBytes(blob_bytes), static_cast<double>(blob_bytes) / std::max<int64_t>(1, weights),
      FormatBytes(dense), DTypeName(compute),
      sharded ? detail::StrCat(", sharded over ", engine_->dp_size(), " ranks (ZeRO-3)") : "",
      DTypeName(compute),
      q.skip_modules.empty() ? "" : detail::StrCat("; left unquantized: ", JoinNames(q.skip_modules)));
}

ParallelGroups Trainer::MakeGroups() {
  comm::Communicator* base = world_;
  if (world_ && !device_.device.is_cpu()) {
    // MPI moves host memory; on CUDA the engine's collectives go through NCCL, bootstrapped
    // over the MPI world. One rank has nothing to communicate: the engine's own groups of one.
    if (world_->size() == 1) return {};
    const auto timeout =
        std::chrono::milliseconds(static_cast<int64_t>(config_.training.comm_timeout_s * 1000.0));
    nccl_world_ = comm::MakeNcclCommunicator(*world_, device_.device.index, timeout);
    base = nccl_world_.get();
  }
  if (base && (config_.pipeline_stages > 1 || config_.tensor_parallel_size > 1 ||
               config_.context_parallel_size > 1)) {
    groups_ = MakeGridCommunicators(*base, *grid_);
    return ParallelGroups{&groups_.gradients(), groups_.pp.get(), groups_.tp.get(),
                          groups_.cp.get()};
  }
  return ParallelGroups{base, nullptr, nullptr};
}

ResumePoint Trainer::Resume(const std::string& tag, bool required) {
  ZTRAIN_CHECK_T(ConfigError, checkpointer_ != nullptr,
                 "resuming needs checkpoint.dir: the directory the earlier run saved into");
  const ResumePoint point = checkpointer_->Resume(tag, required);
  resumed_ = true;
  if (!point.directory.empty() && point.step >= config_.training.steps &&
      (!world_ || world_->rank() == 0)) {
    Log().warn("{} is at step {}, {} training.steps = {}: no step is left to train (the "
               "model is the checkpoint's); raise training.steps to train further",
               point.directory, point.step,
               point.step == config_.training.steps ? "already" : "past", config_.training.steps);
  }
  if (!point.directory.empty()) train_loader_->Restore(point.data);
  return point;
}

double Trainer::Evaluate() {
  ZTRAIN_ASSERT(val_loader_ != nullptr);
  val_loader_->Reset();
  std::vector<int32_t> tokens(tokens_.size() / micro_batches_.size());
  std::vector<int32_t> targets(tokens.size()), positions(documents_ ? tokens.size() : 0);
  nn::MicroBatch mb = micro_batches_[0];
  mb.tokens = Tensor(tokens.data(), DType::kI32, mb.tokens.shape());
  mb.targets = Tensor(targets.data(), DType::kI32, mb.targets.shape());
  if (documents_) mb.positions = Tensor(positions.data(), DType::kI32, mb.tokens.shape());
  double sum = 0.0;
  for (int64_t i = 0; i < config_.training.eval_batches; ++i) {
    val_loader_->NextBatch(tokens.data(), targets.data());
    if (documents_) {
      data::MarkDocuments(*documents_, mb.B(), mb.T(), tokens.data(), targets.data(),
                          positions.data());
    }
    sum += engine_->EvalLoss(Pieces({&mb, 1})[0]);
  }
  return engine_->MeanOverDp(sum / static_cast<double>(config_.training.eval_batches));
}

void Trainer::LogStart() const {
  if (config_.dump_state) Log().info("resolved config:\n{}", config_.resolved.dump(2));
  for (const AutoChoice& a : config_.auto_choices) {
    Log().info("config: {} = {} ({})", a.path, a.value.dump(), a.reason);
  }
  if (config_.comms_logger.enabled) {
    Log().info("comms_logger: a single process has no communication to log");
  }
  const ModelConfig& m = config_.model;
  int64_t params = 0;
  for (const auto& [name, shape] : engine_->ModelParameters()) params += NumElements(shape);
  std::string window;
  if (m.sliding_window > 0) {
    window = fmt::format(", sliding window {}{}", m.sliding_window,
                         m.max_window_layers > 0
                             ? fmt::format(" from layer {}", m.max_window_layers)
                             : std::string(" in every layer"));
  }
  Log().info("ztrain: {} model, {} layers, {} heads ({} key/value), {} wide, vocab {} (padded "
             "{}){}, {} parameters",
             m.type, m.n_layer, m.n_head, m.kv_heads(), m.n_embd, m.vocab_size,
             m.padded_vocab_size, window, params);
  Log().info(
      "batch: {} x {} tokens per micro-batch, {} micro-batches per step, {} data-parallel "
      "ranks (ZeRO stage {}), {} steps",
      config_.train_micro_batch_size_per_gpu, config_.data.seq_len,
      config_.gradient_accumulation_steps, grid_->dp_size(), config_.zero.stage,
      config_.training.steps);
  if (grid_->cp_size() > 1) {
    Log().info(
        "context parallel: each sample's {} tokens split over {} ranks ({} each), "
        "attention by {}; gradients reduced over dp {} x cp {}",
        config_.data.seq_len, grid_->cp_size(), config_.data.seq_len / grid_->cp_size(),
        config_.context_parallel_algorithm == "ring"
            ? "ring (keys and values around the ranks, zigzag chunks)"
            : "ulysses (all-to-all of heads)",
        grid_->dp_size(), grid_->cp_size());
  }
  if (grid_->pp_size() > 1 || grid_->tp_size() > 1 || grid_->cp_size() > 1) {
    Log().info(
        "layout: dp {} x cp {} x pp {} x tp {} = {} ranks; pipeline schedule {}, "
        "partition {}{}",
        grid_->dp_size(), grid_->cp_size(), grid_->pp_size(), grid_->tp_size(), grid_->world(),
        config_.pipeline_schedule, config_.pipeline_partition,
        config_.sequence_parallel && grid_->tp_size() > 1
            ? fmt::format("; sequence parallel: {} tokens of each sample per tp rank "
                          "between the linears",
                          config_.data.seq_len / grid_->tp_size())
            : std::string());
  }
  if (config_.sequence_parallel && grid_->tp_size() == 1) {
    Log().warn(
        "tensor_parallel.sequence_parallel does nothing at tensor_parallel.size 1: "
        "it splits the tokens over the tensor-parallel ranks");
  }
  Log().info("data: {} ({} tokens, {} batches per epoch){}", DataDescription(config_.data),
             train_loader_->num_tokens(), train_loader_->batches_per_epoch(),
             config_.data.shuffle ? ", shuffled" : "");
  if (documents_) {
    Log().info(
        "data: packed documents, each starting {} (from {}); attention and positions "
        "restart there and no loss is taken across a boundary",
        documents_->start_token >= 0 ? fmt::format("at token {}", documents_->start_token)
                                     : fmt::format("after token {}", documents_->end_token),
        documents_->source);
  }
  // Offloaded state is stepped in host memory (Note [Devices in the engine]).
  const bool adam_on_cpu = offload::PlaceState(config_.zero, !device_.device.is_cpu()).host_adam;
  Log().info("optimizer: {} (adam_w_mode {}), {} kernel; scheduler: {}", config_.optimizer.type,
             config_.optimizer.adam_w_mode,
             adam_on_cpu ? std::string(optim::AdamImplName(optim::BestAdamImpl())) + " CPU"
                         : std::string("CUDA"),
             config_.scheduler.type.empty() ? "constant lr" : config_.scheduler.type);
  std::string groups;
  for (const Engine::ParamGroupUse& u : engine_->ParamGroupUses()) {
    if (!u.group.trainable && u.tensors == 0) continue;
    groups += fmt::format("{}{} ", groups.empty() ? "" : "; ", u.group.name);
    groups += u.group.trainable ? fmt::format("(weight_decay {:g}, lr x{:g})", u.group.weight_decay,
                                              u.group.lr_scale)
                                : std::string("(no step)");
    groups += fmt::format(": {} tensors, {} elements", u.tensors, u.elements);
  }
  Log().info("parameter groups: {}", groups);
  const PrecisionConfig& p = config_.precision;
  if (p.bf16 || p.fp16) {
    Log().info(
        "precision: {} compute and activations, fp32 master weights and Adam state, "
        "gradients accumulate in {}{}",
        p.bf16 ? "bf16" : "fp16", p.grad_accum_dtype,
        !p.fp16            ? std::string()
        : p.loss_scale > 0 ? fmt::format("; static loss scale {:g}", p.loss_scale)
                           : fmt::format("; dynamic loss scale from 2^{}, window {}, "
                                         "hysteresis {}",
                                         p.initial_scale_power, p.loss_scale_window, p.hysteresis));
  }
  const MemorySnapshot mem = engine_->memory().Snapshot();
  Log().info("model state: parameters {}, gradients {}, optimizer state {}",
             FormatBytes(mem.Current(MemoryCategory::kParameters)),
             FormatBytes(mem.Current(MemoryCategory::kGradients)),
             FormatBytes(mem.Current(MemoryCategory::kOptimizerState)));
}

int64_t Trainer::CommBytes() const {
  return engine_->dp().stats().TotalBytes() +
         (engine_->pp_size() > 1 ? engine_->pp().stats().TotalBytes() : 0) +
         (groups_.cp ? groups_.cp->stats().TotalBytes() : 0);
}

std::vector<nn::MicroBatch> Trainer::Pieces(std::span<const nn::MicroBatch> whole) {
  if (grid_->cp_size() == 1) return {whole.begin(), whole.end()};
  const int rank = grid_->Coord(world_ ? world_->rank() : 0).cp;
  pieces_.clear();
  std::vector<nn::MicroBatch> out;
  for (const nn::MicroBatch& mb : whole) {
    out.push_back(pieces_
                      .emplace_back(std::make_unique<nn::ContextMicroBatch>(
                          mb, rank, grid_->cp_size(),
                          nn::ParseContextAlgorithm(config_.context_parallel_algorithm)))
                      ->mb);
  }
  return out;
}

std::string Trainer::RankName(int rank) const {
  if (grid_->pp_size() == 1 && grid_->tp_size() == 1 && grid_->cp_size() == 1) {
    return fmt::format("r{}", rank);
  }
  const GridCoord c = grid_->Coord(rank);
  if (grid_->cp_size() > 1) {
    return fmt::format("r{} (dp {}, cp {}, pp {}, tp {})", rank, c.dp, c.cp, c.pp, c.tp);
  }
  return fmt::format("r{} (dp {}, pp {}, tp {})", rank, c.dp, c.pp, c.tp);
}

bool Trainer::AnyRank(bool value) {
  if (!world_ || world_->size() == 1) return value;
  float v = value ? 1.0f : 0.0f;
  world_->AllReduce(Tensor(&v, DType::kF32, {1}))->Wait();
  return v > 0.0f;
}

// This rank's peak memory, or every rank's ("r0 32.14 MiB, r1 32.10 MiB", with grid
// coordinates under a pipeline or tensor parallelism); collective over the world, so every
// rank calls it at the same steps.
std::string Trainer::PeakMemoryPerRank() {
  const int n = world_ ? world_->size() : 1;
  const int64_t peak = engine_->memory().TotalPeak();
  if (n == 1) return FormatBytes(peak);
  float mine = static_cast<float>(static_cast<double>(peak) / 1024.0);  // KiB: exact in fp32
  std::vector<float> all(n);
  world_->AllGather(Tensor(&mine, DType::kF32, {1}), Tensor(all.data(), DType::kF32, {n}))->Wait();
  std::string out;
  for (int r = 0; r < n; ++r) {
    out += fmt::format("{}{} {}", r ? ", " : "", RankName(r),
                       FormatBytes(static_cast<int64_t>(all[r]) * 1024));
  }
  return out;
}

void Trainer::LogProgress(const StepStats& s, double window_seconds, int64_t window_tokens) {
  const double ms = s.seconds * 1e3;
  // fp16: the loss scale, and the steps skipped for overflows (this one, and in all).
  const std::string scale =
      s.loss_scale > 0
          ? fmt::format(" | loss scale {:g}{}{}", s.loss_scale,
                        s.skipped ? " (overflow: step skipped)" : "",
                        s.skipped_steps > 0 ? fmt::format(", {} skipped", s.skipped_steps) : "")
          : "";
  const std::string documents = documents_ ? fmt::format(" | {} docs", s.documents) : std::string();
  Log().info(
      "step {:>6}/{} | loss {:.4f} | lr {:.3e} | grad norm {:.4f}{}{}{} | {:.0f} tok/s | "
      "{:.1f} ms/step | peak mem {}",
      s.step, config_.training.steps, s.loss, s.lr, s.grad_norm,
      s.clip_coef < 1.0f ? " (clipped)" : "", scale, documents,
      window_seconds > 0 ? static_cast<double>(window_tokens) / window_seconds : 0.0, ms,
      PeakMemoryPerRank());
  if (config_.wall_clock_breakdown) {
    // DeepSpeed's wall_clock_breakdown: the phases, and within them the time blocked on
    // communication and on NVMe swaps (what overlap did not hide).
    Log().info(
        "step {:>6}/{} | time (ms): forward {:.1f} | backward {:.1f} | optimizer {:.1f} | "
        "comm wait {:.1f} | swap wait {:.1f}",
        s.step, config_.training.steps, s.forward_seconds * 1e3, s.backward_seconds * 1e3,
        s.optimizer_seconds * 1e3, s.comm_wait_seconds * 1e3, s.swap_wait_seconds * 1e3);
  }
  if (config_.memory_breakdown) {
    const MemorySnapshot mem = engine_->memory().Snapshot();
    Log().info("step {:>6}/{} | memory (current/peak): {}", s.step, config_.training.steps,
               MemoryBreakdown(mem, /*with_current=*/true));
  }
}

TrainSummary Trainer::Run(const std::atomic<bool>* stop) {
  if (checkpointer_ && !resumed_) checkpointer_->CheckFreshStart();
  LogStart();
  if (config_.csv_monitor.enabled && (!world_ || world_->rank() == 0)) {
    // After a resume the earlier run's rows up to the resumed step are kept.
    csv_ = std::make_unique<CsvMonitor>(config_.csv_monitor,
                                        engine_->step() > 0 ? engine_->step() : -1);
  }
  TrainSummary summary;
  const auto start = std::chrono::steady_clock::now();
  double window_seconds = 0.0;
  int64_t window_tokens = 0, total_tokens = 0;
  const int64_t steps = config_.training.steps, every = config_.steps_per_print;
  const int64_t b = config_.train_micro_batch_size_per_gpu, t = config_.data.seq_len;
  const int64_t first = engine_->step() + 1;  // after a resume, the step after the saved one
  int64_t saved = engine_->step();            // the step of the newest checkpoint
  auto save = [&](int64_t step) {
    if (!checkpointer_ || saved == step) return;
    checkpointer_->Save(step, train_loader_->state());
    saved = step;
  };
  for (int64_t step = first; step <= steps; ++step) {
    for (size_t i = 0; i < micro_batches_.size(); ++i) {
      train_loader_->NextBatch(tokens_.data() + i * b * t, targets_.data() + i * b * t);
      if (documents_) {
        data::MarkDocuments(*documents_, b, t, tokens_.data() + i * b * t,
                            targets_.data() + i * b * t, positions_.data() + i * b * t);
      }
    }
    const int64_t comm_before = CommBytes();
    const StepStats s = engine_->TrainStep(Pieces(micro_batches_));
    comm_bytes_per_step_.push_back(CommBytes() - comm_before);
    if (step == first) summary.first_loss = s.loss;
    summary.final_loss = s.loss;
    summary.steps = step;
    window_seconds += s.seconds;
    window_tokens += s.tokens;
    total_tokens += s.tokens;
    if (csv_) csv_->Write(s);
    // Ranks agree on stopping, so no rank waits in a collective for one that left.
    const bool interrupted = AnyRank(stop && stop->load());
    if (step == 1 || step % every == 0 || step == steps || interrupted) {
      LogProgress(s, window_seconds, window_tokens);
      window_seconds = 0.0;
      window_tokens = 0;
    }
    const int64_t eval_every = config_.training.eval_interval;
    if (val_loader_ && eval_every > 0 && (step % eval_every == 0 || step == steps)) {
      summary.final_eval_loss = Evaluate();
      Log().info("step {:>6}/{} | val loss {:.4f}", step, steps, summary.final_eval_loss);
    }
    const int64_t sample_every = config_.training.sample_interval;
    if (sampler_->enabled() && (step % sample_every == 0 || step == steps)) {
      const std::string text = sampler_->Sample(*engine_, step);
      if (!text.empty()) Log().info("step {:>6}/{} | sample: {}", step, steps, text);
    }
    const int64_t interval = config_.checkpoint.interval;
    if (interval > 0 && step % interval == 0) save(step);
    if (interrupted) {
      summary.interrupted = true;
      Log().warn("stopped at step {} of {} on request{}", step, steps,
                 checkpointer_ ? "; saving a checkpoint to resume from" : "");
      break;
    }
  }
  save(engine_->step());
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  summary.tokens_per_s =
      summary.seconds > 0 ? static_cast<double>(total_tokens) / summary.seconds : 0;
  Finish(summary);
  return summary;
}

// Writes <output_dir>/memory_rank<R>.json (bytes per category) and comm_rank<R>.json
// (bytes moved per op kind, and per step).
void Trainer::WriteReports() const {
  const std::filesystem::path dir(config_.training.output_dir);
  const int world_rank = world_ ? world_->rank() : 0;
  const std::string rank = std::to_string(world_rank);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const GridCoord coord = grid_->Coord(world_rank);
  nlohmann::json comm = {{"rank", world_rank},
                         {"dp_rank", coord.dp},
                         {"pp_rank", coord.pp},
                         {"tp_rank", coord.tp},
                         {"cp_rank", coord.cp},
                         {"dp_size", grid_->dp_size()},
                         {"cp_size", grid_->cp_size()},
                         {"pp_size", engine_->pp_size()},
                         {"bytes_per_step", comm_bytes_per_step_}};
  const comm::CommStats dp = engine_->dp().stats();
  const comm::CommStats pp = engine_->pp_size() > 1 ? engine_->pp().stats() : comm::CommStats{};
  const comm::CommStats cp = groups_.cp ? groups_.cp->stats() : comm::CommStats{};
  for (int k = 0; k < comm::kNumOpKinds; ++k) {
    comm["ops"][comm::OpKindName(static_cast<comm::OpKind>(k))] = {
        {"bytes", dp.bytes[k] + pp.bytes[k] + cp.bytes[k]},
        {"count", dp.ops[k] + pp.ops[k] + cp.ops[k]}};
  }
  // By category, and where it lives: the device (all of it on the CPU backend), host memory
  // and the page-locked part of that.
  nlohmann::json memory = nlohmann::json::parse(engine_->memory().Snapshot().ToJson());
  const std::pair<const char*, const MemoryTracker*> places[] = {
      {"device", &engine_->device_memory()},
      {"host", &engine_->host_memory()},
      {"pinned_host", &engine_->pinned_memory()}};
  for (const auto& [place, tracker] : places) {
    memory["where"][place] = {{"current", tracker->TotalCurrent()}, {"peak", tracker->TotalPeak()}};
  }
  const std::pair<std::string, std::string> reports[] = {
      {"memory_rank" + rank + ".json", memory.dump(2)},
      {"comm_rank" + rank + ".json", comm.dump(2)}};
  for (const auto& [name, text] : reports) {
    const std::string path = (dir / name).string();
    std::ofstream out(path);
    out << text << "\n";
    if (ec || !out) Log().warn("cannot write {}; check training.output_dir", path);
  }
}

void Trainer::Finish(const TrainSummary& s) {
  if (!config_.training.save_final.empty()) {
    const std::string what = SaveModelWeights(config_.training.save_final, config_, *engine_);
    Log().info("saved the model to {} ({})", config_.training.save_final, what);
  }
  WriteReports();
  const MemorySnapshot mem = engine_->memory().Snapshot();
  if (s.steps == 0) {
    Log().info("done: no step taken (at step {} of training.steps {})", engine_->step(),
               config_.training.steps);
  } else {
    Log().info("done: {} steps in {:.1f} s ({:.0f} tok/s); loss {:.4f} -> {:.4f}{}", s.steps,
               s.seconds, s.tokens_per_s, s.first_loss, s.final_loss,
               s.final_eval_loss >= 0 ? fmt::format(", val loss {:.4f}", s.final_eval_loss) : "");
  }
  Log().info("peak memory: {} total ({})", FormatBytes(mem.total_peak),
             MemoryBreakdown(mem, /*with_current=*/false));
  if (!engine_->device().is_cpu()) {
    Log().info("peak memory by place: {} on {}, {} in host memory ({} pinned)",
               FormatBytes(engine_->device_memory().TotalPeak()), engine_->device().ToString(),
               FormatBytes(engine_->host_memory().TotalPeak()),
               FormatBytes(engine_->pinned_memory().TotalPeak()));
  }
  const int64_t scratch = engine_->ops().ScratchBytes();
  if (scratch > 0) {
    Log().info(
        "the CPU ops also hold {} of fp32 scratch for 16-bit arguments, outside the figures "
        "above and the estimate (docs/memory.md)",
        FormatBytes(scratch));
  }
}

}  // namespace ztrain
