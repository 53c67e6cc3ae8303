//! The flight record across processes: every process's datastore holds its groups'
//! whole table (each rank's arrivals with the data), so the group view of any one
//! process names every rank, the straggler, and a hang while it lasts.

use std::time::{Duration, Instant};

use neuron_datastore::DatastoreReader;
use neuron_datastore::ranks::{GroupView, HangClass, RankState, RuntimeRecords, StragglerRule, group_views};

use super::{common, job, job_with_faults, run_all_reduce};

/// The group views of the communicators of `fixtures`' runtimes, read now.
fn views_of(fixtures: &[&common::Fixture]) -> Vec<GroupView> {
    let records: Vec<RuntimeRecords> = fixtures
        .iter()
        .map(|f| {
            let reader = DatastoreReader::open(&f.runtime.datastore_path().expect("path")).expect("opens");
            RuntimeRecords::read(&reader, reader.liveness())
        })
        .collect();
    group_views(&records, &StragglerRule::default(), neuron_datastore::clock::monotonic_ns())
}

#[test]
fn each_process_records_its_groups_whole_table_and_names_a_late_rank() {
    // Rank 2 of 4 (one process each) arrives 20 ms late at every execution's
    // all-reduce.
    let job = job_with_faults(4, 1, Duration::from_secs(20), Some("cc_delay:rank=2:delay=20ms"));
    for output in run_all_reduce(&job, 1, 64, 8, None) {
        assert_eq!(output.expect("a late rank is waited for"), vec![10.0; 64]);
    }
    for (process, fixture) in job.iter().enumerate() {
        // One process's record alone shows the whole group.
        let views = views_of(&[fixture]);
        assert_eq!(views.len(), 1, "process {process}: {views:?}");
        let view = &views[0];
        assert_eq!((view.ranks, view.across, view.members.len()), (4, true, 4), "process {process}");
        assert!(view.members.iter().all(|m| m.pid != 0), "every rank's pid: {:?}", view.members);
        assert_eq!(view.members.iter().filter(|m| m.core.is_some()).count(), 1, "its own rank runs here");
        assert_eq!(view.collectives.len(), 8, "process {process}");
        assert!(view.collectives.iter().all(|c| c.complete), "{:?}", view.collectives);
        // The first meets as the processes come up, whoever is slowest then.
        let late = &view.collectives[1..];
        assert!(late.iter().all(|c| c.last == Some(2) && c.skew_ns >= 19_000_000), "{:?}", view.collectives);
        let straggler = view.straggler.as_ref().unwrap_or_else(|| panic!("process {process}: {:?}", view.members));
        assert_eq!((straggler.rank, straggler.of), (2, 8));
        assert!(straggler.last_in >= 7, "{straggler:?}");
        assert!(straggler.median_lateness_ns >= 20_000_000, "{straggler:?}");
        // Its 20 ms are spent inside its execution, before it arrives; the others
        // arrive soon after their previous collective (which waited for rank 2).
        let before = straggler.before.expect("what it did before it arrived");
        assert!(before.since_ns >= 20_000_000 && before.executing_ns >= 20_000_000, "{before:?}");
        assert!(before.others_since_ns.is_some_and(|o| o < before.since_ns), "{before:?}");
        assert_eq!(view.hang, None);
    }
    // All four together: the same view, each rank's own row from its own process.
    let all: Vec<&common::Fixture> = job.iter().collect();
    let view = &views_of(&all)[0];
    assert_eq!(view.members.iter().filter(|m| m.core.is_some()).count(), 4);
    assert!(view.members.iter().all(|m| m.state == RankState::Idle), "{:?}", view.members);
    assert_eq!(view.straggler.as_ref().map(|s| s.rank), Some(2));
}

