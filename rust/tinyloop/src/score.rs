//! Scoring token sequences: the negative log-likelihood of each token given those before it, one sequence per call
//! ([`Model::score`]) or many independent ones ([`Model::score_batch`]).

use std::any::Any;
use std::ffi::c_void;
use std::fmt;
use std::ops::ControlFlow;
use std::panic::{self, AssertUnwindSafe};

use tinyloop_sys as sys;

use crate::device::Stream;
use crate::error::{check, Error, Result};
use crate::gemm::DispatchCounts;
use crate::model::Model;
use crate::to_c_int;

/// Where scoring runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    /// CUDA where this build and machine have a GPU, else the CPU (the default).
    #[default]
    Auto,
    /// The CPU reference backend.
    Cpu,
    /// The CUDA backend ([`Error::NoDevice`] where there is no usable GPU or no CUDA support in the build).
    Cuda,
}

impl Backend {
    pub(crate) fn to_c(self) -> i32 {
        match self {
            Backend::Auto => sys::TL_BACKEND_AUTO,
            Backend::Cpu => sys::TL_BACKEND_CPU,
            Backend::Cuda => sys::TL_BACKEND_CUDA,
        }
    }
}

/// The precision of the activations entering the linear layers of the transformer blocks (`tl_score_options.activations`;
/// the rule: docs/quality.md, "Activation precision"). The head's input is never quantized.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Activations {
    /// The activations as computed: FP32 on the CPU backend, FP16 on the CUDA backend (the default).
    #[default]
    Fp16,
    /// Each token's input quantized to INT8 with its own scale (max |x| / 127), multiplied with the weights' codes
    /// in exact int32 group sums. The CUDA backend runs it on models whose block linears are INT8 weights with one
    /// scale per row (any GPU) or INT4 ones with one scale per row or groups of 32, 64 or 128 (compute capability
    /// 9.0) and declines the others
    /// ([`Error::Unsupported`]; `Auto` then runs on the CPU).
    Int8,
    /// Each token's input quantized to FP8 e4m3 with its own scale (max |x| / 448), exact group sums. CPU backend
    /// only: the CUDA backend declines it, as `Int8` on other models.
    Fp8,
}

impl Activations {
    pub(crate) fn to_c(self) -> i32 {
        match self {
            Activations::Fp16 => sys::TL_ACTIVATIONS_FP16,
            Activations::Int8 => sys::TL_ACTIVATIONS_INT8,
            Activations::Fp8 => sys::TL_ACTIVATIONS_FP8,
        }
    }
}

/// What [`Model::score_batch`] puts in place of an empty context (a sequence with `n_context` 0).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EmptyContextBos {
    /// Nothing: `n_context` 0 means 1, the first token is context only (the default).
    #[default]
    None,
    /// The model file's beginning-of-text token ([`ModelInfo::bos_token_id`](crate::ModelInfo)); a file that
    /// names none is [`Error::InvalidArgument`].
    FromModel,
    /// This token: the sequence is scored as it followed by the sequence's tokens, all of them scored.
    Token(u32),
}

/// Options of [`Model::score`] and [`Model::score_batch`]; `Default` gives the library's defaults and no per-token
/// output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScoreOptions {
    /// Where to run.
    pub backend: Backend,
    /// CPU worker threads; 0 (default) means the machine's hardware concurrency.
    pub threads: usize,
    /// Window length in tokens, `2..=max_seq`; 0 (default) means the model's `max_seq`. A longer sequence is
    /// scored in windows that overlap by one token, so every token but the first is predicted exactly once,
    /// with at most `window - 1` tokens of context.
    pub window: usize,
    /// Return each predicted token's NLL in [`ScoreResult::token_nll`] (default `false`).
    pub token_nll: bool,
    /// CUDA backend: the device to run on (default 0).
    pub device: usize,
    /// CUDA backend: capture each window length's forward pass in a CUDA graph and replay it (default `true`,
    /// measured faster, or within 3% at 4K-token windows; `false` runs every launch eagerly).
    pub use_graphs: bool,
    /// The most bytes of working memory (activations, scratch, logits; not the weights) the call may use: host
    /// memory on the CPU backend, device memory on the CUDA backend. 0 (default) means no budget beyond the
    /// machine's. Past it the call fails with [`Error::OutOfMemory`] before allocating.
    pub max_memory_bytes: u64,
    /// [`Model::score_batch`] only: the token that stands for an empty context (default: none). With one, a
    /// sequence with `n_context` 0 scores every one of its tokens, and its `token_nll` entries are its `len()`
    /// tokens' NLLs.
    pub empty_context_bos: EmptyContextBos,
    /// The precision of the blocks' linear-layer inputs (default [`Activations::Fp16`]).
    pub activations: Activations,
}

