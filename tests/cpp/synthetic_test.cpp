// Synthetic models: determinism, the documented distributions, quantization per config, rounding channels.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "../common/tl_error.hpp"
#include "util/error.hpp"
#include "util/half.hpp"
#include "quant/quant.hpp"
#include "reference.hpp"
#include "import/synthetic.hpp"

namespace {

tl::ModelConfig config_for_test() {
    tl::ModelConfig c;
    c.d_model = 128;
    c.n_heads = 4;
    c.head_dim = 32;
    c.ffn = 256;
    c.vocab = 512;
    c.pre = 2;
    c.loops = 3;
    c.max_seq = 64;
    c.group_size = 64;
    return c;
}

// Every byte a Linear's storage holds, for comparing two models.
std::vector<uint8_t> linear_bytes(const tl::Linear &w) {
    std::vector<uint8_t> out;
    auto append = [&](const void *p, size_t n) {
        if (p) out.insert(out.end(), static_cast<const uint8_t *>(p), static_cast<const uint8_t *>(p) + n);
    };
    const size_t kn = static_cast<size_t>(w.k) * w.n, groups = static_cast<size_t>(w.n_groups()) * w.n;
    if (w.quantized) {
        append(w.codes, kn / 2);
        append(w.scales, groups * 2);
        append(w.zeros, groups * 2);
        append(w.frac4, kn / 2);
        append(w.sign_bit, kn / 8);
    } else {
        append(w.dense, kn * tl::dtype_size(w.dense_dtype));
    }
    return out;
}

std::vector<uint8_t> model_bytes(const tl::Model &m) {
    const size_t embed = static_cast<size_t>(m.config.vocab) * m.config.d_model * tl::dtype_size(m.embed_dtype);
    std::vector<uint8_t> out(static_cast<const uint8_t *>(m.embed), static_cast<const uint8_t *>(m.embed) + embed);
    auto append_floats = [&](const std::vector<float> &v) {
        const auto *p = reinterpret_cast<const uint8_t *>(v.data());
        out.insert(out.end(), p, p + v.size() * sizeof(float));
    };
    std::vector<const tl::Block *> blocks;
    for (const tl::Block &b : m.pre) blocks.push_back(&b);
    blocks.push_back(&m.loop);
    for (const tl::Block *b : blocks) {
        append_floats(b->attn_norm);
        append_floats(b->mlp_norm);
    }
    append_floats(m.final_norm);
    for (const tl::Linear *w : m.linears()) {
        const std::vector<uint8_t> bytes = linear_bytes(*w);
        out.insert(out.end(), bytes.begin(), bytes.end());
    }
    return out;
}

void expect_moments(const std::vector<double> &v, double mean, double stddev, const std::string &what) {
    double sum = 0.0, sum_sq = 0.0;
    for (double x : v) sum += x;
    const double m = sum / v.size();
    for (double x : v) sum_sq += (x - m) * (x - m);
    const double sd = std::sqrt(sum_sq / v.size());
    EXPECT_NEAR(m, mean, 5 * stddev / std::sqrt(static_cast<double>(v.size()))) << what;
    EXPECT_NEAR(sd, stddev, 0.03 * stddev) << what;
}

}  // namespace

TEST(Synthetic, SameSeedSameBytes) {
    const uint64_t seed = ref::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    tl::SyntheticOptions options;
    options.seed = seed;
    options.quantize_head = true;
    options.frac4 = true;
    options.sign_bit = true;
    const std::vector<uint8_t> a = model_bytes(*tl::make_synthetic_model(config_for_test(), options));
    const std::vector<uint8_t> b = model_bytes(*tl::make_synthetic_model(config_for_test(), options));
    EXPECT_EQ(a, b);
    options.seed = seed + 1;
    EXPECT_NE(model_bytes(*tl::make_synthetic_model(config_for_test(), options)), a);
}

TEST(Synthetic, DenseValuesFollowTheDocumentedDistributions) {
    tl::SyntheticOptions options;
    options.seed = ref::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(options.seed));
    options.quantized = false;
    const auto model = tl::make_synthetic_model(config_for_test(), options);
    const tl::ModelConfig &c = model->config;
    for (const tl::Linear *w : model->linears()) {
        ASSERT_FALSE(w->quantized) << w->name;
        ASSERT_EQ(w->dense_dtype, tl::DType::F32) << w->name;
        const float *p = static_cast<const float *>(w->dense);
        const std::vector<double> values(p, p + static_cast<size_t>(w->k) * w->n);
        expect_moments(values, 0.0, 1.0 / std::sqrt(w->k), w->name);
    }
    std::vector<double> embed(static_cast<size_t>(c.vocab) * c.d_model);
    for (size_t i = 0; i < embed.size(); ++i) embed[i] = ref::dense_value(model->embed_dtype, model->embed, i);
    expect_moments(embed, 0.0, 1.0 / std::sqrt(c.d_model), "embedding");
    std::vector<double> gains;
    for (const tl::Block &b : model->pre) gains.insert(gains.end(), b.attn_norm.begin(), b.attn_norm.end());
    gains.insert(gains.end(), model->final_norm.begin(), model->final_norm.end());
    double max_dev = 0.0;
    for (double g : gains) max_dev = std::max(max_dev, std::fabs(g - 1.0));
    EXPECT_LT(max_dev, 0.5);  // "1 + small noise"
    EXPECT_GT(max_dev, 0.0);
    // Tied head: the embedding itself, as a dense Linear.
    EXPECT_EQ(model->head_kind, tl::HeadKind::Tied);
    EXPECT_EQ(model->head.dense, model->embed);
    EXPECT_EQ(model->head.k, c.d_model);
    EXPECT_EQ(model->head.n, c.vocab);
}

