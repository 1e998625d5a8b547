/* The GPU part of the C API where there is no GPU (CI): every GPU call answers TL_ERR_NO_DEVICE with a message,
 * tl_device_count succeeds with 0, and argument checks that need no device still hold. On a machine with a GPU the
 * no-device assertions are skipped; tests/gpu_api covers that machine. */
#include <stdint.h>
#include <string.h>

#include "capi_test.h"

static int no_gpu(void) {
    int32_t count = -1;
    ASSERT_OK(tl_device_count(&count));
    cr_assert(count >= 0);
    return count == 0;
}

Test(gpu, device_count_is_zero_without_a_gpu) {
    ASSERT_FAILS_NAMING(tl_device_count(NULL), TL_ERR_INVALID_ARGUMENT, "out_count");
    if (!no_gpu()) cr_skip_test("a GPU is present");
    int32_t count = -1;
    ASSERT_OK(tl_device_count(&count));
    cr_assert_eq(count, 0);
}

Test(gpu, every_gpu_call_says_no_device) {
    if (!no_gpu()) cr_skip_test("a GPU is present");
    tl_device_properties props;
    memset(&props, 0, sizeof props);
    props.struct_size = sizeof props;
    cr_assert_eq(tl_device_info(0, &props), TL_ERR_NO_DEVICE);
    cr_assert_str_not_empty(tl_last_error_message());

    tl_model *model = load_fixture();
    tl_pack_report report;
    ASSERT_OK(tl_pack_report_init(&report, sizeof report));
    cr_assert_eq(tl_pack_marlin(model, NULL, &report), TL_ERR_NO_DEVICE);
    cr_assert_str_not_empty(tl_last_error_message());
    cr_assert_eq(report.weights_uploaded, 0, "the report was written on failure");

    const tl_weight *weight = NULL;
    ASSERT_OK(tl_model_weight_at(model, 0, &weight));
    size_t bytes = 7;
    cr_assert_eq(tl_quant_gemm_workspace_size(weight, 16, &bytes), TL_ERR_NO_DEVICE);
    cr_assert_eq(bytes, 7, "the output was written on failure");
    int16_t x[8], y[8];
    cr_assert_eq(tl_quant_gemm(weight, x, y, 1, NULL, NULL, 0), TL_ERR_NO_DEVICE);
    cr_assert_str_not_empty(tl_last_error_message());
    cr_assert_eq(tl_quant_gemm_dtype(weight, TL_DTYPE_BF16, x, y, 1, NULL, NULL, 0), TL_ERR_NO_DEVICE);
    /* The type is checked first: a bad one is named whatever the device. */
    ASSERT_FAILS_NAMING(tl_quant_gemm_dtype(weight, 2, x, y, 1, NULL, NULL, 0), TL_ERR_INVALID_ARGUMENT, "dtype");
    tl_dispatch_counts counts;
    memset(&counts, 0, sizeof counts);
    counts.struct_size = sizeof counts;
    cr_assert_eq(tl_weight_dispatch_counts(weight, &counts), TL_ERR_NO_DEVICE);

    float w[64 * 64];
    for (int i = 0; i < 64 * 64; ++i) w[i] = (float)(rng_below(2001) - 1000) / 1000.0f;
    tl_weight *owned = NULL;
    ASSERT_OK(tl_weight_quantize(w, 64, 64, NULL, &owned));
    cr_assert_eq(tl_weight_pack_marlin(owned, NULL, NULL), TL_ERR_NO_DEVICE);
    cr_assert_str_not_empty(tl_last_error_message());
    tl_weight_free(owned);
    tl_model_free(model);

    void *ptr = (void *)(uintptr_t)0x1;
    cr_assert_eq(tl_device_malloc(0, 64, &ptr), TL_ERR_NO_DEVICE);
    cr_assert_eq(ptr, (void *)(uintptr_t)0x1, "the output was written on failure");
    void *stream = NULL;
    cr_assert_eq(tl_stream_create(0, &stream), TL_ERR_NO_DEVICE);
    cr_assert_eq(tl_stream_synchronize(NULL), TL_ERR_NO_DEVICE);
    cr_assert_eq(tl_memcpy(x, y, sizeof x, NULL), TL_ERR_NO_DEVICE);
    cr_assert_eq(tl_memset_device(x, 0, sizeof x, NULL), TL_ERR_NO_DEVICE);
    cr_assert_str_not_empty(tl_last_error_message());
    /* Freeing/destroying NULL is a no-op everywhere. */
    ASSERT_OK(tl_device_free(NULL, NULL));
    ASSERT_OK(tl_stream_destroy(NULL));
}

