#include "cpu/cpu_forward.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>


#include "cpu/act_quant.hpp"
#include "quant/cross_iter.hpp"
#include "score/compare.hpp"
#include "score/rope.hpp"
#include "util/error.hpp"
#include "quant/quant.hpp"
#include "util/thread_pool.hpp"

namespace tl {

namespace {

// ---- Linear layers ----

// GCC/Clang vector extensions. Vec4 is one SSE/NEON register; Vec8 one AVX register, used only inside
// target("avx2") code (elsewhere it is lowered through memory). The arithmetic is lane-wise multiply then add
// (AVX2 without FMA), so every output is the same sequential FP32 sum over k on either path: results depend
// neither on the tiling, nor on the thread count, nor on which kernel ran.
typedef float Vec4 __attribute__((vector_size(16)));
typedef float Vec8 __attribute__((vector_size(32)));
constexpr int32_t kPanel = 8;      // columns per micro-kernel panel
constexpr int32_t kTileCols = 32;  // columns per task: dequantized once, then used by all M rows
constexpr int32_t kRows = 8;       // rows per row_block call

// One worker's buffers for a column tile: the dequantized rows of W and the same values panel-major.
struct TileScratch {
    std::vector<float> rows;    // [cols][K]
    std::vector<float> panels;  // [cols / kPanel][K][kPanel]
};

// y[r][j] = sum_k x[r][k] * panel[k][j] for r < R, j < cols <= kPanel. Inlined into each target's entry point
// so V's operations compile for that target; R * kPanel / lanes accumulators stay in registers.
template <class V, int R>
__attribute__((always_inline)) inline void micro_kernel(const float *x, size_t ldx, const float *panel, int32_t K,
                                                        float *y, size_t ldy, int32_t cols) {
    constexpr int kLanes = sizeof(V) / sizeof(float), kVecs = kPanel / kLanes;
    V acc[R][kVecs];
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < kVecs; ++v) acc[r][v] = V{};
    for (int32_t k = 0; k < K; ++k) {
        V w[kVecs];
        for (int v = 0; v < kVecs; ++v) {
            std::memcpy(&w[v], panel + static_cast<size_t>(k) * kPanel + v * kLanes, sizeof(V));
        }
        for (int r = 0; r < R; ++r)
            for (int v = 0; v < kVecs; ++v) acc[r][v] += x[r * ldx + k] * w[v];
    }
    for (int r = 0; r < R; ++r)
        for (int32_t j = 0; j < cols; ++j) y[r * ldy + j] = acc[r][j / kLanes][j % kLanes];
}

// micro_kernel<V, rows> for a run-time rows <= R.
template <class V, int R>
__attribute__((always_inline)) inline void micro_kernel_rows(int32_t rows, const float *x, size_t ldx,
                                                             const float *panel, int32_t K, float *y, size_t ldy,
                                                             int32_t cols) {
    if constexpr (R > 1) {
        if (rows < R) return micro_kernel_rows<V, R - 1>(rows, x, ldx, panel, K, y, ldy, cols);
    }
    micro_kernel<V, R>(x, ldx, panel, K, y, ldy, cols);
}

// Up to kRows rows times one panel: y[r][j] = sum_k x[r][k] * panel[k][j].
using RowBlockFn = void (*)(int32_t rows, const float *x, size_t ldx, const float *panel, int32_t K, float *y,
                            size_t ldy, int32_t cols);

// Portable: 4 rows per call, 4 x 2 Vec4 accumulators plus operands fill 16 SSE registers.
void row_block_portable(int32_t rows, const float *x, size_t ldx, const float *panel, int32_t K, float *y,
                        size_t ldy, int32_t cols) {
    for (int32_t r = 0; r < rows; r += 4) {
        micro_kernel_rows<Vec4, 4>(std::min(4, rows - r), x + r * ldx, ldx, panel, K, y + r * ldy, ldy, cols);
    }
}

#if defined(__x86_64__) || defined(__i386__)
#define TL_CPU_AVX2 1
// AVX2: 8 rows x one Vec8 accumulator each.
__attribute__((target("avx2"))) void row_block_avx2(int32_t rows, const float *x, size_t ldx, const float *panel,
                                                    int32_t K, float *y, size_t ldy, int32_t cols) {
    micro_kernel_rows<Vec8, kRows>(rows, x, ldx, panel, K, y, ldy, cols);
}
#endif

std::atomic<bool> g_portable_kernel{false};

// The widest kernel this CPU runs, unless use_portable_cpu_kernel asked for the portable one.
RowBlockFn row_block_kernel() {
    static const RowBlockFn widest = [] {
#ifdef TL_CPU_AVX2
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx2")) return &row_block_avx2;
#endif
        return &row_block_portable;
    }();
    return g_portable_kernel.load(std::memory_order_relaxed) ? &row_block_portable : widest;
}

// Columns [n0, n1) (at most kTileCols) of y = x W for all M rows; y has row stride ldy.
void linear_tile(const Linear &w, const float *x, int32_t M, int32_t n0, int32_t n1, float *y, size_t ldy,
                 TileScratch &scratch) {
    const size_t K = static_cast<size_t>(w.k);
    const int32_t cols = n1 - n0;
    const int32_t n_panels = (cols + kPanel - 1) / kPanel;
    scratch.rows.resize(kTileCols * K);
    scratch.panels.resize(kTileCols * K);
    dequantize_rows(w, n0, n1, scratch.rows.data());
    float *panels = scratch.panels.data();
    for (int32_t p = 0; p < n_panels; ++p)
        for (size_t k = 0; k < K; ++k)
            for (int32_t j = 0; j < kPanel; ++j) {
                const int32_t c = p * kPanel + j;
                panels[(p * K + k) * kPanel + j] = c < cols ? scratch.rows[c * K + k] : 0.0f;
            }
    const RowBlockFn row_block = row_block_kernel();
    // Rows outer, panels inner: the few x rows in use stay in L1 while every panel passes by.
    for (int32_t m = 0; m < M; m += kRows)
        for (int32_t p = 0; p < n_panels; ++p) {
            row_block(std::min(kRows, M - m), x + m * K, K, panels + p * K * kPanel, w.k, y + m * ldy + n0 + p * kPanel,
                      ldy, std::min(kPanel, cols - p * kPanel));
        }
    if (const float *bias = w.bias_values()) {  // added to the finished sum, as y = x W + b reads
        for (int32_t m = 0; m < M; ++m)
            for (int32_t j = 0; j < cols; ++j) y[m * ldy + n0 + j] += bias[n0 + j];
    }
}

using LinearInputHook = std::function<void(const Linear &, const float *, int32_t)>;

// The pool and each worker's scratch, for one call.
struct Context {
    explicit Context(int32_t n_threads, const LinearInputHook *linear_input = nullptr)
        : pool(n_threads), tiles(pool.size()), quant_tiles(pool.size()), work(pool.size()), work_test(pool.size()),
          linear_input(linear_input) {}
    ThreadPool pool;
    std::vector<TileScratch> tiles;
    // The blocks' linears' activation precision (the runner of the model being run sets it) and its scratch.
    ActivationMode activations = ActivationMode::Fp16;
    QuantizedInput quant_input;
    std::vector<QuantTileScratch> quant_tiles;
    std::vector<std::vector<float>> work;       // attention scores, head logits
    std::vector<std::vector<float>> work_test;  // a comparison's second logits chunk
    std::vector<float> kv_panels;          // attention keys and values of every head, packed
    const LinearInputHook *linear_input;   // ScoreOptions::linear_input, or null
};

void report_input(const Context &ctx, const Linear &w, const float *x, int32_t rows) {
    if (ctx.linear_input != nullptr && *ctx.linear_input) (*ctx.linear_input)(w, x, rows);
}

// Runs fn(t0, t1) over chunks of rows [0, T) in parallel, for the cheap row-wise steps.
template <class Fn>
void for_row_chunks(Context &ctx, int32_t T, Fn fn) {
    constexpr int32_t kChunk = 32;
    ctx.pool.parallel_for((T + kChunk - 1) / kChunk, [&](size_t i, int32_t) {
        const int32_t t0 = static_cast<int32_t>(i) * kChunk;
        fn(t0, std::min(T, t0 + kChunk));
    });
}

// y = x W with x quantized per row (ctx.activations INT8 or FP8): rows quantized in parallel, then one task per
// column tile.
void linear_quantized_activations(Context &ctx, const Linear &w, const float *x, float *y, int32_t M) {
    prepare_quantized_input(w, M, ctx.activations, ctx.quant_input);
    for_row_chunks(ctx, M, [&](int32_t t0, int32_t t1) { quantize_input_rows(w, x, t0, t1, ctx.quant_input); });
    const size_t n_tiles = (w.n + kTileCols - 1) / kTileCols;
    ctx.pool.parallel_for(n_tiles, [&](size_t tile, int32_t worker) {
        const int32_t n0 = static_cast<int32_t>(tile) * kTileCols;
        quantized_input_tile(w, ctx.quant_input, n0, std::min(w.n, n0 + kTileCols), y, w.n, ctx.quant_tiles[worker]);
    });
}

// y = x W over all M rows, one task per column tile.
void linear(Context &ctx, const Linear &w, const float *x, float *y, int32_t M) {
    report_input(ctx, w, x, M);
    if (ctx.activations != ActivationMode::Fp16) return linear_quantized_activations(ctx, w, x, y, M);
    const size_t n_tiles = (w.n + kTileCols - 1) / kTileCols;
    ctx.pool.parallel_for(n_tiles, [&](size_t tile, int32_t worker) {
        const int32_t n0 = static_cast<int32_t>(tile) * kTileCols;
        linear_tile(w, x, M, n0, std::min(w.n, n0 + kTileCols), y, w.n, ctx.tiles[worker]);
    });
}

// ---- RoPE ----

// cos and sin of each position's angles for positions [pos0, pos0 + T), i < head_dim/2: the config's frequencies
// (plain or scaled) and attention scale, from the one host function both backends use (score/rope.hpp), computed in
// double so long positions lose no accuracy, then rounded to float.
struct RopeTable {
    int32_t half = 0;
    std::vector<float> cos, sin;  // [T][half]
};

RopeTable make_rope_table(const ModelConfig &c, int32_t T, int32_t pos0) {
    RopeTable table;
    table.half = c.head_dim / 2;
    rope_tables(c, T, pos0, table.cos, table.sin);
    return table;
}

// Rotates rows [t0, t1) of x ([T][n_heads][head_dim] with row stride `stride`): pairs (i, i + half).
void apply_rope(float *x, size_t stride, int32_t t0, int32_t t1, int32_t n_heads, const RopeTable &table) {
    const int32_t half = table.half;
    for (int32_t t = t0; t < t1; ++t) {
        const float *c = table.cos.data() + static_cast<size_t>(t) * half;
        const float *s = table.sin.data() + static_cast<size_t>(t) * half;
        for (int32_t h = 0; h < n_heads; ++h) {
            float *v = x + t * stride + static_cast<size_t>(h) * 2 * half;
            for (int32_t i = 0; i < half; ++i) {
                const float a = v[i], b = v[i + half];
                v[i] = a * c[i] - b * s[i];
                v[i + half] = a * s[i] + b * c[i];
            }
        }
    }
}

void check_head_dim(int32_t n_heads, int32_t head_dim) {
    if (n_heads <= 0 || head_dim <= 0 || head_dim % 2 != 0) {
        fail(TL_ERR_INVALID_ARGUMENT, "n_heads = " + std::to_string(n_heads) + ", head_dim = " +
                                          std::to_string(head_dim) + " (need both > 0, head_dim even)");
    }
}

// ---- Attention ----

// Both products are panel products like the linears': scores = q K^T with key panels [8 keys][head_dim],
// out = p V with value panels [keys][8 dims]. Sums run over head_dim and over keys in order, as written.
// qkv rows are [q: n_heads][k: n_kv_heads][v: n_kv_heads] heads of head_dim; query head h reads K/V head
// h / (n_heads / n_kv_heads), whose panels are packed once for all the query heads of its group.
void attention(Context &ctx, const float *qkv, float *out, int32_t T, int32_t n_heads, int32_t n_kv_heads,
               int32_t head_dim) {
    const size_t A = static_cast<size_t>(n_heads) * head_dim, KV = static_cast<size_t>(n_kv_heads) * head_dim;
    const size_t stride = A + 2 * KV;
    const int32_t group = n_heads / n_kv_heads;
    const size_t keys = static_cast<size_t>((T + kPanel - 1) / kPanel) * kPanel;  // T rounded up to panels
    const int32_t dim_panels = (head_dim + kPanel - 1) / kPanel;
    const size_t key_floats = keys * head_dim, per_head = key_floats + dim_panels * keys * kPanel;
    const RowBlockFn row_block = row_block_kernel();

    // Each K/V head's keys and values, packed once for all its query heads' blocks (padding stays zero).
    ctx.kv_panels.assign(n_kv_heads * per_head, 0.0f);
    ctx.pool.parallel_for(n_kv_heads, [&](size_t g, int32_t) {
        float *key_panels = ctx.kv_panels.data() + g * per_head;  // [keys / 8][head_dim][8]
        float *value_panels = key_panels + key_floats;            // [dim_panels][keys][8]
        for (int32_t j = 0; j < T; ++j) {
            const float *k = qkv + j * stride + A + g * head_dim;
            float *kp = key_panels + static_cast<size_t>(j / kPanel) * head_dim * kPanel + j % kPanel;
            for (int32_t d = 0; d < head_dim; ++d) kp[d * kPanel] = k[d];
            const float *v = qkv + j * stride + A + KV + g * head_dim;
            for (int32_t d0 = 0; d0 < head_dim; d0 += kPanel) {
                std::memcpy(value_panels + (d0 / kPanel * keys + j) * kPanel, v + d0,
                            std::min(kPanel, head_dim - d0) * sizeof(float));
            }
        }
    });

    constexpr int32_t kQueryBlock = 64;  // (head, query block) tasks keep all threads busy even with few heads
    const int32_t n_blocks = (T + kQueryBlock - 1) / kQueryBlock;
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    ctx.pool.parallel_for(static_cast<size_t>(n_heads) * n_blocks, [&](size_t task, int32_t worker) {
        // Causal: later query blocks cost more, so they are handed out first.
        const int32_t block = n_blocks - 1 - static_cast<int32_t>(task / n_heads);
        const size_t h = task % n_heads;
        const float *key_panels = ctx.kv_panels.data() + (h / group) * per_head;
        const float *value_panels = key_panels + key_floats;
        std::vector<float> &scores = ctx.work[worker];  // [kRows][keys]
        scores.resize(kRows * keys);
        const int32_t t1 = std::min(T, (block + 1) * kQueryBlock);
        for (int32_t t = block * kQueryBlock; t < t1; t += kRows) {
            const int32_t rows = std::min(kRows, t1 - t);
            const int32_t n_keys = t + rows;  // keys the last row sees
            const float *q = qkv + t * stride + h * head_dim;
            for (int32_t j0 = 0; j0 < n_keys; j0 += kPanel) {
                row_block(rows, q, stride, key_panels + static_cast<size_t>(j0) * head_dim, head_dim,
                          scores.data() + j0, keys, std::min(kPanel, n_keys - j0));
            }
            float sums[kRows];
            for (int32_t r = 0; r < rows; ++r) {
                float *s = scores.data() + r * keys;
                const int32_t n = t + r + 1;
                float mx = -std::numeric_limits<float>::infinity();
                for (int32_t j = 0; j < n; ++j) mx = std::max(mx, s[j] *= scale);
                sums[r] = 0.0f;
                for (int32_t j = 0; j < n; ++j) sums[r] += (s[j] = std::exp(s[j] - mx));
                std::fill(s + n, s + n_keys, 0.0f);  // masked keys weigh exactly nothing
            }
            float *o = out + t * A + h * head_dim;
            for (int32_t p = 0; p < dim_panels; ++p) {
                row_block(rows, scores.data(), keys, value_panels + p * keys * kPanel, n_keys, o + p * kPanel, A,
                          std::min(kPanel, head_dim - p * kPanel));
            }
            for (int32_t r = 0; r < rows; ++r)
                for (int32_t d = 0; d < head_dim; ++d) o[r * A + d] /= sums[r];
        }
    });
}

// ---- The model ----

// What the CPU backend needs of a linear's storage: complete quantized arrays (INT4: K even, zeros; INT8: no zeros;
// whole groups) or dense values.
void check_cpu_storage(const Linear &w, const std::string &name) {
    const bool int4 = w.bits == 4 && w.zeros && w.k % 2 == 0, int8 = w.bits == 8 && !w.zeros && !w.frac4 && !w.sign_bit;
    const bool complete = w.quantized ? (w.codes && w.scales && (int4 || int8) && w.group_size > 0 &&
                                         w.k % w.group_size == 0)
                                      : w.dense != nullptr;
    if (!complete) fail(TL_ERR_INVALID_ARGUMENT, "model: " + name + " has missing or inconsistent storage");
}


// Activations of one window, allocated once per call for the longest window.
struct Activations {
    Activations(const ModelConfig &c, int32_t L)
        : x(static_cast<size_t>(L) * c.d_model), xn(x.size()), proj(x.size()),
          qkv(static_cast<size_t>(L) * c.qkv_dim()), att(static_cast<size_t>(L) * c.attn_dim()),
          gate(static_cast<size_t>(L) * c.ffn), up(gate.size()),
          rope(make_rope_table(c, L, 0)) {}
    std::vector<float> x, xn, proj, qkv, att, gate, up;
    RopeTable rope;
};

void block_forward(Context &ctx, const ModelConfig &c, const Block &b, Activations &a, int32_t T) {
    const size_t D = static_cast<size_t>(c.d_model), F = static_cast<size_t>(c.ffn);
    const size_t QKV = static_cast<size_t>(c.qkv_dim());
    float *x = a.x.data(), *xn = a.xn.data(), *proj = a.proj.data();
    for_row_chunks(ctx, T, [&](int32_t t0, int32_t t1) {
        rmsnorm(x + t0 * D, b.attn_norm.data(), xn + t0 * D, t1 - t0, c.d_model, c.norm_eps);
    });
    linear(ctx, b.attn_qkv, xn, a.qkv.data(), T);
    // q and k are adjacent in each row, so they rotate together as n_heads + kv_heads heads.
    for_row_chunks(ctx, T, [&](int32_t t0, int32_t t1) {
        apply_rope(a.qkv.data(), QKV, t0, t1, c.n_heads + c.kv_heads(), a.rope);
    });
    attention(ctx, a.qkv.data(), a.att.data(), T, c.n_heads, c.kv_heads(), c.head_dim);
    linear(ctx, b.attn_out, a.att.data(), proj, T);
    for_row_chunks(ctx, T, [&](int32_t t0, int32_t t1) {
        for (size_t i = t0 * D; i < t1 * D; ++i) x[i] += proj[i];
        rmsnorm(x + t0 * D, b.mlp_norm.data(), xn + t0 * D, t1 - t0, c.d_model, c.norm_eps);
    });
    linear(ctx, b.mlp_gate, xn, a.gate.data(), T);
    linear(ctx, b.mlp_up, xn, a.up.data(), T);
    for_row_chunks(ctx, T, [&](int32_t t0, int32_t t1) {
        for (size_t i = t0 * F; i < t1 * F; ++i) {
            const float g = a.gate[i];
            a.gate[i] = g / (1.0f + std::exp(-g)) * a.up[i];
        }
    });
    linear(ctx, b.mlp_down, a.gate.data(), proj, T);
    for_row_chunks(ctx, T, [&](int32_t t0, int32_t t1) {
        for (size_t i = t0 * D; i < t1 * D; ++i) x[i] += proj[i];
    });
}

constexpr size_t kLogitBudget = size_t(1) << 20;  // floats of logits per worker and model

// Head positions per chunk: one chunk's logits, [chunk][vocab], stay within kLogitBudget.
int32_t head_chunk(int32_t vocab) { return static_cast<int32_t>(std::clamp<size_t>(kLogitBudget / vocab, 1, 64)); }

// The logits of positions [t0, t0 + rows) of h through `head`, into `logits` [rows][head.n].
void head_logits(Context &ctx, const Linear &head, const float *h, int32_t t0, int32_t rows, int32_t worker,
                 std::vector<float> &logits) {
    const int32_t V = head.n;
    logits.resize(static_cast<size_t>(rows) * V);
    for (int32_t n0 = 0; n0 < V; n0 += kTileCols) {
        linear_tile(head, h + static_cast<size_t>(t0) * head.k, rows, n0, std::min(V, n0 + kTileCols), logits.data(),
                    V, ctx.tiles[worker]);
    }
}

// nll[t] = -log softmax(h[t] head)[tokens[t + 1]] for t < T - 1, and greedy[t] = 1 when that token's logit is the
// row's largest (a tie counts), else 0; with top_k > 0, the row's k most likely tokens and their log-probabilities at
// top_ids / top_logprobs [t * top_k ..]. Positions are processed in chunks, each chunk's logits in its worker's
// scratch, so the [T, vocab] logits never exist at once.
void head_nll(Context &ctx, const Linear &head, const float *h, const int32_t *tokens, int32_t T, double *nll,
              uint8_t *greedy, int32_t top_k, int32_t *top_ids, float *top_logprobs) {
    const int32_t V = head.n, M = T - 1, chunk = head_chunk(V);
    report_input(ctx, head, h, M);
    ctx.pool.parallel_for((M + chunk - 1) / chunk, [&](size_t i, int32_t worker) {
        const int32_t t0 = static_cast<int32_t>(i) * chunk, rows = std::min(chunk, M - t0);
        std::vector<float> &logits = ctx.work[worker];
        head_logits(ctx, head, h, t0, rows, worker, logits);
        for (int32_t r = 0; r < rows; ++r) {
            const float *l = logits.data() + static_cast<size_t>(r) * V;
            const float mx = *std::max_element(l, l + V), target = l[tokens[t0 + r + 1]];
            double sum = 0.0;
            for (int32_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(l[v]) - mx);
            nll[t0 + r] = mx + std::log(sum) - target;
            greedy[t0 + r] = target == mx;
            if (top_k > 0) {
                const size_t at = static_cast<size_t>(t0 + r) * top_k;
                top_k_row(l, V, top_k, mx + std::log(sum), top_ids + at, top_logprobs + at);
            }
        }
    });
}

// A comparison's head: both models' logits for the same chunk of positions, side by side in each worker's scratch,
// reduced row by row (compare_row) into out's arrays at [t] for t < T - 1. Never more than a chunk per model.
void head_compare(Context &ctx, const Linear &ref_head, const float *ref_h, const Linear &test_head,
                  const float *test_h, const int32_t *tokens, int32_t T, const CompareOutputs &out) {
    const int32_t V = ref_head.n, M = T - 1, chunk = head_chunk(V);
    ctx.pool.parallel_for((M + chunk - 1) / chunk, [&](size_t i, int32_t worker) {
        const int32_t t0 = static_cast<int32_t>(i) * chunk, rows = std::min(chunk, M - t0);
        head_logits(ctx, ref_head, ref_h, t0, rows, worker, ctx.work[worker]);
        head_logits(ctx, test_head, test_h, t0, rows, worker, ctx.work_test[worker]);
        for (int32_t r = 0; r < rows; ++r) {
            const size_t row = static_cast<size_t>(r) * V;
            const CompareRow c =
                compare_row(ctx.work[worker].data() + row, ctx.work_test[worker].data() + row, V, tokens[t0 + r + 1]);
            const size_t t = static_cast<size_t>(t0 + r);
            out.kl[t] = static_cast<float>(c.kl);
            out.nll_reference[t] = static_cast<float>(c.nll_reference);
            out.nll_test[t] = static_cast<float>(c.nll_test);
            out.top1_match[t] = c.top1_match ? 1 : 0;
        }
    });
}

// The forward pass of one window up to the final norm: a.xn holds the head's input for every position.
// `loop_blocks`: the looped block per iteration under cross-iteration rounding, else empty (model.loop each time).
void forward_hidden(Context &ctx, const Model &model, const std::vector<Block> &loop_blocks, const int32_t *tokens,
                    int32_t T, Activations &a) {
    const ModelConfig &c = model.config;
    const size_t D = static_cast<size_t>(c.d_model);
    for (int32_t t = 0; t < T; ++t)
        for (size_t d = 0; d < D; ++d)
            a.x[t * D + d] = load_float(model.embed_dtype, model.embed, static_cast<size_t>(tokens[t]) * D + d);
    for (const Block &b : model.pre) block_forward(ctx, c, b, a, T);
    for (int32_t l = 0; l < c.loops; ++l) {
        block_forward(ctx, c, loop_blocks.empty() ? model.loop : loop_blocks[l], a, T);
    }
    for_row_chunks(ctx, T, [&](int32_t t0, int32_t t1) {
        rmsnorm(a.x.data() + t0 * D, model.final_norm.data(), a.xn.data() + t0 * D, t1 - t0, c.d_model, c.norm_eps);
    });
}

// `rows`, once the memory a call scoring windows of up to `rows` tokens needs is within the options' budget.
int32_t within_budget(const Model &model, int32_t rows, const Context &ctx, const ScoreOptions &options) {
    const uint64_t top_k_bytes = static_cast<uint64_t>(rows) * options.top_k * (sizeof(int32_t) + sizeof(float));
    check_memory_budget(cpu_score_bytes(model, rows, static_cast<int32_t>(ctx.pool.size()), options.cross_iter_round(),
                                        options.activations) +
                            top_k_bytes,
                        options.max_memory_bytes, host_memory_bytes(), "host memory");
    return rows;
}

// One model's part of a scoring call, for windows of up to `rows` tokens: its activations, their precision in the
// blocks' linears and, under cross-iteration rounding, its looped block per iteration.
struct ModelRunner {
    ModelRunner(const Model &model, int32_t rows, bool cross_iter_round, ActivationMode mode)
        : model(model), activations(model.config, rows), mode(mode) {
        if (cross_iter_round) {
            for (int32_t l = 0; l < model.config.loops; ++l) {
                loop_blocks.push_back(cross_iter_block(model.loop, l, model.config.loops));
            }
        }
    }
    // The window's forward pass up to the head's input, activations.xn.
    void forward(Context &ctx, const int32_t *tokens, int32_t T) {
        ctx.activations = mode;
        forward_hidden(ctx, model, loop_blocks, tokens, T, activations);
        ctx.activations = ActivationMode::Fp16;
    }

