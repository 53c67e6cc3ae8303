//! A profile as Apache Parquet tables, for SQL over one profile or a fleet of them.
//!
//! [`write_tables`] writes one directory per NTFF file, a `.parquet` file per table
//! ([`TABLES`]; columns in `ntff/TABLES.md`). Every row starts with `host`, `pid` and
//! `session`, so that the tables of many files and hosts concatenate into one dataset;
//! times are wall-clock nanoseconds (UTC), device times moved onto the host clock
//! through their core's sync points. The event tables hold one row per event of the
//! file (what `neuron-profile view --output-format json` lists, and events of kinds it
//! does not know); the other tables are derived: executions, counters (utilisation and
//! tensor memory as the timeline export draws them, events lost per core), losses, and
//! the bounds and findings of the profile's summary.

mod columns;
mod derived;

use std::collections::HashMap;
use std::path::Path;

use columns::{Column, Kind, Row, Table};
use derived::{Derived, ExecKey};

use crate::export::Progress;
use crate::model::{ArgValue, Clock, Descriptor, DescriptorId, DeviceEvent, Phase, SystemEvent};
use crate::summary::{self, ENCLOSING_OPCODES, Summary};
use crate::{NtffError, NtffFile, SyncClock};

/// The tables, in the order they are written.
pub const TABLES: &[&str] = &[
    "profile",
    "system_events",
    "instructions",
    "dma_transfers",
    "losses",
    "counters",
    "executions",
    "execution_bounds",
    "hlo_bounds",
    "findings",
];

/// What to write.
#[derive(Debug, Clone, Default)]
pub struct TablesOptions {
    /// Only these NeuronCores (`None`: all, and the host stream).
    pub cores: Option<Vec<u32>>,
    /// The `session` column: what tells this file's rows from other files' of the same
    /// host and process (the file's name, without `.ntff`, is a good one).
    pub session: String,
}

/// What [`write_tables`] wrote.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TablesSummary {
    /// Each table's name, rows and bytes.
    pub tables: Vec<(String, u64, u64)>,
    /// Events read from the file.
    pub events: u64,
    /// What the file lost or could not give, in sentences (also in the `profile`
    /// table's `file_problems`); empty when it was whole.
    pub problems: Vec<String>,
}

impl TablesSummary {
    pub fn rows(&self, table: &str) -> Option<u64> {
        self.tables.iter().find(|t| t.0 == table).map(|t| t.1)
    }

    pub fn bytes(&self) -> u64 {
        self.tables.iter().map(|t| t.2).sum()
    }
}

/// Columns every table starts with.
const FILE_COLUMNS: [Column; 3] =
    [("host", Kind::Constant, false), ("pid", Kind::U32, false), ("session", Kind::Constant, false)];

const SYSTEM_EVENTS: &[Column] = &[
    ("core", Kind::U32, true),
    ("id", Kind::U64, false),
    ("name", Kind::Dict, false),
    ("phase", Kind::Dict, false),
    ("clock", Kind::Dict, false),
    ("time", Kind::Time, true),
    ("tracking_id", Kind::U64, false),
    ("thread_id", Kind::U32, false),
    ("exec_id", Kind::U64, true),
    ("model_id", Kind::U32, true),
    ("nrta_seq_id", Kind::U64, true),
    ("args", Kind::Text, true),
];
const SYS_NAME: usize = 5;
const SYS_PHASE: usize = 6;
const SYS_CLOCK: usize = 7;

const INSTRUCTIONS: &[Column] = &[
    ("core", Kind::U32, false),
    ("id", Kind::U64, false),
    ("exec_id", Kind::U64, true),
    ("model_id", Kind::U32, false),
    ("model", Kind::Dict, false),
    ("time", Kind::Time, true),
    ("duration_ns", Kind::U64, false),
    ("engine", Kind::Dict, false),
    ("opcode", Kind::Dict, false),
    ("hlo", Kind::Dict, false),
    ("step", Kind::U32, false),
    ("flops", Kind::U64, false),
    ("bytes_read", Kind::U64, false),
    ("bytes_written", Kind::U64, false),
];

const DMA_TRANSFERS: &[Column] = &[
    ("core", Kind::U32, false),
    ("id", Kind::U64, false),
    ("exec_id", Kind::U64, true),
    ("model_id", Kind::U32, false),
    ("model", Kind::Dict, false),
    ("time", Kind::Time, true),
    ("duration_ns", Kind::U64, false),
    ("queue", Kind::Dict, false),
    ("index", Kind::U32, false),
    ("bytes", Kind::U64, false),
];
/// Columns of `instructions` and `dma_transfers` keyed by the caller.
const DEV_MODEL: usize = 7;
const INS_ENGINE: usize = 10;
const INS_OPCODE: usize = 11;
const INS_HLO: usize = 12;
const DMA_QUEUE: usize = 10;

