//! The slot encodings of events: how a system event, a device event and a run of
//! instructions are laid out in a ring slot's payload words (`FORMAT.md`, "Rings"),
//! and their decoding back into the typed events of [`crate::event`].
//!
//! The writer encodes on the hot path, so encoding is plain stores; decoding needs the
//! string table and the tick calibration, so it happens in readers only.

use std::sync::Arc;

use crate::event::{
    ClockDomain, DeviceActivity, DeviceEvent, DmaQueueType, EventData, EventType, Phase, Slots, SystemEvent,
};
use crate::instructions::InstructionTrace;
use crate::kinds::Engine;
use crate::ring::{PAYLOAD_WORDS, Payload};

/// Payload words a system record uses (the rest of its slot stays zero).
pub const SYSTEM_RECORD_WORDS: usize = 11;
/// Payload words a device record uses: all of them.
pub const DEVICE_RECORD_WORDS: usize = PAYLOAD_WORDS;
/// Instructions one run record holds: one duration beside the first position, two
/// in each of the words after the first five.
pub const RUN_MAX: usize = 19;
const _: () = assert!(RUN_MAX == 2 * (DEVICE_RECORD_WORDS - 5) + 1);

/// Record flags.
pub const FLAG_DEVICE_CLOCK: u8 = 1;
pub const FLAG_STATUS: u8 = 2;
pub const FLAG_NRTA_SEQ: u8 = 4;

/// A system event as stored in a ring slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SystemRecord {
    pub timestamp: u64,
    pub tracking_id: u64,
    /// 0 when the event belongs to no execution.
    pub exec_id: u64,
    pub nrta_seq_id: u64,
    pub event_type: u16,
    pub phase: u8,
    pub flags: u8,
    pub thread_id: u32,
    /// 0 when the event belongs to no model.
    pub model_id: u32,
    pub string_id: u32,
    pub args: [u64; 4],
    /// The core's rank + 1 in the communicator it last joined (0: none, or no core).
    pub rank: u32,
}

impl SystemRecord {
    /// The word whose high half is the thread id.
    pub const THREAD_WORD: usize = 4;
    /// The word of the core's rank + 1.
    pub const RANK_WORD: usize = 10;

    #[inline]
    pub fn encode(&self) -> [u64; SYSTEM_RECORD_WORDS] {
        let mut p = [0u64; SYSTEM_RECORD_WORDS];
        p[0] = self.timestamp;
        p[1] = self.tracking_id;
        p[2] = self.exec_id;
        p[3] = self.nrta_seq_id;
        p[4] = u64::from(self.event_type)
            | u64::from(self.phase) << 16
            | u64::from(self.flags) << 24
            | u64::from(self.thread_id) << 32;
        p[5] = u64::from(self.model_id) | u64::from(self.string_id) << 32;
        p[6..10].copy_from_slice(&self.args);
        p[Self::RANK_WORD] = u64::from(self.rank);
        p
    }

    /// The record in a slot's payload words.
    pub fn decode(p: &[u64; DEVICE_RECORD_WORDS]) -> SystemRecord {
        SystemRecord {
            timestamp: p[0],
            tracking_id: p[1],
            exec_id: p[2],
            nrta_seq_id: p[3],
            event_type: p[4] as u16,
            phase: (p[4] >> 16) as u8,
            flags: (p[4] >> 24) as u8,
            thread_id: (p[4] >> 32) as u32,
            model_id: p[5] as u32,
            string_id: (p[5] >> 32) as u32,
            args: [p[6], p[7], p[8], p[9]],
            rank: p[Self::RANK_WORD] as u32,
        }
    }

    /// The typed event, or `None` for an unknown type or phase code. `string` resolves
    /// string ids and `host_ns` converts host ticks.
    pub fn to_event(
        self,
        id: u64,
        nc_idx: Option<u32>,
        string: &mut dyn FnMut(u32) -> String,
        host_ns: &dyn Fn(u64) -> u64,
    ) -> Option<SystemEvent> {
        let event_type = EventType::from_code(self.event_type)?;
        let phase = Phase::from_repr(self.phase)?;
        let device_clock = self.flags & FLAG_DEVICE_CLOCK != 0;
        let slots = Slots { string_id: self.string_id, args: self.args, status: self.flags & FLAG_STATUS != 0 };
        let data = EventData::from_slots(event_type, &slots, string, host_ns);
        Some(SystemEvent {
            event_type,
            phase,
            id,
            nc_idx,
            tracking_id: self.tracking_id,
            thread_id: self.thread_id,
            timestamp_ns: if device_clock { self.timestamp } else { host_ns(self.timestamp) },
            clock: if device_clock { ClockDomain::Device } else { ClockDomain::Host },
            exec_id: (self.exec_id != 0).then_some(self.exec_id),
            model_id: (self.model_id != 0).then_some(self.model_id),
            nrta_seq_id: (self.flags & FLAG_NRTA_SEQ != 0).then_some(self.nrta_seq_id),
            rank: self.rank.checked_sub(1),
            data,
        })
    }
}

