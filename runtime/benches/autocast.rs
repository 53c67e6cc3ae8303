//! The default numerics against exact f32 on this host: the example models compiled
//! with `neuron-cc`'s defaults (`--auto-cast matmult`: matrix products of bf16-rounded
//! operands) and with `--auto-cast none`, run alternately on one core, median latency
//! of each and their ratio. The default is meant never to be slower: the runtime runs
//! the rounded products on whichever kernel it measured faster at start (bf16 products
//! or f32 multiply-adds), which this prints.
//!
//! Run: `cargo bench -p neuron-runtime --bench autocast [-- ITERATIONS] [MODEL]` (300
//! iterations by default, both models unless one is named);
//! `NEURON_VIRT_BF16_PRODUCTS=f32` (or `bf16`) forces the kernel. Results go in
//! BENCHMARKS.md with the CPU they ran on.

use std::time::Instant;

use neuron_datastore::DatastoreReader;
use neuron_runtime::config::CoreRequest;
use neuron_runtime::{CompileOptions, Config, CoreSet, Neff, Runtime, compile_hlo_with};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const MODELS: [(&str, &str); 2] =
    [("mlp", include_str!("../../examples/mlp.hlo")), ("attention", include_str!("../../examples/attention.hlo"))];

fn main() {
    let iterations: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(300);
    let only: Vec<String> = std::env::args().skip(1).filter(|a| MODELS.iter().any(|(name, _)| a == name)).collect();
    let lock_dir = tempfile::tempdir().expect("tempdir");
    let runtime = Runtime::start(Config {
        lock_dir: lock_dir.path().to_path_buf(),
        cores: CoreRequest::Visible(CoreSet::range(0, 0)),
        ..Config::from_env().expect("configuration")
    })
    .expect("runtime");
    let kernel = DatastoreReader::open(&runtime.datastore_path().expect("datastore"))
        .map(|r| format!("{:?}", r.info().product_kernel))
        .unwrap_or_else(|e| format!("unknown ({e})"));
    let cpu = neuron_test_support::runtime::cpu_model();
    println!("{cpu}; products of bf16-rounded operands run on: {kernel}");
    println!("{:<10} {:>14} {:>14} {:>8}", "model", "default p50", "none p50", "ratio");
    for (name, hlo) in MODELS.into_iter().filter(|(name, _)| only.is_empty() || only.iter().any(|o| o == name)) {
        let run = |options: CompileOptions| {
            let neff = Neff::new(name, compile_hlo_with(hlo, &options).expect("compiles")).encode();
            let model = runtime.load(&neff, Some(0)).expect("loads");
            let (inputs, outputs, _) = neuron_test_support::runtime::bind_filled(&runtime, &model, 0);
            (model, inputs, outputs)
        };
        let default = run(CompileOptions::default());
        let none = run(CompileOptions { auto_cast: neuron_runtime::AutoCast::None, ..CompileOptions::default() });
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for k in 0..iterations + 20 {
            for (model, samples) in [(&default, &mut a), (&none, &mut b)] {
                let start = Instant::now();
                runtime.execute(&model.0, &model.1, &model.2).expect("executes");
                // The first runs warm the caches and the allocator.
                if k >= 20 {
                    samples.push(start.elapsed().as_secs_f64());
                }
            }
        }
        let (a, b) = (median(a), median(b));
        println!("{name:<10} {:>11.0} µs {:>11.0} µs {:>8.2}", a * 1e6, b * 1e6, a / b);
        runtime.unload(&default.0).expect("unload");
        runtime.unload(&none.0).expect("unload");
    }
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}
