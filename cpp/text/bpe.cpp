// A Hugging Face tokenizer.json holding a byte-level BPE model (GPT-2, Llama 3, Qwen2 style), as the tokenizers
// library runs it with add_special_tokens=False:
//   1. added tokens (tokenizer.json's added_tokens, special or not) are matched literally, leftmost first and the
//      longest at a position, and become their ids; the text between them goes on;
//   2. the normalizer: none, or NFC (utf8proc);
//   3. the pre-tokenizer: Split steps (a regex or a string, "Isolated": each match and each stretch between
//      matches is a piece), then ByteLevel (optionally a space before each piece, optionally GPT-2's split regex),
//      each piece's bytes mapped to GPT-2's byte-to-unicode characters;
//   4. the BPE model on each piece: the piece's characters, then the merges applied by rank (the lowest-ranked
//      adjacent pair first, the leftmost of equals), each final symbol's id from the vocabulary; with
//      ignore_merges, a piece that is itself in the vocabulary is that one token.
// Regexes run on PCRE2 (Unicode properties, lookahead) with a match limit. Decoding maps each token's characters
// back to bytes (added tokens: their content).

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <queue>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <nlohmann/json.hpp>

#include "text/kinds.hpp"
#include "text/tokenizer.hpp"
#include "util/error.hpp"
#include "util/json.hpp"

namespace tl::text {

namespace {

using nlohmann::json;

// A tokenizer.json's JSON: Llama 3's is 9 MB with ~128k vocabulary entries and ~280k merges (as pairs, three
// values each), so the value count allows 4M (a parse's memory stays under ~400 MB at the limit).
constexpr int32_t kMaxJsonDepth = 64;
constexpr uint64_t kMaxJsonValues = uint64_t{1} << 22;
// A split regex is a line of text; this bounds what compiling a hostile one costs.
constexpr size_t kMaxPatternBytes = 4096;
// Backtracking steps one regex match may take (PCRE2's match limit): the patterns of real tokenizers need a few per
// character; a pathological pattern is stopped rather than left to run for hours.
constexpr uint32_t kMatchLimit = 100000000;

// GPT-2's split regex, which ByteLevel applies when use_regex is true (the tokenizers library's default).
constexpr const char *kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";


// A value as a message quotes it: short strings, numbers and booleans as written, anything else by its type.
std::string describe(const json &value) {
    if (value.is_number() || value.is_boolean() || value.is_null()) return value.dump();
    if (value.is_string() && value.get_ref<const std::string &>().size() <= 64) return value.dump();
    return std::string("a ") + value.type_name();
}

void append_utf8(std::string &out, uint32_t cp) {
    if (cp < 0x80) {
        out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
        out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
}

// The length of the UTF-8 sequence that starts with `lead` (text already checked to be valid UTF-8).
size_t utf8_length(unsigned char lead) { return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4; }

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes for U+0100 on, in byte
// order. Every code point used is below 0x144.
struct ByteLevelMap {
    std::string chars[256];     // byte -> its character, UTF-8
    int16_t byte_of[0x144];     // code point -> byte, or -1

    ByteLevelMap() {
        std::fill(std::begin(byte_of), std::end(byte_of), int16_t{-1});
        uint32_t next = 256;
        for (uint32_t b = 0; b < 256; ++b) {
            const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
            const uint32_t cp = printable ? b : next++;
            append_utf8(chars[b], cp);
            byte_of[cp] = static_cast<int16_t>(b);
        }
    }
};

const ByteLevelMap &byte_level() {
    static const ByteLevelMap map;
    return map;
}

// A compiled PCRE2 pattern, shared by every thread (PCRE2 compiled code and a match context are read-only while
// matching; each match brings its own match data).
class Regex {
public:
    Regex(const std::string &pattern, bool literal, const std::string &what) {
        if (pattern.empty()) fail(TL_ERR_FORMAT, what + " is empty");
        if (pattern.size() > kMaxPatternBytes) {
            fail(TL_ERR_FORMAT, what + " is " + std::to_string(pattern.size()) + " bytes long, more than the " +
                                    std::to_string(kMaxPatternBytes) + " a split pattern may have");
        }
        int error = 0;
        PCRE2_SIZE offset = 0;
        const uint32_t options = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
        code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &error, &offset,
                              nullptr);
        if (code_ == nullptr) {
            PCRE2_UCHAR text[256];
            pcre2_get_error_message(error, text, sizeof text);
            fail(TL_ERR_UNSUPPORTED, what + " does not compile as a PCRE2 regular expression (at offset " +
                                         std::to_string(offset) + ": " + reinterpret_cast<const char *>(text) + ")");
        }
        // JIT where the platform has it (several times faster); the interpreter otherwise.
        pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);
        context_ = pcre2_match_context_create(nullptr);
        if (context_ == nullptr) throw std::bad_alloc();
        pcre2_set_match_limit(context_, kMatchLimit);
    }
    ~Regex() {
        pcre2_match_context_free(context_);
        pcre2_code_free(code_);
    }
    Regex(const Regex &) = delete;
    Regex &operator=(const Regex &) = delete;

