/* Scoring: tl_score_options_init, tl_score_result_init, tl_score. */
#define _POSIX_C_SOURCE 200809L /* pthread barriers */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#include "capi_test.h"

static tl_model *model;

static void setup(void) { model = seed_and_load_fixture(); }

static void teardown(void) { tl_model_free(model); }

TestSuite(score, .init = setup, .fini = teardown, .timeout = 120);

Test(score_options_init, fills_the_defaults) {
    tl_score_options options;
    memset(&options, 0x5A, sizeof options);
    ASSERT_OK(tl_score_options_init(&options, sizeof options));
    cr_assert_eq(options.struct_size, sizeof options);
    cr_assert_eq(options.backend, TL_BACKEND_AUTO);
    cr_assert_eq(options.n_threads, 0);
    cr_assert_eq(options.window, 0);
    cr_assert_null((void *)(uintptr_t)options.progress);
    cr_assert_null(options.progress_user_data);
    cr_assert_null(options.token_nll);
    cr_assert_eq(options.token_nll_len, 0);
    cr_assert_eq(options.device, 0);
    cr_assert_null(options.stream);
    cr_assert_eq(options.use_graphs, 1);
    ASSERT_FAILS_NAMING(tl_score_options_init(NULL, sizeof(tl_score_options)), TL_ERR_INVALID_ARGUMENT, "options");
}

Test(score_result_init, zeroes_the_result) {
    tl_score_result result;
    memset(&result, 0x5A, sizeof result);
    ASSERT_OK(tl_score_result_init(&result, sizeof result));
    cr_assert_eq(result.struct_size, sizeof result);
    cr_assert_eq(result.nll_sum, 0);
    cr_assert_eq(result.tokens_scored, 0);
    cr_assert_eq(result.perplexity, 0);
    cr_assert_eq(result.backend, 0);
    cr_assert_eq(result.n_windows, 0);
    cr_assert_eq(result.seconds, 0);
    ASSERT_FAILS_NAMING(tl_score_result_init(NULL, sizeof(tl_score_result)), TL_ERR_INVALID_ARGUMENT, "result");
}

Test(score, fills_result_and_token_nll) {
    enum { N = 48 };
    int32_t tokens[N];
    random_tokens(tokens, N, FIXTURE_VOCAB);
    float token_nll[N - 1 + 4];
    for (size_t i = 0; i < N - 1 + 4; ++i) token_nll[i] = -1.0f;
    tl_score_options options = cpu_options(token_nll, N - 1 + 4);
    tl_score_result result = fresh_result();
    ASSERT_OK(tl_score(model, tokens, N, &options, &result));

    cr_assert_eq(result.tokens_scored, N - 1);
    cr_assert(isfinite(result.perplexity) && result.perplexity > 1, "perplexity %g", result.perplexity);
    assert_close(result.perplexity, exp(result.nll_sum / (double)(N - 1)), 1e-9, "perplexity vs exp(nll/n)");
    cr_assert_eq(result.backend, TL_BACKEND_CPU);
    cr_assert_eq(result.n_windows, 1);
    cr_assert(result.seconds >= 0 && isfinite(result.seconds));
    double sum = 0;
    for (size_t i = 0; i < N - 1; ++i) {
        cr_assert(isfinite(token_nll[i]) && token_nll[i] >= 0, "token_nll[%zu] = %g", i, token_nll[i]);
        sum += token_nll[i];
    }
    assert_close(sum, result.nll_sum, 1e-5, "sum of token_nll vs nll_sum");
    for (size_t i = N - 1; i < N - 1 + 4; ++i) cr_assert_eq(token_nll[i], -1.0f, "token_nll[%zu] written past n-1", i);
}

Test(score, null_options_and_auto_backend_work) {
    enum { N = 12 };
    int32_t tokens[N];
    random_tokens(tokens, N, FIXTURE_VOCAB);
    tl_score_result with_defaults = fresh_result();
    ASSERT_OK(tl_score(model, tokens, N, NULL, &with_defaults));
    cr_assert(with_defaults.backend == TL_BACKEND_CPU || with_defaults.backend == TL_BACKEND_CUDA);
    if (!build_has_cuda()) cr_assert_eq(with_defaults.backend, TL_BACKEND_CPU);
    cr_assert_eq(with_defaults.tokens_scored, N - 1);

    tl_score_options options = cpu_options(NULL, 0);
    tl_score_result on_cpu = fresh_result();
    ASSERT_OK(tl_score(model, tokens, N, &options, &on_cpu));
    /* A GPU backend computes in FP16: agree within a couple of percent. */
    assert_close(with_defaults.perplexity, on_cpu.perplexity, with_defaults.backend == TL_BACKEND_CPU ? 1e-5 : 2e-2,
                 "default vs CPU perplexity");
}

