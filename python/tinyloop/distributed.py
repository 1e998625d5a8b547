"""Scoring on a Dask cluster: one model per worker, batches sized by tokens, results in input order, exact totals.

    from distributed import Client, LocalCluster
    import tinyloop.distributed as tld

    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        results = tld.score_batch(client, "models/demo-int4.tinyloop", requests, device="cpu")
        corpus = tld.score_corpus(client, "models/demo-int4.tinyloop", [open("data/eval.txt").read()], device="cpu")
        print(corpus.perplexity, corpus.perplexity_stderr)

Every worker loads the model once, on first use, and keeps it (a per-process cache keyed by path, device and
options). Tasks are pure functions of their batch, so a batch lost with a worker is run again elsewhere and counted
once. A request the library refuses gets its own error result, as in `tinyloop score-batch`; the run goes on.

The command line (`python -m tinyloop.distributed`, or `tinyloop-dask` once installed) is `main`. docs/distributed.md
has the whole story. Dask (Debian's python3-distributed) is needed only here: `import tinyloop` never imports it.
"""

import argparse
import collections.abc
import dataclasses
import json
import logging
import math
import os
import sys
import threading
import time
import typing

import numpy as np

from . import _requests, text as _text
from ._model import Model
from ._requests import Request, Sums, parse_line, parse_request, result_line

try:
    import distributed as _dd
except ImportError as _error:  # the package works without Dask; this module does not
    raise ImportError("tinyloop.distributed needs Dask's distributed package (Debian: apt install "
                      "python3-distributed; pip: pip install distributed)") from _error

__all__ = ["BatchResults", "CorpusResult", "DocumentScore", "ModelSpec", "iter_score_batch", "local_cluster",
           "main", "release_models", "score_batch", "score_corpus", "worker_models"]

# Tokens per task. The CPU backend scores about 1-2k tokens/s a core on the demo model, so a batch of this size is
# seconds of work: the per-task overhead of Dask (milliseconds) stays in the noise, and a batch lost with a worker
# costs little to redo. Raise it for GPU workers, whose forward passes pack up to 8192 tokens.
DEFAULT_BATCH_TOKENS = 8192


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """What a worker loads: Model(path, device, threads=..., ...). Workers keep one Model per distinct spec."""

    path: str
    device: typing.Any = None
    threads: int = 0
    max_memory_bytes: int = 0
    use_graphs: bool = True

    def __dask_tokenize__(self):
        return ("tinyloop.ModelSpec", self.path, str(self.device), self.threads, self.max_memory_bytes,
                self.use_graphs)

    def load(self):
        return Model(self.path, self.device, threads=self.threads, max_memory_bytes=self.max_memory_bytes,
                     use_graphs=self.use_graphs)


def _spec(model_path, device, threads, max_memory_bytes, use_graphs):
    if isinstance(model_path, ModelSpec):
        return model_path
    path = os.fspath(model_path)
    # A path that exists here is made absolute (workers on this host may run elsewhere than the current folder); one
    # that does not is the workers' path, taken as it is.
    if os.path.exists(path):
        path = os.path.abspath(path)
    return ModelSpec(path, device, int(threads), int(max_memory_bytes), bool(use_graphs))


# ---- the worker side: a per-process model cache and the tasks ----

_models = {}
_models_lock = threading.Lock()


def _worker_model(spec):
    """The worker process's Model for `spec`, loaded on first use and kept."""
    with _models_lock:
        model = _models.get(spec)
        if model is None:
            model = _models[spec] = spec.load()
        return model


