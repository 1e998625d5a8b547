#!/usr/bin/env python3
"""Markdown tables made from the benchmark programs' CSV files (standard library only), so that a page holds what
the benchmarks measured and nothing typed by hand. docs/benchmarks.md holds the `gemm` and `score` tables; the
others compare kernel variants (A/B runs, two builds, the read probe).

  tools/bench_tables.py gemm BENCH_CSV [--cublas-min-m 512]
      the GEMM target table from tl_bench's CSV: per Llama/TinyLoop layer and M (group 128), SOL, what the
      dispatcher runs by default (fused Marlin-class below --cublas-min-m rows, dequantize + cuBLAS from there; from
      128 rows for a weight with K·N <= 2^25, from twice --cublas-min-m for one with K·N >= 2^27), the best of our
      INT4 paths, dense cuBLAS FP16, the target and whether it is met.
  tools/bench_tables.py ab BENCH_CSV [BENCH_CSV ...] [--cublas-min-m 512]
      the kernel choices for 16 < M <= 1024 (group 128) from tl_bench's same-run A/B columns: the dispatcher's
      choice, the wgmma kernel (forced below its bound), the medium kernel (forced above 32 rows), the
      first-generation M > 16 kernel, dequantize + cuBLAS and dense cuBLAS FP16.
  tools/bench_tables.py small BENCH_CSV
      M <= 16 (group 128): the stream kernel (the dispatcher's M <= 16 kernel, column marlin_fused) against the skinny
      kernel it replaced (marlin_fused_skinny, same run) and dense cuBLAS FP16.
  tools/bench_tables.py builds CSV NEW_BUILD OLD_BUILD
      one kernel column of tl_bench measured with two builds in one call (a CSV of tl_bench rows with `build` and
      `pass` columns): per layer, M and group, the median over the passes of each build, the speed-up and the SOL
      fraction.
  tools/bench_tables.py probe PROBE_CSV
      tl_read_probe's read bandwidth per access pattern, ring depth and residency, without and with the stand-in
      arithmetic (one row per configuration, the two delays side by side).
  tools/bench_tables.py score SCORE_CSV [--model NAME]
      the scoring table from tl_score_bench's CSV (tools/score_bench.sh): tokens/s per model, scenario and
      configuration, graphs off and on, device memory, fallbacks; --model keeps one model's rows (e.g. "2B per-row").
"""

import argparse
import csv
import statistics
import sys

OURS = ("marlin_fused", "marlin_corr", "native", "deq_cublas")
# cpp/gpu/gemm_policy.hpp's kMarlinWgmmaMinM: from here marlin_fused is the wgmma kernel on the H200; from 17 rows for
# a weight of at most kWgmmaSmallKN elements (wgmma_min_m_for).
WGMMA_MIN_M = 33
WGMMA_SMALL_KN = 1 << 25
# cpp/gpu/gemm_policy.hpp (cublas_min_m_for): a weight of at most this many elements switches to dequantize + cuBLAS
# from min(setting, 128).
CUBLAS_SMALL_KN = 1 << 25
# ... and a weight of at least this many at twice the setting.
CUBLAS_LARGE_KN = 1 << 27
LAYER_ORDER = {name: i for i, name in enumerate(
    ("TinyLoop qkv", "TinyLoop out", "TinyLoop gate+up", "TinyLoop down", "TinyLoop head", "Llama-8B qkv",
     "Llama-8B gate+up", "Llama-8B down", "Llama-70B gate+up", "Llama-70B down"))}


def target_for(layer, m):
    if not layer.startswith("Llama"):
        return None
    if m <= 16:
        return 0.80
    if m == 64:
        return 0.60
    if m >= 1024:
        return 0.80
    return None


def group128_cells(path):
    """{(layer, M): {"sol": SOL µs, kernel: µs, ...}} of the group-128 rows that ran, and their keys in CSV order."""
    cells, order = {}, []
    for r in csv.DictReader(open(path)):
        if r["group"] != "128" or r["rc"] != "0" or float(r["us"]) <= 0:
            continue
        key = (r["layer"], int(r["M"]))
        if key not in cells:
            cells[key] = {"sol": float(r["sol_us"]), "kn": int(r["K"]) * int(r["N"]), "shape": f"{r['K']}×{r['N']}"}
            order.append(key)
        cells[key][r["kernel"]] = float(r["us"])
    return cells, order


def dispatcher_choice(c, m, cublas_min_m):
    """What tl_quant_gemm runs (cpp/gpu/gemm_policy.hpp, cublas_min_m_for): dequantize + cuBLAS from cublas_min_m rows,
    or from min(cublas_min_m, 128) for a weight with K·N <= 2^25, from 2 * cublas_min_m for one with K·N >= 2^27; the
    fused Marlin-class kernel below."""
    threshold = min(cublas_min_m, 128) if cublas_min_m > 0 and c["kn"] <= CUBLAS_SMALL_KN else cublas_min_m
    if c["kn"] >= CUBLAS_LARGE_KN:
        threshold *= 2
    return "deq_cublas" if threshold > 0 and m >= threshold else "marlin_fused"


