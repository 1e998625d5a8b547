//! Builds (or finds) the TinyLoop C library for the bindings. The first of these that applies:
//!
//! 1. `TINYLOOP_LIB_DIR` set: links the prebuilt shared `libtinyloop` found there.
//! 2. pkg-config, as `libgit2-sys` does (`TINYLOOP_SYS_USE_PKG_CONFIG`: unset or `auto` tries it, `1` requires it,
//!    `0` skips it): links an installed `tinyloop` whose version is compatible with these bindings (at least the
//!    crate's version, below the next incompatible one). In `auto` mode the `cuda` feature skips it: the feature
//!    asks for the CUDA sources to be compiled.
//! 3. Compiles the C++ core with the `cc` crate from `cpp/sources.txt` and `capi/sources.txt` (the lists CMake
//!    reads) into a static library, with CMake's Release flags whatever cargo's profile. The sources are the
//!    TinyLoop repository's when the crate sits in it (`../../cpp/sources.txt` exists), else the copy in `csrc/`
//!    that `vendor-sources.sh` makes for `cargo package`. With the `cuda` feature: also the CUDA sources of
//!    `cuda/sources.txt` through nvcc (the `cc` crate's CUDA support), for the architectures of
//!    `TINYLOOP_CUDA_ARCHS` (default `80;90`: SASS for 8.0 runs on 8.6 and 8.9), linking the static CUDA runtime and cuBLAS.
//!
//! No path needs a GPU or `nvidia-smi`.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The GPUs the project supports: Ampere (80, 86), Ada (89), Hopper (90). Same default as CMakeLists.txt.
const DEFAULT_CUDA_ARCHS: &str = "80;90";

/// What CMake's Release configuration passes to the C++ compiler besides includes and definitions
/// (`CMAKE_CXX_FLAGS_RELEASE` is `-O3 -DNDEBUG`; the visibility flags come from CMakeLists.txt's presets). `-O3`
/// goes through `cc`'s `opt_level` and `NDEBUG` through `define`; these are the rest.
const CMAKE_RELEASE_VISIBILITY_FLAGS: [&str; 2] = ["-fvisibility=hidden", "-fvisibility-inlines-hidden"];

/// The shared libraries the C++ core's tokenizers (cpp/text) link, as CMakeLists.txt links them.
const TOKENIZER_LIBRARIES: [&str; 3] = ["pcre2-8", "utf8proc", "sentencepiece"];

/// What `build_info()` reports as the build type of a library this script compiled.
const BUILD_TYPE: &str = "cargo (Release: -O3 -DNDEBUG)";

fn main() {
    println!("cargo:rerun-if-env-changed=TINYLOOP_LIB_DIR");
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let sources = SourceRoot::find(&manifest_dir);

    if let Some(dir) = env::var_os("TINYLOOP_LIB_DIR") {
        if cuda_feature() {
            println!(
                "cargo:warning=TINYLOOP_LIB_DIR is set: the `cuda` feature has no effect, the prebuilt library decides"
            );
        }
        link_prebuilt(Path::new(&dir));
        return;
    }

    let mode = PkgConfigMode::from_env();
    let try_pkg_config = match mode {
        PkgConfigMode::Never => false,
        PkgConfigMode::Required => true,
        PkgConfigMode::Auto => !cuda_feature(),
    };
    if try_pkg_config {
        match probe_pkg_config() {
            Ok(library) => {
                link_pkg_config(&library, mode, sources.as_ref());
                return;
            }
            Err(miss) if mode == PkgConfigMode::Required => {
                panic!("TINYLOOP_SYS_USE_PKG_CONFIG=1 but pkg-config gives no usable tinyloop: {}", miss.message())
            }
            Err(PkgConfigMiss::Incompatible { found, wanted }) => println!(
                "cargo:warning=pkg-config finds tinyloop {found}, but these bindings need {wanted}: building the \
                 library from its sources instead"
            ),
            // The usual case where TinyLoop is not installed: nothing to warn about.
            Err(PkgConfigMiss::NotFound(_)) => {}
        }
    }

    let sources = sources.unwrap_or_else(|| {
        panic!(
            "tinyloop-sys found no C++ sources to build: neither {} (the crate inside the TinyLoop repository) nor \
             {} (a packaged crate: vendor-sources.sh fills it). Install TinyLoop so that pkg-config finds it, or \
             set TINYLOOP_LIB_DIR to a directory holding a prebuilt libtinyloop",
            manifest_dir.join("../../cpp/sources.txt").display(),
            manifest_dir.join("csrc/cpp/sources.txt").display()
        )
    });
    build_from_source(&sources.root);
}

