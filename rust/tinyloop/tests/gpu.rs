//! The GPU wrappers: devices, streams, device buffers, packing, workspaces, quant_gemm and the dispatcher.
//!
//! Without a GPU every GPU call must fail with `Error::NoDevice` (checked here); with one, quant_gemm through each
//! dispatcher path is compared with an FP64 host reference built from `dequantize()`, and with the same call made
//! through the raw C API (`tinyloop-sys`). GPU tests print a note and return early where `Device::count() == 0`.

mod common;

use std::ffi::{c_void, CStr};
use std::ptr;
use std::sync::{Mutex, MutexGuard};

use common::{build_without_cuda, f16_bits, fixture, Rng};
use tinyloop::{
    bf16, f16, get_dispatch, quant_gemm, set_dispatch, Device, DeviceBuffer, DispatchCounts, DispatchSetting, Error,
    GemmElement, Model, PackForms, PackOptions, QuantWeight, QuantizeOptions, Stream, Weight, WeightDesc, Workspace,
};
use tinyloop_sys as sys;

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
    send::<DeviceBuffer<f16>>();
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
    // Any bit pattern, NaNs included: buffers copy bits (compared as bits below, not with f16's IEEE ==).
    let halves: Vec<f16> = (0..1001).map(|_| f16::from_bits(rng.next_u64() as u16)).collect();
    let floats: Vec<f32> = (0..333).map(|_| rng.uniform(-5.0, 5.0)).collect();
    let bytes: Vec<u8> = (0..77).map(|_| rng.next_u64() as u8).collect();
    let half_buffer = DeviceBuffer::from_slice(&stream, &halves).unwrap();
    let mut float_buffer = DeviceBuffer::from_slice(&stream, &floats).unwrap();
    let byte_buffer = DeviceBuffer::from_slice(&stream, &bytes).unwrap();
    assert_eq!(f16_bits(&half_buffer.to_vec().unwrap()), f16_bits(&halves));
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

    let empty = DeviceBuffer::<f16>::zeroed(&stream, 0).unwrap();
    assert!(empty.is_empty() && empty.to_vec().unwrap().is_empty());

    // A buffer keeps its stream alive: dropping the Stream handle first is fine.
    let other = Stream::new(&Device::new(0)).unwrap();
    let kept = DeviceBuffer::from_slice(&other, &halves).unwrap();
    drop(other);
    assert_eq!(f16_bits(&kept.to_vec().unwrap()), f16_bits(&halves));
    stream.synchronize().unwrap();

    // Buffers move to other threads and are freed there.
    let moved = std::thread::spawn(move || kept.to_vec().unwrap()).join().unwrap();
    assert_eq!(f16_bits(&moved), f16_bits(&halves));
}

/// The reference Y = X · W in FP64 from the FP16 inputs and the dequantized weight.
struct Reference {
    y: Vec<f64>,
    /// Per output, Σ|x·w|: the scale of FP32 accumulation errors.
    magnitude: Vec<f64>,
}

impl Reference {
    fn new(x: &[f64], w_nk: &[f32], m: usize, k: usize, n: usize) -> Reference {
        let mut y = vec![0.0; m * n];
        let mut magnitude = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                let (mut sum, mut size) = (0.0f64, 0.0f64);
                for l in 0..k {
                    let product = x[i * k + l] * f64::from(w_nk[j * k + l]);
                    sum += product;
                    size += product.abs();
                }
                y[i * n + j] = sum;
                magnitude[i * n + j] = size;
            }
        }
        Reference { y, magnitude }
    }

    /// The error bound of output `index`: FP16 rounding of Y, of W (the FP16-body and cuBLAS paths) and FP32
    /// accumulation, times `scale` (1 for FP16 results, 8 for BF16's three fewer bits).
    fn bound(&self, index: usize, scale: f64) -> f64 {
        scale * (self.y[index].abs() / 1024.0 + self.magnitude[index] / 512.0) + 1e-6
    }

    /// Checks every element of a result (its values) against the reference.
    fn check(&self, actual: &[f64], n: usize, scale: f64, what: &str) {
        assert_eq!(actual.len(), self.y.len(), "{what}: output length");
        for (index, (&got, want)) in actual.iter().zip(&self.y).enumerate() {
            let tolerance = self.bound(index, scale);
            assert!(
                (got - want).abs() <= tolerance,
                "{what}: y[{}][{}] = {got}, reference {want} (tolerance {tolerance})",
                index / n,
                index % n
            );
        }
    }
}

