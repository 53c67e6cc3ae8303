//! Level of detail on a large profile: how long the dashboard takes to show the first
//! paint of a 10-million-event profile, and to answer pans and zooms, measured through
//! its HTTP API on loopback.
//!
//! The profile is written with the NTFF writer in the shape the runtime records: per
//! execution an `nrt_execute` span (host clock), an `nc_exec_running` span and a sync
//! point (device clock), and the device trace of the program: instructions on five
//! engines and transfers on three DMA queues. The baseline is what a viewer without an
//! index does for every view: decode the file's events again.
//!
//! `cargo bench -p neuron-dashboard --bench lod [-- EVENTS]` (`LOD_PROFILE_DIR=DIR` keeps
//! the profile there as `large.ntff`)

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Instant;

use neuron_dashboard::{Dashboard, Options};
use neuron_test_support::http::http_get;
use ntff::{Arg, Clock, DeviceEvent, Metadata, NtffFile, Phase, SyncPoint, SystemEvent, Writer};

/// Instructions and transfers of one execution, and their length on the device.
const PROGRAM: [(&str, &str, u64); 12] = [
    ("DMA", "input", 4_000),
    ("DMA", "input", 4_000),
    ("DMA", "weights", 9_000),
    ("PE", "MatMul", 30_000),
    ("ACT", "Gelu", 6_000),
    ("DVE", "Add", 3_000),
    ("POOL", "Reduce", 2_000),
    ("PE", "MatMul", 30_000),
    ("SP", "Shuffle", 1_500),
    ("DVE", "RoundPrecision", 5_000),
    ("ACT", "Exp", 4_000),
    ("DMA", "output", 4_000),
];
const CORES: u32 = 2;
const INSTRUCTIONS_PER_EXECUTION: usize = 96;
const COLUMNS: u32 = 1600;

