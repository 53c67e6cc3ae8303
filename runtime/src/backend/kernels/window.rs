//! `ReduceWindow`: pooling, cumulative sums and products, and any other reduction
//! over sliding windows.
//!
//! The reduction runs window element by window element over the whole output at once:
//! for each position in the window, the elements every window sees there (or the
//! initial value, where that position falls into padding or a hole of the dilated
//! array) form one array of the output's shape, and the reducer combines it into the
//! accumulated values, element-wise. The order is XLA's: the initial value first, then
//! the window's elements in row-major order, so float sums round as XLA's do.
//!
//! A cumulative reduction along one dimension (`jnp.cumsum`, `cumprod`, `cummax`, as
//! JAX lowers them: a window as long as the dimension, starting that far minus one
//! before each element) runs in one pass instead, when its initial value combined with
//! itself stays the same: window `j` then reduces to `init ∘ x₀ ∘ … ∘ xⱼ` in that order,
//! which is the running reduction's, bit for bit.

use ndarray::{ArrayD, Axis, IxDyn};

use super::elementwise::{max_f32, min_f32};
use super::region::{apply, broadcast_scalar};
use super::{arr, each_type, first, unvalidated, with_binary_f32};
use crate::backend::element::{Element, with_element};
use crate::backend::{Value, ValueRef};
use crate::dtype::DType;
use crate::isa::{BinaryOp, DilatedWindow, Op, Region, RegionValue};
use crate::pool::HostPool;

