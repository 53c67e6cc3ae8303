//! The profile viewer's side on the server: the NTFF files of the profiles directory,
//! resolved by plain name only, opened and indexed once and kept (a few at a time).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

use ntff::NtffFile;
use ntff::summary::{Summary, summarise};
use serde::Serialize;
use tokio::sync::OnceCell;

use crate::index::{ProfileIndex, RanksIndex};

/// Profiles kept indexed in memory at once.
const KEPT: usize = 3;

/// A file of the profiles directory.
#[derive(Debug, Serialize)]
pub(crate) struct Entry {
    pub name: String,
    pub bytes: u64,
    /// Seconds since the Unix epoch.
    pub modified: u64,
}

/// An indexed profile, with its summary once asked for.
#[derive(Debug)]
pub(crate) struct Profile {
    pub name: String,
    pub index: ProfileIndex,
    summary: OnceLock<Summary>,
}

impl Profile {
    pub(crate) fn summary(&self) -> &Summary {
        self.summary.get_or_init(|| summarise(self.index.file(), None))
    }
}

type Slot = Arc<OnceCell<Result<Arc<Profile>, String>>>;
type JobSlot = Arc<OnceCell<Result<Arc<RanksIndex>, String>>>;

/// How the profiles of a job's ranks are named (as Neuron names them, and
/// `neuron-profile inspect` writes them): `profile_rank_<lowest rank>.ntff`.
pub(crate) const RANK_PREFIX: &str = "profile_rank_";

/// A file as it was when read: its path, length and time.
type Stamp = (PathBuf, u64, Option<SystemTime>);

/// A profile open (or being opened): its path, and its file's length and time then.
#[derive(Debug)]
struct Open {
    path: PathBuf,
    len: u64,
    modified: Option<SystemTime>,
    slot: Slot,
}

/// The profiles directory and the profiles open from it.
#[derive(Debug)]
pub(crate) struct Profiles {
    dir: Option<PathBuf>,
    /// By path, with the file's length and time when it was opened; most recent last.
    open: Mutex<Vec<Open>>,
    /// One profile is indexed at a time (it takes every core for a moment).
    indexing: tokio::sync::Semaphore,
    /// The timeline of the directory's rank profiles, with the files it was made of.
    job: Mutex<Option<(Vec<Stamp>, JobSlot)>>,
}

impl Profiles {
    pub(crate) fn new(dir: Option<PathBuf>) -> Profiles {
        Profiles {
            dir: dir.and_then(|d| d.canonicalize().ok().or(Some(d))),
            open: Mutex::new(Vec::new()),
            indexing: tokio::sync::Semaphore::new(1),
            job: Mutex::new(None),
        }
    }

