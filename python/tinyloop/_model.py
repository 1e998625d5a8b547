"""tinyloop.Model: a loaded .tinyloop file, scored with tl_score and tl_score_batch."""

import ctypes
import dataclasses
import math
import os
import typing

import numpy as np

from . import _capi, text
from ._errors import Error, check

_BACKEND_NAMES = {_capi.TL_BACKEND_AUTO: "auto", _capi.TL_BACKEND_CPU: "cpu", _capi.TL_BACKEND_CUDA: "cuda"}
_GEMM_FIELDS = ("marlin_fused", "marlin_correction", "dequant_cublas", "fp16_body", "native", "dense_cublas",
                "fallbacks")


@dataclasses.dataclass(frozen=True)
class ScoreResult:
    """What Model.score reports (tl_score_result). NLLs are natural-log negative log-likelihoods."""

    nll_sum: float
    tokens_scored: int
    perplexity: float
    # Each predicted token's NLL (float32, token_nll[i] for token i + 1), when per_token=True was asked.
    token_nll: typing.Optional[np.ndarray]
    backend: str
    n_windows: int
    seconds: float
    setup_seconds: float
    graph_capture_seconds: float
    # CUDA backend: GEMMs by dispatcher path during the call (all 0 on the CPU).
    gemm_paths: dict

    @property
    def mean_nll(self):
        return self.nll_sum / self.tokens_scored if self.tokens_scored else math.nan


@dataclasses.dataclass(frozen=True)
class SequenceScore:
    """One request of Model.score_batch (tl_sequence_score), over its tokens after the context."""

    nll_sum: float
    tokens_scored: int
    # True when greedy decoding reproduces every scored token (a tie counts as greedy).
    greedy: bool
    # Every predicted token's NLL, context tokens included (n_tokens - 1 values), when per_token=True was asked.
    token_nll: typing.Optional[np.ndarray] = None

    @property
    def logprob(self):
        """The log-probability of the scored tokens: -nll_sum."""
        return -self.nll_sum


@dataclasses.dataclass(frozen=True)
class CompareResult:
    """What Model.compare reports (tl_compare_result): the test model against the reference over the same positions.
    KL is KL(P_reference || P_test) in nats per position; percentiles are exact order statistics."""

    tokens_scored: int
    kl_mean: float
    kl_stderr: float
    kl_median: float
    kl_p90: float
    kl_p99: float
    kl_p999: float
    kl_max: float
    kl_min: float
    top1_agreement: float
    nll_sum_reference: float
    nll_sum_test: float
    perplexity_reference: float
    perplexity_test: float
    delta_perplexity: float
    perplexity_ratio: float
    nll_correlation: float
    backend: str
    n_windows: int
    seconds: float
    setup_seconds: float
    # Per position (float32 / uint8 arrays of tokens_scored), when per_token=True was asked.
    token_kl: typing.Optional[np.ndarray] = None
    token_nll_reference: typing.Optional[np.ndarray] = None
    token_nll_test: typing.Optional[np.ndarray] = None
    token_top1_match: typing.Optional[np.ndarray] = None


class BatchResult(list):
    """Model.score_batch's answer: a list of SequenceScore, in request order, with the totals over all of them as
    attributes (nll_sum, tokens_scored, perplexity, backend, seconds, setup_seconds, graph_capture_seconds,
    gemm_paths)."""

    def __init__(self, scores, totals):
        super().__init__(scores)
        for name, value in totals.items():
            setattr(self, name, value)


def parse_device(device):
    """device=None | "auto" | "cpu" | "cuda" | "cuda:N" | N -> (tl backend, device index)."""
    if device is None or device == "auto":
        return _capi.TL_BACKEND_AUTO, 0
    if isinstance(device, (bool, np.bool_)):
        raise TypeError("device must be None, 'cpu', 'cuda', 'cuda:N' or a device index, not a bool")
    if isinstance(device, (int, np.integer)):
        index = int(device)
    elif device == "cpu":
        return _capi.TL_BACKEND_CPU, 0
    elif device == "cuda":
        index = 0
    elif isinstance(device, str) and device.startswith("cuda:") and device[5:].isdigit():
        index = int(device[5:])
    else:
        raise ValueError(f"device must be None, 'cpu', 'cuda', 'cuda:N' or a device index, not {device!r}")
    if not 0 <= index < 2**31:
        raise ValueError(f"device index {index} is out of range")
    return _capi.TL_BACKEND_CUDA, index


