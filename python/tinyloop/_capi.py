"""The C API through ctypes: the header's structs and functions, finding and loading libtinyloop, status checks.

Everything here mirrors capi/include/tinyloop.h; tests/test_header.py compares these declarations with the header,
field by field, so the two cannot drift apart unnoticed. Nothing else in the package touches ctypes.
"""

import ctypes
import ctypes.util
import os
import threading

# The header version these declarations follow (TL_VERSION_MAJOR/MINOR/PATCH of capi/include/tinyloop.h).
ABI_VERSION = (0, 1, 0)

# Status codes (tl_status values; never renumbered, new ones appended).
TL_OK = 0
STATUS_NAMES = {
    0: "TL_OK",
    -1: "TL_ERR_INVALID_ARGUMENT",
    -2: "TL_ERR_OUT_OF_MEMORY",
    -3: "TL_ERR_IO",
    -4: "TL_ERR_FORMAT",
    -5: "TL_ERR_UNSUPPORTED",
    -6: "TL_ERR_NO_DEVICE",
    -7: "TL_ERR_CUDA",
    -8: "TL_ERR_INTERNAL",
    -9: "TL_ERR_BUFFER_TOO_SMALL",
    -10: "TL_ERR_NOT_FOUND",
    -11: "TL_ERR_CANCELLED",
}
STATUS_CODES = {name: value for value, name in STATUS_NAMES.items()}

TL_BACKEND_AUTO = 0
TL_BACKEND_CPU = 1
TL_BACKEND_CUDA = 2

# tl_score_options.activations, tl_compare_options.activations_reference / activations_test, by the names the
# package takes.
TL_ACTIVATIONS_FP16 = 0
TL_ACTIVATIONS_INT8 = 1
TL_ACTIVATIONS_FP8 = 2
ACTIVATIONS = {"fp16": TL_ACTIVATIONS_FP16, "int8": TL_ACTIVATIONS_INT8, "fp8": TL_ACTIVATIONS_FP8}

# Tokenizer kinds (tl_model_tokenizer): the names the package gives them.
TL_TOKENIZER_BYTES = 0
TL_TOKENIZER_HUGGINGFACE = 1
TL_TOKENIZER_SENTENCEPIECE = 2
TOKENIZER_NAMES = {TL_TOKENIZER_BYTES: "bytes", TL_TOKENIZER_HUGGINGFACE: "huggingface",
                   TL_TOKENIZER_SENTENCEPIECE: "sentencepiece"}

tl_progress_fn = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64)


class tl_load_options(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("use_mmap", ctypes.c_int32),
        ("validate_values", ctypes.c_int32),
    ]


class tl_model_properties(ctypes.Structure):
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
        ("bos_token_id", ctypes.c_int32),
        ("n_kv_heads", ctypes.c_int32),
        ("rope_scaling", ctypes.c_int32),
        ("rope_scaling_factor", ctypes.c_float),
        ("rope_original_max_positions", ctypes.c_int32),
    ]

ROPE_SCALING_NAMES = {0: "none", 1: "linear", 2: "dynamic", 3: "llama3", 4: "yarn"}


class tl_device_properties(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("name", ctypes.c_char * 256),
        ("sm_major", ctypes.c_int32),
        ("sm_minor", ctypes.c_int32),
        ("sm_count", ctypes.c_int32),
        ("total_memory", ctypes.c_uint64),
        ("free_memory", ctypes.c_uint64),
        ("marlin_supported", ctypes.c_int32),
    ]


class tl_score_options(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("backend", ctypes.c_int32),
        ("n_threads", ctypes.c_int32),
        ("window", ctypes.c_int32),
        ("progress", tl_progress_fn),
        ("progress_user_data", ctypes.c_void_p),
        ("token_nll", ctypes.POINTER(ctypes.c_float)),
        ("token_nll_len", ctypes.c_size_t),
        ("device", ctypes.c_int32),
        ("stream", ctypes.c_void_p),
        ("use_graphs", ctypes.c_int32),
        ("max_memory_bytes", ctypes.c_uint64),
        ("top_k", ctypes.c_int32),
        ("top_ids", ctypes.POINTER(ctypes.c_int32)),
        ("top_logprobs", ctypes.POINTER(ctypes.c_float)),
        ("top_len", ctypes.c_size_t),
        ("empty_context_bos", ctypes.c_int32),
        ("activations", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
    ]


class tl_score_result(ctypes.Structure):
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
        ("setup_seconds", ctypes.c_double),
        ("graph_capture_seconds", ctypes.c_double),
    ]


