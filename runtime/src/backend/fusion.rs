//! Fusion of element-wise chains: several `f32` / `pred` element-wise instructions of
//! one shape run together, tile by tile, instead of one whole-array pass each.
//!
//! A chain such as `divide → select → subtract → exponential` over a large array costs
//! one read and one write of the whole array per instruction when run one by one, plus
//! a materialised array for every broadcast it reads. Fused, each tile of about a
//! thousand elements goes through every instruction while it is in the first-level
//! cache, broadcasts are read in place (a row of the operand, or one scalar per row),
//! and only the values that something after the group reads are written out.
//!
//! Nothing about the program changes: the same instructions run, with the same
//! numerics (every kernel here computes element by element exactly as its
//! whole-array counterpart in `kernels`). The executable only reorders instructions
//! that do not depend on each other so that a group's members are adjacent, and times
//! each member per tile, so that the device trace still shows every original
//! instruction with its share of the group's time.
//!
//! Values inside a group are `f32` lanes; a `pred` value is held as `0.0` or `1.0`.

use std::borrow::Cow;

use ndarray::{ArrayD, ArrayViewD, IxDyn};

use super::kernels::{
    compare_scalars, exp_f32, max_f32, min_f32, round_mantissa, round_to_format, sign_f32, unvalidated, vectorized,
    vectorized_job, with_activation, with_binary_f32, with_rounding, with_unary_f32,
};
use super::{Destination, Output, Value, ValueRef};
use crate::dtype::DType;
use crate::isa::{ActivationFn, BinaryOp, CompareDirection, FloatFormat, Instruction, Op, Program, UnaryOp};
use crate::pool::HostPool;
use neuron_datastore::clock::ticks;

/// Elements per tile: each member's tile (4 KiB) stays in the first-level cache while
/// the next member reads it.
const TILE: usize = 1024;

/// Groups with an operand read in rows (a broadcast along some dimensions) shorter than
/// this are not fused: assembling its tiles row by row would outweigh the gain.
const MIN_ROW: usize = 32;

/// The most instructions in one group, which bounds the scratch memory per thread.
const MAX_MEMBERS: usize = 64;

/// Fused work of at least this many element operations (elements × members) is split
/// across idle compute slots.
const PARALLEL_MIN_WORK: usize = 1 << 18;

/// What one member computes, on lanes.
#[derive(Debug, Clone, PartialEq)]
enum Kernel {
    /// The operand unchanged: a broadcast (read in place), a copy, a conversion that
    /// keeps the lane value (`pred → f32`, `f32 → f32`).
    Pass,
    Binary(BinaryOp),
    Unary(UnaryOp),
    /// `not` of a `pred`.
    Not,
    Activation(ActivationFn),
    Compare {
        direction: CompareDirection,
        total_order: bool,
    },
    Select,
    /// `convert` of an `f32` to `pred`: anything non-zero (NaN too) is true.
    ToPred,
    Clamp,
    Round {
        format: FloatFormat,
        saturate: bool,
    },
}

/// Where a member's operand comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Source {
    Input(usize),
    Member(usize),
}

#[derive(Debug, Clone, PartialEq)]
struct Member {
    kernel: Kernel,
    operands: Vec<Source>,
}

/// A value the group reads from outside, seen in the group's shape.
#[derive(Debug, Clone, PartialEq)]
struct Input {
    buffer: u32,
    reads: Reads,
}

/// How a group input's elements line up with the group's.
#[derive(Debug, Clone, PartialEq)]
enum Reads {
    /// Element for element: a tile is a slice of the input.
    Flat,
    /// One value for every element (a scalar, or a broadcast of one).
    Scalar,
    /// Row by row (a broadcast along some dimensions): the input's element strides, one
    /// per leading (row) dimension of the group, and its stride along the collapsed
    /// row: 1 (contiguous), 0 (one value per row) or another step.
    Rows { row_strides: Vec<usize>, lane_stride: usize },
}

