/* struct_size of every options, result and properties struct: the full size works; 0, a size holding nothing
 * but struct_size (smaller than any version), and a size larger than the library knows are
 * TL_ERR_INVALID_ARGUMENT naming struct_size. Each struct sits at the start of a larger zeroed buffer so
 * that a library that ignored the size could not write past the caller's memory.
 * The *_init functions take the caller's size: they run on a struct at the start of a larger buffer filled
 * with a random sentinel byte, and must never change a byte past the size they were given (none at all when
 * they reject it). */
#include "capi_test.h"

static tl_model *model;

static void setup(void) { model = load_fixture(); }
static void teardown(void) { tl_model_free(model); }

TestSuite(struct_size, .init = setup, .fini = teardown);

static tl_status load_with(uint32_t size) {
    struct { tl_load_options s; unsigned char spare[SPARE_BYTES]; } buffer;
    memset(&buffer, 0, sizeof buffer);
    tl_load_options_init(&buffer.s, sizeof buffer.s);
    buffer.s.struct_size = size;
    tl_model *loaded = (tl_model *)(uintptr_t)0x1;
    const tl_status status = tl_model_load(fixture_path(), &buffer.s, &loaded);
    if (status == TL_OK) {
        tl_model_free(loaded);
    } else {
        cr_assert_null(loaded, "*out_model must be NULL after a failed load");
    }
    return status;
}

static tl_status model_info_with(uint32_t size) {
    struct { tl_model_properties s; unsigned char spare[SPARE_BYTES]; } buffer;
    memset(&buffer, 0, sizeof buffer);
    buffer.s.struct_size = size;
    return tl_model_info(model, &buffer.s);
}

static tl_status create_with(uint32_t size) {
    uint8_t codes[4 * 8 / 2] = {0};
    const uint16_t scales[4] = {0x3C00, 0x3C00, 0x3C00, 0x3C00}, zeros[4] = {0};
    struct { tl_weight_desc s; unsigned char spare[SPARE_BYTES]; } buffer;
    memset(&buffer, 0, sizeof buffer);
    tl_weight_desc_init(&buffer.s, sizeof buffer.s);
    buffer.s.struct_size = size;
    buffer.s.k = 8;
    buffer.s.n = 4;
    buffer.s.codes = codes;
    buffer.s.scales = scales;
    buffer.s.zeros = zeros;
    tl_weight *weight = NULL;
    const tl_status status = tl_weight_create(&buffer.s, &weight);
    tl_weight_free(weight);
    return status;
}

static const float kSmallMatrix[4 * 8] = {1, 2, 3, 4, 5, 6, 7, 8, -1, -2, -3, -4, 0, 0, 0, 1};

static tl_status quantize_with(uint32_t size) {
    struct { tl_quantize_options s; unsigned char spare[SPARE_BYTES]; } buffer;
    memset(&buffer, 0, sizeof buffer);
    tl_quantize_options_init(&buffer.s, sizeof buffer.s);
    buffer.s.struct_size = size;
    tl_weight *weight = NULL;
    const tl_status status = tl_weight_quantize(kSmallMatrix, 8, 4, &buffer.s, &weight);
    tl_weight_free(weight);
    return status;
}

static tl_status weight_info_with(uint32_t size) {
    tl_weight *weight = NULL;
    ASSERT_OK(tl_weight_quantize(kSmallMatrix, 8, 4, NULL, &weight));
    struct { tl_weight_properties s; unsigned char spare[SPARE_BYTES]; } buffer;
    memset(&buffer, 0, sizeof buffer);
    buffer.s.struct_size = size;
    const tl_status status = tl_weight_info(weight, &buffer.s);
    tl_weight_free(weight);
    return status;
}

static const int32_t kTokens[5] = {1, 2, 3, 4, 5};

static tl_status score_options_with(uint32_t size) {
    struct { tl_score_options s; unsigned char spare[SPARE_BYTES]; } buffer;
    memset(&buffer, 0, sizeof buffer);
    tl_score_options_init(&buffer.s, sizeof buffer.s);
    buffer.s.struct_size = size;
    buffer.s.backend = TL_BACKEND_CPU;
    tl_score_result result;
    tl_score_result_init(&result, sizeof result);
    return tl_score(model, kTokens, 5, &buffer.s, &result);
}

