//! The per-user datastore directory, file names, and process identity checks.
//!
//! Files live in one directory per user: `$NEURON_VIRT_DATASTORE_DIR`, else
//! `$XDG_RUNTIME_DIR/neuron-virt`, else `/dev/shm/neuron-virt-<uid>`. The directory is
//! created `0700`; an existing one is used only if it is a real directory (not a
//! symlink) owned by this user and closed to everyone else.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::DatastoreError;

/// The directory used when nothing is configured.
pub fn default_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(dir) => PathBuf::from(dir).join("neuron-virt"),
        None if Path::new("/dev/shm").is_dir() => {
            PathBuf::from(format!("/dev/shm/neuron-virt-{}", nix::unistd::geteuid()))
        }
        None => std::env::temp_dir().join(format!("neuron-virt-{}", nix::unistd::geteuid())),
    }
}

/// `nrt-<pid>-<instance>.ds` in `dir`: one file per runtime, `instance` counting the
/// runtimes a process has created.
pub fn file_path(dir: &Path, pid: u32, instance: u32) -> PathBuf {
    dir.join(format!("nrt-{pid}-{instance}.ds"))
}

/// The pid in a datastore file name, if it is one.
pub fn pid_of_file_name(name: &str) -> Option<u32> {
    let (pid, instance) = name.strip_prefix("nrt-")?.strip_suffix(".ds")?.split_once('-')?;
    instance.parse::<u32>().ok()?;
    pid.parse().ok()
}

/// The pid in the name of a datastore file or of one being built
/// (`.nrt-<pid>-<instance>.tmp`).
pub(crate) fn pid_of_file_or_temporary(name: &str) -> Option<u32> {
    match name.strip_prefix('.').and_then(|n| n.strip_suffix(".tmp")) {
        Some(temporary) => pid_of_file_name(&format!("{temporary}.ds")),
        None => pid_of_file_name(name),
    }
}

/// Creates `dir` (mode 0700) or checks that the existing one is private to this user.
pub(crate) fn ensure_private_dir(dir: &Path) -> Result<(), DatastoreError> {
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(parent) = dir.parent() {
                std::fs::create_dir_all(parent).map_err(|e| DatastoreError::io(parent, e))?;
            }
            match std::fs::DirBuilder::new().mode(0o700).create(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(DatastoreError::io(dir, e)),
            }
            check_private_dir(dir)
        }
        Err(e) => Err(DatastoreError::io(dir, e)),
        Ok(_) => check_private_dir(dir),
    }
}

/// Fails unless `dir` is a directory (not a symlink) owned by this user with no
/// permissions for group or others.
pub(crate) fn check_private_dir(dir: &Path) -> Result<(), DatastoreError> {
    let meta = std::fs::symlink_metadata(dir).map_err(|e| DatastoreError::io(dir, e))?;
    if meta.file_type().is_symlink() {
        return Err(DatastoreError::Refused {
            path: dir.to_owned(),
            reason: "it is a symbolic link; datastore directories must be real directories".into(),
        });
    }
    if !meta.is_dir() {
        return Err(DatastoreError::Refused { path: dir.to_owned(), reason: "it is not a directory".into() });
    }
    let uid = nix::unistd::geteuid().as_raw();
    if meta.uid() != uid {
        return Err(DatastoreError::Refused {
            path: dir.to_owned(),
            reason: format!("it is owned by uid {}, not by you (uid {uid})", meta.uid()),
        });
    }
    if meta.mode() & 0o077 != 0 {
        return Err(DatastoreError::Refused {
            path: dir.to_owned(),
            reason: format!("its mode is {:o}; it must be private to you (chmod 700)", meta.mode() & 0o7777),
        });
    }
    Ok(())
}

/// Bytes free on the file system holding `dir`.
pub(crate) fn free_space(dir: &Path) -> Result<u64, DatastoreError> {
    let stat = nix::sys::statvfs::statvfs(dir).map_err(|e| DatastoreError::io(dir, e.into()))?;
    Ok(stat.blocks_available() as u64 * stat.fragment_size() as u64)
}

/// Whether files in `dir` live in memory (tmpfs), so that faulting their pages in
/// ahead of use costs memory the rings would use anyway, and no disk writes.
pub(crate) fn in_memory(dir: &Path) -> bool {
    nix::sys::statfs::statfs(dir).is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
}

/// The start time of process `pid` (clock ticks after boot, `/proc/<pid>/stat` field
/// 22), which tells a reused pid from the original process.
pub fn process_start_time(pid: u32) -> Option<u64> {
    process_status(pid).map(|s| s.start_ticks)
}

/// What `/proc/<pid>/stat` says of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessStatus {
    /// Field 3: `R` running, `S`/`D` sleeping, `T` stopped (a signal: Ctrl-Z,
    /// SIGSTOP), `t` stopped by a debugger, `Z` exited but not yet reaped, `X` dead.
    pub state: char,
    /// Field 22: clock ticks after boot.
    pub start_ticks: u64,
    /// Fields 14 and 15: the process's user and system time, clock ticks.
    pub user_ticks: u64,
    pub system_ticks: u64,
}

/// The state, start time and CPU time of process `pid`; `None` when there is no such
/// process.
pub fn process_status(pid: u32) -> Option<ProcessStatus> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses; fields after the
    // last ')' are plain.
    let mut rest = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = rest.next()?.chars().next()?;
    // Field 4 comes next: field 14 is the 11th from here, 15 the next, 22 the 7th after.
    let user_ticks = rest.nth(10)?.parse().ok()?;
    let system_ticks = rest.next()?.parse().ok()?;
    let start_ticks = rest.nth(6)?.parse().ok()?;
    Some(ProcessStatus { state, start_ticks, user_ticks, system_ticks })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_status_holds_the_start_time_and_the_cpu_time_of_proc_stat() {
        let pid = std::process::id();
        // Some CPU time of our own, so that it is not all zeros.
        let spin = std::time::Instant::now();
        while spin.elapsed() < std::time::Duration::from_millis(150) {
            std::hint::black_box(spin.elapsed());
        }
        let status = process_status(pid).expect("our own status");
        assert_eq!(Some(status.start_ticks), process_start_time(pid));
        assert!(matches!(status.state, 'R' | 'S'), "{status:?}");
        assert!(status.user_ticks + status.system_ticks > 0, "150 ms of spinning: {status:?}");
        let cpu = crate::host::ProcessCpu::read(pid).expect("our own CPU time");
        // Read a moment apart: the later is not behind.
        assert!(cpu.user >= status.user_ticks && cpu.system >= status.system_ticks, "{cpu:?} {status:?}");
        assert!(cpu.user + cpu.system <= status.user_ticks + status.system_ticks + 5, "{cpu:?} {status:?}");
        assert!(process_status(u32::MAX).is_none());
    }
}