/// Reduces the windows of the arrays in the first half of `operands` (initial values
/// in the second half) into arrays of `out_dims`.
pub(super) fn reduce_window(
    window: &DilatedWindow,
    region: &Region,
    operands: &[ValueRef<'_>],
    out_dims: &[usize],
    helpers: &HostPool,
) -> Vec<Value> {
    let n = operands.len() / 2;
    let (arrays, inits) = operands.split_at(n);
    if n == 1
        && let Some(axis) = window.running_axis(&to_u64(arrays[0].shape()), &to_u64(out_dims))
        && settles(region, &inits[0], helpers)
    {
        // A plain `f32` sum, product, maximum or minimum: a loop along each lane, with
        // the element-wise kernels' arithmetic; any other reducer, step by step.
        if let (Some(op), Some(a), Some(init)) = (plain_f32(region), f32::unwrap(&arrays[0]), f32::unwrap(&inits[0])) {
            let (init, mut out) = (first(init), ArrayD::<f32>::zeros(a.raw_dim()));
            let (len, inner) = (a.shape()[axis], a.shape()[axis + 1..].iter().product::<usize>());
            match (a.as_slice(), out.as_slice_mut()) {
                _ if len == 0 || inner == 0 => {}
                // Rows along the last dimension, contiguous.
                (Some(x), Some(o)) if inner == 1 => with_binary_f32!(op, f => scan_rows(x, o, len, init, f)),
                // Along another dimension: the elements after it, contiguous, at once.
                (Some(x), Some(o)) => with_binary_f32!(op, f => scan_blocks(x, o, len, inner, init, f)),
                _ => with_binary_f32!(op, f => {
                    for (lane, mut into) in a.lanes(Axis(axis)).into_iter().zip(out.lanes_mut(Axis(axis))) {
                        let mut acc = init;
                        for (x, o) in lane.iter().zip(into.iter_mut()) {
                            acc = f(acc, *x);
                            *o = acc;
                        }
                    }
                }),
            }
            return vec![f32::wrap(out)];
        }
        return vec![each_type!(&arrays[0], a => running(region, a, &inits[0], axis, helpers))];
    }
    let mut acc: Vec<Value> = inits.iter().map(|i| broadcast_scalar(i, out_dims)).collect();
    let rank = out_dims.len();
    let size: Vec<usize> = window.window.size.iter().map(|&s| s as usize).collect();
    if size.contains(&0) || out_dims.contains(&0) {
        return acc;
    }
    let in_dims = arrays[0].shape().to_vec();
    let mut offset = vec![0usize; rank];
    loop {
        // Where each output index reads along each dimension at this window offset.
        let sources: Vec<Vec<Option<usize>>> =
            (0..rank).map(|d| (0..out_dims[d]).map(|j| window.source(d, j, offset[d], in_dims[d])).collect()).collect();
        let shifted: Vec<Value> = arrays
            .iter()
            .zip(inits)
            .map(|(a, init)| each_type!(a, a => gather(a, first(arr(init)), &sources, out_dims)))
            .collect();
        let params: Vec<ValueRef<'_>> = acc.iter().chain(&shifted).map(Value::view).collect();
        let next = apply(region, &params, helpers);
        drop(params);
        acc = next;
        // The next window offset, in row-major order.
        let mut d = rank;
        loop {
            if d == 0 {
                return acc;
            }
            d -= 1;
            offset[d] += 1;
            if offset[d] < size[d] {
                break;
            }
            offset[d] = 0;
        }
    }
}

fn to_u64(dims: &[usize]) -> Vec<u64> {
    dims.iter().map(|&d| d as u64).collect()
}

/// The reducer's one operation, when it is `acc op x` on `f32` for a sum, product,
/// maximum or minimum.
fn plain_f32(region: &Region) -> Option<BinaryOp> {
    let [step] = region.steps.as_slice() else { return None };
    let plain = region.params == [DType::F32, DType::F32]
        && step.dtype == DType::F32
        && step.operands == [RegionValue::Parameter(0), RegionValue::Parameter(1)]
        && region.results == [RegionValue::Step(0)];
    match step.op {
        Op::Binary(op @ (BinaryOp::Add | BinaryOp::Multiply | BinaryOp::Maximum | BinaryOp::Minimum)) if plain => {
            Some(op)
        }
        _ => None,
    }
}

/// Whether the reducer combining `init` with itself gives `init` again, bit for bit
/// (0 under addition, 1 under multiplication, −∞ under maximum, …).
fn settles(region: &Region, init: &ValueRef<'_>, helpers: &HostPool) -> bool {
    let combined = apply(region, &[init.clone(), init.clone()], helpers);
    let bytes = |v: &ValueRef<'_>| {
        let mut out = vec![0u8; v.shape().iter().product::<usize>() * v.dtype().size_bytes() as usize];
        v.write_le_bytes(&mut out);
        out
    };
    combined.len() == 1 && bytes(&combined[0].view()) == bytes(init)
}

/// The running reduction `f` along each row of `x` (rows of `len` elements, one after
/// another) into `out`, from `init`. Four rows go at once: their running values do
/// not depend on each other, so their steps overlap, where one row's steps wait each
/// for the one before (more rows than four, 4 KiB apart as rows of 1,024 are, would
/// share more cache lines of one set than it holds). Each row still takes its
/// elements in order: its bits are those of a row at a time.
fn scan_rows(x: &[f32], out: &mut [f32], len: usize, init: f32, f: impl Fn(f32, f32) -> f32) {
    const ROWS: usize = 4;
    let block = ROWS * len;
    let mut blocks = x.chunks_exact(block).zip(out.chunks_exact_mut(block));
    for (x, out) in &mut blocks {
        let mut acc = [init; ROWS];
        for j in 0..len {
            for (k, acc) in acc.iter_mut().enumerate() {
                *acc = f(*acc, x[k * len + j]);
                out[k * len + j] = *acc;
            }
        }
    }
    let done = x.len() / block * block;
    for (x, out) in x[done..].chunks_exact(len).zip(out[done..].chunks_exact_mut(len)) {
        let mut acc = init;
        for (&x, o) in x.iter().zip(out) {
            acc = f(acc, x);
            *o = acc;
        }
    }
}

