// tl_score_bench: tl_score end to end on one model file, through the public C API, in each configuration: the CPU
// reference (only when asked), CUDA native INT4, Marlin-class fused, Marlin-class correction, the FP16 body, the
// dispatcher's defaults, and the defaults with INT8 activations (int8; lossy: its NLL agreement with the first CUDA
// configuration is the change it costs); every CUDA configuration with CUDA graphs off and on; full windows, the
// decode-like regime of short (16-token) windows, and a batch of independent documents scored in one call.
//
//   tl_score_bench MODEL OUT.csv OUT.md [--tokens 1024,4096] [--chunked 1024] [--chunk-window 16]
//                  [--docs 0 --doc-min 100 --doc-max 2000] [--seed 1 | --text FILE] [--reps 3] [--cpu-max-tokens 0]
//                  [--device 0] [--label NAME] [--append]
//                  [--configs cpu,native,fused,correction,fp16body,default,int8]
//
// Tokens: the first T of one sequence, either the bytes of --text FILE or pseudo-random ids in [0, vocab): output i
// of splitmix64 seeded with --seed, modulo vocab (tools/torch_reference.py --random makes the same sequence).
// Scenarios: each T of --tokens scored in the model's default window (max_seq), plus --chunked T tokens scored in
// --chunk-window windows (they overlap by one token, so tokens/s counts tokens scored, n - 1, everywhere), plus
// --docs N documents scored by one tl_score_batch call (tl_sequence with n_context 0: every token of a document but
// its first is scored). The documents come from one splitmix64 stream seeded with --seed: its first N outputs give
// the lengths, doc_min + out % (doc_max - doc_min + 1), the outputs after them the tokens, out % vocab, document
// after document (tools/torch_reference.py --docs makes the same ones). Their rows have window "docs" in the CSV and
// the Markdown, tokens = all the documents' tokens, windows = the number of documents; tokens/s counts tokens scored
// (tokens - documents).
// Each configuration gets a fresh model handle (load, set the dispatcher, score every scenario, free): the GPU model
// packs the FP16 body only when that setting is on at its creation, and a fresh handle keeps one configuration's
// forms out of the next one's memory figure. Per scenario and graphs setting: one warm-up call (it also captures
// the graphs), then --reps timed calls; the median is reported.
// Memory: the drop in cudaMemGetInfo's free bytes from before the model was loaded to after a call (the largest seen
// over the row's calls): weights in every packed form plus activations for the longest window so far. Scenarios run
// from the shortest window up, so each row holds what its own window needs. Library-wide caches made on first use
// (cuBLAS handles and workspaces) are counted in the first CUDA configuration only.
// NLL agreement (options.token_nll): per position against the scenario's reference (the first CUDA configuration
// that ran, graphs off) and against the CPU reference where it ran; ΔPPL = exp(Δ mean NLL) - 1, which stays finite
// when a synthetic model's perplexity overflows a double. "rerun" compares the warm-up call with the last timed one
// (an eager run with a graph replay when graphs are on).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "tinyloop.h"

namespace {

struct BenchError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

std::string status_text(tl_status s, const char *what) {
    return std::string(what) + ": " + tl_status_string(s) + ": " + tl_last_error_message();
}

void check(tl_status s, const char *what) {
    if (s != TL_OK) throw BenchError(status_text(s, what));
}

// ---- Configurations ----

constexpr int kDefault = -1;  // leave the setting at its process-start value

struct Config {
    const char *name;
    bool cpu;
    int use_marlin, marlin_mode, cublas_min_m, fp16_body;
    int32_t activations = TL_ACTIVATIONS_FP16;
};

// The Marlin-class rows pin CUBLAS_MIN_M to 0: otherwise large windows take dequantize + cuBLAS and the row would
// not measure the kernel it is named after. "default" is the dispatcher as shipped (or as the environment sets it).
const Config kConfigs[] = {
    {"cpu", true, kDefault, kDefault, kDefault, kDefault},
    {"native", false, 0, kDefault, kDefault, 0},
    {"fused", false, 1, 1, 0, 0},
    {"correction", false, 1, 2, 0, 0},
    {"fp16body", false, kDefault, kDefault, kDefault, 1},
    {"default", false, kDefault, kDefault, kDefault, kDefault},
    {"int8", false, kDefault, kDefault, kDefault, kDefault, TL_ACTIVATIONS_INT8},
};

const int32_t kSettings[] = {TL_DISPATCH_USE_MARLIN, TL_DISPATCH_FP16_BODY, TL_DISPATCH_CROSS_ITER_ROUND,
                             TL_DISPATCH_MARLIN_MODE, TL_DISPATCH_CUBLAS_MIN_M};

struct Dispatcher {
    std::map<int32_t, int32_t> start;  // the values at process start (environment or built-in defaults)

