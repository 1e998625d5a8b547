#include "gpu/gpu_score.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>

#include "util/error.hpp"
#include "util/log.hpp"
#include "util/thread_pool.hpp"
#include "gpu/device.hpp"
#include "gpu/gemm_dispatch.hpp"
#include "util/half.hpp"
#include "quant/quant.hpp"

#if defined(TL_WITH_CUDA)
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "cublas_loader.hpp"
#include "gpu/cuda_host.hpp"
#include "gpu/device_memory.hpp"
#include "forward/forward_kernels.hpp"
#include "gpu_kernels.hpp"
#endif

namespace tl {

// ---- Host-side pieces (every build) -------------------------------------------------------------------------

void rope_tables(int32_t T, int32_t head_dim, float theta, std::vector<float> &cos_table,
                 std::vector<float> &sin_table) {
    const int32_t half = head_dim / 2;
    cos_table.resize(static_cast<size_t>(T) * half);
    sin_table.resize(cos_table.size());
    for (int32_t i = 0; i < half; ++i) {
        const double inv_freq = std::pow(static_cast<double>(theta), -2.0 * i / head_dim);
        for (int32_t t = 0; t < T; ++t) {
            const double angle = static_cast<double>(t) * inv_freq;
            cos_table[static_cast<size_t>(t) * half + i] = static_cast<float>(std::cos(angle));
            sin_table[static_cast<size_t>(t) * half + i] = static_cast<float>(std::sin(angle));
        }
    }
}

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
uint64_t GpuModel::device_bytes() const { return 0; }

ScoreResult score_cuda(GpuModel &, const int32_t *, size_t, const ScoreOptions &, int32_t, void *, GpuScoreStats *) {
    fail_without_cuda();
}
ScoreResult score_batch_cuda(GpuModel &, const Sequence *, size_t, const ScoreOptions &, int32_t, void *,
                             SequenceScore *, GpuScoreStats *) {
    fail_without_cuda();
}

#else

// ---- CUDA -------------------------------------------------------------------------------------------------------

namespace {

// A launcher's rc (cuda/forward/forward_kernels.hpp): positive = a CUDA error, negative = refused arguments, which
// the checks made when the GpuModel was built should have ruled out.
void check_rc(int rc, const std::string &what) {
    if (rc == 0) return;
    if (rc > 0) check_cuda(static_cast<cudaError_t>(rc), what);
    fail(TL_ERR_INTERNAL, what + " refused its arguments (rc " + std::to_string(rc) + ")");
}

// GEMM calls by path: the dispatcher's per-weight counters summed, plus the dense (cuBLAS) calls.
struct Tally {
    std::array<uint64_t, 7> v{};  // fp16_body, marlin_fused, marlin_correction, dequant_cublas, native, fallbacks, dense
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

void add_tally(GpuScoreStats &out, const Tally &t) {
    out.dispatch.fp16_body += t.v[0];
    out.dispatch.marlin_fused += t.v[1];
    out.dispatch.marlin_correction += t.v[2];
    out.dispatch.dequant_cublas += t.v[3];
    out.dispatch.native += t.v[4];
    out.dispatch.fallbacks += t.v[5];
    out.cublas_dense += t.v[6];
}

// One linear layer on the device: INT4 through the dispatcher, or FP16 values through cuBLAS.
struct DeviceLinear {
    std::string name;
    int32_t k = 0, n = 0;  // n: the device weight's rows (the head's padded N)
    int32_t groups = 0;    // INT4 groups along K
    std::shared_ptr<DeviceWeight> quant;
    DeviceBuffer dense;                      // FP16 [n][k], unless the values are shared
    const uint16_t *dense_values = nullptr;  // dense, or the embedding table (tied F16 head)
    uint64_t bytes = 0;
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
    DeviceBuffer greedy;              // UINT8 [rows]
    DeviceBuffer rope_cos, rope_sin;  // FP32 [rows][head_dim/2]
    uint64_t bytes = 0;

