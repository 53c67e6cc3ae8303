//! The numeric kernels: one function per engine operation, on host arrays.
//!
//! Kernels trust the shapes they are given: [`crate::isa::Program::validate`] has
//! already proven that every operand fits its operation, and a kernel that finds
//! otherwise panics (see `unvalidated`) rather than compute something plausible. Semantics follow XLA's
//! (NaN-propagating `maximum`/`minimum`, integer division by zero gives -1, wrapping
//! integer arithmetic, saturating float-to-int conversion).

mod random;
mod region;

use ndarray::{ArrayD, ArrayViewD, Axis, Dimension, IxDyn, Slice, Zip};

use super::element::{Element, Int, cast, with_element, with_float, with_int};
use super::{Destination, OutOfBounds, Value, ValueRef};
use crate::dtype::{ArrayType, DType, DTypeClass};
use crate::isa::{
    ActivationFn, BinaryOp, CompareDirection, DotDims, FloatFormat, GatherDims, Op, ReduceOp, ScatterCombine,
    ScatterDims, UnaryOp,
};
use crate::pool::HostPool;

/// The array inside `v`, which validation has proven to be of type `T`.
pub(super) fn arr<'v, 'a, T: Element>(v: &'v ValueRef<'a>) -> &'v ArrayViewD<'a, T> {
    T::unwrap(v).unwrap_or_else(|| unvalidated("operand type"))
}

/// Applies a generic array function to `$value`, whatever its element type.
macro_rules! each_type {
    ($value:expr, $a:ident => $body:expr) => {{
        let value: &ValueRef<'_> = $value;
        with_element!(value.dtype(), T => {
            let $a = arr::<T>(value);
            T::wrap($body)
        })
    }};
}
pub(super) use each_type;

/// Binds `$f` to `round_to_format` specialised for one format and saturation mode, so
/// that the loop in `$body` inlines it (and, for bf16 and tf32, vectorises it).
macro_rules! with_rounding {
    ($format:expr, $saturate:expr, $f:ident => $body:expr) => {
        match ($format, $saturate) {
            (FloatFormat::Bf16, false) => {
                let $f = |x: f32| if x.is_nan() { x } else { round_mantissa(x, 16) };
                $body
            }
            (FloatFormat::Tf32, false) => {
                let $f = |x: f32| if x.is_nan() { x } else { round_mantissa(x, 13) };
                $body
            }
            (format, saturate) => {
                let $f = move |x: f32| round_to_format(x, format, saturate);
                $body
            }
        }
    };
}

/// Binds `$f` to the `f32` function of an activation and evaluates `$body`. Each arm
/// gets its own closure, so the loop in `$body` inlines it and can vectorise, which a
/// function pointer chosen at run time would prevent. (Closures rather than function
/// items: a function item is called through a shim, which is not always inlined into
/// the vectorised copies that `vectorized` compiles.)
macro_rules! with_activation {
    ($op:expr, $f:ident => $body:expr) => {
        match $op {
            ActivationFn::Exp => {
                let $f = |x: f32| exp_f32(x);
                $body
            }
            ActivationFn::Log => {
                let $f = |x: f32| x.ln();
                $body
            }
            ActivationFn::Tanh => {
                let $f = |x: f32| x.tanh();
                $body
            }
            ActivationFn::Logistic => {
                let $f = |x: f32| 1.0 / (1.0 + (-x).exp());
                $body
            }
            ActivationFn::Rsqrt => {
                let $f = |x: f32| 1.0 / x.sqrt();
                $body
            }
            ActivationFn::Sqrt => {
                let $f = |x: f32| x.sqrt();
                $body
            }
            ActivationFn::Sine => {
                let $f = |x: f32| x.sin();
                $body
            }
            ActivationFn::Cosine => {
                let $f = |x: f32| x.cos();
                $body
            }
            ActivationFn::ExpMinusOne => {
                let $f = |x: f32| x.exp_m1();
                $body
            }
            ActivationFn::LogPlusOne => {
                let $f = |x: f32| x.ln_1p();
                $body
            }
        }
    };
}

/// Binds `$f` to the `f32` function of a unary operation (see `with_activation`).
macro_rules! with_unary_f32 {
    ($op:expr, $f:ident => $body:expr) => {
        match $op {
            UnaryOp::Negate => {
                let $f = |x: f32| -x;
                $body
            }
            UnaryOp::Abs => {
                let $f = |x: f32| x.abs();
                $body
            }
            UnaryOp::Sign => {
                let $f = |x: f32| sign_f32(x);
                $body
            }
            UnaryOp::Ceil => {
                let $f = |x: f32| x.ceil();
                $body
            }
            UnaryOp::Floor => {
                let $f = |x: f32| x.floor();
                $body
            }
            UnaryOp::RoundNearestEven => {
                let $f = |x: f32| x.round_ties_even();
                $body
            }
            UnaryOp::RoundNearestAfz => {
                let $f = |x: f32| x.round();
                $body
            }
            UnaryOp::Not => unvalidated("not on a float"),
        }
    };
}

/// Binds `$f` to the `f32` function of a binary operation (see `with_activation`).
macro_rules! with_binary_f32 {
    ($op:expr, $f:ident => $body:expr) => {
        match $op {
            BinaryOp::Add => {
                let $f = |x: f32, y: f32| x + y;
                $body
            }
            BinaryOp::Subtract => {
                let $f = |x: f32, y: f32| x - y;
                $body
            }
            BinaryOp::Multiply => {
                let $f = |x: f32, y: f32| x * y;
                $body
            }
            BinaryOp::Divide => {
                let $f = |x: f32, y: f32| x / y;
                $body
            }
            BinaryOp::Maximum => {
                let $f = |x: f32, y: f32| max_f32(x, y);
                $body
            }
            BinaryOp::Minimum => {
                let $f = |x: f32, y: f32| min_f32(x, y);
                $body
            }
            BinaryOp::Power => {
                let $f = |x: f32, y: f32| x.powf(y);
                $body
            }
            BinaryOp::Remainder => {
                let $f = |x: f32, y: f32| x % y;
                $body
            }
            BinaryOp::Atan2 => {
                let $f = |x: f32, y: f32| x.atan2(y);
                $body
            }
            BinaryOp::And
            | BinaryOp::Or
            | BinaryOp::Xor
            | BinaryOp::ShiftLeft
            | BinaryOp::ShiftRightLogical
            | BinaryOp::ShiftRightArithmetic => unvalidated("bitwise operation on a float"),
        }
    };
}

/// Binds `$f` to the `f32` function of a reduction (see `with_activation`).
macro_rules! with_reduce_f32 {
    ($op:expr, $f:ident => $body:expr) => {
        match $op {
            ReduceOp::Add => {
                let $f = |x: f32, y: f32| x + y;
                $body
            }
            ReduceOp::Multiply => {
                let $f = |x: f32, y: f32| x * y;
                $body
            }
            ReduceOp::Maximum => {
                let $f = |x: f32, y: f32| max_f32(x, y);
                $body
            }
            ReduceOp::Minimum => {
                let $f = |x: f32, y: f32| min_f32(x, y);
                $body
            }
        }
    };
}

pub(super) use {with_activation, with_binary_f32, with_rounding, with_unary_f32};

