// Round trips: models written tensor by tensor with write_safetensors load with every view equal to the bytes
// written; save_model of a loaded model gives a file with the same tensors; the writer's layout is checked by
// an independent reader; config JSON, config bounds and writer errors.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <filesystem>
#include <limits>
#include <set>

#include "../common/tl_error.hpp"
#include "util/error.hpp"
#include "format_test_util.hpp"
#include "import/synthetic.hpp"
#include "cpu/cpu_forward.hpp"
#include "quant/quant.hpp"
#include "tinyloop.h"

namespace {

using tl::DType;
using tlt::HeadStore;
using tlt::ModelSpec;
using tlt::OwnedTensor;
using TensorMap = std::map<std::string, OwnedTensor>;

std::map<std::string, OwnedTensor> by_name(const std::vector<OwnedTensor> &tensors) {
    TensorMap out;
    for (const OwnedTensor &t : tensors) out[t.name] = t;
    return out;
}

bool aligned_for(const void *p, DType dtype) { return reinterpret_cast<uintptr_t>(p) % tl::dtype_size(dtype) == 0; }

void expect_bytes(const void *view, const OwnedTensor &t) {
    ASSERT_NE(view, nullptr) << t.name;
    EXPECT_TRUE(aligned_for(view, t.dtype)) << t.name;
    EXPECT_EQ(std::memcmp(view, t.bytes.data(), t.bytes.size()), 0) << t.name << " differs from what was written";
}

void expect_linear(const tl::Linear &lin, const std::string &name, int32_t k, int32_t n, int32_t config_group,
                   const TensorMap &tensors) {
    SCOPED_TRACE(name);
    EXPECT_EQ(lin.name, name);
    EXPECT_EQ(lin.k, k);
    EXPECT_EQ(lin.n, n);
    const auto dense = tensors.find(name + ".weight");
    if (dense != tensors.end()) {
        EXPECT_FALSE(lin.quantized);
        EXPECT_EQ(lin.dense_dtype, dense->second.dtype);
        expect_bytes(lin.dense, dense->second);
        return;
    }
    ASSERT_TRUE(lin.quantized);
    const OwnedTensor &qweight = tensors.at(name + ".qweight");
    EXPECT_EQ(lin.bits, qweight.dtype == DType::I8 ? 8 : 4);
    EXPECT_EQ(lin.group_size, config_group == 0 ? k : config_group);
    expect_bytes(lin.codes, qweight);
    expect_bytes(lin.scales, tensors.at(name + ".scales"));
    if (lin.bits == 8) {
        EXPECT_EQ(lin.zeros, nullptr);
        EXPECT_EQ(tensors.count(name + ".zeros"), 0u);
    } else {
        expect_bytes(lin.zeros, tensors.at(name + ".zeros"));
    }
    for (const auto &[suffix, view] : {std::pair<std::string, const uint8_t *>{".frac4", lin.frac4},
                                       std::pair<std::string, const uint8_t *>{".sign_bit", lin.sign_bit}}) {
        const auto it = tensors.find(name + suffix);
        if (it == tensors.end()) {
            EXPECT_EQ(view, nullptr) << suffix;
        } else {
            expect_bytes(view, it->second);
        }
    }
}

void expect_norm(const std::vector<float> &gain, const OwnedTensor &t) {
    ASSERT_EQ(gain.size(), t.values.size()) << t.name;
    for (size_t i = 0; i < gain.size(); ++i) EXPECT_EQ(gain[i], t.values[i]) << t.name << "[" << i << "]";
}

void expect_config(const tl::ModelConfig &a, const tl::ModelConfig &b) {
    EXPECT_EQ(a.d_model, b.d_model);
    EXPECT_EQ(a.n_heads, b.n_heads);
    EXPECT_EQ(a.kv_heads(), b.kv_heads());
    EXPECT_EQ(a.head_dim, b.head_dim);
    EXPECT_EQ(a.ffn, b.ffn);
    EXPECT_EQ(a.vocab, b.vocab);
    EXPECT_EQ(a.pre, b.pre);
    EXPECT_EQ(a.loops, b.loops);
    EXPECT_EQ(a.max_seq, b.max_seq);
    EXPECT_EQ(a.group_size, b.group_size);
    EXPECT_EQ(a.bits, b.bits);
    EXPECT_EQ(std::memcmp(&a.rope_theta, &b.rope_theta, sizeof(float)), 0) << a.rope_theta << " vs " << b.rope_theta;
    EXPECT_EQ(std::memcmp(&a.norm_eps, &b.norm_eps, sizeof(float)), 0) << a.norm_eps << " vs " << b.norm_eps;
    const tl::RopeScaling &r = a.rope_scaling, &s = b.rope_scaling;
    EXPECT_EQ(r.type, s.type);
    if (r.type == tl::RopeScalingType::None || s.type == tl::RopeScalingType::None) return;
    EXPECT_EQ(r.factor, s.factor);
    if (r.type != tl::RopeScalingType::Linear) {
        EXPECT_EQ(r.original_max_positions, s.original_max_positions);
    }
    if (r.type == tl::RopeScalingType::Llama3) {
        EXPECT_EQ(r.low_freq_factor, s.low_freq_factor);
        EXPECT_EQ(r.high_freq_factor, s.high_freq_factor);
    }
    if (r.type == tl::RopeScalingType::Yarn) {
        EXPECT_EQ(r.beta_fast, s.beta_fast);
        EXPECT_EQ(r.beta_slow, s.beta_slow);
        EXPECT_EQ(r.attention_factor, s.attention_factor);
        EXPECT_EQ(r.truncate, s.truncate);
    }
}

// Every view of `model` against the tensors of the file it was loaded from.
void expect_model(const tl::Model &model, const tl::ModelConfig &config, const TensorMap &tensors, uint64_t file_size) {
    expect_config(model.config, config);
    EXPECT_EQ(model.format_version, 1);
    const int32_t d = config.d_model, a = config.n_heads * config.head_dim, f = config.ffn, v = config.vocab;
    const OwnedTensor &embed = tensors.at("embed.weight");
    EXPECT_EQ(model.embed_dtype, embed.dtype);
    expect_bytes(model.embed, embed);

    ASSERT_EQ(model.pre.size(), size_t(config.pre));
    for (int i = -1; i < config.pre; ++i) {
        const std::string p = i < 0 ? "loop." : "pre." + std::to_string(i) + ".";
        const tl::Block &b = i < 0 ? model.loop : model.pre[size_t(i)];
        expect_norm(b.attn_norm, tensors.at(p + "attn_norm.weight"));
        expect_norm(b.mlp_norm, tensors.at(p + "mlp_norm.weight"));
        expect_linear(b.attn_qkv, p + "attn_qkv", d, 3 * a, config.group_size, tensors);
        expect_linear(b.attn_out, p + "attn_out", a, d, config.group_size, tensors);
        expect_linear(b.mlp_gate, p + "mlp_gate", d, f, config.group_size, tensors);
        expect_linear(b.mlp_up, p + "mlp_up", d, f, config.group_size, tensors);
        expect_linear(b.mlp_down, p + "mlp_down", f, d, config.group_size, tensors);
    }
    expect_norm(model.final_norm, tensors.at("final_norm.weight"));

    if (tensors.count("head.qweight")) {
        EXPECT_EQ(model.head_kind, tl::HeadKind::Quantized);
        expect_linear(model.head, "head", d, v, config.group_size, tensors);
    } else if (tensors.count("head.weight")) {
        EXPECT_EQ(model.head_kind, tl::HeadKind::Dense);
        expect_linear(model.head, "head", d, v, config.group_size, tensors);
    } else {
        EXPECT_EQ(model.head_kind, tl::HeadKind::Tied);
        EXPECT_FALSE(model.head.quantized);
        EXPECT_EQ(model.head.dense, model.embed);
        EXPECT_EQ(model.head.dense_dtype, model.embed_dtype);
        EXPECT_EQ(model.head.k, d);
        EXPECT_EQ(model.head.n, v);
    }
    EXPECT_EQ(model.linears().size(), size_t(5 * (config.pre + 1) + (model.head_kind == tl::HeadKind::Tied ? 0 : 1)));

    uint64_t tensor_bytes = 0;
    for (const auto &kv : tensors) tensor_bytes += kv.second.bytes.size();
    EXPECT_EQ(model.file_bytes, file_size);
    EXPECT_EQ(model.tensor_bytes, tensor_bytes);
    EXPECT_EQ(model.n_tensors, tensors.size());
}

// What the writer promises, read back independently: the data section starts 8-aligned after a space-padded
// header, tensors are contiguous from 0 to the end with no holes, wider dtypes first, each aligned.
TensorMap expect_writer_layout(const std::string &path) {
    const std::vector<uint8_t> bytes = tlt::read_bytes(path);
    const tlt::RawFile raw = tlt::parse_raw(bytes);
    EXPECT_EQ((8 + raw.header_len) % 8, 0u);
    const std::string text(bytes.begin() + 8, bytes.begin() + 8 + long(raw.header_len));
    EXPECT_EQ(text.find_last_not_of(' '), text.rfind('}')) << "padding must be spaces after the JSON";

    std::vector<std::tuple<uint64_t, uint64_t, size_t>> spans;  // begin, end, dtype size
    const TensorMap tensors = tlt::tensors_of(raw);
    for (const auto &kv : raw.header.items()) {
        if (kv.key() == "__metadata__") continue;
        const auto offsets = kv.value()["data_offsets"].get<std::vector<uint64_t>>();
        spans.emplace_back(offsets[0], offsets[1], tl::dtype_size(tensors.at(kv.key()).dtype));
    }
    std::sort(spans.begin(), spans.end());
    uint64_t expected_begin = 0;
    size_t previous_width = 8;
    for (const auto &[begin, end, width] : spans) {
        EXPECT_EQ(begin, expected_begin) << "hole or overlap in the data section";
        EXPECT_EQ(begin % width, 0u);
        EXPECT_LE(width, previous_width) << "wider dtypes must come first";
        expected_begin = end;
        previous_width = width;
    }
    EXPECT_EQ(expected_begin, raw.data.size());
    return tensors;
}

struct SpecCase {
    const char *name;
    ModelSpec spec;
};

ModelSpec spec_of(int32_t group, bool dense, HeadStore head, bool frac4, bool sign_bit, DType norm, DType embed,
                  DType dense_dtype, int32_t bits = 4) {
    ModelSpec s;
    s.bits = bits;
    s.group_size = group;
    s.dense_linears = dense;
    s.head = head;
    s.frac4 = frac4;
    s.sign_bit = sign_bit;
    s.norm_dtype = norm;
    s.embed_dtype = embed;
    s.dense_dtype = dense_dtype;
    return s;
}

void PrintTo(const SpecCase &c, std::ostream *os) { *os << c.name; }

class RoundTrip : public ::testing::TestWithParam<SpecCase> {};

TEST_P(RoundTrip, LoadsWhatWasWrittenAndSavesItBack) {
    const SpecCase &c = GetParam();
    tl::ModelConfig config = tlt::small_config(c.spec.group_size);
    if (!c.spec.dense_linears || c.spec.head == HeadStore::Quantized) config.bits = c.spec.bits;
    std::mt19937_64 rng(std::random_device{}());
    const std::vector<OwnedTensor> written = tlt::make_tensors(config, c.spec, rng);
    const std::string path = tlt::temp_dir() + "/" + c.name + ".tinyloop";
    tl::write_safetensors(path, tlt::model_metadata(config), tlt::views_of(written));
    const TensorMap on_disk = expect_writer_layout(path);
    const TensorMap expected = by_name(written);
    ASSERT_EQ(on_disk.size(), expected.size());
    for (const auto &kv : expected) {
        SCOPED_TRACE(kv.first);
        ASSERT_TRUE(on_disk.count(kv.first));
        EXPECT_EQ(on_disk.at(kv.first).dtype, kv.second.dtype);
        EXPECT_EQ(on_disk.at(kv.first).shape, kv.second.shape);
        EXPECT_EQ(on_disk.at(kv.first).bytes, kv.second.bytes);
    }

    std::unique_ptr<tl::Model> loaded;
    for (bool use_mmap : {true, false}) {
        SCOPED_TRACE(use_mmap ? "mmap" : "read");
        loaded = tl::load_model(path, tl::LoadOptions{use_mmap, true});
        expect_model(*loaded, config, expected, tlt::read_bytes(path).size());
    }

    // save_model writes norms as F32 and every other tensor with its bytes unchanged.
    const std::string saved = tlt::temp_dir() + "/" + c.name + ".saved.tinyloop";
    tl::save_model(saved, *loaded);
    const TensorMap resaved = expect_writer_layout(saved);
    ASSERT_EQ(resaved.size(), expected.size());
    for (const auto &kv : expected) {
        SCOPED_TRACE(kv.first);
        ASSERT_TRUE(resaved.count(kv.first));
        const OwnedTensor &t = resaved.at(kv.first);
        EXPECT_EQ(t.shape, kv.second.shape);
        if (kv.first.find("norm.weight") != std::string::npos) {
            ASSERT_EQ(t.dtype, DType::F32);
            ASSERT_EQ(t.bytes.size(), kv.second.values.size() * 4);
            for (size_t i = 0; i < kv.second.values.size(); ++i) {
                float value;
                std::memcpy(&value, t.bytes.data() + 4 * i, 4);
                EXPECT_EQ(value, kv.second.values[i]) << i;
            }
        } else {
            EXPECT_EQ(t.dtype, kv.second.dtype);
            EXPECT_EQ(t.bytes, kv.second.bytes);
        }
    }
    TensorMap resaved_with_values = resaved;
    for (auto &kv : resaved_with_values) kv.second.values = expected.at(kv.first).values;
    expect_model(*tl::load_model(saved, tl::LoadOptions{}), config, resaved_with_values, tlt::read_bytes(saved).size());
}

using HS = HeadStore;
constexpr DType F16 = DType::F16, F32 = DType::F32, BF16 = DType::BF16;
// clang-format off: a table of variants.
INSTANTIATE_TEST_SUITE_P(Specs, RoundTrip, ::testing::Values(
  //        name                        group dense  head           frac4  sign   norms embed dense linears
  SpecCase{"per_group_tied_head",     spec_of(8, false, HS::Tied,      false, false, F32,  F16,  F16)},
  SpecCase{"per_row_quantized_head",  spec_of(0, false, HS::Quantized, false, false, F32,  F32,  F16)},
  SpecCase{"per_group_dense_head",    spec_of(8, false, HS::Dense,     false, false, F16,  F16,  F32)},
  SpecCase{"dense_linears_f16",       spec_of(8, true,  HS::Dense,     false, false, F32,  F16,  F16)},
  SpecCase{"dense_linears_bf16_tied", spec_of(0, true,  HS::Tied,      false, false, BF16, BF16, BF16)},
  SpecCase{"frac4_and_sign_bit",      spec_of(8, false, HS::Quantized, true,  true,  F16,  F16,  F16)},
  SpecCase{"per_row_frac4_only",      spec_of(0, false, HS::Tied,      true,  false, F32,  F16,  F16)},
  SpecCase{"sign_bit_group_4",        spec_of(4, false, HS::Quantized, false, true,  F32,  F16,  F16)},
  SpecCase{"int8_per_row_quantized_head", spec_of(0, false, HS::Quantized, false, false, F32, F16, F16, 8)},
  SpecCase{"int8_per_group_tied_head",    spec_of(8, false, HS::Tied,      false, false, F16, BF16, F16, 8)},
  SpecCase{"int8_per_group_dense_head",   spec_of(8, false, HS::Dense,     false, false, F32, F16,  F32, 8)}),
  [](const ::testing::TestParamInfo<SpecCase> &info) { return std::string(info.param.name); });
// clang-format on

// Another writer may place tensors anywhere: here the header is unpadded and U8 tensors come first, so F16/F32
// tensors sit at odd addresses. The loader must hand out aligned views (copies) with the same bytes.
TEST(Alignment, MisalignedTensorsAreCopiedToAlignedStorage) {
    const tl::ModelConfig config = tlt::small_config(8);
    ModelSpec spec = spec_of(8, false, HeadStore::Quantized, true, false, DType::F32, DType::F32, DType::F16);
    std::mt19937_64 rng(std::random_device{}());
    std::vector<OwnedTensor> tensors = tlt::make_tensors(config, spec, rng);
    std::stable_sort(tensors.begin(), tensors.end(), [](const OwnedTensor &x, const OwnedTensor &y) {
        return tl::dtype_size(x.dtype) < tl::dtype_size(y.dtype);
    });
    tlt::RawFile raw;
    raw.header["__metadata__"] = tlt::model_metadata(config);
    raw.data.push_back(0x5A);  // one stray byte first, so even a 1-byte-aligned header leaves the rest misaligned
    for (const OwnedTensor &t : tensors) {
        raw.header[t.name] = {{"dtype", tl::dtype_name(t.dtype)},
                              {"shape", t.shape},
                              {"data_offsets", {raw.data.size(), raw.data.size() + t.bytes.size()}}};
        raw.data.insert(raw.data.end(), t.bytes.begin(), t.bytes.end());
    }
    const std::vector<uint8_t> bytes = tlt::encode_raw(raw);
    const uint64_t data_start = bytes.size() - raw.data.size();
    int misaligned = 0;
    for (const auto &kv : raw.header.items()) {
        if (kv.key() == "__metadata__") continue;
        const uint64_t begin = kv.value()["data_offsets"][0].get<uint64_t>();
        const size_t width = tl::dtype_size(by_name(tensors).at(kv.key()).dtype);
        misaligned += (data_start + begin) % width != 0;
    }
    ASSERT_GT(misaligned, 0) << "the test file must contain misaligned tensors";

    const std::string path = tlt::temp_dir() + "/misaligned.tinyloop";
    tlt::write_bytes(path, bytes);
    for (bool use_mmap : {true, false}) {
        SCOPED_TRACE(use_mmap ? "mmap" : "read");
        const auto model = tl::load_model(path, tl::LoadOptions{use_mmap, true});
        expect_model(*model, config, by_name(tensors), bytes.size());
    }
}

void expect_same_linear(const tl::Linear &got, const tl::Linear &want) {
    SCOPED_TRACE(want.name);
    ASSERT_EQ(got.quantized, want.quantized);
    ASSERT_EQ(got.k, want.k);
    ASSERT_EQ(got.n, want.n);
    const size_t kn = size_t(want.k) * size_t(want.n);
    auto same = [](const void *a, const void *b, size_t bytes) {
        ASSERT_EQ(a == nullptr, b == nullptr);
        if (a) {
            EXPECT_EQ(std::memcmp(a, b, bytes), 0);
        }
    };
    if (!want.quantized) {
        ASSERT_EQ(got.dense_dtype, want.dense_dtype);
        same(got.dense, want.dense, kn * tl::dtype_size(want.dense_dtype));
        return;
    }
    ASSERT_EQ(got.group_size, want.group_size);
    ASSERT_EQ(got.bits, want.bits);
    const size_t groups = size_t(want.n_groups()) * size_t(want.n);
    same(got.codes, want.codes, want.bits == 8 ? kn : kn / 2);
    same(got.scales, want.scales, groups * 2);
    same(got.zeros, want.zeros, groups * 2);
    same(got.frac4, want.frac4, kn / 2);
    same(got.sign_bit, want.sign_bit, kn / 8);
}

// Models from the library's synthetic generator (another writer of Model) survive save_model + load_model.
TEST(SaveModel, SyntheticModelsSurviveARoundTrip) {
    struct Variant {
        int32_t group_size;
        bool quantized, quantize_head, frac4, sign_bit;
        int32_t bits = 4;
    };
    const Variant variants[] = {{8, true, false, false, false},
                                {0, true, true, false, false},
                                {8, false, false, false, false},
                                {8, true, true, true, true},
                                {8, true, false, false, false, 8},
                                {0, true, true, false, false, 8}};
    for (const Variant &v : variants) {
        tl::ModelConfig config = tlt::small_config(v.group_size);
        config.bits = v.bits;
        tl::SyntheticOptions options;
        options.seed = std::random_device{}();
        options.quantized = v.quantized;
        options.quantize_head = v.quantize_head;
        options.frac4 = v.frac4;
        options.sign_bit = v.sign_bit;
        const auto original = tl::make_synthetic_model(config, options);
        const std::string path = tlt::temp_dir() + "/synthetic.tinyloop";
        tl::save_model(path, *original);
        const auto loaded = tl::load_model(path, tl::LoadOptions{});
        expect_config(loaded->config, config);
        ASSERT_EQ(loaded->head_kind, original->head_kind);
        ASSERT_EQ(loaded->embed_dtype, original->embed_dtype);
        EXPECT_EQ(std::memcmp(loaded->embed, original->embed,
                              size_t(config.vocab) * size_t(config.d_model) * tl::dtype_size(original->embed_dtype)),
                  0);
        const auto got = loaded->linears(), want = original->linears();
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < want.size(); ++i) expect_same_linear(*got[i], *want[i]);
        for (size_t i = 0; i < original->pre.size(); ++i) {
            EXPECT_EQ(loaded->pre[i].attn_norm, original->pre[i].attn_norm);
            EXPECT_EQ(loaded->pre[i].mlp_norm, original->pre[i].mlp_norm);
        }
        EXPECT_EQ(loaded->loop.attn_norm, original->loop.attn_norm);
        EXPECT_EQ(loaded->loop.mlp_norm, original->loop.mlp_norm);
        EXPECT_EQ(loaded->final_norm, original->final_norm);
    }
}

