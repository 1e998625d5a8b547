#!/usr/bin/env python3
"""tinyloop.distributed's overhead and scaling on this machine (docs/distributed.md quotes its output).

    TINYLOOP_LIBRARY=build/lib/libtinyloop.so PYTHONPATH=python /usr/bin/python3 tools/distributed_bench.py

Two measurements, each on a fresh LocalCluster (the workers' model load counted, as a real run pays it):

- overhead: N harness-style requests (a short context of the evaluation text and a continuation of a word) scored
  by one worker through tinyloop.distributed.score_batch, against Model.score_batch in this process with the same
  thread count (model load counted on both sides). The ratio is distributed / direct.
- scaling: tokens/s of score_batch on the same requests and of score_corpus on the evaluation text, with 1, 2, ...
  workers (--workers), and the efficiency tokens/s(n) / (n * tokens/s(1)).

CPU workers (default) use --threads threads each (1: a worker per core). With --gpus, the workers are one per visible
GPU (CUDA_VISIBLE_DEVICES set per worker, device "cuda"), the scaling counts GPUs, and --batch-tokens should be
larger (the GPU packs up to 8192 tokens a forward pass).
"""

import argparse
import json
import os
import pathlib
import platform
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))


def harness_requests(n, seed=0):
    """As python/tests/test_distributed.py: contexts of 2-15 bytes, continuations of 1-4."""
    text = (ROOT / "data" / "eval.txt").read_bytes()
    rng = np.random.default_rng(seed)
    requests = []
    for i in range(n):
        start = int(rng.integers(0, len(text) - 64))
        k, m = int(rng.integers(2, 16)), int(rng.integers(1, 5))
        requests.append({"context": list(text[start:start + k]), "continuation": list(text[start + k:start + k + m]),
                         "doc_id": i})
    return requests


def direct(model_path, requests, device, threads):
    import tinyloop

    start = time.monotonic()
    with tinyloop.Model(model_path, device, threads=threads) as model:
        batch = model.score_batch([(r["context"], r["continuation"]) for r in requests])
    return time.monotonic() - start, batch.tokens_scored, [s.nll_sum for s in batch]


