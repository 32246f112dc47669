#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Writes the seed corpus of tests/fuzz/fuzz_llama2c.c into tests/fuzz/corpus/llama2c/: small
# llama2.c checkpoints made up here (28-byte header of seven little-endian int32: dim,
# hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size (negative: untied), seq_len; then
# float32 weights), valid ones and ones that break each rule. Run from the checkout's root;
# the files are committed, so make check does not need python.
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "llama2c")


def n_floats(dim, hidden, layers, heads, kv, vocab, seq):
    hd = dim // heads
    v = abs(vocab)
    n = v * dim + layers * (2 * dim + 2 * dim * dim + 2 * kv * hd * dim + 3 * hidden * dim)
    n += dim + seq * hd
    return n + (v * dim if vocab < 0 else 0)


def checkpoint(dim, hidden, layers, heads, kv, vocab, seq, floats=None):
    hdr = struct.pack("<7i", dim, hidden, layers, heads, kv, vocab, seq)
    if floats is None:
        floats = n_floats(dim, hidden, layers, heads, kv, vocab, seq)
    # distinct values, so that the rotary permutation visibly moves them
    return hdr + b"".join(struct.pack("<f", i * 0.125 - 1.0) for i in range(floats))


def write(name, data):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)


os.makedirs(OUT, exist_ok=True)
# valid: tied, untied, grouped-query attention with two layers
write("tiny_tied.bin", checkpoint(4, 3, 1, 2, 1, 5, 2))
write("tiny_untied.bin", checkpoint(4, 2, 1, 1, 1, -3, 1))
write("gqa.bin", checkpoint(8, 4, 2, 4, 2, 6, 3))
# truncated: a header only, a header cut short, weights cut short, one float too many
write("header_only.bin", checkpoint(4, 3, 1, 2, 1, 5, 2, floats=0))
write("short_header.bin", checkpoint(4, 3, 1, 2, 1, 5, 2)[:20])
write("truncated.bin", checkpoint(4, 3, 1, 2, 1, 5, 2)[:-6])
write("one_more.bin", checkpoint(4, 3, 1, 2, 1, 5, 2) + struct.pack("<f", 0.5))
# negative and zero fields
write("negative_dim.bin", checkpoint(-4, 3, 1, 2, 1, 5, 2, floats=8))
write("negative_heads.bin", checkpoint(4, 3, 1, -2, -1, 5, 2, floats=8))
write("zero_layers.bin", checkpoint(4, 3, 0, 2, 1, 5, 2, floats=8))
write("vocab_int_min.bin", checkpoint(4, 3, 1, 2, 1, -(2 ** 31), 2, floats=8))
# too small a vocabulary for <unk>, BOS and EOS, with the size it implies
write("vocab_two.bin", checkpoint(4, 3, 1, 2, 1, 2, 2))
# shapes that break a rule: heads not dividing dim, KV heads not dividing heads, odd head size
write("heads_not_divisor.bin", checkpoint(6, 3, 1, 4, 1, 5, 2, floats=8))
write("kv_not_divisor.bin", checkpoint(8, 3, 1, 4, 3, 5, 2, floats=8))
write("odd_head.bin", checkpoint(6, 3, 1, 2, 1, 5, 2, floats=8))
# huge fields: at the limits (a file of petabytes implied) and beyond them
write("huge_limits.bin", checkpoint(65536, 262144, 1024, 1, 1, 2 ** 24, 2 ** 24, floats=4))
write("huge_beyond.bin", checkpoint(2 ** 31 - 1, 2 ** 31 - 1, 2 ** 31 - 1, 1, 1, 2 ** 31 - 1,
                                    2 ** 31 - 1, floats=4))
