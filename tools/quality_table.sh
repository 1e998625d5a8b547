#!/usr/bin/env bash
# The perplexity table of docs/quality.md, measured with the project's own CLI on the held-out text.
#
#   tools/quality_table.sh quantize FP16_MODEL CALIB OUTDIR   INT4 variants of the dense model (min-max / GPTQ,
#                                                             group 128 / per row, all with frac4 channels)
#   tools/quality_table.sh cpu FP16_MODEL EVAL OUTDIR         CPU rows: the dense model, then each variant with
#                                                             cross-iteration rounding off and on
#   tools/quality_table.sh gpu INT4_MODEL EVAL OUTDIR         GPU rows: one INT4 model on every execution path,
#                                                             each also written per token (OUTDIR/*.tsv) and, with
#                                                             TORCH_CHECK=1, checked against tools/torch_reference.py
#                                                             (FP32 PyTorch) in OUTDIR/crosscheck.log
#
# Each row is appended to OUTDIR/quality.csv (variant,backend,path,cross_iter,tokens,nll_per_token,perplexity,
# seconds); the CLI's full output goes to OUTDIR/<variant>-<path>.log. TINYLOOP (default build/bin/tinyloop) is the
# CLI to use.
set -euo pipefail
TINYLOOP=${TINYLOOP:-build/bin/tinyloop}
mode=${1:?mode: quantize | cpu | gpu}
model=${2:?model}
text=${3:?text}
out=${4:?out dir}
mkdir -p "$out"
csv=$out/quality.csv
[ -s "$csv" ] || echo "variant,backend,path,cross_iter,tokens,nll_per_token,perplexity,seconds" >"$csv"

# Variant name -> quantize options. frac4 is written everywhere: it is ignored unless cross-iteration rounding is on,
# so one file serves both rows.
declare -A VARIANTS=(
  [minmax-g128]="--method minmax --group-size 128"
  [minmax-row]="--method minmax --group-size 0"
  [gptq-g128]="--method gptq --group-size 128"
  [gptq-row]="--method gptq --group-size 0"
)
ORDER=(minmax-g128 minmax-row gptq-g128 gptq-row)

# score VARIANT FILE BACKEND PATH CROSS_ITER [ENV...]: one row.
score() {
  local variant=$1 file=$2 backend=$3 path=$4 cross=$5
  shift 5
  local name=$out/$variant-$path$([ "$cross" = 1 ] && echo -xiter)
  local log=$name.log per_token=()
  [ "$mode" = gpu ] && per_token=(--per-token "$name.tsv")
  env "$@" TINYLOOP_CROSS_ITER_ROUND="$cross" "$TINYLOOP" score "$file" --text "$text" --backend "$backend" \
    "${per_token[@]}" >"$log" 2>&1 || {
    echo "score failed: $variant $path (see $log)" >&2; tail -5 "$log" >&2; return 1; }
  local tokens nll ppl secs
  tokens=$(awk '$1 == "tokens" {print $2}' "$log")
  nll=$(awk '$1 == "nll" {print $2}' "$log")
  ppl=$(awk '$1 == "perplexity" {print $2}' "$log")
  secs=$(awk '$1 == "time" {print $2}' "$log")
  echo "$variant,$backend,$path,$cross,$tokens,$nll,$ppl,$secs" | tee -a "$csv"
}

case $mode in
  quantize)
    for v in "${ORDER[@]}"; do
      # shellcheck disable=SC2086
      "$TINYLOOP" quantize "$model" "$out/$v.tinyloop" ${VARIANTS[$v]} --calib "$text" --frac4 \
        >"$out/$v-quantize.log" 2>&1 || { echo "quantize failed: $v" >&2; tail -5 "$out/$v-quantize.log" >&2; exit 1; }
      echo "wrote $out/$v.tinyloop"
    done
    ;;
  cpu)
    score fp16 "$model" cpu reference 0
    for v in "${ORDER[@]}"; do
      score "$v" "$out/$v.tinyloop" cpu reference 0
      score "$v" "$out/$v.tinyloop" cpu reference 1
    done
    ;;
  gpu)
    # TINYLOOP_CUBLAS_MIN_M=0 keeps the Marlin-class rows on that kernel at every window length (by default the
    # dispatcher hands M >= 128 to dequantize + cuBLAS); the CLI log's "gemm paths" line shows what ran.
    name=$(basename "$model" .tinyloop)
    score "$name" "$model" cpu reference 0
    score "$name" "$model" cuda default 0
    score "$name" "$model" cuda marlin-fused 0 TINYLOOP_MARLIN_MODE=1 TINYLOOP_CUBLAS_MIN_M=0
    score "$name" "$model" cuda marlin-correction 0 TINYLOOP_MARLIN_MODE=2 TINYLOOP_CUBLAS_MIN_M=0
    score "$name" "$model" cuda dequant-cublas 0 TINYLOOP_CUBLAS_MIN_M=1
    score "$name" "$model" cuda native 0 TINYLOOP_USE_MARLIN=0 TINYLOOP_CUBLAS_MIN_M=0
    score "$name" "$model" cuda fp16-body 0 TINYLOOP_EXPERIMENTAL_FP16_BODY=1
    if [ -n "${TORCH_CHECK:-}" ]; then
      rc=0
      python3 tools/torch_reference.py "$model" --tokens-from "$text" --compare "$out"/"$name"-*.tsv \
        >"$out/crosscheck.log" 2>&1 || rc=$?
      echo "torch cross-check: exit $rc (crosscheck.log)"
    fi
    ;;
  *)
    echo "unknown mode $mode (quantize | cpu | gpu)" >&2
    exit 2
    ;;
esac
