use std::time::Duration;

use super::*;
use crate::flight::Before;
use crate::kinds::CollectiveAlgorithm;
use crate::reader::ClockOffsetRecord;

const MS: u64 = 1_000_000;

fn entry(sequence: u32, arrived_ns: u64, departed_ns: Option<u64>) -> CollectiveEntry {
    CollectiveEntry {
        position: Position { sequence, index: 0 },
        operation: CollectiveOp::AllReduce,
        algorithm: CollectiveAlgorithm::AllToAll,
        group: 0,
        bytes: 4096,
        arrived_ns,
        departed_ns,
        before: None,
    }
}

fn rank(rank: u32, pid: u32, arrivals: &[u64]) -> RankRecord {
    RankRecord {
        rank,
        pid,
        host: "h1".into(),
        core: Some(rank),
        in_this_process: true,
        gone: false,
        enqueued: None,
        started: None,
        operation: None,
        completed: arrivals.len().checked_sub(1).map(|s| Position { sequence: s as u32, index: 0 }),
        uncertainty_ns: 0,
        waiting: None,
        history: arrivals.iter().enumerate().map(|(s, &at)| entry(s as u32, at, Some(at + MS))).collect(),
        heard: None,
    }
}

fn runtime(pid: u32, members: Vec<RankRecord>) -> RuntimeRecords {
    let communicators = vec![CommunicatorRecord { id: 9, name: "grads".into(), ranks: 4, across: true, members }];
    let clock = Some(ClockOffsetRecord { offset_ns: 0, uncertainty_ns: 2_000 });
    RuntimeRecords {
        pid,
        clock,
        admission: None,
        communicators,
        activity: Activity { liveness: "live", ..Activity::default() },
    }
}

/// Arrivals of 4 ranks at `n` collectives 10 ms apart, with a few hundred µs of
/// jitter from a fixed generator, and `late` ns more for rank `slow`.
fn arrivals(n: usize, slow: Option<u32>, late: u64) -> Vec<Vec<u64>> {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut jitter = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % (400 * 1_000)
    };
    (0..4u32)
        .map(|r| {
            (0..n)
                .map(|s| 1_000 * MS + s as u64 * 10 * MS + jitter() + if Some(r) == slow { late } else { 0 })
                .collect()
        })
        .collect()
}

/// Each rank in its own process, as four processes of one host record them: each
/// knows its own rank and, from the messages, the others' arrivals.
fn four_processes(arrivals: &[Vec<u64>]) -> Vec<RuntimeRecords> {
    (0..4u32)
        .map(|me| {
            let members = (0..4u32)
                .map(|r| {
                    let mut record = rank(r, 100 + r, &arrivals[r as usize]);
                    if r != me {
                        record.in_this_process = false;
                        record.core = None;
                        record.history.iter_mut().for_each(|e| e.departed_ns = None);
                    }
                    record
                })
                .collect();
            runtime(100 + me, members)
        })
        .collect()
}

