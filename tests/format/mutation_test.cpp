// Bounded random mutation: 300 damaged copies of a valid file (byte flips in the header and the data, digit
// changes that keep the JSON valid but move offsets and shapes, truncations). Each load must end in a status or
// a model whose every view lies inside the file; never a crash or an out-of-bounds read (the sanitizer CI step
// runs this under ASan/UBSan). The seed is printed so that a failure can be replayed with TL_FORMAT_SEED.
#include <gtest/gtest.h>

#include <cstdlib>

#include "util/error.hpp"
#include "format_test_util.hpp"
#include "tinyloop.h"

namespace {

constexpr int kCopies = 300;

uint64_t seed_from_env() {
    const char *text = std::getenv("TL_FORMAT_SEED");
    return text ? std::strtoull(text, nullptr, 10) : std::random_device{}();
}

// Reads every byte a loaded model's views claim, so that a view past the end of the buffer shows under ASan.
uint64_t touch_every_view(const tl::Model &model) {
    uint64_t sum = 0;
    auto touch = [&sum](const void *p, size_t bytes) {
        for (size_t i = 0; i < bytes; ++i) sum += static_cast<const uint8_t *>(p)[i];
    };
    const size_t d = size_t(model.config.d_model), v = size_t(model.config.vocab);
    touch(model.embed, v * d * tl::dtype_size(model.embed_dtype));
    for (const tl::Linear *lin : model.linears()) {
        const size_t kn = size_t(lin->k) * size_t(lin->n);
        if (!lin->quantized) {
            touch(lin->dense, kn * tl::dtype_size(lin->dense_dtype));
            continue;
        }
        touch(lin->codes, kn / 2);
        touch(lin->scales, size_t(lin->n_groups()) * size_t(lin->n) * 2);
        touch(lin->zeros, size_t(lin->n_groups()) * size_t(lin->n) * 2);
        if (lin->frac4) touch(lin->frac4, kn / 2);
        if (lin->sign_bit) touch(lin->sign_bit, kn / 8);
    }
    return sum;
}

std::vector<uint8_t> mutate(const std::vector<uint8_t> &valid, uint64_t header_end, std::mt19937_64 &rng) {
    std::vector<uint8_t> bytes = valid;
    auto pick = [&rng](uint64_t lo, uint64_t hi) { return lo + rng() % (hi - lo); };
    switch (rng() % 5) {
        case 0:  // random bytes in the header, length prefix included
            for (int i = 0, n = 1 + int(rng() % 8); i < n; ++i)
                bytes[pick(0, header_end)] = static_cast<uint8_t>(rng());
            break;
        case 1:  // random bytes in the data section
            for (int i = 0, n = 1 + int(rng() % 64); i < n; ++i)
                bytes[pick(header_end, bytes.size())] = static_cast<uint8_t>(rng());
            break;
        case 2: {  // digits of the JSON changed: still JSON, but offsets, dimensions or config values move
            std::vector<size_t> digits;
            for (size_t i = 8; i < header_end; ++i)
                if (bytes[i] >= '0' && bytes[i] <= '9') digits.push_back(i);
            for (int i = 0, n = 1 + int(rng() % 3); i < n; ++i)
                bytes[digits[rng() % digits.size()]] = static_cast<uint8_t>('0' + rng() % 10);
            break;
        }
        case 3:  // truncated anywhere
            bytes.resize(pick(0, bytes.size()));
            break;
        default:  // a header flip and a truncation inside the data
            bytes[pick(8, header_end)] ^= static_cast<uint8_t>(1u << (rng() % 8));
            bytes.resize(pick(header_end, bytes.size()));
            break;
    }
    return bytes;
}

TEST(Mutation, DamagedFilesGiveAStatusNeverACrash) {
    const uint64_t seed = seed_from_env();
    SCOPED_TRACE("TL_FORMAT_SEED=" + std::to_string(seed));
    std::mt19937_64 rng(seed);
    tlt::ModelSpec spec;
    spec.head = tlt::HeadStore::Quantized;
    spec.frac4 = true;
    spec.sign_bit = true;
    spec.norm_dtype = tl::DType::F16;
    const std::vector<uint8_t> valid = tlt::make_valid_file(tlt::small_config(8), spec, "mutation_base.tinyloop", rng);
    const uint64_t header_end = 8 + tlt::parse_raw(valid).header_len;
    const std::string path = tlt::temp_dir() + "/mutated.tinyloop";

    int loaded = 0, rejected = 0;
    for (int i = 0; i < kCopies; ++i) {
        SCOPED_TRACE("copy " + std::to_string(i));
        tlt::write_bytes(path, mutate(valid, header_end, rng));
        const tl::LoadOptions options{i % 2 == 0, i % 3 != 0};
        try {
            const auto model = tl::load_model(path, options);
            volatile uint64_t sink = touch_every_view(*model);  // volatile: the reads must not be optimized away
            (void)sink;
            ++loaded;
        } catch (const tl::Error &e) {
            EXPECT_TRUE(e.code() == TL_ERR_FORMAT || e.code() == TL_ERR_IO) << e.code() << ": " << e.what();
            EXPECT_NE(std::string(e.what()), "");
            ++rejected;
        }

        tl_load_options c_options;
        ASSERT_EQ(tl_load_options_init(&c_options, sizeof c_options), TL_OK);
        c_options.use_mmap = options.use_mmap;
        c_options.validate_values = options.validate_values;
        tl_model *model = nullptr;
        const tl_status status = tl_model_load(path.c_str(), &c_options, &model);
        EXPECT_TRUE(status == TL_OK || status == TL_ERR_FORMAT || status == TL_ERR_IO)
            << status << ": " << tl_last_error_message();
        tl_model_free(model);
    }
    EXPECT_EQ(loaded + rejected, kCopies);
    EXPECT_GT(rejected, kCopies / 4) << "most damage must be detected";
    std::printf("mutation: %d loaded, %d rejected (seed %llu)\n", loaded, rejected,
                static_cast<unsigned long long>(seed));
}

}  // namespace
