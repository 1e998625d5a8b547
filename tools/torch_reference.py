#!/usr/bin/env python3
"""An independent PyTorch implementation of the TinyLoop architecture, and its FP16 speed peer.

Written from docs/architecture.md and docs/format.md alone (no code shared with the library), it reads a
.tinyloop file (a safetensors file) and scores tokens:

  reference (default)  weights dequantized exactly, W = q*s + z in FP32 from the FP16 s and z (in FP64 with --fp64),
                       every activation in FP32 (FP64 with --fp64) on the GPU, TF32 off; attention written out
                       (scores, causal mask, softmax, weighted sum); log-softmax and the NLL sum in float64. Prints
                       the total NLL, tokens scored and perplexity; --per-token-out writes each position's NLL;
                       --compare checks files from `tinyloop score --per-token` against it, each on its own.
  --speed              the speed peer for tl_score_bench (tools/gpu/score_bench.sh): the same model as a plain FP16
                       PyTorch model, dequantized FP16 weights used like nn.Linear (F.linear), FP16 activations with
                       RMSNorm in FP32, RoPE, F.scaled_dot_product_attention, full FP16 logits upcast to FP32 for
                       F.cross_entropy. Sequences are batched: each forward pass scores a [B, L] batch of at most
                       --batch-tokens tokens (padding included). Times each scenario eagerly and/or under
                       torch.compile (--compile) with CUDA events: one warm-up run, then the median of --reps >= 5
                       runs; prints tokens/s, the NLL, the FP16 weights' bytes and torch.cuda.max_memory_allocated.
  --backend numpy      the reference math on the CPU with numpy and no torch or safetensors package (a small
                       reader of the format stands in for safe_open): for smoke tests on machines without them.

Windows follow docs/architecture.md: windows of --window tokens (default the model's max_seq) overlapping by one
token, positions restarting at 0 in each; token i + 1's NLL is reported at position i + 1.

Tokens: --tokens-from TEXT (its bytes, like `tinyloop score --text`), --token-ids FILE (whitespace-separated ids,
like `tinyloop score --tokens`), or --random N: output i of splitmix64 seeded with --seed, modulo the vocabulary
(the same sequence as bench/score_bench.cpp with that seed). --max-tokens cuts any of them.

The speed peer's scenarios (--scenarios, comma-separated; by default the token source in --window windows, and docs
when --docs is given):
  T:W   the first T tokens of the token source in windows of W tokens (0 = max_seq), overlapping by one as above.
        Windows are stacked into [B, W] batches, the last, shorter one padded (right padding under causal attention
        is exact: no real position attends to it, and padded positions are not scored).
  docs  --docs N documents, --doc-min A to --doc-max B tokens long (default 100 and 2000), from ONE splitmix64 stream
        seeded with --seed: its first N outputs give the lengths, A + out % (B - A + 1); the sum(lengths) outputs after
        them, modulo the vocabulary, the tokens, document after document (tl_score_bench --docs makes the same ones).
        Every token of a document but its first is scored, each given the document's tokens before it. Two layouts:
          padded  sorted by length, a pass takes documents while they fit in --batch-tokens once padded to its
                  longest (right padding, causal attention, padding not scored);
          packed  first-fit decreasing into rows of the longest document rounded up to 128 tokens, --batch-tokens /
                  that many rows a pass, attention confined to each document by a block-diagonal causal mask.
        Eager runs time both; compiled runs only packed, whose passes share one shape: padded passes all differ in
        shape and torch.compile(dynamic=False) compiles each one anew (19 for 256 documents of 100-2000 tokens,
        about a minute each under max-autotune), more than a benchmark run has.
--compile: none (eager only, the default); default or max-autotune-no-cudagraphs (that torch.compile mode only); both
(eager, then max-autotune-no-cudagraphs). Compiled runs use dynamic=False and fullgraph=True; the warm-up run compiles
every pass shape before timing starts, and its seconds are printed apart.

Tokens scored: every token but the first of each window or document; tokens/s counts those. One machine-readable line
per timed variant (mode, scenario, layout), after a readable one:
  SPEED,<mode: eager|compiled>,<scenario: tokens|docs>,<tokens in>,<window: W, 0 for docs>,<ms median>,
        <tokens scored per s>,<weight bytes>,<linear bytes>,<peak bytes>,<layout: padded|packed>,<sequences: windows
        or documents>,<forward passes>,<tokens scored>,<NLL sum, nats>,<compile mode, - when eager>,<warm-up s>
  (one line; weight bytes: the FP16 weights, a tied head counted once; linear bytes: the linear layers alone; peak
  bytes: torch.cuda.max_memory_allocated over the timed runs, weights included; warm-up s: the untimed first run,
  which under torch.compile includes compiling every pass shape.)

--compare tolerance (exit status 1 when any file is beyond it):
  relative perplexity difference |exp(mean NLL_theirs - mean NLL_ours) - 1| <= --ppl-tol (default 0.0025 = 0.25%)
  and per-position |NLL_theirs - NLL_ours| <= --nll-tol nats (default 0.05).
The GPU path computes in FP16 with FP32 accumulation, ten block applications deep on the 2B preset; the CLI writes
NLLs with 6 significant digits (about 1e-5 nats at NLL ~ 11), far below both bounds.

Exit status: 0 success, 1 comparison beyond tolerance, 2 bad arguments or inputs.

Examples:
  python3 tools/torch_reference.py model.tinyloop --random 1024 --seed 1 --compare tl.tsv
  python3 tools/torch_reference.py model.tinyloop --random 4096 --seed 1 --speed
  python3 tools/torch_reference.py model.tinyloop --speed --compile both --seed 1 --random 4096 \\
      --docs 256 --doc-min 100 --doc-max 2000 --scenarios 4096:0,1024:16,1024:0,docs
  python3 tools/torch_reference.py model.tinyloop --tokens-from text.txt --max-tokens 300 --backend numpy
"""