fn cuda_feature() -> bool {
    env::var_os("CARGO_FEATURE_CUDA").is_some()
}

/// Where the library's sources are.
struct SourceRoot {
    /// Holds `cpp/`, `capi/` and `cuda/` with their source lists.
    root: PathBuf,
    /// True for the TinyLoop repository (the crate built in place), false for the crate's own `csrc/` copy.
    repository: bool,
}

impl SourceRoot {
    /// The repository when the crate sits in it, else `csrc/` when `vendor-sources.sh` filled it (a packaged
    /// crate), else none. The repository wins: a `csrc/` left in a checkout is only ever read by `cargo package`.
    fn find(manifest_dir: &Path) -> Option<SourceRoot> {
        let repository = manifest_dir.join("..").join("..");
        let vendored = manifest_dir.join("csrc");
        if repository.join("cpp").join("sources.txt").is_file() {
            Some(SourceRoot { root: repository, repository: true })
        } else if vendored.join("cpp").join("sources.txt").is_file() {
            Some(SourceRoot { root: vendored, repository: false })
        } else {
            None
        }
    }
}

fn link_prebuilt(dir: &Path) {
    if !dir.is_dir() {
        panic!("TINYLOOP_LIB_DIR={} is not a directory", dir.display());
    }
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-lib=dylib=tinyloop");
}

/// `TINYLOOP_SYS_USE_PKG_CONFIG`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PkgConfigMode {
    /// Unset, empty or `auto`: link an installed library pkg-config finds, else build the sources.
    Auto,
    /// `1` (or `yes`, `true`, `on`): link an installed library or fail.
    Required,
    /// `0` (or `no`, `false`, `off`): never ask pkg-config.
    Never,
}

impl PkgConfigMode {
    fn from_env() -> PkgConfigMode {
        const VAR: &str = "TINYLOOP_SYS_USE_PKG_CONFIG";
        println!("cargo:rerun-if-env-changed={VAR}");
        let value = match env::var(VAR) {
            Ok(value) => value,
            Err(env::VarError::NotPresent) => return PkgConfigMode::Auto,
            Err(env::VarError::NotUnicode(value)) => panic!("{VAR}={value:?} is not UTF-8"),
        };
        match value.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => PkgConfigMode::Auto,
            "1" | "yes" | "true" | "on" => PkgConfigMode::Required,
            "0" | "no" | "false" | "off" => PkgConfigMode::Never,
            _ => panic!("{VAR}={value:?}: expected 1 (require pkg-config), 0 (never use it) or auto (the default)"),
        }
    }
}

/// Why pkg-config gave no library.
enum PkgConfigMiss {
    /// No `tinyloop` at all (or no pkg-config): pkg-config's message.
    NotFound(String),
    /// A `tinyloop` of another version than the bindings accept.
    Incompatible { found: String, wanted: String },
}

impl PkgConfigMiss {
    fn message(&self) -> String {
        match self {
            PkgConfigMiss::NotFound(message) => message.clone(),
            PkgConfigMiss::Incompatible { found, wanted } => {
                format!("it finds version {found}, the bindings need {wanted}")
            }
        }
    }
}