def wgmma_from(c):
    """The wgmma kernel's bound for the cell's weight (cpp/gpu/gemm_policy.hpp, wgmma_min_m_for)."""
    return 17 if c["kn"] <= WGMMA_SMALL_KN else WGMMA_MIN_M


def gemm_table(path, cublas_min_m):
    cells, order = group128_cells(path)
    print("| layer (K×N) | M | SOL µs | dispatcher's choice µs (SOL) | best of ours µs (SOL) | cuBLAS FP16 dense µs "
          "(SOL) | target | met? |")
    print("|---|---|---|---|---|---|---|---|")
    for layer, m in order:
        c = cells[(layer, m)]
        sol = c["sol"]
        choice = dispatcher_choice(c, m, cublas_min_m)
        ours = [(c[k], k) for k in OURS if k in c]
        if not ours or choice not in c:
            continue
        best_us, best_k = min(ours)
        fp16 = c.get("cublas_fp16")
        versus = "" if fp16 is None else (" (beats FP16)" if best_us < fp16 else " (slower than FP16)")
        target = target_for(layer, m)
        met = "–" if target is None else ("yes" if sol / c[choice] >= target else "no")
        print(f"| {layer} | {m} | {sol:.1f} | {c[choice]:.1f} ({sol / c[choice]:.2f}) | {best_us:.1f} "
              f"({sol / best_us:.2f}) {best_k}{versus} | "
              + (f"{fp16:.1f} ({sol / fp16:.2f})" if fp16 else "–")
              + f" | {'–' if target is None else f'≥ {target:.2f} SOL'} | {met} |")