#[test]
fn a_rank_that_arrives_late_every_time_is_named_with_its_evidence() {
    let views = group_views(&four_processes(&arrivals(12, Some(2), 3 * MS)), &StragglerRule::default(), 0);
    assert_eq!(views.len(), 1, "one communicator across four processes");
    let view = &views[0];
    assert_eq!(view.members.len(), 4);
    assert!(view.members.iter().all(|m| m.pid == 100 + m.rank), "each rank as its own process says");
    assert_eq!(view.collectives.len(), 12);
    assert!(view.collectives.iter().all(|c| c.complete && c.last == Some(2)));
    let straggler = view.straggler.as_ref().expect("rank 2 named");
    assert_eq!((straggler.rank, straggler.last_in, straggler.of), (2, 12, 12));
    assert!((3 * MS..4 * MS).contains(&straggler.median_lateness_ns), "{}", straggler.median_lateness_ns);
    let text = &straggler.text;
    assert!(
        text.starts_with("rank 2 (pid 102 on host h1) arrived last in 12 of 12 steps, 3.1 ms late on median"),
        "{text}"
    );
    assert!(text.ends_with("; late at each step's collective, all-reduce of 4.0 KiB"), "{text}");
    assert!(straggler.others_waited_share > 0.2 && straggler.others_waited_share <= 1.0, "{text}");
    assert_eq!(straggler.before, None, "its arrivals said nothing of it");

    // Its arrivals say what it did before: 7 ms since its previous collective, 6.5
    // ms of it executing; the others 2 ms, and their copies of its arrivals too.
    let mut records = four_processes(&arrivals(12, Some(2), 3 * MS));
    for member in records.iter_mut().flat_map(|r| r.communicators[0].members.iter_mut()) {
        let (since_ns, executing_ns) = if member.rank == 2 { (7 * MS, 6_500_000) } else { (2 * MS, MS) };
        let busiest = Some((crate::Engine::Pe, 5 * MS));
        member.history.iter_mut().skip(1).for_each(|e| e.before = Some(Before { since_ns, executing_ns, busiest }));
    }
    let views = group_views(&records, &StragglerRule::default(), 0);
    let straggler = views[0].straggler.as_ref().expect("rank 2 named");
    let before = straggler.before.expect("what it did before");
    assert_eq!((before.since_ns, before.executing_ns, before.others_since_ns), (7 * MS, 6_500_000, Some(2 * MS)));
    assert_eq!((before.busiest, before.cause), (Some(("PE", 5 * MS)), Cause::Device));
    assert!(
        straggler.text.ends_with(
            "; before it arrived, on median: 7.0 ms since its previous collective, 6.5 ms of it executing \
             its program (PE busiest, 5.0 ms) and 500.0 µs not (the other ranks: 2.0 ms since theirs): device \
             time (its program's work before that collective)"
        ),
        "{}",
        straggler.text
    );
}

#[test]
fn a_balanced_job_names_nobody_and_too_little_evidence_names_nobody() {
    let views = group_views(&four_processes(&arrivals(32, None, 0)), &StragglerRule::default(), 0);
    assert_eq!(views[0].straggler, None, "{:?}", views[0].members);
    // Late, but seen too few times to say.
    let views =
        group_views(&four_processes(&arrivals(MIN_EVIDENCE - 1, Some(1), 5 * MS)), &StragglerRule::default(), 0);
    assert_eq!(views[0].straggler, None);
    // Always last, but by less than the threshold.
    let rule = StragglerRule { min_lateness: Duration::from_millis(10), ..StragglerRule::default() };
    let views = group_views(&four_processes(&arrivals(12, Some(1), 3 * MS)), &rule, 0);
    assert_eq!(views[0].straggler, None);
    // Last most of the time on a busy host, but hardly later than the others are:
    // each collective one of ranks 0, 2, 3 comes first and the other two 1.2 and
    // 1.3 ms later; rank 1 comes 1.5 ms late in two of three, else 1.0 ms.
    let busy: Vec<Vec<u64>> = (0..4u64)
        .map(|r| {
            (0..21u64)
                .map(|s| {
                    let base = 1_000 * MS + s * 10 * MS;
                    let first = [0, 2, 3][(s % 3) as usize];
                    let late = match r {
                        1 if s % 3 != 0 => 1_500_000,
                        1 => 1_000_000,
                        r if r == first => 0,
                        r if (r + s) % 2 == 0 => 1_200_000,
                        _ => 1_300_000,
                    };
                    base + late
                })
                .collect()
        })
        .collect();
    let views = group_views(&four_processes(&busy), &StragglerRule::default(), 0);
    assert!(views[0].members[1].arrived_last > 10, "{:?}", views[0].members[1]);
    assert_eq!(views[0].straggler, None, "{:?}", views[0].members);
}

#[test]
fn arrivals_closer_than_the_clocks_uncertainty_are_a_tie() {
    let mut records = four_processes(&arrivals(6, Some(3), 1_000));
    for runtime in &mut records {
        for member in &mut runtime.communicators[0].members {
            member.uncertainty_ns = 600_000;
        }
    }
    let views = group_views(&records, &StragglerRule { min_lateness: Duration::ZERO, ..StragglerRule::default() }, 0);
    assert!(views[0].collectives.iter().all(|c| c.last.is_none()), "{:?}", views[0].collectives);
    assert_eq!(views[0].straggler, None);
    assert_eq!(views[0].uncertainty_ns, 600_000);
}

#[test]
fn communicators_of_single_processes_are_never_merged_across_processes() {
    let mut a = runtime(1, vec![rank(0, 1, &[5]), rank(1, 1, &[6])]);
    let mut b = runtime(2, vec![rank(0, 2, &[7]), rank(1, 2, &[8])]);
    a.communicators[0].across = false;
    b.communicators[0].across = false;
    let views = group_views(&[a, b], &StragglerRule::default(), 0);
    assert_eq!(views.len(), 2);
    assert!(views.iter().all(|v| v.members.len() == 2 && v.collectives.len() == 1));
}

