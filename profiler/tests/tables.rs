//! `neuron-profile view --output-format parquet` as its users run it: the tables of real
//! captures (a synchronous attention model, tiny executions scheduled asynchronously)
//! and of a file with a ring loss hold as many rows as the `json` output lists events;
//! a file cut mid-write gives what it recovered and says so; and the README's DuckDB
//! queries run over the fleet of their directories and give the figures they promise.
//!
//! DuckDB comes from PyPI into a virtual environment under the target directory, kept
//! between runs. Without a Python 3 that can make one (or without the package index),
//! that part is skipped with a note, except in CI (`CI=true`), where it fails.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
mod common;

use common::{TINY, neuron_profile as run};
use ntff::{ArgValue, Clock, ClockCalibration, Metadata, Phase, SystemEvent, Writer};
use parquet::file::reader::{FileReader, SerializedFileReader};
use serde_json::Value;

/// The DuckDB the README's queries are tested with.
const DUCKDB: &str = "2.0.1";

fn example(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples").join(name).display().to_string()
}

fn utf8(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// Rows of `dir/table.parquet`, from its footer.
fn rows(dir: &Path, table: &str) -> u64 {
    let file = std::fs::File::open(dir.join(format!("{table}.parquet"))).expect("table file");
    SerializedFileReader::new(file).expect("Parquet").metadata().file_metadata().num_rows() as u64
}

/// Events of `file` in the `json` output: system, instruction and DMA events, and losses.
fn json_counts(dir: &Path, file: &Path) -> [u64; 4] {
    let out = run(dir, &["view", "-s", utf8(file), "--output-format", "json"]);
    let json: Value = serde_json::from_slice(&out.stdout).expect("json output");
    let mut counts = [0u64; 4];
    for e in json["events"].as_array().expect("events") {
        match e["event_type"].as_str() {
            Some("instruction") => counts[1] += 1,
            Some("dma") => counts[2] += 1,
            _ => counts[0] += 1,
        }
    }
    counts[3] = json["losses"].as_array().expect("losses").len() as u64;
    counts
}

fn table_counts(dir: &Path) -> [u64; 4] {
    ["system_events", "instructions", "dma_transfers", "losses"].map(|t| rows(dir, t))
}

/// A file from another host, whose system ring on core 0 lost 123 events between two
/// executions; with `chunks`, 20 more executions, each in a chunk of its own (as a
/// long capture writes them).
fn lossy_file(path: &Path, chunks: bool) {
    let metadata = Metadata {
        runtime_version: "synthetic".into(),
        pid: 7,
        host: "other-host".into(),
        clock: Some(ClockCalibration { realtime_minus_monotonic_ns: 1_700_000_000_000_000_000 }),
        ..Metadata::default()
    };
    let mut w = Writer::create(path, &metadata).expect("create");
    let execute = w.intern("nrt_execute");
    let event = |phase, ts: u64, exec: u64| SystemEvent {
        core: Some(0),
        id: ts,
        name: execute,
        phase,
        clock: Clock::Host,
        timestamp_ns: ts,
        tracking_id: exec,
        thread_id: 7,
        exec_id: Some(exec),
        model_id: Some(1),
        nrta_seq_id: None,
        args: Vec::new(),
    };
    w.system(&event(Phase::Start, 1_000, 1)).expect("write");
    w.system(&event(Phase::Stop, 51_000, 1)).expect("write");
    w.loss(Some(0), false, 123).expect("write");
    w.system(&event(Phase::Start, 90_000, 2)).expect("write");
    let mut stop = event(Phase::Stop, 160_000, 2);
    let status = w.intern("status");
    stop.args.push(ntff::Arg { key: status, value: ArgValue::I64(1006) });
    w.system(&stop).expect("write");
    for exec in (3..23).filter(|_| chunks) {
        w.flush().expect("flush");
        w.system(&event(Phase::Start, exec * 100_000, exec)).expect("write");
        w.system(&event(Phase::Stop, exec * 100_000 + 40_000, exec)).expect("write");
    }
    w.finish().expect("finish");
}

#[test]
fn parquet_tables_hold_every_event_and_answer_the_readme_queries() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dir = dir.path();
    let profiles = dir.join("profiles");
    std::fs::create_dir_all(&profiles).expect("mkdir");
    let attention = profiles.join("attention.ntff");
    run(
        dir,
        &[
            "capture",
            "-n",
            &example("attention.hlo"),
            "-s",
            utf8(&attention),
            "--num-exec",
            "12",
            "--profile-all-execs",
        ],
    );
    let tiny = dir.join("tiny.hlo");
    std::fs::write(&tiny, TINY).expect("write the model");
    let scheduled = profiles.join("tiny-async.ntff");
    run(
        dir,
        &[
            "capture",
            "-n",
            utf8(&tiny),
            "-s",
            utf8(&scheduled),
            "--num-exec",
            "300",
            "--profile-all-execs",
            "--exec-mode",
            "async",
        ],
    );
    lossy_file(&profiles.join("lossy.ntff"), false);

    let fleet = dir.join("fleet");
    let out = run(dir, &["view", "-d", utf8(&profiles), "--output-format", "parquet", "--output-file", utf8(&fleet)]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("wrote the tables of 3 files"), "{stderr}");
    for stem in ["attention", "tiny-async", "lossy"] {
        let counts = json_counts(dir, &profiles.join(format!("{stem}.ntff")));
        assert_eq!(table_counts(&fleet.join(stem)), counts, "{stem}: rows against the json output's events");
        assert!(counts[0] > 0, "{stem}");
    }
    assert!(rows(&fleet.join("attention"), "instructions") > 12 * 10);
    assert_eq!(rows(&fleet.join("lossy"), "losses"), 1);
    assert_eq!(rows(&fleet.join("attention"), "execution_bounds"), 12);

    // A file cut mid-write: what it recovered, and a note that says so.
    let long = dir.join("long.ntff");
    lossy_file(&long, true);
    let bytes = std::fs::read(&long).expect("read");
    let cut = dir.join("cut.ntff");
    std::fs::write(&cut, &bytes[..bytes.len() * 3 / 5]).expect("write");
    let (whole, counts) = (json_counts(dir, &long), json_counts(dir, &cut));
    assert!(counts[0] > 4 && counts[0] < whole[0], "part of the events: {counts:?} of {whole:?}");
    let cut_tables = dir.join("cut-tables");
    let out = run(dir, &["view", "-s", utf8(&cut), "--output-format", "parquet", "--output-file", utf8(&cut_tables)]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("note:") && stderr.contains("recovered"), "{stderr}");
    assert_eq!(table_counts(&cut_tables), counts);

    let Some(python) = duckdb_python() else { return };
    readme_queries(&python, dir);
}