    const Model &model;
    Activations activations;
    ActivationMode mode;
    std::vector<Block> loop_blocks;
};

// What one scoring call sets up once for windows of up to `rows` tokens (checked against the memory budget before
// anything is allocated): the worker pool, the model's runner, and the per-position results of the last window.
class WindowScorer {
public:
    WindowScorer(const Model &model, int32_t rows, const ScoreOptions &options)
        : ctx_(options.n_threads, &options.linear_input),
          runner_(model, within_budget(model, rows, ctx_, options), options.cross_iter_round(), options.activations),
          nll_(static_cast<size_t>(rows) - 1), greedy_(nll_.size()), top_k_(options.top_k),
          top_ids_(nll_.size() * static_cast<size_t>(top_k_)), top_logprobs_(top_ids_.size()) {}

    // Scores tokens[0, T) as one window, positions from 0: nll(t) and greedy(t) for the prediction of token t + 1.
    void score(const int32_t *tokens, int32_t T) {
        runner_.forward(ctx_, tokens, T);
        head_nll(ctx_, runner_.model.head, runner_.activations.xn.data(), tokens, T, nll_.data(), greedy_.data(),
                 top_k_, top_ids_.data(), top_logprobs_.data());
    }
    double nll(int32_t t) const { return nll_[t]; }
    bool greedy(int32_t t) const { return greedy_[t] != 0; }
    // Copies positions [0, count) of the last window's top-k results to options' arrays from position `at` on.
    void copy_top_k(const ScoreOptions &options, size_t at, int32_t count) const {
        if (top_k_ == 0) return;
        const size_t k = static_cast<size_t>(top_k_), n = static_cast<size_t>(count) * k;
        std::copy(top_ids_.begin(), top_ids_.begin() + n, options.top_ids + at * k);
        std::copy(top_logprobs_.begin(), top_logprobs_.begin() + n, options.top_logprobs + at * k);
    }

private:
    Context ctx_;
    ModelRunner runner_;
    std::vector<double> nll_;
    std::vector<uint8_t> greedy_;
    int32_t top_k_;
    std::vector<int32_t> top_ids_;
    std::vector<float> top_logprobs_;
};

// Calls the progress callback, if any; TL_ERR_CANCELLED when it asks to stop.
void report_progress(const ScoreOptions &options, uint64_t done, uint64_t total) {
    if (options.progress && !options.progress(done, total)) {
        fail(TL_ERR_CANCELLED, "scoring cancelled by the progress callback after " + std::to_string(done) + " of " +
                                   std::to_string(total) + " tokens");
    }
}

}  // namespace

