//! Loading models: the fixture's configuration and weights, load options, and load errors.

mod common;

use common::{fixture, max_distinct_per_group, ScratchFile};
use tinyloop::{DispatchSetting, Error, HeadKind, LoadOptions, Model, Weight, WeightRef};

/// The fixture's quantized weights, as docs/format.md names and shapes them for d_model 64, 4 heads of 16,
/// ffn 128, one pre block: (name, k, n).
fn expected_weights() -> Vec<(String, usize, usize)> {
    let mut out = Vec::new();
    for block in ["pre.0", "loop"] {
        for (linear, k, n) in [
            ("attn_qkv", 64, 3 * 64),
            ("attn_out", 64, 64),
            ("mlp_gate", 64, 128),
            ("mlp_up", 64, 128),
            ("mlp_down", 128, 64),
        ] {
            out.push((format!("{block}.{linear}"), k, n));
        }
    }
    out
}

#[test]
fn the_fixture_reports_its_configuration() {
    let path = fixture();
    let model = Model::load(&path).unwrap();
    let info = model.info();
    assert_eq!((info.d_model, info.n_heads, info.head_dim, info.ffn, info.vocab), (64, 4, 16, 128, 256));
    assert_eq!((info.n_pre, info.n_loops, info.max_seq, info.group_size, info.bits), (1, 2, 128, 32, 4));
    assert_eq!(info.head_kind, HeadKind::Tied);
    assert_eq!(info.n_quant_weights, 10);
    assert!(info.format_version >= 1);
    assert!(info.rope_theta > 0.0 && info.norm_eps > 0.0);
    assert_eq!(info.file_bytes, std::fs::metadata(&path).unwrap().len());
    assert!(info.tensor_bytes > 0 && info.tensor_bytes < info.file_bytes);
    assert!(info.n_tensors > info.n_quant_weights);

    let weights: Vec<WeightRef<'_>> = model.weights().collect();
    assert_eq!(weights.iter().map(|w| w.info().bytes).sum::<u64>(), info.quant_weight_bytes);
    let quantized_params: u64 = weights.iter().map(|w| (w.info().k * w.info().n) as u64).sum();
    let embedding_params = (info.vocab * info.d_model) as u64;
    assert!(info.parameter_count >= quantized_params + embedding_params, "{} parameters", info.parameter_count);
}

#[test]
fn weights_are_listed_in_block_order_with_their_shapes() {
    let model = Model::load(fixture()).unwrap();
    let expected = expected_weights();
    assert_eq!(model.weights().len(), expected.len());
    for (weight, (name, k, n)) in model.weights().zip(&expected) {
        let info = weight.info();
        assert_eq!(weight.name(), name);
        assert_eq!((info.k, info.n, info.group_size, info.n_groups, info.bits), (*k, *n, 32, k / 32, 4), "{name}");
        assert!(info.borrowed, "{name} is borrowed from the model");
        let channels = if info.has_frac4 { k * n / 2 } else { 0 } + if info.has_sign_bit { k * n / 8 } else { 0 };
        assert_eq!(info.bytes, (k * n / 2 + 2 * 2 * n * (k / 32) + channels) as u64, "{name}");

        let w = weight.dequantize().unwrap();
        assert_eq!(w.len(), k * n);
        assert!(w.iter().all(|v| v.is_finite()), "{name} has non-finite values");
        assert!(w.iter().any(|&v| v != w[0]), "{name} is constant");
        assert!(max_distinct_per_group(&w, *k, 32) <= 16, "{name} has more than 16 levels in a group");
    }
}

#[test]
fn find_weight_returns_the_listed_weight_or_not_found() {
    let model = Model::load(fixture()).unwrap();
    for listed in model.weights() {
        let found = model.find_weight(listed.name()).unwrap();
        assert_eq!(found.info(), listed.info());
        assert_eq!(found.dequantize().unwrap(), listed.dequantize().unwrap());
    }
    match model.find_weight("loop.mlp_sideways") {
        Err(Error::NotFound(message)) => assert!(message.contains("loop.mlp_sideways"), "{message}"),
        other => panic!("expected NotFound, got {other:?}"),
    }
    assert!(matches!(model.find_weight("loop.\0mlp_up"), Err(Error::InvalidArgument(_))));
}

