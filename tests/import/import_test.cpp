// tl_weight_import_int4 against GPTQ- and AWQ-layout tensors written by make_int4_checkpoints.py (CTest runs it into
// the build folder first), through the exported C API: the dequantized weight must equal the checkpoint's own
// (q - z) * s up to the one FP16 rounding of z' = -z * s; and the refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_safetensors.hpp"
#include "tinyloop.h"

#ifndef TL_IMPORT_DATA_DIR
#error "TL_IMPORT_DATA_DIR must name the folder make_int4_checkpoints.py writes to"
#endif

namespace {

using tl_test::half_to_float;
using tl_test::int4_tolerance;
using tl_test::read_safetensors;
using tl_test::Tensor;

// ---- One layer of a file ----

struct Layer {
    std::string name;
    int32_t k = 0, n = 0, groups = 0, group_size = 0;
    const Tensor *qweight = nullptr, *qzeros = nullptr, *scales = nullptr, *g_idx = nullptr, *expected = nullptr,
                 *zero = nullptr;
};

std::vector<Layer> layers_of(const std::map<std::string, Tensor> &file, bool gptq) {
    std::vector<Layer> layers;
    for (const auto &entry : file) {
        const std::string suffix = ".qweight";
        const std::string &key = entry.first;
        if (key.size() <= suffix.size() || key.compare(key.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
        Layer l;
        l.name = key.substr(0, key.size() - suffix.size());
        l.qweight = &entry.second;
        l.qzeros = &file.at(l.name + ".qzeros");
        l.scales = &file.at(l.name + ".scales");
        l.expected = &file.at(l.name + ".expected");
        l.zero = &file.at(l.name + ".zero");
        if (gptq) l.g_idx = &file.at(l.name + ".g_idx");
        l.k = static_cast<int32_t>(l.expected->shape.at(0));
        l.n = static_cast<int32_t>(l.expected->shape.at(1));
        l.groups = static_cast<int32_t>(l.scales->shape.at(0));
        l.group_size = l.groups == 1 ? 0 : l.k / l.groups;
        layers.push_back(l);
    }
    return layers;
}

tl_int4_import_desc desc_of(const Layer &l, int32_t layout) {
    tl_int4_import_desc d;
    EXPECT_EQ(tl_int4_import_desc_init(&d, sizeof d), TL_OK);
    d.layout = layout;
    d.k = l.k;
    d.n = l.n;
    d.group_size = l.group_size;
    d.qweight = l.qweight->as<int32_t>("I32");
    d.qzeros = l.qzeros->as<int32_t>("I32");
    d.scales = l.scales->as<uint16_t>("F16");
    d.g_idx = l.g_idx != nullptr ? l.g_idx->as<int32_t>("I32") : nullptr;
    d.name = l.name.c_str();
    return d;
}

// Dequantizes through the C API into w[k][n] (the checkpoint's orientation).
std::vector<float> import_and_dequantize(const tl_int4_import_desc &d) {
    tl_weight *w = nullptr;
    const tl_status st = tl_weight_import_int4(&d, &w);
    EXPECT_EQ(st, TL_OK) << tl_last_error_message();
    if (st != TL_OK) return {};
    const size_t k = static_cast<size_t>(d.k), n = static_cast<size_t>(d.n);
    std::vector<float> out(k * n);
    EXPECT_EQ(tl_weight_dequantize(w, out.data(), out.size()), TL_OK) << tl_last_error_message();
    tl_weight_free(w);
    std::vector<float> kn(k * n);
    for (size_t nn = 0; nn < n; ++nn) {
        for (size_t kk = 0; kk < k; ++kk) kn[kk * n + nn] = out[nn * k + kk];
    }
    return kn;
}

// The largest |got - expected| / |z * s| over the layer (the FP16 rounding of z' is at most 2^-11 of it), and
// whether every element is within that rounding (plus FP32 rounding of the sum).
struct Comparison {
    double worst_relative_to_offset = 0;
    double worst_relative_to_max_weight = 0;
    size_t mismatches = 0;
    std::string first_mismatch;
};

Comparison compare(const Layer &l, const std::vector<float> &got) {
    Comparison c;
    const float *expected = l.expected->as<float>("F32");
    const int32_t *zero = l.zero->as<int32_t>("I32");
    const uint16_t *scales = l.scales->as<uint16_t>("F16");
    const size_t k = static_cast<size_t>(l.k), n = static_cast<size_t>(l.n), gs = k / static_cast<size_t>(l.groups);
    const int32_t *g_idx = l.g_idx != nullptr ? l.g_idx->as<int32_t>("I32") : nullptr;
    double max_weight = 0;
    for (size_t i = 0; i < k * n; ++i) max_weight = std::max(max_weight, std::fabs(static_cast<double>(expected[i])));
    for (size_t kk = 0; kk < k; ++kk) {
        for (size_t nn = 0; nn < n; ++nn) {
            const size_t g = g_idx != nullptr ? static_cast<size_t>(g_idx[kk]) : kk / gs;
            const double offset = std::fabs(static_cast<double>(zero[g * n + nn]) * half_to_float(scales[g * n + nn]));
            const double e = expected[kk * n + nn], v = got.size() == k * n ? got[kk * n + nn] : NAN;
            const double diff = std::fabs(v - e);
            const double tolerance = int4_tolerance(e, offset);
            if (!(diff <= tolerance)) {
                if (c.mismatches++ == 0) {
                    c.first_mismatch = l.name + " W[" + std::to_string(kk) + ", " + std::to_string(nn) + "] = " +
                                       std::to_string(v) + ", expected " + std::to_string(e);
                }
            }
            if (offset > 0) c.worst_relative_to_offset = std::max(c.worst_relative_to_offset, diff / offset);
            if (max_weight > 0) c.worst_relative_to_max_weight = std::max(c.worst_relative_to_max_weight, diff / max_weight);
        }
    }
    return c;
}

class Int4Import : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        gptq_ = new std::map<std::string, Tensor>(read_safetensors(std::string(TL_IMPORT_DATA_DIR) + "/gptq.safetensors"));
        awq_ = new std::map<std::string, Tensor>(read_safetensors(std::string(TL_IMPORT_DATA_DIR) + "/awq.safetensors"));
    }
    static void TearDownTestSuite() {
        delete gptq_;
        delete awq_;
    }
    static std::map<std::string, Tensor> *gptq_, *awq_;
};
std::map<std::string, Tensor> *Int4Import::gptq_ = nullptr;
std::map<std::string, Tensor> *Int4Import::awq_ = nullptr;

void check_layers(const std::vector<Layer> &layers, int32_t layout, const char *label, size_t count) {
    ASSERT_EQ(layers.size(), count);
    double worst = 0;
    for (const Layer &l : layers) {
        const tl_int4_import_desc d = desc_of(l, layout);
        tl_weight *w = nullptr;
        ASSERT_EQ(tl_weight_import_int4(&d, &w), TL_OK) << tl_last_error_message();
        tl_weight_properties p;
        std::memset(&p, 0, sizeof p);
        p.struct_size = sizeof p;
        ASSERT_EQ(tl_weight_info(w, &p), TL_OK);
        EXPECT_EQ(p.k, l.k);
        EXPECT_EQ(p.n, l.n);
        EXPECT_EQ(p.n_groups, l.groups);
        EXPECT_EQ(p.group_size, l.k / l.groups);
        EXPECT_EQ(p.borrowed, 0);
        EXPECT_STREQ(p.name, l.name.c_str());
        tl_weight_free(w);

        const Comparison c = compare(l, import_and_dequantize(d));
        EXPECT_EQ(c.mismatches, 0u) << c.first_mismatch;
        EXPECT_LE(c.worst_relative_to_offset, std::ldexp(1.0, -11)) << l.name;
        std::cout << label << " " << l.name << ": worst |ours - (q - z) * s| = " << c.worst_relative_to_offset
                  << " of |z * s|, " << c.worst_relative_to_max_weight << " of max |W|\n";
        worst = std::max(worst, c.worst_relative_to_offset);
    }
    ::testing::Test::RecordProperty(std::string(label) + "_worst_relative_to_offset", std::to_string(worst));
}

}  // namespace

