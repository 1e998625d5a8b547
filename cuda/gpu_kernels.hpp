// Host launchers of the library's INT4 x FP16/BF16 GEMM kernels (internal; the dispatcher and the C API call these).
//
// Conventions for every launcher below:
//  - All array arguments are DEVICE pointers. FP16 and BF16 data are passed as uint16_t bits (the library's host
//    type for both), so this header needs no CUDA headers beyond the runtime's stream type. `dtype` (dtype.hpp) is
//    the type of x and y; scales and zeros are FP16 whatever it is.
//  - Work is enqueued on `stream`; nothing synchronizes. A launcher never throws, aborts or prints.
//  - The return value is an rc: 0 = enqueued; a negative kRc* value = refused before launching (bad argument or
//    unsupported shape: the caller should fall back); a positive value = the cudaError_t of a failed CUDA call.
//    cudaGetLastError() is checked after every launch.
//  - Math: Y[m, n] = sum_k X[m, k] * W[k, n]; X row-major [M, K], Y row-major [M, N], FP32 accumulation;
//    W[k, n] = q[n, k] * s[n, g] + z[n, g], g = k / group_size.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "dtype.hpp"
#include "marlin/marlin_plan.hpp"

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
                     uint16_t *y, int m, int n, int k, int group_size, Dtype dtype, cudaStream_t stream);

// ---- Marlin-class tensor-core GEMM (cuda/marlin/) -------------------------------------------------------------------
// Weights in the layout of marlin/marlin_layout.hpp (tl::marlin_pack writes it): words [N/64][K/16][32][4], scales
// (and zeros for the fused mode) [G][N] permuted. gs is the kernel's group size: 32, a multiple of 64 dividing K, or
// -1 for per-column scales (one group spanning K). Rules (else kRcUnsupported, nothing launched): K % 64 == 0, N % 64 == 0, M >= 1.
// x, y, words, scales, zeros must be 16-byte aligned.
//   fused = true:  W = q*s + z  (zeros required)
//   fused = false: W = (q - 8)*s (zeros ignored; add the correction, see marlin_gemm_corrected); FP16 alone
// BF16: the scales and zeros are rounded to BF16 in the kernels, and q*s + z is rounded to BF16 once.
// The workspace (marlin_workspace_bytes) must be zeroed once (cudaMemsetAsync) before first use; every call leaves
// it zeroed again. One workspace must not be used by two launches that can run at the same time.
size_t marlin_workspace_bytes(int sm_count);
// Runs the kernel and tile of plan_marlin (marlin/marlin_plan.hpp), or of `forced` where given (tests and the
// benchmark run each kernel and tile form that way; results differ between plans only by FP32 summation order and the
// FP16 rounding of the dequantized weights),
// with the fallbacks: a stream or wgmma launch that refuses the call (shape, shared memory, workspace; wgmma where the
// library was not built for sm_90a or the device is not compute capability 9.0) hands it to the classic kernel.
int marlin_gemm(const uint16_t *x, const uint32_t *words, const uint16_t *scales, const uint16_t *zeros, uint16_t *y,
                int m, int n, int k, int gs, bool fused, Dtype dtype, void *workspace, size_t workspace_bytes,
                cudaStream_t stream, const MarlinPlan *forced = nullptr);
// Whether the library holds the wgmma kernel (built for sm_90a); it runs only on compute capability 9.0.
bool marlin_wgmma_built();
// Successful marlin_gemm launches per kernel since the process started (tests: which kernel a path reached).
uint64_t marlin_launch_count(MarlinKernel kernel);

// ---- The seed's asymmetric correction: C += a_sum @ delta (FP16 alone) ------------------------------------------
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
                          float *a_sum, size_t a_sum_bytes, cudaStream_t stream, const MarlinPlan *forced = nullptr);

