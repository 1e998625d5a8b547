// The `tinyloop` command-line tool: info, make-model, quantize, import, set-tokenizer, tokenize, score, score-batch,
// compare.
// Scoring and inspection go through the public C API (the same path users take); model creation and
// quantization use the C++ core directly because the C API has no model writer.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "util/error.hpp"
#include "format/format.hpp"
#include "gptq/gptq.hpp"
#include "quant/quant.hpp"
#include "import/synthetic.hpp"
#include "text/tokenizer.hpp"
#include "cli/perplexity.hpp"
#include "cli/requests.hpp"
#include "tinyloop.h"

namespace {

struct CliError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// A command line that cannot work whatever the files hold (a missing option, say): exit 2 like CLI11's parse errors.
struct UsageError : CliError {
    using CliError::CliError;
};

// The exit statuses, in every --help's footer (subcommands copy the footer when they are added).
constexpr const char *kExitStatus =
    "Exit status: 0 success (--help and --version included); 1 runtime error (a model or file that does not load, "
    "a failed score); 2 usage error (an unknown subcommand or option, a missing argument, an invalid value).";

void check(tl_status status, const char *what) {
    if (status != TL_OK) {
        throw CliError(std::string(what) + ": " + tl_status_string(status) + ": " + tl_last_error_message());
    }
}

// ---- Presets for make-model ----

tl::ModelConfig preset_config(const std::string &name) {
    tl::ModelConfig c;
    if (name == "tiny") {  // test fixture: tests/data/tiny.tinyloop
        c.d_model = 64, c.n_heads = 4, c.head_dim = 16, c.ffn = 128, c.vocab = 256;
        c.pre = 1, c.loops = 2, c.max_seq = 128, c.group_size = 32;
    } else if (name == "demo") {  // small byte-level model for the README's demo
        c.d_model = 256, c.n_heads = 4, c.head_dim = 64, c.ffn = 1024, c.vocab = 256;
        c.pre = 2, c.loops = 4, c.max_seq = 1024, c.group_size = 128;
    } else if (name == "2b") {  // the 2B-shaped model of the scoring benchmark (docs/benchmarks.md)
        c.d_model = 2048, c.n_heads = 16, c.head_dim = 128, c.ffn = 8192, c.vocab = 50257;
        c.pre = 2, c.loops = 8, c.max_seq = 4096, c.group_size = 0;
    } else {
        throw UsageError("unknown preset '" + name + "' (tiny, demo, 2b)");
    }
    return c;
}

// ---- Tokens ----

// The most tokens read from one file: 1 GiB of text (4 GiB as tokens). It bounds what an endless input such as
// /dev/zero or a pipe can cost before the error; --max-tokens picks a prefix of anything larger.
constexpr uint64_t kMaxInputTokens = uint64_t{1} << 30;

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

// A text file's bytes: reads in chunks and stops after `max_tokens` bytes (0 = all), so a prefix of a huge or endless
// file costs only that prefix. "-" reads standard input.
std::string read_text(const std::string &path, uint64_t max_tokens) {
    const bool from_stdin = path == "-";
    const int fd = from_stdin ? STDIN_FILENO : ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw CliError("cannot open text file '" + path + "': " + errno_text(errno));
    const struct Closer {
        int fd;
        ~Closer() {
            if (fd != STDIN_FILENO) ::close(fd);
        }
    } closer{fd};
    const auto too_large = [&path] {
        return CliError("text file '" + path + "' is larger than the 1 GiB limit; score a prefix with --max-tokens N");
    };
    struct stat st;
    if (::fstat(fd, &st) != 0) throw CliError("cannot stat text file '" + path + "': " + errno_text(errno));
    const uint64_t size = S_ISREG(st.st_mode) ? static_cast<uint64_t>(st.st_size) : 0;  // 0: unknown
    const uint64_t want = std::min(max_tokens > 0 ? max_tokens : UINT64_MAX, kMaxInputTokens + 1);
    if (size > kMaxInputTokens && want > kMaxInputTokens) throw too_large();  // known without reading it
    // Bytes go in 1 MiB blocks that are never regrown, so an over-long input peaks near the limit, with no
    // reallocation copies, and only a complete input is widened to 4-byte tokens.
    constexpr size_t kBlock = size_t{1} << 20;
    std::vector<std::vector<uint8_t>> blocks;
    size_t filled = 0;  // bytes read into blocks.back()
    uint64_t total = 0;
    while (total < want) {
        if (blocks.empty() || filled == blocks.back().size()) {
            blocks.emplace_back(static_cast<size_t>(std::min<uint64_t>(kBlock, want - total)));
            filled = 0;
        }
        std::vector<uint8_t> &block = blocks.back();
        const ssize_t got = ::read(fd, block.data() + filled, block.size() - filled);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) throw CliError("cannot read text file '" + path + "': " + errno_text(errno));
        if (got == 0) break;
        filled += static_cast<size_t>(got);
        total += static_cast<uint64_t>(got);
    }
    if (total > kMaxInputTokens) throw too_large();
    std::string text;
    text.reserve(static_cast<size_t>(total));
    for (size_t b = 0; b < blocks.size(); ++b) {
        const size_t used = b + 1 < blocks.size() ? blocks[b].size() : filled;
        text.append(reinterpret_cast<const char *>(blocks[b].data()), used);
        blocks[b] = {};
    }
    return text;
}

// Byte-level tokens, one per byte.
std::vector<int32_t> byte_tokens(const std::string &text) {
    std::vector<int32_t> tokens(text.size());
    for (size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
    return tokens;
}

// Whitespace-separated token ids; stops after `max_tokens` (0 = all), and at the same limit as text. "-" reads
// standard input.
std::vector<int32_t> read_token_file(const std::string &path, uint64_t max_tokens) {
    std::ifstream file;
    if (path != "-") {
        file.open(path);
        if (!file) throw CliError("cannot open token file '" + path + "': " + errno_text(errno));
    }
    std::istream &in = path == "-" ? std::cin : file;
    std::vector<int32_t> tokens;
    long long v;
    while ((max_tokens == 0 || tokens.size() < max_tokens) && in >> v) {
        if (v < INT32_MIN || v > INT32_MAX) throw CliError("token " + std::to_string(v) + " out of int32 range");
        if (tokens.size() == kMaxInputTokens) {
            throw CliError("token file '" + path + "' holds more than " + std::to_string(kMaxInputTokens) +
                           " tokens; score a prefix with --max-tokens N");
        }
        tokens.push_back(static_cast<int32_t>(v));
    }
    if (in.fail() && !in.eof()) throw CliError("token file '" + path + "' holds something that is not an integer");
    return tokens;
}

// A progress bar on stderr; callers draw it only when stderr is a terminal.
void draw_bar(const char *label, uint64_t done, uint64_t total, const char *unit, const std::string &suffix = "") {
    if (total == 0) return;
    const int width = 40;
    const int filled = static_cast<int>(width * done / total);
    std::fprintf(stderr, "\r%s[%.*s%*s] %3d%% %llu/%llu %s%s", label, filled,
                 "========================================", width - filled, "", static_cast<int>(100 * done / total),
                 static_cast<unsigned long long>(done), static_cast<unsigned long long>(total), unit, suffix.c_str());
    if (done == total) std::fprintf(stderr, "\n");
    std::fflush(stderr);
}

std::string format_duration(double seconds) {
    const long s = std::lround(seconds);
    char buf[32];
    if (s < 60) std::snprintf(buf, sizeof buf, "%ld s", s);
    else if (s < 3600) std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
    else std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, s / 60 % 60);
    return buf;
}

// Progress when stderr is not a terminal (a log, CI): whole lines, one per `interval` seconds and one at the end,
// since a redrawn bar would fill a log with carriage returns. The callback runs between windows, so a line can
// come later than the interval, never in the middle of a window.
struct ProgressLog {
    double interval = 5;
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now(), last = start;
    // score: the running perplexity over the windows (or chunks) done, added to each line and to the bar.
    const tl::cli::RunningPerplexity *running = nullptr;
    const char *unit = "window";

    std::string detail() const { return running != nullptr ? running->progress_text(unit) : std::string(); }
};

int32_t draw_progress(void *user, uint64_t done, uint64_t total) {
    draw_bar("", done, total, "tokens", static_cast<const ProgressLog *>(user)->detail());
    return 0;
}

int32_t log_progress(void *user, uint64_t done, uint64_t total) {
    auto &p = *static_cast<ProgressLog *>(user);
    const auto now = std::chrono::steady_clock::now();
    if (done < total && std::chrono::duration<double>(now - p.last).count() < p.interval) return 0;
    p.last = now;
    const double elapsed = std::chrono::duration<double>(now - p.start).count();
    const double rate = elapsed > 0 ? static_cast<double>(done) / elapsed : 0;
    const std::string eta = done == total ? "0 s" : rate > 0 ? format_duration((total - done) / rate) : "unknown";
    std::fprintf(stderr, "progress %llu/%llu tokens (%.1f%%), %.1f tok/s, ETA %s%s\n",
                 static_cast<unsigned long long>(done), static_cast<unsigned long long>(total),
                 total ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0, rate, eta.c_str(),
                 p.detail().c_str());
    std::fflush(stderr);
    return 0;
}

// --activations' values (checked by CLI11) and the C API's.
const std::map<std::string, int32_t> kActivations = {
    {"fp16", TL_ACTIVATIONS_FP16}, {"int8", TL_ACTIVATIONS_INT8}, {"fp8", TL_ACTIVATIONS_FP8}};

// " (int8 activations)" after a model's name in a report, "" for the default.
std::string activations_note(const std::string &activations) {
    return activations == "fp16" ? "" : " (" + activations + " activations)";
}

// The options score and score-batch start from: --backend (checked by CLI11), --threads, --activations, and progress on
// stderr, the live bar on a terminal, else `log`'s lines every `progress_interval` seconds (a log, CI).
tl_score_options scoring_options(const std::string &backend, int threads, const std::string &activations, bool quiet,
                                 double progress_interval, ProgressLog &log) {
    tl_score_options opts;
    check(tl_score_options_init(&opts, sizeof opts), "score options");
    opts.activations = kActivations.at(activations);
    static const std::map<std::string, int32_t> backends = {
        {"auto", TL_BACKEND_AUTO}, {"cpu", TL_BACKEND_CPU}, {"cuda", TL_BACKEND_CUDA}};
    opts.backend = backends.at(backend);
    opts.n_threads = threads;
    log.interval = progress_interval;
    if (quiet) {
        opts.progress = nullptr;
    } else {
        opts.progress = isatty(STDERR_FILENO) ? draw_progress : log_progress;
        opts.progress_user_data = &log;
    }
    return opts;
}

