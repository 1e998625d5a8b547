#!/usr/bin/env bash
# Builds and runs consumer.c, a program outside the project, the three ways a user gets the library:
#   find_package(tinyloop) and pkg-config, both against `cmake --install` of an already built tree, and
#   FetchContent_MakeAvailable of this source tree (CPU only; only the library target and the consumer are built).
# Each prints one line after checking tl_version() against the header it compiled with and loading the fixture.
# Usage: tests/consumers/run.sh REPO_ROOT SCRATCH [BUILD_DIR]   (BUILD_DIR, the tree to install: REPO_ROOT/build)
# Writes under SCRATCH only (and install_manifest.txt in BUILD_DIR, which cmake --install always writes).
# SCRATCH/fetchcontent is kept between runs so that a rerun compiles only what changed; everything else is fresh.
set -euo pipefail
if (($# < 2)); then
  echo "usage: $0 REPO_ROOT SCRATCH [BUILD_DIR]" >&2
  exit 2
fi
root=$(cd "$1" && pwd)
mkdir -p "$2"
scratch=$(cd "$2" && pwd)
build=${3:-$root/build}
here=$root/tests/consumers
model=$root/tests/data/tiny.tinyloop
jobs=$(nproc)
start=$SECONDS

fail() {
  echo "CONSUMERS FAILURE: $*" >&2
  exit 1
}
# Runs a command with its output in a log, shown (the end of it) only on failure.
quiet() {
  local log=$1
  shift
  "$@" >"$log" 2>&1 || { tail -n 40 "$log" >&2; fail "$* (log: $log)"; }
}
# run_consumer NAME LIBDIR PROGRAM: the program prints its line, and libtinyloop resolves into LIBDIR (not another
# copy somewhere on the machine).
run_consumer() {
  local name=$1 libdir=$2 program=$3 out loaded
  out=$("$program" "$model") || fail "$name consumer exited with $?"
  echo "$out"
  [[ $out == "$name consumer: tinyloop $version matches its header, loaded $model" ]] ||
    fail "$name consumer printed something else"
  loaded=$(ldd "$program" | awk '$1 ~ /^libtinyloop\.so/ { print $3 }')
  [[ -n $loaded && $(cd "$(dirname "$loaded")" && pwd -P) == $(cd "$libdir" && pwd -P) ]] ||
    fail "$name consumer loads libtinyloop from '$loaded', not from $libdir"
}

version=$(awk '/#define TL_VERSION_(MAJOR|MINOR|PATCH)/ { v = v (v == "" ? "" : ".") $3 } END { print v }' \
  "$root/capi/include/tinyloop.h")
major=${version%%.*}

# ---- Install, then move the install: what the .pc and the CMake package say must hold wherever the tree lies ----
rm -rf "$scratch/stage" "$scratch/prefix" "$scratch/find_package" "$scratch/pkg-config" "$scratch/fetchcontent-prefix"
quiet "$scratch/install.log" cmake --install "$build" --prefix "$scratch/stage"
mv "$scratch/stage" "$scratch/prefix"
prefix=$scratch/prefix
pc=$(find "$prefix" -name tinyloop.pc)
[[ -f $pc ]] || fail "no (or more than one) tinyloop.pc under $prefix"
libdir=$(dirname "$(dirname "$pc")")
cmp -s "$prefix/include/tinyloop.h" "$root/capi/include/tinyloop.h" || fail "installed header differs or is missing"
[[ -L $libdir/libtinyloop.so && -L $libdir/libtinyloop.so.$major && -f $libdir/libtinyloop.so.$version &&
  $(readlink -f "$libdir/libtinyloop.so") == $(readlink -f "$libdir/libtinyloop.so.$version") ]] ||
  fail "expected libtinyloop.so -> libtinyloop.so.$major -> libtinyloop.so.$version in $libdir"
readelf -d "$libdir/libtinyloop.so.$version" | grep -q "(SONAME).*\[libtinyloop\.so\.$major\]" ||
  fail "libtinyloop.so.$version has no SONAME libtinyloop.so.$major"
for f in tinyloopConfig.cmake tinyloopConfigVersion.cmake tinyloopTargets.cmake; do
  [[ -f $libdir/cmake/tinyloop/$f ]] || fail "$libdir/cmake/tinyloop/$f not installed"
done
grep -q '^prefix=${pcfiledir}/' "$pc" && ! grep -q "=/" "$pc" ||
  fail "$pc is not relocatable (prefix must be \${pcfiledir}/..., no absolute paths):$(printf '\n'; cat "$pc")"
echo "installed to a scratch prefix and moved: header, libtinyloop.so.$version (SONAME links), CMake package, .pc"

# ---- (a) find_package(tinyloop) ----
quiet "$scratch/find_package.log" cmake -S "$here/find_package" -B "$scratch/find_package" \
  -DCMAKE_PREFIX_PATH="$prefix"
grep -q "^tinyloop_DIR:PATH=$libdir/cmake/tinyloop$" "$scratch/find_package/CMakeCache.txt" ||
  fail "find_package found another tinyloop: $(grep '^tinyloop_DIR' "$scratch/find_package/CMakeCache.txt")"
quiet "$scratch/find_package.log" cmake --build "$scratch/find_package" -j"$jobs"
# No LD_LIBRARY_PATH: CMake gives the executable a build-tree RPATH to the imported library's folder.
run_consumer find_package "$libdir" "$scratch/find_package/consumer"

# ---- (b) pkg-config and plain cc ----
mkdir -p "$scratch/pkg-config"
export PKG_CONFIG_PATH=$libdir/pkgconfig
[[ $(pkg-config --modversion tinyloop) == "$version" ]] || fail "pkg-config --modversion tinyloop is not $version"
read -r -a cflags <<<"$(pkg-config --cflags tinyloop)"
read -r -a libs <<<"$(pkg-config --libs tinyloop)"
cc -std=c99 -Wall -Wextra -Werror -DTL_CONSUMER='"pkg-config"' "${cflags[@]}" "$here/consumer.c" \
  -o "$scratch/pkg-config/consumer" "${libs[@]}"
# Plain cc writes no RPATH: the loader is told where the library is, as a pkg-config user without -rpath would.
LD_LIBRARY_PATH="$(pkg-config --variable=libdir tinyloop)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  run_consumer pkg-config "$libdir" "$scratch/pkg-config/consumer"

# ---- (c) FetchContent of this tree, CPU only ----
fc=$scratch/fetchcontent
fc_start=$SECONDS
# A fresh configure every time (no cached TL_* choices), while the object files stay for the incremental build.
rm -f "$fc/CMakeCache.txt"
quiet "$scratch/fetchcontent.log" cmake -S "$here/fetchcontent" -B "$fc" -DTL_SOURCE_DIR="$root" -DTL_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=Release
# The consumer target alone: tinyloop_core, libtinyloop and consumer.c; not the CLI or anything else of ALL.
quiet "$scratch/fetchcontent.log" cmake --build "$fc" --target consumer -j"$jobs"
run_consumer FetchContent "$fc/_deps/tinyloop-build" "$fc/consumer"
# The parent's install carries the library its programs link (and tinyloop's package), nothing fails.
quiet "$scratch/fetchcontent.log" cmake --install "$fc" --prefix "$scratch/fetchcontent-prefix"
[[ -n $(find "$scratch/fetchcontent-prefix" -name "libtinyloop.so.$version") ]] ||
  fail "the FetchContent consumer's install lacks libtinyloop.so.$version"
echo "FetchContent build: $((SECONDS - fc_start)) s"

echo "consumers passed ($((SECONDS - start)) s)"