/// A planned group: the members run in order, on tiles of the group's shape.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Group {
    dims: Vec<usize>,
    /// The leading dimensions (rows) and the length of the collapsed row.
    row_dims: Vec<usize>,
    row_len: usize,
    inputs: Vec<Input>,
    members: Vec<Member>,
    /// Members whose values are read after the group or returned: (member, buffer, pred).
    outputs: Vec<(usize, u32, bool)>,
}

/// How a program runs: single instructions and fused groups, in execution order.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Schedule {
    /// Positions in the program's step order, in the order they execute.
    pub(super) order: Vec<usize>,
    /// Units of `order`: `len` consecutive positions, fused when `group` is set.
    pub(super) units: Vec<Unit>,
}

#[derive(Debug, Clone, PartialEq)]
pub(super) struct Unit {
    /// First index into `Schedule::order`.
    pub(super) first: usize,
    pub(super) len: usize,
    pub(super) group: Option<Group>,
}

fn lane_dtype(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::Pred)
}

/// The member kernel of an instruction that may be fused, given its operand and
/// output element types.
fn kernel(op: &Op, operand_types: &[DType], out: DType) -> Option<Kernel> {
    if !lane_dtype(out) || !operand_types.iter().all(|&t| lane_dtype(t)) {
        return None;
    }
    let all_f32 = operand_types.iter().all(|&t| t == DType::F32);
    Some(match op {
        Op::Binary(b) if all_f32 && out == DType::F32 => match b {
            BinaryOp::And
            | BinaryOp::Or
            | BinaryOp::Xor
            | BinaryOp::ShiftLeft
            | BinaryOp::ShiftRightLogical
            | BinaryOp::ShiftRightArithmetic => return None,
            b => Kernel::Binary(*b),
        },
        Op::Unary(UnaryOp::Not) if out == DType::Pred => Kernel::Not,
        Op::Unary(UnaryOp::Not) => return None,
        Op::Unary(u) if all_f32 => Kernel::Unary(*u),
        Op::Activation(a) if all_f32 => Kernel::Activation(*a),
        Op::Compare { direction, total_order } => Kernel::Compare { direction: *direction, total_order: *total_order },
        Op::Select => Kernel::Select,
        Op::Convert | Op::Copy if operand_types[0] == out || out == DType::F32 => Kernel::Pass,
        Op::Convert => Kernel::ToPred,
        Op::Clamp if all_f32 => Kernel::Clamp,
        Op::RoundPrecision { format, saturate } if all_f32 => Kernel::Round { format: *format, saturate: *saturate },
        Op::Broadcast { .. } => Kernel::Pass,
        _ => return None,
    })
}

/// A standard-layout operand of shape `shape` seen in a group of shape `dims`:
/// operand dimension `i` is group dimension `map[i]` (identity when `map` is `None`).
/// Returns its element stride per group dimension (0 where it is broadcast).
fn strides_in_group(shape: &[usize], map: Option<&[u32]>, dims: &[usize]) -> Vec<usize> {
    let mut own = vec![0; shape.len()];
    let mut step = 1;
    for (s, &len) in own.iter_mut().zip(shape).rev() {
        *s = if len == 1 { 0 } else { step };
        step *= len;
    }
    let mut strides = vec![0; dims.len()];
    if shape.is_empty() {
        return strides;
    }
    match map {
        Some(map) => map.iter().zip(&own).for_each(|(&d, &s)| strides[d as usize] = s),
        None => strides.copy_from_slice(&own),
    }
    strides
}

/// The first dimension from which every operand reads the rest of the shape with a
/// single stride (so that dimensions `split..` collapse into one row).
fn row_split(dims: &[usize], operands: &[Vec<usize>]) -> usize {
    let mut split = dims.len();
    'outer: while split > 0 {
        let candidate = split - 1;
        for strides in operands {
            // The non-unit dimensions in `candidate..` must step as one row-major run.
            let mut inner: Option<(usize, usize)> = None; // (stride, extent) of the run so far
            for d in (candidate..dims.len()).rev() {
                if dims[d] == 1 {
                    continue;
                }
                match inner {
                    None => inner = Some((strides[d], dims[d])),
                    Some((stride, extent)) => {
                        if strides[d] != stride * extent {
                            break 'outer;
                        }
                        inner = Some((stride, extent * dims[d]));
                    }
                }
            }
        }
        split = candidate;
    }
    split
}