static tl_status score_result_with(uint32_t size) {
    tl_score_options options;
    tl_score_options_init(&options, sizeof options);
    options.backend = TL_BACKEND_CPU;
    struct { tl_score_result s; unsigned char spare[SPARE_BYTES]; } buffer;
    memset(&buffer, 0, sizeof buffer);
    buffer.s.struct_size = size;
    return tl_score(model, kTokens, 5, &options, &buffer.s);
}

static void assert_checks_struct_size(tl_status (*call)(uint32_t), uint32_t full_size, const char *what) {
    const tl_status ok = call(full_size);
    cr_assert_eq(ok, TL_OK, "%s with its full size: %s: %s", what, tl_status_string(ok), tl_last_error_message());
    assert_rejects_wrong_struct_size(call, full_size, what);
}

static void assert_checks_output_size(tl_status (*call)(uint32_t), uint32_t full_size, const char *what) {
    const tl_status ok = call(full_size);
    cr_assert_eq(ok, TL_OK, "%s with its full size: %s: %s", what, tl_status_string(ok), tl_last_error_message());
    assert_output_struct_size(call, full_size, what);
}

Test(struct_size, tl_load_options) { assert_checks_struct_size(load_with, sizeof(tl_load_options), "tl_model_load"); }
/* tl_model_properties gained bos_token_id after its first version: any size from the first one on. */
Test(struct_size, tl_model_properties) {
    assert_checks_output_size(model_info_with, (uint32_t)offsetof(tl_model_properties, bos_token_id), "tl_model_info");
    cr_assert_eq(model_info_with(sizeof(tl_model_properties)), TL_OK, "%s", tl_last_error_message());
}

static tl_status compare_options_with(uint32_t size) {
    struct { tl_compare_options s; unsigned char spare[SPARE_BYTES]; } buffer;
    memset(&buffer, 0, sizeof buffer);
    tl_compare_options_init(&buffer.s, sizeof buffer.s);
    buffer.s.struct_size = size;
    buffer.s.backend = TL_BACKEND_CPU;
    tl_compare_result result;
    tl_compare_result_init(&result, sizeof result);
    return tl_score_compare(model, model, kTokens, 5, &buffer.s, &result);
}

static tl_status compare_result_with(uint32_t size) {
    tl_compare_options options;
    tl_compare_options_init(&options, sizeof options);
    options.backend = TL_BACKEND_CPU;
    struct { tl_compare_result s; unsigned char spare[SPARE_BYTES]; } buffer;
    memset(&buffer, 0, sizeof buffer);
    buffer.s.struct_size = size;
    return tl_score_compare(model, model, kTokens, 5, &options, &buffer.s);
}

Test(struct_size, tl_compare_options) {
    assert_checks_struct_size(compare_options_with, sizeof(tl_compare_options), "tl_score_compare (options)");
}
Test(struct_size, tl_compare_result) {
    assert_checks_output_size(compare_result_with, sizeof(tl_compare_result), "tl_score_compare (result)");
}
Test(struct_size, tl_weight_desc) { assert_checks_struct_size(create_with, sizeof(tl_weight_desc), "tl_weight_create"); }
Test(struct_size, tl_quantize_options) {
    assert_checks_struct_size(quantize_with, sizeof(tl_quantize_options), "tl_weight_quantize");
}
Test(struct_size, tl_weight_properties) {
    assert_checks_output_size(weight_info_with, sizeof(tl_weight_properties), "tl_weight_info");
}
Test(struct_size, tl_score_options) {
    assert_checks_struct_size(score_options_with, sizeof(tl_score_options), "tl_score (options)");
}
/* tl_score_result gained setup_seconds and graph_capture_seconds after its first version: any size from the first
 * version's on is accepted, below it refused. */
Test(struct_size, tl_score_result) {
    assert_checks_output_size(score_result_with, (uint32_t)offsetof(tl_score_result, setup_seconds),
                              "tl_score (out_result)");
    cr_assert_eq(score_result_with(sizeof(tl_score_result)), TL_OK, "%s", tl_last_error_message());
}

