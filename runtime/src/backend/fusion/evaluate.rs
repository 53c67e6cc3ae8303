//! Evaluating a fused group ([`run`]): tiles of [`TILE`] elements across idle compute
//! slots, broadcast operands read in place, each member timed per tile.

use super::*;

/// A tile of one operand or result: `TILE` or fewer values, or one value for all.
#[derive(Clone, Copy)]
pub(in crate::backend) enum Lane<'t> {
    Slice(&'t [f32]),
    Scalar(f32),
}

#[inline(always)]
pub(super) fn map1(out: &mut [f32], a: Lane<'_>, f: impl Fn(f32) -> f32) -> Option<f32> {
    match a {
        Lane::Scalar(x) => Some(f(x)),
        Lane::Slice(x) => {
            for (o, &x) in out.iter_mut().zip(x) {
                *o = f(x);
            }
            None
        }
    }
}

#[inline(always)]
pub(super) fn map2(out: &mut [f32], a: Lane<'_>, b: Lane<'_>, f: impl Fn(f32, f32) -> f32) -> Option<f32> {
    match (a, b) {
        (Lane::Scalar(x), Lane::Scalar(y)) => return Some(f(x, y)),
        (Lane::Slice(x), Lane::Slice(y)) => {
            for ((o, &x), &y) in out.iter_mut().zip(x).zip(y) {
                *o = f(x, y);
            }
        }
        (Lane::Slice(x), Lane::Scalar(y)) => {
            for (o, &x) in out.iter_mut().zip(x) {
                *o = f(x, y);
            }
        }
        (Lane::Scalar(x), Lane::Slice(y)) => {
            for (o, &y) in out.iter_mut().zip(y) {
                *o = f(x, y);
            }
        }
    }
    None
}

/// Three operands: the loop is specialised for each mix of tiles and single values,
/// so that it vectorises.
#[inline(always)]
pub(super) fn map3(
    out: &mut [f32],
    a: Lane<'_>,
    b: Lane<'_>,
    c: Lane<'_>,
    f: impl Fn(f32, f32, f32) -> f32,
) -> Option<f32> {
    use Lane::{Scalar as V, Slice as S};
    match (a, b, c) {
        (V(x), V(y), V(z)) => return Some(f(x, y, z)),
        (S(x), S(y), S(z)) => {
            for (((o, &x), &y), &z) in out.iter_mut().zip(x).zip(y).zip(z) {
                *o = f(x, y, z);
            }
        }
        (S(x), S(y), V(z)) => {
            for ((o, &x), &y) in out.iter_mut().zip(x).zip(y) {
                *o = f(x, y, z);
            }
        }
        (S(x), V(y), S(z)) => {
            for ((o, &x), &z) in out.iter_mut().zip(x).zip(z) {
                *o = f(x, y, z);
            }
        }
        (V(x), S(y), S(z)) => {
            for ((o, &y), &z) in out.iter_mut().zip(y).zip(z) {
                *o = f(x, y, z);
            }
        }
        (S(x), V(y), V(z)) => {
            for (o, &x) in out.iter_mut().zip(x) {
                *o = f(x, y, z);
            }
        }
        (V(x), S(y), V(z)) => {
            for (o, &y) in out.iter_mut().zip(y) {
                *o = f(x, y, z);
            }
        }
        (V(x), V(y), S(z)) => {
            for (o, &z) in out.iter_mut().zip(z) {
                *o = f(x, y, z);
            }
        }
    }
    None
}

pub(super) fn lane_bool(x: bool) -> f32 {
    if x { 1.0 } else { 0.0 }
}

