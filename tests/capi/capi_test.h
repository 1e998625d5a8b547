/* Shared helpers for the C API conformance suite. Every test runs in its own process (Criterion), so the
 * helpers keep no state between tests. */
#ifndef TL_CAPI_TEST_H
#define TL_CAPI_TEST_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <criterion/criterion.h>

#include "tinyloop.h"

/* The committed fixture (tests/data/tiny.tinyloop) and its configuration as the test plan states it. */
#define FIXTURE_D_MODEL 64
#define FIXTURE_N_HEADS 4
#define FIXTURE_HEAD_DIM 16
#define FIXTURE_FFN 128
#define FIXTURE_VOCAB 256
#define FIXTURE_N_PRE 1
#define FIXTURE_N_LOOPS 2
#define FIXTURE_MAX_SEQ 128
#define FIXTURE_GROUP_SIZE 32
#define FIXTURE_N_QUANT_WEIGHTS 10

const char *fixture_path(void);
/* Loads the fixture with default options; fails the test on error. */
tl_model *load_fixture(void);
/* rng_seed_from_env, then load_fixture: a scoring suite's .init. */
tl_model *seed_and_load_fixture(void);

/* A fresh seed per test process (TL_TEST_SEED overrides it); logged so that a failure can be replayed. */
void rng_seed_from_env(void);
uint64_t rng_next(void);
/* Uniform in [lo, hi). */
float rng_uniform(float lo, float hi);
int32_t rng_below(int32_t bound);
void random_tokens(int32_t *tokens, size_t n, int32_t vocab);

/* IEEE binary16 bits -> float, written independently of the library's converter. */
float half_to_float(uint16_t bits);

/* Whether `word` occurs in `text` with no identifier character ([A-Za-z0-9_]) right before or after it. */
int contains_word(const char *text, const char *word);

/* The levels of one dequantized group. */
struct grid {
    double step; /* the smallest gap between distinct values: the group's scale */
    double lowest, highest;
};
/* Finds the group's grid and asserts that every value is lowest + j*step for an integer j in [0, 15]. */
struct grid assert_4bit_grid(const float *values, int32_t count, const char *what);

/* Whether tl_build_info() says "cuda": true. */
int build_has_cuda(void);

/* A path for a scratch file unique to this process, under the build tree. */
void scratch_path(char *out, size_t out_size, const char *stem);

/* Bytes of zeroed room kept after a struct under test, so a library that ignored struct_size could not write past
 * the caller's memory. */
#define SPARE_BYTES 64

/* Asserts that `call(size)` is TL_ERR_INVALID_ARGUMENT naming struct_size for each wrong size: 0, a size holding
 * only struct_size, and two sizes larger than the library knows. */
void assert_rejects_wrong_struct_size(tl_status (*call)(uint32_t), uint32_t full_size, const char *what);
/* An output struct's size: smaller than its first version is TL_ERR_INVALID_ARGUMENT naming struct_size; larger
 * sizes (a newer caller's struct) are accepted. */
void assert_output_struct_size(tl_status (*call)(uint32_t), uint32_t full_size, const char *what);

/* ---- Scoring (test_score.c, test_score_batch.c) ---- */

/* tl_score_options_init's defaults on the CPU backend with 2 threads, and token_nll (may be NULL). */
tl_score_options cpu_options(float *token_nll, size_t token_nll_len);
/* A result fresh from tl_score_result_init. */
tl_score_result fresh_result(void);
/* Asserts |a - b| <= relative * max(|a|, |b|) + 1e-12. */
void assert_close(double a, double b, double relative, const char *what);

/* Checks the status of a scoring call on TL_BACKEND_CUDA, run in Criterion's child process (so CUDA is never
 * initialised in the runner): in a build without CUDA, TL_ERR_NO_DEVICE; in one with CUDA, TL_OK, or
 * TL_ERR_NO_DEVICE (no usable GPU) or TL_ERR_UNSUPPORTED (a request the GPU path declines) with a message. Returns
 * whether the call scored (TL_OK). */
int cuda_scoring_ran(tl_status status);

/* What record_progress saw of a scoring call's progress reports. */
struct progress_log {
    int calls;
    int stop_at_call; /* 0: never stop */
    uint64_t last_done, total;
    int went_backwards, overshot, total_changed;
};
/* A tl_progress_fn logging into the struct progress_log at user_data; it asks to stop at call stop_at_call. */
int32_t record_progress(void *user_data, uint64_t done, uint64_t total);

/* Asserts that `call` returned TL_OK and left the thread's message empty. */
#define ASSERT_OK(call)                                                                                      \
    do {                                                                                                     \
        tl_status ok_status_ = (call);                                                                       \
        cr_assert_eq(ok_status_, TL_OK, "%s returned %d (%s): %s", #call, (int)ok_status_,                  \
                     tl_status_string(ok_status_), tl_last_error_message());                                 \
        cr_assert_str_empty(tl_last_error_message(), "%s succeeded but left the message \"%s\"", #call,      \
                            tl_last_error_message());                                                        \
    } while (0)

/* Asserts that `call` returned `expected` with a message naming `word` (see contains_word). */
#define ASSERT_FAILS_NAMING(call, expected, word)                                                            \
    do {                                                                                                     \
        tl_status fail_status_ = (call);                                                                     \
        const char *fail_message_ = tl_last_error_message();                                                 \
        cr_assert_eq(fail_status_, (expected), "%s returned %d (%s), expected %d (%s); message: \"%s\"",    \
                     #call, (int)fail_status_, tl_status_string(fail_status_), (int)(expected),             \
                     tl_status_string(expected), fail_message_);                                             \
        cr_assert_not_null(fail_message_, "%s: tl_last_error_message() is NULL", #call);                     \
        cr_assert(contains_word(fail_message_, (word)), "%s: message \"%s\" does not name \"%s\"", #call,   \
                  fail_message_, (word));                                                                    \
    } while (0)

#endif
