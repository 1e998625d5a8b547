// The .tinyloop loader and writer (docs/format.md). Every byte of the file is distrusted: the header is parsed
// and checked in full, against itself and against the config, before a tensor view is handed out, and all size
// arithmetic is overflow-checked.
#include "format/format.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>
#include <system_error>
#include <utility>

#include <nlohmann/json.hpp>

#include "format/message_text.hpp"
#include "util/error.hpp"
#include "util/json.hpp"

namespace tl {
namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

// A .tinyloop header lists tens to a few thousand tensors (well under 1 MiB of JSON). The reference reader's
// 100 MB limit let one hostile header cost gigabytes of parsed JSON per load; 16 MiB stays generous but bounded.
constexpr uint64_t kMaxHeaderBytes = uint64_t{16} << 20;
constexpr const char *kMaxHeaderText = "16 MiB";
// A tensor's entry is about 8 JSON values, so this leaves room for 32k tensors while a header of small values
// costs tens of MB to parse, not the ~20x its size that a DOM of small values would.
constexpr JsonLimits kHeaderJsonLimits{kMaxHeaderBytes, 64, uint64_t{1} << 18};
constexpr const char *kMetadataKey = "__metadata__";
// The tokenizer's file, stored whole as a U8 tensor, and the metadata key naming its kind (docs/format.md).
constexpr const char *kTokenizerJsonTensor = "tokenizer.json";
constexpr const char *kTokenizerModelTensor = "tokenizer.model";
constexpr const char *kTokenizerKey = "tokenizer";
constexpr const char *kLinearSuffixes[] = {".qweight", ".scales", ".zeros", ".frac4",
                                           ".sign_bit", ".k_perm", ".weight", ".bias"};

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

std::string quoted(const std::string &s) { return "'" + s + "'"; }

std::string hex_byte(uint8_t byte) {
    char text[8];
    std::snprintf(text, sizeof text, "0x%02x", byte);
    return text;
}

// Product of `shape` times `elem_size`, or false if it does not fit in 64 bits.
bool checked_bytes(const std::vector<int64_t> &shape, uint64_t elem_size, uint64_t *out) {
    uint64_t bytes = elem_size;
    for (int64_t dim : shape)
        if (dim < 0 || __builtin_mul_overflow(bytes, static_cast<uint64_t>(dim), &bytes)) return false;
    *out = bytes;
    return true;
}

bool parse_dtype(const std::string &text, DType *out) {
    for (DType d : {DType::F16, DType::F32, DType::BF16, DType::U8, DType::I32, DType::I8}) {
        if (text == dtype_name(d)) {
            *out = d;
            return true;
        }
    }
    return false;
}

}  // namespace

// Reads through memcpy so that alignment never matters, and tests the exponent bits directly rather than converting
// every value to float.
size_t first_nonfinite(DType dtype, const void *data, size_t count) {
    const auto *bytes = static_cast<const uint8_t *>(data);
    for (size_t i = 0; i < count; ++i) {
        if (dtype == DType::F32) {
            uint32_t v;
            std::memcpy(&v, bytes + 4 * i, 4);
            if ((v & 0x7F800000u) == 0x7F800000u) return i;
        } else {
            uint16_t v;
            std::memcpy(&v, bytes + 2 * i, 2);
            const uint16_t exp_mask = dtype == DType::F16 ? 0x7C00u : 0x7F80u;
            if ((v & exp_mask) == exp_mask) return i;
        }
    }
    return count;
}

namespace {

// ---- Reading the file ----

struct FileBytes {
    const uint8_t *data = nullptr;
    size_t size = 0;
    std::shared_ptr<const void> owner;  // the mapping or the buffer
};

struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
};

const char *file_kind(mode_t mode) {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    return "of an unknown file type";
}

FileBytes open_file(const std::string &path, bool use_mmap) {
    // O_NONBLOCK: opening a FIFO that has no writer would otherwise block forever before fstat could refuse it.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) fail(TL_ERR_IO, "cannot open " + quoted(path) + ": " + errno_text(errno));
    const FdCloser closer{fd};
    struct stat st;
    if (::fstat(fd, &st) != 0) fail(TL_ERR_IO, "cannot stat " + quoted(path) + ": " + errno_text(errno));
    if (!S_ISREG(st.st_mode)) {
        fail(TL_ERR_IO, quoted(path) + " is " + file_kind(st.st_mode) + ", not a regular file");
    }
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        fail(TL_ERR_IO, "cannot set " + quoted(path) + " to blocking reads: " + errno_text(errno));
    }
    FileBytes file;
    file.size = static_cast<size_t>(st.st_size);
    if (file.size < 8) {
        fail(TL_ERR_FORMAT,
             quoted(path) + ": file is " + std::to_string(file.size) + " bytes, shorter than the 8-byte header length");
    }
    if (use_mmap) {
        void *map = ::mmap(nullptr, file.size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) fail(TL_ERR_IO, "cannot map " + quoted(path) + ": " + errno_text(errno));
        const size_t size = file.size;
        file.owner = std::shared_ptr<const void>(map, [size](const void *p) { ::munmap(const_cast<void *>(p), size); });
        file.data = static_cast<const uint8_t *>(map);
        return file;
    }
    auto buffer = std::make_shared<std::vector<uint8_t>>(file.size);
    size_t done = 0;
    while (done < file.size) {
        const size_t chunk = std::min<size_t>(file.size - done, size_t{1} << 30);
        const ssize_t got = ::pread(fd, buffer->data() + done, chunk, static_cast<off_t>(done));
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) fail(TL_ERR_IO, "cannot read " + quoted(path) + ": " + errno_text(errno));
        if (got == 0) fail(TL_ERR_IO, "cannot read " + quoted(path) + ": the file shrank while being read");
        done += static_cast<size_t>(got);
    }
    file.data = buffer->data();
    file.owner = std::move(buffer);
    return file;
}

// The process's file-creation mask, read without umask(2), which would change it for every thread meanwhile.
// Linux reports it in /proc/self/status; where that is unavailable, assume the usual 022.
// Deletes the temporaries of earlier writes to the same path (`.NAME.` + mkostemp's six characters, in `dir`) that
// no live writer holds locked: a writer killed midway leaves one behind, and the next write to that path removes it.
// Best effort: what cannot be opened, locked or removed stays.
void remove_stale_temporaries(const std::string &dir, const std::string &prefix, const std::string &own) {
    DIR *d = ::opendir(dir.c_str());
    if (d == nullptr) return;
    const std::string own_name = own.substr(own.rfind('/') == std::string::npos ? 0 : own.rfind('/') + 1);
    std::vector<std::string> candidates;
    while (const dirent *e = ::readdir(d)) {
        const std::string name = e->d_name;
        if (name.size() == prefix.size() + 6 && name.compare(0, prefix.size(), prefix) == 0 && name != own_name &&
            std::all_of(name.begin() + static_cast<std::ptrdiff_t>(prefix.size()), name.end(),
                        [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; })) {
            candidates.push_back(name);
        }
    }
    ::closedir(d);
    for (const std::string &name : candidates) {
        const std::string file = dir + "/" + name;
        const int fd = ::open(file.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0) continue;
        const FdCloser closer{fd};
        struct stat held, named;
        // Unlocked: its writer is gone. The name must still be this file when it is removed.
        if (::flock(fd, LOCK_EX | LOCK_NB) == 0 && ::fstat(fd, &held) == 0 && S_ISREG(held.st_mode) &&
            ::lstat(file.c_str(), &named) == 0 && named.st_dev == held.st_dev && named.st_ino == held.st_ino) {
            ::unlink(file.c_str());
        }
    }
}

