//! What the flight record costs (`NEURON_VIRT_FLIGHT_RECORD`), in the same run:
//!
//! 1. End to end: a 1 MiB `f32` all-reduce of 4 ranks, each a runtime of its own with
//!    its own bootstrap connection and data links (as processes of one host), once with
//!    the flight record and once without, and a second job with the record as the noise
//!    floor (two identical jobs differ by this much); rounds turn between the three jobs
//!    so that they share the host's state; rank 0's median per call of each.
//! 2. The record's own work per collective of one rank, timed on its path: every
//!    method of `collectives/flight.rs` the runtime calls (its progress, its entry, the
//!    other ranks' arrivals as the messages bring them, its pace at its execution's
//!    start and end, its arrival and its departure) is timed where it is called
//!    (`trace-probe`'s `flight_record_cost`), over the job with the record, less what
//!    timing an empty span measures. On a 2-vCPU host the end-to-end difference is
//!    within the noise of the collective; this bounds it from below the noise.
//! 3. A training step's compute: the MLP example's execution on one core (median), to
//!    put a step's one all-reduce's record against.
//!
//! Run: `cargo bench -p neuron-runtime --bench flight`. Results go in BENCHMARKS.md.

use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

use neuron_datastore::topology::InstanceType;
use neuron_runtime::collectives::flight_record_cost;
use neuron_runtime::config::CoreRequest;
use neuron_runtime::launch::RootComm;
use neuron_runtime::{
    Communicator, Config, CoreSet, Neff, Runtime, Target, Tensor, TensorPlacement, TensorSet, compile_hlo,
};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const RANKS: usize = 4;
const BYTES: usize = 1 << 20;
const ROUNDS: usize = 12;
const CALLS: usize = 40;

fn runtime(lock_dir: &Path, root: Option<RootComm>, flight_record: bool) -> Runtime {
    Runtime::start(Config {
        lock_dir: lock_dir.to_path_buf(),
        instance_type: InstanceType::Trn1_32xlarge,
        cores: CoreRequest::Visible(CoreSet::range(0, 0)),
        root_comm: root,
        exec_timeout: Duration::from_secs(120),
        flight_record,
        ..Config::from_env().expect("configuration")
    })
    .expect("runtime")
}

/// A job of `RANKS` runtimes joined in one communicator, with each rank's tensors.
struct Job {
    _locks: Vec<tempfile::TempDir>,
    _runtimes: Vec<Runtime>,
    ranks: Vec<(Communicator, (Tensor, Tensor))>,
}

fn job(flight_record: bool) -> Job {
    let locks: Vec<tempfile::TempDir> = (0..RANKS).map(|_| tempfile::tempdir().expect("tempdir")).collect();
    let port = TcpListener::bind("127.0.0.1:0").expect("binds").local_addr().expect("address").port();
    let root = RootComm { host: "127.0.0.1".into(), port, from: "NEURON_RT_ROOT_COMM_ID" };
    let runtimes: Vec<Runtime> = locks.iter().map(|l| runtime(l.path(), Some(root.clone()), flight_record)).collect();
    let comms: Vec<Communicator> = runtimes
        .iter()
        .enumerate()
        .map(|(r, rt)| rt.join_communicator("flight", 0, r as u32, RANKS as u32).expect("joins"))
        .collect();
    for comm in &comms {
        comm.wait_for_ranks(Instant::now() + Duration::from_secs(60)).expect("every rank joins");
    }
    let ranks = runtimes
        .iter()
        .zip(comms)
        .map(|(rt, comm)| {
            let placement = TensorPlacement::Device { core: 0 };
            let x = rt.allocate_tensor(placement, BYTES as u64, "x").expect("alloc");
            x.write(0, &vec![1u8; BYTES]).expect("write");
            (comm, (x, rt.allocate_tensor(placement, BYTES as u64, "y").expect("alloc")))
        })
        .collect();
    Job { _locks: locks, _runtimes: runtimes, ranks }
}

