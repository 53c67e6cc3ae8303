//! The in-process trace API (`nrt_sys_trace_*`): configure, start, stop, fetch.
//!
//! A session reads the same rings that other processes tail, from its own cursors.
//! Starting one turns on recording of what it asks for (on top of the
//! `NEURON_RT_INSPECT_*` configuration); stopping restores the configuration and
//! keeps what was recorded until it is fetched. Fetched events are consumed: a second
//! fetch returns only newer ones.

use std::sync::Mutex;

use serde::Serialize;

use crate::event::{EventType, SystemEvent};
use crate::layout::DEFAULT_MAX_EVENTS_PER_NC;
use crate::reader::{Tail, TailStart, TraceEvent, converter_of};
use crate::tracer::{ALL_SYSTEM_EVENTS, Tracer};

/// `data_version` of the fetch JSON.
pub const FETCH_DATA_VERSION: u32 = 2;

/// What a trace session records and returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysTraceConfig {
    /// At most this many of the newest events per core are returned by a fetch; older
    /// ones are counted in [`SysTraceFetch::lost`].
    pub max_events_per_nc: u64,
    /// Only these cores (`None`: all, and events tied to no core).
    pub cores: Option<Vec<u32>>,
    /// A mask of `EventType::bit`s.
    pub event_types: u64,
}

impl Default for SysTraceConfig {
    fn default() -> SysTraceConfig {
        SysTraceConfig { max_events_per_nc: DEFAULT_MAX_EVENTS_PER_NC, cores: None, event_types: ALL_SYSTEM_EVENTS }
    }
}

/// The events one fetch returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysTraceFetch {
    pub events: Vec<SystemEvent>,
    /// Events recorded but not returned: overwritten before the fetch, or beyond
    /// `max_events_per_nc`.
    pub lost: u64,
}

impl SysTraceFetch {
    /// `{"events":[…],"data_version":2}`.
    pub fn to_json(&self) -> String {
        #[derive(Serialize)]
        struct Shape<'a> {
            events: &'a [SystemEvent],
            data_version: u32,
        }
        serde_json::to_string(&Shape { events: &self.events, data_version: FETCH_DATA_VERSION })
            .unwrap_or_else(|e| unreachable!("event JSON cannot fail: {e}"))
    }
}

/// The names `list event types` returns.
pub fn event_type_names() -> Vec<&'static str> {
    EventType::ALL.iter().map(|t| t.name()).collect()
}

/// Why a trace session call was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    #[error("a system trace session is already running; stop it first")]
    AlreadyRunning,
    #[error("nc{0} is not held by this runtime")]
    CoreNotHeld(u32),
    #[error("no system trace session is running; start one first")]
    NotRunning,
    #[error("no system trace session was started")]
    NeverStarted,
}

#[derive(Debug)]
struct Session {
    tail: Tail,
    config: SysTraceConfig,
    running: bool,
}

/// A runtime's in-process trace session (`nrt_sys_trace_*`): at most one at a time,
/// over the rings of the runtime's [`Tracer`].
#[derive(Debug, Default)]
pub struct TraceSession(Mutex<Option<Session>>);

impl TraceSession {
    pub fn start(&self, tracer: &Tracer, config: &SysTraceConfig) -> Result<(), SessionError> {
        let mut session = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if session.as_ref().is_some_and(|s| s.running) {
            return Err(SessionError::AlreadyRunning);
        }
        let held = tracer.store.held_cores();
        if let Some(cores) = &config.cores
            && let Some(bad) = cores.iter().find(|c| !held.contains(c))
        {
            return Err(SessionError::CoreNotHeld(*bad));
        }
        tracer.set_session_recording(Some((config.event_types, config.cores.as_deref())));
        let tail = Tail::new(
            &tracer.store.region,
            &tracer.store.layout,
            held,
            TailStart::Now,
            config.cores.as_deref(),
            config.event_types,
            false,
        );
        *session = Some(Session { tail, config: config.clone(), running: true });
        Ok(())
    }

    pub fn stop(&self, tracer: &Tracer) -> Result<(), SessionError> {
        let mut session = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match session.as_mut() {
            Some(s) if s.running => {
                s.running = false;
                tracer.set_session_recording(None);
                Ok(())
            }
            _ => Err(SessionError::NotRunning),
        }
    }

    pub fn fetch(&self, tracer: &Tracer) -> Result<SysTraceFetch, SessionError> {
        let mut guard = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let session = guard.as_mut().ok_or(SessionError::NeverStarted)?;
        let lost_before = session.tail.lost();
        let mut raw = Vec::new();
        let converter = converter_of(&tracer.store.region, tracer.ns_per_tick);
        session.tail.poll_region(
            &tracer.store.region,
            tracer.store.strings(),
            &converter,
            usize::MAX,
            !session.running,
            &mut raw,
        );
        for (ring, next) in session.tail.positions() {
            if let Some(position) = tracer.position_of(ring.base) {
                tracer.consumed(position).store(next, std::sync::atomic::Ordering::Release);
            }
        }
        let mut events: Vec<SystemEvent> = raw
            .into_iter()
            .filter_map(|e| match e {
                TraceEvent::System(e) => Some(e),
                TraceEvent::Device(_) => None,
            })
            .collect();
        let mut lost = session.tail.lost() - lost_before;
        let max = session.config.max_events_per_nc;
        let mut cores: Vec<Option<u32>> = events.iter().map(|e| e.nc_idx).collect();
        cores.sort_unstable();
        cores.dedup();
        for core in cores {
            let count = events.iter().filter(|e| e.nc_idx == core).count() as u64;
            if count > max {
                let mut excess = count - max;
                lost += excess;
                events.retain(|e| {
                    if e.nc_idx == core && excess > 0 {
                        excess -= 1;
                        false
                    } else {
                        true
                    }
                });
            }
        }
        events.sort_by_key(|e| (e.nc_idx, e.id));
        Ok(SysTraceFetch { events, lost })
    }
}