    int32_t *tokens() const { return meta.get<int32_t>(); }
    int32_t *targets() const { return tokens() + rows; }     // token r + 1 of r's sequence, -1 at a sequence's end
    int32_t *positions() const { return tokens() + 2 * rows; }  // r's position inside its sequence
    int32_t *offsets() const { return tokens() + 3 * rows; }    // [segments + 1]
};

// The shape of one pass: T rows holding `segments` sequences of at most max_len tokens. A graph is captured per shape.
struct PassShape {
    int32_t rows = 0, segments = 0, max_len = 0;
    bool operator<(const PassShape &o) const {
        return std::tie(rows, segments, max_len) < std::tie(o.rows, o.segments, o.max_len);
    }
};

// One pass shape's captured forward pass.
struct Graph {
    cudaGraphExec_t exec = nullptr;
    Tally per_replay;                 // the GEMMs one replay runs
    std::array<int32_t, kDispatchSettings> settings;  // the dispatcher settings at capture: the paths baked into it
    ~Graph() {
        if (exec != nullptr) cudaGraphExecDestroy(exec);
    }
};

std::array<int32_t, kDispatchSettings> dispatch_settings() {
    std::array<int32_t, kDispatchSettings> s{};
    for (int32_t i = 0; i < kDispatchSettings; ++i) s[i] = get_dispatch(static_cast<DispatchSetting>(i));
    return s;
}

constexpr size_t kLogitBudgetBytes = size_t(64) << 20;  // default logits chunk
constexpr size_t kMaxGraphs = 8;                          // cached pass shapes per GpuModel
// Tokens per forward pass when sequences are packed together: enough rows that the GEMMs run at full speed, few
// enough that the activations stay near 1 GB on the 2B shape. A longer sequence gets a pass of its own length.
constexpr int32_t kPassTokens = 8192;
// The vocabulary (head rows) is padded to this multiple: cuBLAS's fast FP16 kernels need leading dimensions that are
// multiples of 8, the Marlin-class kernels N % 64 == 0. The padding rows are zero; head_nll never reads their logits.
constexpr int32_t kHeadRowMultiple = 64;

int32_t round_up(int64_t v, int64_t multiple) { return static_cast<int32_t>((v + multiple - 1) / multiple * multiple); }

}  // namespace

struct GpuModel::State {
    int32_t device = 0;
    ModelConfig config;
    GpuModelOptions options;
    std::mutex mutex;  // one call at a time
    cudaStream_t own_stream = nullptr;
    cublasHandle_t cublas = nullptr;

    DeviceBuffer embed;  // [vocab][d_model] in the file's dtype
    gpu::TableType embed_type = gpu::TableType::F32;
    std::vector<DeviceBlock> pre;
    DeviceBlock loop;
    DeviceBuffer final_norm;
    DeviceLinear head;
    uint64_t weight_bytes = 0;
    bool loop_has_rounding_channels = false;  // frac4 / sign_bit on a looped linear (cross-iteration rounding)

    Activations act;
    DeviceBuffer workspace;  // the dispatcher's, zero-filled once
    DeviceBuffer loop_fp16;  // the looped block's INT4 weights as FP16, dequantized once per pass (dequantized_once)
    std::vector<int32_t> host_meta;  // the layout of act.meta
    std::vector<float> host_nll;
    std::vector<uint8_t> host_greedy;
    std::map<PassShape, std::unique_ptr<Graph>> graphs;
    std::set<PassShape> uncapturable;  // pass shapes whose capture failed: they run eagerly

    uint64_t dense_calls = 0;  // cuBLAS GEMMs enqueued (captured ones included)
    Tally ran;                 // GEMMs executed
    uint64_t windows = 0, captures = 0, replays = 0;
    double capture_seconds = 0.0;

    ~State() {
        graphs.clear();
        if (cublas != nullptr) gpu::cublas_api()->destroy(cublas);  // created through it, so it is loaded
        if (own_stream != nullptr) cudaStreamDestroy(own_stream);
    }

    std::vector<const DeviceLinear *> linears() const {
        std::vector<const DeviceLinear *> all;
        auto add_block = [&](const DeviceBlock &b) {
            for (const DeviceLinear *l : {&b.qkv, &b.out, &b.gate_up, &b.up, &b.down}) {
                if (l->n > 0) all.push_back(l);
            }
        };
        for (const DeviceBlock &b : pre) add_block(b);
        add_block(loop);
        all.push_back(&head);
        return all;
    }