// A linear stored in another K order with the k_perm that undoes it: row i of the storage holds input
// perm[i], with perm moving whole groups and shuffling rows inside each, so the groups' scales move with them.
tl::Linear stored_permuted(const tl::Linear &w, std::mt19937_64 &rng) {
    const int32_t gs = w.group_size, groups = w.n_groups();
    std::vector<int32_t> group_order(groups), perm(w.k);
    std::iota(group_order.begin(), group_order.end(), 0);
    std::shuffle(group_order.begin(), group_order.end(), rng);
    for (int32_t g = 0; g < groups; ++g) {
        std::iota(perm.begin() + g * gs, perm.begin() + (g + 1) * gs, group_order[g] * gs);
        std::shuffle(perm.begin() + g * gs, perm.begin() + (g + 1) * gs, rng);
    }
    tl::QuantizedMatrix m;
    m.k = w.k, m.n = w.n, m.group_size = gs, m.bits = w.bits;
    m.codes.assign(static_cast<size_t>(w.n) * w.k / 2, 0);
    for (int32_t nn = 0; nn < w.n; ++nn) {
        for (int32_t i = 0; i < w.k; ++i) {
            const uint8_t q = tl::code_at(w, perm[i], nn);
            m.codes[static_cast<size_t>(nn) * w.k / 2 + i / 2] |= static_cast<uint8_t>(i & 1 ? q << 4 : q);
        }
        for (int32_t g = 0; g < groups; ++g) {
            m.scales.push_back(w.scales[static_cast<size_t>(nn) * groups + group_order[g]]);
            m.zeros.push_back(w.zeros[static_cast<size_t>(nn) * groups + group_order[g]]);
        }
    }
    m.k_perm = perm;
    return tl::make_quantized_linear(w.name, std::move(m));
}

