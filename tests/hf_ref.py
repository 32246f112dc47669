#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tests/hf_ref.py - an independent oracle of Hugging Face's forward pass (python3 + numpy only).

Written from the modelling code of Hugging Face transformers (LlamaForCausalLM,
MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, GptOssForCausalLM, the RoPE
variants of modeling_rope_utils and the MXFP4 decoding of integrations/mxfp4), never from
dpshard's C code. It

- writes small random checkpoints with HF's tensor names and config.json fields (safetensors
  F32, BF16 rounded to nearest even from f32, U8; one file, or two with
  model.safetensors.index.json), one per case of CASES, with sequences of token ids;
- reads a checkpoint back from its files as HF would read it (the config class's defaults,
  its sliding layers, its RoPE) and computes the teacher-forced logits of a whole sequence at
  once in float64 (causal mask, HF's sliding mask kv > q - window, GQA, RMSNorm, rotate_half
  RoPE, sinks, experts);
- checks that every feature of a case matters: each case lists variants (the feature removed
  or misread: a bias dropped, the window ignored, the RoPE scaling left out, ...) whose logits
  must differ from the case's by far more than the tolerance;
- compares an engine's logits with its own (TOL at every position, the argmax where the top
  two are further apart), for tests/hf_oracle.py, which drives dpshard on every layout.

Usage:
  hf_ref.py list                              the cases and their features
  hf_ref.py make CASE OUTDIR                  OUTDIR/model (the checkpoint), OUTDIR/ids.txt,
                                              OUTDIR/case.json (what it is)
  hf_ref.py logits MODEL_DIR IDSFILE OUT.npy  reference logits (lines, N, vocab) float64
  hf_ref.py compare MODEL_DIR IDSFILE ENGINE.bin   an engine's float32 logits against them
  hf_ref.py selftest                          the writer, BF16, MXFP4 and yarn on worked values
Exit status: 0 pass, 1 fail, 2 usage."""
import json
import math
import os
import struct
import sys
import tempfile

import numpy as np

TOL = 1e-3          # logits, absolute
MATTERS = 1e-2      # a variant must move some logit by more than this
N_POS = 320         # positions per sequence: windows and the scaled RoPE bands are crossed
N_LINES = 2         # sequences: one per replica of the DP=2 layouts
MIN_ROUTER_GAP = 1e-3  # k-th minus (k+1)-th router logit, everywhere: no near-tie in top-k

# ---- safetensors -----------------------------------------------------------------------------

def bf16_bits(a):
    """uint16 bfloat16 bits of a, rounded to nearest even from float32."""
    u = np.ascontiguousarray(a, dtype="<f4").view("<u4").astype(np.uint64)
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = np.isnan(np.asarray(a, dtype=np.float32))
    r = np.where(nan, (u >> 16) | 0x40, r)
    return r.astype("<u2")


def encode(a, dtype):
    if dtype == "F32":
        return np.ascontiguousarray(a, dtype="<f4").tobytes()
    if dtype == "BF16":
        return bf16_bits(a).tobytes()
    if dtype == "U8":
        return np.ascontiguousarray(a, dtype=np.uint8).tobytes()
    raise ValueError("dtype " + dtype)


def st_write(path, tensors):
    """tensors: list of (name, dtype, numpy array). Writes one safetensors file."""
    header, blobs, off = {}, [], 0
    for name, dtype, a in tensors:
        b = encode(a, dtype)
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    return off


def st_save(dirname, tensors, files):
    """tensors in one file (files 1) or split in two with model.safetensors.index.json."""
    if files == 1:
        st_write(os.path.join(dirname, "model.safetensors"), tensors)
        return
    half = (len(tensors) + 1) // 2
    parts = [tensors[:half], tensors[half:]]
    weight_map, total = {}, 0
    for i, part in enumerate(parts):
        fname = "model-%05d-of-%05d.safetensors" % (i + 1, len(parts))
        total += st_write(os.path.join(dirname, fname), part)
        weight_map.update({name: fname for name, _, _ in part})
    with open(os.path.join(dirname, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def st_read(path):
    """{name: numpy array}: floats as float64, U8 as uint8."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    body, out = data[8 + n:], {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        lo, hi = t["data_offsets"]
        raw, shape = body[lo:hi], tuple(t["shape"])
        if t["dtype"] == "F32":
            a = np.frombuffer(raw, "<f4").astype(np.float64)
        elif t["dtype"] == "F16":
            a = np.frombuffer(raw, "<f2").astype(np.float64)
        elif t["dtype"] == "BF16":
            a = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
            a = a.astype(np.float64)
        elif t["dtype"] == "U8":
            a = np.frombuffer(raw, np.uint8).copy()
        else:
            raise ValueError("%s: dtype %s" % (name, t["dtype"]))
        out[name] = a.reshape(shape)
    return out


