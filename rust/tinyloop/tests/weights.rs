//! Owned weights: creating from INT4 arrays, quantizing FP32 matrices, dequantizing, and their error paths.

mod common;

use common::{f16_exact, max_distinct_per_group, Rng};
use tinyloop::{f16, Error, QuantMethod, QuantizeOptions, Weight, WeightDesc};

/// Random INT4 arrays for a k x n weight with `groups` groups per column; scales and zeros are chosen to be
/// exact in FP16 and to make q * s + z exact in FP32, so the reference below is exact.
struct Arrays {
    codes: Vec<u8>,
    scales: Vec<f32>,
    zeros: Vec<f32>,
    scale_halves: Vec<f16>,
    zero_halves: Vec<f16>,
}

fn random_arrays(rng: &mut Rng, k: usize, n: usize, groups: usize) -> Arrays {
    let codes: Vec<u8> = (0..n * k / 2).map(|_| rng.next_u64() as u8).collect();
    let scales: Vec<f32> = (0..n * groups).map(|_| (1 + rng.below(255)) as f32 / 256.0).collect();
    let zeros: Vec<f32> = (0..n * groups).map(|_| (rng.below(256) as f32 - 128.0) / 32.0).collect();
    let scale_halves = scales.iter().map(|&s| f16_exact(s)).collect();
    let zero_halves = zeros.iter().map(|&z| f16_exact(z)).collect();
    Arrays { codes, scales, zeros, scale_halves, zero_halves }
}

/// W as out[j * k + i] = q * s + z, straight from the documented layout.
fn reference_dequantize(a: &Arrays, k: usize, n: usize, group_size: usize) -> Vec<f32> {
    let groups = k / group_size;
    let mut out = vec![0.0; k * n];
    for j in 0..n {
        for i in 0..k {
            let byte = a.codes[j * (k / 2) + i / 2];
            let q = if i % 2 == 0 { byte & 0x0f } else { byte >> 4 };
            let g = j * groups + i / group_size;
            out[j * k + i] = f32::from(q) * a.scales[g] + a.zeros[g];
        }
    }
    out
}

#[test]
fn create_then_dequantize_matches_the_layout_exactly() {
    let mut rng = Rng::new();
    for (k, n, group_size) in [(64usize, 24, 16), (96, 5, 32), (32, 7, 0), (128, 3, 128)] {
        let groups = k.checked_div(group_size).unwrap_or(1); // group_size 0: per row
        let a = random_arrays(&mut rng, k, n, groups);
        let weight =
            Weight::create(&WeightDesc::new(k, n, group_size, &a.codes, &a.scale_halves, &a.zero_halves)).unwrap();

        let info = weight.info();
        let actual_group = if group_size == 0 { k } else { group_size };
        assert_eq!((info.k, info.n, info.group_size, info.n_groups, info.bits), (k, n, actual_group, groups, 4));
        assert!(!info.borrowed && !info.has_frac4 && !info.has_sign_bit);
        assert_eq!(info.name, "");
        assert_eq!(info.bytes, (n * k / 2 + 2 * 2 * n * groups) as u64);

        let expected = reference_dequantize(&a, k, n, actual_group);
        assert_eq!(weight.dequantize().unwrap(), expected, "k {k} n {n} group_size {group_size}");
    }
}

#[test]
fn optional_channels_and_name_are_reported() {
    let mut rng = Rng::new();
    let (k, n, group_size) = (64, 6, 32);
    let a = random_arrays(&mut rng, k, n, 2);
    let frac4: Vec<u8> = (0..n * k / 2).map(|_| rng.next_u64() as u8).collect();
    let sign_bit: Vec<u8> = (0..n * k / 8).map(|_| rng.next_u64() as u8).collect();
    let desc = WeightDesc {
        frac4: Some(&frac4),
        sign_bit: Some(&sign_bit),
        name: Some("test.proj"),
        ..WeightDesc::new(k, n, group_size, &a.codes, &a.scale_halves, &a.zero_halves)
    };
    let weight = Weight::create(&desc).unwrap();
    let info = weight.info();
    assert!(info.has_frac4 && info.has_sign_bit && !info.borrowed);
    assert_eq!(info.name, "test.proj");
    assert_eq!(info.bytes, (n * k / 2 + 2 * 2 * n * 2 + n * k / 2 + n * k / 8) as u64);
    assert_eq!(weight.dequantize().unwrap().len(), k * n);
}

#[test]
fn create_rejects_inconsistent_arrays() {
    let mut rng = Rng::new();
    let (k, n) = (64, 4);
    let a = random_arrays(&mut rng, k, n, 2);
    let good = WeightDesc::new(k, n, 32, &a.codes, &a.scale_halves, &a.zero_halves);
    let expect_invalid = |desc: WeightDesc<'_>, what: &str| match Weight::create(&desc) {
        Err(Error::InvalidArgument(message)) => assert!(!message.is_empty(), "{what}: empty message"),
        other => panic!("{what}: expected InvalidArgument, got {other:?}"),
    };
    expect_invalid(WeightDesc { codes: &a.codes[1..], ..good }, "short codes");
    expect_invalid(WeightDesc { scales: &a.scale_halves[..a.scale_halves.len() - 1], ..good }, "short scales");
    expect_invalid(WeightDesc { zeros: &a.zero_halves[1..], ..good }, "short zeros");
    expect_invalid(WeightDesc { group_size: 24, ..good }, "group size not dividing k");
    expect_invalid(WeightDesc { k: 63, ..good }, "odd k");
    expect_invalid(WeightDesc { n: 0, ..good }, "n = 0");
    expect_invalid(WeightDesc { frac4: Some(&a.codes[2..]), ..good }, "short frac4");
    expect_invalid(WeightDesc { name: Some("a\0b"), ..good }, "NUL in the name");
    // The library's own checks: bits and non-finite scales.
    expect_invalid(WeightDesc { bits: 3, ..good }, "bits 3");
    let mut nan_scales = a.scale_halves.clone();
    let poisoned = rng.below(nan_scales.len());
    nan_scales[poisoned] = f16::NAN;
    expect_invalid(WeightDesc { scales: &nan_scales, ..good }, "NaN scale");
}

