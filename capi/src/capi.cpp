// The exported C API: argument validation and one exception barrier per function around the C++ core.
// Nothing here aborts; every failure becomes a tl_status plus the calling thread's error message.

#include "tinyloop.h"

#include <atomic>
#include <chrono>
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "barrier.hpp"
#include "build_info.hpp"
#include "cpu/cpu_forward.hpp"
#include "util/error.hpp"
#include "util/log.hpp"
#include "format/format.hpp"
#include "gpu/gpu_backend.hpp"
#include "handles.hpp"
#include "util/half.hpp"
#include "format/model.hpp"
#include "quant/checkpoint_import.hpp"
#include "quant/int4_import.hpp"
#include "quant/quant.hpp"



namespace {

// ---- Per-thread error message. Out-of-memory is reported without allocating. ----

constexpr const char *kOutOfMemoryMessage = "out of memory";

struct ThreadError {
    std::string text;
    const char *current = "";
};

ThreadError &thread_error() {
    thread_local ThreadError error;
    return error;
}

void clear_error() { thread_error().current = ""; }

void set_error(const char *message) {
    ThreadError &e = thread_error();
    try {
        e.text = message;
        e.current = e.text.c_str();
    } catch (...) {
        e.current = kOutOfMemoryMessage;
    }
}

// Runs `body` behind the barrier: tl::Error keeps its status, bad_alloc is TL_ERR_OUT_OF_MEMORY, anything else
// is TL_ERR_INTERNAL.
template <class Body>
tl_status guarded(Body &&body) noexcept {
    // From inside the log callback: refused, and the thread's message is left to the call that logged.
    if (tl::inside_log_callback()) return TL_ERR_UNSUPPORTED;
    clear_error();
    try {
        body();
        return TL_OK;
    } catch (const tl::Error &e) {
        set_error(e.what());
        return e.code();
    } catch (const std::bad_alloc &) {
        thread_error().current = kOutOfMemoryMessage;
        return TL_ERR_OUT_OF_MEMORY;
    } catch (const std::exception &e) {
        set_error(e.what());
        return TL_ERR_INTERNAL;
    } catch (...) {
        set_error("unknown C++ exception");
        return TL_ERR_INTERNAL;
    }
}

void require(bool ok, const std::string &message) {
    if (!ok) tl::fail(TL_ERR_INVALID_ARGUMENT, message);
}

template <class T>
void require_not_null(const T *p, const char *name) {
    if (p == nullptr) tl::fail(TL_ERR_INVALID_ARGUMENT, std::string(name) + " is NULL");
}

// The size of each struct's first version: the smallest struct_size accepted. A struct that appends fields keeps
// its old size here (tl_score_options gained max_memory_bytes, tl_score_result the setup and capture times, after
// their first versions).
template <class T>
constexpr uint32_t kFirstVersionSize = 0;  // 0: not listed, and the helpers below refuse to compile
template <> constexpr uint32_t kFirstVersionSize<tl_load_options> = sizeof(tl_load_options);
template <> constexpr uint32_t kFirstVersionSize<tl_weight_desc> = sizeof(tl_weight_desc);
template <> constexpr uint32_t kFirstVersionSize<tl_int4_import_desc> = sizeof(tl_int4_import_desc);
template <> constexpr uint32_t kFirstVersionSize<tl_import_options> = sizeof(tl_import_options);
template <> constexpr uint32_t kFirstVersionSize<tl_quantize_options> = sizeof(tl_quantize_options);
template <> constexpr uint32_t kFirstVersionSize<tl_pack_options> = sizeof(tl_pack_options);
template <> constexpr uint32_t kFirstVersionSize<tl_pack_report> = sizeof(tl_pack_report);
template <> constexpr uint32_t kFirstVersionSize<tl_score_options> = offsetof(tl_score_options, max_memory_bytes);
template <> constexpr uint32_t kFirstVersionSize<tl_score_result> = offsetof(tl_score_result, setup_seconds);
template <> constexpr uint32_t kFirstVersionSize<tl_model_properties> = sizeof(tl_model_properties);
template <> constexpr uint32_t kFirstVersionSize<tl_weight_properties> = sizeof(tl_weight_properties);
template <> constexpr uint32_t kFirstVersionSize<tl_device_properties> = sizeof(tl_device_properties);
template <> constexpr uint32_t kFirstVersionSize<tl_dispatch_counts> = sizeof(tl_dispatch_counts);

// The struct sizes an input struct may have: one per version (every struct has at most two today).
template <class T>
bool is_version_size(uint32_t size) {
    static_assert(kFirstVersionSize<T> > 0, "list the struct's first-version size in kFirstVersionSize");
    return size == kFirstVersionSize<T> || size == sizeof(T);
}
template <class T>
std::string version_sizes() {
    return kFirstVersionSize<T> == sizeof(T) ? std::to_string(sizeof(T))
                                              : std::to_string(kFirstVersionSize<T>) + " or " + std::to_string(sizeof(T));
}

// An input struct from the caller, of one of the struct's versions, laid over the defaults its *_init function
// writes, so fields an older caller lacks keep their defaults. `in` may be NULL (all defaults) where `optional`.
template <class T>
T read_input_struct(const T *in, const char *name, tl_status (*init)(T *, uint32_t), bool optional = false) {
    T defaults;
    init(&defaults, sizeof defaults);
    if (in == nullptr && optional) return defaults;
    require_not_null(in, name);
    const uint32_t size = in->struct_size;
    if (!is_version_size<T>(size)) {
        tl::fail(TL_ERR_INVALID_ARGUMENT, std::string(name) + "->struct_size is " + std::to_string(size) +
                                              ", expected " + version_sizes<T>() + " (use the _init function)");
    }
    std::memcpy(&defaults, in, size);
    defaults.struct_size = sizeof(T);
    return defaults;
}

// An output struct of the caller's: any struct_size from the first version on. A caller built against an older
// header gets the fields it knows; one built against a newer, larger header gets every field this library knows,
// and its struct_size is set to the bytes written so it can tell which fields hold values.
template <class T>
void require_output_struct(const T *out, const char *name) {
    static_assert(kFirstVersionSize<T> > 0, "list the struct's first-version size in kFirstVersionSize");
    require_not_null(out, name);
    if (out->struct_size < kFirstVersionSize<T>) {
        tl::fail(TL_ERR_INVALID_ARGUMENT, std::string(name) + "->struct_size is " + std::to_string(out->struct_size) +
                                              ", expected at least " + std::to_string(kFirstVersionSize<T>) +
                                              " (set it to sizeof the struct)");
    }
}
template <class T>
void write_output_struct(T *out, T value) {
    const uint32_t size = std::min<uint32_t>(out->struct_size, sizeof(T));
    value.struct_size = size;
    std::memcpy(out, &value, size);
}

// Shared body of the *_init functions. The defaults are built in a full local struct and only the caller's
// struct_size bytes are copied out, so a caller compiled against an older, smaller struct is never overrun.
template <class T, class SetDefaults>
tl_status init_struct(T *out, uint32_t struct_size, const char *name, SetDefaults set_defaults) {
    return guarded([&] {
        static_assert(kFirstVersionSize<T> > 0, "list the struct's first-version size in kFirstVersionSize");
        require_not_null(out, name);
        if (!is_version_size<T>(struct_size)) {
            tl::fail(TL_ERR_INVALID_ARGUMENT, "struct_size is " + std::to_string(struct_size) + ", expected " +
                                                  version_sizes<T>() + " (pass sizeof(*" + name + "))");
        }
        T full;
        std::memset(&full, 0, sizeof full);
        set_defaults(full);
        full.struct_size = struct_size;
        std::memcpy(out, &full, struct_size);
    });
}

int32_t bool_flag(int32_t v, const char *name) {
    require(v == 0 || v == 1, std::string(name) + " must be 0 or 1, got " + std::to_string(v));
    return v;
}

bool all_finite_half(const uint16_t *p, size_t count, const char *what, std::string *message) {
    for (size_t i = 0; i < count; ++i) {
        if ((p[i] & 0x7C00u) == 0x7C00u) {
            *message = std::string(what) + "[" + std::to_string(i) + "] is not finite";
            return false;
        }
    }
    return true;
}

const char *build_info_json() {
    static const std::string text = [] {
        nlohmann::json info;
        info["version"] = tl_version_string();
        info["compiler"] = TL_BUILD_COMPILER;
        info["build_type"] = TL_BUILD_TYPE;
#if defined(TL_WITH_CUDA)
        info["cuda"] = true;
        info["cuda_version"] = TL_BUILD_CUDA_VERSION;
#else
        info["cuda"] = false;
        info["cuda_version"] = nullptr;
#endif
        nlohmann::json archs = nlohmann::json::array();
        const std::string list = TL_BUILD_CUDA_ARCHS;
        size_t start = 0;
        while (start < list.size()) {
            size_t end = list.find(',', start);
            if (end == std::string::npos) end = list.size();
            if (end > start) archs.push_back(std::stoi(list.substr(start, end - start)));
            start = end + 1;
        }
        info["cuda_architectures"] = archs;
        return info.dump();
    }();
    return text.c_str();
}


}  // namespace


