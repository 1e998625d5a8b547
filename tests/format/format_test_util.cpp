#include "format_test_util.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "util/half.hpp"

namespace tlt {
namespace {

void append_float(tl::DType dtype, float value, std::vector<uint8_t> *out) {
    uint8_t bytes[4];
    size_t n = 0;
    if (dtype == tl::DType::F32) {
        std::memcpy(bytes, &value, 4);
        n = 4;
    } else if (dtype == tl::DType::F16) {
        const uint16_t h = tl::float_to_half(value);
        std::memcpy(bytes, &h, 2);
        n = 2;
    } else {  // BF16: the top half of the F32 bits
        uint32_t bits;
        std::memcpy(&bits, &value, 4);
        const uint16_t b = static_cast<uint16_t>(bits >> 16);
        std::memcpy(bytes, &b, 2);
        n = 2;
    }
    out->insert(out->end(), bytes, bytes + n);
}

OwnedTensor float_tensor(const std::string &name, tl::DType dtype, std::vector<int64_t> shape,
                         const std::vector<float> &values) {
    OwnedTensor t{name, dtype, std::move(shape), {}, values};
    for (float v : values) append_float(dtype, v, &t.bytes);
    return t;
}

OwnedTensor random_bytes(const std::string &name, std::vector<int64_t> shape, std::mt19937_64 &rng) {
    OwnedTensor t{name, tl::DType::U8, std::move(shape), {}, {}};
    t.bytes.resize(static_cast<size_t>(t.shape[0] * t.shape[1]));
    for (uint8_t &b : t.bytes) b = static_cast<uint8_t>(rng());
    return t;
}

std::vector<float> uniform(size_t count, float lo, float hi, std::mt19937_64 &rng) {
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(count);
    for (float &x : v) x = dist(rng);
    return v;
}

// Norm gains in [0.5, 1.5) on a 1/64 grid: exact in F16, BF16 and F32, so the expected floats need no conversion.
std::vector<float> grid_gains(size_t count, std::mt19937_64 &rng) {
    std::vector<float> v(count);
    for (float &x : v) x = static_cast<float>(32 + rng() % 64) / 64.0f;
    return v;
}

void add_linear(const std::string &name, int64_t k, int64_t n, const tl::ModelConfig &config, const ModelSpec &spec,
                std::mt19937_64 &rng, std::vector<OwnedTensor> *out) {
    if (spec.dense_linears) {
        out->push_back(float_tensor(name + ".weight", spec.dense_dtype, {n, k}, uniform(size_t(n * k), -1, 1, rng)));
        return;
    }
    const int64_t groups = config.group_size == 0 ? 1 : k / config.group_size;
    if (spec.bits == 8) {
        OwnedTensor codes{name + ".qweight", tl::DType::I8, {n, k}, {}, {}};
        codes.bytes.resize(static_cast<size_t>(n * k));
        for (uint8_t &b : codes.bytes) b = static_cast<uint8_t>(static_cast<int8_t>(int(rng() % 255) - 127));
        out->push_back(std::move(codes));
        out->push_back(float_tensor(name + ".scales", tl::DType::F16, {n, groups},
                                    uniform(size_t(n * groups), 1e-4f, 0.01f, rng)));
        return;
    }
    out->push_back(random_bytes(name + ".qweight", {n, k / 2}, rng));
    out->push_back(
        float_tensor(name + ".scales", tl::DType::F16, {n, groups}, uniform(size_t(n * groups), 1e-3f, 0.1f, rng)));
    out->push_back(float_tensor(name + ".zeros", tl::DType::F16, {n, groups}, uniform(size_t(n * groups), -1, 1, rng)));
    if (spec.frac4) out->push_back(random_bytes(name + ".frac4", {n, k / 2}, rng));
    if (spec.sign_bit) out->push_back(random_bytes(name + ".sign_bit", {n, k / 8}, rng));
}

}  // namespace

tl::ModelConfig small_config(int32_t group_size) {
    tl::ModelConfig c;
    c.d_model = 24;
    c.n_heads = 2;
    c.head_dim = 8;
    c.ffn = 40;
    c.vocab = 50;
    c.pre = 2;
    c.loops = 3;
    c.max_seq = 32;
    c.group_size = group_size;
    c.bits = 4;
    c.rope_theta = 10000.0f;
    c.norm_eps = 1e-5f;
    return c;
}

std::vector<OwnedTensor> make_tensors(const tl::ModelConfig &c, const ModelSpec &spec, std::mt19937_64 &rng) {
    const int64_t d = c.d_model, a = int64_t{c.n_heads} * c.head_dim, f = c.ffn, v = c.vocab;
    std::vector<OwnedTensor> out;
    out.push_back(float_tensor("embed.weight", spec.embed_dtype, {v, d}, uniform(size_t(v * d), -2, 2, rng)));
    for (int i = -1; i < c.pre; ++i) {
        const std::string p = i < 0 ? "loop." : "pre." + std::to_string(i) + ".";
        out.push_back(float_tensor(p + "attn_norm.weight", spec.norm_dtype, {d}, grid_gains(size_t(d), rng)));
        out.push_back(float_tensor(p + "mlp_norm.weight", spec.norm_dtype, {d}, grid_gains(size_t(d), rng)));
        add_linear(p + "attn_qkv", d, 3 * a, c, spec, rng, &out);
        add_linear(p + "attn_out", a, d, c, spec, rng, &out);
        add_linear(p + "mlp_gate", d, f, c, spec, rng, &out);
        add_linear(p + "mlp_up", d, f, c, spec, rng, &out);
        add_linear(p + "mlp_down", f, d, c, spec, rng, &out);
    }
    out.push_back(float_tensor("final_norm.weight", spec.norm_dtype, {d}, grid_gains(size_t(d), rng)));
    if (spec.head == HeadStore::Dense) {
        out.push_back(float_tensor("head.weight", spec.dense_dtype, {v, d}, uniform(size_t(v * d), -1, 1, rng)));
    } else if (spec.head == HeadStore::Quantized) {
        ModelSpec quantized = spec;
        quantized.dense_linears = false;
        add_linear("head", d, v, c, quantized, rng, &out);
    }
    return out;
}

std::map<std::string, std::string> model_metadata(const tl::ModelConfig &config) {
    return {{"format", "tinyloop"}, {"format_version", "1"}, {"config", tl::config_to_json(config)}};
}

std::vector<tl::TensorView> views_of(const std::vector<OwnedTensor> &tensors) {
    std::vector<tl::TensorView> views;
    for (const OwnedTensor &t : tensors) views.push_back({t.name, t.dtype, t.shape, t.bytes.data()});
    return views;
}

std::vector<uint8_t> make_valid_file(const tl::ModelConfig &config, const ModelSpec &spec, const std::string &name,
                                     std::mt19937_64 &rng) {
    const std::string path = temp_dir() + "/" + name;
    tl::write_safetensors(path, model_metadata(config), views_of(make_tensors(config, spec, rng)));
    return read_bytes(path);
}

std::string temp_dir() {
    // Created on first use, removed with everything in it when the test process exits.
    static const struct TempDir {
        std::string path;
        TempDir() {
            path = (std::filesystem::temp_directory_path() / "tl_format_XXXXXX").string();
            if (!mkdtemp(path.data())) ADD_FAILURE() << "mkdtemp failed";
        }
        ~TempDir() {
            std::error_code ignored;
            std::filesystem::remove_all(path, ignored);
        }
    } dir;
    return dir.path;
}

std::vector<uint8_t> read_bytes(const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    EXPECT_TRUE(in) << path;
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string &path, const std::vector<uint8_t> &bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char *>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    EXPECT_TRUE(out) << path;
}

RawFile parse_raw(const std::vector<uint8_t> &bytes) {
    RawFile raw;
    EXPECT_GE(bytes.size(), 8u);
    for (int i = 7; i >= 0; --i) raw.header_len = (raw.header_len << 8) | bytes[size_t(i)];
    EXPECT_LE(8 + raw.header_len, bytes.size());
    raw.header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + long(raw.header_len));
    raw.data.assign(bytes.begin() + 8 + long(raw.header_len), bytes.end());
    return raw;
}