fn write_profile(path: &Path, events: u64) -> u64 {
    let metadata = Metadata {
        runtime_version: "bench".into(),
        pid: 4242,
        process_tag: "lod".into(),
        instance_type: "trn1.2xlarge".into(),
        capture_kind: "inspect".into(),
        ..Metadata::default()
    };
    let mut w = Writer::create(path, &metadata).expect("creates the profile");
    let descriptors = common::program_descriptors(&mut w, &PROGRAM, INSTRUCTIONS_PER_EXECUTION);
    let (execute, running) = (w.intern("nrt_execute"), w.intern("nc_exec_running"));
    let per_execution = INSTRUCTIONS_PER_EXECUTION as u64 + 4;
    let executions = events / per_execution;
    let mut clocks = vec![1_000_000_000u64; CORES as usize];
    let mut written = 0;
    for k in 0..executions {
        let core = (k % u64::from(CORES)) as u32;
        let host = clocks[core as usize];
        let offset = 5_000_000 + u64::from(core) * 777;
        let exec = k + 1;
        let system = |name, phase, clock, ts, args: Vec<Arg>| SystemEvent {
            core: Some(core),
            id: exec,
            name,
            phase,
            clock,
            timestamp_ns: ts,
            tracking_id: exec,
            thread_id: 100 + core,
            exec_id: Some(exec),
            model_id: Some(1),
            nrta_seq_id: None,
            args,
        };
        w.system(&system(execute, Phase::Start, Clock::Host, host, Vec::new())).expect("write");
        let mut device = host + 20_000 - offset;
        w.system(&system(running, Phase::Start, Clock::Device, device, Vec::new())).expect("write");
        // Engines run side by side: each instruction starts when its engine is free.
        let mut free: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
        let mut last = device;
        for (k, (descriptor, ns)) in descriptors.iter().enumerate() {
            let engine = PROGRAM[k % PROGRAM.len()].0;
            let start = (*free.get(engine).unwrap_or(&device)).max(device + (k as u64) * 800);
            let end = start + ns;
            free.insert(engine, end);
            last = last.max(end);
            let e = DeviceEvent {
                core,
                id: exec * 1000 + k as u64,
                exec_id: Some(exec),
                start_ns: start,
                end_ns: end,
                descriptor: *descriptor,
            };
            w.device(&e).expect("write");
        }
        device = last + 1_000;
        w.system(&system(running, Phase::Stop, Clock::Device, device, Vec::new())).expect("write");
        w.sync_point(core, SyncPoint { host_ns: device + offset, device_ns: device }).expect("write");
        w.system(&system(execute, Phase::Stop, Clock::Host, device + offset + 15_000, Vec::new())).expect("write");
        clocks[core as usize] = device + offset + 40_000;
        written += per_execution;
    }
    w.finish().expect("finishes");
    written
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn main() {
    let events: u64 = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(10_000_000);
    let dir = tempfile::tempdir().expect("tempdir");
    // LOD_PROFILE_DIR keeps the profile, e.g. to open it in a browser afterwards.
    let kept = std::env::var_os("LOD_PROFILE_DIR").map(std::path::PathBuf::from);
    let path = kept.as_deref().unwrap_or(dir.path()).join("large.ntff");
    let started = Instant::now();
    let written = write_profile(&path, events);
    let bytes = std::fs::metadata(&path).expect("size").len();
    println!(
        "profile: {written} events ({} executions on {CORES} cores), {:.0} MB, written in {:.1} s",
        written / (INSTRUCTIONS_PER_EXECUTION as u64 + 4),
        bytes as f64 / 1e6,
        started.elapsed().as_secs_f64()
    );

    // Baseline: decoding the file's events once (on every core), as an index-less viewer
    // does per view.
    let file = NtffFile::open(&path).expect("opens");
    let started = Instant::now();
    let mut decoded = 0u64;
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    file.for_each_chunk(file.chunks(), threads, |_, chunk| -> Result<(), ()> {
        if let Ok(c) = chunk {
            decoded += (c.system.len() + c.device.len()) as u64;
        }
        Ok(())
    })
    .expect("decodes");
    let naive = started.elapsed().as_secs_f64() * 1e3;
    drop(file);

    let mut options = Options::new(SocketAddr::from(([127, 0, 0, 1], 0))).expect("options");
    options.profiles = Some(path.parent().expect("a directory").to_path_buf());
    options.datastore_dir = dir.path().join("datastores");
    let dashboard = Dashboard::start(options).expect("starts");
    let addr = dashboard.addr();
    let started = Instant::now();
    let (status, meta) = http_get(addr, "/api/profiles/large.ntff");
    assert_eq!(status, 200, "the profile opens: {meta}");
    let opened = started.elapsed().as_secs_f64() * 1e3;
    let meta_bytes = meta.len();
    let meta: serde_json::Value = serde_json::from_str(&meta).expect("json");
    let duration = meta["duration_ns"].as_u64().expect("duration");
    let started = Instant::now();
    let (status, first) =
        http_get(addr, &format!("/api/profiles/large.ntff/view?t0=0&t1={duration}&columns={COLUMNS}"));
    let first_bytes = first.len();
    assert_eq!(status, 200);
    let first_view = started.elapsed().as_secs_f64() * 1e3;
    println!(
        "first paint: {:.0} ms = open and index {opened:.0} ms ({meta_bytes} bytes) + whole-profile view {first_view:.1} ms ({first_bytes} bytes); {} spans on {} tracks",
        opened + first_view,
        meta["events"],
        meta["tracks"].as_array().map_or(0, Vec::len)
    );

    // Pans and zooms: a walk from the whole profile down to single instructions and
    // back, panning at every level, as a person exploring it would.
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    let mut random = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng >> 11) as f64 / (1u64 << 53) as f64
    };
    let (mut times, mut sizes) = (Vec::new(), Vec::new());
    let mut raw = 0;
    for step in 0..200 {
        let level = (step % 40) as f64 / 39.0; // 0: whole profile, 1: 20 µs
        let span = (duration as f64 * (20_000.0 / duration as f64).powf(level)).max(20_000.0) as u64;
        let t0 = (random() * (duration - span) as f64) as u64;
        let started = Instant::now();
        let (status, view) =
            http_get(addr, &format!("/api/profiles/large.ntff/view?t0={t0}&t1={}&columns={COLUMNS}", t0 + span));
        assert_eq!(status, 200);
        times.push(started.elapsed().as_secs_f64() * 1e3);
        sizes.push(view.len());
        raw += usize::from(level > 0.8);
    }
    times.sort_by(f64::total_cmp);
    sizes.sort_unstable();
    let (p50, p99, max) = (percentile(&times, 0.5), percentile(&times, 0.99), times[times.len() - 1]);
    println!(
        "pan/zoom views ({} at {COLUMNS} columns, spans from the whole profile to 20 µs, {raw} of them zoomed in to single instructions):",
        times.len()
    );
    println!("| | p50 | p99 | max | response size p50 / max |");
    println!("|---|---|---|---|---|");
    println!(
        "| view | {p50:.1} ms | {p99:.1} ms | {max:.1} ms | {} / {} KB |",
        sizes[sizes.len() / 2] / 1000,
        sizes[sizes.len() - 1] / 1000
    );
    println!("| baseline: decode every event once ({decoded} events) | {naive:.0} ms | | | |");
    println!("ratio: a view's p99 is {:.3}x the baseline (1/{:.0})", p99 / naive, naive / p99);
    browser(&path);
    let rss = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("VmHWM:").map(|v| v.trim().to_string())));
    println!("peak memory of this process (dashboard and the benchmark): {}", rss.unwrap_or_default());
}

