#!/usr/bin/env bash
# Checks what the tinyloop crate's README tells a user: a cargo project of one's own, outside this repository,
# that depends on rust/tinyloop by path builds offline against Debian's packaged crates with nothing but the
# .cargo/config.toml shown there. The script writes that project into a temporary folder (and nothing anywhere
# else), runs `cargo run --offline` in it, and checks that the program prints the linked library's version.
#
#   rust/check-consumer.sh [--expect-build-type TYPE]
#
# The project gets its own CARGO_HOME (in the temporary folder too), so no configuration of the machine's user
# helps it. How tinyloop-sys finds the C library is up to the environment, as for any user: by default it builds
# the sources; TINYLOOP_LIB_DIR or pkg-config (PKG_CONFIG_PATH, TINYLOOP_SYS_USE_PKG_CONFIG) pass through.
# --expect-build-type checks the build_info() build type of the library that got linked ("Release" for a CMake
# build found through pkg-config; "cargo (Release: -O3 -DNDEBUG)" for the sources built by the crate).
# KEEP_TMP=1 keeps the folder.
set -euo pipefail
rust=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=offline-cargo-config.sh
source "$rust/offline-cargo-config.sh"
expect_build_type=""
while (($#)); do
  case $1 in
    --expect-build-type) expect_build_type=$2; shift 2 ;;
    *) echo "usage: $0 [--expect-build-type TYPE]" >&2; exit 2 ;;
  esac
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tinyloop-consumer.XXXXXX")
if [ "${KEEP_TMP:-0}" = 1 ]; then echo "check-consumer: keeping $tmp"; else trap 'rm -rf "$tmp"' EXIT; fi
start=$SECONDS
project=$tmp/my-app
mkdir -p "$project/src"

# ---- The files the README shows (tinyloop/README.md, "Using the crate in your own project") ----
write_offline_cargo_config "$project"
cat >"$project/Cargo.toml" <<EOF
[package]
name = "my-app"
version = "0.1.0"
edition = "2021"

[dependencies]
tinyloop = { path = "$rust/tinyloop" }
EOF
cat >"$project/src/main.rs" <<'EOF'
fn main() {
    println!("tinyloop {} (bindings {})", tinyloop::version(), tinyloop::Version::BINDINGS);
    println!("{}", tinyloop::build_info().split_whitespace().collect::<String>());
}
EOF

echo "== cargo run --offline in $project =="
# The machine's cargo configuration (~/.cargo/config.toml) is left out; toolchains still come from RUSTUP_HOME.
export RUSTUP_HOME=${RUSTUP_HOME:-$HOME/.rustup}
output=$(cd "$project" && CARGO_HOME="$tmp/cargo-home" CARGO_TARGET_DIR="$project/target" cargo run --offline --quiet)
echo "$output"
version_line=$(head -n 1 <<<"$output")
if ! [[ $version_line =~ ^tinyloop\ [0-9]+\.[0-9]+\.[0-9]+\ \(bindings\ [0-9]+\.[0-9]+\.[0-9]+\)$ ]]; then
  echo "check-consumer: the program did not print the library version" >&2
  exit 1
fi
if [ -n "$expect_build_type" ] && ! grep -qF "\"build_type\":\"${expect_build_type// /}\"" <<<"$output"; then
  echo "check-consumer: expected the build type \"$expect_build_type\" (another library was linked)" >&2
  exit 1
fi
echo "check-consumer: OK ($((SECONDS - start)) s)"
