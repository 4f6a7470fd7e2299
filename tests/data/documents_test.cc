// Note [Packed documents]: the positions and ignored targets MarkDocuments writes for both
// kinds of boundary token, where manifests are looked for, and the refusals that name the
// keys to set.
#include "data/documents.h"

#include <gtest/gtest.h>

#include <fstream>
#include <vector>

#include "core/config.h"
#include "core/error.h"
#include "core/loss_target.h"
#include "data/token_shard.h"
#include "tests/data/data_test_util.h"

namespace ztrain::data {
namespace {

using test_util::ExpectErrorWith;
using test_util::TempDir;
constexpr int32_t kX = kIgnoreTarget;

// Windows of T + 1 tokens as the loader gives them: tokens = w[0..T-1], targets = w[1..T].
struct Marked {
  std::vector<int32_t> tokens, targets, positions;
  int64_t documents = 0;
};

Marked Mark(const DocumentBoundary& b, const std::vector<std::vector<int32_t>>& windows) {
  Marked m;
  const int64_t seq = static_cast<int64_t>(windows[0].size()) - 1;
  for (const std::vector<int32_t>& w : windows) {
    m.tokens.insert(m.tokens.end(), w.begin(), w.end() - 1);
    m.targets.insert(m.targets.end(), w.begin() + 1, w.end());
  }
  m.positions.assign(m.tokens.size(), -7);
  m.documents = MarkDocuments(b, static_cast<int64_t>(windows.size()), seq, m.tokens.data(),
                              m.targets.data(), m.positions.data());
  return m;
}

TEST(DocumentsTest, StartTokenBeginsEachDocument) {
  // Token 9 before each document. Row 0 begins mid-document; row 1 with a start token; the
  // last target of row 1 is the next document's start token.
  const Marked m = Mark({9, -1, ""}, {{4, 5, 9, 1, 2, 9, 3}, {9, 6, 7, 8, 9, 1, 9}});
  EXPECT_EQ(m.positions, (std::vector<int32_t>{0, 1, 0, 1, 2, 0,  //
                                               0, 1, 2, 3, 0, 1}));
  EXPECT_EQ(m.targets, (std::vector<int32_t>{5, kX, 1, 2, kX, 3,  //
                                             6, 7, 8, kX, 1, kX}));
  EXPECT_EQ(m.tokens, (std::vector<int32_t>{4, 5, 9, 1, 2, 9, 9, 6, 7, 8, 9, 1}));
  EXPECT_EQ(m.documents, 5);
}

TEST(DocumentsTest, EndTokenEndsEachDocument) {
  // Token 0 after each document: its own end is predicted, the token after it is not.
  const Marked m = Mark({-1, 0, ""}, {{4, 5, 0, 1, 2, 0, 3}, {0, 6, 0, 0, 7, 8, 0}});
  EXPECT_EQ(m.positions, (std::vector<int32_t>{0, 1, 2, 0, 1, 2,  //
                                               0, 0, 1, 0, 0, 1}));
  EXPECT_EQ(m.targets, (std::vector<int32_t>{5, 0, kX, 2, 0, kX,  //
                                             kX, 0, kX, kX, 8, 0}));
  EXPECT_EQ(m.documents, 6);
}

TEST(DocumentsTest, ManifestSitsBesideTheShards) {
  EXPECT_EQ(ManifestOf("d/web.bin"), "d/web.manifest.json");
  EXPECT_EQ(ManifestOf("d/web_000003.bin"), "d/web.manifest.json");
  EXPECT_EQ(ManifestOf("d/web.val.bin"), "d/web.manifest.json");
  EXPECT_EQ(ManifestOf("d/web.val_000000.bin"), "d/web.manifest.json");
  EXPECT_EQ(ManifestOf("d/fineweb_train_000001.bin"), "d/fineweb_train.manifest.json");
}

TEST(DocumentsTest, ConfigTokensNeedNoManifest) {
  DataConfig d;
  d.train = "/nonexistent/*.bin";
  d.document_start_token = 50256;
  const DocumentBoundary b = ResolveDocumentBoundary(d);
  EXPECT_EQ(b.start_token, 50256);
  EXPECT_EQ(b.end_token, -1);
  EXPECT_EQ(b.source, "data.document_start_token");
}

TEST(DocumentsTest, RefusalsNameTheKeysToSet) {
  TempDir dir;
  DataConfig d;  // the synthetic corpus
  ExpectErrorWith<ConfigError>([&] { ResolveDocumentBoundary(d); },
                               {"synthetic corpus", "data.document_start_token"});
  const std::vector<uint16_t> tokens(64, 3);
  WriteTokenShard(dir.File("a.bin"), tokens, TokenFormat::kUint16);
  d.train = dir.File("a.bin");  // llm.c's shards: no manifest
  ExpectErrorWith<ConfigError>([&] { ResolveDocumentBoundary(d); },
                               {"no corpus manifest", "a.manifest.json", "50256"});
  std::ofstream(dir.File("a.manifest.json"))
      << R"({"tokenizer": {"document_tokens": {"before": [], "after": []}}})";
  ExpectErrorWith<ConfigError>([&] { ResolveDocumentBoundary(d); },
                               {"lists no document tokens", "--bos"});
  // A mixture of corpora whose document tokens differ.
  std::ofstream(dir.File("a.manifest.json"))
      << R"({"tokenizer": {"document_tokens": {"before": [7], "after": []}}})";
  WriteTokenShard(dir.File("b.bin"), tokens, TokenFormat::kUint16);
  std::ofstream(dir.File("b.manifest.json"))
      << R"({"tokenizer": {"document_tokens": {"before": [], "after": [2]}}})";
  d.train.clear();
  d.train_mixture = {{dir.File("a.bin"), 1.0}, {dir.File("b.bin"), 1.0}};
  ExpectErrorWith<ConfigError>([&] { ResolveDocumentBoundary(d); },
                               {"token 7 before each document", "token 2 after each document"});
  d.train_mixture = {{dir.File("a.bin"), 1.0}};
  EXPECT_EQ(ResolveDocumentBoundary(d).start_token, 7);
}

}  // namespace
}  // namespace ztrain::data