/* A caller built against the first version gets the fields it has, and nothing is written past them. */
Test(struct_size, tl_score_result_of_the_first_version) {
    const uint32_t first = (uint32_t)offsetof(tl_score_result, setup_seconds);
    struct { tl_score_result s; unsigned char spare[SPARE_BYTES]; } result;
    memset(&result, 0x5A, sizeof result);
    result.s.struct_size = first;
    tl_score_options options;
    tl_score_options_init(&options, sizeof options);
    options.backend = TL_BACKEND_CPU;
    ASSERT_OK(tl_score(model, kTokens, 5, &options, &result.s));
    cr_assert_eq(result.s.struct_size, first);
    cr_assert_eq(result.s.tokens_scored, 4);
    const unsigned char *bytes = (const unsigned char *)&result;
    for (size_t i = first; i < sizeof result; ++i) cr_assert_eq(bytes[i], 0x5A, "tl_score wrote byte %zu", i);
}

/* A caller built against a newer header passes a larger output struct: the library writes only the bytes it knows,
 * says how many in struct_size, and leaves the rest of the caller's struct alone. */
Test(struct_size, larger_output_structs_get_the_known_fields) {
    struct { tl_model_properties s; unsigned char spare[SPARE_BYTES]; } info;
    memset(&info, 0xA5, sizeof info);
    info.s.struct_size = sizeof info;
    ASSERT_OK(tl_model_info(model, &info.s));
    cr_assert_eq(info.s.struct_size, sizeof info.s);
    cr_assert_eq(info.s.vocab, FIXTURE_VOCAB);
    for (size_t i = 0; i < SPARE_BYTES; ++i) cr_assert_eq(info.spare[i], 0xA5, "tl_model_info wrote spare byte %zu", i);

    struct { tl_score_result s; unsigned char spare[SPARE_BYTES]; } result;
    memset(&result, 0x5A, sizeof result);
    result.s.struct_size = sizeof result;
    tl_score_options options;
    tl_score_options_init(&options, sizeof options);
    options.backend = TL_BACKEND_CPU;
    ASSERT_OK(tl_score(model, kTokens, 5, &options, &result.s));
    cr_assert_eq(result.s.struct_size, sizeof result.s);
    cr_assert_eq(result.s.tokens_scored, 4);
    for (size_t i = 0; i < SPARE_BYTES; ++i) cr_assert_eq(result.spare[i], 0x5A, "tl_score wrote spare byte %zu", i);
}

/* tl_score_options gained max_memory_bytes after its first version: a caller built against the first version (its
 * struct ends at use_graphs) is accepted and gets the default, while sizes between the versions are refused. */
Test(struct_size, tl_score_options_of_the_first_version) {
    const uint32_t first = (uint32_t)offsetof(tl_score_options, max_memory_bytes);
    cr_assert_eq(score_options_with(first), TL_OK, "%s", tl_last_error_message());
    cr_assert_eq(score_options_with(first + 4), TL_ERR_INVALID_ARGUMENT);
    cr_assert(contains_word(tl_last_error_message(), "struct_size"), "%s", tl_last_error_message());
}

/* Adapters giving every *_init one type, so one checker walks them all. */
typedef tl_status (*init_fn)(void *, uint32_t);
static tl_status init_load_options(void *s, uint32_t size) { return tl_load_options_init(s, size); }
static tl_status init_weight_desc(void *s, uint32_t size) { return tl_weight_desc_init(s, size); }
static tl_status init_quantize_options(void *s, uint32_t size) { return tl_quantize_options_init(s, size); }
static tl_status init_pack_options(void *s, uint32_t size) { return tl_pack_options_init(s, size); }
static tl_status init_pack_report(void *s, uint32_t size) { return tl_pack_report_init(s, size); }
static tl_status init_score_options(void *s, uint32_t size) { return tl_score_options_init(s, size); }
static tl_status init_score_result(void *s, uint32_t size) { return tl_score_result_init(s, size); }
static tl_status init_import_options(void *s, uint32_t size) { return tl_import_options_init(s, size); }

#define INIT_BUFFER_BYTES 1024

/* Aligned for any of the structs (they hold pointers, doubles and 64-bit integers). */
union init_buffer {
    void *align_pointer;
    double align_double;
    uint64_t align_u64;
    unsigned char bytes[INIT_BUFFER_BYTES];
};

