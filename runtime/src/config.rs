//! Runtime configuration, parsed once from the environment into a validated struct.
//!
//! Nothing else in the runtime reads environment variables: [`Config::from_env`] is the
//! only place, and every value it accepts is checked here, with an error that names the
//! variable, the bad value and the accepted forms.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{NrtError, NrtResult};
use crate::fault::{self, FaultRule};
use crate::launch::{self, Launch, RootComm};
use neuron_datastore::peaks::ProductKernel;
use neuron_datastore::topology::{CoreSet, DEFAULT_INSTANCE_TYPE, InstanceType};
use neuron_datastore::{CollectiveAlgorithm, InspectConfig, default_dir};

/// Selects the virtual instance type (our extension; default `trn1.2xlarge`), and where
/// the datastores are (our extension; default in `$XDG_RUNTIME_DIR`): every reading tool
/// takes them too.
pub use neuron_datastore::config::{ENV_DATASTORE_DIR, ENV_INSTANCE_TYPE};
/// Directory of the host-wide NeuronCore reservation locks (our extension).
pub const ENV_LOCK_DIR: &str = "NEURON_VIRT_LOCK_DIR";
/// Host threads executing virtual cores (our extension; default: the host's CPU count).
pub const ENV_HOST_THREADS: &str = "NEURON_VIRT_HOST_THREADS";
pub const ENV_VISIBLE_CORES: &str = "NEURON_RT_VISIBLE_CORES";
pub const ENV_NUM_CORES: &str = "NEURON_RT_NUM_CORES";
pub const ENV_LOG_LEVEL: &str = "NEURON_RT_LOG_LEVEL";
pub const ENV_EXEC_TIMEOUT: &str = "NEURON_RT_EXEC_TIMEOUT";
pub const ENV_VALIDATE_HASH: &str = "NEURON_RT_VALIDATE_HASH";
pub const ENV_NUMERICAL_ERRORS_VERBOSITY: &str = "NEURON_RT_NUMERICAL_ERRORS_VERBOSITY";
pub const ENV_PROCESS_TAG: &str = "NEURON_PROCESS_TAG";
pub const ENV_INSPECT_ENABLE: &str = "NEURON_RT_INSPECT_ENABLE";
pub const ENV_INSPECT_OUTPUT_DIR: &str = "NEURON_RT_INSPECT_OUTPUT_DIR";
/// Where profiles go when `NEURON_RT_INSPECT_OUTPUT_DIR` is unset.
pub const DEFAULT_INSPECT_OUTPUT_DIR: &str = "output";
pub const ENV_INSPECT_SYSTEM_PROFILE: &str = "NEURON_RT_INSPECT_SYSTEM_PROFILE";
pub const ENV_INSPECT_DEVICE_PROFILE: &str = "NEURON_RT_INSPECT_DEVICE_PROFILE";
pub const ENV_INSPECT_MAX_EVENTS_PER_NC: &str = "NEURON_RT_INSPECT_SYS_TRACE_MAX_EVENTS_PER_NC";
pub const ENV_INSPECT_EVENT_FILTER_NC: &str = "NEURON_RT_INSPECT_EVENT_FILTER_NC";
pub const ENV_INSPECT_EVENT_FILTER_TYPE: &str = "NEURON_RT_INSPECT_EVENT_FILTER_TYPE";
/// Refuse new trace events when a ring is full instead of overwriting (our extension).
pub const ENV_TRACE_DISCARD: &str = "NEURON_VIRT_TRACE_DISCARD";
/// Whether chains of element-wise instructions run fused (our extension; default on).
pub const ENV_FUSION: &str = "NEURON_VIRT_FUSION";
/// Whether collectives keep the flight record the tools' ranks views read (our
/// extension; default on).
pub const ENV_FLIGHT_RECORD: &str = "NEURON_VIRT_FLIGHT_RECORD";
/// Which kernel runs matrix products of bf16-rounded operands (our extension): `auto`
/// (the default: bf16 products where measured faster than f32 on this host), `bf16` or
/// `f32`. A process takes the first runtime's choice.
pub const ENV_BF16_PRODUCTS: &str = "NEURON_VIRT_BF16_PRODUCTS";
/// Requests each compute execution unit holds in flight (`nrta_*`).
pub const ENV_XU_COMPUTE_MAX_QUEUED: &str = "NEURON_RT_XU_COMPUTE_MAX_QUEUED_REQUESTS";
/// `NEURON_RT_XU_COMPUTE_MAX_QUEUED_REQUESTS` when unset.
pub const DEFAULT_XU_QUEUE: usize = 8;
/// The largest queue accepted.
pub const MAX_XU_QUEUE: usize = 1 << 16;
/// Faults to inject: `KIND[:core=N][:every=K|:after=K|:rate=P]`, comma-separated (see `fault`).
pub const ENV_FAULT_INJECT: &str = "NEURON_RT_FAULT_INJECT";
/// How collectives move data: `ring`, `all-to-all`, or `auto` (by size; the default).
pub const ENV_COLLECTIVES_ALGORITHM: &str = "NEURON_RT_COLLECTIVES_ALGORITHM";
/// The job's secret (our extension): the same text in every process of a job, which
/// they prove to each other that they hold before they exchange anything (see
/// [`JobAuth`]). Give it with `mpirun -x`, `srun --export` or torchrun's environment.
pub const ENV_JOB_SECRET: &str = "NEURON_VIRT_JOB_SECRET";
/// A file holding the job's secret, private to its user (our extension; instead of
/// [`ENV_JOB_SECRET`]).
pub const ENV_JOB_SECRET_FILE: &str = "NEURON_VIRT_JOB_SECRET_FILE";
/// `1`: a job with no secret may span hosts, anyone on the network being trusted
/// (our extension; every process says so when it joins).
pub const ENV_TRUSTED_NETWORK: &str = "NEURON_VIRT_TRUSTED_NETWORK";
/// The shortest job secret accepted, in bytes.
pub const MIN_JOB_SECRET_BYTES: usize = 16;
/// Longest `NEURON_PROCESS_TAG` accepted.
pub const MAX_PROCESS_TAG_LEN: usize = 255;

