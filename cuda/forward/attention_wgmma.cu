// Causal multi-head attention on Hopper's warpgroup MMA (wgmma.mma_async) fed by the tensor memory accelerator
// (sm_90a only, so this file is compiled for that target alone: cuda/sources_sm90a.txt), head_dim 64 and 128, FP16.
// cuda/forward/attention.cu runs it on compute capability 9.0 and keeps the mma.sync kernel (attention_mma.cu) for
// other GPUs.
//
// A block owns one head and 128 queries and walks the key tiles of 128 keys from the diagonal down. Roles (384
// threads, one block per SM):
//  - warpgroup 0, the producer (one thread; the warpgroup gives its registers to the consumers with setmaxnreg):
//    tensor copies of Q once and of K and V per key tile, each into its own ring of stages with full barriers
//    (completed by the copies' byte count) and empty barriers (the consumers' release). Rows come in the layout the
//    tensor cores read through a descriptor: 128-byte rows (64 head dims of one key) in the 128-byte swizzle, one
//    panel of rows per 64 dims.
//  - warpgroups 1 and 2, the consumers, 64 queries each (the M of the wgmma):
//      S = Q K^T, wgmma m64n128k16 with both operands in shared memory (both K-major: dims contiguous);
//      the causal mask (the diagonal tile alone, which is the first one visited) and the online softmax in FP32,
//      each thread owning two query rows (g and g + 8 of its warp's 16), in log2 units;
//      O += P V, P rounded to FP16 in registers (the S accumulator of every 16 keys has the layout of a wgmma A
//      fragment), V the B operand read MN-major from the same swizzled rows, nothing transposed in memory.
//    Step j issues tile j's Q K^T and tile j - 1's P V together, waits for the Q K^T alone and runs tile j's softmax
//    while the P V still runs; only the rescale of O and the new P wait for it. The two consumers also take turns at
//    issuing (named barriers 1 and 2), so that one's softmax overlaps the other's products.
// The output is divided by the row sum and stored FP16, head-major, as the other kernels store it.
// Grouped-query attention and packed sequences (Segments) as in attention_mma.cu. Copies past the pass's last row
// arrive as zeros; within a packed pass the diagonal tile may hold the next sequence's rows, whose keys the mask
// removes and whose values the consumers zero before their P V (a masked probability is 0, but 0 * Inf is not).
//
// Precision: as attention_mma.cu (FP32 scores and sums, P rounded to FP16 for the P V product), and checked against
// the same bound (tests/gpu_score/kernels_test.cpp).
#include <cuda.h>  // CUtensorMap
#include <cuda_fp16.h>

#include <atomic>
#include <cmath>
#include <cuda/ptx>
#include <type_traits>

#include "../gpu_common.cuh"
#include "../tensor_map.hpp"
#include "../wgmma.cuh"
#include "attention_common.cuh"
#include "forward_kernels.hpp"
#include "segments.cuh"

namespace tl::gpu {

#if defined(TL_HAVE_SM90A)
namespace {

namespace ptx = cuda::ptx;
using attention::pack_half2;
using attention::quad_max;
using attention::quad_sum;
using attention::smem_addr;

constexpr int kConsumers = 2;
constexpr int kThreads = 128 * (kConsumers + 1);
constexpr int kConsumerThreads = 128 * kConsumers;
constexpr int kQueryTile = 64 * kConsumers;
constexpr int kKeyTile = 128;
constexpr int kKeyBlocks = kKeyTile / 8;  // n8 blocks of the S accumulator
constexpr float kLog2e = 1.4426950408889634f;
// Finite, so that exp2(m_old - m_new) is never (-inf) - (-inf) = NaN.
constexpr float kInitialMax = -1e30f;
// The producer keeps the fewest registers setmaxnreg allows; 128 x 24 + 256 x 240 fits the SM's 64K.
constexpr int kProducerRegs = 24, kConsumerRegs = 240;

static_assert(kQueryTile == kKeyTile, "the diagonal tile is the only one that needs the mask");
// K and V stages: a K stage is free once the tile's Q K^T has completed, a V stage once its P V (one step later) has.
constexpr int kStages = 2;

// Shared memory: Q [panel][kQueryTile][128 B], then kStages K tiles and kStages V tiles [panel][kKeyTile][128 B]; a
// panel holds 64 head dims. Every panel starts on a 1024-byte boundary (the swizzle repeats every 8 rows).
template <int HD>
struct WsLayout {
    static constexpr int kPanels = HD / 64;
    static constexpr int kQPanel = kQueryTile * 128;
    static constexpr int kKvPanel = kKeyTile * 128;
    static constexpr int kQBytes = kPanels * kQPanel;
    static constexpr int kKvBytes = kPanels * kKvPanel;  // one K or V tile
    static constexpr int kSmemBytes = kQBytes + 2 * kStages * kKvBytes + 1024;  // + slack to align the start
};

__device__ __forceinline__ void named_sync(int id) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kConsumerThreads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(kConsumerThreads) : "memory");
}
__device__ __forceinline__ void wait_parity(uint64_t *bar, uint32_t parity) {
    while (!ptx::mbarrier_try_wait_parity(bar, parity)) {
    }
}

