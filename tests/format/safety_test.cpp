// Safety of the loader and the writer against hostile or unlucky surroundings: special files are refused at once
// (a FIFO with no writer is never waited on), the writer never follows a link planted at a name it might use,
// concurrent writers of one path each publish a whole file, a failed write leaves the old file and no temporary,
// and the header's size limit and space padding.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <random>
#include <set>
#include <thread>

#include "../common/tl_error.hpp"
#include "util/error.hpp"
#include "format_test_util.hpp"
#include "tinyloop.h"

namespace {

namespace fs = std::filesystem;

constexpr uint64_t kHeaderLimit = uint64_t{16} << 20;  // docs/format.md, validation rule 2

bool contains(const std::string &text, const std::string &part) { return text.find(part) != std::string::npos; }

// A fresh directory of its own under the process's temp dir.
std::string fresh_dir(const std::string &name) {
    const std::string dir = tlt::temp_dir() + "/" + name;
    fs::remove_all(dir);
    fs::create_directories(dir);
    return dir;
}

std::set<std::string> names_in(const std::string &dir) {
    std::set<std::string> names;
    for (const auto &entry : fs::directory_iterator(dir)) names.insert(entry.path().filename().string());
    return names;
}

struct LoadResult {
    tl_status status = TL_OK;
    std::string message;
};

// Through the C API, as users (and the CLI) load; frees any model it gets.
LoadResult load_via_c_api(const std::string &path, bool use_mmap) {
    tl_load_options options;
    if (tl_load_options_init(&options, sizeof options) != TL_OK) return {TL_ERR_INTERNAL, "options init failed"};
    options.use_mmap = use_mmap;
    tl_model *model = nullptr;
    LoadResult r;
    r.status = tl_model_load(path.c_str(), &options, &model);
    r.message = tl_last_error_message();
    tl_model_free(model);
    return r;
}

LoadResult load_via_cpp(const std::string &path, bool use_mmap) {
    const tlt::ErrorOf e = tlt::error_of([&] { tl::load_model(path, tl::LoadOptions{use_mmap, true}); });
    return {e.code, e.message};
}

// ---- Special files ----

// Before the fix the open() itself blocked until some process opened the FIFO for writing: forever, here.
TEST(SpecialFiles, FifoWithNoWriterIsRefusedAtOnce) {
    const std::string path = fresh_dir("fifo") + "/model.tinyloop";
    ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0) << std::strerror(errno);
    for (bool use_mmap : {true, false}) {
        for (auto load : {load_via_c_api, load_via_cpp}) {
            SCOPED_TRACE(std::string(load == load_via_c_api ? "C API" : "C++") + (use_mmap ? ", mmap" : ", read"));
            std::future<LoadResult> result = std::async(std::launch::async, load, path, use_mmap);
            if (result.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
                ADD_FAILURE() << "loading a FIFO with no writer blocked for 10 s";
                // A writer that comes and goes releases the blocked open(), so the test ends instead of hanging.
                const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK);
                if (fd >= 0) ::close(fd);
            }
            const LoadResult r = result.get();
            EXPECT_EQ(r.status, TL_ERR_IO) << r.message;
            for (const std::string &s : {"'" + path + "'", std::string("FIFO"), std::string("not a regular file")})
                EXPECT_TRUE(contains(r.message, s)) << "'" << s << "' not in: " << r.message;
        }
    }
}

TEST(SpecialFiles, DevicesAndDirectoriesAreNamedForWhatTheyAre) {
    const std::pair<std::string, std::string> cases[] = {{"/dev/null", "a character device"},
                                                         {"/dev/zero", "a character device"},
                                                         {fresh_dir("a_directory"), "a directory"}};
    for (const auto &[path, kind] : cases) {
        for (bool use_mmap : {true, false}) {
            const LoadResult r = load_via_c_api(path, use_mmap);
            EXPECT_EQ(r.status, TL_ERR_IO) << path << ": " << r.message;
            EXPECT_TRUE(contains(r.message, "'" + path + "' is " + kind + ", not a regular file")) << r.message;
        }
    }
}

// ---- The writer ----

struct Written {
    std::vector<tlt::OwnedTensor> tensors;
    std::vector<uint8_t> bytes;  // the file write_safetensors makes of them
};

// A valid model per seed, with the writer's bytes for it; the specs vary so that the files differ in size too.
Written written_model(uint64_t seed, const std::string &dir) {
    std::mt19937_64 rng(seed);
    tlt::ModelSpec spec;
    spec.dense_linears = seed % 2 == 1;
    spec.head = seed % 3 == 0 ? tlt::HeadStore::Tied : tlt::HeadStore::Quantized;
    spec.frac4 = seed % 4 == 2;
    Written w;
    w.tensors = tlt::make_tensors(tlt::small_config(8), spec, rng);
    const std::string path = dir + "/reference_" + std::to_string(seed) + ".tinyloop";
    tl::write_safetensors(path, tlt::model_metadata(tlt::small_config(8)), tlt::views_of(w.tensors));
    w.bytes = tlt::read_bytes(path);
    fs::remove(path);
    return w;
}

