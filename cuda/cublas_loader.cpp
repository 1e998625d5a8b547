#include "cublas_loader.hpp"

#include <dlfcn.h>

namespace tl::gpu {

namespace {

struct Loaded {
    CublasApi api{};
    bool ok = false;
    std::string why;
};

template <class Fn>
bool resolve(void *library, const char *name, Fn &fn, std::string &why) {
    fn = reinterpret_cast<Fn>(dlsym(library, name));
    if (fn == nullptr) why = std::string("cuBLAS has no symbol ") + name;
    return fn != nullptr;
}

Loaded load() {
    Loaded l;
    // The soname of the major version the headers describe: its ABI is the one compiled against.
    const std::string soname = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
    // Never closed: handles made through it live as long as the process.
    void *library = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
        const char *error = dlerror();
        l.why = "cannot load " + soname + ": " + (error != nullptr ? error : "unknown error");
        return l;
    }
    CublasApi &a = l.api;
    l.ok = resolve(library, "cublasCreate_v2", a.create, l.why) &&
           resolve(library, "cublasDestroy_v2", a.destroy, l.why) &&
           resolve(library, "cublasSetStream_v2", a.set_stream, l.why) &&
           resolve(library, "cublasSetWorkspace_v2", a.set_workspace, l.why) &&
           resolve(library, "cublasGemmEx", a.gemm_ex, l.why);
    return l;
}

}  // namespace

const CublasApi *cublas_api(std::string *why) {
    static const Loaded loaded = load();
    if (!loaded.ok && why != nullptr) *why = loaded.why;
    return loaded.ok ? &loaded.api : nullptr;
}

}  // namespace tl::gpu