    const pcre2_code *code() const { return code_; }

    // The next match in `subject` at or after `start`: true and [*begin, *end), or false when there is none.
    bool find(std::string_view subject, size_t start, pcre2_match_data *match, size_t *begin, size_t *end) const {
        const auto *s = reinterpret_cast<PCRE2_SPTR>(subject.data());
        // The text was checked to be UTF-8 once, so no call checks it again (which would cost the whole subject
        // at every call).
        int rc = pcre2_match(code_, s, subject.size(), start, PCRE2_NO_UTF_CHECK, match, context_);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {  // the JIT's stack is small and fixed; the interpreter's is the heap
            rc = pcre2_match(code_, s, subject.size(), start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, match, context_);
        }
        if (rc == PCRE2_ERROR_NOMATCH) return false;
        if (rc < 0) {
            PCRE2_UCHAR text[256];
            pcre2_get_error_message(rc, text, sizeof text);
            fail(TL_ERR_INVALID_ARGUMENT, std::string("the tokenizer's split pattern failed on this text: ") +
                                              reinterpret_cast<const char *>(text));
        }
        const PCRE2_SIZE *ovector = pcre2_get_ovector_pointer(match);
        *begin = ovector[0];
        *end = ovector[1];
        return true;
    }

private:
    pcre2_code *code_ = nullptr;
    pcre2_match_context *context_ = nullptr;
};

struct MatchData {
    pcre2_match_data *data;
    explicit MatchData(const Regex &regex) : data(pcre2_match_data_create_from_pattern(regex.code(), nullptr)) {
        if (data == nullptr) throw std::bad_alloc();
    }
    ~MatchData() { pcre2_match_data_free(data); }
    MatchData(const MatchData &) = delete;
    MatchData &operator=(const MatchData &) = delete;
};

// One pre-tokenizer step.
struct Step {
    std::unique_ptr<Regex> split;  // a Split (Isolated), or ByteLevel's regex when it uses one
    bool byte_level = false;
    bool add_prefix_space = false;  // ByteLevel only
};

struct AddedToken {
    std::string content;
    int32_t id;
};

class BpeTokenizer final : public Tokenizer {
public:
    BpeTokenizer(std::string bytes, const std::string &what)
        : Tokenizer(TokenizerKind::HuggingFace, std::move(bytes)), what_(what) {
        const json root = parse_json(source(), JsonLimits{kMaxTokenizerBytes, kMaxJsonDepth, kMaxJsonValues}, what);
        if (!root.is_object()) fail(TL_ERR_FORMAT, what + ": expected a JSON object, got " + root.type_name());
        read_model(member(root, "model", "model"));
        read_added_tokens(root);
        read_normalizer(root);
        read_pre_tokenizer(root);
        read_decoder(root);
        build_decode_table();
    }

    int32_t n_ids() const override { return n_ids_; }

    std::vector<int32_t> encode(std::string_view text) const override {
        require_utf8(text);
        std::vector<int32_t> ids;
        std::vector<std::unique_ptr<MatchData>> matches;
        for (const Step &step : steps_)
            matches.push_back(step.split ? std::make_unique<MatchData>(*step.split) : nullptr);
        size_t start = 0;  // the text not yet tokenized begins here
        for (size_t i = 0; i < text.size();) {
            const AddedToken *added = added_at(text, i);
            if (added == nullptr) {
                ++i;
                continue;
            }
            encode_segment(text.substr(start, i - start), matches, ids);
            ids.push_back(added->id);
            i += added->content.size();
            start = i;
        }
        encode_segment(text.substr(start), matches, ids);
        return ids;
    }

