/*
 * TinyLoop INT4 — C API.
 *
 * Plain C99, cbindgen-compatible: fixed-width <stdint.h> types, typed opaque handles, status values as
 * int32_t constants, no macros beyond the include guard, the export macro and the version numbers.
 *
 * Conventions (they hold for every function below unless its comment says otherwise):
 *  - Functions that can fail return a tl_status: TL_OK (0) or a negative TL_ERR_* value. Values are never
 *    renumbered; new ones are only appended.
 *  - Each status-returning call resets the calling thread's error message; on failure it sets a message that
 *    names the offending argument, tensor or file. tl_last_error_message() reads it.
 *  - Output pointers are written only on success, except the object creators (tl_model_load, tl_weight_create,
 *    tl_weight_quantize, tl_weight_import_int4), which set *out to NULL on failure so that a failed create never
 *    leaves a pointer to free.
 *  - Option and result structs start with `uint32_t struct_size`, which holds sizeof(the struct) as the caller
 *    was compiled with it. Each *_init function takes that size as its second argument (pass sizeof(*options)),
 *    writes only the first struct_size bytes of the caller's struct (the defaults, as far as they fit) and sets
 *    struct_size, so a caller built against an older, smaller header is never written past its struct.
 *    Input structs (options, descriptors): a smaller size from an older caller is accepted and the fields it
 *    lacks take their defaults; a size that is not the size of one of the struct's versions is
 *    TL_ERR_INVALID_ARGUMENT (from the *_init functions too, which then write nothing).
 *    Output structs (properties, reports, results, counts): the caller sets struct_size; any size from the
 *    struct's first version on is accepted. The library writes the first min(struct_size, its own size) bytes
 *    and sets struct_size to that number, so a caller built against a newer, larger header learns which fields
 *    this library filled.
 *  - Nothing in the library aborts or exits; C++ exceptions and CUDA errors become statuses.
 *  - *_free(NULL) is a no-op.
 *
 * Thread safety: a loaded tl_model is read-only after tl_model_load returns; any number of threads may call
 * the functions taking `const tl_model *` (tl_score included) on one model at the same time. A tl_weight
 * created by tl_weight_create / tl_weight_quantize / tl_weight_import_int4 is likewise read-only and may be
 * shared. Freeing an object while another thread uses it is the caller's bug. The log callback is process-global.
 *
 * Callbacks: the progress callback (tl_score_options.progress) may call any function of this library, tl_score
 * on the same model included; only freeing or re-packing the model being scored is the caller's bug. The log
 * callback must not call into the library: a status-returning function called from inside it returns
 * TL_ERR_UNSUPPORTED without doing anything (tl_status_string, tl_last_error_message and the version functions
 * work as usual).
 */
#ifndef TINYLOOP_H
#define TINYLOOP_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#  if defined(TINYLOOP_BUILDING_LIBRARY)
#    define TL_API __declspec(dllexport)
#  else
#    define TL_API
#  endif
#else
#  define TL_API __attribute__((visibility("default")))
#endif

#define TL_VERSION_MAJOR 0
#define TL_VERSION_MINOR 1
#define TL_VERSION_PATCH 0

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------------------
 * Status codes
 * ------------------------------------------------------------------------------------------------------- */

typedef int32_t tl_status;

static const tl_status TL_OK = 0;
/** An argument is NULL, out of range, or inconsistent with another argument. */
static const tl_status TL_ERR_INVALID_ARGUMENT = -1;
/** Host or device memory could not be allocated. */
static const tl_status TL_ERR_OUT_OF_MEMORY = -2;
/** A file could not be opened, mapped, read or written. */
static const tl_status TL_ERR_IO = -3;
/** A model file is malformed: bad header, offsets, dtypes, shapes, or values. */
static const tl_status TL_ERR_FORMAT = -4;
/** The request is valid but this build or this object does not support it. */
static const tl_status TL_ERR_UNSUPPORTED = -5;
/** A GPU was requested but the build has no CUDA support or the machine has no usable GPU. */
static const tl_status TL_ERR_NO_DEVICE = -6;
/** A CUDA runtime or library call failed; the message holds the CUDA error name. */
static const tl_status TL_ERR_CUDA = -7;
/** A bug in the library: an invariant did not hold. Please report it with the message. */
static const tl_status TL_ERR_INTERNAL = -8;
/** A caller-supplied buffer is smaller than required; the message gives the required size. */
static const tl_status TL_ERR_BUFFER_TOO_SMALL = -9;
/** A lookup by name or index found nothing. */
static const tl_status TL_ERR_NOT_FOUND = -10;
/** A progress callback asked to stop. */
static const tl_status TL_ERR_CANCELLED = -11;

/** Static English text for a status code ("unknown status" for values this library does not know). Never
 *  NULL; the string lives for the whole process. Thread-safe. */
TL_API const char *tl_status_string(tl_status status);

/** The calling thread's message for its last failed call ("" if the last status-returning call succeeded).
 *  Never NULL. Valid until the next call into this library on the same thread. Thread-safe (per thread). */
TL_API const char *tl_last_error_message(void);

/* ---------------------------------------------------------------------------------------------------------
 * Version and build
 * ------------------------------------------------------------------------------------------------------- */

/** The library's version as (major << 16) | (minor << 8) | patch. Compare with the TL_VERSION_* macros of
 *  the header you compiled against to detect a mismatched library. Thread-safe. */
TL_API uint32_t tl_version(void);

/** The version as "major.minor.patch". Static string. Thread-safe. */
TL_API const char *tl_version_string(void);

/** A JSON object describing the build: {"version", "compiler", "cuda" (bool), "cuda_version",
 *  "cuda_architectures" (array of ints), "build_type"}. Static string. Thread-safe. */
TL_API const char *tl_build_info(void);

/* ---------------------------------------------------------------------------------------------------------
 * Logging
 * ------------------------------------------------------------------------------------------------------- */

static const int32_t TL_LOG_ERROR = 0;
static const int32_t TL_LOG_WARN = 1;
static const int32_t TL_LOG_INFO = 2;
static const int32_t TL_LOG_DEBUG = 3;

/** Receives one line of text (no trailing newline) at a level. May be called from any thread the library
 *  runs on, possibly while the library holds locks; must not call back into the library (such calls return
 *  TL_ERR_UNSUPPORTED). */
typedef void (*tl_log_fn)(void *user_data, int32_t level, const char *message);

/** Sets the process-global log callback and the most verbose level passed to it. `callback == NULL` turns
 *  logging off (the default). Thread-safe; calls already under way may still reach the previous callback. */
TL_API tl_status tl_set_log_callback(tl_log_fn callback, void *user_data, int32_t max_level);

/* ---------------------------------------------------------------------------------------------------------
 * Models
 * ------------------------------------------------------------------------------------------------------- */

/** A loaded model. Opaque. Created by tl_model_load, freed by tl_model_free. Read-only once loaded. */
typedef struct tl_model tl_model;

/** A quantized linear layer: W[k, n] = q[n, k] * s[n, g] + z[n, g], g = k / group_size (see docs/format.md).
 *  Either borrowed from a model (valid until the model is freed; never pass it to tl_weight_free) or owned
 *  by the caller (from tl_weight_create / tl_weight_quantize / tl_weight_import_int4, freed with tl_weight_free). */
