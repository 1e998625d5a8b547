//! Safe Rust API for TinyLoop INT4: load `.tinyloop` models (looped transformers with asymmetric INT4 weights
//! `W = q * s + z`), inspect, quantize and dequantize INT4 weights, score token sequences, and run the INT4 x
//! FP16 GEMM on a GPU with device buffers and workspaces this crate owns.
//!
//! The crate wraps the whole C API (`capi/include/tinyloop.h`, through `tinyloop-sys`); no `unsafe` is needed to
//! use it. Every fallible call returns [`Error`], which carries the kind of failure (one variant per C status)
//! and the library's message for it. Thread safety follows the C documentation: a [`Model`] is read-only once
//! loaded, `Send` and `Sync`, and any number of threads may score it at once; owned [`Weight`]s likewise.
//! [`Stream`] is `Send + Sync`; [`DeviceBuffer`] and [`Workspace`] are `Send` and used through `&mut` where they
//! are written.
//!
//! Without a GPU (or in a build without the `cuda` feature) everything but the GPU calls works, and those return
//! [`Error::NoDevice`]; [`Device::count`] returns 0.
//!
//! ```
//! use tinyloop::{
//!     f16, quant_gemm, Device, DeviceBuffer, Error, Model, PackOptions, QuantWeight, ScoreOptions, Sequence, Stream,
//!     Workspace,
//! };
//!
//! # fn main() -> Result<(), tinyloop::Error> {
//! let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/tiny.tinyloop");
//! let mut model = Model::load(path)?;
//! let info = model.info();
//! println!("d_model {}, {} quantized weights", info.d_model, info.n_quant_weights);
//!
//! // Scoring (on the GPU where there is one, else on the CPU).
//! let tokens: Vec<i32> = (0..64).map(|i| (i * 7 % info.vocab) as i32).collect();
//! let result = model.score(&tokens, &ScoreOptions { token_nll: true, ..ScoreOptions::default() })?;
//! println!("perplexity {:.3} over {} tokens", result.perplexity, result.tokens_scored);
//!
//! // Many sequences in one call; the first `n_context` tokens of each are context only.
//! let (context, continuation) = (b"Hello,", b" world");
//! let request: Vec<i32> = context.iter().chain(continuation).map(|&b| i32::from(b)).collect();
//! let sequences = [Sequence::with_context(&request, context.len()), Sequence::new(&tokens)];
//! let (scores, total) = model.score_batch(&sequences, &ScoreOptions::default())?;
//! println!("continuation NLL {:.3}, greedy {}", scores[0].nll_sum, scores[0].greedy);
//! assert_eq!(total.tokens_scored, 6 + 63);
//!
//! // One quantized GEMM, Y = X * W, on the first GPU.
//! if Device::count()? == 0 {
//!     // Without a GPU the GPU calls say so.
//!     assert!(matches!(model.pack(&PackOptions::default()), Err(Error::NoDevice(_))));
//!     return Ok(());
//! }
//! let stream = Stream::new(&Device::new(0))?;
//! model.pack(&PackOptions { stream: Some(&stream), ..PackOptions::default() })?;
//! let up = model.find_weight("loop.mlp_up")?;
//! let (m, k, n) = (4, up.info().k, up.info().n);
//! let x: Vec<f16> = (0..m * k).map(|i| f16::from_f32((i % 7) as f32 / 8.0 - 0.4)).collect();
//! let x = DeviceBuffer::from_slice(&stream, &x)?;
//! let mut y = DeviceBuffer::<f16>::zeroed(&stream, m * n)?;
//! let mut workspace = Workspace::new(&stream);
//! quant_gemm(&up, &x, &mut y, m, &stream, &mut workspace)?;
//! let y: Vec<f32> = y.to_vec()?.into_iter().map(f32::from).collect();
//! println!("y[0] = {}, paths taken: {:?}", y[0], up.dispatch_counts()?);
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

use std::ffi::CStr;
use std::fmt;

use tinyloop_sys as sys;

mod compare;
mod device;
mod error;
mod gemm;
mod logging;
mod model;
mod score;
mod text;
mod weight;

pub use compare::{CompareOptions, ComparePositions, CompareResult};
pub use device::{Device, DeviceBuffer, DeviceCopy, DeviceInfo, Stream};
pub use error::{Error, Result};
pub use gemm::{
    get_dispatch, quant_gemm, set_dispatch, DispatchCounts, DispatchSetting, GemmElement, PackForms, PackOptions,
    PackReport, QuantWeight, Workspace,
};
/// The `half` crate, whose [`f16`] is the type of every FP16 value the API takes or returns (re-exported so that
/// callers use the same version).
pub use half;
/// bfloat16: the other element type [`quant_gemm`] takes (FP32's exponent range, 8 significant bits).
/// `#[repr(transparent)]` over its `u16` bit pattern.
pub use half::bf16;
/// IEEE half precision: the element type of FP16 device buffers ([`quant_gemm`]'s activations and results) and of
/// [`WeightDesc`]'s scales and zero points. `#[repr(transparent)]` over its `u16` bit pattern, the C API's
/// `uint16_t`; `f16::from_f32` rounds to nearest (ties to even), `f32::from(h)` is exact.
pub use half::f16;
pub use logging::{clear_log_callback, set_log_callback, LogLevel};
pub use model::{import_checkpoint, HeadKind, ImportOptions, LoadOptions, Model, ModelInfo, RopeScaling};
pub use score::{Activations, Backend, EmptyContextBos, ScoreOptions, ScoreResult, Sequence, SequenceScore, TokenId};
pub use text::{TokenizerInfo, TokenizerKind};
pub use weight::{QuantMethod, QuantizeOptions, Weight, WeightDesc, WeightInfo, WeightRef};

