//! The numeric kernels: one function per engine operation, on host arrays.
//!
//! Kernels trust the shapes they are given: [`crate::isa::Program::validate`] has
//! already proven that every operand fits its operation, and a kernel that finds
//! otherwise panics (see `unvalidated`) rather than compute something plausible. Semantics follow XLA's
//! (NaN-propagating `maximum`/`minimum`, integer division by zero gives -1, wrapping
//! integer arithmetic, saturating float-to-int conversion).

use ndarray::{ArrayD, ArrayViewD, Axis, IxDyn, Slice, Zip};

use super::element::{Element, Int, cast, with_element, with_float, with_int};
use super::{Destination, Value, ValueRef};
use crate::dtype::{ArrayType, DType, DTypeClass};
use crate::isa::{ActivationFn, BinaryOp, CompareDirection, DotDims, Op, ReduceOp, UnaryOp};

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

/// Applies `op` to `operands`, producing a value of type `out`.
pub(super) fn execute(op: &Op, operands: &[ValueRef<'_>], out: &ArrayType) -> Value {
    let dims = to_usize(&out.dims);
    match op {
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
    }
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
) -> ValueRef<'d> {
    let dims = IxDyn(&to_usize(&out.dims));
    let words = destination.0;
    let view = ndarray::ArrayViewMutD::from_shape(dims.clone(), &mut *words);
    write_f32(op, operands, out, view.unwrap_or_else(|_| unvalidated("output")));
    let words: &'d [f32] = words;
    ValueRef::F32(ArrayViewD::from_shape(dims, words).unwrap_or_else(|_| unvalidated("output")))
}

fn write_f32(op: &Op, operands: &[ValueRef<'_>], out: &ArrayType, mut dest: ndarray::ArrayViewMutD<'_, f32>) {
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
        _ => match execute(op, operands, out) {
            Value::F32(value) => dest.assign(&value),
            _ => unvalidated("output"),
        },
    }
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

fn reduce(op: ReduceOp, operand: &ValueRef<'_>, init: &ValueRef<'_>, axes: &[u32]) -> Value {
    let dtype = operand.dtype();
    match dtype.class() {
        // Narrow floats accumulate in f32 and round once at the end.
        DTypeClass::Float => {
            let f: fn(f32, f32) -> f32 = match op {
                ReduceOp::Add => |x, y| x + y,
                ReduceOp::Multiply => |x, y| x * y,
                ReduceOp::Maximum => max_f32,
                ReduceOp::Minimum => min_f32,
            };
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
            let f: fn(T, T) -> T = match op {
                ReduceOp::Add => T::add,
                ReduceOp::Multiply => T::mul,
                ReduceOp::Maximum => Ord::max,
                ReduceOp::Minimum => Ord::min,
            };
            T::wrap(reduce_array(arr::<T>(operand), first(arr::<T>(init)), axes, f))
        }, unvalidated("reduce")),
        DTypeClass::Pred => {
            let f: fn(bool, bool) -> bool = match op {
                ReduceOp::Minimum | ReduceOp::Multiply => |x, y| x && y,
                ReduceOp::Maximum | ReduceOp::Add => |x, y| x || y,
            };
            Value::Pred(reduce_array(arr::<bool>(operand), first(arr::<bool>(init)), axes, f))
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
