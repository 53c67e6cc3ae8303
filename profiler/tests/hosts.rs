//! Ranks on two hosts: two network namespaces joined by a veth pair, created (and
//! removed) by the test itself, each running one `nccom-test` process as one rank of a
//! torchrun-style job, with rank 0's address on the first host's interface. The second
//! host's link is slowed down (`tc netem` delay where the kernel has it, else a `tbf`
//! rate limit), and the traffic is seen crossing it. Needs root and `ip`; skipped with a
//! note elsewhere, and required in CI.

use std::process::{Command, Output, Stdio};

use neuron_test_support::process::Sandbox;

/// Two namespaces joined by a veth pair, removed when dropped.
struct Hosts {
    names: [String; 2],
    addresses: [String; 2],
    devices: [String; 2],
}

fn ip(args: &[&str]) -> Result<(), String> {
    let output = Command::new("ip").args(args).output().map_err(|e| format!("ip: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr).trim()))
    }
}

impl Hosts {
    fn create() -> Result<Hosts, String> {
        let id = std::process::id() % 50_000;
        let names = [format!("nvh{id}a"), format!("nvh{id}b")];
        let devices = [format!("nvv{id}a"), format!("nvv{id}b")];
        // A /24 of 10.0.0.0/8 per test process.
        let net = format!("10.{}.{}", 100 + id / 256 % 100, id % 256);
        let addresses = [format!("{net}.1"), format!("{net}.2")];
        let hosts = Hosts { names, addresses, devices };
        for name in &hosts.names {
            ip(&["netns", "add", name])?;
        }
        ip(&["link", "add", &hosts.devices[0], "type", "veth", "peer", "name", &hosts.devices[1]])?;
        for k in 0..2 {
            let (ns, dev) = (&hosts.names[k], &hosts.devices[k]);
            ip(&["link", "set", dev, "netns", ns])?;
            ip(&["-n", ns, "addr", "add", &format!("{}/24", hosts.addresses[k]), "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(hosts)
    }

    /// `program` run in host `k`'s namespace.
    fn run_in(&self, k: usize, program: &Command) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.names[k]]).arg(program.get_program()).args(program.get_args());
        for (name, value) in program.get_envs() {
            match value {
                Some(value) => command.env(name, value),
                None => command.env_remove(name),
            };
        }
        command
    }

    /// Slows host `k`'s side of the link: a 20 ms delay, or a 200 Mbit/s rate where the
    /// kernel has no `netem`. Returns which.
    fn slow_down(&self, k: usize) -> Result<&'static str, String> {
        let tc = |args: &[&str]| -> Result<(), String> {
            let output = Command::new("ip")
                .args(["netns", "exec", &self.names[k], "tc", "qdisc", "add", "dev", &self.devices[k], "root"])
                .args(args)
                .output()
                .map_err(|e| format!("tc: {e}"))?;
            if output.status.success() {
                Ok(())
            } else {
                Err(String::from_utf8_lossy(&output.stderr).trim().to_owned())
            }
        };
        match tc(&["netem", "delay", "20ms"]) {
            Ok(()) => Ok("netem delay 20ms"),
            Err(netem) => {
                eprintln!("note: no netem qdisc in this kernel ({netem}); rate-limiting the link instead");
                tc(&["tbf", "rate", "200mbit", "burst", "64kb", "latency", "100ms"]).map(|()| "tbf rate 200mbit")
            }
        }
    }

    /// Bytes the qdisc of host `k`'s link has sent.
    fn sent_bytes(&self, k: usize) -> u64 {
        let output = Command::new("ip")
            .args(["netns", "exec", &self.names[k], "tc", "-s", "qdisc", "show", "dev", &self.devices[k]])
            .output()
            .expect("tc runs");
        let text = String::from_utf8_lossy(&output.stdout);
        text.split_whitespace()
            .skip_while(|w| *w != "Sent")
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no `Sent N bytes` in {text}"))
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for name in &self.names {
            let _ = ip(&["netns", "del", name]);
        }
    }
}

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
