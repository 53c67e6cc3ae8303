//! Reducers that pick one of their operands, as an arg-max or arg-min does: a region
//! made only of comparisons between the two elements of one array, boolean logic and
//! selects, whose every result is one array's element from one side or the other.
//!
//! What such a region returns depends only on how the two elements of each array
//! compare (less, equal, greater, unordered, under IEEE and total order), not on the
//! values themselves. So the region is evaluated once, on every combination of those
//! relations (a few hundred pairs, as whole arrays), into a table from the relations to
//! the side each result takes; a reduction then combines elements by looking the table
//! up, with no array operation per step, in XLA's order: the initial value, then each
//! element in turn (the general path's tree order would keep a later NaN of two, where
//! `jnp.argmax` gives the first). A jitted `argmax` of 128 elements took 7 passes of 13
//! element-wise operations on that path.

use std::cell::RefCell;
use std::rc::Rc;

use ndarray::{ArrayD, IxDyn};

use super::region::{apply, rows_by_columns};
use super::{arr, to_usize, unvalidated};
use crate::backend::element::{Element, with_element};
use crate::backend::{Value, ValueRef};
use crate::dtype::{ArrayType, DType, DTypeClass};
use crate::isa::{BinaryOp, Op, Region, RegionValue, UnaryOp};
use crate::pool::HostPool;

/// Bits of the relation between two elements of one array.
const RELATION_BITS: u32 = 7;
/// Most arrays a picking reducer may combine (the table has `2^(7n)` entries).
const MOST_ARRAYS: usize = 2;
/// A table entry no test case reached: the reduction falls back to the general path.
const UNKNOWN: u8 = u8::MAX;

/// How `a` and `b` relate: less, equal, greater (IEEE), `a` NaN, `b` NaN, less and
/// equal under the total order.
fn relation<T: Element>(a: T, b: T) -> u8 {
    #[allow(clippy::eq_op)]
    let (a_nan, b_nan) = (a != a, b != b);
    let total = a.total_cmp(&b);
    u8::from(a < b)
        | u8::from(a == b) << 1
        | u8::from(a > b) << 2
        | u8::from(a_nan) << 3
        | u8::from(b_nan) << 4
        | u8::from(total.is_lt()) << 5
        | u8::from(total.is_eq()) << 6
}

/// Elements that realise every relation between two elements of `dtype`.
fn representatives<T: Element>() -> Vec<T> {
    if T::DTYPE.class() == DTypeClass::Float {
        [f32::NEG_INFINITY, -1.0, -0.0, 0.0, 1.0, f32::INFINITY, f32::NAN, -f32::NAN].map(T::from_f32).to_vec()
    } else {
        [0.0, 1.0, 2.0].map(T::from_f32).to_vec()
    }
}

/// [`representatives`] of `dtype`, as a vector.
fn representatives_of(dtype: DType) -> Value {
    with_element!(dtype, T => {
        let elements = representatives::<T>();
        let shape = IxDyn(&[elements.len()]);
        T::wrap(ArrayD::from_shape_vec(shape, elements).unwrap_or_else(|_| unvalidated("representatives")))
    })
}

/// A picking reducer's table: entry `key` (the arrays' relations, 7 bits each) has bit
/// `j` set when result `j` takes the second side's element (parameter `j + n`), or is
/// [`UNKNOWN`].
#[derive(Debug)]
struct Picker {
    arrays: usize,
    table: Vec<u8>,
    /// The arg-max or arg-min the table is, when it is one (of an `f32` and an `s32`).
    arg: Option<ArgPick>,
}

/// JAX's arg-max and arg-min reducers, as comparisons at each step in place of the
/// table's look-up (a chain of relations and a load a step, 8 ns an element): the
/// accumulator keeps its value when it is the greater (the less) or NaN, and its index
/// when, besides, the values are equal and its index is the lower. Used only where the
/// table says exactly this for every relation (`ArgPick::of`).
#[derive(Debug, Clone, Copy, PartialEq)]
enum ArgPick {
    Max,
    Min,
}