/// Plans the execution of `program`: which element-wise chains run fused, and the
/// order in which everything runs. With `fuse` off, every instruction runs alone, in
/// step order.
pub(super) fn schedule(program: &Program, steps: &[&Instruction], fuse: bool) -> Schedule {
    let n = steps.len();
    let single = |p: usize| Unit { first: p, len: 1, group: None };
    if !fuse {
        return Schedule { order: (0..n).collect(), units: (0..n).map(single).collect() };
    }
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); program.buffers.len()];
    for (p, instruction) in steps.iter().enumerate() {
        for &b in &instruction.operands {
            readers[b as usize].push(p);
        }
    }
    let is_output: Vec<bool> =
        (0..program.buffers.len()).map(|b| program.outputs.iter().any(|o| o.buffer as usize == b)).collect();

    // Where each position runs: its own position, or its group's last member's.
    let mut runs_at: Vec<usize> = (0..n).collect();
    let mut grouped = vec![false; n];
    let mut groups: Vec<(Vec<usize>, Group)> = Vec::new();
    for start in 0..n {
        if grouped[start] {
            continue;
        }
        if let Some((members, group)) = grow(program, steps, start, &readers, &is_output, &grouped, &runs_at) {
            let last = *members.last().unwrap_or(&start);
            for &m in &members {
                grouped[m] = true;
                runs_at[m] = last;
            }
            groups.push((members, group));
        }
    }

    // Units in the order of the position they run at.
    let mut anchored: Vec<(usize, Unit, Vec<usize>)> =
        (0..n).filter(|&p| !grouped[p]).map(|p| (p, single(0), vec![p])).collect();
    for (members, group) in groups {
        let last = *members.last().unwrap_or(&0);
        anchored.push((last, Unit { first: 0, len: members.len(), group: Some(group) }, members));
    }
    anchored.sort_by_key(|(at, ..)| *at);
    let mut order = Vec::with_capacity(n);
    let mut units = Vec::with_capacity(anchored.len());
    for (_, mut unit, positions) in anchored {
        unit.first = order.len();
        order.extend(positions);
        units.push(unit);
    }
    Schedule { order, units }
}

