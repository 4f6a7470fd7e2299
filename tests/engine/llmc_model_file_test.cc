// llm.c model files: the exact byte layout, bit-exact round trips, and clear errors.
#include "nn/llmc_model_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "engine/engine.h"
#include "nn/gpt2.h"
#include "test_model.h"

namespace ztrain {
namespace {

std::vector<char> ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

class LlmcModelFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ztrain_llmc_XXXXXX";
    dir_ = mkdtemp(tmpl);
    path_ = dir_ + "/model.bin";
  }
  void TearDown() override {
    std::remove(path_.c_str());
    std::remove((dir_ + "/other.bin").c_str());
    rmdir(dir_.c_str());
  }
  static nn::ParamLookup Lookup(Engine& e) {
    return [&e](const std::string& n) { return e.Parameter(n); };
  }
  std::string dir_, path_;
};

TEST_F(LlmcModelFileTest, WritesLlmcLayout) {
  const Config cfg = ParseConfig(testing::TinyConfigJson(3));
  Engine engine(cfg, nn::BuildGpt2(cfg.model));
  nn::SaveLlmcModel(path_, cfg.model, Lookup(engine));
  const std::vector<char> bytes = ReadAll(path_);
  ASSERT_EQ(bytes.size(), 1024 + 4 * static_cast<size_t>(engine.NumParameters()));
  int32_t header[256];
  std::memcpy(header, bytes.data(), sizeof header);
  EXPECT_EQ(header[0], 20240326);
  EXPECT_EQ(header[1], 3);
  EXPECT_EQ(header[2], 8);   // maxT
  EXPECT_EQ(header[3], 11);  // V
  EXPECT_EQ(header[4], 3);   // L
  EXPECT_EQ(header[5], 2);   // NH
  EXPECT_EQ(header[6], 8);   // C
  EXPECT_EQ(header[7], 16);  // Vp
  // llm.c's order: wte, wpe, then ln_1.weight of every layer, then ln_1.bias of every layer...
  size_t offset = 1024;
  const std::vector<std::string> expected = {"wte", "wpe", "h.0.ln_1.weight", "h.1.ln_1.weight",
                                             "h.2.ln_1.weight", "h.0.ln_1.bias"};
  for (const std::string& name : expected) {
    const Tensor t = engine.Parameter(name);
    ASSERT_EQ(std::memcmp(bytes.data() + offset, t.data(), t.nbytes()), 0) << name;
    offset += t.nbytes();
  }
  const Tensor lnf_b = engine.Parameter("ln_f.bias");
  EXPECT_EQ(std::memcmp(bytes.data() + bytes.size() - lnf_b.nbytes(), lnf_b.data(),
                        lnf_b.nbytes()),
            0);
}

TEST_F(LlmcModelFileTest, RoundTripsBitExactly) {
  const Config cfg = ParseConfig(testing::TinyConfigJson());
  Engine a(cfg, nn::BuildGpt2(cfg.model));
  nn::SaveLlmcModel(path_, cfg.model, Lookup(a));
  nlohmann::json other = testing::TinyConfigJson();
  other["training"]["seed"] = 999;
  Engine b(ParseConfig(other), nn::BuildGpt2(cfg.model));
  ASSERT_NE(std::memcmp(a.Parameter("wpe").data(), b.Parameter("wpe").data(),
                        a.Parameter("wpe").nbytes()),
            0);
  nn::LoadLlmcModel(path_, cfg.model, Lookup(b));
  for (const std::string& name : a.ParameterNames()) {
    ASSERT_EQ(std::memcmp(a.Parameter(name).data(), b.Parameter(name).data(),
                          a.Parameter(name).nbytes()),
              0)
        << name;
  }
  nn::SaveLlmcModel(dir_ + "/other.bin", cfg.model, Lookup(b));
  EXPECT_EQ(ReadAll(path_), ReadAll(dir_ + "/other.bin"));
}

TEST_F(LlmcModelFileTest, MismatchedShapeNamesTheKey) {
  const Config cfg = ParseConfig(testing::TinyConfigJson(2));
  Engine a(cfg, nn::BuildGpt2(cfg.model));
  nn::SaveLlmcModel(path_, cfg.model, Lookup(a));
  const Config three = ParseConfig(testing::TinyConfigJson(3));
  Engine b(three, nn::BuildGpt2(three.model));
  try {
    nn::LoadLlmcModel(path_, three.model, Lookup(b));
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("n_layer = 2"), std::string::npos) << e.what();
  }
}

TEST_F(LlmcModelFileTest, TruncatedAndForeignFilesAreNamed) {
  const Config cfg = ParseConfig(testing::TinyConfigJson());
  Engine a(cfg, nn::BuildGpt2(cfg.model));
  nn::SaveLlmcModel(path_, cfg.model, Lookup(a));
  std::vector<char> bytes = ReadAll(path_);
  bytes.resize(bytes.size() - 10);
  std::ofstream(path_, std::ios::binary).write(bytes.data(), bytes.size());
  EXPECT_THROW(nn::LoadLlmcModel(path_, cfg.model, Lookup(a)), IoError);
  bytes[0] = 1;  // not the magic
  std::ofstream(path_, std::ios::binary).write(bytes.data(), bytes.size());
  try {
    nn::LoadLlmcModel(path_, cfg.model, Lookup(a));
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("not an llm.c model file"), std::string::npos);
  }
  EXPECT_THROW(nn::LoadLlmcModel(dir_ + "/missing.bin", cfg.model, Lookup(a)), IoError);
}

}  // namespace
}  // namespace ztrain
