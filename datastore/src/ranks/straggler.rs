//! The straggler of a group: the rank the others wait for, judged per step.
//!
//! A **step** is a unit of work the ranks run together: an execution of a program
//! (a training step: every gradient bucket's all-reduce, the loss's, the metrics'), or
//! one call of the collectives API. A rank late to a step is late at one of its
//! collectives and tied at the others (they leave each collective together), so it is
//! judged on the step: its **lateness in a step** is the sum of its lateness over the
//! step's collectives: its lateness at the step's first collective when it started the
//! step late (a slow data loader, Python), at a later one when its device work before
//! that one was slow. The **last** of a step is the rank latest in it, unless the
//! runner-up is within the two ranks' clock uncertainties of it (per collective): a tie.
//!
//! A rank is the **straggler** ([`StragglerRule`]) when, of the last `window` steps
//! whose every collective is known, at least [`MIN_EVIDENCE`]:
//! - it was last in more than `share` of them, and its median lateness is at least
//!   `min_lateness` more than every other rank's and at least twice theirs; or
//! - its lateness came in some steps only (a rank slow before every third call of the
//!   collectives API, whose steps are single calls): it caused more than half of all
//!   the ranks' lateness, was later than every other rank by `min_lateness` in at least
//!   half of `share` of the steps (one long pause is not enough), and its mean lateness
//!   is at least `min_lateness` more than every other rank's and at least twice theirs.
//!
//! A balanced job, even on a busy host where every rank is somewhat late, names nobody.
//! With the straggler, where in its steps it was late (the collective of the steps it
//! lost that it was latest at, in all) and what it did before it arrived there, from
//! its own arrivals: time executing its program points at its device work, the rest at
//! its host.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use super::{CollectiveView, MemberView, format_ns, place};
use crate::flight::{Before, Position};
use crate::reader::RankRecord;

/// The fewest complete steps a straggler is named on.
pub const MIN_EVIDENCE: usize = 5;

/// When a rank is named a straggler (see the module's documentation).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StragglerRule {
    /// The last this many complete steps are looked at.
    pub window: usize,
    /// It arrived last in more than this share of them.
    pub share: f64,
    /// Its median lateness is at least this much more than every other rank's (and
    /// at least twice theirs).
    pub min_lateness: Duration,
}

impl Default for StragglerRule {
    /// The last 20 steps, last in more than half, 1 ms late on median.
    fn default() -> StragglerRule {
        StragglerRule { window: 20, share: 0.5, min_lateness: Duration::from_millis(1) }
    }
}

impl StragglerRule {
    /// The rule from `NEURON_VIRT_STRAGGLER_WINDOW`, `NEURON_VIRT_STRAGGLER_SHARE` and
    /// `NEURON_VIRT_STRAGGLER_MIN_LATENESS_US`, each defaulting as [`Default`] says.
    pub fn from_env() -> Result<StragglerRule, String> {
        let mut rule = StragglerRule::default();
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        if let Some(v) = var("NEURON_VIRT_STRAGGLER_WINDOW") {
            rule.window = v.trim().parse().ok().filter(|&w| w >= MIN_EVIDENCE).ok_or_else(|| {
                format!("NEURON_VIRT_STRAGGLER_WINDOW={v}: expected a number of steps, at least {MIN_EVIDENCE}")
            })?;
        }
        if let Some(v) = var("NEURON_VIRT_STRAGGLER_SHARE") {
            rule.share = v
                .trim()
                .parse()
                .ok()
                .filter(|s: &f64| (0.0..1.0).contains(s))
                .ok_or_else(|| format!("NEURON_VIRT_STRAGGLER_SHARE={v}: expected a share from 0 to below 1"))?;
        }
        if let Some(v) = var("NEURON_VIRT_STRAGGLER_MIN_LATENESS_US") {
            let us: u64 = v
                .trim()
                .parse()
                .map_err(|_| format!("NEURON_VIRT_STRAGGLER_MIN_LATENESS_US={v}: expected whole microseconds"))?;
            rule.min_lateness = Duration::from_micros(us);
        }
        Ok(rule)
    }
}

