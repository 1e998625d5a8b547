"""TinyLoop INT4 from Python: load .tinyloop models and score text through libtinyloop's C API (ctypes).

    import tinyloop
    with tinyloop.Model("models/demo-int4.tinyloop", device="cpu") as model:
        result = model.score("The quick brown fox", per_token=True)
        print(result.perplexity, result.token_nll)

The library is loaded on first use, from $TINYLOOP_LIBRARY, a copy bundled in this package, or the system
(docs/python.md). tinyloop.lm_eval holds an lm-evaluation-harness model class; it imports lm_eval, this module does
not.
"""

import json

from . import _capi, text
from ._capi import ABI_VERSION, LibraryError, LibraryVersionError
from ._errors import Error, Status
from ._model import BatchResult, CompareResult, Model, ScoreResult, SequenceScore, device_count, device_info

__version__ = "0.1.0"

# Tracebacks and reprs name the public module, not the private one that defines the class.
for _public in (BatchResult, CompareResult, Error, LibraryError, LibraryVersionError, Model, ScoreResult, SequenceScore, Status):
    _public.__module__ = __name__
del _public

__all__ = [
    "ABI_VERSION", "BatchResult", "CompareResult", "Error", "LibraryError", "LibraryVersionError", "Model", "ScoreResult",
    "SequenceScore", "Status", "build_info", "device_count", "device_info", "library_path", "library_version",
    "text",
]


def library_path():
    """The path or name the library was loaded from (loading it if needed)."""
    return _capi.lib().path


def library_version():
    """The loaded library's version (tl_version) as (major, minor, patch)."""
    return _capi.lib().version


def build_info():
    """The loaded library's build (tl_build_info): version, compiler, build type, CUDA, ... as a dict."""
    return json.loads(_capi.lib().tl_build_info().decode("utf-8"))
