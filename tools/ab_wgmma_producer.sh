#!/usr/bin/env bash
# On the GPU machine, after tools/device_check.sh built tl_bench: the wgmma kernel above 64 rows with its copying
# warpgroup (marlin_wgmma_ws_kernel, the default) against every warp copying (tl_bench --wgmma-producer 0), two passes
# alternating the forms, group 128. Writes $OUT/ab-producer.csv (the form and pass, then tl_bench's columns) and
# prints a markdown table with both passes of each form (each cell is tl_bench's median of 7 graph replays); speed-up =
# the old form's faster pass / the new form's faster pass.
#
#   OUT=$OUT [LAYERS=Llama,TinyLoop] [MS=128,256,512,1024,4096] bash tools/ab_wgmma_producer.sh
set -u
BENCH=${BENCH:-/tmp/tl-device-build/bin/tl_bench}
OUT=${OUT:?set OUT}
csv=$OUT/ab-producer.csv
rm -f "$csv"
for pass in 1 2; do
  for producer in 1 0; do
    "$BENCH" /tmp/ab.csv /dev/null --layer "${LAYERS:-Llama,TinyLoop}" --m "${MS:-128,256,512,1024,4096}" --group 128 \
      --kernels marlin_fused --wgmma-producer "$producer" >/dev/null || echo "tl_bench failed (producer $producer)"
    [ -f "$csv" ] || sed -n '1s/^/producer,pass,/p' /tmp/ab.csv >"$csv"
    sed -n "2,\$s/^/$producer,$pass,/p" /tmp/ab.csv >>"$csv"
  done
done
python3 - "$csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
t = {}
for r in rows:
    if float(r['us']) > 0:
        t.setdefault((r['layer'], int(r['M'])), {}).setdefault(r['producer'], []).append((float(r['us']), r['sol_fraction']))
print('| layer | M | copying warpgroup µs (SOL), passes 1 / 2 | every warp copying µs (SOL), passes 1 / 2 | speed-up |')
print('|---|---|---|---|---|')
for (layer, m), d in t.items():
    if '1' not in d or '0' not in d:
        continue
    cell = lambda v: ' / '.join(f'{us:.1f} ({float(sol):.2f})' for us, sol in v)
    print(f"| {layer} | {m} | {cell(d['1'])} | {cell(d['0'])} | {min(u for u, _ in d['0']) / min(u for u, _ in d['1']):.3f}× |")
PY