typedef struct tl_weight tl_weight;

typedef struct tl_load_options {
    uint32_t struct_size;
    /** 1 (default): memory-map the file; 0: read it into memory (for file systems that cannot map). */
    int32_t use_mmap;
    /** 1 (default): check every scale and zero, norm and embedding value for NaN/Inf at load time. */
    int32_t validate_values;
} tl_load_options;

/** Fills `options` with the defaults and sets struct_size; pass sizeof(*options) as struct_size. */
TL_API tl_status tl_load_options_init(tl_load_options *options, uint32_t struct_size);

/** Loads a .tinyloop file (a safetensors file; docs/format.md). `options` may be NULL for the defaults.
 *  On success *out_model owns the model; on failure *out_model is set to NULL. Statuses: TL_ERR_IO (cannot
 *  open/map/read), TL_ERR_FORMAT (malformed; the message names the tensor and the problem),
 *  TL_ERR_OUT_OF_MEMORY, TL_ERR_INVALID_ARGUMENT. Thread-safe (different calls share nothing). */
TL_API tl_status tl_model_load(const char *path, const tl_load_options *options, tl_model **out_model);

/** Frees a model and everything borrowed from it. NULL is a no-op. Not concurrent with other uses of it. */
TL_API void tl_model_free(tl_model *model);

typedef struct tl_model_properties {
    uint32_t struct_size;
    int32_t format_version;
    int32_t d_model;
    int32_t n_heads;
    int32_t head_dim;
    int32_t ffn;
    int32_t vocab;
    /** Number of unique blocks before the looped block. */
    int32_t n_pre;
    /** How many times the looped block is applied. */
    int32_t n_loops;
    int32_t max_seq;
    /** Quantization group size along K; 0 means per row (one group of size K per output column). */
    int32_t group_size;
    /** 4 or 8: the widest code width among the quantized linears (tl_weight_info gives each one's). */
    int32_t bits;
    float rope_theta;
    float norm_eps;
    /** Quantized linear layers (what tl_model_weight_at iterates). */
    uint32_t n_quant_weights;
    /** Linear layers stored unquantized (FP16/FP32). */
    uint32_t n_dense_linears;
    /** Tensors in the file. */
    uint32_t n_tensors;
    /** 1 if the head is quantized, 0 if dense, and 2 if tied to the embedding. */
    int32_t head_kind;
    /** 1 if any weight carries a frac4 / sign_bit channel. */
    int32_t has_frac4;
    int32_t has_sign_bit;
    uint64_t file_bytes;
    /** Bytes of all tensors' data in the file. */
    uint64_t tensor_bytes;
    /** Bytes of the quantized weights' codes, scales, zeros (and optional channels). */
    uint64_t quant_weight_bytes;
    /** Number of model parameters (a quantized weight counts K*N, a bias N). */
    uint64_t parameter_count;
    /** The beginning-of-text token the model file names (from the checkpoint's config.json, tokenizer_config.json
     *  or tokenizer.json at import), or -1 when it names none (added after the struct's first version). */
    int32_t bos_token_id;
    /** Key/value heads (grouped-query attention: query head h reads K/V head h / (n_heads / n_kv_heads)); n_heads
     *  for plain multi-head attention. (This and the fields below were added in the struct's third version.) */
    int32_t n_kv_heads;
    /** RoPE's frequency scaling (TL_ROPE_SCALING_*, docs/format.md), its factor (1 for none) and the original
     *  context length it scales from (0 where the type has none). */
    int32_t rope_scaling;
    float rope_scaling_factor;
    int32_t rope_original_max_positions;
} tl_model_properties;

/** tl_model_properties.rope_scaling: plain RoPE, or transformers' rope_scaling types. */
static const int32_t TL_ROPE_SCALING_NONE = 0;
static const int32_t TL_ROPE_SCALING_LINEAR = 1;
static const int32_t TL_ROPE_SCALING_DYNAMIC = 2;
static const int32_t TL_ROPE_SCALING_LLAMA3 = 3;
static const int32_t TL_ROPE_SCALING_YARN = 4;

/** Reads a model's configuration and counts into `*out` (whose struct_size the caller sets). */
TL_API tl_status tl_model_info(const tl_model *model, tl_model_properties *out);

/** Number of quantized weights in the model, the range of tl_model_weight_at's index. */
TL_API tl_status tl_model_weight_count(const tl_model *model, size_t *out_count);

/** The index-th quantized weight, in file order of blocks: pre.0.attn_qkv, …, loop.mlp_down, head.
 *  The weight is borrowed: valid until the model is freed. TL_ERR_NOT_FOUND when index is out of range. */
TL_API tl_status tl_model_weight_at(const tl_model *model, size_t index, const tl_weight **out_weight);

/** The quantized weight with this name (e.g. "loop.mlp_up"; docs/format.md). Borrowed like
 *  tl_model_weight_at. TL_ERR_NOT_FOUND if there is none. */
TL_API tl_status tl_model_find_weight(const tl_model *model, const char *name, const tl_weight **out_weight);

/* ---------------------------------------------------------------------------------------------------------
 * Quantized weights
 * ------------------------------------------------------------------------------------------------------- */

/** INT4 data from host memory. Layouts follow docs/format.md; all arrays are copied by tl_weight_create. */
typedef struct tl_weight_desc {
    uint32_t struct_size;
    /** Input features (rows of W). Even, > 0. */
    int32_t k;
    /** Output features (columns of W). > 0. */
    int32_t n;
    /** Group size along K; must divide k. 0 or k means per row. */
    int32_t group_size;
    /** Must be 4. */
    int32_t bits;
    /** [n][k/2] bytes; code of (k, n) in byte [n][k/2], low nibble for even k. */
    const uint8_t *codes;
    /** [n][k/group_size] IEEE half-precision bit patterns. Finite. */
    const uint16_t *scales;
    /** [n][k/group_size] half-precision offsets z (W = q*s + z). Finite. */
    const uint16_t *zeros;
    /** Optional (NULL): [n][k/2] next 4 bits below each code, same nibble order as codes. */
    const uint8_t *frac4;
    /** Optional (NULL): [n][k/8] one bit per code, bit (k % 8) of byte [n][k/8]. */
    const uint8_t *sign_bit;
    /** Optional (NULL): a name for messages and lookups. Copied. */
    const char *name;
} tl_weight_desc;

/** Fills `desc` with zeros/NULLs, bits = 4, and sets struct_size; pass sizeof(*desc) as struct_size. */
TL_API tl_status tl_weight_desc_init(tl_weight_desc *desc, uint32_t struct_size);

/** Creates an owned weight from host arrays (copied; the caller keeps its arrays). Validates sizes and that
 *  every scale and zero is finite. On failure *out_weight is set to NULL. */
TL_API tl_status tl_weight_create(const tl_weight_desc *desc, tl_weight **out_weight);