#[test]
fn a_hang_names_the_missing_rank_and_what_it_last_did() {
    let mut records = four_processes(&arrivals(3, None, 0));
    let at = Position { sequence: 3, index: 0 };
    for runtime in &mut records {
        for m in &mut runtime.communicators[0].members {
            m.enqueued = Some(at);
            if m.rank != 3 {
                m.started = Some(at);
                m.operation = Some(CollectiveOp::AllReduce);
                m.waiting = Some((100 * MS, 3));
            }
        }
    }
    // Rank 3's own process says what it is doing.
    records[3].activity.executing = vec![("train_step".into(), Some("dot.12".into()))];
    let views = group_views(&records, &StragglerRule::default(), 5_100 * MS);
    let hang = views[0].hang.as_ref().expect("a hang");
    assert_eq!((hang.class, hang.position, hang.awaited.as_slice()), (HangClass::Missing, at, &[3][..]));
    assert_eq!(hang.waiting.len(), 3);
    assert_eq!(
        hang.text,
        "all-reduce #3 of comm `grads` (4 ranks): 3 ranks waiting 5.0 s for rank 3 (pid 103 on host h1), \
         which never reached it (rank 3: last completed #2, running unit #3, executing `train_step` at `dot.12`)"
    );
    assert_eq!(views[0].members[3].state, RankState::Running);
    assert_eq!(views[0].members[0].state, RankState::Waiting);
    // Read where rank 3's process is not (another host): when it was last heard of,
    // from the arrivals that came with the data.
    let elsewhere = records[..3].to_vec();
    let views = group_views(&elsewhere, &StragglerRule::default(), 5_100 * MS);
    let text = &views[0].hang.as_ref().expect("a hang").text;
    assert!(text.ends_with("(rank 3: last completed #2, running unit #3, last heard of 4.1 s ago (at #2))"), "{text}");
    // Its process's heartbeat came through the root: what it said, and when; the
    // latest of what the processes read heard wins.
    let mut elsewhere = elsewhere;
    let step = [("train_step".to_owned(), Some("dot.12".to_owned()))];
    elsewhere[0].communicators[0].members[3].heard = Some(crate::flight::Heard::of(4_900 * MS, &step));
    elsewhere[1].communicators[0].members[3].heard = Some(crate::flight::Heard::of(4_100 * MS, &[]));
    let views = group_views(&elsewhere, &StragglerRule::default(), 5_100 * MS);
    let text = &views[0].hang.as_ref().expect("a hang").text;
    assert!(
        text.ends_with(
            "(rank 3: last completed #2, running unit #3, last seen executing `train_step` at `dot.12` \
             200.0 ms ago)"
        ),
        "{text}"
    );
    // It has said nothing since: a process stopped, or a host cut off.
    let views = group_views(&elsewhere, &StragglerRule::default(), 10_100 * MS);
    let hang = views[0].hang.as_ref().expect("a hang");
    assert_eq!(hang.class, HangClass::Stopped, "{}", hang.text);
    assert!(
        hang.text.ends_with(
            "which answers nothing (rank 3: stopped: no heartbeat for 5.2 s (or its host is unreachable); it \
             last said it was executing `train_step` at `dot.12`)"
        ),
        "{}",
        hang.text
    );

    // Rank 3 arrived too: the data does not move.
    for runtime in &mut records {
        let m = &mut runtime.communicators[0].members[3];
        m.started = Some(at);
    }
    let views = group_views(&records, &StragglerRule::default(), 5_100 * MS);
    assert_eq!(views[0].hang.as_ref().map(|h| h.class), Some(HangClass::TransportStalled));

    // Its process went away.
    records[0].communicators[0].members[3].gone = true;
    let views = group_views(&records, &StragglerRule::default(), 5_100 * MS);
    assert_eq!(views[0].hang.as_ref().map(|h| h.class), Some(HangClass::Gone));
    assert_eq!(views[0].members[3].state, RankState::Gone);
    // The others' collective failed: nobody waits, and the gone rank is named.
    for runtime in &mut records {
        runtime.communicators[0].members.iter_mut().for_each(|m| m.waiting = None);
    }
    let views = group_views(&records, &StragglerRule::default(), 5_100 * MS);
    let hang = views[0].hang.as_ref().expect("the gone rank");
    assert_eq!((hang.class, hang.awaited.as_slice()), (HangClass::Gone, &[3][..]));
    assert_eq!(
        hang.text,
        "comm `grads` (4 ranks): rank 3 (pid 103 on host h1) died after completing #2 (its process is gone); \
         the collectives that need it fail"
    );
}