#[test]
fn a_balanced_job_names_nobody() {
    let job = job(2, 2, Duration::from_secs(20));
    for output in run_all_reduce(&job, 2, 64, 12, None) {
        assert_eq!(output.expect("executes"), vec![10.0; 64]);
    }
    let all: Vec<&common::Fixture> = job.iter().collect();
    let view = &views_of(&all)[0];
    assert_eq!(view.members.len(), 4);
    assert_eq!(view.collectives.len(), 12);
    assert!(view.collectives.iter().all(|c| c.complete), "{:?}", view.collectives);
    // Nobody is late by a millisecond on median, whoever happens to come last.
    assert!(view.straggler.is_none(), "{:?} {:?}", view.straggler, view.members);
}

#[test]
fn a_hang_is_diagnosed_in_the_record_while_the_ranks_wait() {
    // A 4 s timeout: the waiting rank marks its wait after 2 s.
    let timeout = Duration::from_secs(4);
    let job = job_with_faults(2, 1, timeout, Some("cc_hang:rank=1"));
    let started = Instant::now();
    std::thread::scope(|scope| {
        let ranks = scope.spawn(|| run_all_reduce(&job, 1, 8, 1, None));
        let mut seen = None;
        while seen.is_none() && started.elapsed() < timeout {
            std::thread::sleep(Duration::from_millis(100));
            seen = views_of(&[&job[0]]).into_iter().find_map(|v| v.hang);
        }
        let hang = seen.expect("diagnosed before the timeout");
        assert!(started.elapsed() < neuron_runtime::collectives::report_after(timeout) + Duration::from_secs(1));
        assert_eq!((hang.class, hang.awaited.as_slice()), (HangClass::Missing, &[1][..]), "{}", hang.text);
        // Rank 1's process (here, the job's other runtime) says every second what it is
        // doing, through the root: executing the program, at its collective.
        let mut text = hang.text.clone();
        while !text.contains("last seen executing") && started.elapsed() < timeout {
            std::thread::sleep(Duration::from_millis(100));
            text = views_of(&[&job[0]]).into_iter().find_map(|v| v.hang).map_or(text, |h| h.text);
        }
        assert!(text.contains("(rank 1: last completed none, last seen executing `ar_ranks` at `r` "), "{text}");
        assert!(
            hang.text.starts_with("all-reduce #0 of comm `ar_ranks` (2 ranks): rank 0 waiting ")
                && hang.text.contains("for rank 1 (pid"),
            "{}",
            hang.text
        );
        let outputs = ranks.join().expect("ranks");
        // The error at the timeout says the same.
        let error = outputs[0].as_ref().expect_err("rank 1 hangs");
        assert!(error.message.starts_with("rank 1 (pid "), "{}", error.message);
        assert!(error.message.contains("), last seen executing `ar_ranks` at `r` "), "{}", error.message);
        outputs[1].as_ref().expect_err("rank 1 hangs");
    });
    // Over: nobody waits any more.
    assert!(views_of(&[&job[0]]).iter().all(|v| v.hang.is_none()));
}

#[test]
fn a_rank_whose_process_goes_away_is_named_gone() {
    use neuron_runtime::{Collective, CollectiveCall, DType};
    let mut job = job(2, 1, Duration::from_secs(30));
    let comm0 = job[0].runtime.join_communicator("leaves", 0, 0, 2).expect("joins");
    let comm1 = job[1].runtime.join_communicator("leaves", 0, 1, 2).expect("joins");
    comm0.wait_for_ranks(Instant::now() + Duration::from_secs(10)).expect("every rank joins");
    let barrier = CollectiveCall::new(Collective::Barrier, DType::U8);
    std::thread::scope(|scope| {
        let waiting = scope.spawn(|| comm0.run(0, &barrier, None, None));
        std::thread::sleep(Duration::from_millis(200));
        drop(comm1);
        job.pop().expect("second process").runtime.close().expect("closes");
        waiting.join().expect("rank 0").expect_err("rank 1 is gone");
    });
    let views = views_of(&[&job[0]]);
    let view = views.iter().find(|v| v.name == "leaves").expect("the communicator");
    assert_eq!(view.members.iter().find(|m| m.rank == 1).map(|m| m.state), Some(RankState::Gone));
    let hang = view.hang.as_ref().expect("a diagnosis");
    assert_eq!((hang.class, hang.awaited.as_slice()), (HangClass::Gone, &[1][..]), "{}", hang.text);
    assert!(hang.text.contains(": rank 1 (pid") && hang.text.contains(" died "), "{}", hang.text);
    assert_eq!(hang.class.title(), "Rank gone");
}

