/* SPDX-License-Identifier: MIT */
/*
 * engine/model/gguf.h - exports a dense Llama model directory as a GGUF file (version 3, F32
 * tensors, llama.cpp's "llama" architecture), so that llama.cpp can run the very weights dpshard
 * runs: `dpshard convert gguf DIR OUT.gguf`, then llama.cpp's own tools (llama-quantize for BF16 or
 * Q8_0, llama-bench, llama-cli).
 *
 * The tensors get llama.cpp's names (token_embd, blk.N.attn_q, ..., output_norm, output) and
 * the rows of q_proj and k_proj are permuted back from Hugging Face's half-split rotary layout
 * to the adjacent pairs llama.cpp's LLAMA_ROPE_TYPE_NORM rotates (what llama.cpp's own
 * converter does). A llama2.c tokenizer.bin beside the model becomes a SentencePiece-style
 * vocabulary ("llama": "▁" for a space, <0xNN> byte pieces, scores, BOS/EOS/UNK); without one
 * the file says "no_vocab" and carries only the vocabulary size.
 *
 * What the format written here cannot say is refused by name: mixture-of-experts models and
 * Eagle3 drafts. Called by `dpshard convert gguf`; tests/gguf_check.py (run by tests/cli.sh)
 * reads the file back.
 */
#ifndef DPS_ENGINE_GGUF_H
#define DPS_ENGINE_GGUF_H

#include <stddef.h>

/*
 * Writes the model in dir (config.json, *.safetensors, optionally tokenizer.bin) to path.
 * Returns 0, or a negative code with a message naming the file, tensor or field in err; a
 * partly written file is removed.
 */
int dps_gguf_export(const char *dir, const char *path, char *err, size_t errlen);

#endif
