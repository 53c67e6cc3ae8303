//! Exclusive, host-wide reservation of NeuronCores between processes.
//!
//! Each core is a lock file in one directory for the whole host (every user, as
//! NeuronCores are one set per host), held with `flock` for as long as the owning
//! [`CoreReservation`] lives. The kernel drops the lock when the holder's file
//! descriptor closes, so a process killed with SIGKILL releases its cores at once and
//! no stale state is ever left to clean up. The directory is world-writable and sticky
//! (like `/tmp`); lock files are empty and world-readable, since `flock` needs only a
//! read-only descriptor.

use std::fs::{DirBuilder, File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use crate::config::CoreRequest;
use crate::error::{NrtError, NrtResult, NrtStatus};
use neuron_datastore::topology::{CoreSet, Topology};

/// Cores held by this process; dropping it releases them.
#[derive(Debug)]
pub struct CoreReservation {
    cores: CoreSet,
    _locks: Vec<Flock<File>>,
}

impl CoreReservation {
    /// Reserves the requested cores, or fails at once with `NRT_EXEC_NC_BUSY` if any of
    /// them is held by another process (or another runtime in this one).
    pub fn acquire(lock_dir: &Path, topology: &Topology, request: &CoreRequest) -> NrtResult<Self> {
        create_shared_dir(lock_dir)?;
        let total = topology.core_count();
        match request {
            CoreRequest::All => Self::acquire_exact(lock_dir, total, CoreSet::range(0, total - 1)),
            CoreRequest::Visible(set) => Self::acquire_exact(lock_dir, total, set.clone()),
            CoreRequest::Count(n) => {
                let mut locks = Vec::new();
                let mut cores = Vec::new();
                let mut held = None;
                for core in 0..total {
                    if cores.len() == *n as usize {
                        break;
                    }
                    match try_lock(lock_dir, core)? {
                        Some(lock) => {
                            locks.push(lock);
                            cores.push(core);
                        }
                        None if held.is_none() => held = Some(core),
                        None => {}
                    }
                }
                if cores.len() < *n as usize {
                    let available = cores.len();
                    drop(locks);
                    let holder = held
                        .and_then(|core| holder_of(&lock_path(lock_dir, core)).map(|(pid, name)| (core, pid, name)));
                    return Err(not_available(&format!("{n} cores"), available, holder));
                }
                Ok(CoreReservation { cores: CoreSet::new(cores), _locks: locks })
            }
        }
    }

    fn acquire_exact(lock_dir: &Path, total: u32, wanted: CoreSet) -> NrtResult<Self> {
        let mut locks = Vec::with_capacity(wanted.len());
        for &core in wanted.cores() {
            match try_lock(lock_dir, core)? {
                Some(lock) => locks.push(lock),
                None => {
                    drop(locks);
                    let available = count_free(lock_dir, total)?;
                    let holder = holder_of(&lock_path(lock_dir, core)).map(|(pid, name)| (core, pid, name));
                    return Err(not_available(&wanted.to_string(), available, holder));
                }
            }
        }
        Ok(CoreReservation { cores: wanted, _locks: locks })
    }

    pub fn cores(&self) -> &CoreSet {
        &self.cores
    }
}

/// `NRT_EXEC_NC_BUSY`, naming what holds the cores when known: `holder` is a core, the
/// pid holding its lock and that process's name.
fn not_available(requested: &str, available: usize, holder: Option<(u32, u32, String)>) -> NrtError {
    let why = match holder {
        Some((core, pid, _)) if pid == std::process::id() => format!(
            "another runtime in this process holds nc{core}: close it first, or pick other cores with \
             NEURON_RT_VISIBLE_CORES"
        ),
        Some((core, _, holder)) => {
            format!("nc{core} is held by {holder}: pick other cores with NEURON_RT_VISIBLE_CORES or stop that process")
        }
        None => "another process (or another runtime in this one) holds them: pick other cores with \
                 NEURON_RT_VISIBLE_CORES or stop that process"
            .to_string(),
    };
    NrtError::new(
        NrtStatus::ExecNcBusy,
        format!("NeuronCore(s) not available - Requested:{requested} Available:{available}; {why}"),
    )
}

/// `NRT_EXEC_NC_BUSY` of a process of a job: when the job's ranks on this host need
/// more NeuronCores than the instance has, says so and which instance has enough.
pub(crate) fn for_the_job(error: NrtError, topology: &Topology, config: &crate::config::Config) -> NrtError {
    let (Some(launch), NrtStatus::ExecNcBusy) = (&config.launch, error.status) else { return error };
    let per_process = match &config.cores {
        CoreRequest::Count(n) => *n,
        CoreRequest::Visible(set) => set.len() as u32,
        CoreRequest::All => return error,
    };
    // Only a launcher that says how many of the job's processes run here tells whether
    // they fit (Slurm's count can be a pattern, and a job may span hosts).
    let Some(here) = launch.local_processes else { return error };
    let needed = here.saturating_mul(per_process);
    let has = topology.core_count();
    if needed <= has {
        return error;
    }
    let instance = topology.instance_type;
    let advice = match instance.smallest_with(needed) {
        Some(larger) => format!(
            "set NEURON_VIRT_INSTANCE_TYPE={larger} ({} NeuronCores) for every process of the job",
            larger.topology().core_count()
        ),
        None => "run fewer ranks per host".to_owned(),
    };
    NrtError::new(
        error.status,
        format!(
            "{}; this job's {here} processes on this host need {needed} NeuronCores ({per_process} each) and \
             {instance} has {has}: {advice}",
            error.message
        ),
    )
}

/// The process holding the `flock` of `path`: its pid, and `pid 1234 (neuron-bench)`, found in
/// `/proc/locks` by the file's device and inode (the lock files stay empty, so that any
/// user can lock them read-only).
fn holder_of(path: &Path) -> Option<(u32, String)> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    let (major, minor) = (nix::sys::stat::major(meta.dev()), nix::sys::stat::minor(meta.dev()));
    let wanted = format!("{major:02x}:{minor:02x}:{}", meta.ino());
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    let pid: u32 = locks.lines().find_map(|line| {
        // `1: FLOCK  ADVISORY  WRITE 2198 00:19:1234 0 EOF`
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.get(1) == Some(&"FLOCK") && fields.get(5) == Some(&wanted.as_str()))
            .then(|| fields.get(4)?.parse().ok())
            .flatten()
    })?;
    let command = std::fs::read_to_string(format!("/proc/{pid}/comm")).map(|c| c.trim().to_owned()).unwrap_or_default();
    // A rank of a job says which (its launcher's variable), when this user may read it.
    let rank = std::fs::read(format!("/proc/{pid}/environ")).ok().and_then(|environ| {
        let vars: Vec<&[u8]> = environ.split(|&b| b == 0).collect();
        ["RANK", "OMPI_COMM_WORLD_RANK", "NEURON_PJRT_PROCESS_INDEX", "SLURM_PROCID"].iter().find_map(|name| {
            let value = vars.iter().find_map(|v| v.strip_prefix(name.as_bytes())?.strip_prefix(b"="))?;
            Some(format!("process {} of a job ({name})", String::from_utf8_lossy(value)))
        })
    });
    let command = if command.is_empty() { String::new() } else { format!(" ({command})") };
    let described = match rank {
        None => format!("pid {pid}{command}"),
        Some(rank) => format!("pid {pid}{command}, {rank}"),
    };
    Some((pid, described))
}

