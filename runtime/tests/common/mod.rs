//! A runtime shared by the tests of one binary, and helpers to compile and run HLO on it.

#![allow(dead_code, unreachable_pub)]

use std::sync::OnceLock;

use neuron_runtime::config::CoreRequest;
use neuron_runtime::{CompileOptions, Config, CoreSet, Neff, Runtime, TensorPlacement, TensorSet, compile_hlo_with};

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

pub fn f32_inputs(inputs: &[&[f32]]) -> Vec<Vec<u8>> {
    inputs.iter().map(|v| v.iter().flat_map(|x| x.to_le_bytes()).collect()).collect()
}

pub fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

pub fn ints(bytes: &[u8]) -> Vec<i32> {
    bytes.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// A runtime of its own for one test, holding `cores`, with its lock and datastore
/// directories (removed with it) and rings of 4,096 events.
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
