//! The passes over a lowered program before it is packed: scratchpad planning (first
//! fit, reusing dead buffers' space), identity forwarding, dead-instruction removal and
//! buffer compaction. The `--optlevel 2` rewrites are in [`super::simplify`].

use std::collections::HashMap;

use super::SCRATCHPAD_ALIGNMENT;
use crate::isa::{Buffer, BufferKind, Instruction, IoTensor, Op};

/// Places intermediates in one scratchpad: first fit, reusing a buffer's space after
/// its last reader. Program outputs stay live to the end. Returns the scratchpad size.
pub(super) fn plan_scratchpad(
    buffers: &mut [Buffer],
    instructions: &[Instruction],
    outputs: &[IoTensor],
    reuse: bool,
) -> Result<u64, String> {
    let too_large =
        || "the intermediates of this module need more scratchpad than 64-bit offsets can address".to_string();
    let end = instructions.len();
    let mut last_use = vec![0usize; buffers.len()];
    for (step, instruction) in instructions.iter().enumerate() {
        for &b in &instruction.operands {
            last_use[b as usize] = step;
        }
    }
    for io in outputs {
        last_use[io.buffer as usize] = end;
    }
    if !reuse {
        last_use.iter_mut().for_each(|last| *last = end);
    }
    // Live allocations: (offset, size, last use).
    let mut live: Vec<(u64, u64, usize)> = Vec::new();
    let mut high_water = 0u64;
    for (step, instruction) in instructions.iter().enumerate() {
        live.retain(|&(_, _, last)| last >= step);
        for out in instruction.outputs() {
            let out = out as usize;
            let size = buffers[out]
                .ty
                .size_bytes()
                .and_then(|s| s.checked_next_multiple_of(SCRATCHPAD_ALIGNMENT))
                .ok_or_else(too_large)?;
            live.sort_unstable_by_key(|&(offset, _, _)| offset);
            let mut offset = 0u64;
            for &(o, s, _) in &live {
                if offset.checked_add(size).is_some_and(|end| o >= end) {
                    break;
                }
                offset = offset.max(o.checked_add(s).ok_or_else(too_large)?);
            }
            let end = offset.checked_add(size).ok_or_else(too_large)?;
            live.push((offset, size, last_use[out].max(step)));
            high_water = high_water.max(end);
            buffers[out].kind = BufferKind::Intermediate { offset };
        }
    }
    // Loops and conditionals run their programs in scratchpad space of their own,
    // after the entry program's.
    let nested: u64 = instructions
        .iter()
        .flat_map(|i| i.op.nested_programs())
        .map(|p| p.scratchpad_bytes)
        .fold(0, u64::saturating_add);
    high_water = high_water.checked_add(nested).ok_or_else(too_large)?;
    Ok(high_water)
}

/// Instructions that leave their operand unchanged (`--optlevel 3` removes them):
/// copies, reshapes to the same shape, identity transposes.
pub(super) fn is_identity(op: &Op, operand: &Buffer, output: &Buffer) -> bool {
    match op {
        Op::Copy | Op::Reshape => operand.ty == output.ty,
        Op::Transpose { perm } => perm.iter().enumerate().all(|(i, &p)| i as u32 == p),
        _ => false,
    }
}

/// Removes identity instructions whose operand is an intermediate: later readers and
/// the outputs use the operand's buffer instead.
pub(super) fn forward_copies(buffers: &[Buffer], instructions: &mut Vec<Instruction>, outputs: &mut [IoTensor]) {
    let mut replaced: HashMap<u32, u32> = HashMap::new();
    instructions.retain_mut(|instruction| {
        for b in &mut instruction.operands {
            if let Some(&to) = replaced.get(b) {
                *b = to;
            }
        }
        let [operand] = instruction.operands[..] else { return true };
        let forward = matches!(buffers[operand as usize].kind, BufferKind::Intermediate { .. })
            && is_identity(&instruction.op, &buffers[operand as usize], &buffers[instruction.output as usize]);
        if forward {
            replaced.insert(instruction.output, operand);
        }
        !forward
    });
    for io in outputs {
        if let Some(&to) = replaced.get(&io.buffer) {
            io.buffer = to;
        }
    }
}

/// Removes instructions whose results nothing reads (transitively) and no output returns.
pub(super) fn remove_dead_instructions(instructions: &mut Vec<Instruction>, outputs: &[IoTensor]) {
    let mut live: std::collections::HashSet<u32> = outputs.iter().map(|io| io.buffer).collect();
    let mut keep = vec![false; instructions.len()];
    for (i, instruction) in instructions.iter().enumerate().rev() {
        if instruction.outputs().any(|b| live.contains(&b)) {
            keep[i] = true;
            live.extend(&instruction.operands);
        }
    }
    let mut index = 0;
    instructions.retain(|_| {
        index += 1;
        keep[index - 1]
    });
}

/// Drops the intermediates no instruction writes any more and the constants nothing
/// reads (a weight replaced by its auto-cast copy), and renumbers buffers, constants
/// and the instructions' steps.
pub(super) fn compact_buffers(
    buffers: &mut Vec<Buffer>,
    constants: &mut Vec<Vec<u8>>,
    instructions: &mut [Instruction],
    outputs: &mut [IoTensor],
    inputs: &mut [IoTensor],
) {
    let mut used = vec![false; buffers.len()];
    for instruction in instructions.iter() {
        instruction.outputs().for_each(|b| used[b as usize] = true);
        instruction.operands.iter().for_each(|&b| used[b as usize] = true);
    }
    outputs.iter().for_each(|io| used[io.buffer as usize] = true);
    let mut renumbered = vec![u32::MAX; buffers.len()];
    let mut kept = Vec::with_capacity(buffers.len());
    let mut kept_constants = Vec::with_capacity(constants.len());
    for (id, mut buffer) in buffers.drain(..).enumerate() {
        let keep = match &mut buffer.kind {
            BufferKind::Input { .. } => true,
            BufferKind::Intermediate { .. } => used[id],
            BufferKind::Constant { index } if used[id] => {
                kept_constants.push(std::mem::take(&mut constants[*index as usize]));
                *index = kept_constants.len() as u32 - 1;
                true
            }
            BufferKind::Constant { .. } => false,
        };
        if keep {
            renumbered[id] = kept.len() as u32;
            kept.push(buffer);
        }
    }
    *buffers = kept;
    *constants = kept_constants;
    for (step, instruction) in instructions.iter_mut().enumerate() {
        instruction.step = step as u32;
        instruction.output = renumbered[instruction.output as usize];
        instruction.operands.iter_mut().for_each(|b| *b = renumbered[*b as usize]);
    }
    for io in outputs.iter_mut().chain(inputs.iter_mut()) {
        io.buffer = renumbered[io.buffer as usize];
    }
}