fn random_halves(rng: &mut Rng, count: usize) -> Vec<f16> {
    (0..count).map(|_| f16::from_f32(rng.uniform(-1.0, 1.0))).collect()
}

/// Runs quant_gemm into a poisoned output and checks every element against the reference: FP16 activations.
fn check_gemm<W: QuantWeight>(
    weight: &W,
    m: usize,
    stream: &Stream,
    workspace: &mut Workspace,
    rng: &mut Rng,
    what: &str,
) {
    check_gemm_as(weight, m, stream, workspace, rng, f16::from_f32, 1.0, what);
}

/// quant_gemm on activations of type E (`from_f32` rounds to it), against the FP64 reference of those activations,
/// with the error bound scaled by `scale`.
#[allow(clippy::too_many_arguments)]
fn check_gemm_as<W: QuantWeight, E: GemmElement + Into<f64>>(
    weight: &W,
    m: usize,
    stream: &Stream,
    workspace: &mut Workspace,
    rng: &mut Rng,
    from_f32: fn(f32) -> E,
    scale: f64,
    what: &str,
) {
    let info = weight.info();
    let (k, n) = (info.k, info.n);
    let x_host: Vec<E> = (0..m * k).map(|_| from_f32(rng.uniform(-1.0, 1.0))).collect();
    let x = DeviceBuffer::from_slice(stream, &x_host).unwrap();
    let mut y = DeviceBuffer::<E>::zeroed(stream, m * n).unwrap();
    y.fill_bytes(0xff).unwrap(); // NaN: an output left unwritten cannot pass
    quant_gemm(weight, &x, &mut y, m, stream, workspace).unwrap();
    let actual: Vec<f64> = y.to_vec().unwrap().into_iter().map(Into::into).collect();
    let x_values: Vec<f64> = x_host.into_iter().map(Into::into).collect();
    let reference = Reference::new(&x_values, &weight.dequantize().unwrap(), m, k, n);
    reference.check(&actual, n, scale, &format!("{what}: '{}' k {k} n {n} m {m}", info.name));
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
    // (k, n, group size; 0 = per row, packable): group 128 and per row as in the benchmarks, group 32, K and N padded
    // to multiples of 64 at packing (96 x 80), and a group size the Marlin-class kernel does not take (48), which
    // must run on the native kernel whatever the setting.
    for (k, n, group_size, packable) in
        [(256, 256, 128, true), (512, 192, 0, true), (128, 320, 32, true), (96, 80, 32, true), (96, 80, 48, false)]
    {
        let mut weight = random_weight(&mut rng, k, n, group_size);
        let report =
            weight.pack(&PackOptions { stream: Some(&stream), forms: all_forms, ..PackOptions::default() }).unwrap();
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
                // BF16 under the same settings (the paths that hold FP16 weights pass it on to the next).
                // BF16's error bound: 8 times FP16's (8 significant bits instead of 11).
                let what = format!("{} (BF16)", path.name);
                check_gemm_as(&weight, m, &stream, &mut workspace, &mut rng, bf16::from_f32, 8.0, &what);
            }
        }
        assert!(workspace.bytes() >= weight.workspace_size(130).unwrap());
    }
}

/// Panics with the library's message unless `status` is `TL_OK`.
fn c_ok(status: sys::tl_status, what: &str) {
    if status != sys::TL_OK {
        // SAFETY: tl_last_error_message never returns NULL; the text is copied before the next library call.
        let message = unsafe { CStr::from_ptr(sys::tl_last_error_message()) }.to_string_lossy().into_owned();
        panic!("{what}: status {status}: {message}");
    }
}

/// Device memory from `tl_device_malloc`, freed (ordered on its stream) on drop.
struct CDeviceMemory {
    ptr: *mut c_void,
    stream: *mut c_void,
}

