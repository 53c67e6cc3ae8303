//! The runtime's public contract: lifecycle, loading, tensors, execution and its
//! failure modes, each with the public status code.

use std::time::Duration;

use neuron_test_support::runtime::{self as common, Fixture, f32_bytes, floats, neff};

use neuron_datastore::{DeviceCategory, HostCategory};
use neuron_runtime::config::{CoreRequest, NumericalErrorsVerbosity};
use neuron_runtime::{
    ArrayType, Config, CoreSet, DType, InstanceType, NrtStatus, Runtime, Target, TensorPlacement, TensorSet,
};

const ADD_ONE: &str = "HloModule add_one\nENTRY e {\n  x = f32[4]{0} parameter(0)\n  one = f32[] constant(1)\n  \
                       b = f32[4]{0} broadcast(one), dimensions={}\n  ROOT y = f32[4]{0} add(x, b)\n}\n";

const LOG: &str = "HloModule log\nENTRY e {\n  x = f32[4]{0} parameter(0)\n  ROOT y = f32[4]{0} log(x)\n}\n";

fn config_in(lock_dir: &tempfile::TempDir) -> Config {
    Config {
        lock_dir: lock_dir.path().to_path_buf(),
        cores: CoreRequest::Visible(CoreSet::range(0, 0)),
        ..Config::default()
    }
}

fn started(adjust: impl FnOnce(&mut Config)) -> Fixture {
    common::started(CoreSet::range(0, 0), adjust)
}

/// Loads `hlo` on nc0 with one f32[4] input holding `x` and one output.
fn bound(rt: &Runtime, hlo: &str, x: &[f32]) -> (neuron_runtime::Model, TensorSet, TensorSet) {
    let (model, inputs, outputs) = common::bind_f32(rt, &neff(hlo, Target::Trn1), 4);
    inputs.get("input0").expect("bound").write(0, &f32_bytes(x)).expect("write");
    (model, inputs, outputs)
}

#[test]
fn executes_a_model_and_accounts_its_memory() {
    let f = started(|_| {});
    let (model, inputs, outputs) = bound(&f.runtime, ADD_ONE, &[1.0, 2.0, 3.0, 4.0]);
    let report = f.runtime.execute(&model, &inputs, &outputs).expect("executes");
    assert_eq!(floats(&outputs.get("output0").expect("bound").read_all().expect("read")), [2.0, 3.0, 4.0, 5.0]);
    assert_eq!(report.numerical_errors, 0);
    assert_eq!(report.flops, 4);

    assert_eq!(model.device_memory(DeviceCategory::Constants), 4);
    assert!(model.device_memory(DeviceCategory::ModelCode) > 0);
    assert!(model.host_memory(HostCategory::ApplicationMemory) > 0);
    let usage = f.runtime.device_memory_usage(0);
    assert_eq!(usage.get(DeviceCategory::Tensors), 16, "the device input tensor");
    assert_eq!(usage.get(DeviceCategory::Constants), 4);
    assert_eq!(f.runtime.host_memory_usage().get(HostCategory::Tensors), 16, "the host output tensor");

    f.runtime.unload(&model).expect("unloads");
    assert_eq!(f.runtime.device_memory_usage(0).get(DeviceCategory::Constants), 0);
    let err = f.runtime.execute(&model, &inputs, &outputs).expect_err("unloaded");
    assert_eq!(err.status, NrtStatus::InvalidHandle);
    drop(inputs);
    assert_eq!(f.runtime.device_memory_usage(0).get(DeviceCategory::Tensors), 0);
}

#[test]
fn one_tensor_can_be_both_input_and_output() {
    let f = started(|_| {});
    let (model, inputs, _) = bound(&f.runtime, ADD_ONE, &[1.0, 2.0, 3.0, 4.0]);
    let mut outputs = TensorSet::new();
    outputs.add("output0", inputs.get("input0").expect("bound").clone());
    f.runtime.execute(&model, &inputs, &outputs).expect("in-place execution");
    f.runtime.execute(&model, &inputs, &outputs).expect("and again");
    let y = floats(&outputs.get("output0").expect("bound").read_all().expect("read"));
    assert_eq!(y, [3.0, 4.0, 5.0, 6.0]);
}

