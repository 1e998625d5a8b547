// The quantizer pipeline: calibration capture, whole-model quantization, the file round trip, and the CLI's
// quantize command end to end.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../common/tl_error.hpp"
#include "cpu/cpu_forward.hpp"
#include "util/error.hpp"
#include "format/format.hpp"
#include "gptq/gptq.hpp"
#include "gptq_test_util.hpp"
#include "import/synthetic.hpp"

namespace {

std::unique_ptr<tl::Model> dense_model(uint64_t seed, int32_t group_size) {
    tl::SyntheticOptions options;
    options.seed = seed;
    options.quantized = false;
    return tl::make_synthetic_model(gptq_test::small_config(group_size), options);
}

std::vector<int32_t> demo_text(size_t count) {
    std::vector<int32_t> t = gptq_test::text_tokens("data/demo.txt");
    t.resize(std::min(t.size(), count));
    return t;
}

void expect_same_linear(const tl::Linear &a, const tl::Linear &b) {
    SCOPED_TRACE(a.name);
    ASSERT_TRUE(a.quantized && b.quantized);
    ASSERT_EQ(a.group_size, b.group_size);
    ASSERT_EQ(a.bits, b.bits);
    const size_t kn = static_cast<size_t>(a.k) * a.n, groups = static_cast<size_t>(a.n) * a.n_groups();
    EXPECT_EQ(std::memcmp(a.codes, b.codes, a.code_row_bytes() * a.n), 0);
    EXPECT_EQ(std::memcmp(a.scales, b.scales, groups * 2), 0);
    ASSERT_EQ(a.zeros == nullptr, b.zeros == nullptr);  // INT8 has none
    if (a.zeros) {
        EXPECT_EQ(std::memcmp(a.zeros, b.zeros, groups * 2), 0);
    }
    ASSERT_EQ(a.frac4 == nullptr, b.frac4 == nullptr);
    ASSERT_EQ(a.sign_bit == nullptr, b.sign_bit == nullptr);
    if (a.frac4) {
        EXPECT_EQ(std::memcmp(a.frac4, b.frac4, kn / 2), 0);
    }
    if (a.sign_bit) {
        EXPECT_EQ(std::memcmp(a.sign_bit, b.sign_bit, kn / 8), 0);
    }
}

// Min-max through the pipeline is exactly what the synthetic generator makes from the same dense values.
TEST(Pipeline, MinMaxIsTheSyntheticQuantizedModel) {
    const uint64_t seed = gptq_test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    auto model = dense_model(seed, 0);
    tl::QuantizeOptions options;
    options.gptq.group_size = 64;
    options.gptq.method = tl::QuantMethod::Symmetric;
    options.frac4 = options.sign_bit = true;
    tl::quantize_model(*model, options, {});
    EXPECT_EQ(model->config.group_size, 64);

    tl::SyntheticOptions synth;
    synth.seed = seed;
    synth.method = tl::QuantMethod::Symmetric;
    synth.frac4 = synth.sign_bit = true;
    const auto want = tl::make_synthetic_model(gptq_test::small_config(64), synth);
    const auto got_linears = model->linears(), want_linears = want->linears();
    ASSERT_EQ(got_linears.size(), want_linears.size());
    for (size_t i = 0; i < got_linears.size(); ++i) expect_same_linear(*got_linears[i], *want_linears[i]);
}

// The calibration pass feeds each Hessian every row the linear sees: the looped block's once per iteration.
// The first linear's input is the RMS-normed embedding, recomputed here in double.
TEST(Pipeline, CalibrationSeesEveryRowOfEveryIteration) {
    const uint64_t seed = gptq_test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    const auto model = dense_model(seed, 128);
    const tl::ModelConfig &c = model->config;
    const std::vector<int32_t> text = demo_text(300);
    tl::QuantizeOptions options;
    options.calib_window = 128;  // windows of 128, 128 and 46 tokens (overlapping by one)
    const uint64_t rows = 128 + 128 + 46;
    const auto hessians = tl::collect_hessians(*model, {"pre.0.attn_qkv", "loop.mlp_down", "loop.attn_out"},
                                               text.data(), text.size(), options);
    ASSERT_EQ(hessians.size(), 3u);
    EXPECT_EQ(hessians.at("pre.0.attn_qkv").rows(), rows);
    EXPECT_EQ(hessians.at("loop.mlp_down").rows(), rows * c.loops);
    EXPECT_EQ(hessians.at("loop.mlp_down").k(), c.ffn);
    EXPECT_EQ(hessians.at("loop.attn_out").rows(), rows * c.loops);

    const int32_t D = c.d_model;
    std::vector<double> want(static_cast<size_t>(D) * D, 0.0), x(D);
    for (int32_t w = 0; w < 3; ++w)
        for (int32_t t = w * 127; t < std::min<int32_t>(w * 127 + 128, static_cast<int32_t>(text.size())); ++t) {
            double ms = 0.0;
            for (int32_t d = 0; d < D; ++d) {
                x[d] = tl::load_float(model->embed_dtype, model->embed, static_cast<size_t>(text[t]) * D + d);
                ms += x[d] * x[d] / D;
            }
            for (int32_t d = 0; d < D; ++d) x[d] = x[d] / std::sqrt(ms + c.norm_eps) * model->pre[0].attn_norm[d];
            for (int32_t i = 0; i < D; ++i)
                for (int32_t j = 0; j < D; ++j) want[static_cast<size_t>(i) * D + j] += 2.0 * x[i] * x[j];
        }
    const std::vector<double> got = hessians.at("pre.0.attn_qkv").matrix();
    double scale = 0.0;
    for (int32_t i = 0; i < D; ++i) scale = std::max(scale, want[static_cast<size_t>(i) * D + i]);
    for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5 * scale) << "entry " << i;
}