Test(score, thread_count_does_not_change_the_result) {
    enum { N = 40 };
    int32_t tokens[N];
    random_tokens(tokens, N, FIXTURE_VOCAB);
    tl_score_options options = cpu_options(NULL, 0);
    tl_score_result one = fresh_result(), many = fresh_result();
    options.n_threads = 1;
    ASSERT_OK(tl_score(model, tokens, N, &options, &one));
    options.n_threads = 0;
    ASSERT_OK(tl_score(model, tokens, N, &options, &many));
    assert_close(one.nll_sum, many.nll_sum, 1e-5, "nll_sum with 1 thread vs all");
}

Test(score, is_causal) {
    enum { N = 24 };
    int32_t tokens[N];
    random_tokens(tokens, N, FIXTURE_VOCAB);
    float before[N - 1], after[N - 1];
    tl_score_options options = cpu_options(before, N - 1);
    tl_score_result result = fresh_result();
    ASSERT_OK(tl_score(model, tokens, N, &options, &result));

    /* A new last token changes only the last prediction. */
    tokens[N - 1] = (tokens[N - 1] + 1 + rng_below(FIXTURE_VOCAB - 1)) % FIXTURE_VOCAB;
    options.token_nll = after;
    ASSERT_OK(tl_score(model, tokens, N, &options, &result));
    for (size_t i = 0; i + 1 < N - 1; ++i) assert_close(before[i], after[i], 1e-5, "an earlier token's NLL");

    /* A new first token changes the prediction that conditions on it. */
    tokens[0] = (tokens[0] + 1 + rng_below(FIXTURE_VOCAB - 1)) % FIXTURE_VOCAB;
    float changed[N - 1];
    options.token_nll = changed;
    ASSERT_OK(tl_score(model, tokens, N, &options, &result));
    cr_assert_neq(changed[0], after[0], "the first prediction ignores its context");
}

Test(score, windows_overlap_by_one_token) {
    enum { N = 40, WINDOW = 16 };
    int32_t tokens[N];
    random_tokens(tokens, N, FIXTURE_VOCAB);
    float whole[N - 1];
    tl_score_options options = cpu_options(whole, N - 1);
    options.window = WINDOW;
    tl_score_result result = fresh_result();
    ASSERT_OK(tl_score(model, tokens, N, &options, &result));
    cr_assert_eq(result.tokens_scored, N - 1);
    cr_assert_eq(result.n_windows, (N - 1 + WINDOW - 2) / (WINDOW - 1), "n_windows %d", result.n_windows);

    /* Window w covers tokens [w*(WINDOW-1), w*(WINDOW-1) + WINDOW): score each piece on its own. */
    for (size_t start = 0; start + 1 < N; start += WINDOW - 1) {
        const size_t length = start + WINDOW <= N ? WINDOW : N - start;
        float piece[WINDOW - 1];
        tl_score_options piece_options = cpu_options(piece, WINDOW - 1);
        tl_score_result piece_result = fresh_result();
        ASSERT_OK(tl_score(model, tokens + start, length, &piece_options, &piece_result));
        cr_assert_eq(piece_result.n_windows, 1);
        for (size_t i = 0; i + 1 < length; ++i) assert_close(piece[i], whole[start + i], 1e-5, "windowed token NLL");
    }
}

Test(score, default_window_is_max_seq) {
    enum { N = 2 * FIXTURE_MAX_SEQ + 20 };
    int32_t *tokens = malloc(N * sizeof(int32_t));
    cr_assert_not_null(tokens);
    random_tokens(tokens, N, FIXTURE_VOCAB);
    tl_score_options options = cpu_options(NULL, 0);
    tl_score_result result = fresh_result();
    ASSERT_OK(tl_score(model, tokens, N, &options, &result));
    cr_assert_eq(result.tokens_scored, N - 1);
    cr_assert_eq(result.n_windows, (N - 1 + FIXTURE_MAX_SEQ - 2) / (FIXTURE_MAX_SEQ - 1));
    cr_assert(isfinite(result.perplexity) && result.perplexity > 1);
    free(tokens);
}