static void assert_untouched_from(const union init_buffer *buffer, size_t from, unsigned char sentinel,
                                  const char *what, uint32_t size) {
    for (size_t i = from; i < INIT_BUFFER_BYTES; ++i) {
        cr_assert_eq(buffer->bytes[i], sentinel, "%s with struct_size %u changed byte %zu (0x%02x, sentinel 0x%02x)",
                     what, size, i, buffer->bytes[i], sentinel);
    }
}

static void assert_init_respects_size(init_fn init, uint32_t full_size, const char *what) {
    cr_assert_leq(full_size + 2 * SPARE_BYTES, INIT_BUFFER_BYTES, "%s: grow INIT_BUFFER_BYTES", what);
    const unsigned char sentinel = (unsigned char)(1 + rng_below(255));
    union init_buffer buffer, over_zeros;

    memset(buffer.bytes, sentinel, sizeof buffer.bytes);
    const tl_status ok = init(buffer.bytes, full_size);
    cr_assert_eq(ok, TL_OK, "%s with its full size: %s: %s", what, tl_status_string(ok), tl_last_error_message());
    uint32_t written_size;
    memcpy(&written_size, buffer.bytes, sizeof written_size);
    cr_assert_eq(written_size, full_size, "%s set struct_size to %u, expected %u", what, written_size, full_size);
    assert_untouched_from(&buffer, full_size, sentinel, what, full_size);
    /* Every byte within the size is the library's own: the same as an init over zeros, sentinel-free. */
    memset(over_zeros.bytes, 0, sizeof over_zeros.bytes);
    cr_assert_eq(init(over_zeros.bytes, full_size), TL_OK, "%s over zeros", what);
    cr_assert_arr_eq(buffer.bytes, over_zeros.bytes, full_size, "%s left caller bytes inside the struct", what);

    const uint32_t wrong[] = {0, (uint32_t)sizeof(uint32_t), full_size - 1, full_size + 1, full_size + SPARE_BYTES};
    for (size_t i = 0; i < sizeof(wrong) / sizeof(wrong[0]); ++i) {
        memset(buffer.bytes, sentinel, sizeof buffer.bytes);
        const tl_status status = init(buffer.bytes, wrong[i]);
        cr_assert_eq(status, TL_ERR_INVALID_ARGUMENT, "%s with struct_size %u: %d (%s)", what, wrong[i], (int)status,
                     tl_status_string(status));
        cr_assert(contains_word(tl_last_error_message(), "struct_size"), "%s with struct_size %u: message \"%s\"",
                  what, wrong[i], tl_last_error_message());
        assert_untouched_from(&buffer, 0, sentinel, what, wrong[i]);
    }
}

TestSuite(init_struct_size, .init = rng_seed_from_env);

Test(init_struct_size, tl_load_options_init) {
    assert_init_respects_size(init_load_options, sizeof(tl_load_options), "tl_load_options_init");
}
Test(init_struct_size, tl_weight_desc_init) {
    assert_init_respects_size(init_weight_desc, sizeof(tl_weight_desc), "tl_weight_desc_init");
}
Test(init_struct_size, tl_quantize_options_init) {
    assert_init_respects_size(init_quantize_options, sizeof(tl_quantize_options), "tl_quantize_options_init");
}
Test(init_struct_size, tl_pack_options_init) {
    assert_init_respects_size(init_pack_options, sizeof(tl_pack_options), "tl_pack_options_init");
}
Test(init_struct_size, tl_pack_report_init) {
    assert_init_respects_size(init_pack_report, sizeof(tl_pack_report), "tl_pack_report_init");
}
Test(init_struct_size, tl_score_options_init) {
    assert_init_respects_size(init_score_options, sizeof(tl_score_options), "tl_score_options_init");
}
Test(init_struct_size, tl_score_result_init) {
    assert_init_respects_size(init_score_result, sizeof(tl_score_result), "tl_score_result_init");
}
Test(init_struct_size, tl_import_options_init) {
    assert_init_respects_size(init_import_options, sizeof(tl_import_options), "tl_import_options_init");
}
