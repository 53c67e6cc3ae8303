//! Which element-wise instructions fuse into groups ([`schedule`]): chains of `f32`
//! and `pred` instructions of one shape, with the instructions that do not depend on
//! them moved out of the way.

use super::*;

pub(super) fn lane_dtype(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::Pred)
}

/// The member kernel of an instruction that may be fused, given its operand and
/// output element types.
pub(in crate::backend) fn kernel(op: &Op, operand_types: &[DType], out: DType) -> Option<Kernel> {
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
        Op::Unary(UnaryOp::Not | UnaryOp::IsFinite | UnaryOp::PopCount | UnaryOp::CountLeadingZeros) => return None,
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
pub(super) fn strides_in_group(shape: &[usize], map: Option<&[u32]>, dims: &[usize]) -> Vec<usize> {
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
pub(super) fn row_split(dims: &[usize], operands: &[Vec<usize>]) -> usize {
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
pub(in crate::backend) fn schedule(program: &Program, steps: &[&Instruction], fuse: bool) -> Schedule {
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

/// What a growing group has fixed: its dimensions, and, once a reduction has joined,
/// the dimension its rows start at (the reduction folds the dimensions from there on).
#[derive(Clone, Copy)]
pub(super) struct Frame<'d> {
    dims: &'d [usize],
    split: Option<usize>,
}

/// Grows a group from the instruction at `start`, taking later instructions of the
/// same shape while nothing outside the group needs a member's value before the
/// group's last member runs. `None` when fewer than two instructions join.
///
/// A reduction of the group's trailing dimensions joins too (the softmax's maximum and
/// sum of each row): the group then runs row by row, and values with one element per
/// row (the reduction's, and what is computed from them before they are broadcast
/// back along the row) are members as well.
///
/// The group runs where its last member was. That is safe both ways: every reader of a
/// member outside the group runs later (the growth stops at the first one, `limit`,
/// unless it joins), and every member's operands are ready, since their producers came
/// earlier and, if they are in a group formed before, that group stopped growing before
/// its first outside reader, which is this group's member.
#[allow(clippy::too_many_arguments)]
pub(super) fn grow(
    program: &Program,
    steps: &[&Instruction],
    start: usize,
    readers: &[Vec<usize>],
    is_output: &[bool],
    grouped: &[bool],
    runs_at: &[usize],
) -> Option<(Vec<usize>, Group)> {
    let ty = |b: u32| &program.buffers[b as usize].ty;
    let shape = |b: u32| to_usize(&ty(b).dims);
    let first = steps[start];
    // A group that starts with a reduction has the shape of what it reduces.
    let dims: Vec<usize> = match (&first.op, first.operands.first()) {
        (Op::Reduce { .. }, Some(&operand)) => shape(operand),
        _ => shape(first.output),
    };
    let mut frame = Frame { dims: &dims, split: None };
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
        let (mut trial, mut trial_frame) = (inputs.clone(), frame);
        let member = (!grouped[p])
            .then(|| candidate(program, instruction, &mut trial_frame, &kernels, &member_of_buffer, &mut trial))
            .flatten()
            .filter(|_| rows_fit(program, &trial, trial_frame));
        let Some(member) = member else {
            if p == limit {
                break;
            }
            continue;
        };
        (inputs, frame) = (trial, trial_frame);
        member_of_buffer.insert(instruction.output, kernels.len());
        kernels.push(member);
        members.push(p);
        limit = barrier(&members);
    }
    if members.len() < 2 {
        return None;
    }
    let strides = input_strides(program, &inputs, &dims);
    let flat = strides_in_group(&dims, None, &dims);
    let in_rows = read_in_rows(&strides, &flat);
    let split = frame.split.unwrap_or_else(|| row_split(&dims, &in_rows));
    let row_len: usize = dims[split..].iter().product();
    let rows: usize = dims[..split].iter().product();
    if frame.split.is_none() && !in_rows.is_empty() && rows > 1 && row_len < MIN_ROW {
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
    let outputs: Vec<(usize, u32, bool)> = members
        .iter()
        .enumerate()
        .filter(|&(_, &m)| {
            let b = steps[m].output as usize;
            is_output[b] || readers[b].iter().any(|r| !members.contains(r))
        })
        .map(|(k, &m)| (k, steps[m].output, ty(steps[m].output).dtype == DType::Pred))
        .collect();
    let output_dims = outputs.iter().map(|&(_, b, _)| shape(b)).collect();
    see_through_passes(&mut kernels, &outputs);
    let tile = match frame.split {
        Some(_) => row_len,
        None if !in_rows.is_empty() && (MIN_ROW_TILE..TILE).contains(&row_len) => row_len,
        None => TILE,
    }
    .max(1);
    let row_dims = dims[..split].to_vec();
    Some((members, Group { row_dims, dims, row_len, tile, inputs, members: kernels, outputs, output_dims }))
}

/// Whether every input of a group can be read row by row from the group's row
/// dimension on, where a reduction has fixed it.
fn rows_fit(program: &Program, inputs: &[(u32, Option<Vec<u32>>)], frame: Frame<'_>) -> bool {
    let Some(split) = frame.split else { return true };
    let flat = strides_in_group(frame.dims, None, frame.dims);
    let strides = input_strides(program, inputs, frame.dims);
    row_split(frame.dims, &read_in_rows(&strides, &flat)) <= split
}

/// Each input's element strides in a group of `dims` (see [`strides_in_group`]).
fn input_strides(program: &Program, inputs: &[(u32, Option<Vec<u32>>)], dims: &[usize]) -> Vec<Vec<usize>> {
    inputs
        .iter()
        .map(|(b, map)| strides_in_group(&to_usize(&program.buffers[*b as usize].ty.dims), map.as_deref(), dims))
        .collect()
}

/// The strides of the inputs read in rows: neither element for element (`flat`) nor
/// one value for all.
fn read_in_rows(strides: &[Vec<usize>], flat: &[usize]) -> Vec<Vec<usize>> {
    strides.iter().filter(|s| s.as_slice() != flat && s.iter().any(|&x| x != 0)).cloned().collect()
}

/// Points each member's reads past pass members to what they pass on (a pass member's
/// tile holds its operand's lanes unchanged), and leaves the pass members that are then
/// read by none and not written out without anything to run.
fn see_through_passes(members: &mut [Member], outputs: &[(usize, u32, bool)]) {
    for k in 0..members.len() {
        let reads = members[k]
            .operands
            .iter()
            .map(|&source| match source {
                // Members come in order: `m`'s reads are seen through already.
                Source::Member(m) if members[m].kernel == Kernel::Pass => members[m].reads[0],
                source => source,
            })
            .collect();
        members[k].reads = reads;
    }
    for k in 0..members.len() {
        let read = members.iter().any(|m| m.reads.contains(&Source::Member(k)));
        members[k].runs = read || outputs.iter().any(|&(m, ..)| m == k);
    }
}

/// The extents of `shape` other than 1, in order.
fn extents(shape: &[usize]) -> impl Iterator<Item = usize> + '_ {
    shape.iter().copied().filter(|&len| len != 1)
}

/// Whether a value of `shape` holds one value per row of a group of `dims` whose rows
/// start at dimension `split`: its extents are the row dimensions'.
fn is_per_row(shape: &[usize], dims: &[usize], split: usize) -> bool {
    extents(shape).eq(extents(&dims[..split]))
}

/// For a per-row value of `shape`: the group dimension each of its dimensions lies
/// along (its extents, in order, along the row dimensions'; a dimension of 1 along the
/// last, which a per-row value does not step along).
fn row_map(shape: &[usize], dims: &[usize], split: usize) -> Vec<u32> {
    let last = dims.len() - 1;
    let mut along = (0..split).filter(|&d| dims[d] != 1);
    shape.iter().map(|&len| if len == 1 { last } else { along.next().unwrap_or(last) } as u32).collect()
}

/// How a per-row value steps through a group of `dims` with rows from `split`: its
/// element strides along the row dimensions, 0 along the row.
fn per_row_strides(dims: &[usize], split: usize) -> Vec<usize> {
    let map: Vec<u32> = (0..split as u32).collect();
    strides_in_group(&dims[..split], Some(&map), dims)
}

/// The member an instruction would be; adds the outside values it reads to `inputs`,
/// and the dimension its rows start at to `frame` when it is the group's first
/// reduction.
pub(super) fn candidate(
    program: &Program,
    instruction: &Instruction,
    frame: &mut Frame<'_>,
    members: &[Member],
    member_of_buffer: &std::collections::HashMap<u32, usize>,
    inputs: &mut Vec<(u32, Option<Vec<u32>>)>,
) -> Option<Member> {
    let ty = |b: u32| &program.buffers[b as usize].ty;
    let shape = |b: u32| to_usize(&ty(b).dims);
    let dims = frame.dims;
    let mut add_input = |b: u32, map: Option<Vec<u32>>| match inputs.iter().position(|(ib, im)| *ib == b && *im == map)
    {
        Some(i) => Source::Input(i),
        None => {
            inputs.push((b, map));
            Source::Input(inputs.len() - 1)
        }
    };
    if let Op::Reduce { op, dims: axes } = &instruction.op {
        return reduce_candidate(program, instruction, *op, axes, frame, members, member_of_buffer, &mut add_input);
    }
    let out = shape(instruction.output);
    let per_row = match frame.split {
        _ if out == dims => false,
        Some(split) if is_per_row(&out, dims, split) => true,
        _ => return None,
    };
    let operand_types: Vec<DType> = instruction.operands.iter().map(|&b| ty(b).dtype).collect();
    let kernel = match &instruction.op {
        // A reshape that keeps a value's elements in their order: to the same dimensions,
        // or from one per-row shape to another.
        Op::Reshape if lane_dtype(operand_types[0]) && operand_types[0] == ty(instruction.output).dtype => Kernel::Pass,
        op => kernel(op, &operand_types, ty(instruction.output).dtype)?,
    };
    let mut operands = Vec::with_capacity(instruction.operands.len());
    for &b in &instruction.operands {
        let operand = shape(b);
        if let Some(&m) = member_of_buffer.get(&b) {
            let fits = match (&instruction.op, members[m].per_row, per_row) {
                // A broadcast of a member would change its shape; only the identity joins.
                (Op::Broadcast { dims: map }, false, false) => map.iter().enumerate().all(|(i, &d)| d as usize == i),
                // A per-row value broadcast along the row: one value for each row's tile.
                (Op::Broadcast { dims: map }, true, false) => frame
                    .split
                    .is_some_and(|split| strides_in_group(&operand, Some(map), dims) == per_row_strides(dims, split)),
                // A per-row value laid out anew with its elements in order.
                (Op::Broadcast { dims: map }, true, true) => {
                    strides_in_group(&operand, Some(map), &out) == strides_in_group(&out, None, &out)
                }
                (_, from, to) => from == to,
            };
            if !fits {
                return None;
            }
            operands.push(Source::Member(m));
            continue;
        }
        let map = match (frame.split, &instruction.op) {
            (_, _) if operand.is_empty() => Some(Vec::new()),
            (Some(split), Op::Broadcast { dims: map }) if per_row => {
                let along = row_map(&out, dims, split);
                Some(map.iter().map(|&d| along[d as usize]).collect())
            }
            (Some(split), _) if per_row && is_per_row(&operand, dims, split) => Some(row_map(&operand, dims, split)),
            (_, _) if per_row => return None,
            (_, Op::Broadcast { dims: map }) => Some(map.clone()),
            (_, _) if operand == dims => None,
            _ => return None,
        };
        operands.push(add_input(b, map));
    }
    Some(Member { kernel, per_row, reads: operands.clone(), operands, runs: true })
}

/// A reduction of an `f32` value of the group's shape along its trailing dimensions,
/// from a scalar outside the group, as a member; it fixes where the group's rows start
/// (`frame.split`), and the rows must be of [`MIN_ROW_TILE`] to [`MAX_REDUCED_ROW`]
/// elements.
#[allow(clippy::too_many_arguments)]
fn reduce_candidate(
    program: &Program,
    instruction: &Instruction,
    op: ReduceOp,
    axes: &[u32],
    frame: &mut Frame<'_>,
    members: &[Member],
    member_of_buffer: &std::collections::HashMap<u32, usize>,
    add_input: &mut impl FnMut(u32, Option<Vec<u32>>) -> Source,
) -> Option<Member> {
    let ty = |b: u32| &program.buffers[b as usize].ty;
    let dims = frame.dims;
    let &[x, init] = instruction.operands.as_slice() else { return None };
    let f32s = [x, init, instruction.output].iter().all(|&b| ty(b).dtype == DType::F32);
    if !f32s || !ty(init).dims.is_empty() || member_of_buffer.contains_key(&init) {
        return None;
    }
    let mut axes: Vec<usize> = axes.iter().map(|&a| a as usize).collect();
    axes.sort_unstable();
    let split = dims.len().checked_sub(axes.len())?;
    let trailing = axes.iter().enumerate().all(|(i, &a)| a == split + i);
    let row_len: usize = dims[split..].iter().product();
    if !trailing || split == 0 || frame.split.is_some_and(|s| s != split) {
        return None;
    }
    if !(MIN_ROW_TILE..=MAX_REDUCED_ROW).contains(&row_len) {
        return None;
    }
    let source = match member_of_buffer.get(&x) {
        Some(&m) if !members[m].per_row => Source::Member(m),
        Some(_) => return None,
        None if to_usize(&ty(x).dims) == dims => add_input(x, None),
        None => return None,
    };
    frame.split = Some(split);
    let operands = vec![source, add_input(init, Some(Vec::new()))];
    Some(Member { kernel: Kernel::Reduce(op), per_row: true, reads: operands.clone(), operands, runs: true })
}