Test(score, rejects_bad_arguments) {
    enum { N = 10 };
    int32_t tokens[N];
    random_tokens(tokens, N, FIXTURE_VOCAB);
    float token_nll[N];
    tl_score_options options = cpu_options(NULL, 0);
    tl_score_result result = fresh_result();
    result.nll_sum = -7;

    ASSERT_FAILS_NAMING(tl_score(NULL, tokens, N, &options, &result), TL_ERR_INVALID_ARGUMENT, "model");
    ASSERT_FAILS_NAMING(tl_score(model, NULL, N, &options, &result), TL_ERR_INVALID_ARGUMENT, "tokens");
    ASSERT_FAILS_NAMING(tl_score(model, tokens, N, &options, NULL), TL_ERR_INVALID_ARGUMENT, "out_result");
    ASSERT_FAILS_NAMING(tl_score(model, tokens, 1, &options, &result), TL_ERR_INVALID_ARGUMENT, "n_tokens");
    ASSERT_FAILS_NAMING(tl_score(model, tokens, 0, &options, &result), TL_ERR_INVALID_ARGUMENT, "n_tokens");

    tokens[N / 2] = FIXTURE_VOCAB;
    ASSERT_FAILS_NAMING(tl_score(model, tokens, N, &options, &result), TL_ERR_INVALID_ARGUMENT, "tokens");
    tokens[N / 2] = -1;
    ASSERT_FAILS_NAMING(tl_score(model, tokens, N, &options, &result), TL_ERR_INVALID_ARGUMENT, "tokens");
    tokens[N / 2] = 0;

    options.window = FIXTURE_MAX_SEQ + 1;
    ASSERT_FAILS_NAMING(tl_score(model, tokens, N, &options, &result), TL_ERR_INVALID_ARGUMENT, "window");
    options.window = 1;
    ASSERT_FAILS_NAMING(tl_score(model, tokens, N, &options, &result), TL_ERR_INVALID_ARGUMENT, "window");
    options.window = -5;
    ASSERT_FAILS_NAMING(tl_score(model, tokens, N, &options, &result), TL_ERR_INVALID_ARGUMENT, "window");
    options.window = 0;
    options.backend = 7;
    ASSERT_FAILS_NAMING(tl_score(model, tokens, N, &options, &result), TL_ERR_INVALID_ARGUMENT, "backend");
    options.backend = TL_BACKEND_CPU;
    options.n_threads = -1;
    ASSERT_FAILS_NAMING(tl_score(model, tokens, N, &options, &result), TL_ERR_INVALID_ARGUMENT, "n_threads");
    options.n_threads = 2;

    /* token_nll must hold n_tokens - 1 floats: the message gives that size. */
    options.token_nll = token_nll;
    options.token_nll_len = N - 2;
    ASSERT_FAILS_NAMING(tl_score(model, tokens, N, &options, &result), TL_ERR_BUFFER_TOO_SMALL, "9");
    cr_assert_eq(result.nll_sum, -7, "the result was written on failure");

    options.token_nll_len = N - 1; /* exactly enough */
    ASSERT_OK(tl_score(model, tokens, N, &options, &result));
}

/* ---- progress and cancellation ---- */

Test(score, progress_is_reported) {
    enum { N = 100, WINDOW = 20 };
    int32_t tokens[N];
    random_tokens(tokens, N, FIXTURE_VOCAB);
    struct progress_log log = {0};
    tl_score_options options = cpu_options(NULL, 0);
    options.window = WINDOW;
    options.progress = record_progress;
    options.progress_user_data = &log;
    tl_score_result result = fresh_result();
    ASSERT_OK(tl_score(model, tokens, N, &options, &result));
    cr_assert_gt(log.calls, 0, "the progress callback was never called");
    cr_assert_eq(log.went_backwards, 0);
    cr_assert_eq(log.overshot, 0);
    cr_assert_eq(log.total_changed, 0);
    cr_assert_gt(log.total, 0);
    cr_assert_eq(log.last_done, log.total, "the last report is %llu of %llu", (unsigned long long)log.last_done,
                 (unsigned long long)log.total);
}

