#!/usr/bin/env bash
# The scoring benchmark on the GPU machine: TinyLoop's scoring (tl_score_bench, through the C API) against a peer
# worth beating, PyTorch FP16 with windows and documents batched, eager and under torch.compile, on the same tokens;
# the summary compares the two per model and scenario, then judges the target tl_score >= 1.3x the faster of the two
# peers. Run it after tools/gpu/device_check.sh has built the project into $BUILD (default /tmp/tl-device-build; the
# two targets used here are rebuilt if stale):
#
#   OUT=/path tools/gpu/score_bench.sh     (BUILD=..., BUDGET=540, SEED=1, PYTHON=python3, WORK=/tmp/tl-score-bench,
#                                           STEPS="bench-row bench-g128 peer crosscheck",
#                                           CONFIGS=default,fused,fp16body,int8)
#
# The four scenarios, every tool on the same splitmix64 tokens from seed $SEED: (a) 4096 tokens in one window,
# (b) 1024 tokens in 16-token windows, (c) 1024 tokens in one window, (d) 256 documents of 100-2000 tokens (one
# tl_score_batch call; the peer batches them padded and packed: tools/torch_reference.py says how).
# Always: build (tl_score_bench and tinyloop) and models (the 2B-shaped synthetic models, D 2048, 16x128 heads, FFN
# 8192, V 50257, 2 pre + loop x 8, tied head, per-row and group 128; made again only when older than the tinyloop
# binary); then those of the $STEPS asked for, in this order, most essential first:
#   bench-row   tl_score_bench on the per-row model, the four scenarios, configurations default, fused and fp16body
#               (native and correction are never the fastest: docs/benchmarks.md) and int8 (INT8 activations, judged
#               on their own against the target INT8_TARGET and their perplexity change), CUDA graphs off and on;
#   bench-g128  the same on the group-128 model;
#   peer        tools/torch_reference.py --speed --compile both on the per-row model, the four scenarios in one
#               process: eager first, then torch.compile(mode="max-autotune-no-cudagraphs"), which compiles each
#               pass shape (a minute or more each) before timing it, so it comes after the benches and takes the time
#               left. The peer runs on the per-row model only: the group-128 model's FP16 weights have the same
#               shapes, hence the same speed;
#   crosscheck  `tinyloop score --backend cuda --per-token` on 1024 tokens under each dispatcher setting (defaults,
#               native, fused, correction, FP16 body) and `--backend cpu`, all checked by one run of the FP32
#               reference, tools/torch_reference.py --compare;
#   compare     (only when asked: STEPS=compare) `tinyloop compare` of the per-row model against the group-128 one
#               on 8192 random tokens in 512-token windows, against two `tinyloop score` runs (one per model) on the
#               same tokens and windows, each timed from its --json (seconds less the one-time GPU setup), two rounds;
#               compare_bench.log holds the runs' JSON and the summary the times;
# and the summary. Every step's time limit is cut to what is left of $BUDGET seconds, so the run ends within it (the
# device machine allows 600 s a command); a step that runs out is reported and the rest go on. When the compiled peer
# needs more time than one command has, run the steps in separate commands with the same OUT and WORK on the same
# machine, e.g. STEPS=peer after a full run: the summary reads every file that is there (STEPS="" makes only the
# summary), and a second peer run reuses TorchInductor's caches. Files under $OUT: score_bench.csv and score_bench.md
# (tl_score_bench, both models; bench-row starts them afresh), score_bench.log (models and benches), torch_speed.log
# (the peer's lines, SPEED lines among them), crosscheck.log, summary.md.
set -u
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-$PWD/score-bench-out}
BUILD=${BUILD:-/tmp/tl-device-build}
WORK=${WORK:-/tmp/tl-score-bench}
PY=${PYTHON:-python3}
SEED=${SEED:-1}
STEPS=" ${STEPS-bench-row bench-g128 peer crosscheck} "
DEADLINE=$((SECONDS + ${BUDGET:-540}))  # the device machine allows 600 s a command
DOCS=(--docs 256 --doc-min 100 --doc-max 2000)  # scenario (d), the same for tl_score_bench and the peer
mkdir -p "$OUT" "$WORK"
export PATH=/usr/local/cuda/bin:$PATH
step() { echo "== $* ($(date +%T), $((DEADLINE - SECONDS)) s left)"; }
wanted() { [[ "$STEPS" == *" $1 "* ]]; }
summary=()

