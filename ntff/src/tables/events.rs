//! The event tables' rows, appended a chunk at a time and column by column: each
//! column is one tight loop over the chunk's events, not a dispatch per value.

use std::collections::HashMap;

use super::columns::{BATCH_ROWS, MAX_TEXT_VALUE, Table};
use crate::NtffFile;
use crate::model::{Chunk, Clock, Phase, Sym, SystemEvent};

/// A symbol's key in a `Dict` column, looked up once per symbol.
pub(super) struct SymKeys {
    /// By symbol, for symbols of the string table (`None`: not looked up yet).
    table: Vec<Option<i32>>,
    /// Symbols past the string table (damaged files).
    other: HashMap<u32, i32>,
}

impl SymKeys {
    pub(super) fn new(file: &NtffFile) -> SymKeys {
        SymKeys { table: vec![None; file.string_count()], other: HashMap::new() }
    }

    /// The key of `sym` in column `column` of `table`.
    pub(super) fn key(&mut self, file: &NtffFile, table: &mut Table, column: usize, sym: Sym) -> i32 {
        let slot = match self.table.get_mut(sym.0 as usize) {
            Some(slot) => slot,
            None => {
                return *self.other.entry(sym.0).or_insert_with(|| table.key(column, &file.string_or_placeholder(sym)));
            }
        };
        *slot.get_or_insert_with(|| table.key(column, &file.string_or_placeholder(sym)))
    }

    /// The key of `sym`, once [`SymKeys::key`] has given it.
    fn known(&self, sym: Sym) -> i32 {
        match self.table.get(sym.0 as usize) {
            Some(key) => key.unwrap_or_default(),
            None => self.other.get(&sym.0).copied().unwrap_or_default(),
        }
    }
}

/// Columns of `system_events`, by position.
pub(super) struct SystemColumns {
    pid: usize,
    core: usize,
    id: usize,
    name: usize,
    phase: usize,
    clock: usize,
    time: usize,
    tracking_id: usize,
    thread_id: usize,
    exec_id: usize,
    model_id: usize,
    nrta_seq_id: usize,
    rank: usize,
    communicator: usize,
    args: usize,
    /// Keys of the phases (start, stop, instant) and clocks (host, device).
    phases: [i32; 3],
    clocks: [i32; 2],
}

impl SystemColumns {
    pub(super) fn new(t: &mut Table) -> SystemColumns {
        let phase = t.position("phase");
        let clock = t.position("clock");
        SystemColumns {
            pid: t.position("pid"),
            core: t.position("core"),
            id: t.position("id"),
            name: t.position("name"),
            phase,
            clock,
            time: t.position("time"),
            tracking_id: t.position("tracking_id"),
            thread_id: t.position("thread_id"),
            exec_id: t.position("exec_id"),
            model_id: t.position("model_id"),
            nrta_seq_id: t.position("nrta_seq_id"),
            rank: t.position("rank"),
            communicator: t.position("communicator"),
            args: t.position("args"),
            phases: [Phase::Start, Phase::Stop, Phase::Instant].map(|p| t.key(phase, p.name())),
            clocks: ["host", "device"].map(|c| t.key(clock, c)),
        }
    }
}

fn phase_index(phase: Phase) -> usize {
    match phase {
        Phase::Start => 0,
        Phase::Stop => 1,
        Phase::Instant => 2,
    }
}

