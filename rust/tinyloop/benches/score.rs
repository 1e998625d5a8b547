//! Criterion benchmarks of `Model::score` in tokens/s (Criterion's "elem/s"): the test fixture
//! `tests/data/tiny.tinyloop`, and a demo-sized model (the CLI's `demo` preset configuration: d_model 256,
//! 4 heads of 64, ffn 1024, byte vocabulary, 2 pre blocks + 1 looped x 4, group 128) with random weights, written
//! here as a `.tinyloop` file following docs/format.md. Both score the bytes of data/demo.txt: on the CPU backend
//! (`score/cpu`, one thread and all threads), and where there is a GPU and a build with the `cuda` feature, on the
//! CUDA backend with the default packing and dispatch, CUDA graphs on and off (`score/cuda`).
//!
//! `cargo bench --bench score [-- FILTER]`. The repository's files are found from the crate's directory at build
//! time, or from TINYLOOP_REPO_ROOT, or from the current directory (a binary carried to another machine).

mod common;
use common::Rng;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput};
use tinyloop::{f16, Backend, Device, Model, PackOptions, ScoreOptions};

struct DemoConfig {
    d_model: usize,
    n_heads: usize,
    head_dim: usize,
    ffn: usize,
    vocab: usize,
    pre: usize,
    loops: usize,
    max_seq: usize,
    group_size: usize,
}

const DEMO: DemoConfig = DemoConfig {
    d_model: 256,
    n_heads: 4,
    head_dim: 64,
    ffn: 1024,
    vocab: 256,
    pre: 2,
    loops: 4,
    max_seq: 1024,
    group_size: 128,
};

/// A tensor for the file: dtype name, shape, little-endian bytes.
struct Tensor {
    dtype: &'static str,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

fn f32_tensor(shape: Vec<usize>, values: impl Iterator<Item = f32>) -> Tensor {
    Tensor { dtype: "F32", shape, bytes: values.flat_map(f32::to_le_bytes).collect() }
}

fn f16_tensor(shape: Vec<usize>, values: impl Iterator<Item = f32>) -> Tensor {
    Tensor { dtype: "F16", shape, bytes: values.flat_map(|v| f16::from_f32(v).to_le_bytes()).collect() }
}

/// The tensors of a quantized linear with K inputs and N outputs: random codes, and per group a scale and zero
/// point that spread the codes over about ±1/sqrt(K), so activations keep their size through the blocks.
fn quantized_linear(tensors: &mut BTreeMap<String, Tensor>, rng: &mut Rng, name: &str, k: usize, n: usize) {
    let groups = k / DEMO.group_size;
    let range = 1.0 / (k as f32).sqrt();
    let scales: Vec<f32> = (0..n * groups).map(|_| rng.uniform(0.8, 1.2) * 2.0 * range / 15.0).collect();
    let codes = (0..n * k / 2).map(|_| rng.next() as u8).collect();
    tensors.insert(format!("{name}.qweight"), Tensor { dtype: "U8", shape: vec![n, k / 2], bytes: codes });
    tensors.insert(format!("{name}.zeros"), f16_tensor(vec![n, groups], scales.iter().map(|s| -7.5 * s)));
    tensors.insert(format!("{name}.scales"), f16_tensor(vec![n, groups], scales.into_iter()));
}

/// Writes the demo-sized model with random weights to `path` (safetensors: header length, JSON header with the
/// metadata, then the tensors back to back, widest dtype first so every tensor is aligned).
fn write_demo_model(path: &Path) {
    let c = &DEMO;
    let (d, a) = (c.d_model, c.n_heads * c.head_dim);
    let mut rng = Rng(0xdec0de);
    let mut tensors = BTreeMap::new();
    tensors.insert(
        "embed.weight".to_owned(),
        f16_tensor(vec![c.vocab, d], (0..c.vocab * d).map(|_| rng.uniform(-1.0, 1.0))),
    );
    tensors.insert("final_norm.weight".to_owned(), f32_tensor(vec![d], std::iter::repeat(1.0).take(d)));
    let blocks = (0..c.pre).map(|i| format!("pre.{i}.")).chain(std::iter::once("loop.".to_owned()));
    for block in blocks {
        for norm in ["attn_norm", "mlp_norm"] {
            tensors.insert(format!("{block}{norm}.weight"), f32_tensor(vec![d], std::iter::repeat(1.0).take(d)));
        }
        for (linear, k, n) in [
            ("attn_qkv", d, 3 * a),
            ("attn_out", a, d),
            ("mlp_gate", d, c.ffn),
            ("mlp_up", d, c.ffn),
            ("mlp_down", c.ffn, d),
        ] {
            quantized_linear(&mut tensors, &mut rng, &format!("{block}{linear}"), k, n);
        }
    }

    let config = format!(
        "{{\"d_model\":{},\"n_heads\":{},\"head_dim\":{},\"ffn\":{},\"vocab\":{},\"pre\":{},\"loops\":{},\
         \"max_seq\":{},\"group_size\":{},\"bits\":4,\"rope_theta\":10000.0,\"norm_eps\":1e-05}}",
        c.d_model, c.n_heads, c.head_dim, c.ffn, c.vocab, c.pre, c.loops, c.max_seq, c.group_size
    );
    let width = |dtype: &str| match dtype {
        "F32" => 4,
        "F16" => 2,
        _ => 1,
    };
    let mut order: Vec<(&String, &Tensor)> = tensors.iter().collect();
    order.sort_by_key(|(_, t)| std::cmp::Reverse(width(t.dtype)));
    let mut header = format!(
        "{{\"__metadata__\":{{\"format\":\"tinyloop\",\"format_version\":\"1\",\"config\":{}}}",
        json_string(&config)
    );
    let mut data = Vec::new();
    for (name, tensor) in &order {
        let shape: Vec<String> = tensor.shape.iter().map(usize::to_string).collect();
        header += &format!(
            ",{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
            json_string(name),
            tensor.dtype,
            shape.join(","),
            data.len(),
            data.len() + tensor.bytes.len()
        );
        data.extend_from_slice(&tensor.bytes);
    }
    header.push('}');
    // Spaces so the data section starts at a multiple of 8 bytes.
    while (8 + header.len()) % 8 != 0 {
        header.push(' ');
    }
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header.as_bytes());
    file.extend_from_slice(&data);
    std::fs::write(path, file).expect("write the demo model");
}

