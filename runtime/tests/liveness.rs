//! The liveness rule against real processes: a runtime stopped (SIGSTOP, as Ctrl-Z or
//! a debugger stop it) past the heartbeat limit is `stopped`, keeps its datastore file
//! and is live again when it resumes; one killed and not yet reaped (a zombie) is
//! exited at once, reported by the first look and removed.
//!
//! The test re-runs this binary as the runtime process (`ROLE_ENV`), which reports its
//! datastore's path and runs until its standard input closes.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use neuron_datastore::{DatastoreReader, ExitReason, HEARTBEAT_STALE_AFTER, Liveness, discover};
use neuron_runtime::{Config, Runtime};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const ROLE_ENV: &str = "NEURON_VIRT_TEST_ROLE";

/// Polls `liveness` every 100 ms until `wanted` accepts it, for at most `limit`.
fn wait_until(reader: &DatastoreReader, limit: Duration, wanted: impl Fn(Liveness) -> bool) -> Liveness {
    let start = Instant::now();
    loop {
        let now = reader.liveness();
        if wanted(now) || start.elapsed() > limit {
            return now;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_stopped_runtime_is_stopped_not_exited_and_a_zombie_is_exited_at_once() {
    if std::env::var(ROLE_ENV).is_ok() {
        let runtime = Runtime::start(Config::from_env().expect("configuration")).expect("starts");
        println!("@path {}", runtime.datastore_path().expect("a datastore").display());
        // Until the parent closes our input (or kills us).
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        return;
    }
    let dirs = tempfile::tempdir().expect("tempdir");
    let datastores = dirs.path().join("datastores");
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "a_stopped_runtime_is_stopped_not_exited_and_a_zombie_is_exited_at_once",
            "--exact",
            "--nocapture",
            "-q",
        ])
        .env(ROLE_ENV, "runtime")
        .env("NEURON_VIRT_LOCK_DIR", dirs.path().join("locks"))
        .env("NEURON_VIRT_DATASTORE_DIR", &datastores)
        .env("NEURON_RT_VISIBLE_CORES", "0")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawns");
    let pid = Pid::from_raw(child.id() as i32);
    let path = BufReader::new(child.stdout.take().expect("stdout"))
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.strip_prefix("@path ").map(PathBuf::from))
        .expect("the runtime reports its datastore");
    let reader = DatastoreReader::open(&path).expect("opens");
    assert_eq!(reader.liveness(), Liveness::Live);

    // Stopped past the heartbeat limit: stopped, kept, and found by every look.
    kill(pid, Signal::SIGSTOP).expect("SIGSTOP");
    let limit = HEARTBEAT_STALE_AFTER + Duration::from_secs(5);
    let stopped = wait_until(&reader, limit, |l| l != Liveness::Live);
    assert!(matches!(stopped, Liveness::Stale { stopped: true, seconds } if seconds >= 10), "{stopped:?}");
    assert_eq!(stopped.word(), "stopped");
    let found = discover(&datastores).expect("discovers");
    assert!(found.iter().any(|e| matches!(e.liveness, Some(Liveness::Stale { .. })) && !e.removed), "{found:?}");
    assert!(path.exists(), "a stopped runtime keeps its file");

    // Resumed: live again within a heartbeat or two.
    kill(pid, Signal::SIGCONT).expect("SIGCONT");
    let resumed = wait_until(&reader, Duration::from_secs(5), |l| l == Liveness::Live);
    assert_eq!(resumed, Liveness::Live);

    // Killed and not reaped: exited at once, not after the heartbeat limit.
    kill(pid, Signal::SIGKILL).expect("SIGKILL");
    let gone = wait_until(&reader, Duration::from_secs(2), |l| l != Liveness::Live);
    assert_eq!(gone, Liveness::Exited(ExitReason::ProcessGone));
    let found = discover(&datastores).expect("discovers");
    assert!(found.iter().any(|e| e.removed), "the first look reports it and removes its file: {found:?}");
    assert!(discover(&datastores).expect("discovers").is_empty(), "reported once");
    child.wait().expect("reap");
}
