"""tinyloop.distributed on LocalClusters of 2 and 4 CPU worker processes: the same bits as a single process (requests
and documents), exact totals, a worker killed mid-run, refusals reported per request, the command line against
`tinyloop score-batch`, per-GPU workers' CUDA_VISIBLE_DEVICES. Needs Dask's distributed (Debian's
python3-distributed, which scripts/install-deps.sh installs); skipped without it."""

import fractions
import json
import math
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from conftest import DEMO_MODEL, EVAL_TEXT, run_python

distributed = pytest.importorskip("distributed")

N_REQUESTS = 1000


def harness_requests(n=N_REQUESTS, seed=0):
    """Loglikelihood requests as an evaluation harness makes them, from the evaluation text: a context of a few
    bytes and a continuation of a word or less, in score-batch's three JSON forms, with the harness's keys to echo;
    two contexts longer than max_seq (cut from the front). Short, to keep the test's time down: on the CPU a request
    costs about 30 ms of the demo model's time however short it is."""
    rng = np.random.default_rng(seed)
    text = EVAL_TEXT.read_bytes()
    requests = []
    for i in range(n):
        start = int(rng.integers(0, len(text) - 700))
        n_context = 600 if i % 500 == 7 else int(rng.integers(2, 16))
        n_continuation = int(rng.integers(1, 5))
        context = text[start:start + n_context]
        continuation = text[start + n_context:start + n_context + n_continuation]
        form = i % 10
        if form < 7:
            request = {"context_text": context.decode("utf-8", "replace"),
                       "text": continuation.decode("utf-8", "replace")}
        elif form < 9:
            request = {"context": list(context), "continuation": list(continuation)}
        else:
            request = {"tokens": list(context + continuation), "n_context": len(context)}
        request.update(doc_id=i, task="eval-text")
        requests.append(request)
    return requests


def as_sequence(request, max_seq=512):
    """A request as Model.score_batch's (tokens, n_context), the context cut as score-batch cuts it (the test's own
    reading of docs/api.md, not the package's code)."""
    if "tokens" in request:
        tokens, n_context = np.array(request["tokens"]), request["n_context"]
    elif "context" in request:
        tokens, n_context = np.array(request["context"] + request["continuation"]), len(request["context"])
    else:
        context, continuation = request["context_text"].encode(), request["text"].encode()
        tokens, n_context = np.frombuffer(context + continuation, np.uint8), len(context)
    cut = min(len(tokens) - max_seq, n_context - 1) if len(tokens) > max_seq and n_context >= 2 else 0
    return tokens[cut:].astype(np.int32), n_context - cut, cut


@pytest.fixture(scope="module")
def tld(library_path):
    import tinyloop.distributed

    return tinyloop.distributed


@pytest.fixture(scope="module")
def requests_and_reference(demo):
    """The harness requests and a single-process run of them: one Model.score_batch call."""
    requests = harness_requests()
    sequences = [as_sequence(r) for r in requests]
    batch = demo.score_batch([(tokens, k) for tokens, k, _ in sequences], per_token=True)
    reference = []
    for request, (_, _, cut), score in zip(requests, sequences, batch):
        line = {"doc_id": request["doc_id"], "task": request["task"], "nll_sum": score.nll_sum,
                "tokens_scored": score.tokens_scored, "greedy": score.greedy,
                "scored_nll": score.token_nll[score.token_nll.size - score.tokens_scored:]}
        if cut:
            line["context_truncated"] = cut
        reference.append(line)
    assert sum("context_truncated" in r for r in reference) == 2
    return requests, reference


def check_lines(lines, reference):
    assert len(lines) == len(reference)
    for i, (line, expected) in enumerate(zip(lines, reference)):
        assert line["index"] == i
        assert list(line)[:3] == ["index", "doc_id", "task"]  # the echoed keys right after the index
        assert line["doc_id"] == expected["doc_id"] and line["task"] == expected["task"]
        # The same double, to the last bit.
        assert line["nll_sum"] == expected["nll_sum"], i
        assert line["tokens_scored"] == expected["tokens_scored"]
        assert line["greedy"] == expected["greedy"]
        assert line["mean_nll"] == expected["nll_sum"] / expected["tokens_scored"]
        assert line["perplexity"] == math.exp(line["mean_nll"])
        assert line.get("context_truncated") == expected.get("context_truncated")
        assert "error" not in line


