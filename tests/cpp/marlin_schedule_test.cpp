// The Marlin-class kernels' work sharing (cuda/marlin/marlin_schedule.hpp) on a table of shapes and grids: the TMA
// kernel's work lists cover every (tile, k slice) pair exactly once, each block finishes at most one cut tile and is
// its share_owner slot, and the reduction protocol completes without a chain: all blocks running their lists at once,
// a cut tile's finishing step waiting for all its contributions, no block waits longer than one step, whatever the
// grid's size. Pure functions: these run on every machine.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "marlin/marlin_plan.hpp"
#include "marlin/marlin_schedule.hpp"

namespace {

using tl::gpu::marlin::share_owner;
using tl::gpu::marlin::TmaWork;
using tl::gpu::marlin::tma_work;

struct Grid {
    long long tiles;
    int k_tiles, grid;
};

// Stream-K grids as the launcher sizes them (at most one block per SM, at least min(8, k_tiles) slices a block), and
// a few that cut tiles between many blocks.
const Grid kGrids[] = {{48, 32, 132},  {48, 64, 132}, {2, 128, 32},  {13, 16, 26},   {1, 1, 1},    {7, 3, 5},
                       {160, 216, 132}, {96, 2, 24},  {5, 100, 132}, {300, 64, 132}, {1, 4096, 132}};

std::string name(const Grid &g, bool whole) {
    return std::to_string(g.tiles) + " tiles x " + std::to_string(g.k_tiles) + " slices on " + std::to_string(g.grid) +
           (whole ? " blocks, whole tiles" : " blocks, stream-K");
}

TEST(MarlinSchedule, TmaWorkCoversEverySliceOnce) {
    for (const Grid &g : kGrids) {
        for (const bool whole : {false, true}) {
            SCOPED_TRACE(name(g, whole));
            std::vector<int> covered(static_cast<size_t>(g.tiles * g.k_tiles), 0);
            for (int b = 0; b < g.grid; ++b) {
                const TmaWork w = tma_work(whole, g.tiles, g.k_tiles, b, g.grid);
                long long slices = 0;
                for (int j = 0; j < w.tiles; ++j) {
                    const int t = w.tile(j), lo = w.lo(t, g.k_tiles), hi = w.hi(t, g.k_tiles);
                    ASSERT_GE(t, 0);
                    ASSERT_LT(t, g.tiles);
                    ASSERT_LE(0, lo);
                    ASSERT_LT(lo, hi);
                    ASSERT_LE(hi, g.k_tiles);
                    for (int kt = lo; kt < hi; ++kt) ++covered[static_cast<size_t>(t) * g.k_tiles + kt];
                    slices += hi - lo;
                }
                EXPECT_EQ(slices, w.slices(g.k_tiles)) << "block " << b;
            }
            for (size_t u = 0; u < covered.size(); ++u) ASSERT_EQ(covered[u], 1) << "slice " << u;
        }
    }
}

// One step of a block's list: a whole tile (no waiting), a contribution (adds, never waits) or a finish (waits until
// every other contribution to its tile is in).
struct Step {
    int tile;
    bool contributes, finishes;
};

TEST(MarlinSchedule, StreamKFinishesWithoutAChain) {
    for (const Grid &g : kGrids) {
        SCOPED_TRACE(name(g, false));
        std::vector<std::vector<Step>> lists(static_cast<size_t>(g.grid));
        std::vector<int> contributions(static_cast<size_t>(g.tiles), 0), finishers(static_cast<size_t>(g.tiles), 0);
        for (int b = 0; b < g.grid; ++b) {
            const TmaWork w = tma_work(false, g.tiles, g.k_tiles, b, g.grid);
            int finished_cut = 0;
            for (int j = 0; j < w.tiles; ++j) {
                const int t = w.tile(j), lo = w.lo(t, g.k_tiles), hi = w.hi(t, g.k_tiles);
                const bool whole = lo == 0 && hi == g.k_tiles;
                const Step s{t, !whole && hi < g.k_tiles, !whole && hi == g.k_tiles};
                if (s.contributes) ++contributions[static_cast<size_t>(t)];
                if (s.finishes) {
                    ++finishers[static_cast<size_t>(t)];
                    ++finished_cut;
                    // The kernel's workspace slot of a cut tile: the share_owner of its last slice, the finisher.
                    EXPECT_EQ(share_owner(static_cast<long long>(t) * g.k_tiles + g.k_tiles - 1, g.grid,
                                          g.tiles * g.k_tiles),
                              b);
                }
                lists[static_cast<size_t>(b)].push_back(s);
            }
            EXPECT_LE(finished_cut, 1) << "block " << b;
        }
        for (long long t = 0; t < g.tiles; ++t) {
            EXPECT_EQ(finishers[static_cast<size_t>(t)], contributions[static_cast<size_t>(t)] > 0 ? 1 : 0) << t;
        }
        // All blocks at once, one step a tick each (a step is a tile's slices: about the same time); a finish runs
        // only in a tick that starts with all its tile's contributions in. Without a chain, the blocks are done one
        // tick after the longest list at most.
        std::vector<size_t> next(lists.size(), 0);
        std::vector<int> added(static_cast<size_t>(g.tiles), 0);
        size_t longest = 0, ticks = 0;
        for (const std::vector<Step> &l : lists) longest = std::max(longest, l.size());
        for (bool progress = true; progress;) {
            progress = false;
            const std::vector<int> before = added;
            for (size_t b = 0; b < lists.size(); ++b) {
                if (next[b] == lists[b].size()) continue;
                const Step &s = lists[b][next[b]];
                const size_t t = static_cast<size_t>(s.tile);
                if (s.finishes && before[t] < contributions[t]) continue;
                if (s.contributes) ++added[t];
                ++next[b];
                progress = true;
            }
            if (progress) ++ticks;
        }
        for (size_t b = 0; b < lists.size(); ++b) EXPECT_EQ(next[b], lists[b].size()) << "block " << b << " stuck";
        EXPECT_LE(ticks, longest + 1);
    }
}

}  // namespace