/** INT4 checkpoint layouts tl_weight_import_int4 reads (docs/format.md, "Importing GPTQ / AWQ weights"). */
/** AutoGPTQ / GPTQModel "v1": qweight packs 8 rows of K per int32, qzeros store zero - 1. */
static const int32_t TL_INT4_LAYOUT_GPTQ = 0;
/** AutoAWQ GEMM: qweight and qzeros pack 8 columns per int32 in AWQ's order 0, 2, 4, 6, 1, 3, 5, 7. */
static const int32_t TL_INT4_LAYOUT_AWQ = 1;

/** One quantized linear layer as a GPTQ or AWQ checkpoint stores it: the tensors' data in host memory, row-major,
 *  borrowed for the call (tl_weight_import_int4 copies what it keeps). G = k / group_size groups. The checkpoint's
 *  weight is W[k, n] = (q[k, n] - z[g, n]) * s[g, n], g = g_idx[k] (or k / group_size); nibbles are read low first. */
typedef struct tl_int4_import_desc {
    uint32_t struct_size;
    /** TL_INT4_LAYOUT_GPTQ (default) or TL_INT4_LAYOUT_AWQ. */
    int32_t layout;
    /** Input features (rows of W), in [1, 2^20]: a multiple of 8 for GPTQ, even for AWQ. */
    int32_t k;
    /** Output features (columns of W), in [1, 2^24], a multiple of 8. */
    int32_t n;
    /** Group size along K; must divide k. 0 (default) or k means per row (a checkpoint's -1). */
    int32_t group_size;
    /** GPTQ: [k/8][n], word [r][c] holds q of rows 8r..8r+7 of column c. AWQ: [k][n/8], word [r][c] holds
     *  columns 8c..8c+7 of row r, nibble i being column 8c + (0, 2, 4, 6, 1, 3, 5, 7)[i]. */
    const int32_t *qweight;
    /** [G][n/8], word [g][c] holds columns 8c..8c+7 (GPTQ: in order, each nibble being zero - 1; AWQ: in AWQ's
     *  order, the zero itself). */
    const int32_t *qzeros;
    /** [G][n] IEEE half-precision bit patterns. Finite. */
    const uint16_t *scales;
    /** Optional (NULL), GPTQ only: [k] the group of each input row, in [0, G). Any g_idx that gives every group
     *  group_size rows is accepted, act-order (desc_act) ones included (see tl_weight_import_int4). */
    const int32_t *g_idx;
    /** Optional (NULL): a name for messages and lookups. Copied. */
    const char *name;
} tl_int4_import_desc;

/** Fills `desc` with zeros/NULLs (layout TL_INT4_LAYOUT_GPTQ, per row) and sets struct_size; pass sizeof(*desc) as
 *  struct_size. */
TL_API tl_status tl_int4_import_desc_init(tl_int4_import_desc *desc, uint32_t struct_size);

/** Creates an owned weight (freed with tl_weight_free, packable with tl_weight_pack_marlin) from a GPTQ or AWQ
 *  checkpoint's tensors. The codes are kept, the scales copied, and each zero becomes the offset z' = -z * s,
 *  computed in FP32 and rounded once to FP16: that rounding is the only difference from the checkpoint's own
 *  dequantization. TL_ERR_INVALID_ARGUMENT (naming the field) for a NULL pointer, a bad layout, shape or group
 *  size, a g_idx value out of range, a scale that is not finite or an offset that overflows FP16;
 *  TL_ERR_UNSUPPORTED for a g_idx whose groups are not all group_size rows. An act-order g_idx (not k / group_size)
 *  is stored as contiguous groups plus a permutation of K that the weight applies to its input itself: the weight
 *  still means the checkpoint's W, for tl_weight_dequantize (rows in the checkpoint's K order) and tl_quant_gemm (x
 *  in that order; such a weight needs its workspace, see tl_quant_gemm_workspace_size). On failure *out_weight is
 *  set to NULL. */
TL_API tl_status tl_weight_import_int4(const tl_int4_import_desc *desc, tl_weight **out_weight);

/** Options of tl_model_import_checkpoint. */
typedef struct tl_import_options {
    uint32_t struct_size;
    /** The written model's max_seq (its default scoring window); 0 (default): config.json's
     *  max_position_embeddings (2048 when absent). */
    int32_t max_seq;
    /** 1 (default): memory-map the checkpoint's .safetensors files; 0: read each into memory. */
    int32_t use_mmap;
    /** 1 (default): check the embedding, norms and dense linears for NaN/Inf (INT4 scales are always checked). */
    int32_t validate_values;
} tl_import_options;

/** Fills `options` with the defaults and sets struct_size; pass sizeof(*options) as struct_size. */
TL_API tl_status tl_import_options_init(tl_import_options *options, uint32_t struct_size);

/** Converts a Hugging Face-style checkpoint folder into a .tinyloop file at `out_path` (docs/import.md): `dir`
 *  holds config.json (a Llama, Mistral or Qwen2 config, or a looped model's with num_pre_layers and num_loops),
 *  optionally AutoGPTQ's quantize_config.json, and model.safetensors or model.safetensors.index.json with its
 *  shards; linears are dense (kept dense: `tinyloop quantize` makes them INT4) or GPTQ v1 / AWQ GEMM INT4 (converted
 *  as tl_weight_import_int4 does). `options` may be NULL for the defaults. The output is written atomically.
 *  Statuses: TL_ERR_IO (a file cannot be opened, read or written), TL_ERR_FORMAT (a missing or mistyped config
 *  field or tensor, a wrong shape or dtype, an unexpected tensor, a non-finite value), TL_ERR_UNSUPPORTED (a
 *  checkpoint this library cannot represent: bits other than 4, another family such as Gemma, sliding-window
 *  attention narrower than max_seq, a config field it does not know, ...), TL_ERR_INVALID_ARGUMENT; the message
 *  names the file and the field or tensor. Thread-safe. */
TL_API tl_status tl_model_import_checkpoint(const char *dir, const char *out_path, const tl_import_options *options);

static const int32_t TL_QUANT_ASYMMETRIC = 0;
static const int32_t TL_QUANT_SYMMETRIC = 1;

typedef struct tl_quantize_options {
    uint32_t struct_size;
    /** TL_QUANT_ASYMMETRIC (default: min-max, W = q*s + z) or TL_QUANT_SYMMETRIC (W = (q - 8)*s, stored as
     *  z = -8*s so that every weight follows the same formula). */
    int32_t method;
    /** Group size along K; 0 (default) means per row. */
    int32_t group_size;
    /** Must be 4 (default). */
    int32_t bits;
} tl_quantize_options;

/** Fills `options` with the defaults and sets struct_size; pass sizeof(*options) as struct_size. */
TL_API tl_status tl_quantize_options_init(tl_quantize_options *options, uint32_t struct_size);

/** Quantizes a row-major FP32 matrix w[n][k] (row n holds W[:, n], like a PyTorch Linear weight) into an
 *  owned weight. `options` may be NULL for the defaults. Values must be finite. On failure *out_weight is set
 *  to NULL. */
TL_API tl_status tl_weight_quantize(const float *w, int32_t k, int32_t n, const tl_quantize_options *options,
                                    tl_weight **out_weight);

