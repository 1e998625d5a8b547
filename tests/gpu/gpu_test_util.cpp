#include "gpu_test_util.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <sstream>
#include <thread>

#include "gpu_kernels.hpp"
#include "util/half.hpp"

namespace tlt {

bool g_quick = false;

std::mt19937_64 &rng() {
    static std::mt19937_64 engine(std::random_device{}());
    return engine;
}

double Int4Weight::at(int kk, int nn) const {
    const int q = (codes[static_cast<size_t>(nn) * row_bytes() + kk / 2] >> ((kk & 1) * 4)) & 0xF;
    const size_t g = static_cast<size_t>(nn) * groups() + kk / group_size;
    return q * static_cast<double>(tl::half_to_float(scales[g])) + tl::half_to_float(zeros[g]);
}

Int4Weight random_weight(int k, int n, int group_size) {
    Int4Weight w;
    w.k = k;
    w.n = n;
    w.group_size = group_size;
    w.codes.resize(static_cast<size_t>(n) * w.row_bytes());
    // xorshift for the bulk codes (a 70B layer has 235 MB of them), seeded from the test's generator.
    uint64_t state = rng()() | 1;
    for (size_t i = 0; i < w.codes.size(); i += 8) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        for (size_t j = 0; j < 8 && i + j < w.codes.size(); ++j) w.codes[i + j] = static_cast<uint8_t>(state >> (8 * j));
    }
    std::uniform_real_distribution<float> scale(0.004f, 0.02f), zero(6.0f, 9.0f);
    const size_t groups = static_cast<size_t>(n) * w.groups();
    w.scales.resize(groups);
    w.zeros.resize(groups);
    for (size_t i = 0; i < groups; ++i) {
        w.scales[i] = tl::float_to_half(scale(rng()));
        w.zeros[i] = tl::float_to_half(-tl::half_to_float(w.scales[i]) * zero(rng()));
    }
    return w;
}

std::vector<uint16_t> random_normal_half(size_t count, double stddev) {
    std::normal_distribution<float> normal(0.0f, static_cast<float>(stddev));
    std::vector<uint16_t> out(count);
    for (auto &v : out) v = tl::float_to_half(normal(rng()));
    return out;
}

std::vector<uint16_t> random_normal_both(size_t count) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<uint16_t> out(count);
    for (auto &v : out) {
        const float b = bf16_to_float(float_to_bf16(normal(rng())));
        v = tl::float_to_half(std::fabs(b) < 6.103515625e-05f ? 0.0f : b);
    }
    return out;
}

std::vector<uint16_t> bf16_bits(const std::vector<uint16_t> &fp16) {
    std::vector<uint16_t> out(fp16.size());
    for (size_t i = 0; i < fp16.size(); ++i) out[i] = float_to_bf16(tl::half_to_float(fp16[i]));
    return out;
}

float bf16_to_float(uint16_t bits) {
    const uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

uint16_t float_to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if (std::isnan(f)) return 0x7FC0;
    u += 0x7FFFu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}

double decode(uint16_t bits, tl::Dtype dtype) {
    return dtype == tl::Dtype::BF16 ? bf16_to_float(bits) : tl::half_to_float(bits);
}

std::vector<int> sample_columns(int n, int count) {
    std::vector<int> cols(n);
    for (int i = 0; i < n; ++i) cols[i] = i;
    if (count >= n) return cols;
    std::shuffle(cols.begin(), cols.end(), rng());
    cols.resize(count);
    std::sort(cols.begin(), cols.end());
    return cols;
}

std::vector<double> reference_gemm(const std::vector<uint16_t> &x, int m, const Int4Weight &w,
                                   const std::vector<int> &cols_in) {
    std::vector<int> cols = cols_in.empty() ? sample_columns(w.n, w.n) : cols_in;
    const int k = w.k;
    const size_t nc = cols.size();
    std::vector<double> xd(x.size());
    for (size_t i = 0; i < x.size(); ++i) xd[i] = tl::half_to_float(x[i]);
    std::vector<double> ref(static_cast<size_t>(m) * nc);
    const unsigned n_threads = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
    auto work = [&](unsigned t) {
        std::vector<double> wcol(k);
        for (size_t c = t; c < nc; c += n_threads) {
            for (int kk = 0; kk < k; ++kk) wcol[kk] = w.at(kk, cols[c]);
            for (int mm = 0; mm < m; ++mm) {
                const double *xr = xd.data() + static_cast<size_t>(mm) * k;
                double acc = 0.0;
                for (int kk = 0; kk < k; ++kk) acc += xr[kk] * wcol[kk];
                ref[static_cast<size_t>(mm) * nc + c] = acc;
            }
        }
    };
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < n_threads; ++t) threads.emplace_back(work, t);
    for (auto &th : threads) th.join();
    return ref;
}

