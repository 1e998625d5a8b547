//! Loaded models: configuration, borrowed weights, and scoring (in score.rs).

use std::ffi::CString;
use std::path::Path;
use std::ptr::{self, NonNull};

use tinyloop_sys as sys;

use crate::error::{check, Error, Result};
use crate::gemm::DispatchSetting;
use crate::{to_c_int, to_usize};
use crate::weight::{WeightInfo, WeightRef};

/// Options of [`Model::load_with`]; `Default` gives the library's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadOptions {
    /// Memory-map the file (default `true`); `false` reads it into memory, for file systems that cannot map.
    pub use_mmap: bool,
    /// Check every scale and zero, norm and embedding value for NaN/Inf at load time (default `true`).
    pub validate_values: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions { use_mmap: true, validate_values: true }
    }
}

impl LoadOptions {
    pub(crate) fn to_c(self) -> sys::tl_load_options {
        sys::tl_load_options {
            struct_size: std::mem::size_of::<sys::tl_load_options>() as u32,
            use_mmap: self.use_mmap.into(),
            validate_values: self.validate_values.into(),
        }
    }
}

/// How a model's output head is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadKind {
    /// A dense (FP16/FP32) matrix.
    Dense,
    /// A quantized INT4 weight (listed by [`Model::weights`] as `"head"`).
    Quantized,
    /// Tied to the token embedding.
    Tied,
}

/// A model's configuration and counts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelInfo {
    /// Version of the `.tinyloop` format the file was written in.
    pub format_version: u32,
    /// Width of the residual stream.
    pub d_model: usize,
    /// Attention heads.
    pub n_heads: usize,
    /// Width of one attention head.
    pub head_dim: usize,
    /// Hidden width of the MLP.
    pub ffn: usize,
    /// Vocabulary size: tokens are in `0..vocab`.
    pub vocab: usize,
    /// Unique blocks before the looped block.
    pub n_pre: usize,
    /// How many times the looped block is applied.
    pub n_loops: usize,
    /// Longest context in tokens (the default scoring window).
    pub max_seq: usize,
    /// Quantization group size along K; 0 means per row.
    pub group_size: usize,
    /// Bits per quantized code: 4 or 8, the widest among the quantized linears (a file may mix INT4 and INT8
    /// linears; [`crate::WeightInfo`]'s `bits` gives each one's).
    pub bits: u32,
    /// RoPE base frequency.
    pub rope_theta: f32,
    /// Epsilon of the RMS norms.
    pub norm_eps: f32,
    /// Quantized linear layers (what [`Model::weights`] iterates).
    pub n_quant_weights: usize,
    /// Linear layers stored unquantized.
    pub n_dense_linears: usize,
    /// Tensors in the file.
    pub n_tensors: usize,
    /// How the head is stored.
    pub head_kind: HeadKind,
    /// Whether any weight carries a frac4 channel.
    pub has_frac4: bool,
    /// Whether any weight carries a sign-bit channel.
    pub has_sign_bit: bool,
    /// Size of the file in bytes.
    pub file_bytes: u64,
    /// Bytes of all tensors' data in the file.
    pub tensor_bytes: u64,
    /// Bytes of the quantized weights' codes, scales, zeros and optional channels.
    pub quant_weight_bytes: u64,
    /// Number of model parameters (a quantized weight counts K * N).
    pub parameter_count: u64,
    /// The beginning-of-text token the model file names (`tinyloop import` keeps the checkpoint's), if any.
    pub bos_token_id: Option<u32>,
    /// Key/value heads (grouped-query attention; `n_heads` for plain attention), and RoPE's frequency scaling:
    /// `None` from a library too old to report them.
    pub n_kv_heads: Option<usize>,
    pub rope_scaling: Option<RopeScaling>,
}

/// RoPE's frequency scaling, as transformers' `rope_scaling` names it (docs/format.md).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Every inverse frequency divided by `factor`.
    Linear { factor: f32 },
    /// Dynamic NTK from `original_max_positions` on.
    Dynamic { factor: f32, original_max_positions: usize },
    /// Llama 3.1's smoothed scaling.
    Llama3 { factor: f32, original_max_positions: usize },
    /// YaRN.
    Yarn { factor: f32, original_max_positions: usize },
}