static void assert_cancelled_at(int stop_at_call) {
    enum { N = 100, WINDOW = 20 };
    int32_t tokens[N];
    random_tokens(tokens, N, FIXTURE_VOCAB);
    struct progress_log log = {0};
    log.stop_at_call = stop_at_call;
    tl_score_options options = cpu_options(NULL, 0);
    options.window = WINDOW;
    options.progress = record_progress;
    options.progress_user_data = &log;
    tl_score_result result = fresh_result();
    result.nll_sum = -7;
    const tl_status status = tl_score(model, tokens, N, &options, &result);
    cr_assert_eq(status, TL_ERR_CANCELLED, "stop at call %d: got %d (%s)", stop_at_call, (int)status,
                 tl_status_string(status));
    cr_assert_str_not_empty(tl_last_error_message());
    cr_assert_eq(log.calls, stop_at_call, "the callback was called again after it asked to stop");
    cr_assert_eq(result.nll_sum, -7, "the result was written on failure");
}

Test(score, cancels_at_the_first_report) { assert_cancelled_at(1); }
Test(score, cancels_between_windows) { assert_cancelled_at(2); }

/* When the callback reports `done`, token_nll[0, done) already holds those tokens' final NLLs (what a running
 * perplexity reads). The buffer starts as NaN; each report checks and records the entries it may read. */
enum { NLL_WATCH_N = 100 };

struct nll_watch {
    const float *token_nll;
    float seen[NLL_WATCH_N - 1];
    uint64_t seen_up_to;
    int calls, unwritten;
};

static int32_t watch_nll(void *user_data, uint64_t done, uint64_t total) {
    (void)total;
    struct nll_watch *w = user_data;
    ++w->calls;
    for (uint64_t i = 0; i < done; ++i) {
        if (isnan(w->token_nll[i])) ++w->unwritten;
        w->seen[i] = w->token_nll[i];
    }
    w->seen_up_to = done;
    return 0;
}

Test(score, progress_sees_the_nlls_of_the_tokens_done) {
    int32_t tokens[NLL_WATCH_N];
    random_tokens(tokens, NLL_WATCH_N, FIXTURE_VOCAB);
    float token_nll[NLL_WATCH_N - 1];
    for (size_t i = 0; i < NLL_WATCH_N - 1; ++i) token_nll[i] = NAN;
    struct nll_watch w = {token_nll, {0}, 0, 0, 0};
    tl_score_options options = cpu_options(token_nll, NLL_WATCH_N - 1);
    options.window = 20;
    options.progress = watch_nll;
    options.progress_user_data = &w;
    tl_score_result result = fresh_result();
    ASSERT_OK(tl_score(model, tokens, NLL_WATCH_N, &options, &result));
    cr_assert_gt(w.calls, 1);
    cr_assert_eq(w.unwritten, 0, "a report came before the NLLs of the tokens it counted were written");
    cr_assert_eq(w.seen_up_to, NLL_WATCH_N - 1);
    for (size_t i = 0; i < NLL_WATCH_N - 1; ++i) {
        cr_assert(w.seen[i] == token_nll[i], "token_nll[%zu] changed after its report", i);
    }
}

/* The progress callback may call into the library, tl_score on the same model included (no lock is held). */
struct reentry {
    const tl_model *model;
    int calls;
    tl_status inner_status;
    double inner_nll;
};

static int32_t score_again(void *user_data, uint64_t done, uint64_t total) {
    (void)done;
    (void)total;
    struct reentry *r = user_data;
    if (r->calls++ == 0) {
        int32_t tokens[8] = {1, 2, 3, 4, 5, 6, 7, 8};
        tl_score_options options;
        tl_score_options_init(&options, sizeof options);
        options.backend = TL_BACKEND_CPU;
        tl_score_result result;
        tl_score_result_init(&result, sizeof result);
        r->inner_status = tl_score(r->model, tokens, 8, &options, &result);
        r->inner_nll = result.nll_sum;
    }
    return 0;
}

Test(score, progress_callback_may_score_the_same_model) {
    enum { N = 60 };
    int32_t tokens[N];
    random_tokens(tokens, N, FIXTURE_VOCAB);
    struct reentry r = {model, 0, -100, 0};
    tl_score_options options = cpu_options(NULL, 0);
    options.window = 20;
    options.progress = score_again;
    options.progress_user_data = &r;
    tl_score_result result = fresh_result();
    ASSERT_OK(tl_score(model, tokens, N, &options, &result));
    cr_assert_gt(r.calls, 1);
    cr_assert_eq(r.inner_status, TL_OK, "the re-entrant tl_score returned %d", (int)r.inner_status);
    cr_assert_gt(r.inner_nll, 0.0);
}

/* The memory budget: below what the call needs it fails with TL_ERR_OUT_OF_MEMORY before doing any work and says
 * how much it needed; with a generous budget the same call succeeds. */