/// A library version, `major.minor.patch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// Incompatible API changes.
    pub major: u32,
    /// Compatible additions.
    pub minor: u32,
    /// Fixes.
    pub patch: u32,
}

impl Version {
    /// The version of the C header these bindings were written against. A library whose [`version()`] has
    /// another major version (or, before 1.0, another minor version) may not match them.
    pub const BINDINGS: Version =
        Version { major: sys::TL_VERSION_MAJOR, minor: sys::TL_VERSION_MINOR, patch: sys::TL_VERSION_PATCH };
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The version of the linked library.
pub fn version() -> Version {
    // SAFETY: no arguments; thread-safe.
    let packed = unsafe { sys::tl_version() };
    Version { major: packed >> 16, minor: (packed >> 8) & 0xff, patch: packed & 0xff }
}

/// A JSON object describing the linked library's build: `{"version", "compiler", "cuda" (bool),
/// "cuda_version", "cuda_architectures" (array of ints), "build_type"}`.
pub fn build_info() -> String {
    // SAFETY: tl_build_info returns a static NUL-terminated string.
    unsafe { CStr::from_ptr(sys::tl_build_info()) }.to_string_lossy().into_owned()
}

/// A size or count as the C API's `int32_t`, or [`Error::InvalidArgument`] naming `what` if it does not fit.
pub(crate) fn to_c_int(value: usize, what: &str) -> Result<i32> {
    i32::try_from(value).map_err(|_| Error::InvalidArgument(format!("{what} = {value} does not fit in an int32_t")))
}

/// A size or count the library reported as `int32_t`, which must not be negative.
pub(crate) fn to_usize(value: i32, what: &str) -> Result<usize> {
    usize::try_from(value).map_err(|_| Error::Internal(format!("the library reported {what} = {value}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Rust defaults must be the C library's defaults.
    #[test]
    fn option_defaults_match_the_library() {
        // SAFETY (all blocks below): each init function writes the struct it is given.
        let mut load: sys::tl_load_options = unsafe { std::mem::zeroed() };
        assert_eq!(
            unsafe { sys::tl_load_options_init(&mut load, size_of::<sys::tl_load_options>() as u32) },
            sys::TL_OK
        );
        let ours = LoadOptions::default().to_c();
        assert_eq!(
            (ours.struct_size, ours.use_mmap, ours.validate_values),
            (load.struct_size, load.use_mmap, load.validate_values)
        );

        let mut quantize: sys::tl_quantize_options = unsafe { std::mem::zeroed() };
        assert_eq!(
            unsafe { sys::tl_quantize_options_init(&mut quantize, size_of::<sys::tl_quantize_options>() as u32) },
            sys::TL_OK
        );
        let ours = QuantizeOptions::default().to_c().unwrap();
        assert_eq!(
            (ours.struct_size, ours.method, ours.group_size, ours.bits),
            (quantize.struct_size, quantize.method, quantize.group_size, quantize.bits)
        );

        let mut score: sys::tl_score_options = unsafe { std::mem::zeroed() };
        assert_eq!(
            unsafe { sys::tl_score_options_init(&mut score, size_of::<sys::tl_score_options>() as u32) },
            sys::TL_OK
        );
        let ours = ScoreOptions::default();
        assert_eq!(ours.backend.to_c(), score.backend);
        assert_eq!(ours.threads as i32, score.n_threads);
        assert_eq!(ours.window as i32, score.window);
        assert!(score.progress.is_none() && score.token_nll.is_null() && !ours.token_nll);
        assert_eq!((ours.device as i32, i32::from(ours.use_graphs)), (score.device, score.use_graphs));
        assert!(score.stream.is_null());
        assert_eq!(ours.max_memory_bytes, score.max_memory_bytes);
        assert_eq!((ours.activations.to_c(), score.reserved), (score.activations, 0));

        let mut pack: sys::tl_pack_options = unsafe { std::mem::zeroed() };
        assert_eq!(
            unsafe { sys::tl_pack_options_init(&mut pack, size_of::<sys::tl_pack_options>() as u32) },
            sys::TL_OK
        );
        assert_eq!((pack.forms, pack.device), (PackForms::default().to_c(), 0));
        assert!(pack.stream.is_null());
    }

    #[test]
    fn version_matches_the_library_string_and_the_bindings() {
        // SAFETY: tl_version_string returns a static NUL-terminated string.
        let text = unsafe { CStr::from_ptr(sys::tl_version_string()) }.to_str().unwrap();
        assert_eq!(version().to_string(), text);
        assert_eq!(version(), Version::BINDINGS);
    }

    #[test]
    fn build_info_is_a_json_object_with_the_version() {
        let compact: String = build_info().split_whitespace().collect();
        assert!(compact.starts_with('{') && compact.ends_with('}'), "{compact}");
        assert!(compact.contains(&format!("\"version\":\"{}\"", version())), "{compact}");
        for key in ["compiler", "cuda", "cuda_version", "cuda_architectures", "build_type"] {
            assert!(compact.contains(&format!("\"{key}\":")), "no {key} in {compact}");
        }
    }

    #[test]
    fn sizes_that_do_not_fit_an_int32_are_rejected() {
        assert_eq!(to_c_int(i32::MAX as usize, "x").unwrap(), i32::MAX);
        let error = to_c_int(i32::MAX as usize + 1, "window").unwrap_err();
        assert!(matches!(&error, Error::InvalidArgument(m) if m.contains("window")), "{error}");
        assert!(matches!(to_usize(-1, "k"), Err(Error::Internal(_))));
    }
}
