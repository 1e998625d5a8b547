//! Comparing two models on one text ([`Model::compare`]): KL divergence of the test model's predictions from the
//! reference's, top-1 agreement and both perplexities, as llama-perplexity's KL-divergence report gives them.

use tinyloop_sys as sys;

use crate::error::{check, Error, Result};
use crate::model::Model;
use crate::score::{c_ids, Activations, Backend, TokenId};
use crate::to_c_int;

/// Options of [`Model::compare`]; `Default` gives the library's defaults and no per-position output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompareOptions {
    /// Where both models run.
    pub backend: Backend,
    /// CPU worker threads; 0 (default) means the machine's hardware concurrency.
    pub threads: usize,
    /// Window length in tokens; 0 (default) means the shorter `max_seq` of the two models.
    pub window: usize,
    /// CUDA backend: the device both models run on (default 0).
    pub device: usize,
    /// CUDA backend: CUDA graphs (default `true`).
    pub use_graphs: bool,
    /// Working-memory budget of both models together (0: the machine's).
    pub max_memory_bytes: u64,
    /// Return the per-position values in [`CompareResult::per_position`] (default `false`).
    pub per_position: bool,
    /// The test model's activation precision (default [`Activations::Fp16`]): a model compared with itself at
    /// `Int8` or `Fp8` measures what that precision costs.
    pub activations: Activations,
    /// The reference's activation precision (default [`Activations::Fp16`]).
    pub reference_activations: Activations,
}

impl Default for CompareOptions {
    fn default() -> Self {
        CompareOptions {
            backend: Backend::default(),
            threads: 0,
            window: 0,
            device: 0,
            use_graphs: true,
            max_memory_bytes: 0,
            per_position: false,
            activations: Activations::Fp16,
            reference_activations: Activations::Fp16,
        }
    }
}

/// Per-position values of a comparison, each `tokens.len() - 1` long (index `i`: the prediction of token `i + 1`).
#[derive(Debug, Clone, PartialEq)]
pub struct ComparePositions {
    /// KL(P_reference || P_test), nats.
    pub kl: Vec<f32>,
    /// The reference's NLL of the token (natural log).
    pub nll_reference: Vec<f32>,
    /// The test model's NLL of the token.
    pub nll_test: Vec<f32>,
    /// Whether both models' most likely token is the same.
    pub top1_match: Vec<bool>,
}

/// What [`Model::compare`] reports (`tl_compare_result`).
#[derive(Debug, Clone, PartialEq)]
pub struct CompareResult {
    /// Positions compared: `tokens.len() - 1`.
    pub tokens_scored: u64,
    /// KL(P_reference || P_test) per position, nats: mean and its standard error, then exact order statistics.
    pub kl_mean: f64,
    /// The mean's standard error (NaN below 2 positions).
    pub kl_stderr: f64,
    /// The median.
    pub kl_median: f64,
    /// The 90th percentile.
    pub kl_p90: f64,
    /// The 99th percentile.
    pub kl_p99: f64,
    /// The 99th percentile.
    pub kl_p999: f64,
    /// The largest.
    pub kl_max: f64,
    /// The smallest.
    pub kl_min: f64,
    /// Fraction of positions where both models' most likely token is the same.
    pub top1_agreement: f64,
    /// The reference's perplexity over the compared positions.
    pub perplexity_reference: f64,
    /// The test model's perplexity over the same positions.
    pub perplexity_test: f64,
    /// `perplexity_test - perplexity_reference`.
    pub delta_perplexity: f64,
    /// `perplexity_test / perplexity_reference`.
    pub perplexity_ratio: f64,
    /// Pearson's correlation of the two models' per-position NLLs.
    pub nll_correlation: f64,
    /// The backend that ran.
    pub backend: Backend,
    /// Windows the tokens were split into.
    pub n_windows: usize,
    /// Wall-clock seconds spent in the call.
    pub seconds: f64,
    /// With [`CompareOptions::per_position`].
    pub per_position: Option<ComparePositions>,
}

