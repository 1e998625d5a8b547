#!/usr/bin/env python3
"""Fails when a lower layer of the library includes a higher one (docs/architecture.md, "Layers").

The layers, lowest first:
    util -> text -> format -> quant -> score -> cpu -> gptq -> import -> cuda -> gpu -> capi -> cli
(util is cpp/util; text is cpp/text, the tokenizers; format .. import are the core, cpp/<name>; cuda is the kernels
and their launchers, cuda/; gpu is their host side, cpp/gpu; capi is capi/; cli is cpp/cli.) A source may include headers of its own layer and of the
layers below it, except that cuda/ is self-contained: it includes nothing from cpp/ (its types are in its own headers).
The public header capi/include/tinyloop.h is the C API's: below it only cpp/util/error.hpp includes it, for the status
and constant values, and no code below capi/ names the ABI's TL_FORM_* or TL_DISPATCH_* constants (capi/ translates
them into the GPU layer's own enums). Nothing below the CLI reads the environment (getenv): settings belong on handles
and options, and only the tool maps variables onto them.

    python3 tools/check_layers.py [REPO_ROOT]   check the repository (default: the one holding this script)
    python3 tools/check_layers.py --self-test   show that each rule catches a violation, on temporary trees
"""
import os
import re
import subprocess
import sys
import tempfile

LAYERS = [
    ("util", ["cpp/util/"]),
    ("text", ["cpp/text/"]),
    ("format", ["cpp/format/"]),
    ("quant", ["cpp/quant/"]),
    ("score", ["cpp/score/"]),
    ("cpu", ["cpp/cpu/"]),
    ("gptq", ["cpp/gptq/"]),
    ("import", ["cpp/import/"]),
    ("cuda", ["cuda/"]),
    ("gpu", ["cpp/gpu/"]),
    ("capi", ["capi/"]),
    ("cli", ["cpp/cli/"]),
]
# Layers that may include only the layers named here (their own included), not everything below them.
ONLY = {"cuda": {"cuda"}}
PUBLIC_HEADER = "capi/include/tinyloop.h"
PUBLIC_HEADER_BELOW_CAPI = {"cpp/util/error.hpp"}
# ABI constants that only capi/ (and above) may name: below it the library speaks its own types.
ABI_ONLY = re.compile(r"\b(TL_FORM_\w+|TL_DISPATCH_\w+)")
# The environment: only the CLI reads it.
ENVIRONMENT = re.compile(r"\b(getenv|secure_getenv)\s*\(")
# Where the build looks for "..." includes, after the including file's own folder.
INCLUDE_ROOTS = ["cpp", "cuda", "capi/include", "capi/src"]
SOURCE = re.compile(r"\.(c|cc|cpp|h|hpp|cu|cuh)$")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)


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


