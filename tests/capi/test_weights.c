/* Owned weights: tl_weight_desc_init, tl_weight_create, tl_quantize_options_init, tl_weight_quantize,
 * tl_weight_info, tl_weight_dequantize, tl_weight_free. */
#include <math.h>
#include <stdlib.h>

#include "capi_test.h"

/* Host arrays for a weight with random codes, scales and zeros. */
struct host_weight {
    int32_t k, n, group_size, n_groups;
    uint8_t *codes;
    uint16_t *scales;
    uint16_t *zeros;
    tl_weight_desc desc;
};

/* A finite half with a random mantissa and an exponent in [min_exp, max_exp] (biased). */
static uint16_t random_half(int negative_allowed, int min_exp, int max_exp) {
    const uint16_t sign = (negative_allowed && (rng_next() & 1)) ? 0x8000 : 0;
    const uint16_t exponent = (uint16_t)(min_exp + rng_below(max_exp - min_exp + 1));
    return (uint16_t)(sign | (exponent << 10) | (uint16_t)rng_below(1024));
}

static struct host_weight make_host_weight(int32_t k, int32_t n, int32_t group_size) {
    struct host_weight h;
    h.k = k;
    h.n = n;
    h.group_size = group_size == 0 ? k : group_size;
    h.n_groups = k / h.group_size;
    h.codes = malloc((size_t)n * (size_t)k / 2);
    h.scales = malloc((size_t)n * (size_t)h.n_groups * sizeof(uint16_t));
    h.zeros = malloc((size_t)n * (size_t)h.n_groups * sizeof(uint16_t));
    cr_assert(h.codes && h.scales && h.zeros);
    for (size_t i = 0; i < (size_t)n * (size_t)k / 2; ++i) h.codes[i] = (uint8_t)rng_below(256);
    for (size_t i = 0; i < (size_t)n * (size_t)h.n_groups; ++i) {
        h.scales[i] = random_half(0, 9, 14);  /* about 2^-6 .. 2^-1 */
        h.zeros[i] = random_half(1, 10, 15); /* about ±2^-5 .. ±2 */
    }
    ASSERT_OK(tl_weight_desc_init(&h.desc, sizeof h.desc));
    h.desc.k = k;
    h.desc.n = n;
    h.desc.group_size = group_size;
    h.desc.codes = h.codes;
    h.desc.scales = h.scales;
    h.desc.zeros = h.zeros;
    return h;
}

static void free_host_weight(struct host_weight *h) {
    free(h->codes);
    free(h->scales);
    free(h->zeros);
}

static int code_of(const struct host_weight *h, int32_t kk, int32_t nn) {
    const uint8_t byte = h->codes[(size_t)nn * (size_t)(h->k / 2) + (size_t)(kk / 2)];
    return (kk & 1) ? byte >> 4 : byte & 0x0F;
}

/* Checks out[n][k] against q*s + z computed here from the caller's own arrays. */
static void assert_dequantizes_like(const tl_weight *weight, const struct host_weight *h) {
    const size_t count = (size_t)h->k * (size_t)h->n;
    float *out = malloc(count * sizeof(float));
    cr_assert_not_null(out);
    ASSERT_OK(tl_weight_dequantize(weight, out, count));
    for (int32_t nn = 0; nn < h->n; ++nn) {
        for (int32_t kk = 0; kk < h->k; ++kk) {
            const size_t g = (size_t)nn * (size_t)h->n_groups + (size_t)(kk / h->group_size);
            const double s = half_to_float(h->scales[g]);
            const double z = half_to_float(h->zeros[g]);
            const double q = code_of(h, kk, nn);
            const double expected = q * s + z;
            const double got = out[(size_t)nn * (size_t)h->k + (size_t)kk];
            /* FP32 arithmetic on exact FP16 inputs: a few ulps at most. */
            cr_assert(fabs(got - expected) <= 1e-6 * (fabs(q * s) + fabs(z)) + 1e-30,
                      "W[%d, %d] = %.9g, expected %d * %.9g + %.9g = %.9g", kk, nn, got, (int)q, s, z, expected);
        }
    }
    free(out);
}

