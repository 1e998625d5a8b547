#!/usr/bin/env bash
# The main job: install what is missing, build, and score the held-out evaluation text with the shipped demo model
# (a TinyLoop trained on the Python documentation, INT4 GPTQ; models/README.md). Prints the model, its perplexity
# and tokens/s (on the GPU where there is one, else on the CPU).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
build=${TL_BUILD_DIR:-$root/build}
model=$root/models/demo-int4.tinyloop
"$build/bin/tinyloop" info "$model"
echo
"$build/bin/tinyloop" score "$model" --text "$root/data/eval.txt"