/// The versions of the library these bindings work with: from the crate's own version (the version of the header
/// they mirror) up to, not including, the next incompatible one: the next major version, or before 1.0 the next
/// minor version, as the header's comment on `tl_version` has it.
fn compatible_versions(crate_version: &str) -> (String, String) {
    let numbers: Vec<u64> = crate_version
        .split(['-', '+'])
        .next()
        .unwrap_or("")
        .split('.')
        .map(|part| part.parse().unwrap_or_else(|_| panic!("cannot read the crate version {crate_version:?}")))
        .collect();
    let (major, minor, patch) = match numbers[..] {
        [major, minor, patch] => (major, minor, patch),
        _ => panic!("cannot read the crate version {crate_version:?}"),
    };
    let below = if major == 0 { format!("0.{}.0", minor + 1) } else { format!("{}.0.0", major + 1) };
    (format!("{major}.{minor}.{patch}"), below)
}

/// Asks pkg-config for a compatible `tinyloop`; on success it has printed the link lines for cargo.
fn probe_pkg_config() -> Result<pkg_config::Library, PkgConfigMiss> {
    let crate_version = env::var("CARGO_PKG_VERSION").expect("cargo sets CARGO_PKG_VERSION");
    let (at_least, below) = compatible_versions(&crate_version);
    let found = pkg_config::Config::new().range_version(at_least.as_str()..below.as_str()).probe("tinyloop");
    found.map_err(|error| {
        // Whether there is a tinyloop of another version, to say so rather than nothing.
        match pkg_config::Config::new().cargo_metadata(false).probe("tinyloop") {
            Ok(other) => {
                PkgConfigMiss::Incompatible { found: other.version, wanted: format!(">= {at_least}, < {below}") }
            }
            Err(_) => PkgConfigMiss::NotFound(error.to_string()),
        }
    })
}

fn link_pkg_config(library: &pkg_config::Library, mode: PkgConfigMode, sources: Option<&SourceRoot>) {
    if cuda_feature() {
        println!(
            "cargo:warning=linking the tinyloop that pkg-config finds: the `cuda` feature has no effect, the \
             installed library decides"
        );
    }
    // Inside the repository the sources were right here: say which library the build took, and how to change it.
    if mode == PkgConfigMode::Auto && sources.map_or(false, |sources| sources.repository) {
        println!(
            "cargo:warning=linking the installed tinyloop {} that pkg-config finds ({}), not this checkout's \
             sources; TINYLOOP_SYS_USE_PKG_CONFIG=0 builds the sources",
            library.version,
            library.link_paths.iter().map(|path| path.display().to_string()).collect::<Vec<_>>().join(":")
        );
    }
    // Dependents' build scripts read it as DEP_TINYLOOP_INCLUDE.
    if let Some(include) = library.include_paths.first() {
        println!("cargo:include={}", include.display());
    }
}

/// Where the CUDA toolkit is and what it builds for.
struct CudaToolkit {
    root: PathBuf,
    version: String,
    /// Architecture names as nvcc spells them after `sm_` (e.g. "90", "90a").
    archs: Vec<String>,
}

