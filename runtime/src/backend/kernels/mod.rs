//! The numeric kernels: one function per engine operation, on host arrays.
//!
//! Kernels trust the shapes they are given: [`crate::isa::Program::validate`] has
//! already proven that every operand fits its operation, and a kernel that finds
//! otherwise panics (see `unvalidated`) rather than compute something plausible. Semantics follow XLA's
//! (NaN-propagating `maximum`/`minimum`, integer division by zero gives -1, wrapping
//! integer arithmetic, saturating float-to-int conversion).

// Optimised builds only (see `matrix::product_kernel`); their unit tests run in every build.
#[cfg(all(target_arch = "x86_64", any(test, not(debug_assertions))))]
mod amx;
#[cfg(all(target_arch = "x86_64", any(test, not(debug_assertions))))]
mod bf16;
mod convolution;
mod elementwise;
mod flat;
mod gather;
mod layout;
mod matrix;
#[cfg(all(target_arch = "x86_64", any(test, not(debug_assertions))))]
mod packed;
mod picking;
mod random;
mod reduce;
mod region;
#[cfg(all(target_arch = "x86_64", any(test, not(debug_assertions))))]
mod rounded_f32;
mod select;
mod sort;
mod transcendental;
mod window;

use ndarray::{ArrayD, ArrayViewD, IxDyn, Zip};

