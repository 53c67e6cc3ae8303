//! Reductions: folds along axes, in interleaved lanes for `f32` so that the loop
//! vectorises.

use ndarray::{ArrayD, ArrayViewD, IxDyn};

use super::*;
use crate::backend::element::{Element, Int, with_float, with_int};
use crate::backend::{Value, ValueRef};
use crate::dtype::DTypeClass;
use crate::isa::ReduceOp;

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

pub(super) fn reduce(op: ReduceOp, operand: &ValueRef<'_>, init: &ValueRef<'_>, axes: &[u32]) -> Value {
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

/// Folds the `axes` of `a` into `init` with `f`, keeping the other axes in order.
/// `f` is associative and commutative (XLA requires it of reductions), so the fold
/// may run in any order: trailing axes fold in eight interleaved lanes, leading axes
/// row by row, both of which the compiler vectorises. Float sums may therefore round
/// differently from a strictly sequential sum, as in XLA.
pub(super) fn reduce_array<T: Copy>(
    a: &ArrayViewD<'_, T>,
    init: T,
    axes: &[u32],
    f: impl Fn(T, T) -> T + Copy,
) -> ArrayD<T> {
    reduce_array_with(a, init, axes, f, true)
}

/// `reduce_array` with one accumulator per output element, in index order: a
/// reduction whose partial results are rounded must not get the extra precision of
/// eight partial sums.
pub(super) fn reduce_array_sequential<T: Copy>(
    a: &ArrayViewD<'_, T>,
    init: T,
    axes: &[u32],
    f: impl Fn(T, T) -> T + Copy,
) -> ArrayD<T> {
    reduce_array_with(a, init, axes, f, false)
}

pub(super) fn reduce_array_with<T: Copy, F: Fn(T, T) -> T + Copy>(
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
pub(super) struct FoldRows<'a, T, F>((&'a [T], usize, T, F, bool));

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
pub(crate) fn fold_lanes<T: Copy, F: Fn(T, T) -> T>(row: &[T], init: T, f: F) -> T {
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
