//! `Sort`: one or several arrays sorted together along a dimension by a comparator
//! computation (`jnp.sort`, `argsort`, `lax.sort` by key with payload).
//!
//! The comparator is a region of element-wise steps, so comparisons are evaluated on
//! whole arrays at once: the elements are ordered by a bitonic sorting network, whose
//! every stage compares independent pairs. Each stage evaluates the comparator both
//! ways on all of its pairs, in every row together; pairs the comparator finds equal
//! keep their original order, which makes every sort stable (`is_stable` or not).
//!
//! Most comparators are simpler than that: a `<` or `>` between the same function of
//! each side's elements (JAX's `jnp.sort` and `argsort` compare floats after mapping
//! -0 to 0 and every NaN to one NaN). Such a comparator's function is evaluated once on
//! whole arrays as a key, and each row is sorted by its keys directly: a stable merge
//! sort, which on short rows is an insertion sort.

use ndarray::{ArrayD, IxDyn};

use super::region::{apply, rows_by_columns};
use super::{arr, each_type, unvalidated};
use crate::backend::element::{Element, with_element};
use crate::backend::{Value, ValueRef};
use crate::isa::{CompareDirection, Op, Region, RegionValue};
use crate::pool::HostPool;

/// Marks a slot of the padded network that holds no element; it sorts after all.
const PAD: u32 = u32::MAX;

