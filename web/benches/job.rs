//! A job's rank profiles on one timeline: how long the dashboard takes to open 8 rank
//! profiles of 1 million events each together (`/api/job`: each file's clock anchors
//! read, each indexed on rank 0's clock, the collectives joined across the ranks) and
//! paint the whole job, against opening and painting the same 8 files one at a time as
//! separate profiles, in the same run, through the HTTP API on loopback.
//!
//! Each file is written with the NTFF writer in the shape a rank's runtime records: its
//! clock offset to rank 0's (each rank's host clock a millisecond further off), and per
//! execution an `nrt_execute` span, a `cc_running` span (the all-reduce, with its
//! communicator, sequence and position), an `nc_exec_running` span with a sync point, and
//! 96 instructions and transfers.
//!
//! `cargo bench -p neuron-dashboard --bench job [-- EVENTS_PER_RANK]` (1,000,000 by default;
//! `JOB_PROFILE_DIR=DIR` keeps the profiles there)

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Instant;

use neuron_dashboard::{Dashboard, Options};
use neuron_test_support::http::http_get;
use ntff::{Arg, ArgValue, Clock, DeviceEvent, Metadata, Phase, SyncPoint, SystemEvent, Writer};

const RANKS: u32 = 8;
const INSTRUCTIONS_PER_EXECUTION: usize = 96;
const EVENTS_PER_EXECUTION: u64 = INSTRUCTIONS_PER_EXECUTION as u64 + 7;
const COLUMNS: u32 = 1600;
const ENGINES: [(&str, &str, u64); 6] = [
    ("DMA", "input", 4_000),
    ("PE", "MatMul", 30_000),
    ("ACT", "Gelu", 6_000),
    ("DVE", "Add", 3_000),
    ("SP", "AllReduce", 9_000),
    ("DMA", "output", 4_000),
];

/// Rank `rank`'s profile of `events` events; its host clock reads `rank` ms ahead of
/// rank 0's, which its first event says.
fn write_rank(path: &Path, rank: u32, events: u64) -> u64 {
    let metadata = Metadata {
        runtime_version: "bench".into(),
        pid: 5000 + rank,
        host: format!("host{}", rank / 2),
        instance_type: "trn1.32xlarge".into(),
        capture_kind: "inspect".into(),
        ..Metadata::default()
    };
    let mut w = Writer::create(path, &metadata).expect("creates the profile");
    let descriptors = common::program_descriptors(&mut w, &ENGINES, INSTRUCTIONS_PER_EXECUTION);
    let names = ["nrt_execute", "nc_exec_running", "cc_running", "clock_offset"].map(|n| w.intern(n));
    let [execute, running, collective, clock_offset] = names;
    let keys = ["communicator", "sequence", "op_id", "rank", "offset_ns", "uncertainty_ns"].map(|k| w.intern(k));
    let shift = u64::from(rank) * 1_000_000;
    let core = rank;
    let system = |name, phase, clock, ts, exec: u64, args: Vec<Arg>| SystemEvent {
        core: Some(core),
        id: exec,
        name,
        phase,
        clock,
        timestamp_ns: ts,
        tracking_id: exec,
        thread_id: 100,
        exec_id: Some(exec),
        model_id: Some(1),
        nrta_seq_id: None,
        args,
    };
    let mut host = 1_000_000_000 + shift;
    let offset = vec![
        Arg { key: keys[4], value: ArgValue::I64(-(shift as i64)) },
        Arg { key: keys[5], value: ArgValue::U64(15_000) },
    ];
    w.system(&SystemEvent { core: None, ..system(clock_offset, Phase::Instant, Clock::Host, host, 0, offset) })
        .expect("write");
    let device_offset = 5_000_000;
    let mut written = 1;
    for exec in 1..=events / EVENTS_PER_EXECUTION {
        w.system(&system(execute, Phase::Start, Clock::Host, host, exec, Vec::new())).expect("write");
        let mut device = host + 20_000 - device_offset;
        w.system(&system(running, Phase::Start, Clock::Device, device, exec, Vec::new())).expect("write");
        let mut last = device;
        for (k, (descriptor, ns)) in descriptors.iter().enumerate() {
            let start = device + k as u64 * 800;
            last = last.max(start + ns);
            let e = DeviceEvent {
                core,
                id: exec * 1000 + k as u64,
                exec_id: Some(exec),
                start_ns: start,
                end_ns: start + ns,
                descriptor: *descriptor,
            };
            w.device(&e).expect("write");
        }
        // The all-reduce: each rank arrives a little later than the one before.
        let arrive = last + device_offset + u64::from(rank) * 2_000;
        let depart = last + device_offset + 20_000;
        let args = |r| {
            vec![
                Arg { key: keys[0], value: ArgValue::U64(0) },
                Arg { key: keys[1], value: ArgValue::U64(exec) },
                Arg { key: keys[2], value: ArgValue::U64(0) },
                Arg { key: keys[3], value: ArgValue::U64(r) },
            ]
        };
        let cc = SystemEvent {
            tracking_id: exec << 1,
            ..system(collective, Phase::Start, Clock::Host, arrive, exec, args(u64::from(rank)))
        };
        w.system(&cc).expect("write");
        w.system(&SystemEvent { phase: Phase::Stop, timestamp_ns: depart, ..cc.clone() }).expect("write");
        device = last + 21_000;
        w.system(&system(running, Phase::Stop, Clock::Device, device, exec, Vec::new())).expect("write");
        w.sync_point(core, SyncPoint { host_ns: device + device_offset, device_ns: device }).expect("write");
        w.system(&system(execute, Phase::Stop, Clock::Host, device + device_offset + 5_000, exec, Vec::new()))
            .expect("write");
        host = device + device_offset + 40_000;
        written += EVENTS_PER_EXECUTION;
    }
    w.finish().expect("finishes");
    written
}