import argparse
import collections
import contextlib
import importlib
import json
import math
import statistics
import struct
import sys
import time

MASK64 = (1 << 64) - 1
HEAD_CHUNK_ROWS = 512  # positions per logits chunk of the reference: [512, V] in float64 is ~200 MB at V = 50257


class InputError(Exception):
    """A bad argument or input file: reported on stderr, exit status 2."""


# ---- Tokens --------------------------------------------------------------------------------------------------------

def splitmix64(seed):
    """splitmix64's outputs from `seed`, endlessly (bench/score_bench.cpp's generator)."""
    state = seed & MASK64
    while True:
        state = (state + 0x9E3779B97F4A7C15) & MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        yield z ^ (z >> 31)


def splitmix64_tokens(count, seed, vocab):
    stream = splitmix64(seed)
    return [next(stream) % vocab for _ in range(count)]


def splitmix64_documents(count, min_len, max_len, seed, vocab):
    """`count` documents from one splitmix64 stream seeded with `seed` (tl_score_bench --docs makes the same ones): its
    first `count` outputs give the lengths, min_len + out % (max_len - min_len + 1); the outputs after them, modulo
    vocab, the tokens, document after document."""
    stream = splitmix64(seed)
    lengths = [min_len + next(stream) % (max_len - min_len + 1) for _ in range(count)]
    return [[next(stream) % vocab for _ in range(n)] for n in lengths]


def read_tokens(args, vocab):
    if args.random is not None:
        tokens = splitmix64_tokens(args.random, args.seed, vocab)
    elif args.tokens_from is not None:
        with open(args.tokens_from, "rb") as f:
            tokens = list(f.read())
    else:
        with open(args.token_ids) as f:
            try:
                tokens = [int(word) for word in f.read().split()]
            except ValueError as e:
                raise InputError(f"{args.token_ids}: not a list of integers ({e})")
    if args.max_tokens:
        tokens = tokens[:args.max_tokens]
    if len(tokens) < 2:
        raise InputError(f"need at least 2 tokens, got {len(tokens)}")
    bad = [(i, t) for i, t in enumerate(tokens) if not 0 <= t < vocab]
    if bad:
        raise InputError(f"token {bad[0][1]} at index {bad[0][0]} is outside [0, vocab = {vocab})")
    return tokens


def perplexity_text(mean_nll):
    return f"{math.exp(mean_nll):.6g}" if mean_nll < 700 else "overflows a double"


