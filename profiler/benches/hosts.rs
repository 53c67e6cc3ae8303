//! Collectives between two hosts against a plain socket copy between the same hosts, in
//! the same run.
//!
//! The hosts are two network namespaces joined by a veth pair, created here and removed
//! at the end (root and `ip` needed; elsewhere the bench says so and stops). The
//! baseline is this program copying bytes over one TCP connection between the two
//! namespaces in both directions at once, 1 MiB writes and reads, as an all-reduce of
//! two ranks moves them (each sends its whole input to the other): its bandwidth is the
//! bytes each side sent over the time both took. Then one `nccom-test` process per
//! host, each one rank of a torchrun-style job whose root is on the first host, runs
//! `f32` all-reduces of 1 to 64 MiB; rank 0's bus bandwidth (for two ranks, the size
//! over the time) against the baseline is the ratio.
//!
//! Run: `cargo bench -p neuron-profiler --bench hosts`. Results go in BENCHMARKS.md.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use neuron_test_support::hosts::Hosts;
use neuron_test_support::process::Sandbox;

/// Bytes each side of the baseline sends.
const COPY_BYTES: usize = 2 << 30;
const CHUNK: usize = 1 << 20;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let [_, mode, address] = &args[..]
        && (mode == "--listen" || mode == "--connect")
    {
        copy_peer(mode == "--listen", address);
        return;
    }
    let hosts = match Hosts::create() {
        Ok(hosts) => hosts,
        Err(why) => {
            println!("cannot create network namespaces here ({why}): run as root, with iproute2");
            return;
        }
    };
    let port = 42_000 + std::process::id() % 20_000;
    let copy = socket_copy(&hosts, &format!("{}:{port}", hosts.addresses[0]));
    println!("plain TCP copy between the namespaces, both directions at once: {:.2} GB/s each way", copy / 1e9);
    let rows = all_reduces(&hosts, &format!("{}:{}", hosts.addresses[0], port + 1));
    println!("{:>10} {:>12} {:>7}", "bytes", "busbw GB/s", "ratio");
    for (bytes, busbw) in rows {
        println!("{bytes:>10} {busbw:>12.2} {:>7.2}", busbw * 1e9 / copy);
    }
}

/// The baseline's bandwidth each way, in bytes per second: the slower side's.
fn socket_copy(hosts: &Hosts, address: &str) -> f64 {
    let me = std::env::current_exe().expect("this program");
    let spawn = |k: usize, mode: &str| {
        let mut program = Command::new(&me);
        program.args([mode, address]);
        hosts.run_in(k, &program).stdout(Stdio::piped()).spawn().expect("starts")
    };
    let listener = spawn(0, "--listen");
    // The listener is up once it says so; the connecting side retries meanwhile.
    let connector = spawn(1, "--connect");
    let seconds: Vec<f64> = [listener, connector]
        .into_iter()
        .map(|child| {
            let output = child.wait_with_output().expect("ends");
            assert!(output.status.success(), "a copy peer failed");
            String::from_utf8_lossy(&output.stdout).trim().parse().expect("seconds")
        })
        .collect();
    COPY_BYTES as f64 / seconds.iter().copied().fold(0.0, f64::max)
}

/// One side of the baseline: sends [`COPY_BYTES`] while it receives as many; prints
/// the seconds both took from the connection on.
fn copy_peer(listen: bool, address: &str) {
    let stream = if listen {
        TcpListener::bind(address).expect("binds").accept().expect("accepts").0
    } else {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match TcpStream::connect(address) {
                Ok(stream) => break stream,
                Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => panic!("cannot connect to {address}: {e}"),
            }
        }
    };
    let started = Instant::now();
    let mut writer = stream.try_clone().expect("clones");
    let sending = std::thread::spawn(move || {
        let chunk = vec![7u8; CHUNK];
        for _ in 0..COPY_BYTES / CHUNK {
            writer.write_all(&chunk).expect("sends");
        }
    });
    let mut reader = stream;
    let mut buffer = vec![0u8; CHUNK];
    let mut received = 0;
    while received < COPY_BYTES {
        match reader.read(&mut buffer).expect("receives") {
            0 => panic!("the peer closed after {received} bytes"),
            n => received += n,
        }
    }
    sending.join().expect("sent");
    println!("{}", started.elapsed().as_secs_f64());
}

/// `nccom-test` all-reduces between the hosts: rank 0's (bytes, bus bandwidth in GB/s).
fn all_reduces(hosts: &Hosts, root: &str) -> Vec<(u64, f64)> {
    let sandboxes = [Sandbox::new(), Sandbox::new()];
    let children: Vec<_> = (0..2)
        .map(|rank| {
            let mut program = Command::new(env!("CARGO_BIN_EXE_nccom-test"));
            sandboxes[rank]
                .env(&mut program)
                .env("NEURON_RT_ROOT_COMM_ID", root)
                .envs([("RANK", rank.to_string()), ("WORLD_SIZE", "2".to_owned())])
                .args(["-r", "2", "allr", "-b", "1M", "-e", "64M", "-f", "4", "-n", "10"]);
            hosts.run_in(rank, &program).stdout(Stdio::piped()).spawn().expect("starts")
        })
        .collect();
    let outputs: Vec<_> = children.into_iter().map(|c| c.wait_with_output().expect("ends")).collect();
    assert!(outputs.iter().all(|o| o.status.success()), "an nccom-test rank failed");
    let table = String::from_utf8_lossy(&outputs[0].stdout);
    table
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let columns: Vec<&str> = line.split_whitespace().collect();
            Some((columns.first()?.parse().ok()?, columns.get(5)?.parse().ok()?))
        })
        .collect()
}
