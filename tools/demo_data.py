#!/usr/bin/env python3
"""Builds the demo model's text corpus from Debian's python3.11-doc package (standard library only).

The corpus is the reStructuredText sources of the Python 3.11 documentation as Debian ships them
(/usr/share/doc/python3.11/html/_sources/**/*.rst.txt; license: the PSF license, see data/LICENSES.md), English
technical prose with code examples. Files are read in sorted path order and joined with one blank line; bytes are
kept as they are (the model is byte-level: token = byte). Three disjoint splits, by directory:

  train.txt  every file outside tutorial/ and faq/           the training data
  valid.txt  faq/                                            checkpoint selection while training
  eval.txt   tutorial/, cut to the first --eval-bytes bytes  the held-out evaluation text (shipped as
             (at a line end)                                 data/eval.txt; never seen in training or selection)
  calib.txt  --calib-chunks chunks of 4 KiB evenly spaced    GPTQ calibration text (a subset of train.txt)
             through train.txt

Usage: tools/demo_data.py OUT_DIR [--sources DIR] [--eval-bytes N] [--calib-chunks N]
Install the package first: apt-get install python3.11-doc (scripts/train-demo.sh does).
"""

import argparse
import hashlib
import pathlib
import sys

DEFAULT_SOURCES = "/usr/share/doc/python3.11/html/_sources"
HELD_OUT = "tutorial"
VALID = "faq"
CALIB_CHUNK = 4096


def read_split(files):
    return b"\n\n".join(f.read_bytes().rstrip(b"\n") for f in files) + b"\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--sources", default=DEFAULT_SOURCES)
    parser.add_argument("--eval-bytes", type=int, default=65536)
    parser.add_argument("--calib-chunks", type=int, default=16)
    args = parser.parse_args()

    root = pathlib.Path(args.sources)
    files = sorted(root.rglob("*.rst.txt"))
    if not files:
        sys.exit(f"demo_data.py: no *.rst.txt under {root} (apt-get install python3.11-doc)")
    top = lambda f: f.relative_to(root).parts[0]
    splits = {
        "train.txt": [f for f in files if top(f) not in (HELD_OUT, VALID)],
        "valid.txt": [f for f in files if top(f) == VALID],
        "eval.txt": [f for f in files if top(f) == HELD_OUT],
    }
    out = pathlib.Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, members in splits.items():
        data = read_split(members)
        if name == "eval.txt" and len(data) > args.eval_bytes:
            data = data[:data.rindex(b"\n", 0, args.eval_bytes) + 1]
        write(out / name, data, f"{len(members)} files")
        if name == "train.txt":
            step = len(data) // args.calib_chunks
            calib = b"".join(data[i * step:i * step + CALIB_CHUNK] for i in range(args.calib_chunks))
            write(out / "calib.txt", calib, f"{args.calib_chunks} chunks of train.txt")


def write(path, data, what):
    path.write_bytes(data)
    print(f"{path.name}: {what}, {len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()[:16]}")


if __name__ == "__main__":
    main()
