#include "quant/cross_iter.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "util/error.hpp"
#include "util/half.hpp"

namespace tl {

void add_rounding_channels(const float *w, QuantizedMatrix &m, bool frac4, bool sign_bit) {
    if (m.bits != 4) {
        fail(TL_ERR_INVALID_ARGUMENT, "frac4 and sign_bit channels describe INT4 codes; this weight has " +
                                          std::to_string(m.bits) + "-bit codes");
    }
    const size_t k = static_cast<size_t>(m.k);
    if (sign_bit && k % 8 != 0) {
        fail(TL_ERR_INVALID_ARGUMENT, "sign_bit channel needs K divisible by 8, got K = " + std::to_string(k));
    }
    if (frac4) m.frac4.assign(m.n * k / 2, 0);
    if (sign_bit) m.sign_bit.assign(m.n * k / 8, 0);
    const int32_t groups = m.k / m.group_size;
    for (size_t nn = 0; nn < static_cast<size_t>(m.n); ++nn) {
        for (size_t kk = 0; kk < k; ++kk) {
            const size_t g = nn * groups + kk / m.group_size;
            const double s = half_to_float(m.scales[g]), z = half_to_float(m.zeros[g]);
            const int q = (m.codes[nn * k / 2 + kk / 2] >> ((kk & 1) * 4)) & 0x0F;
            const double r = s == 0.0 ? 0.0 : (w[nn * k + kk] - z) / s - q;
            if (frac4) {
                const int bits = static_cast<int>(std::clamp(std::floor((r + 0.5) * 16.0), 0.0, 15.0));
                m.frac4[nn * k / 2 + kk / 2] |= static_cast<uint8_t>(bits << ((kk & 1) * 4));
            }
            if (sign_bit && r < 0.0) m.sign_bit[nn * k / 8 + kk / 8] |= static_cast<uint8_t>(1u << (kk % 8));
        }
    }
}

Linear cross_iter_linear(const Linear &w, int32_t iteration, int32_t loops) {
    if (!has_rounding_channels(w)) return w;
    if (loops <= 0 || iteration < 0 || iteration >= loops) {
        fail(TL_ERR_INVALID_ARGUMENT, "cross_iter_linear " + w.name + ": iteration " + std::to_string(iteration) +
                                          " of " + std::to_string(loops));
    }
    const size_t half_k = static_cast<size_t>(w.k) / 2;
    auto codes = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(w.n) * half_k);
    for (int32_t nn = 0; nn < w.n; ++nn) {
        for (int32_t kk = 0; kk < w.k; ++kk) {
            const size_t at = static_cast<size_t>(nn) * w.k + kk;
            const int shift = (kk & 1) * 4;
            const int32_t frac = w.frac4 ? (w.frac4[at / 2] >> shift) & 0x0F : 0;
            const bool negative = w.sign_bit && ((w.sign_bit[at / 8] >> (kk % 8)) & 1);
            const uint8_t q = code_at(w, kk, nn);
            const int32_t residual32 = cross_iter_residual32(frac, w.frac4 != nullptr, negative);
            // The phase follows the input index, so that a weight stored in another K order (k_perm) rounds alike.
            const int32_t input = w.k_perm != nullptr ? w.k_perm[kk] : kk;
            (*codes)[at / 2] |=
                static_cast<uint8_t>(cross_iter_code(q, residual32, nn, input, iteration, loops) << shift);
        }
    }
    Linear out = w;
    out.codes = codes->data();
    out.frac4 = nullptr;
    out.sign_bit = nullptr;
    // The scales and zeros still belong to w's storage, so the copy keeps that alive along with its codes.
    out.keepalive = std::make_shared<std::pair<std::shared_ptr<const void>, std::shared_ptr<std::vector<uint8_t>>>>(
        w.keepalive, codes);
    return out;
}

Block cross_iter_block(const Block &loop, int32_t iteration, int32_t loops) {
    Block b;
    b.attn_norm = loop.attn_norm;
    b.mlp_norm = loop.mlp_norm;
    for (int i = 0; i < 5; ++i) *b.linear(i) = cross_iter_linear(*loop.linear(i), iteration, loops);
    return b;
}

}  // namespace tl
