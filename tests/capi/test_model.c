/* Models: tl_load_options_init, tl_model_load, tl_model_free, tl_model_info, tl_model_weight_count,
 * tl_model_weight_at, tl_model_find_weight, and weights borrowed from a model. */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "capi_test.h"

static const char *const kWeightNames[FIXTURE_N_QUANT_WEIGHTS] = {
    "pre.0.attn_qkv", "pre.0.attn_out", "pre.0.mlp_gate", "pre.0.mlp_up", "pre.0.mlp_down",
    "loop.attn_qkv",  "loop.attn_out",  "loop.mlp_gate",  "loop.mlp_up",  "loop.mlp_down",
};

/* (k, n) of the block's five linears, from the fixture's configuration. */
static void expected_shape(size_t index, int32_t *k, int32_t *n) {
    const int32_t attn = FIXTURE_N_HEADS * FIXTURE_HEAD_DIM;
    const int32_t shapes[5][2] = {
        {FIXTURE_D_MODEL, 3 * attn}, {attn, FIXTURE_D_MODEL}, {FIXTURE_D_MODEL, FIXTURE_FFN},
        {FIXTURE_D_MODEL, FIXTURE_FFN}, {FIXTURE_FFN, FIXTURE_D_MODEL},
    };
    *k = shapes[index % 5][0];
    *n = shapes[index % 5][1];
}

/* ---- tl_load_options_init / tl_model_load / tl_model_free ---- */

Test(load_options_init, fills_the_defaults) {
    tl_load_options options;
    memset(&options, 0x5A, sizeof options);
    ASSERT_OK(tl_load_options_init(&options, sizeof options));
    cr_assert_eq(options.struct_size, sizeof options);
    cr_assert_eq(options.use_mmap, 1);
    cr_assert_eq(options.validate_values, 1);
    ASSERT_FAILS_NAMING(tl_load_options_init(NULL, sizeof(tl_load_options)), TL_ERR_INVALID_ARGUMENT, "options");
}

Test(model_load, missing_file_is_an_io_error_naming_the_path) {
    const char *path = "/nonexistent-dir/missing-model.tinyloop";
    tl_model *model = (tl_model *)(uintptr_t)0x1;
    const tl_status status = tl_model_load(path, NULL, &model);
    cr_assert_eq(status, TL_ERR_IO, "got %d (%s): %s", (int)status, tl_status_string(status), tl_last_error_message());
    cr_assert(strstr(tl_last_error_message(), path) != NULL, "message \"%s\" lacks the path", tl_last_error_message());
    cr_assert_null(model, "*out_model must be NULL after a failed load");
}

Test(model_load, a_directory_is_an_io_error) {
    tl_model *model = (tl_model *)(uintptr_t)0x1;
    ASSERT_FAILS_NAMING(tl_model_load(TL_TEST_SCRATCH_DIR, NULL, &model), TL_ERR_IO, TL_TEST_SCRATCH_DIR);
    cr_assert_null(model);
}

Test(model_load, garbage_is_a_format_error) {
    char path[512];
    scratch_path(path, sizeof path, "garbage");
    FILE *file = fopen(path, "wb");
    cr_assert_not_null(file);
    /* A safetensors header length followed by text that is not JSON. */
    const unsigned char header_length[8] = {16, 0, 0, 0, 0, 0, 0, 0};
    fwrite(header_length, 1, sizeof header_length, file);
    fputs("this is not json", file);
    fclose(file);
    tl_model *model = (tl_model *)(uintptr_t)0x1;
    const tl_status status = tl_model_load(path, NULL, &model);
    unlink(path);
    cr_assert_eq(status, TL_ERR_FORMAT, "got %d (%s): %s", (int)status, tl_status_string(status), tl_last_error_message());
    cr_assert_str_not_empty(tl_last_error_message());
    cr_assert_null(model);
}

Test(model_load, rejects_null_and_bad_options) {
    tl_model *model = NULL;
    ASSERT_FAILS_NAMING(tl_model_load(NULL, NULL, &model), TL_ERR_INVALID_ARGUMENT, "path");
    ASSERT_FAILS_NAMING(tl_model_load(fixture_path(), NULL, NULL), TL_ERR_INVALID_ARGUMENT, "out_model");
    tl_load_options options;
    ASSERT_OK(tl_load_options_init(&options, sizeof options));
    options.use_mmap = 2;
    ASSERT_FAILS_NAMING(tl_model_load(fixture_path(), &options, &model), TL_ERR_INVALID_ARGUMENT, "use_mmap");
    options.use_mmap = 1;
    options.validate_values = -1;
    ASSERT_FAILS_NAMING(tl_model_load(fixture_path(), &options, &model), TL_ERR_INVALID_ARGUMENT, "validate_values");
}

