#include "cpu/act_quant.hpp"

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "quant/quant.hpp"
#include "util/error.hpp"
#include "util/half.hpp"

// The FP32 outer sums follow the documented order only if no multiply-add is fused (a build with FMA enabled would).
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TL_ACT_QUANT_AVX2 1
#endif

namespace tl {

namespace {

constexpr float kInt8Max = 127.0f;
constexpr float kE4m3Max = 448.0f;
// The largest K whose sums stay exact: INT4 codes x INT8 (15 * 127 * 2^20 < 2^31) and FP8 in double; a dense
// weight's INT8 x INT8 products (127 * 127 * 2^17 < 2^31).
constexpr int32_t kMaxQuantizedK = 1 << 20;
constexpr int32_t kMaxDenseK = 1 << 17;
constexpr int kRowBlock = 4;  // input rows sharing each load of a weight column

// The largest |x[k]|, or NaN when a value is Inf or NaN.
float row_abs_max(const float *x, int32_t k) {
    float m = 0.0f;
    bool finite = true;
    for (int32_t i = 0; i < k; ++i) {
        const float a = std::fabs(x[i]);
        finite = finite && a <= FLT_MAX;
        m = std::max(m, a);
    }
    return finite ? m : std::numeric_limits<float>::quiet_NaN();
}

// ---- Group sums of one weight column with up to kRowBlock input rows ----

// out[r * groups + g] = sum_{i in group g} w[i] * x_r[i] for r < rows, groups of gs. X = int8_t, Acc = int32_t: INT8
// activations, x_r = x + r * ldx. X = int16_t, Acc = int64_t: FP8 activations in units of 2^-9, each unit count
// u = 512 * hi + lo (hi in [-448, 448], lo in [0, 512)) stored as a row of k his then k los (ldx = 2k), so that both
// halves fit int16 multiply-adds.
template <class X, class Acc>
using GroupDotFn = void (*)(const int8_t *w, const X *x, size_t ldx, int rows, int32_t gs, int32_t groups, Acc *out);

template <class X, class Acc>
void group_dot_portable(const int8_t *w, const X *x, size_t ldx, int rows, int32_t gs, int32_t groups, Acc *out) {
    constexpr bool kSplit = sizeof(X) == 2;
    for (int r = 0; r < rows; ++r)
        for (int32_t g = 0; g < groups; ++g) {
            const int8_t *wg = w + static_cast<size_t>(g) * gs;
            const X *xg = x + r * ldx + static_cast<size_t>(g) * gs;
            Acc sum = 0;
            for (int32_t i = 0; i < gs; ++i) {
                const Acc value = kSplit ? 512 * static_cast<Acc>(xg[i]) + xg[i + ldx / 2] : static_cast<Acc>(xg[i]);
                sum += static_cast<Acc>(wg[i]) * value;
            }
            out[r * groups + g] = sum;
        }
}

// Kernel<R>::run for a run-time rows in [1, kRowBlock]: R accumulators of a compile-time count stay in registers.
template <template <int> class Kernel, class X, class Acc>
void dispatch_rows(const int8_t *w, const X *x, size_t ldx, int rows, int32_t gs, int32_t groups, Acc *out) {
    for (int32_t g = 0; g < groups; ++g) {
        const size_t at = static_cast<size_t>(g) * gs;
        switch (rows) {
            case 4: Kernel<4>::run(w + at, x + at, ldx, gs, out + g, groups); break;
            case 3: Kernel<3>::run(w + at, x + at, ldx, gs, out + g, groups); break;
            case 2: Kernel<2>::run(w + at, x + at, ldx, gs, out + g, groups); break;
            default: Kernel<1>::run(w + at, x + at, ldx, gs, out + g, groups); break;
        }
    }
}

#ifdef TL_ACT_QUANT_AVX2
__attribute__((target("avx2"))) inline int32_t hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

// out[r * stride] = sum_{i < len} w[i] * x[r * ldx + i], 32 byte products per step. maddubs multiplies unsigned by
// signed bytes: a dense weight's signed codes enter as |w| with x carrying w's sign (sign_epi8); INT4 codes (0..15)
// enter as they are. A pair's sum is at most 2 * 128 * 127 < 2^15 for signed codes (an INT8 weight's -128 enters as
// 128; x is never -128), so each step
// widens to int32 at once; 2 * 15 * 127 = 3810 for INT4 codes, so 8 steps (30480 < 2^15) add up in int16 first.
template <int R, bool kCodes>
struct DotBytesAvx2 {
    __attribute__((target("avx2"))) static void run(const int8_t *w, const int8_t *x, size_t ldx, int32_t len,
                                                    int32_t *out, int32_t stride) {
        constexpr int32_t kStepsInt16 = kCodes ? 8 : 1;
        const __m256i ones = _mm256_set1_epi16(1);
        __m256i acc[R];
        for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_si256();
        int32_t i = 0;
        while (i + 32 <= len) {
            const int32_t end = i + std::min<int32_t>((len - i) & ~31, 32 * kStepsInt16);
            __m256i acc16[R];
            for (int r = 0; r < R; ++r) acc16[r] = _mm256_setzero_si256();
            for (; i < end; i += 32) {
                const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(w + i));
                const __m256i wa = kCodes ? wv : _mm256_sign_epi8(wv, wv);
                for (int r = 0; r < R; ++r) {
                    __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(x + r * ldx + i));
                    if (!kCodes) xv = _mm256_sign_epi8(xv, wv);
                    acc16[r] = _mm256_add_epi16(acc16[r], _mm256_maddubs_epi16(wa, xv));
                }
            }
            for (int r = 0; r < R; ++r) acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(acc16[r], ones));
        }
        for (int r = 0; r < R; ++r) {
            int32_t sum = hsum_epi32(acc[r]);
            for (int32_t j = i; j < len; ++j) sum += static_cast<int32_t>(w[j]) * x[r * ldx + j];
            out[r * stride] = sum;
        }
    }
};
template <int R>
using DotInt8Avx2 = DotBytesAvx2<R, false>;
template <int R>
using DotCodesAvx2 = DotBytesAvx2<R, true>;
#endif

