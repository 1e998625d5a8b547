// A SentencePiece tokenizer.model (Llama 2, Mistral), encoded and decoded by Debian's libsentencepiece with the
// model's own normalization (its dummy prefix, byte fallback, ...). No beginning- or end-of-text id is added: the
// processor's encode options are left at their defaults.
//
// Long texts are encoded in pieces: the library holds ~200 bytes per input byte while it encodes one text (an 11 MB
// text took 2 GB), so a text over kChunkBytes is cut at single spaces between two printable ASCII characters, and
// each piece after the first is encoded without its leading space, which the model's dummy prefix stands for. That
// gives the same ids as encoding the whole text for the models that have a dummy prefix and split at whitespace
// (Llama 2's, Mistral's: checked for each model at load with probe texts); other models encode the whole text.

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
        // Cutting "left right" at its space must give encode("left") + encode("right").
        chunkable_ = true;
        for (const char *probe : {"a b", "Hello world", "x. y", "1 2", "foo, bar!", "it's (ok) [yes]", "A-B C/D"}) {
            const std::string text = probe;
            const size_t cut = text.find(' ');
            std::vector<int32_t> whole = encode_whole(text), parts = encode_whole(text.substr(0, cut));
            const std::vector<int32_t> right = encode_whole(text.substr(cut + 1));
            parts.insert(parts.end(), right.begin(), right.end());
            chunkable_ = chunkable_ && whole == parts;
        }
    }

    int32_t n_ids() const override { return n_ids_; }

    std::vector<int32_t> encode(std::string_view text) const override {
        require_utf8(text);  // SentencePiece would replace a bad byte with U+FFFD: refused here instead
        if (!chunkable_ || text.size() <= kChunkBytes) return encode_whole(text);
        std::vector<int32_t> ids;
        size_t start = 0;
        while (text.size() - start > kChunkBytes) {
            size_t cut = start + kChunkBytes;
            while (cut + 1 < text.size() && !(text[cut] == ' ' && printable(text[cut - 1]) && printable(text[cut + 1])))
                ++cut;
            if (cut + 1 >= text.size()) break;  // no place to cut: the rest whole
            const std::vector<int32_t> part = encode_whole(text.substr(start, cut - start));
            ids.insert(ids.end(), part.begin(), part.end());
            start = cut + 1;  // the space is the next piece's dummy prefix
        }
        const std::vector<int32_t> part = encode_whole(text.substr(start));
        ids.insert(ids.end(), part.begin(), part.end());
        return ids;
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
    static constexpr size_t kChunkBytes = size_t{256} << 10;

    static bool printable(char c) { return c > ' ' && c < 0x7F; }

    std::vector<int32_t> encode_whole(std::string_view text) const {
        std::vector<int> ids;
        const auto status = processor_.Encode(text, &ids);
        if (!status.ok()) fail(TL_ERR_INVALID_ARGUMENT, "SentencePiece cannot encode the text: " + status.ToString());
        return std::vector<int32_t>(ids.begin(), ids.end());
    }

    sentencepiece::SentencePieceProcessor processor_;
    int32_t n_ids_ = 0;
    bool chunkable_ = false;  // encode may cut long texts (above)
};

}  // namespace

std::shared_ptr<const Tokenizer> make_sentencepiece_tokenizer(std::string bytes, const std::string &what) {
    return std::make_shared<SentencePieceTokenizer>(std::move(bytes), what);
}

}  // namespace tl::text
