#pragma once
// Shared by the checkpoint tests (checkpoint_test.cc, checkpoint_safety_test.cc): a temporary
// directory, the tiny model's config with a checkpoint.dir, training on fixed batches, two
// saved checkpoints, and a flipped byte.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "engine/engine.h"
#include "nn/gpt2.h"
#include "run/checkpointer.h"
#include "test_model.h"

namespace ztrain::checkpoint_test {

namespace fs = std::filesystem;

// A fresh directory, removed with its contents.
struct TempDir {
  std::string path;
  TempDir() {
    std::string t = "/tmp/ztrain_ckpt_test_XXXXXX";
    path = ::mkdtemp(t.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

struct Layout {
  int stage = 0;
  std::string offload = "none";  // none | cpu | nvme (optimizer; and parameters at stage 3)
};

inline Config MakeConfig(const Layout& l, const std::string& dir, const std::string& nvme = "") {
  nlohmann::json j = testing::TinyConfigJson(2, 16, 2, 11, 8);
  j["gradient_clipping"] = 0.5;
  j["optimizer"]["params"]["weight_decay"] = 0.1;
  j["scheduler"] = {{"type", "WarmupCosineLR"},
                    {"params", {{"warmup_num_steps", 3}, {"total_num_steps", 20}}}};
  j["zero_optimization"] = {{"stage", l.stage}};
  if (l.offload != "none") {
    nlohmann::json o = {{"device", l.offload}};
    if (l.offload == "nvme") o["nvme_path"] = nvme;
    j["zero_optimization"]["offload_optimizer"] = o;
    j["zero_optimization"]["sub_group_size"] = 700;  // tiles cross layers
    if (l.stage == 3) j["zero_optimization"]["offload_param"] = o;
  }
  j["checkpoint"] = {{"dir", dir}, {"keep_last", 2}};
  j["training"]["job_name"] = "checkpoint_test";
  return ParseConfig(j);
}

inline std::vector<StepStats> Train(Engine& e, int from, int to) {
  std::vector<StepStats> steps;
  for (int step = from; step < to; ++step) {
    testing::OwnedBatch batch(4, 8, 11, 500 + step);
    steps.push_back(e.TrainStep({&batch.mb, 1}));
  }
  return steps;
}

// Saves steps 5 and 10 of one run.
struct TwoCheckpoints {
  TempDir dir;
  Config cfg = MakeConfig(Layout{}, dir.path);
  TwoCheckpoints() {
    Engine e(cfg, nn::BuildGpt2(cfg.model));
    Checkpointer ck(cfg, e, nullptr);
    Train(e, 0, 5);
    ck.Save(5, {});
    Train(e, 5, 10);
    ck.Save(10, {});
  }
  std::string File(int step, const std::string& name) const {
    return dir.path + "/" + checkpoint::StepName(step) + "/" + name;
  }
  int64_t Resume(const std::string& tag) {
    Engine e(cfg, nn::BuildGpt2(cfg.model));
    return Checkpointer(cfg, e, nullptr).Resume(tag).step;
  }
};

inline void FlipByte(const std::string& path, int64_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  f.seekp(at);
  f.write(&c, 1);
}

}  // namespace ztrain::checkpoint_test