Test(gpu, memory_functions_check_their_arguments) {
    ASSERT_FAILS_NAMING(tl_device_malloc(0, 64, NULL), TL_ERR_INVALID_ARGUMENT, "out_ptr");
    ASSERT_FAILS_NAMING(tl_stream_create(0, NULL), TL_ERR_INVALID_ARGUMENT, "out_stream");
}

Test(gpu, a_borrowed_weight_is_packed_through_its_model) {
    tl_model *model = load_fixture();
    const tl_weight *weight = NULL;
    ASSERT_OK(tl_model_weight_at(model, 0, &weight));
    ASSERT_FAILS_NAMING(tl_weight_pack_marlin((tl_weight *)weight, NULL, NULL), TL_ERR_INVALID_ARGUMENT, "model");
    tl_model_free(model);
}

Test(gpu, pack_options_are_checked_before_any_device_work) {
    tl_pack_options options;
    ASSERT_OK(tl_pack_options_init(&options, sizeof options));
    cr_assert_eq(options.struct_size, sizeof options);
    cr_assert_eq(options.device, 0);
    cr_assert_null(options.stream);
    cr_assert_eq(options.forms, TL_FORM_MARLIN_FUSED | TL_FORM_MARLIN_CORRECTION);
    ASSERT_FAILS_NAMING(tl_pack_options_init(NULL, sizeof(tl_pack_options)), TL_ERR_INVALID_ARGUMENT, "options");
    ASSERT_FAILS_NAMING(tl_pack_report_init(NULL, sizeof(tl_pack_report)), TL_ERR_INVALID_ARGUMENT, "report");

    tl_model *model = load_fixture();
    options.forms = 64; /* unknown bit */
    ASSERT_FAILS_NAMING(tl_pack_marlin(model, &options, NULL), TL_ERR_INVALID_ARGUMENT, "forms");
    ASSERT_FAILS_NAMING(tl_pack_marlin(NULL, NULL, NULL), TL_ERR_INVALID_ARGUMENT, "model");
    ASSERT_FAILS_NAMING(tl_quant_gemm(NULL, NULL, NULL, 1, NULL, NULL, 0), TL_ERR_INVALID_ARGUMENT, "weight");
    ASSERT_FAILS_NAMING(tl_quant_gemm_dtype(NULL, TL_DTYPE_BF16, NULL, NULL, 1, NULL, NULL, 0),
                        TL_ERR_INVALID_ARGUMENT, "weight");
    ASSERT_FAILS_NAMING(tl_quant_gemm_dtype(NULL, -1, NULL, NULL, 1, NULL, NULL, 0), TL_ERR_INVALID_ARGUMENT,
                        "dtype");
    tl_model_free(model);
}

Test(gpu, dispatch_settings_round_trip_and_reject_bad_values) {
    int32_t value = -1;
    ASSERT_OK(tl_get_dispatch(TL_DISPATCH_USE_MARLIN, &value));
    cr_assert(value == 0 || value == 1);
    ASSERT_OK(tl_set_dispatch(TL_DISPATCH_USE_MARLIN, 0));
    ASSERT_OK(tl_get_dispatch(TL_DISPATCH_USE_MARLIN, &value));
    cr_assert_eq(value, 0);
    ASSERT_OK(tl_set_dispatch(TL_DISPATCH_MARLIN_MODE, 2));
    ASSERT_OK(tl_get_dispatch(TL_DISPATCH_MARLIN_MODE, &value));
    cr_assert_eq(value, 2);
    ASSERT_OK(tl_set_dispatch(TL_DISPATCH_CUBLAS_MIN_M, 4096));
    ASSERT_OK(tl_get_dispatch(TL_DISPATCH_CUBLAS_MIN_M, &value));
    cr_assert_eq(value, 4096);

    ASSERT_FAILS_NAMING(tl_set_dispatch(TL_DISPATCH_USE_MARLIN, 2), TL_ERR_INVALID_ARGUMENT, "value");
    ASSERT_FAILS_NAMING(tl_set_dispatch(TL_DISPATCH_MARLIN_MODE, 3), TL_ERR_INVALID_ARGUMENT, "value");
    ASSERT_FAILS_NAMING(tl_set_dispatch(TL_DISPATCH_CUBLAS_MIN_M, -1), TL_ERR_INVALID_ARGUMENT, "value");
    ASSERT_OK(tl_set_dispatch(TL_DISPATCH_ATTENTION, 1));
    ASSERT_OK(tl_get_dispatch(TL_DISPATCH_ATTENTION, &value));
    cr_assert_eq(value, 1);
    ASSERT_FAILS_NAMING(tl_set_dispatch(TL_DISPATCH_ATTENTION, 3), TL_ERR_INVALID_ARGUMENT, "value");
    ASSERT_FAILS_NAMING(tl_set_dispatch(6, 0), TL_ERR_INVALID_ARGUMENT, "setting");
    ASSERT_FAILS_NAMING(tl_set_dispatch(-1, 0), TL_ERR_INVALID_ARGUMENT, "setting");
    ASSERT_FAILS_NAMING(tl_get_dispatch(TL_DISPATCH_FP16_BODY, NULL), TL_ERR_INVALID_ARGUMENT, "out_value");
    ASSERT_FAILS_NAMING(tl_get_dispatch(99, &value), TL_ERR_INVALID_ARGUMENT, "setting");
}

