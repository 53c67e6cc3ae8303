//! Moving device-clock times onto the host clock through a core's sync points.

use crate::SyncPoint;

/// A core's sync points, by device time, with the place of the latest lookup: device
/// times come nearly in order, so most lookups look at one or two points.
#[derive(Debug, Clone, Default)]
pub struct SyncClock {
    points: Vec<SyncPoint>,
    at: std::cell::Cell<usize>,
}

impl SyncClock {
    /// The clock of a core's sync points, in any order.
    pub fn new(mut points: Vec<SyncPoint>) -> SyncClock {
        points.sort_by_key(|p| p.device_ns);
        points.dedup_by_key(|p| p.device_ns);
        SyncClock { points, at: std::cell::Cell::new(0) }
    }

    /// Host time of device time `t`, through the first sync point at or after it (the
    /// one its execution took), else the last before it.
    pub fn to_host(&self, t: u64) -> Option<u64> {
        let points = &self.points;
        let fits = |k: usize| k < points.len() && points[k].device_ns >= t && (k == 0 || points[k - 1].device_ns < t);
        let guess = self.at.get();
        let at = if fits(guess) {
            guess
        } else if fits(guess + 1) {
            guess + 1
        } else {
            points.partition_point(|p| p.device_ns < t)
        };
        self.at.set(at);
        let point = points.get(at).or_else(|| points.last())?;
        Some((t as i128 + point.host_ns as i128 - point.device_ns as i128).clamp(0, u64::MAX as i128) as u64)
    }
    /// Whether the core had no sync point: its device times cannot be placed.
    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// The same clock with every sync point's host time moved by `f` (onto another
    /// clock, such as a job's root clock).
    pub fn map_host(self, f: impl Fn(u64) -> u64) -> SyncClock {
        let points = self.points.into_iter().map(|p| SyncPoint { host_ns: f(p.host_ns), ..p }).collect();
        SyncClock { points, at: std::cell::Cell::new(0) }
    }
}

/// The name of the runtime's event that records a process's clock offset to its job's
/// root, and its arguments.
const CLOCK_OFFSET: &str = "clock_offset";
const OFFSET_NS: &str = "offset_ns";
const UNCERTAINTY_NS: &str = "uncertainty_ns";

/// A process's host clock against its job's root clock (rank 0's process), from the
/// `clock_offset` events its runtime records at bootstrap and then periodically (the
/// root's clock minus this process's, with how far off it may be): a host time moves by
/// the offset measured last at or before it (the first, before any). A profile without
/// them (rank 0's, a process of no job) is on the root's clock already.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RootClock {
    /// (host time, offset, uncertainty), by host time.
    anchors: Vec<(u64, i64, u64)>,
}

impl RootClock {
    /// From (host time, offset, uncertainty) anchors, in any order.
    pub fn new(mut anchors: Vec<(u64, i64, u64)>) -> RootClock {
        anchors.sort_by_key(|a| a.0);
        RootClock { anchors }
    }

    /// The anchors of `file`'s `clock_offset` events (on its host stream; a chunk that
    /// cannot be read adds none).
    pub fn of(file: &crate::NtffFile) -> RootClock {
        let Some(name) = file.find_string(CLOCK_OFFSET) else { return RootClock::default() };
        let (offset_key, uncertainty_key) = (file.find_string(OFFSET_NS), file.find_string(UNCERTAINTY_NS));
        let arg = |e: &crate::SystemEvent, key: Option<crate::Sym>| {
            e.args.iter().find(|a| Some(a.key) == key).and_then(|a| match a.value {
                crate::ArgValue::I64(v) => Some(v),
                crate::ArgValue::U64(v) => i64::try_from(v).ok(),
                crate::ArgValue::Str(_) => None,
            })
        };
        let mut anchors = Vec::new();
        for info in file.chunks().iter().filter(|c| c.core.is_none() && c.system_events > 0) {
            let Ok(chunk) = file.read_chunk(info) else { continue };
            for e in chunk.system.iter().filter(|e| e.name == name && e.clock == crate::Clock::Host) {
                if let Some(offset) = arg(e, offset_key) {
                    let uncertainty = arg(e, uncertainty_key).unwrap_or(0).unsigned_abs();
                    anchors.push((e.timestamp_ns, offset, uncertainty));
                }
            }
        }
        RootClock::new(anchors)
    }

    /// `t` of this process's host clock on the root's.
    pub fn to_root(&self, t: u64) -> u64 {
        let at = self.anchors.partition_point(|a| a.0 <= t).saturating_sub(1);
        self.anchors.get(at).map_or(t, |a| t.saturating_add_signed(a.1))
    }

    /// How many offsets were measured (none: the clock is taken as the root's).
    pub fn anchors(&self) -> usize {
        self.anchors.len()
    }

    /// The offset measured last, and the largest uncertainty of any; `None` without
    /// anchors.
    pub fn latest(&self) -> Option<(i64, u64)> {
        let last = self.anchors.last()?;
        Some((last.1, self.anchors.iter().map(|a| a.2).max().unwrap_or(0)))
    }
}
