#include "gpu/marlin_pack.hpp"

#include <cmath>

#include "util/error.hpp"
#include "util/half.hpp"

namespace tl {

MarlinNibble marlin_code_position(int32_t k, int32_t n, int32_t kk, int32_t nn) {
    (void)n;
    const int32_t strip = nn / 64, col = nn % 64;
    const int32_t tile8 = col / 8;                  // n8 tile within the strip, 0..7
    const int32_t lane = (col % 8) * 4 + (kk % 8) / 2;
    const int32_t word = tile8 / 2;
    const int32_t nibble = (tile8 & 1) + 2 * ((kk % 16) / 8) + 4 * (kk & 1);
    const size_t cell = static_cast<size_t>(strip) * (k / 16) + kk / 16;
    return {(cell * 32 + lane) * 4 + word, 4 * nibble};
}

size_t marlin_scale_position(int32_t n, int32_t g, int32_t nn) {
    const int32_t col = nn % 64;
    return static_cast<size_t>(g) * n + (nn - col) + 8 * (col % 8) + col / 8;
}

size_t MarlinPacked::device_bytes() const {
    return words.size() * sizeof(uint32_t) + scales.size() * sizeof(uint16_t) + zeros.size() * sizeof(uint16_t) +
           delta.size() * sizeof(float);
}

MarlinPacked marlin_pack(const uint8_t *codes, const uint16_t *scales, const uint16_t *zeros, int32_t k, int32_t n,
                         int32_t group_size, MarlinMode mode) {
    if (const char *why = marlin_shape_error(k, n, group_size)) {
        fail(TL_ERR_INVALID_ARGUMENT, "marlin_pack: K = " + std::to_string(k) + ", N = " + std::to_string(n) +
                                          ", group size " + std::to_string(group_size) + ": " + why);
    }
    if (codes == nullptr || scales == nullptr || zeros == nullptr) {
        fail(TL_ERR_INVALID_ARGUMENT, "marlin_pack: codes, scales or zeros is NULL");
    }
    MarlinPacked p;
    p.mode = mode;
    p.k = k;
    p.n = n;
    p.group_size = group_size;
    const int32_t groups = k / group_size;
    p.words.assign(static_cast<size_t>(k) * n / 8, 0u);
    p.scales.resize(static_cast<size_t>(groups) * n);
    if (mode == MarlinMode::Fused) {
        p.zeros.resize(static_cast<size_t>(groups) * n);
    } else {
        p.delta.resize(static_cast<size_t>(groups) * n);
    }

    for (int32_t nn = 0; nn < n; ++nn) {
        for (int32_t g = 0; g < groups; ++g) {
            const size_t src = static_cast<size_t>(nn) * groups + g;
            const size_t dst = marlin_scale_position(n, g, nn);
            p.scales[dst] = scales[src];
            if (mode == MarlinMode::Fused) {
                p.zeros[dst] = zeros[src];
            } else {
                const double s = half_to_float(scales[src]), z = half_to_float(zeros[src]);
                p.delta[static_cast<size_t>(g) * n + nn] = static_cast<float>(z + 8.0 * s);
            }
        }
    }

    // Symmetric form: the seed's packer rebuilt w_sym = (q - 8)s and re-derived code = round(w_sym / s) + 8. (q - 8)s
    // is exact in FP32, so this gives q back; a zero-scale group (W = z) gets the code of 0, i.e. 8. Evaluated once
    // per (column, group) and code value, then applied to a copy of the codes.
    const size_t row_bytes = static_cast<size_t>(k) / 2;
    std::vector<uint8_t> rederived;
    if (mode == MarlinMode::Symmetric) {
        rederived.assign(codes, codes + static_cast<size_t>(n) * row_bytes);
        for (int32_t nn = 0; nn < n; ++nn) {
            for (int32_t g = 0; g < groups; ++g) {
                const float s = half_to_float(scales[static_cast<size_t>(nn) * groups + g]);
                uint8_t map[16];
                for (int q = 0; q < 16; ++q) {
                    const float w_sym = (static_cast<float>(q) - 8.0f) * s;
                    map[q] = s == 0.0f ? uint8_t{8}
                                       : static_cast<uint8_t>(
                                             std::fmin(std::fmax(std::nearbyint(w_sym / s), -8.0f), 7.0f) + 8.0f);
                }
                uint8_t *bytes = rederived.data() + static_cast<size_t>(nn) * row_bytes + g * (group_size / 2);
                for (int32_t i = 0; i < group_size / 2; ++i) {
                    bytes[i] = static_cast<uint8_t>(map[bytes[i] & 0x0F] | (map[bytes[i] >> 4] << 4));
                }
            }
        }
        codes = rederived.data();
    }

    // Codes: walk the packed words in order. Word w of lane L (t = L % 4) in cell (strip, kb) takes columns
    // c0 = 64 strip + 16w + L/4 and c1 = c0 + 8, rows 16 kb + 2t + {0, 1} and + 8: four source bytes, whose low
    // nibbles (even k) fill nibbles 0-3 and high nibbles (odd k) nibbles 4-7 (see the header's formula).
    uint32_t *out = p.words.data();
    for (int32_t strip = 0; strip < n / 64; ++strip) {
        for (int32_t kb = 0; kb < k / 16; ++kb) {
            for (int32_t lane = 0; lane < 32; ++lane) {
                const size_t byte0 = static_cast<size_t>(kb) * 8 + lane % 4;
                for (int32_t word = 0; word < 4; ++word, ++out) {
                    const uint8_t *col0 = codes + static_cast<size_t>(strip * 64 + 16 * word + lane / 4) * row_bytes;
                    const uint8_t *col1 = col0 + 8 * row_bytes;
                    const uint32_t b[4] = {col0[byte0], col1[byte0], col0[byte0 + 4], col1[byte0 + 4]};
                    uint32_t packed = 0;
                    for (int32_t i = 0; i < 4; ++i) packed |= (b[i] & 0x0Fu) << (4 * i) | (b[i] >> 4) << (4 * i + 16);
                    *out = packed;
                }
            }
        }
    }
    return p;
}

MarlinPacked marlin_pack(const Linear &w, MarlinMode mode) {
    if (!w.quantized || w.bits != 4) {
        fail(TL_ERR_UNSUPPORTED, "marlin_pack " + w.name + ": only 4-bit quantized weights can be packed");
    }
    return marlin_pack(w.codes, w.scales, w.zeros, w.k, w.n, w.group_size, mode);
}

MarlinUnpacked marlin_unpack(const MarlinPacked &p) {
    const int32_t k = p.k, n = p.n, groups = p.n_groups();
    MarlinUnpacked u;
    u.codes.assign(static_cast<size_t>(n) * (k / 2), 0);
    u.scales.resize(static_cast<size_t>(n) * groups);
    if (p.mode == MarlinMode::Fused) {
        u.zeros.resize(static_cast<size_t>(n) * groups);
    } else {
        u.delta.resize(static_cast<size_t>(n) * groups);
    }
    for (int32_t nn = 0; nn < n; ++nn) {
        for (int32_t g = 0; g < groups; ++g) {
            const size_t dst = static_cast<size_t>(nn) * groups + g;
            const size_t src = marlin_scale_position(n, g, nn);
            u.scales[dst] = p.scales[src];
            if (p.mode == MarlinMode::Fused) {
                u.zeros[dst] = p.zeros[src];
            } else {
                u.delta[dst] = p.delta[static_cast<size_t>(g) * n + nn];
            }
        }
        for (int32_t kk = 0; kk < k; ++kk) {
            const MarlinNibble at = marlin_code_position(k, n, kk, nn);
            const uint32_t q = (p.words[at.word] >> at.shift) & 0x0Fu;
            u.codes[static_cast<size_t>(nn) * (k / 2) + kk / 2] |= static_cast<uint8_t>(q << ((kk & 1) * 4));
        }
    }
    return u;
}

}  // namespace tl
