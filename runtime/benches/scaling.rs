//! Executions per second of one model on 1, 2, 4, 8 and 16 NeuronCores (as many of
//! those as the host has CPUs), every core executing back to back on its own thread,
//! beside the host's memory bandwidth measured in the same run with as many threads (a
//! STREAM triad over arrays far larger than the caches). For each core count it prints
//! the speed-up over one core, the memory traffic the executions need at the least
//! (their tensors' bytes, in and out, per execution) and that traffic's share of the
//! measured bandwidth, and says what bounds the curve there: the bandwidth (the traffic
//! near it), the CPU (executions near-linear in the cores), or neither (a resource the
//! cores share inside the runtime, which is then ours to fix). Each point starts a
//! runtime of as many host threads as cores, so that one core cannot borrow idle CPUs
//! for its large products and the speed-up is the cores' own.
//!
//! Run: `cargo bench -p neuron-runtime --bench scaling [-- SECONDS] [-- attention]`
//! (2 s per point, the MLP example by default). Results go in BENCHMARKS.md with the
//! CPU they ran on.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use neuron_runtime::config::CoreRequest;
use neuron_runtime::{CompileOptions, Config, CoreSet, InstanceType, Neff, Runtime, TensorSet};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const MODELS: [(&str, &str); 2] =
    [("mlp", include_str!("../../examples/mlp.hlo")), ("attention", include_str!("../../examples/attention.hlo"))];

/// Elements of each of the triad's three arrays: 32 MiB each, beyond any cache.
const TRIAD_LEN: usize = 8 << 20;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let seconds: f64 = args.iter().find_map(|a| a.parse().ok()).unwrap_or(2.0);
    let (name, hlo) = MODELS.iter().find(|(n, _)| args.iter().any(|a| a == n)).copied().unwrap_or(MODELS[0]);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let counts: Vec<usize> = [1, 2, 4, 8, 16].into_iter().filter(|&n| n <= cpus).collect();
    let neff = Neff::new(name, neuron_runtime::compile_hlo_with(hlo, &CompileOptions::default()).expect("compiles"));
    let neff = neff.encode();
    let cpu = neuron_test_support::runtime::cpu_model();
    println!("{cpu}, {cpus} CPUs; `{name}` with neuron-cc's defaults");
    println!(
        "{:>5} {:>13} {:>9} {:>11} {:>16} {:>15} {:>6}  bound by",
        "cores", "executions/s", "speed-up", "efficiency", "least traffic", "bandwidth", "share"
    );
    let mut triad = Triad::new();
    let mut one_core = 0.0;
    for &n in &counts {
        let lock_dir = tempfile::tempdir().expect("tempdir");
        let runtime = Runtime::start(Config {
            instance_type: InstanceType::Trn1_32xlarge,
            lock_dir: lock_dir.path().to_path_buf(),
            cores: CoreRequest::Visible(CoreSet::range(0, n as u32 - 1)),
            host_threads: n,
            ..Config::from_env().expect("configuration")
        })
        .expect("runtime");
        let (loaded, bytes_per_execution) = load(&runtime, &neff, n);
        // Half a second of warm-up, then the measured run.
        run(&runtime, &loaded, Duration::from_millis(500));
        let rate = run(&runtime, &loaded, Duration::from_secs_f64(seconds)) as f64 / seconds;
        if n == 1 {
            one_core = rate;
        }
        let bandwidth = triad.best_bytes_per_second(n);
        let traffic = rate * bytes_per_execution as f64;
        let (speed_up, share) = (rate / one_core, traffic / bandwidth);
        let efficiency = speed_up / n as f64;
        let bound = if share >= 0.7 {
            "memory bandwidth".to_string()
        } else if efficiency >= 0.8 {
            "the CPU (near-linear)".to_string()
        } else {
            format!("neither: {:.0}% of linear with {:.0}% of the bandwidth in use", efficiency * 100.0, share * 100.0)
        };
        println!(
            "{n:>5} {rate:>13.0} {speed_up:>8.2}x {:>10.0}% {:>11.2} GB/s {:>10.2} GB/s {:>5.0}%  {bound}",
            efficiency * 100.0,
            traffic / 1e9,
            bandwidth / 1e9,
            share * 100.0
        );
    }
}

/// The model loaded on each of `cores` cores, with its tensors in that core's memory,
/// and the bytes of one execution's tensors (in and out).
fn load(runtime: &Runtime, neff: &[u8], cores: usize) -> (Vec<(neuron_runtime::Model, TensorSet, TensorSet)>, u64) {
    let mut bytes_per_execution = 0;
    let loaded = (0..cores as u32)
        .map(|core| {
            let model = runtime.load(neff, Some(core)).expect("loads");
            let (inputs, outputs, bytes) = neuron_test_support::runtime::bind_filled(runtime, &model, core);
            bytes_per_execution = bytes;
            (model, inputs, outputs)
        })
        .collect();
    (loaded, bytes_per_execution)
}

/// Executions completed by every core of `loaded` executing back to back for `time`.
fn run(runtime: &Runtime, loaded: &[(neuron_runtime::Model, TensorSet, TensorSet)], time: Duration) -> u64 {
    let (done, stop) = (AtomicU64::new(0), AtomicBool::new(false));
    std::thread::scope(|scope| {
        for (model, inputs, outputs) in loaded {
            let (done, stop) = (&done, &stop);
            scope.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    runtime.execute(model, inputs, outputs).expect("executes");
                    done.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        std::thread::sleep(time);
        stop.store(true, Ordering::Relaxed);
    });
    done.load(Ordering::Relaxed)
}

/// STREAM's triad, `a = b + s·c`, over arrays beyond the caches.
struct Triad {
    a: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
}

impl Triad {
    fn new() -> Triad {
        Triad { a: vec![0.0; TRIAD_LEN], b: vec![1.0; TRIAD_LEN], c: vec![2.0; TRIAD_LEN] }
    }

    /// The best of five triads on `threads` threads, each its share of the arrays, in
    /// bytes moved (two arrays read, one written) per second.
    fn best_bytes_per_second(&mut self, threads: usize) -> f64 {
        let chunk = TRIAD_LEN.div_ceil(threads);
        let mut best = f64::INFINITY;
        for _ in 0..5 {
            let start = Instant::now();
            std::thread::scope(|scope| {
                for ((a, b), c) in self.a.chunks_mut(chunk).zip(self.b.chunks(chunk)).zip(self.c.chunks(chunk)) {
                    scope.spawn(move || {
                        for ((a, &b), &c) in a.iter_mut().zip(b).zip(c) {
                            *a = b + 3.0 * c;
                        }
                    });
                }
            });
            best = best.min(start.elapsed().as_secs_f64());
        }
        std::hint::black_box(&self.a);
        (3 * 4 * TRIAD_LEN) as f64 / best
    }
}