/// `text` as a JSON string literal (the config and the tensor names need only quotes and backslashes escaped).
fn json_string(text: &str) -> String {
    format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
}

fn repo_path(relative: &str) -> PathBuf {
    if let Some(root) = std::env::var_os("TINYLOOP_REPO_ROOT") {
        return PathBuf::from(root).join(relative);
    }
    let in_checkout = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(relative);
    if in_checkout.exists() {
        in_checkout
    } else {
        PathBuf::from(relative)
    }
}

fn main() {
    let text = std::fs::read(repo_path("data/demo.txt")).expect("read data/demo.txt");
    let tokens: Vec<i32> = text.iter().map(|&b| i32::from(b)).collect();
    let demo_path = std::env::temp_dir().join(format!("tinyloop-bench-demo-{}.tinyloop", std::process::id()));
    write_demo_model(&demo_path);
    let load = || {
        [
            ("tiny fixture", Model::load(repo_path("tests/data/tiny.tinyloop")).expect("load the fixture")),
            ("demo-sized", Model::load(&demo_path).expect("load the generated demo model")),
        ]
    };
    let models = load();
    // Packing uploads a model's weights to the GPU: separate copies, so the CPU runs read the host weights only.
    let gpu_models = (Device::count().expect("count devices") > 0).then(|| {
        let mut models = load();
        for (name, model) in &mut models {
            model.pack(&PackOptions::default()).unwrap_or_else(|e| panic!("pack the {name} model: {e}"));
        }
        models
    });
    let _ = std::fs::remove_file(&demo_path);

    let mut criterion = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    let mut group = criterion.benchmark_group("score/cpu");
    // A demo-sized score takes seconds: the same few iterations per sample, not Criterion's growing counts.
    group.sampling_mode(SamplingMode::Flat);
    group.throughput(Throughput::Elements(tokens.len() as u64 - 1));
    for (name, model) in &models {
        for threads in [1, 0] {
            let options = ScoreOptions { backend: Backend::Cpu, threads, ..ScoreOptions::default() };
            let label = if threads == 0 { "all threads".to_owned() } else { format!("{threads} thread") };
            group.bench_function(BenchmarkId::new(*name, label), |b| {
                b.iter(|| model.score(&tokens, &options).expect("score"))
            });
        }
    }
    group.finish();

    match &gpu_models {
        Some(models) => {
            let mut group = criterion.benchmark_group("score/cuda");
            group.throughput(Throughput::Elements(tokens.len() as u64 - 1));
            for (name, model) in models {
                for use_graphs in [true, false] {
                    let options = ScoreOptions { backend: Backend::Cuda, use_graphs, ..ScoreOptions::default() };
                    let label = if use_graphs { "graphs" } else { "no graphs" };
                    // The CUDA backend may not take a model (it says so with an error): noted, not a failure.
                    if let Err(error) = model.score(&tokens, &options) {
                        println!("note: score/cuda/{name}/{label} skipped: {error}");
                        continue;
                    }
                    group.bench_function(BenchmarkId::new(*name, label), |b| {
                        b.iter(|| model.score(&tokens, &options).expect("score on the GPU"))
                    });
                }
            }
            group.finish();
        }
        None => println!("note: no CUDA device (or a build without the `cuda` feature): score/cuda skipped"),
    }
    criterion.final_summary();
}
