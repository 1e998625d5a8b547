// tl_model_import_checkpoint against the Hugging Face-style checkpoints make_looped_checkpoints.py writes (CTest runs
// it into the build folder first), through the exported C API. Round trips: the .tinyloop file is read back with the
// test's own safetensors reader and compared with the script's expectations (config, dtypes, every tensor: dense
// values exactly, INT4 weights up to the one FP16 rounding of z' = -z * s), then loaded and scored by the library.
// Refusals: each status and the file, field or tensor its message names.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_safetensors.hpp"
#include "tinyloop.h"

#ifndef TL_LOOPED_DATA_DIR
#error "TL_LOOPED_DATA_DIR must name the folder make_looped_checkpoints.py writes to"
#endif

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using tl_test::int4_tolerance;
using tl_test::read_safetensors;
using tl_test::Tensor;
using tl_test::value_at;

const std::string kData = TL_LOOPED_DATA_DIR;

std::string test_name() { return ::testing::UnitTest::GetInstance()->current_test_info()->name(); }

// Output and scratch paths of one test: CTest may run the tests in parallel.
std::string scratch(const std::string &name) {
    const fs::path dir = fs::path(kData) / "scratch" / test_name();
    fs::create_directories(dir);
    return (dir / name).string();
}

json read_json(const std::string &path) {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open " + path);
    return json::parse(in);
}

void write_json(const std::string &path, const json &j) {
    std::ofstream out(path);
    out << j.dump(2);
}

struct Result {
    tl_status status;
    std::string message;
};

Result convert(const std::string &dir, const std::string &out, const tl_import_options *options = nullptr) {
    const tl_status status = tl_model_import_checkpoint(dir.c_str(), out.c_str(), options);
    return {status, tl_last_error_message()};
}

// A copy of a variant's checkpoint folder, for edits.
std::string copy_of(const std::string &variant) {
    const std::string dir = scratch("checkpoint");
    fs::remove_all(dir);
    fs::copy(fs::path(kData) / variant, dir, fs::copy_options::recursive);
    return dir;
}

// A copy of a variant whose config.json `edit` changes.
std::string with_config(const std::string &variant, const std::function<void(json &)> &edit) {
    const std::string dir = copy_of(variant);
    json config = read_json(dir + "/config.json");
    edit(config);
    write_json(dir + "/config.json", config);
    return dir;
}

#define EXPECT_REFUSED(result, want_status, ...)                                                               \
    do {                                                                                                       \
        const Result r_ = (result);                                                                            \
        EXPECT_EQ(r_.status, want_status) << r_.message;                                                       \
        for (const char *part : {__VA_ARGS__}) EXPECT_NE(r_.message.find(part), std::string::npos)             \
            << "message lacks \"" << part << "\": " << r_.message;                                             \
    } while (0)

// ---- Round trips ----

void expect_dense_equal(const Tensor &got, const std::string &dtype, const Tensor &want, const std::string &name) {
    EXPECT_EQ(got.dtype, dtype) << name;
    ASSERT_EQ(got.shape, want.shape) << name;
    size_t mismatches = 0;
    for (size_t i = 0; i < want.count(); ++i) {
        const float g = value_at(got, i), w = value_at(want, i);
        if (g != w && mismatches++ == 0) ADD_FAILURE() << name << "[" << i << "] = " << g << ", expected " << w;
    }
    EXPECT_EQ(mismatches, 0u) << name;
}

// An INT4 linear of the file (codes [N][K/2], scales and offsets [N][G]) dequantized here, W = q * s + z', against
// the script's (q - z) * s in [N][K]. With a k_perm (act-order), stored row kk is input k_perm[kk].
void expect_int4_close(const std::map<std::string, Tensor> &file, const std::string &name, const Tensor &want,
                       const Tensor &offset) {
    ASSERT_EQ(file.count(name + ".qweight"), 1u) << name << " is not INT4 in the file";
    const Tensor &codes = file.at(name + ".qweight"), &scales = file.at(name + ".scales");
    const Tensor &zeros = file.at(name + ".zeros");
    const size_t n = static_cast<size_t>(want.shape[0]), k = static_cast<size_t>(want.shape[1]);
    const size_t groups = static_cast<size_t>(offset.shape[1]);
    ASSERT_EQ(codes.shape, (std::vector<int64_t>{static_cast<int64_t>(n), static_cast<int64_t>(k / 2)})) << name;
    ASSERT_EQ(scales.shape, offset.shape) << name;
    ASSERT_EQ(zeros.shape, offset.shape) << name;
    const uint8_t *q = codes.as<uint8_t>("U8");
    const int32_t *k_perm = nullptr;
    if (file.count(name + ".k_perm")) {
        const Tensor &t = file.at(name + ".k_perm");
        ASSERT_EQ(t.shape, (std::vector<int64_t>{static_cast<int64_t>(k)})) << name;
        k_perm = t.as<int32_t>("I32");
    }
    size_t mismatches = 0;
    for (size_t nn = 0; nn < n; ++nn) {
        for (size_t kk = 0; kk < k; ++kk) {
            const size_t g = kk / (k / groups);
            const uint8_t byte = q[nn * (k / 2) + kk / 2];
            const int code = (kk & 1) ? byte >> 4 : byte & 15;
            const float s = value_at(scales, nn * groups + g), z = value_at(zeros, nn * groups + g);
            const double got = static_cast<float>(code) * s + z;
            const size_t input = k_perm != nullptr ? static_cast<size_t>(k_perm[kk]) : kk;
            ASSERT_LT(input, k) << name;
            const double e = value_at(want, nn * k + input), off = value_at(offset, nn * groups + g);
            if (!(std::fabs(got - e) <= int4_tolerance(e, off)) && mismatches++ == 0) {
                ADD_FAILURE() << name << " W[" << kk << ", " << nn << "] = " << got << ", expected " << e;
            }
        }
    }
    EXPECT_EQ(mismatches, 0u) << name;
}

