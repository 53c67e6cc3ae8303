//! Load test: 100 pages on the live feed at once for 30 s, on loopback, while a
//! workload runs. Each update carries the wall-clock time it was sent; a client's delay
//! is when it finished reading the update minus that. Also the dashboard's CPU and
//! memory, against the same dashboard serving one page over the same time.
//!
//! `cargo bench -p neuron-dashboard --bench load [-- CLIENTS SECONDS]`

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use neuron_test_support::process::{Sandbox, cpu_ns, memory};

/// The dashboard binary these tests run.
const DASHBOARD: &str = env!("CARGO_BIN_EXE_neuron-dashboard");

fn now_ms() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

/// Reads the live feed until `until`, sending each update's delay in milliseconds.
/// Returns how many updates it read, and how many showed the workload.
fn client(addr: SocketAddr, until: Instant, delays: mpsc::Sender<f64>) -> Result<(u64, u64), String> {
    let mut stream = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).map_err(|e| e.to_string())?;
    write!(stream, "GET /api/live HTTP/1.1\r\nHost: localhost\r\n\r\n").map_err(|e| e.to_string())?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).map_err(|e| e.to_string())?;
    if !line.contains(" 200 ") {
        return Err(format!("refused: {}", line.trim()));
    }
    let (mut updates, mut busy, mut history) = (0, 0, false);
    while Instant::now() < until {
        line.clear();
        if reader.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
            return Err("the stream ended".into());
        }
        // The last minute, sent first on connecting, is not timed.
        if line.starts_with("event:") {
            history = line.trim_end() == "event: history";
            continue;
        }
        let Some(data) = line.strip_prefix("data:").filter(|_| !history) else { continue };
        let received = now_ms();
        let update: serde_json::Value = serde_json::from_str(data.trim()).map_err(|e| e.to_string())?;
        let sent = update["sent_at_ms"].as_f64().ok_or("no sent_at_ms")?;
        let _ = delays.send(received - sent);
        updates += 1;
        let cores = update["runtimes"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|r| r["cores"].as_array().into_iter().flatten());
        busy += u64::from(cores.clone().any(|c| c["utilization"].as_f64().is_some_and(|u| u > 0.0)));
    }
    Ok((updates, busy))
}

struct Run {
    delays: Vec<f64>,
    updates: Vec<(u64, u64)>,
    cpu_percent: f64,
    rss: u64,
}

fn run(addr: SocketAddr, pid: u32, clients: usize, seconds: u64) -> Run {
    let until = Instant::now() + Duration::from_secs(seconds) + Duration::from_secs(2);
    let (tx, rx) = mpsc::channel();
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let tx = tx.clone();
            std::thread::spawn(move || client(addr, until, tx))
        })
        .collect();
    drop(tx);
    // Measured after every client is connected and past its first update.
    std::thread::sleep(Duration::from_secs(2));
    let (cpu0, t0) = (cpu_ns(pid), Instant::now());
    let mut delays = Vec::new();
    while let Ok(delay) = rx.recv() {
        if t0.elapsed() > Duration::ZERO {
            delays.push(delay);
        }
        if t0.elapsed() >= Duration::from_secs(seconds) {
            break;
        }
    }
    let cpu_percent = (cpu_ns(pid) - cpu0) as f64 / t0.elapsed().as_nanos() as f64 * 100.0;
    let rss = memory(pid).0;
    let updates = threads.into_iter().map(|t| t.join().expect("client").expect("the client's stream")).collect();
    Run { delays, updates, cpu_percent, rss }
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn main() {
    let numbers: Vec<u64> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let clients = numbers.first().copied().unwrap_or(100) as usize;
    let seconds = numbers.get(1).copied().unwrap_or(30);
    let sandbox = Sandbox::new();
    // A workload on one of the two cores: a busy host, with room left for the clients.
    let _workload = neuron_test_support::process::demo(&sandbox, &[], &[("NEURON_RT_VISIBLE_CORES", "0")]);
    let max_streams = (clients + 8).to_string();
    let (dashboard, url) = neuron_test_support::process::dashboard(
        &sandbox,
        DASHBOARD.as_ref(),
        &["--max-streams".as_ref(), max_streams.as_ref()],
    );
    let addr: SocketAddr = url.trim_start_matches("http://").parse().expect("an address");
    let pid = dashboard.0.id();
    std::thread::sleep(Duration::from_secs(3));

    let one = run(addr, pid, 1, seconds);
    let mut many = run(addr, pid, clients, seconds);
    many.delays.sort_by(f64::total_cmp);
    let mut single = one.delays.clone();
    single.sort_by(f64::total_cmp);
    let counts = many.updates.iter().map(|u| u.0);
    let (min_updates, max_updates) = (counts.clone().min().unwrap_or(0), counts.max().unwrap_or(0));
    let showing: u64 = many.updates.iter().map(|u| u.1).sum();
    let total: u64 = many.updates.iter().map(|u| u.0).sum();
    assert!(showing * 10 >= total * 9, "only {showing} of {total} updates showed the workload's busy core");
    println!("live feed on loopback, {seconds} s measured, a workload on one core, 2-vCPU host");
    println!("| pages | updates received | delay p50 | p99 | max | dashboard CPU (one core) | RSS |");
    println!("|---|---|---|---|---|---|---|");
    for (n, r, d) in [(1, &one, &single), (clients, &many, &many.delays)] {
        println!(
            "| {n} | {} | {:.1} ms | {:.1} ms | {:.1} ms | {:.2}% | {:.1} MiB |",
            d.len(),
            percentile(d, 0.5),
            percentile(d, 0.99),
            d[d.len() - 1],
            r.cpu_percent,
            r.rss as f64 / (1 << 20) as f64
        );
    }
    println!("updates per page: {min_updates} to {max_updates}; {showing} of {total} show the workload's core busy");
    println!(
        "ratio: {clients} pages cost {:.1}x the CPU of one ({:.3}% of a core per extra page)",
        many.cpu_percent / one.cpu_percent.max(1e-9),
        (many.cpu_percent - one.cpu_percent) / (clients - 1).max(1) as f64
    );
    let p99 = percentile(&many.delays, 0.99);
    assert!(p99 <= 200.0, "p99 delay {p99:.1} ms is over 200 ms");
}
