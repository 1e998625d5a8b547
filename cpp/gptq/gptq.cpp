#include "gptq/gptq.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <set>
#include <utility>

#include <Eigen/Cholesky>
#include <Eigen/Core>

#include "cpu/cpu_forward.hpp"
#include "quant/cross_iter.hpp"
#include "util/error.hpp"
#include "format/format.hpp"
#include "util/half.hpp"
#include "util/thread_pool.hpp"

namespace tl {

namespace {

using Matrix = Eigen::MatrixXd;  // column-major: a weight column (one input dimension, all n rows) is contiguous

constexpr int32_t kHessianChunk = 256;  // rows converted to double per update
constexpr int32_t kHessianStrip = 64;   // columns of H per task

}  // namespace

Hessian::Hessian(int32_t k) : k_(k) {
    if (k <= 0) fail(TL_ERR_INVALID_ARGUMENT, "Hessian: k = " + std::to_string(k) + " (need k > 0)");
    lower_.assign(static_cast<size_t>(k) * k, 0.0);
}

void Hessian::add(const float *x, int32_t rows, ThreadPool *pool) {
    if (rows < 0 || (rows > 0 && x == nullptr)) fail(TL_ERR_INVALID_ARGUMENT, "Hessian::add: bad rows or NULL x");
    Eigen::Map<Matrix> xtx(lower_.data(), k_, k_);
    const int32_t strips = (k_ + kHessianStrip - 1) / kHessianStrip;
    Matrix chunk;
    // One product per strip of columns of the lower triangle; parallel_for hands them out in order, widest first.
    const std::function<void(size_t, int32_t)> strip = [&](size_t i, int32_t) {
        const int32_t j0 = static_cast<int32_t>(i) * kHessianStrip, width = std::min(kHessianStrip, k_ - j0);
        xtx.block(j0, j0, k_ - j0, width).noalias() +=
            chunk.middleRows(j0, k_ - j0) * chunk.middleRows(j0, width).transpose();
    };
    for (int32_t r0 = 0; r0 < rows; r0 += kHessianChunk) {
        const int32_t count = std::min(kHessianChunk, rows - r0);
        // x is row-major [rows][k], so its rows are the columns of a column-major [k][rows] view.
        chunk = Eigen::Map<const Eigen::MatrixXf>(x + static_cast<size_t>(r0) * k_, k_, count).cast<double>();
        if (pool != nullptr) {
            pool->parallel_for(strips, strip);
        } else {
            for (int32_t i = 0; i < strips; ++i) strip(i, 0);
        }
    }
    rows_ += static_cast<uint64_t>(rows);
}

std::vector<double> Hessian::matrix() const {
    std::vector<double> h(lower_.size());
    Eigen::Map<Matrix> full(h.data(), k_, k_);
    full = 2.0 * Eigen::Map<const Matrix>(lower_.data(), k_, k_).selfadjointView<Eigen::Lower>();
    return h;
}

QuantizedMatrix quantize_gptq(const float *w, int32_t k, int32_t n, const double *h, const GptqOptions &options,
                              const std::string &name) {
    const std::string where = "quantize_gptq " + name + ": ";
    const int32_t bits = options.bits;
    if (bits != 4 && bits != 8) fail(TL_ERR_INVALID_ARGUMENT, where + "bits = " + std::to_string(bits) + " (4 or 8)");
    if (bits == 8 && options.method != QuantMethod::Symmetric) {
        fail(TL_ERR_INVALID_ARGUMENT, where + "INT8 weights are symmetric (W = q * s): the method must be symmetric");
    }
    const bool packed = bits == 4;  // INT4 packs two codes per byte: K and the group size must be even
    if (k <= 0 || n <= 0 || (packed && k % 2 != 0)) {
        fail(TL_ERR_INVALID_ARGUMENT, where + "shape k = " + std::to_string(k) + ", n = " + std::to_string(n) +
                                          " (need k > 0, even for INT4, and n > 0)");
    }
    const int32_t gs = options.group_size == 0 ? k : options.group_size;
    if (gs <= 0 || k % gs != 0 || (packed && gs % 2 != 0)) {
        fail(TL_ERR_INVALID_ARGUMENT, where + "group_size = " + std::to_string(options.group_size) +
                                          " is not a divisor of k = " + std::to_string(k) +
                                          (packed ? " (even for INT4)" : ""));
    }
    if (!(options.damp >= 0.0 && std::isfinite(options.damp)) || options.block_size <= 0) {
        fail(TL_ERR_INVALID_ARGUMENT, where + "damp = " + std::to_string(options.damp) + ", block_size = " +
                                          std::to_string(options.block_size) + " (need damp >= 0, block_size > 0)");
    }
    if (w == nullptr || h == nullptr) fail(TL_ERR_INVALID_ARGUMENT, where + "weights or Hessian are NULL");
    for (size_t i = 0; i < static_cast<size_t>(k) * k; ++i) {
        if (!std::isfinite(h[i])) {
            fail(TL_ERR_INVALID_ARGUMENT, where + "Hessian[" + std::to_string(i) + "] is not finite");
        }
    }

    // Column order: natural, or by decreasing H_ii (act-order), so the most active inputs are quantized first
    // while the most columns are left to absorb their error.
    std::vector<int32_t> order(k);
    std::iota(order.begin(), order.end(), 0);
    if (options.act_order) {
        std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
            return h[static_cast<size_t>(a) * k + a] > h[static_cast<size_t>(b) * k + b];
        });
    }
    Matrix W(n, k), H(k, k);  // both in processing order
    for (int32_t c = 0; c < k; ++c) {
        for (int32_t r = 0; r < n; ++r) W(r, c) = w[static_cast<size_t>(r) * k + order[c]];
        for (int32_t r = 0; r < k; ++r) H(r, c) = h[static_cast<size_t>(order[r]) * k + order[c]];
    }
    // An input that never fired has a zero row and column in H. A unit diagonal keeps H invertible without
    // coupling it to any other column: its weight is rounded plainly and still counts on text that does use it.
    for (int32_t c = 0; c < k; ++c) {
        if (H(c, c) == 0.0) H(c, c) = 1.0;
    }
    H.diagonal().array() += options.damp * H.diagonal().mean();

    // L = the lower Cholesky factor of H⁻¹, so Lᵀ is the upper factor GPTQ uses: row c of Lᵀ is column c of L.
    // Both factorizations run in place to keep the peak at two k x k matrices; only L's lower triangle is read
    // (the upper one keeps stale values of H⁻¹).
    Eigen::LLT<Eigen::Ref<Matrix>> h_factor(H);
    if (h_factor.info() != Eigen::Success) {
        fail(TL_ERR_INVALID_ARGUMENT, where + "the damped Hessian is not positive definite (raise damp, now " +
                                          std::to_string(options.damp) + ")");
    }
    Matrix L = Matrix::Identity(k, k);
    h_factor.solveInPlace(L);
    Eigen::LLT<Eigen::Ref<Matrix>> inv_factor(L);
    if (inv_factor.info() != Eigen::Success) {
        fail(TL_ERR_INVALID_ARGUMENT, where + "the inverse Hessian is not positive definite (raise damp, now " +
                                          std::to_string(options.damp) + ")");
    }

    QuantizedMatrix m;
    const int32_t groups = k / gs;
    if (options.act_order) {
        // Group parameters fixed up front from the weights as given, in natural order: the file stores no
        // column permutation, so a group must stay a run of gs consecutive inputs.
        m = quantize_minmax(w, k, n, options.group_size, options.method, bits);
        std::fill(m.codes.begin(), m.codes.end(), 0);
    } else {
        m.k = k, m.n = n, m.group_size = gs, m.bits = bits;
        m.codes.assign(static_cast<size_t>(n) * (packed ? k / 2 : k), 0);
        m.scales.resize(static_cast<size_t>(n) * groups);
        if (packed) m.zeros.resize(m.scales.size());
    }

    const int32_t B = options.block_size;
    Matrix errors(n, B);
    std::vector<float> group_values;
    for (int32_t i1 = 0; i1 < k;) {
        // A group's s and z are read from the weights when its first column comes up, so none of the group's
        // columns may then hold updates still pending in this block: a block holds whole groups, or starts
        // where a group starts.
        const int32_t i2 = gs <= B ? std::min(k, i1 + B / gs * gs) : std::min({k, i1 + B, (i1 / gs + 1) * gs});
        for (int32_t c = i1; c < i2; ++c) {
            if (!options.act_order && c % gs == 0) {
                group_values.resize(static_cast<size_t>(n) * gs);
                for (int32_t r = 0; r < n; ++r)
                    for (int32_t j = 0; j < gs; ++j) group_values[static_cast<size_t>(r) * gs + j] = W(r, c + j);
                const QuantizedMatrix group = quantize_minmax(group_values.data(), gs, n, gs, options.method, bits);
                for (int32_t r = 0; r < n; ++r) {
                    m.scales[static_cast<size_t>(r) * groups + c / gs] = group.scales[r];
                    if (packed) m.zeros[static_cast<size_t>(r) * groups + c / gs] = group.zeros[r];
                }
            }
            const int32_t kk = order[c], g = kk / gs;
            const double diag = L(c, c);
            if (!packed) {
                for (int32_t r = 0; r < n; ++r) {
                    const float s = half_to_float(m.scales[static_cast<size_t>(r) * groups + g]);
                    const double x = W(r, c);
                    const int8_t q = int8_code(x, s);  // quantize_minmax's rounding
                    m.codes[static_cast<size_t>(r) * k + kk] = static_cast<uint8_t>(q);
                    errors(r, c - i1) = (x - int8_value(q, s)) / diag;
                }
            }
            for (int32_t r = 0; packed && r < n; ++r) {
                const float s = half_to_float(m.scales[static_cast<size_t>(r) * groups + g]);
                const float z = half_to_float(m.zeros[static_cast<size_t>(r) * groups + g]);
                const double x = W(r, c);
                // The same rounding as quantize_minmax; s == 0 only for a group z alone represents.
                const double q = s == 0.0f ? 0.0 : std::clamp(std::nearbyint((x - z) / s), 0.0, 15.0);
                m.codes[static_cast<size_t>(r) * (k / 2) + kk / 2] |=
                    static_cast<uint8_t>(static_cast<uint8_t>(q) << ((kk & 1) * 4));
                // The error against the value the CPU reference dequantizes (q*s + z in FP32).
                errors(r, c - i1) = (x - (static_cast<float>(q) * s + z)) / diag;
            }
            if (c + 1 < i2) {
                W.middleCols(c + 1, i2 - c - 1).noalias() -=
                    errors.col(c - i1) * L.col(c).segment(c + 1, i2 - c - 1).transpose();
            }
        }
        if (i2 < k) {
            W.rightCols(k - i2).noalias() -=
                errors.leftCols(i2 - i1) * L.block(i2, i1, k - i2, i2 - i1).transpose();
        }
        i1 = i2;
    }
    return m;
}