// k_perm: a model whose linears are stored in other K orders is the same model. It dequantizes to the same weights,
// scores exactly the same on the CPU, and keeps its k_perm tensors through save_model + load_model.
TEST(KPerm, TheSameModelStoredInAnotherKOrder) {
    std::mt19937_64 rng(std::random_device{}());
    tl::SyntheticOptions options;
    options.seed = rng();
    const auto original = tl::make_synthetic_model(tlt::small_config(8), options);
    auto permuted = tl::make_synthetic_model(tlt::small_config(8), options);
    for (tl::Block *b : {&permuted->pre[0], &permuted->pre[1], &permuted->loop}) {
        for (int i = 0; i < 5; ++i) *b->linear(i) = stored_permuted(*b->linear(i), rng);
    }
    const auto want = original->linears(), got = permuted->linears();
    for (size_t i = 0; i < want.size(); ++i) {
        std::vector<float> a(static_cast<size_t>(want[i]->k) * want[i]->n), b(a.size());
        tl::dequantize_rows(*want[i], 0, want[i]->n, a.data());
        tl::dequantize_rows(*got[i], 0, got[i]->n, b.data());
        EXPECT_EQ(a, b) << want[i]->name;
    }
    const std::string path = tlt::temp_dir() + "/k_perm.tinyloop";
    tl::save_model(path, *permuted);
    const auto loaded = tl::load_model(path, tl::LoadOptions{});
    for (const tl::Linear *l : loaded->linears()) {
        if (l->name == "head") continue;
        ASSERT_NE(l->k_perm, nullptr) << l->name;
    }
    std::vector<int32_t> tokens(40);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(rng() % 50);
    tl::ScoreOptions o;
    o.n_threads = 2;
    const double reference = tl::score_cpu(*original, tokens.data(), tokens.size(), o).nll_sum;
    EXPECT_EQ(tl::score_cpu(*permuted, tokens.data(), tokens.size(), o).nll_sum, reference);
    EXPECT_EQ(tl::score_cpu(*loaded, tokens.data(), tokens.size(), o).nll_sum, reference);
}

