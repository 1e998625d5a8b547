//! Helpers shared by the integration tests: the fixture, fresh random inputs, scratch files.
#![allow(dead_code)] // each test file uses its own subset

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use tinyloop::f16;

/// The committed model fixture, or the file TINYLOOP_TEST_FIXTURE names (one with the same configuration).
/// Tests that need it fail (never skip) when it is missing.
pub fn fixture() -> PathBuf {
    let path = std::env::var_os("TINYLOOP_TEST_FIXTURE").map(PathBuf::from).unwrap_or_else(|| {
        let in_checkout = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/tiny.tinyloop");
        // A test binary carried to another machine (tools/gpu/rust_gpu_check.sh) runs from the repository root there.
        let from_root = PathBuf::from("tests/data/tiny.tinyloop");
        if !in_checkout.is_file() && from_root.is_file() {
            from_root
        } else {
            in_checkout
        }
    });
    assert!(path.is_file(), "the model fixture {} is missing", path.display());
    path
}

/// SplitMix64: small, good enough for test inputs. Seeded from the clock unless TINYLOOP_TEST_SEED is set;
/// the seed is printed so a failure can be replayed.
pub struct Rng(u64);

impl Rng {
    pub fn new() -> Rng {
        let seed = std::env::var("TINYLOOP_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
            nanos as u64 ^ (u64::from(std::process::id()) << 32)
        });
        eprintln!("TINYLOOP_TEST_SEED={seed}");
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in 0..n.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32)
    }

    pub fn tokens(&mut self, n: usize, vocab: usize) -> Vec<i32> {
        (0..n).map(|_| self.below(vocab) as i32).collect()
    }
}

/// `x` as a half, which must represent it exactly (a normal half or zero).
pub fn f16_exact(x: f32) -> f16 {
    let h = f16::from_f32(x);
    assert!(f32::from(h) == x && (x == 0.0 || h.is_normal()), "{x} is not exactly a normal half");
    h
}

/// The IEEE bit patterns of halves, to compare them exactly (`f16`'s `==` is IEEE equality: NaN != NaN, 0 == -0).
pub fn f16_bits(values: &[f16]) -> Vec<u16> {
    values.iter().map(|h| h.to_bits()).collect()
}

/// A path in the temporary directory that no other test (or test process) uses; removed on drop.
pub struct ScratchFile(pub PathBuf);

impl ScratchFile {
    pub fn new(stem: &str) -> ScratchFile {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let unique = format!("{stem}-{}-{}.tinyloop", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
        ScratchFile(std::env::temp_dir().join(unique))
    }
}

impl Drop for ScratchFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The distinct values of each quantization group of a dequantized row-major [n][k] matrix, at most 16 for
/// INT4: returns the largest count seen.
pub fn max_distinct_per_group(w: &[f32], k: usize, group_size: usize) -> usize {
    w.chunks(k)
        .flat_map(|row| row.chunks(group_size))
        .map(|group| {
            let mut values: Vec<u32> = group.iter().map(|v| v.to_bits()).collect();
            values.sort_unstable();
            values.dedup();
            values.len()
        })
        .max()
        .unwrap_or(0)
}

/// True where this build of the library has no CUDA support (then CUDA requests must fail with NoDevice).
pub fn build_without_cuda() -> bool {
    tinyloop::build_info().split_whitespace().collect::<String>().contains("\"cuda\":false")
}
