"""Fixtures of the tinyloop package's tests: the repository's models and texts, the library, the CLI.

The library is $TINYLOOP_LIBRARY (scripts/test.sh points it at the fresh build); when that is unset, the first
build*/lib/libtinyloop.so of the checkout is used, and it is set to that for the tests that start a Python process.
The CLI comparisons use $TINYLOOP_CLI, else the tinyloop executable of the library's build folder (bin/ beside lib/),
and are skipped when there is none.
"""

import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
DEMO_MODEL = REPO / "models" / "demo-int4.tinyloop"
TINY_MODEL = REPO / "tests" / "data" / "tiny.tinyloop"
DEMO_TEXT = REPO / "data" / "demo.txt"
EVAL_TEXT = REPO / "data" / "eval.txt"


def _find_library():
    explicit = os.environ.get("TINYLOOP_LIBRARY")
    if explicit:
        return pathlib.Path(explicit)
    for candidate in sorted(REPO.glob("build*/lib/libtinyloop.so")):
        return candidate
    return None


LIBRARY = _find_library()
if LIBRARY is not None:
    os.environ["TINYLOOP_LIBRARY"] = str(LIBRARY)


@pytest.fixture(scope="session")
def library_path():
    if LIBRARY is None or not LIBRARY.exists():
        pytest.fail("no libtinyloop: build it (docs/python.md) or set TINYLOOP_LIBRARY to its path")
    return LIBRARY


@pytest.fixture(scope="session")
def cli(library_path):
    explicit = os.environ.get("TINYLOOP_CLI")
    path = pathlib.Path(explicit) if explicit else library_path.resolve().parent.parent / "bin" / "tinyloop"
    if not path.exists():
        pytest.skip(f"no tinyloop CLI at {path} (set TINYLOOP_CLI)")
    return path


@pytest.fixture(scope="session")
def tinyloop(library_path):
    import tinyloop

    return tinyloop


@pytest.fixture
def tiny(tinyloop):
    with tinyloop.Model(TINY_MODEL, device="cpu") as model:
        yield model


@pytest.fixture(scope="session")
def demo(tinyloop):
    with tinyloop.Model(DEMO_MODEL, device="cpu") as model:
        yield model


def run_python(code, env_update=None, env_remove=(), cwd=None):
    """Runs `code` in a fresh interpreter (this one), the package importable as in this process."""
    env = dict(os.environ)
    for name in env_remove:
        env.pop(name, None)
    env.update(env_update or {})
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=60)
