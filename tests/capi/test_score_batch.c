/* Scoring many sequences in one call: tl_score_batch. */
#include <math.h>
#include <stdlib.h>

#include "capi_test.h"

static tl_model *model;

static void setup(void) { model = seed_and_load_fixture(); }

static void teardown(void) { tl_model_free(model); }

TestSuite(score_batch, .init = setup, .fini = teardown, .timeout = 120);

static tl_sequence sequence(const int32_t *tokens, size_t n_tokens, size_t n_context) {
    tl_sequence s;
    s.tokens = tokens;
    s.n_tokens = n_tokens;
    s.n_context = n_context;
    return s;
}

/* Sequence scores that a call must not touch on failure. */
static void fill_sentinels(tl_sequence_score *scores, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        scores[i].nll_sum = -7;
        scores[i].tokens_scored = 77;
        scores[i].greedy = 7;
    }
}

static void assert_sentinels(const tl_sequence_score *scores, size_t n, const char *what) {
    for (size_t i = 0; i < n; ++i) {
        cr_assert(scores[i].nll_sum == -7 && scores[i].tokens_scored == 77 && scores[i].greedy == 7,
                  "%s: out_scores[%zu] was written on failure", what, i);
    }
}

enum { N_SEQS = 6, SPARE = 4 };
/* Lengths and contexts: the shortest sequence, no context, one context token (the same as none), a long context,
 * the model's max_seq, a context of all tokens but one. */
static const size_t kLengths[N_SEQS] = {2, 7, 33, 40, FIXTURE_MAX_SEQ, 19};
static const size_t kContexts[N_SEQS] = {0, 1, 0, 25, 3, 18};

Test(score_batch, each_sequence_scores_as_tl_score_alone) {
    int32_t *tokens[N_SEQS];
    tl_sequence sequences[N_SEQS];
    size_t predicted = 0;
    for (size_t i = 0; i < N_SEQS; ++i) {
        tokens[i] = malloc(kLengths[i] * sizeof(int32_t));
        cr_assert_not_null(tokens[i]);
        random_tokens(tokens[i], kLengths[i], FIXTURE_VOCAB);
        sequences[i] = sequence(tokens[i], kLengths[i], kContexts[i]);
        predicted += kLengths[i] - 1;
    }
    float *batch_nll = malloc((predicted + SPARE) * sizeof(float));
    cr_assert_not_null(batch_nll);
    for (size_t i = 0; i < predicted + SPARE; ++i) batch_nll[i] = -1.0f;
    tl_score_options options = cpu_options(batch_nll, predicted + SPARE);
    tl_sequence_score scores[N_SEQS];
    tl_score_result result = fresh_result();
    ASSERT_OK(tl_score_batch(model, sequences, N_SEQS, &options, scores, &result));

    double nll_total = 0;
    uint64_t scored_total = 0;
    size_t offset = 0;
    for (size_t i = 0; i < N_SEQS; ++i) {
        const size_t n = kLengths[i], first = kContexts[i] > 0 ? kContexts[i] : 1;
        float alone_nll[FIXTURE_MAX_SEQ - 1];
        tl_score_options alone_options = cpu_options(alone_nll, n - 1);
        tl_score_result alone = fresh_result();
        ASSERT_OK(tl_score(model, tokens[i], n, &alone_options, &alone));

        /* token_nll: every prediction, context ones included, at the sequence's offset, as tl_score gives them. */
        for (size_t j = 0; j + 1 < n; ++j) {
            cr_assert_eq(batch_nll[offset + j], alone_nll[j], "sequence %zu token %zu: %.9g in the batch, %.9g alone",
                         i, j + 1, batch_nll[offset + j], alone_nll[j]);
        }
        /* nll_sum and tokens_scored: the tokens after the context only. */
        cr_assert_eq(scores[i].tokens_scored, n - first, "sequence %zu: tokens_scored %llu", i,
                     (unsigned long long)scores[i].tokens_scored);
        if (first == 1) {
            assert_close(scores[i].nll_sum, alone.nll_sum, 1e-9, "nll_sum in the batch vs tl_score alone");
        } else {
            double scored = 0, context = 0;
            for (size_t j = 0; j + 1 < n; ++j) {
                if (j + 1 >= first) {
                    scored += alone_nll[j];
                } else {
                    context += alone_nll[j];
                }
            }
            assert_close(scores[i].nll_sum, scored, 1e-6, "nll_sum vs the scored tokens' NLLs");
            assert_close(scores[i].nll_sum + context, alone.nll_sum, 1e-6, "nll_sum + context vs tl_score alone");
            cr_assert_gt(context, 0.0);
        }
        cr_assert(scores[i].greedy == 0 || scores[i].greedy == 1, "greedy is %d", scores[i].greedy);
        nll_total += scores[i].nll_sum;
        scored_total += scores[i].tokens_scored;
        offset += n - 1;
    }
    for (size_t i = predicted; i < predicted + SPARE; ++i) {
        cr_assert_eq(batch_nll[i], -1.0f, "token_nll[%zu] written past the sum of n_tokens - 1", i);
    }
    cr_assert_eq(result.tokens_scored, scored_total);
    assert_close(result.nll_sum, nll_total, 1e-12, "the result's nll_sum vs the sequences'");
    assert_close(result.perplexity, exp(nll_total / (double)scored_total), 1e-9, "perplexity vs exp(nll/n)");
    cr_assert_eq(result.backend, TL_BACKEND_CPU);
    cr_assert_eq(result.n_windows, N_SEQS);
    cr_assert(result.seconds >= 0 && isfinite(result.seconds));
    for (size_t i = 0; i < N_SEQS; ++i) free(tokens[i]);
    free(batch_nll);
}

