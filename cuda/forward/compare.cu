// The head's reductions beyond the NLL, over a chunk of logits rows: the comparison of two models' logits (KL
// divergence, both NLLs, top-1 agreement) and the top-k tokens of each row with their log-probabilities. One block
// per row, FP32 math on FP16 logits, like the NLL kernel (rowwise.cu); the CPU backend computes the same in double
// (cpp/score/compare.cpp).
#include <cuda_fp16.h>

#include <climits>
#include <cmath>

#include "../gpu_common.cuh"
#include "forward_kernels.hpp"
#include "reduce.cuh"

namespace tl::gpu {

namespace {

using forward::block_argmax;
using forward::block_reduce;

constexpr int kRowThreads = 256;

// ---- Two models' logits, compared --------------------------------------------------------------------------------

// Pass 1: both rows' maxima and first argmaxes. Pass 2: both sums of e^(l - max) and the reference-weighted sum of
// the differences, so that KL = sum_v p_ref (l_ref - l_test) - lse_ref + lse_test costs no third pass; it is exactly
// 0 for identical rows (every difference is 0 and both lse are computed alike).
__global__ void __launch_bounds__(kRowThreads)
    compare_kernel(const __half *reference, int ld_reference, const __half *test, int ld_test, int vocab,
                   const int32_t *targets, float *kl, float *nll_reference, float *nll_test, uint8_t *top1_match) {
    __shared__ float scratch[32];
    __shared__ int index_scratch[32];
    const __half *r = reference + static_cast<size_t>(blockIdx.x) * ld_reference;
    const __half *t = test + static_cast<size_t>(blockIdx.x) * ld_test;
    float mr = -INFINITY, mt = -INFINITY;
    int ar = INT_MAX, at = INT_MAX;
    for (int v = threadIdx.x; v < vocab; v += kRowThreads) {  // v rises: strict > keeps each thread's first maximum
        const float lr = __half2float(r[v]), lt = __half2float(t[v]);
        if (lr > mr || ar == INT_MAX) { mr = lr; ar = v; }
        if (lt > mt || at == INT_MAX) { mt = lt; at = v; }
    }
    block_argmax(mr, ar, scratch, index_scratch);
    block_argmax(mt, at, scratch, index_scratch);
    float sr = 0.0f, st = 0.0f, weighted = 0.0f;
    for (int v = threadIdx.x; v < vocab; v += kRowThreads) {
        const float lr = __half2float(r[v]), lt = __half2float(t[v]);
        const float er = expf(lr - mr);
        sr += er;
        st += expf(lt - mt);
        weighted += er * (lr - lt);
    }
    sr = block_reduce<false>(sr, scratch);
    st = block_reduce<false>(st, scratch);
    weighted = block_reduce<false>(weighted, scratch);
    if (threadIdx.x == 0) {
        const float lse_r = mr + logf(sr), lse_t = mt + logf(st);
        kl[blockIdx.x] = weighted / sr - lse_r + lse_t;
        const int target = targets[blockIdx.x];
        const bool valid = target >= 0 && target < vocab;
        nll_reference[blockIdx.x] = valid ? lse_r - __half2float(r[target]) : NAN;
        nll_test[blockIdx.x] = valid ? lse_t - __half2float(t[target]) : NAN;
        top1_match[blockIdx.x] = ar == at ? 1 : 0;
    }
}

// ---- Top-k ----------------------------------------------------------------------------------------------------

// Each thread keeps its own k best (value, id) of the columns it reads, sorted; then k block-wide argmax rounds
// each take the best head of those lists and advance the list it came from. k <= kMaxTopK keeps the lists small
// (local memory), and the row is read twice in all (the lists, then the log-sum-exp), never k times.
__global__ void __launch_bounds__(kRowThreads)
    top_k_kernel(const __half *logits, int ld, int vocab, int k, int32_t *ids, float *logprobs) {
    __shared__ float scratch[32];
    __shared__ int index_scratch[32];
    const __half *row = logits + static_cast<size_t>(blockIdx.x) * ld;
    float values[kMaxTopK];
    int indices[kMaxTopK];
    int count = 0;
    float mx = -INFINITY;
    for (int v = threadIdx.x; v < vocab; v += kRowThreads) {
        const float l = __half2float(row[v]);
        mx = fmaxf(mx, l);
        if (count == k && !(l > values[k - 1])) continue;  // ties keep the lower id already held
        int j = count < k ? count++ : k - 1;
        while (j > 0 && l > values[j - 1]) {
            values[j] = values[j - 1];
            indices[j] = indices[j - 1];
            --j;
        }
        values[j] = l;
        indices[j] = v;
    }
    mx = block_reduce<true>(mx, scratch);
    float sum = 0.0f;
    for (int v = threadIdx.x; v < vocab; v += kRowThreads) sum += expf(__half2float(row[v]) - mx);
    sum = block_reduce<false>(sum, scratch);
    const float lse = mx + logf(sum);
    int head = 0;
    for (int j = 0; j < k; ++j) {
        float best = head < count ? values[head] : -INFINITY;
        int best_id = head < count ? indices[head] : INT_MAX;
        const int mine = best_id;
        block_argmax(best, best_id, scratch, index_scratch);
        if (mine == best_id && head < count) ++head;  // ids are unique: exactly one list gave the winner
        if (threadIdx.x == 0) {
            ids[static_cast<size_t>(blockIdx.x) * k + j] = best_id;
            logprobs[static_cast<size_t>(blockIdx.x) * k + j] = best - lse;
        }
    }
}

}  // namespace

int compare_logits(const uint16_t *reference, int ld_reference, const uint16_t *test, int ld_test, int rows, int vocab,
                   const int32_t *targets, float *kl, float *nll_reference, float *nll_test, uint8_t *top1_match,
                   cudaStream_t stream) {
    if (reference == nullptr || test == nullptr || targets == nullptr || kl == nullptr || nll_reference == nullptr ||
        nll_test == nullptr || top1_match == nullptr || rows < 1 || vocab < 1 || ld_reference < vocab ||
        ld_test < vocab) {
        return kRcBadArgument;
    }
    compare_kernel<<<rows, kRowThreads, 0, stream>>>(reinterpret_cast<const __half *>(reference), ld_reference,
                                                     reinterpret_cast<const __half *>(test), ld_test, vocab, targets,
                                                     kl, nll_reference, nll_test, top1_match);
    TL_GPU_CHECK_LAUNCH();
    return 0;
}

int head_top_k(const uint16_t *logits, int ld, int rows, int vocab, int k, int32_t *ids, float *logprobs,
               cudaStream_t stream) {
    if (logits == nullptr || ids == nullptr || logprobs == nullptr || rows < 1 || vocab < 1 || ld < vocab || k < 1 ||
        k > kMaxTopK || k > vocab) {
        return kRcBadArgument;
    }
    top_k_kernel<<<rows, kRowThreads, 0, stream>>>(reinterpret_cast<const __half *>(logits), ld, vocab, k, ids,
                                                   logprobs);
    TL_GPU_CHECK_LAUNCH();
    return 0;
}

}  // namespace tl::gpu