/** Frees an owned weight. NULL is a no-op. A weight borrowed from a model is left alone (its model owns it). */
TL_API void tl_weight_free(tl_weight *weight);

typedef struct tl_weight_properties {
    uint32_t struct_size;
    int32_t k;
    int32_t n;
    /** The actual group size along K (k for a per-row weight). */
    int32_t group_size;
    int32_t n_groups;
    int32_t bits;
    int32_t has_frac4;
    int32_t has_sign_bit;
    /** 1 if borrowed from a model, 0 if owned by the caller. */
    int32_t borrowed;
    /** Bytes of codes, scales, zeros and optional channels. */
    uint64_t bytes;
    /** The weight's name ("" if none). Valid while the weight lives. */
    const char *name;
} tl_weight_properties;

/** Reads a weight's shape and storage facts into `*out` (whose struct_size the caller sets). */
TL_API tl_status tl_weight_info(const tl_weight *weight, tl_weight_properties *out);

/** Dequantizes on the host into out[n][k] (row-major, out_len >= k*n floats): out[n*k + i] = W[i, n].
 *  TL_ERR_BUFFER_TOO_SMALL if out_len is short. */
TL_API tl_status tl_weight_dequantize(const tl_weight *weight, float *out, size_t out_len);

/* ---------------------------------------------------------------------------------------------------------
 * GPU: devices, packing, quantized GEMM
 *
 * Every function here needs a build with CUDA and a usable GPU; otherwise it returns TL_ERR_NO_DEVICE with a
 * message (tl_device_count alone succeeds, with 0). Streams are `cudaStream_t` values passed as `void *` (NULL =
 * the legacy default stream); device buffers are the caller's device pointers (cudaMalloc), never owned by the
 * library. CUDA failures become TL_ERR_CUDA with the CUDA error name in the message.
 * ------------------------------------------------------------------------------------------------------- */

/** Number of usable CUDA devices: 0 (and TL_OK) in a build without CUDA, on a machine without a GPU or without the
 *  NVIDIA driver. The library links no CUDA library dynamically (cuBLAS is loaded on first use), so it loads
 *  everywhere. Where a GPU works but cuBLAS cannot be loaded, tl_quant_gemm skips its cuBLAS paths and GPU scoring
 *  fails with TL_ERR_CUDA naming the library. */
TL_API tl_status tl_device_count(int32_t *out_count);

typedef struct tl_device_properties {
    uint32_t struct_size;
    /** NUL-terminated device name. */
    char name[256];
    /** Compute capability, e.g. 9 and 0 for an H100/H200. */
    int32_t sm_major;
    int32_t sm_minor;
    /** Streaming multiprocessors. */
    int32_t sm_count;
    uint64_t total_memory;
    uint64_t free_memory;
    /** 1 if this library's Marlin-class kernel runs on the device (SM 8.0 or newer). */
    int32_t marlin_supported;
} tl_device_properties;

/** Properties of device `device` (0-based) into `*out` (whose struct_size the caller sets). */
TL_API tl_status tl_device_info(int32_t device, tl_device_properties *out);

/** Forms a weight is given on the device by packing (bit flags). The file's own INT4 layout is always uploaded
 *  too: it feeds the native kernel, which every weight can fall back to. */
static const uint32_t TL_FORM_MARLIN_FUSED = 1;      /* Marlin-class tiles, zero point applied in registers */
static const uint32_t TL_FORM_MARLIN_CORRECTION = 2; /* the seed's form: symmetric tiles + delta correction */
static const uint32_t TL_FORM_FP16_BODY = 4;         /* a dequantized FP16 copy (memory for speed) */

typedef struct tl_pack_options {
    uint32_t struct_size;
    /** Device to upload to (default 0). */
    int32_t device;
    /** cudaStream_t for the uploads (default NULL); the call waits for them before returning. */
    void *stream;
    /** TL_FORM_* flags (default TL_FORM_MARLIN_FUSED | TL_FORM_MARLIN_CORRECTION). */
    uint32_t forms;
} tl_pack_options;

/** Fills `options` with the defaults and sets struct_size; pass sizeof(*options) as struct_size. */
TL_API tl_status tl_pack_options_init(tl_pack_options *options, uint32_t struct_size);

typedef struct tl_pack_report {
    uint32_t struct_size;
    /** Quantized weights now on the device (all of them, on success). */
    uint32_t weights_uploaded;
    /** Weights that received a Marlin-class form. */
    uint32_t weights_packed;
    /** Weights whose shape the Marlin-class kernel does not take even with K and N padded to multiples of 64 (a
     *  group size that is not 32 or a multiple of 64, or that does not divide the padded K): they run on the native
     *  kernel. */
    uint32_t weights_not_packable;
    /** Device memory held by all forms of these weights, in bytes. */
    uint64_t device_bytes;
    /** Of which the Marlin-class forms (and FP16 bodies) beyond the native upload. */
    uint64_t extra_device_bytes;
} tl_pack_report;

/** Fills `report` with zeros and sets struct_size; pass sizeof(*report) as struct_size. */
TL_API tl_status tl_pack_report_init(tl_pack_report *report, uint32_t struct_size);

/** Uploads every INT4 weight of `model` to the device and packs the requested forms, on the host, for
 *  those the Marlin-class kernel takes (INT8 weights are left out: tl_quant_gemm refuses them). Run once after
 *  loading; calling it again replaces earlier packs.
 *  `options` may be NULL for the defaults; `out_report` may be NULL. Not concurrent with any other use of
 *  the model (it changes the model's weights); afterwards the model is read-only again. For tl_quant_gemm on
 *  the model's weights: tl_score on the GPU packs its own copy (docs/api.md), so a model used only for scoring
 *  need not be packed. */
TL_API tl_status tl_pack_marlin(tl_model *model, const tl_pack_options *options, tl_pack_report *out_report);

/** The same for one owned weight (from tl_weight_create / tl_weight_quantize / tl_weight_import_int4).
 *  TL_ERR_INVALID_ARGUMENT for a weight borrowed from a model: pack the model instead. */
TL_API tl_status tl_weight_pack_marlin(tl_weight *weight, const tl_pack_options *options,
                                       tl_pack_report *out_report);

/** Dispatcher settings. Each model and each owned weight carries its own (tl_model_set_dispatch,
 *  tl_weight_set_dispatch): a model's apply to its scoring and to tl_quant_gemm on its weights. A setting a handle
 *  has not set follows the process-wide default (tl_set_dispatch), from that handle's next call on. The library
 *  reads no environment variable; the tinyloop tool maps its TINYLOOP_* variables onto its model's settings. */
/** 1 (default where the kernel runs) / 0: use the Marlin-class kernel. */
static const int32_t TL_DISPATCH_USE_MARLIN = 0;
/** 0 (default) / 1: use a weight's FP16 body (if packed) first; also makes tl_pack_marlin pack FP16 bodies. */
static const int32_t TL_DISPATCH_FP16_BODY = 1;
/** 0 (default) / 1: cross-iteration rounding of the looped block's weights that carry frac4/sign_bit channels
 *  (the rule: docs/quality.md), on both backends. The CUDA backend dequantizes those weights at each iteration with
 *  its codes and multiplies on cuBLAS, whatever the row count. */