/// A rank named a straggler, with the evidence.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Straggler {
    pub rank: u32,
    pub host: String,
    pub pid: u32,
    /// It arrived last in `last_in` of `of` complete steps.
    pub last_in: usize,
    pub of: usize,
    /// Its lateness in a step, median and mean over the `of` steps.
    pub median_lateness_ns: u64,
    pub mean_lateness_ns: u64,
    /// Named on its lateness in some steps only (the rule's second case).
    pub late_in_some_steps: bool,
    /// The time the other ranks spent waiting for it, as a share of the span of those
    /// steps' collectives (first arrival of the first to the last arrival of the last).
    pub others_waited_share: f64,
    /// Where in its steps it was late.
    pub at: LateAt,
    /// What it did before it arrived there, as its arrivals said (`None` where they did
    /// not: profiles, or a runtime that does not say).
    pub before: Option<BeforeArrival>,
    /// One line for people: `rank 2 (pid 812 on host a) arrived last in 9 of 10
    /// steps, 1.8 ms late on median; the other ranks waited 17% of the time; late at
    /// each step's first collective …`.
    pub text: String,
}

/// The collective of its steps a straggler was latest at, in all.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LateAt {
    /// Its index in the step (0: the first), and the step's collectives.
    pub index: u16,
    pub collectives: usize,
    pub operation: &'static str,
    pub bytes: u64,
}

/// A straggler's time before its arrivals at the collective it was late at, medians
/// over the steps it was last in: from its previous collective's end to its arrival,
/// and the part of that inside executions of the program that holds its collectives
/// (the rest is host time: between executions, runtime calls, inputs, and executions
/// of its other models); beside the same time of the other ranks.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct BeforeArrival {
    pub since_ns: u64,
    pub executing_ns: u64,
    /// The engine its instructions kept busiest most often, and its median busy time
    /// then.
    pub busiest: Option<(&'static str, u64)>,
    pub others_since_ns: Option<u64>,
    /// Where that time went, mostly.
    pub cause: Cause,
}

/// Where a straggler's time before its late arrivals went, mostly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// Outside executions of its program: the host (data loading, Python between
    /// steps, the runtime's calls, its other models).
    Host,
    /// Executing its program: its device work.
    Device,
}

impl Straggler {
    fn describe(&self) -> String {
        let mut text = format!(
            "rank {}{} arrived last in {} of {} steps, {}; the other ranks waited {:.0}% of the time",
            self.rank,
            place(self.pid, &self.host),
            self.last_in,
            self.of,
            match self.late_in_some_steps {
                false => format!("{} late on median", format_ns(self.median_lateness_ns)),
                true => format!("{} late on average (in some steps only)", format_ns(self.mean_lateness_ns)),
            },
            100.0 * self.others_waited_share
        );
        let at = &self.at;
        let of_step = match (at.index, at.collectives) {
            (_, 1) => "at each step's collective".to_owned(),
            (0, n) => format!("at each step's first collective (of {n})"),
            (i, n) => format!("at collective {} of {n} of each step", i + 1),
        };
        text += &format!("; late {of_step}, {} of {}", at.operation, bytes(at.bytes));
        if let Some(before) = &self.before {
            let busiest = match before.busiest {
                Some((engine, ns)) => format!(" ({engine} busiest, {})", format_ns(ns)),
                None => String::new(),
            };
            text += &format!(
                "; before it arrived, on median: {} since its previous collective, {} of it executing its program{busiest} and {} not",
                format_ns(before.since_ns),
                format_ns(before.executing_ns),
                format_ns(before.since_ns.saturating_sub(before.executing_ns))
            );
            if let Some(others) = before.others_since_ns {
                text += &format!(" (the other ranks: {} since theirs)", format_ns(others));
            }
            text += match before.cause {
                Cause::Host => ": host time (data loading, Python, the runtime's calls between executions)",
                Cause::Device => ": device time (its program's work before that collective)",
            };
        }
        text
    }
}

/// `4 B`, `1.0 MiB`.
fn bytes(n: u64) -> String {
    match n {
        n if n < 1 << 10 => format!("{n} B"),
        n if n < 1 << 20 => format!("{:.1} KiB", n as f64 / 1024.0),
        n if n < 1 << 30 => format!("{:.1} MiB", n as f64 / f64::from(1 << 20)),
        n => format!("{:.1} GiB", n as f64 / f64::from(1 << 30)),
    }
}