// ---- Conversion ----

TEST_F(Int4Import, GptqMatchesTheCheckpointsDequantization) { 
    // Per group 32, per group 128, per row, and act-order (group 32, its rows shuffled).
    check_layers(layers_of(*gptq_, true), TL_INT4_LAYOUT_GPTQ, "gptq", 4);
}

TEST_F(Int4Import, AwqMatchesTheCheckpointsDequantization) { check_layers(layers_of(*awq_, false), TL_INT4_LAYOUT_AWQ, "awq", 3); }

bool is_act_order(const Layer &l) { return l.name.find("_actorder") != std::string::npos; }

// g_idx is optional: without it (or with per row given as group_size = k) the result is the same, except for the
// act-order layer, whose g_idx says where its groups are (and without it, the weights differ in most elements).
TEST_F(Int4Import, GptqWithoutGIdxAndPerRowAsGroupSizeK) {
    for (const Layer &l : layers_of(*gptq_, true)) {
        tl_int4_import_desc with = desc_of(l, TL_INT4_LAYOUT_GPTQ);
        tl_int4_import_desc without = with;
        without.g_idx = nullptr;
        if (l.groups == 1) without.group_size = l.k;
        if (is_act_order(l)) {
            EXPECT_GT(compare(l, import_and_dequantize(without)).mismatches, static_cast<size_t>(l.k) * l.n / 2);
        } else {
            EXPECT_EQ(import_and_dequantize(with), import_and_dequantize(without)) << l.name;
        }
    }
}

