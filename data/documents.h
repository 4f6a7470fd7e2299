#pragma once
// Packed documents: where each document of a sample starts, from its document tokens.
//
// Note [Packed documents]: a sample is a window of T+1 consecutive tokens of the stream, which
// holds several documents back to back (the tokens `ztrain data` writes between them: Note
// [Document tokens], data/tokenizer.h). With data.packed_documents the run trains on each
// document as if it were alone, as Hugging Face's DataCollatorWithFlattening does for a
// padding-free batch:
//   - positions[b][t] counts up by one from 0 within each document (its position_ids): the
//     window's first token starts one (the rest of a document cut by the window), and so does
//     every document-start token after it: a `start_token` (the token before each document:
//     llm.c's <|endoftext|>, Llama-3's <|begin_of_text|>), or the token after an `end_token`
//     (an EOS after each document);
//   - attention stays within a document and RoPE turns by these positions (kernels::
//     AttentionMask, Ops::RopeForward), so a block of keys wholly before a query's document is
//     skipped like one above the causal diagonal;
//   - the target of the last token of a document, which is the next document's first token,
//     is kIgnoreTarget (core/loss_target.h): no loss is taken across a boundary. A document's
//     own end token, when it has one, is still predicted.
// The boundaries are read from the data, so they are the same on every rank and layout: the
// tokens come from data.document_start_token / data.document_end_token, or else from the
// manifest `ztrain data` wrote beside the shards (its tokenizer's document_tokens: the first
// token before each document, else the last after it). llm.c's own shards have no manifest:
// their GPT-2 <|endoftext|> (50256) is given as data.document_start_token.
#include <cstdint>
#include <string>

namespace ztrain {
struct DataConfig;
}  // namespace ztrain

namespace ztrain::data {

struct DocumentBoundary {
  int32_t start_token = -1;  // each document begins with this token, or -1
  int32_t end_token = -1;    // each document ends with this token (when start_token is -1)
  std::string source;        // where they came from, for the log
};

// The boundary of data.train (every dataset of a mixture; the synthetic corpus has none):
// the config's tokens, else the manifest beside the shards. ConfigError naming the keys when
// neither gives one, or when the manifests of a mixture's datasets disagree.
DocumentBoundary ResolveDocumentBoundary(const DataConfig& data);

// The manifest `ztrain data` writes beside a shard (Note [Corpus shards]): the shard's path
// without ".bin", "_NNNNNN" and ".val", plus ".manifest.json".
std::string ManifestOf(const std::string& shard_path);

// Marks `rows` samples of `seq` tokens in place (Note [Packed documents]): writes positions
// [rows, seq] and sets the targets that begin another document to kIgnoreTarget (targets[t]
// is token t + 1 of the window). Returns the documents the samples hold (tokens at position 0).
int64_t MarkDocuments(const DocumentBoundary& boundary, int64_t rows, int64_t seq,
                      const int32_t* tokens, int32_t* targets, int32_t* positions);

}  // namespace ztrain::data