/* ---- greedy ---- */

enum { PREFIX = 9, STEPS = 3 };

/* Scores tokens[0, n) followed by each token of the vocabulary as a batch with n tokens of context, into
 * nll[v] and greedy[v]; returns the continuation with the lowest NLL (the first of a tie). */
static int32_t score_every_continuation(const int32_t *tokens, size_t n, double *nll, int32_t *greedy) {
    static int32_t rows[FIXTURE_VOCAB][FIXTURE_MAX_SEQ];
    tl_sequence sequences[FIXTURE_VOCAB];
    for (int32_t v = 0; v < FIXTURE_VOCAB; ++v) {
        memcpy(rows[v], tokens, n * sizeof(int32_t));
        rows[v][n] = v;
        sequences[v] = sequence(rows[v], n + 1, n);
    }
    tl_sequence_score scores[FIXTURE_VOCAB];
    tl_score_options options = cpu_options(NULL, 0);
    ASSERT_OK(tl_score_batch(model, sequences, FIXTURE_VOCAB, &options, scores, NULL));
    int32_t best = 0;
    for (int32_t v = 0; v < FIXTURE_VOCAB; ++v) {
        cr_assert_eq(scores[v].tokens_scored, 1);
        nll[v] = scores[v].nll_sum;
        greedy[v] = scores[v].greedy;
        if (nll[v] < nll[best]) best = v;
    }
    return best;
}

/* One scored token: greedy exactly where its NLL is the lowest over every continuation, i.e. where its logit is the
 * largest (each alternative's NLL is the same log-sum-exp minus its own logit, so equal logits give equal NLLs). */
Test(score_batch, greedy_is_the_lowest_nll_continuation) {
    int32_t prefix[PREFIX];
    random_tokens(prefix, PREFIX, FIXTURE_VOCAB);
    double nll[FIXTURE_VOCAB];
    int32_t greedy[FIXTURE_VOCAB];
    const int32_t best = score_every_continuation(prefix, PREFIX, nll, greedy);
    int n_greedy = 0;
    for (int32_t v = 0; v < FIXTURE_VOCAB; ++v) {
        cr_assert_eq(greedy[v], nll[v] == nll[best], "token %d: greedy %d, NLL %.17g, lowest %.17g", v, greedy[v],
                     nll[v], nll[best]);
        n_greedy += greedy[v];
    }
    cr_assert_geq(n_greedy, 1);
}

/* The continuation with the highest NLL: never greedy unless every continuation ties. */
static int32_t worst_continuation(const double *nll, const int32_t *greedy) {
    int32_t worst = 0;
    for (int32_t v = 0; v < FIXTURE_VOCAB; ++v)
        if (nll[v] > nll[worst]) worst = v;
    cr_assert_eq(greedy[worst], 0, "every continuation ties");
    return worst;
}