impl ArgPick {
    /// Whether the accumulator `(value, index)` keeps its value and its index against
    /// the element `(v, i)`.
    #[inline(always)]
    fn keeps(self, (value, index): (f32, i32), (v, i): (f32, i32)) -> (bool, bool) {
        let beats = match self {
            ArgPick::Max => value > v,
            ArgPick::Min => value < v,
        };
        #[allow(clippy::eq_op)]
        let keeps_value = beats || value != value;
        (keeps_value, keeps_value || (value == v && index < i))
    }

    /// The reducer `table` (of an `f32` and an `s32` array) is, if either: checked on
    /// every pair of representatives, which realise every relation the table knows
    /// (where the two elements are identical, either side gives the same result).
    fn of(table: &[u8]) -> Option<ArgPick> {
        let (values, indices) = (representatives::<f32>(), representatives::<i32>());
        [ArgPick::Max, ArgPick::Min].into_iter().find(|&pick| {
            values.iter().all(|&value| {
                values.iter().all(|&v| {
                    indices.iter().all(|&index| {
                        indices.iter().all(|&i| {
                            let key =
                                usize::from(relation(value, v)) | usize::from(relation(index, i)) << RELATION_BITS;
                            let (keeps_value, keeps_index) = pick.keeps((value, index), (v, i));
                            let takes = u8::from(!keeps_value) | u8::from(!keeps_index) << 1;
                            // Of two identical elements the table records neither side.
                            let differ = u8::from(value.total_cmp(&v).is_ne()) | u8::from(index != i) << 1;
                            table[key] != UNKNOWN && (table[key] ^ takes) & differ == 0
                        })
                    })
                })
            })
        })
    }
}

/// Whether `region`'s shape allows it to be a picking reducer of `n` arrays: parameters
/// `j` and `j + n` of one type, only comparisons between them, boolean logic and
/// selects, no constants, and each result `j` a select tree over parameters `j` and
/// `j + n`.
fn picks_only(region: &Region) -> Option<usize> {
    let n = region.params.len() / 2;
    if n == 0 || n > MOST_ARRAYS || region.params.len() != 2 * n || region.results.len() != n {
        return None;
    }
    if (0..n).any(|j| region.params[j] != region.params[j + n]) {
        return None;
    }
    let array_of = |v: &RegionValue| match *v {
        RegionValue::Parameter(p) => Some(p as usize % n),
        _ => None,
    };
    for step in &region.steps {
        let operands = step.operands.as_slice();
        if operands.iter().any(|v| matches!(v, RegionValue::Constant { .. })) {
            return None;
        }
        let fits = match &step.op {
            Op::Compare { .. } => match operands {
                [a, b] => array_of(a).zip(array_of(b)).is_some_and(|(a, b)| a == b),
                _ => false,
            },
            Op::Binary(BinaryOp::And | BinaryOp::Or | BinaryOp::Xor) | Op::Unary(UnaryOp::Not) => {
                step.dtype == DType::Pred
            }
            Op::Select => operands.len() == 3,
            _ => false,
        };
        if !fits {
            return None;
        }
    }
    // Each result is array `j`'s element from one side: a tree of selects whose leaves
    // are parameters `j` and `j + n`.
    fn leaves_of(region: &Region, v: &RegionValue, j: usize, n: usize, depth: usize) -> bool {
        match *v {
            RegionValue::Parameter(p) => p as usize % n == j,
            RegionValue::Step(s) if depth < 64 => match region.steps.get(s as usize) {
                Some(step) if step.op == Op::Select => {
                    step.operands[1..].iter().all(|o| leaves_of(region, o, j, n, depth + 1))
                }
                _ => false,
            },
            _ => false,
        }
    }
    region.results.iter().enumerate().all(|(j, r)| leaves_of(region, r, j, n, 0)).then_some(n)
}