/* ---- *_init ---- */

Test(weight_desc_init, fills_the_defaults) {
    tl_weight_desc desc;
    memset(&desc, 0x5A, sizeof desc);
    ASSERT_OK(tl_weight_desc_init(&desc, sizeof desc));
    cr_assert_eq(desc.struct_size, sizeof desc);
    cr_assert_eq(desc.k, 0);
    cr_assert_eq(desc.n, 0);
    cr_assert_eq(desc.group_size, 0);
    cr_assert_eq(desc.bits, 4);
    cr_assert_null(desc.codes);
    cr_assert_null(desc.scales);
    cr_assert_null(desc.zeros);
    cr_assert_null(desc.frac4);
    cr_assert_null(desc.sign_bit);
    cr_assert_null(desc.name);
    ASSERT_FAILS_NAMING(tl_weight_desc_init(NULL, sizeof(tl_weight_desc)), TL_ERR_INVALID_ARGUMENT, "desc");
}

Test(quantize_options_init, fills_the_defaults) {
    tl_quantize_options options;
    memset(&options, 0x5A, sizeof options);
    ASSERT_OK(tl_quantize_options_init(&options, sizeof options));
    cr_assert_eq(options.struct_size, sizeof options);
    cr_assert_eq(options.method, TL_QUANT_ASYMMETRIC);
    cr_assert_eq(options.group_size, 0);
    cr_assert_eq(options.bits, 4);
    ASSERT_FAILS_NAMING(tl_quantize_options_init(NULL, sizeof(tl_quantize_options)), TL_ERR_INVALID_ARGUMENT,
                        "options");
}

/* ---- tl_weight_create ---- */

Test(weight_create, dequantizes_to_q_times_s_plus_z, .init = rng_seed_from_env) {
    const int32_t group_sizes[] = {32, 0, 64, 16};
    for (size_t i = 0; i < sizeof(group_sizes) / sizeof(group_sizes[0]); ++i) {
        struct host_weight h = make_host_weight(64, 24, group_sizes[i]);
        tl_weight *weight = NULL;
        ASSERT_OK(tl_weight_create(&h.desc, &weight));
        cr_assert_not_null(weight);
        assert_dequantizes_like(weight, &h);

        tl_weight_properties info;
        info.struct_size = sizeof info;
        ASSERT_OK(tl_weight_info(weight, &info));
        cr_assert_eq(info.k, 64);
        cr_assert_eq(info.n, 24);
        cr_assert_eq(info.group_size, h.group_size, "group_size %d reads back as %d", group_sizes[i], info.group_size);
        cr_assert_eq(info.n_groups, h.n_groups);
        cr_assert_eq(info.bits, 4);
        cr_assert_eq(info.has_frac4, 0);
        cr_assert_eq(info.has_sign_bit, 0);
        cr_assert_eq(info.borrowed, 0);
        cr_assert_eq(info.bytes, (uint64_t)24 * 64 / 2 + 2 * 2 * (uint64_t)24 * (uint64_t)h.n_groups);
        cr_assert_not_null(info.name);
        cr_assert_str_empty(info.name);
        tl_weight_free(weight);
        free_host_weight(&h);
    }
}

Test(weight_create, copies_the_arrays_and_the_name, .init = rng_seed_from_env) {
    struct host_weight h = make_host_weight(32, 8, 16);
    struct host_weight original = h;
    const size_t n_codes = 8 * 32 / 2, n_params = 8 * 2;
    original.codes = malloc(n_codes);
    original.scales = malloc(n_params * sizeof(uint16_t));
    original.zeros = malloc(n_params * sizeof(uint16_t));
    cr_assert(original.codes && original.scales && original.zeros);
    memcpy(original.codes, h.codes, n_codes);
    memcpy(original.scales, h.scales, n_params * sizeof(uint16_t));
    memcpy(original.zeros, h.zeros, n_params * sizeof(uint16_t));
    char name[] = "caller.weight";
    h.desc.name = name;

    tl_weight *weight = NULL;
    ASSERT_OK(tl_weight_create(&h.desc, &weight));
    /* Scribble over everything the library was given. */
    memset(h.codes, 0xFF, n_codes);
    memset(h.scales, 0x7C, n_params * sizeof(uint16_t));
    memset(h.zeros, 0x7C, n_params * sizeof(uint16_t));
    memset(name, 'x', sizeof name - 1);

    assert_dequantizes_like(weight, &original);
    tl_weight_properties info;
    info.struct_size = sizeof info;
    ASSERT_OK(tl_weight_info(weight, &info));
    cr_assert_str_eq(info.name, "caller.weight");
    tl_weight_free(weight);
    free_host_weight(&h);
    free_host_weight(&original);
}

