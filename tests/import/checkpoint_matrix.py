#!/usr/bin/env python3
"""The converter's test matrix: small synthetic Hugging Face-style checkpoints of every family `tinyloop import`
reads, each with the per-token NLLs of an INDEPENDENT reference forward pass written here in numpy from transformers'
modeling code (modeling_llama.py / modeling_qwen2.py, modeling_rope_utils.py) and the GPTQ / AWQ packing conventions,
sharing nothing with the library; and the families it must refuse, with the status and message each must get.

    python3 checkpoint_matrix.py OUT_DIR

OUT_DIR/matrix.json lists everything:
  "bound": the largest |mean NLL (library) - mean NLL (reference)| a family may show, in nats (1e-3)
  "bound_stored_offsets": the same against "mean_nll_stored_offsets" (1e-5)
  "families": [{"name", "dir", "tokens": [ids], "nll": [reference NLL of token i + 1], "mean_nll",
                "mean_nll_stored_offsets", "expect": {"pre", "loops", "n_kv_heads", "head": "tied" | "dense"}}]
"mean_nll_stored_offsets" is the reference with each INT4 offset z' = -z * s rounded once to FP16, as the .tinyloop
format stores it (docs/format.md, "Importing GPTQ / AWQ weights"): the one rounding the conversion makes. Against the
checkpoint's own math (mean_nll) the INT4 families differ by up to a few 1e-4 nats because of it; against this one the
library must agree to FP32 arithmetic. Dense families have no such rounding (the two are equal).
  "refused": [{"name", "dir", "status": "TL_ERR_...", "message": [fragments the message must hold]}]
Each family's checkpoint is OUT_DIR/<dir>/ (config.json, model.safetensors, maybe quantize_config.json). CTest's
import.Matrix.* (matrix_test.cpp) imports each, scores it on the CPU backend and compares; gpu_score.import_matrix
(tests/gpu_score/import_matrix_test.cpp) does the same on the CUDA backend.

The reference, in float64: RMSNorm x / sqrt(mean(x^2) + eps) * w; q, k, v projections (+ bias); RoPE by transformers'
rotate_half with cos/sin of position * inv_freq (inv_freq from rope_theta and rope_scaling, cos and sin times yarn's
attention factor); K/V heads repeated per query head (repeat_kv); causal softmax(q k^T / sqrt(head_dim)) v; o_proj;
residual; SiLU(gate) * up -> down; residual; final RMSNorm; lm_head (or the embedding, tied); NLL = logsumexp - the
next token's logit. The layers run in checkpoint order (a looped config: the pre layers, then its looped layer
num_loops times). INT4 weights are unpacked here from the stored tensors (GPTQ v1: 8 rows per int32, zeros stored
minus one, g_idx; AWQ GEMM: AWQ_ORDER nibbles) and dequantized as (q - z) * s in float64.

Dimensions are tiny (hidden 64, 4 query heads of 16, intermediate 96, vocabulary 96, 3 or 4 layers, 48 tokens) so that
the whole matrix runs in seconds. numpy only (Debian's python3-numpy); fixed seeds, the same files on every run.
"""
import json
import math
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_int4_checkpoints as int4  # noqa: E402  (the safetensors writer)

SEED = 20261206
D, H, HD, F, V = 64, 4, 16, 96, 96
T = 48  # tokens scored, one window
MAX_POSITIONS = 128
GROUP = 32
BOUND = 1e-3  # nats, |mean NLL difference| allowed between the library's CPU backend and this reference
# The same with the INT4 offsets rounded as the .tinyloop format stores them: the conversion's only rounding gone, the
# library's CPU backend (FP32) must agree with the float64 reference this closely.
BOUND_STORED_OFFSETS = 1e-5
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ: nibble i of a word holds column 8c + AWQ_ORDER[i]


# ---- Encoding tensors ----------------------------------------------------------------------------------------------

