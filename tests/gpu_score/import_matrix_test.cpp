// The converter's test matrix on the CUDA backend: every family tests/import/checkpoint_matrix.py writes (CTest's
// import.make_checkpoint_matrix runs first) is imported with the core's importer, scored by score_cuda (graphs off and
// on) and by score_cpu, and compared with the CPU backend, in the parity tests' tolerances (score_test.cpp: 0.02 nats
// per position, 0.25 % perplexity), and with the script's independent numpy reference (float64, transformers'
// semantics): the mean NLL within the matrix's bound for the CPU (1e-3 nats) plus 2e-3 for the GPU's FP16 activations.
// The measured differences are printed for the record.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cpu/cpu_forward.hpp"
#include "gpu/gpu_forward.hpp"
#include "gpu/gpu_model.hpp"
#include "import/checkpoint_import.hpp"

#ifndef TL_MATRIX_DATA_DIR
#error "TL_MATRIX_DATA_DIR must name the folder tests/import/checkpoint_matrix.py writes to"
#endif

namespace {

using json = nlohmann::json;

constexpr double kMaxPositionDiff = 0.02;  // nats, GPU vs CPU, per position (as score_test.cpp)
constexpr double kMaxPplRelDiff = 0.0025;  // perplexity, GPU vs CPU (as score_test.cpp)

struct Scores {
    std::vector<float> nll;
    double mean = 0.0;
};

TEST(ImportMatrix, EveryFamilyScoresOnTheGpuAsOnTheCpuAndTheReference) {
    std::ifstream in(std::string(TL_MATRIX_DATA_DIR) + "/matrix.json");
    ASSERT_TRUE(in) << "no " << TL_MATRIX_DATA_DIR << "/matrix.json (run CTest's import.make_checkpoint_matrix)";
    const json manifest = json::parse(in);
    ASSERT_GE(manifest["families"].size(), 12u);
    for (const json &f : manifest["families"]) {
        const std::string name = f["name"];
        SCOPED_TRACE(name);
        const std::unique_ptr<tl::Model> model =
            tl::import_checkpoint(std::string(TL_MATRIX_DATA_DIR) + "/" + f["dir"].get<std::string>(),
                                  tl::CheckpointImportOptions{});
        const std::vector<int32_t> tokens = f["tokens"].get<std::vector<int32_t>>();
        const size_t n = tokens.size();
        auto run = [&](bool gpu, tl::GpuModel *gm, bool graphs) {
            Scores r;
            r.nll.assign(n - 1, NAN);
            tl::ScoreOptions o;
            o.token_nll = r.nll.data();
            o.use_graphs = graphs;
            const tl::ScoreResult res = gpu ? tl::score_cuda(*gm, tokens.data(), n, o, 0, nullptr, nullptr)
                                            : tl::score_cpu(*model, tokens.data(), n, o);
            r.mean = res.nll_sum / static_cast<double>(res.tokens_scored);
            return r;
        };
        const Scores cpu = run(false, nullptr, false);
        tl::GpuModel gm(*model, 0);
        for (bool graphs : {false, true}) {
            const Scores gpu = run(true, &gm, graphs);
            double worst = 0.0;
            for (size_t i = 0; i < n - 1; ++i) {
                ASSERT_TRUE(std::isfinite(gpu.nll[i])) << "position " << i;
                worst = std::max(worst, std::fabs(static_cast<double>(gpu.nll[i]) - cpu.nll[i]));
            }
            const double ppl_rel = std::expm1(gpu.mean - cpu.mean);
            const double vs_reference = gpu.mean - f["mean_nll"].get<double>();
            std::printf("  %-38s %s GPU mean NLL %8.5f: vs CPU %+.2e (max per position %.1e), vs reference %+.2e\n",
                        name.c_str(), graphs ? "graphs" : "eager ", gpu.mean, gpu.mean - cpu.mean, worst,
                        vs_reference);
            EXPECT_LE(worst, kMaxPositionDiff);
            EXPECT_LE(std::fabs(ppl_rel), kMaxPplRelDiff);
            // The same bound as the CPU backend's: the GPU's FP16 activations must not cost the file its accuracy.
            EXPECT_LE(std::fabs(vs_reference), manifest["bound"].get<double>());
        }
    }
}

}  // namespace