def load_tensors(dirname):
    index = os.path.join(dirname, "model.safetensors.index.json")
    files = ["model.safetensors"]
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    w = {}
    for fname in files:
        w.update(st_read(os.path.join(dirname, fname)))
    return w

# ---- MXFP4 (integrations/mxfp4.py, convert_moe_packed_tensors) --------------------------------

FP4 = np.array([+0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def mxfp4_decode(blocks, scales):
    """blocks (E, R, G, 16) U8, scales (E, R, G) U8 -> (E, G * 32, R): the low nibble is the
    even element, times 2^(scale - 127), then HF's transpose of the last two axes."""
    E, R, G, B = blocks.shape
    assert scales.shape == (E, R, G)
    out = np.empty((E, R, G, 2 * B))
    out[..., 0::2] = FP4[blocks & 0x0F]
    out[..., 1::2] = FP4[blocks >> 4]
    out = np.ldexp(out, (scales.astype(np.int64) - 127)[..., None])
    return out.reshape(E, R, G * 2 * B).transpose(0, 2, 1).copy()

# ---- config.json as the config classes read it ------------------------------------------------

FAMILY_OF = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
             "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
             "GptOssForCausalLM": "gpt_oss"}
# The defaults of each config class for the fields the forward pass reads.
DEFAULTS = {
    "llama": {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 2048,
              "attention_bias": False, "mlp_bias": False, "head_dim": None},
    "mistral": {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 131072,
                "sliding_window": 4096, "head_dim": None},
    "qwen2": {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 32768,
              "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28},
    "qwen3": {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 32768,
              "attention_bias": False, "head_dim": 128, "use_sliding_window": False,
              "sliding_window": 4096, "max_window_layers": 28},
    "gpt_oss": {"rms_norm_eps": 1e-5, "rope_theta": 150000.0, "max_position_embeddings": 131072,
                "attention_bias": True, "head_dim": 64, "sliding_window": 128,
                "num_experts_per_tok": 4, "swiglu_limit": 7.0, "swiglu_alpha": 1.702,
                "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                                 "beta_slow": 1.0, "truncate": False,
                                 "original_max_position_embeddings": 4096}},
}


def spec_of(cfg):
    """The forward pass's view of a config.json (dict) under its family's class."""
    fam = FAMILY_OF[cfg["architectures"][0]]
    c = dict(DEFAULTS[fam])
    c.update(cfg)
    H, nh, L = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    s = {"family": fam, "cfg": cfg, "H": H, "I": c["intermediate_size"], "L": L, "nh": nh,
         "nkv": c.get("num_key_value_heads") or nh, "V": c["vocab_size"],
         "eps": c["rms_norm_eps"], "tie": bool(c.get("tie_word_embeddings", False)),
         "max_pos": c["max_position_embeddings"]}
    s["hd"] = (c.get("head_dim") or H // nh) if fam != "qwen2" else H // nh
    s["qkv_bias"] = fam == "qwen2" or bool(c.get("attention_bias", False))
    s["o_bias"] = fam != "qwen2" and bool(c.get("attention_bias", False))
    s["mlp_bias"] = fam == "llama" and bool(c.get("mlp_bias", False))
    s["qk_norm"] = fam == "qwen3"
    s["sinks"] = fam == "gpt_oss"
    rope = dict(c.get("rope_parameters") or c.get("rope_scaling") or {})
    s["theta"] = rope.pop("rope_theta", c["rope_theta"])
    rope["rope_type"] = rope.get("rope_type", rope.get("type", "default"))
    s["rope"] = rope
    window, types = None, ["full_attention"] * L
    if fam == "mistral" and c.get("sliding_window") is not None:
        window, types = c["sliding_window"], ["sliding_attention"] * L
    elif fam in ("qwen2", "qwen3"):
        window = c["sliding_window"] if c.get("use_sliding_window") else None
        types = c.get("layer_types") or ["sliding_attention" if window is not None and
                                         i >= c["max_window_layers"] else "full_attention"
                                         for i in range(L)]
    elif fam == "gpt_oss":
        window = c.get("sliding_window")
        types = c.get("layer_types") or ["sliding_attention" if (i + 1) % 2 else
                                         "full_attention" for i in range(L)]
    s["window"] = window
    s["windowed"] = [t == "sliding_attention" and window is not None for t in types]
    if fam == "gpt_oss":
        s["E"], s["k"] = c["num_local_experts"], c["num_experts_per_tok"]
        s["limit"], s["alpha"] = c["swiglu_limit"], c["swiglu_alpha"]
        s["mxfp4"] = (c.get("quantization_config") or {}).get("quant_method") == "mxfp4"
    return s

# ---- RoPE (modeling_rope_utils) -----------------------------------------------------------------

def rope_inv_freq(s, seq_len):
    """inv_freq (hd / 2) and the attention factor cos and sin are multiplied by."""
    r, theta, dim = s["rope"], s["theta"], s["hd"]
    t = r["rope_type"]
    expo = np.arange(0, dim, 2, dtype=np.float64) / dim
    inv = 1.0 / theta ** expo
    if t == "default":
        return inv, 1.0
    if t == "linear":
        return inv / r["factor"], 1.0
    if t == "dynamic":
        f, mp = r["factor"], s["max_pos"]
        seq = seq_len if seq_len > mp else mp
        base = theta * ((f * seq / mp) - (f - 1)) ** (dim / (dim - 2))
        return 1.0 / base ** expo, 1.0
    if t == "llama3":
        f, lf, hf, old = (r["factor"], r["low_freq_factor"], r["high_freq_factor"],
                          r["original_max_position_embeddings"])
        low_wl, high_wl = old / lf, old / hf
        wl = 2 * math.pi / inv
        out = np.where(wl > low_wl, inv / f, inv)
        smooth = (old / wl - lf) / (hf - lf)
        smoothed = (1 - smooth) * out / f + smooth * out
        medium = ~(wl < high_wl) & ~(wl > low_wl)
        return np.where(medium, smoothed, out), 1.0
    if t == "yarn":
        f = r["factor"]
        orig = r.get("original_max_position_embeddings") or s["max_pos"]
        att, ms, msa = r.get("attention_factor"), r.get("mscale"), r.get("mscale_all_dim")

        def get_mscale(scale, m=1.0):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0
        if att is None:
            att = get_mscale(f, ms) / get_mscale(f, msa) if ms and msa else get_mscale(f)
        beta_fast, beta_slow = r.get("beta_fast") or 32, r.get("beta_slow") or 1

        def corr_dim(rot):
            return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(theta))
        low, high = corr_dim(beta_fast), corr_dim(beta_slow)
        if r.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        extra = 1 - ramp
        pos_freqs = theta ** expo
        return (1 / (f * pos_freqs)) * (1 - extra) + (1 / pos_freqs) * extra, att
    raise ValueError("rope_type " + t)


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)

