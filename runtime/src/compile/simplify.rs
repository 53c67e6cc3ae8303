//! Simplifications of a lowered program that `neuron-cc` makes from `--optlevel 2`:
//! constant folding and folding transposes into the matrix products that read them.
//! Neither changes a result: folded values are computed by the backend's own kernels,
//! and a matrix product reads a transposed operand through strides instead of a copy.

use std::collections::HashMap;

use crate::backend::{self, Value, ValueRef};
use crate::isa::{Buffer, BufferKind, Instruction, IoTensor, Op};

/// The largest result (in bytes) that is computed at compile time; larger ones stay
/// instructions, so that a NEFF does not grow by more than this per folded value.
pub(crate) const MAX_FOLDED_BYTES: u64 = 4 << 20;

/// Whether an operation's result depends on its operands alone, so that computing it
/// once at compile time gives what every execution would.
fn is_pure(op: &Op) -> bool {
    match op {
        // A new draw at each execution; data from other ranks, or the rank itself; a
        // loop may not end, and both write several buffers.
        Op::RngUniform
        | Op::Collective(_)
        | Op::PartitionId
        | Op::While(_)
        | Op::Conditional(_)
        | Op::TopK { .. }
        | Op::Sort { .. } => false,
        Op::MatMul(_)
        | Op::MatMulRounded { .. }
        | Op::Convolution(_)
        | Op::Activation(_)
        | Op::Unary(_)
        | Op::Binary(_)
        | Op::Compare { .. }
        | Op::Select
        | Op::Convert
        | Op::Broadcast { .. }
        | Op::Reshape
        | Op::Transpose { .. }
        | Op::Reduce { .. }
        | Op::Concatenate { .. }
        | Op::Slice { .. }
        | Op::Iota { .. }
        | Op::Copy
        | Op::Clamp
        | Op::Reverse { .. }
        | Op::Pad { .. }
        | Op::DynamicSlice { .. }
        | Op::DynamicUpdateSlice
        | Op::BitcastConvert
        | Op::Gather(_)
        | Op::Scatter { .. }
        | Op::RoundPrecision { .. }
        | Op::ReduceRounded { .. }
        | Op::ReduceRegion { .. }
        | Op::SelectAndScatter { .. }
        | Op::ReduceWindow { .. }
        | Op::RngBitGenerator { .. } => true,
    }
}

/// Whether an instruction only spreads a smaller operand over a larger result (a
/// broadcast that adds elements, an iota): cheaper to run than to store in the NEFF.
fn is_generator(instruction: &Instruction, buffers: &[Buffer]) -> bool {
    let elements = |b: u32| buffers[b as usize].ty.element_count().unwrap_or(u64::MAX);
    match instruction.op {
        Op::Iota { .. } => true,
        Op::Broadcast { .. } => elements(instruction.output) > elements(instruction.operands[0]),
        _ => false,
    }
}

/// Computes every instruction whose operands are all constants (transitively) at
/// compile time. A computed value that a remaining instruction or an output reads
/// becomes a constant; one that comes from a broadcast or an iota keeps its
/// instruction instead (on constant operands). Instructions that fail (an index out of
/// bounds) or whose result exceeds [`MAX_FOLDED_BYTES`] stay, as do their readers.
pub(crate) fn fold_constants(
    buffers: &mut [Buffer],
    constants: &mut Vec<Vec<u8>>,
    instructions: &mut Vec<Instruction>,
    outputs: &[IoTensor],
) {
    // Values known at compile time, by buffer; constants are decoded on first use.
    let mut known: HashMap<u32, Value> = HashMap::new();
    // The folded instruction that computed each known intermediate.
    let mut producer: HashMap<u32, usize> = HashMap::new();
    for (i, instruction) in instructions.iter().enumerate() {
        let out = &buffers[instruction.output as usize].ty;
        if !is_pure(&instruction.op) || out.size_bytes().is_none_or(|bytes| bytes > MAX_FOLDED_BYTES) {
            continue;
        }
        let all_known = instruction.operands.iter().all(|&b| match buffers[b as usize].kind {
            _ if known.contains_key(&b) => true,
            BufferKind::Constant { index } => {
                known.insert(b, Value::from_le_bytes(&buffers[b as usize].ty, &constants[index as usize]));
                true
            }
            _ => false,
        });
        if !all_known {
            continue;
        }
        let value = {
            let operands: Vec<ValueRef<'_>> = instruction.operands.iter().map(|b| known[b].view()).collect();
            backend::evaluate(&instruction.op, &operands, out)
        };
        if let Some(value) = value {
            known.insert(instruction.output, value);
            producer.insert(instruction.output, i);
        }
    }
    if producer.is_empty() {
        return;
    }

    // The folded values something outside the folded set reads.
    let mut needed: Vec<u32> = outputs.iter().map(|io| io.buffer).collect();
    for (i, instruction) in instructions.iter().enumerate() {
        if producer.get(&instruction.output) != Some(&i) {
            needed.extend(&instruction.operands);
        }
    }
    let mut keep = vec![false; instructions.len()];
    while let Some(b) = needed.pop() {
        let Some(&i) = producer.get(&b) else { continue };
        if keep[i] || matches!(buffers[b as usize].kind, BufferKind::Constant { .. }) {
            continue;
        }
        if is_generator(&instructions[i], buffers) {
            keep[i] = true;
            needed.extend(&instructions[i].operands);
        } else {
            let value = &known[&b];
            let mut bytes = vec![0u8; buffers[b as usize].ty.size_bytes().unwrap_or(0) as usize];
            value.write_le_bytes(&mut bytes);
            constants.push(bytes);
            buffers[b as usize].kind = BufferKind::Constant { index: constants.len() as u32 - 1 };
        }
    }
    let mut index = 0;
    instructions.retain(|instruction| {
        index += 1;
        keep[index - 1] || producer.get(&instruction.output) != Some(&(index - 1))
    });
}

