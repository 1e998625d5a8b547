// Hugging Face-style checkpoint folder -> Model (docs/format.md, "Importing Hugging Face-style checkpoints"). The
// checkpoint is distrusted like a .tinyloop file: every config field is type-checked, every tensor's dtype and shape
// is checked against the config before its bytes are used, and a tensor the layout does not name is an error (a
// config that does not match its tensors, e.g. a wrong num_pre_layers, would otherwise convert silently).
#include "import/checkpoint_import.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cerrno>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <system_error>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "format/format.hpp"
#include "format/message_text.hpp"
#include "import/int4_import.hpp"
#include "quant/quant.hpp"
#include "util/error.hpp"
#include "util/json.hpp"

namespace tl {
namespace {

using json = nlohmann::json;

// config.json and an index are kilobytes to a few MB; the cap bounds what a hostile file costs to parse.
constexpr uint64_t kMaxJsonBytes = uint64_t{64} << 20;

// Defaults of the optional fields: transformers' LlamaConfig (and GPTQConfig / AwqConfig for group_size).
constexpr int64_t kDefaultMaxPositions = 2048;
constexpr double kDefaultRopeTheta = 10000.0;
constexpr double kDefaultRmsNormEps = 1e-6;
constexpr int64_t kDefaultQuantGroupSize = 128;

// What a linear of the checkpoint may be stored as: dense .weight, or GPTQ / AWQ .qweight/.qzeros/.scales/.g_idx.
constexpr const char *kLinearSuffixes[] = {".weight", ".qweight", ".qzeros", ".scales", ".g_idx", ".bias"};
constexpr const char *kLayerLinears[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                         "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                         "mlp.down_proj"};

// Not named quoted: for a non-const std::string, ADL would find std::quoted.
std::string squote(const std::string &s) { return "'" + s + "'"; }

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

bool starts_with(const std::string &s, const std::string &prefix) { return s.compare(0, prefix.size(), prefix) == 0; }
bool ends_with(const std::string &s, const std::string &suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string lower(std::string s) {
    for (char &c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

std::string join(const std::string &dir, const std::string &name) {
    return dir.empty() ? name : dir.back() == '/' ? dir + name : dir + "/" + name;
}

// True for a regular file, false when nothing is there; anything else (a folder, a FIFO, no permission) is an error
// here rather than a hang or a confusing message later.
bool regular_file_exists(const std::string &path) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
        if (errno == ENOENT) return false;
        fail(TL_ERR_IO, "cannot stat " + squote(path) + ": " + errno_text(errno));
    }
    if (!S_ISREG(st.st_mode)) fail(TL_ERR_IO, squote(path) + " is not a regular file");
    return true;
}

json read_json(const std::string &path) {
    if (!regular_file_exists(path)) fail(TL_ERR_IO, "cannot open " + squote(path) + ": " + errno_text(ENOENT));
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(TL_ERR_IO, "cannot open " + squote(path) + ": " + errno_text(errno));
    std::string text;
    char chunk[65536];
    while (in.read(chunk, sizeof chunk) || in.gcount() > 0) {
        text.append(chunk, static_cast<size_t>(in.gcount()));
        if (text.size() > kMaxJsonBytes) {
            fail(TL_ERR_FORMAT, squote(path) + ": larger than " + std::to_string(kMaxJsonBytes >> 20) + " MiB");
        }
    }
    if (in.bad()) fail(TL_ERR_IO, "cannot read " + squote(path));
    return parse_json(text, JsonLimits{kMaxJsonBytes}, squote(path));
}

// A config field the importer may skip, and why (docs/import.md lists the same).
struct IgnoredField {
    const char *name;
    const char *why;
};

// Typed reads of a JSON object's fields with messages naming the file and the field. A null counts as absent:
// transformers writes "rope_scaling": null, "head_dim": null for fields that are not set.
class Fields {
public:
    // `where`: the file (or files) the object was read from, as messages name it ("'dir/config.json'").
    Fields(const json &object, std::string where, std::string prefix)
        : object_(object), where_(std::move(where)), prefix_(std::move(prefix)) {}

    const json *find(const char *name) const {
        const auto it = object_.find(name);
        return it == object_.end() || it->is_null() ? nullptr : &*it;
    }

    [[noreturn]] void bad(tl_status code, const char *name, const std::string &problem) const {
        fail(code, where_ + ": field " + squote(prefix_ + name) + " " + problem);
    }

    const json &require(const char *name, const std::string &hint) const {
        const json *value = find(name);
        if (!value) bad(TL_ERR_FORMAT, name, "is missing" + (hint.empty() ? std::string() : " " + hint));
        return *value;
    }

    int64_t integer(const char *name, std::optional<int64_t> fallback, const std::string &hint = "") const {
        const json *value = fallback ? find(name) : &require(name, hint);
        if (!value) return *fallback;
        if (!value->is_number_integer() || (value->is_number_unsigned() && value->get<uint64_t>() > INT32_MAX) ||
            value->get<int64_t>() < INT32_MIN || value->get<int64_t>() > INT32_MAX) {
            bad(TL_ERR_FORMAT, name, "must be a 32-bit integer, got " + describe_json(*value, JsonDetail::Scalars));
        }
        return value->get<int64_t>();
    }

    double number(const char *name, std::optional<double> fallback) const {
        const json *value = fallback ? find(name) : &require(name, "");
        if (!value) return *fallback;
        if (!value->is_number()) {
            bad(TL_ERR_FORMAT, name, "must be a number, got " + describe_json(*value, JsonDetail::Scalars));
        }
        return value->get<double>();
    }

    bool boolean(const char *name, bool fallback) const {
        const json *value = find(name);
        if (!value) return fallback;
        if (!value->is_boolean()) {
            bad(TL_ERR_FORMAT, name, "must be true or false, got " + describe_json(*value, JsonDetail::Scalars));
        }
        return value->get<bool>();
    }

    std::string text(const char *name, std::optional<std::string> fallback) const {
        const json *value = fallback ? find(name) : &require(name, "");
        if (!value) return *fallback;
        if (!value->is_string()) {
            bad(TL_ERR_FORMAT, name, "must be a string, got " + describe_json(*value, JsonDetail::Scalars));
        }
        return value->get<std::string>();
    }

    // Every field set (not null) must be one this importer reads (`read`) or one `ignored` says why it may skip: a
    // field it knows nothing of could change what the model computes, and importing as if it were absent would
    // score another model. TL_ERR_UNSUPPORTED naming the first such field.
    template <size_t R, size_t I>
    void require_known(const char *const (&read)[R], const IgnoredField (&ignored)[I], const char *list) const {
        for (const auto &kv : object_.items()) {
            if (kv.value().is_null()) continue;
            const std::string &name = kv.key();
            auto is = [&](const char *known) { return name == known; };
            if (std::any_of(std::begin(read), std::end(read), is)) continue;
            const auto ignored_is = [&](const IgnoredField &f) { return is(f.name); };
            if (std::any_of(std::begin(ignored), std::end(ignored), ignored_is)) continue;
            bad(TL_ERR_UNSUPPORTED, name.c_str(),
                "= " + describe_json(kv.value(), JsonDetail::Scalars) +
                    " is not a field this importer reads or knows it may ignore; it may change what the model "
                    "computes, so the checkpoint is refused rather than imported without it (docs/import.md lists " +
                    list + ")");
        }
    }

private:
    const json &object_;
    std::string where_;
    std::string prefix_;
};

// ---- The fields config.json and quantize_config.json may hold (docs/import.md lists the same) ----

// config.json fields the importer reads: each one below either shapes the .tinyloop model or is checked to be a
// value under which the TinyLoop block computes what transformers computes (else the checkpoint is refused).
constexpr const char *kConfigFields[] = {
    "hidden_size", "num_attention_heads", "head_dim", "num_key_value_heads", "intermediate_size", "vocab_size",
    "num_hidden_layers", "num_pre_layers", "num_loops", "max_position_embeddings", "rope_theta", "rope_scaling",
    "rms_norm_eps", "tie_word_embeddings", "hidden_act", "attention_bias", "mlp_bias", "quantization_config",
    "model_type", "sliding_window", "use_sliding_window", "max_window_layers", "layer_types",
    "partial_rotary_factor", "pretraining_tp", "rope_parameters", "bos_token_id"};

// config.json fields that do not change the scores, with the reason each may be ignored.
constexpr const char kGenerationDefault[] = "a default of text generation (sampling, search, lengths), which scoring "
                                            "does not do";
constexpr const char kTokenId[] = "a special token's id, for tokenizers and generation; scoring takes the ids given";
constexpr const char kPythonOutput[] = "what transformers' Python forward returns, not what it computes";
constexpr IgnoredField kIgnoredConfigFields[] = {
    {"architectures", "the Python class's name; the fields read and the tensors say what the model computes"},
    {"_name_or_path", "where the checkpoint was loaded from"},
    {"transformers_version", "the version of the library that wrote the file"},
    {"torch_dtype", "the dtype the weights were saved in; each tensor's own dtype is read from its file"},
    {"dtype", "transformers 5's name for torch_dtype"},
    {"eos_token_id", kTokenId},
    {"pad_token_id", kTokenId},
    {"sep_token_id", kTokenId},
    {"decoder_start_token_id", kTokenId},
    {"use_cache", "the key/value cache of generation; scoring computes the same attention without it"},
    {"initializer_range", "the initialization of training; the weights are given"},
    {"attention_dropout", "dropout, which is off at inference"},
    {"tokenizer_class", "the tokenizer's class, for tokenizing text into the ids that are scored"},
    {"output_attentions", kPythonOutput},
    {"output_hidden_states", kPythonOutput},
    {"return_dict", kPythonOutput},
    {"torchscript", "how transformers exports the Python module"},
    {"id2label", "labels of a classification head, which a causal language model's scores do not use"},
    {"label2id", "labels of a classification head, which a causal language model's scores do not use"},
    {"max_length", kGenerationDefault},
    {"min_length", kGenerationDefault},
    {"do_sample", kGenerationDefault},
    {"early_stopping", kGenerationDefault},
    {"num_beams", kGenerationDefault},
    {"num_beam_groups", kGenerationDefault},
    {"diversity_penalty", kGenerationDefault},
    {"temperature", kGenerationDefault},
    {"top_k", kGenerationDefault},
    {"top_p", kGenerationDefault},
    {"typical_p", kGenerationDefault},
    {"repetition_penalty", kGenerationDefault},
    {"length_penalty", kGenerationDefault},
    {"no_repeat_ngram_size", kGenerationDefault},
    {"bad_words_ids", kGenerationDefault},
    {"num_return_sequences", kGenerationDefault},
    {"forced_bos_token_id", kGenerationDefault},
    {"forced_eos_token_id", kGenerationDefault},
};

// quantization_config / quantize_config.json fields read by read_quantization.
constexpr const char *kQuantFields[] = {"quant_method", "bits",    "group_size",       "desc_act",  "sym",
                                        "checkpoint_format", "version", "zero_point", "is_marlin_format",
                                        "pack_dtype"};

// quantization_config / quantize_config.json fields that do not change how the tensors are read.
constexpr const char kHowQuantized[] = "a setting of the quantizer that produced the weights; the stored codes, "
                                       "scales and zeros are what they are";
constexpr const char kWhichLinears[] = "which linears are INT4; each linear's tensors (.weight or .qweight) say so";
constexpr const char kRuntime[] = "a setting of a GPU runtime (kernels, fusing) for running the checkpoint";
constexpr IgnoredField kIgnoredQuantFields[] = {
    {"damp_percent", kHowQuantized},
    {"damp_auto_increment", kHowQuantized},
    {"true_sequential", kHowQuantized},
    {"static_groups", kHowQuantized},
    {"mse", kHowQuantized},
    {"dataset", kHowQuantized},
    {"tokenizer", kHowQuantized},
    {"batch_size", kHowQuantized},
    {"model_seqlen", kHowQuantized},
    {"max_input_length", kHowQuantized},
    {"cache_block_outputs", kHowQuantized},
    {"pad_token_id", kHowQuantized},
    {"quantizer", kHowQuantized},
    {"meta", kHowQuantized},
    {"model_name_or_path", "where the quantizer read the model"},
    {"model_file_base_name", "the file name AutoGPTQ saved the weights under"},
    {"block_name_to_quantize", kWhichLinears},
    {"module_name_preceding_first_block", kWhichLinears},
    {"modules_in_block_to_quantize", kWhichLinears},
    {"modules_to_not_convert", kWhichLinears},
    {"lm_head", kWhichLinears},
    {"use_exllama", kRuntime},
    {"disable_exllama", kRuntime},
    {"exllama_config", kRuntime},
    {"use_cuda_fp16", kRuntime},
    {"backend", kRuntime},
    {"do_fuse", kRuntime},
    {"fuse_max_seq_len", kRuntime},
};

// model_type values whose blocks are the Llama block (RMSNorm, rotate-half RoPE, SwiGLU, no norm offsets).
constexpr const char *kLlamaFamily[] = {"llama", "mistral", "qwen2", "looped_llama"};

struct Quantization {
    bool present = false;
    Int4Layout layout = Int4Layout::Gptq;
    std::string method;      // "gptq" or "awq", for messages
    int32_t group_size = 0;  // 0 = per row (the checkpoint's -1)
    int32_t bits = 4;        // 4, or 8 (GPTQ only; stored symmetric, see import_int4)
};

struct HfConfig {
    std::string path;   // config.json, for messages
    ModelConfig model;  // the .tinyloop config (group_size set once the linears are read)
    int32_t kv_heads = 0;
    int32_t layers = 0;     // model.layers.{0 .. layers - 1} in the checkpoint
    bool looped = false;    // num_pre_layers and num_loops given; else a plain config (see read_config)
    bool tied = false;
    // Which linears have a bias (transformers creates exactly these): q, k and v for attention_bias or Qwen2 (whose
    // q_proj, k_proj and v_proj always have one), o_proj for attention_bias, gate, up and down for mlp_bias. Each
    // says why, for messages ("" = no bias).
    std::string qkv_bias, o_bias, mlp_bias;
    Quantization quant;
};

// validate_config names the .tinyloop fields; the user wrote config.json's.
[[noreturn]] void fail_config_range(const Error &e, const std::string &path, bool looped) {
    struct Name {
        const char *ours, *theirs, *hint;
    };
    // A plain config has no num_pre_layers / num_loops: the pre blocks are its layers before the looped one.
    const char *pre = looped ? "num_pre_layers" : "num_hidden_layers - (the layers found repeated at its end)";
    const char *loops = looped ? "num_loops" : "the repeated layers at the end of num_hidden_layers";
    const Name names[] = {{"d_model", "hidden_size", ""},
                          {"n_heads", "num_attention_heads", ""},
                          {"head_dim", "head_dim", ""},
                          {"ffn", "intermediate_size", ""},
                          {"vocab", "vocab_size", ""},
                          {"pre", pre, ""},
                          {"loops", loops, ""},
                          {"max_seq", "max_position_embeddings", " (the max_seq option overrides it)"},
                          {"rope_theta", "rope_theta", ""},
                          {"norm_eps", "rms_norm_eps", ""},
                          {"group_size", "quantization_config.group_size", ""}};
    std::string message = e.what();
    const std::string prefix = "config: ";
    if (starts_with(message, prefix)) {
        message.erase(0, prefix.size());
        for (const Name &name : names) {
            if (starts_with(message, std::string(name.ours) + " ")) {
                message = std::string(name.theirs) + " (the .tinyloop " + name.ours + ")" +
                          message.substr(std::strlen(name.ours)) + name.hint;
                break;
            }
        }
    }
    fail(e.code(), squote(path) + ": " + message);
}

// How the INT4 tensors are packed, from transformers' quantization_config or AutoGPTQ's quantize_config.json (or both,
// merged by read_config); `f` names where the object came from.
Quantization read_quantization(const Fields &f) {
    f.require_known(kQuantFields, kIgnoredQuantFields, "the quantization fields read and those ignored");
    Quantization q;
    q.present = true;
    q.method = lower(f.text("quant_method", std::nullopt));
    if (q.method == "gptq") {
        q.layout = Int4Layout::Gptq;
    } else if (q.method == "awq") {
        q.layout = Int4Layout::Awq;
    } else {
        f.bad(TL_ERR_UNSUPPORTED, "quant_method",
              "= " + squote(q.method) + ": only 'gptq' (v1) and 'awq' (GEMM) checkpoints can be imported");
    }
    const int64_t bits = f.integer("bits", std::nullopt);
    if (bits != 4 && !(bits == 8 && q.layout == Int4Layout::Gptq)) {
        f.bad(TL_ERR_UNSUPPORTED, "bits", "= " + std::to_string(bits) + ": only 4-bit checkpoints, and 8-bit GPTQ " +
                                              "ones, can be imported");
    }
    q.bits = static_cast<int32_t>(bits);
    const int64_t group = f.integer("group_size", kDefaultQuantGroupSize);
    if (group != -1 && group <= 0) {
        f.bad(TL_ERR_FORMAT, "group_size", "= " + std::to_string(group) + ": must be -1 (per row) or positive");
    }
    q.group_size = group == -1 ? 0 : static_cast<int32_t>(group);
    f.boolean("sym", true);  // type-checked only: both forms store their zero points, and import the same way
    if (f.boolean("is_marlin_format", false)) {
        f.bad(TL_ERR_UNSUPPORTED, "is_marlin_format",
              "is true: the tensors are repacked for the Marlin kernel; only GPTQ's v1 packing is read");
    }
    const std::string pack = lower(f.text("pack_dtype", std::string("int32")));
    if (pack != "int32" && pack != "torch.int32") {
        f.bad(TL_ERR_UNSUPPORTED, "pack_dtype", "= " + squote(pack) + ": only codes packed into int32 words are read");
    }
    if (q.layout == Int4Layout::Gptq) {
        f.boolean("desc_act", false);  // type-checked only: each linear's g_idx says how its K is ordered
        const std::string format = lower(f.text("checkpoint_format", std::string("gptq")));
        if (format != "gptq") {
            f.bad(TL_ERR_UNSUPPORTED, "checkpoint_format",
                  "= " + squote(format) + ": only GPTQ's v1 format ('gptq') is read; save or convert to v1 first");
        }
    } else {
        const std::string version = lower(f.text("version", std::string("gemm")));
        if (version != "gemm") {
            f.bad(TL_ERR_UNSUPPORTED, "version",
                  "= " + squote(version) + ": only AutoAWQ's GEMM packing is read (not GEMV, exllama, ...)");
        }
        if (!f.boolean("zero_point", true)) {
            f.bad(TL_ERR_UNSUPPORTED, "zero_point", "is false: only AWQ checkpoints with zero points are read");
        }
    }
    return q;
}

// The quantization settings: config.json's quantization_config, AutoGPTQ's quantize_config.json next to it, or both.
// Both: every field the two set must agree (else TL_ERR_FORMAT naming it), and each adds what the other lacks.
// quantize_config.json alone is AutoGPTQ's, whose older versions write no quant_method: 'gptq' then.
std::optional<Quantization> read_quantization_files(const Fields &config, const std::string &config_path,
                                                    const std::string &dir) {
    const json *in_config = config.find("quantization_config");
    if (in_config && !in_config->is_object()) {
        config.bad(TL_ERR_FORMAT, "quantization_config",
                   "must be an object, got " + describe_json(*in_config, JsonDetail::Scalars));
    }
    const std::string qc_path = join(dir, "quantize_config.json");
    if (!regular_file_exists(qc_path)) {
        if (!in_config) return std::nullopt;
        return read_quantization(Fields(*in_config, squote(config_path), "quantization_config."));
    }
    json merged = read_json(qc_path);
    if (!merged.is_object()) fail(TL_ERR_FORMAT, squote(qc_path) + ": not a JSON object");
    if (!in_config) {
        if (merged.find("quant_method") == merged.end() || merged["quant_method"].is_null()) {
            merged["quant_method"] = "gptq";
        }
        return read_quantization(Fields(merged, squote(qc_path), ""));
    }
    for (const auto &kv : in_config->items()) {
        if (kv.value().is_null()) continue;
        const auto it = merged.find(kv.key());
        if (it == merged.end() || it->is_null()) {
            merged[kv.key()] = kv.value();
        } else if (*it != kv.value()) {
            fail(TL_ERR_FORMAT, squote(config_path) + " and " + squote(qc_path) + " disagree on " + squote(kv.key()) +
                                    ": quantization_config." + kv.key() + " = " +
                                    describe_json(kv.value(), JsonDetail::Scalars) + " but quantize_config.json has " +
                                    describe_json(*it, JsonDetail::Scalars));
        }
    }
    const std::string where = squote(config_path) + " (quantization_config, with " + squote(qc_path) + ")";
    return read_quantization(Fields(merged, where, "quantization_config."));
}

// The fields of each rope_scaling type (transformers' required and optional keys), besides "type" / "rope_type"
// (and rope_parameters' "rope_theta"): any other is refused.
struct RopeType {
    const char *name;
    RopeScalingType type;
    std::vector<const char *> fields;
};
const RopeType kRopeTypes[] = {
    {"default", RopeScalingType::None, {}},
    {"linear", RopeScalingType::Linear, {"factor"}},
    {"dynamic", RopeScalingType::Dynamic, {"factor", "original_max_position_embeddings"}},
    {"llama3", RopeScalingType::Llama3,
     {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}},
    {"yarn", RopeScalingType::Yarn,
     {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor", "mscale",
      "mscale_all_dim", "truncate"}},
};

// transformers' get_mscale: YaRN's attention factor for a scale, 0.1 m ln(scale) + 1 (1 for scale <= 1).
double yarn_mscale(double scale, double m) { return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; }

// rope_scaling (or rope_parameters) as the .tinyloop config's RopeScaling, every parameter resolved as transformers
// resolves it (modeling_rope_utils.py), so that the file does not depend on max_position_embeddings, which the
// max_seq option may override. `positions`: config.json's max_position_embeddings; `max_seq`: this import's.
RopeScaling read_rope_scaling(const Fields &f, const json &object, int64_t positions, int32_t max_seq,
                              bool max_seq_option) {
    const char *const kTypeKeys[] = {"type", "rope_type", "rope_theta"};
    const json *type_value = f.find("rope_type") ? f.find("rope_type") : f.find("type");
    if (!type_value) f.require("rope_type", "(the scaling's type: linear, dynamic, llama3 or yarn)");
    const std::string name = f.text(f.find("rope_type") ? "rope_type" : "type", std::nullopt);
    const RopeType *type = nullptr;
    for (const RopeType &t : kRopeTypes) {
        if (name == t.name) type = &t;
    }
    if (!type) {
        f.bad(TL_ERR_UNSUPPORTED, f.find("rope_type") ? "rope_type" : "type",
              "= " + squote(name) + ": the RoPE scalings read are linear, dynamic, llama3 and yarn");
    }
    for (const auto &kv : object.items()) {
        if (kv.value().is_null()) continue;
        const std::string &key = kv.key();
        auto is = [&](const char *k) { return key == k; };
        if (std::any_of(std::begin(kTypeKeys), std::end(kTypeKeys), is) ||
            std::any_of(type->fields.begin(), type->fields.end(), is)) {
            continue;
        }
        f.bad(TL_ERR_UNSUPPORTED, key.c_str(),
              "= " + describe_json(kv.value(), JsonDetail::Scalars) + " is not a field of " + squote(name) +
                  " RoPE scaling this importer reads");
    }
    RopeScaling r;
    r.type = type->type;
    if (r.type == RopeScalingType::None) return r;
    r.factor = f.number("factor", std::nullopt);
    if (!std::isfinite(r.factor) || r.factor <= 0.0) {
        f.bad(TL_ERR_FORMAT, "factor", "= " + describe_json(*f.find("factor")) + " must be positive");
    }
    const int64_t original = f.integer("original_max_position_embeddings", positions);
    if (original < 1) f.bad(TL_ERR_FORMAT, "original_max_position_embeddings", "must be positive");
    switch (r.type) {
        case RopeScalingType::Dynamic: {
            // Dynamic NTK is plain RoPE for sequences up to max_position_embeddings (transformers raises the base
            // only past it); with original_max_position_embeddings too, the smaller bound is taken.
            r.original_max_positions = static_cast<int32_t>(std::min(original, positions));
            if (max_seq > r.original_max_positions) {
                f.bad(TL_ERR_UNSUPPORTED, "rope_type",
                      "= 'dynamic': dynamic NTK scaling changes the frequencies for windows longer than " +
                          std::to_string(r.original_max_positions) + " tokens, and this import's max_seq is " +
                          std::to_string(max_seq) +
                          (max_seq_option ? " (the max_seq option)" : " (max_position_embeddings)") +
                          "; import with a max_seq (tinyloop import --max-seq) of at most " +
                          std::to_string(r.original_max_positions) + ", where it is plain RoPE");
            }
            break;
        }
        case RopeScalingType::Llama3:
            f.require("original_max_position_embeddings", "(Llama 3's pre-scaling context length)");
            r.original_max_positions = static_cast<int32_t>(original);
            r.low_freq_factor = f.number("low_freq_factor", std::nullopt);
            r.high_freq_factor = f.number("high_freq_factor", std::nullopt);
            break;
        case RopeScalingType::Yarn: {
            r.original_max_positions = static_cast<int32_t>(original);
            // transformers reads `beta_fast or 32`, `beta_slow or 1`: a 0 takes the default too.
            const double fast = f.number("beta_fast", 32.0), slow = f.number("beta_slow", 1.0);
            r.beta_fast = fast != 0.0 ? fast : 32.0;
            r.beta_slow = slow != 0.0 ? slow : 1.0;
            r.truncate = f.boolean("truncate", true);
            const double mscale = f.number("mscale", 0.0), mscale_all_dim = f.number("mscale_all_dim", 0.0);
            if (f.find("attention_factor")) {
                r.attention_factor = f.number("attention_factor", std::nullopt);
            } else if (mscale != 0.0 && mscale_all_dim != 0.0) {
                r.attention_factor = yarn_mscale(r.factor, mscale) / yarn_mscale(r.factor, mscale_all_dim);
            } else {
                r.attention_factor = yarn_mscale(r.factor, 1.0);
            }
            break;
        }
        default: break;
    }
    return r;
}

HfConfig read_config(const std::string &dir, const CheckpointImportOptions &options) {
    const std::string path = join(dir, "config.json");
    const json root = read_json(path);
    if (!root.is_object()) fail(TL_ERR_FORMAT, squote(path) + ": not a JSON object");
    const Fields f(root, squote(path), "");
    HfConfig c;
    c.path = path;
    ModelConfig &m = c.model;

    // The family first: another family's fields would otherwise be reported as merely unknown.
    const std::string model_type = f.text("model_type", std::string());
    if (starts_with(lower(model_type), "gemma")) {
        f.bad(TL_ERR_UNSUPPORTED, "model_type",
              "= " + squote(model_type) +
                  ": Gemma's blocks are not the Llama block this library computes (its RMSNorm scales by 1 + weight, "
                  "its embedding is multiplied by sqrt(hidden_size), its MLP uses GELU)");
    }
    if (!model_type.empty() && std::none_of(std::begin(kLlamaFamily), std::end(kLlamaFamily),
                                            [&](const char *t) { return model_type == t; })) {
        f.bad(TL_ERR_UNSUPPORTED, "model_type",
              "= " + squote(model_type) +
                  ": only Llama-family checkpoints are imported (model_type 'llama', 'mistral', 'qwen2', or "
                  "'looped_llama' for a looped model; docs/import.md)");
    }
    if (f.find("hidden_activation")) {
        f.bad(TL_ERR_UNSUPPORTED, "hidden_activation",
              "is set (" + describe_json(*f.find("hidden_activation"), JsonDetail::Scalars) +
                  "): it is Gemma's MLP activation, and Gemma's blocks are not the Llama block this library "
                  "computes ((1 + weight) RMSNorm, scaled embeddings, GELU)");
    }
    f.require_known(kConfigFields, kIgnoredConfigFields, "the config.json fields read and those ignored");

    // A looped model's config names its pre blocks and loops, and stores each block once. A plain (Llama-style)
    // config has num_hidden_layers alone: its layers before the last are pre blocks and the last is looped once,
    // unless layers at its end are the same layer stored again (a looped model stored unrolled), which the importer
    // finds and stores once (Importer::find_repeated_layers).
    const std::string looped_hint =
        "(a looped model's config.json needs num_pre_layers, the unique blocks before the looped block, and "
        "num_loops, how many times the looped block is applied; docs/import.md)";
    c.looped = f.find("num_pre_layers") || f.find("num_loops");
    if (c.looped) {
        m.pre = static_cast<int32_t>(f.integer("num_pre_layers", std::nullopt, looped_hint));
        m.loops = static_cast<int32_t>(f.integer("num_loops", std::nullopt, looped_hint));
        c.layers = m.pre + 1;
        if (f.find("num_hidden_layers")) {
            const int64_t layers = f.integer("num_hidden_layers", std::nullopt);
            if (layers != int64_t{m.pre} + 1) {
                f.bad(TL_ERR_FORMAT, "num_hidden_layers",
                      "= " + std::to_string(layers) + ", but a looped checkpoint stores num_pre_layers + 1 = " +
                          std::to_string(int64_t{m.pre} + 1) + " layers (the pre blocks, then the looped block)");
            }
        }
    } else {
        c.layers = static_cast<int32_t>(f.integer(
            "num_hidden_layers", std::nullopt,
            "(a Llama-style config.json gives its layer count; a looped model's gives num_pre_layers and num_loops)"));
        if (c.layers < 1) {
            f.bad(TL_ERR_FORMAT, "num_hidden_layers", "= " + std::to_string(c.layers) + " must be at least 1");
        }
        m.pre = 0;  // until the layers are read; checked again then
        m.loops = 1;
    }
    m.d_model = static_cast<int32_t>(f.integer("hidden_size", std::nullopt));
    m.n_heads = static_cast<int32_t>(f.integer("num_attention_heads", std::nullopt));
    m.ffn = static_cast<int32_t>(f.integer("intermediate_size", std::nullopt));
    m.vocab = static_cast<int32_t>(f.integer("vocab_size", std::nullopt));
    if (m.n_heads <= 0) {
        f.bad(TL_ERR_FORMAT, "num_attention_heads", "= " + std::to_string(m.n_heads) + " must be positive");
    }
    if (f.find("head_dim")) {
        m.head_dim = static_cast<int32_t>(f.integer("head_dim", std::nullopt));
    } else if (m.d_model % m.n_heads != 0) {
        f.bad(TL_ERR_FORMAT, "head_dim",
              "is missing and hidden_size = " + std::to_string(m.d_model) +
                  " is not a multiple of num_attention_heads = " + std::to_string(m.n_heads));
    } else {
        m.head_dim = m.d_model / m.n_heads;
    }
    c.kv_heads = static_cast<int32_t>(f.integer("num_key_value_heads", m.n_heads));
    if (c.kv_heads <= 0 || m.n_heads % c.kv_heads != 0) {
        f.bad(TL_ERR_FORMAT, "num_key_value_heads",
              "= " + std::to_string(c.kv_heads) + " must be positive and divide num_attention_heads = " +
                  std::to_string(m.n_heads));
    }
    m.n_kv_heads = c.kv_heads;
    const int64_t positions = f.integer("max_position_embeddings", kDefaultMaxPositions);
    m.max_seq = options.max_seq > 0 ? options.max_seq : static_cast<int32_t>(positions);
    m.rope_theta = static_cast<float>(f.number("rope_theta", kDefaultRopeTheta));
    m.norm_eps = static_cast<float>(f.number("rms_norm_eps", kDefaultRmsNormEps));
    // Kept in the model file for empty contexts (score-batch, lm-eval). A null, a list (several ids) or an id outside
    // the vocabulary names none usable: such files imported before bos_token_id was read, and still do.
    if (const auto *bos = f.find("bos_token_id"); bos != nullptr && bos->is_number_integer()) {
        const int64_t id = bos->get<int64_t>();
        if (id >= 0 && id < m.vocab) m.bos_token_id = static_cast<int32_t>(id);
    }
    m.group_size = 0;
    m.bits = 4;
    c.tied = f.boolean("tie_word_embeddings", false);

    // Llama options that change what the model computes, which the TinyLoop block does not.
    const std::string act = f.text("hidden_act", std::string("silu"));
    if (act != "silu") {
        f.bad(TL_ERR_UNSUPPORTED, "hidden_act", "= " + squote(act) + ": only 'silu' (SwiGLU) is supported");
    }
    // RoPE scaling: rope_scaling, or transformers 5's rope_parameters (which holds rope_theta too).
    const json *scaling = f.find("rope_scaling");
    const json *parameters = f.find("rope_parameters");
    if (scaling && parameters) {
        f.bad(TL_ERR_FORMAT, "rope_parameters", "and 'rope_scaling' are both set: transformers reads one or the other");
    }
    if (const json *rope = scaling ? scaling : parameters) {
        const char *field = scaling ? "rope_scaling" : "rope_parameters";
        if (!rope->is_object()) {
            f.bad(TL_ERR_FORMAT, field, "must be an object, got " + describe_json(*rope, JsonDetail::Scalars));
        }
        const Fields rf(*rope, squote(path), std::string(field) + ".");
        if (parameters) {
            const double theta = rf.number("rope_theta", static_cast<double>(m.rope_theta));
            if (f.find("rope_theta") && static_cast<float>(theta) != m.rope_theta) {
                rf.bad(TL_ERR_FORMAT, "rope_theta", "differs from config.json's rope_theta");
            }
            m.rope_theta = static_cast<float>(theta);
        }
        m.rope_scaling = read_rope_scaling(rf, *rope, positions, m.max_seq, options.max_seq > 0);
    }
    if (f.boolean("attention_bias", false)) c.qkv_bias = c.o_bias = "config.json's attention_bias is true";
    if (model_type == "qwen2") c.qkv_bias = "Qwen2's q_proj, k_proj and v_proj have biases";
    if (f.boolean("mlp_bias", false)) c.mlp_bias = "config.json's mlp_bias is true";
    const double rotary = f.number("partial_rotary_factor", 1.0);
    if (rotary != 1.0) {
        f.bad(TL_ERR_UNSUPPORTED, "partial_rotary_factor",
              "= " + describe_json(*f.find("partial_rotary_factor"), JsonDetail::Scalars) +
                  ": RoPE rotates every dimension of a head here (partial_rotary_factor 1)");
    }
    // Slices each linear into pretraining_tp pieces and concatenates their products: the same product.
    if (f.integer("pretraining_tp", 1) < 1) f.bad(TL_ERR_FORMAT, "pretraining_tp", "must be a positive integer");

    // Sliding-window attention (Mistral, Qwen2): a query sees only the last sliding_window keys. That is full
    // attention exactly when no window the model scores is longer than sliding_window, i.e. max_seq <= it.
    const bool window_flag = f.boolean("use_sliding_window", true);  // Qwen2's switch; Mistral's window has none
    f.integer("max_window_layers", 0);  // Qwen2: which layers use the window, when use_sliding_window is true
    bool sliding_layers = true;         // transformers 4.5x's layer_types: which layers use the window
    if (const json *types = f.find("layer_types")) {
        if (!types->is_array()) f.bad(TL_ERR_FORMAT, "layer_types", "must be an array of strings");
        sliding_layers = false;
        for (const json &t : *types) {
            const std::string type = t.is_string() ? t.get<std::string>() : describe_json(t, JsonDetail::Scalars);
            if (type == "sliding_attention") {
                sliding_layers = true;
            } else if (type != "full_attention") {
                f.bad(TL_ERR_UNSUPPORTED, "layer_types",
                      "holds " + squote(type) + ": only 'full_attention' and 'sliding_attention' layers are known");
            }
        }
    }
    if (f.find("sliding_window")) {
        const int64_t window = f.integer("sliding_window", std::nullopt);
        if (window_flag && sliding_layers && window < m.max_seq) {
            f.bad(TL_ERR_UNSUPPORTED, "sliding_window",
                  "= " + std::to_string(window) +
                      ": sliding-window attention is not supported, and it equals full attention only for windows "
                      "of at most " + std::to_string(window) + " tokens, but this import's max_seq is " +
                      std::to_string(m.max_seq) + (options.max_seq > 0 ? " (the max_seq option)" :
                                                   " (max_position_embeddings)") +
                      "; import with a max_seq (tinyloop import --max-seq) of at most " + std::to_string(window));
        }
    }

    try {
        validate_config(m);
    } catch (const Error &e) {
        fail_config_range(e, path, c.looped);
    }
    if (std::optional<Quantization> q = read_quantization_files(f, path, dir)) c.quant = *q;
    return c;
}

// Everything the imported model's views point into: the mapped files and the buffers made here.
struct Storage {
    std::vector<std::shared_ptr<const void>> files;
    std::deque<std::vector<uint8_t>> buffers;  // a deque: adding one never moves the others
};

struct Entry {
    const SafetensorsTensor *tensor = nullptr;
    const std::string *file = nullptr;
};

// The checkpoint's tensors, from model.safetensors or from the shards an index names (each file opened once and
// mapped, not read: a tensor's bytes are touched only when it is converted or written).
class Checkpoint {
public:
    Checkpoint(const std::string &dir, bool use_mmap, Storage *storage) {
        const std::string single = join(dir, "model.safetensors");
        const std::string index = join(dir, "model.safetensors.index.json");
        // transformers looks for the single file first, then the index.
        if (regular_file_exists(single)) {
            source_ = single;
            const SafetensorsFile &file = open(single, use_mmap, storage);
            for (const auto &kv : file.tensors) tensors_.emplace(kv.first, Entry{&kv.second, &file.path});
        } else if (regular_file_exists(index)) {
            source_ = index;
            open_sharded(dir, index, use_mmap, storage);
        } else {
            fail(TL_ERR_IO, squote(dir) + " has neither model.safetensors nor model.safetensors.index.json");
        }
    }

    const std::string &source() const { return source_; }
    const std::map<std::string, Entry> &tensors() const { return tensors_; }
    const Entry *find(const std::string &name) const {
        const auto it = tensors_.find(name);
        return it == tensors_.end() ? nullptr : &it->second;
    }

private:
    const SafetensorsFile &open(const std::string &path, bool use_mmap, Storage *storage) {
        files_.push_back(std::make_unique<SafetensorsFile>(read_safetensors(path, use_mmap)));
        storage->files.push_back(files_.back()->keepalive);
        return *files_.back();
    }

    void open_sharded(const std::string &dir, const std::string &index, bool use_mmap, Storage *storage) {
        const json root = read_json(index);
        const auto map = root.is_object() ? root.find("weight_map") : root.end();
        if (!root.is_object() || map == root.end() || !map->is_object()) {
            fail(TL_ERR_FORMAT, squote(index) + ": no 'weight_map' object (tensor name -> shard file)");
        }
        std::map<std::string, const SafetensorsFile *> shards;
        for (const auto &kv : map->items()) {
            if (!kv.value().is_string()) {
                fail(TL_ERR_FORMAT, squote(index) + ": weight_map[" + squote(kv.key()) + "] is not a file name");
            }
            const std::string shard = kv.value().get<std::string>();
            // Shards lie next to the index: a name with a folder could point outside the checkpoint.
            if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos) {
                fail(TL_ERR_FORMAT, squote(index) + ": weight_map[" + squote(kv.key()) + "] = " + squote(shard) +
                                        " is not a file name in the checkpoint folder");
            }
            auto it = shards.find(shard);
            if (it == shards.end()) it = shards.emplace(shard, &open(join(dir, shard), use_mmap, storage)).first;
            const SafetensorsFile &file = *it->second;
            const auto t = file.tensors.find(kv.key());
            if (t == file.tensors.end()) {
                fail(TL_ERR_FORMAT, squote(index) + ": weight_map puts tensor " + squote(kv.key()) + " in " +
                                        squote(file.path) + ", which has no such tensor");
            }
            tensors_.emplace(kv.key(), Entry{&t->second, &file.path});
        }
        // The index and the shards must agree both ways: a tensor the index does not list is not silently dropped.
        for (const auto &file : files_) {
            for (const auto &kv : file->tensors) {
                const Entry *e = find(kv.first);
                if (!e || e->file != &file->path) {
                    fail(TL_ERR_FORMAT, squote(file->path) + ": tensor " + squote(kv.first) +
                                            " is not listed for this shard in " + squote(index) + "'s weight_map");
                }
            }
        }
    }

    std::string source_;
    std::vector<std::unique_ptr<SafetensorsFile>> files_;
    std::map<std::string, Entry> tensors_;
};

// One linear of the checkpoint: dense (its .weight, [out, in] = [N, K] as torch stores nn.Linear.weight, which is
// already the .tinyloop dense layout) or INT4 (converted by import_int4 into the library's [N][K/2] codes and
// [N][G] scales and offsets).
struct HfLinear {
    std::string name;  // e.g. "model.layers.0.self_attn.q_proj"
    const Entry *weight = nullptr;
    std::optional<QuantizedMatrix> int4;
    std::shared_ptr<const std::vector<float>> bias;  // [N] as F32 (exact from F16 / BF16), or none
    bool quantized() const { return int4.has_value(); }
};

// The element as float, from any alignment (the file's tensors need not be aligned).
float value_at(DType dtype, const uint8_t *data, size_t i) {
    alignas(4) uint8_t value[4];
    std::memcpy(value, data + i * dtype_size(dtype), dtype_size(dtype));
    return load_float(dtype, value, 0);
}

class Importer {
public:
    Importer(HfConfig config, const Checkpoint &checkpoint, std::shared_ptr<Storage> storage,
             const CheckpointImportOptions &options)
        : config_(std::move(config)), c_(config_.model), checkpoint_(checkpoint), storage_(std::move(storage)),
          options_(options) {}

    std::unique_ptr<Model> build() {
        check_names();
        if (!config_.looped) find_repeated_layers();
        auto model = std::make_unique<Model>();
        model->config = c_;
        model->keepalive = storage_;

        const Entry &embed = require("model.embed_tokens.weight", "");
        check_float(embed, {c_.vocab, c_.d_model}, "[vocab_size, hidden_size]");
        model->embed_dtype = embed.tensor->dtype;
        model->embed = aligned_view(embed);

        model->pre.resize(static_cast<size_t>(c_.pre));
        for (int32_t i = 0; i < c_.pre; ++i) {
            read_block(i, "pre." + std::to_string(i) + ".", &model->pre[static_cast<size_t>(i)]);
        }
        read_block(c_.pre, "loop.", &model->loop);  // the looped block is the layer after the pre blocks
        model->final_norm = read_norm("model.norm.weight");
        read_head(embed, model.get());

        // One group size for the whole file: the checkpoint's, once a linear is INT4 (import_int4 checked that it
        // divides each one's K); a dense model's 0 leaves `tinyloop quantize` free to choose.
        if (any_int4_) {
            model->config.group_size = config_.quant.group_size;
            model->config.bits = config_.quant.bits;
        }
        try {
            validate_config(model->config);
        } catch (const Error &e) {
            fail_config_range(e, config_.path, config_.looped);
        }
        return model;
    }

private:
    std::string where(const Entry &e) const { return squote(*e.file) + ": tensor " + squote(e.tensor->name) + ": "; }

    const Entry *find(const std::string &name) const { return checkpoint_.find(name); }

    const Entry &require(const std::string &name, const std::string &hint) const {
        const Entry *e = find(name);
        if (!e) fail(TL_ERR_FORMAT, squote(checkpoint_.source()) + ": missing tensor " + squote(name) + hint);
        return *e;
    }

    void check(const Entry &e, std::initializer_list<DType> dtypes, const std::vector<int64_t> &shape,
               const std::string &meaning) const {
        const SafetensorsTensor &t = *e.tensor;
        if (std::find(dtypes.begin(), dtypes.end(), t.dtype) == dtypes.end()) {
            std::string allowed;
            for (DType d : dtypes) allowed += std::string(allowed.empty() ? "" : "/") + dtype_name(d);
            fail(TL_ERR_FORMAT, where(e) + "dtype " + dtype_name(t.dtype) + ", expected " + allowed);
        }
        if (t.shape != shape) {
            fail(TL_ERR_FORMAT, where(e) + "shape " + shape_text(t.shape) + ", expected " + shape_text(shape) + " " +
                                    meaning);
        }
    }

    void check_float(const Entry &e, const std::vector<int64_t> &shape, const std::string &meaning) const {
        check(e, {DType::F16, DType::BF16, DType::F32}, shape, meaning);
        if (!options_.validate_values) return;
        const SafetensorsTensor &t = *e.tensor;
        const size_t count = static_cast<size_t>(t.bytes / dtype_size(t.dtype));
        const size_t bad = first_nonfinite(t.dtype, t.data, count);
        if (bad != count) {
            fail(TL_ERR_FORMAT, where(e) + "non-finite value (" + std::to_string(value_at(t.dtype, t.data, bad)) +
                                    ") at index " + std::to_string(bad));
        }
    }

    // The tensor's bytes at an address aligned for its dtype: in place when the file allows (writers of
    // safetensors align their tensors), else a copy that lives as long as the model.
    const void *aligned_view(const Entry &e) {
        const SafetensorsTensor &t = *e.tensor;
        if (reinterpret_cast<uintptr_t>(t.data) % dtype_size(t.dtype) == 0) return t.data;
        storage_->buffers.emplace_back(t.data, t.data + t.bytes);
        return storage_->buffers.back().data();
    }

    // Every tensor must be one the layout names: anything else means the config does not describe this checkpoint.
    void check_names() const {
        std::set<std::string> known = {"model.embed_tokens.weight", "model.norm.weight"};
        auto add_linear = [&](const std::string &name) {
            for (const char *suffix : kLinearSuffixes) known.insert(name + suffix);
        };
        for (int32_t i = 0; i < config_.layers; ++i) {
            const std::string layer = "model.layers." + std::to_string(i) + ".";
            known.insert(layer + "input_layernorm.weight");
            known.insert(layer + "post_attention_layernorm.weight");
            for (const char *linear : kLayerLinears) add_linear(layer + linear);
        }
        add_linear("lm_head");
        for (const auto &kv : checkpoint_.tensors()) {
            const std::string &name = kv.first;
            if (known.count(name)) continue;
            // Older transformers versions saved RoPE's inverse frequencies; they follow from rope_theta and head_dim.
            if (starts_with(name, "model.") && ends_with(name, ".rotary_emb.inv_freq")) continue;
            const std::string file = squote(*kv.second.file) + ": ";
            std::string hint;
            const std::string layers = "model.layers.";
            if (starts_with(name, layers)) {
                const std::string last = std::to_string(config_.layers - 1);
                hint = config_.looped ? " (config.json's num_pre_layers = " + std::to_string(c_.pre) +
                                            ": the checkpoint's layers are model.layers.0 .. " + last +
                                            ", the pre blocks and then the looped block)"
                                      : " (config.json's num_hidden_layers = " + std::to_string(config_.layers) +
                                            ": the checkpoint's layers are model.layers.0 .. " + last + ")";
            }
            fail(TL_ERR_FORMAT, file + "unexpected tensor " + squote(name) + hint);
        }
    }

    // A plain config's layers: those before the last are pre blocks, and the last is looped once, unless the layers
    // at the end are one layer stored again and again (a looped model stored unrolled, as a Llama checkpoint stores
    // every layer): then the first of them is the looped block, applied as many times as it is stored. Layers are the
    // same when their tensors are: the same names, dtypes, shapes and bytes.
    void find_repeated_layers() {
        const int32_t last = config_.layers - 1;
        int32_t first = last;
        while (first > 0 && same_layer(first - 1, last)) --first;
        config_.model.pre = first;
        config_.model.loops = config_.layers - first;
        try {
            validate_config(config_.model);
        } catch (const Error &e) {
            fail_config_range(e, config_.path, config_.looped);
        }
    }

    // Layer i's tensors by their name after "model.layers.{i}.".
    std::map<std::string, const SafetensorsTensor *> layer_tensors(int32_t i) const {
        const std::string prefix = "model.layers." + std::to_string(i) + ".";
        std::map<std::string, const SafetensorsTensor *> out;
        const auto &all = checkpoint_.tensors();
        for (auto it = all.lower_bound(prefix); it != all.end() && starts_with(it->first, prefix); ++it) {
            out.emplace(it->first.substr(prefix.size()), it->second.tensor);
        }
        return out;
    }

    bool same_layer(int32_t a, int32_t b) const {
        const auto ta = layer_tensors(a), tb = layer_tensors(b);
        if (ta.size() != tb.size() || ta.empty()) return false;
        for (const auto &kv : ta) {
            const auto it = tb.find(kv.first);
            if (it == tb.end()) return false;
            const SafetensorsTensor &x = *kv.second, &y = *it->second;
            if (x.dtype != y.dtype || x.shape != y.shape || x.bytes != y.bytes ||
                std::memcmp(x.data, y.data, x.bytes) != 0) {
                return false;
            }
        }
        return true;
    }

    std::vector<float> read_norm(const std::string &name) const {
        const Entry &e = require(name, "");
        check_float(e, {c_.d_model}, "[hidden_size]");
        std::vector<float> gain(static_cast<size_t>(c_.d_model));
        for (size_t i = 0; i < gain.size(); ++i) gain[i] = value_at(e.tensor->dtype, e.tensor->data, i);
        return gain;
    }

    // `bias_why`: why the linear has a bias ("" when it has none): its .bias must then be there, and otherwise not.
    HfLinear read_linear(const std::string &name, int32_t k, int32_t n, const std::string &bias_why) {
        HfLinear lin;
        lin.name = name;
        const Entry *weight = find(name + ".weight");
        const Entry *qweight = find(name + ".qweight");
        const std::string kn = "(K = " + std::to_string(k) + ", N = " + std::to_string(n) + ")";
        lin.bias = read_bias(name, n, bias_why);
        if (weight && qweight) {
            fail(TL_ERR_FORMAT, squote(checkpoint_.source()) + ": linear " + squote(name) + " has both " +
                                    squote(name + ".weight") + " and " + squote(name + ".qweight"));
        }
        if (weight) {
            for (const char *suffix : {".qzeros", ".scales", ".g_idx"}) {
                if (const Entry *stray = find(name + suffix)) {
                    fail(TL_ERR_FORMAT, where(*stray) + "belongs to an INT4 linear, but " + squote(name) +
                                            " is dense (it has " + squote(name + ".weight") + ")");
                }
            }
            check_float(*weight, {n, k}, "[out, in] " + kn);
            lin.weight = weight;
            return lin;
        }
        if (!qweight) {
            require(name + ".weight", " (or " + name + ".qweight, .qzeros, .scales of a GPTQ / AWQ checkpoint)");
        }
        if (!config_.quant.present) {
            fail(TL_ERR_FORMAT, where(*qweight) +
                                    "an INT4 tensor, but config.json has no quantization_config (its quant_method "
                                    "'gptq' or 'awq' says how the tensor is packed)");
        }
        lin.int4 = read_int4(name, k, n, *qweight);
        any_int4_ = true;
        return lin;
    }

    // A linear's bias: transformers gives a linear one exactly when the config says so (and then loads it; without
    // the config's word it would leave a stored .bias unused), so the tensor must be there exactly then.
    std::shared_ptr<const std::vector<float>> read_bias(const std::string &name, int32_t n,
                                                        const std::string &why) const {
        const Entry *bias = find(name + ".bias");
        if (why.empty()) {
            if (bias) {
                fail(TL_ERR_FORMAT, where(*bias) + "a bias, but config.json gives " + squote(name) +
                                        " none (transformers would not use it: attention_bias, mlp_bias and "
                                        "model_type say which linears have biases)");
            }
            return nullptr;
        }
        if (!bias) require(name + ".bias", " (" + why + ")");
        check_float(*bias, {n}, "[out]");
        auto values = std::make_shared<std::vector<float>>(static_cast<size_t>(n));
        for (size_t i = 0; i < values->size(); ++i) (*values)[i] = value_at(bias->tensor->dtype, bias->tensor->data, i);
        return values;
    }

    QuantizedMatrix read_int4(const std::string &name, int32_t k, int32_t n, const Entry &qweight) const {
        const Quantization &q = config_.quant;
        const bool gptq = q.layout == Int4Layout::Gptq;
        const std::string linear = squote(checkpoint_.source()) + ": linear " + squote(name) + " (K = " +
                                   std::to_string(k) + ", N = " + std::to_string(n) + ", " + q.method + "): ";
        const int32_t gs = q.group_size == 0 ? k : q.group_size;
        if (k % gs != 0) {
            fail(TL_ERR_FORMAT, linear + "quantization_config.group_size " + std::to_string(gs) + " does not divide K");
        }
        // The packing's own constraints, checked here so that the shapes below are whole numbers.
        const int32_t per_word = 32 / q.bits;  // codes per int32
        const std::string pack = std::to_string(per_word);
        if (gptq && k % per_word != 0) {
            fail(TL_ERR_FORMAT, linear + "K must be a multiple of " + pack + " (qweight packs " + pack +
                                    " rows of K per int32)");
        }
        if (!gptq && k % 2 != 0) fail(TL_ERR_FORMAT, linear + "K must be even");
        if (n % per_word != 0) {
            fail(TL_ERR_FORMAT, linear + "N must be a multiple of " + pack + " (qzeros packs " + pack +
                                    " columns per int32)");
        }
        const int64_t groups = k / gs;
        const Entry &qzeros = require(name + ".qzeros", "");
        const Entry &scales = require(name + ".scales", "");
        const Entry *g_idx = find(name + ".g_idx");
        if (gptq) {
            check(qweight, {DType::I32}, {k / per_word, n}, "[K/" + pack + ", N] (" + std::to_string(q.bits) +
                                                                "-bit GPTQ)");
        } else {
            check(qweight, {DType::I32}, {k, n / 8}, "[K, N/8] (AWQ)");
        }
        check(qzeros, {DType::I32}, {groups, n / per_word}, "[G, N/" + pack + "] (G = K / group_size)");
        check(scales, {DType::F16}, {groups, n}, "[G, N] (G = K / group_size)");
        if (g_idx) {
            if (!gptq) fail(TL_ERR_FORMAT, where(*g_idx) + "AWQ checkpoints have no g_idx");
            check(*g_idx, {DType::I32}, {k}, "[K]");
        }

        // import_int4 reads typed arrays; a misaligned tensor is copied for the call only.
        std::vector<uint8_t> copies[4];
        auto typed = [&](const Entry *e, int slot) -> const void * {
            if (!e) return nullptr;
            const SafetensorsTensor &t = *e->tensor;
            if (reinterpret_cast<uintptr_t>(t.data) % dtype_size(t.dtype) == 0) return t.data;
            copies[slot].assign(t.data, t.data + t.bytes);
            return copies[slot].data();
        };
        Int4Checkpoint c;
        c.layout = q.layout;
        c.k = k;
        c.n = n;
        c.group_size = q.group_size;
        c.bits = q.bits;
        c.qweight = static_cast<const int32_t *>(typed(&qweight, 0));
        c.qzeros = static_cast<const int32_t *>(typed(&qzeros, 1));
        c.scales = static_cast<const uint16_t *>(typed(&scales, 2));
        c.g_idx = static_cast<const int32_t *>(typed(g_idx, 3));
        c.field_prefix = name + ".";  // so that its messages name the tensor: "<name>.g_idx[5] = ..."
        try {
            return import_int4(c);
        } catch (const Error &e) {
            // A bad value is an invalid argument to import_int4; here it is a malformed file. A g_idx with groups of
            // unequal size stays unsupported.
            fail(e.code() == TL_ERR_UNSUPPORTED ? TL_ERR_UNSUPPORTED : TL_ERR_FORMAT,
                 squote(checkpoint_.source()) + ": " + e.what());
        }
    }

    // A linear other than q|k|v: the dense weight in place, or the converted INT4 one.
    Linear make_linear(const std::string &name, HfLinear &&src, int32_t k, int32_t n) {
        if (src.quantized()) {
            Linear lin = make_quantized_linear(name, std::move(*src.int4));
            lin.bias = std::move(src.bias);
            return lin;
        }
        Linear lin;
        lin.bias = std::move(src.bias);
        lin.name = name;
        lin.k = k;
        lin.n = n;
        lin.quantized = false;
        lin.dense_dtype = src.weight->tensor->dtype;
        lin.dense = aligned_view(*src.weight);
        lin.keepalive = storage_;
        return lin;
    }

    // attn_qkv's (H + 2 KV) hd rows ([N][K], out-major) in the .tinyloop order [q | k | v], each head-major as the
    // projections' rows are: q_proj's, k_proj's and v_proj's rows as they are. Grouped-query attention stays grouped:
    // the K/V heads are stored once each (n_kv_heads), and the attention reads head h / (H / KV) for query head h, as
    // transformers' repeat_kv does.
    struct RowRange {
        int source;  // 0 q, 1 k, 2 v
        int64_t first, count;
    };
    std::vector<RowRange> qkv_rows() const {
        const int64_t q = c_.attn_dim(), kv = c_.kv_dim();
        return {{0, 0, q}, {1, 0, kv}, {2, 0, kv}};
    }

    Linear make_qkv(const std::string &name, HfLinear q, HfLinear k, HfLinear v) {
        const HfLinear *src[3] = {&q, &k, &v};
        for (const HfLinear *s : {&k, &v}) {
            if (s->quantized() != q.quantized()) {
                fail(TL_ERR_UNSUPPORTED, squote(checkpoint_.source()) + ": " + squote(q.name) + " is " +
                                             (q.quantized() ? "quantized" : "dense") + " but " + squote(s->name) +
                                             " is " + (s->quantized() ? "quantized" : "dense") +
                                             ": q, k and v become one linear (attn_qkv), stored one way");
            }
        }
        const int64_t kk = c_.d_model, n = c_.qkv_dim();
        // The bias rows follow the weight rows (q, k and v have one each or none: read_bias).
        std::shared_ptr<const std::vector<float>> bias;
        if (q.bias) {
            auto rows = std::make_shared<std::vector<float>>();
            for (const RowRange &r : qkv_rows()) {
                const std::vector<float> &b = *src[r.source]->bias;
                rows->insert(rows->end(), b.begin() + r.first, b.begin() + r.first + r.count);
            }
            bias = std::move(rows);
        }
        if (q.quantized()) {
            // Codes [N][K/2] and scales/zeros [N][G] are row-major in N, so concatenating along N appends rows.
            // q, k and v share K = hidden_size and the checkpoint's group size, hence G.
            // One linear reads its input in one order: act-order checkpoints give q, k and v the same g_idx, since
            // they share their input (and so GPTQ's Hessian).
            for (const HfLinear *s : {&k, &v}) {
                if (s->int4->k_perm != q.int4->k_perm) {
                    fail(TL_ERR_UNSUPPORTED, squote(checkpoint_.source()) + ": " + squote(s->name + ".g_idx") +
                                                 " orders K differently from " + squote(q.name + ".g_idx") +
                                                 ": q, k and v become one linear, which reads its input in one order");
                }
            }
            QuantizedMatrix out;
            out.k_perm = q.int4->k_perm;
            out.k = static_cast<int32_t>(kk);
            out.n = static_cast<int32_t>(n);
            out.group_size = q.int4->group_size;
            out.bits = q.int4->bits;  // one checkpoint, one width
            const size_t code_row = static_cast<size_t>(out.bits == 8 ? kk : kk / 2);
            const size_t groups = static_cast<size_t>(kk / out.group_size);
            out.codes.reserve(static_cast<size_t>(n) * code_row);
            out.scales.reserve(static_cast<size_t>(n) * groups);
            out.zeros.reserve(static_cast<size_t>(n) * groups);
            for (const RowRange &r : qkv_rows()) {
                const QuantizedMatrix &m = *src[r.source]->int4;
                const size_t first = static_cast<size_t>(r.first), end = first + static_cast<size_t>(r.count);
                out.codes.insert(out.codes.end(), m.codes.begin() + first * code_row, m.codes.begin() + end * code_row);
                out.scales.insert(out.scales.end(), m.scales.begin() + first * groups, m.scales.begin() + end * groups);
                if (!m.zeros.empty()) {
                    out.zeros.insert(out.zeros.end(), m.zeros.begin() + first * groups, m.zeros.begin() + end * groups);
                }
            }
            Linear lin = make_quantized_linear(name, std::move(out));
            lin.bias = std::move(bias);
            return lin;
        }
        // Dense: the rows' bytes as they are when q, k and v share a dtype; else all three widened to F32 (exact).
        DType dtype = q.weight->tensor->dtype;
        if (k.weight->tensor->dtype != dtype || v.weight->tensor->dtype != dtype) dtype = DType::F32;
        const size_t row_bytes = static_cast<size_t>(kk) * dtype_size(dtype);
        storage_->buffers.emplace_back(static_cast<size_t>(n) * row_bytes);
        std::vector<uint8_t> &out = storage_->buffers.back();
        uint8_t *dst = out.data();
        for (const RowRange &r : qkv_rows()) {
            const SafetensorsTensor &t = *src[r.source]->weight->tensor;
            if (t.dtype == dtype) {
                const size_t bytes = static_cast<size_t>(r.count) * row_bytes;
                std::memcpy(dst, t.data + static_cast<size_t>(r.first) * row_bytes, bytes);
                dst += bytes;
                continue;
            }
            const size_t begin = static_cast<size_t>(r.first * kk), count = static_cast<size_t>(r.count * kk);
            for (size_t i = 0; i < count; ++i, dst += sizeof(float)) {
                const float value = value_at(t.dtype, t.data, begin + i);
                std::memcpy(dst, &value, sizeof value);
            }
        }
        Linear lin;
        lin.name = name;
        lin.k = static_cast<int32_t>(kk);
        lin.n = static_cast<int32_t>(n);
        lin.quantized = false;
        lin.dense_dtype = dtype;
        lin.dense = out.data();
        lin.keepalive = storage_;
        lin.bias = std::move(bias);
        return lin;
    }

    void read_block(int32_t layer_index, const std::string &prefix, Block *block) {
        const std::string layer = "model.layers." + std::to_string(layer_index) + ".";
        const int32_t d = c_.d_model, a = c_.attn_dim(), kv = config_.kv_heads * c_.head_dim, f = c_.ffn;
        block->attn_norm = read_norm(layer + "input_layernorm.weight");
        block->mlp_norm = read_norm(layer + "post_attention_layernorm.weight");
        // One statement each (not function arguments, whose order is unspecified): the first bad tensor in the
        // layout's order is the one reported.
        const std::string &qkv_bias = config_.qkv_bias, &o_bias = config_.o_bias, &mlp_bias = config_.mlp_bias;
        HfLinear q = read_linear(layer + "self_attn.q_proj", d, a, qkv_bias);
        HfLinear k = read_linear(layer + "self_attn.k_proj", d, kv, qkv_bias);
        HfLinear v = read_linear(layer + "self_attn.v_proj", d, kv, qkv_bias);
        block->attn_qkv = make_qkv(prefix + "attn_qkv", std::move(q), std::move(k), std::move(v));
        block->attn_out =
            make_linear(prefix + "attn_out", read_linear(layer + "self_attn.o_proj", a, d, o_bias), a, d);
        block->mlp_gate = make_linear(prefix + "mlp_gate", read_linear(layer + "mlp.gate_proj", d, f, mlp_bias), d, f);
        block->mlp_up = make_linear(prefix + "mlp_up", read_linear(layer + "mlp.up_proj", d, f, mlp_bias), d, f);
        block->mlp_down = make_linear(prefix + "mlp_down", read_linear(layer + "mlp.down_proj", f, d, mlp_bias), f, d);
    }

    void read_head(const Entry &embed, Model *model) {
        const int32_t d = c_.d_model, v = c_.vocab;
        const Entry *weight = find("lm_head.weight");
        if (!config_.tied) {
            if (!weight && !find("lm_head.qweight")) {
                require("lm_head.weight", " (tie_word_embeddings is false; set it to true if the head is the "
                                          "embedding)");
            }
            model->head = make_linear("head", read_linear("lm_head", d, v, ""), d, v);
            model->head_kind = model->head.quantized ? HeadKind::Quantized : HeadKind::Dense;
            return;
        }
        read_bias("lm_head", v, "");  // refused if there: the tied head is the embedding, with no bias
        for (const char *suffix : {".qweight", ".qzeros", ".scales", ".g_idx"}) {
            if (const Entry *q = find(std::string("lm_head") + suffix)) {
                fail(TL_ERR_FORMAT, where(*q) + "tie_word_embeddings is true, so the head is the embedding, but the "
                                                "checkpoint has an INT4 lm_head");
            }
        }
        if (weight) {  // saved anyway (some writers do): it must be the embedding, or the config is wrong
            check_float(*weight, {v, d}, "[vocab_size, hidden_size]");
            const SafetensorsTensor &a = *embed.tensor, &b = *weight->tensor;
            if (a.dtype != b.dtype || std::memcmp(a.data, b.data, a.bytes) != 0) {
                const size_t count = static_cast<size_t>(v) * static_cast<size_t>(d);
                for (size_t i = 0; i < count; ++i) {
                    const float x = value_at(a.dtype, a.data, i), y = value_at(b.dtype, b.data, i);
                    if (x != y) {
                        fail(TL_ERR_FORMAT, where(*weight) + "tie_word_embeddings is true but the head differs from "
                                                             "model.embed_tokens.weight at index " +
                                                std::to_string(i) + " (" + std::to_string(y) + " vs " +
                                                std::to_string(x) + "); set tie_word_embeddings to false to keep it");
                    }
                }
            }
        }
        model->tie_head(storage_);
    }

    HfConfig config_;
    const ModelConfig &c_;
    const Checkpoint &checkpoint_;
    std::shared_ptr<Storage> storage_;
    CheckpointImportOptions options_;
    bool any_int4_ = false;
};

}  // namespace

std::unique_ptr<Model> import_checkpoint(const std::string &dir, const CheckpointImportOptions &options) {
    if (options.max_seq < 0) {
        fail(TL_ERR_INVALID_ARGUMENT, "max_seq must be >= 0 (0 = config.json's max_position_embeddings), got " +
                                          std::to_string(options.max_seq));
    }
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0) {
        fail(TL_ERR_IO, "cannot open checkpoint folder " + squote(dir) + ": " + errno_text(errno));
    }
    if (!S_ISDIR(st.st_mode)) {
        fail(TL_ERR_IO, squote(dir) + " is not a folder (a checkpoint is a folder with config.json and "
                                      "model.safetensors or model.safetensors.index.json)");
    }
    HfConfig config = read_config(dir, options);
    auto storage = std::make_shared<Storage>();
    const Checkpoint checkpoint(dir, options.use_mmap, storage.get());
    std::unique_ptr<Model> model = Importer(std::move(config), checkpoint, storage, options).build();
    set_tokenizer(*model, text::find_tokenizer(dir));  // tokenizer.json or tokenizer.model travels with the model
    return model;
}

void import_checkpoint_to_file(const std::string &dir, const std::string &out_path,
                               const CheckpointImportOptions &options) {
    const std::unique_ptr<Model> model = import_checkpoint(dir, options);
    save_model(out_path, *model);
}

}  // namespace tl