def _gemm_paths(result):
    return {name: int(getattr(result, "gemm_" + name)) for name in _GEMM_FIELDS}


def _filled(result, field):
    """Whether the library wrote `field` of an output struct: it sets struct_size to the bytes it wrote."""
    descriptor = getattr(type(result), field)
    return result.struct_size >= descriptor.offset + descriptor.size


class _Progress:
    """A Python progress callable as a tl_progress_fn. A true return value stops the call (TL_ERR_CANCELLED); an
    exception raised by the callable stops it too and is re-raised once the call has returned."""

    def __init__(self, progress):
        self.error = None
        self.function = _capi.tl_progress_fn()  # NULL
        if progress is not None:
            if not callable(progress):
                raise TypeError("progress must be a callable (done, total) or None")

            def call(_user_data, done, total):
                try:
                    return 1 if progress(int(done), int(total)) else 0
                except BaseException as error:  # handed back to the caller once the C call has returned
                    self.error = error
                    return 1

            self.function = _capi.tl_progress_fn(call)

    def reraise(self):
        if self.error is not None:
            error, self.error = self.error, None
            raise error


def _activations(value, keyword):
    """An activation precision by name ("fp16", "int8", "fp8") -> its TL_ACTIVATIONS_* value."""
    if not isinstance(value, str) or value not in _capi.ACTIVATIONS:
        raise ValueError(f"{keyword} must be one of {', '.join(repr(k) for k in _capi.ACTIVATIONS)}, got {value!r}")
    return _capi.ACTIVATIONS[value]


