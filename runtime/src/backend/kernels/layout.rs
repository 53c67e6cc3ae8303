//! Layout kernels: broadcast, reshape, transpose, slice, concatenate, reverse and pad.

use ndarray::{ArrayD, ArrayViewD, Axis, IxDyn, Slice, Zip};

use super::*;
use crate::backend::element::{Element, with_element};
use crate::backend::{Value, ValueRef};

/// Operand dimension `i` becomes output dimension `map[i]`.
pub(super) fn broadcast<T: Copy>(a: &ArrayViewD<'_, T>, map: &[u32], out_dims: &[usize]) -> ArrayD<T> {
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

pub(super) fn reshape<T: Clone>(a: &ArrayViewD<'_, T>, dims: &[usize]) -> ArrayD<T> {
    match a.to_shape(IxDyn(dims)) {
        Ok(v) => v.into_owned(),
        Err(_) => unvalidated("reshape"),
    }
}

pub(super) fn transpose<T: Copy>(a: &ArrayViewD<'_, T>, perm: &[u32]) -> ArrayD<T> {
    let perm: Vec<usize> = perm.iter().map(|&p| p as usize).collect();
    materialize(&a.view().permuted_axes(IxDyn(&perm)))
}

pub(super) fn slice<T: Copy>(a: &ArrayViewD<'_, T>, start: &[u64], limit: &[u64], stride: &[u64]) -> ArrayD<T> {
    materialize(&a.slice_each_axis(|ax| {
        let i = ax.axis.index();
        Slice::new(start[i] as isize, Some(limit[i] as isize), stride[i] as isize)
    }))
}

/// A row-major copy of a view of any strides (a transposition, a broadcast, a strided
/// slice). ndarray's element iterator steps through the dynamic index one element at a
/// time; `Zip` walks the innermost axis as a plain strided loop.
pub(super) fn materialize<T: Copy>(view: &ArrayViewD<'_, T>) -> ArrayD<T> {
    if view.is_standard_layout() {
        return view.to_owned();
    }
    if let Some(out) = transposed(view) {
        return out;
    }
    let mut out = ArrayD::uninit(view.raw_dim());
    Zip::from(&mut out).and(view).for_each(|o, &x| {
        o.write(x);
    });
    // SAFETY: `Zip` visited every element of `out` (same shape as `view`) once.
    unsafe { out.assume_init() }
}

/// The side of the square tiles [`transposed`] copies.
const TILE: usize = 16;

/// A row-major copy of a view of contiguous memory whose innermost axis is not its
/// contiguous one (a transposition that moves the last axis, as attention's heads and
/// a product's gradients do), tile by tile: along the innermost axis the source is
/// read a stride apart, and a tile of 16 × 16 reads each of its source's cache lines
/// once instead of once per element. `None` for any other view.
fn transposed<T: Copy>(view: &ArrayViewD<'_, T>) -> Option<ArrayD<T>> {
    let (shape, strides) = (view.shape(), view.strides());
    let rank = shape.len();
    let data = view.as_slice_memory_order()?;
    let last = rank.checked_sub(1)?;
    if strides.iter().any(|&s| s < 0) || shape.contains(&0) || strides[last] == 1 {
        return None;
    }
    // The output axis whose source elements are adjacent.
    let q = (0..last).find(|&d| strides[d] == 1 && shape[d] > 1)?;
    let stride = |d: usize| strides[d] as usize;
    let out_strides = row_major_strides(shape);
    let outer: Vec<usize> = (0..last).filter(|&d| d != q).collect();
    let mut out = vec![data[0]; shape.iter().product()];
    let mut index = vec![0usize; outer.len()];
    loop {
        let from = outer.iter().zip(&index).map(|(&d, &i)| i * stride(d)).sum::<usize>();
        let to = outer.iter().zip(&index).map(|(&d, &i)| i * out_strides[d]).sum::<usize>();
        for i0 in (0..shape[q]).step_by(TILE) {
            for j0 in (0..shape[last]).step_by(TILE) {
                for i in i0..(i0 + TILE).min(shape[q]) {
                    let row = &mut out[to + i * out_strides[q]..][j0..(j0 + TILE).min(shape[last])];
                    for (j, o) in (j0..).zip(row) {
                        *o = data[from + i + j * stride(last)];
                    }
                }
            }
        }
        // The next index of the outer axes, the last fastest.
        let Some(k) = (0..outer.len()).rev().find(|&k| index[k] + 1 < shape[outer[k]]) else { break };
        index[k] += 1;
        index[k + 1..].fill(0);
    }
    ArrayD::from_shape_vec(IxDyn(shape), out).ok()
}

pub(super) fn concatenate(operands: &[ValueRef<'_>], dim: usize) -> Value {
    fn join<T: Element>(operands: &[ValueRef<'_>], dim: usize) -> ArrayD<T> {
        let parts: Vec<ArrayViewD<'_, T>> = operands.iter().map(|v| arr::<T>(v).view()).collect();
        ndarray::concatenate(Axis(dim), &parts).unwrap_or_else(|_| unvalidated("concatenate"))
    }
    let first = operands.first().unwrap_or_else(|| unvalidated("concatenate"));
    with_element!(first.dtype(), T => T::wrap(join::<T>(operands, dim)))
}

pub(super) fn reverse<T: Clone>(a: &ArrayViewD<'_, T>, axes: &[u32]) -> ArrayD<T> {
    let mut view = a.view();
    for &axis in axes {
        view.invert_axis(Axis(axis as usize));
    }
    view.as_standard_layout().into_owned()
}

/// XLA `pad`: operand element `i` of an axis lands at `low + i * (interior + 1)`; those
/// that land outside the output (negative padding) are cropped.
pub(super) fn pad<T: Clone>(
    a: &ArrayViewD<'_, T>,
    value: T,
    low: &[i64],
    interior: &[u64],
    out_dims: &[usize],
) -> ArrayD<T> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every permutation of the axes of arrays of rank 2 to 4, with sides past a tile
    /// and not a multiple of one: the tiled copy gives the elements in row-major order.
    #[test]
    fn transposed_copies_give_every_permutation_in_row_major_order() {
        for shape in [vec![37, 19], vec![3, 17, 20], vec![2, 5, 33, 4]] {
            let n: usize = shape.iter().product();
            let a = ArrayD::from_shape_vec(IxDyn(&shape), (0..n as u32).collect()).expect("shape");
            let rank = shape.len();
            let mut perm: Vec<usize> = (0..rank).collect();
            // Heap's algorithm: every permutation of the axes.
            let mut counters = vec![0usize; rank];
            let mut i = 0;
            let mut seen = 0;
            loop {
                let view = a.view().permuted_axes(IxDyn(&perm));
                let expected: Vec<u32> = view.iter().copied().collect();
                let copy = materialize(&view);
                assert_eq!(copy.shape(), view.shape(), "{shape:?} by {perm:?}");
                assert_eq!(copy.iter().copied().collect::<Vec<_>>(), expected, "{shape:?} by {perm:?}");
                seen += 1;
                while i < rank && counters[i] >= i {
                    counters[i] = 0;
                    i += 1;
                }
                if i == rank {
                    break;
                }
                perm.swap(if i % 2 == 0 { 0 } else { counters[i] }, i);
                counters[i] += 1;
                i = 1;
            }
            assert_eq!(seen, (1..=rank).product::<usize>(), "{shape:?}");
        }
    }
}