/// Grows a group from the instruction at `start`, taking later instructions of the
/// same shape while nothing outside the group needs a member's value before the
/// group's last member runs. `None` when fewer than two instructions join.
///
/// The group runs where its last member was. That is safe both ways: every reader of a
/// member outside the group runs later (the growth stops at the first one, `limit`,
/// unless it joins), and every member's operands are ready, since their producers came
/// earlier and, if they are in a group formed before, that group stopped growing before
/// its first outside reader, which is this group's member.
#[allow(clippy::too_many_arguments)]
fn grow(
    program: &Program,
    steps: &[&Instruction],
    start: usize,
    readers: &[Vec<usize>],
    is_output: &[bool],
    grouped: &[bool],
    runs_at: &[usize],
) -> Option<(Vec<usize>, Group)> {
    let ty = |b: u32| &program.buffers[b as usize].ty;
    let first = steps[start];
    let dims: Vec<usize> = ty(first.output).dims.iter().map(|&d| d as usize).collect();
    let mut members: Vec<usize> = Vec::new();
    let mut kernels: Vec<Member> = Vec::new();
    let mut inputs: Vec<(u32, Option<Vec<u32>>)> = Vec::new();
    let mut member_of_buffer = std::collections::HashMap::new();

    // The earliest place something outside the group runs that reads a member.
    let barrier = |members: &[usize]| -> usize {
        members
            .iter()
            .flat_map(|&m| readers[steps[m].output as usize].iter())
            .filter(|r| !members.contains(r))
            .map(|&r| runs_at[r])
            .min()
            .unwrap_or(usize::MAX)
    };
    let mut limit = usize::MAX;
    for p in start..steps.len() {
        if p > limit || members.len() == MAX_MEMBERS {
            break;
        }
        let instruction = steps[p];
        let joinable = !grouped[p] && ty(instruction.output).dims.iter().map(|&d| d as usize).eq(dims.iter().copied());
        let mut trial = inputs.clone();
        let member = joinable.then(|| candidate(program, instruction, &dims, &member_of_buffer, &mut trial)).flatten();
        let Some(member) = member else {
            if p == limit {
                break;
            }
            continue;
        };
        inputs = trial;
        member_of_buffer.insert(instruction.output, kernels.len());
        kernels.push(member);
        members.push(p);
        limit = barrier(&members);
    }
    if members.len() < 2 {
        return None;
    }
    let strides: Vec<Vec<usize>> = inputs
        .iter()
        .map(|(b, map)| {
            let shape: Vec<usize> = ty(*b).dims.iter().map(|&d| d as usize).collect();
            strides_in_group(&shape, map.as_deref(), &dims)
        })
        .collect();
    let flat = strides_in_group(&dims, None, &dims);
    let in_rows: Vec<Vec<usize>> =
        strides.iter().filter(|s| **s != flat && s.iter().any(|&x| x != 0)).cloned().collect();
    let split = row_split(&dims, &in_rows);
    let row_len: usize = dims[split..].iter().product();
    let rows: usize = dims[..split].iter().product();
    if !in_rows.is_empty() && rows > 1 && row_len < MIN_ROW {
        return None;
    }
    let inputs = inputs
        .iter()
        .zip(&strides)
        .map(|((buffer, _), strides)| Input {
            buffer: *buffer,
            reads: if *strides == flat {
                Reads::Flat
            } else if strides.iter().all(|&x| x == 0) {
                Reads::Scalar
            } else {
                Reads::Rows {
                    row_strides: strides[..split].to_vec(),
                    lane_stride: (split..dims.len()).rev().find(|&d| dims[d] != 1).map_or(0, |d| strides[d]),
                }
            },
        })
        .collect();
    let outputs = members
        .iter()
        .enumerate()
        .filter(|&(_, &m)| {
            let b = steps[m].output as usize;
            is_output[b] || readers[b].iter().any(|r| !members.contains(r))
        })
        .map(|(k, &m)| (k, steps[m].output, ty(steps[m].output).dtype == DType::Pred))
        .collect();
    Some((members, Group { row_dims: dims[..split].to_vec(), dims, row_len, inputs, members: kernels, outputs }))
}

/// The member an instruction would be; adds the outside values it reads to `inputs`.
fn candidate(
    program: &Program,
    instruction: &Instruction,
    dims: &[usize],
    member_of_buffer: &std::collections::HashMap<u32, usize>,
    inputs: &mut Vec<(u32, Option<Vec<u32>>)>,
) -> Option<Member> {
    let ty = |b: u32| &program.buffers[b as usize].ty;
    let operand_types: Vec<DType> = instruction.operands.iter().map(|&b| ty(b).dtype).collect();
    let kernel = kernel(&instruction.op, &operand_types, ty(instruction.output).dtype)?;
    let mut operands = Vec::with_capacity(instruction.operands.len());
    for &b in &instruction.operands {
        if let Some(&m) = member_of_buffer.get(&b) {
            // A broadcast of a member would change its shape; only the identity joins.
            if let Op::Broadcast { dims: map } = &instruction.op
                && !map.iter().enumerate().all(|(i, &d)| d as usize == i)
            {
                return None;
            }
            operands.push(Source::Member(m));
            continue;
        }
        let shape: Vec<usize> = ty(b).dims.iter().map(|&d| d as usize).collect();
        let map = match &instruction.op {
            Op::Broadcast { dims: map } => Some(map.clone()),
            _ if shape == dims => None,
            _ if shape.is_empty() => Some(Vec::new()),
            _ => return None,
        };
        let index = match inputs.iter().position(|(ib, im)| *ib == b && *im == map) {
            Some(i) => i,
            None => {
                inputs.push((b, map));
                inputs.len() - 1
            }
        };
        operands.push(Source::Input(index));
    }
    Some(Member { kernel, operands })
}

