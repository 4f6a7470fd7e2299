// compare_runs: the equivalence rule at the command line. Compares two `ztrain` runs of the
// same model on the same samples -- their train.csv (loss and gradient norm of every step)
// and their final model files (llm.c files or Hugging Face directories) -- within Note
// [Equivalence tolerances] (tests/rounding_model.h), the model taken from the reference run's
// config:
//   compare_runs --config single.json --csv single/train.csv dp/train.csv --steps 20
//                [--models single.bin dp.bin] [--exact]
// --exact: the runs do the same arithmetic in the same order (a resume on the same layout),
// so everything must agree bit for bit (the CSV's printed digits, the files' bytes).
// Prints the headroom of each check; exit 0 when all hold, 1 with every value out of its
// tolerance, 2 for bad arguments.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/config.h"
#include "nn/family.h"
#include "nn/hf_checkpoint.h"
#include "nn/llmc_model_file.h"
#include "nn/peft.h"
#include "tests/rounding_model.h"

namespace ztrain {
namespace {

struct Row {
  int64_t step;
  double loss, lr, grad_norm;
  std::string text;  // step,loss,lr,grad_norm as printed
};

std::vector<Row> ReadCsv(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::string line;
  std::getline(in, line);  // header
  std::vector<Row> rows;
  while (std::getline(in, line)) {
    std::stringstream s(line);
    std::string step, loss, lr, norm;
    std::getline(s, step, ',');
    std::getline(s, loss, ',');
    std::getline(s, lr, ',');
    std::getline(s, norm, ',');
    rows.push_back({std::stoll(step), std::stod(loss), std::stod(lr), std::stod(norm),
                    step + "," + loss + "," + lr + "," + norm});
  }
  return rows;
}

using Model = std::map<std::string, std::vector<float>>;

// The model's parameters (each tied weight once) and their shapes.
std::map<std::string, Shape> Shapes(const ModelConfig& m) {
  std::map<std::string, Shape> shapes;
  for (const auto& layer : nn::BuildModel(m)) {
    for (const nn::ParamSpec& s : layer->Params()) {
      if (s.tied_to.empty()) shapes[s.name] = s.shape;
    }
  }
  return shapes;
}

bool IsPeftDir(const std::string& path) {
  return std::filesystem::is_regular_file(std::filesystem::path(path) / "adapter_config.json");
}

Model ReadModel(const std::string& path, const Config& c) {
  const ModelConfig& m = c.model;
  Model values;
  const bool peft = IsPeftDir(path);     // a LoRA run's adapter (nn/peft.h)
  if (peft || nn::IsHfModelDir(path)) {  // or a HF directory (save_final ending in /)
    const nn::HfCheckpoint ckpt(path, peft ? nn::kPeftAdapterFiles : nn::kHfModelFiles);
    for (const nn::HfTensor& t :
         peft ? nn::PeftLayout(m, c.lora) : nn::FindModelFamily(m.type).hf.layout(m)) {
      std::vector<float>& v = values[t.param];
      v.resize(static_cast<size_t>(NumElements(t.param_shape)));
      nn::ReadHfParameter(ckpt, t, 0, NumElements(t.param_shape), v.data());
    }
    return values;
  }
  const std::map<std::string, Shape> shapes = Shapes(m);
  nn::LoadLlmcModel(path, m, [&](const std::string& name) {
    std::vector<float>& v = values[name];
    v.resize(static_cast<size_t>(NumElements(shapes.at(name))));
    return ztrain::Tensor(v.data(), DType::kF32, shapes.at(name));
  });
  return values;
}

std::string Bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

int Compare(int argc, char** argv) {
  std::string config_path, csv[2], models[2];
  int64_t steps = -1;
  bool exact = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool more = i + 1 < argc;
    if (a == "--config" && more) {
      config_path = argv[++i];
    } else if (a == "--csv" && i + 2 < argc) {
      csv[0] = argv[++i];
      csv[1] = argv[++i];
    } else if (a == "--models" && i + 2 < argc) {
      models[0] = argv[++i];
      models[1] = argv[++i];
    } else if (a == "--steps" && more) {
      steps = std::stoll(argv[++i]);
    } else if (a == "--exact") {
      exact = true;
    } else {
      std::fprintf(stderr, "compare_runs: unexpected argument '%s'\n", a.c_str());
      return 2;
    }
  }
  if (config_path.empty() || csv[0].empty() || steps < 0) {
    std::fprintf(stderr, "usage: compare_runs --config REF.json --csv REF.csv GOT.csv --steps N "
                         "[--models REF.bin GOT.bin] [--exact]\n");
    return 2;
  }
  const Config config = LoadConfigFile(config_path);
  const int64_t tokens = config.train_batch_size * config.data.seq_len;
  int64_t params = 0;
  for (const auto& [name, shape] : Shapes(config.model)) params += NumElements(shape);
  testing::RoundingModel model = testing::ModelFor(config, params, tokens, steps);
  model.exact = exact;
  testing::EquivalenceCheck check(model, config.model.n_embd);
  std::vector<std::string> failures;