/// Compiles the C++ core (and with the `cuda` feature the CUDA sources) found under `root`, the repository or
/// `csrc/`, which hold the same relative paths.
fn build_from_source(root: &Path) {
    let mut cxx_sources = read_source_list(root, "cpp/sources.txt");
    cxx_sources.extend(read_source_list(root, "capi/sources.txt"));
    // cc 1.0 names each object after its source's file name alone: two sources of one name would overwrite each
    // other's object, and the link would miss the symbols of one of them.
    let mut names = std::collections::HashMap::new();
    for source in &cxx_sources {
        if let Some(other) = names.insert(source.file_name(), source) {
            panic!("{} and {} have the same file name: rename one", other.display(), source.display());
        }
    }
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let generated = out_dir.join("generated");
    fs::create_dir_all(&generated).expect("create OUT_DIR/generated");
    let cuda = cuda_feature().then(find_cuda);

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .flag("-std=c++17")
        // CMake's Release flags in every cargo profile: the C++ library is the same library whichever profile the
        // Rust code uses (`cargo test` included). Left to itself, cc takes -O from cargo's OPT_LEVEL (0 in the dev
        // profile), adds -g and -fno-omit-frame-pointer when cargo's DEBUG is true, and never defines NDEBUG (so
        // every assert and Eigen's range checks would run). CXXFLAGS still adds flags after these (e.g. `-g`).
        .opt_level(3)
        .debug(false)
        .force_frame_pointer(false)
        .define("NDEBUG", None)
        .include(root.join("capi").join("include"))
        .include(root.join("cpp"))
        // The host side's headers (cpp/gpu/) use the kernels' own types (cuda/dtype.hpp, cuda/marlin/*.hpp).
        .include(root.join("cuda"))
        .include(&generated)
        // nlohmann/json.hpp (header-only, Debian's nlohmann-json3-dev).
        .include("/usr/include")
        // Eigen/Cholesky for the GPTQ quantizer (header-only, Debian's libeigen3-dev).
        .include("/usr/include/eigen3")
        .define("TINYLOOP_BUILDING_LIBRARY", None);
    for flag in CMAKE_RELEASE_VISIBILITY_FLAGS {
        build.flag(flag);
    }
    if let Some(cuda) = &cuda {
        // cpp/gpu/ includes the CUDA runtime, cuBLAS and the launchers' headers (cuda/gpu_kernels.hpp, ...).
        build.define("TL_WITH_CUDA", "1").include(cuda.root.join("include"));
    }
    build.files(&cxx_sources);
    // The sources include headers from these folders; cargo watches a folder's whole tree.
    for dir in ["cpp", "capi", "cuda"] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    write_build_info(&generated.join("build_info.hpp"), &compiler_description(&build), cuda.as_ref());
    // cc links the C++ standard library (libstdc++ with GCC on Linux) itself because cpp(true) is set.
    build.compile("tinyloop");

    if let Some(cuda) = &cuda {
        build_cuda(root, cuda);
    }
    // The tokenizers' libraries (cpp/text; CMakeLists.txt finds the same ones): PCRE2 and utf8proc for tokenizer.json,
    // libsentencepiece for tokenizer.model (Debian: libpcre2-dev, libutf8proc-dev, libsentencepiece-dev). Named after
    // the static library above, so the linker resolves its references to them.
    for library in TOKENIZER_LIBRARIES {
        println!("cargo:rustc-link-lib={library}");
    }
    println!("cargo:rustc-link-lib=pthread");
    // Dependents' build scripts read it as DEP_TINYLOOP_INCLUDE.
    println!("cargo:include={}", root.join("capi").join("include").display());
}

