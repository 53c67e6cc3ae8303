//! What the profiler's tests of captured profiles share.

use std::path::Path;
use std::process::{Command, Output};

/// A model of one tiny instruction: its executions are mostly runtime overhead.
pub(crate) const TINY: &str = "HloModule tiny\nENTRY e {\n  x = f32[4] parameter(0)\n  ROOT n = f32[4] negate(x)\n}\n";

/// Runs `neuron-profile` with `args`, its lock and datastore directories under `dir`
/// and every visible core; fails the test unless it succeeds.
pub(crate) fn neuron_profile(dir: &Path, args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_neuron-profile"))
        .env("NEURON_VIRT_LOCK_DIR", dir)
        .env("NEURON_VIRT_DATASTORE_DIR", dir.join("datastores"))
        .env_remove("NEURON_RT_VISIBLE_CORES")
        .env_remove("NEURON_RT_NUM_CORES")
        .args(args)
        .output()
        .expect("neuron-profile runs");
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out
}
