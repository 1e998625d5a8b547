// GPTQ on single layers: the Hessian, agreement with min-max where there is nothing to compensate, agreement
// with an unblocked reference, and a lower output error than min-max on real activations.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <ostream>
#include <string>
#include <vector>

#include <Eigen/Core>
#include <Eigen/LU>

#include "../common/tl_error.hpp"
#include "util/error.hpp"
#include "format/format.hpp"
#include "gptq/gptq.hpp"
#include "gptq_test_util.hpp"
#include "quant/quant.hpp"
#include "import/synthetic.hpp"
#include "util/thread_pool.hpp"

namespace {

using gptq_test::code_of;
using tl::QuantMethod;

std::vector<float> random_weights(std::mt19937_64 &rng, int32_t k, int32_t n) {
    std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(static_cast<float>(k)));
    std::vector<float> w(static_cast<size_t>(k) * n);
    for (float &v : w) v = normal(rng);
    return w;
}

// Activations with a strong low-rank structure: rank-r factors plus a little isotropic noise, and unequal
// column scales, like a transformer's hidden states.
std::vector<float> low_rank_inputs(std::mt19937_64 &rng, int32_t rows, int32_t k, int32_t rank) {
    std::normal_distribution<double> normal(0.0, 1.0);
    std::vector<double> basis(static_cast<size_t>(rank) * k), scale(k);
    for (double &b : basis) b = normal(rng);
    for (double &s : scale) s = std::exp(0.5 * normal(rng));
    std::vector<float> x(static_cast<size_t>(rows) * k);
    std::vector<double> coef(rank);
    for (int32_t t = 0; t < rows; ++t) {
        for (double &c : coef) c = normal(rng);
        for (int32_t kk = 0; kk < k; ++kk) {
            double v = 0.05 * normal(rng);
            for (int32_t r = 0; r < rank; ++r) v += coef[r] * basis[static_cast<size_t>(r) * k + kk];
            x[static_cast<size_t>(t) * k + kk] = static_cast<float>(v * scale[kk]);
        }
    }
    return x;
}

std::vector<double> hessian_of(const std::vector<float> &x, int32_t k) {
    tl::Hessian h(k);
    h.add(x.data(), static_cast<int32_t>(x.size() / k));
    return h.matrix();
}

void expect_same_storage(const tl::QuantizedMatrix &a, const tl::QuantizedMatrix &b) {
    ASSERT_EQ(a.group_size, b.group_size);
    EXPECT_EQ(a.codes, b.codes);
    EXPECT_EQ(a.scales, b.scales);
    EXPECT_EQ(a.zeros, b.zeros);
}

TEST(Hessian, IsTwiceXtXInDouble) {
    std::mt19937_64 rng(gptq_test::fresh_seed());
    const int32_t k = 150;  // several column strips
    std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
    std::vector<float> x(600 * k);  // more rows than one accumulation chunk, added in two calls
    for (float &v : x) v = uniform(rng);
    tl::ThreadPool pool(3);
    for (tl::ThreadPool *threads : {static_cast<tl::ThreadPool *>(nullptr), &pool}) {
        SCOPED_TRACE(threads ? "3 threads" : "calling thread");
        tl::Hessian h(k);
        h.add(x.data(), 250, threads);
        h.add(x.data() + 250 * k, 350, threads);
        EXPECT_EQ(h.rows(), 600u);
        const std::vector<double> got = h.matrix();
        for (int32_t i = 0; i < k; ++i)
            for (int32_t j = 0; j < k; ++j) {
                double want = 0.0;
                for (int32_t t = 0; t < 600; ++t) want += 2.0 * x[t * k + i] * x[t * k + j];
                EXPECT_NEAR(got[i * k + j], want, 1e-9 * std::abs(want) + 1e-9) << i << "," << j;
            }
    }
}

struct Shape {
    QuantMethod method;
    int32_t group_size;  // 0 = per row
};

std::string shape_name(const Shape &s) {
    return std::string(s.method == QuantMethod::Asymmetric ? "asym" : "sym") + "_" +
           (s.group_size == 0 ? "per_row" : "group" + std::to_string(s.group_size));
}

void PrintTo(const Shape &s, std::ostream *os) { *os << shape_name(s); }