uint64_t cpu_score_bytes(const Model &model, int32_t rows, int32_t workers, bool cross_iter_round,
                         ActivationMode activations) {
    const ModelConfig &c = model.config;
    const uint64_t R = static_cast<uint64_t>(rows), D = c.d_model, A = c.attn_dim(), F = c.ffn;
    const uint64_t keys = (R + kPanel - 1) / kPanel * kPanel;
    const uint64_t head_dim_padded = (static_cast<uint64_t>(c.head_dim) + kPanel - 1) / kPanel * kPanel;
    const uint64_t QKV = static_cast<uint64_t>(c.qkv_dim());
    uint64_t floats = R * (3 * D + QKV + A + 2 * F + static_cast<uint64_t>(c.head_dim));  // Activations
    floats += static_cast<uint64_t>(c.kv_heads()) * keys * (c.head_dim + head_dim_padded);  // kv_panels
    const uint64_t k_max = std::max<uint64_t>({D, A, F});
    const uint64_t logits = std::max<uint64_t>(1u << 20, static_cast<uint64_t>(c.vocab));  // head_nll's chunk
    floats += static_cast<uint64_t>(workers) * (2 * kTileCols * k_max + std::max<uint64_t>(logits, kRows * keys));
    uint64_t bytes = floats * sizeof(float) + R * (sizeof(double) + 1);  // + the window's NLLs and greedy flags
    if (activations != ActivationMode::Fp16) {
        bytes += act_quant_bytes(rows, static_cast<int32_t>(k_max), workers, kTileCols);
    }
    if (cross_iter_round) {
        for (int32_t i = 0; i < 5; ++i) bytes += static_cast<uint64_t>(c.loops) * model.loop.linear(i)->quant_bytes();
    }
    return bytes;
}