def exact_totals(values_per_request, nll_sums):
    """The corpus totals from the reference, in exact rational arithmetic: perplexity from the NLL sums, the
    standard error from the per-token float32 NLLs."""
    tokens = np.concatenate(values_per_request).astype(np.float64)
    n = tokens.size
    s1 = sum(fractions.Fraction(x) for x in tokens)
    s2 = sum(fractions.Fraction(x) ** 2 for x in tokens)
    nll_sum = math.fsum(nll_sums)  # correctly rounded, as the exact sum rounded once
    perplexity = math.exp(float(sum(fractions.Fraction(x) for x in nll_sums) / n))
    variance = float((n * s2 - s1 * s1) / (n * (n - 1)))
    return nll_sum, n, perplexity, perplexity * math.sqrt(variance / n)


@pytest.fixture(scope="module", params=[2, 4], ids=["2-workers", "4-workers"])
def client(request, tld):
    with tld.local_cluster(request.param) as cluster, distributed.Client(cluster) as client:
        client.wait_for_workers(request.param)
        yield client


# ---- without a cluster ----

def test_import_tinyloop_does_not_import_dask(library_path):
    done = run_python("import sys, tinyloop; assert not {'dask', 'distributed'} & set(sys.modules), "
                      "sorted(m for m in sys.modules if m.startswith(('dask', 'distributed')))")
    assert done.returncode == 0, done.stderr


def test_without_dask_the_module_says_what_to_install(library_path):
    done = run_python("import sys; sys.modules['distributed'] = None\n"
                      "try:\n    import tinyloop.distributed\nexcept ImportError as e:\n    print(e)\n")
    assert done.returncode == 0, done.stderr
    assert "python3-distributed" in done.stdout


def test_exact_sums_do_not_depend_on_grouping():
    from tinyloop import _requests

    rng = np.random.default_rng(3)
    values = np.concatenate([rng.exponential(2.0, 5000), [0.0, -0.0, 1e-40, 3e-45, 7e-8, 30.0, -1e-7]])
    values = values.astype(np.float32)
    rng.shuffle(values)
    total, squares = _requests.f32_sums(values)
    exact = sum(fractions.Fraction(float(x)) for x in values)
    exact_squares = sum(fractions.Fraction(float(x)) ** 2 for x in values)
    assert fractions.Fraction(total, 2**149) == exact
    assert fractions.Fraction(squares, 2**298) == exact_squares
    # Any split adds up to the same integers.
    parts = [_requests.f32_sums(part) for part in np.array_split(values, 7)]
    assert sum(p[0] for p in parts) == total and sum(p[1] for p in parts) == squares
    doubles = rng.exponential(50.0, 300)
    fixed = sum(_requests.f64_fixed(x) for x in doubles)
    sums = _requests.Sums(tokens=300, nll=fixed)
    assert sums.nll_sum == math.fsum(doubles)
    with pytest.raises(ValueError):
        _requests.f32_sums(np.array([1.0, np.inf], np.float32))


def test_batches_are_sized_by_tokens():
    from tinyloop import _requests

    sizes = [3, 4, 10, 1, 1, 1, 25, 2]
    groups = list(_requests.batches(sizes, 8, size=lambda s: s))
    assert groups == [[3, 4, 10], [1, 1, 1, 25], [2]]
    assert sum(groups, []) == sizes


# ---- on the clusters (2 and 4 workers) ----

