#include "gpu/gpu_forward.hpp"

#include <algorithm>
#include <array>
#include <mutex>
#include <string>
#include <vector>

#include "gpu/device.hpp"
#include "gpu/gemm_dispatch.hpp"
#include "util/error.hpp"

#if defined(TL_WITH_CUDA)
#include <cuda_runtime_api.h>

#include "forward/forward_kernels.hpp"
#include "gpu/cuda_host.hpp"
#include "gpu/gpu_model_state.hpp"
#include "gpu_kernels.hpp"
#endif

namespace tl {

#if !defined(TL_WITH_CUDA)

// ---- A build without CUDA -------------------------------------------------------------------------------------

bool int8_tensor_cores(int32_t) { return false; }

ScoreResult score_cuda(GpuModel &, const int32_t *, size_t, const ScoreOptions &, int32_t, void *, GpuScoreStats *) {
    fail_without_cuda();
}
ScoreResult score_batch_cuda(GpuModel &, const Sequence *, size_t, const ScoreOptions &, int32_t, void *,
                             SequenceScore *, GpuScoreStats *) {
    fail_without_cuda();
}
ScoreResult compare_cuda(GpuModel &, GpuModel &, const int32_t *, size_t, const ScoreOptions &,
                         const DispatchSettings &, int32_t, void *, const CompareOutputs &, GpuScoreStats *) {
    fail_without_cuda();
}

#else

// ---- CUDA -------------------------------------------------------------------------------------------------------

using namespace detail;

static_assert(kMaxTopK == gpu::kMaxTopK, "the C API's top-k limit is the kernel's");

namespace {

// A launcher's rc (cuda/forward/forward_kernels.hpp): positive = a CUDA error, negative = refused arguments, which
// the checks made when the GpuModel was built should have ruled out.
void check_rc(int rc, const std::string &what) {
    if (rc == 0) return;
    if (rc > 0) check_cuda(static_cast<cudaError_t>(rc), what);
    fail(TL_ERR_INTERNAL, what + " refused its arguments (rc " + std::to_string(rc) + ")");
}

// The INT8 input of an int8_tensor_core_linear weight in the workspace, where the norm or SwiGLU before it can write
// it.
struct Int8Input {
    int8_t *codes;
    float *scales;
    int32_t *sums;
    float *group_sums;
};
Int8Input int8_input(GpuModel::State &s, int32_t m, int32_t k) {
    char *scratch = s.workspace.get<char>() + zeroed_workspace_bytes(s.sm_count);
    const Int8InputLayout at = int8_input_layout(static_cast<size_t>(m), static_cast<size_t>(k));
    return {reinterpret_cast<int8_t *>(scratch), reinterpret_cast<float *>(scratch + at.scales),
            reinterpret_cast<int32_t *>(scratch + at.sums), reinterpret_cast<float *>(scratch + at.group_sums)};
}
// Where a producer writes w's INT8 input: the group sums for a grouped INT4 weight (null otherwise).
float *group_sums_for(const DeviceLinear &w, const Int8Input &in) { return w.a8_group > 0 ? in.group_sums : nullptr; }

// y = x W for m rows of INT8 activations (w has its a8_ forms). Through gpu::int8_gemm: x quantized per row into
// int8_input, unless `quantized` (the kernel before wrote it there; x is then unused). Else (an INT8 weight where that
// does not run) cuBLAS's INT8 GEMM (gpu::w8a8_gemm) in chunks of rows, each quantizing its rows and summing in INT32
// into the same place.
void int8_activations_gemm(GpuModel::State &s, const DeviceLinear &w, const uint16_t *x, uint16_t *y, int32_t m,
                           cudaStream_t stream, bool quantized) {
    const std::string what = (w.a8_int4 ? "W4A8 GEMM of '" : "W8A8 GEMM of '") + w.name + "'";
    if (!w.a8_codes) fail(TL_ERR_INTERNAL, what + ": its forms for INT8 activations were not built");
    if (int8_tensor_core_linear(s, w)) {
        const Int8Input in = int8_input(s, m, w.k);
        const bool grouped = w.a8_group > 0, row_sums = w.a8_int4 && !grouped;
        if (!quantized) {
            check_rc(gpu::quantize_rows_int8(x, m, w.k, in.codes, in.scales, stream, row_sums ? in.sums : nullptr,
                                             group_sums_for(w, in), w.a8_group),
                     "INT8 quantization of the input of '" + w.name + "'");
        }
        gpu::Int8GemmArgs a;
        a.xq = in.codes;
        a.x_scales = in.scales;
        a.x_sums = row_sums ? in.sums : nullptr;
        a.w = w.a8_codes.get();
        a.w_scales = grouped ? nullptr : w.a8_scales.get<float>();
        a.w_zeros = row_sums ? w.a8_zeros.get<float>() : nullptr;
        a.y = y;
        a.m = m;
        a.n = w.n;
        a.k = w.k;
        a.group_size = w.a8_group;
        a.w_groups = grouped ? w.a8_scales.get<float>() : nullptr;
        a.x_group_sums = group_sums_for(w, in);
        check_rc(gpu::int8_gemm(a, w.a8_int4 ? gpu::Int8Weights::Int4Packed : gpu::Int8Weights::Int8,
                                s.workspace.get(), zeroed_workspace_bytes(s.sm_count), stream),
                 what);
        ++s.int8_calls;
        return;
    }
    if (quantized || w.a8_int4) fail(TL_ERR_INTERNAL, what + ": the INT8 tensor-core kernel does not run here");
    const size_t zeroed = zeroed_workspace_bytes(s.sm_count);
    for (int32_t r0 = 0; r0 < m; r0 += kW8a8ChunkRows) {
        const int32_t rows = std::min(kW8a8ChunkRows, m - r0);
        check_rc(gpu::w8a8_gemm(s.cublas, x + static_cast<size_t>(r0) * w.k, w.a8_codes.get<int8_t>(),
                                w.a8_scales.get<float>(), y + static_cast<size_t>(r0) * w.n, rows, w.n, w.k,
                                s.workspace.get<char>() + zeroed, s.workspace.bytes() - zeroed, stream),
                 what);
    }
    ++s.dense_calls;
}

// y = x W (+ bias) for m rows. `dequantized`: w's FP16 form from loop_fp16, or nullptr. `x_quantized`: x's INT8 form
// is already in int8_input (int8_tensor_core_linear weights only).
void gemm(GpuModel::State &s, const DeviceLinear &w, const uint16_t *x, uint16_t *y, int32_t m, cudaStream_t stream,
          const uint16_t *dequantized = nullptr, bool x_quantized = false) {
    if (s.activations == ActivationMode::Int8 && w.a8) {
        int8_activations_gemm(s, w, x, y, m, stream, x_quantized);
    } else if (w.quant) {
        // The model's own cuBLAS handle: graphs captured here keep its workspace, which no other model shares.
        quant_gemm(*w.quant, x, y, m, Dtype::F16, s.dispatch, stream, s.workspace.get(), s.workspace.bytes(), s.cublas,
                   dequantized, dequantized != nullptr && detail::dequantized_per_iteration(s, w));
    } else {
        check_rc(gpu::cublas_gemm(s.cublas, x, w.dense_values, y, m, w.n, w.k, Dtype::F16, stream),
                 "FP16 GEMM (cuBLAS) of '" + w.name + "'");
        ++s.dense_calls;
    }
    if (w.bias) check_rc(gpu::add_bias(y, w.bias.get<float>(), m, w.n, stream), "bias of '" + w.name + "'");
}

}  // namespace

bool int8_tensor_cores(int32_t device) {
    require_device(device);
    int major = 0, minor = 0;
    check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute");
    check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), "cudaDeviceGetAttribute");
    return gpu::marlin_wgmma_built() && major == 9 && minor == 0;
}