impl Default for ScoreOptions {
    fn default() -> Self {
        ScoreOptions {
            backend: Backend::default(),
            threads: 0,
            window: 0,
            token_nll: false,
            device: 0,
            use_graphs: true,
            max_memory_bytes: 0,
            empty_context_bos: EmptyContextBos::None,
            activations: Activations::Fp16,
        }
    }
}

/// What [`Model::score`] reports, and the totals of [`Model::score_batch`].
#[derive(Debug, Clone, PartialEq)]
pub struct ScoreResult {
    /// Sum over the scored tokens of `-ln p(token | prefix)`, accumulated in `f64`.
    pub nll_sum: f64,
    /// Number of tokens predicted: `tokens.len() - 1`.
    pub tokens_scored: u64,
    /// `exp(nll_sum / tokens_scored)`.
    pub perplexity: f64,
    /// The backend that ran ([`Backend::Cpu`] or [`Backend::Cuda`]).
    pub backend: Backend,
    /// Windows the sequence was split into (for a batch, the number of sequences).
    pub n_windows: usize,
    /// Wall-clock seconds spent in the call.
    pub seconds: f64,
    /// Of `seconds`, the model's device copy and packing, which the first CUDA call on a device makes, and the
    /// forms the first call asking for INT8 activations adds (0 otherwise).
    pub setup_seconds: f64,
    /// Of `seconds`, capturing CUDA graphs for pass shapes not seen before (0 otherwise).
    pub graph_capture_seconds: f64,
    /// With [`ScoreOptions::token_nll`]: `token_nll[i]` is the NLL (natural log) of token `i + 1`, so it has
    /// `tokens.len() - 1` entries (for a batch, each sequence's in turn, see [`Model::score_batch`]). `None`
    /// otherwise.
    pub token_nll: Option<Vec<f32>>,
    /// CUDA backend: the quantized GEMMs of this call by dispatcher path (CUDA-graph replays included), and the
    /// calls in which a path refused and a later one ran. All zero on the CPU.
    pub gemm_counts: DispatchCounts,
    /// CUDA backend: FP16 GEMMs of dense or tied layers through cuBLAS. 0 on the CPU.
    pub dense_cublas_gemms: u64,
}

/// Top-k buffers of one call: `run_score` sizes them to the predicted positions times `k`.
struct TopK {
    k: usize,
    ids: Vec<i32>,
    logprobs: Vec<f32>,
}

mod sealed {
    /// What makes [`super::TokenId`] a closed set: the ids as the C API's `int32_t`, or the index of the first one
    /// above `i32::MAX`.
    pub trait Sealed: Sized {
        fn as_c_ids(ids: &[Self]) -> Result<&[i32], usize>;
    }

    impl Sealed for i32 {
        fn as_c_ids(ids: &[i32]) -> Result<&[i32], usize> {
            Ok(ids)
        }
    }

    impl Sealed for u32 {
        fn as_c_ids(ids: &[u32]) -> Result<&[i32], usize> {
            if let Some(index) = ids.iter().position(|&id| id > i32::MAX as u32) {
                return Err(index);
            }
            // SAFETY: u32 and i32 have the same size and alignment, and every id is at most i32::MAX, so each
            // reads as the same non-negative i32; the slice borrows `ids` for as long as `ids` is borrowed.
            Ok(unsafe { std::slice::from_raw_parts(ids.as_ptr().cast::<i32>(), ids.len()) })
        }
    }
}

/// The type of the token ids the scoring functions take: `i32`, the C API's, or `u32`, as tokenizers (the
/// `tokenizers` crate) and candle give them. A `u32` slice is passed to the library without a copy; an id above
/// `i32::MAX` is no model's token and is refused with [`Error::InvalidArgument`] naming it before the library is
/// called (ids up to `i32::MAX` but outside the vocabulary are the library's to refuse, as for `i32`). Implemented
/// for these two types only.
pub trait TokenId: Copy + fmt::Debug + fmt::Display + sealed::Sealed {}

