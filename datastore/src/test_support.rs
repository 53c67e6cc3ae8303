//! What this crate's unit tests share: a small writer and a reader of the same file.

use crate::clock::{CalibrationPoint, DeviceClock, TickSource};
use crate::{CommandIdentity, CreateParams, DatastoreReader, DatastoreWriter};

/// A one-core datastore with small rings in a fresh directory, its writer and a reader.
pub(crate) fn open_pair() -> (tempfile::TempDir, DatastoreWriter, DatastoreReader) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let calibration = CalibrationPoint::now();
    let params = CreateParams {
        dir: dir.path().join("ds"),
        tag: None,
        instance_type: "trn1.2xlarge".into(),
        device_count: 1,
        cores_per_device: 2,
        device_memory_bytes: 1 << 30,
        instance_core_count: 2,
        cores: vec![0],
        ring_capacity: 64,
        model_slots: 4,
        string_table_bytes: 64 << 10,
        instruction_table_bytes: 64 << 10,
        tick_source: TickSource::MonotonicNs,
        calibration,
        ns_per_tick: 1.0,
        device_clocks: vec![DeviceClock::for_core(0, calibration.ticks, 1.0)],
        recording: 0,
        host_threads: 1,
        product_kernel: crate::peaks::ProductKernel::F32,
        command: CommandIdentity::of_this_process(),
    };
    let writer = DatastoreWriter::create(&params).expect("created");
    let reader = DatastoreReader::open(writer.path()).expect("opened");
    (dir, writer, reader)
}
