//! What `neuron-top` costs to leave open: CPU time as a share of one core and resident
//! memory at the default refresh (1 s), in a 120×40 tmux window, while 4 workload
//! processes keep 2 virtual cores each busy (`trn1.32xlarge`, the MLP example).
//!
//! The baseline, in the same window of time and the same kind of terminal: procps `top`
//! at the same refresh (`top -d 1`).
//!
//! CPU time is the sum of the process's threads' run time (`/proc/PID/task/*/schedstat`)
//! over the window; memory is `VmRSS` at the end.
//!
//! Run: `cargo bench -p neuron-top --bench cost` (needs tmux). Results go in BENCHMARKS.md.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use neuron_test_support::process::{Running, Sandbox, cpu_ns, memory};

const TOP: &str = env!("CARGO_BIN_EXE_neuron-top");
const WORKLOADS: u32 = 4;
const WARM_UP: Duration = Duration::from_secs(5);
const WINDOW: Duration = Duration::from_secs(60);

/// A tmux server of its own, killed when dropped.
struct Tmux(String);

impl Tmux {
    fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux").args(["-L", &self.0, "-f", "/dev/null"]).args(args).output().expect("tmux");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Starts `command` in a 120×40 window named `name`; the pid of its process.
    fn start(&self, name: &str, command: &str) -> u32 {
        self.run(&["new-session", "-d", "-s", name, "-x", "120", "-y", "40", command]);
        self.run(&["display", "-p", "-t", name, "#{pane_pid}"]).parse().expect("a pane pid")
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        self.run(&["kill-server"]);
    }
}

fn main() {
    let bench_exe = neuron_test_support::process::neuron_bench();
    let sandbox = Sandbox::new();
    let mlp = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/mlp.hlo");
    let seconds = (WARM_UP + WINDOW).as_secs() + 30;
    let _workloads: Vec<Running> = (0..WORKLOADS)
        .map(|k| {
            let mut c = Command::new(&bench_exe);
            sandbox.env(&mut c).env("NEURON_VIRT_INSTANCE_TYPE", "trn1.32xlarge");
            c.env("NEURON_PROCESS_TAG", format!("bench-{k}"))
                .args([
                    "exec",
                    mlp.to_str().expect("utf-8"),
                    "--cores",
                    &format!("{}-{}", 2 * k, 2 * k + 1),
                    "--duration",
                    &format!("{seconds}s"),
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            Running(c.spawn().expect("neuron-bench"))
        })
        .collect();

    let tmux = Tmux(format!("neuron-top-bench-{}", std::process::id()));
    let top = tmux.start(
        "neuron-top",
        &format!(
            "exec env NEURON_VIRT_INSTANCE_TYPE=trn1.32xlarge NEURON_VIRT_DATASTORE_DIR={} NEURON_VIRT_LOCK_DIR={} {TOP}",
            sandbox.datastores.display(),
            sandbox.path().display()
        ),
    );
    let procps = tmux.start("top", "exec top -d 1");
    eprintln!(
        "{WORKLOADS} workloads of 2 busy cores; warming up {} s, then measuring {} s",
        WARM_UP.as_secs(),
        WINDOW.as_secs()
    );
    std::thread::sleep(WARM_UP);
    let screen = tmux.run(&["capture-pane", "-p", "-t", "neuron-top"]);
    let shown = (0..WORKLOADS).filter(|k| screen.contains(&format!("bench-{k}"))).count();
    assert_eq!(shown, WORKLOADS as usize, "neuron-top shows the 4 workloads:\n{screen}");

    let before = [cpu_ns(top), cpu_ns(procps)];
    let began = Instant::now();
    std::thread::sleep(WINDOW);
    let wall = began.elapsed().as_secs_f64();
    let share = |pid: u32, before: u64| cpu_ns(pid).saturating_sub(before) as f64 / 1e9 / wall * 100.0;
    let (ours, theirs) = (share(top, before[0]), share(procps, before[1]));
    let screen = tmux.run(&["capture-pane", "-p", "-t", "neuron-top"]);
    assert!(screen.contains("NeuronCore v2 Utilization"), "neuron-top still runs:\n{screen}");

    println!("neuron-top's cost at the default refresh (1 s), {WORKLOADS} workloads × 2 busy cores, over {wall:.1} s:");
    println!("  neuron-top   CPU {ours:>6.3}% of one core   RSS {:>5.1} MiB", memory(top).0 as f64 / 1048576.0);
    println!("  top -d 1     CPU {theirs:>6.3}% of one core   RSS {:>5.1} MiB", memory(procps).0 as f64 / 1048576.0);
    println!("  neuron-top / top: {:.2}× the CPU", ours / theirs.max(1e-9));
    println!("  goal: CPU ≤ 1% of one core");
}