// llama-perplexity's uncertainty: PPL = exp(m), m the mean NLL, and by the delta method
// SE(PPL) ≈ exp(m) · s / sqrt(n), s the NLLs' sample standard deviation. NaN for fewer than 2 tokens.
double perplexity_stderr(double perplexity, const std::vector<float> &nll) {
    const size_t n = nll.size();
    if (n < 2) return NAN;
    double mean = 0;
    for (float x : nll) mean += x;
    mean /= static_cast<double>(n);
    double squares = 0;  // two passes: no cancellation between sum(x^2) and n·mean^2
    for (float x : nll) squares += (x - mean) * (x - mean);
    return perplexity * std::sqrt(squares / static_cast<double>(n - 1)) / std::sqrt(static_cast<double>(n));
}

// --version: the library's version and what the build holds, from tl_build_info()'s JSON.
std::string version_text() {
    std::string text = std::string("tinyloop ") + tl_version_string();
    const nlohmann::json info = nlohmann::json::parse(tl_build_info(), nullptr, false);
    if (!info.is_object()) return text + "\nbuild: (no build information)";
    text += "\nbuild: CUDA ";
    if (info.value("cuda", false)) {
        text += "on";
        if (info.contains("cuda_version") && info["cuda_version"].is_string()) {
            text += " (CUDA " + info["cuda_version"].get<std::string>();
            if (info.contains("cuda_architectures") && !info["cuda_architectures"].empty()) {
                text += ", architectures";
                for (const auto &a : info["cuda_architectures"]) text += " " + a.dump();
            }
            text += ")";
        }
    } else {
        text += "off";
    }
    text += ", " + info.value("compiler", std::string("unknown compiler")) + ", " +
            info.value("build_type", std::string("unknown build type"));
    return text;
}

// A float as the short decimal the text output prints (%.7g), so that JSON says 1e-05, not 9.999999747378752e-06.
double short_decimal(float value) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.7g", static_cast<double>(value));
    return std::strtod(buf, nullptr);
}

struct ModelHandle {
    tl_model *model = nullptr;
    explicit ModelHandle(const std::string &path) { check(tl_model_load(path.c_str(), nullptr, &model), "load"); }
    ~ModelHandle() { tl_model_free(model); }
    ModelHandle(const ModelHandle &) = delete;
    ModelHandle &operator=(const ModelHandle &) = delete;
};

// The dispatcher settings the tool takes from its environment, applied to the model it scores (the library itself
// reads no environment). An unset or empty variable leaves the library's default.
void apply_dispatch_environment(tl_model *model) {
    static const struct {
        const char *name;
        int32_t setting;
    } kVariables[] = {{"TINYLOOP_USE_MARLIN", TL_DISPATCH_USE_MARLIN},
                      {"TINYLOOP_EXPERIMENTAL_FP16_BODY", TL_DISPATCH_FP16_BODY},
                      {"TINYLOOP_CROSS_ITER_ROUND", TL_DISPATCH_CROSS_ITER_ROUND},
                      {"TINYLOOP_MARLIN_MODE", TL_DISPATCH_MARLIN_MODE},
                      {"TINYLOOP_CUBLAS_MIN_M", TL_DISPATCH_CUBLAS_MIN_M}};
    for (const auto &v : kVariables) {
        const char *text = std::getenv(v.name);
        if (text == nullptr || *text == '\0') continue;
        char *end = nullptr;
        errno = 0;
        const long value = std::strtol(text, &end, 10);
        if (*end != '\0' || errno != 0 || value < 0 || value > INT32_MAX ||
            tl_model_set_dispatch(model, v.setting, static_cast<int32_t>(value)) != TL_OK) {
            throw UsageError(std::string(v.name) + "='" + text + "' is not a value of this setting (see --help)");
        }
    }
    if (const char *attention = std::getenv("TINYLOOP_ATTENTION"); attention != nullptr && *attention != '\0') {
        const std::string a = attention;
        if (a != "simt" && a != "auto" && a != "mma") {
            throw UsageError("TINYLOOP_ATTENTION='" + a + "' is not auto, simt or mma");
        }
        check(tl_model_set_dispatch(model, TL_DISPATCH_ATTENTION, a == "simt" ? 1 : a == "mma" ? 2 : 0),
              "TINYLOOP_ATTENTION");
    }
}

// The model's tokenizer (TL_TOKENIZER_*).
int32_t tokenizer_kind(const tl_model *model) {
    int32_t kind = TL_TOKENIZER_BYTES;
    check(tl_model_tokenizer(model, &kind, nullptr), "tokenizer");
    return kind;
}

const char *tokenizer_name(int32_t kind) {
    return kind == TL_TOKENIZER_HUGGINGFACE ? "huggingface" : kind == TL_TOKENIZER_SENTENCEPIECE ? "sentencepiece"
                                                                                                  : "bytes";
}

// Token ids of a text by the model's tokenizer (tl_tokenize): first into room for one id a byte, which a
// tokenizer.json or byte-level model never exceeds, then, for a SentencePiece model that did, into the size it gave.
std::vector<int32_t> tokenize(const tl_model *model, const std::string &text) {
    std::vector<int32_t> ids(text.size() + 1);
    size_t n = 0;
    tl_status status = tl_tokenize(model, text.data(), text.size(), ids.data(), ids.size(), &n);
    if (status == TL_ERR_BUFFER_TOO_SMALL) {
        ids.resize(n);
        status = tl_tokenize(model, text.data(), text.size(), ids.data(), ids.size(), &n);
    }
    check(status, "tokenize");
    ids.resize(n);
    return ids;
}

// The tokens a command scores: --tokens FILE's ids, or the --text file through the model's tokenizer. A byte-level
// model reads only the max_tokens bytes it scores, any other reads the whole text and keeps its first max_tokens.
std::vector<int32_t> input_tokens(const tl_model *model, const std::string &token_file, const std::string &text,
                                  uint64_t max_tokens) {
    if (!token_file.empty()) return read_token_file(token_file, max_tokens);
    if (tokenizer_kind(model) == TL_TOKENIZER_BYTES) return byte_tokens(read_text(text, max_tokens));
    std::vector<int32_t> tokens = tokenize(model, read_text(text, 0));
    if (max_tokens > 0 && tokens.size() > max_tokens) tokens.resize(static_cast<size_t>(max_tokens));
    return tokens;
}

// ---- Commands ----

int cmd_info(const std::string &path, bool json) {
    ModelHandle h(path);
    tl_model_properties p;
    p.struct_size = sizeof p;
    check(tl_model_info(h.model, &p), "info");
    const auto rope_type = static_cast<tl::RopeScalingType>(p.rope_scaling);
    const bool scaled = rope_type != tl::RopeScalingType::None;
    const char *head = p.head_kind == 1 ? "quantized" : p.head_kind == 0 ? "dense" : "tied to the embedding";
    int32_t tokenizer = TL_TOKENIZER_BYTES, tokenizer_ids = 0;
    check(tl_model_tokenizer(h.model, &tokenizer, &tokenizer_ids), "tokenizer");
    // bits is the widest code width; a mixed file also has linears of the other width.
    uint32_t n_int8 = 0;
    for (uint32_t i = 0; i < p.n_quant_weights; ++i) {
        const tl_weight *w = nullptr;
        tl_weight_properties wp;
        wp.struct_size = sizeof wp;
        check(tl_model_weight_at(h.model, i, &w), "weight");
        check(tl_weight_info(w, &wp), "weight info");
        if (wp.bits == 8) ++n_int8;
    }
    if (json) {
        const nlohmann::ordered_json j = {
            {"model", path}, {"format_version", p.format_version}, {"d_model", p.d_model}, {"n_heads", p.n_heads},
            {"n_kv_heads", p.n_kv_heads}, {"head_dim", p.head_dim}, {"ffn", p.ffn}, {"vocab", p.vocab},
            {"n_pre", p.n_pre}, {"n_loops", p.n_loops},
            {"max_seq", p.max_seq}, {"quantized", p.n_quant_weights > 0}, {"bits", p.bits},
            {"n_int8_weights", n_int8},
            {"group_size", p.group_size}, {"rope_theta", short_decimal(p.rope_theta)},
            {"norm_eps", short_decimal(p.norm_eps)},
            {"rope_scaling", scaled ? nlohmann::ordered_json(tl::rope_scaling_name(rope_type)) : nullptr},
            {"head", p.head_kind == 2 ? "tied" : head},
            {"n_quant_weights", p.n_quant_weights}, {"n_dense_linears", p.n_dense_linears},
            {"has_frac4", p.has_frac4 != 0}, {"has_sign_bit", p.has_sign_bit != 0},
            {"parameter_count", p.parameter_count}, {"file_bytes", p.file_bytes}, {"n_tensors", p.n_tensors},
            {"tensor_bytes", p.tensor_bytes}, {"quant_weight_bytes", p.quant_weight_bytes},
            {"tokenizer", tokenizer_name(tokenizer)}, {"tokenizer_ids", tokenizer_ids}};
        std::printf("%s\n", j.dump().c_str());
        return 0;
    }
    std::printf("model            %s\n", path.c_str());
    std::printf("format_version   %d\n", p.format_version);
    std::printf("d_model          %d\n", p.d_model);
    std::printf("heads            %d x %d", p.n_heads, p.head_dim);
    if (p.n_kv_heads != p.n_heads) std::printf(", %d key/value heads (grouped-query attention)", p.n_kv_heads);
    std::printf("\n");
    std::printf("ffn              %d\n", p.ffn);
    std::printf("vocab            %d\n", p.vocab);
    std::printf("blocks           %d pre + 1 looped x %d\n", p.n_pre, p.n_loops);
    std::printf("max_seq          %d\n", p.max_seq);
    if (p.n_quant_weights == 0) {
        std::printf("quantization     none (dense linears)\n");
    } else {
        const std::string mix = n_int8 == 0 || n_int8 == p.n_quant_weights
                                    ? ""
                                    : " (" + std::to_string(n_int8) + " INT8, " +
                                          std::to_string(p.n_quant_weights - n_int8) + " INT4)";
        std::printf("quantization     INT%d%s, %s\n", p.bits, mix.c_str(),
                    p.group_size == 0 ? "per row" : ("group " + std::to_string(p.group_size)).c_str());
    }
    std::printf("rope_theta       %g\n", p.rope_theta);
    if (scaled) std::printf("rope_scaling     %s, factor %g\n", tl::rope_scaling_name(rope_type), p.rope_scaling_factor);
    std::printf("norm_eps         %g\n", p.norm_eps);
    std::printf("head             %s\n", head);
    std::printf("linears          %u quantized, %u dense\n", p.n_quant_weights, p.n_dense_linears);
    std::printf("channels         frac4 %s, sign_bit %s\n", p.has_frac4 ? "yes" : "no", p.has_sign_bit ? "yes" : "no");
    std::printf("parameters       %llu\n", static_cast<unsigned long long>(p.parameter_count));
    std::printf("file             %llu bytes, %u tensors, quantized weights %llu bytes\n",
                static_cast<unsigned long long>(p.file_bytes), p.n_tensors,
                static_cast<unsigned long long>(p.quant_weight_bytes));
    if (tokenizer == TL_TOKENIZER_BYTES) std::printf("tokenizer        none (one token per byte)\n");
    else std::printf("tokenizer        %s (%d ids)\n", tokenizer_name(tokenizer), tokenizer_ids);
    return 0;
}

