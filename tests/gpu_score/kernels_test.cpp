// Each forward-pass kernel (cuda/forward/) against an FP64 host reference computed from the same FP16/FP32 inputs,
// on fresh random inputs, with poisoned outputs and a guard region past every output (out-of-bounds writes fail).
//
// Tolerances follow from the arithmetic: a kernel computes in FP32 and rounds its FP16 output once, so an output is
// within 2^-11 (4.9e-4) of the exact value relatively, plus FP32 noise far below that; 6e-4 * |ref| leaves a small
// margin while a wrong index, mask or scale is off by orders of magnitude more.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <tuple>
#include <vector>

#include "forward/forward_kernels.hpp"
#include "gpu_kernels.hpp"
#include "gpu/gpu_model.hpp"
#include "util/half.hpp"
#include "test_util.hpp"

namespace {

using tl::float_to_half;
using tl::half_to_float;
using tlt::DeviceArray;
using tlt::launched;
using tlt::random_half;
using tlt::upload_guarded;
using tlt::rng;

constexpr double kHalfTol = 6e-4;  // relative: one FP16 rounding (2^-11) plus margin

std::vector<float> random_float(size_t count, double mean, double stddev) {
    std::normal_distribution<float> normal(static_cast<float>(mean), static_cast<float>(stddev));
    std::vector<float> out(count);
    for (auto &v : out) v = normal(rng());
    return out;
}

// ---- Embedding ----------------------------------------------------------------------------------------------------

TEST(Kernels, Embedding) {
    const int V = 1000, d = 300, T = 77;
    std::uniform_int_distribution<int32_t> pick(0, V - 1);
    std::vector<int32_t> tokens(T);
    for (auto &t : tokens) t = pick(rng());
    tokens[0] = 0;
    tokens[1] = V - 1;
    tokens[5] = -1;  // invalid: the row must become NaN
    tokens[9] = V;
    const std::vector<float> normal = random_float(static_cast<size_t>(V) * d, 0.0, 0.5);
    for (tl::gpu::TableType type : {tl::gpu::TableType::F16, tl::gpu::TableType::BF16, tl::gpu::TableType::F32}) {
        SCOPED_TRACE("table type " + std::to_string(static_cast<int>(type)));
        std::vector<float> expected(normal.size());
        std::vector<uint8_t> bytes;
        if (type == tl::gpu::TableType::F32) {
            expected = normal;
            bytes.resize(normal.size() * 4);
            std::memcpy(bytes.data(), normal.data(), bytes.size());
        } else {
            std::vector<uint16_t> bits(normal.size());
            for (size_t i = 0; i < normal.size(); ++i) {
                if (type == tl::gpu::TableType::F16) {
                    bits[i] = float_to_half(normal[i]);
                    expected[i] = half_to_float(bits[i]);
                } else {  // BF16: the top 16 bits of the FP32
                    uint32_t f;
                    std::memcpy(&f, &normal[i], 4);
                    bits[i] = static_cast<uint16_t>(f >> 16);
                    const uint32_t back = static_cast<uint32_t>(bits[i]) << 16;
                    std::memcpy(&expected[i], &back, 4);
                }
            }
            bytes.resize(bits.size() * 2);
            std::memcpy(bytes.data(), bits.data(), bytes.size());
        }
        DeviceArray<int32_t> tok(tokens.size());
        DeviceArray<uint8_t> table(bytes.size());
        DeviceArray<float> x(static_cast<size_t>(T) * d);
        ASSERT_TRUE(upload_guarded(tok, tokens) && upload_guarded(table, bytes) && x.ok());
        CUDA_OK(x.poison(0x7F));  // a large finite float: an unwritten NaN row would show
        ASSERT_TRUE(launched(tl::gpu::embed_gather(tok.get(), table.get(), type, x.get(), T, d, V, nullptr)));
        std::vector<float> got;
        CUDA_OK(x.download(got));
        for (int t = 0; t < T; ++t) {
            const bool valid = tokens[t] >= 0 && tokens[t] < V;
            for (int i = 0; i < d; ++i) {
                const float g = got[static_cast<size_t>(t) * d + i];
                if (!valid) {
                    ASSERT_TRUE(std::isnan(g)) << "row " << t << " (token " << tokens[t] << ") col " << i;
                } else {
                    ASSERT_EQ(g, expected[static_cast<size_t>(tokens[t]) * d + i]) << "row " << t << " col " << i;
                }
            }
        }
        EXPECT_TRUE(x.guard_intact());
        EXPECT_TRUE(table.guard_intact() && tok.guard_intact());
    }
}

// ---- Residual add + RMSNorm -----------------------------------------------------------------------------------

TEST(Kernels, RmsNorm) {
    const float eps = 1e-5f;
    for (auto [T, d] : {std::pair{1, 64}, {5, 300}, {33, 2048}, {3, 8192}}) {
        for (bool with_add : {false, true}) {
            SCOPED_TRACE("T=" + std::to_string(T) + " d=" + std::to_string(d) + (with_add ? " +residual" : ""));
            const size_t n = static_cast<size_t>(T) * d;
            std::vector<float> x = random_float(n, 0.0, 2.0);
            for (int i = 0; i < d; ++i) x[i] *= 1e-3f;  // row 0: mean square ~4e-6, where eps matters
            const std::vector<uint16_t> add = random_half(n, 1.0);
            const std::vector<float> gain = random_float(d, 1.0, 0.1);
            DeviceArray<float> xd(n), gd(d);
            DeviceArray<uint16_t> ad(n), y(n);
            ASSERT_TRUE(upload_guarded(xd, x) && upload_guarded(gd, gain) && upload_guarded(ad, add) && y.ok());
            CUDA_OK(y.poison(0xFF));
            ASSERT_TRUE(launched(tl::gpu::rmsnorm_residual(xd.get(), with_add ? ad.get() : nullptr, gd.get(), y.get(),
                                                           T, d, eps, nullptr)));
            std::vector<float> x_after;
            std::vector<uint16_t> got;
            CUDA_OK(xd.download(x_after));
            CUDA_OK(y.download(got));
            for (int t = 0; t < T; ++t) {
                std::vector<float> xr(d);
                double sum_sq = 0.0;
                for (int i = 0; i < d; ++i) {
                    const size_t k = static_cast<size_t>(t) * d + i;
                    xr[i] = with_add ? x[k] + half_to_float(add[k]) : x[k];  // the FP32 residual add, exactly
                    ASSERT_EQ(x_after[k], xr[i]) << "x[" << t << "][" << i << "]";
                    sum_sq += static_cast<double>(xr[i]) * xr[i];
                }
                const double inv_rms = 1.0 / std::sqrt(sum_sq / d + eps);
                for (int i = 0; i < d; ++i) {
                    const double ref = xr[i] * inv_rms * gain[i];
                    const double g = half_to_float(got[static_cast<size_t>(t) * d + i]);
                    ASSERT_LE(std::fabs(g - ref), kHalfTol * std::fabs(ref) + 1e-6) << "y[" << t << "][" << i << "]";
                }
            }
            EXPECT_TRUE(y.guard_intact() && xd.guard_intact());
        }
    }
}

// ---- RoPE -----------------------------------------------------------------------------------------------------

TEST(Kernels, Rope) {
    struct Case {
        int T, H, hd;
        float theta;
    };
    for (const Case &c : {Case{1, 1, 2, 10000.0f}, Case{7, 4, 16, 10000.0f}, Case{300, 2, 64, 500000.0f},
                          Case{300, 3, 128, 10000.0f}, Case{1024, 1, 10, 10000.0f}}) {
        SCOPED_TRACE("T=" + std::to_string(c.T) + " H=" + std::to_string(c.H) + " hd=" + std::to_string(c.hd));
        const int A = c.H * c.hd, half = c.hd / 2;
        const size_t n = static_cast<size_t>(c.T) * 3 * A;
        const std::vector<uint16_t> qkv = random_half(n, 1.0);
        std::vector<float> cos_table, sin_table;
        tl::rope_tables(c.T, c.hd, c.theta, cos_table, sin_table);
        DeviceArray<uint16_t> d_qkv(n);
        DeviceArray<float> d_cos(cos_table.size()), d_sin(sin_table.size());
        ASSERT_TRUE(upload_guarded(d_qkv, qkv) && upload_guarded(d_cos, cos_table) && upload_guarded(d_sin, sin_table));
        ASSERT_TRUE(launched(tl::gpu::rope_qk(d_qkv.get(), d_cos.get(), d_sin.get(), c.T, c.H, c.hd, nullptr)));
        std::vector<uint16_t> got;
        CUDA_OK(d_qkv.download(got));
        for (int t = 0; t < c.T; ++t) {
            for (int part = 0; part < 3; ++part) {
                for (int h = 0; h < c.H; ++h) {
                    const size_t base = static_cast<size_t>(t) * 3 * A + static_cast<size_t>(part) * A + h * c.hd;
                    for (int i = 0; i < half; ++i) {
                        const size_t ia = base + i, ib = base + i + half;
                        if (part == 2) {  // v is not rotated
                            ASSERT_EQ(got[ia], qkv[ia]);
                            ASSERT_EQ(got[ib], qkv[ib]);
                            continue;
                        }
                        const long double angle =
                            static_cast<long double>(t) * std::pow(static_cast<long double>(c.theta), -2.0L * i / c.hd);
                        const double cs = static_cast<double>(std::cos(angle)), sn = static_cast<double>(std::sin(angle));
                        const double a = half_to_float(qkv[ia]), b = half_to_float(qkv[ib]);
                        const double ref_a = a * cs - b * sn, ref_b = a * sn + b * cs;
                        const double slack = 2e-6 * (std::fabs(a) + std::fabs(b)) + 1e-7;
                        ASSERT_LE(std::fabs(half_to_float(got[ia]) - ref_a), kHalfTol * std::fabs(ref_a) + slack)
                            << "t " << t << " part " << part << " head " << h << " i " << i;
                        ASSERT_LE(std::fabs(half_to_float(got[ib]) - ref_b), kHalfTol * std::fabs(ref_b) + slack)
                            << "t " << t << " part " << part << " head " << h << " i " << i + half;
                    }
                }
            }
        }
        EXPECT_TRUE(d_qkv.guard_intact());
    }
}

// Positions from an array (packed sequences restart at 0): the result equals rope_qk on each row alone with the
// table row of its position, bit for bit.
TEST(Kernels, RopePositions) {
    const int T = 90, H = 3, hd = 64, A = H * hd;
    const std::vector<int32_t> lengths = {1, 40, 17, 32};  // sums to T
    std::vector<int32_t> positions;
    for (int32_t len : lengths)
        for (int32_t p = 0; p < len; ++p) positions.push_back(p);
    ASSERT_EQ(static_cast<int>(positions.size()), T);
    const std::vector<uint16_t> qkv = random_half(static_cast<size_t>(T) * 3 * A, 1.0);
    std::vector<float> cos_table, sin_table;
    tl::rope_tables(40, hd, 10000.0f, cos_table, sin_table);
    DeviceArray<uint16_t> packed(qkv.size());
    DeviceArray<int32_t> d_positions(positions.size());
    DeviceArray<float> d_cos(cos_table.size()), d_sin(sin_table.size());
    ASSERT_TRUE(upload_guarded(packed, qkv) && upload_guarded(d_positions, positions) &&
                upload_guarded(d_cos, cos_table) && upload_guarded(d_sin, sin_table));
    ASSERT_TRUE(launched(
        tl::gpu::rope_qk(packed.get(), d_cos.get(), d_sin.get(), T, H, hd, nullptr, d_positions.get())));
    std::vector<uint16_t> got;
    CUDA_OK(packed.download(got));
    // Row t alone, as row p of a sequence whose rows before it are copies: rope_qk without positions uses row p.
    for (int t = 0; t < T; ++t) {
        const int p = positions[t];
        std::vector<uint16_t> alone(static_cast<size_t>(p + 1) * 3 * A);
        std::copy_n(qkv.begin() + static_cast<size_t>(t) * 3 * A, 3 * A, alone.begin() + static_cast<size_t>(p) * 3 * A);
        DeviceArray<uint16_t> d_alone(alone.size());
        ASSERT_TRUE(upload_guarded(d_alone, alone));
        ASSERT_TRUE(launched(tl::gpu::rope_qk(d_alone.get(), d_cos.get(), d_sin.get(), p + 1, H, hd, nullptr)));
        std::vector<uint16_t> want;
        CUDA_OK(d_alone.download(want));
        for (int i = 0; i < 3 * A; ++i) {
            ASSERT_EQ(got[static_cast<size_t>(t) * 3 * A + i], want[static_cast<size_t>(p) * 3 * A + i])
                << "row " << t << " (position " << p << "), element " << i;
        }
    }
    EXPECT_TRUE(packed.guard_intact() && d_positions.guard_intact());
}

// ---- Attention ------------------------------------------------------------------------------------------------

// Row t of the output, FP64: per head, softmax over keys j <= t of q.k / sqrt(hd), times v. qkv holds the FP16
// inputs converted to double. Besides the output, per element:
//  - mag = sum_j w_j |v_j| (w = the softmax weights), the scale of the sums a kernel accumulates;
//  - p_round = sum_j (2^-11 p_j + 2^-25) |v_j| / sum_j p_j with p_j = exp(s_j - max): what rounding the
//    probabilities to FP16 before P V may cost (relative 2^-11 for normal FP16, absolute 2^-25 for subnormal; the
//    tensor-core kernel's probabilities are relative to a running max <= the final one, so after rescaling its
//    absolute rounding error is <= 2^-25 in these units too, and it normalizes by the unrounded sum).
struct ReferenceRow {
    std::vector<double> out, mag, p_round;
};

// qkv rows are [H query heads | KV key heads | KV value heads] (KV = H when kv is 0); query head h reads K/V head
// h / (H / KV).
ReferenceRow reference_attention(const std::vector<double> &qkv, int H, int hd, int t, int kv = 0) {
    if (kv == 0) kv = H;
    const int A = H * hd, KV = kv * hd, W = A + 2 * KV;
    ReferenceRow row{std::vector<double>(A, 0.0), std::vector<double>(A, 0.0), std::vector<double>(A, 0.0)};
    std::vector<double> p(t + 1);
    for (int h = 0; h < H; ++h) {
        const int g = h / (H / kv);
        const double *q = qkv.data() + static_cast<size_t>(t) * W + h * hd;
        double mx = -INFINITY;
        for (int j = 0; j <= t; ++j) {
            const double *k = qkv.data() + static_cast<size_t>(j) * W + A + g * hd;
            double s = 0.0;
            for (int d = 0; d < hd; ++d) s += q[d] * k[d];
            p[j] = s / std::sqrt(static_cast<double>(hd));
            mx = std::max(mx, p[j]);
        }
        double sum = 0.0;
        for (int j = 0; j <= t; ++j) sum += (p[j] = std::exp(p[j] - mx));
        for (int j = 0; j <= t; ++j) {
            const double *v = qkv.data() + static_cast<size_t>(j) * W + A + KV + g * hd;
            const double rounding = std::ldexp(p[j], -11) + std::ldexp(1.0, -25);
            for (int d = 0; d < hd; ++d) {
                row.out[h * hd + d] += p[j] * v[d];
                row.mag[h * hd + d] += p[j] * std::fabs(v[d]);
                row.p_round[h * hd + d] += rounding * std::fabs(v[d]);
            }
        }
        for (int d = 0; d < hd; ++d) {
            row.out[h * hd + d] /= sum;
            row.mag[h * hd + d] /= sum;
            row.p_round[h * hd + d] /= sum;
        }
    }
    return row;
}

// Runs the kernel on random q (wider spread, so the running max moves between key tiles), k and v, and checks the
// rows `rows` (every row when empty) against the reference; every row must be written and finite. qkv is placed
// `misalign` halves past the start of its allocation (2: 4-byte aligned only). Returns the largest error / bound.
//
// Bound per element: 2^-11 |ref| (the output's FP16 rounding) + p_round (FP16 probabilities, tensor-core kernel
// only: the SIMT kernel keeps them FP32) + 1e-4 mag (FP32 arithmetic: scores, exp2, sums over up to 4096 keys;
// the tensor cores' FP32 accumulation may truncate, and an element sees <= 4 x 64 chained mma adds at T = 4096,
// ~3e-5) + 1e-7 (FP16 subnormal outputs). A wrong index, mask or scale is off by a sizeable fraction of mag.
double check_attention(int T, int H, int hd, const std::vector<int> &rows_in,
                       tl::gpu::AttentionKernel kernel = tl::gpu::AttentionKernel::Auto, int misalign = 0, int kv = 0) {
    SCOPED_TRACE("T=" + std::to_string(T) + " H=" + std::to_string(H) + " hd=" + std::to_string(hd) + " kernel " +
                 std::to_string(static_cast<int>(kernel)) + " misalign " + std::to_string(misalign) + " kv " +
                 std::to_string(kv));
    const int A = H * hd, W = A + 2 * (kv == 0 ? H : kv) * hd;  // W: one row of qkv
    // The kernel that runs: Auto picks the tensor cores for hd 64/128 with a 16-byte aligned qkv.
    const bool fp16_p = kernel == tl::gpu::AttentionKernel::TensorCore || kernel == tl::gpu::AttentionKernel::Wgmma ||
                        (kernel == tl::gpu::AttentionKernel::Auto && (hd == 64 || hd == 128) && misalign % 8 == 0);
    std::vector<uint16_t> qkv(static_cast<size_t>(T) * W + misalign, 0);
    std::normal_distribution<float> q_dist(0.0f, 2.0f), kv_dist(0.0f, 1.0f);
    for (int t = 0; t < T; ++t)
        for (int i = 0; i < W; ++i)
            qkv[misalign + static_cast<size_t>(t) * W + i] = float_to_half(i < A ? q_dist(rng()) : kv_dist(rng()));
    DeviceArray<uint16_t> d_qkv(qkv.size()), out(static_cast<size_t>(T) * A);
    double worst = 0.0;
    [&] {
        ASSERT_TRUE(upload_guarded(d_qkv, qkv) && out.ok());
        CUDA_OK(out.poison(0xFF));  // FP16 NaN
        ASSERT_TRUE(launched(
            tl::gpu::causal_attention(d_qkv.get() + misalign, out.get(), T, H, hd, nullptr, kernel, {}, kv)));
        std::vector<uint16_t> got;
        CUDA_OK(out.download(got));
        for (size_t i = 0; i < got.size(); ++i) ASSERT_TRUE(std::isfinite(half_to_float(got[i]))) << "element " << i;
        std::vector<double> qkv_d(qkv.size() - misalign);
        for (size_t i = 0; i < qkv_d.size(); ++i) qkv_d[i] = half_to_float(qkv[misalign + i]);
        std::vector<int> rows = rows_in;
        if (rows.empty())
            for (int t = 0; t < T; ++t) rows.push_back(t);
        for (int t : rows) {
            const ReferenceRow ref = reference_attention(qkv_d, H, hd, t, kv);
            for (int i = 0; i < A; ++i) {
                const double g = half_to_float(got[static_cast<size_t>(t) * A + i]);
                const double bound = std::ldexp(std::fabs(ref.out[i]), -11) + (fp16_p ? ref.p_round[i] : 0.0) +
                                     1e-4 * ref.mag[i] + 1e-7;
                const double err = std::fabs(g - ref.out[i]);
                worst = std::max(worst, err / bound);
                ASSERT_LE(err, bound) << "out[" << t << "][head " << i / hd << ", dim " << i % hd << "] = " << g
                                      << ", reference " << ref.out[i] << ", mag " << ref.mag[i];
            }
        }
        EXPECT_TRUE(out.guard_intact() && d_qkv.guard_intact());
    }();
    return worst;
}

// Rows worth checking in a long sequence: the first tiles, both sides of tile edges (32 and 64), the middle, the end.
std::vector<int> sample_rows(int T) {
    std::vector<int> rows;
    for (int t : {0, 1, 15, 16, 31, 32, 63, 64, 65, 127, 128, 129, T / 2 - 1, T / 2, T - 129, T - 128, T - 65, T - 64,
                  T - 33, T - 2, T - 1})
        if (t >= 0 && t < T && std::find(rows.begin(), rows.end(), t) == rows.end()) rows.push_back(t);
    return rows;
}

TEST(Kernels, Attention) {
    // Auto dispatch. (heads, head_dim): tensor cores (64, 128); SIMT with one dimension pair per lane (16), three
    // (96: the SIMT fallback for a tensor-core-sized but unsupported head_dim), four (256, > 48 KB shared memory),
    // and head_dim = 10 (not a multiple of 4: padded dimensions).
    for (int T : {1, 7, 64, 300, 1024}) {
        for (auto [H, hd] : {std::pair{1, 64}, {4, 16}, {2, 128}, {3, 10}, {2, 96}, {1, 256}}) {
            check_attention(T, H, hd, {});
        }
    }
}

// The tensor-core kernels this device runs: the mma.sync one everywhere, the wgmma one on compute capability 9.0
// where the library holds it.
std::vector<tl::gpu::AttentionKernel> tensor_core_attention_kernels() {
    std::vector<tl::gpu::AttentionKernel> kernels = {tl::gpu::AttentionKernel::TensorCore};
    int device = 0, major = 0, minor = 0;
    if (tl::gpu::attention_wgmma_built() && cudaGetDevice(&device) == cudaSuccess &&
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess &&
        major * 10 + minor == 90) {
        kernels.push_back(tl::gpu::AttentionKernel::Wgmma);
    }
    return kernels;
}

TEST(Kernels, AttentionTensorCore) {
    // Every T around the 16-row warp tiles and the 64- and 128-row block tiles; H = 16 (the 2B preset) up to T = 200
    // here, T = 1024 in AttentionLong (kept out of the sanitizer runs).
    for (auto kernel : tensor_core_attention_kernels()) {
        double worst = 0.0;
        for (int hd : {64, 128}) {
            for (int T : {1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 200, 255, 256, 257, 1024}) {
                for (int H : {1, 3, 16}) {
                    if (H == 16 && T > 200) continue;
                    worst = std::max(worst, check_attention(T, H, hd, {}, kernel));
                    if (HasFatalFailure()) return;
                }
            }
        }
        std::printf("tensor-core attention (kernel %d): largest error / bound %.3f\n", static_cast<int>(kernel),
                    worst);
    }
}

TEST(Kernels, AttentionSimt) {
    // The SIMT kernel on the head_dims Auto sends to the tensor cores: by request, and by Auto when qkv is only
    // 4-byte aligned (misalign 2 halves).
    double worst = 0.0;
    for (int hd : {64, 128}) {
        for (int T : {1, 33, 65, 300}) {
            for (int H : {1, 3}) {
                worst = std::max(worst, check_attention(T, H, hd, {}, tl::gpu::AttentionKernel::Simt));
                worst = std::max(worst, check_attention(T, H, hd, {}, tl::gpu::AttentionKernel::Auto, 2));
                if (HasFatalFailure()) return;
            }
        }
    }
    std::printf("SIMT attention: largest error / bound %.3f\n", worst);
}

// Grouped-query attention on both kernels: 8 query heads over 4, 2 and 1 K/V heads (and 6 over 3, hd 16), read in
// place. A kernel that read K/V head h instead of h / group would be caught by the reference's O(1) difference.
TEST(Kernels, AttentionGrouped) {
    double worst = 0.0;
    std::vector<tl::gpu::AttentionKernel> kernels = tensor_core_attention_kernels();
    kernels.push_back(tl::gpu::AttentionKernel::Simt);
    for (auto kernel : kernels) {
        for (int hd : {64, 128}) {
            for (int kv : {4, 2, 1}) {
                for (int T : {1, 65, 300}) {
                    worst = std::max(worst, check_attention(T, 8, hd, {}, kernel, 0, kv));
                    if (HasFatalFailure()) return;
                }
            }
        }
    }
    worst = std::max(worst, check_attention(130, 6, 16, {}, tl::gpu::AttentionKernel::Auto, 0, 3));
    std::printf("grouped-query attention: largest error / bound %.3f\n", worst);
    DeviceArray<uint16_t> buf(3 * 512);
    EXPECT_LT(tl::gpu::causal_attention(buf.get(), buf.get() + 2 * 64 * 3, 1, 3, 64, nullptr,
                                        tl::gpu::AttentionKernel::Auto, {}, 2),
              0)
        << "3 query heads over 2 K/V heads";
}

// RoPE with grouped K/V heads: the n_heads query heads and the n_kv_heads key heads of each row rotate, the value heads
// stay as they are.
TEST(Kernels, RopeGrouped) {
    const int T = 37, H = 8, KV = 2, hd = 64, half = hd / 2, W = (H + 2 * KV) * hd;
    const std::vector<uint16_t> qkv = random_half(static_cast<size_t>(T) * W, 1.0);
    std::vector<float> cos_table, sin_table;
    tl::rope_tables(T, hd, 10000.0f, cos_table, sin_table);
    DeviceArray<uint16_t> d_qkv(qkv.size());
    DeviceArray<float> d_cos(cos_table.size()), d_sin(sin_table.size());
    ASSERT_TRUE(upload_guarded(d_qkv, qkv) && upload_guarded(d_cos, cos_table) && upload_guarded(d_sin, sin_table));
    ASSERT_TRUE(launched(tl::gpu::rope_qk(d_qkv.get(), d_cos.get(), d_sin.get(), T, H, hd, nullptr, nullptr, KV)));
    std::vector<uint16_t> got;
    CUDA_OK(d_qkv.download(got));
    for (int t = 0; t < T; ++t) {
        for (int head = 0; head < H + 2 * KV; ++head) {
            const size_t base = static_cast<size_t>(t) * W + static_cast<size_t>(head) * hd;
            for (int i = 0; i < half; ++i) {
                const size_t ia = base + i, ib = base + i + half;
                if (head >= H + KV) {  // a value head
                    ASSERT_EQ(got[ia], qkv[ia]) << "t " << t << " head " << head;
                    ASSERT_EQ(got[ib], qkv[ib]) << "t " << t << " head " << head;
                    continue;
                }
                const double cs = cos_table[static_cast<size_t>(t) * half + i];
                const double sn = sin_table[static_cast<size_t>(t) * half + i];
                const double a = half_to_float(qkv[ia]), b = half_to_float(qkv[ib]);
                const double ref_a = a * cs - b * sn, ref_b = a * sn + b * cs;
                const double slack = 1e-6 * (std::fabs(a) + std::fabs(b)) + 1e-7;
                ASSERT_LE(std::fabs(half_to_float(got[ia]) - ref_a), kHalfTol * std::fabs(ref_a) + slack)
                    << "t " << t << " head " << head << " i " << i;
                ASSERT_LE(std::fabs(half_to_float(got[ib]) - ref_b), kHalfTol * std::fabs(ref_b) + slack)
                    << "t " << t << " head " << head << " i " << i + half;
            }
        }
    }
    EXPECT_TRUE(d_qkv.guard_intact());
    EXPECT_LT(tl::gpu::rope_qk(d_qkv.get(), d_cos.get(), d_sin.get(), T, H, hd, nullptr, nullptr, 3), 0);
}

// Packed sequences: each sequence's rows must equal the FP64 reference of that sequence alone (attention never
// crosses a sequence boundary), on every kernel, with sequences shorter, equal to and longer than a tile. Where
// `inf_sequence` names one, its keys and values are all +Inf: no other sequence may see them (a kernel that reads
// a neighbour's rows into a tile, even masked, must not let 0 * Inf reach its products).
void check_segments(const std::vector<int32_t> &lengths, int inf_sequence) {
    std::vector<int32_t> offsets = {0};
    for (int32_t len : lengths) offsets.push_back(offsets.back() + len);
    const int T = offsets.back();
    const int max_len = *std::max_element(lengths.begin(), lengths.end());
    std::vector<tl::gpu::AttentionKernel> kernels = tensor_core_attention_kernels();
    kernels.push_back(tl::gpu::AttentionKernel::Simt);
    for (auto kernel : kernels) {
        for (auto [H, hd] : {std::pair{2, 64}, {3, 128}, {2, 16}}) {
            if (kernel != tl::gpu::AttentionKernel::Simt && hd == 16) continue;
            SCOPED_TRACE("kernel " + std::to_string(static_cast<int>(kernel)) + " H=" + std::to_string(H) +
                         " hd=" + std::to_string(hd) + " inf_sequence " + std::to_string(inf_sequence));
            const int A = H * hd;
            std::vector<uint16_t> qkv(static_cast<size_t>(T) * 3 * A);
            std::normal_distribution<float> q_dist(0.0f, 2.0f), kv_dist(0.0f, 1.0f);
            for (int t = 0; t < T; ++t)
                for (int i = 0; i < 3 * A; ++i)
                    qkv[static_cast<size_t>(t) * 3 * A + i] = float_to_half(i < A ? q_dist(rng()) : kv_dist(rng()));
            if (inf_sequence >= 0) {
                for (int t = offsets[inf_sequence]; t < offsets[inf_sequence + 1]; ++t)
                    for (int i = A; i < 3 * A; ++i) qkv[static_cast<size_t>(t) * 3 * A + i] = 0x7C00;  // +Inf
            }
            DeviceArray<uint16_t> d_qkv(qkv.size()), out(static_cast<size_t>(T) * A);
            DeviceArray<int32_t> d_offsets(offsets.size());
            ASSERT_TRUE(upload_guarded(d_qkv, qkv) && upload_guarded(d_offsets, offsets) && out.ok());
            CUDA_OK(out.poison(0xFF));  // FP16 NaN
            const tl::gpu::Segments segments{d_offsets.get(), static_cast<int>(lengths.size()), max_len};
            ASSERT_TRUE(launched(tl::gpu::causal_attention(d_qkv.get(), out.get(), T, H, hd, nullptr, kernel, segments)));
            std::vector<uint16_t> got;
            CUDA_OK(out.download(got));
            const bool fp16_p = kernel != tl::gpu::AttentionKernel::Simt;
            for (size_t s = 0; s < lengths.size(); ++s) {
                if (static_cast<int>(s) == inf_sequence) continue;
                const size_t first = static_cast<size_t>(offsets[s]);
                std::vector<double> seq(static_cast<size_t>(lengths[s]) * 3 * A);
                for (size_t i = 0; i < seq.size(); ++i) seq[i] = half_to_float(qkv[first * 3 * A + i]);
                for (int t = 0; t < lengths[s]; ++t) {
                    const ReferenceRow ref = reference_attention(seq, H, hd, t);
                    for (int i = 0; i < A; ++i) {
                        const double g = half_to_float(got[(first + t) * A + i]);
                        const double bound = std::ldexp(std::fabs(ref.out[i]), -11) + (fp16_p ? ref.p_round[i] : 0.0) +
                                             1e-4 * ref.mag[i] + 1e-7;
                        ASSERT_LE(std::fabs(g - ref.out[i]), bound)
                            << "sequence " << s << " row " << t << " element " << i << ": " << g << " vs " << ref.out[i];
                    }
                }
            }
            EXPECT_TRUE(out.guard_intact() && d_qkv.guard_intact());
        }
    }
}

TEST(Kernels, AttentionSegments) { check_segments({1, 17, 64, 65, 130, 3, 2, 200}, -1); }

// The sequence after a short one (and one inside a 128-row tile of its predecessor) holds Inf keys and values.
TEST(Kernels, AttentionSegmentsIsolateNonFinite) {
    check_segments({100, 40, 130, 3, 200}, 1);
    check_segments({100, 40, 130, 3, 200}, 4);
}

// Information for the notes, not a check: each kernel's time on one shape (median of 5 timings of 5 launches) and
// the TFLOPS it implies for the causal products' useful FLOPs, 4 L (L + 1) / 2 H hd per sequence of L rows. `lengths`:
// the packed sequences (one: a plain call). Inputs are a constant pattern (the time does not depend on the values).
void time_attention(const std::vector<int> &lengths, int H, int hd, const std::string &label) {
    std::vector<int32_t> offsets = {0};
    double flops = 0.0;
    for (int len : lengths) {
        offsets.push_back(offsets.back() + len);
        flops += 4.0 * len * (len + 1.0) / 2.0 * H * hd;
    }
    const int T = offsets.back();
    DeviceArray<uint16_t> qkv(static_cast<size_t>(T) * 3 * H * hd), out(static_cast<size_t>(T) * H * hd);
    DeviceArray<int32_t> d_offsets(offsets.size());
    ASSERT_TRUE(qkv.ok() && out.ok() && upload_guarded(d_offsets, offsets));
    CUDA_OK(qkv.poison(0x2E));  // FP16 0x2E2E ~ 0.1
    tl::gpu::Segments segments;
    if (lengths.size() > 1) {
        segments = {d_offsets.get(), static_cast<int>(lengths.size()), *std::max_element(lengths.begin(), lengths.end())};
    }
    cudaEvent_t start, stop;
    CUDA_OK(cudaEventCreate(&start));
    CUDA_OK(cudaEventCreate(&stop));
    std::vector<std::pair<tl::gpu::AttentionKernel, const char *>> kernels = {
        {tl::gpu::AttentionKernel::TensorCore, "tensor cores (mma.sync)"}, {tl::gpu::AttentionKernel::Simt, "SIMT"}};
    if (tensor_core_attention_kernels().size() > 1) kernels.insert(kernels.begin(), {tl::gpu::AttentionKernel::Wgmma, "wgmma"});
    for (auto [kernel, name] : kernels) {
        auto call = [&] {
            return tl::gpu::causal_attention(qkv.get(), out.get(), T, H, hd, nullptr, kernel, segments);
        };
        ASSERT_TRUE(launched(call()));  // warm-up
        std::vector<float> ms(5);
        for (float &m : ms) {
            CUDA_OK(cudaEventRecord(start));
            for (int i = 0; i < 5; ++i) ASSERT_EQ(0, call());
            CUDA_OK(cudaEventRecord(stop));
            CUDA_OK(cudaEventSynchronize(stop));
            CUDA_OK(cudaEventElapsedTime(&m, start, stop));
            m /= 5;
        }
        std::sort(ms.begin(), ms.end());
        std::printf("attention %s H=%d hd=%d, %s: %.3f ms per call, %.1f TFLOPS\n", label.c_str(), H, hd, name, ms[2],
                    flops / (ms[2] * 1e-3) / 1e12);
    }
    CUDA_OK(cudaEventDestroy(start));
    CUDA_OK(cudaEventDestroy(stop));
}

TEST(Kernels, AttentionLong) {
    // T = 4096 (the 2B preset's max_seq), the 2B preset's 16 heads at T = 1024 and 4096; the reference on a sample
    // of rows. Plus the SIMT kernel at T = 4096 (what Auto ran before the tensor-core kernel).
    double worst = 0.0;
    for (auto kernel : tensor_core_attention_kernels()) {
        for (int hd : {64, 128}) {
            worst = std::max(worst, check_attention(1024, 16, hd, sample_rows(1024), kernel));
            worst = std::max(worst, check_attention(4096, 16, hd, sample_rows(4096), kernel));
            if (HasFatalFailure()) return;
        }
    }
    std::printf("tensor-core attention, long: largest error / bound %.3f\n", worst);
    worst = check_attention(4096, 2, 128, sample_rows(4096), tl::gpu::AttentionKernel::Simt);
    std::printf("SIMT attention, long: largest error / bound %.3f\n", worst);
    if (HasFatalFailure()) return;
    time_attention({4096}, 16, 128, "T=4096");  // the 2B preset at max_seq
    time_attention({2048}, 16, 128, "T=2048");
    time_attention({1024}, 16, 128, "T=1024");
    time_attention({4096}, 4, 64, "T=4096");  // the demo preset's heads
    // FlashAttention-3's published setting: 16K tokens a call (batch x sequence), 16 heads of 128 (and 32 of 64).
    for (int T : {1024, 2048, 4096}) {
        time_attention(std::vector<int>(16384 / T, T), 16, 128, std::to_string(16384 / T) + " x " + std::to_string(T));
        time_attention(std::vector<int>(16384 / T, T), 32, 64, std::to_string(16384 / T) + " x " + std::to_string(T));
    }
    // Packed sequences as scoring makes them: 16-token windows, 512-token windows, documents of 100-2000 tokens.
    time_attention(std::vector<int>(64, 16), 16, 128, "64 x 16 rows");
    time_attention(std::vector<int>(8, 512), 16, 128, "8 x 512 rows");
    std::vector<int> docs;
    for (int i = 0; i < 24; ++i) docs.push_back(100 + (i * 1237) % 1901);  // 100 .. 2000, spread
    time_attention(docs, 16, 128, "24 documents of 100-2000 rows");
}

TEST(Kernels, AttentionRefusals) {
    EXPECT_EQ(tl::gpu::causal_attention(nullptr, nullptr, 1, 1, 64, nullptr), tl::gpu::kRcBadArgument);
    DeviceArray<uint16_t> buf(3 * 512);
    ASSERT_TRUE(buf.ok());
    EXPECT_EQ(tl::gpu::causal_attention(buf.get(), buf.get(), 1, 1, 7, nullptr), tl::gpu::kRcBadArgument);  // odd
    EXPECT_EQ(tl::gpu::causal_attention(buf.get(), buf.get(), 1, 1, 258, nullptr), tl::gpu::kRcUnsupported);
    // The tensor-core kernel by request where it does not apply: head_dim 96, qkv not 16-byte aligned.
    EXPECT_EQ(tl::gpu::causal_attention(buf.get(), buf.get() + 3 * 96, 1, 1, 96, nullptr,
                                        tl::gpu::AttentionKernel::TensorCore),
              tl::gpu::kRcUnsupported);
    EXPECT_EQ(tl::gpu::causal_attention(buf.get() + 2, buf.get() + 3 * 128, 1, 1, 64, nullptr,
                                        tl::gpu::AttentionKernel::TensorCore),
              tl::gpu::kRcUnsupported);
    EXPECT_EQ(tl::gpu::causal_attention(buf.get(), buf.get() + 3 * 96, 1, 1, 96, nullptr,
                                        tl::gpu::AttentionKernel::Wgmma),
              tl::gpu::kRcUnsupported);
    EXPECT_EQ(tl::gpu::causal_attention(buf.get(), buf.get() + 3 * 64, 1, 1, 64, nullptr,
                                        static_cast<tl::gpu::AttentionKernel>(7)),
              tl::gpu::kRcBadArgument);
    // Segments: a count without offsets, too many, a longest sequence of 0 or past T.
    const auto auto_kernel = tl::gpu::AttentionKernel::Auto;
    const int32_t *offsets = reinterpret_cast<const int32_t *>(buf.get());
    for (const tl::gpu::Segments bad : {tl::gpu::Segments{nullptr, 2, 1}, tl::gpu::Segments{offsets, 0, 1},
                                        tl::gpu::Segments{offsets, tl::gpu::kMaxSegments + 1, 1},
                                        tl::gpu::Segments{offsets, 1, 0}, tl::gpu::Segments{offsets, 1, 2}}) {
        EXPECT_EQ(tl::gpu::causal_attention(buf.get(), buf.get() + 3 * 64, 1, 1, 64, nullptr, auto_kernel, bad),
                  tl::gpu::kRcBadArgument);
    }
}

// ---- Bias -----------------------------------------------------------------------------------------------------

// y = fp16(y + bias) per row: one FP32 add and one rounding, so within half an FP16 ulp of the exact sum. Odd N
// and a misaligned y take the scalar kernel, even N the half2 one.
TEST(Kernels, Bias) {
    for (auto [rows, n, offset] : {std::tuple{1, 2, 0}, {7, 192, 0}, {33, 4608, 0}, {5, 97, 0}, {6, 64, 1}}) {
        SCOPED_TRACE("rows=" + std::to_string(rows) + " n=" + std::to_string(n) + " offset=" + std::to_string(offset));
        const size_t count = static_cast<size_t>(rows) * n;
        const std::vector<uint16_t> y = random_half(count + offset, 1.0);
        const std::vector<float> bias = random_float(n, 0.0, 0.5);
        DeviceArray<uint16_t> yd(count + offset);
        DeviceArray<float> bd(n);
        ASSERT_TRUE(upload_guarded(yd, y) && upload_guarded(bd, bias));
        ASSERT_TRUE(launched(tl::gpu::add_bias(yd.get() + offset, bd.get(), rows, n, nullptr)));
        std::vector<uint16_t> got;
        CUDA_OK(yd.download(got));
        for (int i = 0; i < offset; ++i) ASSERT_EQ(got[i], y[i]) << "wrote before y";
        for (size_t i = 0; i < count; ++i) {
            const double ref = static_cast<double>(half_to_float(y[offset + i])) + bias[i % n];
            const double g = half_to_float(got[offset + i]);
            ASSERT_LE(std::fabs(g - ref), kHalfTol * std::fabs(ref) + 1e-7) << "y[" << i / n << "][" << i % n << "]";
        }
        EXPECT_TRUE(yd.guard_intact() && bd.guard_intact());
    }
    DeviceArray<uint16_t> yd(8);
    DeviceArray<float> bd(8);
    EXPECT_LT(tl::gpu::add_bias(nullptr, bd.get(), 1, 8, nullptr), 0);
    EXPECT_LT(tl::gpu::add_bias(yd.get(), nullptr, 1, 8, nullptr), 0);
    EXPECT_LT(tl::gpu::add_bias(yd.get(), bd.get(), 0, 8, nullptr), 0);
}

// ---- SwiGLU ---------------------------------------------------------------------------------------------------

TEST(Kernels, Swiglu) {
    for (auto [T, F] : {std::pair{1, 1}, {9, 100}, {130, 1024}}) {
        for (bool fused : {true, false}) {
            SCOPED_TRACE("T=" + std::to_string(T) + " F=" + std::to_string(F) + (fused ? " fused" : " separate"));
            const size_t n = static_cast<size_t>(T) * F;
            // fused: one [T][2F] array, gate = columns [0, F), up = [F, 2F); separate: two [T][F] arrays.
            std::vector<uint16_t> gate = random_half(fused ? 2 * n : n, 3.0);
            const std::vector<uint16_t> up_values = random_half(n, 1.0);
            gate[0] = float_to_half(-100.0f);  // e^100 overflows FP32: silu must still be (-)0
            if (n > 2) {
                gate[1] = float_to_half(30.0f);
                gate[2] = float_to_half(-20.0f);
            }
            const int ld = fused ? 2 * F : F;
            std::vector<uint16_t> up;
            if (fused) {
                for (int t = 0; t < T; ++t)
                    for (int j = 0; j < F; ++j) gate[static_cast<size_t>(t) * ld + F + j] = up_values[static_cast<size_t>(t) * F + j];
            } else {
                up = up_values;
            }
            DeviceArray<uint16_t> d_gate(gate.size()), d_up(std::max<size_t>(up.size(), 1)), h(n);
            ASSERT_TRUE(upload_guarded(d_gate, gate) && (fused || upload_guarded(d_up, up)) && h.ok());
            CUDA_OK(h.poison(0xFF));
            const uint16_t *up_ptr = fused ? d_gate.get() + F : d_up.get();
            ASSERT_TRUE(launched(tl::gpu::swiglu(d_gate.get(), up_ptr, ld, h.get(), T, F, nullptr)));
            std::vector<uint16_t> got;
            CUDA_OK(h.download(got));
            for (int t = 0; t < T; ++t) {
                for (int j = 0; j < F; ++j) {
                    const double g = half_to_float(gate[static_cast<size_t>(t) * ld + j]);
                    const double u = half_to_float(up_values[static_cast<size_t>(t) * F + j]);
                    const double ref = g / (1.0 + std::exp(-g)) * u;
                    const double v = half_to_float(got[static_cast<size_t>(t) * F + j]);
                    ASSERT_LE(std::fabs(v - ref), kHalfTol * std::fabs(ref) + 1e-6 * std::fabs(g * u) + 1e-7)
                        << "h[" << t << "][" << j << "] = " << v << ", g " << g << ", u " << u;
                }
            }
            EXPECT_TRUE(h.guard_intact() && d_gate.guard_intact());
        }
    }
}

// ---- INT8 inputs written by the norm and SwiGLU -----------------------------------------------------------------

// The fused forms against the unfused kernels followed by quantize_rows_int8: the same codes, scales and sums, bit for
// bit, on rows with a zero row, a huge value and a NaN among them.
struct Int8Rows {
    std::vector<int8_t> codes;
    std::vector<float> scales;
    std::vector<int32_t> sums;
};
Int8Rows download_int8(DeviceArray<int8_t> &codes, DeviceArray<float> &scales, DeviceArray<int32_t> &sums) {
    Int8Rows r;
    EXPECT_EQ(cudaSuccess, codes.download(r.codes));
    EXPECT_EQ(cudaSuccess, scales.download(r.scales));
    EXPECT_EQ(cudaSuccess, sums.download(r.sums));
    return r;
}

::testing::AssertionResult same_int8(const Int8Rows &got, const Int8Rows &want) {
    for (size_t t = 0; t < want.scales.size(); ++t) {
        const bool both_nan = std::isnan(got.scales[t]) && std::isnan(want.scales[t]);
        if (!both_nan && got.scales[t] != want.scales[t]) {
            return ::testing::AssertionFailure() << "scale of row " << t << ": " << got.scales[t] << " against "
                                                 << want.scales[t];
        }
        if (got.sums[t] != want.sums[t]) return ::testing::AssertionFailure() << "code sum of row " << t;
    }
    for (size_t i = 0; i < want.codes.size(); ++i) {
        if (got.codes[i] != want.codes[i]) return ::testing::AssertionFailure() << "code " << i;
    }
    return ::testing::AssertionSuccess();
}

// A fused producer's INT8 outputs for T rows of d values and the reference's (the unfused kernel's FP16 rows through
// quantize_rows_int8), poisoned, with group sums where d takes groups of 128 (else 32, else none) as grouped INT4
// weights need them; check() compares the two, and the group sums with the codes summed on the host.
struct Int8Outputs {
    Int8Outputs(int rows, int width)
        : T(rows), d(width), n(static_cast<size_t>(rows) * width),
          group(width % 128 == 0 ? 128 : width % 32 == 0 ? 32 : 0),
          n_group_sums(group > 0 ? static_cast<size_t>(width / group) * tl::gpu::int8_group_sums_ld(rows) : 1),
          codes(n), want_codes(n), scales(rows), want_scales(rows), sums(rows), want_sums(rows),
          group_sums(n_group_sums), want_group_sums(n_group_sums) {}