void use_portable_cpu_kernel(bool portable) {
    g_portable_kernel.store(portable, std::memory_order_relaxed);
    use_portable_act_quant_kernel(portable);
}

ScoreResult score_cpu(const Model &model, const int32_t *tokens, size_t n_tokens, const ScoreOptions &options) {
    check_model(model, check_cpu_storage);  // a Model may be assembled by hand: checked before any pointer is followed
    const ScorePlan plan = plan_score(model.config, tokens, n_tokens, options.window);
    const int32_t L = plan.window;
    const size_t stride = static_cast<size_t>(L) - 1;
    // Sized by the tokens actually scored: a short sequence never pays for the model's max_seq.
    WindowScorer scorer(model, static_cast<int32_t>(std::min<size_t>(L, n_tokens)), options);
    ScoreResult result;
    result.n_windows = static_cast<int32_t>(plan.n_windows);
    for (size_t w = 0; w < plan.n_windows; ++w) {
        const size_t start = w * stride;
        const int32_t len = static_cast<int32_t>(std::min<size_t>(L, n_tokens - start));
        scorer.score(tokens + start, len);
        for (int32_t p = 0; p + 1 < len; ++p) {
            result.nll_sum += scorer.nll(p);
            if (options.token_nll) options.token_nll[start + p] = static_cast<float>(scorer.nll(p));
        }
        scorer.copy_top_k(options, start, len - 1);
        result.tokens_scored += static_cast<uint64_t>(len - 1);
        report_progress(options, result.tokens_scored, n_tokens - 1);
    }
    return result;
}

