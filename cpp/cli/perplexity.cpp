#include "cli/perplexity.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace tl::cli {

const char *convention_name(Convention convention) {
    switch (convention) {
    case Convention::Windows: return "windows";
    case Convention::Stride: return "stride";
    case Convention::LlamaPerplexity: return "llama-perplexity";
    }
    return "windows";
}

std::vector<Pass> overlap_windows(size_t n_tokens, size_t window) {
    std::vector<Pass> passes;
    if (n_tokens < 2 || window < 2) return passes;
    for (size_t start = 0; start + 1 < n_tokens; start += window - 1) {
        passes.push_back(Pass{start, std::min(window, n_tokens - start), 0});
    }
    return passes;
}

std::vector<Pass> stride_windows(size_t n_tokens, size_t window, size_t stride) {
    std::vector<Pass> passes;
    if (n_tokens < 2 || window < 2 || stride < 1 || stride >= window) return passes;
    size_t scored_to = 0;  // the end of the previous window: the tokens before it are scored
    for (size_t begin = 0;; begin += stride) {
        const size_t end = std::min(begin + window, n_tokens);
        passes.push_back(Pass{begin, end - begin, scored_to - begin});  // the first: 0, scored from its second token
        scored_to = end;
        if (end == n_tokens) break;
    }
    return passes;
}

std::vector<Pass> llama_chunks(size_t n_tokens, size_t ctx) {
    std::vector<Pass> passes;
    if (ctx < 4) return passes;
    for (size_t c = 0; c < n_tokens / ctx; ++c) passes.push_back(Pass{c * ctx, ctx, ctx / 2 + 1});
    return passes;
}

void RunningPerplexity::begin_call(size_t end, const float *nll, Layout layout) {
    call_end_ = std::min(end, passes_.size());
    nll_ = nll;
    layout_ = layout;
    call_offset_ = 0;
    call_done_ = 0;
}

void RunningPerplexity::take_in(uint64_t done) {
    while (next_ < call_end_ && call_done_ + passes_[next_].scored() <= done) {
        const Pass &p = passes_[next_];
        // Token j of the pass (j >= 1) has its NLL at base + j - 1.
        const size_t base = layout_ == Layout::Windows ? p.start : call_offset_;
        if (nll_ != nullptr) {
            for (size_t j = p.first_scored(); j < p.length; ++j) nll_sum_ += nll_[base + j - 1];
        }
        call_offset_ += p.length - 1;
        call_done_ += p.scored();
        tokens_ += p.scored();
        ++next_;
    }
}

double RunningPerplexity::perplexity() const {
    return tokens_ > 0 ? std::exp(nll_sum_ / static_cast<double>(tokens_)) : NAN;
}

std::string RunningPerplexity::progress_text(const char *unit) const {
    if (tokens_ == 0) return {};
    char buf[96];
    std::snprintf(buf, sizeof buf, ", PPL %.4f over %zu %s%s", perplexity(), next_, unit, next_ == 1 ? "" : "s");
    return buf;
}

}  // namespace tl::cli
