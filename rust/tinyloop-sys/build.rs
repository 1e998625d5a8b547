//! Builds (or finds) the TinyLoop C library for the bindings.
//!
//! Default: compiles the C++ core with the `cc` crate from `cpp/sources.txt`, the same list CMake reads, into a
//! static library. With the `cuda` feature: also the CUDA sources of `cuda/sources.txt` through nvcc (the `cc`
//! crate's CUDA support), for the architectures of `TINYLOOP_CUDA_ARCHS` (default `80;86;89;90`), and links the
//! static CUDA runtime and cuBLAS. With `TINYLOOP_LIB_DIR` set: links the prebuilt shared `libtinyloop` found
//! there instead. No path needs a GPU or `nvidia-smi`.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The GPUs the project supports: Ampere (80, 86), Ada (89), Hopper (90). Same default as CMakeLists.txt.
const DEFAULT_CUDA_ARCHS: &str = "80;86;89;90";

fn main() {
    println!("cargo:rerun-if-env-changed=TINYLOOP_LIB_DIR");
    if let Some(dir) = env::var_os("TINYLOOP_LIB_DIR") {
        if cuda_feature() {
            println!(
                "cargo:warning=TINYLOOP_LIB_DIR is set: the `cuda` feature has no effect, the prebuilt library decides"
            );
        }
        link_prebuilt(Path::new(&dir));
    } else {
        build_from_source();
    }
}

fn cuda_feature() -> bool {
    env::var_os("CARGO_FEATURE_CUDA").is_some()
}

fn link_prebuilt(dir: &Path) {
    if !dir.is_dir() {
        panic!("TINYLOOP_LIB_DIR={} is not a directory", dir.display());
    }
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-lib=dylib=tinyloop");
}

/// Where the CUDA toolkit is and what it builds for.
struct CudaToolkit {
    root: PathBuf,
    version: String,
    /// Architecture names as nvcc spells them after `sm_` (e.g. "90", "90a").
    archs: Vec<String>,
}

fn build_from_source() {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let repo_root = manifest_dir.join("..").join("..");
    let mut cxx_sources = read_source_list(&repo_root, "cpp/sources.txt");
    cxx_sources.extend(read_source_list(&repo_root, "capi/sources.txt"));
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let generated = out_dir.join("generated");
    fs::create_dir_all(&generated).expect("create OUT_DIR/generated");
    let cuda = cuda_feature().then(find_cuda);

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .flag("-std=c++17")
        .opt_level(2)
        .include(repo_root.join("capi").join("include"))
        .include(repo_root.join("cpp"))
        .include(&generated)
        // nlohmann/json.hpp (header-only, Debian's nlohmann-json3-dev).
        .include("/usr/include")
        // Eigen/Cholesky for the GPTQ quantizer (header-only, Debian's libeigen3-dev).
        .include("/usr/include/eigen3")
        .define("TINYLOOP_BUILDING_LIBRARY", None);
    if let Some(cuda) = &cuda {
        // gpu_backend.cpp includes the CUDA runtime, cuBLAS and cuda/gpu_kernels.hpp.
        build.define("TL_WITH_CUDA", "1").include(repo_root.join("cuda")).include(cuda.root.join("include"));
    }
    build.files(&cxx_sources);
    // The sources include headers from these folders; cargo watches a folder's whole tree.
    for dir in ["cpp", "capi"] {
        println!("cargo:rerun-if-changed={}", repo_root.join(dir).display());
    }
    write_build_info(&generated.join("build_info.hpp"), &compiler_description(&build), cuda.as_ref());
    // cc links the C++ standard library (libstdc++ with GCC on Linux) itself because cpp(true) is set.
    build.compile("tinyloop");

    if let Some(cuda) = &cuda {
        build_cuda(&repo_root, &generated, cuda);
    }
    println!("cargo:rustc-link-lib=pthread");
}

/// Compiles the CUDA sources with nvcc and links the CUDA libraries. The static libraries are bundled into this
/// crate's rlib, so the calls between them and the C++ core (each way) resolve in one archive.
///
/// Each source is its own `cc` build: given several files, cc 1.0 compiles CUDA with `--device-c` (relocatable
/// device code), which ptxas optimises less well than CMake's whole-program compile (more registers and spills:
/// the same kernels ran 5-23% slower through the crate on the H200). The builds run in parallel threads.
fn build_cuda(repo_root: &Path, generated: &Path, cuda: &CudaToolkit) {
    // (source, built for sm_90a alone): the sources of cuda/sources_sm90a.txt are, when the list includes 90, as
    // CMakeLists.txt does it.
    let sm90a = cuda.archs.iter().any(|arch| arch.starts_with("90"));
    let sources: Vec<(PathBuf, bool)> = read_source_list(repo_root, "cuda/sources.txt")
        .into_iter()
        .map(|source| (source, false))
        .chain(read_source_list(repo_root, "cuda/sources_sm90a.txt").into_iter().map(|source| (source, sm90a)))
        .collect();
    println!("cargo:rerun-if-changed={}", repo_root.join("cuda").display());
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
            // cc passes -G for a debug profile, which makes device code unoptimised and very slow: never for kernels.
            .debug(false)
            .opt_level(2)
            .include(repo_root.join("cuda"))
            .include(repo_root.join("cpp"))
            .include(repo_root.join("capi").join("include"))
            .include(generated)
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
        let relative = source.strip_prefix(repo_root).unwrap_or(source).with_extension("");
        let stem: String = relative
            .to_string_lossy()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
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
    println!("cargo:rustc-link-lib=dylib=cublas");
    // What the static CUDA runtime needs from the system.
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

/// The paths in a source list (`#` comments, blank lines skipped), resolved against the repository root and
/// checked to exist.
fn read_source_list(repo_root: &Path, list: &str) -> Vec<PathBuf> {
    let list_path = repo_root.join(list);
    let text = fs::read_to_string(&list_path).unwrap_or_else(|e| {
        panic!(
            "cannot read {}: {e}. tinyloop-sys builds the library from the TinyLoop repository it lives in; \
             outside it, set TINYLOOP_LIB_DIR to a directory holding a prebuilt libtinyloop",
            list_path.display()
        )
    });
    println!("cargo:rerun-if-changed={}", list_path.display());
    let sources: Vec<PathBuf> = text
        .lines()
        .map(|line| line.split('#').next().unwrap_or("").trim())
        .filter(|line| !line.is_empty())
        .map(|source| {
            let path = repo_root.join(source);
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
        // The C++ core is always built at -O2 whatever cargo's profile.
        c_string_literal("cargo -O2"),
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
