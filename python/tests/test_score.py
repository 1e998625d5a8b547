"""Model.score and Model.score_batch against the CLI and the C API (bit for bit on the CPU backend), numpy in and
out, options and progress."""

import ctypes
import json
import subprocess

import numpy as np
import pytest

from conftest import DEMO_MODEL, DEMO_TEXT, EVAL_TEXT, TINY_MODEL


def cli_json(cli, *args, stdin=None):
    done = subprocess.run([str(cli), *map(str, args)], input=stdin, capture_output=True, text=True, timeout=60,
                          check=True)
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def test_score_text_matches_cli(demo, cli, tmp_path):
    text = EVAL_TEXT.read_bytes()[:1200]
    path = tmp_path / "eval-head.txt"
    path.write_bytes(text)
    (expected,) = cli_json(cli, "score", DEMO_MODEL, "--text", path, "--backend", "cpu", "--json")
    result = demo.score(text, per_token=True)
    assert result.backend == "cpu"
    assert result.tokens_scored == expected["tokens_scored"] == len(text) - 1
    assert result.n_windows == expected["windows"] == 3  # max_seq 512, windows overlapping by one token
    # The same double, to the last bit: nlohmann::json prints doubles so that they read back exactly.
    assert result.nll_sum == expected["nll_sum"]
    assert result.perplexity == expected["perplexity"]
    assert result.mean_nll == pytest.approx(expected["nll_mean"], rel=1e-15)
    assert isinstance(result.token_nll, np.ndarray) and result.token_nll.dtype == np.float32
    assert result.token_nll.shape == (len(text) - 1,)
    assert float(result.token_nll.sum(dtype=np.float64)) == pytest.approx(result.nll_sum, rel=1e-6)


def test_score_tokens_and_window_match_cli(tiny, cli, tmp_path):
    tokens = np.arange(300, dtype=np.int64) * 7 % 256
    path = tmp_path / "tokens.txt"
    path.write_text(" ".join(map(str, tokens)))
    per_token = tmp_path / "nll.tsv"
    (expected,) = cli_json(cli, "score", TINY_MODEL, "--tokens", path, "--backend", "cpu", "--window", 16,
                           "--per-token", per_token, "--json")
    result = tiny.score(tokens, window=16, per_token=True)
    assert result.nll_sum == expected["nll_sum"]
    assert result.tokens_scored == expected["tokens_scored"] == 299
    assert result.n_windows == expected["windows"] == 20
    # The CLI writes position, token and NLL with 6 significant digits.
    rows = np.loadtxt(per_token)
    np.testing.assert_array_equal(rows[:, 1], tokens[1:])
    np.testing.assert_allclose(result.token_nll, rows[:, 2], rtol=1e-5)


def test_score_matches_the_c_api(tiny, library_path):
    """tl_score called here directly through ctypes (score.py's way, none of the package's code) gives the same
    bits as Model.score."""
    lib = ctypes.CDLL(str(library_path))
    handle = ctypes.c_void_p()
    assert lib.tl_model_load(str(TINY_MODEL).encode(), None, ctypes.byref(handle)) == 0
    data = DEMO_TEXT.read_bytes()
    tokens = (ctypes.c_int32 * len(data))(*data)

    import tinyloop._capi as capi

    options = capi.tl_score_options()
    assert lib.tl_score_options_init(ctypes.byref(options), ctypes.sizeof(options)) == 0
    options.backend = capi.TL_BACKEND_CPU
    result = capi.tl_score_result()
    assert lib.tl_score_result_init(ctypes.byref(result), ctypes.sizeof(result)) == 0
    lib.tl_score.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p]
    assert lib.tl_score(handle, tokens, len(data), ctypes.byref(options), ctypes.byref(result)) == 0
    lib.tl_model_free.argtypes = [ctypes.c_void_p]
    lib.tl_model_free(handle)

    mine = tiny.score(data)
    assert (mine.nll_sum, mine.tokens_scored, mine.perplexity, mine.n_windows) == (
        result.nll_sum, result.tokens_scored, result.perplexity, result.n_windows)


@pytest.mark.parametrize("convert", [
    lambda b: list(b),
    lambda b: np.frombuffer(b, dtype=np.uint8),
    lambda b: np.frombuffer(b, dtype=np.uint8).astype(np.int64),
    lambda b: np.frombuffer(b, dtype=np.uint8).astype(np.uint16),
    lambda b: np.frombuffer(b, dtype=np.uint8).astype(np.int32)[::-1][::-1],  # a strided view
    lambda b: bytearray(b),
    lambda b: b.decode("utf-8"),
])
def test_any_integer_tokens_or_text_score_alike(tiny, convert):
    data = "naïve café — über 🐍\n".encode("utf-8") * 3
    reference = tiny.score(np.frombuffer(data, dtype=np.uint8).astype(np.int32))
    assert tiny.score(convert(data)).nll_sum == reference.nll_sum