#[test]
fn load_options_do_not_change_the_model() {
    let mapped = Model::load(fixture()).unwrap();
    let read = Model::load_with(fixture(), &LoadOptions { use_mmap: false, validate_values: false }).unwrap();
    assert_eq!(mapped.info(), read.info());
    for (a, b) in mapped.weights().zip(read.weights()) {
        assert_eq!(a.info(), b.info());
        assert_eq!(a.dequantize().unwrap(), b.dequantize().unwrap(), "{}", a.name());
    }
}

#[test]
fn a_missing_file_is_an_io_error_naming_the_path() {
    let missing = ScratchFile::new("tinyloop-missing");
    match Model::load(&missing.0) {
        Err(Error::Io(message)) => {
            assert!(message.contains(missing.0.to_str().unwrap()), "the message does not name the path: {message}")
        }
        other => panic!("expected Io, got {other:?}"),
    }
}

/// Writes `bytes` to a scratch file and loads it.
fn load_bytes(bytes: &[u8]) -> tinyloop::Result<Model> {
    let file = ScratchFile::new("tinyloop-malformed");
    std::fs::write(&file.0, bytes).unwrap();
    Model::load(&file.0)
}

/// A safetensors file: 8-byte little-endian header length, then the JSON header, then data.
fn safetensors(header: &str, data: &[u8]) -> Vec<u8> {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    bytes
}

#[test]
fn malformed_files_are_format_errors() {
    let mut header_past_the_end = safetensors("{}", &[]);
    header_past_the_end[..8].copy_from_slice(&(1u64 << 20).to_le_bytes());
    let cases = [
        ("header that is not JSON", safetensors("this is not json", &[])),
        ("header longer than the file", header_past_the_end),
        ("no tensors and no config", safetensors("{\"__metadata__\":{}}", &[])),
        (
            "tensor data past the end",
            safetensors("{\"embed\":{\"dtype\":\"F32\",\"shape\":[256,64],\"data_offsets\":[0,65536]}}", &[0; 16]),
        ),
    ];
    for (what, bytes) in cases {
        match load_bytes(&bytes) {
            Err(Error::Format(message)) => assert!(!message.is_empty(), "{what}: empty message"),
            other => panic!("{what}: expected Format, got {other:?}"),
        }
    }
}

#[test]
fn a_nul_in_the_path_is_an_invalid_argument() {
    assert!(matches!(Model::load("tiny\0.tinyloop"), Err(Error::InvalidArgument(_))));
}

#[test]
fn models_and_weights_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Model>();
    assert_send_sync::<Weight>();
    assert_send_sync::<WeightRef<'static>>();

    // Loaded on one thread, read on others, freed on another.
    let model = std::thread::spawn(|| Model::load(fixture()).unwrap()).join().unwrap();
    std::thread::scope(|scope| {
        for weight in model.weights() {
            scope.spawn(move || assert_eq!(weight.dequantize().unwrap().len(), weight.info().k * weight.info().n));
        }
    });
    std::thread::spawn(move || drop(model)).join().unwrap();
}

#[test]
fn dispatch_settings_belong_to_the_model() {
    let a = Model::load(fixture()).unwrap();
    let b = Model::load(fixture()).unwrap();
    let default = tinyloop::get_dispatch(DispatchSetting::CublasMinM).unwrap();
    a.set_dispatch(DispatchSetting::CublasMinM, Some(64)).unwrap();
    assert_eq!(a.dispatch(DispatchSetting::CublasMinM).unwrap(), 64);
    assert_eq!(b.dispatch(DispatchSetting::CublasMinM).unwrap(), default, "one model's setting changed another's");
    a.set_dispatch(DispatchSetting::CublasMinM, None).unwrap();
    assert_eq!(a.dispatch(DispatchSetting::CublasMinM).unwrap(), default);
    assert!(matches!(a.set_dispatch(DispatchSetting::UseMarlin, Some(2)), Err(Error::InvalidArgument(_))));
    assert!(matches!(a.set_dispatch(DispatchSetting::Attention, Some(1)), Ok(())));
}