/* Several scored tokens: greedy only when each is the argmax; the context is not judged. */
Test(score_batch, greedy_needs_every_scored_token_and_ignores_the_context) {
    int32_t tokens[PREFIX + STEPS];
    random_tokens(tokens, PREFIX, FIXTURE_VOCAB);
    double nll[FIXTURE_VOCAB];
    int32_t greedy[FIXTURE_VOCAB];
    /* A context that is not greedy: its second token the worst continuation of its first. */
    score_every_continuation(tokens, 1, nll, greedy);
    tokens[1] = worst_continuation(nll, greedy);
    /* A continuation that is: greedy decoding, one token at a time. */
    for (size_t step = 0; step < STEPS; ++step) {
        tokens[PREFIX + step] = score_every_continuation(tokens, PREFIX + step, nll, greedy);
    }
    /* The same continuation with its middle token the worst one instead. */
    int32_t spoiled[PREFIX + STEPS];
    memcpy(spoiled, tokens, sizeof tokens);
    score_every_continuation(tokens, PREFIX + 1, nll, greedy);
    spoiled[PREFIX + 1] = worst_continuation(nll, greedy);

    const tl_sequence sequences[] = {
        sequence(tokens, PREFIX + STEPS, PREFIX),   /* the greedy continuation: greedy */
        sequence(tokens, PREFIX + STEPS, 0),        /* the whole sequence, its context included: not */
        sequence(spoiled, PREFIX + STEPS, PREFIX),  /* one scored token not the argmax: not */
        sequence(tokens, PREFIX + 1, PREFIX),       /* its first token alone: greedy */
    };
    const int32_t expected[] = {1, 0, 0, 1};
    tl_sequence_score scores[4];
    tl_score_options options = cpu_options(NULL, 0);
    ASSERT_OK(tl_score_batch(model, sequences, 4, &options, scores, NULL));
    for (size_t i = 0; i < 4; ++i) cr_assert_eq(scores[i].greedy, expected[i], "sequence %zu", i);
}

/* ---- empty, optional and default arguments ---- */

Test(score_batch, an_empty_batch_succeeds_and_runs_nothing) {
    struct progress_log log = {0};
    tl_score_options options = cpu_options(NULL, 0);
    options.progress = record_progress;
    options.progress_user_data = &log;
    tl_score_result result = fresh_result();
    result.nll_sum = -7;
    ASSERT_OK(tl_score_batch(model, NULL, 0, &options, NULL, &result));
    cr_assert_eq(result.nll_sum, 0);
    cr_assert_eq(result.tokens_scored, 0);
    cr_assert_eq(result.perplexity, 0);
    cr_assert_eq(result.n_windows, 0);
    cr_assert_eq(result.backend, TL_BACKEND_CPU);
    cr_assert_eq(log.calls, 0, "the progress callback was called for an empty batch");
    ASSERT_OK(tl_score_batch(model, NULL, 0, NULL, NULL, NULL));
}

Test(score_batch, null_options_and_out_result_work) {
    int32_t tokens[12];
    random_tokens(tokens, 12, FIXTURE_VOCAB);
    const tl_sequence sequences[] = {sequence(tokens, 12, 4), sequence(tokens, 5, 0)};
    tl_sequence_score with_defaults[2], on_cpu[2];
    ASSERT_OK(tl_score_batch(model, sequences, 2, NULL, with_defaults, NULL));
    tl_score_options options = cpu_options(NULL, 0);
    tl_score_result result = fresh_result();
    ASSERT_OK(tl_score_batch(model, sequences, 2, &options, on_cpu, &result));
    for (size_t i = 0; i < 2; ++i) {
        cr_assert_eq(with_defaults[i].tokens_scored, on_cpu[i].tokens_scored);
        /* A GPU backend computes in FP16: agree within a couple of percent. */
        assert_close(with_defaults[i].nll_sum, on_cpu[i].nll_sum, build_has_cuda() ? 2e-2 : 1e-9,
                     "default vs CPU nll_sum");
    }
    cr_assert_eq(result.tokens_scored, 8 + 4);
}

/* ---- bad arguments ---- */