# ---- the forward pass -------------------------------------------------------------------------

def rms_norm(x, w, eps):
    return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def linear(x, w, b=None):
    y = x @ w.T
    return y if b is None else y + b


def attention(s, W, l, h, cos, sin):
    """One layer's self-attention of h (N, H): o_proj of the heads' outputs."""
    N, nh, nkv, hd = h.shape[0], s["nh"], s["nkv"], s["hd"]
    p = "model.layers.%d.self_attn." % l
    b = (lambda n: W[p + n + ".bias"]) if s["qkv_bias"] else (lambda n: None)
    q = linear(h, W[p + "q_proj.weight"], b("q_proj")).reshape(N, nh, hd)
    k = linear(h, W[p + "k_proj.weight"], b("k_proj")).reshape(N, nkv, hd)
    v = linear(h, W[p + "v_proj.weight"], b("v_proj")).reshape(N, nkv, hd)
    if s["qk_norm"]:
        q = rms_norm(q, W[p + "q_norm.weight"], s["eps"])
        k = rms_norm(k, W[p + "k_norm.weight"], s["eps"])
    q, k, v = q.transpose(1, 0, 2), k.transpose(1, 0, 2), v.transpose(1, 0, 2)
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    rep = nh // nkv
    k, v = np.repeat(k, rep, axis=0), np.repeat(v, rep, axis=0)
    scores = q @ k.transpose(0, 2, 1) * hd ** -0.5            # (nh, N, N)
    i, j = np.arange(N)[:, None], np.arange(N)[None, :]
    allowed = j <= i
    if s["windowed"][l]:
        allowed &= j > i - s["window"]
    scores = np.where(allowed, scores, -np.inf)
    if s["sinks"]:
        sink = np.broadcast_to(W[p + "sinks"][:, None, None], (nh, N, 1))
        scores = np.concatenate([scores, sink], axis=-1)
    scores = scores - scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    probs = probs[..., :N]                                    # the sink dropped
    out = (probs @ v).transpose(1, 0, 2).reshape(N, nh * hd)
    return linear(out, W[p + "o_proj.weight"], W[p + "o_proj.bias"] if s["o_bias"] else None)