/* A model's settings are its own: set ones hold whatever the process-wide default does, unset ones (and ones set
 * back to -1) follow it. Its weights read the model's; an owned weight has its own. */
Test(gpu, dispatch_settings_belong_to_their_handle) {
    tl_model *a = load_fixture(), *b = load_fixture();
    int32_t value = -1;
    ASSERT_OK(tl_set_dispatch(TL_DISPATCH_CUBLAS_MIN_M, 512));
    ASSERT_OK(tl_model_set_dispatch(a, TL_DISPATCH_CUBLAS_MIN_M, 64));
    ASSERT_OK(tl_model_get_dispatch(a, TL_DISPATCH_CUBLAS_MIN_M, &value));
    cr_assert_eq(value, 64);
    ASSERT_OK(tl_model_get_dispatch(b, TL_DISPATCH_CUBLAS_MIN_M, &value));
    cr_assert_eq(value, 512, "a setting of one model changed another's");
    ASSERT_OK(tl_set_dispatch(TL_DISPATCH_CUBLAS_MIN_M, 2048));
    ASSERT_OK(tl_model_get_dispatch(a, TL_DISPATCH_CUBLAS_MIN_M, &value));
    cr_assert_eq(value, 64, "the process-wide default overrode a model's own setting");
    ASSERT_OK(tl_model_get_dispatch(b, TL_DISPATCH_CUBLAS_MIN_M, &value));
    cr_assert_eq(value, 2048, "an unset setting does not follow the process-wide default");
    ASSERT_OK(tl_model_set_dispatch(a, TL_DISPATCH_CUBLAS_MIN_M, -1));
    ASSERT_OK(tl_model_get_dispatch(a, TL_DISPATCH_CUBLAS_MIN_M, &value));
    cr_assert_eq(value, 2048, "-1 did not return the setting to the default");

    /* A model's weights read its settings and cannot be given their own. */
    const tl_weight *borrowed = NULL;
    ASSERT_OK(tl_model_weight_at(a, 0, &borrowed));
    ASSERT_OK(tl_model_set_dispatch(a, TL_DISPATCH_MARLIN_MODE, 2));
    ASSERT_OK(tl_weight_get_dispatch(borrowed, TL_DISPATCH_MARLIN_MODE, &value));
    cr_assert_eq(value, 2);
    ASSERT_FAILS_NAMING(tl_weight_set_dispatch((tl_weight *)borrowed, TL_DISPATCH_MARLIN_MODE, 1),
                        TL_ERR_INVALID_ARGUMENT, "tl_model_set_dispatch");

    static float values[64 * 64];
    for (int i = 0; i < 64 * 64; ++i) values[i] = (float)((i * 37) % 17) - 8.0f;
    tl_weight *owned = NULL;
    ASSERT_OK(tl_weight_quantize(values, 64, 64, NULL, &owned));
    ASSERT_OK(tl_set_dispatch(TL_DISPATCH_USE_MARLIN, 1));
    ASSERT_OK(tl_weight_set_dispatch(owned, TL_DISPATCH_USE_MARLIN, 0));
    ASSERT_OK(tl_weight_get_dispatch(owned, TL_DISPATCH_USE_MARLIN, &value));
    cr_assert_eq(value, 0);
    ASSERT_OK(tl_model_get_dispatch(b, TL_DISPATCH_USE_MARLIN, &value));
    cr_assert_eq(value, 1, "an owned weight's setting changed a model's");
    tl_weight_free(owned);

    /* Bad arguments, each named. */
    ASSERT_FAILS_NAMING(tl_model_set_dispatch(NULL, TL_DISPATCH_USE_MARLIN, 0), TL_ERR_INVALID_ARGUMENT, "model");
    ASSERT_FAILS_NAMING(tl_model_set_dispatch(a, 99, 0), TL_ERR_INVALID_ARGUMENT, "setting");
    ASSERT_FAILS_NAMING(tl_model_set_dispatch(a, TL_DISPATCH_USE_MARLIN, 2), TL_ERR_INVALID_ARGUMENT, "value");
    ASSERT_FAILS_NAMING(tl_model_set_dispatch(a, TL_DISPATCH_USE_MARLIN, -2), TL_ERR_INVALID_ARGUMENT, "value");
    ASSERT_FAILS_NAMING(tl_model_get_dispatch(a, TL_DISPATCH_USE_MARLIN, NULL), TL_ERR_INVALID_ARGUMENT, "out_value");
    ASSERT_FAILS_NAMING(tl_model_get_dispatch(NULL, TL_DISPATCH_USE_MARLIN, &value), TL_ERR_INVALID_ARGUMENT,
                        "model");
    ASSERT_FAILS_NAMING(tl_weight_set_dispatch(NULL, TL_DISPATCH_USE_MARLIN, 0), TL_ERR_INVALID_ARGUMENT, "weight");
    ASSERT_FAILS_NAMING(tl_weight_get_dispatch(NULL, TL_DISPATCH_USE_MARLIN, &value), TL_ERR_INVALID_ARGUMENT,
                        "weight");
    tl_model_free(a);
    tl_model_free(b);
}

