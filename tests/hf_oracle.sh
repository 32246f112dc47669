#!/bin/sh
# SPDX-License-Identifier: MIT
# tests/hf_oracle.sh - dpshard's logits against an independent numpy model of Hugging Face's
# forward pass (tests/hf_ref.py, written from transformers' modelling code, not from ours;
# driven by tests/hf_oracle.py) on small random checkpoints of five families, written with
# HF's tensor names and config.json fields: Llama (head_dim, GQA, BF16 in two files, tied
# embeddings, the llama3, yarn and linear RoPE, attention and MLP biases), Mistral (sliding
# window), Qwen2 (q/k/v biases, max_window_layers), Qwen3 (q/k norms) and GPT-OSS (sinks,
# alternating windows, yarn, experts in BF16 and in MXFP4). Each case's two 320-position
# sequences go through tests/hf_logits teacher-forced (a prefill of half, then one decode step
# per position) on one rank, the one-rank model (fast and plain-C kernels), TP=2, TP=2 x DP=2
# with every component of size 2 and, for GPT-OSS, expert parallelism on both dispatches:
# every logit of every position within 1e-3 of the reference, the argmax the same wherever the
# reference's top two are further apart. `dpshard generate` (one rank, TP=2) must continue a
# prompt as the reference's greedy continuation does. Each case also shows that each of its
# features moves the reference's logits, and deliberate faults (a reference without a
# feature, one bit of a TP rank's logits flipped) must be caught.
#
# Arguments (and those of $DPSHARD_HF_ORACLE_ARGS, for make check) go to hf_oracle.py: --case
# NAME (repeatable, or a comma list), --layout NAME, --keep DIR (keep the checkpoints, logits
# and logs), --no-e2e; `hf_ref.py list` names the cases, `hf_oracle.py --list` the layouts.
# One case by hand: DPSHARD_SRCDIR=. DPSHARD_BUILDDIR=build tests/hf_oracle.sh --case yarn
# Without /usr/bin/python3 with numpy it exits 77 saying why, unless DPSHARD_REQUIRE_ORACLES=1
# (CI), where that is a failure. Environment from make check: DPSHARD_SRCDIR, DPSHARD_BUILDDIR.
set -u
src=${DPSHARD_SRCDIR:?}
build=${DPSHARD_BUILDDIR:?}
py=/usr/bin/python3

unavailable() {
	if [ "${DPSHARD_REQUIRE_ORACLES:-0}" = 1 ]; then
		echo "FAIL: $1 (DPSHARD_REQUIRE_ORACLES=1: the oracle comparison may not be skipped)"
		exit 1
	fi
	echo "SKIP: $1"
	exit 77
}

[ -x "$py" ] || unavailable "no $py for the numpy reference"
"$py" -c 'import numpy' 2>/dev/null ||
	unavailable "$py has no numpy (Debian: apt-get install python3-numpy)"
[ -x "$build/tests/hf_logits" ] || { echo "FAIL: $build/tests/hf_logits is not built"; exit 1; }
# shellcheck disable=SC2086
exec "$py" "$src/tests/hf_oracle.py" --build "$build" ${DPSHARD_HF_ORACLE_ARGS:-} "$@"