def mlp(s, W, l, h):
    p = "model.layers.%d.mlp." % l
    b = (lambda n: W[p + n + ".bias"]) if s["mlp_bias"] else (lambda n: None)
    g = linear(h, W[p + "gate_proj.weight"], b("gate_proj"))
    u = linear(h, W[p + "up_proj.weight"], b("up_proj"))
    return linear(g / (1 + np.exp(-g)) * u, W[p + "down_proj.weight"], b("down_proj"))


def experts(s, W, l, h, stats):
    """GptOssMLP: router top-k, softmax over the chosen k, clamped SwiGLU experts."""
    p = "model.layers.%d.mlp." % l
    logits = linear(h, W[p + "router.weight"], W[p + "router.bias"])      # (N, E)
    order = np.argsort(-logits, axis=-1, kind="stable")
    top = order[:, :s["k"]]
    srt = np.take_along_axis(logits, order, axis=-1)
    stats["router_gap"] = min(stats.get("router_gap", np.inf),
                              float(np.min(srt[:, s["k"] - 1] - srt[:, s["k"]]))
                              if s["k"] < s["E"] else np.inf)
    chosen = np.take_along_axis(logits, top, axis=-1)
    wts = np.exp(chosen - chosen.max(axis=-1, keepdims=True))
    wts /= wts.sum(axis=-1, keepdims=True)
    gu, gub = W[p + "experts.gate_up_proj"], W[p + "experts.gate_up_proj_bias"]
    dn, dnb = W[p + "experts.down_proj"], W[p + "experts.down_proj_bias"]
    out = np.zeros_like(h)
    for e in range(s["E"]):
        rows, slot = np.nonzero(top == e)
        if not len(rows):
            continue
        x = h[rows] @ gu[e] + gub[e]                   # (n, 2I): gate, up interleaved
        gate, up = np.minimum(x[:, ::2], s["limit"]), np.clip(x[:, 1::2], -s["limit"], s["limit"])
        glu = gate / (1 + np.exp(-gate * s["alpha"]))
        y = ((up + 1) * glu) @ dn[e] + dnb[e]
        out[rows] += y * wts[rows, slot][:, None]
    return out


def forward(s, W, ids, stats=None):
    """Logits (N, vocab), float64, of the whole sequence ids at once (teacher forced)."""
    stats = {} if stats is None else stats
    ids = np.asarray(ids)
    N = len(ids)
    inv, att = rope_inv_freq(s, N)
    freqs = np.arange(N, dtype=np.float64)[:, None] * inv[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb) * att, np.sin(emb) * att
    x = W["model.embed_tokens.weight"][ids]
    for l in range(s["L"]):
        p = "model.layers.%d." % l
        x = x + attention(s, W, l, rms_norm(x, W[p + "input_layernorm.weight"], s["eps"]),
                          cos, sin)
        h = rms_norm(x, W[p + "post_attention_layernorm.weight"], s["eps"])
        x = x + (experts(s, W, l, h, stats) if s["family"] == "gpt_oss" else mlp(s, W, l, h))
    x = rms_norm(x, W["model.norm.weight"], s["eps"])
    head = W["model.embed_tokens.weight"] if s["tie"] else W["lm_head.weight"]
    return x @ head.T


def load(model_dir):
    """(spec, weights) of a checkpoint directory; MXFP4 experts decoded as HF decodes them."""
    with open(os.path.join(model_dir, "config.json")) as f:
        s = spec_of(json.load(f))
    W = load_tensors(model_dir)
    if s.get("mxfp4"):
        dequantize(W)
    return s, W


def dequantize(W):
    for name in [n for n in W if n.endswith("_blocks")]:
        base = name[:-len("_blocks")]
        W[base] = mxfp4_decode(W.pop(name), W.pop(base + "_scales"))

# ---- the cases ----------------------------------------------------------------------------------

COMMON = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
          "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 384,
          "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "hidden_act": "silu",
          "initializer_range": 0.02, "use_cache": True, "bos_token_id": 1, "eos_token_id": 2,
          "tie_word_embeddings": False, "attention_dropout": 0.0,
          "transformers_version": "4.56.1"}
