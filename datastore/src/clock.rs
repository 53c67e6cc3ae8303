//! Host ticks, their calibration to nanoseconds, and the per-core device clocks.
//!
//! Emitting an event reads the clock, so the read must be cheap: on x86-64 hosts whose
//! kernel itself uses the TSC (`constant_tsc`, clocksource `tsc`) a tick is one
//! `rdtsc`; elsewhere it is `CLOCK_MONOTONIC` in nanoseconds. Records store raw ticks
//! and readers convert them with the calibration pairs in the datastore header (the
//! first taken at init, the latest refreshed by the heartbeat), so no conversion runs
//! on the hot path and long runs do not drift.
//!
//! Each virtual NeuronCore has its own device clock: nanoseconds since the runtime
//! started, from an oscillator whose rate is off by a fixed few tens of ppm per core,
//! as real oscillators are. Device timestamps are therefore not host timestamps;
//! `timestamp_sync_point` events pair the two after each execution.

use std::sync::OnceLock;
use std::time::Duration;

/// How ticks are read on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TickSource {
    /// `CLOCK_MONOTONIC`, in nanoseconds.
    MonotonicNs,
    /// The x86 time-stamp counter.
    Tsc,
}

static SOURCE: OnceLock<TickSource> = OnceLock::new();

/// The tick source, decided once per process.
pub fn tick_source() -> TickSource {
    *SOURCE.get_or_init(|| {
        let kernel_uses_tsc =
            std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
                .is_ok_and(|s| s.trim() == "tsc");
        if cfg!(target_arch = "x86_64") && kernel_uses_tsc { TickSource::Tsc } else { TickSource::MonotonicNs }
    })
}

/// Reads the tick counter.
#[inline]
pub fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    if matches!(SOURCE.get(), Some(TickSource::Tsc)) {
        // SAFETY: `rdtsc` has no preconditions on x86-64.
        return unsafe { core::arch::x86_64::_rdtsc() };
    }
    monotonic_ns()
}

/// Nanoseconds added to this process's host clock, for tests of the alignment of ranks'
/// clocks only: such a process's clock disagrees with its host's, as another host's may.
pub const ENV_TEST_CLOCK_SHIFT_NS: &str = "NEURON_VIRT_TEST_CLOCK_SHIFT_NS";

static SHIFT_NS: OnceLock<i64> = OnceLock::new();

/// `CLOCK_MONOTONIC` in nanoseconds: one time base for every process on the host
/// (shifted by [`ENV_TEST_CLOCK_SHIFT_NS`] in a test that sets it).
pub fn monotonic_ns() -> u64 {
    let shift = *SHIFT_NS
        .get_or_init(|| std::env::var(ENV_TEST_CLOCK_SHIFT_NS).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(0));
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| (t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64).wrapping_add_signed(shift))
        .unwrap_or(0)
}

/// `CLOCK_REALTIME` in nanoseconds since the Unix epoch.
pub fn realtime_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// A (ticks, monotonic ns) pair read as close together as possible.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CalibrationPoint {
    pub ticks: u64,
    pub ns: u64,
}

impl CalibrationPoint {
    /// The pair whose clock read was bracketed most tightly by two tick reads, of a
    /// few tries: a thread preempted between the reads would otherwise pair ticks and
    /// nanoseconds that are milliseconds apart, and a rate measured over a short
    /// window from such a pair is off by tens of percent.
    pub fn now() -> CalibrationPoint {
        let mut best: Option<(u64, CalibrationPoint)> = None;
        for _ in 0..CALIBRATION_TRIES {
            let before = ticks();
            let ns = monotonic_ns();
            let after = ticks().max(before);
            let point = CalibrationPoint { ticks: before + (after - before) / 2, ns };
            if best.is_none_or(|(width, _)| after - before < width) {
                best = Some((after - before, point));
            }
        }
        best.map_or(CalibrationPoint { ticks: ticks(), ns: monotonic_ns() }, |(_, point)| point)
    }
}

/// Reads per calibration point; the tightest is kept.
const CALIBRATION_TRIES: usize = 5;

/// Converts ticks to nanoseconds between two calibration points (extrapolating
/// outside them).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TickConverter {
    pub first: CalibrationPoint,
    pub ns_per_tick: f64,
}

