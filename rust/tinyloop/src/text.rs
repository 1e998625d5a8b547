//! The model's tokenizer: text to token ids and back (`tl_model_tokenizer`, `tl_tokenize`, `tl_detokenize`).

use std::os::raw::c_char;

use tinyloop_sys as sys;

use crate::error::{check, Error, Result};
use crate::model::Model;
use crate::to_usize;

/// What a model file stores to read text with (docs/format.md, "The tokenizer").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenizerKind {
    /// None: each byte of the text is one token, its value the id (0-255).
    Bytes,
    /// A Hugging Face `tokenizer.json` holding a byte-level BPE (GPT-2, Llama 3, Qwen2 style).
    HuggingFace,
    /// A SentencePiece `tokenizer.model` (Llama 2, Mistral).
    SentencePiece,
    /// A kind this crate does not know (from a newer library), by its `TL_TOKENIZER_*` value.
    Other(i32),
}

/// The model's tokenizer: its kind and how many ids it has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenizerInfo {
    /// What the file stores.
    pub kind: TokenizerKind,
    /// One more than the largest id it gives or takes (256 for [`TokenizerKind::Bytes`]).
    pub n_ids: usize,
}

impl Model {
    /// The tokenizer stored with the model ([`TokenizerKind::Bytes`] when there is none).
    pub fn tokenizer(&self) -> Result<TokenizerInfo> {
        let (mut kind, mut n_ids) = (0i32, 0i32);
        // SAFETY: the model is live and both outputs are writable.
        check(unsafe { sys::tl_model_tokenizer(self.raw().as_ptr(), &mut kind, &mut n_ids) })?;
        let kind = match kind {
            sys::TL_TOKENIZER_BYTES => TokenizerKind::Bytes,
            sys::TL_TOKENIZER_HUGGINGFACE => TokenizerKind::HuggingFace,
            sys::TL_TOKENIZER_SENTENCEPIECE => TokenizerKind::SentencePiece,
            other => TokenizerKind::Other(other),
        };
        Ok(TokenizerInfo { kind, n_ids: to_usize(n_ids, "the tokenizer's n_ids")? })
    }

    /// The token ids of `text` by the model's tokenizer, with no beginning- or end-of-text token added (a
    /// tokenizer.json's special tokens written in the text are matched). A `&str` or bytes: a byte-level model
    /// takes any bytes, a tokenizer.json or tokenizer.model needs UTF-8 ([`crate::Error::InvalidArgument`]
    /// naming the first bad byte's offset otherwise). Thread-safe: a shared model tokenizes on many threads.
    pub fn tokenize(&self, text: impl AsRef<[u8]>) -> Result<Vec<i32>> {
        let text = text.as_ref();
        // One id a byte is room enough for byte-level and BPE tokenizers; SentencePiece may need more, and then
        // the first call gives the size.
        let mut ids = vec![0i32; text.len() + 1];
        let mut n = 0usize;
        for _ in 0..2 {
            // SAFETY: `text` holds text.len() readable bytes and `ids` ids.len() writable ids; `n` is writable.
            let status = unsafe {
                sys::tl_tokenize(
                    self.raw().as_ptr(),
                    text.as_ptr().cast::<c_char>(),
                    text.len(),
                    ids.as_mut_ptr(),
                    ids.len(),
                    &mut n,
                )
            };
            if status == sys::TL_ERR_BUFFER_TOO_SMALL && n > ids.len() {
                ids.resize(n, 0);
                continue;
            }
            check(status)?;
            ids.truncate(n);
            return Ok(ids);
        }
        Err(Error::Internal("the library asked for more room twice for the same call".into()))
    }

    /// The bytes `ids` stand for (special tokens' text included), not necessarily UTF-8: a token may hold part of a
    /// character (`String::from_utf8` tells). An id that is no token is [`crate::Error::InvalidArgument`] naming
    /// its index.
    pub fn detokenize(&self, ids: &[i32]) -> Result<Vec<u8>> {
        let mut text = vec![0u8; ids.len() * 8 + 16];
        let mut n = 0usize;
        for _ in 0..2 {
            // SAFETY: `ids` holds ids.len() readable ids and `text` text.len() writable bytes; `n` is writable.
            let status = unsafe {
                sys::tl_detokenize(
                    self.raw().as_ptr(),
                    ids.as_ptr(),
                    ids.len(),
                    text.as_mut_ptr().cast::<c_char>(),
                    text.len(),
                    &mut n,
                )
            };
            if status == sys::TL_ERR_BUFFER_TOO_SMALL && n > text.len() {
                text.resize(n, 0);
                continue;
            }
            check(status)?;
            text.truncate(n);
            return Ok(text);
        }
        Err(Error::Internal("the library asked for more room twice for the same call".into()))
    }
}
