//! What the Python package's test binaries share.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The package's folder, `python/`.
pub(crate) fn python_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

/// Runs `command`, failing with its output unless it succeeds.
pub(crate) fn run(command: &mut Command) {
    let output = command.output().unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
