//! Ranks on two hosts: two network namespaces joined by a veth pair, created (and
//! removed) by the test itself, each running one process as one rank of a
//! torchrun-style job, with rank 0's address on the first host's interface. In the
//! first test the second host's link is slowed down (`tc netem` delay where the kernel
//! has it, else a `tbf` rate limit), and the traffic is seen crossing it; in the second,
//! the second host's clock is 5 s off and the ranks are put back on one time line.
//! Needs root and `ip`; skipped with a note elsewhere, and required in CI.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use neuron_test_support::hosts::Hosts;
use neuron_test_support::process::Sandbox;

/// Two hosts, or `None` with a note where namespaces cannot be made (required in CI).
fn hosts() -> Option<Hosts> {
    match Hosts::create() {
        Ok(hosts) => Some(hosts),
        Err(why) => {
            neuron_test_support::ci::missing(
                &format!("cannot create network namespaces here ({why}); run as root with `ip`"),
                "the two-host test",
            );
            None
        }
    }
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

#[test]
fn ranks_on_two_hosts_joined_by_a_slowed_link_run_and_check_their_collectives() {
    let Some(hosts) = hosts() else { return };
    let slowed = hosts.slow_down(1).expect("a qdisc on the second host's link");
    let root = format!("{}:{}", hosts.addresses[0], 41_000 + std::process::id() % 20_000);
    // Each host has its own core reservations and datastores, as separate machines do.
    let sandboxes = [Sandbox::new(), Sandbox::new()];
    let children: Vec<std::process::Child> = (0..2)
        .map(|rank| {
            let mut program = Command::new(env!("CARGO_BIN_EXE_nccom-test"));
            sandboxes[rank]
                .env(&mut program)
                .env("NEURON_RT_ROOT_COMM_ID", &root)
                .env("NEURON_RT_LOG_LEVEL", "debug")
                .envs([("RANK", rank.to_string()), ("WORLD_SIZE", "2".to_owned())])
                .args(["-r", "2", "allr", "-b", "1K", "-e", "4M", "-f", "16", "-n", "3", "--check"]);
            hosts.run_in(rank, &program).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("starts")
        })
        .collect();
    let outputs: Vec<Output> = children.into_iter().map(|c| c.wait_with_output().expect("ends")).collect();
    let log: String = outputs.iter().map(text).collect();
    assert!(outputs.iter().all(|o| o.status.success()), "{slowed}: {log}");
    // Rank 0 prints the table.
    let table = String::from_utf8_lossy(&outputs[0].stdout);
    let rows: Vec<&str> =
        table.lines().filter(|l| !l.starts_with('#') && !l.trim_start().starts_with("size")).collect();
    assert_eq!(rows.len(), 4, "1 KiB to 4 MiB by 16: {log}");
    assert!(rows.iter().all(|row| row.ends_with(" ok")), "every rank's result checked: {log}");
    assert!(log.contains(&format!("rank 0 at {root}")), "{log}");
    // Other hosts: the data goes over TCP.
    assert!(log.contains("through TCP") && !log.contains("through shared memory"), "{log}");
    // The second host sent its half of every all-reduce through the slowed link: at
    // least its input of each timed and untimed call of the largest size.
    let sent = hosts.sent_bytes(1);
    assert!(sent > 8 * (4 << 20) / 2, "{sent} bytes through the {slowed} link: {log}");
}

/// The runtime of `sandbox`'s datastore directory, once there is one.
/// The two ranks of a job, one on each host, rank 0's address `root`, the second host's
/// clock reading `shift_ns` ahead of the first's: each runs the command `command` puts
/// in its (empty) argument list, its log in its sandbox's `rank.log`.
fn shifted_ranks(
    hosts: &Hosts,
    sandboxes: &[Sandbox; 2],
    root: &str,
    shift_ns: i64,
    command: impl Fn(&mut Command),
) -> Vec<std::process::Child> {
    (0..2)
        .map(|rank| {
            // `env` runs the command with the variables below.
            let mut program = Command::new("env");
            sandboxes[rank]
                .env(&mut program)
                .env("NEURON_RT_ROOT_COMM_ID", root)
                .env("NEURON_RT_NUM_CORES", "1")
                .envs([("RANK", rank.to_string()), ("WORLD_SIZE", "2".to_owned())]);
            if rank == 1 {
                program.env("NEURON_VIRT_TEST_CLOCK_SHIFT_NS", shift_ns.to_string());
            }
            command(&mut program);
            let log = std::fs::File::create(sandboxes[rank].path().join("rank.log")).expect("log");
            hosts.run_in(rank, &program).stdout(Stdio::null()).stderr(log).spawn().expect("starts")
        })
        .collect()
}

fn reader_in(sandbox: &Sandbox) -> Option<neuron_datastore::DatastoreReader> {
    let entries = std::fs::read_dir(&sandbox.datastores).ok()?;
    let path = entries.flatten().map(|e| e.path()).find(|p| p.extension().is_some_and(|x| x == "ds"))?;
    neuron_datastore::DatastoreReader::open(&path).ok()
}

#[test]
fn a_host_whose_clock_is_five_seconds_off_is_realigned_within_the_stated_uncertainty() {
    use neuron_datastore::ranks::{RuntimeRecords, StragglerRule, group_views};
    let Some(hosts) = hosts() else { return };
    const SHIFT_NS: i64 = 5_000_000_000;
    let root = format!("{}:{}", hosts.addresses[0], 41_000 + (std::process::id() + 1) % 20_000);
    let sandboxes = [Sandbox::new(), Sandbox::new()];
    let hlo = sandboxes[0].path().join("allreduce.hlo");
    std::fs::write(
        &hlo,
        "HloModule ar\nsum {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] add(a, b)\n}\n\
         ENTRY e {\n  x = f32[1024]{0} parameter(0)\n  ROOT r = f32[1024]{0} all-reduce(x), replica_groups={}, to_apply=sum\n}\n",
    )
    .expect("write");
    let mut children = shifted_ranks(&hosts, &sandboxes, &root, SHIFT_NS, |program| {
        program.arg(env!("CARGO_BIN_EXE_neuron-bench")).args(["exec", "--iterations", "100000"]).arg(&hlo);
    });
    let logs = || {
        sandboxes
            .iter()
            .map(|s| std::fs::read_to_string(s.path().join("rank.log")).unwrap_or_default())
            .collect::<Vec<_>>()
    };
    // Read both hosts' records once the clocks are measured and collectives are done.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(50);
    let records = loop {
        std::thread::sleep(std::time::Duration::from_millis(300));
        let readers: Vec<_> = sandboxes.iter().filter_map(reader_in).collect();
        assert!(
            std::time::Instant::now() < deadline,
            "no collectives recorded on both hosts in time: {} datastores, clock {:?}, records {:?}; {:?}",
            readers.len(),
            readers.get(1).map(|r| r.clock_offset()),
            readers.iter().map(|r| r.communicators()).collect::<Vec<_>>(),
            logs()
        );
        if readers.len() < 2 || readers[1].clock_offset().is_none() {
            continue;
        }
        let records: Vec<RuntimeRecords> = readers.iter().map(|r| RuntimeRecords::read(r, r.liveness())).collect();
        let complete = |r: &RuntimeRecords| {
            let views = group_views(std::slice::from_ref(r), &StragglerRule::default(), 0);
            views.first().map_or(0, |v| v.collectives.iter().filter(|c| c.complete).count())
        };
        if records.iter().all(|r| complete(r) >= 20) {
            break records;
        }
    };
    for child in &mut children {
        let _ = child.kill();
        let _ = child.wait();
    }
    // The second host measured its clock 5 s off the first's, within what it states.
    let clock = records[1].clock.expect("measured");
    assert!(
        (clock.offset_ns + SHIFT_NS).unsigned_abs() <= clock.uncertainty_ns,
        "offset {} ns ± {} ns, the shift is -{SHIFT_NS} ns",
        clock.offset_ns,
        clock.uncertainty_ns
    );
    assert!(clock.uncertainty_ns < 10_000_000, "{clock:?}");
    eprintln!("the second host's clock against the first's: {clock:?}");
    // Each host's record alone shows both ranks on one time line: the collectives'
    // skews are those of the job (milliseconds), not the 5 s between the clocks.
    for (host, record) in records.iter().enumerate() {
        let view = &group_views(std::slice::from_ref(record), &StragglerRule::default(), 0)[0];
        assert_eq!(view.members.len(), 2, "host {host} shows both ranks");
        let mut skews: Vec<u64> = view.collectives.iter().filter(|c| c.complete).map(|c| c.skew_ns).collect();
        skews.sort_unstable();
        eprintln!(
            "host {host}: clock {clock:?}, median skew {} ns of {} collectives",
            skews[skews.len() / 2],
            skews.len()
        );
        assert!(skews[skews.len() / 2] < 100_000_000, "host {host}: skews {skews:?}");
        assert!(skews.iter().all(|&s| s < 2_500_000_000), "host {host}: skews {skews:?}");
        assert!(view.uncertainty_ns >= clock.uncertainty_ns.min(1), "{view:?}");
    }
}

#[test]
fn a_rank_hanging_on_another_host_is_described_by_what_its_process_last_said() {
    use neuron_datastore::ranks::{HangClass, RuntimeRecords, StragglerRule, group_views};
    let Some(hosts) = hosts() else { return };
    let root = format!("{}:{}", hosts.addresses[0], 41_000 + (std::process::id() + 2) % 20_000);
    let sandboxes = [Sandbox::new(), Sandbox::new()];
    let hlo = neuron_test_support::process::all_reduce_hlo(sandboxes[0].path(), 1024);
    // The second host's clock is 5 s ahead: what its process says is dated on the root's.
    let mut children = shifted_ranks(&hosts, &sandboxes, &root, 5_000_000_000, |program| {
        // The second rank never arrives at its sixth execution's all-reduce; the first
        // says so after 3 s, and gives up at 6 s.
        program.envs([("NEURON_RT_EXEC_TIMEOUT", "6"), ("NEURON_RT_FAULT_INJECT", "cc_hang:rank=1:after=5")]);
        program.arg(env!("CARGO_BIN_EXE_neuron-bench")).args(["exec", "--iterations", "100"]).arg(&hlo);
    });
    // Read on the first host only: the second's datastore is not there.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(40);
    let mut seen = None;
    let hang = loop {
        std::thread::sleep(std::time::Duration::from_millis(200));
        let log = std::fs::read_to_string(sandboxes[0].path().join("rank.log")).unwrap_or_default();
        assert!(std::time::Instant::now() < deadline, "no hang described in time: {seen:?}; {log}");
        let Some(reader) = reader_in(&sandboxes[0]) else { continue };
        let records = RuntimeRecords::read(&reader, reader.liveness());
        let now = neuron_datastore::ranks::root_now(std::slice::from_ref(&records));
        seen = group_views(std::slice::from_ref(&records), &StragglerRule::default(), now)
            .into_iter()
            .find_map(|v| v.hang);
        if let Some(hang) = seen.as_ref().filter(|h| h.text.contains("last seen")) {
            break hang.clone();
        }
    };
    for child in &mut children {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert_eq!((hang.class, hang.awaited.as_slice()), (HangClass::Missing, &[1][..]), "{}", hang.text);
    // `…, last seen executing `allreduce` at `r` 1.2 s ago)`: at its all-reduce, said
    // within the last two heartbeats (its own and the root's), not 5 s off.
    let said = hang.text.split("last seen executing `allreduce` at `r` ").nth(1).expect(&hang.text);
    let age = said.trim_end_matches(" ago)");
    let age_s = match age.split_once(' ') {
        Some((n, "ms")) => n.parse::<f64>().expect(age) / 1e3,
        Some((n, "s")) => n.parse::<f64>().expect(age),
        _ => panic!("{}", hang.text),
    };
    assert!(age_s < 3.0, "{}", hang.text);
    eprintln!("{}", hang.text);
}

/// The `cc_running` starts of each rank in a Chrome JSON trace: rank → sequence → µs.
fn collective_starts(json: &[u8]) -> std::collections::BTreeMap<u64, std::collections::BTreeMap<u64, f64>> {
    let trace: serde_json::Value = serde_json::from_slice(json).expect("a Chrome JSON trace");
    let mut starts: std::collections::BTreeMap<u64, std::collections::BTreeMap<u64, f64>> = Default::default();
    for e in trace["traceEvents"].as_array().expect("events") {
        if e["name"] == "cc_running" && matches!(e["ph"].as_str(), Some("B" | "X")) {
            let (Some(rank), Some(sequence), Some(ts)) =
                (e["args"]["rank"].as_u64(), e["args"]["sequence"].as_u64(), e["ts"].as_f64())
            else {
                continue;
            };
            starts.entry(rank).or_default().insert(sequence, ts);
        }
    }
    starts
}

#[test]
fn the_profiles_of_ranks_on_hosts_five_seconds_apart_export_on_one_clock() {
    let Some(hosts) = hosts() else { return };
    const SHIFT_NS: u64 = 5_000_000_000;
    let root = format!("{}:{}", hosts.addresses[0], 41_000 + (std::process::id() + 7) % 20_000);
    let sandboxes = [Sandbox::new(), Sandbox::new()];
    let profiles = sandboxes[0].path().join("profiles");
    let hlo = neuron_test_support::process::all_reduce_hlo(sandboxes[0].path(), 1024);
    // Each host's process records itself into the one directory, as its rank.
    let mut children = shifted_ranks(&hosts, &sandboxes, &root, SHIFT_NS as i64, |program| {
        program.arg(env!("CARGO_BIN_EXE_neuron-profile")).args(["inspect", "-o"]).arg(&profiles);
        program.arg(env!("CARGO_BIN_EXE_neuron-bench")).args(["exec", "--iterations", "40"]).arg(&hlo);
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    for (rank, child) in children.iter_mut().enumerate() {
        while child.try_wait().expect("waits").is_none() {
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let log = std::fs::read_to_string(sandboxes[rank].path().join("rank.log")).unwrap_or_default();
                panic!("rank {rank} did not finish in 90 s: {log}");
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
    let mut names: Vec<String> = std::fs::read_dir(&profiles)
        .expect("profiles")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into())
        .collect();
    names.sort();
    assert_eq!(names, ["profile_rank_0.ntff", "profile_rank_1.ntff"]);
    let export = |dir: &std::path::Path, out: &std::path::Path| {
        let output = Command::new(env!("CARGO_BIN_EXE_neuron-profile"))
            .args(["view", "-d"])
            .arg(dir)
            .args(["--output-format", "chrome-json", "--output-file"])
            .arg(out)
            .output()
            .expect("view runs");
        assert!(output.status.success(), "{}", text(&output));
        (collective_starts(&std::fs::read(out).expect("the trace")), text(&output))
    };
    // Each file alone stays on its own host's clock: the same collectives 5 s apart.
    let alone = sandboxes[1].path().join("alone");
    std::fs::create_dir(&alone).expect("mkdir");
    let gaps = |starts: &std::collections::BTreeMap<u64, std::collections::BTreeMap<u64, f64>>| -> Vec<f64> {
        starts[&1].iter().filter_map(|(sequence, t1)| Some(t1 - starts[&0].get(sequence)?)).collect()
    };
    let mut raw = std::collections::BTreeMap::new();
    for rank in 0..2 {
        let name = format!("profile_rank_{rank}.ntff");
        let dir = alone.join(rank.to_string());
        std::fs::create_dir(&dir).expect("mkdir");
        std::fs::copy(profiles.join(&name), dir.join(&name)).expect("copy");
        let out = alone.join(format!("{rank}.json"));
        let (starts, _) = export(&dir, &out);
        // A directory of one rank's file is moved too, by its own offset: read its own
        // clock from the file instead.
        let file = ntff::NtffFile::open(&dir.join(&name)).expect("opens");
        let shift = ntff::RootClock::of(&file).latest().map_or(0, |(offset, _)| offset);
        let own: std::collections::BTreeMap<u64, f64> =
            starts[&rank].iter().map(|(s, t)| (*s, t - shift as f64 / 1e3)).collect();
        raw.insert(rank, own);
    }
    let mut raw_gaps = gaps(&raw);
    raw_gaps.sort_by(f64::total_cmp);
    assert!(raw_gaps.len() >= 30, "{raw_gaps:?}");
    let median = raw_gaps[raw_gaps.len() / 2];
    assert!((median - SHIFT_NS as f64 / 1e3).abs() < 500_000.0, "on their own clocks 5 s apart: {median} µs");
    // Together, on rank 0's clock: the same collectives within milliseconds.
    let (together, said) = export(&profiles, &sandboxes[1].path().join("together.json"));
    assert!(said.contains("profile_rank_1.ntff: moved onto rank 0's clock by −5.0 s"), "{said}");
    let mut aligned = gaps(&together);
    aligned.sort_by(f64::total_cmp);
    let median = aligned[aligned.len() / 2];
    assert!(median.abs() < 100_000.0, "on one clock: median {median} µs apart; {aligned:?}");
}

/// `nccom-test` as rank `rank` of a two-rank job at `root` on host `rank`, with `env`
/// (a variable given `None` is removed), its output piped.
fn nccom_rank(
    hosts: &Hosts,
    sandbox: &Sandbox,
    (root, rank): (&str, usize),
    env: &[(&str, Option<&str>)],
    args: &[&str],
) -> std::process::Child {
    let mut program = Command::new(env!("CARGO_BIN_EXE_nccom-test"));
    sandbox
        .env(&mut program)
        .env("NEURON_RT_ROOT_COMM_ID", root)
        .env("NEURON_RT_LOG_LEVEL", "warn")
        .envs([("RANK", rank.to_string()), ("WORLD_SIZE", "2".to_owned())])
        .args(args);
    for (name, value) in env {
        match value {
            Some(value) => program.env(name, value),
            None => program.env_remove(name),
        };
    }
    hosts.run_in(rank, &program).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("starts")
}

#[test]
fn a_job_across_hosts_without_a_secret_is_refused_at_once_unless_the_network_is_said_trusted() {
    let Some(hosts) = hosts() else { return };
    let sandboxes = [Sandbox::new(), Sandbox::new()];
    let args = ["-r", "2", "allr", "-b", "1K", "-e", "1K", "-n", "3", "--check"];
    let no_secret = [("NEURON_VIRT_JOB_SECRET", None), ("NEURON_RT_EXEC_TIMEOUT", Some("8"))];
    let root = format!("{}:{}", hosts.addresses[0], 41_000 + (std::process::id() + 3) % 20_000);
    let mut rank0 = nccom_rank(&hosts, &sandboxes[0], (&root, 0), &no_secret, &args);
    let rank1 = nccom_rank(&hosts, &sandboxes[1], (&root, 1), &no_secret, &args).wait_with_output().expect("ends");
    // Rank 1 gives up at once, while rank 0 still waits for it (until its timeout).
    assert!(matches!(rank0.try_wait(), Ok(None)), "rank 1 ended before rank 0's timeout");
    let rank0 = rank0.wait_with_output().expect("ends");
    let (said0, said1) = (text(&rank0), text(&rank1));
    assert!(!rank1.status.success(), "{said1}");
    assert!(
        said1.contains("is on another host, and this job has no secret: set NEURON_VIRT_JOB_SECRET"),
        "rank 1 says what to set: {said1}"
    );
    assert!(said0.contains("refused a connection from") && said0.contains("on another host"), "{said0}");

    // Said trusted, the same job runs, and says so.
    let trusted = [("NEURON_VIRT_JOB_SECRET", None), ("NEURON_VIRT_TRUSTED_NETWORK", Some("1"))];
    let root = format!("{}:{}", hosts.addresses[0], 41_000 + (std::process::id() + 4) % 20_000);
    let children = [0, 1].map(|rank| nccom_rank(&hosts, &sandboxes[rank], (&root, rank), &trusted, &args));
    let outputs: Vec<Output> = children.into_iter().map(|c| c.wait_with_output().expect("ends")).collect();
    let log: String = outputs.iter().map(text).collect();
    assert!(outputs.iter().all(|o| o.status.success()), "{log}");
    assert!(log.contains("this job trusts its network"), "{log}");
}

#[test]
fn a_cut_link_shorter_than_the_timeout_is_survived_and_a_longer_one_fails_at_the_timeout_naming_the_link() {
    let Some(hosts) = hosts() else { return };
    let sandboxes = [Sandbox::new(), Sandbox::new()];
    let timeout = [("NEURON_RT_EXEC_TIMEOUT", Some("5"))];
    let args = ["-r", "2", "allr", "-b", "64M", "-e", "64M", "-n", "8", "--check"];
    // Cuts the link once 64 MiB crossed it, for `cut` (for good when `None`), and gives
    // each rank's output and how long it ran after the cut.
    let run = |port_offset: u32, cut: Option<Duration>| {
        let root = format!("{}:{}", hosts.addresses[0], 41_000 + (std::process::id() + port_offset) % 20_000);
        let before = hosts.link_sent_bytes(1);
        let children = [0, 1].map(|rank| nccom_rank(&hosts, &sandboxes[rank], (&root, rank), &timeout, &args));
        let started = Instant::now();
        while hosts.link_sent_bytes(1) < before + (64 << 20) {
            assert!(started.elapsed() < Duration::from_secs(120), "no all-reduce crossed the link");
            std::thread::sleep(Duration::from_millis(20));
        }
        hosts.set_link(1, false).expect("the link goes down");
        let cut_at = Instant::now();
        if let Some(cut) = cut {
            std::thread::sleep(cut);
            hosts.set_link(1, true).expect("the link comes back");
        }
        let outputs: Vec<(Output, Duration)> =
            children.into_iter().map(|c| (c.wait_with_output().expect("ends"), cut_at.elapsed())).collect();
        hosts.set_link(1, true).expect("the link comes back");
        outputs
    };

    let short = run(5, Some(Duration::from_millis(1500)));
    let log: String = short.iter().map(|(o, _)| text(o)).collect();
    assert!(short.iter().all(|(o, _)| o.status.success()), "a 1.5 s cut within a 5 s timeout: {log}");
    assert!(String::from_utf8_lossy(&short[0].0.stdout).lines().any(|l| l.ends_with(" ok")), "{log}");

    let long = run(6, None);
    let log: String = long.iter().map(|(o, _)| text(o)).collect();
    eprintln!(
        "with the link cut for good, the ranks ended {:?} after the cut, saying:\n{log}",
        long.iter().map(|(_, d)| d).collect::<Vec<_>>()
    );
    assert!(long.iter().all(|(o, _)| !o.status.success()), "{log}");
    // Both fail at the 5 s timeout (a send that moved bytes before the cut included),
    // not a second timeout later, naming the link.
    assert!(long.iter().all(|(_, after)| *after < Duration::from_secs(10)), "{log}");
    assert!(log.contains("the link is down or the host unreachable"), "{log}");
    assert!(!log.contains("is gone"), "a cut link is not a dead process: {log}");
}