Test(weight_create, reports_optional_channels, .init = rng_seed_from_env) {
    struct host_weight h = make_host_weight(64, 8, 32);
    uint8_t frac4[8 * 64 / 2];
    uint8_t sign_bit[8 * 64 / 8];
    for (size_t i = 0; i < sizeof frac4; ++i) frac4[i] = (uint8_t)rng_below(256);
    for (size_t i = 0; i < sizeof sign_bit; ++i) sign_bit[i] = (uint8_t)rng_below(256);
    h.desc.frac4 = frac4;
    h.desc.sign_bit = sign_bit;
    tl_weight *weight = NULL;
    ASSERT_OK(tl_weight_create(&h.desc, &weight));
    tl_weight_properties info;
    info.struct_size = sizeof info;
    ASSERT_OK(tl_weight_info(weight, &info));
    cr_assert_eq(info.has_frac4, 1);
    cr_assert_eq(info.has_sign_bit, 1);
    cr_assert_eq(info.bytes, (uint64_t)(8 * 64 / 2 + 2 * 2 * 8 * 2) + sizeof frac4 + sizeof sign_bit);
    tl_weight_free(weight);
    free_host_weight(&h);
}

/* Runs tl_weight_create on a broken desc: the status, the named field, and an untouched output. */
static void assert_create_rejects(const tl_weight_desc *desc, const char *field) {
    tl_weight *const sentinel = (tl_weight *)(uintptr_t)0x1;
    tl_weight *weight = sentinel;
    ASSERT_FAILS_NAMING(tl_weight_create(desc, &weight), TL_ERR_INVALID_ARGUMENT, field);
    cr_assert_null(weight, "a failed create must set the output to NULL (field %s)", field);
}

Test(weight_create, validates_the_desc, .init = rng_seed_from_env) {
    struct host_weight h = make_host_weight(64, 8, 32);
    tl_weight_desc d;

    d = h.desc; d.k = 63; assert_create_rejects(&d, "k");       /* odd */
    d = h.desc; d.k = 0; assert_create_rejects(&d, "k");
    d = h.desc; d.k = -64; assert_create_rejects(&d, "k");
    d = h.desc; d.n = 0; assert_create_rejects(&d, "n");
    d = h.desc; d.n = -8; assert_create_rejects(&d, "n");
    d = h.desc; d.group_size = 24; assert_create_rejects(&d, "group_size"); /* does not divide 64 */
    d = h.desc; d.group_size = 128; assert_create_rejects(&d, "group_size");
    d = h.desc; d.group_size = -32; assert_create_rejects(&d, "group_size");
    d = h.desc; d.bits = 8; assert_create_rejects(&d, "bits");
    d = h.desc; d.bits = 0; assert_create_rejects(&d, "bits");
    d = h.desc; d.codes = NULL; assert_create_rejects(&d, "codes");
    d = h.desc; d.scales = NULL; assert_create_rejects(&d, "scales");
    d = h.desc; d.zeros = NULL; assert_create_rejects(&d, "zeros");

    const uint16_t half_nan = 0x7E00, half_inf = 0x7C00, half_neg_inf = 0xFC00;
    const size_t last = (size_t)8 * 2 - 1;
    h.scales[last] = half_nan;
    assert_create_rejects(&h.desc, "scales");
    h.scales[last] = half_inf;
    assert_create_rejects(&h.desc, "scales");
    h.scales[last] = 0x3C00;
    h.zeros[0] = half_neg_inf;
    assert_create_rejects(&h.desc, "zeros");
    h.zeros[0] = half_nan;
    assert_create_rejects(&h.desc, "zeros");

    tl_weight *weight = NULL;
    ASSERT_FAILS_NAMING(tl_weight_create(NULL, &weight), TL_ERR_INVALID_ARGUMENT, "desc");
    h.zeros[0] = 0;
    ASSERT_FAILS_NAMING(tl_weight_create(&h.desc, NULL), TL_ERR_INVALID_ARGUMENT, "out_weight");
    free_host_weight(&h);
}