// `model` written to a temporary file and loaded back: the same linears, the same scores on `text`.
std::unique_ptr<tl::Model> saved_and_loaded(const tl::Model &model, const std::string &name,
                                            const std::vector<int32_t> &text) {
    const std::string path = ::testing::TempDir() + name + ".tinyloop";
    tl::save_model(path, model);
    auto loaded = tl::load_model(path, tl::LoadOptions{});
    std::remove(path.c_str());
    const auto a = model.linears(), b = loaded->linears();
    EXPECT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) expect_same_linear(*a[i], *b[i]);
    const tl::ScoreOptions score;
    EXPECT_EQ(tl::score_cpu(model, text.data(), text.size(), score).nll_sum,
              tl::score_cpu(*loaded, text.data(), text.size(), score).nll_sum);
    return loaded;
}

TEST(Pipeline, GptqModelRoundTripsThroughTheFile) {
    const uint64_t seed = gptq_test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    const std::vector<int32_t> text = demo_text(400);
    struct Case {
        int32_t group_size;
        bool act_order, frac4, sign_bit;
    };
    for (const Case &v : {Case{128, false, true, true}, Case{0, true, false, true}, Case{128, true, true, false}}) {
        SCOPED_TRACE("group " + std::to_string(v.group_size) + (v.act_order ? " act-order" : ""));
        auto model = dense_model(seed, 128);
        tl::QuantizeOptions options;
        options.quantizer = tl::Quantizer::Gptq;
        options.gptq.group_size = v.group_size;
        options.gptq.act_order = v.act_order;
        options.frac4 = v.frac4;
        options.sign_bit = v.sign_bit;
        tl::quantize_model(*model, options, text);
        const auto loaded = saved_and_loaded(*model, "gptq_roundtrip_" + std::to_string(seed), text);
        EXPECT_EQ(loaded->config.group_size, v.group_size);
    }
}

// Mean |NLL - dense NLL| per token of `model` on `text`.
double mean_abs_delta(const tl::Model &model, const std::vector<int32_t> &text, const std::vector<float> &dense) {
    std::vector<float> nll(text.size() - 1);
    tl::ScoreOptions score;
    score.token_nll = nll.data();
    tl::score_cpu(model, text.data(), text.size(), score);
    double sum = 0.0;
    for (size_t i = 0; i < nll.size(); ++i) sum += std::fabs(static_cast<double>(nll[i]) - dense[i]);
    return sum / static_cast<double>(nll.size());
}