Test(model_free, null_is_a_no_op) {
    tl_model_free(NULL);
}

/* ---- tl_model_info ---- */

static tl_model_properties info_of(const tl_model *model) {
    tl_model_properties info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    ASSERT_OK(tl_model_info(model, &info));
    return info;
}

/* The safetensors header of the fixture, read here without the library: its length and tensor count. */
static void read_safetensors_header(uint64_t *header_length, uint32_t *n_tensors) {
    FILE *file = fopen(fixture_path(), "rb");
    cr_assert_not_null(file, "cannot open %s", fixture_path());
    unsigned char length_bytes[8];
    cr_assert_eq(fread(length_bytes, 1, 8, file), 8);
    *header_length = 0;
    for (int i = 7; i >= 0; --i) *header_length = (*header_length << 8) | length_bytes[i];
    cr_assert_lt(*header_length, 1u << 24);
    char *header = malloc(*header_length + 1);
    cr_assert_not_null(header);
    cr_assert_eq(fread(header, 1, *header_length, file), *header_length);
    header[*header_length] = '\0';
    fclose(file);
    /* Each tensor entry has exactly one "dtype" key; inside the metadata strings quotes are escaped. */
    *n_tensors = 0;
    for (const char *hit = strstr(header, "\"dtype\""); hit != NULL; hit = strstr(hit + 1, "\"dtype\"")) ++*n_tensors;
    free(header);
}

Test(model_info, matches_the_fixture) {
    tl_model *model = load_fixture();
    const tl_model_properties info = info_of(model);
    cr_assert_geq(info.format_version, 1);
    cr_assert_eq(info.d_model, FIXTURE_D_MODEL);
    cr_assert_eq(info.n_heads, FIXTURE_N_HEADS);
    cr_assert_eq(info.head_dim, FIXTURE_HEAD_DIM);
    cr_assert_eq(info.ffn, FIXTURE_FFN);
    cr_assert_eq(info.vocab, FIXTURE_VOCAB);
    cr_assert_eq(info.n_pre, FIXTURE_N_PRE);
    cr_assert_eq(info.n_loops, FIXTURE_N_LOOPS);
    cr_assert_eq(info.max_seq, FIXTURE_MAX_SEQ);
    cr_assert_eq(info.group_size, FIXTURE_GROUP_SIZE);
    cr_assert_eq(info.bits, 4);
    cr_assert(isfinite(info.rope_theta) && info.rope_theta > 0, "rope_theta %g", info.rope_theta);
    cr_assert(isfinite(info.norm_eps) && info.norm_eps > 0 && info.norm_eps < 1, "norm_eps %g", info.norm_eps);
    cr_assert_eq(info.n_quant_weights, FIXTURE_N_QUANT_WEIGHTS);
    cr_assert_eq(info.n_dense_linears, 0);
    cr_assert_eq(info.head_kind, 2, "the fixture's head is tied to the embedding");
    cr_assert_eq(info.n_kv_heads, FIXTURE_N_HEADS, "plain multi-head attention reports n_heads key/value heads");
    cr_assert_eq(info.rope_scaling, TL_ROPE_SCALING_NONE);
    cr_assert_eq(info.rope_scaling_factor, 1.0f);
    cr_assert_eq(info.rope_original_max_positions, 0);

    struct stat file_stat;
    cr_assert_eq(stat(fixture_path(), &file_stat), 0);
    cr_assert_eq(info.file_bytes, (uint64_t)file_stat.st_size);
    uint64_t header_length = 0;
    uint32_t n_tensors = 0;
    read_safetensors_header(&header_length, &n_tensors);
    cr_assert_eq(info.n_tensors, n_tensors);
    cr_assert_leq(info.tensor_bytes, info.file_bytes - 8 - header_length);

    /* The quantized bytes and the parameters add up from the weights' own shapes. */
    uint64_t quant_bytes = 0, quant_params = 0;
    int any_frac4 = 0, any_sign_bit = 0;
    for (size_t i = 0; i < info.n_quant_weights; ++i) {
        const tl_weight *weight = NULL;
        ASSERT_OK(tl_model_weight_at(model, i, &weight));
        tl_weight_properties w;
        w.struct_size = sizeof w;
        ASSERT_OK(tl_weight_info(weight, &w));
        const uint64_t cells = (uint64_t)w.k * (uint64_t)w.n;
        cr_assert_eq(w.bytes, cells / 2 + 4 * (uint64_t)w.n * (uint64_t)w.n_groups + (w.has_frac4 ? cells / 2 : 0) +
                                  (w.has_sign_bit ? cells / 8 : 0), "%s", w.name);
        quant_bytes += w.bytes;
        quant_params += cells;
        any_frac4 |= w.has_frac4;
        any_sign_bit |= w.has_sign_bit;
    }
    cr_assert_eq(info.quant_weight_bytes, quant_bytes);
    cr_assert_gt(info.tensor_bytes, quant_bytes);
    cr_assert_eq(info.has_frac4, any_frac4);
    cr_assert_eq(info.has_sign_bit, any_sign_bit);
    /* The tied head shares the embedding; every block has two norm vectors, plus the final norm. */
    const uint64_t embedding = (uint64_t)FIXTURE_VOCAB * FIXTURE_D_MODEL;
    const uint64_t norms = (uint64_t)FIXTURE_D_MODEL * (2 * (FIXTURE_N_PRE + 1) + 1);
    cr_assert_eq(info.parameter_count, quant_params + embedding + norms, "parameter_count %llu, expected %llu",
                 (unsigned long long)info.parameter_count, (unsigned long long)(quant_params + embedding + norms));
    tl_model_free(model);
}

