//! Files cut short or damaged: every complete chunk is recovered, the loss is reported,
//! and no input makes the reader panic.

mod common;

use common::{Streams, read_all};
use ntff::{Descriptor, DeviceEvent, Metadata, NtffError, NtffFile, Writer};

/// A small capture of 4 chunks of 5 events per core on 2 cores.
fn small_capture() -> (Vec<u8>, u64) {
    let metadata = Metadata { runtime_version: "test".into(), ..Metadata::default() };
    let mut writer = Writer::new(Vec::new(), &metadata).expect("header");
    let mut events = 0;
    for k in 0..40u64 {
        let core = (k % 2) as u32;
        let descriptor = Descriptor::Instruction {
            model_id: 1,
            engine: writer.intern("PE"),
            opcode: writer.intern(&format!("MatMult{}", k % 3)),
            hlo: writer.intern("dot.1"),
            step: (k % 3) as u32,
            flops: 1 << 20,
            bytes_read: 4096,
            bytes_written: 2048,
        };
        let descriptor = writer.descriptor(&descriptor);
        let start_ns = 1_000 + k * 500;
        writer
            .device(&DeviceEvent { core, id: k / 2, exec_id: Some(1), start_ns, end_ns: start_ns + 400, descriptor })
            .expect("write");
        events += 1;
        if k % 10 == 9 {
            writer.flush().expect("flush");
        }
    }
    (writer.finish().expect("finish").0, events)
}

fn recovered_events(file: &NtffFile) -> u64 {
    file.chunks().iter().filter_map(|c| file.read_chunk(c).ok()).map(|c| (c.system.len() + c.device.len()) as u64).sum()
}

/// Whether each stream of `part` is a prefix of the same stream of `whole`.
fn is_prefix(part: &Streams, whole: &Streams) -> bool {
    part.iter().all(|(core, s)| {
        let w = &whole[core];
        w.device.starts_with(&s.device) && w.system.starts_with(&s.system)
    })
}

#[test]
fn a_file_cut_at_any_byte_opens_with_every_complete_chunk() {
    let (bytes, events) = small_capture();
    let whole = read_all(&NtffFile::from_bytes(bytes.clone()).expect("opens"));
    let mut previous = 0;
    for len in 0..=bytes.len() {
        let result = NtffFile::from_bytes(bytes[..len].to_vec());
        if len < 16 {
            assert!(matches!(result, Err(NtffError::Truncated { .. })), "{len}: {result:?}");
            continue;
        }
        let file = result.unwrap_or_else(|e| panic!("a {len}-byte prefix fails to open: {e}"));
        let recovered = recovered_events(&file);
        assert!(recovered >= previous, "{len}: {recovered} events after {previous}");
        previous = recovered;
        assert!(is_prefix(&read_all(&file), &whole), "{len}: recovered events differ");
        let recovery = file.recovery();
        if len < bytes.len() {
            assert!(!recovery.is_clean(), "{len}");
            assert!(!recovery.describe().is_empty());
        }
        // Only an incomplete chunk is missing: its events are the ones reported lost.
        if recovery.truncated.as_ref().is_some_and(|t| t.kind == Some("event chunk")) {
            assert_eq!(recovery.events_lost() + recovered, events.min(recovered + recovery.events_lost()));
        }
    }
    assert_eq!(previous, events);
}

#[test]
fn a_cut_inside_a_chunk_reports_its_events_as_lost() {
    let (bytes, events) = small_capture();
    let full = NtffFile::from_bytes(bytes.clone()).expect("opens");
    let last = full.chunks().last().expect("chunks").offset as usize;
    let file = NtffFile::from_bytes(bytes[..last + 30].to_vec()).expect("opens");
    let truncated = file.recovery().truncated.clone().expect("truncated");
    assert_eq!(truncated.kind, Some("event chunk"));
    assert_eq!(truncated.offset, last as u64);
    assert_eq!(recovered_events(&file) + file.recovery().events_lost(), events);
    let text = file.recovery().describe().join("\n");
    assert!(text.contains("not finished") && text.contains("holding 5 events"), "{text}");
}

#[test]
fn a_damaged_chunk_is_skipped_and_reported() {
    let (mut bytes, events) = small_capture();
    let full = NtffFile::from_bytes(bytes.clone()).expect("opens");
    let victim = full.chunks()[2];
    bytes[victim.offset as usize + 25] ^= 0x40;

    // Through the index: the chunk fails its checksum when read; the others read.
    let file = NtffFile::from_bytes(bytes.clone()).expect("opens");
    let err = file.read_chunk(&file.chunks()[2]).expect_err("damaged");
    assert!(err.to_string().contains("checksum mismatch"), "{err}");
    assert_eq!(recovered_events(&file), events - 5);

    // Without the index (the trailer cut off), the scan skips it and reports it.
    let file = NtffFile::from_bytes(bytes[..bytes.len() - 3].to_vec()).expect("opens");
    let damaged = &file.recovery().damaged;
    assert_eq!(damaged.len(), 1, "{damaged:?}");
    assert_eq!((damaged[0].offset, damaged[0].kind, damaged[0].events), (victim.offset, Some("event chunk"), Some(5)));
    assert_eq!(recovered_events(&file), events - 5);
}

#[test]
fn a_damaged_record_length_resynchronises_on_the_next_frame() {
    let (mut bytes, events) = small_capture();
    let full = NtffFile::from_bytes(bytes.clone()).expect("opens");
    let victim = full.chunks()[1].offset as usize;
    // The length field of the frame: far too long.
    bytes[victim + 10] = 0x30;
    let cut = bytes.len() - 1;
    let file = NtffFile::from_bytes(bytes[..cut].to_vec()).expect("opens");
    assert_eq!(file.recovery().damaged.len(), 1, "{:?}", file.recovery());
    assert_eq!(recovered_events(&file), events - 5);
}

#[test]
fn a_newer_version_is_refused_naming_the_supported_range() {
    let (mut bytes, _) = small_capture();
    bytes[8] = 3;
    let err = NtffFile::from_bytes(bytes).expect_err("refused");
    assert_eq!(err.to_string(), "NTFF version 3 is not supported in this version of the tool (supported: 2 - 2)");
}

#[test]
fn other_files_are_not_ntff() {
    let err = NtffFile::from_bytes(b"{\"traceEvents\": []}".to_vec()).expect_err("refused");
    assert!(matches!(err, NtffError::NotNtff), "{err}");
}

#[test]
fn written_files_open_from_disk() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("t.ntff");
    let (bytes, events) = small_capture();
    std::fs::write(&path, &bytes).expect("write");
    let file = NtffFile::open(&path).expect("opens");
    assert!(file.recovery().is_clean());
    assert_eq!(recovered_events(&file), events);
    assert_eq!(file.len(), bytes.len() as u64);
}