// Converts a checkpoint folder through the C API, then loads the result back (the loader's full validation) for a
// one-line summary.
int cmd_import(const std::string &dir, const std::string &out, int max_seq) {
    tl_import_options options;
    check(tl_import_options_init(&options, sizeof options), "import");
    options.max_seq = max_seq;
    check(tl_model_import_checkpoint(dir.c_str(), out.c_str(), &options), "import");
    ModelHandle h(out);
    tl_model_properties p;
    p.struct_size = sizeof p;
    check(tl_model_info(h.model, &p), "info");
    // An imported checkpoint has one code width (bits).
    const std::string quantized = "INT" + std::to_string(p.bits);
    std::printf("wrote %s: d_model %d, %d pre + 1 looped x %d, vocab %d, %u %s and %u dense linears, head %s\n",
                out.c_str(), p.d_model, p.n_pre, p.n_loops, p.vocab, p.n_quant_weights, quantized.c_str(),
                p.n_dense_linears, p.head_kind == 1 ? quantized.c_str() : p.head_kind == 0 ? "dense" : "tied");
    return 0;
}

// What `score` was asked: the input, where it runs, and the perplexity convention with its parameters.
struct ScoreArgs {
    std::string model_path, text, token_file, backend = "auto", per_token, activations = "fp16";
    int threads = 0, device = 0, window = 0;
    bool quiet = false, json = false;
    uint64_t max_tokens = 0;
    double progress_interval = 5;
    tl::cli::Convention convention = tl::cli::Convention::Windows;
    int64_t stride = 0;  // --stride S
    int64_t ctx = 0;     // --ctx N (0: the default)
    int64_t bos = -1;    // --bos ID (-1: none)
    int top_k = 0;       // --top-k K (0: none)
};

// llama-perplexity's default context: 512, the context of most published llama-perplexity figures, capped at the
// model's max_seq (rounded down to even).
constexpr int64_t kDefaultLlamaContext = 512;

// The checks of --stride, --ctx and --bos that need no model: usage errors (exit 2) before anything is loaded.
void check_convention_args(const ScoreArgs &a) {
    using tl::cli::Convention;
    if (a.convention == Convention::Stride) {
        if (a.stride < 1) {
            throw UsageError("--stride " + std::to_string(a.stride) + ": the stride S must satisfy 1 <= S <= "
                             "window - 1 (S = window - 1 is the default windows)");
        }
        if (a.window >= 2 && a.stride > a.window - 1) {  // a --window below 2 is refused as such, with the model
            throw UsageError("--stride " + std::to_string(a.stride) +
                             ": the stride must be at most the window length - 1 = " + std::to_string(a.window - 1) +
                             " (--window " + std::to_string(a.window) +
                             "): from a stride of the whole window on, tokens between the windows would go unscored");
        }
    }
    if (a.top_k != 0 && a.convention != Convention::Windows) {
        throw UsageError("--top-k goes with the default windows only, not with --stride or --llama-perplexity");
    }
    if (a.convention == Convention::LlamaPerplexity) {
        if (a.ctx != 0 && a.ctx % 2 != 0) {
            throw UsageError("--ctx " + std::to_string(a.ctx) +
                             ": llama-perplexity's context must be even (the second half of each chunk is scored)");
        }
        if (a.ctx != 0 && a.ctx < 4) {
            throw UsageError("--ctx " + std::to_string(a.ctx) +
                             ": llama-perplexity's context must be at least 4 (each chunk scores ctx/2 - 1 tokens)");
        }
        if (a.bos < -1) throw UsageError("--bos " + std::to_string(a.bos) + ": a token id must not be negative");
    }
}

// The window length or chunk size of the convention, checked against the model (usage errors, exit 2). The default
// windows leave --window to the library, as they always did.
size_t convention_length(const ScoreArgs &a, const tl_model_properties &p) {
    using tl::cli::Convention;
    const int64_t max_seq = p.max_seq;
    if (a.convention == Convention::Windows) return static_cast<size_t>(a.window != 0 ? a.window : max_seq);
    if (a.convention == Convention::Stride) {
        const int64_t window = a.window != 0 ? a.window : max_seq;
        if (window < 2 || window > max_seq) {
            throw UsageError("--window " + std::to_string(window) + " is outside [2, max_seq = " +
                             std::to_string(max_seq) + "]");
        }
        if (a.stride > window - 1) {
            throw UsageError("--stride " + std::to_string(a.stride) +
                             ": the stride must be at most the window length - 1 = " + std::to_string(window - 1) +
                             " (the window is the model's max_seq, " + std::to_string(max_seq) +
                             "; --window sets another)");
        }
        return static_cast<size_t>(window);
    }
    int64_t ctx = a.ctx;
    if (ctx == 0) ctx = std::min(kDefaultLlamaContext, max_seq) / 2 * 2;
    if (ctx > max_seq) {
        throw UsageError("--ctx " + std::to_string(ctx) + ": above the model's max_seq = " + std::to_string(max_seq));
    }
    if (ctx < 4) throw UsageError("the model's max_seq = " + std::to_string(max_seq) + " is too short for chunks of 4");
    if (a.bos >= p.vocab) {
        throw UsageError("--bos " + std::to_string(a.bos) + " is outside the vocabulary [0, " +
                         std::to_string(p.vocab) + ")");
    }
    return static_cast<size_t>(ctx);
}

// The progress of a convention's scoring calls: the running perplexity takes in the passes each report completes,
// then the tool's own progress (the bar or the log lines) hears of the whole run's tokens.
struct ScoreProgress {
    tl_progress_fn inner = nullptr;
    void *inner_user = nullptr;
    tl::cli::RunningPerplexity *running = nullptr;
    uint64_t done_before = 0, total = 0;
};

int32_t score_progress(void *user, uint64_t done, uint64_t) {
    auto &p = *static_cast<ScoreProgress *>(user);
    p.running->take_in(done);
    return p.inner != nullptr ? p.inner(p.inner_user, p.done_before + done, p.total) : 0;
}

// The NLL buffer of one tl_score_batch call holds at most about this many floats (64 MiB): a long text in a small
// stride is scored in several calls.
constexpr size_t kMaxCallNlls = size_t{1} << 24;

// What the scoring calls of a convention add up to.
struct Scored {
    tl_score_result r{};
    std::vector<float> nll;  // the scored tokens' NLLs, pass after pass (default windows: all tokens' but the first)
    std::vector<double> running;  // batch conventions: the perplexity over passes 1..k, from the library's sums
    std::vector<int32_t> top_ids;  // --top-k: each position's k most likely tokens, as tl_score lays them out
    std::vector<float> top_logprobs;
};

// The default convention: one tl_score call, windows overlapping by one token.
Scored score_windows(const tl_model *model, const std::vector<int32_t> &tokens, tl_score_options opts,
                     tl::cli::RunningPerplexity &running, size_t n_passes, int top_k) {
    Scored s;
    // Always taken (4 bytes a token, as much as the tokens): the perplexity's standard error needs every NLL.
    s.nll.resize(tokens.size() - 1);
    opts.token_nll = s.nll.data();
    opts.token_nll_len = s.nll.size();
    if (top_k > 0) {
        s.top_ids.resize(s.nll.size() * static_cast<size_t>(top_k));
        s.top_logprobs.resize(s.top_ids.size());
        opts.top_k = top_k;
        opts.top_ids = s.top_ids.data();
        opts.top_logprobs = s.top_logprobs.data();
        opts.top_len = s.top_ids.size();
    }
    ScoreProgress progress{opts.progress, opts.progress_user_data, &running, 0, tokens.size() - 1};
    running.begin_call(n_passes, s.nll.data(), tl::cli::RunningPerplexity::Layout::Windows);
    opts.progress = score_progress;
    opts.progress_user_data = &progress;
    check(tl_score_result_init(&s.r, sizeof s.r), "score result");
    check(tl_score(model, tokens.data(), tokens.size(), &opts, &s.r), "score");
    running.take_in(s.r.tokens_scored);
    return s;
}

// Stride and llama-perplexity: each pass a sequence of tl_score_batch, in calls of at most kMaxCallNlls NLLs.
Scored score_passes(const tl_model *model, const std::vector<int32_t> &tokens, const std::vector<tl::cli::Pass> &passes,
                    tl_score_options opts, tl::cli::RunningPerplexity &running) {
    Scored s;
    check(tl_score_result_init(&s.r, sizeof s.r), "score result");
    uint64_t total = 0;
    for (const tl::cli::Pass &p : passes) total += p.scored();
    s.nll.reserve(static_cast<size_t>(total));
    s.running.reserve(passes.size());
    ScoreProgress progress{opts.progress, opts.progress_user_data, &running, 0, total};
    opts.progress = score_progress;
    opts.progress_user_data = &progress;
    std::vector<float> call_nll;
    double nll_sum = 0;
    uint64_t scored = 0;
    for (size_t first = 0; first < passes.size();) {
        size_t end = first, nlls = 0;
        while (end < passes.size() && (end == first || nlls + passes[end].length - 1 <= kMaxCallNlls)) {
            nlls += passes[end++].length - 1;
        }
        std::vector<tl_sequence> sequences;
        for (size_t i = first; i < end; ++i) {
            sequences.push_back(tl_sequence{tokens.data() + passes[i].start, passes[i].length, passes[i].n_context});
        }
        call_nll.assign(nlls, 0.0f);
        opts.token_nll = call_nll.data();
        opts.token_nll_len = call_nll.size();
        running.begin_call(end, call_nll.data(), tl::cli::RunningPerplexity::Layout::Sequences);
        std::vector<tl_sequence_score> scores(sequences.size());
        tl_score_result r;
        check(tl_score_result_init(&r, sizeof r), "score result");
        check(tl_score_batch(model, sequences.data(), sequences.size(), &opts, scores.data(), &r), "score");
        running.take_in(r.tokens_scored);
        size_t offset = 0;
        for (size_t i = first; i < end; ++i) {
            const tl::cli::Pass &p = passes[i];
            for (size_t j = p.first_scored(); j < p.length; ++j) s.nll.push_back(call_nll[offset + j - 1]);
            offset += p.length - 1;
            nll_sum += scores[i - first].nll_sum;
            scored += scores[i - first].tokens_scored;
            s.running.push_back(std::exp(nll_sum / static_cast<double>(scored)));
        }
        if (first == 0) s.r.backend = r.backend;
        s.r.n_windows += r.n_windows;
        s.r.seconds += r.seconds;
        s.r.setup_seconds += r.setup_seconds;
        s.r.graph_capture_seconds += r.graph_capture_seconds;
        for (auto [sum, add] :
             {std::pair{&s.r.gemm_marlin_fused, r.gemm_marlin_fused},
              {&s.r.gemm_marlin_correction, r.gemm_marlin_correction},
              {&s.r.gemm_dequant_cublas, r.gemm_dequant_cublas}, {&s.r.gemm_fp16_body, r.gemm_fp16_body},
              {&s.r.gemm_native, r.gemm_native}, {&s.r.gemm_dense_cublas, r.gemm_dense_cublas},
              {&s.r.gemm_fallbacks, r.gemm_fallbacks}}) {
            *sum += add;
        }
        progress.done_before += r.tokens_scored;
        first = end;
    }
    s.r.nll_sum = nll_sum;
    s.r.tokens_scored = scored;
    s.r.perplexity = std::exp(nll_sum / static_cast<double>(scored));
    return s;
}