#[test]
fn the_default_rule_and_durations_read_as_documented() {
    assert_eq!(StragglerRule::default().window, 20);
    assert_eq!(format_ns(1_800_000), "1.8 ms");
    assert_eq!(format_ns(5_000_000_000), "5.0 s");
}

/// Four ranks, each in its own process, running `steps` steps of three collectives
/// 30 ms apart (5 ms apart within a step), with jitter of up to 200 µs: rank `r`
/// arrives `late(r, step, index)` more, and says it spent `before(r, step, index)`
/// (since, executing) before it arrived.
fn three_collective_steps(
    steps: u32,
    late: impl Fn(u32, u32, u16) -> u64,
    before: impl Fn(u32, u32, u16) -> (u64, u64),
) -> Vec<RuntimeRecords> {
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut jitter = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % (200 * 1_000)
    };
    let history: Vec<Vec<CollectiveEntry>> = (0..4u32)
        .map(|r| {
            (0..steps)
                .flat_map(|s| (0..3u16).map(move |i| (s, i)))
                .map(|(s, i)| {
                    let arrived_ns =
                        1_000 * MS + u64::from(s) * 30 * MS + u64::from(i) * 5 * MS + jitter() + late(r, s, i);
                    let (since_ns, executing_ns) = before(r, s, i);
                    CollectiveEntry {
                        position: Position { sequence: s, index: i },
                        bytes: if i == 2 { 4 } else { 4 << 20 },
                        before: Some(Before {
                            since_ns,
                            executing_ns,
                            busiest: Some((crate::Engine::Pe, executing_ns)),
                        }),
                        ..entry(s, arrived_ns, Some(arrived_ns + MS))
                    }
                })
                .collect()
        })
        .collect();
    let mut records = four_processes(&arrivals(1, None, 0));
    for (me, runtime) in records.iter_mut().enumerate() {
        for member in &mut runtime.communicators[0].members {
            member.history = history[member.rank as usize].clone();
            if member.rank as usize != me {
                member.history.iter_mut().for_each(|e| e.departed_ns = None);
            }
        }
    }
    records
}

#[test]
fn a_rank_late_to_each_step_of_three_collectives_is_named_with_host_time_as_the_cause() {
    // Rank 1 sleeps 20 ms on the host before each step: late at its first collective
    // only, tied at the other two.
    let records = three_collective_steps(
        12,
        |r, _, i| if r == 1 && i == 0 { 20 * MS } else { 0 },
        |r, _, i| match (r, i) {
            (1, 0) => (22 * MS, MS),
            (_, 0) => (2 * MS, MS),
            _ => (5 * MS, 5 * MS),
        },
    );
    let views = group_views(&records, &StragglerRule::default(), 0);
    let view = &views[0];
    // By collective, it is last at each step's first and last at the others by chance
    // (their arrivals are within the jitter); per step, in every one.
    let firsts = view.collectives.iter().filter(|c| c.position.index == 0);
    assert!(firsts.clone().all(|c| c.last == Some(1)) && firsts.count() == 12, "{:?}", view.collectives);
    let straggler = view.straggler.as_ref().expect("rank 1 named");
    assert_eq!((straggler.rank, straggler.last_in, straggler.of, straggler.late_in_some_steps), (1, 12, 12, false));
    assert!((20 * MS..21 * MS).contains(&straggler.median_lateness_ns), "{}", straggler.text);
    assert_eq!((straggler.at.index, straggler.at.collectives, straggler.at.operation), (0, 3, "all-reduce"));
    let before = straggler.before.expect("what it did before");
    assert_eq!((before.since_ns, before.executing_ns, before.others_since_ns), (22 * MS, MS, Some(2 * MS)));
    assert_eq!(before.cause, Cause::Host);
    let text = &straggler.text;
    assert!(text.contains("arrived last in 12 of 12 steps, 20."), "{text}");
    assert!(text.contains("; late at each step's first collective (of 3), all-reduce of 4.0 MiB; before it"), "{text}");
    assert!(text.ends_with(": host time (data loading, Python, the runtime's calls between executions)"), "{text}");
}

