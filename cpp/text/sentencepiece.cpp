// A SentencePiece tokenizer.model (Llama 2, Mistral), encoded and decoded by Debian's libsentencepiece with the
// model's own normalization (its dummy prefix, byte fallback, ...). No beginning- or end-of-text id is added: the
// processor's encode options are left at their defaults.

#include <string>
#include <vector>

#include <sentencepiece_processor.h>

#include "text/kinds.hpp"
#include "text/tokenizer.hpp"
#include "util/error.hpp"

namespace tl::text {

namespace {

class SentencePieceTokenizer final : public Tokenizer {
public:
    SentencePieceTokenizer(std::string bytes, const std::string &what)
        : Tokenizer(TokenizerKind::SentencePiece, std::move(bytes)) {
        const auto status = processor_.LoadFromSerializedProto(source());
        if (!status.ok()) {
            fail(TL_ERR_FORMAT, what + ": not a SentencePiece model (" + status.ToString() + ")");
        }
        const int pieces = processor_.GetPieceSize();
        if (pieces < 1 || pieces > kMaxTokenizerIds) {
            fail(TL_ERR_FORMAT, what + ": " + std::to_string(pieces) + " pieces; a tokenizer has 1 to " +
                                    std::to_string(kMaxTokenizerIds));
        }
        n_ids_ = pieces;
    }

    int32_t n_ids() const override { return n_ids_; }

    std::vector<int32_t> encode(std::string_view text) const override {
        require_utf8(text);  // SentencePiece would replace a bad byte with U+FFFD: refused here instead
        std::vector<int> ids;
        const auto status = processor_.Encode(text, &ids);
        if (!status.ok()) fail(TL_ERR_INVALID_ARGUMENT, "SentencePiece cannot encode the text: " + status.ToString());
        return std::vector<int32_t>(ids.begin(), ids.end());
    }

    std::string decode(const int32_t *ids, size_t n) const override {
        std::vector<int> pieces(n);
        for (size_t i = 0; i < n; ++i) {
            if (ids[i] < 0 || ids[i] >= n_ids_) {
                fail(TL_ERR_INVALID_ARGUMENT, "ids[" + std::to_string(i) + "] = " + std::to_string(ids[i]) +
                                                  " is no token of this tokenizer (ids 0 to " +
                                                  std::to_string(n_ids_ - 1) + ")");
            }
            pieces[i] = ids[i];
        }
        std::string text;
        const auto status = processor_.Decode(pieces, &text);
        if (!status.ok()) fail(TL_ERR_INVALID_ARGUMENT, "SentencePiece cannot decode the ids: " + status.ToString());
        return text;
    }

private:
    sentencepiece::SentencePieceProcessor processor_;
    int32_t n_ids_ = 0;
};

}  // namespace

std::shared_ptr<const Tokenizer> make_sentencepiece_tokenizer(std::string bytes, const std::string &what) {
    return std::make_shared<SentencePieceTokenizer>(std::move(bytes), what);
}

}  // namespace tl::text