/// Applies `op` to `operands`, producing a value of type `out`. Only gathers and
/// scatters fail, on an index outside their array.
pub(super) fn execute(
    op: &Op,
    operands: &[ValueRef<'_>],
    out: &ArrayType,
    helpers: &HostPool,
) -> Result<Value, OutOfBounds> {
    if matches!(op, Op::Binary(_) | Op::Activation(_) | Op::RoundPrecision { .. })
        && out.dtype == DType::F32
        && let Some(value) = elementwise_f32(op, operands, out, helpers)
    {
        return Ok(value);
    }
    let dims = to_usize(&out.dims);
    Ok(match op {
        Op::MatMul(d) => matmul(&operands[0], &operands[1], d, out, helpers),
        Op::Activation(f) => with_activation!(*f, f => {
            with_float!(operands[0].dtype(), T => T::wrap(arr::<T>(&operands[0]).mapv(|x| T::from_f32(f(x.to_f32())))),
                unvalidated("activation"))
        }),
        Op::Unary(u) => unary(*u, &operands[0]),
        Op::Binary(b) => binary(*b, &operands[0], &operands[1]),
        Op::Compare { direction, total_order } => compare(*direction, *total_order, &operands[0], &operands[1]),
        Op::Select => {
            let p = arr::<bool>(&operands[0]);
            with_element!(operands[1].dtype(), T => T::wrap(select(p, arr::<T>(&operands[1]), arr::<T>(&operands[2]))))
        }
        Op::Convert => convert(&operands[0], out.dtype),
        Op::Broadcast { dims: map } => each_type!(&operands[0], a => broadcast(a, map, &dims)),
        Op::Reshape => each_type!(&operands[0], a => reshape(a, &dims)),
        Op::Transpose { perm } => each_type!(&operands[0], a => transpose(a, perm)),
        Op::Reduce { op, dims: axes } => reduce(*op, &operands[0], &operands[1], axes),
        Op::Concatenate { dim } => concatenate(operands, *dim as usize),
        Op::Slice { start, limit, stride } => each_type!(&operands[0], a => slice(a, start, limit, stride)),
        Op::Iota { dim } => {
            let dim = *dim as usize;
            with_element!(out.dtype, T => T::wrap(ArrayD::from_shape_fn(IxDyn(&dims), |ix| T::from_i64(ix[dim] as i64))))
        }
        Op::Copy => operands[0].to_owned(),
        Op::Clamp => clamp(&operands[0], &operands[1], &operands[2]),
        Op::Reverse { dims: axes } => each_type!(&operands[0], a => reverse(a, axes)),
        Op::Pad { low, interior, .. } => {
            each_type!(&operands[0], a => pad(a, first(arr(&operands[1])), low, interior, &dims))
        }
        Op::DynamicSlice { .. } => {
            let start = clamped_starts(&operands[1..], operands[0].shape(), &dims);
            each_type!(&operands[0], a => a.slice_each_axis(|ax| window(&start, &dims, ax.axis.index())).to_owned())
        }
        Op::DynamicUpdateSlice => {
            let update_dims = operands[1].shape().to_vec();
            let start = clamped_starts(&operands[2..], operands[0].shape(), &update_dims);
            each_type!(&operands[0], a => {
                let mut out = a.to_owned();
                out.slice_each_axis_mut(|ax| window(&start, &update_dims, ax.axis.index())).assign(arr(&operands[1]));
                out
            })
        }
        Op::BitcastConvert => {
            let mut bytes = vec![0u8; out.size_bytes().unwrap_or(0) as usize];
            operands[0].write_le_bytes(&mut bytes);
            Value::from_le_bytes(out, &bytes)
        }
        Op::Gather(g) => {
            let indices = IndexRows::new(&operands[1], g.index_vector_dim);
            each_type!(&operands[0], a => gather(a, &indices, g, &dims)?)
        }
        Op::Scatter { dims: s, combine } => scatter_value(&operands[0], &operands[1], &operands[2], s, *combine)?,
        Op::RoundPrecision { format, saturate } => {
            let (format, saturate) = (*format, *saturate);
            if let ValueRef::F32(a) = &operands[0] {
                return Ok(Value::F32(with_rounding!(format, saturate, f => a.mapv(f))));
            }
            with_float!(operands[0].dtype(), T => {
                T::wrap(arr::<T>(&operands[0]).mapv(|x| T::from_f32(round_to_format(x.to_f32(), format, saturate))))
            }, unvalidated("round-precision"))
        }
        Op::ReduceRegion { dims: axes, region, result } => {
            region::reduce_region(region, axes, *result as usize, operands, out, helpers)
        }
        Op::SelectAndScatter { window, select, total_order, combine } => region::select_and_scatter(
            window,
            *select,
            *total_order,
            *combine,
            &operands[0],
            &operands[1],
            &operands[2],
        ),
        Op::RngBitGenerator { algorithm, result, bits } => {
            random::bit_generator(*algorithm, *result, &operands[0], bits)
        }
        Op::RngUniform => random::uniform(&operands[0], &operands[1], out),
        // The run hands collectives to the communicator; nothing else executes them.
        Op::Collective(_) => unvalidated("collective outside a run"),
        Op::ReduceRounded { op, dims: axes, format, saturate } => {
            let (format, saturate) = (*format, *saturate);
            with_reduce_f32!(*op, f => {
                let rounded = move |x: f32, y: f32| round_to_format(f(x, y), format, saturate);
                with_float!(operands[0].dtype(), T => {
                    let widened = arr::<T>(&operands[0]).mapv(T::to_f32);
                    let init = first(arr::<T>(&operands[1])).to_f32();
                    T::wrap(reduce_array_sequential(&widened.view(), init, axes, rounded).mapv(T::from_f32))
                }, unvalidated("reduce"))
            })
        }
    })
}

/// Applies `op` to `operands`, writing the `f32` result straight into `destination`
/// (an output tensor), and returns a view of it. Matrix products, element-wise
/// arithmetic and activations compute in place; other operations compute into a new
/// array that is then copied.
pub(super) fn execute_into<'d>(
    op: &Op,
    operands: &[ValueRef<'_>],
    out: &ArrayType,
    destination: Destination<'d>,
    helpers: &HostPool,
) -> Result<ValueRef<'d>, OutOfBounds> {
    let dims = IxDyn(&to_usize(&out.dims));
    let words = destination.0;
    let view = ndarray::ArrayViewMutD::from_shape(dims.clone(), &mut *words);
    write_f32(op, operands, out, view.unwrap_or_else(|_| unvalidated("output")), helpers)?;
    let words: &'d [f32] = words;
    Ok(ValueRef::F32(ArrayViewD::from_shape(dims, words).unwrap_or_else(|_| unvalidated("output"))))
}

