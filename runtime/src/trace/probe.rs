//! Emission through the runtime's own path with no program around it, for the trace
//! benchmarks and the ring stress tests. It is not an application tracing API: what
//! it records looks like runtime activity to every reader.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use neuron_datastore::event::{EventType, Payload, Phase};
use neuron_datastore::{At, EventHead, EventIds, InstructionSpan, InstructionTrace, RingPos, Tracer};

/// The model id of the probe's program in the instruction table.
pub const PROBE_MODEL_ID: u32 = u32::MAX;
/// Instructions in the probe's program: instruction `k` is a PE instruction at step
/// `k` with `k` FLOPs.
pub const PROBE_PROGRAM_LEN: usize = 4096;

/// The probe's program, added to the instruction table once per runtime: its
/// instructions, and whether the table took them.
#[derive(Debug, Default)]
pub(crate) struct ProbeProgram(OnceLock<(Vec<InstructionTrace>, bool)>);

impl ProbeProgram {
    fn get(&self, tracer: &Tracer) -> &(Vec<InstructionTrace>, bool) {
        self.0.get_or_init(|| {
            let opcode_id = tracer.store().intern("probe");
            let program: Vec<InstructionTrace> = (0..PROBE_PROGRAM_LEN as u32)
                .map(|k| InstructionTrace { opcode_id, step: k, flops: u64::from(k), ..InstructionTrace::default() })
                .collect();
            let in_table = tracer.store().add_instructions(PROBE_MODEL_ID, &program);
            (program, in_table)
        })
    }
}

/// Records events on one held core exactly as the runtime does, from
/// [`Runtime::trace_probe`](crate::Runtime::trace_probe).
#[derive(Debug)]
pub struct TraceProbe {
    tracer: Arc<Tracer>,
    program: Arc<ProbeProgram>,
    core_locks: Arc<HashMap<u32, Mutex<()>>>,
    core: u32,
    slot: usize,
    ring: RingPos,
}

impl TraceProbe {
    pub(crate) fn new(
        tracer: Arc<Tracer>,
        program: Arc<ProbeProgram>,
        core_locks: Arc<HashMap<u32, Mutex<()>>>,
        core: u32,
    ) -> Option<TraceProbe> {
        let slot = tracer.store().core_slot(core)?;
        let ring = tracer.ring_of(Some(core));
        Some(TraceProbe { tracer, program, core_locks, core, slot, ring })
    }

    /// Records an instant system event of `event_type` on the core's ring, when that
    /// type is recorded there now: the same check and the same emit as every runtime
    /// event, carrying `tracking_id` (instants of the runtime carry 0).
    #[inline]
    pub fn system<P: Payload>(&self, event_type: EventType, tracking_id: u64, payload: P) {
        let head = EventHead { ring: self.ring, event_type, ids: EventIds::default(), tracking_id };
        self.tracer.emit(At::Now, head, Phase::Instant, payload);
    }

    /// Runs `f` holding the core's execution lock, as the backend holds it while a
    /// program runs, so that `f` can record device events. Whether device events are
    /// recorded is read once here, as it is once per execution.
    pub fn with_device<R>(&self, f: impl FnOnce(&DeviceProbe<'_>) -> R) -> R {
        let _busy = self.core_locks.get(&self.core).map(|l| l.lock().unwrap_or_else(|e| e.into_inner()));
        f(&DeviceProbe { probe: self, enabled: self.tracer.device_enabled(self.slot) })
    }
}

/// Records device events while the core's execution lock is held.
#[derive(Debug)]
pub struct DeviceProbe<'a> {
    probe: &'a TraceProbe,
    enabled: bool,
}

impl DeviceProbe<'_> {
    /// Records an instruction's device event, as the runtime does after each
    /// instruction it runs: a PE instruction of execution `exec_id` with `flops`,
    /// run from host tick `start_ticks` to `end_ticks` (converted to the core's
    /// device clock).
    #[inline]
    pub fn instruction(&self, exec_id: u64, flops: u64, start_ticks: u64, end_ticks: u64) {
        if self.enabled {
            let p = self.probe;
            let ids = EventIds { exec_id, ..EventIds::default() };
            let it = InstructionTrace { flops, ..InstructionTrace::default() };
            p.tracer.emit_instruction(p.slot, ids, &it, start_ticks, end_ticks);
        }
    }

    /// Records the instructions of one execution `exec_id` of the probe's program
    /// ([`PROBE_MODEL_ID`]), as the runtime does when a program stops: each span names
    /// an instruction of the program (below [`PROBE_PROGRAM_LEN`]) and when it ran.
    #[inline]
    pub fn run(&self, exec_id: u64, spans: &[InstructionSpan]) {
        if self.enabled {
            let p = self.probe;
            let (program, in_table) = p.program.get(&p.tracer);
            let ids = EventIds { exec_id, model_id: PROBE_MODEL_ID, ..EventIds::default() };
            p.tracer.emit_instruction_spans(p.slot, ids, program, *in_table, spans);
        }
    }
}