std::map<std::string, Hessian> collect_hessians(const Model &model, const std::vector<std::string> &names,
                                                const int32_t *tokens, size_t n_tokens,
                                                const QuantizeOptions &options) {
    const std::set<std::string> wanted(names.begin(), names.end());
    std::map<std::string, Hessian> hessians;
    // The scoring pool idles while the hook runs; this one does the Hessian updates meanwhile.
    ThreadPool pool(options.n_threads);
    ScoreOptions score;
    score.n_threads = options.n_threads;
    score.window = options.calib_window;
    score.progress = [&](uint64_t done, uint64_t total) {
        if (options.progress) options.progress("calibrate", done, total);
        return true;
    };
    score.linear_input = [&](const Linear &w, const float *x, int32_t rows) {
        if (wanted.count(w.name) != 0) hessians.try_emplace(w.name, w.k).first->second.add(x, rows, &pool);
    };
    score_cpu(model, tokens, n_tokens, score);
    for (const std::string &name : names) {
        if (hessians.count(name) == 0) fail(TL_ERR_INTERNAL, "calibration never ran linear '" + name + "'");
    }
    return hessians;
}

void quantize_model(Model &model, const QuantizeOptions &options, const std::vector<int32_t> &calib_tokens) {
    ModelConfig config = model.config;
    config.group_size = options.gptq.group_size;
    config.bits = options.gptq.bits;
    if (config.bits == 8 && (options.frac4 || options.sign_bit)) {
        fail(TL_ERR_INVALID_ARGUMENT, "frac4 and sign_bit channels describe INT4 codes; they cannot go with bits = 8");
    }
    try {
        validate_config(config);
    } catch (const Error &e) {  // the group size is an argument here, not a file's field
        fail(TL_ERR_INVALID_ARGUMENT, e.what());
    }
    std::vector<Linear *> targets;
    for (Block &b : model.pre)
        for (int i = 0; i < 5; ++i) targets.push_back(b.linear(i));
    for (int i = 0; i < 5; ++i) targets.push_back(model.loop.linear(i));
    if (options.quantize_head && model.head_kind == HeadKind::Dense) targets.push_back(&model.head);
    std::vector<std::string> names;
    for (const Linear *l : targets) {
        if (l->quantized) {
            fail(TL_ERR_INVALID_ARGUMENT, "'" + l->name + "' is already quantized; quantize takes dense linears");
        }
        names.push_back(l->name);
    }

    const bool gptq = options.quantizer == Quantizer::Gptq;
    std::map<std::string, Hessian> hessians;
    if (gptq) {
        if (calib_tokens.size() < 2) {
            fail(TL_ERR_INVALID_ARGUMENT, "GPTQ needs calibration text (at least 2 tokens), got " +
                                              std::to_string(calib_tokens.size()));
        }
        hessians = collect_hessians(model, names, calib_tokens.data(), calib_tokens.size(), options);
    }
    for (size_t i = 0; i < targets.size(); ++i) {
        Linear &l = *targets[i];
        std::vector<float> w(static_cast<size_t>(l.k) * static_cast<size_t>(l.n));
        dequantize_rows(l, 0, l.n, w.data());
        QuantizedMatrix m;
        if (gptq) {
            auto node = hessians.extract(l.name);  // freed after this linear
            m = quantize_gptq(w.data(), l.k, l.n, node.mapped().matrix().data(), options.gptq, l.name);
        } else {
            m = quantize_minmax(w.data(), l.k, l.n, options.gptq.group_size, options.gptq.method, options.gptq.bits);
        }
        if (options.frac4 || options.sign_bit) add_rounding_channels(w.data(), m, options.frac4, options.sign_bit);
        const std::shared_ptr<const std::vector<float>> bias = l.bias;  // the bias stays as it is
        l = make_quantized_linear(l.name, std::move(m));
        l.bias = bias;
        if (options.progress) options.progress("quantize", i + 1, targets.size());
    }
    if (model.head.quantized) model.head_kind = HeadKind::Quantized;
    model.config.group_size = config.group_size;
    model.config.bits = config.bits;
}

}  // namespace tl