const LOSSES: &[Column] =
    &[("core", Kind::U32, true), ("ring", Kind::Dict, false), ("events", Kind::U64, false), ("time", Kind::Time, true)];
const LOSS_RING: usize = 4;

/// The columns of `table`, after the file columns.
fn columns_of(table: &str) -> &'static [Column] {
    match table {
        "system_events" => SYSTEM_EVENTS,
        "instructions" => INSTRUCTIONS,
        "dma_transfers" => DMA_TRANSFERS,
        "losses" => LOSSES,
        other => derived::columns_of(other),
    }
}

/// Creates the table `name` in `dir` for `file`'s rows.
fn create(dir: &Path, name: &str, host: &str, session: &str) -> Result<Table, NtffError> {
    let mut all: Vec<Column> = FILE_COLUMNS.to_vec();
    all.extend_from_slice(columns_of(name));
    Table::create(&dir.join(format!("{name}.parquet")), &all, &[host, session])
}

/// A descriptor's row values, resolved once.
#[derive(Clone, Copy)]
enum Resolved {
    Instruction {
        model_id: u32,
        model: i32,
        engine: i32,
        opcode: i32,
        hlo: i32,
        step: u32,
        flops: u64,
        bytes_read: u64,
        bytes_written: u64,
        /// Index of its engine in `Derived`'s resources; `None` for enclosing spans.
        resource: Option<usize>,
    },
    Dma {
        model_id: u32,
        model: i32,
        queue: i32,
        index: u32,
        bytes: u64,
        resource: usize,
    },
}

/// Writes the tables of `file` into `dir` (created if missing; its tables replaced).
/// `progress` is called after each chunk.
pub fn write_tables(
    file: &NtffFile,
    options: &TablesOptions,
    dir: &Path,
    progress: &mut dyn FnMut(Progress),
) -> Result<TablesSummary, NtffError> {
    std::fs::create_dir_all(dir).map_err(|e| NtffError::io(dir, e))?;
    let meta = file.metadata();
    let host = if meta.host.is_empty() { "unknown" } else { meta.host.as_str() };
    let pid = meta.pid;
    let cores = options.cores.as_deref();
    // The summary (per-HLO bounds, findings, the DMA peak) is made on a thread of its
    // own while the events are written.
    std::thread::scope(|scope| {
        let mut summary = Some(scope.spawn(|| summary::summarise(file, cores)));
        let joined = |summary: &mut Option<std::thread::ScopedJoinHandle<'_, Summary>>| {
            summary.take().map(|h| h.join()).unwrap_or_else(|| Err(Box::new("joined already")))
        };
        let written = write_all(file, options, dir, host, pid, progress, || {
            joined(&mut summary).map_err(|_| NtffError::Write(std::io::Error::other("the summary's thread panicked")))
        });
        // An early error leaves it running: wait for it here, whatever it met.
        let _ = joined(&mut summary);
        written
    })
}