// Position `k`'s top-k entries of tl_score's layout as [[id, logprob], ...].
nlohmann::ordered_json top_entries(const std::vector<int32_t> &ids, const std::vector<float> &logprobs, size_t k,
                                   int top_k) {
    nlohmann::ordered_json entries = nlohmann::ordered_json::array();
    for (int i = 0; i < top_k; ++i) {
        const size_t at = k * static_cast<size_t>(top_k) + static_cast<size_t>(i);
        entries.push_back(nlohmann::ordered_json::array({ids[at], logprobs[at]}));
    }
    return entries;
}

int cmd_score(const ScoreArgs &a) {
    using tl::cli::Convention;
    // Opened before any work, so that a path that cannot be written costs none.
    std::ofstream per_token_out;
    if (!a.per_token.empty()) {
        per_token_out.open(a.per_token);
        if (!per_token_out) throw CliError("cannot open '" + a.per_token + "' for writing: " + errno_text(errno));
    }
    const auto load_start = std::chrono::steady_clock::now();
    ModelHandle h(a.model_path);
    apply_dispatch_environment(h.model);
    const double load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
    tl_model_properties properties;
    properties.struct_size = sizeof properties;
    check(tl_model_info(h.model, &properties), "info");
    const size_t length = convention_length(a, properties);  // the window or chunk length
    const int32_t tokenizer = tokenizer_kind(h.model);
    std::vector<int32_t> tokens = input_tokens(h.model, a.token_file, a.text, a.max_tokens);
    if (tokens.size() < 2) throw CliError("need at least 2 tokens to score, got " + std::to_string(tokens.size()));

    std::vector<tl::cli::Pass> passes;
    std::vector<int32_t> chunk_tokens;  // --bos: the tokens with each chunk's first replaced
    const char *unit = "window";
    switch (a.convention) {
    case Convention::Windows: passes = tl::cli::overlap_windows(tokens.size(), length); break;
    case Convention::Stride:
        passes = tl::cli::stride_windows(tokens.size(), length, static_cast<size_t>(a.stride));
        break;
    case Convention::LlamaPerplexity:
        unit = "chunk";
        // llama-perplexity's own rule: at least two chunks.
        if (tokens.size() < 2 * length) {
            throw CliError("--llama-perplexity with chunks of " + std::to_string(length) + " tokens needs at least " +
                           std::to_string(2 * length) + " tokens (two chunks, as llama-perplexity asks); the input " +
                           "has " + std::to_string(tokens.size()) + ": give a smaller --ctx");
        }
        passes = tl::cli::llama_chunks(tokens.size(), length);
        if (a.bos >= 0) {
            chunk_tokens = tokens;
            for (const tl::cli::Pass &p : passes) chunk_tokens[p.start] = static_cast<int32_t>(a.bos);
        }
        break;
    }

    ProgressLog progress_log;
    tl::cli::RunningPerplexity running(passes);
    progress_log.running = &running;
    progress_log.unit = unit;
    tl_score_options opts =
        scoring_options(a.backend, a.threads, a.activations, a.quiet, a.progress_interval, progress_log);
    opts.device = a.device;
    progress_log.start = progress_log.last = std::chrono::steady_clock::now();
    Scored s;
    if (a.convention == Convention::Windows) {
        opts.window = a.window;
        s = score_windows(h.model, tokens, opts, running, passes.size(), a.top_k);
    } else {
        s = score_passes(h.model, chunk_tokens.empty() ? tokens : chunk_tokens, passes, opts, running);
    }
    const tl_score_result &r = s.r;
    const double ppl_stderr = perplexity_stderr(r.perplexity, s.nll);
    // The one-time work (device copy and packing, graph captures) is reported apart from the scoring itself.
    const double scoring_seconds = r.seconds - r.setup_seconds - r.graph_capture_seconds;
    const double tokens_per_second = static_cast<double>(r.tokens_scored) / scoring_seconds;
    if (!a.per_token.empty()) {
        // Each scored token: its position in the input, the token, its NLL.
        size_t k = 0;
        for (const tl::cli::Pass &p : passes) {
            for (size_t j = p.first_scored(); j < p.length && k < s.nll.size(); ++j, ++k) {
                per_token_out << (p.start + j) << '\t' << tokens[p.start + j] << '\t' << s.nll[k];
                // --top-k: then the position's k most likely tokens, id:logprob, most likely first.
                for (int i = 0; i < a.top_k; ++i) {
                    const size_t at = k * static_cast<size_t>(a.top_k) + static_cast<size_t>(i);
                    per_token_out << '\t' << s.top_ids[at] << ':' << s.top_logprobs[at];
                }
                per_token_out << '\n';
            }
        }
        per_token_out.flush();
        if (!per_token_out) throw CliError("cannot write '" + a.per_token + "'");
    }
    nlohmann::ordered_json convention = {{"name", tl::cli::convention_name(a.convention)}};
    switch (a.convention) {
    case Convention::Windows: convention["window"] = length; break;
    case Convention::Stride:
        convention["window"] = length;
        convention["stride"] = a.stride;
        break;
    case Convention::LlamaPerplexity:
        convention["ctx"] = length;
        convention["chunks"] = passes.size();
        convention["scored_per_chunk"] = length - length / 2 - 1;
        convention["bos"] = a.bos >= 0 ? nlohmann::ordered_json(a.bos) : nlohmann::ordered_json();
        break;
    }
    if (a.json) {
        nlohmann::ordered_json j = {
            {"model", a.model_path},
            {"text", a.token_file.empty() ? nlohmann::ordered_json(a.text) : nlohmann::ordered_json()},
            {"token_file", a.token_file.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(a.token_file)},
            {"tokenizer",
             a.token_file.empty() ? nlohmann::ordered_json(tokenizer_name(tokenizer)) : nlohmann::ordered_json()},
            {"convention", convention},
            {"tokens", tokens.size()}, {"tokens_scored", r.tokens_scored}, {"nll_sum", r.nll_sum},
            {"nll_mean", r.nll_sum / static_cast<double>(r.tokens_scored)}, {"perplexity", r.perplexity},
            {"perplexity_stderr", ppl_stderr},  // NaN (fewer than 2 tokens scored) is written as null
            {"backend", r.backend == TL_BACKEND_CUDA ? "cuda" : "cpu"}, {"activations", a.activations},
            {"windows", r.n_windows}, {"seconds", r.seconds}, {"load_seconds", load_seconds},
            {"setup_seconds", r.setup_seconds},
            {"graph_capture_seconds", r.graph_capture_seconds}, {"scoring_seconds", scoring_seconds},
            {"tokens_per_second", tokens_per_second},
            {"gemm_paths",
             {{"marlin_fused", r.gemm_marlin_fused}, {"marlin_correction", r.gemm_marlin_correction},
              {"dequant_cublas", r.gemm_dequant_cublas}, {"fp16_body", r.gemm_fp16_body},
              {"native", r.gemm_native}, {"dense_cublas", r.gemm_dense_cublas}, {"fallbacks", r.gemm_fallbacks}}}};
        // llama-perplexity's [k] values: the perplexity over chunks 1..k.
        if (a.convention == Convention::LlamaPerplexity) j["running_perplexity"] = s.running;
        if (a.top_k > 0) {  // per scored token (the input's tokens 1..n-1): [[id, logprob], ...], most likely first
            j["top_k"] = a.top_k;
            nlohmann::ordered_json top = nlohmann::ordered_json::array();
            for (size_t k = 0; k < s.nll.size(); ++k) top.push_back(top_entries(s.top_ids, s.top_logprobs, k, a.top_k));
            j["top_logprobs"] = std::move(top);
        }
        std::printf("%s\n", j.dump().c_str());
        return 0;
    }

    if (a.convention == Convention::LlamaPerplexity) {
        // As llama-perplexity prints them: the running perplexity after each chunk, then its final line.
        std::string line;
        char buf[48];
        for (size_t k = 0; k < s.running.size(); ++k) {
            std::snprintf(buf, sizeof buf, "[%zu]%.4f,", k + 1, s.running[k]);
            line += buf;
        }
        std::printf("%s\nFinal estimate: PPL = %.4f +/- %.5f\n", line.c_str(), r.perplexity, ppl_stderr);
    }
    std::printf("tokens        %llu scored (%zu in, %d %s%s)\n", static_cast<unsigned long long>(r.tokens_scored),
                tokens.size(), r.n_windows, unit, r.n_windows == 1 ? "" : "s");
    if (a.convention == Convention::Stride) {
        std::printf("convention    stride %lld: windows of %zu tokens advancing by %lld, each after the first scoring "
                    "its last %lld (Hugging Face)\n",
                    static_cast<long long>(a.stride), length, static_cast<long long>(a.stride),
                    static_cast<long long>(a.stride));
    } else if (a.convention == Convention::LlamaPerplexity) {
        std::printf("convention    llama-perplexity: chunks of %zu tokens, each scored alone, its last %zu scored%s\n",
                    length, length - length / 2 - 1,
                    a.bos >= 0 ? (", its first token replaced by " + std::to_string(a.bos)).c_str() : "");
    }
    std::printf("backend       %s\n", r.backend == TL_BACKEND_CUDA ? "cuda" : "cpu");
    if (a.activations != "fp16") std::printf("activations   %s\n", a.activations.c_str());
    if (r.backend == TL_BACKEND_CUDA) {
        std::printf("gemm paths    marlin_fused %llu, marlin_correction %llu, dequant_cublas %llu, fp16_body %llu, "
                    "native %llu, dense_cublas %llu, fallbacks %llu\n",
                    static_cast<unsigned long long>(r.gemm_marlin_fused),
                    static_cast<unsigned long long>(r.gemm_marlin_correction),
                    static_cast<unsigned long long>(r.gemm_dequant_cublas),
                    static_cast<unsigned long long>(r.gemm_fp16_body), static_cast<unsigned long long>(r.gemm_native),
                    static_cast<unsigned long long>(r.gemm_dense_cublas),
                    static_cast<unsigned long long>(r.gemm_fallbacks));
    }
    std::printf("nll           %.6f nats/token\n", r.nll_sum / static_cast<double>(r.tokens_scored));
    std::printf("perplexity    %.4f\n", r.perplexity);
    std::printf("PPL = %.4f ± %.5f\n", r.perplexity, ppl_stderr);
    if (r.backend == TL_BACKEND_CUDA) {
        std::printf("time          load %.3f s, GPU setup %.3f s (copy + pack), graph capture %.3f s, scoring %.3f s "
                    "(%.1f tokens/s)\n",
                    load_seconds, r.setup_seconds, r.graph_capture_seconds, scoring_seconds, tokens_per_second);
    } else {
        std::printf("time          load %.3f s, scoring %.3f s (%.1f tokens/s)\n", load_seconds, scoring_seconds,
                    tokens_per_second);
    }
    return 0;
}

