// Internal to the GPU model, compiled only with TL_WITH_CUDA: what a GpuModel holds on its device (GpuModel::State),
// and the functions that gpu_model.cpp (building the model, sizing its buffers, the graph cache) and gpu_forward.cpp
// (the forward pass and the scoring calls) call in each other.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "cublas_loader.hpp"
#include "forward/forward_kernels.hpp"
#include "gpu/device_memory.hpp"
#include "gpu/gemm_dispatch.hpp"
#include "gpu/gpu_model.hpp"
#include "gpu_kernels.hpp"

namespace tl {
namespace detail {

// GEMM calls by path: the dispatcher's per-weight counters summed, plus the dense (cuBLAS) calls.
struct Tally {
    // fp16_body, marlin_fused, marlin_correction, dequant_cublas, native, fallbacks, dense, int8 activations
    std::array<uint64_t, 8> v{};
    Tally &operator+=(const Tally &o) {
        for (size_t i = 0; i < v.size(); ++i) v[i] += o.v[i];
        return *this;
    }
    Tally operator-(const Tally &o) const {
        Tally d;
        for (size_t i = 0; i < v.size(); ++i) d.v[i] = v[i] - o.v[i];
        return d;
    }
};

inline void add_tally(GpuScoreStats &out, const Tally &t) {
    out.dispatch.fp16_body += t.v[0];
    out.dispatch.marlin_fused += t.v[1];
    out.dispatch.marlin_correction += t.v[2];
    out.dispatch.dequant_cublas += t.v[3];
    out.dispatch.native += t.v[4];
    out.dispatch.fallbacks += t.v[5];
    out.cublas_dense += t.v[6];
    out.int8_activations += t.v[7];
}

// One linear layer on the device: INT4 through the dispatcher, or FP16 values through cuBLAS.
struct DeviceLinear {
    std::string name;
    int32_t k = 0, n = 0;  // n: the device weight's rows (the head's padded N)
    int32_t groups = 0;    // INT4 groups along K
    std::shared_ptr<DeviceWeight> quant;
    DeviceBuffer dense;                      // FP16 [n][k], unless the values are shared
    const uint16_t *dense_values = nullptr;  // dense, or the embedding table (tied F16 head)
    DeviceBuffer bias;                       // FP32 [n] (zero in padding rows), added after the GEMM; empty: none
    // a8: the block linear takes INT8 activations (decided at load, never changed, so a call's checks may read it
    // before taking the model's lock). Its forms for them are built by ensure_int8_weights, on the first call that asks
    // for INT8 activations; until then the buffers are empty. Those forms: integer codes in input order (a k_perm
    // undone) and FP32 scales [n] (and zeros [n]): an INT8 weight's codes [n][k] (W8A8: gpu::int8_gemm, or
    // gpu::w8a8_gemm where that does not run), or on a device where gpu::int8_gemm runs an INT4 weight's codes packed
    // by w4a8_pack (W4A8). An INT4 weight with groups of 32, 64 or 128 (a8_group; no k_perm) keeps its scales and
    // zeros in a8_scales, packed by w4a8_pack_groups.
    bool a8 = false;
    bool a8_int4 = false;
    int32_t a8_group = 0;  // W4A8 group size, 0 for one group per row
    DeviceBuffer a8_codes, a8_scales, a8_zeros;
    uint64_t bytes = 0;  // device bytes of every form built so far
};

struct DeviceBlock {
    DeviceBuffer attn_norm, mlp_norm;  // FP32 [d_model]
    DeviceLinear qkv, out;
    // gate_up: gate and up as one weight (N = 2·ffn), `up` empty (n == 0). When the two cannot be packed together
    // (an INT4 and a dense one, different group sizes or K orders) gate_up holds the gate alone and `up` the up
    // projection.
    DeviceLinear gate_up, up;
    DeviceLinear down;
};

// Activations and scratch for windows of up to `rows` tokens.
struct Activations {
    int32_t rows = 0;
    int32_t chunk = 0;     // head positions per logits chunk, a multiple of 8 (keeps chunk starts 16-byte aligned)
    size_t up_offset = 0;  // halves: where a separate up projection writes inside gu (16-byte aligned)
    DeviceBuffer x;                   // FP32 [rows][D], the residual stream
    DeviceBuffer xn;                  // FP16 [rows][D], normalized (GEMM input)
    DeviceBuffer qkv;                 // FP16 [rows][3A]
    DeviceBuffer att;                 // FP16 [rows][A]
    DeviceBuffer proj;                // FP16 [rows][D], attn_out / mlp_down output, added to x by the next norm
    DeviceBuffer gu;                  // FP16 [rows][2F] (fused) or gate [rows][F] + up at up_offset
    DeviceBuffer hidden;              // FP16 [rows][F], SwiGLU output
    DeviceBuffer logits;              // FP16 [chunk][head rows]
    DeviceBuffer meta;                // INT32: the pass's tokens, targets, positions [rows] each, then segment offsets
    DeviceBuffer nll;                 // FP32 [rows]
    DeviceBuffer greedy;              // UINT8 [rows]; a comparison's top-1 agreement
    DeviceBuffer top_ids;             // INT32 [rows][top_k], top_k <= kMaxTopK: a pass's top-k tokens
    DeviceBuffer top_logprobs;        // FP32 [rows][top_k]
    DeviceBuffer compare;             // FP32 [2][rows]: a comparison's KL, then the test model's NLL
    DeviceBuffer rope_cos, rope_sin;  // FP32 [rows][head_dim/2]
    uint64_t bytes = 0;