// Biases: saved as F32 <name>.bias [N] in a format_version 2 file (a model without them stays version 1), loaded
// back the same, and the loaded model scores exactly as the one saved. A bias of the wrong shape or with a NaN is
// refused naming it.
TEST(Bias, SavedAsVersion2AndLoadedBack) {
    std::mt19937_64 rng(std::random_device{}());
    tl::SyntheticOptions options;
    options.seed = rng();
    options.quantize_head = true;
    const auto plain = tl::make_synthetic_model(tlt::small_config(8), options);
    EXPECT_EQ(tl::required_format_version(*plain), 1);
    options.biases = true;
    const auto original = tl::make_synthetic_model(tlt::small_config(8), options);
    EXPECT_EQ(tl::required_format_version(*original), 2);
    const std::string path = tlt::temp_dir() + "/bias.tinyloop";
    tl::save_model(path, *original);
    const tl::SafetensorsFile file = tl::read_safetensors(path);
    EXPECT_EQ(file.metadata.at("format_version"), "2");
    const auto loaded = tl::load_model(path, tl::LoadOptions{});
    EXPECT_EQ(loaded->format_version, 2);
    const auto got = loaded->linears(), want = original->linears();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_TRUE(want[i]->bias && got[i]->bias) << want[i]->name;
        EXPECT_EQ(*got[i]->bias, *want[i]->bias) << want[i]->name;
        const tl::SafetensorsTensor &t = file.tensors.at(want[i]->name + ".bias");
        EXPECT_EQ(t.dtype, DType::F32);
        EXPECT_EQ(t.shape, std::vector<int64_t>{want[i]->n});
    }
    std::vector<int32_t> tokens(40);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(rng() % 50);
    tl::ScoreOptions o;
    o.n_threads = 2;
    const double with_bias = tl::score_cpu(*original, tokens.data(), tokens.size(), o).nll_sum;
    EXPECT_EQ(tl::score_cpu(*loaded, tokens.data(), tokens.size(), o).nll_sum, with_bias);
    EXPECT_NE(tl::score_cpu(*plain, tokens.data(), tokens.size(), o).nll_sum, with_bias);

    // The same tensors with one bias changed, written as another file.
    auto rewrite = [&](const std::vector<int64_t> &shape, float value) {
        std::vector<tl::TensorView> views;
        std::vector<float> bias(static_cast<size_t>(shape[0]), value);
        for (const auto &kv : file.tensors) {
            const tl::SafetensorsTensor &t = kv.second;
            if (kv.first == "pre.1.mlp_up.bias") {
                views.push_back({kv.first, DType::F32, shape, bias.data()});
            } else {
                views.push_back({kv.first, t.dtype, t.shape, t.data});
            }
        }
        const std::string bad = tlt::temp_dir() + "/bad_bias.tinyloop";
        tl::write_safetensors(bad, file.metadata, views);
        return bad;
    };
    const int64_t n = original->pre[1].mlp_up.n;
    for (const auto &[shape, value, message] :
         {std::tuple<std::vector<int64_t>, float, std::string>{{n + 1}, 0.0f, "tensor 'pre.1.mlp_up.bias': shape ["},
          {{n}, std::numeric_limits<float>::quiet_NaN(), "tensor 'pre.1.mlp_up.bias': non-finite value"}}) {
        EXPECT_TRUE(tlt::throws(TL_ERR_FORMAT, {message}, [&] { tl::load_model(rewrite(shape, value), {}); }));
    }
}