void write_model(const std::string &path, const Written &w) {
    tl::write_safetensors(path, tlt::model_metadata(tlt::small_config(8)), tlt::views_of(w.tensors));
}

std::string read_text(const std::string &path) {
    const std::vector<uint8_t> bytes = tlt::read_bytes(path);
    return std::string(bytes.begin(), bytes.end());
}

// The old writer opened `OUT.tmp` with O_CREAT | O_TRUNC: a link planted there had the model written through it
// (over the victim file, or creating the file it names) and was then renamed into place.
TEST(Writer, DoesNotFollowLinksPlantedAtNamesItMightUse) {
    const std::string dir = fresh_dir("planted_links");
    const Written model = written_model(1, dir);
    const std::string out = dir + "/model.tinyloop";
    const std::string victim = dir + "/victim.txt";
    const std::string created = dir + "/created_through_link";
    tlt::write_bytes(victim, {'k', 'e', 'e', 'p'});
    const std::string predictable[] = {out + ".tmp", dir + "/.model.tinyloop.tmp", dir + "/.model.tinyloop.XXXXXX",
                                       dir + "/model.tinyloop~"};
    for (const std::string &target : {victim, created}) {  // an existing file, then a dangling link
        SCOPED_TRACE(target);
        fs::remove(out);
        for (const std::string &link : predictable) {
            fs::remove(link);
            fs::create_symlink(target, link);
        }
        EXPECT_NO_THROW(write_model(out, model));
        EXPECT_EQ(read_text(victim), "keep");
        EXPECT_FALSE(fs::exists(fs::symlink_status(created))) << "the writer created a file through a link";
        EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(out))) << "the output is not a plain file";
        EXPECT_EQ(tlt::read_bytes(out), model.bytes);
        for (const std::string &link : predictable) EXPECT_TRUE(fs::is_symlink(fs::symlink_status(link))) << link;
    }
    // An output that is itself a link is replaced by the new file; its target is left alone.
    fs::remove(out);
    fs::create_symlink(victim, out);
    EXPECT_NO_THROW(write_model(out, model));
    EXPECT_EQ(read_text(victim), "keep");
    EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(out)));
    EXPECT_EQ(tlt::read_bytes(out), model.bytes);
}

// The old writer's writers shared one `OUT.tmp`: one truncated it under another, blends were published, and a
// writer whose temporary had already been renamed away failed.
TEST(Writer, ConcurrentWritersOfOnePathEachPublishAWholeFile) {
    const std::string dir = fresh_dir("concurrent");
    constexpr int kWriters = 8, kRounds = 25;
    std::vector<Written> models;
    for (int i = 0; i < kWriters; ++i) models.push_back(written_model(100 + uint64_t(i), dir));
    const std::string out = dir + "/model.tinyloop";
    std::set<int> winners;
    for (int round = 0; round < kRounds; ++round) {
        std::atomic<int> ready{0};
        std::vector<std::string> errors(kWriters);
        std::vector<std::thread> threads;
        for (int i = 0; i < kWriters; ++i) {
            threads.emplace_back([&, i] {
                ready.fetch_add(1);
                while (ready.load() < kWriters) std::this_thread::yield();  // start together
                try {
                    write_model(out, models[size_t(i)]);
                } catch (const std::exception &e) {
                    errors[size_t(i)] = e.what();
                }
            });
        }
        for (std::thread &t : threads) t.join();
        for (int i = 0; i < kWriters; ++i)
            EXPECT_EQ(errors[size_t(i)], "") << "round " << round << ", writer " << i << " failed";
        const std::vector<uint8_t> bytes = tlt::read_bytes(out);
        int match = -1;
        for (int i = 0; i < kWriters; ++i)
            if (bytes == models[size_t(i)].bytes) match = i;
        EXPECT_GE(match, 0) << "round " << round << ": the file (" << bytes.size()
                            << " bytes) is none of the models written";
        winners.insert(match);
        EXPECT_NO_THROW(tl::load_model(out, tl::LoadOptions{})) << "round " << round;
        EXPECT_EQ(names_in(dir), std::set<std::string>{"model.tinyloop"}) << "round " << round;
        if (::testing::Test::HasFailure()) break;  // one round's report is enough
    }
}

// mkstemp makes its file 0600; the writer gives it the mode open(..., 0644) under the umask would.
TEST(Writer, GivesTheFileTheUsualModeUnderTheUmask) {
    const std::string dir = fresh_dir("mode");
    const Written model = written_model(2, dir);
    const mode_t saved = ::umask(022);
    for (const auto &[mask, mode] : {std::pair<mode_t, mode_t>{022, 0644}, {027, 0640}, {002, 0644}}) {
        ::umask(mask);
        const std::string out = dir + "/mode_" + std::to_string(mask) + ".tinyloop";
        write_model(out, model);
        struct stat st;
        ASSERT_EQ(::stat(out.c_str(), &st), 0);
        EXPECT_EQ(st.st_mode & 0777, mode) << "umask " << std::oct << mask;
    }
    ::umask(saved);
}

void expect_io_error(const std::function<void()> &write, const std::vector<std::string> &substrings) {
    EXPECT_TRUE(tlt::throws(TL_ERR_IO, substrings, write));
}

