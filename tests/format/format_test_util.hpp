// Helpers shared by the format tests: small valid models built tensor by tensor (never through the library's
// own model code), and an independent safetensors reader/encoder used to check the writer and to build the
// malformed-file corpus.
#pragma once

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "format/format.hpp"
#include "format/model.hpp"

namespace tlt {

struct OwnedTensor {
    std::string name;
    tl::DType dtype = tl::DType::U8;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
    std::vector<float> values;  // float tensors: the values before encoding (exact for norm gains)
};

enum class HeadStore { Quantized, Dense, Tied };

struct ModelSpec {
    int32_t group_size = 8;  // 0 = per row
    bool dense_linears = false;
    int32_t bits = 4;  // 8: INT8 linears (I8 codes [N, K] in [-127, 127], scales, no zeros)
    HeadStore head = HeadStore::Tied;
    bool frac4 = false;
    bool sign_bit = false;
    tl::DType norm_dtype = tl::DType::F32;
    tl::DType embed_dtype = tl::DType::F16;
    tl::DType dense_dtype = tl::DType::F16;
};

// D = 24, A = 16, F = 40, V = 50: all different, so a K/N mix-up shows; every K is a multiple of 8.
tl::ModelConfig small_config(int32_t group_size);

// Every tensor of a valid model (fresh random codes; finite scales, zeros, norms, embedding and dense values),
// in the documented names.
std::vector<OwnedTensor> make_tensors(const tl::ModelConfig &config, const ModelSpec &spec, std::mt19937_64 &rng);

std::map<std::string, std::string> model_metadata(const tl::ModelConfig &config);
std::vector<tl::TensorView> views_of(const std::vector<OwnedTensor> &tensors);

// The bytes of a valid .tinyloop file for this config and spec, written with tl::write_safetensors as `name`
// in temp_dir().
std::vector<uint8_t> make_valid_file(const tl::ModelConfig &config, const ModelSpec &spec, const std::string &name,
                                     std::mt19937_64 &rng);

// A fresh directory for this test process's files.
std::string temp_dir();

std::vector<uint8_t> read_bytes(const std::string &path);
void write_bytes(const std::string &path, const std::vector<uint8_t> &bytes);

// A safetensors file taken apart: the header JSON (metadata included), its length and the data section.
struct RawFile {
    nlohmann::json header;
    uint64_t header_len = 0;
    std::vector<uint8_t> data;
};
RawFile parse_raw(const std::vector<uint8_t> &bytes);  // EXPECTs a well-formed file
// The 8-byte little-endian header length, the header text as given (valid JSON or not), then the data section.
std::vector<uint8_t> encode_file(const std::string &header_text, const std::vector<uint8_t> &data);
std::vector<uint8_t> encode_raw(const RawFile &raw);   // header unpadded, data as is
// Every tensor of a raw file by name, with its bytes.
std::map<std::string, OwnedTensor> tensors_of(const RawFile &raw);

}  // namespace tlt
