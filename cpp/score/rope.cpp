#include "score/rope.hpp"

#include <algorithm>
#include <cmath>

namespace tl {

namespace {

constexpr double kPi = 3.14159265358979323846;

// transformers' find_correction_dim: the dimension whose frequency turns `rotations` times over `positions`.
double correction_dim(double rotations, int32_t dim, double theta, double positions) {
    return dim * std::log(positions / (rotations * 2.0 * kPi)) / (2.0 * std::log(theta));
}

}  // namespace

RopeFrequencies rope_frequencies(const ModelConfig &c) {
    const int32_t d = c.head_dim, half = d / 2;
    const double theta = c.rope_theta;
    const RopeScaling &r = c.rope_scaling;
    RopeFrequencies f;
    f.inv_freq.resize(static_cast<size_t>(std::max(half, 0)));
    for (int32_t i = 0; i < half; ++i) f.inv_freq[i] = std::pow(theta, -2.0 * i / d);
    switch (r.type) {
        case RopeScalingType::None:
        case RopeScalingType::Dynamic: break;
        case RopeScalingType::Linear:
            for (double &v : f.inv_freq) v /= r.factor;
            break;
        case RopeScalingType::Llama3: {
            const double context = r.original_max_positions;
            const double low_wavelength = context / r.low_freq_factor, high_wavelength = context / r.high_freq_factor;
            for (double &v : f.inv_freq) {
                const double wavelength = 2.0 * kPi / v;
                if (wavelength < high_wavelength) continue;  // high frequencies: kept
                if (wavelength > low_wavelength) {           // low frequencies: scaled
                    v /= r.factor;
                    continue;
                }
                const double smooth = (context / wavelength - r.low_freq_factor) /
                                      (r.high_freq_factor - r.low_freq_factor);
                v = (1.0 - smooth) * v / r.factor + smooth * v;
            }
            break;
        }
        case RopeScalingType::Yarn: {
            const double positions = r.original_max_positions;
            double low = correction_dim(r.beta_fast, d, theta, positions);
            double high = correction_dim(r.beta_slow, d, theta, positions);
            if (r.truncate) {
                low = std::floor(low);
                high = std::ceil(high);
            }
            low = std::max(low, 0.0);
            high = std::min(high, static_cast<double>(d - 1));
            if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp
            for (int32_t i = 0; i < half; ++i) {
                const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
                const double v = f.inv_freq[i];
                f.inv_freq[i] = v / r.factor * ramp + v * (1.0 - ramp);  // interpolated where ramp is 1
            }
            f.attention_scale = r.attention_factor;
            break;
        }
    }
    return f;
}

void rope_tables(const ModelConfig &config, int32_t T, int32_t pos0, std::vector<float> &cos_table,
                 std::vector<float> &sin_table) {
    const RopeFrequencies f = rope_frequencies(config);
    const size_t half = f.inv_freq.size();
    cos_table.resize(static_cast<size_t>(std::max(T, 0)) * half);
    sin_table.resize(cos_table.size());
    for (size_t i = 0; i < half; ++i) {
        for (int32_t t = 0; t < T; ++t) {
            const double angle = static_cast<double>(pos0 + t) * f.inv_freq[i];
            cos_table[static_cast<size_t>(t) * half + i] = static_cast<float>(f.attention_scale * std::cos(angle));
            sin_table[static_cast<size_t>(t) * half + i] = static_cast<float>(f.attention_scale * std::sin(angle));
        }
    }
}

void rope_tables(int32_t T, int32_t head_dim, float theta, std::vector<float> &cos_table,
                 std::vector<float> &sin_table) {
    ModelConfig c;
    c.head_dim = head_dim;
    c.rope_theta = theta;
    rope_tables(c, T, 0, cos_table, sin_table);
}

}  // namespace tl
