//! The fault model: the faults `NEURON_RT_FAULT_INJECT` asks for, when each strikes, and
//! which cores an uncorrectable hardware error has left degraded.
//!
//! A rule is `KIND[:core=N][:rank=R][:at=K][:delay=D][:every=K|:after=K|:rate=P]`; a list
//! separates rules with commas. `slow` stalls the core `delay` (100 ms unless given)
//! before it runs the execution, which then completes. The `cc_` kinds strike a rank of a collectives program
//! (all its ranks, or global rank `R` with `rank=R`) in its execution's first
//! collective, or collective `K` (0: the first) with `at=K`: it arrives `delay` late (`cc_delay`, 1 s unless given as `500ms` or
//! `2s`), never arrives (`cc_hang`), exits its process there (`cc_exit`), or calls it
//! with one element more than the others (`cc_mismatch`). Each rule counts the executions that start on each core it applies to (all
//! cores, or `core=N`) and strikes on executions `K, 2K, …` (`every=K`, the default
//! being every execution), on every execution after the first `K` (`after=K`), or on
//! each with probability `P` (`rate=P`, from a generator seeded per rule and core, so
//! that a run repeats exactly). What a fault does is the runtime's business
//! (`runtime.rs`); this module only decides when.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::error::NrtStatus;

/// What can go wrong on a virtual core.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum FaultKind {
    /// A gather or scatter index outside its table.
    Oob,
    /// An uncorrectable error in device memory (HBM); degrades the core.
    HbmUe,
    /// A parity error in the core's on-chip memory (SRAM); degrades the core.
    NcUe,
    /// A DMA engine stops with an unrecoverable error; degrades the core.
    DmaAbort,
    /// The runtime's notification queue overflowed: the execution's completion status is lost.
    NqOverflow,
    /// The core stops making progress; the execution fails once `NEURON_RT_EXEC_TIMEOUT` passes.
    Timeout,
    /// A NaN appears in the first floating-point output.
    Nan,
    /// A corrected device-memory ECC error: counted, the execution goes on.
    EccCorrected,
    /// A corrected on-chip-memory ECC error: counted, the execution goes on.
    SramEccCorrected,
    /// The core stalls `delay` (default 100 ms) before it runs the execution, which then
    /// completes: a slow execution.
    Slow,
    /// The rank arrives late at its execution's first collective (`delay`, default 1 s).
    CcDelay,
    /// The rank never arrives at its execution's first collective; its execution fails
    /// at the deadline, and so do the other ranks', naming it.
    CcHang,
    /// The rank's process exits inside its execution's first collective.
    CcExit,
    /// The rank calls its execution's first collective with one element more.
    CcMismatch,
}

/// How late `cc_delay` makes a rank unless the rule says.
pub const DEFAULT_CC_DELAY: Duration = Duration::from_secs(1);
/// How long `slow` stalls a core unless the rule says.
pub const DEFAULT_SLOW_DELAY: Duration = Duration::from_millis(100);

impl FaultKind {
    pub const ALL: &[FaultKind] = <FaultKind as strum::VariantArray>::VARIANTS;

    /// The spelling in `NEURON_RT_FAULT_INJECT`.
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// The status an execution it strikes fails with, for the faults that fail it at
    /// completion (a timeout fails it too, but by waiting; a NaN only when
    /// `NEURON_RT_NUMERICAL_ERRORS_VERBOSITY=critical`).
    pub fn failure(self) -> Option<NrtStatus> {
        match self {
            FaultKind::Oob => Some(NrtStatus::ExecOob),
            FaultKind::HbmUe => Some(NrtStatus::ExecHwErrHbmUe),
            FaultKind::NcUe => Some(NrtStatus::ExecHwErrNcUe),
            FaultKind::DmaAbort => Some(NrtStatus::ExecHwErrDmaAbort),
            FaultKind::NqOverflow => Some(NrtStatus::ExecSwNqOverflow),
            FaultKind::Timeout
            | FaultKind::Nan
            | FaultKind::EccCorrected
            | FaultKind::SramEccCorrected
            | FaultKind::Slow
            | FaultKind::CcDelay
            | FaultKind::CcHang
            | FaultKind::CcExit
            | FaultKind::CcMismatch => None,
        }
    }