/// Whether the library wrote the 4-byte field at `offset` of `p` (it sets struct_size to the bytes it wrote).
fn filled(p: &sys::tl_model_properties, offset: usize) -> bool {
    p.struct_size as usize >= offset + 4
}

impl ModelInfo {
    fn from_c(p: &sys::tl_model_properties) -> Result<ModelInfo> {
        let head_kind = match p.head_kind {
            0 => HeadKind::Dense,
            1 => HeadKind::Quantized,
            2 => HeadKind::Tied,
            other => return Err(Error::Internal(format!("tl_model_info reported head_kind {other}"))),
        };
        Ok(ModelInfo {
            format_version: to_usize(p.format_version, "format_version")? as u32,
            d_model: to_usize(p.d_model, "d_model")?,
            n_heads: to_usize(p.n_heads, "n_heads")?,
            head_dim: to_usize(p.head_dim, "head_dim")?,
            ffn: to_usize(p.ffn, "ffn")?,
            vocab: to_usize(p.vocab, "vocab")?,
            n_pre: to_usize(p.n_pre, "n_pre")?,
            n_loops: to_usize(p.n_loops, "n_loops")?,
            max_seq: to_usize(p.max_seq, "max_seq")?,
            group_size: to_usize(p.group_size, "group_size")?,
            bits: to_usize(p.bits, "bits")? as u32,
            rope_theta: p.rope_theta,
            norm_eps: p.norm_eps,
            n_quant_weights: p.n_quant_weights as usize,
            n_dense_linears: p.n_dense_linears as usize,
            n_tensors: p.n_tensors as usize,
            head_kind,
            has_frac4: p.has_frac4 != 0,
            has_sign_bit: p.has_sign_bit != 0,
            file_bytes: p.file_bytes,
            tensor_bytes: p.tensor_bytes,
            quant_weight_bytes: p.quant_weight_bytes,
            parameter_count: p.parameter_count,
            // An older library does not fill the fields (struct_size tells): it names no BOS.
            bos_token_id: if filled(p, std::mem::offset_of!(sys::tl_model_properties, bos_token_id)) {
                u32::try_from(p.bos_token_id).ok()
            } else {
                None
            },
            n_kv_heads: if filled(p, std::mem::offset_of!(sys::tl_model_properties, n_kv_heads)) {
                Some(to_usize(p.n_kv_heads, "n_kv_heads")?)
            } else {
                None
            },
            rope_scaling: if filled(p, std::mem::offset_of!(sys::tl_model_properties, rope_original_max_positions)) {
                let factor = p.rope_scaling_factor;
                let original_max_positions = to_usize(p.rope_original_max_positions, "rope_original_max_positions")?;
                Some(match p.rope_scaling {
                    sys::TL_ROPE_SCALING_NONE => RopeScaling::None,
                    sys::TL_ROPE_SCALING_LINEAR => RopeScaling::Linear { factor },
                    sys::TL_ROPE_SCALING_DYNAMIC => RopeScaling::Dynamic { factor, original_max_positions },
                    sys::TL_ROPE_SCALING_LLAMA3 => RopeScaling::Llama3 { factor, original_max_positions },
                    sys::TL_ROPE_SCALING_YARN => RopeScaling::Yarn { factor, original_max_positions },
                    other => return Err(Error::Internal(format!("tl_model_info reported rope_scaling {other}"))),
                })
            } else {
                None
            },
        })
    }
}

/// A loaded `.tinyloop` model, freed on drop. Read-only: share it between threads with `&Model` or `Arc`.
#[derive(Debug)]
pub struct Model {
    handle: ModelHandle,
    info: ModelInfo,
    /// The quantized weights in the library's order, with their facts, read once at load.
    weights: Vec<(NonNull<sys::tl_weight>, WeightInfo)>,
}

// SAFETY: a loaded tl_model has no thread affinity, so it may be freed on another thread than the one that
// loaded it.
unsafe impl Send for Model {}
// SAFETY: every `&self` method calls only functions taking `const tl_model *` (tl_score included), which the
// header allows any number of threads to call on one model at the same time; nothing is mutated through &self.
unsafe impl Sync for Model {}