// Grouped-query attention: n_kv_heads in the config (written only when below n_heads), attn_qkv of
// (n_heads + 2 n_kv_heads) head_dim rows, format_version 2; the loaded model scores as the saved one. A count that
// does not divide n_heads, or a qkv of the version-1 shape, is refused naming it.
TEST(GroupedQueryAttention, SavedAsVersion2AndLoadedBack) {
    std::mt19937_64 rng(std::random_device{}());
    tl::ModelConfig config = tlt::small_config(8);
    config.n_heads = 4;
    config.head_dim = 6;
    config.n_kv_heads = 2;
    tl::SyntheticOptions options;
    options.seed = rng();
    const auto original = tl::make_synthetic_model(config, options);
    EXPECT_EQ(original->loop.attn_qkv.n, (4 + 2 * 2) * 6);
    EXPECT_EQ(tl::required_format_version(*original), 2);
    const nlohmann::json j = nlohmann::json::parse(tl::config_to_json(config));
    EXPECT_EQ(j["n_kv_heads"], 2);
    config.n_kv_heads = 4;
    EXPECT_EQ(nlohmann::json::parse(tl::config_to_json(config)).count("n_kv_heads"), 0u);

    const std::string path = tlt::temp_dir() + "/gqa.tinyloop";
    tl::save_model(path, *original);
    const tl::SafetensorsFile file = tl::read_safetensors(path);
    EXPECT_EQ(file.metadata.at("format_version"), "2");
    EXPECT_EQ(file.tensors.at("pre.0.attn_qkv.qweight").shape, (std::vector<int64_t>{48, 12}));
    const auto loaded = tl::load_model(path, tl::LoadOptions{});
    EXPECT_EQ(loaded->config.kv_heads(), 2);
    std::vector<int32_t> tokens(40);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(rng() % 50);
    tl::ScoreOptions o;
    o.n_threads = 2;
    EXPECT_EQ(tl::score_cpu(*loaded, tokens.data(), tokens.size(), o).nll_sum,
              tl::score_cpu(*original, tokens.data(), tokens.size(), o).nll_sum);

    nlohmann::json bad = nlohmann::json::parse(file.metadata.at("config"));
    bad["n_kv_heads"] = 3;
    EXPECT_TRUE(tlt::throws(TL_ERR_FORMAT, {"n_kv_heads = 3 must divide n_heads = 4"},
                            [&] { tl::validate_config(tl::config_from_json(bad.dump())); }));
    std::map<std::string, std::string> metadata = file.metadata;  // the same tensors, the config without n_kv_heads
    bad.erase("n_kv_heads");
    metadata["config"] = bad.dump();
    std::vector<tl::TensorView> views;
    for (const auto &kv : file.tensors) views.push_back({kv.first, kv.second.dtype, kv.second.shape, kv.second.data});
    const std::string mismatched = tlt::temp_dir() + "/gqa_mismatched.tinyloop";
    tl::write_safetensors(mismatched, metadata, views);
    EXPECT_TRUE(tlt::throws(TL_ERR_FORMAT, {"tensor 'pre.0.attn_qkv.qweight': shape [48, 12], expected [72, 12]"},
                            [&] { tl::load_model(mismatched, tl::LoadOptions{}); }));
}