// =============================================================================================================
extern "C" {

TL_API const char *tl_status_string(tl_status status) {
    switch (status) {
        case TL_OK: return "ok";
        case TL_ERR_INVALID_ARGUMENT: return "invalid argument";
        case TL_ERR_OUT_OF_MEMORY: return "out of memory";
        case TL_ERR_IO: return "I/O error";
        case TL_ERR_FORMAT: return "malformed model file";
        case TL_ERR_UNSUPPORTED: return "unsupported";
        case TL_ERR_NO_DEVICE: return "no CUDA device";
        case TL_ERR_CUDA: return "CUDA error";
        case TL_ERR_INTERNAL: return "internal error";
        case TL_ERR_BUFFER_TOO_SMALL: return "buffer too small";
        case TL_ERR_NOT_FOUND: return "not found";
        case TL_ERR_CANCELLED: return "cancelled";
        default: return "unknown status";
    }
}

TL_API const char *tl_last_error_message(void) { return thread_error().current; }

TL_API uint32_t tl_version(void) {
    return (TL_VERSION_MAJOR << 16) | (TL_VERSION_MINOR << 8) | TL_VERSION_PATCH;
}

TL_API const char *tl_version_string(void) {
#define TL_STR2(x) #x
#define TL_STR(x) TL_STR2(x)
    return TL_STR(TL_VERSION_MAJOR) "." TL_STR(TL_VERSION_MINOR) "." TL_STR(TL_VERSION_PATCH);
#undef TL_STR
#undef TL_STR2
}

TL_API const char *tl_build_info(void) {
    try {
        return build_info_json();
    } catch (...) {
        return "{}";
    }
}

TL_API tl_status tl_set_log_callback(tl_log_fn callback, void *user_data, int32_t max_level) {
    return guarded([&] {
        require(max_level >= TL_LOG_ERROR && max_level <= TL_LOG_DEBUG,
                "max_level must be TL_LOG_ERROR..TL_LOG_DEBUG, got " + std::to_string(max_level));
        tl::set_log_callback(callback, user_data, max_level);
    });
}

// ---- Models ----

TL_API tl_status tl_load_options_init(tl_load_options *options, uint32_t struct_size) {
    return init_struct(options, struct_size, "options", [](tl_load_options &o) {
        o.use_mmap = 1;
        o.validate_values = 1;
    });
}

TL_API tl_status tl_model_load(const char *path, const tl_load_options *options, tl_model **out_model) {
    return guarded([&] {
        require_not_null(out_model, "out_model");
        *out_model = nullptr;
        require_not_null(path, "path");
        tl::LoadOptions load;
        const tl_load_options o = read_input_struct(options, "options", tl_load_options_init, true);
        load.use_mmap = bool_flag(o.use_mmap, "options->use_mmap") != 0;
        load.validate_values = bool_flag(o.validate_values, "options->validate_values") != 0;
        auto handle = std::make_unique<tl_model>();
        handle->model = tl::load_model(path, load);
        for (const tl::Linear *linear : handle->model->linears()) {
            if (!linear->quantized) continue;
            auto w = std::make_unique<tl_weight>();
            w->linear = *linear;
            w->borrowed = true;
            handle->weight_index.emplace(linear->name, handle->weights.size());
            handle->weights.push_back(std::move(w));
        }
        *out_model = handle.release();
    });
}

TL_API void tl_model_free(tl_model *model) { delete model; }

TL_API tl_status tl_model_info(const tl_model *model, tl_model_properties *out) {
    return guarded([&] {
        require_not_null(model, "model");
        require_output_struct(out, "out");
        const tl::Model &m = *model->model;
        const tl::ModelConfig &c = m.config;
        tl_model_properties p;
        std::memset(&p, 0, sizeof p);
        p.struct_size = sizeof p;
        p.format_version = m.format_version;
        p.d_model = c.d_model;
        p.n_heads = c.n_heads;
        p.head_dim = c.head_dim;
        p.ffn = c.ffn;
        p.vocab = c.vocab;
        p.n_pre = c.pre;
        p.n_loops = c.loops;
        p.max_seq = c.max_seq;
        p.group_size = c.group_size;
        p.bits = c.bits;
        p.rope_theta = c.rope_theta;
        p.norm_eps = c.norm_eps;
        p.n_tensors = m.n_tensors;
        p.head_kind = m.head_kind == tl::HeadKind::Quantized ? 1 : m.head_kind == tl::HeadKind::Dense ? 0 : 2;
        p.file_bytes = m.file_bytes;
        p.tensor_bytes = m.tensor_bytes;
        uint64_t params = static_cast<uint64_t>(c.vocab) * c.d_model + static_cast<uint64_t>(c.d_model) *
                                                                            (2 * (m.pre.size() + 1) + 1);
        for (const tl::Linear *linear : m.linears()) {
            params += static_cast<uint64_t>(linear->k) * linear->n;
            if (linear->quantized) {
                ++p.n_quant_weights;
                p.quant_weight_bytes += linear->quant_bytes();
                if (linear->frac4 != nullptr) p.has_frac4 = 1;
                if (linear->sign_bit != nullptr) p.has_sign_bit = 1;
            } else {
                ++p.n_dense_linears;
            }
        }
        p.parameter_count = params;
        write_output_struct(out, p);
    });
}

TL_API tl_status tl_model_weight_count(const tl_model *model, size_t *out_count) {
    return guarded([&] {
        require_not_null(model, "model");
        require_not_null(out_count, "out_count");
        *out_count = model->weights.size();
    });
}

TL_API tl_status tl_model_weight_at(const tl_model *model, size_t index, const tl_weight **out_weight) {
    return guarded([&] {
        require_not_null(model, "model");
        require_not_null(out_weight, "out_weight");
        if (index >= model->weights.size()) {
            tl::fail(TL_ERR_NOT_FOUND, "weight index " + std::to_string(index) + " is out of range (the model has " +
                                           std::to_string(model->weights.size()) + " quantized weights)");
        }
        *out_weight = model->weights[index].get();
    });
}

TL_API tl_status tl_model_find_weight(const tl_model *model, const char *name, const tl_weight **out_weight) {
    return guarded([&] {
        require_not_null(model, "model");
        require_not_null(name, "name");
        require_not_null(out_weight, "out_weight");
        const auto it = model->weight_index.find(name);
        if (it == model->weight_index.end()) {
            tl::fail(TL_ERR_NOT_FOUND, std::string("the model has no quantized weight named '") + name + "'");
        }
        *out_weight = model->weights[it->second].get();
    });
}

// ---- Weights ----

TL_API tl_status tl_weight_desc_init(tl_weight_desc *desc, uint32_t struct_size) {
    return init_struct(desc, struct_size, "desc", [](tl_weight_desc &d) { d.bits = 4; });
}

}  // extern "C"

