// The C API's scoring functions: tl_score (one token stream in windows) and tl_score_batch (many sequences), on the
// GPU (a GpuModel per model and device, made on first use) or the CPU.
#include "tinyloop.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "barrier.hpp"
#include "cpu/cpu_forward.hpp"
#include "gpu/device.hpp"
#include "gpu/gemm_dispatch.hpp"
#include "gpu/gpu_forward.hpp"
#include "gpu/gpu_model.hpp"
#include "handles.hpp"
#include "score/compare.hpp"
#include "score/score_plan.hpp"
#include "util/log.hpp"

using namespace tl::capi;

namespace {

// The model's GpuModel on `device`, created (uploaded and packed) on first use. Packing forms follow the dispatcher
// settings at creation: the FP16 body only when that path is enabled (it costs 2 bytes per weight).
// `setup_seconds`, when not null, receives the time this call spent creating the GpuModel (0 when it existed).
tl::GpuModel &gpu_model_for(const tl_model &model, int32_t device, double *setup_seconds = nullptr) {
    std::lock_guard<std::mutex> lock(model.gpu_mutex);
    std::unique_ptr<tl::GpuModel> &slot = model.gpu_models[device];
    if (!slot) {
        const auto start = std::chrono::steady_clock::now();
        tl::GpuModelOptions options;
        if (model.dispatch.get(tl::DispatchSetting::Fp16Body)) options.forms.fp16_body = true;
        try {
            slot = std::make_unique<tl::GpuModel>(*model.model, device, options);
        } catch (...) {
            model.gpu_models.erase(device);
            throw;
        }
        if (setup_seconds != nullptr) {
            *setup_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        }
    }
    return *slot;
}

// TL_ERR_NO_DEVICE for a CUDA backend that this build or machine lacks.
void require_backend(int32_t backend) {
    if (backend == TL_BACKEND_CUDA && tl::device_count() == 0) {
#if defined(TL_WITH_CUDA)
        tl::fail(TL_ERR_NO_DEVICE, "backend CUDA requested but no CUDA device is usable");
#else
        tl::fail(TL_ERR_NO_DEVICE, "backend CUDA requested but this build has no CUDA support");
#endif
    }
}

// An activation precision of the options (TL_ACTIVATIONS_*), checked; `field` names it in the message.
tl::ActivationMode activation_mode(int32_t value, const char *field) {
    require(value == TL_ACTIVATIONS_FP16 || value == TL_ACTIVATIONS_INT8 || value == TL_ACTIVATIONS_FP8,
            std::string("options->") + field +
                " must be TL_ACTIVATIONS_FP16 (0), TL_ACTIVATIONS_INT8 (1) or TL_ACTIVATIONS_FP8 (2), got " +
                std::to_string(value));
    return static_cast<tl::ActivationMode>(value);
}

// The run settings tl_score_options and tl_compare_options share, checked: threads, backend, graphs.
template <class Options>
void check_run_options(const Options &opts) {
    require(opts.n_threads >= 0 && opts.n_threads <= 1024,
            "options->n_threads must be in [0, 1024], got " + std::to_string(opts.n_threads));
    require(opts.backend == TL_BACKEND_AUTO || opts.backend == TL_BACKEND_CPU || opts.backend == TL_BACKEND_CUDA,
            "options->backend must be TL_BACKEND_AUTO, TL_BACKEND_CPU or TL_BACKEND_CUDA, got " +
                std::to_string(opts.backend));
    require(opts.use_graphs == 0 || opts.use_graphs == 1,
            "options->use_graphs must be 0 or 1, got " + std::to_string(opts.use_graphs));
}

// The options tl_score and tl_score_batch share, read (NULL: the defaults) and checked: threads, backend, graphs,
// top-k, and a CUDA backend that this build or machine lacks (TL_ERR_NO_DEVICE).
tl_score_options read_score_options(const tl_score_options *options) {
    tl_score_options opts = read_input_struct(options, "options", tl_score_options_init, true);
    // A fourth-version struct ends in the 4 bytes of tail padding where `activations` now lies: they are not read.
    if (options != nullptr && options->struct_size == kMiddleVersionSizes<tl_score_options>[2]) {
        opts.activations = TL_ACTIVATIONS_FP16;
    }
    check_run_options(opts);
    require(opts.top_k >= 0 && opts.top_k <= tl::kMaxTopK,
            "options->top_k must be in [0, " + std::to_string(tl::kMaxTopK) + "] (0: none), got " +
                std::to_string(opts.top_k));
    if (opts.top_k > 0) {
        require(opts.top_ids != nullptr, "options->top_ids is NULL while options->top_k is " +
                                             std::to_string(opts.top_k));
        require(opts.top_logprobs != nullptr, "options->top_logprobs is NULL while options->top_k is " +
                                                  std::to_string(opts.top_k));
    }
    activation_mode(opts.activations, "activations");
    require(opts.reserved == 0, "options->reserved must be 0, got " + std::to_string(opts.reserved));
    require(opts.empty_context_bos >= TL_BOS_FROM_MODEL,
            "options->empty_context_bos must be TL_BOS_NONE (-1), TL_BOS_FROM_MODEL (-2) or a token id, got " +
                std::to_string(opts.empty_context_bos));
    require_backend(opts.backend);
    return opts;
}

// The token that stands for an empty context in tl_score_batch (options->empty_context_bos), or -1: none.
int32_t empty_context_bos(const tl_score_options &opts, const tl_model &model) {
    if (opts.empty_context_bos == TL_BOS_NONE) return -1;
    const tl::ModelConfig &c = model.model->config;
    const int32_t bos = opts.empty_context_bos == TL_BOS_FROM_MODEL ? c.bos_token_id : opts.empty_context_bos;
    require(bos >= 0,
            "options->empty_context_bos is TL_BOS_FROM_MODEL but the model file names no beginning-of-text token "
            "(bos_token_id): give the token id in options->empty_context_bos instead");
    require(bos < c.vocab, "options->empty_context_bos = " + std::to_string(bos) + " is outside the model's vocab " +
                               std::to_string(c.vocab));
    return bos;
}

// Fails with TL_ERR_BUFFER_TOO_SMALL when the options' token_nll (if any) holds fewer than `needed` floats, or their
// top-k arrays (if asked for) fewer than `needed` positions' worth; `what` says what `needed` counts.
void require_token_nll_room(const tl_score_options &opts, size_t needed, const char *what) {
    if (opts.token_nll != nullptr && opts.token_nll_len < needed) {
        tl::fail(TL_ERR_BUFFER_TOO_SMALL, "options->token_nll_len is " + std::to_string(opts.token_nll_len) +
                                              ", needs " + what + " = " + std::to_string(needed));
    }
    if (opts.top_k > 0 && (needed > SIZE_MAX / static_cast<size_t>(opts.top_k) ||
                           opts.top_len < needed * static_cast<size_t>(opts.top_k))) {
        tl::fail(TL_ERR_BUFFER_TOO_SMALL, "options->top_len is " + std::to_string(opts.top_len) + ", needs (" + what +
                                              ") * top_k = " + std::to_string(needed) + " * " +
                                              std::to_string(opts.top_k));
    }
}

// top_k no larger than the vocabulary (a model of fewer than 20 tokens).
void require_top_k_fits(const tl_score_options &opts, const tl_model &model) {
    const int32_t vocab = model.model->config.vocab;
    require(opts.top_k <= vocab, "options->top_k = " + std::to_string(opts.top_k) + " is above the model's vocab " +
                                     std::to_string(vocab));
}

// The core's options for checked C options; progress goes to the C callback (non-zero: stop).
tl::ScoreOptions core_score_options(const tl_model &model, const tl_score_options &opts) {
    tl::ScoreOptions score;
    score.dispatch = model.dispatch.resolve();
    score.n_threads = opts.n_threads;
    score.window = opts.window;
    score.token_nll = opts.token_nll;
    score.use_graphs = opts.use_graphs != 0;
    score.max_memory_bytes = opts.max_memory_bytes;
    score.top_k = opts.top_k;
    score.top_ids = opts.top_ids;
    score.top_logprobs = opts.top_logprobs;
    score.activations = static_cast<tl::ActivationMode>(opts.activations);
    if (opts.progress != nullptr) {
        const tl_progress_fn fn = opts.progress;
        void *user = opts.progress_user_data;
        score.progress = [fn, user](uint64_t done, uint64_t total) { return fn(user, done, total) == 0; };
    }
    return score;
}

// Whether checked options send a request to the GPU: TL_BACKEND_CUDA, or AUTO where there is a device.
bool wants_gpu(const tl_score_options &opts) {
    return opts.backend == TL_BACKEND_CUDA || (opts.backend == TL_BACKEND_AUTO && tl::device_count() > 0);
}

// Runs a scoring request and reports it: on the GPU where the options want it, `on_gpu(gpu_model, &stats)` with this
// call's GEMM counts going into the result (AUTO takes the CPU when the GPU path declines with TL_ERR_UNSUPPORTED;
// other failures stand), else `on_cpu()`. The result gets the totals, perplexity, backend, windows and the seconds
// since `start`; `what` names the request in the log.
tl_score_result run_score(const tl_model &model, const tl_score_options &opts, const char *what,
                          std::chrono::steady_clock::time_point start,
                          const std::function<tl::ScoreResult(tl::GpuModel &, tl::GpuScoreStats *)> &on_gpu,
                          const std::function<tl::ScoreResult()> &on_cpu) {
    tl_score_result result;
    std::memset(&result, 0, sizeof result);
    result.struct_size = sizeof result;
    tl::ScoreResult r;
    bool gpu = wants_gpu(opts);
    if (gpu) {
        try {
            // Before any upload: a model the GPU cannot score this way is not copied there first.
            const auto activations = static_cast<tl::ActivationMode>(opts.activations);
            tl::require_gpu_activations(*model.model, activations,
                                        activations == tl::ActivationMode::Int8 && tl::int8_tensor_cores(opts.device));
            tl::GpuModel &gpu_model = gpu_model_for(model, opts.device, &result.setup_seconds);
            tl::GpuScoreStats ran;  // this call's own counts, whatever other threads run on the model
            r = on_gpu(gpu_model, &ran);
            result.setup_seconds += ran.setup_seconds;  // the INT8-activation forms, on the first INT8 call
            result.graph_capture_seconds = ran.capture_seconds;
            result.gemm_marlin_fused = ran.dispatch.marlin_fused;
            result.gemm_marlin_correction = ran.dispatch.marlin_correction;
            result.gemm_dequant_cublas = ran.dispatch.dequant_cublas;
            result.gemm_fp16_body = ran.dispatch.fp16_body;
            result.gemm_native = ran.dispatch.native;
            result.gemm_fallbacks = ran.dispatch.fallbacks;
            result.gemm_dense_cublas = ran.cublas_dense;
        } catch (const tl::Error &e) {
            // AUTO takes the CPU when the GPU path declines a request it does not support; real failures stand.
            if (opts.backend != TL_BACKEND_AUTO || e.code() != TL_ERR_UNSUPPORTED) throw;
            tl::log(TL_LOG_INFO, std::string("[") + what + "] GPU declined, scoring on the CPU: " + e.what());
            gpu = false;
        }
    }
    if (!gpu) r = on_cpu();

    result.nll_sum = r.nll_sum;
    result.tokens_scored = r.tokens_scored;
    result.perplexity = r.tokens_scored > 0 ? std::exp(r.nll_sum / static_cast<double>(r.tokens_scored)) : 0.0;
    result.backend = gpu ? TL_BACKEND_CUDA : TL_BACKEND_CPU;
    result.n_windows = r.n_windows;
    result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (tl::log_enabled(TL_LOG_DEBUG)) {
        tl::log(TL_LOG_DEBUG, std::string("[") + what + "] " + (gpu ? "CUDA" : "CPU") + ": " +
                                  std::to_string(r.tokens_scored) + " tokens in " + std::to_string(r.n_windows) +
                                  " windows, " + std::to_string(result.seconds) + " s");
    }
    return result;
}

// The scoring options of a comparison's checked options.
tl::ScoreOptions core_compare_options(const tl_model &reference, const tl_compare_options &opts) {
    tl::ScoreOptions score;
    score.dispatch = reference.dispatch.resolve();
    score.n_threads = opts.n_threads;
    score.window = opts.window;
    score.use_graphs = opts.use_graphs != 0;
    score.max_memory_bytes = opts.max_memory_bytes;
    score.activations = activation_mode(opts.activations_reference, "activations_reference");
    if (opts.progress != nullptr) {
        const tl_progress_fn fn = opts.progress;
        void *user = opts.progress_user_data;
        score.progress = [fn, user](uint64_t done, uint64_t total) { return fn(user, done, total) == 0; };
    }
    return score;
}

}  // namespace