#[test]
fn what_a_rank_did_before_it_arrived_travels_with_its_arrival() {
    use neuron_runtime::{Model, Neff, Target, compile_hlo};
    let job = job(2, 1, Duration::from_secs(20));
    // An exponential (the activation engine) before each all-reduce.
    let hlo = "HloModule busy\nsum {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] add(a, b)\n}\n\
               ENTRY e {\n  x = f32[65536]{0} parameter(0)\n  y = f32[65536]{0} exponential(x)\n  \
               ROOT r = f32[65536]{0} all-reduce(y), replica_groups={}, to_apply=sum\n}\n";
    let neff = Neff::new("busy", compile_hlo(hlo, Target::Trn1).expect("compiles")).encode();
    let models: Vec<Model> = (0..2)
        .map(|rank| job[rank].runtime.load_collectives_across(&neff, 0, rank as u32, 2).expect("loads"))
        .collect();
    std::thread::scope(|scope| {
        for (fixture, model) in job.iter().zip(&models) {
            scope.spawn(move || {
                for _ in 0..6 {
                    common::execute_f32(&fixture.runtime, model, &vec![0.5; 65536]).expect("executes");
                }
            });
        }
    });
    // Read in rank 0's process only: rank 1's arrivals brought what it did too.
    let reader = DatastoreReader::open(&job[0].runtime.datastore_path().expect("path")).expect("opens");
    let records = RuntimeRecords::read(&reader, reader.liveness());
    let comm = records.communicators.iter().find(|c| c.name == "busy").expect("the communicator");
    assert_eq!(comm.members.len(), 2);
    for member in &comm.members {
        let befores: Vec<_> = member.history.iter().filter_map(|e| e.before).collect();
        assert_eq!(befores.len(), 5, "all but its first collective: {:?}", member.history);
        for before in befores {
            assert!(before.executing_ns <= before.since_ns, "{before:?}");
            let (engine, busy_ns) = before.busiest.expect("an engine was busy");
            assert_eq!(engine, neuron_datastore::Engine::Act, "{before:?}");
            assert!(busy_ns > 0 && busy_ns <= before.executing_ns + 1_000, "{before:?}");
        }
    }
}

/// A training step's program: two gradient buckets' all-reduces with work between
/// them, then the loss's (a scalar): three collectives an execution.
fn training_step_neff(elements: usize) -> Vec<u8> {
    use neuron_runtime::{Neff, Target, compile_hlo};
    let hlo = format!(
        "HloModule step\nsum {{\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] add(a, b)\n}}\n\
         ENTRY e {{\n  x = f32[{elements}]{{0}} parameter(0)\n  \
         g1 = f32[{elements}]{{0}} all-reduce(x), replica_groups={{}}, to_apply=sum\n  \
         m = f32[{elements}]{{0}} multiply(g1, g1)\n  \
         g2 = f32[{elements}]{{0}} all-reduce(m), replica_groups={{}}, to_apply=sum\n  \
         z = f32[] constant(0)\n  s = f32[] reduce(g2, z), dimensions={{0}}, to_apply=sum\n  \
         loss = f32[] all-reduce(s), replica_groups={{}}, to_apply=sum\n  \
         l = f32[{elements}]{{0}} broadcast(loss), dimensions={{}}\n  \
         ROOT r = f32[{elements}]{{0}} add(g2, l)\n}}\n"
    );
    Neff::new("train_step", compile_hlo(&hlo, Target::Trn1).expect("compiles")).encode()
}