namespace {

::testing::AssertionResult compare(const std::vector<uint16_t> &y, int m, int n, const std::vector<int> &cols,
                                   const std::function<double(size_t, size_t)> &ref_at, double rel_tol,
                                   tl::Dtype dtype) {
    for (size_t i = 0; i < static_cast<size_t>(m) * n; ++i) {
        if (!std::isfinite(decode(y[i], dtype))) {
            return ::testing::AssertionFailure() << "y[" << i / n << "][" << i % n << "] is not finite (bits 0x"
                                                 << std::hex << y[i] << std::dec << "): unwritten or overflow";
        }
    }
    double err2 = 0.0, ref2 = 0.0;
    for (int mm = 0; mm < m; ++mm) {
        for (size_t c = 0; c < cols.size(); ++c) {
            const double r = ref_at(mm, c);
            const double d = decode(y[static_cast<size_t>(mm) * n + cols[c]], dtype) - r;
            err2 += d * d;
            ref2 += r * r;
        }
    }
    const double count = static_cast<double>(m) * cols.size();
    const double rms = std::sqrt(ref2 / count);
    const double rel = std::sqrt(err2 / std::max(ref2, 1e-300));
    if (!(rel <= rel_tol)) {
        return ::testing::AssertionFailure() << "relative error " << rel << " > " << rel_tol << " (rms ref " << rms << ")";
    }
    // Per element, a share of its own size: the output's rounding and the weights' grow with it (BF16 has 3 bits
    // fewer than FP16: 8 times the share).
    const double own_share = dtype == tl::Dtype::BF16 ? 1.6e-2 : 2e-3;
    for (int mm = 0; mm < m; ++mm) {
        for (size_t c = 0; c < cols.size(); ++c) {
            const double r = ref_at(mm, c);
            const double v = decode(y[static_cast<size_t>(mm) * n + cols[c]], dtype);
            if (std::fabs(v - r) > 4.0 * rel_tol * rms + own_share * std::fabs(r)) {
                return ::testing::AssertionFailure() << "y[" << mm << "][" << cols[c] << "] = " << v << ", reference "
                                                     << r << " (rms " << rms << ")";
            }
        }
    }
    return ::testing::AssertionSuccess() << "relative error " << rel;
}

}  // namespace

::testing::AssertionResult matches(const std::vector<uint16_t> &y, int m, int n, const std::vector<double> &ref,
                                   const std::vector<int> &cols_in, double rel_tol, tl::Dtype dtype) {
    const std::vector<int> cols = cols_in.empty() ? sample_columns(n, n) : cols_in;
    const size_t nc = cols.size();
    return compare(y, m, n, cols, [&](size_t mm, size_t c) { return ref[mm * nc + c]; }, rel_tol, dtype);
}

double relative_error(const std::vector<uint16_t> &y, int m, int n, const std::vector<double> &ref, tl::Dtype dtype) {
    double err2 = 0.0, ref2 = 0.0;
    for (size_t i = 0; i < static_cast<size_t>(m) * n; ++i) {
        const double v = decode(y[i], dtype);
        if (!std::isfinite(v)) return std::nan("");
        err2 += (v - ref[i]) * (v - ref[i]);
        ref2 += ref[i] * ref[i];
    }
    return std::sqrt(err2 / std::max(ref2, 1e-300));
}

::testing::AssertionResult matches_half(const std::vector<uint16_t> &y, const std::vector<uint16_t> &ref, int m,
                                        int n, double rel_tol, tl::Dtype dtype) {
    for (size_t i = 0; i < ref.size(); ++i) {
        if (!std::isfinite(decode(ref[i], dtype))) {
            return ::testing::AssertionFailure() << "reference element " << i << " is not finite";
        }
    }
    const std::vector<int> cols = sample_columns(n, n);
    return compare(y, m, n, cols,
                   [&](size_t mm, size_t c) { return decode(ref[mm * static_cast<size_t>(n) + c], dtype); }, rel_tol,
                   dtype);
}

int sm_count() {
    int device = 0, count = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return 0;
    if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return 0;
    return count;
}

bool sm90a_kernels_run() {
    int device = 0, major = 0, minor = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
        return false;
    }
    return tl::gpu::marlin_wgmma_built() && major == 9 && minor == 0;
}

}  // namespace tlt
