#!/usr/bin/env python3
"""Kernel-time breakdown of tl_score on the GPU, through CUPTI (torch.profiler sees this library's kernels when it
is loaded into the same process with ctypes).

Usage (on the GPU machine, after a CUDA build):
  python3 tools/gpu/score_profile.py LIBTINYLOOP MODEL [--tokens 4096] [--window 0] [--seed 1] [--reps 3] [--top 12]
                                     [--activations fp16|int8]

Scores --tokens splitmix64 tokens (seed --seed, modulo the vocabulary: the sequence tl_score_bench and
tools/torch_reference.py --random make) in --window windows (0 = the model's max_seq) with CUDA graphs off, so that
every launch is its own profiler event: one warm-up call, then --reps profiled calls. Prints a Markdown table of GPU
time per kernel category (summed over the profiled calls, divided by --reps), then the --top kernels by time, and
the wall time of one call. Categories group kernels by name (cuBLAS GEMM, dequantize, attention, ...; see CATEGORIES).
"""

import argparse
import ctypes
import re
import sys
import time

MASK64 = (1 << 64) - 1
ACTIVATIONS = {"fp16": 0, "int8": 1, "fp8": 2}  # TL_ACTIVATIONS_*

# (category, regex over the kernel's name), first match wins.
CATEGORIES = [
    ("attention", r"attention"),
    ("INT8 tensor-core GEMM (W4A8, W8A8)", r"int8_gemm"),
    ("INT4 GEMM (Marlin-class)", r"marlin|wgmma"),
    ("INT4 GEMM (native)", r"native_int4"),
    ("dequantize (for cuBLAS)", r"dequant"),
    ("FP16 GEMM (cuBLAS)", r"nvjet|cutlass|gemm|sm90_xmma|s1688|s16816"),
    ("RMSNorm + residual", r"rmsnorm"),
    ("SwiGLU", r"swiglu"),
    ("quantize rows to INT8", r"quantize"),
    ("RoPE", r"rope"),
    ("head log-softmax NLL", r"nll"),
    ("embedding", r"embed"),
]


class ScoreOptions(ctypes.Structure):  # tl_score_options, fifth version
    _fields_ = [
        ("struct_size", ctypes.c_uint32), ("backend", ctypes.c_int32), ("n_threads", ctypes.c_int32),
        ("window", ctypes.c_int32), ("progress", ctypes.c_void_p), ("progress_user_data", ctypes.c_void_p),
        ("token_nll", ctypes.c_void_p), ("token_nll_len", ctypes.c_size_t), ("device", ctypes.c_int32),
        ("stream", ctypes.c_void_p), ("use_graphs", ctypes.c_int32), ("max_memory_bytes", ctypes.c_uint64),
        ("top_k", ctypes.c_int32), ("top_ids", ctypes.c_void_p), ("top_logprobs", ctypes.c_void_p),
        ("top_len", ctypes.c_size_t), ("empty_context_bos", ctypes.c_int32), ("activations", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
    ]


class ScoreResult(ctypes.Structure):  # tl_score_result
    _fields_ = [
        ("struct_size", ctypes.c_uint32), ("nll_sum", ctypes.c_double), ("tokens_scored", ctypes.c_uint64),
        ("perplexity", ctypes.c_double), ("backend", ctypes.c_int32), ("n_windows", ctypes.c_int32),
        ("seconds", ctypes.c_double),
    ] + [(name, ctypes.c_uint64) for name in ("gemm_marlin_fused", "gemm_marlin_correction", "gemm_dequant_cublas",
                                              "gemm_fp16_body", "gemm_native", "gemm_dense_cublas", "gemm_fallbacks")]


class ModelProperties(ctypes.Structure):  # tl_model_properties' leading fields, room for the rest
    _fields_ = [("struct_size", ctypes.c_uint32)] + [(n, ctypes.c_int32) for n in (
        "format_version", "d_model", "n_heads", "head_dim", "ffn", "vocab")] + [("rest", ctypes.c_byte * 256)]


def short_name(kernel):
    """A kernel's name without its return type, anonymous namespaces and argument list."""
    name = kernel.replace("(anonymous namespace)::", "").removeprefix("void ")
    if name.endswith(")"):  # drop the balanced (...) at the end: the arguments
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i]
                break
    return name[:90]