// 2^x on the special-function unit alone (denormal results flushed to zero: probabilities below 2^-126 vanish in
// the FP16 P anyway, and the row sum they would join is at least 1).
__device__ __forceinline__ float exp2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

template <int R>
__device__ __forceinline__ void pin_regs(uint32_t (&r)[R][4]) {
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

// The panels of one tile (`rows` rows from `row`, head dims from `col`) into dst, completing on `bar`.
template <int HD>
__device__ __forceinline__ void copy_tile(uint8_t *dst, const CUtensorMap *map, int col, int row, uint64_t *bar,
                                          int panel_bytes) {
#pragma unroll
    for (int p = 0; p < HD / 64; ++p) {
        const int32_t coords[2] = {col + 64 * p, row};
        ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, dst + p * panel_bytes, map, coords, bar);
    }
}

template <int HD>
__global__ void __launch_bounds__(kThreads, 1)
    attention_wgmma_kernel(const __grid_constant__ CUtensorMap qkv_map, __half *__restrict__ out, int t_count,
                           const int32_t *__restrict__ seg_offsets, int n_heads, int n_kv_heads, float scale_log2) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using L = WsLayout<HD>;
    constexpr int kDimSteps = HD / 16;        // k16 steps of Q K^T
    constexpr int kKeySteps = kKeyTile / 16;  // k16 steps of P V
    constexpr int kOutBlocks = HD / 8;        // n8 blocks of the O accumulator

    extern __shared__ uint8_t smem_raw[];
    __shared__ __align__(8) uint64_t q_full, k_full[kStages], k_empty[kStages], v_full[kStages], v_empty[kStages];
    uint8_t *const q_s = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
    uint8_t *const k_s = q_s + L::kQBytes;               // stage s at k_s + s kKvBytes
    uint8_t *const v_s = k_s + kStages * L::kKvBytes;    // likewise

    const int tid = threadIdx.x, wg = tid / 128;
    // Blocks start in index order, heads fastest: every head's longest (latest) query tiles first, the shortest last.
    const int head = blockIdx.x;
    const int q_tile = gridDim.y - 1 - blockIdx.y;
    const int q0 = q_tile * kQueryTile;
    const int attn_dim = n_heads * HD, kv_dim = n_kv_heads * HD;
    const int kv_head = head / (n_heads / n_kv_heads);
    const forward::SegmentRows rows = forward::segment_rows(seg_offsets, t_count);
    const int count = rows.count;
    if (q0 >= count) return;  // the whole block: before any barrier
    const int n_tiles = q_tile + 1;

    if (tid == 0) {
        ptx::mbarrier_init(&q_full, 1);
        for (int st = 0; st < kStages; ++st) {
            ptx::mbarrier_init(&k_full[st], 1);
            ptx::mbarrier_init(&v_full[st], 1);
            ptx::mbarrier_init(&k_empty[st], kConsumerThreads);
            ptx::mbarrier_init(&v_empty[st], kConsumerThreads);
        }
        ptx::fence_proxy_async(ptx::space_shared);  // the barriers, visible to the copy engine
    }
    __syncthreads();

    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
        if (tid != 0) return;
        const int first = static_cast<int>(rows.first);
        const int k_col = attn_dim + kv_head * HD, v_col = k_col + kv_dim;
        ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, &q_full, L::kQBytes);
        copy_tile<HD>(q_s, &qkv_map, head * HD, first + q0, &q_full, L::kQPanel);
