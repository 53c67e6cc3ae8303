//! Kernels on contiguous `f32`, `s32` and `pred` arrays, written into arrays that
//! exist already: what a small loop runs at each iteration (see `backend/small.rs`),
//! where allocating every result would cost more than computing it. Each computes
//! what its array kernel computes, bit for bit: the same element functions, and for
//! reductions the same order of the partial sums.

use super::*;
use crate::backend::element::cast;
use crate::isa::{CompareDirection, DotDims, UnaryOp};
use elementwise::{binary_int, elementwise_run, unary_int};
use reduce::{fold_lanes, reduce_int, reduce_pred};

vectorized_job!(
    /// `elementwise_run` over whole arrays, vectorised.
    FlatRun<'a> ((&'a Op, &'a [&'a [f32]], usize, &'a mut [f32])) -> () = elementwise_run
);

/// A contiguous array read by a flat kernel.
#[derive(Clone, Copy)]
pub(in crate::backend) enum Flat<'a> {
    F32(&'a [f32]),
    S32(&'a [i32]),
    Pred(&'a [bool]),
}

/// A contiguous array a flat kernel writes, every element of it.
pub(in crate::backend) enum FlatMut<'a> {
    F32(&'a mut [f32]),
    S32(&'a mut [i32]),
    Pred(&'a mut [bool]),
}

impl Flat<'_> {
    fn len(&self) -> usize {
        match self {
            Flat::F32(x) => x.len(),
            Flat::S32(x) => x.len(),
            Flat::Pred(x) => x.len(),
        }
    }
}

/// Computes `op` on `operands` into `out`, where `shape` is the first operand's shape;
/// `false`, with nothing written, where this operation, type or shape has no flat
/// kernel (the caller then runs the array kernel).
pub(in crate::backend) fn execute_flat(op: &Op, operands: &[Flat<'_>], shape: &[usize], out: FlatMut<'_>) -> bool {
    use Flat as F;
    use FlatMut as M;
    let n = match &out {
        M::F32(o) => o.len(),
        M::S32(o) => o.len(),
        M::Pred(o) => o.len(),
    };
    let same = |k: usize| operands.iter().take(k).all(|x| x.len() == n);
    match (op, operands, out) {
        (Op::Binary(_), [F::F32(x), F::F32(y)], M::F32(o)) if same(2) => {
            vectorized(FlatRun((op, &[*x, *y], 0, o)));
        }
        (Op::Activation(_) | Op::RoundPrecision { .. }, [F::F32(x)], M::F32(o)) if same(1) => {
            vectorized(FlatRun((op, &[*x], 0, o)));
        }
        (Op::Binary(b), [F::S32(x), F::S32(y)], M::S32(o)) if same(2) => zip(x, y, o, binary_int::<i32>(*b)),
        (Op::Binary(b), [F::Pred(x), F::Pred(y)], M::Pred(o)) if same(2) => match b {
            BinaryOp::Minimum | BinaryOp::And => zip(x, y, o, |x, y| x && y),
            BinaryOp::Maximum | BinaryOp::Or => zip(x, y, o, |x, y| x || y),
            BinaryOp::Xor => zip(x, y, o, |x, y| x != y),
            _ => return false,
        },
        (Op::Compare { direction, total_order }, [x, y], M::Pred(o)) if same(2) => match (x, y) {
            (F::F32(x), F::F32(y)) => compare_into(*direction, *total_order, x, y, o),
            (F::S32(x), F::S32(y)) => compare_into(*direction, *total_order, x, y, o),
            _ => return false,
        },
        (Op::Unary(u), [F::F32(x)], M::F32(o)) if same(1) => match u {
            UnaryOp::Not | UnaryOp::PopCount | UnaryOp::CountLeadingZeros | UnaryOp::IsFinite => return false,
            _ => with_unary_f32!(*u, f => o.iter_mut().zip(*x).for_each(|(o, &x)| *o = f(x))),
        },
        (Op::Unary(u), [F::S32(x)], M::S32(o)) if same(1) && *u != UnaryOp::IsFinite => {
            let f = unary_int::<i32>(*u);
            o.iter_mut().zip(*x).for_each(|(o, &x)| *o = f(x));
        }
        (Op::Unary(UnaryOp::Not), [F::Pred(x)], M::Pred(o)) if same(1) => {
            o.iter_mut().zip(*x).for_each(|(o, &x)| *o = !x);
        }
        (Op::Select, [F::Pred(p), a, b], out)
            if same(3) || (shape.is_empty() && operands[1..].iter().all(|x| x.len() == n)) =>
        {
            // A scalar predicate picks a whole operand, as the array kernel does.
            let pick = |i: usize| if p.len() == n { p[i] } else { p[0] };
            match (a, b, out) {
                (F::F32(a), F::F32(b), M::F32(o)) => select_into(pick, a, b, o),
                (F::S32(a), F::S32(b), M::S32(o)) => select_into(pick, a, b, o),
                (F::Pred(a), F::Pred(b), M::Pred(o)) => select_into(pick, a, b, o),
                _ => return false,
            }
        }
        (Op::Convert, [x], out) if same(1) => match (x, out) {
            (F::F32(x), M::F32(o)) => o.copy_from_slice(x),
            (F::F32(x), M::S32(o)) => convert_into(x, o),
            (F::F32(x), M::Pred(o)) => convert_into(x, o),
            (F::S32(x), M::F32(o)) => convert_into(x, o),
            (F::S32(x), M::S32(o)) => o.copy_from_slice(x),
            (F::S32(x), M::Pred(o)) => convert_into(x, o),
            (F::Pred(x), M::F32(o)) => convert_into(x, o),
            (F::Pred(x), M::S32(o)) => convert_into(x, o),
            (F::Pred(x), M::Pred(o)) => o.copy_from_slice(x),
        },
        // A broadcast of one element fills the result with it.
        (Op::Broadcast { .. }, [x], out) if x.len() == 1 => match (x, out) {
            (F::F32(x), M::F32(o)) => o.fill(x[0]),
            (F::S32(x), M::S32(o)) => o.fill(x[0]),
            (F::Pred(x), M::Pred(o)) => o.fill(x[0]),
            _ => return false,
        },
        (Op::Reshape | Op::Copy, [x], out) if same(1) => match (x, out) {
            (F::F32(x), M::F32(o)) => o.copy_from_slice(x),
            (F::S32(x), M::S32(o)) => o.copy_from_slice(x),
            (F::Pred(x), M::Pred(o)) => o.copy_from_slice(x),
            _ => return false,
        },
        (Op::Reduce { op, dims: axes }, [x, init], out) if init.len() == 1 => match (x, init, out) {
            (F::F32(x), F::F32(init), M::F32(o)) => {
                with_reduce_f32!(*op, f => return fold_into(x, init[0], shape, axes, f, o))
            }
            (F::S32(x), F::S32(init), M::S32(o)) => {
                return fold_into(x, init[0], shape, axes, reduce_int::<i32>(*op), o);
            }
            (F::Pred(x), F::Pred(init), M::Pred(o)) => return fold_into(x, init[0], shape, axes, reduce_pred(*op), o),
            _ => return false,
        },
        _ => return false,
    }
    true
}

fn zip<T: Copy, U>(x: &[T], y: &[T], out: &mut [U], f: impl Fn(T, T) -> U) {
    out.iter_mut().zip(x.iter().zip(y)).for_each(|(o, (&x, &y))| *o = f(x, y));
}

fn compare_into<T: Element>(direction: CompareDirection, total_order: bool, x: &[T], y: &[T], out: &mut [bool]) {
    if total_order {
        zip(x, y, out, |x, y| compare_scalars(direction, true, x, y));
    } else {
        zip(x, y, out, |x, y| compare_scalars(direction, false, x, y));
    }
}

fn select_into<T: Copy>(pick: impl Fn(usize) -> bool, a: &[T], b: &[T], out: &mut [T]) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = if pick(i) { a[i] } else { b[i] };
    }
}

fn convert_into<S: Element, D: Element>(x: &[S], out: &mut [D]) {
    out.iter_mut().zip(x).for_each(|(o, &x)| *o = cast::<S, D>(x));
}

/// `reduce`'s fold of `axes` of `x` (of `shape`) into `out`, in the order
/// `reduce::reduce_array` folds: trailing axes in eight interleaved lanes, leading axes
/// row by row. `false` for axes between kept ones, which need a transposition.
fn fold_into<T: Copy>(
    x: &[T],
    init: T,
    shape: &[usize],
    axes: &[u32],
    f: impl Fn(T, T) -> T + Copy,
    out: &mut [T],
) -> bool {
    let rank = shape.len();
    let reduced = |d: usize| axes.contains(&(d as u32));
    let kept = (0..rank).filter(|&d| !reduced(d)).count();
    let outer: usize = (0..rank).filter(|&d| !reduced(d)).map(|d| shape[d]).product();
    let inner: usize = (0..rank).filter(|&d| reduced(d)).map(|d| shape[d]).product();
    if out.len() != outer || x.len() != outer * inner {
        return false;
    }
    if outer == 0 || inner == 0 {
        out.fill(init);
        return true;
    }
    let trailing = (0..kept).all(|d| !reduced(d));
    let leading = (rank - kept..rank).all(|d| !reduced(d));
    if trailing {
        for (o, row) in out.iter_mut().zip(x.chunks_exact(inner)) {
            *o = fold_lanes(row, init, f);
        }
    } else if leading {
        out.fill(init);
        for row in x.chunks_exact(outer) {
            out.iter_mut().zip(row).for_each(|(acc, &x)| *acc = f(*acc, x));
        }
    } else {
        return false;
    }
    true
}

/// `dot` of `f32` operands into `out` (of `dims`), as `matrix::matmul` computes it: a
/// small product directly, a larger one through the f32 GEMM.
pub(in crate::backend) fn matmul_flat(
    l: &ArrayViewD<'_, f32>,
    r: &ArrayViewD<'_, f32>,
    d: &DotDims,
    out: &mut [f32],
    dims: &[usize],
    helpers: &HostPool,
) {
    out.fill(0.0);
    let mut product = ndarray::ArrayViewMutD::from_shape(IxDyn(dims), out).unwrap_or_else(|_| unvalidated("dot"));
    if !matrix::small_product_into(l, r, d, product.view_mut()) {
        batched_matmul_into(l, r, d, product, gemm_f32, helpers);
    }
}
