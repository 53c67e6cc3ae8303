//! Ranks on two hosts: two network namespaces joined by a veth pair, created (and
//! removed) by the test itself, each running one `nccom-test` process as one rank of a
//! torchrun-style job, with rank 0's address on the first host's interface. The second
//! host's link is slowed down (`tc netem` delay where the kernel has it, else a `tbf`
//! rate limit), and the traffic is seen crossing it. Needs root and `ip`; skipped with a
//! note elsewhere, and required in CI.

use std::process::{Command, Output, Stdio};

use neuron_test_support::hosts::Hosts;
use neuron_test_support::process::Sandbox;

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

#[test]
fn ranks_on_two_hosts_joined_by_a_slowed_link_run_and_check_their_collectives() {
    let hosts = match Hosts::create() {
        Ok(hosts) => hosts,
        Err(why) => {
            assert!(std::env::var("CI").as_deref() != Ok("true"), "CI runs as root with `ip`: {why}");
            eprintln!("skipped: cannot create network namespaces here ({why}); run as root");
            return;
        }
    };
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