/* Asserts that the batch fails with `expected`, a message naming `name` (a word) and holding `detail`, and that
 * neither the scores nor the result were written. */
static void assert_batch_fails(const tl_sequence *sequences, size_t n, const tl_score_options *options,
                               tl_status expected, const char *name, const char *detail) {
    tl_sequence_score scores[4];
    fill_sentinels(scores, 4);
    tl_score_result result = fresh_result();
    result.nll_sum = -7;
    ASSERT_FAILS_NAMING(tl_score_batch(model, sequences, n, options, scores, &result), expected, name);
    cr_assert(strstr(tl_last_error_message(), detail) != NULL, "message \"%s\" lacks \"%s\"",
              tl_last_error_message(), detail);
    assert_sentinels(scores, 4, name);
    cr_assert_eq(result.nll_sum, -7, "%s: the result was written on failure", name);
}

Test(score_batch, rejects_bad_sequences_naming_them) {
    enum { N = 10 };
    int32_t a[N], b[N], c[FIXTURE_MAX_SEQ + 1];
    random_tokens(a, N, FIXTURE_VOCAB);
    random_tokens(b, N, FIXTURE_VOCAB);
    random_tokens(c, FIXTURE_MAX_SEQ + 1, FIXTURE_VOCAB);
    tl_sequence sequences[3] = {sequence(a, N, 2), sequence(b, N, 0), sequence(c, 20, 5)};
    const tl_score_options options = cpu_options(NULL, 0);

    sequences[1].tokens = NULL;
    assert_batch_fails(sequences, 3, &options, TL_ERR_INVALID_ARGUMENT, "sequences[1]", "tokens is NULL");
    sequences[1].tokens = b;
    sequences[1].n_tokens = 1;
    assert_batch_fails(sequences, 3, &options, TL_ERR_INVALID_ARGUMENT, "sequences[1]", "n_tokens = 1");
    sequences[1].n_tokens = 0;
    assert_batch_fails(sequences, 3, &options, TL_ERR_INVALID_ARGUMENT, "sequences[1]", "n_tokens = 0");
    sequences[1].tokens = NULL; /* an empty sequence's tokens: its length is what is wrong */
    assert_batch_fails(sequences, 3, &options, TL_ERR_INVALID_ARGUMENT, "sequences[1]", "n_tokens = 0");
    sequences[1].tokens = b;
    sequences[1].n_tokens = N;
    sequences[2].n_tokens = FIXTURE_MAX_SEQ + 1;
    assert_batch_fails(sequences, 3, &options, TL_ERR_INVALID_ARGUMENT, "sequences[2]", "max_seq");
    sequences[2].n_tokens = FIXTURE_MAX_SEQ; /* exactly max_seq is fine */
    tl_sequence_score scores[3];
    ASSERT_OK(tl_score_batch(model, sequences, 3, &options, scores, NULL));

    sequences[0].n_context = N;
    assert_batch_fails(sequences, 3, &options, TL_ERR_INVALID_ARGUMENT, "sequences[0]", "n_context = 10");
    sequences[0].n_context = N + 5;
    assert_batch_fails(sequences, 3, &options, TL_ERR_INVALID_ARGUMENT, "sequences[0]", "n_context");
    sequences[0].n_context = N - 1; /* one token scored is fine */
    ASSERT_OK(tl_score_batch(model, sequences, 3, &options, scores, NULL));
    cr_assert_eq(scores[0].tokens_scored, 1);

    b[3] = FIXTURE_VOCAB;
    assert_batch_fails(sequences, 3, &options, TL_ERR_INVALID_ARGUMENT, "sequences[1]", "tokens[3] = 256");
    b[3] = -1;
    assert_batch_fails(sequences, 3, &options, TL_ERR_INVALID_ARGUMENT, "sequences[1]", "tokens[3] = -1");
    b[3] = 0;
    /* A bad token past n_tokens is not part of the sequence. */
    c[FIXTURE_MAX_SEQ] = FIXTURE_VOCAB + 5;
    ASSERT_OK(tl_score_batch(model, sequences, 3, &options, scores, NULL));
}

