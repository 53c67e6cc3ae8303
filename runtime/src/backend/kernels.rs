//! The numeric kernels: one function per engine operation, on host arrays.
//!
//! Kernels trust the shapes they are given: [`crate::isa::Program::validate`] has
//! already proven that every operand fits its operation, and a kernel that finds
//! otherwise panics (see `unvalidated`) rather than compute something plausible. Semantics follow XLA's
//! (NaN-propagating `maximum`/`minimum`, integer division by zero gives -1, wrapping
//! integer arithmetic, saturating float-to-int conversion).

use ndarray::{ArrayD, ArrayViewD, Axis, IxDyn, Slice, Zip};

use super::{Destination, Value, ValueRef};
use crate::dtype::{ArrayType, DType};
use crate::isa::{ActivationFn, BinaryOp, CompareDirection, DotDims, Op, ReduceOp, UnaryOp};

/// Dispatches a generic array function over the element types.
macro_rules! each_type {
    ($value:expr, $a:ident => $body:expr) => {
        match $value {
            ValueRef::F32($a) => Value::F32($body),
            ValueRef::S32($a) => Value::S32($body),
            ValueRef::Pred($a) => Value::Pred($body),
        }
    };
}

/// Applies `op` to `operands`, producing a value of type `out`.
pub(super) fn execute(op: &Op, operands: &[ValueRef<'_>], out: &ArrayType) -> Value {
    let dims = to_usize(&out.dims);
    match op {
        Op::MatMul(d) => matmul(&operands[0], &operands[1], d, &dims),
        Op::Activation(f) => match &operands[0] {
            ValueRef::F32(a) => Value::F32(a.mapv(activation(*f))),
            _ => unvalidated("activation"),
        },
        Op::Unary(u) => unary(*u, &operands[0]),
        Op::Binary(b) => binary(*b, &operands[0], &operands[1]),
        Op::Compare { direction, total_order } => compare(*direction, *total_order, &operands[0], &operands[1]),
        Op::Select => select(&operands[0], &operands[1], &operands[2]),
        Op::Convert => convert(&operands[0], out.dtype),
        Op::Broadcast { dims: map } => each_type!(&operands[0], a => broadcast(a, map, &dims)),
        Op::Reshape => each_type!(&operands[0], a => reshape(a, &dims)),
        Op::Transpose { perm } => each_type!(&operands[0], a => transpose(a, perm)),
        Op::Reduce { op, dims: axes } => reduce(*op, &operands[0], &operands[1], axes),
        Op::Concatenate { dim } => concatenate(operands, *dim as usize),
        Op::Slice { start, limit, stride } => each_type!(&operands[0], a => slice(a, start, limit, stride)),
        Op::Iota { dim } => iota(out.dtype, &dims, *dim as usize),
        Op::Copy => operands[0].to_owned(),
    }
}

/// Applies `op` to `operands`, writing the result straight into `destination` (an
/// output tensor), and returns a view of it. Matrix products, element-wise arithmetic
/// and activations compute in place; other operations compute into a new array that
/// is then copied.
pub(super) fn execute_into<'d>(
    op: &Op,
    operands: &[ValueRef<'_>],
    out: &ArrayType,
    destination: Destination<'d>,
) -> ValueRef<'d> {
    let dims = IxDyn(&to_usize(&out.dims));
    match destination {
        Destination::F32(words) => {
            let view = ndarray::ArrayViewMutD::from_shape(dims.clone(), &mut *words);
            write_f32(op, operands, out, view.unwrap_or_else(|_| unvalidated("output")));
            let words: &'d [f32] = words;
            ValueRef::F32(ArrayViewD::from_shape(dims, words).unwrap_or_else(|_| unvalidated("output")))
        }
        Destination::S32(words) => {
            let view = ndarray::ArrayViewMutD::from_shape(dims.clone(), &mut *words);
            write_s32(op, operands, out, view.unwrap_or_else(|_| unvalidated("output")));
            let words: &'d [i32] = words;
            ValueRef::S32(ArrayViewD::from_shape(dims, words).unwrap_or_else(|_| unvalidated("output")))
        }
    }
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

fn write_s32(op: &Op, operands: &[ValueRef<'_>], out: &ArrayType, mut dest: ndarray::ArrayViewMutD<'_, i32>) {
    match (op, operands) {
        (Op::MatMul(d), [ValueRef::S32(l), ValueRef::S32(r)]) => batched_matmul_into(l, r, d, dest, gemm_naive),
        (Op::Binary(b), [ValueRef::S32(x), ValueRef::S32(y)]) => {
            let f = binary_s32(*b);
            Zip::from(&mut dest).and(x).and(y).for_each(|o, &x, &y| *o = f(x, y));
        }
        _ => match execute(op, operands, out) {
            Value::S32(value) => dest.assign(&value),
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
    match (op, a) {
        (UnaryOp::Negate, ValueRef::F32(a)) => Value::F32(a.mapv(|x| -x)),
        (UnaryOp::Abs, ValueRef::F32(a)) => Value::F32(a.mapv(f32::abs)),
        (UnaryOp::Sign, ValueRef::F32(a)) => Value::F32(a.mapv(sign_f32)),
        (UnaryOp::Ceil, ValueRef::F32(a)) => Value::F32(a.mapv(f32::ceil)),
        (UnaryOp::Floor, ValueRef::F32(a)) => Value::F32(a.mapv(f32::floor)),
        (UnaryOp::RoundNearestEven, ValueRef::F32(a)) => Value::F32(a.mapv(f32::round_ties_even)),
        (UnaryOp::RoundNearestAfz, ValueRef::F32(a)) => Value::F32(a.mapv(f32::round)),
        (UnaryOp::Negate, ValueRef::S32(a)) => Value::S32(a.mapv(i32::wrapping_neg)),
        (UnaryOp::Abs, ValueRef::S32(a)) => Value::S32(a.mapv(i32::wrapping_abs)),
        (UnaryOp::Sign, ValueRef::S32(a)) => Value::S32(a.mapv(i32::signum)),
        (UnaryOp::Not, ValueRef::S32(a)) => Value::S32(a.mapv(|x| !x)),
        (UnaryOp::Not, ValueRef::Pred(a)) => Value::Pred(a.mapv(|x| !x)),
        _ => unvalidated("unary"),
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
    match (a, b) {
        (ValueRef::F32(a), ValueRef::F32(b)) => Value::F32(zip_map(a, b, binary_f32(op))),
        (ValueRef::S32(a), ValueRef::S32(b)) => Value::S32(zip_map(a, b, binary_s32(op))),
        (ValueRef::Pred(a), ValueRef::Pred(b)) => Value::Pred(match op {
            BinaryOp::Minimum | BinaryOp::And => zip_map(a, b, |x, y| x && y),
            BinaryOp::Maximum | BinaryOp::Or => zip_map(a, b, |x, y| x || y),
            BinaryOp::Xor => zip_map(a, b, |x, y| x != y),
            _ => unvalidated("binary on pred"),
        }),
        _ => unvalidated("binary"),
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
        | BinaryOp::ShiftRightArithmetic => |_, _| unvalidated("bitwise operation on f32"),
    }
}

fn binary_s32(op: BinaryOp) -> fn(i32, i32) -> i32 {
    match op {
        BinaryOp::Add => i32::wrapping_add,
        BinaryOp::Subtract => i32::wrapping_sub,
        BinaryOp::Multiply => i32::wrapping_mul,
        BinaryOp::Divide => div_s32,
        BinaryOp::Maximum => i32::max,
        BinaryOp::Minimum => i32::min,
        BinaryOp::Power => pow_s32,
        BinaryOp::Remainder => rem_s32,
        BinaryOp::And => |x, y| x & y,
        BinaryOp::Or => |x, y| x | y,
        BinaryOp::Xor => |x, y| x ^ y,
        // Shift amounts are read as unsigned; from the bit width up, every bit is
        // shifted out (an arithmetic right shift leaves copies of the sign bit).
        BinaryOp::ShiftLeft => |x, y| u32::try_from(y).ok().and_then(|n| x.checked_shl(n)).unwrap_or(0),
        BinaryOp::ShiftRightLogical => {
            |x, y| u32::try_from(y).ok().and_then(|n| (x as u32).checked_shr(n)).unwrap_or(0) as i32
        }
        BinaryOp::ShiftRightArithmetic => |x, y| x >> u32::try_from(y).map_or(31, |n| n.min(31)),
        BinaryOp::Atan2 => |_, _| unvalidated("atan2 on s32"),
    }
}

/// XLA's integer remainder: `x % 0 = x`, `MIN % -1 = 0`.
fn rem_s32(x: i32, y: i32) -> i32 {
    if y == 0 { x } else { x.wrapping_rem(y) }
}

/// XLA's integer power: wrapping; a negative exponent gives 0 except for bases 1 and -1.
fn pow_s32(x: i32, y: i32) -> i32 {
    match u32::try_from(y) {
        Ok(n) => x.wrapping_pow(n),
        Err(_) => match x {
            1 => 1,
            -1 if y % 2 == 0 => 1,
            -1 => -1,
            _ => 0,
        },
    }
}

/// XLA's `maximum`: NaN in either operand gives NaN.
fn max_f32(x: f32, y: f32) -> f32 {
    if x.is_nan() || y.is_nan() { f32::NAN } else { x.max(y) }
}

fn min_f32(x: f32, y: f32) -> f32 {
    if x.is_nan() || y.is_nan() { f32::NAN } else { x.min(y) }
}

/// XLA's integer division: `x / 0 = -1`, `MIN / -1 = MIN`.
fn div_s32(x: i32, y: i32) -> i32 {
    if y == 0 { -1 } else { x.wrapping_div(y) }
}

fn compare(direction: CompareDirection, total_order: bool, a: &ValueRef<'_>, b: &ValueRef<'_>) -> Value {
    use std::cmp::Ordering;
    let decide = |ord: Option<Ordering>| match (direction, ord) {
        (CompareDirection::Ne, None) => true,
        (_, None) => false,
        (CompareDirection::Eq, Some(o)) => o == Ordering::Equal,
        (CompareDirection::Ne, Some(o)) => o != Ordering::Equal,
        (CompareDirection::Lt, Some(o)) => o == Ordering::Less,
        (CompareDirection::Le, Some(o)) => o != Ordering::Greater,
        (CompareDirection::Gt, Some(o)) => o == Ordering::Greater,
        (CompareDirection::Ge, Some(o)) => o != Ordering::Less,
    };
    Value::Pred(match (a, b) {
        (ValueRef::F32(a), ValueRef::F32(b)) if total_order => zip_map(a, b, |x, y| decide(Some(x.total_cmp(&y)))),
        (ValueRef::F32(a), ValueRef::F32(b)) => zip_map(a, b, |x, y| decide(x.partial_cmp(&y))),
        (ValueRef::S32(a), ValueRef::S32(b)) => zip_map(a, b, |x, y| decide(Some(x.cmp(&y)))),
        (ValueRef::Pred(a), ValueRef::Pred(b)) => zip_map(a, b, |x, y| decide(Some(x.cmp(&y)))),
        _ => unvalidated("compare"),
    })
}

fn select(pred: &ValueRef<'_>, on_true: &ValueRef<'_>, on_false: &ValueRef<'_>) -> Value {
    let ValueRef::Pred(p) = pred else {
        unvalidated("select");
    };
    fn pick<T: Copy>(p: &ArrayViewD<'_, bool>, a: &ArrayViewD<'_, T>, b: &ArrayViewD<'_, T>) -> ArrayD<T> {
        match p.ndim() {
            0 if p.iter().next().copied().unwrap_or(false) => a.to_owned(),
            0 => b.to_owned(),
            _ => Zip::from(p).and(a).and(b).map_collect(|&c, &x, &y| if c { x } else { y }),
        }
    }
    match (on_true, on_false) {
        (ValueRef::F32(a), ValueRef::F32(b)) => Value::F32(pick(p, a, b)),
        (ValueRef::S32(a), ValueRef::S32(b)) => Value::S32(pick(p, a, b)),
        (ValueRef::Pred(a), ValueRef::Pred(b)) => Value::Pred(pick(p, a, b)),
        _ => unvalidated("select"),
    }
}

fn convert(a: &ValueRef<'_>, to: DType) -> Value {
    match (a, to) {
        (ValueRef::F32(a), DType::F32) => Value::F32(a.to_owned()),
        (ValueRef::F32(a), DType::S32) => Value::S32(a.mapv(|x| x as i32)),
        (ValueRef::F32(a), DType::Pred) => Value::Pred(a.mapv(|x| x != 0.0)),
        (ValueRef::S32(a), DType::F32) => Value::F32(a.mapv(|x| x as f32)),
        (ValueRef::S32(a), DType::S32) => Value::S32(a.to_owned()),
        (ValueRef::S32(a), DType::Pred) => Value::Pred(a.mapv(|x| x != 0)),
        (ValueRef::Pred(a), DType::F32) => Value::F32(a.mapv(|x| if x { 1.0 } else { 0.0 })),
        (ValueRef::Pred(a), DType::S32) => Value::S32(a.mapv(i32::from)),
        (ValueRef::Pred(a), DType::Pred) => Value::Pred(a.to_owned()),
    }
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
    fn join<T: Clone>(parts: Vec<ArrayViewD<'_, T>>, dim: usize) -> ArrayD<T> {
        ndarray::concatenate(Axis(dim), &parts).unwrap_or_else(|_| unvalidated("concatenate"))
    }
    match operands.first() {
        Some(ValueRef::F32(_)) => {
            Value::F32(join(operands.iter().filter_map(|v| v.as_f32()).map(|a| a.view()).collect(), dim))
        }
        Some(ValueRef::S32(_)) => {
            Value::S32(join(operands.iter().filter_map(|v| v.as_s32()).map(|a| a.view()).collect(), dim))
        }
        Some(ValueRef::Pred(_)) => {
            Value::Pred(join(operands.iter().filter_map(|v| v.as_pred()).map(|a| a.view()).collect(), dim))
        }
        None => unvalidated("concatenate"),
    }
}

fn iota(dtype: DType, dims: &[usize], dim: usize) -> Value {
    match dtype {
        DType::F32 => Value::F32(ArrayD::from_shape_fn(IxDyn(dims), |ix| ix[dim] as f32)),
        _ => Value::S32(ArrayD::from_shape_fn(IxDyn(dims), |ix| ix[dim] as i32)),
    }
}

fn reduce(op: ReduceOp, operand: &ValueRef<'_>, init: &ValueRef<'_>, axes: &[u32]) -> Value {
    match (operand, init) {
        (ValueRef::F32(a), ValueRef::F32(i)) => Value::F32(reduce_array(
            a,
            first(i),
            axes,
            match op {
                ReduceOp::Add => |x, y| x + y,
                ReduceOp::Multiply => |x, y| x * y,
                ReduceOp::Maximum => max_f32,
                ReduceOp::Minimum => min_f32,
            },
        )),
        (ValueRef::S32(a), ValueRef::S32(i)) => Value::S32(reduce_array(
            a,
            first(i),
            axes,
            match op {
                ReduceOp::Add => i32::wrapping_add,
                ReduceOp::Multiply => i32::wrapping_mul,
                ReduceOp::Maximum => i32::max,
                ReduceOp::Minimum => i32::min,
            },
        )),
        (ValueRef::Pred(a), ValueRef::Pred(i)) => Value::Pred(reduce_array(
            a,
            first(i),
            axes,
            match op {
                ReduceOp::Minimum | ReduceOp::Multiply => |x, y| x && y,
                ReduceOp::Maximum | ReduceOp::Add => |x, y| x || y,
            },
        )),
        _ => unvalidated("reduce"),
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

/// `dot` with general dimension numbers, as batched matrix products.
fn matmul(lhs: &ValueRef<'_>, rhs: &ValueRef<'_>, d: &DotDims, out_dims: &[usize]) -> Value {
    match (lhs, rhs) {
        (ValueRef::F32(l), ValueRef::F32(r)) => Value::F32(batched_matmul(l, r, d, out_dims, gemm_f32)),
        (ValueRef::S32(l), ValueRef::S32(r)) => Value::S32(batched_matmul(l, r, d, out_dims, gemm_naive)),
        _ => unvalidated("dot"),
    }
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

fn gemm_naive(
    a: ndarray::ArrayView2<'_, i32>,
    b: ndarray::ArrayView2<'_, i32>,
    mut c: ndarray::ArrayViewMut2<'_, i32>,
) {
    let (m, k) = a.dim();
    let n = b.dim().1;
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0i32;
            for p in 0..k {
                acc = acc.wrapping_add(a[[i, p]].wrapping_mul(b[[p, j]]));
            }
            c[[i, j]] = acc;
        }
    }
}
