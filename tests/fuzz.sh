#!/bin/sh
# SPDX-License-Identifier: MIT
# Runs every fuzz target of tests/fuzz/ briefly on its seed corpus: always through the replay
# driver built by make (seeds plus deterministic mutations), and, when clang with libFuzzer is
# installed, as a coverage-guided libFuzzer run of FUZZ_SECONDS (default 10) per target.
# Environment from make check: DPSHARD_SRCDIR, DPSHARD_BUILDDIR, CC.
set -u
src=${DPSHARD_SRCDIR:?}
build=${DPSHARD_BUILDDIR:?}
secs=${FUZZ_SECONDS:-10}
fail=0
work=$(mktemp -d "${TMPDIR:-/tmp}/dps-fuzz.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT

# The libFuzzer builds share every source but their own: those are compiled once, with the
# sanitizers, and each target links them with its own file.
fuzzer=
if command -v clang >/dev/null 2>&1 &&
   echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' |
   clang -x c -fsanitize=fuzzer -o "$work/probe" - >/dev/null 2>&1; then
	fuzzer=1
	cflags="-g -O1 -fsanitize=fuzzer,address,undefined -include $build/config.h -I$src -I$build"
	cflags="$cflags $(pkg-config --cflags jansson liburing libpcre2-8 libutf8proc)"
	libs="$(pkg-config --libs jansson liburing libpcre2-8 libutf8proc) -lhttp_parser -lm"
	srcs="$src/engine/model/safetensors.c $src/engine/model/model_config.c"
	srcs="$srcs $src/engine/model/model_arch.c $src/engine/model/model_config_save.c"
	srcs="$srcs $src/engine/model/convert.c $src/engine/model/ckpt.c"
	srcs="$srcs $(ls "$src"/engine/model/tok*.c) $src/common/utf8.c"
	srcs="$srcs $src/engine/api/request.c $src/engine/api/request_fields.c"
	srcs="$srcs $src/engine/api/http_parse.c $src/common/json.c"
	srcs="$srcs $src/common/err.c $src/common/log.c $src/common/util.c $src/common/conf.c $src/common/f16.c"
	srcs="$srcs $src/engine/model/chat.c $(ls "$src"/engine/model/jinja_*.c)"
	mkdir "$work/obj"
	objs=
	for f in $srcs; do
		o=$work/obj/$(basename "$f" .c).o
		# shellcheck disable=SC2086
		if ! clang $cflags -c "$f" -o "$o" 2>>"$work/cc.log"; then
			cat "$work/cc.log"
			echo "FAIL: cannot compile $f for the libFuzzer targets"
			exit 1
		fi
		objs="$objs $o"
	done
fi

for target in safetensors config tokenizer llama2c conf request http jinja tok_hf; do
	corpus=$src/tests/fuzz/corpus/$target
	if ! "$build/tests/fuzz_${target}_replay" -n 50000 "$corpus"/*; then
		echo "FAIL: replay of $target"
		fail=1
	fi
	if [ -n "$fuzzer" ]; then
		# shellcheck disable=SC2086
		if ! clang $cflags "$src/tests/fuzz/fuzz_$target.c" $objs $libs \
			-o "$work/fuzz_$target" 2>"$work/cc.log"; then
			cat "$work/cc.log"
			echo "FAIL: cannot build the libFuzzer target $target"
			fail=1
			continue
		fi
		mkdir -p "$work/corpus_$target"
		cp "$corpus"/* "$work/corpus_$target/"
		if ! "$work/fuzz_$target" -max_total_time="$secs" -max_len=65536 \
			-artifact_prefix="$work/" "$work/corpus_$target" >"$work/run.log" 2>&1; then
			tail -n 40 "$work/run.log"
			cp "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$build/" 2>/dev/null
			echo "FAIL: libFuzzer found a crash in $target (reproducer copied to $build)"
			fail=1
		else
			tail -n 1 "$work/run.log"
		fi
	else
		echo "libFuzzer not available: replay driver only for $target"
		nofuzzer=1
	fi
done
if [ "$fail" -eq 0 ] && [ -n "${nofuzzer:-}" ]; then
	# The replays passed, but the coverage-guided runs, the point of this suite, did not run.
	echo "SKIP: the libFuzzer runs need clang and its runtime (Debian: clang libclang-rt-14-dev)"
	exit 77
fi
exit $fail