static const int32_t TL_DISPATCH_CROSS_ITER_ROUND = 2;
/** Which Marlin-class form to prefer: 0 = the faster (default), 1 = fused, 2 = correction. */
static const int32_t TL_DISPATCH_MARLIN_MODE = 3;
/** M from which dequantize-to-FP16 + cuBLAS replaces the Marlin-class kernel (default 512, measured on the H200;
 *  0 = never). Weights with K·N <= 2^25 (2^24 on compute capability 9.0) switch at the smaller of this and 128 rows
 *  (measured: the Marlin-class kernels lose there); on compute capability 9.0 other weights switch at 4x this
 *  (measured: the TMA kernel wins at 1024 rows); weights with K·N >= 2^27 at twice that (measured: the Marlin-class
 *  kernels still win at twice the row count there). */
static const int32_t TL_DISPATCH_CUBLAS_MIN_M = 4;
/** GPU scoring's attention: 0 (default) the fastest tensor-core kernel that runs (warpgroup MMA on compute capability
 *  9.0, else mma.sync), 1 the FP32 SIMT kernel, 2 the mma.sync kernel (A/B runs). */
static const int32_t TL_DISPATCH_ATTENTION = 5;

/** Sets the process-wide default of a dispatcher setting: every handle that has not set it uses `value` from its
 *  next call on. Thread-safe; calls already under way use the old value. */
TL_API tl_status tl_set_dispatch(int32_t setting, int32_t value);
/** Reads the process-wide default of a dispatcher setting. */
TL_API tl_status tl_get_dispatch(int32_t setting, int32_t *out_value);
/** Sets a dispatcher setting on `model`: its scoring and tl_quant_gemm on its weights use `value`; -1 returns the
 *  setting to the process-wide default. Thread-safe (also while other threads score with the model); calls already
 *  under way use the old value. */
TL_API tl_status tl_model_set_dispatch(tl_model *model, int32_t setting, int32_t value);
/** The value `model` uses for `setting` now: its own, else the process-wide default. */
TL_API tl_status tl_model_get_dispatch(const tl_model *model, int32_t setting, int32_t *out_value);
/** Sets a dispatcher setting on an owned weight (from tl_weight_create / tl_weight_quantize /
 *  tl_weight_import_int4), as tl_model_set_dispatch does on a model; TL_ERR_INVALID_ARGUMENT for a weight borrowed
 *  from a model (set the model's). */
TL_API tl_status tl_weight_set_dispatch(tl_weight *weight, int32_t setting, int32_t value);
/** The value `weight` uses for `setting` now: its own (its model's, for a borrowed weight), else the process-wide
 *  default. */
TL_API tl_status tl_weight_get_dispatch(const tl_weight *weight, int32_t setting, int32_t *out_value);

/** Device memory and streams, for callers without their own CUDA runtime (Rust, Python through ctypes, dlopen).
 *  Pointers and streams made here are ordinary CUDA ones: they mix freely with the caller's own. */
/** cudaMalloc on `device`; *out_ptr is 256-byte aligned. `bytes` > 0. */
TL_API tl_status tl_device_malloc(int32_t device, size_t bytes, void **out_ptr);
/** Frees memory from tl_device_malloc (or cudaMalloc): stream-ordered on `stream` when it is not NULL
 *  (cudaFreeAsync), else after the device is idle (cudaFree). NULL ptr is a no-op. */
TL_API tl_status tl_device_free(void *ptr, void *stream);
/** Copies host → device, device → host, or device → device (`bytes` may be 0), ordered on `stream`; returns
 *  after the copy is complete (the stream is synchronized). */
TL_API tl_status tl_memcpy(void *dst, const void *src, size_t bytes, void *stream);
/** Sets `bytes` bytes of device memory to `value` (0..255), ordered on `stream`; returns without waiting. */
TL_API tl_status tl_memset_device(void *dst, int32_t value, size_t bytes, void *stream);
/** Creates a non-blocking stream on `device`. */
TL_API tl_status tl_stream_create(int32_t device, void **out_stream);
/** Destroys a stream from tl_stream_create (work already queued still completes). NULL is a no-op. */
TL_API tl_status tl_stream_destroy(void *stream);
/** Waits until all work queued on `stream` (NULL = the legacy default stream) is done. */
TL_API tl_status tl_stream_synchronize(void *stream);

/** Device workspace tl_quant_gemm needs for this weight at this M under the current dispatcher settings (0 is
 *  possible): the Marlin-class kernels' counters, x as the weight reads it when it differs from x (columns permuted
 *  for a weight imported from an act-order checkpoint, zero-padded for a K padded at packing), the padded output of a
 *  weight whose N was padded, and the scratch of the path that may run (the correction form's group sums, dequantize
 *  + cuBLAS's FP16 weight, cuBLAS's own workspace). Thread-safe. */
TL_API tl_status tl_quant_gemm_workspace_size(const tl_weight *weight, int64_t m, size_t *out_bytes);

/** Y = X · W on the GPU: x is FP16 [m][k] row-major, y FP16 [m][n] row-major, both device pointers on the
 *  weight's device, 16-byte aligned. The weight must have been packed (tl_pack_marlin / tl_weight_pack_marlin).
 *  `workspace` holds at least tl_quant_gemm_workspace_size(weight, m) bytes of device memory, zero-filled
 *  before its first use and not written by the caller between calls; NULL when that size is 0. Each call
 *  returns its counters region to zero when its work completes and uses the rest as scratch, whose contents
 *  after a call are unspecified. All per-call scratch comes from this workspace, so calls with different
 *  workspaces may run at the same time on one weight and one stream or many; one workspace must not serve two
 *  calls that can run at the same time (calls queued on one stream never do). A workspace smaller than the size
 *  above is not an error: a path whose share does not fit is skipped, as if it refused; but a weight that permutes
 *  its input (act-order) or whose K was padded needs at least the counters and that x, else
 *  TL_ERR_INVALID_ARGUMENT. Enqueued on `stream`; returns without waiting. The dispatcher tries, in order: the FP16
 *  body (if enabled and packed), the Marlin-class kernel (or dequantize + cuBLAS from TL_DISPATCH_CUBLAS_MIN_M on),
 *  the native INT4 kernel; a path that refuses the
 *  call falls through to the next, so the result is the same whichever ran. Thread-safe on a shared weight. */
TL_API tl_status tl_quant_gemm(const tl_weight *weight, const void *x, void *y, int64_t m, void *stream,
                               void *workspace, size_t workspace_bytes);

/** Element types of x and y for tl_quant_gemm_dtype. */
static const int32_t TL_DTYPE_FP16 = 0; /* IEEE binary16 */
static const int32_t TL_DTYPE_BF16 = 1; /* bfloat16: FP32's exponent range, 8 significant bits */

