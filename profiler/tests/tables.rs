//! `neuron-profile view --output-format parquet` as its users run it: the tables of real
//! captures (a synchronous attention model, tiny executions scheduled asynchronously)
//! and of files from another host with ring losses hold as many rows as the `json`
//! output lists events, in a directory per file and in the hive layout; a file cut
//! mid-write gives what it recovered and says so; and the README's queries run over the
//! hive-partitioned fleet (two hosts × two sessions) in DuckDB, Polars and Spark, give
//! the figures they promise, and the same in all three.
//!
//! The engines come from PyPI into a virtual environment under the target directory,
//! kept between runs; Spark also needs a Java runtime (Debian's `openjdk-17-jre-headless`).
//! Without a Python 3 that can make one (or without the package index, or Java for
//! Spark), that part is skipped with a note, except in CI (`CI=true`), where it fails.

use neuron_test_support::ci::in_ci;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
mod common;

use common::{TINY, neuron_profile as run};
use ntff::{ArgValue, Clock, ClockCalibration, Metadata, Phase, SystemEvent, Writer};
use parquet::file::reader::{FileReader, SerializedFileReader};
use serde_json::Value;

/// The engines the README's queries are tested with, from PyPI.
const ENGINES: [(&str, &str); 3] = [("duckdb", "2.0.1"), ("polars", "2.1.0"), ("pyspark", "3.5.9")];

fn example(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples").join(name).display().to_string()
}

