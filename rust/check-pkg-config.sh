#!/usr/bin/env bash
# Checks how tinyloop-sys finds an installed library through pkg-config (see tinyloop-sys/README.md):
#
#   1. installs a CMake build into a temporary prefix (`cmake --install BUILD --prefix TMP/prefix`, which gives
#      the tinyloop.pc users get) and builds and runs rust/check-consumer.sh's project with that prefix on
#      PKG_CONFIG_PATH and TINYLOOP_SYS_USE_PKG_CONFIG unset (auto): the library linked must be the installed one
#      (build_info() says "Release", CMake's build type; the crate's own build says "cargo ...");
#   2. TINYLOOP_SYS_USE_PKG_CONFIG=1 with a tinyloop.pc of an incompatible version (the next minor before 1.0):
#      the build must fail, naming the versions;
#   3. TINYLOOP_SYS_USE_PKG_CONFIG=1 with no tinyloop.pc at all: the build must fail;
#   4. auto mode with the incompatible tinyloop.pc: the build script must warn and fall back to the sources (the
#      build is stopped at its first compiler call, CXX=false, so that no C++ is compiled for this).
#
#   rust/check-pkg-config.sh [CMAKE_BUILD_DIR]     (default: $TL_BUILD_DIR, else the repository's build/)
#
# The build folder must hold a complete build (`cmake --build`); `cmake --install` writes its
# install_manifest.txt there. Everything else goes to a temporary folder (kept with KEEP_TMP=1).
set -euo pipefail
rust=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$rust/.." && pwd)
build=${1:-${TL_BUILD_DIR:-$root/build}}
[ -f "$build/CMakeCache.txt" ] || { echo "check-pkg-config: $build is not a CMake build folder" >&2; exit 2; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tinyloop-pkg-config.XXXXXX")
if [ "${KEEP_TMP:-0}" = 1 ]; then echo "check-pkg-config: keeping $tmp"; else trap 'rm -rf "$tmp"' EXIT; fi
start=$SECONDS
unset TINYLOOP_LIB_DIR TINYLOOP_SYS_USE_PKG_CONFIG

echo "== 1. an installed CMake build, found by pkg-config (auto mode) =="
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
pc=$(find "$tmp/prefix" -name tinyloop.pc -print -quit)
[ -n "$pc" ] || { echo "check-pkg-config: the install has no tinyloop.pc" >&2; exit 1; }
pc_dir=$(dirname "$pc")
lib_dir=$(pkg-config --variable=libdir "$pc")
echo "installed: $pc (version $(pkg-config --modversion "$pc"), libdir $lib_dir)"
PKG_CONFIG_PATH="$pc_dir${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}" LD_LIBRARY_PATH="$lib_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  "$rust/check-consumer.sh" --expect-build-type Release

# Builds tinyloop-sys in the workspace (own target folder) with the environment assignments given (VAR=value ...);
# checks that the build fails and that its output holds the pattern.
expect_failure() {
  local what=$1 pattern=$2 output
  shift 2
  if output=$(cd "$rust" && env "$@" CARGO_TARGET_DIR="$tmp/target" cargo build --offline -p tinyloop-sys 2>&1); then
    echo "$output" | tail -n 20
    echo "check-pkg-config: $what: the build succeeded" >&2
    exit 1
  fi
  if ! grep -qF "$pattern" <<<"$output"; then
    echo "$output" | tail -n 40
    echo "check-pkg-config: $what: no \"$pattern\" in the output" >&2
    exit 1
  fi
  echo "$what: failed as expected: $(grep -F "$pattern" <<<"$output" | head -n 1 | sed 's/^ *//')"
}

# A tinyloop.pc like the installed one but of the next incompatible version (0.x -> 0.(x+1).0, else major + 1).
version=$(pkg-config --modversion "$pc")
IFS=. read -r major minor _ <<<"$version"
if [ "$major" = 0 ]; then incompatible="0.$((minor + 1)).0"; else incompatible="$((major + 1)).0.0"; fi
mkdir -p "$tmp/incompatible" "$tmp/empty"
sed "s/^Version:.*/Version: $incompatible/" "$pc" >"$tmp/incompatible/tinyloop.pc"

echo "== 2. TINYLOOP_SYS_USE_PKG_CONFIG=1, only tinyloop $incompatible installed =="
expect_failure "incompatible version" "it finds version $incompatible, the bindings need" \
  PKG_CONFIG_PATH="$tmp/incompatible" PKG_CONFIG_LIBDIR="$tmp/incompatible" TINYLOOP_SYS_USE_PKG_CONFIG=1

echo "== 3. TINYLOOP_SYS_USE_PKG_CONFIG=1, no tinyloop installed =="
expect_failure "not installed" "TINYLOOP_SYS_USE_PKG_CONFIG=1 but pkg-config gives no usable tinyloop" \
  PKG_CONFIG_PATH="$tmp/empty" PKG_CONFIG_LIBDIR="$tmp/empty" TINYLOOP_SYS_USE_PKG_CONFIG=1

echo "== 4. auto mode, only tinyloop $incompatible installed: falls back to the sources =="
# CXX=false stops the source build at its first compiler call: the fallback is what is checked, not the compile.
expect_failure "fallback" "pkg-config finds tinyloop $incompatible, but these bindings need" \
  PKG_CONFIG_PATH="$tmp/incompatible" PKG_CONFIG_LIBDIR="$tmp/incompatible" CXX=false

echo "check-pkg-config: OK ($((SECONDS - start)) s)"