// The data can tell a wrong reading apart: decoding the AWQ words in plain nibble order, or the GPTQ zeros without
// v1's +1, misses the expected values in most elements (so the two tests above would fail on such a bug).
TEST_F(Int4Import, TheDataDistinguishesAwqOrderAndGptqOffByOne) {
    for (const Layer &l : layers_of(*awq_, false)) {
        const size_t k = l.k, n = l.n, gs = k / l.groups;
        const int32_t *qw = l.qweight->as<int32_t>("I32"), *qz = l.qzeros->as<int32_t>("I32");
        const uint16_t *s = l.scales->as<uint16_t>("F16");
        std::vector<float> plain(k * n);
        for (size_t kk = 0; kk < k; ++kk) {
            for (size_t nn = 0; nn < n; ++nn) {
                const int q = (static_cast<uint32_t>(qw[kk * (n / 8) + nn / 8]) >> (4 * (nn % 8))) & 0xF;
                const int z = (static_cast<uint32_t>(qz[(kk / gs) * (n / 8) + nn / 8]) >> (4 * (nn % 8))) & 0xF;
                plain[kk * n + nn] = static_cast<float>(q - z) * half_to_float(s[(kk / gs) * n + nn]);
            }
        }
        EXPECT_GT(compare(l, plain).mismatches, k * n / 2) << l.name;
    }
    for (const Layer &l : layers_of(*gptq_, true)) {
        tl_int4_import_desc d = desc_of(l, TL_INT4_LAYOUT_GPTQ);
        const std::vector<float> ours = import_and_dequantize(d);
        // Without the +1 every weight would be larger by exactly s: W + s.
        std::vector<float> no_plus_one(ours.size());
        const uint16_t *s = l.scales->as<uint16_t>("F16");
        const int32_t *g_idx = l.g_idx->as<int32_t>("I32");
        const size_t n = l.n;
        for (size_t i = 0; i < ours.size(); ++i) no_plus_one[i] = ours[i] + half_to_float(s[g_idx[i / n] * n + i % n]);
        EXPECT_EQ(compare(l, no_plus_one).mismatches, ours.size()) << l.name;
    }
}

// An imported weight behaves like any owned weight: tl_weight_pack_marlin takes it (or reports that there is no
// device in this build or on this machine).
TEST_F(Int4Import, ImportedWeightIsOwnedAndPackable) {
    const Layer l = layers_of(*awq_, false).front();
    const tl_int4_import_desc d = desc_of(l, TL_INT4_LAYOUT_AWQ);
    tl_weight *w = nullptr;
    ASSERT_EQ(tl_weight_import_int4(&d, &w), TL_OK) << tl_last_error_message();
    int32_t devices = 0;
    ASSERT_EQ(tl_device_count(&devices), TL_OK);
    const tl_status st = tl_weight_pack_marlin(w, nullptr, nullptr);
    EXPECT_EQ(st, devices > 0 ? TL_OK : TL_ERR_NO_DEVICE) << tl_last_error_message();
    tl_weight_free(w);
}

// ---- Refusals ----

