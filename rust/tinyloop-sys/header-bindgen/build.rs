//! Runs bindgen on `capi/include/tinyloop.h` and writes, to `OUT_DIR`:
//!
//! - `header_bindings.rs`: the bindings (with bindgen's layout tests), then one `drift_table!` invocation per
//!   kind of item, listing the items bindgen generated (see the crate docs);
//! - `header_bindings_macro.rs`: the `header_bindings!` macro, which includes the first file by its absolute
//!   path wherever it is invoked.
//!
//! Every item bindgen generates is listed or rejected: an item of a kind the drift test does not compare (an
//! enum, a union, an extern variable, ...) stops the build with its name, so nothing in the header goes
//! unchecked unnoticed.

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::PathBuf;

use syn::{FnArg, ForeignItem, Item, Pat};

fn main() {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let header = manifest_dir.join("../../../capi/include/tinyloop.h");
    let header = header.canonicalize().unwrap_or_else(|e| panic!("cannot find {}: {e}", header.display()));
    let header = header.to_str().expect("the header's path is UTF-8").to_owned();
    println!("cargo:rerun-if-changed={header}");
    // What bindgen and clang-sys read from the environment to find and run libclang.
    for var in ["LIBCLANG_PATH", "CLANG_PATH", "LLVM_CONFIG_PATH", "BINDGEN_EXTRA_CLANG_ARGS"] {
        println!("cargo:rerun-if-env-changed={var}");
    }

    let bindings = bindgen::Builder::default()
        .header(header.as_str())
        // The header is plain C99 (its own comment says so).
        .clang_arg("-std=c99")
        .allowlist_function("tl_.*")
        .allowlist_type("tl_.*")
        .allowlist_var("TL_.*")
        // size_t is usize in the hand-written bindings, as the Rust FFI convention has it.
        .size_t_is_usize(true)
        .layout_tests(true)
        .generate_comments(false)
        .rustfmt_bindings(false)
        .generate()
        .unwrap_or_else(|e| panic!("bindgen failed on {header}: {e}"));
    let code = bindings.to_string();
    let file = syn::parse_file(&code).unwrap_or_else(|e| panic!("bindgen's output for {header} does not parse: {e}"));

    let mut constants = Vec::new();
    let mut types = Vec::new();
    let mut handles = Vec::new();
    let mut structs = Vec::new();
    let mut functions = Vec::new();
    for item in &file.items {
        match item {
            Item::Const(item) => constants.push(item.ident.to_string()),
            Item::Type(item) => {
                let name = item.ident.to_string();
                // bindgen also emits the system typedefs that <stdint.h>'s types resolve through (`__uint32_t`);
                // the header's own fields and parameters use the fixed-width types, which bindgen maps to u32 etc.
                if !name.starts_with("__") {
                    types.push(name);
                }
            }
            Item::Struct(item) => {
                let name = item.ident.to_string();
                let fields: Vec<String> = item
                    .fields
                    .iter()
                    .map(|field| match &field.ident {
                        Some(ident) => ident.to_string(),
                        None => panic!("bindgen generated a tuple struct {name}; the drift test compares named fields"),
                    })
                    .collect();
                // `typedef struct tl_model tl_model;` (no body) becomes a struct with one `_unused: [u8; 0]` field.
                if fields == ["_unused"] {
                    handles.push(name);
                } else {
                    structs.push((name, fields));
                }
            }
            Item::ForeignMod(block) => {
                for foreign in &block.items {
                    match foreign {
                        ForeignItem::Fn(function) => {
                            let name = function.sig.ident.to_string();
                            let parameters: Vec<String> = function
                                .sig
                                .inputs
                                .iter()
                                .map(|input| match input {
                                    FnArg::Typed(typed) => match &*typed.pat {
                                        Pat::Ident(ident) => ident.ident.to_string(),
                                        _ => panic!("cannot name a parameter of {name} in bindgen's output"),
                                    },
                                    FnArg::Receiver(_) => panic!("bindgen generated a method {name}"),
                                })
                                .collect();
                            functions.push((name, parameters));
                        }
                        ForeignItem::Static(variable) => panic!(
                            "bindgen generated the extern variable {}, which the drift test does not compare",
                            variable.ident
                        ),
                        _ => panic!("bindgen generated a foreign item the drift test does not compare"),
                    }
                }
            }
            // bindgen's layout tests, kept: they run with the tests of the crate that includes the bindings.
            Item::Fn(test) if test.sig.ident.to_string().starts_with("bindgen_test_layout_") => {}
            Item::Enum(item) => {
                panic!("bindgen generated the enum {}, which the drift test does not compare", item.ident)
            }
            Item::Union(item) => {
                panic!("bindgen generated the union {}, which the drift test does not compare", item.ident)
            }
            _ => panic!("bindgen generated an item of a kind the drift test does not compare (see {header})"),
        }
    }

    let mut out = code;
    let list = |names: &[String]| names.join(", ");
    writeln!(out, "\ndrift_table!(constants: {});", list(&constants)).unwrap();
    writeln!(out, "drift_table!(types: {});", list(&types)).unwrap();
    writeln!(out, "drift_table!(handles: {});", list(&handles)).unwrap();
    out += "drift_table!(structs:";
    for (name, fields) in &structs {
        write!(out, "\n    {name} {{ {} }}", list(fields)).unwrap();
    }
    out += "\n);\ndrift_table!(functions:";
    for (name, parameters) in &functions {
        write!(out, "\n    {name}({})", list(parameters)).unwrap();
    }
    out += "\n);\n";

    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let bindings_path = out_dir.join("header_bindings.rs");
    fs::write(&bindings_path, out).expect("write header_bindings.rs");
    let bindings_path = bindings_path.to_str().expect("OUT_DIR is UTF-8");
    let macro_text = format!(
        "/// Expands to bindgen's bindings of `tinyloop.h` followed by the `drift_table!` invocations that list\n\
         /// them (see the crate docs).\n\
         #[macro_export]\n\
         macro_rules! header_bindings {{\n    () => {{\n        include!({bindings_path:?});\n    }};\n}}\n"
    );
    fs::write(out_dir.join("header_bindings_macro.rs"), macro_text).expect("write header_bindings_macro.rs");
}
