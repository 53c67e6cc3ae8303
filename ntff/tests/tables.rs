//! The Parquet tables of any file hold every event it holds: one row per system event,
//! instruction, DMA transfer and loss marker, whatever the field values, and a file
//! cut short gives the rows of what could be recovered, and says so.

mod common;

use std::path::Path;

use common::{Op, op, read_all, write};
use ntff::NtffFile;
use ntff::tables::{TABLES, TablesOptions, TablesSummary, write_tables};
use parquet::file::reader::{FileReader, SerializedFileReader};
use proptest::prelude::*;

/// The record batches of `dir/table.parquet`.
fn batches(dir: &Path, table: &str) -> impl Iterator<Item = arrow_array::RecordBatch> {
    let file = std::fs::File::open(dir.join(format!("{table}.parquet"))).expect("table file");
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .expect("a Parquet file")
        .build()
        .expect("a reader");
    reader.map(|batch| batch.expect("a batch"))
}

/// The integer column `column` of `dir/table.parquet`, row by row.
fn integers(dir: &Path, table: &str, column: &str) -> Vec<Option<u64>> {
    use arrow_array::Array;
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    let mut values = Vec::new();
    for batch in batches(dir, table) {
        let array = batch.column_by_name(column).expect("the column");
        assert_eq!(array.data_type(), &arrow_schema::DataType::Int64, "{table}.{column}: signed 64-bit integers");
        for k in 0..array.len() {
            // Written as the u64's bits.
            values.push(array.is_valid(k).then(|| array.as_primitive::<Int64Type>().value(k) as u64));
        }
    }
    values
}

/// Each event's fields against its row, in the order the file holds them.
fn rows_match_events(file: &NtffFile, dir: &Path) -> Result<(), TestCaseError> {
    let (mut system, mut instructions) = (Vec::new(), Vec::new());
    for info in file.select(None, None) {
        let chunk = file.read_chunk(info).expect("chunk");
        system.extend(chunk.system);
        instructions.extend(
            chunk
                .device
                .into_iter()
                .filter(|e| matches!(file.descriptor(e.descriptor), Some(ntff::Descriptor::Instruction { .. }))),
        );
    }
    let expect = |values: Vec<Option<u64>>, name: &str, table: &str| -> Result<(), TestCaseError> {
        prop_assert_eq!(integers(dir, table, name), values, "{}.{}", table, name);
        Ok(())
    };
    expect(system.iter().map(|e| Some(e.id)).collect(), "id", "system_events")?;
    expect(system.iter().map(|e| Some(e.tracking_id)).collect(), "tracking_id", "system_events")?;
    expect(system.iter().map(|e| Some(u64::from(e.thread_id))).collect(), "thread_id", "system_events")?;
    expect(system.iter().map(|e| e.exec_id).collect(), "exec_id", "system_events")?;
    expect(system.iter().map(|e| e.model_id.map(u64::from)).collect(), "model_id", "system_events")?;
    expect(system.iter().map(|e| e.nrta_seq_id).collect(), "nrta_seq_id", "system_events")?;
    expect(system.iter().map(|e| e.core.map(u64::from)).collect(), "core", "system_events")?;
    expect(instructions.iter().map(|e| Some(e.id)).collect(), "id", "instructions")?;
    expect(instructions.iter().map(|e| e.exec_id).collect(), "exec_id", "instructions")?;
    expect(
        instructions.iter().map(|e| Some(e.end_ns.saturating_sub(e.start_ns))).collect(),
        "duration_ns",
        "instructions",
    )?;
    let described = |f: fn(&ntff::Descriptor) -> u64| -> Vec<Option<u64>> {
        instructions.iter().map(|e| file.descriptor(e.descriptor).map(f)).collect()
    };
    let flops = described(|d| match *d {
        ntff::Descriptor::Instruction { flops, .. } => flops,
        ntff::Descriptor::Dma { .. } => 0,
    });
    let read = described(|d| match *d {
        ntff::Descriptor::Instruction { bytes_read, .. } => bytes_read,
        ntff::Descriptor::Dma { .. } => 0,
    });
    expect(flops, "flops", "instructions")?;
    expect(read, "bytes_read", "instructions")?;
    Ok(())
}

/// Nulls in `column` of `dir/table.parquet`, from its column chunks' statistics.
fn nulls_on_disk(dir: &Path, table: &str, column: &str) -> u64 {
    let file = std::fs::File::open(dir.join(format!("{table}.parquet"))).expect("table file");
    let reader = SerializedFileReader::new(file).expect("a Parquet file");
    let metadata = reader.metadata();
    let index =
        metadata.file_metadata().schema_descr().columns().iter().position(|c| c.name() == column).expect("the column");
    metadata
        .row_groups()
        .iter()
        .map(|g| g.column(index).statistics().and_then(|s| s.null_count_opt()).expect("null count"))
        .sum()
}

/// Rows in `dir/table.parquet`, read from its footer.
fn rows_on_disk(dir: &Path, table: &str) -> u64 {
    let file = std::fs::File::open(dir.join(format!("{table}.parquet"))).expect("table file");
    let reader = SerializedFileReader::new(file).expect("a Parquet file");
    reader.metadata().file_metadata().num_rows() as u64
}

