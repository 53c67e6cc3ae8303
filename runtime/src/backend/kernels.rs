//! The numeric kernels: one function per engine operation, on host arrays.
//!
//! Kernels trust the shapes they are given: [`crate::isa::Program::validate`] has
//! already proven that every operand fits its operation, and a kernel that finds
//! otherwise panics (see `unvalidated`) rather than compute something plausible. Semantics follow XLA's
//! (NaN-propagating `maximum`/`minimum`, integer division by zero gives -1, wrapping
//! integer arithmetic, saturating float-to-int conversion).

use ndarray::{ArrayD, ArrayViewD, Axis, Dimension, IxDyn, Slice, Zip};

use super::element::{Element, Int, cast, with_element, with_float, with_int};
use super::{Destination, OutOfBounds, Value, ValueRef};
use crate::dtype::{ArrayType, DType, DTypeClass};
use crate::isa::{
    ActivationFn, BinaryOp, CompareDirection, DotDims, GatherDims, Op, ReduceOp, ScatterCombine, ScatterDims, UnaryOp,
};

/// The array inside `v`, which validation has proven to be of type `T`.
fn arr<'v, 'a, T: Element>(v: &'v ValueRef<'a>) -> &'v ArrayViewD<'a, T> {
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

/// Applies `op` to `operands`, producing a value of type `out`. Only gathers and
/// scatters fail, on an index outside their array.
pub(super) fn execute(op: &Op, operands: &[ValueRef<'_>], out: &ArrayType) -> Result<Value, OutOfBounds> {
    let dims = to_usize(&out.dims);
    Ok(match op {
        Op::MatMul(d) => matmul(&operands[0], &operands[1], d, out),
        Op::Activation(f) => {
            let f = activation(*f);
            with_float!(operands[0].dtype(), T => T::wrap(arr::<T>(&operands[0]).mapv(|x| T::from_f32(f(x.to_f32())))),
                unvalidated("activation"))
        }
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
) -> Result<ValueRef<'d>, OutOfBounds> {
    let dims = IxDyn(&to_usize(&out.dims));
    let words = destination.0;
    let view = ndarray::ArrayViewMutD::from_shape(dims.clone(), &mut *words);
    write_f32(op, operands, out, view.unwrap_or_else(|_| unvalidated("output")))?;
    let words: &'d [f32] = words;
    Ok(ValueRef::F32(ArrayViewD::from_shape(dims, words).unwrap_or_else(|_| unvalidated("output"))))
}

fn write_f32(
    op: &Op,
    operands: &[ValueRef<'_>],
    out: &ArrayType,
    mut dest: ndarray::ArrayViewMutD<'_, f32>,
) -> Result<(), OutOfBounds> {
    match (op, operands) {
        (Op::MatMul(d), [ValueRef::F32(l), ValueRef::F32(r)]) => batched_matmul_into(l, r, d, dest, gemm_f32),
        (Op::Binary(b), [ValueRef::F32(x), ValueRef::F32(y)]) => {
            let f = binary_f32(*b);
            Zip::from(&mut dest).and(x).and(y).for_each(|o, &x, &y| *o = f(x, y));
        }
        (Op::Activation(f), [ValueRef::F32(x)]) => {
            let f = activation(*f);
            Zip::from(&mut dest).and(x).for_each(|o, &x| *o = f(x));
        }
        _ => match execute(op, operands, out)? {
            Value::F32(value) => dest.assign(&value),
            _ => unvalidated("output"),
        },
    }
    Ok(())
}

/// Operands that do not fit their operation: `Program::validate` rules this out, so
/// reaching it is a bug in validation. The host pool reports it as `NRT_FAILURE`.
fn unvalidated(op: &str) -> ! {
    unreachable!("{op}: operands do not fit the operation; Program::validate should have rejected this program")
}

pub(super) fn to_usize(dims: &[u64]) -> Vec<usize> {
    dims.iter().map(|&d| d as usize).collect()
}

fn activation(f: ActivationFn) -> fn(f32) -> f32 {
    match f {
        ActivationFn::Exp => f32::exp,
        ActivationFn::Log => f32::ln,
        ActivationFn::Tanh => f32::tanh,
        ActivationFn::Logistic => |x| 1.0 / (1.0 + (-x).exp()),
        ActivationFn::Rsqrt => |x| 1.0 / x.sqrt(),
        ActivationFn::Sqrt => f32::sqrt,
        ActivationFn::Sine => f32::sin,
        ActivationFn::Cosine => f32::cos,
        ActivationFn::ExpMinusOne => f32::exp_m1,
        ActivationFn::LogPlusOne => f32::ln_1p,
    }
}

fn unary(op: UnaryOp, a: &ValueRef<'_>) -> Value {
    let dtype = a.dtype();
    match dtype.class() {
        DTypeClass::Float => {
            let f = unary_f32(op);
            with_float!(dtype, T => T::wrap(arr::<T>(a).mapv(|x| T::from_f32(f(x.to_f32())))), unvalidated("unary"))
        }
        DTypeClass::Signed | DTypeClass::Unsigned => {
            with_int!(dtype, T => T::wrap(arr::<T>(a).mapv(unary_int::<T>(op))), unvalidated("unary"))
        }
        DTypeClass::Pred => match op {
            UnaryOp::Not => Value::Pred(arr::<bool>(a).mapv(|x| !x)),
            _ => unvalidated("unary on pred"),
        },
    }
}

fn unary_f32(op: UnaryOp) -> fn(f32) -> f32 {
    match op {
        UnaryOp::Negate => |x| -x,
        UnaryOp::Abs => f32::abs,
        UnaryOp::Sign => sign_f32,
        UnaryOp::Ceil => f32::ceil,
        UnaryOp::Floor => f32::floor,
        UnaryOp::RoundNearestEven => f32::round_ties_even,
        UnaryOp::RoundNearestAfz => f32::round,
        UnaryOp::Not => |_| unvalidated("not on a float"),
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

/// XLA's `sign` on floats: ±1 by sign, while ±0 and NaN stay as they are.
fn sign_f32(x: f32) -> f32 {
    if x == 0.0 || x.is_nan() { x } else { x.signum() }
}

fn zip_map<T: Copy, U>(a: &ArrayViewD<'_, T>, b: &ArrayViewD<'_, T>, f: impl Fn(T, T) -> U) -> ArrayD<U> {
    Zip::from(a).and(b).map_collect(|&x, &y| f(x, y))
}

fn binary(op: BinaryOp, a: &ValueRef<'_>, b: &ValueRef<'_>) -> Value {
    let dtype = a.dtype();
    match dtype.class() {
        DTypeClass::Float => {
            let f = binary_f32(op);
            with_float!(dtype, T => T::wrap(zip_map(arr::<T>(a), arr::<T>(b), |x, y| T::from_f32(f(x.to_f32(), y.to_f32())))),
                unvalidated("binary"))
        }
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

fn binary_f32(op: BinaryOp) -> fn(f32, f32) -> f32 {
    match op {
        BinaryOp::Add => |x, y| x + y,
        BinaryOp::Subtract => |x, y| x - y,
        BinaryOp::Multiply => |x, y| x * y,
        BinaryOp::Divide => |x, y| x / y,
        BinaryOp::Maximum => max_f32,
        BinaryOp::Minimum => min_f32,
        BinaryOp::Power => f32::powf,
        BinaryOp::Remainder => |x, y| x % y,
        BinaryOp::Atan2 => f32::atan2,
        BinaryOp::And
        | BinaryOp::Or
        | BinaryOp::Xor
        | BinaryOp::ShiftLeft
        | BinaryOp::ShiftRightLogical
        | BinaryOp::ShiftRightArithmetic => |_, _| unvalidated("bitwise operation on a float"),
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

/// XLA's `maximum`: NaN in either operand gives NaN.
fn max_f32(x: f32, y: f32) -> f32 {
    if x.is_nan() || y.is_nan() { f32::NAN } else { x.max(y) }
}

fn min_f32(x: f32, y: f32) -> f32 {
    if x.is_nan() || y.is_nan() { f32::NAN } else { x.min(y) }
}

fn compare(direction: CompareDirection, total_order: bool, a: &ValueRef<'_>, b: &ValueRef<'_>) -> Value {
    fn compare_arrays<T: Element>(
        direction: CompareDirection,
        total_order: bool,
        a: &ArrayViewD<'_, T>,
        b: &ArrayViewD<'_, T>,
    ) -> ArrayD<bool> {
        use std::cmp::Ordering;
        let decide = move |ord: Option<Ordering>| match (direction, ord) {
            (CompareDirection::Ne, None) => true,
            (_, None) => false,
            (CompareDirection::Eq, Some(o)) => o == Ordering::Equal,
            (CompareDirection::Ne, Some(o)) => o != Ordering::Equal,
            (CompareDirection::Lt, Some(o)) => o == Ordering::Less,
            (CompareDirection::Le, Some(o)) => o != Ordering::Greater,
            (CompareDirection::Gt, Some(o)) => o == Ordering::Greater,
            (CompareDirection::Ge, Some(o)) => o != Ordering::Less,
        };
        if total_order {
            zip_map(a, b, |x, y| decide(Some(x.total_cmp(&y))))
        } else {
            zip_map(a, b, |x, y| decide(x.partial_cmp(&y)))
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
fn broadcast<T: Clone>(a: &ArrayViewD<'_, T>, map: &[u32], out_dims: &[usize]) -> ArrayD<T> {
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
        Some(b) => b.as_standard_layout().into_owned(),
        None => unvalidated("broadcast"),
    }
}

fn reshape<T: Clone>(a: &ArrayViewD<'_, T>, dims: &[usize]) -> ArrayD<T> {
    match a.to_shape(IxDyn(dims)) {
        Ok(v) => v.into_owned(),
        Err(_) => unvalidated("reshape"),
    }
}

fn transpose<T: Clone>(a: &ArrayViewD<'_, T>, perm: &[u32]) -> ArrayD<T> {
    let perm: Vec<usize> = perm.iter().map(|&p| p as usize).collect();
    a.view().permuted_axes(IxDyn(&perm)).as_standard_layout().into_owned()
}

fn slice<T: Clone>(a: &ArrayViewD<'_, T>, start: &[u64], limit: &[u64], stride: &[u64]) -> ArrayD<T> {
    a.slice_each_axis(|ax| {
        let i = ax.axis.index();
        Slice::new(start[i] as isize, Some(limit[i] as isize), stride[i] as isize)
    })
    .as_standard_layout()
    .into_owned()
}

fn concatenate(operands: &[ValueRef<'_>], dim: usize) -> Value {
    fn join<T: Element>(operands: &[ValueRef<'_>], dim: usize) -> ArrayD<T> {
        let parts: Vec<ArrayViewD<'_, T>> = operands.iter().map(|v| arr::<T>(v).view()).collect();
        ndarray::concatenate(Axis(dim), &parts).unwrap_or_else(|_| unvalidated("concatenate"))
    }
    let first = operands.first().unwrap_or_else(|| unvalidated("concatenate"));
    with_element!(first.dtype(), T => T::wrap(join::<T>(operands, dim)))
}

fn reduce_f32(op: ReduceOp) -> fn(f32, f32) -> f32 {
    match op {
        ReduceOp::Add => |x, y| x + y,
        ReduceOp::Multiply => |x, y| x * y,
        ReduceOp::Maximum => max_f32,
        ReduceOp::Minimum => min_f32,
    }
}

fn reduce_int<T: Int>(op: ReduceOp) -> fn(T, T) -> T {
    match op {
        ReduceOp::Add => T::add,
        ReduceOp::Multiply => T::mul,
        ReduceOp::Maximum => Ord::max,
        ReduceOp::Minimum => Ord::min,
    }
}

fn reduce_pred(op: ReduceOp) -> fn(bool, bool) -> bool {
    match op {
        ReduceOp::Minimum | ReduceOp::Multiply => |x, y| x && y,
        ReduceOp::Maximum | ReduceOp::Add => |x, y| x || y,
    }
}

fn reduce(op: ReduceOp, operand: &ValueRef<'_>, init: &ValueRef<'_>, axes: &[u32]) -> Value {
    let dtype = operand.dtype();
    match dtype.class() {
        // Narrow floats accumulate in f32 and round once at the end.
        DTypeClass::Float => {
            let f = reduce_f32(op);
            if let (ValueRef::F32(a), ValueRef::F32(init)) = (operand, init) {
                return Value::F32(reduce_array(a, first(init), axes, f));
            }
            with_float!(dtype, T => {
                let widened = arr::<T>(operand).mapv(T::to_f32);
                let out = reduce_array(&widened.view(), first(arr::<T>(init)).to_f32(), axes, f);
                T::wrap(out.mapv(T::from_f32))
            }, unvalidated("reduce"))
        }
        DTypeClass::Signed | DTypeClass::Unsigned => with_int!(dtype, T => {
            T::wrap(reduce_array(arr::<T>(operand), first(arr::<T>(init)), axes, reduce_int::<T>(op)))
        }, unvalidated("reduce")),
        DTypeClass::Pred => {
            Value::Pred(reduce_array(arr::<bool>(operand), first(arr::<bool>(init)), axes, reduce_pred(op)))
        }
    }
}

fn first<T: Copy + Default>(a: &ArrayViewD<'_, T>) -> T {
    a.iter().next().copied().unwrap_or_default()
}

/// Folds the `axes` of `a` into `init` with `f`, keeping the other axes in order.
fn reduce_array<T: Copy>(a: &ArrayViewD<'_, T>, init: T, axes: &[u32], f: fn(T, T) -> T) -> ArrayD<T> {
    let rank = a.ndim();
    let kept: Vec<usize> = (0..rank).filter(|d| !axes.contains(&(*d as u32))).collect();
    let reduced: Vec<usize> = (0..rank).filter(|d| axes.contains(&(*d as u32))).collect();
    let perm: Vec<usize> = kept.iter().chain(&reduced).copied().collect();
    let kept_dims: Vec<usize> = kept.iter().map(|&d| a.shape()[d]).collect();
    let outer: usize = kept_dims.iter().product();
    let inner: usize = reduced.iter().map(|&d| a.shape()[d]).product();
    let permuted = a.view().permuted_axes(IxDyn(&perm));
    let rows = permuted.as_standard_layout();
    let flat = rows.as_slice().unwrap_or(&[]);
    let mut out = Vec::with_capacity(outer);
    for row in 0..outer {
        let start = row * inner;
        out.push(flat.get(start..start + inner).unwrap_or(&[]).iter().fold(init, |acc, &x| f(acc, x)));
    }
    ArrayD::from_shape_vec(IxDyn(&kept_dims), out).unwrap_or_else(|_| unvalidated("reduce"))
}

/// `dot` with general dimension numbers, as batched matrix products. Floats multiply
/// in f32 with f32 accumulation and round once to the output type; integers are
/// converted to the output type first and wrap.
fn matmul(lhs: &ValueRef<'_>, rhs: &ValueRef<'_>, d: &DotDims, out: &ArrayType) -> Value {
    let dims = to_usize(&out.dims);
    match lhs.dtype().class() {
        DTypeClass::Float => {
            if let (ValueRef::F32(l), ValueRef::F32(r), DType::F32) = (lhs, rhs, out.dtype) {
                return Value::F32(batched_matmul(l, r, d, &dims, gemm_f32));
            }
            let (l, r) = (converted::<f32>(lhs), converted::<f32>(rhs));
            let product = batched_matmul(&l.view(), &r.view(), d, &dims, gemm_f32);
            with_float!(out.dtype, D => D::wrap(product.mapv(D::from_f32)), unvalidated("dot"))
        }
        DTypeClass::Signed | DTypeClass::Unsigned => with_int!(out.dtype, D => {
            let (l, r) = (converted::<D>(lhs), converted::<D>(rhs));
            D::wrap(batched_matmul(&l.view(), &r.view(), d, &dims, gemm_int::<D>))
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

fn batched_matmul<T: Copy + Default>(
    lhs: &ArrayViewD<'_, T>,
    rhs: &ArrayViewD<'_, T>,
    d: &DotDims,
    out_dims: &[usize],
    gemm: Gemm<T>,
) -> ArrayD<T> {
    let mut out = ArrayD::from_elem(IxDyn(out_dims), T::default());
    batched_matmul_into(lhs, rhs, d, out.view_mut(), gemm);
    out
}

/// `dot` with general dimension numbers into `out` (the result's shape, row-major),
/// as one matrix product per batch element. Every element of `out` is written.
fn batched_matmul_into<T: Copy + Default>(
    lhs: &ArrayViewD<'_, T>,
    rhs: &ArrayViewD<'_, T>,
    d: &DotDims,
    out: ndarray::ArrayViewMutD<'_, T>,
    gemm: Gemm<T>,
) {
    let (Ok(l), Ok(r)) =
        (arrange(lhs, &d.lhs_batch, &d.lhs_contracting, true), arrange(rhs, &d.rhs_batch, &d.rhs_contracting, false))
    else {
        unvalidated("dot")
    };
    let (batch, m, _) = l.dim();
    let n = r.dim().2;
    let mut out = out.into_shape_with_order((batch, m, n)).unwrap_or_else(|_| unvalidated("dot"));
    for i in 0..batch {
        gemm(l.index_axis(Axis(0), i), r.index_axis(Axis(0), i), out.index_axis_mut(Axis(0), i));
    }
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

/// Single-precision matrix product through `matrixmultiply`.
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
    // SAFETY: the pointers and strides describe the three views exactly (their
    // dimensions were checked above), `c` is borrowed mutably and does not alias
    // `a` or `b`, and matrixmultiply reads and writes only within those bounds.
    unsafe {
        matrixmultiply::sgemm(m, k, n, 1.0, a.as_ptr(), rsa, csa, b.as_ptr(), rsb, csb, 0.0, c.as_mut_ptr(), rsc, csc);
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
