// The malformed-file corpus: each case derives one broken file from a freshly generated valid one, writes it to
// the build tree (tests/format/corpus/<case>.tinyloop, for inspection), and expects the exact status and a
// message naming the problem, through both tl::load_model and the C API's tl_model_load.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <functional>

#include "../common/tl_error.hpp"
#include "util/error.hpp"
#include "format_test_util.hpp"
#include "tinyloop.h"

namespace {

using nlohmann::json;

struct Base {
    tl::ModelConfig config;
    std::vector<uint8_t> bytes;
    tlt::RawFile raw;
    std::string last_tensor;  // the tensor whose data ends the file
};

// Per group (8), quantized head, F32 norms, F16 embedding; fresh random content in every run.
const Base &base() {
    static const Base b = [] {
        Base out;
        out.config = tlt::small_config(8);
        tlt::ModelSpec spec;
        spec.head = tlt::HeadStore::Quantized;
        std::mt19937_64 rng(std::random_device{}());
        out.bytes = tlt::make_valid_file(out.config, spec, "corpus_base.tinyloop", rng);
        out.raw = tlt::parse_raw(out.bytes);
        for (const auto &kv : out.raw.header.items())
            if (kv.key() != "__metadata__" && kv.value()["data_offsets"][1] == out.raw.data.size())
                out.last_tensor = kv.key();
        return out;
    }();
    return b;
}

using Make = std::function<std::vector<uint8_t>(const Base &)>;

struct CorpusCase {
    const char *name;
    tl_status status;
    std::vector<std::string> substrings;
    Make make;
    bool names_last_tensor = false;  // the message must also name base().last_tensor
};

Make bytes_edit(std::function<void(std::vector<uint8_t> &)> edit) {
    return [edit](const Base &b) {
        std::vector<uint8_t> bytes = b.bytes;
        edit(bytes);
        return bytes;
    };
}

Make header_edit(std::function<void(tlt::RawFile &)> edit) {
    return [edit](const Base &b) {
        tlt::RawFile raw = b.raw;
        edit(raw);
        return tlt::encode_raw(raw);
    };
}

// Replaces the header text (the data section stays).
Make header_text(std::string text) {
    return [text](const Base &b) { return tlt::encode_file(text, b.raw.data); };
}

// The valid header's JSON with `before` spliced in after its opening brace and `after` appended (data unchanged).
Make header_framing(std::string before, std::string after) {
    return [before, after](const Base &b) {
        const std::string json = b.raw.header.dump();
        return tlt::encode_file("{" + before + json.substr(1) + after, b.raw.data);
    };
}

void set_length(std::vector<uint8_t> &bytes, uint64_t length) {
    for (int i = 0; i < 8; ++i) bytes[size_t(i)] = static_cast<uint8_t>(length >> (8 * i));
}

uint64_t length_of(const std::vector<uint8_t> &bytes) {
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[size_t(i)];
    return n;
}

json &config_of(tlt::RawFile &raw, json *config) {
    *config = json::parse(raw.header["__metadata__"]["config"].get<std::string>());
    return *config;
}

Make config_edit(std::function<void(json &)> edit) {
    return header_edit([edit](tlt::RawFile &raw) {
        json config;
        edit(config_of(raw, &config));
        raw.header["__metadata__"]["config"] = config.dump();
    });
}

// Overwrites element `index` of a tensor's data with `value` (of the tensor's element size).
template <typename T>
Make data_edit(std::string tensor, size_t index, T value) {
    return header_edit([tensor, index, value](tlt::RawFile &raw) {
        const uint64_t begin = raw.header.at(tensor)["data_offsets"][0].get<uint64_t>();
        std::memcpy(raw.data.data() + begin + index * sizeof(T), &value, sizeof(T));
    });
}

// Adds a tensor entry whose bytes are appended to the data section.
void append_tensor(tlt::RawFile &raw, const std::string &name, const char *dtype, std::vector<int64_t> shape,
                   size_t bytes) {
    raw.header[name] = {
        {"dtype", dtype}, {"shape", shape}, {"data_offsets", {raw.data.size(), raw.data.size() + bytes}}};
    raw.data.resize(raw.data.size() + bytes, 0);
}

// Makes loop.mlp_gate (K = 24, N = 40, groups of 8) an INT8 linear: I8 codes [40, 24] and F16 scales [40, 3] appended
// (zero bytes: valid), its zeros removed unless `keep_zeros`, and config.bits = `bits`. The rest stay INT4: a mixed
// file.
void make_int8(tlt::RawFile &r, int bits = 8, bool keep_zeros = false) {
    for (const char *s : {".qweight", ".scales", ".zeros"}) {
        if (!keep_zeros || std::string(s) != ".zeros") r.header.erase(std::string("loop.mlp_gate") + s);
    }
    append_tensor(r, "loop.mlp_gate.qweight", "I8", {40, 24}, 40 * 24);
    append_tensor(r, "loop.mlp_gate.scales", "F16", {40, 3}, 40 * 3 * 2);
    json config;
    config_of(r, &config)["bits"] = bits;
    r.header["__metadata__"]["config"] = config.dump();
}

// An INT8 loop.mlp_gate whose data section byte `offset` of tensor `tensor` is set to `byte`.
Make int8_byte_edit(std::string tensor, size_t offset, uint8_t byte) {
    return header_edit([tensor, offset, byte](tlt::RawFile &r) {
        make_int8(r);
        r.data[r.header.at(tensor)["data_offsets"][0].get<uint64_t>() + offset] = byte;
    });
}

// clang-format off: one case per entry reads better as a table.
std::vector<CorpusCase> corpus() {
    const tl_status F = TL_ERR_FORMAT;
    return {
        // ---- truncation in each section ----
        {"empty_file", F, {"shorter than the 8-byte header length"},
         bytes_edit([](auto &b) { b.clear(); })},
        {"truncated_in_length", F, {"5 bytes", "shorter than the 8-byte header length"},
         bytes_edit([](auto &b) { b.resize(5); })},
        {"truncated_in_header", F, {"header length", "runs past the end of the file"},
         bytes_edit([](auto &b) { b.resize(8 + length_of(b) / 2); })},
        {"truncated_in_data", F, {"past the end of the data section"},
         bytes_edit([](auto &b) { b.resize(b.size() - 3); }), true},
        // ---- the length prefix lies ----
        {"header_length_zero", F, {"header length is 0"},
         bytes_edit([](auto &b) { set_length(b, 0); })},
        {"header_length_past_end", F, {"runs past the end of the file"},
         bytes_edit([](auto &b) { set_length(b, b.size()); })},
        {"header_length_huge", F, {"header length 9223372036854775808 exceeds"},
         bytes_edit([](auto &b) { set_length(b, uint64_t{1} << 63); })},
        {"header_length_just_over_limit", F, {"header length 16777217 exceeds the 16 MiB (16777216-byte) limit"},
         bytes_edit([](auto &b) { set_length(b, (uint64_t{16} << 20) + 1); })},
        {"header_length_short", F, {"header is not valid JSON"},
         bytes_edit([](auto &b) { set_length(b, length_of(b) / 2); })},
        // ---- the JSON ----
        {"invalid_json", F, {"header is not valid JSON"},
         header_text("{\"__metadata__\": {\"format\": \"tinyloop\",")},
        {"json_array", F, {"header JSON is not an object"},
         header_text("[1, 2, 3]")},
        {"deeply_nested_json", F, {"header nests arrays and objects deeper than 64 levels (at byte 64)"},
         header_text(std::string(100000, '[') + std::string(100000, ']'))},
        // A header of small values would cost ~20x its size to parse; the value count bounds it.
        {"header_of_small_values", F, {"header holds more than 262144 values (array elements and object members)"},
         header_text("{\"a\": [" + [] {
             std::string zeros;
             for (int i = 0; i < 300000; ++i) zeros += "0,";
             return zeros;
         }() + "0]}")},
        // ---- the bytes around the JSON: only spaces may follow it, no control byte anywhere ----
        {"header_nul_then_junk", F, {"header has control byte 0x00 at file offset"},
         header_framing("", std::string(1, '\0') + "{\"junk\": [1, 2]}")},
        {"header_nul_padding", F, {"header has control byte 0x00"},
         header_framing("", std::string(8, '\0'))},
        {"header_spaces_then_nul", F, {"header has control byte 0x00"},
         header_framing("", "    " + std::string(1, '\0'))},
        {"header_control_byte_inside", F, {"header has control byte 0x01"},
         header_framing(std::string(1, '\x01'), "")},
        {"header_newline_after_json", F, {"byte 0x0a", "after the JSON object; only spaces may follow it"},
         header_framing("", "  \n")},
        {"header_junk_after_spaces", F, {"header is not valid JSON"},
         header_framing("", "    x")},
        {"tensor_entry_not_object", F, {"'loop.attn_norm.weight'", "not a JSON object"},
         header_edit([](auto &r) { r.header["loop.attn_norm.weight"] = 5; })},
        // ---- metadata ----
        {"missing_metadata", F, {"no __metadata__"},
         header_edit([](auto &r) { r.header.erase("__metadata__"); })},
        {"metadata_not_object", F, {"__metadata__ is not a JSON object"},
         header_edit([](auto &r) { r.header["__metadata__"] = "x"; })},
        {"metadata_value_not_string", F, {"'format_version'", "not a string"},
         header_edit([](auto &r) { r.header["__metadata__"]["format_version"] = 1; })},
        {"missing_format", F, {"__metadata__ has no 'format'"},
         header_edit([](auto &r) { r.header["__metadata__"].erase("format"); })},
        {"wrong_format", F, {"format is 'safetensors'", "expected 'tinyloop'"},
         header_edit([](auto &r) { r.header["__metadata__"]["format"] = "safetensors"; })},
        {"future_format_version", F, {"unsupported format_version 3 (this library reads 2)"},
         header_edit([](auto &r) { r.header["__metadata__"]["format_version"] = "3"; })},
        {"bad_format_version", F, {"format_version '1.0'"},
         header_edit([](auto &r) { r.header["__metadata__"]["format_version"] = "1.0"; })},
        {"missing_config", F, {"__metadata__ has no 'config'"},
         header_edit([](auto &r) { r.header["__metadata__"].erase("config"); })},
        // ---- the config ----
        {"config_not_json", F, {"config is not valid JSON"},
         header_edit([](auto &r) { r.header["__metadata__"]["config"] = "{d_model: 24"; })},
        {"config_missing_field", F, {"config: missing field 'ffn'"},
         config_edit([](json &c) { c.erase("ffn"); })},
        {"config_wrong_type", F, {"config: field 'n_heads'"},
         config_edit([](json &c) { c["n_heads"] = "2"; })},
        {"config_absurd_d_model", F, {"config: d_model = 1048576"},
         config_edit([](json &c) { c["d_model"] = 1 << 20; })},
        {"config_absurd_vocab", F, {"config: vocab = 2000000000"},
         config_edit([](json &c) { c["vocab"] = 2000000000; })},
        {"config_bits_8", F, {"config: bits = 8, but the widest quantized linear", "has 4-bit codes"},
         config_edit([](json &c) { c["bits"] = 8; })},
        {"config_bits_5", F, {"config: bits = 5 is unsupported (4 or 8)"},
         config_edit([](json &c) { c["bits"] = 5; })},
        {"config_group_not_dividing_k", F, {"config: group_size = 12 does not divide"},
         config_edit([](json &c) { c["group_size"] = 12; })},
        {"config_group_disagrees_with_scales", F, {"'pre.0.attn_qkv.scales'", "group_size 4"},
         config_edit([](json &c) { c["group_size"] = 4; })},
        {"config_norm_eps_out_of_range", F, {"config: norm_eps"},
         config_edit([](json &c) { c["norm_eps"] = 2.0; })},
        // ---- tensor entries ----
        {"offsets_past_end", F, {"'loop.mlp_down.qweight'", "past the end of the data section"},
         header_edit([](auto &r) {
             json &o = r.header["loop.mlp_down.qweight"]["data_offsets"];
             const uint64_t size = o[1].get<uint64_t>() - o[0].get<uint64_t>();
             o = {r.data.size() + 16, r.data.size() + 16 + size};
         })},
        {"offsets_begin_after_end", F, {"'loop.mlp_down.qweight'", "begin > end"},
         header_edit([](auto &r) {
             json &o = r.header["loop.mlp_down.qweight"]["data_offsets"];
             o = {o[1], o[0]};
         })},
        {"offsets_not_a_pair", F, {"'final_norm.weight'", "data_offsets must be two"},
         header_edit([](auto &r) { r.header["final_norm.weight"]["data_offsets"] = {0}; })},
        {"overlapping_tensors", F, {"'loop.attn_norm.weight'", "'loop.mlp_norm.weight'", "overlaps"},
         header_edit([](auto &r) {
             r.header["loop.mlp_norm.weight"]["data_offsets"] = r.header["loop.attn_norm.weight"]["data_offsets"];
         })},
        {"size_not_matching_shape", F, {"'loop.attn_norm.weight'", "needs 92"},
         header_edit([](auto &r) { r.header["loop.attn_norm.weight"]["shape"] = {23}; })},
        {"negative_dimension", F, {"'pre.1.mlp_norm.weight'", "non-negative integers"},
         header_edit([](auto &r) { r.header["pre.1.mlp_norm.weight"]["shape"] = {-24}; })},
        {"overflowing_shape", F, {"'loop.mlp_up.qweight'", "too large"},
         header_edit([](auto &r) { r.header["loop.mlp_up.qweight"]["shape"] = {int64_t{1} << 40, int64_t{1} << 40}; })},
        {"unknown_dtype", F, {"'loop.attn_norm.weight'", "dtype 'F64'"},
         header_edit([](auto &r) { r.header["loop.attn_norm.weight"]["dtype"] = "F64"; })},
        // ---- dtype and shape against the config ----
        {"scales_dtype_mismatch", F, {"'pre.1.attn_out.scales'", "dtype BF16, expected F16"},
         header_edit([](auto &r) { r.header["pre.1.attn_out.scales"]["dtype"] = "BF16"; })},
        {"norm_dtype_int", F, {"'final_norm.weight'", "dtype I32"},
         header_edit([](auto &r) { r.header["final_norm.weight"]["dtype"] = "I32"; })},
        {"qweight_shape_transposed", F, {"'loop.attn_qkv.qweight'", "shape [12, 48], expected [48, 12]"},
         header_edit([](auto &r) { r.header["loop.attn_qkv.qweight"]["shape"] = {12, 48}; })},
        {"embed_shape_transposed", F, {"'embed.weight'", "expected [50, 24]"},
         header_edit([](auto &r) { r.header["embed.weight"]["shape"] = {24, 50}; })},
        {"frac4_wrong_shape", F, {"'loop.mlp_gate.frac4'", "expected [40, 12]"},
         header_edit([](auto &r) { append_tensor(r, "loop.mlp_gate.frac4", "U8", {40, 6}, 240); })},
        {"k_perm_wrong_shape", F, {"'loop.mlp_gate.k_perm'", "expected [24]"},
         header_edit([](auto &r) { append_tensor(r, "loop.mlp_gate.k_perm", "I32", {23}, 92); })},
        {"k_perm_not_a_permutation", F, {"'loop.mlp_gate.k_perm'", "k_perm[1] = 0 repeats k_perm[0]", "permutation"},
         header_edit([](auto &r) { append_tensor(r, "loop.mlp_gate.k_perm", "I32", {24}, 96); })},
        // ---- values ----
        {"nan_scale", F, {"'pre.1.mlp_up.scales'", "index 5"},
         data_edit<uint16_t>("pre.1.mlp_up.scales", 5, 0x7E00)},
        {"inf_zero", F, {"'loop.attn_out.zeros'", "index 0"},
         data_edit<uint16_t>("loop.attn_out.zeros", 0, 0x7C00)},
        {"nan_norm", F, {"'final_norm.weight'", "index 3"},
         data_edit<uint32_t>("final_norm.weight", 3, 0x7FC00000u)},
        {"inf_embedding", F, {"'embed.weight'", "index 100"},
         data_edit<uint16_t>("embed.weight", 100, 0xFC00)},
        // ---- INT8 linears ----
        {"int8_under_config_bits_4", F, {"config: bits = 4", "'loop.mlp_gate' has 8-bit codes"},
         header_edit([](auto &r) { make_int8(r, 4); })},
        {"int8_nan_scale", F, {"'loop.mlp_gate.scales'", "index 2"},
         int8_byte_edit("loop.mlp_gate.scales", 5, 0x7E)},
        {"int8_with_zeros", F, {"'loop.mlp_gate.zeros'", "belongs to an INT4 linear", "INT8"},
         header_edit([](auto &r) { make_int8(r, 8, true); })},
        {"int8_with_frac4", F, {"'loop.mlp_gate.frac4'", "belongs to an INT4 linear"},
         header_edit([](auto &r) { make_int8(r); append_tensor(r, "loop.mlp_gate.frac4", "U8", {40, 12}, 480); })},
        {"int8_codes_packed_shape", F, {"'loop.mlp_gate.qweight'", "shape [40, 12], expected [40, 24]"},
         header_edit([](auto &r) {
             make_int8(r);
             r.header.erase("loop.mlp_gate.qweight");
             append_tensor(r, "loop.mlp_gate.qweight", "I8", {40, 12}, 480);
         })},
        {"int8_scales_wrong_groups", F, {"'loop.mlp_gate.scales'", "group_size 8"},
         header_edit([](auto &r) {
             make_int8(r);
             r.header.erase("loop.mlp_gate.scales");
             append_tensor(r, "loop.mlp_gate.scales", "F16", {40, 1}, 80);
         })},
        {"qweight_dtype_i32", F, {"'loop.mlp_gate.qweight'", "dtype I32, expected U8/I8"},
         header_edit([](auto &r) {
             r.header.erase("loop.mlp_gate.qweight");
             append_tensor(r, "loop.mlp_gate.qweight", "I32", {40, 3}, 480);
         })},
        // ---- names ----
        {"missing_tensor", F, {"missing tensor 'loop.mlp_down.zeros'"},
         header_edit([](auto &r) { r.header.erase("loop.mlp_down.zeros"); })},
        {"missing_linear", F, {"missing tensor 'pre.0.mlp_gate.qweight'"},
         header_edit([](auto &r) {
             for (const char *s : {".qweight", ".scales", ".zeros"}) r.header.erase(std::string("pre.0.mlp_gate") + s);
         })},
        {"missing_embedding", F, {"missing tensor 'embed.weight'"},
         header_edit([](auto &r) { r.header.erase("embed.weight"); })},
        {"unexpected_tensor_typo", F, {"unexpected tensor 'loop.attn_qkv.qwieght'"},
         header_edit([](auto &r) { append_tensor(r, "loop.attn_qkv.qwieght", "U8", {0}, 0); })},
        {"unexpected_stale_block", F, {"unexpected tensor 'pre.2.attn_norm.weight'"},
         header_edit([](auto &r) { append_tensor(r, "pre.2.attn_norm.weight", "F32", {24}, 96); })},
        {"dense_and_quantized", F, {"'loop.mlp_up'", "both a dense"},
         header_edit([](auto &r) { append_tensor(r, "loop.mlp_up.weight", "F16", {40, 24}, 40 * 24 * 2); })},
        {"incomplete_head", F, {"missing tensor 'head.zeros'"},
         header_edit([](auto &r) { r.header.erase("head.zeros"); })},
    };
}
// clang-format on

std::string corpus_path(const std::string &name) {
    std::filesystem::create_directories(TL_FORMAT_CORPUS_DIR);
    return std::string(TL_FORMAT_CORPUS_DIR) + "/" + name + ".tinyloop";
}

bool contains(const std::string &text, const std::string &part) { return text.find(part) != std::string::npos; }

// Loading `path` fails with `status` and a message naming the file and every substring, through the C++ entry
// and the C API, mapped and read.
void expect_rejected(const std::string &path, tl_status status, std::vector<std::string> substrings) {
    substrings.push_back(path);
    for (bool use_mmap : {true, false}) {
        SCOPED_TRACE(use_mmap ? "mmap" : "read");
        EXPECT_TRUE(tlt::throws(status, substrings, [&] { tl::load_model(path, tl::LoadOptions{use_mmap, true}); }));

        tl_load_options options;
        ASSERT_EQ(tl_load_options_init(&options, sizeof options), TL_OK);
        options.use_mmap = use_mmap;
        tl_model *model = reinterpret_cast<tl_model *>(&options);  // must come back NULL
        const tl_status got = tl_model_load(path.c_str(), &options, &model);
        const std::string message = tl_last_error_message();
        EXPECT_EQ(got, status) << message;
        if (got == TL_OK) tl_model_free(model);
        EXPECT_EQ(model, nullptr);
        for (const std::string &s : substrings)
            EXPECT_TRUE(contains(message, s)) << "'" << s << "' not in: " << message;
    }
}

void PrintTo(const CorpusCase &c, std::ostream *os) { *os << c.name; }

class MalformedFile : public ::testing::TestWithParam<CorpusCase> {};

TEST_P(MalformedFile, IsRejectedWithTheExpectedStatusAndMessage) {
    const CorpusCase &c = GetParam();
    const std::string path = corpus_path(c.name);
    tlt::write_bytes(path, c.make(base()));
    std::vector<std::string> substrings = c.substrings;
    if (c.names_last_tensor) substrings.push_back("'" + base().last_tensor + "'");
    expect_rejected(path, c.status, substrings);
}

INSTANTIATE_TEST_SUITE_P(Corpus, MalformedFile, ::testing::ValuesIn(corpus()),
                         [](const ::testing::TestParamInfo<CorpusCase> &info) { return std::string(info.param.name); });

TEST(Corpus, IsLargeEnough) { EXPECT_GE(corpus().size(), 20u); }

// The file every case starts from loads, so each rejection is due to its one change.
TEST(Corpus, BaseFileLoads) {
    const std::string path = corpus_path("valid_base");
    tlt::write_bytes(path, base().bytes);
    tl_model *model = nullptr;
    EXPECT_EQ(tl_model_load(path.c_str(), nullptr, &model), TL_OK) << tl_last_error_message();
    EXPECT_NE(model, nullptr);
    tl_model_free(model);
    EXPECT_NO_THROW(tl::load_model(path, tl::LoadOptions{}));
}

// The corpus's INT8 edit alone gives a valid mixed file: INT8 loop.mlp_gate, INT4 elsewhere, config.bits = 8.
TEST(Corpus, MixedInt4Int8FileLoads) {
    const std::string path = corpus_path("valid_mixed_int8");
    tlt::write_bytes(path, header_edit([](tlt::RawFile &r) { make_int8(r); })(base()));
    const auto model = tl::load_model(path, tl::LoadOptions{});
    EXPECT_EQ(model->config.bits, 8);
    EXPECT_EQ(model->loop.mlp_gate.bits, 8);
    EXPECT_EQ(model->loop.mlp_gate.zeros, nullptr);
    EXPECT_EQ(model->loop.mlp_up.bits, 4);
    EXPECT_EQ(model->pre[0].mlp_gate.bits, 4);
    // Every INT8 code is valid, -128 included (symmetric 8-bit GPTQ's code 0), and reads back as itself.
    tlt::write_bytes(path, int8_byte_edit("loop.mlp_gate.qweight", 7, 0x80)(base()));
    const auto with_min = tl::load_model(path, tl::LoadOptions{});
    EXPECT_EQ(static_cast<int8_t>(with_min->loop.mlp_gate.codes[7]), -128);
}

// The same file with its JSON padded and values unchecked loads too: validate_values=false skips only the scan.
TEST(Corpus, ValueScanCanBeTurnedOff) {
    const std::string path = corpus_path("nan_scale_unchecked");
    tlt::write_bytes(path, data_edit<uint16_t>("pre.1.mlp_up.scales", 5, 0x7E00)(base()));
    EXPECT_NO_THROW(tl::load_model(path, tl::LoadOptions{true, false}));
    tl_load_options options;
    ASSERT_EQ(tl_load_options_init(&options, sizeof options), TL_OK);
    options.validate_values = 0;
    tl_model *model = nullptr;
    EXPECT_EQ(tl_model_load(path.c_str(), &options, &model), TL_OK) << tl_last_error_message();
    tl_model_free(model);
}

TEST(IoErrors, MissingFile) {
    expect_rejected(tlt::temp_dir() + "/does_not_exist.tinyloop", TL_ERR_IO,
                    {"cannot open", "No such file or directory"});
}

TEST(IoErrors, Directory) { expect_rejected(tlt::temp_dir(), TL_ERR_IO, {"not a regular file"}); }

}  // namespace
