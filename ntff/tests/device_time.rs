//! The summary's device time is the executions' time: device work outside any
//! execution (a framework's tensor copies between steps) is not counted as busy time
//! from its first to its last event.

use ntff::{Descriptor, DeviceEvent, Metadata, NtffFile, Writer};

#[test]
fn copies_between_executions_do_not_count_as_the_executions_device_time() {
    let mut writer = Writer::new(Vec::new(), &Metadata { pid: 1, ..Metadata::default() }).expect("header");
    let (engine, opcode, hlo, queue) =
        (writer.intern("DVE"), writer.intern("Add"), writer.intern("add.1"), writer.intern("input"));
    let add = writer.descriptor(&Descriptor::Instruction {
        model_id: 1,
        engine,
        opcode,
        hlo,
        step: 0,
        flops: 4,
        bytes_read: 32,
        bytes_written: 16,
    });
    let copy = writer.descriptor(&Descriptor::Dma { model_id: 0, queue, index: 0, bytes: 16 });
    let mut id = 0;
    let mut event = |exec_id: Option<u64>, start_ns: u64, end_ns: u64, descriptor| {
        id += 1;
        DeviceEvent { core: 0, id, exec_id, start_ns, end_ns, descriptor }
    };
    // Two executions of 1 µs each, 1 s apart, and a copy before and after each.
    let events = [
        event(None, 0, 100, copy),
        event(Some(1), 1_000, 2_000, add),
        event(None, 500_000_000, 500_000_100, copy),
        event(Some(2), 1_000_000_000, 1_000_001_000, add),
        event(None, 1_000_002_000, 1_000_002_100, copy),
    ];
    for e in &events {
        writer.device(e).expect("write");
    }
    let (bytes, _) = writer.finish().expect("finish");
    let file = NtffFile::from_bytes(bytes).expect("opens");
    let summary = ntff::summary::summarise(&file, None);
    assert!((summary.device_time_s - 2e-6).abs() < 1e-12, "{} s", summary.device_time_s);
}
