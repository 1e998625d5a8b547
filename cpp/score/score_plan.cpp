#include "score/score_plan.hpp"

#include <limits>
#include <string>

#include <unistd.h>

#include "util/error.hpp"

namespace tl {

const char *activation_mode_name(ActivationMode mode) {
    switch (mode) {
        case ActivationMode::Fp16: return "fp16";
        case ActivationMode::Int8: return "int8";
        case ActivationMode::Fp8: return "fp8";
    }
    return "unknown";
}

void check_model(const Model &model, void (*check_storage)(const Linear &w, const std::string &name)) {
    const ModelConfig &c = model.config;
    if (c.d_model <= 0 || c.ffn <= 0 || c.vocab <= 0 || c.pre < 0 || c.loops < 0) {
        fail(TL_ERR_INVALID_ARGUMENT, "model: config has a non-positive dimension");
    }
    if (c.n_heads <= 0 || c.head_dim <= 0 || c.head_dim % 2 != 0) {
        fail(TL_ERR_INVALID_ARGUMENT, "model: n_heads = " + std::to_string(c.n_heads) + ", head_dim = " +
                                          std::to_string(c.head_dim) + " (need both > 0, head_dim even)");
    }
    if (c.n_kv_heads < 0 || c.n_heads % c.kv_heads() != 0) {
        fail(TL_ERR_INVALID_ARGUMENT, "model: n_kv_heads = " + std::to_string(c.n_kv_heads) +
                                          " does not divide n_heads = " + std::to_string(c.n_heads));
    }
    check_model_shapes(model, check_storage);
}

void check_model_shapes(const Model &model, void (*check_storage)(const Linear &w, const std::string &name)) {
    const ModelConfig &c = model.config;
    if (model.embed == nullptr || model.final_norm.size() != static_cast<size_t>(c.d_model) ||
        model.pre.size() != static_cast<size_t>(c.pre)) {
        fail(TL_ERR_INVALID_ARGUMENT, "model: embedding, final norm or pre blocks do not match the config");
    }
    const int32_t D = c.d_model, A = c.attn_dim(), F = c.ffn;
    auto check_linear = [&](const Linear &w, const std::string &name, int32_t k, int32_t n) {
        if (w.k != k || w.n != n) {
            fail(TL_ERR_INVALID_ARGUMENT, "model: " + name + " is [K=" + std::to_string(w.k) + ", N=" +
                                              std::to_string(w.n) + "], expected [K=" + std::to_string(k) +
                                              ", N=" + std::to_string(n) + "]");
        }
        if (w.bias && w.bias->size() != static_cast<size_t>(n)) {
            fail(TL_ERR_INVALID_ARGUMENT, "model: " + name + " has a bias of " + std::to_string(w.bias->size()) +
                                              " values, expected N = " + std::to_string(n));
        }
        check_storage(w, name);
    };
    auto check_block = [&](const Block &b, const std::string &prefix) {
        if (b.attn_norm.size() != static_cast<size_t>(D) || b.mlp_norm.size() != static_cast<size_t>(D)) {
            fail(TL_ERR_INVALID_ARGUMENT, "model: " + prefix + " norm gains are not [d_model]");
        }
        check_linear(b.attn_qkv, prefix + ".attn_qkv", D, c.qkv_dim());
        check_linear(b.attn_out, prefix + ".attn_out", A, D);
        check_linear(b.mlp_gate, prefix + ".mlp_gate", D, F);
        check_linear(b.mlp_up, prefix + ".mlp_up", D, F);
        check_linear(b.mlp_down, prefix + ".mlp_down", F, D);
    };
    for (size_t i = 0; i < model.pre.size(); ++i) check_block(model.pre[i], "pre." + std::to_string(i));
    check_block(model.loop, "loop");
    check_linear(model.head, "head", D, c.vocab);
    if (model.head_kind == HeadKind::Tied && model.head.bias) {
        fail(TL_ERR_INVALID_ARGUMENT, "model: a head tied to the embedding has no bias of its own");
    }
}

ScorePlan plan_score(const ModelConfig &c, const int32_t *tokens, size_t n_tokens, int32_t window) {
    if (tokens == nullptr) fail(TL_ERR_INVALID_ARGUMENT, "tokens is NULL");
    if (n_tokens < 2) {
        fail(TL_ERR_INVALID_ARGUMENT, "n_tokens = " + std::to_string(n_tokens) + ": at least 2 tokens are needed");
    }
    for (size_t i = 0; i < n_tokens; ++i) {
        if (tokens[i] < 0 || tokens[i] >= c.vocab) {
            fail(TL_ERR_INVALID_ARGUMENT, "tokens[" + std::to_string(i) + "] = " + std::to_string(tokens[i]) +
                                              " is outside the vocabulary [0, " + std::to_string(c.vocab) + ")");
        }
    }
    if (window != 0 && (window < 2 || window > c.max_seq)) {
        fail(TL_ERR_INVALID_ARGUMENT, "window = " + std::to_string(window) + " is outside [2, max_seq = " +
                                          std::to_string(c.max_seq) + "]");
    }
    const int32_t L = window != 0 ? window : c.max_seq;
    if (L < 2) fail(TL_ERR_INVALID_ARGUMENT, "model: max_seq = " + std::to_string(c.max_seq) + " is below 2");
    const size_t stride = static_cast<size_t>(L) - 1;
    const size_t n_windows = (n_tokens - 1 + stride - 1) / stride;
    if (n_windows > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
        fail(TL_ERR_INVALID_ARGUMENT, "n_tokens = " + std::to_string(n_tokens) + " needs too many windows");
    }
    return ScorePlan{L, n_windows};
}

size_t check_sequences(const ModelConfig &c, const Sequence *sequences, size_t n_sequences, int32_t window) {
    if (window != 0) {
        fail(TL_ERR_INVALID_ARGUMENT, "window = " + std::to_string(window) +
                                          ": a batch of sequences is never split into windows (use 0)");
    }
    if (sequences == nullptr && n_sequences > 0) fail(TL_ERR_INVALID_ARGUMENT, "sequences is NULL");
    size_t predicted = 0;
    for (size_t s = 0; s < n_sequences; ++s) {
        const Sequence &q = sequences[s];
        const std::string name = "sequences[" + std::to_string(s) + "]";
        // The length first: an empty sequence's tokens are often NULL, and its length is what is wrong.
        if (q.n_tokens < 2 || q.n_tokens > static_cast<size_t>(c.max_seq)) {
            fail(TL_ERR_INVALID_ARGUMENT, name + ".n_tokens = " + std::to_string(q.n_tokens) +
                                              " is outside [2, max_seq = " + std::to_string(c.max_seq) + "]");
        }
        if (q.tokens == nullptr) fail(TL_ERR_INVALID_ARGUMENT, name + ".tokens is NULL");
        if (q.n_context >= q.n_tokens) {
            fail(TL_ERR_INVALID_ARGUMENT, name + ".n_context = " + std::to_string(q.n_context) +
                                              " leaves nothing to score (n_tokens = " + std::to_string(q.n_tokens) +
                                              ")");
        }
        for (size_t i = 0; i < q.n_tokens; ++i) {
            if (q.tokens[i] < 0 || q.tokens[i] >= c.vocab) {
                fail(TL_ERR_INVALID_ARGUMENT, name + ".tokens[" + std::to_string(i) + "] = " +
                                                  std::to_string(q.tokens[i]) + " is outside the vocabulary [0, " +
                                                  std::to_string(c.vocab) + ")");
            }
        }
        predicted += q.n_tokens - 1;
    }
    return predicted;
}

uint64_t host_memory_bytes() {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : UINT64_MAX;
}

// What the caller can change: the rows of a forward pass come from the window in tl_score and from the longest
// sequence in tl_score_batch, which has no window.
constexpr const char *kFewerRows = "; fewer tokens per forward pass need less (in tl_score a shorter window, in "
                                   "tl_score_batch shorter sequences)";

void check_memory_budget(uint64_t needed, uint64_t budget, uint64_t machine, const char *what) {
    if (budget != 0 && needed > budget) {
        fail(TL_ERR_OUT_OF_MEMORY, std::string("scoring needs about ") + std::to_string(needed) + " bytes of " + what +
                                       ", over the memory budget of " + std::to_string(budget) +
                                       " bytes (max_memory_bytes)" + kFewerRows);
    }
    if (budget == 0 && needed > machine) {
        fail(TL_ERR_OUT_OF_MEMORY, std::string("scoring needs about ") + std::to_string(needed) + " bytes of " + what +
                                       ", more than the " + std::to_string(machine) +
                                       " bytes this machine has" + kFewerRows);
    }
}

}  // namespace tl