class tl_sequence(ctypes.Structure):
    _fields_ = [
        ("tokens", ctypes.POINTER(ctypes.c_int32)),
        ("n_tokens", ctypes.c_size_t),
        ("n_context", ctypes.c_size_t),
    ]


class tl_sequence_score(ctypes.Structure):
    _fields_ = [
        ("nll_sum", ctypes.c_double),
        ("tokens_scored", ctypes.c_uint64),
        ("greedy", ctypes.c_int32),
    ]


class tl_compare_options(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("backend", ctypes.c_int32),
        ("n_threads", ctypes.c_int32),
        ("window", ctypes.c_int32),
        ("progress", tl_progress_fn),
        ("progress_user_data", ctypes.c_void_p),
        ("device", ctypes.c_int32),
        ("stream", ctypes.c_void_p),
        ("use_graphs", ctypes.c_int32),
        ("max_memory_bytes", ctypes.c_uint64),
        ("token_kl", ctypes.POINTER(ctypes.c_float)),
        ("token_nll_reference", ctypes.POINTER(ctypes.c_float)),
        ("token_nll_test", ctypes.POINTER(ctypes.c_float)),
        ("token_top1_match", ctypes.POINTER(ctypes.c_uint8)),
        ("token_len", ctypes.c_size_t),
        ("activations_reference", ctypes.c_int32),
        ("activations_test", ctypes.c_int32),
    ]


class tl_compare_result(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("tokens_scored", ctypes.c_uint64),
        ("kl_mean", ctypes.c_double),
        ("kl_stderr", ctypes.c_double),
        ("kl_median", ctypes.c_double),
        ("kl_p90", ctypes.c_double),
        ("kl_p99", ctypes.c_double),
        ("kl_p999", ctypes.c_double),
        ("kl_max", ctypes.c_double),
        ("kl_min", ctypes.c_double),
        ("top1_agreement", ctypes.c_double),
        ("nll_sum_reference", ctypes.c_double),
        ("nll_sum_test", ctypes.c_double),
        ("perplexity_reference", ctypes.c_double),
        ("perplexity_test", ctypes.c_double),
        ("delta_perplexity", ctypes.c_double),
        ("perplexity_ratio", ctypes.c_double),
        ("nll_correlation", ctypes.c_double),
        ("backend", ctypes.c_int32),
        ("n_windows", ctypes.c_int32),
        ("seconds", ctypes.c_double),
        ("setup_seconds", ctypes.c_double),
    ]


# The opaque tl_model * is a plain pointer here.
_model_p = ctypes.c_void_p
_status = ctypes.c_int32

# name: (restype, argtypes), in the header's order. Only what the package calls.
FUNCTIONS = {
    "tl_status_string": (ctypes.c_char_p, [_status]),
    "tl_last_error_message": (ctypes.c_char_p, []),
    "tl_version": (ctypes.c_uint32, []),
    "tl_version_string": (ctypes.c_char_p, []),
    "tl_build_info": (ctypes.c_char_p, []),
    "tl_load_options_init": (_status, [ctypes.POINTER(tl_load_options), ctypes.c_uint32]),
    "tl_model_load": (_status, [ctypes.c_char_p, ctypes.POINTER(tl_load_options), ctypes.POINTER(_model_p)]),
    "tl_model_free": (None, [_model_p]),
    "tl_model_info": (_status, [_model_p, ctypes.POINTER(tl_model_properties)]),
    "tl_device_count": (_status, [ctypes.POINTER(ctypes.c_int32)]),
    "tl_device_info": (_status, [ctypes.c_int32, ctypes.POINTER(tl_device_properties)]),
    "tl_score_options_init": (_status, [ctypes.POINTER(tl_score_options), ctypes.c_uint32]),
    "tl_score_result_init": (_status, [ctypes.POINTER(tl_score_result), ctypes.c_uint32]),
    "tl_score": (_status, [_model_p, ctypes.POINTER(ctypes.c_int32), ctypes.c_size_t,
                           ctypes.POINTER(tl_score_options), ctypes.POINTER(tl_score_result)]),
    "tl_score_batch": (_status, [_model_p, ctypes.POINTER(tl_sequence), ctypes.c_size_t,
                                 ctypes.POINTER(tl_score_options), ctypes.POINTER(tl_sequence_score),
                                 ctypes.POINTER(tl_score_result)]),
    "tl_compare_options_init": (_status, [ctypes.POINTER(tl_compare_options), ctypes.c_uint32]),
    "tl_compare_result_init": (_status, [ctypes.POINTER(tl_compare_result), ctypes.c_uint32]),
    "tl_score_compare": (_status, [_model_p, _model_p, ctypes.POINTER(ctypes.c_int32), ctypes.c_size_t,
                                   ctypes.POINTER(tl_compare_options), ctypes.POINTER(tl_compare_result)]),
    "tl_model_tokenizer": (_status, [_model_p, ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_int32)]),
    "tl_tokenize": (_status, [_model_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int32),
                              ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]),
    "tl_detokenize": (_status, [_model_p, ctypes.POINTER(ctypes.c_int32), ctypes.c_size_t, ctypes.c_char_p,
                                ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]),
}