Test(score_batch, rejects_bad_arguments) {
    enum { N = 10 };
    int32_t tokens[N];
    random_tokens(tokens, N, FIXTURE_VOCAB);
    const tl_sequence sequences[2] = {sequence(tokens, N, 3), sequence(tokens, 4, 0)};
    float token_nll[N - 1 + 3];
    tl_score_options options = cpu_options(NULL, 0);
    tl_sequence_score scores[2];
    tl_score_result result = fresh_result();

    ASSERT_FAILS_NAMING(tl_score_batch(NULL, sequences, 2, &options, scores, &result), TL_ERR_INVALID_ARGUMENT,
                        "model");
    ASSERT_FAILS_NAMING(tl_score_batch(model, NULL, 2, &options, scores, &result), TL_ERR_INVALID_ARGUMENT,
                        "sequences");
    ASSERT_FAILS_NAMING(tl_score_batch(model, sequences, 2, &options, NULL, &result), TL_ERR_INVALID_ARGUMENT,
                        "out_scores");
    /* A length no array can have is an invalid argument, decided before allocating (not an internal error). */
    ASSERT_FAILS_NAMING(tl_score_batch(model, sequences, SIZE_MAX, &options, scores, &result), TL_ERR_INVALID_ARGUMENT,
                        "n_sequences");
    ASSERT_FAILS_NAMING(tl_score_batch(model, sequences, SIZE_MAX / 2, &options, scores, &result),
                        TL_ERR_INVALID_ARGUMENT, "n_sequences");
    tl_score_result too_small = fresh_result();
    too_small.struct_size = 4;
    ASSERT_FAILS_NAMING(tl_score_batch(model, sequences, 2, &options, scores, &too_small), TL_ERR_INVALID_ARGUMENT,
                        "struct_size");

    /* Sequences are never split: the window must be 0. */
    options.window = 16;
    assert_batch_fails(sequences, 2, &options, TL_ERR_INVALID_ARGUMENT, "window", "window = 16");
    options.window = 0;
    options.backend = 7;
    assert_batch_fails(sequences, 2, &options, TL_ERR_INVALID_ARGUMENT, "backend", "got 7");
    options.backend = TL_BACKEND_CPU;
    options.n_threads = -1;
    assert_batch_fails(sequences, 2, &options, TL_ERR_INVALID_ARGUMENT, "n_threads", "got -1");
    options.n_threads = 2;

    /* token_nll must hold the sum of n_tokens - 1, (10 - 1) + (4 - 1) = 12: the message gives that size. */
    options.token_nll = token_nll;
    options.token_nll_len = 11;
    assert_batch_fails(sequences, 2, &options, TL_ERR_BUFFER_TOO_SMALL, "12", "token_nll_len is 11");
    options.token_nll_len = 12; /* exactly enough */
    ASSERT_OK(tl_score_batch(model, sequences, 2, &options, scores, &result));
}

/* ---- progress and cancellation ---- */

static tl_score_options progress_options(struct progress_log *log) {
    tl_score_options options = cpu_options(NULL, 0);
    options.progress = record_progress;
    options.progress_user_data = log;
    return options;
}

enum { PROGRESS_TOKENS = 30 };

/* Three sequences over random `tokens` [PROGRESS_TOKENS], scoring 20, 11 and 1 of them. */
static void progress_sequences(int32_t *tokens, tl_sequence *sequences) {
    random_tokens(tokens, PROGRESS_TOKENS, FIXTURE_VOCAB);
    sequences[0] = sequence(tokens, PROGRESS_TOKENS, 10);
    sequences[1] = sequence(tokens, 12, 0);
    sequences[2] = sequence(tokens, 20, 19);
}

Test(score_batch, progress_counts_scored_tokens) {
    int32_t tokens[PROGRESS_TOKENS];
    tl_sequence sequences[3];
    progress_sequences(tokens, sequences);
    struct progress_log log = {0};
    const tl_score_options options = progress_options(&log);
    tl_sequence_score scores[3];
    tl_score_result result = fresh_result();
    ASSERT_OK(tl_score_batch(model, sequences, 3, &options, scores, &result));
    /* The CPU backend reports after each sequence. */
    cr_assert_eq(log.calls, 3);
    cr_assert_eq(log.went_backwards, 0);
    cr_assert_eq(log.overshot, 0);
    cr_assert_eq(log.total_changed, 0);
    cr_assert_eq(log.total, 20 + 11 + 1, "total %llu: not the scored tokens", (unsigned long long)log.total);
    cr_assert_eq(log.last_done, log.total);
    cr_assert_eq(result.tokens_scored, log.total);
}