mode_t process_umask() {
    FILE *status = std::fopen("/proc/self/status", "re");
    if (!status) return 022;
    char line[256];
    unsigned mask = 022;
    while (std::fgets(line, sizeof line, status)) {
        if (std::sscanf(line, "Umask: %o", &mask) == 1) break;
    }
    std::fclose(status);
    return static_cast<mode_t>(mask & 0777);
}

// ---- The header ----

struct TensorEntry {
    std::string name;
    DType dtype = DType::U8;
    std::vector<int64_t> shape;
    uint64_t begin = 0;  // byte range within the data section
    uint64_t end = 0;
    const uint8_t *bytes = nullptr;  // begin's address in the file
};

struct Header {
    json root;
    const uint8_t *data = nullptr;  // the data section
    uint64_t data_size = 0;
    std::map<std::string, std::string> metadata;
    std::map<std::string, TensorEntry> tensors;
};

// A non-negative JSON integer (nlohmann stores those that fit in int64 as signed, larger ones as unsigned).
bool json_uint(const json &value, uint64_t *out) {
    if (value.is_number_unsigned()) {
        *out = value.get<uint64_t>();
        return true;
    }
    if (value.is_number_integer() && value.get<int64_t>() >= 0) {
        *out = static_cast<uint64_t>(value.get<int64_t>());
        return true;
    }
    return false;
}

TensorEntry parse_tensor_entry(const std::string &name, const json &entry, const uint8_t *data, uint64_t data_size) {
    const std::string where = "tensor " + quoted(name) + ": ";
    if (!entry.is_object()) fail(TL_ERR_FORMAT, where + "header entry is not a JSON object");
    TensorEntry t;
    t.name = name;

    const auto dtype = entry.find("dtype");
    if (dtype == entry.end() || !dtype->is_string()) fail(TL_ERR_FORMAT, where + "missing or non-string dtype");
    if (!parse_dtype(dtype->get<std::string>(), &t.dtype)) {
        fail(TL_ERR_FORMAT,
             where + "dtype " + quoted(dtype->get<std::string>()) + " is not one of F16, F32, BF16, U8, I32");
    }

    const auto shape = entry.find("shape");
    if (shape == entry.end() || !shape->is_array()) fail(TL_ERR_FORMAT, where + "missing or non-list shape");
    for (const json &dim : *shape) {
        uint64_t d;
        if (!json_uint(dim, &d) || d > static_cast<uint64_t>(INT64_MAX)) {
            fail(TL_ERR_FORMAT, where + "shape is not a list of non-negative integers (element " +
                                    std::to_string(t.shape.size()) + " is " + describe_json(dim) + ")");
        }
        t.shape.push_back(static_cast<int64_t>(d));
    }
    uint64_t expected_bytes;
    if (!checked_bytes(t.shape, dtype_size(t.dtype), &expected_bytes)) {
        fail(TL_ERR_FORMAT, where + "shape " + shape_text(t.shape) + " is too large (byte size overflows)");
    }

    const auto offsets = entry.find("data_offsets");
    if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2 || !json_uint((*offsets)[0], &t.begin) ||
        !json_uint((*offsets)[1], &t.end)) {
        fail(TL_ERR_FORMAT, where + "data_offsets must be two non-negative integers [begin, end]");
    }
    if (t.begin > t.end) {
        fail(TL_ERR_FORMAT,
             where + "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "] have begin > end");
    }
    if (t.end > data_size) {
        fail(TL_ERR_FORMAT, where + "data_offsets end " + std::to_string(t.end) +
                                " is past the end of the data section (" + std::to_string(data_size) +
                                " bytes; the file may be truncated)");
    }
    if (t.end - t.begin != expected_bytes) {
        fail(TL_ERR_FORMAT, where + "data_offsets span " + std::to_string(t.end - t.begin) + " bytes but shape " +
                                shape_text(t.shape) + " of " + dtype_name(t.dtype) + " needs " +
                                std::to_string(expected_bytes));
    }
    t.bytes = data + t.begin;
    return t;
}

void check_no_overlap(const std::map<std::string, TensorEntry> &tensors) {
    std::vector<const TensorEntry *> by_offset;
    for (const auto &kv : tensors)
        if (kv.second.end > kv.second.begin) by_offset.push_back(&kv.second);
    std::sort(by_offset.begin(), by_offset.end(),
              [](const TensorEntry *a, const TensorEntry *b) { return a->begin < b->begin; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
        const TensorEntry &prev = *by_offset[i - 1];
        const TensorEntry &cur = *by_offset[i];
        if (cur.begin < prev.end) {
            fail(TL_ERR_FORMAT, "tensor " + quoted(cur.name) + " overlaps tensor " + quoted(prev.name) +
                                    " in the data section (bytes " + std::to_string(cur.begin) + " < " +
                                    std::to_string(prev.end) + ")");
        }
    }
}

// The length prefix, the JSON and __metadata__; tensor entries are parsed later, once the metadata says the
// file is a version this library reads. A .tinyloop file needs __metadata__; another writer's safetensors file
// (read_safetensors) may go without.
Header parse_header(const FileBytes &file, bool require_metadata = true) {
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | file.data[i];  // little-endian
    if (header_len == 0) fail(TL_ERR_FORMAT, "header length is 0");
    if (header_len > kMaxHeaderBytes) {
        fail(TL_ERR_FORMAT, "header length " + std::to_string(header_len) + " exceeds the " + kMaxHeaderText + " (" +
                                std::to_string(kMaxHeaderBytes) + "-byte) limit");
    }
    if (header_len > file.size - 8) {
        fail(TL_ERR_FORMAT, "header length " + std::to_string(header_len) + " runs past the end of the file (" +
                                std::to_string(file.size) + " bytes; the file may be truncated)");
    }
    Header header;
    const uint8_t *text = file.data + 8;
    // nlohmann's parser takes a NUL for the end of its input, so "{...}\0junk" would load here while other
    // safetensors readers refuse it: no control byte may appear anywhere (JSON whitespace aside), and only
    // spaces may follow the object (the safetensors padding).
    for (uint64_t i = 0; i < header_len; ++i) {
        if (text[i] < 0x20 && text[i] != '\t' && text[i] != '\n' && text[i] != '\r') {
            fail(TL_ERR_FORMAT, "header has control byte " + hex_byte(text[i]) + " at file offset " +
                                    std::to_string(8 + i) + " (a header is JSON text, padded only with spaces)");
        }
    }
    uint64_t json_len = header_len;
    while (json_len > 0 && text[json_len - 1] == ' ') --json_len;
    header.root = parse_json(reinterpret_cast<const char *>(text), json_len, kHeaderJsonLimits, "header");
    if (!header.root.is_object()) fail(TL_ERR_FORMAT, "header JSON is not an object");
    if (text[json_len - 1] != '}') {  // the parse accepted trailing tabs or newlines
        uint64_t end = json_len;
        while (text[end - 1] != '}') --end;
        while (text[end] == ' ') ++end;
        fail(TL_ERR_FORMAT, "header has byte " + hex_byte(text[end]) + " at file offset " + std::to_string(8 + end) +
                                " after the JSON object; only spaces may follow it");
    }
    header.data = text + header_len;
    header.data_size = file.size - 8 - header_len;

    const auto meta = header.root.find(kMetadataKey);
    if (meta == header.root.end()) {
        if (!require_metadata) return header;
        fail(TL_ERR_FORMAT, "header has no __metadata__ (not a .tinyloop file)");
    }
    if (!meta->is_object()) fail(TL_ERR_FORMAT, "__metadata__ is not a JSON object");
    for (const auto &kv : meta->items()) {
        if (!kv.value().is_string()) fail(TL_ERR_FORMAT, "__metadata__ value " + quoted(kv.key()) + " is not a string");
        header.metadata[kv.key()] = kv.value().get<std::string>();
    }
    return header;
}

void parse_tensor_entries(Header *header) {
    for (const auto &kv : header->root.items()) {
        if (kv.key() == kMetadataKey) continue;
        header->tensors.emplace(kv.key(), parse_tensor_entry(kv.key(), kv.value(), header->data, header->data_size));
    }
    header->root = json();  // no longer needed; frees the parsed header
    check_no_overlap(header->tensors);
}

const std::string &metadata_field(const Header &header, const std::string &key) {
    const auto it = header.metadata.find(key);
    if (it == header.metadata.end()) fail(TL_ERR_FORMAT, "__metadata__ has no " + quoted(key));
    return it->second;
}

int32_t parse_format_version(const std::string &text) {
    int64_t version = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), version);
    if (ec != std::errc() || end != text.data() + text.size() || version < 1) {
        fail(TL_ERR_FORMAT, "__metadata__ format_version " + quoted(text) + " is not a positive integer");
    }
    if (version > kFormatVersion) {
        fail(TL_ERR_FORMAT,
             "unsupported format_version " + text + " (this library reads " + std::to_string(kFormatVersion) + ")");
    }
    return static_cast<int32_t>(version);
}

