#include "format/model.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "util/error.hpp"
#include "util/half.hpp"

namespace tl {

const char *dtype_name(DType dtype) {
    switch (dtype) {
        case DType::F16: return "F16";
        case DType::F32: return "F32";
        case DType::BF16: return "BF16";
        case DType::U8: return "U8";
        case DType::I32: return "I32";
        case DType::I8: return "I8";
    }
    return "?";
}

const char *rope_scaling_name(RopeScalingType type) {
    switch (type) {
        case RopeScalingType::None: return "none";
        case RopeScalingType::Linear: return "linear";
        case RopeScalingType::Dynamic: return "dynamic";
        case RopeScalingType::Llama3: return "llama3";
        case RopeScalingType::Yarn: return "yarn";
    }
    return "?";
}

size_t dtype_size(DType dtype) {
    switch (dtype) {
        case DType::F16:
        case DType::BF16: return 2;
        case DType::F32:
        case DType::I32: return 4;
        case DType::U8:
        case DType::I8: return 1;
    }
    return 0;
}

float load_float(DType dtype, const void *data, size_t i) {
    switch (dtype) {
        case DType::F16: return half_to_float(static_cast<const uint16_t *>(data)[i]);
        case DType::F32: return static_cast<const float *>(data)[i];
        case DType::BF16: {
            const uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t *>(data)[i]) << 16;
            float f;
            std::memcpy(&f, &bits, sizeof f);
            return f;
        }
        default: fail(TL_ERR_INTERNAL, std::string("load_float on non-float dtype ") + dtype_name(dtype));
    }
}

size_t Linear::quant_bytes() const {
    if (!quantized) return 0;
    const size_t kn = static_cast<size_t>(k) * static_cast<size_t>(n);
    const size_t groups = static_cast<size_t>(n_groups()) * static_cast<size_t>(n);
    size_t bytes = code_row_bytes() * static_cast<size_t>(n) + groups * (zeros ? 2 : 1) * sizeof(uint16_t);
    if (frac4) bytes += kn / 2;
    if (sign_bit) bytes += kn / 8;
    if (k_perm) bytes += static_cast<size_t>(k) * sizeof(int32_t);
    return bytes;
}

Linear *Block::linear(int i) {
    switch (i) {
        case 0: return &attn_qkv;
        case 1: return &attn_out;
        case 2: return &mlp_gate;
        case 3: return &mlp_up;
        case 4: return &mlp_down;
        default: return nullptr;
    }
}

const Linear *Block::linear(int i) const { return const_cast<Block *>(this)->linear(i); }

std::vector<const Linear *> Model::linears() const {
    std::vector<const Linear *> out;
    for (const Block &b : pre)
        for (int i = 0; i < 5; ++i) out.push_back(b.linear(i));
    for (int i = 0; i < 5; ++i) out.push_back(loop.linear(i));
    if (head_kind != HeadKind::Tied) out.push_back(&head);
    return out;
}

void Model::tie_head(std::shared_ptr<const void> storage) {
    head_kind = HeadKind::Tied;
    head.name = "head";
    head.k = config.d_model;
    head.n = config.vocab;
    head.dense_dtype = embed_dtype;
    head.dense = embed;
    head.keepalive = std::move(storage);
}

const Linear *widest_quantized(const Model &model) {
    const Linear *widest = nullptr;
    for (const Linear *l : model.linears())
        if (l->quantized && (widest == nullptr || l->bits > widest->bits)) widest = l;
    return widest;
}

std::string k_perm_error(const int32_t *perm, int32_t k) {
    std::vector<int32_t> seen_at(static_cast<size_t>(std::max(k, 0)), -1);
    for (int32_t i = 0; i < k; ++i) {
        const int32_t v = perm[i];
        if (v < 0 || v >= k) {
            return "k_perm[" + std::to_string(i) + "] = " + std::to_string(v) + " is out of range [0, " +
                   std::to_string(k) + ")";
        }
        if (seen_at[v] >= 0) {
            return "k_perm[" + std::to_string(i) + "] = " + std::to_string(v) + " repeats k_perm[" +
                   std::to_string(seen_at[v]) + "]";
        }
        seen_at[v] = i;
    }
    return "";
}

bool same_k_perm(const Linear &a, const Linear &b) {
    if (a.k != b.k || (a.k_perm == nullptr) != (b.k_perm == nullptr)) return false;
    return a.k_perm == nullptr || std::equal(a.k_perm, a.k_perm + a.k, b.k_perm);
}

}  // namespace tl