/// Sorts `operands` (arrays of one shape) along `dim` by `comparator`; returns them
/// permuted alike.
pub(super) fn sort(operands: &[ValueRef<'_>], dim: usize, comparator: &Region, helpers: &HostPool) -> Vec<Value> {
    let shape = operands[0].shape().to_vec();
    let n = shape[dim];
    let others: Vec<usize> = (0..shape.len()).filter(|&d| d != dim).collect();
    let rows: usize = others.iter().map(|&d| shape[d]).product();
    let axes: Vec<usize> = others.iter().copied().chain([dim]).collect();
    let flat: Vec<Value> = operands.iter().map(|a| each_type!(a, a => rows_by_columns(a, &axes, rows, n))).collect();
    let order = match single_comparison(comparator) {
        Some((direction, total_order)) => sort_by_first(&flat[0].view(), rows, n, direction, total_order),
        None => match keyed(comparator) {
            Some((direction, total_order, key)) => {
                // Both sides of each pair are the whole arrays: only the first is read.
                let params: Vec<ValueRef<'_>> = flat.iter().flat_map(|v| [v.view(), v.view()]).collect();
                let keys = apply(&key, &params, helpers);
                sort_by_first(&keys[0].view(), rows, n, direction, total_order)
            }
            None => bitonic(&flat, rows, n, comparator, helpers),
        },
    };
    let positions: Vec<usize> = order.iter().enumerate().map(|(p, &c)| (p / n.max(1)) * n + c as usize).collect();
    // The sorted arrays are [others..., dim]; the inverse of `axes` puts `dim` back.
    let sorted_dims: Vec<usize> = axes.iter().map(|&d| shape[d]).collect();
    let mut inverse = vec![0; axes.len()];
    for (i, &a) in axes.iter().enumerate() {
        inverse[a] = i;
    }
    flat.iter()
        .map(|v| {
            each_type!(&v.view(), a => {
                let taken = take(a, &positions);
                let sorted = ArrayD::from_shape_vec(IxDyn(&sorted_dims), taken).unwrap_or_else(|_| unvalidated("sort"));
                sorted.permuted_axes(IxDyn(&inverse)).as_standard_layout().into_owned()
            })
        })
        .collect()
}

/// `(direction, total_order)` when the comparator is one `<` or `>` between the first
/// array's two elements (parameters 0 and 1).
fn single_comparison(comparator: &Region) -> Option<(CompareDirection, bool)> {
    let [step] = comparator.steps.as_slice() else { return None };
    let Op::Compare { direction, total_order } = step.op else { return None };
    if comparator.results != [RegionValue::Step(0)] {
        return None;
    }
    let flipped = |d| match d {
        CompareDirection::Lt => Some(CompareDirection::Gt),
        CompareDirection::Gt => Some(CompareDirection::Lt),
        _ => None,
    };
    match step.operands.as_slice() {
        [RegionValue::Parameter(0), RegionValue::Parameter(1)] => {
            flipped(direction).and(Some((direction, total_order)))
        }
        [RegionValue::Parameter(1), RegionValue::Parameter(0)] => flipped(direction).map(|d| (d, total_order)),
        _ => None,
    }
}

/// `(direction, total_order, key)` when the comparator is a `<` or `>` between one
/// function of the first elements of the arrays (even parameters) and the same function
/// of the second ones (odd parameters): `key` is the comparator with that function of
/// the first elements as its result.
fn keyed(comparator: &Region) -> Option<(CompareDirection, bool, Region)> {
    let [RegionValue::Step(root)] = comparator.results.as_slice() else { return None };
    let step = comparator.steps.get(*root as usize)?;
    let Op::Compare { direction, total_order } = step.op else { return None };
    let [left, right] = step.operands.as_slice() else { return None };
    let flipped = match direction {
        CompareDirection::Lt => CompareDirection::Gt,
        CompareDirection::Gt => CompareDirection::Lt,
        _ => return None,
    };
    let (key, direction) = if mirrors(comparator, left, right, &mut { MIRROR_BUDGET }) {
        (*left, direction)
    } else if mirrors(comparator, right, left, &mut { MIRROR_BUDGET }) {
        (*right, flipped)
    } else {
        return None;
    };
    let key = Region { params: comparator.params.clone(), steps: comparator.steps.clone(), results: vec![key] };
    Some((direction, total_order, key))
}

/// How many pairs of values [`mirrors`] may visit: a region's steps may share operands,
/// so a walk of its tree could otherwise grow exponentially.
const MIRROR_BUDGET: usize = 4096;

/// Whether `second` computes of the second elements (odd parameters) what `first`
/// computes of the first ones (even parameters), visiting at most `budget` pairs.
fn mirrors(region: &Region, first: &RegionValue, second: &RegionValue, budget: &mut usize) -> bool {
    if *budget == 0 {
        return false;
    }
    *budget -= 1;
    match (*first, *second) {
        (RegionValue::Parameter(p), RegionValue::Parameter(q)) => p % 2 == 0 && q == p + 1,
        (RegionValue::Constant { .. }, RegionValue::Constant { .. }) => first == second,
        (RegionValue::Step(s), RegionValue::Step(t)) if s != t => {
            let (Some(a), Some(b)) = (region.steps.get(s as usize), region.steps.get(t as usize)) else {
                return false;
            };
            a.op == b.op
                && a.dtype == b.dtype
                && a.operands.len() == b.operands.len()
                && a.operands.iter().zip(&b.operands).all(|(x, y)| mirrors(region, x, y, budget))
        }
        _ => false,
    }
}

/// Each row's order (positions of its elements, first to last) by `direction` on the
/// elements of `keys` (`[rows, n]`), equal elements in position order; under IEEE
/// order (not `total_order`), NaNs after every number when ascending.
fn sort_by_first(
    keys: &ValueRef<'_>,
    rows: usize,
    n: usize,
    direction: CompareDirection,
    total_order: bool,
) -> Vec<u32> {
    with_element!(keys.dtype(), T => {
        let keys = arr::<T>(keys);
        let keys = keys.as_slice().unwrap_or_else(|| unvalidated("sort keys in standard layout"));
        let mut order = Vec::with_capacity(rows * n);
        for row in keys.chunks(n.max(1)).take(rows) {
            let mut positions: Vec<u32> = (0..n as u32).collect();
            positions.sort_by(|&a, &b| {
                let (x, y) = (row[a as usize], row[b as usize]);
                // A NaN compares with nothing under IEEE order; taken as equal to every
                // element it would make the order inconsistent (which the standard
                // library's sort may panic on), so NaNs go after every number instead.
                #[allow(clippy::eq_op)]
                let ascending = if total_order {
                    x.total_cmp(&y)
                } else {
                    x.partial_cmp(&y).unwrap_or_else(|| (x != x).cmp(&(y != y)))
                };
                if direction == CompareDirection::Gt { ascending.reverse() } else { ascending }
            });
            order.extend(positions);
        }
        order
    })
}

/// Each row's order by a bitonic network over `n` rounded up to a power of two.
fn bitonic(flat: &[Value], rows: usize, n: usize, comparator: &Region, helpers: &HostPool) -> Vec<u32> {
    let m = n.next_power_of_two();
    let mut slots: Vec<u32> = Vec::with_capacity(rows * m);
    for _ in 0..rows {
        slots.extend((0..m as u32).map(|c| if (c as usize) < n { c } else { PAD }));
    }
    let mut k = 2;
    while k <= m {
        let mut j = k / 2;
        while j >= 1 {
            // The stage's pairs (t, t ^ j), and whether each sorts descending.
            let pairs: Vec<(usize, usize, bool)> =
                (0..m).filter(|&t| (t ^ j) > t).map(|t| (t, t ^ j, t & k != 0)).collect();
            compare_exchange(flat, rows, n, m, &pairs, &mut slots, comparator, helpers);
            j /= 2;
        }
        k *= 2;
    }
    slots.chunks(m).flat_map(|row| row[..n].iter().copied()).collect()
}

/// One stage of the network: for every row and pair, puts the element that sorts
/// first in the pair's first slot (its second, for a descending pair).
#[allow(clippy::too_many_arguments)]
fn compare_exchange(
    flat: &[Value],
    rows: usize,
    n: usize,
    m: usize,
    pairs: &[(usize, usize, bool)],
    slots: &mut [u32],
    comparator: &Region,
    helpers: &HostPool,
) {
    // Pairs of two real elements need the comparator; a pad always sorts last.
    let mut compared: Vec<(usize, usize, bool)> = Vec::new();
    let (mut left, mut right) = (Vec::new(), Vec::new());
    for r in 0..rows {
        for &(t, l, descending) in pairs {
            let (a, b) = (slots[r * m + t], slots[r * m + l]);
            if a == PAD || b == PAD {
                let b_first = a == PAD && b != PAD;
                if b_first != descending {
                    slots.swap(r * m + t, r * m + l);
                }
                continue;
            }
            compared.push((r * m + t, r * m + l, descending));
            left.push(r * n + a as usize);
            right.push(r * n + b as usize);
        }
    }
    if compared.is_empty() {
        return;
    }
    let lhs: Vec<Value> = flat.iter().map(|v| each_type!(&v.view(), a => vector(take(a, &left)))).collect();
    let rhs: Vec<Value> = flat.iter().map(|v| each_type!(&v.view(), a => vector(take(a, &right)))).collect();
    let a_before_b = evaluate(comparator, &lhs, &rhs, helpers);
    let b_before_a = evaluate(comparator, &rhs, &lhs, helpers);
    for (p, &(i, l, descending)) in compared.iter().enumerate() {
        let b_first = b_before_a[p] || (!a_before_b[p] && slots[l] < slots[i]);
        if b_first != descending {
            slots.swap(i, l);
        }
    }
}

/// The comparator on the `first` and `second` elements of each array, pair by pair.
fn evaluate(comparator: &Region, first: &[Value], second: &[Value], helpers: &HostPool) -> Vec<bool> {
    let params: Vec<ValueRef<'_>> = first.iter().zip(second).flat_map(|(a, b)| [a.view(), b.view()]).collect();
    match apply(comparator, &params, helpers).into_iter().next() {
        Some(Value::Pred(p)) => p.into_iter().collect(),
        _ => unvalidated("a sort comparator that does not return pred"),
    }
}

fn take<T: Element>(a: &ndarray::ArrayViewD<'_, T>, positions: &[usize]) -> Vec<T> {
    let a = a.as_slice().unwrap_or_else(|| unvalidated("sort operand in standard layout"));
    positions.iter().map(|&p| a[p]).collect()
}

fn vector<T: Element>(values: Vec<T>) -> ArrayD<T> {
    let n = values.len();
    ArrayD::from_shape_vec(IxDyn(&[n]), values).unwrap_or_else(|_| unvalidated("sort"))
}