class LibraryError(OSError):
    """libtinyloop could not be found or loaded, or its version does not match this package."""


class LibraryVersionError(LibraryError):
    """A libtinyloop was loaded, but its version does not match the ABI this package follows."""


def version_tuple(packed):
    """tl_version()'s (major << 16) | (minor << 8) | patch as a tuple."""
    return (packed >> 16, (packed >> 8) & 0xFF, packed & 0xFF)


def version_compatible(library, expected=ABI_VERSION):
    """The rule of docs/api.md ("versions"): the same major; before 1.0 the same minor too (a minor release may
    change the ABI), from 1.0 on a minor at least as new as the one these declarations follow."""
    if library[0] != expected[0]:
        return False
    return library[1] == expected[1] if expected[0] == 0 else library[1] >= expected[1]


class Library:
    """A loaded libtinyloop with the functions of FUNCTIONS declared on it as attributes."""

    def __init__(self, path):
        try:
            self._cdll = ctypes.CDLL(path)
        except OSError as error:
            raise LibraryError(f"cannot load libtinyloop from {path!r}: {error}") from error
        self.path = path
        for name, (restype, argtypes) in FUNCTIONS.items():
            try:
                function = getattr(self._cdll, name)
            except AttributeError as error:
                raise LibraryError(f"{path!r} has no function {name}: not a libtinyloop, or too old") from error
            function.restype = restype
            function.argtypes = argtypes
            setattr(self, name, function)
        self.version = version_tuple(self.tl_version())
        if not version_compatible(self.version):
            raise LibraryVersionError(
                f"{path!r} is libtinyloop {'.'.join(map(str, self.version))}, but this package follows the ABI of "
                f"{'.'.join(map(str, ABI_VERSION))}: install a matching library or package (TINYLOOP_LIBRARY "
                "names one explicitly)")


def _bundled_candidates():
    """A copy of the library inside the package folder (a wheel that bundles it), newest name first."""
    here = os.path.dirname(os.path.abspath(__file__))
    names = [f"libtinyloop.so.{ABI_VERSION[0]}", "libtinyloop.so"]
    return [os.path.join(here, name) for name in names if os.path.exists(os.path.join(here, name))]


def _system_candidates():
    """Names the dynamic loader resolves (LD_LIBRARY_PATH, the ldconfig cache, the default folders)."""
    candidates = []
    found = ctypes.util.find_library("tinyloop")
    if found:
        candidates.append(found)
    for name in (f"libtinyloop.so.{ABI_VERSION[0]}", "libtinyloop.so"):
        if name not in candidates:
            candidates.append(name)
    return candidates


def find_and_load():
    """Loads the library: $TINYLOOP_LIBRARY if set (a path; no fallback when it fails), else a copy bundled in
    the package folder, else the system's (ctypes.util.find_library, then the loader's search for
    libtinyloop.so.MAJOR and libtinyloop.so)."""
    explicit = os.environ.get("TINYLOOP_LIBRARY")
    if explicit:
        if not os.path.exists(explicit):
            raise LibraryError(f"TINYLOOP_LIBRARY={explicit!r}: no such file")
        return Library(explicit)
    tried = []
    for candidate in _bundled_candidates() + _system_candidates():
        try:
            return Library(candidate)
        except LibraryVersionError:
            raise  # a library that loads but has the wrong version is reported, not skipped silently
        except LibraryError as error:
            tried.append(str(error))
    raise LibraryError("libtinyloop not found: set TINYLOOP_LIBRARY to its path (e.g. build/lib/libtinyloop.so), "
                       "or install it where the dynamic loader finds it. Tried:\n  " + "\n  ".join(tried))


_library = None
_library_lock = threading.Lock()


def lib():
    """The process's library, loaded on first use (so `import tinyloop` works without one)."""
    global _library
    if _library is None:
        with _library_lock:
            if _library is None:
                _library = find_and_load()
    return _library


def reset_for_tests():
    """Forgets the loaded library so that the next lib() searches again (the tests of the lookup rules)."""
    global _library
    with _library_lock:
        _library = None
