//! What the runtime adds on top of the arithmetic: GEMM throughput through a full
//! synchronous execution against `gemm::gemm` (the GEMM the backend uses) called directly
//! on the same shapes, both on one host thread, and the fixed cost of executing a one-operator model.
//!
//! Run: `cargo bench -p neuron-runtime --bench overhead [-- gemm|fixed]` (both parts by
//! default). Results go in BENCHMARKS.md.

use std::time::{Duration, Instant};

use neuron_runtime::config::CoreRequest;
use neuron_runtime::{
    ArrayType, CompileOptions, Config, CoreSet, DType, Neff, Runtime, Target, TensorPlacement, TensorSet, compile_hlo,
    compile_hlo_with,
};

// The allocator the runtime's own binaries use (see profiler/src/bin), so that both
// sides run on the same one; glibc's would return freed output buffers to the kernel
// and fault them back in at every execution.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Square GEMM sizes measured.
const GEMM_SIZES: [usize; 4] = [256, 512, 1024, 2048];
/// Minimum time spent measuring each GEMM size (both variants, alternating).
const GEMM_BUDGET: Duration = Duration::from_secs(4);
/// Executions timed for the fixed-overhead figure.
const OVERHEAD_EXECUTIONS: usize = 20_000;

fn main() {
    let lock_dir = tempfile::tempdir().expect("tempdir");
    let runtime = Runtime::start(Config {
        lock_dir: lock_dir.path().to_path_buf(),
        cores: CoreRequest::Visible(CoreSet::range(0, 0)),
        // One compute slot: no idle slot to lend, so products stay on the calling
        // thread, like the direct call they are compared with.
        host_threads: 1,
        ..Config::from_env().expect("configuration")
    })
    .expect("runtime");

    let part = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let wants = |name: &str| part.as_deref().is_none_or(|p| p == name);
    if wants("gemm") {
        println!("GEMM (f32, square): runtime execution vs gemm::gemm called directly, one thread each");
        println!("{:>6} {:>14} {:>14} {:>8}", "n", "direct GFLOP/s", "runtime GFLOP/s", "ratio");
        for n in GEMM_SIZES {
            let (direct, through_runtime) = gemm_pair(&runtime, n);
            println!("{n:>6} {direct:>14.2} {through_runtime:>14.2} {:>8.3}", through_runtime / direct);
        }
    }
    if wants("fixed") {
        let (median, p99) = one_operator_latency(&runtime);
        println!("fixed overhead: synchronous execution of a one-operator model (negate f32[1])");
        println!("  median {:.2} µs, p99 {:.2} µs over {OVERHEAD_EXECUTIONS} executions", median * 1e6, p99 * 1e6);
    }
}

fn flops(n: usize) -> f64 {
    2.0 * (n as f64).powi(3)
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// Times `a` and `b` alternately (after one warm-up each) for at least the budget and
/// returns their median seconds per call. Alternating keeps the comparison fair on a
/// machine whose speed drifts (shared or throttled CPUs).
fn paired_median_seconds(mut a: impl FnMut(), mut b: impl FnMut()) -> (f64, f64) {
    a();
    b();
    let (mut a_samples, mut b_samples) = (Vec::new(), Vec::new());
    let start = Instant::now();
    while start.elapsed() < GEMM_BUDGET || a_samples.len() < 5 {
        let t = Instant::now();
        a();
        a_samples.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        b();
        b_samples.push(t.elapsed().as_secs_f64());
    }
    (median(a_samples), median(b_samples))
}

/// GFLOP/s of an n×n×n product: the `gemm` crate called directly, and a `dot` model
/// executed by the runtime (input DMA, the product, output DMA and the NaN scan).
fn gemm_pair(runtime: &Runtime, n: usize) -> (f64, f64) {
    let a: Vec<f32> = (0..n * n).map(|i| (i % 7) as f32 * 0.25).collect();
    let b: Vec<f32> = (0..n * n).map(|i| (i % 5) as f32 * 0.5).collect();
    let mut c = vec![0f32; n * n];
    let direct = || {
        // SAFETY: a, b and c are n×n row-major buffers matching the strides given.
        unsafe {
            gemm::gemm(
                n,
                n,
                n,
                c.as_mut_ptr(),
                1,
                n as isize,
                false,
                a.as_ptr(),
                1,
                n as isize,
                b.as_ptr(),
                1,
                n as isize,
                0.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
        std::hint::black_box(&mut c);
    };

    let hlo = format!(
        "HloModule gemm\nENTRY e {{\n  a = f32[{n},{n}]{{1,0}} parameter(0)\n  b = f32[{n},{n}]{{1,0}} parameter(1)\n  \
         ROOT c = f32[{n},{n}]{{1,0}} dot(a, b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}\n}}\n"
    );
    // f32 against f32: with neuron-cc's defaults the product would run in bf16.
    let options = CompileOptions::exact(Target::Trn1);
    let neff = Neff::new("gemm", compile_hlo_with(&hlo, &options).expect("compiles")).encode();
    let model = runtime.load(&neff, Some(0)).expect("loads");
    let ty = ArrayType::new(DType::F32, vec![n as u64, n as u64]);
    let placement = TensorPlacement::Device { core: 0 };
    let mut inputs = TensorSet::new();
    for (name, data) in [("input0", &a), ("input1", &b)] {
        let t = runtime.allocate_tensor_for(placement, &ty, name).expect("alloc");
        let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
        t.write(0, &bytes).expect("write");
        inputs.add(name, t);
    }
    let mut outputs = TensorSet::new();
    outputs.add("output0", runtime.allocate_tensor_for(placement, &ty, "c").expect("alloc"));
    let through_runtime = || {
        runtime.execute(&model, &inputs, &outputs).expect("executes");
    };

    let (direct_seconds, runtime_seconds) = paired_median_seconds(direct, through_runtime);
    runtime.unload(&model).expect("unload");
    (flops(n) / direct_seconds / 1e9, flops(n) / runtime_seconds / 1e9)
}

fn one_operator_latency(runtime: &Runtime) -> (f64, f64) {
    let hlo = "HloModule one\nENTRY e {\n  x = f32[1]{0} parameter(0)\n  ROOT y = f32[1]{0} negate(x)\n}\n";
    let neff = Neff::new("one", compile_hlo(hlo, Target::Trn1).expect("compiles")).encode();
    let model = runtime.load(&neff, Some(0)).expect("loads");
    let ty = ArrayType::new(DType::F32, vec![1]);
    let placement = TensorPlacement::Device { core: 0 };
    let mut inputs = TensorSet::new();
    inputs.add("input0", runtime.allocate_tensor_for(placement, &ty, "x").expect("alloc"));
    let mut outputs = TensorSet::new();
    outputs.add("output0", runtime.allocate_tensor_for(placement, &ty, "y").expect("alloc"));
    for _ in 0..1000 {
        runtime.execute(&model, &inputs, &outputs).expect("warm-up");
    }
    let mut samples: Vec<f64> = (0..OVERHEAD_EXECUTIONS)
        .map(|_| {
            let t = Instant::now();
            runtime.execute(&model, &inputs, &outputs).expect("executes");
            t.elapsed().as_secs_f64()
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    (samples[samples.len() / 2], samples[samples.len() * 99 / 100])
}
