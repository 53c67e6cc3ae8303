//! The C ABI's cost: the same one-operator model (`negate` of `f32[1]`) executed through
//! `libnrt.so` from a C program and through the Rust API from this process, in
//! alternating rounds of the same run.
//!
//! - **sync**: one `nrt_execute` against one `Runtime::execute`, per sample;
//! - **async**: `nrta_execute_schedule` then `nrta_is_completed` polled until done,
//!   against `Runtime::execute_schedule` then `Runtime::is_completed`, per sample.
//!
//! Each round takes 20,000 samples after 1,000 warm-up ones and keeps their median and
//! p99; the figures are the medians over the rounds, and the ratio is C / Rust. Both
//! sides use the system allocator, as a C program linking `libnrt.so` does.
//!
//! ```sh
//! cargo bench -p libnrt --bench c_abi
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use neuron_runtime::{Config, Neff, Runtime, Target, TensorPlacement, TensorSet, compile_hlo};

const SAMPLES: usize = 20_000;
const WARM_UP: usize = 1_000;
const ROUNDS: usize = 5;

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Sync,
    Async,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Sync => "sync",
            Mode::Async => "async",
        }
    }
}

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let locks = dir.path().join("locks");
    let datastores = dir.path().join("datastores");
    std::fs::create_dir_all(&locks).expect("locks dir");
    let hlo = "HloModule one\nENTRY e {\n  x = f32[1]{0} parameter(0)\n  ROOT y = f32[1]{0} negate(x)\n}\n";
    let neff = Neff::new("one", compile_hlo(hlo, Target::Trn1).expect("compiles")).encode();
    let neff_path = dir.path().join("one.neff");
    std::fs::write(&neff_path, &neff).expect("write the NEFF");
    let program = compile_c_side(dir.path());

    println!("fixed cost of one execution of `negate f32[1]` on nc0: C ABI (libnrt.so) against the Rust API");
    println!("{ROUNDS} alternating rounds of {SAMPLES} samples each; medians over the rounds\n");
    println!(
        "{:<6} {:>14} {:>14} {:>11} {:>11} {:>7}",
        "mode", "C median", "Rust median", "C p99", "Rust p99", "ratio"
    );
    for mode in [Mode::Sync, Mode::Async] {
        let mut c = Vec::new();
        let mut rust = Vec::new();
        for _ in 0..ROUNDS {
            rust.push(rust_round(&neff, mode, &locks, &datastores));
            c.push(c_round(&program, &neff_path, mode, &locks, &datastores));
        }
        let (c_median, c_p99) = medians(&c);
        let (rust_median, rust_p99) = medians(&rust);
        println!(
            "{:<6} {:>11.2} us {:>11.2} us {:>8.2} us {:>8.2} us {:>7.3}",
            mode.name(),
            c_median.as_secs_f64() * 1e6,
            rust_median.as_secs_f64() * 1e6,
            c_p99.as_secs_f64() * 1e6,
            rust_p99.as_secs_f64() * 1e6,
            c_median.as_secs_f64() / rust_median.as_secs_f64()
        );
    }
}

/// Builds `benches/c/c_abi.c` against this build's `libnrt.so` (in `target/release/deps`,
/// beside this benchmark, where Cargo builds the library's every crate type).
fn compile_c_side(dir: &Path) -> PathBuf {
    let exe = std::env::current_exe().expect("the bench executable");
    let lib = exe.parent().expect("target/release/deps").to_path_buf();
    assert!(lib.join("libnrt.so").exists(), "no libnrt.so in {}", lib.display());
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let binary = dir.join("c_abi");
    let status = Command::new("cc")
        .args(["-std=c11", "-O2", "-Wall", "-Werror", "-I"])
        .arg(crate_dir.join("include"))
        .arg(crate_dir.join("benches/c/c_abi.c"))
        .arg("-o")
        .arg(&binary)
        .arg(format!("-L{}", lib.display()))
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-lnrt")
        .status()
        .expect("runs cc");
    assert!(status.success(), "cannot compile the C side");
    binary
}

/// One round of the C program: (median, p99).
fn c_round(program: &Path, neff: &Path, mode: Mode, locks: &Path, datastores: &Path) -> (Duration, Duration) {
    let output = Command::new(program)
        .arg(neff)
        .arg(mode.name())
        .arg(SAMPLES.to_string())
        .env("NEURON_VIRT_LOCK_DIR", locks)
        .env("NEURON_VIRT_DATASTORE_DIR", datastores)
        .env_remove("NEURON_RT_VISIBLE_CORES")
        .output()
        .expect("runs the C side");
    assert!(output.status.success(), "the C side failed: {}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8_lossy(&output.stdout);
    let mut numbers = text.split_whitespace().map(|n| n.parse::<u64>().expect("nanoseconds"));
    let mut next = || Duration::from_nanos(numbers.next().expect("two numbers"));
    (next(), next())
}

/// One round through the Rust API, in a runtime of its own: (median, p99).
fn rust_round(neff: &[u8], mode: Mode, locks: &Path, datastores: &Path) -> (Duration, Duration) {
    let config = Config { lock_dir: locks.to_path_buf(), datastore_dir: datastores.to_path_buf(), ..Config::default() };
    let runtime = Runtime::start(config).expect("runtime");
    let model = runtime.load(neff, Some(0)).expect("loads");
    let placement = TensorPlacement::Device { core: 0 };
    let mut inputs = TensorSet::new();
    inputs.add("input0", runtime.allocate_tensor(placement, 4, "x").expect("alloc"));
    let mut outputs = TensorSet::new();
    outputs.add("output0", runtime.allocate_tensor(placement, 4, "y").expect("alloc"));
    let mut times: Vec<Duration> = (0..SAMPLES + WARM_UP)
        .map(|_| {
            let start = Instant::now();
            match mode {
                Mode::Sync => {
                    runtime.execute(&model, &inputs, &outputs).expect("executes");
                }
                Mode::Async => {
                    let seq = runtime.execute_schedule(&model, &inputs, &outputs, None).expect("schedules");
                    while !runtime.is_completed(seq).expect("a scheduled request") {}
                }
            }
            start.elapsed()
        })
        .skip(WARM_UP)
        .collect();
    times.sort();
    runtime.close().expect("close");
    (times[times.len() / 2], times[times.len() * 99 / 100])
}

/// The medians over the rounds of the rounds' medians and p99s.
fn medians(rounds: &[(Duration, Duration)]) -> (Duration, Duration) {
    let mut medians: Vec<Duration> = rounds.iter().map(|r| r.0).collect();
    let mut p99s: Vec<Duration> = rounds.iter().map(|r| r.1).collect();
    medians.sort();
    p99s.sort();
    (medians[medians.len() / 2], p99s[p99s.len() / 2])
}
