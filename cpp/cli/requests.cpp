#include "cli/requests.hpp"

#include <algorithm>
#include <initializer_list>

#include "util/error.hpp"
#include "util/json.hpp"

namespace tl::cli {

namespace {

using nlohmann::json;

// A value as a message quotes it: numbers and booleans as written, anything else by its type, so that quoting a
// hostile value costs nothing whatever its size or depth.
std::string describe(const json &value) {
    if (value.is_number() || value.is_boolean() || value.is_null()) return value.dump();
    return std::string("a ") + value.type_name();
}

// A request's JSON array of token ids (int32; the library checks them against the vocabulary).
std::vector<int32_t> json_tokens(const json &request, const char *key) {
    const json &value = request.at(key);
    if (!value.is_array()) {
        throw RequestError(std::string("\"") + key + "\" must be an array of token ids, not " + describe(value));
    }
    std::vector<int32_t> tokens;
    tokens.reserve(value.size());
    for (size_t i = 0; i < value.size(); ++i) {
        const json &v = value[i];
        const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= INT32_MAX
                                                 : v.is_number_integer() && v.get<int64_t>() >= INT32_MIN;
        if (!fits) {
            throw RequestError(std::string("\"") + key + "\"[" + std::to_string(i) + "] = " + describe(v) +
                               " is not a token id (an int32)");
        }
        tokens.push_back(v.get<int32_t>());
    }
    return tokens;
}

// The tokens of a request's string: `encode`'s, or one per byte without it (as score --text reads a file).
void append_text_tokens(const json &request, const char *key, std::vector<int32_t> &tokens,
                        const TextEncoder &encode) {
    const json &value = request.at(key);
    if (!value.is_string()) throw RequestError(std::string("\"") + key + "\" must be a string, not " + describe(value));
    const std::string &text = value.get_ref<const std::string &>();
    if (!encode) {
        for (const char c : text) tokens.push_back(static_cast<unsigned char>(c));
        return;
    }
    std::vector<int32_t> ids;
    try {
        ids = encode(text);
    } catch (const std::exception &e) {
        throw RequestError(std::string("\"") + key + "\": " + e.what());
    }
    tokens.insert(tokens.end(), ids.begin(), ids.end());
}

// An empty context becomes the beginning-of-text token `bos` (the request's "bos", else the tool's): the first
// continuation token needs a token before it to be scored from. Without one the request is refused, saying how to
// give one (leaving that token out would score a different continuation than the one asked for).
void require_context(std::vector<int32_t> &tokens, const char *key, int64_t bos) {
    if (!tokens.empty()) return;
    if (bos < 0) {
        throw RequestError(std::string("\"") + key +
                           "\" is empty and the model file names no beginning-of-text token to stand for it: the "
                           "first continuation token needs a token before it to be scored from; give one with "
                           "\"bos\": ID in the request or score-batch --bos ID, or give a context token");
    }
    tokens.push_back(static_cast<int32_t>(bos));
}

// The request's "bos" (a token id), or `fallback` without one.
int64_t request_bos(const json &request, int64_t fallback) {
    if (!request.contains("bos")) return fallback;
    const json &v = request["bos"];
    if (!v.is_number_unsigned() || v.get<uint64_t>() > INT32_MAX) {
        throw RequestError("\"bos\" must be a token id (a non-negative int32), not " + describe(v));
    }
    return static_cast<int64_t>(v.get<uint64_t>());
}

}  // namespace

BatchRequest parse_request(const std::string &line, const TextEncoder &encode, int64_t bos) {
    json request;
    try {
        request = parse_json(line, JsonLimits{kMaxRequestLineBytes}, "the request");
    } catch (const Error &e) {
        throw RequestError(e.what());
    }
    if (!request.is_object()) throw RequestError(std::string("expected a JSON object, got ") + request.type_name());
    static const std::initializer_list<std::string> kRequestKeys = {"tokens", "n_context", "context",
                                                                    "continuation", "text", "context_text", "bos"};
    BatchRequest r;
    // Keys of another form are a mistake; any other key is the caller's, returned with the result.
    const auto only = [&](const char *form, std::initializer_list<std::string> keys) {
        for (auto it = request.begin(); it != request.end(); ++it) {
            const std::string &key = it.key();
            if (std::find(keys.begin(), keys.end(), key) != keys.end()) continue;
            if (std::find(kRequestKeys.begin(), kRequestKeys.end(), key) != kRequestKeys.end()) {
                throw RequestError("key " + json(key).dump() + " does not go with \"" + form + "\"");
            }
            if (std::find(std::begin(kOutputKeys), std::end(kOutputKeys), key) != std::end(kOutputKeys)) {
                throw RequestError("key " + json(key).dump() + " is an output field; it cannot be echoed");
            }
            r.echo[key] = it.value();
        }
    };
    if (request.contains("tokens")) {
        only("tokens", {"tokens", "n_context"});
        r.tokens = json_tokens(request, "tokens");
        if (request.contains("n_context")) {
            const json &k = request["n_context"];
            if (!k.is_number_unsigned()) {
                throw RequestError("\"n_context\" must be a non-negative integer, not " + describe(k));
            }
            r.n_context = k.get<size_t>();
        }
    } else if (request.contains("context") || request.contains("continuation")) {
        only("context", {"context", "continuation", "bos"});
        if (!request.contains("context") || !request.contains("continuation")) {
            throw RequestError("\"context\" and \"continuation\" go together");
        }
        r.tokens = json_tokens(request, "context");
        require_context(r.tokens, "context", request_bos(request, bos));
        r.n_context = r.tokens.size();
        const std::vector<int32_t> continuation = json_tokens(request, "continuation");
        r.tokens.insert(r.tokens.end(), continuation.begin(), continuation.end());
    } else if (request.contains("text")) {
        only("text", {"text", "context_text", "bos"});
        if (request.contains("context_text")) {
            append_text_tokens(request, "context_text", r.tokens, encode);
            require_context(r.tokens, "context_text", request_bos(request, bos));
        }
        r.n_context = r.tokens.size();
        append_text_tokens(request, "text", r.tokens, encode);
    } else {
        throw RequestError("expected \"tokens\", \"context\" and \"continuation\", or \"text\"");
    }
    return r;
}

size_t truncate_context(BatchRequest &request, size_t max_seq) {
    if (request.tokens.size() <= max_seq || request.n_context < 2) return 0;
    const size_t cut = std::min(request.tokens.size() - max_seq, request.n_context - 1);
    request.tokens.erase(request.tokens.begin(), request.tokens.begin() + static_cast<std::ptrdiff_t>(cut));
    request.n_context -= cut;
    return cut;
}

bool LineReader::next(std::string &line) {
    line.clear();
    int c = getc_unlocked(file_);
    if (c == EOF) return false;
    ++line_number_;
    for (; c != EOF && c != '\n'; c = getc_unlocked(file_)) {
        if (line.size() == max_bytes_) {
            throw RequestError("line " + std::to_string(line_number_) + " is longer than the limit of " +
                               std::to_string(max_bytes_) + " bytes");
        }
        line.push_back(static_cast<char>(c));
    }
    return true;
}

}  // namespace tl::cli
