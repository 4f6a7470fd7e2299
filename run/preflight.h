#pragma once
// Note [Preflight]
// Everything a run will read or write, checked before it trains, so that a run never trains to
// its end and then loses the weights to a missing directory, and `ztrain check-config` refuses
// what `ztrain train` would:
//   outputs   training.save_final (its directory creatable and writable; the path not a
//             directory unless it names a Hugging Face directory to write, nn/hf_checkpoint.h;
//             not model.init_from), checkpoint.dir (also: not locked by a live
//             run), training.output_dir and the csv_monitor's directory (directories, not
//             regular files, creatable and writable), each offload nvme_path (an existing,
//             writable directory);
//   inputs    model.init_from (an llm.c model file, read by Note [A run's config]; a
//             Hugging Face directory: its index and headers valid, every tensor the model
//             needs there in its shape — headers only, checked even without open_data),
//             data.train and data.val (shards that match, are valid and hold only tokens
//             below model.vocab_size).
// "Writable" is tried, not inferred from permission bits (which root ignores): a probe file is
// created, written and removed in the directory, or in its nearest existing parent when the
// directory is still to be made. A run (the Trainer) makes its output directories at once and
// checks the inputs as its loaders open them; check-config makes nothing and opens the data.
// Thread compatible; touches only the probe files.
#include <string>
#include <vector>

#include "core/config.h"

namespace ztrain {

struct PreflightOptions {
  bool create_outputs = false;  // make the output directories (a run) or leave them (check)
  bool open_data = true;        // open data.train / data.val and check their tokens
  // Whether a live run holds checkpoint.dir's lock (check-config). A run leaves that to its
  // Checkpointer, whose rank 0 takes the lock while the other ranks' preflights run.
  bool check_locks = true;
};

// Every problem found, one per line ("checkpoint.dir: ..."); empty when all is well.
std::vector<std::string> PreflightProblems(const Config& config, const PreflightOptions& options);
// Throws InvalidConfig(problems) (core/config.h) when there is any.
void Preflight(const Config& config, const PreflightOptions& options);

}  // namespace ztrain