/// The steps of `collectives` (oldest first) whose every collective is complete and
/// whose first is known, each as its collectives' indices in order. The newest step is
/// left out while it has fewer collectives than the others: it is still running (its
/// later collectives have not begun).
fn steps(collectives: &[CollectiveView]) -> Vec<Vec<usize>> {
    let mut by_unit: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for (i, c) in collectives.iter().enumerate() {
        by_unit.entry(c.position.sequence).or_default().push(i);
    }
    let mut steps: Vec<Vec<usize>> = by_unit
        .into_values()
        .filter(|step| collectives[step[0]].position.index == 0 && step.iter().all(|&i| collectives[i].complete))
        .collect();
    let longest = steps.iter().map(Vec::len).max().unwrap_or(0);
    if steps.len() > 1 && steps.last().is_some_and(|newest| newest.len() < longest) {
        steps.pop();
    }
    steps
}

fn median(mut values: Vec<u64>) -> Option<u64> {
    values.sort_unstable();
    values.get(values.len() / 2).copied()
}

/// Counts each rank's last arrivals and median lateness over the rule's window of
/// steps, and names the straggler when one rank fits the rule, with the collectives
/// (position, group) it was late at.
pub(super) fn name_straggler(
    members: &mut [MemberView],
    collectives: &[CollectiveView],
    rule: &StragglerRule,
) -> Option<(Straggler, Vec<(Position, u16)>)> {
    let steps = steps(collectives);
    let window = &steps[steps.len().saturating_sub(rule.window)..];
    // Each rank's lateness in each step of the window.
    let late: Vec<Vec<u64>> = members
        .iter()
        .map(|m| window.iter().map(|step| step.iter().map(|&i| m.lateness_ns[i].unwrap_or(0)).sum()).collect())
        .collect();
    let mut last_in = vec![0usize; members.len()];
    for (s, step) in window.iter().enumerate() {
        let mut order: Vec<usize> = (0..members.len()).collect();
        order.sort_by_key(|&m| std::cmp::Reverse(late[m][s]));
        if let [top, next, ..] = order[..] {
            let tie = step.len() as u64 * (members[top].uncertainty_ns + members[next].uncertainty_ns);
            if late[top][s] - late[next][s] > tie {
                last_in[top] += 1;
            }
        }
    }
    for (m, member) in members.iter_mut().enumerate() {
        member.arrived_last = last_in[m];
        member.median_lateness_ns = median(late[m].clone());
    }
    if window.len() < MIN_EVIDENCE || members.len() < 2 {
        return None;
    }
    let totals: Vec<u64> = late.iter().map(|l| l.iter().sum()).collect();
    let min_lateness = rule.min_lateness.as_nanos() as u64;
    // Late enough: at least the rule's minimum more than every other rank, and twice.
    let stands_out = |suspect: usize, figure: &dyn Fn(usize) -> u64| {
        let own = figure(suspect);
        let others = (0..members.len()).filter(|&m| m != suspect).map(figure).max().unwrap_or(0);
        own.saturating_sub(others) >= min_lateness && own >= 2 * others
    };
    let median_of = |m: usize| members[m].median_lateness_ns.unwrap_or(0);
    let mean_of = |m: usize| totals[m] / window.len() as u64;
    let most_last = (0..members.len()).max_by_key(|&m| last_in[m])?;
    let most_late = (0..members.len()).max_by_key(|&m| totals[m])?;
    let steps_count = window.len() as f64;
    // The steps in which a rank was later than every other by the rule's minimum.
    let clearly_late = |suspect: usize| -> Vec<usize> {
        (0..window.len())
            .filter(|&s| {
                let others = (0..members.len()).filter(|&m| m != suspect).map(|m| late[m][s]).max().unwrap_or(0);
                late[suspect][s].saturating_sub(others) >= min_lateness.max(1)
            })
            .collect()
    };
    let (suspect, late_in_some_steps, evidence) =
        if last_in[most_last] as f64 > rule.share * steps_count && stands_out(most_last, &median_of) {
            let lost: Vec<usize> = (0..window.len()).filter(|&s| is_last(&late, s, most_last)).collect();
            (most_last, false, lost)
        } else {
            let late_steps = clearly_late(most_late);
            if 2 * totals[most_late] > totals.iter().sum::<u64>()
                && late_steps.len() as f64 >= rule.share / 2.0 * steps_count
                && stands_out(most_late, &mean_of)
            {
                (most_late, true, late_steps)
            } else {
                return None;
            }
        };
    let rank = members[suspect].rank;
    let arrival = |c: &CollectiveView, rank: u32| c.arrivals.iter().find(|a| a.0 == rank).map_or(0, |a| a.1);
    let (mut waited, mut span) = (0u64, 0u64);
    for &i in window.iter().flatten() {
        let c = &collectives[i];
        let at = arrival(c, rank);
        waited += c.arrivals.iter().filter(|a| a.0 != rank).map(|a| at.saturating_sub(a.1)).sum::<u64>();
        span += c.skew_ns;
    }
    let (first_step, last_step) = (window.first()?, window.last()?);
    let first = collectives[first_step[0]].arrivals.iter().map(|a| a.1).min().unwrap_or(0);
    let last = collectives[*last_step.last()?].arrivals.iter().map(|a| a.1).max().unwrap_or(0);
    let others = (collectives[first_step[0]].arrivals.len() - 1).max(1) as f64;
    let elapsed = last.saturating_sub(first).max(span).max(1) as f64;
    // Where in its steps it was late: the collective of the steps it was last in
    // that it was latest at, in all, by index in the step.
    let mut indices: BTreeMap<u16, (u64, Vec<usize>)> = BTreeMap::new();
    for &step in &evidence {
        for &i in &window[step] {
            let (lateness, at) = indices.entry(collectives[i].position.index).or_default();
            *lateness += members[suspect].lateness_ns[i].unwrap_or(0);
            at.push(i);
        }
    }
    let (index, (_, at)) = indices.into_iter().max_by_key(|(_, (lateness, _))| *lateness)?;
    let newest = &collectives[*at.last()?];
    // The step's collectives: the most any step of the window has.
    let per_step = window.iter().map(Vec::len).max().unwrap_or(1);
    let mut straggler = Straggler {
        rank,
        host: members[suspect].host.clone(),
        pid: members[suspect].pid,
        last_in: last_in[suspect],
        of: window.len(),
        median_lateness_ns: median_of(suspect),
        mean_lateness_ns: mean_of(suspect),
        late_in_some_steps,
        others_waited_share: (waited as f64 / others / elapsed).min(1.0),
        at: LateAt { index, collectives: per_step, operation: newest.operation, bytes: newest.bytes },
        before: None,
        text: String::new(),
    };
    straggler.text = straggler.describe();
    let positions = at.iter().map(|&i| (collectives[i].position, collectives[i].group)).collect();
    Some((straggler, positions))
}

