/* Status strings, per-thread error messages, version and build info, logging, and the fact that the calls
 * really go through the shared library. */
#define _GNU_SOURCE /* dladdr */

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>

#include "capi_test.h"

/* TL_* are `static const` objects, not constant expressions in C: the list is a local array. */
#define ALL_STATUSES                                                                                         \
    {TL_OK, TL_ERR_INVALID_ARGUMENT, TL_ERR_OUT_OF_MEMORY, TL_ERR_IO, TL_ERR_FORMAT, TL_ERR_UNSUPPORTED,    \
     TL_ERR_NO_DEVICE, TL_ERR_CUDA, TL_ERR_INTERNAL, TL_ERR_BUFFER_TOO_SMALL, TL_ERR_NOT_FOUND, TL_ERR_CANCELLED}
#define N_STATUSES 12

Test(status, every_code_has_a_distinct_nonempty_string) {
    const tl_status all_statuses[N_STATUSES] = ALL_STATUSES;
    for (size_t i = 0; i < N_STATUSES; ++i) {
        const char *text = tl_status_string(all_statuses[i]);
        cr_assert_not_null(text, "status %d", (int)all_statuses[i]);
        cr_assert_str_not_empty(text, "status %d", (int)all_statuses[i]);
        for (size_t j = 0; j < i; ++j) {
            cr_assert_str_neq(text, tl_status_string(all_statuses[j]), "statuses %d and %d share \"%s\"",
                              (int)all_statuses[i], (int)all_statuses[j], text);
        }
    }
}

Test(status, unknown_values_give_a_string_of_their_own) {
    const tl_status all_statuses[N_STATUSES] = ALL_STATUSES;
    const tl_status unknown[] = {1, 42, -12, -1000, INT32_MIN, INT32_MAX};
    for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); ++i) {
        const char *text = tl_status_string(unknown[i]);
        cr_assert_not_null(text, "status %d", (int)unknown[i]);
        cr_assert(strstr(text, "unknown") != NULL, "status %d gives \"%s\"", (int)unknown[i], text);
        for (size_t j = 0; j < N_STATUSES; ++j) cr_assert_str_neq(text, tl_status_string(all_statuses[j]));
    }
}

Test(last_error, is_empty_before_any_call_and_after_success) {
    cr_assert_str_empty(tl_last_error_message());
    tl_model *model = NULL;
    cr_assert_neq(tl_model_load(NULL, NULL, &model), TL_OK);
    cr_assert_str_not_empty(tl_last_error_message());
    tl_load_options options;
    ASSERT_OK(tl_load_options_init(&options, sizeof options));
}

Test(last_error, survives_calls_that_return_no_status) {
    tl_model *model = NULL;
    cr_assert_neq(tl_model_load(NULL, NULL, &model), TL_OK);
    const char *before = tl_last_error_message();
    char saved[512];
    snprintf(saved, sizeof saved, "%s", before);
    /* Only status-returning calls reset the message. */
    (void)tl_status_string(TL_ERR_IO);
    (void)tl_version();
    cr_assert_str_eq(tl_last_error_message(), saved);
}

/* Three threads: A and B fail differently and both read after both failed; C only succeeds. */
struct message_thread {
    pthread_barrier_t *barrier;
    const char *missing_path; /* NULL: this thread makes only successful calls */
    tl_status status;
    char message[512];
};

static void *message_thread_main(void *arg) {
    struct message_thread *t = arg;
    if (t->missing_path != NULL) {
        tl_model *model = NULL;
        t->status = tl_model_load(t->missing_path, NULL, &model);
    } else {
        tl_score_options options;
        t->status = tl_score_options_init(&options, sizeof options);
    }
    pthread_barrier_wait(t->barrier);
    /* Every thread has made its call; a shared message would now hold whichever came last. */
    snprintf(t->message, sizeof t->message, "%s", tl_last_error_message());
    pthread_barrier_wait(t->barrier);
    return NULL;
}