def splitmix64_tokens(count, seed, vocab):
    state, tokens = seed & MASK64, []
    for _ in range(count):
        state = (state + 0x9E3779B97F4A7C15) & MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        tokens.append((z ^ (z >> 31)) % vocab)
    return tokens


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("library")
    p.add_argument("model")
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--window", type=int, default=0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--activations", choices=ACTIVATIONS, default="fp16")
    args = p.parse_args()

    import torch  # imported after the arguments are checked: it takes seconds
    from torch.profiler import ProfilerActivity, profile

    lib = ctypes.CDLL(args.library)
    lib.tl_last_error_message.restype = ctypes.c_char_p

    def check(what, status):
        if status != 0:
            sys.exit(f"{what}: status {status}: {lib.tl_last_error_message().decode()}")

    model = ctypes.c_void_p()
    check("tl_model_load", lib.tl_model_load(args.model.encode(), None, ctypes.byref(model)))
    info = ModelProperties(struct_size=ctypes.sizeof(ModelProperties))  # any size from the first version on
    check("tl_model_info", lib.tl_model_info(model, ctypes.byref(info)))
    vocab = info.vocab
    tokens = (ctypes.c_int32 * args.tokens)(*splitmix64_tokens(args.tokens, args.seed, vocab))
    options = ScoreOptions(struct_size=ctypes.sizeof(ScoreOptions), backend=2, window=args.window, use_graphs=0,
                           empty_context_bos=-1, activations=ACTIVATIONS[args.activations])
    result = ScoreResult(struct_size=ctypes.sizeof(ScoreResult))

    def score():
        check("tl_score", lib.tl_score(model, tokens, args.tokens, ctypes.byref(options), ctypes.byref(result)))

    score()  # packs the model, allocates buffers, loads kernels
    torch.cuda.synchronize()
    start = time.perf_counter()
    score()
    wall_ms = (time.perf_counter() - start) * 1e3
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.reps):
            score()
        torch.cuda.synchronize()

    kernels = {}
    for e in prof.key_averages():
        if e.device_type is not None and "CUDA" in str(e.device_type) and e.self_device_time_total > 0:
            name = e.key
            if name.startswith(("Memcpy", "Memset", "cudaMemcpy")):
                continue
            t, n = kernels.get(name, (0.0, 0))
            kernels[name] = (t + e.self_device_time_total / 1e3 / args.reps, n + e.count // args.reps)
    total = sum(t for t, _ in kernels.values())
    by_category = {}
    for name, (t, n) in kernels.items():
        category = next((c for c, pattern in CATEGORIES if re.search(pattern, name, re.I)), "other")
        ct, cn = by_category.get(category, (0.0, 0))
        by_category[category] = (ct + t, cn + n)

    print(f"tl_score, {args.tokens} tokens, window {args.window or 'max_seq'}, {args.activations} activations, "
          f"graphs off, {result.n_windows} windows; "
          f"{total:.2f} ms of GPU time per call, {wall_ms:.2f} ms wall (one unprofiled call); "
          f"{torch.cuda.get_device_name()}\n")
    print("| category | ms per call | share | launches |")
    print("|---|---:|---:|---:|")
    for category, (t, n) in sorted(by_category.items(), key=lambda kv: -kv[1][0]):
        print(f"| {category} | {t:.3f} | {100 * t / total:.1f}% | {n} |")
    print(f"\nTop {args.top} kernels:\n")
    print("| kernel | ms per call | launches |")
    print("|---|---:|---:|")
    for name, (t, n) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:args.top]:
        print(f"| `{short_name(name)}` | {t:.3f} | {n} |")
    lib.tl_model_free(model)


if __name__ == "__main__":
    main()
