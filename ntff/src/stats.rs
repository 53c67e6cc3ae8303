//! Latency statistics over many executions, from an HdrHistogram, and number
//! formatting for people.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Latencies recorded in nanoseconds, from 1 ns to one hour, 3 significant digits.
#[derive(Debug, Clone)]
pub struct LatencyHistogram(Histogram<u64>);

/// The percentiles the tools print, in seconds, and how many executions they are over.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LatencySummary {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
    pub count: u64,
}

/// Executions a p90 needs before it is printed (with fewer it is the maximum or close
/// to it, and says nothing of the tail).
pub const P90_MIN_EXECUTIONS: u64 = 10;
/// Executions a p99 needs before it is printed.
pub const P99_MIN_EXECUTIONS: u64 = 100;

impl LatencySummary {
    /// The line people read: `p50 1.087 ms  p90 1.2 ms  p99 –  max 1.3 ms over 50
    /// executions`, each percentile shown only over enough executions, and a single
    /// execution as itself: `1.087 ms, one execution (no percentiles)`.
    pub fn describe(&self, format: impl Fn(f64) -> String) -> String {
        if self.count <= 1 {
            return format!("{}, one execution (no percentiles)", format(self.max));
        }
        let shown = |value: f64, needed: u64| if self.count >= needed { format(value) } else { "–".into() };
        let mut line = format!(
            "p50 {}  p90 {}  p99 {}  max {} over {} executions",
            format(self.p50),
            shown(self.p90, P90_MIN_EXECUTIONS),
            shown(self.p99, P99_MIN_EXECUTIONS),
            format(self.max),
            thousands(self.count)
        );
        if self.count < P99_MIN_EXECUTIONS {
            line.push_str(&format!(" (p90 needs {P90_MIN_EXECUTIONS}, p99 {P99_MIN_EXECUTIONS})"));
        }
        line
    }
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram(
            Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("static histogram bounds are valid"),
        )
    }
}

impl LatencyHistogram {
    pub fn record(&mut self, latency: Duration) {
        let nanos = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX).max(1);
        self.0.saturating_record(nanos);
    }

    pub fn merge(&mut self, other: &LatencyHistogram) {
        // Both histograms share the same bounds, so adding cannot fail.
        let _ = self.0.add(&other.0);
    }

    pub fn clear(&mut self) {
        self.0.reset();
    }

    /// Percentiles in seconds, or `None` when nothing was recorded.
    pub fn summary(&self) -> Option<LatencySummary> {
        if self.0.is_empty() {
            return None;
        }
        let at = |q: f64| self.0.value_at_quantile(q) as f64 / 1e9;
        Some(LatencySummary {
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            max: self.0.max() as f64 / 1e9,
            count: self.0.len(),
        })
    }
}

/// Formats seconds with a unit that keeps three significant digits: `45.1 µs`.
pub fn format_seconds(seconds: f64) -> String {
    if seconds >= 1.0 {
        format!("{seconds:.3} s")
    } else if seconds >= 1e-3 {
        format!("{:.3} ms", seconds * 1e3)
    } else {
        format!("{:.1} µs", seconds * 1e6)
    }
}

/// Formats a count with thousands separators: `12,345,678`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Formats a rate with an SI prefix: `1.23 G`.
pub fn si(value: f64) -> String {
    const PREFIXES: [(f64, &str); 4] = [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")];
    for (scale, prefix) in PREFIXES {
        if value >= scale {
            return format!("{:.2} {prefix}", value / scale);
        }
    }
    format!("{value:.1} ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_printed_only_over_enough_executions() {
        let mut h = LatencyHistogram::default();
        h.record(Duration::from_micros(1087));
        let one = h.summary().expect("one");
        assert_eq!(one.describe(format_seconds), "1.087 ms, one execution (no percentiles)");
        for k in 1..50 {
            h.record(Duration::from_micros(1000 + k));
        }
        let fifty = h.summary().expect("fifty").describe(format_seconds);
        assert!(fifty.contains("p99 –") && !fifty.contains("p90 –") && fifty.contains("over 50 executions"), "{fifty}");
        for k in 0..100 {
            h.record(Duration::from_micros(900 + k));
        }
        let many = h.summary().expect("many").describe(format_seconds);
        assert!(!many.contains('–') && many.ends_with("over 150 executions"), "{many}");
    }

    #[test]
    fn percentiles_come_from_the_recorded_latencies() {
        let mut h = LatencyHistogram::default();
        for micros in 1..=100u64 {
            h.record(Duration::from_micros(micros));
        }
        let s = h.summary().expect("recorded");
        assert!((s.p50 - 50e-6).abs() < 0.1e-6, "{s:?}");
        assert!((s.p99 - 99e-6).abs() < 0.1e-6, "{s:?}");
        assert!((s.max - 100e-6).abs() < 0.1e-6, "{s:?}");
        assert_eq!(LatencyHistogram::default().summary(), None);
        assert_eq!(format_seconds(45.12e-6), "45.1 µs");
        assert_eq!(format_seconds(0.0123), "12.300 ms");
    }

    #[test]
    fn numbers_format_for_people() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(1234), "1,234");
        assert_eq!(thousands(12_345_678), "12,345,678");
        assert_eq!(si(2.5e9), "2.50 G");
        assert_eq!(si(12.0), "12.0 ");
    }
}