TEST(ConfigJson, RoundTripsEveryFieldExactly) {
    std::mt19937_64 rng(std::random_device{}());
    std::uniform_int_distribution<int32_t> any_int(std::numeric_limits<int32_t>::min(),
                                                   std::numeric_limits<int32_t>::max());
    std::uniform_real_distribution<float> exponent(-30.0f, 30.0f);
    for (int trial = 0; trial < 200; ++trial) {
        tl::ModelConfig c;
        c.d_model = any_int(rng);
        c.n_heads = any_int(rng);
        c.head_dim = any_int(rng);
        c.ffn = any_int(rng);
        c.vocab = any_int(rng);
        c.pre = any_int(rng);
        c.loops = any_int(rng);
        c.max_seq = any_int(rng);
        c.group_size = any_int(rng);
        c.bits = any_int(rng);
        c.rope_theta = std::pow(10.0f, exponent(rng));
        c.norm_eps = -std::pow(2.0f, exponent(rng));
        const std::string text = tl::config_to_json(c);
        // The stored JSON names every field as documented.
        const nlohmann::json j = nlohmann::json::parse(text);
        ASSERT_EQ(j.size(), 12u) << text;
        EXPECT_EQ(j["d_model"].get<int32_t>(), c.d_model);
        EXPECT_EQ(j["group_size"].get<int32_t>(), c.group_size);
        EXPECT_EQ(static_cast<float>(j["rope_theta"].get<double>()), c.rope_theta);
        expect_config(tl::config_from_json(text), c);
    }
    // Short decimals stay short in the file (readers see 1e-05, not the float's long double expansion).
    EXPECT_NE(tl::config_to_json(tlt::small_config(0)).find("1e-05"), std::string::npos);
}

const char *const kConfigFields[] = {"d_model", "n_heads", "head_dim",   "ffn",  "vocab",      "pre",
                                     "loops",   "max_seq", "group_size", "bits", "rope_theta", "norm_eps"};

void expect_format_error(const std::function<void()> &fn, const std::string &substring) {
    EXPECT_TRUE(tlt::throws(TL_ERR_FORMAT, {substring}, fn));
}

// rope_scaling: each type's fields round-trip exactly (doubles as written), only that type's fields are stored, a
// model with one is format_version 2, and bad values are refused naming the field.
TEST(ConfigJson, RopeScalingRoundTripsAndIsValidated) {
    std::mt19937_64 rng(std::random_device{}());
    std::uniform_real_distribution<double> any(1.0, 64.0);
    const std::pair<tl::RopeScalingType, size_t> types[] = {{tl::RopeScalingType::Linear, 2},
                                                            {tl::RopeScalingType::Dynamic, 3},
                                                            {tl::RopeScalingType::Llama3, 5},
                                                            {tl::RopeScalingType::Yarn, 7}};
    for (const auto &[type, fields] : types) {
        SCOPED_TRACE(tl::rope_scaling_name(type));
        tl::ModelConfig c = tlt::small_config(8);
        c.rope_scaling.type = type;
        c.rope_scaling.factor = any(rng);
        c.rope_scaling.original_max_positions = 4096;
        c.rope_scaling.low_freq_factor = any(rng);
        c.rope_scaling.high_freq_factor = c.rope_scaling.low_freq_factor + any(rng);
        c.rope_scaling.beta_fast = any(rng);
        c.rope_scaling.beta_slow = any(rng);
        c.rope_scaling.attention_factor = any(rng);
        c.rope_scaling.truncate = rng() % 2 == 0;
        tl::validate_config(c);
        const std::string text = tl::config_to_json(c);
        const nlohmann::json j = nlohmann::json::parse(text);
        ASSERT_EQ(j.size(), 13u) << text;
        EXPECT_EQ(j["rope_scaling"].size(), fields) << text;
        EXPECT_EQ(j["rope_scaling"]["type"], tl::rope_scaling_name(type));
        expect_config(tl::config_from_json(text), c);
        tl::SyntheticOptions options;
        const auto model = tl::make_synthetic_model(c, options);
        EXPECT_EQ(tl::required_format_version(*model), 2);
    }
    EXPECT_EQ(nlohmann::json::parse(tl::config_to_json(tlt::small_config(8))).count("rope_scaling"), 0u);

    nlohmann::json j = nlohmann::json::parse(tl::config_to_json(tlt::small_config(8)));
    j["rope_scaling"] = {{"type", "longrope"}, {"factor", 2.0}};
    expect_format_error([&] { tl::config_from_json(j.dump()); }, "rope_scaling type 'longrope' is not one");
    j["rope_scaling"] = {{"type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}};
    expect_format_error([&] { tl::config_from_json(j.dump()); }, "rope_scaling: missing field 'high_freq_factor'");
    j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 1.5}};
    expect_format_error([&] { tl::config_from_json(j.dump()); }, "'original_max_position_embeddings' must be");
    j["rope_scaling"] = "linear";
    expect_format_error([&] { tl::config_from_json(j.dump()); }, "rope_scaling must be an object");

    auto invalid = [](const std::function<void(tl::ModelConfig &)> &edit, const std::string &message) {
        tl::ModelConfig c = tlt::small_config(8);
        c.rope_scaling.type = tl::RopeScalingType::Yarn;
        c.rope_scaling.original_max_positions = 64;
        edit(c);
        expect_format_error([&] { tl::validate_config(c); }, message);
    };
    invalid([](tl::ModelConfig &c) { c.rope_scaling.factor = 0.0; }, "rope_scaling (yarn): factor = 0");
    invalid([](tl::ModelConfig &c) { c.rope_scaling.attention_factor = NAN; }, "attention_factor");
    invalid([](tl::ModelConfig &c) { c.rope_scaling.original_max_positions = 0; }, "original_max_position_embeddings");
    invalid(
        [](tl::ModelConfig &c) {
            c.rope_scaling.type = tl::RopeScalingType::Dynamic;
            c.rope_scaling.original_max_positions = c.max_seq - 1;
        },
        "max_seq = 32 exceeds original_max_position_embeddings = 31");
    invalid(
        [](tl::ModelConfig &c) {
            c.rope_scaling.type = tl::RopeScalingType::Llama3;
            c.rope_scaling.high_freq_factor = c.rope_scaling.low_freq_factor;
        },
        "high_freq_factor");
}

TEST(ConfigJson, MissingOrMistypedFieldsAreNamed) {
    const nlohmann::json valid = nlohmann::json::parse(tl::config_to_json(tlt::small_config(8)));
    for (const char *field : kConfigFields) {
        SCOPED_TRACE(field);
        nlohmann::json missing = valid;
        missing.erase(field);
        expect_format_error([&] { tl::config_from_json(missing.dump()); }, std::string("'") + field + "'");
        nlohmann::json mistyped = valid;
        mistyped[field] = "12";
        expect_format_error([&] { tl::config_from_json(mistyped.dump()); }, std::string("'") + field + "'");
    }
    nlohmann::json fractional = valid;
    fractional["ffn"] = 40.5;
    expect_format_error([&] { tl::config_from_json(fractional.dump()); }, "'ffn'");
    nlohmann::json too_big = valid;
    too_big["vocab"] = int64_t{1} << 40;
    expect_format_error([&] { tl::config_from_json(too_big.dump()); }, "'vocab'");
    expect_format_error([&] { tl::config_from_json("[1, 2]"); }, "not a JSON object");
    expect_format_error([&] { tl::config_from_json("{\"d_model\": "); }, "not valid JSON");
}

