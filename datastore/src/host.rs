//! Host CPU and memory figures from `/proc`, for `neuron-monitor`'s `vcpu_usage`,
//! `memory_info` and `neuron_runtime_vcpu_usage` groups: cumulative counters read at
//! two times, and the usage between them.

use std::collections::BTreeMap;
use std::path::Path;

/// Cumulative time one CPU (or all of them) spent in each state, in clock ticks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTimes {
    pub user: u64,
    pub nice: u64,
    pub system: u64,
    pub idle: u64,
    pub io_wait: u64,
    pub irq: u64,
    pub soft_irq: u64,
    /// Time the hypervisor gave to other guests: counted in the total, in no state.
    pub steal: u64,
}

impl CpuTimes {
    pub fn total(&self) -> u64 {
        self.user + self.nice + self.system + self.idle + self.io_wait + self.irq + self.soft_irq + self.steal
    }

    /// The share of each state between `earlier` and `self`, in percent.
    pub fn usage_since(&self, earlier: &CpuTimes) -> CpuUsage {
        let total = self.total().saturating_sub(earlier.total());
        let percent = |now: u64, before: u64| {
            if total == 0 { 0.0 } else { now.saturating_sub(before) as f64 / total as f64 * 100.0 }
        };
        CpuUsage {
            user: percent(self.user, earlier.user),
            nice: percent(self.nice, earlier.nice),
            system: percent(self.system, earlier.system),
            idle: percent(self.idle, earlier.idle),
            io_wait: percent(self.io_wait, earlier.io_wait),
            irq: percent(self.irq, earlier.irq),
            soft_irq: percent(self.soft_irq, earlier.soft_irq),
        }
    }
}

/// CPU usage over an interval, in percent of the time.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct CpuUsage {
    pub user: f64,
    pub nice: f64,
    pub system: f64,
    pub idle: f64,
    pub io_wait: f64,
    pub irq: f64,
    pub soft_irq: f64,
}

/// `/proc/stat`: all CPUs together, each CPU, and context switches since boot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CpuStat {
    pub all: CpuTimes,
    pub cpus: BTreeMap<u32, CpuTimes>,
    pub context_switches: u64,
}

impl CpuStat {
    pub fn read() -> std::io::Result<CpuStat> {
        Ok(CpuStat::parse(&std::fs::read_to_string("/proc/stat")?))
    }

    /// Parses the text of `/proc/stat`; lines it does not know are skipped.
    pub fn parse(text: &str) -> CpuStat {
        let mut stat = CpuStat::default();
        for line in text.lines() {
            let mut words = line.split_ascii_whitespace();
            let Some(name) = words.next() else { continue };
            let numbers: Vec<u64> = words.map_while(|w| w.parse().ok()).collect();
            if name == "ctxt" {
                stat.context_switches = numbers.first().copied().unwrap_or(0);
            } else if let Some(which) = name.strip_prefix("cpu") {
                let at = |k: usize| numbers.get(k).copied().unwrap_or(0);
                let times = CpuTimes {
                    user: at(0),
                    nice: at(1),
                    system: at(2),
                    idle: at(3),
                    io_wait: at(4),
                    irq: at(5),
                    soft_irq: at(6),
                    steal: at(7),
                };
                match which {
                    "" => stat.all = times,
                    n => {
                        if let Ok(cpu) = n.parse() {
                            stat.cpus.insert(cpu, times);
                        }
                    }
                }
            }
        }
        stat
    }
}

/// `/proc/meminfo`, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct MemoryInfo {
    pub memory_total_bytes: u64,
    /// Total minus what the kernel says is available (free, and caches it can drop).
    pub memory_used_bytes: u64,
    pub swap_total_bytes: u64,
    pub swap_used_bytes: u64,
}

impl MemoryInfo {
    pub fn read() -> std::io::Result<MemoryInfo> {
        Ok(MemoryInfo::parse(&std::fs::read_to_string("/proc/meminfo")?))
    }

