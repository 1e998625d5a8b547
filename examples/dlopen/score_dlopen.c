/* Scores a text file (byte-level tokens) with a .tinyloop model through a libtinyloop.so loaded at run time:
 * no link-time dependency on the library, only on its header for the types, constants and version macros.
 * Every function is resolved by name with dlsym; the library's version is checked against the header's first.
 *
 * Usage: score_dlopen LIBRARY MODEL TEXT        (e.g. build/lib/libtinyloop.so) */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "tinyloop.h"

/* The subset of the C API this program calls, as function pointers resolved from the library. */
struct api {
    uint32_t (*version)(void);
    const char *(*version_string)(void);
    const char *(*status_string)(tl_status);
    const char *(*last_error_message)(void);
    tl_status (*load_options_init)(tl_load_options *, uint32_t);
    tl_status (*model_load)(const char *, const tl_load_options *, tl_model **);
    void (*model_free)(tl_model *);
    tl_status (*model_info)(const tl_model *, tl_model_properties *);
    tl_status (*score_options_init)(tl_score_options *, uint32_t);
    tl_status (*score_result_init)(tl_score_result *, uint32_t);
    tl_status (*score)(const tl_model *, const int32_t *, size_t, const tl_score_options *, tl_score_result *);
};

/* dlsym returns a data pointer; POSIX guarantees it converts to a function pointer, which this copy spells out. */
static int resolve(void *library, const char *name, void *function_pointer_slot) {
    void *symbol = dlsym(library, name);
    if (symbol == NULL) {
        fprintf(stderr, "dlsym(%s): %s\n", name, dlerror());
        return 0;
    }
    *(void **)function_pointer_slot = symbol;
    return 1;
}

static int resolve_api(void *library, struct api *api) {
    return resolve(library, "tl_version", &api->version) &&
           resolve(library, "tl_version_string", &api->version_string) &&
           resolve(library, "tl_status_string", &api->status_string) &&
           resolve(library, "tl_last_error_message", &api->last_error_message) &&
           resolve(library, "tl_load_options_init", &api->load_options_init) &&
           resolve(library, "tl_model_load", &api->model_load) && resolve(library, "tl_model_free", &api->model_free) &&
           resolve(library, "tl_model_info", &api->model_info) &&
           resolve(library, "tl_score_options_init", &api->score_options_init) &&
           resolve(library, "tl_score_result_init", &api->score_result_init) &&
           resolve(library, "tl_score", &api->score);
}

/* Before 1.0 a minor version may change the ABI, so it must match too; the library may be newer in patch only
 * (or, from 1.0 on, in minor). */
static int version_compatible(uint32_t library) {
    const uint32_t major = library >> 16, minor = (library >> 8) & 0xff;
    if (major != TL_VERSION_MAJOR) return 0;
    return TL_VERSION_MAJOR == 0 ? minor == TL_VERSION_MINOR : minor >= TL_VERSION_MINOR;
}

static int fail(const struct api *api, const char *what, tl_status status) {
    fprintf(stderr, "%s: %s: %s\n", what, api->status_string(status), api->last_error_message());
    return 1;
}

/* The file's bytes as tokens; NULL (with a message) on failure. */
static int32_t *read_tokens(const char *path, size_t *n_tokens) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        perror(path);
        return NULL;
    }
    size_t cap = 4096, n = 0;
    int32_t *tokens = malloc(cap * sizeof *tokens);
    int c;
    while (tokens != NULL && (c = fgetc(f)) != EOF) {
        if (n == cap) {
            int32_t *grown = realloc(tokens, 2 * cap * sizeof *tokens);
            if (grown == NULL) {
                free(tokens);
                tokens = NULL;
                break;
            }
            tokens = grown;
            cap *= 2;
        }
        tokens[n++] = (int32_t)c;
    }
    fclose(f);
    if (tokens == NULL) fprintf(stderr, "out of memory reading %s\n", path);
    *n_tokens = n;
    return tokens;
}

static int run(const struct api *api, const char *model_path, const char *text_path) {
    /* The error path first: a missing file is TL_ERR_IO with a message naming it. */
    tl_model *model = NULL;
    tl_status status = api->model_load("/nonexistent/model.tinyloop", NULL, &model);
    if (status != TL_ERR_IO || model != NULL || api->last_error_message()[0] == '\0') {
        fprintf(stderr, "loading a missing file gave status %d, not TL_ERR_IO with a message\n", (int)status);
        return 1;
    }
    printf("expected error: %s: %s\n", api->status_string(status), api->last_error_message());

    tl_load_options load_options;
    api->load_options_init(&load_options, sizeof load_options);
    status = api->model_load(model_path, &load_options, &model);
    if (status != TL_OK) return fail(api, "load", status);

    tl_model_properties info = {.struct_size = sizeof info};
    status = api->model_info(model, &info);
    if (status != TL_OK) {
        api->model_free(model);
        return fail(api, "info", status);
    }
    printf("model: d_model %d, vocab %d, %d pre blocks + 1 looped x %d\n", info.d_model, info.vocab, info.n_pre,
           info.n_loops);

    size_t n_tokens = 0;
    int32_t *tokens = read_tokens(text_path, &n_tokens);
    if (tokens == NULL) {
        api->model_free(model);
        return 1;
    }
    tl_score_options options;
    api->score_options_init(&options, sizeof options);
    options.backend = TL_BACKEND_CPU;
    tl_score_result result;
    api->score_result_init(&result, sizeof result);
    status = api->score(model, tokens, n_tokens, &options, &result);
    free(tokens);
    api->model_free(model);
    if (status != TL_OK) return fail(api, "score", status);
    printf("perplexity %.4f over %llu tokens (%d windows, %.1f tokens/s)\n", result.perplexity,
           (unsigned long long)result.tokens_scored, result.n_windows, (double)n_tokens / result.seconds);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s LIBRARY MODEL TEXT\n", argv[0]);
        return 2;
    }
    void *library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (library == NULL) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    struct api api;
    if (!resolve_api(library, &api)) {
        dlclose(library);
        return 1;
    }
    const uint32_t version = api.version();
    printf("library %s (0x%06x), header %d.%d.%d\n", api.version_string(), (unsigned)version, TL_VERSION_MAJOR,
           TL_VERSION_MINOR, TL_VERSION_PATCH);
    int rc = 1;
    if (!version_compatible(version)) {
        fprintf(stderr, "library version %s does not match the header's %d.%d.%d\n", api.version_string(),
                TL_VERSION_MAJOR, TL_VERSION_MINOR, TL_VERSION_PATCH);
    } else {
        rc = run(&api, argv[2], argv[3]);
    }
    dlclose(library);
    return rc;
}