Test(score, memory_budget_is_enforced) {
    enum { N = 50 };
    int32_t tokens[N];
    random_tokens(tokens, N, FIXTURE_VOCAB);
    tl_score_options options = cpu_options(NULL, 0);
    options.n_threads = 1;
    options.max_memory_bytes = 1024;
    tl_score_result result = fresh_result();
    cr_assert_eq(tl_score(model, tokens, N, &options, &result), TL_ERR_OUT_OF_MEMORY);
    cr_assert(strstr(tl_last_error_message(), "max_memory_bytes") != NULL, "%s", tl_last_error_message());
    cr_assert(strstr(tl_last_error_message(), "needs about") != NULL, "%s", tl_last_error_message());
    options.max_memory_bytes = (uint64_t)1 << 30;
    ASSERT_OK(tl_score(model, tokens, N, &options, &result));
}

/* ---- backends ---- */

Test(score, cuda_backend_runs_or_reports_no_device) {
    /* Runs in Criterion's child process, so CUDA is never initialised in the runner. */
    enum { N = 20 };
    int32_t tokens[N];
    random_tokens(tokens, N, FIXTURE_VOCAB);
    tl_score_options options = cpu_options(NULL, 0);
    options.backend = TL_BACKEND_CUDA;
    tl_score_result on_gpu = fresh_result();
    if (cuda_scoring_ran(tl_score(model, tokens, N, &options, &on_gpu))) {
        cr_assert_eq(on_gpu.backend, TL_BACKEND_CUDA);
        options.backend = TL_BACKEND_CPU;
        tl_score_result on_cpu = fresh_result();
        ASSERT_OK(tl_score(model, tokens, N, &options, &on_cpu));
        assert_close(on_gpu.perplexity, on_cpu.perplexity, 2e-2, "GPU vs CPU perplexity");
    }
}

/* ---- one model, four threads ---- */

enum { SHARED_N = 64, SHARED_THREADS = 4, SHARED_ROUNDS = 3 };

struct scoring_thread {
    pthread_barrier_t *start;
    const int32_t *tokens;
    tl_status status;
    double nll_sum[SHARED_ROUNDS];
    float token_nll[SHARED_ROUNDS][SHARED_N - 1];
};

static void *scoring_thread_main(void *arg) {
    struct scoring_thread *t = arg;
    pthread_barrier_wait(t->start);
    t->status = TL_OK;
    for (int round = 0; round < SHARED_ROUNDS && t->status == TL_OK; ++round) {
        tl_score_options options;
        tl_score_options_init(&options, sizeof options);
        options.backend = TL_BACKEND_CPU;
        options.n_threads = 2;
        options.token_nll = t->token_nll[round];
        options.token_nll_len = SHARED_N - 1;
        tl_score_result result;
        tl_score_result_init(&result, sizeof result);
        t->status = tl_score(model, t->tokens, SHARED_N, &options, &result);
        t->nll_sum[round] = result.nll_sum;
    }
    return NULL;
}

Test(score, one_model_from_four_threads_gives_identical_results) {
    int32_t tokens[SHARED_N];
    random_tokens(tokens, SHARED_N, FIXTURE_VOCAB);
    float reference_nll[SHARED_N - 1];
    tl_score_options options = cpu_options(reference_nll, SHARED_N - 1);
    tl_score_result reference = fresh_result();
    ASSERT_OK(tl_score(model, tokens, SHARED_N, &options, &reference));

    pthread_barrier_t start;
    cr_assert_eq(pthread_barrier_init(&start, NULL, SHARED_THREADS), 0);
    static struct scoring_thread threads[SHARED_THREADS];
    pthread_t ids[SHARED_THREADS];
    for (int i = 0; i < SHARED_THREADS; ++i) {
        threads[i].start = &start;
        threads[i].tokens = tokens;
        cr_assert_eq(pthread_create(&ids[i], NULL, scoring_thread_main, &threads[i]), 0);
    }
    for (int i = 0; i < SHARED_THREADS; ++i) cr_assert_eq(pthread_join(ids[i], NULL), 0);
    pthread_barrier_destroy(&start);

    for (int i = 0; i < SHARED_THREADS; ++i) {
        cr_assert_eq(threads[i].status, TL_OK, "thread %d: %s", i, tl_status_string(threads[i].status));
        for (int round = 0; round < SHARED_ROUNDS; ++round) {
            cr_assert_eq(threads[i].nll_sum[round], reference.nll_sum, "thread %d round %d: %.17g vs %.17g", i, round,
                         threads[i].nll_sum[round], reference.nll_sum);
            cr_assert_arr_eq(threads[i].token_nll[round], reference_nll, sizeof reference_nll,
                             "thread %d round %d: token NLLs differ", i, round);
        }
    }
}