    pub(crate) fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The NTFF files of the directory, newest first.
    pub(crate) fn list(&self) -> std::io::Result<Vec<Entry>> {
        let Some(dir) = &self.dir else { return Ok(Vec::new()) };
        let mut entries = Vec::new();
        for entry in std::fs::read_dir(dir)?.flatten() {
            let Some(name) = entry.file_name().to_str().map(str::to_string) else { continue };
            let Some(path) = self.resolve(&name) else { continue };
            let Ok(meta) = std::fs::metadata(path) else { continue };
            let modified = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_secs());
            entries.push(Entry { name, bytes: meta.len(), modified });
        }
        entries.sort_by(|a, b| b.modified.cmp(&a.modified).then_with(|| a.name.cmp(&b.name)));
        Ok(entries)
    }

    /// The path of profile `name`: a plain `.ntff` file name of the directory, a regular
    /// file there (after links are followed). Anything else is not found.
    pub(crate) fn resolve(&self, name: &str) -> Option<PathBuf> {
        let dir = self.dir.as_ref()?;
        let name = valid_name(name)?;
        let path = dir.join(name).canonicalize().ok()?;
        (path.parent() == Some(dir.as_path()) && path.is_file()).then_some(path)
    }

    /// Profile `name`, indexed on first use (off the async threads); `None` when there is
    /// no such profile.
    pub(crate) async fn get(&self, name: &str) -> Option<Result<Arc<Profile>, String>> {
        let path = self.resolve(name)?;
        let meta = std::fs::metadata(&path).ok()?;
        let (len, modified) = (meta.len(), meta.modified().ok());
        let slot = {
            let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
            let found = open.iter().position(|o| o.path == path && o.len == len && o.modified == modified);
            let slot = match found {
                Some(k) => open.remove(k).slot,
                None => {
                    open.retain(|o| o.path != path);
                    Slot::default()
                }
            };
            open.push(Open { path: path.clone(), len, modified, slot: Arc::clone(&slot) });
            if open.len() > KEPT {
                open.remove(0);
            }
            slot
        };
        let name = name.to_string();
        let result = slot
            .get_or_init(|| async move {
                let Ok(_permit) = self.indexing.acquire().await else {
                    return Err("the dashboard is stopping".to_string());
                };
                let opened = tokio::task::spawn_blocking(move || {
                    let file = NtffFile::open(&path).map_err(|e| format!("{name}: {e}"))?;
                    Ok(Arc::new(Profile { name, index: ProfileIndex::build(file), summary: OnceLock::new() }))
                })
                .await;
                opened.unwrap_or_else(|e| Err(format!("indexing failed: {e}")))
            })
            .await;
        Some(result.clone())
    }
}

impl Profiles {
    /// The directory's profiles of a job's ranks: (rank, name, path), by rank.
    pub(crate) fn rank_files(&self) -> Vec<(u32, String, PathBuf)> {
        let mut files: Vec<(u32, String, PathBuf)> = self
            .list()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|e| {
                let rank = e.name.strip_prefix(RANK_PREFIX)?.strip_suffix(".ntff")?.parse().ok()?;
                let path = self.resolve(&e.name)?;
                Some((rank, e.name, path))
            })
            .collect();
        files.sort();
        files
    }

    /// The directory's rank profiles whose recording never finished
    /// (`profile_rank_<id>.ntff.partial`: a process that died, or a recording stopped),
    /// by name; only their names are read.
    pub(crate) fn unfinished_rank_files(&self) -> Vec<String> {
        let Some(dir) = &self.dir else { return Vec::new() };
        let found = ntff::unfinished_profiles(dir).unwrap_or_default();
        found.into_iter().map(|(name, _)| name).filter(|n| n.starts_with(RANK_PREFIX) && !n.contains('\n')).collect()
    }

    /// The timeline of the directory's rank profiles together, indexed on first use and
    /// again when one of them changed; `None` when there are none.
    pub(crate) async fn job(&self) -> Option<Result<Arc<RanksIndex>, String>> {
        let files = self.rank_files();
        if files.is_empty() {
            return None;
        }
        let stamps: Vec<Stamp> = files
            .iter()
            .map(|(_, _, path)| {
                let meta = std::fs::metadata(path).ok();
                (path.clone(), meta.as_ref().map_or(0, |m| m.len()), meta.and_then(|m| m.modified().ok()))
            })
            .collect();
        let slot = {
            let mut job = self.job.lock().unwrap_or_else(|e| e.into_inner());
            match job.as_ref() {
                Some((kept, slot)) if *kept == stamps => Arc::clone(slot),
                _ => {
                    let slot = JobSlot::default();
                    *job = Some((stamps, Arc::clone(&slot)));
                    slot
                }
            }
        };
        let result = slot
            .get_or_init(|| async move {
                let Ok(_permit) = self.indexing.acquire().await else {
                    return Err("the dashboard is stopping".to_string());
                };
                let opened = tokio::task::spawn_blocking(move || {
                    let files = files
                        .into_iter()
                        .map(|(rank, name, path)| match NtffFile::open(&path) {
                            Ok(file) => Ok((rank, name, file)),
                            Err(e) => Err(format!("{name}: {e}")),
                        })
                        .collect::<Result<Vec<_>, String>>()?;
                    Ok(Arc::new(RanksIndex::build(files)))
                })
                .await;
                opened.unwrap_or_else(|e| Err(format!("indexing failed: {e}")))
            })
            .await;
        Some(result.clone())
    }
}

