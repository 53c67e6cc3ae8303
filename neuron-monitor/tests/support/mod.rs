//! Shared by the tests and benchmarks that run real runtime processes: the workload
//! runner, a private sandbox for their core reservations and datastores, a child
//! process killed when dropped, a `neuron-monitor` configuration of every metric group,
//! a process's CPU time and memory for the cost benchmarks, and a plain HTTP GET.
#![allow(dead_code, unreachable_pub)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
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
    static BUILT: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    // This executable is target/<profile>/deps/<name>; the binaries are one up.
    let exe = std::env::current_exe().expect("the test executable");
    let binary = exe.parent().and_then(Path::parent).expect("target/<profile>").join(name);
    if !built.contains(&binary) {
        if is_stale(&binary) {
            let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
            cargo
                .args(["build", "--quiet", "-p", "neuron-profiler", "--bin", name])
                .current_dir(env!("CARGO_MANIFEST_DIR"));
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
fn is_stale(binary: &Path) -> bool {
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
    // The packages the profiler's binaries are built from.
    let sources = [
        "Cargo.lock",
        "Cargo.toml",
        "runtime",
        "ntff",
        "profiler/src",
        "profiler/Cargo.toml",
        "web/src",
        "web/assets",
        "web/Cargo.toml",
        "neuron-top/src",
        "neuron-top/Cargo.toml",
        "neuron-monitor/src",
        "neuron-monitor/Cargo.toml",
    ];
    sources.iter().any(|p| newer(&root.join(p), built))
}

/// A temporary directory holding core reservations and a private datastore directory,
/// so that processes started in it see only each other.
#[derive(Debug)]
pub struct Sandbox {
    pub dir: tempfile::TempDir,
    pub datastores: PathBuf,
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

/// `GET path` on a local server: the status code and the body (the connection closed
/// after one request).
pub fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(5)).expect("connects");
    stream.set_read_timeout(Some(std::time::Duration::from_secs(30))).expect("timeout");
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, body.to_string())
}