pub const DEVICE_KIND_INSTRUCTION: u8 = 0;
pub const DEVICE_KIND_DMA: u8 = 1;
pub const DEVICE_KIND_RUN: u8 = 2;

/// A device event as stored in a ring slot (one instruction or one transfer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeviceRecord {
    /// The ring's device event number of this event.
    pub first_event: u64,
    pub start_ns: u64,
    pub end_ns: u64,
    pub exec_id: u64,
    pub model_id: u32,
    pub kind: u8,
    /// `Engine` for instructions, `DmaQueueType` for transfers.
    pub unit: u8,
    /// Instructions: opcode string id; transfers: the transfer index.
    pub opcode_or_index: u32,
    pub hlo_string: u32,
    pub step: u32,
    /// Instructions: FLOPs; transfers: bytes.
    pub flops_or_bytes: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
}

impl DeviceRecord {
    #[inline]
    pub fn encode(&self) -> [u64; DEVICE_RECORD_WORDS] {
        let mut p = [0u64; DEVICE_RECORD_WORDS];
        p[0] = device_word0(self.model_id, self.kind, self.unit, 1);
        p[1] = self.exec_id;
        p[2] = self.first_event;
        p[3] = self.start_ns;
        p[4] = self.end_ns;
        p[5] = u64::from(self.opcode_or_index) | u64::from(self.hlo_string) << 32;
        p[6] = self.flops_or_bytes;
        p[7] = self.bytes_read;
        p[8] = self.bytes_written;
        p[9] = u64::from(self.step);
        p
    }

    fn decode(p: &Payload) -> DeviceRecord {
        DeviceRecord {
            model_id: p[0] as u32,
            kind: (p[0] >> 32) as u8,
            unit: (p[0] >> 40) as u8,
            exec_id: p[1],
            first_event: p[2],
            start_ns: p[3],
            end_ns: p[4],
            opcode_or_index: p[5] as u32,
            hlo_string: (p[5] >> 32) as u32,
            flops_or_bytes: p[6],
            bytes_read: p[7],
            bytes_written: p[8],
            step: p[9] as u32,
        }
    }

    fn to_event(self, nc_idx: u32, string: &mut dyn FnMut(u32) -> String) -> Option<DeviceEvent> {
        let activity = match self.kind {
            DEVICE_KIND_INSTRUCTION => DeviceActivity::Instruction {
                engine: Engine::from_repr(self.unit)?,
                opcode: string(self.opcode_or_index),
                hlo: string(self.hlo_string),
                step: self.step,
                flops: self.flops_or_bytes,
                bytes_read: self.bytes_read,
                bytes_written: self.bytes_written,
            },
            DEVICE_KIND_DMA => DeviceActivity::Dma {
                queue: DmaQueueType::from_repr(self.unit)?,
                index: self.opcode_or_index,
                bytes: self.flops_or_bytes,
            },
            _ => return None,
        };
        Some(DeviceEvent {
            id: self.first_event,
            nc_idx,
            exec_id: (self.exec_id != 0).then_some(self.exec_id),
            model_id: self.model_id,
            start_ns: self.start_ns,
            end_ns: self.end_ns,
            activity,
        })
    }
}

fn device_word0(model_id: u32, kind: u8, unit: u8, count: u8) -> u64 {
    u64::from(model_id) | u64::from(kind) << 32 | u64::from(unit) << 40 | u64::from(count) << 48
}

/// Up to [`RUN_MAX`] consecutive instructions of one execution, as one record: each
/// starts when the one before it ends, so their durations are enough. What each
/// instruction is comes from the model's entry in the instruction table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InstructionRun {
    pub first_event: u64,
    pub exec_id: u64,
    pub model_id: u32,
    /// Position of the first instruction in the model's execution order.
    pub first: u32,
    pub count: u8,
    pub start_ns: u64,
    /// Device nanoseconds each instruction took.
    pub durations: [u32; RUN_MAX],
}

impl InstructionRun {
    #[inline]
    pub fn encode(&self) -> [u64; DEVICE_RECORD_WORDS] {
        let mut p = [0u64; DEVICE_RECORD_WORDS];
        p[0] = device_word0(self.model_id, DEVICE_KIND_RUN, 0, self.count);
        p[1] = self.exec_id;
        p[2] = self.first_event;
        p[3] = self.start_ns;
        p[4] = u64::from(self.first) | u64::from(self.durations[0]) << 32;
        for (k, pair) in self.durations[1..].chunks_exact(2).enumerate() {
            p[5 + k] = u64::from(pair[0]) | u64::from(pair[1]) << 32;
        }
        p
    }

    fn decode(p: &Payload) -> InstructionRun {
        let mut durations = [0u32; RUN_MAX];
        durations[0] = (p[4] >> 32) as u32;
        for (k, pair) in durations[1..].chunks_exact_mut(2).enumerate() {
            pair[0] = p[5 + k] as u32;
            pair[1] = (p[5 + k] >> 32) as u32;
        }
        InstructionRun {
            model_id: p[0] as u32,
            count: (p[0] >> 48) as u8,
            exec_id: p[1],
            first_event: p[2],
            start_ns: p[3],
            first: p[4] as u32,
            durations,
        }
    }
}

