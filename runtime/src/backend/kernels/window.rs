//! `ReduceWindow`: pooling, cumulative sums and products, and any other reduction
//! over sliding windows.
//!
//! The reduction runs window element by window element over the whole output at once:
//! for each position in the window, the elements every window sees there (or the
//! initial value, where that position falls into padding or a hole of the dilated
//! array) form one array of the output's shape, and the reducer combines it into the
//! accumulated values, element-wise. The order is XLA's: the initial value first, then
//! the window's elements in row-major order, so float sums round as XLA's do.

use ndarray::{ArrayD, IxDyn};

use super::region::{apply, broadcast_scalar};
use super::{arr, each_type, first};
use crate::backend::element::{Element, with_element};
use crate::backend::{Value, ValueRef};
use crate::isa::{DilatedWindow, Region};
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

fn gather<T: Element>(
    a: &ndarray::ArrayViewD<'_, T>,
    fill: T,
    sources: &[Vec<Option<usize>>],
    out_dims: &[usize],
) -> ArrayD<T> {
    let mut index = vec![0usize; out_dims.len()];
    ArrayD::from_shape_fn(IxDyn(out_dims), |ix| {
        for (d, source) in sources.iter().enumerate() {
            match source[ix[d]] {
                Some(i) => index[d] = i,
                None => return fill,
            }
        }
        a[IxDyn(&index)]
    })
}