// An INT8 linear of the file (I8 codes [N][K], scales [N][G], no zeros): W = q * s, exactly the script's (q - 128) * s.
void expect_int8_equal(const std::map<std::string, Tensor> &file, const std::string &name, const Tensor &want) {
    ASSERT_EQ(file.count(name + ".qweight"), 1u) << name << " is not quantized in the file";
    EXPECT_EQ(file.count(name + ".zeros"), 0u) << name << ": an INT8 linear has no zeros";
    const Tensor &codes = file.at(name + ".qweight"), &scales = file.at(name + ".scales");
    const size_t n = static_cast<size_t>(want.shape[0]), k = static_cast<size_t>(want.shape[1]);
    ASSERT_EQ(codes.shape, (std::vector<int64_t>{static_cast<int64_t>(n), static_cast<int64_t>(k)})) << name;
    ASSERT_EQ(scales.shape.size(), 2u);
    const size_t groups = static_cast<size_t>(scales.shape[1]);
    const int8_t *q = codes.as<int8_t>("I8");
    size_t mismatches = 0;
    for (size_t nn = 0; nn < n; ++nn) {
        for (size_t kk = 0; kk < k; ++kk) {
            const float got = static_cast<float>(q[nn * k + kk]) * value_at(scales, nn * groups + kk / (k / groups));
            const float e = value_at(want, nn * k + kk);
            if (got != e && mismatches++ == 0) {
                ADD_FAILURE() << name << " W[" << kk << ", " << nn << "] = " << got << ", expected " << e;
            }
        }
    }
    EXPECT_EQ(mismatches, 0u) << name;
}

// One tl_score call over `tokens` on `backend` (two threads on the CPU).
tl_score_result score_tokens(const tl_model *model, const std::vector<int32_t> &tokens, int32_t backend) {
    tl_score_options so;
    EXPECT_EQ(tl_score_options_init(&so, sizeof so), TL_OK);
    so.backend = backend;
    so.n_threads = 2;
    tl_score_result result;
    EXPECT_EQ(tl_score_result_init(&result, sizeof result), TL_OK);
    EXPECT_EQ(tl_score(model, tokens.data(), tokens.size(), &so, &result), TL_OK) << tl_last_error_message();
    return result;
}

void check_round_trip(const std::string &variant, const tl_import_options *options = nullptr) {
    SCOPED_TRACE(variant);
    const std::string out = scratch(variant + ".tinyloop");
    const Result r = convert(kData + "/" + variant, out, options);
    ASSERT_EQ(r.status, TL_OK) << r.message;

    const json manifest = read_json(kData + "/" + variant + ".expected.json");
    const auto expected = read_safetensors(kData + "/" + variant + ".expected.safetensors");
    std::map<std::string, std::string> metadata;
    const auto file = read_safetensors(out, &metadata);

    EXPECT_EQ(metadata["format"], "tinyloop");
    EXPECT_EQ(metadata["format_version"], manifest["format_version"].get<std::string>());
    const json config = json::parse(metadata["config"]);
    EXPECT_EQ(config.contains("rope_scaling"), manifest["config"].contains("rope_scaling"));
    for (const auto &kv : manifest["config"].items()) {
        ASSERT_TRUE(config.contains(kv.key())) << kv.key();
        if (kv.value().is_object()) {  // rope_scaling: its doubles as the script computed them, to rounding
            EXPECT_EQ(config[kv.key()].size(), kv.value().size()) << config[kv.key()].dump();
            for (const auto &field : kv.value().items()) {
                ASSERT_TRUE(config[kv.key()].contains(field.key())) << field.key();
                const json &got = config[kv.key()][field.key()];
                if (field.value().is_number_float()) {
                    EXPECT_NEAR(got.get<double>(), field.value().get<double>(), 1e-14) << field.key();
                } else {
                    EXPECT_EQ(got, field.value()) << field.key();
                }
            }
        } else if (kv.value().is_number_float()) {
            EXPECT_EQ(static_cast<float>(config[kv.key()].get<double>()), static_cast<float>(kv.value().get<double>()))
                << kv.key();
        } else {
            EXPECT_EQ(config[kv.key()], kv.value()) << kv.key();
        }
    }

    // Embedding and norms: exactly the stored values (norm gains are written as F32).
    size_t tensors = 0, n_int4 = 0, n_dense = 0;
    expect_dense_equal(file.at("embed.weight"), manifest["embed_dtype"], expected.at("embed.weight"), "embed.weight");
    ++tensors;
    for (const auto &kv : expected) {
        if (kv.first.size() > 12 && kv.first.compare(kv.first.size() - 12, 12, "_norm.weight") == 0) {
            ASSERT_EQ(file.count(kv.first), 1u) << kv.first;
            expect_dense_equal(file.at(kv.first), "F32", kv.second, kv.first);
            ++tensors;
        }
    }
    EXPECT_EQ(tensors, 1u + 2u * 3u + 1u);
    for (const auto &kv : manifest["linears"].items()) {
        const std::string name = kv.key(), storage = kv.value();
        if (expected.count(name + ".bias")) {  // biases: F32 in the file, exactly the stored values
            ASSERT_EQ(file.count(name + ".bias"), 1u) << name << " has no bias in the file";
            expect_dense_equal(file.at(name + ".bias"), "F32", expected.at(name + ".bias"), name + ".bias");
            ++tensors;
        }
        if (storage == "INT4") {
            expect_int4_close(file, name, expected.at(name), expected.at(name + ".offset"));
            tensors += 3 + file.count(name + ".k_perm");
            ++n_int4;
        } else if (storage == "INT8") {
            expect_int8_equal(file, name, expected.at(name));
            tensors += 2;
            ++n_int4;
        } else {
            ASSERT_EQ(file.count(name + ".weight"), 1u) << name << " is not dense in the file";
            expect_dense_equal(file.at(name + ".weight"), storage, expected.at(name), name);
            ++tensors;
            ++n_dense;
        }
    }
    EXPECT_EQ(file.size(), tensors) << "the file has tensors the expectations do not name";
    const std::string head = manifest["head"];
    EXPECT_EQ(file.count("head.weight") + file.count("head.qweight"), head == "tied" ? 0u : 1u);

    // The library loads it with its full validation, agrees on what it holds, and scores with it.
    tl_model *model = nullptr;
    ASSERT_EQ(tl_model_load(out.c_str(), nullptr, &model), TL_OK) << tl_last_error_message();
    tl_model_properties p;
    p.struct_size = sizeof p;
    ASSERT_EQ(tl_model_info(model, &p), TL_OK);
    EXPECT_EQ(p.n_quant_weights, n_int4);
    EXPECT_EQ(p.n_dense_linears, n_dense);
    EXPECT_EQ(p.head_kind, head == "tied" ? 2 : head == "int4" ? 1 : 0);
    EXPECT_EQ(p.n_pre, manifest["config"]["pre"].get<int32_t>());
    EXPECT_EQ(p.n_loops, manifest["config"]["loops"].get<int32_t>());
    std::vector<int32_t> tokens(40);
    for (size_t i = 0; i < tokens.size(); ++i) {
        tokens[i] = static_cast<int32_t>((i * 7 + 3) % static_cast<size_t>(p.vocab));
    }
    const tl_score_result result = score_tokens(model, tokens, TL_BACKEND_CPU);
    EXPECT_TRUE(std::isfinite(result.nll_sum));
    EXPECT_EQ(result.tokens_scored, tokens.size() - 1);
    tl_model_free(model);
}

