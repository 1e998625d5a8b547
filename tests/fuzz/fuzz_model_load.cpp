// libFuzzer target: each input is one .tinyloop file, driven through the public C API only (tinyloop.h):
// tl_model_load, then, if it loads, tl_model_info, every weight (tl_model_weight_at, tl_weight_info,
// tl_model_find_weight, tl_weight_dequantize) and a short tl_score on the CPU backend. Any status is acceptable;
// what fails the run is a crash, a leak, or an ASan/UBSan report. Memory and time per input stay bounded by
// skipping the work whose size a model's claimed dimensions would blow up (see the kMax* limits).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_common.hpp"
#include "tinyloop.h"

namespace {

constexpr double kMaxDequantFloats = double(1 << 22);    // per weight: 16 MiB of output
constexpr uint64_t kScoreMemoryBudget = uint64_t(256) << 20;  // tl_score's working memory (max_memory_bytes)
constexpr double kMaxScoreMacs = double(1 << 24);         // keeps one input's scoring in the milliseconds
constexpr double kMaxLinearFloats = double(1 << 22);      // d_model*ffn, vocab*d_model (the brief's "huge")
constexpr size_t kMaxWeights = 4096;

std::string g_path;  // the one scratch file every input is written to

void remove_scratch() { ::unlink(g_path.c_str()); }

using fuzz::discard_log;
using fuzz::read_message;

// FNV-1a over the whole input: the source of this input's load flags and tokens.
uint64_t hash_of(const uint8_t *data, size_t size) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < size; ++i) h = (h ^ data[i]) * 1099511628211ull;
    return h;
}

uint64_t splitmix(uint64_t &state) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void exercise_weights(const tl_model *model) {
    size_t count = 0;
    if (tl_model_weight_count(model, &count) != TL_OK) return;
    for (size_t i = 0; i < count && i < kMaxWeights; ++i) {
        const tl_weight *weight = nullptr;
        tl_status status = tl_model_weight_at(model, i, &weight);
        read_message(status);
        if (status != TL_OK) continue;
        tl_weight_properties info;
        std::memset(&info, 0, sizeof info);
        info.struct_size = sizeof info;
        status = tl_weight_info(weight, &info);
        read_message(status);
        if (status != TL_OK) continue;
        if (info.name != nullptr) {
            const tl_weight *found = nullptr;
            read_message(tl_model_find_weight(model, info.name, &found));
        }
        const double kn = double(info.k) * double(info.n);
        if (info.k <= 0 || info.n <= 0 || kn > kMaxDequantFloats) continue;
        // Exactly k*n floats on the heap, so a write past them shows under ASan; then one short of that,
        // which must be refused without a write.
        std::vector<float> out(size_t(info.k) * size_t(info.n));
        read_message(tl_weight_dequantize(weight, out.data(), out.size()));
        read_message(tl_weight_dequantize(weight, out.data(), out.size() - 1));
    }
    const tl_weight *past_end = nullptr;
    read_message(tl_model_weight_at(model, count, &past_end));
}

void exercise_score(const tl_model *model, const tl_model_properties &p, uint64_t seed) {
    // The dimensions come from the file, so they are checked here (in double: no overflow) before scoring.
    const double D = p.d_model, A = double(p.n_heads) * p.head_dim, F = p.ffn, V = p.vocab;
    const double layers = double(p.n_pre) + p.n_loops;
    const size_t n_tokens = 2 + size_t(splitmix(seed) % 7);
    const double T = double(n_tokens);
    const double macs = T * (layers * (4 * A * D + 3 * D * F) + D * V) + layers * T * T * A;
    // Memory is the library's to bound (max_memory_bytes below); time is bounded here.
    if (D <= 0 || F <= 0 || V <= 0 || macs > kMaxScoreMacs ||
        D * F > kMaxLinearFloats || V * D > kMaxLinearFloats) {
        return;
    }
    std::vector<int32_t> tokens(n_tokens);
    for (int32_t &t : tokens) {
        const uint64_t r = splitmix(seed);
        // One token in 16 may be out of range (vocab itself), which tl_score must refuse.
        t = int32_t(r % uint64_t(p.vocab + ((r >> 32) % 16 == 0 ? 1 : 0)));
    }
    std::vector<float> token_nll(n_tokens - 1);  // exact size: a write past it shows under ASan

    tl_score_options options;
    if (tl_score_options_init(&options, sizeof options) != TL_OK) return;
    options.backend = TL_BACKEND_CPU;
    options.n_threads = 1;
    options.token_nll = token_nll.data();
    options.token_nll_len = token_nll.size();
    options.max_memory_bytes = kScoreMemoryBudget;
    tl_score_result result;
    if (tl_score_result_init(&result, sizeof result) != TL_OK) return;
    read_message(tl_score(model, tokens.data(), tokens.size(), &options, &result));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    const char *dir = std::getenv("TMPDIR");
    std::string path = std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/tl_fuzz_XXXXXX";
    const int fd = ::mkstemp(path.data());
    if (fd < 0) {
        std::perror("tl_fuzz: mkstemp");
        std::abort();
    }
    ::close(fd);
    g_path = path;
    std::atexit(remove_scratch);
    tl_set_log_callback(discard_log, nullptr, TL_LOG_DEBUG);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!fuzz::write_file(g_path, data, size)) std::abort();  // a full disk is no finding: stop loudly instead
    uint64_t seed = hash_of(data, size);

    tl_load_options load;
    if (tl_load_options_init(&load, sizeof load) != TL_OK) std::abort();
    // Mostly read into a heap buffer, where ASan sees a read past the file's end (in a mapping it would read
    // the page's zero tail unseen); 1 input in 8 takes the mmap path, 1 in 8 skips the value scan.
    load.use_mmap = (seed & 7) == 0 ? 1 : 0;
    load.validate_values = ((seed >> 3) & 7) == 0 ? 0 : 1;
    tl_model *model = nullptr;
    const tl_status status = tl_model_load(g_path.c_str(), &load, &model);
    read_message(status);
    if (status != TL_OK) {
        if (model != nullptr) std::abort();  // the header promises *out_model = NULL on failure
        return 0;
    }

    tl_model_properties props;
    std::memset(&props, 0, sizeof props);
    props.struct_size = sizeof props;
    if (tl_model_info(model, &props) == TL_OK) {
        exercise_weights(model);
        exercise_score(model, props, seed >> 6);
    }
    tl_model_free(model);
    return 0;
}