// ---- Building the model from validated entries ----

std::string block_prefix(int32_t pre_index) {
    return pre_index < 0 ? "loop." : "pre." + std::to_string(pre_index) + ".";
}

// Every tensor name a file with this config may hold; anything else is a typo or a stale file.
std::set<std::string> known_tensor_names(const ModelConfig &c) {
    std::set<std::string> names = {"embed.weight", "final_norm.weight"};
    auto add_linear = [&](const std::string &linear) {
        for (const char *suffix : kLinearSuffixes) names.insert(linear + suffix);
    };
    for (int32_t i = -1; i < c.pre; ++i) {
        const std::string prefix = block_prefix(i);
        names.insert(prefix + "attn_norm.weight");
        names.insert(prefix + "mlp_norm.weight");
        for (const char *linear : Block::kLinearNames) add_linear(prefix + linear);
    }
    add_linear("head");
    names.insert(kTokenizerJsonTensor);
    names.insert(kTokenizerModelTensor);
    return names;
}

// Keeps the file and any aligned copies alive for every view handed out.
struct Storage {
    std::shared_ptr<const void> file;
    std::vector<std::unique_ptr<uint64_t[]>> copies;
};

class ModelReader {
public:
    ModelReader(Header header, std::shared_ptr<Storage> storage, const ModelConfig &config, const LoadOptions &options)
        : header_(std::move(header)), storage_(std::move(storage)), config_(config), options_(options) {}

    const TensorEntry *find(const std::string &name) const {
        const auto it = header_.tensors.find(name);
        return it == header_.tensors.end() ? nullptr : &it->second;
    }

    const TensorEntry &require(const std::string &name) const {
        const TensorEntry *t = find(name);
        if (!t) fail(TL_ERR_FORMAT, "missing tensor " + quoted(name));
        return *t;
    }

    void check(const TensorEntry &t, std::initializer_list<DType> dtypes, const std::vector<int64_t> &shape,
               const std::string &shape_meaning) const {
        if (std::find(dtypes.begin(), dtypes.end(), t.dtype) == dtypes.end()) {
            std::string allowed;
            for (DType d : dtypes) allowed += std::string(allowed.empty() ? "" : "/") + dtype_name(d);
            fail(TL_ERR_FORMAT,
                 "tensor " + quoted(t.name) + ": dtype " + dtype_name(t.dtype) + ", expected " + allowed);
        }
        if (t.shape != shape) {
            fail(TL_ERR_FORMAT, "tensor " + quoted(t.name) + ": shape " + shape_text(t.shape) + ", expected " +
                                    shape_text(shape) + " " + shape_meaning);
        }
    }

    void check_finite(const TensorEntry &t) const {
        if (!options_.validate_values) return;
        const size_t count = (t.end - t.begin) / dtype_size(t.dtype);
        const size_t bad = first_nonfinite(t.dtype, t.bytes, count);
        if (bad != count) {
            alignas(4) uint8_t value[4];
            std::memcpy(value, t.bytes + bad * dtype_size(t.dtype), dtype_size(t.dtype));
            fail(TL_ERR_FORMAT, "tensor " + quoted(t.name) + ": non-finite value (" +
                                    std::to_string(load_float(t.dtype, value, 0)) + ") at index " +
                                    std::to_string(bad));
        }
    }

    // The tensor's data at an address aligned for its dtype: in place when the file allows, else a copy (files
    // from other writers need not align tensors, and a misaligned typed read is undefined behaviour).
    const void *aligned(const TensorEntry &t) const {
        const size_t align = dtype_size(t.dtype);
        if (reinterpret_cast<uintptr_t>(t.bytes) % align == 0) return t.bytes;
        const size_t n = static_cast<size_t>(t.end - t.begin);
        storage_->copies.emplace_back(new uint64_t[(n + 7) / 8]);
        std::memcpy(storage_->copies.back().get(), t.bytes, n);
        return storage_->copies.back().get();
    }

    std::vector<float> load_norm(const std::string &name) const {
        const TensorEntry &t = require(name);
        check(t, {DType::F16, DType::F32, DType::BF16}, {config_.d_model}, "([D])");
        check_finite(t);
        const void *data = aligned(t);
        std::vector<float> out(static_cast<size_t>(config_.d_model));
        for (size_t i = 0; i < out.size(); ++i) out[i] = load_float(t.dtype, data, i);
        return out;
    }