/// Compiles the CUDA sources with nvcc and links the CUDA libraries. The static libraries are bundled into this
/// crate's rlib, so the calls between them and the C++ core (each way) resolve in one archive.
///
/// Each source is its own `cc` build: given several files, cc 1.0 compiles CUDA with `--device-c` (relocatable
/// device code), which ptxas optimises less well than CMake's whole-program compile (more registers and spills:
/// the same kernels ran 5-23% slower through the crate on the H200). The builds run in parallel threads.
fn build_cuda(root: &Path, cuda: &CudaToolkit) {
    // (source, built for sm_90a alone): the sources of cuda/sources_sm90a.txt are, when the list includes 90, as
    // CMakeLists.txt does it.
    let sm90a = cuda.archs.iter().any(|arch| arch.starts_with("90"));
    let sources: Vec<(PathBuf, bool)> = read_source_list(root, "cuda/sources.txt")
        .into_iter()
        .map(|source| (source, false))
        .chain(read_source_list(root, "cuda/sources_sm90a.txt").into_iter().map(|source| (source, sm90a)))
        .collect();
    println!("cargo:rerun-if-changed={}", root.join("cuda").display());
    let nvcc = cuda.root.join("bin").join("nvcc");
    if !nvcc.is_file() {
        panic!("the `cuda` feature needs nvcc, and {} does not exist (set CUDA_HOME)", nvcc.display());
    }
    // cc takes nvcc from the NVCC variable; the toolkit found above wins over a `nvcc` on PATH.
    if env::var_os("NVCC").is_none() {
        env::set_var("NVCC", &nvcc);
    }
    let configured = |source: &Path, sm90a_only: bool| {
        let mut build = cc::Build::new();
        build
            .cuda(true)
            .cudart("static")
            .flag("-std=c++17")
            .flag("--expt-relaxed-constexpr")
            .flag("-lineinfo")
            // CMake's Release flags (CMAKE_CUDA_FLAGS_RELEASE is -O3 -DNDEBUG) in every cargo profile. cc would pass
            // -G in a debug profile, which makes device code unoptimised and very slow: never for kernels.
            .debug(false)
            .force_frame_pointer(false)
            .opt_level(3)
            .define("NDEBUG", None)
            .flag("-Xcompiler=-fvisibility=hidden")
            // The kernels include nothing from cpp/ or capi/ (tools/check_layers.py): cuda/ alone.
            .include(root.join("cuda"))
            .define("TINYLOOP_BUILDING_LIBRARY", None)
            .define("TL_WITH_CUDA", "1");
        if sm90a_only {
            // wgmma: sm_90a code runs on compute capability 9.0 alone, which the launchers check at run time.
            build.flag("-gencode=arch=compute_90a,code=sm_90a").define("TL_HAVE_SM90A", "1");
        } else {
            for arch in &cuda.archs {
                build.flag(&format!("-gencode=arch=compute_{arch},code=sm_{arch}"));
            }
            // PTX of the newest architecture too, so that a newer GPU can compile the kernels at load time.
            if let Some(newest) = cuda.archs.last() {
                build.flag(&format!("-gencode=arch=compute_{newest},code=compute_{newest}"));
            }
        }
        build.file(source);
        build
    };
    // One library per source, named after its path: "cuda/marlin/marlin_gemm.cu" -> "tinyloop_cuda_marlin_marlin_gemm".
    let library_name = |source: &Path| {
        let relative = source.strip_prefix(root).unwrap_or(source).with_extension("");
        let stem: String =
            relative.to_string_lossy().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
        format!("tinyloop_{stem}")
    };
    let jobs = env::var("NUM_JOBS").ok().and_then(|n| n.parse::<usize>().ok()).unwrap_or(1).max(1);
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..jobs.min(sources.len()))
            .map(|_| {
                scope.spawn(|| loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    match sources.get(i) {
                        Some((source, sm90a_only)) => configured(source, *sm90a_only).compile(&library_name(source)),
                        None => break,
                    }
                })
            })
            .collect();
        for worker in workers {
            if worker.join().is_err() {
                panic!("compiling a CUDA source failed (see the nvcc output above)");
            }
        }
    });

    let lib64 = cuda.root.join("lib64");
    println!("cargo:rustc-link-search=native={}", lib64.display());
    // cuBLAS is not linked: the library loads it at run time (cuda/cublas_loader.cpp).
    // What the static CUDA runtime and that loader need from the system.
    for lib in ["dl", "rt"] {
        println!("cargo:rustc-link-lib={lib}");
    }
}

fn find_cuda() -> CudaToolkit {
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    println!("cargo:rerun-if-env-changed=NVCC");
    println!("cargo:rerun-if-env-changed=TINYLOOP_CUDA_ARCHS");
    let root = env::var_os("CUDA_HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/usr/local/cuda"));
    let version = Command::new(root.join("bin").join("nvcc"))
        .arg("--version")
        .output()
        .ok()
        .and_then(|out| parse_nvcc_release(&String::from_utf8_lossy(&out.stdout)))
        .unwrap_or_default();
    let archs_text = env::var("TINYLOOP_CUDA_ARCHS").unwrap_or_else(|_| DEFAULT_CUDA_ARCHS.to_owned());
    let archs = parse_cuda_archs(&archs_text).unwrap_or_else(|bad| {
        panic!("TINYLOOP_CUDA_ARCHS={archs_text:?}: {bad:?} is not an architecture like 90 or 90a")
    });
    if archs.is_empty() {
        panic!("TINYLOOP_CUDA_ARCHS={archs_text:?} names no architecture");
    }
    CudaToolkit { root, version, archs }
}

