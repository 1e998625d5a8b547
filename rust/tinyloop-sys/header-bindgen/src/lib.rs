//! bindgen's bindings of `capi/include/tinyloop.h`, for the drift test of `tinyloop-sys` (a dev-dependency
//! there; nothing else uses this crate).
//!
//! The build script runs bindgen on the header and writes the bindings, followed by `drift_table!`
//! invocations that list what the header declares, to a file in `OUT_DIR`. [`header_bindings!`] includes that
//! file where it is invoked, so the bindings are compiled in the caller's crate, next to the hand-written
//! declarations they are compared with, and with the caller's `drift_table!` macro:
//!
//! ```text
//! mod header {
//!     tinyloop_sys_header_bindgen::header_bindings!();
//! }
//! ```
//!
//! The `drift_table!` invocations take these forms (each item once, in the header's order):
//!
//! - `drift_table!(constants: TL_OK, TL_ERR_IO, ...);`: `static const` variables and numeric macros;
//! - `drift_table!(types: tl_status, tl_log_fn, ...);`: typedefs other than of structs;
//! - `drift_table!(handles: tl_model, ...);`: structs declared without a body (opaque handles);
//! - `drift_table!(structs: tl_load_options { struct_size, use_mmap, validate_values } ...);`: structs with
//!   their fields in order;
//! - `drift_table!(functions: tl_status_string(status) ...);`: functions with their parameters.
//!
//! bindgen's layout tests (`#[test] fn bindgen_test_layout_*`) come with the bindings: they check that the
//! structs bindgen generated have the sizes, alignments and field offsets libclang reports for the header.

include!(concat!(env!("OUT_DIR"), "/header_bindings_macro.rs"));
