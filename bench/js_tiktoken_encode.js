// js-tiktoken's GPT-2 encoder over a JSONL corpus, the reference of bench/tokenizer_bench:
//   node js_tiktoken_encode.js MODULE_DIR CORPUS.jsonl   (MODULE_DIR: the installed js-tiktoken)
// Prints "<tokens> <seconds>": every document's "text" encoded (special tokens allowed, as
// ztrain matches them), best of three passes, loading excluded.
const fs = require('fs');
const path = require('path');
const [moduleDir, corpus] = process.argv.slice(2);
const pkg = path.join(moduleDir, 'dist');
const { Tiktoken } = require(path.join(pkg, 'lite.cjs'));
const enc = new Tiktoken(require(path.join(pkg, 'ranks', 'gpt2.cjs')));
const docs = fs.readFileSync(corpus, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l).text);
let best = Infinity;
let tokens = 0;
for (let pass = 0; pass < 3; pass++) {
  const t0 = process.hrtime.bigint();
  tokens = 0;
  for (const d of docs) tokens += enc.encode(d, 'all').length;
  best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
}
console.log(tokens, best);
