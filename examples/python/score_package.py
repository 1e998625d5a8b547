#!/usr/bin/env python3
"""Scores a text file (byte-level tokens) with a .tinyloop model through the tinyloop package (python/,
docs/python.md): the same as score.py beside it, which uses ctypes alone (the way for bindings in other languages).

Usage: python3 score_package.py MODEL TEXT [--device auto|cpu|cuda|cuda:N]
The library comes from $TINYLOOP_LIBRARY, a copy bundled in the package, or the system.
"""

import argparse

import numpy as np

import tinyloop


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("text")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()

    print(f"library {'.'.join(map(str, tinyloop.library_version()))} from {tinyloop.library_path()}")
    try:
        tinyloop.Model("/nonexistent/model.tinyloop")
    except tinyloop.Error as error:  # a missing file is TL_ERR_IO, with a message naming it
        print(f"expected error: {error.status_name}: {error.message}")

    with tinyloop.Model(args.model, device=args.device) as model, open(args.text, "rb") as text:
        info = model.info
        print(f"model: d_model {info['d_model']}, vocab {info['vocab']}, {info['n_pre']} pre blocks + 1 looped "
              f"x {info['n_loops']}")
        data = text.read()
        result = model.score(data, per_token=True)
    print(f"perplexity {result.perplexity:.4f} over {result.tokens_scored} tokens ({result.n_windows} windows, "
          f"{result.backend}, {result.tokens_scored / result.seconds:.1f} tokens/s)")
    hardest = np.argsort(result.token_nll, kind="stable")[::-1][:3]
    print("hardest bytes: " + ", ".join(f"{data[i + 1:i + 2]!r} at {i + 1} ({result.token_nll[i]:.2f} nats)"
                                        for i in hardest))


if __name__ == "__main__":
    main()