// With H = I (no correlation between inputs) every column's error has nowhere to go: GPTQ is min-max rounding.
// A diagonal H with act-order permutes the columns too, which must leave the same result.
TEST(Gptq, WithoutCorrelationsIsMinMax) {
    const uint64_t seed = gptq_test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const int32_t k = 256, n = 48;
    for (const Shape &s : {Shape{QuantMethod::Asymmetric, 64}, Shape{QuantMethod::Asymmetric, 0},
                           Shape{QuantMethod::Symmetric, 64}, Shape{QuantMethod::Symmetric, 0}}) {
        SCOPED_TRACE(shape_name(s));
        const std::vector<float> w = random_weights(rng, k, n);
        const tl::QuantizedMatrix minmax = tl::quantize_minmax(w.data(), k, n, s.group_size, s.method);
        std::vector<double> identity(static_cast<size_t>(k) * k, 0.0), diagonal = identity;
        std::uniform_real_distribution<double> uniform(0.1, 10.0);
        for (int32_t i = 0; i < k; ++i) {
            identity[i * k + i] = 1.0;
            diagonal[i * k + i] = uniform(rng);
        }
        tl::GptqOptions options;
        options.method = s.method;
        options.group_size = s.group_size;
        options.damp = 0.0;
        expect_same_storage(tl::quantize_gptq(w.data(), k, n, identity.data(), options), minmax);
        options.act_order = true;
        expect_same_storage(tl::quantize_gptq(w.data(), k, n, diagonal.data(), options), minmax);
    }
}

// GPTQ in its unblocked form, written from the paper's equations: after quantizing column c, the columns not
// yet quantized move by -err · Hinv[c, j] / Hinv[c, c] and c is eliminated from Hinv (Hinv -= Hinv[:, c]
// Hinv[c, :] / Hinv[c, c]). No Cholesky factor, no blocks. Group parameters follow the documented rule.
tl::QuantizedMatrix reference_gptq(const std::vector<float> &w, int32_t k, int32_t n, std::vector<double> h,
                                   const tl::GptqOptions &o) {
    const int32_t gs = o.group_size == 0 ? k : o.group_size, groups = k / gs;
    Eigen::MatrixXd H = Eigen::Map<Eigen::MatrixXd>(h.data(), k, k);
    for (int32_t i = 0; i < k; ++i)
        if (H(i, i) == 0.0) H(i, i) = 1.0;
    H.diagonal().array() += o.damp * H.diagonal().mean();
    std::vector<int32_t> order(k);
    std::iota(order.begin(), order.end(), 0);
    if (o.act_order) {
        std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return h[a * k + a] > h[b * k + b]; });
    }
    Eigen::MatrixXd P = Eigen::MatrixXd::Zero(k, k);
    for (int32_t c = 0; c < k; ++c) P(order[c], c) = 1.0;
    Eigen::MatrixXd Hinv = (P.transpose() * H * P).inverse();
    Eigen::MatrixXd W(n, k);
    for (int32_t r = 0; r < n; ++r)
        for (int32_t c = 0; c < k; ++c) W(r, c) = w[static_cast<size_t>(r) * k + order[c]];

    tl::QuantizedMatrix m = tl::quantize_minmax(w.data(), k, n, o.group_size, o.method);
    std::fill(m.codes.begin(), m.codes.end(), 0);
    for (int32_t c = 0; c < k; ++c) {
        const int32_t kk = order[c];
        if (!o.act_order && c % gs == 0) {
            std::vector<float> current(static_cast<size_t>(n) * gs);
            for (int32_t r = 0; r < n; ++r)
                for (int32_t j = 0; j < gs; ++j) current[r * gs + j] = static_cast<float>(W(r, c + j));
            const tl::QuantizedMatrix g = tl::quantize_minmax(current.data(), gs, n, gs, o.method);
            for (int32_t r = 0; r < n; ++r) {
                m.scales[r * groups + c / gs] = g.scales[r];
                m.zeros[r * groups + c / gs] = g.zeros[r];
            }
        }
        const double d = Hinv(c, c);
        for (int32_t r = 0; r < n; ++r) {
            const float s = tl::half_to_float(m.scales[r * groups + kk / gs]);
            const float z = tl::half_to_float(m.zeros[r * groups + kk / gs]);
            const double q = s == 0.0f ? 0.0 : std::clamp(std::nearbyint((W(r, c) - z) / s), 0.0, 15.0);
            m.codes[r * (k / 2) + kk / 2] |= static_cast<uint8_t>(static_cast<int>(q) << ((kk & 1) * 4));
            const double err = W(r, c) - (static_cast<float>(q) * s + z);
            for (int32_t j = c + 1; j < k; ++j) W(r, j) -= err * Hinv(c, j) / d;
        }
        Hinv -= Hinv.col(c) * Hinv.row(c) / d;
    }
    return m;
}

