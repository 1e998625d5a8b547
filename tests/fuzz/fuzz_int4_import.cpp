// libFuzzer target: each input is one tl_weight_import_int4 call, through the public C API only. The first bytes
// pick the descriptor's fields (layout, k, n, group size, which optional arrays are given), valid or not; the rest
// fill the arrays, each allocated at exactly the size the header gives for those fields (rounded up where a shape
// is invalid), so that a read past one shows under ASan. A weight that imports is dequantized and packed on the host.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fuzz_common.hpp"
#include "tinyloop.h"

namespace {

// Small shapes: every input's arrays stay a few KB.
constexpr int32_t kMaxDim = 256;

struct Bytes {
    const uint8_t *data;
    size_t size, at = 0;
    uint8_t byte() { return at < size ? data[at++] : 0; }
    template <typename T>
    void fill(std::vector<T> &v) {  // raw bytes, zeros once the input runs out
        const size_t n = std::min(v.size() * sizeof(T), size - at);
        if (n > 0) std::memcpy(v.data(), data + at, n);
        at += n;
    }
};

using fuzz::read_message;

// A dimension from two bytes: mostly in [1, kMaxDim], sometimes 0, negative or far out of range.
int32_t dimension(Bytes &in) {
    const uint8_t kind = in.byte(), value = in.byte();
    switch (kind % 16) {
    case 0: return 0;
    case 1: return -static_cast<int32_t>(value);
    case 2: return INT32_MAX - value;
    default: return 1 + value % kMaxDim;
    }
}

int64_t ceil_div(int64_t a, int64_t b) { return b > 0 && a > 0 ? (a + b - 1) / b : 0; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Bytes in{data, size};
    tl_int4_import_desc desc;
    if (tl_int4_import_desc_init(&desc, sizeof desc) != TL_OK) std::abort();
    const uint8_t flags = in.byte();
    desc.layout = static_cast<int32_t>(flags % 4) - 1;  // -1 and 2 are invalid
    desc.k = dimension(in);
    desc.n = dimension(in);
    const uint8_t group = in.byte();
    desc.group_size = group < 200 ? 8 * (group % 9) : static_cast<int32_t>(group) - 228;  // 0..64, or -28..27
    // Arrays only for shapes small enough to allocate; beyond that they stay NULL (and must be refused).
    const bool small = desc.k > 0 && desc.n > 0 && desc.k <= kMaxDim && desc.n <= kMaxDim;
    const int64_t k = small ? desc.k : 0, n = small ? desc.n : 0;
    const int64_t groups = desc.group_size > 0 ? ceil_div(k, desc.group_size) : (k > 0 ? 1 : 0);
    const bool awq = desc.layout == TL_INT4_LAYOUT_AWQ;
    std::vector<int32_t> qweight(static_cast<size_t>(awq ? k * ceil_div(n, 8) : ceil_div(k, 8) * n));
    std::vector<int32_t> qzeros(static_cast<size_t>(groups * ceil_div(n, 8)));
    std::vector<uint16_t> scales(static_cast<size_t>(groups * n));
    std::vector<int32_t> g_idx(static_cast<size_t>(k));
    in.fill(qweight);
    in.fill(qzeros);
    in.fill(scales);
    if (flags & 0x10) {
        // Mostly plausible group indices (a permutation of k / group_size), else raw bytes.
        if (flags & 0x20) {
            in.fill(g_idx);
        } else {
            for (int64_t i = 0; i < k; ++i) g_idx[size_t(i)] = desc.group_size > 0 ? int32_t(i / desc.group_size) : 0;
            for (int64_t i = k - 1; i > 0; --i) std::swap(g_idx[size_t(i)], g_idx[size_t(in.byte() % (i + 1))]);
        }
    }
    // Empty vectors give NULL or a dangling-but-unread pointer; NULL where the flags drop an array.
    desc.qweight = (flags & 0x40) ? nullptr : qweight.data();
    desc.qzeros = (flags & 0x80) && (flags & 0x08) ? nullptr : qzeros.data();
    desc.scales = scales.data();
    desc.g_idx = (flags & 0x10) ? g_idx.data() : nullptr;
    desc.name = (flags & 0x04) ? "fuzz.weight" : nullptr;

    tl_weight *weight = nullptr;
    const tl_status status = tl_weight_import_int4(&desc, &weight);
    read_message(status);
    if (status != TL_OK) {
        if (weight != nullptr) std::abort();  // the header promises *out_weight = NULL on failure
        return 0;
    }
    tl_weight_properties info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    read_message(tl_weight_info(weight, &info));
    std::vector<float> out(static_cast<size_t>(k * n));  // exact: a write past it shows under ASan
    read_message(tl_weight_dequantize(weight, out.data(), out.size()));
    read_message(tl_weight_pack_marlin(weight, nullptr, nullptr));
    tl_weight_free(weight);
    return 0;
}