FAMILY_CFG = {
    "llama": {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "rope_scaling": None, "attention_bias": False, "mlp_bias": False,
              "pretraining_tp": 1},
    "mistral": {"architectures": ["MistralForCausalLM"], "model_type": "mistral",
                "rope_theta": 10000.0, "head_dim": 16},
    "qwen2": {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
              "rope_theta": 1000000.0, "rope_scaling": None, "use_sliding_window": False,
              "sliding_window": 4096, "max_window_layers": 28},
    "qwen3": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
              "rope_theta": 1000000.0, "rope_scaling": None, "attention_bias": False,
              "use_sliding_window": False, "sliding_window": None, "max_window_layers": 28},
    "gpt_oss": {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
                "head_dim": 16, "intermediate_size": 64, "num_local_experts": 8,
                "num_experts_per_tok": 2, "sliding_window": 40, "rope_theta": 150000.0,
                "rope_scaling": {"rope_type": "yarn", "factor": 8.0, "beta_fast": 32.0,
                                 "beta_slow": 1.0, "truncate": False,
                                 "original_max_position_embeddings": 64},
                "attention_bias": True, "swiglu_limit": 7.0, "router_aux_loss_coef": 0.9,
                "output_router_logits": False},
}
GPT_OSS_LAYERS = ["sliding_attention", "full_attention", "sliding_attention"]
MXFP4_CFG = {"quant_method": "mxfp4", "modules_to_not_convert": [
    "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}

# The yarn cases keep max_position_embeddings = factor x original_max_position_embeddings, where
# transformers 4.5x (which took the factor from that ratio) and 5 (the factor as given) agree.
# name: family, what it covers, config.json fields over the family's, the tensors' dtype, how
# many files, the variants that must change the logits.
CASES = {
    "llama": ("llama", "rope_theta, head_dim 32 over hidden 64 / 4 heads, GQA 4 over 2",
              {"rope_theta": 50000.0, "head_dim": 32}, "F32", 1, ["rope_theta"]),
    "llama_bf16": ("llama", "BF16 tensors in two files with an index, tied embeddings",
                   {"rope_theta": 1000000.0, "tie_word_embeddings": True, "torch_dtype":
                    "bfloat16"}, "BF16", 2, ["rope_theta"]),
    "llama3": ("llama", "rope_scaling llama3 (factor 8, bands 1..4 of 64 positions), "
               "eos_token_id a list",
               {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 64},
                "eos_token_id": [2, 3]}, "F32", 1, ["rope_scaling"]),
    "yarn": ("llama", "rope_scaling yarn (factor 8 of 64 positions, beta 32/1, truncated)",
             {"rope_scaling": {"rope_type": "yarn", "factor": 8.0,
                               "original_max_position_embeddings": 64, "beta_fast": 32.0,
                               "beta_slow": 1.0}},
             "F32", 1, ["rope_scaling", "attention_factor", "truncate"]),
    "linear": ("llama", "rope_scaling linear (factor 4)",
               {"rope_scaling": {"rope_type": "linear", "factor": 4.0}}, "F32", 1,
               ["rope_scaling"]),
    "llama_bias": ("llama", "attention_bias (q/k/v/o) and mlp_bias (gate/up/down)",
                   {"attention_bias": True, "mlp_bias": True}, "F32", 1,
                   ["qkv_bias", "o_bias", "mlp_bias"]),
    "mistral": ("mistral", "sliding_window 32 on every layer", {"sliding_window": 32}, "F32", 1,
                ["window"]),
    "qwen2": ("qwen2", "q/k/v biases, no o bias; a sliding_window that use_sliding_window false "
              "turns off; tied embeddings",
              {"sliding_window": 16, "max_window_layers": 1, "tie_word_embeddings": True},
              "F32", 1, ["qkv_bias", "q_bias", "window_used"]),
    "qwen2_swa": ("qwen2", "use_sliding_window: window 48 on the layers from max_window_layers 1",
                  {"use_sliding_window": True, "sliding_window": 48, "max_window_layers": 1},
                  "F32", 1, ["qkv_bias", "window", "window_all_layers"]),
    "qwen3": ("qwen3", "q_norm/k_norm per head before RoPE, head_dim 32", {"head_dim": 32},
              "F32", 1, ["qk_norm"]),
    # 4 KV heads: TP=2 x attention size 2 projects K/V by effective rank (kv_by_eff) with
    # their biases and norms, the layout no other case reaches.
    "qwen3_kv4": ("qwen3", "q/k norms and attention_bias, 8 heads over 4 KV heads of 16",
                  {"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 16,
                   "attention_bias": True}, "F32", 1, ["qk_norm", "attn_bias"]),
    "gpt_oss": ("gpt_oss", "experts (BF16), sinks, layer_types, window 40, attention biases, "
                "yarn without truncation, clamped SwiGLU",
                {"layer_types": GPT_OSS_LAYERS, "torch_dtype": "bfloat16"}, "BF16", 1,
                ["sinks", "window", "window_odd_layers", "attn_bias", "rope_scaling",
                 "truncate", "swiglu_limit"]),
    "gpt_oss_mxfp4": ("gpt_oss", "the experts in MXFP4 (quantization_config), default "
                      "layer_types, two files",
                      {"quantization_config": MXFP4_CFG, "torch_dtype": "bfloat16"}, "BF16", 2,
                      ["mxfp4_scale", "sinks"]),
}


def case_config(name):
    fam, _, over, _, _, _ = CASES[name]
    cfg = dict(COMMON)
    cfg["torch_dtype"] = "float32"
    cfg.update(FAMILY_CFG[fam])
    cfg.update(over)
    return cfg


def case_seed(name):
    return sum((i + 1) * ord(ch) for i, ch in enumerate(name))


def make_tensors(s, rng, dtype):
    """HF's tensors of spec s, random, of useful magnitudes: logits O(1..10), attention
    neither flat nor one-hot, biases and norms far from 0 and 1."""
    H, I, V, nh, nkv, hd = s["H"], s["I"], s["V"], s["nh"], s["nkv"], s["hd"]
    T = []

    def add(name, a, dt=dtype):
        T.append((name, dt, a))

    def normal(*shape, scale=1.0):
        return rng.standard_normal(shape) * scale

    def lin(o, i, gain=1.0):
        return normal(o, i, scale=gain / math.sqrt(i))
    add("model.embed_tokens.weight", normal(V, H, scale=0.5 if s["tie"] else 1.0))
    for l in range(s["L"]):
        p = "model.layers.%d." % l
        add(p + "input_layernorm.weight", 1 + normal(H, scale=0.1))
        add(p + "post_attention_layernorm.weight", 1 + normal(H, scale=0.1))
        a = p + "self_attn."
        add(a + "q_proj.weight", lin(nh * hd, H, 1.5))
        add(a + "k_proj.weight", lin(nkv * hd, H, 1.5))
        add(a + "v_proj.weight", lin(nkv * hd, H))
        add(a + "o_proj.weight", lin(H, nh * hd))
        if s["qkv_bias"]:
            add(a + "q_proj.bias", normal(nh * hd, scale=0.5))
            add(a + "k_proj.bias", normal(nkv * hd, scale=0.5))
            add(a + "v_proj.bias", normal(nkv * hd, scale=0.5))
        if s["o_bias"]:
            add(a + "o_proj.bias", normal(H, scale=0.5))
        if s["qk_norm"]:
            add(a + "q_norm.weight", 1 + normal(hd, scale=0.3))
            add(a + "k_norm.weight", 1 + normal(hd, scale=0.3))
        if s["sinks"]:
            add(a + "sinks", rng.uniform(0.0, 4.0, nh))
        m = p + "mlp."
        if s["family"] != "gpt_oss":
            add(m + "gate_proj.weight", lin(I, H))
            add(m + "up_proj.weight", lin(I, H))
            add(m + "down_proj.weight", lin(H, I))
            if s["mlp_bias"]:
                add(m + "gate_proj.bias", normal(I, scale=0.5))
                add(m + "up_proj.bias", normal(I, scale=0.5))
                add(m + "down_proj.bias", normal(H, scale=0.5))
            continue
        E = s["E"]
        add(m + "router.weight", lin(E, H, 2.0))
        add(m + "router.bias", normal(E, scale=0.5))
        x = m + "experts."
        if s["mxfp4"]:
            # 2^(scale - 127) of 2^-5 .. 2^-3: FP4's values (rms 2.9) at about 1.5 / sqrt(64)
            add(x + "gate_up_proj_blocks", rng.integers(0, 256, (E, 2 * I, H // 32, 16)), "U8")
            add(x + "gate_up_proj_scales", rng.integers(122, 125, (E, 2 * I, H // 32)), "U8")
            add(x + "down_proj_blocks", rng.integers(0, 256, (E, H, I // 32, 16)), "U8")
            add(x + "down_proj_scales", rng.integers(122, 125, (E, H, I // 32)), "U8")
        else:
            add(x + "gate_up_proj", normal(E, H, 2 * I, scale=1.5 / math.sqrt(H)))
            add(x + "down_proj", normal(E, I, H, scale=1.0 / math.sqrt(I)))
        # The gates' biases spread wide enough that some gates pass swiglu_limit 7 (the only
        # limit Hugging Face's eager experts compute), so the clamp matters.
        gub = normal(E, 2 * I, scale=0.3)
        gub[:, 0::2] = normal(E, I, scale=5.0)
        add(x + "gate_up_proj_bias", gub)
        add(x + "down_proj_bias", normal(E, H, scale=0.3))
    add("model.norm.weight", 1 + normal(H, scale=0.1))
    if not s["tie"]:
        add("lm_head.weight", lin(V, H, 3.0))
    return T


def make(name, outdir):
    """OUTDIR/model (config.json, safetensors), OUTDIR/ids.txt, OUTDIR/case.json."""
    fam, doc, _, dtype, files, variants = CASES[name]
    model = os.path.join(outdir, "model")
    os.makedirs(model, exist_ok=True)
    cfg = case_config(name)
    rng = np.random.default_rng(case_seed(name))
    st_save(model, make_tensors(spec_of(cfg), rng, dtype), files)
    with open(os.path.join(model, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)  # as transformers writes it
    s, W = load(model)
    # Sequences whose routing has no near-tie (the engine's f32 must choose the same experts).
    for attempt in range(100):
        ids = np.random.default_rng(case_seed(name) * 1000 + attempt).integers(
            0, s["V"], (N_LINES, N_POS))
        stats = {}
        if fam == "gpt_oss":
            for line in ids:
                forward(s, W, line, stats)
        if stats.get("router_gap", np.inf) >= MIN_ROUTER_GAP:
            break
    else:
        raise RuntimeError("%s: no sequences without a near-tie of the router" % name)
    with open(os.path.join(outdir, "ids.txt"), "w") as f:
        for line in ids:
            f.write(" ".join(str(int(t)) for t in line) + "\n")
    with open(os.path.join(outdir, "case.json"), "w") as f:
        json.dump({"case": name, "family": fam, "doc": doc, "dtype": dtype, "files": files,
                   "variants": variants, "positions": N_POS, "lines": N_LINES,
                   "ids_attempt": attempt, "router_gap": stats.get("router_gap")}, f, indent=2)
    return model


def read_ids(path):
    with open(path) as f:
        return [np.array([int(t) for t in line.split()]) for line in f if line.strip()]

# ---- variants: a feature removed or misread ------------------------------------------------------

def zero(W, suffixes):
    for n in list(W):
        if any(n.endswith(x) for x in suffixes):
            W[n] = np.zeros_like(W[n])


def variant(name, model_dir):
    """(spec, weights) of the checkpoint with feature `name` removed or misread."""
    with open(os.path.join(model_dir, "config.json")) as f:
        s = spec_of(json.load(f))
    W = load_tensors(model_dir)
    cfg = s["cfg"]
    if name == "rope_theta":
        s["theta"] = 10000.0
    elif name == "rope_scaling":
        s["rope"] = {"rope_type": "default"}
    elif name == "attention_factor":
        s["rope"]["attention_factor"] = 1.0
    elif name == "truncate":
        s["rope"]["truncate"] = not s["rope"].get("truncate", True)
    elif name in ("qkv_bias", "q_bias", "o_bias", "mlp_bias", "attn_bias"):
        zero(W, {"qkv_bias": ["q_proj.bias", "k_proj.bias", "v_proj.bias"],
                 "q_bias": ["q_proj.bias"], "o_bias": ["o_proj.bias"],
                 "mlp_bias": ["gate_proj.bias", "up_proj.bias", "down_proj.bias"],
                 "attn_bias": ["q_proj.bias", "k_proj.bias", "v_proj.bias", "o_proj.bias"]}[name])
    elif name == "window":
        s["windowed"] = [False] * s["L"]
    elif name == "window_used":  # sliding_window honoured though use_sliding_window is false
        s["window"] = cfg["sliding_window"]
        s["windowed"] = [i >= cfg["max_window_layers"] for i in range(s["L"])]
    elif name == "window_all_layers":
        s["windowed"] = [True] * s["L"]
    elif name == "window_odd_layers":
        s["windowed"] = [not w for w in s["windowed"]]
    elif name == "qk_norm":
        s["qk_norm"] = False
    elif name == "sinks":
        s["sinks"] = False
    elif name == "swiglu_limit":
        s["limit"] = np.inf
    elif name == "mxfp4_scale":  # layer 0's gate_up, first block of every row: scale doubled
        W["model.layers.0.mlp.experts.gate_up_proj_scales"][..., 0] += 1
    else:
        raise ValueError("variant " + name)
    if s.get("mxfp4"):
        dequantize(W)
    return s, W

# ---- comparing logits with the reference -------------------------------------------------------

def compare(ref, eng):
    """Worst |difference| and where (replica, position), and the positions whose argmax
    differs where the reference's top two are more than TOL apart."""
    diff = np.abs(eng.astype(np.float64) - ref)
    diff = np.where(np.isnan(diff), np.inf, diff)
    worst = np.unravel_index(np.argmax(diff), diff.shape)
    top2 = np.sort(ref, axis=-1)[..., -2:]
    clear = top2[..., 1] - top2[..., 0] > TOL
    greedy = np.argwhere(clear & (np.argmax(ref, axis=-1) != np.argmax(eng, axis=-1)))
    return float(diff[worst]), (int(worst[0]), int(worst[1])), greedy


def passes(ref, eng):
    err, _, greedy = compare(ref, eng)
    return err <= TOL and not len(greedy)


def self_test():
    """The pieces the reference rests on, on values worked out by hand."""
    bits = bf16_bits(np.array([1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, -2.5, 1.0 + 2.0 ** -7 +
                               2.0 ** -9], dtype=np.float32))
    assert list(bits) == [0x3F80, 0x3F82, 0xC020, 0x3F81], [hex(b) for b in bits]
    blocks = np.zeros((1, 1, 1, 16), np.uint8)
    blocks[0, 0, 0, 0], blocks[0, 0, 0, 15] = 0x21, 0xF8
    dec = mxfp4_decode(blocks, np.array([[[128]]], np.uint8))
    assert dec.shape == (1, 32, 1) and list(dec[0, :2, 0]) == [1.0, 2.0]
    assert dec[0, 30, 0] == 0.0 and np.signbit(dec[0, 30, 0]) and dec[0, 31, 0] == -12.0
    with tempfile.TemporaryDirectory() as d:
        a = np.arange(6, dtype=np.float64).reshape(2, 3) / 7
        st_save(d, [("a", "F32", a), ("b", "BF16", a), ("c", "U8", np.arange(3))], 2)
        w = load_tensors(d)
        assert np.array_equal(w["a"], a.astype(np.float32)) and w["c"].dtype == np.uint8
        assert np.max(np.abs(w["b"] - a)) < 2 ** -8
    # yarn, truncated, dim 16, base 10000, 64 positions: correction range [0, 3]
    s = {"rope": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
         "theta": 10000.0, "hd": 16, "max_pos": 512}
    inv, att = rope_inv_freq(s, 320)
    base = 1 / 10000.0 ** (np.arange(0, 16, 2) / 16)
    ramp = np.clip(np.arange(8) / 3, 0, 1)
    assert np.allclose(inv, base * (1 - ramp) + base / 4 * ramp) and att == 0.1 * math.log(4) + 1


def main(argv):
    if len(argv) >= 1 and argv[0] == "list":
        for name, (fam, doc, _, dtype, files, variants) in CASES.items():
            print("%-14s %-8s %-5s %d file(s)  %s; variants: %s" %
                  (name, fam, dtype, files, doc, " ".join(variants)))
        return 0
    if len(argv) == 3 and argv[0] == "make":
        make(argv[1], argv[2])
        return 0
    if len(argv) == 4 and argv[0] in ("logits", "compare"):
        s, W = load(argv[1])
        ref = np.stack([forward(s, W, line) for line in read_ids(argv[2])])
        if argv[0] == "logits":
            np.save(argv[3], ref)
            return 0
        eng = np.fromfile(argv[3], "<f4")
        n = eng.size // (ref.shape[1] * ref.shape[2])
        err, (d, p), greedy = compare(ref[:n], eng.reshape(n, *ref.shape[1:]))
        print("max |diff| %.3g at line %d position %d; argmax differs at %d positions" %
              (err, d, p, len(greedy)))
        return 0 if err <= TOL and not len(greedy) else 1
    if argv == ["selftest"]:
        self_test()
        print("hf_ref.py: the safetensors, BF16, MXFP4 and yarn pieces are as worked out by hand")
        return 0
    print(__doc__.split("Usage:")[1].rstrip(), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
