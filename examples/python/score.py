#!/usr/bin/env python3
"""Scores a text file (byte-level tokens) with a .tinyloop model through libtinyloop.so, using only ctypes.

Usage: python3 score.py LIBRARY MODEL TEXT

The structs below mirror capi/include/tinyloop.h field for field (ctypes applies the C alignment rules). Each is
made here with its struct_size set to its ctypes size, so a library whose struct has another size refuses it with
an error instead of misreading it. The tl_*_init functions are not needed: the few defaults this script relies on
are set explicitly (were one called, it would be given ctypes.sizeof of the struct, as C callers pass sizeof).
"""

import ctypes
import sys

# The header version these declarations follow (TL_VERSION_MAJOR/MINOR/PATCH).
HEADER_VERSION = (0, 1, 0)

TL_OK = 0
TL_ERR_IO = -3
TL_BACKEND_CPU = 1

TL_PROGRESS_FN = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64)


class LoadOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("use_mmap", ctypes.c_int32),
        ("validate_values", ctypes.c_int32),
    ]


class ModelProperties(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("format_version", ctypes.c_int32),
        ("d_model", ctypes.c_int32),
        ("n_heads", ctypes.c_int32),
        ("head_dim", ctypes.c_int32),
        ("ffn", ctypes.c_int32),
        ("vocab", ctypes.c_int32),
        ("n_pre", ctypes.c_int32),
        ("n_loops", ctypes.c_int32),
        ("max_seq", ctypes.c_int32),
        ("group_size", ctypes.c_int32),
        ("bits", ctypes.c_int32),
        ("rope_theta", ctypes.c_float),
        ("norm_eps", ctypes.c_float),
        ("n_quant_weights", ctypes.c_uint32),
        ("n_dense_linears", ctypes.c_uint32),
        ("n_tensors", ctypes.c_uint32),
        ("head_kind", ctypes.c_int32),
        ("has_frac4", ctypes.c_int32),
        ("has_sign_bit", ctypes.c_int32),
        ("file_bytes", ctypes.c_uint64),
        ("tensor_bytes", ctypes.c_uint64),
        ("quant_weight_bytes", ctypes.c_uint64),
        ("parameter_count", ctypes.c_uint64),
    ]


class ScoreOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("backend", ctypes.c_int32),
        ("n_threads", ctypes.c_int32),
        ("window", ctypes.c_int32),
        ("progress", TL_PROGRESS_FN),
        ("progress_user_data", ctypes.c_void_p),
        ("token_nll", ctypes.POINTER(ctypes.c_float)),
        ("token_nll_len", ctypes.c_size_t),
        ("device", ctypes.c_int32),
        ("stream", ctypes.c_void_p),
        ("use_graphs", ctypes.c_int32),
        ("max_memory_bytes", ctypes.c_uint64),
    ]


class ScoreResult(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("nll_sum", ctypes.c_double),
        ("tokens_scored", ctypes.c_uint64),
        ("perplexity", ctypes.c_double),
        ("backend", ctypes.c_int32),
        ("n_windows", ctypes.c_int32),
        ("seconds", ctypes.c_double),
        ("gemm_marlin_fused", ctypes.c_uint64),
        ("gemm_marlin_correction", ctypes.c_uint64),
        ("gemm_dequant_cublas", ctypes.c_uint64),
        ("gemm_fp16_body", ctypes.c_uint64),
        ("gemm_native", ctypes.c_uint64),
        ("gemm_dense_cublas", ctypes.c_uint64),
        ("gemm_fallbacks", ctypes.c_uint64),
    ]


class TinyLoopError(Exception):
    """A failed call: the status, its name and the library's message for the calling thread."""

    def __init__(self, call, status, name, message):
        super().__init__(f"{call}: {name} ({status}): {message}")
        self.status = status
        self.message = message