namespace {

// Calls the import, expects `status` and a message containing each of `needles`, and *out_weight set to NULL.
void expect_refused(const tl_int4_import_desc *d, tl_status status, std::vector<std::string> needles) {
    tl_weight *w = reinterpret_cast<tl_weight *>(static_cast<uintptr_t>(0x1));  // must be overwritten with NULL
    EXPECT_EQ(tl_weight_import_int4(d, &w), status);
    EXPECT_EQ(w, nullptr);
    const std::string message = tl_last_error_message();
    for (const std::string &needle : needles) EXPECT_NE(message.find(needle), std::string::npos) << message;
}

}  // namespace

// An act-order g_idx must still give every group group_size rows: only then can the groups be stored contiguously.
TEST_F(Int4Import, GIdxWithUnequalGroupsIsUnsupported) {
    const Layer l = layers_of(*gptq_, true).front();  // k128_n64_g32
    ASSERT_GT(l.groups, 1);
    std::vector<int32_t> g_idx(l.k);
    for (int32_t kk = 0; kk < l.k; ++kk) g_idx[kk] = kk / (l.k / l.groups);
    g_idx[0] = 1;  // group 0 one row short, group 1 one row over
    tl_int4_import_desc d = desc_of(l, TL_INT4_LAYOUT_GPTQ);
    d.g_idx = g_idx.data();
    expect_refused(&d, TL_ERR_UNSUPPORTED, {"desc->g_idx", "31 rows of K in group 0", "group_size = 32"});
}

TEST_F(Int4Import, GIdxOutOfRange) {
    const Layer l = layers_of(*gptq_, true).front();
    std::vector<int32_t> g_idx(l.g_idx->as<int32_t>("I32"), l.g_idx->as<int32_t>("I32") + l.k);
    tl_int4_import_desc d = desc_of(l, TL_INT4_LAYOUT_GPTQ);
    d.g_idx = g_idx.data();
    g_idx[5] = l.groups;
    expect_refused(&d, TL_ERR_INVALID_ARGUMENT, {"desc->g_idx[5]", "out of range"});
    g_idx[5] = -1;
    expect_refused(&d, TL_ERR_INVALID_ARGUMENT, {"desc->g_idx[5]", "out of range"});
    // AWQ has no g_idx.
    const Layer a = layers_of(*awq_, false).front();
    tl_int4_import_desc da = desc_of(a, TL_INT4_LAYOUT_AWQ);
    std::vector<int32_t> trivial(a.k);
    for (int32_t kk = 0; kk < a.k; ++kk) trivial[kk] = kk / (a.k / a.groups);
    da.g_idx = trivial.data();
    expect_refused(&da, TL_ERR_INVALID_ARGUMENT, {"desc->g_idx", "AWQ"});
}

TEST_F(Int4Import, BadShapes) {
    const Layer l = layers_of(*gptq_, true).front();  // k = 128, n = 64, group 32
    const tl_int4_import_desc good = desc_of(l, TL_INT4_LAYOUT_GPTQ);
    tl_int4_import_desc d = good;
    d.layout = 2;
    expect_refused(&d, TL_ERR_INVALID_ARGUMENT, {"desc->layout"});
    d = good;
    d.k = 0;
    expect_refused(&d, TL_ERR_INVALID_ARGUMENT, {"desc->k"});
    d = good;
    d.k = 124;  // not a multiple of 8 (GPTQ packs 8 rows per int32)
    d.g_idx = nullptr;
    d.group_size = 0;
    expect_refused(&d, TL_ERR_INVALID_ARGUMENT, {"desc->k", "multiple of 8"});
    d = good;
    d.n = 60;
    expect_refused(&d, TL_ERR_INVALID_ARGUMENT, {"desc->n", "multiple of 8"});
    d = good;
    d.n = -8;
    expect_refused(&d, TL_ERR_INVALID_ARGUMENT, {"desc->n"});
    d = good;
    d.group_size = 48;
    expect_refused(&d, TL_ERR_INVALID_ARGUMENT, {"desc->group_size", "does not divide"});
    d = good;
    d.group_size = -1;
    expect_refused(&d, TL_ERR_INVALID_ARGUMENT, {"desc->group_size", ">= 0"});
    const Layer a = layers_of(*awq_, false).front();
    tl_int4_import_desc da = desc_of(a, TL_INT4_LAYOUT_AWQ);
    da.k = 127;
    da.group_size = 0;
    expect_refused(&da, TL_ERR_INVALID_ARGUMENT, {"desc->k", "even"});
}

