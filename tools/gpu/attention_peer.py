#!/usr/bin/env python3
"""The attention peer: F.scaled_dot_product_attention (causal, FP16) on the shapes whose time
`tl_gpu_score_tests --gtest_filter=Kernels.AttentionLong` prints for the library's kernels, timed the same way
(median of 5 timings of 5 calls, CUDA events, after a warm-up) and reported in the same units (useful causal FLOPs,
4·T·(T+1)/2·H·hd per call).

Usage (on the GPU machine): python3 tools/gpu/attention_peer.py [--shapes 4096:16:128,1024:16:128,4096:4:64]
An optional fourth field is the batch: 1024:16:128:16 is 16 sequences of 1024 tokens.
"""

import argparse
import statistics


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default="4096:16:128,1024:16:128,4096:4:64", help="T:H:hd[:batch], comma-separated")
    args = p.parse_args()
    import torch
    import torch.nn.functional as F

    for shape in args.shapes.split(","):
        T, H, hd, B = (int(v) for v in (shape.split(":") + ["1"])[:4])
        q, k, v = (torch.randn(B, H, T, hd, device="cuda", dtype=torch.float16) for _ in range(3))
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(5):
            start.record()
            for _ in range(5):
                F.scaled_dot_product_attention(q, k, v, is_causal=True)
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) / 5)
        ms = statistics.median(times)
        flops = 4.0 * T * (T + 1) / 2 * H * hd * B
        tflops = flops / (ms * 1e-3) / 1e12
        print(f"attention {B} x T={T} H={H} hd={hd}, SDPA: {ms:.3f} ms per call, {tflops:.1f} TFLOPS")


if __name__ == "__main__":
    main()