// Blocks smaller than, equal to and larger than the groups, several blocks per row, act-order, symmetric.
TEST(Gptq, MatchesTheUnblockedReference) {
    const uint64_t seed = gptq_test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const int32_t k = 192, n = 40;
    struct Case {
        int32_t group_size, block_size;
        QuantMethod method;
        bool act_order;
    };
    for (const Case &c : {Case{16, 40, QuantMethod::Asymmetric, false}, Case{64, 16, QuantMethod::Asymmetric, false},
                          Case{0, 32, QuantMethod::Asymmetric, false}, Case{48, 48, QuantMethod::Symmetric, false},
                          Case{0, 64, QuantMethod::Symmetric, true}, Case{32, 24, QuantMethod::Asymmetric, true}}) {
        SCOPED_TRACE("group " + std::to_string(c.group_size) + " block " + std::to_string(c.block_size) +
                     (c.act_order ? " act-order" : ""));
        const std::vector<float> w = random_weights(rng, k, n);
        const std::vector<float> x = low_rank_inputs(rng, 300, k, 24);
        tl::GptqOptions options;
        options.method = c.method;
        options.group_size = c.group_size;
        options.block_size = c.block_size;
        options.act_order = c.act_order;
        const std::vector<double> h = hessian_of(x, k);
        const tl::QuantizedMatrix got = tl::quantize_gptq(w.data(), k, n, h.data(), options);
        const tl::QuantizedMatrix want = reference_gptq(w, k, n, h, options);
        // Both work in double along different routes; a code may only differ where a value lies within
        // rounding noise of a rounding boundary, which random data almost never hits.
        size_t codes_differ = 0, groups_differ = 0;
        for (int32_t r = 0; r < n; ++r)
            for (int32_t kk = 0; kk < k; ++kk) codes_differ += code_of(got, r, kk) != code_of(want, r, kk);
        for (size_t g = 0; g < want.scales.size(); ++g) {
            groups_differ += got.scales[g] != want.scales[g] || got.zeros[g] != want.zeros[g];
        }
        EXPECT_LE(codes_differ, static_cast<size_t>(k) * n / 1000) << codes_differ << " codes differ";
        EXPECT_LE(groups_differ, want.scales.size() / 100) << groups_differ << " groups differ";
    }
}

// The weight of an input that never fired gets no error from the others: it is its own value rounded with
// its group's s and z. Zero damping still works, since such columns are handled before the factorization.
TEST(Gptq, DeadInputsAreRoundedPlainly) {
    const uint64_t seed = gptq_test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const int32_t k = 128, n = 16;
    std::vector<float> x = low_rank_inputs(rng, 400, k, 128);
    const std::vector<int32_t> dead = {0, 5, 64, 127};
    for (size_t t = 0; t < 400; ++t)
        for (int32_t kk : dead) x[t * k + kk] = 0.0f;
    const std::vector<float> w = random_weights(rng, k, n);
    tl::GptqOptions options;
    options.group_size = 32;
    options.damp = 0.0;
    const tl::QuantizedMatrix m = tl::quantize_gptq(w.data(), k, n, hessian_of(x, k).data(), options);
    for (int32_t r = 0; r < n; ++r)
        for (int32_t kk : dead) {
            const size_t g = static_cast<size_t>(r) * (k / 32) + kk / 32;
            const double s = tl::half_to_float(m.scales[g]), z = tl::half_to_float(m.zeros[g]);
            EXPECT_EQ(code_of(m, r, kk), std::clamp(std::nearbyint((w[r * k + kk] - z) / s), 0.0, 15.0))
                << "row " << r << " input " << kk;
        }
}

TEST(Gptq, RejectsBadArguments) {
    const int32_t k = 4, n = 2;
    const std::vector<float> w(k * n, 0.5f);
    // Not positive definite: eigenvalues 3 and -1 on the first two inputs.
    const std::vector<double> indefinite = {1, 2, 0, 0, 2, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1};
    tl::GptqOptions options;
    options.damp = 0.0;
    // Each refusal names the layer.
    auto quantize = [&] { tl::quantize_gptq(w.data(), k, n, indefinite.data(), options, "layer.x"); };
    EXPECT_TRUE(tlt::throws(TL_ERR_INVALID_ARGUMENT, {"layer.x"}, quantize));
    options.group_size = 3;
    EXPECT_TRUE(tlt::throws(TL_ERR_INVALID_ARGUMENT, {"layer.x"}, quantize));
    options.group_size = 0;
    options.damp = -1.0;
    EXPECT_TRUE(tlt::throws(TL_ERR_INVALID_ARGUMENT, {"layer.x"}, quantize));
}

