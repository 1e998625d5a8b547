/* A stand-in for a broken build of the library: it leaks a non-tl_ symbol and lacks most of the API. The
 * abi.exports_catches_* test runs the export check on it, so the check itself is shown to fail. */
#define EXPORTED __attribute__((visibility("default")))

EXPORTED int leaky_helper(void) { return 1; }
EXPORTED unsigned tl_version(void) { return 0; }