fn utf8(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// Rows of `dir/table.parquet`, from its footer.
fn rows(dir: &Path, table: &str) -> u64 {
    rows_of(&dir.join(format!("{table}.parquet")))
}

fn rows_of(path: &Path) -> u64 {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    SerializedFileReader::new(file).expect("Parquet").metadata().file_metadata().num_rows() as u64
}

/// Rows of a session's table in a hive-partitioned `fleet`: its one file.
fn hive_rows(fleet: &Path, table: &str, host: &str, session: &str) -> u64 {
    let dir = fleet.join(table).join(format!("host={host}")).join(format!("session={session}"));
    let files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("entry").path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(files[0].file_name().is_some_and(|n| n.to_string_lossy().starts_with("part-")), "{files:?}");
    rows_of(&files[0])
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
    // Two sessions of another host.
    lossy_file(&profiles.join("lossy.ntff"), false);
    let long = profiles.join("long.ntff");
    lossy_file(&long, true);

    let tables = dir.join("tables");
    let out = run(dir, &["view", "-d", utf8(&profiles), "--output-format", "parquet", "--output-file", utf8(&tables)]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("wrote the tables of 4 files"), "{stderr}");
    let fleet = dir.join("fleet");
    let args = ["view", "-d", utf8(&profiles), "--output-format", "parquet", "--parquet-layout", "hive"];
    run(dir, &[&args[..], &["--output-file", utf8(&fleet)]].concat());
    let this_host = std::fs::read_dir(fleet.join("profile"))
        .expect("the profile table's partitions")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .find(|name| name != "host=other-host")
        .expect("this host's partition");
    let this_host = this_host.trim_start_matches("host=");
    for (host, stem) in
        [(this_host, "attention"), (this_host, "tiny-async"), ("other-host", "lossy"), ("other-host", "long")]
    {
        let counts = json_counts(dir, &profiles.join(format!("{stem}.ntff")));
        assert_eq!(table_counts(&tables.join(stem)), counts, "{stem}: rows against the json output's events");
        let in_partitions = ["system_events", "instructions", "dma_transfers", "losses"]
            .map(|table| hive_rows(&fleet, table, host, stem));
        assert_eq!(in_partitions, counts, "{stem}: rows of the hive layout");
        assert!(counts[0] > 0, "{stem}");
    }
    assert!(rows(&tables.join("attention"), "instructions") > 12 * 10);
    assert_eq!(rows(&tables.join("lossy"), "losses"), 1);
    assert_eq!(rows(&tables.join("attention"), "execution_bounds"), 12);

    // A file cut mid-write: what it recovered, and a note that says so.
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

    let Some(python) = engines_python() else { return };
    let queries = readme_sql();
    assert_eq!(queries.len(), 5, "the README shows five queries");
    let duckdb = run_queries(&python, "duckdb", &fleet, &queries);
    check_readme_figures(&duckdb);
    let polars = run_queries(&python, "polars", &fleet, &queries);
    same_results(&duckdb, &polars, "Polars");
    if java_runs() {
        let started = std::time::Instant::now();
        let spark = run_queries(&python, "spark", &fleet, &queries);
        eprintln!("Spark read the fleet and ran the queries in {:.1} s", started.elapsed().as_secs_f64());
        same_results(&duckdb, &spark, "Spark");
    }
}

/// Runs `queries` over the hive-partitioned `fleet` in `engine` (`duckdb`, `polars`
/// or `spark`), with `fleet_sql.py`: each query's result, as JSON.
fn run_queries(python: &Path, engine: &str, fleet: &Path, queries: &[String]) -> Vec<Value> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fleet_sql.py");
    let mut child = Command::new(python)
        .arg(&script)
        .args([engine, utf8(fleet)])
        .current_dir(fleet.parent().expect("a parent"))
        .env("SPARK_LOCAL_IP", "127.0.0.1")
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
    assert!(out.status.success(), "{engine}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("results")
}

/// Whether two engines' results are the same: the same columns and rows in the same
/// order, numbers equal to within one unit of the last place they were rounded to.
fn same_results(expected: &[Value], got: &[Value], engine: &str) {
    assert_eq!(expected.len(), got.len(), "{engine}: results of every query");
    for (k, (a, b)) in expected.iter().zip(got).enumerate() {
        assert_eq!(a["columns"], b["columns"], "{engine}, query {}: columns", k + 1);
        let (rows_a, rows_b) = (a["rows"].as_array().expect("rows"), b["rows"].as_array().expect("rows"));
        assert_eq!(rows_a.len(), rows_b.len(), "{engine}, query {}: rows\n{a}\n{b}", k + 1);
        for (x, y) in rows_a
            .iter()
            .flat_map(|r| r.as_array().expect("row"))
            .zip(rows_b.iter().flat_map(|r| r.as_array().expect("row")))
        {
            let same = match (x.as_f64(), y.as_f64()) {
                (Some(x), Some(y)) => (x - y).abs() <= 0.1 + 1e-9 * x.abs(),
                _ => x == y,
            };
            assert!(same, "{engine}, query {}: {x} against {y}\n{a}\n{b}", k + 1);
        }
    }
}

/// Checks the figures of the README's five queries, as DuckDB gives them.
fn check_readme_figures(results: &[Value]) {
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
    // also an `nrt_execute` of the runtime's worker), and the other host's 2 + 22: 20
    // of 40 µs, one of 50 and one of 70 in each file, and the times of the files'
    // clock (monotonic 1,000 ns after the calibration's offset).
    let latency = table(1);
    assert_eq!(latency.len(), 2, "{latency:?}");
    let other = latency.iter().find(|r| r["host"] == "other-host").expect("the other host");
    assert_eq!(other["executions"], 24);
    assert_eq!(f(&other["p50_us"]), 40.0, "{other:?}");
    assert_eq!(f(&other["max_us"]), 70.0, "{other:?}");
    assert_eq!(other["first_start"], "2023-11-14 22:13:20.000001", "{other:?}");
    let here = latency.iter().find(|r| r["host"] != "other-host").expect("this host");
    assert_eq!(here["executions"], 312, "{here:?}");
    assert!(f(&here["p50_us"]) <= f(&here["max_us"]));

    // Lost events: the two profiles that lost some.
    let lost = table(2);
    assert_eq!(lost.len(), 2, "{lost:?}");
    for row in &lost {
        assert_eq!(
            (&row["host"], &row["lost"], &row["core"], &row["ring"]),
            (&"other-host".into(), &123.into(), &0.into(), &"system".into()),
            "{row:?}"
        );
    }

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

/// A Python with the [`ENGINES`], set up once under the target directory; `None` (a
/// skip, outside CI) without Python's `venv` or the package index.
fn engines_python() -> Option<PathBuf> {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fleet-sql-venv");
    let pins: Vec<String> = ENGINES.iter().map(|(name, version)| format!("{name}=={version}")).collect();
    let ready = |python: &Path| {
        let check: Vec<String> = ENGINES
            .iter()
            .map(|(name, version)| format!("import {name}; assert {name}.__version__ == '{version}'"))
            .collect();
        Command::new(python).args(["-c", &check.join("\n")]).output().is_ok_and(|o| o.status.success())
    };
    neuron_test_support::python::cached_venv(&venv, &pins, ready, "the README's queries")
}

/// Whether a Java runtime runs, for Spark; a skip with a note outside CI when none does.
fn java_runs() -> bool {
    let runs = Command::new("java").arg("-version").output().is_ok_and(|o| o.status.success());
    if !runs {
        assert!(!in_ci(), "CI needs a Java runtime for Spark (Debian's openjdk-17-jre-headless)");
        eprintln!("note: no Java runtime; the README's queries are not run in Spark");
    }
    runs
}