namespace detail {

void enqueue_pass(GpuModel::State &s, const PassShape &shape, cudaStream_t stream) {
    const ModelConfig &c = s.config;
    const int32_t T = shape.rows, D = c.d_model, F = c.ffn, H = c.n_heads, KV = c.kv_heads(), hd = c.head_dim;
    Activations &a = s.act;
    float *x = a.x.get<float>();
    uint16_t *xn = a.xn.get<uint16_t>(), *qkv = a.qkv.get<uint16_t>(), *att = a.att.get<uint16_t>();
    uint16_t *proj = a.proj.get<uint16_t>(), *gu = a.gu.get<uint16_t>(), *hidden = a.hidden.get<uint16_t>();
    const gpu::Segments segments{a.offsets(), shape.segments, shape.max_len};

    check_rc(gpu::embed_gather(a.tokens(), s.embed.get(), s.embed_type, x, T, D, c.vocab, stream), "embedding gather");
    const uint16_t *pending = nullptr;  // the last block's mlp_down output, added to x by the next norm
    using Fp16Forms = std::array<const uint16_t *, 5>;  // per block_linears entry: its FP16 form, or nullptr
    // A norm whose linears all take INT8 activations on the INT8 tensor cores (with one group size) writes their
    // input in INT8 itself, as SwiGLU does for mlp_down's: one pass over the row instead of a write and the
    // quantization's two reads.
    auto norm = [&](const DeviceLinear &first, const DeviceLinear *second, const uint16_t *add, const DeviceBuffer &gain,
                    const char *what) {
        const bool int8 = int8_tensor_core_linear(s, first) &&
                          (second == nullptr ||
                           (int8_tensor_core_linear(s, *second) && second->a8_group == first.a8_group));
        if (int8) {
            const Int8Input in = int8_input(s, T, D);
            check_rc(gpu::rmsnorm_residual_int8(x, add, gain.get<float>(), nullptr, in.codes, in.scales, in.sums, T, D,
                                                c.norm_eps, stream, group_sums_for(first, in), first.a8_group),
                     what);
        } else {
            check_rc(gpu::rmsnorm_residual(x, add, gain.get<float>(), xn, T, D, c.norm_eps, stream), what);
        }
        return int8;
    };
    auto run_block = [&](const DeviceBlock &b, const Fp16Forms &fp16) {
        const bool qkv_int8 = norm(b.qkv, nullptr, pending, b.attn_norm, "residual + attn_norm");
        gemm(s, b.qkv, xn, qkv, T, stream, fp16[0], qkv_int8);
        check_rc(gpu::rope_qk(qkv, a.rope_cos.get<float>(), a.rope_sin.get<float>(), T, H, hd, stream, a.positions(),
                              KV),
                 "RoPE");
        const int32_t attention_setting = s.dispatch[DispatchSetting::Attention];
        const gpu::AttentionKernel attention = attention_setting == 1   ? gpu::AttentionKernel::Simt
                                               : attention_setting == 2 ? gpu::AttentionKernel::TensorCore
                                                                        : gpu::AttentionKernel::Auto;
        check_rc(gpu::causal_attention(qkv, att, T, H, hd, stream, attention, segments, KV), "attention");
        gemm(s, b.out, att, proj, T, stream, fp16[1]);
        const bool gate_up_int8 =
            norm(b.gate_up, b.up.n == 0 ? nullptr : &b.up, proj, b.mlp_norm, "residual + mlp_norm");
        gemm(s, b.gate_up, xn, gu, T, stream, fp16[2], gate_up_int8);
        if (b.up.n != 0) gemm(s, b.up, xn, gu + a.up_offset, T, stream, fp16[3], gate_up_int8);
        const uint16_t *up = b.up.n == 0 ? gu + F : gu + a.up_offset;
        const int ld = b.up.n == 0 ? 2 * F : F;
        const bool down_int8 = int8_tensor_core_linear(s, b.down);
        if (down_int8) {
            const Int8Input in = int8_input(s, T, F);
            check_rc(gpu::swiglu_int8(gu, up, ld, in.codes, in.scales, in.sums, T, F, stream,
                                      group_sums_for(b.down, in), b.down.a8_group),
                     "SwiGLU");
        } else {
            check_rc(gpu::swiglu(gu, up, ld, hidden, T, F, stream), "SwiGLU");
        }
        gemm(s, b.down, hidden, proj, T, stream, fp16[4], down_int8);
        pending = proj;
    };
    for (const DeviceBlock &b : s.pre) run_block(b, Fp16Forms{});
    Fp16Forms loop_fp16{};
    std::array<uint16_t *, 5> per_iteration{};  // loop_fp16 of the linears dequantized at each iteration
    size_t used = 0;  // the settings may have changed since loop_fp16 was sized: what does not fit takes the usual path
    const BlockLinears loop_linears = block_linears(s.loop);
    for (size_t i = 0; i < loop_linears.size(); ++i) {
        const bool each_iteration = dequantized_per_iteration(s, *loop_linears[i]);
        if (!each_iteration && !dequantized_once(s, *loop_linears[i], T)) continue;
        const size_t bytes = dequantized_bytes(*loop_linears[i]->quant);
        if (used + bytes > s.loop_fp16.bytes()) {
            // No usual path gives an iteration's codes: ensure_buffers sizes loop_fp16 for them at every call.
            if (each_iteration) {
                fail(TL_ERR_INTERNAL, "no room for the per-iteration weight of '" + loop_linears[i]->name + "'");
            }
            continue;
        }
        auto *w = reinterpret_cast<uint16_t *>(s.loop_fp16.get<char>() + used);
        if (each_iteration) {
            per_iteration[i] = w;
        } else {
            dequantize_weight(*loop_linears[i]->quant, w, stream);
        }
        loop_fp16[i] = w;
        used += bytes;
    }
    for (int32_t l = 0; l < c.loops; ++l) {
        for (size_t i = 0; i < loop_linears.size(); ++i) {
            if (per_iteration[i]) {
                dequantize_weight_iteration(*loop_linears[i]->quant, l, c.loops, per_iteration[i], stream);
            }
        }
        run_block(s.loop, loop_fp16);
    }
    check_rc(gpu::rmsnorm_residual(x, pending, s.final_norm.get<float>(), xn, T, D, c.norm_eps, stream),
             "residual + final_norm");

    if (!shape.head) return;  // a comparison runs the heads of both models itself (compare_cuda)
    // Every row, in chunks whose logits fit the buffer; a sequence's last row has target -1 and is not read back.
    for (int32_t t0 = 0; t0 < T; t0 += a.chunk) {
        const int32_t rows = std::min(a.chunk, T - t0);
        uint16_t *logits = a.logits.get<uint16_t>();
        gemm(s, s.head, xn + static_cast<size_t>(t0) * D, logits, rows, stream);
        check_rc(gpu::head_nll(logits, s.head.n, rows, c.vocab, a.targets() + t0, a.nll.get<float>() + t0, stream,
                               a.greedy.get<uint8_t>() + t0),
                 "head log-softmax");
        if (shape.top_k > 0) {  // from the same logits chunk: top-k costs no second head GEMM
            const size_t at = static_cast<size_t>(t0) * shape.top_k;
            check_rc(gpu::head_top_k(logits, s.head.n, rows, c.vocab, shape.top_k, a.top_ids.get<int32_t>() + at,
                                     a.top_logprobs.get<float>() + at, stream),
                     "head top-k");
        }
    }
}

}  // namespace detail