fn tables_of(file: &NtffFile, dir: &Path) -> TablesSummary {
    let options = TablesOptions { cores: None, session: "test".into(), ..TablesOptions::default() };
    let written = write_tables(file, &options, dir, &mut |_| {}).expect("tables");
    for table in TABLES {
        assert_eq!(Some(rows_on_disk(dir, table)), written.rows(table), "{table}");
    }
    written
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn every_event_of_a_file_is_a_row(ops in prop::collection::vec(op(), 0..300)) {
        let (bytes, _) = write(&ops);
        let file = NtffFile::from_bytes(bytes).expect("opens");
        let streams = read_all(&file);
        let dir = tempfile::tempdir().expect("tempdir");
        let written = tables_of(&file, dir.path());
        let system: u64 = streams.values().map(|s| s.system.len() as u64).sum();
        let device: Vec<_> = streams.values().flat_map(|s| &s.device).collect();
        let dma = device.iter().filter(|e| matches!(file.descriptor(e.descriptor), Some(ntff::Descriptor::Dma { .. }))).count() as u64;
        let losses: u64 = streams.values().map(|s| s.losses.len() as u64).sum();
        prop_assert_eq!(written.rows("system_events"), Some(system));
        prop_assert_eq!(written.rows("instructions"), Some(device.len() as u64 - dma));
        prop_assert_eq!(written.rows("dma_transfers"), Some(dma));
        prop_assert_eq!(written.rows("losses"), Some(losses));
        prop_assert_eq!(written.rows("profile"), Some(1));
        let system_events = || streams.values().flat_map(|s| &s.system);
        let no_exec = system_events().filter(|e| e.exec_id.is_none()).count() as u64;
        let no_core = system_events().filter(|e| e.core.is_none()).count() as u64;
        if system > 0 {
            prop_assert_eq!(nulls_on_disk(dir.path(), "system_events", "exec_id"), no_exec);
            prop_assert_eq!(nulls_on_disk(dir.path(), "system_events", "core"), no_core);
        }
        prop_assert_eq!(written.events, system + device.len() as u64);
        rows_match_events(&file, dir.path())?;
        // The only problem of these files: they carry no clock calibration.
        prop_assert!(written.problems.iter().all(|p| p.contains("no clock calibration")), "{:?}", written.problems);
    }
}

#[test]
fn a_file_cut_short_gives_the_rows_it_recovered_and_says_so() {
    let ops: Vec<Op> = (0..4000u64)
        .map(|k| match k % 500 {
            499 => Op::Flush,
            _ => Op::Device {
                core: (k % 2) as u32,
                descriptor: (k % 3 == 0, (k % 5) as u32, 1),
                fields: [k, k * 10, k * 10 + 5, 0],
                exec: Some(k / 100),
            },
        })
        .collect();
    let (bytes, _) = write(&ops);
    let cut = bytes[..bytes.len() * 3 / 5].to_vec();
    let file = NtffFile::from_bytes(cut).expect("a cut file still opens");
    assert!(!file.recovery().is_clean());
    let recovered: u64 = read_all(&file).values().map(|s| s.device.len() as u64).sum();
    assert!(recovered > 0 && recovered < 4000 - 8, "{recovered}");
    let dir = tempfile::tempdir().expect("tempdir");
    let written = tables_of(&file, dir.path());
    assert_eq!(written.rows("instructions").unwrap_or(0) + written.rows("dma_transfers").unwrap_or(0), recovered);
    assert!(!written.problems.is_empty(), "the cut is reported");
}

/// The string column `column` of `dir/table.parquet` (plain or dictionary), row by row.
fn strings(dir: &Path, table: &str, column: &str) -> Vec<Option<String>> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int32Type;
    use arrow_array::{Array, StringArray};
    let mut values = Vec::new();
    for batch in batches(dir, table) {
        let array = batch.column_by_name(column).expect("the column");
        match array.as_dictionary_opt::<Int32Type>() {
            Some(dictionary) => {
                let strings = dictionary.values().as_any().downcast_ref::<StringArray>().expect("strings");
                values.extend(dictionary.keys().iter().map(|k| k.map(|k| strings.value(k as usize).to_string())));
            }
            None => values.extend(array.as_string::<i32>().iter().map(|v| v.map(str::to_string))),
        }
    }
    values
}

