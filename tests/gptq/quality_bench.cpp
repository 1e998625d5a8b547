// Measures what quantization costs on a synthetic model: the dense model's NLL on a text against its min-max and
// GPTQ INT4 versions (per group 128 and per row), each scored plainly and with cross-iteration rounding (frac4,
// and sign_bit alone), next to the averaged-weights bound. Prints the markdown table of docs/quality.md.
// Not a test; run by hand:
//   tl_quality_bench [--calib FILE] [--eval FILE] [--seed N] [--loops N] [--symmetric] [--threads N]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "cpu/cpu_forward.hpp"
#include "quant/cross_iter.hpp"
#include "util/error.hpp"
#include "gptq/gptq.hpp"
#include "import/synthetic.hpp"

namespace {

std::vector<int32_t> read_bytes(const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        std::fprintf(stderr, "cannot open %s\n", path.c_str());
        std::exit(2);
    }
    std::vector<int32_t> tokens;
    for (std::istreambuf_iterator<char> it(in), end; it != end; ++it) tokens.push_back(static_cast<unsigned char>(*it));
    return tokens;
}

struct Scored {
    double nll;                    // nats per predicted token
    std::vector<float> token_nll;  // per position
};

Scored score(const tl::Model &model, const std::vector<int32_t> &tokens, bool cross_iter, int32_t threads) {
    Scored s;
    s.token_nll.resize(tokens.size() - 1);
    tl::ScoreOptions options;
    options.n_threads = threads;
    options.dispatch[tl::DispatchSetting::CrossIterRound] = cross_iter ? 1 : 0;
    options.token_nll = s.token_nll.data();
    const tl::ScoreResult r = tl::score_cpu(model, tokens.data(), tokens.size(), options);
    s.nll = r.nll_sum / static_cast<double>(r.tokens_scored);
    return s;
}

// The model with each looped linear replaced by the average of its per-iteration weights under the frac4 rule,
// applied on every iteration: what cross-iteration rounding would give if only that average mattered (a bound
// for comparison, not an execution path).
tl::Model averaged_loop(const tl::Model &model) {
    tl::Model out = model;
    const int32_t loops = model.config.loops;
    for (int l = 0; l < 5; ++l) {
        const tl::Linear &w = *model.loop.linear(l);
        std::vector<float> one(static_cast<size_t>(w.k) * w.n), average(one.size(), 0.0f);
        for (int32_t i = 0; i < loops; ++i) {
            tl::dequantize_rows(tl::cross_iter_linear(w, i, loops), 0, w.n, one.data());
            for (size_t j = 0; j < one.size(); ++j) average[j] += one[j] / static_cast<float>(loops);
        }
        *out.loop.linear(l) = tl::make_dense_linear(w.name, average.data(), w.k, w.n);
    }
    return out;
}

void print_row(const char *quantizer, const char *grouping, const char *path, const Scored &s, const Scored &dense) {
    double abs_diff = 0.0;
    for (size_t i = 0; i < s.token_nll.size(); ++i) abs_diff += std::fabs(s.token_nll[i] - dense.token_nll[i]);
    std::printf("| %-7s | %-9s | %-22s | %.5f | %+.5f | %.5f |\n", quantizer, grouping, path, s.nll, s.nll - dense.nll,
                abs_diff / static_cast<double>(s.token_nll.size()));
}

}  // namespace

int main(int argc, char **argv) {
    std::string calib_path = std::string(TL_SOURCE_DIR) + "/LICENSE";
    std::string eval_path = std::string(TL_SOURCE_DIR) + "/data/demo.txt";
    tl::SyntheticOptions synth;
    synth.quantized = false;
    tl::ModelConfig c;  // the CLI's "demo" preset
    c.d_model = 256, c.n_heads = 4, c.head_dim = 64, c.ffn = 1024, c.vocab = 256;
    c.pre = 2, c.loops = 4, c.max_seq = 1024, c.group_size = 0;
    tl::QuantMethod method = tl::QuantMethod::Asymmetric;
    int32_t threads = 0;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        const bool has_value = i + 1 < argc;
        if (arg == "--calib" && has_value) calib_path = argv[++i];
        else if (arg == "--eval" && has_value) eval_path = argv[++i];
        else if (arg == "--seed" && has_value) synth.seed = std::strtoull(argv[++i], nullptr, 10);
        else if (arg == "--loops" && has_value) c.loops = std::atoi(argv[++i]);
        else if (arg == "--threads" && has_value) threads = std::atoi(argv[++i]);
        else if (arg == "--symmetric") method = tl::QuantMethod::Symmetric;
        else {
            std::fprintf(stderr, "usage: %s [--calib FILE] [--eval FILE] [--seed N] [--loops N] [--symmetric] "
                                 "[--threads N]\n", argv[0]);
            return 2;
        }
    }
    try {
        const std::vector<int32_t> calib = read_bytes(calib_path), eval = read_bytes(eval_path);
        const Scored dense = score(*tl::make_synthetic_model(c, synth), eval, false, threads);
        std::printf("synthetic dense model: seed %llu, d_model %d, ffn %d, pre %d, loops %d; %s INT4\n",
                    static_cast<unsigned long long>(synth.seed), c.d_model, c.ffn, c.pre, c.loops,
                    method == tl::QuantMethod::Asymmetric ? "asymmetric" : "symmetric");
        std::printf("calibration %s (%zu tokens), evaluation %s (%zu tokens)\n\n", calib_path.c_str(), calib.size(),
                    eval_path.c_str(), eval.size());
        std::printf("| quant   | grouping  | path                   | NLL     | ΔNLL     | mean abs ΔNLL/token |\n");
        std::printf("|---------|-----------|------------------------|---------|----------|---------------------|\n");
        print_row("dense", "-", "FP32", dense, dense);
        for (tl::Quantizer quantizer : {tl::Quantizer::MinMax, tl::Quantizer::Gptq}) {
            for (int32_t group : {128, 0}) {
                auto model = tl::make_synthetic_model(c, synth);
                tl::QuantizeOptions options;
                options.quantizer = quantizer;
                options.gptq.method = method;
                options.gptq.group_size = group;
                options.frac4 = options.sign_bit = true;
                options.n_threads = threads;
                tl::quantize_model(*model, options, calib);
                const char *q = quantizer == tl::Quantizer::Gptq ? "GPTQ" : "min-max";
                const char *g = group == 0 ? "per row" : "group 128";
                print_row(q, g, "plain", score(*model, eval, false, threads), dense);
                print_row(q, g, "cross-iter, frac4", score(*model, eval, true, threads), dense);
                const Scored bound = score(averaged_loop(*model), eval, false, threads);
                for (int l = 0; l < 5; ++l) model->loop.linear(l)->frac4 = nullptr;  // the rule falls back to sign_bit
                print_row(q, g, "cross-iter, sign_bit", score(*model, eval, true, threads), dense);
                print_row(q, g, "(bound) averaged loop", bound, dense);
            }
        }
    } catch (const tl::Error &e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
