//! A NEFF body that decodes and passes `Program::validate` must load and execute
//! without panicking, whatever it contains: validation is what the backend's kernels
//! trust. (The container's checksums keep random bytes from ever reaching this point in
//! `neff_decode`, so this target feeds program bodies directly.)
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use neuron_runtime::isa::Program;
use neuron_runtime::{Config, Neff, Runtime, TensorPlacement, TensorSet};

/// Programs whose buffers add up to more than this are skipped, to keep runs fast.
const MAX_BUFFER_BYTES: u64 = 1 << 20;

fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<(Runtime, tempfile::TempDir)> = OnceLock::new();
    &RUNTIME
        .get_or_init(|| {
            let lock_dir = tempfile::tempdir().expect("tempdir");
            let config = Config {
                lock_dir: lock_dir.path().to_path_buf(),
                ..Config::default()
            };
            let runtime = Runtime::start(config).expect("runtime");
            // A static is never dropped, so the runtime never closes: unlink its datastore
            // file now (the mapping stays valid) rather than leave it in shared memory.
            if let Ok(path) = runtime.datastore_path() {
                let _ = std::fs::remove_file(path);
            }
            (runtime, lock_dir)
        })
        .0
}

fuzz_target!(|data: &[u8]| {
    let Ok(program) = postcard::from_bytes::<Program>(data) else {
        return;
    };
    if program.validate().is_err() {
        return;
    }
    let total: u64 = program.buffers.iter().filter_map(|b| b.ty.size_bytes()).sum();
    if total > MAX_BUFFER_BYTES || program.buffers.iter().any(|b| b.ty.size_bytes().is_none()) {
        return;
    }
    let rt = runtime();
    let Ok(model) = rt.load(&Neff::new("fuzz", program).encode(), None) else {
        return;
    };
    let mut inputs = TensorSet::new();
    for io in model.inputs() {
        let tensor = rt.allocate_tensor_for(TensorPlacement::Host, model.tensor_type(io), &io.name).expect("alloc");
        inputs.add(&io.name, tensor);
    }
    let mut outputs = TensorSet::new();
    for io in model.outputs() {
        let tensor = rt.allocate_tensor_for(TensorPlacement::Host, model.tensor_type(io), &io.name).expect("alloc");
        outputs.add(&io.name, tensor);
    }
    let _ = rt.execute(&model, &inputs, &outputs);
    rt.unload(&model).expect("unload");
});