#ifdef TL_ACT_QUANT_AVX2
// FP8 with INT4 codes, in integers: sum w * (512 hi + lo) = 512 sum w hi + sum w lo, each by int16 multiply-adds (a
// pair's sum is at most 2 * 15 * 511 < 2^14) into int32 lanes, which add at most 2^16 pairs (K <= 2^20) and so stay
// below 2^30; lanes and halves are then added in int64, exact.
// The 8 int32 lanes of v as 4 int64 lanes (lane i + lane i + 4), and the sum of 4 int64 lanes.
__attribute__((target("avx2"))) inline __m256i widen_pairs(__m256i v) {
    return _mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(v)),
                            _mm256_cvtepi32_epi64(_mm256_extracti128_si256(v, 1)));
}
__attribute__((target("avx2"))) inline int64_t hsum_epi64(__m256i v) {
    const __m128i s = _mm_add_epi64(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    return _mm_cvtsi128_si64(s) + _mm_extract_epi64(s, 1);
}

template <int R>
struct DotFp8Avx2 {
    __attribute__((target("avx2"))) static void run(const int8_t *w, const int16_t *x, size_t ldx, int32_t len,
                                                    int64_t *out, int32_t stride) {
        const int16_t *lo = x + ldx / 2;
        __m256i acc_hi[R], acc_lo[R];
        for (int r = 0; r < R; ++r) acc_hi[r] = acc_lo[r] = _mm256_setzero_si256();
        int32_t i = 0;
        for (; i + 16 <= len; i += 16) {
            const __m256i wv = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i *>(w + i)));
            for (int r = 0; r < R; ++r) {
                const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(x + r * ldx + i));
                const __m256i l = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(lo + r * ldx + i));
                acc_hi[r] = _mm256_add_epi32(acc_hi[r], _mm256_madd_epi16(wv, h));
                acc_lo[r] = _mm256_add_epi32(acc_lo[r], _mm256_madd_epi16(wv, l));
            }
        }
        for (int r = 0; r < R; ++r) {
            int64_t sum = hsum_epi64(_mm256_add_epi64(_mm256_slli_epi64(widen_pairs(acc_hi[r]), 9),
                                                      widen_pairs(acc_lo[r])));
            for (int32_t j = i; j < len; ++j) {
                sum += static_cast<int64_t>(w[j]) * (512 * x[r * ldx + j] + lo[r * ldx + j]);
            }
            out[r * stride] = sum;
        }
    }
};
#endif

