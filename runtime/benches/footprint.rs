//! What the always-on observability costs in shared memory: a runtime's datastore file,
//! its length and the memory it holds (tmpfs pages), idle a second after `Runtime::start`
//! and busy after every held core has executed the MLP example for a few seconds
//! (every ring wrapped), with the default rings against rings of 2²⁰ events (what
//! the default was before, and what a profile asks for), both measured in this run.
//!
//! Run: `cargo bench -p neuron-runtime --bench footprint`. Results go in BENCHMARKS.md.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use neuron_runtime::config::CoreRequest;
use neuron_runtime::{Config, CoreSet, Neff, Runtime, Target, TensorPlacement, TensorSet, compile_hlo};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// How long each core executes before the busy figure.
const BUSY_FOR: Duration = Duration::from_secs(3);
/// The ring size the default was before, and the one a profile asks for.
const LARGE_RINGS: u64 = neuron_datastore::INSPECT_MAX_EVENTS_PER_NC;

const MIB: f64 = 1024.0 * 1024.0;

fn main() {
    let dirs = tempfile::tempdir().expect("tempdir");
    let mlp = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/mlp.hlo"))
        .expect("examples/mlp.hlo");
    let program = compile_hlo(&mlp, Target::Trn1).expect("compile the MLP example");
    let neff = Neff::new("mlp", program).encode();
    println!(
        "datastore per runtime: file length and memory held (tmpfs pages), MiB; busy = after {BUSY_FOR:?} of the MLP example on every core"
    );
    println!(
        "{:>5} {:>10} {:>10} {:>10} {:>10} {:>10} {:>14}",
        "cores", "rings", "length", "idle", "busy", "busy/core", "events/s/core"
    );
    for cores in [1u32, 2] {
        let mut busy_large = 0.0;
        for rings in [LARGE_RINGS, neuron_datastore::DEFAULT_MAX_EVENTS_PER_NC] {
            let runtime = Runtime::start(Config {
                lock_dir: dirs.path().join("locks"),
                cores: CoreRequest::Visible(CoreSet::range(0, cores - 1)),
                inspect: neuron_datastore::InspectConfig { max_events_per_nc: rings, ..Config::default().inspect },
                ..Config::from_env().expect("configuration")
            })
            .expect("runtime");
            let path = runtime.datastore_path().expect("datastore");
            // The rings are faulted in by a background thread as the runtime starts.
            std::thread::sleep(Duration::from_secs(1));
            let (length, idle) = held(&path);
            let events_per_second = run_every_core(&runtime, &neff, cores);
            let (_, busy) = held(&path);
            let per_core = busy / f64::from(cores);
            print!(
                "{cores:>5} {rings:>10} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>14.0}",
                length / MIB,
                idle / MIB,
                busy / MIB,
                per_core / MIB,
                events_per_second
            );
            if rings == LARGE_RINGS {
                busy_large = busy;
                println!();
            } else {
                println!("   ratio to 2^20 rings {:.3}", busy / busy_large);
            }
            runtime.close().expect("close");
        }
    }
}

/// The file's length and the bytes of memory it holds.
fn held(path: &Path) -> (f64, f64) {
    let meta = std::fs::metadata(path).expect("datastore file");
    (meta.len() as f64, meta.blocks() as f64 * 512.0)
}

/// Executes the MLP on every held core at once for [`BUSY_FOR`]; trace events per
/// second per core, from the rings' counters.
fn run_every_core(runtime: &Runtime, neff: &[u8], cores: u32) -> f64 {
    let reader = neuron_datastore::DatastoreReader::open(&runtime.datastore_path().expect("path")).expect("reader");
    let produced = || reader.snapshot().rings.iter().map(|s| s.produced).sum::<u64>();
    let before = produced();
    let started = Instant::now();
    std::thread::scope(|scope| {
        for core in 0..cores {
            scope.spawn(move || {
                let model = runtime.load(neff, Some(core)).expect("load");
                let placement = TensorPlacement::Device { core };
                let (mut inputs, mut outputs) = (TensorSet::new(), TensorSet::new());
                for (set, ios) in [(&mut inputs, model.inputs()), (&mut outputs, model.outputs())] {
                    for io in ios {
                        let tensor =
                            runtime.allocate_tensor_for(placement, model.tensor_type(io), &io.name).expect("allocate");
                        set.add(&io.name, tensor);
                    }
                }
                while started.elapsed() < BUSY_FOR {
                    runtime.execute(&model, &inputs, &outputs).expect("execute");
                }
            });
        }
    });
    (produced() - before) as f64 / started.elapsed().as_secs_f64() / f64::from(cores)
}