    /// Whether the fault strikes a rank in a collective (the `cc_` kinds).
    pub fn is_rank_fault(self) -> bool {
        matches!(self, FaultKind::CcDelay | FaultKind::CcHang | FaultKind::CcExit | FaultKind::CcMismatch)
    }

    /// Whether the fault leaves the core's execution unit unusable.
    pub fn degrades(self) -> bool {
        matches!(self, FaultKind::HbmUe | FaultKind::NcUe | FaultKind::DmaAbort)
    }

    /// What happened, for messages.
    pub fn description(self) -> &'static str {
        match self {
            FaultKind::Oob => "failed to run scatter/gather (indirect memory copy), due to out-of-bound access",
            FaultKind::HbmUe => "uncorrectable memory error (HBM)",
            FaultKind::NcUe => "uncorrectable parity error in the NeuronCore's on-chip memory",
            FaultKind::DmaAbort => "DMA engine aborted with an unrecoverable error",
            FaultKind::NqOverflow => "software notification queue overflowed; the completion status was lost",
            FaultKind::Timeout => "the NeuronCore stopped making progress",
            FaultKind::Nan => "NaN written to an output",
            FaultKind::EccCorrected => "corrected ECC error in device memory (HBM)",
            FaultKind::SramEccCorrected => "corrected ECC error in on-chip memory (SRAM)",
            FaultKind::Slow => "the NeuronCore stalled before the execution",
            FaultKind::CcDelay => "the rank arrives late at its collective",
            FaultKind::CcHang => "the rank never arrives at its collective",
            FaultKind::CcExit => "the rank's process exits inside its collective",
            FaultKind::CcMismatch => "the rank calls its collective with another element count",
        }
    }
}

impl FromStr for FaultKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        FaultKind::ALL.iter().copied().find(|k| k.name() == s).ok_or_else(|| {
            let kinds: Vec<&str> = FaultKind::ALL.iter().map(|k| k.name()).collect();
            format!("unknown fault `{s}`; the kinds are {}", kinds.join(", "))
        })
    }
}

/// When a rule strikes, counting the executions that start on a core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// On executions `K, 2K, 3K, …` (`every=1`: each one).
    Every(u64),
    /// On every execution after the first `K`.
    After(u64),
    /// On each execution with probability `millionths / 1e6`.
    Rate { millionths: u32 },
}

/// One `NEURON_RT_FAULT_INJECT` rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultRule {
    pub kind: FaultKind,
    /// The global core it applies to; every core when `None`.
    pub core: Option<u32>,
    /// The global rank a `cc_` fault applies to; every rank when `None`.
    pub rank: Option<u32>,
    /// How late `cc_delay` makes the rank, or how long `slow` stalls the core (`None`
    /// for the other kinds).
    pub delay: Option<Duration>,
    /// The collective of the execution a `cc_` fault strikes: its index among the
    /// program's collectives (`#12.1` is collective 1 of unit 12); the first when
    /// `None`.
    pub at: Option<u16>,
    pub trigger: Trigger,
}

impl fmt::Display for FaultRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind.name())?;
        if let Some(core) = self.core {
            write!(f, ":core={core}")?;
        }
        if let Some(rank) = self.rank {
            write!(f, ":rank={rank}")?;
        }
        if let Some(delay) = self.delay {
            write!(f, ":delay={}ms", delay.as_millis())?;
        }
        if let Some(at) = self.at {
            write!(f, ":at={at}")?;
        }
        match self.trigger {
            Trigger::Every(1) => Ok(()),
            Trigger::Every(k) => write!(f, ":every={k}"),
            Trigger::After(k) => write!(f, ":after={k}"),
            Trigger::Rate { millionths } => write!(f, ":rate={}", f64::from(millionths) / 1e6),
        }
    }
}