/// The running reduction `f` along the middle dimension of `x`, seen as
/// `[outer, len, inner]` (row-major), into `out`, from `init`: each step combines
/// `inner` contiguous elements with the step before's, in the order of one element at
/// a time along the dimension, so the same bits.
fn scan_blocks(x: &[f32], out: &mut [f32], len: usize, inner: usize, init: f32, f: impl Fn(f32, f32) -> f32) {
    let block = len * inner;
    for (x, out) in x.chunks_exact(block).zip(out.chunks_exact_mut(block)) {
        let (first, mut rest) = out.split_at_mut(inner);
        first.iter_mut().zip(&x[..inner]).for_each(|(o, &x)| *o = f(init, x));
        let mut previous: &[f32] = first;
        for x in x[inner..].chunks_exact(inner) {
            let (step, after) = rest.split_at_mut(inner);
            step.iter_mut().zip(previous).zip(x).for_each(|((o, &p), &x)| *o = f(p, x));
            (previous, rest) = (step, after);
        }
    }
}

/// The running reduction of `a` along `axis`, from `init`: one reducer step per
/// element along it, each over every other dimension at once.
fn running<T: Element>(
    region: &Region,
    a: &ndarray::ArrayViewD<'_, T>,
    init: &ValueRef<'_>,
    axis: usize,
    helpers: &HostPool,
) -> ArrayD<T> {
    let mut out = ArrayD::from_elem(a.raw_dim(), T::default());
    let slice_dims: Vec<usize> = a.shape().iter().enumerate().filter(|&(d, _)| d != axis).map(|(_, &n)| n).collect();
    let mut acc = broadcast_scalar(init, &slice_dims);
    for j in 0..a.shape()[axis] {
        let params = [acc.view(), T::wrap_view(a.index_axis(Axis(axis), j))];
        let next = apply(region, &params, helpers).swap_remove(0);
        drop(params);
        out.index_axis_mut(Axis(axis), j).assign(arr::<T>(&next.view()));
        acc = next;
    }
    out
}

/// The array of `out_dims` whose element at `j` is `a`'s at `sources[d][j[d]]` along
/// every dimension `d` (`fill` where one is `None`): walked in row-major order, a run of
/// the last dimension at a time, from offsets into `a`'s elements.
fn gather<T: Element>(
    a: &ndarray::ArrayViewD<'_, T>,
    fill: T,
    sources: &[Vec<Option<usize>>],
    out_dims: &[usize],
) -> ArrayD<T> {
    let a = a.as_standard_layout();
    let data = a.as_slice().unwrap_or_else(|| unvalidated("a standard-layout copy"));
    let rank = out_dims.len();
    let mut stride = 1;
    let mut offsets: Vec<Vec<Option<usize>>> = vec![Vec::new(); rank];
    for d in (0..rank).rev() {
        offsets[d] = sources[d].iter().map(|s| s.map(|i| i * stride)).collect();
        stride *= a.shape()[d];
    }
    let total: usize = out_dims.iter().product();
    let mut out = Vec::with_capacity(total);
    match offsets.split_last() {
        None => out.push(data.first().copied().unwrap_or(fill)),
        Some(_) if total == 0 => {}
        Some((last, outer)) => {
            let mut index = vec![0usize; outer.len()];
            loop {
                let base = outer.iter().zip(&index).try_fold(0, |base, (o, &i)| o[i].map(|o| base + o));
                match base {
                    Some(base) => out.extend(last.iter().map(|o| o.map_or(fill, |o| data[base + o]))),
                    None => out.extend(std::iter::repeat_n(fill, last.len())),
                }
                // The next outer index, in row-major order.
                let Some(d) = (0..outer.len()).rev().find(|&d| index[d] + 1 < out_dims[d]) else { break };
                index[d] += 1;
                index[d + 1..].fill(0);
            }
        }
    }
    ArrayD::from_shape_vec(IxDyn(out_dims), out).unwrap_or_else(|_| unvalidated("reduce-window"))
}