std::vector<uint8_t> encode_file(const std::string &header_text, const std::vector<uint8_t> &data) {
    std::vector<uint8_t> out;
    out.reserve(8 + header_text.size() + data.size());
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(uint64_t{header_text.size()} >> (8 * i)));
    out.insert(out.end(), header_text.begin(), header_text.end());
    out.insert(out.end(), data.begin(), data.end());
    return out;
}

std::vector<uint8_t> encode_raw(const RawFile &raw) { return encode_file(raw.header.dump(), raw.data); }

std::map<std::string, OwnedTensor> tensors_of(const RawFile &raw) {
    static const std::map<std::string, tl::DType> dtypes = {{"F16", tl::DType::F16},
                                                            {"F32", tl::DType::F32},
                                                            {"BF16", tl::DType::BF16},
                                                            {"U8", tl::DType::U8},
                                                            {"I32", tl::DType::I32},
                                                            {"I8", tl::DType::I8}};
    std::map<std::string, OwnedTensor> out;
    for (const auto &kv : raw.header.items()) {
        if (kv.key() == "__metadata__") continue;
        OwnedTensor t;
        t.name = kv.key();
        t.dtype = dtypes.at(kv.value()["dtype"].get<std::string>());
        t.shape = kv.value()["shape"].get<std::vector<int64_t>>();
        const auto offsets = kv.value()["data_offsets"].get<std::vector<uint64_t>>();
        EXPECT_LE(offsets[1], raw.data.size()) << t.name;
        t.bytes.assign(raw.data.begin() + long(offsets[0]), raw.data.begin() + long(offsets[1]));
        out[t.name] = std::move(t);
    }
    return out;
}

}  // namespace tlt