/// A `NEURON_RT_FAULT_INJECT` value that does not parse: which rule and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidFaultRule(pub String);

/// Parses a `NEURON_RT_FAULT_INJECT` value for an instance of `core_count` cores.
pub fn parse_rules(text: &str, core_count: u32) -> Result<Vec<FaultRule>, InvalidFaultRule> {
    rules(text, core_count).map_err(InvalidFaultRule)
}

fn rules(text: &str, core_count: u32) -> Result<Vec<FaultRule>, String> {
    let mut rules = Vec::new();
    for rule in text.split(',').map(str::trim) {
        if rule.is_empty() {
            return Err("an empty rule; separate rules with single commas".into());
        }
        let mut parts = rule.split(':').map(str::trim);
        let kind: FaultKind = parts.next().unwrap_or_default().parse()?;
        let mut core = None;
        let (mut rank, mut delay, mut at) = (None, None, None);
        let mut trigger = None;
        for option in parts {
            let (key, value) =
                option.split_once('=').ok_or_else(|| format!("`{option}` in `{rule}` is not KEY=VALUE"))?;
            let count = || match value.parse::<u64>() {
                Ok(k) if k > 0 => Ok(k),
                _ => Err(format!("`{key}={value}` in `{rule}`: expected a whole number of executions from 1")),
            };
            let new_trigger = match key {
                "core" => {
                    let n = value.parse::<u32>().ok().filter(|&n| n < core_count).ok_or_else(|| {
                        format!("`core={value}` in `{rule}`: the instance has cores 0 to {}", core_count - 1)
                    })?;
                    if core.replace(n).is_some() {
                        return Err(format!("`{rule}` names a core twice"));
                    }
                    continue;
                }
                "rank" if kind.is_rank_fault() => {
                    let r = value
                        .parse::<u32>()
                        .map_err(|_| format!("`rank={value}` in `{rule}`: expected a global rank (0 or more)"))?;
                    if rank.replace(r).is_some() {
                        return Err(format!("`{rule}` names a rank twice"));
                    }
                    continue;
                }
                "delay" if matches!(kind, FaultKind::CcDelay | FaultKind::Slow) => {
                    delay = Some(parse_delay(value).ok_or_else(|| {
                        format!("`delay={value}` in `{rule}`: expected a duration such as 500ms or 2s")
                    })?);
                    continue;
                }
                "at" if kind.is_rank_fault() => {
                    let k = value.parse::<u16>().map_err(|_| {
                        format!(
                            "`at={value}` in `{rule}`: expected a collective's index in its execution (0: the first)"
                        )
                    })?;
                    if at.replace(k).is_some() {
                        return Err(format!("`{rule}` names a collective twice"));
                    }
                    continue;
                }
                "rank" | "delay" | "at" => {
                    return Err(format!(
                        "`{key}=` in `{rule}` applies to {}",
                        if key != "delay" {
                            "the cc_ faults (cc_delay, cc_hang, cc_exit, cc_mismatch)"
                        } else {
                            "cc_delay and slow"
                        }
                    ));
                }
                "every" => Trigger::Every(count()?),
                "after" => Trigger::After(
                    value
                        .parse::<u64>()
                        .map_err(|_| format!("`after={value}` in `{rule}`: expected a whole number of executions"))?,
                ),
                "rate" => match value.parse::<f64>() {
                    Ok(p) if p > 0.0 && p <= 1.0 && (p * 1e6).round() >= 1.0 => {
                        Trigger::Rate { millionths: (p * 1e6).round() as u32 }
                    }
                    _ => {
                        return Err(format!(
                            "`rate={value}` in `{rule}`: expected a probability from 0.000001 to 1, e.g. 0.01"
                        ));
                    }
                },
                _ => {
                    return Err(format!(
                        "unknown option `{key}` in `{rule}`; use core=N (rank=R, at=K, delay=D for cc_ faults) and one of every=K, after=K, rate=P"
                    ));
                }
            };
            if trigger.replace(new_trigger).is_some() {
                return Err(format!("`{rule}` has more than one of every=K, after=K, rate=P"));
            }
        }
        if kind == FaultKind::CcDelay {
            delay = Some(delay.unwrap_or(DEFAULT_CC_DELAY));
        }
        if kind == FaultKind::Slow {
            delay = Some(delay.unwrap_or(DEFAULT_SLOW_DELAY));
        }
        rules.push(FaultRule { kind, core, rank, delay, at, trigger: trigger.unwrap_or(Trigger::Every(1)) });
    }
    Ok(rules)
}

