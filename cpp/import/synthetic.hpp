// Deterministic synthetic models for tests, benchmarks and the CLI's make-model command.
#pragma once

#include <cstdint>
#include <memory>

#include "format/model.hpp"
#include "quant/quant.hpp"

namespace tl {

struct SyntheticOptions {
    uint64_t seed = 1;
    bool quantized = true;  // false: dense F32 linears
    QuantMethod method = QuantMethod::Asymmetric;
    bool quantize_head = false;  // false: head tied to the embedding
    bool frac4 = false;
    bool sign_bit = false;
    bool biases = false;  // every block linear (and a separate head) gets a bias, drawn after its weight
};

// Weights are drawn from a fixed PRNG (same seed, same bytes on every machine), scaled like a trained
// model's (N(0, 1/sqrt(K)) linears, unit norms) so activations stay in range, then quantized per config (group_size,
// bits: INT8 is always symmetric).
std::unique_ptr<Model> make_synthetic_model(const ModelConfig &config, const SyntheticOptions &options);

}  // namespace tl