TEST_F(Int4Import, NullPointers) {
    const Layer l = layers_of(*gptq_, true).front();
    const tl_int4_import_desc good = desc_of(l, TL_INT4_LAYOUT_GPTQ);
    expect_refused(nullptr, TL_ERR_INVALID_ARGUMENT, {"desc is NULL"});
    EXPECT_EQ(tl_weight_import_int4(&good, nullptr), TL_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(tl_last_error_message()).find("out_weight"), std::string::npos);
    tl_int4_import_desc d = good;
    d.qweight = nullptr;
    expect_refused(&d, TL_ERR_INVALID_ARGUMENT, {"desc->qweight is NULL"});
    d = good;
    d.qzeros = nullptr;
    expect_refused(&d, TL_ERR_INVALID_ARGUMENT, {"desc->qzeros is NULL"});
    d = good;
    d.scales = nullptr;
    expect_refused(&d, TL_ERR_INVALID_ARGUMENT, {"desc->scales is NULL"});
    EXPECT_EQ(tl_int4_import_desc_init(nullptr, sizeof(tl_int4_import_desc)), TL_ERR_INVALID_ARGUMENT);
}

TEST_F(Int4Import, ScalesMustBeFiniteAndOffsetsFitFp16) {
    const Layer l = layers_of(*gptq_, true).back();  // per row, k96_n24
    tl_int4_import_desc d = desc_of(l, TL_INT4_LAYOUT_GPTQ);
    std::vector<uint16_t> scales(l.scales->as<uint16_t>("F16"), l.scales->as<uint16_t>("F16") + l.groups * l.n);
    d.scales = scales.data();
    int32_t col = 0;  // a column whose zero point is >= 2
    while (col < l.n && l.zero->as<int32_t>("I32")[col] < 2) ++col;
    ASSERT_LT(col, l.n);
    const std::string field = "desc->scales[0][" + std::to_string(col) + "]";
    scales[col] = 0x7C00;  // +Inf
    expect_refused(&d, TL_ERR_INVALID_ARGUMENT, {field, "not finite"});
    scales[col] = 0x7BFF;  // 65504: a zero point >= 2 makes z' = -z * s overflow FP16
    expect_refused(&d, TL_ERR_INVALID_ARGUMENT, {field, "does not fit in FP16"});
}

TEST_F(Int4Import, StructSizeAndInit) {
    tl_int4_import_desc d;
    std::memset(&d, 0xAB, sizeof d);
    ASSERT_EQ(tl_int4_import_desc_init(&d, sizeof d), TL_OK);
    EXPECT_EQ(d.struct_size, sizeof d);
    EXPECT_EQ(d.layout, TL_INT4_LAYOUT_GPTQ);
    EXPECT_EQ(d.k, 0);
    EXPECT_EQ(d.group_size, 0);
    EXPECT_EQ(d.qweight, nullptr);
    EXPECT_EQ(d.g_idx, nullptr);
    EXPECT_EQ(d.name, nullptr);

    // A size that is no version of the struct: refused, nothing written.
    tl_int4_import_desc untouched;
    std::memset(&untouched, 0xAB, sizeof untouched);
    EXPECT_EQ(tl_int4_import_desc_init(&untouched, sizeof untouched - 8), TL_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(tl_last_error_message()).find("struct_size"), std::string::npos);
    const unsigned char *bytes = reinterpret_cast<const unsigned char *>(&untouched);
    for (size_t i = 0; i < sizeof untouched; ++i) ASSERT_EQ(bytes[i], 0xAB) << "byte " << i;

    const Layer l = layers_of(*gptq_, true).front();
    tl_int4_import_desc bad = desc_of(l, TL_INT4_LAYOUT_GPTQ);
    bad.struct_size = sizeof bad - 8;
    expect_refused(&bad, TL_ERR_INVALID_ARGUMENT, {"desc->struct_size"});
    bad.struct_size = 0;
    expect_refused(&bad, TL_ERR_INVALID_ARGUMENT, {"desc->struct_size"});
}