    Dispatcher() {
        for (int32_t s : kSettings) check(tl_get_dispatch(s, &start[s]), "tl_get_dispatch");
    }
    void restore() {
        for (auto [s, v] : start) check(tl_set_dispatch(s, v), "tl_set_dispatch");
    }
    void apply(const Config &c) {
        restore();
        for (auto [s, v] : {std::pair{TL_DISPATCH_USE_MARLIN, c.use_marlin}, {TL_DISPATCH_MARLIN_MODE, c.marlin_mode},
                            {TL_DISPATCH_CUBLAS_MIN_M, c.cublas_min_m}, {TL_DISPATCH_FP16_BODY, c.fp16_body}}) {
            if (v != kDefault) check(tl_set_dispatch(s, v), "tl_set_dispatch");
        }
    }
};

// ---- Arguments ----

struct Args {
    std::string model, csv, md, text, label;
    std::vector<int64_t> tokens = {1024, 4096};
    int64_t chunked = 1024;
    int32_t chunk_window = 16;
    int64_t docs = 0;
    int32_t doc_min = 100, doc_max = 2000;
    uint64_t seed = 1;
    int reps = 3;
    int64_t cpu_max_tokens = 0;
    int32_t device = 0;
    bool append = false;
    std::vector<std::string> configs = {"cpu", "native", "fused", "correction", "fp16body", "default"};
};

std::vector<std::string> split(const std::string &s) {
    std::vector<std::string> out;
    std::stringstream in(s);
    for (std::string item; std::getline(in, item, ',');) {
        if (!item.empty()) out.push_back(item);
    }
    return out;
}

int64_t to_int(const std::string &s, const std::string &flag) {
    try {
        size_t used = 0;
        const long long v = std::stoll(s, &used);
        if (used == s.size()) return v;
    } catch (const std::exception &) {
    }
    throw BenchError(flag + " expects an integer, got '" + s + "'");
}

const char *kUsage =
    "usage: tl_score_bench MODEL OUT.csv OUT.md [--tokens T1,T2,...] [--chunked T] [--chunk-window L]\n"
    "                      [--docs N [--doc-min A] [--doc-max B]] [--seed S | --text FILE] [--reps N>=3]\n"
    "                      [--cpu-max-tokens N] [--device D]\n"
    "                      [--configs cpu,native,fused,correction,fp16body,default,int8]\n"
    "                      [--label NAME] [--append]\n"
    "  --tokens          token counts scored in the model's default window (default 1024,4096)\n"
    "  --chunked         tokens scored in --chunk-window windows, 0 = skip (default 1024; window 16)\n"
    "  --docs            N documents of A..B tokens (default 100..2000) from --seed, scored by one tl_score_batch\n"
    "                    call, 0 = skip (default 0)\n"
    "  --cpu-max-tokens  the CPU configuration runs only in scenarios of at most N tokens (default 0: never)\n"
    "  --append          append rows to OUT.csv and a section to OUT.md instead of replacing them\n";

Args parse_args(int argc, char **argv) {
    Args a;
    std::vector<std::string> positional;
    for (int i = 1; i < argc; ++i) {
        const std::string flag = argv[i];
        if (flag == "-h" || flag == "--help") {
            std::fputs(kUsage, stdout);
            std::exit(0);
        }
        if (flag == "--append") {
            a.append = true;
            continue;
        }
        if (flag.rfind("--", 0) != 0) {
            positional.push_back(flag);
            continue;
        }
        if (i + 1 >= argc) throw BenchError(flag + " needs a value");
        const std::string v = argv[++i];
        if (flag == "--tokens") {
            a.tokens.clear();
            for (const std::string &t : split(v)) a.tokens.push_back(to_int(t, flag));
        } else if (flag == "--chunked") {
            a.chunked = to_int(v, flag);
        } else if (flag == "--chunk-window") {
            a.chunk_window = static_cast<int32_t>(to_int(v, flag));
        } else if (flag == "--docs") {
            a.docs = to_int(v, flag);
        } else if (flag == "--doc-min") {
            a.doc_min = static_cast<int32_t>(to_int(v, flag));
        } else if (flag == "--doc-max") {
            a.doc_max = static_cast<int32_t>(to_int(v, flag));
        } else if (flag == "--seed") {
            a.seed = static_cast<uint64_t>(to_int(v, flag));
        } else if (flag == "--text") {
            a.text = v;
        } else if (flag == "--reps") {
            a.reps = static_cast<int>(to_int(v, flag));
        } else if (flag == "--cpu-max-tokens") {
            a.cpu_max_tokens = to_int(v, flag);
        } else if (flag == "--device") {
            a.device = static_cast<int32_t>(to_int(v, flag));
        } else if (flag == "--label") {
            a.label = v;
        } else if (flag == "--configs") {
            a.configs = split(v);
        } else {
            throw BenchError("unknown option " + flag + "\n" + kUsage);
        }
    }
    if (positional.size() != 3) throw BenchError(std::string("expected MODEL OUT.csv OUT.md\n") + kUsage);
    a.model = positional[0], a.csv = positional[1], a.md = positional[2];
    if (a.label.empty()) a.label = a.model.substr(a.model.find_last_of('/') + 1);
    if (a.reps < 3) throw BenchError("--reps must be at least 3 (the median of three or more calls)");
    for (int64_t t : a.tokens) {
        if (t < 2) throw BenchError("--tokens values must be >= 2");
    }
    if (a.chunked != 0 && (a.chunked < 2 || a.chunk_window < 2)) {
        throw BenchError("--chunked must be 0 or >= 2, and --chunk-window >= 2");
    }
    if (a.docs < 0 || a.doc_min < 2 || a.doc_min > a.doc_max) {
        throw BenchError("--docs must be >= 0, and 2 <= --doc-min <= --doc-max");
    }
    if (a.docs != 0 && !a.text.empty()) throw BenchError("--docs makes its tokens from --seed: it takes no --text");
    for (const std::string &name : a.configs) {
        if (std::none_of(std::begin(kConfigs), std::end(kConfigs), [&](const Config &c) { return name == c.name; })) {
            throw BenchError("unknown configuration '" + name + "'");
        }
    }
    return a;
}

// ---- Tokens ----

uint64_t splitmix64(uint64_t &state) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

std::vector<int32_t> make_tokens(const Args &a, size_t count, int32_t vocab) {
    std::vector<int32_t> tokens;
    if (a.text.empty()) {
        uint64_t state = a.seed;
        for (size_t i = 0; i < count; ++i) tokens.push_back(static_cast<int32_t>(splitmix64(state) % vocab));
        return tokens;
    }
    std::ifstream in(a.text, std::ios::binary);
    if (!in) throw BenchError("cannot open text file '" + a.text + "'");
    for (std::istreambuf_iterator<char> it(in), end; it != end && tokens.size() < count; ++it) {
        tokens.push_back(static_cast<unsigned char>(*it));
    }
    if (tokens.size() < count) {
        throw BenchError("'" + a.text + "' has " + std::to_string(tokens.size()) + " bytes, fewer than the " +
                         std::to_string(count) + " tokens asked for");
    }
    if (vocab < 256) throw BenchError("byte tokens need vocab >= 256, the model has " + std::to_string(vocab));
    return tokens;
}

// The --docs documents (the stream is described at the top of this file).
std::vector<std::vector<int32_t>> make_documents(const Args &a, int32_t vocab) {
    uint64_t state = a.seed;
    std::vector<std::vector<int32_t>> docs(static_cast<size_t>(a.docs));
    const uint64_t span = static_cast<uint64_t>(a.doc_max - a.doc_min) + 1;
    for (std::vector<int32_t> &d : docs) d.resize(a.doc_min + splitmix64(state) % span);
    for (std::vector<int32_t> &d : docs) {
        for (int32_t &t : d) t = static_cast<int32_t>(splitmix64(state) % vocab);
    }
    return docs;
}

// ---- Logging: the library's lines on stderr, the first few in full (the first-dispatch line among them) ----

std::mutex g_log_mutex;
int g_log_lines = 0, g_first_dispatch_lines = 0;
constexpr int kLogLinesShown = 40;

void log_to_stderr(void *, int32_t level, const char *message) {
    std::lock_guard<std::mutex> lock(g_log_mutex);
    if (std::strstr(message, "first dispatch") != nullptr) ++g_first_dispatch_lines;
    if (++g_log_lines <= kLogLinesShown) {
        std::fprintf(stderr, "[tl %s] %s\n", level == TL_LOG_ERROR ? "error" : level == TL_LOG_WARN ? "warn" : "info",
                     message);
    } else if (g_log_lines == kLogLinesShown + 1) {
        std::fprintf(stderr, "[tl] (further library log lines counted, not shown)\n");
    }
}

// ---- Running ----

struct Scenario {
    int64_t tokens;  // docs: all the documents' tokens
    int32_t window;  // 0 = the model's max_seq (always, for docs)
    bool docs = false;
};

// Per-position NLL agreement of one row with another (the scenario's reference or the CPU).
struct Agreement {
    bool measured = false;
    double max = 0, mean = 0, dppl = 0;  // max and mean |dNLL| in nats; dPPL = exp(mean NLL difference) - 1
};

struct Row {
    Scenario scenario;
    std::string config;
    bool cpu = false;
    int32_t activations = TL_ACTIVATIONS_FP16;
    int graphs = 0;
    std::vector<double> ms;
    tl_score_result result{};
    std::vector<float> nll, warmup_nll;
    uint64_t device_bytes = 0;
    std::string error;
    std::string ref;  // filled by compare()
    Agreement vs_ref, vs_cpu;
};

size_t free_device_bytes() {
    size_t free_bytes = 0, total = 0;
    const cudaError_t e = cudaMemGetInfo(&free_bytes, &total);
    if (e != cudaSuccess) throw BenchError(std::string("cudaMemGetInfo: ") + cudaGetErrorString(e));
    return free_bytes;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// NaN as soon as either side holds one: a NaN NLL must not hide behind std::max.
double max_abs_diff(const std::vector<float> &a, const std::vector<float> &b) {
    double m = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
        if (std::isnan(d)) return d;
        m = std::max(m, d);
    }
    return m;
}

// tl_score_batch's per-document scores must add up to its totals and to the tokens the documents hold: the bench
// reports the totals, so a mismatch would make its row meaningless.
void check_batch_scores(const std::vector<tl_sequence_score> &scores, const tl_score_result &r, size_t scored) {
    uint64_t tokens = 0;
    double nll = 0;
    for (const tl_sequence_score &x : scores) tokens += x.tokens_scored, nll += x.nll_sum;
    if (tokens != scored || r.tokens_scored != scored ||
        !(std::fabs(nll - r.nll_sum) <= 1e-6 * std::fabs(r.nll_sum) + 1e-3)) {
        throw BenchError("tl_score_batch: the documents' scores (" + std::to_string(tokens) + " tokens, NLL " +
                         std::to_string(nll) + ") disagree with the totals (" + std::to_string(r.tokens_scored) +
                         " tokens, NLL " + std::to_string(r.nll_sum) + "); expected " + std::to_string(scored) +
                         " tokens");
    }
}

// One row: a warm-up call, then `reps` timed calls. A docs row scores every document in each call (tl_score_batch).
void run_row(const tl_model *model, const std::vector<int32_t> &all_tokens,
             const std::vector<std::vector<int32_t>> &documents, const Args &a, size_t free_before, Row &row) {
    const size_t n = static_cast<size_t>(row.scenario.tokens);
    const size_t scored = row.scenario.docs ? n - documents.size() : n - 1;
    std::vector<tl_sequence> sequences;
    if (row.scenario.docs) {
        for (const std::vector<int32_t> &d : documents) sequences.push_back({d.data(), d.size(), 0});
    }
    std::vector<tl_sequence_score> scores(sequences.size());
    tl_score_options o;
    check(tl_score_options_init(&o, sizeof o), "tl_score_options_init");
    o.backend = row.cpu ? TL_BACKEND_CPU : TL_BACKEND_CUDA;
    o.window = row.scenario.window;
    o.device = a.device;
    o.use_graphs = row.graphs;
    o.activations = row.activations;
    row.nll.assign(scored, NAN);
    row.warmup_nll.assign(scored, NAN);
    tl_score_result r;
    check(tl_score_result_init(&r, sizeof r), "tl_score_result_init");
    for (int call = 0; call <= a.reps; ++call) {
        std::vector<float> &nll = call == 0 ? row.warmup_nll : row.nll;
        o.token_nll = nll.data();
        o.token_nll_len = nll.size();
        const auto t0 = std::chrono::steady_clock::now();
        const tl_status s = row.scenario.docs
                                ? tl_score_batch(model, sequences.data(), sequences.size(), &o, scores.data(), &r)
                                : tl_score(model, all_tokens.data(), n, &o, &r);
        const auto t1 = std::chrono::steady_clock::now();
        if (s != TL_OK) throw BenchError(status_text(s, row.scenario.docs ? "tl_score_batch" : "tl_score"));
        if (row.scenario.docs) check_batch_scores(scores, r, scored);
        if (call > 0) row.ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        if (!row.cpu) {
            const size_t free_now = free_device_bytes();
            if (free_now < free_before) row.device_bytes = std::max<uint64_t>(row.device_bytes, free_before - free_now);
        }
    }
    row.result = r;
}

std::string scenario_text(const Scenario &s, const Args &a) {
    if (s.docs) {
        return std::to_string(a.docs) + " documents of " + std::to_string(a.doc_min) + "-" + std::to_string(a.doc_max) +
               " tokens (" + std::to_string(s.tokens) + " in all)";
    }
    return std::to_string(s.tokens) + " tokens, window " + (s.window ? std::to_string(s.window) : "max_seq");
}

// The CSV's and the Markdown's window column: `max_seq` stands for window 0.
std::string window_text(const Scenario &s, const char *max_seq) {
    return s.docs ? "docs" : s.window ? std::to_string(s.window) : max_seq;
}

void compare(std::vector<Row> &rows) {
    auto same = [](const Scenario &x, const Scenario &y) {
        return x.tokens == y.tokens && x.window == y.window && x.docs == y.docs;
    };
    for (Row &row : rows) {
        if (!row.error.empty()) continue;
        const Row *ref = nullptr, *cpu = nullptr;
        for (const Row &other : rows) {
            if (!other.error.empty() || !same(other.scenario, row.scenario)) continue;
            if (other.cpu && cpu == nullptr) cpu = &other;
            if (!other.cpu && other.graphs == 0 && ref == nullptr) ref = &other;
        }
        const double n = static_cast<double>(row.result.tokens_scored);
        auto agreement = [&](const Row *other) {
            Agreement g;
            if (other == nullptr) return g;
            double sum = 0;
            for (size_t i = 0; i < row.nll.size(); ++i) {
                sum += std::fabs(static_cast<double>(row.nll[i]) - other->nll[i]);
            }
            g.measured = true;
            g.max = max_abs_diff(row.nll, other->nll);
            g.mean = sum / n;
            g.dppl = std::expm1((row.result.nll_sum - other->result.nll_sum) / n);
            return g;
        };
        if (ref != nullptr) row.ref = ref->config;
        row.vs_ref = agreement(ref);
        row.vs_cpu = agreement(cpu);
    }
}

// ---- Output ----

std::string fmt(const char *f, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, f, v);
    return buf;
}

