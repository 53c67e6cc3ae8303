//! Kernels on contiguous `f32`, `s32` and `pred` arrays, written into arrays that
//! exist already: what a small loop runs at each iteration (see `backend/small/`),
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
        (Op::Binary(b), [F::Pred(x), F::Pred(y)], M::Pred(o)) if same(2) => return pred_binary_into(*b, x, y, o),
        (Op::Compare { direction, total_order }, &[x, y], M::Pred(o)) if same(2) => {
            return compare_flat(*direction, *total_order, x, y, o);
        }
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

/// `and` (or `minimum`), `or` (or `maximum`) or `xor` of `pred`s; `false`, with
/// nothing written, for another operation.
fn pred_binary_into(b: BinaryOp, x: &[bool], y: &[bool], out: &mut [bool]) -> bool {
    match b {
        BinaryOp::Minimum | BinaryOp::And => zip(x, y, out, |x, y| x && y),
        BinaryOp::Maximum | BinaryOp::Or => zip(x, y, out, |x, y| x || y),
        BinaryOp::Xor => zip(x, y, out, |x, y| x != y),
        _ => return false,
    }
    true
}

/// A comparison of two `f32` or two `s32` arrays; `false`, with nothing written, for
/// other types.
fn compare_flat(direction: CompareDirection, total_order: bool, x: Flat<'_>, y: Flat<'_>, out: &mut [bool]) -> bool {
    match (x, y) {
        (Flat::F32(x), Flat::F32(y)) => compare_into(direction, total_order, x, y, out),
        (Flat::S32(x), Flat::S32(y)) => compare_into(direction, total_order, x, y, out),
        _ => return false,
    }
    true
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

/// Arrays of at most this many elements take [`Prepared`]'s plain loops; longer ones
/// its vectorised runs (the same element functions, so the same bits).
const PLAIN_MAX: usize = 128;

/// A flat kernel chosen once, when a small loop is prepared, for the steps every loop
/// has: two operands and a result that are flat arrays of one length (one element for
/// a reduction of every dimension). Each run then computes with no look at the
/// operation, the types or the shape. It computes what [`execute_flat`] computes for
/// the same instruction, bit for bit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(in crate::backend) enum Prepared {
    /// `f32` arithmetic (not the bitwise operations).
    BinaryF32(BinaryOp),
    BinaryS32(BinaryOp),
    /// `and` (or `minimum`), `or` (or `maximum`) and `xor` of `pred`s.
    BinaryPred(BinaryOp),
    /// Of two `f32`s or two `s32`s.
    Compare {
        direction: CompareDirection,
        total_order: bool,
    },
    /// A reduction of every element into one, from a one-element initial value.
    FoldAll(ReduceOp),
    /// A small `f32` product of a row-major matrix and a vector (`[m, k] · [k]`).
    MatrixVector,
    /// A small `f32` product of a vector and a row-major matrix of more than one
    /// column (`[k] · [k, n]`).
    VectorMatrix,
    /// An `f32` product of row-major matrices (`[m, k] · [k, n]`) too large for the
    /// small products' kernel and too small to be split across threads: the `gemm`
    /// crate's, as the general path runs it, without the views of a batch around it.
    MatrixMatrix {
        m: usize,
        k: usize,
        n: usize,
    },
}