#pragma unroll 1
        for (int j = 0; j < n_tiles; ++j) {
            const int stage = j % kStages;
            const uint32_t parity = ((j / kStages) - 1) & 1;  // the stage's previous use, one round back
            const int key0 = first + (q_tile - j) * kKeyTile;
            if (j >= kStages) wait_parity(&k_empty[stage], parity);
            ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, &k_full[stage],
                                           L::kKvBytes);
            copy_tile<HD>(k_s + stage * L::kKvBytes, &qkv_map, k_col, key0, &k_full[stage], L::kKvPanel);
            if (j >= kStages) wait_parity(&v_empty[stage], parity);
            ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, &v_full[stage],
                                           L::kKvBytes);
            copy_tile<HD>(v_s + stage * L::kKvBytes, &qkv_map, v_col, key0, &v_full[stage], L::kKvPanel);
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));

    const int c = wg - 1, ct = tid - 128, warp = (tid / 32) % 4, lane = tid % 32;
    const int g = lane / 4, tq = lane % 4;  // the accumulator layout: rows g, g + 8; columns 2 tq, 2 tq + 1
    const int row0 = q0 + c * 64 + warp * 16 + g;  // the query of accumulator elements 0, 1; row0 + 8 for 2, 3
    const uint32_t q_wg = smem_addr(q_s) + c * 64 * 128;  // this warpgroup's 64 query rows in each Q panel
    const uint32_t k_base = smem_addr(k_s), v_base = smem_addr(v_s);

    float o[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; ++i) o[i] = 0.0f;
    float s[kKeyBlocks * 4];
    uint32_t p[kKeySteps][4];
    float m[2] = {kInitialMax, kInitialMax}, l[2] = {0.0f, 0.0f}, alpha[2] = {1.0f, 1.0f};
    wait_parity(&q_full, 0);

    // Consumer 0 issues first; then each issues once the other has (barrier 1 + c: "consumer c's turn").
    if (c == 1) named_arrive(1);
    // Step j: tile j's Q K^T (QK) and tile j - 1's P V (PV), known at compile time so that no wgmma sits behind a
    // run-time branch; DIAG: tile j is the diagonal one (j = 0), masked.
    auto step = [&](int j, auto pv, auto qk, auto diag) {
        constexpr bool kPv = decltype(pv)::value, kQk = decltype(qk)::value, kDiag = decltype(diag)::value;
        const int st = j % kStages, pst = (j - 1) % kStages;
        if constexpr (kQk) wait_parity(&k_full[st], (j / kStages) & 1);
        if constexpr (kPv) wait_parity(&v_full[pst], ((j - 1) / kStages) & 1);
        named_sync(1 + c);
        wgmma::fence();
        if constexpr (kQk) {  // the first step overwrites the accumulator
            const uint32_t k_st = k_base + st * L::kKvBytes;
#pragma unroll
            for (int ds = 0; ds < kDimSteps; ++ds) {
                const uint32_t in_panel = (ds % 4) * 32;  // 16 dims = 32 bytes into the panel's rows
                const uint64_t desc_q = wgmma::desc_sw128(q_wg + (ds / 4) * L::kQPanel + in_panel);
                const uint64_t desc_k = wgmma::desc_sw128(k_st + (ds / 4) * L::kKvPanel + in_panel);
                wgmma::mma_ss<Dtype::F16>(s, desc_q, desc_k, ds > 0);
            }
            wgmma::commit();
        }
        if constexpr (kPv) {  // V's step ks starts 16 keys into the stage, its panels kKvPanel bytes apart
            const uint32_t v_st = v_base + pst * L::kKvBytes;
#pragma unroll
            for (int ks = 0; ks < kKeySteps; ++ks) {
                wgmma::mma_rs<Dtype::F16, true>(o, p[ks], wgmma::desc_sw128(v_st + ks * 16 * 128, L::kKvPanel), true);
            }
            wgmma::commit();
        }
        // The other consumer's turn (consumer 1's last step has no successor).
        if (c == 0 || kQk) named_arrive(2 - c);
        if constexpr (kQk) {
            if constexpr (kPv) {
                wgmma::wait<1>();  // the Q K^T alone; the P V goes on under the softmax
            } else {
                wgmma::wait<0>();
            }
            wgmma::pin(s);
            ptx::mbarrier_arrive(&k_empty[st]);
            if constexpr (kDiag) {  // key > query is masked (this also masks every key past the sequence)
#pragma unroll
                for (int nb = 0; nb < kKeyBlocks; ++nb) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int key = q_tile * kKeyTile + nb * 8 + 2 * tq + (e & 1);
                        if (key > row0 + (e >> 1) * 8) s[4 * nb + e] = -INFINITY;
                    }
                }
            }
            // Rows r = 0 (g) and 1 (g + 8): elements 2r, 2r + 1 of every n8 block.
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                float mx = -INFINITY;
#pragma unroll
                for (int nb = 0; nb < kKeyBlocks; ++nb) {
                    mx = fmaxf(mx, fmaxf(s[4 * nb + 2 * r], s[4 * nb + 2 * r + 1]));
                }
                const float m_new = fmaxf(m[r], quad_max(mx) * scale_log2);  // scale_log2 > 0: max and scaling commute
                alpha[r] = exp2_ftz(m[r] - m_new);
                m[r] = m_new;
                float sum = 0.0f;
