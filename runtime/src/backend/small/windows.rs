//! A small loop's windows of its arrays: dynamic slices copied row by row, and
//! dynamic updates written in place, each from a start clamped as
//! `gather::clamped_starts` clamps it.

use super::{Data, MAX_IN_PLACE_RANK, Step};
use crate::backend::kernels;
use crate::isa::ScatterDims;

impl Step {
    /// A dynamic update whose operand dies here: the operand's array becomes the
    /// result's, and the update is written into it at the clamped start (as
    /// `gather::clamped_starts` clamps). `false`, with nothing changed, for types or
    /// indices other than flat arrays and `s32` scalars.
    pub(super) fn update_in_place(&self, arrays: &mut [Data], shapes: &[Vec<usize>], strides: &[usize]) -> bool {
        let [operand, update, ref indices @ ..] = self.operands[..] else { return false };
        let (dims, sizes) = (&shapes[operand], &shapes[update]);
        let Some(start) = clamped_start(arrays, indices, dims, sizes) else { return false };
        let same_type = matches!(
            (&arrays[operand], &arrays[update]),
            (Data::F32(_), Data::F32(_)) | (Data::S32(_), Data::S32(_)) | (Data::Pred(_), Data::Pred(_))
        );
        if !same_type {
            return false;
        }
        arrays.swap(operand, self.output);
        let Ok([target, source]) = arrays.get_disjoint_mut([self.output, update]) else { return false };
        match (target, &*source) {
            (Data::F32(to), Data::F32(from)) => place(to, from, strides, sizes, &start),
            (Data::S32(to), Data::S32(from)) => place(to, from, strides, sizes, &start),
            (Data::Pred(to), Data::Pred(from)) => place(to, from, strides, sizes, &start),
            _ => kernels::unvalidated("a dynamic update of another type"),
        }
        true
    }
}

/// Whether a scatter of `dims` on `operands` (a vector, indices, an update) replaces one
/// element: a scalar update at the index of a one-element (or scalar) index vector.
pub(super) fn one_element(dims: &ScatterDims, operands: &[usize], shapes: &[Vec<usize>]) -> bool {
    let &[operand, indices, update] = operands else { return false };
    let index_shape = &shapes[indices];
    let one_index = match index_shape.len() {
        0 => dims.index_vector_dim == 0,
        1 => index_shape[0] == 1 && dims.index_vector_dim == 0,
        _ => false,
    };
    one_index
        && shapes[operand].len() == 1
        && shapes[update].is_empty()
        && dims.update_window_dims.is_empty()
        && dims.inserted_window_dims == [0]
        && dims.scatter_dims_to_operand_dims == [0]
        && dims.input_batching_dims.is_empty()
        && dims.scatter_indices_batching_dims.is_empty()
}

impl Step {
    /// A scatter of one element ([`one_element`]) whose operand dies here: the operand's
    /// array becomes the result's, with the update written at the index. `false`, with
    /// nothing changed, for an index outside the vector (the array kernel's case) or
    /// types other than flat arrays and `s32` indices.
    pub(super) fn scatter_in_place(&self, arrays: &mut [Data]) -> bool {
        let [operand, indices, update] = self.operands[..] else { return false };
        let Data::S32(index) = &arrays[indices] else { return false };
        let Some(at) = index.first().and_then(|&i| usize::try_from(i).ok()) else { return false };
        let fits = match (&arrays[operand], &arrays[update]) {
            (Data::F32(to), Data::F32(from)) => at < to.len() && from.len() == 1,
            (Data::S32(to), Data::S32(from)) => at < to.len() && from.len() == 1,
            (Data::Pred(to), Data::Pred(from)) => at < to.len() && from.len() == 1,
            _ => false,
        };
        if !fits {
            return false;
        }
        arrays.swap(operand, self.output);
        let Ok([target, source]) = arrays.get_disjoint_mut([self.output, update]) else { return false };
        match (target, &*source) {
            (Data::F32(to), Data::F32(from)) => to[at] = from[0],
            (Data::S32(to), Data::S32(from)) => to[at] = from[0],
            (Data::Pred(to), Data::Pred(from)) => to[at] = from[0],
            _ => kernels::unvalidated("a scatter of another type"),
        }
        true
    }
}