class Model:
    """A .tinyloop model loaded through libtinyloop (tl_model_load), freed by close() or `with`.

    device: None or "auto" (CUDA where the library and machine have a GPU, else the CPU), "cpu", "cuda" (device 0),
    "cuda:N" or N (CUDA device N). threads: CPU worker threads (0 = all cores). max_memory_bytes: a budget for the
    working memory of each call (0 = none; docs/api.md "Memory"). use_graphs: CUDA graphs on the CUDA backend.
    use_mmap and validate_values: tl_load_options.

    A model may be scored from many threads at once (the library's model is read-only); closing it while another
    thread scores is the caller's bug, as in C."""

    def __init__(self, path, device=None, *, threads=0, max_memory_bytes=0, use_graphs=True, use_mmap=True,
                 validate_values=True):
        self._handle = None
        self._backend, self._device = parse_device(device)
        if int(threads) < 0 or int(max_memory_bytes) < 0:
            raise ValueError("threads and max_memory_bytes must not be negative")
        self._threads = int(threads)
        self._max_memory_bytes = int(max_memory_bytes)
        self._use_graphs = bool(use_graphs)
        self._lib = _capi.lib()
        self.path = os.fspath(path)

        options = _capi.tl_load_options()
        check(self._lib, "tl_load_options_init",
              self._lib.tl_load_options_init(ctypes.byref(options), ctypes.sizeof(options)))
        options.use_mmap = int(bool(use_mmap))
        options.validate_values = int(bool(validate_values))
        handle = ctypes.c_void_p()
        check(self._lib, "tl_model_load",
              self._lib.tl_model_load(os.fsencode(self.path), ctypes.byref(options), ctypes.byref(handle)))
        self._handle = handle

        properties = _capi.tl_model_properties(struct_size=ctypes.sizeof(_capi.tl_model_properties))
        try:
            check(self._lib, "tl_model_info", self._lib.tl_model_info(self._handle, ctypes.byref(properties)))
        except Error:
            self.close()
            raise
        self._info = {}
        for name, c_type in properties._fields_[1:]:
            value = getattr(properties, name)
            # A float field as its shortest decimal (norm_eps 1e-05, not the double 9.999999747378752e-06).
            self._info[name] = float(str(np.float32(value))) if c_type is ctypes.c_float else value
        if not _filled(properties, "bos_token_id"):  # an older library: it names no BOS
            self._info["bos_token_id"] = -1
        if _filled(properties, "rope_original_max_positions"):
            self._info["rope_scaling"] = _capi.ROPE_SCALING_NAMES.get(properties.rope_scaling,
                                                                      str(properties.rope_scaling))
        else:  # an older library: the fields of the third version are not there
            for name in ("n_kv_heads", "rope_scaling", "rope_scaling_factor", "rope_original_max_positions"):
                del self._info[name]
        self._info["path"] = self.path
        kind, n_ids = ctypes.c_int32(), ctypes.c_int32()
        try:
            check(self._lib, "tl_model_tokenizer",
                  self._lib.tl_model_tokenizer(self._handle, ctypes.byref(kind), ctypes.byref(n_ids)))
        except Error:
            self.close()
            raise
        self._tokenizer = _capi.TOKENIZER_NAMES.get(kind.value, str(kind.value))
        self._tokenizer_ids = n_ids.value

    # ---- lifetime ----

    def close(self):
        """Frees the model (tl_model_free). Idempotent; any later call raises ValueError."""
        handle, self._handle = self._handle, None
        if handle is not None:
            self._lib.tl_model_free(handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: nothing left to report to
            pass

    @property
    def closed(self):
        return self._handle is None

    def _live_handle(self):
        if self._handle is None:
            raise ValueError("the model is closed")
        return self._handle

    # ---- properties ----

    @property
    def info(self):
        """The model's configuration and counts (tl_model_properties' fields) and its path, as a new dict."""
        return dict(self._info)

    @property
    def vocab(self):
        return self._info["vocab"]

    @property
    def max_seq(self):
        return self._info["max_seq"]

    def __repr__(self):
        state = "closed" if self.closed else f"vocab={self.vocab} max_seq={self.max_seq}"
        device = _BACKEND_NAMES[self._backend] + (f":{self._device}" if self._backend == _capi.TL_BACKEND_CUDA else "")
        return f"<tinyloop.Model {self.path!r} {state} device={device}>"

    # ---- text ----

    @property
    def tokenizer(self):
        """The tokenizer the model file stores: "huggingface" (a tokenizer.json byte-level BPE), "sentencepiece" (a
        tokenizer.model), or "bytes" (none: one token per byte of the UTF-8 text)."""
        return self._tokenizer

    @property
    def tokenizer_ids(self):
        """One more than the largest id the tokenizer gives or takes (256 for "bytes")."""
        return self._tokenizer_ids

    def tokenize(self, data):
        """The token ids of a text (str, as UTF-8, or bytes-like) by the model's tokenizer (tl_tokenize), as an int32
        array. No beginning- or end-of-text token is added (a tokenizer.json's special tokens written in the text
        are matched). A "huggingface" or "sentencepiece" tokenizer needs valid UTF-8 (Error INVALID_ARGUMENT naming
        the first bad byte's offset); "bytes" takes any bytes."""
        handle = self._live_handle()
        raw = text.as_bytes(data)
        # One id a byte is room enough for byte-level and BPE tokenizers; SentencePiece may need more, and then the
        # first call says how much.
        ids = np.zeros(len(raw) + 1, dtype=np.int32)
        n = ctypes.c_size_t()
        for _ in range(2):
            status = self._lib.tl_tokenize(handle, raw, len(raw), ids.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
                                           ids.size, ctypes.byref(n))
            if status == _capi.STATUS_CODES["TL_ERR_BUFFER_TOO_SMALL"] and n.value > ids.size:
                ids = np.zeros(n.value, dtype=np.int32)
                continue
            break
        check(self._lib, "tl_tokenize", status)
        return ids[: n.value].copy()

    def detokenize(self, ids):
        """The bytes token ids stand for (tl_detokenize), special tokens' text included; .decode("utf-8") them where
        they are text (a token may hold part of a character). An id that is no token raises Error
        INVALID_ARGUMENT naming its index."""
        handle = self._live_handle()
        array = np.ascontiguousarray(np.asarray(ids, dtype=np.int64).reshape(-1))
        if array.size and (array.min() < -2**31 or array.max() >= 2**31):
            raise ValueError("token ids must be int32")
        array = array.astype(np.int32)
        out = ctypes.create_string_buffer(array.size * 8 + 16)
        n = ctypes.c_size_t()
        for _ in range(2):
            status = self._lib.tl_detokenize(handle, array.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), array.size,
                                             out, len(out), ctypes.byref(n))
            if status == _capi.STATUS_CODES["TL_ERR_BUFFER_TOO_SMALL"] and n.value > len(out):
                out = ctypes.create_string_buffer(n.value)
                continue
            break
        check(self._lib, "tl_detokenize", status)
        return out.raw[: n.value]

    # ---- tokens in ----

    def tokens(self, data, what="tokens"):
        """`data` as a contiguous int32 array of this model's token ids: str / bytes-like through the model's
        tokenizer (tokenize: one token per byte for a byte-level model), anything else as a 1-D array of integers,
        each checked to be in [0, vocab)."""
        if isinstance(data, (str, bytes, bytearray, memoryview)):
            array = self.tokenize(data)
        else:
            array = np.asarray(data)
            if array.size == 0:
                array = array.astype(np.int32)
            if array.dtype.kind not in "iu":
                raise TypeError(f"{what} must be integers, got an array of {array.dtype}")
            if array.ndim != 1:
                raise ValueError(f"{what} must be one-dimensional, got shape {array.shape}")
        if array.size:
            bad = np.flatnonzero((array < 0) | (array >= self.vocab))
            if bad.size:
                i = int(bad[0])
                raise ValueError(f"{what}[{i}] = {int(array[i])} is outside the vocabulary [0, {self.vocab})")
        return np.ascontiguousarray(array, dtype=np.int32)

    def _run_options(self, struct, init, window, progress):
        """A tl_score_options or tl_compare_options from its _init function, with this model's run settings."""
        options = struct()
        check(self._lib, init, getattr(self._lib, init)(ctypes.byref(options), ctypes.sizeof(options)))
        options.backend = self._backend
        options.device = self._device
        options.n_threads = self._threads
        options.window = int(window)
        options.use_graphs = int(self._use_graphs)
        options.max_memory_bytes = self._max_memory_bytes
        options.progress = progress.function
        return options

    def _options(self, window, nll_buffer, progress, activations):
        options = self._run_options(_capi.tl_score_options, "tl_score_options_init", window, progress)
        options.activations = _activations(activations, "activations")
        if nll_buffer is not None:
            options.token_nll = nll_buffer.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            options.token_nll_len = nll_buffer.size
        return options

    def _result_struct(self):
        result = _capi.tl_score_result()
        check(self._lib, "tl_score_result_init",
              self._lib.tl_score_result_init(ctypes.byref(result), ctypes.sizeof(result)))
        return result

    @staticmethod
    def _totals(result):
        return dict(
            nll_sum=result.nll_sum, tokens_scored=int(result.tokens_scored), perplexity=result.perplexity,
            backend=_BACKEND_NAMES.get(result.backend, str(result.backend)), seconds=result.seconds,
            setup_seconds=result.setup_seconds if _filled(result, "setup_seconds") else 0.0,
            graph_capture_seconds=(result.graph_capture_seconds if _filled(result, "graph_capture_seconds")
                                   else 0.0),
            gemm_paths=_gemm_paths(result))

    # ---- scoring ----

    def score(self, data, *, window=0, per_token=False, progress=None, activations="fp16"):
        """Scores one sequence (tl_score): the NLL of each token given those before it.

        data: token ids (any 1-D integer array or list) or text (str / bytes: through the model's tokenizer, see
        tokenize). At least two tokens. window: the window length, 2..max_seq (0 = max_seq); a longer sequence is
        scored in windows that overlap by one token. per_token: also return each predicted token's NLL as a float32 array. progress: a
        callable (done, total) called between windows; a true return value stops the call (Error CANCELLED).
        activations: "fp16" (default, the activations as computed), "int8" or "fp8": each token's input to the
        blocks' linear layers quantized with its own scale (the CUDA backend runs "int8" on models whose block
        linears are INT8 with one scale per row, or INT4 with one scale per row or groups of 32, 64 or 128 on
        compute capability 9.0, and declines the rest; docs/quality.md "Activation precision")."""
        handle = self._live_handle()
        tokens = self.tokens(data)
        nll = np.zeros(max(tokens.size - 1, 1), dtype=np.float32) if per_token else None
        callback = _Progress(progress)
        options = self._options(window, nll, callback, activations)
        result = self._result_struct()
        status = self._lib.tl_score(handle, tokens.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), tokens.size,
                                    ctypes.byref(options), ctypes.byref(result))
        callback.reraise()
        check(self._lib, "tl_score", status)
        totals = self._totals(result)
        return ScoreResult(token_nll=None if nll is None else nll[: totals["tokens_scored"]],
                           n_windows=int(result.n_windows), **totals)

    def _request(self, request, index):
        """One score_batch request -> (int32 tokens, n_context)."""
        what = f"requests[{index}]"
        if isinstance(request, tuple) and len(request) == 2 and not isinstance(request[0], (int, np.integer)):
            first, second = request
            if isinstance(second, (int, np.integer)) and not isinstance(second, bool):
                tokens = self.tokens(first, what + " tokens")
                if second < 0:
                    raise ValueError(f"{what}: n_context {second} is negative")
                return tokens, int(second)
            context = self.tokens(first, what + " context")
            continuation = self.tokens(second, what + " continuation")
            if context.size == 0 and self.bos_token_id >= 0:  # the model file's beginning-of-text token stands in
                context = np.array([self.bos_token_id], dtype=np.int32)
            if context.size == 0:
                raise ValueError(
                    f"{what}: the context is empty and the model file names no BOS token, so the continuation's first "
                    "token has nothing to be predicted from; start the context with a BOS token (or pass (tokens, "
                    "n_context) to skip that token)")
            return np.concatenate([context, continuation]), context.size
        return self.tokens(request, what), 0

    def top_logprobs(self, data, k, *, window=0, progress=None, activations="fp16"):
        """The k most likely tokens at each predicted position and their log-probabilities (tl_score's top_k):
        (ids, logprobs), int32 and float32 arrays of shape (n_tokens - 1, k), row i for the prediction of token i + 1,
        most likely first. data, window and activations as for score; 1 <= k <= 20. The library reduces the logits a chunk of
        positions at a time: nothing of size positions x vocab is made."""
        handle = self._live_handle()
        k = int(k)
        if not 1 <= k <= 20:
            raise ValueError(f"k must be in [1, 20], got {k}")
        tokens = self.tokens(data)
        positions = max(tokens.size - 1, 1)
        ids = np.zeros((positions, k), dtype=np.int32)
        logprobs = np.zeros((positions, k), dtype=np.float32)
        callback = _Progress(progress)
        options = self._options(window, None, callback, activations)
        options.top_k = k
        options.top_ids = ids.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        options.top_logprobs = logprobs.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        options.top_len = ids.size
        result = self._result_struct()
        status = self._lib.tl_score(handle, tokens.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), tokens.size,
                                    ctypes.byref(options), ctypes.byref(result))
        callback.reraise()
        check(self._lib, "tl_score", status)
        return ids, logprobs

    def compare(self, other, data, *, window=0, per_token=False, progress=None, activations="fp16",
                reference_activations="fp16"):
        """Compares `other` (the test model) with this one (the reference) on the same tokens (tl_score_compare): KL
        divergence KL(P_self || P_other) per position, top-1 agreement and both perplexities, as a CompareResult.
        Both models run on this model's device settings; they must share a vocabulary. data and window as for score
        (text goes through this model's tokenizer); per_token also returns the per-position arrays. activations: the
        test side's precision, reference_activations this model's ("fp16", "int8", "fp8", as for score):
        model.compare(model, text, activations="int8") measures what INT8 activations cost."""
        handle = self._live_handle()
        other_handle = other._live_handle()
        tokens = self.tokens(data)
        n = max(tokens.size - 1, 1)
        callback = _Progress(progress)
        options = self._run_options(_capi.tl_compare_options, "tl_compare_options_init", window, callback)
        options.activations_test = _activations(activations, "activations")
        options.activations_reference = _activations(reference_activations, "reference_activations")
        arrays = {}
        if per_token:
            arrays = {"token_kl": np.zeros(n, np.float32), "token_nll_reference": np.zeros(n, np.float32),
                      "token_nll_test": np.zeros(n, np.float32), "token_top1_match": np.zeros(n, np.uint8)}
            for name, array in arrays.items():
                c_type = ctypes.c_uint8 if array.dtype == np.uint8 else ctypes.c_float
                setattr(options, name, array.ctypes.data_as(ctypes.POINTER(c_type)))
            options.token_len = n
        result = _capi.tl_compare_result()
        check(self._lib, "tl_compare_result_init",
              self._lib.tl_compare_result_init(ctypes.byref(result), ctypes.sizeof(result)))
        status = self._lib.tl_score_compare(handle, other_handle, tokens.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
                                            tokens.size, ctypes.byref(options), ctypes.byref(result))
        callback.reraise()
        check(self._lib, "tl_score_compare", status)
        fields = {name: getattr(result, name) for name, _ in result._fields_[1:]}
        fields["tokens_scored"] = int(result.tokens_scored)
        fields["backend"] = _BACKEND_NAMES.get(result.backend, str(result.backend))
        fields["n_windows"] = int(result.n_windows)
        return CompareResult(**fields, **arrays)

    @property
    def bos_token_id(self):
        """The beginning-of-text token the model file names, or -1 (none)."""
        return self._info["bos_token_id"]

    def score_batch(self, requests, *, per_token=False, progress=None, activations="fp16"):
        """Scores independent sequences in one call (tl_score_batch); returns a BatchResult, a list of SequenceScore.

        Each request is one of: token ids (the whole sequence is scored, its first token only as context);
        (tokens, n_context) (the first n_context tokens are context only); (context, continuation), each token ids
        or text (the continuation is scored given the context; text is tokenized, context and continuation each on
        its own; an empty context becomes the model file's BOS token, bos_token_id, and without one is refused, since the
        first token has nothing to be predicted from). Each sequence must fit max_seq. per_token: each SequenceScore also gets
        the NLLs of all its predicted tokens, context tokens included. progress: as for score, in scored tokens.
        activations: as for score."""
        handle = self._live_handle()
        parsed = [self._request(request, i) for i, request in enumerate(requests)]
        sequences = (_capi.tl_sequence * max(len(parsed), 1))()
        for sequence, (tokens, n_context) in zip(sequences, parsed):
            sequence.tokens = tokens.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
            sequence.n_tokens = tokens.size
            sequence.n_context = n_context
        scores = (_capi.tl_sequence_score * max(len(parsed), 1))()
        predicted = [max(tokens.size - 1, 0) for tokens, _ in parsed]
        nll = np.zeros(max(sum(predicted), 1), dtype=np.float32) if per_token else None
        callback = _Progress(progress)
        options = self._options(0, nll, callback, activations)
        result = self._result_struct()
        status = self._lib.tl_score_batch(handle, sequences, len(parsed), ctypes.byref(options), scores,
                                          ctypes.byref(result))
        callback.reraise()
        check(self._lib, "tl_score_batch", status)
        out = []
        offset = 0
        for score, count in zip(scores[: len(parsed)], predicted):
            token_nll = None if nll is None else nll[offset: offset + count]
            offset += count
            out.append(SequenceScore(nll_sum=score.nll_sum, tokens_scored=int(score.tokens_scored),
                                     greedy=bool(score.greedy), token_nll=token_nll))
        return BatchResult(out, self._totals(result))


def device_count():
    """The number of usable CUDA devices (tl_device_count): 0 without CUDA in the library, a driver or a GPU."""
    lib = _capi.lib()
    count = ctypes.c_int32()
    check(lib, "tl_device_count", lib.tl_device_count(ctypes.byref(count)))
    return count.value


def device_info(index):
    """Properties of CUDA device `index` (tl_device_info) as a dict."""
    lib = _capi.lib()
    properties = _capi.tl_device_properties(struct_size=ctypes.sizeof(_capi.tl_device_properties))
    check(lib, "tl_device_info", lib.tl_device_info(int(index), ctypes.byref(properties)))
    info = {name: getattr(properties, name) for name, _ in properties._fields_ if name != "struct_size"}
    info["name"] = properties.name.decode("utf-8", "replace")
    info["marlin_supported"] = bool(properties.marlin_supported)
    return info