def test_text_is_utf8_bytes(tinyloop):
    np.testing.assert_array_equal(tinyloop.text.encode("é!"), [0xC3, 0xA9, 0x21])
    assert tinyloop.text.encode("é!").dtype == np.int32
    assert tinyloop.text.decode([0xC3, 0xA9, 0x21]).decode("utf-8") == "é!"
    with pytest.raises(TypeError):
        tinyloop.text.encode(42)


def test_token_checks(tiny):
    with pytest.raises(ValueError, match=r"tokens\[2\] = 256 is outside the vocabulary \[0, 256\)"):
        tiny.score([1, 2, 256, 3])
    with pytest.raises(ValueError, match=r"tokens\[0\] = -1 "):
        tiny.score(np.array([-1, 2], dtype=np.int8))
    with pytest.raises(ValueError, match=r"outside the vocabulary"):
        tiny.score([1, 2**40])  # would wrap to a valid id if cast to int32 unchecked
    with pytest.raises(TypeError, match="integers"):
        tiny.score(np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="one-dimensional"):
        tiny.score(np.ones((2, 3), dtype=np.int32))


def test_library_refusals_are_errors(tinyloop, tiny):
    with pytest.raises(tinyloop.Error) as caught:
        tiny.score([5])
    assert caught.value.status == tinyloop.Status.INVALID_ARGUMENT
    assert caught.value.status_name == "TL_ERR_INVALID_ARGUMENT"
    assert caught.value.function == "tl_score"
    with pytest.raises(tinyloop.Error) as caught:
        tiny.score(b"abcdef", window=1)
    assert caught.value.status == tinyloop.Status.INVALID_ARGUMENT and "window" in caught.value.message


def test_progress_and_cancel(tinyloop, tiny):
    data = DEMO_TEXT.read_bytes()[:600]
    calls = []
    tiny.score(data, window=128, progress=lambda done, total: calls.append((done, total)))
    assert calls and calls[-1] == (599, 599)
    assert all(total == 599 for _, total in calls)

    with pytest.raises(tinyloop.Error) as caught:
        tiny.score(data, window=128, progress=lambda done, total: True)
    assert caught.value.status == tinyloop.Status.CANCELLED

    def broken(done, total):
        raise KeyError("from the callback")

    with pytest.raises(KeyError, match="from the callback"):
        tiny.score(data, window=128, progress=broken)


def test_score_batch_matches_cli_and_score(tiny, cli):
    requests = [
        ("The river was", " low that autumn"),
        (b"Hello,", b" world"),
        (np.arange(40) % 256, 10),
        list(DEMO_TEXT.read_bytes()[:128]),
        ([72, 105], [33, 33, 33]),
    ]
    batch = tiny.score_batch(requests, per_token=True)
    assert len(batch) == len(requests)
    lines = "\n".join([
        json.dumps({"text": " low that autumn", "context_text": "The river was"}),
        json.dumps({"text": " world", "context_text": "Hello,"}),
        json.dumps({"tokens": (np.arange(40) % 256).tolist(), "n_context": 10}),
        json.dumps({"tokens": list(DEMO_TEXT.read_bytes()[:128])}),
        json.dumps({"context": [72, 105], "continuation": [33, 33, 33]}),
    ])
    expected = cli_json(cli, "score-batch", TINY_MODEL, "--backend", "cpu", stdin=lines)
    for mine, theirs in zip(batch, expected):
        assert (mine.nll_sum, mine.tokens_scored, mine.greedy) == (
            theirs["nll_sum"], theirs["tokens_scored"], theirs["greedy"])
    assert batch.tokens_scored == sum(s.tokens_scored for s in batch) == 16 + 6 + 30 + 127 + 3
    assert batch.nll_sum == pytest.approx(sum(s.nll_sum for s in batch), rel=1e-12)
    assert batch.backend == "cpu"

    # On the CPU each sequence is one window of the reference forward pass: exactly what score gives alone.
    alone = tiny.score(list(DEMO_TEXT.read_bytes()[:128]), per_token=True)
    assert batch[3].nll_sum == alone.nll_sum
    np.testing.assert_array_equal(batch[3].token_nll, alone.token_nll)
    # Per-token NLLs cover context tokens too; the scored ones add up to the sequence's NLL.
    assert batch[2].token_nll.shape == (39,)
    assert float(batch[2].token_nll[9:].sum(dtype=np.float64)) == pytest.approx(batch[2].nll_sum, rel=1e-6)
    assert batch[0].logprob == -batch[0].nll_sum