impl Model {
    /// Compares `test` with this model (the reference) on the same windows of `tokens` (`tl_score_compare`). The
    /// models must share a vocabulary ([`Error::InvalidArgument`] naming both otherwise); they may be the same
    /// model. Thread-safe on shared models.
    pub fn compare<T: TokenId>(&self, test: &Model, tokens: &[T], options: &CompareOptions) -> Result<CompareResult> {
        let tokens = c_ids(tokens, "tokens")?;
        let n = tokens.len().saturating_sub(1);
        let mut positions = options.per_position.then(|| (vec![0f32; n], vec![0f32; n], vec![0f32; n], vec![0u8; n]));
        // SAFETY: tl_compare_options is integers, nullable pointers and an optional function pointer, for which
        // all-zero bytes are valid; tl_compare_options_init then writes the defaults.
        let mut c_options: sys::tl_compare_options = unsafe { std::mem::zeroed() };
        // SAFETY: the struct is ours and its size is passed.
        check(unsafe {
            sys::tl_compare_options_init(&mut c_options, std::mem::size_of::<sys::tl_compare_options>() as u32)
        })?;
        c_options.backend = options.backend.to_c();
        c_options.n_threads = to_c_int(options.threads, "threads")?;
        c_options.window = to_c_int(options.window, "window")?;
        c_options.device = to_c_int(options.device, "device")?;
        c_options.use_graphs = options.use_graphs.into();
        c_options.max_memory_bytes = options.max_memory_bytes;
        c_options.activations_test = options.activations.to_c();
        c_options.activations_reference = options.reference_activations.to_c();
        if let Some((kl, nll_reference, nll_test, top1)) = positions.as_mut() {
            c_options.token_kl = kl.as_mut_ptr();
            c_options.token_nll_reference = nll_reference.as_mut_ptr();
            c_options.token_nll_test = nll_test.as_mut_ptr();
            c_options.token_top1_match = top1.as_mut_ptr();
            c_options.token_len = n;
        }
        // SAFETY: tl_compare_result is integers and floats, for which all-zero bytes are valid.
        let mut result: sys::tl_compare_result = unsafe { std::mem::zeroed() };
        result.struct_size = std::mem::size_of::<sys::tl_compare_result>() as u32;
        // SAFETY: both models are live; `tokens` holds tokens.len() values; the per-position buffers hold n entries
        // each and live until the call returns.
        check(unsafe {
            sys::tl_score_compare(
                self.raw().as_ptr(),
                test.raw().as_ptr(),
                tokens.as_ptr(),
                tokens.len(),
                &c_options,
                &mut result,
            )
        })?;
        let backend = match result.backend {
            sys::TL_BACKEND_CPU => Backend::Cpu,
            sys::TL_BACKEND_CUDA => Backend::Cuda,
            other => return Err(Error::Internal(format!("tl_score_compare reported backend {other}"))),
        };
        Ok(CompareResult {
            tokens_scored: result.tokens_scored,
            kl_mean: result.kl_mean,
            kl_stderr: result.kl_stderr,
            kl_median: result.kl_median,
            kl_p90: result.kl_p90,
            kl_p99: result.kl_p99,
            kl_p999: result.kl_p999,
            kl_max: result.kl_max,
            kl_min: result.kl_min,
            top1_agreement: result.top1_agreement,
            perplexity_reference: result.perplexity_reference,
            perplexity_test: result.perplexity_test,
            delta_perplexity: result.delta_perplexity,
            perplexity_ratio: result.perplexity_ratio,
            nll_correlation: result.nll_correlation,
            backend,
            n_windows: crate::to_usize(result.n_windows, "n_windows")?,
            seconds: result.seconds,
            per_position: positions.map(|(kl, nll_reference, nll_test, top1)| ComparePositions {
                kl,
                nll_reference,
                nll_test,
                top1_match: top1.into_iter().map(|m| m != 0).collect(),
            }),
        })
    }
}
