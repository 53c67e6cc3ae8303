//! Indexed kernels: dynamic slices (start indices clamped, as in XLA), gathers and
//! scatters (indices outside the array are `OutOfBounds`, as on the device).

use ndarray::{ArrayD, ArrayViewD, Axis, Dimension, IxDyn, Slice, Zip};

use super::reduce::{reduce_f32, reduce_int, reduce_pred};
use super::*;
use crate::backend::element::{Element, with_element, with_float, with_int};
use crate::backend::{OutOfBounds, Value, ValueRef};
use crate::dtype::DTypeClass;
use crate::isa::{GatherDims, ScatterCombine, ScatterDims};

/// An integer scalar as an index: signed values as they are, unsigned ones capped at
/// `i64::MAX`.
pub(super) fn index_value<T: Element>(x: T) -> i64 {
    match T::DTYPE.class() {
        DTypeClass::Unsigned => x.to_u64().min(i64::MAX as u64) as i64,
        _ => x.to_i64(),
    }
}

/// Dynamic-slice start indices, clamped so that a window of `sizes` fits in `dims`.
pub(super) fn clamped_starts(indices: &[ValueRef<'_>], dims: &[usize], sizes: &[usize]) -> Vec<usize> {
    indices
        .iter()
        .zip(dims.iter().zip(sizes))
        .map(|(v, (&dim, &size))| {
            let i = with_int!(v.dtype(), T => index_value(first(arr::<T>(v))), unvalidated("start index"));
            i.clamp(0, dim.saturating_sub(size) as i64) as usize
        })
        .collect()
}

pub(super) fn window(start: &[usize], sizes: &[usize], axis: usize) -> Slice {
    Slice::from(start[axis]..start[axis] + sizes[axis])
}

/// Gather and scatter indices: one index vector per position of the batch shape.
pub(super) struct IndexRows {
    batch_shape: Vec<usize>,
    vector: usize,
    values: Vec<i64>,
}

impl IndexRows {
    pub(super) fn new(indices: &ValueRef<'_>, index_vector_dim: u32) -> IndexRows {
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

    pub(super) fn row(&self, r: usize) -> &[i64] {
        &self.values[r * self.vector..(r + 1) * self.vector]
    }
}

/// The position of indices dimension `dim` in the batch shape (the index vector
/// dimension taken out).
pub(super) fn batch_position(dim: u32, index_vector_dim: u32) -> usize {
    (if dim > index_vector_dim { dim - 1 } else { dim }) as usize
}

/// Full start coordinates of one gather or scatter window, checked to fit in `dims`.
pub(super) fn window_start(
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

pub(super) fn gather<T: Copy + Default>(
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

pub(super) fn scatter<T: Copy>(
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

pub(super) fn scatter_value(
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
