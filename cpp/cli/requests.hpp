// score-batch's input: JSON lines, one request each, read with bounded memory. Kept apart from main.cpp so that
// the fuzz target (tests/fuzz/fuzz_requests.cpp) runs the very code the tool does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tl::cli {

// A line that is not a valid request; the message says why, without the line's number.
struct RequestError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// The longest request line: 4 MiB holds over half a million token ids, far more than any model's max_seq, and
// bounds what one line's parse costs (a JSON array of small ids takes ~16x its text in memory).
constexpr size_t kMaxRequestLineBytes = size_t{4} << 20;

// One request: its tokens, how many of them are context only, and the keys it carries for the caller's own use
// (an evaluation harness's "id", "doc_id", ...), which its output line repeats.
struct BatchRequest {
    std::vector<int32_t> tokens;
    size_t n_context = 0;
    nlohmann::ordered_json echo = nlohmann::ordered_json::object();
};

// The keys of an output line; a request may not carry them for echoing.
constexpr const char *kOutputKeys[] = {"index",      "line",       "error",      "nll_sum",          "tokens_scored",
                                       "mean_nll",   "perplexity", "greedy",     "context_truncated",
                                       "top_logprobs"};

// Cuts tokens from the front of the context until the request fits `max_seq`, keeping the continuation whole and at
// least one context token (a harness's left truncation). Returns how many were cut; a request that still does not
// fit is left for the library to refuse by its length.
size_t truncate_context(BatchRequest &request, size_t max_seq);

// The token ids of a request's text (the model's tokenizer); it throws a std::exception whose message says why not.
using TextEncoder = std::function<std::vector<int32_t>(const std::string &)>;

// One line's request, in one of three forms: {"tokens": [ids], "n_context": k (optional, default 0)},
// {"context": [ids], "continuation": [ids]} or {"text": "...", "context_text": "..." (optional)}, whose strings are
// tokenized each on its own by `encode` (empty: one token per byte, their UTF-8 bytes). Throws
// RequestError. Keys of no form are echoed (BatchRequest::echo), unless an output line has them too; keys of two
// forms in one request are refused. An explicitly empty context ("context": [] or "context_text": "") becomes one
// beginning-of-text token: the request's "bos": ID, else `bos` (the tool's --bos, else the model file's
// bos_token_id; -1: none); with neither it is refused, the message saying how to give one: the first continuation
// token would have nothing before it to be scored from, and silently leaving it out would score a different
// continuation than the one asked for.
BatchRequest parse_request(const std::string &line, const TextEncoder &encode = TextEncoder(), int64_t bos = -1);

// Reads lines of at most `max_bytes` bytes (the newline excluded) from a stream, holding no more than one line.
class LineReader {
public:
    LineReader(std::FILE *file, size_t max_bytes) : file_(file), max_bytes_(max_bytes) {}
    // The next line into `line` (without its newline; a last line without one counts). False at the end of the
    // input. Throws RequestError for a line over the limit, having read only up to the limit, since an input
    // with such a line (a binary file, /dev/zero) is not JSON lines and the rest of it cannot be trusted.
    bool next(std::string &line);
    // Lines returned so far, the current one included: the number of the line `next` returned last.
    size_t line_number() const { return line_number_; }
    bool failed() const { return std::ferror(file_) != 0; }

private:
    std::FILE *file_;
    size_t max_bytes_;
    size_t line_number_ = 0;
};

}  // namespace tl::cli