impl Step {
    /// A dynamic slice copied row by row from the operand at the clamped start (as
    /// `gather::clamped_starts` clamps). `false`, with nothing changed, for types or
    /// indices other than flat arrays and `s32` scalars.
    pub(super) fn slice_rows(&self, arrays: &mut [Data], shapes: &[Vec<usize>], strides: &[usize]) -> bool {
        let [operand, ref indices @ ..] = self.operands[..] else { return false };
        let (dims, sizes) = (&shapes[operand], &shapes[self.output]);
        let Some(start) = clamped_start(arrays, indices, dims, sizes) else { return false };
        // Validation keeps an instruction from reading the buffer it writes.
        let Ok([from, to]) = arrays.get_disjoint_mut([operand, self.output]) else { return false };
        let rows = |run: usize| rows_at(strides, sizes, &start).map(move |at| at..at + run);
        let run = sizes.last().copied().unwrap_or(0);
        match (&*from, to) {
            (Data::F32(from), Data::F32(to)) => {
                to.chunks_exact_mut(run.max(1)).zip(rows(run)).for_each(|(to, at)| to.copy_from_slice(&from[at]))
            }
            (Data::S32(from), Data::S32(to)) => {
                to.chunks_exact_mut(run.max(1)).zip(rows(run)).for_each(|(to, at)| to.copy_from_slice(&from[at]))
            }
            (Data::Pred(from), Data::Pred(to)) => {
                to.chunks_exact_mut(run.max(1)).zip(rows(run)).for_each(|(to, at)| to.copy_from_slice(&from[at]))
            }
            _ => return false,
        }
        true
    }
}

/// The start of a window of `sizes` in an array of `dims` at `indices` (`s32` scalars,
/// one per dimension, at most [`MAX_IN_PLACE_RANK`]), each clamped so that the window
/// fits; `None` for other indices.
fn clamped_start(
    arrays: &[Data],
    indices: &[usize],
    dims: &[usize],
    sizes: &[usize],
) -> Option<[usize; MAX_IN_PLACE_RANK]> {
    if indices.len() != dims.len() || dims.len() != sizes.len() || dims.len() > MAX_IN_PLACE_RANK {
        return None;
    }
    let mut start = [0usize; MAX_IN_PLACE_RANK];
    for ((&b, (&dim, &size)), start) in indices.iter().zip(dims.iter().zip(sizes)).zip(&mut start) {
        let Data::S32(index) = &arrays[b] else { return None };
        *start = i64::from(*index.first()?).clamp(0, dim.saturating_sub(size) as i64) as usize;
    }
    Some(start)
}

/// Where each run of the innermost dimension of a window of `sizes` (at most
/// [`MAX_IN_PLACE_RANK`] dimensions, row-major) starts in an array of `strides`, the
/// window starting at `start`: the window's rows in order, the last outer dimension
/// fastest.
fn rows_at<'a>(strides: &'a [usize], sizes: &'a [usize], start: &'a [usize]) -> impl Iterator<Item = usize> + 'a {
    let last = sizes.len() - 1;
    let count = if sizes[last] == 0 { 0 } else { sizes[..last].iter().product() };
    let mut index = [0usize; MAX_IN_PLACE_RANK];
    (0..count).map(move |_| {
        let at = (0..last).map(|d| (start[d] + index[d]) * strides[d]).sum::<usize>() + start[last];
        if let Some(d) = (0..last).rev().find(|&d| index[d] + 1 < sizes[d]) {
            index[d] += 1;
            index[d + 1..].fill(0);
        }
        at
    })
}

/// Writes `update` (row-major, of `sizes`) into `to` (row-major, of `strides`, at most
/// [`MAX_IN_PLACE_RANK`] dimensions) from `start`, one run of the innermost dimension
/// at a time.
fn place<T: Copy>(to: &mut [T], update: &[T], strides: &[usize], sizes: &[usize], start: &[usize]) {
    let run = sizes[sizes.len() - 1];
    for (row, at) in update.chunks_exact(run.max(1)).zip(rows_at(strides, sizes, start)) {
        to[at..at + run].copy_from_slice(row);
    }
}
