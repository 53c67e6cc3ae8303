//! "Hosts" for tests and benchmarks of jobs of several machines: two network
//! namespaces joined by a veth pair, created here and removed when dropped. Creating
//! them needs root and `ip` (iproute2); [`Hosts::create`] says why it could not. A job
//! across hosts needs a secret its processes share (`NEURON_VIRT_JOB_SECRET`): every
//! program run in a namespace is given the hosts' own, unless it removes the variable.

use std::process::Command;

/// Two namespaces joined by a veth pair, removed when dropped.
#[derive(Debug)]
pub struct Hosts {
    /// The namespaces' names.
    pub names: [String; 2],
    /// Each namespace's IPv4 address on the link.
    pub addresses: [String; 2],
    /// Each namespace's end of the veth pair.
    pub devices: [String; 2],
    /// The job secret every program run in them is given.
    pub secret: String,
}

/// The variable the job secret is given in.
pub const ENV_JOB_SECRET: &str = "NEURON_VIRT_JOB_SECRET";

fn ip(args: &[&str]) -> Result<(), String> {
    let output = Command::new("ip").args(args).output().map_err(|e| format!("ip: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr).trim()))
    }
}

impl Hosts {
    /// Two fresh namespaces (named after this process and the call) joined by a veth
    /// pair, with an address of a /24 of their own each, links up.
    pub fn create() -> Result<Hosts, String> {
        // Unique per test process and per call in it (tests of one binary run at once).
        static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 8;
        let id = std::process::id() % 6_250 * 8 + call;
        let names = [format!("nvh{id}a"), format!("nvh{id}b")];
        let devices = [format!("nvv{id}a"), format!("nvv{id}b")];
        // A /24 of 10.0.0.0/8 per test process.
        let net = format!("10.{}.{}", 100 + id / 256 % 100, id % 256);
        let addresses = [format!("{net}.1"), format!("{net}.2")];
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let secret = format!("hosts-{id}-{nanos:x}");
        let hosts = Hosts { names, addresses, devices, secret };
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

    /// `program` run in host `k`'s namespace, with the hosts' job secret unless it
    /// removes [`ENV_JOB_SECRET`] or sets its own.
    pub fn run_in(&self, k: usize, program: &Command) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.names[k]]).arg(program.get_program()).args(program.get_args());
        command.env(ENV_JOB_SECRET, &self.secret);
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
    pub fn slow_down(&self, k: usize) -> Result<&'static str, String> {
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

    /// Takes host `k`'s end of the link down (`up: false`) or brings it back.
    pub fn set_link(&self, k: usize, up: bool) -> Result<(), String> {
        ip(&["-n", &self.names[k], "link", "set", &self.devices[k], if up { "up" } else { "down" }])
    }

    /// Bytes host `k`'s end of the link has sent, as its interface counts them.
    pub fn link_sent_bytes(&self, k: usize) -> u64 {
        let file = format!("/sys/class/net/{}/statistics/tx_bytes", self.devices[k]);
        let output =
            Command::new("ip").args(["netns", "exec", &self.names[k], "cat", &file]).output().expect("ip runs");
        String::from_utf8_lossy(&output.stdout).trim().parse().unwrap_or(0)
    }

    /// Bytes the qdisc of host `k`'s link has sent.
    pub fn sent_bytes(&self, k: usize) -> u64 {
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
