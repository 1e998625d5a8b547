// Host launchers of the forward-pass kernels other than the linear layers (internal; cpp/gpu/gpu_forward.cpp and the
// tests call these). The GEMMs go through the dispatcher (cpp/gpu/gemm_dispatch.hpp); these kernels do the rest.
//
// Conventions, as in cuda/gpu_kernels.hpp:
//  - Array arguments are DEVICE pointers; FP16 data are passed as uint16_t bits.
//  - Work is enqueued on `stream`; nothing synchronizes. A launcher never throws, aborts or prints.
//  - Return value: 0 = enqueued; a negative kRc* value = refused before launching (bad argument, unsupported
//    shape); a positive value = the cudaError_t of a failed CUDA call. cudaGetLastError() is checked after every
//    launch.
//
// Activation precision (docs/architecture.md defines the math): the residual stream x is FP32 [T][D]; everything a
// GEMM reads or writes is FP16 (the INT4 kernels take FP16 in and out); every kernel here computes in FP32 and rounds
// once when it stores FP16.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "../gpu_kernels.hpp"

namespace tl::gpu {

// The element type of an embedding table.
enum class TableType : int { F16 = 0, BF16 = 1, F32 = 2 };

// x[t][i] = table[tokens[t]][i] as FP32 (exact), t < T, i < d. A token outside [0, vocab) gives a row of NaN
// (the host validates tokens first; the NaN makes a missed check visible).
int embed_gather(const int32_t *tokens, const void *table, TableType type, float *x, int t_count, int d, int vocab,
                 cudaStream_t stream);

// Residual add fused with the RMSNorm that follows it, one row per block:
//   if add != nullptr: x[t][i] += add[t][i]  (x is updated in place)
//   y[t][i] = fp16(x[t][i] / sqrt(mean_j(x[t][j]^2) + eps) * gain[i])
// x FP32 [T][d], add FP16 [T][d] or nullptr, gain FP32 [d], y FP16 [T][d].
int rmsnorm_residual(float *x, const uint16_t *add, const float *gain, uint16_t *y, int t_count, int d, float eps,
                     cudaStream_t stream);
// rmsnorm_residual whose FP16 rows are then quantized to INT8 by the activation-precision rule: the same bits as
// rmsnorm_residual followed by quantize_rows_int8 (gpu_kernels.hpp), into yq INT8 [T][d], scales FP32 [T] and, where
// given, sums INT32 [T] and group sums (as quantize_rows_int8's). y (FP16) is written too where given, else not kept.
int rmsnorm_residual_int8(float *x, const uint16_t *add, const float *gain, uint16_t *y, int8_t *yq, float *scales,
                          int32_t *sums, int t_count, int d, float eps, cudaStream_t stream,
                          float *group_sums = nullptr, int group_size = 0);

// Rotate-half RoPE in place on the q and k parts of qkv [T][n_heads + 2 n_kv_heads][head_dim] (FP16: n_heads query
// heads, then n_kv_heads key and n_kv_heads value heads; v is left alone): for i < head_dim/2 the pair (x[i],
// x[i + head_dim/2]) of every q and k head of row t is rotated by the angle whose cosine and sine are cos_table[p][i],
// sin_table[p][i] (FP32 [positions][head_dim/2]), where p = positions[t] (INT32 [T], each row's position inside its
// own sequence) or p = t when positions is nullptr. n_kv_heads 0 means n_heads ([T][3][n_heads][head_dim]).
int rope_qk(uint16_t *qkv, const float *cos_table, const float *sin_table, int t_count, int n_heads, int head_dim,
            cudaStream_t stream, const int32_t *positions = nullptr, int n_kv_heads = 0);

// Independent sequences packed one after another in the rows of one pass: sequence s is rows [offsets[s],
// offsets[s + 1]) (offsets: a DEVICE array of count + 1 increasing values, offsets[0] = 0, offsets[count] = T), at
// most max_len rows each. The default (offsets nullptr) is one sequence of all T rows.
struct Segments {
    const int32_t *offsets = nullptr;
    int count = 1;
    int max_len = 0;  // ignored when offsets is nullptr
};
constexpr int kMaxSegments = 65535;  // the grid's z dimension

// Causal multi-head attention: qkv [T][n_heads + 2 n_kv_heads][head_dim] FP16 (the query heads, then the key and the
// value heads; q and k after RoPE) -> out [T][n_heads * head_dim] FP16, head-major; query head h reads K/V head
// h / (n_heads / n_kv_heads) where it lies (grouped-query attention, nothing copied; n_kv_heads must divide n_heads,
// 0 means n_heads). With `segments`, each row attends to the rows of its own sequence up to itself only.
// Tiled with an online softmax in FP32 (no T x T matrix in memory). head_dim even and <= kAttentionMaxHeadDim (else
// kRcUnsupported). Any T >= 1; segments.count <= kMaxSegments. Three kernels:
//  - Wgmma (attention_wgmma.cu, compute capability 9.0, built for sm_90a): warpgroup MMA, 128 queries x 128 keys per
//    step, probabilities rounded to FP16 for the P V product; head_dim 64 or 128, qkv 16-byte aligned, out 4-byte
//    aligned.
//  - TensorCore (attention_mma.cu): mma.sync, 64 queries x 64 keys per step, the same rounding and requirements.
//  - Simt (attention.cu): FP32 FMA throughout, 32 x 32 tiles; any head_dim, qkv and out 4-byte aligned.
// Auto picks the first that applies of Wgmma (for sequences longer than 64 rows), TensorCore, Simt (the dispatcher
// setting Attention asks for one, for A/B runs). Asking for Wgmma or TensorCore where it does not apply returns kRcUnsupported.
constexpr int kAttentionMaxHeadDim = 256;
enum class AttentionKernel : int { Auto = 0, Simt = 1, TensorCore = 2, Wgmma = 3 };
// Whether the library holds the sm_90a attention kernel (it runs on compute capability 9.0 alone).
bool attention_wgmma_built();
int causal_attention(const uint16_t *qkv, uint16_t *out, int t_count, int n_heads, int head_dim,
                     cudaStream_t stream, AttentionKernel kernel = AttentionKernel::Auto, Segments segments = {},
                     int n_kv_heads = 0);

// A linear's bias, after its GEMM: y[t][j] = fp16(y[t][j] + bias[j]) for t < rows, j < n. y FP16 [rows][n], bias
// FP32 [n].
int add_bias(uint16_t *y, const float *bias, int rows, int n, cudaStream_t stream);

// SwiGLU: h[t][j] = fp16(silu(gate[t][j]) * up[t][j]), j < f, silu(g) = g / (1 + e^-g). gate and up are FP16 rows
// of stride ld (ld = 2f with gate = gu, up = gu + f for the fused gate|up GEMM output), h is FP16 [T][f].
int swiglu(const uint16_t *gate, const uint16_t *up, int ld, uint16_t *h, int t_count, int f, cudaStream_t stream);
// swiglu's rows quantized to INT8 by the activation-precision rule instead of stored: the same bits as swiglu followed
// by quantize_rows_int8, into hq INT8 [T][f], scales FP32 [T] and, where given, sums INT32 [T] and group sums (as
// quantize_rows_int8's).
int swiglu_int8(const uint16_t *gate, const uint16_t *up, int ld, int8_t *hq, float *scales, int32_t *sums,
                int t_count, int f, cudaStream_t stream, float *group_sums = nullptr, int group_size = 0);

// NLL of each row of a chunk of logits: nll[r] = logsumexp_{v < vocab}(logits[r][v]) - logits[r][targets[r]],
// FP32 with the row maximum subtracted. logits FP16 [rows][ld], ld >= vocab (columns vocab..ld-1, the head's
// padding, are ignored). A target outside [0, vocab) gives NaN (the scorer marks rows it does not score with -1).
// greedy (optional, [rows]): 1 when the target's logit equals the row's largest (a tie counts), else 0.
int head_nll(const uint16_t *logits, int ld, int rows, int vocab, const int32_t *targets, float *nll,
             cudaStream_t stream, uint8_t *greedy = nullptr);

// Compares two models' logits chunks row by row (row r of each predicts the same token): kl[r] = KL(P_ref || P_test)
// = sum_v p_ref(v) (l_ref(v) - l_test(v)) - lse_ref + lse_test (exactly 0 for identical rows), nll_reference[r] and
// nll_test[r] the NLLs of targets[r] (NaN for a target outside [0, vocab), as head_nll), top1_match[r] = 1 when the
// rows' first argmaxes are the same column. reference FP16 [rows][ld_reference], test FP16 [rows][ld_test], both
// ld >= vocab (padding columns ignored); FP32 math, one block per row.
int compare_logits(const uint16_t *reference, int ld_reference, const uint16_t *test, int ld_test, int rows, int vocab,
                   const int32_t *targets, float *kl, float *nll_reference, float *nll_test, uint8_t *top1_match,
                   cudaStream_t stream);

// The k most likely columns of each logits row (largest first, ties to the lower column) into ids[r * k + j] and
// their log-probabilities l - logsumexp(l) into logprobs[r * k + j]. logits FP16 [rows][ld], ld >= vocab;
// 1 <= k <= min(kMaxTopK, vocab), else kRcBadArgument.
constexpr int kMaxTopK = 20;
int head_top_k(const uint16_t *logits, int ld, int rows, int vocab, int k, int32_t *ids, float *logprobs,
               cudaStream_t stream);

}  // namespace tl::gpu