def test_requests_equal_a_single_process(client, tld, requests_and_reference):
    requests, reference = requests_and_reference
    # Refusals among them: reported in their own lines, the others scored as if they were not there.
    bad = {17: {"tokens": [1, 2, 300], "doc_id": "bad-vocab"},
           500: {"context": [1], "continuation": [65] * 600, "doc_id": "bad-length"},
           999: {"tokens": [5, 6, 7], "n_context": 3, "doc_id": "bad-context"}}
    mixed = list(requests)
    for position, request in sorted(bad.items()):
        mixed.insert(position, request)
    done = []
    results = tld.score_batch(client, DEMO_MODEL, mixed, device="cpu", threads=1, batch_tokens=4096,
                              progress=lambda d, t: done.append((d, t)))
    errors = {i: line for i, line in enumerate(results) if "error" in line}
    assert sorted(errors) == sorted(bad)
    assert errors[17] == {"index": 17, "doc_id": "bad-vocab",
                          "error": "tokens[2] = 300 is outside the vocabulary [0, 256)"}
    assert errors[500]["error"] == "n_tokens = 601 is outside [2, max_seq = 512]"
    assert errors[999]["error"] == "n_context = 3 leaves nothing to score (n_tokens = 3)"
    good = [line for i, line in enumerate(results) if i not in bad]
    for i, line in enumerate(good):
        line["index"] = i  # renumbered as if the refused ones were not there
    check_lines(good, reference)
    # Totals: exact sums of every scored token, whatever the batches.
    nll_sum, n, perplexity, stderr = exact_totals([r["scored_nll"] for r in reference],
                                                  [r["nll_sum"] for r in reference])
    assert (results.nll_sum, results.tokens_scored) == (nll_sum, n)
    assert results.perplexity == perplexity
    assert results.perplexity_stderr == pytest.approx(stderr, rel=1e-15, abs=0)
    assert results.n_errors == 3 and results.n_batches >= 4
    assert done and done[-1] == (n, n) and all(a[0] <= b[0] for a, b in zip(done, done[1:]))


@pytest.fixture(scope="module")
def documents_and_reference(demo):
    """Three documents of the evaluation text (str, bytes, token ids) and Model.score of each."""
    text = EVAL_TEXT.read_bytes()[:8000]
    documents = [text[:3900].decode("utf-8"), text[3900:4700], np.frombuffer(text[4700:], np.uint8).astype(np.int64)]
    return documents, [demo.score(d if not isinstance(d, str) else d.encode(), per_token=True) for d in documents]


def test_documents_equal_a_single_process(client, tld, documents_and_reference):
    documents, reference = documents_and_reference
    # The batch size differs with the cluster size, so the windows are grouped differently in each run.
    batch_tokens = 1500 if len(client.scheduler_info()["workers"]) == 2 else 2600
    result = tld.score_corpus(client, DEMO_MODEL, documents + ["x"], device="cpu", threads=1, per_token=True,
                              batch_tokens=batch_tokens)
    *scored, short = result.documents
    assert short.error == "a document needs at least two tokens, got 1" and result.n_errors == 1
    for document, expected in zip(scored, reference):
        assert document.error is None
        assert document.tokens_scored == expected.tokens_scored
        assert document.n_windows == expected.n_windows
        # Every token's NLL the same bits as Model.score (tl_score) gives.
        np.testing.assert_array_equal(document.token_nll.view(np.uint32), expected.token_nll.view(np.uint32))
        # The NLL sum adds the windows' sums (tl_score adds token after token): the same to rounding.
        assert document.nll_sum == pytest.approx(expected.nll_sum, rel=1e-13)
    nll_sum, n, perplexity, stderr = exact_totals([r.token_nll for r in reference], [r.nll_sum for r in reference])
    assert result.tokens_scored == n == 7997
    assert result.perplexity == pytest.approx(perplexity, rel=1e-13)
    assert result.perplexity_stderr == pytest.approx(stderr, rel=1e-13)
    # The same totals, to the last bit, from both cluster sizes and their different batches.
    totals = (result.nll_sum, result.perplexity, result.perplexity_stderr)
    seen = test_documents_equal_a_single_process.__dict__.setdefault("totals", set())
    seen.add(totals)
    assert len(seen) == 1


def test_a_worker_killed_midway(tld, requests_and_reference):
    """A worker process is killed (SIGKILL) while it runs a batch: Dask's nanny starts a new one, the scheduler
    runs the lost batches again, and the results are the same, none lost or counted twice."""
    requests, reference = requests_and_reference
    requests, reference = requests[:400], reference[:400]
    with tld.local_cluster(2) as cluster, distributed.Client(cluster) as client:
        client.wait_for_workers(2)
        pids = client.run(os.getpid)
        killed = []

        def progress(done, total):
            if killed:
                return
            busy = [w for w, keys in client.processing().items() if keys]
            if busy:
                os.kill(pids[busy[0]], signal.SIGKILL)
                killed.append((pids[busy[0]], done))

        results = tld.score_batch(client, DEMO_MODEL, requests, device="cpu", threads=1, batch_tokens=600,
                                  progress=progress)
        assert killed, "no worker was busy to be killed"
        assert killed[0][1] < results.tokens_scored  # mid-run
        assert killed[0][0] not in client.run(os.getpid).values()  # that process is gone, a new one took its place
    check_lines(results, reference)
    assert results.tokens_scored == sum(r["tokens_scored"] for r in reference)
    assert results.nll_sum == math.fsum(r["nll_sum"] for r in reference)


