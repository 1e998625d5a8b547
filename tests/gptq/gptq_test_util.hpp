// Helpers shared by the GPTQ and cross-iteration tests: seeds, text, captured activations, and a float64
// reading of quantized storage written from docs/format.md (it does not call the library's dequantizer).
#pragma once

#include <cstdint>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "cpu/cpu_forward.hpp"
#include "util/half.hpp"
#include "format/model.hpp"
#include "quant/quant.hpp"

namespace gptq_test {

// A new seed per run (printed by the tests that use it), so the tests see fresh inputs.
inline uint64_t fresh_seed() {
    std::random_device device;
    return (static_cast<uint64_t>(device()) << 32) ^ device();
}

// The bytes of a file in the source tree as tokens (byte-level).
inline std::vector<int32_t> text_tokens(const std::string &relative_path) {
    std::ifstream in(std::string(TL_SOURCE_DIR) + "/" + relative_path, std::ios::binary);
    std::vector<int32_t> tokens;
    for (std::istreambuf_iterator<char> it(in), end; it != end; ++it) tokens.push_back(static_cast<unsigned char>(*it));
    return tokens;
}

// A small model shape with dimensions GPTQ's groups of 128 divide.
inline tl::ModelConfig small_config(int32_t group_size) {
    tl::ModelConfig c;
    c.d_model = 256;
    c.n_heads = 4;
    c.head_dim = 64;
    c.ffn = 512;
    c.vocab = 256;
    c.pre = 1;
    c.loops = 2;
    c.max_seq = 256;
    c.group_size = group_size;
    return c;
}

// The inputs one linear sees while `model` scores `tokens` (all its calls, concatenated): [rows][k].
inline std::vector<float> captured_inputs(const tl::Model &model, const std::vector<int32_t> &tokens,
                                          const std::string &linear_name) {
    std::vector<float> x;
    tl::ScoreOptions options;
    options.linear_input = [&](const tl::Linear &w, const float *in, int32_t rows) {
        if (w.name == linear_name) x.insert(x.end(), in, in + static_cast<size_t>(rows) * w.k);
    };
    tl::score_cpu(model, tokens.data(), tokens.size(), options);
    return x;
}

inline int code_of(const tl::QuantizedMatrix &m, int32_t nn, int32_t kk) {
    if (m.bits == 8) return static_cast<int8_t>(m.codes[static_cast<size_t>(nn) * m.k + kk]);
    const uint8_t byte = m.codes[static_cast<size_t>(nn) * (m.k / 2) + kk / 2];
    return (kk % 2 == 0) ? (byte & 0xF) : (byte >> 4);
}

// W[kk, nn] = q*s + z (INT8: q*s) in float64 from the FP16 s and z.
inline double value_of(const tl::QuantizedMatrix &m, int32_t nn, int32_t kk) {
    const size_t g = static_cast<size_t>(nn) * (m.k / m.group_size) + kk / m.group_size;
    const double z = m.zeros.empty() ? 0.0 : tl::half_to_float(m.zeros[g]);
    return code_of(m, nn, kk) * static_cast<double>(tl::half_to_float(m.scales[g])) + z;
}

// ||X W - X Ŵ||_F in float64, with x [rows][k] and w [n][k] (row n = output column n).
inline double output_error(const std::vector<float> &x, const float *w, const tl::QuantizedMatrix &m) {
    const size_t k = static_cast<size_t>(m.k), rows = x.size() / k;
    double sum = 0.0;
    std::vector<double> diff(k);
    for (int32_t nn = 0; nn < m.n; ++nn) {
        for (size_t kk = 0; kk < k; ++kk) diff[kk] = w[nn * k + kk] - value_of(m, nn, static_cast<int32_t>(kk));
        for (size_t t = 0; t < rows; ++t) {
            double y = 0.0;
            for (size_t kk = 0; kk < k; ++kk) y += x[t * k + kk] * diff[kk];
            sum += y * y;
        }
    }
    return std::sqrt(sum);
}

}  // namespace gptq_test