impl Model {
    /// Loads a `.tinyloop` file with the default [`LoadOptions`].
    ///
    /// Errors: [`Error::Io`] if the file cannot be opened, mapped or read (the message names the path),
    /// [`Error::Format`] if it is malformed (the message names the tensor and the problem).
    pub fn load(path: impl AsRef<Path>) -> Result<Model> {
        Model::load_with(path, &LoadOptions::default())
    }

    /// Loads a `.tinyloop` file with explicit options. Errors as for [`Model::load`].
    pub fn load_with(path: impl AsRef<Path>, options: &LoadOptions) -> Result<Model> {
        let path = path_to_c(path.as_ref())?;
        let c_options = options.to_c();
        let mut raw = ptr::null_mut();
        // SAFETY: the path is NUL-terminated and the options struct fully initialised; both outlive the call.
        check(unsafe { sys::tl_model_load(path.as_ptr(), &c_options, &mut raw) })?;
        let raw = NonNull::new(raw).ok_or_else(|| Error::Internal("tl_model_load succeeded with NULL".into()))?;
        // Owned from here on, so the model is freed whatever fails next.
        let handle = ModelHandle(raw);
        let info = read_info(raw)?;
        let weights = read_weights(raw)?;
        Ok(Model { handle, info, weights })
    }

    pub(crate) fn raw(&self) -> NonNull<sys::tl_model> {
        self.handle.0
    }

    /// The model's configuration and counts.
    pub fn info(&self) -> ModelInfo {
        self.info
    }

    /// Sets a dispatcher setting on this model: its scoring and the GEMMs on its weights use `value`; `None` returns
    /// the setting to the process-wide default ([`crate::set_dispatch`]). Thread-safe; calls already under way keep
    /// the old value. [`Error::InvalidArgument`] for a value out of the setting's range.
    pub fn set_dispatch(&self, setting: DispatchSetting, value: Option<u32>) -> Result<()> {
        let value = match value {
            Some(v) => to_c_int(v as usize, "dispatch value")?,
            None => -1,
        };
        // SAFETY: the model is live; the C API makes this call safe while other threads use the model.
        check(unsafe { sys::tl_model_set_dispatch(self.raw().as_ptr(), setting.to_c(), value) })
    }

    /// The value this model uses for a dispatcher setting: its own, else the process-wide default.
    pub fn dispatch(&self, setting: DispatchSetting) -> Result<u32> {
        let mut value = 0i32;
        // SAFETY: the model is live and `value` writable.
        check(unsafe { sys::tl_model_get_dispatch(self.raw().as_ptr(), setting.to_c(), &mut value) })?;
        crate::to_usize(value, "dispatch value").map(|v| v as u32)
    }

    /// The quantized weights in file order of blocks: `pre.0.attn_qkv`, …, `loop.mlp_down`, then `head` if
    /// the head is quantized. Each is borrowed from the model.
    pub fn weights(&self) -> impl ExactSizeIterator<Item = WeightRef<'_>> + DoubleEndedIterator + '_ {
        self.weights.iter().map(|(raw, info)| WeightRef::new(*raw, info))
    }

    /// The quantized weight with this name (e.g. `"loop.mlp_up"`); [`Error::NotFound`] if there is none.
    pub fn find_weight(&self, name: &str) -> Result<WeightRef<'_>> {
        let c_name = CString::new(name)
            .map_err(|_| Error::InvalidArgument(format!("weight name {name:?} contains a NUL byte")))?;
        let mut found = ptr::null();
        // SAFETY: the model is live, the name NUL-terminated, and `found` writable.
        check(unsafe { sys::tl_model_find_weight(self.raw().as_ptr(), c_name.as_ptr(), &mut found) })?;
        self.weights().find(|weight| std::ptr::eq(weight.raw().as_ptr(), found)).ok_or_else(|| {
            Error::Internal(format!(
                "tl_model_find_weight({name:?}) returned a weight tl_model_weight_at does not list"
            ))
        })
    }
}

fn read_info(raw: NonNull<sys::tl_model>) -> Result<ModelInfo> {
    // SAFETY: tl_model_properties is integers and floats, for which all-zero bytes are valid.
    let mut props: sys::tl_model_properties = unsafe { std::mem::zeroed() };
    props.struct_size = std::mem::size_of::<sys::tl_model_properties>() as u32;
    // SAFETY: the model is live and `props` is writable with its size set.
    check(unsafe { sys::tl_model_info(raw.as_ptr(), &mut props) })?;
    ModelInfo::from_c(&props)
}

