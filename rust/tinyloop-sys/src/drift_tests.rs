//! Checks that these bindings still mirror `capi/include/tinyloop.h`, by comparing them with the bindings bindgen
//! generates from the header (the `tinyloop-sys-header-bindgen` dev-dependency runs bindgen with libclang and
//! includes its output in the module `header` below). Compared: constants (names, values, types), type aliases
//! (the types they name), opaque handles (names), structs (size, alignment, field names in order, field offsets
//! and types) and functions (names and signatures).
//!
//! Both sides' tables are built by the same `drift_table!` macro (lib.rs) from compiled items, so sizes, offsets
//! and types are what the compiler gives for each declaration. bindgen's own layout tests, included with its
//! bindings (`header::bindgen_test_layout_*`), check that its structs have the layouts libclang computes for
//! the C header, so the hand-written layouts are compared, through them, with the C compiler's. bindgen
//! evaluates the header's `static const` variables itself, so their values come from libclang too.

use std::collections::BTreeSet;
use std::fmt::Display;

/// bindgen's bindings of tinyloop.h, and their `drift_table!` tables.
#[allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    deref_nullptr,
    clippy::all,
    // bindgen declares the same functions again, with its own struct types in the signatures.
    clashing_extern_declarations
)]
mod header {
    tinyloop_sys_header_bindgen::header_bindings!();
}

/// One constant: its value (as i64) and type.
pub(crate) struct Constant {
    pub name: &'static str,
    pub value: i64,
    pub type_name: &'static str,
}

/// One type alias and the type it names.
pub(crate) struct Alias {
    pub name: &'static str,
    pub type_name: &'static str,
}

/// The layout of one `#[repr(C)]` struct.
pub(crate) struct StructLayout {
    pub name: &'static str,
    pub size: usize,
    pub align: usize,
    pub fields: Vec<Field>,
}

/// One field of a struct.
pub(crate) struct Field {
    pub name: &'static str,
    pub offset: usize,
    pub type_name: &'static str,
}

/// One function and its signature, as the type of a pointer to it.
pub(crate) struct Function {
    pub name: &'static str,
    pub signature: &'static str,
}

pub(crate) fn type_name_of<T>(_: &T) -> &'static str {
    std::any::type_name::<T>()
}

/// The type of the field that `field` projects to.
pub(crate) fn field_type_name<S, F>(_field: impl Fn(&S) -> &F) -> &'static str {
    std::any::type_name::<F>()
}

/// A type name from the header side, with the header's structs and handles named as lib.rs's are: the two
/// sides declare the same C types as different Rust types (`header::tl_model`, `crate::tl_model`).
fn from_header(type_name: &str) -> String {
    type_name.replace(concat!(module_path!(), "::header::"), "tinyloop_sys::")
}

/// Compares the names on both sides and, for each name on both, what `compare` reports; returns the
/// differences, one line each, naming the item.
fn differences<T>(
    kind: &str,
    header: &[T],
    rust: &[T],
    name: impl Fn(&T) -> &'static str,
    compare: impl Fn(&T, &T, &mut Vec<String>),
) -> Vec<String> {
    let names = |items: &[T]| items.iter().map(&name).collect::<BTreeSet<_>>();
    let (header_names, rust_names) = (names(header), names(rust));
    let mut out = Vec::new();
    for missing in header_names.difference(&rust_names) {
        out.push(format!("{kind} {missing} is in the header but not in lib.rs"));
    }
    for extra in rust_names.difference(&header_names) {
        out.push(format!("{kind} {extra} is in lib.rs but not in the header"));
    }
    for c in header {
        if let Some(r) = rust.iter().find(|r| name(r) == name(c)) {
            compare(c, r, &mut out);
        }
    }
    out
}

/// Records a difference when the header's value and lib.rs's differ.
fn expect_same<V: PartialEq + Display>(out: &mut Vec<String>, what: String, header: V, rust: V) {
    if header != rust {
        out.push(format!("{what}: the header has {header}, lib.rs has {rust}"));
    }
}

fn assert_none(differences: Vec<String>) {
    assert!(differences.is_empty(), "lib.rs has drifted from tinyloop.h:\n  {}", differences.join("\n  "));
}

#[test]
fn constants_match_the_header() {
    assert_none(differences(
        "constant",
        &header::drift_constants(),
        &crate::drift_constants(),
        |c| c.name,
        |c, r, out| {
            expect_same(out, format!("value of {}", c.name), c.value, r.value);
            expect_same(out, format!("type of {}", c.name), from_header(c.type_name), r.type_name.to_owned());
        },
    ));
}

#[test]
fn type_aliases_match_the_header() {
    assert_none(differences(
        "type",
        &header::drift_types(),
        &crate::drift_types(),
        |t| t.name,
        |c, r, out| {
            expect_same(out, format!("type {}", c.name), from_header(c.type_name), r.type_name.to_owned());
        },
    ));
}

#[test]
fn opaque_handles_match_the_header() {
    assert_none(differences("opaque handle", &header::drift_handles(), &crate::drift_handles(), |h| *h, |_, _, _| {}));
}

#[test]
fn structs_match_the_header() {
    assert_none(differences(
        "struct",
        &header::drift_structs(),
        &crate::drift_structs(),
        |s| s.name,
        |c, r, out| {
            let field_names = |s: &StructLayout| s.fields.iter().map(|f| f.name).collect::<Vec<_>>().join(", ");
            expect_same(out, format!("fields of {} in order", c.name), field_names(c), field_names(r));
            expect_same(out, format!("size of {}", c.name), c.size, r.size);
            expect_same(out, format!("alignment of {}", c.name), c.align, r.align);
            for cf in &c.fields {
                if let Some(rf) = r.fields.iter().find(|rf| rf.name == cf.name) {
                    let field = format!("{}.{}", c.name, cf.name);
                    expect_same(out, format!("offset of {field}"), cf.offset, rf.offset);
                    expect_same(out, format!("type of {field}"), from_header(cf.type_name), rf.type_name.to_owned());
                }
            }
        },
    ));
}

#[test]
fn functions_match_the_header() {
    assert_none(differences(
        "function",
        &header::drift_functions(),
        &crate::drift_functions(),
        |f| f.name,
        |c, r, out| {
            expect_same(out, format!("signature of {}", c.name), from_header(c.signature), r.signature.to_owned());
        },
    ));
}

#[test]
fn the_header_side_is_not_empty() {
    // Guards the comparison itself: an empty bindgen output would leave every test above with only "in lib.rs
    // but not in the header" lines, but this names the cause.
    assert!(
        !header::drift_constants().is_empty()
            && !header::drift_structs().is_empty()
            && !header::drift_functions().is_empty(),
        "bindgen generated no constants, structs or functions from tinyloop.h"
    );
}

#[test]
fn the_crate_version_is_the_headers_version() {
    // The build script asks pkg-config for a library compatible with the crate's version (at least it, below the
    // next incompatible one), so the crate's version must be the version of the header the bindings mirror.
    let header = format!("{}.{}.{}", crate::TL_VERSION_MAJOR, crate::TL_VERSION_MINOR, crate::TL_VERSION_PATCH);
    assert_eq!(
        env!("CARGO_PKG_VERSION"),
        header,
        "tinyloop-sys's version (rust/Cargo.toml's workspace.package.version) is not the header's TL_VERSION_*"
    );
}