namespace {

// One sequence of a call: tokens[0, len), scored from index first_scored on; token j's NLL (j >= 1) goes to
// token_nll[j - 1] when token_nll is set, its top-k tokens (top_k > 0) to top_ids / top_logprobs [(j - 1) * top_k ..];
// its result to scores[index] when scores is set.
struct Segment {
    const int32_t *tokens;
    int32_t len;
    int32_t first_scored;
    float *token_nll;
    int32_t *top_ids = nullptr;
    float *top_logprobs = nullptr;
};

// Packs consecutive segments from `first` into one pass of at most `capacity` rows (at least one segment), writing
// each model's metadata (tokens, targets, positions, offsets) in the layout of its own buffers' rows R. Returns the
// end of the pass's segments; `shape` gets its rows, segments and longest one.
size_t pack_pass(const std::vector<Segment> &segments, size_t first, int32_t capacity,
                 std::initializer_list<GpuModel::State *> models, PassShape &shape) {
    size_t end = first;
    while (end < segments.size() && shape.segments < gpu::kMaxSegments &&
           (end == first || shape.rows + segments[end].len <= capacity)) {
        const Segment &g = segments[end++];
        for (GpuModel::State *s : models) {
            const int32_t R = s->act.rows;
            int32_t *tokens = s->host_meta.data(), *targets = tokens + R, *positions = tokens + 2 * R;
            tokens[3 * R + shape.segments] = shape.rows;
            for (int32_t j = 0; j < g.len; ++j) {
                tokens[shape.rows + j] = g.tokens[j];
                targets[shape.rows + j] = j + 1 < g.len ? g.tokens[j + 1] : -1;
                positions[shape.rows + j] = j;
            }
        }
        ++shape.segments;
        shape.rows += g.len;
        shape.max_len = std::max(shape.max_len, g.len);
    }
    for (GpuModel::State *s : models) {
        const int32_t R = s->act.rows;
        s->host_meta[3 * static_cast<size_t>(R) + shape.segments] = shape.rows;
    }
    return end;
}

// Copies a packed pass's metadata to the model's device buffer, up to the offsets' end (not the unused tail).
void upload_meta(GpuModel::State &s, const PassShape &shape, cudaStream_t stream) {
    const size_t R = static_cast<size_t>(s.act.rows);
    check_cuda(cudaMemcpyAsync(s.act.meta.get(), s.host_meta.data(), (3 * R + shape.segments + 1) * sizeof(int32_t),
                               cudaMemcpyHostToDevice, stream),
               "cudaMemcpyAsync (tokens)");
}

// Scores `segments` in passes of up to a pass's rows (pass_rows), packing consecutive segments into each: uploads
// a pass's metadata, runs it (run_pass), reads its NLLs back and adds them up per segment. Holds `lock` except
// around the progress callback, which is called after each pass with (scored tokens done, all scored tokens).
ScoreResult score_segments(GpuModel::State &s, const std::vector<Segment> &segments, const ScoreOptions &options,
                           cudaStream_t stream, std::unique_lock<std::mutex> &lock, GpuScoreStats &stats,
                           SequenceScore *scores) {
    int32_t longest = 0;
    size_t total_tokens = 0;
    uint64_t to_score = 0;
    for (const Segment &g : segments) {
        longest = std::max(longest, g.len);
        total_tokens += static_cast<size_t>(g.len);
        to_score += static_cast<uint64_t>(g.len - g.first_scored);
    }
    ScoreResult result;
    if (segments.empty()) return result;
    const int32_t capacity = pass_rows(s, options.pass_tokens, longest, total_tokens, options.max_memory_bytes);
    ensure_buffers(s, capacity, options.max_memory_bytes, stream);

    for (size_t first = 0; first < segments.size();) {
        // The pass: as many consecutive segments as fit `capacity` rows (at least one). The buffers may be larger,
        // from an earlier call; their layout follows their own size R.
        const int32_t *offsets = s.host_meta.data() + 3 * static_cast<size_t>(s.act.rows);
        PassShape shape;
        shape.top_k = options.top_k;
        const size_t end = pack_pass(segments, first, capacity, {&s}, shape);
        upload_meta(s, shape, stream);
        const uint64_t captures = s.captures, replays = s.replays;
        const double capture_seconds = s.capture_seconds;
        const Tally ran = run_pass(s, shape, stream, options.use_graphs);
        check_cuda(cudaMemcpyAsync(s.host_nll.data(), s.act.nll.get(), shape.rows * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream),
                   "cudaMemcpyAsync (NLL)");
        check_cuda(cudaMemcpyAsync(s.host_greedy.data(), s.act.greedy.get(), shape.rows, cudaMemcpyDeviceToHost,
                                   stream),
                   "cudaMemcpyAsync (greedy)");
        const size_t top_entries = static_cast<size_t>(shape.rows) * options.top_k;
        if (top_entries > 0) {
            check_cuda(cudaMemcpyAsync(s.host_top_ids.data(), s.act.top_ids.get(), top_entries * sizeof(int32_t),
                                       cudaMemcpyDeviceToHost, stream),
                       "cudaMemcpyAsync (top-k ids)");
            check_cuda(cudaMemcpyAsync(s.host_top_logprobs.data(), s.act.top_logprobs.get(),
                                       top_entries * sizeof(float), cudaMemcpyDeviceToHost, stream),
                       "cudaMemcpyAsync (top-k log-probabilities)");
        }
        check_cuda(cudaStreamSynchronize(stream), "the forward pass of " + std::to_string(shape.rows) + " tokens");
        s.ran += ran;
        s.windows += end - first;
        add_tally(stats, ran);
        stats.windows += end - first;
        stats.graph_captures += s.captures - captures;
        stats.graph_replays += s.replays - replays;
        stats.capture_seconds += s.capture_seconds - capture_seconds;
        for (size_t i = first; i < end; ++i) {
            const Segment &g = segments[i];
            const size_t row0 = static_cast<size_t>(offsets[i - first]);
            SequenceScore score;
            for (int32_t j = 1; j < g.len; ++j) {  // token j, predicted by row j - 1
                const float nll = s.host_nll[row0 + j - 1];
                if (g.token_nll != nullptr) g.token_nll[j - 1] = nll;
                if (j < g.first_scored) continue;
                score.nll_sum += nll;
                score.greedy = score.greedy && s.host_greedy[row0 + j - 1] != 0;
            }
            score.tokens_scored = static_cast<uint64_t>(g.len - g.first_scored);
            if (g.top_ids != nullptr) {
                const size_t k = static_cast<size_t>(options.top_k), n = (static_cast<size_t>(g.len) - 1) * k;
                std::copy_n(s.host_top_ids.begin() + row0 * k, n, g.top_ids);
                std::copy_n(s.host_top_logprobs.begin() + row0 * k, n, g.top_logprobs);
            }
            result.nll_sum += score.nll_sum;
            result.tokens_scored += score.tokens_scored;
            if (scores != nullptr) scores[i] = score;
        }
        first = end;
        if (options.progress) {
            lock.unlock();
            const bool go_on = options.progress(result.tokens_scored, to_score);
            lock.lock();
            s.dispatch = options.dispatch;
            s.activations = options.activations;
            if (!go_on) {
                fail(TL_ERR_CANCELLED, "scoring cancelled by the progress callback after " +
                                           std::to_string(result.tokens_scored) + " of " + std::to_string(to_score) +
                                           " tokens");
            }
            // A call made meanwhile may have dropped graphs or grown the workspace (settings change): check again.
            ensure_buffers(s, capacity, options.max_memory_bytes, stream);
        }
    }
    return result;
}

// The checks score_cuda and score_batch_cuda share; returns the stream to run on.
cudaStream_t check_call(GpuModel::State &s, const ScoreOptions &options, int32_t device, void *stream) {
    if (device != s.device) {
        fail(TL_ERR_INVALID_ARGUMENT, "device " + std::to_string(device) + " is not the GpuModel's device " +
                                          std::to_string(s.device));
    }
    if (options.pass_tokens < 0) {
        fail(TL_ERR_INVALID_ARGUMENT, "pass_tokens = " + std::to_string(options.pass_tokens) + " is negative");
    }
    if (options.linear_input) fail(TL_ERR_UNSUPPORTED, "linear_input (calibration) is a CPU backend hook");
    if (options.activations == ActivationMode::Fp8) {
        fail(TL_ERR_UNSUPPORTED, "activations fp8 on the CUDA backend: not implemented (the CPU backend has them)");
    }
    // The host check (require_gpu_activations) on the forms decided at load, which never change: read without the
    // lock, before the call builds anything for INT8 activations.
    if (options.activations == ActivationMode::Int8) {
        auto check_block = [&](const DeviceBlock &b, bool looped) {
            for (const DeviceLinear *l : block_linears(b)) {
                if (l->n > 0 && !l->a8) {
                    fail(TL_ERR_UNSUPPORTED, "activations int8 on the CUDA backend: '" + l->name + "' is not an "
                                             "INT8 weight with one scale per row, or an INT4 one with one scale per "
                                             "row or groups of 32, 64 or 128 on a GPU of compute capability 9.0, the "
                                             "kinds its INT8 kernels take");
                }
                if (looped && l->a8_int4 && options.cross_iter_round()) {
                    fail(TL_ERR_UNSUPPORTED, "activations int8 on the CUDA backend: cross-iteration rounding of '" +
                                                 l->name + "' with INT8 activations runs on the CPU backend only");
                }
            }
        };
        for (const DeviceBlock &b : s.pre) check_block(b, false);
        check_block(s.loop, true);
    }
    return stream != nullptr ? static_cast<cudaStream_t>(stream) : s.own_stream;
}

}  // namespace