/// How long one execution may run before it fails with `NRT_TIMEOUT`.
pub const DEFAULT_EXEC_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest `NEURON_RT_EXEC_TIMEOUT` accepted: one week.
pub const MAX_EXEC_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);
/// Log level when `NEURON_RT_LOG_LEVEL` is unset.
pub const DEFAULT_LOG_LEVEL: LogLevel = LogLevel::Error;

/// Which cores this process reserves at init.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CoreRequest {
    /// Every core of the instance (neither variable set), as the Neuron runtime does.
    All,
    /// Exactly these cores (`NEURON_RT_VISIBLE_CORES`).
    Visible(CoreSet),
    /// This many cores, the lowest-numbered free ones (`NEURON_RT_NUM_CORES`).
    Count(u32),
}

/// `NEURON_RT_LOG_LEVEL`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    /// The matching `tracing` level, for binaries that install a subscriber.
    pub fn as_tracing(self) -> tracing::Level {
        match self {
            LogLevel::Error => tracing::Level::ERROR,
            LogLevel::Warn => tracing::Level::WARN,
            LogLevel::Info => tracing::Level::INFO,
            LogLevel::Debug => tracing::Level::DEBUG,
            LogLevel::Trace => tracing::Level::TRACE,
        }
    }
}

/// `NEURON_RT_NUMERICAL_ERRORS_VERBOSITY`: what NaN or Inf in an output means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumericalErrorsVerbosity {
    /// Count it and succeed (the default).
    Warning,
    /// Fail the execution with `NRT_EXEC_COMPLETED_WITH_NUM_ERR`.
    Critical,
    /// Do not check outputs at all.
    None,
}

