//! Transcendental functions of `f32` for the activation engine, written without
//! branches or library calls so that loops over them vectorise (the kernels run them
//! under `pulp`'s dispatch to the host's widest vector instructions), each within a few
//! units in the last place (ulp) of the exact value; the tests measure the worst case
//! over a sweep of every range. XLA:CPU uses fast polynomial approximations of its
//! own for these too, not libm's.
//!
//! Sine and cosine reduce their argument exactly in f64 up to [`TRIG_LIMIT`]; the few
//! elements beyond it are recomputed with the standard library after the loop
//! ([`exact_trig`]), so every result stays within an ulp. Still computed by the standard
//! library, one element at a time: `expm1`, `log1p`, `tan` and `cbrt`.

/// `e^x` in `f32`, less than 1 ulp from the exact value (Cephes' `expf` polynomial;
/// the test measures it), with no branches or library calls, so that loops over it vectorise.
/// XLA:CPU evaluates `exponential` with a polynomial of its own too, not libm's.
/// Overflow gives infinity, underflow gradual subnormals then zero, NaN stays NaN.
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    // ln 2 split in two so that `n · LN2_HI` is exact for every `n` used (Cody-Waite).
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5 · 2^23 rounds a float of magnitude below 2^22 to an
    // integer, ties to even, with plain arithmetic.
    const ROUND: f32 = 12_582_912.0;
    // Arguments whose result is infinity or zero are replaced by 0 (their result is
    // chosen at the end), so that a masked `-inf` costs no subnormal arithmetic, which
    // is many times slower. The comparisons are false for NaN, which then flows
    // through the arithmetic.
    #[allow(clippy::manual_range_contains)] // `contains` is false for NaN, which must pass
    let clamped = if x > 88.8 || x < -103.972_08 { 0.0 } else { x };
    let shifted = clamped * std::f32::consts::LOG2_E + ROUND;
    let n = shifted - ROUND;
    // The integer `n` is in the low bits of `shifted` (a cast would not vectorise).
    let n_int = shifted.to_bits() as i32 - ROUND.to_bits() as i32;
    let r = (clamped - n * LN2_HI) - n * LN2_LO;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r + 1.666_666_5e-1)
        * r
        + 0.5;
    let y = p * r * r + r + 1.0;
    // Scale by 2^n in two steps, each a normal power of two, so that results in the
    // subnormal range round once.
    let half = n_int >> 1;
    let scale = |e: i32| f32::from_bits(((e + 127) as u32) << 23);
    let y = y * scale(half) * scale(n_int - half);
    if x > 88.722_84 {
        f32::INFINITY
    } else if x < -103.972_08 {
        0.0
    } else {
        y
    }
}

/// The argument below which [`tanh_f32`] takes its polynomial.
const TANH_SMALL: f32 = 0.625;

/// `tanh(x)`: an odd polynomial (fitted for relative error) below 0.625, and
/// `1 - 2 / (e^2|x| + 1)` above it, with the sign put back; NaN stays NaN.
#[inline(always)]
pub(crate) fn tanh_f32(x: f32) -> f32 {
    let (small, large) = (tanh_small(x), tanh_large(x));
    if x.abs() < TANH_SMALL { small } else { large }
}

/// [`tanh_f32`]'s polynomial.
#[inline(always)]
fn tanh_small(x: f32) -> f32 {
    let t = x * x;
    x + x
        * t
        * ((((-5.718_891_5e-3 * t + 2.065_306_3e-2) * t - 5.374_464e-2) * t + 1.333_151_3e-1) * t - 3.333_328_7e-1)
}

/// [`tanh_f32`] above the polynomial's range.
#[inline(always)]
fn tanh_large(x: f32) -> f32 {
    (1.0 - 2.0 / (exp_f32(2.0 * x.abs()) + 1.0)).copysign(x)
}

/// [`tanh_f32`] of each of `x` into `out`. A block of 16 arguments all below 0.625 (so
/// no NaN among them) takes the polynomial alone: the exponential, whose result the
/// element function would not pick, is not computed for it.
#[inline(always)]
pub(crate) fn tanh_into(out: &mut [f32], x: &[f32]) {
    const BLOCK: usize = 16;
    for (out, x) in out.chunks_mut(BLOCK).zip(x.chunks(BLOCK)) {
        let small = x.iter().map(|v| u32::from(v.abs() < TANH_SMALL)).sum::<u32>() as usize == x.len();
        if small {
            out.iter_mut().zip(x).for_each(|(o, &x)| *o = tanh_small(x));
        } else {
            out.iter_mut().zip(x).for_each(|(o, &x)| *o = tanh_f32(x));
        }
    }
}