// A copy of a model with another tokenizer (a tokenizer.json or tokenizer.model file), or with none ("none").
int cmd_set_tokenizer(const std::string &model_path, const std::string &tokenizer_file, const std::string &out) {
    auto model = tl::load_model(model_path, tl::LoadOptions{});
    tl::set_tokenizer(*model, tokenizer_file == "none" ? nullptr : tl::text::read_tokenizer_file(tokenizer_file));
    tl::save_model(out, *model);
    std::printf("wrote %s: tokenizer %s\n", out.c_str(),
                model->tokenizer ? tl::text::kind_name(model->tokenizer->kind()) : "none (one token per byte)");
    return 0;
}

// A text's token ids by the model's tokenizer, space-separated on one line: what score --tokens reads.
int cmd_tokenize(const std::string &model_path, const std::string &text) {
    ModelHandle h(model_path);
    const std::string bytes = read_text(text, 0);
    const std::vector<int32_t> ids =
        tokenizer_kind(h.model) == TL_TOKENIZER_BYTES ? byte_tokens(bytes) : tokenize(h.model, bytes);
    std::string line;
    for (size_t i = 0; i < ids.size(); ++i) {
        if (i > 0) line.push_back(' ');
        line += std::to_string(ids[i]);
        if (line.size() >= (size_t{1} << 16)) {
            std::fwrite(line.data(), 1, line.size(), stdout);
            line.clear();
        }
    }
    line.push_back('\n');
    std::fwrite(line.data(), 1, line.size(), stdout);
    if (std::fflush(stdout) != 0) throw CliError("cannot write the ids to stdout: " + errno_text(errno));
    return 0;
}

// ---- compare: two models on one text ----

// What `compare` was asked.
struct CompareArgs {
    std::string reference, test, text, token_file, backend = "auto", per_token;
    std::string activations = "fp16", reference_activations = "fp16";  // the test's, the reference's
    int threads = 0, device = 0, window = 0;
    bool quiet = false, json = false;
    uint64_t max_tokens = 0;
    double progress_interval = 5;
};

int cmd_compare(const CompareArgs &a) {
    std::ofstream per_token_out;  // opened before any work, as score's
    if (!a.per_token.empty()) {
        per_token_out.open(a.per_token);
        if (!per_token_out) throw CliError("cannot open '" + a.per_token + "' for writing: " + errno_text(errno));
    }
    ModelHandle reference(a.reference), test(a.test);
    apply_dispatch_environment(reference.model);
    apply_dispatch_environment(test.model);
    // The text through the reference's tokenizer (the library checks that both models share the vocabulary).
    const std::vector<int32_t> tokens = input_tokens(reference.model, a.token_file, a.text, a.max_tokens);
    if (tokens.size() < 2) throw CliError("need at least 2 tokens to compare, got " + std::to_string(tokens.size()));

    ProgressLog progress_log;
    const tl_score_options run =
        scoring_options(a.backend, a.threads, a.activations, a.quiet, a.progress_interval, progress_log);
    tl_compare_options opts;
    check(tl_compare_options_init(&opts, sizeof opts), "compare options");
    opts.backend = run.backend;
    opts.n_threads = run.n_threads;
    opts.progress = run.progress;
    opts.progress_user_data = run.progress_user_data;
    opts.device = a.device;
    opts.window = a.window;
    opts.activations_test = run.activations;
    opts.activations_reference = kActivations.at(a.reference_activations);
    // Per-position values only when written out: the library keeps its own for the summary.
    const size_t n = tokens.size() - 1;
    std::vector<float> kl, nll_ref, nll_test;
    std::vector<uint8_t> match;
    if (!a.per_token.empty()) {
        kl.resize(n), nll_ref.resize(n), nll_test.resize(n), match.resize(n);
        opts.token_kl = kl.data(), opts.token_nll_reference = nll_ref.data(), opts.token_nll_test = nll_test.data();
        opts.token_top1_match = match.data(), opts.token_len = n;
    }
    tl_compare_result r;
    check(tl_compare_result_init(&r, sizeof r), "compare result");
    progress_log.start = progress_log.last = std::chrono::steady_clock::now();
    check(tl_score_compare(reference.model, test.model, tokens.data(), tokens.size(), &opts, &r), "compare");
    if (!a.per_token.empty()) {
        // Each compared token: its position, the token, KL, the reference's and the test's NLL, top-1 agreement.
        for (size_t i = 0; i < n; ++i) {
            per_token_out << (i + 1) << '\t' << tokens[i + 1] << '\t' << kl[i] << '\t' << nll_ref[i] << '\t'
                          << nll_test[i] << '\t' << static_cast<int>(match[i]) << '\n';
        }
        per_token_out.flush();
        if (!per_token_out) throw CliError("cannot write '" + a.per_token + "'");
    }
    if (a.json) {
        const nlohmann::ordered_json j = {
            {"reference", a.reference}, {"test", a.test},
            {"text", a.token_file.empty() ? nlohmann::ordered_json(a.text) : nlohmann::ordered_json()},
            {"token_file", a.token_file.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(a.token_file)},
            {"tokens", tokens.size()}, {"tokens_scored", r.tokens_scored}, {"windows", r.n_windows},
            {"backend", r.backend == TL_BACKEND_CUDA ? "cuda" : "cpu"},
            {"activations_reference", a.reference_activations}, {"activations_test", a.activations},
            {"perplexity_reference", r.perplexity_reference}, {"perplexity_test", r.perplexity_test},
            {"delta_perplexity", r.delta_perplexity}, {"perplexity_ratio", r.perplexity_ratio},
            {"nll_correlation", r.nll_correlation},
            {"kl_mean", r.kl_mean}, {"kl_stderr", r.kl_stderr}, {"kl_median", r.kl_median}, {"kl_p90", r.kl_p90},
            {"kl_p99", r.kl_p99}, {"kl_p999", r.kl_p999}, {"kl_max", r.kl_max}, {"kl_min", r.kl_min},
            {"top1_agreement", r.top1_agreement}, {"seconds", r.seconds}, {"setup_seconds", r.setup_seconds}};
        std::printf("%s\n", j.dump().c_str());
        return 0;
    }
    // llama-perplexity's KL-divergence report, in its order and wording where it has one.
    std::printf("tokens        %llu compared (%zu in, %d window%s)\n",
                static_cast<unsigned long long>(r.tokens_scored), tokens.size(), r.n_windows,
                r.n_windows == 1 ? "" : "s");
    std::printf("backend       %s\n", r.backend == TL_BACKEND_CUDA ? "cuda" : "cpu");
    std::printf("reference     %s%s: PPL %.4f\n", a.reference.c_str(),
                activations_note(a.reference_activations).c_str(), r.perplexity_reference);
    std::printf("test          %s%s: PPL %.4f\n", a.test.c_str(), activations_note(a.activations).c_str(),
                r.perplexity_test);
    std::printf("PPL(test) - PPL(ref)   %+.4f\n", r.delta_perplexity);
    std::printf("PPL(test) / PPL(ref)   %.5f\n", r.perplexity_ratio);
    std::printf("Cor(NLL ref, NLL test) %.2f%%\n", 100.0 * r.nll_correlation);
    std::printf("Mean    KLD: %10.6f ± %10.6f\n", r.kl_mean, r.kl_stderr);
    std::printf("Maximum KLD: %10.6f\n", r.kl_max);
    std::printf("99.9%%   KLD: %10.6f\n", r.kl_p999);
    std::printf("99.0%%   KLD: %10.6f\n", r.kl_p99);
    std::printf("90.0%%   KLD: %10.6f\n", r.kl_p90);
    std::printf("Median  KLD: %10.6f\n", r.kl_median);
    std::printf("Minimum KLD: %10.6f\n", r.kl_min);
    std::printf("Same top p: %6.3f %%\n", 100.0 * r.top1_agreement);
    std::printf("time          %.3f s (GPU setup %.3f s)\n", r.seconds, r.setup_seconds);
    return 0;
}

// ---- score-batch: requests as JSON lines ----

// Requests are scored in chunks of about this many tokens, each chunk's results written before the next is read:
// memory stays bounded whatever the input's length, and results stream out as they are ready.
constexpr size_t kChunkTokens = size_t{1} << 20;

// A chunk's progress as part of the whole run: the tokens of earlier chunks count as done, and the total is what
// has been read so far.
struct ChunkProgress {
    tl_progress_fn inner = nullptr;
    void *inner_user = nullptr;
    uint64_t done_before = 0;
};

int32_t chunk_progress(void *user, uint64_t done, uint64_t total) {
    const auto &p = *static_cast<ChunkProgress *>(user);
    return p.inner(p.inner_user, p.done_before + done, p.done_before + total);
}

// One input line's request, or why it cannot be scored.
struct PendingRequest {
    tl::cli::BatchRequest request;
    size_t line = 0;
    std::string error;  // empty: scored
    size_t context_truncated = 0;
    tl_sequence_score score{};
    std::vector<int32_t> top_ids;  // --top-k: the scored positions' k most likely tokens
    std::vector<float> top_logprobs;
};

// The sequence a library message names ("sequences[i]..."), or SIZE_MAX.
size_t named_sequence(const std::string &message) {
    const std::string key = "sequences[";
    const size_t at = message.find(key);
    if (at == std::string::npos) return SIZE_MAX;
    return std::strtoull(message.c_str() + at + key.size(), nullptr, 10);
}

