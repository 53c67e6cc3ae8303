//! Shared by the browser test and the load benchmark: a demo workload and the
//! `neuron-dashboard` binary, started in a sandbox.
#![allow(dead_code, unreachable_pub)]

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use crate::support::{Running, Sandbox, neuron_bench};

/// `neuron-bench demo` without its own dashboard, with `args` and `env` added.
pub fn demo(sandbox: &Sandbox, args: &[&str], env: &[(&str, &str)]) -> Running {
    let mut command = Command::new(neuron_bench());
    sandbox.env(&mut command).args(["demo", "--no-dashboard"]).args(args).envs(env.iter().copied());
    Running(command.stdout(Stdio::null()).spawn().expect("the workload starts"))
}

/// The dashboard on a free loopback port with `args`, and its address (`http://…`,
/// without the final slash), as it prints it.
pub fn dashboard(sandbox: &Sandbox, args: &[&OsStr]) -> (Running, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_neuron-dashboard"));
    sandbox.env(&mut command).args(["--listen", "127.0.0.1:0"]).args(args).stderr(Stdio::piped());
    let mut running = Running(command.spawn().expect("the dashboard starts"));
    let mut line = String::new();
    BufReader::new(running.0.stderr.take().expect("stderr")).read_line(&mut line).expect("the address");
    let url = line.split_whitespace().find(|w| w.starts_with("http://")).expect("serving http://…");
    (running, url.trim_end_matches('/').to_string())
}