/// Declares `$job`, a call of the `#[inline(always)]` function `$f` on one argument of
/// type `$args`, and implements `pulp::WithSimd` for it so that `vectorized` compiles the
/// call (and the loops inlined into it) for the widest vector instructions this CPU has.
/// A closure would not do: it cannot be marked `#[inline(always)]`, and without that
/// its body stays a separate function compiled for the baseline instruction set.
macro_rules! vectorized_job {
    ($(#[$doc:meta])* $job:ident<$($lt:lifetime),*> ($args:ty) -> $out:ty = $f:path) => {
        $(#[$doc])*
        struct $job<$($lt),*>($args);

        impl<$($lt),*> pulp::WithSimd for $job<$($lt),*> {
            type Output = $out;

            #[inline(always)]
            fn with_simd<S: pulp::Simd>(self, _: S) -> $out {
                $f(self.0)
            }
        }
    };
}
pub(super) use vectorized_job;

/// Runs `job` compiled for the widest vector instructions of this CPU (AVX-512, AVX2
/// and FMA, or the baseline), chosen at run time.
pub(super) fn vectorized<J: pulp::WithSimd>(job: J) -> J::Output {
    pulp::Arch::new().dispatch(job)
}

vectorized_job!(
    /// `elementwise_run`, vectorised.
    ElementwiseRun<'a> ((&'a Op, &'a [&'a [f32]], usize, &'a mut [f32])) -> () = elementwise_run
);

/// Element-wise `f32` work of at least this many elements is split across idle compute
/// slots (about 256 KiB per array: below it, waking a helper costs more than it saves).
const PARALLEL_MIN_ELEMENTS: usize = 1 << 16;

/// Computes an element-wise `f32` binary operation or activation over contiguous
/// operands into contiguous `dest`, split into equal runs across the compute slots
/// idle now. `None` when the operation or the layouts do not allow it.
fn elementwise_f32_flat(op: &Op, operands: &[ValueRef<'_>], dest: &mut [f32], helpers: &HostPool) -> Option<()> {
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
fn elementwise_run((op, slices, start, out): (&Op, &[&[f32]], usize, &mut [f32])) {
    let end = start + out.len();
    match (op, slices) {
        (Op::Binary(b), [x, y]) => with_binary_f32!(*b, f => {
            for ((o, &x), &y) in out.iter_mut().zip(&x[start..end]).zip(&y[start..end]) {
                *o = f(x, y);
            }
        }),
        (Op::Activation(a), [x]) => with_activation!(*a, f => {
            for (o, &x) in out.iter_mut().zip(&x[start..end]) {
                *o = f(x);
            }
        }),
        (Op::RoundPrecision { format, saturate }, [x]) => with_rounding!(*format, *saturate, f => {
            for (o, &x) in out.iter_mut().zip(&x[start..end]) {
                *o = f(x);
            }
        }),
        _ => unvalidated("element-wise f32"),
    }
}

/// An element-wise `f32` operation computed into a new array, in parallel when large.
fn elementwise_f32(op: &Op, operands: &[ValueRef<'_>], out: &ArrayType, helpers: &HostPool) -> Option<Value> {
    let dims = to_usize(&out.dims);
    let n: usize = dims.iter().product();
    if n < 2 * PARALLEL_MIN_ELEMENTS {
        return None;
    }
    let mut data = vec![0.0f32; n];
    elementwise_f32_flat(op, operands, &mut data, helpers)?;
    Some(Value::F32(ArrayD::from_shape_vec(IxDyn(&dims), data).unwrap_or_else(|_| unvalidated("output"))))
}

fn write_f32(
    op: &Op,
    operands: &[ValueRef<'_>],
    out: &ArrayType,
    mut dest: ndarray::ArrayViewMutD<'_, f32>,
    helpers: &HostPool,
) -> Result<(), OutOfBounds> {
    if let Some(flat) = dest.as_slice_mut()
        && elementwise_f32_flat(op, operands, flat, helpers).is_some()
    {
        return Ok(());
    }
    match (op, operands) {
        (Op::MatMul(d), [ValueRef::F32(l), ValueRef::F32(r)]) => batched_matmul_into(l, r, d, dest, gemm_f32, helpers),
        (Op::Binary(b), [ValueRef::F32(x), ValueRef::F32(y)]) => {
            with_binary_f32!(*b, f => Zip::from(&mut dest).and(x).and(y).for_each(|o, &x, &y| *o = f(x, y)))
        }
        (Op::Activation(f), [ValueRef::F32(x)]) => {
            with_activation!(*f, f => Zip::from(&mut dest).and(x).for_each(|o, &x| *o = f(x)))
        }
        _ => match execute(op, operands, out, helpers)? {
            Value::F32(value) => dest.assign(&value),
            _ => unvalidated("output"),
        },
    }
    Ok(())
}

/// Operands that do not fit their operation: `Program::validate` rules this out, so
/// reaching it is a bug in validation. The host pool reports it as `NRT_FAILURE`.
pub(super) fn unvalidated(op: &str) -> ! {
    unreachable!("{op}: operands do not fit the operation; Program::validate should have rejected this program")
}

pub(super) fn to_usize(dims: &[u64]) -> Vec<usize> {
    dims.iter().map(|&d| d as usize).collect()
}

fn unary(op: UnaryOp, a: &ValueRef<'_>) -> Value {
    let dtype = a.dtype();
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

fn unary_int<T: Int>(op: UnaryOp) -> fn(T) -> T {
    match op {
        UnaryOp::Negate => T::neg,
        UnaryOp::Abs => T::abs,
        UnaryOp::Sign => T::signum,
        UnaryOp::Not => T::not,
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
pub(super) fn round_mantissa(x: f32, drop: u32) -> f32 {
    let bits = x.to_bits();
    let bias = (1u32 << (drop - 1)) - 1 + ((bits >> drop) & 1);
    f32::from_bits(bits.wrapping_add(bias) & !((1u32 << drop) - 1))
}

/// Rounds to a multiple of the spacing of `format` around `x` (exact in f64), for
/// formats without a bit-level shortcut.
fn round_by_quantum(x: f32, format: FloatFormat) -> f32 {
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
fn largest_finite(format: FloatFormat) -> f32 {
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
pub(super) fn sign_f32(x: f32) -> f32 {
    if x == 0.0 || x.is_nan() { x } else { x.signum() }
}

fn zip_map<T: Copy, U>(a: &ArrayViewD<'_, T>, b: &ArrayViewD<'_, T>, f: impl Fn(T, T) -> U) -> ArrayD<U> {
    Zip::from(a).and(b).map_collect(|&x, &y| f(x, y))
}

fn binary(op: BinaryOp, a: &ValueRef<'_>, b: &ValueRef<'_>) -> Value {
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

fn binary_int<T: Int>(op: BinaryOp) -> fn(T, T) -> T {
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

/// `e^x` in `f32`, less than 1 ulp from the exact value (Cephes' `expf` polynomial;
/// the test measures it), with no branches or library calls, so that loops over it vectorise.
/// XLA:CPU evaluates `exponential` with a polynomial of its own too, not libm's.
/// Overflow gives infinity, underflow gradual subnormals then zero, NaN stays NaN.
#[inline(always)]
pub(super) fn exp_f32(x: f32) -> f32 {
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

/// XLA's `maximum`: NaN in either operand gives NaN. Written as one comparison and a
/// choice, which vectorises (in a reduction too) better than `f32::max` plus NaN tests.
#[inline]
pub(super) fn max_f32(x: f32, y: f32) -> f32 {
    if x > y || x.is_nan() { x } else { y }
}

/// XLA's `minimum`: NaN in either operand gives NaN.
#[inline]
pub(super) fn min_f32(x: f32, y: f32) -> f32 {
    if x < y || x.is_nan() { x } else { y }
}

/// HLO `compare` of two elements: unordered (NaN) operands are only "not equal",
/// unless `total_order` orders them too.
#[inline]
pub(super) fn compare_scalars<T: Element>(direction: CompareDirection, total_order: bool, x: T, y: T) -> bool {
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

fn compare(direction: CompareDirection, total_order: bool, a: &ValueRef<'_>, b: &ValueRef<'_>) -> Value {
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

fn select<T: Copy>(p: &ArrayViewD<'_, bool>, a: &ArrayViewD<'_, T>, b: &ArrayViewD<'_, T>) -> ArrayD<T> {
    match p.ndim() {
        0 if p.iter().next().copied().unwrap_or(false) => a.to_owned(),
        0 => b.to_owned(),
        _ => Zip::from(p).and(a).and(b).map_collect(|&c, &x, &y| if c { x } else { y }),
    }
}

fn convert(a: &ValueRef<'_>, to: DType) -> Value {
    with_element!(a.dtype(), S => {
        let a = arr::<S>(a);
        with_element!(to, D => D::wrap(a.mapv(cast::<S, D>)))
    })
}

/// Operand dimension `i` becomes output dimension `map[i]`.
fn broadcast<T: Copy>(a: &ArrayViewD<'_, T>, map: &[u32], out_dims: &[usize]) -> ArrayD<T> {
    if a.len() == 1 {
        let value = *a.iter().next().unwrap_or_else(|| unvalidated("broadcast"));
        return ArrayD::from_elem(IxDyn(out_dims), value);
    }
    // Order the operand's axes by their target position, then insert unit axes for
    // the new dimensions, and let ndarray stretch the result.
    let mut order: Vec<usize> = (0..map.len()).collect();
    order.sort_by_key(|&i| map[i]);
    let view = a.view().permuted_axes(IxDyn(&order));
    let mut expanded_dims = vec![1usize; out_dims.len()];
    for (&i, axis_len) in order.iter().zip(view.shape()) {
        expanded_dims[map[i] as usize] = *axis_len;
    }
    let Ok(expanded) = view.to_shape(IxDyn(&expanded_dims)) else {
        unvalidated("broadcast");
    };
    match expanded.broadcast(IxDyn(out_dims)) {
        Some(b) => materialize(&b),
        None => unvalidated("broadcast"),
    }
}

fn reshape<T: Clone>(a: &ArrayViewD<'_, T>, dims: &[usize]) -> ArrayD<T> {
    match a.to_shape(IxDyn(dims)) {
        Ok(v) => v.into_owned(),
        Err(_) => unvalidated("reshape"),
    }
}

fn transpose<T: Copy>(a: &ArrayViewD<'_, T>, perm: &[u32]) -> ArrayD<T> {
    let perm: Vec<usize> = perm.iter().map(|&p| p as usize).collect();
    materialize(&a.view().permuted_axes(IxDyn(&perm)))
}

fn slice<T: Copy>(a: &ArrayViewD<'_, T>, start: &[u64], limit: &[u64], stride: &[u64]) -> ArrayD<T> {
    materialize(&a.slice_each_axis(|ax| {
        let i = ax.axis.index();
        Slice::new(start[i] as isize, Some(limit[i] as isize), stride[i] as isize)
    }))
}

/// A row-major copy of a view of any strides (a transposition, a broadcast, a strided
/// slice). ndarray's element iterator steps through the dynamic index one element at a
/// time; `Zip` walks the innermost axis as a plain strided loop.
fn materialize<T: Copy>(view: &ArrayViewD<'_, T>) -> ArrayD<T> {
    if view.is_standard_layout() {
        return view.to_owned();
    }
    let mut out = ArrayD::uninit(view.raw_dim());
    Zip::from(&mut out).and(view).for_each(|o, &x| {
        o.write(x);
    });
    // SAFETY: `Zip` visited every element of `out` (same shape as `view`) once.
    unsafe { out.assume_init() }
}

pub(super) fn concatenate(operands: &[ValueRef<'_>], dim: usize) -> Value {
    fn join<T: Element>(operands: &[ValueRef<'_>], dim: usize) -> ArrayD<T> {
        let parts: Vec<ArrayViewD<'_, T>> = operands.iter().map(|v| arr::<T>(v).view()).collect();
        ndarray::concatenate(Axis(dim), &parts).unwrap_or_else(|_| unvalidated("concatenate"))
    }
    let first = operands.first().unwrap_or_else(|| unvalidated("concatenate"));
    with_element!(first.dtype(), T => T::wrap(join::<T>(operands, dim)))
}

pub(super) fn reduce_f32(op: ReduceOp) -> fn(f32, f32) -> f32 {
    with_reduce_f32!(op, f => f)
}

pub(super) fn reduce_int<T: Int>(op: ReduceOp) -> fn(T, T) -> T {
    match op {
        ReduceOp::Add => T::add,
        ReduceOp::Multiply => T::mul,
        ReduceOp::Maximum => Ord::max,
        ReduceOp::Minimum => Ord::min,
    }
}

pub(super) fn reduce_pred(op: ReduceOp) -> fn(bool, bool) -> bool {
    match op {
        ReduceOp::Minimum | ReduceOp::Multiply => |x, y| x && y,
        ReduceOp::Maximum | ReduceOp::Add => |x, y| x || y,
    }
}

fn reduce(op: ReduceOp, operand: &ValueRef<'_>, init: &ValueRef<'_>, axes: &[u32]) -> Value {
    let dtype = operand.dtype();
    match dtype.class() {
        // Narrow floats accumulate in f32 and round once at the end.
        DTypeClass::Float => with_reduce_f32!(op, f => {
            if let (ValueRef::F32(a), ValueRef::F32(init)) = (operand, init) {
                return Value::F32(reduce_array(a, first(init), axes, f));
            }
            with_float!(dtype, T => {
                let widened = arr::<T>(operand).mapv(T::to_f32);
                let out = reduce_array(&widened.view(), first(arr::<T>(init)).to_f32(), axes, f);
                T::wrap(out.mapv(T::from_f32))
            }, unvalidated("reduce"))
        }),
        DTypeClass::Signed | DTypeClass::Unsigned => with_int!(dtype, T => {
            T::wrap(reduce_array(arr::<T>(operand), first(arr::<T>(init)), axes, reduce_int::<T>(op)))
        }, unvalidated("reduce")),
        DTypeClass::Pred => {
            Value::Pred(reduce_array(arr::<bool>(operand), first(arr::<bool>(init)), axes, reduce_pred(op)))
        }
    }
}

pub(super) fn first<T: Copy + Default>(a: &ArrayViewD<'_, T>) -> T {
    a.iter().next().copied().unwrap_or_default()
}

/// Folds the `axes` of `a` into `init` with `f`, keeping the other axes in order.
/// `f` is associative and commutative (XLA requires it of reductions), so the fold
/// may run in any order: trailing axes fold in eight interleaved lanes, leading axes
/// row by row, both of which the compiler vectorises. Float sums may therefore round
/// differently from a strictly sequential sum, as in XLA.
fn reduce_array<T: Copy>(a: &ArrayViewD<'_, T>, init: T, axes: &[u32], f: impl Fn(T, T) -> T + Copy) -> ArrayD<T> {
    reduce_array_with(a, init, axes, f, true)
}

/// `reduce_array` with one accumulator per output element, in index order: a
/// reduction whose partial results are rounded must not get the extra precision of
/// eight partial sums.
fn reduce_array_sequential<T: Copy>(
    a: &ArrayViewD<'_, T>,
    init: T,
    axes: &[u32],
    f: impl Fn(T, T) -> T + Copy,
) -> ArrayD<T> {
    reduce_array_with(a, init, axes, f, false)
}

fn reduce_array_with<T: Copy, F: Fn(T, T) -> T + Copy>(
    a: &ArrayViewD<'_, T>,
    init: T,
    axes: &[u32],
    f: F,
    lanes: bool,
) -> ArrayD<T> {
    let rank = a.ndim();
    let is_reduced = |d: usize| axes.contains(&(d as u32));
    let kept: Vec<usize> = (0..rank).filter(|&d| !is_reduced(d)).collect();
    let kept_dims: Vec<usize> = kept.iter().map(|&d| a.shape()[d]).collect();
    let outer: usize = kept_dims.iter().product();
    let inner: usize = (0..rank).filter(|&d| is_reduced(d)).map(|d| a.shape()[d]).product();
    let out =
        |values: Vec<T>| ArrayD::from_shape_vec(IxDyn(&kept_dims), values).unwrap_or_else(|_| unvalidated("reduce"));
    if outer == 0 || inner == 0 {
        return out(vec![init; outer]);
    }
    let trailing = kept.iter().enumerate().all(|(i, &d)| i == d);
    let leading = kept.iter().enumerate().all(|(i, &d)| d == rank - kept.len() + i);
    if trailing || leading {
        let standard = a.as_standard_layout();
        let flat = standard.as_slice().unwrap_or_else(|| unvalidated("reduce"));
        if trailing {
            return out(vectorized(FoldRows((flat, inner, init, f, lanes))));
        }
        let mut acc = vec![init; outer];
        for row in flat.chunks_exact(outer) {
            acc.iter_mut().zip(row).for_each(|(acc, &x)| *acc = f(*acc, x));
        }
        return out(acc);
    }
    let reduced: Vec<usize> = (0..rank).filter(|&d| is_reduced(d)).collect();
    let perm: Vec<usize> = kept.iter().chain(&reduced).copied().collect();
    let rows = a.view().permuted_axes(IxDyn(&perm));
    let rows = rows.as_standard_layout();
    let flat = rows.as_slice().unwrap_or_else(|| unvalidated("reduce"));
    out(vectorized(FoldRows((flat, inner, init, f, lanes))))
}

/// Folds each run of `inner` elements of `flat` into `init`: in eight interleaved
/// lanes (`fold_lanes`), or strictly in order.
struct FoldRows<'a, T, F>((&'a [T], usize, T, F, bool));

impl<T: Copy, F: Fn(T, T) -> T + Copy> pulp::WithSimd for FoldRows<'_, T, F> {
    type Output = Vec<T>;

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) -> Vec<T> {
        // Plain loops: a closure around `fold_lanes` would stay an uninlined call.
        let (flat, inner, init, f, lanes) = self.0;
        let mut folded = Vec::with_capacity(flat.len() / inner);
        for row in flat.chunks_exact(inner) {
            folded.push(if lanes { fold_lanes(row, init, f) } else { row.iter().fold(init, |acc, &x| f(acc, x)) });
        }
        folded
    }
}

/// Folds `row` into `init` with eight independent accumulators, combined at the end.
#[inline(always)]
fn fold_lanes<T: Copy, F: Fn(T, T) -> T>(row: &[T], init: T, f: F) -> T {
    const LANES: usize = 8;
    if row.len() < 2 * LANES {
        return row.iter().fold(init, |acc, &x| f(acc, x));
    }
    let (head, rest) = row.split_at(LANES);
    let mut lanes: [T; LANES] = head.try_into().unwrap_or_else(|_| unvalidated("reduce"));
    let mut chunks = rest.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane = f(*lane, x);
        }
    }
    let folded = lanes.iter().fold(init, |acc, &x| f(acc, x));
    chunks.remainder().iter().fold(folded, |acc, &x| f(acc, x))
}

/// `dot` with general dimension numbers, as batched matrix products. Floats multiply
/// in f32 with f32 accumulation and round once to the output type; integers are
/// converted to the output type first and wrap.
fn matmul(lhs: &ValueRef<'_>, rhs: &ValueRef<'_>, d: &DotDims, out: &ArrayType, helpers: &HostPool) -> Value {
    let dims = to_usize(&out.dims);
    match lhs.dtype().class() {
        DTypeClass::Float => {
            if let (ValueRef::F32(l), ValueRef::F32(r), DType::F32) = (lhs, rhs, out.dtype) {
                return Value::F32(batched_matmul(l, r, d, &dims, gemm_f32, helpers));
            }
            let (l, r) = (converted::<f32>(lhs), converted::<f32>(rhs));
            let product = batched_matmul(&l.view(), &r.view(), d, &dims, gemm_f32, helpers);
            with_float!(out.dtype, D => D::wrap(product.mapv(D::from_f32)), unvalidated("dot"))
        }
        DTypeClass::Signed | DTypeClass::Unsigned => with_int!(out.dtype, D => {
            let (l, r) = (converted::<D>(lhs), converted::<D>(rhs));
            D::wrap(batched_matmul(&l.view(), &r.view(), d, &dims, gemm_int::<D>, helpers))
        }, unvalidated("dot")),
        DTypeClass::Pred => unvalidated("dot on pred"),
    }
}

/// A copy of `v` converted to `D`.
fn converted<D: Element>(v: &ValueRef<'_>) -> ArrayD<D> {
    with_element!(v.dtype(), S => arr::<S>(v).mapv(cast::<S, D>))
}

/// A matrix product `c = a · b` on strided 2-D views; every element of `c` is written.
type Gemm<T> = fn(ndarray::ArrayView2<'_, T>, ndarray::ArrayView2<'_, T>, ndarray::ArrayViewMut2<'_, T>);

fn batched_matmul<T: Copy + Default + Send + Sync>(
    lhs: &ArrayViewD<'_, T>,
    rhs: &ArrayViewD<'_, T>,
    d: &DotDims,
    out_dims: &[usize],
    gemm: Gemm<T>,
    helpers: &HostPool,
) -> ArrayD<T> {
    let mut out = ArrayD::from_elem(IxDyn(out_dims), T::default());
    batched_matmul_into(lhs, rhs, d, out.view_mut(), gemm, helpers);
    out
}

/// Products smaller than this many multiply-adds run on the calling thread alone:
/// waking a helper thread costs tens of microseconds.
const PARALLEL_MIN_MACS: usize = 1 << 22;

/// One matrix product of a batch, or a block of columns or rows of one.
type GemmJob<'a, T> = (ndarray::ArrayView2<'a, T>, ndarray::ArrayView2<'a, T>, ndarray::ArrayViewMut2<'a, T>);

/// `dot` with general dimension numbers into `out` (the result's shape, row-major),
/// as one matrix product per batch element. Every element of `out` is written. A large
/// product is split across the host compute slots that are idle at that moment.
fn batched_matmul_into<T: Copy + Default + Send + Sync>(
    lhs: &ArrayViewD<'_, T>,
    rhs: &ArrayViewD<'_, T>,
    d: &DotDims,
    out: ndarray::ArrayViewMutD<'_, T>,
    gemm: Gemm<T>,
    helpers: &HostPool,
) {
    let (Ok(l), Ok(r)) =
        (arrange(lhs, &d.lhs_batch, &d.lhs_contracting, true), arrange(rhs, &d.rhs_batch, &d.rhs_contracting, false))
    else {
        unvalidated("dot")
    };
    let (batch, m, k) = l.dim();
    let n = r.dim().2;
    let mut out = out.into_shape_with_order((batch, m, n)).unwrap_or_else(|_| unvalidated("dot"));
    let macs = batch.saturating_mul(m).saturating_mul(n).saturating_mul(k);
    let wanted = if macs >= PARALLEL_MIN_MACS { (macs / PARALLEL_MIN_MACS).min(batch.max(m).max(n)) - 1 } else { 0 };
    let lent = helpers.lend(wanted);
    let threads = lent.threads();
    let mut jobs: Vec<GemmJob<'_, T>> = Vec::with_capacity(batch);
    for (i, c) in out.outer_iter_mut().enumerate() {
        jobs.push((l.index_axis(Axis(0), i), r.index_axis(Axis(0), i), c));
    }
    if threads == 1 {
        return jobs.into_iter().for_each(|(a, b, c)| gemm(a, b, c));
    }
    // Fewer products than threads: cut each into blocks of its wider side.
    if jobs.len() < threads {
        let pieces = threads.div_ceil(jobs.len());
        jobs = jobs.into_iter().flat_map(|job| split_gemm(job, pieces)).collect();
    }
    let per_part = jobs.len().div_ceil(threads);
    let mut parts: Vec<Vec<GemmJob<'_, T>>> = Vec::with_capacity(threads);
    let mut jobs = jobs.into_iter().peekable();
    while jobs.peek().is_some() {
        parts.push(jobs.by_ref().take(per_part).collect());
    }
    lent.run(parts, |part| part.into_iter().for_each(|(a, b, c)| gemm(a, b, c)));
}

/// Cuts a product into up to `pieces` products over blocks of columns (or of rows,
/// when there are more rows than columns).
fn split_gemm<T>((mut a, mut b, mut c): GemmJob<'_, T>, pieces: usize) -> Vec<GemmJob<'_, T>> {
    let (m, n) = c.dim();
    let (axis, len) = if n >= m { (Axis(1), n) } else { (Axis(0), m) };
    let block = len.div_ceil(pieces).max(1);
    let mut blocks = Vec::with_capacity(pieces);
    while c.len_of(axis) > block {
        let (c_head, c_rest) = c.split_at(axis, block);
        c = c_rest;
        if axis == Axis(1) {
            let (b_head, b_rest) = b.split_at(axis, block);
            b = b_rest;
            blocks.push((a, b_head, c_head));
        } else {
            let (a_head, a_rest) = a.split_at(axis, block);
            a = a_rest;
            blocks.push((a_head, b, c_head));
        }
    }
    blocks.push((a, b, c));
    blocks
}

/// Arranges an operand as `[batch, free, contracting]` (or `[batch, contracting, free]`),
/// flattening each group of axes into one.
fn arrange<'a, T: Copy>(
    a: &'a ArrayViewD<'_, T>,
    batch: &[u32],
    contracting: &[u32],
    contracting_last: bool,
) -> Result<ndarray::CowArray<'a, T, ndarray::Ix3>, ndarray::ShapeError> {
    let free: Vec<usize> =
        (0..a.ndim()).filter(|i| !batch.contains(&(*i as u32)) && !contracting.contains(&(*i as u32))).collect();
    let batch: Vec<usize> = batch.iter().map(|&i| i as usize).collect();
    let contracting: Vec<usize> = contracting.iter().map(|&i| i as usize).collect();
    let size = |axes: &[usize]| axes.iter().map(|&i| a.shape()[i]).product::<usize>();
    let (b, f, c) = (size(&batch), size(&free), size(&contracting));
    let mut perm = batch.clone();
    if contracting_last {
        perm.extend(&free);
        perm.extend(&contracting);
    } else {
        perm.extend(&contracting);
        perm.extend(&free);
    }
    let view = a.view().permuted_axes(IxDyn(&perm));
    // With at most one axis per group, a strided view serves whatever the layout (the
    // GEMM takes any strides): add unit axes for the empty groups.
    if batch.len() <= 1 && free.len() <= 1 && contracting.len() <= 1 {
        let groups = if contracting_last {
            [batch.len(), free.len(), contracting.len()]
        } else {
            [batch.len(), contracting.len(), free.len()]
        };
        let mut strided = view.clone();
        for (position, &axes) in groups.iter().enumerate() {
            if axes == 0 {
                strided = strided.insert_axis(Axis(position));
            }
        }
        if let Ok(strided) = strided.into_dimensionality::<ndarray::Ix3>() {
            return Ok(ndarray::CowArray::from(strided));
        }
    }
    let shape = if contracting_last { (b, f, c) } else { (b, c, f) };
    // A view when the axes already line up; a copy otherwise.
    match view.clone().into_shape_with_order(shape) {
        Ok(v) => Ok(ndarray::CowArray::from(v)),
        Err(_) => view.to_shape(shape).map(|v| ndarray::CowArray::from(v.into_owned())),
    }
}

/// Single-precision matrix product through the `gemm` crate (its best kernel for the
/// host CPU, on the calling thread).
fn gemm_f32(a: ndarray::ArrayView2<'_, f32>, b: ndarray::ArrayView2<'_, f32>, mut c: ndarray::ArrayViewMut2<'_, f32>) {
    let (m, k) = a.dim();
    let n = b.dim().1;
    if b.dim().0 != k || c.dim() != (m, n) {
        unvalidated("dot");
    }
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        c.fill(0.0);
        return;
    }
    let (rsa, csa) = (a.strides()[0], a.strides()[1]);
    let (rsb, csb) = (b.strides()[0], b.strides()[1]);
    let (rsc, csc) = (c.strides()[0], c.strides()[1]);
    // SAFETY: the pointers (to each view's first element) and strides describe the
    // three views exactly (their dimensions were checked above), `c` is borrowed
    // mutably and does not alias `a` or `b`, and gemm reads and writes only within
    // those bounds. With `read_dst` false, `c` is only written: c = 1.0 * a * b.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            csc,
            rsc,
            false,
            a.as_ptr(),
            csa,
            rsa,
            b.as_ptr(),
            csb,
            rsb,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// Integer matrix product, wrapping.
fn gemm_int<T: Int>(
    a: ndarray::ArrayView2<'_, T>,
    b: ndarray::ArrayView2<'_, T>,
    mut c: ndarray::ArrayViewMut2<'_, T>,
) {
    let (m, k) = a.dim();
    let n = b.dim().1;
    for i in 0..m {
        for j in 0..n {
            let mut acc = T::ZERO;
            for p in 0..k {
                acc = acc.add(a[[i, p]].mul(b[[p, j]]));
            }
            c[[i, j]] = acc;
        }
    }
}

fn clamp(lo: &ValueRef<'_>, x: &ValueRef<'_>, hi: &ValueRef<'_>) -> Value {
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

fn reverse<T: Clone>(a: &ArrayViewD<'_, T>, axes: &[u32]) -> ArrayD<T> {
    let mut view = a.view();
    for &axis in axes {
        view.invert_axis(Axis(axis as usize));
    }
    view.as_standard_layout().into_owned()
}

/// XLA `pad`: operand element `i` of an axis lands at `low + i * (interior + 1)`; those
/// that land outside the output (negative padding) are cropped.
fn pad<T: Clone>(a: &ArrayViewD<'_, T>, value: T, low: &[i64], interior: &[u64], out_dims: &[usize]) -> ArrayD<T> {
    let mut out = ArrayD::from_elem(IxDyn(out_dims), value);
    let mut source = Vec::with_capacity(a.ndim());
    let mut target = Vec::with_capacity(a.ndim());
    for (d, &n) in a.shape().iter().enumerate() {
        let (low, step, size) = (low[d], interior[d] as i64 + 1, out_dims[d] as i64);
        // The operand elements whose position falls in [0, size).
        let first = if low >= 0 { 0 } else { (-low + step - 1) / step };
        let last = (size - 1 - low).div_euclid(step).min(n as i64 - 1);
        if n == 0 || first > last {
            return out;
        }
        source.push(Slice::from(first as isize..=last as isize));
        target.push(Slice::new((low + first * step) as isize, Some((low + last * step + 1) as isize), step as isize));
    }
    out.slice_each_axis_mut(|ax| target[ax.axis.index()]).assign(&a.slice_each_axis(|ax| source[ax.axis.index()]));
    out
}

/// An integer scalar as an index: signed values as they are, unsigned ones capped at
/// `i64::MAX`.
fn index_value<T: Element>(x: T) -> i64 {
    match T::DTYPE.class() {
        DTypeClass::Unsigned => x.to_u64().min(i64::MAX as u64) as i64,
        _ => x.to_i64(),
    }
}

/// Dynamic-slice start indices, clamped so that a window of `sizes` fits in `dims`.
fn clamped_starts(indices: &[ValueRef<'_>], dims: &[usize], sizes: &[usize]) -> Vec<usize> {
    indices
        .iter()
        .zip(dims.iter().zip(sizes))
        .map(|(v, (&dim, &size))| {
            let i = with_int!(v.dtype(), T => index_value(first(arr::<T>(v))), unvalidated("start index"));
            i.clamp(0, dim.saturating_sub(size) as i64) as usize
        })
        .collect()
}

fn window(start: &[usize], sizes: &[usize], axis: usize) -> Slice {
    Slice::from(start[axis]..start[axis] + sizes[axis])
}

/// Gather and scatter indices: one index vector per position of the batch shape.
struct IndexRows {
    batch_shape: Vec<usize>,
    vector: usize,
    values: Vec<i64>,
}

impl IndexRows {
    fn new(indices: &ValueRef<'_>, index_vector_dim: u32) -> IndexRows {
        fn rows<T: Element>(a: &ArrayViewD<'_, T>, ivd: usize) -> IndexRows {
            let mut view = a.view();
            if ivd == view.ndim() {
                view = view.insert_axis(Axis(ivd));
            }
            let mut order: Vec<usize> = (0..view.ndim()).filter(|&d| d != ivd).collect();
            order.push(ivd);
            let batch_shape: Vec<usize> = order[..order.len() - 1].iter().map(|&d| view.shape()[d]).collect();
            let vector = view.shape()[ivd];
            let values = view.permuted_axes(IxDyn(&order)).iter().map(|&x| index_value(x)).collect();
            IndexRows { batch_shape, vector, values }
        }
        let ivd = index_vector_dim as usize;
        with_int!(indices.dtype(), T => rows(arr::<T>(indices), ivd), unvalidated("indices"))
    }

    fn row(&self, r: usize) -> &[i64] {
        &self.values[r * self.vector..(r + 1) * self.vector]
    }
}

/// The position of indices dimension `dim` in the batch shape (the index vector
/// dimension taken out).
fn batch_position(dim: u32, index_vector_dim: u32) -> usize {
    (if dim > index_vector_dim { dim - 1 } else { dim }) as usize
}

/// Full start coordinates of one gather or scatter window, checked to fit in `dims`.
fn window_start(
    row: &[i64],
    batch: &[usize],
    to_operand: &[u32],
    batching: (&[u32], &[u32], u32),
    sizes: &[usize],
    dims: &[usize],
    what: &str,
) -> Result<Vec<usize>, OutOfBounds> {
    let mut start = vec![0i64; dims.len()];
    for (&d, &i) in to_operand.iter().zip(row) {
        start[d as usize] = i;
    }
    let (operand_batching, indices_batching, ivd) = batching;
    for (&d, &i) in operand_batching.iter().zip(indices_batching) {
        start[d as usize] = batch[batch_position(i, ivd)] as i64;
    }
    let fits = start
        .iter()
        .zip(sizes.iter().zip(dims))
        .all(|(&s, (&size, &dim))| s >= 0 && s as u64 + size as u64 <= dim as u64);
    if fits {
        Ok(start.into_iter().map(|s| s as usize).collect())
    } else {
        Err(OutOfBounds(format!(
            "{what} index {row:?} at batch position {batch:?} puts a window of {sizes:?} at {start:?}, outside an array of {dims:?}"
        )))
    }
}

fn gather<T: Copy + Default>(
    a: &ArrayViewD<'_, T>,
    indices: &IndexRows,
    g: &GatherDims,
    out_dims: &[usize],
) -> Result<ArrayD<T>, OutOfBounds> {
    let mut out = ArrayD::from_elem(IxDyn(out_dims), T::default());
    let sizes = to_usize(&g.slice_sizes);
    let mut dropped: Vec<usize> =
        g.collapsed_slice_dims.iter().chain(&g.operand_batching_dims).map(|&d| d as usize).collect();
    dropped.sort_unstable();
    let batch_dims: Vec<usize> = (0..out_dims.len()).filter(|d| !g.offset_dims.contains(&(*d as u32))).collect();
    let batching = (g.operand_batching_dims.as_slice(), g.start_indices_batching_dims.as_slice(), g.index_vector_dim);
    for (r, batch) in ndarray::indices(IxDyn(&indices.batch_shape)).into_iter().enumerate() {
        let batch = batch.slice();
        let start = window_start(indices.row(r), batch, &g.start_index_map, batching, &sizes, a.shape(), "gather")?;
        let mut slice = a.slice_each_axis(|ax| window(&start, &sizes, ax.axis.index()));
        for &d in dropped.iter().rev() {
            slice = slice.index_axis_move(Axis(d), 0);
        }
        let mut target = out.view_mut();
        for (&d, &i) in batch_dims.iter().zip(batch).rev() {
            target = target.index_axis_move(Axis(d), i);
        }
        target.assign(&slice);
    }
    Ok(out)
}

fn scatter<T: Copy>(
    a: &ArrayViewD<'_, T>,
    indices: &IndexRows,
    updates: &ArrayViewD<'_, T>,
    s: &ScatterDims,
    combine: impl Fn(T, T) -> T,
) -> Result<ArrayD<T>, OutOfBounds> {
    let mut out = a.to_owned();
    let mut dropped: Vec<usize> =
        s.inserted_window_dims.iter().chain(&s.input_batching_dims).map(|&d| d as usize).collect();
    dropped.sort_unstable();
    let mut window_sizes = s.update_window_dims.iter().map(|&d| updates.shape()[d as usize]);
    let sizes: Vec<usize> =
        (0..a.ndim()).map(|d| if dropped.contains(&d) { 1 } else { window_sizes.next().unwrap_or(1) }).collect();
    let batch_dims: Vec<usize> = (0..updates.ndim()).filter(|d| !s.update_window_dims.contains(&(*d as u32))).collect();
    let batching = (s.input_batching_dims.as_slice(), s.scatter_indices_batching_dims.as_slice(), s.index_vector_dim);
    for (r, batch) in ndarray::indices(IxDyn(&indices.batch_shape)).into_iter().enumerate() {
        let batch = batch.slice();
        let start = window_start(
            indices.row(r),
            batch,
            &s.scatter_dims_to_operand_dims,
            batching,
            &sizes,
            a.shape(),
            "scatter",
        )?;
        let mut target = out.slice_each_axis_mut(|ax| window(&start, &sizes, ax.axis.index()));
        for &d in dropped.iter().rev() {
            target = target.index_axis_move(Axis(d), 0);
        }
        let mut update = updates.view();
        for (&d, &i) in batch_dims.iter().zip(batch).rev() {
            update = update.index_axis_move(Axis(d), i);
        }
        Zip::from(&mut target).and(&update).for_each(|o, &u| *o = combine(*o, u));
    }
    Ok(out)
}

fn scatter_value(
    a: &ValueRef<'_>,
    indices: &ValueRef<'_>,
    updates: &ValueRef<'_>,
    s: &ScatterDims,
    combine: ScatterCombine,
) -> Result<Value, OutOfBounds> {
    let indices = IndexRows::new(indices, s.index_vector_dim);
    let dtype = a.dtype();
    Ok(match (combine, dtype.class()) {
        (ScatterCombine::Replace, _) => each_type!(a, a => scatter(a, &indices, arr(updates), s, |_, u| u)?),
        (ScatterCombine::Reduce(op), DTypeClass::Float) => {
            let f = reduce_f32(op);
            with_float!(dtype, T => T::wrap(scatter(arr::<T>(a), &indices, arr::<T>(updates), s,
                |x, u| T::from_f32(f(x.to_f32(), u.to_f32())))?), unvalidated("scatter"))
        }
        (ScatterCombine::Reduce(op), DTypeClass::Signed | DTypeClass::Unsigned) => {
            with_int!(dtype, T => T::wrap(scatter(arr::<T>(a), &indices, arr::<T>(updates), s, reduce_int::<T>(op))?),
                unvalidated("scatter"))
        }
        (ScatterCombine::Reduce(op), DTypeClass::Pred) => {
            Value::Pred(scatter(arr::<bool>(a), &indices, arr::<bool>(updates), s, reduce_pred(op))?)
        }
    })
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
    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n as u32).map(|i| ((i.wrapping_mul(2_654_435_761) ^ seed) % 2001) as f32 / 1000.0 - 1.0).collect()
    }

    fn reference(l: &ndarray::Array3<f32>, r: &ndarray::Array3<f32>) -> ndarray::Array3<f64> {
        let (b, m, k) = l.dim();
        let n = r.dim().2;
        ndarray::Array3::from_shape_fn((b, m, n), |(i, row, col)| {
            (0..k).map(|p| l[[i, row, p]] as f64 * r[[i, p, col]] as f64).sum()
        })
    }

    /// Products large enough to be split run on lent slots, cut by columns, by rows or
    /// by batch element, and give the product a single thread gives.
    #[test]
    fn large_element_wise_operations_split_across_slots_give_the_serial_result() {
        // Odd sizes so that the last run is short; both above the parallel threshold.
        for n in [2 * PARALLEL_MIN_ELEMENTS + 13, 5 * PARALLEL_MIN_ELEMENTS + 1] {
            let x = ArrayD::from_shape_vec(IxDyn(&[n]), values(n, 3)).expect("shape");
            let y = ArrayD::from_shape_vec(IxDyn(&[n]), values(n, 5)).expect("shape");
            let ty = ArrayType::new(DType::F32, vec![n as u64]);
            let ops = [
                (Op::Binary(BinaryOp::Divide), x.mapv(f32::abs) / y.mapv(|v| v + 2.0)),
                (Op::Activation(ActivationFn::Exp), x.mapv(exp_f32)),
                (
                    Op::RoundPrecision { format: FloatFormat::Bf16, saturate: false },
                    x.mapv(|v| round_to_format(v, FloatFormat::Bf16, false)),
                ),
            ];
            for (op, expected) in ops {
                let (a, b) = (x.mapv(f32::abs), y.mapv(|v| v + 2.0));
                let operands: Vec<ValueRef<'_>> = match op {
                    Op::Binary(_) => vec![ValueRef::F32(a.view()), ValueRef::F32(b.view())],
                    _ => vec![ValueRef::F32(x.view())],
                };
                for slots in [1, 2, 3] {
                    let pool = HostPool::new(slots);
                    let got = execute(&op, &operands, &ty, &pool).expect("element-wise");
                    assert_eq!(got, Value::F32(expected.clone()), "{op:?} of {n} on {slots} slot(s)");
                    let mut dest = vec![0.0f32; n];
                    let view = execute_into(&op, &operands, &ty, Destination(&mut dest), &pool).expect("into");
                    assert_eq!(view.to_owned(), Value::F32(expected.clone()), "{op:?} into an output");
                }
            }
        }
    }

    #[test]
    fn split_matrix_products_match_the_reference() {
        let dims =
            DotDims { lhs_batch: vec![0], lhs_contracting: vec![2], rhs_batch: vec![0], rhs_contracting: vec![1] };
        for (b, m, k, n) in [(1, 8, 600, 1024), (1, 1024, 600, 8), (3, 64, 300, 256), (1, 3, 4, 5)] {
            let l = ndarray::Array3::from_shape_vec((b, m, k), values(b * m * k, 7)).expect("shape");
            let r = ndarray::Array3::from_shape_vec((b, k, n), values(b * k * n, 11)).expect("shape");
            let expected = reference(&l, &r);
            for slots in [1, 2, 3] {
                let pool = HostPool::new(slots);
                let out =
                    batched_matmul(&l.view().into_dyn(), &r.view().into_dyn(), &dims, &[b, m, n], gemm_f32, &pool);
                let worst = out.iter().zip(&expected).map(|(&x, &y)| (x as f64 - y).abs()).fold(0.0, f64::max);
                assert!(worst < 1e-3, "{b}x{m}x{k}x{n} on {slots} slot(s): off by {worst}");
            }
        }
    }

    #[test]
    fn rounding_to_narrow_formats_matches_their_conversions() {
        let samples: Vec<f32> = values(4000, 5)
            .into_iter()
            .enumerate()
            .map(|(i, x)| x * 2f32.powi(i as i32 % 60 - 30))
            .chain([0.0, -0.0, 1.0, 65504.0, 65520.0, 3.0e38, f32::MAX, f32::INFINITY, f32::NEG_INFINITY, 1e-40, 448.0])
            .collect();
        for &x in &samples {
            let bf16 = half::bf16::from_f32(x).to_f32();
            assert_eq!(round_to_format(x, FloatFormat::Bf16, false).to_bits(), bf16.to_bits(), "bf16 of {x:e}");
            let general = round_to_format(x, FloatFormat::Bits { exponent: 8, mantissa: 7 }, false);
            assert_eq!(general.to_bits(), bf16.to_bits(), "e8m7 of {x:e}");
            let fp16 = half::f16::from_f32(x).to_f32();
            let e5m10 = round_to_format(x, FloatFormat::Bits { exponent: 5, mantissa: 10 }, false);
            assert_eq!(e5m10.to_bits(), fp16.to_bits(), "e5m10 of {x:e}");
            assert_eq!(round_to_format(x, FloatFormat::Fp16, false).to_bits(), fp16.to_bits(), "fp16 of {x:e}");
            let tf32 = round_to_format(x, FloatFormat::Tf32, false);
            let e8m10 = round_to_format(x, FloatFormat::Bits { exponent: 8, mantissa: 10 }, false);
            assert_eq!(tf32.to_bits(), e8m10.to_bits(), "tf32 of {x:e}");
        }
        assert!(round_to_format(f32::NAN, FloatFormat::Bf16, true).is_nan());
        assert_eq!(round_to_format(3.4e38, FloatFormat::Bf16, false), f32::INFINITY);
        assert_eq!(round_to_format(-1e6, FloatFormat::Fp16, true), -65504.0);
        assert_eq!(round_to_format(f32::INFINITY, FloatFormat::Bf16, true), half::bf16::MAX.to_f32());
        // FP8 E4M3: 3 mantissa bits, subnormals down to 2^-9, 448 the largest finite value.
        assert_eq!(round_to_format(1.0625, FloatFormat::Fp8E4m3, false), 1.0, "tie to even");
        assert_eq!(round_to_format(1.1875, FloatFormat::Fp8E4m3, false), 1.25);
        assert_eq!(round_to_format(300.0, FloatFormat::Fp8E4m3, false), 288.0);
        assert_eq!(round_to_format(440.0, FloatFormat::Fp8E4m3, false), 448.0);
        assert_eq!(
            round_to_format(2f32.powi(-10), FloatFormat::Fp8E4m3, false),
            0.0,
            "half the smallest subnormal ties to 0"
        );
        assert_eq!(round_to_format(3.0 * 2f32.powi(-10), FloatFormat::Fp8E4m3, false), 2f32.powi(-8));
        assert!(round_to_format(500.0, FloatFormat::Fp8E4m3, false).is_nan());
        assert_eq!(round_to_format(-500.0, FloatFormat::Fp8E4m3, true), -448.0);
        assert!(round_to_format(f32::INFINITY, FloatFormat::Fp8E4m3, false).is_nan());
    }

    #[test]
    fn reductions_over_leading_trailing_and_mixed_axes_match_a_sequential_fold() {
        let a = ndarray::Array3::from_shape_vec((5, 7, 33), values(5 * 7 * 33, 3)).expect("shape").into_dyn();
        for axes in [vec![2], vec![1, 2], vec![0], vec![0, 1], vec![1], vec![0, 2], vec![0, 1, 2], vec![]] {
            let got = reduce_array(&a.view(), 0.5f32, &axes, |x, y| x + y);
            let mut expected = a.mapv(|x| x as f64);
            for &axis in axes.iter().rev() {
                expected = expected.sum_axis(Axis(axis as usize));
            }
            assert_eq!(got.shape(), expected.shape(), "axes {axes:?}");
            for (g, e) in got.iter().zip(&expected) {
                assert!((*g as f64 - (e + 0.5)).abs() < 1e-4, "axes {axes:?}: {g} vs {}", e + 0.5);
            }
            let max = reduce_array(&a.view(), f32::NEG_INFINITY, &axes, max_f32);
            let mut expected_max = a.clone();
            for &axis in axes.iter().rev() {
                expected_max = expected_max
                    .map_axis(Axis(axis as usize), |lane| lane.iter().copied().fold(f32::NEG_INFINITY, max_f32));
            }
            assert_eq!(max, expected_max, "max over axes {axes:?} is exact");
        }
    }
}
