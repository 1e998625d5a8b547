// An independent float64 implementation of the model (docs/architecture.md), written with naive loops and
// double everywhere, for checking the CPU backend. It reads weights straight from a Linear's storage and
// shares no code with cpp/cpu/cpu_forward.cpp or cpp/quant/quant.cpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "util/half.hpp"
#include "format/model.hpp"

namespace ref {

// The small looped model the scoring tests draw synthetic weights for: 64 wide, 4 heads of 16, one pre block and a
// block looped twice, group 32.
inline tl::ModelConfig small_config(int32_t max_seq) {
    tl::ModelConfig c;
    c.d_model = 64;
    c.n_heads = 4;
    c.head_dim = 16;
    c.ffn = 128;
    c.vocab = 256;
    c.pre = 1;
    c.loops = 2;
    c.max_seq = max_seq;
    c.group_size = 32;
    return c;
}

using Vec = std::vector<double>;

inline double dense_value(tl::DType dtype, const void *data, size_t i) {
    switch (dtype) {
        case tl::DType::F32: return static_cast<const float *>(data)[i];
        case tl::DType::F16: return tl::half_to_float(static_cast<const uint16_t *>(data)[i]);
        case tl::DType::BF16: {
            const uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t *>(data)[i]) << 16;
            float f;
            std::memcpy(&f, &bits, sizeof f);
            return f;
        }
        default: return NAN;
    }
}

// W[kk, nn] of a Linear, as stored: quantized q*s + z, or the dense value.
inline double weight_at(const tl::Linear &w, int32_t kk, int32_t nn) {
    const size_t k = static_cast<size_t>(w.k);
    if (!w.quantized) return dense_value(w.dense_dtype, w.dense, nn * k + kk);
    const uint8_t byte = w.codes[nn * k / 2 + kk / 2];
    const int q = (kk % 2 == 0) ? (byte & 0xF) : (byte >> 4);
    const size_t g = static_cast<size_t>(nn) * (w.k / w.group_size) + kk / w.group_size;
    return q * static_cast<double>(tl::half_to_float(w.scales[g])) + tl::half_to_float(w.zeros[g]);
}

// y[m][n] = sum_k x[m][k] W[k][n] + bias[n]
inline Vec linear(const tl::Linear &w, const Vec &x, int32_t M) {
    Vec y(static_cast<size_t>(M) * w.n, 0.0);
    for (int32_t nn = 0; nn < w.n; ++nn) {
        Vec col(w.k);
        for (int32_t kk = 0; kk < w.k; ++kk) col[kk] = weight_at(w, kk, nn);
        for (int32_t m = 0; m < M; ++m) {
            double s = w.bias ? (*w.bias)[nn] : 0.0;
            for (int32_t kk = 0; kk < w.k; ++kk) s += x[static_cast<size_t>(m) * w.k + kk] * col[kk];
            y[static_cast<size_t>(m) * w.n + nn] = s;
        }
    }
    return y;
}

inline Vec rmsnorm(const Vec &x, const std::vector<float> &gain, int32_t T, int32_t d, double eps) {
    Vec y(x.size());
    for (int32_t t = 0; t < T; ++t) {
        double ms = 0.0;
        for (int32_t i = 0; i < d; ++i) ms += x[t * d + i] * x[t * d + i];
        ms /= d;
        for (int32_t i = 0; i < d; ++i) y[t * d + i] = x[t * d + i] / std::sqrt(ms + eps) * gain[i];
    }
    return y;
}

// RoPE's inverse frequency of pair i (of hd / 2) and the factor on cos and sin, written from transformers'
// modeling_rope_utils.py (_compute_*_parameters) for each rope_scaling type, in long double.
struct RopeAngles {
    std::vector<long double> inv_freq;
    long double scale = 1.0L;
};