    std::string decode(const int32_t *ids, size_t n) const override {
        std::string out;
        for (size_t i = 0; i < n; ++i) {
            const int32_t id = ids[i];
            if (id < 0 || id >= n_ids_ || !known_[static_cast<size_t>(id)]) {
                fail(TL_ERR_INVALID_ARGUMENT, "ids[" + std::to_string(i) + "] = " + std::to_string(id) +
                                                  " is no token of this tokenizer (ids 0 to " +
                                                  std::to_string(n_ids_ - 1) + ")");
            }
            out += decoded_[static_cast<size_t>(id)];
        }
        return out;
    }

private:
    // ---- Reading tokenizer.json ----

    const json &member(const json &object, const char *key, const std::string &path) const {
        const auto it = object.find(key);
        if (it == object.end()) fail(TL_ERR_FORMAT, what_ + ": " + path + " is missing");
        return *it;
    }

    // An optional boolean: absent or null gives the default.
    bool flag(const json &object, const char *key, bool fallback, const std::string &path) const {
        const auto it = object.find(key);
        if (it == object.end() || it->is_null()) return fallback;
        if (!it->is_boolean()) {
            fail(TL_ERR_FORMAT, what_ + ": " + path + " must be true or false, not " + describe(*it));
        }
        return it->get<bool>();
    }

    const std::string &string_of(const json &value, const std::string &path) const {
        if (!value.is_string()) fail(TL_ERR_FORMAT, what_ + ": " + path + " must be a string, not " + describe(value));
        return value.get_ref<const std::string &>();
    }

    int32_t id_of(const json &value, const std::string &path) const {
        const bool ok = value.is_number_unsigned() && value.get<uint64_t>() < static_cast<uint64_t>(kMaxTokenizerIds);
        if (!ok) {
            fail(TL_ERR_FORMAT, what_ + ": " + path + " = " + describe(value) + " is not a token id in [0, " +
                                    std::to_string(kMaxTokenizerIds) + ")");
        }
        return value.get<int32_t>();
    }

    void unsupported(const std::string &what) const {
        fail(TL_ERR_UNSUPPORTED, what_ + ": " + what + " (this library reads byte-level BPE tokenizer.json files: "
                                                       "GPT-2, Llama 3, Qwen2 style)");
    }

    // The type of a component ("model", "normalizer", ...), which must be a string.
    std::string type_of(const json &object, const std::string &path) const {
        if (!object.is_object()) {
            fail(TL_ERR_FORMAT, what_ + ": " + path + " must be an object, not " + describe(object));
        }
        return string_of(member(object, "type", path + ".type"), path + ".type");
    }

