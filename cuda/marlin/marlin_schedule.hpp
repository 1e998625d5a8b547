// How the Marlin-class kernels share their work between blocks (or warps): stream-K's equal shares of all (tile, k
// slice) pairs, and the TMA kernel's per-block work list. Pure functions, host and device (no CUDA headers), so that
// tests/cpp/marlin_schedule_test.cpp checks the properties the kernels rely on: every slice done once, one cut tile
// finished per block, and no finisher waiting on a chain of blocks.
#pragma once

#include <cstdint>

#include "../host_device.hpp"

namespace tl::gpu::marlin {

// Stream-K: of `parts` equal shares [w T / parts, (w + 1) T / parts) of T slices, the one holding slice u.
TL_HOST_DEVICE inline long long share_owner(long long u, long long parts, long long total) {
    return ((u + 1) * parts - 1) / total;
}

// The TMA kernel's work for one block: `tiles` tiles, tile(j) for j = 0, 1, ..., each its k slices [lo, hi). Whole
// tiles: block b takes tiles b, b + grid, ..., all slices. Stream-K: the range [begin, end) of all (tile, k slice)
// pairs, last tile first; its first tile may lack its head (this block then finishes it: it waits for the others'
// sums) and its last its tail (this block contributes to it). Why last first: a block then adds to the cut tile at its
// range's end before it waits, at its range's start, for the blocks before it; in range order each finisher would
// wait for a chain of all the blocks before it.
struct TmaWork {
    long long begin = 0, end = 0;  // stream-K's range (whole tiles: unused)
    int first_tile = 0, tiles = 0, step = 1;
    bool whole = false;

    TL_HOST_DEVICE int tile(int j) const { return whole ? first_tile + j * step : first_tile + tiles - 1 - j; }
    TL_HOST_DEVICE int lo(int tile, int k_tiles) const {
        const long long t0 = static_cast<long long>(tile) * k_tiles;
        return whole || begin <= t0 ? 0 : static_cast<int>(begin - t0);
    }
    TL_HOST_DEVICE int hi(int tile, int k_tiles) const {
        const long long t1 = static_cast<long long>(tile + 1) * k_tiles;
        return whole || end >= t1 ? k_tiles : static_cast<int>(end - t1 + k_tiles);
    }
    // The k slices of the whole list.
    TL_HOST_DEVICE long long slices(int k_tiles) const {
        return whole ? static_cast<long long>(tiles) * k_tiles : end - begin;
    }
};

// Block `block` of `grid`: `total_tiles` tiles of `k_tiles` slices each.
TL_HOST_DEVICE inline TmaWork tma_work(bool whole, long long total_tiles, int k_tiles, int block, int grid) {
    TmaWork w;
    w.whole = whole;
    if (whole) {
        w.first_tile = block;
        w.tiles = static_cast<int>((total_tiles - block + grid - 1) / grid);
        w.step = grid;
    } else {
        const long long total = total_tiles * k_tiles;
        w.begin = static_cast<long long>(block) * total / grid;
        w.end = (static_cast<long long>(block) + 1) * total / grid;
        w.first_tile = static_cast<int>(w.begin / k_tiles);
        w.tiles = w.end > w.begin ? static_cast<int>((w.end - 1) / k_tiles) - w.first_tile + 1 : 0;
        w.step = 1;
    }
    return w;
}

}  // namespace tl::gpu::marlin
