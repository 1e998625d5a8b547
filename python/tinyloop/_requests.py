"""score-batch requests in Python: the JSON-lines forms `tinyloop score-batch` reads, their result lines, batches sized
by tokens, and exact sums of NLLs. What tinyloop.distributed runs on each side of a Dask cluster; nothing here imports
dask, so it is also the single-process path (`score_requests` on a Model) the distributed one is checked against.

The parsing mirrors cpp/cli/requests.cpp (the same forms, keys, echoing and messages) and the scoring mirrors
cmd_score_batch in cpp/cli/main.cpp (context truncation from the front, a refused request reported in its own
result while the others are scored)."""

import dataclasses
import json
import math
import re
import typing

import numpy as np

from ._errors import Error

# The longest request line `tinyloop score-batch` reads (cpp/cli/requests.hpp, kMaxRequestLineBytes).
MAX_LINE_BYTES = 4 << 20

# The keys of the request forms, and those of an output line (which a request may not carry for echoing).
REQUEST_KEYS = ("tokens", "n_context", "context", "continuation", "text", "context_text", "bos")
OUTPUT_KEYS = ("index", "line", "error", "nll_sum", "tokens_scored", "mean_nll", "perplexity", "greedy",
               "context_truncated")

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


class RequestError(ValueError):
    """A request that is not valid; the message says why (the same words as `tinyloop score-batch`)."""


@dataclasses.dataclass
class Request:
    """One request as parsed on the client: token ids, or texts for the model's tokenizer (tokenized where the model
    is, on the worker), the keys to echo, and where it came from."""

    tokens: typing.Optional[np.ndarray] = None  # int32; None for a text request
    n_context: int = 0
    text: typing.Optional[bytes] = None
    context_text: typing.Optional[bytes] = None
    echo: dict = dataclasses.field(default_factory=dict)
    line: typing.Optional[int] = None  # the input line, for requests read from JSON lines
    error: typing.Optional[str] = None  # set: not valid, never sent to a worker

    @property
    def size(self):
        """What the request weighs in a batch: its tokens, or its texts' bytes (a byte-level tokenizer's count, an
        upper bound of a BPE's)."""
        if self.tokens is not None:
            return int(self.tokens.size)
        return len(self.text or b"") + len(self.context_text or b"")

    @property
    def scored_estimate(self):
        """The tokens it will score (what progress counts): all after the context, or its text's bytes."""
        if self.tokens is not None:
            return max(int(self.tokens.size) - max(self.n_context, 1), 0)
        return len(self.text or b"")

    def payload(self):
        """What a worker needs to score it: no echo, no line."""
        return (self.tokens, self.n_context, self.context_text, self.text)


# ---- parsing (cpp/cli/requests.cpp) ----

def _describe(value):
    """A value as a message quotes it: numbers and booleans as JSON writes them, anything else by its type."""
    if value is None or isinstance(value, (bool, int, float)):
        return json.dumps(value)
    kind = {str: "string", list: "array", dict: "object"}.get(type(value), type(value).__name__)
    return "a " + kind


def _token_ids(request, key):
    value = request[key]
    if isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in "iu":
        array = value.astype(np.int64)
        bad = np.flatnonzero((array < _INT32_MIN) | (array > _INT32_MAX))
        if bad.size:
            i = int(bad[0])
            raise RequestError(f'"{key}"[{i}] = {int(array[i])} is not a token id (an int32)')
        return array.astype(np.int32)
    if not isinstance(value, (list, tuple)):
        raise RequestError(f'"{key}" must be an array of token ids, not {_describe(value)}')
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not _INT32_MIN <= v <= _INT32_MAX:
            raise RequestError(f'"{key}"[{i}] = {_describe(v)} is not a token id (an int32)')
    return np.array(value, dtype=np.int32)


def _text(request, key):
    value = request[key]
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if not isinstance(value, str):
        raise RequestError(f'"{key}" must be a string, not {_describe(value)}')
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as e:  # a lone surrogate escape ("\ud800")
        raise RequestError(f'"{key}" is not valid Unicode: {e.reason} at character {e.start}') from None


def _empty_context(key):
    # score-batch's message (cpp/cli/requests.cpp). The client does not open the model file, so a file's own
    # beginning-of-text token does not stand in here: a request names one with "bos".
    return RequestError(f'"{key}" is empty and the model file names no beginning-of-text token to stand for it: the '
                        'first continuation token needs a token before it to be scored from; give one with "bos": ID '
                        "in the request or score-batch --bos ID, or give a context token")