impl Prepared {
    /// The prepared kernel of `op` on two operands of `types` and `shapes` into a
    /// result of `out` and `out_len` elements; `None` where [`execute_flat`] (or, for
    /// a product, [`matmul_flat`]) is needed.
    pub(in crate::backend) fn new(
        op: &Op,
        types: [DType; 2],
        shapes: [&[usize]; 2],
        out: DType,
        out_len: usize,
    ) -> Option<Prepared> {
        use DType::{F32, Pred, S32};
        let lengths = shapes.map(|s| s.iter().product::<usize>());
        let same = lengths == [out_len; 2];
        Some(match (op, types, out) {
            (Op::Binary(b), [F32, F32], F32) if same && Prepared::arithmetic(*b) => Prepared::BinaryF32(*b),
            (Op::Binary(b), [S32, S32], S32) if same && *b != BinaryOp::Atan2 => Prepared::BinaryS32(*b),
            (
                Op::Binary(b @ (BinaryOp::And | BinaryOp::Or | BinaryOp::Xor | BinaryOp::Minimum | BinaryOp::Maximum)),
                [Pred, Pred],
                Pred,
            ) if same => Prepared::BinaryPred(*b),
            (Op::Compare { direction, total_order }, [F32, F32] | [S32, S32], Pred) if same => {
                Prepared::Compare { direction: *direction, total_order: *total_order }
            }
            (Op::Reduce { op, dims }, [F32, F32] | [S32, S32] | [Pred, Pred], _)
                if types[0] == out && dims.len() == shapes[0].len() && lengths[1] == 1 && out_len == 1 =>
            {
                Prepared::FoldAll(*op)
            }
            (Op::MatMul(d), [F32, F32], F32) if d.lhs_batch.is_empty() && d.rhs_batch.is_empty() => {
                let contracting = (d.lhs_contracting.as_slice(), d.rhs_contracting.as_slice());
                let small = lengths[0].max(lengths[1]) <= matrix::SMALL_PRODUCT_MACS;
                match (shapes, contracting) {
                    ([&[m, k], &[k2]], ([1], [0])) if k == k2 && m * k > 0 && small && out_len == m => {
                        Prepared::MatrixVector
                    }
                    ([&[k], &[k2, n]], ([0], [0])) if k == k2 && k > 0 && n > 1 && small && out_len == n => {
                        Prepared::VectorMatrix
                    }
                    ([&[m, k], &[k2, n]], ([1], [0]))
                        if k == k2
                            && out_len == m * n
                            && (matrix::SMALL_PRODUCT_MACS + 1..matrix::PARALLEL_MIN_MACS).contains(&(m * k * n)) =>
                    {
                        Prepared::MatrixMatrix { m, k, n }
                    }
                    _ => return None,
                }
            }
            _ => return None,
        })
    }

    /// The kernel on one-element operands of element type `operand`, as a plain
    /// function: the element function [`Prepared::run`] applies, so the same bits.
    /// `None` for the kernels of whole arrays.
    pub(in crate::backend) fn scalar(self, operand: DType) -> Option<Scalar> {
        Some(match (self, operand) {
            (Prepared::BinaryF32(b), DType::F32) => Scalar::F32(with_binary_f32!(b, f => f as fn(f32, f32) -> f32)),
            (Prepared::BinaryS32(b), DType::S32) => Scalar::S32(binary_int::<i32>(b)),
            (Prepared::BinaryPred(b), DType::Pred) => Scalar::Pred(match b {
                BinaryOp::Minimum | BinaryOp::And => |x, y| x && y,
                BinaryOp::Maximum | BinaryOp::Or => |x, y| x || y,
                BinaryOp::Xor => |x, y| x != y,
                _ => return None,
            }),
            (Prepared::Compare { direction, total_order }, DType::F32) => {
                Scalar::CompareF32(compare_fn(direction, total_order))
            }
            (Prepared::Compare { direction, total_order }, DType::S32) => {
                Scalar::CompareS32(compare_fn(direction, total_order))
            }
            _ => return None,
        })
    }

    fn arithmetic(b: BinaryOp) -> bool {
        !matches!(
            b,
            BinaryOp::And
                | BinaryOp::Or
                | BinaryOp::Xor
                | BinaryOp::ShiftLeft
                | BinaryOp::ShiftRightLogical
                | BinaryOp::ShiftRightArithmetic
        )
    }