std::string csv_field(std::string s) {
    if (s.find_first_of(",\"\n") == std::string::npos) return s;
    for (size_t i = 0; (i = s.find('"', i)) != std::string::npos; i += 2) s.insert(i, "\"");
    return "\"" + s + "\"";
}

std::string read_file(const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_file(const std::string &path, const std::string &text) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out) throw BenchError("cannot write '" + path + "'");
}

std::string csv_rows(const Args &a, const tl_model_properties &p, const std::vector<Row> &rows, bool header) {
    std::ostringstream out;
    if (header) {
        out << "model,tokens,window,config,graphs,calls,ms_median,ms_min,ms_max,tokens_per_s,tokens_scored,windows,"
               "nll_per_token,perplexity,gemm_fused,gemm_correction,gemm_dequant_cublas,gemm_native,gemm_fp16_body,"
               "gemm_dense_cublas,gemm_fallbacks,device_mib,file_tensor_mib,int4_weight_mib,rerun_max_dnll,ref,"
               "max_dnll_ref,mean_dnll_ref,"
               "dppl_ref_pct,max_dnll_cpu,mean_dnll_cpu,dppl_cpu_pct,error\n";
    }
    for (const Row &r : rows) {
        const tl_score_result &s = r.result;
        const bool ok = r.error.empty();
        const double ms = ok ? median(r.ms) : 0;
        auto agreement = [](const Agreement &g) {
            return g.measured ? fmt("%.4g", g.max) + ',' + fmt("%.4g", g.mean) + ',' + fmt("%.4g", 100 * g.dppl) : ",,";
        };
        out << csv_field(a.label) << ',' << r.scenario.tokens << ',' << window_text(r.scenario, "0") << ','
            << r.config << ',' << r.graphs << ',' << r.ms.size() << ',' << (ok ? fmt("%.4f", ms) : "") << ','
            << (ok ? fmt("%.4f", *std::min_element(r.ms.begin(), r.ms.end())) : "") << ','
            << (ok ? fmt("%.4f", *std::max_element(r.ms.begin(), r.ms.end())) : "") << ','
            << (ok ? fmt("%.1f", s.tokens_scored / (ms / 1e3)) : "") << ',' << s.tokens_scored << ',' << s.n_windows
            << ',' << (ok ? fmt("%.9g", s.nll_sum / s.tokens_scored) : "") << ','
            << (ok ? fmt("%.9g", s.perplexity) : "")
            << ',' << s.gemm_marlin_fused << ',' << s.gemm_marlin_correction << ',' << s.gemm_dequant_cublas << ','
            << s.gemm_native << ',' << s.gemm_fp16_body << ',' << s.gemm_dense_cublas << ',' << s.gemm_fallbacks << ','
            << (ok && !r.cpu ? fmt("%.1f", r.device_bytes / 1048576.0) : "") << ','
            << fmt("%.1f", p.tensor_bytes / 1048576.0) << ',' << fmt("%.1f", p.quant_weight_bytes / 1048576.0) << ','
            << (ok ? fmt("%.3g", max_abs_diff(r.nll, r.warmup_nll)) : "") << ',' << r.ref << ','
            << agreement(r.vs_ref) << ',' << agreement(r.vs_cpu) << ',' << csv_field(r.error) << '\n';
    }
    return out.str();
}

