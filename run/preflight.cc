// Note [Preflight] (run/preflight.h).
#include "run/preflight.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string_view>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "data/documents.h"
#include "data/token_source.h"
#include "nn/family.h"
#include "nn/hf_checkpoint.h"
#include "nn/peft.h"

namespace ztrain {
namespace {

namespace fs = std::filesystem;
using detail::StrCat;
using Problems = std::vector<std::string>;

std::string Why(int err) {
  switch (err) {
    case EROFS:
      return "it is on a read-only file system";
    case EACCES:
    case EPERM:
      return "permission denied";
    case ENOSPC:
    case EDQUOT:
      return "the disk is full";
    default:
      return std::strerror(err);
  }
}

// The name of ProbeWrite's files, which other ranks' preflights may see for a moment.
constexpr std::string_view kProbePrefix = ".ztrain-probe-";

// "" when a file can be created, written and removed in the existing directory `dir`.
std::string ProbeWrite(const fs::path& dir) {
  std::string name = (dir / StrCat(kProbePrefix, "XXXXXX")).string();
  const int fd = ::mkstemp(name.data());
  if (fd < 0) return Why(errno);
  const char byte = 0;
  const bool wrote = ::write(fd, &byte, 1) == 1;
  const int err = errno;
  ::close(fd);
  ::unlink(name.c_str());
  return wrote ? "" : Why(err);
}

// The nearest existing ancestor of `p` (p itself when it exists; "." for a relative path none
// of whose parts exists).
fs::path NearestExisting(fs::path p) {
  std::error_code ec;
  while (!p.empty() && !fs::exists(p, ec)) p = p.parent_path();
  return p.empty() ? fs::path(".") : p;
}

// An output directory: a directory (not a file), writable, or creatable and then writable.
void OutputDir(const std::string& key, const std::string& dir, bool create, Problems& problems) {
  const fs::path existing = NearestExisting(dir);
  std::error_code ec;
  if (!fs::is_directory(existing, ec)) {
    problems.push_back(StrCat(
        key, ": '", existing.string(), "' is a regular file, not a directory",
        existing == fs::path(dir) ? "" : StrCat(", so '" + dir + "' cannot be made below it"),
        "; point ", key, " elsewhere or move the file"));
    return;
  }
  if (existing != fs::path(dir) && create) {
    fs::create_directories(dir, ec);
    if (ec) {
      problems.push_back(StrCat(key, ": cannot create '", dir, "': ", Why(ec.value()), "; point ",
                                key, " at a directory this job can write"));
      return;
    }
  }
  const fs::path probe = create ? fs::path(dir) : existing;
  const std::string why = ProbeWrite(probe);
  if (!why.empty()) {
    problems.push_back(StrCat(key, ": cannot write in '", probe.string(), "': ", why,
                              probe == fs::path(dir) ? "" : StrCat(" (to create '", dir, "')"),
                              "; point ", key, " at a directory this job can write"));
  }
}

// An output file, in a directory OutputDir accepts.
void OutputFile(const std::string& key, const std::string& path, bool create, Problems& problems) {
  const fs::path parent = fs::path(path).parent_path();
  OutputDir(key, parent.empty() ? "." : parent.string(), create, problems);
}

bool SameFile(const std::string& a, const std::string& b) {
  std::error_code ec;
  if (fs::exists(a, ec) && fs::exists(b, ec)) return fs::equivalent(a, b, ec);
  return fs::weakly_canonical(a, ec) == fs::weakly_canonical(b, ec);
}

// The entries of an existing directory that are not a model's or adapter's files (the final
// save replaces the whole directory: Note [Staged outputs]), at most four named.
std::string NotModelFiles(const std::string& dir) {
  std::error_code ec;
  std::string found;
  int n = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string(), ext = e.path().extension().string();
    if (name.starts_with(kProbePrefix)) continue;  // another rank's preflight, gone in a moment
    const bool model = e.is_regular_file() && (ext == ".safetensors" || ext == ".json" ||
                                               ext == ".model" || name == "merges.txt" ||
                                               name == "README.md");
    if (!model && ++n <= 4) found += StrCat(n > 1 ? ", " : "", name, e.is_directory() ? "/" : "");
  }
  return n > 4 ? StrCat(found, " and ", n - 4, " more") : found;
}

// Whether `inner` is `outer` or lies below it, by path (links resolved as far as they exist).
bool Within(const std::string& inner, const std::string& outer) {
  std::error_code ec;
  const fs::path in = fs::weakly_canonical(fs::absolute(inner), ec);
  const fs::path out = fs::weakly_canonical(fs::absolute(outer), ec);
  auto o = out.begin();
  for (auto i = in.begin(); o != out.end(); ++i, ++o) {
    if (o->empty()) break;  // a trailing separator
    if (i == in.end() || *i != *o) return false;
  }
  return true;
}

// The final save replaces its whole directory (Note [Staged outputs]): what the run writes
// there before it, its checkpoints, reports and swap files, would go with it.
void NothingInsideTheFinalSave(const Config& c, Problems& problems) {
  const std::string& final_model = c.training.save_final;
  const std::pair<const char*, std::string> outputs[] = {
      {"checkpoint.dir", c.checkpoint.dir},
      {"training.output_dir", c.training.output_dir},
      {"csv_monitor.output_path", c.csv_monitor.enabled ? c.csv_monitor.output_path : ""},
      {"zero_optimization.offload_param.nvme_path", c.zero.offload_param.nvme_path},
      {"zero_optimization.offload_optimizer.nvme_path", c.zero.offload_optimizer.nvme_path}};
  for (const auto& [key, path] : outputs) {
    if (path.empty() || !Within(path, final_model)) continue;
    problems.push_back(StrCat("training.save_final: '", final_model, "' holds ", key, " '", path,
                              "', and the final save replaces the whole directory; put them "
                              "apart (e.g. save_final 'final/' beside output_dir 'run/')"));
  }
}

void Outputs(const Config& c, const PreflightOptions& o, Problems& problems) {
  const bool create = o.create_outputs;
  const std::string& final_model = c.training.save_final;
  if (!final_model.empty()) {
    // A directory (ending in '/', or existing) gets a Hugging Face model directory, a LoRA
    // run's a PEFT adapter directory; any other path an llm.c model file, GPT-2's format only.
    if (c.lora.enabled || nn::NamesHfModelDir(final_model)) {
      OutputDir("training.save_final", final_model, create, problems);
      NothingInsideTheFinalSave(c, problems);
      if (const std::string other = NotModelFiles(final_model); !other.empty()) {
        problems.push_back(StrCat("training.save_final: '", final_model, "' holds ", other,
                                  ", which are not a model's files; the final save replaces "
                                  "the whole directory, so point training.save_final at a new "
                                  "or empty directory (or an earlier save)"));
      }
    } else if (c.model.type != "gpt2") {
      problems.push_back(StrCat("training.save_final: '", final_model,
                                "' names a file, which ztrain writes as an llm.c model file, "
                                "a GPT-2 format; model.type is ", c.model.type,
                                ": end the path with '/' to get a Hugging Face model "
                                "directory"));
    } else {
      OutputFile("training.save_final", final_model, create, problems);
    }
    if (!c.model.init_from.empty() && SameFile(final_model, c.model.init_from)) {
      problems.push_back(StrCat("training.save_final: '", final_model,
                                "' is model.init_from, the weights this run starts from; save "
                                "to another file so that they are not overwritten"));
    }
  }
  if (!c.checkpoint.dir.empty()) {
    OutputDir("checkpoint.dir", c.checkpoint.dir, create, problems);
    const std::string holder = o.check_locks ? checkpoint::DirectoryHolder(c.checkpoint.dir) : "";
    if (!holder.empty()) {
      problems.push_back(StrCat("checkpoint.dir: '", c.checkpoint.dir,
                                "' is in use by a running job (", holder,
                                "); wait for it to end, or give this run another checkpoint.dir"));
    }
  }
  OutputDir("training.output_dir", c.training.output_dir, create, problems);
  if (c.csv_monitor.enabled) {
    const fs::path dir =
        fs::path(c.csv_monitor.output_path.empty() ? "." : c.csv_monitor.output_path) /
        c.csv_monitor.job_name;
    OutputDir("csv_monitor.output_path", dir.string(), create, problems);
  }
  const std::string z = "zero_optimization.";
  const std::pair<std::string, const std::string*> swaps[] = {
      {"offload_param", c.zero.stage == 3 && c.zero.offload_param.device == "nvme"
                            ? &c.zero.offload_param.nvme_path
                            : nullptr},
      {"offload_optimizer",
       c.zero.offload_optimizer.device == "nvme" ? &c.zero.offload_optimizer.nvme_path : nullptr}};
  for (const auto& [section, path] : swaps) {
    if (!path) continue;
    std::error_code ec;
    const std::string key = z + section + ".nvme_path";
    if (!fs::is_directory(*path, ec)) {
      problems.push_back(StrCat(key, ": '", *path,
                                "' is not a directory; create it or point "
                                "nvme_path at a local NVMe mount"));
    } else if (const std::string why = ProbeWrite(*path); !why.empty()) {
      problems.push_back(StrCat(key, ": cannot write in '", *path, "': ", why,
                                "; point nvme_path at a directory this job can write"));
    }
  }
}

void Inputs(const Config& c, Problems& problems) {
  std::vector<std::pair<std::string, std::string>> inputs = {{"data.train", c.data.train},
                                                             {"data.val", c.data.val}};
  for (size_t i = 0; i < c.data.train_mixture.size(); ++i) {
    inputs.emplace_back(StrCat("data.train[", i, "].path"), c.data.train_mixture[i].path);
  }
  for (const auto& [key, pattern] : inputs) {
    if (pattern.empty()) continue;
    try {
      data::ShardFileSource(pattern).CheckVocabulary(c.model.vocab_size);
    } catch (const Error& e) {
      problems.push_back(StrCat(key, ": ", e.what()));
    }
  }
  if (c.data.packed_documents) {  // where the documents' boundaries come from
    try {
      data::ResolveDocumentBoundary(c.data);
    } catch (const Error& e) {
      problems.push_back(e.what());
    }
  }
}

// A Hugging Face model.init_from: its index and every safetensors header are valid and it
// holds every tensor the model needs, in its shape (headers only: no tensor data is read);
// likewise a lora.init_from adapter against the adapters this config trains.
void Weights(const Config& c, Problems& problems) {
  if (!c.lora.init_from.empty()) {
    try {
      const nn::HfCheckpoint adapter(c.lora.init_from, nn::kPeftAdapterFiles);
      nn::CheckHfTensors(adapter, nn::PeftLayout(c.model, c.lora),
                         nn::FindModelFamily(c.model.type).hf);
    } catch (const Error& e) {
      problems.push_back(StrCat("lora.init_from: ", e.what()));
    }
  }
  if (!nn::IsHfModelDir(c.model.init_from)) return;
  try {
    const nn::HfCheckpoint ckpt(c.model.init_from);
    const nn::HfFamily& family = nn::FindModelFamily(c.model.type).hf;
    nn::CheckHfTensors(ckpt, family.layout(c.model), family);
  } catch (const Error& e) {
    problems.push_back(StrCat("model.init_from: ", e.what()));
  }
}

}  // namespace

std::vector<std::string> PreflightProblems(const Config& config, const PreflightOptions& options) {
  Problems problems;
  Outputs(config, options, problems);
  Weights(config, problems);
  if (options.open_data) Inputs(config, problems);
  return problems;
}

void Preflight(const Config& config, const PreflightOptions& options) {
  const std::vector<std::string> problems = PreflightProblems(config, options);
  if (!problems.empty()) throw InvalidConfig(problems);
}

}  // namespace ztrain