/* Sequences finish in order, and when the callback reports `done`, token_nll holds the NLLs of the first k
 * sequences, whose tokens_scored add up to `done`. The buffer starts as NaN. */
struct batch_nll_watch {
    const tl_sequence *sequences;
    const float *token_nll;
    int calls, unwritten, not_a_sum;
};

static int32_t watch_batch_nll(void *user_data, uint64_t done, uint64_t total) {
    (void)total;
    struct batch_nll_watch *w = user_data;
    ++w->calls;
    uint64_t scored = 0;
    size_t offset = 0, s = 0;
    while (scored < done) {
        const tl_sequence *q = &w->sequences[s++];
        scored += q->n_tokens - (q->n_context > 0 ? q->n_context : 1);
        for (size_t j = 0; j + 1 < q->n_tokens; ++j) {
            if (isnan(w->token_nll[offset + j])) ++w->unwritten;
        }
        offset += q->n_tokens - 1;
    }
    if (scored != done) ++w->not_a_sum;
    return 0;
}

Test(score_batch, progress_sees_the_nlls_of_the_sequences_done) {
    int32_t tokens[PROGRESS_TOKENS];
    tl_sequence sequences[3];
    progress_sequences(tokens, sequences);
    enum { PREDICTED = (PROGRESS_TOKENS - 1) + 11 + 19 };
    float token_nll[PREDICTED];
    for (size_t i = 0; i < PREDICTED; ++i) token_nll[i] = NAN;
    struct batch_nll_watch w = {sequences, token_nll, 0, 0, 0};
    tl_score_options options = cpu_options(token_nll, PREDICTED);
    options.progress = watch_batch_nll;
    options.progress_user_data = &w;
    tl_sequence_score scores[3];
    tl_score_result result = fresh_result();
    ASSERT_OK(tl_score_batch(model, sequences, 3, &options, scores, &result));
    cr_assert_eq(w.calls, 3);
    cr_assert_eq(w.not_a_sum, 0, "a report's done was not the tokens_scored of the first k sequences");
    cr_assert_eq(w.unwritten, 0, "a report came before the NLLs of the sequences it counted were written");
}

static void assert_batch_cancelled_at(int stop_at_call) {
    int32_t tokens[PROGRESS_TOKENS];
    tl_sequence sequences[3];
    progress_sequences(tokens, sequences);
    struct progress_log log = {0};
    log.stop_at_call = stop_at_call;
    const tl_score_options options = progress_options(&log);
    tl_sequence_score scores[3];
    fill_sentinels(scores, 3);
    tl_score_result result = fresh_result();
    result.nll_sum = -7;
    const tl_status status = tl_score_batch(model, sequences, 3, &options, scores, &result);
    cr_assert_eq(status, TL_ERR_CANCELLED, "stop at call %d: got %d (%s)", stop_at_call, (int)status,
                 tl_status_string(status));
    cr_assert_str_not_empty(tl_last_error_message());
    cr_assert_eq(log.calls, stop_at_call, "the callback was called again after it asked to stop");
    assert_sentinels(scores, 3, "cancelled");
    cr_assert_eq(result.nll_sum, -7, "the result was written on failure");
}

Test(score_batch, cancels_at_the_first_report) { assert_batch_cancelled_at(1); }
Test(score_batch, cancels_between_sequences) { assert_batch_cancelled_at(2); }

/* ---- backends ---- */

Test(score_batch, cuda_backend_runs_or_reports_no_device) {
    enum { N = 20 };
    int32_t tokens[N];
    random_tokens(tokens, N, FIXTURE_VOCAB);
    const tl_sequence sequences[] = {sequence(tokens, N, 5), sequence(tokens, 9, 0)};
    tl_score_options options = cpu_options(NULL, 0);
    options.backend = TL_BACKEND_CUDA;
    tl_sequence_score on_gpu[2];
    tl_score_result result = fresh_result();
    if (!cuda_scoring_ran(tl_score_batch(model, sequences, 2, &options, on_gpu, &result))) return;
    cr_assert_eq(result.backend, TL_BACKEND_CUDA);
    options.backend = TL_BACKEND_CPU;
    tl_sequence_score on_cpu[2];
    ASSERT_OK(tl_score_batch(model, sequences, 2, &options, on_cpu, NULL));
    for (size_t i = 0; i < 2; ++i) {
        cr_assert_eq(on_gpu[i].tokens_scored, on_cpu[i].tokens_scored);
        assert_close(on_gpu[i].nll_sum, on_cpu[i].nll_sum, 2e-2, "GPU vs CPU nll_sum");
    }
}