/* ---- tl_weight_quantize ---- */

static float *random_matrix(int32_t k, int32_t n) {
    float *w = malloc((size_t)k * (size_t)n * sizeof(float));
    cr_assert_not_null(w);
    for (int32_t row = 0; row < n; ++row) {
        /* Rows of different magnitude and offset, like a trained layer's output columns. */
        const float amplitude = rng_uniform(0.05f, 3.0f);
        const float offset = rng_uniform(-0.5f, 0.5f);
        for (int32_t i = 0; i < k; ++i) w[(size_t)row * (size_t)k + (size_t)i] = amplitude * (rng_uniform(-1, 1) + offset);
    }
    return w;
}

/* Quantizes a fresh random matrix and checks the dequantized result group by group: the values lie on a
 * 16-level grid whose step is the weight's own scale, and each is within half a step of the input. */
static void check_round_trip(int32_t k, int32_t n, int32_t method, int32_t group_size) {
    float *w = random_matrix(k, n);
    tl_quantize_options options;
    ASSERT_OK(tl_quantize_options_init(&options, sizeof options));
    options.method = method;
    options.group_size = group_size;
    tl_weight *weight = NULL;
    ASSERT_OK(tl_weight_quantize(w, k, n, &options, &weight));

    const int32_t actual_group = group_size == 0 ? k : group_size;
    tl_weight_properties info;
    info.struct_size = sizeof info;
    ASSERT_OK(tl_weight_info(weight, &info));
    cr_assert_eq(info.k, k);
    cr_assert_eq(info.n, n);
    cr_assert_eq(info.group_size, actual_group);
    cr_assert_eq(info.n_groups, k / actual_group);
    cr_assert_eq(info.bits, 4);
    cr_assert_eq(info.borrowed, 0);
    cr_assert_eq(info.has_frac4, 0);
    cr_assert_eq(info.has_sign_bit, 0);
    cr_assert_eq(info.bytes, (uint64_t)k * (uint64_t)n / 2 + 4 * (uint64_t)n * (uint64_t)(k / actual_group));

    const size_t count = (size_t)k * (size_t)n;
    float *out = malloc(count * sizeof(float));
    cr_assert_not_null(out);
    ASSERT_OK(tl_weight_dequantize(weight, out, count));
    for (int32_t row = 0; row < n; ++row) {
        for (int32_t g0 = 0; g0 < k; g0 += actual_group) {
            const size_t base = (size_t)row * (size_t)k + (size_t)g0;
            const float *v = out + base;
            const struct grid grid = assert_4bit_grid(v, actual_group, "quantized weight");
            for (int32_t i = 0; i < actual_group; ++i) {
                const double error = fabs((double)w[base + (size_t)i] - v[i]);
                cr_assert(error <= 0.5 * grid.step + 1e-5 * (fabs(w[base + (size_t)i]) + grid.step),
                          "row %d k %d: %.9g became %.9g, more than half a step (%.9g) away", row, g0 + i,
                          w[base + (size_t)i], v[i], grid.step);
            }
            if (method == TL_QUANT_ASYMMETRIC) {
                /* Min-max uses the whole range: the extremes are codes 0 and 15. */
                const double span = (grid.highest - grid.lowest) / grid.step;
                cr_assert(fabs(span - 15) < 1e-3, "row %d group at %d spans %.6g steps, not 15", row, g0, span);
            } else {
                /* (q - 8) * s: zero is on the grid, the lowest level is >= -8 steps, the highest <= 7. */
                const double low_level = grid.lowest / grid.step, high_level = grid.highest / grid.step;
                cr_assert(fabs(low_level - rint(low_level)) < 1e-3, "row %d group at %d: 0 is not on the grid", row, g0);
                cr_assert(rint(low_level) >= -8 && rint(high_level) <= 7, "row %d group at %d: levels %.6g..%.6g",
                          row, g0, low_level, high_level);
            }
        }
    }

    /* Quantization is deterministic. */
    tl_weight *again = NULL;
    ASSERT_OK(tl_weight_quantize(w, k, n, &options, &again));
    float *out_again = malloc(count * sizeof(float));
    cr_assert_not_null(out_again);
    ASSERT_OK(tl_weight_dequantize(again, out_again, count));
    cr_assert_arr_eq(out, out_again, count * sizeof(float));

    tl_weight_free(again);
    tl_weight_free(weight);
    free(out_again);
    free(out);
    free(w);
}