    int32_t *tokens() const { return meta.get<int32_t>(); }
    int32_t *targets() const { return tokens() + rows; }     // token r + 1 of r's sequence, -1 at a sequence's end
    int32_t *positions() const { return tokens() + 2 * rows; }  // r's position inside its sequence
    int32_t *offsets() const { return tokens() + 3 * rows; }    // [segments + 1]
};

// The shape of one pass: T rows holding `segments` sequences of at most max_len tokens, what its head computes
// (head: the NLLs, and top_k > 0 the top-k tokens too; no head: the pass stops at the head's input, act.xn, for a
// comparison to run both models' heads). A graph is captured per shape.
struct PassShape {
    int32_t rows = 0, segments = 0, max_len = 0;
    int32_t top_k = 0;
    bool head = true;
    bool operator<(const PassShape &o) const {
        return std::tie(rows, segments, max_len, top_k, head) < std::tie(o.rows, o.segments, o.max_len, o.top_k, o.head);
    }
};

// One pass shape's captured forward pass.
struct Graph {
    cudaGraphExec_t exec = nullptr;
    Tally per_replay;                                 // the GEMMs one replay runs
    DispatchSettings settings;  // the dispatcher settings at capture: the paths baked into it
    ActivationMode activations = ActivationMode::Fp16;  // and the call's activation precision
    ~Graph() {
        if (exec != nullptr) cudaGraphExecDestroy(exec);
    }
};

// Rows per W8A8 GEMM call: bounds its scratch (the INT32 sums of [rows][N]) whatever a pass's rows.
constexpr int32_t kW8a8ChunkRows = 2048;

// The head of the model's workspace that the Marlin-class and INT8 kernels keep zeroed between calls; other scratch
// (the INT8 activations' codes) lies past it.
inline size_t zeroed_workspace_bytes(int32_t sm_count) {
    return (gpu::marlin_workspace_bytes(sm_count) + 255) / 256 * 256;
}

// INT8 activations for gpu::int8_gemm, past that head: m rows of k codes, then m row scales, then m code sums, then
// (for a weight with groups of `group`) the group sums [k / group][int8_group_sums_ld(m)] FP32, each part 256-byte
// aligned. The offsets of the scales, sums and group sums (which do not depend on the group), and the bytes.
struct Int8InputLayout {
    size_t scales, sums, group_sums, bytes;
};
inline Int8InputLayout int8_input_layout(size_t m, size_t k, int32_t group = 0) {
    auto up = [](size_t b) { return (b + 255) / 256 * 256; };
    const size_t scales = up(m * k), sums = scales + up(m * sizeof(float));
    const size_t group_sums = sums + up(m * sizeof(int32_t));
    const size_t ld = static_cast<size_t>(gpu::int8_group_sums_ld(static_cast<int>(m)));
    return {scales, sums, group_sums, group_sums + (group > 0 ? up(k / group * ld * sizeof(float)) : 0)};
}

using BlockLinears = std::array<const DeviceLinear *, 5>;
inline BlockLinears block_linears(const DeviceBlock &b) { return {&b.qkv, &b.out, &b.gate_up, &b.up, &b.down}; }

}  // namespace detail

struct GpuModel::State {
    int32_t device = 0;
    ModelConfig config;
    GpuModelOptions options;
    const Model *host = nullptr;  // the model built from (gpu_model.hpp: it outlives the GpuModel)
    std::mutex mutex;  // one call at a time
    // The dispatcher settings of the call holding `mutex` (a call sets them again after releasing it around its
    // progress callback, since another call may have run with other settings meanwhile).
    DispatchSettings dispatch = default_dispatch_settings();
    ActivationMode activations = ActivationMode::Fp16;  // likewise the call's activation precision
    cudaStream_t own_stream = nullptr;
    cublasHandle_t cublas = nullptr;
    int32_t sm_count = 0;
    bool int8_tensor_cores = false;  // gpu::int8_gemm runs on the device