def windows(n, length):
    """(begin, end) of each window: length L, overlapping by one token, the last one cut at n."""
    stride = length - 1
    return [(w * stride, min(w * stride + length, n)) for w in range((n - 1 + stride - 1) // stride)]


# ---- Array backends: the few operations whose spelling differs between torch and numpy -------------------------------

class TorchBackend:
    def __init__(self, device, fp64):
        import torch
        self.torch = torch
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise InputError("torch sees no CUDA device (use --device cpu or --backend numpy)")
        self.device = torch.device(device)
        self.dtype = torch.float64 if fp64 else torch.float32
        # The reference must not round matmul inputs to TF32.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")

    def read_model(self, path):
        from safetensors import safe_open
        tensors = {}
        with safe_open(path, framework="pt", device="cpu") as f:
            metadata = f.metadata() or {}
            for name in f.keys():
                tensors[name] = f.get_tensor(name).to(self.device)
        return metadata, tensors

    def to_f32(self, x):
        return x.to(self.torch.float32)

    def to_compute(self, x):
        return x.to(self.dtype)

    def to_f64(self, x):
        return x.to(self.torch.float64)

    def nibbles(self, q):
        """[N, K/2] bytes -> [N, K] codes, even k from the low nibble."""
        return self.torch.stack([q & 15, q >> 4], dim=-1).reshape(q.shape[0], -1)

    def rows(self, table, ids):
        return table[self.torch.tensor(ids, device=self.device, dtype=self.torch.long)]

    def pick(self, x, ids):
        """x[i, ids[i]] for every row i."""
        idx = self.torch.tensor(ids, device=self.device, dtype=self.torch.long)
        return x[self.torch.arange(len(ids), device=self.device), idx]

    def positions_f64(self, n):
        return self.torch.arange(n, device=self.device, dtype=self.torch.float64)

    def mean_last(self, x):
        return x.mean(dim=-1, keepdim=True)

    def sum_last(self, x):
        return x.sum(dim=-1, keepdim=True)

    def max_last(self, x):
        return x.amax(dim=-1, keepdim=True)

    def cat_last(self, parts):
        return self.torch.cat(parts, dim=-1)

    def mask_future(self, scores):
        T = scores.shape[-1]
        future = self.torch.triu(self.torch.ones(T, T, dtype=self.torch.bool, device=self.device), diagonal=1)
        return scores.masked_fill(future, float("-inf"))

    def exp(self, x):
        return self.torch.exp(x)

    def log(self, x):
        return self.torch.log(x)

    def sqrt(self, x):
        return self.torch.sqrt(x)

    def cos(self, x):
        return self.torch.cos(x)

    def sin(self, x):
        return self.torch.sin(x)

    def to_list(self, x):
        return x.detach().cpu().tolist()

    def quiet(self):
        return contextlib.nullcontext()


class NumpyBackend:
    def __init__(self, fp64):
        import numpy
        self.np = numpy
        self.dtype = numpy.float64 if fp64 else numpy.float32

    def read_model(self, path):
        """The safetensors layout (docs/format.md) read directly: 8-byte header length, JSON header, data."""
        np = self.np
        data = np.memmap(path, dtype=np.uint8, mode="r")
        (header_len,) = struct.unpack("<Q", bytes(data[:8]))
        header = json.loads(bytes(data[8:8 + header_len]).decode("utf-8"))
        metadata = header.pop("__metadata__", {})
        dtypes = {"F16": np.float16, "F32": np.float32, "U8": np.uint8, "I32": np.int32, "BF16": np.uint16}
        tensors = {}
        for name, entry in header.items():
            begin, end = entry["data_offsets"]
            raw = np.array(data[8 + header_len + begin:8 + header_len + end])  # a copy: aligned, writable
            array = raw.view(dtypes[entry["dtype"]]).reshape(entry["shape"])
            if entry["dtype"] == "BF16":  # BF16 is the top half of an FP32
                array = (array.astype(np.uint32) << 16).view(np.float32)
            tensors[name] = array
        return metadata, tensors

    def to_f32(self, x):
        return x.astype(self.np.float32)

    def to_compute(self, x):
        return x.astype(self.dtype)

    def to_f64(self, x):
        return x.astype(self.np.float64)

    def nibbles(self, q):
        return self.np.stack([q & 15, q >> 4], axis=-1).reshape(q.shape[0], -1)

    def rows(self, table, ids):
        return table[self.np.asarray(ids, dtype=self.np.int64)]

    def pick(self, x, ids):
        return x[self.np.arange(len(ids)), self.np.asarray(ids, dtype=self.np.int64)]

    def positions_f64(self, n):
        return self.np.arange(n, dtype=self.np.float64)

    def mean_last(self, x):
        return x.mean(axis=-1, keepdims=True)

    def sum_last(self, x):
        return x.sum(axis=-1, keepdims=True)

    def max_last(self, x):
        return x.max(axis=-1, keepdims=True)

    def cat_last(self, parts):
        return self.np.concatenate(parts, axis=-1)

    def mask_future(self, scores):
        T = scores.shape[-1]
        future = self.np.triu(self.np.ones((T, T), dtype=bool), k=1)
        return self.np.where(future, -self.np.inf, scores).astype(scores.dtype)

    def exp(self, x):
        return self.np.exp(x)

    def log(self, x):
        return self.np.log(x)

    def sqrt(self, x):
        return self.np.sqrt(x)

    def cos(self, x):
        return self.np.cos(x)

    def sin(self, x):
        return self.np.sin(x)

    def to_list(self, x):
        return x.tolist()

    def quiet(self):
        # exp(-x) overflows to inf for very negative x in SiLU; x / inf = -0 is the right limit.
        return self.np.errstate(over="ignore")


# ---- The model -------------------------------------------------------------------------------------------------------

BLOCK_LINEARS = ("attn_qkv", "attn_out", "mlp_gate", "mlp_up", "mlp_down")


class Model:
    """Config and weights. Every linear is W transposed, [N, K] like a Linear weight: dequantized as q * s + z in FP32
    (q * s is exact, 4 x 11 significant bits, then one rounding when z is added), or exactly in FP64 with `exact`,
    then passed through `finish` (the cast to the compute dtype)."""

    def __init__(self, path, xp, finish, exact=False):
        metadata, tensors = xp.read_model(path)
        if metadata.get("format") != "tinyloop":
            raise InputError(f"{path}: metadata 'format' is {metadata.get('format')!r}, not 'tinyloop'")
        # Version 2 adds linear biases, grouped K/V heads (n_kv_heads) and RoPE scaling, which this reference does not
        # compute: refused rather than misread.
        if metadata.get("format_version") != "1":
            raise InputError(f"{path}: format_version {metadata.get('format_version')!r}: this reference implements "
                             "version 1 only (no biases, n_kv_heads or rope_scaling)")
        self.config = c = json.loads(metadata["config"])
        self.D, self.H, self.hd = c["d_model"], c["n_heads"], c["head_dim"]
        self.A = self.H * self.hd
        self.vocab, self.max_seq, self.loops = c["vocab"], c["max_seq"], c["loops"]
        self.theta, self.eps = float(c["rope_theta"]), float(c["norm_eps"])
        widen = xp.to_f64 if exact else xp.to_f32

        def linear(prefix):
            if prefix + ".qweight" in tensors:
                q, s, z = (tensors[prefix + part] for part in (".qweight", ".scales", ".zeros"))
                n, groups, k = s.shape[0], s.shape[1], 2 * q.shape[1]
                # W[k, n] = q * s[n, g] + z[n, g] with g = k / group: codes viewed as [N, groups, group].
                codes = widen(xp.nibbles(q)).reshape(n, groups, k // groups)
                return finish((codes * widen(s)[:, :, None] + widen(z)[:, :, None]).reshape(n, k))
            if prefix + ".weight" in tensors:
                return finish(tensors[prefix + ".weight"])
            return None

        self.embed = tensors["embed.weight"]
        self.final_norm = tensors["final_norm.weight"]
        self.blocks = []
        for prefix in [f"pre.{i}." for i in range(c["pre"])] + ["loop."]:
            block = {name: linear(prefix + name) for name in BLOCK_LINEARS}
            missing = [name for name, w in block.items() if w is None]
            if missing:
                raise InputError(f"{path}: block '{prefix}' lacks {missing}")
            block["attn_norm"] = tensors[prefix + "attn_norm.weight"]
            block["mlp_norm"] = tensors[prefix + "mlp_norm.weight"]
            self.blocks.append(block)
        self.head = linear("head")  # None: tied to the embedding
        self.head_kind = "tied" if self.head is None else ("INT4" if "head.qweight" in tensors else "dense")
        self.group = c["group_size"]

    def block_sequence(self):
        """Pre blocks once each, then the looped block `loops` times."""
        return self.blocks[:-1] + [self.blocks[-1]] * self.loops

    def describe(self):
        c = self.config
        return (f"D {self.D}, {self.H}x{self.hd} heads, FFN {c['ffn']}, V {self.vocab}, {c['pre']} pre + loop x "
                f"{self.loops}, max_seq {self.max_seq}, {'per-row' if self.group == 0 else f'group {self.group}'}, "
                f"head {self.head_kind}")


# ---- The reference forward pass --------------------------------------------------------------------------------------

class Reference:
    def __init__(self, path, xp, exact_fp64):
        self.xp = xp
        self.m = m = Model(path, xp, xp.to_compute, exact_fp64)
        self.embed = xp.to_compute(m.embed)
        self.head = self.embed if m.head is None else m.head
        self.final_norm = xp.to_compute(m.final_norm)
        for block in m.blocks:
            block["attn_norm"] = xp.to_compute(block["attn_norm"])
            block["mlp_norm"] = xp.to_compute(block["mlp_norm"])

    def rmsnorm(self, x, gain):
        xp = self.xp
        return x / xp.sqrt(xp.mean_last(x * x) + self.m.eps) * gain

    def rope(self, x, cos, sin):
        """Rotate-half RoPE on x [T, H, hd]; cos and sin are [T, 1, hd/2]."""
        half = self.m.hd // 2
        a, b = x[..., :half], x[..., half:]
        return self.xp.cat_last([a * cos - b * sin, a * sin + b * cos])

    def rope_tables(self, T):
        """cos and sin of pos * theta^(-2i/hd), computed in float64, then rounded to the compute precision."""
        xp, m = self.xp, self.m
        i = xp.positions_f64(m.hd // 2)
        inv_freq = m.theta ** (-2.0 * i / m.hd)
        angle = xp.positions_f64(T)[:, None] * inv_freq[None, :]
        return (xp.to_compute(xp.cos(angle))[:, None, :], xp.to_compute(xp.sin(angle))[:, None, :])

    def block(self, x, blk, cos, sin):
        xp, m = self.xp, self.m
        T = x.shape[0]
        qkv = self.rmsnorm(x, blk["attn_norm"]) @ blk["attn_qkv"].T  # [T, 3A]: columns [q | k | v], head-major
        q = self.rope(qkv[:, :m.A].reshape(T, m.H, m.hd), cos, sin).swapaxes(0, 1)  # [H, T, hd]
        k = self.rope(qkv[:, m.A:2 * m.A].reshape(T, m.H, m.hd), cos, sin).swapaxes(0, 1)
        v = qkv[:, 2 * m.A:].reshape(T, m.H, m.hd).swapaxes(0, 1)
        scores = xp.mask_future((q @ k.swapaxes(-1, -2)) / math.sqrt(m.hd))  # [H, T, T]
        p = xp.exp(scores - xp.max_last(scores))
        p = p / xp.sum_last(p)
        attn = (p @ v).swapaxes(0, 1).reshape(T, m.A)  # heads concatenated, head-major
        x = x + attn @ blk["attn_out"].T
        u = self.rmsnorm(x, blk["mlp_norm"])
        gate, up = u @ blk["mlp_gate"].T, u @ blk["mlp_up"].T
        return x + (gate / (1 + xp.exp(-gate)) * up) @ blk["mlp_down"].T

    def window_nll(self, tokens):
        """The NLL of tokens[1:] given their prefixes in this window, as a list of floats."""
        xp = self.xp
        T = len(tokens)
        cos, sin = self.rope_tables(T)
        with xp.quiet():
            x = xp.rows(self.embed, tokens)
            for blk in self.m.block_sequence():
                x = self.block(x, blk, cos, sin)
            h = self.rmsnorm(x, self.final_norm)
            nll = []
            for c0 in range(0, T - 1, HEAD_CHUNK_ROWS):
                c1 = min(c0 + HEAD_CHUNK_ROWS, T - 1)
                logits = xp.to_f64(h[c0:c1] @ self.head.T)  # [c, V]; the log-softmax in float64
                top = xp.max_last(logits)
                lse = top + xp.log(xp.sum_last(xp.exp(logits - top)))
                nll += xp.to_list(lse[:, 0] - xp.pick(logits, tokens[c0 + 1:c1 + 1]))
        return nll

    def score(self, tokens, window):
        nll = []
        for begin, end in windows(len(tokens), window):
            nll += self.window_nll(tokens[begin:end])
        return nll


# ---- The FP16 speed peer ---------------------------------------------------------------------------------------------

IGNORE = -100  # F.cross_entropy's ignore_index: the label of every position whose next token is not scored
PACK_ALIGN = 128  # a packed row holds the longest document rounded up to this many tokens (tensor-core tiles)
COMPILE_MODES = {"none": [None], "default": ["default"], "max-autotune-no-cudagraphs": ["max-autotune-no-cudagraphs"],
                 "both": [None, "max-autotune-no-cudagraphs"]}  # None: eager


class Fp16Peer:
    """The model as a plain FP16 PyTorch model that scores one batch of equal-length rows per forward pass."""

    def __init__(self, path, xp):
        torch = xp.torch
        self.xp, self.torch, self.F = xp, torch, torch.nn.functional
        self.m = m = Model(path, xp, lambda w: w.to(torch.float16))
        self.embed = m.embed.to(torch.float16)
        self.head = self.embed if m.head is None else m.head
        self.final_norm = m.final_norm.to(torch.float32)
        for block in m.blocks:
            block["attn_norm"] = block["attn_norm"].to(torch.float32)
            block["mlp_norm"] = block["mlp_norm"].to(torch.float32)
        def nbytes(tensors):  # a tensor used twice (a tied head) counts once
            return sum({t.data_ptr(): t.numel() * t.element_size() for t in tensors}.values())

        linears = [b[name] for b in m.blocks for name in BLOCK_LINEARS] + ([] if m.head is None else [self.head])
        self.linear_bytes = nbytes(linears)
        self.weight_bytes = nbytes(linears + [self.embed, self.final_norm] +
                                   [b[name] for b in m.blocks for name in ("attn_norm", "mlp_norm")])
        # RoPE for every position a sequence can hold (none is longer than max_seq): computed in float64, used in FP16.
        inv_freq = m.theta ** (-2.0 * torch.arange(m.hd // 2, dtype=torch.float64, device=xp.device) / m.hd)
        angle = torch.arange(m.max_seq, dtype=torch.float64, device=xp.device)[:, None] * inv_freq[None, :]
        self.cos, self.sin = angle.cos().to(torch.float16), angle.sin().to(torch.float16)  # [max_seq, hd/2]
        torch.cuda.empty_cache()  # the FP32 dequantization temporaries

    def rmsnorm(self, x, gain):
        x32 = x.to(self.torch.float32)
        return (x32 * self.torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.m.eps) * gain).to(self.torch.float16)

    def forward_nll(self, ids, labels, pos, doc):
        """The NLL sum of one pass, a 0-d FP32 tensor. ids [B, L]: token ids; labels [B, L - 1]: the token each
        position predicts, IGNORE where it is not scored; pos [1 or B, L]: each token's position in its sequence;
        doc: None when each row is one sequence (plain causal attention), else [B, L] sequence ids within each row
        (packed rows: attention stays inside each sequence)."""
        F, m, torch = self.F, self.m, self.torch
        B, L = ids.shape
        cos, sin = self.cos[pos][:, None], self.sin[pos][:, None]  # [1 or B, 1, L, hd/2]
        half = m.hd // 2

        def rope(x):  # [B, H, L, hd]
            a, b = x[..., :half], x[..., half:]
            return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)

        mask = None
        if doc is not None:  # [B, 1, L(query), L(key)]: the same sequence, and not after the query
            mask = ((doc[:, :, None] == doc[:, None, :]) & (pos[:, None, :] <= pos[:, :, None]))[:, None]
        x = self.embed[ids]  # [B, L, D]
        for blk in m.block_sequence():
            qkv = F.linear(self.rmsnorm(x, blk["attn_norm"]), blk["attn_qkv"]).view(B, L, 3, m.H, m.hd)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # [B, H, L, hd] each
            attn = F.scaled_dot_product_attention(rope(q), rope(k), v, attn_mask=mask, is_causal=mask is None)
            x = x + F.linear(attn.transpose(1, 2).reshape(B, L, m.A), blk["attn_out"])
            u = self.rmsnorm(x, blk["mlp_norm"])
            x = x + F.linear(F.silu(F.linear(u, blk["mlp_gate"])) * F.linear(u, blk["mlp_up"]), blk["mlp_down"])
        # A row's last position predicts nothing inside the row: the head runs on the other L - 1.
        logits = F.linear(self.rmsnorm(x[:, :-1], self.final_norm), self.head)  # [B, L - 1, V] FP16
        return F.cross_entropy(logits.reshape(-1, m.vocab).float(), labels.reshape(-1), ignore_index=IGNORE,
                               reduction="sum")


def compiled_forward(torch, forward, mode):
    """`forward` under torch.compile: static shapes (each pass shape compiles once, in the warm-up run) and one graph
    (fullgraph: a graph break is an error, not an eager island inside a "compiled" timing)."""
    dynamo = importlib.import_module("torch._dynamo")
    # One compiled function serves every pass shape of every scenario; past Dynamo's recompile limit (8 by default;
    # its name changed across versions) the forward would silently run eagerly.
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(dynamo.config, name):
            setattr(dynamo.config, name, max(getattr(dynamo.config, name), 1024))
    return torch.compile(forward, mode=mode, dynamic=False, fullgraph=True)


class SpeedScenario:
    """What one timed variant scores: `sequences` (the windows of one token sequence, or independent documents), each
    scored from its second token on."""

    def __init__(self, kind, sequences, tokens_in, window):
        self.kind, self.sequences, self.tokens_in, self.window = kind, sequences, tokens_in, window
        self.scored = sum(len(s) - 1 for s in sequences)

    def describe(self):
        if self.kind == "tokens":
            n = len(self.sequences)
            return (f"{self.tokens_in} tokens in {n} windows of {self.window}" if n > 1 else
                    f"{self.tokens_in} tokens in one window (window {self.window})")
        lengths = [len(s) for s in self.sequences]
        return f"{len(lengths)} documents of {min(lengths)}-{max(lengths)} tokens, {self.tokens_in} in all"

    def layouts(self, compiled):
        if self.kind == "tokens":
            return ["padded"]
        # Padded passes differ in shape from one to the next (19 for tools/gpu/score_bench.sh's 256 documents of
        # 100-2000 tokens), and torch.compile(dynamic=False) compiles every shape anew, about a minute each under
        # max-autotune: compiled runs take the packed rows, whose passes all share one shape (the last one aside).
        return ["packed"] if compiled else ["padded", "packed"]


def padded_passes(lengths, budget):
    """One sequence per row, shortest first; a pass takes rows while they fit in `budget` tokens once padded to its
    longest (at least one row). [(row length, [[sequence index], ...]), ...]."""
    passes, rows = [], []
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        if rows and (len(rows) + 1) * lengths[i] > budget:
            passes.append((lengths[rows[-1][0]], rows))
            rows = []
        rows.append([i])
    passes.append((lengths[rows[-1][0]], rows))
    return passes


def packed_passes(lengths, budget):
    """Sequences packed first-fit decreasing into rows of the longest one rounded up to PACK_ALIGN tokens, budget //
    that many rows a pass (at least one). [(row length, [[sequence indices of a row], ...]), ...]."""
    length = -(-max(lengths) // PACK_ALIGN) * PACK_ALIGN
    rows = []  # [free tokens, [sequence indices]]
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        row = next((r for r in rows if r[0] >= lengths[i]), None)
        if row is None:
            row = [length, []]
            rows.append(row)
        row[0] -= lengths[i]
        row[1].append(i)
    per_pass = max(1, budget // length)
    return [(length, [r[1] for r in rows[k:k + per_pass]]) for k in range(0, len(rows), per_pass)]


def pass_tensors(torch, device, sequences, length, rows, packed):
    """forward_nll's arguments for one pass. Padding (token 0) follows the sequences of a row and is never scored;
    packed, each padding position is a sequence of its own (it attends to itself only: no query is left without a
    key, whose softmax would be NaN and would spread through the additive mask)."""
    B = len(rows)
    ids = torch.zeros(B, length, dtype=torch.long)
    labels = torch.full((B, length), IGNORE, dtype=torch.long)
    pos = torch.zeros(B, length, dtype=torch.long) if packed else torch.arange(length)[None]
    doc = -1 - torch.arange(length).repeat(B, 1) if packed else None
    for r, members in enumerate(rows):
        at = 0
        for slot, i in enumerate(members):
            seq = torch.tensor(sequences[i], dtype=torch.long)
            n = seq.shape[0]
            ids[r, at:at + n] = seq
            labels[r, at:at + n - 1] = seq[1:]
            if packed:
                pos[r, at:at + n] = torch.arange(n)
                doc[r, at:at + n] = slot
            at += n
    # No sequence ends past its row, so the last column holds no label.
    return tuple(None if t is None else t.to(device) for t in (ids, labels[:, :-1].contiguous(), pos, doc))


def build_passes(torch, device, scenario, layout, budget):
    lengths = [len(s) for s in scenario.sequences]
    plan = padded_passes(lengths, budget) if layout == "padded" else packed_passes(lengths, budget)
    passes = [pass_tensors(torch, device, scenario.sequences, length, rows, layout == "packed")
              for length, rows in plan]
    labelled = sum(int((p[1] != IGNORE).sum()) for p in passes)
    if labelled != scenario.scored:  # every scored token labelled exactly once
        raise AssertionError(f"{layout} passes label {labelled} positions, the scenario scores {scenario.scored}")
    return passes


def speed_scenarios(args, m):
    """The scenarios of --scenarios (by default: the token source in --window windows, and/or the --docs documents)."""
    has_source = any(v is not None for v in (args.random, args.tokens_from, args.token_ids))
    tokens = read_tokens(args, m.vocab) if has_source else None
    specs = args.scenarios or ([(len(tokens), args.window)] if has_source else []) + (["docs"] if args.docs else [])
    scenarios = []
    for spec in specs:
        if spec == "docs":
            if args.doc_max > m.max_seq:
                raise InputError(f"--doc-max {args.doc_max} exceeds max_seq = {m.max_seq}")
            docs = splitmix64_documents(args.docs, args.doc_min, args.doc_max, args.seed, m.vocab)
            scenarios.append(SpeedScenario("docs", docs, sum(map(len, docs)), 0))
            continue
        count, window = spec
        window = window or m.max_seq
        if not 2 <= window <= m.max_seq:
            raise InputError(f"window {window} is outside [2, max_seq = {m.max_seq}]")
        if count > len(tokens):
            raise InputError(f"scenario {count}:{spec[1]} needs {count} tokens, the token source gives {len(tokens)}")
        seq = tokens[:count]
        scenarios.append(SpeedScenario("tokens", [seq[b:e] for b, e in windows(count, window)], count, window))
    return scenarios


def time_variant(torch, forward, passes, reps):
    """(NLL sum, warm-up seconds, per-run milliseconds, peak bytes): one warm-up run over every pass (it compiles each
    pass shape under torch.compile, and picks cuBLAS and SDPA kernels), then `reps` runs timed with CUDA events."""
    def run():
        total = None
        for p in passes:
            nll = forward(*p)
            total = nll if total is None else total + nll
        return total

    started = time.perf_counter()
    nll_sum = float(run())
    warmup_s = time.perf_counter() - started
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return nll_sum, warmup_s, times, torch.cuda.max_memory_allocated()


def report(args, peer, sc, layout, mode, passes, nll_sum, warmup_s, times, peak):
    """One timed variant: a readable line, then its SPEED line (the format is in the docstring)."""
    name = "eager" if mode is None else "compiled"
    ms = statistics.median(times)
    tps = sc.scored / (ms / 1e3)
    shapes = collections.Counter(tuple(p[0].shape) for p in passes)  # in pass order
    plan = ", ".join(f"{count} x [{b}, {n}]" for (b, n), count in shapes.items())
    mean = nll_sum / sc.scored
    compiling = "" if mode is None else " (compiles every pass shape)"
    print(f"{name:<12} {sc.describe()}{'' if mode is None else ', ' + mode}, {layout}: {len(passes)} "
          f"pass{'es' if len(passes) > 1 else ''} ({plan}); median {ms:.3f} ms of {args.reps} (min {min(times):.3f}, "
          f"max {max(times):.3f}); {tps:.1f} tokens/s over {sc.scored} scored; NLL {mean:.6f} nats/token (perplexity "
          f"{perplexity_text(mean)}); warm-up {warmup_s:.1f} s{compiling}; peak {peak / 2**20:.0f} MiB")
    print(f"SPEED,{name},{sc.kind},{sc.tokens_in},{sc.window},{ms:.4f},{tps:.1f},{peer.weight_bytes},"
          f"{peer.linear_bytes},{peak},{layout},{len(sc.sequences)},{len(passes)},{sc.scored},{nll_sum:.6f},"
          f"{mode or '-'},{warmup_s:.2f}", flush=True)


def run_speed(args, xp):
    torch = xp.torch
    # no_grad, not inference_mode: torch.compile has had bugs with inference tensors as inputs (pytorch issues 135892,
    # 169477), and for kernels this large the two run equally fast.
    with torch.no_grad():
        peer = Fp16Peer(args.model, xp)
        m = peer.m
        scenarios = speed_scenarios(args, m)
        print(f"model        {args.model}: {m.describe()}")
        print(f"peer         PyTorch {torch.__version__} FP16, F.linear + scaled_dot_product_attention, "
              f"{torch.cuda.get_device_name(xp.device)}; at most {args.batch_tokens} tokens a pass")
        print(f"weights      {peer.weight_bytes} bytes FP16 ({peer.weight_bytes / 2**20:.1f} MiB; tied head counted "
              f"once), of which linear layers {peer.linear_bytes} ({peer.linear_bytes / 2**20:.1f} MiB); "
              f"{torch.cuda.memory_allocated() / 2**20:.1f} MiB allocated after load", flush=True)
        built = {}  # (scenario index, layout) -> passes, shared by the eager and compiled runs
        # Eager first, every scenario: cheap, and its lines are out before any compilation starts.
        for mode in COMPILE_MODES[args.compile]:
            forward = peer.forward_nll if mode is None else compiled_forward(torch, peer.forward_nll, mode)
            for index, sc in enumerate(scenarios):
                for layout in sc.layouts(compiled=mode is not None):
                    if (index, layout) not in built:
                        built[index, layout] = build_passes(torch, xp.device, sc, layout, args.batch_tokens)
                    passes = built[index, layout]
                    nll_sum, warmup_s, times, peak = time_variant(torch, forward, passes, args.reps)
                    report(args, peer, sc, layout, mode, passes, nll_sum, warmup_s, times, peak)
    return 0


# ---- Comparison with `tinyloop score --per-token` ----------------------------------------------------------------

def read_per_token(path):
    rows = []
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            parts = line.split("\t")
            if len(parts) != 3:
                raise InputError(f"{path}:{line_no}: expected position<TAB>token<TAB>nll")
            try:
                rows.append((int(parts[0]), int(parts[1]), float(parts[2])))
            except ValueError:
                raise InputError(f"{path}:{line_no}: not numbers: {line.strip()!r}")
    return rows


def compare(path, tokens, ours, ppl_tol, nll_tol):
    theirs = read_per_token(path)
    if len(theirs) != len(ours):
        raise InputError(f"{path} has {len(theirs)} positions, this run scored {len(ours)}")
    for i, (position, token, _) in enumerate(theirs):
        if position != i + 1 or token != tokens[i + 1]:
            raise InputError(f"{path}: line {i + 1} is position {position} token {token}; expected position {i + 1} "
                             f"token {tokens[i + 1]} (were both runs given the same tokens?)")
    diffs = [abs(t[2] - o) for t, o in zip(theirs, ours)]
    worst = max(range(len(diffs)), key=diffs.__getitem__)
    n = len(ours)
    ours_mean, theirs_mean = math.fsum(ours) / n, math.fsum(t[2] for t in theirs) / n
    rel_ppl = math.expm1(theirs_mean - ours_mean)
    ok = abs(rel_ppl) <= ppl_tol and diffs[worst] <= nll_tol
    print(f"compare      {path}: {n} positions")
    print(f"  NLL/token  theirs {theirs_mean:.6f}, ours {ours_mean:.6f}")
    print(f"  |dNLL|     max {diffs[worst]:.3g} (position {worst + 1}: theirs {theirs[worst][2]:.6f}, ours "
          f"{ours[worst]:.6f}), mean {math.fsum(diffs) / n:.3g}   (tolerance {nll_tol} nats)")
    print(f"  PPL        theirs / ours - 1 = {100 * rel_ppl:+.4f}%   (tolerance {100 * ppl_tol:.3g}%)")
    print(f"COMPARE {'PASS' if ok else 'FAIL'} {path}")
    return ok


# ---- Main ------------------------------------------------------------------------------------------------------------

def parse_scenarios(text):
    """--scenarios: a comma-separated list of T:W (T tokens in W-token windows, W 0 = max_seq) and docs."""
    specs = []
    for item in text.split(","):
        if item == "docs":
            specs.append(item)
            continue
        try:
            count, window = (int(part) for part in item.split(":"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{item}' is neither T:W (two integers) nor docs")
        if count < 2 or window < 0:
            raise argparse.ArgumentTypeError(f"'{item}': T must be >= 2 and W >= 0")
        specs.append((count, window))
    return specs


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="the .tinyloop file")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--tokens-from", metavar="TEXT", help="a text file; each byte is a token")
    src.add_argument("--token-ids", metavar="FILE", help="a file of whitespace-separated token ids")
    src.add_argument("--random", metavar="N", type=int, help="N pseudo-random tokens (splitmix64, see --seed)")
    p.add_argument("--seed", type=int, default=1, help="seed of --random and --docs (default 1)")
    p.add_argument("--max-tokens", type=int, default=0, help="use at most this many tokens (0 = all)")
    p.add_argument("--window", type=int, default=0, help="window length, 2..max_seq (default max_seq)")
    p.add_argument("--fp64", action="store_true", help="reference in float64 instead of float32")
    p.add_argument("--device", default="cuda", help="torch device (default cuda)")
    p.add_argument("--backend", choices=["torch", "numpy"], default="torch",
                   help="torch (default) or numpy: the reference on the CPU without torch, for smoke tests")
    p.add_argument("--per-token-out", metavar="F", help="write position<TAB>token<TAB>nll per line")
    p.add_argument("--compare", metavar="F", nargs="+", default=[],
                   help="`tinyloop score --per-token` files to check against this run, each on its own")
    p.add_argument("--ppl-tol", type=float, default=0.0025, help="relative perplexity tolerance (default 0.0025)")
    p.add_argument("--nll-tol", type=float, default=0.05, help="per-position NLL tolerance in nats (default 0.05)")
    p.add_argument("--speed", action="store_true", help="time the FP16 speed peer instead of the reference")
    p.add_argument("--reps", type=int, default=5, help="timed runs of --speed, at least 5 (default 5)")
    speed = p.add_argument_group("--speed only")
    speed.add_argument("--docs", metavar="N", type=int, default=0,
                       help="N pseudo-random documents (splitmix64, see --seed and the docstring)")
    speed.add_argument("--doc-min", type=int, default=100, help="shortest document, tokens (default 100)")
    speed.add_argument("--doc-max", type=int, default=2000, help="longest document, tokens (default 2000)")
    speed.add_argument("--scenarios", type=parse_scenarios,
                       help="T:W,...,docs: T tokens of the token source in W-token windows (0 = max_seq), and the "
                            "--docs documents (default: the token source in --window windows, and/or docs)")
    speed.add_argument("--batch-tokens", type=int, default=16384,
                       help="tokens per forward pass, padding included (default 16384; one row at least)")
    speed.add_argument("--compile", choices=list(COMPILE_MODES), default="none",
                       help="none (eager, default), default or max-autotune-no-cudagraphs (torch.compile mode), "
                            "both (eager, then max-autotune-no-cudagraphs)")
    args = p.parse_args(argv)
    has_source = any(v is not None for v in (args.random, args.tokens_from, args.token_ids))
    if args.random is not None and args.random < 2:
        p.error("--random needs N >= 2")
    if not args.speed:
        if not has_source:
            p.error("one of the arguments --tokens-from --token-ids --random is required")
        if args.docs or args.scenarios or args.compile != "none":
            p.error("--docs, --scenarios and --compile belong to --speed")
    if args.speed:
        if args.backend != "torch" or args.compare or args.per_token_out or args.fp64:
            p.error("--speed runs the torch FP16 peer alone (no --backend numpy, --compare, --per-token-out, --fp64)")
        if not args.device.startswith("cuda"):
            p.error("--speed times on a CUDA device")
        if not has_source and not args.docs:
            p.error("--speed needs tokens (--tokens-from, --token-ids or --random) or --docs N")
        if args.scenarios and args.window:
            p.error("--window applies without --scenarios; with it, each T:W gives its window")
        if args.scenarios and (("docs" in args.scenarios) != bool(args.docs) or
                               any(s != "docs" for s in args.scenarios) != has_source):
            p.error("--scenarios: docs goes with --docs N, and T:W with a token source, each with the other")
        if args.docs < 0 or not 2 <= args.doc_min <= args.doc_max:
            p.error("--docs needs N >= 0 and 2 <= --doc-min <= --doc-max")
        if args.batch_tokens < 1:
            p.error("--batch-tokens must be positive")
    if args.reps < 5:
        p.error("--reps must be at least 5")
    return args


def main(argv):
    args = parse_args(argv)
    try:
        xp = NumpyBackend(args.fp64) if args.backend == "numpy" else TorchBackend(args.device, args.fp64)
        if args.speed:
            return run_speed(args, xp)
        started = time.perf_counter()
        if args.backend == "torch":
            xp.torch.set_grad_enabled(False)
        ref = Reference(args.model, xp, args.fp64)
        m = ref.m
        window = args.window or m.max_seq
        if not 2 <= window <= m.max_seq:
            raise InputError(f"--window {window} is outside [2, max_seq = {m.max_seq}]")
        tokens = read_tokens(args, m.vocab)
        loaded = time.perf_counter()
        nll = ref.score(tokens, window)
        done = time.perf_counter()
        total, scored = math.fsum(nll), len(nll)
        print(f"model        {args.model}: {m.describe()}")
        print(f"reference    {args.backend} {'float64' if args.fp64 else 'float32'}"
              f"{' on ' + str(xp.device) if args.backend == 'torch' else ''}; load {loaded - started:.1f} s, "
              f"score {done - loaded:.1f} s")
        print(f"tokens       {scored} scored ({len(tokens)} in, window {window}, "
              f"{len(windows(len(tokens), window))} windows)")
        print(f"nll          total {total:.6f}, {total / scored:.6f} nats/token")
        print(f"perplexity   {perplexity_text(total / scored)}")
        if args.per_token_out:
            with open(args.per_token_out, "w") as f:
                for i, value in enumerate(nll):
                    f.write(f"{i + 1}\t{tokens[i + 1]}\t{value:.9g}\n")
        results = [compare(path, tokens, nll, args.ppl_tol, args.nll_tol) for path in args.compare]
        return 0 if all(results) else 1
    except (InputError, ImportError, OSError, KeyError, ValueError) as e:
        print(f"torch_reference.py: {type(e).__name__}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