Test(model_info, is_the_same_without_mmap_or_validation) {
    tl_model *mapped = load_fixture();
    tl_load_options options;
    ASSERT_OK(tl_load_options_init(&options, sizeof options));
    options.use_mmap = 0;
    options.validate_values = 0;
    tl_model *read = NULL;
    ASSERT_OK(tl_model_load(fixture_path(), &options, &read));
    const tl_model_properties a = info_of(mapped), b = info_of(read);
    cr_assert_eq(a.d_model, b.d_model);
    cr_assert_eq(a.vocab, b.vocab);
    cr_assert_eq(a.n_quant_weights, b.n_quant_weights);
    cr_assert_eq(a.n_tensors, b.n_tensors);
    cr_assert_eq(a.file_bytes, b.file_bytes);
    cr_assert_eq(a.tensor_bytes, b.tensor_bytes);
    cr_assert_eq(a.quant_weight_bytes, b.quant_weight_bytes);
    cr_assert_eq(a.parameter_count, b.parameter_count);

    /* Same weights, bit for bit. */
    const tl_weight *wa = NULL, *wb = NULL;
    ASSERT_OK(tl_model_find_weight(mapped, "loop.mlp_down", &wa));
    ASSERT_OK(tl_model_find_weight(read, "loop.mlp_down", &wb));
    const size_t count = (size_t)FIXTURE_FFN * FIXTURE_D_MODEL;
    float *da = malloc(count * sizeof(float)), *db = malloc(count * sizeof(float));
    cr_assert(da && db);
    ASSERT_OK(tl_weight_dequantize(wa, da, count));
    ASSERT_OK(tl_weight_dequantize(wb, db, count));
    cr_assert_arr_eq(da, db, count * sizeof(float));
    free(da);
    free(db);
    tl_model_free(read);
    tl_model_free(mapped);
}

Test(model_info, rejects_null) {
    tl_model *model = load_fixture();
    tl_model_properties info;
    info.struct_size = sizeof info;
    ASSERT_FAILS_NAMING(tl_model_info(NULL, &info), TL_ERR_INVALID_ARGUMENT, "model");
    ASSERT_FAILS_NAMING(tl_model_info(model, NULL), TL_ERR_INVALID_ARGUMENT, "out");
    tl_model_free(model);
}

/* ---- weight count / at / find ---- */

Test(model_weights, count_at_and_find_agree_with_the_fixture) {
    tl_model *model = load_fixture();
    size_t count = 0;
    ASSERT_OK(tl_model_weight_count(model, &count));
    cr_assert_eq(count, FIXTURE_N_QUANT_WEIGHTS);
    for (size_t i = 0; i < count; ++i) {
        const tl_weight *weight = NULL;
        ASSERT_OK(tl_model_weight_at(model, i, &weight));
        cr_assert_not_null(weight);
        tl_weight_properties info;
        info.struct_size = sizeof info;
        ASSERT_OK(tl_weight_info(weight, &info));
        cr_assert_str_eq(info.name, kWeightNames[i], "weight %zu", i);
        int32_t k, n;
        expected_shape(i, &k, &n);
        cr_assert_eq(info.k, k, "%s", info.name);
        cr_assert_eq(info.n, n, "%s", info.name);
        cr_assert_eq(info.group_size, FIXTURE_GROUP_SIZE, "%s", info.name);
        cr_assert_eq(info.n_groups, k / FIXTURE_GROUP_SIZE, "%s", info.name);
        cr_assert_eq(info.bits, 4);
        cr_assert_eq(info.borrowed, 1, "%s", info.name);

        const tl_weight *found = NULL;
        ASSERT_OK(tl_model_find_weight(model, kWeightNames[i], &found));
        cr_assert_eq(found, weight, "find(\"%s\") and at(%zu) differ", kWeightNames[i], i);
    }
    tl_model_free(model);
}

