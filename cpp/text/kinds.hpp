// The tokenizer kinds' factories (text/tokenizer.cpp's parse_tokenizer calls them; nothing else should).
#pragma once

#include <memory>
#include <string>

#include "text/tokenizer.hpp"

namespace tl::text {

// A Hugging Face tokenizer.json with a byte-level BPE model (text/bpe.cpp).
std::shared_ptr<const Tokenizer> make_bpe_tokenizer(std::string bytes, const std::string &what);

// A SentencePiece tokenizer.model (text/sentencepiece.cpp).
std::shared_ptr<const Tokenizer> make_sentencepiece_tokenizer(std::string bytes, const std::string &what);

}  // namespace tl::text