/// Computes one member on one tile: into `out`, or as one value when every operand is.
#[inline(always)]
pub(in crate::backend) fn compute(kernel: &Kernel, operands: &[Lane<'_>], out: &mut [f32]) -> Option<f32> {
    match (kernel, operands) {
        (Kernel::Pass, [a]) => match a {
            Lane::Scalar(x) => Some(*x),
            Lane::Slice(x) => {
                out.copy_from_slice(x);
                None
            }
        },
        (Kernel::Binary(b), [x, y]) => with_binary_f32!(*b, f => map2(out, *x, *y, f)),
        (Kernel::Unary(u), [x]) => with_unary_f32!(*u, f => map1(out, *x, f)),
        (Kernel::Not, [x]) => map1(out, *x, |x| 1.0 - x),
        (Kernel::Activation(ActivationFn::Tanh), [Lane::Slice(x)]) => {
            tanh_into(out, x);
            None
        }
        (Kernel::Activation(a), [x]) => {
            let scalar = with_activation!(*a, f => map1(out, *x, f));
            match (exact_trig(*a), *x) {
                (Some(exact), Lane::Scalar(x)) if beyond_trig_limit(x) => Some(exact(x)),
                (Some(exact), Lane::Slice(x)) => {
                    for (o, &x) in out.iter_mut().zip(x) {
                        if beyond_trig_limit(x) {
                            *o = exact(x);
                        }
                    }
                    scalar
                }
                _ => scalar,
            }
        }
        (Kernel::Round { format, saturate }, [x]) => with_rounding!(*format, *saturate, f => map1(out, *x, f)),
        (Kernel::ToPred, [x]) => map1(out, *x, |x| lane_bool(x != 0.0)),
        // Plain float comparisons have HLO's unordered semantics: NaN is only "not equal".
        (Kernel::Compare { direction, total_order: false }, [x, y]) => match direction {
            CompareDirection::Eq => map2(out, *x, *y, |x, y| lane_bool(x == y)),
            CompareDirection::Ne => map2(out, *x, *y, |x, y| lane_bool(x != y)),
            CompareDirection::Lt => map2(out, *x, *y, |x, y| lane_bool(x < y)),
            CompareDirection::Le => map2(out, *x, *y, |x, y| lane_bool(x <= y)),
            CompareDirection::Gt => map2(out, *x, *y, |x, y| lane_bool(x > y)),
            CompareDirection::Ge => map2(out, *x, *y, |x, y| lane_bool(x >= y)),
        },
        (Kernel::Compare { direction, total_order: true }, [x, y]) => {
            map2(out, *x, *y, |x, y| lane_bool(compare_scalars(*direction, true, x, y)))
        }
        (Kernel::Select, [p, x, y]) => map3(out, *p, *x, *y, |p, x, y| if p != 0.0 { x } else { y }),
        (Kernel::Clamp, [lo, x, hi]) => map3(out, *lo, *x, *hi, |lo, x, hi| min_f32(max_f32(x, lo), hi)),
        // The tile is one row; folded as the whole-array kernel folds each row.
        (Kernel::Reduce(op), [x, Lane::Scalar(init)]) => with_reduce_f32!(*op, f => Some(match *x {
            Lane::Slice(x) => fold_lanes(x, *init, f),
            Lane::Scalar(v) => {
                out.fill(v);
                fold_lanes(out, *init, f)
            }
        })),
        _ => unvalidated("fused element-wise"),
    }
}

/// A group input during one run: its elements as `f32` lanes.
pub(super) struct InputData<'a> {
    data: Cow<'a, [f32]>,
    input: &'a Input,
}

/// One thread's share of a run: the elements `start..end`, the output slices covering
/// them, and each member's ticks.
pub(super) struct Part<'o> {
    start: usize,
    end: usize,
    outs: Vec<OutSlice<'o>>,
    ticks: Vec<u64>,
}

