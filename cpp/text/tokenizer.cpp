#include "text/tokenizer.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <system_error>

#include "text/kinds.hpp"
#include "util/error.hpp"

namespace tl::text {

namespace {

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

std::string quoted(const std::string &s) { return "'" + s + "'"; }

class ByteTokenizer final : public Tokenizer {
public:
    ByteTokenizer() : Tokenizer(TokenizerKind::Bytes, std::string()) {}

    int32_t n_ids() const override { return 256; }

    std::vector<int32_t> encode(std::string_view text) const override {
        std::vector<int32_t> ids(text.size());
        for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
        return ids;
    }

    std::string decode(const int32_t *ids, size_t n) const override {
        std::string out(n, '\0');
        for (size_t i = 0; i < n; ++i) {
            if (ids[i] < 0 || ids[i] > 255) {
                fail(TL_ERR_INVALID_ARGUMENT, "ids[" + std::to_string(i) + "] = " + std::to_string(ids[i]) +
                                                  " is not a byte-level token (0-255)");
            }
            out[i] = static_cast<char>(ids[i]);
        }
        return out;
    }
};

// True for a regular file, false when nothing is there; anything else is an error.
bool regular_file_exists(const std::string &path) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
        if (errno == ENOENT) return false;
        fail(TL_ERR_IO, "cannot stat " + quoted(path) + ": " + errno_text(errno));
    }
    if (!S_ISREG(st.st_mode)) fail(TL_ERR_IO, quoted(path) + " is not a regular file");
    return true;
}

std::string read_bounded(const std::string &path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // O_NONBLOCK: a FIFO is not waited on
    if (fd < 0) fail(TL_ERR_IO, "cannot open tokenizer file " + quoted(path) + ": " + errno_text(errno));
    const struct Closer {
        int fd;
        ~Closer() { ::close(fd); }
    } closer{fd};
    struct stat st;
    if (::fstat(fd, &st) != 0) fail(TL_ERR_IO, "cannot stat " + quoted(path) + ": " + errno_text(errno));
    if (!S_ISREG(st.st_mode)) fail(TL_ERR_IO, "tokenizer file " + quoted(path) + " is not a regular file");
    const auto too_large = [&] {
        fail(TL_ERR_FORMAT, quoted(path) + ": larger than the " + std::to_string(kMaxTokenizerBytes >> 20) +
                                " MiB a tokenizer file may have");
    };
    if (static_cast<uint64_t>(st.st_size) > kMaxTokenizerBytes) too_large();
    std::string bytes;
    char chunk[65536];
    for (;;) {
        const ssize_t got = ::read(fd, chunk, sizeof chunk);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) fail(TL_ERR_IO, "cannot read " + quoted(path) + ": " + errno_text(errno));
        if (got == 0) break;
        bytes.append(chunk, static_cast<size_t>(got));
        if (bytes.size() > kMaxTokenizerBytes) too_large();  // a file that grew after fstat
    }
    return bytes;
}

}  // namespace

const char *kind_name(TokenizerKind kind) {
    switch (kind) {
    case TokenizerKind::Bytes: return "bytes";
    case TokenizerKind::HuggingFace: return "huggingface";
    case TokenizerKind::SentencePiece: return "sentencepiece";
    }
    return "unknown";
}

std::shared_ptr<const Tokenizer> byte_tokenizer() {
    static const std::shared_ptr<const Tokenizer> bytes = std::make_shared<ByteTokenizer>();
    return bytes;
}

std::shared_ptr<const Tokenizer> parse_tokenizer(TokenizerKind kind, std::string bytes, const std::string &what) {
    if (bytes.size() > kMaxTokenizerBytes) {
        fail(TL_ERR_FORMAT, what + ": " + std::to_string(bytes.size()) + " bytes, larger than the " +
                                std::to_string(kMaxTokenizerBytes >> 20) + " MiB a tokenizer file may have");
    }
    switch (kind) {
    case TokenizerKind::HuggingFace: return make_bpe_tokenizer(std::move(bytes), what);
    case TokenizerKind::SentencePiece: return make_sentencepiece_tokenizer(std::move(bytes), what);
    case TokenizerKind::Bytes: break;
    }
    fail(TL_ERR_INVALID_ARGUMENT, what + ": a byte-level tokenizer has no file");
}

TokenizerKind sniff_kind(std::string_view bytes) {
    for (const char c : bytes) {
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
        return c == '{' || c == '[' ? TokenizerKind::HuggingFace : TokenizerKind::SentencePiece;
    }
    return TokenizerKind::SentencePiece;
}

std::shared_ptr<const Tokenizer> read_tokenizer_file(const std::string &path) {
    std::string bytes = read_bounded(path);
    const auto ends_with = [&](const std::string &suffix) {
        return path.size() >= suffix.size() && path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    const TokenizerKind kind = ends_with(".json")    ? TokenizerKind::HuggingFace
                               : ends_with(".model") ? TokenizerKind::SentencePiece
                                                     : sniff_kind(bytes);
    return parse_tokenizer(kind, std::move(bytes), quoted(path));
}

std::shared_ptr<const Tokenizer> find_tokenizer(const std::string &dir) {
    const std::string base = dir.empty() || dir.back() == '/' ? dir : dir + "/";
    for (const auto &[name, kind] : {std::pair{"tokenizer.json", TokenizerKind::HuggingFace},
                                     std::pair{"tokenizer.model", TokenizerKind::SentencePiece}}) {
        const std::string path = base + name;
        if (regular_file_exists(path)) return parse_tokenizer(kind, read_bounded(path), quoted(path));
    }
    return nullptr;
}

size_t first_invalid_utf8(std::string_view text) {
    const auto *s = reinterpret_cast<const unsigned char *>(text.data());
    const size_t n = text.size();
    size_t i = 0;
    while (i < n) {
        const unsigned char c = s[i];
        if (c < 0x80) {
            ++i;
            continue;
        }
        size_t len;
        unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte (Unicode's table 3-7)
        if (c >= 0xC2 && c <= 0xDF) {
            len = 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0) lo = 0xA0;  // no overlong forms
            if (c == 0xED) hi = 0x9F;  // no surrogates
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0) lo = 0x90;  // no overlong forms
            if (c == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
        } else {
            return i;
        }
        if (i + 1 >= n || s[i + 1] < lo || s[i + 1] > hi) return i;
        for (size_t k = 2; k < len; ++k)
            if (i + k >= n || (s[i + k] & 0xC0) != 0x80) return i;
        i += len;
    }
    return n;
}

void require_utf8(std::string_view text) {
    const size_t bad = first_invalid_utf8(text);
    if (bad == text.size()) return;
    char byte[8];
    std::snprintf(byte, sizeof byte, "0x%02x", static_cast<unsigned>(static_cast<unsigned char>(text[bad])));
    fail(TL_ERR_INVALID_ARGUMENT, "the text is not valid UTF-8: byte " + std::to_string(bad) + " (" + byte +
                                      ") does not begin a well-formed sequence");
}

}  // namespace tl::text