/// Lets each matrix product read the operand of a transpose directly, with the
/// transpose's permutation applied to its dimension numbers, when that leaves the
/// product's result unchanged: the operand's free dimensions must keep their order.
/// The transpose itself goes once nothing else reads it (dead instructions are removed
/// afterwards).
pub(crate) fn fold_transposes(instructions: &mut [Instruction]) {
    let mut transposed: HashMap<u32, (u32, Vec<u32>, usize)> = HashMap::new();
    for instruction in instructions.iter_mut() {
        if let Op::MatMul(dims) | Op::MatMulRounded { dims, .. } = &mut instruction.op {
            for side in 0..2 {
                let Some((operand, perm, rank)) = transposed.get(&instruction.operands[side]) else { continue };
                let (batch, contracting) = match side {
                    0 => (&mut dims.lhs_batch, &mut dims.lhs_contracting),
                    _ => (&mut dims.rhs_batch, &mut dims.rhs_contracting),
                };
                if let Some((new_batch, new_contracting)) = through_transpose(batch, contracting, perm, *rank) {
                    *batch = new_batch;
                    *contracting = new_contracting;
                    instruction.operands[side] = *operand;
                }
            }
        }
        if let Op::Transpose { perm } = &instruction.op {
            transposed.insert(instruction.output, (instruction.operands[0], perm.clone(), perm.len()));
        }
    }
}

/// The batch and contracting dimensions of a transpose's operand that correspond to
/// `batch` and `contracting` of its result, if the remaining (free) dimensions keep
/// their order through the permutation.
fn through_transpose(batch: &[u32], contracting: &[u32], perm: &[u32], rank: usize) -> Option<(Vec<u32>, Vec<u32>)> {
    let map = |dims: &[u32]| dims.iter().map(|&d| perm.get(d as usize).copied()).collect::<Option<Vec<u32>>>();
    let free: Vec<u32> = (0..rank as u32).filter(|d| !batch.contains(d) && !contracting.contains(d)).collect();
    let free = map(&free)?;
    free.windows(2).all(|w| w[0] < w[1]).then_some((map(batch)?, map(contracting)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::DotDims;

    #[test]
    fn a_transpose_folds_only_when_the_free_dimensions_keep_their_order() {
        // [4,256,64] = transpose([256,4,64], {1,0,2}); batch 0, contracting 2.
        assert_eq!(through_transpose(&[0], &[2], &[1, 0, 2], 3), Some((vec![1], vec![2])));
        // A plain matrix transpose: contracting 1 of the result is dimension 0 of the operand.
        assert_eq!(through_transpose(&[], &[1], &[1, 0], 2), Some((vec![], vec![0])));
        // Two free dimensions that swap would reorder the result.
        assert_eq!(through_transpose(&[], &[2], &[1, 0, 2], 3), None);
        // ... but not when they keep their order.
        assert_eq!(through_transpose(&[], &[0], &[2, 0, 1], 3), Some((vec![], vec![2])));
    }

    #[test]
    fn dot_dims_are_rewritten_for_either_side() {
        let dims =
            DotDims { lhs_batch: vec![0], lhs_contracting: vec![2], rhs_batch: vec![0], rhs_contracting: vec![2] };
        let mut instructions = vec![
            Instruction { step: 0, op: Op::Transpose { perm: vec![1, 0, 2] }, operands: vec![0], output: 2, hlo: 0 },
            Instruction { step: 1, op: Op::Transpose { perm: vec![1, 0, 2] }, operands: vec![1], output: 3, hlo: 1 },
            Instruction { step: 2, op: Op::MatMul(dims), operands: vec![2, 3], output: 4, hlo: 2 },
        ];
        fold_transposes(&mut instructions);
        assert_eq!(instructions[2].operands, vec![0, 1]);
        assert_eq!(
            instructions[2].op,
            Op::MatMul(DotDims {
                lhs_batch: vec![1],
                lhs_contracting: vec![2],
                rhs_batch: vec![1],
                rhs_contracting: vec![2]
            })
        );
    }
}
