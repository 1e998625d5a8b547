#!/usr/bin/env python3
"""Writes tiny Hugging Face-style checkpoints of a looped model, with the values a conversion to .tinyloop must give,
for the import.checkpoint_* tests (tests/import/checkpoint_import_test.cpp). Standard library only; fixed seeds, so
the files are the same on every run.

    python3 make_looped_checkpoints.py OUT_DIR

For each variant V (below), OUT_DIR/V/ is the checkpoint folder: config.json (Llama field names plus num_pre_layers
and num_loops) and model.safetensors, or model.safetensors.index.json and its shards (docs/format.md, "Importing
Hugging Face-style checkpoints"). Next to it:
  V.expected.safetensors  F32 tensors under the .tinyloop names: embed.weight [V, D], <b>attn_norm.weight,
                          <b>mlp_norm.weight, final_norm.weight [D], each linear <b>attn_qkv, <b>attn_out, <b>mlp_gate,
                          <b>mlp_up, <b>mlp_down and (untied) head as W transposed, [N, K]; for an INT4 linear also
                          <p>.offset [N, G], |z * s|, which bounds the one FP16 rounding of the offset z' = -z * s
  V.expected.json         {"config": the .tinyloop config, "embed_dtype", "format_version", "head": "tied" | "dense" |
                          "int4", "linears": {name: "F16" | "BF16" | "F32" | "INT4"}}
The expected values are the stored values themselves (what F16 / BF16 / F32 encode), assembled here in the layout the
docs give: attn_qkv is q_proj's rows, then k_proj's, then v_proj's (grouped-query attention stays grouped: the
config's n_kv_heads), biases likewise. INT4 layers come from make_int4_checkpoints.make_layer, whose expected
(q - z) * s is computed from its own independent unpacking.

OUT_DIR/gptq_act_order_dense/ is gptq_act_order's model with every INT4 linear written dense (F32 [N, K], the
expected values): both must score alike. OUT_DIR/bad/* are checkpoints the converter must refuse (the test names each
one's status and message).
"""
import json
import math
import os
import random
import shutil
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_int4_checkpoints as int4  # noqa: E402  (the INT4 layouts' packers and the safetensors writer)

SEED = 20261202
D, H, HD, F, V, P, LOOPS = 64, 4, 16, 96, 72, 2, 3
GROUP = 32

PROJ = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
        "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}


def encode(dtype, x):
    """(the value the dtype stores, the item to write): F16 / BF16 bit patterns, F32 the float itself."""
    if dtype == "F16":
        return int4.to_half(x)
    f32_bits = struct.unpack("<I", struct.pack("<f", x))[0]
    if dtype == "BF16":
        bits = (f32_bits + 0x7FFF + ((f32_bits >> 16) & 1)) >> 16  # round to nearest even
        return struct.unpack("<f", struct.pack("<I", bits << 16))[0], bits
    value = struct.unpack("<f", struct.pack("<I", f32_bits))[0]
    return value, value