/// `CALLS` all-reduces, one thread per rank; rank 0's time of each.
fn all_reduces(job: &Job) -> Vec<f64> {
    neuron_test_support::runtime::all_reduce_times(&job.ranks, CALLS)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The MLP example's execution on one core: median seconds of 100.
fn mlp_step() -> f64 {
    let lock = tempfile::tempdir().expect("tempdir");
    let rt = runtime(lock.path(), None, true);
    let hlo = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/mlp.hlo")).expect("mlp.hlo");
    let neff = Neff::new("mlp", compile_hlo(&hlo, Target::Trn1).expect("compiles")).encode();
    let model = rt.load(&neff, None).expect("load");
    let bind = |io: &[neuron_runtime::isa::IoTensor], what: &str| {
        let mut set = TensorSet::new();
        for tensor in io {
            let bound = rt.allocate_tensor_for(TensorPlacement::Host, model.tensor_type(tensor), what).expect("alloc");
            set.add(&tensor.name, bound);
        }
        set
    };
    let (inputs, outputs) = (bind(model.inputs(), "in"), bind(model.outputs(), "out"));
    for _ in 0..10 {
        rt.execute(&model, &inputs, &outputs).expect("execute");
    }
    median(
        (0..100)
            .map(|_| {
                let started = Instant::now();
                rt.execute(&model, &inputs, &outputs).expect("execute");
                started.elapsed().as_secs_f64()
            })
            .collect(),
    )
}

fn main() {
    // A second job with the record is the noise floor: on / on again says how far two
    // identical jobs differ on this host.
    let (on, again, off) = (job(true), job(true), job(false));
    let (mut with, mut with_again, mut without) = (Vec::new(), Vec::new(), Vec::new());
    // The record's own work, timed where the collectives do it, over the job with the
    // record only (the other job's calls are taken off before each of its batches).
    let empty_span_ns = flight_record_cost::empty_span_ns();
    let (mut record_ns, mut spans) = (0u64, 0u64);
    let mut timed = |job: &Job, into: &mut Vec<f64>, counted: bool| {
        flight_record_cost::take();
        into.extend(all_reduces(job));
        let (ns, n) = flight_record_cost::take();
        if counted {
            record_ns += ns;
            spans += n;
        }
    };
    for round in 0..ROUNDS {
        // Which goes first turns too.
        for k in 0..3 {
            match (round + k) % 3 {
                0 => timed(&on, &mut with, true),
                1 => timed(&off, &mut without, false),
                _ => timed(&again, &mut with_again, false),
            }
        }
    }
    let (t_with, t_again, t_without) = (median(with), median(with_again), median(without));
    println!("1 MiB f32 all-reduce of {RANKS} ranks (a runtime each), rank 0's median of {} calls:", ROUNDS * CALLS);
    println!("  flight record on   {:>9.1} µs", t_with * 1e6);
    println!("  the same, again    {:>9.1} µs", t_again * 1e6);
    println!("  flight record off  {:>9.1} µs", t_without * 1e6);
    println!(
        "  on / off           {:>9.3}   (on / the same again: {:.3}, the noise floor)",
        t_with / t_without,
        t_with / t_again
    );
    // Per collective of one rank: every rank's calls, less the timing's own share.
    let collectives = (RANKS * ROUNDS * CALLS) as f64;
    let work = (record_ns as f64 - spans as f64 * empty_span_ns).max(0.0) / collectives / 1e9;
    println!(
        "the record's own work per collective of one rank, timed on its path: {:.2} µs ({:.1} calls of it per \
         collective, less {empty_span_ns:.0} ns of timing each)",
        work * 1e6,
        spans as f64 / collectives
    );
    println!("  against the all-reduce (record off): {:.3}%", 100.0 * work / t_without);
    let step = mlp_step();
    println!("a step's compute, the MLP example on one core: {:.1} µs", step * 1e6);
    println!(
        "  one all-reduce's record against the step and its all-reduce: {:.4}%",
        100.0 * work / (step + t_without)
    );
}
