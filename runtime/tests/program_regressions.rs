//! Program bodies that once crashed the runtime (found by the `program_execute` fuzz
//! target), kept as regression cases: each must be rejected by validation, or load and
//! execute to a result, without panicking.

use std::path::Path;

use neuron_runtime::isa::Program;
use neuron_runtime::{CoreSet, Neff, Runtime, TensorPlacement, TensorSet};

use neuron_test_support::runtime as common;

fn check(path: &Path, runtime: &Runtime) {
    let bytes = std::fs::read(path).expect("read case");
    let Ok(program) = postcard::from_bytes::<Program>(&bytes) else {
        return;
    };
    if program.validate().is_err() {
        return;
    }
    let Ok(model) = runtime.load(&Neff::new("case", program).encode(), None) else {
        return;
    };
    let bind = |ios: &[neuron_runtime::isa::IoTensor]| {
        let mut set = TensorSet::new();
        for io in ios {
            let tensor =
                runtime.allocate_tensor_for(TensorPlacement::Host, model.tensor_type(io), &io.name).expect("alloc");
            set.add(&io.name, tensor);
        }
        set
    };
    let (inputs, outputs) = (bind(model.inputs()), bind(model.outputs()));
    // The host pool turns a panic inside the backend into NRT_FAILURE; that must not happen.
    if let Err(e) = runtime.execute(&model, &inputs, &outputs) {
        assert!(!e.message.contains("inside the backend"), "{}: {e}", path.display());
    }
}

#[test]
fn past_crashes_are_handled() {
    let fixture = common::started(CoreSet::range(0, 0), |_| {});
    let runtime = &fixture.runtime;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/program_regressions");
    let mut cases = 0;
    for entry in std::fs::read_dir(dir).expect("cases") {
        check(&entry.expect("entry").path(), runtime);
        cases += 1;
    }
    assert!(cases > 0, "no regression cases found");
}

#[test]
fn an_unaddressable_zero_size_shape_fails_validation() {
    let bytes = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/program_regressions/unaddressable_zero_size_shape.program"),
    )
    .expect("read case");
    let program: Program = postcard::from_bytes(&bytes).expect("decodes");
    let err = program.validate().expect_err("must be rejected");
    assert!(err.0.contains("too large to address"), "{err}");
}