    void read_model(const json &model) {
        if (!model.is_object()) fail(TL_ERR_FORMAT, what_ + ": model must be an object, not " + describe(model));
        // Files written before the tokenizers library added "type" have none; a BPE model is the one with merges.
        const auto type = model.find("type");
        if (type != model.end() && !type->is_null()) {
            const std::string &name = string_of(*type, "model.type");
            if (name != "BPE") unsupported("model.type is '" + name + "'; only 'BPE' is supported");
        } else if (!model.contains("merges")) {
            unsupported("model has no type and no merges (not a BPE model)");
        }
        const auto dropout = model.find("dropout");
        if (dropout != model.end() && !dropout->is_null() && !(dropout->is_number() && dropout->get<double>() == 0)) {
            unsupported("model.dropout is " + describe(*dropout) + " (BPE dropout samples; only null or 0)");
        }
        for (const char *key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
            const auto it = model.find(key);
            if (it != model.end() && !it->is_null() && string_of(*it, std::string("model.") + key) != "") {
                unsupported(std::string("model.") + key + " is " + describe(*it) + " (only null or \"\")");
            }
        }
        if (flag(model, "byte_fallback", false, "model.byte_fallback")) {
            unsupported("model.byte_fallback is true (a BPE converted from SentencePiece; use its tokenizer.model)");
        }
        ignore_merges_ = flag(model, "ignore_merges", false, "model.ignore_merges");

        const json &vocab = member(model, "vocab", "model.vocab");
        if (!vocab.is_object()) fail(TL_ERR_FORMAT, what_ + ": model.vocab must be an object, not " + describe(vocab));
        std::unordered_map<int32_t, const std::string *> by_id;
        vocab_.reserve(vocab.size());
        for (auto it = vocab.begin(); it != vocab.end(); ++it) {
            const std::string path = "model.vocab[" + json(it.key()).dump() + "]";
            const int32_t id = id_of(it.value(), path);
            const auto [other, fresh] = by_id.emplace(id, &it.key());
            if (!fresh) {
                fail(TL_ERR_FORMAT, what_ + ": model.vocab gives id " + std::to_string(id) + " to both " +
                                        json(*other->second).dump() + " and " + json(it.key()).dump());
            }
            vocab_.emplace(it.key(), id);
            n_ids_ = std::max(n_ids_, id + 1);
        }
        const ByteLevelMap &map = byte_level();
        for (int b = 0; b < 256; ++b) {
            const auto it = vocab_.find(map.chars[b]);
            if (it == vocab_.end()) {
                char hex[8];
                std::snprintf(hex, sizeof hex, "0x%02x", b);
                unsupported(std::string("model.vocab has no token for byte ") + hex + " (" + json(map.chars[b]).dump() +
                            "), which a byte-level BPE vocabulary has for every byte");
            }
            byte_id_[b] = it->second;
        }

        const json &merges = member(model, "merges", "model.merges");
        if (!merges.is_array()) fail(TL_ERR_FORMAT, what_ + ": model.merges must be an array, not " + describe(merges));
        merges_.reserve(merges.size());
        for (size_t i = 0; i < merges.size(); ++i) {
            const std::string path = "model.merges[" + std::to_string(i) + "]";
            const json &m = merges[i];
            std::string left, right;
            if (m.is_string()) {  // "a b": exactly one space (the tokenizers library's rule)
                const std::string &text = m.get_ref<const std::string &>();
                const size_t space = text.find(' ');
                if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
                    fail(TL_ERR_FORMAT, what_ + ": " + path + " = " + describe(m) +
                                            " is not two tokens separated by one space");
                }
                left = text.substr(0, space);
                right = text.substr(space + 1);
            } else if (m.is_array() && m.size() == 2) {  // ["a", "b"]
                left = string_of(m[0], path + "[0]");
                right = string_of(m[1], path + "[1]");
            } else {
                fail(TL_ERR_FORMAT, what_ + ": " + path + " = " + describe(m) +
                                        " is neither \"a b\" nor a pair [\"a\", \"b\"]");
            }
            const auto token = [&](const std::string &s) {
                const auto it = vocab_.find(s);
                if (it == vocab_.end()) {
                    fail(TL_ERR_FORMAT, what_ + ": " + path + ": " + json(s).dump() + " is not in model.vocab");
                }
                return it->second;
            };
            const int32_t a = token(left), b = token(right), merged = token(left + right);
            // A repeated pair keeps its first rank.
            merges_.emplace(pair_key(a, b), Merge{static_cast<int32_t>(i), merged});
        }
    }

    void read_added_tokens(const json &root) {
        const auto it = root.find("added_tokens");
        if (it == root.end() || it->is_null()) return;
        if (!it->is_array()) fail(TL_ERR_FORMAT, what_ + ": added_tokens must be an array, not " + describe(*it));
        for (size_t i = 0; i < it->size(); ++i) {
            const std::string path = "added_tokens[" + std::to_string(i) + "]";
            const json &t = (*it)[i];
            if (!t.is_object()) fail(TL_ERR_FORMAT, what_ + ": " + path + " must be an object, not " + describe(t));
            const int32_t id = id_of(member(t, "id", path + ".id"), path + ".id");
            const std::string &content = string_of(member(t, "content", path + ".content"), path + ".content");
            if (content.empty()) fail(TL_ERR_FORMAT, what_ + ": " + path + ".content is empty");
            for (const char *key : {"lstrip", "rstrip", "single_word"}) {
                if (flag(t, key, false, path + "." + key)) {
                    unsupported(path + " (" + json(content).dump() + ") has " + key +
                                " true; added tokens are matched only as they are");
                }
            }
            for (const AddedToken &other : added_) {
                if (other.content == content) {
                    fail(TL_ERR_FORMAT, what_ + ": " + path + " repeats the content " + json(content).dump());
                }
            }
            added_.push_back(AddedToken{content, id});
            n_ids_ = std::max(n_ids_, id + 1);
        }
        // At each position the longest candidate is tried first.
        for (size_t i = 0; i < added_.size(); ++i)
            added_by_byte_[static_cast<unsigned char>(added_[i].content[0])].push_back(i);
        for (auto &list : added_by_byte_) {
            std::stable_sort(list.begin(), list.end(), [&](size_t a, size_t b) {
                return added_[a].content.size() > added_[b].content.size();
            });
        }
    }