use super::element::{Element, with_element, with_float};
use super::{Destination, OutOfBounds, Value, ValueRef};
use crate::dtype::{ArrayType, DType};
use crate::isa::{ActivationFn, BinaryOp, FloatFormat, Op, ReduceOp};
use crate::pool::HostPool;
use elementwise::{binary, clamp, compare, convert, elementwise_f32, elementwise_f32_flat, select, unary};
pub(crate) use elementwise::{compare_scalars, max_f32, min_f32, round_mantissa, round_to_format, sign_f32};
pub(super) use flat::{Flat, FlatMut, Prepared, Scalar, execute_flat, matmul_flat};
use gather::{IndexRows, clamped_starts, gather, scatter_value, window};
use layout::{broadcast, concatenate, pad, reshape, reverse, slice, transpose};
pub(crate) use matrix::choose_product_kernel;
use matrix::{batched_matmul_into, gemm_f32, matmul};
pub(super) use reduce::fold_lanes;
use reduce::{reduce, reduce_array_sequential};
pub(crate) use transcendental::{
    beyond_trig_limit, cos_f32, erf_f32, exact_trig, exp_f32, ln_f32, logistic_f32, sin_f32, tanh_f32, tanh_into,
};

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
                let $f = |x: f32| ln_f32(x);
                $body
            }
            ActivationFn::Tanh => {
                let $f = |x: f32| tanh_f32(x);
                $body
            }
            ActivationFn::Logistic => {
                let $f = |x: f32| logistic_f32(x);
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
            // Beyond TRIG_LIMIT, callers recompute with `exact_trig`.
            ActivationFn::Sine => {
                let $f = |x: f32| sin_f32(x);
                $body
            }
            ActivationFn::Cosine => {
                let $f = |x: f32| cos_f32(x);
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
            ActivationFn::Tan => {
                let $f = |x: f32| x.tan();
                $body
            }
            ActivationFn::Cbrt => {
                let $f = |x: f32| x.cbrt();
                $body
            }
            ActivationFn::Erf => {
                let $f = |x: f32| erf_f32(x);
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
            UnaryOp::Not | UnaryOp::PopCount | UnaryOp::CountLeadingZeros => {
                unvalidated("a bitwise operation on a float")
            }
            UnaryOp::IsFinite => unvalidated("is-finite as a float function"),
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

pub(super) use {with_activation, with_binary_f32, with_reduce_f32, with_rounding, with_unary_f32};

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
        Op::MatMulRounded { dims: d, format, saturate } => {
            matrix::matmul_rounded(&operands[0], &operands[1], d, *format, *saturate, out, helpers)
        }
        Op::Convolution(c) => convolution::convolution(&operands[0], &operands[1], c, out, helpers),
        Op::Activation(a) => with_activation!(*a, f => {
            with_float!(operands[0].dtype(), T => {
                let x = arr::<T>(&operands[0]);
                let mut y = x.mapv(|x| T::from_f32(f(x.to_f32())));
                if let Some(exact) = exact_trig(*a) {
                    Zip::from(&mut y).and(x).for_each(|o, &x| {
                        if beyond_trig_limit(x.to_f32()) {
                            *o = T::from_f32(exact(x.to_f32()));
                        }
                    });
                }
                T::wrap(y)
            }, unvalidated("activation"))
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
            // An arg-max and its kind by a table of what the region picks; else pairwise.
            picking::reduce(region, axes, *result as usize, operands, out, helpers)
                .unwrap_or_else(|| region::reduce_region(region, axes, *result as usize, operands, out, helpers))
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
        Op::PartitionId => Value::U32(ndarray::arr0(super::partition()).into_dyn()),
        // The run hands collectives to the communicator; nothing else executes them.
        Op::Collective(_) => unvalidated("collective outside a run"),
        Op::While(_) | Op::Conditional(_) => unvalidated("control flow outside a run"),
        Op::ReduceWindow { window: w, region } => {
            window::reduce_window(w, region, operands, &dims, helpers).swap_remove(0)
        }
        Op::Sort { dim, comparator } => sort::sort(operands, *dim as usize, comparator, helpers).swap_remove(0),
        Op::TopK { .. } => unvalidated("an operation with several results, one at a time"),
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
/// Applies `op`, an operation with several results (`Op::result_count`), to
/// `operands`; one value per result.
pub(super) fn execute_results(
    op: &Op,
    operands: &[ValueRef<'_>],
    out: &[&ArrayType],
    helpers: &HostPool,
) -> Vec<Value> {
    match op {
        Op::TopK { k, largest } => {
            let (values, indices) = select::top_k(&operands[0], *k as usize, *largest);
            vec![values, indices]
        }
        Op::ReduceWindow { window: w, region } => {
            let dims = to_usize(&out[0].dims);
            window::reduce_window(w, region, operands, &dims, helpers)
        }
        Op::Sort { dim, comparator } => sort::sort(operands, *dim as usize, comparator, helpers),
        _ => unvalidated("an operation with one result, as several"),
    }
}

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

/// Whether `op` is a matrix product with an `f32` result of type `ty` of at least
/// [`SPARE_MIN_ELEMENTS`]: one that writes every element of its result, so that
/// [`execute_into_spare`] may take an array of any contents.
pub(super) fn product_into_spare(op: &Op, ty: &ArrayType) -> bool {
    matches!(op, Op::MatMul(_) | Op::MatMulRounded { .. })
        && ty.dtype == DType::F32
        && ty.element_count().is_some_and(|n| n >= SPARE_MIN_ELEMENTS as u64)
}

/// Arrays of fewer elements than this (16 KiB) are neither kept as spares nor taken
/// from them: the allocator hands them out of its own caches, and small arrays that
/// nothing asks for would crowd out the others (measured: a training step 3–5% slower
/// when they did).
pub(super) const SPARE_MIN_ELEMENTS: usize = 4 << 10;

/// [`execute_into`] into `spare`, an array of `out`'s elements whose contents are
/// overwritten (see [`product_into_spare`]); the result as a value.
pub(super) fn execute_into_spare(
    op: &Op,
    operands: &[ValueRef<'_>],
    out: &ArrayType,
    mut spare: Vec<f32>,
    helpers: &HostPool,
) -> Result<Value, OutOfBounds> {
    execute_into(op, operands, out, Destination(&mut spare), helpers)?;
    Ok(Value::F32(ArrayD::from_shape_vec(IxDyn(&to_usize(&out.dims)), spare).unwrap_or_else(|_| unvalidated("output"))))
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

vectorized_job!(
    /// `count_non_finite`, vectorised.
    CountNonFinite<'a> (&'a [f32]) -> u64 = count_non_finite
);

/// How many of `x` are NaN or infinite: those whose exponent bits are all ones.
#[inline(always)]
fn count_non_finite(x: &[f32]) -> u64 {
    // 32-bit counts per chunk, which vectorise; no chunk can overflow one.
    x.chunks(1 << 16)
        .map(|chunk| u64::from(chunk.iter().map(|v| u32::from(v.to_bits() & 0x7f80_0000 == 0x7f80_0000)).sum::<u32>()))
        .sum()
}

/// How many of `x` are NaN or infinite (what an execution's numerical-error check
/// counts in each f32 output).
pub(super) fn non_finite_f32(x: &[f32]) -> u64 {
    vectorized(CountNonFinite(x))
}

/// Runs `job` compiled for the widest vector instructions of this CPU (AVX-512, AVX2
/// and FMA, or the baseline), chosen at run time.
pub(super) fn vectorized<J: pulp::WithSimd>(job: J) -> J::Output {
    pulp::Arch::new().dispatch(job)
}

/// Operands that do not fit their operation: `Program::validate` rules this out, so
/// reaching it is a bug in validation. The host pool reports it as `NRT_FAILURE`.
/// `(m, k, n)` of a product `c[m×n] = a[m×k] · b[k×n]` whose shapes agree (validated
/// programs only make such products).
pub(super) fn product_dims<T>(
    a: &ndarray::ArrayView2<'_, T>,
    b: &ndarray::ArrayView2<'_, T>,
    c: &ndarray::ArrayViewMut2<'_, T>,
) -> (usize, usize, usize) {
    let (m, k) = a.dim();
    let n = b.dim().1;
    if b.dim().0 != k || c.dim() != (m, n) {
        unvalidated("dot");
    }
    (m, k, n)
}

pub(super) fn unvalidated(op: &str) -> ! {
    unreachable!("{op}: operands do not fit the operation; Program::validate should have rejected this program")
}

/// The element strides of a row-major array of `shape`.
pub(in crate::backend) fn row_major_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    strides
}

pub(super) fn to_usize(dims: &[u64]) -> Vec<usize> {
    dims.iter().map(|&d| d as usize).collect()
}

pub(super) fn first<T: Copy + Default>(a: &ArrayViewD<'_, T>) -> T {
    a.iter().next().copied().unwrap_or_default()
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
        (Op::MatMul(d), [ValueRef::F32(l), ValueRef::F32(r)]) => {
            if !matrix::small_product_into(l, r, d, dest.view_mut()) {
                batched_matmul_into(l, r, d, dest, gemm_f32, helpers)
            }
        }
        (Op::MatMulRounded { dims, format, saturate }, [ValueRef::F32(l), ValueRef::F32(r)]) => {
            matrix::matmul_rounded_into(l, r, dims, *format, *saturate, dest, helpers)
        }
        (Op::Binary(b), [ValueRef::F32(x), ValueRef::F32(y)]) => {
            with_binary_f32!(*b, f => Zip::from(&mut dest).and(x).and(y).for_each(|o, &x, &y| *o = f(x, y)))
        }
        (Op::Activation(a), [ValueRef::F32(x)]) => {
            with_activation!(*a, f => Zip::from(&mut dest).and(x).for_each(|o, &x| *o = f(x)));
            if let Some(exact) = exact_trig(*a) {
                Zip::from(&mut dest).and(x).for_each(|o, &x| {
                    if beyond_trig_limit(x) {
                        *o = exact(x);
                    }
                });
            }
        }
        _ => match execute(op, operands, out, helpers)? {
            Value::F32(value) => dest.assign(&value),
            _ => unvalidated("output"),
        },
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::elementwise::PARALLEL_MIN_ELEMENTS;
    use super::matrix::batched_matmul;
    use super::reduce::reduce_array;
    use super::*;
    use crate::isa::DotDims;
    use ndarray::Axis;

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
    fn sine_and_cosine_of_huge_arguments_are_exact_on_every_path() {
        let xs = [0.5f32, -2.0e6, 1.0e7, 3.0e38, -1.5e30, f32::NAN, f32::INFINITY, 123_456.79];
        let pool = HostPool::new(1);
        let ty = ArrayType::new(DType::F32, vec![xs.len() as u64]);
        let x = Value::F32(ArrayD::from_shape_vec(IxDyn(&[xs.len()]), xs.to_vec()).expect("shape"));
        for (f, exact) in [(ActivationFn::Sine, f32::sin as fn(f32) -> f32), (ActivationFn::Cosine, f32::cos)] {
            let expected: Vec<f32> = xs.iter().map(|&x| exact(x)).collect();
            let same = |got: &[f32]| {
                got.iter().zip(&expected).all(|(g, e)| g == e || (g.is_nan() && e.is_nan() || (g - e).abs() <= 1e-7))
            };
            let op = Op::Activation(f);
            let Ok(Value::F32(y)) = execute(&op, &[x.view()], &ty, &pool) else { panic!("f32 result") };
            assert!(same(y.as_slice().expect("standard")), "{f:?}: {y:?} vs {expected:?}");
            let mut into = ArrayD::<f32>::zeros(IxDyn(&[xs.len()]));
            let dest =
                Destination::from_le_bytes(DType::F32, bytemuck::cast_slice_mut(into.as_slice_mut().expect("slice")))
                    .expect("aligned");
            let written = execute_into(&op, &[x.view()], &ty, dest, &pool).expect("runs");
            let ValueRef::F32(w) = written else { panic!("f32 view") };
            assert!(same(&w.iter().copied().collect::<Vec<_>>()), "{f:?} into: {w:?}");
        }
    }

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

    #[test]
    fn non_finite_elements_are_counted_as_one_at_a_time() {
        let specials =
            [f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MAX, f32::MIN_POSITIVE, 1e-45, -0.0];
        let x: Vec<f32> =
            (0..1000).map(|i| if i % 7 == 0 { specials[i / 7 % specials.len()] } else { i as f32 }).collect();
        for len in [0, 1, 7, 64, 999, 1000] {
            let expected = x[..len].iter().filter(|v| !v.is_finite()).count() as u64;
            assert_eq!(non_finite_f32(&x[..len]), expected, "first {len}");
        }
    }
}