def test_a_model_that_does_not_load_fails_the_run(tld, tmp_path, tinyloop):
    with tld.local_cluster(1) as cluster, distributed.Client(cluster) as client:
        with pytest.raises(tinyloop.Error, match="cannot open"):
            tld.score_batch(client, tmp_path / "missing.tinyloop", [[1, 2, 3]], device="cpu")


def test_gpu_workers_see_one_gpu_each(tld):
    """local_cluster(gpus=...) gives each worker its own CUDA_VISIBLE_DEVICES (checked here without a GPU: the
    workers score on the CPU)."""
    with tld.local_cluster(gpus=["0", "1"]) as cluster, distributed.Client(cluster) as client:
        client.wait_for_workers(2)
        spec = tld.ModelSpec(str(DEMO_MODEL), "cpu", 1)
        seen = sorted(info["cuda_visible_devices"] for info in client.run(tld._load, spec).values())
        assert seen == ["0", "1"]
        results = tld.score_batch(client, DEMO_MODEL, [{"text": "ab", "context_text": "x"}], device="cpu")
        assert results[0]["tokens_scored"] == 2


# ---- the command line ----

def test_command_line_matches_tinyloop_score_batch(cli, tmp_path, library_path):
    lines = [json.dumps(r) for r in harness_requests(40, seed=5)]
    lines += ['{"tokens":[1,2,300],"id":1}', "", '{"tokens":[5],"n_context":0}', '{"context":[],"continuation":[1]}',
              '{"text":"ab","context_text":""}', '{"text":"ab","context_text":"x","index":3}',
              '{"tokens":[1,2],"text":"x"}', '{"tokens":[1,2.0]}', '{"tokens":[1,true]}', "[1]",
              '{"tokens":[1,2], "n_context": -1}', '{"foo":1}', '{"tokens":"abc"}', '{"tokens":[3000000000]}',
              '{"context":[1]}', '{"text":5}', json.dumps({"text": "hello", "context_text": "x" * 700, "d": {"a": 1}}),
              "not json"]
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(lines) + "\n")
    expected = subprocess.run([str(cli), "score-batch", str(DEMO_MODEL), "--backend", "cpu", "-q", "--input",
                               str(path)], capture_output=True, text=True, timeout=120)
    assert expected.returncode == 1
    out = tmp_path / "out.jsonl"
    done = subprocess.run([sys.executable, "-m", "tinyloop.distributed", "score-batch", str(DEMO_MODEL), "--local",
                           "2", "--input", str(path), "--output", str(out), "--batch-tokens", "400",
                           "--progress-interval", "0"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "progress " in done.stderr and "16 of 57 requests failed" in done.stderr
    got = [json.loads(line) for line in out.read_text().splitlines()]
    want = [json.loads(line) for line in expected.stdout.splitlines()]
    # The JSON parser's own words differ (nlohmann's and Python's): only that one says "not valid JSON".
    assert want[-1]["error"].startswith("the request is not valid JSON: ")
    assert got[-1]["error"].startswith("the request is not valid JSON: ")
    want[-1]["error"] = got[-1]["error"]
    assert got == want


def test_command_line_usage_errors():
    done = subprocess.run([sys.executable, "-m", "tinyloop.distributed", "score-batch", str(DEMO_MODEL)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--scheduler" in done.stderr
    done = subprocess.run([sys.executable, "-m", "tinyloop.distributed", "score-batch", str(DEMO_MODEL), "--local",
                           "0"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "positive" in done.stderr


# ---- the GPU figures' tool, as a dry run on the CPU ----

def test_gpu_sharing_tool_runs_on_the_cpu(library_path):
    tool = DEMO_MODEL.parents[1] / "tools" / "gpu" / "distributed_gpu.py"
    done = subprocess.run([sys.executable, str(tool), str(DEMO_MODEL), "--device", "cpu", "--docs", "4", "--doc-min",
                           "12", "--doc-max", "30"], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    # The CPU backend repeats its bits whatever the batching.
    for key in ("per_document", "packed"):
        assert report[key]["identical"] == report[key]["of"] == 4, report
    assert report["per_document"]["one_process_twice"]["identical"] == 4