/// The largest argument [`sin_f32`] and [`cos_f32`] reduce exactly: `k · π/2` with
/// `k < 2^20` is exact with the 33-bit high part of π/2.
pub(crate) const TRIG_LIMIT: f32 = 1.0e6;

/// `sin(x)` for `|x| <= TRIG_LIMIT` (see [`trig_f32`]).
#[inline(always)]
pub(crate) fn sin_f32(x: f32) -> f32 {
    trig_f32(x, 0)
}

/// `cos(x)` for `|x| <= TRIG_LIMIT`: `sin(x + π/2)`, one quadrant on.
#[inline(always)]
pub(crate) fn cos_f32(x: f32) -> f32 {
    trig_f32(x, 1)
}

/// Sine, `quadrant` quarter turns on, in f64: `x = k · π/2 + r` with `|r| <= π/4`
/// (Cody-Waite, two parts of π/2), then the Taylor series of sine or cosine of `r`,
/// whose terms to `r¹¹` and `r¹⁰` leave an error far below f32's ulp.
#[inline(always)]
fn trig_f32(x: f32, quadrant: i64) -> f32 {
    const PIO2_HI: f64 = 1.570_796_326_734_125_6;
    const PIO2_LO: f64 = 6.077_100_506_506_192e-11;
    let x = f64::from(x);
    let k = (x * std::f64::consts::FRAC_2_PI).round_ties_even();
    let r = (x - k * PIO2_HI) - k * PIO2_LO;
    let r2 = r * r;
    let sin = r + r
        * r2
        * (-1.0 / 6.0 + r2 * (1.0 / 120.0 + r2 * (-1.0 / 5040.0 + r2 * (1.0 / 362_880.0 - r2 / 39_916_800.0))));
    let cos = 1.0 + r2 * (-0.5 + r2 * (1.0 / 24.0 + r2 * (-1.0 / 720.0 + r2 * (1.0 / 40320.0 - r2 / 3_628_800.0))));
    let q = (k as i64).wrapping_add(quadrant) & 3;
    let y = if q & 1 == 0 { sin } else { cos };
    (if q & 2 == 0 { y } else { -y }) as f32
}

/// The exact function of an activation whose fast form covers only part of its
/// arguments (sine and cosine, beyond [`TRIG_LIMIT`]), to recompute those elements with.
pub(crate) fn exact_trig(f: crate::isa::ActivationFn) -> Option<fn(f32) -> f32> {
    match f {
        crate::isa::ActivationFn::Sine => Some(f32::sin),
        crate::isa::ActivationFn::Cosine => Some(f32::cos),
        _ => None,
    }
}

/// Whether `x` is beyond what the fast sine and cosine reduce exactly (or NaN).
#[inline(always)]
pub(crate) fn beyond_trig_limit(x: f32) -> bool {
    x.abs() > TRIG_LIMIT || x.is_nan()
}

/// `erf(x)`, in f64: `x · P(x²)` below 1, `1 - e^(-x²) · Q(1/x)` from 1 to 4 (where
/// `Q` approximates `erfc(x) · e^(x²)`), and 1 beyond; `P` and `Q` are fitted for
/// relative error. The sign is `x`'s; NaN stays NaN.
#[inline(always)]
pub(crate) fn erf_f32(x: f32) -> f32 {
    // P's and Q's coefficients, constant term first.
    const P: [f64; 7] = [
        1.128_379_166_508_250_8,
        -0.376_126_288_367_430_45,
        0.112_836_123_648_574_08,
        -0.026_854_806_017_817_017,
        0.005_190_048_820_806_485,
        -0.000_802_431_169_808_524_6,
        7.898_066_371_398_166e-5,
    ];
    const Q: [f64; 11] = [
        2.596_264_560_957_338_4e-5,
        0.563_719_198_213_335,
        0.003_015_759_322_504_218_4,
        -0.285_188_031_716_701_4,
        -0.069_262_260_392_263_13,
        0.899_470_949_350_717_5,
        -1.524_029_652_967_621_8,
        1.423_978_708_173_265_6,
        -0.810_586_203_413_229_7,
        0.264_655_511_895_640_4,
        -0.038_216_366_117_097_854,
    ];
    let a = f64::from(x.abs());
    let t = a * a;
    let small = a * P.iter().rev().fold(0.0, |acc, &c| acc * t + c);
    let u = 1.0 / a.max(1.0);
    let q = Q.iter().rev().fold(0.0, |acc, &c| acc * u + c);
    let large = 1.0 - f64::from(exp_f32(-(t as f32))) * q;
    let y = if a < 1.0 {
        small
    } else if a < 4.0 {
        large
    } else {
        1.0
    };
    if x.is_nan() { x } else { (y as f32).copysign(x) }
}