ScoreResult score_batch_cpu(const Model &model, const Sequence *sequences, size_t n_sequences,
                            const ScoreOptions &options, SequenceScore *scores) {
    check_model(model, check_cpu_storage);
    check_sequences(model.config, sequences, n_sequences, options.window);
    ScoreResult result;
    result.n_windows = static_cast<int32_t>(std::min<size_t>(n_sequences, INT32_MAX));
    if (n_sequences == 0) return result;
    size_t longest = 0;
    uint64_t total = 0;  // scored tokens, what progress counts
    for (size_t s = 0; s < n_sequences; ++s) {
        longest = std::max(longest, sequences[s].n_tokens);
        total += sequences[s].n_tokens - sequences[s].first_scored();
    }
    WindowScorer scorer(model, static_cast<int32_t>(longest), options);  // n_tokens <= max_seq: fits an int32_t
    size_t offset = 0;  // of the sequence's first prediction in token_nll
    for (size_t s = 0; s < n_sequences; ++s) {
        const Sequence &q = sequences[s];
        const int32_t len = static_cast<int32_t>(q.n_tokens);
        scorer.score(q.tokens, len);
        SequenceScore score;
        // Prediction p is of token p + 1: context until p + 1 reaches first_scored().
        for (int32_t p = static_cast<int32_t>(q.first_scored()) - 1; p + 1 < len; ++p) {
            score.nll_sum += scorer.nll(p);
            score.greedy = score.greedy && scorer.greedy(p);
        }
        score.tokens_scored = q.n_tokens - q.first_scored();
        if (options.token_nll) {
            for (int32_t p = 0; p + 1 < len; ++p) options.token_nll[offset + p] = static_cast<float>(scorer.nll(p));
        }
        scorer.copy_top_k(options, offset, len - 1);
        offset += q.n_tokens - 1;
        scores[s] = score;
        result.nll_sum += score.nll_sum;
        result.tokens_scored += score.tokens_scored;
        report_progress(options, result.tokens_scored, total);
    }
    return result;
}