TEST(CheckpointImport, DenseF16Tied) { check_round_trip("dense_f16_tied"); }
TEST(CheckpointImport, DenseBf16UntiedGqaDefaults) { check_round_trip("dense_bf16_untied_gqa"); }
TEST(CheckpointImport, DenseF32ShardedMixedQkvDtypes) { check_round_trip("dense_f32_sharded"); }
TEST(CheckpointImport, GptqMisalignedWithDenseLinear) { check_round_trip("gptq"); }
TEST(CheckpointImport, GptqPerRowWithoutGIdx) { check_round_trip("gptq_per_row"); }
TEST(CheckpointImport, AwqGqa) { check_round_trip("awq"); }
TEST(CheckpointImport, Gptq8BitSymmetricWithDenseLinear) { check_round_trip("gptq8"); }
TEST(CheckpointImport, Gptq8BitPerRowTied) { check_round_trip("gptq8_per_row"); }
TEST(CheckpointImport, GptqSettingsInQuantizeConfigJson) { check_round_trip("gptq_quantize_config"); }
TEST(CheckpointImport, Qwen2QkvBiasesGqa) { check_round_trip("qwen2_bias"); }
TEST(CheckpointImport, GptqAttentionAndMlpBiases) { check_round_trip("gptq_biases"); }
TEST(CheckpointImport, Llama3RopeScalingPlainConfig) { check_round_trip("llama3_rope"); }
TEST(CheckpointImport, Qwen2YarnRopeScaling) { check_round_trip("qwen2_yarn"); }