/// `1 / (1 + e^-x)`.
#[inline(always)]
pub(crate) fn logistic_f32(x: f32) -> f32 {
    1.0 / (1.0 + exp_f32(-x))
}

/// `ln(x)`: `x = m · 2^e` with `m` in `[√½, √2)`, then `ln(1 + f)` for `f = m - 1`
/// (exact) as `f - f²/2 + f³ P(f)`, with `P` fitted for relative error. Zero gives
/// `-inf`, a negative `x` NaN, infinity itself; subnormals are scaled first.
#[inline(always)]
pub(crate) fn ln_f32(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let subnormal = x < f32::MIN_POSITIVE;
    let scaled = if subnormal { x * 8_388_608.0 } else { x };
    let bits = scaled.to_bits();
    let mut e = ((bits >> 23) & 0xff) as i32 - 127 - if subnormal { 23 } else { 0 };
    let m = f32::from_bits((bits & 0x007f_ffff) | 0x3f80_0000);
    let high = m > std::f32::consts::SQRT_2;
    let m = if high { m * 0.5 } else { m };
    e += i32::from(high);
    let f = m - 1.0;
    // P's coefficients, constant term first.
    const P: [f32; 8] = [
        3.333_335_5e-1,
        -2.500_085_2e-1,
        1.999_982_7e-1,
        -1.662_136_6e-1,
        1.422_710_3e-1,
        -1.320_213_1e-1,
        1.262_043_7e-1,
        -7.362_944e-2,
    ];
    let p = P.iter().rev().fold(0.0, |acc, &c| acc * f + c);
    let n = e as f32;
    let y = f * f * f * p - 0.5 * f * f + n * LN2_LO + f + n * LN2_HI;
    if x == 0.0 {
        f32::NEG_INFINITY
    } else if x < 0.0 || x.is_nan() {
        f32::NAN
    } else if x == f32::INFINITY {
        x
    } else {
        y
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance in units in the last place between an `f32` and the exact value.
    fn ulps(got: f32, exact: f64) -> f64 {
        let rounded = exact as f32;
        let ulp = if rounded == 0.0 {
            f64::from(f32::from_bits(1))
        } else {
            f64::from(f32::from_bits(rounded.abs().to_bits() + 1)) - f64::from(rounded.abs())
        };
        (f64::from(got) - exact).abs() / ulp
    }

    /// The worst error of `f` against `exact` over every `step`-th float from 0 up to
    /// `limit_bits` (as bits), both signs, where `keep` holds.
    fn worst(f: fn(f32) -> f32, exact: fn(f64) -> f64, limit_bits: u32, keep: fn(f32) -> bool) -> (f64, f32) {
        let mut worst = (0.0f64, 0.0f32);
        let mut bits = 0u32;
        while bits < limit_bits {
            for x in [f32::from_bits(bits), -f32::from_bits(bits)] {
                if keep(x) {
                    let e = ulps(f(x), exact(f64::from(x)));
                    if e > worst.0 {
                        worst = (e, x);
                    }
                }
            }
            bits += 251;
        }
        worst
    }

    #[test]
    fn exp_is_within_one_ulp_everywhere_and_exact_at_the_edges() {
        let mut worst = (0.0f64, 0.0f32);
        // Every 251st float between the underflow and overflow thresholds, both signs.
        let mut bits = 0u32;
        while bits < 0x42b2_0000 {
            for x in [f32::from_bits(bits), -f32::from_bits(bits)] {
                if x >= -103.9 {
                    let e = ulps(exp_f32(x), f64::from(x).exp());
                    if e > worst.0 {
                        worst = (e, x);
                    }
                }
            }
            bits += 251;
        }
        assert!(worst.0 < 1.0, "exp({}) is {} ulp off", worst.1, worst.0);
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(-0.0), 1.0);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp_f32(89.0), f32::INFINITY);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(-105.0), 0.0);
        assert!(exp_f32(f32::NAN).is_nan());
        assert!(exp_f32(88.72).is_finite());
        // Subnormal results round once.
        for x in [-88.0f32, -95.5, -100.25, -103.0] {
            assert!(ulps(exp_f32(x), f64::from(x).exp()) < 1.0, "exp({x}) = {}", exp_f32(x));
        }
    }

    /// Deterministic values in [-1, 1).
    #[test]
    fn sine_and_cosine_are_within_one_ulp_up_to_the_limit() {
        for (name, f, exact) in
            [("sin", sin_f32 as fn(f32) -> f32, f64::sin as fn(f64) -> f64), ("cos", cos_f32, f64::cos)]
        {
            let (e, x) = worst(f, exact, TRIG_LIMIT.to_bits() + 1, |x| x.abs() <= TRIG_LIMIT);
            assert!(e <= 1.0, "{name}({x}) is {e} ulp off");
        }
        assert!(sin_f32(f32::NAN).is_nan() && cos_f32(f32::INFINITY).is_nan());
        assert_eq!(sin_f32(0.0), 0.0);
        assert_eq!(cos_f32(0.0), 1.0);
    }

    #[test]
    fn erf_is_within_two_ulp_everywhere() {
        // libm's f64 erf is the reference.
        let (e, x) = worst(erf_f32, libm::erf, 0x4100_0000, |_| true);
        assert!(e <= 2.0, "erf({x}) is {e} ulp off");
        assert_eq!(erf_f32(0.0), 0.0);
        assert_eq!(erf_f32(f32::INFINITY), 1.0);
        assert_eq!(erf_f32(f32::NEG_INFINITY), -1.0);
        assert!(erf_f32(f32::NAN).is_nan());
    }

    #[test]
    fn tanh_is_within_two_ulp_everywhere() {
        // Up to 10, beyond which tanh is 1 in f32.
        let (e, x) = worst(tanh_f32, f64::tanh, 0x4120_0000, |_| true);
        assert!(e <= 2.0, "tanh({x}) is {e} ulp off");
        assert_eq!(tanh_f32(f32::INFINITY), 1.0);
        assert_eq!(tanh_f32(f32::NEG_INFINITY), -1.0);
        assert_eq!(tanh_f32(1e-30), 1e-30);
        assert!(tanh_f32(f32::NAN).is_nan());
    }

    #[test]
    fn logistic_is_within_three_ulp_where_it_is_not_subnormal() {
        let (e, x) = worst(logistic_f32, |x| 1.0 / (1.0 + (-x).exp()), 0x42b0_0000, |x| x > -87.0);
        assert!(e <= 3.0, "logistic({x}) is {e} ulp off");
        assert_eq!(logistic_f32(f32::INFINITY), 1.0);
        assert_eq!(logistic_f32(f32::NEG_INFINITY), 0.0);
        assert!(logistic_f32(f32::NAN).is_nan());
    }

    #[test]
    fn tanh_of_slices_gives_the_element_functions_bits() {
        // Blocks of 16 all below 0.625, some with one argument above or a NaN, and
        // lengths that leave a partial block.
        for n in [1, 15, 16, 17, 64, 100] {
            for spoiler in [None, Some(0.625), Some(-3.0), Some(f32::NAN), Some(f32::INFINITY)] {
                let mut x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 0.624).collect();
                if let Some(v) = spoiler {
                    x[n / 2] = v;
                }
                let mut out = vec![0.0; n];
                tanh_into(&mut out, &x);
                for (o, &x) in out.iter().zip(&x) {
                    assert_eq!(o.to_bits(), tanh_f32(x).to_bits(), "tanh({x}) of {n}");
                }
            }
        }
    }

    #[test]
    fn ln_is_within_one_ulp_for_every_positive_float() {
        let (e, x) = worst(ln_f32, f64::ln, 0x7f80_0000, |x| x > 0.0);
        assert!(e <= 1.0, "ln({x}) is {e} ulp off");
        assert_eq!(ln_f32(1.0), 0.0);
        assert_eq!(ln_f32(0.0), f32::NEG_INFINITY);
        assert_eq!(ln_f32(-0.0), f32::NEG_INFINITY);
        assert!(ln_f32(-1.0).is_nan());
        assert!(ln_f32(f32::NAN).is_nan());
        assert_eq!(ln_f32(f32::INFINITY), f32::INFINITY);
        assert!((ln_f32(f32::from_bits(1)) - (-103.278_93)).abs() < 1e-4, "the smallest subnormal");
    }
}
