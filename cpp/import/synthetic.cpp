#include "import/synthetic.hpp"

#include <cmath>
#include <string>
#include <vector>

#include "quant/cross_iter.hpp"
#include "util/error.hpp"
#include "format/format.hpp"
#include "util/half.hpp"

namespace tl {

namespace {

// splitmix64 for the bits and an Irwin-Hall sum for the normal: integer arithmetic plus one exactly rounded
// conversion and multiply, so the same seed gives the same floats under any compiler, libm and CPU
// (std:: distributions and libm's log/cos do not promise that). Tails end at +-6 sigma, which a synthetic
// weight never misses.
class Rng {
public:
    explicit Rng(uint64_t seed) : state_(seed) {}

    uint64_t next() {
        uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }

    // Approximately N(0, 1): the sum of 12 uniform 32-bit integers, centred and scaled (variance 1).
    double normal() {
        uint64_t sum = 0;
        for (int i = 0; i < 6; ++i) {
            const uint64_t r = next();
            sum += (r >> 32) + (r & 0xFFFFFFFFull);
        }
        return static_cast<double>(sum) * 0x1p-32 - 6.0;
    }

private:
    uint64_t state_;
};

constexpr double kGainNoise = 0.05;  // norm gains are 1 + N(0, kGainNoise)
constexpr double kBiasStd = 0.1;     // biases are N(0, kBiasStd)

std::vector<float> normal_values(Rng &rng, size_t count, double stddev, double mean = 0.0) {
    std::vector<float> v(count);
    // std::fma rounds once everywhere; `mean + stddev * n` may or may not be contracted, depending on the target.
    for (float &x : v) x = static_cast<float>(std::fma(stddev, rng.normal(), mean));
    return v;
}

// A [n][k] weight drawn from N(0, 1/sqrt(k)), quantized or kept dense as the options say.
Linear random_linear(Rng &rng, const std::string &name, int32_t k, int32_t n, const ModelConfig &config,
                     const SyntheticOptions &options, bool quantized) {
    const std::vector<float> w = normal_values(rng, static_cast<size_t>(k) * n, 1.0 / std::sqrt(k));
    Linear lin;
    if (!quantized) {
        lin = make_dense_linear(name, w.data(), k, n);
    } else {
        // INT8 is symmetric whatever the options' method (the only 8-bit storage the format has).
        const QuantMethod method = config.bits == 8 ? QuantMethod::Symmetric : options.method;
        QuantizedMatrix m = quantize_minmax(w.data(), k, n, config.group_size, method, config.bits);
        if (options.frac4 || options.sign_bit) add_rounding_channels(w.data(), m, options.frac4, options.sign_bit);
        lin = make_quantized_linear(name, std::move(m));
    }
    if (options.biases) lin.bias = std::make_shared<const std::vector<float>>(normal_values(rng, n, kBiasStd));
    return lin;
}

Block random_block(Rng &rng, const std::string &prefix, const ModelConfig &c, const SyntheticOptions &options) {
    Block b;
    b.attn_norm = normal_values(rng, c.d_model, kGainNoise, 1.0);
    b.mlp_norm = normal_values(rng, c.d_model, kGainNoise, 1.0);
    const int32_t shapes[5][2] = {{c.d_model, c.qkv_dim()}, {c.attn_dim(), c.d_model},  // [K, N]
                                  {c.d_model, c.ffn},           {c.d_model, c.ffn},
                                  {c.ffn, c.d_model}};
    for (int i = 0; i < 5; ++i) {
        *b.linear(i) = random_linear(rng, prefix + "." + Block::kLinearNames[i], shapes[i][0], shapes[i][1], c,
                                     options, options.quantized);
    }
    return b;
}

}  // namespace

std::unique_ptr<Model> make_synthetic_model(const ModelConfig &config, const SyntheticOptions &options) {
    try {
        validate_config(config);
    } catch (const Error &e) {  // the same checks as a file's config, but here the config is an argument
        fail(TL_ERR_INVALID_ARGUMENT, e.what());
    }
    // Draw order is fixed (embedding, pre blocks, loop block, final norm, then a separate head) so a model's
    // dense and quantized variants share the same underlying values.
    Rng rng(options.seed);
    auto model = std::make_unique<Model>();
    model->config = config;

    const size_t embed_count = static_cast<size_t>(config.vocab) * config.d_model;
    auto embed = std::make_shared<std::vector<uint16_t>>(embed_count);
    // N(0, 1/sqrt(d_model)), like a trained tied embedding: the tied head's logits then have unit spread, so a
    // random model's perplexity stays near the vocabulary size instead of overflowing.
    const double embed_std = 1.0 / std::sqrt(static_cast<double>(config.d_model));
    for (uint16_t &e : *embed) e = float_to_half(static_cast<float>(rng.normal() * embed_std));
    model->embed_dtype = DType::F16;
    model->embed = embed->data();

    for (int32_t i = 0; i < config.pre; ++i) {
        model->pre.push_back(random_block(rng, "pre." + std::to_string(i), config, options));
    }
    model->loop = random_block(rng, "loop", config, options);
    model->final_norm = normal_values(rng, config.d_model, kGainNoise, 1.0);

    if (options.quantize_head) {
        model->head_kind = HeadKind::Quantized;
        model->head = random_linear(rng, "head", config.d_model, config.vocab, config, options, true);
    } else {
        model->head_kind = HeadKind::Tied;
        model->head.name = "head";
        model->head.k = config.d_model;
        model->head.n = config.vocab;
        model->head.dense_dtype = DType::F16;
        model->head.dense = embed->data();
        model->head.keepalive = embed;
    }
    model->keepalive = std::move(embed);
    model->format_version = required_format_version(*model);
    return model;
}

}  // namespace tl