// RoPE scaling's parameters as transformers resolves them: YaRN's attention factor from mscale / mscale_all_dim, its
// original length from max_position_embeddings when rope_scaling has none (not from the max_seq option), rope_type
// "default" as plain RoPE, and transformers 5's rope_parameters with rope_theta inside.
TEST(CheckpointImport, RopeScalingResolvedAsTransformersDoes) {
    struct Case {
        const char *name;
        std::function<void(json &)> edit;
        json want;  // the file's rope_scaling, or null for none
        double rope_theta;
    };
    const std::vector<Case> cases = {
        {"yarn mscale", [](json &c) {
             c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 40.0}, {"mscale", 1.0}, {"mscale_all_dim", 0.5},
                                  {"beta_fast", 0}, {"original_max_position_embeddings", 64}};
         },
         {{"type", "yarn"}, {"factor", 40.0}, {"original_max_position_embeddings", 64}, {"beta_fast", 32.0},
          {"beta_slow", 1.0}, {"attention_factor", (0.1 * std::log(40.0) + 1) / (0.05 * std::log(40.0) + 1)},
          {"truncate", true}},
         500000.0},
        {"yarn without original length", [](json &c) {
             c["rope_scaling"] = {{"type", "yarn"}, {"factor", 2.0}, {"truncate", false}, {"attention_factor", 1.5}};
         },
         {{"type", "yarn"}, {"factor", 2.0}, {"original_max_position_embeddings", 128}, {"beta_fast", 32.0},
          {"beta_slow", 1.0}, {"attention_factor", 1.5}, {"truncate", false}},
         500000.0},
        {"linear", [](json &c) { c["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}}; },
         {{"type", "linear"}, {"factor", 2.0}}, 500000.0},
        {"dynamic within its range", [](json &c) { c["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}}; },
         {{"type", "dynamic"}, {"factor", 2.0}, {"original_max_position_embeddings", 128}}, 500000.0},
        {"default", [](json &c) { c["rope_scaling"] = {{"rope_type", "default"}}; }, nullptr, 500000.0},
        {"rope_parameters", [](json &c) {
             c.erase("rope_theta");
             c["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 4.0}, {"rope_theta", 20000.0}};
         },
         {{"type", "linear"}, {"factor", 4.0}}, 20000.0},
    };
    tl_import_options o;
    ASSERT_EQ(tl_import_options_init(&o, sizeof o), TL_OK);
    o.max_seq = 100;  // yarn's original length stays max_position_embeddings (128)
    for (const Case &c : cases) {
        SCOPED_TRACE(c.name);
        const std::string out = scratch("rope.tinyloop");
        const Result r = convert(with_config("dense_f16_tied", c.edit), out, &o);
        ASSERT_EQ(r.status, TL_OK) << r.message;
        std::map<std::string, std::string> metadata;
        read_safetensors(out, &metadata);
        const json config = json::parse(metadata["config"]);
        EXPECT_EQ(static_cast<float>(config["rope_theta"].get<double>()), static_cast<float>(c.rope_theta));
        if (c.want.is_null()) {
            EXPECT_FALSE(config.contains("rope_scaling")) << config.dump();
            EXPECT_EQ(metadata["format_version"], "1");
            continue;
        }
        EXPECT_EQ(metadata["format_version"], "2");
        ASSERT_TRUE(config.contains("rope_scaling"));
        const json &got = config["rope_scaling"];
        EXPECT_EQ(got.size(), c.want.size()) << got.dump();
        for (const auto &kv : c.want.items()) {
            if (kv.value().is_number_float()) {
                EXPECT_NEAR(got[kv.key()].get<double>(), kv.value().get<double>(), 1e-14) << kv.key();
            } else {
                EXPECT_EQ(got[kv.key()], kv.value()) << kv.key();
            }
        }
    }
}
TEST(CheckpointImport, PlainLlamaConfigLoopsOnce) { check_round_trip("plain_llama"); }

// A looped model stored unrolled (a plain config, the looped layer stored three times) imports as the looped model:
// the repeats are found and the block stored once with loops = 3, the same file content as the looped checkpoint's.
TEST(CheckpointImport, UnrolledRepeatsStoredOnce) {
    check_round_trip("unrolled");
    const std::string unrolled = scratch("unrolled.tinyloop"), looped = scratch("looped.tinyloop");
    ASSERT_EQ(convert(kData + "/unrolled", unrolled).status, TL_OK) << tl_last_error_message();
    ASSERT_EQ(convert(kData + "/dense_f16_tied", looped).status, TL_OK) << tl_last_error_message();
    const auto a = read_safetensors(unrolled), b = read_safetensors(looped);
    ASSERT_EQ(a.size(), b.size());
    for (const auto &kv : b) {
        ASSERT_EQ(a.count(kv.first), 1u) << kv.first;
        EXPECT_EQ(a.at(kv.first).dtype, kv.second.dtype) << kv.first;
        EXPECT_TRUE(a.at(kv.first).data == kv.second.data) << kv.first;
    }
    // A layer that differs in one byte ends the repeats: then only the last layer is looped (once).
    const std::string dir = copy_of("unrolled");
    {
        std::fstream f(dir + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
        uint64_t header = 0;
        f.read(reinterpret_cast<char *>(&header), sizeof header);
        std::string text(header, ' ');
        f.read(text.data(), static_cast<std::streamsize>(header));
        const json h = json::parse(text);
        const uint64_t begin = h["model.layers.3.mlp.up_proj.weight"]["data_offsets"][0];
        f.seekp(static_cast<std::streamoff>(8 + header + begin));
        f.put('\x55');
    }
    const std::string out = scratch("changed.tinyloop");
    ASSERT_EQ(convert(dir, out).status, TL_OK) << tl_last_error_message();
    std::map<std::string, std::string> metadata;
    read_safetensors(out, &metadata);
    const json config = json::parse(metadata["config"]);
    EXPECT_EQ(config["pre"], 4);
    EXPECT_EQ(config["loops"], 1);
}

// Settings in both config.json and quantize_config.json: accepted when they agree, refused naming the first field
// where they do not.
TEST(CheckpointImport, QuantizeConfigJsonAgreesWithConfig) {
    std::string dir = copy_of("gptq");
    write_json(dir + "/quantize_config.json", json{{"bits", 4}, {"group_size", 32}, {"desc_act", false},
                                                   {"damp_percent", 0.01}, {"quant_method", "gptq"}});
    ASSERT_EQ(convert(dir, scratch("agree.tinyloop")).status, TL_OK) << tl_last_error_message();
    write_json(dir + "/quantize_config.json", json{{"bits", 4}, {"group_size", 64}});
    EXPECT_REFUSED(convert(dir, scratch("out.tinyloop")), TL_ERR_FORMAT, "config.json' and '",
                   "quantize_config.json' disagree on 'group_size'", "= 32", "has 64");
    write_json(dir + "/quantize_config.json", json{{"bits", 4}, {"group_size", 32}, {"is_marlin_format", true}});
    EXPECT_REFUSED(convert(dir, scratch("out.tinyloop")), TL_ERR_UNSUPPORTED, "is_marlin_format");
    write_json(dir + "/quantize_config.json", json::array());
    EXPECT_REFUSED(convert(dir, scratch("out.tinyloop")), TL_ERR_FORMAT, "quantize_config.json': not a JSON object");
}

// Sliding-window attention is full attention for windows no longer than sliding_window: accepted then (or when it is
// switched off), refused otherwise.
TEST(CheckpointImport, SlidingWindowAcceptedWhereItIsFullAttention) {
    const std::vector<std::pair<const char *, std::function<void(json &)>>> cases = {
        {"window = max_seq", [](json &c) { c["model_type"] = "mistral", c["sliding_window"] = 128; }},
        {"window null", [](json &c) { c["model_type"] = "mistral", c["sliding_window"] = nullptr; }},
        {"use_sliding_window false",
         [](json &c) { c["sliding_window"] = 16, c["use_sliding_window"] = false,
                       c["max_window_layers"] = 2; }},
        {"only full-attention layers",
         [](json &c) { c["sliding_window"] = 16, c["layer_types"] = {"full_attention", "full_attention"}; }},
    };
    for (const auto &c : cases) {
        SCOPED_TRACE(c.first);
        const Result r = convert(with_config("dense_f16_tied", c.second), scratch("out.tinyloop"));
        EXPECT_EQ(r.status, TL_OK) << r.message;
    }
    tl_import_options o;
    ASSERT_EQ(tl_import_options_init(&o, sizeof o), TL_OK);
    o.max_seq = 64;
    const std::string dir = with_config("dense_f16_tied", [](json &c) { c["sliding_window"] = 64; });
    EXPECT_EQ(convert(dir, scratch("out.tinyloop"), &o).status, TL_OK) << tl_last_error_message();
    o.max_seq = 65;
    EXPECT_REFUSED(convert(dir, scratch("out.tinyloop"), &o), TL_ERR_UNSUPPORTED, "field 'sliding_window' = 64",
                   "max_seq is 65 (the max_seq option)");
}

// Act-order: every INT4 linear is stored with its groups contiguous and a k_perm, and the model scores as its dense
// twin (the same weights in F32) does, on the CPU and, where there is one, on the GPU. A k_perm ignored or applied the
// wrong way round scrambles the inputs of every linear, which the scores would show many times over.
TEST(CheckpointImport, GptqActOrderScoresAsItsDenseTwin) {
    check_round_trip("gptq_act_order");
    const std::string act = scratch("act.tinyloop"), dense = scratch("dense.tinyloop");
    ASSERT_EQ(convert(kData + "/gptq_act_order", act).status, TL_OK);
    const Result r = convert(kData + "/gptq_act_order_dense", dense);
    ASSERT_EQ(r.status, TL_OK) << r.message;
    size_t permuted = 0;
    for (const auto &kv : read_safetensors(act)) {
        const std::string &name = kv.first;
        permuted += name.size() > 7 && name.compare(name.size() - 7, 7, ".k_perm") == 0;
    }
    EXPECT_EQ(permuted, 3u * 5u);  // every linear of the three blocks (q|k|v is one)

    std::vector<int32_t> tokens(64);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 11 + 5) % 72);
    auto score = [&](const std::string &path, int32_t backend) {
        tl_model *model = nullptr;
        EXPECT_EQ(tl_model_load(path.c_str(), nullptr, &model), TL_OK) << tl_last_error_message();
        const tl_score_result result = score_tokens(model, tokens, backend);
        tl_model_free(model);
        return result.nll_sum / static_cast<double>(result.tokens_scored);
    };
    const double reference = score(dense, TL_BACKEND_CPU);
    ASSERT_TRUE(std::isfinite(reference));
    // The one difference is the FP16 rounding of each offset z' = -z * s (at most 2^-11 of |z * s|).
    EXPECT_NEAR(score(act, TL_BACKEND_CPU), reference, 2e-3 * std::fabs(reference));
    int32_t devices = 0;
    ASSERT_EQ(tl_device_count(&devices), TL_OK);
    if (devices > 0) {
        EXPECT_NEAR(score(act, TL_BACKEND_CUDA), reference, 5e-3 * std::fabs(reference));
    }
}

TEST(CheckpointImport, ReadWithoutMmap) {
    tl_import_options o;
    ASSERT_EQ(tl_import_options_init(&o, sizeof o), TL_OK);
    o.use_mmap = 0;
    check_round_trip("gptq", &o);
}

TEST(CheckpointImport, MaxSeqOption) {
    tl_import_options o;
    ASSERT_EQ(tl_import_options_init(&o, sizeof o), TL_OK);
    EXPECT_EQ(o.max_seq, 0);
    EXPECT_EQ(o.use_mmap, 1);
    EXPECT_EQ(o.validate_values, 1);
    // max_position_embeddings past the format's limit: refused naming the field, accepted with an override.
    const std::string dir = with_config("dense_f16_tied", [](json &c) { c["max_position_embeddings"] = 1 << 21; });
    const std::string out = scratch("out.tinyloop");
    EXPECT_REFUSED(convert(dir, out), TL_ERR_FORMAT, "config.json'", "max_position_embeddings", "2097152");
    o.max_seq = 77;
    ASSERT_EQ(convert(dir, out, &o).status, TL_OK) << tl_last_error_message();
    std::map<std::string, std::string> metadata;
    read_safetensors(out, &metadata);
    EXPECT_EQ(json::parse(metadata["config"])["max_seq"], 77);
}

// ---- Refusals: checkpoints the script wrote ----

TEST(CheckpointImportRefuses, MissingTensor) {
    const std::string out = scratch("out.tinyloop");
    EXPECT_REFUSED(convert(kData + "/bad/missing_tensor", out), TL_ERR_FORMAT, "bad/missing_tensor/model.safetensors'",
                   "missing tensor 'model.layers.1.mlp.down_proj.weight'");
    EXPECT_FALSE(fs::exists(out)) << "a failed import must not leave an output";
}

TEST(CheckpointImportRefuses, WrongShape) {
    EXPECT_REFUSED(convert(kData + "/bad/wrong_shape", scratch("out.tinyloop")), TL_ERR_FORMAT,
                   "tensor 'model.layers.0.mlp.up_proj.weight'", "shape [64, 96], expected [96, 64]");
}

TEST(CheckpointImportRefuses, UnexpectedLayer) {
    EXPECT_REFUSED(convert(kData + "/bad/unexpected_layer", scratch("out.tinyloop")), TL_ERR_FORMAT,
                   "unexpected tensor 'model.layers.3.mlp.up_proj.weight'", "num_pre_layers = 2");
}

TEST(CheckpointImportRefuses, ActOrderQkvInDifferentOrders) {
    EXPECT_REFUSED(convert(kData + "/bad/act_order_kv_apart", scratch("out.tinyloop")), TL_ERR_UNSUPPORTED,
                   "'model.layers.2.self_attn.k_proj.g_idx' orders K differently from "
                   "'model.layers.2.self_attn.q_proj.g_idx'");
}

TEST(CheckpointImportRefuses, Gptq8BitAsymmetric) {
    EXPECT_REFUSED(convert(kData + "/bad/gptq8_asymmetric", scratch("out.tinyloop")), TL_ERR_UNSUPPORTED,
                   "model.layers.1.self_attn.o_proj.", "column 0 of group 0 the zero point 101",
                   "asymmetric 8-bit GPTQ cannot be imported");
}

TEST(CheckpointImportRefuses, NonFiniteScale) {
    EXPECT_REFUSED(convert(kData + "/bad/infinite_scale", scratch("out.tinyloop")), TL_ERR_FORMAT,
                   "model.layers.1.mlp.gate_proj.scales[0][0]", "not finite");
}

TEST(CheckpointImportRefuses, BiasesOnlyWhereTheConfigGivesThem) {
    EXPECT_REFUSED(convert(kData + "/bad/bias", scratch("out.tinyloop")), TL_ERR_FORMAT,
                   "tensor 'model.layers.0.self_attn.q_proj.bias'", "config.json gives",
                   "'model.layers.0.self_attn.q_proj' none");
    EXPECT_REFUSED(convert(kData + "/bad/qwen2_o_proj_bias", scratch("out.tinyloop")), TL_ERR_FORMAT,
                   "tensor 'model.layers.2.self_attn.o_proj.bias'");
    EXPECT_REFUSED(convert(kData + "/bad/missing_bias", scratch("out.tinyloop")), TL_ERR_FORMAT,
                   "missing tensor 'model.layers.1.self_attn.k_proj.bias'",
                   "Qwen2's q_proj, k_proj and v_proj have biases");
    // attention_bias announces q, k, v and o biases, which this checkpoint lacks.
    EXPECT_REFUSED(convert(with_config("dense_f16_tied", [](json &c) { c["attention_bias"] = true; }),
                           scratch("out.tinyloop")),
                   TL_ERR_FORMAT, "missing tensor 'model.layers.0.self_attn.q_proj.bias'", "attention_bias is true");
}

// ---- Refusals: config.json edited ----

struct ConfigCase {
    const char *name;
    const char *variant;
    std::function<void(json &)> edit;
    tl_status status;
    std::vector<const char *> message;
};

TEST(CheckpointImportRefuses, ConfigFields) {
    const std::vector<ConfigCase> cases = {
        {"no num_loops", "dense_f16_tied", [](json &c) { c.erase("num_loops"); }, TL_ERR_FORMAT,
         {"config.json'", "field 'num_loops' is missing", "num_pre_layers"}},
        {"no num_pre_layers", "dense_f16_tied", [](json &c) { c.erase("num_pre_layers"); }, TL_ERR_FORMAT,
         {"field 'num_pre_layers' is missing"}},
        {"no hidden_size", "dense_f16_tied", [](json &c) { c.erase("hidden_size"); }, TL_ERR_FORMAT,
         {"field 'hidden_size' is missing"}},
        {"hidden_size a string", "dense_f16_tied", [](json &c) { c["hidden_size"] = "64"; }, TL_ERR_FORMAT,
         {"field 'hidden_size' must be a 32-bit integer, got '64'"}},
        {"hidden_size 0", "dense_f16_tied", [](json &c) { c["hidden_size"] = 0; }, TL_ERR_FORMAT,
         {"hidden_size (the .tinyloop d_model) = 0 is out of range"}},
        {"fewer pre layers than stored", "dense_f16_tied",
         [](json &c) {
             c["num_pre_layers"] = 1;
             c.erase("num_hidden_layers");
         },
         TL_ERR_FORMAT, {"unexpected tensor 'model.layers.2."}},
        {"num_hidden_layers", "dense_f16_tied", [](json &c) { c["num_hidden_layers"] = 5; }, TL_ERR_FORMAT,
         {"field 'num_hidden_layers'", "num_pre_layers + 1 = 3"}},
        {"num_key_value_heads", "dense_f16_tied", [](json &c) { c["num_key_value_heads"] = 3; }, TL_ERR_FORMAT,
         {"field 'num_key_value_heads'"}},
        {"head_dim wrong for the tensors", "dense_f16_tied", [](json &c) { c["head_dim"] = 8; }, TL_ERR_FORMAT,
         {"tensor 'model.layers.0.self_attn.q_proj.weight'", "shape [64, 64], expected [32, 64]"}},
        {"rope_scaling longrope", "dense_f16_tied",
         [](json &c) {
             c["rope_scaling"] = {{"type", "longrope"}, {"short_factor", {1.0}}, {"long_factor", {2.0}}};
         },
         TL_ERR_UNSUPPORTED, {"field 'rope_scaling.type' = 'longrope'", "linear, dynamic, llama3 and yarn"}},
        {"rope_scaling field of another type", "dense_f16_tied",
         [](json &c) {
             c["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}, {"low_freq_factor", 1.0}};
         },
         TL_ERR_UNSUPPORTED, {"field 'rope_scaling.low_freq_factor' = 1.0", "'linear' RoPE scaling"}},
        {"dynamic rope past its range", "dense_f16_tied",
         [](json &c) {
             c["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}, {"original_max_position_embeddings", 64}};
         },
         TL_ERR_UNSUPPORTED,
         {"field 'rope_scaling.rope_type' = 'dynamic'", "longer than 64 tokens", "max_seq is 128", "--max-seq"}},
        {"llama3 without its context length", "dense_f16_tied",
         [](json &c) {
             c["rope_scaling"] = {
                 {"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0}};
         },
         TL_ERR_FORMAT, {"field 'rope_scaling.original_max_position_embeddings' is missing"}},
        {"rope factor 0", "dense_f16_tied", [](json &c) { c["rope_scaling"] = {{"type", "linear"}, {"factor", 0}}; },
         TL_ERR_FORMAT, {"field 'rope_scaling.factor' = 0 must be positive"}},
        {"rope_scaling and rope_parameters", "dense_f16_tied",
         [](json &c) {
             c["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
             c["rope_parameters"] = {{"rope_type", "default"}};
         },
         TL_ERR_FORMAT, {"field 'rope_parameters'", "both set"}},
        {"hidden_act", "dense_f16_tied", [](json &c) { c["hidden_act"] = "gelu"; }, TL_ERR_UNSUPPORTED,
         {"field 'hidden_act' = 'gelu'"}},
        {"attention_bias not a boolean", "dense_f16_tied", [](json &c) { c["attention_bias"] = 1; }, TL_ERR_FORMAT,
         {"field 'attention_bias' must be true or false"}},
        {"untied without lm_head", "dense_f16_tied", [](json &c) { c["tie_word_embeddings"] = false; }, TL_ERR_FORMAT,
         {"missing tensor 'lm_head.weight'", "tie_word_embeddings is false"}},
        {"tied with a different lm_head", "dense_bf16_untied_gqa", [](json &c) { c["tie_word_embeddings"] = true; },
         TL_ERR_FORMAT, {"tensor 'lm_head.weight'", "differs from model.embed_tokens.weight"}},
        {"bits 3", "gptq", [](json &c) { c["quantization_config"]["bits"] = 3; }, TL_ERR_UNSUPPORTED,
         {"field 'quantization_config.bits' = 3", "only 4-bit checkpoints, and 8-bit GPTQ ones"}},
        {"awq bits 8", "awq", [](json &c) { c["quantization_config"]["bits"] = 8; }, TL_ERR_UNSUPPORTED,
         {"field 'quantization_config.bits' = 8"}},
        {"bits 8 on 4-bit tensors", "gptq", [](json &c) { c["quantization_config"]["bits"] = 8; }, TL_ERR_FORMAT,
         {".qweight'", "[K/4, N] (8-bit GPTQ)"}},
        {"desc_act not a boolean", "gptq", [](json &c) { c["quantization_config"]["desc_act"] = "yes"; },
         TL_ERR_FORMAT, {"field 'quantization_config.desc_act' must be true or false"}},
        {"gptq v2", "gptq", [](json &c) { c["quantization_config"]["checkpoint_format"] = "gptq_v2"; },
         TL_ERR_UNSUPPORTED, {"quantization_config.checkpoint_format", "gptq_v2"}},
        {"another method", "gptq", [](json &c) { c["quantization_config"]["quant_method"] = "bitsandbytes"; },
         TL_ERR_UNSUPPORTED, {"quant_method", "'bitsandbytes'"}},
        {"awq gemv", "awq", [](json &c) { c["quantization_config"]["version"] = "gemv"; }, TL_ERR_UNSUPPORTED,
         {"quantization_config.version", "GEMM"}},
        {"group size not the tensors'", "gptq", [](json &c) { c["quantization_config"]["group_size"] = 64; },
         TL_ERR_FORMAT, {"qzeros'", "expected [1, "}},
        {"INT4 tensors without quantization_config", "gptq", [](json &c) { c.erase("quantization_config"); },
         TL_ERR_FORMAT, {".qweight'", "no quantization_config"}},
        {"not an object", "dense_f16_tied", [](json &c) { c = json::array(); }, TL_ERR_FORMAT,
         {"config.json': not a JSON object"}},
        {"plain config without num_hidden_layers", "dense_f16_tied",
         [](json &c) {
             c.erase("num_pre_layers");
             c.erase("num_loops");
             c.erase("num_hidden_layers");
         },
         TL_ERR_FORMAT, {"field 'num_hidden_layers' is missing", "num_pre_layers and num_loops"}},
        {"plain config, too few layers stored", "plain_llama", [](json &c) { c["num_hidden_layers"] = 2; },
         TL_ERR_FORMAT, {"unexpected tensor 'model.layers.2.", "num_hidden_layers = 2"}},
        {"sliding window", "dense_f16_tied",
         [](json &c) {
             c["model_type"] = "mistral";
             c["sliding_window"] = 64;
         },
         TL_ERR_UNSUPPORTED,
         {"field 'sliding_window' = 64", "sliding-window attention", "max_seq is 128 (max_position_embeddings)",
          "--max-seq"}},
        {"qwen2 sliding window switched on", "dense_f16_tied",
         [](json &c) {
             c["model_type"] = "qwen2";
             c["sliding_window"] = 32;
             c["use_sliding_window"] = true;
         },
         TL_ERR_UNSUPPORTED, {"field 'sliding_window' = 32"}},
        {"layer_types", "dense_f16_tied", [](json &c) { c["layer_types"] = {"full_attention", "chunked_attention"}; },
         TL_ERR_UNSUPPORTED, {"field 'layer_types'", "'chunked_attention'"}},
        {"gemma", "dense_f16_tied", [](json &c) { c["model_type"] = "gemma2"; }, TL_ERR_UNSUPPORTED,
         {"field 'model_type' = 'gemma2'", "1 + weight", "sqrt(hidden_size)", "GELU"}},
        {"gemma's activation", "dense_f16_tied", [](json &c) { c["hidden_activation"] = "gelu_pytorch_tanh"; },
         TL_ERR_UNSUPPORTED, {"field 'hidden_activation'", "'gelu_pytorch_tanh'", "Gemma"}},
        {"another family", "dense_f16_tied", [](json &c) { c["model_type"] = "phi3"; }, TL_ERR_UNSUPPORTED,
         {"field 'model_type' = 'phi3'", "Llama-family"}},
        {"a field the importer does not know", "dense_f16_tied", [](json &c) { c["query_pre_attn_scalar"] = 256; },
         TL_ERR_UNSUPPORTED, {"field 'query_pre_attn_scalar' = 256", "not a field this importer reads",
          "docs/import.md"}},
        {"a quantization field the importer does not know", "gptq",
         [](json &c) { c["quantization_config"]["act_group_aware"] = true; }, TL_ERR_UNSUPPORTED,
         {"field 'quantization_config.act_group_aware' = true"}},
        {"partial rotary", "dense_f16_tied", [](json &c) { c["partial_rotary_factor"] = 0.5; }, TL_ERR_UNSUPPORTED,
         {"field 'partial_rotary_factor' = 0.5"}},
        {"fields the importer ignores", "dense_f16_tied",
         [](json &c) { c["eos_token_id"] = json::array({1, 2}), c["attention_dropout"] = 0.1; }, TL_OK, {}},
    };
    for (const ConfigCase &c : cases) {
        SCOPED_TRACE(c.name);
        const std::string dir = with_config(c.variant, c.edit);
        const Result r = convert(dir, scratch("out.tinyloop"));
        EXPECT_EQ(r.status, c.status) << r.message;
        for (const char *part : c.message) {
            EXPECT_NE(r.message.find(part), std::string::npos) << "message lacks \"" << part << "\": " << r.message;
        }
    }
}

// ---- Refusals: files and the sharded index ----

TEST(CheckpointImportRefuses, Files) {
    const std::string out = scratch("out.tinyloop");
    EXPECT_REFUSED(convert(kData + "/no_such_folder", out), TL_ERR_IO, "no_such_folder");
    EXPECT_REFUSED(convert(kData + "/gptq.expected.json", out), TL_ERR_IO, "is not a folder");
    std::string dir = copy_of("dense_f16_tied");
    fs::remove(dir + "/model.safetensors");
    EXPECT_REFUSED(convert(dir, out), TL_ERR_IO, "has neither model.safetensors nor model.safetensors.index.json");
    fs::remove(dir + "/config.json");
    EXPECT_REFUSED(convert(dir, out), TL_ERR_IO, "config.json'");
    {
        dir = copy_of("dense_f16_tied");
        std::ofstream(dir + "/config.json") << "{\"hidden_size\": 64,";
        EXPECT_REFUSED(convert(dir, out), TL_ERR_FORMAT, "config.json' is not valid JSON");
    }
    {  // nlohmann's parser takes a NUL for the end of its input: the junk after it must not pass unseen
        dir = copy_of("dense_f16_tied");
        std::string text;
        {
            std::ifstream in(dir + "/config.json", std::ios::binary);
            text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
        }
        text += std::string("\0junk", 5);
        std::ofstream(dir + "/config.json", std::ios::binary) << text;
        EXPECT_REFUSED(convert(dir, out), TL_ERR_FORMAT, "config.json' has control byte 0x00 at byte");
    }
    {  // nesting deep enough to overflow a recursive printer's stack
        dir = copy_of("dense_f16_tied");
        std::ofstream(dir + "/config.json") << "{\"hidden_size\": " << std::string(100000, '[') << "1"
                                            << std::string(100000, ']') << "}";
        EXPECT_REFUSED(convert(dir, out), TL_ERR_FORMAT, "config.json' nests arrays and objects deeper than 64");
    }
    // The output's folder does not exist.
    EXPECT_REFUSED(convert(kData + "/dense_f16_tied", kData + "/no_such_folder/x.tinyloop"), TL_ERR_IO,
                   "no_such_folder");
}

TEST(CheckpointImportRefuses, ShardIndex) {
    const std::string out = scratch("out.tinyloop");
    const std::string index = "/model.safetensors.index.json";
    {
        const std::string dir = copy_of("dense_f32_sharded");
        json j = read_json(dir + index);
        j["weight_map"]["model.norm.weight"] = "model-00009-of-00003.safetensors";
        write_json(dir + index, j);
        EXPECT_REFUSED(convert(dir, out), TL_ERR_IO, "model-00009-of-00003.safetensors");
    }
    {
        const std::string dir = copy_of("dense_f32_sharded");
        json j = read_json(dir + index);
        j["weight_map"]["model.norm.weight"] = "../dense_f16_tied/model.safetensors";
        write_json(dir + index, j);
        EXPECT_REFUSED(convert(dir, out), TL_ERR_FORMAT, "weight_map['model.norm.weight']", "not a file name");
    }
    {
        const std::string dir = copy_of("dense_f32_sharded");
        json j = read_json(dir + index);
        j["weight_map"].erase("model.norm.weight");
        write_json(dir + index, j);
        EXPECT_REFUSED(convert(dir, out), TL_ERR_FORMAT, "tensor 'model.norm.weight' is not listed");
    }
    {
        const std::string dir = copy_of("dense_f32_sharded");
        json j = read_json(dir + index);
        const std::string shard = j["weight_map"]["model.norm.weight"];
        const std::string other = shard == "model-00001-of-00003.safetensors" ? "model-00002-of-00003.safetensors"
                                                                              : "model-00001-of-00003.safetensors";
        j["weight_map"]["model.norm.weight"] = other;
        write_json(dir + index, j);
        EXPECT_REFUSED(convert(dir, out), TL_ERR_FORMAT, "weight_map puts tensor 'model.norm.weight'",
                       "no such tensor");
    }
}

// ---- The C API's arguments ----

TEST(CheckpointImportRefuses, Arguments) {
    const std::string dir = kData + "/dense_f16_tied", out = scratch("out.tinyloop");
    EXPECT_EQ(tl_model_import_checkpoint(nullptr, out.c_str(), nullptr), TL_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(tl_model_import_checkpoint(dir.c_str(), nullptr, nullptr), TL_ERR_INVALID_ARGUMENT);
    tl_import_options o;
    EXPECT_EQ(tl_import_options_init(&o, 3), TL_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(tl_import_options_init(nullptr, sizeof o), TL_ERR_INVALID_ARGUMENT);
    ASSERT_EQ(tl_import_options_init(&o, sizeof o), TL_OK);
    o.struct_size = 5;
    EXPECT_REFUSED(convert(dir, out, &o), TL_ERR_INVALID_ARGUMENT, "options->struct_size");
    ASSERT_EQ(tl_import_options_init(&o, sizeof o), TL_OK);
    o.use_mmap = 2;
    EXPECT_REFUSED(convert(dir, out, &o), TL_ERR_INVALID_ARGUMENT, "options->use_mmap");
    ASSERT_EQ(tl_import_options_init(&o, sizeof o), TL_OK);
    o.max_seq = -1;
    EXPECT_REFUSED(convert(dir, out, &o), TL_ERR_INVALID_ARGUMENT, "options->max_seq");
    EXPECT_FALSE(fs::exists(out));
}

}  // namespace