ScoreResult score_cuda(GpuModel &model, const int32_t *tokens, size_t n_tokens, const ScoreOptions &options,
                       int32_t device, void *stream_ptr, GpuScoreStats *call_stats) {
    GpuModel::State &s = *model.state_;
    const cudaStream_t stream = check_call(s, options, device, stream_ptr);
    const ScorePlan plan = plan_score(s.config, tokens, n_tokens, options.window);
    const size_t stride = static_cast<size_t>(plan.window) - 1;
    std::vector<Segment> windows(plan.n_windows);
    for (size_t w = 0; w < plan.n_windows; ++w) {
        const size_t start = w * stride;
        windows[w] = Segment{tokens + start, static_cast<int32_t>(std::min<size_t>(plan.window, n_tokens - start)), 1,
                             options.token_nll != nullptr ? options.token_nll + start : nullptr};
        if (options.top_k > 0) {
            windows[w].top_ids = options.top_ids + start * options.top_k;
            windows[w].top_logprobs = options.top_logprobs + start * options.top_k;
        }
    }
    // Held while this call uses the model's buffers, and released around the progress callback (after a pass's work
    // is done and its NLLs are copied out), so the callback may call into the library, this model included.
    std::unique_lock<std::mutex> lock(s.mutex);
    s.dispatch = options.dispatch;
    s.activations = options.activations;
    DeviceScope scope(s.device);
    GpuScoreStats stats;
    // Under the lock, after check_call: a declined call builds nothing, and no other call's pass runs meanwhile.
    if (options.activations == ActivationMode::Int8) stats.setup_seconds = ensure_int8_weights(s);
    ScoreResult result = score_segments(s, windows, options, stream, lock, stats, nullptr);
    result.n_windows = static_cast<int32_t>(plan.n_windows);
    if (call_stats != nullptr) *call_stats = stats;
    return result;
}

