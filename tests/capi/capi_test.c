#define _POSIX_C_SOURCE 200809L

#include "capi_test.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static uint64_t rng_state;

const char *fixture_path(void) { return TL_TEST_FIXTURE; }

tl_model *load_fixture(void) {
    tl_model *model = NULL;
    tl_status status = tl_model_load(fixture_path(), NULL, &model);
    cr_assert_eq(status, TL_OK, "loading the fixture %s: %s: %s", fixture_path(), tl_status_string(status),
                 tl_last_error_message());
    cr_assert_not_null(model);
    return model;
}

tl_model *seed_and_load_fixture(void) {
    rng_seed_from_env();
    return load_fixture();
}

void rng_seed_from_env(void) {
    const char *forced = getenv("TL_TEST_SEED");
    if (forced != NULL && *forced != '\0') {
        rng_state = strtoull(forced, NULL, 10);
    } else {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        rng_state = ((uint64_t)now.tv_sec * 1000000007u) ^ (uint64_t)now.tv_nsec ^ ((uint64_t)getpid() << 32);
    }
    cr_log_info("random seed %llu (set TL_TEST_SEED to replay)", (unsigned long long)rng_state);
}

/* splitmix64: small, good enough for test data, and independent of the library's own generator. */
uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

float rng_uniform(float lo, float hi) {
    const double unit = (double)(rng_next() >> 11) / 9007199254740992.0; /* 2^53 */
    return (float)(lo + (hi - lo) * unit);
}

int32_t rng_below(int32_t bound) { return (int32_t)(rng_next() % (uint64_t)bound); }

void random_tokens(int32_t *tokens, size_t n, int32_t vocab) {
    for (size_t i = 0; i < n; ++i) tokens[i] = rng_below(vocab);
}

float half_to_float(uint16_t bits) {
    const int sign = (bits >> 15) & 1;
    const int exponent = (bits >> 10) & 0x1F;
    const int mantissa = bits & 0x3FF;
    double magnitude;
    if (exponent == 0) {
        magnitude = ldexp((double)mantissa, -24);
    } else if (exponent == 31) {
        magnitude = mantissa ? NAN : INFINITY;
    } else {
        magnitude = ldexp((double)(mantissa | 0x400), exponent - 25);
    }
    return (float)(sign ? -magnitude : magnitude);
}

static int is_identifier_char(char c) { return isalnum((unsigned char)c) || c == '_'; }

int contains_word(const char *text, const char *word) {
    const size_t length = strlen(word);
    for (const char *hit = strstr(text, word); hit != NULL; hit = strstr(hit + 1, word)) {
        const int starts = hit == text || !is_identifier_char(hit[-1]);
        const int ends = !is_identifier_char(hit[length]);
        if (starts && ends) return 1;
    }
    return 0;
}

int build_has_cuda(void) {
    const char *key = strstr(tl_build_info(), "\"cuda\"");
    cr_assert_not_null(key, "tl_build_info() has no \"cuda\" key: %s", tl_build_info());
    const char *value = key + strlen("\"cuda\"");
    while (isspace((unsigned char)*value)) ++value;
    cr_assert_eq(*value, ':', "tl_build_info(): \"cuda\" is not followed by ':' in %s", tl_build_info());
    ++value;
    while (isspace((unsigned char)*value)) ++value;
    if (strncmp(value, "true", 4) == 0) return 1;
    cr_assert(strncmp(value, "false", 5) == 0, "tl_build_info(): \"cuda\" is not a bool in %s", tl_build_info());
    return 0;
}

void scratch_path(char *out, size_t out_size, const char *stem) {
    const int written = snprintf(out, out_size, "%s/%s.%ld.tmp", TL_TEST_SCRATCH_DIR, stem, (long)getpid());
    cr_assert(written > 0 && (size_t)written < out_size, "scratch path too long");
}

