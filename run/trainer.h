#pragma once
// Trainer: the whole training run of `ztrain train` — model, data, engine, the step loop,
// progress lines, periodic evaluation, csv_monitor, the end-of-run summary and reports,
// and training.save_final. Embeddable: the launcher adds only the command line and signals.
//
// A stop request (the flag given to Run) ends the loop after the step in flight; the run
// then saves and reports as at a normal end. Errors throw; files already written stay valid.
//
// Devices: the config's `device` is resolved for this rank first (SelectDevice, Note [One rank
// per GPU] in run/device_select.h) and the Engine gets the concrete "cpu" or "cuda:N". On
// CUDA with several ranks the engine's dp/pp/tp groups are NCCL communicators made over
// `world`; the Trainer's own collectives of host values (stopping together, the memory
// report, checkpoints) stay on `world`.
#include <atomic>
#include <memory>
#include <optional>
#include <vector>

#include "core/config.h"
#include "data/data_loader.h"
#include "data/documents.h"
#include "engine/engine.h"
#include "nn/context_parallel.h"
#include "parallel/launch_env.h"
#include "parallel/process_grid.h"
#include "run/checkpointer.h"
#include "run/csv_monitor.h"
#include "run/device_select.h"
#include "run/train_sampler.h"

namespace ztrain {

struct TrainSummary {
  int64_t steps = 0;             // optimizer steps taken
  double first_loss = 0.0;       // loss of the first step
  double final_loss = 0.0;       // loss of the last step
  double final_eval_loss = -1;   // last validation loss; -1 when there was no evaluation
  double seconds = 0.0;          // wall time of the step loop
  double tokens_per_s = 0.0;
  bool interrupted = false;
};

class Trainer {
 public:
  // `world` is every rank of the job (not owned); null trains in one process. The ranks form
  // the dp x pp x tp grid of the config (ProcessGrid); every rank builds the same Trainer,
  // and the ranks at data-parallel coordinate d read rows d*B.. of each global batch.
  // `launch` places this process on its node (its local rank picks its GPU); the first form
  // reads it from the launcher's variables (DetectLaunchEnv). Collective over `world` (the
  // NCCL groups and the grid's splits).
  explicit Trainer(Config config, comm::Communicator* world = nullptr);
  Trainer(Config config, comm::Communicator* world, const LaunchEnv& launch);
  // Continues from a checkpoint under checkpoint.dir: `tag` is "latest" (falling back to the
  // newest intact checkpoint) or a step ("20", "step20"). With `required` (an explicit
  // --resume) a checkpoint.dir holding none is an error; without it (checkpoint.resume, a
  // requeued job's first launch) the run starts from step 0. A checkpoint at or past
  // training.steps is named in a warning (no step is left). Collective; call before Run.
  ResumePoint Resume(const std::string& tag, bool required = false);
  // Runs steps up to training.steps (from the step after a resumed one), fewer if *stop
  // becomes true on any rank: the ranks agree after each step and stop together. With
  // checkpoint.dir a checkpoint is saved every checkpoint.interval steps, at the end, and
  // when stopped. A run that did not resume refuses a checkpoint.dir holding another model's
  // checkpoints (its saves would replace them; Checkpointer::CheckFreshStart).
  TrainSummary Run(const std::atomic<bool>* stop = nullptr);
  // Mean loss over training.eval_batches validation batches (from the start of the split),
  // averaged over the dp group.
  double Evaluate();
  Engine& engine() { return *engine_; }
  // Where this rank trains, and why (logged at start).
  const DeviceChoice& device() const { return device_; }

 private:
  void LogStart() const;
  void LogProgress(const StepStats& s, double window_seconds, int64_t window_tokens);
  std::string PeakMemoryPerRank();
  void Finish(const TrainSummary& summary);
  void WriteReports() const;

  // "r0 (dp 0, pp 1, tp 0)": a rank and its grid coordinates, for messages.
  std::string RankName(int rank) const;
  bool AnyRank(bool value);  // collective over the world
  void WarnAboutAdapters() const;

  // The engine's groups: `world` itself on the CPU, NCCL ones on CUDA with several ranks.
  ParallelGroups MakeGroups();
  // The quantized base's one log line: weights, bytes against the compute dtype's, sharding.
  void LogQuantizedBase() const;

  Config config_;              // device: the concrete one SelectDevice chose
  comm::Communicator* world_;  // null: one process
  DeviceChoice device_;
  std::unique_ptr<ProcessGrid> grid_;
  // Declared before the groups split from it and the engine using them: destroyed after.
  std::unique_ptr<comm::Communicator> nccl_world_;  // on CUDA with several ranks
  // set when the grid has a pipeline, tensor or context parallelism
  GridCommunicators groups_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Checkpointer> checkpointer_;  // with checkpoint.dir
  bool resumed_ = false;                         // Resume was called
  std::unique_ptr<data::DataLoader> train_loader_;
  std::unique_ptr<data::DataLoader> val_loader_;  // null without a validation split
  std::unique_ptr<CsvMonitor> csv_;
  std::unique_ptr<TrainSampler> sampler_;  // with training.sample_interval
  std::vector<int32_t> tokens_, targets_;  // [gradient_accumulation_steps][B*T]
  // Note [Packed documents] (data/documents.h): the boundaries and each micro-batch's
  // positions, with data.packed_documents.
  std::optional<data::DocumentBoundary> documents_;
  std::vector<int32_t> positions_;
  std::vector<nn::MicroBatch> micro_batches_;  // whole sequences, as the loaders give them
  // Note [Context parallelism] (nn/context_parallel.h): this rank's pieces of `whole`, the
  // micro-batches its engine trains on (`whole` itself without context parallelism); the
  // pieces live in pieces_ until the next call.
  std::vector<nn::MicroBatch> Pieces(std::span<const nn::MicroBatch> whole);
  std::vector<std::unique_ptr<nn::ContextMicroBatch>> pieces_;
  // Bytes this rank's groups (dp, or dp x cp, pp and cp) have moved so far.
  int64_t CommBytes() const;
  std::vector<int64_t> comm_bytes_per_step_;  // dp-group bytes moved by this rank, per step
};

}  // namespace ztrain
