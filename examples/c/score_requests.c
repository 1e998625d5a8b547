/* Scores loglikelihood requests (a context and a continuation, byte-level tokens) with a .tinyloop model in one
 * tl_score_batch call, and prints each continuation's NLL and whether greedy decoding would produce it.
 * Usage: score_requests MODEL [CONTEXT CONTINUATION]...   (without pairs: three built-in requests) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tinyloop.h"

static const char *const kBuiltIn[] = {
    "The capital of France is", " Paris",
    "The capital of France is", " a potato",
    "print(1 + 1) writes", " 2",
};

int main(int argc, char **argv) {
    if (argc < 2 || argc % 2 != 0) {
        fprintf(stderr, "usage: %s MODEL [CONTEXT CONTINUATION]...\n", argv[0]);
        return 2;
    }
    const char *const *texts = argc > 2 ? (const char *const *)argv + 2 : kBuiltIn;
    const size_t n = argc > 2 ? (size_t)(argc - 2) / 2 : sizeof kBuiltIn / sizeof kBuiltIn[0] / 2;

    /* Each request is one sequence: its context's bytes then its continuation's, the context not scored. */
    tl_sequence *sequences = calloc(n, sizeof *sequences);
    tl_sequence_score *scores = calloc(n, sizeof *scores);
    int32_t **tokens = calloc(n, sizeof *tokens);
    int status = sequences != NULL && scores != NULL && tokens != NULL ? 0 : 1;
    for (size_t i = 0; i < n && status == 0; ++i) {
        const char *context = texts[2 * i], *continuation = texts[2 * i + 1];
        const size_t n_context = strlen(context), n_tokens = n_context + strlen(continuation);
        tokens[i] = malloc((n_tokens > 0 ? n_tokens : 1) * sizeof(int32_t));
        if (tokens[i] == NULL) {
            status = 1;
            break;
        }
        for (size_t j = 0; j < n_tokens; ++j) {
            tokens[i][j] = (unsigned char)(j < n_context ? context[j] : continuation[j - n_context]);
        }
        sequences[i].tokens = tokens[i];
        sequences[i].n_tokens = n_tokens;
        sequences[i].n_context = n_context;
    }
    if (status != 0) fprintf(stderr, "out of memory\n");

    tl_model *model = NULL;
    if (status == 0) {
        const tl_status loaded = tl_model_load(argv[1], NULL, &model);
        if (loaded != TL_OK) {
            fprintf(stderr, "load: %s: %s\n", tl_status_string(loaded), tl_last_error_message());
            status = 1;
        }
    }
    if (status == 0) {
        tl_score_result total;
        tl_score_result_init(&total, sizeof total);
        const tl_status scored = tl_score_batch(model, sequences, n, NULL, scores, &total);
        if (scored != TL_OK) {
            fprintf(stderr, "score: %s: %s\n", tl_status_string(scored), tl_last_error_message());
            status = 1;
        } else {
            for (size_t i = 0; i < n; ++i) {
                printf("request %zu: NLL %.4f over %llu tokens (%.4f per token), greedy %s: \"%s\" + \"%s\"\n", i,
                       scores[i].nll_sum, (unsigned long long)scores[i].tokens_scored,
                       scores[i].nll_sum / (double)scores[i].tokens_scored, scores[i].greedy ? "yes" : "no",
                       texts[2 * i], texts[2 * i + 1]);
            }
            printf("%zu requests, %llu tokens scored in %.3f s on the %s\n", n,
                   (unsigned long long)total.tokens_scored, total.seconds,
                   total.backend == TL_BACKEND_CUDA ? "GPU" : "CPU");
        }
    }
    tl_model_free(model);
    for (size_t i = 0; tokens != NULL && i < n; ++i) free(tokens[i]);
    free(tokens);
    free(scores);
    free(sequences);
    return status;
}