/// Appends the rows of `chunk`'s system events; `times` are their wall-clock times.
/// Returns how many events had arguments too long to keep (their `args` are null).
/// A chunk goes in as many parts as the batches' rows and text take.
#[allow(clippy::too_many_arguments)]
pub(super) fn system_rows(
    file: &NtffFile,
    t: &mut Table,
    c: &SystemColumns,
    names: &mut SymKeys,
    chunk: &Chunk,
    times: &[Option<i64>],
    pid: u32,
    args_json: &mut String,
) -> Result<u64, crate::NtffError> {
    let mut left_out = 0;
    let mut start = 0;
    while start < chunk.system.len() {
        let most = (chunk.system.len() - start).min(BATCH_ROWS);
        t.make_room(most)?;
        // The arguments first: they decide where this part ends.
        let room = t.text_room();
        let (mut end, mut text_bytes) = (start, 0);
        let args = t.text_col(c.args);
        while end < start + most {
            let e = &chunk.system[end];
            if e.args.is_empty() {
                args.append_null();
            } else {
                args_json.clear();
                if !super::write_args(file, e, args_json, MAX_TEXT_VALUE) {
                    left_out += 1;
                    args.append_null();
                } else if text_bytes + args_json.len() > room {
                    break;
                } else {
                    text_bytes += args_json.len();
                    args.append_value(args_json.as_str());
                }
            }
            end += 1;
        }
        let events = &chunk.system[start..end];
        for e in events {
            names.key(file, t, c.name, e.name);
        }
        let n = events.len();
        t.col::<u32>(c.pid).extend(std::iter::repeat_n(pid, n));
        t.col::<u32>(c.core).extend_options(events.iter().map(|e| e.core));
        t.col::<u64>(c.id).extend(events.iter().map(|e| e.id));
        t.col::<i32>(c.name).extend(events.iter().map(|e| names.known(e.name)));
        t.col::<i32>(c.phase).extend(events.iter().map(|e| c.phases[phase_index(e.phase)]));
        t.col::<i32>(c.clock).extend(events.iter().map(|e| c.clocks[usize::from(e.clock == Clock::Device)]));
        t.col::<i64>(c.time).extend_options(times[start..end].iter().copied());
        t.col::<u64>(c.tracking_id).extend(events.iter().map(|e| e.tracking_id));
        t.col::<u32>(c.thread_id).extend(events.iter().map(|e| e.thread_id));
        t.col::<u64>(c.exec_id).extend_options(events.iter().map(|e| e.exec_id));
        t.col::<u32>(c.model_id).extend_options(events.iter().map(|e| e.model_id));
        t.col::<u64>(c.nrta_seq_id).extend_options(events.iter().map(|e| e.nrta_seq_id));
        let (rank, communicator) = (file.find_string("rank"), file.find_string("communicator"));
        t.col::<u32>(c.rank).extend_options(events.iter().map(|e| u32_arg(e, rank)));
        t.col::<u32>(c.communicator).extend_options(events.iter().map(|e| u32_arg(e, communicator)));
        t.add_rows(n, text_bytes)?;
        start = end;
    }
    Ok(left_out)
}

/// The value of `e`'s first argument named `key` (a string the file holds), when it is a
/// `u32`.
fn u32_arg(e: &SystemEvent, key: Option<Sym>) -> Option<u32> {
    let key = key?;
    e.args.iter().find(|a| a.key == key).and_then(|a| match a.value {
        crate::ArgValue::U64(v) => u32::try_from(v).ok(),
        _ => None,
    })
}

/// Host time of a system event of a chunk whose core's clock is `to_host`.
pub(super) fn host_time(e: &SystemEvent, to_host: impl Fn(u64) -> Option<u64>) -> Option<u64> {
    match e.clock {
        Clock::Host => Some(e.timestamp_ns),
        Clock::Device => to_host(e.timestamp_ns),
    }
}

/// An instruction's row values, resolved once per descriptor.
#[derive(Clone, Copy)]
pub(super) struct InstructionRow {
    pub(super) model_id: u32,
    pub(super) model: i32,
    pub(super) engine: i32,
    pub(super) opcode: i32,
    pub(super) hlo: i32,
    pub(super) step: u32,
    pub(super) flops: u64,
    pub(super) bytes_read: u64,
    pub(super) bytes_written: u64,
    /// Index of its engine in `Derived`'s resources; `None` for enclosing spans.
    pub(super) resource: Option<usize>,
}

/// A DMA transfer's row values, resolved once per descriptor.
#[derive(Clone, Copy)]
pub(super) struct DmaRow {
    pub(super) model_id: u32,
    pub(super) model: i32,
    pub(super) queue: i32,
    pub(super) index: u32,
    pub(super) bytes: u64,
    pub(super) resource: usize,
}

/// The columns `instructions` and `dma_transfers` start with, by position.
pub(super) struct DeviceColumns {
    pid: usize,
    core: usize,
    id: usize,
    exec_id: usize,
    model_id: usize,
    model: usize,
    time: usize,
    duration_ns: usize,
}

impl DeviceColumns {
    pub(super) fn new(t: &Table) -> DeviceColumns {
        DeviceColumns {
            pid: t.position("pid"),
            core: t.position("core"),
            id: t.position("id"),
            exec_id: t.position("exec_id"),
            model_id: t.position("model_id"),
            model: t.position("model"),
            time: t.position("time"),
            duration_ns: t.position("duration_ns"),
        }
    }
}

/// A chunk's device events of one table: (event index, its row values).
pub(super) type Selected<R> = Vec<(u32, R)>;