    pub fn parse(text: &str) -> MemoryInfo {
        let mut fields = BTreeMap::new();
        for line in text.lines() {
            let Some((key, rest)) = line.split_once(':') else { continue };
            let mut words = rest.split_ascii_whitespace();
            let Some(Ok(value)) = words.next().map(str::parse::<u64>) else { continue };
            let bytes = if words.next() == Some("kB") { value * 1024 } else { value };
            fields.insert(key.trim(), bytes);
        }
        let get = |k: &str| fields.get(k).copied().unwrap_or(0);
        // Kernels before 3.14 have no MemAvailable: free + buffers + page cache then.
        let available = fields.get("MemAvailable").copied().unwrap_or(get("MemFree") + get("Buffers") + get("Cached"));
        MemoryInfo {
            memory_total_bytes: get("MemTotal"),
            memory_used_bytes: get("MemTotal").saturating_sub(available),
            swap_total_bytes: get("SwapTotal"),
            swap_used_bytes: get("SwapTotal").saturating_sub(get("SwapFree")),
        }
    }
}

/// A process's cumulative CPU time, in clock ticks (`/proc/PID/stat`, or the runtime's
/// own reading in its datastore), and when it was read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessCpu {
    pub user: u64,
    pub system: u64,
    /// `CLOCK_MONOTONIC` ns when read (0: not known).
    pub at_ns: u64,
}

impl ProcessCpu {
    /// The CPU time in a status read at `at_ns`.
    pub fn of(status: &crate::ProcessStatus, at_ns: u64) -> ProcessCpu {
        ProcessCpu { user: status.user_ticks, system: status.system_ticks, at_ns }
    }

    pub fn read(pid: u32) -> std::io::Result<ProcessCpu> {
        let at_ns = crate::clock::monotonic_ns();
        let text = std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("stat"))?;
        let cpu =
            ProcessCpu::parse(&text).ok_or_else(|| std::io::Error::other(format!("unexpected /proc/{pid}/stat")))?;
        Ok(ProcessCpu { at_ns, ..cpu })
    }

    /// Seconds between `earlier`'s reading and this one, when both say when they were
    /// read (CPU times read a little apart from the rest of a sample are divided by
    /// their own interval); `Some(0.0)` for the same reading again (the runtime reads
    /// its own every 250 ms: a tool looking more often can meet one twice, and has no
    /// new figure then, rather than a zero).
    pub fn seconds_since(&self, earlier: &ProcessCpu) -> Option<f64> {
        (earlier.at_ns > 0 && self.at_ns >= earlier.at_ns).then(|| (self.at_ns - earlier.at_ns) as f64 / 1e9)
    }

    /// Parses `/proc/PID/stat`: utime and stime are fields 14 and 15, counted after the
    /// command name, which is in parentheses and may hold spaces and parentheses.
    pub fn parse(text: &str) -> Option<ProcessCpu> {
        let after_name = &text[text.rfind(')')? + 1..];
        let fields: Vec<&str> = after_name.split_ascii_whitespace().collect();
        // `after_name` starts at field 3 (the state).
        Some(ProcessCpu { user: fields.get(11)?.parse().ok()?, system: fields.get(12)?.parse().ok()?, at_ns: 0 })
    }

    /// The process's user and system time between `earlier` and `self`, in percent of
    /// all `cpus` over `ticks` clock ticks of wall time.
    pub fn usage_since(&self, earlier: &ProcessCpu, ticks: f64, cpus: usize) -> (f64, f64) {
        let capacity = ticks * cpus.max(1) as f64;
        let percent = |now: u64, before: u64| {
            if capacity <= 0.0 { 0.0 } else { now.saturating_sub(before) as f64 / capacity * 100.0 }
        };
        (percent(self.user, earlier.user), percent(self.system, earlier.system))
    }
}

/// A process's resident memory (`VmRSS` of `/proc/PID/status`), in bytes.
pub fn resident_bytes(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("status")).ok()?;
    parse_resident_bytes(&text)
}