TEST(Writer, AFailedWriteLeavesTheOldFileAndNoTemporary) {
    const std::string dir = fresh_dir("failed_write");
    const Written old_model = written_model(3, dir), new_model = written_model(4, dir);
    const std::string out = dir + "/model.tinyloop";
    write_model(out, old_model);

    // A directory that does not exist: nothing can be created.
    const std::string missing = dir + "/no_such_dir/model.tinyloop";
    expect_io_error([&] { write_model(missing, new_model); }, {"'" + missing + "'", "No such file or directory"});

    // Failing in the middle of the data: the file size limit (SIGXFSZ ignored, so write() says EFBIG).
    {
        struct rlimit saved;
        ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
        void (*saved_handler)(int) = ::signal(SIGXFSZ, SIG_IGN);
        struct rlimit small = saved;
        small.rlim_cur = new_model.bytes.size() / 2;
        ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
        expect_io_error([&] { write_model(out, new_model); }, {"cannot write", "File too large"});
        ::setrlimit(RLIMIT_FSIZE, &saved);
        ::signal(SIGXFSZ, saved_handler);
    }
    EXPECT_EQ(tlt::read_bytes(out), old_model.bytes);

    // Failing at the rename: the output path is a non-empty directory.
    const std::string blocked = dir + "/blocked.tinyloop";
    fs::create_directory(blocked);
    tlt::write_bytes(blocked + "/inside", {1});
    expect_io_error([&] { write_model(blocked, new_model); }, {"cannot rename", "'" + blocked + "'"});
    EXPECT_TRUE(fs::is_directory(blocked));

    EXPECT_EQ(tlt::read_bytes(out), old_model.bytes);
    EXPECT_EQ(names_in(dir), (std::set<std::string>{"model.tinyloop", "blocked.tinyloop"}))
        << "a temporary file was left behind";
}

// ---- The header: size limit and padding ----

// The valid file's header JSON followed by spaces up to `header_len` bytes.
std::vector<uint8_t> padded_file(const tlt::RawFile &raw, uint64_t header_len) {
    std::string text = raw.header.dump();
    EXPECT_LE(text.size(), header_len);
    text.resize(size_t(header_len), ' ');
    return tlt::encode_file(text, raw.data);
}

tlt::RawFile valid_raw(const std::string &name) {
    std::mt19937_64 rng(7);
    return tlt::parse_raw(tlt::make_valid_file(tlt::small_config(8), tlt::ModelSpec{}, name, rng));
}

TEST(Header, SpacesAfterTheJsonAreAccepted) {
    const tlt::RawFile raw = valid_raw("spaces_base.tinyloop");
    const std::string path = tlt::temp_dir() + "/trailing_spaces.tinyloop";
    tlt::write_bytes(path, padded_file(raw, raw.header.dump().size() + 37));
    for (bool use_mmap : {true, false}) {
        const LoadResult r = load_via_c_api(path, use_mmap);
        EXPECT_EQ(r.status, TL_OK) << r.message;
    }
}

// JSON whitespace between tokens (a pretty-printed header) is still fine; only what follows the object is strict.
TEST(Header, PrettyPrintedJsonIsAccepted) {
    const tlt::RawFile raw = valid_raw("pretty_base.tinyloop");
    const std::string path = tlt::temp_dir() + "/pretty.tinyloop";
    tlt::write_bytes(path, tlt::encode_file("\n" + raw.header.dump(2, '\t') + "   ", raw.data));
    const LoadResult r = load_via_c_api(path, true);
    EXPECT_EQ(r.status, TL_OK) << r.message;
}

// A header of exactly the limit loads; one byte more is refused before any of it is parsed, with the limit in the
// message (the old 100 MB limit parsed it).
TEST(Header, LengthLimitIsSixteenMiB) {
    const tlt::RawFile raw = valid_raw("limit_base.tinyloop");
    const std::string at_limit = tlt::temp_dir() + "/header_at_limit.tinyloop";
    tlt::write_bytes(at_limit, padded_file(raw, kHeaderLimit));
    EXPECT_EQ(load_via_c_api(at_limit, true).status, TL_OK) << tl_last_error_message();
    fs::remove(at_limit);

    // Over the limit with unknown fields, the costly kind of header: refused at the length, for both read paths.
    std::string text = raw.header.dump();
    text.pop_back();
    for (int i = 0; text.size() < kHeaderLimit; ++i) text += ",\"unknown_" + std::to_string(i) + "\":[1,2,3,4]";
    text += "}";
    const std::string over = tlt::temp_dir() + "/header_over_limit.tinyloop";
    tlt::write_bytes(over, tlt::encode_file(text, raw.data));
    for (bool use_mmap : {true, false}) {
        const LoadResult r = load_via_c_api(over, use_mmap);
        EXPECT_EQ(r.status, TL_ERR_FORMAT) << r.message;
        EXPECT_TRUE(contains(r.message, "header length " + std::to_string(text.size()) +
                                            " exceeds the 16 MiB (16777216-byte) limit"))
            << r.message;
    }
    fs::remove(over);
}

}  // namespace