impl Picker {
    /// The table of `region`, evaluated on every pair of representatives of each array
    /// (`None`: not a picking reducer, or its results do not follow the relations).
    fn of(region: &Region, helpers: &HostPool) -> Option<Picker> {
        let n = picks_only(region)?;
        // The test cases: every combination, over the arrays, of a pair of
        // representatives; array `j`'s first and second elements as parameters j, j + n.
        let reps: Vec<Value> = (0..n).map(|j| representatives_of(region.params[j])).collect();
        let counts: Vec<usize> = reps.iter().map(|r| r.view().shape()[0]).collect();
        let cases: usize = counts.iter().map(|c| c * c).product();
        // Case `c`'s pair of representatives of array `j`: digits of `c` in mixed radix.
        let pair = |c: usize, j: usize| {
            let below: usize = counts[..j].iter().map(|c| c * c).product();
            let digit = c / below % (counts[j] * counts[j]);
            (digit / counts[j], digit % counts[j])
        };
        let side = |first: bool| -> Vec<Value> {
            (0..n)
                .map(|j| {
                    let positions: Vec<usize> = (0..cases)
                        .map(|c| {
                            let (a, b) = pair(c, j);
                            if first { a } else { b }
                        })
                        .collect();
                    gather(&reps[j].view(), &positions)
                })
                .collect()
        };
        let (first, second) = (side(true), side(false));
        let params: Vec<ValueRef<'_>> = first.iter().chain(&second).map(Value::view).collect();
        let results = apply(region, &params, helpers);
        let mut table = vec![UNKNOWN; 1 << (RELATION_BITS as usize * n)];
        // Which results' sides each entry has settled (the others took equal elements).
        let mut settled = vec![0u8; table.len()];
        for c in 0..cases {
            let mut key = 0usize;
            let mut takes_second = 0u8;
            let mut either = 0u8;
            for j in 0..n {
                let (a, b) = (first[j].view(), second[j].view());
                key |= usize::from(relation_at(&a, &b, c, c)) << (RELATION_BITS as usize * j);
                let result = results[j].view();
                match (same_bits(&result, c, &a, c), same_bits(&result, c, &b, c)) {
                    (true, true) => either |= 1 << j,
                    (true, false) => {}
                    (false, true) => takes_second |= 1 << j,
                    (false, false) => return None,
                }
            }
            let definite = ((1u8 << n) - 1) & !either;
            let (entry, known) = (&mut table[key], &mut settled[key]);
            if *entry == UNKNOWN {
                *entry = takes_second & definite;
            } else if (*entry ^ takes_second) & definite & *known != 0 {
                // The same relations, another pick: the region looks at more than them.
                return None;
            } else {
                *entry |= takes_second & definite;
            }
            *known |= definite;
        }
        let pair = region.params.len() == 4 && region.params[..2] == [DType::F32, DType::S32];
        let arg = if pair { ArgPick::of(&table) } else { None };
        Some(Picker { arrays: n, table, arg })
    }
}

/// `a[i]` and `b[k]`'s relation (arrays of one type).
fn relation_at(a: &ValueRef<'_>, b: &ValueRef<'_>, i: usize, k: usize) -> u8 {
    with_element!(a.dtype(), T => relation(flat::<T>(a)[i], flat::<T>(b)[k]))
}

/// The elements of a value in standard layout.
fn flat<'v, T: Element>(v: &'v ValueRef<'_>) -> &'v [T] {
    arr::<T>(v).as_slice().unwrap_or_else(|| unvalidated("an array in standard layout"))
}

/// Whether `x[i]` and `y[k]` are the same element, bit for bit (NaNs of one sign
/// compare equal to each other, so a pick between them is told by the total order).
fn same_bits(x: &ValueRef<'_>, i: usize, y: &ValueRef<'_>, k: usize) -> bool {
    with_element!(x.dtype(), T => flat::<T>(x)[i].total_cmp(&flat::<T>(y)[k]).is_eq())
}

fn gather(v: &ValueRef<'_>, positions: &[usize]) -> Value {
    with_element!(v.dtype(), T => {
        let a = flat::<T>(v);
        let taken: Vec<T> = positions.iter().map(|&p| a[p]).collect();
        T::wrap(ArrayD::from_shape_vec(IxDyn(&[taken.len()]), taken).unwrap_or_else(|_| unvalidated("gather")))
    })
}

thread_local! {
    /// The regions met lately on this thread, and their tables (`None`: not picking).
    static PICKERS: RefCell<Vec<(Region, Option<Rc<Picker>>)>> = const { RefCell::new(Vec::new()) };
}