// Scores the chunk's valid requests in one tl_score_batch call. A request the library refuses (a token outside the
// vocabulary, one longer than max_seq) gets the library's message as its error, and the others are scored again
// without it; any other failure ends the run.
void score_chunk(const tl_model *model, const tl_score_options &base, std::vector<PendingRequest> &chunk,
                 ChunkProgress &progress) {
    tl_score_options opts = base;
    if (opts.progress != nullptr) {
        progress.inner = base.progress;
        progress.inner_user = base.progress_user_data;
        opts.progress = chunk_progress;
        opts.progress_user_data = &progress;
    }
    for (;;) {
        std::vector<size_t> members;
        std::vector<tl_sequence> sequences;
        for (size_t i = 0; i < chunk.size(); ++i) {
            if (!chunk[i].error.empty()) continue;
            members.push_back(i);
            const tl::cli::BatchRequest &r = chunk[i].request;
            sequences.push_back(tl_sequence{r.tokens.data(), r.tokens.size(), r.n_context});
        }
        if (sequences.empty()) return;
        std::vector<tl_sequence_score> scores(sequences.size());
        const size_t k = static_cast<size_t>(opts.top_k);
        std::vector<int32_t> top_ids;
        std::vector<float> top_logprobs;
        if (k > 0) {  // every prediction's, context included, laid out as token_nll
            size_t positions = 0;
            for (const tl_sequence &q : sequences) positions += q.n_tokens > 0 ? q.n_tokens - 1 : 0;
            top_ids.resize(positions * k);
            top_logprobs.resize(top_ids.size());
            opts.top_ids = top_ids.data();
            opts.top_logprobs = top_logprobs.data();
            opts.top_len = top_ids.size();
        }
        const tl_status status = tl_score_batch(model, sequences.data(), sequences.size(), &opts, scores.data(), nullptr);
        if (status == TL_OK) {
            size_t offset = 0;  // of the sequence's first prediction
            for (size_t j = 0; j < members.size(); ++j) {
                PendingRequest &p = chunk[members[j]];
                p.score = scores[j];
                progress.done_before += scores[j].tokens_scored;
                if (k > 0) {  // the scored positions only: predictions of tokens first_scored .. n - 1
                    const size_t first = std::max<size_t>(sequences[j].n_context, 1) - 1;
                    const size_t begin = (offset + first) * k, end = (offset + sequences[j].n_tokens - 1) * k;
                    p.top_ids.assign(top_ids.begin() + begin, top_ids.begin() + end);
                    p.top_logprobs.assign(top_logprobs.begin() + begin, top_logprobs.begin() + end);
                }
                offset += sequences[j].n_tokens - 1;
            }
            return;
        }
        const std::string message = tl_last_error_message();
        const size_t j = named_sequence(message);
        if (status != TL_ERR_INVALID_ARGUMENT || j >= members.size()) {
            throw CliError(std::string("score-batch: ") + tl_status_string(status) + ": " + message);
        }
        // The library numbers the sequences of this call; the user knows a request by its input line.
        const std::string key = "sequences[" + std::to_string(j) + "].";
        chunk[members[j]].error = message.compare(0, key.size(), key) == 0 ? message.substr(key.size()) : message;
    }
}