/// Everything the runtime reads from its environment, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub instance_type: InstanceType,
    pub cores: CoreRequest,
    pub log_level: LogLevel,
    pub exec_timeout: Duration,
    pub validate_hash: bool,
    pub numerical_errors: NumericalErrorsVerbosity,
    pub lock_dir: PathBuf,
    pub host_threads: usize,
    /// `NEURON_PROCESS_TAG`: how tools label this process.
    pub process_tag: Option<String>,
    /// What the trace rings record.
    pub inspect: InspectConfig,
    /// Where a program's own profiles go (`NEURON_RT_INSPECT_OUTPUT_DIR`; the C API's
    /// `nrt_inspect_stop` writes there).
    pub inspect_output_dir: PathBuf,
    /// Where the datastore file is created.
    pub datastore_dir: PathBuf,
    /// Run chains of element-wise instructions fused (`NEURON_VIRT_FUSION`).
    pub fusion: bool,
    /// Keep the collectives' flight record (`NEURON_VIRT_FLIGHT_RECORD`).
    pub flight_record: bool,
    /// The kernel of bf16-rounded matrix products (`NEURON_VIRT_BF16_PRODUCTS`); `None`
    /// measures which is faster.
    pub bf16_products: Option<ProductKernel>,
    /// Faults to inject (`NEURON_RT_FAULT_INJECT`); none by default.
    pub faults: Vec<FaultRule>,
    /// Requests in flight per execution unit (`NEURON_RT_XU_COMPUTE_MAX_QUEUED_REQUESTS`).
    pub xu_queue: usize,
    /// The algorithm of every collective (`NEURON_RT_COLLECTIVES_ALGORITHM`); `None`
    /// chooses by size.
    pub collectives_algorithm: Option<CollectiveAlgorithm>,
    /// This process's place in a job of several processes, from its launcher's
    /// variables (`None`: a process on its own; see [`crate::launch`]).
    pub launch: Option<Launch>,
    /// Where the job's rank 0 waits for the others (`NEURON_RT_ROOT_COMM_ID`, or
    /// `MASTER_ADDR` with port 62182).
    pub root_comm: Option<RootComm>,
    /// How the job's processes prove to each other that they belong to it.
    pub job_auth: JobAuth,
    /// What the environment set that was ignored, for the runtime to log when it starts
    /// (the configuration is read before logging is set up).
    pub warnings: Vec<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            instance_type: DEFAULT_INSTANCE_TYPE,
            cores: CoreRequest::All,
            log_level: DEFAULT_LOG_LEVEL,
            exec_timeout: DEFAULT_EXEC_TIMEOUT,
            validate_hash: false,
            numerical_errors: NumericalErrorsVerbosity::Warning,
            lock_dir: lock_dir(None),
            host_threads: default_host_threads(),
            process_tag: None,
            inspect: InspectConfig::default(),
            inspect_output_dir: PathBuf::from(DEFAULT_INSPECT_OUTPUT_DIR),
            datastore_dir: default_dir(),
            fusion: true,
            flight_record: true,
            bf16_products: None,
            faults: Vec::new(),
            xu_queue: DEFAULT_XU_QUEUE,
            collectives_algorithm: None,
            launch: None,
            root_comm: None,
            job_auth: JobAuth::ThisUser,
            warnings: Vec::new(),
        }
    }
}

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> NrtResult<Config> {
        Config::from_lookup(|name| std::env::var(name).ok())
    }

    /// Builds a configuration from any variable lookup (the environment, or a test's map).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> NrtResult<Config> {
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let mut warnings = Vec::new();
        let bad = |name: &str, value: &str, expected: &str| {
            NrtError::invalid(format!("{name}={} is not valid: {expected}", shown(value)))
        };

        let instance_type = match get(ENV_INSTANCE_TYPE) {
            Some(v) => v.parse::<InstanceType>().map_err(|e| NrtError::invalid(format!("{ENV_INSTANCE_TYPE}: {e}")))?,
            None => DEFAULT_INSTANCE_TYPE,
        };
        let core_count = instance_type.topology().core_count();

        // Set but empty is a mistake worth naming (a script's unset variable), not "all".
        if let Some(visible) = lookup(ENV_VISIBLE_CORES).filter(|v| v.trim().is_empty()) {
            return Err(bad(ENV_VISIBLE_CORES, &visible, "it is empty; give cores such as 0, 0-1 or 0,2, or unset it"));
        }
        let cores = match (get(ENV_VISIBLE_CORES), get(ENV_NUM_CORES)) {
            (Some(visible), num) => {
                if num.is_some() {
                    warnings.push(format!("{ENV_VISIBLE_CORES} is set, so {ENV_NUM_CORES} is ignored"));
                }
                let set = CoreSet::parse(&visible, core_count)
                    .map_err(|e| bad(ENV_VISIBLE_CORES, &visible, &format!("{e} on {instance_type}")))?;
                CoreRequest::Visible(set)
            }
            (None, Some(num)) => {
                let n: u32 = num
                    .trim()
                    .parse()
                    .map_err(|_| bad(ENV_NUM_CORES, &num, "expected a whole number of cores, e.g. 2"))?;
                if n == 0 || n > core_count {
                    return Err(bad(
                        ENV_NUM_CORES,
                        &num,
                        &format!("{instance_type} has {core_count} NeuronCores; ask for 1 to {core_count}"),
                    ));
                }
                CoreRequest::Count(n)
            }
            (None, None) => CoreRequest::All,
        };

        let log_level = match get(ENV_LOG_LEVEL) {
            Some(v) => match v.trim().to_ascii_uppercase().as_str() {
                "ERROR" => LogLevel::Error,
                "WARN" | "WARNING" => LogLevel::Warn,
                "INFO" => LogLevel::Info,
                "DEBUG" => LogLevel::Debug,
                "TRACE" => LogLevel::Trace,
                _ => {
                    return Err(bad(ENV_LOG_LEVEL, &v, "use ERROR, WARN, INFO, DEBUG or TRACE"));
                }
            },
            None => DEFAULT_LOG_LEVEL,
        };

        let exec_timeout = match get(ENV_EXEC_TIMEOUT) {
            Some(v) => {
                match v.trim().parse::<f64>().ok().filter(|s| *s > 0.0 && *s <= MAX_EXEC_TIMEOUT.as_secs_f64()) {
                    Some(seconds) => Duration::from_secs_f64(seconds),
                    None => {
                        return Err(bad(
                            ENV_EXEC_TIMEOUT,
                            &v,
                            &format!(
                                "expected a positive number of seconds up to {}, e.g. 30",
                                MAX_EXEC_TIMEOUT.as_secs()
                            ),
                        ));
                    }
                }
            }
            None => DEFAULT_EXEC_TIMEOUT,
        };

        let validate_hash = match get(ENV_VALIDATE_HASH) {
            Some(v) => parse_bool(&v).ok_or_else(|| bad(ENV_VALIDATE_HASH, &v, "use true or false"))?,
            None => false,
        };

        let numerical_errors = match get(ENV_NUMERICAL_ERRORS_VERBOSITY) {
            Some(v) => match v.trim().to_ascii_lowercase().as_str() {
                "critical" => NumericalErrorsVerbosity::Critical,
                "warning" | "warn" => NumericalErrorsVerbosity::Warning,
                "none" => NumericalErrorsVerbosity::None,
                _ => {
                    return Err(bad(ENV_NUMERICAL_ERRORS_VERBOSITY, &v, "use critical, warning or none"));
                }
            },
            None => NumericalErrorsVerbosity::Warning,
        };

        let fusion = match get(ENV_FUSION) {
            Some(v) => parse_bool(&v).ok_or_else(|| bad(ENV_FUSION, &v, "use true or false"))?,
            None => true,
        };

        let flight_record = match get(ENV_FLIGHT_RECORD) {
            Some(v) => parse_bool(&v).ok_or_else(|| bad(ENV_FLIGHT_RECORD, &v, "use true or false"))?,
            None => true,
        };

        let trusted_network = match get(ENV_TRUSTED_NETWORK) {
            Some(v) => parse_bool(&v).ok_or_else(|| bad(ENV_TRUSTED_NETWORK, &v, "use true or false"))?,
            None => false,
        };
        let job_auth = match (lookup(ENV_JOB_SECRET).filter(|v| !v.is_empty()), get(ENV_JOB_SECRET_FILE)) {
            (Some(_), Some(_)) => {
                return Err(NrtError::invalid(format!(
                    "{ENV_JOB_SECRET} and {ENV_JOB_SECRET_FILE} are both set: give the job's secret one way"
                )));
            }
            (Some(secret), None) if secret.len() < MIN_JOB_SECRET_BYTES => {
                return Err(NrtError::invalid(format!(
                    "{ENV_JOB_SECRET} is {} bytes; a job secret is at least {MIN_JOB_SECRET_BYTES} (for example `head -c 32 /dev/urandom | base64`)",
                    secret.len()
                )));
            }
            (Some(secret), None) => JobAuth::Secret(JobSecret::Value(secret)),
            (None, Some(path)) => JobAuth::Secret(JobSecret::File(PathBuf::from(path))),
            (None, None) if trusted_network => JobAuth::TrustedNetwork,
            (None, None) => JobAuth::ThisUser,
        };

        let bf16_products = match get(ENV_BF16_PRODUCTS).as_deref().map(str::trim) {
            None | Some("auto") => None,
            Some("bf16") => Some(ProductKernel::Bf16),
            Some("f32") => Some(ProductKernel::F32),
            Some("amx") => Some(ProductKernel::Amx),
            Some(v) => return Err(bad(ENV_BF16_PRODUCTS, v, "use auto, amx, bf16 or f32")),
        };

        let faults = match get(ENV_FAULT_INJECT) {
            Some(v) => fault::parse_rules(&v, core_count).map_err(|e| {
                bad(
                    ENV_FAULT_INJECT,
                    &v,
                    &format!("{e} (rules are KIND[:core=N][:every=K|:after=K|:rate=P], comma-separated)"),
                )
            })?,
            None => Vec::new(),
        };

        let xu_queue = match get(ENV_XU_COMPUTE_MAX_QUEUED) {
            Some(v) => match v.trim().parse::<usize>() {
                Ok(n) if (1..=MAX_XU_QUEUE).contains(&n) => n,
                _ => {
                    return Err(bad(
                        ENV_XU_COMPUTE_MAX_QUEUED,
                        &v,
                        &format!("expected a whole number of requests from 1 to {MAX_XU_QUEUE}"),
                    ));
                }
            },
            None => DEFAULT_XU_QUEUE,
        };

        let collectives_algorithm = match get(ENV_COLLECTIVES_ALGORITHM) {
            Some(v) => {
                CollectiveAlgorithm::parse(&v).map_err(|e| bad(ENV_COLLECTIVES_ALGORITHM, &v, &e.to_string()))?
            }
            None => None,
        };

        let host_threads = match get(ENV_HOST_THREADS) {
            Some(v) => match v.trim().parse::<usize>() {
                Ok(n) if (1..=MAX_HOST_THREADS).contains(&n) => n,
                _ => {
                    let cpus = default_host_threads();
                    let expected = format!("expected 1 to {MAX_HOST_THREADS} threads (this host has {cpus} CPUs)");
                    return Err(bad(ENV_HOST_THREADS, &v, &expected));
                }
            },
            None => default_host_threads(),
        };

        let process_tag = lookup(ENV_PROCESS_TAG).filter(|v| !v.is_empty());
        if let Some(tag) = &process_tag {
            check_process_tag(tag).map_err(|why| bad(ENV_PROCESS_TAG, tag, &why))?;
        }

        let profile = |name: &str| -> NrtResult<Option<bool>> {
            match get(name) {
                None => Ok(None),
                Some(v) => match v.trim().to_ascii_lowercase().as_str() {
                    "0" | "false" | "off" => Ok(Some(false)),
                    "1" | "true" | "on" | "model" | "session" => Ok(Some(true)),
                    _ => Err(bad(name, &v, "use 0, 1, model or session")),
                },
            }
        };
        // Unset, the always-on rings record at their small default size; set to 1, a
        // profile is asked for and the rings are made large enough for one.
        let asked_to_inspect = match get(ENV_INSPECT_ENABLE) {
            Some(v) => Some(parse_bool(&v).ok_or_else(|| bad(ENV_INSPECT_ENABLE, &v, "use 0 or 1"))?),
            None => None,
        };
        let enabled = asked_to_inspect.unwrap_or(true);
        let system_profile = profile(ENV_INSPECT_SYSTEM_PROFILE)?.unwrap_or(true);
        let device_profile = profile(ENV_INSPECT_DEVICE_PROFILE)?.unwrap_or(true);
        let max_events_per_nc = match get(ENV_INSPECT_MAX_EVENTS_PER_NC) {
            Some(v) => match v.trim().replace('_', "").parse::<u64>() {
                Ok(n) if (neuron_datastore::MIN_EVENTS_PER_NC..=neuron_datastore::MAX_EVENTS_PER_NC).contains(&n) => n,
                _ => {
                    return Err(bad(
                        ENV_INSPECT_MAX_EVENTS_PER_NC,
                        &v,
                        &format!(
                            "expected a whole number of events from {} to {}",
                            neuron_datastore::MIN_EVENTS_PER_NC,
                            neuron_datastore::MAX_EVENTS_PER_NC
                        ),
                    ));
                }
            },
            None if asked_to_inspect == Some(true) => neuron_datastore::INSPECT_MAX_EVENTS_PER_NC,
            None => neuron_datastore::DEFAULT_MAX_EVENTS_PER_NC,
        };
        let filter_cores = match get(ENV_INSPECT_EVENT_FILTER_NC) {
            Some(v) => Some(
                CoreSet::parse(&v, core_count)
                    .map_err(|e| bad(ENV_INSPECT_EVENT_FILTER_NC, &v, &format!("{e} on {instance_type}")))?,
            ),
            None => None,
        };
        let event_types = match get(ENV_INSPECT_EVENT_FILTER_TYPE) {
            Some(v) => neuron_datastore::parse_event_filter(&v)
                .map_err(|e| bad(ENV_INSPECT_EVENT_FILTER_TYPE, &v, &e.to_string()))?,
            None => neuron_datastore::ALL_SYSTEM_EVENTS,
        };
        let discard = match get(ENV_TRACE_DISCARD) {
            Some(v) => parse_bool(&v).ok_or_else(|| bad(ENV_TRACE_DISCARD, &v, "use true or false"))?,
            None => false,
        };
        let inspect = InspectConfig {
            system: enabled && system_profile,
            device: enabled && device_profile,
            cores: filter_cores,
            event_types,
            max_events_per_nc,
            discard,
        };

        Ok(Config {
            process_tag,
            inspect,
            inspect_output_dir: PathBuf::from(
                get(ENV_INSPECT_OUTPUT_DIR).unwrap_or_else(|| DEFAULT_INSPECT_OUTPUT_DIR.into()),
            ),
            datastore_dir: get(ENV_DATASTORE_DIR).map_or_else(default_dir, PathBuf::from),
            instance_type,
            cores,
            log_level,
            exec_timeout,
            validate_hash,
            numerical_errors,
            lock_dir: lock_dir(get(ENV_LOCK_DIR)),
            host_threads,
            fusion,
            flight_record,
            bf16_products,
            faults,
            xu_queue,
            collectives_algorithm,
            launch: launch::launch_from(&get, &mut warnings)?,
            root_comm: launch::root_from(&get)?,
            job_auth,
            warnings,
        })
    }
}

