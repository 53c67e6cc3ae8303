//! Python virtual environments with pinned packages from PyPI, made once under the
//! target directory and kept while their packages are the pinned ones (the Parquet
//! tables' query engines, torch and torch-xla).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The Python of the environment `dir` with the packages `pins` (`name==version`),
/// made now unless `ready` says the one there already has them; `None` when it cannot
/// be made (a skip with a note naming `part`, except in CI, where it fails).
pub fn cached_venv(dir: &Path, pins: &[String], ready: impl Fn(&Path) -> bool, part: &str) -> Option<PathBuf> {
    let python = dir.join("bin/python");
    if ready(&python) {
        return Some(python);
    }
    let _ = std::fs::remove_dir_all(dir);
    let started = std::time::Instant::now();
    let made = Command::new("python3").args(["-m", "venv"]).arg(dir).output().is_ok_and(|o| o.status.success());
    let installed = made
        && Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
            .args(pins)
            .output()
            .is_ok_and(|o| o.status.success());
    if !installed || !ready(&python) {
        crate::ci::missing(&format!("a python3 venv with {} (PyPI)", pins.join(", ")), part);
        return None;
    }
    eprintln!("installed {} in {:.0} s", pins.join(", "), started.elapsed().as_secs_f64());
    Some(python)
}

/// Whether `pip freeze` in `python`'s environment lists every one of `pins`.
pub fn has_pins(python: &Path, pins: &[String]) -> bool {
    let freeze = Command::new(python).args(["-m", "pip", "freeze", "--disable-pip-version-check"]).output();
    freeze.is_ok_and(|o| {
        let installed = String::from_utf8_lossy(&o.stdout).to_lowercase();
        o.status.success() && pins.iter().all(|pin| installed.lines().any(|l| l == pin.to_lowercase()))
    })
}