// ---- Inputs as a weight reads them -----------------------------------------------------------------------------------
// out[r][j] = c < k_in ? x[r][c] : 0 with c = index[j] (index NULL: c = j), for r < m, j < k_out: X [m][k_in] FP16 with
// its columns in a weight's stored K order (act-order) and zero from k_in on (a padded K). index (when given) holds
// k_out entries in [0, k_out), not checked here; k_out >= k_in; out must not overlap x.
int gather_columns(const uint16_t *x, int k_in, const int32_t *index, uint16_t *out, int k_out, int m,
                   cudaStream_t stream);

// ---- Large-M path: dequantize to FP16 or BF16, then cuBLAS ------------------------------------------------------
// w [N][K] = q*s + z rounded once to dtype; the file layout as in native_int4_gemm (K even).
int dequant_int4(const uint8_t *codes, const uint16_t *scales, const uint16_t *zeros, uint16_t *w, int n, int k,
                 int group_size, Dtype dtype, cudaStream_t stream);
// INT8 weights (codes int8 [N][K], scales FP16 [N][K/group_size], W = q*s): w[n][k_perm ? k_perm[kk] : kk] = q*s of
// stored column kk, rounded once to dtype, any K. k_perm (optional, device [K], a permutation: not checked here) puts
// each value at its input column, so w is W in input order. w must not overlap the inputs.
int dequant_int8(const int8_t *codes, const uint16_t *scales, const int32_t *k_perm, uint16_t *w, int n, int k,
                 int group_size, Dtype dtype, cudaStream_t stream);
// Cross-iteration rounding's channels of an INT4 weight, in the layout of its codes and padded like them.
struct RoundingChannels {
    const uint8_t *frac4 = nullptr;     // [N][K/2] nibbles (4-byte aligned), or null
    const uint8_t *sign_bit = nullptr;  // [N][K/8], bit kk % 8 of byte kk / 8, or null; one of the two is given
    const int32_t *k_perm = nullptr;    // [K]: the input column a stored column reads (act-order), or null
    int k_real = 0;      // K before padding: the rule moves columns below it
    int row_split = 0;   // > 0: rows from here on are a second weight's (gate|up), their rule counts rows from it
    int iteration = 0;   // of `loops`
    int loops = 1;
};
// dequant_int4 to FP16 with every code first replaced by the one cross-iteration rounding gives it on
// rounding.iteration (cross_iter_rule.hpp).
int dequant_int4_iteration(const uint8_t *codes, const uint16_t *scales, const uint16_t *zeros,
                           const RoundingChannels &rounding, uint16_t *w, int n, int k, int group_size,
                           cudaStream_t stream);
// ---- W8A8: per-token INT8 activations, INT8 weights with a scale per output channel ---------------------------------
// Row r of X [M][K] FP16 quantized: scales[r] = fl(max_k |x| / 127), xq[r][k] = clamp(rne(fl(x / scales[r])), ±127)
// (true divisions; a zero scale gives zero codes, a NaN or infinite x a NaN scale); sums[r] = Σ_k xq[r][k] where
// `sums` is given (the zero term of asymmetric weights). Where `group_sums` is given (grouped weights): the sums of
// each group of `group_size` codes as FP32 (exact), group_sums[g * int8_group_sums_ld(m) + r] for g < K / group_size;
// group_size a multiple of 16 dividing K (else kRcBadArgument), xq 16-byte aligned (else kRcUnsupported).
// Group-major so that a GEMM tile's rows of one group are contiguous; the stride keeps each group's row 16-byte
// aligned (a tensor copy's rule).
constexpr int int8_group_sums_ld(int m) { return (m + 3) / 4 * 4; }
int quantize_rows_int8(const uint16_t *x, int m, int k, int8_t *xq, float *scales, cudaStream_t stream,
                       int32_t *sums = nullptr, float *group_sums = nullptr, int group_size = 0);
// Y [M][N] FP16 = fp16(fl(s_x[r] · fl(s_w[c] · Σ_k xq[r][k]·w[c][k]))): X quantized by quantize_rows_int8, one cuBLAS
// INT8 GEMM into INT32 (exact), the scales applied by an epilogue kernel. w [N][K] INT8 (16-byte aligned), w_scales
// [N] FP32; K % 4 == 0 (else kRcUnsupported); `scratch` holds w8a8_scratch_bytes(m, n, k): the codes and scales of X
// and the INT32 sums.
size_t w8a8_scratch_bytes(int m, int n, int k);
int w8a8_gemm(cublasHandle_t handle, const uint16_t *x, const int8_t *w, const float *w_scales, uint16_t *y, int m,
              int n, int k, void *scratch, size_t scratch_bytes, cudaStream_t stream, void *cublas_workspace = nullptr,
              size_t cublas_workspace_bytes = 0);