// FP8 with a dense weight's e4m3 values: out[r] = sum_i w[i] * x[r * ldx + i], each sum exact in double (every
// product is a multiple of 2^-18 below 2^18 and there are at most 2^17 of them, kMaxDenseK), so the order of the
// additions does not matter.
void dot_fp8_dense(const float *w, const float *x, size_t ldx, int rows, int32_t len, double *out) {
    for (int r = 0; r < rows; ++r) {
        const float *xr = x + r * ldx;
        double s[4] = {0, 0, 0, 0};
        int32_t i = 0;
        for (; i + 4 <= len; i += 4)
            for (int j = 0; j < 4; ++j) s[j] += static_cast<double>(w[i + j]) * xr[i + j];
        for (; i < len; ++i) s[0] += static_cast<double>(w[i]) * xr[i];
        out[r] = (s[0] + s[1]) + (s[2] + s[3]);
    }
}

std::atomic<bool> g_portable{false};

bool cpu_has_avx2() {
#ifdef TL_ACT_QUANT_AVX2
    static const bool avx2 = [] {
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") != 0;
    }();
    return avx2 && !g_portable.load(std::memory_order_relaxed);
#else
    return false;
#endif
}

#ifdef TL_ACT_QUANT_AVX2
// q[i] = clamp(round_half_even(x[i] / s), -127, 127) for the first multiple of 8 of k values; returns how many. The
// division is IEEE's like the scalar one, and the rounding the instruction's own (to nearest even, whatever the
// environment's mode), so the codes are the same bits.
__attribute__((target("avx2"))) int32_t quantize_int8_avx2(const float *x, int32_t k, float s, int8_t *q) {
    const __m256 scale = _mm256_set1_ps(s), hi = _mm256_set1_ps(kInt8Max), lo = _mm256_set1_ps(-kInt8Max);
    int32_t i = 0;
    for (; i + 8 <= k; i += 8) {
        __m256 v = _mm256_div_ps(_mm256_loadu_ps(x + i), scale);
        v = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
        alignas(32) int32_t lanes[8];
        _mm256_store_si256(reinterpret_cast<__m256i *>(lanes), _mm256_cvttps_epi32(v));
        for (int j = 0; j < 8; ++j) q[i + j] = static_cast<int8_t>(lanes[j]);
    }
    return i;
}
#endif

// `codes`: the weight is INT4 codes (0..15), else signed INT8 codes (a dense weight's, or an INT8 weight's, -128
// included: the kernel's |w| is unsigned).
GroupDotFn<int8_t, int32_t> group_dot_int8(bool codes) {
#ifdef TL_ACT_QUANT_AVX2
    if (cpu_has_avx2()) {
        return codes ? &dispatch_rows<DotCodesAvx2, int8_t, int32_t> : &dispatch_rows<DotInt8Avx2, int8_t, int32_t>;
    }
#else
    (void)codes;
#endif
    return &group_dot_portable<int8_t, int32_t>;
}

GroupDotFn<int16_t, int64_t> group_dot_fp8() {
#ifdef TL_ACT_QUANT_AVX2
    if (cpu_has_avx2()) return &dispatch_rows<DotFp8Avx2, int16_t, int64_t>;
#endif
    return &group_dot_portable<int16_t, int64_t>;
}