/** tl_quant_gemm with x and y of type `dtype` (TL_DTYPE_*; tl_quant_gemm is this with TL_DTYPE_FP16), with the same
 *  workspace (tl_quant_gemm_workspace_size holds for both types) and rules. For TL_DTYPE_BF16 the dispatcher skips
 *  the paths that hold FP16 weights (the FP16 body and the correction form) and tries the fused Marlin-class form
 *  (or dequantize + cuBLAS), then the native kernel. The weight W = q*s + z enters the products in FP32 (the native
 *  kernel, and the Marlin-class kernel for up to 16 rows, which applies s and z to FP32 sums), rounded once to BF16
 *  (dequantize + cuBLAS), or computed in BF16 from s and z rounded to BF16 (the Marlin-class kernels above 16 rows,
 *  as Marlin-class BF16 kernels do). Accumulation is FP32 on every path; y is rounded once to BF16. Another `dtype`
 *  is TL_ERR_INVALID_ARGUMENT. */
TL_API tl_status tl_quant_gemm_dtype(const tl_weight *weight, int32_t dtype, const void *x, void *y, int64_t m,
                                     void *stream, void *workspace, size_t workspace_bytes);

typedef struct tl_dispatch_counts {
    uint32_t struct_size;
    uint64_t fp16_body;
    uint64_t marlin_fused;
    uint64_t marlin_correction;
    uint64_t dequant_cublas;
    uint64_t native;
    /** Calls in which a path refused the call and a later one ran instead. */
    uint64_t fallbacks;
} tl_dispatch_counts;

/** How often each path ran for this weight since it was packed. Thread-safe. */
TL_API tl_status tl_weight_dispatch_counts(const tl_weight *weight, tl_dispatch_counts *out);

/* ---------------------------------------------------------------------------------------------------------
 * Scoring
 * ------------------------------------------------------------------------------------------------------- */

static const int32_t TL_BACKEND_AUTO = 0;
static const int32_t TL_BACKEND_CPU = 1;
static const int32_t TL_BACKEND_CUDA = 2;

/** Progress: `done` of `total` tokens processed. Return 0 to go on, non-zero to stop (the call then returns
 *  TL_ERR_CANCELLED). Called on the thread that called tl_score, between windows, with no lock of the library
 *  held: it may call into the library, tl_score on the same model included. When it runs, options->token_nll (if
 *  set) already holds the NLLs of the work reported done, so a caller can show a running perplexity: for tl_score
 *  token_nll[0, done); for tl_score_batch those of the first k sequences, whose tokens_scored add up to `done`
 *  (sequences finish in order). */
typedef int32_t (*tl_progress_fn)(void *user_data, uint64_t done, uint64_t total);

typedef struct tl_score_options {
    uint32_t struct_size;
    /** TL_BACKEND_AUTO (default): CUDA where this build and machine have a GPU (falling back to the CPU if the
     *  GPU path declines the request, e.g. an option it does not support), else the CPU. */
    int32_t backend;
    /** CPU worker threads; 0 (default) = the machine's hardware concurrency. */
    int32_t n_threads;
    /** Window length in tokens, 2..max_seq; 0 (default) = the model's max_seq. A longer sequence is scored
     *  in windows that overlap by one token, so every token but the first is predicted exactly once, with at
     *  most `window - 1` tokens of context (docs/architecture.md). */
    int32_t window;
    /** Optional progress callback and its user data. */
    tl_progress_fn progress;
    void *progress_user_data;
    /** Optional: receives each predicted position's NLL (natural log), token_nll[i] for token i + 1.
     *  Must hold token_nll_len >= n_tokens - 1 floats when not NULL (else TL_ERR_BUFFER_TOO_SMALL). */
    float *token_nll;
    size_t token_nll_len;
    /** CUDA backend: the device (default 0) and a cudaStream_t to run on (default NULL: the library's own
     *  stream for this model and device). The call returns when the work is done either way. */
    int32_t device;
    void *stream;
    /** CUDA backend: 1 (default) captures each window length's forward pass in a CUDA graph and replays it;
     *  0 runs every launch eagerly. Graphs measured faster, or within 3% at 4K-token windows (docs/benchmarks.md). */
    int32_t use_graphs;
    /** The most bytes of working memory the call may use for activations, scratch and logits: host memory on
     *  the CPU backend, device memory on the CUDA backend (the model's weights, the device copy the first CUDA
     *  call makes of them and the forms the first INT8 call adds, see `activations`, are not counted).
     *  0 (default): no budget beyond what the machine has. Sizes follow the tokens actually scored:
     *  min(window, n_tokens). Past the budget the call returns TL_ERR_OUT_OF_MEMORY before allocating, and the
     *  message gives the size it needed.
     *  (Added after the struct's first version: a caller built against the older header gets the default.) */
    uint64_t max_memory_bytes;
    /** Optional top-k log-probabilities (added in the struct's third version): 0 (default) for none, else 1..20
     *  (above 20 is TL_ERR_INVALID_ARGUMENT). For each predicted position i (token i + 1's prediction, laid out as
     *  token_nll: tl_score's n_tokens - 1 positions, tl_score_batch's sum of n_tokens - 1), the top_k most likely
     *  tokens, most likely first (ties: the lower id first), go to top_ids[i * top_k .. i * top_k + top_k) and their
     *  natural-log probabilities, logit - logsumexp(logits), to top_logprobs at the same offsets. Both arrays must
     *  be set and hold top_len >= positions * top_k entries (else TL_ERR_BUFFER_TOO_SMALL giving that number). The
     *  logits are reduced a chunk of positions at a time: nothing of size positions x vocab is ever allocated. */
    int32_t top_k;
    int32_t *top_ids;
    float *top_logprobs;
    size_t top_len;
    /** tl_score_batch only (added in the struct's fourth version): the beginning-of-text token that stands for an
     *  empty context, as evaluation harnesses expect. With TL_BOS_NONE (-1, the default) a sequence is scored as
     *  given (n_context 0 means 1). Otherwise a sequence given with n_context = 0 is scored as if this token came
     *  before its first: every one of its tokens is scored (n_tokens 1 is accepted), and it counts as n_tokens + 1
     *  tokens (for max_seq and the token_nll / top-k layout, whose entries for it are then its n_tokens tokens).
     *  TL_BOS_FROM_MODEL (-2): the model file's bos_token_id (tl_model_properties); a file that names none is
     *  TL_ERR_INVALID_ARGUMENT, saying to give the token id here. A value >= 0: that token id (< vocab). */
    int32_t empty_context_bos;
    /** The precision of the activations entering the linear layers (added in the struct's fifth version), one of
     *  TL_ACTIVATIONS_*. FP16 (the default) multiplies the activations as computed (FP32 on the CPU backend, FP16 on
     *  the CUDA backend). INT8 and FP8 quantize each token's input to every linear layer of the transformer blocks
     *  (not the head) with one scale per token, to INT8 or to FP8 e4m3, and multiply it with the weight's 4-bit codes
     *  in exact group sums, scales and zero offsets applied per group in FP32 (docs/quality.md, "Activation
     *  precision", gives the rule). The CPU backend implements all three. The CUDA backend runs INT8 on models whose
     *  block linears are all INT8 weights with one scale per row (W8A8, any GPU) or INT4 weights with one scale per
     *  row or groups of 32, 64 or 128 (W4A8, compute capability 9.0); it declines the rest and FP8
     *  (TL_ERR_UNSUPPORTED, naming the reason; AUTO then scores on the CPU).
     *  The first INT8 call on a model and device adds the device forms INT8 needs (0.5 byte a weight for INT4
     *  weights, 1 for INT8 ones), kept until the model is freed; FP16 calls never hold them (docs/api.md).
     *  Another value is TL_ERR_INVALID_ARGUMENT. */
    int32_t activations;
    /** Must be 0. It sets this version's size apart from the fourth's, whose tail padding `activations` fills. */
    int32_t reserved;
} tl_score_options;

