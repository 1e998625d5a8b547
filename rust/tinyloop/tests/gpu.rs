//! The GPU wrappers: devices, streams, device buffers, packing, workspaces, quant_gemm and the dispatcher.
//!
//! Without a GPU every GPU call must fail with `Error::NoDevice` (checked here); with one, quant_gemm through each
//! dispatcher path is compared with an FP64 host reference built from `dequantize()`. GPU tests print a note and
//! return early where `Device::count() == 0`.

mod common;

use std::sync::{Mutex, MutexGuard};

use common::{build_without_cuda, fixture, Rng};
use tinyloop::{
    f16_bits_to_f32, f32_to_f16_bits, get_dispatch, quant_gemm, set_dispatch, Device, DeviceBuffer, DispatchCounts,
    DispatchSetting, Error, Model, PackForms, PackOptions, QuantWeight, QuantizeOptions, Stream, Weight, Workspace,
};

/// Dispatcher settings are process-wide: tests that change them hold this lock and restore them.
static SETTINGS: Mutex<()> = Mutex::new(());

/// Holds the settings lock; restores every setting's value on drop.
struct SettingsGuard {
    saved: Vec<(DispatchSetting, u32)>,
    _lock: MutexGuard<'static, ()>,
}

impl SettingsGuard {
    fn new() -> SettingsGuard {
        let lock = SETTINGS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let saved = DispatchSetting::ALL.iter().map(|&s| (s, get_dispatch(s).unwrap())).collect();
        SettingsGuard { saved, _lock: lock }
    }
}

impl Drop for SettingsGuard {
    fn drop(&mut self) {
        for &(setting, value) in &self.saved {
            set_dispatch(setting, value).unwrap();
        }
    }
}

/// True (after printing why) when there is no GPU to run on.
fn no_gpu(test: &str) -> bool {
    let count = Device::count().unwrap();
    if count == 0 {
        eprintln!("note: {test}: no CUDA device (or a build without the `cuda` feature); GPU part skipped");
    }
    count == 0
}

fn expect_no_device<T: std::fmt::Debug>(result: tinyloop::Result<T>, what: &str) {
    match result {
        Err(Error::NoDevice(message)) => assert!(!message.is_empty(), "{what}: empty message"),
        other => panic!("{what}: expected NoDevice, got {other:?}"),
    }
}

fn random_weight(rng: &mut Rng, k: usize, n: usize, group_size: usize) -> Weight {
    let w: Vec<f32> = (0..k * n).map(|_| rng.uniform(-1.0, 1.0)).collect();
    Weight::quantize(&w, k, n, &QuantizeOptions { group_size, ..QuantizeOptions::default() }).unwrap()
}

#[test]
fn gpu_types_cross_threads_as_documented() {
    fn send<T: Send>() {}
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Device>();
    send_sync::<Stream>();
    send::<DeviceBuffer<u16>>();
    send::<DeviceBuffer<f32>>();
    send::<Workspace>();
    // Not Sync: the compile_fail examples on DeviceBuffer and Workspace check that.
}

#[test]
fn device_count_is_zero_without_cuda() {
    let count = Device::count().unwrap();
    if build_without_cuda() {
        assert_eq!(count, 0);
    }
}