// --bits 8: every block linear INT8 (min-max and GPTQ alike), config.bits 8, the file loads back the same, and both
// follow the dense model's per-token NLLs far more closely than INT4 min-max of the same weights does.
TEST(Pipeline, Int8ModelsRoundTripThroughTheFile) {
    const uint64_t seed = gptq_test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    const std::vector<int32_t> text = demo_text(400);
    std::vector<float> dense(text.size() - 1);
    tl::ScoreOptions score;
    score.token_nll = dense.data();
    tl::score_cpu(*dense_model(seed, 128), text.data(), text.size(), score);
    auto int4 = dense_model(seed, 128);
    tl::QuantizeOptions int4_options;
    int4_options.gptq.group_size = 64;
    tl::quantize_model(*int4, int4_options, text);
    const double int4_delta = mean_abs_delta(*int4, text, dense);
    for (const tl::Quantizer quantizer : {tl::Quantizer::MinMax, tl::Quantizer::Gptq}) {
        auto model = dense_model(seed, 128);
        tl::QuantizeOptions options;
        options.quantizer = quantizer;
        options.gptq.bits = 8;
        options.gptq.method = tl::QuantMethod::Symmetric;
        options.gptq.group_size = quantizer == tl::Quantizer::Gptq ? 0 : 64;
        tl::quantize_model(*model, options, text);
        EXPECT_EQ(model->config.bits, 8);
        for (const tl::Linear *l : model->linears()) {
            EXPECT_TRUE(l->quantized && l->bits == 8 && l->zeros == nullptr) << l->name;
        }
        const auto loaded = saved_and_loaded(*model, "int8_roundtrip_" + std::to_string(seed), text);
        EXPECT_EQ(loaded->config.bits, 8);
        EXPECT_EQ(loaded->config.group_size, options.gptq.group_size);
        // 16 times INT4's levels: a quarter of INT4's deviation leaves a wide margin.
        const double delta = mean_abs_delta(*loaded, text, dense);
        RecordProperty(quantizer == tl::Quantizer::Gptq ? "gptq8_over_minmax4" : "minmax8_over_minmax4",
                       std::to_string(delta / int4_delta));
        EXPECT_LT(delta, 0.25 * int4_delta) << "INT8 " << delta << ", INT4 min-max " << int4_delta;
    }
}

TEST(Pipeline, RejectsWhatItCannotQuantize) {
    auto code_of = [](auto fn) { return tlt::error_of(fn).code; };
    tl::QuantizeOptions options;
    options.quantizer = tl::Quantizer::Gptq;
    auto model = dense_model(1, 128);
    EXPECT_EQ(code_of([&] { tl::quantize_model(*model, options, {65}); }), TL_ERR_INVALID_ARGUMENT);  // no text
    options.gptq.group_size = 96;  // does not divide d_model
    EXPECT_EQ(code_of([&] { tl::quantize_model(*model, options, demo_text(50)); }), TL_ERR_INVALID_ARGUMENT);
    tl::SyntheticOptions synth;
    const auto quantized = tl::make_synthetic_model(gptq_test::small_config(128), synth);
    options.gptq.group_size = 128;
    EXPECT_EQ(code_of([&] { tl::quantize_model(*quantized, options, demo_text(50)); }), TL_ERR_INVALID_ARGUMENT);
    options.gptq.bits = 8;  // INT8 is symmetric: the default asymmetric method is refused
    EXPECT_EQ(code_of([&] { tl::quantize_model(*model, options, demo_text(50)); }), TL_ERR_INVALID_ARGUMENT);
    options.gptq.method = tl::QuantMethod::Symmetric;
    options.frac4 = true;  // rounding channels describe INT4 codes
    EXPECT_EQ(code_of([&] { tl::quantize_model(*model, options, demo_text(50)); }), TL_ERR_INVALID_ARGUMENT);
    options.frac4 = false;
    options.gptq.bits = 6;
    EXPECT_EQ(code_of([&] { tl::quantize_model(*model, options, demo_text(50)); }), TL_ERR_INVALID_ARGUMENT);
}

// ---- The CLI ----

