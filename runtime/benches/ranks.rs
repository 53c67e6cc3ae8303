//! All-reduce bus bandwidth of a communicator across processes against the same ranks
//! in one process, in the same run, with the host's memcpy bandwidth beside them.
//!
//! Across processes, each rank is a runtime of its own with its own bootstrap
//! connection to rank 0's runtime and its own data links (TCP over loopback), as
//! processes of one host have: the transport is the one real processes use, only the
//! address space is shared. In one process, the ranks are cores of one runtime meeting
//! in memory. An `f32` sum of 1, 16 and 64 MiB per rank on 2, 4 and 8 ranks (more ranks
//! than CPUs on small hosts: the table then shows what oversubscription costs); a call's
//! time is rank 0's, median of the calls; bus bandwidth as NCCL defines it
//! (`bytes × 2(n − 1) / n / time`). Before each size table, the bootstrap: from the
//! ranks' joins until every rank has the roster.
//!
//! Run: `cargo bench -p neuron-runtime --bench ranks` (`-- 2 4` for those rank counts
//! only). Results go in BENCHMARKS.md.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use neuron_datastore::topology::InstanceType;
use neuron_runtime::config::CoreRequest;
use neuron_runtime::launch::RootComm;
use neuron_runtime::{Communicator, Config, CoreSet, Runtime, Tensor, TensorPlacement};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SIZES: [usize; 3] = [1 << 20, 16 << 20, 64 << 20];
/// Bytes all-reduced per (ranks, size) and placement, which sets the number of calls.
const VOLUME: usize = 512 << 20;

fn runtime(lock_dir: &std::path::Path, cores: CoreSet, root: Option<RootComm>) -> Runtime {
    Runtime::start(Config {
        lock_dir: lock_dir.to_path_buf(),
        instance_type: InstanceType::Trn1_32xlarge,
        cores: CoreRequest::Visible(cores),
        root_comm: root,
        exec_timeout: Duration::from_secs(120),
        ..Config::from_env().expect("configuration")
    })
    .expect("runtime")
}

fn main() {
    println!("memcpy of 64 MiB: {:.2} GB/s", memcpy_bandwidth() / 1e9);
    println!("all-reduce (f32 sum), median per call; bus bandwidth; across processes / one process");
    println!("{:>5} {:>10} {:>14} {:>14} {:>7}", "ranks", "bytes", "one process", "across", "ratio");
    let asked: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    for ranks in [2usize, 4, 8].into_iter().filter(|r| asked.is_empty() || asked.contains(r)) {
        let locks: Vec<tempfile::TempDir> = (0..=ranks).map(|_| tempfile::tempdir().expect("tempdir")).collect();
        let single = runtime(locks[0].path(), CoreSet::range(0, ranks as u32 - 1), None);
        let cores: Vec<u32> = (0..ranks as u32).collect();
        let local = single.communicator(&cores).expect("communicator");
        let port = TcpListener::bind("127.0.0.1:0").expect("binds").local_addr().expect("address").port();
        let root = RootComm { host: "127.0.0.1".into(), port, from: "NEURON_RT_ROOT_COMM_ID" };
        let processes: Vec<Runtime> =
            (0..ranks).map(|r| runtime(locks[r + 1].path(), CoreSet::range(0, 0), Some(root.clone()))).collect();
        let name = format!("bench {ranks}");
        let joined = Instant::now();
        let across: Vec<Communicator> = processes
            .iter()
            .enumerate()
            .map(|(r, rt)| rt.join_communicator(&name, 0, r as u32, ranks as u32).expect("joins"))
            .collect();
        for comm in &across {
            comm.wait_for_ranks(Instant::now() + Duration::from_secs(60)).expect("every rank joins");
        }
        println!("  bootstrap of {ranks} ranks: {:.1} ms", joined.elapsed().as_secs_f64() * 1e3);
        for bytes in SIZES {
            let calls = (VOLUME / bytes).clamp(4, 50);
            let tensors = |rt: &Runtime, core: u32| {
                let placement = TensorPlacement::Device { core };
                let x = rt.allocate_tensor(placement, bytes as u64, "x").expect("alloc");
                let values: Vec<f32> = (0..bytes / 4).map(|i| i as f32 * 0.5).collect();
                x.write(0, bytemuck::cast_slice(&values)).expect("write");
                (x, rt.allocate_tensor(placement, bytes as u64, "y").expect("alloc"))
            };
            let one: Vec<_> = cores.iter().map(|&c| (local.clone(), tensors(&single, c))).collect();
            let many: Vec<_> = processes.iter().zip(&across).map(|(rt, comm)| (comm.clone(), tensors(rt, 0))).collect();
            let busbw = |seconds: f64| bytes as f64 * 2.0 * (ranks as f64 - 1.0) / ranks as f64 / seconds / 1e9;
            let (t_one, t_many) = (all_reduces(&one, calls), all_reduces(&many, calls));
            println!(
                "{ranks:>5} {bytes:>10} {:>9.2} GB/s {:>9.2} GB/s {:>7.2}",
                busbw(t_one),
                busbw(t_many),
                t_one / t_many
            );
        }
    }
}

/// `calls` all-reduces, one thread per rank (its communicator and tensors); rank 0's
/// median time.
fn all_reduces(ranks: &[(Communicator, (Tensor, Tensor))], calls: usize) -> f64 {
    let mut times = neuron_test_support::runtime::all_reduce_times(ranks, calls);
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// The host's copy bandwidth: the best of ten copies of 64 MiB, in bytes per second.
fn memcpy_bandwidth() -> f64 {
    let source = vec![1u8; 64 << 20];
    let mut destination = vec![0u8; 64 << 20];
    let best = (0..10)
        .map(|_| {
            let started = Instant::now();
            destination.copy_from_slice(std::hint::black_box(&source));
            std::hint::black_box(&destination);
            started.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min);
    source.len() as f64 / best
}