/// The same profile opened in a headless Chromium, five times, each on a dashboard that
/// has not indexed it yet: from navigation to the first drawn timeline, and zoom steps
/// from the wheel to the drawn view. Skipped, with a note, without Node.js and Chromium.
fn browser(profile: &Path) {
    let e2e = Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e");
    let chromium = std::env::var_os("CHROMIUM").unwrap_or_else(|| "/usr/bin/chromium".into());
    if !e2e.join("node_modules/playwright-core").exists() || !Path::new(&chromium).exists() {
        println!("in the browser: skipped (needs npm ci --prefix web/e2e and Chromium)");
        return;
    }
    let dir = profile.parent().expect("a directory");
    let name = profile.file_name().and_then(|n| n.to_str()).expect("a name");
    println!("in the browser (headless Chromium, 1600x1000, cold dashboard each time):");
    println!(
        "| run | navigation to first paint (page clock) | zoom: wheel event to drawn view p50 / max | fetch p50 / max | the driver's view: first paint; zoom p50 / max |"
    );
    println!("|---|---|---|---|---|");
    for run in 1..=5 {
        let mut options = Options::new(SocketAddr::from(([127, 0, 0, 1], 0))).expect("options");
        options.profiles = Some(dir.to_path_buf());
        options.datastore_dir = dir.join("datastores");
        let dashboard = Dashboard::start(options).expect("starts");
        let out = std::process::Command::new("node")
            .current_dir(&e2e)
            .arg("first-paint.mjs")
            .arg(format!("http://{}", dashboard.addr()))
            .arg(name)
            .output()
            .expect("node runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let m: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        let column = |key: &str| {
            let mut v: Vec<f64> = m["zooms"].as_array().into_iter().flatten().filter_map(|z| z[key].as_f64()).collect();
            v.sort_by(f64::total_cmp);
            (v[v.len() / 2], v[v.len() - 1])
        };
        let (answer, fetch, wall) = (column("answer_ms"), column("fetch_ms"), column("wall_ms"));
        println!(
            "| {run} | {} ms | {:.0} / {:.0} ms | {:.1} / {:.1} ms | {} ms; {:.0} / {:.0} ms |",
            m["first_paint_ms"], answer.0, answer.1, fetch.0, fetch.1, m["driver_ms"], wall.0, wall.1
        );
    }
}