impl TokenId for i32 {}
impl TokenId for u32 {}

/// `tokens` as the C API's ids, or [`Error::InvalidArgument`] naming the first id above `i32::MAX` as `what[i]`.
pub(crate) fn c_ids<'t, T: TokenId>(tokens: &'t [T], what: &str) -> Result<&'t [i32]> {
    T::as_c_ids(tokens).map_err(|index| {
        Error::InvalidArgument(format!("{what}[{index}] = {} is above i32::MAX: no token id", tokens[index]))
    })
}

/// The progress closure and a panic it raised, carried through the C callback's `user_data`.
struct Progress<'a> {
    callback: &'a mut dyn FnMut(u64, u64) -> ControlFlow<()>,
    panic: Option<Box<dyn Any + Send>>,
}

unsafe extern "C" fn progress_trampoline(user_data: *mut c_void, done: u64, total: u64) -> i32 {
    // SAFETY: `user_data` is the `Progress` that `run_score` passed, alive and not otherwise borrowed for the
    // whole tl_score / tl_score_batch call, which invokes this on the calling thread.
    let progress = &mut *user_data.cast::<Progress<'_>>();
    if progress.panic.is_some() {
        return 1;
    }
    // A panic must not unwind into C: it is kept, scoring is stopped, and the panic resumes after tl_score.
    match panic::catch_unwind(AssertUnwindSafe(|| (progress.callback)(done, total))) {
        Ok(ControlFlow::Continue(())) => 0,
        Ok(ControlFlow::Break(())) => 1,
        Err(payload) => {
            progress.panic = Some(payload);
            1
        }
    }
}

/// One sequence of [`Model::score_batch`]: its tokens, of which the first `n_context` are context only. The tokens
/// after the context are scored, each given every token before it in the sequence; `n_context` 0 means 1 (the
/// first token has nothing to be predicted from). A loglikelihood request (context, continuation) is the two
/// concatenated with `n_context = context.len()`. The ids are `i32` (the default) or `u32` (see [`TokenId`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sequence<'a, T = i32> {
    /// The tokens, each in `0..vocab`; `2..=max_seq` of them.
    pub tokens: &'a [T],
    /// How many leading tokens are context only, less than `tokens.len()`.
    pub n_context: usize,
}

impl<'a, T: TokenId> Sequence<'a, T> {
    /// A sequence scored whole: every token but the first.
    pub fn new(tokens: &'a [T]) -> Self {
        Sequence { tokens, n_context: 0 }
    }

    /// A sequence whose first `n_context` tokens are context only.
    pub fn with_context(tokens: &'a [T], n_context: usize) -> Self {
        Sequence { tokens, n_context }
    }
}

/// The sequences as the C API's, pointing into their slices, or [`Error::InvalidArgument`] naming the first id
/// above `i32::MAX` (`sequences[s].tokens[i]`).
fn c_sequences<T: TokenId>(sequences: &[Sequence<'_, T>]) -> Result<Vec<sys::tl_sequence>> {
    sequences
        .iter()
        .enumerate()
        .map(|(index, s)| {
            let tokens = c_ids(s.tokens, &format!("sequences[{index}].tokens"))?;
            Ok(sys::tl_sequence { tokens: tokens.as_ptr(), n_tokens: tokens.len(), n_context: s.n_context })
        })
        .collect()
}

/// What [`Model::score_batch`] reports for one sequence.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SequenceScore {
    /// Sum over the scored tokens (those after the context) of `-ln p(token | the tokens before it)`.
    pub nll_sum: f64,
    /// Tokens scored: `tokens.len() - max(n_context, 1)`.
    pub tokens_scored: u64,
    /// Whether greedy decoding reproduces every scored token: at each scored position the token's logit is the
    /// largest (a tie counts as greedy).
    pub greedy: bool,
}

impl SequenceScore {
    /// The mean NLL per scored token.
    pub fn mean_nll(&self) -> f64 {
        self.nll_sum / self.tokens_scored as f64
    }

    /// `exp(mean_nll())`.
    pub fn perplexity(&self) -> f64 {
        self.mean_nll().exp()
    }
}

