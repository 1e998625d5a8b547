// The whole forward pass on the GPU, on a GpuModel (gpu_model.hpp): score_cuda, the GPU twin of score_cpu (same
// windows, same token checks, per-token NLL), and score_batch_cuda for many sequences. Independent sequences (a call's
// windows, or a batch's sequences) are packed into forward passes of up to 8192 tokens, with attention inside each
// sequence only (gpu::Segments) and positions restarting at 0 in each.
// Precision: FP32 residual stream, FP16 GEMM inputs and outputs, FP32 math in every other kernel, NLL reduced in
// FP32 per position and summed in double (cuda/forward/forward_kernels.hpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include <string>

#include "gpu/gpu_model.hpp"
#include "score/compare.hpp"
#include "score/score_plan.hpp"
#include "util/error.hpp"

namespace tl {

// Scores `tokens` like score_cpu (docs/architecture.md: windows of options.window tokens, default max_seq,
// overlapping by one; positions restart at 0 per window; options.token_nll receives token i+1's NLL at [i];
// options.progress is called after each pass). options.n_threads is ignored; options.linear_input is
// TL_ERR_UNSUPPORTED. With cross-iteration rounding on (options.dispatch), looped linears that carry rounding channels
// are dequantized at each iteration with its codes and run on cuBLAS.
// `device` must be the GpuModel's.
// Work runs on `stream` (a cudaStream_t; nullptr = the GpuModel's own non-blocking stream); the call returns when
// it is done. Buffers are allocated on the first call and when a call needs longer passes than before, never
// otherwise; options.max_memory_bytes bounds them (ScoreOptions: passes shrink towards the longest window to fit).
// With options.use_graphs, each pass shape's (rows, sequences, longest) forward pass is captured in a CUDA graph
// after its first eager run and replayed afterwards; a graph is dropped (and captured again) when the dispatcher
// settings or the buffers change. `call_stats`, when not null, receives
// what this call ran (GEMMs by path, windows, captures, replays).
ScoreResult score_cuda(GpuModel &model, const int32_t *tokens, size_t n_tokens, const ScoreOptions &options,
                       int32_t device, void *stream, GpuScoreStats *call_stats = nullptr);

// Scores independent sequences (check_sequences), packing as many as fit a pass's token budget into each forward pass,
// with attention inside each sequence only. scores[i] receives sequence i's result; options.token_nll (when set)
// receives every predicted token's NLL, the sequences one after another (n_tokens - 1 each); options.progress is
// called after each pass with the scored tokens done. Stream, graphs, budget and call_stats as for score_cuda.
// Returns the totals (n_windows = the number of sequences).
ScoreResult score_batch_cuda(GpuModel &model, const Sequence *sequences, size_t n_sequences,
                             const ScoreOptions &options, int32_t device, void *stream, SequenceScore *scores,
                             GpuScoreStats *call_stats = nullptr);

// The GPU twin of compare_cpu (cpu_forward.hpp): both models, on the same device, run the same windows packed into the
// same passes; each pass runs both forward passes up to the head's input, then, a logits chunk at a time, both heads
// into their own model's logits buffer and one kernel (gpu::compare_logits) that reduces the two chunks row by row
// into out's arrays. `reference` and `test` may be the same GpuModel (one forward pass and one head then serve
// both). Both models' buffers are held for the whole call (their locks taken together, released around progress).
// options.dispatch is the reference's dispatcher settings, test_dispatch the test's; options.max_memory_bytes bounds
// both models' buffers together (half each). Returns tokens_scored, n_windows and the reference's nll_sum.
ScoreResult compare_cuda(GpuModel &reference, GpuModel &test, const int32_t *tokens, size_t n_tokens,
                         const ScoreOptions &options, const DispatchSettings &test_dispatch, int32_t device,
                         void *stream, const CompareOutputs &out, GpuScoreStats *call_stats = nullptr);

// The activation precisions the CUDA backend runs; another is TL_ERR_UNSUPPORTED (so that AUTO scores on the CPU,
// which implements them all). Comparisons: FP16 only (compare_cuda checks options.activations; its caller checks the
// test side's).
inline void require_gpu_activations(ActivationMode mode) {
    if (mode != ActivationMode::Fp16) {
        fail(TL_ERR_UNSUPPORTED, std::string("activations ") + activation_mode_name(mode) +
                                     " are implemented on the CPU backend only for comparisons");
    }
}

// INT8 activations on the GPU take a block linear with K up to 2^17: an INT8 weight with one scale per row (per
// output column), K a multiple of 4 (W8A8: the INT8 tensor-core kernel, cuda/int8_gemm.cu, where it runs, else
// cuBLAS's INT8 GEMM and an epilogue, cuda/w8a8_gemm.cu), or where the INT8 tensor-core kernel runs, an INT4 weight,
// K a multiple of 16, with one scale per row or groups of 32, 64 or 128 in input order (W4A8). All compute the CPU
// backend's rule for such weights.
inline bool w8a8_linear(const Linear &w) {
    return w.quantized && w.bits == 8 && w.group_size == w.k && w.k % 4 == 0 && w.k <= (1 << 17);
}
// Why an INT4 weight is not W4A8 on the INT8 tensor-core kernel, or "" where it is.
inline std::string w4a8_refusal(const Linear &w) {
    if (!w.quantized || w.bits != 4) return "not an INT4 weight";
    if (w.k % 16 != 0 || w.k > (1 << 17)) return "K = " + std::to_string(w.k) + " (a multiple of 16 up to 131072)";
    if (w.group_size == w.k) return "";
    if ((w.group_size != 32 && w.group_size != 64 && w.group_size != 128) || w.k % w.group_size != 0) {
        return "INT4 groups of " + std::to_string(w.group_size) + " (the kernel takes groups of 32, 64 or 128, or one "
               "per row)";
    }
    // The kernel's groups are runs of the input's columns, which act-order's groups are not.
    if (w.k_perm != nullptr) return "grouped INT4 with a K permutation (act-order)";
    return "";
}
inline bool w4a8_linear(const Linear &w) { return w4a8_refusal(w).empty(); }

// Scoring: FP16 always; INT8 when every block linear is w8a8_linear, or w4a8_linear where `int8_tensor_cores` (the
// device runs gpu::int8_gemm); FP8 not yet.
inline void require_gpu_activations(const Model &model, ActivationMode mode, bool int8_tensor_cores) {
    if (mode == ActivationMode::Fp16) return;
    const std::string what = std::string("activations ") + activation_mode_name(mode) + " on the CUDA backend: ";
    if (mode != ActivationMode::Int8) fail(TL_ERR_UNSUPPORTED, what + "not implemented (the CPU backend has them)");
    for (const Linear *w : model.linears()) {
        if (w == &model.head) continue;  // the head's input stays as computed
        if (w8a8_linear(*w) || (int8_tensor_cores && w4a8_linear(*w))) continue;
        if (int8_tensor_cores && w->quantized && w->bits == 4) {
            fail(TL_ERR_UNSUPPORTED, what + "'" + w->name + "': " + w4a8_refusal(*w) +
                                         "; the CPU backend takes every weight");
        }
        fail(TL_ERR_UNSUPPORTED,
             what + "'" + w->name + "' is not an INT8 weight with one scale per row (K a multiple of 4 up to 131072)" +
                 (int8_tensor_cores ? " or an INT4 weight with one scale per row or groups of 32, 64 or 128 (K a "
                                      "multiple of 16 up to 131072)"
                                    : " (INT4 weights need a GPU of compute capability 9.0)") +
                 ", the kinds its INT8 kernels take; the CPU backend takes every weight");
    }
}

// Whether gpu::int8_gemm runs on `device` (compute capability 9.0, a build for sm_90a). Two attribute queries.
bool int8_tensor_cores(int32_t device);

}  // namespace tl
