//! What the tools that read datastores take from the environment and the command line:
//! where the datastores are, which instance to assume when no runtime says, and the
//! duration and listen-address forms every tool's flags accept.
//!
//! This is the only module of the crate that reads environment variables (besides the
//! fallbacks of [`crate::default_dir`]); the rest takes a validated [`ReaderConfig`].

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use crate::directory::default_dir;
use crate::topology::{DEFAULT_INSTANCE_TYPE, InstanceType, UnknownInstanceType};

/// The datastore directory (the runtime's and every reader's).
pub const ENV_DATASTORE_DIR: &str = "NEURON_VIRT_DATASTORE_DIR";
/// The instance type the virtual device impersonates.
pub const ENV_INSTANCE_TYPE: &str = "NEURON_VIRT_INSTANCE_TYPE";

/// Where a reading tool finds the runtimes, and the instance it shows when no runtime
/// says which it runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReaderConfig {
    pub datastore_dir: PathBuf,
    pub instance_type: InstanceType,
}

/// A variable of [`ReaderConfig`] with a value it does not take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{ENV_INSTANCE_TYPE}: {0}")]
pub struct ReaderConfigError(UnknownInstanceType);

impl ReaderConfig {
    /// From `NEURON_VIRT_DATASTORE_DIR` and `NEURON_VIRT_INSTANCE_TYPE`; empty values
    /// count as unset.
    pub fn from_env() -> Result<ReaderConfig, ReaderConfigError> {
        ReaderConfig::from_lookup(|name| std::env::var(name).ok())
    }

    /// From variables looked up by `lookup` (tests pass a map).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<ReaderConfig, ReaderConfigError> {
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        Ok(ReaderConfig {
            datastore_dir: get(ENV_DATASTORE_DIR).map_or_else(default_dir, PathBuf::from),
            instance_type: get(ENV_INSTANCE_TYPE)
                .map_or(Ok(DEFAULT_INSTANCE_TYPE), |name| name.parse())
                .map_err(ReaderConfigError)?,
        })
    }
}

/// Why a duration does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("`{0}` is not a duration; use forms like 10s, 500ms, 2m")]
    NotADuration(String),
    #[error("unknown unit `{unit}` in `{text}`; use ms, s, m or h")]
    UnknownUnit { unit: String, text: String },
    #[error("`{0}` is not a valid duration")]
    OutOfRange(String),
}

/// Parses a duration: `10s`, `500ms`, `2m`, `1.5h`, `250us`; a bare number is seconds.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let text = text.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().map_err(|_| DurationError::NotADuration(text.into()))?;
    let seconds = match unit.trim() {
        "" | "s" => value,
        "ms" => value / 1e3,
        "us" | "µs" => value / 1e6,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        other => return Err(DurationError::UnknownUnit { unit: other.into(), text: text.into() }),
    };
    Duration::try_from_secs_f64(seconds).map_err(|_| DurationError::OutOfRange(text.into()))
}

/// Why a listen address does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ListenAddressError {
    #[error("{0:?} is not a PORT, nor a HOST:PORT that resolves")]
    Unresolved(String),
    #[error("{0:?}: the host has no address")]
    NoAddress(String),
}

/// Parses where a tool's server listens: `PORT` alone (or `:PORT`) is on 127.0.0.1;
/// `HOST:PORT` and `[V6]:PORT` are taken as they are, the host resolved.
pub fn parse_listen_address(text: &str) -> Result<SocketAddr, ListenAddressError> {
    if let Ok(port) = text.trim_start_matches(':').parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    text.to_socket_addrs()
        .map_err(|_| ListenAddressError::Unresolved(text.into()))?
        .next()
        .ok_or_else(|| ListenAddressError::NoAddress(text.into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn durations_take_the_units_people_write() {
        let ok = |text: &str| parse_duration(text).map(|d| d.as_secs_f64());
        assert_eq!(ok("10s"), Ok(10.0));
        assert_eq!(ok("500ms"), Ok(0.5));
        assert_eq!(ok("250us"), Ok(0.000_25));
        assert_eq!(ok("2m"), Ok(120.0));
        assert_eq!(ok("1.5h"), Ok(5400.0));
        assert_eq!(ok(" 3 "), Ok(3.0), "a bare number is seconds");
        assert!(parse_duration("5 parsecs").is_err_and(|e| e.to_string().contains("unknown unit")));
        assert!(parse_duration("soon").is_err_and(|e| e.to_string().contains("is not a duration")));
        assert!(parse_duration("1e400s").is_err());
    }

    #[test]
    fn a_port_alone_listens_on_loopback() {
        let ok = |text: &str| parse_listen_address(text).map(|a| a.to_string());
        assert_eq!(ok("3001"), Ok("127.0.0.1:3001".to_string()));
        assert_eq!(ok(":8000"), Ok("127.0.0.1:8000".to_string()));
        assert_eq!(ok("0.0.0.0:9"), Ok("0.0.0.0:9".to_string()));
        assert_eq!(ok("[::1]:9"), Ok("[::1]:9".to_string()));
        assert!(parse_listen_address("nowhere").is_err_and(|e| e.to_string().contains("not a PORT")));
        assert!(parse_listen_address("70000").is_err());
    }

    #[test]
    fn readers_take_the_directory_and_instance_from_the_environment() {
        let config = |vars: &[(&str, &str)]| {
            let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            ReaderConfig::from_lookup(|name| map.get(name).cloned())
        };
        let defaults = config(&[]).expect("defaults");
        assert_eq!((defaults.datastore_dir, defaults.instance_type), (default_dir(), DEFAULT_INSTANCE_TYPE));
        let set = config(&[(ENV_DATASTORE_DIR, "/tmp/x"), (ENV_INSTANCE_TYPE, " inf2.xlarge ")]).expect("valid");
        assert_eq!((set.datastore_dir, set.instance_type), (PathBuf::from("/tmp/x"), InstanceType::Inf2_xlarge));
        let error = config(&[(ENV_INSTANCE_TYPE, "p4d.24xlarge")]).expect_err("unknown type");
        assert!(error.to_string().starts_with("NEURON_VIRT_INSTANCE_TYPE: unknown instance type `p4d.24xlarge`"));
        // The cause is in the message, not repeated as a source.
        assert!(std::error::Error::source(&error).is_none());
    }
}
