// The rows a block of the segment-aware attention kernels works on (Segments, forward_kernels.hpp).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace tl::gpu::forward {

struct SegmentRows {
    size_t first;  // the sequence's first row in the pass
    int count;     // its rows
};

// Block z works on sequence z, rows [offsets[z], offsets[z + 1]), or on all t_count rows when offsets is nullptr.
__device__ __forceinline__ SegmentRows segment_rows(const int32_t *offsets, int t_count) {
    if (offsets == nullptr) return {0, t_count};
    const int first = offsets[blockIdx.z];
    return {static_cast<size_t>(first), offsets[blockIdx.z + 1] - first};
}

}  // namespace tl::gpu::forward
