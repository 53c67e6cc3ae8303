//! Executions whose working memory does not fit fail with `NRT_RESOURCE` instead of
//! aborting the process, and the runtime keeps running: this test binary limits its own
//! address space (`ulimit -v`, as `RLIMIT_AS`) 1.5 GiB above what it uses, then runs
//! valid programs whose intermediates need far more. It is a test binary of its own
//! because the limit holds for the whole process.

use neuron_datastore::{DatastoreReader, ErrorClass};
use neuron_runtime::{ArrayType, CoreSet, DType, NrtStatus, Target, TensorPlacement, TensorSet};
use neuron_test_support::runtime::{neff, started};
use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// Programs with small inputs and outputs whose intermediates need many GiB.
const PROGRAMS: &[(&str, &str)] = &[
    (
        "a 12 GB iota",
        "ROOT s = s32[] reduce(i, z), dimensions={0}, to_apply=add\n  i = s32[3000000000]{0} iota(), iota_dimension=0",
    ),
    (
        "an 8 GB broadcast",
        "ROOT s = s32[] reduce(b, z), dimensions={0}, to_apply=add\n  b = s32[2000000000]{0} broadcast(x), dimensions={}",
    ),
    (
        "a 12 GB pad",
        "ROOT s = s32[] reduce(p, z), dimensions={0}, to_apply=add\n  \
         v = s32[1]{0} reshape(x)\n  p = s32[3000000000]{0} pad(v, z), padding=0_2999999999",
    ),
    (
        "a sort of 100 million elements",
        "ROOT s = s32[] reduce(o, z), dimensions={0}, to_apply=add\n  i = s32[100000000]{0} iota(), iota_dimension=0\n  \
         o = s32[100000000]{0} sort(i), dimensions={0}, to_apply=less",
    ),
    (
        "a 12 GB iota inside a loop body",
        "ROOT s = s32[] get-tuple-element(w), index=1\n  init = (s32[], s32[]) tuple(z, z)\n  \
         w = (s32[], s32[]) while(init), condition=cond, body=body",
    ),
    (
        "a convolution whose im2col rows need 130 GB",
        "ROOT s = s32[] reduce(c, z), dimensions={0,1,2,3}, to_apply=add\n  \
         img = s32[1,2000,2000,1]{3,2,1,0} broadcast(x), dimensions={}\n  k = s32[64,64,1,1]{3,2,1,0} broadcast(x), dimensions={}\n  \
         c = s32[1,2000,2000,1]{3,2,1,0} convolution(img, k), window={size=64x64 pad=31_32x31_32}, dim_labels=b01f_01io->b01f",
    ),
];

/// A module around `body` (whose lines may come in any order: the ROOT is moved last).
fn module(body: &str) -> String {
    let mut lines: Vec<&str> = body.lines().map(str::trim).collect();
    lines.rotate_left(1);
    format!(
        "HloModule big\nadd {{\n  a = s32[] parameter(0)\n  b = s32[] parameter(1)\n  ROOT c = s32[] add(a, b)\n}}\n\
         less {{\n  a = s32[] parameter(0)\n  b = s32[] parameter(1)\n  ROOT c = pred[] compare(a, b), direction=LT\n}}\n\
         cond {{\n  t = (s32[], s32[]) parameter(0)\n  i = s32[] get-tuple-element(t), index=0\n  two = s32[] constant(2)\n  \
         ROOT c = pred[] compare(i, two), direction=LT\n}}\n\
         body {{\n  t = (s32[], s32[]) parameter(0)\n  i = s32[] get-tuple-element(t), index=0\n  one = s32[] constant(1)\n  \
         n = s32[] add(i, one)\n  z = s32[] constant(0)\n  big = s32[3000000000]{{0}} iota(), iota_dimension=0\n  \
         s = s32[] reduce(big, z), dimensions={{0}}, to_apply=add\n  ROOT r = (s32[], s32[]) tuple(n, s)\n}}\n\
         ENTRY e {{\n  x = s32[] parameter(0)\n  z = s32[] constant(0)\n  {}\n}}\n",
        lines.join("\n  ")
    )
}

/// The address space this process has mapped, from `/proc/self/status`.
fn mapped_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let line = status.lines().find(|l| l.starts_with("VmSize:")).expect("VmSize");
    let kib: u64 = line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("a number of kB");
    kib * 1024
}

#[test]
fn executions_that_need_more_memory_than_the_limit_fail_with_nrt_resource_and_the_runtime_goes_on() {
    let f = started(CoreSet::range(0, 0), |_| {});
    let rt = &f.runtime;
    let scalar = ArrayType::new(DType::S32, vec![]);
    let tensor = |name: &str| rt.allocate_tensor_for(TensorPlacement::Host, &scalar, name).expect("alloc");
    let (input, output) = (tensor("x"), tensor("s"));
    input.write(0, &1i32.to_le_bytes()).expect("write");
    let mut inputs = TensorSet::new();
    inputs.add("input0", input);
    let mut outputs = TensorSet::new();
    outputs.add("output0", output.clone());
    let load = |body: &str| rt.load(&neff(&module(body), Target::Trn1), Some(0)).expect("loads");
    let small = load(
        "ROOT s = s32[] reduce(b, z), dimensions={0}, to_apply=add\n  b = s32[1000]{0} broadcast(x), dimensions={}",
    );

    let (_, hard) = getrlimit(Resource::RLIMIT_AS).expect("getrlimit");
    let limit = (mapped_bytes() + (3 << 29)).min(hard);
    setrlimit(Resource::RLIMIT_AS, limit, hard).expect("setrlimit");

    for (what, body) in PROGRAMS {
        // One at a time: together their scratchpads exceed the device's memory.
        let model = load(body);
        let err = rt.execute(&model, &inputs, &outputs).expect_err(what);
        assert_eq!(err.status, NrtStatus::Resource, "{what}: {}", err.message);
        assert!(err.message.contains("of host memory"), "{what}: {}", err.message);
        rt.unload(&model).expect("unload");
        rt.execute(&small, &inputs, &outputs).unwrap_or_else(|e| panic!("after {what}, the core runs again: {e}"));
        let sum = i32::from_le_bytes(output.read_all().expect("read")[..4].try_into().expect("4 bytes"));
        assert_eq!(sum, 1000, "after {what}");
    }

    let reader = DatastoreReader::open(&rt.datastore_path().expect("path")).expect("the datastore opens");
    let snapshot = reader.snapshot();
    let core = &snapshot.cores[0];
    assert_eq!(core.errors.get(ErrorClass::Runtime), PROGRAMS.len() as u64, "each failure is counted: {core:?}");
}