    Linear load_linear(const std::string &name, int32_t k, int32_t n) const {
        Linear lin;
        lin.name = name;
        lin.k = k;
        lin.n = n;
        lin.keepalive = storage_;
        const std::string kn = "(K = " + std::to_string(k) + ", N = " + std::to_string(n) + ")";
        if (const TensorEntry *bias = find(name + ".bias")) {
            check(*bias, {DType::F16, DType::F32, DType::BF16}, {n}, "([N] " + kn + ")");
            check_finite(*bias);
            const void *data = aligned(*bias);
            auto values = std::make_shared<std::vector<float>>(static_cast<size_t>(n));
            for (size_t i = 0; i < values->size(); ++i) (*values)[i] = load_float(bias->dtype, data, i);
            lin.bias = std::move(values);
        }
        const TensorEntry *qweight = find(name + ".qweight");
        const TensorEntry *weight = find(name + ".weight");
        if (qweight && weight) {
            fail(TL_ERR_FORMAT, "linear " + quoted(name) + " has both a dense " + quoted(name + ".weight") +
                                    " and a quantized " + quoted(name + ".qweight") + "; a linear is one or the other");
        }
        if (weight) {
            for (const char *suffix : {".scales", ".zeros", ".frac4", ".sign_bit", ".k_perm"}) {
                if (find(name + suffix)) {
                    fail(TL_ERR_FORMAT, "tensor " + quoted(name + suffix) + " belongs to a quantized linear, but " +
                                            quoted(name) + " is dense (it has " + quoted(name + ".weight") + ")");
                }
            }
            check(*weight, {DType::F16, DType::F32, DType::BF16}, {n, k}, "([N, K] " + kn + ")");
            check_finite(*weight);
            lin.dense_dtype = weight->dtype;
            lin.dense = aligned(*weight);
            return lin;
        }
        if (!qweight) {
            fail(TL_ERR_FORMAT, "missing tensor " + quoted(name + ".qweight") + " (or " + quoted(name + ".weight") +
                                    " for a dense linear)");
        }
        // The codes' dtype gives the linear's code width: U8 packs two INT4 codes per byte, I8 holds one INT8 code.
        check(*qweight, {DType::U8, DType::I8}, qweight->shape, "");
        const bool int8 = qweight->dtype == DType::I8;
        if (int8) {
            for (const char *suffix : {".zeros", ".frac4", ".sign_bit"}) {
                if (find(name + suffix)) {
                    fail(TL_ERR_FORMAT, "tensor " + quoted(name + suffix) + " belongs to an INT4 linear, but " +
                                            quoted(name) + " is INT8 (its qweight is I8): INT8 weights are symmetric, "
                                            "W = q * s, with no zeros or rounding channels");
                }
            }
            check(*qweight, {DType::I8}, {n, k}, "([N, K] " + kn + ")");
        } else {
            if (k % 2 != 0) {
                fail(TL_ERR_FORMAT, "linear " + quoted(name) + ": K = " + std::to_string(k) +
                                        " is odd; INT4 codes are packed two per byte");
            }
            check(*qweight, {DType::U8}, {n, k / 2}, "([N, K/2] " + kn + ")");
        }

        // The group count comes from the scales' shape; it must agree with the config's group size.
        const TensorEntry &scales = require(name + ".scales");
        const TensorEntry *zeros = int8 ? nullptr : &require(name + ".zeros");
        if (scales.shape.size() != 2 || scales.shape[1] < 1 || k % scales.shape[1] != 0) {
            fail(TL_ERR_FORMAT, "tensor " + quoted(scales.name) + ": shape " + shape_text(scales.shape) +
                                    ", expected [N, G] with G groups dividing K " + kn);
        }
        const int64_t groups = scales.shape[1];
        const int32_t group_size = static_cast<int32_t>(k / groups);
        const int32_t config_group = config_.group_size == 0 ? k : config_.group_size;
        if (group_size != config_group) {
            fail(TL_ERR_FORMAT, "tensor " + quoted(scales.name) + ": " + std::to_string(groups) + " groups of " +
                                    std::to_string(group_size) + " along K = " + std::to_string(k) +
                                    ", but the config's group_size " + std::to_string(config_.group_size) +
                                    " means groups of " + std::to_string(config_group));
        }
        check(scales, {DType::F16}, {n, groups}, "([N, G] " + kn + ")");
        check_finite(scales);
        if (zeros) {
            check(*zeros, {DType::F16}, {n, groups}, "([N, G] " + kn + ")");
            check_finite(*zeros);
        }
        lin.quantized = true;
        lin.bits = int8 ? 8 : 4;
        lin.group_size = group_size;
        lin.codes = qweight->bytes;
        lin.scales = static_cast<const uint16_t *>(aligned(scales));
        lin.zeros = zeros ? static_cast<const uint16_t *>(aligned(*zeros)) : nullptr;
        if (const TensorEntry *frac4 = find(name + ".frac4")) {
            check(*frac4, {DType::U8}, {n, k / 2}, "([N, K/2] " + kn + ")");
            lin.frac4 = frac4->bytes;
        }
        if (const TensorEntry *sign_bit = find(name + ".sign_bit")) {
            if (k % 8 != 0) {
                fail(TL_ERR_FORMAT, "tensor " + quoted(sign_bit->name) + ": K = " + std::to_string(k) +
                                        " is not a multiple of 8, which a sign_bit channel requires");
            }
            check(*sign_bit, {DType::U8}, {n, k / 8}, "([N, K/8] " + kn + ")");
            lin.sign_bit = sign_bit->bytes;
        }
        if (const TensorEntry *k_perm = find(name + ".k_perm")) {
            check(*k_perm, {DType::I32}, {k}, "([K] " + kn + ")");
            lin.k_perm = static_cast<const int32_t *>(aligned(*k_perm));
            // Always checked, whatever validate_values says: a bad index would read outside the activations.
            const std::string why = k_perm_error(lin.k_perm, k);
            if (!why.empty()) fail(TL_ERR_FORMAT, "tensor " + quoted(k_perm->name) + ": " + why +
                                                      "; it must be a permutation of [0, K)");
        }
        return lin;
    }

    void load_block(int32_t pre_index, Block *block) const {
        const std::string prefix = block_prefix(pre_index);
        const int32_t d = config_.d_model, a = config_.attn_dim(), f = config_.ffn;
        block->attn_norm = load_norm(prefix + "attn_norm.weight");
        block->mlp_norm = load_norm(prefix + "mlp_norm.weight");
        block->attn_qkv = load_linear(prefix + "attn_qkv", d, config_.qkv_dim());
        block->attn_out = load_linear(prefix + "attn_out", a, d);
        block->mlp_gate = load_linear(prefix + "mlp_gate", d, f);
        block->mlp_up = load_linear(prefix + "mlp_up", d, f);
        block->mlp_down = load_linear(prefix + "mlp_down", f, d);
    }

    std::unique_ptr<Model> build() const {
        const std::set<std::string> known = known_tensor_names(config_);
        for (const auto &kv : header_.tensors)
            if (!known.count(kv.first)) fail(TL_ERR_FORMAT, "unexpected tensor " + quoted(kv.first));

        auto model = std::make_unique<Model>();
        model->config = config_;
        model->keepalive = storage_;
        const int32_t d = config_.d_model, v = config_.vocab;

        const TensorEntry &embed = require("embed.weight");
        check(embed, {DType::F16, DType::F32, DType::BF16}, {v, d}, "([V, D])");
        check_finite(embed);
        model->embed_dtype = embed.dtype;
        model->embed = aligned(embed);

        model->pre.resize(static_cast<size_t>(config_.pre));
        for (int32_t i = 0; i < config_.pre; ++i) load_block(i, &model->pre[static_cast<size_t>(i)]);
        load_block(-1, &model->loop);
        model->final_norm = load_norm("final_norm.weight");

        bool any_head_tensor = false;
        for (const char *suffix : kLinearSuffixes)
            any_head_tensor = any_head_tensor || find(std::string("head") + suffix);
        if (any_head_tensor) {
            model->head = load_linear("head", d, v);
            model->head_kind = model->head.quantized ? HeadKind::Quantized : HeadKind::Dense;
        } else {
            model->tie_head(storage_);
        }

        if (const Linear *widest = widest_quantized(*model); widest && widest->bits != config_.bits) {
            fail(TL_ERR_FORMAT, "config: bits = " + std::to_string(config_.bits) +
                                    ", but the widest quantized linear " + quoted(widest->name) + " has " +
                                    std::to_string(widest->bits) + "-bit codes (bits must be the widest code width)");
        }
        set_tokenizer(*model, load_tokenizer());
        for (const auto &kv : header_.tensors) model->tensor_bytes += kv.second.end - kv.second.begin;
        model->n_tensors = static_cast<uint32_t>(header_.tensors.size());
        return model;
    }