impl Straggler {
    /// Adds what the straggler did before its arrivals at `positions` (where it was
    /// late), beside the other ranks, from what their arrivals said.
    pub(super) fn add_before(&mut self, records: &BTreeMap<u32, RankRecord>, positions: &[(Position, u16)]) {
        let befores = |m: &RankRecord| -> Vec<Before> {
            m.history.iter().filter(|e| positions.contains(&(e.position, e.group))).filter_map(|e| e.before).collect()
        };
        let Some(own) = records.get(&self.rank).map(befores) else { return };
        let others: Vec<u64> =
            records.values().filter(|m| m.rank != self.rank).flat_map(befores).map(|b| b.since_ns).collect();
        // The engine most often busiest, and its median time when it was.
        let mut engines: BTreeMap<crate::Engine, Vec<u64>> = BTreeMap::new();
        for (engine, ns) in own.iter().filter_map(|b| b.busiest) {
            engines.entry(engine).or_default().push(ns);
        }
        let busiest = engines.into_iter().max_by_key(|(_, times)| times.len());
        let (Some(since_ns), Some(executing_ns)) =
            (median(own.iter().map(|b| b.since_ns).collect()), median(own.iter().map(|b| b.executing_ns).collect()))
        else {
            return;
        };
        let cause = if since_ns.saturating_sub(executing_ns) >= executing_ns { Cause::Host } else { Cause::Device };
        self.before = Some(BeforeArrival {
            since_ns,
            executing_ns,
            busiest: busiest.and_then(|(engine, times)| Some((engine.name(), median(times)?))),
            others_since_ns: median(others),
            cause,
        });
        self.text = self.describe();
    }
}

/// Whether `member` was the latest of step `s` (strictly: a tie names nobody here).
fn is_last(late: &[Vec<u64>], s: usize, member: usize) -> bool {
    let own = late[member][s];
    late.iter().enumerate().all(|(m, l)| m == member || l[s] < own)
}