namespace {

// Shared checks of tl_weight_create and tl_weight_quantize; returns the actual group size.
int32_t check_weight_shape(int32_t k, int32_t n, int32_t group_size, int32_t bits, const char *prefix) {
    const std::string p(prefix);
    require(bits == 4, p + "bits must be 4, got " + std::to_string(bits));
    require(k > 0 && k % 2 == 0 && k <= (1 << 20), p + "k must be even and in [2, 2^20], got " + std::to_string(k));
    require(n > 0 && n <= (1 << 24), p + "n must be in [1, 2^24], got " + std::to_string(n));
    require(group_size >= 0, p + "group_size must be >= 0, got " + std::to_string(group_size));
    const int32_t gs = group_size == 0 ? k : group_size;
    require(k % gs == 0,
            p + "group_size " + std::to_string(group_size) + " does not divide k = " + std::to_string(k));
    return gs;
}

}  // namespace

extern "C" {

TL_API tl_status tl_weight_create(const tl_weight_desc *desc, tl_weight **out_weight) {
    return guarded([&] {
        require_not_null(out_weight, "out_weight");
        *out_weight = nullptr;
        const tl_weight_desc desc_copy = read_input_struct(desc, "desc", tl_weight_desc_init);
        desc = &desc_copy;
        const int32_t gs = check_weight_shape(desc->k, desc->n, desc->group_size, desc->bits, "desc->");
        require_not_null(desc->codes, "desc->codes");
        require_not_null(desc->scales, "desc->scales");
        require_not_null(desc->zeros, "desc->zeros");
        require(desc->sign_bit == nullptr || desc->k % 8 == 0,
                "desc->sign_bit needs k divisible by 8, got k = " + std::to_string(desc->k));
        const size_t k = static_cast<size_t>(desc->k), n = static_cast<size_t>(desc->n);
        const size_t groups = n * (k / static_cast<size_t>(gs));
        std::string message;
        if (!all_finite_half(desc->scales, groups, "desc->scales", &message) ||
            !all_finite_half(desc->zeros, groups, "desc->zeros", &message)) {
            tl::fail(TL_ERR_INVALID_ARGUMENT, message);
        }
        tl::QuantizedMatrix m;
        m.k = desc->k;
        m.n = desc->n;
        m.group_size = gs;
        m.bits = 4;
        m.codes.assign(desc->codes, desc->codes + n * k / 2);
        m.scales.assign(desc->scales, desc->scales + groups);
        m.zeros.assign(desc->zeros, desc->zeros + groups);
        if (desc->frac4 != nullptr) m.frac4.assign(desc->frac4, desc->frac4 + n * k / 2);
        if (desc->sign_bit != nullptr) m.sign_bit.assign(desc->sign_bit, desc->sign_bit + n * k / 8);
        auto w = std::make_unique<tl_weight>();
        w->linear = tl::make_quantized_linear(desc->name != nullptr ? desc->name : "", std::move(m));
        *out_weight = w.release();
    });
}

TL_API tl_status tl_int4_import_desc_init(tl_int4_import_desc *desc, uint32_t struct_size) {
    return init_struct(desc, struct_size, "desc", [](tl_int4_import_desc &d) { d.layout = TL_INT4_LAYOUT_GPTQ; });
}

TL_API tl_status tl_weight_import_int4(const tl_int4_import_desc *desc, tl_weight **out_weight) {
    return guarded([&] {
        require_not_null(out_weight, "out_weight");
        *out_weight = nullptr;
        const tl_int4_import_desc d = read_input_struct(desc, "desc", tl_int4_import_desc_init);
        require(d.layout == TL_INT4_LAYOUT_GPTQ || d.layout == TL_INT4_LAYOUT_AWQ,
                "desc->layout must be TL_INT4_LAYOUT_GPTQ or TL_INT4_LAYOUT_AWQ, got " + std::to_string(d.layout));
        tl::Int4Checkpoint checkpoint;
        checkpoint.layout = d.layout == TL_INT4_LAYOUT_GPTQ ? tl::Int4Layout::Gptq : tl::Int4Layout::Awq;
        checkpoint.k = d.k;
        checkpoint.n = d.n;
        checkpoint.group_size = d.group_size;
        checkpoint.qweight = d.qweight;
        checkpoint.qzeros = d.qzeros;
        checkpoint.scales = d.scales;
        checkpoint.g_idx = d.g_idx;
        checkpoint.field_prefix = "desc->";
        auto w = std::make_unique<tl_weight>();
        w->linear = tl::make_quantized_linear(d.name != nullptr ? d.name : "", tl::import_int4(checkpoint));
        *out_weight = w.release();
    });
}

TL_API tl_status tl_import_options_init(tl_import_options *options, uint32_t struct_size) {
    return init_struct(options, struct_size, "options", [](tl_import_options &o) {
        o.use_mmap = 1;
        o.validate_values = 1;
    });
}

TL_API tl_status tl_model_import_checkpoint(const char *dir, const char *out_path, const tl_import_options *options) {
    return guarded([&] {
        require_not_null(dir, "dir");
        require_not_null(out_path, "out_path");
        const tl_import_options o = read_input_struct(options, "options", tl_import_options_init, true);
        require(o.max_seq >= 0, "options->max_seq must be >= 0 (0 = config.json's max_position_embeddings), got " +
                                    std::to_string(o.max_seq));
        tl::CheckpointImportOptions import;
        import.max_seq = o.max_seq;
        import.use_mmap = bool_flag(o.use_mmap, "options->use_mmap") != 0;
        import.validate_values = bool_flag(o.validate_values, "options->validate_values") != 0;
        tl::import_checkpoint_to_file(dir, out_path, import);
    });
}

TL_API tl_status tl_quantize_options_init(tl_quantize_options *options, uint32_t struct_size) {
    return init_struct(options, struct_size, "options", [](tl_quantize_options &o) {
        o.method = TL_QUANT_ASYMMETRIC;
        o.group_size = 0;
        o.bits = 4;
    });
}

TL_API tl_status tl_weight_quantize(const float *w, int32_t k, int32_t n, const tl_quantize_options *options,
                                    tl_weight **out_weight) {
    return guarded([&] {
        require_not_null(out_weight, "out_weight");
        *out_weight = nullptr;
        require_not_null(w, "w");
        const tl_quantize_options opts = read_input_struct(options, "options", tl_quantize_options_init, true);
        require(opts.method == TL_QUANT_ASYMMETRIC || opts.method == TL_QUANT_SYMMETRIC,
                "options->method must be TL_QUANT_ASYMMETRIC or TL_QUANT_SYMMETRIC, got " + std::to_string(opts.method));
        check_weight_shape(k, n, opts.group_size, opts.bits, "");
        const size_t count = static_cast<size_t>(k) * static_cast<size_t>(n);
        for (size_t i = 0; i < count; ++i) {
            if (!std::isfinite(w[i])) tl::fail(TL_ERR_INVALID_ARGUMENT, "w[" + std::to_string(i) + "] is not finite");
        }
        auto weight = std::make_unique<tl_weight>();
        weight->linear = tl::make_quantized_linear(
            "", tl::quantize_minmax(w, k, n, opts.group_size,
                                    opts.method == TL_QUANT_SYMMETRIC ? tl::QuantMethod::Symmetric
                                                                      : tl::QuantMethod::Asymmetric));
        *out_weight = weight.release();
    });
}

TL_API void tl_weight_free(tl_weight *weight) {
    if (weight != nullptr && !weight->borrowed) delete weight;
}

TL_API tl_status tl_weight_info(const tl_weight *weight, tl_weight_properties *out) {
    return guarded([&] {
        require_not_null(weight, "weight");
        require_output_struct(out, "out");
        const tl::Linear &l = weight->linear;
        tl_weight_properties p;
        std::memset(&p, 0, sizeof p);
        p.struct_size = sizeof p;
        p.k = l.k;
        p.n = l.n;
        p.group_size = l.group_size;
        p.n_groups = l.n_groups();
        p.bits = l.bits;
        p.has_frac4 = l.frac4 != nullptr;
        p.has_sign_bit = l.sign_bit != nullptr;
        p.borrowed = weight->borrowed;
        p.bytes = l.quant_bytes();
        p.name = l.name.c_str();
        write_output_struct(out, p);
    });
}

TL_API tl_status tl_weight_dequantize(const tl_weight *weight, float *out, size_t out_len) {
    return guarded([&] {
        require_not_null(weight, "weight");
        require_not_null(out, "out");
        const tl::Linear &l = weight->linear;
        const size_t needed = static_cast<size_t>(l.k) * static_cast<size_t>(l.n);
        if (out_len < needed) {
            tl::fail(TL_ERR_BUFFER_TOO_SMALL, "out_len is " + std::to_string(out_len) + ", the weight needs k*n = " +
                                                  std::to_string(needed) + " floats");
        }
        tl::dequantize_rows(l, 0, l.n, out);
    });
}

// ---- GPU ----

TL_API tl_status tl_device_count(int32_t *out_count) {
    return guarded([&] {
        require_not_null(out_count, "out_count");
        *out_count = tl::device_count();
    });
}

TL_API tl_status tl_device_info(int32_t device, tl_device_properties *out) {
    return guarded([&] {
        require_output_struct(out, "out");
        const tl::DeviceProperties d = tl::device_info(device);
        tl_device_properties p;
        std::memset(&p, 0, sizeof p);
        std::memcpy(p.name, d.name.data(), std::min(sizeof p.name - 1, d.name.size()));
        p.sm_major = d.sm_major;
        p.sm_minor = d.sm_minor;
        p.sm_count = d.sm_count;
        p.total_memory = d.total_memory;
        p.free_memory = d.free_memory;
        p.marlin_supported = d.marlin_supported;
        write_output_struct(out, p);
    });
}

TL_API tl_status tl_pack_options_init(tl_pack_options *options, uint32_t struct_size) {
    return init_struct(options, struct_size, "options",
                       [](tl_pack_options &o) { o.forms = TL_FORM_MARLIN_FUSED | TL_FORM_MARLIN_CORRECTION; });
}

TL_API tl_status tl_pack_report_init(tl_pack_report *report, uint32_t struct_size) {
    return init_struct(report, struct_size, "report", [](tl_pack_report &) {});
}

}  // extern "C"