ScoreResult compare_cpu(const Model &reference, const Model &test, const int32_t *tokens, size_t n_tokens,
                        const ScoreOptions &options, const DispatchSettings &test_dispatch,
                        const CompareOutputs &out, ActivationMode test_activations) {
    check_model(reference, check_cpu_storage);
    check_model(test, check_cpu_storage);
    check_same_vocabulary(reference, test);
    const ScorePlan plan = plan_compare(reference.config, test.config, tokens, n_tokens, options.window);
    const int32_t L = plan.window, rows = static_cast<int32_t>(std::min<size_t>(L, n_tokens));
    const size_t stride = static_cast<size_t>(L) - 1;
    Context ctx(options.n_threads);
    const bool test_cross_iter_round = test_dispatch[DispatchSetting::CrossIterRound] != 0;
    // One forward pass serves both sides when they are the same model run the same way.
    const bool one_pass = &reference == &test && test_cross_iter_round == options.cross_iter_round() &&
                          test_activations == options.activations;
    const int32_t workers = static_cast<int32_t>(ctx.pool.size());
    const uint64_t bytes =
        cpu_score_bytes(reference, rows, workers, options.cross_iter_round(), options.activations) +
        (one_pass ? 0 : cpu_score_bytes(test, rows, workers, test_cross_iter_round, test_activations));
    check_memory_budget(bytes, options.max_memory_bytes, host_memory_bytes(), "host memory");
    ModelRunner ref_runner(reference, rows, options.cross_iter_round(), options.activations);
    std::unique_ptr<ModelRunner> test_runner;
    if (!one_pass) {
        test_runner = std::make_unique<ModelRunner>(test, rows, test_cross_iter_round, test_activations);
    }
    ScoreResult result;
    result.n_windows = static_cast<int32_t>(plan.n_windows);
    for (size_t w = 0; w < plan.n_windows; ++w) {
        const size_t start = w * stride;
        const int32_t len = static_cast<int32_t>(std::min<size_t>(L, n_tokens - start));
        ref_runner.forward(ctx, tokens + start, len);
        if (test_runner) test_runner->forward(ctx, tokens + start, len);
        const ModelRunner &t = test_runner ? *test_runner : ref_runner;
        const CompareOutputs at{out.kl + start, out.nll_reference + start, out.nll_test + start,
                                out.top1_match + start};
        head_compare(ctx, reference.head, ref_runner.activations.xn.data(), test.head, t.activations.xn.data(),
                     tokens + start, len, at);
        for (int32_t p = 0; p + 1 < len; ++p) result.nll_sum += out.nll_reference[start + p];
        result.tokens_scored += static_cast<uint64_t>(len - 1);
        report_progress(options, result.tokens_scored, n_tokens - 1);
    }
    return result;
}