    // The stored tokenizer: __metadata__ `tokenizer` names its kind and the tensor of that kind holds the file;
    // neither (a file from before tokenizers, or a byte-level model): null.
    std::shared_ptr<const text::Tokenizer> load_tokenizer() const {
        const TensorEntry *json_file = find(kTokenizerJsonTensor), *model_file = find(kTokenizerModelTensor);
        const auto key = header_.metadata.find(kTokenizerKey);
        if (key == header_.metadata.end()) {
            if (json_file || model_file) {
                fail(TL_ERR_FORMAT, "tensor " + quoted(json_file ? kTokenizerJsonTensor : kTokenizerModelTensor) +
                                        " but no __metadata__ " + quoted(kTokenizerKey) + " naming its kind");
            }
            return nullptr;
        }
        const std::string &kind = key->second;
        const bool huggingface = kind == text::kind_name(text::TokenizerKind::HuggingFace);
        if (!huggingface && kind != text::kind_name(text::TokenizerKind::SentencePiece)) {
            fail(TL_ERR_FORMAT, "__metadata__ " + quoted(kTokenizerKey) + " is " + quoted(kind) + ", expected " +
                                    quoted(text::kind_name(text::TokenizerKind::HuggingFace)) + " or " +
                                    quoted(text::kind_name(text::TokenizerKind::SentencePiece)));
        }
        const char *name = huggingface ? kTokenizerJsonTensor : kTokenizerModelTensor;
        const TensorEntry *file = huggingface ? json_file : model_file;
        const TensorEntry *other = huggingface ? model_file : json_file;
        if (other) {
            fail(TL_ERR_FORMAT, "tensor " + quoted(other->name) + " with __metadata__ " + quoted(kTokenizerKey) +
                                    " = " + quoted(kind) + ", whose file is " + quoted(name));
        }
        if (!file) fail(TL_ERR_FORMAT, "__metadata__ " + quoted(kTokenizerKey) + " is " + quoted(kind) +
                                           " but tensor " + quoted(name) + " is missing");
        if (file->dtype != DType::U8 || file->shape.size() != 1) {
            fail(TL_ERR_FORMAT, "tensor " + quoted(name) + ": " + dtype_name(file->dtype) + " " +
                                    shape_text(file->shape) + ", expected U8 [bytes] (the tokenizer file)");
        }
        const std::string bytes(reinterpret_cast<const char *>(file->bytes), file->end - file->begin);
        const auto kind_of = huggingface ? text::TokenizerKind::HuggingFace : text::TokenizerKind::SentencePiece;
        return text::parse_tokenizer(kind_of, bytes, "tensor " + quoted(name));
    }

private:
    Header header_;
    std::shared_ptr<Storage> storage_;
    ModelConfig config_;
    LoadOptions options_;
};

// ---- Config JSON ----

struct IntField {
    const char *name;
    int32_t ModelConfig::*member;
};
struct FloatField {
    const char *name;
    float ModelConfig::*member;
};
constexpr IntField kIntFields[] = {{"d_model", &ModelConfig::d_model},       {"n_heads", &ModelConfig::n_heads},
                                   {"head_dim", &ModelConfig::head_dim},     {"ffn", &ModelConfig::ffn},
                                   {"vocab", &ModelConfig::vocab},           {"pre", &ModelConfig::pre},
                                   {"loops", &ModelConfig::loops},           {"max_seq", &ModelConfig::max_seq},
                                   {"group_size", &ModelConfig::group_size}, {"bits", &ModelConfig::bits}};
constexpr FloatField kFloatFields[] = {{"rope_theta", &ModelConfig::rope_theta}, {"norm_eps", &ModelConfig::norm_eps}};

// The float's shortest round-tripping decimal as a double, so that 1e-5f is stored as 1e-05 and not as the
// double nearest to the float (9.99999974737875e-06); reading it back as float gives the same bits.
double shortest_decimal(float value) {
    char text[32];
    const auto result = std::to_chars(text, text + sizeof text, value);
    double out = value;
    std::from_chars(text, result.ptr, out);
    return out;
}

void check_range(const char *field, int64_t value, int64_t lo, int64_t hi) {
    if (value < lo || value > hi) {
        fail(TL_ERR_FORMAT, std::string("config: ") + field + " = " + std::to_string(value) + " is out of range [" +
                                std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
}

// The config's "rope_scaling" object: "type" and the fields that type reads (model.hpp), under transformers' names.
ordered_json rope_scaling_to_json(const RopeScaling &r) {
    ordered_json j;
    j["type"] = rope_scaling_name(r.type);
    j["factor"] = r.factor;
    if (r.type == RopeScalingType::Llama3) {
        j["low_freq_factor"] = r.low_freq_factor;
        j["high_freq_factor"] = r.high_freq_factor;
    }
    if (r.type != RopeScalingType::Linear) j["original_max_position_embeddings"] = r.original_max_positions;
    if (r.type == RopeScalingType::Yarn) {
        j["beta_fast"] = r.beta_fast;
        j["beta_slow"] = r.beta_slow;
        j["attention_factor"] = r.attention_factor;
        j["truncate"] = r.truncate;
    }
    return j;
}

RopeScaling rope_scaling_from_json(const json &j) {
    if (!j.is_object()) fail(TL_ERR_FORMAT, "config: rope_scaling must be an object, got " + describe_json(j));
    auto field = [&](const char *name) -> const json & {
        const auto it = j.find(name);
        if (it == j.end()) fail(TL_ERR_FORMAT, std::string("config: rope_scaling: missing field '") + name + "'");
        return *it;
    };
    auto number = [&](const char *name) {
        const json &v = field(name);
        if (!v.is_number()) {
            fail(TL_ERR_FORMAT, std::string("config: rope_scaling: field '") + name + "' must be a number, got " +
                                    describe_json(v));
        }
        return v.get<double>();
    };
    RopeScaling r;
    const json &type = field("type");
    const std::string name = type.is_string() ? type.get<std::string>() : "";
    for (RopeScalingType t : {RopeScalingType::Linear, RopeScalingType::Dynamic, RopeScalingType::Llama3,
                              RopeScalingType::Yarn}) {
        if (name == rope_scaling_name(t)) r.type = t;
    }
    if (r.type == RopeScalingType::None) {
        // A short string is shown as written; anything else (a distrusted file's value may be large) by its kind.
        const std::string shown = type.is_string() && name.size() <= 32 ? "'" + name + "'" : describe_json(type);
        fail(TL_ERR_FORMAT, "config: rope_scaling type " + shown +
                                " is not one this library reads (linear, dynamic, llama3, yarn)");
    }
    r.factor = number("factor");
    if (r.type == RopeScalingType::Llama3) {
        r.low_freq_factor = number("low_freq_factor");
        r.high_freq_factor = number("high_freq_factor");
    }
    if (r.type != RopeScalingType::Linear) {
        const json &v = field("original_max_position_embeddings");
        if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > INT32_MAX) {
            fail(TL_ERR_FORMAT, "config: rope_scaling: field 'original_max_position_embeddings' must be a positive "
                                "32-bit integer, got " + describe_json(v));
        }
        r.original_max_positions = static_cast<int32_t>(v.get<int64_t>());
    }
    if (r.type == RopeScalingType::Yarn) {
        r.beta_fast = number("beta_fast");
        r.beta_slow = number("beta_slow");
        r.attention_factor = number("attention_factor");
        const json &v = field("truncate");
        if (!v.is_boolean()) {
            fail(TL_ERR_FORMAT,
                 "config: rope_scaling: field 'truncate' must be true or false, got " + describe_json(v));
        }
        r.truncate = v.get<bool>();
    }
    return r;
}

void validate_rope_scaling(const ModelConfig &c) {
    const RopeScaling &r = c.rope_scaling;
    if (r.type == RopeScalingType::None) return;
    const std::string what = std::string("config: rope_scaling (") + rope_scaling_name(r.type) + "): ";
    auto positive = [&](const char *name, double value) {
        if (!std::isfinite(value) || value <= 0.0) {
            fail(TL_ERR_FORMAT, what + name + " = " + std::to_string(value) + " must be finite and > 0");
        }
    };
    positive("factor", r.factor);
    if (r.type == RopeScalingType::Linear) return;
    if (r.original_max_positions < 1) {
        fail(TL_ERR_FORMAT, what + "original_max_position_embeddings = " + std::to_string(r.original_max_positions) +
                                " must be positive");
    }
    if (r.type == RopeScalingType::Dynamic && c.max_seq > r.original_max_positions) {
        fail(TL_ERR_FORMAT, what + "max_seq = " + std::to_string(c.max_seq) +
                                " exceeds original_max_position_embeddings = " +
                                std::to_string(r.original_max_positions) +
                                ": dynamic NTK scaling changes the frequencies for windows longer than that, and this "
                                "library computes one set of frequencies");
    }
    if (r.type == RopeScalingType::Llama3) {
        positive("low_freq_factor", r.low_freq_factor);
        positive("high_freq_factor", r.high_freq_factor);
        if (r.high_freq_factor <= r.low_freq_factor) {
            fail(TL_ERR_FORMAT, what + "high_freq_factor = " + std::to_string(r.high_freq_factor) +
                                    " must exceed low_freq_factor = " + std::to_string(r.low_freq_factor));
        }
    }
    if (r.type == RopeScalingType::Yarn) {
        positive("beta_fast", r.beta_fast);
        positive("beta_slow", r.beta_slow);
        positive("attention_factor", r.attention_factor);
    }
}

}  // namespace