// INT8 (symmetric, maxq 127): with a diagonal Hessian GPTQ is the INT8 min-max rule, codes in [-127, 127]; on
// structured activations it beats min-max as at 4 bits.
TEST(Gptq, Int8IsMinMaxWithoutCorrelationsAndBetterWithThem) {
    const uint64_t seed = gptq_test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const int32_t k = 256, n = 48;
    for (int32_t group_size : {64, 0}) {
        SCOPED_TRACE("group " + std::to_string(group_size));
        const std::vector<float> w = random_weights(rng, k, n);
        const tl::QuantizedMatrix minmax =
            tl::quantize_minmax(w.data(), k, n, group_size, QuantMethod::Symmetric, 8);
        ASSERT_EQ(minmax.bits, 8);
        ASSERT_TRUE(minmax.zeros.empty());
        std::vector<double> identity(static_cast<size_t>(k) * k, 0.0);
        for (int32_t i = 0; i < k; ++i) identity[i * k + i] = 1.0;
        tl::GptqOptions options;
        options.method = QuantMethod::Symmetric;
        options.bits = 8;
        options.group_size = group_size;
        options.damp = 0.0;
        const tl::QuantizedMatrix plain = tl::quantize_gptq(w.data(), k, n, identity.data(), options);
        EXPECT_EQ(plain.bits, 8);
        expect_same_storage(plain, minmax);

        const std::vector<float> x = low_rank_inputs(rng, 1024, k, 32);
        options.damp = 0.01;
        const tl::QuantizedMatrix q = tl::quantize_gptq(w.data(), k, n, hessian_of(x, k).data(), options);
        for (uint8_t c : q.codes) ASSERT_NE(c, 0x80) << "code -128";
        const double gptq = gptq_test::output_error(x, w.data(), q), mm = gptq_test::output_error(x, w.data(), minmax);
        EXPECT_LT(gptq, 0.5 * mm) << "GPTQ " << gptq << ", min-max " << mm;
        // INT8 has 16 times the levels of INT4: its min-max error is far below INT4's.
        const double int4 = gptq_test::output_error(
            x, w.data(), tl::quantize_minmax(w.data(), k, n, group_size, QuantMethod::Symmetric));
        EXPECT_LT(mm, 0.1 * int4);
    }
    tl::GptqOptions asymmetric;
    asymmetric.bits = 8;
    const std::vector<float> w = random_weights(rng, k, n);
    std::vector<double> identity(static_cast<size_t>(k) * k, 0.0);
    for (int32_t i = 0; i < k; ++i) identity[i * k + i] = 1.0;
    try {
        tl::quantize_gptq(w.data(), k, n, identity.data(), asymmetric);
        ADD_FAILURE() << "asymmetric INT8 accepted";
    } catch (const tl::Error &e) {
        EXPECT_EQ(e.code(), TL_ERR_INVALID_ARGUMENT) << e.what();
    }
}

// The point of GPTQ: on activations with structure it reconstructs the layer's output better than min-max.
class LowerOutputError : public ::testing::TestWithParam<Shape> {};

TEST_P(LowerOutputError, OnLowRankActivations) {
    const uint64_t seed = gptq_test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const int32_t k = 256, n = 64;
    const std::vector<float> w = random_weights(rng, k, n);
    const std::vector<float> x = low_rank_inputs(rng, 1024, k, 32);
    tl::GptqOptions options;
    options.method = GetParam().method;
    options.group_size = GetParam().group_size;
    const double gptq = gptq_test::output_error(x, w.data(), tl::quantize_gptq(w.data(), k, n,
                                                                               hessian_of(x, k).data(), options));
    const double minmax = gptq_test::output_error(
        x, w.data(), tl::quantize_minmax(w.data(), k, n, options.group_size, options.method));
    RecordProperty("gptq_over_minmax", std::to_string(gptq / minmax));
    EXPECT_LT(gptq, 0.5 * minmax) << "GPTQ " << gptq << ", min-max " << minmax;
}

