//! The process's one runtime, as `nrt_init` starts it and `nrt_close` closes it, and
//! the translation of the C API's core numbers.
//!
//! Calls before `nrt_init` fail with `NRT_UNINITIALIZED`. After `nrt_close` the closed
//! runtime stays here, so calls fail with `NRT_CLOSED` (the Rust runtime's own check),
//! until `nrt_init` starts a new one. Each call clones the runtime handle under a read
//! lock held for no longer than the clone.

use std::sync::{Once, RwLock};

use neuron_runtime::config::{CoreRequest, DEFAULT_LOG_LEVEL};
use neuron_runtime::{Config, NrtError, NrtResult, NrtStatus, Runtime};

static RUNTIME: RwLock<Option<Runtime>> = RwLock::new(None);
static LOGGING: Once = Once::new();

/// Installs the stderr log subscriber at `NEURON_RT_LOG_LEVEL` (ERROR by default), once,
/// unless the program already has one.
pub(crate) fn init_logging() {
    LOGGING.call_once(|| {
        let level = Config::from_env().map_or(DEFAULT_LOG_LEVEL, |c| c.log_level);
        let _ = tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_max_level(level.as_tracing())
            .with_target(false)
            .with_ansi(false)
            .try_init();
    });
}

/// The runtime `nrt_init` started.
pub(crate) fn runtime() -> NrtResult<Runtime> {
    RUNTIME
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .ok_or_else(|| NrtError::new(NrtStatus::Uninitialized, "the runtime is not initialised; call nrt_init first"))
}

/// Starts a runtime from the environment, unless one is running.
pub(crate) fn start() -> NrtResult<()> {
    let mut slot = RUNTIME.write().unwrap_or_else(|e| e.into_inner());
    if let Some(running) = slot.as_ref()
        && running.cores().is_ok()
    {
        return Err(NrtError::new(NrtStatus::Invalid, "the runtime is already initialised; call nrt_close first"));
    }
    *slot = Some(Runtime::start(Config::from_env()?)?);
    Ok(())
}

/// Closes the running runtime, if any.
pub(crate) fn close() -> NrtResult<()> {
    match RUNTIME.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
        Some(runtime) => runtime.close(),
        None => Err(NrtError::new(NrtStatus::Uninitialized, "the runtime is not initialised; nothing to close")),
    }
}

/// The NeuronCores of the instance, and how many this process holds or (before
/// `nrt_init`) would hold.
pub(crate) fn core_counts() -> NrtResult<(u32, u32)> {
    if let Ok(runtime) = runtime()
        && let Ok(cores) = runtime.cores()
    {
        return Ok((runtime.topology().core_count(), cores.len() as u32));
    }
    let config = Config::from_env()?;
    let total = config.instance_type.topology().core_count();
    let visible = match &config.cores {
        CoreRequest::All => total,
        CoreRequest::Visible(cores) => cores.len() as u32,
        CoreRequest::Count(count) => *count,
    };
    Ok((total, visible))
}

/// The instance core of `vnc`, counted from the first core the process holds.
pub(crate) fn core_of(runtime: &Runtime, vnc: i64, argument: &str) -> NrtResult<u32> {
    let cores = runtime.cores()?;
    usize::try_from(vnc).ok().and_then(|v| cores.cores().get(v).copied()).ok_or_else(|| {
        NrtError::new(
            NrtStatus::Invalid,
            format!(
                "argument `{argument}` is {vnc}, but this process holds {} NeuronCores ({cores}): use 0 to {}",
                cores.len(),
                cores.len().saturating_sub(1)
            ),
        )
    })
}

/// The `vnc` number of instance core `core` in this process.
pub(crate) fn vnc_of(runtime: &Runtime, core: u32) -> NrtResult<u32> {
    let cores = runtime.cores()?;
    Ok(cores.cores().iter().position(|&c| c == core).unwrap_or_default() as u32)
}