class Variant:
    def __init__(self, name, dtype="F16", tied=True, head_dim=None, kv_heads=None, quant=None, group=GROUP,
                 dense_linears=(), dtype_of=None, head_dtype=None, defaults=False, act_order=False, plain=False,
                 biases=None, bits=4):
        self.name = name
        self.rng = random.Random(f"{SEED}-{name}")
        self.dtype = dtype
        self.tied = tied
        self.hd = head_dim or D // H
        self.kv = kv_heads or H
        self.quant = quant  # None, "gptq" or "awq"
        self.bits = bits  # 8: symmetric 8-bit GPTQ, stored as INT8 linears
        self.group = group  # 0 = per row
        self.dense_linears = set(dense_linears)  # HF linear names kept dense in a quantized checkpoint
        self.dtype_of = dtype_of or {}  # HF proj key ("k", ...) -> dtype, overriding `dtype` for dense linears
        self.head_dtype = head_dtype
        self.act_order = act_order  # GPTQ: every INT4 linear's K rows reordered as desc_act leaves them
        # Which linears have a .bias: None; "qwen2" (q, k, v: model_type qwen2); "all" (attention_bias and mlp_bias).
        self.biases = {None: set(), "qwen2": {"q", "k", "v"}, "all": {"q", "k", "v", "o", "gate", "up", "down"}}[biases]
        self.perms = {}  # input name -> the row order of the linears that read it
        self.dense_twin = {}  # HF linear name -> its weight [N, K] as F32: the same model, written dense
        self.tensors = {}  # the checkpoint: name -> (dtype, shape, items)
        self.expected = {}  # .tinyloop name -> ("F32", shape, values)
        self.linears = {}
        a = H * self.hd
        self.config = {
            "architectures": ["LoopedLlamaForCausalLM"], "model_type": "looped_llama",
            "hidden_size": D, "num_attention_heads": H, "intermediate_size": F, "vocab_size": V,
            "num_pre_layers": P, "num_loops": LOOPS, "tie_word_embeddings": tied, "torch_dtype": "float16",
        }
        max_seq, rope_theta, eps = 2048, 10000.0, 1e-6  # transformers' LlamaConfig defaults
        if not defaults:
            max_seq, rope_theta, eps = 128, 500000.0, 1e-5
            self.config.update({"max_position_embeddings": max_seq, "rope_theta": rope_theta, "rms_norm_eps": eps,
                                "num_hidden_layers": P + 1, "hidden_act": "silu", "rope_scaling": None,
                                "attention_bias": False, "head_dim": None})
        if plain:
            # A Llama config as transformers writes it: no num_pre_layers / num_loops, the layer count, and fields
            # the importer ignores (docs/import.md).
            for key in ("num_pre_layers", "num_loops"):
                del self.config[key]
            self.config.update({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                "num_hidden_layers": P + 1, "bos_token_id": 1, "eos_token_id": [2, 3],
                                "pad_token_id": None, "use_cache": True, "initializer_range": 0.02,
                                "pretraining_tp": 1, "attention_dropout": 0.0, "mlp_bias": False,
                                "transformers_version": "4.46.0"})
        if biases == "qwen2":
            self.config["model_type"] = "qwen2"
        elif biases == "all":
            self.config.update({"attention_bias": True, "mlp_bias": True})
        if head_dim:
            self.config["head_dim"] = head_dim
        if kv_heads:
            self.config["num_key_value_heads"] = kv_heads
        if quant == "gptq":
            self.config["quantization_config"] = {"quant_method": "gptq", "bits": bits, "group_size": group or -1,
                                                  "desc_act": False, "sym": bits == 8, "checkpoint_format": "gptq"}
        elif quant == "awq":
            self.config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": group or -1,
                                                  "version": "gemm", "zero_point": True}
        self.tl_config = {"d_model": D, "n_heads": H, "head_dim": self.hd, "ffn": F, "vocab": V, "pre": P,
                          "loops": 1 if plain else LOOPS, "max_seq": max_seq, "group_size": group if quant else 0,
                          "bits": bits,
                          "rope_theta": rope_theta, "norm_eps": eps}
        if self.kv != H:
            self.tl_config["n_kv_heads"] = self.kv
        self.a = a
        self.quantize_config = None  # AutoGPTQ's quantize_config.json, written next to config.json when set

    def dense(self, name, rows, cols, std, mean=0.0, dtype=None):
        """A dense tensor [rows, cols] of the checkpoint; returns its stored values as rows."""
        dtype = dtype or self.dtype
        values, items = [], []
        for _ in range(rows * cols):
            v, item = encode(dtype, mean + self.rng.gauss(0.0, std))
            values.append(v)
            items.append(item)
        self.tensors[name] = (dtype, [rows, cols] if rows > 1 else [cols], items)
        return [values[r * cols:(r + 1) * cols] for r in range(rows)], dtype

    def linear(self, hf, k, n, proj):
        """One linear (K inputs, N outputs): dense [N, K] or INT4, and its bias if it has one. Returns (rows [N][K],
        offsets [N][G] or None, storage dtype or "INT4", bias [N] or None)."""
        rows, offsets, storage = self.weight(hf, k, n, proj)
        bias = None
        if proj in self.biases:
            dtype = storage if storage in ("F16", "BF16", "F32") else "F16"  # GPTQ / AWQ store F16 biases
            (bias,), _ = self.dense(f"{hf}.bias", 1, n, 0.1, dtype=dtype)
        return rows, offsets, storage, bias

    def weight(self, hf, k, n, proj):
        if self.quant and hf not in self.dense_linears:
            layer = int4.make_layer(self.rng, self.quant, k, n, self.group, self.bits)
            if self.act_order:
                # q, k and v share their input, and so do gate and up: GPTQ orders them alike.
                shared = {"q": "attn_in", "k": "attn_in", "v": "attn_in", "gate": "mlp_in", "up": "mlp_in"}
                key = hf.rsplit(".", 2)[0] + "." + shared.get(proj, proj)
                if key not in self.perms:
                    self.perms[key] = list(range(k))
                    self.rng.shuffle(self.perms[key])
                name = next(key for key in layer if key.endswith(".qweight"))[:-len(".qweight")]
                layer = int4.make_act_order(layer, name, self.perms[key], self.group)
            by_suffix = {key.rsplit(".", 1)[1]: value for key, value in layer.items()}
            for suffix in ("qweight", "qzeros", "scales", "g_idx"):
                if suffix in by_suffix:
                    self.tensors[f"{hf}.{suffix}"] = by_suffix[suffix]
            expected = by_suffix["expected"][2]  # [K][N]
            zero = by_suffix["zero"][2]  # [G][N]
            scale_bits = by_suffix["scales"][2]
            groups = len(zero) // n
            rows = [[expected[kk * n + nn] for kk in range(k)] for nn in range(n)]
            offsets = [[abs(zero[g * n + nn] * struct.unpack("<e", struct.pack("<H", scale_bits[g * n + nn]))[0])
                        for g in range(groups)] for nn in range(n)]
            self.dense_twin[hf] = ("F32", [n, k], [x for row in rows for x in row])
            if self.bits == 8:  # exact: (q - 128) * s is the INT8 code times the scale, no offset to round
                return rows, None, "INT8"
            return rows, offsets, "INT4"
        rows, dtype = self.dense(f"{hf}.weight", n, k, 1.0 / k ** 0.5, dtype=self.dtype_of.get(proj))
        return rows, None, dtype

    def put(self, name, rows, offsets, storage, bias=None):
        self.expected[name] = ("F32", [len(rows), len(rows[0])], [x for row in rows for x in row])
        if bias is not None:
            self.expected[name + ".bias"] = ("F32", [len(bias)], bias)
        if offsets is not None:
            self.expected[name + ".offset"] = ("F32", [len(offsets), len(offsets[0])],
                                               [x for row in offsets for x in row])
        self.linears[name] = storage

    def build(self):
        embed, self.embed_dtype = self.dense("model.embed_tokens.weight", V, D, 1.0)
        self.expected["embed.weight"] = ("F32", [V, D], [x for row in embed for x in row])
        kv = self.kv * self.hd
        for i in range(P + 1):
            layer = f"model.layers.{i}."
            block = f"pre.{i}." if i < P else "loop."
            for hf, tl in (("input_layernorm", "attn_norm"), ("post_attention_layernorm", "mlp_norm")):
                (gain,), _ = self.dense(layer + hf + ".weight", 1, D, 0.1, mean=1.0)
                self.expected[block + tl + ".weight"] = ("F32", [D], gain)
            q = self.linear(layer + PROJ["q"], D, self.a, "q")
            k = self.linear(layer + PROJ["k"], D, kv, "k")
            v = self.linear(layer + PROJ["v"], D, kv, "v")
            # [q | k | v]: the projections' rows as they are, K/V heads once each (grouped-query attention stays
            # grouped: n_kv_heads).
            rows, offsets = list(q[0]), list(q[1]) if q[1] else None
            bias = list(q[3]) if q[3] is not None else None
            for src in (k, v):
                rows += src[0]
                if offsets is not None:
                    offsets += src[1]
                if bias is not None:
                    bias += src[3]
            storages = {q[2], k[2], v[2]}
            self.put(block + "attn_qkv", rows, offsets, storages.pop() if len(storages) == 1 else "F32", bias)
            for proj, tl, kk, n in (("o", "attn_out", self.a, D), ("gate", "mlp_gate", D, F),
                                    ("up", "mlp_up", D, F), ("down", "mlp_down", F, D)):
                self.put(block + tl, *self.linear(layer + PROJ[proj], kk, n, proj))
        (gain,), _ = self.dense("model.norm.weight", 1, D, 0.1, mean=1.0)
        self.expected["final_norm.weight"] = ("F32", [D], gain)
        if not self.tied:
            rows, _ = self.dense("lm_head.weight", V, D, 1.0 / D ** 0.5, dtype=self.head_dtype)
            self.put("head", rows, None, self.tensors["lm_head.weight"][0])
        return self

    def write(self, out, shards=1, misalign=False, checkpoint_only=False):
        folder = os.path.join(out, self.name)
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(self.config, f, indent=2)
        if self.quantize_config is not None:
            with open(os.path.join(folder, "quantize_config.json"), "w") as f:
                json.dump(self.quantize_config, f, indent=2)
        names = sorted(self.tensors)
        if shards == 1:
            int4.write_safetensors(os.path.join(folder, "model.safetensors"), self.tensors, {"format": "pt"}, misalign)
        else:
            weight_map = {}
            for s in range(shards):
                file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
                part = {n: self.tensors[n] for n in names[s::shards]}
                weight_map.update({n: file for n in part})
                int4.write_safetensors(os.path.join(folder, file), part, {"format": "pt"}, misalign)
            with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
                json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f, indent=2)
        if checkpoint_only:
            return
        int4.write_safetensors(os.path.join(out, self.name + ".expected.safetensors"), self.expected)
        with open(os.path.join(out, self.name + ".expected.json"), "w") as f:
            json.dump({"config": self.tl_config, "embed_dtype": self.embed_dtype,
                       "format_version": "2" if self.biases or "rope_scaling" in self.tl_config or self.kv != H
                       else "1",
                       "head": "tied" if self.tied else "int4" if self.linears["head"] == "INT4" else "dense",
                       "linears": self.linears}, f, indent=2)


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)

    # Dense, F16, tied, head_dim from hidden_size / heads; an older checkpoint's RoPE buffer, which is skipped.
    v = Variant("dense_f16_tied").build()
    v.tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = ("F32", [HD // 2], [1.0] * (HD // 2))
    v.write(out)
    base = v
    # BF16, a separate head, head_dim != hidden_size / heads, grouped-query attention, and LlamaConfig's defaults
    # for every optional field.
    Variant("dense_bf16_untied_gqa", dtype="BF16", tied=False, head_dim=24, kv_heads=2, defaults=True).build().write(out)
    # F32 with F16 k_proj (attn_qkv then widens to F32), tied with lm_head saved anyway, in 3 shards.
    v = Variant("dense_f32_sharded", dtype="F32", dtype_of={"k": "F16"}).build()
    v.tensors["lm_head.weight"] = v.tensors["model.embed_tokens.weight"]
    v.write(out, shards=3)
    # GPTQ v1, group 32, one linear left dense, a dense head, every tensor misaligned in the file.
    gptq = Variant("gptq", tied=False, quant="gptq", dense_linears={"model.layers.0.mlp.down_proj"}).build()
    gptq.write(out, misalign=True)
    # GPTQ per row (group_size -1), tied, no g_idx (it is optional).
    v = Variant("gptq_per_row", quant="gptq", group=0).build()
    for name in [n for n in v.tensors if n.endswith(".g_idx")]:
        del v.tensors[name]
    v.write(out)
    # GPTQ with act-order: every linear's K rows in a shuffled order (shared by q, k, v and by gate, up), and the same
    # model with those weights dense in F32, which must score the same.
    act = Variant("gptq_act_order", quant="gptq", act_order=True).build()
    act.config["quantization_config"]["desc_act"] = True
    act.write(out)
    twin = Variant("gptq_act_order_dense")
    twin.config = {key: value for key, value in act.config.items() if key != "quantization_config"}
    twin.tensors = {name: value for name, value in act.tensors.items() if name.rsplit(".", 1)[0] not in act.dense_twin}
    twin.tensors.update({hf + ".weight": value for hf, value in act.dense_twin.items()})
    twin.write(out, checkpoint_only=True)
    # Symmetric 8-bit GPTQ, group 32, one linear left dense, a dense head; and per row, tied.
    gptq8 = Variant("gptq8", tied=False, quant="gptq", bits=8, dense_linears={"model.layers.0.mlp.down_proj"}).build()
    gptq8.write(out)
    Variant("gptq8_per_row", quant="gptq", bits=8, group=0).build().write(out)
    # AWQ GEMM, group 32, grouped-query attention (the INT4 K/V rows repeated), a BF16 head.
    Variant("awq", tied=False, quant="awq", kv_heads=2, head_dtype="BF16").build().write(out)
    # Qwen2-style: q, k and v with biases (BF16, as the weights), grouped-query attention.
    qwen2 = Variant("qwen2_bias", dtype="BF16", kv_heads=2, biases="qwen2").build()
    qwen2.write(out)
    # GPTQ with attention_bias and mlp_bias: every block linear has an F16 bias next to its INT4 tensors.
    Variant("gptq_biases", tied=False, quant="gptq", biases="all").build().write(out)
    # Llama-3-style: a plain config, grouped-query attention, llama3 RoPE scaling, a separate head.
    v = Variant("llama3_rope", tied=False, kv_heads=2, plain=True).build()
    v.config["rope_scaling"] = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 32, "rope_type": "llama3"}
    v.tl_config["rope_scaling"] = {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 32}
    v.write(out)
    # Qwen2-style with YaRN (transformers' "type" key; original_max_position_embeddings given, the attention factor
    # from the factor: 0.1 ln 4 + 1).
    v = Variant("qwen2_yarn", kv_heads=2, biases="qwen2").build()
    v.config["rope_scaling"] = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
    v.tl_config["rope_scaling"] = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                                   "beta_fast": 32.0, "beta_slow": 1.0, "attention_factor": 0.1 * math.log(4.0) + 1.0,
                                   "truncate": True}
    v.write(out)
    # GPTQ whose settings are only in AutoGPTQ's quantize_config.json (older AutoGPTQ: no quant_method).
    v = Variant("gptq_quantize_config", quant="gptq").build()
    v.quantize_config = {"bits": 4, "group_size": GROUP, "damp_percent": 0.01, "desc_act": False,
                         "static_groups": False, "sym": False, "true_sequential": True, "model_name_or_path": None,
                         "model_file_base_name": "model"}
    del v.config["quantization_config"]
    v.write(out)
    # A plain Llama config (no num_pre_layers / num_loops): its three distinct layers are two pre blocks and the looped
    # block, applied once.
    Variant("plain_llama", plain=True).build().write(out)
    # dense_f16_tied's model stored unrolled, as a Llama checkpoint: layers 2, 3 and 4 are the looped block stored three
    # times. The importer finds the repeats and stores the block once, looped 3 times: the same model as
    # dense_f16_tied's.
    v = Variant("dense_f16_tied", plain=True).build()
    v.name = "unrolled"
    for layer in range(P + 1, P + LOOPS):
        prefix = f"model.layers.{P}."
        for name in [n for n in v.tensors if n.startswith(prefix)]:
            v.tensors[f"model.layers.{layer}." + name[len(prefix):]] = v.tensors[name]
    v.config["num_hidden_layers"] = P + LOOPS
    v.tl_config["loops"] = LOOPS
    v.write(out)

    # ---- Checkpoints to refuse ----
    bad = os.path.join(out, "bad")
    os.makedirs(bad, exist_ok=True)

    def variant_from(source, name, edit):
        v = Variant(name)
        v.config = json.loads(json.dumps(source.config))
        v.tensors = dict(source.tensors)
        edit(v)
        v.write(bad, checkpoint_only=True)

    variant_from(base, "missing_tensor", lambda v: v.tensors.pop("model.layers.1.mlp.down_proj.weight"))

    def transposed_up(v):  # [D, F] instead of [F, D]: the same bytes, the wrong orientation
        dtype, shape, items = v.tensors["model.layers.0.mlp.up_proj.weight"]
        v.tensors["model.layers.0.mlp.up_proj.weight"] = (dtype, [shape[1], shape[0]], items)
    variant_from(base, "wrong_shape", transposed_up)

    def extra_layer(v):  # a layer past the looped one: the config's num_pre_layers does not fit the tensors
        v.tensors["model.layers.3.mlp.up_proj.weight"] = v.tensors["model.layers.2.mlp.up_proj.weight"]
    variant_from(base, "unexpected_layer", extra_layer)

    def act_order_kv_apart(v):  # k_proj's K in an order of its own: q, k and v become one linear, read in one order
        name = "model.layers.2.self_attn.k_proj"
        perm = list(range(D))
        random.Random(SEED).shuffle(perm)
        layer = int4.make_act_order({f"{name}.{s}": v.tensors[f"{name}.{s}"] for s in ("qweight", "qzeros", "scales")} |
                                    {f"{name}.expected": ("F32", [D, D], [0.0] * (D * D))}, name, perm, GROUP)
        for suffix in ("qweight", "g_idx"):
            v.tensors[f"{name}.{suffix}"] = layer[f"{name}_actorder.{suffix}"]
    variant_from(gptq, "act_order_kv_apart", act_order_kv_apart)

    def bad_scales(v):  # a scale of +inf
        dtype, shape, items = v.tensors["model.layers.1.mlp.gate_proj.scales"]
        v.tensors["model.layers.1.mlp.gate_proj.scales"] = (dtype, shape, [0x7C00] + items[1:])
    variant_from(gptq, "infinite_scale", bad_scales)

    def asymmetric8(v):  # one zero point of 8-bit GPTQ that is not 128: asymmetric, no INT8 storage
        dtype, shape, items = v.tensors["model.layers.1.self_attn.o_proj.qzeros"]
        v.tensors["model.layers.1.self_attn.o_proj.qzeros"] = (dtype, shape, [items[0] - 27] + items[1:])
    variant_from(gptq8, "gptq8_asymmetric", asymmetric8)


    def bias(v):  # a bias no config field announces
        v.tensors["model.layers.0.self_attn.q_proj.bias"] = ("F16", [D], [0] * D)
    variant_from(base, "bias", bias)
    variant_from(qwen2, "missing_bias", lambda v: v.tensors.pop("model.layers.1.self_attn.k_proj.bias"))

    def o_proj_bias(v):  # Qwen2's o_proj has none
        v.tensors["model.layers.2.self_attn.o_proj.bias"] = ("BF16", [D], [0] * D)
    variant_from(qwen2, "qwen2_o_proj_bias", o_proj_bias)
    return 0


if __name__ == "__main__":
    sys.exit(main())