/// "80;86,90a" -> ["80", "86", "90a"]: separated by ';', ',' or spaces; digits with an optional letter suffix.
fn parse_cuda_archs(text: &str) -> Result<Vec<String>, String> {
    text.split(|c: char| c == ';' || c == ',' || c.is_whitespace())
        .filter(|item| !item.is_empty())
        .map(|item| {
            let digits = item.trim_end_matches(|c: char| c.is_ascii_lowercase());
            let valid =
                !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit()) && item.len() - digits.len() <= 1;
            if valid {
                Ok(item.to_owned())
            } else {
                Err(item.to_owned())
            }
        })
        .collect()
}

/// "Cuda compilation tools, release 13.0, V13.0.88" -> "13.0.88".
fn parse_nvcc_release(text: &str) -> Option<String> {
    let line = text.lines().find(|line| line.contains("release"))?;
    let version = line.rsplit(", V").next()?.trim();
    Some(version.to_owned())
}

/// The paths in a source list (`#` comments, blank lines skipped), resolved against the source root (the
/// repository or `csrc/`) and checked to exist.
fn read_source_list(root: &Path, list: &str) -> Vec<PathBuf> {
    let list_path = root.join(list);
    let text = fs::read_to_string(&list_path).unwrap_or_else(|e| {
        panic!(
            "cannot read {}: {e} (in a packaged crate, run vendor-sources.sh again before `cargo package`)",
            list_path.display()
        )
    });
    println!("cargo:rerun-if-changed={}", list_path.display());
    let sources: Vec<PathBuf> = text
        .lines()
        .map(|line| line.split('#').next().unwrap_or("").trim())
        .filter(|line| !line.is_empty())
        .map(|source| {
            let path = root.join(source);
            if !path.is_file() {
                panic!("{} lists {source}, which does not exist", list_path.display());
            }
            println!("cargo:rerun-if-changed={}", path.display());
            path
        })
        .collect();
    if sources.is_empty() {
        panic!("{} lists no sources", list_path.display());
    }
    sources
}

/// "GNU 12.2.0" / "Clang 16.0.6", like CMake's "${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION}".
fn compiler_description(build: &cc::Build) -> String {
    let tool = build.get_compiler();
    let (id, version_flag) = if tool.is_like_clang() {
        ("Clang", "-dumpversion")
    } else if tool.is_like_gnu() {
        // GCC's -dumpversion gives only the major version.
        ("GNU", "-dumpfullversion")
    } else {
        return tool.path().display().to_string();
    };
    let version = Command::new(tool.path())
        .arg(version_flag)
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .unwrap_or_default();
    format!("{id} {version}").trim().to_owned()
}

/// The equivalent of what CMake generates from `capi/src/build_info.hpp.in`.
fn write_build_info(path: &Path, compiler: &str, cuda: Option<&CudaToolkit>) {
    let (cuda_version, cuda_archs) = match cuda {
        // tl_build_info reports architectures as integers, as CMake's list does ("90a" -> 90).
        Some(cuda) => (
            cuda.version.clone(),
            cuda.archs
                .iter()
                .map(|arch| arch.trim_end_matches(|c: char| c.is_ascii_lowercase()))
                .collect::<Vec<_>>()
                .join(","),
        ),
        None => (String::new(), String::new()),
    };
    let text = format!(
        "// Generated by rust/tinyloop-sys/build.rs (the equivalent of capi/src/build_info.hpp.in).\n\
         #pragma once\n\
         #define TL_BUILD_COMPILER {}\n\
         #define TL_BUILD_TYPE {}\n\
         #define TL_BUILD_CUDA_VERSION {}\n\
         #define TL_BUILD_CUDA_ARCHS {}\n",
        c_string_literal(compiler),
        // The C++ core is always built with CMake's Release flags whatever cargo's profile.
        c_string_literal(BUILD_TYPE),
        c_string_literal(&cuda_version),
        c_string_literal(&cuda_archs),
    );
    // Rewritten only when it changes, so that an unchanged build does not recompile what includes it.
    if fs::read_to_string(path).ok().as_deref() != Some(text.as_str()) {
        fs::write(path, text).expect("write build_info.hpp");
    }
}

fn c_string_literal(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_ascii_graphic() || c == ' ' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
    out
}