// Runs the tinyloop tool; returns its exit status and its output (stdout and stderr).
std::pair<int, std::string> run_cli(const std::string &args) {
    const std::string command = std::string(TL_CLI_PATH) + " " + args + " 2>&1";
    FILE *pipe = popen(command.c_str(), "r");
    if (pipe == nullptr) return {-1, "cannot run " + command};
    std::string out;
    char buffer[4096];
    for (size_t got; (got = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) out.append(buffer, got);
    return {pclose(pipe), out};
}

std::string run_cli_ok(const std::string &args) {
    const auto [status, out] = run_cli(args);
    EXPECT_EQ(status, 0) << args << "\n" << out;
    return out;
}

double perplexity_of(const std::string &score_output) {
    const size_t at = score_output.find("perplexity");
    if (at == std::string::npos) return NAN;
    return std::strtod(score_output.c_str() + at + std::strlen("perplexity"), nullptr);
}

// make-model --dense -> quantize (min-max, GPTQ) -> score. GPTQ is calibrated and scored on the same demo text,
// which is what this checks: the command wires calibration to the quantizer, and on the text it was calibrated
// on, GPTQ's model stays closer to the dense one than min-max's. Measured in docs/quality.md.
TEST(Cli, QuantizeEndToEnd) {
    const std::string dir = ::testing::TempDir() + "gptq_cli_" + std::to_string(gptq_test::fresh_seed()) + "_";
    const std::string text = std::string(TL_SOURCE_DIR) + "/data/demo.txt";
    run_cli_ok("make-model --preset demo --dense --out " + dir + "dense.tinyloop");
    run_cli_ok("quantize " + dir + "dense.tinyloop " + dir + "minmax.tinyloop --method minmax");
    run_cli_ok("quantize " + dir + "dense.tinyloop " + dir + "gptq.tinyloop --method gptq --calib " + text +
            " --frac4 --sign-bit");
    double ppl[3];
    const char *names[3] = {"dense", "minmax", "gptq"};
    for (int i = 0; i < 3; ++i) {
        const std::string path = dir + names[i] + ".tinyloop";
        ppl[i] = perplexity_of(run_cli_ok("score " + path + " --backend cpu --text " + text));
        std::remove(path.c_str());
        RecordProperty(std::string(names[i]) + "_perplexity", std::to_string(ppl[i]));
        ASSERT_TRUE(std::isfinite(ppl[i]) && ppl[i] > 1.0) << names[i] << ": " << ppl[i];
    }
    EXPECT_LT(std::abs(ppl[2] - ppl[0]), std::abs(ppl[1] - ppl[0]))
        << "dense " << ppl[0] << ", min-max " << ppl[1] << ", GPTQ " << ppl[2];
}

// --bits 8 through the tool: quantize (min-max per row, GPTQ per group), info reports INT8, and score and compare run
// on the result; make-model --bits 8 writes an INT8 model directly, and --bits 8 refuses rounding channels.
TEST(Cli, QuantizeInt8) {
    const std::string dir = ::testing::TempDir() + "int8_cli_" + std::to_string(gptq_test::fresh_seed()) + "_";
    const std::string text = std::string(TL_SOURCE_DIR) + "/data/demo.txt";
    run_cli_ok("make-model --preset tiny --dense --out " + dir + "dense.tinyloop");
    run_cli_ok("quantize " + dir + "dense.tinyloop " + dir + "mm8.tinyloop --bits 8 --group-size 0");
    run_cli_ok("quantize " + dir + "dense.tinyloop " + dir + "gq8.tinyloop --bits 8 --method gptq --group-size 32 "
               "--calib " + text);
    run_cli_ok("make-model --preset tiny --bits 8 --out " + dir + "made8.tinyloop");
    for (const char *name : {"mm8", "gq8", "made8"}) {
        const std::string path = dir + name + ".tinyloop";
        const std::string info = run_cli_ok("info --json " + path);
        EXPECT_NE(info.find("\"bits\":8"), std::string::npos) << info;
        EXPECT_NE(info.find("\"n_int8_weights\":10"), std::string::npos) << info;
        EXPECT_NE(run_cli_ok("info " + path).find("INT8"), std::string::npos);
        const double ppl = perplexity_of(run_cli_ok("score " + path + " --backend cpu --text " + text));
        EXPECT_TRUE(std::isfinite(ppl) && ppl > 1.0) << name << ": " << ppl;
    }
    const std::string compared =
        run_cli_ok("compare " + dir + "dense.tinyloop " + dir + "gq8.tinyloop --backend cpu -q --text " + text);
    EXPECT_NE(compared.find("Mean    KLD"), std::string::npos) << compared;
    const auto [status, out] = run_cli("quantize " + dir + "dense.tinyloop " + dir + "never.tinyloop --bits 8 --frac4");
    EXPECT_NE(status, 0);
    EXPECT_NE(out.find("frac4 and sign_bit channels describe INT4 codes"), std::string::npos) << out;
    for (const char *name : {"dense", "mm8", "gq8", "made8"}) std::remove((dir + name + ".tinyloop").c_str());
}

TEST(Cli, GptqWithoutCalibrationTextIsRefused) {
    const auto [status, out] = run_cli("quantize " + std::string(TL_SOURCE_DIR) + "/tests/data/tiny.tinyloop " +
                                       ::testing::TempDir() + "never_written.tinyloop --method gptq");
    EXPECT_NE(status, 0);
    EXPECT_NE(out.find("--calib"), std::string::npos) << out;
}

}  // namespace
