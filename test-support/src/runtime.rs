//! A runtime in the test's own process, and helpers to compile, bind and run HLO on
//! it: [`Bench`], one runtime for every test of a test binary (on nc0), and
//! [`Fixture`], a runtime of its own for one test, with private lock and datastore
//! directories.

use std::sync::OnceLock;

use neuron_runtime::config::CoreRequest;
use neuron_runtime::{
    ArrayType, CompileOptions, Config, CoreSet, DType, Model, Neff, NrtResult, Runtime, Target, TensorPlacement,
    TensorSet, compile_hlo, compile_hlo_with,
};

/// One runtime on nc0 for every test of a test binary.
#[derive(Debug)]
pub struct Bench {
    runtime: Runtime,
    _lock_dir: tempfile::TempDir,
}

impl Bench {
    /// One runtime for every test of this binary (they run on threads of one process,
    /// and a core is held by one runtime at a time).
    pub fn new() -> &'static Bench {
        static BENCH: OnceLock<Bench> = OnceLock::new();
        BENCH.get_or_init(|| {
            let lock_dir = tempfile::tempdir().expect("tempdir");
            let runtime = Runtime::start(Config {
                lock_dir: lock_dir.path().to_path_buf(),
                cores: CoreRequest::Visible(CoreSet::range(0, 0)),
                ..Config::default()
            })
            .expect("runtime");
            // A static is never dropped: unlink the datastore file now (the mapping stays valid).
            if let Ok(path) = runtime.datastore_path() {
                let _ = std::fs::remove_file(path);
            }
            Bench { runtime, _lock_dir: lock_dir }
        })
    }

    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// Compiles `hlo` with `options`, runs it `times` times on `inputs` (raw
    /// little-endian bytes per input) and returns every output's bytes, per run.
    pub fn run_repeatedly(
        &self,
        hlo: &str,
        options: &CompileOptions,
        inputs: &[Vec<u8>],
        times: usize,
    ) -> Vec<Vec<Vec<u8>>> {
        let rt = &self.runtime;
        let program = compile_hlo_with(hlo, options).unwrap_or_else(|e| panic!("{e}\n{hlo}"));
        let model = rt.load(&Neff::new("test", program).encode(), None).expect("load");
        let mut bound = TensorSet::new();
        for (i, bytes) in inputs.iter().enumerate() {
            let ty = model.tensor_type(&model.inputs()[i]).clone();
            let tensor = rt.allocate_tensor_for(TensorPlacement::Host, &ty, "in").expect("alloc");
            tensor.write(0, bytes).expect("write");
            bound.add(&format!("input{i}"), tensor);
        }
        let mut outputs = TensorSet::new();
        let mut tensors = Vec::new();
        for (i, name) in model.outputs().iter().enumerate() {
            let ty = model.tensor_type(name).clone();
            let tensor = rt.allocate_tensor_for(TensorPlacement::Host, &ty, "out").expect("alloc");
            outputs.add(&format!("output{i}"), tensor.clone());
            tensors.push(tensor);
        }
        let runs = (0..times)
            .map(|_| {
                rt.execute(&model, &bound, &outputs).expect("execute");
                tensors.iter().map(|t| t.read_all().expect("read")).collect()
            })
            .collect();
        rt.unload(&model).expect("unload");
        runs
    }

    /// Every output's bytes after one run.
    pub fn run_all(&self, hlo: &str, options: &CompileOptions, inputs: &[Vec<u8>]) -> Vec<Vec<u8>> {
        self.run_repeatedly(hlo, options, inputs, 1).remove(0)
    }

    /// The first output's bytes after one run.
    pub fn run(&self, hlo: &str, options: &CompileOptions, inputs: &[Vec<u8>]) -> Vec<u8> {
        self.run_all(hlo, options, inputs).remove(0)
    }

    pub fn run_f32(&self, hlo: &str, options: &CompileOptions, inputs: &[&[f32]]) -> Vec<f32> {
        floats(&self.run(hlo, options, &f32_inputs(inputs)))
    }
}

/// A NEFF of `hlo` compiled for `target` with the default options.
pub fn neff(hlo: &str, target: Target) -> Vec<u8> {
    Neff::new("test", compile_hlo(hlo, target).expect("compiles")).encode()
}

/// Loads `neff` on nc0, with a device tensor `x` bound to `input0` and a host tensor
/// `y` to `output0`, both `f32[len]` (the input is not written).
pub fn bind_f32(rt: &Runtime, neff: &[u8], len: u64) -> (Model, TensorSet, TensorSet) {
    let model = rt.load(neff, Some(0)).expect("loads");
    let ty = ArrayType::new(DType::F32, vec![len]);
    let input = rt.allocate_tensor_for(TensorPlacement::Device { core: 0 }, &ty, "x").expect("alloc");
    let output = rt.allocate_tensor_for(TensorPlacement::Host, &ty, "y").expect("alloc");
    let mut inputs = TensorSet::new();
    inputs.add("input0", input);
    let mut outputs = TensorSet::new();
    outputs.add("output0", output);
    (model, inputs, outputs)
}