static int compare_floats(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

struct grid assert_4bit_grid(const float *values, int32_t count, const char *what) {
    float *sorted = malloc((size_t)count * sizeof(float));
    cr_assert_not_null(sorted);
    memcpy(sorted, values, (size_t)count * sizeof(float));
    qsort(sorted, (size_t)count, sizeof(float), compare_floats);
    struct grid grid = {0, sorted[0], sorted[count - 1]};
    /* Gaps below this are FP32 rounding in q*s + z, not a level. */
    const double noise = 1e-5 * fmax(fabs(grid.lowest), fabs(grid.highest));
    for (int32_t i = 1; i < count; ++i) {
        const double gap = (double)sorted[i] - sorted[i - 1];
        if (gap > noise && (grid.step == 0 || gap < grid.step)) grid.step = gap;
    }
    free(sorted);
    cr_assert_gt(grid.step, 0, "%s: all %d values of a group are equal", what, count);
    for (int32_t i = 0; i < count; ++i) {
        const double level = (values[i] - grid.lowest) / grid.step;
        cr_assert(isfinite(values[i]) && fabs(level - rint(level)) < 1e-3 && rint(level) <= 15,
                  "%s: %.9g (index %d) is not on a 4-bit grid of step %.9g from %.9g", what, values[i], i, grid.step,
                  grid.lowest);
    }
    return grid;
}

void assert_rejects_wrong_struct_size(tl_status (*call)(uint32_t), uint32_t full_size, const char *what) {
    const uint32_t wrong[] = {0, (uint32_t)sizeof(uint32_t), full_size + 8, full_size + SPARE_BYTES};
    for (size_t i = 0; i < sizeof(wrong) / sizeof(wrong[0]); ++i) {
        const tl_status status = call(wrong[i]);
        cr_assert_eq(status, TL_ERR_INVALID_ARGUMENT, "%s with struct_size %u: %d (%s)", what, wrong[i], (int)status,
                     tl_status_string(status));
        cr_assert(contains_word(tl_last_error_message(), "struct_size"), "%s with struct_size %u: message \"%s\"",
                  what, wrong[i], tl_last_error_message());
    }
}

void assert_output_struct_size(tl_status (*call)(uint32_t), uint32_t full_size, const char *what) {
    const uint32_t wrong[] = {0, (uint32_t)sizeof(uint32_t), full_size - 1};
    for (size_t i = 0; i < sizeof(wrong) / sizeof(wrong[0]); ++i) {
        const tl_status status = call(wrong[i]);
        cr_assert_eq(status, TL_ERR_INVALID_ARGUMENT, "%s with struct_size %u: %d (%s)", what, wrong[i], (int)status,
                     tl_status_string(status));
        cr_assert(contains_word(tl_last_error_message(), "struct_size"), "%s with struct_size %u: message \"%s\"",
                  what, wrong[i], tl_last_error_message());
    }
    /* A caller built against a newer header has a larger output struct: accepted. */
    const uint32_t larger[] = {full_size + 8, full_size + SPARE_BYTES};
    for (size_t i = 0; i < sizeof(larger) / sizeof(larger[0]); ++i) {
        const tl_status status = call(larger[i]);
        cr_assert(status != TL_ERR_INVALID_ARGUMENT || !contains_word(tl_last_error_message(), "struct_size"),
                  "%s with a larger struct_size %u: %s", what, larger[i], tl_last_error_message());
    }
}

tl_score_options cpu_options(float *token_nll, size_t token_nll_len) {
    tl_score_options options;
    ASSERT_OK(tl_score_options_init(&options, sizeof options));
    options.backend = TL_BACKEND_CPU;
    options.n_threads = 2;
    options.token_nll = token_nll;
    options.token_nll_len = token_nll_len;
    return options;
}

tl_score_result fresh_result(void) {
    tl_score_result result;
    ASSERT_OK(tl_score_result_init(&result, sizeof result));
    return result;
}

void assert_close(double a, double b, double relative, const char *what) {
    cr_assert(fabs(a - b) <= relative * fmax(fabs(a), fabs(b)) + 1e-12, "%s: %.12g vs %.12g", what, a, b);
}

int cuda_scoring_ran(tl_status status) {
    const char *message = tl_last_error_message();
    if (!build_has_cuda()) {
        cr_assert_eq(status, TL_ERR_NO_DEVICE, "a build without CUDA gave %d (%s)", (int)status,
                     tl_status_string(status));
    } else {
        cr_assert(status == TL_OK || status == TL_ERR_NO_DEVICE || status == TL_ERR_UNSUPPORTED, "got %d (%s): %s",
                  (int)status, tl_status_string(status), message);
    }
    if (status != TL_OK) cr_assert_str_not_empty(message);
    return status == TL_OK;
}

int32_t record_progress(void *user_data, uint64_t done, uint64_t total) {
    struct progress_log *log = user_data;
    if (log->calls > 0 && done < log->last_done) log->went_backwards = 1;
    if (log->calls > 0 && total != log->total) log->total_changed = 1;
    if (done > total) log->overshot = 1;
    log->last_done = done;
    log->total = total;
    ++log->calls;
    return log->stop_at_call != 0 && log->calls >= log->stop_at_call;
}