fn lock_path(lock_dir: &Path, core: u32) -> PathBuf {
    lock_dir.join(format!("nc{core}.lock"))
}

/// Takes the lock of one core without waiting; `None` when someone else holds it.
fn try_lock(lock_dir: &Path, core: u32) -> NrtResult<Option<Flock<File>>> {
    let path = lock_path(lock_dir, core);
    let cannot = |e: std::io::Error| {
        NrtError::new(
            NrtStatus::Failure,
            format!(
                "cannot open core lock file {}: {e}; set NEURON_VIRT_LOCK_DIR to a usable directory",
                path.display()
            ),
        )
    };
    let file = match File::open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            match OpenOptions::new().write(true).create_new(true).mode(0o644).open(&path) {
                Ok(file) => file,
                // Another process created it first.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => File::open(&path).map_err(cannot)?,
                Err(e) => return Err(cannot(e)),
            }
        }
        Err(e) => return Err(cannot(e)),
    };
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(Some(lock)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, errno)) => Err(NrtError::new(NrtStatus::Failure, format!("cannot lock {}: {errno}", path.display()))),
    }
}

/// Counts the cores nobody holds right now (probing each lock and letting it go).
fn count_free(lock_dir: &Path, total: u32) -> NrtResult<usize> {
    let mut free = 0;
    for core in 0..total {
        if try_lock(lock_dir, core)?.is_some() {
            free += 1;
        }
    }
    Ok(free)
}

/// Creates the lock directory, shared by every user of the host: world-writable with
/// the sticky bit, so users can add lock files but not remove each other's.
fn create_shared_dir(dir: &Path) -> NrtResult<()> {
    let failed = |e: std::io::Error| {
        NrtError::new(
            NrtStatus::Failure,
            format!(
                "cannot create the core lock directory {}: {e}; set NEURON_VIRT_LOCK_DIR to a writable directory",
                dir.display()
            ),
        )
    };
    if dir.is_dir() {
        return Ok(());
    }
    match DirBuilder::new().recursive(true).mode(0o1777).create(dir) {
        // The umask may have cleared bits of the requested mode.
        Ok(()) => std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777)).map_err(failed),
        Err(_) if dir.is_dir() => Ok(()),
        Err(e) => Err(failed(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use neuron_datastore::topology::InstanceType;

    #[test]
    fn a_held_core_is_refused_until_released() {
        let dir = tempfile::tempdir().expect("tempdir");
        let topo = InstanceType::Trn1_2xlarge.topology();
        let first = CoreReservation::acquire(dir.path(), &topo, &CoreRequest::Visible(CoreSet::range(1, 1)))
            .expect("free core");
        let err = CoreReservation::acquire(dir.path(), &topo, &CoreRequest::Visible(CoreSet::range(1, 1)))
            .expect_err("held core");
        assert_eq!(err.status, NrtStatus::ExecNcBusy);
        assert!(
            err.message.starts_with("NeuronCore(s) not available - Requested:nc1-nc1 Available:1"),
            "{}",
            err.message
        );
        // The message names who holds it: another runtime of this very process.
        assert!(err.message.contains("another runtime in this process holds nc1"), "{}", err.message);
        let count = CoreReservation::acquire(dir.path(), &topo, &CoreRequest::Count(1)).expect("nc0 is free");
        assert_eq!(count.cores().cores(), &[0]);
        drop(first);
        CoreReservation::acquire(dir.path(), &topo, &CoreRequest::Visible(CoreSet::range(1, 1))).expect("released");
    }
}