std::string model_line(const Args &a, const tl_model_properties &p, const std::string &device) {
    std::ostringstream s;
    s << "### " << a.label << "\n\nD " << p.d_model << ", " << p.n_heads << "x" << p.head_dim << " heads, FFN " << p.ffn
      << ", V " << p.vocab << ", " << p.n_pre << " pre + loop x " << p.n_loops << ", max_seq " << p.max_seq << ", "
      << (p.group_size == 0 ? std::string("per-row") : "group " + std::to_string(p.group_size)) << ", head "
      << (p.head_kind == 1 ? "INT4" : p.head_kind == 0 ? "dense" : "tied") << "; " << p.n_quant_weights
      << " INT4 linears, " << fmt("%.1f", p.quant_weight_bytes / 1048576.0) << " MiB of INT4 weights, "
      << fmt("%.1f", p.tensor_bytes / 1048576.0) << " MiB of tensors in the file; tokens: "
      << (a.text.empty() ? "splitmix64 seed " + std::to_string(a.seed) : "bytes of " + a.text)
      << (a.docs ? "; docs: " + std::to_string(a.docs) + " documents of " + std::to_string(a.doc_min) + "-" +
                       std::to_string(a.doc_max) + " tokens, one tl_score_batch call"
                 : std::string())
      << "; device: "
      << device << "; median of " << a.reps << " calls after one warm-up.\n\n";
    return s.str();
}