    void read_normalizer(const json &root) {
        const auto it = root.find("normalizer");
        if (it == root.end() || it->is_null()) return;
        const auto one = [&](const json &n, const std::string &path) {
            const std::string type = type_of(n, path);
            if (type != "NFC") unsupported(path + ".type is '" + type + "'; only NFC (or none) is supported");
            nfc_ = true;
        };
        if (type_of(*it, "normalizer") == "Sequence") {
            const json &list = member(*it, "normalizers", "normalizer.normalizers");
            if (!list.is_array()) fail(TL_ERR_FORMAT, what_ + ": normalizer.normalizers must be an array");
            for (size_t i = 0; i < list.size(); ++i) one(list[i], "normalizer.normalizers[" + std::to_string(i) + "]");
        } else {
            one(*it, "normalizer");
        }
    }

    void read_step(const json &p, const std::string &path) {
        const std::string type = type_of(p, path);
        if (type == "ByteLevel") {
            Step step;
            step.byte_level = true;
            step.add_prefix_space = flag(p, "add_prefix_space", true, path + ".add_prefix_space");
            if (flag(p, "use_regex", true, path + ".use_regex")) {
                step.split = std::make_unique<Regex>(kGpt2Pattern, false, "GPT-2's pattern");
            }
            steps_.push_back(std::move(step));
        } else if (type == "Split") {
            const std::string behavior = string_of(member(p, "behavior", path + ".behavior"), path + ".behavior");
            if (behavior != "Isolated") unsupported(path + ".behavior is '" + behavior + "'; only 'Isolated'");
            if (flag(p, "invert", false, path + ".invert")) unsupported(path + ".invert is true");
            const json &pattern = member(p, "pattern", path + ".pattern");
            Step step;
            if (pattern.is_object() && pattern.contains("Regex")) {
                step.split = std::make_unique<Regex>(string_of(pattern["Regex"], path + ".pattern.Regex"), false,
                                                     what_ + ": " + path + ".pattern.Regex");
            } else if (pattern.is_object() && pattern.contains("String")) {
                step.split = std::make_unique<Regex>(string_of(pattern["String"], path + ".pattern.String"), true,
                                                     what_ + ": " + path + ".pattern.String");
            } else {
                fail(TL_ERR_FORMAT, what_ + ": " + path + ".pattern must be {\"Regex\": ...} or {\"String\": ...}");
            }
            steps_.push_back(std::move(step));
        } else {
            unsupported(path + ".type is '" + type + "'; only ByteLevel, or Split steps followed by ByteLevel");
        }
    }

    void read_pre_tokenizer(const json &root) {
        const auto it = root.find("pre_tokenizer");
        if (it == root.end() || it->is_null()) unsupported("pre_tokenizer is null (a byte-level BPE needs ByteLevel)");
        if (type_of(*it, "pre_tokenizer") == "Sequence") {
            const json &list = member(*it, "pretokenizers", "pre_tokenizer.pretokenizers");
            if (!list.is_array()) fail(TL_ERR_FORMAT, what_ + ": pre_tokenizer.pretokenizers must be an array");
            for (size_t i = 0; i < list.size(); ++i)
                read_step(list[i], "pre_tokenizer.pretokenizers[" + std::to_string(i) + "]");
        } else {
            read_step(*it, "pre_tokenizer");
        }
        const auto byte_levels =
            std::count_if(steps_.begin(), steps_.end(), [](const Step &s) { return s.byte_level; });
        if (byte_levels != 1 || !steps_.back().byte_level) {
            unsupported("pre_tokenizer must end with exactly one ByteLevel step (it has " +
                        std::to_string(byte_levels) + ")");
        }
    }

