// A tokenizer stored in a .tinyloop file (docs/format.md, "The tokenizer"): save_model writes it, load_model reads it
// back (kind, bytes, ids), quantize-style load + save keeps it, a file without one stays byte-level, and the loader
// refuses every inconsistent file with a message naming the tensor or metadata key. The tokenizer files come from
// make_tokenizer_cases.py (CTest fixture).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "../common/tl_error.hpp"
#include "format/format.hpp"
#include "import/synthetic.hpp"
#include "text/tokenizer.hpp"
#include "util/error.hpp"

#ifndef TL_TOKENIZER_CASES_DIR
#error "TL_TOKENIZER_CASES_DIR must name the folder make_tokenizer_cases.py writes to"
#endif

namespace {

namespace fs = std::filesystem;
using tl::text::TokenizerKind;

const std::string kDir = TL_TOKENIZER_CASES_DIR;

std::string scratch(const std::string &name) {
    const fs::path dir = fs::temp_directory_path() / ("tl_text_storage_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    return (dir / name).string();
}

// A small synthetic model with room for the test tokenizers' ids (vocab 600).
std::unique_ptr<tl::Model> small_model() {
    tl::ModelConfig c;
    c.d_model = 32, c.n_heads = 2, c.head_dim = 16, c.ffn = 64, c.vocab = 600;
    c.pre = 0, c.loops = 2, c.max_seq = 64, c.group_size = 32;
    return tl::make_synthetic_model(c, tl::SyntheticOptions{});
}

TEST(Storage, TokenizersRoundTrip) {
    for (const char *file : {"gpt2/tokenizer.json", "llama3/tokenizer.json", "sentencepiece/tokenizer.model"}) {
        SCOPED_TRACE(file);
        auto model = small_model();
        const auto tokenizer = tl::text::read_tokenizer_file(kDir + "/" + file);
        tl::set_tokenizer(*model, tokenizer);
        const std::string path = scratch("roundtrip.tinyloop");
        tl::save_model(path, *model);

        const auto loaded = tl::load_model(path, tl::LoadOptions{});
        ASSERT_NE(loaded->tokenizer, nullptr);
        EXPECT_EQ(loaded->tokenizer->kind(), tokenizer->kind());
        EXPECT_EQ(loaded->tokenizer->source(), tokenizer->source());
        EXPECT_EQ(loaded->tokenizer->encode("Hello, wörld! 中文 <|endoftext|>"),
                  tokenizer->encode("Hello, wörld! 中文 <|endoftext|>"));
        const tl::SafetensorsFile raw = tl::read_safetensors(path);
        EXPECT_EQ(raw.metadata.at("tokenizer"), tl::text::kind_name(tokenizer->kind()));
        EXPECT_EQ(raw.tensors.count(tokenizer->kind() == TokenizerKind::HuggingFace ? "tokenizer.json"
                                                                                    : "tokenizer.model"),
                  1u);

        // Load and save again (what tinyloop quantize does): the tokenizer stays.
        const std::string again = scratch("again.tinyloop");
        tl::save_model(again, *loaded);
        EXPECT_EQ(tl::load_model(again, tl::LoadOptions{})->tokenizer->source(), tokenizer->source());
    }
}

TEST(Storage, WithoutATokenizerAModelIsByteLevel) {
    auto model = small_model();
    const std::string path = scratch("bytes.tinyloop");
    tl::save_model(path, *model);
    EXPECT_EQ(tl::load_model(path, tl::LoadOptions{})->tokenizer, nullptr);
    EXPECT_EQ(tl::read_safetensors(path).metadata.count("tokenizer"), 0u);
    // The byte-level tokenizer is "none".
    tl::set_tokenizer(*model, tl::text::byte_tokenizer());
    EXPECT_EQ(model->tokenizer, nullptr);
    // The committed fixture, from before tokenizers, loads as it did.
    EXPECT_EQ(tl::load_model(std::string(TL_FIXTURE), tl::LoadOptions{})->tokenizer, nullptr);
}

TEST(Storage, IdsMustFitTheVocabulary) {
    auto model = small_model();
    model->config.vocab = 300;  // the gpt2 tokenizer has 557 ids
    EXPECT_TRUE(tlt::throws(TL_ERR_FORMAT,
                            {"the tokenizer (tokenizer.json) has token ids up to 556, outside the model's vocabulary "
                             "[0, 300)"},
                            [&] {
                                tl::set_tokenizer(*model,
                                                  tl::text::read_tokenizer_file(kDir + "/gpt2/tokenizer.json"));
                            }));
}

// Rewrites a valid model file with `edit` applied to its metadata and tensors, then expects the loader to refuse it
// with TL_ERR_FORMAT (or `code`) and a message containing `part`.
void expect_refused(const std::string &name,
                    const std::function<void(std::map<std::string, std::string> &, std::vector<tl::TensorView> &,
                                             std::vector<std::string> &)> &edit,
                    const std::string &part, tl_status code = TL_ERR_FORMAT) {
    SCOPED_TRACE(name);
    auto model = small_model();
    tl::set_tokenizer(*model, tl::text::read_tokenizer_file(kDir + "/gpt2/tokenizer.json"));
    const std::string good = scratch(name + ".good.tinyloop"), bad = scratch(name + ".tinyloop");
    tl::save_model(good, *model);
    const tl::SafetensorsFile file = tl::read_safetensors(good);
    std::map<std::string, std::string> metadata = file.metadata;
    std::vector<tl::TensorView> tensors;
    for (const auto &[tensor_name, t] : file.tensors) tensors.push_back({tensor_name, t.dtype, t.shape, t.data});
    std::vector<std::string> keep;  // bytes the edit adds, alive until written
    keep.reserve(4);
    edit(metadata, tensors, keep);
    tl::write_safetensors(bad, metadata, tensors);
    EXPECT_TRUE(tlt::throws(code, {part}, [&] { tl::load_model(bad, tl::LoadOptions{}); }));
}

void drop(std::vector<tl::TensorView> &tensors, const std::string &name) {
    const auto named = [&](const tl::TensorView &t) { return t.name == name; };
    tensors.erase(std::remove_if(tensors.begin(), tensors.end(), named), tensors.end());
}

TEST(Storage, InconsistentFilesAreRefused) {
    using Meta = std::map<std::string, std::string>;
    using Tensors = std::vector<tl::TensorView>;
    using Keep = std::vector<std::string>;
    expect_refused("no_key", [](Meta &m, Tensors &, Keep &) { m.erase("tokenizer"); },
                   "tensor 'tokenizer.json' but no __metadata__ 'tokenizer' naming its kind");
    expect_refused("no_tensor", [](Meta &, Tensors &t, Keep &) { drop(t, "tokenizer.json"); },
                   "__metadata__ 'tokenizer' is 'huggingface' but tensor 'tokenizer.json' is missing");
    expect_refused("unknown_kind", [](Meta &m, Tensors &, Keep &) { m["tokenizer"] = "wordpiece"; },
                   "__metadata__ 'tokenizer' is 'wordpiece', expected 'huggingface' or 'sentencepiece'");
    expect_refused("wrong_kind", [](Meta &m, Tensors &, Keep &) { m["tokenizer"] = "sentencepiece"; },
                   "tensor 'tokenizer.json' with __metadata__ 'tokenizer' = 'sentencepiece'");
    expect_refused("wrong_dtype",
                   [](Meta &, Tensors &t, Keep &) {
                       for (tl::TensorView &v : t) {
                           if (v.name == "tokenizer.json") v.shape = {v.shape[0] / 2}, v.dtype = tl::DType::F16;
                       }
                   },
                   "tensor 'tokenizer.json': F16");
    expect_refused("garbage",
                   [](Meta &, Tensors &t, Keep &keep) {
                       keep.push_back("{\"model\": {\"type\": \"WordPiece\"}}");
                       for (tl::TensorView &v : t) {
                           if (v.name != "tokenizer.json") continue;
                           v.shape = {static_cast<int64_t>(keep.back().size())};
                           v.data = keep.back().data();
                       }
                   },
                   "tensor 'tokenizer.json': model.type is 'WordPiece'", TL_ERR_UNSUPPORTED);
    expect_refused("unexpected",
                   [](Meta &, Tensors &t, Keep &keep) {
                       keep.push_back("x");
                       t.push_back({"tokenizer.vocab", tl::DType::U8, {1}, keep.back().data()});
                   },
                   "unexpected tensor 'tokenizer.vocab'");
}

}  // namespace