# bounded CAP [NAME=VALUE...] CMD...: run CMD (through env, with those variables) for at most the smaller of CAP and
# the time left; status 124 when that runs out.
bounded() {
  local cap=$1 left=$((DEADLINE - SECONDS))
  shift
  [ "$left" -lt "$cap" ] && cap=$left
  if [ "$cap" -le 5 ]; then echo "skipped: out of time: $*"; return 124; fi
  timeout "$cap" env "$@"
}

# The build and the models serve every step; STEPS="" (the summary of files already there) needs neither.
if [ -n "${STEPS// /}" ]; then
  step build
  if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    echo "no build in $BUILD: run tools/gpu/device_check.sh first (or set BUILD)"
    exit 1
  fi
  if ! bounded 240 cmake --build "$BUILD" --target tl_score_bench tinyloop_cli >"$WORK/build.log" 2>&1; then
    grep -E "error|FAILED" "$WORK/build.log" | head -20
    echo "build of tl_score_bench / tinyloop failed"
    exit 1
  fi
  BIN=$BUILD/bin
  LOG=$OUT/score_bench.log
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,memory.used --format=csv,noheader \
    >>"$LOG" 2>&1 || true

  step models
  for spec in row:0 g128:128; do
    name=${spec%%:*} model=$WORK/2b-${spec%%:*}.tinyloop
    if [ "$model" -nt "$BIN/tinyloop" ]; then
      summary+=("model 2b-$name: reused")
      continue
    fi
    # Through a temporary name: a file cut short by the time limit must not pass for a model on the next run.
    bounded 60 "$BIN/tinyloop" make-model --preset 2b --group-size "${spec#*:}" --out "$model.part" >>"$LOG" 2>&1 &&
      mv "$model.part" "$model"
    summary+=("model 2b-$name: rc=$?")
  done
fi

# bench MODEL LABEL [--append]: the four scenarios on one model.
bench() {
  echo "---- tl_score_bench $2" >>"$LOG"
  bounded 150 "$BIN/tl_score_bench" "$WORK/2b-$1.tinyloop" "$OUT/score_bench.csv" "$OUT/score_bench.md" --label "$2" \
    --tokens 1024,4096 --chunked 1024 --chunk-window 16 "${DOCS[@]}" \
    --configs "${CONFIGS:-default,fused,fp16body,int8}" --seed "$SEED" "${@:3}" >>"$LOG" 2>&1
  summary+=("tl_score_bench $2: rc=$?")
}

if wanted bench-row; then
  step "bench, per-row"
  bench row "2B per-row"
fi

if wanted bench-g128; then
  step "bench, group 128"
  bench g128 "2B g128" --append
fi

SPEED=$OUT/torch_speed.log
if wanted peer; then
  step "PyTorch FP16 peer, eager and compiled"
  bounded 540 "$PY" tools/torch_reference.py "$WORK/2b-row.tinyloop" --speed --compile both --seed "$SEED" \
    --random 4096 "${DOCS[@]}" --scenarios 4096:0,1024:16,1024:0,docs >"$SPEED" 2>&1
  rc=$?
  eager=$(grep -c '^SPEED,eager' "$SPEED") compiled=$(grep -c '^SPEED,compiled' "$SPEED")
  summary+=("torch peer: rc=$rc ($eager eager and $compiled compiled variants timed of 5 and 4)")
fi

