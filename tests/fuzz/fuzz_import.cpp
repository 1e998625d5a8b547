// libFuzzer target: each input is a checkpoint folder for tl_model_import_checkpoint, through the public C API only.
// The input is cut at each separator line (kSeparator) into config.json, quantize_config.json and model.safetensors,
// in that order; a part that is absent is a file that is absent. A model that imports is loaded and freed. Any status
// is acceptable; a crash, a leak or an ASan/UBSan report is a finding.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "fuzz_common.hpp"
#include "tinyloop.h"

namespace {

constexpr const char kSeparator[] = "\n@@file@@\n";
constexpr const char *kParts[] = {"config.json", "quantize_config.json", "model.safetensors"};

std::string g_dir;  // the scratch folder every input is written to

void remove_scratch() {
    for (const char *name : kParts) ::unlink((g_dir + "/" + name).c_str());
    ::unlink((g_dir + "/out.tinyloop").c_str());
    ::rmdir(g_dir.c_str());
}

using fuzz::discard_log;
using fuzz::read_message;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    // /dev/shm when there is one: the importer syncs the file it writes, which on a disk would dominate each run.
    const char *tmp = std::getenv("TMPDIR");
    std::string base = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : (tmp != nullptr && *tmp ? tmp : "/tmp");
    std::string dir = base + "/tl_fuzz_import_XXXXXX";
    if (::mkdtemp(dir.data()) == nullptr) {
        std::perror("tl_fuzz_import: mkdtemp");
        std::abort();
    }
    g_dir = dir;
    std::atexit(remove_scratch);
    tl_set_log_callback(discard_log, nullptr, TL_LOG_DEBUG);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *text = reinterpret_cast<const char *>(data);
    const size_t separator = sizeof kSeparator - 1;
    size_t start = 0;
    for (const char *name : kParts) {
        const std::string path = g_dir + "/" + name;
        if (start > size) {
            ::unlink(path.c_str());
            continue;
        }
        const char *end = static_cast<const char *>(memmem(text + start, size - start, kSeparator, separator));
        const size_t stop = end != nullptr ? static_cast<size_t>(end - text) : size;
        if (!fuzz::write_file(path, text + start, stop - start)) std::abort();  // a full disk is no finding
        start = end != nullptr ? stop + separator : size + 1;
    }
    const std::string out = g_dir + "/out.tinyloop";
    tl_import_options options;
    if (tl_import_options_init(&options, sizeof options) != TL_OK) std::abort();
    options.max_seq = 64;  // the written model's scoring window: irrelevant here, and small
    const tl_status status = tl_model_import_checkpoint(g_dir.c_str(), out.c_str(), &options);
    read_message(status);
    if (status == TL_OK) {
        tl_model *model = nullptr;
        read_message(tl_model_load(out.c_str(), nullptr, &model));
        tl_model_free(model);
        ::unlink(out.c_str());
    }
    return 0;
}
