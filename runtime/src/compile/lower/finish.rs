//! The end of lowering: entry parameters checked and numbered, the optimisation passes
//! the level asks for, the scratchpad plan, and the program assembled from engine
//! streams and DMA queues, then validated.

use super::super::passes::{compact_buffers, forward_copies, plan_scratchpad, remove_dead_instructions};
use super::super::{CompileError, OptLevel, simplify};
use super::Lowering;
use crate::isa::{BufferKind, DmaQueue, DmaQueueKind, DmaTransfer, EngineStream, IoTensor, Program};

impl Lowering<'_> {
    /// The program: what [`Lowering`] built, through the passes, with `outputs`.
    pub(super) fn finish(mut self, mut outputs: Vec<IoTensor>) -> Result<Program, CompileError> {
        let target = self.options.target;
        let whole_module = |message: String| CompileError { line: None, instruction: None, message };
        self.inputs.sort_by_key(|(n, _, _)| *n);
        for (expected, (n, name, _)) in self.inputs.iter().enumerate() {
            if *n != expected as u64 {
                return Err(whole_module(format!(
                    "entry parameters must be numbered 0 to {}; `{name}` is parameter({n})",
                    self.inputs.len() - 1
                )));
            }
        }
        let mut inputs: Vec<IoTensor> = self
            .inputs
            .iter()
            .enumerate()
            .map(|(i, (_, name, buffer))| IoTensor {
                name: format!("input{i}"),
                hlo_name: name.clone(),
                buffer: *buffer,
            })
            .collect();
        for (i, io) in inputs.iter().enumerate() {
            self.buffers[io.buffer as usize].kind = BufferKind::Input { index: i as u32 };
        }

        if self.options.optlevel >= OptLevel::O2 {
            simplify::fold_constants(&mut self.buffers, &mut self.constants, &mut self.instructions, &outputs);
            simplify::fold_transposes(&mut self.instructions);
        }
        if self.options.optlevel >= OptLevel::O3 {
            forward_copies(&self.buffers, &mut self.instructions, &mut outputs);
        }
        if self.options.optlevel >= OptLevel::O2 {
            remove_dead_instructions(&mut self.instructions, &outputs);
        }
        compact_buffers(&mut self.buffers, &mut self.constants, &mut self.instructions, &mut outputs, &mut inputs);
        let reuse = self.options.optlevel >= OptLevel::O2;
        let scratchpad_bytes =
            plan_scratchpad(&mut self.buffers, &self.instructions, &outputs, reuse).map_err(whole_module)?;

        let mut streams: Vec<EngineStream> = Vec::new();
        for instruction in self.instructions {
            let engine = instruction.op.engine();
            match streams.iter_mut().find(|s| s.engine == engine) {
                Some(stream) => stream.instructions.push(instruction),
                None => streams.push(EngineStream { engine, instructions: vec![instruction] }),
            }
        }
        streams.sort_by_key(|s| s.engine);

        let transfer = |buffer: u32, index: usize| DmaTransfer {
            buffer,
            index: index as u32,
            bytes: self.buffers[buffer as usize].ty.size_bytes().unwrap_or(0),
        };
        let constant_buffers = self.buffers.iter().enumerate().filter_map(|(id, b)| match b.kind {
            BufferKind::Constant { index } => Some((id as u32, index as usize)),
            _ => None,
        });
        let dma_queues = vec![
            DmaQueue {
                kind: DmaQueueKind::Input,
                transfers: inputs.iter().enumerate().map(|(i, io)| transfer(io.buffer, i)).collect(),
            },
            DmaQueue {
                kind: DmaQueueKind::Weights,
                transfers: constant_buffers.map(|(id, index)| transfer(id, index)).collect(),
            },
            DmaQueue {
                kind: DmaQueueKind::Output,
                transfers: outputs.iter().enumerate().map(|(i, io)| transfer(io.buffer, i)).collect(),
            },
        ];

        let program = Program {
            target: target.core_version(),
            buffers: self.buffers,
            inputs,
            outputs,
            streams,
            dma_queues,
            constants: self.constants,
            hlo_names: self.hlo_names,
            scratchpad_bytes,
        };
        program
            .validate()
            .map_err(|e| whole_module(format!("internal error: lowered program is inconsistent: {e}")))?;
        Ok(program)
    }
}
