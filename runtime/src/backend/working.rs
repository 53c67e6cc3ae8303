//! How much host memory an instruction needs while it runs, and the check that it can
//! be had before the instruction starts.
//!
//! Rust aborts the process when an allocation fails, so the kernels cannot fail on
//! their own. Instead, before each unit (an instruction or a fused group) runs, the
//! executor reserves its working memory fallibly and releases it at once (a few tens
//! of nanoseconds from the allocator's cache for small units): if the reservation fails, the execution
//! stops with an error (`NRT_RESOURCE`) and nothing is lost; if it succeeds, the
//! kernel's own allocations, which do not exceed the estimate, fit. The estimate is
//! what the kernels allocate at their peak: the results, plus what an operation lays
//! out on the side (f32 copies of narrow or integer operands of a matrix product, a
//! convolution's im2col rows, a reducer's or comparator's intermediate values, a
//! sort's copies).

use crate::dtype::ArrayType;
use crate::isa::{Instruction, Op, Program};

/// The host memory `instruction` allocates at its peak while it runs.
pub(super) fn working_bytes(instruction: &Instruction, program: &Program) -> u64 {
    let ty = |b: u32| &program.buffers[b as usize].ty;
    let bytes = |t: &ArrayType| t.size_bytes().unwrap_or(u64::MAX);
    let elements = |t: &ArrayType| t.element_count().unwrap_or(u64::MAX);
    let sum = |values: &mut dyn Iterator<Item = u64>| values.fold(0, u64::saturating_add);
    let operands: Vec<&ArrayType> = instruction.operands.iter().map(|&b| ty(b)).collect();
    let results = sum(&mut instruction.outputs().map(|b| bytes(ty(b))));
    let result_elements = sum(&mut instruction.outputs().map(|b| elements(ty(b))));
    let inputs = sum(&mut operands.iter().map(|t| bytes(t)));
    let input_elements = sum(&mut operands.iter().map(|t| elements(t)));
    // Elements held in a compute type of at most 8 bytes.
    let wide = |n: u64| n.saturating_mul(8);
    let side = match &instruction.op {
        // Operands converted to the compute type, and the product before rounding.
        Op::MatMul(_) | Op::MatMulRounded { .. } => wide(input_elements).saturating_add(wide(result_elements)),
        Op::Convolution(c) => {
            let kernel = operands.get(1).copied();
            let dim = |d: u32| kernel.and_then(|k| k.dims.get(d as usize)).copied().unwrap_or(0);
            let (kernel_inputs, outputs) = (dim(c.rhs_input), dim(c.rhs_output).max(1));
            let window: u64 = c.window.window.size.iter().product();
            let parts = c.feature_groups.max(c.batch_groups);
            let rows = result_elements / outputs;
            let depth = kernel_inputs.saturating_mul(window);
            // Converted operands, im2col rows, the kernel matrix, the product.
            let matrices =
                parts.saturating_mul(rows).saturating_mul(depth).saturating_add(depth.saturating_mul(outputs));
            wide(input_elements.saturating_add(matrices).saturating_add(result_elements.saturating_mul(2)))
        }
        // The accumulated values, one window position's elements, and the reducer's
        // intermediate values, all of the result's shape.
        Op::ReduceWindow { region, .. } => wide(result_elements.saturating_mul(region.steps.len() as u64 + 2)),
        // The arrays rearranged, their halves, and the reducer's intermediate values.
        Op::ReduceRegion { region, .. } => wide(input_elements.saturating_mul(region.steps.len() as u64 + 2)),
        // Rearranged copies, the compared elements and the comparator's values.
        Op::Sort { comparator, .. } => wide(input_elements.saturating_mul(comparator.steps.len() as u64 + 3)),
        // The operand's bytes and the decoded result.
        Op::BitcastConvert => inputs,
        _ => 0,
    };
    results.saturating_add(side)
}

/// Whether `bytes` of address space can be reserved now (and releases them).
pub(super) fn can_allocate(bytes: u64) -> bool {
    let Ok(bytes) = usize::try_from(bytes) else { return false };
    Vec::<u8>::new().try_reserve_exact(bytes).is_ok()
}
