#!/usr/bin/env python3
"""Two Dask workers sharing one GPU, against one process, on the scoring benchmark's document scenario.

    TINYLOOP_LIBRARY=build/lib/libtinyloop.so PYTHONPATH=python python3 tools/gpu/distributed_gpu.py MODEL

MODEL is the 2B-shaped model of tools/gpu/score_bench.sh (`tinyloop make-model --preset 2b --group-size 128`). The
documents are --docs random token sequences of --doc-min..--doc-max tokens (seeded), each one request whose first
token is the context and the rest the continuation, so every token after the first is scored. Two measurements:

- per document: every request a batch of its own (batch_tokens 1) on the cluster, against one process scoring the
  documents one at a time. Each forward pass then holds the same rows on both sides, so the NLLs must be equal to
  the last bit, unless the GPU's own kernels vary from run to run: the one process scores the documents twice to
  show that baseline.
- packed: the cluster's batching for GPU workers (--batch-tokens) against one process scoring the whole list in one
  call. The GPU packs the requests of a batch into its forward passes, and a GEMM of other row counts may take
  another kernel, so NLLs may differ in the last bits; the largest difference is reported.

Prints one JSON object: seconds and tokens/s of each side (model loads excluded on both sides), and the comparison.
"""
import argparse
import json
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))


def documents(n, low, high, vocab, seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, int(rng.integers(low, high + 1))).tolist() for _ in range(n)]


def compare(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return {"identical": int(np.sum(a == b)), "of": len(a), "max_abs_diff": float(np.max(np.abs(a - b))),
            "max_rel_diff": float(np.max(np.abs(a - b) / np.abs(b)))}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("--docs", type=int, default=256)
    parser.add_argument("--doc-min", type=int, default=100)
    parser.add_argument("--doc-max", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-tokens", type=int, default=65536)
    parser.add_argument("--device", default="cuda", help="the workers' and the one process's (cpu: a dry run)")
    args = parser.parse_args()

    import distributed
    import tinyloop
    import tinyloop.distributed as tld

    with tinyloop.Model(args.model, args.device) as model:
        vocab = model.vocab
        docs = documents(args.docs, args.doc_min, args.doc_max, vocab, args.seed)
        requests = [(d[:1], d[1:]) for d in docs]
        model.score_batch(requests[:4])  # the first call's one-time set-up, outside the timings
        start = time.monotonic()
        alone = [model.score_batch([r])[0].nll_sum for r in requests]
        alone_s = time.monotonic() - start
        again = [model.score_batch([r])[0].nll_sum for r in requests]
        start = time.monotonic()
        packed = model.score_batch(requests)
        packed_s = time.monotonic() - start
    tokens = packed.tokens_scored
    packed = [s.nll_sum for s in packed]
    dicts = [{"context": c, "continuation": t} for c, t in requests]

    with tld.local_cluster(args.workers) as cluster, distributed.Client(cluster) as client:
        client.wait_for_workers(args.workers)
        tld.score_batch(client, args.model, dicts[:2 * args.workers], device=args.device, batch_tokens=1)  # loads
        start = time.monotonic()
        dist_alone = tld.score_batch(client, args.model, dicts, device=args.device, batch_tokens=1)
        dist_alone_s = time.monotonic() - start
        start = time.monotonic()
        dist_packed = tld.score_batch(client, args.model, dicts, device=args.device, batch_tokens=args.batch_tokens)
        dist_packed_s = time.monotonic() - start

    report = {
        "model": args.model, "documents": args.docs, "tokens_scored": tokens, "workers_on_one_gpu": args.workers,
        "per_document": {"one_process_s": round(alone_s, 3), "cluster_s": round(dist_alone_s, 3),
                         "one_process_tok_s": round(tokens / alone_s), "cluster_tok_s": round(tokens / dist_alone_s),
                         **compare([r["nll_sum"] for r in dist_alone], alone),
                         "one_process_twice": compare(again, alone)},
        "packed": {"batch_tokens": args.batch_tokens, "one_process_s": round(packed_s, 3),
                   "cluster_s": round(dist_packed_s, 3), "one_process_tok_s": round(tokens / packed_s),
                   "cluster_tok_s": round(tokens / dist_packed_s),
                   **compare([r["nll_sum"] for r in dist_packed], packed)},
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
