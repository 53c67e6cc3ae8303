//! Following the runtimes of a datastore directory over time, as every viewer does:
//! look for new ones, open each once, notice when one exits, and forget it when the
//! viewer is done with it.
//!
//! [`Runtimes`] keeps one [`DatastoreReader`] per followed process beside whatever the
//! viewer keeps for it (`T`). A runtime the viewer declines (a tag filter that does not
//! select it) is not opened again while its datastore file is there; once the file is
//! gone its pid may come back as a new process, and it is looked at afresh.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::DatastoreError;
use crate::reader::{DatastoreReader, Liveness, discover_new};

/// The runtimes of one datastore directory that a viewer follows, each with the
/// viewer's state `T`.
#[derive(Debug)]
pub struct Runtimes<T> {
    dir: PathBuf,
    followed: BTreeMap<u32, Followed<T>>,
    declined: HashSet<u32>,
    ticks_per_second: u64,
}

/// One followed runtime process.
#[derive(Debug)]
pub struct Followed<T> {
    pub reader: DatastoreReader,
    pub pid: u32,
    /// When it was first seen exited (`None` while it is live).
    pub exited_at: Option<Instant>,
    /// Its liveness at the last [`Runtimes::mark_exited`], and its process's CPU time
    /// then (see [`DatastoreReader::liveness_and_cpu`]): read once per look, which the
    /// viewers reuse.
    pub liveness: Liveness,
    pub cpu: Option<crate::host::ProcessCpu>,
    /// How the viewers name it: [`RuntimeInfo::label`](crate::RuntimeInfo::label), made
    /// unique among the live runtimes followed (`train.py-4242` for the second
    /// `train.py`).
    pub label: String,
    /// What the viewer keeps for it.
    pub state: T,
}

impl<T> Followed<T> {
    pub fn exited(&self) -> bool {
        self.exited_at.is_some()
    }
}

/// A runtime whose datastore could not be opened; it is tried again at the next look.
#[derive(Debug)]
pub struct OpenFailure {
    pub pid: u32,
    pub error: DatastoreError,
}

impl<T> Runtimes<T> {
    pub fn new(dir: PathBuf) -> Runtimes<T> {
        let ticks_per_second = crate::host::clock_ticks_per_second();
        Runtimes { dir, followed: BTreeMap::new(), declined: HashSet::new(), ticks_per_second }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Opens the runtimes that appeared since the last look. A runtime that has already
    /// exited when found (its file is removed by this look) is followed as exited, so
    /// that the tool shows its exit once before forgetting it. `admit` is called once
    /// per new runtime, with its label: `Some(state)` follows it, `None` declines it.
    /// The error is the directory's; the list, the runtimes that could not be opened.
    pub fn discover(
        &mut self,
        mut admit: impl FnMut(&DatastoreReader, &str) -> Option<T>,
    ) -> Result<Vec<OpenFailure>, DatastoreError> {
        // Every pid with a datastore file now, followed or not (`known` sees them all).
        let present = std::cell::RefCell::new(HashSet::new());
        let known = |pid: u32| {
            present.borrow_mut().insert(pid);
            self.followed.contains_key(&pid) || self.declined.contains(&pid)
        };
        let entries = discover_new(&self.dir, &known)?;
        let present = present.into_inner();
        self.declined.retain(|pid| present.contains(pid));
        let mut failures = Vec::new();
        for entry in entries {
            let reader = match entry.reader {
                Ok(reader) => reader,
                Err(error) => {
                    failures.push(OpenFailure { pid: entry.pid, error });
                    continue;
                }
            };
            let exited_at = matches!(entry.liveness, Some(Liveness::Exited(_))).then(Instant::now);
            let pid = reader.info().pid;
            let mut label = reader.info().label();
            // Only a runtime still alive keeps the name: one that has just exited (a
            // restart within a look) hands it on.
            if self
                .followed
                .values()
                .any(|f| !f.exited() && f.label == label && !matches!(f.reader.liveness(), Liveness::Exited(_)))
            {
                label = format!("{label}-{pid}");
            }
            match admit(&reader, &label) {
                Some(state) => {
                    self.followed.insert(
                        pid,
                        Followed { reader, pid, exited_at, liveness: Liveness::Live, cpu: None, label, state },
                    );
                }
                None => {
                    self.declined.insert(pid);
                }
            }
        }
        Ok(failures)
    }

    /// Notes which followed runtimes have exited since the last look.
    pub fn mark_exited(&mut self) {
        for followed in self.followed.values_mut().filter(|f| f.exited_at.is_none()) {
            (followed.liveness, followed.cpu) = followed.reader.liveness_and_cpu(self.ticks_per_second);
            if matches!(followed.liveness, Liveness::Exited(_)) {
                followed.exited_at = Some(Instant::now());
            }
        }
    }

    /// Stops following the runtimes seen exited at least `after` ago
    /// (`Duration::ZERO`: every exited one).
    pub fn forget_exited(&mut self, after: Duration) {
        self.followed.retain(|_, f| f.exited_at.is_none_or(|at| at.elapsed() < after));
    }

    /// Stops following every runtime (they are found again at the next look).
    pub fn clear(&mut self) {
        self.followed.clear();
        self.declined.clear();
    }

    /// The followed runtimes, by pid.
    pub fn iter(&self) -> impl Iterator<Item = &Followed<T>> {
        self.followed.values()
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Followed<T>> {
        self.followed.values_mut()
    }

    pub fn len(&self) -> usize {
        self.followed.len()
    }

    pub fn is_empty(&self) -> bool {
        self.followed.is_empty()
    }
}