/// Writes the tables; `summary` gives the profile's summary when the events are done.
fn write_all(
    file: &NtffFile,
    options: &TablesOptions,
    dir: &Path,
    host: &str,
    pid: u32,
    progress: &mut dyn FnMut(Progress),
    summary: impl FnOnce() -> Result<Summary, NtffError>,
) -> Result<TablesSummary, NtffError> {
    let meta = file.metadata();
    let session = options.session.as_str();
    let cores = options.cores.as_deref();
    let mut problems = file.recovery().describe();
    let realtime = match meta.clock.as_ref() {
        Some(clock) => clock.realtime_minus_monotonic_ns,
        None => {
            problems.push("the file has no clock calibration: times are the host's monotonic clock, not UTC".into());
            0
        }
    };
    // Times past what a timestamp holds (only damaged or synthetic files have them) are null.
    let wall = |ns: u64| i64::try_from(ns).ok().and_then(|n| n.checked_add(realtime));

    let mut system = create(dir, "system_events", host, session)?;
    let mut instructions = create(dir, "instructions", host, session)?;
    let mut dma = create(dir, "dma_transfers", host, session)?;
    let mut losses = create(dir, "losses", host, session)?;
    let mut derived = Derived::new(file, cores);

    let clocks = file.core_clocks(cores);
    let no_clock = SyncClock::default();
    let models: HashMap<u32, &str> = file.models().iter().map(|m| (m.model_id, m.name.as_str())).collect();
    let mut resolved: Vec<Option<Option<Resolved>>> = vec![None; file.descriptors().len()];
    let mut sym_keys: [HashMap<u32, i32>; 3] = Default::default();
    let phases = [Phase::Start, Phase::Stop, Phase::Instant].map(|p| system.key(SYS_PHASE, p.name()));
    let clock_keys = ["host", "device"].map(|c| system.key(SYS_CLOCK, c));
    let events_total: u64 =
        file.select(cores, None).map(|c| u64::from(c.system_events) + u64::from(c.device_events)).sum();
    let mut done = 0u64;
    let mut unresolved = 0u64;
    let mut args_json = String::new();
    for info in file.select(cores, None) {
        let chunk = match file.read_chunk(info) {
            Ok(chunk) => chunk,
            Err(e) => {
                let events = u64::from(info.system_events) + u64::from(info.device_events);
                problems.push(format!("a chunk of {events} events at offset {} could not be read: {e}", info.offset));
                continue;
            }
        };
        let clock = chunk.core.and_then(|c| clocks.get(&c)).unwrap_or(&no_clock);
        let host_of = |e: &SystemEvent| match e.clock {
            Clock::Host => Some(e.timestamp_ns),
            Clock::Device => clock.to_host(e.timestamp_ns),
        };
        for e in &chunk.system {
            let time = host_of(e);
            let name = *sym_keys[0]
                .entry(e.name.0)
                .or_insert_with(|| system.key(SYS_NAME, &file.string_or_placeholder(e.name)));
            let phase = match e.phase {
                Phase::Start => phases[0],
                Phase::Stop => phases[1],
                Phase::Instant => phases[2],
            };
            let clock_key = clock_keys[usize::from(e.clock == Clock::Device)];
            let args = (!e.args.is_empty()).then(|| {
                args_json.clear();
                write_args(file, e, &mut args_json);
                args_json.as_str()
            });
            system.row(|r| {
                r.constant()
                    .u32(Some(pid))
                    .constant()
                    .u32(e.core)
                    .u64(Some(e.id))
                    .key(Some(name))
                    .key(Some(phase))
                    .key(Some(clock_key))
                    .time(time.and_then(wall))
                    .u64(Some(e.tracking_id))
                    .u32(Some(e.thread_id))
                    .u64(e.exec_id)
                    .u32(e.model_id)
                    .u64(e.nrta_seq_id)
                    .text(args);
            })?;
            derived.system_event(e, time);
        }
        for e in &chunk.device {
            let slot = e.descriptor.0 as usize;
            let Some(slot_value) = resolved.get_mut(slot) else {
                unresolved += 1;
                continue;
            };
            if slot_value.is_none() {
                *slot_value = Some(resolve(
                    file,
                    e.descriptor,
                    &models,
                    &mut instructions,
                    &mut dma,
                    &mut derived,
                    &mut sym_keys,
                ));
            }
            let Some(Some(d)) = *slot_value else {
                unresolved += 1;
                continue;
            };
            let time = clock.to_host(e.start_ns).and_then(wall);
            let ns = e.end_ns.saturating_sub(e.start_ns);
            match d {
                Resolved::Instruction {
                    model_id,
                    model,
                    engine,
                    opcode,
                    hlo,
                    step,
                    flops,
                    bytes_read,
                    bytes_written,
                    resource,
                } => {
                    instructions.row(|r| {
                        device_columns(r, pid, e, model_id, model, time, ns)
                            .key(Some(engine))
                            .key(Some(opcode))
                            .key(Some(hlo))
                            .u32(Some(step))
                            .u64(Some(flops))
                            .u64(Some(bytes_read))
                            .u64(Some(bytes_written));
                    })?;
                    if let (Some(resource), Some(exec)) = (resource, e.exec_id) {
                        derived.device_work(ExecKey { core: e.core, exec }, resource, ns, flops);
                    }
                }
                Resolved::Dma { model_id, model, queue, index, bytes, resource } => {
                    dma.row(|r| {
                        device_columns(r, pid, e, model_id, model, time, ns)
                            .key(Some(queue))
                            .u32(Some(index))
                            .u64(Some(bytes));
                    })?;
                    if let Some(exec) = e.exec_id {
                        derived.device_work(ExecKey { core: e.core, exec }, resource, ns, bytes);
                    }
                }
            }
        }
        for l in &chunk.losses {
            let at = l.before as usize;
            let time = if l.device {
                chunk.device.get(at).and_then(|e| clock.to_host(e.start_ns))
            } else {
                chunk.system.get(at).and_then(&host_of)
            };
            let ring = losses.key(LOSS_RING, if l.device { "device" } else { "system" });
            losses.row(|r| {
                r.constant()
                    .u32(Some(pid))
                    .constant()
                    .u32(chunk.core)
                    .key(Some(ring))
                    .u64(Some(l.events))
                    .time(time.and_then(wall));
            })?;
            derived.loss(chunk.core, l.events, time);
        }
        done += chunk.system.len() as u64 + chunk.device.len() as u64;
        progress(Progress { events_done: done, events_total });
    }

    if unresolved > 0 {
        problems
            .push(format!("{unresolved} device events name no instruction or transfer the file describes: left out"));
    }
    let mut tables = Vec::new();
    let mut finish = |name: &str, table: Table| -> Result<(), NtffError> {
        let rows = table.finish()?;
        let path = dir.join(format!("{name}.parquet"));
        let bytes = std::fs::metadata(&path).map_err(|e| NtffError::io(&path, e))?.len();
        tables.push((name.to_string(), rows, bytes));
        Ok(())
    };
    finish("system_events", system)?;
    finish("instructions", instructions)?;
    finish("dma_transfers", dma)?;
    finish("losses", losses)?;
    let summary = summary()?;
    let written = derived.finish(&summary, |name| create(dir, name, host, session), pid, &wall, &problems)?;
    for (name, table) in written {
        finish(name, table)?;
    }
    tables.sort_by_key(|t| TABLES.iter().position(|n| *n == t.0));
    Ok(TablesSummary { tables, events: done, problems })
}

