//! What the flight record costs (`NEURON_VIRT_FLIGHT_RECORD`), in the same run:
//!
//! 1. End to end: a 1 MiB `f32` all-reduce of 4 ranks, each a runtime of its own with
//!    its own bootstrap connection and data links (as processes of one host), once with
//!    the flight record and once without; rounds alternate between the two jobs so that
//!    they share the host's state; rank 0's median per call of each.
//! 2. The record's own work per collective of one rank, timed alone: what
//!    `collectives/flight.rs` writes for a rank of 4 in its own process (its progress
//!    three times, its entry, the wait cleared, the three other ranks' arrivals as the
//!    messages bring them, two readings of the clock), through the datastore writer,
//!    and its pace (a lock and a clock reading at its execution's start and end, its
//!    arrival and its departure: what it did before it arrived).
//!    On a 2-vCPU host the end-to-end difference is within the noise of the collective;
//!    this bounds it from below the noise.
//! 3. A training step's compute: the MLP example's execution on one core (median), to
//!    put a step's one all-reduce's record against.
//!
//! Run: `cargo bench -p neuron-runtime --bench flight`. Results go in BENCHMARKS.md.

use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

use neuron_datastore::clock::{CalibrationPoint, DeviceClock, TickSource, monotonic_ns};
use neuron_datastore::flight::{Before, CollectiveEntry, CommunicatorEntry, Position, Progress, RankMember};
use neuron_datastore::topology::InstanceType;
use neuron_datastore::{CollectiveAlgorithm, CollectiveOp, CommandIdentity, CreateParams, DatastoreWriter, Engine};
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

/// The record's work per collective of one rank of `RANKS` in its own process, in
/// seconds: the mean over many collectives.
fn record_work() -> f64 {
    let dir = tempfile::tempdir().expect("tempdir");
    let calibration = CalibrationPoint::now();
    let writer = DatastoreWriter::create(&CreateParams {
        dir: dir.path().join("ds"),
        tag: None,
        instance_type: "trn1.32xlarge".into(),
        device_count: 16,
        cores_per_device: 2,
        device_memory_bytes: 32 << 30,
        instance_core_count: 32,
        cores: vec![0],
        ring_capacity: 1 << 10,
        model_slots: 16,
        string_table_bytes: 1 << 20,
        instruction_table_bytes: 1 << 20,
        tick_source: TickSource::MonotonicNs,
        calibration,
        ns_per_tick: 1.0,
        device_clocks: vec![DeviceClock::for_core(0, calibration.ticks, 1.0)],
        recording: 0,
        host_threads: 1,
        product_kernel: Default::default(),
        command: CommandIdentity::of_this_process(),
    })
    .expect("datastore");
    let entry = CommunicatorEntry { id: 7, name: "flight".into(), ranks: RANKS as u32, across: true };
    let slot = writer.open_communicator(&entry).expect("a slot");
    for rank in 0..RANKS as u32 {
        let member = RankMember {
            pid: 100 + rank,
            host: "h".into(),
            core: (rank == 0).then_some(0),
            in_this_process: rank == 0,
        };
        writer.set_rank_member(slot, rank, &member);
    }
    let collectives = 200_000u32;
    // The rank's pace (`collectives/flight.rs`): a lock and a clock reading at its
    // execution's start and end, its arrival and its departure, and its engines' busy
    // times handed over (converted from ticks) before its collective and at the end.
    let pace = std::sync::Mutex::new((0u64, 0u64, [0u64; 5]));
    let mark = |executing: bool| {
        let now = monotonic_ns();
        let engines: [u64; 5] = std::array::from_fn(|e| (std::hint::black_box(e as u64 * 1000) as f64 * 0.37) as u64);
        let mut pace = pace.lock().expect("pace");
        pace.2.iter_mut().zip(engines).for_each(|(total, ns)| *total += ns);
        if executing {
            pace.1 += now.saturating_sub(pace.0);
        }
        pace.0 = now;
        pace.1
    };
    let started = Instant::now();
    for sequence in 0..collectives {
        let at = Position { sequence, index: 0 };
        mark(false);
        writer.record_progress(slot, 0, Progress::Enqueued, at);
        let executing_ns = mark(true);
        let arrived = monotonic_ns();
        writer.record_progress(slot, 0, Progress::Started(CollectiveOp::AllReduce), at);
        for peer in 1..RANKS as u32 {
            writer.record_progress(slot, peer, Progress::Started(CollectiveOp::AllReduce), at);
        }
        let departed = monotonic_ns();
        writer.set_waiting(slot, 0, None);
        let entry = |arrived_ns, departed_ns| CollectiveEntry {
            position: at,
            operation: CollectiveOp::AllReduce,
            algorithm: CollectiveAlgorithm::AllToAll,
            group: 0,
            bytes: BYTES as u64,
            arrived_ns,
            departed_ns,
            before: Some(Before { since_ns: 900_000, executing_ns, busiest: Some((Engine::Pe, executing_ns / 2)) }),
        };
        writer.record_collective(slot, 0, &entry(arrived, Some(departed)));
        writer.record_progress(slot, 0, Progress::Completed, at);
        for peer in 1..RANKS as u32 {
            writer.record_collective(slot, peer, &entry(arrived + u64::from(peer), None));
            writer.set_rank_uncertainty(slot, peer, 20_000);
        }
        mark(false);
        mark(true);
    }
    started.elapsed().as_secs_f64() / f64::from(collectives)
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
    let (on, off) = (job(true), job(false));
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        // Which goes first alternates too.
        if round % 2 == 0 {
            with.extend(all_reduces(&on));
            without.extend(all_reduces(&off));
        } else {
            without.extend(all_reduces(&off));
            with.extend(all_reduces(&on));
        }
    }
    let (t_with, t_without) = (median(with), median(without));
    println!("1 MiB f32 all-reduce of {RANKS} ranks (a runtime each), rank 0's median of {} calls:", ROUNDS * CALLS);
    println!("  flight record on   {:>9.1} µs", t_with * 1e6);
    println!("  flight record off  {:>9.1} µs", t_without * 1e6);
    println!("  on / off           {:>9.3}", t_with / t_without);
    let work = record_work();
    println!("the record's own work per collective of one rank: {:.2} µs", work * 1e6);
    println!("  against the all-reduce (record off): {:.3}%", 100.0 * work / t_without);
    let step = mlp_step();
    println!("a step's compute, the MLP example on one core: {:.1} µs", step * 1e6);
    println!(
        "  one all-reduce's record against the step and its all-reduce: {:.4}%",
        100.0 * work / (step + t_without)
    );
}