    DeviceBuffer embed;  // [vocab][d_model] in the file's dtype
    gpu::TableType embed_type = gpu::TableType::F32;
    std::vector<detail::DeviceBlock> pre;
    detail::DeviceBlock loop;
    DeviceBuffer final_norm;
    detail::DeviceLinear head;
    uint64_t weight_bytes = 0;  // every form built so far, the INT8-activation ones included once built
    bool int8_weights = false;  // ensure_int8_weights has built the block linears' a8_ forms

    detail::Activations act;
    DeviceBuffer workspace;  // the dispatcher's, zero-filled once
    DeviceBuffer loop_fp16;  // the looped block's INT4 weights as FP16, dequantized once per pass (dequantized_once)
    std::vector<int32_t> host_meta;  // the layout of act.meta
    std::vector<float> host_nll;
    std::vector<uint8_t> host_greedy;
    std::vector<int32_t> host_top_ids;      // [rows][kMaxTopK] at most
    std::vector<float> host_top_logprobs;
    std::vector<float> host_compare;        // [2][rows], as act.compare
    std::map<detail::PassShape, std::unique_ptr<detail::Graph>> graphs;
    std::set<detail::PassShape> uncapturable;  // pass shapes whose capture failed: they run eagerly

    uint64_t dense_calls = 0;  // cuBLAS GEMMs enqueued (captured ones included)
    uint64_t int8_calls = 0;   // gpu::int8_gemm calls enqueued (likewise)
    detail::Tally ran;                 // GEMMs executed
    uint64_t windows = 0, captures = 0, replays = 0;
    double capture_seconds = 0.0;
    double setup_seconds = 0.0;  // building the INT8-activation forms (ensure_int8_weights)

    ~State() {
        graphs.clear();
        if (cublas != nullptr) gpu::cublas_api()->destroy(cublas);  // created through it, so it is loaded
        if (own_stream != nullptr) cudaStreamDestroy(own_stream);
    }

    std::vector<const detail::DeviceLinear *> linears() const {
        std::vector<const detail::DeviceLinear *> all;
        auto add_block = [&](const detail::DeviceBlock &b) {
            for (const detail::DeviceLinear *l : {&b.qkv, &b.out, &b.gate_up, &b.up, &b.down}) {
                if (l->n > 0) all.push_back(l);
            }
        };
        for (const detail::DeviceBlock &b : pre) add_block(b);
        add_block(loop);
        all.push_back(&head);
        return all;
    }