impl CDeviceMemory {
    fn new(bytes: usize, stream: *mut c_void) -> CDeviceMemory {
        let mut ptr = ptr::null_mut();
        // SAFETY: `ptr` is writable.
        c_ok(unsafe { sys::tl_device_malloc(0, bytes, &mut ptr) }, "tl_device_malloc");
        CDeviceMemory { ptr, stream }
    }
}

impl Drop for CDeviceMemory {
    fn drop(&mut self) {
        // SAFETY: allocated by tl_device_malloc and freed once, after the work queued on its stream.
        unsafe { sys::tl_device_free(self.ptr, self.stream) };
    }
}

/// The quantized GEMM driven through the raw C API alone: its own weight (created from the same arrays), stream,
/// buffers and workspace, so nothing of the safe crate stands between the test and the library.
struct CGemm {
    weight: *mut sys::tl_weight,
    stream: *mut c_void,
    k: usize,
    n: usize,
}

impl CGemm {
    fn new(desc: &WeightDesc<'_>, forms: PackForms) -> CGemm {
        // SAFETY (every block below): the structs are initialised by their init functions with our sizes, every
        // array pointer covers the length the layout needs (the same arrays made the safe weight), and the out
        // pointers are writable.
        let mut c_desc: sys::tl_weight_desc = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<sys::tl_weight_desc>() as u32;
        c_ok(unsafe { sys::tl_weight_desc_init(&mut c_desc, size) }, "tl_weight_desc_init");
        c_desc.k = desc.k as i32;
        c_desc.n = desc.n as i32;
        c_desc.group_size = desc.group_size as i32;
        c_desc.codes = desc.codes.as_ptr();
        // half::f16 is #[repr(transparent)] over u16: the slices are the IEEE bit patterns the C API reads.
        c_desc.scales = desc.scales.as_ptr().cast::<u16>();
        c_desc.zeros = desc.zeros.as_ptr().cast::<u16>();
        let mut weight = ptr::null_mut();
        c_ok(unsafe { sys::tl_weight_create(&c_desc, &mut weight) }, "tl_weight_create");
        let mut stream = ptr::null_mut();
        c_ok(unsafe { sys::tl_stream_create(0, &mut stream) }, "tl_stream_create");
        let gemm = CGemm { weight, stream, k: desc.k, n: desc.n };

        let mut options: sys::tl_pack_options = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<sys::tl_pack_options>() as u32;
        c_ok(unsafe { sys::tl_pack_options_init(&mut options, size) }, "tl_pack_options_init");
        options.stream = stream;
        options.forms = (if forms.marlin_fused { sys::TL_FORM_MARLIN_FUSED } else { 0 })
            | (if forms.marlin_correction { sys::TL_FORM_MARLIN_CORRECTION } else { 0 })
            | (if forms.fp16_body { sys::TL_FORM_FP16_BODY } else { 0 });
        c_ok(unsafe { sys::tl_weight_pack_marlin(weight, &options, ptr::null_mut()) }, "tl_weight_pack_marlin");
        gemm
    }

    fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![f32::NAN; self.k * self.n];
        // SAFETY: `out` holds k*n floats.
        c_ok(unsafe { sys::tl_weight_dequantize(self.weight, out.as_mut_ptr(), out.len()) }, "tl_weight_dequantize");
        out
    }

    fn counts(&self) -> DispatchCounts {
        // SAFETY: all-zero bytes are valid for these integers; `counts` is writable with its size set.
        let mut counts: sys::tl_dispatch_counts = unsafe { std::mem::zeroed() };
        counts.struct_size = std::mem::size_of::<sys::tl_dispatch_counts>() as u32;
        c_ok(unsafe { sys::tl_weight_dispatch_counts(self.weight, &mut counts) }, "tl_weight_dispatch_counts");
        DispatchCounts {
            fp16_body: counts.fp16_body,
            marlin_fused: counts.marlin_fused,
            marlin_correction: counts.marlin_correction,
            dequant_cublas: counts.dequant_cublas,
            native: counts.native,
            fallbacks: counts.fallbacks,
        }
    }

    /// Y = X · W into a poisoned output, with a workspace of exactly the size the library asks for.
    fn run(&self, x_host: &[f16], m: usize) -> Vec<f16> {
        let (x_bytes, y_bytes) = (2 * m * self.k, 2 * m * self.n);
        let mut workspace_bytes = 0usize;
        // SAFETY (every block below): the weight and stream are live; each buffer holds the bytes passed with it;
        // tl_memcpy returns after its copy. Host FP16 arrays are half::f16, #[repr(transparent)] over u16, so their
        // bytes are the IEEE bit patterns the kernels read and write.
        c_ok(
            unsafe { sys::tl_quant_gemm_workspace_size(self.weight, m as i64, &mut workspace_bytes) },
            "tl_quant_gemm_workspace_size",
        );
        let x = CDeviceMemory::new(x_bytes, self.stream);
        let y = CDeviceMemory::new(y_bytes, self.stream);
        let workspace = (workspace_bytes > 0).then(|| CDeviceMemory::new(workspace_bytes, self.stream));
        let workspace_ptr = workspace.as_ref().map_or(ptr::null_mut(), |w| w.ptr);
        c_ok(unsafe { sys::tl_memcpy(x.ptr, x_host.as_ptr().cast(), x_bytes, self.stream) }, "tl_memcpy x");
        c_ok(unsafe { sys::tl_memset_device(y.ptr, 0xff, y_bytes, self.stream) }, "tl_memset_device y");
        c_ok(
            unsafe {
                sys::tl_quant_gemm(self.weight, x.ptr, y.ptr, m as i64, self.stream, workspace_ptr, workspace_bytes)
            },
            "tl_quant_gemm",
        );
        c_ok(unsafe { sys::tl_stream_synchronize(self.stream) }, "tl_stream_synchronize");
        let mut out = vec![f16::ZERO; m * self.n];
        c_ok(unsafe { sys::tl_memcpy(out.as_mut_ptr().cast(), y.ptr, y_bytes, self.stream) }, "tl_memcpy y");
        out
    }
}

impl Drop for CGemm {
    fn drop(&mut self) {
        // SAFETY: both were created in new() and are released once; the buffers of run() are already freed.
        unsafe {
            sys::tl_stream_synchronize(self.stream);
            sys::tl_stream_destroy(self.stream);
            sys::tl_weight_free(self.weight);
        }
    }
}

/// The spacing of FP16 values around `v` (the subnormal spacing below the normal range).
fn f16_ulp(v: f64) -> f64 {
    let v = v.abs();
    if v < 2f64.powi(-14) {
        2f64.powi(-24)
    } else {
        2f64.powi(v.log2().floor() as i32 - 10)
    }
}