#[test]
fn rows_stay_right_across_many_batches() {
    // Three or more batches per event table: the buffers of written batches are reused
    // for the next ones, and a reused buffer must not carry values or nulls over (the
    // first half has null execution ids, the second none). Some events have arguments.
    let ops: Vec<Op> = (0..600_000u64)
        .map(|k| match k % 3 {
            0 => Op::System {
                core: (k % 4 != 0).then_some(1),
                name: (k % 5) as usize,
                phase: (k % 3) as u8,
                device_clock: false,
                fields: [k * 1_000, k, k / 2, 7, if k < 300_000 && k % 5 == 0 { 3 } else { k / 14 * 3 + 1 }, 0],
                args: if k % 10 == 0 { vec![(0, 1, k), (2, 2, k % 7)] } else { Vec::new() },
            },
            _ => Op::Device {
                core: (k % 2) as u32,
                descriptor: (k % 2 != 0, (k % 5) as u32, 1),
                fields: [k, k * 100, k * 100 + 40 + k % 13, 0],
                exec: (k >= 300_000 || k % 9 != 0).then_some(k / 1_000),
            },
        })
        .collect();
    let (bytes, _) = write(&ops);
    let file = NtffFile::from_bytes(bytes).expect("opens");
    let dir = tempfile::tempdir().expect("tempdir");
    let written = tables_of(&file, dir.path());
    for table in ["system_events", "instructions", "dma_transfers"] {
        assert!(written.rows(table) > Some(2 * 65_536), "{table}: {:?}", written.tables);
    }
    rows_match_events(&file, dir.path()).expect("every row matches its event");

    // The string columns and the transfers, row by row.
    let (mut system, mut device) = (Vec::new(), Vec::new());
    for info in file.select(None, None) {
        let chunk = file.read_chunk(info).expect("chunk");
        system.extend(chunk.system);
        device.extend(chunk.device);
    }
    let text = |s: ntff::Sym| file.string(s).map(str::to_string);
    assert_eq!(strings(dir.path(), "system_events", "name"), system.iter().map(|e| text(e.name)).collect::<Vec<_>>());
    let args: Vec<Option<serde_json::Value>> = strings(dir.path(), "system_events", "args")
        .into_iter()
        .map(|a| a.map(|a| serde_json::from_str(&a).expect("JSON")))
        .collect();
    let expected: Vec<Option<serde_json::Value>> = system
        .iter()
        .map(|e| {
            (!e.args.is_empty()).then(|| {
                let fields = e.args.iter().map(|a| {
                    let value = match a.value {
                        ntff::ArgValue::U64(v) => serde_json::json!(v),
                        ntff::ArgValue::I64(v) => serde_json::json!(v),
                        ntff::ArgValue::Str(s) => serde_json::json!(text(s)),
                    };
                    (text(a.key).expect("key"), value)
                });
                serde_json::Value::Object(fields.collect())
            })
        })
        .collect();
    assert_eq!(args, expected);
    let (instructions, transfers): (Vec<&ntff::DeviceEvent>, Vec<&ntff::DeviceEvent>) = device
        .iter()
        .partition(|e| matches!(file.descriptor(e.descriptor), Some(ntff::Descriptor::Instruction { .. })));
    let hlos: Vec<Option<String>> = instructions
        .iter()
        .map(|e| match file.descriptor(e.descriptor) {
            Some(ntff::Descriptor::Instruction { hlo, .. }) => text(*hlo),
            _ => None,
        })
        .collect();
    assert_eq!(strings(dir.path(), "instructions", "hlo"), hlos);
    assert_eq!(integers(dir.path(), "dma_transfers", "id"), transfers.iter().map(|e| Some(e.id)).collect::<Vec<_>>());
    assert_eq!(
        integers(dir.path(), "dma_transfers", "exec_id"),
        transfers.iter().map(|e| e.exec_id).collect::<Vec<_>>()
    );
}

#[test]
fn arguments_too_long_for_a_row_are_left_null_and_said() {
    use ntff::{Arg, ArgValue, Clock, Metadata, Phase, SystemEvent, Writer};
    let mut writer = Writer::new(Vec::new(), &Metadata { pid: 1, ..Metadata::default() }).expect("header");
    let (big, key, name) = (writer.intern(&"x".repeat(1 << 20)), writer.intern("message"), writer.intern("nrt_load"));
    for k in 0..3u64 {
        // 20 references to a 1 MiB string: 20 MiB of JSON, more than a row holds.
        let args = if k == 1 {
            (0..20).map(|_| Arg { key, value: ArgValue::Str(big) }).collect()
        } else {
            vec![Arg { key, value: ArgValue::U64(k) }]
        };
        let event = SystemEvent {
            core: None,
            id: k,
            name,
            phase: Phase::Instant,
            clock: Clock::Host,
            timestamp_ns: 1_000 + k,
            tracking_id: 0,
            thread_id: 1,
            exec_id: None,
            model_id: None,
            nrta_seq_id: None,
            args,
        };
        writer.system(&event).expect("write");
    }
    let (bytes, _) = writer.finish().expect("finish");
    let file = NtffFile::from_bytes(bytes).expect("opens");
    let dir = tempfile::tempdir().expect("tempdir");
    let written = tables_of(&file, dir.path());
    assert_eq!(
        strings(dir.path(), "system_events", "args"),
        [Some(r#"{"message":0}"#.to_string()), None, Some(r#"{"message":2}"#.to_string())]
    );
    assert!(
        written.problems.iter().any(|p| p.starts_with("1 system events have arguments longer than 16 MiB")),
        "{:?}",
        written.problems
    );
}
