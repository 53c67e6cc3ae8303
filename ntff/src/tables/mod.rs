//! A profile as Apache Parquet tables, for SQL over one profile or a fleet of them.
//!
//! [`write_tables`] writes a `.parquet` file per table ([`TABLES`]; columns in
//! `ntff/TABLES.md`), in a directory per NTFF file or in hive partitions ([`Layout`]).
//! Every row has its `host`, `pid` and `session`, so that the tables of many files and
//! hosts concatenate into one dataset. The columns' types are those Spark, DuckDB,
//! Polars and pandas all read: signed integers, and times as UTC microseconds with the
//! exact nanoseconds beside them, device times moved onto the host clock through their
//! core's sync points. The event tables hold one row per event of the
//! file (what `neuron-profile view --output-format json` lists, and events of kinds it
//! does not know); the other tables are derived: executions, counters (utilisation and
//! tensor memory as the timeline export draws them, events lost per core), losses, and
//! the bounds and findings of the profile's summary.

mod columns;
mod derived;
mod events;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use columns::{Column, Kind, Table};
use derived::{Derived, ExecKey};
use events::{DmaColumns, DmaRow, InstructionColumns, InstructionRow, Selected, SymKeys, SystemColumns};

use crate::export::Progress;
use crate::model::{ArgValue, Chunk, Descriptor, DescriptorId, SystemEvent};
use crate::summary::{ENCLOSING_OPCODES, Summariser};
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
    /// Where each table goes under the directory given.
    pub layout: Layout,
}

/// Where each table goes under the directory [`write_tables`] is given.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Layout {
    /// `DIR/<table>.parquet`, every row with its `host`, `pid` and `session`: a
    /// directory per file.
    #[default]
    Directory,
    /// `DIR/<table>/host=<host>/session=<session>/part-<pid>.parquet`: hive partitions,
    /// which Spark (`spark.read.parquet("DIR/<table>")`), DuckDB and Polars discover,
    /// taking `host` and `session` from the directory names (the files hold `pid` and
    /// the table's own columns). Files of many hosts and sessions go under one `DIR`;
    /// writing a session again replaces its files.
    Hive,
}

/// A partition value as Hive and Spark write it in a path: the ASCII characters their
/// readers unescape (control characters, `"#%'*/:=?\\` and DEL, `{[]^`, and space) as
/// `%XX`; the rest, other characters included, as they are.
fn partition_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        if c.is_ascii_control() || " \"#%'*/:=?\\{[]^".contains(c) {
            out.push_str(&format!("%{:02X}", c as u32));
        } else {
            out.push(c);
        }
    }
    // `.` and `..` name directories of their own; an empty value is Hive's default partition.
    match out.as_str() {
        "" => "__HIVE_DEFAULT_PARTITION__".into(),
        "." | ".." => out.replace('.', "%2E"),
        _ => out,
    }
}

/// Where one file's tables go.
struct Destination<'a> {
    dir: &'a Path,
    layout: Layout,
    host: &'a str,
    session: &'a str,
    pid: u32,
}

impl Destination<'_> {
    fn path(&self, table: &str) -> PathBuf {
        match self.layout {
            Layout::Directory => self.dir.join(format!("{table}.parquet")),
            Layout::Hive => self
                .dir
                .join(table)
                .join(format!("host={}", partition_value(self.host)))
                .join(format!("session={}", partition_value(self.session)))
                .join(format!("part-{}.parquet", self.pid)),
        }
    }

    /// Creates the table `name` for the file's rows.
    fn create(&self, name: &str) -> Result<Table, NtffError> {
        let mut all: Vec<Column> = FILE_COLUMNS.to_vec();
        if ["instructions", "dma_transfers"].contains(&name) {
            all.extend_from_slice(DEVICE_COLUMNS);
        }
        all.extend_from_slice(columns_of(name));
        let path = self.path(name);
        let constants = [self.host, self.session];
        let constants = match self.layout {
            Layout::Directory => Some(&constants[..]),
            Layout::Hive => {
                let dir = path.parent().unwrap_or(self.dir);
                std::fs::create_dir_all(dir).map_err(|e| NtffError::io(dir, e))?;
                None
            }
        };
        Table::create(&path, &all, constants)
    }
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
    ("rank", Kind::U32, true),
    ("communicator", Kind::U32, true),
    ("args", Kind::Text, true),
];

