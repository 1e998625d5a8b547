"""tinyloop.lm_eval against a small fake of lm-eval's model interface, injected into sys.modules.

The fake follows lm-eval's documented API (lm_eval/api/model.py, docs/model_guide.md): an abstract
lm_eval.api.model.LM with loglikelihood, loglikelihood_rolling and generate_until, whose __init__ sets rank,
world_size and a cache_hook with add_partial(attr, args, result); create_from_arg_string("k=v,..."); requests are
lm_eval.api.instance.Instance objects whose .args is the tuple of strings; lm_eval.api.registry.register_model(name)
is a class decorator."""

import abc
import importlib
import sys
import types

import numpy as np
import pytest

from conftest import TINY_MODEL


class FakeCacheHook:
    def __init__(self):
        self.calls = []

    def add_partial(self, attr, req, res):
        self.calls.append((attr, req, res))


class FakeLM(abc.ABC):
    def __init__(self):
        self._rank = 0
        self._world_size = 1
        self.cache_hook = FakeCacheHook()

    @abc.abstractmethod
    def loglikelihood(self, requests):
        pass

    @abc.abstractmethod
    def loglikelihood_rolling(self, requests):
        pass

    @abc.abstractmethod
    def generate_until(self, requests):
        pass

    @classmethod
    def create_from_arg_string(cls, arg_string, additional_config=None):
        args = dict(item.split("=", 1) for item in arg_string.split(",") if item)
        args.update({k: v for k, v in (additional_config or {}).items() if v is not None})
        return cls(**args)


class Instance:
    def __init__(self, request_type, arguments, idx=0):
        self.request_type = request_type
        self.arguments = arguments
        self.idx = idx

    @property
    def args(self):
        return self.arguments


@pytest.fixture
def lm_eval_module(monkeypatch, library_path):
    registry = {}

    def register_model(*names):
        def decorate(cls):
            for name in names:
                registry[name] = cls
            return cls
        return decorate

    package = types.ModuleType("lm_eval")
    api = types.ModuleType("lm_eval.api")
    model = types.ModuleType("lm_eval.api.model")
    model.LM = FakeLM
    instance = types.ModuleType("lm_eval.api.instance")
    instance.Instance = Instance
    registry_module = types.ModuleType("lm_eval.api.registry")
    registry_module.register_model = register_model
    package.api, api.model, api.instance, api.registry = api, model, instance, registry_module
    for name, module in [("lm_eval", package), ("lm_eval.api", api), ("lm_eval.api.model", model),
                         ("lm_eval.api.instance", instance), ("lm_eval.api.registry", registry_module)]:
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.delitem(sys.modules, "tinyloop.lm_eval", raising=False)
    module = importlib.import_module("tinyloop.lm_eval")
    module.registry = registry
    yield module
    sys.modules.pop("tinyloop.lm_eval", None)


def requests(kind, *args_list):
    return [Instance(kind, args, i) for i, args in enumerate(args_list)]


def test_is_an_lm_and_registered(lm_eval_module):
    assert issubclass(lm_eval_module.TinyLoopLM, FakeLM)
    assert lm_eval_module.registry["tinyloop"] is lm_eval_module.TinyLoopLM
    lm = lm_eval_module.TinyLoopLM.create_from_arg_string(f"path={TINY_MODEL},device=cpu,bos_token_id=10",
                                                          {"batch_size": 8, "device": None})
    assert lm.bos_token_id == 10 and lm.max_length == 128
    with pytest.raises(TypeError):  # a misspelt argument is not ignored
        lm_eval_module.TinyLoopLM.create_from_arg_string(f"path={TINY_MODEL},bos_token=10")
    with pytest.raises(NotImplementedError):
        lm.generate_until(requests("generate_until", ("Hello", {"until": ["\n"]})))


def test_loglikelihood(lm_eval_module, tiny):
    lm = lm_eval_module.TinyLoopLM(TINY_MODEL, device="cpu")
    asked = requests("loglikelihood", ("The river was", " low"), ("Hello,", " world"), ("abc", ""),
                     ("naïve", " café"))
    answers = lm.loglikelihood(asked)
    assert len(answers) == 4
    for (context, continuation), (logprob, greedy) in zip([r.args for r in asked], answers):
        assert isinstance(logprob, float) and isinstance(greedy, bool)
        if not continuation:
            assert (logprob, greedy) == (0.0, True)
            continue
        c, x = context.encode(), continuation.encode()
        (score,) = tiny.score_batch([(list(c + x), len(c))])
        assert logprob == -score.nll_sum and greedy == score.greedy
        # Independently: the per-token NLLs of the whole text over the continuation's positions.
        whole = tiny.score(c + x, per_token=True)
        assert -float(whole.token_nll[len(c) - 1:].sum(dtype=np.float64)) == pytest.approx(logprob, rel=1e-5)
    assert [call[0] for call in lm.cache_hook.calls] == ["loglikelihood"] * 4
    assert lm.cache_hook.calls[1][1:] == (("Hello,", " world"), answers[1])


