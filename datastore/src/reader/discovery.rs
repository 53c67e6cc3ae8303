//! Finding the runtimes in a datastore directory, and removing the files of those
//! that exited: every reader does it as it looks, and every runtime as it starts.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::{DatastoreReader, ExitReason, Liveness};
use crate::{DatastoreError, directory};

/// A runtime found in a datastore directory.
#[derive(Debug)]
pub struct RuntimeEntry {
    pub path: PathBuf,
    pub pid: u32,
    /// The open datastore, or why it could not be opened.
    pub reader: Result<DatastoreReader, DatastoreError>,
    /// `None` when the file could not be opened.
    pub liveness: Option<Liveness>,
    /// The file of an exited runtime was removed by this call.
    pub removed: bool,
}

/// Lists the runtimes in `dir`, live and exited, and removes the files of exited ones
/// (they are still returned, once). A missing directory means no runtimes.
pub fn discover(dir: &Path) -> Result<Vec<RuntimeEntry>, DatastoreError> {
    discover_new(dir, &|_| false)
}

/// [`discover`], leaving out (neither opened nor removed) the runtimes whose pid
/// `known` accepts: for a tool that looks again and again and keeps its own readers.
pub fn discover_new(dir: &Path, known: &dyn Fn(u32) -> bool) -> Result<Vec<RuntimeEntry>, DatastoreError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(DatastoreError::io(dir, e)),
    };
    directory::check_private_dir(dir)?;
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(directory::pid_of_file_name) else { continue };
        if known(pid) {
            continue;
        }
        let path = entry.path();
        let reader = DatastoreReader::open(&path);
        let liveness = reader.as_ref().ok().map(DatastoreReader::liveness);
        let removed = matches!(liveness, Some(Liveness::Exited(_))) && std::fs::remove_file(&path).is_ok();
        found.push(RuntimeEntry { path, pid, reader, liveness, removed });
    }
    found.sort_by_key(|e| e.pid);
    Ok(found)
}

/// Removes the files that runtimes of this user left behind in `dir`: those whose
/// runtime closed or whose process is gone (or was replaced), and those that cannot be
/// opened (an older layout, a file cut short) whose process is gone, temporaries
/// included. Returns the paths removed. A runtime calls this as it starts, after making
/// sure `dir` is private, so that a runtime killed by SIGKILL does not keep its file in
/// memory until a reader happens to run.
pub(crate) fn remove_dead_runtimes(dir: &Path) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return removed };
    let uid = nix::unistd::geteuid().as_raw();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(directory::pid_of_file_or_temporary) else { continue };
        let path = entry.path();
        let ours = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file() && m.uid() == uid);
        // Only runtimes that are certainly gone: closed, or their process ended or was
        // replaced. A stale heartbeat alone (a process stopped in a debugger) is not
        // enough for a runtime to remove another's file.
        let dead = match DatastoreReader::open(&path).map(|r| r.liveness()) {
            Ok(Liveness::Exited(ExitReason::Closed | ExitReason::ProcessGone | ExitReason::PidReused)) => true,
            Ok(_) => false,
            Err(_) => matches!(
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None),
                Err(nix::errno::Errno::ESRCH)
            ),
        };
        if ours && dead && std::fs::remove_file(&path).is_ok() {
            removed.push(path);
        }
    }
    removed
}