TEST(ValidateConfig, AcceptsTheBoundsAndRejectsJustOutside) {
    using Edit = std::function<void(tl::ModelConfig &)>;
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    const std::vector<Edit> accepted = {
        [](tl::ModelConfig &c) {
            c.d_model = 1;
            c.group_size = 0;
        },
        [](tl::ModelConfig &c) { c.d_model = 65536; },
        [](tl::ModelConfig &c) {
            c.head_dim = 2;
            c.group_size = 0;
        },
        [](tl::ModelConfig &c) {
            c.n_heads = 1;
            c.head_dim = 1024;
        },
        [](tl::ModelConfig &c) {
            c.n_heads = 64;
            c.head_dim = 1024;
        },
        [](tl::ModelConfig &c) { c.ffn = 1 << 20; },
        [](tl::ModelConfig &c) { c.vocab = 2; },
        [](tl::ModelConfig &c) { c.vocab = 1 << 22; },
        [](tl::ModelConfig &c) { c.pre = 0; },
        [](tl::ModelConfig &c) { c.pre = 256; },
        [](tl::ModelConfig &c) { c.loops = 1024; },
        [](tl::ModelConfig &c) { c.max_seq = 2; },
        [](tl::ModelConfig &c) { c.max_seq = 1 << 20; },
        [](tl::ModelConfig &c) { c.group_size = 0; },
        [](tl::ModelConfig &c) { c.group_size = 4; },
        [](tl::ModelConfig &c) { c.bits = 8; },
        [](tl::ModelConfig &c) {
            c.norm_eps = 0.5f;
            c.rope_theta = 1e-3f;
        },
    };
    for (size_t i = 0; i < accepted.size(); ++i) {
        tl::ModelConfig c = tlt::small_config(8);
        accepted[i](c);
        EXPECT_NO_THROW(tl::validate_config(c)) << "accepted case " << i;
    }
    const std::vector<std::pair<Edit, std::string>> rejected = {
        {[](tl::ModelConfig &c) { c.d_model = 0; }, "d_model"},
        {[](tl::ModelConfig &c) {
             c.d_model = 65537;
             c.group_size = 0;
         },
         "d_model"},
        {[](tl::ModelConfig &c) { c.n_heads = 0; }, "n_heads"},
        {[](tl::ModelConfig &c) { c.head_dim = 0; }, "head_dim"},
        {[](tl::ModelConfig &c) {
             c.head_dim = 7;
             c.group_size = 0;
         },
         "head_dim"},
        {[](tl::ModelConfig &c) { c.head_dim = 1026; }, "head_dim"},
        {[](tl::ModelConfig &c) {
             c.n_heads = 65;
             c.head_dim = 1024;
         },
         "n_heads * head_dim"},
        {[](tl::ModelConfig &c) { c.ffn = 0; }, "ffn"},
        {[](tl::ModelConfig &c) { c.ffn = (1 << 20) + 8; }, "ffn"},
        {[](tl::ModelConfig &c) { c.vocab = 1; }, "vocab"},
        {[](tl::ModelConfig &c) { c.vocab = (1 << 22) + 1; }, "vocab"},
        {[](tl::ModelConfig &c) { c.pre = -1; }, "pre"},
        {[](tl::ModelConfig &c) { c.pre = 257; }, "pre"},
        {[](tl::ModelConfig &c) { c.loops = 0; }, "loops"},
        {[](tl::ModelConfig &c) { c.loops = 1025; }, "loops"},
        {[](tl::ModelConfig &c) { c.max_seq = 1; }, "max_seq"},
        {[](tl::ModelConfig &c) { c.max_seq = (1 << 20) + 1; }, "max_seq"},
        {[](tl::ModelConfig &c) { c.bits = 16; }, "bits"},
        {[](tl::ModelConfig &c) { c.bits = 3; }, "bits"},
        {[](tl::ModelConfig &c) { c.group_size = -8; }, "group_size"},
        {[](tl::ModelConfig &c) { c.group_size = 12; }, "group_size"},  // divides 24 but not 16 or 40
        {[](tl::ModelConfig &c) { c.group_size = 48; }, "group_size"},
        {[nan](tl::ModelConfig &c) { c.rope_theta = nan; }, "rope_theta"},
        {[inf](tl::ModelConfig &c) { c.rope_theta = inf; }, "rope_theta"},
        {[](tl::ModelConfig &c) { c.rope_theta = 0.0f; }, "rope_theta"},
        {[](tl::ModelConfig &c) { c.norm_eps = 0.0f; }, "norm_eps"},
        {[](tl::ModelConfig &c) { c.norm_eps = 1.0f; }, "norm_eps"},
        {[nan](tl::ModelConfig &c) { c.norm_eps = nan; }, "norm_eps"},
        {[](tl::ModelConfig &c) { c.norm_eps = -1e-5f; }, "norm_eps"},
    };
    for (const auto &[edit, field] : rejected) {
        SCOPED_TRACE(field);
        tl::ModelConfig c = tlt::small_config(8);
        edit(c);
        expect_format_error([&] { tl::validate_config(c); }, "config: " + field);
    }
}

TEST(Writer, ReportsIoErrorsWithThePathAndErrno) {
    const std::string path = tlt::temp_dir() + "/no_such_dir/model.tinyloop";
    EXPECT_TRUE(tlt::throws(TL_ERR_IO, {"'" + path + "'", "No such file or directory"},
                            [&] { tl::write_safetensors(path, {}, {}); }));
}

TEST(Writer, ReplacesTheFileAtomicallyAndLeavesNoTemporary) {
    const std::string dir = tlt::temp_dir() + "/replace";
    std::filesystem::create_directory(dir);
    const std::string path = dir + "/replace.safetensors";
    const std::vector<uint8_t> first = {1, 2, 3}, second = {9, 8, 7, 6, 5};
    tl::write_safetensors(path, {{"k", "first"}}, {{"t", DType::U8, {3}, first.data()}});
    tl::write_safetensors(path, {{"k", "second"}}, {{"t", DType::U8, {5}, second.data()}});
    for (const auto &entry : std::filesystem::directory_iterator(dir))
        EXPECT_EQ(entry.path().string(), path) << "a temporary file was left behind";
    const tlt::RawFile raw = tlt::parse_raw(tlt::read_bytes(path));
    EXPECT_EQ(raw.header["__metadata__"]["k"], "second");
    EXPECT_EQ(tlt::tensors_of(raw).at("t").bytes, second);
}

