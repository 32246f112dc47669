// SPDX-License-Identifier: MIT
// tools/peer/tokenize_speed.js - the peer of `dpshard bench tokenize`: encode MB/s of Hugging
// Face's tokenizers library (the npm package `tokenizers`, the official binding of the Rust
// library) on the very texts `bench tokenize --write-text DIR` wrote, median of R rounds, one
// encode at a time, special tokens added as dpshard adds them.
//   npm install --prefix DIR tokenizers
//   node tools/peer/tokenize_speed.js DIR/node_modules TOKENIZER_JSON TEXT_DIR [ROUNDS]
'use strict';
const fs = require('fs');
const path = require('path');

async function main() {
  const [modules, tokenizerJson, textDir, roundsArg] = process.argv.slice(2);
  const rounds = Number(roundsArg || 5);
  const { Tokenizer } = require(path.join(modules, 'tokenizers'));
  const tok = Tokenizer.fromFile(tokenizerJson);
  console.log(`tokenizers (npm), ${rounds} rounds, median`);
  console.log('| text | bytes | tokens | MB/s |\n|---|---|---|---|');
  for (const [name, file] of [['document', 'document.txt'], ['1 MiB prompt', 'prompt-1m.txt']]) {
    const text = fs.readFileSync(path.join(textDir, file), 'utf8');
    const bytes = Buffer.byteLength(text);
    const speeds = [];
    let n = 0;
    for (let r = 0; r < rounds; r++) {
      const t0 = process.hrtime.bigint();
      const e = await tok.encode(text, null, { addSpecialTokens: true });
      const dt = Number(process.hrtime.bigint() - t0) / 1e9;
      n = e.getIds().length;
      speeds.push(bytes / 1e6 / dt);
    }
    speeds.sort((a, b) => a - b);
    const m = rounds % 2 ? speeds[(rounds - 1) / 2] : (speeds[rounds / 2 - 1] + speeds[rounds / 2]) / 2;
    console.log(`| ${name} | ${bytes} | ${n} | ${m.toFixed(2)} |`);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
