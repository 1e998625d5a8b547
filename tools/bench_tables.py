#!/usr/bin/env python3
"""Markdown tables made from the benchmark programs' CSV files (standard library only), so that a page holds what
the benchmarks measured and nothing typed by hand. docs/benchmarks.md holds the `summary`, `gemm`, `bf16` and `score`
tables, notes/targets.md the `targets` table and `gemm --targets`; `builds` and `probe` compare kernel variants (two
builds, the read probe).

  tools/bench_tables.py summary BENCH_CSV [--group 128|64|row]
      per M range (M <= 16, 17-64, 128-512, >= 1024), over every layer of tl_bench's CSV: what tl_quant_gemm runs by
      default and its speed against dense cuBLAS FP16 (cuBLAS's time over ours: median, least and greatest), and
      in how many cells it is the faster of the two.
  tools/bench_tables.py gemm BENCH_CSV [--group 128|64|row] [--targets]
      the GEMM table from tl_bench's CSV: per layer and M (one group size), SOL, what tl_quant_gemm runs by default
      (the CSV's `dispatched` row, with the Marlin-class plan), the best of our INT4 paths, dense cuBLAS FP16;
      --targets adds the performance target of each cell (see target_for) and whether it is met.
  tools/bench_tables.py tma BENCH_CSV [--group 128|64|row]
      the TMA kernel against the wgmma kernel's 128-row tiles (both forced: tl_bench's marlin_tma256 and
      marlin_wgmma128), dequantize + cuBLAS and dense cuBLAS FP16, per layer and M from 128 rows, with the policy's
      plan; then per M, over the cells where the policy runs the TMA kernel, the wgmma kernel's time over the TMA
      kernel's (median, least and greatest).
  tools/bench_tables.py targets BENCH_CSV
      per group size and target class, how many of the Llama/Qwen2 cells meet the target, and the worst one.
  tools/bench_tables.py bf16 BENCH_CSV
      BF16 against FP16 per M over tl_bench's layers (group 128): the fused Marlin-class kernel's time in BF16 over
      its time in FP16, and dense cuBLAS BF16's time over it (median, least and greatest).
  tools/bench_tables.py builds CSV NEW_BUILD OLD_BUILD
      one kernel column of tl_bench measured with two builds in one call (a CSV of tl_bench rows with `build` and
      `pass` columns): per layer, M and group, the median over the passes of each build, the speed-up and the SOL
      fraction.
  tools/bench_tables.py probe PROBE_CSV
      tl_read_probe's read bandwidth per access pattern, ring depth and residency, without and with the stand-in
      arithmetic (one row per configuration, the two delays side by side).
  tools/bench_tables.py score SCORE_CSV [--model NAME]
      the scoring table from tl_score_bench's CSV (tools/gpu/score_bench.sh): tokens/s per model, scenario and
      configuration, graphs off and on, device memory, fallbacks; --model keeps one model's rows (e.g. "2B per-row").
"""

import argparse
import csv
import statistics
import sys

OURS = ("marlin_fused", "marlin_corr", "native", "deq_cublas")
# The layers the performance targets are set on (Llama-2-7B/13B, Llama-3-8B/70B, Qwen2-7B).
TARGET_LAYERS = ("Llama", "Qwen")
GROUPS = ("128", "64", "row")


def cells_of(path, group):
    """{(layer, M): {"sol", "kn", "shape", "dispatched", "plan", kernel: µs, ...}} of one group size's rows that ran,
    and their keys in CSV order."""
    cells, order = {}, []
    for r in csv.DictReader(open(path)):
        if r["group"] != group or r["rc"] != "0" or float(r["us"]) <= 0:
            continue
        key = (r["layer"], int(r["M"]))
        if key not in cells:
            cells[key] = {"sol": float(r["sol_us"]), "kn": int(r["K"]) * int(r["N"]), "shape": f"{r['K']}×{r['N']}"}
            order.append(key)
        c = cells[key]
        c[r["kernel"]] = float(r["us"])
        if r.get("dispatched") == "1":
            c["dispatched"] = r["kernel"]
        if r.get("plan"):
            c["plan"] = r["plan"]
    return cells, order


def fp16_of(cells, layer, m):
    """Dense cuBLAS FP16's time for the cell (timed with group 128 only; the dense weight has no grouping)."""
    return cells.get((layer, m), {}).get("cublas_fp16")


def target_for(layer, kn, m):
    """The performance target for a cell: (kind, value), kind "sol" (a fraction of SOL) or "fp16" (a speed ratio against
    dense cuBLAS FP16, and from M = 1024 also 0.85 of SOL); None where none is set."""
    if not layer.startswith(TARGET_LAYERS):
        return None
    if m in (1, 16):
        return ("sol", 0.85) if kn >= 1 << 25 else None
    if 17 <= m <= 64:
        return ("sol", 0.60)
    if m >= 128:
        return ("fp16", 1.0)
    return None