int cmd_score_batch(const std::string &model_path, const std::string &input, const std::string &output,
                    const std::string &backend, int threads, const std::string &activations, int device, bool quiet,
                    double progress_interval, int64_t bos_flag, int top_k) {
    const std::string input_name = input == "-" ? "stdin" : "'" + input + "'";
    std::FILE *in = stdin;
    if (input != "-") {
        in = std::fopen(input.c_str(), "rb");
        if (in == nullptr) throw CliError("cannot open input file '" + input + "': " + errno_text(errno));
    }
    const struct Closer {
        std::FILE *file;
        ~Closer() {
            if (file != stdin) std::fclose(file);
        }
    } closer{in};
    // The output is opened before any scoring, so that a path that cannot be written costs no work.
    std::ofstream file;
    if (output != "-") {
        file.open(output);
        if (!file) throw CliError("cannot open output file '" + output + "': " + errno_text(errno));
    }
    std::ostream &out = output == "-" ? std::cout : file;
    ModelHandle h(model_path);
    apply_dispatch_environment(h.model);
    tl_model_properties properties;
    properties.struct_size = sizeof properties;
    check(tl_model_info(h.model, &properties), "info");
    const size_t max_seq = static_cast<size_t>(properties.max_seq);
    if (top_k > properties.vocab) {
        throw UsageError("--top-k " + std::to_string(top_k) + " is above the model's vocab " +
                         std::to_string(properties.vocab));
    }
    // An empty context's stand-in: --bos, else the model file's beginning-of-text token (a request's "bos" wins).
    const int64_t bos = bos_flag >= 0 ? bos_flag : properties.bos_token_id;
    // Text fields through the model's tokenizer; a byte-level model's are read one token per byte.
    tl::cli::TextEncoder encode;
    if (tokenizer_kind(h.model) != TL_TOKENIZER_BYTES) {
        encode = [&h](const std::string &s) { return tokenize(h.model, s); };
    }

    ProgressLog progress_log;
    tl_score_options opts = scoring_options(backend, threads, activations, quiet, progress_interval, progress_log);
    opts.device = device;
    opts.top_k = top_k;
    ChunkProgress progress;
    size_t index = 0, failed = 0;
    std::vector<PendingRequest> chunk;
    size_t chunk_tokens = 0;
    const auto flush = [&] {
        score_chunk(h.model, opts, chunk, progress);
        for (PendingRequest &p : chunk) {
            nlohmann::ordered_json j = {{"index", index}};
            if (!p.error.empty()) j["line"] = p.line;
            j.update(p.request.echo);  // the caller's own keys, after the index
            if (p.error.empty()) {
                const tl_sequence_score &s = p.score;
                const double mean = s.nll_sum / static_cast<double>(s.tokens_scored);
                j.update(nlohmann::ordered_json{{"nll_sum", s.nll_sum},     {"tokens_scored", s.tokens_scored},
                                                {"mean_nll", mean},         {"perplexity", std::exp(mean)},
                                                {"greedy", s.greedy != 0}});
                if (p.context_truncated > 0) j["context_truncated"] = p.context_truncated;
                if (top_k > 0) {  // per scored token: [[id, logprob], ...], most likely first
                    nlohmann::ordered_json top = nlohmann::ordered_json::array();
                    for (size_t k = 0; k < p.top_ids.size() / static_cast<size_t>(top_k); ++k) {
                        top.push_back(top_entries(p.top_ids, p.top_logprobs, k, top_k));
                    }
                    j["top_logprobs"] = std::move(top);
                }
            } else {
                ++failed;
                std::fprintf(stderr, "tinyloop: %s line %zu: %s\n", input_name.c_str(), p.line, p.error.c_str());
                j["error"] = p.error;
            }
            out << j.dump() << '\n';
            ++index;
        }
        out.flush();
        if (!out) {
            throw CliError(output == "-" ? std::string("cannot write the results to stdout")
                                         : "cannot write '" + output + "'");
        }
        chunk.clear();
        chunk_tokens = 0;
    };

    tl::cli::LineReader reader(in, tl::cli::kMaxRequestLineBytes);
    std::string line;
    progress_log.start = progress_log.last = std::chrono::steady_clock::now();
    try {
        while (reader.next(line)) {
            if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
            PendingRequest p;
            p.line = reader.line_number();
            try {
                p.request = tl::cli::parse_request(line, encode, bos);
                p.context_truncated = tl::cli::truncate_context(p.request, max_seq);
            } catch (const tl::cli::RequestError &e) {
                p.error = e.what();
            }
            chunk_tokens += p.request.tokens.size();
            chunk.push_back(std::move(p));
            if (chunk_tokens >= kChunkTokens) flush();
        }
    } catch (const tl::cli::RequestError &e) {
        flush();  // the lines before the bad one still get their results
        throw CliError(input_name + ": " + e.what());
    }
    if (reader.failed()) {
        flush();
        throw CliError("cannot read " + input_name + ": " + errno_text(errno));
    }
    flush();
    if (failed > 0) {
        throw CliError(std::to_string(failed) + " of " + std::to_string(index) + " requests failed; their output " +
                       "lines hold \"error\"");
    }
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    CLI::App app{"tinyloop: inspect, create, quantize and score .tinyloop INT4 / INT8 models", "tinyloop"};
    app.require_subcommand(1);
    app.footer(kExitStatus);  // before add_subcommand: each subcommand copies its parent's footer
    app.set_version_flag("-V,--version", [] { return version_text(); }, "print the library version and build, then exit");
    // Every usage error names the tool, as the tool's other messages do.
    app.failure_message([](const CLI::App *, const CLI::Error &e) {
        return std::string("tinyloop: ") + e.what() + "\nRun with --help for more information.\n";
    });

    std::string model_path;
    bool json = false;
    auto *info = app.add_subcommand("info", "print a model's configuration and sizes");
    info->add_option("model", model_path, "the .tinyloop file")->required();
    info->add_flag("--json", json, "print one JSON object instead of the table");

    std::string out_path, preset = "tiny";
    tl::ModelConfig overrides;  // 0 = take the preset's value
    overrides.rope_theta = 0, overrides.norm_eps = 0, overrides.bits = 0;
    int group_size = -1;
    tl::SyntheticOptions synth;
    bool dense = false, symmetric = false;
    auto *make = app.add_subcommand("make-model", "write a deterministic synthetic model");
    make->add_option("--out", out_path, "output .tinyloop path")->required();
    make->add_option("--preset", preset, "tiny | demo | 2b")->capture_default_str();
    make->add_option("--d-model", overrides.d_model);
    make->add_option("--n-heads", overrides.n_heads);
    make->add_option("--head-dim", overrides.head_dim);
    make->add_option("--ffn", overrides.ffn);
    make->add_option("--vocab", overrides.vocab);
    make->add_option("--pre", overrides.pre);
    make->add_option("--loops", overrides.loops);
    make->add_option("--max-seq", overrides.max_seq);
    make->add_option("--group-size", group_size, "0 = per row");
    make->add_option("--bits", overrides.bits, "code width, 4 (the preset's) or 8 (INT8: symmetric, W = q * s)")
        ->check(CLI::IsMember({4, 8}));
    make->add_option("--seed", synth.seed)->capture_default_str();
    make->add_flag("--dense", dense, "store linears unquantized (F32)");
    make->add_flag("--symmetric", symmetric, "symmetric instead of asymmetric min-max");
    make->add_flag("--quantize-head", synth.quantize_head, "a quantized head instead of one tied to the embedding");
    make->add_flag("--frac4", synth.frac4, "write frac4 channels");
    make->add_flag("--sign-bit", synth.sign_bit, "write sign_bit channels");

    // A count where 0 means "all": a negative value is a usage error, not wrapped or passed on.
    const CLI::Validator non_negative(
        [](std::string &value) {
            return !value.empty() && value.front() == '-' ? "must be 0 (all) or a positive count, not " + value
                                                          : std::string();
        },
        "N >= 0");
    std::string in_path;
    std::string method = "minmax", calib_path;
    tl::QuantizeOptions quant;
    int quant_bits = 4;
    auto *quantize =
        app.add_subcommand("quantize", "quantize a model's dense linears to INT4 or INT8 (min-max or GPTQ)");
    quantize->add_option("input", in_path, "a .tinyloop/safetensors file with dense linears")->required();
    quantize->add_option("output", out_path, "the quantized .tinyloop to write")->required();
    quantize->add_option("--bits", quant_bits,
                         "code width: 4, or 8 (INT8, always symmetric: W = q * s, one scale per row or group)")
        ->check(CLI::IsMember({4, 8}))->capture_default_str();
    quantize->add_option("--method", method, "minmax | gptq")
        ->check(CLI::IsMember({"minmax", "gptq"}))->capture_default_str();
    quantize->add_option("--calib", calib_path, "GPTQ calibration text, read as bytes: one token per byte");
    quantize->add_option("--damp", quant.gptq.damp, "GPTQ dampening, a fraction of mean(diag H)")
        ->capture_default_str();
    quantize->add_flag("--act-order", quant.gptq.act_order, "GPTQ: quantize inputs by decreasing activation energy");
    quantize->add_option("--calib-window", quant.calib_window, "calibration window, 0 = the model's max_seq");
    quantize->add_option("--threads", quant.n_threads, "CPU threads for calibration, 0 = all")->check(non_negative);
    quantize->add_option("--group-size", group_size, "0 = per row (default 128)");
    quantize->add_flag("--symmetric", symmetric, "symmetric instead of asymmetric INT4 (INT8 always is)");
    quantize->add_flag("--quantize-head", quant.quantize_head, "also quantize a dense head");
    quantize->add_flag("--frac4", quant.frac4, "write frac4 cross-iteration rounding channels");
    quantize->add_flag("--sign-bit", quant.sign_bit, "write sign_bit cross-iteration rounding channels");

    std::string import_dir, import_out;
    int import_max_seq = 0;
    auto *import_cmd = app.add_subcommand(
        "import", "convert a Hugging Face-style checkpoint folder (dense, GPTQ or AWQ) to .tinyloop");
    import_cmd->footer(std::string("DIR holds config.json (a Llama, Mistral or Qwen2 config, or a looped model's with "
                                   "num_pre_layers and num_loops), optionally AutoGPTQ's quantize_config.json, and "
                                   "model.safetensors or model.safetensors.index.json; see docs/import.md, "
                                   "\"Importing Hugging Face-style checkpoints\" (what is read, refused and "
                                   "ignored). GPTQ checkpoints may be 4-bit or symmetric 8-bit. Dense linears stay "
                                   "dense (tinyloop quantize makes them INT4 or INT8).\n\n") +
                       kExitStatus);
    import_cmd->add_option("dir", import_dir, "the checkpoint folder")->required();
    import_cmd->add_option("--out", import_out, "the .tinyloop file to write")->required();
    import_cmd->add_option("--max-seq", import_max_seq, "max_seq of the model, 0 = config.json's max_position_embeddings")
        ->check(CLI::Range(0, INT32_MAX))->capture_default_str();

    std::string tokenizer_file;
    auto *set_tokenizer_cmd = app.add_subcommand(
        "set-tokenizer", "write a copy of a model with a tokenizer (tokenizer.json or tokenizer.model), or none");
    set_tokenizer_cmd->footer(std::string("TOKENIZER is a Hugging Face tokenizer.json holding a byte-level BPE (GPT-2, "
                                          "Llama 3, Qwen2 style) or a SentencePiece tokenizer.model, stored in the "
                                          "file; none removes a stored one (the model then reads one token per byte). "
                                          "Its ids must fit the model's vocab. See docs/format.md, \"The "
                                          "tokenizer\".\n\n") +
                              kExitStatus);
    set_tokenizer_cmd->add_option("model", model_path, "the .tinyloop file")->required();
    set_tokenizer_cmd->add_option("tokenizer", tokenizer_file, "a tokenizer.json or tokenizer.model, or none")
        ->required();
    set_tokenizer_cmd->add_option("--out", out_path, "the .tinyloop file to write (MODEL itself is fine)")->required();

    std::string text, token_file, backend = "auto", per_token;
    auto *tokenize_cmd = app.add_subcommand(
        "tokenize", "print a text's token ids by the model's tokenizer (the format score --tokens reads)");
    tokenize_cmd->add_option("model", model_path, "the .tinyloop file")->required();
    tokenize_cmd->add_option("--text", text, "a text file (1 GiB at most); - for stdin")->required();

    int threads = 0, window = 0;
    int64_t max_tokens = 0;  // signed, so that a negative value is refused rather than wrapped to "all"
    auto *score = app.add_subcommand("score", "perplexity of a text (by the model's tokenizer) or a token file");
    score->footer(std::string("--text goes through the model's tokenizer when its file stores one (a tokenizer.json "
                              "or tokenizer.model: tinyloop import, set-tokenizer), with no beginning-of-text token "
                              "added; otherwise each byte of the file is one token (0-255), as byte-level models "
                              "such as the demo model read text. For another tokenizer's ids use --tokens.\n\n") +
                  kExitStatus);
    score->add_option("model", model_path, "the .tinyloop file")->required();
    auto *text_opt = score->add_option("--text", text,
                                       "a text file, tokenized by the model (1 GiB at most); - for stdin");
    auto *tokens_opt =
        score->add_option("--tokens", token_file, "a file of whitespace-separated token ids; - for stdin");
    text_opt->excludes(tokens_opt);
    auto *window_opt =
        score->add_option("--window", window, "window length, 0 = the model's max_seq")->capture_default_str();
    score->add_option("--max-tokens", max_tokens, "score at most this many tokens (read only those), 0 = all")
        ->check(non_negative);
    score->add_option("--per-token", per_token, "write position, token and NLL per line to this file");
    score->add_flag("--json", json, "print one JSON object instead of the report");
    // The perplexity conventions (docs/quality.md, "Perplexity conventions"); the default is tl_score's windows,
    // which overlap by one token.
    int64_t stride = 0, llama_ctx = 0, bos = -1;
    bool llama = false;
    auto *stride_opt = score->add_option(
        "--stride", stride,
        "Hugging Face's sliding window: windows of --window tokens advancing by S (1 <= S <= window - 1); each "
        "window after the first scores only its last S tokens, the rest is context");
    auto *llama_opt = score->add_flag(
        "--llama-perplexity", llama,
        "llama.cpp's llama-perplexity: the text cut into chunks of --ctx N tokens, each scored on its own, only its "
        "second half scored (its last N/2 - 1 tokens, as llama.cpp counts); prints the running perplexity after each "
        "chunk ([1]x,[2]y,...) and 'Final estimate: PPL = x +/- y'");
    auto *ctx_opt = score->add_option("--ctx", llama_ctx,
                                      "--llama-perplexity's chunk length N, even, 4 <= N <= max_seq; 0 = 512 capped "
                                      "at the model's max_seq")
                        ->capture_default_str();
    auto *bos_opt = score->add_option("--bos", bos,
                                      "--llama-perplexity: replace the first token of each chunk by this id, as "
                                      "llama-perplexity does for models that use a beginning-of-text token "
                                      "(default: none, the chunk's own token)");
    int top_k = 0;
    score->add_option("--top-k", top_k,
                      "also give each scored token's K most likely tokens and their log-probabilities (1 <= K <= 20; "
                      "default windows only): in --per-token lines as id:logprob after the NLL, in --json as "
                      "\"top_logprobs\"")
        ->check(CLI::Range(1, 20));
    stride_opt->excludes(llama_opt);
    window_opt->excludes(llama_opt);
    ctx_opt->needs(llama_opt);
    bos_opt->needs(llama_opt);
    // What score and score-batch share: where they run and how often they report progress.
    double progress_interval = 5;
    int device = 0;
    bool quiet = false;
    const auto add_run_options = [&](CLI::App *sub, const std::string &zero_means) {
        sub->add_option("--device", device, "the CUDA device")->check(CLI::Range(0, INT32_MAX))
            ->capture_default_str();
        sub->add_flag("-q,--quiet", quiet, "no progress on stderr");
        sub->add_option("--backend", backend, "auto | cpu | cuda")
            ->check(CLI::IsMember({"auto", "cpu", "cuda"}))->capture_default_str();
        sub->add_option("--threads", threads, "CPU threads, 0 = all")->check(non_negative)->capture_default_str();
        sub->add_option("--progress-interval", progress_interval,
                        "seconds between progress lines when stderr is not a terminal (0 = " + zero_means + ")")
            ->check(CLI::Validator(
                [](std::string &value) {
                    char *end = nullptr;
                    const double v = std::strtod(value.c_str(), &end);
                    return end != value.c_str() && *end == '\0' && v >= 0 ? std::string()
                                                                         : "must be 0 or a positive number of seconds";
                },
                "S >= 0"))
            ->envname("TINYLOOP_PROGRESS_INTERVAL")->capture_default_str();
    };
    add_run_options(score, "after every window");
    std::string activations = "fp16";
    const std::string activations_help =
        "the precision of the transformer blocks' linear-layer inputs: fp16 (as computed), int8 or fp8 (each token "
        "quantized with its own scale; the GPU runs int8 on per-row INT8 models, docs/quality.md 'Activation "
        "precision')";
    const auto activations_check = CLI::IsMember({"fp16", "int8", "fp8"});
    score->add_option("--activations", activations, activations_help)->check(activations_check)->capture_default_str();

    std::string input = "-", output = "-";
    auto *score_batch = app.add_subcommand(
        "score-batch", "score many sequences (JSON lines: tokens, context + continuation, or text), one result each");
    score_batch->footer(
        std::string("Input: one JSON object per line (blank lines are skipped), each one request in one of three "
                    "forms:\n"
                    "  {\"tokens\": [ids], \"n_context\": k}          the first k are context only (k optional, "
                    "default 0)\n"
                    "  {\"context\": [ids], \"continuation\": [ids]}  the continuation is scored\n"
                    "  {\"text\": \"...\", \"context_text\": \"...\"}     strings through the model's tokenizer, "
                    "each on its own (one token per byte for a byte-level model; context_text optional)\n"
                    "The tokens after the context are scored (with no context, every token but the "
                    "first). Output: one JSON object per request, in order: {\"index\", \"nll_sum\", "
                    "\"tokens_scored\", \"mean_nll\", \"perplexity\", \"greedy\"}; greedy is true when every scored "
                    "token is its position's most likely one. Other keys of a request (\"id\", ...) are repeated after "
                    "\"index\". A context too long for the model's max_seq is cut from the front (the continuation "
                    "stays whole) and \"context_truncated\" gives the tokens cut. An empty context (\"context\": [] or "
                    "\"context_text\": \"\") stands for one beginning-of-text token: the request's \"bos\": ID, "
                    "else --bos, else the model file's bos_token_id; with none the line is refused. A line that is "
                    "not a valid request, or that the library refuses, gets "
                    "{\"index\", \"line\", \"error\"} instead, the other lines are still scored, and the exit "
                    "status is 1. Lines are at most 4 MiB; requests are scored in chunks of about 2^20 tokens, each "
                    "chunk's results written before the next is read.\n\n") +
        kExitStatus);
    score_batch->add_option("model", model_path, "the .tinyloop file")->required();
    score_batch->add_option("--input", input, "the requests, a JSON-lines file or - for stdin")->capture_default_str();
    score_batch->add_option("--output", output, "where the results go, a file or - for stdout")->capture_default_str();
    add_run_options(score_batch, "after every forward pass");
    score_batch->add_option("--activations", activations, activations_help)
        ->check(activations_check)
        ->capture_default_str();
    int64_t batch_bos = -1;
    int batch_top_k = 0;
    score_batch->add_option("--bos", batch_bos,
                            "the token that stands for an empty context (\"context\": [] or \"context_text\": "
                            "\"\") where a request names none (\"bos\": ID); default: the model file's "
                            "bos_token_id")
        ->check(CLI::Range(int64_t{0}, int64_t{INT32_MAX}));
    score_batch->add_option("--top-k", batch_top_k,
                            "also give each scored token's K most likely tokens and their log-probabilities "
                            "(1 <= K <= 20): \"top_logprobs\": [[[id, logprob], ...], ...] per scored token")
        ->check(CLI::Range(1, 20));

    CompareArgs compare_args;
    auto *compare = app.add_subcommand(
        "compare", "compare a test model with a reference on one text: KL divergence, top-1 agreement, perplexities");
    compare->footer(std::string("Both models score the same windows of the text (the shorter max_seq of the two by "
                                "default); at each position the test's predicted distribution is compared with the "
                                "reference's: KL(P_ref || P_test) (mean ± standard error, median, 90th, 99th, 99.9th "
                                "percentile, maximum, minimum), how often both predict the same most likely token, "
                                "each model's perplexity, their difference and ratio, and the correlation of the "
                                "two models' per-token NLLs (llama-perplexity's KL-divergence report). The models "
                                "must share a vocabulary; --text goes through the reference's tokenizer.\n\n") +
                    kExitStatus);
    compare->add_option("reference", compare_args.reference, "the reference .tinyloop file (a dense model, say)")
        ->required();
    compare->add_option("test", compare_args.test,
                        "the .tinyloop file compared with it (its INT4 or INT8 quantization)")
        ->required();
    auto *compare_text = compare->add_option("--text", compare_args.text, "a text file; - for stdin");
    auto *compare_tokens =
        compare->add_option("--tokens", compare_args.token_file, "a file of whitespace-separated token ids");
    compare_text->excludes(compare_tokens);
    compare->add_option("--window", compare_args.window, "window length, 0 = the shorter max_seq")
        ->check(non_negative)->capture_default_str();
    int64_t compare_max_tokens = 0;
    compare->add_option("--max-tokens", compare_max_tokens, "compare at most this many tokens, 0 = all")
        ->check(non_negative);
    compare->add_option("--per-token", compare_args.per_token,
                        "write position, token, KL, reference NLL, test NLL and top-1 agreement (0/1) per line");
    compare->add_flag("--json", compare_args.json, "print one JSON object instead of the report");
    add_run_options(compare, "after every window");
    compare->add_option("--activations", compare_args.activations,
                        "the test model's activation precision: fp16, int8 or fp8 (see score --activations); with the "
                        "same file as reference this measures what int8 or fp8 activations cost")
        ->check(activations_check)
        ->capture_default_str();
    compare->add_option("--reference-activations", compare_args.reference_activations,
                        "the reference model's activation precision: fp16, int8 or fp8")
        ->check(activations_check)
        ->capture_default_str();

    // `tinyloop help [SUBCOMMAND]` is `tinyloop [SUBCOMMAND] --help`.
    std::vector<std::string> args(argv + 1, argv + argc);
    if (!args.empty() && args[0] == "help") {
        args.erase(args.begin());
        args.resize(std::min<size_t>(args.size(), 1));
        const std::vector<const CLI::App *> subs = static_cast<const CLI::App &>(app).get_subcommands({});
        const bool known = args.empty() || std::any_of(subs.begin(), subs.end(), [&](const CLI::App *sub) {
                               return sub->check_name(args[0]);
                           });
        if (known) args.push_back("--help");  // else the unknown name is reported as such below
    }
    std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes the arguments last first
    try {
        app.parse(reversed);
    } catch (const CLI::ParseError &e) {
        if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
        // The top level has only flags, so its first other argument names the subcommand; CLI11 would only say
        // that a subcommand is required.
        for (const std::string &arg : args) {
            if (arg.empty() || arg[0] == '-') continue;
            const std::vector<const CLI::App *> subs = static_cast<const CLI::App &>(app).get_subcommands({});
            if (std::none_of(subs.begin(), subs.end(), [&](const CLI::App *s) { return s->check_name(arg); })) {
                std::string names;
                for (const CLI::App *s : subs) names += (names.empty() ? "" : ", ") + s->get_name();
                std::fprintf(stderr, "tinyloop: '%s' is not a subcommand; the subcommands are: %s\n", arg.c_str(),
                             names.c_str());
                return 2;
            }
            break;
        }
        app.exit(e);
        return 2;  // every usage error, not CLI11's own codes (105, 106, ...)
    }

    try {
        if (*info) return cmd_info(model_path, json);
        if (*make) {
            tl::ModelConfig c = preset_config(preset);
            for (auto [field, value] : {std::pair{&c.d_model, overrides.d_model}, {&c.n_heads, overrides.n_heads},
                                        {&c.head_dim, overrides.head_dim}, {&c.ffn, overrides.ffn},
                                        {&c.vocab, overrides.vocab}, {&c.pre, overrides.pre},
                                        {&c.loops, overrides.loops}, {&c.max_seq, overrides.max_seq}}) {
                if (value > 0) *field = value;
            }
            if (group_size >= 0) c.group_size = group_size;
            if (overrides.bits > 0) c.bits = overrides.bits;
            tl::validate_config(c);
            synth.quantized = !dense;
            synth.method = symmetric ? tl::QuantMethod::Symmetric : tl::QuantMethod::Asymmetric;
            tl::save_model(out_path, *tl::make_synthetic_model(c, synth));
            std::printf("wrote %s\n", out_path.c_str());
            return 0;
        }
        if (*quantize) {
            quant.quantizer = method == "gptq" ? tl::Quantizer::Gptq : tl::Quantizer::MinMax;
            if (quant.quantizer == tl::Quantizer::Gptq && calib_path.empty()) {
                throw UsageError("--method gptq needs --calib FILE");
            }
            quant.gptq.bits = quant_bits;
            quant.gptq.method = symmetric || quant_bits == 8 ? tl::QuantMethod::Symmetric : tl::QuantMethod::Asymmetric;
            quant.gptq.group_size = group_size >= 0 ? group_size : 128;
            if (isatty(STDERR_FILENO)) {
                quant.progress = [](const char *stage, uint64_t done, uint64_t total) {
                    const bool calibrating = std::string(stage) == "calibrate";
                    draw_bar(calibrating ? "calibrate " : "quantize  ", done, total,
                             calibrating ? "tokens" : "linears");
                };
            }
            tl::LoadOptions load;
            auto model = tl::load_model(in_path, load);
            // Calibration text through the model's tokenizer, one token per byte for a byte-level model.
            const std::string calib_text = calib_path.empty() ? std::string() : read_text(calib_path, 0);
            const std::vector<int32_t> calib = model->tokenizer ? model->tokenizer->encode(calib_text)
                                                                : byte_tokens(calib_text);
            tl::quantize_model(*model, quant, calib);
            tl::save_model(out_path, *model);
            std::printf("wrote %s\n", out_path.c_str());
            return 0;
        }
        if (*import_cmd) return cmd_import(import_dir, import_out, import_max_seq);
        if (*set_tokenizer_cmd) return cmd_set_tokenizer(model_path, tokenizer_file, out_path);
        if (*tokenize_cmd) return cmd_tokenize(model_path, text);
        if (*score) {
            if (text.empty() && token_file.empty()) throw UsageError("score needs --text FILE or --tokens FILE");
            ScoreArgs a;
            a.model_path = model_path, a.text = text, a.token_file = token_file, a.backend = backend;
            a.per_token = per_token, a.threads = threads, a.device = device, a.window = window;
            a.quiet = quiet, a.json = json, a.max_tokens = static_cast<uint64_t>(max_tokens);
            a.progress_interval = progress_interval;
            a.convention = llama ? tl::cli::Convention::LlamaPerplexity
                           : *stride_opt ? tl::cli::Convention::Stride
                                         : tl::cli::Convention::Windows;
            a.stride = stride, a.ctx = llama_ctx, a.bos = bos, a.top_k = top_k, a.activations = activations;
            check_convention_args(a);
            return cmd_score(a);
        }
        if (*score_batch) {
            return cmd_score_batch(model_path, input, output, backend, threads, activations, device, quiet,
                                   progress_interval, batch_bos, batch_top_k);
        }
        if (*compare) {
            if (compare_args.text.empty() && compare_args.token_file.empty()) {
                throw UsageError("compare needs --text FILE or --tokens FILE");
            }
            compare_args.backend = backend, compare_args.threads = threads, compare_args.device = device;
            compare_args.quiet = quiet, compare_args.progress_interval = progress_interval;
            compare_args.max_tokens = static_cast<uint64_t>(compare_max_tokens);
            return cmd_compare(compare_args);
        }
    } catch (const tl::Error &e) {
        std::fprintf(stderr, "tinyloop: %s: %s\n", tl_status_string(e.code()), e.what());
        return 1;
    } catch (const UsageError &e) {
        std::fprintf(stderr, "tinyloop: %s\n", e.what());
        return 2;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "tinyloop: %s\n", e.what());
        return 1;
    }
    return 0;
}
