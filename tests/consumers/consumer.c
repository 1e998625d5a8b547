/* A program outside the project that uses the installed or fetched library the way a user's would: run.sh builds it
 * through find_package, pkg-config and FetchContent (TL_CONSUMER names which) and runs it on the test fixture.
 * Usage: consumer MODEL */
#include <stdio.h>

#include "tinyloop.h"

#ifndef TL_CONSUMER
#define TL_CONSUMER "unnamed"
#endif

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s MODEL\n", argv[0]);
        return 2;
    }
    const uint32_t header = ((uint32_t)TL_VERSION_MAJOR << 16) | ((uint32_t)TL_VERSION_MINOR << 8) | TL_VERSION_PATCH;
    if (tl_version() != header) {
        fprintf(stderr, "%s: library %s (0x%06x) but header %d.%d.%d\n", TL_CONSUMER, tl_version_string(),
                (unsigned)tl_version(), TL_VERSION_MAJOR, TL_VERSION_MINOR, TL_VERSION_PATCH);
        return 1;
    }
    tl_model *model = NULL;
    const tl_status status = tl_model_load(argv[1], NULL, &model);
    if (status != TL_OK) {
        fprintf(stderr, "%s: tl_model_load(%s): %s: %s\n", TL_CONSUMER, argv[1], tl_status_string(status),
                tl_last_error_message());
        return 1;
    }
    tl_model_free(model);
    printf("%s consumer: tinyloop %s matches its header, loaded %s\n", TL_CONSUMER, tl_version_string(), argv[1]);
    return 0;
}