#[test]
fn a_step_still_running_is_not_counted_until_its_collectives_have_all_run() {
    // Rank 1 late to each step's first collective; the newest step has run only that one.
    let mut records = three_collective_steps(
        12,
        |r, _, i| if r == 1 && i == 0 { 20 * MS } else { 0 },
        |r, _, i| if (r, i) == (1, 0) { (22 * MS, MS) } else { (2 * MS, MS) },
    );
    for runtime in &mut records {
        for member in &mut runtime.communicators[0].members {
            member.history.retain(|e| e.position.sequence < 11 || e.position.index == 0);
        }
    }
    let views = group_views(&records, &StragglerRule::default(), 0);
    let straggler = views[0].straggler.as_ref().expect("rank 1 named");
    assert_eq!((straggler.last_in, straggler.of), (11, 11), "the eleven whole steps: {}", straggler.text);
    assert_eq!((straggler.at.index, straggler.at.collectives), (0, 3), "{}", straggler.text);
    assert!(straggler.text.contains("late at each step's first collective (of 3)"), "{}", straggler.text);
}

#[test]
fn a_rank_slow_on_the_device_before_a_steps_middle_collective_is_named_with_that_collective() {
    let records = three_collective_steps(
        10,
        |r, _, i| if r == 3 && i == 1 { 4 * MS } else { 0 },
        |r, _, i| if r == 3 && i == 1 { (9 * MS, 9 * MS) } else { (5 * MS, 5 * MS) },
    );
    let views = group_views(&records, &StragglerRule::default(), 0);
    let straggler = views[0].straggler.as_ref().expect("rank 3 named");
    assert_eq!((straggler.rank, straggler.last_in, straggler.at.index), (3, 10, 1), "{}", straggler.text);
    let before = straggler.before.expect("what it did before");
    assert_eq!((before.since_ns, before.executing_ns, before.cause), (9 * MS, 9 * MS, Cause::Device));
    let text = &straggler.text;
    assert!(text.contains("; late at collective 2 of 3 of each step, all-reduce of 4.0 MiB;"), "{text}");
    assert!(text.ends_with(": device time (its program's work before that collective)"), "{text}");
}

#[test]
fn balanced_steps_of_several_collectives_and_a_single_late_step_name_nobody() {
    let plain = |_, _, _| (5 * MS, 5 * MS);
    let views = group_views(&three_collective_steps(12, |_, _, _| 0, plain), &StragglerRule::default(), 0);
    assert_eq!(views[0].straggler, None, "{:?}", views[0].members);
    // One long pause of one rank in one step is not a straggler.
    let once = |r, s, i| if (r, s, i) == (2, 5, 0) { 200 * MS } else { 0 };
    let views = group_views(&three_collective_steps(12, once, plain), &StragglerRule::default(), 0);
    assert_eq!(views[0].straggler, None, "{:?}", views[0].members);
}

#[test]
fn a_rank_late_before_every_third_call_is_named_on_its_lateness_in_some_steps() {
    // Each call of the collectives API is its own step: rank 0 is 20 ms late at every
    // third, tied at the rest.
    let calls: Vec<Vec<u64>> = arrivals(18, None, 0)
        .into_iter()
        .enumerate()
        .map(|(r, a)| {
            a.into_iter().enumerate().map(|(s, at)| at + if r == 0 && s % 3 == 0 { 20 * MS } else { 0 }).collect()
        })
        .collect();
    let views = group_views(&four_processes(&calls), &StragglerRule::default(), 0);
    let straggler = views[0].straggler.as_ref().expect("rank 0 named");
    assert_eq!((straggler.rank, straggler.of, straggler.late_in_some_steps), (0, 18, true));
    // Last in its 6 late steps, and in a few others by chance.
    assert!((6..9).contains(&straggler.last_in), "{}", straggler.text);
    assert!(straggler.median_lateness_ns < MS, "tied in most steps");
    assert!((6 * MS..8 * MS).contains(&straggler.mean_lateness_ns), "{}", straggler.text);
    assert!(straggler.text.contains(" of 18 steps, 6."), "{}", straggler.text);
    assert!(straggler.text.contains("late on average (in some steps only)"), "{}", straggler.text);
}