  const std::vector<Row> want = ReadCsv(csv[0]), got = ReadCsv(csv[1]);
  if (static_cast<int64_t>(want.size()) != steps || static_cast<int64_t>(got.size()) != steps) {
    failures.push_back("expected " + std::to_string(steps) + " rows in each train.csv, got " +
                       std::to_string(want.size()) + " and " + std::to_string(got.size()));
  }
  double lr_sum = 0.0;
  for (size_t i = 0; i < std::min(want.size(), got.size()); ++i) {
    if (want[i].step != got[i].step) {
      failures.push_back("row " + std::to_string(i + 1) + ": step " + std::to_string(want[i].step) +
                         " vs " + std::to_string(got[i].step));
    }
    if (exact && want[i].text != got[i].text) {
      failures.push_back("step " + std::to_string(want[i].step) + ": " + want[i].text + " vs " +
                         got[i].text + " (must be identical)");
    }
    check.Step(want[i].step, got[i].loss, want[i].loss, got[i].grad_norm, want[i].grad_norm,
               lr_sum);
    lr_sum += want[i].lr;
  }
  if (!models[0].empty()) {
    const bool peft = IsPeftDir(models[0]) && IsPeftDir(models[1]);
    const bool dirs = peft || (nn::IsHfModelDir(models[0]) && nn::IsHfModelDir(models[1]));
    const std::string config_file = peft ? "/adapter_config.json" : "/config.json";
    const std::string a = dirs ? Bytes(models[0] + config_file) : Bytes(models[0]);
    const std::string b = dirs ? Bytes(models[1] + config_file) : Bytes(models[1]);
    if (dirs ? a != b : a.size() < 1024 || b.size() < 1024 || a.compare(0, 1024, b, 0, 1024) != 0) {
      failures.push_back(dirs ? "the model directories' config.json differ"
                              : "the model files' 1 KiB headers differ");
    } else if (exact && !dirs && a != b) {
      failures.push_back("the model files differ (must be identical)");
    } else {
      const Model ref = ReadModel(models[0], config), run = ReadModel(models[1], config);
      for (const auto& [name, values] : ref) {
        check.Values(name, run.at(name).data(), values.data(),
                     static_cast<int64_t>(values.size()), lr_sum);
      }
      if (check.tensors() < (peft ? 4 : 10)) failures.push_back("too few tensors compared");
    }
  }
  check.Report("compare_runs");
  failures.insert(failures.end(), check.failures().begin(), check.failures().end());
  for (const std::string& f : failures) std::printf("FAIL: %s\n", f.c_str());
  return failures.empty() ? 0 : 1;
}

}  // namespace
}  // namespace ztrain

int main(int argc, char** argv) {
  try {
    return ztrain::Compare(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "compare_runs: %s\n", e.what());
    return 2;
  }
}