/// The fault state of a running runtime: the rules, each core's execution count and
/// generators, and the cores left degraded.
#[derive(Debug)]
pub(crate) struct Faults {
    rules: Vec<FaultRule>,
    cores: Mutex<HashMap<u32, CoreFaults>>,
    /// Set once any core is degraded, so that healthy runs check one flag.
    any_degraded: AtomicBool,
}

#[derive(Debug, Default)]
struct CoreFaults {
    executions: u64,
    /// One generator state per rule, seeded on first use.
    generators: Vec<u64>,
    degraded: Option<Degraded>,
}

/// What degraded a core.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Degraded {
    pub(crate) kind: FaultKind,
    pub(crate) exec_id: u64,
}

/// A fault that strikes an execution, and the rule that asked for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Strike {
    pub(crate) kind: FaultKind,
    pub(crate) rule: FaultRule,
}

impl Faults {
    pub(crate) fn new(rules: Vec<FaultRule>) -> Faults {
        Faults { rules, cores: Mutex::new(HashMap::new()), any_degraded: AtomicBool::new(false) }
    }

    /// Counts an execution starting on `core` (as global rank `rank` of a collectives
    /// program, if it is one) and returns the faults that strike it, in rule order, each
    /// kind once.
    pub(crate) fn strike(&self, core: u32, rank: Option<u32>) -> Vec<Strike> {
        if self.rules.is_empty() {
            return Vec::new();
        }
        let mut cores = self.cores.lock().unwrap_or_else(|e| e.into_inner());
        let state = cores.entry(core).or_default();
        state.executions += 1;
        let n = state.executions;
        if state.generators.is_empty() {
            state.generators =
                (0..self.rules.len() as u64).map(|r| 0x9e37_79b9_7f4a_7c15 ^ (r << 32) ^ u64::from(core)).collect();
        }
        let mut strikes: Vec<Strike> = Vec::new();
        for (rule, generator) in self.rules.iter().zip(&mut state.generators) {
            if rule.core.is_some_and(|c| c != core)
                || (rule.kind.is_rank_fault() && (rank.is_none() || rule.rank.is_some_and(|r| Some(r) != rank)))
            {
                continue;
            }
            let hit = match rule.trigger {
                Trigger::Every(k) => n.is_multiple_of(k),
                Trigger::After(k) => n > k,
                Trigger::Rate { millionths } => splitmix64(generator) % 1_000_000 < u64::from(millionths),
            };
            if hit && !strikes.iter().any(|s| s.kind == rule.kind) {
                strikes.push(Strike { kind: rule.kind, rule: *rule });
            }
        }
        strikes
    }

    /// Marks `core` degraded by `kind` (the first degradation is kept).
    pub(crate) fn degrade(&self, core: u32, kind: FaultKind, exec_id: u64) {
        let mut cores = self.cores.lock().unwrap_or_else(|e| e.into_inner());
        cores.entry(core).or_default().degraded.get_or_insert(Degraded { kind, exec_id });
        self.any_degraded.store(true, Ordering::Release);
    }

    /// What degraded `core`, if anything has.
    pub(crate) fn degraded(&self, core: u32) -> Option<Degraded> {
        if !self.any_degraded.load(Ordering::Acquire) {
            return None;
        }
        let cores = self.cores.lock().unwrap_or_else(|e| e.into_inner());
        cores.get(&core).and_then(|c| c.degraded.clone())
    }
}

