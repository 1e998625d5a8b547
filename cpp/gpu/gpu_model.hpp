// A model on one GPU (GpuModel): its weights, packed for the dispatcher, and the buffers and CUDA graphs of its
// forward passes (gpu_forward.hpp runs them).
//
// Every linear layer runs through the dispatcher (gemm_dispatch.hpp): the five per block, with gate and up packed as
// ONE weight (N = 2·ffn; one GEMM, then SwiGLU), and a quantized head packed with N padded to a multiple of 64 (zero
// codes, scales and zeros in the padding rows, whose logits the softmax ignores), so V = 50257 takes the
// Marlin-class path. A dense or tied head is not INT4: it is an FP16 copy of its values (the embedding table itself
// when that is F16) multiplied through cuBLAS (gpu::cublas_gemm), its rows padded to a multiple of 64 as well
// so that cuBLAS's aligned kernels serve it; dense block linears likewise.
//
// INT8 activations need other forms of the block linears (integer codes in input order, FP32 scales and zeros; see
// DeviceLinear in gpu_model_state.hpp), 0.5 to 1 byte a weight more. They are built from the host Model the first
// time a call asks for INT8 activations (after its checks, under the model's lock), never for FP16 ones, and kept
// until the GpuModel is freed.
//
// Thread safety: a GpuModel serializes its own calls (an internal mutex held while a score_cuda call uses the model,
// released around the progress callback), so the caller needs no lock; calls on one GpuModel take turns pass by
// pass, calls on different GpuModels may overlap. Each call runs under the dispatcher settings it passes
// (ScoreOptions::dispatch, the settings of the C API's model). Building the INT8-activation forms happens under that
// mutex too: calls that arrive meanwhile wait, and every later call sees them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "format/model.hpp"
#include "gpu/gemm_dispatch.hpp"
#include "score/compare.hpp"
#include "score/rope.hpp"  // rope_tables: the RoPE tables the device model uploads (the tests build them too)
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
    uint64_t int8_activations = 0;  // GEMMs of INT8 activations on the INT8 tensor-core kernel (W8A8 and W4A8)
    uint64_t windows = 0;  // windows (score_cuda) and sequences (score_batch_cuda)
    uint64_t graph_captures = 0;
    uint64_t graph_replays = 0;
    uint64_t graph_capture_failures = 0;  // captures that failed; those pass shapes then run eagerly
    double capture_seconds = 0.0;         // wall time spent capturing and instantiating graphs
    double setup_seconds = 0.0;           // wall time spent building the weights' forms for INT8 activations
};

class GpuModel {
public:
    // Uploads and packs `model` on `device` (TL_ERR_NO_DEVICE without CUDA or a device; TL_ERR_INVALID_ARGUMENT for
    // an inconsistent model; TL_ERR_UNSUPPORTED for head_dim > 256). The GpuModel keeps a pointer to `model`, which
    // the caller owns and must keep, unchanged, until the GpuModel is freed: the first call asking for INT8
    // activations builds their forms from it (the C API's tl_model holds the Model beside its GpuModels).
    GpuModel(const Model &model, int32_t device, const GpuModelOptions &options = {});
    ~GpuModel();
    GpuModel(const GpuModel &) = delete;
    GpuModel &operator=(const GpuModel &) = delete;

    int32_t device() const;
    const ModelConfig &config() const;
    GpuScoreStats stats() const;
    // Device bytes of the weights in every form built so far: the INT8-activation forms count once a call built them.
    uint64_t weight_bytes() const;
    // Device bytes held: weight_bytes(), activations, logits chunk, workspace.
    uint64_t device_bytes() const;

    struct State;

private:
    std::unique_ptr<State> state_;
    friend ScoreResult score_cuda(GpuModel &, const int32_t *, size_t, const ScoreOptions &, int32_t, void *,
                                  GpuScoreStats *);
    friend ScoreResult score_batch_cuda(GpuModel &, const Sequence *, size_t, const ScoreOptions &, int32_t, void *,
                                        SequenceScore *, GpuScoreStats *);
    friend ScoreResult compare_cuda(GpuModel &, GpuModel &, const int32_t *, size_t, const ScoreOptions &,
                                    const DispatchSettings &, int32_t, void *, const CompareOutputs &,
                                    GpuScoreStats *);
};

}  // namespace tl