/// Columns `instructions` and `dma_transfers` start with (after the file columns).
const DEVICE_COLUMNS: &[Column] = &[
    ("core", Kind::U32, false),
    ("id", Kind::U64, false),
    ("exec_id", Kind::U64, true),
    ("model_id", Kind::U32, false),
    ("model", Kind::Dict, false),
    ("time", Kind::Time, true),
    ("duration_ns", Kind::U64, false),
];

const INSTRUCTIONS: &[Column] = &[
    ("engine", Kind::Dict, false),
    ("opcode", Kind::Dict, false),
    ("hlo", Kind::Dict, false),
    ("step", Kind::U32, false),
    ("flops", Kind::U64, false),
    ("bytes_read", Kind::U64, false),
    ("bytes_written", Kind::U64, false),
];

const DMA_TRANSFERS: &[Column] =
    &[("queue", Kind::Dict, false), ("index", Kind::U32, false), ("bytes", Kind::U64, false)];

const LOSSES: &[Column] =
    &[("core", Kind::U32, true), ("ring", Kind::Dict, false), ("events", Kind::U64, false), ("time", Kind::Time, true)];

/// The columns of `table`, after the file columns (and the device columns).
fn columns_of(table: &str) -> &'static [Column] {
    match table {
        "system_events" => SYSTEM_EVENTS,
        "instructions" => INSTRUCTIONS,
        "dma_transfers" => DMA_TRANSFERS,
        "losses" => LOSSES,
        other => derived::columns_of(other),
    }
}

/// A descriptor's row values, resolved once.
#[derive(Clone, Copy)]
enum Resolved {
    Instruction(InstructionRow),
    Dma(DmaRow),
}

/// Writes the tables of `file` into `dir` (created if missing; this file's tables
/// replaced), laid out as `options.layout` says. `progress` is called after each chunk.
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
    write_all(file, options, dir, host, pid, progress)
}

