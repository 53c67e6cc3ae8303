//! The in-process trace API (`nrt_sys_trace_*`): configure, start, stop, fetch.
//!
//! A session reads the same rings that other processes tail, from its own cursors.
//! Starting one turns on recording of what it asks for (on top of the
//! `NEURON_RT_INSPECT_*` configuration); stopping restores the configuration and
//! keeps what was recorded until it is fetched. Fetched events are consumed: a second
//! fetch returns only newer ones. A fetch may ask for fewer events ([`FetchOptions`]):
//! those it leaves stay for the next fetch, up to the session's `max_events_per_nc`
//! per core (older ones beyond that are counted lost).

use std::sync::Mutex;

use serde::Serialize;

use crate::event::{EventType, SystemEvent};
use crate::layout::INSPECT_MAX_EVENTS_PER_NC;
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
        SysTraceConfig { max_events_per_nc: INSPECT_MAX_EVENTS_PER_NC, cores: None, event_types: ALL_SYSTEM_EVENTS }
    }
}

/// Which of the waiting events one fetch returns (`nrt_sys_trace_fetch_options_*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchOptions {
    /// At most this many events per core, the oldest first; the others wait for the
    /// next fetch.
    pub max_events_per_nc: u64,
    /// Only the events of this core; the others wait for a later fetch.
    pub core: Option<u32>,
}

impl Default for FetchOptions {
    fn default() -> FetchOptions {
        FetchOptions { max_events_per_nc: u64::MAX, core: None }
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

/// Drops the oldest events of each core beyond `max` from `events` (sorted by core);
/// returns how many.
fn keep_newest_per_core(events: &mut Vec<SystemEvent>, max: u64) -> u64 {
    let mut dropped = 0;
    let mut start = 0;
    while start < events.len() {
        let core = events[start].nc_idx;
        let end = start + events[start..].iter().take_while(|e| e.nc_idx == core).count();
        let excess = ((end - start) as u64).saturating_sub(max) as usize;
        events.drain(start..start + excess);
        dropped += excess as u64;
        start = end - excess;
    }
    dropped
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
    /// Read from the rings but not fetched yet, by (core, id).
    waiting: Vec<SystemEvent>,
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
        *session = Some(Session { tail, config: config.clone(), running: true, waiting: Vec::new() });
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

    pub fn fetch(&self, tracer: &Tracer, options: &FetchOptions) -> Result<SysTraceFetch, SessionError> {
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
        session.waiting.extend(raw.into_iter().filter_map(|e| match e {
            TraceEvent::System(e) => Some(e),
            TraceEvent::Device(_) => None,
        }));
        session.waiting.sort_by_key(|e| (e.nc_idx, e.id));
        let mut lost = session.tail.lost() - lost_before;
        lost += keep_newest_per_core(&mut session.waiting, session.config.max_events_per_nc);
        let mut taken_of_core: Option<(Option<u32>, u64)> = None;
        let mut events = Vec::new();
        session.waiting.retain(|e| {
            if options.core.is_some_and(|core| e.nc_idx != Some(core)) {
                return true;
            }
            let taken = match &mut taken_of_core {
                Some((core, taken)) if *core == e.nc_idx => taken,
                slot => &mut slot.insert((e.nc_idx, 0)).1,
            };
            if *taken >= options.max_events_per_nc {
                return true;
            }
            *taken += 1;
            events.push(e.clone());
            false
        });
        Ok(SysTraceFetch { events, lost })
    }
}
