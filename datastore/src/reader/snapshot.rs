//! Counter snapshots of a datastore and the deltas between two of them: executions,
//! errors, busy time, FLOPs, DMA bytes and memory per core, and latency percentiles
//! read off the histograms' buckets.

use crate::histogram;
use crate::kinds::{DeviceCategory, ErrorClass, ExecOutcome, HostCategory};

/// Executions by outcome, in `neuron-monitor`'s `execution_summary` order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExecutionCounts(pub [u64; 6]);

impl ExecutionCounts {
    pub fn get(&self, outcome: ExecOutcome) -> u64 {
        self.0[outcome as usize]
    }

    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }
}

/// Errors by class, in `neuron-monitor`'s `error_summary` order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ErrorCounts(pub [u64; 6]);

impl ErrorCounts {
    pub fn get(&self, class: ErrorClass) -> u64 {
        self.0[class as usize]
    }
}

/// One core's counters at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreSnapshot {
    pub core: u32,
    pub busy_ns: u64,
    pub executions: ExecutionCounts,
    pub errors: ErrorCounts,
    pub flops: u64,
    /// `DmaQueueType` order: input, output, weights, instructions.
    pub dma_bytes: [u64; 4],
    pub instructions: u64,
    /// `DeviceCategory` order.
    pub device_memory: [u64; 5],
    pub model_switches: u64,
    pub numerical_error_values: u64,
    /// Collective operations the core's ranks took part in, and the ns spent in them.
    pub collectives: u64,
    pub collectives_ns: u64,
    /// The core's rank in the communicator it last joined, and that communicator's
    /// rank count (0 when none).
    pub rank: Option<u32>,
    pub ranks: u32,
    pub device_latency: Vec<u64>,
    pub total_latency: Vec<u64>,
    /// The last execution of each latency range and error class.
    pub exemplars: crate::exemplar::CoreExemplars,
}

impl CoreSnapshot {
    pub fn device_memory(&self, category: DeviceCategory) -> u64 {
        self.device_memory[category as usize]
    }
}

/// Events produced into one ring and refused by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingStats {
    /// `None` for the process ring (events tied to no core).
    pub core: Option<u32>,
    pub device: bool,
    /// Events produced into the ring (a device record may hold several).
    pub produced: u64,
    /// Events refused in discard mode.
    pub dropped: u64,
}

/// All counters at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Host `CLOCK_MONOTONIC` when taken.
    pub taken_ns: u64,
    pub cores: Vec<CoreSnapshot>,
    /// `HostCategory` order.
    pub host_memory: [u64; 4],
    /// Per device: mem corrected, mem uncorrected, sram corrected, sram uncorrected.
    pub ecc: Vec<[u64; 4]>,
    pub strings_dropped: u64,
    /// Models whose instructions did not fit the instruction table (their device
    /// events take a record each).
    pub instruction_tables_refused: u64,
    pub model_slots_overflowed: u64,
    pub rings: Vec<RingStats>,
}

impl Snapshot {
    pub fn host_memory(&self, category: HostCategory) -> u64 {
        self.host_memory[category as usize]
    }

    pub fn core(&self, core: u32) -> Option<&CoreSnapshot> {
        self.cores.iter().find(|c| c.core == core)
    }
}

/// Latency percentiles in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatencyPercentiles {
    pub p0: f64,
    pub p1: f64,
    pub p25: f64,
    pub p50: f64,
    pub p75: f64,
    pub p99: f64,
    pub p100: f64,
    pub count: u64,
}

/// One core's activity between two snapshots.
#[derive(Debug, Clone, PartialEq)]
pub struct CoreDelta {
    pub core: u32,
    pub utilization_percent: f64,
    pub flops_per_second: f64,
    pub executions: ExecutionCounts,
    pub errors: ErrorCounts,
    pub dma_bytes: [u64; 4],
    pub instructions: u64,
    /// `None` when nothing completed in the interval.
    pub device_latency: Option<LatencyPercentiles>,
    pub total_latency: Option<LatencyPercentiles>,
}

/// What happened between two snapshots.
#[derive(Debug, Clone, PartialEq)]
pub struct Delta {
    pub seconds: f64,
    pub cores: Vec<CoreDelta>,
    pub ecc: Vec<[u64; 4]>,
}

impl Delta {
    /// Activity from `earlier` to `later` (counters are monotonic; memory is a level,
    /// read it from the snapshot).
    pub fn between(earlier: &Snapshot, later: &Snapshot) -> Delta {
        let seconds = later.taken_ns.saturating_sub(earlier.taken_ns) as f64 / 1e9;
        let cores = later
            .cores
            .iter()
            .map(|now| {
                let before = earlier.core(now.core);
                let sub = |f: fn(&CoreSnapshot) -> u64| f(now).saturating_sub(before.map_or(0, f));
                let sub6 = |a: [u64; 6], b: Option<[u64; 6]>| {
                    let mut out = [0u64; 6];
                    for (k, o) in out.iter_mut().enumerate() {
                        *o = a[k].saturating_sub(b.map_or(0, |b| b[k]));
                    }
                    out
                };
                let mut dma_bytes = [0u64; 4];
                for (k, d) in dma_bytes.iter_mut().enumerate() {
                    *d = now.dma_bytes[k].saturating_sub(before.map_or(0, |b| b.dma_bytes[k]));
                }
                let per_second = |n: u64| if seconds > 0.0 { n as f64 / seconds } else { 0.0 };
                CoreDelta {
                    core: now.core,
                    utilization_percent: if seconds > 0.0 {
                        (sub(|c| c.busy_ns) as f64 / 1e9 / seconds * 100.0).min(100.0)
                    } else {
                        0.0
                    },
                    flops_per_second: per_second(sub(|c| c.flops)),
                    executions: ExecutionCounts(sub6(now.executions.0, before.map(|b| b.executions.0))),
                    errors: ErrorCounts(sub6(now.errors.0, before.map(|b| b.errors.0))),
                    dma_bytes,
                    instructions: sub(|c| c.instructions),
                    device_latency: percentiles(&now.device_latency, before.map(|b| b.device_latency.as_slice())),
                    total_latency: percentiles(&now.total_latency, before.map(|b| b.total_latency.as_slice())),
                }
            })
            .collect();
        let ecc = later
            .ecc
            .iter()
            .enumerate()
            .map(|(d, now)| {
                let before = earlier.ecc.get(d).copied().unwrap_or_default();
                [0, 1, 2, 3].map(|k| now[k].saturating_sub(before[k]))
            })
            .collect();
        Delta { seconds, cores, ecc }
    }
}

