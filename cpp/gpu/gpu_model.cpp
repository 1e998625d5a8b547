#include "gpu/gpu_model.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "gpu/device.hpp"
#include "gpu/gemm_dispatch.hpp"
#include "gpu/gpu_forward.hpp"
#include "quant/cross_iter.hpp"
#include "quant/quant.hpp"
#include "score/rope.hpp"
#include "util/error.hpp"
#include "util/half.hpp"
#include "util/log.hpp"
#include "util/thread_pool.hpp"

#if defined(TL_WITH_CUDA)
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "cublas_loader.hpp"
#include "gpu/cuda_host.hpp"
#include "gpu/device_memory.hpp"
#include "gpu/device_weight_layout.hpp"
#include "gpu/gpu_model_state.hpp"
#include "gpu/w4a8_pack.hpp"
#endif

namespace tl {

#if !defined(TL_WITH_CUDA)

// ---- A build without CUDA -------------------------------------------------------------------------------------

struct GpuModel::State {
    ModelConfig config;
};

GpuModel::GpuModel(const Model &, int32_t, const GpuModelOptions &) {
    fail_without_cuda();
}
GpuModel::~GpuModel() = default;
int32_t GpuModel::device() const { return 0; }
const ModelConfig &GpuModel::config() const { return state_->config; }
GpuScoreStats GpuModel::stats() const { return {}; }
uint64_t GpuModel::weight_bytes() const { return 0; }
uint64_t GpuModel::device_bytes() const { return 0; }

#else

// ---- CUDA -------------------------------------------------------------------------------------------------------

using namespace detail;

namespace {

constexpr size_t kLogitBudgetBytes = size_t(64) << 20;  // default logits chunk
constexpr size_t kMaxGraphs = 8;                          // cached pass shapes per GpuModel
// Tokens per forward pass when sequences are packed together (pass_rows): enough rows that the GEMMs run at full
// speed, few enough that the activations stay near 1 GB on the 2B shape. A longer sequence gets a pass of its own
// length.
constexpr int32_t kPassTokens = 8192;
// The vocabulary (head rows) is padded to this multiple: cuBLAS's fast FP16 kernels need leading dimensions that are
// multiples of 8, the Marlin-class kernels N % 64 == 0. The padding rows are zero; head_nll never reads their logits.
constexpr int32_t kHeadRowMultiple = 64;

int32_t round_up(int64_t v, int64_t multiple) { return static_cast<int32_t>((v + multiple - 1) / multiple * multiple); }

// ---- Building the device model ----

// What the GPU backend needs of a linear's storage: a complete INT4 or INT8 weight, or dense values.
void check_gpu_storage(const Linear &w, const std::string &name) {
    if (w.quantized) {
        require_complete_quantized(w, ("model: " + name).c_str());
    } else if (w.dense == nullptr) {
        fail(TL_ERR_INVALID_ARGUMENT, "model: " + name + " has no values");
    }
}

// The checks both backends make, then the GPU attention's head_dim limit.
void check_gpu_model(const Model &model) {
    check_model(model, check_gpu_storage);
    const int32_t head_dim = model.config.head_dim;
    if (head_dim > gpu::kAttentionMaxHeadDim) {
        fail(TL_ERR_UNSUPPORTED, "model: head_dim = " + std::to_string(head_dim) + " exceeds the GPU attention's " +
                                     std::to_string(gpu::kAttentionMaxHeadDim));
    }
}

gpu::TableType table_type(DType dtype) {
    switch (dtype) {
        case DType::F16: return gpu::TableType::F16;
        case DType::BF16: return gpu::TableType::BF16;
        case DType::F32: return gpu::TableType::F32;
        default: fail(TL_ERR_INVALID_ARGUMENT, std::string("model: embedding dtype ") + dtype_name(dtype));
    }
}

// w's values as FP16 [n][k] (rounded to nearest; a dense weight beyond FP16's range becomes infinite).
std::vector<uint16_t> dense_fp16(const Linear &w) {
    std::vector<uint16_t> out(static_cast<size_t>(w.n) * w.k);
    for (size_t i = 0; i < out.size(); ++i) out[i] = float_to_half(load_float(w.dense_dtype, w.dense, i));
    return out;
}

DeviceBuffer upload_floats(int device, const std::vector<float> &v) {
    return DeviceBuffer::upload_sync(device, v.data(), v.size() * sizeof(float));
}

void ensure_cublas(GpuModel::State &s) {
    if (s.cublas != nullptr) return;
    std::string why;
    const gpu::CublasApi *cublas = gpu::cublas_api(&why);
    // UNSUPPORTED, not a CUDA error: a machine with a driver but without cuBLAS cannot run this model on the GPU, and
    // the AUTO backend then scores on the CPU.
    if (cublas == nullptr) fail(TL_ERR_UNSUPPORTED, "cuBLAS is not available: " + why);
    const cublasStatus_t st = cublas->create(&s.cublas);
    if (st != CUBLAS_STATUS_SUCCESS) fail(TL_ERR_CUDA, "cublasCreate failed with status " + std::to_string(st));
}

// `bias` as an FP32 device array of n values, the ones past its end zero (padding rows); empty when there is none.
DeviceBuffer upload_bias(int device, const std::vector<float> *bias, int32_t n) {
    if (bias == nullptr) return DeviceBuffer{};
    std::vector<float> padded(static_cast<size_t>(n), 0.0f);
    std::copy(bias->begin(), bias->end(), padded.begin());
    return upload_floats(device, padded);
}

// A linear on the device, its rows (N) padded with zero rows to a multiple of `n_multiple`. Runs on any thread (with
// the model's device current): ensure_cublas has run before.
DeviceLinear make_linear(const GpuModel::State &s, const Linear &w, int32_t n_multiple = 1) {
    DeviceLinear d;
    d.name = w.name;
    d.k = w.k;
    d.n = round_up(w.n, n_multiple);
    d.bias = upload_bias(s.device, w.bias.get(), d.n);
    if (w.quantized && w.bits == 8) {
        d.dense = dequantize_int8_weight(w, d.n, s.device, s.own_stream);
        d.dense_values = d.dense.get<uint16_t>();
        d.bytes = d.dense.bytes();
    } else if (w.quantized) {
        PackOutcome outcome;
        d.quant = pack_weight(d.n == w.n ? w : pad_linear_rows(w, n_multiple), s.device, s.own_stream,
                              s.options.forms, &outcome);
        d.groups = w.n_groups();
        d.bytes = outcome.device_bytes;
    } else {
        std::vector<uint16_t> values = dense_fp16(w);
        values.resize(static_cast<size_t>(d.n) * w.k, 0);
        d.dense = DeviceBuffer::upload_sync(s.device, values.data(), values.size() * sizeof(uint16_t));
        d.dense_values = d.dense.get<uint16_t>();
        d.bytes = d.dense.bytes();
    }
    d.bytes += d.bias.bytes();
    return d;
}

// Building a model's linear layers: each job converts or packs one on the host and uploads it, independently of the
// others, so that they run on a thread pool (packing is most of a model's first-call time).
using LinearJobs = std::vector<std::function<void()>>;

// job(i) for every i < count, on a pool of up to 64 threads (one per core), each with `device` current.
void run_on_device_pool(int32_t device, size_t count, const std::function<void(size_t)> &job) {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    ThreadPool pool(static_cast<int32_t>(std::min<size_t>(std::max<size_t>(count, 1), std::min(cores, 64u))));
    pool.parallel_for(count, [&](size_t i, int32_t) {
        DeviceScope job_scope(device);
        job(i);
    });
}

void add_linear(LinearJobs &jobs, const GpuModel::State &s, DeviceLinear &slot, const Linear &w,
                int32_t n_multiple = 1) {
    jobs.push_back([&s, &slot, &w, n_multiple] { slot = make_linear(s, w, n_multiple); });
}

// Whether a block linear takes INT8 activations and in which form (DeviceLinear::a8): an INT8 weight with one scale
// per row (W8A8), or where gpu::int8_gemm runs an INT4 weight it takes (W4A8, per row or grouped). Only the
// description: the forms are built by ensure_int8_weights when a call first asks for INT8 activations.
void describe_act8(const GpuModel::State &s, DeviceLinear &d, const Linear &w) {
    d.a8_int4 = s.int8_tensor_cores && w4a8_linear(w);
    d.a8 = d.a8_int4 || w8a8_linear(w);
    d.a8_group = d.a8_int4 && w.group_size != w.k ? w.group_size : 0;
}

struct Act8Forms {
    DeviceBuffer codes, scales, zeros;
    uint64_t bytes() const { return codes.bytes() + scales.bytes() + zeros.bytes(); }
};

// The forms d (described by describe_act8) takes INT8 activations with, from its host weight w: an INT8 weight's codes
// in input order (W8A8), an INT4 weight's packed by w4a8_pack (W4A8), FP32 scales (and an INT4 weight's zeros) per
// row, or a grouped INT4 weight's scales and zeros packed by w4a8_pack_groups.
Act8Forms make_act8(const GpuModel::State &s, const DeviceLinear &d, const Linear &w) {
    const bool int4 = d.a8_int4;
    const int32_t group = d.a8_group;
    const size_t K = static_cast<size_t>(w.k), N = static_cast<size_t>(w.n);
    auto input = [&](size_t kk) { return w.k_perm != nullptr ? static_cast<size_t>(w.k_perm[kk]) : kk; };
    std::vector<float> scales(group > 0 ? 0 : N), zeros(int4 && group == 0 ? N : 0);
    if (group > 0) {
        scales = w4a8_pack_groups(w.scales, w.zeros, w.n, w.k, group);
    } else {
        for (size_t n = 0; n < N; ++n) {
            scales[n] = half_to_float(w.scales[n]);
            if (int4) zeros[n] = half_to_float(w.zeros[n]);
        }
    }
    Act8Forms f;
    if (int4) {
        std::vector<uint8_t> codes(N * K / 2, 0);  // the file's layout, in input order
        for (size_t n = 0; n < N; ++n) {
            for (size_t kk = 0; kk < K; ++kk) {
                const uint8_t q = (w.codes[n * K / 2 + kk / 2] >> (4 * (kk % 2))) & 0xF;
                const size_t c = input(kk);
                codes[n * K / 2 + c / 2] |= static_cast<uint8_t>(q << (4 * (c % 2)));
            }
        }
        const std::vector<uint32_t> packed = w4a8_pack(codes.data(), w.n, w.k);
        f.codes = DeviceBuffer::upload_sync(s.device, packed.data(), packed.size() * sizeof(uint32_t));
        if (group == 0) f.zeros = DeviceBuffer::upload_sync(s.device, zeros.data(), zeros.size() * sizeof(float));
    } else {
        std::vector<int8_t> codes(N * K);
        for (size_t n = 0; n < N; ++n) {
            for (size_t kk = 0; kk < K; ++kk) codes[n * K + input(kk)] = static_cast<int8_t>(w.codes[n * K + kk]);
        }
        f.codes = DeviceBuffer::upload_sync(s.device, codes.data(), codes.size());
    }
    f.scales = DeviceBuffer::upload_sync(s.device, scales.data(), scales.size() * sizeof(float));
    return f;
}

// A looped linear keeps its rounding channels on the device, for cross-iteration rounding (`second`: the weight whose
// rows follow first's in d, as up's follow gate's).
void attach_rounding(const GpuModel::State &s, DeviceLinear &d, const Linear &first, const Linear *second = nullptr) {
    if (d.quant && has_rounding_channels(first)) {
        d.bytes += attach_rounding_channels(*d.quant, first, second, s.own_stream);
    }
}

bool same_rounding_channels(const Linear &a, const Linear &b) {
    return (a.frac4 != nullptr) == (b.frac4 != nullptr) && (a.sign_bit != nullptr) == (b.sign_bit != nullptr);
}

// f(slot, weight, up) for each of a block's linears, in pass order. `fused`: gate and up are one weight in d.gate_up,
// and `up` names the up projection whose rows follow the gate's; null otherwise.
template <class F>
void for_each_block_linear(DeviceBlock &d, const Block &b, bool fused, F &&f) {
    f(d.qkv, b.attn_qkv, nullptr);
    f(d.out, b.attn_out, nullptr);
    if (fused) {
        f(d.gate_up, b.mlp_gate, &b.mlp_up);
    } else {
        f(d.gate_up, b.mlp_gate, nullptr);
        f(d.up, b.mlp_up, nullptr);
    }
    f(d.down, b.mlp_down, nullptr);
}

// The block's norms now, its linears as jobs writing into `d` (which must stay where it is until they have run).
void make_block(GpuModel::State &s, const Block &b, DeviceBlock &d, LinearJobs &jobs, bool looped) {
    d.attn_norm = upload_floats(s.device, b.attn_norm);
    d.mlp_norm = upload_floats(s.device, b.mlp_norm);
    s.weight_bytes += d.attn_norm.bytes() + d.mlp_norm.bytes();
    const Linear &gate = b.mlp_gate, &up = b.mlp_up;
    // INT8 linears run dense (make_linear), so only two INT4 ones become one quantized weight.
    const bool fused = gate.quantized && up.quantized && gate.bits == 4 && up.bits == 4 &&
                       gate.group_size == up.group_size && same_k_perm(gate, up) &&
                       (!looped || same_rounding_channels(gate, up));
    for_each_block_linear(d, b, fused, [&](DeviceLinear &slot, const Linear &w, const Linear *second) {
        if (second == nullptr) {
            jobs.push_back([&s, &slot, &w, looped] {
                slot = make_linear(s, w);
                describe_act8(s, slot, w);
                if (looped) attach_rounding(s, slot, w);
            });
            return;
        }
        const std::string name = w.name.substr(0, w.name.rfind('.') + 1) + "mlp_gate_up";
        jobs.push_back([&s, &slot, &w, second, name, looped] {
            Linear gate_up = concat_linear_rows(w, *second, name);
            if (w.bias || second->bias) {  // [gate's | up's], zero for the one without
                auto bias = std::make_shared<std::vector<float>>(static_cast<size_t>(w.n + second->n), 0.0f);
                if (w.bias) std::copy(w.bias->begin(), w.bias->end(), bias->begin());
                if (second->bias) std::copy(second->bias->begin(), second->bias->end(), bias->begin() + w.n);
                gate_up.bias = std::move(bias);
            }
            slot = make_linear(s, gate_up);
            describe_act8(s, slot, gate_up);
            if (looped) attach_rounding(s, slot, w, second);
        });
    });
}

// Whether the head is the FP16 embedding table itself, which then serves as the head's weight on the device.
bool head_is_f16_table(const Model &model) {
    return model.head_kind == HeadKind::Tied && !model.head.quantized && model.head.dense == model.embed &&
           model.embed_dtype == DType::F16;
}

// The head: a job for a linear of its own, or the uploaded FP16 embedding table.
void make_head(GpuModel::State &s, const Model &model, LinearJobs &jobs) {
    const Linear &w = model.head;
    if (!head_is_f16_table(model)) {
        add_linear(jobs, s, s.head, w, kHeadRowMultiple);
        return;
    }
    DeviceLinear &d = s.head;
    d.name = w.name;
    d.k = w.k;
    d.n = round_up(w.n, kHeadRowMultiple);    // the table was uploaded with that many rows, the extra ones zero
    d.dense_values = s.embed.get<uint16_t>();  // the table is the FP16 weight already
}

// ---- Buffers ----

size_t loop_fp16_bytes(const GpuModel::State &s, int32_t rows) {
    size_t bytes = 0;
    for (const DeviceLinear *l : block_linears(s.loop)) {
        if (dequantized_once(s, *l, rows) || dequantized_per_iteration(s, *l)) bytes += dequantized_bytes(*l->quant);
    }
    return bytes;
}

// The buffer sizes of Activations for passes of `rows` tokens, in bytes.
struct ActivationSizes {
    int32_t chunk = 0;
    size_t up_offset = 0;  // halves
    size_t x = 0, xn = 0, qkv = 0, att = 0, proj = 0, gu = 0, hidden = 0, logits = 0, meta = 0, nll = 0, greedy = 0,
           rope = 0, top_ids = 0, top_logprobs = 0, compare = 0;
    size_t total() const {
        return x + xn + qkv + att + proj + gu + hidden + logits + meta + nll + greedy + 2 * rope + top_ids +
               top_logprobs + compare;
    }
};

ActivationSizes activation_sizes(const GpuModel::State &s, int32_t rows) {
    const ModelConfig &c = s.config;
    ActivationSizes z;
    const int32_t auto_chunk = static_cast<int32_t>(
        std::max<size_t>(8, kLogitBudgetBytes / (static_cast<size_t>(s.head.n) * sizeof(uint16_t)) / 8 * 8));
    z.chunk = std::min(s.options.head_chunk_rows > 0 ? round_up(s.options.head_chunk_rows, 8) : auto_chunk,
                       round_up(rows, 8));
    const size_t R = static_cast<size_t>(rows), D = c.d_model, A = c.attn_dim(), F = c.ffn;
    const size_t half = sizeof(uint16_t);
    z.up_offset = (R * F + 7) / 8 * 8;
    z.x = R * D * sizeof(float);
    z.xn = R * D * half;
    z.qkv = R * static_cast<size_t>(c.qkv_dim()) * half;
    z.att = R * A * half;
    z.proj = R * D * half;
    z.gu = (z.up_offset + R * F) * half;  // >= R * 2F: holds the fused layout too
    z.hidden = R * F * half;
    z.logits = static_cast<size_t>(z.chunk) * s.head.n * half;
    z.meta = (4 * R + 1) * sizeof(int32_t);  // tokens, targets, positions, and up to R + 1 segment offsets
    z.nll = R * sizeof(float);
    z.greedy = R;
    // Always allocated (8 · 20 + 8 bytes a row, ~1 MiB at 8192 rows): passes with and without top-k or a comparison
    // then share one set of buffers and their graphs stay valid.
    z.top_ids = R * gpu::kMaxTopK * sizeof(int32_t);
    z.top_logprobs = R * gpu::kMaxTopK * sizeof(float);
    z.compare = 2 * R * sizeof(float);
    z.rope = R * (c.head_dim / 2) * sizeof(float);
    return z;
}

// The dispatcher's workspace for every weight at up to `rows` rows (and the head's chunk) under the call's settings.
size_t workspace_bytes(const GpuModel::State &s, int32_t rows, int32_t chunk) {
    size_t needed = 0;
    const int64_t max_m = std::max(rows, chunk);
    for (const DeviceLinear *l : s.linears()) {
        if (l->quant) needed = std::max(needed, quant_gemm_workspace_size(*l->quant, max_m, s.dispatch));
        if (dequantized_per_iteration(s, *l)) {
            needed = std::max(needed, dequantized_gemm_workspace_size(*l->quant, max_m));
        }
        if (s.activations == ActivationMode::Int8 && l->a8) {
            // Past the region the kernels keep zeroed: X's codes, scales and code sums, or the cuBLAS path's scratch.
            const size_t rows = static_cast<size_t>(max_m);
            const size_t own = int8_tensor_core_linear(s, *l)
                                   ? int8_input_layout(rows, static_cast<size_t>(l->k), l->a8_group).bytes
                                   : gpu::w8a8_scratch_bytes(std::min<int32_t>(static_cast<int32_t>(max_m),
                                                                              kW8a8ChunkRows), l->n, l->k);
            needed = std::max(needed, zeroed_workspace_bytes(s.sm_count) + own);
        }
    }
    return needed;
}

// Device memory of passes of `rows` rows beyond the weights: activations, workspace and the looped block's FP16 forms.
size_t working_set_bytes(const GpuModel::State &s, int32_t rows) {
    const ActivationSizes z = activation_sizes(s, rows);
    return z.total() + workspace_bytes(s, rows, z.chunk) + loop_fp16_bytes(s, rows);
}

// ---- The graph cache ----

std::unique_ptr<Graph> capture_pass(GpuModel::State &s, const PassShape &shape, cudaStream_t stream) {
    const auto start = std::chrono::steady_clock::now();
    auto g = std::make_unique<Graph>();
    g->settings = s.dispatch;
    g->activations = s.activations;
    const Tally before = s.counted();
    // Relaxed: the dispatcher makes host-side CUDA calls (pointer attributes, cuBLAS stream binding) while
    // enqueueing; they are not stream work and must not invalidate the capture.
    check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture");
    cudaGraph_t graph = nullptr;
    try {
        enqueue_pass(s, shape, stream);
    } catch (...) {
        cudaStreamEndCapture(stream, &graph);  // leave the stream out of capture mode whatever failed
        if (graph != nullptr) cudaGraphDestroy(graph);
        cudaGetLastError();
        throw;
    }
    check_cuda(cudaStreamEndCapture(stream, &graph),
               "capturing the forward pass of " + std::to_string(shape.rows) + " tokens");
    const cudaError_t err = cudaGraphInstantiate(&g->exec, graph, 0);
    cudaGraphDestroy(graph);
    check_cuda(err, "cudaGraphInstantiate");
    g->per_replay = s.counted() - before;
    ++s.captures;
    s.capture_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return g;
}

}  // namespace

namespace detail {

bool dequantized_once(const GpuModel::State &s, const DeviceLinear &l, int32_t rows) {
    return s.config.loops > 1 && l.n > 0 && l.quant && !dequantized_per_iteration(s, l) &&
           dequant_cublas_wanted(*l.quant, rows, s.dispatch);
}

bool dequantized_per_iteration(const GpuModel::State &s, const DeviceLinear &l) {
    return s.dispatch[DispatchSetting::CrossIterRound] != 0 && l.n > 0 && l.quant && has_rounding_channels(*l.quant);
}

int32_t pass_rows(const GpuModel::State &s, int32_t pass_tokens, int32_t longest, size_t total_tokens,
                  uint64_t budget) {
    const int32_t wanted = pass_tokens > 0 ? pass_tokens : kPassTokens;
    int32_t rows = static_cast<int32_t>(std::min<size_t>(std::max(wanted, longest), total_tokens));
    while (budget != 0 && rows > longest) {
        if (working_set_bytes(s, rows) <= budget) break;
        rows = std::max(longest, rows / 2);
    }
    return rows;
}


void ensure_buffers(GpuModel::State &s, int32_t rows, uint64_t budget, cudaStream_t stream) {
    const ModelConfig &c = s.config;
    const ActivationSizes z = activation_sizes(s, rows);
    const size_t needed = workspace_bytes(s, std::max(rows, s.act.rows), std::max(z.chunk, s.act.chunk));
    const size_t loop_needed = loop_fp16_bytes(s, std::max(rows, s.act.rows));
    size_t free_bytes = 0, total_bytes = 0;
    check_cuda(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    // The machine's limit: what is free now plus what this model already holds and would give back first.
    check_memory_budget(working_set_bytes(s, rows), budget,
                        free_bytes + s.act.bytes + s.workspace.bytes() + s.loop_fp16.bytes(), "device memory");
    if (rows > s.act.rows) {
        s.graphs.clear();
        s.act = Activations{};  // free before allocating the larger set
        Activations a;
        a.rows = rows;
        a.chunk = z.chunk;
        a.up_offset = z.up_offset;
        a.x = DeviceBuffer(s.device, z.x);
        a.xn = DeviceBuffer(s.device, z.xn);
        a.qkv = DeviceBuffer(s.device, z.qkv);
        a.att = DeviceBuffer(s.device, z.att);
        a.proj = DeviceBuffer(s.device, z.proj);
        a.gu = DeviceBuffer(s.device, z.gu);
        a.hidden = DeviceBuffer(s.device, z.hidden);
        a.logits = DeviceBuffer(s.device, z.logits);
        a.meta = DeviceBuffer(s.device, z.meta);
        a.nll = DeviceBuffer(s.device, z.nll);
        a.greedy = DeviceBuffer(s.device, z.greedy);
        a.top_ids = DeviceBuffer(s.device, z.top_ids);
        a.top_logprobs = DeviceBuffer(s.device, z.top_logprobs);
        a.compare = DeviceBuffer(s.device, z.compare);
        std::vector<float> cos_table, sin_table;
        rope_tables(c, rows, 0, cos_table, sin_table);  // the config's frequencies and scale, as the CPU's
        a.rope_cos = upload_floats(s.device, cos_table);
        a.rope_sin = upload_floats(s.device, sin_table);
        a.bytes = z.total();
        s.act = std::move(a);
        s.host_meta.assign(z.meta / sizeof(int32_t), 0);
        s.host_nll.resize(static_cast<size_t>(rows));
        s.host_greedy.resize(static_cast<size_t>(rows));
        s.host_top_ids.resize(static_cast<size_t>(rows) * gpu::kMaxTopK);
        s.host_top_logprobs.resize(s.host_top_ids.size());
        s.host_compare.resize(2 * static_cast<size_t>(rows));
    }
    // Sized at every call: the dequantize + cuBLAS path's share depends on the call's dispatcher settings.
    if (needed > s.workspace.bytes()) {
        s.graphs.clear();
        s.workspace = DeviceBuffer{};
        s.workspace = DeviceBuffer(s.device, needed);
        check_cuda(cudaMemsetAsync(s.workspace.get(), 0, needed, stream), "cudaMemsetAsync (GEMM workspace)");
    }
    // Sized at every call too: which weights it holds depends on the dispatcher settings.
    if (loop_needed > s.loop_fp16.bytes()) {
        s.graphs.clear();
        s.loop_fp16 = DeviceBuffer{};
        s.loop_fp16 = DeviceBuffer(s.device, loop_needed);
    }
}

Tally run_pass(GpuModel::State &s, const PassShape &shape, cudaStream_t stream, bool use_graphs) {
    if (use_graphs) {
        const auto it = s.graphs.find(shape);
        if (it != s.graphs.end()) {
            const Graph &g = *it->second;
            if (g.settings == s.dispatch && g.activations == s.activations) {
                check_cuda(cudaGraphLaunch(g.exec, stream), "cudaGraphLaunch");
                ++s.replays;
                return g.per_replay;
            }
            s.graphs.erase(it);
        }
    }
    const Tally before = s.counted();
    enqueue_pass(s, shape, stream);
    const Tally ran = s.counted() - before;
    if (use_graphs && s.uncapturable.count(shape) == 0) {
        if (s.graphs.size() >= kMaxGraphs) s.graphs.clear();
        // The pass has already run eagerly, so a failed capture costs speed, never the result: this shape then stays
        // eager on this model. (The per-weight dispatch counters keep the GEMMs the failed capture enqueued.)
        try {
            s.graphs.emplace(shape, capture_pass(s, shape, stream));
        } catch (const std::exception &e) {
            cudaGetLastError();  // a failed capture's error is not sticky: clear it for the next launch checks
            s.uncapturable.insert(shape);
            log(TL_LOG_WARN, "CUDA graph capture of a " + std::to_string(shape.rows) + "-token pass failed (" +
                                 e.what() + "); passes of this shape run without graphs on this model");
        }
    }
    return ran;
}

double ensure_int8_weights(GpuModel::State &s) {
    if (s.int8_weights) return 0.0;
    const auto start = std::chrono::steady_clock::now();
    // A block linear, its host weight, and for a fused gate|up the up projection that follows the gate's rows.
    struct Job {
        DeviceLinear *d;
        const Linear *w, *up;
    };
    std::vector<Job> jobs;
    auto add_block = [&](DeviceBlock &d, const Block &b) {
        for_each_block_linear(d, b, d.up.n == 0, [&](DeviceLinear &l, const Linear &w, const Linear *up) {
            if (l.a8) jobs.push_back({&l, &w, up});
        });
    };
    const Model &model = *s.host;
    for (size_t i = 0; i < s.pre.size(); ++i) add_block(s.pre[i], model.pre[i]);
    add_block(s.loop, model.loop);
    // Built aside and moved in only once all exist: a failure leaves no linear half-built, and frees the rest here.
    std::vector<Act8Forms> built(jobs.size());
    try {
        run_on_device_pool(s.device, jobs.size(), [&](size_t i) {
            const Job &j = jobs[i];
            // The fused weight is concatenated again (the one packed at load was not kept): host memory only here.
            built[i] = j.up != nullptr ? make_act8(s, *j.d, concat_linear_rows(*j.w, *j.up, j.d->name))
                                       : make_act8(s, *j.d, *j.w);
        });
        // upload_sync's copies from pageable memory may still be in flight on the legacy stream, which the passes'
        // non-blocking streams do not wait for.
        check_cuda(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize (upload)");
    } catch (const Error &e) {
        fail(e.code(), std::string("building the weights' forms for INT8 activations (on the first call that asks for "
                                   "them; nothing was kept, FP16 activations are unaffected): ") +
                           e.what());
    }
    for (size_t i = 0; i < jobs.size(); ++i) {
        DeviceLinear &d = *jobs[i].d;
        const uint64_t bytes = built[i].bytes();
        d.a8_codes = std::move(built[i].codes);
        d.a8_scales = std::move(built[i].scales);
        d.a8_zeros = std::move(built[i].zeros);
        d.bytes += bytes;
        s.weight_bytes += bytes;
    }
    s.int8_weights = true;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    s.setup_seconds += seconds;
    return seconds;
}

}  // namespace detail

GpuModel::GpuModel(const Model &model, int32_t device, const GpuModelOptions &options) {
    check_gpu_model(model);
    require_device(device);
    DeviceScope scope(device);
    auto s = std::make_unique<State>();  // destroyed inside `scope` if building fails
    s->device = device;
    s->config = model.config;
    s->host = &model;
    s->options = options;
    check_cuda(cudaStreamCreateWithFlags(&s->own_stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    s->sm_count = device_info(device).sm_count;
    s->int8_tensor_cores = int8_tensor_cores(device);

    const ModelConfig &c = model.config;
    s->embed_type = table_type(model.embed_dtype);
    const size_t table_bytes = static_cast<size_t>(c.vocab) * c.d_model * dtype_size(model.embed_dtype);
    if (head_is_f16_table(model)) {
        // The table doubles as the head's weight: its rows padded with zeros as make_linear pads a head's.
        const size_t padded_rows = static_cast<size_t>(round_up(c.vocab, kHeadRowMultiple));
        s->embed = DeviceBuffer(device, padded_rows * c.d_model * sizeof(uint16_t));
        check_cuda(cudaMemset(s->embed.get(), 0, s->embed.bytes()), "cudaMemset (embedding padding)");
        check_cuda(cudaMemcpy(s->embed.get(), model.embed, table_bytes, cudaMemcpyHostToDevice),
                   "cudaMemcpy (upload)");
    } else {
        s->embed = DeviceBuffer::upload_sync(device, model.embed, table_bytes);
    }
    s->weight_bytes += s->embed.bytes();
    ensure_cublas(*s);  // dense layers, and the dispatcher's cuBLAS paths, use the model's own handle (see gemm)
    LinearJobs jobs;
    s->pre.resize(model.pre.size());  // the jobs write into these blocks: they must not move
    for (size_t i = 0; i < model.pre.size(); ++i) make_block(*s, model.pre[i], s->pre[i], jobs, false);
    make_block(*s, model.loop, s->loop, jobs, true);
    s->final_norm = upload_floats(device, model.final_norm);
    s->weight_bytes += s->final_norm.bytes();
    make_head(*s, model, jobs);
    run_on_device_pool(device, jobs.size(), [&](size_t i) { jobs[i](); });
    for (const DeviceLinear *l : s->linears()) s->weight_bytes += l->bytes;
    check_cuda(cudaStreamSynchronize(s->own_stream), "cudaStreamSynchronize (upload)");
    state_ = std::move(s);
}

GpuModel::~GpuModel() {
    if (!state_) return;
    // Buffers are freed with their device current; errors here have nowhere to go.
    int previous = 0;
    cudaGetDevice(&previous);
    cudaSetDevice(state_->device);
    state_.reset();
    cudaSetDevice(previous);
}

int32_t GpuModel::device() const { return state_->device; }
const ModelConfig &GpuModel::config() const { return state_->config; }

GpuScoreStats GpuModel::stats() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    const State &s = *state_;
    GpuScoreStats out;
    add_tally(out, s.ran);
    out.windows = s.windows;
    out.graph_captures = s.captures;
    out.graph_replays = s.replays;
    out.graph_capture_failures = s.uncapturable.size();  // each pass shape fails at most once: it is not retried
    out.capture_seconds = s.capture_seconds;
    out.setup_seconds = s.setup_seconds;
    return out;
}

uint64_t GpuModel::weight_bytes() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->weight_bytes;
}

uint64_t GpuModel::device_bytes() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->weight_bytes + state_->act.bytes + state_->workspace.bytes() + state_->loop_fp16.bytes();
}

#endif  // TL_WITH_CUDA

}  // namespace tl