namespace {

tl_pack_options pack_options_or_defaults(const tl_pack_options *options) {
    const tl_pack_options opts = read_input_struct(options, "options", tl_pack_options_init, true);
    const uint32_t known = TL_FORM_MARLIN_FUSED | TL_FORM_MARLIN_CORRECTION | TL_FORM_FP16_BODY;
    require((opts.forms & ~known) == 0, "options->forms has unknown bits: " + std::to_string(opts.forms & ~known));
    return opts;
}

// Packs `weights` all-or-nothing: the new device forms replace the old ones only once every weight succeeded.
void pack_weights(const std::vector<tl_weight *> &weights, const tl_pack_options &opts, tl_pack_report *out_report) {
    if (out_report != nullptr) require_output_struct(out_report, "out_report");
    tl_pack_report report;
    tl_pack_report_init(&report, sizeof report);
    std::vector<std::shared_ptr<tl::DeviceWeight>> packed;
    for (const tl_weight *w : weights) {
        tl::PackOutcome outcome;
        packed.push_back(tl::pack_weight(w->linear, opts.device, opts.stream, opts.forms, &outcome));
        ++report.weights_uploaded;
        report.weights_packed += outcome.packed;
        report.weights_not_packable += !outcome.packable;
        report.device_bytes += outcome.device_bytes;
        report.extra_device_bytes += outcome.extra_device_bytes;
    }
    for (size_t i = 0; i < weights.size(); ++i) weights[i]->device = std::move(packed[i]);
    tl::log(TL_LOG_INFO, "[pack] " + std::to_string(report.weights_packed) + " of " +
                             std::to_string(report.weights_uploaded) + " weights packed for the Marlin-class kernel, " +
                             std::to_string(report.extra_device_bytes) + " extra device bytes");
    if (out_report != nullptr) write_output_struct(out_report, report);
}

const tl::DeviceWeight &packed_weight(const tl_weight *weight) {
    require_not_null(weight, "weight");
    if (!weight->device) {
        if (tl::device_count() == 0) tl::fail(TL_ERR_NO_DEVICE, "no usable CUDA device (or no CUDA in this build)");
        tl::fail(TL_ERR_INVALID_ARGUMENT, "weight '" + weight->linear.name +
                                              "' is not on a device: call tl_pack_marlin / tl_weight_pack_marlin first");
    }
    return *weight->device;
}

// The model's GpuModel on `device`, created (uploaded and packed) on first use. Packing forms follow the dispatcher
// settings at creation: the FP16 body only when that path is enabled (it costs 2 bytes per weight).
// `setup_seconds`, when not null, receives the time this call spent creating the GpuModel (0 when it existed).
tl::GpuModel &gpu_model_for(const tl_model &model, int32_t device, double *setup_seconds = nullptr) {
    std::lock_guard<std::mutex> lock(model.gpu_mutex);
    std::unique_ptr<tl::GpuModel> &slot = model.gpu_models[device];
    if (!slot) {
        const auto start = std::chrono::steady_clock::now();
        tl::GpuModelOptions options;
        if (tl::get_dispatch(TL_DISPATCH_FP16_BODY)) options.forms |= TL_FORM_FP16_BODY;
        try {
            slot = std::make_unique<tl::GpuModel>(*model.model, device, options);
        } catch (...) {
            model.gpu_models.erase(device);
            throw;
        }
        if (setup_seconds != nullptr) {
            *setup_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        }
    }
    return *slot;
}

}  // namespace

