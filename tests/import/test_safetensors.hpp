// Test-side reading of safetensors files, independent of the library's reader (format.cpp): the import.* tests
// compare what the library wrote or converted with what the Python scripts wrote, so neither side may share code
// with the converter under test.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tl_test {

struct Tensor {
    std::string dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> data;

    template <class T>
    const T *as(const char *want) const {
        if (dtype != want) throw std::runtime_error("tensor has dtype " + dtype + ", expected " + want);
        return reinterpret_cast<const T *>(data.data());
    }
    size_t count() const {
        size_t n = 1;
        for (int64_t d : shape) n *= static_cast<size_t>(d);
        return n;
    }
};

// The whole file (8-byte little-endian header length, JSON header, raw data); `metadata` receives __metadata__.
inline std::map<std::string, Tensor> read_safetensors(const std::string &path,
                                                      std::map<std::string, std::string> *metadata = nullptr) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error("cannot open " + path + " (run the tests/import scripts; CTest does)");
    std::stringstream buffer;
    buffer << f.rdbuf();
    const std::string bytes = buffer.str();
    if (bytes.size() < 8) throw std::runtime_error(path + ": too short");
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(bytes[i]);
    if (8 + header_len > bytes.size()) throw std::runtime_error(path + ": bad header length");
    const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, header_len));
    const size_t base = 8 + header_len;
    std::map<std::string, Tensor> tensors;
    for (auto it = header.begin(); it != header.end(); ++it) {
        if (it.key() == "__metadata__") {
            if (metadata) *metadata = it.value().get<std::map<std::string, std::string>>();
            continue;
        }
        Tensor t;
        t.dtype = it.value().at("dtype").get<std::string>();
        t.shape = it.value().at("shape").get<std::vector<int64_t>>();
        const auto offsets = it.value().at("data_offsets").get<std::vector<uint64_t>>();
        if (offsets.size() != 2 || offsets[0] > offsets[1] || base + offsets[1] > bytes.size()) {
            throw std::runtime_error(path + ": bad data_offsets of " + it.key());
        }
        t.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(base + offsets[0]),
                      bytes.begin() + static_cast<std::ptrdiff_t>(base + offsets[1]));
        tensors.emplace(it.key(), std::move(t));
    }
    return tensors;
}

inline float half_to_float(uint16_t h) {  // normal and subnormal values are all the test data holds
    const int exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
    const float sign = (h & 0x8000) ? -1.0f : 1.0f;
    if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), -24);
    return sign * std::ldexp(static_cast<float>(mant | 0x400), exp - 25);
}

inline float bf16_to_float(uint16_t h) {
    const uint32_t bits = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

// Element i of an F16 / BF16 / F32 tensor as float.
inline float value_at(const Tensor &t, size_t i) {
    if (t.dtype == "F32") {
        float f;
        std::memcpy(&f, t.data.data() + 4 * i, 4);
        return f;
    }
    uint16_t h;
    std::memcpy(&h, t.data.data() + 2 * i, 2);
    if (t.dtype == "F16") return half_to_float(h);
    if (t.dtype == "BF16") return bf16_to_float(h);
    throw std::runtime_error("value_at on a " + t.dtype + " tensor");
}

// How far an imported INT4 weight may be from the checkpoint's own (q - z) * s: the one FP16 rounding of the offset
// z' = -z * s (at most 2^-11 of |z * s|), plus the FP32 rounding of q * s + z'.
inline double int4_tolerance(double expected, double offset) {
    return std::ldexp(offset, -11) + 4.0 * 1.2e-7 * (std::fabs(expected) + 2 * offset);
}

}  // namespace tl_test