def on_cluster(n_workers, gpus, fn):
    import distributed
    import tinyloop.distributed as tld

    cluster = tld.local_cluster(gpus=gpus[:n_workers]) if gpus else tld.local_cluster(n_workers)
    with cluster, distributed.Client(cluster) as client:
        client.wait_for_workers(n_workers)
        return fn(client)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(ROOT / "models" / "demo-int4.tinyloop"))
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--text-bytes", type=int, default=32768, help="of data/eval.txt for score_corpus (0: none)")
    parser.add_argument("--workers", default="1,2", help="worker counts to measure, e.g. 1,2,4")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per worker (and for the direct run)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--gpus", action="store_true", help="one worker per visible GPU, device cuda")
    parser.add_argument("--batch-tokens", type=int, default=None)
    parser.add_argument("--no-all-cores", dest="all_cores", action="store_false",
                        help="skip the single process with every core's threads")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import tinyloop.distributed as tld

    device = "cuda" if args.gpus else args.device
    gpus = tld.visible_gpus() if args.gpus else None
    batch_tokens = args.batch_tokens or (65536 if args.gpus else tld.DEFAULT_BATCH_TOKENS)
    counts = [int(n) for n in args.workers.split(",")]
    if gpus is not None:
        counts = [n for n in counts if n <= len(gpus)]
    requests = harness_requests(args.requests)
    text = (ROOT / "data" / "eval.txt").read_bytes()[:args.text_bytes]
    options = dict(device=device, threads=args.threads, batch_tokens=batch_tokens)
    report = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
              "device": device, "threads_per_worker": args.threads, "batch_tokens": batch_tokens,
              "requests": len(requests)}

    # Overhead: one worker against this process.
    direct_seconds, tokens, nlls = direct(args.model, requests, device, args.threads)

    def one_worker(client):
        start, cpu = time.monotonic(), time.process_time()
        results = tld.score_batch(client, args.model, requests, **options)
        return time.monotonic() - start, time.process_time() - cpu, results

    # The client's CPU time: this process's (with the scheduler, which a LocalCluster runs in it).
    dist_seconds, client_cpu, results = on_cluster(1, gpus, one_worker)
    assert [r["nll_sum"] for r in results] == nlls  # the same bits (CPU; GPU batches may differ in the last bits)
    report["overhead"] = {"direct_s": round(direct_seconds, 3), "one_worker_s": round(dist_seconds, 3),
                          "ratio": round(dist_seconds / direct_seconds, 3), "tokens_scored": tokens,
                          "client_and_scheduler_cpu_s": round(client_cpu, 3)}
    # For comparison: one process with all the cores' threads, no Dask (CPU only).
    if not args.gpus and args.all_cores:
        import tinyloop

        cores = os.cpu_count()
        seconds, _, _ = direct(args.model, requests, device, cores)
        row = {"threads": cores, "requests_s": round(seconds, 3), "requests_per_s": round(len(requests) / seconds, 1)}
        if text:
            with tinyloop.Model(args.model, device, threads=cores) as model:
                start = time.monotonic()
                result = model.score(text)
                seconds = time.monotonic() - start
                row.update(text_s=round(seconds, 3), text_tok_s=round(result.tokens_scored / seconds, 1))
        report["one_process_all_cores"] = row
    report["load_average_before_scaling"] = round(os.getloadavg()[0], 2)

    # Scaling.
    report["scaling"] = []
    for n in counts:
        def measure(client):
            start = time.monotonic()
            batch = tld.score_batch(client, args.model, requests, **options)
            batch_seconds = time.monotonic() - start
            row = {"workers": n, "requests_s": round(batch_seconds, 3),
                   "requests_per_s": round(len(requests) / batch_seconds, 1),
                   "requests_tok_s": round(batch.tokens_scored / batch_seconds, 1)}
            if text:
                corpus = tld.score_corpus(client, args.model, [text], **options)
                row.update(text_s=round(corpus.seconds, 3), text_tok_s=round(corpus.tokens_per_second, 1),
                           text_perplexity=round(corpus.perplexity, 6))
            return row

        report["scaling"].append(on_cluster(n, gpus, measure))
    report["load_average_after"] = round(os.getloadavg()[0], 2)
    base = report["scaling"][0]
    for row in report["scaling"]:
        scale = row["workers"] / base["workers"]
        row["requests_efficiency"] = round(row["requests_tok_s"] / (scale * base["requests_tok_s"]), 3)
        if "text_tok_s" in row:
            row["text_efficiency"] = round(row["text_tok_s"] / (scale * base["text_tok_s"]), 3)

    if args.json:
        print(json.dumps(report, indent=1))
        return
    print(f"{report['machine']}; device {device}, {args.threads} thread(s) per worker, batches of {batch_tokens} "
          "tokens")
    o = report["overhead"]
    print(f"overhead, {len(requests)} requests ({o['tokens_scored']} tokens scored): direct Model.score_batch "
          f"{o['direct_s']:.2f} s, one worker {o['one_worker_s']:.2f} s: ratio {o['ratio']:.3f} (client and scheduler: "
          f"{o['client_and_scheduler_cpu_s']:.2f} s of CPU)")
    if "one_process_all_cores" in report:
        row = report["one_process_all_cores"]
        print(f"one process, no Dask, {row['threads']} threads: requests {row['requests_s']:.2f} s "
              f"({row['requests_per_s']:.1f}/s)" + (f", text {row['text_s']:.2f} s ({row['text_tok_s']:.1f} tok/s)"
                                                   if "text_s" in row else ""))
    print(f"load average (1 min) before the scaling runs {report['load_average_before_scaling']}, after "
          f"{report['load_average_after']}")
    print("| workers | requests: s | requests/s | efficiency | text: s | tok/s | efficiency |")
    print("|---|---|---|---|---|---|---|")
    for row in report["scaling"]:
        print(f"| {row['workers']} | {row['requests_s']:.2f} | {row['requests_per_s']:.1f} | "
              f"{row['requests_efficiency']:.2f} | {row.get('text_s', float('nan')):.2f} | "
              f"{row.get('text_tok_s', float('nan')):.1f} | {row.get('text_efficiency', float('nan')):.2f} |")


if __name__ == "__main__":
    main()