#[test]
fn without_a_gpu_every_gpu_call_is_no_device() {
    if Device::count().unwrap() != 0 {
        eprintln!("note: a GPU is present; the no-device paths are not reachable here");
        return;
    }
    expect_no_device(Device::new(0).info(), "Device::info");
    expect_no_device(Stream::new(&Device::new(0)), "Stream::new");

    let mut rng = Rng::new();
    let mut weight = random_weight(&mut rng, 128, 64, 32);
    expect_no_device(weight.workspace_size(1), "workspace_size of an unpacked weight");
    expect_no_device(weight.dispatch_counts(), "dispatch_counts of an unpacked weight");
    expect_no_device(weight.pack(&PackOptions::default()), "Weight::pack");
    let all_forms = PackForms { marlin_fused: true, marlin_correction: true, fp16_body: true };
    expect_no_device(
        weight.pack(&PackOptions { forms: all_forms, ..PackOptions::default() }),
        "Weight::pack, all forms",
    );

    let mut model = Model::load(fixture()).unwrap();
    expect_no_device(model.pack(&PackOptions::default()), "Model::pack");
    // A failed pack leaves the model usable.
    let tokens = rng.tokens(20, model.info().vocab);
    assert!(model.score(&tokens, &tinyloop::ScoreOptions::default()).is_ok());
    let up = model.find_weight("loop.mlp_up").unwrap();
    expect_no_device(up.workspace_size(16), "workspace_size of a model's weight");
    expect_no_device(up.dispatch_counts(), "dispatch_counts of a model's weight");
}