std::string markdown(const Args &a, const tl_model_properties &p, const std::string &device,
                     const std::vector<Row> &rows) {
    std::ostringstream s;
    s << model_line(a, p, device);
    s << "| tokens | window | config | graphs | ms | tokens/s | NLL/token | fused | corr | deq+cuBLAS | native | fp16 "
         "body | dense | fallbacks | device MiB | rerun max dNLL | vs ref: max dNLL, dPPL | vs CPU: max dNLL, dPPL |\n"
         "|---:|---:|---|:-:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n";
    for (const Row &r : rows) {
        s << "| " << r.scenario.tokens << " | " << window_text(r.scenario, "max") << " | " << r.config << " | "
          << (r.cpu ? "-" : r.graphs ? "on" : "off") << " | ";
        if (!r.error.empty()) {
            std::string e = r.error;
            std::replace(e.begin(), e.end(), '|', '/');
            std::replace(e.begin(), e.end(), '\n', ' ');
            s << "error: " << e << " |";
            for (int cell = 5; cell < 18; ++cell) s << " |";
            s << "\n";
            continue;
        }
        const tl_score_result &x = r.result;
        const double ms = median(r.ms);
        s << fmt("%.2f", ms) << " | " << fmt("%.0f", x.tokens_scored / (ms / 1e3)) << " | "
          << fmt("%.5f", x.nll_sum / x.tokens_scored) << " | " << x.gemm_marlin_fused << " | "
          << x.gemm_marlin_correction << " | " << x.gemm_dequant_cublas << " | " << x.gemm_native << " | "
          << x.gemm_fp16_body << " | " << x.gemm_dense_cublas << " | " << x.gemm_fallbacks << " | "
          << (r.cpu ? "-" : fmt("%.0f", r.device_bytes / 1048576.0)) << " | "
          << fmt("%.2g", max_abs_diff(r.nll, r.warmup_nll)) << " | ";
        auto agreement = [](const Agreement &g) {
            return g.measured ? fmt("%.3g", g.max) + ", " + fmt("%+.3f%%", 100 * g.dppl) : std::string("-");
        };
        s << (r.vs_ref.measured ? r.ref + ": " : "") << agreement(r.vs_ref) << " | " << agreement(r.vs_cpu) << " |\n";
    }
    s << "\nms: wall time of one tl_score (docs: tl_score_batch) call; tokens/s: tokens scored (n - 1; docs: n - "
         "documents) per second; GEMM counters: per call (graph replays included); device MiB: free-memory drop since "
         "before the load; dNLL in nats per position; dPPL = exp(mean NLL difference) - 1; ref: the first CUDA "
         "configuration with graphs off.\n\n";
    return s.str();
}