    detail::Tally counted() const {
        detail::Tally t;
        for (const detail::DeviceLinear *l : linears()) {
            if (!l->quant) continue;
            const DispatchCounts c = dispatch_counts(*l->quant);
            const uint64_t v[6] = {c.fp16_body, c.marlin_fused, c.marlin_correction, c.dequant_cublas, c.native,
                                   c.fallbacks};
            for (int i = 0; i < 6; ++i) t.v[i] += v[i];
        }
        t.v[6] = dense_calls;
        t.v[7] = int8_calls;
        return t;
    }
};

namespace detail {

// ---- Defined in gpu_model.cpp ----

// Whether a looped linear is dequantized once per pass: where the dispatcher would dequantize it to FP16 for cuBLAS
// at each of the block's applications (passes of many rows), doing it once saves loops - 1 passes over its weights
// (15% of the GPU time of 16-token windows on the 2B model was dequantization).
bool dequantized_once(const GpuModel::State &s, const DeviceLinear &l, int32_t rows);
// Whether a looped linear is dequantized at each iteration instead, with that iteration's codes: cross-iteration
// rounding is on and it carries rounding channels. It then runs on cuBLAS at every row count.
bool dequantized_per_iteration(const GpuModel::State &s, const DeviceLinear &l);

// The rows a call's passes hold: pass_tokens (0: 8192 tokens), or the longest sequence when that is longer, but never
// more than the call's sequences need in all; and within the budget when one is set (down to the longest sequence,
// which must fit).
int32_t pass_rows(const GpuModel::State &s, int32_t pass_tokens, int32_t longest, size_t total_tokens,
                  uint64_t budget);

// Builds the a8_ forms of every block linear that takes INT8 activations (DeviceLinear::a8) from the host model, once:
// a call that asks for INT8 activations runs it after its checks, holding s.mutex, before sizing its buffers. All or
// nothing: a failure (out of device memory, a CUDA error) frees what it built and is rethrown with its status and a
// message naming these forms; the model scores FP16 activations as before, and a later INT8 call tries again.
// Returns the seconds it spent: 0 when they were built already.
double ensure_int8_weights(GpuModel::State &s);

// Whether the call's INT8 activations reach w through gpu::int8_gemm, whose input (int8_input_layout) lies in the
// workspace past the region the kernels keep zeroed; the other INT8-activation linears take gpu::w8a8_gemm.
inline bool int8_tensor_core_linear(const GpuModel::State &s, const DeviceLinear &w) {
    return s.activations == ActivationMode::Int8 && w.a8 && s.int8_tensor_cores && w.k % 16 == 0;
}

// Activations for passes of `rows` tokens and a workspace for every weight at that many rows; both only grow.
// Any change drops the captured graphs (they hold the old addresses). The working set a call of `rows` tokens
// uses is checked against the budget before anything is allocated.
void ensure_buffers(GpuModel::State &s, int32_t rows, uint64_t budget, cudaStream_t stream);

// Without graphs: enqueue the pass. With graphs: replay the pass shape's graph when it is still valid; else run the
// pass eagerly (which also performs the dispatcher's lazy set-up: cuBLAS handles, occupancy queries, neither of which
// may happen inside a capture) and then capture it for the next passes of this shape. Returns the GEMMs run.
Tally run_pass(GpuModel::State &s, const PassShape &shape, cudaStream_t stream, bool use_graphs);

// ---- Defined in gpu_forward.cpp ----

// The forward pass of one pass (its tokens, targets, positions and segment offsets already in act.meta) up to
// act.nll and act.greedy for every row. Enqueues only.
void enqueue_pass(GpuModel::State &s, const PassShape &shape, cudaStream_t stream);

}  // namespace detail
}  // namespace tl