#[test]
fn calls_before_init_and_after_close_fail_with_their_codes() {
    let lock_dir = tempfile::tempdir().expect("tempdir");
    let rt = Runtime::new(config_in(&lock_dir));
    let err = rt.load(&neff(ADD_ONE, Target::Trn1), None).expect_err("not initialised");
    assert_eq!(err.status, NrtStatus::Uninitialized);
    assert_eq!(err.code(), 13);
    rt.init().expect("init");
    let tensor = rt.allocate_tensor(TensorPlacement::Host, 8, "t").expect("alloc");
    rt.close().expect("close");
    assert_eq!(rt.allocate_tensor(TensorPlacement::Host, 8, "u").expect_err("closed").status, NrtStatus::Closed);
    assert_eq!(tensor.write(0, &[1]).expect_err("closed").code(), 14);
    assert_eq!(rt.init().expect_err("closed for good").status, NrtStatus::Closed);
    // Closing released the core: a new runtime can take it.
    Runtime::start(config_in(&lock_dir)).expect("core released by close");
}

#[test]
fn bad_inputs_are_refused_before_anything_executes() {
    let f = started(|_| {});
    let rt = &f.runtime;
    let (model, inputs, outputs) = bound(rt, ADD_ONE, &[1.0; 4]);
    let output = outputs.get("output0").expect("bound").clone();
    output.write(0, &f32_bytes(&[9.0; 4])).expect("sentinel");

    let mut missing = TensorSet::new();
    missing.add("inputX", inputs.get("input0").expect("bound").clone());
    let err = rt.execute(&model, &missing, &outputs).expect_err("unknown name");
    assert_eq!(err.status, NrtStatus::ExecBadInput);
    assert!(err.message.contains("inputX"), "{}", err.message);
    assert_eq!(rt.execute(&model, &TensorSet::new(), &outputs).expect_err("missing").code(), 1002);

    let mut wrong_size = TensorSet::new();
    wrong_size.add("input0", rt.allocate_tensor(TensorPlacement::Host, 12, "short").expect("alloc"));
    let err = rt.execute(&model, &wrong_size, &outputs).expect_err("size");
    assert!(err.message.contains("16 bytes"), "{}", err.message);

    let mut wrong_type = TensorSet::new();
    let ints = ArrayType::new(DType::S32, vec![4]);
    wrong_type.add("input0", rt.allocate_tensor_for(TensorPlacement::Host, &ints, "ints").expect("alloc"));
    let err = rt.execute(&model, &wrong_type, &outputs).expect_err("dtype");
    assert_eq!(err.status, NrtStatus::ExecBadInput);
    assert!(err.message.contains("s32[4]"), "{}", err.message);

    assert_eq!(floats(&output.read_all().expect("read")), [9.0; 4], "nothing executed");
}

#[test]
fn exceeding_the_execution_timeout_is_nrt_timeout() {
    let f = started(|c| c.exec_timeout = Duration::from_nanos(1));
    let (model, inputs, outputs) = bound(&f.runtime, ADD_ONE, &[1.0; 4]);
    let err = f.runtime.execute(&model, &inputs, &outputs).expect_err("deadline");
    assert_eq!(err.status, NrtStatus::Timeout);
    assert!(err.message.contains("NEURON_RT_EXEC_TIMEOUT"), "{}", err.message);
}