/// Percentiles of the latencies of every core's executions from `earlier` to `later`:
/// the cores' histograms added up. `device`: the device latency, else the total
/// (host call to return) latency. `None` when nothing completed in the interval.
pub fn latency_of_all_cores(earlier: &Snapshot, later: &Snapshot, device: bool) -> Option<LatencyPercentiles> {
    fn buckets(c: &CoreSnapshot, device: bool) -> &[u64] {
        if device { &c.device_latency } else { &c.total_latency }
    }
    let (mut now, mut before) = (Vec::new(), Vec::new());
    for core in &later.cores {
        add_buckets(&mut now, buckets(core, device));
        if let Some(earlier) = earlier.core(core.core) {
            add_buckets(&mut before, buckets(earlier, device));
        }
    }
    percentiles(&now, Some(&before))
}

fn add_buckets(sum: &mut Vec<u64>, buckets: &[u64]) {
    if sum.len() < buckets.len() {
        sum.resize(buckets.len(), 0);
    }
    for (s, &n) in sum.iter_mut().zip(buckets) {
        *s += n;
    }
}

/// Latencies above this (an hour) count as this in percentiles.
const MAX_LATENCY_NS: u64 = 3_600_000_000_000;

/// Percentiles of the bucket counts gained from `before` to `now`, read straight off the
/// buckets: a percentile is the midpoint of the bucket holding its rank (buckets are at
/// most about 3% wide). `None` when nothing was gained.
fn percentiles(now: &[u64], before: Option<&[u64]>) -> Option<LatencyPercentiles> {
    percentiles_with(now, before, histogram::bucket_bounds)
}

/// [`percentiles`] over buckets whose bounds `bounds` gives.
pub(super) fn percentiles_with(
    now: &[u64],
    before: Option<&[u64]>,
    bounds: fn(usize) -> (u64, u64),
) -> Option<LatencyPercentiles> {
    let gained = |bucket: usize| now[bucket].saturating_sub(before.and_then(|b| b.get(bucket).copied()).unwrap_or(0));
    let count: u64 = (0..now.len()).map(gained).sum();
    if count == 0 {
        return None;
    }
    let seconds = |bucket: usize| {
        let (low, high) = bounds(bucket);
        (low + (high - low) / 2).min(MAX_LATENCY_NS) as f64 / 1e9
    };
    // The ranks wanted, in increasing order: the value at quantile q is the one with
    // rank ceil(q × count), at least 1.
    const QUANTILES: [f64; 7] = [0.0, 0.01, 0.25, 0.50, 0.75, 0.99, 1.0];
    let ranks = QUANTILES.map(|q| ((q * count as f64).ceil() as u64).clamp(1, count));
    let mut values = [0.0; 7];
    let (mut next, mut seen) = (0, 0u64);
    for bucket in 0..now.len() {
        seen += gained(bucket);
        while next < ranks.len() && seen >= ranks[next] {
            values[next] = seconds(bucket);
            next += 1;
        }
        if next == ranks.len() {
            break;
        }
    }
    let [p0, p1, p25, p50, p75, p99, p100] = values;
    Some(LatencyPercentiles { p0, p1, p25, p50, p75, p99, p100, count })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_read_off_the_buckets_gained() {
        let mut now = vec![0u64; histogram::BUCKETS];
        // 1 µs, 2 µs, …, 100 µs, once each, and an older 5 s one already counted before.
        for us in 1..=100u64 {
            now[histogram::bucket_of(us * 1000)] += 1;
        }
        let mut before = vec![0u64; histogram::BUCKETS];
        now[histogram::bucket_of(5_000_000_000)] += 1;
        before[histogram::bucket_of(5_000_000_000)] += 1;
        let p = percentiles(&now, Some(&before)).expect("gained");
        assert_eq!(p.count, 100);
        let near = |value: f64, us: f64| (value - us * 1e-6).abs() <= us * 1e-6 * 0.035;
        for (value, us) in
            [(p.p0, 1.0), (p.p1, 1.0), (p.p25, 25.0), (p.p50, 50.0), (p.p75, 75.0), (p.p99, 99.0), (p.p100, 100.0)]
        {
            assert!(near(value, us), "{value} for {us} µs in {p:?}");
        }
        assert_eq!(percentiles(&before, Some(&before)), None, "nothing gained");
    }
}
