// Tokenizers: text to token ids and back. Three kinds: byte-level (one token per byte, ids 0-255: what a model
// without a tokenizer reads), a Hugging Face tokenizer.json holding a byte-level BPE (GPT-2, Llama 3, Qwen2 style;
// text/bpe.cpp) and a SentencePiece tokenizer.model (Llama 2, Mistral; text/sentencepiece.cpp, through Debian's
// libsentencepiece). Tokenizer files are outside input: their size and JSON are bounded, and everything this module
// does not implement is refused by name (docs/format.md, "The tokenizer"). A Tokenizer is immutable once made and
// may be used from any number of threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tl::text {

// The values are the C API's TL_TOKENIZER_* (never renumbered).
enum class TokenizerKind : int32_t { Bytes = 0, HuggingFace = 1, SentencePiece = 2 };

// "bytes", "huggingface", "sentencepiece": the value of a .tinyloop file's `tokenizer` metadata key.
const char *kind_name(TokenizerKind kind);

// The largest tokenizer file read: 64 MiB (Llama 3's tokenizer.json is 9 MB, Qwen2's 7 MB, Llama 2's
// tokenizer.model 0.5 MB).
constexpr uint64_t kMaxTokenizerBytes = uint64_t{64} << 20;
// The largest token id + 1 a tokenizer may have: the .tinyloop vocab limit, 2^22.
constexpr int32_t kMaxTokenizerIds = int32_t{1} << 22;

class Tokenizer {
public:
    virtual ~Tokenizer() = default;

    TokenizerKind kind() const { return kind_; }
    // The file this tokenizer was made from (empty for byte-level): what a .tinyloop file stores.
    const std::string &source() const { return source_; }
    // One more than the largest id encode can return or decode accepts.
    virtual int32_t n_ids() const = 0;

    // The ids of `text`. No beginning- or end-of-text token is added (a tokenizer.json's post_processor and
    // SentencePiece's add_bos are not applied). Byte-level takes any bytes; the others need valid UTF-8 and throw
    // tl::Error(TL_ERR_INVALID_ARGUMENT) naming the first bad byte's offset otherwise.
    virtual std::vector<int32_t> encode(std::string_view text) const = 0;
    // The bytes of `ids` (which need not be valid UTF-8: a token may hold part of a character). Throws
    // tl::Error(TL_ERR_INVALID_ARGUMENT) naming "ids[i]" for an id that is no token of this tokenizer.
    virtual std::string decode(const int32_t *ids, size_t n) const = 0;

protected:
    Tokenizer(TokenizerKind kind, std::string source) : kind_(kind), source_(std::move(source)) {}

private:
    TokenizerKind kind_;
    std::string source_;
};

// One token per byte, ids 0-255 (decode refuses ids outside that range).
std::shared_ptr<const Tokenizer> byte_tokenizer();

// Makes a tokenizer of `kind` (HuggingFace or SentencePiece) from its file's bytes. `what` names the file in
// messages ("'dir/tokenizer.json'"). Throws tl::Error: TL_ERR_FORMAT (malformed: a message naming the field, e.g.
// "model.merges[17]"), TL_ERR_UNSUPPORTED (well-formed, but something this module does not implement, named: a
// WordPiece model, a Metaspace pre-tokenizer, ...).
std::shared_ptr<const Tokenizer> parse_tokenizer(TokenizerKind kind, std::string bytes, const std::string &what);

// The kind of a tokenizer file's bytes: JSON (the first byte other than whitespace is '{' or '[') is a
// tokenizer.json, anything else is taken for a SentencePiece model (a protobuf, whose first byte is neither).
TokenizerKind sniff_kind(std::string_view bytes);

// Reads a tokenizer file and parses it: a name ending in .json is a tokenizer.json, one ending in .model a
// SentencePiece model, any other told apart by sniff_kind.
// TL_ERR_IO when it cannot be read or is not a regular file, TL_ERR_FORMAT when larger than kMaxTokenizerBytes.
std::shared_ptr<const Tokenizer> read_tokenizer_file(const std::string &path);

// The tokenizer of a checkpoint folder: `dir`/tokenizer.json when it exists, else `dir`/tokenizer.model, else null
// (the model is byte-level).
std::shared_ptr<const Tokenizer> find_tokenizer(const std::string &dir);

// The offset of the first byte of `text` that does not belong to a well-formed UTF-8 sequence (overlong forms,
// surrogates and code points above U+10FFFF are ill-formed), or text.size() when there is none.
size_t first_invalid_utf8(std::string_view text);

// Throws tl::Error(TL_ERR_INVALID_ARGUMENT) when `text` is not valid UTF-8, naming the offset and the byte.
void require_utf8(std::string_view text);

}  // namespace tl::text
