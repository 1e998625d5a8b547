#!/usr/bin/env python3
"""An independent PyTorch implementation of the TinyLoop architecture, and its FP16 speed peer.

Written from docs/architecture.md and docs/format.md alone (no code shared with the library), it reads a
.tinyloop file (a safetensors file) and scores tokens:

  reference (default)  weights dequantized exactly, W = q*s + z in FP32 from the FP16 s and z (in FP64 with --fp64),
                       every activation in FP32 (FP64 with --fp64) on the GPU, TF32 off; attention written out
                       (scores, causal mask, softmax, weighted sum); log-softmax and the NLL sum in float64. Prints
                       the total NLL, tokens scored and perplexity; --per-token-out writes each position's NLL;
                       --compare checks files from `tinyloop score --per-token` against it, each on its own.
  --speed              the same model as a plain FP16 PyTorch model: dequantized FP16 weights used like nn.Linear
                       (F.linear), FP16 activations with RMSNorm computed in FP32, RoPE, and
                       F.scaled_dot_product_attention(is_causal=True); full [T, V] FP16 logits and F.cross_entropy.
                       Times scoring with CUDA events (one warm-up, median of --reps >= 5) and prints tokens/s, the
                       FP16 weights' bytes and torch.cuda.max_memory_allocated.
  --backend numpy      the reference math on the CPU with numpy and no torch or safetensors package (a small
                       reader of the format stands in for safe_open): for smoke tests on machines without them.

Windows follow docs/architecture.md: windows of --window tokens (default the model's max_seq) overlapping by one
token, positions restarting at 0 in each; token i + 1's NLL is reported at position i + 1.

Tokens: --tokens-from TEXT (its bytes, like `tinyloop score --text`), --token-ids FILE (whitespace-separated ids,
like `tinyloop score --tokens`), or --random N: output i of splitmix64 seeded with --seed, modulo the vocabulary
(the same sequence as bench/score_bench.cpp with that seed). --max-tokens cuts any of them.

--compare tolerance (documented for issue 4's cross-check; exit status 1 when any file is beyond it):
  relative perplexity difference |exp(mean NLL_theirs - mean NLL_ours) - 1| <= --ppl-tol (default 0.0025 = 0.25%)
  and per-position |NLL_theirs - NLL_ours| <= --nll-tol nats (default 0.05).
The GPU path computes in FP16 with FP32 accumulation, ten block applications deep on the 2B preset; the CLI writes
NLLs with 6 significant digits (about 1e-5 nats at NLL ~ 11), far below both bounds.

Exit status: 0 success, 1 comparison beyond tolerance, 2 bad arguments or inputs.

Examples:
  python3 tools/torch_reference.py model.tinyloop --random 1024 --seed 1 --compare tl.tsv
  python3 tools/torch_reference.py model.tinyloop --random 4096 --seed 1 --speed
  python3 tools/torch_reference.py model.tinyloop --tokens-from text.txt --max-tokens 300 --backend numpy
"""

import argparse
import contextlib
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

def splitmix64_tokens(count, seed, vocab):
    state, tokens = seed & MASK64, []
    for _ in range(count):
        state = (state + 0x9E3779B97F4A7C15) & MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        tokens.append((z ^ (z >> 31)) % vocab)
    return tokens


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