// The weight's columns [n0, n1) as the integer path reads them: INT4 codes as int8 (or their values as floats for
// FP8), FP32 scales and zero offsets per group; a dense weight quantized per column with one group and z = 0.
void load_weight_tile(const Linear &w, ActivationMode mode, int32_t n0, int32_t n1, int32_t groups,
                      QuantTileScratch &t) {
    const size_t K = static_cast<size_t>(w.k), cols = static_cast<size_t>(n1 - n0);
    const bool fp8 = mode == ActivationMode::Fp8;
    t.scales.resize(cols * groups);
    t.zeros.resize(cols * groups);
    if (fp8 && !w.quantized) {
        t.values.resize(cols * K);
    } else {
        t.codes.resize(cols * K);
    }
    if (w.quantized && w.bits == 8) {  // INT8 codes as they are, z = 0
        for (size_t c = 0; c < cols; ++c) {
            const size_t n = n0 + c;
            std::memcpy(t.codes.data() + c * K, w.codes + n * K, K);
            for (int32_t g = 0; g < groups; ++g) {
                t.scales[c * groups + g] = half_to_float(w.scales[n * groups + g]);
                t.zeros[c * groups + g] = 0.0f;
            }
        }
        return;
    }
    if (w.quantized) {
        for (size_t c = 0; c < cols; ++c) {
            const size_t n = n0 + c;
            const uint8_t *bytes = w.codes + n * (K / 2);
            for (size_t i = 0; i < K / 2; ++i) {
                t.codes[c * K + 2 * i] = static_cast<int8_t>(bytes[i] & 0x0F);
                t.codes[c * K + 2 * i + 1] = static_cast<int8_t>(bytes[i] >> 4);
            }
            for (int32_t g = 0; g < groups; ++g) {
                t.scales[c * groups + g] = half_to_float(w.scales[n * groups + g]);
                t.zeros[c * groups + g] = half_to_float(w.zeros[n * groups + g]);
            }
        }
        return;
    }
    // Dense: W8A8's per-output-channel symmetric quantization of the weight, the activations' rule per column.
    std::vector<float> column(K);
    for (size_t c = 0; c < cols; ++c) {
        dequantize_rows(w, static_cast<int32_t>(n0 + c), static_cast<int32_t>(n0 + c + 1), column.data());
        t.scales[c] = fp8 ? quantize_row_fp8(column.data(), w.k, t.values.data() + c * K)
                          : quantize_row_int8(column.data(), w.k, t.codes.data() + c * K);
        t.zeros[c] = 0.0f;
    }
}

}  // namespace

// Both roundings run once per activation, so they avoid libm (floor, frexp and ldexp are calls on baseline x86-64):
// truncation to an integer and exponent bits are exact and independent of the rounding mode.
float round_half_even(float x) {
    if (!(std::fabs(x) < 8388608.0f)) return x;  // 2^23 and above: already an integer
    const int32_t t = static_cast<int32_t>(x);    // toward zero
    const float d = x - static_cast<float>(t);    // exact, in (-1, 1)
    int32_t r = t;
    if (d > 0.5f || (d == 0.5f && (t & 1) != 0)) ++r;
    if (d < -0.5f || (d == -0.5f && (t & 1) != 0)) --r;
    return static_cast<float>(r);
}

namespace {
// 2^k for -126 <= k <= 127.
float power_of_two(int k) {
    const uint32_t bits = static_cast<uint32_t>(k + 127) << 23;
    float p;
    std::memcpy(&p, &bits, sizeof p);
    return p;
}
}  // namespace

float round_to_e4m3(float v) {
    const float a = std::fabs(v);
    if (a >= kE4m3Max) return std::copysign(kE4m3Max, v);
    if (a == 0.0f) return 0.0f;
    uint32_t bits;
    std::memcpy(&bits, &a, sizeof bits);
    const int e = static_cast<int>(bits >> 23) - 127;  // a in [2^e, 2^(e+1)) (FP32 subnormals: e = -127)
    // 3 fraction bits: spacing 2^(e-3) in a normal binade, 2^-9 below 2^-6 (the subnormals). Scaling by powers of two
    // in this range is exact.
    const int spacing = std::max(e, -6) - 3;
    const float r = round_half_even(a * power_of_two(-spacing)) * power_of_two(spacing);
    return r == 0.0f ? 0.0f : std::copysign(r, v);
}

float quantize_row_int8(const float *x, int32_t k, int8_t *q) {
    const float s = row_abs_max(x, k) / kInt8Max;
    if (!(s > 0.0f)) {  // all zeros (or a maximum so small that s underflows), or Inf / NaN: no division at all
        std::fill(q, q + k, int8_t{0});
        return s;
    }
    int32_t i = 0;
#ifdef TL_ACT_QUANT_AVX2
    if (cpu_has_avx2()) i = quantize_int8_avx2(x, k, s, q);
#endif
    for (; i < k; ++i) q[i] = static_cast<int8_t>(std::clamp(round_half_even(x[i] / s), -kInt8Max, kInt8Max));
    return s;
}