ScoreResult score_batch_cuda(GpuModel &model, const Sequence *sequences, size_t n_sequences,
                             const ScoreOptions &options, int32_t device, void *stream_ptr, SequenceScore *scores,
                             GpuScoreStats *call_stats) {
    GpuModel::State &s = *model.state_;
    const cudaStream_t stream = check_call(s, options, device, stream_ptr);
    check_sequences(s.config, sequences, n_sequences, options.window);
    std::vector<Segment> segments(n_sequences);
    size_t nll_offset = 0;
    for (size_t i = 0; i < n_sequences; ++i) {
        const Sequence &q = sequences[i];
        segments[i] = Segment{q.tokens, static_cast<int32_t>(q.n_tokens), static_cast<int32_t>(q.first_scored()),
                              options.token_nll != nullptr ? options.token_nll + nll_offset : nullptr};
        if (options.top_k > 0) {
            segments[i].top_ids = options.top_ids + nll_offset * options.top_k;
            segments[i].top_logprobs = options.top_logprobs + nll_offset * options.top_k;
        }
        nll_offset += q.n_tokens - 1;
    }
    std::unique_lock<std::mutex> lock(s.mutex);  // as in score_cuda
    s.dispatch = options.dispatch;
    s.activations = options.activations;
    DeviceScope scope(s.device);
    GpuScoreStats stats;
    if (options.activations == ActivationMode::Int8) stats.setup_seconds = ensure_int8_weights(s);
    ScoreResult result = score_segments(s, segments, options, stream, lock, stats, scores);
    result.n_windows = static_cast<int32_t>(n_sequences);
    if (call_stats != nullptr) *call_stats = stats;
    return result;
}