std::string config_to_json(const ModelConfig &config) {
    ordered_json j;
    for (const IntField &f : kIntFields) j[f.name] = config.*f.member;
    for (const FloatField &f : kFloatFields) j[f.name] = shortest_decimal(config.*f.member);
    if (config.kv_heads() != config.n_heads) j["n_kv_heads"] = config.kv_heads();
    if (config.bos_token_id >= 0) j["bos_token_id"] = config.bos_token_id;  // optional: absent reads as none
    if (config.rope_scaling.type != RopeScalingType::None) {
        j["rope_scaling"] = rope_scaling_to_json(config.rope_scaling);
    }
    return j.dump();
}

ModelConfig config_from_json(const std::string &text) {
    const json j = parse_json(text, kHeaderJsonLimits, "config");
    if (!j.is_object()) fail(TL_ERR_FORMAT, "config is not a JSON object");
    auto field = [&](const char *name) -> const json & {
        const auto it = j.find(name);
        if (it == j.end()) fail(TL_ERR_FORMAT, std::string("config: missing field '") + name + "'");
        return *it;
    };
    ModelConfig config;
    for (const IntField &f : kIntFields) {
        const json &value = field(f.name);
        if (!value.is_number_integer() ||
            (value.is_number_unsigned() ? value.get<uint64_t>() > static_cast<uint64_t>(INT32_MAX)
                                        : value.get<int64_t>() < INT32_MIN || value.get<int64_t>() > INT32_MAX)) {
            fail(TL_ERR_FORMAT,
                 std::string("config: field '") + f.name + "' must be a 32-bit integer, got " + describe_json(value));
        }
        config.*f.member = static_cast<int32_t>(value.get<int64_t>());
    }
    for (const FloatField &f : kFloatFields) {
        const json &value = field(f.name);
        if (!value.is_number()) {
            fail(TL_ERR_FORMAT,
                 std::string("config: field '") + f.name + "' must be a number, got " + describe_json(value));
        }
        config.*f.member = static_cast<float>(value.get<double>());
    }
    const auto kv = j.find("n_kv_heads");  // optional (format_version 2); absent: n_heads
    if (kv != j.end()) {
        if (!kv->is_number_integer() || kv->get<int64_t>() < INT32_MIN || kv->get<int64_t>() > INT32_MAX ||
            (kv->is_number_unsigned() && kv->get<uint64_t>() > static_cast<uint64_t>(INT32_MAX))) {
            fail(TL_ERR_FORMAT, "config: field 'n_kv_heads' must be a 32-bit integer, got " + describe_json(*kv));
        }
        config.n_kv_heads = static_cast<int32_t>(kv->get<int64_t>());
        if (config.n_kv_heads <= 0) {
            fail(TL_ERR_FORMAT, "config: n_kv_heads = " + std::to_string(config.n_kv_heads) + " must be positive");
        }
    }
    const auto bos = j.find("bos_token_id");  // optional: older files and files without one lack it
    if (bos != j.end()) {
        if (!bos->is_number_integer() || bos->get<int64_t>() < 0 || bos->get<int64_t>() > INT32_MAX ||
            (bos->is_number_unsigned() && bos->get<uint64_t>() > static_cast<uint64_t>(INT32_MAX))) {
            fail(TL_ERR_FORMAT, "config: field 'bos_token_id' must be a non-negative 32-bit integer, got " +
                                    describe_json(*bos));
        }
        config.bos_token_id = static_cast<int32_t>(bos->get<int64_t>());
    }
    const auto scaling = j.find("rope_scaling");  // optional (format_version 2)
    if (scaling != j.end()) config.rope_scaling = rope_scaling_from_json(*scaling);
    return config;
}

void validate_config(const ModelConfig &c) {
    check_range("d_model", c.d_model, 1, 65536);
    check_range("n_heads", c.n_heads, 1, 65536);
    check_range("head_dim", c.head_dim, 2, 1024);
    if (c.head_dim % 2 != 0) {
        fail(TL_ERR_FORMAT,
             "config: head_dim = " + std::to_string(c.head_dim) + " is odd (rotary embeddings rotate pairs)");
    }
    const int64_t attn_dim = static_cast<int64_t>(c.n_heads) * c.head_dim;
    if (attn_dim > 65536) {
        fail(TL_ERR_FORMAT, "config: n_heads * head_dim = " + std::to_string(attn_dim) + " exceeds 65536");
    }
    if (c.n_kv_heads < 0 || c.kv_heads() > c.n_heads || c.n_heads % c.kv_heads() != 0) {
        fail(TL_ERR_FORMAT, "config: n_kv_heads = " + std::to_string(c.n_kv_heads) +
                                " must divide n_heads = " + std::to_string(c.n_heads) +
                                " (each K/V head serves n_heads / n_kv_heads query heads)");
    }
    check_range("ffn", c.ffn, 1, int64_t{1} << 20);
    check_range("vocab", c.vocab, 2, int64_t{1} << 22);
    check_range("pre", c.pre, 0, 256);
    check_range("loops", c.loops, 1, 1024);
    check_range("max_seq", c.max_seq, 2, int64_t{1} << 20);
    if (c.bos_token_id < -1 || c.bos_token_id >= c.vocab) {
        fail(TL_ERR_FORMAT, "config: bos_token_id = " + std::to_string(c.bos_token_id) +
                                " is outside the vocabulary [0, " + std::to_string(c.vocab) + ")");
    }
    if (c.bits != 4 && c.bits != 8) {
        fail(TL_ERR_FORMAT, "config: bits = " + std::to_string(c.bits) + " is unsupported (4 or 8)");
    }
    if (c.group_size < 0) fail(TL_ERR_FORMAT, "config: group_size = " + std::to_string(c.group_size) + " is negative");
    if (c.group_size > 0) {
        const std::pair<const char *, int64_t> ks[] = {
            {"d_model", c.d_model}, {"n_heads * head_dim", attn_dim}, {"ffn", c.ffn}};
        for (const auto &k : ks) {
            if (k.second % c.group_size != 0) {
                fail(TL_ERR_FORMAT, "config: group_size = " + std::to_string(c.group_size) + " does not divide " +
                                        k.first + " = " + std::to_string(k.second) + " (a K of the linears)");
            }
        }
    }
    if (!std::isfinite(c.rope_theta) || c.rope_theta <= 0.0f) {
        fail(TL_ERR_FORMAT, "config: rope_theta = " + std::to_string(c.rope_theta) + " must be finite and > 0");
    }
    if (!std::isfinite(c.norm_eps) || c.norm_eps <= 0.0f || c.norm_eps >= 1.0f) {
        fail(TL_ERR_FORMAT, "config: norm_eps = " + std::to_string(c.norm_eps) + " must be finite and in (0, 1)");
    }
    validate_rope_scaling(c);
}