void rmsnorm(const float *x, const float *gain, float *y, int32_t T, int32_t d, float eps) {
    for (int32_t t = 0; t < T; ++t) {
        const float *xt = x + static_cast<size_t>(t) * d;
        float *yt = y + static_cast<size_t>(t) * d;
        float sum_sq = 0.0f;
        for (int32_t i = 0; i < d; ++i) sum_sq += xt[i] * xt[i];
        const float inv_rms = 1.0f / std::sqrt(sum_sq / static_cast<float>(d) + eps);
        for (int32_t i = 0; i < d; ++i) yt[i] = xt[i] * inv_rms * gain[i];
    }
}

void rope_inplace(float *x, int32_t T, int32_t n_heads, int32_t head_dim, float theta, int32_t pos0) {
    check_head_dim(n_heads, head_dim);
    ModelConfig plain;
    plain.head_dim = head_dim;
    plain.rope_theta = theta;
    const RopeTable table = make_rope_table(plain, T, pos0);
    apply_rope(x, static_cast<size_t>(n_heads) * head_dim, 0, T, n_heads, table);
}

void causal_attention(const float *qkv, float *out, int32_t T, int32_t n_heads, int32_t head_dim, int32_t n_threads,
                      int32_t n_kv_heads) {
    check_head_dim(n_heads, head_dim);
    if (n_kv_heads == 0) n_kv_heads = n_heads;
    if (n_kv_heads < 0 || n_heads % n_kv_heads != 0) {
        fail(TL_ERR_INVALID_ARGUMENT, "n_kv_heads = " + std::to_string(n_kv_heads) + " does not divide n_heads = " +
                                          std::to_string(n_heads));
    }
    Context ctx(n_threads);
    attention(ctx, qkv, out, T, n_heads, n_kv_heads, head_dim);
}

void linear_forward(const Linear &w, const float *x, float *y, int32_t M, int32_t n_threads,
                    ActivationMode activations) {
    Context ctx(n_threads);
    ctx.activations = activations;
    linear(ctx, w, x, y, M);
}

}  // namespace tl
