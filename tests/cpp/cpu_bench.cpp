// Times score_cpu on one 1024-token window of a synthetic model (d_model 512, 8 heads of 64, ffn 2048,
// vocab 256, pre 2, loops 4, INT4 group 128). Usage: tl_cpu_bench [threads] [repeats] [fp16|int8|fp8]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cpu/cpu_forward.hpp"
#include "import/synthetic.hpp"

int main(int argc, char **argv) {
    const int threads = argc > 1 ? std::atoi(argv[1]) : 0;
    const int repeats = argc > 2 ? std::atoi(argv[2]) : 3;
    const char *activations = argc > 3 ? argv[3] : "fp16";
    tl::ModelConfig c;
    c.d_model = 512;
    c.n_heads = 8;
    c.head_dim = 64;
    c.ffn = 2048;
    c.vocab = 256;
    c.pre = 2;
    c.loops = 4;
    c.max_seq = 1024;
    c.group_size = 128;
    const auto model = tl::make_synthetic_model(c, tl::SyntheticOptions{});
    std::vector<int32_t> tokens(1024);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7919 + 13) % c.vocab);
    tl::ScoreOptions options;
    options.n_threads = threads;
    for (tl::ActivationMode mode : {tl::ActivationMode::Fp16, tl::ActivationMode::Int8, tl::ActivationMode::Fp8}) {
        if (std::strcmp(activations, tl::activation_mode_name(mode)) == 0) options.activations = mode;
    }
    for (int r = 0; r < repeats; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        const tl::ScoreResult result = tl::score_cpu(*model, tokens.data(), tokens.size(), options);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("threads %d, activations %s: %.3f s, nll/token %.4f\n", threads,
                    tl::activation_mode_name(options.activations), s, result.nll_sum / result.tokens_scored);
    }
    return 0;
}
