"""Model.tokenizer, tokenize and detokenize, and text scored through the model's tokenizer: byte-level on the committed
fixture, and the tokenizers tests/text/make_tokenizer_cases.py writes (run with Debian's interpreter, which has the
regex and sentencepiece modules it needs), imported into models with `tinyloop import`, against the script's
independent reference ids; scores equal the CLI's for the same text."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, TINY_MODEL

GENERATOR = REPO / "tests" / "text" / "make_tokenizer_cases.py"
NAMES = ["gpt2", "gpt2_prefix", "llama3", "qwen2", "sentencepiece"]


def _generator_python():
    for candidate in (os.environ.get("TL_PYTHON"), sys.executable, "/usr/bin/python3"):
        if candidate and subprocess.run([candidate, "-c", "import regex, sentencepiece"],
                                        capture_output=True).returncode == 0:
            return candidate
    pytest.fail("no Python with the regex and sentencepiece modules (Debian: python3-regex, python3-sentencepiece)")


@pytest.fixture(scope="session")
def cases_dir(tmp_path_factory, cli):
    out = tmp_path_factory.mktemp("tokenizer-cases")
    subprocess.run([_generator_python(), str(GENERATOR), str(out)], check=True, timeout=120)
    (out / "models").mkdir()
    for name in NAMES + ["none"]:
        model = out / "models" / f"{name}.tinyloop"
        subprocess.run([str(cli), "import", str(out / f"ckpt_{name}"), "--out", str(model)], check=True,
                       capture_output=True, timeout=60)
    return out


@pytest.fixture(scope="session")
def cases(cases_dir):
    return json.loads((cases_dir / "cases.json").read_text(encoding="utf-8"))


def open_model(tinyloop, cases_dir, name):
    return tinyloop.Model(cases_dir / "models" / f"{name}.tinyloop", device="cpu")


def test_a_model_without_a_tokenizer_reads_bytes(tiny):
    assert (tiny.tokenizer, tiny.tokenizer_ids) == ("bytes", 256)
    ids = tiny.tokenize("Hé")
    assert ids.dtype == np.int32 and ids.tolist() == [72, 195, 169]
    assert tiny.tokenize(b"\xff\x00").tolist() == [255, 0]
    assert tiny.tokenize("").tolist() == []
    assert tiny.detokenize([72, 195, 169]) == "Hé".encode()
    # score(text) is what it was: one token per byte.
    assert tiny.score("Hello, world").nll_sum == tiny.score(list(b"Hello, world")).nll_sum


@pytest.mark.parametrize("name", NAMES)
def test_reference_ids(tinyloop, cases_dir, cases, name):
    with open_model(tinyloop, cases_dir, name) as model:
        assert model.tokenizer == ("sentencepiece" if name == "sentencepiece" else "huggingface")
        assert model.tokenizer_ids == cases[name]["n_ids"] <= model.vocab
        for case in cases[name]["cases"]:
            ids = model.tokenize(case["text"])
            assert ids.tolist() == case["ids"], case["name"]
            assert model.tokenize(case["text"].encode()).tolist() == case["ids"], case["name"]
            assert model.detokenize(case["ids"]) == case["decoded"].encode(), case["name"]


def test_refusals(tinyloop, cases_dir):
    with open_model(tinyloop, cases_dir, "llama3") as model:
        with pytest.raises(tinyloop.Error) as error:
            model.tokenize(b"caf\xe9")
        assert error.value.status == tinyloop.Status.INVALID_ARGUMENT
        assert "not valid UTF-8: byte 3" in str(error.value)
        with pytest.raises(tinyloop.Error, match=r"ids\[1\]"):
            model.detokenize([1, model.tokenizer_ids])
        with pytest.raises(TypeError):
            model.tokenize(12)


def test_score_text_goes_through_the_tokenizer(tinyloop, cases_dir, cli, tmp_path):
    text = "The quick brown fox jumps over the lazy dog. Tokenizers split text into pieces."
    path = tmp_path / "text.txt"
    path.write_text(text, encoding="utf-8")
    for name in ("qwen2", "sentencepiece"):
        model_path = cases_dir / "models" / f"{name}.tinyloop"
        with open_model(tinyloop, cases_dir, name) as model:
            ids = model.tokenize(text)
            result = model.score(text)
            assert result.tokens_scored == ids.size - 1
            assert result.nll_sum == model.score(ids).nll_sum
            done = subprocess.run([str(cli), "score", str(model_path), "--text", str(path), "--backend", "cpu",
                                   "--json", "-q"], capture_output=True, text=True, check=True, timeout=60)
            expected = json.loads(done.stdout)
            assert expected["tokens"] == ids.size and expected["tokenizer"] == model.tokenizer
            assert result.nll_sum == expected["nll_sum"]
            # (context, continuation) texts: each tokenized on its own, as score-batch's text requests are.
            (batch,) = model.score_batch([("The quick brown fox", " jumps over the lazy dog.")])
            continuation = model.tokenize(" jumps over the lazy dog.")
            assert batch.tokens_scored == continuation.size
            request = json.dumps({"context_text": "The quick brown fox", "text": " jumps over the lazy dog."})
            done = subprocess.run([str(cli), "score-batch", str(model_path), "--backend", "cpu", "-q"], input=request,
                                  capture_output=True, text=True, check=True, timeout=60)
            assert json.loads(done.stdout)["nll_sum"] == batch.nll_sum


def test_threads_share_one_model(tinyloop, cases_dir, cases):
    from concurrent.futures import ThreadPoolExecutor

    with open_model(tinyloop, cases_dir, "llama3") as model:
        work = [(c["text"], c["ids"]) for c in cases["llama3"]["cases"]] * 10
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda item: model.tokenize(item[0]).tolist() == item[1], work))
        assert all(results)