#[test]
fn sign_bit_needs_k_divisible_by_8() {
    let mut rng = Rng::new();
    let (k, n) = (12, 2);
    let a = random_arrays(&mut rng, k, n, 1);
    let sign_bit = vec![0u8; n * 2];
    let desc =
        WeightDesc { sign_bit: Some(&sign_bit), ..WeightDesc::new(k, n, 0, &a.codes, &a.scale_halves, &a.zero_halves) };
    assert!(matches!(Weight::create(&desc), Err(Error::InvalidArgument(_))));
}

/// The largest error min-max INT4 quantization may make on a group with this range, following the documented
/// method: half a step, plus what rounding s and z to FP16 (relative error 2^-11) can add at the ends.
fn error_bound(method: QuantMethod, min: f32, max: f32) -> f32 {
    match method {
        QuantMethod::Asymmetric => {
            let step = (max - min) / 15.0;
            step * 0.51 + min.abs() / 1024.0 + 1e-6
        }
        QuantMethod::Symmetric => {
            let step = (max / 7.0).max(-min / 8.0);
            step * 0.51 + 1e-6
        }
    }
}

#[test]
fn quantize_round_trip_stays_within_half_a_step() {
    let mut rng = Rng::new();
    for method in [QuantMethod::Asymmetric, QuantMethod::Symmetric] {
        for (k, n, group_size) in [(96, 40, 32), (64, 9, 0), (128, 3, 64)] {
            let w: Vec<f32> = (0..k * n).map(|_| rng.uniform(-1.5, 1.0)).collect();
            let options = QuantizeOptions { method, group_size, ..QuantizeOptions::default() };
            let weight = Weight::quantize(&w, k, n, &options).unwrap();
            let actual_group = if group_size == 0 { k } else { group_size };
            let info = weight.info();
            assert_eq!((info.k, info.n, info.group_size, info.n_groups), (k, n, actual_group, k / actual_group));
            assert!(!info.borrowed);

            let back = weight.dequantize().unwrap();
            assert_eq!(back.len(), k * n);
            assert!(max_distinct_per_group(&back, k, actual_group) <= 16, "more than 16 levels in a group");
            for (g, (original, restored)) in w.chunks(actual_group).zip(back.chunks(actual_group)).enumerate() {
                let min = original.iter().copied().fold(f32::INFINITY, f32::min);
                let max = original.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let bound = error_bound(method, min, max);
                for (x, y) in original.iter().zip(restored) {
                    assert!((x - y).abs() <= bound, "{method:?} group {g}: {x} came back as {y} (bound {bound})");
                }
                if method == QuantMethod::Asymmetric {
                    // Min-max: the group's minimum is the zero point, so it comes back up to FP16 rounding.
                    let restored_min = restored.iter().copied().fold(f32::INFINITY, f32::min);
                    assert!((restored_min - min).abs() <= min.abs() / 1024.0, "group {g}: min {min} -> {restored_min}");
                }
            }
        }
    }
}

#[test]
fn quantize_rejects_bad_input() {
    let mut rng = Rng::new();
    let (k, n) = (64, 4);
    let mut w: Vec<f32> = (0..k * n).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let defaults = QuantizeOptions::default();
    let expect_invalid = |result: tinyloop::Result<Weight>, what: &str| {
        assert!(matches!(result, Err(Error::InvalidArgument(_))), "{what}: {result:?}")
    };
    expect_invalid(Weight::quantize(&w[1..], k, n, &defaults), "short matrix");
    expect_invalid(Weight::quantize(&w, k, n, &QuantizeOptions { bits: 8, ..defaults }), "bits 8");
    expect_invalid(Weight::quantize(&w, k, n, &QuantizeOptions { group_size: 24, ..defaults }), "group 24 of k 64");
    w[rng.below(k * n)] = f32::NAN;
    expect_invalid(Weight::quantize(&w, k, n, &defaults), "NaN value");
}

#[test]
fn owned_weights_cross_threads() {
    let mut rng = Rng::new();
    let (k, n) = (32, 16);
    let w: Vec<f32> = (0..k * n).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let weight = Weight::quantize(&w, k, n, &QuantizeOptions::default()).unwrap();
    let expected = weight.dequantize().unwrap();
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| assert_eq!(weight.dequantize().unwrap(), expected));
        }
    });
    // Dropped (freed) on another thread than the one that created it.
    std::thread::spawn(move || drop(weight)).join().unwrap();
}
