// libFuzzer target: the tokenizers (cpp/text). The first byte picks what the rest of the input is:
//   0  a tokenizer.json (parse_tokenizer), then a few texts encoded and decoded with it when it parses;
//   1  a SentencePiece tokenizer.model, the same;
//   2+ a text, encoded by a fixed byte-level BPE (Llama 3's split regex, ignore_merges, added tokens that overlap)
//      and by a fixed NFC one: valid UTF-8 must decode back to itself (NFC: to an encoding that is stable), anything
//      else must be refused with TL_ERR_INVALID_ARGUMENT.
// A tl::Error from parsing is acceptable; a crash, a leak, an ASan/UBSan report, a hang (a regex without a match
// limit), or a broken round trip is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/tokenizer.hpp"
#include "util/error.hpp"

namespace {

using tl::text::Tokenizer;
using tl::text::TokenizerKind;

// GPT-2's byte-to-unicode characters, written out here (not the library's table).
std::string byte_char(int b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    int cp = b;
    if (!printable) {
        int n = 0;
        for (int x = 0; x < b; ++x) {
            const bool p = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF);
            n += !p;
        }
        cp = 256 + n;
    }
    std::string out;
    if (cp < 0x80) {
        out.push_back(static_cast<char>(cp));
    } else {
        out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    return out;
}

std::shared_ptr<const Tokenizer> fixed_tokenizer(bool nfc) {
    nlohmann::json vocab = nlohmann::json::object();
    for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = vocab.size();
    const std::string space = byte_char(' ');
    const std::vector<std::pair<std::string, std::string>> merges = {
        {"t", "h"}, {"th", "e"}, {"h", "e"}, {space, "t"}, {space + "t", "he"}, {"i", "n"}, {"in", "g"}, {"e", "r"},
        {"a", "a"}, {"aa", "aa"}, {space, space}, {"\xc3\x83", "\xc2\xa9"}, {"1", "2"}, {"12", "3"}};
    nlohmann::json merge_list = nlohmann::json::array();
    for (const auto &[a, b] : merges) {
        if (!vocab.contains(a + b)) vocab[a + b] = vocab.size();
        merge_list.push_back({a, b});
    }
    vocab[space + "whole" + space + "word"] = vocab.size();  // only ignore_merges reaches it
    const int32_t next = static_cast<int32_t>(vocab.size());
    nlohmann::json added = nlohmann::json::array();
    for (const char *content : {"<|eot_id|>", "<think>", "<think></think>", " the"})
        added.push_back({{"id", next + static_cast<int32_t>(added.size())}, {"content", content}, {"special", true}});
    const nlohmann::json file = {
        {"added_tokens", added},
        {"normalizer", nfc ? nlohmann::json{{"type", "NFC"}} : nlohmann::json()},
        {"pre_tokenizer",
         {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"},
             {"pattern",
              {{"Regex", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
                         "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
             {"behavior", "Isolated"},
             {"invert", false}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
        {"decoder", {{"type", "ByteLevel"}}},
        {"model", {{"type", "BPE"}, {"ignore_merges", true}, {"vocab", vocab}, {"merges", merge_list}}}};
    return tl::text::parse_tokenizer(TokenizerKind::HuggingFace, file.dump(), "fixed");
}

void exercise(const Tokenizer &tok) {
    for (const char *text : {"", "Hello, world! It's 2026.\n\n  x", "caf\xc3\xa9 \xe4\xb8\xad \xf0\x9f\xa4\x96", "a"}) {
        const std::vector<int32_t> ids = tok.encode(text);
        tok.decode(ids.data(), ids.size());
    }
    const int32_t edge[] = {0, tok.n_ids() - 1};
    try {
        tok.decode(edge, 2);  // an id in range may still be a hole
    } catch (const tl::Error &) {
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const std::string rest(reinterpret_cast<const char *>(data + 1), size - 1);
    if (data[0] <= 1) {
        try {
            exercise(*tl::text::parse_tokenizer(data[0] == 0 ? TokenizerKind::HuggingFace : TokenizerKind::SentencePiece,
                                                rest, "input"));
        } catch (const tl::Error &) {
        }
        return 0;
    }
    static const auto plain = fixed_tokenizer(false), nfc = fixed_tokenizer(true);
    const bool utf8 = tl::text::first_invalid_utf8(rest) == rest.size();
    for (const auto *tok : {plain.get(), nfc.get()}) {
        std::vector<int32_t> ids;
        try {
            ids = tok->encode(rest);
        } catch (const tl::Error &e) {
            if (utf8 || e.code() != TL_ERR_INVALID_ARGUMENT) std::abort();  // only bad UTF-8 is refused
            continue;
        }
        if (!utf8) std::abort();
        for (const int32_t id : ids)
            if (id < 0 || id >= tok->n_ids()) std::abort();
        const std::string back = tok->decode(ids.data(), ids.size());
        if (tok == plain.get() && back != rest) std::abort();            // byte-level BPE loses nothing
        if (tok == nfc.get() && tok->encode(back) != ids) std::abort();  // NFC text is its own normal form
    }
    return 0;
}