int run(const Args &a) {
    check(tl_set_log_callback(log_to_stderr, nullptr, TL_LOG_INFO), "tl_set_log_callback");
    tl_model_properties props;
    std::memset(&props, 0, sizeof props);
    props.struct_size = sizeof props;
    {
        tl_model *m = nullptr;
        check(tl_model_load(a.model.c_str(), nullptr, &m), "tl_model_load");
        const tl_status s = tl_model_info(m, &props);
        tl_model_free(m);
        check(s, "tl_model_info");
    }

    // Scenarios from the shortest window up (see the memory note at the top); the documents last: one call packs
    // many of them into each forward pass, so it may hold more activations than any window.
    std::vector<Scenario> scenarios;
    if (a.chunked) scenarios.push_back({a.chunked, a.chunk_window});
    std::vector<int64_t> full = a.tokens;
    std::sort(full.begin(), full.end());
    for (int64_t t : full) scenarios.push_back({t, 0});
    int64_t longest = 0;
    for (const Scenario &s : scenarios) longest = std::max(longest, s.tokens);
    if (a.chunked && a.chunk_window > props.max_seq) {
        throw BenchError("--chunk-window " + std::to_string(a.chunk_window) + " exceeds max_seq " +
                         std::to_string(props.max_seq));
    }
    const std::vector<int32_t> tokens = make_tokens(a, static_cast<size_t>(longest), props.vocab);
    std::vector<std::vector<int32_t>> documents;
    if (a.docs) {
        if (a.doc_max > props.max_seq) {
            throw BenchError("--doc-max " + std::to_string(a.doc_max) + " exceeds max_seq " +
                             std::to_string(props.max_seq));
        }
        documents = make_documents(a, props.vocab);
        int64_t total = 0;
        for (const std::vector<int32_t> &d : documents) total += static_cast<int64_t>(d.size());
        scenarios.push_back({total, 0, true});
    }

    std::vector<const Config *> configs;
    for (const Config &c : kConfigs) {
        if (std::find(a.configs.begin(), a.configs.end(), c.name) != a.configs.end()) configs.push_back(&c);
    }
    const bool any_cuda = std::any_of(configs.begin(), configs.end(), [](const Config *c) { return !c->cpu; });
    std::string device = "none";
    if (any_cuda) {
        tl_device_properties d;
        std::memset(&d, 0, sizeof d);
        d.struct_size = sizeof d;
        check(tl_device_info(a.device, &d), "tl_device_info");
        device = std::string(d.name) + " (SM " + std::to_string(d.sm_major) + "." + std::to_string(d.sm_minor) + ", " +
                 std::to_string(d.sm_count) + " SMs, " + fmt("%.1f", d.total_memory / 1073741824.0) + " GiB)";
        const cudaError_t e = cudaSetDevice(a.device);
        if (e != cudaSuccess) throw BenchError(std::string("cudaSetDevice: ") + cudaGetErrorString(e));
    }
    std::fprintf(stderr, "[bench] %s: %s\n", a.label.c_str(), device.c_str());

    // The files are rewritten after every configuration, so a run cut short by a time limit keeps what it measured.
    const std::string csv_before = a.append ? read_file(a.csv) : "", md_before = a.append ? read_file(a.md) : "";
    auto write_outputs = [&](std::vector<Row> &done) {
        compare(done);
        write_file(a.csv, csv_before + csv_rows(a, props, done, csv_before.empty()));
        const std::string md = markdown(a, props, device, done);
        write_file(a.md, md_before + md);
        return md;
    };

    Dispatcher dispatcher;
    std::vector<Row> rows;
    bool failed = false;
    for (const Config *c : configs) {
        std::vector<Scenario> mine;
        for (const Scenario &s : scenarios) {
            if (!c->cpu || s.tokens <= a.cpu_max_tokens) mine.push_back(s);
        }
        if (mine.empty()) continue;
        const size_t first_row = rows.size();
        for (const Scenario &s : mine) {
            for (int graphs = 0; graphs <= (c->cpu ? 0 : 1); ++graphs) {
                Row row;
                row.scenario = s, row.config = c->name, row.cpu = c->cpu, row.graphs = graphs;
                row.activations = c->activations;
                rows.push_back(row);
            }
        }
        tl_model *model = nullptr;
        try {
            dispatcher.apply(*c);
            const size_t free_before = c->cpu ? 0 : free_device_bytes();
            check(tl_model_load(a.model.c_str(), nullptr, &model), "tl_model_load");
            for (size_t i = first_row; i < rows.size(); ++i) {
                Row &row = rows[i];
                try {
                    run_row(model, tokens, documents, a, free_before, row);
                    const tl_score_result &x = row.result;
                    std::fprintf(stderr,
                                 "[bench] %-10s %s, graphs %s: %.2f ms, NLL/token %.5f, GEMMs fused %llu corr %llu "
                                 "deq %llu native %llu fp16 %llu dense %llu fallbacks %llu\n",
                                 c->name, scenario_text(row.scenario, a).c_str(),
                                 row.cpu ? "-" : row.graphs ? "on" : "off",
                                 median(row.ms), x.nll_sum / x.tokens_scored,
                                 (unsigned long long)x.gemm_marlin_fused, (unsigned long long)x.gemm_marlin_correction,
                                 (unsigned long long)x.gemm_dequant_cublas, (unsigned long long)x.gemm_native,
                                 (unsigned long long)x.gemm_fp16_body, (unsigned long long)x.gemm_dense_cublas,
                                 (unsigned long long)x.gemm_fallbacks);
                } catch (const BenchError &e) {
                    row.error = e.what();
                    failed = true;
                    std::fprintf(stderr, "[bench] %s %s: %s\n", c->name, scenario_text(row.scenario, a).c_str(),
                                 e.what());
                }
            }
        } catch (const BenchError &e) {  // the load or a dispatcher setting failed: every row of this configuration
            for (size_t i = first_row; i < rows.size(); ++i) rows[i].error = e.what();
            failed = true;
            std::fprintf(stderr, "[bench] %s: %s\n", c->name, e.what());
        }
        tl_model_free(model);
        write_outputs(rows);
    }
    dispatcher.restore();
    tl_set_log_callback(nullptr, nullptr, TL_LOG_ERROR);
    std::fprintf(stderr, "[bench] library log: %d lines, %d of them a first-dispatch line\n", g_log_lines,
                 g_first_dispatch_lines);

    std::fputs(write_outputs(rows).c_str(), stdout);
    return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char **argv) {
    try {
        return run(parse_args(argc, argv));
    } catch (const BenchError &e) {
        std::fprintf(stderr, "tl_score_bench: %s\n", e.what());
        return 2;
    }
}
