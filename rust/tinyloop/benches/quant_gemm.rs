//! Criterion benchmarks of `quant_gemm` per dispatcher path on the benchmark layers of bench/tl_bench.cu.
//!
//! Method (as bench/tl_bench.cu where it can be): random weights and activations, weights rotated through as many
//! copies as tl_bench uses (at least 2, together at least 256 MB: over 4x the H200's 60 MB L2) so the cache is
//! not what is timed, native INT4 only for M <= 256. Each sample queues its calls on one stream and synchronizes
//! it once: the time is wall-clock per call through the safe API (host-side launch and argument checks included),
//! where tl_bench replays CUDA graphs. The two agree where the GPU time of a call exceeds its host-side cost
//! (large layers); on small ones this measures launch overhead. Criterion's throughput "elem/s" is FLOP/s here
//! (2·M·K·N per call).
//!
//! `cargo bench --features cuda --bench quant_gemm [-- FILTER]`. Without a GPU it prints a note and exits.
//! Narrow the setup with TINYLOOP_BENCH_LAYERS (comma-separated substrings of layer names, e.g. "qkv,70B"),
//! TINYLOOP_BENCH_M (e.g. "1,16,1024"), TINYLOOP_BENCH_GROUPS ("128", "row" or "128,row"; default 128) and
//! TINYLOOP_BENCH_PATHS (comma-separated path names below, e.g. "marlin-fused,fp16-body"; default all). Setting up
//! a layer (random data, packing every copy with every form) takes seconds for the 70B layers, so narrowing the
//! setup saves more time than a Criterion filter, which only skips the timing.

mod common;
use common::Rng;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use tinyloop::{
    f16, get_dispatch, quant_gemm, set_dispatch, Device, DeviceBuffer, DispatchCounts, DispatchSetting, PackForms,
    PackOptions, QuantWeight, Stream, Weight, WeightDesc, Workspace,
};

/// (name, K, N): the benchmark layers of bench/tl_bench.cu.
const LAYERS: [(&str, usize, usize); 10] = [
    ("TinyLoop qkv", 2048, 6144),
    ("TinyLoop out", 2048, 2048),
    ("TinyLoop gate+up", 2048, 16384),
    ("TinyLoop down", 8192, 2048),
    ("TinyLoop head", 2048, 50257),
    ("Llama-8B qkv", 4096, 6144),
    ("Llama-8B gate+up", 4096, 28672),
    ("Llama-8B down", 14336, 4096),
    ("Llama-70B gate+up", 8192, 57344),
    ("Llama-70B down", 28672, 8192),
];
const MS: [usize; 6] = [1, 16, 64, 256, 1024, 4096];
/// As tl_bench's kRotationBytes: the INT4 data (codes, scales, zeros) of the copies of a layer reaches this.
const ROTATION_BYTES: usize = 256 << 20;
/// The native kernel reads every weight once per row: beyond this it takes seconds per call.
const NATIVE_MAX_M: usize = 256;

/// A dispatcher path: the settings that select it and the counter that proves it ran.
struct Path {
    name: &'static str,
    settings: &'static [(DispatchSetting, u32)],
    counter: fn(&DispatchCounts) -> u64,
}

const PATHS: [Path; 5] = [
    Path {
        name: "marlin-fused",
        settings: &[(DispatchSetting::UseMarlin, 1), (DispatchSetting::MarlinMode, 1)],
        counter: |c| c.marlin_fused,
    },
    Path {
        name: "marlin-correction",
        settings: &[(DispatchSetting::UseMarlin, 1), (DispatchSetting::MarlinMode, 2)],
        counter: |c| c.marlin_correction,
    },
    Path {
        name: "dequant-cublas",
        settings: &[(DispatchSetting::UseMarlin, 1), (DispatchSetting::CublasMinM, 1)],
        counter: |c| c.dequant_cublas,
    },
    Path { name: "fp16-body", settings: &[(DispatchSetting::Fp16Body, 1)], counter: |c| c.fp16_body },
    Path { name: "native", settings: &[(DispatchSetting::UseMarlin, 0)], counter: |c| c.native },
];

fn select(path: &Path) {
    for setting in DispatchSetting::ALL {
        set_dispatch(setting, 0).expect("reset a dispatch setting");
    }
    set_dispatch(DispatchSetting::UseMarlin, 1).expect("set UseMarlin");
    for &(setting, value) in path.settings {
        set_dispatch(setting, value).expect("select a path");
    }
}

/// Copies of one random K x N weight (random codes; scales and zero points like a min-max quantization of
/// N(0, 0.02) values), as many as tl_bench rotates through (at least 2, together at least ROTATION_BYTES), each
/// packed with every form; and whether the Marlin-class kernel takes the shape.
fn packed_copies(rng: &mut Rng, k: usize, n: usize, group_size: usize, stream: &Stream) -> (Vec<Weight>, bool) {
    let groups = k.checked_div(group_size).unwrap_or(1); // group size 0: per row, one group
    let codes: Vec<u8> = (0..n * k / 2).map(|_| rng.next() as u8).collect();
    let scales: Vec<f32> = (0..n * groups).map(|_| rng.uniform(0.004, 0.02)).collect();
    let scale_halves: Vec<f16> = scales.iter().map(|&s| f16::from_f32(s)).collect();
    let zero_halves: Vec<f16> = scales.iter().map(|&s| f16::from_f32(-s * rng.uniform(6.0, 9.0))).collect();
    let desc = WeightDesc::new(k, n, group_size, &codes, &scale_halves, &zero_halves);
    let copy_bytes = codes.len() + 4 * scale_halves.len();
    let copies = ((ROTATION_BYTES + copy_bytes - 1) / copy_bytes).max(2);
    let forms = PackForms { marlin_fused: true, marlin_correction: true, fp16_body: true };
    let mut packable = true;
    let weights = (0..copies)
        .map(|_| {
            let mut weight = Weight::create(&desc).expect("create a weight");
            let options = PackOptions { stream: Some(stream), forms, ..PackOptions::default() };
            packable &= weight.pack(&options).expect("pack a weight").weights_packed == 1;
            weight
        })
        .collect();
    (weights, packable)
}

