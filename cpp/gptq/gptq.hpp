// GPTQ quantization (Frantar et al., 2022) on the host, and the quantizer pipeline behind `tinyloop quantize`:
// dense model -> calibration activations from the CPU forward pass -> per-linear GPTQ or min-max -> INT4/INT8 model.
// The method and its choices are described in docs/quality.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "format/model.hpp"
#include "quant/quant.hpp"

namespace tl {

class ThreadPool;

// H = 2·XᵀX over calibration rows x ∈ R^k of one linear's input, accumulated in double.
class Hessian {
public:
    explicit Hessian(int32_t k);
    // Adds rows x[rows][k], on `pool`'s threads when one is given.
    void add(const float *x, int32_t rows, ThreadPool *pool = nullptr);
    int32_t k() const { return k_; }
    uint64_t rows() const { return rows_; }
    // The full symmetric [k][k] matrix.
    std::vector<double> matrix() const;

private:
    int32_t k_;
    uint64_t rows_ = 0;
    std::vector<double> lower_;  // XᵀX, column-major, lower triangle kept up to date
};

struct GptqOptions {
    QuantMethod method = QuantMethod::Asymmetric;
    int32_t bits = 4;        // 4, or 8 (symmetric: method must be Symmetric)
    int32_t group_size = 0;  // 0 = per row; otherwise a divisor of k (even for INT4)
    double damp = 0.01;      // λ = damp · mean(diag H) added to the diagonal
    // Quantize columns in order of decreasing H_ii. Each group's s and z then come from the weights as given
    // (natural order, before any error compensation), so the stored layout and group membership stay the file's.
    bool act_order = false;
    int32_t block_size = 128;  // columns per lazy-update block
};

// GPTQ of w[n][k] (row n = output column n) against the Hessian h[k][k] (row-major, symmetric) of its input.
// Columns (input dimensions) are quantized one by one, each one's rounding error spread over the columns not
// yet quantized through the upper Cholesky factor of H⁻¹. Without act_order, a group's s and z are the
// min-max values (quantize_minmax's rule for options.bits, FP16-rounded) of the group's current, error-compensated
// weights when its first column comes up. Columns with H_ii = 0 (inputs that never fired) are rounded plainly.
// Throws TL_ERR_INVALID_ARGUMENT for bad shapes or non-finite values, naming `name`, and when the damped H is
// not positive definite.
QuantizedMatrix quantize_gptq(const float *w, int32_t k, int32_t n, const double *h, const GptqOptions &options,
                              const std::string &name = "weight");

enum class Quantizer { MinMax, Gptq };

struct QuantizeOptions {
    Quantizer quantizer = Quantizer::MinMax;
    GptqOptions gptq;       // method, bits and group_size apply to min-max too
    bool quantize_head = false;  // also quantize a dense (untied) head
    bool frac4 = false;     // write cross-iteration rounding channels (cross_iter.hpp)
    bool sign_bit = false;
    int32_t calib_window = 0;  // calibration window length, 0 = max_seq
    int32_t n_threads = 0;     // for the calibration forward pass; 0 = hardware concurrency
    // Progress: (stage, done, total) with stage "calibrate" (tokens) or "quantize" (linears).
    std::function<void(const char *stage, uint64_t done, uint64_t total)> progress;
};

// The Hessians of the named linears' inputs, from scoring `tokens` with the CPU forward pass. A looped-block
// linear accumulates its inputs of every loop iteration into one Hessian.
std::map<std::string, Hessian> collect_hessians(const Model &model, const std::vector<std::string> &names,
                                                const int32_t *tokens, size_t n_tokens, const QuantizeOptions &options);

// Quantizes every block linear of `model` (which must be dense) and, with quantize_head, a dense head, in
// place; sets config.group_size. GPTQ needs calibration tokens (at least 2), collected from the model as it
// was passed in.
void quantize_model(Model &model, const QuantizeOptions &options, const std::vector<int32_t> &calib_tokens);

}  // namespace tl
