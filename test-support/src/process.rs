//! Real processes for end-to-end tests and cost benchmarks: the workspace's binaries
//! (built on demand), a private [`Sandbox`] for their core reservations and
//! datastores, a child killed when dropped ([`Running`]), a `neuron-monitor`
//! configuration of every metric group, and a process's CPU time and memory.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

/// The workspace's `neuron-bench`, in the profile these tests or benchmarks were built
/// in (see [`profiler_binary`]).
pub fn neuron_bench() -> PathBuf {
    profiler_binary("neuron-bench")
}

/// A binary of the `neuron-profiler` package (`neuron-bench`, `neuron-profile`), in the
/// profile these tests or benchmarks were built in. It belongs to another package, so
/// Cargo builds it for them only with the whole workspace (`cargo test --workspace`);
/// otherwise, or when a source it is built from changed since, this asks Cargo to build
/// it, once per run.
pub fn profiler_binary(name: &str) -> PathBuf {
    workspace_binary("neuron-profiler", name)
}

/// A binary of a workspace package (`neuron-top`, `neuron-monitor`, or the profiler's),
/// built as [`profiler_binary`] says, for tests of another package that run it.
pub fn workspace_binary(package: &str, name: &str) -> PathBuf {
    static BUILT: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    // This executable is target/<profile>/deps/<name>; the binaries are one up.
    let exe = std::env::current_exe().expect("the test executable");
    let binary = exe.parent().and_then(Path::parent).expect("target/<profile>").join(name);
    if !built.contains(&binary) {
        if is_stale(&binary, package) {
            let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
            cargo.args(["build", "--quiet", "-p", package, "--bin", name]).current_dir(env!("CARGO_MANIFEST_DIR"));
            if !cfg!(debug_assertions) {
                cargo.arg("--release");
            }
            let status = cargo.status().expect("runs cargo");
            assert!(status.success(), "cannot build {name}");
        }
        built.push(binary.clone());
    }
    binary
}

/// Whether `binary` is missing or older than a source of the packages it is built from.
/// (Building it again when it is not would change its features: Cargo unifies them over
/// the packages of one build, and rebuild its dependencies for nothing.)
fn is_stale(binary: &Path, package: &str) -> bool {
    let Ok(built) = std::fs::metadata(binary).and_then(|m| m.modified()) else { return true };
    fn newer(path: &Path, than: std::time::SystemTime) -> bool {
        let Ok(meta) = std::fs::metadata(path) else { return false };
        if meta.is_dir() {
            let entries = std::fs::read_dir(path).into_iter().flatten().flatten();
            return entries.into_iter().any(|e| newer(&e.path(), than));
        }
        meta.modified().is_ok_and(|m| m > than)
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // The packages the binaries are built from: the profiler's, and the viewers' own.
    let sources = [
        "Cargo.lock",
        "Cargo.toml",
        "datastore",
        "runtime",
        "ntff",
        "record",
        "profiler/src",
        "profiler/Cargo.toml",
        "web/src",
        "web/assets",
        "web/Cargo.toml",
    ];
    let own = match package {
        "neuron-top" | "neuron-monitor" => Some(package),
        _ => None,
    };
    sources.iter().copied().chain(own).any(|p| newer(&root.join(p), built))
}

/// A temporary directory holding core reservations and a private datastore directory,
/// so that processes started in it see only each other.
#[derive(Debug)]
pub struct Sandbox {
    pub dir: tempfile::TempDir,
    pub datastores: PathBuf,
}

impl Default for Sandbox {
    fn default() -> Sandbox {
        Sandbox::new()
    }
}

impl Sandbox {
    pub fn new() -> Sandbox {
        let dir = tempfile::tempdir().expect("tempdir");
        let datastores = dir.path().join("datastores");
        std::fs::create_dir(&datastores).expect("datastore dir");
        std::fs::set_permissions(&datastores, std::fs::Permissions::from_mode(0o700)).expect("private");
        Sandbox { dir, datastores }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Where [`all_reduce_job`] writes what its processes print.
    pub fn job_log(&self) -> PathBuf {
        self.dir.path().join("job.log")
    }

    /// What the sandbox shows of a job, for a failed test's message: the datastore
    /// files, and the end of the job's log.
    pub fn job_evidence(&self) -> String {
        let files: Vec<String> = std::fs::read_dir(&self.datastores)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        let log = std::fs::read_to_string(self.job_log()).unwrap_or_else(|e| format!("(no log: {e})"));
        let tail: Vec<&str> = log.lines().rev().take(40).collect::<Vec<_>>().into_iter().rev().collect();
        format!("datastores: {files:?}\nthe job's output, last 40 lines:\n{}", tail.join("\n"))
    }

    /// Points a command at the sandbox, with every core visible.
    pub fn env<'a>(&self, command: &'a mut Command) -> &'a mut Command {
        command
            .env("NEURON_VIRT_LOCK_DIR", self.dir.path())
            .env("NEURON_VIRT_DATASTORE_DIR", &self.datastores)
            .env_remove("NEURON_RT_VISIBLE_CORES")
            .env_remove("NEURON_RT_NUM_CORES")
    }

    /// Writes a `neuron-monitor` configuration of every metric group at `period`, for
    /// every process, and returns its path.
    pub fn every_group_config(&self, period: &str) -> PathBuf {
        let path = self.dir.path().join("monitor.json");
        let config = format!(
            r#"{{"period": "{period}", "neuron_runtimes": [{{"tag_filter": ".*", "metrics": [
                 {{"type": "neuroncore_counters"}}, {{"type": "execution_stats"}}, {{"type": "memory_used"}},
                 {{"type": "neuron_runtime_vcpu_usage"}}]}}],
               "system_metrics": [{{"type": "vcpu_usage"}}, {{"type": "memory_info"}}, {{"type": "neuron_hw_counters"}}]}}"#
        );
        std::fs::write(&path, config).expect("config");
        path
    }
}