// The GEMM of INT8 activations on the INT8 tensor cores (int8_gemm.cu; compute capability 9.0, built for sm_90a):
// Y [M][N] FP16 = fp16(fl(s_x[r] · fma(z[c], S[r], fl(s[c] · D)))), D = Σ_k xq[r][k]·q[c][k] exact in INT32, the
// activation-precision rule for one group per column. X as quantize_rows_int8 leaves it ([M][K] codes, scales, and
// the code sums S where zeros are given). Weights: Int8, codes [N][K] (W8A8, no zeros); Int4Packed, codes 0..15
// packed by w4a8_pack (W4A8; zeros optional). K % 16 == 0 and 16-byte aligned xq and w (else kRcUnsupported).
// Grouped INT4 weights (group_size 32, 64 or 128; Int4Packed only): the rule over the groups in order,
// acc = fma(z_g, S_g, fma(s_g, D_g, acc)) from acc = -0, Y = fp16(fl(s_x · acc)); s and z from w_groups
// (w4a8_pack_groups), S_g from x_group_sums (quantize_rows_int8's group sums, 16-byte aligned), w_scales, w_zeros and
// x_sums null. A group size other than 0, 32, 64 or 128, K not a multiple of it, or a misaligned x_group_sums:
// kRcUnsupported; missing or extra pointers: kRcBadArgument.
// The workspace is marlin_gemm's (zeroed once, left zeroed); it is needed where the tiles do not fill the GPU's waves
// (per-row weights; grouped ones run whole tiles only and need none).
enum class Int8Weights { Int8, Int4Packed };
struct Int8GemmArgs {
    const int8_t *xq = nullptr;
    const float *x_scales = nullptr;
    const int32_t *x_sums = nullptr;
    const void *w = nullptr;
    const float *w_scales = nullptr;  // [N] FP32
    const float *w_zeros = nullptr;   // [N] FP32, or null
    uint16_t *y = nullptr;
    int m = 0, n = 0, k = 0;
    int group_size = 0;                  // 0: one group per row (w_scales, w_zeros, x_sums); else 32, 64 or 128
    const float *w_groups = nullptr;     // grouped: s and z, w4a8_pack_groups's layout
    const float *x_group_sums = nullptr;  // grouped: [K / group_size][int8_group_sums_ld(M)] FP32
};
int int8_gemm(const Int8GemmArgs &args, Int8Weights weights, void *workspace, size_t workspace_bytes,
              cudaStream_t stream);
// Y = X @ W with W given as [N][K] of dtype, like x and y (cublasGemmEx, FP32 compute). Sets the handle's stream and,
// when `cublas_workspace` is not null, its workspace (cuBLAS's default one belongs to the handle, so a handle that
// moves between streams while earlier GEMMs still run must be given a workspace that no concurrent call uses).
int cublas_gemm(cublasHandle_t handle, const uint16_t *x, const uint16_t *w, uint16_t *y, int m, int n, int k,
                Dtype dtype, cudaStream_t stream, void *cublas_workspace = nullptr, size_t cublas_workspace_bytes = 0);
// dequant_int4 into `scratch` (>= N*K*2 bytes), then cublas_gemm with the workspace given.
int dequant_cublas_gemm(cublasHandle_t handle, const uint16_t *x, const uint8_t *codes, const uint16_t *scales,
                        const uint16_t *zeros, uint16_t *y, int m, int n, int k, int group_size, Dtype dtype,
                        void *scratch, size_t scratch_bytes, cudaStream_t stream, void *cublas_workspace = nullptr,
                        size_t cublas_workspace_bytes = 0);

}  // namespace tl::gpu
