// The C API's text functions: tl_model_tokenizer, tl_tokenize, tl_detokenize (the model's tokenizer, cpp/text), each
// behind the C API's exception barrier (barrier.hpp).

#include "tinyloop.h"

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "barrier.hpp"
#include "handles.hpp"
#include "text/tokenizer.hpp"
#include "util/error.hpp"

using tl::capi::require;

namespace {

// The model's tokenizer; byte-level when the file stores none.
const tl::text::Tokenizer &tokenizer_of(const tl_model *model) {
    require(model != nullptr, "model is NULL");
    const auto &stored = model->model->tokenizer;
    return stored ? *stored : *tl::text::byte_tokenizer();
}

}  // namespace

extern "C" {

TL_API tl_status tl_model_tokenizer(const tl_model *model, int32_t *out_kind, int32_t *out_n_ids) {
    return tl::capi::guarded([&] {
        const tl::text::Tokenizer &tokenizer = tokenizer_of(model);
        require(out_kind != nullptr, "out_kind is NULL");
        *out_kind = static_cast<int32_t>(tokenizer.kind());
        if (out_n_ids != nullptr) *out_n_ids = tokenizer.n_ids();
    });
}

TL_API tl_status tl_tokenize(const tl_model *model, const char *text, size_t len, int32_t *out_ids, size_t cap,
                             size_t *out_n) {
    return tl::capi::guarded([&] {
        const tl::text::Tokenizer &tokenizer = tokenizer_of(model);
        require(text != nullptr || len == 0, "text is NULL (with len > 0)");
        require(out_ids != nullptr || cap == 0, "out_ids is NULL (with cap > 0)");
        require(out_n != nullptr, "out_n is NULL");
        const std::vector<int32_t> ids = tokenizer.encode(std::string_view(len > 0 ? text : "", len));
        if (ids.size() > cap) {
            *out_n = ids.size();
            tl::fail(TL_ERR_BUFFER_TOO_SMALL, "out_ids holds " + std::to_string(cap) + " ids; the text is " +
                                                  std::to_string(ids.size()) + " tokens");
        }
        std::copy(ids.begin(), ids.end(), out_ids);
        *out_n = ids.size();
    });
}

TL_API tl_status tl_detokenize(const tl_model *model, const int32_t *ids, size_t n_ids, char *out_text, size_t cap,
                               size_t *out_len) {
    return tl::capi::guarded([&] {
        const tl::text::Tokenizer &tokenizer = tokenizer_of(model);
        require(ids != nullptr || n_ids == 0, "ids is NULL (with n_ids > 0)");
        require(out_text != nullptr || cap == 0, "out_text is NULL (with cap > 0)");
        require(out_len != nullptr, "out_len is NULL");
        const std::string text = tokenizer.decode(ids, n_ids);
        if (text.size() > cap) {
            *out_len = text.size();
            tl::fail(TL_ERR_BUFFER_TOO_SMALL, "out_text holds " + std::to_string(cap) + " bytes; the text is " +
                                                  std::to_string(text.size()));
        }
        std::copy(text.begin(), text.end(), out_text);
        *out_len = text.size();
    });
}

}  // extern "C"
