//! The append-only instruction table: what each instruction of each loaded model is
//! (engine, opcode, HLO instruction, FLOPs, bytes), written once at load.
//!
//! Device rings record a run of consecutive instructions as one record holding their
//! durations only; readers look the rest up here by model id and position. An entry
//! is a header word (`u32` length in words, zero while unpublished; `u32` model id),
//! a count word, and [`WORDS_PER_INSTRUCTION`] words per instruction. The writer
//! appends under a lock, at load time; when the table is full it refuses the model,
//! counts it, and that model's instructions are then recorded one full record each.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::layout::Layout;
use crate::shm::Region;

/// Words per instruction in an entry.
pub(crate) const WORDS_PER_INSTRUCTION: u64 = 5;

/// Byte offsets in the table header.
const USED: u64 = 0;
pub(crate) const REFUSED: u64 = 8;
const HEADER_BYTES: u64 = 64;

/// One instruction that ran: its entry in the model's instruction list and its host
/// tick interval. An instruction inside a loop runs (and has a span) once per iteration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstructionSpan {
    pub entry: u32,
    pub start: u64,
    pub end: u64,
}

/// The fixed part of an instruction's device event, prepared at load.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InstructionTrace {
    /// An [`Engine`](crate::Engine) code.
    pub engine: u8,
    /// String ids ([`DatastoreWriter::intern`](crate::DatastoreWriter::intern)).
    pub opcode_id: u32,
    pub hlo_id: u32,
    pub step: u32,
    pub flops: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
}

impl InstructionTrace {
    fn encode(&self) -> [u64; WORDS_PER_INSTRUCTION as usize] {
        [
            u64::from(self.opcode_id) | u64::from(self.hlo_id) << 32,
            u64::from(self.engine) | u64::from(self.step) << 32,
            self.flops,
            self.bytes_read,
            self.bytes_written,
        ]
    }

    fn decode(w: [u64; WORDS_PER_INSTRUCTION as usize]) -> InstructionTrace {
        InstructionTrace {
            opcode_id: w[0] as u32,
            hlo_id: (w[0] >> 32) as u32,
            engine: w[1] as u8,
            step: (w[1] >> 32) as u32,
            flops: w[2],
            bytes_read: w[3],
            bytes_written: w[4],
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct InstructionTable {
    pub(crate) base: u64,
    pub(crate) capacity: u64,
}

impl InstructionTable {
    /// The table of a file with `layout`.
    pub(crate) fn of(layout: &Layout) -> InstructionTable {
        InstructionTable { base: layout.instructions, capacity: layout.sizes.instruction_table_bytes }
    }

    /// Appends model `model_id`'s instructions, in execution order; `false` (counted)
    /// when they do not fit. Callers serialise.
    pub(crate) fn append(&self, region: &Region, model_id: u32, instructions: &[InstructionTrace]) -> bool {
        let words = 2 + instructions.len() as u64 * WORDS_PER_INSTRUCTION;
        let used = region.u64(self.base + USED);
        let offset = used.load(Ordering::Relaxed);
        if offset + 8 * words > self.capacity || words > u64::from(u32::MAX) {
            region.u64(self.base + REFUSED).fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let entry = self.base + HEADER_BYTES + offset;
        region.u64(entry + 8).store(instructions.len() as u64, Ordering::Relaxed);
        for (k, instruction) in instructions.iter().enumerate() {
            let at = entry + 16 + 8 * WORDS_PER_INSTRUCTION * k as u64;
            for (j, word) in instruction.encode().into_iter().enumerate() {
                region.u64(at + 8 * j as u64).store(word, Ordering::Relaxed);
            }
        }
        region.u64(entry).store(words | u64::from(model_id) << 32, Ordering::Release);
        used.store(offset + 8 * words, Ordering::Release);
        true
    }

    /// Models refused for lack of room.
    pub(crate) fn refused(&self, region: &Region) -> u64 {
        region.u64(self.base + REFUSED).load(Ordering::Relaxed)
    }
}

/// A reader's copy of the table, extended as the writer appends.
#[derive(Debug, Clone, Default)]
pub(crate) struct InstructionCache {
    read_to: u64,
    models: HashMap<u32, Arc<[InstructionTrace]>>,
}

impl InstructionCache {
    /// The instructions of model `model_id`, reading entries appended since last time
    /// when it is not known yet.
    pub(crate) fn model(
        &mut self,
        region: &Region,
        table: InstructionTable,
        model_id: u32,
    ) -> Option<Arc<[InstructionTrace]>> {
        if !self.models.contains_key(&model_id) {
            self.refresh(region, table);
        }
        self.models.get(&model_id).cloned()
    }

    fn refresh(&mut self, region: &Region, table: InstructionTable) {
        let used = region.u64(table.base + USED).load(Ordering::Acquire).min(table.capacity);
        while self.read_to + 16 <= used {
            let entry = table.base + HEADER_BYTES + self.read_to;
            let head = region.u64(entry).load(Ordering::Acquire);
            let words = head & 0xFFFF_FFFF;
            let count = region.u64(entry + 8).load(Ordering::Relaxed);
            if words < 2 || self.read_to + 8 * words > used || words != 2 + count * WORDS_PER_INSTRUCTION {
                // Unpublished or corrupt: stop here, and try again next time.
                return;
            }
            let instructions: Arc<[InstructionTrace]> = (0..count)
                .map(|k| {
                    let at = entry + 16 + 8 * WORDS_PER_INSTRUCTION * k;
                    InstructionTrace::decode(std::array::from_fn(|j| {
                        region.u64(at + 8 * j as u64).load(Ordering::Relaxed)
                    }))
                })
                .collect();
            self.models.insert((head >> 32) as u32, instructions);
            self.read_to += 8 * words;
        }
    }
}
