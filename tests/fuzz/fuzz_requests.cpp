// libFuzzer target: each input is the text score-batch reads, run through the tool's own code (cpp/cli/requests.cpp):
// the bounded line reader with a small line limit, and every line through parse_request, without and with a
// beginning-of-text token for empty contexts (score-batch --bos or the model file's). Any RequestError is acceptable;
// a crash, a leak, an ASan/UBSan report or a stack overflow (deep JSON) is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cli/requests.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    // The whole input as one line, as a line up to the real limit would be parsed.
    try {
        tl::cli::parse_request(std::string(reinterpret_cast<const char *>(data), size));
    } catch (const tl::cli::RequestError &e) {
        volatile size_t n = std::string(e.what()).size();
        (void)n;
    }
    // The input as a stream of lines, with a limit small enough for inputs to cross it.
    std::FILE *file = fmemopen(const_cast<uint8_t *>(data), size, "rb");
    if (file == nullptr) return 0;  // fmemopen refuses an empty buffer on some libcs
    tl::cli::LineReader reader(file, 512);
    std::string line;
    try {
        while (reader.next(line)) {
            if (line.size() > 512) std::abort();
            for (const int64_t bos : {int64_t{-1}, int64_t{10}}) {
                try {
                    tl::cli::parse_request(line, tl::cli::TextEncoder(), bos);
                } catch (const tl::cli::RequestError &) {
                }
            }
        }
    } catch (const tl::cli::RequestError &) {
    }
    std::fclose(file);
    return 0;
}