    /// Computes the kernel of `x` and `y` into `out`; `false`, with nothing written,
    /// where the arrays are not of the types and lengths it was prepared for.
    #[inline]
    pub(in crate::backend) fn run(self, x: Flat<'_>, y: Flat<'_>, out: FlatMut<'_>) -> bool {
        use Flat as F;
        use FlatMut as M;
        match (self, x, y, out) {
            (Prepared::BinaryF32(b), F::F32(x), F::F32(y), M::F32(o)) if x.len() == o.len() && y.len() == o.len() => {
                if o.len() > PLAIN_MAX {
                    vectorized(FlatRun((&Op::Binary(b), &[x, y], 0, o)));
                } else {
                    with_binary_f32!(b, f => zip(x, y, o, f));
                }
            }
            (Prepared::BinaryS32(b), F::S32(x), F::S32(y), M::S32(o)) if x.len() == o.len() && y.len() == o.len() => {
                zip(x, y, o, binary_int::<i32>(b));
            }
            (Prepared::BinaryPred(b), F::Pred(x), F::Pred(y), M::Pred(o))
                if x.len() == o.len() && y.len() == o.len() =>
            {
                return pred_binary_into(b, x, y, o);
            }
            (Prepared::Compare { direction, total_order }, x, y, M::Pred(o))
                if x.len() == o.len() && y.len() == o.len() =>
            {
                return compare_flat(direction, total_order, x, y, o);
            }
            (Prepared::FoldAll(op), x, init, out) if init.len() == 1 => match (x, init, out) {
                (F::F32(x), F::F32(init), M::F32([o])) => *o = with_reduce_f32!(op, f => fold_lanes(x, init[0], f)),
                (F::S32(x), F::S32(init), M::S32([o])) => *o = fold_lanes(x, init[0], reduce_int::<i32>(op)),
                (F::Pred(x), F::Pred(init), M::Pred([o])) => *o = fold_lanes(x, init[0], reduce_pred(op)),
                _ => return false,
            },
            (Prepared::MatrixVector, F::F32(a), F::F32(v), M::F32(o))
                if !v.is_empty() && a.len() == o.len() * v.len() =>
            {
                matrix::matrix_vector(a, v, o);
            }
            (Prepared::VectorMatrix, F::F32(v), F::F32(b), M::F32(o))
                if o.len() > 1 && b.len() == o.len() * v.len() =>
            {
                matrix::vector_matrix(v, b, o);
            }
            (Prepared::MatrixMatrix { m, k, n }, F::F32(a), F::F32(b), M::F32(o)) => {
                use ndarray::{ArrayView2, ArrayViewMut2};
                let (Ok(a), Ok(b)) = (ArrayView2::from_shape((m, k), a), ArrayView2::from_shape((k, n), b)) else {
                    return false;
                };
                if o.len() != m * n {
                    return false;
                }
                // As `matmul_flat` does before its product.
                o.fill(0.0);
                let Ok(c) = ArrayViewMut2::from_shape((m, n), o) else { unvalidated("a product's shape") };
                matrix::gemm_f32(a, b, c);
            }
            _ => return false,
        }
        true
    }
}

/// A prepared kernel of one-element operands (see [`Prepared::scalar`]).
#[derive(Debug, Clone, Copy)]
pub(in crate::backend) enum Scalar {
    F32(fn(f32, f32) -> f32),
    S32(fn(i32, i32) -> i32),
    Pred(fn(bool, bool) -> bool),
    CompareF32(fn(f32, f32) -> bool),
    CompareS32(fn(i32, i32) -> bool),
}

