//! IEEE half-precision conversions for the FP16 activations of [`quant_gemm`](crate::quant_gemm), which device
//! buffers hold as `u16` bit patterns.

/// The IEEE half-precision bit pattern nearest to `x` (round to nearest, ties to even); values beyond the
/// half range become infinities, NaN stays NaN.
pub fn f32_to_f16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exponent = ((bits >> 23) & 0xff) as i32;
    let mantissa = bits & 0x7f_ffff;
    if exponent == 0xff {
        // Infinity, or NaN (kept quiet, with a mantissa bit set so it cannot become infinity).
        return sign | 0x7c00 | if mantissa != 0 { 0x0200 | (mantissa >> 13) as u16 } else { 0 };
    }
    // The value is 1.mantissa * 2^(exponent - 127); a half's exponent field is that power + 15.
    let half_exponent = exponent - 127 + 15;
    if half_exponent >= 0x1f {
        return sign | 0x7c00;
    }
    if half_exponent <= 0 {
        // Subnormal half (or zero): shift the full significand right; 14 - half_exponent bits go away.
        if half_exponent < -10 {
            return sign; // below half the smallest subnormal: rounds to zero
        }
        let significand = mantissa | 0x80_0000;
        let shift = (14 - half_exponent) as u32;
        return sign | round_shift(significand, shift) as u16;
    }
    // Normal: drop 13 mantissa bits; a carry out of the mantissa correctly bumps the exponent (up to infinity).
    let combined = ((half_exponent as u32) << 23) | mantissa;
    sign | round_shift(combined, 13) as u16
}

/// `value >> shift`, rounded to nearest with ties to even.
fn round_shift(value: u32, shift: u32) -> u32 {
    let kept = value >> shift;
    let rest = value & ((1 << shift) - 1);
    let half = 1 << (shift - 1);
    if rest > half || (rest == half && kept & 1 == 1) {
        kept + 1
    } else {
        kept
    }
}

/// The value of an IEEE half-precision bit pattern (exact: every half is an `f32`).
pub fn f16_bits_to_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0f32 } else { 1.0 };
    let exponent = i32::from((h >> 10) & 0x1f);
    let mantissa = f32::from(h & 0x3ff);
    match exponent {
        0 => sign * mantissa * 2f32.powi(-24),
        0x1f if mantissa == 0.0 => sign * f32::INFINITY,
        0x1f => f32::NAN,
        _ => sign * (1.0 + mantissa / 1024.0) * 2f32.powi(exponent - 15),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_half_round_trips() {
        for h in 0..=u16::MAX {
            let x = f16_bits_to_f32(h);
            if x.is_nan() {
                assert!(f32_to_f16_bits(x) & 0x7fff > 0x7c00, "{h:#06x}");
            } else {
                assert_eq!(f32_to_f16_bits(x), h, "{h:#06x} -> {x}");
            }
        }
    }

    /// The nearest half by search over all finite halves, ties to the even pattern: an independent reference.
    fn nearest_half(x: f32) -> u16 {
        let mut best = (f64::INFINITY, 0u16);
        for h in 0..=u16::MAX {
            let v = f16_bits_to_f32(h);
            if !v.is_finite() || (v == 0.0 && h == 0x8000) {
                continue;
            }
            let d = (f64::from(v) - f64::from(x)).abs();
            if d < best.0 || (d == best.0 && h & 1 == 0) {
                best = (d, h);
            }
        }
        best.1
    }

    #[test]
    fn rounding_matches_a_search_of_all_halves() {
        let mut state = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
        let mut next = || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 33) as u32
        };
        // Random values across the half range, the subnormals, and exact midpoints between neighbours.
        let mut samples: Vec<f32> = (0..150).map(|_| (next() as f32 / u32::MAX as f32 - 0.5) * 130_000.0).collect();
        samples.extend((0..100).map(|_| (next() as f32 / u32::MAX as f32 - 0.5) * 2e-4));
        samples.extend((0..100).map(|_| {
            let h = (next() % 0x7bff) as u16;
            (f16_bits_to_f32(h) + f16_bits_to_f32(h + 1)) / 2.0
        }));
        for x in samples {
            let expected = nearest_half(x.abs()) | if x < 0.0 { 0x8000 } else { 0 };
            assert_eq!(f32_to_f16_bits(x), expected, "{x}");
        }
        assert_eq!(f32_to_f16_bits(65520.0), 0x7c00, "65520 rounds up to infinity");
        assert_eq!(f32_to_f16_bits(-1e9), 0xfc00);
        assert_eq!(f32_to_f16_bits(1e-9), 0);
    }
}
