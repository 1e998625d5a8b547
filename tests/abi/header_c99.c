/* The header on its own, as strict C99: it must come first (self-contained) and compile without a warning
 * under -std=c99 -pedantic -Wall -Wextra -Werror -Wstrict-prototypes. Including it twice checks the guard. */
#include "tinyloop.h"
#include "tinyloop.h"

#include <stddef.h>

/* The version numbers must be usable by the preprocessor. */
#if TL_VERSION_MAJOR < 0 || TL_VERSION_MINOR < 0 || TL_VERSION_PATCH < 0
#error "negative version number"
#endif

#define SIZE_FIELD_FIRST(type) (offsetof(type, struct_size) == 0 && sizeof(((type *)0)->struct_size) == 4)

int main(void) {
    const int ok = SIZE_FIELD_FIRST(tl_load_options) && SIZE_FIELD_FIRST(tl_model_properties) &&
                   SIZE_FIELD_FIRST(tl_weight_desc) && SIZE_FIELD_FIRST(tl_quantize_options) &&
                   SIZE_FIELD_FIRST(tl_weight_properties) && SIZE_FIELD_FIRST(tl_score_options) &&
                   SIZE_FIELD_FIRST(tl_score_result) && sizeof(tl_status) == 4;
    return ok ? 0 : 1;
}