extern "C" {

TL_API tl_status tl_score_options_init(tl_score_options *options, uint32_t struct_size) {
    return init_struct(options, struct_size, "options", [](tl_score_options &o) {
        o.backend = TL_BACKEND_AUTO;
        o.use_graphs = 1;
        o.empty_context_bos = TL_BOS_NONE;
    });
}

TL_API tl_status tl_score_result_init(tl_score_result *result, uint32_t struct_size) {
    return init_struct(result, struct_size, "result", [](tl_score_result &) {});
}

TL_API tl_status tl_compare_options_init(tl_compare_options *options, uint32_t struct_size) {
    return init_struct(options, struct_size, "options", [](tl_compare_options &o) {
        o.backend = TL_BACKEND_AUTO;
        o.use_graphs = 1;
    });
}

TL_API tl_status tl_compare_result_init(tl_compare_result *result, uint32_t struct_size) {
    return init_struct(result, struct_size, "result", [](tl_compare_result &) {});
}

TL_API tl_status tl_score_compare(const tl_model *reference, const tl_model *test, const int32_t *tokens,
                                  size_t n_tokens, const tl_compare_options *options, tl_compare_result *out_result) {
    return guarded([&] {
        const auto start = std::chrono::steady_clock::now();
        require_not_null(reference, "reference");
        require_not_null(test, "test");
        require_not_null(tokens, "tokens");
        require_output_struct(out_result, "out_result");
        const tl_compare_options opts = read_input_struct(options, "options", tl_compare_options_init, true);
        check_run_options(opts);
        require_backend(opts.backend);
        require(n_tokens >= 2, "n_tokens must be >= 2 (the first token is only context), got " +
                                   std::to_string(n_tokens));
        tl::check_same_vocabulary(*reference->model, *test->model);
        const size_t positions = n_tokens - 1;
        const bool any_output = opts.token_kl != nullptr || opts.token_nll_reference != nullptr ||
                                opts.token_nll_test != nullptr || opts.token_top1_match != nullptr;
        if (any_output && opts.token_len < positions) {
            tl::fail(TL_ERR_BUFFER_TOO_SMALL, "options->token_len is " + std::to_string(opts.token_len) +
                                                  ", needs n_tokens - 1 = " + std::to_string(positions));
        }
        // One value per position is kept whatever the caller asked for: the percentiles need every KL.
        std::vector<float> kl(positions), nll_ref(positions), nll_test(positions);
        std::vector<uint8_t> match(positions);
        const tl::CompareOutputs out{kl.data(), nll_ref.data(), nll_test.data(), match.data()};
        const tl::ScoreOptions score = core_compare_options(*reference, opts);
        const tl::ActivationMode test_activations = activation_mode(opts.activations_test, "activations_test");

        tl_compare_result result;
        std::memset(&result, 0, sizeof result);
        result.struct_size = sizeof result;
        tl::ScoreResult r;
        bool gpu = opts.backend == TL_BACKEND_CUDA || (opts.backend == TL_BACKEND_AUTO && tl::device_count() > 0);
        if (gpu) {
            try {
                double ref_setup = 0, test_setup = 0;
                // Declined before either model is uploaded.
                tl::require_gpu_activations(score.activations);
                tl::require_gpu_activations(test_activations);
                tl::GpuModel &ref_gpu = gpu_model_for(*reference, opts.device, &ref_setup);
                tl::GpuModel &test_gpu = gpu_model_for(*test, opts.device, &test_setup);
                result.setup_seconds = ref_setup + test_setup;
                r = tl::compare_cuda(ref_gpu, test_gpu, tokens, n_tokens, score, test->dispatch.resolve(),
                                     opts.device, opts.stream, out);
            } catch (const tl::Error &e) {
                if (opts.backend != TL_BACKEND_AUTO || e.code() != TL_ERR_UNSUPPORTED) throw;
                tl::log(TL_LOG_INFO, std::string("[compare] GPU declined, comparing on the CPU: ") + e.what());
                gpu = false;
            }
        }
        if (!gpu) {
            r = tl::compare_cpu(*reference->model, *test->model, tokens, n_tokens, score, test->dispatch.resolve(),
                                out, test_activations);
        }

        const tl::CompareStats st = tl::summarize_comparison(kl.data(), nll_ref.data(), nll_test.data(),
                                                             match.data(), positions);
        result.tokens_scored = st.n;
        result.kl_mean = st.kl_mean;
        result.kl_stderr = st.kl_stderr;
        result.kl_median = st.kl_median;
        result.kl_p90 = st.kl_p90;
        result.kl_p99 = st.kl_p99;
        result.kl_p999 = st.kl_p999;
        result.kl_max = st.kl_max;
        result.kl_min = st.kl_min;
        result.top1_agreement = st.top1_agreement;
        result.nll_sum_reference = st.nll_sum_reference;
        result.nll_sum_test = st.nll_sum_test;
        const double n = static_cast<double>(st.n);
        result.perplexity_reference = std::exp(st.nll_sum_reference / n);
        result.perplexity_test = std::exp(st.nll_sum_test / n);
        result.delta_perplexity = result.perplexity_test - result.perplexity_reference;
        result.perplexity_ratio = result.perplexity_test / result.perplexity_reference;
        result.nll_correlation = st.nll_correlation;
        result.backend = gpu ? TL_BACKEND_CUDA : TL_BACKEND_CPU;
        result.n_windows = r.n_windows;
        result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        // Copied out only on success, as every output of the API.
        if (opts.token_kl != nullptr) std::copy(kl.begin(), kl.end(), opts.token_kl);
        if (opts.token_nll_reference != nullptr) std::copy(nll_ref.begin(), nll_ref.end(), opts.token_nll_reference);
        if (opts.token_nll_test != nullptr) std::copy(nll_test.begin(), nll_test.end(), opts.token_nll_test);
        if (opts.token_top1_match != nullptr) std::copy(match.begin(), match.end(), opts.token_top1_match);
        write_output_struct(out_result, result);
    });
}

TL_API tl_status tl_score(const tl_model *model, const int32_t *tokens, size_t n_tokens,
                          const tl_score_options *options, tl_score_result *out_result) {
    return guarded([&] {
        const auto start = std::chrono::steady_clock::now();
        require_not_null(model, "model");
        require_not_null(tokens, "tokens");
        require_output_struct(out_result, "out_result");
        const tl_score_options opts = read_score_options(options);
        require(n_tokens >= 2, "n_tokens must be >= 2 (the first token is only context), got " +
                                   std::to_string(n_tokens));
        require_top_k_fits(opts, *model);
        require_token_nll_room(opts, n_tokens - 1, "n_tokens - 1");
        const tl::ScoreOptions score = core_score_options(*model, opts);
        const tl_score_result result = run_score(
            *model, opts, "score", start,
            [&](tl::GpuModel &gpu, tl::GpuScoreStats *ran) {
                return tl::score_cuda(gpu, tokens, n_tokens, score, opts.device, opts.stream, ran);
            },
            [&] { return tl::score_cpu(*model->model, tokens, n_tokens, score); });
        write_output_struct(out_result, result);
    });
}

TL_API tl_status tl_score_batch(const tl_model *model, const tl_sequence *sequences, size_t n_sequences,
                                const tl_score_options *options, tl_sequence_score *out_scores,
                                tl_score_result *out_result) {
    return guarded([&] {
        const auto start = std::chrono::steady_clock::now();
        require_not_null(model, "model");
        if (n_sequences > 0) require_not_null(out_scores, "out_scores");
        if (out_result != nullptr) require_output_struct(out_result, "out_result");
        const tl_score_options opts = read_score_options(options);
        require_top_k_fits(opts, *model);
        // Decided before anything is allocated: no array of tl_sequence can be this long.
        if (n_sequences > static_cast<size_t>(PTRDIFF_MAX) / sizeof(tl_sequence)) {
            tl::fail(TL_ERR_INVALID_ARGUMENT, "n_sequences = " + std::to_string(n_sequences) +
                                                  " is longer than any array of tl_sequence can be");
        }
        std::vector<tl::Sequence> batch(sequences != nullptr ? n_sequences : 0);
        for (size_t i = 0; i < batch.size(); ++i) {
            batch[i].tokens = sequences[i].tokens;
            batch[i].n_tokens = sequences[i].n_tokens;
            batch[i].n_context = sequences[i].n_context;
        }
        // Sequences given an empty context, with the beginning-of-text token in front: copies owned here.
        const int32_t bos = empty_context_bos(opts, *model);
        std::vector<std::vector<int32_t>> with_bos;
        if (bos >= 0) {
            const size_t max_seq = static_cast<size_t>(model->model->config.max_seq);
            with_bos.reserve(static_cast<size_t>(
                std::count_if(batch.begin(), batch.end(), [](const tl::Sequence &s) { return s.n_context == 0; })));
            for (size_t i = 0; i < batch.size(); ++i) {
                tl::Sequence &s = batch[i];
                if (s.n_context != 0) continue;
                const std::string name = "sequences[" + std::to_string(i) + "]";
                require(s.n_tokens >= 1, name + ".n_tokens is 0: nothing to score after the beginning-of-text token");
                require(s.tokens != nullptr, name + ".tokens is NULL");
                // Decided before copying: the copy is one token longer.
                require(s.n_tokens < max_seq, name + ".n_tokens = " + std::to_string(s.n_tokens) +
                                                  " with the beginning-of-text token before it is past max_seq = " +
                                                  std::to_string(max_seq));
                std::vector<int32_t> &tokens = with_bos.emplace_back();
                tokens.reserve(s.n_tokens + 1);
                tokens.push_back(bos);
                tokens.insert(tokens.end(), s.tokens, s.tokens + s.n_tokens);
                s.tokens = tokens.data();
                s.n_tokens = tokens.size();
                s.n_context = 1;
            }
        }
        const size_t predicted =
            tl::check_sequences(model->model->config, sequences != nullptr ? batch.data() : nullptr, n_sequences,
                                opts.window);
        require_token_nll_room(opts, predicted, "the sum of n_tokens - 1 over the sequences");

        std::vector<tl::SequenceScore> scores(n_sequences);
        tl_score_result result;
        if (n_sequences == 0) {  // an empty batch: nothing runs (no GPU upload), the totals are zero
            std::memset(&result, 0, sizeof result);
            result.struct_size = sizeof result;
            result.backend = wants_gpu(opts) ? TL_BACKEND_CUDA : TL_BACKEND_CPU;
            result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        } else {
            const tl::ScoreOptions score = core_score_options(*model, opts);
            result = run_score(
                *model, opts, "score_batch", start,
                [&](tl::GpuModel &gpu, tl::GpuScoreStats *ran) {
                    return tl::score_batch_cuda(gpu, batch.data(), n_sequences, score, opts.device, opts.stream,
                                                scores.data(), ran);
                },
                [&] { return tl::score_batch_cpu(*model->model, batch.data(), n_sequences, score, scores.data()); });
        }
        for (size_t i = 0; i < n_sequences; ++i) {
            out_scores[i].nll_sum = scores[i].nll_sum;
            out_scores[i].tokens_scored = scores[i].tokens_scored;
            out_scores[i].greedy = scores[i].greedy ? 1 : 0;
        }
        if (out_result != nullptr) write_output_struct(out_result, result);
    });
}

}  // extern "C"