#[test]
fn a_device_index_past_int32_is_an_invalid_argument() {
    let far = Device::new(usize::MAX);
    assert!(matches!(far.info(), Err(Error::InvalidArgument(_))));
    assert!(matches!(Stream::new(&far), Err(Error::InvalidArgument(_))));
    assert!(matches!(
        Model::load(fixture()).unwrap().pack(&PackOptions { device: Some(far), ..PackOptions::default() }),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn dispatch_settings_round_trip_and_reject_bad_values() {
    let _guard = SettingsGuard::new();
    let mut rng = Rng::new();
    for (setting, max) in [
        (DispatchSetting::UseMarlin, 1),
        (DispatchSetting::Fp16Body, 1),
        (DispatchSetting::CrossIterRound, 1),
        (DispatchSetting::MarlinMode, 2),
        (DispatchSetting::CublasMinM, i32::MAX as u32),
    ] {
        let value = if max == 1 || max == 2 { rng.below(max as usize + 1) as u32 } else { rng.below(100_000) as u32 };
        set_dispatch(setting, value).unwrap();
        assert_eq!(get_dispatch(setting).unwrap(), value, "{setting:?}");
        set_dispatch(setting, max).unwrap();
        assert_eq!(get_dispatch(setting).unwrap(), max, "{setting:?}");
        if max < i32::MAX as u32 {
            match set_dispatch(setting, max + 1) {
                Err(Error::InvalidArgument(message)) => assert!(message.contains("out of range"), "{message}"),
                other => panic!("{setting:?} = {}: expected InvalidArgument, got {other:?}", max + 1),
            }
        }
        assert!(matches!(set_dispatch(setting, u32::MAX), Err(Error::InvalidArgument(_))), "{setting:?}");
        assert_eq!(get_dispatch(setting).unwrap(), max, "a rejected value changed {setting:?}");
    }
}

#[test]
fn pack_options_with_a_device_other_than_the_streams_are_rejected() {
    if no_gpu("pack_options_with_a_device_other_than_the_streams_are_rejected") {
        return;
    }
    let stream = Stream::new(&Device::new(0)).unwrap();
    let mut weight = random_weight(&mut Rng::new(), 128, 64, 32);
    let options = PackOptions { device: Some(Device::new(1)), stream: Some(&stream), ..PackOptions::default() };
    assert!(matches!(weight.pack(&options), Err(Error::InvalidArgument(_))));
}

#[test]
fn device_info_is_plausible() {
    if no_gpu("device_info_is_plausible") {
        return;
    }
    for index in 0..Device::count().unwrap() {
        let info = Device::new(index).info().unwrap();
        assert!(!info.name.is_empty());
        assert!(info.sm_major >= 3 && info.sm_count > 0, "{info:?}");
        assert!(info.total_memory >= info.free_memory && info.free_memory > 0, "{info:?}");
        assert_eq!(info.marlin_supported, info.sm_major >= 8, "{info:?}");
    }
    let past = Device::new(Device::count().unwrap());
    assert!(matches!(past.info(), Err(Error::InvalidArgument(_))));
    assert!(matches!(Stream::new(&past), Err(Error::InvalidArgument(_))));
}

#[test]
fn device_buffers_round_trip_and_check_lengths() {
    if no_gpu("device_buffers_round_trip_and_check_lengths") {
        return;
    }
    let mut rng = Rng::new();
    let stream = Stream::new(&Device::new(0)).unwrap();
    let halves: Vec<u16> = (0..1001).map(|_| rng.next_u64() as u16).collect();
    let floats: Vec<f32> = (0..333).map(|_| rng.uniform(-5.0, 5.0)).collect();
    let bytes: Vec<u8> = (0..77).map(|_| rng.next_u64() as u8).collect();
    let half_buffer = DeviceBuffer::from_slice(&stream, &halves).unwrap();
    let mut float_buffer = DeviceBuffer::from_slice(&stream, &floats).unwrap();
    let byte_buffer = DeviceBuffer::from_slice(&stream, &bytes).unwrap();
    assert_eq!(half_buffer.to_vec().unwrap(), halves);
    assert_eq!(float_buffer.to_vec().unwrap(), floats);
    assert_eq!(byte_buffer.to_vec().unwrap(), bytes);
    assert_eq!((half_buffer.len(), half_buffer.bytes()), (1001, 2002));

    let replacement: Vec<f32> = floats.iter().map(|v| v * 2.0 + 1.0).collect();
    float_buffer.upload(&replacement).unwrap();
    assert_eq!(float_buffer.to_vec().unwrap(), replacement);
    assert!(matches!(float_buffer.upload(&replacement[1..]), Err(Error::InvalidArgument(_))));
    let mut short = vec![0f32; 332];
    assert!(matches!(float_buffer.download(&mut short), Err(Error::InvalidArgument(_))));

    let mut zeros = DeviceBuffer::<i32>::zeroed(&stream, 4097).unwrap();
    assert!(zeros.to_vec().unwrap().iter().all(|&v| v == 0));
    zeros.fill_bytes(0xff).unwrap();
    assert!(zeros.to_vec().unwrap().iter().all(|&v| v == -1));

    let empty = DeviceBuffer::<u16>::zeroed(&stream, 0).unwrap();
    assert!(empty.is_empty() && empty.to_vec().unwrap().is_empty());

    // A buffer keeps its stream alive: dropping the Stream handle first is fine.
    let other = Stream::new(&Device::new(0)).unwrap();
    let kept = DeviceBuffer::from_slice(&other, &halves).unwrap();
    drop(other);
    assert_eq!(kept.to_vec().unwrap(), halves);
    stream.synchronize().unwrap();

    // Buffers move to other threads and are freed there.
    let moved = std::thread::spawn(move || kept.to_vec().unwrap()).join().unwrap();
    assert_eq!(moved, halves);
}

/// The reference Y = X · W in FP64 from the FP16 inputs and the dequantized weight, and the error bound for each
/// output: FP16 rounding of Y, of W (the FP16-body and cuBLAS paths) and FP32 accumulation.
fn reference(x: &[u16], w_nk: &[f32], m: usize, k: usize, n: usize) -> (Vec<f64>, Vec<f64>) {
    let x: Vec<f64> = x.iter().map(|&h| f64::from(f16_bits_to_f32(h))).collect();
    let mut y = vec![0.0; m * n];
    let mut bound = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let (mut sum, mut magnitude) = (0.0f64, 0.0f64);
            for l in 0..k {
                let product = x[i * k + l] * f64::from(w_nk[j * k + l]);
                sum += product;
                magnitude += product.abs();
            }
            y[i * n + j] = sum;
            bound[i * n + j] = sum.abs() / 1024.0 + magnitude / 512.0 + 1e-6;
        }
    }
    (y, bound)
}

fn random_halves(rng: &mut Rng, count: usize) -> Vec<u16> {
    (0..count).map(|_| f32_to_f16_bits(rng.uniform(-1.0, 1.0))).collect()
}

/// Runs quant_gemm into a poisoned output and checks every element against the reference.
fn check_gemm<W: QuantWeight>(
    weight: &W,
    m: usize,
    stream: &Stream,
    workspace: &mut Workspace,
    rng: &mut Rng,
    what: &str,
) {
    let info = weight.info();
    let (k, n) = (info.k, info.n);
    let x_host = random_halves(rng, m * k);
    let x = DeviceBuffer::from_slice(stream, &x_host).unwrap();
    let mut y = DeviceBuffer::<u16>::zeroed(stream, m * n).unwrap();
    y.fill_bytes(0xff).unwrap(); // NaN: an output left unwritten cannot pass
    quant_gemm(weight, &x, &mut y, m, stream, workspace).unwrap();
    let actual = y.to_vec().unwrap();
    let (expected, bound) = reference(&x_host, &weight.dequantize().unwrap(), m, k, n);
    for (index, ((&got, want), tolerance)) in actual.iter().zip(&expected).zip(&bound).enumerate() {
        let got = f64::from(f16_bits_to_f32(got));
        assert!(
            (got - want).abs() <= *tolerance,
            "{what}: '{}' k {k} n {n} m {m}: y[{}][{}] = {got}, reference {want} (tolerance {tolerance})",
            info.name,
            index / n,
            index % n
        );
    }
}

/// A dispatcher path, the settings that select it, and the counter it bumps.
struct Path {
    name: &'static str,
    settings: &'static [(DispatchSetting, u32)],
    counter: fn(&DispatchCounts) -> u64,
}

const PATHS: [Path; 5] = [
    Path { name: "native", settings: &[(DispatchSetting::UseMarlin, 0)], counter: |c| c.native },
    Path {
        name: "marlin fused",
        settings: &[(DispatchSetting::UseMarlin, 1), (DispatchSetting::MarlinMode, 1)],
        counter: |c| c.marlin_fused,
    },
    Path {
        name: "marlin correction",
        settings: &[(DispatchSetting::UseMarlin, 1), (DispatchSetting::MarlinMode, 2)],
        counter: |c| c.marlin_correction,
    },
    Path {
        name: "dequantize + cuBLAS",
        settings: &[(DispatchSetting::UseMarlin, 1), (DispatchSetting::CublasMinM, 1)],
        counter: |c| c.dequant_cublas,
    },
    Path { name: "FP16 body", settings: &[(DispatchSetting::Fp16Body, 1)], counter: |c| c.fp16_body },
];

fn select(path: &Path) {
    for setting in DispatchSetting::ALL {
        set_dispatch(setting, 0).unwrap();
    }
    set_dispatch(DispatchSetting::UseMarlin, 1).unwrap();
    for &(setting, value) in path.settings {
        set_dispatch(setting, value).unwrap();
    }
}

#[test]
fn quant_gemm_matches_an_fp64_reference_on_every_path() {
    if no_gpu("quant_gemm_matches_an_fp64_reference_on_every_path") {
        return;
    }
    let _guard = SettingsGuard::new();
    let mut rng = Rng::new();
    let stream = Stream::new(&Device::new(0)).unwrap();
    let mut workspace = Workspace::new(&stream);
    let all_forms = PackForms { marlin_fused: true, marlin_correction: true, fp16_body: true };
    // (k, n, group size; 0 = per row): group 128 and per row as in the benchmarks, group 32, and a shape the
    // Marlin-class kernel does not take (k % 64 != 0), which must run on the native kernel whatever the setting.
    for (k, n, group_size) in [(256, 256, 128), (512, 192, 0), (128, 320, 32), (96, 80, 32)] {
        let mut weight = random_weight(&mut rng, k, n, group_size);
        let report =
            weight.pack(&PackOptions { stream: Some(&stream), forms: all_forms, ..PackOptions::default() }).unwrap();
        let packable = k % 64 == 0 && n % 64 == 0;
        assert_eq!((report.weights_uploaded, report.weights_packed), (1, packable as u32), "k {k} n {n}");
        assert_eq!(report.weights_not_packable, !packable as u32);
        assert!(report.device_bytes > report.extra_device_bytes && report.extra_device_bytes >= (2 * k * n) as u64);
        assert_eq!(weight.dispatch_counts().unwrap(), DispatchCounts::default());

        for path in &PATHS {
            select(path);
            for m in [1, 7, 64, 130] {
                let before = weight.dispatch_counts().unwrap();
                check_gemm(&weight, m, &stream, &mut workspace, &mut rng, path.name);
                let after = weight.dispatch_counts().unwrap();
                assert_eq!(after.total(), before.total() + 1);
                let marlin_path = path.name.starts_with("marlin") || path.name.starts_with("dequantize");
                let counter = if marlin_path && !packable { |c: &DispatchCounts| c.native } else { path.counter };
                assert_eq!(counter(&after), counter(&before) + 1, "{} at m {m}, k {k} n {n}: {after:?}", path.name);
            }
        }
        assert!(workspace.bytes() >= weight.workspace_size(130).unwrap());
    }
}

#[test]
fn quant_gemm_checks_shapes_and_streams_before_calling_the_library() {
    if no_gpu("quant_gemm_checks_shapes_and_streams_before_calling_the_library") {
        return;
    }
    let mut rng = Rng::new();
    let stream = Stream::new(&Device::new(0)).unwrap();
    let other = Stream::new(&Device::new(0)).unwrap();
    let (k, n, m) = (128, 64, 3);
    let mut weight = random_weight(&mut rng, k, n, 32);
    let mut workspace = Workspace::new(&stream);
    let x = DeviceBuffer::from_slice(&stream, &random_halves(&mut rng, m * k)).unwrap();
    let mut y = DeviceBuffer::<u16>::zeroed(&stream, m * n).unwrap();
    // Not packed yet: the library says so.
    assert!(matches!(quant_gemm(&weight, &x, &mut y, m, &stream, &mut workspace), Err(Error::InvalidArgument(_))));
    weight.pack(&PackOptions::default()).unwrap();

    let expect_invalid = |result: tinyloop::Result<()>, what: &str| match result {
        Err(Error::InvalidArgument(message)) => assert!(!message.is_empty(), "{what}"),
        other => panic!("{what}: expected InvalidArgument, got {other:?}"),
    };
    expect_invalid(quant_gemm(&weight, &x, &mut y, m + 1, &stream, &mut workspace), "m too large for x");
    expect_invalid(quant_gemm(&weight, &x, &mut y, 0, &stream, &mut workspace), "m = 0");
    let mut y_short = DeviceBuffer::<u16>::zeroed(&stream, m * n - 1).unwrap();
    expect_invalid(quant_gemm(&weight, &x, &mut y_short, m, &stream, &mut workspace), "y too short");
    let x_elsewhere = DeviceBuffer::from_slice(&other, &random_halves(&mut rng, m * k)).unwrap();
    expect_invalid(quant_gemm(&weight, &x_elsewhere, &mut y, m, &stream, &mut workspace), "x on another stream");
    let mut other_workspace = Workspace::new(&other);
    expect_invalid(quant_gemm(&weight, &x, &mut y, m, &stream, &mut other_workspace), "workspace on another stream");
    quant_gemm(&weight, &x, &mut y, m, &stream, &mut workspace).unwrap();
    stream.synchronize().unwrap();
}

#[test]
fn a_packed_model_runs_quant_gemm_from_eight_threads_with_identical_results() {
    if no_gpu("a_packed_model_runs_quant_gemm_from_eight_threads_with_identical_results") {
        return;
    }
    let _guard = SettingsGuard::new();
    let mut rng = Rng::new();
    let lines = std::sync::Arc::new(Mutex::new(Vec::<String>::new()));
    let sink = std::sync::Arc::clone(&lines);
    tinyloop::set_log_callback(tinyloop::LogLevel::Info, move |_, line| sink.lock().unwrap().push(line.to_owned()))
        .unwrap();

    let mut model = Model::load(fixture()).unwrap();
    let report = model.pack(&PackOptions::default()).unwrap();
    assert_eq!(report.weights_uploaded as usize, model.info().n_quant_weights);
    assert_eq!(report.weights_packed + report.weights_not_packable, report.weights_uploaded);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !lines.lock().unwrap().iter().any(|l| l.starts_with("[pack]")) {
        assert!(std::time::Instant::now() < deadline, "no [pack] log line: {:?}", lines.lock().unwrap());
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    tinyloop::clear_log_callback().unwrap();

    let model = &model;
    let weight = model.find_weight("pre.0.mlp_down").unwrap();
    let (m, k) = (17, weight.info().k);
    let x_host = random_halves(&mut rng, m * k);
    let results: Vec<Vec<u16>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                scope.spawn(|| {
                    let stream = Stream::new(&Device::new(0)).unwrap();
                    let mut workspace = Workspace::new(&stream);
                    let x = DeviceBuffer::from_slice(&stream, &x_host).unwrap();
                    let mut y = DeviceBuffer::<u16>::zeroed(&stream, m * weight.info().n).unwrap();
                    for _ in 0..20 {
                        quant_gemm(&weight, &x, &mut y, m, &stream, &mut workspace).unwrap();
                    }
                    y.to_vec().unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (thread, result) in results.iter().enumerate() {
        assert_eq!(result, &results[0], "thread {thread}");
    }
    assert_eq!(weight.dispatch_counts().unwrap().total(), 160);

    // And through the reference, once, on the path the defaults pick.
    let stream = Stream::new(&Device::new(0)).unwrap();
    let mut workspace = Workspace::new(&stream);
    for weight in model.weights() {
        check_gemm(&weight, 5, &stream, &mut workspace, &mut rng, "model weight");
    }
}

#[test]
fn scoring_on_the_gpu_agrees_with_the_cpu() {
    if no_gpu("scoring_on_the_gpu_agrees_with_the_cpu") {
        return;
    }
    let mut model = Model::load(fixture()).unwrap();
    model.pack(&PackOptions::default()).unwrap();
    let tokens = Rng::new().tokens(300, model.info().vocab);
    let cpu = model.score(&tokens, &tinyloop::ScoreOptions { backend: tinyloop::Backend::Cpu, ..Default::default() });
    let cpu = cpu.unwrap();
    assert_eq!((cpu.gemm_counts.total(), cpu.dense_cublas_gemms), (0, 0));
    let stream = Stream::new(&Device::new(0)).unwrap();
    for use_graphs in [false, true] {
        let options = tinyloop::ScoreOptions {
            backend: tinyloop::Backend::Cuda,
            use_graphs,
            ..tinyloop::ScoreOptions::default()
        };
        for result in [model.score(&tokens, &options), model.score_on_stream(&tokens, &options, &stream)] {
            let gpu = match result {
                Err(Error::Unsupported(message)) => {
                    eprintln!("note: GPU scoring is not available in this build: {message}");
                    return;
                }
                other => other.unwrap(),
            };
            assert_eq!(gpu.backend, tinyloop::Backend::Cuda);
            assert_eq!((gpu.tokens_scored, gpu.n_windows), (cpu.tokens_scored, cpu.n_windows));
            // FP16 activations on the GPU against FP32 on the CPU: close, not equal.
            let relative = (gpu.perplexity - cpu.perplexity).abs() / cpu.perplexity;
            assert!(
                relative < 2e-2,
                "graphs {use_graphs}: GPU perplexity {} vs CPU {}",
                gpu.perplexity,
                cpu.perplexity
            );
            assert!(gpu.gemm_counts.total() > 0, "no quantized GEMM counted: {:?}", gpu.gemm_counts);
        }
    }
}
