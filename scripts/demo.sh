#!/usr/bin/env bash
# The main job: install what is missing, build the library and the command-line tool (only those: scripts/test.sh
# builds the tests and benchmarks), and score the held-out evaluation text data/eval.txt with the shipped demo model
# (a TinyLoop trained on the Python documentation, INT4 GPTQ; models/README.md).
# The install and build steps write their output to logs in the build folder (demo-install.log, demo-build.log) and
# print one header line each with its time; on a failure the log's last lines are printed. The score step prints
# the model's configuration, then its perplexity (PPL = x ± standard error) and tokens/s (on the GPU where there is
# one, else on the CPU); the total time comes last.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${TL_BUILD_DIR:-$root/build}
model=$root/models/demo-int4.tinyloop
text=$root/data/eval.txt
mkdir -p "$build"
started=$SECONDS

# logged NAME COMMAND...: runs a step with its output in $build/demo-NAME.log.
logged() {
  local name=$1 log=$build/demo-$1.log step_started=$SECONDS
  shift
  printf '== %s (log: %s) ... ' "$name" "${log#"$root"/}"
  if ! "$@" >"$log" 2>&1; then
    printf 'failed after %d s; the last lines of %s:\n' $((SECONDS - step_started)) "$log" >&2
    tail -n 30 "$log" >&2
    exit 1
  fi
  printf '%d s\n' $((SECONDS - step_started))
}

logged install "$root/scripts/install-deps.sh"
# The shared library and the CLI (build/bin/tinyloop), nothing else.
logged build env TL_BUILD_TARGETS="tinyloop tinyloop_cli" "$root/scripts/build.sh"

echo "== score (${text#"$root"/} with ${model#"$root"/})"
step_started=$SECONDS
"$build/bin/tinyloop" info "$model"
echo
"$build/bin/tinyloop" score "$model" --text "$text"
echo "== score ... $((SECONDS - step_started)) s"
echo "== total $((SECONDS - started)) s"