/// The device event number of a record's first event, and how many it holds.
pub(crate) fn device_record_events(p: &Payload) -> (u64, u64) {
    (p[2], if (p[0] >> 32) as u8 == DEVICE_KIND_RUN { (p[0] >> 48) as u8 as u64 } else { 1 })
}

/// Decodes a device record into its events. A run is expanded through `table`, the
/// model's instructions (`None`: not in the table, and then nothing is decoded).
pub(crate) fn decode_device(
    p: &Payload,
    nc_idx: u32,
    string: &mut dyn FnMut(u32) -> String,
    table: &mut dyn FnMut(u32) -> Option<Arc<[InstructionTrace]>>,
    out: &mut dyn FnMut(DeviceEvent),
) {
    if (p[0] >> 32) as u8 != DEVICE_KIND_RUN {
        if let Some(event) = DeviceRecord::decode(p).to_event(nc_idx, string) {
            out(event);
        }
        return;
    }
    let run = InstructionRun::decode(p);
    let Some(instructions) = table(run.model_id) else { return };
    let mut start = run.start_ns;
    for k in 0..usize::from(run.count).min(RUN_MAX) {
        let Some(it) = instructions.get(run.first as usize + k) else { return };
        let Some(engine) = Engine::from_repr(it.engine) else { return };
        let end = start + u64::from(run.durations[k]);
        out(DeviceEvent {
            id: run.first_event + k as u64,
            nc_idx,
            exec_id: (run.exec_id != 0).then_some(run.exec_id),
            model_id: run.model_id,
            start_ns: start,
            end_ns: end,
            activity: DeviceActivity::Instruction {
                engine,
                opcode: string(it.opcode_id),
                hlo: string(it.hlo_id),
                step: it.step,
                flops: it.flops,
                bytes_read: it.bytes_read,
                bytes_written: it.bytes_written,
            },
        });
        start = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(words: [u64; DEVICE_RECORD_WORDS]) -> Payload {
        let mut p = [0u64; PAYLOAD_WORDS];
        p[..DEVICE_RECORD_WORDS].copy_from_slice(&words);
        p
    }

    #[test]
    fn a_run_record_expands_into_one_event_per_instruction_from_the_table() {
        let table: Arc<[InstructionTrace]> = (0..40u32)
            .map(|k| InstructionTrace {
                engine: (k % 5) as u8,
                opcode_id: 100 + k,
                step: k,
                flops: 7 * u64::from(k),
                ..InstructionTrace::default()
            })
            .collect();
        let mut durations = [0u32; RUN_MAX];
        for (k, d) in durations.iter_mut().enumerate() {
            *d = 1000 + k as u32;
        }
        durations[RUN_MAX - 1] = u32::MAX;
        let run = InstructionRun {
            first_event: 500,
            exec_id: 9,
            model_id: 3,
            first: 20,
            count: RUN_MAX as u8,
            start_ns: 1_000_000,
            durations,
        };
        let words = payload(run.encode());
        assert_eq!(InstructionRun::decode(&words), run);
        assert_eq!(device_record_events(&words), (500, RUN_MAX as u64));
        let mut events = Vec::new();
        decode_device(
            &words,
            2,
            &mut |id| format!("s{id}"),
            &mut |model| (model == 3).then(|| table.clone()),
            &mut |e| events.push(e),
        );
        assert_eq!(events.len(), RUN_MAX);
        let mut start = 1_000_000;
        for (k, e) in events.iter().enumerate() {
            assert_eq!((e.id, e.nc_idx, e.exec_id, e.model_id), (500 + k as u64, 2, Some(9), 3));
            assert_eq!((e.start_ns, e.end_ns), (start, start + u64::from(durations[k])));
            let DeviceActivity::Instruction { engine, ref opcode, step, flops, .. } = e.activity else {
                panic!("not an instruction: {e:?}")
            };
            let position = 20 + k as u32;
            assert_eq!(
                (engine as u32, opcode.as_str(), step, flops),
                (position % 5, &*format!("s{}", 100 + position), position, 7 * u64::from(position))
            );
            start = e.end_ns;
        }
        // A model missing from the table decodes to nothing (the events still count).
        let mut none = 0;
        decode_device(&words, 2, &mut |_| String::new(), &mut |_| None, &mut |_| none += 1);
        assert_eq!(none, 0);
    }

    #[test]
    fn a_full_device_record_round_trips() {
        let record = DeviceRecord {
            first_event: 77,
            start_ns: 10,
            end_ns: 20,
            exec_id: 4,
            model_id: 6,
            kind: DEVICE_KIND_DMA,
            unit: DmaQueueType::Output as u8,
            opcode_or_index: 2,
            flops_or_bytes: 4096,
            ..DeviceRecord::default()
        };
        let words = payload(record.encode());
        assert_eq!(DeviceRecord::decode(&words), record);
        assert_eq!(device_record_events(&words), (77, 1));
    }
}