#pragma unroll
                for (int nb = 0; nb < kKeyBlocks; ++nb) {
#pragma unroll
                    for (int e = 2 * r; e < 2 * r + 2; ++e) {
                        s[4 * nb + e] = exp2_ftz(fmaf(s[4 * nb + e], scale_log2, -m_new));  // masked: exp2(-inf) = 0
                        sum += s[4 * nb + e];
                    }
                }
                l[r] = fmaf(l[r], alpha[r], sum);
            }
        }
        if constexpr (kPv) {
            wgmma::wait<0>();
            wgmma::pin(o);
            pin_regs(p);  // the fragments stay allocated until the tensor cores have read them
            ptx::mbarrier_arrive(&v_empty[pst]);
        }
        if constexpr (kQk) {
            // O holds the products up to tile j - 1. Once the rows' maxima have settled (most tiles of a long row),
            // no row of the warp moves: skip the rescale.
            if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
                for (int nb = 0; nb < kOutBlocks; ++nb) {
                    o[4 * nb + 0] *= alpha[0];
                    o[4 * nb + 1] *= alpha[0];
                    o[4 * nb + 2] *= alpha[1];
                    o[4 * nb + 3] *= alpha[1];
                }
            }
            // P's A fragment for 16 keys is the S accumulator of n8 blocks 2 ks and 2 ks + 1.
#pragma unroll
            for (int ks = 0; ks < kKeySteps; ++ks) {
                p[ks][0] = pack_half2(s[8 * ks + 0], s[8 * ks + 1]);
                p[ks][1] = pack_half2(s[8 * ks + 2], s[8 * ks + 3]);
                p[ks][2] = pack_half2(s[8 * ks + 4], s[8 * ks + 5]);
                p[ks][3] = pack_half2(s[8 * ks + 6], s[8 * ks + 7]);
            }
        }
    };
    using std::false_type, std::true_type;
    step(0, false_type{}, true_type{}, true_type{});
    // In a packed pass the diagonal tile may run past the sequence into the next one: zero those value rows before
    // any P V reads them (both consumers share the stage; each zeroes half of the 16-byte chunks).
    const int live_keys = count - q_tile * kKeyTile;
    if (seg_offsets != nullptr && live_keys < kKeyTile) {
        wait_parity(&v_full[0], 0);
        constexpr int kRowChunks = HD / 8;
        for (int i = ct; i < (kKeyTile - live_keys) * kRowChunks; i += kConsumerThreads) {
            const int r = live_keys + i / kRowChunks, chunk = i % kRowChunks;
            const uint32_t at =
                v_base + (chunk / 8) * L::kKvPanel + r * 128 + (((chunk % 8) ^ (r % 8)) << 4);
            asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(at), "r"(0u) : "memory");
        }
        ptx::fence_proxy_async(ptx::space_shared);  // generic-proxy stores, then tensor-core (async-proxy) reads
        named_sync(3);
    }