inline RopeAngles rope_angles(const tl::ModelConfig &c) {
    const long double pi = 3.141592653589793238462643383279502884L, base = c.rope_theta;
    const int32_t dim = c.head_dim;
    const tl::RopeScaling &r = c.rope_scaling;
    RopeAngles out;
    for (int32_t j = 0; j < dim; j += 2) {  // arange(0, dim, 2) / dim
        const long double inv = 1.0L / std::pow(base, static_cast<long double>(j) / dim);
        long double v = inv;
        if (r.type == tl::RopeScalingType::Linear) v = inv / r.factor;
        if (r.type == tl::RopeScalingType::Llama3) {
            const long double old_context = r.original_max_positions;
            const long double low_freq_wavelen = old_context / r.low_freq_factor;
            const long double high_freq_wavelen = old_context / r.high_freq_factor;
            const long double wavelen = 2 * pi / inv;
            long double llama = wavelen > low_freq_wavelen ? inv / r.factor : inv;
            const long double smooth =
                (old_context / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
            const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
            if (medium) llama = (1 - smooth) * llama / r.factor + smooth * llama;
            v = llama;
        }
        if (r.type == tl::RopeScalingType::Yarn) {
            auto correction_dim = [&](long double rotations) {
                return dim * std::log(r.original_max_positions / (rotations * 2 * pi)) / (2 * std::log(base));
            };
            long double low = correction_dim(r.beta_fast), high = correction_dim(r.beta_slow);
            if (r.truncate) low = std::floor(low), high = std::ceil(high);
            low = std::max(low, 0.0L);
            high = std::min(high, static_cast<long double>(dim - 1));
            if (low == high) high += 0.001L;
            const long double ramp = std::min(std::max((j / 2 - low) / (high - low), 0.0L), 1.0L);
            const long double extrapolation_factor = 1 - ramp;
            v = inv / r.factor * (1 - extrapolation_factor) + inv * extrapolation_factor;
            out.scale = r.attention_factor;
        }
        out.inv_freq.push_back(v);
    }
    return out;
}

// x: [T][n_heads][head_dim] with row stride `stride`, starting at `offset`; rotate-half pairs (i, i + hd/2) by
// position * inv_freq[i], cos and sin times the scale.
inline void rope(Vec &x, size_t stride, size_t offset, int32_t T, int32_t n_heads, int32_t hd,
                 const RopeAngles &angles, int32_t pos0) {
    for (int32_t t = 0; t < T; ++t)
        for (int32_t h = 0; h < n_heads; ++h)
            for (int32_t i = 0; i < hd / 2; ++i) {
                const long double angle = (pos0 + t) * angles.inv_freq[i];
                const double c = static_cast<double>(angles.scale * std::cos(angle));
                const double s = static_cast<double>(angles.scale * std::sin(angle));
                double &a = x[offset + t * stride + h * hd + i];
                double &b = x[offset + t * stride + h * hd + i + hd / 2];
                const double a0 = a, b0 = b;
                a = a0 * c - b0 * s;
                b = a0 * s + b0 * c;
            }
}

// Plain RoPE (theta^(-2i/hd)).
inline void rope(Vec &x, size_t stride, size_t offset, int32_t T, int32_t n_heads, int32_t hd, double theta,
                 int32_t pos0) {
    RopeAngles angles;
    for (int32_t i = 0; i < hd / 2; ++i) {
        angles.inv_freq.push_back(std::pow(static_cast<long double>(theta), -2.0L * i / hd));
    }
    rope(x, stride, offset, T, n_heads, hd, angles, pos0);
}

// qkv [T][n_heads + 2 n_kv_heads][hd] (q heads, k heads, v heads) -> out [T][n_heads * hd], causal
// softmax(q k^T / sqrt(hd)) v per query head h, with K/V head h / (n_heads / n_kv_heads) (transformers' repeat_kv).
inline Vec attention(const Vec &qkv, int32_t T, int32_t n_heads, int32_t hd, int32_t n_kv_heads = 0) {
    if (n_kv_heads == 0) n_kv_heads = n_heads;
    const size_t A = static_cast<size_t>(n_heads) * hd, KV = static_cast<size_t>(n_kv_heads) * hd;
    const size_t row = A + 2 * KV;
    Vec out(T * A, 0.0);
    for (int32_t h = 0; h < n_heads; ++h)
        for (int32_t t = 0; t < T; ++t) {
            const size_t kh = static_cast<size_t>(h / (n_heads / n_kv_heads)) * hd;
            Vec p(t + 1);
            double mx = -INFINITY;
            for (int32_t j = 0; j <= t; ++j) {
                double s = 0.0;
                for (int32_t d = 0; d < hd; ++d) s += qkv[t * row + h * hd + d] * qkv[j * row + A + kh + d];
                p[j] = s / std::sqrt(static_cast<double>(hd));
                mx = std::max(mx, p[j]);
            }
            double sum = 0.0;
            for (double &v : p) sum += (v = std::exp(v - mx));
            for (int32_t d = 0; d < hd; ++d) {
                double o = 0.0;
                for (int32_t j = 0; j <= t; ++j) o += p[j] * qkv[j * row + A + KV + kh + d];
                out[t * A + h * hd + d] = o / sum;
            }
        }
    return out;
}

inline void block(const tl::ModelConfig &c, const tl::Block &b, Vec &x, int32_t T) {
    const int32_t D = c.d_model, A = c.attn_dim(), row = c.attn_dim() + 2 * c.kv_heads() * c.head_dim;
    Vec qkv = linear(b.attn_qkv, rmsnorm(x, b.attn_norm, T, D, c.norm_eps), T);
    const RopeAngles angles = rope_angles(c);
    rope(qkv, row, 0, T, c.n_heads, c.head_dim, angles, 0);     // q
    rope(qkv, row, A, T, c.kv_heads(), c.head_dim, angles, 0);  // k
    const Vec o = linear(b.attn_out, attention(qkv, T, c.n_heads, c.head_dim, c.kv_heads()), T);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    const Vec u = rmsnorm(x, b.mlp_norm, T, D, c.norm_eps);
    Vec g = linear(b.mlp_gate, u, T);
    const Vec up = linear(b.mlp_up, u, T);
    for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * up[i];
    const Vec down = linear(b.mlp_down, g, T);
    for (size_t i = 0; i < x.size(); ++i) x[i] += down[i];
}

// Logits [T][vocab] of one window, positions from 0.
inline Vec window_logits(const tl::Model &model, const int32_t *tokens, int32_t T) {
    const tl::ModelConfig &c = model.config;
    const int32_t D = c.d_model;
    Vec x(static_cast<size_t>(T) * D);
    for (int32_t t = 0; t < T; ++t)
        for (int32_t d = 0; d < D; ++d)
            x[t * D + d] = dense_value(model.embed_dtype, model.embed, static_cast<size_t>(tokens[t]) * D + d);
    for (const tl::Block &b : model.pre) block(c, b, x, T);
    for (int32_t l = 0; l < c.loops; ++l) block(c, model.loop, x, T);
    return linear(model.head, rmsnorm(x, model.final_norm, T, D, c.norm_eps), T);
}

// NLL of tokens[1..T) for one window, positions from 0.
inline Vec window_nll(const tl::Model &model, const int32_t *tokens, int32_t T) {
    const int32_t V = model.config.vocab;
    const Vec logits = window_logits(model, tokens, T);
    Vec nll(T - 1);
    for (int32_t t = 0; t + 1 < T; ++t) {
        const double *l = &logits[static_cast<size_t>(t) * V];
        const double mx = *std::max_element(l, l + V);
        double sum = 0.0;
        for (int32_t v = 0; v < V; ++v) sum += std::exp(l[v] - mx);
        nll[t] = mx + std::log(sum) - l[tokens[t + 1]];
    }
    return nll;
}

// Per-token NLL of a whole sequence: windows of `window` tokens overlapping by one, each token but the first
// predicted once.
inline Vec sequence_nll(const tl::Model &model, const std::vector<int32_t> &tokens, int32_t window) {
    const size_t n = tokens.size();
    Vec nll;
    for (size_t start = 0; start + 1 < n; start += window - 1) {
        const int32_t len = static_cast<int32_t>(std::min<size_t>(window, n - start));
        const Vec w = window_nll(model, tokens.data() + start, len);
        nll.insert(nll.end(), w.begin(), w.end());
    }
    return nll;
}

inline std::vector<float> random_floats(std::mt19937_64 &rng, size_t count, double stddev = 1.0) {
    std::normal_distribution<double> dist(0.0, stddev);
    std::vector<float> v(count);
    for (float &x : v) x = static_cast<float>(dist(rng));
    return v;
}

inline std::vector<int32_t> random_tokens(std::mt19937_64 &rng, size_t count, int32_t vocab) {
    std::uniform_int_distribution<int32_t> dist(0, vocab - 1);
    std::vector<int32_t> t(count);
    for (int32_t &x : t) x = dist(rng);
    return t;
}

// A seed that differs between runs (tests use fresh random inputs) and is printed so a failure can be replayed.
uint64_t fresh_seed();

}  // namespace ref