def _load(spec):
    """Loads the model (if not yet) and says what the worker has: the model's properties and where it runs."""
    model = _worker_model(spec)
    return {"max_seq": model.max_seq, "vocab": model.vocab, "tokenizer": model.tokenizer, "pid": os.getpid(),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


def _score_task(spec, payloads, per_token):
    return _requests.score_payloads(_worker_model(spec), payloads, per_token=per_token)


def _tokenize_task(spec, texts):
    model = _worker_model(spec)
    return [model.tokenize(t) for t in texts]


def _release(path=None):
    with _models_lock:
        for spec in [s for s in _models if path is None or s.path == path]:
            _models.pop(spec).close()


def _held():
    with _models_lock:
        return list(_models)


def worker_models(client):
    """{worker address: [ModelSpec, ...]}: the models each worker holds."""
    return client.run(_held)


def release_models(client, model_path=None):
    """Frees the models the workers hold (those of `model_path`, or all)."""
    path = None if model_path is None else _spec(model_path, None, 0, 0, True).path
    client.run(_release, path)


# ---- the client side ----

def _n_workers(client):
    return len(client.scheduler_info().get("workers", {}))


def _model_info(client, spec, preload):
    """The model's properties, from a worker. With preload, every worker present loads the model now (in parallel),
    so that a model that does not load fails here, once, and the first batches do not wait for loads."""
    if preload and _n_workers(client):
        infos = client.run(_load, spec)
        return next(iter(infos.values()))
    return client.submit(_load, spec, pure=False).result()


def _pipeline(client, function, spec, jobs, extra, *, retries, max_in_flight, on_done=None):
    """Runs function(spec, payload, *extra) for each (meta, payload) of `jobs` as Dask tasks, at most max_in_flight
    at a time (finished ones waiting for their turn included, so memory stays bounded), and yields (meta, result) in
    job order. Keys are deterministic (pure tasks): a task lost with a worker is re-run under the same key, and its
    result arrives here once."""
    from dask.base import tokenize

    name = function.__name__.strip("_")
    pending, finished = {}, {}
    jobs = iter(jobs)
    submitted = emitted = 0
    exhausted = False
    try:
        while True:
            while not exhausted and len(pending) + len(finished) < max_in_flight:
                job = next(jobs, None)
                if job is None:
                    exhausted = True
                    break
                meta, payload = job
                key = f"tinyloop-{name}-{tokenize(spec, payload, *extra)}"
                future = client.submit(function, spec, payload, *extra, key=key, pure=True, retries=retries)
                pending[submitted] = (meta, future)
                submitted += 1
            if emitted in finished:
                yield finished.pop(emitted)
                emitted += 1
                continue
            if not pending:
                return
            _dd.wait([future for _, future in pending.values()], return_when="FIRST_COMPLETED")
            for number, (meta, future) in list(pending.items()):
                if future.done():
                    result = future.result()  # raises the task's error once its retries are spent
                    del pending[number]
                    future.release()
                    finished[number] = (meta, result)
                    if on_done is not None:
                        on_done(meta, result)
    finally:
        for _, future in pending.values():
            future.release()


# Batches per worker, at least, when the input is known up front: with fewer, the last round leaves workers idle
# while others finish (9 batches on 2 workers: at best 9/10 of the speed); a task costs Dask milliseconds, a batch
# of the demo model's windows on the CPU seconds.
_BATCHES_PER_WORKER = 8


def _balanced(batch_tokens, total, n_workers):
    """The batch size for `total` tokens known up front: at most batch_tokens, and small enough to give each worker
    about _BATCHES_PER_WORKER batches."""
    return max(1, min(batch_tokens, -(-total // (_BATCHES_PER_WORKER * max(n_workers, 1)))))


def _max_in_flight(client, max_in_flight):
    return max_in_flight if max_in_flight else max(8, 4 * _n_workers(client))


class _Progress:
    """Scored tokens as batches finish, for a progress(done, total) callable; `total` is the tokens read so far."""

    def __init__(self, progress):
        self.progress = progress
        self.done = 0
        self.total = 0
        self.start = time.monotonic()

    def read(self, tokens):
        self.total += tokens

    def finished(self, tokens):
        self.done += tokens
        if self.progress is not None:
            self.progress(self.done, self.total)


class BatchRun:
    """iter_score_batch's answer: iterate it for the result lines in input order; as it goes, `sums` (the exact
    totals, tinyloop._requests.Sums), `n_requests`, `n_errors`, `seconds` and `n_batches` fill in."""

    def __init__(self, client, spec, requests, *, batch_tokens, retries, max_in_flight, progress, preload):
        self.client, self.spec = client, spec
        self._requests = requests
        self.batch_tokens = int(batch_tokens)
        if self.batch_tokens < 1:
            raise ValueError("batch_tokens must be positive")
        self.retries, self.max_in_flight, self.preload = retries, max_in_flight, preload
        self._progress = _Progress(progress)
        self.sums = Sums()
        self.n_requests = self.n_errors = self.n_batches = 0
        self.seconds = 0.0
        self.model_info = None

    def _jobs(self):
        parsed = self._parsed()
        batch_tokens = self.batch_tokens
        if isinstance(self._requests, collections.abc.Sized):  # all known up front: balance them over the workers
            parsed = list(parsed)
            batch_tokens = _balanced(batch_tokens, sum(r.size for _, r in parsed), _n_workers(self.client))
        for batch in _requests.batches(parsed, batch_tokens, lambda item: item[1].size):
            self.n_batches += 1
            valid = [(i, r) for i, r in batch if r.error is None]
            self._progress.read(sum(r.scored_estimate for _, r in valid))
            yield [r for _, r in batch], [r.payload() for _, r in valid]

    def _parsed(self):
        for i, request in enumerate(self._requests):
            yield i, request if isinstance(request, Request) else parse_request(request)

    def __iter__(self):
        start = time.monotonic()
        self.model_info = _model_info(self.client, self.spec, self.preload)
        jobs = self._jobs()
        in_flight = _max_in_flight(self.client, self.max_in_flight)

        def done(batch, result):
            # What was counted for the batch when it was read, replaced by what it scored (text is counted by its
            # bytes until tokenized; a refused request scores nothing).
            estimate = sum(r.scored_estimate for r in batch if r.error is None)
            self._progress.total += result[1].tokens - estimate
            self._progress.finished(result[1].tokens)

        try:
            for batch, (results, sums) in _pipeline(self.client, _score_task, self.spec, jobs, (False,),
                                                     retries=self.retries, max_in_flight=in_flight, on_done=done):
                self.sums += sums
                answers = iter(results)
                for request in batch:
                    result = ("error", request.error) if request.error is not None else next(answers)
                    line = result_line(self.n_requests, request, result)
                    self.n_requests += 1
                    self.n_errors += "error" in line
                    yield line
        finally:
            self.seconds = time.monotonic() - start


class BatchResults(list):
    """score_batch's answer: the result lines (dicts, as `tinyloop score-batch` writes them) in input order, with the
    totals over the scored requests as attributes: nll_sum, tokens_scored, mean_nll, perplexity, perplexity_stderr
    (over the scored tokens' NLLs), n_errors, n_batches, seconds, tokens_per_second."""

    def __init__(self, lines, run):
        super().__init__(lines)
        for name, value in run.sums.summary().items():
            setattr(self, name, value)
        self.n_errors = run.n_errors
        self.n_batches = run.n_batches
        self.seconds = run.seconds
        self.tokens_per_second = run.sums.tokens / run.seconds if run.seconds > 0 else math.nan


def iter_score_batch(client, model_path, requests, *, device=None, threads=0, batch_tokens=DEFAULT_BATCH_TOKENS,
                     retries=3, max_in_flight=None, progress=None, preload=True, max_memory_bytes=0,
                     use_graphs=True):
    """Scores `requests` on the cluster, lazily: a BatchRun, whose iteration yields one result line (a dict) per
    request in input order while reading `requests` only as far as the batches in flight need. score_batch's
    arguments."""
    spec = _spec(model_path, device, threads, max_memory_bytes, use_graphs)
    return BatchRun(client, spec, requests, batch_tokens=batch_tokens, retries=retries, max_in_flight=max_in_flight,
                    progress=progress, preload=preload)


def score_batch(client, model_path, requests, **options):
    """Scores requests on a Dask cluster (a distributed.Client); returns BatchResults, one dict per request in input
    order, with the fields of a `tinyloop score-batch` output line: index, the request's own keys (echoed), nll_sum,
    tokens_scored, mean_nll, perplexity, greedy, context_truncated (when the context was cut to fit max_seq), or
    error (a request that is not valid or that the library refuses; the others are still scored).

    requests: score-batch's JSON forms as dicts ({"tokens": [...], "n_context": k}, {"context": [...],
    "continuation": [...]}, {"text": "...", "context_text": "..."}), or Model.score_batch's (token ids,
    (tokens, n_context), (context, continuation) as token ids or text). Text is tokenized on the workers, by the
    model's tokenizer.

    Options: device (each worker's: None/"auto", "cpu", "cuda" = the first GPU the worker sees, "cuda:N"), threads
    (CPU threads per worker, 0 = all cores), batch_tokens (the most tokens per task, DEFAULT_BATCH_TOKENS; requests
    given as a list, whose total is known, go in smaller batches when that gives each worker fewer than about 8),
    retries (a task that raises is tried again this many times), max_in_flight (tasks submitted at once; default 4
    per worker, at least 8), progress (a callable (done, total) in scored tokens, called as batches finish), preload
    (load the model on every worker first), max_memory_bytes, use_graphs (Model's)."""
    run = iter_score_batch(client, model_path, requests, **options)
    lines = list(run)
    return BatchResults(lines, run)


# ---- documents ----

@dataclasses.dataclass
class DocumentScore:
    """One document of score_corpus: its tokens, the scored ones (all but the first), the NLL sum (the exact sum of
    its windows' sums), perplexity and standard error, the windows, and with per_token its NLLs (float32,
    token_nll[i] for token i + 1). error: why it was not scored (the others were)."""

    index: int
    tokens: int = 0
    tokens_scored: int = 0
    nll_sum: float = math.nan
    perplexity: float = math.nan
    perplexity_stderr: float = math.nan
    n_windows: int = 0
    token_nll: typing.Optional[np.ndarray] = None
    error: typing.Optional[str] = None

    @property
    def mean_nll(self):
        return self.nll_sum / self.tokens_scored if self.tokens_scored else math.nan


@dataclasses.dataclass
class CorpusResult:
    """score_corpus's answer: the documents in input order and the corpus totals (exact sums over all scored tokens:
    nll_sum, tokens_scored, mean_nll, perplexity, perplexity_stderr), the window length, the batches and workers,
    the wall-clock seconds and tokens/s."""

    documents: list
    nll_sum: float
    tokens_scored: int
    mean_nll: float
    perplexity: float
    perplexity_stderr: float
    window: int
    n_windows: int
    n_batches: int
    n_workers: int
    seconds: float
    tokens_per_second: float

    @property
    def n_errors(self):
        return sum(d.error is not None for d in self.documents)


def _windows(n_tokens, window):
    """(start, length) of `tinyloop score`'s windows: `window` tokens overlapping by one, the first token of each only
    context (cpp/score/score_plan.cpp)."""
    return [(start, min(window, n_tokens - start)) for start in range(0, n_tokens - 1, window - 1)]


def score_corpus(client, model_path, documents, *, window=0, per_token=False, device=None, threads=0,
                 batch_tokens=DEFAULT_BATCH_TOKENS, retries=3, max_in_flight=None, progress=None, preload=True,
                 max_memory_bytes=0, use_graphs=True):
    """Scores documents on a Dask cluster as `tinyloop score` scores a text: each cut into windows of `window` tokens
    (0 = the model's max_seq) that overlap by one token, every token after a document's first scored. The windows of
    all documents are scored as independent sequences in batches of about batch_tokens tokens, spread over the
    workers; on the CPU backend each token's NLL is the same bits `Model.score` gives for the document.

    documents: text (str / bytes, through the model's tokenizer: on the workers, or here for a byte-level model) or
    token ids (1-D integer arrays or lists). A document the model cannot score (fewer than two tokens, a token
    outside the vocabulary) gets its error; the others are scored. The other options are score_batch's; per_token
    also returns each document's NLLs. Returns a CorpusResult."""
    start_time = time.monotonic()
    spec = _spec(model_path, device, threads, max_memory_bytes, use_graphs)
    info = _model_info(client, spec, preload)
    length = int(window) or info["max_seq"]
    if not 2 <= length <= info["max_seq"]:
        raise ValueError(f"window {window} is outside [2, max_seq = {info['max_seq']}]")
    in_flight = _max_in_flight(client, max_in_flight)
    documents = list(documents)
    scores = [DocumentScore(index=i) for i in range(len(documents))]
    tokens = [None] * len(documents)

    # Text through the model's tokenizer: here for a byte-level model (its tokens are the UTF-8 bytes), else on the
    # workers, in batches of about batch_tokens bytes.
    texts = []
    for i, document in enumerate(documents):
        if isinstance(document, (str, bytes, bytearray, memoryview)):
            if info["tokenizer"] == "bytes":
                tokens[i] = _text.encode(document)
            else:
                texts.append((i, _text.as_bytes(document)))
        else:
            array = np.asarray(document)
            if array.size == 0:
                array = array.astype(np.int32)
            if array.ndim != 1 or array.dtype.kind not in "iu":
                scores[i].error = f"token ids must be a one-dimensional array of integers, got {array.dtype}"
                continue
            bad = np.flatnonzero((array < 0) | (array >= info["vocab"]))
            if bad.size:
                j = int(bad[0])
                scores[i].error = f"tokens[{j}] = {int(array[j])} is outside the vocabulary [0, {info['vocab']})"
                continue
            tokens[i] = array.astype(np.int32)
    if texts:
        jobs = ((list(zip(*batch))[0], list(zip(*batch))[1])
                for batch in _requests.batches(texts, batch_tokens, lambda item: len(item[1])))
        for indices, arrays in _pipeline(client, _tokenize_task, spec, jobs, (), retries=retries,
                                         max_in_flight=in_flight):
            for i, array in zip(indices, arrays):
                tokens[i] = array

    windows = []  # (document, start, length)
    for i, array in enumerate(tokens):
        if array is None:
            continue
        scores[i].tokens = int(array.size)
        if array.size < 2:
            scores[i].error = f"a document needs at least two tokens, got {array.size}"
            continue
        for start, n in _windows(array.size, length):
            windows.append((i, start, n))
        scores[i].n_windows = len(_windows(array.size, length))

    tracker = _Progress(progress)
    tracker.total = sum(n - 1 for _, _, n in windows)
    window_batch = _balanced(batch_tokens, sum(n for _, _, n in windows), _n_workers(client))
    jobs = ((batch, [(tokens[i][start:start + n], 0, None, None) for i, start, n in batch])
            for batch in _requests.batches(windows, window_batch, lambda w: w[2]))
    corpus = Sums()
    per_document = [Sums() for _ in documents]
    nll_parts = [[] for _ in documents] if per_token else None
    n_batches = 0
    for batch, (results, sums) in _pipeline(client, _score_task, spec, jobs, (per_token,), retries=retries,
                                             max_in_flight=in_flight,
                                             on_done=lambda meta, result: tracker.finished(result[1].tokens)):
        n_batches += 1
        corpus += sums
        for (i, start, n), result in zip(batch, results):
            if result[0] == "error":  # the document was checked above: a refusal here is not the document's fault
                raise RuntimeError(f"documents[{i}], window at token {start}: {result[1]}")
            _, nll_sum, scored, _, _, (total, squares), token_nll = result
            per_document[i] += Sums(scored, _requests.f64_fixed(nll_sum), total, squares)
            if per_token:
                nll_parts[i].append(token_nll)

    for i, document in enumerate(scores):
        if document.error is not None or tokens[i] is None:
            continue
        sums = per_document[i]
        document.tokens_scored = sums.tokens
        document.nll_sum = sums.nll_sum
        document.perplexity = sums.perplexity
        document.perplexity_stderr = sums.perplexity_stderr
        if per_token:
            document.token_nll = np.concatenate(nll_parts[i]) if nll_parts[i] else np.zeros(0, np.float32)
    seconds = time.monotonic() - start_time
    return CorpusResult(documents=scores, window=length, n_windows=len(windows), n_batches=n_batches,
                        n_workers=_n_workers(client), seconds=seconds,
                        tokens_per_second=corpus.tokens / seconds if seconds > 0 else math.nan, **corpus.summary())


# ---- clusters on this machine ----

def local_cluster(n_workers=None, *, gpus=None, threads_per_worker=1, **options):
    """A cluster on this machine: n_workers CPU worker processes (LocalCluster; default one per core), or with gpus
    (a list of CUDA device ids, or True for every visible GPU) one worker process per GPU, its CUDA_VISIBLE_DEVICES
    set to that GPU alone, so that device "cuda" is its own GPU. Each worker runs threads_per_worker tasks at once
    (1: one batch at a time). Close it (or use `with`)."""
    from distributed import LocalCluster, Nanny, Scheduler, SpecCluster

    # No dashboard unless asked for (it needs bokeh); the scheduler's HTTP server (health, metrics) then takes any
    # free port rather than 8787, which another cluster may hold.
    dashboard = options.pop("dashboard_address", None)
    scheduler_options = {"dashboard": dashboard is not None, "dashboard_address": dashboard or ":0",
                         **options.pop("scheduler_kwargs", {})}
    options.setdefault("silence_logs", logging.ERROR)
    if gpus is None:
        return LocalCluster(n_workers=n_workers or os.cpu_count(), threads_per_worker=threads_per_worker,
                            processes=True, dashboard_address=dashboard, scheduler_kwargs=scheduler_options,
                            **options)
    if gpus is True:
        gpus = visible_gpus()
    gpus = [str(g) for g in gpus]
    if not gpus:
        raise RuntimeError("no GPU to start workers on (CUDA_VISIBLE_DEVICES, or the library sees no device)")
    host = options.pop("host", "127.0.0.1")  # as LocalCluster: this machine only
    scheduler = {"cls": Scheduler, "options": {**scheduler_options, "host": host}}
    silence = options.pop("silence_logs")
    workers = {}
    for g in gpus:
        worker = {"nthreads": threads_per_worker, "env": {"CUDA_VISIBLE_DEVICES": g}, "host": host,
                  "silence_logs": silence, **options}
        workers[f"gpu-{g}"] = {"cls": Nanny, "options": worker}
    return SpecCluster(workers=workers, scheduler=scheduler, silence_logs=silence)


def visible_gpus():
    """The CUDA devices this process may use: CUDA_VISIBLE_DEVICES's entries when it is set, else 0..n-1 for the n
    devices the library sees."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g.strip() for g in visible.split(",") if g.strip() and not g.strip().startswith("-")]
    from ._model import device_count

    return [str(i) for i in range(device_count())]


# ---- the command line ----

class _ProgressLog:
    """Progress lines on stderr: every `interval` seconds (0: every batch) and one at the end."""

    def __init__(self, interval, n_workers, quiet):
        self.interval, self.n_workers, self.quiet = interval, n_workers, quiet
        self.start = self.last = time.monotonic()

    def __call__(self, done, total, final=False):
        now = time.monotonic()
        if self.quiet or (not final and now - self.last < self.interval):
            return
        self.last = now
        elapsed = max(now - self.start, 1e-9)
        rate = done / elapsed
        eta = f", ETA {(total - done) / rate:.0f} s" if rate > 0 and total > done else ""
        share = f" ({100.0 * done / total:.1f}%)" if total else ""
        print(f"progress {done}/{total} tokens{share}, {rate:.1f} tok/s, {self.n_workers} workers{eta}",
              file=sys.stderr, flush=True)


def _read_requests(stream, run_state):
    """Requests of a JSON-lines stream (binary), line numbers kept, holding one line at a time; blank lines skipped;
    a line over the limit ends the input (as `tinyloop score-batch`: such an input is not JSON lines)."""
    limit = _requests.MAX_LINE_BYTES
    number = 0
    while True:
        raw = stream.readline(limit + 1)
        if not raw:
            return
        number += 1
        line = raw[:-1] if raw.endswith(b"\n") else raw
        if len(line) > limit:
            run_state["fatal"] = f"line {number} is longer than the limit of {limit} bytes"
            return
        if not line.strip(b" \t\r"):
            continue
        try:
            decoded = line.decode("utf-8")
        except UnicodeDecodeError as e:
            yield Request(line=number, error=f"the request is not valid JSON: not UTF-8 at byte {e.start}")
            continue
        yield parse_line(decoded, number)


def _client_for(args):
    from distributed import Client

    if args.scheduler:
        return Client(args.scheduler), None
    cluster = local_cluster(args.local, gpus=(args.gpus_list if args.gpus else None))
    return Client(cluster), cluster


def _default_threads(args):
    if args.threads is not None:
        return args.threads
    if args.local and not args.gpus:  # N worker processes share this machine's cores
        return max(1, (os.cpu_count() or 1) // args.local)
    return 0


def _open_output(path):
    return sys.stdout if path == "-" else open(path, "w", encoding="utf-8")


def _cmd_score_batch(args, client):
    stream = sys.stdin.buffer if args.input == "-" else open(args.input, "rb")
    out = _open_output(args.output)
    state = {}
    log = _ProgressLog(args.progress_interval, _n_workers(client), args.quiet)
    run = iter_score_batch(client, args.model, _read_requests(stream, state), device=args.device,
                           threads=_default_threads(args), batch_tokens=args.batch_tokens, retries=args.retries,
                           progress=log)
    source = "stdin" if args.input == "-" else f"'{args.input}'"
    try:
        for line in run:
            if "error" in line:
                where = f" line {line['line']}" if "line" in line else ""
                print(f"tinyloop-dask: {source}{where}: {line['error']}", file=sys.stderr)
            # Compact, as `tinyloop score-batch` writes its lines.
            out.write(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n")
        out.flush()
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()
        if out is not sys.stdout:
            out.close()
    log(run._progress.done, run._progress.total, final=True)
    sums = run.sums
    if not args.quiet:
        print(f"scored {run.n_requests - run.n_errors} of {run.n_requests} requests, {sums.tokens} tokens in "
              f"{run.seconds:.2f} s ({sums.tokens / max(run.seconds, 1e-9):.1f} tok/s) on "
              f"{_n_workers(client)} workers, {run.n_batches} batches; PPL = {sums.perplexity:.4f} ± "
              f"{sums.perplexity_stderr:.5f}", file=sys.stderr)
    if "fatal" in state:
        print(f"tinyloop-dask: {source}: {state['fatal']}", file=sys.stderr)
        return 1
    if run.n_errors:
        print(f"tinyloop-dask: {run.n_errors} of {run.n_requests} requests failed; their output lines hold "
              '"error"', file=sys.stderr)
        return 1
    return 0


def _cmd_score(args, client):
    documents = []
    for path in args.text:
        with (sys.stdin.buffer if path == "-" else open(path, "rb")) as f:
            documents.append(f.read())
    log = _ProgressLog(args.progress_interval, _n_workers(client), args.quiet)
    result = score_corpus(client, args.model, documents, window=args.window, device=args.device,
                          threads=_default_threads(args), batch_tokens=args.batch_tokens, retries=args.retries,
                          progress=log)
    log(result.tokens_scored, result.tokens_scored, final=True)
    for path, document in zip(args.text, result.documents):
        if document.error is not None:
            print(f"tinyloop-dask: {path}: {document.error}", file=sys.stderr)
    if args.json:
        summary = {k: v for k, v in dataclasses.asdict(result).items() if k != "documents"}
        summary["documents"] = [
            {"text": path, **{k: v for k, v in dataclasses.asdict(d).items() if k not in ("index", "token_nll")
                              and v is not None}}
            for path, d in zip(args.text, result.documents)]
        print(json.dumps(_json_safe(summary)))
    else:
        print(f"{result.tokens_scored} tokens scored in {len(documents)} documents, {result.n_windows} windows of "
              f"{result.window}, {result.n_batches} batches on {result.n_workers} workers")
        print(f"NLL/token {result.mean_nll:.6f}, {result.seconds:.2f} s ({result.tokens_per_second:.1f} tok/s)")
        print(f"PPL = {result.perplexity:.4f} ± {result.perplexity_stderr:.5f}")
    return 1 if result.n_errors else 0


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def _parser():
    parser = argparse.ArgumentParser(
        prog="tinyloop-dask", description="Score requests or texts with a .tinyloop model on a Dask cluster.",
        epilog="Exit status: 0 success, 1 runtime error or a request that failed, 2 usage error.")
    commands = parser.add_subparsers(dest="command", required=True)

    def common(sub):
        sub.add_argument("model", help="the .tinyloop file (the workers' path to it)")
        where = sub.add_mutually_exclusive_group(required=True)
        where.add_argument("--scheduler", metavar="ADDRESS", help="a running scheduler, tcp://host:8786")
        where.add_argument("--local", type=int, metavar="N", help="start N CPU worker processes on this machine")
        where.add_argument("--gpus", nargs="?", const="all", metavar="LIST",
                           help="start one worker per GPU on this machine (all visible, or a list: 0,1)")
        sub.add_argument("--device", default=None,
                         help="each worker's device: auto, cpu, cuda (the worker's first visible GPU) or cuda:N "
                              "(default: cpu with --local, cuda with --gpus, else auto)")
        sub.add_argument("--threads", type=int, default=None,
                         help="CPU threads per worker (default: the cores divided among --local's workers, else all)")
        sub.add_argument("--batch-tokens", type=int, default=DEFAULT_BATCH_TOKENS,
                         help="tokens per task (default %(default)s)")
        sub.add_argument("--retries", type=int, default=3, help="times a failed task is tried again")
        sub.add_argument("--progress-interval", type=float, default=5.0, metavar="S",
                         help="seconds between progress lines on stderr (0 = after every batch)")
        sub.add_argument("-q", "--quiet", action="store_true", help="no progress or summary on stderr")

    batch = commands.add_parser("score-batch", help="score JSON-lines requests, as `tinyloop score-batch`")
    common(batch)
    batch.add_argument("--input", default="-", help="the requests, a JSON-lines file or - for stdin")
    batch.add_argument("--output", default="-", help="where the results go, a file or - for stdout")

    score = commands.add_parser("score", help="the perplexity of texts (each a document), as `tinyloop score`")
    common(score)
    score.add_argument("--text", action="append", required=True, metavar="FILE",
                       help="a text file (- for stdin); repeat for more documents")
    score.add_argument("--window", type=int, default=0, help="window length (default: the model's max_seq)")
    score.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    return parser


def main(argv=None):
    """`tinyloop-dask` / `python -m tinyloop.distributed`: score-batch and score on a Dask cluster."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.local is not None and args.local < 1:
        parser.error("--local takes a positive number of workers")
    if args.batch_tokens < 1:
        parser.error("--batch-tokens must be positive")
    args.gpus_list = None
    if args.gpus is not None:
        args.gpus_list = True if args.gpus == "all" else [g for g in args.gpus.split(",") if g]
    if args.device is None:
        args.device = "cpu" if args.local else ("cuda" if args.gpus else None)
    try:
        client, cluster = _client_for(args)
    except Exception as e:
        print(f"tinyloop-dask: cannot start or reach the cluster: {e}", file=sys.stderr)
        return 1
    try:
        with client:
            if not args.quiet:
                print(f"tinyloop-dask: {_n_workers(client)} workers at {client.scheduler.address}", file=sys.stderr)
            command = _cmd_score_batch if args.command == "score-batch" else _cmd_score
            return command(args, client)
    except (OSError, ValueError, RuntimeError) as e:
        print(f"tinyloop-dask: {e}", file=sys.stderr)
        return 1
    finally:
        if cluster is not None:
            cluster.close()


if __name__ == "__main__":
    # Run as `python -m tinyloop.distributed`: the module's own copy, so that the tasks it submits are pickled by
    # reference to tinyloop.distributed (which workers import), not to __main__.
    from tinyloop.distributed import main as _main

    sys.exit(_main())