    ::testing::AssertionResult poison() {
        for (cudaError_t e : {codes.poison(0x7F), want_codes.poison(0x7F), scales.poison(0xFF), sums.poison(0xFF),
                              group_sums.poison(0xFF)}) {
            if (e != cudaSuccess) return ::testing::AssertionFailure() << cudaGetErrorString(e);
        }
        return ::testing::AssertionSuccess();
    }
    float *fused_group_sums() { return group > 0 ? group_sums.get() : nullptr; }
    int quantize_reference(const uint16_t *rows) {
        return tl::gpu::quantize_rows_int8(rows, T, d, want_codes.get(), want_scales.get(), nullptr, want_sums.get(),
                                           group > 0 ? want_group_sums.get() : nullptr, group);
    }
    void check() {
        ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
        const Int8Rows fused = download_int8(codes, scales, sums);
        EXPECT_TRUE(same_int8(fused, download_int8(want_codes, want_scales, want_sums)));
        if (group > 0) {
            EXPECT_TRUE(group_sums_match(fused.codes));
        }
        EXPECT_TRUE(codes.guard_intact() && scales.guard_intact() && sums.guard_intact() && group_sums.guard_intact());
    }

    const int T, d;
    const size_t n;
    const int group;
    const size_t n_group_sums;
    DeviceArray<int8_t> codes, want_codes;
    DeviceArray<float> scales, want_scales;
    DeviceArray<int32_t> sums, want_sums;
    DeviceArray<float> group_sums, want_group_sums;

private:
    // [d / group][int8_group_sums_ld(T)], as the producers write them.
    ::testing::AssertionResult group_sums_match(const std::vector<int8_t> &row_codes) {
        std::vector<float> g, w;
        if (group_sums.download(g) != cudaSuccess || want_group_sums.download(w) != cudaSuccess) {
            return ::testing::AssertionFailure() << "download of the group sums";
        }
        const size_t ld = static_cast<size_t>(tl::gpu::int8_group_sums_ld(T));
        for (int t = 0; t < T; ++t) {
            for (int q = 0; q < d / group; ++q) {
                int32_t sum = 0;
                for (int i = 0; i < group; ++i) sum += row_codes[static_cast<size_t>(t) * d + q * group + i];
                const size_t at = q * ld + t;
                if (g[at] != static_cast<float>(sum) || w[at] != static_cast<float>(sum)) {
                    return ::testing::AssertionFailure() << "group " << q << " of row " << t << ": " << g[at]
                                                         << " and " << w[at] << " against " << sum;
                }
            }
        }
        return ::testing::AssertionSuccess();
    }
};

TEST(Kernels, RmsNormInt8EqualsRmsNormThenQuantization) {
    const float eps = 1e-5f;
    for (auto [T, d] : {std::pair{1, 64}, {5, 300}, {33, 2048}, {3, 8192}}) {
        SCOPED_TRACE("T=" + std::to_string(T) + " d=" + std::to_string(d));
        const size_t n = static_cast<size_t>(T) * d;
        std::vector<float> x = random_float(n, 0.0, 2.0);
        if (T >= 3) {
            std::fill_n(x.begin() + d, d, 0.0f);  // row 1: zeros
            x[2 * static_cast<size_t>(d)] = NAN;  // row 2: a NaN
        }
        const std::vector<uint16_t> add = random_half(n, 1.0);
        const std::vector<float> gain = random_float(d, 1.0, 0.1);
        DeviceArray<float> x_fused(n), x_plain(n), gd(d);
        DeviceArray<uint16_t> ad(n), y_fused(n), y_plain(n);
        Int8Outputs q(T, d);
        ASSERT_TRUE(upload_guarded(x_fused, x) && upload_guarded(x_plain, x) && upload_guarded(gd, gain) &&
                    upload_guarded(ad, add));
        ASSERT_TRUE(q.poison());
        CUDA_OK(y_fused.poison(0xFF));
        ASSERT_TRUE(launched(tl::gpu::rmsnorm_residual_int8(x_fused.get(), ad.get(), gd.get(), y_fused.get(),
                                                            q.codes.get(), q.scales.get(), q.sums.get(), T, d, eps,
                                                            nullptr, q.fused_group_sums(), q.group)));
        ASSERT_TRUE(launched(tl::gpu::rmsnorm_residual(x_plain.get(), ad.get(), gd.get(), y_plain.get(), T, d, eps,
                                                       nullptr)));
        ASSERT_EQ(0, q.quantize_reference(y_plain.get()));
        q.check();
        std::vector<float> xf, xp;
        std::vector<uint16_t> yf, yp;
        CUDA_OK(x_fused.download(xf));
        CUDA_OK(x_plain.download(xp));
        CUDA_OK(y_fused.download(yf));
        CUDA_OK(y_plain.download(yp));
        EXPECT_EQ(0, std::memcmp(xf.data(), xp.data(), n * sizeof(float))) << "the residual stream differs";
        EXPECT_EQ(yf, yp) << "the FP16 rows differ";
    }
}

TEST(Kernels, SwigluInt8EqualsSwigluThenQuantization) {
    for (auto [T, F] : {std::pair{1, 1}, {9, 100}, {130, 1024}, {4, 8192}}) {
        SCOPED_TRACE("T=" + std::to_string(T) + " F=" + std::to_string(F));
        const size_t n = static_cast<size_t>(T) * F;
        std::vector<uint16_t> gate = random_half(2 * n, 3.0);  // one [T][2F] array, as the fused gate|up GEMM leaves it
        gate[0] = float_to_half(-100.0f);
        if (T >= 3) {
            for (int j = 0; j < F; ++j) gate[static_cast<size_t>(1) * 2 * F + j] = 0;  // row 1: zeros
            gate[static_cast<size_t>(2) * 2 * F] = 0x7E00;                          // row 2: a NaN
        }
        DeviceArray<uint16_t> d_gate(gate.size()), h(n);
        Int8Outputs q(T, F);
        ASSERT_TRUE(upload_guarded(d_gate, gate) && h.ok());
        ASSERT_TRUE(q.poison());
        const uint16_t *up = d_gate.get() + F;
        ASSERT_TRUE(launched(tl::gpu::swiglu_int8(d_gate.get(), up, 2 * F, q.codes.get(), q.scales.get(),
                                                  q.sums.get(), T, F, nullptr, q.fused_group_sums(), q.group)));
        ASSERT_TRUE(launched(tl::gpu::swiglu(d_gate.get(), up, 2 * F, h.get(), T, F, nullptr)));
        ASSERT_EQ(0, q.quantize_reference(h.get()));
        q.check();
    }
}

// ---- Head log-softmax NLL ---------------------------------------------------------------------------------------

TEST(Kernels, HeadNll) {
    const uint16_t kHuge = float_to_half(60000.0f);  // in a padding column it would dominate the softmax
    for (int V : {256, 50257}) {
        for (int rows : {1, 4, 37}) {
            for (bool padded : {false, true}) {
                const int ld = padded ? (V / 64 + 1) * 64 : V;  // at least one padding column
                SCOPED_TRACE("V=" + std::to_string(V) + " rows=" + std::to_string(rows) + " ld=" + std::to_string(ld));
                std::vector<uint16_t> logits = random_half(static_cast<size_t>(rows) * ld, 3.0);
                for (int r = 0; r < rows; ++r)
                    for (int v = V; v < ld; ++v) logits[static_cast<size_t>(r) * ld + v] = kHuge;
                std::uniform_int_distribution<int32_t> pick(0, V - 1);
                std::vector<int32_t> targets(rows);
                for (auto &t : targets) t = pick(rng());
                targets[0] = V - 1;
                if (rows > 1) targets[1] = 0;
                // Greedy rows: the target's logit made the row's largest (row 2), or tied with it (row 3).
                for (int r = 2; r < std::min(rows, 4); ++r) {
                    uint16_t *l = logits.data() + static_cast<size_t>(r) * ld;
                    const uint16_t top = *std::max_element(l, l + V, [](uint16_t a, uint16_t b) {
                        return half_to_float(a) < half_to_float(b);
                    });
                    l[targets[r]] = r == 2 ? float_to_half(half_to_float(top) + 1.0f) : top;
                }
                DeviceArray<uint16_t> d_logits(logits.size());
                DeviceArray<int32_t> d_targets(targets.size());
                DeviceArray<float> nll(rows);
                DeviceArray<uint8_t> greedy(rows);
                ASSERT_TRUE(upload_guarded(d_logits, logits) && upload_guarded(d_targets, targets) && nll.ok() &&
                            greedy.ok());
                CUDA_OK(nll.poison(0xFF));
                CUDA_OK(greedy.poison(0x7F));
                ASSERT_TRUE(launched(tl::gpu::head_nll(d_logits.get(), ld, rows, V, d_targets.get(), nll.get(),
                                                       nullptr, greedy.get())));
                std::vector<float> got;
                CUDA_OK(nll.download(got));
                std::vector<uint8_t> got_greedy;
                CUDA_OK(greedy.download(got_greedy));
                for (int r = 0; r < rows; ++r) {
                    const uint16_t *l = logits.data() + static_cast<size_t>(r) * ld;
                    double mx = -INFINITY;
                    for (int v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(half_to_float(l[v])));
                    double sum = 0.0;
                    for (int v = 0; v < V; ++v) sum += std::exp(half_to_float(l[v]) - mx);
                    const double ref = mx + std::log(sum) - half_to_float(l[targets[r]]);
                    ASSERT_LE(std::fabs(got[r] - ref), 1e-4 + 1e-6 * std::fabs(ref)) << "row " << r;
                    ASSERT_EQ(got_greedy[r], half_to_float(l[targets[r]]) >= mx ? 1 : 0) << "row " << r;
                    if (r == 2 || r == 3) {
                        ASSERT_EQ(got_greedy[r], 1) << "row " << r;
                    }
                }
                EXPECT_TRUE(nll.guard_intact() && greedy.guard_intact() && d_logits.guard_intact());
            }
        }
    }
}

TEST(Kernels, HeadNllInvalidTarget) {
    const int V = 300, rows = 2;
    const std::vector<uint16_t> logits = random_half(static_cast<size_t>(rows) * V, 1.0);
    const std::vector<int32_t> targets = {-1, V};
    DeviceArray<uint16_t> d_logits(logits.size());
    DeviceArray<int32_t> d_targets(targets.size());
    DeviceArray<float> nll(rows);
    ASSERT_TRUE(upload_guarded(d_logits, logits) && upload_guarded(d_targets, targets) && nll.ok());
    CUDA_OK(nll.poison(0));
    ASSERT_TRUE(launched(tl::gpu::head_nll(d_logits.get(), V, rows, V, d_targets.get(), nll.get(), nullptr)));
    std::vector<float> got;
    CUDA_OK(nll.download(got));
    EXPECT_TRUE(std::isnan(got[0]) && std::isnan(got[1]));
}

}  // namespace