def _request_bos(request):
    """The request's "bos" token id, or None."""
    if "bos" not in request:
        return None
    v = request["bos"]
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v <= _INT32_MAX:
        raise RequestError(f'"bos" must be a token id (a non-negative int32), not {_describe(v)}')
    return int(v)


def parse_request(request, line=None):
    """A request in one of score-batch's forms as a Request: a dict ({"tokens": [ids], "n_context": k},
    {"context": [ids], "continuation": [ids]} or {"text": "...", "context_text": "..."}, any other key echoed), or
    one of Model.score_batch's forms (token ids; (tokens, n_context); (context, continuation), each token ids or
    text). An invalid request comes back with its `error` set; nothing is raised."""
    try:
        if isinstance(request, dict):
            return _parse_dict(request, line)
        return _parse_tuple(request, line)
    except RequestError as e:
        return Request(line=line, error=str(e))


def parse_line(line_text, line=None):
    """One JSON line's request (parse_request); a line that is not JSON gets its error."""
    try:
        value = json.loads(line_text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as e:
        return Request(line=line, error=f"the request is not valid JSON: {e}")
    if not isinstance(value, dict):
        return Request(line=line, error=f"expected a JSON object, got {_describe(value)[2:]}")
    return parse_request(value, line)


def _refuse_constant(name):
    raise ValueError(f"{name} is not JSON")


def _parse_dict(request, line):
    r = Request(line=line)

    def only(form, keys):
        for key, value in request.items():
            if key in keys:
                continue
            if key in REQUEST_KEYS:
                raise RequestError(f'key {json.dumps(key)} does not go with "{form}"')
            if key in OUTPUT_KEYS:
                raise RequestError(f"key {json.dumps(key)} is an output field; it cannot be echoed")
            r.echo[key] = value

    if "tokens" in request:
        only("tokens", ("tokens", "n_context"))
        r.tokens = _token_ids(request, "tokens")
        if "n_context" in request:
            k = request["n_context"]
            if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
                raise RequestError(f'"n_context" must be a non-negative integer, not {_describe(k)}')
            r.n_context = int(k)
    elif "context" in request or "continuation" in request:
        only("context", ("context", "continuation", "bos"))
        if "context" not in request or "continuation" not in request:
            raise RequestError('"context" and "continuation" go together')
        context = _token_ids(request, "context")
        if context.size == 0:
            bos = _request_bos(request)
            if bos is None:
                raise _empty_context("context")
            context = np.array([bos], dtype=np.int32)
        r.tokens = np.concatenate([context, _token_ids(request, "continuation")])
        r.n_context = int(context.size)
    elif "text" in request:
        only("text", ("text", "context_text", "bos"))
        if "context_text" in request:
            r.context_text = _text(request, "context_text")
            if not r.context_text:  # a tokenizer gives no token for an empty text either
                if _request_bos(request) is not None:
                    raise RequestError('"bos" with an empty "context_text" is not taken here: give the context as '
                                       'token ids, "context": [ID], with "continuation"')
                raise _empty_context("context_text")
        r.text = _text(request, "text")
    else:
        raise RequestError('expected "tokens", "context" and "continuation", or "text"')
    return r


def _is_text(value):
    return isinstance(value, (str, bytes, bytearray, memoryview))


def _parse_tuple(request, line):
    """Model.score_batch's forms."""
    if isinstance(request, tuple) and len(request) == 2 and not isinstance(request[0], (int, np.integer)):
        first, second = request
        if isinstance(second, (int, np.integer)) and not isinstance(second, bool):
            if second < 0:
                raise RequestError(f'"n_context" must be a non-negative integer, not {int(second)}')
            if _is_text(first):
                raise RequestError("(tokens, n_context) takes token ids, not text")
            return Request(tokens=_token_ids({"tokens": list(first) if not isinstance(first, np.ndarray) else first},
                                             "tokens"), n_context=int(second), line=line)
        if _is_text(first) and _is_text(second):
            return _parse_dict({"context_text": _as_text(first), "text": _as_text(second)}, line)
        if _is_text(first) or _is_text(second):
            raise RequestError("(context, continuation) must be both text or both token ids")
        return _parse_dict({"context": _ids_list(first), "continuation": _ids_list(second)}, line)
    if _is_text(request):
        return _parse_dict({"text": _as_text(request)}, line)
    return _parse_dict({"tokens": _ids_list(request)}, line)


def _as_text(value):
    return value if isinstance(value, str) else bytes(value)


def _ids_list(value):
    array = np.asarray(value)
    if array.size == 0:
        return np.zeros(0, dtype=np.int32)
    if array.ndim != 1 or array.dtype.kind not in "iu":
        raise RequestError(f"token ids must be a one-dimensional array of integers, got {array.dtype} "
                           f"with shape {array.shape}")
    return array


def truncate_context(tokens, n_context, max_seq):
    """(tokens, n_context, cut): the context cut from the front until the request fits max_seq, keeping the
    continuation whole and at least one context token (cpp/cli/requests.cpp, truncate_context)."""
    if tokens.size <= max_seq or n_context < 2:
        return tokens, n_context, 0
    cut = min(tokens.size - max_seq, n_context - 1)
    return tokens[cut:], n_context - cut, cut


# ---- batches ----

def batches(items, batch_tokens, size=lambda item: item.size):
    """Groups consecutive items into lists weighing about batch_tokens each (by `size`): a batch is closed once it
    reaches the budget, so an item heavier than the budget is a batch of its own. Lazy: reads items as it goes."""
    batch, weight = [], 0
    for item in items:
        batch.append(item)
        weight += size(item)
        if weight >= batch_tokens:
            yield batch
            batch, weight = [], 0
    if batch:
        yield batch


# ---- exact sums ----

# Every float32 is an integer multiple of 2**-149 (the smallest subnormal), every double of 2**-1074: sums kept as
# integers in those units are exact whatever the order or grouping, so totals combined from any split of the work
# are the same bits.
F32_UNIT_BITS = 149
F64_UNIT_BITS = 1074


def f32_sums(values):
    """(sum, sum of squares) of float32 values, exactly: integers in units of 2**-149 and 2**-298."""
    bits = np.ascontiguousarray(values, dtype=np.float32).reshape(-1).view(np.uint32)
    if bits.size == 0:
        return 0, 0
    exponent = ((bits >> 23) & 0xFF).astype(np.int64)
    if (exponent == 0xFF).any():
        raise ValueError("an NLL is not finite")
    significand = (bits & 0x7FFFFF).astype(np.int64)
    significand[exponent > 0] |= 1 << 23
    # value = ±significand * 2**(shift - 149)
    shift = np.maximum(exponent - 1, 0)
    signed = np.where(bits >> 31 != 0, -significand, significand)
    # significand**2 needs 48 bits: its 12-bit halves keep each product, and sums of up to 2**39 of them, in int64.
    hi, lo = significand >> 12, significand & 0xFFF
    total = squares = 0
    for s in np.unique(shift):
        sel = shift == s
        h, l = hi[sel], lo[sel]
        square = (int((h * h).sum()) << 24) + (int((h * l).sum()) << 13) + int((l * l).sum())
        total += int(signed[sel].sum()) << int(s)
        squares += square << (2 * int(s))
    return total, squares


def f64_fixed(value):
    """A double as an integer in units of 2**-1074, exactly."""
    numerator, denominator = float(value).as_integer_ratio()
    return numerator << (F64_UNIT_BITS - (denominator.bit_length() - 1))


@dataclasses.dataclass
class Sums:
    """Exact running totals of scored tokens: the library's NLL sums (doubles) and the per-token float32 NLLs with
    their squares, all as integers (f32_sums, f64_fixed). Adding Sums in any order gives the same totals."""

    tokens: int = 0
    nll: int = 0  # units of 2**-1074
    token_nll: int = 0  # units of 2**-149
    token_nll_squares: int = 0  # units of 2**-298

    def __iadd__(self, other):
        self.tokens += other.tokens
        self.nll += other.nll
        self.token_nll += other.token_nll
        self.token_nll_squares += other.token_nll_squares
        return self

    @property
    def nll_sum(self):
        """The sum of the NLL sums, correctly rounded (Python's int / int is)."""
        return self.nll / (1 << F64_UNIT_BITS)

    @property
    def mean_nll(self):
        return self.nll / ((1 << F64_UNIT_BITS) * self.tokens) if self.tokens else math.nan

    @property
    def perplexity(self):
        return math.exp(self.mean_nll) if self.tokens else math.nan

    @property
    def perplexity_stderr(self):
        """llama-perplexity's standard error, exp(m)·s/√n (as `tinyloop score`): s² the tokens' sample variance,
        computed exactly from the integer sums, (n·Σx² − (Σx)²) / (n(n − 1)), then rounded once. NaN below two
        tokens."""
        n = self.tokens
        if n < 2:
            return math.nan
        variance = (n * self.token_nll_squares - self.token_nll**2) / ((1 << (2 * F32_UNIT_BITS)) * n * (n - 1))
        return self.perplexity * math.sqrt(max(variance, 0.0) / n)

    def summary(self):
        return {"nll_sum": self.nll_sum, "tokens_scored": self.tokens, "mean_nll": self.mean_nll,
                "perplexity": self.perplexity, "perplexity_stderr": self.perplexity_stderr}


# ---- scoring one batch (a worker's task, or the single-process path) ----

_NAMED = re.compile(r"^(?:requests\[(\d+)\] |sequences\[(\d+)\]\.)")


def _refused(error):
    """(request index, message without the index) of a refusal naming one request, else None."""
    message = error.message if isinstance(error, Error) else str(error)
    if isinstance(error, Error) and error.status_name != "TL_ERR_INVALID_ARGUMENT":
        return None
    match = _NAMED.match(message)
    if match is None:
        return None
    return int(match.group(1) or match.group(2)), message[match.end():]


def _tokenize(model, text, key):
    if text is None:
        return np.zeros(0, dtype=np.int32)
    try:
        return model.tokenize(text)
    except Error as e:
        raise RequestError(f'"{key}": {e.message}') from None


def score_payloads(model, payloads, *, per_token=False):
    """Scores a batch of Request.payload()s on `model` in one Model.score_batch call, as `tinyloop score-batch` does a
    chunk: texts through the model's tokenizer, contexts cut to fit max_seq, and a request the library refuses gets
    the library's message as its error while the others are scored again without it.

    Returns (results, sums): one tuple per request, ("error", message) or ("ok", nll_sum, tokens_scored, greedy,
    context_truncated, f32 sums of its scored tokens' NLLs, token_nll or None), and the batch's Sums."""
    results = [None] * len(payloads)
    members, sequences = [], []
    for i, (tokens, n_context, context_text, text) in enumerate(payloads):
        if tokens is None:
            try:
                context = _tokenize(model, context_text, "context_text")
                if context_text is not None and context.size == 0:
                    raise _empty_context("context_text")
                continuation = _tokenize(model, text, "text")
            except RequestError as e:
                results[i] = ("error", str(e))
                continue
            tokens, n_context = np.concatenate([context, continuation]).astype(np.int32), int(context.size)
        tokens, n_context, cut = truncate_context(tokens, n_context, model.max_seq)
        members.append((i, cut))
        sequences.append((tokens, n_context))
    sums = Sums()
    while members:
        try:
            scores = model.score_batch(sequences, per_token=True)
        except (Error, ValueError) as e:
            refused = _refused(e)
            if refused is None or refused[0] >= len(members):
                raise
            j, message = refused
            results[members[j][0]] = ("error", message)
            del members[j], sequences[j]
            continue
        for (i, cut), score in zip(members, scores):
            scored = score.token_nll[score.token_nll.size - score.tokens_scored:]
            total, squares = f32_sums(scored)
            sums += Sums(score.tokens_scored, f64_fixed(score.nll_sum), total, squares)
            results[i] = ("ok", score.nll_sum, score.tokens_scored, score.greedy, cut, (total, squares),
                          score.token_nll if per_token else None)
        break
    return results, sums


def result_line(index, request, result):
    """The output line of one request, as `tinyloop score-batch` writes it: index, line (errors, when read from JSON
    lines), the echoed keys, then the scores or the error."""
    out = {"index": index}
    error = request.error if request.error is not None else (result[1] if result[0] == "error" else None)
    if error is not None and request.line is not None:
        out["line"] = request.line
    out.update(request.echo)
    if error is not None:
        out["error"] = error
        return out
    _, nll_sum, tokens_scored, greedy, cut = result[:5]
    mean = nll_sum / tokens_scored
    out.update(nll_sum=nll_sum, tokens_scored=tokens_scored, mean_nll=mean, perplexity=math.exp(mean),
               greedy=bool(greedy))
    if cut > 0:
        out["context_truncated"] = cut
    return out