// A writer killed midway leaves its temporary behind, unlocked: the next write to the same path removes it, and
// leaves a live writer's (locked) temporary and every other file alone.
TEST(Writer, RemovesTemporariesOfDeadWriters) {
    const std::string dir = tlt::temp_dir() + "/stale";
    std::filesystem::remove_all(dir);
    std::filesystem::create_directory(dir);
    const std::string path = dir + "/out.tinyloop";
    const auto make = [&](const std::string &name) {
        const std::string file = dir + "/" + name;
        const int fd = ::open(file.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
        EXPECT_GE(fd, 0) << file;
        return fd;
    };
    ::close(make(".out.tinyloop.aB3xY9"));  // a dead writer's: nobody holds it
    ::close(make(".out.tinyloop.Qz81kM"));
    const int live = make(".out.tinyloop.L1veW7");  // a live writer's: locked
    ASSERT_EQ(::flock(live, LOCK_EX | LOCK_NB), 0);
    const std::vector<std::string> others = {".out.tinyloop.short", ".other.tinyloop.aB3xY9", "out.tinyloop.aB3xY9",
                                             ".out.tinyloop.aB3x-9"};
    for (const std::string &name : others) ::close(make(name));
    const uint8_t byte = 7;
    tl::write_safetensors(path, {}, {{"t", DType::U8, {1}, &byte}});
    std::set<std::string> left;
    for (const auto &entry : std::filesystem::directory_iterator(dir)) left.insert(entry.path().filename().string());
    std::set<std::string> expected(others.begin(), others.end());
    expected.insert({"out.tinyloop", ".out.tinyloop.L1veW7"});
    EXPECT_EQ(left, expected);
    ::close(live);
}

TEST(Writer, RejectsBadTensorLists) {
    const std::string path = tlt::temp_dir() + "/bad_args.safetensors";
    const uint8_t byte = 0;
    const std::vector<std::vector<tl::TensorView>> bad = {
        {{"a", DType::U8, {1}, &byte}, {"a", DType::U8, {1}, &byte}},  // repeated name
        {{"__metadata__", DType::U8, {1}, &byte}},                     // reserved name
        {{"", DType::U8, {1}, &byte}},                                 // empty name
        {{"a", DType::U8, {-1}, &byte}},                               // negative dimension
        {{"a", DType::F32, {4}, nullptr}},                             // no data
    };
    for (size_t i = 0; i < bad.size(); ++i) {
        try {
            tl::write_safetensors(path, {}, bad[i]);
            ADD_FAILURE() << "case " << i << " was accepted";
        } catch (const tl::Error &e) {
            EXPECT_EQ(e.code(), TL_ERR_INVALID_ARGUMENT) << i << ": " << e.what();
        }
        struct stat st;
        EXPECT_NE(::stat(path.c_str(), &st), 0) << "case " << i << " created the file";
    }
}

}  // namespace

// A mixed file (INT8 looped block, INT4 elsewhere) through the C API: the model reports bits 8, each weight its own
// width, an INT8 weight dequantizes to q * s, scoring works on the CPU, and tl_quant_gemm refuses INT8 by name.
TEST(Int8, MixedModelThroughTheCApi) {
    tl::ModelConfig config = tlt::small_config(8);
    tl::SyntheticOptions options;
    options.seed = std::random_device{}();
    auto model = tl::make_synthetic_model(config, options);
    config.bits = 8;
    const auto int8 = tl::make_synthetic_model(config, options);
    model->loop = int8->loop;
    model->config.bits = 8;
    const std::string path = tlt::temp_dir() + "/mixed_int8.tinyloop";
    tl::save_model(path, *model);

    tl_model *m = nullptr;
    ASSERT_EQ(tl_model_load(path.c_str(), nullptr, &m), TL_OK) << tl_last_error_message();
    tl_model_properties p;
    p.struct_size = sizeof p;
    ASSERT_EQ(tl_model_info(m, &p), TL_OK);
    EXPECT_EQ(p.bits, 8);
    EXPECT_EQ(p.format_version, 1);
    size_t count = 0, n_int8 = 0;
    ASSERT_EQ(tl_model_weight_count(m, &count), TL_OK);
    ASSERT_EQ(count, 15u);
    for (size_t i = 0; i < count; ++i) {
        const tl_weight *w = nullptr;
        ASSERT_EQ(tl_model_weight_at(m, i, &w), TL_OK);
        tl_weight_properties wp;
        wp.struct_size = sizeof wp;
        ASSERT_EQ(tl_weight_info(w, &wp), TL_OK);
        const bool in_loop = std::string(wp.name).rfind("loop.", 0) == 0;
        EXPECT_EQ(wp.bits, in_loop ? 8 : 4) << wp.name;
        if (wp.bits != 8) continue;
        ++n_int8;
        EXPECT_EQ(wp.bytes, uint64_t(wp.k) * wp.n + uint64_t(wp.n) * wp.n_groups * 2) << wp.name;
        std::vector<float> got(size_t(wp.k) * wp.n), want(got.size());
        ASSERT_EQ(tl_weight_dequantize(w, got.data(), got.size()), TL_OK);
        const tl::Linear *src = nullptr;
        for (const tl::Linear *l : model->linears())
            if (l->name == wp.name) src = l;
        ASSERT_NE(src, nullptr);
        tl::dequantize_rows(*src, 0, src->n, want.data());
        EXPECT_EQ(got, want) << wp.name;
        uint16_t x[16] = {}, y[16] = {};
        EXPECT_EQ(tl_quant_gemm(w, x, y, 1, nullptr, nullptr, 0), TL_ERR_UNSUPPORTED);
        EXPECT_NE(std::string(tl_last_error_message()).find("is INT8"), std::string::npos) << tl_last_error_message();
    }
    EXPECT_EQ(n_int8, 5u);
    std::vector<int32_t> tokens(30);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 7 + 1) % size_t(config.vocab));
    tl_score_options so;
    ASSERT_EQ(tl_score_options_init(&so, sizeof so), TL_OK);
    so.backend = TL_BACKEND_CPU;
    tl_score_result result;
    ASSERT_EQ(tl_score_result_init(&result, sizeof result), TL_OK);
    ASSERT_EQ(tl_score(m, tokens.data(), tokens.size(), &so, &result), TL_OK) << tl_last_error_message();
    tl::ScoreOptions cpu;
    EXPECT_NEAR(result.nll_sum, tl::score_cpu(*model, tokens.data(), tokens.size(), cpu).nll_sum, 1e-9);
    tl_model_free(m);
}