/// `name` when it is a plain file name ending in `.ntff`: no separators, no parent
/// references, not hidden, printable.
fn valid_name(name: &str) -> Option<&str> {
    let plain = !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('.')
        && !name.contains(['/', '\\', '\0'])
        && !name.chars().any(char::is_control)
        && name.ends_with(".ntff");
    plain.then_some(name)
}

/// One HLO instruction in two profiles: device time per device-traced execution, so
/// that profiles of different lengths compare.
#[derive(Debug, Serialize)]
pub(crate) struct HloDifference {
    pub hlo: String,
    pub a_time_s: Option<f64>,
    pub b_time_s: Option<f64>,
    /// `b - a`, a missing side counting as zero.
    pub difference_s: f64,
    /// `b / a`, when both are there.
    pub ratio: Option<f64>,
    /// Instructions per execution.
    pub a_instructions: Option<f64>,
    pub b_instructions: Option<f64>,
    /// Whether the change is within the run-to-run spread of the two profiles (see
    /// [`spread`]); `None` when either has too few executions to tell.
    pub within_noise: Option<bool>,
}

/// Device-traced executions a side needs before a difference per instruction is told
/// apart from noise.
pub(crate) const NOISE_MIN_TRACED: u64 = 3;
/// The smallest spread assumed: timers and caches move any figure by a few percent.
const MIN_SPREAD: f64 = 0.05;

/// A profile's run-to-run spread: how far its p90 device latency is above its p50, as a
/// fraction of the p50, at least [`MIN_SPREAD`]; `None` with fewer than
/// [`NOISE_MIN_TRACED`] device-traced executions or too few for a p90.
pub(crate) fn spread(s: &Summary) -> Option<f64> {
    let latency = s.executions.device_latency?;
    if s.executions.device_traced < NOISE_MIN_TRACED
        || latency.count < ntff::stats::P90_MIN_EXECUTIONS
        || latency.p50 <= 0.0
    {
        return None;
    }
    Some(((latency.p90 - latency.p50) / latency.p50).max(MIN_SPREAD))
}

/// One figure of a profile's bounds, in seconds over its traced executions.
type BoundOf = fn(&ntff::summary::Bounds) -> Option<f64>;

/// The bounds of `a` and `b` per traced execution side by side, what the difference in
/// device and host time is made of, and which findings went away, appeared or stayed.
pub(crate) fn compare_bounds(a: &Summary, b: &Summary) -> serde_json::Value {
    use serde_json::json;
    let per = |s: &Summary, f: BoundOf| s.bounds.as_ref().and_then(|b| Some(f(b)? / b.executions.max(1) as f64));
    let rows: [(&str, BoundOf); 7] = [
        ("host (nrt_execute)", |b| b.host_s),
        ("device (nc_exec_running)", |b| Some(b.device_s)),
        ("pipeline", |b| Some(b.pipeline_s)),
        ("compute", |b| b.compute_s),
        ("memory", |b| b.memory_s),
        ("engines waiting on each other", |b| Some(b.device_s - b.pipeline_s)),
        ("host around the device run", |b| Some((b.host_s? - b.device_s).max(0.0))),
    ];
    let bounds: Vec<serde_json::Value> = rows
        .iter()
        .map(|(name, f)| {
            let (x, y) = (per(a, *f), per(b, *f));
            json!({"name": name, "a_s": x, "b_s": y, "difference_s": x.zip(y).map(|(x, y)| y - x)})
        })
        .collect();
    let key = |f: &ntff::summary::Finding| format!("{} {}", f.kind, f.about);
    let find = |s: &Summary, k: &str| s.findings.iter().find(|f| key(f) == k).cloned();
    let keys: Vec<String> = a.findings.iter().chain(&b.findings).map(key).collect();
    let mut seen = std::collections::HashSet::new();
    let findings: Vec<serde_json::Value> = keys
        .into_iter()
        .filter(|k| seen.insert(k.clone()))
        .map(|k| {
            let (x, y) = (find(a, &k), find(b, &k));
            let status = match (&x, &y) {
                (Some(_), None) => "went away",
                (None, Some(_)) => "appeared",
                _ => "in both",
            };
            json!({"status": status, "a": x, "b": y})
        })
        .collect();
    json!({"bounds": bounds, "findings": findings})
}

