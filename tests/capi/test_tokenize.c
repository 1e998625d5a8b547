/* The model's tokenizer: tl_model_tokenizer, tl_tokenize, tl_detokenize. Byte-level on the committed fixture; the
 * tokenizers tests/text/make_tokenizer_cases.py writes (imported into models by CTest's text.make_models fixture)
 * against the script's independent reference ids (cases.tsv); buffer sizes, argument checks, invalid UTF-8, and
 * threads sharing one model. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "capi_test.h"

#ifndef TL_TOKENIZER_CASES_DIR
#error "TL_TOKENIZER_CASES_DIR must name the folder make_tokenizer_cases.py writes to"
#endif

TestSuite(tokenize, .timeout = 120);

static tl_model *load_model(const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/models/%s.tinyloop", TL_TOKENIZER_CASES_DIR, name);
    tl_model *model = NULL;
    tl_status status = tl_model_load(path, NULL, &model);
    cr_assert_eq(status, TL_OK, "load %s: %s (run CTest's text.make_models first)", path, tl_last_error_message());
    return model;
}

/* ---- cases.tsv: tokenizer, case, text (hex), ids, decoded (hex) ---- */

struct tok_case {
    char name[64];
    char *text;
    size_t text_len;
    int32_t *ids;
    size_t n_ids;
    char *decoded;
    size_t decoded_len;
};

static char *unhex(const char *hex, size_t hex_len, size_t *out_len) {
    char *out = malloc(hex_len / 2 + 1);
    cr_assert_not_null(out);
    for (size_t i = 0; i + 1 < hex_len; i += 2) {
        unsigned byte = 0;
        cr_assert_eq(sscanf(hex + i, "%2x", &byte), 1, "bad hex in cases.tsv");
        out[i / 2] = (char)byte;
    }
    *out_len = hex_len / 2;
    return out;
}

/* The cases of one tokenizer; returns their number. */
static size_t read_cases(const char *tokenizer, struct tok_case *cases, size_t max_cases) {
    char path[1024];
    snprintf(path, sizeof path, "%s/cases.tsv", TL_TOKENIZER_CASES_DIR);
    FILE *file = fopen(path, "rb");
    cr_assert_not_null(file, "cannot open %s", path);
    size_t n = 0, size = 1 << 16;
    char *line = malloc(size);
    cr_assert_not_null(line);
    while (fgets(line, (int)size, file) != NULL) {
        while (strchr(line, '\n') == NULL && !feof(file)) { /* a longer line: grow and read on */
            line = realloc(line, size * 2);
            cr_assert_not_null(line);
            cr_assert_not_null(fgets(line + strlen(line), (int)size + 1, file));
            size *= 2;
        }
        char *fields[5];
        char *at = line;
        for (int f = 0; f < 5; ++f) {
            fields[f] = at;
            char *end = strpbrk(at, f < 4 ? "\t" : "\n");
            if (end == NULL) end = at + strlen(at);
            *end = '\0';
            at = end + 1;
        }
        if (strcmp(fields[0], tokenizer) != 0) continue;
        cr_assert_lt(n, max_cases, "too many cases");
        struct tok_case *c = &cases[n++];
        snprintf(c->name, sizeof c->name, "%s", fields[1]);
        c->text = unhex(fields[2], strlen(fields[2]), &c->text_len);
        c->decoded = unhex(fields[4], strlen(fields[4]), &c->decoded_len);
        c->ids = malloc((strlen(fields[3]) / 2 + 1) * sizeof(int32_t));
        cr_assert_not_null(c->ids);
        c->n_ids = 0;
        for (char *token = strtok(fields[3], " "); token != NULL; token = strtok(NULL, " "))
            c->ids[c->n_ids++] = (int32_t)strtol(token, NULL, 10);
    }
    free(line);
    fclose(file);
    cr_assert_gt(n, 10, "cases.tsv has %zu cases of %s", n, tokenizer);
    return n;
}

static void free_cases(struct tok_case *cases, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        free(cases[i].text);
        free(cases[i].ids);
        free(cases[i].decoded);
    }
}

/* ---- Byte-level ---- */

