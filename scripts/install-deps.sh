#!/usr/bin/env bash
# Installs the Debian 12 packages TinyLoop needs to build and test (idempotent; skips apt when all are present).
# The CUDA toolkit is optional and not a Debian package: when /usr/local/cuda/bin/nvcc exists the CUDA backend
# is built too.
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  nlohmann-json3-dev   # JSON header of .tinyloop files
  libcli11-dev         # command-line parsing of the tinyloop tool
  libeigen3-dev        # Cholesky factorizations of the GPTQ quantizer (header-only)
  libgtest-dev         # C++ unit tests
  libcriterion-dev     # C API conformance suite
  libpcre2-dev         # tokenizers: tokenizer.json's split regexes (Unicode properties, lookahead)
  libutf8proc-dev      # tokenizers: tokenizer.json's NFC normalizer
  libsentencepiece-dev # tokenizers: SentencePiece tokenizer.model files
  librust-cc-dev       # Rust build script: compiles the C++ core
  librust-jobserver-dev  # Rust build script: the cc crate's parallel compilation
  librust-log-dev      # Rust crate: destructors log the errors they cannot return
  librust-serde-json-dev  # Rust scoring-service example: line-delimited JSON
  librust-clap-dev        # Rust scoring-service example: its command line and --help (clap 4.0.32 in Debian 12;
                          # it depends on librust-clap-derive-dev, so the derive feature is there)
  librust-criterion-dev   # Rust benchmarks (cargo bench)
  librust-bindgen+runtime-dev  # Rust drift test: reads tinyloop.h through libclang (test-only helper crate)
  librust-syn-dev         # Rust drift test: lists the items bindgen generates
  librust-pkg-config-dev  # Rust build script: finds an installed libtinyloop (tinyloop.pc)
  librust-half-dev        # Rust crate: half::f16, the FP16 type of the safe API
  python3              # the ctypes example (examples/python), run by CTest
  python3-numpy        # the Python package (python/): token and NLL arrays
  python3-regex        # tokenizer tests (tests/text): the reference BPE's split regexes (\p{L}, lookahead)
  python3-sentencepiece  # tokenizer tests (tests/text): trains the test SentencePiece model, its reference ids
  python3-pytest       # the Python package's tests (scripts/test.sh)
  python3-setuptools   # builds the Python package (pyproject.toml's backend, offline: --no-build-isolation)
  python3-wheel        # setuptools 66's bdist_wheel, which pip's build of the package calls
  python3-pip          # installs the package into scripts/test.sh's venv
  python3-venv         # python3 -m venv (ensurepip) for that venv
  python3-dask         # tinyloop.distributed (optional for the package): Dask
  python3-distributed  # tinyloop.distributed: Dask's cluster (scheduler, workers, LocalCluster); its tests
  clang                # the fuzz step of scripts/test.sh: libFuzzer is clang-only
  libclang-rt-14-dev   # libFuzzer + clang's sanitizer runtimes for clang 14 (merely Recommended by clang-14's packages)
)
# Rust toolchain: Debian's, unless one is already on PATH (e.g. rustup).
command -v cargo >/dev/null 2>&1 || packages+=(cargo rustc)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
else
  echo "install-deps: all Debian packages present"
fi