    Tally counted() const {
        Tally t;
        for (const DeviceLinear *l : linears()) {
            if (!l->quant) continue;
            const DispatchCounts c = dispatch_counts(*l->quant);
            const uint64_t v[6] = {c.fp16_body, c.marlin_fused, c.marlin_correction, c.dequant_cublas, c.native,
                                   c.fallbacks};
            for (int i = 0; i < 6; ++i) t.v[i] += v[i];
        }
        t.v[6] = dense_calls;
        return t;
    }
};

namespace {

// ---- Building the device model ----

// What the GPU backend needs of a linear's storage: a complete INT4 weight, or dense values.
void check_gpu_storage(const Linear &w, const std::string &name) {
    if (w.quantized) {
        require_complete_int4(w, ("model: " + name).c_str());
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

// A linear on the device, its rows (N) padded with zero rows to a multiple of `n_multiple`. Runs on any thread (with
// the model's device current): ensure_cublas has run before.
DeviceLinear make_linear(const GpuModel::State &s, const Linear &w, int32_t n_multiple = 1) {
    DeviceLinear d;
    d.name = w.name;
    d.k = w.k;
    d.n = round_up(w.n, n_multiple);
    if (w.quantized) {
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
    return d;
}

// Building a model's linear layers: each job converts or packs one on the host and uploads it, independently of the
// others, so that they run on a thread pool (packing is most of a model's first-call time).
using LinearJobs = std::vector<std::function<void()>>;

void add_linear(LinearJobs &jobs, const GpuModel::State &s, DeviceLinear &slot, const Linear &w,
                int32_t n_multiple = 1) {
    jobs.push_back([&s, &slot, &w, n_multiple] { slot = make_linear(s, w, n_multiple); });
}

// The block's norms now, its linears as jobs writing into `d` (which must stay where it is until they have run).
void make_block(GpuModel::State &s, const Block &b, DeviceBlock &d, LinearJobs &jobs) {
    d.attn_norm = upload_floats(s.device, b.attn_norm);
    d.mlp_norm = upload_floats(s.device, b.mlp_norm);
    s.weight_bytes += d.attn_norm.bytes() + d.mlp_norm.bytes();
    add_linear(jobs, s, d.qkv, b.attn_qkv);
    add_linear(jobs, s, d.out, b.attn_out);
    const Linear &gate = b.mlp_gate, &up = b.mlp_up;
    if (gate.quantized && up.quantized && gate.group_size == up.group_size && same_k_perm(gate, up)) {
        const std::string name = gate.name.substr(0, gate.name.rfind('.') + 1) + "mlp_gate_up";
        jobs.push_back([&s, &d, &gate, &up, name] { d.gate_up = make_linear(s, concat_linear_rows(gate, up, name)); });
    } else {
        add_linear(jobs, s, d.gate_up, gate);
        add_linear(jobs, s, d.up, up);
    }
    add_linear(jobs, s, d.down, b.mlp_down);
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

// ---- Running a pass ----

// `dequantized`: w's FP16 form from loop_fp16, or nullptr.
void gemm(GpuModel::State &s, const DeviceLinear &w, const uint16_t *x, uint16_t *y, int32_t m, cudaStream_t stream,
          const uint16_t *dequantized = nullptr) {
    if (w.quant) {
        // The model's own cuBLAS handle: graphs captured here keep its workspace, which no other model shares.
        quant_gemm(*w.quant, x, y, m, Dtype::F16, stream, s.workspace.get(), s.workspace.bytes(), s.cublas,
                   dequantized);
        return;
    }
    check_rc(gpu::cublas_gemm(s.cublas, x, w.dense_values, y, m, w.n, w.k, Dtype::F16, stream),
             "FP16 GEMM (cuBLAS) of '" + w.name + "'");
    ++s.dense_calls;
}

using BlockLinears = std::array<const DeviceLinear *, 5>;
BlockLinears block_linears(const DeviceBlock &b) { return {&b.qkv, &b.out, &b.gate_up, &b.up, &b.down}; }

// Whether a looped linear is dequantized once per pass: where the dispatcher would dequantize it to FP16 for cuBLAS
// at each of the block's applications (passes of many rows), doing it once saves loops - 1 passes over its weights
// (15% of the GPU time of 16-token windows on the 2B model was dequantization).
bool dequantized_once(const GpuModel::State &s, const DeviceLinear &l, int32_t rows) {
    return s.config.loops > 1 && l.n > 0 && l.quant && dequant_cublas_wanted(*l.quant, rows);
}

size_t loop_fp16_bytes(const GpuModel::State &s, int32_t rows) {
    size_t bytes = 0;
    for (const DeviceLinear *l : block_linears(s.loop)) {
        if (dequantized_once(s, *l, rows)) bytes += dequantized_bytes(*l->quant);
    }
    return bytes;
}

// The forward pass of one pass (its tokens, targets, positions and segment offsets already in act.meta) up to
// act.nll and act.greedy for every row. Enqueues only.
void enqueue_pass(GpuModel::State &s, const PassShape &shape, cudaStream_t stream) {
    const ModelConfig &c = s.config;
    const int32_t T = shape.rows, D = c.d_model, F = c.ffn, H = c.n_heads, hd = c.head_dim;
    Activations &a = s.act;
    float *x = a.x.get<float>();
    uint16_t *xn = a.xn.get<uint16_t>(), *qkv = a.qkv.get<uint16_t>(), *att = a.att.get<uint16_t>();
    uint16_t *proj = a.proj.get<uint16_t>(), *gu = a.gu.get<uint16_t>(), *hidden = a.hidden.get<uint16_t>();
    const gpu::Segments segments{a.offsets(), shape.segments, shape.max_len};

    check_rc(gpu::embed_gather(a.tokens(), s.embed.get(), s.embed_type, x, T, D, c.vocab, stream), "embedding gather");
    const uint16_t *pending = nullptr;  // the last block's mlp_down output, added to x by the next norm
    using Fp16Forms = std::array<const uint16_t *, 5>;  // per block_linears entry: its FP16 form, or nullptr
    auto run_block = [&](const DeviceBlock &b, const Fp16Forms &fp16) {
        check_rc(gpu::rmsnorm_residual(x, pending, b.attn_norm.get<float>(), xn, T, D, c.norm_eps, stream),
                 "residual + attn_norm");
        gemm(s, b.qkv, xn, qkv, T, stream, fp16[0]);
        check_rc(gpu::rope_qk(qkv, a.rope_cos.get<float>(), a.rope_sin.get<float>(), T, H, hd, stream, a.positions()),
                 "RoPE");
        check_rc(gpu::causal_attention(qkv, att, T, H, hd, stream, gpu::AttentionKernel::Auto, segments),
                 "attention");
        gemm(s, b.out, att, proj, T, stream, fp16[1]);
        check_rc(gpu::rmsnorm_residual(x, proj, b.mlp_norm.get<float>(), xn, T, D, c.norm_eps, stream),
                 "residual + mlp_norm");
        gemm(s, b.gate_up, xn, gu, T, stream, fp16[2]);
        if (b.up.n == 0) {
            check_rc(gpu::swiglu(gu, gu + F, 2 * F, hidden, T, F, stream), "SwiGLU");
        } else {
            gemm(s, b.up, xn, gu + a.up_offset, T, stream, fp16[3]);
            check_rc(gpu::swiglu(gu, gu + a.up_offset, F, hidden, T, F, stream), "SwiGLU");
        }
        gemm(s, b.down, hidden, proj, T, stream, fp16[4]);
        pending = proj;
    };
    for (const DeviceBlock &b : s.pre) run_block(b, Fp16Forms{});
    Fp16Forms loop_fp16{};
    size_t used = 0;  // the settings may have changed since loop_fp16 was sized: what does not fit takes the usual path
    const BlockLinears loop_linears = block_linears(s.loop);
    for (size_t i = 0; i < loop_linears.size(); ++i) {
        if (!dequantized_once(s, *loop_linears[i], T)) continue;
        const size_t bytes = dequantized_bytes(*loop_linears[i]->quant);
        if (used + bytes > s.loop_fp16.bytes()) continue;
        auto *w = reinterpret_cast<uint16_t *>(s.loop_fp16.get<char>() + used);
        dequantize_weight(*loop_linears[i]->quant, w, stream);
        loop_fp16[i] = w;
        used += bytes;
    }
    for (int32_t l = 0; l < c.loops; ++l) run_block(s.loop, loop_fp16);
    check_rc(gpu::rmsnorm_residual(x, pending, s.final_norm.get<float>(), xn, T, D, c.norm_eps, stream),
             "residual + final_norm");

    // Every row, in chunks whose logits fit the buffer; a sequence's last row has target -1 and is not read back.
    for (int32_t t0 = 0; t0 < T; t0 += a.chunk) {
        const int32_t rows = std::min(a.chunk, T - t0);
        uint16_t *logits = a.logits.get<uint16_t>();
        gemm(s, s.head, xn + static_cast<size_t>(t0) * D, logits, rows, stream);
        check_rc(gpu::head_nll(logits, s.head.n, rows, c.vocab, a.targets() + t0, a.nll.get<float>() + t0, stream,
                               a.greedy.get<uint8_t>() + t0),
                 "head log-softmax");
    }
}

// The buffer sizes of Activations for passes of `rows` tokens, in bytes.
struct ActivationSizes {
    int32_t chunk = 0;
    size_t up_offset = 0;  // halves
    size_t x = 0, xn = 0, qkv = 0, att = 0, proj = 0, gu = 0, hidden = 0, logits = 0, meta = 0, nll = 0, greedy = 0,
           rope = 0;
    size_t total() const {
        return x + xn + qkv + att + proj + gu + hidden + logits + meta + nll + greedy + 2 * rope;
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
    z.qkv = R * 3 * A * half;
    z.att = R * A * half;
    z.proj = R * D * half;
    z.gu = (z.up_offset + R * F) * half;  // >= R * 2F: holds the fused layout too
    z.hidden = R * F * half;
    z.logits = static_cast<size_t>(z.chunk) * s.head.n * half;
    z.meta = (4 * R + 1) * sizeof(int32_t);  // tokens, targets, positions, and up to R + 1 segment offsets
    z.nll = R * sizeof(float);
    z.greedy = R;
    z.rope = R * (c.head_dim / 2) * sizeof(float);
    return z;
}

// The dispatcher's workspace for every weight at up to `rows` rows (and the head's chunk) under the current settings.
size_t workspace_bytes(const GpuModel::State &s, int32_t rows, int32_t chunk) {
    size_t needed = 0;
    const int64_t max_m = std::max(rows, chunk);
    for (const DeviceLinear *l : s.linears()) {
        if (l->quant) needed = std::max(needed, quant_gemm_workspace_size(*l->quant, max_m));
    }
    return needed;
}

// Device memory of passes of `rows` rows beyond the weights: activations, workspace and the looped block's FP16 forms.
size_t working_set_bytes(const GpuModel::State &s, int32_t rows) {
    const ActivationSizes z = activation_sizes(s, rows);
    return z.total() + workspace_bytes(s, rows, z.chunk) + loop_fp16_bytes(s, rows);
}

// The rows a call's passes hold: pass_tokens (0: kPassTokens), or the longest sequence when that is longer, but never more than the
// call's sequences need in all; and within the budget when one is set (down to the longest sequence, which must fit).
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

// Activations for passes of `rows` tokens and a workspace for every weight at that many rows; both only grow.
// Any change drops the captured graphs (they hold the old addresses). The working set a call of `rows` tokens
// uses is checked against the budget before anything is allocated.
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
        std::vector<float> cos_table, sin_table;
        rope_tables(rows, c.head_dim, c.rope_theta, cos_table, sin_table);
        a.rope_cos = upload_floats(s.device, cos_table);
        a.rope_sin = upload_floats(s.device, sin_table);
        a.bytes = z.total();
        s.act = std::move(a);
        s.host_meta.assign(z.meta / sizeof(int32_t), 0);
        s.host_nll.resize(static_cast<size_t>(rows));
        s.host_greedy.resize(static_cast<size_t>(rows));
    }
    // Sized at every call: the dequantize + cuBLAS path's share depends on the current dispatcher settings.
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

std::unique_ptr<Graph> capture_pass(GpuModel::State &s, const PassShape &shape, cudaStream_t stream) {
    const auto start = std::chrono::steady_clock::now();
    auto g = std::make_unique<Graph>();
    g->settings = dispatch_settings();
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

// Without graphs: enqueue the pass. With graphs: replay the pass shape's graph when it is still valid; else run the
// pass eagerly (which also performs the dispatcher's lazy set-up: cuBLAS handles, occupancy queries, neither of which
// may happen inside a capture) and then capture it for the next passes of this shape. Returns the GEMMs run.
Tally run_pass(GpuModel::State &s, const PassShape &shape, cudaStream_t stream, bool use_graphs) {
    if (use_graphs) {
        const auto it = s.graphs.find(shape);
        if (it != s.graphs.end()) {
            const Graph &g = *it->second;
            if (g.settings == dispatch_settings()) {
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

// One sequence of a call: tokens[0, len), scored from index first_scored on; token j's NLL (j >= 1) goes to
// token_nll[j - 1] when token_nll is set; its result to scores[index] when scores is set.
struct Segment {
    const int32_t *tokens;
    int32_t len;
    int32_t first_scored;
    float *token_nll;
};

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
        const int32_t R = s.act.rows;
        int32_t *tokens = s.host_meta.data(), *targets = tokens + R, *positions = tokens + 2 * R;
        int32_t *offsets = tokens + 3 * R;
        PassShape shape;
        size_t end = first;
        while (end < segments.size() && shape.segments < gpu::kMaxSegments &&
               (end == first || shape.rows + segments[end].len <= capacity)) {
            const Segment &g = segments[end++];
            offsets[shape.segments++] = shape.rows;
            for (int32_t j = 0; j < g.len; ++j) {
                tokens[shape.rows + j] = g.tokens[j];
                targets[shape.rows + j] = j + 1 < g.len ? g.tokens[j + 1] : -1;
                positions[shape.rows + j] = j;
            }
            shape.rows += g.len;
            shape.max_len = std::max(shape.max_len, g.len);
        }
        offsets[shape.segments] = shape.rows;
        // Copied up to the offsets' end: every field of the pass's layout, not the unused tail.
        check_cuda(cudaMemcpyAsync(s.act.meta.get(), tokens, (3 * static_cast<size_t>(R) + shape.segments + 1) *
                                                                sizeof(int32_t),
                                   cudaMemcpyHostToDevice, stream),
                   "cudaMemcpyAsync (tokens)");
        const uint64_t captures = s.captures, replays = s.replays;
        const double capture_seconds = s.capture_seconds;
        const Tally ran = run_pass(s, shape, stream, options.use_graphs);
        check_cuda(cudaMemcpyAsync(s.host_nll.data(), s.act.nll.get(), shape.rows * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream),
                   "cudaMemcpyAsync (NLL)");
        check_cuda(cudaMemcpyAsync(s.host_greedy.data(), s.act.greedy.get(), shape.rows, cudaMemcpyDeviceToHost,
                                   stream),
                   "cudaMemcpyAsync (greedy)");
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
            result.nll_sum += score.nll_sum;
            result.tokens_scored += score.tokens_scored;
            if (scores != nullptr) scores[i] = score;
        }
        first = end;
        if (options.progress) {
            lock.unlock();
            const bool go_on = options.progress(result.tokens_scored, to_score);
            lock.lock();
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
    if (options.cross_iter_round && s.loop_has_rounding_channels) {
        fail(TL_ERR_UNSUPPORTED, "cross-iteration rounding is not implemented on the GPU");
    }
    return stream != nullptr ? static_cast<cudaStream_t>(stream) : s.own_stream;
}

}  // namespace

GpuModel::GpuModel(const Model &model, int32_t device, const GpuModelOptions &options) {
    check_gpu_model(model);
    require_device(device);
    DeviceScope scope(device);
    auto s = std::make_unique<State>();  // destroyed inside `scope` if building fails
    s->device = device;
    s->config = model.config;
    s->options = options;
    check_cuda(cudaStreamCreateWithFlags(&s->own_stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");

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
    for (size_t i = 0; i < model.pre.size(); ++i) make_block(*s, model.pre[i], s->pre[i], jobs);
    make_block(*s, model.loop, s->loop, jobs);
    for (int i = 0; i < 5; ++i) {
        const Linear &w = *model.loop.linear(i);
        s->loop_has_rounding_channels = s->loop_has_rounding_channels || w.frac4 != nullptr || w.sign_bit != nullptr;
    }
    s->final_norm = upload_floats(device, model.final_norm);
    s->weight_bytes += s->final_norm.bytes();
    make_head(*s, model, jobs);
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    ThreadPool pool(static_cast<int32_t>(std::min<size_t>(jobs.size(), std::min(cores, 64u))));
    pool.parallel_for(jobs.size(), [&](size_t i, int32_t) {
        DeviceScope job_scope(device);
        jobs[i]();
    });
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
    return out;
}

uint64_t GpuModel::device_bytes() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->weight_bytes + state_->act.bytes + state_->workspace.bytes() + state_->loop_fp16.bytes();
}

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
    }
    // Held while this call uses the model's buffers, and released around the progress callback (after a pass's work
    // is done and its NLLs are copied out), so the callback may call into the library, this model included.
    std::unique_lock<std::mutex> lock(s.mutex);
    DeviceScope scope(s.device);
    GpuScoreStats stats;
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
        nll_offset += q.n_tokens - 1;
    }
    std::unique_lock<std::mutex> lock(s.mutex);  // as in score_cuda
    DeviceScope scope(s.device);
    GpuScoreStats stats;
    ScoreResult result = score_segments(s, segments, options, stream, lock, stats, scores);
    result.n_windows = static_cast<int32_t>(n_sequences);
    if (call_stats != nullptr) *call_stats = stats;
    return result;
}

#endif  // TL_WITH_CUDA

}  // namespace tl
