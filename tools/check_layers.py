#!/usr/bin/env python3
"""Fails when a lower layer of the library includes a higher one (docs/architecture.md, "Layers").

The layers, lowest first: util -> text (tokenizers) -> format -> quant -> score -> cpu -> gptq -> gpu (cpp/gpu and cuda/) -> capi -> cli.
A source may include headers of its own layer and of the layers below it. The public header capi/include/tinyloop.h
is the C API's: below it only cpp/util/error.hpp includes it, for the status and constant values.

    python3 tools/check_layers.py [REPO_ROOT]
"""
import os
import re
import sys

LAYERS = [
    ("util", ["cpp/util/"]),
    ("text", ["cpp/text/"]),
    ("format", ["cpp/format/"]),
    ("quant", ["cpp/quant/"]),
    ("score", ["cpp/score/"]),
    ("cpu", ["cpp/cpu/"]),
    ("gptq", ["cpp/gptq/"]),
    ("gpu", ["cpp/gpu/", "cuda/"]),
    ("capi", ["capi/"]),
    ("cli", ["cpp/cli/"]),
]
PUBLIC_HEADER = "capi/include/tinyloop.h"
PUBLIC_HEADER_BELOW_CAPI = {"cpp/util/error.hpp"}
# Where the build looks for "..." includes, after the including file's own folder.
INCLUDE_ROOTS = ["cpp", "cuda", "capi/include", "capi/src"]
SOURCE = re.compile(r"\.(c|cc|cpp|h|hpp|cu|cuh)$")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of(path):
    for index, (name, prefixes) in enumerate(LAYERS):
        if any(path.startswith(p) for p in prefixes):
            return index, name
    return None, None


def resolve(root, including, name):
    for base in [os.path.dirname(including)] + INCLUDE_ROOTS:
        candidate = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(os.path.join(root, candidate)):
            return candidate
    return None  # generated (build_info.hpp) or a system header spelled with quotes


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    problems, checked = [], 0
    for top in ["cpp", "cuda", "capi"]:
        for folder, _, names in os.walk(os.path.join(root, top)):
            for file_name in sorted(names):
                if not SOURCE.search(file_name):
                    continue
                path = os.path.relpath(os.path.join(folder, file_name), root)
                level, name = layer_of(path)
                if level is None:
                    problems.append(f"{path}: in no layer (add its folder to LAYERS in tools/check_layers.py)")
                    continue
                checked += 1
                with open(os.path.join(root, path), encoding="utf-8") as f:
                    text = f.read()
                for included in INCLUDE.findall(text):
                    target = resolve(root, path, included)
                    if target is None:
                        continue
                    if target == PUBLIC_HEADER:
                        if name not in ("capi", "cli") and path not in PUBLIC_HEADER_BELOW_CAPI:
                            problems.append(f"{path} ({name}) includes the public header {included}: use the core's "
                                            "own types (util/error.hpp brings the status values)")
                        continue
                    target_level, target_name = layer_of(target)
                    if target_level is not None and target_level > level:
                        problems.append(f"{path} ({name}) includes {target} ({target_name}), a higher layer")
    for p in problems:
        print(p)
    print(f"{checked} sources checked, {len(problems)} layer violations")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