/// `compare_scalars` of `direction` and `total_order`, as a plain function.
fn compare_fn<T: Element>(direction: CompareDirection, total_order: bool) -> fn(T, T) -> bool {
    macro_rules! each_direction {
        ($($d:ident),*) => {
            match (direction, total_order) {
                $(
                    (CompareDirection::$d, false) => |x, y| compare_scalars(CompareDirection::$d, false, x, y),
                    (CompareDirection::$d, true) => |x, y| compare_scalars(CompareDirection::$d, true, x, y),
                )*
            }
        };
    }
    each_direction!(Eq, Ne, Lt, Le, Gt, Ge)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Floats with NaNs of both signs, infinities and signed zeros, from `seed`.
    fn floats(n: usize, seed: u32) -> Vec<f32> {
        (0..n as u32)
            .map(|i| match i.wrapping_add(seed.wrapping_mul(7)).wrapping_mul(2_654_435_761) % 23 {
                0 => f32::NAN,
                1 => -f32::NAN,
                2 => f32::INFINITY,
                3 => -0.0,
                4 => 0.0,
                x => (x as f32 - 11.0) * 0.37,
            })
            .collect()
    }

    fn ints(n: usize, seed: u32) -> Vec<i32> {
        (0..n as u32).map(|i| [i32::MIN, -3, 0, 1, 7, i32::MAX][((i + seed) % 6) as usize]).collect()
    }

    fn preds(n: usize, seed: u32) -> Vec<bool> {
        (0..n as u32).map(|i| (i * 7 + seed).is_multiple_of(3)).collect()
    }

    /// Runs `op` both ways on `x` and `y` into fresh arrays like `out`; both results.
    fn both<T: Clone + Default>(
        op: &Op,
        x: Flat<'_>,
        y: Flat<'_>,
        out: (DType, usize),
        wrap: impl Fn(&mut [T]) -> FlatMut<'_>,
    ) -> (Vec<T>, Vec<T>) {
        let shape = [x.len()];
        let kernel = Prepared::new(op, [dtype(x), dtype(y)], [&shape, &[y.len()]], out.0, out.1)
            .unwrap_or_else(|| panic!("{op:?} is prepared"));
        let (mut prepared, mut general) = (vec![T::default(); out.1], vec![T::default(); out.1]);
        assert!(kernel.run(x, y, wrap(&mut prepared)), "{op:?} runs prepared");
        assert!(execute_flat(op, &[x, y], &shape, wrap(&mut general)), "{op:?} runs flat");
        (prepared, general)
    }

    fn dtype(x: Flat<'_>) -> DType {
        match x {
            Flat::F32(_) => DType::F32,
            Flat::S32(_) => DType::S32,
            Flat::Pred(_) => DType::Pred,
        }
    }

    /// Every binary operation of `f32`s.
    const F32_BINARY: [BinaryOp; 9] = [
        BinaryOp::Add,
        BinaryOp::Subtract,
        BinaryOp::Multiply,
        BinaryOp::Divide,
        BinaryOp::Maximum,
        BinaryOp::Minimum,
        BinaryOp::Power,
        BinaryOp::Remainder,
        BinaryOp::Atan2,
    ];

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn prepared_kernels_give_the_flat_kernels_bits() {
        use CompareDirection::*;
        let directions = [Eq, Ne, Lt, Le, Gt, Ge];
        // Short arrays take the plain loops, long ones the vectorised runs.
        for n in [1, 5, 64, PLAIN_MAX + 1, 1000] {
            let (x, y) = (floats(n, 1), floats(n, 2));
            let (i, k) = (ints(n, 0), ints(n, 3));
            let (p, q) = (preds(n, 1), preds(n, 2));
            for b in F32_BINARY {
                let (a, g) = both(&Op::Binary(b), Flat::F32(&x), Flat::F32(&y), (DType::F32, n), |o| FlatMut::F32(o));
                assert_eq!(bits(&a), bits(&g), "{b:?} of {n}");
            }
            for b in [BinaryOp::Add, BinaryOp::Subtract, BinaryOp::Multiply, BinaryOp::Maximum, BinaryOp::Xor] {
                let (a, g) = both(&Op::Binary(b), Flat::S32(&i), Flat::S32(&k), (DType::S32, n), |o| FlatMut::S32(o));
                assert_eq!(a, g, "{b:?} of s32");
            }
            for b in [BinaryOp::And, BinaryOp::Or, BinaryOp::Xor, BinaryOp::Minimum, BinaryOp::Maximum] {
                let (a, g) =
                    both(&Op::Binary(b), Flat::Pred(&p), Flat::Pred(&q), (DType::Pred, n), |o| FlatMut::Pred(o));
                assert_eq!(a, g, "{b:?} of pred");
            }
            for (direction, total_order) in directions.iter().flat_map(|&d| [(d, false), (d, true)]) {
                let op = Op::Compare { direction, total_order };
                let (a, g) = both(&op, Flat::F32(&x), Flat::F32(&y), (DType::Pred, n), |o| FlatMut::Pred(o));
                assert_eq!(a, g, "{op:?} of f32");
                let (a, g) = both(&op, Flat::S32(&i), Flat::S32(&k), (DType::Pred, n), |o| FlatMut::Pred(o));
                assert_eq!(a, g, "{op:?} of s32");
            }
            // Sums of finite elements show the order of the partial sums.
            let finite: Vec<f32> = x.iter().map(|&v| if v.is_finite() { v * 1.1e-3 } else { 0.7 }).collect();
            for op in [ReduceOp::Add, ReduceOp::Multiply, ReduceOp::Maximum, ReduceOp::Minimum] {
                let reduce = Op::Reduce { op, dims: vec![0] };
                for x in [&x, &finite] {
                    let (a, g) = both(&reduce, Flat::F32(x), Flat::F32(&[1.5]), (DType::F32, 1), |o| FlatMut::F32(o));
                    assert_eq!(bits(&a), bits(&g), "{op:?} of {n} f32");
                }
                let (a, g) = both(&reduce, Flat::S32(&i), Flat::S32(&[2]), (DType::S32, 1), |o| FlatMut::S32(o));
                assert_eq!(a, g, "{op:?} of s32");
                let (a, g) = both(&reduce, Flat::Pred(&p), Flat::Pred(&[true]), (DType::Pred, 1), |o| FlatMut::Pred(o));
                assert_eq!(a, g, "{op:?} of pred");
            }
        }
    }

    #[test]
    fn scalar_kernels_give_the_prepared_kernels_bits() {
        use CompareDirection::*;
        let (x, y) = (floats(23, 1), floats(23, 4));
        let (i, k) = (ints(6, 0), ints(6, 1));
        let run = |kernel: Prepared, a: Flat<'_>, b: Flat<'_>, out: FlatMut<'_>| assert!(kernel.run(a, b, out));
        for (a, b) in x.iter().flat_map(|a| y.iter().map(move |b| (*a, *b))) {
            for op in F32_BINARY {
                let Some(Scalar::F32(f)) = Prepared::BinaryF32(op).scalar(DType::F32) else { panic!("{op:?}") };
                let mut o = [0.0];
                run(Prepared::BinaryF32(op), Flat::F32(&[a]), Flat::F32(&[b]), FlatMut::F32(&mut o));
                assert_eq!(f(a, b).to_bits(), o[0].to_bits(), "{op:?} of {a} and {b}");
            }
            for (direction, total_order) in [Eq, Ne, Lt, Le, Gt, Ge].iter().flat_map(|&d| [(d, false), (d, true)]) {
                let kernel = Prepared::Compare { direction, total_order };
                let Some(Scalar::CompareF32(f)) = kernel.scalar(DType::F32) else { panic!("{kernel:?}") };
                let mut o = [false];
                run(kernel, Flat::F32(&[a]), Flat::F32(&[b]), FlatMut::Pred(&mut o));
                assert_eq!(f(a, b), o[0], "{kernel:?} of {a} and {b}");
            }
        }
        for (a, b) in i.iter().flat_map(|a| k.iter().map(move |b| (*a, *b))) {
            for op in [BinaryOp::Add, BinaryOp::Subtract, BinaryOp::Multiply, BinaryOp::Divide, BinaryOp::ShiftLeft] {
                let Some(Scalar::S32(f)) = Prepared::BinaryS32(op).scalar(DType::S32) else { panic!("{op:?}") };
                let mut o = [0];
                run(Prepared::BinaryS32(op), Flat::S32(&[a]), Flat::S32(&[b]), FlatMut::S32(&mut o));
                assert_eq!(f(a, b), o[0], "{op:?} of {a} and {b}");
            }
            for direction in [Eq, Ne, Lt, Le, Gt, Ge] {
                let kernel = Prepared::Compare { direction, total_order: false };
                let Some(Scalar::CompareS32(f)) = kernel.scalar(DType::S32) else { panic!("{kernel:?}") };
                let mut o = [false];
                run(kernel, Flat::S32(&[a]), Flat::S32(&[b]), FlatMut::Pred(&mut o));
                assert_eq!(f(a, b), o[0], "{kernel:?} of {a} and {b}");
            }
        }
        for (a, b) in [(false, false), (false, true), (true, false), (true, true)] {
            for op in [BinaryOp::And, BinaryOp::Or, BinaryOp::Xor, BinaryOp::Minimum, BinaryOp::Maximum] {
                let Some(Scalar::Pred(f)) = Prepared::BinaryPred(op).scalar(DType::Pred) else { panic!("{op:?}") };
                let mut o = [false];
                run(Prepared::BinaryPred(op), Flat::Pred(&[a]), Flat::Pred(&[b]), FlatMut::Pred(&mut o));
                assert_eq!(f(a, b), o[0], "{op:?} of {a} and {b}");
            }
        }
        assert!(Prepared::FoldAll(ReduceOp::Add).scalar(DType::F32).is_none(), "a whole array's kernel");
        assert!(Prepared::BinaryF32(BinaryOp::Add).scalar(DType::S32).is_none(), "another type");
    }

    #[test]
    fn only_steps_of_one_length_whole_reductions_and_small_products_are_prepared() {
        const F: [DType; 2] = [DType::F32; 2];
        let add = Op::Binary(BinaryOp::Add);
        assert!(Prepared::new(&add, F, [&[4], &[4]], DType::F32, 4).is_some());
        assert!(Prepared::new(&add, F, [&[4], &[1]], DType::F32, 4).is_none(), "a broadcast operand");
        assert!(Prepared::new(&add, [DType::F32, DType::S32], [&[4], &[4]], DType::F32, 4).is_none());
        let and = Op::Binary(BinaryOp::And);
        assert!(Prepared::new(&and, F, [&[4], &[4]], DType::F32, 4).is_none(), "bitwise on f32");
        let rows = Op::Reduce { op: ReduceOp::Add, dims: vec![1] };
        assert!(Prepared::new(&rows, F, [&[3, 4], &[]], DType::F32, 3).is_none(), "one axis of two");
        let all = Op::Reduce { op: ReduceOp::Add, dims: vec![0, 1] };
        assert!(Prepared::new(&all, F, [&[3, 4], &[]], DType::F32, 1).is_some());
        let dot = |lhs: u32, rhs: u32| {
            Op::MatMul(DotDims {
                lhs_batch: vec![],
                lhs_contracting: vec![lhs],
                rhs_batch: vec![],
                rhs_contracting: vec![rhs],
            })
        };
        assert_eq!(Prepared::new(&dot(1, 0), F, [&[3, 4], &[4]], DType::F32, 3), Some(Prepared::MatrixVector));
        assert_eq!(Prepared::new(&dot(0, 0), F, [&[4], &[4, 3]], DType::F32, 3), Some(Prepared::VectorMatrix));
        assert!(Prepared::new(&dot(0, 0), F, [&[4, 3], &[4]], DType::F32, 3).is_none(), "a transposed matrix");
        assert!(Prepared::new(&dot(0, 0), F, [&[4], &[4, 1]], DType::F32, 1).is_none(), "one column");
        assert!(Prepared::new(&dot(1, 0), F, [&[200, 100], &[100]], DType::F32, 200).is_none(), "a GEMM's size");
    }

    /// Products as `matmul_flat` computes them through the array views.
    #[test]
    fn prepared_products_give_the_array_kernels_bits() {
        let pool = HostPool::new(1);
        let dims = |lhs: u32| DotDims {
            lhs_batch: vec![],
            lhs_contracting: vec![lhs],
            rhs_batch: vec![],
            rhs_contracting: vec![0],
        };
        let finite = |n: usize, seed: u32| -> Vec<f32> {
            floats(n, seed).iter().map(|&v| if v.is_finite() { v * 1.3 } else { -2.1 }).collect()
        };
        for (m, k) in [(1, 1), (3, 7), (32, 32), (5, 19), (64, 128), (128, 64)] {
            let (a, v) = (finite(m * k, 4), finite(k, 5));
            let la = ArrayViewD::from_shape(IxDyn(&[m, k]), &a).expect("shape");
            let lv = ArrayViewD::from_shape(IxDyn(&[k]), &v).expect("shape");
            // [m, k] · [k]
            let mut expected = vec![0.0; m];
            matmul_flat(&la, &lv, &dims(1), &mut expected, &[m], &pool);
            let mut got = vec![0.0; m];
            assert!(Prepared::MatrixVector.run(Flat::F32(&a), Flat::F32(&v), FlatMut::F32(&mut got)));
            assert_eq!(bits(&got), bits(&expected), "[{m}, {k}] · [{k}]");
            // [m] · [m, k], the matrix read as m rows of k
            if k > 1 {
                let w = finite(m, 6);
                let lw = ArrayViewD::from_shape(IxDyn(&[m]), &w).expect("shape");
                let mut expected = vec![0.0; k];
                matmul_flat(&lw, &la, &dims(0), &mut expected, &[k], &pool);
                let mut got = vec![0.0; k];
                assert!(Prepared::VectorMatrix.run(Flat::F32(&w), Flat::F32(&a), FlatMut::F32(&mut got)));
                assert_eq!(bits(&got), bits(&expected), "[{m}] · [{m}, {k}]");
            }
        }
        // [m, k] · [k, n], past the small products' kernel.
        for (m, k, n) in [(8, 64, 64), (16, 40, 33), (3, 100, 70), (130, 20, 9)] {
            let (a, b) = (finite(m * k, 7), finite(k * n, 8));
            let la = ArrayViewD::from_shape(IxDyn(&[m, k]), &a).expect("shape");
            let lb = ArrayViewD::from_shape(IxDyn(&[k, n]), &b).expect("shape");
            let mut expected = vec![0.0; m * n];
            matmul_flat(&la, &lb, &dims(1), &mut expected, &[m, n], &pool);
            let kernel = Prepared::new(&Op::MatMul(dims(1)), [DType::F32; 2], [&[m, k], &[k, n]], DType::F32, m * n);
            assert_eq!(kernel, Some(Prepared::MatrixMatrix { m, k, n }), "[{m}, {k}] · [{k}, {n}]");
            let mut got = vec![7.0; m * n];
            assert!(kernel.is_some_and(|p| p.run(Flat::F32(&a), Flat::F32(&b), FlatMut::F32(&mut got))));
            assert_eq!(bits(&got), bits(&expected), "[{m}, {k}] · [{k}, {n}]");
        }
        let small = Prepared::new(&Op::MatMul(dims(1)), [DType::F32; 2], [&[8, 8], &[8, 8]], DType::F32, 64);
        assert_eq!(small, None, "a product for the small products' kernel");
    }
}