/// This host's CPU as `/proc/cpuinfo` names it (empty where it does not), for a
/// benchmark's first line.
pub fn cpu_model() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name").map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned()))
        .unwrap_or_default()
}

/// Every input and output of `model` as a tensor in `core`'s memory, the inputs filled
/// with small f32 values (a benchmark's example model), and the bytes of them all.
pub fn bind_filled(rt: &Runtime, model: &Model, core: u32) -> (TensorSet, TensorSet, u64) {
    let placement = TensorPlacement::Device { core };
    let mut bytes = 0u64;
    let mut bind = |ios: &[neuron_runtime::isa::IoTensor]| {
        let mut set = TensorSet::new();
        for io in ios {
            let ty = model.tensor_type(io).clone();
            let tensor = rt.allocate_tensor_for(placement, &ty, &io.name).expect("alloc");
            let len = ty.size_bytes().expect("a size") as usize;
            let values: Vec<u8> = (0..len / 4).flat_map(|i| ((i % 13) as f32 * 0.01 - 0.06).to_le_bytes()).collect();
            tensor.write(0, &values).expect("write");
            bytes += len as u64;
            set.add(&io.name, tensor);
        }
        set
    };
    let (inputs, outputs) = (bind(model.inputs()), bind(model.outputs()));
    (inputs, outputs, bytes)
}

/// Executes `model` (one `f32` input, one output) once on `input` in host tensors,
/// returning its output.
pub fn execute_f32(rt: &Runtime, model: &Model, input: &[f32]) -> NrtResult<Vec<f32>> {
    let ty = model.tensor_type(&model.inputs()[0]).clone();
    let x = rt.allocate_tensor_for(TensorPlacement::Host, &ty, "x").expect("alloc");
    x.write(0, &f32_bytes(input)).expect("write");
    let out_ty = model.tensor_type(&model.outputs()[0]).clone();
    let y = rt.allocate_tensor_for(TensorPlacement::Host, &out_ty, "y").expect("alloc");
    let (mut inputs, mut outputs) = (TensorSet::new(), TensorSet::new());
    inputs.add("input0", x);
    outputs.add("output0", y.clone());
    rt.execute(model, &inputs, &outputs)?;
    Ok(floats(&y.read_all().expect("read")))
}

/// Little-endian bytes of `values`.
pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Little-endian bytes of each input.
pub fn f32_inputs(inputs: &[&[f32]]) -> Vec<Vec<u8>> {
    inputs.iter().map(|v| f32_bytes(v)).collect()
}

pub fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

pub fn ints(bytes: &[u8]) -> Vec<i32> {
    bytes.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// A runtime of its own for one test, holding `cores`, with its lock and datastore
/// directories (removed with it) and rings of 4,096 events.
#[derive(Debug)]
pub struct Fixture {
    pub runtime: Runtime,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
}

/// Starts a [`Fixture`] on `cores` after `adjust` has changed its configuration.
pub fn started(cores: CoreSet, adjust: impl FnOnce(&mut Config)) -> Fixture {
    let locks = tempfile::tempdir().expect("tempdir");
    let stores = tempfile::tempdir().expect("tempdir");
    let mut config = Config {
        lock_dir: locks.path().to_path_buf(),
        datastore_dir: stores.path().join("ds"),
        cores: CoreRequest::Visible(cores),
        ..Config::default()
    };
    config.inspect.max_events_per_nc = 4096;
    adjust(&mut config);
    Fixture { runtime: Runtime::start(config).expect("runtime starts"), _dirs: (locks, stores) }
}

/// `calls` all-reduces (`f32` sums), one thread per rank (its communicator, input and
/// output): rank 0's time of each call, in seconds.
pub fn all_reduce_times(
    ranks: &[(neuron_runtime::Communicator, (neuron_runtime::Tensor, neuron_runtime::Tensor))],
    calls: usize,
) -> Vec<f64> {
    use neuron_runtime::{Collective, CollectiveCall, isa::ReduceOp};
    let call = CollectiveCall::new(Collective::AllReduce(ReduceOp::Add), DType::F32);
    std::thread::scope(|scope| {
        let threads: Vec<_> = ranks
            .iter()
            .enumerate()
            .map(|(rank, (comm, (x, y)))| {
                let call = &call;
                scope.spawn(move || {
                    (0..calls)
                        .map(|_| {
                            let started = std::time::Instant::now();
                            comm.run(rank as u32, call, Some(x), Some(y)).expect("all-reduce");
                            started.elapsed().as_secs_f64()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().expect("rank")).next().unwrap_or_default()
    })
}
