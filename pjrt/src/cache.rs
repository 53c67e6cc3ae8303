//! The persistent compile cache, as `neuronx-cc` keeps it for torch-neuronx: a graph
//! compiled once (by its `HloModuleProto` and the compile options) is a NEFF on disk,
//! and the next process that compiles the same graph loads it instead, saying so.
//!
//! Where: `--cache_dir=<dir>` in `NEURON_CC_FLAGS`, else `NEURON_COMPILE_CACHE_URL` (a
//! local path), else `/var/tmp/neuron-compile-cache`; `--no-cache` turns it off. Entries
//! are `neuronxcc-<version>/MODULE_<sha256>/model.neff`, written whole (a temporary file
//! renamed). A cache directory must belong to this user and be private to it: the NEFF
//! read back is the program that runs, so one that others can write is not used.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The default cache directory of Neuron's compiler.
pub(crate) const DEFAULT_DIR: &str = "/var/tmp/neuron-compile-cache";

/// What identifies a compiled graph: the SHA-256 of its program and of how it is
/// compiled, in hex. It names the cache entry, the executable's fingerprint and (its
/// first 8 digits) the model.
pub(crate) fn key(program: &[u8], options: &str) -> String {
    let mut hash = Sha256::new();
    hash.update(program);
    hash.update(options.as_bytes());
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Where compiled graphs are kept, if anywhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cache {
    root: PathBuf,
}

impl Cache {
    /// The cache `NEURON_CC_FLAGS` and the environment ask for.
    pub(crate) fn from_settings(flags: &crate::flags::CacheFlags, url: Option<String>) -> Option<Cache> {
        if flags.disabled {
            return None;
        }
        let root = flags.dir.clone().or(url).unwrap_or_else(|| DEFAULT_DIR.to_owned());
        if root.contains("://") {
            tracing::warn!("compile cache {root}: only a local directory is supported; compiling without a cache");
            return None;
        }
        Some(Cache { root: PathBuf::from(root) })
    }

    /// The entry of a graph by its [`key`].
    pub(crate) fn entry(&self, key: &str) -> PathBuf {
        self.root
            .join(format!("neuronxcc-{}", env!("CARGO_PKG_VERSION")))
            .join(format!("MODULE_{}", &key[..40]))
            .join("model.neff")
    }

    /// The cached NEFF at `entry`, if there is one this user can trust.
    pub(crate) fn read(&self, entry: &Path) -> Option<Vec<u8>> {
        if !entry.exists() {
            return None;
        }
        if let Err(why) = private(&self.root) {
            tracing::warn!("compile cache {}: {why}; not using it", self.root.display());
            return None;
        }
        std::fs::read(entry).ok()
    }

    /// Keeps `neff` at `entry`; a failure is logged, never fatal (the graph is compiled).
    pub(crate) fn write(&self, entry: &Path, neff: &[u8]) {
        if let Err(why) = self.try_write(entry, neff) {
            tracing::warn!("compile cache: cannot keep {}: {why}", entry.display());
        }
    }

    fn try_write(&self, entry: &Path, neff: &[u8]) -> Result<(), String> {
        let folder = entry.parent().ok_or("no folder")?;
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(folder).map_err(|e| e.to_string())?;
        private(&self.root)?;
        let temporary = folder.join(format!(".model.neff.{}", std::process::id()));
        let mut file = std::fs::File::create(&temporary).map_err(|e| e.to_string())?;
        file.write_all(neff).and_then(|()| file.sync_all()).map_err(|e| e.to_string())?;
        std::fs::rename(&temporary, entry).map_err(|e| e.to_string())
    }
}

/// The cache directory belongs to this user and nobody else can write in it.
fn private(root: &Path) -> Result<(), String> {
    let metadata = std::fs::metadata(root).map_err(|e| e.to_string())?;
    let me = nix::unistd::getuid().as_raw();
    if metadata.uid() != me {
        return Err(format!("it belongs to uid {}, not this user ({me})", metadata.uid()));
    }
    if metadata.permissions().mode() & 0o022 != 0 {
        return Err(format!("others can write in it (mode {:o})", metadata.permissions().mode() & 0o777));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cache_others_can_write_in_is_not_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = Cache { root: dir.path().to_path_buf() };
        let entry = cache.entry(&key(b"module", "options"));
        cache.write(&entry, b"neff bytes");
        assert_eq!(cache.read(&entry).as_deref(), Some(&b"neff bytes"[..]));
        assert_ne!(cache.entry(&key(b"module", "other options")), entry);
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).expect("chmod");
        assert_eq!(cache.read(&entry), None);
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).expect("chmod");
    }

    #[test]
    fn the_cache_comes_from_the_flags_then_the_environment() {
        let flags = |dir: Option<&str>, disabled| crate::flags::CacheFlags { dir: dir.map(str::to_owned), disabled };
        assert_eq!(Cache::from_settings(&flags(None, false), None).map(|c| c.root), Some(PathBuf::from(DEFAULT_DIR)));
        let url = Some("/tmp/url".to_owned());
        assert_eq!(Cache::from_settings(&flags(None, false), url.clone()).map(|c| c.root), Some("/tmp/url".into()));
        assert_eq!(Cache::from_settings(&flags(Some("/tmp/d"), false), url).map(|c| c.root), Some("/tmp/d".into()));
        assert_eq!(Cache::from_settings(&flags(None, true), None), None);
        assert_eq!(Cache::from_settings(&flags(None, false), Some("s3://bucket/x".into())), None);
    }
}
