#include "import/int4_import.hpp"

#include <cstddef>
#include <utility>
#include <vector>

#include "util/error.hpp"
#include "util/half.hpp"

namespace tl {

namespace {

// AutoAWQ's GEMM layout packs 8 consecutive output columns into one int32 in an interleaved order: nibble i
// (bits 4i..4i+3) of word c holds column 8c + kAwqOrder[i]. Source: AutoAWQ (github.com/casper-hansen/AutoAWQ),
// awq/utils/packing_utils.py: AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7] and its inverse AWQ_REVERSE_ORDER =
// [0, 4, 1, 5, 2, 6, 3, 7], which dequantize_gemm applies after unpacking the nibbles low to high; and the packer of
// awq/modules/linear/gemm.py, `qweight[:, col] |= intweight[:, col * 8 + order_map[i]] << (i * 4)` with order_map =
// [0, 2, 4, 6, 1, 3, 5, 7], the same for qzeros.
constexpr int kAwqOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};

uint8_t nibble(int32_t word, int i) { return static_cast<uint8_t>((static_cast<uint32_t>(word) >> (4 * i)) & 0xFu); }

void require(bool ok, const std::string &message) {
    if (!ok) fail(TL_ERR_INVALID_ARGUMENT, message);
}

uint8_t byte_of(int32_t word, int i) { return static_cast<uint8_t>((static_cast<uint32_t>(word) >> (8 * i)) & 0xFFu); }

// import_int4 for 8-bit GPTQ, its shapes, pointers and g_idx checked: `perm` and `stored` as import_int4 made them.
QuantizedMatrix import_int8_gptq(const Int4Checkpoint &c, int32_t gs, std::vector<int32_t> perm,
                                 const std::vector<int32_t> &stored) {
    const std::string &p = c.field_prefix;
    const size_t k = static_cast<size_t>(c.k), n = static_cast<size_t>(c.n);
    const size_t groups = k / static_cast<size_t>(gs);
    QuantizedMatrix m;
    m.k = c.k;
    m.n = c.n;
    m.group_size = gs;
    m.bits = 8;
    m.codes.assign(n * k, 0);
    m.scales.assign(n * groups, 0);
    m.k_perm = std::move(perm);
    // Zero points first: v1 stores zero - 1, and only the symmetric zero 128 keeps W = (q - z) * s exactly q' * s.
    for (size_t g = 0; g < groups; ++g) {
        for (size_t w = 0; w < n / 4; ++w) {
            for (int i = 0; i < 4; ++i) {
                const int z = byte_of(c.qzeros[g * (n / 4) + w], i) + 1;
                if (z != kInt8GptqZero) {
                    fail(TL_ERR_UNSUPPORTED, p + "qzeros gives column " + std::to_string(4 * w + i) + " of group " +
                                                 std::to_string(g) + " the zero point " + std::to_string(z) +
                                                 ": 8-bit weights are stored symmetric (zero point 128, W = q * s); "
                                                 "asymmetric 8-bit GPTQ cannot be imported");
                }
            }
        }
    }
    for (size_t g = 0; g < groups; ++g) {
        for (size_t nn = 0; nn < n; ++nn) {
            const uint16_t s = c.scales[g * n + nn];
            if ((s & 0x7C00u) == 0x7C00u) {
                fail(TL_ERR_INVALID_ARGUMENT, p + "scales[" + std::to_string(g) + "][" + std::to_string(nn) +
                                                  "] (element " + std::to_string(g * n + nn) + ") is not finite");
            }
            m.scales[nn * groups + g] = s;
        }
    }
    // qweight [k/4][n]: byte i of word [r][nn] is row 4r + i.
    for (size_t r = 0; r < k / 4; ++r) {
        for (size_t nn = 0; nn < n; ++nn) {
            const int32_t word = c.qweight[r * n + nn];
            for (int i = 0; i < 4; ++i) {
                const int q = byte_of(word, i);
                const size_t kk = 4 * r + static_cast<size_t>(i);
                const size_t row = stored.empty() ? kk : static_cast<size_t>(stored[kk]);
                m.codes[nn * k + row] = static_cast<uint8_t>(static_cast<int8_t>(q - kInt8GptqZero));
            }
        }
    }
    return m;
}

}  // namespace