    void read_decoder(const json &root) {
        const auto it = root.find("decoder");
        if (it == root.end() || it->is_null()) return;
        const std::string type = type_of(*it, "decoder");
        if (type != "ByteLevel") unsupported("decoder.type is '" + type + "'; only ByteLevel (or none)");
    }

    void build_decode_table() {
        const ByteLevelMap &map = byte_level();
        decoded_.assign(static_cast<size_t>(n_ids_), std::string());
        known_.assign(static_cast<size_t>(n_ids_), false);
        for (const auto &[token, id] : vocab_) {
            std::string &out = decoded_[static_cast<size_t>(id)];
            const auto *s = reinterpret_cast<const unsigned char *>(token.data());
            for (size_t i = 0; i < token.size();) {  // JSON strings are UTF-8
                const size_t len = std::min(utf8_length(s[i]), token.size() - i);
                uint32_t cp = len == 1 ? s[i] : s[i] & (0xFF >> (len + 1));
                for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (s[i + k] & 0x3F);
                if (cp < 0x144 && map.byte_of[cp] >= 0) out.push_back(static_cast<char>(map.byte_of[cp]));
                else out.append(token, i, len);  // not a byte-level character: itself
                i += len;
            }
            known_[static_cast<size_t>(id)] = true;
        }
        for (const AddedToken &t : added_) {
            decoded_[static_cast<size_t>(t.id)] = t.content;
            known_[static_cast<size_t>(t.id)] = true;
        }
    }

    // ---- Encoding ----

    const AddedToken *added_at(std::string_view text, size_t i) const {
        for (const size_t k : added_by_byte_[static_cast<unsigned char>(text[i])]) {
            const std::string &c = added_[k].content;
            if (text.compare(i, c.size(), c) == 0) return &added_[k];
        }
        return nullptr;
    }

    void encode_segment(std::string_view segment, const std::vector<std::unique_ptr<MatchData>> &matches,
                        std::vector<int32_t> &ids) const {
        if (segment.empty()) return;
        std::string normalized;
        if (nfc_) {
            utf8proc_uint8_t *out = nullptr;
            const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t *>(segment.data()),
                                                    static_cast<utf8proc_ssize_t>(segment.size()), &out,
                                                    static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
            if (n < 0) {
                if (n == UTF8PROC_ERROR_NOMEM) throw std::bad_alloc();
                fail(TL_ERR_INVALID_ARGUMENT, std::string("NFC normalization failed: ") + utf8proc_errmsg(n));
            }
            normalized.assign(reinterpret_cast<const char *>(out), static_cast<size_t>(n));
            std::free(out);
            segment = normalized;
        }
        run_steps(0, segment, matches, ids);
    }

    // Pre-tokenizer step `s` on one piece, then the later steps on each piece it makes, then BPE: depth-first, so
    // no more than a few pieces exist at a time, however long the text.
    void run_steps(size_t s, std::string_view piece, const std::vector<std::unique_ptr<MatchData>> &matches,
                   std::vector<int32_t> &ids) const {
        if (piece.empty()) return;
        if (s == steps_.size()) {
            bpe(piece, ids);
            return;
        }
        const Step &step = steps_[s];
        std::string prefixed;
        if (step.add_prefix_space && piece[0] != ' ') {
            prefixed.reserve(piece.size() + 1);
            prefixed.push_back(' ');
            prefixed.append(piece);
            piece = prefixed;
        }
        if (!step.split) {
            run_steps(s + 1, piece, matches, ids);
            return;
        }
        // Each match, and each stretch of text between matches, becomes a piece (the tokenizers library's
        // "Isolated").
        size_t start = 0, at = 0, begin = 0, end = 0;
        while (at <= piece.size() && step.split->find(piece, at, matches[s]->data, &begin, &end)) {
            if (end == begin) {  // an empty match splits nothing: go on after its character
                if (begin >= piece.size()) break;
                at = begin + utf8_length(static_cast<unsigned char>(piece[begin]));
                continue;
            }
            if (begin > start) run_steps(s + 1, piece.substr(start, begin - start), matches, ids);
            run_steps(s + 1, piece.substr(begin, end - begin), matches, ids);
            start = at = end;
        }
        if (start < piece.size()) run_steps(s + 1, piece.substr(start), matches, ids);
    }