/// The columns `instructions` and `dma_transfers` start with.
fn device_columns<'r, 'b>(
    r: &'r mut Row<'b>,
    pid: u32,
    e: &DeviceEvent,
    model_id: u32,
    model: i32,
    time: Option<i64>,
    ns: u64,
) -> &'r mut Row<'b> {
    r.constant()
        .u32(Some(pid))
        .constant()
        .u32(Some(e.core))
        .u64(Some(e.id))
        .u64(e.exec_id)
        .u32(Some(model_id))
        .key(Some(model))
        .time(time)
        .u64(Some(ns))
}

/// A descriptor's row values, with its strings interned in the tables that show them.
fn resolve(
    file: &NtffFile,
    id: DescriptorId,
    models: &HashMap<u32, &str>,
    instructions: &mut Table,
    dma: &mut Table,
    derived: &mut Derived,
    sym_keys: &mut [HashMap<u32, i32>; 3],
) -> Option<Resolved> {
    let descriptor = file.descriptor(id)?;
    let model_id = descriptor.model_id();
    let model_name = models.get(&model_id).copied().unwrap_or("");
    match *descriptor {
        Descriptor::Instruction { engine, opcode, hlo, step, flops, bytes_read, bytes_written, .. } => {
            let engine_name = file.string_or_placeholder(engine);
            let opcode_name = file.string_or_placeholder(opcode);
            let enclosing = ENCLOSING_OPCODES.contains(&opcode_name.as_ref());
            let hlo = *sym_keys[1]
                .entry(hlo.0)
                .or_insert_with(|| instructions.key(INS_HLO, &file.string_or_placeholder(hlo)));
            Some(Resolved::Instruction {
                model_id,
                model: instructions.key(DEV_MODEL, model_name),
                engine: instructions.key(INS_ENGINE, &engine_name),
                opcode: instructions.key(INS_OPCODE, &opcode_name),
                hlo,
                step,
                flops,
                bytes_read,
                bytes_written,
                resource: (!enclosing).then(|| derived.engine(&engine_name)),
            })
        }
        Descriptor::Dma { queue, index, bytes, .. } => {
            let queue_name = file.string_or_placeholder(queue);
            let queue = *sym_keys[2].entry(queue.0).or_insert_with(|| dma.key(DMA_QUEUE, &queue_name));
            Some(Resolved::Dma {
                model_id,
                model: dma.key(DEV_MODEL, model_name),
                queue,
                index,
                bytes,
                resource: derived.queue(&queue_name),
            })
        }
    }
}

/// A system event's arguments as a JSON object.
fn write_args(file: &NtffFile, e: &SystemEvent, out: &mut String) {
    use std::fmt::Write;
    out.push('{');
    for (k, a) in e.args.iter().enumerate() {
        if k > 0 {
            out.push(',');
        }
        json_string(&file.string_or_placeholder(a.key), out);
        out.push(':');
        let _ = match a.value {
            ArgValue::U64(v) => write!(out, "{v}"),
            ArgValue::I64(v) => write!(out, "{v}"),
            ArgValue::Str(s) => {
                json_string(&file.string_or_placeholder(s), out);
                Ok(())
            }
        };
    }
    out.push('}');
}

/// `s` as a JSON string.
fn json_string(s: &str, out: &mut String) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push('"');
        out.push_str(s);
        out.push('"');
    } else {
        out.push_str(&serde_json::Value::from(s).to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::json_string;

    #[test]
    fn strings_in_arguments_are_json() {
        for s in ["plain", "with \"quotes\"", "back\\slash", "new\nline", "tab\tand \u{1}", "ünïcode"] {
            let mut out = String::new();
            json_string(s, &mut out);
            assert_eq!(serde_json::from_str::<String>(&out).expect("valid JSON"), s);
        }
    }
}
