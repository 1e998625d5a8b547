#!/usr/bin/env bash
# Checks that tinyloop-sys packages and that the packaged crate builds with no repository around it:
#
#   1. vendor-sources.sh copies the sources into csrc/;
#   2. `cargo package -p tinyloop-sys --no-verify` makes the .crate, whose file list must hold csrc/ with every
#      source list and every file they list;
#   3. the .crate is unpacked into a temporary folder, and a small program there that depends on it by path (with
#      the offline Debian-registry config a consumer uses, see the README) is built and run: it compiles the C++
#      from csrc/ (pkg-config is kept out of it) and links it, and prints the library's version and build info.
#
# Writes only csrc/ (git-ignored) and a temporary folder, removed at the end (kept with KEEP_TMP=1). Prints how long
# each step took. Needs what `cargo build` needs (scripts/install-deps.sh) and nothing else.
set -euo pipefail
crate=$(cd "$(dirname "$0")" && pwd)
rust=$(cd "$crate/.." && pwd)
# shellcheck source=../offline-cargo-config.sh
source "$rust/offline-cargo-config.sh"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tinyloop-sys-package.XXXXXX")
if [ "${KEEP_TMP:-0}" = 1 ]; then echo "check-package: keeping $tmp"; else trap 'rm -rf "$tmp"' EXIT; fi
start=$SECONDS

"$crate/vendor-sources.sh"

echo "== cargo package -p tinyloop-sys =="
(cd "$rust" && CARGO_TARGET_DIR="$tmp/target" cargo package -p tinyloop-sys --offline --no-verify --allow-dirty)
crate_files=("$tmp"/target/package/tinyloop-sys-*.crate)
crate_file=${crate_files[0]}
[ -f "$crate_file" ] || { echo "check-package: no .crate in $tmp/target/package" >&2; exit 1; }
tar -tzf "$crate_file" | sed 's|^[^/]*/||' | LC_ALL=C sort >"$tmp/packaged.txt"
# Every file vendor-sources.sh copied must be in the package.
(cd "$crate" && find csrc -type f | LC_ALL=C sort) >"$tmp/vendored.txt"
missing=$(LC_ALL=C comm -13 "$tmp/packaged.txt" "$tmp/vendored.txt")
if [ -n "$missing" ]; then
  echo "check-package: vendored but not packaged:" >&2
  echo "$missing" >&2
  exit 1
fi
for required in Cargo.toml build.rs src/lib.rs csrc/cpp/sources.txt csrc/capi/sources.txt csrc/cuda/sources.txt \
    csrc/capi/include/tinyloop.h; do
  grep -qx "$required" "$tmp/packaged.txt" || { echo "check-package: $required is not packaged" >&2; exit 1; }
done
echo "$(basename "$crate_file"): $(wc -l <"$tmp/packaged.txt") files, $(grep -c '^csrc/' "$tmp/packaged.txt") of them" \
  "in csrc/, $(du -h "$crate_file" | cut -f1) ($((SECONDS - start)) s so far)"

echo "== build the packaged crate outside the repository =="
step=$SECONDS
mkdir -p "$tmp/unpacked" "$tmp/user/src"
tar -xzf "$crate_file" -C "$tmp/unpacked"
unpacked=$(find "$tmp/unpacked" -mindepth 1 -maxdepth 1 -type d)
write_offline_cargo_config "$tmp/user"
cat >"$tmp/user/Cargo.toml" <<EOF
[package]
name = "tinyloop-sys-package-check"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
tinyloop-sys = { path = "$unpacked" }

[workspace]
EOF
cat >"$tmp/user/src/main.rs" <<'EOF'
use std::ffi::CStr;

fn main() {
    // SAFETY: both functions return static NUL-terminated strings.
    let (version, info) = unsafe {
        (CStr::from_ptr(tinyloop_sys::tl_version_string()), CStr::from_ptr(tinyloop_sys::tl_build_info()))
    };
    println!("tinyloop {}", version.to_str().unwrap());
    println!("{}", info.to_str().unwrap().split_whitespace().collect::<String>());
}
EOF
# The packaged crate must build from its csrc/: no prebuilt library, no pkg-config.
output=$(cd "$tmp/user" && env -u TINYLOOP_LIB_DIR TINYLOOP_SYS_USE_PKG_CONFIG=0 CARGO_TARGET_DIR="$tmp/user/target" \
  cargo run --offline --quiet)
echo "$output"
grep -q '"build_type":"cargo' <<<"$output" || { echo "check-package: not the library built from csrc/" >&2; exit 1; }
echo "check-package: OK (build of the packaged crate $((SECONDS - step)) s, all $((SECONDS - start)) s)"