std::unique_ptr<Model> load_model(const std::string &path, const LoadOptions &options) {
    FileBytes file = open_file(path, options.use_mmap);
    try {
        Header header = parse_header(file);
        if (metadata_field(header, "format") != "tinyloop") {
            fail(TL_ERR_FORMAT,
                 "__metadata__ format is " + quoted(metadata_field(header, "format")) + ", expected 'tinyloop'");
        }
        const int32_t version = parse_format_version(metadata_field(header, "format_version"));
        const ModelConfig config = config_from_json(metadata_field(header, "config"));
        validate_config(config);
        parse_tensor_entries(&header);

        auto storage = std::make_shared<Storage>();
        storage->file = file.owner;
        std::unique_ptr<Model> model = ModelReader(std::move(header), storage, config, options).build();
        model->format_version = version;
        model->file_bytes = file.size;
        return model;
    } catch (const Error &e) {
        fail(e.code(), quoted(path) + ": " + e.what());  // every message then says which file
    }
}

SafetensorsFile read_safetensors(const std::string &path, bool use_mmap) {
    FileBytes file = open_file(path, use_mmap);
    try {
        Header header = parse_header(file, /*require_metadata=*/false);
        parse_tensor_entries(&header);
        SafetensorsFile out;
        out.path = path;
        out.metadata = std::move(header.metadata);
        for (auto &kv : header.tensors) {
            TensorEntry &t = kv.second;
            out.tensors.emplace(kv.first, SafetensorsTensor{t.name, t.dtype, std::move(t.shape), t.bytes, t.end - t.begin});
        }
        out.keepalive = file.owner;
        return out;
    } catch (const Error &e) {
        fail(e.code(), quoted(path) + ": " + e.what());
    }
}

void write_safetensors(const std::string &path, const std::map<std::string, std::string> &metadata,
                       const std::vector<TensorView> &tensors) {
    // Wider dtypes first: the data section starts 8-aligned and every size is a multiple of its dtype's
    // size, so each tensor then starts aligned for its dtype, with no padding holes between tensors.
    std::vector<const TensorView *> order;
    for (const TensorView &t : tensors) order.push_back(&t);
    std::stable_sort(order.begin(), order.end(), [](const TensorView *a, const TensorView *b) {
        return dtype_size(a->dtype) > dtype_size(b->dtype);
    });

    ordered_json header;
    if (!metadata.empty()) header[kMetadataKey] = metadata;
    std::set<std::string> names;
    std::vector<uint64_t> sizes;
    uint64_t offset = 0;
    for (const TensorView *t : order) {
        if (t->name.empty() || t->name == kMetadataKey || !names.insert(t->name).second) {
            fail(TL_ERR_INVALID_ARGUMENT,
                 "write_safetensors: tensor name " + quoted(t->name) + " is empty, reserved or repeated");
        }
        uint64_t bytes;
        if (!checked_bytes(t->shape, dtype_size(t->dtype), &bytes)) {
            fail(TL_ERR_INVALID_ARGUMENT,
                 "write_safetensors: tensor " + quoted(t->name) + " has an invalid shape " + shape_text(t->shape));
        }
        if (bytes > 0 && !t->data)
            fail(TL_ERR_INVALID_ARGUMENT, "write_safetensors: tensor " + quoted(t->name) + " has no data");
        header[t->name] = {
            {"dtype", dtype_name(t->dtype)}, {"shape", t->shape}, {"data_offsets", {offset, offset + bytes}}};
        sizes.push_back(bytes);
        offset += bytes;
    }
    std::string text;
    try {
        text = header.dump();
    } catch (const nlohmann::json::exception &e) {
        fail(TL_ERR_INVALID_ARGUMENT,
             std::string("write_safetensors: a name or metadata string is not UTF-8: ") + e.what());
    }
    text.append((8 - text.size() % 8) % 8, ' ');  // 8 + text.size() is then a multiple of 8
    uint8_t length[8];
    for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));

    // A fresh, uniquely named temporary file: mkostemp creates it with O_EXCL, so a link planted at a predictable
    // name is never followed, and concurrent writers of one path never share (and blend) a temporary.
    const size_t slash = path.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
    const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
    const std::string prefix = (slash == std::string::npos ? "" : path.substr(0, slash + 1)) + "." + base + ".";
    std::string tmp_name;
    int fd = -1;
    // The writer holds an exclusive lock on its temporary until it is renamed, so a temporary nobody holds was left
    // by a writer that died, and remove_stale_temporaries may delete it. A cleaner can take a fresh file's lock
    // before its creator does and delete it; the creator then sees no link left and makes another.
    for (;;) {
        tmp_name = prefix + "XXXXXX";
        fd = ::mkostemp(tmp_name.data(), O_CLOEXEC);
        if (fd < 0) break;
        struct stat st;
        if (::flock(fd, LOCK_EX | LOCK_NB) == 0 && ::fstat(fd, &st) == 0 && st.st_nlink > 0) break;
        ::close(fd);
    }
    const std::string &tmp = tmp_name;  // const: on a mutable string, quoted() below would resolve to std::quoted
    if (fd < 0) {
        fail(TL_ERR_IO, "cannot create a temporary file in " + quoted(dir) + " to write " + quoted(path) + ": " +
                            errno_text(errno));
    }
    remove_stale_temporaries(dir, "." + base + ".", tmp);
    // Until the rename succeeds, any failure closes and removes the temporary file.
    struct TmpGuard {
        int fd;
        const std::string &tmp;
        bool committed = false;
        ~TmpGuard() {
            if (fd >= 0) ::close(fd);
            if (!committed) ::unlink(tmp.c_str());
        }
    } guard{fd, tmp};
    // mkostemp makes the file 0600; give it the mode that creating it with open(..., 0644) would have.
    if (::fchmod(fd, 0644 & ~process_umask()) != 0) {
        fail(TL_ERR_IO, "cannot set the mode of " + quoted(tmp) + ": " + errno_text(errno));
    }
    auto write_all = [&](const void *data, uint64_t size) {
        const auto *p = static_cast<const uint8_t *>(data);
        while (size > 0) {
            const ssize_t n = ::write(fd, p, std::min<uint64_t>(size, uint64_t{1} << 30));
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) fail(TL_ERR_IO, "cannot write " + quoted(tmp) + ": " + errno_text(errno));
            p += n;
            size -= static_cast<uint64_t>(n);
        }
    };
    write_all(length, sizeof length);
    write_all(text.data(), text.size());
    for (size_t i = 0; i < order.size(); ++i) write_all(order[i]->data, sizes[i]);
    if (::fsync(fd) != 0) fail(TL_ERR_IO, "cannot sync " + quoted(tmp) + ": " + errno_text(errno));
    // Still open, so still locked, until it has its final name: closing first would let a cleaner take it.
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        fail(TL_ERR_IO, "cannot rename " + quoted(tmp) + " to " + quoted(path) + ": " + errno_text(errno));
    }
    guard.committed = true;
    guard.fd = -1;
    if (::close(fd) != 0) fail(TL_ERR_IO, "wrote " + quoted(path) + " but cannot close it: " + errno_text(errno));
    // The rename is durable only once the directory entry is on disk. EINVAL: the file system cannot sync a
    // directory, and there is nothing more to do.
    const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd < 0) {
        fail(TL_ERR_IO, "wrote " + quoted(path) + " but cannot open its directory " + quoted(dir) + " to sync it: " +
                            errno_text(errno));
    }
    const FdCloser dir_closer{dir_fd};
    if (::fsync(dir_fd) != 0 && errno != EINVAL) {
        fail(TL_ERR_IO, "wrote " + quoted(path) + " but cannot sync its directory " + quoted(dir) + ": " +
                            errno_text(errno));
    }
}

