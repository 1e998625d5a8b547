//! `tinyloop::f16` (the `half` crate's) is the FP16 type of the API: its conversions must be the IEEE ones the
//! library's kernels and file format use: exact widening, and narrowing that rounds to nearest with ties to even.

mod common;

use common::Rng;
use tinyloop::f16;

#[test]
fn every_half_round_trips_through_f32() {
    for bits in 0..=u16::MAX {
        let h = f16::from_bits(bits);
        let x = f32::from(h);
        if x.is_nan() {
            assert!(f16::from_f32(x).is_nan(), "{bits:#06x}");
        } else {
            assert_eq!(f16::from_f32(x).to_bits(), bits, "{bits:#06x} -> {x}");
        }
    }
}

/// The nearest finite half by search over all of them, ties to the even pattern: an independent reference.
fn nearest_half(x: f32) -> u16 {
    let mut best = (f64::INFINITY, 0u16);
    for bits in 0..=u16::MAX {
        let v = f32::from(f16::from_bits(bits));
        if !v.is_finite() || (v == 0.0 && bits == 0x8000) {
            continue;
        }
        let d = (f64::from(v) - f64::from(x)).abs();
        if d < best.0 || (d == best.0 && bits & 1 == 0) {
            best = (d, bits);
        }
    }
    best.1
}

#[test]
fn narrowing_rounds_to_nearest_even_like_a_search_of_all_halves() {
    let mut rng = Rng::new();
    // Random values across the half range, the subnormals, and exact midpoints between neighbours.
    let mut samples: Vec<f32> = (0..100).map(|_| rng.uniform(-65_000.0, 65_000.0)).collect();
    samples.extend((0..60).map(|_| rng.uniform(-1e-4, 1e-4)));
    samples.extend((0..60).map(|_| {
        let bits = rng.below(0x7bff) as u16;
        (f32::from(f16::from_bits(bits)) + f32::from(f16::from_bits(bits + 1))) / 2.0
    }));
    for x in samples {
        let expected = nearest_half(x.abs()) | if x < 0.0 { 0x8000 } else { 0 };
        assert_eq!(f16::from_f32(x).to_bits(), expected, "{x}");
    }
    assert_eq!(f16::from_f32(65520.0), f16::INFINITY, "65520 rounds up to infinity");
    assert_eq!(f16::from_f32(-1e9), f16::NEG_INFINITY);
    assert_eq!(f16::from_f32(1e-9).to_bits(), 0);
    assert_eq!(f16::from_f32(1.0).to_bits(), 0x3c00);
}