def bf16_bits(x):
    """float32 -> BF16 bit patterns, rounded to nearest even."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_values(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def store(dtype, x):
    """(bytes to write, the float64 values they encode) of x as F16 / BF16 / F32."""
    if dtype == "F16":
        h = np.asarray(x, dtype=np.float16)
        return h, h.astype(np.float64)
    if dtype == "BF16":
        b = bf16_bits(x)
        return b, bf16_values(b).astype(np.float64)
    f = np.asarray(x, dtype=np.float32)
    return f, f.astype(np.float64)


# ---- INT4: quantizing, packing (as AutoGPTQ / AutoAWQ write), and unpacking for the reference ----------------------

def quantize(w, group, order):
    """w [N, K] (torch's Linear layout) -> codes q [K, N] in 0..15, zeros z [G, N] in 1..15, FP16 scales s [G, N] and
    g_idx [K], asymmetric min-max per group of K rows, the groups formed over `order` (a permutation of K: act-order
    as desc_act leaves it, g_idx then not k // group; else 0..K-1)."""
    n, k = w.shape
    g_idx = np.empty(k, dtype=np.int32)
    g_idx[order] = np.arange(k) // group
    groups = k // group
    wt = w.T  # [K, N]
    s = np.empty((groups, n), dtype=np.float16)
    z = np.empty((groups, n), dtype=np.int64)
    q = np.empty((k, n), dtype=np.int64)
    for g in range(groups):
        rows = np.nonzero(g_idx == g)[0]
        lo, hi = wt[rows].min(axis=0), wt[rows].max(axis=0)
        scale = np.maximum((hi - lo) / 14.0, 1e-4).astype(np.float16)  # codes 1..15 around a zero in 1..15
        s[g] = scale
        zero = np.clip(np.round(-lo / scale.astype(np.float64)) + 1, 1, 15)
        z[g] = zero
        q[rows] = np.clip(np.round(wt[rows] / scale.astype(np.float64)) + zero, 0, 15)
    return q, z, s, g_idx


def pack_words(nibbles):
    """[..., 8] values 0..15 -> int32 words, nibble i in bits 4i..4i+3."""
    words = np.zeros(nibbles.shape[:-1], dtype=np.uint32)
    for i in range(8):
        words |= nibbles[..., i].astype(np.uint32) << np.uint32(4 * i)
    return words.view(np.int32)


def int4_tensors(prefix, method, q, z, s, g_idx, with_g_idx):
    k, n = q.shape
    groups = z.shape[0]
    out = {f"{prefix}.scales": ("F16", s)}
    if method == "gptq":  # qweight [K/8, N]: 8 consecutive rows per word; qzeros [G, N/8]: zero - 1, columns in order
        out[f"{prefix}.qweight"] = ("I32", pack_words(q.reshape(k // 8, 8, n).transpose(0, 2, 1)))
        out[f"{prefix}.qzeros"] = ("I32", pack_words((z - 1).reshape(groups, n // 8, 8)))
        if with_g_idx:
            out[f"{prefix}.g_idx"] = ("I32", g_idx)
    else:  # AWQ GEMM: qweight [K, N/8], qzeros [G, N/8], nibble i = column 8c + AWQ_ORDER[i], the zero itself
        out[f"{prefix}.qweight"] = ("I32", pack_words(q.reshape(k, n // 8, 8)[:, :, AWQ_ORDER]))
        out[f"{prefix}.qzeros"] = ("I32", pack_words(z.reshape(groups, n // 8, 8)[:, :, AWQ_ORDER]))
    return out


def unpack_words(words):
    """int32 words [...] -> their 8 nibbles [..., 8], nibble i from bits 4i..4i+3."""
    u = words.view(np.uint32)
    return np.stack([(u >> np.uint32(4 * i)) & np.uint32(15) for i in range(8)], axis=-1).astype(np.int64)


def dequantize(tensors, prefix, method, k, group, stored_offsets=False):
    """The reference's own reading of an INT4 linear: W [N, K] = ((q - z) * s)^T in float64; with stored_offsets,
    q * s + fp16(-z * s), the offset rounded once to FP16 as a .tinyloop file stores it (docs/format.md)."""
    s = tensors[prefix + ".scales"][1].astype(np.float64)
    groups, n = s.shape
    if method == "gptq":
        q = unpack_words(tensors[prefix + ".qweight"][1]).transpose(0, 2, 1).reshape(k, n)
        z = unpack_words(tensors[prefix + ".qzeros"][1]).reshape(groups, n) + 1
        g_idx = tensors[prefix + ".g_idx"][1] if prefix + ".g_idx" in tensors else np.arange(k) // group
    else:
        inverse = [AWQ_ORDER.index(j) for j in range(8)]  # the nibble of column 8c + j
        q = unpack_words(tensors[prefix + ".qweight"][1])[:, :, inverse].reshape(k, n)
        z = unpack_words(tensors[prefix + ".qzeros"][1])[:, :, inverse].reshape(groups, n)
        g_idx = np.arange(k) // group
    if stored_offsets:
        offset = (-(z * s)).astype(np.float16).astype(np.float64)
        return (q * s[g_idx] + offset[g_idx]).T
    return ((q - z[g_idx]) * s[g_idx]).T


# ---- The checkpoints -----------------------------------------------------------------------------------------------

class Family:
    """One checkpoint: its config.json, its tensors, and the float64 values the reference computes with."""

    def __init__(self, name, layers=3, dtype="F16", tied=True, kv_heads=H, quant=None, act_order=False,
                 biases=(), looped=None, repeat_last=1, model_type="llama"):
        self.name = name
        self.rng = np.random.default_rng([SEED] + [ord(c) for c in name])
        self.orders = {}  # act-order: one K order per input, shared by the linears reading it (q, k, v; gate, up)
        self.dtype, self.tied, self.kv, self.quant, self.act_order = dtype, tied, kv_heads, quant, act_order
        self.biases = set(biases)  # of "q", "k", "v", "o", "gate", "up", "down"
        self.looped = looped  # (num_pre_layers, num_loops) for a looped config, else None (a plain config)
        self.tensors = {}  # name -> (dtype, stored array)
        self.values = {}  # name -> float64 values (dense weights, dequantized INT4 weights as [N, K], norms, biases)
        self.stored_offsets = {}  # INT4 weights as a .tinyloop file stores them (offsets rounded to FP16)
        self.config = {"architectures": ["LlamaForCausalLM"], "model_type": model_type, "hidden_size": D,
                       "num_attention_heads": H, "num_key_value_heads": kv_heads, "intermediate_size": F,
                       "vocab_size": V, "max_position_embeddings": MAX_POSITIONS, "rms_norm_eps": 1e-5,
                       "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": tied,
                       "torch_dtype": {"F16": "float16", "BF16": "bfloat16", "F32": "float32"}[dtype],
                       "bos_token_id": 1, "eos_token_id": 2, "use_cache": True, "initializer_range": 0.02,
                       "transformers_version": "4.46.0"}
        if looped:
            self.config.update({"num_pre_layers": looped[0], "num_loops": looped[1], "model_type": "looped_llama"})
            self.layers = looped[0] + 1
        else:
            self.config["num_hidden_layers"] = layers
            self.layers = layers
        self.repeat_last = repeat_last  # a plain config whose last repeat_last layers are one layer stored again
        self.quantize_config = None
        if quant == "gptq":
            self.config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": GROUP,
                                                  "desc_act": act_order, "sym": False, "damp_percent": 0.01,
                                                  "true_sequential": True}
        elif quant == "awq":
            self.config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": GROUP,
                                                  "version": "gemm", "zero_point": True}
        if "o" in self.biases:
            self.config["attention_bias"] = True
        if "gate" in self.biases:
            self.config["mlp_bias"] = True

    def dense(self, name, shape, std, mean=0.0, dtype=None):
        stored, values = store(dtype or self.dtype, mean + std * self.rng.standard_normal(shape))
        self.tensors[name] = (dtype or self.dtype, stored)
        self.values[name] = values

    def linear(self, prefix, n, k, key):
        w = self.rng.standard_normal((n, k)) / math.sqrt(k)
        if self.quant:
            order = np.arange(k)
            if self.act_order:  # GPTQ orders K by its input's Hessian: one order for the linears sharing an input
                shared = prefix.rsplit(".", 2)[0] + "." + {"k": "q", "v": "q", "up": "gate"}.get(key, key)
                if shared not in self.orders:
                    self.orders[shared] = self.rng.permutation(k)
                order = self.orders[shared]
            q, z, s, g_idx = quantize(w, GROUP, order)
            self.tensors.update(int4_tensors(prefix, self.quant, q, z, s, g_idx, with_g_idx=True))
            self.values[prefix + ".weight"] = dequantize(self.tensors, prefix, self.quant, k, GROUP)
            self.stored_offsets[prefix + ".weight"] = dequantize(self.tensors, prefix, self.quant, k, GROUP, True)
        else:
            stored, values = store(self.dtype, w)
            self.tensors[prefix + ".weight"] = (self.dtype, stored)
            self.values[prefix + ".weight"] = values
        if key in self.biases:
            self.dense(prefix + ".bias", (n,), 0.1, dtype="F16" if self.quant else None)

    def build(self):
        # N(0, 1/sqrt(D)), like a trained tied embedding: logits of unit spread, a mean NLL near ln V as a language
        # model's, not the tens of nats a unit-variance table would give through a tied head.
        self.dense("model.embed_tokens.weight", (V, D), 1.0 / math.sqrt(D))
        a, kv = H * HD, self.kv * HD
        for i in range(self.layers):
            p = f"model.layers.{i}."
            self.dense(p + "input_layernorm.weight", (D,), 0.1, mean=1.0)
            self.dense(p + "post_attention_layernorm.weight", (D,), 0.1, mean=1.0)
            for key, proj, n, k in (("q", "self_attn.q_proj", a, D), ("k", "self_attn.k_proj", kv, D),
                                    ("v", "self_attn.v_proj", kv, D), ("o", "self_attn.o_proj", D, a),
                                    ("gate", "mlp.gate_proj", F, D), ("up", "mlp.up_proj", F, D),
                                    ("down", "mlp.down_proj", D, F)):
                self.linear(p + proj, n, k, key)
        for i in range(self.layers, self.layers + self.repeat_last - 1):  # the last layer stored again
            last = f"model.layers.{self.layers - 1}."
            for store_ in (self.tensors, self.values, self.stored_offsets):
                for name in [x for x in store_ if x.startswith(last)]:
                    store_[f"model.layers.{i}." + name[len(last):]] = store_[name]
        if self.repeat_last > 1:
            self.layers += self.repeat_last - 1
            self.config["num_hidden_layers"] = self.layers
        self.dense("model.norm.weight", (D,), 0.1, mean=1.0)
        if not self.tied:
            self.dense("lm_head.weight", (V, D), 1.0 / math.sqrt(D))
        return self

    def write(self, out):
        folder = os.path.join(out, self.name)
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(self.config, f, indent=2)
        if self.quantize_config is not None:
            with open(os.path.join(folder, "quantize_config.json"), "w") as f:
                json.dump(self.quantize_config, f, indent=2)
        stored = {name: (dtype, list(a.shape), np.ascontiguousarray(a)) for name, (dtype, a) in self.tensors.items()}
        int4.write_safetensors(os.path.join(folder, "model.safetensors"), stored, {"format": "pt"})


# ---- The reference forward pass (transformers' Llama / Qwen2 modeling, float64) ------------------------------------

def inv_freq_and_scale(config):
    """transformers' modeling_rope_utils.py: the inverse frequencies and the factor on cos and sin."""
    base, dim = config["rope_theta"], config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    inv = 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    rs = config.get("rope_scaling")
    if not rs:
        return inv, 1.0
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "linear":
        return inv / rs["factor"], 1.0
    if kind == "dynamic":  # within max_position_embeddings: the plain frequencies
        return inv, 1.0
    if kind == "llama3":
        factor, low, high, old = (rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"],
                                  rs["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / high) & ~(wavelen > old / low)
        return np.where(medium, smoothed, scaled), 1.0
    if kind == "yarn":
        factor = rs["factor"]
        original = rs.get("original_max_position_embeddings") or config["max_position_embeddings"]

        def mscale(scale, m=1.0):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        attention = rs.get("attention_factor")
        if attention is None:
            if rs.get("mscale") and rs.get("mscale_all_dim"):
                attention = mscale(factor, rs["mscale"]) / mscale(factor, rs["mscale_all_dim"])
            else:
                attention = mscale(factor)
        beta_fast, beta_slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1

        def correction_dim(rotations):
            return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low, high = correction_dim(beta_fast), correction_dim(beta_slow)
        if rs.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        extrapolation = 1 - ramp
        return inv / factor * (1 - extrapolation) + inv * extrapolation, attention
    raise ValueError(kind)


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def reference_nll(fam, tokens, stored_offsets=False):
    c, val = fam.config, dict(fam.values)
    if stored_offsets:
        val.update(fam.stored_offsets)
    eps, n_kv, hd = c["rms_norm_eps"], c["num_key_value_heads"], HD
    inv, scale = inv_freq_and_scale(c)
    freqs = np.outer(np.arange(len(tokens), dtype=np.float64), inv)
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb) * scale, np.sin(emb) * scale  # [T, hd]

    def proj(x, prefix):
        y = x @ val[prefix + ".weight"].T
        return y + val[prefix + ".bias"] if prefix + ".bias" in val else y

    if fam.looped:
        order = list(range(fam.looped[0])) + [fam.looped[0]] * fam.looped[1]
    else:
        order = list(range(fam.layers))
    x = val["model.embed_tokens.weight"][tokens]
    t = len(tokens)
    mask = np.triu(np.full((t, t), -np.inf), k=1)
    for i in order:
        p = f"model.layers.{i}."
        h = rms_norm(x, val[p + "input_layernorm.weight"], eps)
        q = proj(h, p + "self_attn.q_proj").reshape(t, H, hd).transpose(1, 0, 2)  # [H, T, hd]
        k = proj(h, p + "self_attn.k_proj").reshape(t, n_kv, hd).transpose(1, 0, 2)
        v = proj(h, p + "self_attn.v_proj").reshape(t, n_kv, hd).transpose(1, 0, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = np.repeat(k, H // n_kv, axis=0)  # repeat_kv: query head h reads K/V head h // (H / KV)
        v = np.repeat(v, H // n_kv, axis=0)
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(hd) + mask
        scores -= scores.max(axis=-1, keepdims=True)
        weights = np.exp(scores)
        weights /= weights.sum(axis=-1, keepdims=True)
        attn = (weights @ v).transpose(1, 0, 2).reshape(t, H * hd)
        x = x + proj(attn, p + "self_attn.o_proj")
        h = rms_norm(x, val[p + "post_attention_layernorm.weight"], eps)
        gate = proj(h, p + "mlp.gate_proj")
        x = x + proj(gate / (1 + np.exp(-gate)) * proj(h, p + "mlp.up_proj"), p + "mlp.down_proj")
    h = rms_norm(x, val["model.norm.weight"], eps)
    head = val["model.embed_tokens.weight"] if c["tie_word_embeddings"] else val["lm_head.weight"]
    logits = h @ head.T
    top = logits.max(axis=-1, keepdims=True)
    lse = top[:, 0] + np.log(np.exp(logits - top).sum(axis=-1))
    return lse[:-1] - logits[np.arange(t - 1), tokens[1:]]


# ---- The matrix ----------------------------------------------------------------------------------------------------

def families():
    """(Family, expect): every family the importer reads, and what its .tinyloop model must be."""
    out = []

    def add(fam, pre, loops, head="tied"):
        out.append((fam.build(), {"pre": pre, "loops": loops, "n_kv_heads": fam.kv, "head": head}))

    # Llama, plain config (no num_pre_layers / num_loops), dense F16, tied: three layers, the last looped once.
    add(Family("llama_dense_f16"), 2, 1)
    # Llama, dense BF16, untied head, linear RoPE scaling.
    fam = Family("llama_dense_bf16_untied_linear_rope", dtype="BF16", tied=False)
    fam.config["rope_scaling"] = {"type": "linear", "factor": 2.0}
    add(fam, 2, 1, "dense")
    # A looped model stored unrolled as a plain Llama checkpoint: 2 layers, then the looped layer stored 3 times.
    add(Family("llama_unrolled_loop", repeat_last=3), 2, 3)
    # Looped configs (num_pre_layers 2, num_loops 3): GPTQ v1 group 32 without and with act-order (desc_act, g_idx).
    add(Family("looped_gptq", looped=(2, 3), quant="gptq"), 2, 3)
    add(Family("looped_gptq_act_order", looped=(2, 3), quant="gptq", act_order=True), 2, 3)
    # GPTQ whose settings are only in AutoGPTQ's quantize_config.json (no quant_method, as older AutoGPTQ writes).
    fam = Family("llama_gptq_quantize_config", quant="gptq")
    fam.quantize_config = dict(fam.config.pop("quantization_config"))
    del fam.quantize_config["quant_method"]
    add(fam, 2, 1)
    # AWQ GEMM, plain config, untied dense head.
    add(Family("llama_awq", quant="awq", tied=False), 2, 1, "dense")
    # Llama-3-style: grouped-query attention (2 K/V heads) and llama3 RoPE scaling; tied and untied head.
    for tied in (True, False):
        fam = Family("llama3_gqa_" + ("tied" if tied else "untied"), dtype="BF16", tied=tied, kv_heads=2)
        fam.config["rope_scaling"] = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 32, "rope_type": "llama3"}
        fam.config["rope_theta"] = 500000.0
        add(fam, 2, 1, "tied" if tied else "dense")
    # Llama-3-style with GPTQ act-order and GQA.
    fam = Family("llama3_gqa_gptq_act_order", quant="gptq", act_order=True, kv_heads=2, tied=False)
    fam.config["rope_scaling"] = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 32, "rope_type": "llama3"}
    add(fam, 2, 1, "dense")
    # Qwen2-style: q/k/v biases, GQA, sliding window switched off; one with YaRN RoPE scaling, one GPTQ (F16 biases).
    fam = Family("qwen2_bias", model_type="qwen2", dtype="BF16", tied=False, kv_heads=2, biases=("q", "k", "v"))
    fam.config.update({"use_sliding_window": False, "sliding_window": 131072, "max_window_layers": 2,
                       "attention_dropout": 0.0})
    add(fam, 2, 1, "dense")
    fam = Family("qwen2_bias_yarn", model_type="qwen2", kv_heads=2, biases=("q", "k", "v"))
    fam.config.update({"use_sliding_window": False, "sliding_window": None,
                       "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}})
    add(fam, 2, 1)
    fam = Family("qwen2_bias_gptq", model_type="qwen2", quant="gptq", kv_heads=1, biases=("q", "k", "v"))
    add(fam, 2, 1)
    # Llama with attention_bias and mlp_bias (every block linear has a bias), dense F32.
    add(Family("llama_all_biases", dtype="F32", biases=("q", "k", "v", "o", "gate", "up", "down")), 2, 1)
    # Mistral: a sliding window no narrower than max_seq (full attention), dynamic RoPE within its range.
    fam = Family("mistral_window", model_type="mistral", kv_heads=2)
    fam.config.update({"sliding_window": MAX_POSITIONS, "rope_scaling": {"type": "dynamic", "factor": 2.0}})
    add(fam, 2, 1)
    return out


def refused():
    """(name, config edit or tensor edit, status, message fragments): checkpoints the importer must refuse."""
    def config_edit(edit):
        def apply(fam):
            edit(fam.config)
        return apply

    def bits3(c):
        c["quantization_config"]["bits"] = 3

    return [
        ("gemma", "llama_dense_f16", config_edit(lambda c: c.update(model_type="gemma")), "TL_ERR_UNSUPPORTED",
         ["field 'model_type' = 'gemma'", "1 + weight"]),
        ("gemma_activation", "llama_dense_f16",
         config_edit(lambda c: c.update(hidden_activation="gelu_pytorch_tanh")), "TL_ERR_UNSUPPORTED",
         ["field 'hidden_activation'", "Gemma"]),
        ("phi3", "llama_dense_f16", config_edit(lambda c: c.update(model_type="phi3")), "TL_ERR_UNSUPPORTED",
         ["field 'model_type' = 'phi3'"]),
        ("mistral_sliding_window", "mistral_window", config_edit(lambda c: c.update(sliding_window=64)),
         "TL_ERR_UNSUPPORTED", ["field 'sliding_window' = 64", "max_seq is 128"]),
        ("qwen2_sliding_window_on", "qwen2_bias",
         config_edit(lambda c: c.update(use_sliding_window=True, sliding_window=32)), "TL_ERR_UNSUPPORTED",
         ["field 'sliding_window' = 32"]),
        ("unknown_field", "llama_dense_f16", config_edit(lambda c: c.update(attn_logit_softcapping=50.0)),
         "TL_ERR_UNSUPPORTED", ["field 'attn_logit_softcapping' = 50.0", "not a field this importer reads"]),
        ("longrope", "llama_dense_f16",
         config_edit(lambda c: c.update(rope_scaling={"type": "longrope", "short_factor": [1.0],
                                                      "long_factor": [2.0]})),
         "TL_ERR_UNSUPPORTED", ["field 'rope_scaling.type' = 'longrope'"]),
        ("dynamic_past_range", "llama_dense_f16",
         config_edit(lambda c: c.update(rope_scaling={"type": "dynamic", "factor": 2.0,
                                                      "original_max_position_embeddings": 64})),
         "TL_ERR_UNSUPPORTED", ["'dynamic'", "longer than 64 tokens"]),
        ("gptq_3bit", "looped_gptq", config_edit(bits3), "TL_ERR_UNSUPPORTED",
         ["field 'quantization_config.bits' = 3"]),
        ("gptq_v2", "looped_gptq",
         config_edit(lambda c: c["quantization_config"].update(checkpoint_format="gptq_v2")), "TL_ERR_UNSUPPORTED",
         ["checkpoint_format", "gptq_v2"]),
        ("awq_gemv", "llama_awq", config_edit(lambda c: c["quantization_config"].update(version="gemv")),
         "TL_ERR_UNSUPPORTED", ["quantization_config.version"]),
        ("qwen2_missing_bias", "qwen2_bias",
         lambda fam: fam.tensors.pop("model.layers.1.self_attn.v_proj.bias"), "TL_ERR_FORMAT",
         ["missing tensor 'model.layers.1.self_attn.v_proj.bias'"]),
        ("silu_not", "llama_dense_f16", config_edit(lambda c: c.update(hidden_act="gelu")), "TL_ERR_UNSUPPORTED",
         ["field 'hidden_act' = 'gelu'"]),
    ]


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    manifest = {"bound": BOUND, "bound_stored_offsets": BOUND_STORED_OFFSETS, "families": [], "refused": []}
    built = {}
    tokens = np.random.default_rng(SEED).integers(0, V, T)
    for fam, expect in families():
        fam.write(out)
        nll = reference_nll(fam, tokens)
        stored = reference_nll(fam, tokens, stored_offsets=True)
        manifest["families"].append({"name": fam.name, "dir": fam.name, "tokens": tokens.tolist(),
                                     "nll": nll.tolist(), "mean_nll": float(nll.mean()),
                                     "mean_nll_stored_offsets": float(stored.mean()), "expect": expect})
        built[fam.name] = fam
    os.makedirs(os.path.join(out, "refused"), exist_ok=True)
    for name, source, edit, status, message in refused():
        src = built[source]
        fam = Family.__new__(Family)
        fam.__dict__.update(src.__dict__)
        fam.name = os.path.join("refused", name)
        fam.config = json.loads(json.dumps(src.config))
        fam.tensors = dict(src.tensors)
        edit(fam)
        fam.write(out)
        manifest["refused"].append({"name": name, "dir": fam.name, "status": status, "message": message})
    with open(os.path.join(out, "matrix.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