    static uint64_t pair_key(int32_t a, int32_t b) {
        return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
    }

    // BPE on one piece's bytes: a linked list of symbols and a queue of mergeable neighbours, lowest rank first and
    // then leftmost, so a piece of n bytes costs O(n log n) (a hostile megabyte-long word included).
    void bpe(std::string_view piece, std::vector<int32_t> &ids) const {
        if (piece.empty()) return;
        const ByteLevelMap &map = byte_level();
        if (ignore_merges_) {
            std::string chars;
            for (const char c : piece) chars += map.chars[static_cast<unsigned char>(c)];
            const auto it = vocab_.find(chars);
            if (it != vocab_.end()) {
                ids.push_back(it->second);
                return;
            }
        }
        const size_t n = piece.size();
        if (n == 1) {
            ids.push_back(byte_id_[static_cast<unsigned char>(piece[0])]);
            return;
        }
        struct Symbol {
            int32_t id;
            int32_t prev, next;  // -1 at the ends
        };
        std::vector<Symbol> symbols(n);
        for (size_t i = 0; i < n; ++i) {
            symbols[i] = Symbol{byte_id_[static_cast<unsigned char>(piece[i])], static_cast<int32_t>(i) - 1,
                                i + 1 < n ? static_cast<int32_t>(i) + 1 : -1};
        }
        struct Candidate {
            int32_t rank, left, left_id, right_id;
            bool operator>(const Candidate &o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
        };
        std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
        const auto offer = [&](int32_t left) {
            if (left < 0) return;
            const int32_t right = symbols[static_cast<size_t>(left)].next;
            if (right < 0) return;
            const int32_t a = symbols[static_cast<size_t>(left)].id, b = symbols[static_cast<size_t>(right)].id;
            const auto it = merges_.find(pair_key(a, b));
            if (it != merges_.end()) queue.push(Candidate{it->second.rank, left, a, b});
        };
        for (size_t i = 0; i + 1 < n; ++i) offer(static_cast<int32_t>(i));
        while (!queue.empty()) {
            const Candidate c = queue.top();
            queue.pop();
            Symbol &left = symbols[static_cast<size_t>(c.left)];
            // A stale candidate: one of its symbols has merged since (a merged symbol's id is a longer token, so
            // equal ids mean the same symbols).
            if (left.id != c.left_id || left.next < 0 || symbols[static_cast<size_t>(left.next)].id != c.right_id) {
                continue;
            }
            Symbol &right = symbols[static_cast<size_t>(left.next)];
            left.id = merges_.at(pair_key(c.left_id, c.right_id)).merged;
            right.id = -1;  // gone
            left.next = right.next;
            if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = c.left;
            offer(left.prev);
            offer(c.left);
        }
        for (int32_t i = 0; i >= 0; i = symbols[static_cast<size_t>(i)].next)
            ids.push_back(symbols[static_cast<size_t>(i)].id);
    }

    struct Merge {
        int32_t rank;
        int32_t merged;
    };

    std::string what_;
    std::unordered_map<std::string, int32_t> vocab_;
    std::unordered_map<uint64_t, Merge> merges_;
    int32_t byte_id_[256] = {};
    bool ignore_merges_ = false;
    bool nfc_ = false;
    std::vector<AddedToken> added_;
    std::vector<size_t> added_by_byte_[256];
    std::vector<Step> steps_;
    int32_t n_ids_ = 0;
    std::vector<std::string> decoded_;  // id -> its bytes
    std::vector<bool> known_;          // id -> a token has it
};

}  // namespace

std::shared_ptr<const Tokenizer> make_bpe_tokenizer(std::string bytes, const std::string &what) {
    return std::make_shared<BpeTokenizer>(std::move(bytes), what);
}

}  // namespace tl::text
