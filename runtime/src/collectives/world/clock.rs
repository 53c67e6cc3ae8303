//! One clock for the job: each process measures how far its host clock is from the
//! root's, so that the ranks' traces can be put on one time line.
//!
//! Over its connection to the root, a process sends [`PROBES`] probes in a row, at
//! bootstrap and then every [`PERIOD`]; the root stamps each on arrival and on reply
//! with its own clock, and the process stamps it on return. Of a round, the probe of
//! least delay (the round trip less the root's time) gives the offset, as NTP does: the
//! root's clock minus this one's, at the midpoint of the trip. The true offset lies
//! within half that delay of it, however unevenly the delay splits between the two ways,
//! which is the stated uncertainty. Orderings between ranks closer than it are ties.

use std::time::Duration;

/// Probes in one round.
pub(crate) const PROBES: usize = 8;
/// Time between two rounds.
pub(crate) const PERIOD: Duration = Duration::from_secs(10);
/// How long a probe may take before the round goes on without it.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// This process's clock against the root's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockOffset {
    /// The root's clock minus this process's, in nanoseconds: a time `t` of this
    /// process is `t + offset_ns` on the root's clock.
    pub offset_ns: i64,
    /// The most the offset may be off by, in nanoseconds (half the probe's delay).
    pub uncertainty_ns: u64,
    /// When it was measured, on this process's clock (`CLOCK_MONOTONIC` ns).
    pub measured_at_ns: u64,
}

/// One probe's four times: sent and back on this process's clock, received and
/// replied on the root's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Probe {
    pub(crate) sent: u64,
    pub(crate) received: u64,
    pub(crate) replied: u64,
    pub(crate) back: u64,
}

impl Probe {
    /// The round trip less the root's time.
    fn delay(&self) -> u64 {
        self.back.saturating_sub(self.sent).saturating_sub(self.replied.saturating_sub(self.received))
    }

    fn offset(&self) -> i64 {
        let there = i128::from(self.received) - i128::from(self.sent);
        let back = i128::from(self.replied) - i128::from(self.back);
        ((there + back) / 2).clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
    }
}

/// The offset by the probe of least delay; `None` without probes.
pub(crate) fn estimate(probes: &[Probe]) -> Option<ClockOffset> {
    let best = probes.iter().min_by_key(|p| p.delay())?;
    Some(ClockOffset { offset_ns: best.offset(), uncertainty_ns: best.delay().div_ceil(2), measured_at_ns: best.back })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_of_least_delay_gives_the_offset_within_half_its_delay() {
        // The root's clock is 1 s ahead; trips of 40 µs each way, the root 10 µs.
        let probe = |sent: u64, there: u64, back: u64| Probe {
            sent,
            received: sent + there + 1_000_000_000,
            replied: sent + there + 10_000 + 1_000_000_000,
            back: sent + there + 10_000 + back,
        };
        let even = probe(5_000, 40_000, 40_000);
        assert_eq!(even.delay(), 80_000);
        assert_eq!(even.offset(), 1_000_000_000);
        // A slow way back: the estimate is off, by less than half the delay.
        let uneven = probe(9_000, 40_000, 400_000);
        let offset = estimate(&[uneven]).expect("a probe");
        assert!((offset.offset_ns - 1_000_000_000).unsigned_abs() <= offset.uncertainty_ns, "{offset:?}");
        // Of both, the even one (least delay) counts.
        let both = estimate(&[uneven, even]).expect("probes");
        assert_eq!((both.offset_ns, both.uncertainty_ns, both.measured_at_ns), (1_000_000_000, 40_000, even.back));
        assert_eq!(estimate(&[]), None);
        // Behind, not ahead.
        let behind =
            Probe { sent: 2_000_000_000, received: 1_000_000_100, replied: 1_000_000_200, back: 2_000_000_300 };
        assert_eq!(estimate(&[behind]).expect("a probe").offset_ns, -1_000_000_000);
    }
}