/// `VmRSS` of the text of `/proc/PID/status`, in bytes.
pub fn parse_resident_bytes(status: &str) -> Option<u64> {
    let kib = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.split_whitespace().next()?.parse::<u64>().ok()?;
    Some(kib * 1024)
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`).
pub fn clock_ticks_per_second() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().map_or(100, |t| t as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resident_memory_is_vm_rss() {
        let status = "Name:\tpython3\nVmPeak:\t  300000 kB\nVmRSS:\t  131072 kB\nThreads:\t4\n";
        assert_eq!(parse_resident_bytes(status), Some(128 * 1024 * 1024));
        assert_eq!(parse_resident_bytes("Name:\tkthreadd\n"), None, "kernel threads have none");
        assert!(resident_bytes(std::process::id()).is_some_and(|b| b > 0));
    }

    const STAT: &str = "cpu  100 10 50 800 20 5 15 0 0 0\n\
                        cpu0 60 5 30 380 10 3 12 0 0 0\n\
                        cpu1 40 5 20 420 10 2 3 0 0 0\n\
                        intr 12345 1 2\n\
                        ctxt 987654\n\
                        btime 1700000000\n";

    #[test]
    fn cpu_usage_is_the_share_of_each_state_between_two_reads() {
        let before = CpuStat::parse(STAT);
        assert_eq!(before.cpus.len(), 2);
        assert_eq!(before.context_switches, 987_654);
        let later = "cpu  130 10 60 850 20 5 25 0 0 0\ncpu0 80 5 35 400 10 3 17 0 0 0\ncpu1 50 5 25 450 10 2 8 0 0 0\nctxt 990000\n";
        let after = CpuStat::parse(later);
        // 100 ticks passed in all: 30 user, 10 system, 50 idle, 10 soft irq.
        let usage = after.all.usage_since(&before.all);
        assert_eq!((usage.user, usage.system, usage.idle, usage.soft_irq), (30.0, 10.0, 50.0, 10.0));
        assert_eq!(after.context_switches - before.context_switches, 2_346);
        let cpu1 = after.cpus[&1].usage_since(&before.cpus[&1]);
        assert_eq!((cpu1.user, cpu1.system, cpu1.idle), (20.0, 10.0, 60.0));
    }

    #[test]
    fn memory_used_is_total_minus_available() {
        let text = "MemTotal:       24684544 kB\nMemFree:         1000000 kB\nMemAvailable:   20000000 kB\n\
                    Buffers:          100 kB\nCached:   3000 kB\nSwapTotal:       2000000 kB\nSwapFree:        1500000 kB\n";
        let info = MemoryInfo::parse(text);
        assert_eq!(info.memory_total_bytes, 24_684_544 * 1024);
        assert_eq!(info.memory_used_bytes, 4_684_544 * 1024);
        assert_eq!(info.swap_used_bytes, 500_000 * 1024);
        let old_kernel = MemoryInfo::parse("MemTotal: 1000 kB\nMemFree: 100 kB\nBuffers: 50 kB\nCached: 250 kB\n");
        assert_eq!(old_kernel.memory_used_bytes, 600 * 1024);
    }

    #[test]
    fn process_times_are_read_past_a_command_name_with_spaces_and_parentheses() {
        let text = "4242 (neuron (bench) x) S 1 4242 4242 0 -1 4194560 1234 0 0 0 777 333 0 0 20 0 9 0 100 0 0";
        assert_eq!(ProcessCpu::parse(text), Some(ProcessCpu { user: 777, system: 333, at_ns: 0 }));
        assert_eq!(ProcessCpu::parse("garbage"), None);
        let (user, system) = ProcessCpu { user: 877, system: 383, at_ns: 0 }.usage_since(
            &ProcessCpu { user: 777, system: 333, at_ns: 0 },
            100.0,
            2,
        );
        assert_eq!((user, system), (50.0, 25.0));
    }

    #[test]
    fn this_host_reads() {
        let stat = CpuStat::read().expect("/proc/stat");
        assert!(!stat.cpus.is_empty() && stat.all.total() > 0);
        assert!(MemoryInfo::read().expect("/proc/meminfo").memory_total_bytes > 0);
        // This process's CPU time grows while it computes: the fields read are the right ones.
        let before = ProcessCpu::read(std::process::id()).expect("own stat");
        let started = std::time::Instant::now();
        let mut x = 1u64;
        let after = loop {
            for _ in 0..1_000_000 {
                x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1));
            }
            let now = ProcessCpu::read(std::process::id()).expect("own stat");
            if now.user + now.system > before.user + before.system || started.elapsed().as_secs() > 10 {
                break now;
            }
        };
        assert!(after.user + after.system > before.user + before.system, "{before:?} {after:?}");
        assert!(clock_ticks_per_second() > 0);
    }
}