/// Whether `path` is worth timing: the Marlin-class paths (dequantize + cuBLAS is one of them) need a packed
/// weight, and the native kernel takes seconds per call beyond NATIVE_MAX_M.
fn applies(path: &Path, packable: bool, m: usize) -> bool {
    match path.name {
        "native" => m <= NATIVE_MAX_M,
        "fp16-body" => true,
        _ => packable,
    }
}

/// Values of a comma-separated environment variable, or `default`.
fn env_list(name: &str, default: &[&str]) -> Vec<String> {
    match std::env::var(name) {
        Ok(text) if !text.trim().is_empty() => text.split(',').map(|s| s.trim().to_owned()).collect(),
        _ => default.iter().map(|s| (*s).to_owned()).collect(),
    }
}

fn bench_quant_gemm(criterion: &mut Criterion, stream: &Stream) {
    let layer_filters = env_list("TINYLOOP_BENCH_LAYERS", &[""]);
    let ms: Vec<usize> = env_list("TINYLOOP_BENCH_M", &[])
        .iter()
        .map(|m| m.parse().expect("TINYLOOP_BENCH_M: comma-separated integers"))
        .collect();
    let ms = if ms.is_empty() { MS.to_vec() } else { ms };
    let groups = env_list("TINYLOOP_BENCH_GROUPS", &["128"]);
    let path_names = env_list("TINYLOOP_BENCH_PATHS", &[]);
    for name in &path_names {
        assert!(PATHS.iter().any(|p| p.name == name), "TINYLOOP_BENCH_PATHS: unknown path {name:?}");
    }
    let paths: Vec<&Path> =
        PATHS.iter().filter(|p| path_names.is_empty() || path_names.iter().any(|name| name == p.name)).collect();
    let saved: Vec<(DispatchSetting, u32)> =
        DispatchSetting::ALL.iter().map(|&s| (s, get_dispatch(s).expect("read a dispatch setting"))).collect();
    let mut rng = Rng(0x5eed_1234);
    let mut workspace = Workspace::new(stream);

    for &(layer, k, n) in LAYERS.iter().filter(|(name, _, _)| layer_filters.iter().any(|f| name.contains(f.as_str()))) {
        for group in &groups {
            let group_size = if group == "row" { 0 } else { group.parse().expect("TINYLOOP_BENCH_GROUPS: 128 or row") };
            let (weights, packable) = packed_copies(&mut rng, k, n, group_size, stream);
            if !packable {
                println!("note: {layer} group {group}: the Marlin-class kernel does not take this shape");
            }
            let mut bench = criterion.benchmark_group(format!("quant_gemm/{layer} ({k}x{n}) group {group}"));
            for &m in &ms {
                let x_host: Vec<f16> = (0..m * k).map(|_| f16::from_f32(rng.uniform(-1.0, 1.0))).collect();
                let x = DeviceBuffer::from_slice(stream, &x_host).expect("upload x");
                let mut y = DeviceBuffer::<f16>::zeroed(stream, m * n).expect("allocate y");
                bench.throughput(Throughput::Elements((2 * m * k * n) as u64));
                for path in paths.iter().copied().filter(|p| applies(p, packable, m)) {
                    select(path);
                    let before: Vec<DispatchCounts> = weights.iter().map(|w| w.dispatch_counts().unwrap()).collect();
                    bench.bench_function(BenchmarkId::new(path.name, format!("M={m}")), |b| {
                        b.iter_custom(|iters| {
                            let start = Instant::now();
                            for i in 0..iters as usize {
                                let weight = &weights[i % weights.len()];
                                quant_gemm(weight, &x, &mut y, m, stream, &mut workspace).expect("quant_gemm");
                            }
                            stream.synchronize().expect("synchronize");
                            start.elapsed()
                        })
                    });
                    report_other_paths(path, &weights, &before, layer, m);
                }
            }
            bench.finish();
        }
    }
    for (setting, value) in saved {
        set_dispatch(setting, value).expect("restore a dispatch setting");
    }
}

/// Says so when calls meant for `path` ran elsewhere (a shape the path refuses falls through to another one).
fn report_other_paths(path: &Path, weights: &[Weight], before: &[DispatchCounts], layer: &str, m: usize) {
    let (mut total, mut on_path) = (0, 0);
    for (weight, before) in weights.iter().zip(before) {
        let after = weight.dispatch_counts().expect("dispatch counts");
        total += after.total() - before.total();
        on_path += (path.counter)(&after) - (path.counter)(before);
    }
    if on_path != total {
        println!("note: {layer} M={m} {}: {} of {total} calls ran on another path", path.name, total - on_path);
    }
}

fn main() {
    let devices = Device::count().expect("count devices");
    if devices == 0 {
        println!(
            "note: the quant_gemm benchmarks need a CUDA device and a build with the `cuda` feature \
             (build info: {}); skipped",
            tinyloop::build_info()
        );
        return;
    }
    let device = Device::new(0);
    println!("device 0: {:?}", device.info().expect("device info"));
    let stream = Stream::new(&device).expect("create a stream");
    let mut criterion = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .configure_from_args();
    bench_quant_gemm(&mut criterion, &stream);
    criterion.final_summary();
}
