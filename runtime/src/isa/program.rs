//! What a [`Program`] says about itself: FLOPs, instruction counts and bytes moved,
//! and [`Program::validate`], which every loaded program passes before it runs.

use super::*;

impl Instruction {
    /// The buffers the instruction writes: [`Op::result_count`] of them from `output`.
    pub fn outputs(&self) -> std::ops::Range<u32> {
        self.output..self.output.saturating_add(self.op.result_count() as u32)
    }
}

impl Program {
    /// Total FLOPs of one execution.
    pub fn flops_per_execution(&self) -> u64 {
        self.instructions()
            .map(|i| {
                let operands: Vec<&ArrayType> = i.operands.iter().map(|&b| &self.buffers[b as usize].ty).collect();
                i.op.flops(&operands, &self.buffers[i.output as usize].ty)
            })
            .fold(0, u64::saturating_add)
    }

    /// Every engine instruction, stream by stream.
    pub fn instructions(&self) -> impl Iterator<Item = &Instruction> {
        self.streams.iter().flat_map(|s| s.instructions.iter())
    }

    /// Whether the program has collectives (it runs as one rank of a group).
    pub fn has_collectives(&self) -> bool {
        self.instructions().any(|i| matches!(i.op, super::Op::Collective(_)))
    }

    /// Every instruction of this program and of the programs its loops and
    /// conditionals run, depth first.
    pub fn all_instructions(&self) -> Vec<&Instruction> {
        let mut all = Vec::new();
        for instruction in self.instructions() {
            all.push(instruction);
            for nested in instruction.op.nested_programs() {
                all.extend(nested.all_instructions());
            }
        }
        all
    }

    /// Instruction count per engine.
    pub fn instruction_counts(&self) -> Vec<(Engine, usize)> {
        Engine::ALL
            .iter()
            .map(|&e| {
                let n = self.streams.iter().filter(|s| s.engine == e).map(|s| s.instructions.len()).sum();
                (e, n)
            })
            .collect()
    }

    pub fn constant_bytes(&self) -> u64 {
        self.constants.iter().map(|c| c.len() as u64).sum()
    }

    /// Checks every structural invariant the backend relies on.
    pub fn validate(&self) -> Result<(), InvalidProgram> {
        self.check_invariants().map_err(InvalidProgram)
    }

