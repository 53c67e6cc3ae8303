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
}
