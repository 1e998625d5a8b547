"""Model.compare, Model.top_logprobs and the model file's BOS token: against the package's own scoring and the CLI,
on the CPU backend."""

import math
import subprocess

import numpy as np
import pytest

from conftest import TINY_MODEL


def test_compare_with_itself_has_no_divergence(tiny):
    tokens = np.arange(1, 200, dtype=np.int32) % 256
    result = tiny.compare(tiny, tokens, window=50, per_token=True)
    assert result.tokens_scored == tokens.size - 1 and result.n_windows == 5 and result.backend == "cpu"
    assert result.kl_mean == 0 and result.kl_max == 0 and result.top1_agreement == 1
    assert result.perplexity_ratio == 1 and result.delta_perplexity == 0
    assert np.all(result.token_kl == 0) and np.all(result.token_top1_match == 1)
    scored = tiny.score(tokens, window=50, per_token=True)
    np.testing.assert_allclose(result.token_nll_reference, scored.token_nll, rtol=1e-5, atol=1e-5)
    assert math.isclose(result.perplexity_reference, scored.perplexity, rel_tol=1e-6)


def test_compare_two_models_matches_the_cli(tinyloop, tiny, cli, tmp_path):
    other_path = tmp_path / "other.tinyloop"
    subprocess.run([str(cli), "make-model", "--preset", "tiny", "--seed", "9", "--out", str(other_path)], check=True,
                   capture_output=True)
    text = b"The quick brown fox jumps over the lazy dog. " * 8
    with tinyloop.Model(other_path, device="cpu") as other:
        result = tiny.compare(other, text, per_token=True)
    assert result.kl_mean > 0 and 0 <= result.top1_agreement <= 1
    assert result.kl_min <= result.kl_median <= result.kl_p90 <= result.kl_p99 <= result.kl_p999 <= result.kl_max
    # The summary is the per-position values': mean, exact percentiles (numpy's linear interpolation), correlation.
    kl = result.token_kl.astype(np.float64)
    assert math.isclose(result.kl_mean, kl.mean(), rel_tol=1e-9)
    assert math.isclose(result.kl_stderr, kl.std(ddof=1) / math.sqrt(kl.size), rel_tol=1e-6)
    assert math.isclose(result.kl_p99, float(np.percentile(kl, 99)), rel_tol=1e-6)
    assert math.isclose(result.kl_median, float(np.median(kl)), rel_tol=1e-6)
    assert math.isclose(result.nll_correlation,
                        float(np.corrcoef(result.token_nll_reference, result.token_nll_test)[0, 1]), rel_tol=1e-5)
    assert math.isclose(result.top1_agreement, float(result.token_top1_match.mean()), rel_tol=1e-12)
    text_path = tmp_path / "text.txt"
    text_path.write_bytes(text)
    out = subprocess.run([str(cli), "compare", str(TINY_MODEL), str(other_path), "--text", str(text_path),
                          "--backend", "cpu", "--json", "-q"], check=True, capture_output=True, text=True).stdout
    import json

    j = json.loads(out)
    assert math.isclose(j["kl_mean"], result.kl_mean, rel_tol=1e-9)
    assert math.isclose(j["perplexity_test"], result.perplexity_test, rel_tol=1e-9)


def test_compare_refuses_another_vocabulary(tinyloop, tiny, cli, tmp_path):
    wide_path = tmp_path / "wide.tinyloop"
    subprocess.run([str(cli), "make-model", "--preset", "tiny", "--vocab", "300", "--out", str(wide_path)], check=True,
                   capture_output=True)
    with tinyloop.Model(wide_path, device="cpu") as wide:
        with pytest.raises(tinyloop.Error, match="256 tokens and the test's 300"):
            tiny.compare(wide, [1, 2, 3])


def test_top_logprobs_are_sorted_and_agree_with_the_nll(tiny):
    tokens = np.array([72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100] * 4, dtype=np.int32)
    ids, logprobs = tiny.top_logprobs(tokens, 5)
    assert ids.shape == (tokens.size - 1, 5) and ids.dtype == np.int32 and logprobs.dtype == np.float32
    assert np.all(np.diff(logprobs, axis=1) <= 0) and np.all(logprobs <= 0)
    assert np.all((ids >= 0) & (ids < tiny.vocab))
    nll = tiny.score(tokens, per_token=True).token_nll
    for i in range(tokens.size - 1):
        hit = np.flatnonzero(ids[i] == tokens[i + 1])
        if hit.size:
            assert math.isclose(-logprobs[i, hit[0]], nll[i], rel_tol=1e-4, abs_tol=1e-5)
    with pytest.raises(ValueError, match=r"k must be in \[1, 20\]"):
        tiny.top_logprobs(tokens, 21)


def test_bos_token_id_in_info(tiny):
    assert tiny.info["bos_token_id"] == -1 and tiny.bos_token_id == -1


def test_attention_and_rope_in_info(tiny):
    assert tiny.info["n_kv_heads"] == tiny.info["n_heads"]
    assert tiny.info["rope_scaling"] == "none"
    assert tiny.info["rope_scaling_factor"] == 1.0 and tiny.info["rope_original_max_positions"] == 0


def test_compare_measures_quantized_activations(tiny):
    """A model against itself with INT8 (or FP8) activations on one side: a small positive divergence, and the
    quantized side's perplexity is score's at that precision."""
    text = bytes(range(32, 127)) * 4
    for mode in ("int8", "fp8"):
        result = tiny.compare(tiny, text, activations=mode)
        assert 0 < result.kl_mean < 0.05
        assert result.perplexity_test == pytest.approx(tiny.score(text, activations=mode).perplexity, rel=1e-6)
        assert result.perplexity_reference == pytest.approx(tiny.score(text).perplexity, rel=1e-6)
        swapped = tiny.compare(tiny, text, reference_activations=mode)
        assert swapped.perplexity_reference == pytest.approx(result.perplexity_test, rel=1e-12)