#[test]
fn nan_and_inf_are_counted_or_fatal_by_verbosity() {
    let f = started(|_| {});
    let (model, inputs, outputs) = bound(&f.runtime, LOG, &[-1.0, 0.0, 1.0, 2.0]);
    let report = f.runtime.execute(&model, &inputs, &outputs).expect("warning mode succeeds");
    assert_eq!(report.numerical_errors, 2, "log(-1) = NaN, log(0) = -inf");

    let f = started(|c| c.numerical_errors = NumericalErrorsVerbosity::None);
    let (model, inputs, outputs) = bound(&f.runtime, LOG, &[-1.0, 0.0, 1.0, 2.0]);
    let report = f.runtime.execute(&model, &inputs, &outputs).expect("none mode succeeds");
    assert_eq!(report.numerical_errors, 0, "none mode does not look at outputs");

    let f = started(|c| c.numerical_errors = NumericalErrorsVerbosity::Critical);
    let (model, inputs, outputs) = bound(&f.runtime, LOG, &[-1.0, 0.0, 1.0, 2.0]);
    let err = f.runtime.execute(&model, &inputs, &outputs).expect_err("critical mode fails");
    assert_eq!(err.status, NrtStatus::ExecCompletedWithNumErr);
    assert_eq!(err.code(), 1003);
    let y = floats(&outputs.get("output0").expect("bound").read_all().expect("read"));
    assert!(y[0].is_nan() && y[1] == f32::NEG_INFINITY && y[2] == 0.0, "outputs were still written: {y:?}");
}

#[test]
fn device_memory_capacity_is_enforced_with_a_usage_table() {
    let f = started(|_| {});
    let device = TensorPlacement::Device { core: 0 };
    let held = f.runtime.allocate_tensor(device, 2 << 30, "held").expect("2 GiB fits");
    let err = f.runtime.allocate_tensor(device, 31 << 30, "more").expect_err("over the 32 GiB capacity");
    assert_eq!(err.status, NrtStatus::Resource);
    assert!(err.message.contains("Failed to allocate 31.0 GiB (tensors) on ND 0:NC 0"), "{}", err.message);
    assert!(err.message.contains("2.0 GiB"), "the table shows what is in use: {}", err.message);
    assert_eq!(f.runtime.device_memory_usage(0).get(DeviceCategory::Tensors), 2 << 30, "nothing was charged");
    drop(held);
    assert_eq!(f.runtime.device_memory_usage(0).total(), 0);
}

#[test]
fn a_tensor_of_4_gib_plus_one_byte_works_beyond_4_gib() {
    let f = started(|_| {});
    let size = (4u64 << 30) + 1;
    let tensor =
        f.runtime.allocate_tensor(TensorPlacement::Device { core: 0 }, size, "huge").expect("4 GiB + 1 allocates");
    assert_eq!(tensor.size(), size);
    tensor.write(size - 3, &[1, 2, 3]).expect("write across the 4 GiB boundary");
    tensor.memset((4u64 << 30) - 3, 7, 1).expect("memset below the boundary");
    let mut back = [0u8; 5];
    tensor.read(size - 5, &mut back).expect("read back");
    assert_eq!(back, [0, 7, 1, 2, 3]);
    let slice = tensor.slice(4u64 << 30, 1, "last byte").expect("slice beyond 4 GiB");
    let mut last = [0u8; 1];
    slice.read(0, &mut last).expect("read slice");
    assert_eq!(last, [3]);

    let err = tensor.write(size, &[9]).expect_err("past the end");
    assert_eq!(err.status, NrtStatus::Invalid);
    let err = tensor.write(size - 1, &[9, 9]).expect_err("straddles the end");
    assert_eq!(err.status, NrtStatus::Invalid);
    assert_eq!(tensor.read(u64::MAX, &mut last).expect_err("offset overflow").status, NrtStatus::Invalid);
    tensor.read(size - 1, &mut last).expect("read");
    assert_eq!(last, [3], "failed writes changed nothing");
    assert_eq!(f.runtime.device_memory_usage(0).get(DeviceCategory::Tensors), size);
}