// Activations captured from a dense synthetic model reading English text: the looped block's attention input
// (RMS-normed hidden states, all loop iterations) and its MLP down projection's input.
TEST_P(LowerOutputError, OnActivationsOfAForwardPass) {
    const uint64_t seed = gptq_test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    tl::SyntheticOptions synth;
    synth.seed = seed;
    synth.quantized = false;
    const auto model = tl::make_synthetic_model(gptq_test::small_config(0), synth);
    const std::vector<int32_t> text = gptq_test::text_tokens("data/demo.txt");
    for (const char *name : {"loop.attn_qkv", "loop.mlp_down"}) {
        SCOPED_TRACE(name);
        const tl::Linear &lin = std::string(name) == "loop.attn_qkv" ? model->loop.attn_qkv : model->loop.mlp_down;
        const std::vector<float> x = gptq_test::captured_inputs(*model, text, name);
        const float *w = static_cast<const float *>(lin.dense);
        tl::GptqOptions options;
        options.method = GetParam().method;
        options.group_size = GetParam().group_size;
        const double gptq = gptq_test::output_error(
            x, w, tl::quantize_gptq(w, lin.k, lin.n, hessian_of(x, lin.k).data(), options, name));
        const double minmax =
            gptq_test::output_error(x, w, tl::quantize_minmax(w, lin.k, lin.n, options.group_size, options.method));
        RecordProperty(std::string(name) + "_gptq_over_minmax", std::to_string(gptq / minmax));
        EXPECT_LT(gptq, 0.8 * minmax) << "GPTQ " << gptq << ", min-max " << minmax;
    }
}

// Real activations: the shipped trained demo model (models/demo-int4.tinyloop) reading held-out English text. Its
// weights are INT4 already (GPTQ, asymmetric, group 128), so their dequantized values serve as the "FP" weights and
// are re-quantized to the other shapes; asymmetric group 128 is skipped, since min-max reproduces that grid exactly.
TEST_P(LowerOutputError, OnActivationsOfTheTrainedDemoModel) {
    if (GetParam().method == QuantMethod::Asymmetric && GetParam().group_size == 128) GTEST_SKIP();
    const auto model = tl::load_model(std::string(TL_SOURCE_DIR) + "/models/demo-int4.tinyloop", {});
    std::vector<int32_t> text = gptq_test::text_tokens("data/eval.txt");
    text.resize(512);
    for (const char *name : {"loop.attn_qkv", "loop.mlp_down"}) {
        SCOPED_TRACE(name);
        const tl::Linear &lin = std::string(name) == "loop.attn_qkv" ? model->loop.attn_qkv : model->loop.mlp_down;
        ASSERT_TRUE(lin.quantized);
        const std::vector<float> x = gptq_test::captured_inputs(*model, text, name);
        ASSERT_EQ(x.size(), static_cast<size_t>(512) * model->config.loops * lin.k);
        tl::QuantizedMatrix stored;
        stored.k = lin.k;
        stored.n = lin.n;
        stored.group_size = lin.group_size;
        const size_t kn = static_cast<size_t>(lin.k) * lin.n, groups = static_cast<size_t>(lin.n) * lin.n_groups();
        stored.codes.assign(lin.codes, lin.codes + kn / 2);
        stored.scales.assign(lin.scales, lin.scales + groups);
        stored.zeros.assign(lin.zeros, lin.zeros + groups);
        std::vector<float> w(kn);
        for (int32_t nn = 0; nn < lin.n; ++nn)
            for (int32_t kk = 0; kk < lin.k; ++kk)
                w[static_cast<size_t>(nn) * lin.k + kk] = static_cast<float>(gptq_test::value_of(stored, nn, kk));
        tl::GptqOptions options;
        options.method = GetParam().method;
        options.group_size = GetParam().group_size;
        const double gptq = gptq_test::output_error(
            x, w.data(), tl::quantize_gptq(w.data(), lin.k, lin.n, hessian_of(x, lin.k).data(), options, name));
        const double minmax = gptq_test::output_error(
            x, w.data(), tl::quantize_minmax(w.data(), lin.k, lin.n, options.group_size, options.method));
        RecordProperty(std::string(name) + "_gptq_over_minmax", std::to_string(gptq / minmax));
        std::printf("%s %s: GPTQ / min-max output error = %.3f\n", name, shape_name(GetParam()).c_str(), gptq / minmax);
        EXPECT_LT(gptq, 0.8 * minmax) << "GPTQ " << gptq << ", min-max " << minmax;
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, LowerOutputError,
                         ::testing::Values(Shape{QuantMethod::Asymmetric, 128}, Shape{QuantMethod::Asymmetric, 0},
                                           Shape{QuantMethod::Symmetric, 128}, Shape{QuantMethod::Symmetric, 0}),
                         [](const auto &info) { return shape_name(info.param); });

}  // namespace