impl Model {
    /// Scores a token sequence: the NLL of each token given those before it. Tokens (`i32` or `u32`, see
    /// [`TokenId`]) must be in `0..vocab` and there must be at least 2. Any number of threads may score one model
    /// at the same time.
    pub fn score<T: TokenId>(&self, tokens: &[T], options: &ScoreOptions) -> Result<ScoreResult> {
        self.score_impl(c_ids(tokens, "tokens")?, options, None, None)
    }

    /// Like [`Model::score`], running the CUDA backend's work on `stream` instead of the library's own stream for
    /// this model and device (the device is the stream's). Returns when the work is done.
    pub fn score_on_stream<T: TokenId>(
        &self,
        tokens: &[T],
        options: &ScoreOptions,
        stream: &Stream,
    ) -> Result<ScoreResult> {
        let options = ScoreOptions { device: stream.device().index(), ..*options };
        self.score_impl(c_ids(tokens, "tokens")?, &options, Some(stream), None)
    }

    /// Like [`Model::score`], calling `progress(done, total)` (tokens processed so far, of `total`) on this
    /// thread as scoring advances. Returning `ControlFlow::Break(())` stops it with [`Error::Cancelled`]. A
    /// panic in `progress` stops scoring and resumes once the library has returned.
    pub fn score_with_progress<T: TokenId>(
        &self,
        tokens: &[T],
        options: &ScoreOptions,
        mut progress: impl FnMut(u64, u64) -> ControlFlow<()>,
    ) -> Result<ScoreResult> {
        self.score_impl(c_ids(tokens, "tokens")?, options, None, Some(&mut progress))
    }