#[test]
fn tensors_copy_and_slice_with_bounds_checks() {
    let f = started(|_| {});
    let a = f.runtime.allocate_tensor(TensorPlacement::Host, 8, "a").expect("alloc");
    let b = f.runtime.allocate_tensor(TensorPlacement::Device { core: 0 }, 8, "b").expect("alloc");
    a.write(0, &[1, 2, 3, 4, 5, 6, 7, 8]).expect("write");
    a.copy_to(2, &b, 4, 4).expect("copy");
    assert_eq!(b.read_all().expect("read"), [0, 0, 0, 0, 3, 4, 5, 6]);
    a.copy_to(0, &a, 4, 4).expect("overlapping copy within one tensor");
    assert_eq!(a.read_all().expect("read"), [1, 2, 3, 4, 1, 2, 3, 4]);
    let err = a.copy_to(6, &b, 0, 4).expect_err("source range");
    assert_eq!(err.status, NrtStatus::Invalid);
    assert!(
        err.message.contains("cannot copy 4 bytes at offset 6 of tensor `a`, which holds 8 bytes"),
        "{}",
        err.message
    );
    let err = a.copy_to(0, &b, 6, 4).expect_err("destination range");
    assert!(err.message.contains("cannot copy into 4 bytes at offset 6 of tensor `b`"), "{}", err.message);
    assert_eq!(a.slice(4, 8, "s").expect_err("slice range").status, NrtStatus::Invalid);
    let s = b.slice(4, 4, "tail").expect("slice");
    s.memset(0, 0xff, 2).expect("memset slice");
    assert_eq!(b.read_all().expect("read"), [0, 0, 0, 0, 0xff, 0xff, 5, 6]);
    let err = f.runtime.allocate_tensor(TensorPlacement::Device { core: 1 }, 8, "c").expect_err("nc1 not held");
    assert_eq!(err.status, NrtStatus::Invalid);
}

#[test]
fn a_neff_for_another_core_generation_is_refused() {
    let f = started(|_| {});
    let err = f.runtime.load(&neff(ADD_ONE, Target::Trn2), None).expect_err("v3 NEFF on v2 cores");
    assert_eq!(err.status, NrtStatus::Invalid);
    assert!(err.message.contains("--target"), "{}", err.message);

    let f = started(|c| {
        c.instance_type = InstanceType::Trn2_48xlarge;
        c.cores = CoreRequest::Count(2);
    });
    assert_eq!(f.runtime.cores().expect("cores").cores(), &[0, 1]);
    f.runtime.load(&neff(ADD_ONE, Target::Trn2), Some(1)).expect("v3 NEFF on trn2");
}

/// Tensors are bound by name: a NEFF with two inputs of one name (which no execution
/// could ever be given) is refused at load, not at every execution.
#[test]
fn a_neff_with_two_inputs_of_one_name_is_refused_at_load() {
    const TWO: &str = "HloModule two\nENTRY e {\n  x = f32[4]{0} parameter(0)\n  y = f32[4]{0} parameter(1)\n  \
                       ROOT z = f32[4]{0} add(x, y)\n}\n";
    let mut program = neuron_runtime::compile_hlo(TWO, Target::Trn1).expect("compiles");
    program.inputs[1].name = program.inputs[0].name.clone();
    let bytes = neuron_runtime::Neff::new("two", program).encode();
    let f = started(|_| {});
    let err = f.runtime.load(&bytes, None).expect_err("two inputs of one name");
    assert_eq!(err.status, NrtStatus::Invalid);
    assert!(err.message.contains("two inputs are named `input0`"), "{}", err.message);
}

#[test]
fn hash_validation_follows_the_configuration() {
    let mut bytes = neff(ADD_ONE, Target::Trn1);
    // Corrupt the stored SHA-256 (header bytes 48..80) and fix the header checksum,
    // so that only hash validation can notice.
    bytes[48] ^= 0xff;
    let header_len = u32::from_le_bytes(bytes[36..40].try_into().expect("4 bytes")) as usize;
    let crc = crc32(&bytes[..header_len - 4]);
    bytes[header_len - 4..header_len].copy_from_slice(&crc.to_le_bytes());

    let f = started(|_| {});
    f.runtime.load(&bytes, None).expect("hash not checked by default");
    let f = started(|c| c.validate_hash = true);
    let err = f.runtime.load(&bytes, None).expect_err("hash checked");
    assert_eq!(err.status, NrtStatus::Invalid);
    assert!(err.message.contains("hash"), "{}", err.message);
}