Test(score, top_k_gives_sorted_log_probabilities_consistent_with_the_nll) {
    enum { N = 40, K = 4 };
    int32_t tokens[N];
    random_tokens(tokens, N, FIXTURE_VOCAB);
    float nll[N - 1];
    int32_t ids[(N - 1) * K];
    float logprobs[(N - 1) * K];
    tl_score_options options = cpu_options(nll, N - 1);
    options.top_k = K;
    options.top_ids = ids;
    options.top_logprobs = logprobs;
    options.top_len = (N - 1) * K;
    tl_score_result result = fresh_result();
    ASSERT_OK(tl_score(model, tokens, N, &options, &result));
    for (size_t i = 0; i + 1 < N; ++i) {
        for (size_t j = 0; j < K; ++j) {
            cr_assert(ids[i * K + j] >= 0 && ids[i * K + j] < FIXTURE_VOCAB);
            cr_assert(logprobs[i * K + j] <= 0.0f);
            if (j > 0) cr_assert(logprobs[i * K + j] <= logprobs[i * K + j - 1]);
            /* The token that came next, when it is among the top K, has its NLL as minus its log-probability. */
            if (ids[i * K + j] == tokens[i + 1]) cr_assert_float_eq(-logprobs[i * K + j], nll[i], 1e-4);
        }
    }
    options.top_k = 21;
    ASSERT_FAILS_NAMING(tl_score(model, tokens, N, &options, &result), TL_ERR_INVALID_ARGUMENT, "top_k");
    options.top_k = K;
    options.top_len = (N - 1) * K - 1;
    ASSERT_FAILS_NAMING(tl_score(model, tokens, N, &options, &result), TL_ERR_BUFFER_TOO_SMALL, "top_len");
    options.top_len = (N - 1) * K;
    options.top_ids = NULL;
    ASSERT_FAILS_NAMING(tl_score(model, tokens, N, &options, &result), TL_ERR_INVALID_ARGUMENT, "top_ids");
}

Test(score, older_options_sizes_are_accepted) {
    enum { N = 20 };
    int32_t tokens[N];
    random_tokens(tokens, N, FIXTURE_VOCAB);
    tl_score_options options = cpu_options(NULL, 0);
    tl_score_result result = fresh_result();
    /* The first version ends before max_memory_bytes, the second before top_k, the third before empty_context_bos. */
    options.struct_size = (uint32_t)offsetof(tl_score_options, max_memory_bytes);
    ASSERT_OK(tl_score(model, tokens, N, &options, &result));
    options.struct_size = (uint32_t)offsetof(tl_score_options, top_k);
    ASSERT_OK(tl_score(model, tokens, N, &options, &result));
    options.struct_size = (uint32_t)offsetof(tl_score_options, empty_context_bos);
    ASSERT_OK(tl_score(model, tokens, N, &options, &result));
    /* The fourth ends after empty_context_bos and its tail padding. */
    options.struct_size = (uint32_t)((offsetof(tl_score_options, activations) + 7) / 8 * 8);
    ASSERT_OK(tl_score(model, tokens, N, &options, &result));
    options.struct_size = (uint32_t)offsetof(tl_score_options, top_ids);
    ASSERT_FAILS_NAMING(tl_score(model, tokens, N, &options, &result), TL_ERR_INVALID_ARGUMENT, "struct_size");
}