/// How the processes of a job prove to each other that they belong to it, before they
/// exchange anything (see `collectives/world/auth.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobAuth {
    /// No secret given: only processes of this user on this host join (the default).
    ThisUser,
    /// A secret every process of the job holds (`NEURON_VIRT_JOB_SECRET` or
    /// `NEURON_VIRT_JOB_SECRET_FILE`): processes on any host that prove they hold it.
    Secret(JobSecret),
    /// No secret, and `NEURON_VIRT_TRUSTED_NETWORK=1`: anyone who reaches the job's
    /// ports and speaks its protocol joins.
    TrustedNetwork,
}

/// Where the job's secret is.
#[derive(Clone, PartialEq, Eq)]
pub enum JobSecret {
    Value(String),
    /// A file private to its user; read when the job starts.
    File(PathBuf),
}

impl std::fmt::Debug for JobSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JobSecret::Value(_) => f.write_str("Value(<hidden>)"),
            JobSecret::File(path) => f.debug_tuple("File").field(path).finish(),
        }
    }
}

fn parse_bool(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// `$NEURON_VIRT_LOCK_DIR`, else `/dev/shm/neuron-virt-cores`: one directory for every
/// user of the host, as NeuronCores are one set for the whole host.
fn lock_dir(configured: Option<String>) -> PathBuf {
    match configured {
        Some(dir) => PathBuf::from(dir),
        None if std::path::Path::new("/dev/shm").is_dir() => PathBuf::from("/dev/shm/neuron-virt-cores"),
        None => std::env::temp_dir().join("neuron-virt-cores"),
    }
}

/// Whether `tag` can label a process in every tool: at most [`MAX_PROCESS_TAG_LEN`]
/// bytes, and no control characters (which would drive a terminal or break a line).
pub fn check_process_tag(tag: &str) -> Result<(), String> {
    if tag.len() > MAX_PROCESS_TAG_LEN {
        return Err(format!("a tag is at most {MAX_PROCESS_TAG_LEN} bytes; this one is {}", tag.len()));
    }
    if let Some(c) = tag.chars().find(|c| c.is_control()) {
        return Err(format!("a tag is printable text; this one holds the control character {:?}", c));
    }
    Ok(())
}

/// `value` quoted for a message, cut to its first 64 characters when longer.
fn shown(value: &str) -> String {
    match value.char_indices().nth(64) {
        Some((end, _)) => format!("{:?}… ({} bytes)", &value[..end], value.len()),
        None => format!("{value:?}"),
    }
}

/// The most host threads `NEURON_VIRT_HOST_THREADS` may ask for: threads beyond the
/// host's CPUs add no compute, and thousands of them take seconds to start.
pub const MAX_HOST_THREADS: usize = 256;

fn default_host_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn config(vars: &[(&str, &str)]) -> NrtResult<Config> {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Config::from_lookup(|name| map.get(name).cloned())
    }

    #[test]
    fn defaults_follow_the_neuron_runtime() {
        let c = config(&[]).expect("empty environment is valid");
        assert_eq!(c.instance_type, InstanceType::Trn1_2xlarge);
        assert_eq!(c.cores, CoreRequest::All);
        assert_eq!(c.log_level, LogLevel::Error);
        assert_eq!(c.exec_timeout, DEFAULT_EXEC_TIMEOUT);
        assert!(c.fusion, "element-wise fusion is on by default");
        assert!(!config(&[(ENV_FUSION, "false")]).expect("valid").fusion);
        assert!(c.flight_record && !config(&[(ENV_FLIGHT_RECORD, "false")]).expect("valid").flight_record);
        assert_eq!(c.bf16_products, None, "measured by default");
        assert_eq!(config(&[(ENV_BF16_PRODUCTS, "f32")]).expect("valid").bf16_products, Some(ProductKernel::F32));
    }

    #[test]
    fn the_job_is_this_users_on_this_host_unless_given_a_secret_or_told_the_network_is_trusted() {
        assert_eq!(config(&[]).expect("valid").job_auth, JobAuth::ThisUser);
        let secret = "0123456789abcdef0123";
        assert_eq!(
            config(&[(ENV_JOB_SECRET, secret)]).expect("valid").job_auth,
            JobAuth::Secret(JobSecret::Value(secret.into()))
        );
        assert_eq!(
            config(&[(ENV_JOB_SECRET_FILE, "/run/job.key"), (ENV_TRUSTED_NETWORK, "1")]).expect("valid").job_auth,
            JobAuth::Secret(JobSecret::File("/run/job.key".into())),
            "a secret wins over trust"
        );
        assert_eq!(config(&[(ENV_TRUSTED_NETWORK, "yes")]).expect("valid").job_auth, JobAuth::TrustedNetwork);
        let short = config(&[(ENV_JOB_SECRET, "hunter2")]).expect_err("too short").message;
        assert!(short.contains("at least 16") && !short.contains("hunter2"), "{short}");
        let both = config(&[(ENV_JOB_SECRET, secret), (ENV_JOB_SECRET_FILE, "/k")]).expect_err("ambiguous").message;
        assert!(both.contains("both set"), "{both}");
        assert!(!format!("{:?}", JobSecret::Value(secret.into())).contains(secret), "never in a debug print");
    }

    #[test]
    fn every_variable_is_parsed() {
        let c = config(&[
            (ENV_INSTANCE_TYPE, "trn2.48xlarge"),
            (ENV_VISIBLE_CORES, "3-6"),
            (ENV_LOG_LEVEL, "debug"),
            (ENV_EXEC_TIMEOUT, "0.5"),
            (ENV_VALIDATE_HASH, "true"),
            (ENV_NUMERICAL_ERRORS_VERBOSITY, "critical"),
            (ENV_LOCK_DIR, "/tmp/x"),
            (ENV_HOST_THREADS, "3"),
        ])
        .expect("valid");
        assert_eq!(c.cores, CoreRequest::Visible(CoreSet::range(3, 6)));
        assert_eq!(c.log_level, LogLevel::Debug);
        assert_eq!(c.exec_timeout, Duration::from_millis(500));
        assert!(c.validate_hash);
        assert_eq!(c.numerical_errors, NumericalErrorsVerbosity::Critical);
        assert_eq!(c.lock_dir, PathBuf::from("/tmp/x"));
        assert_eq!(c.host_threads, 3);
        assert_eq!(config(&[(ENV_NUM_CORES, "2")]).map(|c| c.cores), Ok(CoreRequest::Count(2)));
        let faults =
            config(&[(ENV_FAULT_INJECT, "nc_ue:core=1:after=10,ecc_corrected:rate=0.5")]).expect("valid").faults;
        assert_eq!(
            faults.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["nc_ue:core=1:after=10", "ecc_corrected:rate=0.5"]
        );
        assert!(config(&[]).expect("valid").faults.is_empty(), "no faults by default");
    }

    #[test]
    fn bad_values_name_the_variable_and_the_value() {
        for (name, value) in [
            (ENV_VISIBLE_CORES, ""),
            (ENV_VISIBLE_CORES, " "),
            (ENV_VISIBLE_CORES, "2"),
            (ENV_VISIBLE_CORES, "x"),
            (ENV_NUM_CORES, "0"),
            (ENV_NUM_CORES, "3"),
            (ENV_LOG_LEVEL, "LOUD"),
            (ENV_EXEC_TIMEOUT, "-1"),
            (ENV_EXEC_TIMEOUT, "1e20"),
            (ENV_VISIBLE_CORES, "0-4294967295"),
            (ENV_VALIDATE_HASH, "maybe"),
            (ENV_FUSION, "sometimes"),
            (ENV_BF16_PRODUCTS, "fp8"),
            (ENV_COLLECTIVES_ALGORITHM, "tree"),
            (ENV_INSTANCE_TYPE, "p4d"),
            (ENV_INSPECT_ENABLE, "yes please"),
            (ENV_INSPECT_SYSTEM_PROFILE, "2"),
            (ENV_INSPECT_DEVICE_PROFILE, "always"),
            (ENV_INSPECT_MAX_EVENTS_PER_NC, "8"),
            (ENV_INSPECT_MAX_EVENTS_PER_NC, "lots"),
            (ENV_INSPECT_EVENT_FILTER_NC, "5"),
            (ENV_INSPECT_EVENT_FILTER_TYPE, "nrt_execute,bogus_event"),
            (ENV_TRACE_DISCARD, "sometimes"),
            (ENV_FAULT_INJECT, "hbm_ue:core=7"),
            (ENV_FAULT_INJECT, "meteor_strike"),
            (ENV_XU_COMPUTE_MAX_QUEUED, "0"),
            (ENV_HOST_THREADS, "0"),
            (ENV_HOST_THREADS, "4096"),
        ] {
            let err = config(&[(name, value)]).expect_err("must be rejected");
            assert!(err.message.contains(name), "{err}");
            assert!(err.message.contains(value), "{err}");
        }
    }

    #[test]
    fn inspect_switches_decide_what_is_recorded() {
        let c = config(&[]).expect("valid");
        assert!(c.inspect.system && c.inspect.device, "rings are on by default");
        assert_eq!(c.inspect.max_events_per_nc, neuron_datastore::DEFAULT_MAX_EVENTS_PER_NC);
        let c = config(&[(ENV_INSPECT_ENABLE, "0")]).expect("valid");
        assert!(!c.inspect.system && !c.inspect.device);
        let c = config(&[(ENV_INSPECT_ENABLE, "1")]).expect("valid");
        assert_eq!(c.inspect.max_events_per_nc, neuron_datastore::INSPECT_MAX_EVENTS_PER_NC, "asking for a profile");
        let c = config(&[(ENV_INSPECT_ENABLE, "1"), (ENV_INSPECT_MAX_EVENTS_PER_NC, "4096")]).expect("valid");
        assert_eq!(c.inspect.max_events_per_nc, 4096, "the size asked for wins");
        let c = config(&[(ENV_INSPECT_DEVICE_PROFILE, "0"), (ENV_INSPECT_SYSTEM_PROFILE, "session")]).expect("valid");
        assert!(c.inspect.system && !c.inspect.device);
        let c = config(&[
            (ENV_INSPECT_EVENT_FILTER_NC, "1"),
            (ENV_INSPECT_EVENT_FILTER_TYPE, "hardware,^timestamp_sync_point,nrt_load"),
            (ENV_INSPECT_MAX_EVENTS_PER_NC, "1000"),
            (ENV_PROCESS_TAG, "trainer"),
        ])
        .expect("valid");
        assert_eq!(c.inspect.cores, Some(CoreSet::range(1, 1)));
        let types = c.inspect.event_types;
        assert!(types & neuron_datastore::event::EventType::NcExecRunning.bit() != 0);
        assert!(types & neuron_datastore::event::EventType::NrtLoad.bit() != 0);
        assert!(types & neuron_datastore::event::EventType::TimestampSyncPoint.bit() == 0);
        assert!(types & neuron_datastore::event::EventType::NrtExecute.bit() == 0);
        assert_eq!(c.inspect.max_events_per_nc, 1000);
        assert_eq!(c.process_tag.as_deref(), Some("trainer"));
        let only_exclusions = config(&[(ENV_INSPECT_EVENT_FILTER_TYPE, "^software")]).expect("valid");
        assert_eq!(
            only_exclusions.inspect.event_types,
            neuron_datastore::event::EventType::ALL.iter().filter(|t| t.is_hardware()).fold(0, |m, t| m | t.bit())
        );
        let long_tag = "x".repeat(100_000);
        let err = config(&[(ENV_PROCESS_TAG, &long_tag)]).expect_err("too long");
        assert!(err.message.len() < 300 && err.message.contains("100000 bytes"), "{}", err.message);
        let err = config(&[(ENV_PROCESS_TAG, "job\u{1b}[2J\0")]).expect_err("control characters");
        assert!(err.message.contains("control character"), "{}", err.message);
        assert!(config(&[(ENV_PROCESS_TAG, &"x".repeat(MAX_PROCESS_TAG_LEN))]).is_ok());
    }
}
