#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tests/gguf_check.py GGUF MODEL_DIR - checks `dpshard convert gguf` against the model it came
from, with a GGUF reader written here from the format's specification (not dpshard's writer):
magic and version, the llama keys against config.json, 32-byte alignment, every tensor's
shape, and every element against the safetensors data (q and k rows in llama.cpp's
adjacent-pair order, the inverse of Hugging Face's half split); the vocabulary against
tokenizer.bin when there is one. `--corrupt` flips one element of the read data first, to show
that the comparison fails then. Exit 0 when all agree, 3 with the first difference (any other
status is a failure of the check itself)."""
import array
import json
import os
import struct
import sys


class Reader:
    def __init__(self, data):
        self.d, self.p = data, 0

    def take(self, fmt):
        v = struct.unpack_from("<" + fmt, self.d, self.p)
        self.p += struct.calcsize("<" + fmt)
        return v[0]

    def string(self):
        n = self.take("Q")
        s = self.d[self.p:self.p + n]
        self.p += n
        return s.decode("utf-8")

    def value(self, t):
        scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q",
                  11: "q", 12: "d"}
        if t in scalar:
            return self.take(scalar[t])
        if t == 8:
            return self.string()
        if t == 9:
            et, n = self.take("i"), self.take("Q")
            return [self.value(et) for _ in range(n)]
        raise ValueError("unknown GGUF value type %d" % t)


def read_gguf(path):
    data = open(path, "rb").read()
    r = Reader(data)
    assert data[:4] == b"GGUF", "bad magic"
    r.p = 4
    version, n_t, n_kv = r.take("I"), r.take("q"), r.take("q")
    assert version == 3, "version %d" % version
    kv = {}
    for _ in range(n_kv):
        k = r.string()
        kv[k] = r.value(r.take("i"))
    infos = []
    for _ in range(n_t):
        name = r.string()
        nd = r.take("I")
        dims = [r.take("q") for _ in range(nd)]
        typ, off = r.take("i"), r.take("Q")
        infos.append((name, dims, typ, off))
    align = kv.get("general.alignment", 32)
    start = (r.p + align - 1) // align * align
    tensors = {}
    for name, dims, typ, off in infos:
        assert typ == 0, "%s: type %d, want F32" % (name, typ)
        assert off % align == 0, "%s: offset %d not aligned" % (name, off)
        n = 1
        for x in dims:
            n *= x
        a = array.array("f")
        a.frombytes(data[start + off:start + off + 4 * n])
        assert len(a) == n, "%s: truncated" % name
        tensors[name] = (dims, a)
    return kv, tensors


def read_safetensors(d):
    out = {}
    for f in sorted(os.listdir(d)):
        if not f.endswith(".safetensors"):
            continue
        data = open(os.path.join(d, f), "rb").read()
        (n,) = struct.unpack_from("<Q", data, 0)
        hdr = json.loads(data[8:8 + n])
        for name, t in hdr.items():
            if name == "__metadata__":
                continue
            assert t["dtype"] == "F32", "%s: the check reads F32 checkpoints only" % name
            b, e = t["data_offsets"]
            a = array.array("f")
            a.frombytes(data[8 + n + b:8 + n + e])
            out[name] = (t["shape"], a)
    return out


def read_tokenizer_bin(path, vocab):
    data = open(path, "rb").read()
    p, toks = 4, []
    for _ in range(vocab):
        score, n = struct.unpack_from("<fi", data, p)
        p += 8
        toks.append((data[p:p + n], score))
        p += n
    return toks


def main():
    corrupt = "--corrupt" in sys.argv
    args = [a for a in sys.argv[1:] if a != "--corrupt"]
    gguf, model = args
    cfg = json.load(open(os.path.join(model, "config.json")))
    kv, tensors = read_gguf(gguf)
    st = read_safetensors(model)
    hd = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    kvh = cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    want = {"general.architecture": "llama",
            "llama.embedding_length": cfg["hidden_size"],
            "llama.feed_forward_length": cfg["intermediate_size"],
            "llama.block_count": cfg["num_hidden_layers"],
            "llama.attention.head_count": cfg["num_attention_heads"],
            "llama.attention.head_count_kv": kvh,
            "llama.rope.dimension_count": hd,
            "llama.context_length": cfg["max_position_embeddings"],
            "llama.vocab_size": cfg["vocab_size"]}
    for k, v in want.items():
        if kv.get(k) != v:
            return "key %s: %r, want %r" % (k, kv.get(k), v)
    if abs(kv["llama.rope.freq_base"] - cfg.get("rope_theta", 10000.0)) > 1e-3:
        return "rope_theta differs"
    names = {"token_embd.weight": "model.embed_tokens.weight",
             "output_norm.weight": "model.norm.weight"}
    if not cfg.get("tie_word_embeddings", False):
        names["output.weight"] = "lm_head.weight"
    hf = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj",
          "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
          "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
          "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    for l in range(cfg["num_hidden_layers"]):
        for g, h in hf.items():
            names["blk.%d.%s.weight" % (l, g)] = "model.layers.%d.%s.weight" % (l, h)
    if set(names) != set(tensors):
        return "tensors: %s" % sorted(set(names) ^ set(tensors))
    for g, h in sorted(names.items()):
        dims, a = tensors[g]
        shape, b = st[h]
        if dims != list(reversed(shape)):
            return "%s: dims %s, the checkpoint's shape %s" % (g, dims, shape)
        if corrupt and g == "blk.0.attn_q.weight":
            a[5] += 1.0
        heads = {"attn_q": cfg["num_attention_heads"], "attn_k": kvh}.get(g.split(".")[2]) \
            if g.startswith("blk.") else None
        cols = shape[1] if len(shape) == 2 else 1
        for row in range(shape[0]):
            src = row
            if heads:
                # llama.cpp's row h*hd + 2i + c is Hugging Face's row h*hd + c*hd/2 + i.
                h_, r = divmod(row, hd)
                i, c = divmod(r, 2)
                src = h_ * hd + c * (hd // 2) + i
            if a[row * cols:(row + 1) * cols] != b[src * cols:(src + 1) * cols]:
                return "%s: row %d differs from %s row %d" % (g, row, h, src)
    tb = os.path.join(model, "tokenizer.bin")
    if os.path.exists(tb):
        if kv.get("tokenizer.ggml.model") != "llama":
            return "tokenizer.ggml.model %r" % kv.get("tokenizer.ggml.model")
        toks = read_tokenizer_bin(tb, cfg["vocab_size"])
        bos, eos = cfg.get("bos_token_id", 1), cfg.get("eos_token_id", 2)
        for i, (piece, score) in enumerate(toks):
            text = {bos: "<s>", eos: "</s>"}.get(i, piece.decode("utf-8", "replace")
                                                   .replace(" ", "\u2581"))
            if kv["tokenizer.ggml.tokens"][i] != text:
                return "token %d: %r, want %r" % (i, kv["tokenizer.ggml.tokens"][i], text)
            if kv["tokenizer.ggml.scores"][i] != struct.unpack("<f", struct.pack("<f", score))[0]:
                return "token %d: score differs" % i
        types = kv["tokenizer.ggml.token_type"]
        if types[bos] != 3 or types[eos] != 3 or types[3] != 6 or types[258] != 6:
            return "token types %s" % types[:4]
    elif kv.get("tokenizer.ggml.model") != "no_vocab":
        return "no tokenizer.bin, but tokenizer.ggml.model is %r" % kv.get("tokenizer.ggml.model")
    return None


if __name__ == "__main__":
    why = main()
    if why:
        print("gguf_check: " + why)
        sys.exit(3)
    print("gguf_check: the GGUF file matches the model")