#[test]
fn quant_gemm_through_the_safe_api_matches_the_raw_c_calls_on_every_path() {
    if no_gpu("quant_gemm_through_the_safe_api_matches_the_raw_c_calls_on_every_path") {
        return;
    }
    let _guard = SettingsGuard::new();
    let mut rng = Rng::new();
    let stream = Stream::new(&Device::new(0)).unwrap();
    let mut workspace = Workspace::new(&stream);
    let all_forms = PackForms { marlin_fused: true, marlin_correction: true, fp16_body: true };
    // (k, n, group size; 0 = per row): group 128, per row, and a shape only the native kernel takes.
    let shapes: [(usize, usize, usize); 3] = [(256, 384, 128), (512, 256, 0), (96, 80, 32)];
    for (k, n, group_size) in shapes {
        let groups = k.checked_div(group_size).unwrap_or(1);
        let codes: Vec<u8> = (0..n * k / 2).map(|_| rng.next_u64() as u8).collect();
        let scales: Vec<f32> = (0..n * groups).map(|_| rng.uniform(0.002, 0.02)).collect();
        let zeros: Vec<f16> = scales.iter().map(|&s| f16::from_f32(-s * rng.uniform(6.0, 9.0))).collect();
        let scales: Vec<f16> = scales.into_iter().map(f16::from_f32).collect();
        let desc = WeightDesc::new(k, n, group_size, &codes, &scales, &zeros);

        let mut safe = Weight::create(&desc).unwrap();
        safe.pack(&PackOptions { stream: Some(&stream), forms: all_forms, ..PackOptions::default() }).unwrap();
        let c = CGemm::new(&desc, all_forms);
        let w_nk = safe.dequantize().unwrap();
        assert!(c.dequantize() == w_nk, "k {k} n {n}: the two weights dequantize differently");

        for path in &PATHS {
            select(path);
            for m in [1, 16, 64, 130] {
                let what = format!("{} k {k} n {n} group {group_size} m {m}", path.name);
                let x_host = random_halves(&mut rng, m * k);
                let (safe_before, c_before) = (safe.dispatch_counts().unwrap(), c.counts());

                let x = DeviceBuffer::from_slice(&stream, &x_host).unwrap();
                let mut y = DeviceBuffer::<f16>::zeroed(&stream, m * n).unwrap();
                y.fill_bytes(0xff).unwrap();
                quant_gemm(&safe, &x, &mut y, m, &stream, &mut workspace).unwrap();
                let from_safe = y.to_vec().unwrap();
                let from_c = c.run(&x_host, m);

                let (safe_after, c_after) = (safe.dispatch_counts().unwrap(), c.counts());
                // Both calls took the same path (whichever the shape allows), once each.
                assert_eq!(safe_after.total(), safe_before.total() + 1, "{what}");
                assert_eq!(c_after.total(), c_before.total() + 1, "{what}");
                let served = |before: &DispatchCounts, after: &DispatchCounts| {
                    [
                        after.fp16_body - before.fp16_body,
                        after.marlin_fused - before.marlin_fused,
                        after.marlin_correction - before.marlin_correction,
                        after.dequant_cublas - before.dequant_cublas,
                        after.native - before.native,
                    ]
                };
                assert_eq!(served(&safe_before, &safe_after), served(&c_before, &c_after), "{what}");

                let x_values: Vec<f64> = x_host.iter().map(|&h| f64::from(h)).collect();
                let reference = Reference::new(&x_values, &w_nk, m, k, n);
                let from_c_values: Vec<f64> = from_c.iter().map(|&h| f64::from(h)).collect();
                reference.check(&from_c_values, n, 1.0, &format!("{what}, raw C call"));
                // Same kernel, same inputs: they may differ only where split-K partial sums (FP32 atomics) are added
                // in another order, which can move the FP16 result by an ulp.
                for (index, (&a, &b)) in from_safe.iter().zip(&from_c).enumerate() {
                    let (a, b) = (f64::from(a), f64::from(b));
                    let tolerance = 2.0 * f16_ulp(a.abs().max(b.abs())) + reference.magnitude[index] * 2f64.powi(-18);
                    assert!(
                        (a - b).abs() <= tolerance,
                        "{what}: y[{}][{}]: safe API {a}, raw C call {b} (tolerance {tolerance})",
                        index / n,
                        index % n
                    );
                }
            }
        }
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
    let mut y = DeviceBuffer::<f16>::zeroed(&stream, m * n).unwrap();
    // Not packed yet: the library says so.
    assert!(matches!(quant_gemm(&weight, &x, &mut y, m, &stream, &mut workspace), Err(Error::InvalidArgument(_))));
    weight.pack(&PackOptions::default()).unwrap();

    let expect_invalid = |result: tinyloop::Result<()>, what: &str| match result {
        Err(Error::InvalidArgument(message)) => assert!(!message.is_empty(), "{what}"),
        other => panic!("{what}: expected InvalidArgument, got {other:?}"),
    };
    expect_invalid(quant_gemm(&weight, &x, &mut y, m + 1, &stream, &mut workspace), "m too large for x");
    expect_invalid(quant_gemm(&weight, &x, &mut y, 0, &stream, &mut workspace), "m = 0");
    let mut y_short = DeviceBuffer::<f16>::zeroed(&stream, m * n - 1).unwrap();
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
                    let mut y = DeviceBuffer::<f16>::zeroed(&stream, m * weight.info().n).unwrap();
                    for _ in 0..20 {
                        quant_gemm(&weight, &x, &mut y, m, &stream, &mut workspace).unwrap();
                    }
                    f16_bits(&y.to_vec().unwrap())
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