def test_score_batch_edges(tinyloop, tiny):
    empty = tiny.score_batch([])
    assert list(empty) == [] and empty.tokens_scored == 0
    with pytest.raises(ValueError, match=r"requests\[1\]: the context is empty"):
        tiny.score_batch([("a", "b"), ("", "xyz")])
    with pytest.raises(ValueError, match=r"requests\[0\] continuation\[1\] = 300"):
        tiny.score_batch([([1, 2], [3, 300])])
    with pytest.raises(ValueError, match="negative"):
        tiny.score_batch([([1, 2, 3], -1)])
    # Longer than max_seq (128): the library refuses, naming the sequence.
    with pytest.raises(tinyloop.Error) as caught:
        tiny.score_batch([[1, 2, 3], list(range(200))])
    assert caught.value.status == tinyloop.Status.INVALID_ARGUMENT
    assert "sequences[1]" in caught.value.message
    # A 2-tuple of token ids is a sequence, not (tokens, n_context).
    assert tiny.score_batch([(7, 8)])[0].tokens_scored == 1


def test_info(tiny, cli):
    info = tiny.info
    (expected,) = cli_json(cli, "info", TINY_MODEL, "--json")
    for key in ("d_model", "n_heads", "head_dim", "ffn", "vocab", "n_pre", "n_loops", "max_seq", "bits", "group_size",
                "parameter_count", "file_bytes", "n_tensors", "tensor_bytes", "quant_weight_bytes"):
        assert info[key] == expected[key], key
    assert info["path"] == str(TINY_MODEL)
    assert (info["norm_eps"], info["rope_theta"]) == (expected["norm_eps"], expected["rope_theta"]) == (1e-05, 10000.0)
    assert tiny.vocab == 256 and tiny.max_seq == 128
    info["vocab"] = 0
    assert tiny.vocab == 256  # a copy


def test_close_and_context_manager(tinyloop):
    with tinyloop.Model(TINY_MODEL) as model:
        assert not model.closed
        assert "max_seq=128" in repr(model)
    assert model.closed and "closed" in repr(model)
    with pytest.raises(ValueError, match="closed"):
        model.score(b"abc")
    model.close()  # idempotent


def test_devices(tinyloop):
    assert tinyloop.device_count() >= 0
    from tinyloop._model import parse_device

    assert parse_device(None) == (0, 0) and parse_device("cpu") == (1, 0)
    assert parse_device("cuda") == (2, 0) and parse_device("cuda:3") == (2, 3) and parse_device(1) == (2, 1)
    with pytest.raises(ValueError):
        parse_device("gpu")
    with pytest.raises(TypeError):
        parse_device(True)
    if tinyloop.device_count() == 0:
        with tinyloop.Model(TINY_MODEL, device="cuda") as model:
            with pytest.raises(tinyloop.Error) as caught:
                model.score(b"abcdef")
            assert caught.value.status == tinyloop.Status.NO_DEVICE
        # auto falls back to the CPU.
        with tinyloop.Model(TINY_MODEL) as model:
            assert model.score(b"abcdef").backend == "cpu"


def test_activations_int8_and_fp8_match_cli_and_stay_close(demo, cli, tmp_path):
    """activations= reaches the library: the same double as the CLI's --activations, different from fp16, close to
    it, and score_batch / top_logprobs take it too."""
    text = EVAL_TEXT.read_bytes()[:1500]
    path = tmp_path / "eval-head.txt"
    path.write_bytes(text)
    fp16 = demo.score(text)
    for mode in ("int8", "fp8"):
        (expected,) = cli_json(cli, "score", DEMO_MODEL, "--text", path, "--backend", "cpu", "--json",
                               "--activations", mode)
        assert expected["activations"] == mode
        result = demo.score(text, activations=mode, per_token=True)
        assert result.nll_sum == expected["nll_sum"]
        assert result.nll_sum != fp16.nll_sum
        assert result.perplexity == pytest.approx(fp16.perplexity, rel=0.03)
        batch = demo.score_batch([text[:400]], activations=mode)
        alone = demo.score(text[:400], activations=mode)
        assert batch[0].nll_sum == pytest.approx(alone.nll_sum, rel=1e-12)
        ids, logprobs = demo.top_logprobs(text[:300], 3, activations=mode)
        assert ids.shape == (299, 3) and np.all(np.diff(logprobs, axis=1) <= 0)


def test_activations_refuse_unknown_names(tiny):
    for bad in ("int4", "INT8", 1, None):
        with pytest.raises(ValueError, match="activations must be one of 'fp16', 'int8', 'fp8'"):
            tiny.score(b"hello world", activations=bad)
    with pytest.raises(ValueError, match="reference_activations"):
        tiny.compare(tiny, b"hello world", reference_activations="bf16")
