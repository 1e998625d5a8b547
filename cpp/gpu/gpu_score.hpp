// The whole forward pass on the GPU: a model's weights and buffers on one device (GpuModel) and score_cuda, the
// GPU twin of score_cpu (same windows, same token checks, per-token NLL), and score_batch_cuda for many sequences.
// Independent sequences (a call's windows, or a batch's sequences) are packed into forward passes of up to 8192
// tokens, with attention inside each sequence only (gpu::Segments) and positions restarting at 0 in each.
//
// Every linear layer runs through the dispatcher (gemm_dispatch.hpp): the five per block, with gate and up packed as
// ONE weight (N = 2·ffn; one GEMM, then SwiGLU), and a quantized head packed with N padded to a multiple of 64 (zero
// codes, scales and zeros in the padding rows, whose logits the softmax ignores), so V = 50257 takes the
// Marlin-class path. A dense or tied head is not INT4: it is an FP16 copy of its values (the embedding table itself
// when that is F16) multiplied through cuBLAS (gpu::cublas_gemm), its rows padded to a multiple of 64 as well
// so that cuBLAS's aligned kernels serve it; dense block linears likewise.
// Precision: FP32 residual stream, FP16 GEMM inputs and outputs, FP32 math in every other kernel, NLL reduced in
// FP32 per position and summed in double (cuda/forward/forward_kernels.hpp).
//
// Thread safety: a GpuModel serializes its own calls (an internal mutex held while a score_cuda call uses the model,
// released around the progress callback), so the caller needs no lock; calls on one GpuModel take turns pass by
// pass, calls on different GpuModels may overlap. The dispatcher settings (set_dispatch) are process-wide and read
// at every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "format/model.hpp"
#include "gpu/gemm_dispatch.hpp"
#include "score/score_plan.hpp"

namespace tl {

struct GpuModelOptions {
    // The forms every INT4 linear is packed with (pack_weight); add fp16_body for that path.
    PackForms forms;
    // Head positions per logits chunk, rounded up to a multiple of 8; 0 = as many as fit in 64 MiB of FP16 logits.
    int32_t head_chunk_rows = 0;
};

// What ran, accumulated over a GpuModel's life (graph replays included, which the per-weight dispatch_counts do
// not see: they count a captured GEMM once, at capture).
struct GpuScoreStats {
    DispatchCounts dispatch;  // INT4 GEMMs by path, summed over the model's weights
    uint64_t cublas_dense = 0;      // FP16 GEMMs of dense linears and dense/tied heads
    uint64_t windows = 0;  // windows (score_cuda) and sequences (score_batch_cuda)
    uint64_t graph_captures = 0;
    uint64_t graph_replays = 0;
    uint64_t graph_capture_failures = 0;  // captures that failed; those pass shapes then run eagerly
    double capture_seconds = 0.0;         // wall time spent capturing and instantiating graphs
};

class GpuModel {
public:
    // Uploads and packs `model` on `device` (TL_ERR_NO_DEVICE without CUDA or a device; TL_ERR_INVALID_ARGUMENT for
    // an inconsistent model; TL_ERR_UNSUPPORTED for head_dim > 256). The Model may be freed afterwards.
    GpuModel(const Model &model, int32_t device, const GpuModelOptions &options = {});
    ~GpuModel();
    GpuModel(const GpuModel &) = delete;
    GpuModel &operator=(const GpuModel &) = delete;

    int32_t device() const;
    const ModelConfig &config() const;
    GpuScoreStats stats() const;
    // Device bytes held: weights in every packed form, activations, logits chunk, workspace.
    uint64_t device_bytes() const;

    struct State;

private:
    std::unique_ptr<State> state_;
    friend ScoreResult score_cuda(GpuModel &, const int32_t *, size_t, const ScoreOptions &, int32_t, void *,
                                  GpuScoreStats *);
    friend ScoreResult score_batch_cuda(GpuModel &, const Sequence *, size_t, const ScoreOptions &, int32_t, void *,
                                        SequenceScore *, GpuScoreStats *);
};

// Scores `tokens` like score_cpu (docs/architecture.md: windows of options.window tokens, default max_seq,
// overlapping by one; positions restart at 0 per window; options.token_nll receives token i+1's NLL at [i];
// options.progress is called after each pass). options.n_threads is ignored; options.linear_input, and
// options.cross_iter_round on a model whose looped linears carry rounding channels, are TL_ERR_UNSUPPORTED.
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

// ---- Host-side pieces, exposed for the unit tests ----

// cos and sin of position * theta^(-2i/head_dim), positions [0, T), i < head_dim/2, computed in double and rounded
// to float (the CPU reference's table): [T][head_dim/2] each.
void rope_tables(int32_t T, int32_t head_dim, float theta, std::vector<float> &cos_table,
                 std::vector<float> &sin_table);

}  // namespace tl
