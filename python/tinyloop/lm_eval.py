"""An lm-evaluation-harness model backed by tinyloop.Model (importing this module imports lm_eval).

    import lm_eval
    from tinyloop.lm_eval import TinyLoopLM
    lm = TinyLoopLM("models/demo-int4.tinyloop", device="cpu", bos_token_id=10)
    lm_eval.simple_evaluate(model=lm, tasks=["wikitext"])

Once this module is imported the class is also registered with lm-eval as "tinyloop" (model="tinyloop",
model_args="path=...,bos_token_id=10").

Text becomes tokens through the model's tokenizer (Model.tokenize: a stored tokenizer.json or tokenizer.model, else
one token per UTF-8 byte), a request's context and continuation each on its own, with no BOS token added. A byte-level
model has no BOS token, and a token with nothing before it cannot be scored: a request with an empty context
(loglikelihood), or the first token of a text (loglikelihood_rolling), needs a token to condition on. The model
file's bos_token_id (Model.bos_token_id: what `tinyloop import` kept from the checkpoint's config.json) is that token
by default; pass bos_token_id (any id of the model's vocabulary; for the byte-level demo model, 10, a newline, starts
a line as a new document does) to use another or where the file names none. It is put before an empty context and
before every rolling text; with neither, such requests raise ValueError.
"""

try:
    from lm_eval.api.model import LM
except ImportError as error:
    raise ImportError("tinyloop.lm_eval needs lm-evaluation-harness (the lm_eval package), which is not "
                      f"importable here: {error}") from error

from ._model import Model

try:
    from lm_eval.api.registry import register_model
except ImportError:  # an lm-eval without a registry: the class still works when passed as an object
    def register_model(*_names):
        return lambda cls: cls


def rolling_windows(n_tokens, max_seq):
    """lm-eval's rolling windows over a sequence of n_tokens (its first token the BOS) for a model that takes at
    most max_seq tokens: (start, end, n_context) triples such that sequence[start:end] with its first n_context
    tokens as context scores every token from 1 on exactly once. Each window but the last predicts max_seq - 1 new
    tokens after one token of context; the last one reaches back as far as max_seq allows, so that its tokens get
    the most context (lm-eval's LM.loglikelihood_rolling contract)."""
    if max_seq < 2:
        raise ValueError(f"max_seq {max_seq} is below 2")
    windows = []
    first = 1  # the first token of the next window still to be predicted
    while first < n_tokens:
        end = min(first + max_seq - 1, n_tokens)
        start = max(0, end - max_seq)
        windows.append((start, end, first - start))
        first = end
    return windows


@register_model("tinyloop")
class TinyLoopLM(LM):
    """lm_eval.api.model.LM over a .tinyloop model: loglikelihood and loglikelihood_rolling in tl_score_batch calls.

    path: the .tinyloop file. device, threads, max_memory_bytes: as for tinyloop.Model. bos_token_id: the token put
    before an empty context and before each rolling text (see the module's text). batch_size, max_batch_size: taken
    for lm-eval's sake and not used (all requests of a call go to the library at once, which packs them into
    forward passes itself)."""

    def __init__(self, path, device=None, bos_token_id=None, threads=0, max_memory_bytes=0, batch_size=None,
                 max_batch_size=None):
        super().__init__()
        if isinstance(device, str) and device.isdigit():
            device = int(device)
        self.model = Model(path, device=device, threads=int(threads), max_memory_bytes=int(max_memory_bytes))
        if bos_token_id is None and self.model.bos_token_id >= 0:
            bos_token_id = self.model.bos_token_id  # the model file's own (tinyloop import keeps config.json's)
        if bos_token_id is not None:
            bos_token_id = int(bos_token_id)
            if not 0 <= bos_token_id < self.model.vocab:
                raise ValueError(f"bos_token_id {bos_token_id} is outside the vocabulary [0, {self.model.vocab})")
        self.bos_token_id = bos_token_id

    @property
    def max_length(self):
        return self.model.max_seq

    def tok_encode(self, string):
        return self.model.tokenize(string).tolist()

    def _no_bos(self, what):
        return ValueError(
            f"{what}: the model has nothing to predict the first token from (its tokens are bytes, with no BOS "
            "token); pass bos_token_id=<a token id> to TinyLoopLM to condition on that token")

    def loglikelihood(self, requests, disable_tqdm=False):
        """[(log p(continuation | context), greedy)] for requests whose .args are (context, continuation) strings.
        A request longer than max_seq keeps the end of its context (as lm-eval's own models do); a continuation
        must leave room for at least one context token."""
        batch, empty = [], set()
        for i, request in enumerate(requests):
            context, continuation = request.args
            context_tokens = self.model.tokenize(context).tolist()
            continuation_tokens = self.model.tokenize(continuation).tolist()
            if not continuation_tokens:
                empty.add(i)  # nothing to score: probability 1, and greedy decoding produces it
                continue
            if not context_tokens:
                if self.bos_token_id is None:
                    raise self._no_bos(f"loglikelihood request {i} has an empty context")
                context_tokens = [self.bos_token_id]
            if len(continuation_tokens) >= self.max_length:
                raise ValueError(f"loglikelihood request {i}: the continuation has {len(continuation_tokens)} tokens; "
                                 f"with a token of context it must fit the model's max_seq {self.max_length}")
            context_tokens = context_tokens[-(self.max_length - len(continuation_tokens)):]
            batch.append((context_tokens + continuation_tokens, len(context_tokens)))
        scores = iter(self.model.score_batch(batch))
        results = []
        for i, request in enumerate(requests):
            if i in empty:
                answer = (0.0, True)
            else:
                score = next(scores)
                answer = (-score.nll_sum, score.greedy)
            self.cache_hook.add_partial("loglikelihood", request.args, answer)
            results.append(answer)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        """[log p(text)] for requests whose .args are (text,): every token of the text is scored, the first given
        bos_token_id, in lm-eval's rolling windows of the model's max_seq (rolling_windows)."""
        batch, owners = [], []
        for i, request in enumerate(requests):
            (string,) = request.args
            if self.bos_token_id is None:
                raise self._no_bos(f"loglikelihood_rolling request {i}")
            tokens = [self.bos_token_id] + self.model.tokenize(string).tolist()
            for start, end, n_context in rolling_windows(len(tokens), self.max_length):
                batch.append((tokens[start:end], n_context))
                owners.append(i)
        totals = [0.0] * len(requests)
        for owner, score in zip(owners, self.model.score_batch(batch)):
            totals[owner] -= score.nll_sum
        for request, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    def generate_until(self, requests, disable_tqdm=False):
        raise NotImplementedError("tinyloop scores text but does not generate it: generate_until is not implemented")
