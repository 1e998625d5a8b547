// The converter's test matrix (checkpoint_matrix.py, run by CTest into the build folder first): every family of
// checkpoint `tinyloop import` reads is converted through the C API, loaded, scored on the CPU backend, and its
// per-token NLLs compared with the script's independent numpy reference of the checkpoint (transformers' semantics,
// float64), within the manifest's bound on the mean NLL (1e-3 nats), and within 1e-5 nats of the same reference with
// the INT4 offsets rounded as the format stores them (the conversion's one rounding); the model's structure (pre
// blocks, loops, K/V heads, head) must be the one the family implies. Every family the importer must refuse is refused with its status
// and message. The measured differences are printed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_safetensors.hpp"
#include "tinyloop.h"

#ifndef TL_MATRIX_DATA_DIR
#error "TL_MATRIX_DATA_DIR must name the folder checkpoint_matrix.py writes to"
#endif

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const std::string kData = TL_MATRIX_DATA_DIR;

const json &manifest() {
    static const json m = [] {
        std::ifstream in(kData + "/matrix.json");
        if (!in) throw std::runtime_error("cannot open " + kData + "/matrix.json");
        return json::parse(in);
    }();
    return m;
}

std::string scratch(const std::string &name) {
    const fs::path dir = fs::path(kData) / "scratch";
    fs::create_directories(dir);
    return (dir / name).string();
}

tl_status status_of(const std::string &name) {
    static const std::map<std::string, tl_status> kStatus = {{"TL_ERR_FORMAT", TL_ERR_FORMAT},
                                                             {"TL_ERR_UNSUPPORTED", TL_ERR_UNSUPPORTED},
                                                             {"TL_ERR_IO", TL_ERR_IO}};
    return kStatus.at(name);
}

// One family: import, load, check the structure, score on the CPU, compare with the reference.
void check_family(const json &f) {
    const std::string name = f["name"];
    SCOPED_TRACE(name);
    const std::string out = scratch(name + ".tinyloop");
    ASSERT_EQ(tl_model_import_checkpoint((kData + "/" + f["dir"].get<std::string>()).c_str(), out.c_str(), nullptr),
              TL_OK)
        << tl_last_error_message();

    tl_model *model = nullptr;
    ASSERT_EQ(tl_model_load(out.c_str(), nullptr, &model), TL_OK) << tl_last_error_message();
    tl_model_properties p;
    p.struct_size = sizeof p;
    ASSERT_EQ(tl_model_info(model, &p), TL_OK);
    const json &expect = f["expect"];
    EXPECT_EQ(p.n_pre, expect["pre"].get<int32_t>());
    EXPECT_EQ(p.n_loops, expect["loops"].get<int32_t>());
    EXPECT_EQ(p.head_kind, expect["head"] == "tied" ? 2 : 0);
    std::map<std::string, std::string> metadata;
    tl_test::read_safetensors(out, &metadata);
    const json config = json::parse(metadata["config"]);
    EXPECT_EQ(config.value("n_kv_heads", config["n_heads"].get<int32_t>()), expect["n_kv_heads"].get<int32_t>());

    const std::vector<int32_t> tokens = f["tokens"].get<std::vector<int32_t>>();
    const std::vector<double> want = f["nll"].get<std::vector<double>>();
    std::vector<float> got(tokens.size() - 1, NAN);
    tl_score_options so;
    ASSERT_EQ(tl_score_options_init(&so, sizeof so), TL_OK);
    so.backend = TL_BACKEND_CPU;
    so.n_threads = 2;
    so.token_nll = got.data();
    so.token_nll_len = got.size();
    tl_score_result result;
    ASSERT_EQ(tl_score_result_init(&result, sizeof result), TL_OK);
    ASSERT_EQ(tl_score(model, tokens.data(), tokens.size(), &so, &result), TL_OK) << tl_last_error_message();
    tl_model_free(model);

    ASSERT_EQ(result.tokens_scored, want.size());
    double worst = 0.0;
    for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_TRUE(std::isfinite(got[i])) << "position " << i;
        worst = std::max(worst, std::fabs(got[i] - want[i]));
    }
    const double mean = result.nll_sum / static_cast<double>(result.tokens_scored);
    const double diff = mean - f["mean_nll"].get<double>();
    const double stored = mean - f["mean_nll_stored_offsets"].get<double>();
    std::printf("  %-38s mean NLL %8.5f, reference %8.5f: difference %+.2e (max per position %.1e); with the "
                "offsets as stored %+.1e\n",
                name.c_str(), mean, f["mean_nll"].get<double>(), diff, worst, stored);
    EXPECT_LE(std::fabs(diff), manifest()["bound"].get<double>()) << name;
    EXPECT_LE(std::fabs(stored), manifest()["bound_stored_offsets"].get<double>()) << name;
}

// The manifest is written at test time (the fixture), after the tests were listed: one test loops over its families.
TEST(Matrix, EveryFamilyScoresAsTheNumpyReference) {
    ASSERT_GE(manifest()["families"].size(), 12u);
    for (const json &f : manifest()["families"]) check_family(f);
}

TEST(Matrix, EveryRefusedFamilyIsRefusedByName) {
    ASSERT_GE(manifest()["refused"].size(), 10u);
    for (const json &r : manifest()["refused"]) {
        SCOPED_TRACE(r["name"].get<std::string>());
        const std::string out = scratch(r["name"].get<std::string>() + ".tinyloop");
    const tl_status status =
        tl_model_import_checkpoint((kData + "/" + r["dir"].get<std::string>()).c_str(), out.c_str(), nullptr);
    const std::string message = tl_last_error_message();
    EXPECT_EQ(status, status_of(r["status"])) << message;
    for (const json &part : r["message"]) {
        EXPECT_NE(message.find(part.get<std::string>()), std::string::npos)
            << "message lacks \"" << part.get<std::string>() << "\": " << message;
    }
        EXPECT_FALSE(fs::exists(out));
    }
}

}  // namespace