Test(last_error, is_per_thread) {
    pthread_barrier_t barrier;
    cr_assert_eq(pthread_barrier_init(&barrier, NULL, 3), 0);
    struct message_thread threads[3] = {
        {&barrier, "/nonexistent-dir/thread-a-model.tinyloop", 0, ""},
        {&barrier, "/nonexistent-dir/thread-b-other.tinyloop", 0, ""},
        {&barrier, NULL, 0, ""},
    };
    pthread_t ids[3];
    for (int i = 0; i < 3; ++i) cr_assert_eq(pthread_create(&ids[i], NULL, message_thread_main, &threads[i]), 0);
    for (int i = 0; i < 3; ++i) cr_assert_eq(pthread_join(ids[i], NULL), 0);
    pthread_barrier_destroy(&barrier);

    cr_assert_eq(threads[0].status, TL_ERR_IO);
    cr_assert_eq(threads[1].status, TL_ERR_IO);
    cr_assert_eq(threads[2].status, TL_OK);
    cr_assert(strstr(threads[0].message, "thread-a-model") != NULL, "thread A read \"%s\"", threads[0].message);
    cr_assert(strstr(threads[0].message, "thread-b-other") == NULL, "thread A read \"%s\"", threads[0].message);
    cr_assert(strstr(threads[1].message, "thread-b-other") != NULL, "thread B read \"%s\"", threads[1].message);
    cr_assert(strstr(threads[1].message, "thread-a-model") == NULL, "thread B read \"%s\"", threads[1].message);
    cr_assert_str_empty(threads[2].message, "thread C read \"%s\"", threads[2].message);
    /* This thread made no call at all. */
    cr_assert_str_empty(tl_last_error_message());
}

Test(version, matches_the_header_and_the_build) {
    const uint32_t expected = ((uint32_t)TL_VERSION_MAJOR << 16) | ((uint32_t)TL_VERSION_MINOR << 8) |
                              (uint32_t)TL_VERSION_PATCH;
    cr_assert_eq(tl_version(), expected, "tl_version() 0x%x, header 0x%x", tl_version(), expected);
    char text[64];
    snprintf(text, sizeof text, "%d.%d.%d", TL_VERSION_MAJOR, TL_VERSION_MINOR, TL_VERSION_PATCH);
    cr_assert_str_eq(tl_version_string(), text);
    /* The header's macros and the CMake project version must not drift apart either. */
    cr_assert_str_eq(text, TL_TEST_PROJECT_VERSION);
}

Test(build_info, is_a_json_object_with_the_documented_keys) {
    const char *info = tl_build_info();
    cr_assert_not_null(info);
    const size_t length = strlen(info);
    cr_assert(length >= 2 && info[0] == '{' && info[length - 1] == '}', "not a JSON object: %s", info);
    const char *keys[] = {"\"version\"", "\"compiler\"", "\"cuda\"", "\"cuda_version\"", "\"cuda_architectures\"",
                          "\"build_type\""};
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); ++i)
        cr_assert(strstr(info, keys[i]) != NULL, "no %s in %s", keys[i], info);
    char quoted_version[80];
    snprintf(quoted_version, sizeof quoted_version, "\"%s\"", tl_version_string());
    cr_assert(strstr(info, quoted_version) != NULL, "version %s not in %s", quoted_version, info);
    (void)build_has_cuda(); /* asserts that "cuda" is a bool */
    cr_assert_eq(tl_build_info(), info, "tl_build_info() must return the same static string");
}

Test(shared_library, serves_the_calls) {
    /* The suite must exercise the exported ABI, not a statically linked copy of the core. */
    Dl_info where;
    cr_assert_neq(dladdr((void *)(uintptr_t)&tl_version, &where), 0);
    cr_assert_not_null(where.dli_fname);
    cr_assert(strstr(where.dli_fname, "libtinyloop.so") != NULL, "tl_version comes from %s", where.dli_fname);
}

/* ---- Logging ---- */

struct log_record {
    int calls;
    int32_t lowest_level;
    int32_t highest_level;
    int bad_user_data;
    int bad_message;
};