/// Appends the columns every device table has, for the events `rows` selects of
/// `chunk` (`times`: the wall-clock times of all its device events), after making room
/// for them; `false` when there are none.
fn device_columns<R: Copy>(
    t: &mut Table,
    c: &DeviceColumns,
    chunk: &Chunk,
    times: &[Option<i64>],
    rows: &[(u32, R)],
    pid: u32,
    model: impl Fn(&R) -> (u32, i32),
) -> Result<bool, crate::NtffError> {
    if rows.is_empty() {
        return Ok(false);
    }
    t.make_room(rows.len())?;
    let event = |k: u32| &chunk.device[k as usize];
    t.col::<u32>(c.pid).extend(std::iter::repeat_n(pid, rows.len()));
    t.col::<u32>(c.core).extend(rows.iter().map(|r| event(r.0).core));
    t.col::<u64>(c.id).extend(rows.iter().map(|r| event(r.0).id));
    t.col::<u64>(c.exec_id).extend_options(rows.iter().map(|r| event(r.0).exec_id));
    t.col::<u32>(c.model_id).extend(rows.iter().map(|r| model(&r.1).0));
    t.col::<i32>(c.model).extend(rows.iter().map(|r| model(&r.1).1));
    t.col::<i64>(c.time).extend_options(rows.iter().map(|r| times[r.0 as usize]));
    t.col::<u64>(c.duration_ns).extend(rows.iter().map(|r| {
        let e = event(r.0);
        e.end_ns.saturating_sub(e.start_ns)
    }));
    Ok(true)
}

/// Columns of `instructions` beyond the device columns.
pub(super) struct InstructionColumns {
    device: DeviceColumns,
    pub(super) engine: usize,
    pub(super) opcode: usize,
    pub(super) hlo: usize,
    step: usize,
    flops: usize,
    bytes_read: usize,
    bytes_written: usize,
}

impl InstructionColumns {
    pub(super) fn new(t: &Table) -> InstructionColumns {
        InstructionColumns {
            device: DeviceColumns::new(t),
            engine: t.position("engine"),
            opcode: t.position("opcode"),
            hlo: t.position("hlo"),
            step: t.position("step"),
            flops: t.position("flops"),
            bytes_read: t.position("bytes_read"),
            bytes_written: t.position("bytes_written"),
        }
    }

    pub(super) fn model(&self) -> usize {
        self.device.model
    }
}

/// Appends the rows of the instructions `rows` selects of `chunk`.
pub(super) fn instruction_rows(
    t: &mut Table,
    c: &InstructionColumns,
    chunk: &Chunk,
    times: &[Option<i64>],
    rows: &Selected<InstructionRow>,
    pid: u32,
) -> Result<(), crate::NtffError> {
    for rows in rows.chunks(BATCH_ROWS) {
        if !device_columns(t, &c.device, chunk, times, rows, pid, |r| (r.model_id, r.model))? {
            continue;
        }
        t.col::<i32>(c.engine).extend(rows.iter().map(|r| r.1.engine));
        t.col::<i32>(c.opcode).extend(rows.iter().map(|r| r.1.opcode));
        t.col::<i32>(c.hlo).extend(rows.iter().map(|r| r.1.hlo));
        t.col::<u32>(c.step).extend(rows.iter().map(|r| r.1.step));
        t.col::<u64>(c.flops).extend(rows.iter().map(|r| r.1.flops));
        t.col::<u64>(c.bytes_read).extend(rows.iter().map(|r| r.1.bytes_read));
        t.col::<u64>(c.bytes_written).extend(rows.iter().map(|r| r.1.bytes_written));
        t.add_rows(rows.len(), 0)?;
    }
    Ok(())
}

/// Columns of `dma_transfers` beyond the device columns.
pub(super) struct DmaColumns {
    device: DeviceColumns,
    pub(super) queue: usize,
    index: usize,
    bytes: usize,
}

impl DmaColumns {
    pub(super) fn new(t: &Table) -> DmaColumns {
        DmaColumns {
            device: DeviceColumns::new(t),
            queue: t.position("queue"),
            index: t.position("index"),
            bytes: t.position("bytes"),
        }
    }

    pub(super) fn model(&self) -> usize {
        self.device.model
    }
}

/// Appends the rows of the transfers `rows` selects of `chunk`.
pub(super) fn dma_rows(
    t: &mut Table,
    c: &DmaColumns,
    chunk: &Chunk,
    times: &[Option<i64>],
    rows: &Selected<DmaRow>,
    pid: u32,
) -> Result<(), crate::NtffError> {
    for rows in rows.chunks(BATCH_ROWS) {
        if !device_columns(t, &c.device, chunk, times, rows, pid, |r| (r.model_id, r.model))? {
            continue;
        }
        t.col::<i32>(c.queue).extend(rows.iter().map(|r| r.1.queue));
        t.col::<u32>(c.index).extend(rows.iter().map(|r| r.1.index));
        t.col::<u64>(c.bytes).extend(rows.iter().map(|r| r.1.bytes));
        t.add_rows(rows.len(), 0)?;
    }
    Ok(())
}