/// Writes the tables, and makes the profile's summary (per-HLO bounds, findings, the
/// DMA peak) from the same chunks.
fn write_all(
    file: &NtffFile,
    options: &TablesOptions,
    dir: &Path,
    host: &str,
    pid: u32,
    progress: &mut dyn FnMut(Progress),
) -> Result<TablesSummary, NtffError> {
    let meta = file.metadata();
    let session = options.session.as_str();
    let to = Destination { dir, layout: options.layout, host, session, pid };
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

    let mut system = to.create("system_events")?;
    let mut instructions = to.create("instructions")?;
    let mut dma = to.create("dma_transfers")?;
    let mut losses = to.create("losses")?;
    let mut derived = Derived::new(file, cores);

    let clocks = file.core_clocks(cores);
    let no_clock = SyncClock::default();
    let models: HashMap<u32, &str> = file.models().iter().map(|m| (m.model_id, m.name.as_str())).collect();
    let mut resolved: Vec<Option<Option<Resolved>>> = vec![None; file.descriptors().len()];
    let system_columns = SystemColumns::new(&mut system);
    let instruction_columns = InstructionColumns::new(&instructions);
    let dma_columns = DmaColumns::new(&dma);
    let loss_ring = losses.position("ring");
    let mut keys = Keys {
        names: SymKeys::new(file),
        hlos: SymKeys::new(file),
        queues: SymKeys::new(file),
        instruction_model: instruction_columns.model(),
        instruction_engine: instruction_columns.engine,
        instruction_opcode: instruction_columns.opcode,
        instruction_hlo: instruction_columns.hlo,
        dma_model: dma_columns.model(),
        dma_queue: dma_columns.queue,
    };
    let mut summariser = Summariser::new(file, cores);
    let events_total: u64 =
        file.select(cores, None).map(|c| u64::from(c.system_events) + u64::from(c.device_events)).sum();
    let mut done = 0u64;
    let mut unresolved = 0u64;
    let mut args_json = String::new();
    let mut args_left_out = 0u64;
    // Per chunk: wall-clock times of its system and device events, and its device
    // events split by table.
    let mut system_times: Vec<Option<i64>> = Vec::new();
    let mut device_times: Vec<Option<i64>> = Vec::new();
    let mut instruction_rows: Selected<InstructionRow> = Vec::new();
    let mut dma_rows: Selected<DmaRow> = Vec::new();
    let mut spare = Chunk::default();
    for info in file.select(cores, None) {
        let chunk = match file.read_chunk_reusing(info, std::mem::take(&mut spare)) {
            Ok(chunk) => chunk,
            Err(e) => {
                summariser.chunk(info, Err(&e));
                problems.push(crate::summary::unreadable_chunk(info, &e));
                continue;
            }
        };
        summariser.chunk(info, Ok(&chunk));
        let clock = chunk.core.and_then(|c| clocks.get(&c)).unwrap_or(&no_clock);
        system_times.clear();
        for e in &chunk.system {
            let time = events::host_time(e, |t| clock.to_host(t));
            derived.system_event(e, time);
            system_times.push(time.and_then(wall));
        }
        args_left_out += events::system_rows(
            file,
            &mut system,
            &system_columns,
            &mut keys.names,
            &chunk,
            &system_times,
            pid,
            &mut args_json,
        )?;

        device_times.clear();
        instruction_rows.clear();
        dma_rows.clear();
        for (k, e) in chunk.device.iter().enumerate() {
            device_times.push(clock.to_host(e.start_ns).and_then(wall));
            let slot = e.descriptor.0 as usize;
            let Some(slot_value) = resolved.get_mut(slot) else {
                unresolved += 1;
                continue;
            };
            let d = *slot_value.get_or_insert_with(|| {
                resolve(file, e.descriptor, &models, &mut instructions, &mut dma, &mut derived, &mut keys)
            });
            let ns = e.end_ns.saturating_sub(e.start_ns);
            match d {
                None => unresolved += 1,
                Some(Resolved::Instruction(row)) => {
                    instruction_rows.push((k as u32, row));
                    if let (Some(resource), Some(exec)) = (row.resource, e.exec_id) {
                        derived.device_work(ExecKey { core: e.core, exec }, resource, ns, row.flops);
                    }
                }
                Some(Resolved::Dma(row)) => {
                    dma_rows.push((k as u32, row));
                    if let Some(exec) = e.exec_id {
                        derived.device_work(ExecKey { core: e.core, exec }, row.resource, ns, row.bytes);
                    }
                }
            }
        }
        events::instruction_rows(
            &mut instructions,
            &instruction_columns,
            &chunk,
            &device_times,
            &instruction_rows,
            pid,
        )?;
        events::dma_rows(&mut dma, &dma_columns, &chunk, &device_times, &dma_rows, pid)?;

        for l in &chunk.losses {
            let at = l.before as usize;
            let time = if l.device {
                chunk.device.get(at).and_then(|e| clock.to_host(e.start_ns))
            } else {
                chunk.system.get(at).and_then(|e| events::host_time(e, |t| clock.to_host(t)))
            };
            let ring = losses.key(loss_ring, if l.device { "device" } else { "system" });
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
        spare = chunk;
    }

    if args_left_out > 0 {
        problems.push(format!(
            "{args_left_out} system events have arguments longer than {} MiB as JSON: their `args` are left null",
            columns::MAX_TEXT_VALUE >> 20
        ));
    }
    if unresolved > 0 {
        problems
            .push(format!("{unresolved} device events name no instruction or transfer the file describes: left out"));
    }
    let mut tables = Vec::new();
    let mut finish = |name: &str, table: Table| -> Result<(), NtffError> {
        let rows = table.finish()?;
        let path = to.path(name);
        let bytes = std::fs::metadata(&path).map_err(|e| NtffError::io(&path, e))?.len();
        tables.push((name.to_string(), rows, bytes));
        Ok(())
    };
    finish("system_events", system)?;
    finish("instructions", instructions)?;
    finish("dma_transfers", dma)?;
    finish("losses", losses)?;
    let summary = summariser.finish();
    let written = derived.finish(&summary, |name| to.create(name), pid, &wall, &problems)?;
    for (name, table) in written {
        finish(name, table)?;
    }
    tables.sort_by_key(|t| TABLES.iter().position(|n| *n == t.0));
    Ok(TablesSummary { tables, events: done, problems })
}

/// The keys of the event tables' `Dict` columns that come from symbols, and the
/// columns that descriptors key.
struct Keys {
    names: SymKeys,
    hlos: SymKeys,
    queues: SymKeys,
    instruction_model: usize,
    instruction_engine: usize,
    instruction_opcode: usize,
    instruction_hlo: usize,
    dma_model: usize,
    dma_queue: usize,
}

/// A descriptor's row values, with its strings interned in the tables that show them.
fn resolve(
    file: &NtffFile,
    id: DescriptorId,
    models: &HashMap<u32, &str>,
    instructions: &mut Table,
    dma: &mut Table,
    derived: &mut Derived,
    keys: &mut Keys,
) -> Option<Resolved> {
    let descriptor = file.descriptor(id)?;
    let model_id = descriptor.model_id();
    let model_name = models.get(&model_id).copied().unwrap_or("");
    match *descriptor {
        Descriptor::Instruction { engine, opcode, hlo, step, flops, bytes_read, bytes_written, .. } => {
            let engine_name = file.string_or_placeholder(engine);
            let opcode_name = file.string_or_placeholder(opcode);
            let enclosing = ENCLOSING_OPCODES.contains(&opcode_name.as_ref());
            Some(Resolved::Instruction(InstructionRow {
                model_id,
                model: instructions.key(keys.instruction_model, model_name),
                engine: instructions.key(keys.instruction_engine, &engine_name),
                opcode: instructions.key(keys.instruction_opcode, &opcode_name),
                hlo: keys.hlos.key(file, instructions, keys.instruction_hlo, hlo),
                step,
                flops,
                bytes_read,
                bytes_written,
                resource: (!enclosing).then(|| derived.engine(&engine_name)),
            }))
        }
        Descriptor::Dma { queue, index, bytes, .. } => {
            let queue_name = file.string_or_placeholder(queue);
            Some(Resolved::Dma(DmaRow {
                model_id,
                model: dma.key(keys.dma_model, model_name),
                queue: keys.queues.key(file, dma, keys.dma_queue, queue),
                index,
                bytes,
                resource: derived.queue(&queue_name),
            }))
        }
    }
}

/// A system event's arguments as a JSON object.
/// `false`, with `out` cut short, when they are longer than `limit` bytes.
fn write_args(file: &NtffFile, e: &SystemEvent, out: &mut String, limit: usize) -> bool {
    use std::fmt::Write;
    out.push('{');
    for (k, a) in e.args.iter().enumerate() {
        if out.len() > limit {
            return false;
        }
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
    out.len() <= limit
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
    use super::{json_string, partition_value};

    #[test]
    fn partition_values_are_escaped_as_hive_writes_them() {
        assert_eq!(partition_value("ip-10-0-0-1.ec2.internal"), "ip-10-0-0-1.ec2.internal");
        assert_eq!(partition_value("a/b=c d%"), "a%2Fb%3Dc%20d%25");
        assert_eq!(partition_value("ünï"), "ünï", "as Spark unescapes it");
        assert_eq!(partition_value("a\tb"), "a%09b");
        assert_eq!(partition_value(".."), "%2E%2E");
        assert_eq!(partition_value(""), "__HIVE_DEFAULT_PARTITION__");
    }

    #[test]
    fn strings_in_arguments_are_json() {
        for s in ["plain", "with \"quotes\"", "back\\slash", "new\nline", "tab\tand \u{1}", "ünïcode"] {
            let mut out = String::new();
            json_string(s, &mut out);
            assert_eq!(serde_json::from_str::<String>(&out).expect("valid JSON"), s);
        }
    }
}