ScoreResult compare_cuda(GpuModel &reference, GpuModel &test, const int32_t *tokens, size_t n_tokens,
                         const ScoreOptions &options, const DispatchSettings &test_dispatch, int32_t device,
                         void *stream_ptr, const CompareOutputs &out, GpuScoreStats *call_stats) {
    GpuModel::State &r = *reference.state_, &t = *test.state_;
    const bool same = &r == &t;  // one forward pass and one head serve both sides
    require_gpu_activations(options.activations);
    const cudaStream_t stream = check_call(r, options, device, stream_ptr);
    check_call(t, options, device, stream_ptr);
    if (r.config.vocab != t.config.vocab) {
        fail(TL_ERR_INVALID_ARGUMENT, "the reference's vocabulary has " + std::to_string(r.config.vocab) +
                                          " tokens and the test's " + std::to_string(t.config.vocab));
    }
    if (options.top_k != 0) fail(TL_ERR_INVALID_ARGUMENT, "a comparison computes no top-k tokens");
    const ScorePlan plan = plan_compare(r.config, t.config, tokens, n_tokens, options.window);
    const size_t stride = static_cast<size_t>(plan.window) - 1;
    std::vector<Segment> windows(plan.n_windows);
    int32_t longest = 0;
    for (size_t w = 0; w < plan.n_windows; ++w) {
        const size_t start = w * stride;
        windows[w] = Segment{tokens + start, static_cast<int32_t>(std::min<size_t>(plan.window, n_tokens - start)), 1,
                             nullptr};
        longest = std::max(longest, windows[w].len);
    }
    const size_t total_tokens = n_tokens + plan.n_windows - 1;  // the windows overlap by one token
    // Both models' locks at once (std::lock: no deadlock with a call comparing them the other way round), released
    // together around the progress callback, as score_cuda releases its one.
    std::unique_lock<std::mutex> lock_r(r.mutex, std::defer_lock), lock_t(t.mutex, std::defer_lock);
    auto lock_both = [&] {
        if (same) {
            lock_r.lock();
        } else {
            std::lock(lock_r, lock_t);
        }
        r.dispatch = options.dispatch;
        if (!same) t.dispatch = test_dispatch;
        r.activations = t.activations = ActivationMode::Fp16;
    };
    auto unlock_both = [&] {
        lock_r.unlock();
        if (!same) lock_t.unlock();
    };
    lock_both();
    DeviceScope scope(r.device);
    const uint64_t budget = same ? options.max_memory_bytes : options.max_memory_bytes / 2;
    int32_t capacity = pass_rows(r, options.pass_tokens, longest, total_tokens, budget);
    if (!same) capacity = std::min(capacity, pass_rows(t, options.pass_tokens, longest, total_tokens, budget));
    auto ensure = [&] {
        ensure_buffers(r, capacity, budget, stream);
        if (!same) ensure_buffers(t, capacity, budget, stream);
    };
    ensure();

    GpuScoreStats stats;
    ScoreResult result;
    result.n_windows = static_cast<int32_t>(plan.n_windows);
    const uint64_t to_score = n_tokens - 1;
    std::vector<GpuModel::State *> models{&r};
    if (!same) models.push_back(&t);
    for (size_t first = 0; first < windows.size();) {
        PassShape shape;
        shape.head = false;
        const size_t end = same ? pack_pass(windows, first, capacity, {&r}, shape)
                                : pack_pass(windows, first, capacity, {&r, &t}, shape);
        const int32_t *offsets = r.host_meta.data() + 3 * static_cast<size_t>(r.act.rows);
        for (GpuModel::State *s : models) {
            upload_meta(*s, shape, stream);
            const uint64_t captures = s->captures, replays = s->replays;
            const double capture_seconds = s->capture_seconds;
            const Tally ran = run_pass(*s, shape, stream, options.use_graphs);
            s->ran += ran;
            s->windows += end - first;
            add_tally(stats, ran);
            stats.graph_captures += s->captures - captures;
            stats.graph_replays += s->replays - replays;
            stats.capture_seconds += s->capture_seconds - capture_seconds;
        }
        // Both heads a chunk at a time, each into its own model's logits buffer, then one kernel over the two.
        const Tally ref_before = r.counted(), test_before = t.counted();
        const int32_t chunk = std::min(r.act.chunk, t.act.chunk);
        const size_t R = static_cast<size_t>(r.act.rows);
        float *kl = r.act.compare.get<float>(), *nll_test = kl + R;
        for (int32_t t0 = 0; t0 < shape.rows; t0 += chunk) {
            const int32_t rows = std::min(chunk, shape.rows - t0);
            uint16_t *ref_logits = r.act.logits.get<uint16_t>(), *test_logits = t.act.logits.get<uint16_t>();
            gemm(r, r.head, r.act.xn.get<uint16_t>() + static_cast<size_t>(t0) * r.config.d_model, ref_logits, rows,
                 stream);
            if (!same) {
                gemm(t, t.head, t.act.xn.get<uint16_t>() + static_cast<size_t>(t0) * t.config.d_model, test_logits,
                     rows, stream);
            }
            check_rc(gpu::compare_logits(ref_logits, r.head.n, test_logits, t.head.n, rows, r.config.vocab,
                                         r.act.targets() + t0, kl + t0, r.act.nll.get<float>() + t0, nll_test + t0,
                                         r.act.greedy.get<uint8_t>() + t0, stream),
                     "logits comparison");
        }
        const Tally ref_heads = r.counted() - ref_before;
        r.ran += ref_heads;
        add_tally(stats, ref_heads);
        if (!same) {
            const Tally test_heads = t.counted() - test_before;
            t.ran += test_heads;
            add_tally(stats, test_heads);
        }
        stats.windows += end - first;
        check_cuda(cudaMemcpyAsync(r.host_nll.data(), r.act.nll.get(), shape.rows * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream),
                   "cudaMemcpyAsync (NLL)");
        check_cuda(cudaMemcpyAsync(r.host_greedy.data(), r.act.greedy.get(), shape.rows, cudaMemcpyDeviceToHost,
                                   stream),
                   "cudaMemcpyAsync (top-1 agreement)");
        check_cuda(cudaMemcpyAsync(r.host_compare.data(), kl, shape.rows * sizeof(float), cudaMemcpyDeviceToHost,
                                   stream),
                   "cudaMemcpyAsync (KL)");
        check_cuda(cudaMemcpyAsync(r.host_compare.data() + R, nll_test, shape.rows * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream),
                   "cudaMemcpyAsync (test NLL)");
        check_cuda(cudaStreamSynchronize(stream), "the comparison of " + std::to_string(shape.rows) + " tokens");
        for (size_t i = first; i < end; ++i) {
            const size_t row0 = static_cast<size_t>(offsets[i - first]), start = i * stride;
            for (int32_t j = 1; j < windows[i].len; ++j) {  // token j of the window, predicted by row j - 1
                const size_t row = row0 + j - 1, at = start + j - 1;
                out.kl[at] = r.host_compare[row];
                out.nll_reference[at] = r.host_nll[row];
                out.nll_test[at] = r.host_compare[R + row];
                out.top1_match[at] = r.host_greedy[row];
                result.nll_sum += r.host_nll[row];
            }
            result.tokens_scored += static_cast<uint64_t>(windows[i].len - 1);
        }
        first = end;
        if (options.progress) {
            unlock_both();
            const bool go_on = options.progress(result.tokens_scored, to_score);
            lock_both();
            if (!go_on) {
                fail(TL_ERR_CANCELLED, "comparison cancelled by the progress callback after " +
                                           std::to_string(result.tokens_scored) + " of " + std::to_string(to_score) +
                                           " tokens");
            }
            ensure();  // a call made meanwhile may have dropped graphs or grown the buffers
        }
    }
    if (call_stats != nullptr) *call_stats = stats;
    return result;
}

#endif  // TL_WITH_CUDA

}  // namespace tl