def ab_table(paths, cublas_min_m):
    cells, order = {}, []
    for path in paths:  # later files add cells (and rows) to earlier ones
        more, more_order = group128_cells(path)
        for key in more_order:
            if key not in cells:
                cells[key] = more[key]
                order.append(key)
            else:
                cells[key].update(more[key])
    order.sort(key=lambda k: (LAYER_ORDER.get(k[0], 99), k[1]))
    cell = lambda c, k: f"{c[k]:.1f} ({c['sol'] / c[k]:.2f})" if k in c else "–"
    print("| layer (K×N) | M | SOL µs | dispatcher's choice | wgmma kernel | medium kernel | first-generation kernel | "
          "dequant + cuBLAS | cuBLAS FP16 (dense) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for layer, m in order:
        c = cells[(layer, m)]
        if m <= 16 or m > 1024 or "marlin_fused" not in c:
            continue
        # A kernel forced in the A/B columns was not the default of the run that measured it (a CSV from before the
        # small-weight bound holds the wgmma kernel at 17-32 rows as the forced column).
        wgmma = "marlin_fused_wgmma" if "marlin_fused_wgmma" in c else "marlin_fused"
        medium = "marlin_fused_medium" if "marlin_fused_medium" in c else "marlin_fused"
        choice = dispatcher_choice(c, m, cublas_min_m)
        if choice == "marlin_fused":  # the Marlin-class kernel the dispatcher picks today for this M and weight
            choice = wgmma if m >= wgmma_from(c) else medium
        fp16 = c.get("cublas_fp16")
        mark = "" if fp16 is None or choice not in c else (" ✓" if c[choice] < fp16 else "")
        print(f"| {layer} | {m} | {c['sol']:.1f} | {cell(c, choice)}{mark} | {cell(c, wgmma)} | "
              f"{cell(c, medium) if m <= 64 else '–'} | {cell(c, 'marlin_fused_wide')} | {cell(c, 'deq_cublas')} | "
              f"{cell(c, 'cublas_fp16')} |")


def small_m_table(path):
    cells, order = group128_cells(path)
    order.sort(key=lambda k: (LAYER_ORDER.get(k[0], 99), k[1]))
    print("| layer (K×N) | M | stream µs (SOL) | skinny µs (SOL) | speed-up | cuBLAS FP16 (dense) µs |")
    print("|---|---|---|---|---|---|")
    for layer, m in order:
        c = cells[(layer, m)]
        if m > 16 or "marlin_fused" not in c or "marlin_fused_skinny" not in c:
            continue
        stream, skinny, sol = c["marlin_fused"], c["marlin_fused_skinny"], c["sol"]
        fp16 = f"{c['cublas_fp16']:.1f}" if "cublas_fp16" in c else "–"
        print(f"| {layer} ({c['shape']}) | {m} | {stream:.1f} ({sol / stream:.2f}) | {skinny:.1f} "
              f"({sol / skinny:.2f}) | {skinny / stream:.2f}× | {fp16} |")


def builds_table(path, new_build, old_build):
    times, order = {}, []
    for r in csv.DictReader(open(path)):
        if r["rc"] != "0" or float(r["us"]) <= 0:
            continue
        key = (r["layer"], int(r["M"]), r["group"], r["kernel"])
        if key not in times:
            times[key] = {"sol": float(r["sol_us"]), new_build: [], old_build: []}
            order.append(key)
        if r["build"] in (new_build, old_build):
            times[key][r["build"]].append(float(r["us"]))
    order.sort(key=lambda k: (LAYER_ORDER.get(k[0], 99), k[2] != "128", k[1], k[3]))
    print(f"| layer | M | group | {new_build} µs (SOL) | {old_build} µs (SOL) | speed-up | passes |")
    print("|---|---|---|---|---|---|---|")
    for key in order:
        t = times[key]
        if not t[new_build] or not t[old_build]:
            continue
        new, old = statistics.median(t[new_build]), statistics.median(t[old_build])
        print(f"| {key[0]} | {key[1]} | {key[2]} | {new:.1f} ({t['sol'] / new:.2f}) | {old:.1f} ({t['sol'] / old:.2f}) "
              f"| {old / new:.2f}× | {len(t[new_build])} |")


def probe_table(path):
    cells, order = {}, []
    for r in csv.DictReader(open(path)):
        key = (r["pattern"], r["depth"], r["warps_per_block"], r["blocks_per_sm"])
        if key not in cells:
            cells[key] = {}
            order.append(key)
        cells[key][int(r["delay"])] = f"{float(r['us']):.1f} ({float(r['tb_per_s']):.2f})"
    delays = sorted({d for c in cells.values() for d in c})
    print("| pattern | depth | warps × blocks per SM | "
          + " | ".join(f"delay {d}: µs (TB/s)" for d in delays) + " |")
    print("|---|---|---|" + "---|" * len(delays))
    for key in order:
        print(f"| {key[0]} | {key[1]} | {key[2]} × {key[3]} | "
              + " | ".join(cells[key].get(d, "–") for d in delays) + " |")


def score_table(path, model=None):
    rows = [r for r in csv.DictReader(open(path)) if model is None or r["model"] == model]
    table, order = {}, []
    for r in rows:
        if r["error"]:
            continue
        if r["window"] == "docs":  # tl_score_bench --docs: one tl_score_batch call, `windows` = documents
            scenario = f"{r['windows']} documents, {r['tokens']} tokens"
        elif r["window"] in ("0", ""):
            scenario = f"{r['tokens']} tokens"
        else:
            scenario = f"{r['tokens']} tokens in {r['window']}-token windows"
        key = (r["model"], scenario, r["config"])
        if key not in table:
            table[key] = {}
            order.append(key)
        table[key][r["graphs"]] = r
    scenario_rank = lambda sc: (("documents" in sc), ("windows" in sc), sc.startswith("128 "), int(sc.split()[0]))
    config_rank = {c: i for i, c in enumerate(("default", "fused", "correction", "native", "fp16body", "cpu"))}
    order.sort(key=lambda k: (k[0], scenario_rank(k[1]), config_rank.get(k[2], 99)))
    print("| model | scenario | config | graphs off tok/s | graphs on tok/s | device MiB | fallbacks |")
    print("|---|---|---|---:|---:|---:|---:|")
    for key in order:
        by = table[key]
        any_row = next(iter(by.values()))
        tps = lambda g: f"{float(by[g]['tokens_per_s']):,.0f}" if g in by else "–"
        config = "CPU reference (16 cores of the GPU machine)" if key[2] == "cpu" else key[2]
        mib = any_row["device_mib"] or "–"
        print(f"| {key[0]} | {key[1]} | {config} | {tps('0')} | {tps('1')} | {mib} | {any_row['gemm_fallbacks']} |")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    g = sub.add_parser("gemm")
    g.add_argument("csv")
    g.add_argument("--cublas-min-m", type=int, default=512)
    a = sub.add_parser("ab")
    a.add_argument("csv", nargs="+")
    a.add_argument("--cublas-min-m", type=int, default=512)
    sub.add_parser("small").add_argument("csv")
    b = sub.add_parser("builds")
    b.add_argument("csv")
    b.add_argument("new_build")
    b.add_argument("old_build")
    sub.add_parser("probe").add_argument("csv")
    s = sub.add_parser("score")
    s.add_argument("csv")
    s.add_argument("--model")
    args = p.parse_args()
    if args.what == "gemm":
        gemm_table(args.csv, args.cublas_min_m)
    elif args.what == "ab":
        ab_table(args.csv, args.cublas_min_m)
    elif args.what == "small":
        small_m_table(args.csv)
    elif args.what == "builds":
        builds_table(args.csv, args.new_build, args.old_build)
    elif args.what == "probe":
        probe_table(args.csv)
    else:
        score_table(args.csv, args.model)


if __name__ == "__main__":
    sys.exit(main())
