// SPDX-License-Identifier: MIT
// tests/tok_oracle.js - Hugging Face's own view of a corpus, for tests/tok_oracle.sh: with the
// npm package `tokenizers` (the official binding of the Rust library), loads tokenizer.json and
// prints, for each line of a JSON-lines corpus (each line a JSON string), the same JSON line as
// tests/tok_dump.c: the ids without and with special tokens, and the decoding of the latter with
// and without skipping special tokens.
//   node tok_oracle.js MODULE_DIR TOKENIZER_JSON CORPUS_JSONL
// With --compare it reads two such outputs and the corpus instead, prints the first mismatches
// with their text, and exits 1 when there is any:
//   node tok_oracle.js --compare CORPUS_JSONL EXPECTED ACTUAL [MAX_SHOWN]
// With --cases it replays the cases tests/check_tok_hf.c exported (DPS_TOK_HF_EXPORT): each
// line a small tokenizer.json with a text and the ids expected, or ids and the text expected:
//   node tok_oracle.js --cases MODULE_DIR CASES_JSONL
'use strict';
const fs = require('fs');
const path = require('path');

function lines(file) {
  return fs.readFileSync(file, 'utf8').split('\n').filter((l) => l.length > 0);
}

async function dump(moduleDir, tokenizerJson, corpus) {
  const { Tokenizer } = require(path.join(moduleDir, 'tokenizers'));
  const tok = Tokenizer.fromFile(tokenizerJson);
  const out = [];
  for (const line of lines(corpus)) {
    const text = JSON.parse(line);
    const plain = (await tok.encode(text, null, { addSpecialTokens: false })).getIds();
    const special = (await tok.encode(text, null, { addSpecialTokens: true })).getIds();
    const decode = await tok.decode(special, false);
    const decodeSkip = await tok.decode(special, true);
    // The oracle of the streaming decoder: the library's whole decode, and after a prompt of
    // the first half of the ids, what the whole decode adds to that half's (null when the
    // half ends inside a character, as ours says).
    const half = await tok.decode(special.slice(0, Math.floor(special.length / 2)), true);
    const after = half.includes('\ufffd') ? null
      : (decodeSkip.startsWith(half) ? decodeSkip.slice(half.length) : '<not a prefix>');
    out.push(JSON.stringify({ ids: plain, ids_special: special, decode, decode_skip: decodeSkip,
      stream: decodeSkip, stream_after: after }));
  }
  process.stdout.write(out.join('\n') + (out.length ? '\n' : ''));
}

function compare(corpus, expectedFile, actualFile, maxShown) {
  const texts = lines(corpus).map((l) => JSON.parse(l));
  const want = lines(expectedFile);
  const got = lines(actualFile);
  let bad = 0;
  if (want.length !== texts.length || got.length !== texts.length) {
    console.log(`line counts differ: corpus ${texts.length}, expected ${want.length}, actual ${got.length}`);
    bad++;
  }
  const n = Math.min(texts.length, want.length, got.length);
  for (let i = 0; i < n; i++) {
    const w = JSON.parse(want[i]);
    const g = JSON.parse(got[i]);
    for (const field of ['ids', 'ids_special', 'decode', 'decode_skip', 'stream', 'stream_after']) {
      const ws = JSON.stringify(w[field]);
      const gs = JSON.stringify(g[field]);
      if (ws === gs) continue;
      bad++;
      if (bad <= maxShown) {
        const text = JSON.stringify(texts[i]);
        console.log(`line ${i + 1} ${field} differs; text ${text.length > 200 ? text.slice(0, 200) + '...' : text}`);
        let k = 0;
        if (Array.isArray(w[field]) && Array.isArray(g[field])) {
          while (k < w[field].length && w[field][k] === g[field][k]) k++;
          console.log(`  first difference at index ${k}: expected ${JSON.stringify(w[field].slice(k, k + 8))}, got ${JSON.stringify(g[field].slice(k, k + 8))}`);
        } else {
          while (k < ws.length && ws[k] === gs[k]) k++;
          console.log(`  expected ...${ws.slice(Math.max(0, k - 20), k + 60)}`);
          console.log(`  got      ...${gs.slice(Math.max(0, k - 20), k + 60)}`);
        }
      }
    }
  }
  console.log(`${n} lines compared, ${bad} mismatches`);
  return bad ? 1 : 0;
}

async function cases(moduleDir, file) {
  const { Tokenizer } = require(path.join(moduleDir, 'tokenizers'));
  let bad = 0, n = 0;
  for (const line of lines(file)) {
    const c = JSON.parse(line);
    const tok = Tokenizer.fromString(c.json);
    let want, got, what;
    if ('text' in c && 'ids' in c) {
      want = c.ids;
      got = (await tok.encode(c.text, null, { addSpecialTokens: c.special })).getIds().join(' ');
      what = `encode ${JSON.stringify(c.text)}${c.special ? ' with special tokens' : ''}`;
    } else {
      const ids = c.decode === '' ? [] : c.decode.split(' ').map(Number);
      want = c.text;
      got = await tok.decode(ids, c.skip);
      what = `decode [${c.decode}]${c.skip ? ' skipping special tokens' : ''}`;
    }
    n++;
    if (want !== got) {
      bad++;
      console.log(`${what}: the library gives ${JSON.stringify(got)}, check_tok_hf expects ${JSON.stringify(want)}\n  ${c.json}`);
    }
  }
  console.log(`${n} cases of check_tok_hf replayed, ${bad} differ from the library`);
  return bad || !n ? 1 : 0;
}

const args = process.argv.slice(2);
if (args[0] === '--cases') {
  cases(args[1], args[2]).then((rc) => process.exit(rc), (e) => {
    console.error(`tok_oracle.js: ${e.message}`);
    process.exit(1);
  });
} else if (args[0] === '--compare') {
  process.exit(compare(args[1], args[2], args[3], Number(args[4] || 10)));
} else if (args.length === 3) {
  dump(args[0], args[1], args[2]).catch((e) => {
    console.error(`tok_oracle.js: ${e.message}`);
    process.exit(1);
  });
} else {
  console.error('usage: tok_oracle.js MODULE_DIR TOKENIZER_JSON CORPUS_JSONL | --compare CORPUS EXPECTED ACTUAL [N]');
  process.exit(2);
}
