//! Which element-wise instructions fuse into groups ([`schedule`]): chains of `f32`
//! and `pred` instructions of one shape, with the instructions that do not depend on
//! them moved out of the way.

use super::*;

pub(super) fn lane_dtype(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::Pred)
}

/// The member kernel of an instruction that may be fused, given its operand and
/// output element types.
pub(super) fn kernel(op: &Op, operand_types: &[DType], out: DType) -> Option<Kernel> {
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
pub(super) fn candidate(
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