    fn check_invariants(&self) -> Result<(), String> {
        let buffer = |id: u32| -> Result<&Buffer, String> {
            self.buffers
                .get(id as usize)
                .ok_or_else(|| format!("buffer {id} does not exist ({} buffers)", self.buffers.len()))
        };
        let mut constant_used = vec![false; self.constants.len()];
        for (id, b) in self.buffers.iter().enumerate() {
            let size =
                b.ty.size_bytes()
                    .filter(|_| b.ty.is_addressable())
                    .ok_or_else(|| format!("buffer {id} ({}) is too large to address", b.ty))?;
            match b.kind {
                BufferKind::Input { index } => {
                    let io = self
                        .inputs
                        .get(index as usize)
                        .ok_or_else(|| format!("buffer {id} names missing input {index}"))?;
                    if io.buffer as usize != id {
                        return Err(format!("input {index} and buffer {id} disagree"));
                    }
                }
                BufferKind::Constant { index } => {
                    let blob = self
                        .constants
                        .get(index as usize)
                        .ok_or_else(|| format!("buffer {id} names missing constant {index}"))?;
                    if std::mem::replace(&mut constant_used[index as usize], true) {
                        return Err(format!("constant {index} is bound to more than one buffer"));
                    }
                    if blob.len() as u64 != size {
                        return Err(format!(
                            "constant {index} holds {} bytes but buffer {id} is {} ({size} bytes)",
                            blob.len(),
                            b.ty
                        ));
                    }
                }
                BufferKind::Intermediate { offset } => {
                    if offset.checked_add(size).is_none_or(|end| end > self.scratchpad_bytes) {
                        return Err(format!("buffer {id} lies outside the {}-byte scratchpad", self.scratchpad_bytes));
                    }
                }
            }
        }
        if let Some(index) = constant_used.iter().position(|used| !used) {
            return Err(format!("constant {index} is not bound to any buffer"));
        }
        for (index, io) in self.inputs.iter().enumerate() {
            if buffer(io.buffer)?.kind != (BufferKind::Input { index: index as u32 }) {
                return Err(format!("input `{}` is not bound to an input buffer", io.name));
            }
        }
        for io in &self.outputs {
            buffer(io.buffer)?;
        }
        // Tensors are bound by name: two of one name could never both be given.
        for (what, list) in [("inputs", &self.inputs), ("outputs", &self.outputs)] {
            let mut names = std::collections::HashSet::new();
            if let Some(io) = list.iter().find(|io| !names.insert(io.name.as_str())) {
                return Err(format!("two {what} are named `{}`", io.name));
            }
        }

        let total: usize = self.streams.iter().map(|s| s.instructions.len()).sum();
        let mut by_step: Vec<Option<&Instruction>> = vec![None; total];
        for stream in &self.streams {
            for instruction in &stream.instructions {
                if instruction.op.engine() != stream.engine {
                    return Err(format!(
                        "{} instruction at step {} sits in the {} stream",
                        instruction.op.opcode(),
                        instruction.step,
                        stream.engine
                    ));
                }
                let slot = by_step
                    .get_mut(instruction.step as usize)
                    .ok_or_else(|| format!("step {} is beyond the {total} instructions", instruction.step))?;
                if slot.replace(instruction).is_some() {
                    return Err(format!("step {} is used twice", instruction.step));
                }
            }
        }

        let mut defined: Vec<bool> =
            self.buffers.iter().map(|b| !matches!(b.kind, BufferKind::Intermediate { .. })).collect();
        for (step, instruction) in by_step.iter().enumerate() {
            let instruction = instruction.ok_or_else(|| format!("step {step} is missing"))?;
            if instruction.hlo as usize >= self.hlo_names.len() {
                return Err(format!("step {step} names HLO instruction {} that does not exist", instruction.hlo));
            }
            let mut operands = Vec::with_capacity(instruction.operands.len());
            for &id in &instruction.operands {
                let b = buffer(id)?;
                if !defined[id as usize] {
                    return Err(format!("step {step} reads buffer {id} before it is written"));
                }
                operands.push(&b.ty);
            }
            let count = instruction.op.result_count();
            let outputs = instruction.outputs();
            let mut results = Vec::with_capacity(count);
            for id in outputs.clone() {
                let out = buffer(id)?;
                if !matches!(out.kind, BufferKind::Intermediate { .. }) || defined[id as usize] {
                    return Err(format!("step {step} writes buffer {id} that is not a fresh intermediate"));
                }
                results.push(&out.ty);
            }
            if count == 0 {
                return Err(format!("step {step}: {} writes no buffer", instruction.op.opcode()));
            }
            check_results(&instruction.op, &operands, &results).map_err(|e| format!("step {step}: {e}"))?;
            if instruction
                .op
                .nested_programs()
                .iter()
                .any(|p| p.instructions().any(|i| matches!(i.op, Op::Collective(_))))
            {
                return Err(format!("step {step}: collectives inside loops and conditionals are not supported"));
            }
            for id in outputs {
                defined[id as usize] = true;
            }
        }
        for io in &self.outputs {
            if !defined[io.buffer as usize] {
                return Err(format!("output `{}` is never written", io.name));
            }
        }
        for queue in &self.dma_queues {
            for t in &queue.transfers {
                let b = buffer(t.buffer)?;
                let matches = match queue.kind {
                    DmaQueueKind::Input => b.kind == BufferKind::Input { index: t.index },
                    DmaQueueKind::Weights => b.kind == BufferKind::Constant { index: t.index },
                    DmaQueueKind::Output => self.outputs.get(t.index as usize).is_some_and(|o| o.buffer == t.buffer),
                };
                if !matches || Some(t.bytes) != b.ty.size_bytes() {
                    return Err(format!(
                        "{:?} DMA transfer of buffer {} does not match the graph",
                        queue.kind, t.buffer
                    ));
                }
            }
        }
        Ok(())
    }
}

/// A program that breaks an invariant the backend relies on: what and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidProgram(pub String);