class Fp16Peer:
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
        torch.cuda.empty_cache()  # the FP32 dequantization temporaries
        self.tables = {}

    def rmsnorm(self, x, gain):
        x32 = x.to(self.torch.float32)
        return (x32 * self.torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.m.eps) * gain).to(self.torch.float16)

    def rope_tables(self, T):
        if T not in self.tables:
            torch, m = self.torch, self.m
            inv_freq = m.theta ** (-2.0 * torch.arange(m.hd // 2, dtype=torch.float64, device=self.xp.device) / m.hd)
            angle = torch.arange(T, dtype=torch.float64, device=self.xp.device)[:, None] * inv_freq[None, :]
            self.tables[T] = (angle.cos().to(torch.float16)[None, :, :], angle.sin().to(torch.float16)[None, :, :])
        return self.tables[T]

    def window_nll_sum(self, tokens):
        """tokens: a device tensor of T ids. Returns the window's NLL sum as a 0-d FP32 tensor."""
        F, m, torch = self.F, self.m, self.torch
        T = tokens.shape[0]
        cos, sin = self.rope_tables(T)
        half = m.hd // 2

        def rope(x):  # [H, T, hd]
            a, b = x[..., :half], x[..., half:]
            return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)

        x = self.embed[tokens]
        for blk in m.block_sequence():
            qkv = F.linear(self.rmsnorm(x, blk["attn_norm"]), blk["attn_qkv"]).view(T, 3, m.H, m.hd)
            q, k, v = (qkv[:, i].transpose(0, 1) for i in range(3))  # [H, T, hd]
            attn = F.scaled_dot_product_attention(rope(q)[None], rope(k)[None], v[None], is_causal=True)
            x = x + F.linear(attn[0].transpose(0, 1).reshape(T, m.A), blk["attn_out"])
            u = self.rmsnorm(x, blk["mlp_norm"])
            x = x + F.linear(F.silu(F.linear(u, blk["mlp_gate"])) * F.linear(u, blk["mlp_up"]), blk["mlp_down"])
        logits = F.linear(self.rmsnorm(x, self.final_norm), self.head)
        return F.cross_entropy(logits[:-1].float(), tokens[1:], reduction="sum")

    def score(self, tokens, window):
        total = self.torch.zeros((), dtype=self.torch.float32, device=self.xp.device)
        for begin, end in windows(tokens.shape[0], window):
            total = total + self.window_nll_sum(tokens[begin:end])
        return total


def run_speed(args, xp):
    torch = xp.torch
    if xp.device.type != "cuda":
        raise InputError("--speed times on a CUDA device")
    with torch.inference_mode():
        peer = Fp16Peer(args.model, xp)
        m = peer.m
        tokens = read_tokens(args, m.vocab)
        window = args.window or m.max_seq
        if not 2 <= window <= m.max_seq:
            raise InputError(f"--window {window} is outside [2, max_seq = {m.max_seq}]")
        ids = torch.tensor(tokens, dtype=torch.long, device=xp.device)
        loaded = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        nll_sum = float(peer.score(ids, window))  # warm-up (cuBLAS handles, SDPA kernel choice)
        torch.cuda.synchronize()
        times = []
        for _ in range(args.reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            peer.score(ids, window)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        peak = torch.cuda.max_memory_allocated()
    scored = len(tokens) - 1
    ms = statistics.median(times)
    print(f"model        {args.model}: {m.describe()}")
    print(f"peer         PyTorch {torch.__version__} FP16, F.linear + scaled_dot_product_attention(is_causal=True), "
          f"{torch.cuda.get_device_name(xp.device)}")
    print(f"tokens       {scored} scored ({len(tokens)} in, window {window}, {len(windows(len(tokens), window))} "
          f"windows)")
    print(f"time         median {ms:.3f} ms of {args.reps} (min {min(times):.3f}, max {max(times):.3f})")
    print(f"tokens/s     {scored / (ms / 1e3):.1f}")
    print(f"nll          {nll_sum / scored:.6f} nats/token (FP16 peer; perplexity {perplexity_text(nll_sum / scored)})")
    print(f"weights      {peer.weight_bytes} bytes FP16 ({peer.weight_bytes / 2**20:.1f} MiB; tied head counted once), "
          f"of which linear layers {peer.linear_bytes} ({peer.linear_bytes / 2**20:.1f} MiB)")
    print(f"memory       {loaded / 2**20:.1f} MiB allocated after load, "
          f"max_memory_allocated {peak / 2**20:.1f} MiB while scoring")
    print(f"SPEED,{args.model},{len(tokens)},{window},{ms:.4f},{scored / (ms / 1e3):.1f},{peer.weight_bytes},"
          f"{peer.linear_bytes},{peak}")
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

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="the .tinyloop file")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--tokens-from", metavar="TEXT", help="a text file; each byte is a token")
    src.add_argument("--token-ids", metavar="FILE", help="a file of whitespace-separated token ids")
    src.add_argument("--random", metavar="N", type=int, help="N pseudo-random tokens (splitmix64, see --seed)")
    p.add_argument("--seed", type=int, default=1, help="seed of --random (default 1)")
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
    args = p.parse_args(argv)
    if args.random is not None and args.random < 2:
        p.error("--random needs N >= 2")
    if args.speed and (args.backend != "torch" or args.compare or args.per_token_out or args.fp64):
        p.error("--speed runs the torch FP16 peer alone (no --backend numpy, --compare, --per-token-out, --fp64)")
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
