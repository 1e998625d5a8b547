/* Scores a text file (byte-level tokens) with a .tinyloop model through the C API.
 * Usage: score_text MODEL TEXT */
#include <stdio.h>
#include <stdlib.h>

#include "tinyloop.h"

static int fail(const char *what, tl_status status) {
    fprintf(stderr, "%s: %s: %s\n", what, tl_status_string(status), tl_last_error_message());
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s MODEL TEXT\n", argv[0]);
        return 2;
    }
    FILE *f = fopen(argv[2], "rb");
    if (f == NULL) {
        perror(argv[2]);
        return 1;
    }
    size_t cap = 4096, n = 0;
    int32_t *tokens = malloc(cap * sizeof *tokens);
    int c;
    while (tokens != NULL && (c = fgetc(f)) != EOF) {
        if (n == cap) {
            int32_t *grown = realloc(tokens, 2 * cap * sizeof *tokens);
            if (grown == NULL) break;
            tokens = grown;
            cap *= 2;
        }
        tokens[n++] = (int32_t)c;
    }
    fclose(f);
    if (tokens == NULL || c != EOF) {
        fprintf(stderr, "out of memory reading %s\n", argv[2]);
        free(tokens);
        return 1;
    }

    tl_model *model = NULL;
    tl_status status = tl_model_load(argv[1], NULL, &model);
    if (status != TL_OK) {
        free(tokens);
        return fail("load", status);
    }
    tl_score_result result;
    tl_score_result_init(&result, sizeof result);
    status = tl_score(model, tokens, n, NULL, &result);
    tl_model_free(model);
    free(tokens);
    if (status != TL_OK) return fail("score", status);
    printf("perplexity %.4f over %llu tokens (%.1f tokens/s)\n", result.perplexity,
           (unsigned long long)result.tokens_scored, (double)n / result.seconds);
    return 0;
}