/// CRC-32 (IEEE), as the NEFF header uses; written out here so the test does not
/// share code with the implementation it checks.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

#[test]
fn operators_without_jax_fixtures_compute_the_right_values() {
    // abs, logistic, sqrt, and a tuple returned by a call and taken apart with
    // get-tuple-element: operators the JAX fixtures do not happen to emit.
    const HLO: &str = "HloModule ops\n\
        pair {\n  p = f32[4]{0} parameter(0)\n  a = f32[4]{0} abs(p)\n  s = f32[4]{0} logistic(p)\n  \
        ROOT t = (f32[4]{0}, f32[4]{0}) tuple(a, s)\n}\n\
        ENTRY e {\n  x = f32[4]{0} parameter(0)\n  t = (f32[4]{0}, f32[4]{0}) call(x), to_apply=pair\n  \
        a = f32[4]{0} get-tuple-element(t), index=0\n  s = f32[4]{0} get-tuple-element(t), index=1\n  \
        r = f32[4]{0} sqrt(a)\n  ROOT y = f32[4]{0} add(r, s)\n}\n";
    let f = started(|_| {});
    let x = [-4.0f32, -1.0, 0.0, 9.0];
    let (model, inputs, outputs) = bound(&f.runtime, HLO, &x);
    f.runtime.execute(&model, &inputs, &outputs).expect("executes");
    let y = floats(&outputs.get("output0").expect("bound").read_all().expect("read"));
    for (got, x) in y.iter().zip(x) {
        let want = x.abs().sqrt() + 1.0 / (1.0 + (-x).exp());
        assert!((got - want).abs() <= 1e-6, "f({x}) = {got}, expected {want}");
    }
}

#[test]
fn outputs_sharing_one_tensor_are_each_written() {
    // Two outputs bound to slices of one tensor cannot both be written in place while
    // the program runs; they are copied out afterwards, and both must arrive.
    const HLO: &str = "HloModule two\nENTRY e {\n  x = f32[4]{0} parameter(0)\n  n = f32[4]{0} negate(x)\n  \
                       d = f32[4]{0} add(x, x)\n  ROOT t = (f32[4]{0}, f32[4]{0}) tuple(n, d)\n}\n";
    let f = started(|_| {});
    let (model, inputs, _) = bound(&f.runtime, HLO, &[1.0, 2.0, 3.0, 4.0]);
    let both = f.runtime.allocate_tensor(TensorPlacement::Host, 32, "both").expect("alloc");
    let mut outputs = TensorSet::new();
    outputs.add("output0", both.slice(0, 16, "first").expect("slice"));
    outputs.add("output1", both.slice(16, 16, "second").expect("slice"));
    f.runtime.execute(&model, &inputs, &outputs).expect("executes");
    assert_eq!(floats(&both.read_all().expect("read")), [-1.0, -2.0, -3.0, -4.0, 2.0, 4.0, 6.0, 8.0]);
}

/// A datastore whose header disagrees with itself is refused naming the field, not with
/// "N bytes but its header describes N bytes".
#[test]
fn a_damaged_datastore_header_names_the_field_that_disagrees() {
    let f = started(|_| {});
    let original = std::fs::read(f.runtime.datastore_path().expect("a datastore")).expect("read");
    let dir = tempfile::tempdir().expect("tempdir");
    let copy = dir.path().join("nrt-1-0.ds");
    let mut bytes = original.clone();
    // The file-size word of the header (offset 16), one byte more.
    let stated = u64::from_le_bytes(bytes[16..24].try_into().expect("8 bytes")) + 1;
    bytes[16..24].copy_from_slice(&stated.to_le_bytes());
    std::fs::write(&copy, &bytes).expect("write");
    let err = neuron_datastore::DatastoreReader::open(&copy).expect_err("inconsistent header").to_string();
    assert!(err.contains(&format!("its header says the file is {stated} bytes")), "{err}");
    assert!(!err.contains("but its header describes"), "{err}");
}