COMPARE=$OUT/compare_bench.log
if wanted compare; then
  step "compare vs two scores"
  : >"$COMPARE"
  "$PY" -c "import random; random.seed($SEED); print(' '.join(str(random.randrange(50257)) for _ in range(8192)))" \
    >"$WORK/tokens-8192.txt"
  # seconds without the one-time device copy and packing, from a run's --json.
  timed() { "$PY" -c "import json, sys; j = json.loads(sys.stdin.read()); print('%.3f' % (j['seconds'] - j['setup_seconds']))"; }
  for round in 1 2; do
    line="compare round $round:"
    out=$(bounded 120 "$BIN/tinyloop" compare "$WORK/2b-row.tinyloop" "$WORK/2b-g128.tinyloop" \
      --tokens "$WORK/tokens-8192.txt" --window 512 --backend cuda --json -q 2>>"$COMPARE")
    echo "$out" >>"$COMPARE"
    line+=" compare $(echo "$out" | timed 2>/dev/null || echo failed) s,"
    for name in row g128; do
      out=$(bounded 120 "$BIN/tinyloop" score "$WORK/2b-$name.tinyloop" --tokens "$WORK/tokens-8192.txt" \
        --window 512 --backend cuda --json -q 2>>"$COMPARE")
      echo "$out" >>"$COMPARE"
      line+=" score 2b-$name $(echo "$out" | timed 2>/dev/null || echo failed) s"
    done
    echo "$line" >>"$COMPARE"
    summary+=("$line")
  done
fi

CROSS=$OUT/crosscheck.log
if wanted crosscheck; then
  step "cross-check with PyTorch"
  : >"$CROSS"
  "$PY" -B -c "import sys; sys.path.insert(0, 'tools'); import torch_reference as r