/// `500ms`, `2s` or `1.5s`.
fn parse_delay(text: &str) -> Option<Duration> {
    let (number, unit) = match text.strip_suffix("ms") {
        Some(number) => (number, 1e-3),
        None => (text.strip_suffix('s')?, 1.0),
    };
    let seconds = number.parse::<f64>().ok()? * unit;
    (0.0..=3600.0).contains(&seconds).then(|| Duration::from_secs_f64(seconds))
}

/// The next value of a SplitMix64 generator.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_kinds_are_spelled_as_configured() {
        let names: Vec<&str> = FaultKind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(
            names,
            [
                "oob",
                "hbm_ue",
                "nc_ue",
                "dma_abort",
                "nq_overflow",
                "timeout",
                "nan",
                "ecc_corrected",
                "sram_ecc_corrected",
                "slow",
                "cc_delay",
                "cc_hang",
                "cc_exit",
                "cc_mismatch"
            ]
        );
    }

    #[test]
    fn rules_parse_with_their_options_and_defaults() {
        let rules = parse_rules("hbm_ue:core=1:after=3, nan:every=2,oob,ecc_corrected:rate=0.25", 2).expect("parses");
        assert_eq!(
            rules,
            [
                FaultRule {
                    kind: FaultKind::HbmUe,
                    core: Some(1),
                    rank: None,
                    delay: None,
                    at: None,
                    trigger: Trigger::After(3)
                },
                FaultRule {
                    kind: FaultKind::Nan,
                    core: None,
                    rank: None,
                    delay: None,
                    at: None,
                    trigger: Trigger::Every(2)
                },
                FaultRule {
                    kind: FaultKind::Oob,
                    core: None,
                    rank: None,
                    delay: None,
                    at: None,
                    trigger: Trigger::Every(1)
                },
                FaultRule {
                    kind: FaultKind::EccCorrected,
                    core: None,
                    rank: None,
                    delay: None,
                    at: None,
                    trigger: Trigger::Rate { millionths: 250_000 }
                },
            ]
        );
        assert_eq!(rules[0].to_string(), "hbm_ue:core=1:after=3");
        assert_eq!(rules[3].to_string(), "ecc_corrected:rate=0.25");
    }

    #[test]
    fn bad_rules_say_what_is_wrong() {
        for (text, expected) in [
            ("hbm", "unknown fault `hbm`; the kinds are oob, hbm_ue, nc_ue"),
            ("oob:core=2", "`core=2` in `oob:core=2`: the instance has cores 0 to 1"),
            ("oob:every=0", "expected a whole number of executions from 1"),
            ("oob:every=2:after=1", "has more than one of every=K, after=K, rate=P"),
            ("oob:rate=1.5", "expected a probability from 0.000001 to 1"),
            ("oob:rate=0", "expected a probability"),
            ("oob:when=3", "unknown option `when`"),
            ("oob:3", "`3` in `oob:3` is not KEY=VALUE"),
            ("oob,,nan", "an empty rule"),
            ("oob:core=0:core=1", "names a core twice"),
            ("oob:rank=1", "`rank=` in `oob:rank=1` applies to the cc_ faults"),
            ("cc_hang:delay=1s", "`delay=` in `cc_hang:delay=1s` applies to cc_delay"),
            ("cc_delay:delay=soon", "expected a duration such as 500ms or 2s"),
            ("cc_exit:rank=-1", "expected a global rank"),
        ] {
            let error = parse_rules(text, 2).expect_err(text);
            assert!(error.0.contains(expected), "{text}: {error}");
        }
    }

    #[test]
    fn triggers_count_executions_per_core() {
        let rules = parse_rules("oob:every=3,nan:core=1:after=2,timeout:core=0", 2).expect("parses");
        let faults = Faults::new(rules);
        let kinds = |core| faults.strike(core, None).iter().map(|s| s.kind).collect::<Vec<_>>();
        assert_eq!(kinds(0), [FaultKind::Timeout]);
        assert_eq!(kinds(0), [FaultKind::Timeout]);
        assert_eq!(kinds(0), [FaultKind::Oob, FaultKind::Timeout]);
        // Core 1 counts its own executions.
        assert_eq!(kinds(1), Vec::<FaultKind>::new());
        assert_eq!(kinds(1), Vec::<FaultKind>::new());
        assert_eq!(kinds(1), [FaultKind::Oob, FaultKind::Nan]);
        assert_eq!(kinds(1), [FaultKind::Nan]);
    }

    #[test]
    fn rank_faults_strike_only_their_rank_of_a_collectives_program() {
        let rules = parse_rules("cc_delay:rank=1:delay=250ms,cc_hang:rank=2:after=1", 2).expect("parses");
        assert_eq!(rules[0].delay, Some(Duration::from_millis(250)));
        assert_eq!(rules[0].to_string(), "cc_delay:rank=1:delay=250ms");
        let at = parse_rules("cc_delay:rank=3:at=1:delay=5ms", 2).expect("parses");
        assert_eq!((at[0].at, at[0].to_string().as_str()), (Some(1), "cc_delay:rank=3:delay=5ms:at=1"));
        let refused = parse_rules("oob:at=1", 1).expect_err("only the cc_ faults strike a collective");
        assert!(refused.to_string().contains("applies to the cc_ faults"), "{refused}");
        assert_eq!(parse_rules("cc_delay", 1).expect("parses")[0].delay, Some(DEFAULT_CC_DELAY));
        let faults = Faults::new(rules);
        let kinds = |core, rank| faults.strike(core, rank).iter().map(|s| s.kind).collect::<Vec<_>>();
        assert_eq!(kinds(0, None), Vec::<FaultKind>::new(), "not a rank");
        assert_eq!(kinds(0, Some(1)), [FaultKind::CcDelay]);
        assert_eq!(kinds(1, Some(2)), Vec::<FaultKind>::new(), "rank 2's first execution");
        assert_eq!(kinds(1, Some(2)), [FaultKind::CcHang]);
    }

    #[test]
    fn a_slow_execution_is_late_by_its_delay_or_a_tenth_of_a_second() {
        let rules = parse_rules("slow:core=1:delay=300ms:every=40,slow", 2).expect("parses");
        assert_eq!(rules[0].delay, Some(Duration::from_millis(300)));
        assert_eq!(rules[1].delay, Some(DEFAULT_SLOW_DELAY));
        assert_eq!(rules[0].to_string(), "slow:core=1:delay=300ms:every=40");
        let refused = parse_rules("oob:delay=1s", 1).expect_err("only cc_delay and slow take a delay");
        assert!(refused.to_string().contains("applies to cc_delay and slow"), "{refused}");
    }

    #[test]
    fn a_rate_strikes_about_that_often_and_the_same_way_each_run() {
        let draw = || {
            let faults = Faults::new(parse_rules("nan:rate=0.1", 1).expect("parses"));
            (0..10_000).map(|_| !faults.strike(0, None).is_empty()).collect::<Vec<bool>>()
        };
        let hits = draw();
        let count = hits.iter().filter(|&&h| h).count();
        assert!((850..1150).contains(&count), "{count} of 10000 at rate 0.1");
        assert_eq!(draw(), hits, "reproducible");
    }

    #[test]
    fn the_first_degradation_of_a_core_is_kept() {
        let faults = Faults::new(Vec::new());
        assert_eq!(faults.degraded(0), None);
        faults.degrade(0, FaultKind::NcUe, 7);
        faults.degrade(0, FaultKind::HbmUe, 9);
        assert_eq!(faults.degraded(0), Some(Degraded { kind: FaultKind::NcUe, exec_id: 7 }));
        assert_eq!(faults.degraded(1), None);
    }
}