Test(weight_quantize, asymmetric_grouped_round_trip, .init = rng_seed_from_env) {
    check_round_trip(128, 24, TL_QUANT_ASYMMETRIC, 32);
}
Test(weight_quantize, asymmetric_per_row_round_trip, .init = rng_seed_from_env) {
    check_round_trip(96, 16, TL_QUANT_ASYMMETRIC, 0);
}
Test(weight_quantize, symmetric_grouped_round_trip, .init = rng_seed_from_env) {
    check_round_trip(128, 24, TL_QUANT_SYMMETRIC, 64);
}
Test(weight_quantize, symmetric_per_row_round_trip, .init = rng_seed_from_env) {
    check_round_trip(64, 16, TL_QUANT_SYMMETRIC, 0);
}

Test(weight_quantize, null_options_mean_per_row_asymmetric, .init = rng_seed_from_env) {
    float *w = random_matrix(64, 4);
    tl_weight *weight = NULL;
    ASSERT_OK(tl_weight_quantize(w, 64, 4, NULL, &weight));
    tl_weight_properties info;
    info.struct_size = sizeof info;
    ASSERT_OK(tl_weight_info(weight, &info));
    cr_assert_eq(info.group_size, 64);
    cr_assert_eq(info.n_groups, 1);
    tl_weight_free(weight);
    free(w);
}

Test(weight_quantize, asymmetric_constant_group_is_exact) {
    /* Min-max with z = min: a group whose range is 0 dequantizes to z, exact for an FP16-representable value
     * (and the zero step must not turn into NaN). */
    float w[2 * 32];
    for (size_t i = 0; i < 32; ++i) w[i] = 0.75f;
    for (size_t i = 32; i < 64; ++i) w[i] = -2.5f;
    tl_weight *weight = NULL;
    ASSERT_OK(tl_weight_quantize(w, 32, 2, NULL, &weight));
    float out[64];
    ASSERT_OK(tl_weight_dequantize(weight, out, 64));
    for (size_t i = 0; i < 64; ++i) cr_assert_eq(out[i], w[i], "%.9g became %.9g", w[i], out[i]);
    tl_weight_free(weight);
}