extern "C" {

TL_API tl_status tl_pack_marlin(tl_model *model, const tl_pack_options *options, tl_pack_report *out_report) {
    return guarded([&] {
        require_not_null(model, "model");
        const tl_pack_options opts = pack_options_or_defaults(options);
        std::vector<tl_weight *> weights;
        for (auto &w : model->weights) weights.push_back(w.get());
        pack_weights(weights, opts, out_report);
    });
}

TL_API tl_status tl_weight_pack_marlin(tl_weight *weight, const tl_pack_options *options,
                                       tl_pack_report *out_report) {
    return guarded([&] {
        require_not_null(weight, "weight");
        require(!weight->borrowed, "weight '" + weight->linear.name +
                                       "' belongs to a model: pack the model with tl_pack_marlin instead");
        pack_weights({weight}, pack_options_or_defaults(options), out_report);
    });
}

TL_API tl_status tl_set_dispatch(int32_t setting, int32_t value) {
    return guarded([&] { tl::set_dispatch(setting, value); });
}

TL_API tl_status tl_get_dispatch(int32_t setting, int32_t *out_value) {
    return guarded([&] {
        require_not_null(out_value, "out_value");
        *out_value = tl::get_dispatch(setting);
    });
}

TL_API tl_status tl_device_malloc(int32_t device, size_t bytes, void **out_ptr) {
    return guarded([&] {
        require_not_null(out_ptr, "out_ptr");
        *out_ptr = tl::device_malloc(device, bytes);
    });
}

TL_API tl_status tl_device_free(void *ptr, void *stream) {
    return guarded([&] { tl::device_free(ptr, stream); });
}

TL_API tl_status tl_memcpy(void *dst, const void *src, size_t bytes, void *stream) {
    return guarded([&] { tl::memcpy_any(dst, src, bytes, stream); });
}

TL_API tl_status tl_memset_device(void *dst, int32_t value, size_t bytes, void *stream) {
    return guarded([&] { tl::memset_device(dst, value, bytes, stream); });
}

TL_API tl_status tl_stream_create(int32_t device, void **out_stream) {
    return guarded([&] {
        require_not_null(out_stream, "out_stream");
        *out_stream = tl::stream_create(device);
    });
}

TL_API tl_status tl_stream_destroy(void *stream) {
    return guarded([&] { tl::stream_destroy(stream); });
}

TL_API tl_status tl_stream_synchronize(void *stream) {
    return guarded([&] { tl::stream_synchronize(stream); });
}

TL_API tl_status tl_quant_gemm_workspace_size(const tl_weight *weight, int64_t m, size_t *out_bytes) {
    return guarded([&] {
        require_not_null(out_bytes, "out_bytes");
        *out_bytes = tl::quant_gemm_workspace_size(packed_weight(weight), m);
    });
}

TL_API tl_status tl_quant_gemm(const tl_weight *weight, const void *x, void *y, int64_t m, void *stream,
                               void *workspace, size_t workspace_bytes) {
    return tl_quant_gemm_dtype(weight, TL_DTYPE_FP16, x, y, m, stream, workspace, workspace_bytes);
}

TL_API tl_status tl_quant_gemm_dtype(const tl_weight *weight, int32_t dtype, const void *x, void *y, int64_t m,
                                     void *stream, void *workspace, size_t workspace_bytes) {
    return guarded([&] {
        // Checked here, not cast blindly: an out-of-range value must not become an enum value the backend assumes.
        if (dtype != TL_DTYPE_FP16 && dtype != TL_DTYPE_BF16) {
            tl::fail(TL_ERR_INVALID_ARGUMENT,
                     "dtype must be TL_DTYPE_FP16 (0) or TL_DTYPE_BF16 (1), got " + std::to_string(dtype));
        }
        tl::quant_gemm(packed_weight(weight), x, y, m, dtype == TL_DTYPE_BF16 ? tl::Dtype::BF16 : tl::Dtype::F16,
                       stream, workspace, workspace_bytes);
    });
}

TL_API tl_status tl_weight_dispatch_counts(const tl_weight *weight, tl_dispatch_counts *out) {
    return guarded([&] {
        require_output_struct(out, "out");
        const tl::DispatchCounts d = tl::dispatch_counts(packed_weight(weight));
        tl_dispatch_counts c;
        std::memset(&c, 0, sizeof c);
        c.fp16_body = d.fp16_body;
        c.marlin_fused = d.marlin_fused;
        c.marlin_correction = d.marlin_correction;
        c.dequant_cublas = d.dequant_cublas;
        c.native = d.native;
        c.fallbacks = d.fallbacks;
        write_output_struct(out, c);
    });
}

// ---- Scoring ----

TL_API tl_status tl_score_options_init(tl_score_options *options, uint32_t struct_size) {
    return init_struct(options, struct_size, "options", [](tl_score_options &o) {
        o.backend = TL_BACKEND_AUTO;
        o.use_graphs = 1;
    });
}

TL_API tl_status tl_score_result_init(tl_score_result *result, uint32_t struct_size) {
    return init_struct(result, struct_size, "result", [](tl_score_result &) {});
}

}  // extern "C"