QuantizedMatrix import_int4(const Int4Checkpoint &c) {
    const std::string &p = c.field_prefix;
    const bool gptq = c.layout == Int4Layout::Gptq;
    const char *layout_name = gptq ? "GPTQ" : "AWQ";
    require(c.layout == Int4Layout::Gptq || c.layout == Int4Layout::Awq, p + "layout is not GPTQ or AWQ");
    require(c.bits == 4 || (c.bits == 8 && gptq), p + "bits must be 4, or 8 for the GPTQ layout, got " +
                                                      std::to_string(c.bits));
    const int per_word = 32 / c.bits;  // codes per int32: 8 nibbles or 4 bytes
    const std::string pack = std::to_string(per_word);

    // Shapes. GPTQ packs along k (qweight) and n (qzeros); AWQ packs along n only, and our codes need an even k.
    require(c.k > 0 && c.k <= (1 << 20), p + "k must be in [1, 2^20], got " + std::to_string(c.k));
    require(c.n > 0 && c.n <= (1 << 24), p + "n must be in [1, 2^24], got " + std::to_string(c.n));
    if (gptq) {
        require(c.k % per_word == 0, p + "k must be a multiple of " + pack + " for the " + std::to_string(c.bits) +
                                         "-bit GPTQ layout (qweight packs " + pack + " rows of K per int32), got " +
                                         std::to_string(c.k));
    } else {
        require(c.k % 2 == 0, p + "k must be even, got " + std::to_string(c.k));
    }
    require(c.n % per_word == 0, p + "n must be a multiple of " + pack + " for the " + std::string(layout_name) +
                                     " layout (qzeros packs " + pack + " columns per int32), got " +
                                     std::to_string(c.n));
    require(c.group_size >= 0, p + "group_size must be >= 0 (0 = per row; a checkpoint's group_size -1 is 0 here), got " +
                                   std::to_string(c.group_size));
    const int32_t gs = c.group_size == 0 ? c.k : c.group_size;
    require(c.k % gs == 0, p + "group_size " + std::to_string(c.group_size) + " does not divide k = " +
                               std::to_string(c.k));

    // Pointers.
    require(c.qweight != nullptr, p + "qweight is NULL");
    require(c.qzeros != nullptr, p + "qzeros is NULL");
    require(c.scales != nullptr, p + "scales is NULL");
    require(gptq || c.g_idx == nullptr, p + "g_idx must be NULL for the AWQ layout (AWQ has no g_idx)");

    const size_t k = static_cast<size_t>(c.k), n = static_cast<size_t>(c.n);
    const size_t groups = k / static_cast<size_t>(gs);

    // g_idx: every value in range first (a malformed tensor), then whether it is the trivial k / group_size. Any
    // other (act-order, desc_act) becomes a K permutation: the rows of each group are stored together, in their
    // order in K, and the layer reads its input through k_perm.
    std::vector<int32_t> perm;   // stored row -> input row; empty when every group is contiguous already
    std::vector<int32_t> stored; // input row -> stored row
    if (c.g_idx != nullptr) {
        std::vector<size_t> count(groups, 0);
        bool trivial = true;
        for (size_t kk = 0; kk < k; ++kk) {
            const int32_t g = c.g_idx[kk];
            require(g >= 0 && static_cast<size_t>(g) < groups,
                    p + "g_idx[" + std::to_string(kk) + "] = " + std::to_string(g) + " is out of range [0, " +
                        std::to_string(groups) + ")");
            ++count[static_cast<size_t>(g)];
            trivial = trivial && static_cast<size_t>(g) == kk / static_cast<size_t>(gs);
        }
        if (!trivial) {
            for (size_t g = 0; g < groups; ++g) {
                if (count[g] != static_cast<size_t>(gs)) {
                    fail(TL_ERR_UNSUPPORTED,
                         p + "g_idx puts " + std::to_string(count[g]) + " rows of K in group " + std::to_string(g) +
                             ", not group_size = " + std::to_string(gs) +
                             ": groups of unequal size cannot be stored as contiguous groups");
                }
            }
            perm.resize(k);
            stored.resize(k);
            std::vector<size_t> next(groups);
            for (size_t g = 0; g < groups; ++g) next[g] = g * static_cast<size_t>(gs);
            for (size_t kk = 0; kk < k; ++kk) {
                const size_t row = next[static_cast<size_t>(c.g_idx[kk])]++;
                perm[row] = static_cast<int32_t>(kk);
                stored[kk] = static_cast<int32_t>(row);
            }
        }
    }

    if (c.bits == 8) return import_int8_gptq(c, gs, std::move(perm), stored);

    QuantizedMatrix m;
    m.k = c.k;
    m.n = c.n;
    m.group_size = gs;
    m.bits = 4;
    m.codes.assign(n * k / 2, 0);
    m.scales.assign(n * groups, 0);
    m.zeros.assign(n * groups, 0);

    m.k_perm = std::move(perm);
    auto put_code = [&](size_t kk, size_t nn, uint8_t q) {
        const size_t row = stored.empty() ? kk : static_cast<size_t>(stored[kk]);
        m.codes[nn * (k / 2) + row / 2] |= static_cast<uint8_t>((row & 1) ? (q << 4) : q);
    };
    if (gptq) {  // qweight [k/8][n]: nibble i of word [r][nn] is row 8r + i
        for (size_t r = 0; r < k / 8; ++r) {
            for (size_t nn = 0; nn < n; ++nn) {
                const int32_t word = c.qweight[r * n + nn];
                for (int i = 0; i < 8; ++i) put_code(8 * r + i, nn, nibble(word, i));
            }
        }
    } else {  // qweight [k][n/8]: nibble i of word [kk][w] is column 8w + kAwqOrder[i]
        for (size_t kk = 0; kk < k; ++kk) {
            for (size_t w = 0; w < n / 8; ++w) {
                const int32_t word = c.qweight[kk * (n / 8) + w];
                for (int i = 0; i < 8; ++i) put_code(kk, 8 * w + kAwqOrder[i], nibble(word, i));
            }
        }
    }

    for (size_t g = 0; g < groups; ++g) {
        for (size_t w = 0; w < n / 8; ++w) {
            const int32_t word = c.qzeros[g * (n / 8) + w];
            for (int i = 0; i < 8; ++i) {
                // GPTQ v1 stores zero - 1 (its dequantization adds the 1 back after masking the nibble, so a stored
                // 15 reads as 16); AWQ stores the zero itself, in its interleaved column order.
                const size_t nn = gptq ? 8 * w + i : 8 * w + kAwqOrder[i];
                const int z = gptq ? nibble(word, i) + 1 : nibble(word, i);
                const uint16_t s = c.scales[g * n + nn];
                if ((s & 0x7C00u) == 0x7C00u) {
                    fail(TL_ERR_INVALID_ARGUMENT, p + "scales[" + std::to_string(g) + "][" + std::to_string(nn) +
                                                      "] (element " + std::to_string(g * n + nn) + ") is not finite");
                }
                // -z * s is exact in FP32 (a 5-bit integer times an 11-bit significand); the FP16 rounding below is
                // the only difference from the checkpoint's own (q - z) * s.
                const float zs = -static_cast<float>(z) * half_to_float(s);
                const uint16_t zh = float_to_half(zs);
                if ((zh & 0x7C00u) == 0x7C00u) {
                    fail(TL_ERR_INVALID_ARGUMENT, p + "scales[" + std::to_string(g) + "][" + std::to_string(nn) +
                                                      "] times the zero point " + std::to_string(z) + " = " +
                                                      std::to_string(zs) + " does not fit in FP16");
                }
                m.scales[nn * groups + g] = s;
                m.zeros[nn * groups + g] = zh;
            }
        }
    }
    return m;
}

}  // namespace tl