def test_empty_context_needs_a_bos_token(lm_eval_module, tiny):
    lm = lm_eval_module.TinyLoopLM(TINY_MODEL, device="cpu")
    with pytest.raises(ValueError, match=r"request 1 has an empty context.*bos_token_id"):
        lm.loglikelihood(requests("loglikelihood", ("a", "b"), ("", "xyz")))
    lm = lm_eval_module.TinyLoopLM(TINY_MODEL, device="cpu", bos_token_id=10)
    ((logprob, _),) = lm.loglikelihood(requests("loglikelihood", ("", "xyz")))
    (score,) = tiny.score_batch([([10], list(b"xyz"))])
    assert logprob == -score.nll_sum
    with pytest.raises(ValueError, match="outside the vocabulary"):
        lm_eval_module.TinyLoopLM(TINY_MODEL, bos_token_id=256)


def test_long_requests_keep_the_end_of_the_context(lm_eval_module, tiny):
    lm = lm_eval_module.TinyLoopLM(TINY_MODEL, device="cpu")
    context, continuation = "x" * 50 + "y" * 200, " the end"
    ((logprob, _),) = lm.loglikelihood(requests("loglikelihood", (context, continuation)))
    kept = context.encode()[-(128 - len(continuation)):]
    (score,) = tiny.score_batch([(list(kept), list(continuation.encode()))])
    assert logprob == -score.nll_sum
    with pytest.raises(ValueError, match="must fit the model's max_seq 128"):
        lm.loglikelihood(requests("loglikelihood", ("a", "b" * 128)))


def test_rolling_windows_follow_lm_eval(lm_eval_module):
    windows = lm_eval_module.rolling_windows
    # lm-eval's documented example: tokens 0..9 after a BOS, 4 predictions per window (max_seq 5 here: a sequence
    # of n tokens predicts n - 1): [BOS 0 1 2 | 3], [3 4 5 6 | 7], and the last one reaching back for context.
    assert windows(11, 5) == [(0, 5, 1), (4, 9, 1), (6, 11, 3)]
    assert windows(1, 5) == [] and windows(2, 5) == [(0, 2, 1)] and windows(5, 5) == [(0, 5, 1)]
    for n in range(1, 40):
        for max_seq in (2, 3, 7, 16):
            predicted = []
            for start, end, n_context in windows(n, max_seq):
                assert 1 <= n_context < end - start <= max_seq
                predicted.extend(range(start + n_context, end))
            assert predicted == list(range(1, n))  # every token after the BOS once, in order


def test_loglikelihood_rolling(lm_eval_module, tiny):
    with pytest.raises(ValueError, match="bos_token_id"):
        lm_eval_module.TinyLoopLM(TINY_MODEL, device="cpu").loglikelihood_rolling(requests("rolling", ("text",)))
    lm = lm_eval_module.TinyLoopLM(TINY_MODEL, device="cpu", bos_token_id=10)
    short = "A short document."
    long = (TINY_MODEL.parent.parent.parent / "data" / "demo.txt").read_text()[:400]
    answers = lm.loglikelihood_rolling(requests("loglikelihood_rolling", (short,), (long,), ("",)))
    assert all(isinstance(a, float) for a in answers)
    # Shorter than max_seq: one sequence, BOS + text, as tl_score scores it.
    assert answers[0] == -tiny.score([10] + list(short.encode())).nll_sum
    assert answers[2] == 0.0
    # Longer: every byte scored once, in lm-eval's windows.
    tokens = [10] + list(long.encode())
    parts = [(tokens[s:e], k) for s, e, k in lm_eval_module.rolling_windows(len(tokens), 128)]
    assert len(parts) == 4
    scores = tiny.score_batch(parts)
    assert scores.tokens_scored == len(long.encode())
    assert answers[1] == pytest.approx(-scores.nll_sum, rel=1e-12)
    assert [c[0] for c in lm.cache_hook.calls] == ["loglikelihood_rolling"] * 3