fn read_weights(raw: NonNull<sys::tl_model>) -> Result<Vec<(NonNull<sys::tl_weight>, WeightInfo)>> {
    let mut count = 0usize;
    // SAFETY: the model is live and `count` is writable.
    check(unsafe { sys::tl_model_weight_count(raw.as_ptr(), &mut count) })?;
    (0..count)
        .map(|index| {
            let mut weight = ptr::null();
            // SAFETY: the model is live, `index < count`, and `weight` is writable.
            check(unsafe { sys::tl_model_weight_at(raw.as_ptr(), index, &mut weight) })?;
            let weight = NonNull::new(weight as *mut sys::tl_weight)
                .ok_or_else(|| Error::Internal(format!("tl_model_weight_at({index}) succeeded with NULL")))?;
            Ok((weight, WeightInfo::read(weight)?))
        })
        .collect()
}

/// Owns a `tl_model` and frees it on drop.
#[derive(Debug)]
struct ModelHandle(NonNull<sys::tl_model>);

impl Drop for ModelHandle {
    fn drop(&mut self) {
        // SAFETY: the model is owned and freed exactly once; WeightRefs borrow the Model that holds this
        // handle, so none outlives it.
        unsafe { sys::tl_model_free(self.0.as_ptr()) }
    }
}

/// The path as the NUL-terminated bytes the C library opens.
/// Options of [`import_checkpoint`]; `Default` gives the library's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImportOptions {
    /// The written model's `max_seq`; `None` (default) takes `config.json`'s `max_position_embeddings`.
    pub max_seq: Option<usize>,
    /// Memory-map the checkpoint's files (default `true`); `false` reads each into memory.
    pub use_mmap: bool,
    /// Check the embedding, norms and dense linears for NaN/Inf (default `true`).
    pub validate_values: bool,
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions { max_seq: None, use_mmap: true, validate_values: true }
    }
}

/// Converts a Hugging Face-style checkpoint folder (`config.json` of a Llama, Mistral or Qwen2 model or of a looped
/// one, and `model.safetensors`, or a sharded index; dense, GPTQ v1 or AWQ GEMM linears) into the `.tinyloop` file
/// `out`, which [`Model::load`] then reads (docs/import.md). Nothing is written unless the whole conversion
/// succeeds.
///
/// Errors: [`Error::Io`] for a folder or file that cannot be read or written, [`Error::Format`] for a malformed
/// config or tensor, [`Error::Unsupported`] for what the library does not import (8-bit weights, Gemma, a sliding
/// window narrower than max_seq, a config field it does not know, ...); each message names the file and the field
/// or tensor.
pub fn import_checkpoint(dir: impl AsRef<Path>, out: impl AsRef<Path>, options: &ImportOptions) -> Result<()> {
    let (dir, out) = (path_to_c(dir.as_ref())?, path_to_c(out.as_ref())?);
    let max_seq = match options.max_seq {
        None => 0,
        Some(v) => i32::try_from(v)
            .ok()
            .filter(|&v| v > 0)
            .ok_or_else(|| Error::InvalidArgument(format!("max_seq {v} is not in [1, i32::MAX]")))?,
    };
    let c_options = sys::tl_import_options {
        struct_size: std::mem::size_of::<sys::tl_import_options>() as u32,
        max_seq,
        use_mmap: options.use_mmap.into(),
        validate_values: options.validate_values.into(),
    };
    // SAFETY: both paths are NUL-terminated and the options struct fully initialised; all outlive the call.
    check(unsafe { sys::tl_model_import_checkpoint(dir.as_ptr(), out.as_ptr(), &c_options) })
}

fn path_to_c(path: &Path) -> Result<CString> {
    #[cfg(unix)]
    let bytes = std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str()).to_vec();
    #[cfg(not(unix))]
    let bytes = path
        .to_str()
        .ok_or_else(|| Error::InvalidArgument(format!("path {} is not valid Unicode", path.display())))?
        .as_bytes()
        .to_vec();
    CString::new(bytes).map_err(|_| Error::InvalidArgument(format!("path {} contains a NUL byte", path.display())))
}