/// Runs `steps` training steps on each of `job`'s processes (one rank each), rank
/// `sleeper` sleeping `host_ns` on the host before each, and gives the group view read
/// from every process.
fn run_steps(job: &[common::Fixture], steps: usize, sleeper: usize, host: Duration) -> GroupView {
    let neff = training_step_neff(256);
    let ranks = job.len();
    std::thread::scope(|scope| {
        for (rank, fixture) in job.iter().enumerate() {
            let neff = &neff;
            scope.spawn(move || {
                let model = fixture.runtime.load_collectives_across(neff, 0, rank as u32, ranks as u32).expect("loads");
                for _ in 0..steps {
                    if rank == sleeper {
                        std::thread::sleep(host);
                    }
                    let out = common::execute_f32(&fixture.runtime, &model, &[1.0; 256]).expect("executes");
                    // g1 = ranks, g2 = ranks · ranks², the loss 256 · g2 summed over ranks.
                    let g2 = ranks.pow(3) as f32;
                    assert_eq!(out[0], g2 + 256.0 * g2 * ranks as f32);
                }
            });
        }
    });
    let all: Vec<&common::Fixture> = job.iter().collect();
    views_of(&all).into_iter().find(|v| v.name == "train_step").expect("the step's communicator")
}

#[test]
fn a_rank_that_sleeps_on_the_host_before_each_step_of_three_collectives_is_named_with_host_time() {
    let job = job(4, 1, Duration::from_secs(20));
    let view = run_steps(&job, 12, 1, Duration::from_millis(20));
    // The record keeps each rank's last 32 collectives: the last 10 steps whole.
    assert_eq!(view.collectives.len() as u32, neuron_datastore::flight::HISTORY);
    let straggler = view.straggler.as_ref().unwrap_or_else(|| panic!("{:?}", view.members));
    assert_eq!((straggler.rank, straggler.late_in_some_steps, straggler.of), (1, false, 10), "{}", straggler.text);
    assert!(straggler.last_in + 1 >= straggler.of, "{}", straggler.text);
    assert!(straggler.median_lateness_ns >= 15_000_000, "{}", straggler.text);
    assert_eq!((straggler.at.index, straggler.at.collectives), (0, 3), "{}", straggler.text);
    let before = straggler.before.unwrap_or_else(|| panic!("{}", straggler.text));
    assert_eq!(before.cause, neuron_datastore::ranks::Cause::Host, "{}", straggler.text);
    assert!(before.since_ns - before.executing_ns >= 15_000_000, "{}", straggler.text);
    eprintln!("{}", straggler.text);
    assert!(straggler.text.contains("late at each step's first collective (of 3)"), "{}", straggler.text);
}

#[test]
fn a_rank_delayed_on_the_device_before_a_steps_second_collective_is_named_with_that_collective() {
    let job = job_with_faults(4, 1, Duration::from_secs(20), Some("cc_delay:rank=3:at=1:delay=20ms"));
    let view = run_steps(&job, 12, usize::MAX, Duration::ZERO);
    let straggler = view.straggler.as_ref().unwrap_or_else(|| panic!("{:?}", view.members));
    assert_eq!(straggler.rank, 3, "{}", straggler.text);
    assert_eq!((straggler.at.index, straggler.at.collectives), (1, 3), "{}", straggler.text);
    let before = straggler.before.unwrap_or_else(|| panic!("{}", straggler.text));
    assert_eq!(before.cause, neuron_datastore::ranks::Cause::Device, "{}", straggler.text);
    eprintln!("{}", straggler.text);
    assert!(straggler.text.contains("late at collective 2 of 3 of each step"), "{}", straggler.text);
}
