#!/usr/bin/env bash
# The main job: install what is missing, build, and score the demo text with the demo model (prints perplexity
# and tokens/s).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
build=${TL_BUILD_DIR:-$root/build}
model=$build/demo.tinyloop
# Until a trained demo model ships (issue 5), the demo model is synthetic: generated deterministically here.
[ -f "$model" ] || "$build/bin/tinyloop" make-model --preset demo --out "$model"
"$build/bin/tinyloop" info "$model"
echo
"$build/bin/tinyloop" score "$model" --text "$root/data/demo.txt"
