// Scores a text file (byte-level tokens) with a .tinyloop model from C++: a small RAII wrapper over the C API
// that turns statuses into exceptions.
// Usage: score_text_cpp MODEL TEXT
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "tinyloop.h"

namespace {

void check(tl_status status, const char *what) {
    if (status != TL_OK) {
        throw std::runtime_error(std::string(what) + ": " + tl_status_string(status) + ": " + tl_last_error_message());
    }
}

struct ModelDeleter {
    void operator()(tl_model *m) const { tl_model_free(m); }
};
using ModelPtr = std::unique_ptr<tl_model, ModelDeleter>;

ModelPtr load(const std::string &path) {
    tl_model *raw = nullptr;
    check(tl_model_load(path.c_str(), nullptr, &raw), "load");
    return ModelPtr(raw);
}

}  // namespace

int main(int argc, char **argv) {
    if (argc != 3) {
        std::cerr << "usage: " << argv[0] << " MODEL TEXT\n";
        return 2;
    }
    try {
        std::ifstream in(argv[2], std::ios::binary);
        if (!in) throw std::runtime_error(std::string("cannot open ") + argv[2]);
        std::vector<int32_t> tokens;
        for (std::istreambuf_iterator<char> it(in), end; it != end; ++it) tokens.push_back(static_cast<unsigned char>(*it));

        const ModelPtr model = load(argv[1]);
        tl_model_properties info;
        info.struct_size = sizeof info;
        check(tl_model_info(model.get(), &info), "info");

        tl_score_result result;
        check(tl_score_result_init(&result, sizeof result), "result");
        check(tl_score(model.get(), tokens.data(), tokens.size(), nullptr, &result), "score");
        std::cout << "d_model " << info.d_model << ", " << info.n_pre << " pre + 1 looped x " << info.n_loops
                  << ": perplexity " << result.perplexity << " over " << result.tokens_scored << " tokens\n";
    } catch (const std::exception &e) {
        std::cerr << e.what() << '\n';
        return 1;
    }
    return 0;
}