/* options->empty_context_bos: a sequence given with n_context 0 is scored as the token, then the sequence (every one
 * of its tokens scored); sequences with a context are left as they are; the fixture names no BOS of its own. */
Test(score_batch, an_empty_context_takes_the_given_beginning_of_text_token) {
    enum { N = 9, BOS = 5 };
    int32_t tokens[N], with_bos[N + 1];
    random_tokens(tokens, N, FIXTURE_VOCAB);
    with_bos[0] = BOS;
    for (size_t i = 0; i < N; ++i) with_bos[i + 1] = tokens[i];
    const tl_sequence given[3] = {sequence(tokens, N, 0), sequence(tokens, 1, 0), sequence(tokens, N, 4)};
    const tl_sequence spelled[3] = {sequence(with_bos, N + 1, 1), sequence(with_bos, 2, 1), sequence(tokens, N, 4)};
    float nll_given[N + 1 + N - 1], nll_spelled[N + 1 + N - 1];
    tl_sequence_score got[3], want[3];
    tl_score_options options = cpu_options(nll_given, N + 1 + N - 1);
    options.empty_context_bos = BOS;
    ASSERT_OK(tl_score_batch(model, given, 3, &options, got, NULL));
    options = cpu_options(nll_spelled, N + 1 + N - 1);
    ASSERT_OK(tl_score_batch(model, spelled, 3, &options, want, NULL));
    for (size_t i = 0; i < 3; ++i) {
        cr_assert_eq(got[i].nll_sum, want[i].nll_sum, "sequence %zu", i);
        cr_assert_eq(got[i].tokens_scored, want[i].tokens_scored, "sequence %zu", i);
    }
    cr_assert_eq(got[0].tokens_scored, N);
    cr_assert_eq(got[1].tokens_scored, 1);
    for (size_t i = 0; i < N + 1 + N - 1; ++i) cr_assert_eq(nll_given[i], nll_spelled[i], "token_nll[%zu]", i);

    tl_sequence_score scores[1];
    options = cpu_options(NULL, 0);
    options.empty_context_bos = TL_BOS_FROM_MODEL;
    ASSERT_FAILS_NAMING(tl_score_batch(model, given, 1, &options, scores, NULL), TL_ERR_INVALID_ARGUMENT,
                        "names no beginning-of-text token");
    options.empty_context_bos = FIXTURE_VOCAB;
    ASSERT_FAILS_NAMING(tl_score_batch(model, given, 1, &options, scores, NULL), TL_ERR_INVALID_ARGUMENT, "vocab");
    options.empty_context_bos = -3;
    ASSERT_FAILS_NAMING(tl_score_batch(model, given, 1, &options, scores, NULL), TL_ERR_INVALID_ARGUMENT,
                        "empty_context_bos");
    options.empty_context_bos = BOS;
    const tl_sequence empty = sequence(tokens, 0, 0);
    ASSERT_FAILS_NAMING(tl_score_batch(model, &empty, 1, &options, scores, NULL), TL_ERR_INVALID_ARGUMENT,
                        "sequences[0].n_tokens is 0");
    /* max_seq tokens fit without the BOS, not with it. */
    int32_t *full = malloc(FIXTURE_MAX_SEQ * sizeof(int32_t));
    cr_assert_not_null(full);
    random_tokens(full, FIXTURE_MAX_SEQ, FIXTURE_VOCAB);
    const tl_sequence too_long = sequence(full, FIXTURE_MAX_SEQ, 0);
    ASSERT_FAILS_NAMING(tl_score_batch(model, &too_long, 1, &options, scores, NULL), TL_ERR_INVALID_ARGUMENT,
                        "past max_seq");
    free(full);
}
