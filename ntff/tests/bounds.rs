//! A DMA-bound profile: executions whose input transfers take nearly all the device
//! time around a tiny matrix product. The virtual device binds inputs in place, so no
//! capture makes one; this file is what a device with real copies would record, and
//! the analysis must name the queue first and order the bounds below the measured time.

mod common;

use ntff::summary::summarise;
use ntff::{Clock, Descriptor, DeviceEvent, Metadata, NtffFile, Phase, SyncPoint, Writer};

const MIB: u64 = 1024 * 1024;

fn dma_bound_file() -> NtffFile {
    let metadata = Metadata {
        runtime_version: "test".into(),
        pid: 1,
        defined_pe_flops_per_core: 664e9,
        defined_vector_flops_per_core: 166e9,
        ..Metadata::default()
    };
    let mut w = Writer::new(Vec::new(), &metadata).expect("header");
    let (execute, running) = (w.intern("nrt_execute"), w.intern("nc_exec_running"));
    let input = Descriptor::Dma { model_id: 1, queue: w.intern("input"), index: 0, bytes: 8 * MIB };
    let input = w.descriptor(&input);
    let dot = Descriptor::Instruction {
        model_id: 1,
        engine: w.intern("PE"),
        opcode: w.intern("MatMult"),
        hlo: w.intern("dot.1"),
        step: 0,
        flops: 2 * 16 * 16 * 16,
        bytes_read: 2 * 16 * 16 * 4,
        bytes_written: 16 * 16 * 4,
    };
    let dot = w.descriptor(&dot);
    let system = common::execution_event;
    // Device and host clocks agree; executions follow each other closely. Half of the
    // transfers run at 8 MiB / 400 µs (21 GB/s), the others four times slower.
    let mut t = 1_000_000u64;
    for exec in 1..=10u64 {
        w.sync_point(0, SyncPoint { host_ns: t, device_ns: t }).expect("sync");
        w.system(&system(execute, Phase::Start, Clock::Host, t, exec)).expect("write");
        w.system(&system(running, Phase::Start, Clock::Device, t + 5_000, exec)).expect("write");
        let copy = if exec % 2 == 0 { 400_000 } else { 1_600_000 };
        let start = t + 5_000;
        w.device(&DeviceEvent {
            core: 0,
            id: exec * 2,
            exec_id: Some(exec),
            start_ns: start,
            end_ns: start + copy,
            descriptor: input,
        })
        .expect("write");
        let product = start + copy;
        w.device(&DeviceEvent {
            core: 0,
            id: exec * 2 + 1,
            exec_id: Some(exec),
            start_ns: product,
            end_ns: product + 1_000,
            descriptor: dot,
        })
        .expect("write");
        w.system(&system(running, Phase::Stop, Clock::Device, product + 2_000, exec)).expect("write");
        t = product + 7_000;
        w.system(&system(execute, Phase::Stop, Clock::Host, t, exec)).expect("write");
        t += 3_000;
    }
    let (bytes, _) = w.finish().expect("finish");
    NtffFile::from_bytes(bytes).expect("opens")
}

#[test]
fn a_dma_bound_profile_names_the_input_queue_first() {
    let s = summarise(&dma_bound_file(), None);
    let b = s.bounds.expect("bounds");
    assert_eq!(b.executions, 10);
    assert_eq!(b.pipeline_resource, "DMA input", "{b:?}");
    let memory = b.memory_s.expect("a memory bound: the fast transfers set the bandwidth");
    assert!(memory <= b.pipeline_s && b.pipeline_s <= b.device_s, "{b:?}");
    assert!(b.compute_s.expect("compute bound") < memory, "{b:?}");
    assert!(b.host_s.expect("host time") >= b.device_s);
    // 80 MiB at the fast transfers' 21 GB/s is 4 ms of the 10 ms the queue is busy.
    assert!((memory - 0.004).abs() < 1e-6, "{memory}");
    let first = &s.findings[0];
    assert_eq!((first.kind.as_str(), first.about.as_str()), ("busy resource", "DMA input"), "{:?}", s.findings);
    assert!((first.saves_s - 0.006).abs() < 1e-6, "the slow transfers' excess: {first:?}");
    assert!(first.evidence.contains("active of"), "{first:?}");
}