/* ---- struct_size of the GPU structs: checked before any device work, so this holds with or without a GPU ---- */

static tl_status device_info_with(uint32_t size) {
    struct { tl_device_properties s; unsigned char spare[SPARE_BYTES]; } buffer;
    memset(&buffer, 0, sizeof buffer);
    buffer.s.struct_size = size;
    return tl_device_info(0, &buffer.s);
}

static tl_status pack_options_with(uint32_t size) {
    tl_model *model = load_fixture();
    struct { tl_pack_options s; unsigned char spare[SPARE_BYTES]; } buffer;
    memset(&buffer, 0, sizeof buffer);
    tl_pack_options_init(&buffer.s, sizeof buffer.s);
    buffer.s.struct_size = size;
    const tl_status status = tl_pack_marlin(model, &buffer.s, NULL);
    tl_model_free(model);
    return status;
}

static tl_status pack_report_with(uint32_t size) {
    tl_model *model = load_fixture();
    struct { tl_pack_report s; unsigned char spare[SPARE_BYTES]; } buffer;
    memset(&buffer, 0, sizeof buffer);
    buffer.s.struct_size = size;
    const tl_status status = tl_pack_marlin(model, NULL, &buffer.s);
    tl_model_free(model);
    return status;
}

static tl_status dispatch_counts_with(uint32_t size) {
    tl_model *model = load_fixture();
    const tl_weight *weight = NULL;
    ASSERT_OK(tl_model_weight_at(model, 0, &weight));
    struct { tl_dispatch_counts s; unsigned char spare[SPARE_BYTES]; } buffer;
    memset(&buffer, 0, sizeof buffer);
    buffer.s.struct_size = size;
    const tl_status status = tl_weight_dispatch_counts(weight, &buffer.s);
    tl_model_free(model);
    return status;
}

/* The full size passes the check: TL_OK where the call can succeed, else the device-side status. */
static void assert_gpu_struct_size(tl_status (*call)(uint32_t), uint32_t full_size, const char *what, int output) {
    const tl_status full = call(full_size);
    cr_assert(full == TL_OK || full == TL_ERR_NO_DEVICE || full == TL_ERR_INVALID_ARGUMENT, "%s: %d (%s): %s", what,
              (int)full, tl_status_string(full), tl_last_error_message());
    if (full == TL_ERR_INVALID_ARGUMENT) { /* dispatch counts of an unpacked weight on a GPU machine */
        cr_assert(!contains_word(tl_last_error_message(), "struct_size"), "%s: %s", what, tl_last_error_message());
    }
    if (output) {
        assert_output_struct_size(call, full_size, what);
    } else {
        assert_rejects_wrong_struct_size(call, full_size, what);
    }
}

Test(gpu, struct_size_tl_device_properties) {
    assert_gpu_struct_size(device_info_with, sizeof(tl_device_properties), "tl_device_info", 1);
}
Test(gpu, struct_size_tl_pack_options) {
    assert_gpu_struct_size(pack_options_with, sizeof(tl_pack_options), "tl_pack_marlin options", 0);
}
Test(gpu, struct_size_tl_pack_report) {
    assert_gpu_struct_size(pack_report_with, sizeof(tl_pack_report), "tl_pack_marlin report", 1);
}
Test(gpu, struct_size_tl_dispatch_counts) {
    assert_gpu_struct_size(dispatch_counts_with, sizeof(tl_dispatch_counts), "tl_weight_dispatch_counts", 1);
}