/** tl_score_options.empty_context_bos: no beginning-of-text token (the default), or the model file's. */
static const int32_t TL_BOS_NONE = -1;
static const int32_t TL_BOS_FROM_MODEL = -2;

/** tl_score_options.activations, tl_compare_options.activations_reference / activations_test. */
static const int32_t TL_ACTIVATIONS_FP16 = 0;
static const int32_t TL_ACTIVATIONS_INT8 = 1;
static const int32_t TL_ACTIVATIONS_FP8 = 2;

/** Fills `options` with the defaults and sets struct_size; pass sizeof(*options) as struct_size. */
TL_API tl_status tl_score_options_init(tl_score_options *options, uint32_t struct_size);

typedef struct tl_score_result {
    uint32_t struct_size;
    /** Sum over scored tokens of -log p(token | prefix), natural log, accumulated in double. */
    double nll_sum;
    /** Number of tokens predicted (n_tokens - 1). */
    uint64_t tokens_scored;
    /** exp(nll_sum / tokens_scored). */
    double perplexity;
    /** The backend that ran (TL_BACKEND_CPU or TL_BACKEND_CUDA). */
    int32_t backend;
    /** Windows the sequence was split into. */
    int32_t n_windows;
    /** Wall-clock seconds spent in the call. */
    double seconds;
    /** CUDA backend: INT4 GEMMs by dispatcher path during this call (CUDA-graph replays included), FP16 GEMMs of
     *  dense or tied layers through cuBLAS, and calls in which a path refused and a later one ran. 0 on the CPU. */
    uint64_t gemm_marlin_fused;
    uint64_t gemm_marlin_correction;
    uint64_t gemm_dequant_cublas;
    uint64_t gemm_fp16_body;
    uint64_t gemm_native;
    uint64_t gemm_dense_cublas;
    uint64_t gemm_fallbacks;
    /** Of `seconds`, the one-time work this call did (0 when there was none; added after the struct's first
     *  version): setup_seconds, the device copy and INT4 packing of the model, which the first CUDA call on a
     *  device makes (packing runs on a thread pool), and the forms the first call asking for INT8 activations
     *  adds (`activations`); graph_capture_seconds, capturing and instantiating CUDA graphs
     *  for pass shapes not seen before. */
    double setup_seconds;
    double graph_capture_seconds;
} tl_score_result;

/** Fills `result` with zeros and sets struct_size; pass sizeof(*result) as struct_size. */
TL_API tl_status tl_score_result_init(tl_score_result *result, uint32_t struct_size);

/** Scores a token sequence: the NLL of each token given those before it. tokens[i] must be in
 *  [0, vocab); n_tokens >= 2. `options` may be NULL for the defaults; `out_result` must have its
 *  struct_size set (tl_score_result_init). Thread-safe on a shared model. */
TL_API tl_status tl_score(const tl_model *model, const int32_t *tokens, size_t n_tokens,
                          const tl_score_options *options, tl_score_result *out_result);

/* ---------------------------------------------------------------------------------------------------------
 * Scoring many sequences in one call
 * ------------------------------------------------------------------------------------------------------- */

/** One independent sequence (a document, or an lm-eval loglikelihood request: context + continuation). The
 *  first n_context tokens are context only: the tokens after them are scored, each given every token before it
 *  in the sequence. n_context 0 means 1 (the first token has nothing to be predicted from). Fixed layout: this
 *  struct is never extended (a new version would come with a new function). */
typedef struct tl_sequence {
    const int32_t *tokens;
    size_t n_tokens;
    size_t n_context;
} tl_sequence;

/** What tl_score_batch reports for one sequence. Fixed layout, like tl_sequence. */
typedef struct tl_sequence_score {
    /** Sum of -log p(token | the tokens before it) over the scored tokens, natural log. */
    double nll_sum;
    /** Tokens scored: n_tokens - max(n_context, 1). */
    uint64_t tokens_scored;
    /** 1 when greedy decoding reproduces every scored token: at each scored position the token's logit equals
     *  the largest logit (a tie counts as greedy), else 0. */
    int32_t greedy;
} tl_sequence_score;

/** Scores `n_sequences` independent sequences in one call; the backends pack many of them into each forward
 *  pass (attention stays inside each sequence). Each sequence needs 2 <= n_tokens <= the model's max_seq,
 *  n_context < n_tokens and every token in [0, vocab) (TL_ERR_INVALID_ARGUMENT names the sequence and index).
 *  out_scores receives n_sequences entries, in order. `options` as for tl_score, except:
 *  options->window must be 0 (sequences are never split); options->token_nll, when not NULL, receives the NLL
 *  of every token but each sequence's first, context tokens included, the sequences one after another
 *  (sequence i's token j >= 1 at offset sum_{i' < i}(n_tokens_{i'} - 1) + j - 1), so token_nll_len must be at
 *  least the sum of n_tokens - 1; the progress callback counts scored tokens (done, total: sums of
 *  tokens_scored) and is called between forward passes. out_result (optional, may be NULL) receives the totals:
 *  nll_sum and tokens_scored over all sequences, their perplexity, the backend, n_windows = the number of
 *  sequences, seconds and the GEMM counts. out_scores (and out_result) are written only when the call succeeds.
 *  n_sequences 0 is an empty batch: TL_OK with zero totals, nothing run (no GPU upload, no progress call), and
 *  sequences and out_scores may be NULL. Thread-safe on a shared model. */
TL_API tl_status tl_score_batch(const tl_model *model, const tl_sequence *sequences, size_t n_sequences,
                                const tl_score_options *options, tl_sequence_score *out_scores,
                                tl_score_result *out_result);

/* ---------------------------------------------------------------------------------------------------------
 * Comparing two models on one text
 * ------------------------------------------------------------------------------------------------------- */

typedef struct tl_compare_options {
    uint32_t struct_size;
    /** As tl_score_options: backend (AUTO, CPU or CUDA; both models run on it), CPU threads, window (0 = the
     *  shorter max_seq of the two models), progress callback (done, total in predicted positions, between windows
     *  or passes), CUDA device and stream, CUDA graphs, and the working-memory budget of both models together. */
    int32_t backend;
    int32_t n_threads;
    int32_t window;
    tl_progress_fn progress;
    void *progress_user_data;
    int32_t device;
    void *stream;
    int32_t use_graphs;
    uint64_t max_memory_bytes;
    /** Optional per-position outputs (NULL: not wanted), each of token_len >= n_tokens - 1 entries when set (else
     *  TL_ERR_BUFFER_TOO_SMALL): position i, the prediction of token i + 1, gets KL(P_reference || P_test) in nats,
     *  the reference's and the test's NLL (natural log), and 1 when both models' most likely token is the same (the
     *  lowest id among ties), else 0. */
    float *token_kl;
    float *token_nll_reference;
    float *token_nll_test;
    uint8_t *token_top1_match;
    size_t token_len;
    /** Each side's activation precision, TL_ACTIVATIONS_* as tl_score_options.activations (default FP16; added in
     *  the struct's second version). A model compared with itself at another precision measures what that
     *  precision costs: the KL divergence of INT8 or FP8 activations against FP16 ones. */
    int32_t activations_reference;
    int32_t activations_test;
} tl_compare_options;