/// Runs the README's five queries with DuckDB in `dir` (which holds `fleet/`) and
/// checks what each gives.
fn readme_queries(python: &Path, dir: &Path) {
    let queries = readme_sql();
    assert_eq!(queries.len(), 5, "the README shows five queries");
    let script = "import duckdb, json, sys\n\
                  out = []\n\
                  for q in json.load(sys.stdin):\n    \
                      r = duckdb.sql(q)\n    \
                      out.append({'columns': r.columns, 'rows': r.fetchall()})\n\
                  print(json.dumps(out, default=str))\n";
    let mut child = Command::new(python)
        .args(["-c", script])
        .current_dir(dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python runs");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(serde_json::to_string(&queries).expect("json").as_bytes()).expect("write");
    }
    let out = child.wait_with_output().expect("python runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let results: Vec<Value> = serde_json::from_slice(&out.stdout).expect("results");
    let table = |k: usize| -> Vec<HashMap<String, Value>> {
        let columns: Vec<String> = results[k]["columns"]
            .as_array()
            .expect("columns")
            .iter()
            .map(|c| c.as_str().unwrap_or("").into())
            .collect();
        results[k]["rows"]
            .as_array()
            .expect("rows")
            .iter()
            .map(|r| columns.iter().cloned().zip(r.as_array().expect("row").iter().cloned()).collect())
            .collect()
    };
    let f = |v: &Value| v.as_f64().unwrap_or(f64::NAN);

    // Top instructions: attention's, by device time, largest first.
    let top = table(0);
    assert!(top.len() >= 3, "{top:?}");
    assert!(top.windows(2).all(|w| f(&w[0]["device_ms"]) >= f(&w[1]["device_ms"])), "{top:?}");
    assert!(f(&top[0]["device_ms"]) > 0.0);

    // Latency per host: this host's 12 synchronous and 300 scheduled executions (each
    // also an `nrt_execute` of the runtime's worker), and the other host's 2.
    let latency = table(1);
    assert_eq!(latency.len(), 2, "{latency:?}");
    let other = latency.iter().find(|r| r["host"] == "other-host").expect("the other host");
    assert_eq!(other["executions"], 2);
    assert_eq!(f(&other["p50_us"]), 60.0, "50 and 70 µs: {other:?}");
    let here = latency.iter().find(|r| r["host"] != "other-host").expect("this host");
    assert_eq!(here["executions"], 312, "{here:?}");
    assert!(f(&here["p50_us"]) <= f(&here["p99_us"]));

    // Lost events: the one profile that lost some.
    let lost = table(2);
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!(lost[0]["lost"], 123);
    assert_eq!(lost[0]["core"], 0);
    assert_eq!(lost[0]["ring"], "system");

    // Findings: the scheduled tiny executions leave the device idle.
    let findings = table(3);
    assert!(findings.iter().any(|r| r["kind"] == "idle" && r["about"] == "host"), "{findings:?}");

    // The slowest traced executions with their bounds: attention's (tens of
    // milliseconds each in a debug build, against microseconds for the tiny model),
    // each bounded by its busiest resource.
    let slowest = table(4);
    assert_eq!(slowest.len(), 10, "{slowest:?}");
    let attention = slowest.iter().filter(|r| r["session"] == "attention").count();
    assert!(attention >= 8, "{slowest:?}");
    for r in slowest.iter().filter(|r| r["session"] == "attention") {
        assert!(f(&r["pipeline_us"]) > 0.0 && r["pipeline_resource"].as_str().is_some_and(|s| !s.is_empty()), "{r:?}");
        assert_eq!(r["model"], "attention");
    }
}

/// The SQL blocks of the README's Parquet section.
fn readme_sql() -> Vec<String> {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md")).expect("README");
    let section = readme.split("Five queries over a fleet").nth(1).expect("the README's queries");
    let mut queries = Vec::new();
    let mut current: Option<String> = None;
    for line in section.lines() {
        let line = line.trim_start();
        match (&mut current, line) {
            (None, "```sql") => current = Some(String::new()),
            (Some(q), "```") => {
                queries.push(std::mem::take(q));
                current = None;
            }
            (Some(q), line) => {
                q.push_str(line);
                q.push('\n');
            }
            (None, line) if line.starts_with("- ") || line.starts_with("##") => break,
            (None, _) => {}
        }
    }
    queries
}

/// A Python with DuckDB `DUCKDB`, set up once under the target directory; `None` (a
/// skip, outside CI) without Python's `venv` or the package index.
fn duckdb_python() -> Option<PathBuf> {
    let in_ci = std::env::var("CI").as_deref() == Ok("true");
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("duckdb-venv");
    let python = venv.join("bin/python");
    let ready = |python: &Path| {
        let check = format!("import duckdb, sys; sys.exit(duckdb.__version__ != '{DUCKDB}')");
        Command::new(python).args(["-c", &check]).output().is_ok_and(|o| o.status.success())
    };
    if ready(&python) {
        return Some(python);
    }
    let _ = std::fs::remove_dir_all(&venv);
    let made = Command::new("python3").args(["-m", "venv"]).arg(&venv).output().is_ok_and(|o| o.status.success());
    let installed = made
        && Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", &format!("duckdb=={DUCKDB}")])
            .output()
            .is_ok_and(|o| o.status.success());
    if !installed || !ready(&python) {
        assert!(!in_ci, "CI needs python3 with venv and duckdb=={DUCKDB} from PyPI");
        eprintln!("note: no python3 venv with duckdb=={DUCKDB} (PyPI); the README's queries are not run");
        return None;
    }
    Some(python)
}