/// Per HLO instruction, the device time per execution of `b` against `a`, largest
/// change first.
pub(crate) fn compare(a: &Summary, b: &Summary) -> Vec<HloDifference> {
    type Side<'a> = Option<&'a ntff::summary::HloSummary>;
    let mut rows: HashMap<&str, (Side<'_>, Side<'_>)> = HashMap::new();
    for h in &a.hlo_instructions {
        rows.entry(&h.hlo).or_default().0 = Some(h);
    }
    for h in &b.hlo_instructions {
        rows.entry(&h.hlo).or_default().1 = Some(h);
    }
    let per = |s: &Summary| s.executions.device_traced.max(1) as f64;
    let (na, nb) = (per(a), per(b));
    // A change within both profiles' spread is noise.
    let noise = spread(a).zip(spread(b)).map(|(x, y)| (1.0 + x.max(y)).ln());
    let mut out: Vec<HloDifference> = rows
        .into_iter()
        .map(|(hlo, (x, y))| {
            let (ta, tb) = (x.map(|h| h.time_s / na), y.map(|h| h.time_s / nb));
            HloDifference {
                hlo: hlo.to_string(),
                a_time_s: ta,
                b_time_s: tb,
                difference_s: tb.unwrap_or(0.0) - ta.unwrap_or(0.0),
                ratio: ta.zip(tb).filter(|(a, _)| *a > 0.0).map(|(a, b)| b / a),
                a_instructions: x.map(|h| h.instructions as f64 / na),
                b_instructions: y.map(|h| h.instructions as f64 / nb),
                within_noise: noise.map(|limit| {
                    ta.zip(tb).filter(|(a, b)| *a > 0.0 && *b > 0.0).is_some_and(|(a, b)| (b / a).ln().abs() <= limit)
                }),
            }
        })
        .collect();
    out.sort_by(|p, q| q.difference_s.abs().total_cmp(&p.difference_s.abs()).then_with(|| p.hlo.cmp(&q.hlo)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_ntff_names_are_valid() {
        for good in ["a.ntff", "ntff_pid_12_0.ntff", "with space.ntff"] {
            assert_eq!(valid_name(good), Some(good));
        }
        for bad in
            ["", "../a.ntff", "a/b.ntff", "..\\a.ntff", ".hidden.ntff", "a.txt", "a.ntff\0", "/etc/passwd", "a\n.ntff"]
        {
            assert_eq!(valid_name(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn resolve_stays_inside_the_directory() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("profiles");
        std::fs::create_dir(&dir).expect("mkdir");
        std::fs::write(dir.join("in.ntff"), b"x").expect("write");
        std::fs::write(root.path().join("out.ntff"), b"x").expect("write");
        std::os::unix::fs::symlink(root.path().join("out.ntff"), dir.join("link.ntff")).expect("symlink");
        std::fs::create_dir(dir.join("sub.ntff")).expect("mkdir");
        let profiles = Profiles::new(Some(dir.clone()));
        assert!(profiles.resolve("in.ntff").is_some());
        assert_eq!(profiles.resolve("link.ntff"), None, "a link out of the directory");
        assert_eq!(profiles.resolve("sub.ntff"), None, "a directory");
        assert_eq!(profiles.resolve("../out.ntff"), None);
        assert_eq!(profiles.resolve("missing.ntff"), None);
        let names: Vec<String> = profiles.list().expect("list").into_iter().map(|e| e.name).collect();
        assert_eq!(names, ["in.ntff"]);
        assert_eq!(Profiles::new(None).resolve("in.ntff"), None);
    }
}