Test(tokenize, a_model_without_a_tokenizer_reads_bytes) {
    tl_model *model = load_fixture();
    int32_t kind = -1, n_ids = -1;
    ASSERT_OK(tl_model_tokenizer(model, &kind, &n_ids));
    cr_assert_eq(kind, TL_TOKENIZER_BYTES);
    cr_assert_eq(n_ids, 256);
    ASSERT_OK(tl_model_tokenizer(model, &kind, NULL));

    const char text[] = "Hi\xff\x00!";
    int32_t ids[8];
    size_t n = 0;
    ASSERT_OK(tl_tokenize(model, text, 5, ids, 8, &n));
    cr_assert_eq(n, 5);
    const int32_t expected[] = {72, 105, 255, 0, 33};
    cr_assert_arr_eq(ids, expected, sizeof expected);

    char out[8];
    size_t len = 0;
    ASSERT_OK(tl_detokenize(model, ids, n, out, sizeof out, &len));
    cr_assert_eq(len, 5);
    cr_assert_arr_eq(out, text, 5);

    const int32_t bad[] = {7, 256};
    ASSERT_FAILS_NAMING(tl_detokenize(model, bad, 2, out, sizeof out, &len), TL_ERR_INVALID_ARGUMENT, "ids");
    cr_assert(strstr(tl_last_error_message(), "ids[1] = 256") != NULL, "%s", tl_last_error_message());
    tl_model_free(model);
}

/* Too small a buffer: TL_ERR_BUFFER_TOO_SMALL, the size needed in *out_n / *out_len, the buffer untouched. */
Test(tokenize, buffer_sizes) {
    tl_model *model = load_fixture();
    int32_t ids[4] = {-7, -7, -7, -7};
    size_t n = 0;
    ASSERT_FAILS_NAMING(tl_tokenize(model, "hello", 5, ids, 4, &n), TL_ERR_BUFFER_TOO_SMALL, "out_ids");
    cr_assert_eq(n, 5, "the size needed");
    for (int i = 0; i < 4; ++i) cr_assert_eq(ids[i], -7, "out_ids[%d] written on failure", i);
    n = 0;
    cr_assert_eq(tl_tokenize(model, "hello", 5, NULL, 0, &n), TL_ERR_BUFFER_TOO_SMALL);
    cr_assert_eq(n, 5);
    /* The empty text: no ids, and NULL pointers are fine. */
    n = 99;
    ASSERT_OK(tl_tokenize(model, NULL, 0, NULL, 0, &n));
    cr_assert_eq(n, 0);

    const int32_t hello[] = {104, 101, 108, 108, 111};
    char text[3] = {'x', 'x', 'x'};
    size_t len = 0;
    ASSERT_FAILS_NAMING(tl_detokenize(model, hello, 5, text, 3, &len), TL_ERR_BUFFER_TOO_SMALL, "out_text");
    cr_assert_eq(len, 5);
    cr_assert(text[0] == 'x' && text[1] == 'x' && text[2] == 'x', "out_text written on failure");
    cr_assert_eq(tl_detokenize(model, hello, 5, NULL, 0, &len), TL_ERR_BUFFER_TOO_SMALL);
    len = 99;
    ASSERT_OK(tl_detokenize(model, NULL, 0, NULL, 0, &len));
    cr_assert_eq(len, 0);
    tl_model_free(model);
}

Test(tokenize, arguments_are_checked) {
    tl_model *model = load_fixture();
    int32_t ids[4], kind;
    char text[4];
    size_t n;
    ASSERT_FAILS_NAMING(tl_model_tokenizer(NULL, &kind, NULL), TL_ERR_INVALID_ARGUMENT, "model");
    ASSERT_FAILS_NAMING(tl_model_tokenizer(model, NULL, NULL), TL_ERR_INVALID_ARGUMENT, "out_kind");
    ASSERT_FAILS_NAMING(tl_tokenize(NULL, "a", 1, ids, 4, &n), TL_ERR_INVALID_ARGUMENT, "model");
    ASSERT_FAILS_NAMING(tl_tokenize(model, NULL, 1, ids, 4, &n), TL_ERR_INVALID_ARGUMENT, "text");
    ASSERT_FAILS_NAMING(tl_tokenize(model, "a", 1, NULL, 4, &n), TL_ERR_INVALID_ARGUMENT, "out_ids");
    ASSERT_FAILS_NAMING(tl_tokenize(model, "a", 1, ids, 4, NULL), TL_ERR_INVALID_ARGUMENT, "out_n");
    ASSERT_FAILS_NAMING(tl_detokenize(NULL, ids, 0, text, 4, &n), TL_ERR_INVALID_ARGUMENT, "model");
    ASSERT_FAILS_NAMING(tl_detokenize(model, NULL, 1, text, 4, &n), TL_ERR_INVALID_ARGUMENT, "ids");
    ASSERT_FAILS_NAMING(tl_detokenize(model, ids, 0, NULL, 4, &n), TL_ERR_INVALID_ARGUMENT, "out_text");
    ASSERT_FAILS_NAMING(tl_detokenize(model, ids, 0, text, 4, NULL), TL_ERR_INVALID_ARGUMENT, "out_len");
    tl_model_free(model);
}

/* ---- Stored tokenizers against the reference ---- */

