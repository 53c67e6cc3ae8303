//! Element-wise kernels: unary and binary arithmetic, activations, rounding to a
//! narrower float format, comparisons, selection, conversion and clamping; `f32` work
//! over contiguous arrays runs vectorised and, when large, across idle compute slots.

use ndarray::{ArrayD, ArrayViewD, IxDyn, Zip};

use super::*;
use crate::backend::element::{Element, Int, cast, with_element, with_float, with_int};
use crate::backend::{Value, ValueRef};
use crate::dtype::{ArrayType, DType, DTypeClass};
use crate::isa::{ActivationFn, BinaryOp, CompareDirection, FloatFormat, Op, UnaryOp};
use crate::pool::HostPool;

vectorized_job!(
    /// `elementwise_run`, vectorised.
    ElementwiseRun<'a> ((&'a Op, &'a [&'a [f32]], usize, &'a mut [f32])) -> () = elementwise_run
);

/// Element-wise `f32` work of at least this many elements is split across idle compute
/// slots (about 256 KiB per array: below it, waking a helper costs more than it saves).
pub(super) const PARALLEL_MIN_ELEMENTS: usize = 1 << 16;

/// Computes an element-wise `f32` binary operation or activation over contiguous
/// operands into contiguous `dest`, split into equal runs across the compute slots
/// idle now. `None` when the operation or the layouts do not allow it.
pub(super) fn elementwise_f32_flat(
    op: &Op,
    operands: &[ValueRef<'_>],
    dest: &mut [f32],
    helpers: &HostPool,
) -> Option<()> {
    if !matches!((op, operands.len()), (Op::Binary(_), 2) | (Op::Activation(_), 1) | (Op::RoundPrecision { .. }, 1)) {
        return None;
    }
    let slices: Vec<&[f32]> = operands
        .iter()
        .map(|v| match v {
            ValueRef::F32(a) => a.as_slice().filter(|s| s.len() == dest.len()),
            _ => None,
        })
        .collect::<Option<_>>()?;
    // Each run is compiled for the widest vector instructions this CPU has.
    let run = |start: usize, out: &mut [f32]| vectorized(ElementwiseRun((op, slices.as_slice(), start, out)));
    let n = dest.len();
    let lent =
        if n >= 2 * PARALLEL_MIN_ELEMENTS { helpers.lend(n / PARALLEL_MIN_ELEMENTS - 1) } else { helpers.lend(0) };
    let threads = lent.threads();
    if threads == 1 {
        run(0, dest);
        return Some(());
    }
    // Runs of whole 64-byte lines, so that no two threads write one cache line.
    let chunk = n.div_ceil(threads).next_multiple_of(16);
    let parts: Vec<(usize, &mut [f32])> = dest.chunks_mut(chunk).enumerate().map(|(i, c)| (i * chunk, c)).collect();
    lent.run(parts, |(start, out)| run(start, out));
    Some(())
}

/// One run of `elementwise_f32_flat`: the elements `start..start + out.len()`.
#[inline(always)]
pub(super) fn elementwise_run((op, slices, start, out): (&Op, &[&[f32]], usize, &mut [f32])) {
    let end = start + out.len();
    match (op, slices) {
        (Op::Binary(b), [x, y]) => with_binary_f32!(*b, f => {
            for ((o, &x), &y) in out.iter_mut().zip(&x[start..end]).zip(&y[start..end]) {
                *o = f(x, y);
            }
        }),
        (Op::Activation(ActivationFn::Tanh), [x]) => tanh_into(out, &x[start..end]),
        (Op::Activation(a), [x]) => {
            with_activation!(*a, f => {
                for (o, &x) in out.iter_mut().zip(&x[start..end]) {
                    *o = f(x);
                }
            });
            if let Some(exact) = exact_trig(*a) {
                for (o, &x) in out.iter_mut().zip(&x[start..end]) {
                    if beyond_trig_limit(x) {
                        *o = exact(x);
                    }
                }
            }
        }
        (Op::RoundPrecision { format, saturate }, [x]) => with_rounding!(*format, *saturate, f => {
            for (o, &x) in out.iter_mut().zip(&x[start..end]) {
                *o = f(x);
            }
        }),
        _ => unvalidated("element-wise f32"),
    }
}

/// An element-wise `f32` operation computed into a new array, in parallel when large.
pub(super) fn elementwise_f32(
    op: &Op,
    operands: &[ValueRef<'_>],
    out: &ArrayType,
    helpers: &HostPool,
) -> Option<Value> {
    let dims = to_usize(&out.dims);
    let n: usize = dims.iter().product();
    if n < 2 * PARALLEL_MIN_ELEMENTS {
        return None;
    }
    let mut data = vec![0.0f32; n];
    elementwise_f32_flat(op, operands, &mut data, helpers)?;
    Some(Value::F32(ArrayD::from_shape_vec(IxDyn(&dims), data).unwrap_or_else(|_| unvalidated("output"))))
}

pub(super) fn unary(op: UnaryOp, a: &ValueRef<'_>) -> Value {
    let dtype = a.dtype();
    if op == UnaryOp::IsFinite {
        return with_float!(dtype, T => Value::Pred(arr::<T>(a).mapv(|x| x.to_f32().is_finite())), unvalidated("is-finite"));
    }
    match dtype.class() {
        DTypeClass::Float => with_unary_f32!(op, f => {
            with_float!(dtype, T => T::wrap(arr::<T>(a).mapv(|x| T::from_f32(f(x.to_f32())))), unvalidated("unary"))
        }),
        DTypeClass::Signed | DTypeClass::Unsigned => {
            with_int!(dtype, T => T::wrap(arr::<T>(a).mapv(unary_int::<T>(op))), unvalidated("unary"))
        }
        DTypeClass::Pred => match op {
            UnaryOp::Not => Value::Pred(arr::<bool>(a).mapv(|x| !x)),
            _ => unvalidated("unary on pred"),
        },
    }
}

pub(super) fn unary_int<T: Int>(op: UnaryOp) -> fn(T) -> T {
    match op {
        UnaryOp::Negate => T::neg,
        UnaryOp::Abs => T::abs,
        UnaryOp::Sign => T::signum,
        UnaryOp::Not => T::not,
        UnaryOp::PopCount => T::count_ones,
        UnaryOp::CountLeadingZeros => T::leading_zeros,
        UnaryOp::IsFinite => |_| unvalidated("is-finite of an integer"),
        UnaryOp::Ceil | UnaryOp::Floor | UnaryOp::RoundNearestEven | UnaryOp::RoundNearestAfz => {
            |_| unvalidated("rounding an integer")
        }
    }
}

/// `x` rounded to the nearest value of `format`, ties to even. A finite value beyond
/// the format's range becomes infinite (NaN in FP8 E4M3, which has no infinities);
/// with `saturate`, it and an infinite `x` become the largest finite value instead.
pub(crate) fn round_to_format(x: f32, format: FloatFormat, saturate: bool) -> f32 {
    if x.is_nan() {
        return x;
    }
    let rounded = match format {
        FloatFormat::Bf16 => round_mantissa(x, 16),
        FloatFormat::Tf32 => round_mantissa(x, 13),
        FloatFormat::Fp16 => half::f16::from_f32(x).to_f32(),
        FloatFormat::Fp8E4m3 | FloatFormat::Bits { .. } => round_by_quantum(x, format),
    };
    if saturate && !rounded.is_finite() { largest_finite(format).copysign(x) } else { rounded }
}

/// Clears the low `drop` bits of an f32, rounding to nearest even; a carry out of the
/// mantissa moves to the next binade, or to infinity past the largest finite value.
#[inline]
pub(crate) fn round_mantissa(x: f32, drop: u32) -> f32 {
    let bits = x.to_bits();
    let bias = (1u32 << (drop - 1)) - 1 + ((bits >> drop) & 1);
    f32::from_bits(bits.wrapping_add(bias) & !((1u32 << drop) - 1))
}

/// Rounds to a multiple of the spacing of `format` around `x` (exact in f64), for
/// formats without a bit-level shortcut.
pub(super) fn round_by_quantum(x: f32, format: FloatFormat) -> f32 {
    let (exponent_bits, mantissa_bits) = format.widths();
    let min_exponent = 2 - (1i32 << (exponent_bits - 1));
    if x.is_infinite() {
        return if format == FloatFormat::Fp8E4m3 { f32::NAN } else { x };
    }
    let magnitude = f64::from(x).abs();
    if magnitude == 0.0 {
        return x;
    }
    let exponent = ((magnitude.to_bits() >> 52) as i32 - 1023).max(min_exponent);
    let quantum = 2f64.powi(exponent - mantissa_bits as i32);
    let rounded = (magnitude / quantum).round_ties_even() * quantum;
    if rounded > f64::from(largest_finite(format)) {
        return if format == FloatFormat::Fp8E4m3 { f32::NAN } else { f32::INFINITY.copysign(x) };
    }
    (rounded as f32).copysign(x)
}

/// The largest finite value of `format`.
pub(super) fn largest_finite(format: FloatFormat) -> f32 {
    let (exponent_bits, mantissa_bits) = format.widths();
    let max_exponent = (1i32 << (exponent_bits - 1)) - 1;
    let value = match format {
        // E4M3FN keeps the top exponent for finite values: 1.75 * 2^8.
        FloatFormat::Fp8E4m3 => 448.0,
        _ => (2.0 - 2f64.powi(-(mantissa_bits as i32))) * 2f64.powi(max_exponent),
    };
    value.min(f64::from(f32::MAX)) as f32
}

/// XLA's `sign` on floats: ±1 by sign, while ±0 and NaN stay as they are.
pub(crate) fn sign_f32(x: f32) -> f32 {
    if x == 0.0 || x.is_nan() { x } else { x.signum() }
}

pub(super) fn zip_map<T: Copy, U>(a: &ArrayViewD<'_, T>, b: &ArrayViewD<'_, T>, f: impl Fn(T, T) -> U) -> ArrayD<U> {
    Zip::from(a).and(b).map_collect(|&x, &y| f(x, y))
}

pub(super) fn binary(op: BinaryOp, a: &ValueRef<'_>, b: &ValueRef<'_>) -> Value {
    let dtype = a.dtype();
    match dtype.class() {
        DTypeClass::Float => with_binary_f32!(op, f => {
            with_float!(dtype, T => T::wrap(zip_map(arr::<T>(a), arr::<T>(b), |x, y| T::from_f32(f(x.to_f32(), y.to_f32())))),
                unvalidated("binary"))
        }),
        DTypeClass::Signed | DTypeClass::Unsigned => {
            with_int!(dtype, T => T::wrap(zip_map(arr::<T>(a), arr::<T>(b), binary_int::<T>(op))), unvalidated("binary"))
        }
        DTypeClass::Pred => {
            let (a, b) = (arr::<bool>(a), arr::<bool>(b));
            Value::Pred(match op {
                BinaryOp::Minimum | BinaryOp::And => zip_map(a, b, |x, y| x && y),
                BinaryOp::Maximum | BinaryOp::Or => zip_map(a, b, |x, y| x || y),
                BinaryOp::Xor => zip_map(a, b, |x, y| x != y),
                _ => unvalidated("binary on pred"),
            })
        }
    }
}

pub(super) fn binary_int<T: Int>(op: BinaryOp) -> fn(T, T) -> T {
    match op {
        BinaryOp::Add => T::add,
        BinaryOp::Subtract => T::sub,
        BinaryOp::Multiply => T::mul,
        BinaryOp::Divide => T::div,
        BinaryOp::Maximum => Ord::max,
        BinaryOp::Minimum => Ord::min,
        BinaryOp::Power => T::pow,
        BinaryOp::Remainder => T::rem,
        BinaryOp::And => T::and,
        BinaryOp::Or => T::or,
        BinaryOp::Xor => T::xor,
        BinaryOp::ShiftLeft => T::shl,
        BinaryOp::ShiftRightLogical => T::shr_logical,
        BinaryOp::ShiftRightArithmetic => T::shr_arithmetic,
        BinaryOp::Atan2 => |_, _| unvalidated("atan2 on an integer"),
    }
}

/// XLA's `maximum`: NaN in either operand gives NaN. Written as one comparison and a
/// choice, which vectorises (in a reduction too) better than `f32::max` plus NaN tests.
#[inline]
pub(crate) fn max_f32(x: f32, y: f32) -> f32 {
    if x > y || x.is_nan() { x } else { y }
}

/// XLA's `minimum`: NaN in either operand gives NaN.
#[inline]
pub(crate) fn min_f32(x: f32, y: f32) -> f32 {
    if x < y || x.is_nan() { x } else { y }
}

/// HLO `compare` of two elements: unordered (NaN) operands are only "not equal",
/// unless `total_order` orders them too.
#[inline]
pub(crate) fn compare_scalars<T: Element>(direction: CompareDirection, total_order: bool, x: T, y: T) -> bool {
    use std::cmp::Ordering;
    let ord = if total_order { Some(x.total_cmp(&y)) } else { x.partial_cmp(&y) };
    match (direction, ord) {
        (CompareDirection::Ne, None) => true,
        (_, None) => false,
        (CompareDirection::Eq, Some(o)) => o == Ordering::Equal,
        (CompareDirection::Ne, Some(o)) => o != Ordering::Equal,
        (CompareDirection::Lt, Some(o)) => o == Ordering::Less,
        (CompareDirection::Le, Some(o)) => o != Ordering::Greater,
        (CompareDirection::Gt, Some(o)) => o == Ordering::Greater,
        (CompareDirection::Ge, Some(o)) => o != Ordering::Less,
    }
}

pub(super) fn compare(direction: CompareDirection, total_order: bool, a: &ValueRef<'_>, b: &ValueRef<'_>) -> Value {
    fn compare_arrays<T: Element>(
        direction: CompareDirection,
        total_order: bool,
        a: &ArrayViewD<'_, T>,
        b: &ArrayViewD<'_, T>,
    ) -> ArrayD<bool> {
        if total_order {
            zip_map(a, b, |x, y| compare_scalars(direction, true, x, y))
        } else {
            zip_map(a, b, |x, y| compare_scalars(direction, false, x, y))
        }
    }
    with_element!(a.dtype(), T => Value::Pred(compare_arrays(direction, total_order, arr::<T>(a), arr::<T>(b))))
}

pub(super) fn select<T: Copy>(p: &ArrayViewD<'_, bool>, a: &ArrayViewD<'_, T>, b: &ArrayViewD<'_, T>) -> ArrayD<T> {
    match p.ndim() {
        0 if p.iter().next().copied().unwrap_or(false) => a.to_owned(),
        0 => b.to_owned(),
        _ => Zip::from(p).and(a).and(b).map_collect(|&c, &x, &y| if c { x } else { y }),
    }
}

pub(super) fn convert(a: &ValueRef<'_>, to: DType) -> Value {
    with_element!(a.dtype(), S => {
        let a = arr::<S>(a);
        with_element!(to, D => D::wrap(a.mapv(cast::<S, D>)))
    })
}

pub(super) fn clamp(lo: &ValueRef<'_>, x: &ValueRef<'_>, hi: &ValueRef<'_>) -> Value {
    fn clamp_with<T: Copy>(
        lo: &ArrayViewD<'_, T>,
        x: &ArrayViewD<'_, T>,
        hi: &ArrayViewD<'_, T>,
        f: impl Fn(T, T, T) -> T,
    ) -> ArrayD<T> {
        let (Some(lo), Some(hi)) = (lo.broadcast(x.raw_dim()), hi.broadcast(x.raw_dim())) else {
            unvalidated("clamp");
        };
        Zip::from(x).and(&lo).and(&hi).map_collect(|&v, &l, &h| f(v, l, h))
    }
    let dtype = x.dtype();
    match dtype.class() {
        DTypeClass::Float => with_float!(dtype, T => T::wrap(clamp_with(arr::<T>(lo), arr::<T>(x), arr::<T>(hi),
            |v, l, h| T::from_f32(min_f32(max_f32(v.to_f32(), l.to_f32()), h.to_f32())))), unvalidated("clamp")),
        DTypeClass::Signed | DTypeClass::Unsigned => {
            with_int!(dtype, T => T::wrap(clamp_with(arr::<T>(lo), arr::<T>(x),
            arr::<T>(hi), |v, l, h| v.max(l).min(h))), unvalidated("clamp"))
        }
        DTypeClass::Pred => unvalidated("clamp on pred"),
    }
}
