// Host launchers of the library's INT4 x FP16 GEMM kernels (internal; the dispatcher and the C API call these).
//
// Conventions for every launcher below:
//  - All array arguments are DEVICE pointers. FP16 data are passed as uint16_t bits (the library's host type for
//    FP16), so this header needs no CUDA headers beyond the runtime's stream type.
//  - Work is enqueued on `stream`; nothing synchronizes. A launcher never throws, aborts or prints.
//  - The return value is an rc: 0 = enqueued; a negative kRc* value = refused before launching (bad argument or
//    unsupported shape: the caller should fall back); a positive value = the cudaError_t of a failed CUDA call.
//    cudaGetLastError() is checked after every launch.
//  - Math: Y[m, n] = sum_k X[m, k] * W[k, n]; X row-major [M, K], Y row-major [M, N], FP16 in and out, FP32
//    accumulation; W[k, n] = q[n, k] * s[n, g] + z[n, g], g = k / group_size.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

typedef struct cublasContext *cublasHandle_t;

namespace tl::gpu {

constexpr int kRcBadArgument = -1;   // null pointer, misaligned pointer, M/N/K/group size out of range
constexpr int kRcUnsupported = -2;   // valid request this kernel does not handle (shape rules, device)
constexpr int kRcWorkspace = -3;     // the workspace or scratch is too small / could not be allocated
constexpr int kRcCublas = -4;        // a cuBLAS call failed

// ---- Native INT4 GEMM: one thread per output (the seed's design). The always-available fallback. -----------------
// File layout: codes [N][ceil(K/2)] (low nibble = even k), scales/zeros [N][G] FP16, G = ceil(K / group_size).
// Any M, N, K >= 1 and group_size >= 1 (pass K for per-row quantization).
int native_int4_gemm(const uint16_t *x, const uint8_t *codes, const uint16_t *scales, const uint16_t *zeros,
                     uint16_t *y, int m, int n, int k, int group_size, cudaStream_t stream);

// ---- Marlin-class tensor-core GEMM (cuda/marlin/) -------------------------------------------------------------------
// Weights packed by tl::marlin_pack (cpp/gpu/marlin_pack.hpp): words [N/64][K/16][32][4], scales (and zeros for the
// fused mode) [G][N] permuted. gs is the kernel's group size: 32, a multiple of 64 dividing K, or -1 for per-column
// scales (one group spanning K). Rules (else kRcUnsupported, nothing launched): K % 64 == 0, N % 64 == 0, M >= 1.
// x, y, words, scales, zeros must be 16-byte aligned.
//   fused = true:  W = q*s + z  (zeros required)
//   fused = false: W = (q - 8)*s (zeros ignored; add the correction, see marlin_gemm_corrected)
// The workspace (marlin_workspace_bytes) must be zeroed once (cudaMemsetAsync) before first use; every call leaves
// it zeroed again. One workspace must not be used by two launches that can run at the same time.
size_t marlin_workspace_bytes(int sm_count);
// Tuning knob (benchmarks, A/B tests): resident blocks per SM for M <= 16, 2 (default) or 1 (then a deeper ring);
// the stream kernel honours it for M <= 8 and runs 9 <= M <= 16 at one block per SM. Process-wide; results do not
// depend on it.
void marlin_set_max_blocks_per_sm(int blocks);
int marlin_gemm(const uint16_t *x, const uint32_t *words, const uint16_t *scales, const uint16_t *zeros, uint16_t *y,
                int m, int n, int k, int gs, bool fused, void *workspace, size_t workspace_bytes, cudaStream_t stream);
// Which kernel marlin_gemm runs for M rows: Skinny (M <= 16), Medium (16 < M <= the medium bound, default
// kMarlinMediumMaxM), Wide (above: 32/64-row tiles, the first-generation mainloop). Wgmma (M >= the wgmma bound of
// the weight, marlin_wgmma_min_m_for, at least 17) takes precedence where it runs: a library built for sm_90a on a
// device of compute capability 9.0; elsewhere it refuses and the kernel for M above runs.
// Stream (M <= 16, K % 128 == 0, group size 32, 64 or a multiple of 128 / per column) takes precedence over Skinny
// unless turned off with marlin_set_stream_slices_per_warp(-1).
enum class MarlinKernel : int { Skinny = 0, Medium = 1, Wide = 2, Wgmma = 3, Stream = 4 };
constexpr int kMarlinMediumMaxM = 64;
constexpr int kMarlinWgmmaMinM = 33;
// Weights of at most this many elements (K * N: Llama-8B qkv and every layer of the 2B model) take the wgmma kernel
// from 17 rows: there (its 64-row tile on two warpgroups) it beat the medium kernel by 7-19% at M = 17-32 on four of
// those five layers and lost 4-5% on the fifth at 17-24 rows, while on larger weights the medium kernel wins below
// 33 rows (measured on the H200).
constexpr long long kMarlinWgmmaSmallKN = 1LL << 25;
MarlinKernel marlin_kernel_for(int m);
// The smallest M that tries the wgmma kernel for a K x N weight: the bound of marlin_set_wgmma_min_m, lowered to 17
// for a weight of at most kMarlinWgmmaSmallKN elements unless the bound is 2^31 - 1 (never).
int marlin_wgmma_min_m_for(int k, int n);
// Tuning knob (benchmarks, A/B tests): the largest M that runs the medium kernel, clamped to [16, 64] (16: never).
// Process-wide; results do not depend on it beyond FP32 summation order.
void marlin_set_medium_max_m(int m);
// Tuning knob: the smallest M that tries the wgmma kernel, clamped to [17, 2^31 - 1] (the largest value: never).
// Process-wide; results do not depend on it beyond FP32 summation order and FP16 rounding of the weights.
void marlin_set_wgmma_min_m(int m);
// Tuning knob: up to M = 64 the wgmma kernel runs a weight of at most this many elements (K * N) on two warpgroups
// per 64-row tile (one block per SM), larger ones on one warpgroup (two blocks per SM); 0 = never split. Process-wide;
// results do not depend on it beyond FP32 summation order.
void marlin_set_wgmma_split_max_kn(long long kn);
constexpr long long kMarlinWgmmaSplitMaxKN = 1LL << 26;  // the default: up to the Llama-8B down layer (58.7M)
// Tuning knob: above 64 rows the wgmma kernel runs warp-specialized (a third warpgroup copies, the tile's two only
// compute; default), or with every warp copying and computing (false: the A/B form). Process-wide; results do not
// depend on it.
void marlin_set_wgmma_producer(bool on);
// Tuning knob: how the M <= 16 stream kernel spreads its 128-deep slices: 0 = over every warp slot of the GPU
// (default), n >= 1 = at least n slices per warp (fewer warps), -1 = never use the stream kernel (the skinny kernel
// runs). Process-wide; results do not depend on it beyond FP32 summation order.
void marlin_set_stream_slices_per_warp(int slices);
// Tuning knob: the stream kernel's ring depth per warp (stages of 128 k in flight + 1): 0 = as deep as shared memory
// allows (default), n >= 2 = at most n. Process-wide; results do not depend on it.
void marlin_set_stream_stages(int stages);
// Whether the library holds the wgmma kernel (built for sm_90a); it runs only on compute capability 9.0.
bool marlin_wgmma_built();
// Successful marlin_gemm launches per kernel since the process started (tests: which kernel a path reached).
uint64_t marlin_launch_count(MarlinKernel kernel);

// ---- The seed's asymmetric correction: C += a_sum @ delta ----------------------------------------------------------
// a_sum[m, g] = sum of A[m, k] over k in group g (FP32, accumulated in FP64 so it is the correctly rounded sum).
// G = K / group_size; group_size must divide K.
int a_group_sum(const uint16_t *a, float *a_sum, int m, int k, int group_size, cudaStream_t stream);
// C[m, n] = fp16(C[m, n] + sum_g a_sum[m, g] * delta[g, n]); delta [G][N] FP32 (MarlinPacked::delta).
int correction_accum(uint16_t *c, const float *a_sum, const float *delta, int m, int n, int groups,
                     cudaStream_t stream);
// Bytes of the FP32 group sums [m][K / group size] that marlin_gemm_corrected needs as `a_sum` (gs == -1: one group).
size_t correction_scratch_bytes(int m, int k, int gs);
// The seed's wrapper: zero C (so a failed GEMM never leaves stale data), symmetric Marlin-class GEMM, a_group_sum
// into the caller's `a_sum` scratch (>= correction_scratch_bytes), correction_accum. Returns the GEMM's rc (then the
// others'); kRcWorkspace when the scratch is missing or short.
int marlin_gemm_corrected(const uint16_t *x, const uint32_t *words, const uint16_t *scales, const float *delta,
                          uint16_t *y, int m, int n, int k, int gs, void *workspace, size_t workspace_bytes,
                          float *a_sum, size_t a_sum_bytes, cudaStream_t stream);

// ---- Act-order inputs -----------------------------------------------------------------------------------------------
// out[r][j] = x[r][perm[j]] for r < m, j < k: X [m][k] FP16 with its columns in a weight's stored K order. perm is a
// permutation of [0, k) (not checked here); out must not overlap x.
int permute_columns(const uint16_t *x, const int32_t *perm, uint16_t *out, int m, int k, cudaStream_t stream);

// ---- Large-M path: dequantize to FP16, then cuBLAS ---------------------------------------------------------------
// w_fp16 [N][K] = q*s + z rounded once to FP16; the file layout as in native_int4_gemm (K even).
int dequant_int4_fp16(const uint8_t *codes, const uint16_t *scales, const uint16_t *zeros, uint16_t *w_fp16, int n,
                      int k, int group_size, cudaStream_t stream);
// Y = X @ W with W given as FP16 [N][K] (cublasGemmEx, FP16 in, FP32 compute). Sets the handle's stream and, when
// `cublas_workspace` is not null, its workspace (cuBLAS's default one belongs to the handle, so a handle that moves
// between streams while earlier GEMMs still run must be given a workspace that no concurrent call uses).
int cublas_gemm_fp16(cublasHandle_t handle, const uint16_t *x, const uint16_t *w_fp16, uint16_t *y, int m, int n,
                     int k, cudaStream_t stream, void *cublas_workspace = nullptr, size_t cublas_workspace_bytes = 0);
// dequant_int4_fp16 into `scratch` (>= N*K*2 bytes), then cublas_gemm_fp16 with the workspace given.
int dequant_cublas_gemm(cublasHandle_t handle, const uint16_t *x, const uint8_t *codes, const uint16_t *scales,
                        const uint16_t *zeros, uint16_t *y, int m, int n, int k, int group_size, void *scratch,
                        size_t scratch_bytes, cudaStream_t stream, void *cublas_workspace = nullptr,
                        size_t cublas_workspace_bytes = 0);

}  // namespace tl::gpu