print(' '.join(map(str, r.splitmix64_tokens(1024, $SEED, 50257))))" >"$WORK/tokens-1024.txt"
  per_token=()
  for spec in "default:" "native:TINYLOOP_USE_MARLIN=0" "fused:TINYLOOP_MARLIN_MODE=1 TINYLOOP_CUBLAS_MIN_M=0" \
              "correction:TINYLOOP_MARLIN_MODE=2 TINYLOOP_CUBLAS_MIN_M=0" "fp16body:TINYLOOP_EXPERIMENTAL_FP16_BODY=1" \
              "cpu:"; do
    name=${spec%%:*}
    backend=cuda
    [ "$name" = cpu ] && backend=cpu
    echo "---- tinyloop score --backend $backend ($name: ${spec#*:})" >>"$CROSS"
    # shellcheck disable=SC2086
    bounded 60 ${spec#*:} "$BIN/tinyloop" score "$WORK/2b-row.tinyloop" --tokens "$WORK/tokens-1024.txt" \
      --backend "$backend" --per-token "$WORK/tl-$name.tsv" >>"$CROSS" 2>&1 && per_token+=("$WORK/tl-$name.tsv")
  done
  echo "---- torch_reference.py --compare" >>"$CROSS"
  if [ ${#per_token[@]} -gt 0 ]; then
    bounded 120 "$PY" tools/torch_reference.py "$WORK/2b-row.tinyloop" --random 1024 --seed "$SEED" \
      --per-token-out "$WORK/torch-1024.tsv" --compare "${per_token[@]}" >>"$CROSS" 2>&1
    rc=$?
    passed=$(grep -c '^COMPARE PASS' "$CROSS") failed=$(grep -c '^COMPARE FAIL' "$CROSS")
    summary+=("cross-check: rc=$rc ($passed pass, $failed fail of ${#per_token[@]} tinyloop runs)")
  else
    summary+=("cross-check: no tinyloop score run succeeded")
  fi
fi

step summary
"$PY" - "$OUT/score_bench.csv" "$SPEED" "$CROSS" >"$OUT/summary.md" <<'EOF'
# tl_score against the peer, and the target, from tl_score_bench's CSV and the PyTorch peer's SPEED lines (format:
# tools/torch_reference.py).
import csv, math, os, sys

TARGET = 1.3
INT8_TARGET = 1.5  # INT8 activations (the int8 configuration): lossy, so judged apart from the FP16 rows
PPL_TOL = 0.03  # the peer and TinyLoop score the same tokens in FP16: their perplexities must agree this closely
SCENARIOS = [(("tokens", 4096, 0), "(a) 4096 tokens, one window"), (("tokens", 1024, 16), "(b) 1024 tokens in 16-token "
             "windows"), (("tokens", 1024, 0), "(c) 1024 tokens, one window"), (("docs",), "(d) 256 documents of "
             "100-2000 tokens")]
PEER_MODEL = "2B per-row"  # the peer's NLL is that model's; its speed stands for both (same shapes)

rows = list(csv.DictReader(open(sys.argv[1]))) if os.path.exists(sys.argv[1]) else []
for r in rows:
    r["key"] = ("docs",) if r["window"] == "docs" else ("tokens", int(r["tokens"]), int(r["window"]))

peer = {}  # (scenario key, mode) -> the fastest layout's fields
for line in open(sys.argv[2]) if os.path.exists(sys.argv[2]) else []:
    if not line.startswith("SPEED,"):
        continue
    (_, mode, kind, tokens, window, ms, tps, weight_bytes, linear_bytes, peak, layout, sequences, passes, scored,
     nll_sum, compile_mode, warmup_s) = line.strip().split(",")
    # A window covering every token is the bench's window 0 (max_seq).
    key = ("docs",) if kind == "docs" else ("tokens", int(tokens), 0 if int(window) >= int(tokens) else int(window))
    p = {"tps": float(tps), "layout": layout, "nll": float(nll_sum) / int(scored), "peak": int(peak),
         "warmup": float(warmup_s), "passes": int(passes), "tokens": int(tokens)}
    if (key, mode) not in peer or p["tps"] > peer[key, mode]["tps"]:
        peer[key, mode] = p

def ours(model, key, configs=None):
    ok = [r for r in rows if r["model"] == model and r["key"] == key and not r["error"]
          and (r["config"] in configs if configs is not None else r["config"] not in ("cpu", "int8"))]
    return max(ok, key=lambda r: float(r["tokens_per_s"]), default=None)

def tps(x):
    return f"{x:,.0f}"

def graphs(r):
    return "on" if r["graphs"] == "1" else "off"

print("## tl_score against PyTorch FP16, eager and compiled\n")
print("| model | scenario | ours: best (config, graphs) | ours: default | peer eager | peer compiled | "
      "best / faster peer | default / faster peer |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
verdicts = []
for model in sorted({r["model"] for r in rows}):
    for key, what in SCENARIOS:
        best, default = ours(model, key), ours(model, key, ["default"])
        eager, compiled = peer.get((key, "eager")), peer.get((key, "compiled"))
        cells = [f"{tps(float(best['tokens_per_s']))} ({best['config']}, graphs {graphs(best)})" if best else "-",
                 tps(float(default["tokens_per_s"])) if default else "-",
                 f"{tps(eager['tps'])} ({eager['layout']})" if eager else "-",
                 f"{tps(compiled['tps'])} ({compiled['layout']})" if compiled else "not measured"]
        faster = max((p["tps"] for p in (eager, compiled) if p), default=None)
        ratio = lambda r: f"{float(r['tokens_per_s']) / faster:.2f}x" if r and faster else "-"
        if best is None or faster is None:
            verdict = "not measured"
        elif compiled is None:  # the faster peer is at least as fast as the eager one
            verdict = ("MISSED" if float(best["tokens_per_s"]) < TARGET * faster else "unknown") + ": no compiled peer"
        else:
            verdict = "met" if float(best["tokens_per_s"]) >= TARGET * faster else "MISSED"
            if default is not None and default is not best:
                verdict += f" (default: {'met' if float(default['tokens_per_s']) >= TARGET * faster else 'MISSED'})"
        print(f"| {model} | {what} | {' | '.join(cells)} | {ratio(best)} | {ratio(default)} |")
        verdicts.append(f"| {model} | {what} | {verdict} |")

print(f"\n## The target: tl_score >= {TARGET}x the faster of eager and compiled\n")
print("| model | scenario | met? by the best configuration (by the default one) |")
print("|---|---|---|")
print("\n".join(verdicts))

print(f"\n## INT8 activations: tl_score (int8, best of graphs off and on) >= {INT8_TARGET}x the faster peer\n")
print("| model | scenario | int8 tokens/s | / faster peer | / ours default | PPL int8 / default - 1 | met? |")
print("|---|---|---:|---:|---:|---:|---|")
for model in sorted({r["model"] for r in rows}):
    for key, what in SCENARIOS:
        r8, default = ours(model, key, ["int8"]), ours(model, key, ["default"])
        faster = max((p["tps"] for p in (peer.get((key, "eager")), peer.get((key, "compiled"))) if p), default=None)
        if r8 is None:
            print(f"| {model} | {what} | not measured | | | | |")
            continue
        t8 = float(r8["tokens_per_s"])
        dppl = (f"{100 * math.expm1(float(r8['nll_per_token']) - float(default['nll_per_token'])):+.3f}%"
                if default else "-")
        met = ("met" if t8 >= INT8_TARGET * faster else "MISSED") if faster and (key, "compiled") in peer else "-"
        vs_peer = f"{t8 / faster:.2f}x" if faster else "-"
        vs_default = f"{t8 / float(default['tokens_per_s']):.2f}x" if default else "-"
        print(f"| {model} | {what} | {tps(t8)} | {vs_peer} | {vs_default} | {dppl} | {met} |")

print(f"\n## Same tokens, same scores: perplexity of the peer (eager) against ours (default), {PEER_MODEL} model\n")
for key, what in SCENARIOS:
    r, p = ours(PEER_MODEL, key, ["default"]) or ours(PEER_MODEL, key), peer.get((key, "eager"))
    if r is None or p is None:
        print(f"- {what}: not measured")
        continue
    d = math.expm1(p["nll"] - float(r["nll_per_token"]))  # finite even where the synthetic PPL overflows
    verdict = "ok" if abs(d) <= PPL_TOL else "CHECK"
    print(f"- {what}: NLL/token peer {p['nll']:.6f}, ours ({r['config']}) {float(r['nll_per_token']):.6f}: "
          f"PPL peer / ours - 1 = {100 * d:+.3f}% (within {100 * PPL_TOL:.0f}%: {verdict})")
warmups = [f"{what[:3]} {peer[key, 'compiled']['warmup']:.0f} s" for key, what in SCENARIOS
           if (key, "compiled") in peer]
if warmups:
    print("\nCompiled peer's warm-up runs (compiling every pass shape, then one run): " + ", ".join(warmups))

print("\n## Every row\n")
print("| model | tokens | window | config | graphs | tokens/s | ms | NLL/token | device MiB | fallbacks |")
print("|---|---:|---:|---|:-:|---:|---:|---:|---:|---:|")
for r in rows:
    if r["error"]:
        print(f"| {r['model']} | {r['tokens']} | {r['window']} | {r['config']} | {r['graphs']} | error: "
              f"{r['error'][:80].replace('|', '/')} | | | | |")
        continue
    print(f"| {r['model']} | {r['tokens']} | {r['window'] if r['window'] != '0' else 'max'} | {r['config']} | "
          f"{graphs(r)} | {tps(float(r['tokens_per_s']))} | {float(r['ms_median']):.2f} | "
          f"{float(r['nll_per_token']):.5f} | {r['device_mib'] or '-'} | {r['gemm_fallbacks']} |")
for key, _ in SCENARIOS:
    for mode in ("eager", "compiled"):
        p = peer.get((key, mode))
        if p:
            window = (key[2] or "max") if key[0] == "tokens" else "docs"
            print(f"| PyTorch FP16 peer, {mode} | {p['tokens']} | {window} | {p['layout']}, {p['passes']} forward "
                  f"passes | - | {tps(p['tps'])} | | {p['nll']:.5f} | {p['peak'] / 2**20:.0f} (peak) | |")

print("\n## Cross-check with PyTorch (FP32 reference, 1024 tokens)\n")
for line in open(sys.argv[3]) if os.path.exists(sys.argv[3]) else []:
    if line.startswith(("COMPARE", "  |dNLL|", "  PPL")) or line.startswith("----"):
        print("    " + line.rstrip())
EOF
summary+=("summary: rc=$?")
cat "$OUT/summary.md"
printf '%s\n' "${summary[@]}"
exit 0
