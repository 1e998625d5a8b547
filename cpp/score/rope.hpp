// RoPE's angles from the model config, computed once on the host for both backends: the per-dimension inverse
// frequencies (plain theta^(-2i/head_dim), or scaled as the config's rope_scaling says: linear, dynamic, llama3,
// yarn) and the factor on cos and sin (yarn's attention factor). The CPU backend and the GPU's tables both come from
// rope_tables, so the backends rotate alike (docs/architecture.md, "The forward pass").
#pragma once

#include <cstdint>
#include <vector>

#include "format/model.hpp"

namespace tl {

struct RopeFrequencies {
    std::vector<double> inv_freq;  // [head_dim / 2]: pair i of a head turns by position * inv_freq[i]
    double attention_scale = 1.0;  // multiplies cos and sin, hence q.k by its square (yarn), else 1
};

// The formulas are transformers' (modeling_rope_utils.py), in double:
//   plain    inv[i] = theta^(-2i/d), d = head_dim
//   linear   inv[i] / factor
//   dynamic  plain (validate_config keeps max_seq within original_max_positions, where dynamic NTK is plain RoPE)
//   llama3   wavelength w = 2 pi / inv[i]; w < L / high_freq_factor: inv[i]; w > L / low_freq_factor:
//            inv[i] / factor; between: (1 - s) inv[i] / factor + s inv[i], s = (L / w - low) / (high - low), with
//            L = original_max_positions
//   yarn     correction range [lo, hi] from dim(r) = d ln(L / (2 pi r)) / (2 ln theta) at r = beta_fast, beta_slow
//            (floor / ceil when truncate, then clamped to [0, d - 1]); ramp(i) = clamp((i - lo) / (hi - lo), 0, 1)
//            (hi += 0.001 when equal); inv[i] = inv[i] / factor * ramp(i) + inv[i] * (1 - ramp(i));
//            attention_scale = attention_factor
RopeFrequencies rope_frequencies(const ModelConfig &config);

// cos and sin of position p's angles for p in [pos0, pos0 + T): [T][head_dim / 2] row-major, each times
// attention_scale, computed in double and rounded to float once.
void rope_tables(const ModelConfig &config, int32_t T, int32_t pos0, std::vector<float> &cos_table,
                 std::vector<float> &sin_table);

// Plain RoPE's tables (no scaling), positions from 0.
void rope_tables(int32_t T, int32_t head_dim, float theta, std::vector<float> &cos_table,
                 std::vector<float> &sin_table);

}  // namespace tl