/// A tile of one operand or result: `TILE` or fewer values, or one value for all.
#[derive(Clone, Copy)]
enum Lane<'t> {
    Slice(&'t [f32]),
    Scalar(f32),
}

#[inline(always)]
fn map1(out: &mut [f32], a: Lane<'_>, f: impl Fn(f32) -> f32) -> Option<f32> {
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
fn map2(out: &mut [f32], a: Lane<'_>, b: Lane<'_>, f: impl Fn(f32, f32) -> f32) -> Option<f32> {
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
fn map3(out: &mut [f32], a: Lane<'_>, b: Lane<'_>, c: Lane<'_>, f: impl Fn(f32, f32, f32) -> f32) -> Option<f32> {
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

fn lane_bool(x: bool) -> f32 {
    if x { 1.0 } else { 0.0 }
}

/// Computes one member on one tile: into `out`, or as one value when every operand is.
#[inline(always)]
fn compute(kernel: &Kernel, operands: &[Lane<'_>], out: &mut [f32]) -> Option<f32> {
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
        (Kernel::Activation(a), [x]) => with_activation!(*a, f => map1(out, *x, f)),
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
        _ => unvalidated("fused element-wise"),
    }
}

/// A group input during one run: its elements as `f32` lanes.
struct InputData<'a> {
    data: Cow<'a, [f32]>,
    input: &'a Input,
}

/// One thread's share of a run: the elements `start..end`, the output slices covering
/// them, and each member's ticks.
struct Part<'o> {
    start: usize,
    end: usize,
    outs: Vec<OutSlice<'o>>,
    ticks: Vec<u64>,
}

/// Where a group output is written: one slice per output, covering a part's elements.
enum OutSlice<'o> {
    F32(&'o mut [f32]),
    Pred(&'o mut [bool]),
}

/// Runs `group` over the values in `operand` (indexed by buffer), writing the outputs
/// into `destination` where given (`f32` outputs with tensor memory) or arrays from
/// `new_f32` (of the length asked for; every element is overwritten).
/// Returns the outputs (by buffer) and each member's share of the compute time in
/// ticks.
pub(super) fn run<'s, 'd>(
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
        .map(|&(_, b, pred)| match (pred, destination(b)) {
            (false, Some(Destination(words))) => Store::Dest(words),
            (false, None) => Store::F32(new_f32(n)),
            (true, _) => Store::Pred(vec![false; n]),
        })
        .collect();

    let work = n * group.members.len();
    let lent = helpers.lend(if work >= 2 * PARALLEL_MIN_WORK { work / PARALLEL_MIN_WORK - 1 } else { 0 });
    let threads = lent.threads().min(n.div_ceil(TILE)).max(1);
    // Runs of whole 64-byte lines, so that no two threads write one cache line.
    let chunk = n.div_ceil(threads).next_multiple_of(16).max(16);
    let mut parts: Vec<Part<'_>> = (0..n.div_ceil(chunk))
        .map(|i| Part {
            start: i * chunk,
            end: n.min((i + 1) * chunk),
            outs: Vec::new(),
            ticks: vec![0; group.members.len()],
        })
        .collect();
    for store in &mut stores {
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

    let dims = IxDyn(&group.dims);
    let outputs = group
        .outputs
        .iter()
        .zip(stores)
        .map(|(&(_, b, _), store)| {
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
enum At {
    Data(usize),
    Scalar(f32),
    Assembled,
}

/// Copies the elements `at..at + out.len()` of a row-read input into `out`, row segment
/// by row segment; returns where the tile is when it lies within one row and needs no
/// copy.
fn assemble(group: &Group, data: &[f32], row_strides: &[usize], lane_stride: usize, at: usize, out: &mut [f32]) -> At {
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
fn run_part((group, inputs, part): (&Group, &[InputData<'_>], &mut Part<'_>)) {
    let Part { start, end, outs, ticks: member_ticks } = part;
    let (start, end) = (*start, *end);
    let members = group.members.len();
    let mut scratch = vec![0.0f32; members * TILE];
    let mut assembled = vec![0.0f32; inputs.len() * TILE];
    let mut places = vec![At::Assembled; inputs.len()];
    let mut scalars: Vec<Option<f32>> = vec![None; members];
    let mut output_of = vec![None; members];
    for (o, &(m, ..)) in group.outputs.iter().enumerate() {
        output_of[m] = Some(o);
    }
    let mut at = start;
    while at < end {
        let tile = TILE.min(end - at);
        let mut before = ticks();

        // Where each input's tile is (assembling the row-read ones).
        for ((place, input), scratch) in places.iter_mut().zip(inputs).zip(assembled.chunks_mut(TILE)) {
            *place = match &input.input.reads {
                Reads::Flat => At::Data(at),
                Reads::Scalar => At::Scalar(input.data[0]),
                Reads::Rows { row_strides, lane_stride } => {
                    assemble(group, &input.data, row_strides, *lane_stride, at, &mut scratch[..tile])
                }
            };
        }
        let lane = |i: usize| match places[i] {
            At::Data(offset) => Lane::Slice(&inputs[i].data[offset..offset + tile]),
            At::Scalar(v) => Lane::Scalar(v),
            At::Assembled => Lane::Slice(&assembled[i * TILE..i * TILE + tile]),
        };

        for (k, member) in group.members.iter().enumerate() {
            // Earlier members' tiles, and this member's.
            let (done, rest) = scratch.split_at_mut(k * TILE);
            let out = &mut rest[..tile];
            let mut operands = [Lane::Scalar(0.0); 3];
            for (operand, source) in operands.iter_mut().zip(&member.operands) {
                *operand = match *source {
                    Source::Input(i) => lane(i),
                    Source::Member(m) => match scalars[m] {
                        Some(v) => Lane::Scalar(v),
                        None => Lane::Slice(&done[m * TILE..m * TILE + tile]),
                    },
                };
            }
            scalars[k] = compute(&member.kernel, &operands[..member.operands.len()], out);
            if let Some(o) = output_of[k] {
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
            let now = ticks();
            member_ticks[k] += now - before;
            before = now;
        }
        at += tile;
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::{Executable, Input as ProgramInput, Output as ProgramOutput};
    use super::*;
    use crate::compile::{Target, compile_hlo};
    use crate::dtype::ArrayType;

    /// Runs `hlo` with and without fusion and returns each run's output bytes and the
    /// number of fused groups.
    fn run_both(hlo: &str, inputs: &[(Vec<u64>, Vec<f32>)]) -> (Vec<Vec<u8>>, Vec<Vec<u8>>, usize) {
        let program = compile_hlo(hlo, Target::Trn1).expect("compiles");
        let pool = HostPool::new(2);
        let run = |fuse: bool| {
            let executable = Executable::new(program.clone(), fuse);
            let values = inputs
                .iter()
                .map(|(dims, data)| {
                    let ty = ArrayType::new(DType::F32, dims.clone());
                    let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
                    ProgramInput::Copied(Value::from_le_bytes(&ty, &bytes))
                })
                .collect();
            let destinations = program.outputs.iter().map(|_| None).collect();
            let outputs = executable
                .run(values, destinations, u64::MAX, &pool, &mut |_, _, _, _| unreachable!(), |_, _, _| {})
                .expect("runs");
            let bytes = outputs
                .iter()
                .map(|output| {
                    let view = match output {
                        ProgramOutput::Written(view) => view.view(),
                        ProgramOutput::Value(value) => value.view(),
                    };
                    let mut bytes =
                        vec![0u8; view.shape().iter().product::<usize>() * view.dtype().size_bytes() as usize];
                    view.write_le_bytes(&mut bytes);
                    bytes
                })
                .collect::<Vec<_>>();
            let groups = executable.units.iter().filter(|u| u.group.is_some()).count();
            (bytes, groups)
        };
        let (fused, groups) = run(true);
        let (plain, _) = run(false);
        (fused, plain, groups)
    }

    fn data(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let x = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed.wrapping_mul(40_503));
                match x % 97 {
                    0 => f32::NAN,
                    1 => f32::INFINITY,
                    2 => -0.0,
                    _ => (x % 2001) as f32 / 250.0 - 4.0,
                }
            })
            .collect()
    }

    /// The softmax of the attention example: broadcasts read in place, a mask, a
    /// per-row maximum subtracted, and pred values inside the group.
    const SOFTMAX: &str = r#"
HloModule softmax
region_max {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(a, b)
}
ENTRY main {
  x = f32[4,64,48]{2,1,0} parameter(0)
  c8 = f32[] constant(8)
  b8 = f32[4,64,48]{2,1,0} broadcast(c8), dimensions={}
  scaled = f32[4,64,48]{2,1,0} divide(x, b8)
  i0 = s32[64,48]{1,0} iota(), iota_dimension=0
  i1 = s32[64,48]{1,0} iota(), iota_dimension=1
  mask = pred[64,48]{1,0} compare(i0, i1), direction=GE
  bmask = pred[4,64,48]{2,1,0} broadcast(mask), dimensions={1,2}
  ninf = f32[] constant(-inf)
  bninf = f32[4,64,48]{2,1,0} broadcast(ninf), dimensions={}
  masked = f32[4,64,48]{2,1,0} select(bmask, scaled, bninf)
  rowmax = f32[4,64]{1,0} reduce(masked, ninf), dimensions={2}, to_apply=region_max
  browmax = f32[4,64,48]{2,1,0} broadcast(rowmax), dimensions={0,1}
  shifted = f32[4,64,48]{2,1,0} subtract(masked, browmax)
  e = f32[4,64,48]{2,1,0} exponential(shifted)
  positive = pred[4,64,48]{2,1,0} compare(x, bninf), direction=GT
  flag = f32[4,64,48]{2,1,0} convert(positive)
  zero = f32[] constant(0)
  one = f32[] constant(1)
  clamped = f32[4,64,48]{2,1,0} clamp(zero, e, one)
  ROOT out = (f32[4,64,48]{2,1,0}, f32[4,64,48]{2,1,0}, f32[4,64,48]{2,1,0}) tuple(clamped, flag, masked)
}
"#;

    #[test]
    fn fused_softmax_is_bit_identical_to_unfused() {
        let x = data(4 * 64 * 48, 7);
        let (fused, plain, groups) = run_both(SOFTMAX, &[(vec![4, 64, 48], x)]);
        assert!(groups >= 2, "expected the two chains around the reduce to fuse, got {groups} groups");
        assert_eq!(fused, plain);
    }

    /// Element-wise operations a random chain picks from: (HLO text with `A` and `B`
    /// for operands, number of operands).
    const OPS: &[(&str, usize)] = &[
        ("add(A, B)", 2),
        ("subtract(A, B)", 2),
        ("multiply(A, B)", 2),
        ("divide(A, B)", 2),
        ("maximum(A, B)", 2),
        ("minimum(A, B)", 2),
        ("power(A, B)", 2),
        ("remainder(A, B)", 2),
        ("atan2(A, B)", 2),
        ("negate(A)", 1),
        ("abs(A)", 1),
        ("sign(A)", 1),
        ("floor(A)", 1),
        ("round-nearest-even(A)", 1),
        ("exponential(A)", 1),
        ("log(A)", 1),
        ("tanh(A)", 1),
        ("logistic(A)", 1),
        ("sqrt(A)", 1),
        ("rsqrt(A)", 1),
        ("sine(A)", 1),
        ("exponential-minus-one(A)", 1),
        ("reduce-precision(A), exponent_bits=8, mantissa_bits=7", 1),
    ];

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        /// Random chains over full-shape values, per-row and per-column broadcasts and
        /// scalars, with a reduction in the middle that splits them, give bit-identical
        /// results fused and unfused.
        #[test]
        fn random_chains_fuse_exactly(
            picks in prop::collection::vec((0..OPS.len(), 0usize..64, 0usize..64), 2..14),
            reduce_at in 0usize..14,
            compare_at in 0usize..14,
            seed in 0u32..1000,
        ) {
            let mut lines = vec![
                "  p0 = f32[5,72]{1,0} parameter(0)".to_string(),
                "  p1 = f32[5,72]{1,0} parameter(1)".to_string(),
                "  p2 = f32[5]{0} parameter(2)".to_string(),
                "  p3 = f32[72]{0} parameter(3)".to_string(),
                "  p4 = f32[] parameter(4)".to_string(),
                "  rows = f32[5,72]{1,0} broadcast(p2), dimensions={0}".to_string(),
                "  cols = f32[5,72]{1,0} broadcast(p3), dimensions={1}".to_string(),
                "  scalar = f32[5,72]{1,0} broadcast(p4), dimensions={}".to_string(),
                "  zero = f32[] constant(0)".to_string(),
            ];
            let mut values = vec!["p0".to_string(), "p1".to_string(), "rows".to_string(), "cols".to_string(), "scalar".to_string()];
            for (k, &(op, a, b)) in picks.iter().enumerate() {
                let (text, _) = OPS[op];
                let a = values[a % values.len()].clone();
                let b = values[b % values.len()].clone();
                let name = format!("v{k}");
                lines.push(format!("  {name} = f32[5,72]{{1,0}} {}", text.replace('A', &a).replace('B', &b)));
                if k == compare_at {
                    lines.push(format!("  c{k} = pred[5,72]{{1,0}} compare({name}, {a}), direction=LT"));
                    lines.push(format!("  s{k} = f32[5,72]{{1,0}} select(c{k}, {name}, {b})"));
                    values.push(format!("s{k}"));
                }
                if k == reduce_at {
                    lines.push(format!("  r{k} = f32[5]{{0}} reduce({name}, zero), dimensions={{1}}, to_apply=sum"));
                    lines.push(format!("  br{k} = f32[5,72]{{1,0}} broadcast(r{k}), dimensions={{0}}"));
                    values.push(format!("br{k}"));
                }
                values.push(name);
            }
            let last = values.last().cloned().unwrap_or_default();
            let middle = values[values.len() / 2].clone();
            lines.push(format!(
                "  ROOT out = (f32[5,72]{{1,0}}, f32[5,72]{{1,0}}) tuple({last}, {middle})"
            ));
            let hlo = format!(
                "HloModule chain\nsum {{\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] add(a, b)\n}}\nENTRY main {{\n{}\n}}\n",
                lines.join("\n")
            );
            let inputs = vec![
                (vec![5, 72], data(360, seed)),
                (vec![5, 72], data(360, seed + 1)),
                (vec![5], data(5, seed + 2)),
                (vec![72], data(72, seed + 3)),
                (vec![], data(1, seed + 4)),
            ];
            let (fused, plain, _) = run_both(&hlo, &inputs);
            prop_assert_eq!(fused, plain, "{}", hlo);
        }
    }

    #[test]
    fn rows_collapse_while_every_operand_steps_as_one_run() {
        let dims = [4, 256, 256];
        let same = strides_in_group(&[4, 256, 256], None, &dims);
        assert_eq!(same, vec![65536, 256, 1]);
        assert_eq!(row_split(&dims, std::slice::from_ref(&same)), 0);
        // A mask broadcast over the first dimension: rows of 65536.
        let mask = strides_in_group(&[256, 256], Some(&[1, 2]), &dims);
        assert_eq!(mask, vec![0, 256, 1]);
        assert_eq!(row_split(&dims, &[same.clone(), mask]), 1);
        // One value per row of the last dimension: rows of 256.
        let per_row = strides_in_group(&[4, 256], Some(&[0, 1]), &dims);
        assert_eq!(per_row, vec![256, 1, 0]);
        assert_eq!(row_split(&dims, &[same, per_row]), 2);
        // A scalar never limits the row.
        assert_eq!(row_split(&dims, &[strides_in_group(&[], Some(&[]), &dims)]), 0);
    }
}