/// How many regions each thread remembers.
const REMEMBERED: usize = 16;

fn picker(region: &Region, helpers: &HostPool) -> Option<Rc<Picker>> {
    if let Some(known) = PICKERS.with_borrow(|p| p.iter().find(|(r, _)| r == region).map(|(_, t)| t.clone())) {
        return known;
    }
    let found = Picker::of(region, helpers).map(Rc::new);
    PICKERS.with_borrow_mut(|p| {
        if p.len() == REMEMBERED {
            p.remove(0);
        }
        p.push((region.clone(), found.clone()));
    });
    found
}

/// `ReduceRegion` by a picking reducer: result `result` of reducing `operands` (the
/// arrays, then their initial values) over `axes`, in XLA's order; `None` when `region`
/// is not a picking reducer (or meets relations its table lacks), for the general path.
pub(super) fn reduce(
    region: &Region,
    axes: &[u32],
    result: usize,
    operands: &[ValueRef<'_>],
    out: &ArrayType,
    helpers: &HostPool,
) -> Option<Value> {
    let picker = picker(region, helpers)?;
    let n = picker.arrays;
    let (arrays, inits) = operands.split_at(n);
    let shape = arrays[0].shape().to_vec();
    let kept: Vec<usize> = (0..shape.len()).filter(|d| !axes.contains(&(*d as u32))).collect();
    let rows: usize = kept.iter().map(|&d| shape[d]).product();
    let columns: usize = axes.iter().map(|&d| shape[d as usize]).product();
    let perm: Vec<usize> = kept.iter().copied().chain(axes.iter().map(|&d| d as usize)).collect();
    // JAX's arg-max and arg-min over the trailing axes of arrays laid out row by row:
    // the elements read in place, and the picks carried as values, not positions.
    if let ([ValueRef::F32(values), ValueRef::S32(indices)], [init_value, init_index]) = (arrays, inits)
        && perm.iter().enumerate().all(|(k, &d)| k == d)
        && let (Some(values), Some(indices)) = (values.as_slice(), indices.as_slice())
    {
        let init = (super::first(arr::<f32>(init_value)), super::first(arr::<i32>(init_index)));
        let pairs = (values, indices);
        let (values, indices) = match picker.arg {
            Some(pick) => pick_pairs(pairs, init, columns, |accumulator, element| {
                let (keeps_value, keeps_index) = pick.keeps(accumulator, element);
                Some((!keeps_value, !keeps_index))
            })?,
            None => pick_pairs(pairs, init, columns, |(value, index), (v, i)| {
                let key = usize::from(relation(value, v)) | usize::from(relation(index, i)) << RELATION_BITS;
                let entry = picker.table[key];
                (entry != UNKNOWN).then_some((entry & 1 != 0, entry & 2 != 0))
            })?,
        };
        let dims = IxDyn(&to_usize(&out.dims));
        return Some(match result {
            0 => Value::F32(unvalidated_shape(ArrayD::from_shape_vec(dims, values))),
            _ => Value::S32(unvalidated_shape(ArrayD::from_shape_vec(dims, indices))),
        });
    }
    // Each array flattened to [rows, columns], with its initial value after the last.
    let joined: Vec<Value> = arrays
        .iter()
        .zip(inits)
        .map(|(a, init)| {
            with_element!(a.dtype(), T => {
                let (mut elements, _) = rows_by_columns(arr::<T>(a), &perm, rows, columns).into_raw_vec_and_offset();
                elements.push(super::first(arr::<T>(init)));
                T::wrap(ArrayD::from_shape_vec(IxDyn(&[elements.len()]), elements).unwrap_or_else(|_| unvalidated("reduce")))
            })
        })
        .collect();
    let views: Vec<ValueRef<'_>> = joined.iter().map(Value::view).collect();
    let found = |entry: u8| (entry != UNKNOWN).then_some(entry);
    let chosen = match views.as_slice() {
        // JAX's arg-max and arg-min: values and their indices, without a call per
        // element.
        [values @ ValueRef::F32(_), indices @ ValueRef::S32(_)] => {
            let (values, indices) = (flat::<f32>(values), flat::<i32>(indices));
            let relate = |a: &[u32; MOST_ARRAYS], b: &[u32; MOST_ARRAYS]| {
                let (i, k) = ((a[0] as usize, b[0] as usize), (a[1] as usize, b[1] as usize));
                let key = usize::from(relation(values[i.0], values[i.1]))
                    | usize::from(relation(indices[k.0], indices[k.1])) << RELATION_BITS;
                found(picker.table[key])
            };
            choose(rows, columns, n, result, relate)?
        }
        _ => {
            let relations: Vec<Box<dyn Fn(u32, u32) -> u8 + '_>> = views.iter().map(relation_of).collect();
            let relate = |a: &[u32; MOST_ARRAYS], b: &[u32; MOST_ARRAYS]| {
                let key = (0..n)
                    .fold(0usize, |key, j| key | usize::from(relations[j](a[j], b[j])) << (RELATION_BITS as usize * j));
                found(picker.table[key])
            };
            choose(rows, columns, n, result, relate)?
        }
    };
    let dims = IxDyn(&to_usize(&out.dims));
    Some(with_element!(views[result].dtype(), T => {
        let elements = flat::<T>(&views[result]);
        let picked: Vec<T> = chosen.iter().map(|&p| elements[p as usize]).collect();
        T::wrap(ArrayD::from_shape_vec(dims, picked).unwrap_or_else(|_| unvalidated("reduce")))
    }))
}

/// For each of `rows` rows of `columns` elements (of `n` arrays joined, the initial
/// values last), the position of the element that `pick` keeps in array `result`; `pick`
/// says which arrays of the accumulator (first side) take the element (second side).
/// XLA's order: the initial value, then each element in turn, the accumulator on the
/// first side (so of two NaNs the first stays). `None` where `pick` meets relations its
/// table lacks.
fn choose(
    rows: usize,
    columns: usize,
    n: usize,
    result: usize,
    pick: impl Fn(&[u32; MOST_ARRAYS], &[u32; MOST_ARRAYS]) -> Option<u8>,
) -> Option<Vec<u32>> {
    let init = (rows * columns) as u32;
    let mut chosen = vec![0u32; rows];
    for (r, chosen) in chosen.iter_mut().enumerate() {
        let mut acc = [init; MOST_ARRAYS];
        for e in (r * columns) as u32..((r + 1) * columns) as u32 {
            let entry = pick(&acc, &[e; MOST_ARRAYS])?;
            for (j, acc) in acc.iter_mut().enumerate().take(n) {
                if entry & (1 << j) != 0 {
                    *acc = e;
                }
            }
        }
        *chosen = acc[result];
    }
    Some(chosen)
}

/// An array of the picked elements, or the general path's complaint.
fn unvalidated_shape<T>(a: Result<ArrayD<T>, ndarray::ShapeError>) -> ArrayD<T> {
    a.unwrap_or_else(|_| unvalidated("reduce"))
}

/// [`choose`] for an `f32` and an `s32` array of whole rows of `columns`: each row's
/// picks, carried from `init` through the row's elements in order, as values.
/// `takes(accumulator, element)` says whether the value and the index take the
/// element's; `None` from it (a relation the table lacks) ends the reduction.
#[inline(always)]
fn pick_pairs(
    (values, indices): (&[f32], &[i32]),
    init: (f32, i32),
    columns: usize,
    takes: impl Fn((f32, i32), (f32, i32)) -> Option<(bool, bool)>,
) -> Option<(Vec<f32>, Vec<i32>)> {
    let rows = values.len().checked_div(columns).unwrap_or(0);
    let (mut picked_values, mut picked_indices) = (Vec::with_capacity(rows), Vec::with_capacity(rows));
    for r in 0..rows {
        let (mut value, mut index) = init;
        let row = r * columns..(r + 1) * columns;
        for (&v, &i) in values[row.clone()].iter().zip(&indices[row]) {
            let (takes_value, takes_index) = takes((value, index), (v, i))?;
            if takes_index {
                index = i;
            }
            if takes_value {
                value = v;
            }
        }
        picked_values.push(value);
        picked_indices.push(index);
    }
    Some((picked_values, picked_indices))
}

/// The relation between two positions of a flat array.
fn relation_of<'v>(v: &'v ValueRef<'_>) -> Box<dyn Fn(u32, u32) -> u8 + 'v> {
    with_element!(v.dtype(), T => {
        let elements: &'v [T] = flat::<T>(v);
        let relate: Box<dyn Fn(u32, u32) -> u8 + 'v> =
            Box::new(move |i: u32, k: u32| relation(elements[i as usize], elements[k as usize]));
        relate
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::{CompareDirection, RegionStep};

    fn param(p: u32) -> RegionValue {
        RegionValue::Parameter(p)
    }
    fn step(s: u32) -> RegionValue {
        RegionValue::Step(s)
    }
    fn compare(direction: CompareDirection, a: RegionValue, b: RegionValue) -> RegionStep {
        RegionStep { op: Op::Compare { direction, total_order: false }, operands: vec![a, b], dtype: DType::Pred }
    }
    fn binary(op: BinaryOp, a: RegionValue, b: RegionValue) -> RegionStep {
        RegionStep { op: Op::Binary(op), operands: vec![a, b], dtype: DType::Pred }
    }
    fn select(p: RegionValue, a: RegionValue, b: RegionValue, dtype: DType) -> RegionStep {
        RegionStep { op: Op::Select, operands: vec![p, a, b], dtype }
    }

    /// JAX's arg-max reducer: (value, index) pairs; the greater value wins, NaN wins,
    /// and of equal values the lower index.
    fn argmax() -> Region {
        use CompareDirection::*;
        Region {
            params: vec![DType::F32, DType::S32, DType::F32, DType::S32],
            steps: vec![
                compare(Gt, param(0), param(2)),                 // 0
                compare(Ne, param(0), param(0)),                 // 1
                binary(BinaryOp::Or, step(0), step(1)),          // 2
                select(step(2), param(0), param(2), DType::F32), // 3
                compare(Eq, param(0), param(2)),                 // 4
                compare(Lt, param(1), param(3)),                 // 5
                binary(BinaryOp::And, step(4), step(5)),         // 6
                binary(BinaryOp::Or, step(2), step(6)),          // 7
                select(step(7), param(1), param(3), DType::S32), // 8
            ],
            results: vec![step(3), step(8)],
        }
    }

    /// The arg-max of each row of `values` (`[rows, n]`) by the table, as indices.
    fn arg_max(values: &[f32], rows: usize, n: usize) -> Vec<i32> {
        let helpers = HostPool::new(1);
        let a = ndarray::ArrayD::from_shape_vec(IxDyn(&[rows, n]), values.to_vec()).expect("a shape");
        let index = ndarray::ArrayD::from_shape_fn(IxDyn(&[rows, n]), |i| i[1] as i32);
        let (init_v, init_i) = (ndarray::arr0(f32::NEG_INFINITY).into_dyn(), ndarray::arr0(0i32).into_dyn());
        let operands = [Value::F32(a), Value::S32(index), Value::F32(init_v), Value::S32(init_i)];
        let views: Vec<ValueRef<'_>> = operands.iter().map(Value::view).collect();
        let out = ArrayType::new(DType::S32, vec![rows as u64]);
        match reduce(&argmax(), &[1], 1, &views, &out, &helpers).expect("a picking reducer") {
            Value::S32(i) => i.iter().copied().collect(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_arg_max_by_table_picks_the_first_greatest_or_the_first_nan() {
        let nan = f32::NAN;
        let rows = [
            [1.0, 3.0, -0.0, 3.0, 0.0, nan, 2.0, nan],
            [-1.0, -0.0, 0.0, -0.0, -5.0, -0.0, 0.0, -2.0],
            [f32::NEG_INFINITY; 8],
            [1.0, 1.0, 7.0, 7.0, -nan, 7.0, nan, 0.0],
        ];
        let values: Vec<f32> = rows.iter().flatten().copied().collect();
        // Equal zeros of either sign tie: the first; all -inf: the initial value's index.
        assert_eq!(arg_max(&values, 4, 8), [5, 1, 0, 4]);
    }

    /// Both results of the arg-max reduction of `values`, as bits and indices: along
    /// the rows of `[rows, n]` (elements read in place) or, `transposed`, along the
    /// columns of its transposition `[n, rows]` (elements gathered into rows first).
    fn arg_max_both(values: &[f32], rows: usize, n: usize, transposed: bool) -> (Vec<u32>, Vec<i32>) {
        let helpers = HostPool::new(1);
        let a = ndarray::ArrayD::from_shape_vec(IxDyn(&[rows, n]), values.to_vec()).expect("a shape");
        let index = ndarray::ArrayD::from_shape_fn(IxDyn(&[rows, n]), |i| (i[1] as i32 * 7) % 5);
        let (a, index, axis) = match transposed {
            true => (a.t().as_standard_layout().into_owned(), index.t().as_standard_layout().into_owned(), 0),
            false => (a, index, 1),
        };
        let (init_v, init_i) = (ndarray::arr0(-3.0f32).into_dyn(), ndarray::arr0(2i32).into_dyn());
        let operands = [Value::F32(a), Value::S32(index), Value::F32(init_v), Value::S32(init_i)];
        let views: Vec<ValueRef<'_>> = operands.iter().map(Value::view).collect();
        let run = |result: usize, dtype: DType| {
            let out = ArrayType::new(dtype, vec![rows as u64]);
            reduce(&argmax(), &[axis], result, &views, &out, &helpers).expect("a picking reducer")
        };
        match (run(0, DType::F32), run(1, DType::S32)) {
            (Value::F32(v), Value::S32(i)) => (v.iter().map(|x| x.to_bits()).collect(), i.iter().copied().collect()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn rows_read_in_place_pick_what_gathered_rows_pick() {
        // Many ties (zeros of both signs among them), with NaNs in a few rows only.
        let choices = [1.0, -3.0, 3.0, -0.0, 0.0, 3.0, f32::NEG_INFINITY, 2.5, 0.0];
        for (rows, n) in [(1, 1), (3, 17), (8, 128), (5, 3)] {
            let mut values: Vec<f32> = (0..rows * n).map(|k| choices[(k * 7 + k / 3) % choices.len()]).collect();
            if rows > 2 {
                values[n + n / 2] = f32::NAN;
                values[2 * n + n / 3] = -f32::NAN;
            }
            assert_eq!(arg_max_both(&values, rows, n, false), arg_max_both(&values, rows, n, true), "{rows}x{n}");
        }
    }

    #[test]
    fn only_the_arg_max_and_arg_min_tables_are_picked_by_comparisons() {
        use CompareDirection::*;
        let helpers = HostPool::new(1);
        let arg = |region: &Region| Picker::of(region, &helpers).expect("a picking reducer").arg;
        assert_eq!(arg(&argmax()), Some(ArgPick::Max));
        let mut argmin = argmax();
        argmin.steps[0] = compare(Lt, param(0), param(2));
        assert_eq!(arg(&argmin), Some(ArgPick::Min));
        // Of equal values the higher index, or a later NaN: tables of their own.
        let mut last_tie = argmax();
        last_tie.steps[5] = compare(Gt, param(1), param(3));
        assert_eq!(arg(&last_tie), None);
        let mut later_nan = argmax();
        later_nan.steps[1] = compare(Ne, param(2), param(2));
        assert_eq!(arg(&later_nan), None);
    }

    #[test]
    fn a_region_that_reads_a_constant_or_mixes_arrays_is_not_picking() {
        let mut with_constant = argmax();
        with_constant.steps[0].operands[1] = RegionValue::Constant { dtype: DType::F32, bits: 0 };
        assert!(picks_only(&with_constant).is_none());
        let mut mixed = argmax();
        // A value compared with the other array's element.
        mixed.params = vec![DType::F32, DType::F32, DType::F32, DType::F32];
        mixed.steps[5] = compare(CompareDirection::Lt, param(0), param(3));
        assert!(picks_only(&mixed).is_none());
        let mut sums = argmax();
        sums.steps[3] =
            RegionStep { op: Op::Binary(BinaryOp::Add), operands: vec![param(0), param(2)], dtype: DType::F32 };
        assert!(picks_only(&sums).is_none());
        assert_eq!(picks_only(&argmax()), Some(2));
    }
}
