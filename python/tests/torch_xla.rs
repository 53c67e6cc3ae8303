//! PyTorch as its users run it: torch-xla (`PJRT_DEVICE=NEURON`) through the plugin in
//! the `neuron-virt` wheel, and `torch_neuronx`. The pinned torch and torch-xla
//! (`python/torch-requirements.txt`, ~4 GB) are installed once into a virtual
//! environment kept under the target directory; the wheel is installed into it again on
//! every run (Cargo's dev profile), then `python/torch_tests/` runs with pytest. Without
//! a Python that can make the environment or reach the package index the test is
//! skipped with a note, except in CI (`CI=true`), where it fails.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{python_dir, run};

/// The pins of `torch-requirements.txt`.
fn pins() -> Vec<String> {
    let text = std::fs::read_to_string(python_dir().join("torch-requirements.txt")).expect("torch-requirements.txt");
    text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(str::to_owned).collect()
}

/// The environment with the pinned packages, made once; `None` (a skip outside CI)
/// when it cannot be made.
fn torch_python() -> Option<PathBuf> {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("torch-venv");
    let pins = pins();
    let ready = |python: &Path| neuron_test_support::python::has_pins(python, &pins);
    neuron_test_support::python::cached_venv(&venv, &pins, ready, "the PyTorch tests")
}

#[test]
fn torch_xla_scripts_and_torch_neuronx_run_on_the_plugin() {
    let Some(python) = torch_python() else { return };
    run(Command::new(&python)
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps", "--force-reinstall"])
        .arg(python_dir())
        .env("MATURIN_PEP517_ARGS", "--profile dev"));
    let work = tempfile::tempdir().expect("tempdir");
    run(Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .arg(python_dir().join("torch_tests"))
        .current_dir(work.path())
        .env("NEURON_VIRT_LOCK_DIR", work.path())
        .env("NEURON_VIRT_DATASTORE_DIR", work.path().join("datastores"))
        .env("NEURON_CC_FLAGS", format!("--auto-cast none --cache_dir={}", work.path().join("cache").display()))
        .env("NEURON_RT_LOG_LEVEL", "ERROR")
        .env("NEURON_PROFILE", neuron_test_support::process::profiler_binary("neuron-profile"))
        // One core per process, of an instance with enough for the tests' other
        // processes (a saved model loaded elsewhere, two torchrun ranks).
        .env("NEURON_VIRT_INSTANCE_TYPE", "trn1.32xlarge")
        .env("NEURON_RT_NUM_CORES", "1")
        .env_remove("NEURON_LIBRARY_PATH")
        .env_remove("PJRT_DEVICE")
        .env_remove("NEURON_RT_VISIBLE_CORES"));
}