class Library:
    """The functions this script calls, declared with their C signatures."""

    def __init__(self, path):
        lib = ctypes.CDLL(path)
        self._lib = lib
        model_p = ctypes.c_void_p  # tl_model * is opaque: a plain pointer here
        self._declare("tl_version", ctypes.c_uint32, [])
        self._declare("tl_version_string", ctypes.c_char_p, [])
        self._declare("tl_status_string", ctypes.c_char_p, [ctypes.c_int32])
        self._declare("tl_last_error_message", ctypes.c_char_p, [])
        self._declare(
            "tl_model_load", ctypes.c_int32, [ctypes.c_char_p, ctypes.POINTER(LoadOptions), ctypes.POINTER(model_p)]
        )
        self._declare("tl_model_free", None, [model_p])
        self._declare("tl_model_info", ctypes.c_int32, [model_p, ctypes.POINTER(ModelProperties)])
        self._declare(
            "tl_score",
            ctypes.c_int32,
            [model_p, ctypes.POINTER(ctypes.c_int32), ctypes.c_size_t, ctypes.POINTER(ScoreOptions),
             ctypes.POINTER(ScoreResult)],
        )

    def _declare(self, name, restype, argtypes):
        function = getattr(self._lib, name)
        function.restype = restype
        function.argtypes = argtypes
        setattr(self, name, function)

    def check(self, call, status):
        """Raises TinyLoopError for a failed status, with the message read right after the call."""
        if status != TL_OK:
            message = self.tl_last_error_message().decode("utf-8", "replace")
            name = self.tl_status_string(status).decode("utf-8", "replace")
            raise TinyLoopError(call, status, name, message)


def new_struct(struct_type, **fields):
    """A zero-filled struct with its struct_size set and the given fields."""
    return struct_type(struct_size=ctypes.sizeof(struct_type), **fields)


def version_compatible(library_version):
    """Same major; before 1.0 the same minor too (a minor may change the ABI), from 1.0 on at least as new."""
    major, minor = library_version >> 16, (library_version >> 8) & 0xFF
    if major != HEADER_VERSION[0]:
        return False
    return minor == HEADER_VERSION[1] if major == 0 else minor >= HEADER_VERSION[1]


def main(argv):
    if len(argv) != 4:
        print("usage: score.py LIBRARY MODEL TEXT", file=sys.stderr)
        return 2
    lib = Library(argv[1])
    version = lib.tl_version()
    print(f"library {lib.tl_version_string().decode()} (0x{version:06x}), bindings {'.'.join(map(str, HEADER_VERSION))}")
    if not version_compatible(version):
        print("the library's version does not match these bindings", file=sys.stderr)
        return 1

    # The error path: a missing file is TL_ERR_IO, with a message naming it.
    model = ctypes.c_void_p()
    try:
        lib.check("tl_model_load", lib.tl_model_load(b"/nonexistent/model.tinyloop", None, ctypes.byref(model)))
        print("loading a missing file succeeded", file=sys.stderr)
        return 1
    except TinyLoopError as error:
        if error.status != TL_ERR_IO or "nonexistent" not in error.message or model.value is not None:
            print(f"unexpected failure for a missing file: {error}", file=sys.stderr)
            return 1
        print(f"expected error: {error}")

    # The documented defaults, spelled out.
    load_options = new_struct(LoadOptions, use_mmap=1, validate_values=1)
    lib.check("tl_model_load", lib.tl_model_load(argv[2].encode(), ctypes.byref(load_options), ctypes.byref(model)))
    try:
        info = new_struct(ModelProperties)
        lib.check("tl_model_info", lib.tl_model_info(model, ctypes.byref(info)))
        print(f"model: d_model {info.d_model}, vocab {info.vocab}, {info.n_pre} pre blocks + 1 looped x {info.n_loops}")

        with open(argv[3], "rb") as text:
            data = text.read()
        tokens = (ctypes.c_int32 * len(data))(*data)
        # Per-token NLLs too, to check that they add up to the total the library reports.
        token_nll = (ctypes.c_float * max(len(data) - 1, 1))()
        # Every other option's default is 0 / NULL.
        options = new_struct(ScoreOptions, backend=TL_BACKEND_CPU, token_nll=token_nll, token_nll_len=len(token_nll))
        result = new_struct(ScoreResult)
        lib.check("tl_score", lib.tl_score(model, tokens, len(data), ctypes.byref(options), ctypes.byref(result)))
    finally:
        lib.tl_model_free(model)

    total = sum(token_nll[: result.tokens_scored])
    if abs(total - result.nll_sum) > 1e-4 * abs(result.nll_sum):
        print(f"per-token NLLs add up to {total}, the library reports {result.nll_sum}", file=sys.stderr)
        return 1
    print(f"perplexity {result.perplexity:.4f} over {result.tokens_scored} tokens ({result.n_windows} windows, "
          f"{len(data) / result.seconds:.1f} tokens/s)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except TinyLoopError as error:
        print(error, file=sys.stderr)
        sys.exit(1)