namespace {

// The options tl_score and tl_score_batch share, read (NULL: the defaults) and checked: threads, backend, graphs, and
// a CUDA backend that this build or machine lacks (TL_ERR_NO_DEVICE).
tl_score_options read_score_options(const tl_score_options *options) {
    const tl_score_options opts = read_input_struct(options, "options", tl_score_options_init, true);
    require(opts.n_threads >= 0 && opts.n_threads <= 1024,
            "options->n_threads must be in [0, 1024], got " + std::to_string(opts.n_threads));
    require(opts.backend == TL_BACKEND_AUTO || opts.backend == TL_BACKEND_CPU || opts.backend == TL_BACKEND_CUDA,
            "options->backend must be TL_BACKEND_AUTO, TL_BACKEND_CPU or TL_BACKEND_CUDA, got " +
                std::to_string(opts.backend));
    require(opts.use_graphs == 0 || opts.use_graphs == 1,
            "options->use_graphs must be 0 or 1, got " + std::to_string(opts.use_graphs));
    if (opts.backend == TL_BACKEND_CUDA && tl::device_count() == 0) {
#if defined(TL_WITH_CUDA)
        tl::fail(TL_ERR_NO_DEVICE, "backend CUDA requested but no CUDA device is usable");
#else
        tl::fail(TL_ERR_NO_DEVICE, "backend CUDA requested but this build has no CUDA support");
#endif
    }
    return opts;
}

// Fails with TL_ERR_BUFFER_TOO_SMALL when the options' token_nll (if any) holds fewer than `needed` floats; `what`
// says what `needed` counts.
void require_token_nll_room(const tl_score_options &opts, size_t needed, const char *what) {
    if (opts.token_nll != nullptr && opts.token_nll_len < needed) {
        tl::fail(TL_ERR_BUFFER_TOO_SMALL, "options->token_nll_len is " + std::to_string(opts.token_nll_len) +
                                              ", needs " + what + " = " + std::to_string(needed));
    }
}

// The core's options for checked C options; progress goes to the C callback (non-zero: stop).
tl::ScoreOptions core_score_options(const tl_score_options &opts) {
    tl::ScoreOptions score;
    score.n_threads = opts.n_threads;
    score.window = opts.window;
    score.token_nll = opts.token_nll;
    score.cross_iter_round = tl::get_dispatch(TL_DISPATCH_CROSS_ITER_ROUND) != 0;
    score.use_graphs = opts.use_graphs != 0;
    score.max_memory_bytes = opts.max_memory_bytes;
    if (opts.progress != nullptr) {
        const tl_progress_fn fn = opts.progress;
        void *user = opts.progress_user_data;
        score.progress = [fn, user](uint64_t done, uint64_t total) { return fn(user, done, total) == 0; };
    }
    return score;
}

// Whether checked options send a request to the GPU: TL_BACKEND_CUDA, or AUTO where there is a device.
bool wants_gpu(const tl_score_options &opts) {
    return opts.backend == TL_BACKEND_CUDA || (opts.backend == TL_BACKEND_AUTO && tl::device_count() > 0);
}

// Runs a scoring request and reports it: on the GPU where the options want it, `on_gpu(gpu_model, &stats)` with this
// call's GEMM counts going into the result (AUTO takes the CPU when the GPU path declines with TL_ERR_UNSUPPORTED;
// other failures stand), else `on_cpu()`. The result gets the totals, perplexity, backend, windows and the seconds
// since `start`; `what` names the request in the log.
tl_score_result run_score(const tl_model &model, const tl_score_options &opts, const char *what,
                          std::chrono::steady_clock::time_point start,
                          const std::function<tl::ScoreResult(tl::GpuModel &, tl::GpuScoreStats *)> &on_gpu,
                          const std::function<tl::ScoreResult()> &on_cpu) {
    tl_score_result result;
    std::memset(&result, 0, sizeof result);
    result.struct_size = sizeof result;
    tl::ScoreResult r;
    bool gpu = wants_gpu(opts);
    if (gpu) {
        try {
            tl::GpuModel &gpu_model = gpu_model_for(model, opts.device, &result.setup_seconds);
            tl::GpuScoreStats ran;  // this call's own counts, whatever other threads run on the model
            r = on_gpu(gpu_model, &ran);
            result.graph_capture_seconds = ran.capture_seconds;
            result.gemm_marlin_fused = ran.dispatch.marlin_fused;
            result.gemm_marlin_correction = ran.dispatch.marlin_correction;
            result.gemm_dequant_cublas = ran.dispatch.dequant_cublas;
            result.gemm_fp16_body = ran.dispatch.fp16_body;
            result.gemm_native = ran.dispatch.native;
            result.gemm_fallbacks = ran.dispatch.fallbacks;
            result.gemm_dense_cublas = ran.cublas_dense;
        } catch (const tl::Error &e) {
            // AUTO takes the CPU when the GPU path declines a request it does not support; real failures stand.
            if (opts.backend != TL_BACKEND_AUTO || e.code() != TL_ERR_UNSUPPORTED) throw;
            tl::log(TL_LOG_INFO, std::string("[") + what + "] GPU declined, scoring on the CPU: " + e.what());
            gpu = false;
        }
    }
    if (!gpu) r = on_cpu();

    result.nll_sum = r.nll_sum;
    result.tokens_scored = r.tokens_scored;
    result.perplexity = r.tokens_scored > 0 ? std::exp(r.nll_sum / static_cast<double>(r.tokens_scored)) : 0.0;
    result.backend = gpu ? TL_BACKEND_CUDA : TL_BACKEND_CPU;
    result.n_windows = r.n_windows;
    result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (tl::log_enabled(TL_LOG_DEBUG)) {
        tl::log(TL_LOG_DEBUG, std::string("[") + what + "] " + (gpu ? "CUDA" : "CPU") + ": " +
                                  std::to_string(r.tokens_scored) + " tokens in " + std::to_string(r.n_windows) +
                                  " windows, " + std::to_string(result.seconds) + " s");
    }
    return result;
}

}  // namespace

