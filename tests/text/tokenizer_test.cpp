// The tokenizer module (cpp/text) against the files and reference ids make_tokenizer_cases.py writes (CTest runs it
// into the build folder first): every case's ids and decoded text, the refusals (each status and what its message
// names), invalid UTF-8, hostile sizes and shapes of input, and threads sharing one tokenizer.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "../common/tl_error.hpp"
#include "text/tokenizer.hpp"
#include "util/error.hpp"

#ifndef TL_TOKENIZER_CASES_DIR
#error "TL_TOKENIZER_CASES_DIR must name the folder make_tokenizer_cases.py writes to"
#endif

namespace {

using nlohmann::json;
using tl::text::Tokenizer;
using tl::text::TokenizerKind;

const std::string kDir = TL_TOKENIZER_CASES_DIR;

const json &cases() {
    static const json all = [] {
        std::ifstream in(kDir + "/cases.json");
        EXPECT_TRUE(in.good()) << "no " << kDir << "/cases.json: run make_tokenizer_cases.py";
        return json::parse(in);
    }();
    return all;
}

std::shared_ptr<const Tokenizer> load(const std::string &name) {
    return tl::text::read_tokenizer_file(kDir + "/" + cases().at(name).at("file").get<std::string>());
}

// Runs `body`, which must throw tl::Error with `code` and a message containing each of `parts`.
template <class Body>
void expect_error(Body &&body, tl_status code, std::initializer_list<std::string> parts) {
    EXPECT_TRUE(tlt::throws(code, parts, std::forward<Body>(body)));
}

const char *const kAll[] = {"gpt2", "gpt2_prefix", "llama3", "qwen2", "sentencepiece"};
const char *const kBpe[] = {"gpt2", "gpt2_prefix", "llama3", "qwen2"};

TEST(Tokenizer, MatchesTheReferenceIds) {
    for (const char *name : kAll) {
        const auto tok = load(name);
        const json &entry = cases().at(name);
        EXPECT_EQ(tok->kind(), std::string(name) == "sentencepiece" ? TokenizerKind::SentencePiece
                                                                   : TokenizerKind::HuggingFace);
        EXPECT_EQ(tok->n_ids(), entry.at("n_ids").get<int32_t>()) << name;
        for (const json &c : entry.at("cases")) {
            SCOPED_TRACE(std::string(name) + " / " + c.at("name").get<std::string>());
            const std::string text = c.at("text");
            const std::vector<int32_t> expected = c.at("ids");
            const std::vector<int32_t> ids = tok->encode(text);
            EXPECT_EQ(ids, expected);
            EXPECT_EQ(tok->decode(expected.data(), expected.size()), c.at("decoded").get<std::string>());
        }
    }
}

TEST(Tokenizer, SourceIsTheFile) {
    for (const char *name : kAll) {
        std::ifstream in(kDir + "/" + cases().at(name).at("file").get<std::string>(), std::ios::binary);
        std::stringstream bytes;
        bytes << in.rdbuf();
        EXPECT_EQ(load(name)->source(), bytes.str()) << name;
    }
}

TEST(Tokenizer, IdsOnlyTheVocabularyHas) {
    // llama3's vocabulary holds " supercalifragilisticexpialidocious" whole, which no merge reaches: ignore_merges
    // takes it as one token; gpt2 (no ignore_merges) builds the word from its merges.
    const auto llama3 = load("llama3");
    EXPECT_EQ(llama3->encode(" supercalifragilisticexpialidocious").size(), 1u);
    EXPECT_GT(load("gpt2")->encode(" supercalifragilisticexpialidocious").size(), 1u);
    // The longest added token at a position wins: "<think></think>" is one token, "<think>" another.
    const auto ids = llama3->encode("<think></think><think>");
    ASSERT_EQ(ids.size(), 2u);
    EXPECT_NE(ids[0], ids[1]);
}

TEST(Tokenizer, ByteLevel) {
    const auto bytes = tl::text::byte_tokenizer();
    EXPECT_EQ(bytes->kind(), TokenizerKind::Bytes);
    EXPECT_EQ(bytes->n_ids(), 256);
    const std::string text("a\xff\x00z", 4);  // any bytes, valid UTF-8 or not
    const std::vector<int32_t> ids = bytes->encode(text);
    EXPECT_EQ(ids, (std::vector<int32_t>{97, 255, 0, 122}));
    EXPECT_EQ(bytes->decode(ids.data(), ids.size()), text);
    const int32_t bad[] = {1, 256};
    expect_error([&] { bytes->decode(bad, 2); }, TL_ERR_INVALID_ARGUMENT, {"ids[1] = 256"});
}

TEST(Tokenizer, InvalidUtf8IsRefused) {
    const std::pair<std::string, size_t> texts[] = {
        {"abc\xff", 3},          {"\xc0\xaf", 0},          {"ok \xed\xa0\x80", 3},  // overlong, a surrogate
        {"\xf4\x90\x80\x80", 0}, {"12\xe6\x97", 2},        {"\x80", 0},             // above U+10FFFF, cut, lone
    };
    for (const char *name : kAll) {
        const auto tok = load(name);
        for (const auto &[text, offset] : texts) {
            SCOPED_TRACE(std::string(name) + ": byte " + std::to_string(offset));
            EXPECT_EQ(tl::text::first_invalid_utf8(text), offset);
            expect_error([&] { tok->encode(text); }, TL_ERR_INVALID_ARGUMENT,
                         {"not valid UTF-8", "byte " + std::to_string(offset)});
        }
    }
    EXPECT_EQ(tl::text::first_invalid_utf8("\xf0\x9f\xa4\x96 \xe4\xb8\xad \xc3\xa9"), 11u);  // 🤖 中 é: all valid
}

TEST(Tokenizer, DecodeRefusesUnknownIds) {
    for (const char *name : kAll) {
        const auto tok = load(name);
        const int32_t ids[] = {3, tok->n_ids()};
        expect_error([&] { tok->decode(ids, 2); }, TL_ERR_INVALID_ARGUMENT,
                     {"ids[1] = " + std::to_string(tok->n_ids()), "no token"});
        const int32_t negative[] = {-1};
        expect_error([&] { tok->decode(negative, 1); }, TL_ERR_INVALID_ARGUMENT, {"ids[0] = -1"});
        EXPECT_EQ(tok->decode(nullptr, 0), "");
    }
}

TEST(Tokenizer, UnsupportedAndMalformedFilesAreRefusedByName) {
    struct Bad {
        const char *file;
        tl_status code;
        std::vector<std::string> parts;
    };
    const Bad bad[] = {
        {"wordpiece", TL_ERR_UNSUPPORTED, {"model.type is 'WordPiece'"}},
        {"unigram", TL_ERR_UNSUPPORTED, {"model.type is 'Unigram'"}},
        {"metaspace", TL_ERR_UNSUPPORTED, {"pre_tokenizer.type is 'Metaspace'"}},
        {"nfkc", TL_ERR_UNSUPPORTED, {"normalizer.type is 'NFKC'"}},
        {"lowercase_sequence", TL_ERR_UNSUPPORTED, {"normalizer.normalizers[1].type is 'Lowercase'"}},
        {"byte_fallback", TL_ERR_UNSUPPORTED, {"model.byte_fallback is true"}},
        {"dropout", TL_ERR_UNSUPPORTED, {"model.dropout is 0.1"}},
        {"split_removed", TL_ERR_UNSUPPORTED, {"pre_tokenizer.pretokenizers[0].behavior is 'Removed'"}},
        {"no_byte_level", TL_ERR_UNSUPPORTED, {"exactly one ByteLevel"}},
        {"bad_regex", TL_ERR_UNSUPPORTED, {"pre_tokenizer.pretokenizers[0].pattern.Regex", "does not compile"}},
        {"rstrip", TL_ERR_UNSUPPORTED, {"added_tokens[0]", "rstrip true"}},
        {"wordpiece_decoder", TL_ERR_UNSUPPORTED, {"decoder.type is 'WordPiece'"}},
        {"merge_not_in_vocab", TL_ERR_FORMAT, {"model.merges[", "\"QZ\" is not in model.vocab"}},
        {"merge_three_parts", TL_ERR_FORMAT, {"\"a b c\" is not two tokens separated by one space"}},
        {"merge_number", TL_ERR_FORMAT, {"= 7 is neither"}},
        {"missing_byte", TL_ERR_UNSUPPORTED, {"no token for byte 0x41"}},
        {"duplicate_id", TL_ERR_FORMAT, {"gives id 5 to both"}},
        {"negative_id", TL_ERR_FORMAT, {"model.vocab[\"negative\"] = -1 is not a token id"}},
        {"huge_id", TL_ERR_FORMAT, {"model.vocab[\"huge\"] = 4194304 is not a token id"}},
        {"no_merges", TL_ERR_FORMAT, {"model.merges is missing"}},
        {"added_empty", TL_ERR_FORMAT, {"added_tokens[0].content is empty"}},
        {"not_an_object", TL_ERR_FORMAT, {"expected a JSON object"}},
        {"truncated", TL_ERR_FORMAT, {"is not valid JSON"}},
        {"deep", TL_ERR_FORMAT, {"deeper than"}},
    };
    for (const Bad &b : bad) {
        SCOPED_TRACE(b.file);
        const std::string path = kDir + "/bad/" + b.file + ".json";
        const tlt::ErrorOf e = tlt::error_of([&] { tl::text::read_tokenizer_file(path); });
        EXPECT_EQ(e.code, b.code) << e.message;
        EXPECT_EQ(e.message.rfind("'" + path + "'", 0), 0u) << "the message names the file: " << e.message;
        for (const std::string &part : b.parts) EXPECT_NE(e.message.find(part), std::string::npos) << e.message;
    }
}

TEST(Tokenizer, FilesAndFolders) {
    EXPECT_EQ(tl::text::sniff_kind("  \n{\"model\": 1}"), TokenizerKind::HuggingFace);
    EXPECT_EQ(tl::text::sniff_kind("\x0a\x05hello"), TokenizerKind::SentencePiece);
    EXPECT_EQ(tl::text::find_tokenizer(kDir + "/ckpt_none"), nullptr);
    EXPECT_EQ(tl::text::find_tokenizer(kDir + "/ckpt_sentencepiece")->kind(), TokenizerKind::SentencePiece);
    // Both files: tokenizer.json is the one read.
    EXPECT_EQ(tl::text::find_tokenizer(kDir + "/ckpt_both")->kind(), TokenizerKind::HuggingFace);
    expect_error([] { tl::text::find_tokenizer(kDir + "/ckpt_wordpiece"); }, TL_ERR_UNSUPPORTED,
                 {"ckpt_wordpiece/tokenizer.json", "WordPiece"});
    expect_error([] { tl::text::read_tokenizer_file(kDir + "/no-such-file.json"); }, TL_ERR_IO,
                 {"cannot open tokenizer file", "no-such-file.json"});
    expect_error([] { tl::text::read_tokenizer_file(kDir); }, TL_ERR_IO, {"is not a regular file"});
    expect_error([] { tl::text::read_tokenizer_file("/dev/zero"); }, TL_ERR_IO, {"is not a regular file"});
    // Garbage taken for a SentencePiece model (no '{').
    expect_error([] { tl::text::parse_tokenizer(TokenizerKind::SentencePiece, "\xff\xfegarbage", "'x.model'"); },
                 TL_ERR_FORMAT, {"'x.model': not a SentencePiece model"});
    expect_error([] { tl::text::parse_tokenizer(TokenizerKind::SentencePiece, "", "'empty.model'"); }, TL_ERR_FORMAT,
                 {"'empty.model'"});
    // Over the size limit, whatever the content.
    expect_error(
        [] {
            tl::text::parse_tokenizer(TokenizerKind::HuggingFace, std::string(tl::text::kMaxTokenizerBytes + 1, ' '),
                                      "'big.json'");
        },
        TL_ERR_FORMAT, {"'big.json'", "64 MiB"});
}

// Hostile text: a few megabytes of one letter (one pre-token: BPE must not be quadratic), of spaces, of digits, of
// one added token's prefix, and of alternating classes; each tokenizer encodes each within a few seconds and decodes
// it back.
TEST(Tokenizer, LongInputsStayFast) {
    const size_t n = size_t{2} << 20;
    std::string alternating;
    for (size_t i = 0; alternating.size() < n; ++i) alternating += i % 2 ? "a " : "1\n";
    std::string prefixes;
    while (prefixes.size() < n) prefixes += "<|endoftext";
    const std::string texts[] = {std::string(n, 'a'), std::string(n, ' '), std::string(n, '7'), alternating, prefixes};
    for (const char *name : kAll) {
        const auto tok = load(name);
        for (const std::string &text : texts) {
            const auto start = std::chrono::steady_clock::now();
            const std::vector<int32_t> ids = tok->encode(text);
            const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            EXPECT_LT(seconds, 20.0) << name << ": " << text.substr(0, 12);
            EXPECT_FALSE(ids.empty());
            if (std::string(name) == "gpt2_prefix" || std::string(name) == "sentencepiece") continue;  // spaces added
            EXPECT_EQ(tok->decode(ids.data(), ids.size()), text) << name;
        }
    }
}

// SentencePiece encodes a text over 256 KiB in pieces cut at spaces; the ids are those of the whole text (the
// generator's, from the Python binding encoding it whole).
TEST(Tokenizer, SentencePieceLongTextsInPieces) {
    std::ifstream text_file(kDir + "/cli/long.txt", std::ios::binary), ids_file(kDir + "/cli/sentencepiece_long.ids");
    std::stringstream text;
    text << text_file.rdbuf();
    ASSERT_GT(text.str().size(), size_t{600} << 10);
    std::vector<int32_t> expected;
    for (int32_t id; ids_file >> id;) expected.push_back(id);
    const std::vector<int32_t> ids = load("sentencepiece")->encode(text.str());
    ASSERT_EQ(ids.size(), expected.size());
    EXPECT_EQ(ids, expected);
}

TEST(Tokenizer, ThreadsShareOneTokenizer) {
    for (const char *name : kAll) {
        const auto tok = load(name);
        std::vector<std::string> texts;
        std::vector<std::vector<int32_t>> expected;
        for (const json &c : cases().at(name).at("cases")) {
            texts.push_back(c.at("text"));
            expected.push_back(c.at("ids"));
        }
        std::vector<std::thread> threads;
        std::vector<int> failures(4, 0);
        for (int t = 0; t < 4; ++t) {
            threads.emplace_back([&, t] {
                for (int round = 0; round < 20; ++round)
                    for (size_t i = 0; i < texts.size(); ++i)
                        failures[static_cast<size_t>(t)] += tok->encode(texts[i]) != expected[i];
            });
        }
        for (std::thread &thread : threads) thread.join();
        for (int t = 0; t < 4; ++t) EXPECT_EQ(failures[static_cast<size_t>(t)], 0) << name << " thread " << t;
    }
}

}  // namespace