Test(model_weights, misses_are_not_found) {
    tl_model *model = load_fixture();
    const tl_weight *const sentinel = (const tl_weight *)(uintptr_t)0x1;
    const tl_weight *weight = sentinel;
    ASSERT_FAILS_NAMING(tl_model_weight_at(model, FIXTURE_N_QUANT_WEIGHTS, &weight), TL_ERR_NOT_FOUND, "index");
    ASSERT_FAILS_NAMING(tl_model_weight_at(model, SIZE_MAX, &weight), TL_ERR_NOT_FOUND, "index");
    ASSERT_FAILS_NAMING(tl_model_find_weight(model, "loop.mlp_sideways", &weight), TL_ERR_NOT_FOUND,
                        "loop.mlp_sideways");
    /* The head is tied to the embedding, so it is not a quantized weight. */
    ASSERT_FAILS_NAMING(tl_model_find_weight(model, "head", &weight), TL_ERR_NOT_FOUND, "head");
    cr_assert_eq(weight, sentinel, "the output was written on failure");
    tl_model_free(model);
}

Test(model_weights, reject_null) {
    tl_model *model = load_fixture();
    size_t count = 0;
    const tl_weight *weight = NULL;
    ASSERT_FAILS_NAMING(tl_model_weight_count(NULL, &count), TL_ERR_INVALID_ARGUMENT, "model");
    ASSERT_FAILS_NAMING(tl_model_weight_count(model, NULL), TL_ERR_INVALID_ARGUMENT, "out_count");
    ASSERT_FAILS_NAMING(tl_model_weight_at(NULL, 0, &weight), TL_ERR_INVALID_ARGUMENT, "model");
    ASSERT_FAILS_NAMING(tl_model_weight_at(model, 0, NULL), TL_ERR_INVALID_ARGUMENT, "out_weight");
    ASSERT_FAILS_NAMING(tl_model_find_weight(NULL, "loop.mlp_up", &weight), TL_ERR_INVALID_ARGUMENT, "model");
    ASSERT_FAILS_NAMING(tl_model_find_weight(model, NULL, &weight), TL_ERR_INVALID_ARGUMENT, "name");
    ASSERT_FAILS_NAMING(tl_model_find_weight(model, "loop.mlp_up", NULL), TL_ERR_INVALID_ARGUMENT, "out_weight");
    tl_model_free(model);
}

Test(borrowed_weight, dequantizes_onto_its_grid) {
    tl_model *model = load_fixture();
    const tl_weight *weight = NULL;
    ASSERT_OK(tl_model_find_weight(model, "pre.0.attn_qkv", &weight));
    const int32_t k = FIXTURE_D_MODEL, n = 3 * FIXTURE_N_HEADS * FIXTURE_HEAD_DIM;
    const size_t count = (size_t)k * (size_t)n;
    float *out = malloc(count * sizeof(float));
    cr_assert_not_null(out);
    ASSERT_OK(tl_weight_dequantize(weight, out, count));
    for (int32_t row = 0; row < n; ++row)
        for (int32_t g0 = 0; g0 < k; g0 += FIXTURE_GROUP_SIZE)
            assert_4bit_grid(out + (size_t)row * (size_t)k + (size_t)g0, FIXTURE_GROUP_SIZE, "pre.0.attn_qkv");
    ASSERT_FAILS_NAMING(tl_weight_dequantize(weight, out, count - 1), TL_ERR_BUFFER_TOO_SMALL, "12288");
    free(out);
    tl_model_free(model);
}

Test(borrowed_weight, free_is_harmless) {
    tl_model *model = load_fixture();
    const tl_weight *weight = NULL;
    ASSERT_OK(tl_model_weight_at(model, 0, &weight));
    tl_weight_free((tl_weight *)(uintptr_t)weight); /* the model still owns it */
    tl_weight_properties info;
    info.struct_size = sizeof info;
    ASSERT_OK(tl_weight_info(weight, &info));
    cr_assert_eq(info.borrowed, 1);
    cr_assert_str_eq(info.name, kWeightNames[0]);
    const tl_weight *again = NULL;
    ASSERT_OK(tl_model_weight_at(model, 0, &again));
    cr_assert_eq(again, weight);
    tl_model_free(model);
}