extern "C" {

TL_API tl_status tl_score(const tl_model *model, const int32_t *tokens, size_t n_tokens,
                          const tl_score_options *options, tl_score_result *out_result) {
    return guarded([&] {
        const auto start = std::chrono::steady_clock::now();
        require_not_null(model, "model");
        require_not_null(tokens, "tokens");
        require_output_struct(out_result, "out_result");
        const tl_score_options opts = read_score_options(options);
        require(n_tokens >= 2, "n_tokens must be >= 2 (the first token is only context), got " +
                                   std::to_string(n_tokens));
        require_token_nll_room(opts, n_tokens - 1, "n_tokens - 1");
        const tl::ScoreOptions score = core_score_options(opts);
        const tl_score_result result = run_score(
            *model, opts, "score", start,
            [&](tl::GpuModel &gpu, tl::GpuScoreStats *ran) {
                return tl::score_cuda(gpu, tokens, n_tokens, score, opts.device, opts.stream, ran);
            },
            [&] { return tl::score_cpu(*model->model, tokens, n_tokens, score); });
        write_output_struct(out_result, result);
    });
}

TL_API tl_status tl_score_batch(const tl_model *model, const tl_sequence *sequences, size_t n_sequences,
                                const tl_score_options *options, tl_sequence_score *out_scores,
                                tl_score_result *out_result) {
    return guarded([&] {
        const auto start = std::chrono::steady_clock::now();
        require_not_null(model, "model");
        if (n_sequences > 0) require_not_null(out_scores, "out_scores");
        if (out_result != nullptr) require_output_struct(out_result, "out_result");
        const tl_score_options opts = read_score_options(options);
        // Decided before anything is allocated: no array of tl_sequence can be this long.
        if (n_sequences > static_cast<size_t>(PTRDIFF_MAX) / sizeof(tl_sequence)) {
            tl::fail(TL_ERR_INVALID_ARGUMENT, "n_sequences = " + std::to_string(n_sequences) +
                                                  " is longer than any array of tl_sequence can be");
        }
        std::vector<tl::Sequence> batch(sequences != nullptr ? n_sequences : 0);
        for (size_t i = 0; i < batch.size(); ++i) {
            batch[i].tokens = sequences[i].tokens;
            batch[i].n_tokens = sequences[i].n_tokens;
            batch[i].n_context = sequences[i].n_context;
        }
        const size_t predicted =
            tl::check_sequences(model->model->config, sequences != nullptr ? batch.data() : nullptr, n_sequences,
                                opts.window);
        require_token_nll_room(opts, predicted, "the sum of n_tokens - 1 over the sequences");

        std::vector<tl::SequenceScore> scores(n_sequences);
        tl_score_result result;
        if (n_sequences == 0) {  // an empty batch: nothing runs (no GPU upload), the totals are zero
            std::memset(&result, 0, sizeof result);
            result.struct_size = sizeof result;
            result.backend = wants_gpu(opts) ? TL_BACKEND_CUDA : TL_BACKEND_CPU;
            result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        } else {
            const tl::ScoreOptions score = core_score_options(opts);
            result = run_score(
                *model, opts, "score_batch", start,
                [&](tl::GpuModel &gpu, tl::GpuScoreStats *ran) {
                    return tl::score_batch_cuda(gpu, batch.data(), n_sequences, score, opts.device, opts.stream,
                                                scores.data(), ran);
                },
                [&] { return tl::score_batch_cpu(*model->model, batch.data(), n_sequences, score, scores.data()); });
        }
        for (size_t i = 0; i < n_sequences; ++i) {
            out_scores[i].nll_sum = scores[i].nll_sum;
            out_scores[i].tokens_scored = scores[i].tokens_scored;
            out_scores[i].greedy = scores[i].greedy ? 1 : 0;
        }
        if (out_result != nullptr) write_output_struct(out_result, result);
    });
}

}  // extern "C"

// Lends the barrier above to the C API's other source files (barrier.hpp).
tl_status tl::capi::guarded_call(void (*body)(void *), void *context) noexcept {
    return guarded([&] { body(context); });
}
