//! Raw FFI bindings to the TinyLoop INT4 C API, mirroring `capi/include/tinyloop.h` item for item.
//!
//! Everything here is `unsafe` to use and documented in the header, which is the contract; the safe API is the
//! `tinyloop` crate. Names keep their C spelling so the header and these bindings read the same. A drift test
//! (`cargo test -p tinyloop-sys`) compares this file with bindgen's bindings of the header: constants (values
//! and types), type aliases, opaque handles, struct layouts (size, alignment, field names, order, offsets and
//! types) and function signatures.
//!
//! The library is linked from `TINYLOOP_LIB_DIR`, or is an installed one that pkg-config finds (controlled by
//! `TINYLOOP_SYS_USE_PKG_CONFIG`), or is compiled by the build script from the C++ sources (the repository's, or
//! the `csrc/` copy a packaged crate carries) with CMake's Release flags; see the crate README.

#![allow(non_camel_case_types)]

use std::ffi::c_void;
use std::marker::{PhantomData, PhantomPinned};
use std::os::raw::c_char;

/// Declares constants and, for the drift test, the table of their names, values and types.
macro_rules! c_constants {
    ($( $(#[$meta:meta])* pub const $name:ident : $ty:ty = $value:expr ; )*) => {
        $( $(#[$meta])* pub const $name: $ty = $value; )*

        #[cfg(test)]
        drift_table!(constants: $($name),*);
    };
}

/// Declares type aliases and, for the drift test, the table of the types they name.
macro_rules! c_types {
    ($( $(#[$meta:meta])* pub type $name:ident = $ty:ty ; )*) => {
        $( $(#[$meta])* pub type $name = $ty; )*

        #[cfg(test)]
        drift_table!(types: $($name),*);
    };
}

/// Declares `#[repr(C)]` structs and, for the drift test, the table of each one's size, alignment and fields in
/// order with their offsets and types.
macro_rules! c_structs {
    ($(
        $(#[$meta:meta])*
        pub struct $name:ident { $( $(#[$field_meta:meta])* pub $field:ident : $ty:ty ),* $(,)? }
    )*) => {
        $(
            $(#[$meta])*
            #[repr(C)]
            #[derive(Debug, Clone, Copy)]
            pub struct $name { $( $(#[$field_meta])* pub $field: $ty ),* }
        )*

        #[cfg(test)]
        drift_table!(structs: $($name { $($field),* })*);
    };
}

/// Declares the library's functions and, for the drift test, the table of their names and signatures.
macro_rules! c_functions {
    ($( $(#[$meta:meta])* pub fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) $(-> $ret:ty)? ; )*) => {
        extern "C" {
            $( $(#[$meta])* pub fn $name($($arg: $ty),*) $(-> $ret)?; )*
        }

        #[cfg(test)]
        drift_table!(functions: $($name($($arg),*))*);
    };
}

/// Declares opaque C handles: zero-sized, only ever used behind a pointer, and neither `Send`, `Sync` nor
/// `Unpin` (the safe crate decides what may cross threads). For the drift test, also the table of their names.
macro_rules! opaque_handles {
    ($( $(#[$meta:meta])* $name:ident ; )*) => {
        $(
            $(#[$meta])*
            #[repr(C)]
            pub struct $name {
                _private: [u8; 0],
                _marker: PhantomData<(*mut u8, PhantomPinned)>,
            }
        )*

        #[cfg(test)]
        drift_table!(handles: $($name),*);
    };
}

/// Builds one of the drift test's tables, as a function named after its kind (`drift_constants`,
/// `drift_types`, `drift_handles`, `drift_structs`, `drift_functions`) in the module where it is invoked. The
/// declaring macros above invoke it for these bindings; the bindgen bindings of the header invoke it in the same
/// forms (the `tinyloop-sys-header-bindgen` crate), so both sides' tables are made by the same code from the
/// compiled items: values, sizes, offsets and types are the compiler's, not text.
#[cfg(test)]
macro_rules! drift_table {
    (constants: $($name:ident),* $(,)?) => {
        pub(crate) fn drift_constants() -> Vec<crate::drift_tests::Constant> {
            vec![$(crate::drift_tests::Constant {
                name: stringify!($name),
                value: $name as i64,
                type_name: crate::drift_tests::type_name_of(&$name),
            }),*]
        }
    };
    (types: $($name:ident),* $(,)?) => {
        pub(crate) fn drift_types() -> Vec<crate::drift_tests::Alias> {
            vec![$(crate::drift_tests::Alias { name: stringify!($name), type_name: std::any::type_name::<$name>() }),*]
        }
    };
    (handles: $($name:ident),* $(,)?) => {
        pub(crate) fn drift_handles() -> Vec<&'static str> {
            vec![$(stringify!($name)),*]
        }
    };
    (structs: $($name:ident { $($field:ident),* $(,)? })*) => {
        pub(crate) fn drift_structs() -> Vec<crate::drift_tests::StructLayout> {
            vec![$(crate::drift_tests::StructLayout {
                name: stringify!($name),
                size: std::mem::size_of::<$name>(),
                align: std::mem::align_of::<$name>(),
                fields: vec![$(crate::drift_tests::Field {
                    name: stringify!($field),
                    offset: field_offset!($name, $field),
                    type_name: crate::drift_tests::field_type_name(|value: &$name| &value.$field),
                }),*],
            }),*]
        }
    };
    (functions: $($name:ident ( $($parameter:ident),* $(,)? ))*) => {
        pub(crate) fn drift_functions() -> Vec<crate::drift_tests::Function> {
            vec![$(crate::drift_tests::Function {
                name: stringify!($name),
                // The function as a pointer: its type is the signature, parameter and return types resolved.
                signature: crate::drift_tests::type_name_of(
                    &($name as unsafe extern "C" fn($(drift_table!(@infer $parameter)),*) -> _),
                ),
            }),*]
        }
    };
    (@infer $parameter:ident) => { _ };
}

/// The byte offset of a field (what `std::mem::offset_of!` gives from Rust 1.77; this works on Debian's 1.63).
#[cfg(test)]
macro_rules! field_offset {
    ($type:ty, $field:ident) => {{
        let value = std::mem::MaybeUninit::<$type>::uninit();
        let base = value.as_ptr();
        // SAFETY: addr_of! computes the field's address inside the allocation without reading it.
        let field = unsafe { std::ptr::addr_of!((*base).$field) };
        field as usize - base as usize
    }};
}

c_types! {
    /// `TL_OK` or a negative `TL_ERR_*` value.
    pub type tl_status = i32;
    /// Receives one log line (no trailing newline) at a level; must not call back into the library.
    pub type tl_log_fn = Option<unsafe extern "C" fn(user_data: *mut c_void, level: i32, message: *const c_char)>;
    /// Progress of `tl_score`: return 0 to go on, non-zero to stop with `TL_ERR_CANCELLED`.
    pub type tl_progress_fn = Option<unsafe extern "C" fn(user_data: *mut c_void, done: u64, total: u64) -> i32>;
}

c_constants! {
    /// The version of the header these bindings mirror (`TL_VERSION_MAJOR`).
    pub const TL_VERSION_MAJOR: u32 = 0;
    /// `TL_VERSION_MINOR` of the mirrored header.
    pub const TL_VERSION_MINOR: u32 = 1;
    /// `TL_VERSION_PATCH` of the mirrored header.
    pub const TL_VERSION_PATCH: u32 = 0;

    /// Success.
    pub const TL_OK: tl_status = 0;
    /// An argument is NULL, out of range, or inconsistent with another argument.
    pub const TL_ERR_INVALID_ARGUMENT: tl_status = -1;
    /// Host or device memory could not be allocated.
    pub const TL_ERR_OUT_OF_MEMORY: tl_status = -2;
    /// A file could not be opened, mapped, read or written.
    pub const TL_ERR_IO: tl_status = -3;
    /// A model file is malformed.
    pub const TL_ERR_FORMAT: tl_status = -4;
    /// The request is valid but this build or this object does not support it.
    pub const TL_ERR_UNSUPPORTED: tl_status = -5;
    /// A GPU was requested but there is none usable (or no CUDA support in the build).
    pub const TL_ERR_NO_DEVICE: tl_status = -6;
    /// A CUDA runtime or library call failed.
    pub const TL_ERR_CUDA: tl_status = -7;
    /// A bug in the library.
    pub const TL_ERR_INTERNAL: tl_status = -8;
    /// A caller-supplied buffer is smaller than required.
    pub const TL_ERR_BUFFER_TOO_SMALL: tl_status = -9;
    /// A lookup by name or index found nothing.
    pub const TL_ERR_NOT_FOUND: tl_status = -10;
    /// A progress callback asked to stop.
    pub const TL_ERR_CANCELLED: tl_status = -11;

    /// Log level: errors.
    pub const TL_LOG_ERROR: i32 = 0;
    /// Log level: warnings.
    pub const TL_LOG_WARN: i32 = 1;
    /// Log level: information.
    pub const TL_LOG_INFO: i32 = 2;
    /// Log level: debugging detail.
    pub const TL_LOG_DEBUG: i32 = 3;

    /// INT4 checkpoint layout: AutoGPTQ / GPTQModel "v1" (`tl_weight_import_int4`).
    pub const TL_INT4_LAYOUT_GPTQ: i32 = 0;
    /// INT4 checkpoint layout: AutoAWQ GEMM (`tl_weight_import_int4`).
    pub const TL_INT4_LAYOUT_AWQ: i32 = 1;

    /// Min-max quantization, W = q*s + z.
    pub const TL_QUANT_ASYMMETRIC: i32 = 0;
    /// Symmetric quantization, W = (q - 8)*s, stored with z = -8*s.
    pub const TL_QUANT_SYMMETRIC: i32 = 1;

    /// Device form: Marlin-class tiles with the zero point applied in registers.
    pub const TL_FORM_MARLIN_FUSED: u32 = 1;
    /// Device form: the seed's symmetric tiles plus the delta correction.
    pub const TL_FORM_MARLIN_CORRECTION: u32 = 2;
    /// Device form: a dequantized FP16 copy.
    pub const TL_FORM_FP16_BODY: u32 = 4;

    /// Dispatcher setting: use the Marlin-class kernel (0/1).
    pub const TL_DISPATCH_USE_MARLIN: i32 = 0;
    /// Dispatcher setting: use a packed FP16 body first (0/1).
    pub const TL_DISPATCH_FP16_BODY: i32 = 1;
    /// Dispatcher setting: cross-iteration rounding (0/1).
    pub const TL_DISPATCH_CROSS_ITER_ROUND: i32 = 2;
    /// Dispatcher setting: Marlin-class form, 0 = faster, 1 = fused, 2 = correction.
    pub const TL_DISPATCH_MARLIN_MODE: i32 = 3;
    /// Dispatcher setting: M from which dequantize + cuBLAS is used (0 = never).
    pub const TL_DISPATCH_CUBLAS_MIN_M: i32 = 4;
    /// Dispatcher setting: GPU scoring's attention, 0 = the fastest tensor-core kernel, 1 = the FP32 SIMT kernel,
    /// 2 = the `mma.sync` kernel.
    pub const TL_DISPATCH_ATTENTION: i32 = 5;

    /// `tl_score_options.empty_context_bos`: no beginning-of-text token for an empty context (the default).
    pub const TL_BOS_NONE: i32 = -1;
    /// `tl_score_options.empty_context_bos`: the model file's `bos_token_id`.
    pub const TL_BOS_FROM_MODEL: i32 = -2;

    /// `tl_score_options.activations`, `tl_compare_options.activations_*`: the activations as computed (default).
    pub const TL_ACTIVATIONS_FP16: i32 = 0;
    /// Each token's linear-layer input quantized to INT8 (one scale per token).
    pub const TL_ACTIVATIONS_INT8: i32 = 1;
    /// Each token's linear-layer input quantized to FP8 e4m3 (one scale per token).
    pub const TL_ACTIVATIONS_FP8: i32 = 2;

    /// `tl_model_properties.rope_scaling`: plain RoPE.
    pub const TL_ROPE_SCALING_NONE: i32 = 0;
    /// `tl_model_properties.rope_scaling`: every inverse frequency divided by the factor.
    pub const TL_ROPE_SCALING_LINEAR: i32 = 1;
    /// `tl_model_properties.rope_scaling`: dynamic NTK.
    pub const TL_ROPE_SCALING_DYNAMIC: i32 = 2;
    /// `tl_model_properties.rope_scaling`: Llama 3.1's smoothed scaling.
    pub const TL_ROPE_SCALING_LLAMA3: i32 = 3;
    /// `tl_model_properties.rope_scaling`: YaRN.
    pub const TL_ROPE_SCALING_YARN: i32 = 4;

    /// Element type of x and y for `tl_quant_gemm_dtype`: IEEE half precision.
    pub const TL_DTYPE_FP16: i32 = 0;
    /// Element type of x and y for `tl_quant_gemm_dtype`: bfloat16.
    pub const TL_DTYPE_BF16: i32 = 1;

    /// CUDA where available, else the CPU.
    pub const TL_BACKEND_AUTO: i32 = 0;
    /// The CPU reference backend.
    pub const TL_BACKEND_CPU: i32 = 1;
    /// The CUDA backend.
    pub const TL_BACKEND_CUDA: i32 = 2;

    /// No tokenizer stored: one token per byte, ids 0-255.
    pub const TL_TOKENIZER_BYTES: i32 = 0;
    /// A Hugging Face tokenizer.json holding a byte-level BPE.
    pub const TL_TOKENIZER_HUGGINGFACE: i32 = 1;
    /// A SentencePiece tokenizer.model.
    pub const TL_TOKENIZER_SENTENCEPIECE: i32 = 2;
}

opaque_handles! {
    /// A loaded model (`tl_model_load` / `tl_model_free`). Read-only once loaded.
    tl_model;
    /// A quantized linear layer, borrowed from a model or owned by the caller (`tl_weight_free`).
    tl_weight;
}

c_structs! {
    /// Options of `tl_model_load` (`tl_load_options_init` fills the defaults).
    pub struct tl_load_options {
        pub struct_size: u32,
        /// 1: memory-map the file; 0: read it into memory.
        pub use_mmap: i32,
        /// 1: check scales, zeros, norms and embedding for NaN/Inf at load time.
        pub validate_values: i32,
    }

    /// A model's configuration and counts (`tl_model_info`).
    pub struct tl_model_properties {
        pub struct_size: u32,
        pub format_version: i32,
        pub d_model: i32,
        pub n_heads: i32,
        pub head_dim: i32,
        pub ffn: i32,
        pub vocab: i32,
        /// Unique blocks before the looped block.
        pub n_pre: i32,
        /// Applications of the looped block.
        pub n_loops: i32,
        pub max_seq: i32,
        /// Group size along K; 0 means per row.
        pub group_size: i32,
        pub bits: i32,
        pub rope_theta: f32,
        pub norm_eps: f32,
        /// Quantized linear layers.
        pub n_quant_weights: u32,
        /// Linear layers stored unquantized.
        pub n_dense_linears: u32,
        /// Tensors in the file.
        pub n_tensors: u32,
        /// 1 quantized, 0 dense, 2 tied to the embedding.
        pub head_kind: i32,
        pub has_frac4: i32,
        pub has_sign_bit: i32,
        pub file_bytes: u64,
        pub tensor_bytes: u64,
        pub quant_weight_bytes: u64,
        pub parameter_count: u64,
        /// The beginning-of-text token the model file names, or -1 (added after the first version).
        pub bos_token_id: i32,
        /// Key/value heads (grouped-query attention); `n_heads` for plain attention (third version, as below).
        pub n_kv_heads: i32,
        /// RoPE's frequency scaling (`TL_ROPE_SCALING_*`), its factor and the original context it scales from.
        pub rope_scaling: i32,
        pub rope_scaling_factor: f32,
        pub rope_original_max_positions: i32,
    }

    /// INT4 data from host memory for `tl_weight_create` (arrays are copied).
    pub struct tl_weight_desc {
        pub struct_size: u32,
        pub k: i32,
        pub n: i32,
        /// Must divide k; 0 or k means per row.
        pub group_size: i32,
        pub bits: i32,
        /// `[n][k/2]`, low nibble for even k.
        pub codes: *const u8,
        /// `[n][k/group_size]` FP16 bit patterns.
        pub scales: *const u16,
        /// `[n][k/group_size]` FP16 offsets.
        pub zeros: *const u16,
        /// Optional `[n][k/2]`.
        pub frac4: *const u8,
        /// Optional `[n][k/8]`.
        pub sign_bit: *const u8,
        /// Optional NUL-terminated name.
        pub name: *const c_char,
    }

    /// A GPTQ or AWQ checkpoint's tensors of one linear layer, for `tl_weight_import_int4` (borrowed for the call).
    pub struct tl_int4_import_desc {
        pub struct_size: u32,
        /// `TL_INT4_LAYOUT_GPTQ` or `TL_INT4_LAYOUT_AWQ`.
        pub layout: i32,
        pub k: i32,
        pub n: i32,
        /// Must divide k; 0 or k means per row.
        pub group_size: i32,
        /// GPTQ `[k/8][n]`, AWQ `[k][n/8]` packed int32.
        pub qweight: *const i32,
        /// `[k/group_size][n/8]` packed int32.
        pub qzeros: *const i32,
        /// `[k/group_size][n]` FP16 bit patterns.
        pub scales: *const u16,
        /// Optional `[k]` (GPTQ only): each input row's group; act-order ones are stored with a K permutation.
        pub g_idx: *const i32,
        /// Optional NUL-terminated name.
        pub name: *const c_char,
    }

    /// Options of `tl_model_import_checkpoint` (`tl_import_options_init` fills the defaults).
    pub struct tl_import_options {
        pub struct_size: u32,
        /// The written model's max_seq; 0: config.json's max_position_embeddings.
        pub max_seq: i32,
        /// 1: memory-map the checkpoint's files; 0: read each into memory.
        pub use_mmap: i32,
        /// 1: check the embedding, norms and dense linears for NaN/Inf.
        pub validate_values: i32,
    }

    /// Options of `tl_weight_quantize`.
    pub struct tl_quantize_options {
        pub struct_size: u32,
        /// `TL_QUANT_ASYMMETRIC` or `TL_QUANT_SYMMETRIC`.
        pub method: i32,
        /// 0 means per row.
        pub group_size: i32,
        pub bits: i32,
    }

    /// A weight's shape and storage facts (`tl_weight_info`).
    pub struct tl_weight_properties {
        pub struct_size: u32,
        pub k: i32,
        pub n: i32,
        /// The actual group size (k for per row).
        pub group_size: i32,
        pub n_groups: i32,
        pub bits: i32,
        pub has_frac4: i32,
        pub has_sign_bit: i32,
        /// 1 if borrowed from a model.
        pub borrowed: i32,
        pub bytes: u64,
        /// Valid while the weight lives.
        pub name: *const c_char,
    }

    /// Options of `tl_score`.
    pub struct tl_score_options {
        pub struct_size: u32,
        /// A `TL_BACKEND_*` value.
        pub backend: i32,
        /// CPU threads; 0 = hardware concurrency.
        pub n_threads: i32,
        /// Window length, 2..max_seq; 0 = max_seq.
        pub window: i32,
        pub progress: tl_progress_fn,
        pub progress_user_data: *mut c_void,
        /// Optional output: NLL of token i + 1 at index i.
        pub token_nll: *mut f32,
        pub token_nll_len: usize,
        /// CUDA backend: the device (default 0).
        pub device: i32,
        /// CUDA backend: a `cudaStream_t`, or NULL for the library's own stream.
        pub stream: *mut c_void,
        /// CUDA backend: 1 to capture each window length's forward pass in a CUDA graph.
        pub use_graphs: i32,
        /// Working-memory budget in bytes (host on the CPU, device on CUDA); 0 = the machine's.
        pub max_memory_bytes: u64,
        /// Top-k log-probabilities per predicted position (0 = none, at most 20): `top_k` ids and log-probabilities
        /// per position into `top_ids` / `top_logprobs`, which hold `top_len` entries each.
        pub top_k: i32,
        pub top_ids: *mut i32,
        pub top_logprobs: *mut f32,
        pub top_len: usize,
        /// `tl_score_batch`: the token standing for an empty context (`n_context` 0), `TL_BOS_NONE` (the default),
        /// `TL_BOS_FROM_MODEL` (the model file's `bos_token_id`) or a token id.
        pub empty_context_bos: i32,
        /// A `TL_ACTIVATIONS_*` value: the precision of the blocks' linear-layer inputs (CPU backend only for INT8
        /// and FP8).
        pub activations: i32,
        /// Must be 0 (sets the struct's fifth version apart from its fourth).
        pub reserved: i32,
    }

    /// What `tl_score` reports.
    pub struct tl_score_result {
        pub struct_size: u32,
        pub nll_sum: f64,
        pub tokens_scored: u64,
        pub perplexity: f64,
        /// `TL_BACKEND_CPU` or `TL_BACKEND_CUDA`.
        pub backend: i32,
        pub n_windows: i32,
        pub seconds: f64,
        /// CUDA backend: INT4 GEMMs by dispatcher path during the call, FP16 GEMMs of dense or tied layers, and
        /// fallbacks. 0 on the CPU.
        pub gemm_marlin_fused: u64,
        pub gemm_marlin_correction: u64,
        pub gemm_dequant_cublas: u64,
        pub gemm_fp16_body: u64,
        pub gemm_native: u64,
        pub gemm_dense_cublas: u64,
        pub gemm_fallbacks: u64,
        /// Of `seconds`: the model's device copy and packing (first CUDA call on a device), and CUDA graph
        /// captures. 0 when the call did none.
        pub setup_seconds: f64,
        pub graph_capture_seconds: f64,
    }

    /// One independent sequence of `tl_score_batch`: the first `n_context` tokens (0 means 1) are context only.
    /// Fixed layout.
    pub struct tl_sequence {
        pub tokens: *const i32,
        pub n_tokens: usize,
        pub n_context: usize,
    }

    /// What `tl_score_batch` reports for one sequence. Fixed layout.
    pub struct tl_sequence_score {
        /// Sum of the scored tokens' NLL (natural log).
        pub nll_sum: f64,
        /// `n_tokens - max(n_context, 1)`.
        pub tokens_scored: u64,
        /// 1 when every scored token's logit is its position's largest (a tie counts), else 0.
        pub greedy: i32,
    }

    /// Options of `tl_score_compare` (`tl_compare_options_init` fills the defaults).
    pub struct tl_compare_options {
        pub struct_size: u32,
        pub backend: i32,
        pub n_threads: i32,
        /// Window length; 0 = the shorter max_seq of the two models.
        pub window: i32,
        pub progress: tl_progress_fn,
        pub progress_user_data: *mut c_void,
        pub device: i32,
        pub stream: *mut c_void,
        pub use_graphs: i32,
        pub max_memory_bytes: u64,
        /// Optional per-position outputs of `token_len` entries each: KL, both NLLs, top-1 agreement (0/1).
        pub token_kl: *mut f32,
        pub token_nll_reference: *mut f32,
        pub token_nll_test: *mut f32,
        pub token_top1_match: *mut u8,
        pub token_len: usize,
        /// Each side's `TL_ACTIVATIONS_*` value.
        pub activations_reference: i32,
        pub activations_test: i32,
    }

    /// What `tl_score_compare` reports: KL(P_reference || P_test) per position summarized, top-1 agreement, both
    /// perplexities.
    pub struct tl_compare_result {
        pub struct_size: u32,
        pub tokens_scored: u64,
        pub kl_mean: f64,
        pub kl_stderr: f64,
        pub kl_median: f64,
        pub kl_p90: f64,
        pub kl_p99: f64,
        pub kl_p999: f64,
        pub kl_max: f64,
        pub kl_min: f64,
        pub top1_agreement: f64,
        pub nll_sum_reference: f64,
        pub nll_sum_test: f64,
        pub perplexity_reference: f64,
        pub perplexity_test: f64,
        pub delta_perplexity: f64,
        pub perplexity_ratio: f64,
        pub nll_correlation: f64,
        pub backend: i32,
        pub n_windows: i32,
        pub seconds: f64,
        pub setup_seconds: f64,
    }

    /// What `tl_device_info` reports.
    pub struct tl_device_properties {
        pub struct_size: u32,
        /// NUL-terminated device name.
        pub name: [c_char; 256],
        pub sm_major: i32,
        pub sm_minor: i32,
        pub sm_count: i32,
        pub total_memory: u64,
        pub free_memory: u64,
        /// 1 if the Marlin-class kernel runs on the device.
        pub marlin_supported: i32,
    }

    /// Options of `tl_pack_marlin` / `tl_weight_pack_marlin`.
    pub struct tl_pack_options {
        pub struct_size: u32,
        pub device: i32,
        /// A `cudaStream_t`, or NULL.
        pub stream: *mut c_void,
        /// `TL_FORM_*` flags.
        pub forms: u32,
    }

    /// What packing did.
    pub struct tl_pack_report {
        pub struct_size: u32,
        pub weights_uploaded: u32,
        pub weights_packed: u32,
        pub weights_not_packable: u32,
        pub device_bytes: u64,
        pub extra_device_bytes: u64,
    }

    /// Per-path call counters of a packed weight.
    pub struct tl_dispatch_counts {
        pub struct_size: u32,
        pub fp16_body: u64,
        pub marlin_fused: u64,
        pub marlin_correction: u64,
        pub dequant_cublas: u64,
        pub native: u64,
        pub fallbacks: u64,
    }
}

c_functions! {
    /// Static text for a status code. Never NULL.
    pub fn tl_status_string(status: tl_status) -> *const c_char;
    /// The calling thread's message for its last failed call. Never NULL.
    pub fn tl_last_error_message() -> *const c_char;

    /// `(major << 16) | (minor << 8) | patch`.
    pub fn tl_version() -> u32;
    /// "major.minor.patch". Static.
    pub fn tl_version_string() -> *const c_char;
    /// A JSON object describing the build. Static.
    pub fn tl_build_info() -> *const c_char;

    /// Sets the process-global log callback; NULL turns logging off.
    pub fn tl_set_log_callback(callback: tl_log_fn, user_data: *mut c_void, max_level: i32) -> tl_status;

    /// Fills load options with the defaults up to `struct_size` (the caller's `size_of`) bytes.
    pub fn tl_load_options_init(options: *mut tl_load_options, struct_size: u32) -> tl_status;
    /// Loads a .tinyloop file; `options` may be NULL. On failure `*out_model` is NULL.
    pub fn tl_model_load(path: *const c_char, options: *const tl_load_options, out_model: *mut *mut tl_model)
        -> tl_status;
    /// Frees a model and everything borrowed from it. NULL is a no-op.
    pub fn tl_model_free(model: *mut tl_model);
    /// Reads a model's configuration and counts (the caller sets `out.struct_size`).
    pub fn tl_model_info(model: *const tl_model, out: *mut tl_model_properties) -> tl_status;
    /// Number of quantized weights in the model.
    pub fn tl_model_weight_count(model: *const tl_model, out_count: *mut usize) -> tl_status;
    /// The index-th quantized weight, borrowed from the model.
    pub fn tl_model_weight_at(model: *const tl_model, index: usize, out_weight: *mut *const tl_weight) -> tl_status;
    /// The quantized weight with this name, borrowed from the model.
    pub fn tl_model_find_weight(model: *const tl_model, name: *const c_char, out_weight: *mut *const tl_weight)
        -> tl_status;

    /// Fills a weight description with zeros/NULLs, bits = 4, up to `struct_size` (the caller's `size_of`) bytes.
    pub fn tl_weight_desc_init(desc: *mut tl_weight_desc, struct_size: u32) -> tl_status;
    /// Creates an owned weight from host arrays (copied).
    pub fn tl_weight_create(desc: *const tl_weight_desc, out_weight: *mut *mut tl_weight) -> tl_status;
    /// Fills an INT4 import description with zeros/NULLs (GPTQ layout, per row) up to `struct_size` bytes.
    pub fn tl_int4_import_desc_init(desc: *mut tl_int4_import_desc, struct_size: u32) -> tl_status;
    /// Creates an owned weight from a GPTQ or AWQ checkpoint's tensors (copied and converted).
    pub fn tl_weight_import_int4(desc: *const tl_int4_import_desc, out_weight: *mut *mut tl_weight) -> tl_status;
    /// Fills import options with the defaults up to `struct_size` (the caller's `size_of`) bytes.
    pub fn tl_import_options_init(options: *mut tl_import_options, struct_size: u32) -> tl_status;
    /// Converts a Hugging Face-style checkpoint folder into a .tinyloop file; `options` may be NULL.
    pub fn tl_model_import_checkpoint(dir: *const c_char, out_path: *const c_char, options: *const tl_import_options)
        -> tl_status;
    /// Fills quantize options with the defaults up to `struct_size` (the caller's `size_of`) bytes.
    pub fn tl_quantize_options_init(options: *mut tl_quantize_options, struct_size: u32) -> tl_status;
    /// Quantizes a row-major FP32 matrix `w[n][k]` into an owned weight; `options` may be NULL.
    pub fn tl_weight_quantize(
        w: *const f32,
        k: i32,
        n: i32,
        options: *const tl_quantize_options,
        out_weight: *mut *mut tl_weight,
    ) -> tl_status;
    /// Frees an owned weight; NULL and borrowed weights are left alone.
    pub fn tl_weight_free(weight: *mut tl_weight);
    /// Reads a weight's shape and storage facts (the caller sets `out.struct_size`).
    pub fn tl_weight_info(weight: *const tl_weight, out: *mut tl_weight_properties) -> tl_status;
    /// Dequantizes into `out[n][k]`; `out_len` must be at least k*n.
    pub fn tl_weight_dequantize(weight: *const tl_weight, out: *mut f32, out_len: usize) -> tl_status;

    /// Number of usable CUDA devices (0 without CUDA or a GPU).
    pub fn tl_device_count(out_count: *mut i32) -> tl_status;
    /// Properties of one device (the caller sets `out.struct_size`).
    pub fn tl_device_info(device: i32, out: *mut tl_device_properties) -> tl_status;
    /// Fills pack options with the defaults up to `struct_size` (the caller's `size_of`) bytes.
    pub fn tl_pack_options_init(options: *mut tl_pack_options, struct_size: u32) -> tl_status;
    /// Zeroes a pack report up to `struct_size` (the caller's `size_of`) bytes.
    pub fn tl_pack_report_init(report: *mut tl_pack_report, struct_size: u32) -> tl_status;
    /// Uploads and packs every quantized weight of a model; `options` and `out_report` may be NULL.
    pub fn tl_pack_marlin(model: *mut tl_model, options: *const tl_pack_options, out_report: *mut tl_pack_report)
        -> tl_status;
    /// Uploads and packs one owned weight.
    pub fn tl_weight_pack_marlin(
        weight: *mut tl_weight,
        options: *const tl_pack_options,
        out_report: *mut tl_pack_report,
    ) -> tl_status;
    /// Sets the process-wide default of a `TL_DISPATCH_*` setting.
    pub fn tl_set_dispatch(setting: i32, value: i32) -> tl_status;
    /// Reads the process-wide default of a `TL_DISPATCH_*` setting.
    pub fn tl_get_dispatch(setting: i32, out_value: *mut i32) -> tl_status;
    /// Sets a `TL_DISPATCH_*` setting on a model (-1: back to the process-wide default).
    pub fn tl_model_set_dispatch(model: *mut tl_model, setting: i32, value: i32) -> tl_status;
    /// The value a model uses for a `TL_DISPATCH_*` setting.
    pub fn tl_model_get_dispatch(model: *const tl_model, setting: i32, out_value: *mut i32) -> tl_status;
    /// Sets a `TL_DISPATCH_*` setting on an owned weight (-1: back to the process-wide default).
    pub fn tl_weight_set_dispatch(weight: *mut tl_weight, setting: i32, value: i32) -> tl_status;
    /// The value a weight uses for a `TL_DISPATCH_*` setting.
    pub fn tl_weight_get_dispatch(weight: *const tl_weight, setting: i32, out_value: *mut i32) -> tl_status;
    /// cudaMalloc on a device.
    pub fn tl_device_malloc(device: i32, bytes: usize, out_ptr: *mut *mut c_void) -> tl_status;
    /// Frees device memory, stream-ordered when `stream` is not NULL. NULL ptr is a no-op.
    pub fn tl_device_free(ptr: *mut c_void, stream: *mut c_void) -> tl_status;
    /// Copies between host and device memory (any direction) and waits for the copy.
    pub fn tl_memcpy(dst: *mut c_void, src: *const c_void, bytes: usize, stream: *mut c_void) -> tl_status;
    /// Sets device memory to a byte value, ordered on a stream.
    pub fn tl_memset_device(dst: *mut c_void, value: i32, bytes: usize, stream: *mut c_void) -> tl_status;
    /// Creates a non-blocking stream on a device.
    pub fn tl_stream_create(device: i32, out_stream: *mut *mut c_void) -> tl_status;
    /// Destroys a stream. NULL is a no-op.
    pub fn tl_stream_destroy(stream: *mut c_void) -> tl_status;
    /// Waits for all work queued on a stream.
    pub fn tl_stream_synchronize(stream: *mut c_void) -> tl_status;
    /// Device workspace bytes `tl_quant_gemm` needs for this weight at this M.
    pub fn tl_quant_gemm_workspace_size(weight: *const tl_weight, m: i64, out_bytes: *mut usize) -> tl_status;
    /// Y = X * W on the GPU (device pointers, FP16).
    pub fn tl_quant_gemm(
        weight: *const tl_weight,
        x: *const c_void,
        y: *mut c_void,
        m: i64,
        stream: *mut c_void,
        workspace: *mut c_void,
        workspace_bytes: usize,
    ) -> tl_status;
    /// `tl_quant_gemm` with x and y of type `dtype` (`TL_DTYPE_*`).
    pub fn tl_quant_gemm_dtype(
        weight: *const tl_weight,
        dtype: i32,
        x: *const c_void,
        y: *mut c_void,
        m: i64,
        stream: *mut c_void,
        workspace: *mut c_void,
        workspace_bytes: usize,
    ) -> tl_status;
    /// How often each path ran for a packed weight.
    pub fn tl_weight_dispatch_counts(weight: *const tl_weight, out: *mut tl_dispatch_counts) -> tl_status;

    /// Fills score options with the defaults up to `struct_size` (the caller's `size_of`) bytes.
    pub fn tl_score_options_init(options: *mut tl_score_options, struct_size: u32) -> tl_status;
    /// Zeroes a score result up to `struct_size` (the caller's `size_of`) bytes.
    pub fn tl_score_result_init(result: *mut tl_score_result, struct_size: u32) -> tl_status;
    /// Scores a token sequence (n_tokens >= 2); thread-safe on a shared model.
    pub fn tl_score(
        model: *const tl_model,
        tokens: *const i32,
        n_tokens: usize,
        options: *const tl_score_options,
        out_result: *mut tl_score_result,
    ) -> tl_status;
    /// Scores independent sequences (window 0); `out_scores` gets `n_sequences` entries; `out_result` may be NULL.
    pub fn tl_score_batch(
        model: *const tl_model,
        sequences: *const tl_sequence,
        n_sequences: usize,
        options: *const tl_score_options,
        out_scores: *mut tl_sequence_score,
        out_result: *mut tl_score_result,
    ) -> tl_status;

    /// Fills compare options with the defaults up to `struct_size` (the caller's `size_of`) bytes.
    pub fn tl_compare_options_init(options: *mut tl_compare_options, struct_size: u32) -> tl_status;
    /// Zeroes a compare result up to `struct_size` bytes.
    pub fn tl_compare_result_init(result: *mut tl_compare_result, struct_size: u32) -> tl_status;
    /// Compares `test` with `reference` on the same windows of `tokens`; the models must share a vocabulary.
    pub fn tl_score_compare(
        reference: *const tl_model,
        test: *const tl_model,
        tokens: *const i32,
        n_tokens: usize,
        options: *const tl_compare_options,
        out_result: *mut tl_compare_result,
    ) -> tl_status;

    /// The model's tokenizer: a `TL_TOKENIZER_*` kind and, when `out_n_ids` is not NULL, its largest id + 1.
    pub fn tl_model_tokenizer(model: *const tl_model, out_kind: *mut i32, out_n_ids: *mut i32) -> tl_status;
    /// Token ids of `len` bytes of text; TL_ERR_BUFFER_TOO_SMALL sets `*out_n` to the number needed.
    pub fn tl_tokenize(
        model: *const tl_model,
        text: *const c_char,
        len: usize,
        out_ids: *mut i32,
        cap: usize,
        out_n: *mut usize,
    ) -> tl_status;
    /// The bytes of `n_ids` token ids (not NUL-terminated); TL_ERR_BUFFER_TOO_SMALL sets `*out_len` to the size needed.
    pub fn tl_detokenize(
        model: *const tl_model,
        ids: *const i32,
        n_ids: usize,
        out_text: *mut c_char,
        cap: usize,
        out_len: *mut usize,
    ) -> tl_status;
}

#[cfg(test)]
mod drift_tests;
