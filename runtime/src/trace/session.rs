//! The in-process trace API (`nrt_sys_trace_*`): configure, start, stop, fetch.
//!
//! A session reads the same rings that other processes tail, from its own cursors.
//! Starting one turns on recording of what it asks for (on top of the
//! `NEURON_RT_INSPECT_*` configuration); stopping restores the configuration and
//! keeps what was recorded until it is fetched. Fetched events are consumed: a second
//! fetch returns only newer ones.

use serde::Serialize;

use super::event::{EventType, SystemEvent};
use super::{ALL_SYSTEM_EVENTS, Tracer};
use crate::datastore::Tail;
use crate::datastore::{TailStart, TraceEvent, converter_of};

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
        SysTraceConfig {
            max_events_per_nc: super::DEFAULT_MAX_EVENTS_PER_NC,
            cores: None,
            event_types: ALL_SYSTEM_EVENTS,
        }
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

#[derive(Debug)]
pub(crate) struct Session {
    tail: Tail,
    config: SysTraceConfig,
    running: bool,
}

impl Tracer {
    pub(crate) fn session_start(&self, config: &SysTraceConfig) -> Result<(), String> {
        let mut session = self.session.lock().unwrap_or_else(|e| e.into_inner());
        if session.as_ref().is_some_and(|s| s.running) {
            return Err("a system trace session is already running; stop it first".into());
        }
        let held = self.store.held_cores();
        if let Some(cores) = &config.cores
            && let Some(bad) = cores.iter().find(|c| !held.contains(c))
        {
            return Err(format!("nc{bad} is not held by this runtime"));
        }
        self.set_session_recording(Some((config.event_types, config.cores.as_deref())));
        let tail = Tail::new(
            &self.store.region,
            &self.store.layout,
            held,
            TailStart::Now,
            config.cores.as_deref(),
            config.event_types,
            false,
        );
        *session = Some(Session { tail, config: config.clone(), running: true });
        Ok(())
    }

    pub(crate) fn session_stop(&self) -> Result<(), String> {
        let mut session = self.session.lock().unwrap_or_else(|e| e.into_inner());
        match session.as_mut() {
            Some(s) if s.running => {
                s.running = false;
                self.set_session_recording(None);
                Ok(())
            }
            _ => Err("no system trace session is running; start one first".into()),
        }
    }

    pub(crate) fn session_fetch(&self) -> Result<SysTraceFetch, String> {
        let mut guard = self.session.lock().unwrap_or_else(|e| e.into_inner());
        let session = guard.as_mut().ok_or("no system trace session was started")?;
        let lost_before = session.tail.lost();
        let mut raw = Vec::new();
        let converter = converter_of(&self.store.region, self.ns_per_tick);
        session.tail.poll_region(
            &self.store.region,
            self.store.strings(),
            &converter,
            usize::MAX,
            !session.running,
            &mut raw,
        );
        for (ring, next) in session.tail.positions() {
            if let Some(position) = self.position_of(ring.base) {
                self.consumed(position).store(next, std::sync::atomic::Ordering::Release);
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