/// A dashboard on `dir` that has opened nothing yet.
fn dashboard(dir: &Path, scratch: &Path) -> Dashboard {
    let mut options = Options::new(SocketAddr::from(([127, 0, 0, 1], 0))).expect("options");
    options.profiles = Some(dir.to_path_buf());
    options.datastore_dir = scratch.join("datastores");
    Dashboard::start(options).expect("starts")
}

/// Opens `api` (a profile's or the job's) and paints it whole: the milliseconds, and
/// the spans it holds.
fn open_and_paint(addr: SocketAddr, api: &str) -> (f64, u64) {
    let started = Instant::now();
    let (status, meta) = http_get(addr, api);
    assert_eq!(status, 200, "{api}: {meta}");
    let meta: serde_json::Value = serde_json::from_str(&meta).expect("json");
    let duration = meta["duration_ns"].as_u64().expect("duration");
    let (status, view) = http_get(addr, &format!("{api}/view?t0=0&t1={duration}&columns={COLUMNS}"));
    assert_eq!(status, 200, "{view}");
    (started.elapsed().as_secs_f64() * 1e3, meta["events"].as_u64().unwrap_or(0))
}

fn main() {
    let events: u64 = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(1_000_000);
    let dir = tempfile::tempdir().expect("tempdir");
    // JOB_PROFILE_DIR keeps the profiles, e.g. to open them in a browser afterwards.
    let profiles = std::env::var_os("JOB_PROFILE_DIR").map_or_else(|| dir.path().join("job"), std::path::PathBuf::from);
    std::fs::create_dir_all(&profiles).expect("mkdir");
    let started = Instant::now();
    let written: u64 =
        (0..RANKS).map(|rank| write_rank(&profiles.join(format!("profile_rank_{rank}.ntff")), rank, events)).sum();
    println!("{RANKS} rank profiles: {written} events in all, written in {:.1} s", started.elapsed().as_secs_f64());
    println!("round  one at a time (baseline)  together (/api/job)  together / baseline");
    for round in 1..=3 {
        // The baseline: each file opened and painted as a profile of its own.
        let alone = dashboard(&profiles, dir.path());
        let (mut baseline, mut spans) = (0.0, 0);
        for rank in 0..RANKS {
            let (ms, n) = open_and_paint(alone.addr(), &format!("/api/profiles/profile_rank_{rank}.ntff"));
            baseline += ms;
            spans += n;
        }
        drop(alone);
        let together = dashboard(&profiles, dir.path());
        let (ms, joined) = open_and_paint(together.addr(), "/api/job");
        assert_eq!(joined, spans, "the job holds every rank's spans");
        let (_, meta) = http_get(together.addr(), "/api/job");
        let meta: serde_json::Value = serde_json::from_str(&meta).expect("json");
        println!(
            "{round:>5}  {baseline:>21.0} ms  {ms:>15.0} ms  {:>19.2}   ({} spans, {} collectives joined)",
            ms / baseline,
            joined,
            meta["collectives"]
        );
    }
    println!("goal: the job's {RANKS} rank profiles of {events} events each open and paint in ≤ 2 s");
}
