// The perplexity conventions of `tinyloop score` (docs/quality.md, "Perplexity conventions"): which tokens each
// forward pass sees, which of them it scores, and the running perplexity over the passes done. Kept apart from
// main.cpp: plain arithmetic on token counts, no library calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tl::cli {

enum class Convention {
    Windows,          // tl_score's windows, which overlap by one token (the default)
    Stride,           // Hugging Face's strided sliding window
    LlamaPerplexity,  // llama.cpp's llama-perplexity: separate chunks, the second half of each scored
};

const char *convention_name(Convention convention);

// One forward pass: tokens [start, start + length) of the stream, of which the first n_context are context only, as
// tl_sequence's n_context (0 means 1: the first token has nothing to be predicted from). It scores the tokens
// start + max(n_context, 1) .. start + length - 1.
struct Pass {
    size_t start = 0;
    size_t length = 0;
    size_t n_context = 0;

    size_t first_scored() const { return n_context > 0 ? n_context : 1; }
    size_t scored() const { return length - first_scored(); }
};

// tl_score's windows of `window` tokens overlapping by one: window w starts at w * (window - 1), and each scores all
// its tokens but the first, so every token but the stream's first is scored once (the last window may be shorter).
std::vector<Pass> overlap_windows(size_t n_tokens, size_t window);

// Hugging Face's sliding window (https://huggingface.co/docs/transformers/perplexity): windows of `window` tokens
// starting every `stride` tokens (1 <= stride < window) until one reaches the end of the stream; the first scores all
// its tokens but the first, each later one the tokens after the end of the one before (its last `stride`, fewer in
// a last, shorter window). Every token but the first is scored once, with at least window - stride tokens of context
// after the first window. stride = window - 1 gives overlap_windows.
std::vector<Pass> stride_windows(size_t n_tokens, size_t window, size_t stride);

// llama-perplexity's chunks: floor(n_tokens / ctx) chunks of ctx tokens, the remainder left out; each chunk is scored
// on its own and scores its tokens ctx/2 + 1 .. ctx - 1 (llama.cpp takes the logits of positions ctx/2 .. ctx - 2,
// each predicting the token after it), so ctx - ctx/2 - 1 tokens a chunk.
std::vector<Pass> llama_chunks(size_t n_tokens, size_t ctx);

// The perplexity over the passes finished so far, taken from the NLL buffer of the scoring call that runs them,
// which the library fills before each progress report (tinyloop.h, tl_progress_fn). Passes finish in order.
class RunningPerplexity {
public:
    // How a call lays out its NLLs: Windows, tl_score's (token i of the stream at nll[i - 1], the calls' passes being
    // all windows of one stream); Sequences, tl_score_batch's (each pass's length - 1 NLLs after the pass before).
    enum class Layout { Windows, Sequences };

    explicit RunningPerplexity(const std::vector<Pass> &passes) : passes_(passes) {}

    // The next call runs passes [next_pass(), end) and writes their NLLs to `nll`.
    void begin_call(size_t end, const float *nll, Layout layout);
    // The call reports `done` scored tokens (of its own): takes in the passes this completes.
    void take_in(uint64_t done);

    size_t next_pass() const { return next_; }
    uint64_t tokens() const { return tokens_; }
    // exp(mean NLL) of the passes taken in; NaN before the first.
    double perplexity() const;
    // ", PPL x over k windows" for a progress line, or "" before the first pass is in.
    std::string progress_text(const char *unit) const;

private:
    const std::vector<Pass> &passes_;
    size_t next_ = 0, call_end_ = 0;
    const float *nll_ = nullptr;
    Layout layout_ = Layout::Windows;
    size_t call_offset_ = 0;     // Sequences: the next pass's first NLL in the call's buffer
    uint64_t call_done_ = 0;     // scored tokens of this call's passes taken in
    uint64_t tokens_ = 0;
    double nll_sum_ = 0;
};

}  // namespace tl::cli