def judge(cells, order, key, fp16):
    """(target text, met?, cliff?) for the dispatcher's time of one cell; None when no target is set."""
    layer, m = key
    c = cells[key]
    t = target_for(layer, c["kn"], m)
    if t is None or c.get("dispatched") not in c:
        return None
    us = c[c["dispatched"]]
    if t[0] == "sol":
        text, met = f"≥ {t[1]:.2f} SOL", c["sol"] / us >= t[1]
    else:
        text = "≥ FP16" + (", ≥ 0.85 SOL" if m >= 1024 else "")
        met = fp16 is not None and us <= fp16 and (m < 1024 or c["sol"] / us >= 0.85)
    # No cliffs at 17-64 rows: the time never above the time at a larger tabled M of the same layer.
    cliff = 17 <= m <= 64 and any(
        other[0] == layer and other[1] > m and cells[other].get("dispatched") in cells[other]
        and cells[other][cells[other]["dispatched"]] < us for other in order)
    return text, met and not cliff, cliff


def gemm_table(path, group, with_targets=False):
    cells, order = cells_of(path, group)
    fp16_cells, _ = cells_of(path, "128")
    print("| layer (K×N) | M | SOL µs | dispatcher's choice µs (SOL) | best of ours µs (SOL) | cuBLAS FP16 dense µs "
          "(SOL) |" + (" target | met? |" if with_targets else ""))
    print("|---|---|---|---|---|---|" + ("---|---|" if with_targets else ""))
    for key in order:
        layer, m = key
        c = cells[key]
        sol = c["sol"]
        choice = c.get("dispatched")
        ours = [(c[k], k) for k in OURS if k in c]
        if not ours or choice not in c:
            continue
        best_us, best_k = min(ours)
        fp16 = fp16_of(fp16_cells, layer, m)
        versus = "" if fp16 is None else (" (beats FP16)" if best_us < fp16 else " (slower than FP16)")
        what = c.get("plan", "") if choice == "marlin_fused" else choice
        verdict = judge(cells, order, key, fp16)
        target, met = ("–", "–") if verdict is None else (verdict[0], "yes" if verdict[1] else
                                                          "no (cliff)" if verdict[2] else "no")
        print(f"| {layer} ({c['shape']}) | {m} | {sol:.1f} | {c[choice]:.1f} ({sol / c[choice]:.2f}) {what} | "
              f"{best_us:.1f} ({sol / best_us:.2f}) {best_k}{versus} | "
              + (f"{fp16:.1f} ({sol / fp16:.2f})" if fp16 else "–") + " |"
              + (f" {target} | {met} |" if with_targets else ""))


def summary_table(path, group):
    cells, order = cells_of(path, group)
    fp16_cells, _ = cells_of(path, "128")
    ranges = (("M ≤ 16", 1, 16), ("M = 17–64", 17, 64), ("M = 128–512", 128, 512), ("M ≥ 1024", 1024, None))
    print("| rows | M tabled | layers | what runs by default | cuBLAS FP16 time / ours: median (range) "
          "| cells where ours is faster |")
    print("|---|---|---|---|---|---|")
    for name, low, high in ranges:
        keys = [k for k in order if k[1] >= low and (high is None or k[1] <= high)
                and cells[k].get("dispatched") in cells[k] and fp16_of(fp16_cells, *k)]
        if not keys:
            continue
        ratios = [fp16_of(fp16_cells, *k) / cells[k][cells[k]["dispatched"]] for k in keys]
        runs = []
        for k in keys:
            c = cells[k]
            what = c.get("plan", "").split("/")[0] if c["dispatched"] == "marlin_fused" else c["dispatched"]
            what = what or c["dispatched"]
            if what not in runs:
                runs.append(what)
        ms = ", ".join(str(m) for m in sorted({k[1] for k in keys}))
        print(f"| {name} | {ms} | {len({k[0] for k in keys})} | {', '.join(runs)} | "
              f"{statistics.median(ratios):.2f}× ({min(ratios):.2f}–{max(ratios):.2f}) | "
              f"{sum(r > 1 for r in ratios)} of {len(ratios)} |")


