//! A NEFF body that decodes and passes `Program::validate` must load and execute
//! without panicking, whatever it contains: validation is what the backend's kernels
//! trust. (The container's checksums keep random bytes from ever reaching this point in
//! `neff_decode`, so this target feeds program bodies directly.)
#![no_main]

use libfuzzer_sys::fuzz_target;
use neuron_runtime::isa::Program;
use neuron_runtime::{Neff, Runtime, TensorPlacement, TensorSet};

/// Programs whose buffers add up to more than this are skipped, to keep runs fast.
const MAX_BUFFER_BYTES: u64 = 1 << 20;

fn runtime() -> &'static Runtime {
    neuron_test_support::runtime::Bench::new().runtime()
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