static void check_reference(const char *name, int32_t expected_kind) {
    tl_model *model = load_model(name);
    int32_t kind = -1, n_ids = 0;
    ASSERT_OK(tl_model_tokenizer(model, &kind, &n_ids));
    cr_assert_eq(kind, expected_kind, "%s", name);
    tl_model_properties properties;
    properties.struct_size = sizeof properties;
    ASSERT_OK(tl_model_info(model, &properties));
    cr_assert(n_ids > 256 && n_ids <= properties.vocab, "%s: %d ids, vocab %d", name, n_ids, properties.vocab);

    static struct tok_case cases[64];
    const size_t n_cases = read_cases(name, cases, 64);
    for (size_t i = 0; i < n_cases; ++i) {
        const struct tok_case *c = &cases[i];
        size_t n = 0;
        tl_status status = tl_tokenize(model, c->text, c->text_len, NULL, 0, &n);
        cr_assert(status == (c->n_ids == 0 ? TL_OK : TL_ERR_BUFFER_TOO_SMALL), "%s / %s: %s", name, c->name,
                  tl_last_error_message());
        cr_assert_eq(n, c->n_ids, "%s / %s: %zu ids, the reference has %zu", name, c->name, n, c->n_ids);
        int32_t *ids = malloc((n + 1) * sizeof *ids);
        ASSERT_OK(tl_tokenize(model, c->text, c->text_len, ids, n, &n));
        for (size_t j = 0; j < n; ++j)
            cr_assert_eq(ids[j], c->ids[j], "%s / %s: ids[%zu] = %d, the reference has %d", name, c->name, j, ids[j],
                         c->ids[j]);
        size_t len = 0;
        char *text = malloc(c->decoded_len + 1);
        ASSERT_OK(tl_detokenize(model, c->ids, c->n_ids, text, c->decoded_len + 1, &len));
        cr_assert_eq(len, c->decoded_len, "%s / %s: decoded length", name, c->name);
        cr_assert(memcmp(text, c->decoded, len) == 0, "%s / %s: decoded text differs", name, c->name);
        free(ids);
        free(text);
    }
    free_cases(cases, n_cases);

    /* Not UTF-8: refused, naming the offset. */
    int32_t ids[16];
    size_t n;
    ASSERT_FAILS_NAMING(tl_tokenize(model, "ab\xe9z", 4, ids, 16, &n), TL_ERR_INVALID_ARGUMENT, "UTF");
    cr_assert(strstr(tl_last_error_message(), "byte 2") != NULL, "%s", tl_last_error_message());
    const int32_t bad[] = {1, n_ids};
    char text[64];
    ASSERT_FAILS_NAMING(tl_detokenize(model, bad, 2, text, sizeof text, &n), TL_ERR_INVALID_ARGUMENT, "ids");
    tl_model_free(model);
}

Test(tokenize, gpt2_style_bpe) { check_reference("gpt2", TL_TOKENIZER_HUGGINGFACE); }
Test(tokenize, llama3_style_bpe) { check_reference("llama3", TL_TOKENIZER_HUGGINGFACE); }
Test(tokenize, qwen2_style_bpe_with_nfc) { check_reference("qwen2", TL_TOKENIZER_HUGGINGFACE); }
Test(tokenize, sentencepiece) { check_reference("sentencepiece", TL_TOKENIZER_SENTENCEPIECE); }

/* ---- Threads ---- */

struct thread_job {
    const tl_model *model;
    const struct tok_case *cases;
    size_t n_cases;
    int failures;
};

static void *tokenize_all(void *arg) {
    struct thread_job *job = arg;
    int32_t ids[4096];
    for (int round = 0; round < 10; ++round) {
        for (size_t i = 0; i < job->n_cases; ++i) {
            size_t n = 0;
            const struct tok_case *c = &job->cases[i];
            if (tl_tokenize(job->model, c->text, c->text_len, ids, 4096, &n) != TL_OK || n != c->n_ids ||
                memcmp(ids, c->ids, n * sizeof *ids) != 0)
                ++job->failures;
        }
    }
    return NULL;
}

Test(tokenize, threads_share_one_model) {
    tl_model *model = load_model("llama3");
    static struct tok_case cases[64];
    const size_t n_cases = read_cases("llama3", cases, 64);
    struct thread_job jobs[4];
    pthread_t threads[4];
    for (int t = 0; t < 4; ++t) {
        jobs[t] = (struct thread_job){model, cases, n_cases, 0};
        cr_assert_eq(pthread_create(&threads[t], NULL, tokenize_all, &jobs[t]), 0);
    }
    for (int t = 0; t < 4; ++t) {
        pthread_join(threads[t], NULL);
        cr_assert_eq(jobs[t].failures, 0, "thread %d: %d wrong results", t, jobs[t].failures);
    }
    free_cases(cases, n_cases);
    tl_model_free(model);
}