Test(score, compare_with_itself_has_no_divergence) {
    enum { N = 60 };
    int32_t tokens[N];
    random_tokens(tokens, N, FIXTURE_VOCAB);
    float kl[N - 1], nll_ref[N - 1], nll_test[N - 1];
    uint8_t match[N - 1];
    tl_compare_options options;
    ASSERT_OK(tl_compare_options_init(&options, sizeof options));
    cr_assert_eq(options.backend, TL_BACKEND_AUTO);
    cr_assert_eq(options.use_graphs, 1);
    options.backend = TL_BACKEND_CPU;
    options.window = 25;
    options.token_kl = kl;
    options.token_nll_reference = nll_ref;
    options.token_nll_test = nll_test;
    options.token_top1_match = match;
    options.token_len = N - 1;
    tl_compare_result result;
    ASSERT_OK(tl_compare_result_init(&result, sizeof result));
    ASSERT_OK(tl_score_compare(model, model, tokens, N, &options, &result));
    cr_assert_eq(result.tokens_scored, N - 1);
    cr_assert_eq(result.n_windows, 3);
    cr_assert_eq(result.backend, TL_BACKEND_CPU);
    cr_assert(fabs(result.kl_mean) < 1e-6 && fabs(result.kl_max) < 1e-6, "KL %g, max %g", result.kl_mean,
              result.kl_max);
    cr_assert_eq(result.top1_agreement, 1.0);
    cr_assert_eq(result.perplexity_ratio, 1.0);
    cr_assert_eq(result.delta_perplexity, 0.0);
    /* The reference's NLLs are tl_score's with the same window. */
    float nll[N - 1];
    tl_score_options score_options = cpu_options(nll, N - 1);
    score_options.window = 25;
    tl_score_result score_result = fresh_result();
    ASSERT_OK(tl_score(model, tokens, N, &score_options, &score_result));
    for (size_t i = 0; i + 1 < N; ++i) {
        cr_assert_eq(kl[i], 0.0f);
        cr_assert_eq(match[i], 1);
        cr_assert_eq(nll_ref[i], nll_test[i]);
        cr_assert_float_eq(nll_ref[i], nll[i], 1e-4);
    }
    cr_assert_float_eq(result.perplexity_reference, score_result.perplexity, 1e-6 * score_result.perplexity);

    options.token_len = N - 2;
    ASSERT_FAILS_NAMING(tl_score_compare(model, model, tokens, N, &options, &result), TL_ERR_BUFFER_TOO_SMALL,
                        "token_len");
    ASSERT_FAILS_NAMING(tl_score_compare(model, NULL, tokens, N, NULL, &result), TL_ERR_INVALID_ARGUMENT, "test");
    ASSERT_FAILS_NAMING(tl_score_compare(model, model, tokens, 1, NULL, &result), TL_ERR_INVALID_ARGUMENT, "n_tokens");
}

/* Activation precision: INT8 and FP8 score on the CPU close to FP16 (and differently), tl_score_batch as tl_score; an
 * unknown value or a non-zero `reserved` is refused naming the field; a fourth-version struct, whose tail padding
 * `activations` fills, is read without it. */
Test(score, activations_int8_and_fp8) {
    enum { N = 40 };
    int32_t tokens[N];
    random_tokens(tokens, N, FIXTURE_VOCAB);
    float nll[N - 1];
    tl_score_options options = cpu_options(nll, N - 1);
    cr_assert_eq(options.activations, TL_ACTIVATIONS_FP16);
    cr_assert_eq(options.reserved, 0);
    tl_score_result fp16 = fresh_result(), quantized = fresh_result();
    ASSERT_OK(tl_score(model, tokens, N, &options, &fp16));
    const int32_t modes[2] = {TL_ACTIVATIONS_INT8, TL_ACTIVATIONS_FP8};
    for (int i = 0; i < 2; ++i) {
        options.activations = modes[i];
        ASSERT_OK(tl_score(model, tokens, N, &options, &quantized));
        cr_assert_neq(quantized.nll_sum, fp16.nll_sum, "activations %d changed nothing", modes[i]);
        assert_close(quantized.perplexity, fp16.perplexity, 0.05, "perplexity with quantized activations");
        /* One sequence through tl_score_batch: the same forward pass, the same NLLs. */
        const tl_sequence sequence = {tokens, N, 0};
        tl_sequence_score score;
        float batch_nll[N - 1];
        tl_score_options batch_options = options;
        batch_options.token_nll = batch_nll;
        ASSERT_OK(tl_score_batch(model, &sequence, 1, &batch_options, &score, NULL));
        for (size_t t = 0; t + 1 < N; ++t) cr_assert_eq(batch_nll[t], nll[t], "position %zu", t);
    }
    options.activations = 3;
    ASSERT_FAILS_NAMING(tl_score(model, tokens, N, &options, &quantized), TL_ERR_INVALID_ARGUMENT, "activations");
    options.activations = -1;
    ASSERT_FAILS_NAMING(tl_score_batch(model, NULL, 0, &options, NULL, NULL), TL_ERR_INVALID_ARGUMENT, "activations");
    options.activations = TL_ACTIVATIONS_INT8;
    options.reserved = 1;
    ASSERT_FAILS_NAMING(tl_score(model, tokens, N, &options, &quantized), TL_ERR_INVALID_ARGUMENT, "reserved");
    options.reserved = 0;
    /* The fourth version: its size ends right after empty_context_bos's padding; what lies there is not read. */
    const uint32_t fourth = (uint32_t)((offsetof(tl_score_options, activations) + 7) / 8 * 8);
    cr_assert_lt(fourth, sizeof(tl_score_options));
    options.struct_size = fourth;
    options.activations = 77;
    tl_score_result old = fresh_result();
    ASSERT_OK(tl_score(model, tokens, N, &options, &old));
    cr_assert_eq(old.nll_sum, fp16.nll_sum);
    /* A CUDA request: NO_DEVICE without CUDA, or the GPU declines (UNSUPPORTED) naming the activations. */
    options = cpu_options(NULL, 0);
    options.backend = TL_BACKEND_CUDA;
    options.activations = TL_ACTIVATIONS_INT8;
    const tl_status status = tl_score(model, tokens, N, &options, &quantized);
    cr_assert(status == TL_ERR_NO_DEVICE || status == TL_ERR_UNSUPPORTED, "status %d: %s", status,
              tl_last_error_message());
    if (status == TL_ERR_UNSUPPORTED) cr_assert(strstr(tl_last_error_message(), "activations") != NULL);
}

