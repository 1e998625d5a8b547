//! Safe Rust API for TinyLoop INT4: load `.tinyloop` models (looped transformers with asymmetric INT4 weights
//! `W = q * s + z`), inspect, quantize and dequantize INT4 weights, and score token sequences.
//!
//! The crate wraps the C API (`capi/include/tinyloop.h`, through `tinyloop-sys`); no `unsafe` is needed to use
//! it. Every fallible call returns [`Error`], which carries the kind of failure and the library's message for
//! it. A [`Model`] is read-only once loaded: it is `Send` and `Sync`, and any number of threads may score it at
//! once.
//!
//! ```
//! use tinyloop::{Model, ScoreOptions};
//!
//! # fn main() -> Result<(), tinyloop::Error> {
//! let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/tiny.tinyloop");
//! let model = Model::load(path)?;
//! let info = model.info();
//! println!("d_model {}, {} quantized weights", info.d_model, info.n_quant_weights);
//!
//! let up = model.find_weight("loop.mlp_up")?;
//! assert_eq!(up.dequantize()?.len(), up.info().k * up.info().n);
//!
//! let tokens: Vec<i32> = (0..64).map(|i| (i * 7 % info.vocab) as i32).collect();
//! let options = ScoreOptions { token_nll: true, ..ScoreOptions::default() };
//! let result = model.score(&tokens, &options)?;
//! println!("perplexity {:.3} over {} tokens", result.perplexity, result.tokens_scored);
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

use std::ffi::CStr;
use std::fmt;

use tinyloop_sys as sys;

mod error;
mod model;
mod score;
mod weight;

pub use error::{Error, Result};
pub use model::{HeadKind, LoadOptions, Model, ModelInfo};
pub use score::{Backend, ScoreOptions, ScoreResult};
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
        assert_eq!(unsafe { sys::tl_load_options_init(&mut load) }, sys::TL_OK);
        let ours = LoadOptions::default().to_c();
        assert_eq!(
            (ours.struct_size, ours.use_mmap, ours.validate_values),
            (load.struct_size, load.use_mmap, load.validate_values)
        );

        let mut quantize: sys::tl_quantize_options = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { sys::tl_quantize_options_init(&mut quantize) }, sys::TL_OK);
        let ours = QuantizeOptions::default().to_c().unwrap();
        assert_eq!(
            (ours.struct_size, ours.method, ours.group_size, ours.bits),
            (quantize.struct_size, quantize.method, quantize.group_size, quantize.bits)
        );

        let mut score: sys::tl_score_options = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { sys::tl_score_options_init(&mut score) }, sys::TL_OK);
        let ours = ScoreOptions::default();
        assert_eq!(ours.backend.to_c(), score.backend);
        assert_eq!(ours.threads as i32, score.n_threads);
        assert_eq!(ours.window as i32, score.window);
        assert!(score.progress.is_none() && score.token_nll.is_null() && !ours.token_nll);
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