/** Fills `options` with the defaults (backend AUTO, use_graphs 1, the rest 0/NULL) and sets struct_size; pass
 *  sizeof(*options) as struct_size. */
TL_API tl_status tl_compare_options_init(tl_compare_options *options, uint32_t struct_size);

typedef struct tl_compare_result {
    uint32_t struct_size;
    /** Positions compared: n_tokens - 1. */
    uint64_t tokens_scored;
    /** KL(P_reference || P_test) per position, nats: mean, the mean's standard error (sample standard deviation /
     *  sqrt(n); NaN below 2 positions), and exact order statistics of the per-position values (linear interpolation
     *  between the two nearest ranks): median, 90th, 99th and 99.9th percentiles, maximum and minimum. */
    double kl_mean;
    double kl_stderr;
    double kl_median;
    double kl_p90;
    double kl_p99;
    double kl_p999;
    double kl_max;
    double kl_min;
    /** Fraction of positions where both models' most likely token is the same. */
    double top1_agreement;
    /** Each model's NLL sum and perplexity over the same positions; delta_perplexity = test - reference,
     *  perplexity_ratio = test / reference. */
    double nll_sum_reference;
    double nll_sum_test;
    double perplexity_reference;
    double perplexity_test;
    double delta_perplexity;
    double perplexity_ratio;
    /** Pearson's correlation of the two models' per-position NLLs (NaN when either is constant). */
    double nll_correlation;
    /** The backend that ran, windows, wall-clock seconds, and the one-time GPU set-up of both models (as
     *  tl_score_result's setup_seconds). */
    int32_t backend;
    int32_t n_windows;
    double seconds;
    double setup_seconds;
} tl_compare_result;

/** Fills `result` with zeros and sets struct_size; pass sizeof(*result) as struct_size. */
TL_API tl_status tl_compare_result_init(tl_compare_result *result, uint32_t struct_size);

/** Runs `reference` and `test` on the same windows of `tokens` (as tl_score splits them) and compares their
 *  predictions position by position: KL(P_reference || P_test), both NLLs and top-1 agreement, summarized in
 *  *out_result (llama-perplexity's KL-divergence report). The models must share a vocabulary: the same vocab size
 *  and tokenizer kind, else TL_ERR_INVALID_ARGUMENT naming both; they may differ in everything else (a dense model
 *  against its INT4 quantization), and may be the same model. The two models' logits exist a chunk of positions at
 *  a time (on the GPU, the scoring pass's logits chunk of each model, compared by one kernel), never for the whole
 *  text; the summary keeps one float per position. n_tokens >= 2, tokens in [0, vocab). On the CUDA backend both
 *  models run on options->device; AUTO falls back to the CPU when the GPU path declines. `options` may be NULL.
 *  Thread-safe on shared models. */
TL_API tl_status tl_score_compare(const tl_model *reference, const tl_model *test, const int32_t *tokens,
                                  size_t n_tokens, const tl_compare_options *options, tl_compare_result *out_result);

/* ---------------------------------------------------------------------------------------------------------
 * Text: the model's tokenizer
 *
 * A model file may store its tokenizer (docs/format.md, "The tokenizer"): `tinyloop import` takes a checkpoint
 * folder's tokenizer.json (a Hugging Face byte-level BPE: GPT-2, Llama 3, Qwen2 style) or tokenizer.model (a
 * SentencePiece model: Llama 2, Mistral), and `tinyloop set-tokenizer` adds one to a model file. A model without
 * one is byte-level: each byte of the text is one token, its value the id. Neither function adds a beginning- or
 * end-of-text token (a tokenizer.json's post_processor and SentencePiece's add_bos are not applied): a caller who
 * wants one puts its id first (with a tokenizer.json, writing the special token's text, "<|begin_of_text|>" say,
 * gives its id too: added tokens are matched literally). Both are thread-safe on a shared model.
 * ------------------------------------------------------------------------------------------------------- */

/** Tokenizer kinds (tl_model_tokenizer). */
static const int32_t TL_TOKENIZER_BYTES = 0;         /* none stored: one token per byte, ids 0-255 */
static const int32_t TL_TOKENIZER_HUGGINGFACE = 1;   /* a tokenizer.json holding a byte-level BPE */
static const int32_t TL_TOKENIZER_SENTENCEPIECE = 2; /* a SentencePiece tokenizer.model */

/** The model's tokenizer: its kind (TL_TOKENIZER_*) into *out_kind and, when out_n_ids is not NULL, one more than
 *  the largest id it can give or take into *out_n_ids (256 for byte-level; at most the model's vocab otherwise). */
TL_API tl_status tl_model_tokenizer(const tl_model *model, int32_t *out_kind, int32_t *out_n_ids);

/** Token ids of `len` bytes of text (`text` may be NULL when len is 0; it need not be NUL-terminated and may hold
 *  NUL bytes) by the model's tokenizer. A tokenizer.json or tokenizer.model needs valid UTF-8:
 *  TL_ERR_INVALID_ARGUMENT otherwise, naming the offset of the first bad byte; byte-level takes any bytes.
 *  On success *out_n is the number of ids and out_ids[0 .. *out_n) holds them. When they do not fit in `cap`, the
 *  call returns TL_ERR_BUFFER_TOO_SMALL, writes nothing to out_ids and sets *out_n to the number needed (the one
 *  output written on failure): call with cap 0 (out_ids may then be NULL) to learn the size. There is no bound
 *  by `len` alone (SentencePiece's dummy prefix may make one byte two tokens). */
TL_API tl_status tl_tokenize(const tl_model *model, const char *text, size_t len, int32_t *out_ids, size_t cap,
                             size_t *out_n);

/** The text of `n_ids` token ids (`ids` may be NULL when n_ids is 0): the bytes each token stands for, an added or
 *  special token's text included (SentencePiece's control tokens, <s> and </s>, decode to nothing). The result is
 *  not NUL-terminated and need not be valid UTF-8 (a token may hold part of a character); byte-level gives the bytes
 *  themselves. An id that is no token of the tokenizer is TL_ERR_INVALID_ARGUMENT naming its index. On success
 *  *out_len is the number of bytes and out_text[0 .. *out_len) holds them; when they do not fit in `cap`, the call
 *  returns TL_ERR_BUFFER_TOO_SMALL, writes nothing to out_text and sets *out_len to the number needed (call with
 *  cap 0, out_text NULL, to learn it). */
TL_API tl_status tl_detokenize(const tl_model *model, const int32_t *ids, size_t n_ids, char *out_text, size_t cap,
                               size_t *out_len);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TINYLOOP_H */
