//! Selection: `TopK`, the `k` largest (or smallest) elements of each row and their
//! positions.
//!
//! Elements are ordered as XLA:CPU orders them: floats by their total order (NaN above
//! infinity, `-0.0` below `0.0`, a negative NaN below everything), integers by value,
//! and equal elements by position, lower first.

use std::cmp::Ordering;

use ndarray::{ArrayD, Axis, IxDyn};

use super::*;

/// The `k` largest (`largest`) or smallest elements along the last dimension of `a`,
/// and their positions as `s32`.
pub(super) fn top_k(a: &ValueRef<'_>, k: usize, largest: bool) -> (Value, Value) {
    with_element!(a.dtype(), T => {
        let (values, indices) = top_k_of::<T>(arr::<T>(a), k, largest);
        (T::wrap(values), Value::S32(indices))
    })
}

fn top_k_of<T: Element>(a: &ArrayViewD<'_, T>, k: usize, largest: bool) -> (ArrayD<T>, ArrayD<i32>) {
    let last = a.ndim().saturating_sub(1);
    let mut dims = a.shape().to_vec();
    if let Some(d) = dims.last_mut() {
        *d = k;
    }
    let rows: usize = dims[..last].iter().product();
    let mut values = Vec::with_capacity(rows * k);
    let mut indices = Vec::with_capacity(rows * k);
    let mut order: Vec<usize> = Vec::new();
    for row in a.lanes(Axis(last)) {
        let row: Vec<T> = row.iter().copied().collect();
        order.clear();
        order.extend(0..row.len());
        let before = |&i: &usize, &j: &usize| -> Ordering {
            let by_value = if largest { row[j].total_cmp(&row[i]) } else { row[i].total_cmp(&row[j]) };
            by_value.then(i.cmp(&j))
        };
        if k < row.len() {
            order.select_nth_unstable_by(k, before);
            order.truncate(k);
        }
        order.sort_unstable_by(before);
        values.extend(order.iter().map(|&i| row[i]));
        indices.extend(order.iter().map(|&i| i as i32));
    }
    let shape = IxDyn(&dims);
    let values = ArrayD::from_shape_vec(shape.clone(), values).unwrap_or_else(|_| unvalidated("top-k values"));
    let indices = ArrayD::from_shape_vec(shape, indices).unwrap_or_else(|_| unvalidated("top-k indices"));
    (values, indices)
}
