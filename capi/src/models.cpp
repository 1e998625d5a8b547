// The C API's model functions: loading a .tinyloop file, its properties and quantized weights, importing a
// checkpoint folder into one.
#include "tinyloop.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "barrier.hpp"
#include "format/format.hpp"
#include "format/model.hpp"
#include "handles.hpp"
#include "import/checkpoint_import.hpp"

using namespace tl::capi;

extern "C" {

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
            w->dispatch = &handle->dispatch;
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
            if (linear->bias) params += linear->bias->size();
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
        p.bos_token_id = c.bos_token_id;
        p.n_kv_heads = c.kv_heads();
        p.rope_scaling = static_cast<int32_t>(c.rope_scaling.type);  // TL_ROPE_SCALING_* are RopeScalingType's values
        p.rope_scaling_factor = static_cast<float>(c.rope_scaling.factor);
        p.rope_original_max_positions = c.rope_scaling.original_max_positions;
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

}  // extern "C"