def tma_table(path, group):
    cells, order = cells_of(path, group)
    fp16_cells, _ = cells_of(path, "128")
    keys = [k for k in order if k[1] >= 128 and "marlin_tma256" in cells[k] and "marlin_wgmma128" in cells[k]]

    def us(c, kernel):
        return f"{c[kernel]:.1f}" if kernel in c else "–"

    print("| layer (K×N) | M | policy's plan | TMA kernel µs | wgmma kernel, 128 rows µs | dequant + cuBLAS µs "
          "| cuBLAS FP16 dense µs |")
    print("|---|---|---|---|---|---|---|")
    for key in keys:
        c = cells[key]
        fp16 = fp16_of(fp16_cells, *key)
        print(f"| {key[0]} ({c['shape']}) | {key[1]} | {c.get('plan', '–')} | {us(c, 'marlin_tma256')} | "
              f"{us(c, 'marlin_wgmma128')} | {us(c, 'deq_cublas')} | " + (f"{fp16:.1f}" if fp16 else "–") + " |")
    print()
    print("| M | cells where the policy runs the TMA kernel | wgmma kernel's time / TMA kernel's: median (range) |")
    print("|---|---|---|")
    for m in sorted({k[1] for k in keys}):
        ratios = [cells[k]["marlin_wgmma128"] / cells[k]["marlin_tma256"] for k in keys
                  if k[1] == m and cells[k].get("plan", "").startswith("tma")]
        if ratios:
            print(f"| {m} | {len(ratios)} | {statistics.median(ratios):.2f}× ({min(ratios):.2f}–{max(ratios):.2f}) |")


def targets_table(path):
    fp16_cells, _ = cells_of(path, "128")
    print("| group | target | cells | met | worst cell (dispatcher's time, SOL fraction or time / FP16) |")
    print("|---|---|---|---|---|")
    for group in GROUPS:
        cells, order = cells_of(path, group)
        classes = {}
        for key in order:
            fp16 = fp16_of(fp16_cells, *key)
            verdict = judge(cells, order, key, fp16)
            if verdict is None:
                continue
            c = cells[key]
            us = c[c["dispatched"]]
            m = key[1]
            cls = ("M = 1, 16: ≥ 0.85 SOL" if m <= 16 else "M = 17-64: ≥ 0.60 SOL, no cliff" if m <= 64
                   else "M = 128-512: ≥ FP16" if m < 1024 else "M ≥ 1024: ≥ FP16 and ≥ 0.85 SOL")
            score = c["sol"] / us if m <= 64 else (fp16 / us if fp16 else 0.0)
            entry = classes.setdefault(cls, {"n": 0, "met": 0, "worst": None})
            entry["n"] += 1
            entry["met"] += 1 if verdict[1] else 0
            if entry["worst"] is None or score < entry["worst"][0]:
                what = f"{score:.2f} of SOL" if m <= 64 else f"{score:.2f}× FP16, {c['sol'] / us:.2f} of SOL"
                entry["worst"] = (score, f"{key[0]} M = {m}: {us:.1f} µs, {what}")
        for cls, e in classes.items():
            print(f"| {group} | {cls} | {e['n']} | {e['met']} | {e['worst'][1]} |")


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


def bf16_table(path):
    cells, order = cells_of(path, "128")
    ms = sorted({m for _, m in order})
    print("| M | layers | fused BF16 / fused FP16 time: median (range) "
          "| cuBLAS BF16 / fused BF16 time: median (range) |")
    print("|---|---|---|---|")

    def summary(values):
        return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"

    for m in ms:
        needed = {"marlin_fused", "marlin_fused_bf16", "cublas_bf16"}
        both = [cells[k] for k in order if k[1] == m and needed <= set(cells[k])]
        if not both:
            continue
        own = [c["marlin_fused_bf16"] / c["marlin_fused"] for c in both]
        peer = [c["cublas_bf16"] / c["marlin_fused_bf16"] for c in both]
        print(f"| {m} | {len(both)} | {summary(own)} | {summary(peer)} |")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    g = sub.add_parser("gemm")
    g.add_argument("csv")
    g.add_argument("--group", default="128", choices=GROUPS)
    g.add_argument("--targets", action="store_true", help="add each cell's target and whether it is met")
    u = sub.add_parser("summary")
    u.add_argument("csv")
    u.add_argument("--group", default="128", choices=GROUPS)
    t = sub.add_parser("tma")
    t.add_argument("csv")
    t.add_argument("--group", default="128", choices=GROUPS)
    sub.add_parser("targets").add_argument("csv")
    sub.add_parser("bf16").add_argument("csv")
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
        gemm_table(args.csv, args.group, args.targets)
    elif args.what == "summary":
        summary_table(args.csv, args.group)
    elif args.what == "tma":
        tma_table(args.csv, args.group)
    elif args.what == "targets":
        targets_table(args.csv)
    elif args.what == "bf16":
        bf16_table(args.csv)
    elif args.what == "builds":
        builds_table(args.csv, args.new_build, args.old_build)
    elif args.what == "probe":
        probe_table(args.csv)
    else:
        score_table(args.csv, args.model)


if __name__ == "__main__":
    sys.exit(main())
