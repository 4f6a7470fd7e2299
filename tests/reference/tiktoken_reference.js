// A tiktoken encoding as a Hugging Face tokenizer.json, and the ids js-tiktoken gives texts:
// the reference of tests/data/hf_tokenizer_test.cc for Split-regex byte-level BPE (Llama-3's
// and Qwen2's kind of file).
//   node tiktoken_reference.js MODULE_DIR ENCODING PATTERN IN.json TOKENIZER.json OUT.json
// MODULE_DIR: the installed js-tiktoken package; ENCODING: a js-tiktoken rank file (cl100k_base, o200k_base, gpt2); PATTERN: the Split regex
// written into the tokenizer.json ("" = the encoding's own); IN.json: an array of strings;
// OUT.json: an array of arrays of ids (js-tiktoken's encode with every special token allowed).
//
// The conversion is the one transformers applies to Llama-3's tiktoken file: the vocabulary is
// every rank's bytes in GPT-2's byte-to-unicode alphabet; the merges are every split of every
// token into two tokens, ordered by the merged token's rank, then the left's, then the right's;
// ignore_merges is true (a word in the vocabulary is its token), as in Llama-3's file.
const fs = require('fs');
const path = require('path');
const [moduleDir, encoding, pattern, inPath, tokenizerPath, outPath] = process.argv.slice(2);
const pkg = path.join(moduleDir, 'dist');
const { Tiktoken } = require(path.join(pkg, 'lite.cjs'));
const ranks = require(path.join(pkg, 'ranks', encoding + '.cjs'));

// GPT-2's bytes_to_unicode.
const byteChar = [];
let next = 256;
for (let b = 0; b < 256; b++) {
  const printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
  byteChar.push(String.fromCodePoint(printable ? b : next++));
}
const tokenString = (bytes) => Array.from(bytes, (b) => byteChar[b]).join('');

const rankOf = new Map();  // latin1 string of the bytes -> rank
const tokens = [];         // [bytes, rank]
for (const line of ranks.bpe_ranks.split('\n')) {
  if (!line) continue;
  const [, offset, ...b64] = line.split(' ');
  b64.forEach((t, i) => {
    const bytes = Buffer.from(t, 'base64');
    const rank = Number(offset) + i;
    rankOf.set(bytes.toString('latin1'), rank);
    tokens.push([bytes, rank]);
  });
}
const vocab = {};
const merges = [];
for (const [bytes, rank] of tokens) {
  vocab[tokenString(bytes)] = rank;
  for (let i = 1; i < bytes.length; i++) {
    const l = rankOf.get(bytes.subarray(0, i).toString('latin1'));
    const r = rankOf.get(bytes.subarray(i).toString('latin1'));
    if (l !== undefined && r !== undefined) {
      merges.push([rank, l, r, tokenString(bytes.subarray(0, i)), tokenString(bytes.subarray(i))]);
    }
  }
}
merges.sort((a, b) => a[0] - b[0] || a[1] - b[1] || a[2] - b[2]);
const added = Object.entries(ranks.special_tokens).map(([content, id]) => ({
  id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true,
}));
const tokenizer = {
  version: '1.0',
  added_tokens: added,
  normalizer: null,
  pre_tokenizer: {
    type: 'Sequence',
    pretokenizers: [
      { type: 'Split', pattern: { Regex: pattern || ranks.pat_str }, behavior: 'Isolated',
        invert: false },
      { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false },
    ],
  },
  post_processor: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false,
                    use_regex: true },
  decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
  model: {
    type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null,
    end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: true,
    vocab, merges: merges.map((m) => [m[3], m[4]]),
  },
};
fs.writeFileSync(tokenizerPath, JSON.stringify(tokenizer));
const enc = new Tiktoken(ranks);
const texts = JSON.parse(fs.readFileSync(inPath, 'utf8'));
fs.writeFileSync(outPath, JSON.stringify(texts.map((t) => enc.encode(t, 'all'))));