impl TickConverter {
    /// From two points, or from `fallback_ns_per_tick` when they are too close.
    pub fn new(first: CalibrationPoint, latest: CalibrationPoint, fallback_ns_per_tick: f64) -> TickConverter {
        let ns_per_tick = if latest.ticks > first.ticks + 1_000_000 && latest.ns > first.ns {
            (latest.ns - first.ns) as f64 / (latest.ticks - first.ticks) as f64
        } else {
            fallback_ns_per_tick
        };
        TickConverter { first, ns_per_tick }
    }

    /// Monotonic nanoseconds at `ticks`.
    pub fn to_ns(&self, ticks: u64) -> u64 {
        let delta = ticks as i128 - self.first.ticks as i128;
        (self.first.ns as i128 + (delta as f64 * self.ns_per_tick) as i128).max(0) as u64
    }

    /// A tick count as a duration.
    pub fn duration(&self, ticks: u64) -> Duration {
        Duration::from_nanos((ticks as f64 * self.ns_per_tick) as u64)
    }
}

/// Measures the tick rate over `window`, busy-waiting (init only).
pub fn measure(window: Duration) -> (CalibrationPoint, f64) {
    tick_source();
    let first = CalibrationPoint::now();
    if tick_source() == TickSource::MonotonicNs {
        return (first, 1.0);
    }
    let window_ns = window.as_nanos() as u64;
    let mut last = first;
    while last.ns - first.ns < window_ns {
        last = CalibrationPoint::now();
    }
    (first, (last.ns - first.ns) as f64 / last.ticks.saturating_sub(first.ticks).max(1) as f64)
}

/// One NeuronCore's device clock: `((ticks − epoch) · mult) >> 32` nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceClock {
    pub epoch_ticks: u64,
    /// Device nanoseconds per tick, 32.32 fixed point.
    pub mult_fp32: u64,
}

impl DeviceClock {
    /// The clock of core `core`: its rate is the host's, off by a fixed −40 to +40 ppm.
    pub fn for_core(core: u32, epoch_ticks: u64, ns_per_tick: f64) -> DeviceClock {
        let skew_ppm = f64::from((core * 7 % 11) as i32 - 5) * 8.0;
        let rate = ns_per_tick * (1.0 + skew_ppm * 1e-6);
        DeviceClock { epoch_ticks, mult_fp32: (rate * 4_294_967_296.0) as u64 }
    }

    /// Device nanoseconds at host `ticks`.
    #[inline]
    pub fn at(&self, ticks: u64) -> u64 {
        ((u128::from(ticks.saturating_sub(self.epoch_ticks)) * u128::from(self.mult_fp32)) >> 32) as u64
    }
}

/// `850 ns`, `12.3 µs`, `1.8 ms`, `5.0 s`.
pub fn format_ns(ns: u64) -> String {
    match ns {
        0..1_000 => format!("{ns} ns"),
        1_000..1_000_000 => format!("{:.1} µs", ns as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.1} ms", ns as f64 / 1e6),
        _ => format!("{:.1} s", ns as f64 / 1e9),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_clocks_differ_from_the_host_and_from_each_other() {
        let (first, ns_per_tick) = measure(Duration::from_millis(2));
        let c0 = DeviceClock::for_core(0, first.ticks, ns_per_tick);
        let c1 = DeviceClock::for_core(1, first.ticks, ns_per_tick);
        let later = first.ticks + (1_000_000_000.0 / ns_per_tick) as u64;
        let (d0, d1) = (c0.at(later), c1.at(later));
        assert!(d0.abs_diff(1_000_000_000) < 100_000, "{d0}");
        assert_ne!(d0, d1);
    }

    #[test]
    fn ticks_convert_back_to_monotonic_time() {
        let (first, ns_per_tick) = measure(Duration::from_millis(2));
        std::thread::sleep(Duration::from_millis(20));
        let latest = CalibrationPoint::now();
        let converter = TickConverter::new(first, latest, ns_per_tick);
        let t = ticks();
        let now = monotonic_ns();
        assert!(converter.to_ns(t).abs_diff(now) < 1_000_000, "{} vs {now}", converter.to_ns(t));
    }
}
