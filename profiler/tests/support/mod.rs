//! Shared by the tests and benchmarks that run real runtime processes: a private
//! sandbox for their core reservations and datastores, a child process killed when
//! dropped, and a `neuron-monitor` configuration of every metric group.
#![allow(dead_code, unreachable_pub)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

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
