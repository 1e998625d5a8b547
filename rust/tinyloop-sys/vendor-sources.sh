#!/usr/bin/env bash
# Copies the library's sources into rust/tinyloop-sys/csrc/ so that `cargo package -p tinyloop-sys` ships them:
# the packaged crate has no repository around it, and its build script then compiles csrc/ (the same relative
# paths as the repository: csrc/cpp/sources.txt, csrc/cpp/util/log.cpp, ...).
#
# Copied: the source lists (cpp/sources.txt, capi/sources.txt, cuda/sources.txt, cuda/sources_sm90a.txt), every
# file they list, every header under cpp/, capi/ and cuda/ (*.h, *.hpp, *.cuh, *.inl: the sources include them
# by relative path), and LICENSE. csrc/ is git-ignored and rebuilt from scratch on every run; run this right
# before `cargo package`:
#
#   rust/tinyloop-sys/vendor-sources.sh && (cd rust && cargo package -p tinyloop-sys --offline --allow-dirty)
#
# Writes nothing outside csrc/.
set -euo pipefail
crate=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$crate/../.." && pwd)
dest="$crate/csrc"
[ -f "$root/cpp/sources.txt" ] || { echo "vendor-sources: $root is not the TinyLoop repository" >&2; exit 1; }

lists=(cpp/sources.txt capi/sources.txt cuda/sources.txt cuda/sources_sm90a.txt)
files=(LICENSE "${lists[@]}")
for list in "${lists[@]}"; do
  # What tl_read_source_list (CMakeLists.txt) and build.rs read: '#' starts a comment, blank lines are skipped.
  while IFS= read -r line; do
    line=${line%%#*}
    line="${line#"${line%%[![:space:]]*}"}"
    line="${line%"${line##*[![:space:]]}"}"
    [ -n "$line" ] && files+=("$line")
  done <"$root/$list"
done
while IFS= read -r header; do
  files+=("$header")
done < <(cd "$root" && find cpp capi cuda -type f \( -name '*.h' -o -name '*.hpp' -o -name '*.cuh' -o -name '*.inl' \) |
  LC_ALL=C sort)

for file in "${files[@]}"; do
  [ -f "$root/$file" ] || { echo "vendor-sources: $file (listed or found) does not exist" >&2; exit 1; }
done

# Fill a fresh folder next to csrc/, then swap it in, so an interrupted run never leaves half a copy.
staging=$(mktemp -d "$crate/.csrc.XXXXXX")
trap 'rm -rf "$staging"' EXIT
(cd "$root" && printf '%s\0' "${files[@]}" | LC_ALL=C sort -zu | xargs -0 cp --parents -t "$staging")
rm -rf "$dest"
mv "$staging" "$dest"
chmod 755 "$dest"
trap - EXIT
echo "vendor-sources: $(find "$dest" -type f | wc -l) files ($(du -sh "$dest" | cut -f1)) in $dest"
