//! Operations driven by a computation or a window rather than one fixed function:
//! `reduce` with a general reducer (several arrays at once, as an arg-max does), and
//! `select-and-scatter`.

use ndarray::{ArrayD, ArrayViewD, Axis, Dimension, IxDyn, Slice};

use super::reduce::{reduce_f32, reduce_int, reduce_pred};
use super::{arr, compare_scalars, each_type, execute, first, to_usize, unvalidated};
use crate::backend::element::{Element, with_element, with_float, with_int};
use crate::backend::{Value, ValueRef};
use crate::dtype::{ArrayType, DType, DTypeClass};
use crate::isa::{CompareDirection, Region, RegionValue, ScatterCombine, Window};
use crate::pool::HostPool;

/// `ReduceRegion`: reduces `arrays` (then combines with `inits`) over `axes` with the
/// reducer `region`, and returns result number `result`.
///
/// Each array is rearranged to `[kept, reduced]`; halves of the reduced columns are
/// combined pairwise by evaluating the region on whole arrays, so a reduction of `r`
/// elements costs `log2(r)` passes of the region's steps rather than `r` scalar calls.
pub(super) fn reduce_region(
    region: &Region,
    axes: &[u32],
    result: usize,
    operands: &[ValueRef<'_>],
    out: &ArrayType,
    helpers: &HostPool,
) -> Value {
    let n = operands.len() / 2;
    let (arrays, inits) = operands.split_at(n);
    let shape = arrays[0].shape().to_vec();
    let kept: Vec<usize> = (0..shape.len()).filter(|d| !axes.contains(&(*d as u32))).collect();
    let reduced: Vec<usize> = axes.iter().map(|&d| d as usize).collect();
    let rows: usize = kept.iter().map(|&d| shape[d]).product();
    let mut columns: usize = reduced.iter().map(|&d| shape[d]).product();
    let perm: Vec<usize> = kept.iter().chain(&reduced).copied().collect();
    let mut acc: Vec<Value> =
        arrays.iter().map(|a| each_type!(a, a => rows_by_columns(a, &perm, rows, columns))).collect();

    while columns > 1 {
        let half = columns / 2;
        let halves: Vec<Value> = acc
            .iter()
            .map(|v| columns_of(&v.view(), 0, half))
            .chain(acc.iter().map(|v| columns_of(&v.view(), half, 2 * half)))
            .collect();
        let views: Vec<ValueRef<'_>> = halves.iter().map(Value::view).collect();
        let mut combined = apply(region, &views, helpers);
        if columns % 2 == 1 {
            for (c, v) in combined.iter_mut().zip(&acc) {
                let last = columns_of(&v.view(), columns - 1, columns);
                *c = super::concatenate(&[c.view(), last.view()], 1);
            }
        }
        acc = combined;
        columns = half + columns % 2;
    }
    let init_columns: Vec<Value> = inits.iter().map(|i| broadcast_scalar(i, &[rows, 1])).collect();
    let combined = if columns == 0 {
        init_columns
    } else {
        let views: Vec<ValueRef<'_>> = init_columns.iter().chain(&acc).map(Value::view).collect();
        apply(region, &views, helpers)
    };
    let dims = IxDyn(&to_usize(&out.dims));
    each_type!(&combined[result].view(), a => {
        a.to_owned().into_shape_with_order(dims).unwrap_or_else(|_| unvalidated("reduce"))
    })
}

/// `a` with its axes permuted by `perm`, as a standard-layout `[rows, columns]` array.
pub(super) fn rows_by_columns<T: Element>(
    a: &ArrayViewD<'_, T>,
    perm: &[usize],
    rows: usize,
    columns: usize,
) -> ArrayD<T> {
    let permuted = a.view().permuted_axes(IxDyn(perm));
    let flat: Vec<T> = permuted.iter().copied().collect();
    ArrayD::from_shape_vec(IxDyn(&[rows, columns]), flat).unwrap_or_else(|_| unvalidated("reduce"))
}

/// Columns `start..end` of a `[rows, columns]` value.
fn columns_of(v: &ValueRef<'_>, start: usize, end: usize) -> Value {
    each_type!(v, a => a.slice_axis(Axis(1), Slice::from(start..end)).to_owned())
}

/// A scalar value repeated to `dims`.
pub(super) fn broadcast_scalar(scalar: &ValueRef<'_>, dims: &[usize]) -> Value {
    each_type!(scalar, a => ArrayD::from_elem(IxDyn(dims), first(a)))
}

/// Evaluates `region` element-wise on `params` (arrays of one shape); returns its results.
pub(super) fn apply(region: &Region, params: &[ValueRef<'_>], helpers: &HostPool) -> Vec<Value> {
    let dims = params[0].shape().to_vec();
    let constant = |dtype: DType, bits: u64| -> Value {
        let size = dtype.size_bytes() as usize;
        let scalar = Value::from_le_bytes(&ArrayType::new(dtype, vec![]), &bits.to_le_bytes()[..size]);
        broadcast_scalar(&scalar.view(), &dims)
    };
    let mut steps: Vec<Value> = Vec::with_capacity(region.steps.len());
    for step in &region.steps {
        let constants: Vec<Option<Value>> = step
            .operands
            .iter()
            .map(|v| match *v {
                RegionValue::Constant { dtype, bits } => Some(constant(dtype, bits)),
                _ => None,
            })
            .collect();
        let operands: Vec<ValueRef<'_>> = step
            .operands
            .iter()
            .zip(&constants)
            .map(|(v, c)| match (*v, c) {
                (_, Some(c)) => c.view(),
                (RegionValue::Parameter(p), None) => params[p as usize].view(),
                (RegionValue::Step(s), None) => steps[s as usize].view(),
                (RegionValue::Constant { .. }, None) => unvalidated("reducer constant"),
            })
            .collect();
        let ty = ArrayType::new(step.dtype, dims.iter().map(|&d| d as u64).collect());
        // Element-wise operations never index, so they cannot fail.
        let value = execute(&step.op, &operands, &ty, helpers).unwrap_or_else(|_| unvalidated("reducer step"));
        drop(operands);
        steps.push(value);
    }
    region
        .results
        .iter()
        .map(|v| match *v {
            RegionValue::Parameter(p) => params[p as usize].to_owned(),
            RegionValue::Step(s) => steps[s as usize].clone(),
            RegionValue::Constant { dtype, bits } => constant(dtype, bits),
        })
        .collect()
}

/// `SelectAndScatter`.
pub(super) fn select_and_scatter(
    window: &Window,
    select: CompareDirection,
    total_order: bool,
    combine: ScatterCombine,
    operand: &ValueRef<'_>,
    source: &ValueRef<'_>,
    init: &ValueRef<'_>,
) -> Value {
    fn run<T: Element>(
        window: &Window,
        keep: impl Fn(T, T) -> bool,
        combine: impl Fn(T, T) -> T,
        operand: &ArrayViewD<'_, T>,
        source: &ArrayViewD<'_, T>,
        init: T,
    ) -> ArrayD<T> {
        let dims = operand.shape();
        let mut out = ArrayD::from_elem(IxDyn(dims), init);
        let size = to_usize(&window.size);
        let offsets: Vec<Vec<usize>> = ndarray::indices(IxDyn(&size)).into_iter().map(|w| w.slice().to_vec()).collect();
        let mut position = vec![0usize; dims.len()];
        for (s, &value) in source.indexed_iter() {
            let mut selected: Option<(T, Vec<usize>)> = None;
            for w in &offsets {
                let inside = (0..dims.len()).all(|d| {
                    let p = (s[d] as u64 * window.stride[d] + w[d] as u64).checked_sub(window.pad_low[d]);
                    match p {
                        Some(p) if p < dims[d] as u64 => {
                            position[d] = p as usize;
                            true
                        }
                        _ => false,
                    }
                });
                if !inside {
                    continue;
                }
                let candidate = operand[position.as_slice()];
                match &selected {
                    Some((current, _)) if keep(*current, candidate) => {}
                    _ => selected = Some((candidate, position.clone())),
                }
            }
            if let Some((_, at)) = selected {
                let o = &mut out[at.as_slice()];
                *o = combine(*o, value);
            }
        }
        out
    }
    macro_rules! go {
        ($t:ty, $combine:expr) => {{
            let init = first(arr::<$t>(init));
            let keep = move |a: $t, b: $t| compare_scalars(select, total_order, a, b);
            <$t>::wrap(run(window, keep, $combine, arr::<$t>(operand), arr::<$t>(source), init))
        }};
    }
    let dtype = operand.dtype();
    match (combine, dtype.class()) {
        (ScatterCombine::Replace, _) => with_element!(dtype, T => go!(T, |_, u| u)),
        (ScatterCombine::Reduce(op), DTypeClass::Float) => {
            let f = reduce_f32(op);
            with_float!(dtype, T => go!(T, move |x: T, u: T| T::from_f32(f(x.to_f32(), u.to_f32()))),
                unvalidated("select-and-scatter"))
        }
        (ScatterCombine::Reduce(op), DTypeClass::Signed | DTypeClass::Unsigned) => {
            with_int!(dtype, T => go!(T, reduce_int::<T>(op)), unvalidated("select-and-scatter"))
        }
        (ScatterCombine::Reduce(op), DTypeClass::Pred) => go!(bool, reduce_pred(op)),
    }
}
