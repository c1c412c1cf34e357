//! `exp` and `tanh` in plain float arithmetic, branch-free, so loops over
//! them vectorise (the C library's `expf`/`tanhf` are scalar calls and were
//! half of a transformer step's time). Cephes' single-precision polynomials:
//! within 2 ulp of the correctly rounded result. `exp` flushes to 0 below
//! `e⁻⁸⁷` ≈ 1.6e-38, just above the smallest normal float: a result that
//! came out subnormal would cost a microcode assist per element (masked
//! attention scores hit this on every other element).
//!
//! Only adds, multiplies and bit casts: the same bits however wide the
//! vectors the compiler picks.

const LOG2_E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split so that `n · LN2_HI` is exact for |n| ≤ 2⁸ (Cody and Waite).
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Adding then subtracting 1.5 · 2²³ rounds to the nearest integer.
const ROUND: f32 = 12_582_912.0;
const EXP_MAX: f32 = 88.722_83;
const EXP_MIN: f32 = -87.0;

/// `eˣ`.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let clamped = x.clamp(EXP_MIN, EXP_MAX);
    let t = clamped * LOG2_E + ROUND;
    let n = t - ROUND;
    // The rounded integer sits in the low mantissa bits of `t`.
    let k = (t.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let r = (clamped - n * LN2_HI) - n * LN2_LO;
    let poly = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2)
        * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let p = poly * (r * r) + r + 1.0;
    // 2ᵏ as two factors, each a normal float for every k in [-126, 128].
    let half = k >> 1;
    let s1 = f32::from_bits(((half + 127) as u32) << 23);
    let s2 = f32::from_bits(((k - half + 127) as u32) << 23);
    let y = p * s1 * s2;
    if x.is_nan() {
        x
    } else if x > EXP_MAX {
        f32::INFINITY
    } else if x < EXP_MIN {
        0.0
    } else {
        y
    }
}

/// `tanh x`: an odd polynomial below 0.625, `1 − 2 / (e²ˣ + 1)` above.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    let a = x.abs();
    let z = x * x;
    let small =
        ((((-5.704_988_7e-3 * z + 2.063_909e-2) * z - 5.373_971_6e-2) * z + 1.333_144_2e-1) * z
            - 3.333_328e-1)
            * z
            * x
            + x;
    let large = 1.0 - 2.0 / (exp(2.0 * a) + 1.0);
    let large = f32::from_bits(large.to_bits() | (x.to_bits() & 0x8000_0000));
    if a < 0.625 {
        small
    } else {
        large
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ulps(got: f32, want: f64) -> f64 {
        let want32 = want as f32;
        let ulp = (f32::from_bits(want32.abs().to_bits() + 1) - want32.abs()) as f64;
        (got as f64 - want).abs() / ulp
    }

    #[test]
    fn exp_is_within_two_ulp() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x < 88.5 {
            worst = worst.max(ulps(exp(x), (x as f64).exp()));
            x += 0.001_3;
        }
        assert!(worst <= 2.0, "worst {worst} ulp");
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(1000.0), f32::INFINITY);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(-1e9), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert!(exp(f32::NAN).is_nan());
    }

    #[test]
    fn tanh_is_within_three_ulp() {
        let mut worst = 0.0f64;
        let mut x = -12.0f32;
        while x < 12.0 {
            if x != 0.0 {
                worst = worst.max(ulps(tanh(x), (x as f64).tanh()));
            }
            x += 0.000_7;
        }
        assert!(worst <= 3.0, "worst {worst} ulp");
        for tiny in [1e-30f32, -1e-8, 3e-4] {
            assert!(ulps(tanh(tiny), (tiny as f64).tanh()) <= 1.0);
        }
        assert_eq!(tanh(100.0), 1.0);
        assert_eq!(tanh(-100.0), -1.0);
        assert_eq!(tanh(f32::INFINITY), 1.0);
        assert!(tanh(f32::NAN).is_nan());
    }
}