/* A model compared with itself at INT8 (or FP8) activations: a small, positive divergence, each side's perplexity as
 * tl_score's at that precision; the first version of tl_compare_options (without the activation fields) still works;
 * a bad value is refused naming its field. */
Test(score, compare_activations_against_fp16) {
    enum { N = 50 };
    int32_t tokens[N];
    random_tokens(tokens, N, FIXTURE_VOCAB);
    tl_compare_options options;
    ASSERT_OK(tl_compare_options_init(&options, sizeof options));
    cr_assert_eq(options.activations_reference, TL_ACTIVATIONS_FP16);
    cr_assert_eq(options.activations_test, TL_ACTIVATIONS_FP16);
    options.backend = TL_BACKEND_CPU;
    tl_compare_result result;
    ASSERT_OK(tl_compare_result_init(&result, sizeof result));
    tl_score_options score_options = cpu_options(NULL, 0);
    tl_score_result fp16 = fresh_result(), quantized = fresh_result();
    ASSERT_OK(tl_score(model, tokens, N, &score_options, &fp16));
    const int32_t modes[2] = {TL_ACTIVATIONS_INT8, TL_ACTIVATIONS_FP8};
    for (int i = 0; i < 2; ++i) {
        options.activations_test = modes[i];
        ASSERT_OK(tl_score_compare(model, model, tokens, N, &options, &result));
        cr_assert(result.kl_mean > 0 && result.kl_mean < 0.05, "KL %g", result.kl_mean);
        score_options.activations = modes[i];
        ASSERT_OK(tl_score(model, tokens, N, &score_options, &quantized));
        assert_close(result.perplexity_test, quantized.perplexity, 1e-5, "test side");
        assert_close(result.perplexity_reference, fp16.perplexity, 1e-5, "reference side");
        /* Swapped sides: the reference runs quantized. */
        options.activations_reference = modes[i];
        options.activations_test = TL_ACTIVATIONS_FP16;
        ASSERT_OK(tl_score_compare(model, model, tokens, N, &options, &result));
        assert_close(result.perplexity_reference, quantized.perplexity, 1e-5, "reference side, swapped");
        options.activations_reference = TL_ACTIVATIONS_FP16;
    }
    options.activations_test = TL_ACTIVATIONS_INT8;
    options.struct_size = (uint32_t)offsetof(tl_compare_options, activations_reference);
    ASSERT_OK(tl_score_compare(model, model, tokens, N, &options, &result));
    cr_assert_eq(result.kl_mean, 0.0, "the first version has no activation fields: FP16 on both sides");
    options.struct_size = sizeof options;
    options.activations_test = 9;
    ASSERT_FAILS_NAMING(tl_score_compare(model, model, tokens, N, &options, &result), TL_ERR_INVALID_ARGUMENT,
                        "activations_test");
    options.activations_test = TL_ACTIVATIONS_FP16;
    options.activations_reference = -3;
    ASSERT_FAILS_NAMING(tl_score_compare(model, model, tokens, N, &options, &result), TL_ERR_INVALID_ARGUMENT,
                        "activations_reference");
}