TEST(Synthetic, QuantizedModelIsTheDenseOneQuantizedWithItsChannels) {
    const uint64_t seed = ref::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    for (tl::QuantMethod method : {tl::QuantMethod::Asymmetric, tl::QuantMethod::Symmetric}) {
        tl::SyntheticOptions options;
        options.seed = seed;
        options.method = method;
        options.quantized = false;
        const auto dense = tl::make_synthetic_model(config_for_test(), options);
        options.quantized = true;
        options.frac4 = true;
        options.sign_bit = true;
        const auto quant = tl::make_synthetic_model(config_for_test(), options);
        const std::vector<const tl::Linear *> d = dense->linears(), q = quant->linears();
        ASSERT_EQ(d.size(), q.size());
        for (size_t i = 0; i < d.size(); ++i) {
            SCOPED_TRACE(q[i]->name);
            ASSERT_TRUE(q[i]->quantized);
            ASSERT_EQ(q[i]->group_size, config_for_test().group_size);
            const float *w = static_cast<const float *>(d[i]->dense);
            const tl::QuantizedMatrix expected = tl::quantize_minmax(w, d[i]->k, d[i]->n, 64, method);
            ASSERT_EQ(std::memcmp(q[i]->codes, expected.codes.data(), expected.codes.size()), 0);
            ASSERT_EQ(std::memcmp(q[i]->scales, expected.scales.data(), expected.scales.size() * 2), 0);
            ASSERT_NE(q[i]->frac4, nullptr);
            ASSERT_NE(q[i]->sign_bit, nullptr);
            // The channels refine the code: q - 1/2 + frac4/16 is the exact (w - z)/s cut to 1/16 (except where
            // the bucket is clipped at 0 or 15), and sign_bit says whether it lies below q.
            for (int32_t nn = 0; nn < q[i]->n; ++nn)
                for (int32_t kk = 0; kk < q[i]->k; ++kk) {
                    const size_t g = static_cast<size_t>(nn) * q[i]->n_groups() + kk / q[i]->group_size;
                    const double s = tl::half_to_float(q[i]->scales[g]), z = tl::half_to_float(q[i]->zeros[g]);
                    const double exact = (w[static_cast<size_t>(nn) * q[i]->k + kk] - z) / s;
                    const size_t at = static_cast<size_t>(nn) * q[i]->k + kk;
                    const int frac = (q[i]->frac4[at / 2] >> ((kk & 1) * 4)) & 0xF;
                    const bool negative = (q[i]->sign_bit[at / 8] >> (kk % 8)) & 1;
                    const int code = tl::code_at(*q[i], kk, nn);
                    const double floor16 = code - 0.5 + frac / 16.0;
                    if (frac > 0) {
                        ASSERT_GE(exact, floor16 - 1e-9) << "n " << nn << " k " << kk;
                    }
                    if (frac < 15) {
                        ASSERT_LT(exact, floor16 + 1.0 / 16 + 1e-9) << "n " << nn << " k " << kk;
                    }
                    ASSERT_EQ(negative, exact < code) << "n " << nn << " k " << kk;
                }
        }
    }
}

TEST(Synthetic, HeadIsQuantizedWhenAsked) {
    tl::SyntheticOptions options;
    options.quantize_head = true;
    const auto model = tl::make_synthetic_model(config_for_test(), options);
    EXPECT_EQ(model->head_kind, tl::HeadKind::Quantized);
    EXPECT_TRUE(model->head.quantized);
    EXPECT_EQ(model->head.k, config_for_test().d_model);
    EXPECT_EQ(model->head.n, config_for_test().vocab);
    EXPECT_EQ(model->linears().size(), 5u * 3 + 1);
}

TEST(Synthetic, InvalidConfigIsAnInvalidArgument) {
    tl::ModelConfig c = config_for_test();
    c.group_size = 48;  // does not divide d_model
    EXPECT_TRUE(tlt::throws(TL_ERR_INVALID_ARGUMENT, {}, [&] { tl::make_synthetic_model(c, {}); }));
}