static struct log_record log_seen;

static void record_log(void *user_data, int32_t level, const char *message) {
    if (user_data != &log_seen) log_seen.bad_user_data = 1;
    const size_t length = message == NULL ? 0 : strlen(message);
    if (message == NULL || (length > 0 && message[length - 1] == '\n')) log_seen.bad_message = 1;
    if (log_seen.calls == 0 || level < log_seen.lowest_level) log_seen.lowest_level = level;
    if (log_seen.calls == 0 || level > log_seen.highest_level) log_seen.highest_level = level;
    ++log_seen.calls;
}

/* Loads, scores and fails a load: whatever the library logs on the way goes to the callback. */
static void exercise_library(void) {
    tl_model *model = load_fixture();
    int32_t tokens[8];
    random_tokens(tokens, 8, FIXTURE_VOCAB);
    tl_score_options options;
    tl_score_options_init(&options, sizeof options);
    options.backend = TL_BACKEND_CPU;
    tl_score_result result;
    tl_score_result_init(&result, sizeof result);
    ASSERT_OK(tl_score(model, tokens, 8, &options, &result));
    tl_model_free(model);
    tl_model *missing = NULL;
    cr_assert_eq(tl_model_load("/nonexistent-dir/log.tinyloop", NULL, &missing), TL_ERR_IO);
}

Test(log, callback_receives_only_levels_up_to_max, .init = rng_seed_from_env) {
    ASSERT_OK(tl_set_log_callback(record_log, &log_seen, TL_LOG_DEBUG));
    exercise_library();
    cr_assert_eq(log_seen.bad_user_data, 0, "the callback got another user_data");
    cr_assert_eq(log_seen.bad_message, 0, "a message was NULL or ended in a newline");
    if (log_seen.calls > 0) {
        cr_assert_geq(log_seen.lowest_level, TL_LOG_ERROR);
        cr_assert_leq(log_seen.highest_level, TL_LOG_DEBUG);
    }

    memset(&log_seen, 0, sizeof log_seen);
    ASSERT_OK(tl_set_log_callback(record_log, &log_seen, TL_LOG_ERROR));
    exercise_library();
    if (log_seen.calls > 0) cr_assert_eq(log_seen.highest_level, TL_LOG_ERROR);
}

Test(log, unset_callback_is_not_called, .init = rng_seed_from_env) {
    ASSERT_OK(tl_set_log_callback(record_log, &log_seen, TL_LOG_DEBUG));
    ASSERT_OK(tl_set_log_callback(NULL, NULL, TL_LOG_DEBUG));
    exercise_library();
    cr_assert_eq(log_seen.calls, 0, "an unset callback was called %d times", log_seen.calls);
}

/* The log callback must not call into the library: such a call returns TL_ERR_UNSUPPORTED at once (no deadlock on
 * the locks held while logging), and the library keeps working. */
static tl_status inner_status = TL_OK;
static int inner_calls = 0;

static void call_back_in(void *user_data, int32_t level, const char *message) {
    (void)user_data;
    (void)level;
    (void)message;
    ++inner_calls;
    inner_status = tl_set_log_callback(NULL, NULL, TL_LOG_ERROR);
}

Test(log, callback_calling_the_library_gets_a_status) {
    ASSERT_OK(tl_set_log_callback(call_back_in, NULL, TL_LOG_DEBUG));
    tl_model *missing = NULL;
    cr_assert_eq(tl_model_load("/nonexistent-dir/log.tinyloop", NULL, &missing), TL_ERR_IO);
    exercise_library();
    ASSERT_OK(tl_set_log_callback(NULL, NULL, TL_LOG_ERROR));
    cr_assert_gt(inner_calls, 0, "tl_score logs its summary at TL_LOG_DEBUG");
    cr_assert_eq(inner_status, TL_ERR_UNSUPPORTED, "got %d", (int)inner_status);
    cr_assert_str_eq(tl_status_string(TL_ERR_UNSUPPORTED), "unsupported");
}
