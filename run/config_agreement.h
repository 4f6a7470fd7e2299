#pragma once
// Note [One config on every rank]
// Every rank of a job trains with the same resolved config, or none trains: ranks started
// MPMD-style (`mpirun -np 1 ztrain --config a.json : -np 1 ztrain --config b.json`), a config
// file that differs between nodes, or an edited copy would otherwise train a model that no
// single process trains, without a word. At start the ranks all-gather a CRC-32C of their
// resolved config (4 bytes each); when any differs they all-gather one CRC-32C per schema key
// to find which keys differ and then those keys' values, and every rank refuses the run with
// the same message, naming each key and what each rank has.
// The "auto"s resolved from each rank's own machine (Note [A run's config]) may differ
// legitimately between nodes, so they are agreed on first: the micro-batch is the smallest any
// rank found, bf16 is on only where every rank computes it.
// Collective over `world`; throws ConfigError on every rank when the configs differ.
#include "core/config.h"
#include "parallel/comm/communicator.h"

namespace ztrain {

void AgreeOnConfig(Config& config, comm::Communicator& world);

}  // namespace ztrain