int32_t required_format_version(const Model &model) {
    if (model.config.rope_scaling.type != RopeScalingType::None) return 2;
    if (model.config.kv_heads() != model.config.n_heads) return 2;
    for (const Linear *l : model.linears()) {  // a tied head is the embedding: it has no bias of its own
        if (l->bias) return 2;
    }
    return 1;
}

void save_model(const std::string &path, const Model &model) {
    const ModelConfig &c = model.config;
    validate_config(c);
    const int64_t d = c.d_model, v = c.vocab;
    std::vector<TensorView> views;
    auto need = [](bool ok, const std::string &what) {
        if (!ok) fail(TL_ERR_INVALID_ARGUMENT, "save_model: " + what);
    };
    auto add_norm = [&](const std::string &name, const std::vector<float> &gain) {
        need(gain.size() == static_cast<size_t>(d),
             quoted(name) + " has " + std::to_string(gain.size()) + " values, expected d_model");
        views.push_back({name, DType::F32, {d}, gain.data()});
    };
    auto add_linear = [&](const std::string &name, const Linear &lin, int64_t k, int64_t n) {
        need(lin.k == k && lin.n == n, "linear " + quoted(name) + " is " + std::to_string(lin.k) + "x" +
                                           std::to_string(lin.n) + ", expected K = " + std::to_string(k) +
                                           ", N = " + std::to_string(n));
        if (lin.bias) {
            need(lin.bias->size() == static_cast<size_t>(n), "linear " + quoted(name) + " has a bias of " +
                                                                    std::to_string(lin.bias->size()) + " values, N = " +
                                                                    std::to_string(n));
            views.push_back({name + ".bias", DType::F32, {n}, lin.bias->data()});
        }
        if (!lin.quantized) {
            need(lin.dense != nullptr, "linear " + quoted(name) + " has no data");
            views.push_back({name + ".weight", lin.dense_dtype, {n, k}, lin.dense});
            return;
        }
        const bool int8 = lin.bits == 8;
        need(lin.bits == 4 || int8, "quantized linear " + quoted(name) + " has bits = " + std::to_string(lin.bits) +
                                        " (4 or 8)");
        need(lin.codes && lin.scales && (int8 || lin.zeros) && lin.group_size > 0 && k % lin.group_size == 0,
             "quantized linear " + quoted(name) + " lacks codes/scales/zeros or has a bad group size");
        need(!int8 || (!lin.zeros && !lin.frac4 && !lin.sign_bit),
             "INT8 linear " + quoted(name) + " has zeros or rounding channels (INT8 weights are W = q * s)");
        const int64_t groups = k / lin.group_size;
        views.push_back({name + ".qweight", int8 ? DType::I8 : DType::U8, {n, int8 ? k : k / 2}, lin.codes});
        views.push_back({name + ".scales", DType::F16, {n, groups}, lin.scales});
        if (!int8) views.push_back({name + ".zeros", DType::F16, {n, groups}, lin.zeros});
        if (lin.frac4) views.push_back({name + ".frac4", DType::U8, {n, k / 2}, lin.frac4});
        if (lin.sign_bit) {
            need(k % 8 == 0, "linear " + quoted(name) + " has a sign_bit channel but K = " + std::to_string(k) +
                                 " is not a multiple of 8");
            views.push_back({name + ".sign_bit", DType::U8, {n, k / 8}, lin.sign_bit});
        }
        if (lin.k_perm) {
            const std::string why = k_perm_error(lin.k_perm, lin.k);
            need(why.empty(), "linear " + quoted(name) + ": " + why);
            views.push_back({name + ".k_perm", DType::I32, {k}, lin.k_perm});
        }
    };
    auto add_block = [&](int32_t pre_index, const Block &b) {
        const std::string prefix = block_prefix(pre_index);
        const int64_t a = c.attn_dim(), f = c.ffn;
        add_norm(prefix + "attn_norm.weight", b.attn_norm);
        add_norm(prefix + "mlp_norm.weight", b.mlp_norm);
        add_linear(prefix + "attn_qkv", b.attn_qkv, d, c.qkv_dim());
        add_linear(prefix + "attn_out", b.attn_out, a, d);
        add_linear(prefix + "mlp_gate", b.mlp_gate, d, f);
        add_linear(prefix + "mlp_up", b.mlp_up, d, f);
        add_linear(prefix + "mlp_down", b.mlp_down, f, d);
    };

    if (const Linear *widest = widest_quantized(model); widest && widest->bits != c.bits) {
        need(false, "config.bits = " + std::to_string(c.bits) + ", but the widest quantized linear " +
                        quoted(widest->name) + " has " + std::to_string(widest->bits) + "-bit codes");
    }
    need(model.embed != nullptr, "the model has no embedding");
    views.push_back({"embed.weight", model.embed_dtype, {v, d}, model.embed});
    need(model.pre.size() == static_cast<size_t>(c.pre),
         "the model has " + std::to_string(model.pre.size()) + " pre blocks, config.pre = " + std::to_string(c.pre));
    for (int32_t i = 0; i < c.pre; ++i) add_block(i, model.pre[static_cast<size_t>(i)]);
    add_block(-1, model.loop);
    add_norm("final_norm.weight", model.final_norm);
    if (model.head_kind != HeadKind::Tied) add_linear("head", model.head, d, v);

    std::map<std::string, std::string> metadata = {
        {"format", "tinyloop"}, {"format_version", std::to_string(required_format_version(model))}, {"config", config_to_json(c)}};
    if (model.tokenizer && model.tokenizer->kind() != text::TokenizerKind::Bytes) {
        need(model.tokenizer->n_ids() <= v, "the tokenizer's ids go up to " +
                                                std::to_string(model.tokenizer->n_ids() - 1) +
                                                ", outside the vocabulary [0, " + std::to_string(v) + ")");
        const bool huggingface = model.tokenizer->kind() == text::TokenizerKind::HuggingFace;
        const std::string &file = model.tokenizer->source();
        views.push_back({huggingface ? kTokenizerJsonTensor : kTokenizerModelTensor, DType::U8,
                         {static_cast<int64_t>(file.size())}, file.data()});
        metadata[kTokenizerKey] = text::kind_name(model.tokenizer->kind());
    }
    write_safetensors(path, metadata, views);
}

void set_tokenizer(Model &model, std::shared_ptr<const text::Tokenizer> tokenizer) {
    if (tokenizer && tokenizer->kind() == text::TokenizerKind::Bytes) tokenizer = nullptr;
    if (tokenizer && tokenizer->n_ids() > model.config.vocab) {
        const bool huggingface = tokenizer->kind() == text::TokenizerKind::HuggingFace;
        const char *file = huggingface ? kTokenizerJsonTensor : kTokenizerModelTensor;
        fail(TL_ERR_FORMAT, std::string("the tokenizer (") + file + ") has token ids up to " +
                                std::to_string(tokenizer->n_ids() - 1) + ", outside the model's vocabulary [0, " +
                                std::to_string(model.config.vocab) + ")");
    }
    model.tokenizer = std::move(tokenizer);
}

}  // namespace tl