Test(weight_quantize, validates_its_arguments, .init = rng_seed_from_env) {
    float *w = random_matrix(64, 4);
    tl_weight *const sentinel = (tl_weight *)(uintptr_t)0x1;
    tl_weight *weight = sentinel;
    tl_quantize_options options;
    ASSERT_OK(tl_quantize_options_init(&options, sizeof options));

    ASSERT_FAILS_NAMING(tl_weight_quantize(NULL, 64, 4, NULL, &weight), TL_ERR_INVALID_ARGUMENT, "w");
    ASSERT_FAILS_NAMING(tl_weight_quantize(w, 64, 4, NULL, NULL), TL_ERR_INVALID_ARGUMENT, "out_weight");
    ASSERT_FAILS_NAMING(tl_weight_quantize(w, 63, 4, NULL, &weight), TL_ERR_INVALID_ARGUMENT, "k");
    ASSERT_FAILS_NAMING(tl_weight_quantize(w, 0, 4, NULL, &weight), TL_ERR_INVALID_ARGUMENT, "k");
    ASSERT_FAILS_NAMING(tl_weight_quantize(w, 64, 0, NULL, &weight), TL_ERR_INVALID_ARGUMENT, "n");
    ASSERT_FAILS_NAMING(tl_weight_quantize(w, 64, -4, NULL, &weight), TL_ERR_INVALID_ARGUMENT, "n");
    options.group_size = 24;
    ASSERT_FAILS_NAMING(tl_weight_quantize(w, 64, 4, &options, &weight), TL_ERR_INVALID_ARGUMENT, "group_size");
    options.group_size = -32;
    ASSERT_FAILS_NAMING(tl_weight_quantize(w, 64, 4, &options, &weight), TL_ERR_INVALID_ARGUMENT, "group_size");
    options.group_size = 0;
    options.bits = 8;
    ASSERT_FAILS_NAMING(tl_weight_quantize(w, 64, 4, &options, &weight), TL_ERR_INVALID_ARGUMENT, "bits");
    options.bits = 4;
    options.method = 2;
    ASSERT_FAILS_NAMING(tl_weight_quantize(w, 64, 4, &options, &weight), TL_ERR_INVALID_ARGUMENT, "method");
    w[3 * 64 + 17] = NAN;
    ASSERT_FAILS_NAMING(tl_weight_quantize(w, 64, 4, NULL, &weight), TL_ERR_INVALID_ARGUMENT, "w");
    w[3 * 64 + 17] = -INFINITY;
    ASSERT_FAILS_NAMING(tl_weight_quantize(w, 64, 4, NULL, &weight), TL_ERR_INVALID_ARGUMENT, "w");
    cr_assert_null(weight, "a failed quantize must set the output to NULL");
    free(w);
}

/* ---- tl_weight_info, tl_weight_dequantize, tl_weight_free ---- */

Test(weight_info, rejects_null) {
    float w[4 * 8] = {0};
    tl_weight *weight = NULL;
    ASSERT_OK(tl_weight_quantize(w, 8, 4, NULL, &weight));
    tl_weight_properties info;
    info.struct_size = sizeof info;
    ASSERT_FAILS_NAMING(tl_weight_info(NULL, &info), TL_ERR_INVALID_ARGUMENT, "weight");
    ASSERT_FAILS_NAMING(tl_weight_info(weight, NULL), TL_ERR_INVALID_ARGUMENT, "out");
    tl_weight_free(weight);
}

Test(weight_dequantize, checks_the_buffer, .init = rng_seed_from_env) {
    const int32_t k = 32, n = 6;
    float *w = random_matrix(k, n);
    tl_weight *weight = NULL;
    ASSERT_OK(tl_weight_quantize(w, k, n, NULL, &weight));
    const size_t count = (size_t)k * (size_t)n;
    float out[32 * 6 + 1];
    for (size_t i = 0; i < count + 1; ++i) out[i] = -12345.0f;

    ASSERT_FAILS_NAMING(tl_weight_dequantize(weight, out, count - 1), TL_ERR_BUFFER_TOO_SMALL, "192");
    for (size_t i = 0; i < count + 1; ++i) cr_assert_eq(out[i], -12345.0f, "out[%zu] written on failure", i);
    ASSERT_FAILS_NAMING(tl_weight_dequantize(weight, out, 0), TL_ERR_BUFFER_TOO_SMALL, "192");
    ASSERT_FAILS_NAMING(tl_weight_dequantize(NULL, out, count), TL_ERR_INVALID_ARGUMENT, "weight");
    ASSERT_FAILS_NAMING(tl_weight_dequantize(weight, NULL, count), TL_ERR_INVALID_ARGUMENT, "out");

    /* A larger buffer is fine and only its first k*n floats are written. */
    ASSERT_OK(tl_weight_dequantize(weight, out, count + 1));
    cr_assert_eq(out[count], -12345.0f, "dequantize wrote past k*n");
    tl_weight_free(weight);
    free(w);
}

Test(weight_free, null_is_a_no_op) {
    tl_weight_free(NULL);
}