def check(root):
    """The layer violations of the tree at `root`, and the number of sources checked."""
    problems, checked = [], 0
    capi_level = layer_of("capi/")[0]
    for top in ["cpp", "cuda", "capi"]:
        for folder, dirs, names in os.walk(os.path.join(root, top)):
            dirs.sort()
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
                    if target_level is None:
                        continue
                    if target_level > level:
                        problems.append(f"{path} ({name}) includes {target} ({target_name}), a higher layer")
                    elif name in ONLY and target_name not in ONLY[name]:
                        problems.append(f"{path} ({name}) includes {target} ({target_name}): {name} may include only "
                                        f"{', '.join(sorted(ONLY[name]))}")
                if name != "cli" and ENVIRONMENT.search(COMMENT.sub("", text)):
                    problems.append(f"{path} ({name}) reads the environment: only the CLI may; take the value "
                                    "from a handle's settings or a call's options")
                if level < capi_level:
                    for constant in sorted(set(ABI_ONLY.findall(COMMENT.sub("", text)))):
                        problems.append(f"{path} ({name}) names the C API's {constant}: translate it in capi/ into "
                                        "the layer's own type")
    return problems, checked


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    root = os.path.abspath(argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    problems, checked = check(root)
    for p in problems:
        print(p)
    print(f"{checked} sources checked, {len(problems)} layer violations")
    return 1 if problems else 0


# ---- Self-test: a clean tree passes, and each kind of violation, put into it alone, fails ----

CLEAN_TREE = {
    "capi/include/tinyloop.h": "static const int TL_DISPATCH_USE_MARLIN = 0;\n",
    "capi/src/api.cpp": '#include "tinyloop.h"\n#include "gpu/dispatch.hpp"\nint a = TL_DISPATCH_USE_MARLIN;\n',
    "cpp/util/error.hpp": '#include "tinyloop.h"\n',
    "cpp/format/model.hpp": '#include "util/error.hpp"\n',
    "cuda/kernels.hpp": '#include "dtype.hpp"\n',
    "cuda/dtype.hpp": "enum class Dtype { F16 };\n",
    "cpp/gpu/dispatch.hpp": ('#include "kernels.hpp"\n#include "format/model.hpp"\n'
                             "// Set through tl_set_dispatch(TL_DISPATCH_USE_MARLIN, ...): comments may name it.\n"),
}
# Each violation: the files that differ from the clean tree, and a fragment of the message expected for it.
VIOLATIONS = {
    "cuda includes cpp/gpu": ({"cuda/kernels.hpp": '#include "gpu/dispatch.hpp"\n'},
                              "cuda/kernels.hpp (cuda) includes cpp/gpu/dispatch.hpp (gpu), a higher layer"),
    "cuda includes the core": ({"cuda/kernels.hpp": '#include "format/model.hpp"\n'},
                               "cuda/kernels.hpp (cuda) includes cpp/format/model.hpp (format): cuda may include only"),
    "the core includes cuda": ({"cpp/format/model.hpp": '#include "dtype.hpp"\n'},
                               "cpp/format/model.hpp (format) includes cuda/dtype.hpp (cuda), a higher layer"),
    "gpu includes capi": ({"cpp/gpu/dispatch.hpp": '#include "api.cpp"\n'},
                          "cpp/gpu/dispatch.hpp (gpu) includes capi/src/api.cpp (capi), a higher layer"),
    "gpu includes the public header": ({"cpp/gpu/dispatch.hpp": '#include "tinyloop.h"\n'},
                                       "includes the public header tinyloop.h"),
    "gpu names an ABI constant": ({"cpp/gpu/dispatch.hpp": "int s = TL_DISPATCH_USE_MARLIN;\n"},
                                  "cpp/gpu/dispatch.hpp (gpu) names the C API's TL_DISPATCH_USE_MARLIN"),
    "a folder in no layer": ({"cpp/other/x.hpp": "\n"}, "cpp/other/x.hpp: in no layer"),
    "the library reads the environment": ({"cpp/gpu/dispatch.hpp": 'const char *v = std::getenv("X");\n'},
                                          "cpp/gpu/dispatch.hpp (gpu) reads the environment"),
}


def write_tree(root, files):
    for path, text in files.items():
        os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
        with open(os.path.join(root, path), "w", encoding="utf-8") as f:
            f.write(text)


def self_test():
    failures = []
    with tempfile.TemporaryDirectory(prefix="check_layers.") as scratch:
        clean = os.path.join(scratch, "clean")
        write_tree(clean, CLEAN_TREE)
        problems, _ = check(clean)
        print(f"clean tree: {len(problems)} violations")
        if problems:
            failures.append(f"the clean tree has violations: {problems}")
        for index, (case, (changes, expected)) in enumerate(VIOLATIONS.items()):
            root = os.path.join(scratch, f"case{index}")
            write_tree(root, {**CLEAN_TREE, **changes})
            problems, _ = check(root)
            # The command line too: it must exit 1 and print the violation.
            run = subprocess.run([sys.executable, os.path.abspath(__file__), root], capture_output=True, text=True)
            caught = len(problems) == 1 and expected in problems[0] and run.returncode == 1 and expected in run.stdout
            print(f"{case}: {'caught' if caught else 'MISSED'}: exit {run.returncode}, {problems}")
            if not caught:
                failures.append(f"{case}: expected exactly one violation containing {expected!r} and exit status 1")
    for failure in failures:
        print("self-test failure:", failure)
    print("self-test", "failed" if failures else "passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