/// Where a group output is written: one slice per output, covering a part's elements.
pub(super) enum OutSlice<'o> {
    F32(&'o mut [f32]),
    Pred(&'o mut [bool]),
}

/// Runs `group` over the values in `operand` (indexed by buffer), writing the outputs
/// into `destination` where given (`f32` outputs with tensor memory) or arrays from
/// `new_f32` (of the length asked for; every element is overwritten).
/// Returns the outputs (by buffer) and each member's share of the compute time in
/// ticks.
pub(in crate::backend) fn run<'s, 'd>(
    group: &Group,
    operand: impl Fn(u32) -> Option<ValueRef<'s>>,
    mut destination: impl FnMut(u32) -> Option<Destination<'d>>,
    mut new_f32: impl FnMut(usize) -> Vec<f32>,
    helpers: &HostPool,
) -> (Vec<(u32, Output<'d>)>, Vec<u64>) {
    let n: usize = group.dims.iter().product();
    let inputs: Vec<InputData<'_>> = group
        .inputs
        .iter()
        .map(|input| {
            let value = operand(input.buffer).unwrap_or_else(|| unvalidated("fused operand"));
            // Element iterators over dynamic-rank views are slow; go through slices.
            let data = match value {
                ValueRef::F32(a) => match a.to_slice() {
                    Some(s) => Cow::Borrowed(s),
                    None => Cow::Owned(a.as_standard_layout().as_slice().unwrap_or_default().to_vec()),
                },
                ValueRef::Pred(a) => {
                    let a = a.as_standard_layout();
                    Cow::Owned(a.as_slice().unwrap_or_default().iter().map(|&x| lane_bool(x)).collect())
                }
                _ => unvalidated("fused operand type"),
            };
            InputData { data, input }
        })
        .collect();

    enum Store<'d> {
        Dest(&'d mut [f32]),
        F32(Vec<f32>),
        Pred(Vec<bool>),
    }
    let mut stores: Vec<Store<'d>> = group
        .outputs
        .iter()
        .zip(group.output_lengths())
        .map(|(&(_, b, pred), len)| match (pred, destination(b)) {
            (false, Some(Destination(words))) => Store::Dest(words),
            (false, None) => Store::F32(new_f32(len)),
            (true, _) => Store::Pred(vec![false; len]),
        })
        .collect();

    let work = n * group.members.len();
    let lent = helpers.lend(if work >= 2 * PARALLEL_MIN_WORK { work / PARALLEL_MIN_WORK - 1 } else { 0 });
    let threads = lent.threads().min(n.div_ceil(TILE)).max(1);
    // Runs of whole 64-byte lines, so that no two threads write one cache line; of
    // whole rows where tiles are rows (whatever their length, `TILE` included).
    let chunk = match group.tiles_are_rows() {
        true => n.div_ceil(threads).next_multiple_of(group.tile).max(group.tile),
        false => n.div_ceil(threads).next_multiple_of(16).max(16),
    };
    let mut parts: Vec<Part<'_>> = (0..n.div_ceil(chunk))
        .map(|i| Part {
            start: i * chunk,
            end: n.min((i + 1) * chunk),
            outs: Vec::new(),
            ticks: vec![0; group.members.len()],
        })
        .collect();
    for (store, &(m, ..)) in stores.iter_mut().zip(&group.outputs) {
        // A per-row value has one element for each row (each tile) of the part.
        let chunk = if group.members[m].per_row { chunk / group.tile } else { chunk };
        let chunk = chunk.max(1);
        let pieces: Vec<OutSlice<'_>> = match store {
            Store::Dest(words) => words.chunks_mut(chunk).map(OutSlice::F32).collect(),
            Store::F32(v) => v.chunks_mut(chunk).map(OutSlice::F32).collect(),
            Store::Pred(v) => v.chunks_mut(chunk).map(OutSlice::Pred).collect(),
        };
        for (part, piece) in parts.iter_mut().zip(pieces) {
            part.outs.push(piece);
        }
    }
    let inputs = &inputs;
    // Each part runs compiled for the widest vector instructions this CPU has (the
    // kernels are inlined into it), chosen at run time.
    lent.run(parts.iter_mut().collect(), |part| vectorized(RunPart((group, inputs.as_slice(), part))));
    let mut shares = vec![0u64; group.members.len()];
    for part in &parts {
        for (s, t) in shares.iter_mut().zip(&part.ticks) {
            *s += t;
        }
    }
    drop(parts);

    let outputs = group
        .outputs
        .iter()
        .zip(stores)
        .zip(&group.output_dims)
        .map(|((&(_, b, _), store), dims)| {
            let dims = IxDyn(dims);
            let value = match store {
                Store::Dest(words) => {
                    let words: &'d [f32] = words;
                    Output::Written(ValueRef::F32(
                        ArrayViewD::from_shape(dims.clone(), words).unwrap_or_else(|_| unvalidated("output")),
                    ))
                }
                Store::F32(v) => Output::Value(Value::F32(
                    ArrayD::from_shape_vec(dims.clone(), v).unwrap_or_else(|_| unvalidated("output")),
                )),
                Store::Pred(v) => Output::Value(Value::Pred(
                    ArrayD::from_shape_vec(dims.clone(), v).unwrap_or_else(|_| unvalidated("output")),
                )),
            };
            (b, value)
        })
        .collect();
    (outputs, shares)
}

/// Where an input's tile is: in the input itself, one value, or assembled in scratch.
#[derive(Clone, Copy)]
pub(super) enum At {
    Data(usize),
    Scalar(f32),
    Assembled,
}

/// Copies the elements `at..at + out.len()` of a row-read input into `out`, row segment
/// by row segment; returns where the tile is when it lies within one row and needs no
/// copy.
pub(super) fn assemble(
    group: &Group,
    data: &[f32],
    row_strides: &[usize],
    lane_stride: usize,
    at: usize,
    out: &mut [f32],
) -> At {
    let row_len = group.row_len.max(1);
    let tile = out.len();
    let mut pos = 0;
    while pos < tile {
        let flat = at + pos;
        let (mut row, col) = (flat / row_len, flat % row_len);
        let len = (row_len - col).min(tile - pos);
        let mut base = col * lane_stride;
        for (&extent, &stride) in group.row_dims.iter().zip(row_strides).rev() {
            base += (row % extent) * stride;
            row /= extent;
        }
        match lane_stride {
            0 if len == tile => return At::Scalar(data[base]),
            1 if len == tile => return At::Data(base),
            0 => out[pos..pos + len].fill(data[base]),
            1 => out[pos..pos + len].copy_from_slice(&data[base..base + len]),
            _ => {
                for (k, x) in out[pos..pos + len].iter_mut().enumerate() {
                    *x = data[base + k * lane_stride];
                }
            }
        }
        pos += len;
    }
    At::Assembled
}

vectorized_job!(
    /// `run_part`, vectorised.
    RunPart<'a, 'i, 'p, 'o> ((&'a Group, &'a [InputData<'i>], &'p mut Part<'o>)) -> () = run_part
);

/// Runs every tile of a part, adding each member's ticks to the part's.
#[inline(always)]
pub(super) fn run_part((group, inputs, part): (&Group, &[InputData<'_>], &mut Part<'_>)) {
    let Part { start, end, outs, ticks: member_ticks } = part;
    let (start, end) = (*start, *end);
    let members = group.members.len();
    // Tiles of a part shorter than a tile are as long as the part: a small group (a loop
    // body's) does not allocate and clear whole tiles.
    let stride = group.tile.min(end - start).max(1);
    // Reading the clock after every member of a short tile would cost more than some
    // members do: shorter tiles are timed one in so many, about once per `TILE`
    // elements (the shares are proportions, and tiles of one group cost alike).
    let timed_every = (TILE / stride).max(1);
    let mut scratch = vec![0.0f32; members * stride];
    let mut assembled = vec![0.0f32; inputs.len() * stride];
    let mut places = vec![At::Assembled; inputs.len()];
    let mut scalars: Vec<Option<f32>> = vec![None; members];
    let mut output_of = vec![None; members];
    for (o, &(m, ..)) in group.outputs.iter().enumerate() {
        output_of[m] = Some(o);
    }
    // Where tiles are whole rows, the row each one is, by dimension, stepped along
    // like an odometer (dividing the element index at every tile would cost more than
    // a short row's arithmetic).
    let by_rows = group.tiles_are_rows();
    let mut row = vec![0; group.row_dims.len()];
    let mut first = start / group.row_len.max(1);
    for (index, &extent) in row.iter_mut().zip(&group.row_dims).rev() {
        *index = first % extent.max(1);
        first /= extent.max(1);
    }
    let mut at = start;
    for index in 0.. {
        if at >= end {
            break;
        }
        let tile = stride.min(end - at);
        let timed = index % timed_every == 0;
        let mut before = if timed { ticks() } else { 0 };

        // Where each input's tile is (assembling the row-read ones).
        for ((place, input), scratch) in places.iter_mut().zip(inputs).zip(assembled.chunks_mut(stride)) {
            *place = match &input.input.reads {
                Reads::Flat => At::Data(at),
                Reads::Scalar => At::Scalar(input.data[0]),
                Reads::Rows { row_strides, lane_stride } if by_rows => {
                    let base: usize = row.iter().zip(row_strides).map(|(i, s)| i * s).sum();
                    match lane_stride {
                        0 => At::Scalar(input.data[base]),
                        1 => At::Data(base),
                        _ => {
                            for (k, x) in scratch[..tile].iter_mut().enumerate() {
                                *x = input.data[base + k * lane_stride];
                            }
                            At::Assembled
                        }
                    }
                }
                Reads::Rows { row_strides, lane_stride } => {
                    assemble(group, &input.data, row_strides, *lane_stride, at, &mut scratch[..tile])
                }
            };
        }
        if by_rows {
            for (index, &extent) in row.iter_mut().zip(&group.row_dims).rev() {
                *index += 1;
                if *index < extent {
                    break;
                }
                *index = 0;
            }
        }
        let lane = |i: usize| match places[i] {
            At::Data(offset) => Lane::Slice(&inputs[i].data[offset..offset + tile]),
            At::Scalar(v) => Lane::Scalar(v),
            At::Assembled => Lane::Slice(&assembled[i * stride..i * stride + tile]),
        };

        for (k, member) in group.members.iter().enumerate() {
            if !member.runs {
                continue;
            }
            // Earlier members' tiles, and this member's.
            let (done, rest) = scratch.split_at_mut(k * stride);
            let out = &mut rest[..tile];
            let mut operands = [Lane::Scalar(0.0); 3];
            for (operand, source) in operands.iter_mut().zip(&member.reads) {
                *operand = match *source {
                    Source::Input(i) => lane(i),
                    Source::Member(m) => match scalars[m] {
                        Some(v) => Lane::Scalar(v),
                        None => Lane::Slice(&done[m * stride..m * stride + tile]),
                    },
                };
            }
            scalars[k] = compute(&member.kernel, &operands[..member.operands.len()], out);
            if let Some(o) = output_of[k] {
                if member.per_row {
                    // One value per row, the tile's.
                    let (row, value) = ((at - start) / stride, scalars[k].unwrap_or(out[0]));
                    match &mut outs[o] {
                        OutSlice::F32(dest) => dest[row] = value,
                        OutSlice::Pred(dest) => dest[row] = value != 0.0,
                    }
                } else {
                    let offset = at - start;
                    match (&mut outs[o], scalars[k]) {
                        (OutSlice::F32(dest), Some(v)) => dest[offset..offset + tile].fill(v),
                        (OutSlice::F32(dest), None) => dest[offset..offset + tile].copy_from_slice(out),
                        (OutSlice::Pred(dest), Some(v)) => dest[offset..offset + tile].fill(v != 0.0),
                        (OutSlice::Pred(dest), None) => {
                            for (d, &x) in dest[offset..offset + tile].iter_mut().zip(out.iter()) {
                                *d = x != 0.0;
                            }
                        }
                    }
                }
            }
            if timed {
                let now = ticks();
                member_ticks[k] += now - before;
                before = now;
            }
        }
        at += tile;
    }
}