float quantize_row_fp8(const float *x, int32_t k, float *e) {
    const float s = row_abs_max(x, k) / kE4m3Max;
    if (!(s > 0.0f)) {
        std::fill(e, e + k, 0.0f);
        return s;
    }
    for (int32_t i = 0; i < k; ++i) e[i] = round_to_e4m3(x[i] / s);
    return s;
}

void prepare_quantized_input(const Linear &w, int32_t rows, ActivationMode mode, QuantizedInput &in) {
    if (mode != ActivationMode::Int8 && mode != ActivationMode::Fp8) {
        fail(TL_ERR_INTERNAL, "prepare_quantized_input: activations " + std::string(activation_mode_name(mode)));
    }
    const bool int8_weight = w.quantized && w.bits == 8;
    // INT8 codes are not exact in e4m3 (which holds integers up to 16 only), so FP8 activations take INT4 and dense
    // weights.
    if (w.quantized && w.bits != 4 && !(int8_weight && mode == ActivationMode::Int8)) {
        fail(TL_ERR_UNSUPPORTED, "activations " + std::string(activation_mode_name(mode)) + ": " + w.name + " has " +
                                     std::to_string(w.bits) + "-bit weights; " +
                                     (int8_weight ? "FP8 activations take 4-bit or dense ones (INT8 codes are not "
                                                    "exact in e4m3)"
                                                  : "quantized activations take 4- and 8-bit ones"));
    }
    // INT8 codes reach -128: 128 * 127 * 2^17 < 2^31 too.
    const int32_t max_k = w.quantized && !int8_weight ? kMaxQuantizedK : kMaxDenseK;
    if (w.k > max_k) {
        fail(TL_ERR_UNSUPPORTED, "activations " + std::string(activation_mode_name(mode)) + ": " + w.name +
                                     " has K = " + std::to_string(w.k) + ", above " + std::to_string(max_k) +
                                     " (its integer sums could overflow)");
    }
    in.mode = mode;
    in.rows = rows;
    in.k = w.k;
    in.group_size = w.quantized ? w.group_size : w.k;
    in.groups = w.k / in.group_size;
    const size_t elements = static_cast<size_t>(rows) * w.k, sums = static_cast<size_t>(rows) * in.groups;
    in.scale.resize(rows);
    if (mode == ActivationMode::Int8) {
        in.q.resize(elements);
        in.group_sum.resize(sums);
    } else {
        in.e.resize(elements);
        in.e_units.resize(2 * elements);
        in.group_sum_f.resize(sums);
    }
}

void quantize_input_rows(const Linear &w, const float *x, int32_t r0, int32_t r1, QuantizedInput &in) {
    const size_t K = static_cast<size_t>(in.k);
    const int32_t gs = in.group_size;
    std::vector<float> permuted(w.k_perm != nullptr ? K : 0);
    for (int32_t r = r0; r < r1; ++r) {
        const float *row = x + r * K;
        if (w.k_perm != nullptr) {  // stored row kk multiplies input column k_perm[kk]
            for (size_t kk = 0; kk < K; ++kk) permuted[kk] = row[w.k_perm[kk]];
            row = permuted.data();
        }
        if (in.mode == ActivationMode::Int8) {
            int8_t *q = in.q.data() + r * K;
            in.scale[r] = quantize_row_int8(row, in.k, q);
            for (int32_t g = 0; g < in.groups; ++g) {
                int32_t sum = 0;
                for (int32_t i = g * gs; i < (g + 1) * gs; ++i) sum += q[i];
                in.group_sum[static_cast<size_t>(r) * in.groups + g] = sum;
            }
        } else {
            float *e = in.e.data() + r * K;
            in.scale[r] = quantize_row_fp8(row, in.k, e);
            int16_t *hi = in.e_units.data() + 2 * r * K, *lo = hi + K;
            for (size_t i = 0; i < K; ++i) {
                const int32_t units = static_cast<int32_t>(e[i] * 512.0f);  // exact
                hi[i] = static_cast<int16_t>(units >> 9);  // floor: lo = units - 512 * hi is in [0, 512)
                lo[i] = static_cast<int16_t>(units & 511);
            }
            for (int32_t g = 0; g < in.groups; ++g) {
                double sum = 0.0;  // exact: multiples of 2^-9 below 2^9, at most 2^20 of them
                for (int32_t i = g * gs; i < (g + 1) * gs; ++i) sum += e[i];
                in.group_sum_f[static_cast<size_t>(r) * in.groups + g] = static_cast<float>(sum);
            }
        }
    }
}