#pragma unroll 1
    for (int j = 1; j < n_tiles; ++j) step(j, true_type{}, true_type{}, false_type{});
    step(n_tiles, true_type{}, false_type{}, false_type{});

    __half *const out_rows = out + rows.first * static_cast<size_t>(attn_dim);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float total = quad_sum(l[r]);
        const float inv = 1.0f / total;  // total >= ~1: the row's maximum contributed exp2(0) when it was reached
        const int t = row0 + r * 8;
        if (t >= count) continue;
        __half *o_row = out_rows + static_cast<size_t>(t) * attn_dim + static_cast<size_t>(head) * HD + 2 * tq;
#pragma unroll
        for (int nb = 0; nb < kOutBlocks; ++nb) {
            *reinterpret_cast<__half2 *>(o_row + nb * 8) =
                __floats2half2_rn(o[4 * nb + 2 * r] * inv, o[4 * nb + 2 * r + 1] * inv);
        }
    }
#endif
}

// qkv [t_count][row_halves] FP16 as boxes of 64 halves x 128 rows in the 128-byte swizzle, zeros past the last row.
bool encode_qkv_map(CUtensorMap &map, const uint16_t *qkv, int t_count, int row_halves) {
    const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
    if (encode == nullptr) return false;
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(row_halves), static_cast<cuuint64_t>(t_count)};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(row_halves) * 2};
    const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(kKeyTile)};
    const cuuint32_t elem_strides[2] = {1, 1};
    return encode(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, const_cast<uint16_t *>(qkv), dims, strides, box,
                  elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                  CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <int HD>
int launch(const uint16_t *qkv, uint16_t *out, int t_count, int n_heads, int n_kv_heads, Segments segments,
           cudaStream_t stream) {
    constexpr int smem = WsLayout<HD>::kSmemBytes;
    constexpr int kMaxDevices = 64;
    static std::atomic<bool> opted_in[kMaxDevices];
    DeviceInfo info;
    if (const int rc = current_device_info(info); rc != 0) return rc;
    if (info.compute_capability != 90 || info.max_smem_optin < smem) return kRcUnsupported;
    CUtensorMap map;
    if (!encode_qkv_map(map, qkv, t_count, (n_heads + 2 * n_kv_heads) * HD)) return kRcUnsupported;
    if (!opted_in[info.device].load(std::memory_order_relaxed)) {
        TL_GPU_CHECK(cudaFuncSetAttribute(attention_wgmma_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          smem));
        opted_in[info.device].store(true, std::memory_order_relaxed);
    }
    const int longest = segments.offsets != nullptr ? segments.max_len : t_count;
    const int q_tiles = (longest + kQueryTile - 1) / kQueryTile;
    if (q_tiles > 65535) return kRcUnsupported;  // the grid's y dimension
    const dim3 grid(n_heads, q_tiles, segments.count);
    const float scale_log2 = kLog2e / sqrtf(static_cast<float>(HD));
    attention_wgmma_kernel<HD><<<grid, kThreads, smem, stream>>>(map, reinterpret_cast<__half *>(out), t_count,
                                                                 segments.offsets, n_heads, n_kv_heads, scale_log2);
    TL_GPU_CHECK_LAUNCH();
    return 0;
}

}  // namespace

bool attention_wgmma_built() { return true; }

int causal_attention_wgmma(const uint16_t *qkv, uint16_t *out, int t_count, int n_heads, int n_kv_heads, int head_dim,
                           Segments segments, cudaStream_t stream) {
    // Tensor copies from a 16-byte aligned base (the rows' stride is a multiple of 128 bytes); half2 stores.
    if ((head_dim != 64 && head_dim != 128) || !aligned16(qkv) || (reinterpret_cast<uintptr_t>(out) & 3u) != 0) {
        return kRcUnsupported;
    }
    return head_dim == 64 ? launch<64>(qkv, out, t_count, n_heads, n_kv_heads, segments, stream)
                          : launch<128>(qkv, out, t_count, n_heads, n_kv_heads, segments, stream);
}

#else  // built without sm_90a: the dispatcher uses the mma.sync kernel

bool attention_wgmma_built() { return false; }
int causal_attention_wgmma(const uint16_t *, uint16_t *, int, int, int, int, Segments, cudaStream_t) {
    return kRcUnsupported;
}

#endif

}  // namespace tl::gpu