    /// Scores independent sequences in one call (`tl_score_batch`): the backends pack many of them into each
    /// forward pass, with attention inside each sequence only. Returns each sequence's score, in order, and the
    /// totals over all of them (`n_windows` is the number of sequences). Each sequence needs `2..=max_seq`
    /// tokens in `0..vocab` and `n_context < tokens.len()` ([`Error::InvalidArgument`] names the sequence);
    /// `options.window` must be 0 (sequences are never split). With [`ScoreOptions::token_nll`], the totals'
    /// `token_nll` holds every token's NLL but each sequence's first, context tokens included, the sequences one
    /// after another (`tokens.len() - 1` entries each). An empty batch succeeds with zero totals. The ids are `i32`
    /// or `u32` ([`TokenId`]); a `u32` id above `i32::MAX` is [`Error::InvalidArgument`] naming its sequence.
    ///
    /// ```
    /// use tinyloop::{Model, ScoreOptions, Sequence};
    ///
    /// # fn main() -> Result<(), tinyloop::Error> {
    /// let model = Model::load(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/tiny.tinyloop"))?;
    /// // Two loglikelihood requests (context, continuation) over byte tokens.
    /// let requests = [("The answer is", " 42"), ("Hello,", " world")];
    /// let tokens: Vec<Vec<i32>> =
    ///     requests.iter().map(|(c, x)| c.bytes().chain(x.bytes()).map(i32::from).collect()).collect();
    /// let sequences: Vec<Sequence> =
    ///     requests.iter().zip(&tokens).map(|((c, _), t)| Sequence::with_context(t, c.len())).collect();
    /// let (scores, total) = model.score_batch(&sequences, &ScoreOptions::default())?;
    /// for ((context, continuation), score) in requests.iter().zip(&scores) {
    ///     println!("{context:?} + {continuation:?}: NLL {:.3}, greedy {}", score.nll_sum, score.greedy);
    /// }
    /// assert_eq!(total.tokens_scored, 3 + 6);
    /// # Ok(())
    /// # }
    /// ```
    pub fn score_batch<T: TokenId>(
        &self,
        sequences: &[Sequence<'_, T>],
        options: &ScoreOptions,
    ) -> Result<(Vec<SequenceScore>, ScoreResult)> {
        self.score_batch_impl(&c_sequences(sequences)?, options, None)
    }

    /// Like [`Model::score_batch`], calling `progress(done, total)` (scored tokens so far, of `total`) on this
    /// thread between forward passes; `ControlFlow::Break(())` stops it with [`Error::Cancelled`], and a panic in
    /// `progress` resumes once the library has returned.
    pub fn score_batch_with_progress<T: TokenId>(
        &self,
        sequences: &[Sequence<'_, T>],
        options: &ScoreOptions,
        mut progress: impl FnMut(u64, u64) -> ControlFlow<()>,
    ) -> Result<(Vec<SequenceScore>, ScoreResult)> {
        self.score_batch_impl(&c_sequences(sequences)?, options, Some(&mut progress))
    }

    fn score_impl(
        &self,
        tokens: &[i32],
        options: &ScoreOptions,
        stream: Option<&Stream>,
        callback: Option<&mut dyn FnMut(u64, u64) -> ControlFlow<()>>,
    ) -> Result<ScoreResult> {
        let predicted = tokens.len().saturating_sub(1);
        self.run_score("tl_score", options, stream, callback, predicted, None, |c_options, result| {
            // SAFETY: the model is live; `tokens` holds tokens.len() values; the options' pointers are valid for
            // the call (run_score).
            unsafe { sys::tl_score(self.raw().as_ptr(), tokens.as_ptr(), tokens.len(), c_options, result) }
        })
    }

    /// The `k` most likely tokens at each predicted position and their natural-log probabilities (`tl_score`'s
    /// top-k): two vectors of `(tokens.len() - 1) * k` entries, position `i` (the prediction of token `i + 1`) at
    /// `i * k ..`, most likely first (ties: the lower id first). `1 <= k <= 20` ([`Error::InvalidArgument`] above,
    /// from the library). The logits are reduced a chunk of positions at a time, never held for the whole sequence.
    pub fn top_logprobs<T: TokenId>(
        &self,
        tokens: &[T],
        k: usize,
        options: &ScoreOptions,
    ) -> Result<(Vec<i32>, Vec<f32>)> {
        let tokens = c_ids(tokens, "tokens")?;
        let predicted = tokens.len().saturating_sub(1);
        let mut top = TopK { k, ids: Vec::new(), logprobs: Vec::new() };
        self.run_score("tl_score", options, None, None, predicted, Some(&mut top), |c_options, result| {
            // SAFETY: the model is live; `tokens` holds tokens.len() values; the options' pointers, the top-k
            // buffers included, are valid for the call (run_score).
            unsafe { sys::tl_score(self.raw().as_ptr(), tokens.as_ptr(), tokens.len(), c_options, result) }
        })?;
        Ok((top.ids, top.logprobs))
    }

    /// `c_sequences` point into slices the caller borrows for the call (c_sequences()).
    fn score_batch_impl(
        &self,
        c_sequences: &[sys::tl_sequence],
        options: &ScoreOptions,
        callback: Option<&mut dyn FnMut(u64, u64) -> ControlFlow<()>>,
    ) -> Result<(Vec<SequenceScore>, ScoreResult)> {
        // A sequence with an empty context and a token standing for it predicts all of its tokens.
        let with_bos = options.empty_context_bos != EmptyContextBos::None;
        let predicted = c_sequences
            .iter()
            .map(|s| if with_bos && s.n_context == 0 { s.n_tokens } else { s.n_tokens.saturating_sub(1) })
            .sum();
        let mut c_scores =
            vec![sys::tl_sequence_score { nll_sum: 0.0, tokens_scored: 0, greedy: 0 }; c_sequences.len()];
        let total = self.run_score("tl_score_batch", options, None, callback, predicted, None, |c_options, result| {
            // SAFETY: the model is live; each tl_sequence points into a slice borrowed for the call with its
            // length; `c_scores` holds one entry per sequence; the options' pointers are valid for the call.
            unsafe {
                sys::tl_score_batch(
                    self.raw().as_ptr(),
                    c_sequences.as_ptr(),
                    c_sequences.len(),
                    c_options,
                    c_scores.as_mut_ptr(),
                    result,
                )
            }
        })?;
        let scores = c_scores
            .iter()
            .map(|s| SequenceScore { nll_sum: s.nll_sum, tokens_scored: s.tokens_scored, greedy: s.greedy != 0 })
            .collect();
        Ok((scores, total))
    }

    /// The part of a scoring call that `score_impl` and `score_batch_impl` share: the C options (with a
    /// `predicted`-float NLL buffer when `options.token_nll`, and the progress closure through the trampoline),
    /// the call `call(options, result)`, a panic of the closure resumed, the status checked and the result read.
    fn run_score(
        &self,
        function: &str,
        options: &ScoreOptions,
        stream: Option<&Stream>,
        callback: Option<&mut dyn FnMut(u64, u64) -> ControlFlow<()>>,
        predicted: usize,
        mut top: Option<&mut TopK>,
        call: impl FnOnce(&sys::tl_score_options, &mut sys::tl_score_result) -> sys::tl_status,
    ) -> Result<ScoreResult> {
        let mut token_nll = options.token_nll.then(|| vec![0.0f32; predicted]);
        if let Some(top) = top.as_deref_mut() {
            top.ids = vec![0; predicted * top.k];
            top.logprobs = vec![0.0; predicted * top.k];
        }
        let mut progress = callback.map(|callback| Progress { callback, panic: None });
        let c_options = sys::tl_score_options {
            struct_size: std::mem::size_of::<sys::tl_score_options>() as u32,
            backend: options.backend.to_c(),
            n_threads: to_c_int(options.threads, "threads")?,
            window: to_c_int(options.window, "window")?,
            progress: progress.as_ref().map(|_| progress_trampoline as _),
            progress_user_data: progress.as_mut().map_or(std::ptr::null_mut(), |p| (p as *mut Progress<'_>).cast()),
            token_nll: token_nll.as_mut().map_or(std::ptr::null_mut(), |nll| nll.as_mut_ptr()),
            token_nll_len: token_nll.as_ref().map_or(0, Vec::len),
            device: to_c_int(options.device, "device")?,
            stream: stream.map_or(std::ptr::null_mut(), Stream::raw),
            use_graphs: options.use_graphs.into(),
            max_memory_bytes: options.max_memory_bytes,
            top_k: top.as_ref().map_or(Ok(0), |top| to_c_int(top.k, "k"))?,
            top_ids: top.as_mut().map_or(std::ptr::null_mut(), |top| top.ids.as_mut_ptr()),
            top_logprobs: top.as_mut().map_or(std::ptr::null_mut(), |top| top.logprobs.as_mut_ptr()),
            top_len: top.as_ref().map_or(0, |top| top.ids.len()),
            empty_context_bos: match options.empty_context_bos {
                EmptyContextBos::None => sys::TL_BOS_NONE,
                EmptyContextBos::FromModel => sys::TL_BOS_FROM_MODEL,
                EmptyContextBos::Token(id) => i32::try_from(id).map_err(|_| {
                    Error::InvalidArgument(format!("empty_context_bos token {id} is above i32::MAX"))
                })?,
            },
            activations: options.activations.to_c(),
            reserved: 0,
        };
        // SAFETY: tl_score_result is integers and floats, for which all-zero bytes are valid.
        let mut result: sys::tl_score_result = unsafe { std::mem::zeroed() };
        result.struct_size = std::mem::size_of::<sys::tl_score_result>() as u32;
        // The NLL buffer holds token_nll_len floats; `progress` outlives the call and is reached only through the
        // callback on this thread; the stream (if any) is live and the call waits for its work before returning.
        let status = call(&c_options, &mut result);
        if let Some(payload) = progress.and_then(|p| p.panic) {
            panic::resume_unwind(payload);
        }
        check(status)?;
        let backend = match result.backend {
            sys::TL_BACKEND_CPU => Backend::Cpu,
            sys::TL_BACKEND_CUDA => Backend::Cuda,
            other => return Err(Error::Internal(format!("{function} reported backend {other}"))),
        };
        Ok(ScoreResult {
            nll_sum: result.nll_sum,
            tokens_scored: result.tokens_scored,
            perplexity: result.perplexity,
            backend,
            n_windows: crate::to_usize(result.n_windows, "n_windows")?,
            seconds: result.seconds,
            setup_seconds: result.setup_seconds,
            graph_capture_seconds: result.graph_capture_seconds,
            token_nll,
            gemm_counts: DispatchCounts {
                fp16_body: result.gemm_fp16_body,
                marlin_fused: result.gemm_marlin_fused,
                marlin_correction: result.gemm_marlin_correction,
                dequant_cublas: result.gemm_dequant_cublas,
                native: result.gemm_native,
                fallbacks: result.gemm_fallbacks,
            },
            dense_cublas_gemms: result.gemm_dense_cublas,
        })
    }
}