void quantized_input_tile(const Linear &w, const QuantizedInput &in, int32_t n0, int32_t n1, float *y, size_t ldy,
                          QuantTileScratch &t) {
    const int32_t G = in.groups, gs = in.group_size, cols = n1 - n0;
    const size_t K = static_cast<size_t>(in.k);
    const bool fp8 = in.mode == ActivationMode::Fp8;
    load_weight_tile(w, in.mode, n0, n1, G, t);
    const GroupDotFn<int8_t, int32_t> dot_int8 = group_dot_int8(w.quantized && w.bits == 4);
    const GroupDotFn<int16_t, int64_t> dot_fp8 = group_dot_fp8();
    const float *bias = w.bias_values();
    const size_t block = static_cast<size_t>(kRowBlock) * G;
    std::vector<float> dots(block);  // D[r][g] as FP32
    std::vector<int32_t> dots_i32(fp8 ? 0 : block);
    std::vector<int64_t> dots_i64(fp8 && w.quantized ? block : 0);
    for (int32_t m = 0; m < in.rows; m += kRowBlock) {
        const int rows = std::min(kRowBlock, in.rows - m);
        const size_t at = static_cast<size_t>(m) * K;
        for (int32_t c = 0; c < cols; ++c) {
            const size_t n_dots = static_cast<size_t>(rows) * G;
            if (fp8 && w.quantized) {  // D in units of 2^-9: rounding it to FP32 and scaling commute
                dot_fp8(t.codes.data() + c * K, in.e_units.data() + 2 * at, 2 * K, rows, gs, G, dots_i64.data());
                for (size_t i = 0; i < n_dots; ++i) dots[i] = static_cast<float>(dots_i64[i]) * 0x1p-9f;
            } else if (fp8) {  // dense: one group
                double d[kRowBlock];
                dot_fp8_dense(t.values.data() + c * K, in.e.data() + at, K, rows, gs, d);
                for (int r = 0; r < rows; ++r) dots[r] = static_cast<float>(d[r]);
            } else {
                dot_int8(t.codes.data() + c * K, in.q.data() + at, K, rows, gs, G, dots_i32.data());
                for (size_t i = 0; i < n_dots; ++i) dots[i] = static_cast<float>(dots_i32[i]);
            }
            const float *s = t.scales.data() + static_cast<size_t>(c) * G;
            const float *z = t.zeros.data() + static_cast<size_t>(c) * G;
            for (int r = 0; r < rows; ++r) {
                const size_t row = static_cast<size_t>(m + r);
                // The documented order: per group two fused multiply-adds into the row's total, s*D then z*S, each
                // rounded once; the token's scale last. -0 is the sum's identity: one group gives fl(s*D) exactly.
                float acc = -0.0f;
                for (int32_t g = 0; g < G; ++g) {
                    const float sum = fp8 ? in.group_sum_f[row * G + g] : static_cast<float>(in.group_sum[row * G + g]);
                    acc = std::fmaf(z[g], sum, std::fmaf(s[g], dots[r * G + g], acc));
                }
                float out = in.scale[row] * acc;
                if (bias != nullptr) out += bias[n0 + c];
                y[row * ldy + n0 + c] = out;
            }
        }
    }
}

void use_portable_act_quant_kernel(bool portable) { g_portable.store(portable, std::memory_order_relaxed); }

uint64_t act_quant_bytes(int32_t rows, int32_t k_max, int32_t workers, int32_t tile_cols) {
    const uint64_t K = static_cast<uint64_t>(k_max);
    // Per row: FP8's values and units (INT8's codes are smaller), its scale, and group sums (at most K / 2 groups).
    const uint64_t per_row = 8 * K + 4 + 4 * (K / 2);
    // Per worker: a tile's FP8 values (or codes), scales and zeros, and a dense column.
    const uint64_t per_worker = static_cast<uint64_t>(tile_cols) * (4 * K + 8 * (K / 2)) + 4 * K;
    return static_cast<uint64_t>(rows) * per_row + static_cast<uint64_t>(workers) * per_worker;
}

}  // namespace tl
