//! The two collective algorithms against each other: an `f32` all-reduce through
//! `Communicator::run` on 2, 4 and 8 ranks and message sizes from 4 KiB to 16 MiB per
//! rank, ring and all-to-all alternating call by call, with the median time of each and
//! the ratio ring / all-to-all. Each rank is a thread that lives for the whole series
//! of calls; a call's time is rank 0's, from entering the all-reduce to leaving it. The
//! runtime's default (`Algorithm::choose`) should pick the faster one.
//!
//! Run: `cargo bench -p neuron-runtime --bench collectives`. Results go in BENCHMARKS.md.

use std::time::Instant;

use neuron_datastore::topology::InstanceType;
use neuron_runtime::config::CoreRequest;
use neuron_runtime::isa::ReduceOp;
use neuron_runtime::{
    Algorithm, Collective, CollectiveCall, Communicator, Config, CoreSet, DType, Runtime, Tensor, TensorPlacement,
};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SIZES: [usize; 5] = [4 << 10, 64 << 10, 256 << 10, 1 << 20, 16 << 20];
/// Bytes all-reduced per (ranks, size) and algorithm, which sets the number of calls.
const VOLUME: usize = 256 << 20;

fn main() {
    let lock_dir = tempfile::tempdir().expect("tempdir");
    let runtime = Runtime::start(Config {
        lock_dir: lock_dir.path().to_path_buf(),
        instance_type: InstanceType::Trn1_32xlarge,
        cores: CoreRequest::Visible(CoreSet::range(0, 7)),
        ..Config::from_env().expect("configuration")
    })
    .expect("runtime");
    println!("all-reduce (f32 sum) per call, median; ring / all-to-all < 1 means ring is faster");
    println!("{:>5} {:>10} {:>14} {:>14} {:>7} {:>9}", "ranks", "bytes", "ring", "all-to-all", "ratio", "default");
    for ranks in [2usize, 4, 8] {
        let cores: Vec<u32> = (0..ranks as u32).collect();
        let comm = runtime.communicator(&cores).expect("communicator");
        for bytes in SIZES {
            let tensors: Vec<(Tensor, Tensor)> = cores
                .iter()
                .map(|&core| {
                    let placement = TensorPlacement::Device { core };
                    let x = runtime.allocate_tensor(placement, bytes as u64, "x").expect("alloc");
                    let values: Vec<u8> = (0..bytes / 4).flat_map(|i| (i as f32 * 0.5).to_le_bytes()).collect();
                    x.write(0, &values).expect("write");
                    (x, runtime.allocate_tensor(placement, bytes as u64, "y").expect("alloc"))
                })
                .collect();
            let calls = (VOLUME / bytes).clamp(10, 400);
            let times = all_reduces(&comm, &tensors, calls);
            let of = |wanted: Algorithm| -> Vec<f64> {
                times.iter().filter(|(a, _)| *a == wanted).map(|(_, t)| *t).collect()
            };
            let (mut ring, mut direct) = (of(Algorithm::Ring), of(Algorithm::AllToAll));
            let (ring, direct) = (median(&mut ring), median(&mut direct));
            println!(
                "{ranks:>5} {bytes:>10} {:>11.1} µs {:>11.1} µs {:>7.2} {:>9}",
                ring * 1e6,
                direct * 1e6,
                ring / direct,
                neuron_runtime::collectives::choose_algorithm(bytes as u64, ranks).name()
            );
        }
    }
}

/// `calls` all-reduces with each algorithm, alternating, on one thread per rank; rank
/// 0's time of each call.
fn all_reduces(comm: &Communicator, tensors: &[(Tensor, Tensor)], calls: usize) -> Vec<(Algorithm, f64)> {
    let call = |algorithm| CollectiveCall::new(Collective::AllReduce(ReduceOp::Add), DType::F32).algorithm(algorithm);
    let (ring, direct) = (call(Algorithm::Ring), call(Algorithm::AllToAll));
    std::thread::scope(|scope| {
        let ranks: Vec<_> = tensors
            .iter()
            .enumerate()
            .map(|(rank, (x, y))| {
                let (ring, direct) = (&ring, &direct);
                scope.spawn(move || {
                    (0..2 * calls)
                        .map(|i| {
                            let call = if i % 2 == 0 { ring } else { direct };
                            let started = Instant::now();
                            comm.run(rank as u32, call, Some(x), Some(y)).expect("all-reduce");
                            (call.algorithm.unwrap_or(Algorithm::Ring), started.elapsed().as_secs_f64())
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        ranks.into_iter().map(|r| r.join().expect("rank")).next().unwrap_or_default()
    })
}

fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}
