//! The Python package as its users get it: built by `pip install ./python` (maturin)
//! into a fresh virtual environment with the pinned test packages
//! (`python/test-requirements.txt`), then its pytest suite (`python/tests/*.py`) run
//! against it. Without a Python 3 that can make virtual environments the test is
//! skipped with a note, except in CI (`CI=true`), where it fails.
//!
//! The package is built with Cargo's dev profile here (`MATURIN_PEP517_ARGS`), reusing
//! what `cargo test` already compiled; `pip install ./python` alone builds it optimised.

mod common;

use std::path::Path;
use std::process::Command;

use common::{python_dir, run};

/// A Python 3 with `venv`, or `None` (a skip, outside CI).
fn python3() -> Option<&'static str> {
    let usable =
        Command::new("python3").args(["-c", "import venv, ensurepip"]).output().is_ok_and(|o| o.status.success());
    if !usable {
        neuron_test_support::ci::missing("no python3 with venv and ensurepip", "the Python package's tests");
        return None;
    }
    Some("python3")
}

#[test]
fn the_python_package_installs_and_its_tests_pass() {
    let Some(python) = python3() else { return };
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("python-test-venv");
    let _ = std::fs::remove_dir_all(&venv);
    run(Command::new(python).args(["-m", "venv"]).arg(&venv));
    let pip = |args: &[&str]| {
        let mut command = Command::new(venv.join("bin/python"));
        command.args(["-m", "pip", "--disable-pip-version-check", "--quiet"]).args(args);
        command
    };
    run(pip(&["install", "-r"]).arg(python_dir().join("test-requirements.txt")));
    run(pip(&["install"]).arg(python_dir()).env("MATURIN_PEP517_ARGS", "--profile dev"));

    // Run from elsewhere, so that the source folder `python/neuron_virt` is not what
    // `import neuron_virt` finds.
    let work = tempfile::tempdir().expect("tempdir");
    // The runtime creates it, private to this user.
    let datastores = work.path().join("datastores");
    run(Command::new(venv.join("bin/python"))
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .arg(python_dir().join("tests"))
        .current_dir(work.path())
        .env("NEURON_VIRT_LOCK_DIR", work.path())
        .env("NEURON_PROFILE", neuron_test_support::process::profiler_binary("neuron-profile"))
        .env("NEURON_LS", neuron_test_support::process::profiler_binary("neuron-ls"))
        .env("NEURON_VIRT_DATASTORE_DIR", &datastores)
        .env_remove("NEURON_RT_VISIBLE_CORES")
        .env_remove("NEURON_RT_NUM_CORES"));
}