/// A child process, killed when dropped so that a failed assertion leaves nothing behind.
#[derive(Debug)]
pub struct Running(pub Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A process's CPU time so far (all its threads), in nanoseconds.
pub fn cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// `VmRSS` and `VmHWM` in bytes.
pub fn memory(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .map_or(0, |kib| kib * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// `neuron-bench demo` without its own dashboard, in `sandbox`, with `args` and `env`
/// added (stdout discarded).
pub fn demo(sandbox: &Sandbox, args: &[&str], env: &[(&str, &str)]) -> Running {
    let mut command = Command::new(neuron_bench());
    sandbox.env(&mut command).args(["demo", "--no-dashboard"]).args(args).envs(env.iter().copied());
    Running(command.stdout(Stdio::null()).spawn().expect("the workload starts"))
}

/// The `neuron-dashboard` at `binary` on a free loopback port with `args`, in `sandbox`,
/// and its address (`http://…`, without the final slash) as it prints it.
pub fn dashboard(sandbox: &Sandbox, binary: &Path, args: &[&OsStr]) -> (Running, String) {
    let mut command = Command::new(binary);
    sandbox.env(&mut command).args(["--listen", "127.0.0.1:0"]).args(args).stderr(Stdio::piped());
    let mut running = Running(command.spawn().expect("the dashboard starts"));
    let mut line = String::new();
    BufReader::new(running.0.stderr.take().expect("stderr")).read_line(&mut line).expect("the address");
    let url = line.split_whitespace().find(|w| w.starts_with("http://")).expect("serving http://…");
    (running, url.trim_end_matches('/').to_string())
}

/// `program` (its variables and arguments) as `np` processes of a real `mpirun` (Debian's
/// Open MPI, which `.ci/run` installs), allowed to run as root and on more processes
/// than CPUs; `None` where `mpirun` is missing, which fails the test in CI.
pub fn mpirun(np: usize, program: &Command) -> Option<Command> {
    if Command::new("mpirun").arg("--version").output().is_err() {
        crate::ci::missing("no `mpirun` here (Debian's openmpi-bin provides it)", "the mpirun job");
        return None;
    }
    let mut mpirun = Command::new("mpirun");
    mpirun.env("OMPI_ALLOW_RUN_AS_ROOT", "1").env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    mpirun.args(["--oversubscribe", "-np", &np.to_string()]);
    for (name, value) in program.get_envs() {
        if let Some(value) = value {
            mpirun.args(["-x", &format!("{}={}", name.to_string_lossy(), value.to_string_lossy())]);
        }
    }
    mpirun.arg(program.get_program()).args(program.get_args());
    Some(mpirun)
}

/// A free TCP port on 127.0.0.1 for a server a test starts later (a job's root rank, an
/// exporter): below the kernel's ephemeral range, where no outgoing connection of
/// another test can take it between this check and the bind, as it can a port the
/// kernel picked (`127.0.0.1:0`).
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static DRAWN: AtomicU64 = AtomicU64::new(0);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (low, high) = (10_000u16.min(ephemeral_low / 2), ephemeral_low.max(10_001));
    let seed = u64::from(std::process::id())
        ^ std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    for _ in 0..1000 {
        // A different port per call and per process: a 64-bit mix of the seed and a count.
        let mut x = seed.wrapping_add(DRAWN.fetch_add(1, Ordering::Relaxed).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        let port = low + ((x ^ (x >> 31)) % u64::from(high - low)) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port between {low} and {high} on 127.0.0.1")
}

/// A workload with slow executions, for what a latency exemplar leads to: `neuron-bench
/// exec` of the MLP example on nc0 for good, every 10th execution stalled 150 ms
/// (`NEURON_RT_FAULT_INJECT=slow`). Returns it once the first slow execution is over,
/// with that execution's id, read from the runtime's log line (the rest of the log is
/// drained on a thread of its own).
pub fn slow_workload(sandbox: &Sandbox) -> (Running, u64) {
    let mlp = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/mlp.hlo");
    let mut bench = Running(
        sandbox
            .env(&mut Command::new(neuron_bench()))
            .env("NEURON_RT_FAULT_INJECT", "slow:core=0:every=10:delay=150ms")
            .env("NEURON_RT_LOG_LEVEL", "WARN")
            .arg("exec")
            .arg(&mlp)
            .args(["--cores", "0", "--iterations", "100000"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("neuron-bench starts"),
    );
    let mut log = BufReader::new(bench.0.stderr.take().expect("stderr"));
    let mut line = String::new();
    let exec_id = loop {
        line.clear();
        assert!(log.read_line(&mut line).expect("the log") > 0, "the workload ended before a slow execution");
        if let Some(rest) = line.split("stalled before the execution").nth(1) {
            let id = rest.split("in execution id ").nth(1).and_then(|r| r.split_whitespace().next()?.parse().ok());
            break id.unwrap_or_else(|| panic!("no execution id in {line}"));
        }
    };
    std::thread::spawn(move || std::io::copy(&mut log, &mut std::io::sink()));
    (bench, exec_id)
}

/// A job of `np` ranks on this host under a real `mpirun`, in `sandbox`: one process and
/// one core each, all-reducing 64 KiB `iterations` times through `neuron-bench exec`,
/// with `env` added (`NEURON_RT_FAULT_INJECT`, …); `None` where `mpirun` is missing,
/// which fails the test in CI. What the job prints goes to [`Sandbox::job_log`].
pub fn all_reduce_job(sandbox: &Sandbox, np: usize, iterations: u32, env: &[(&str, &str)]) -> Option<Job> {
    let hlo = all_reduce_hlo(sandbox.path(), 16384);
    let port = free_port();
    let mut program = Command::new(neuron_bench());
    sandbox
        .env(&mut program)
        .env("NEURON_VIRT_INSTANCE_TYPE", "trn1.32xlarge")
        .env("NEURON_RT_NUM_CORES", "1")
        .env("NEURON_RT_ROOT_COMM_ID", format!("127.0.0.1:{port}"))
        .args(["exec", "--iterations", &iterations.to_string()])
        .arg(&hlo);
    program.envs(env.iter().copied());
    let mut mpirun = mpirun(np, &program)?;
    let log = std::fs::File::create(sandbox.job_log()).expect("the job's log");
    let log_too = log.try_clone().expect("the job's log");
    Some(Job(mpirun.stdout(log).stderr(log_too).spawn().expect("mpirun starts")))
}

/// Writes `allreduce.hlo` into `dir` and gives its path: an f32 sum over every rank of
/// `elements` values each.
pub fn all_reduce_hlo(dir: &Path, elements: usize) -> PathBuf {
    let hlo = dir.join("allreduce.hlo");
    let text = format!(
        "HloModule allreduce\n\nsum {{\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] add(a, b)\n}}\n\n\
         ENTRY main {{\n  x = f32[{elements}]{{0}} parameter(0)\n  ROOT r = f32[{elements}]{{0}} all-reduce(x), replica_groups={{}}, to_apply=sum\n}}\n"
    );
    std::fs::write(&hlo, text).expect("write the program");
    hlo
}

/// An `mpirun` job, ended when dropped: `mpirun` is asked to stop (SIGTERM, which it
/// passes on to its processes) and killed if it has not within 5 s.
#[derive(Debug)]
pub struct Job(pub Child);

impl Drop for Job {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.0.id().to_string()]).status();
        for _ in 0..50 {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
