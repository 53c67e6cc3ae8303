//! One corpus of damaged profiles read by every output: the summary (text, JSON and the
//! dashboard's), the trace exports and the tables (with the `parquet` feature) must report the same damaged chunks
//! and the same lost events. A damaged chunk is never skipped without a word; a chunk
//! whose frame cannot be trusted (its length rewritten to zero, with a checksum that
//! matches) counts as damaged too.

use ntff::export::{ExportOptions, Format, export};
use ntff::summary::{summarise, to_text};
use ntff::{Descriptor, DeviceEvent, Metadata, NtffFile, SyncPoint, Writer};

const FRAME_BYTES: usize = 20;
const TRAILER_BYTES: usize = 16;

/// A finished profile of 6 chunks of 50 device events each on one core.
fn clean() -> Vec<u8> {
    let metadata = Metadata { runtime_version: "test".into(), pid: 1, ..Metadata::default() };
    let mut w = Writer::new(Vec::new(), &metadata).expect("header");
    w.sync_point(0, SyncPoint { host_ns: 1_000, device_ns: 1_000 }).expect("sync");
    let d = Descriptor::Instruction {
        model_id: 1,
        engine: w.intern("PE"),
        opcode: w.intern("MatMult"),
        hlo: w.intern("dot.1"),
        step: 0,
        flops: 1 << 20,
        bytes_read: 4096,
        bytes_written: 4096,
    };
    let d = w.descriptor(&d);
    for k in 0..300u64 {
        let start_ns = 10_000 + k * 1_000;
        w.device(&DeviceEvent {
            core: 0,
            id: k,
            exec_id: Some(1 + k / 100),
            start_ns,
            end_ns: start_ns + 900,
            descriptor: d,
        })
        .expect("write");
        if k % 50 == 49 {
            w.flush().expect("flush");
        }
    }
    w.finish().expect("finish").0
}

/// Every way of damaging chunk `victim` of `bytes`: its name, the damaged bytes.
fn corpus(bytes: &[u8], offset: usize) -> Vec<(&'static str, Vec<u8>)> {
    let length = u32::from_le_bytes(bytes[offset + 8..offset + 12].try_into().expect("4 bytes")) as usize;
    let mut flipped = bytes.to_vec();
    flipped[offset + FRAME_BYTES + length / 2] ^= 0x10;
    // Length zero, checksum recomputed over the header alone: the frame checks out.
    let mut zero = bytes.to_vec();
    zero[offset + 8..offset + 12].copy_from_slice(&0u32.to_le_bytes());
    let crc = crc32fast::hash(&zero[offset + 4..offset + 16]);
    zero[offset + 16..offset + 20].copy_from_slice(&crc.to_le_bytes());
    let unindexed = |b: &[u8]| b[..b.len() - TRAILER_BYTES].to_vec();
    vec![
        ("a flipped bit", flipped.clone()),
        ("a zero-length frame", zero.clone()),
        ("a flipped bit, no index", unindexed(&flipped)),
        ("a zero-length frame, no index", unindexed(&zero)),
    ]
}

#[test]
fn every_output_reports_the_same_damaged_chunk() {
    let bytes = clean();
    let whole = NtffFile::from_bytes(bytes.clone()).expect("opens");
    assert_eq!(whole.chunks().len(), 6);
    let victim = whole.chunks()[2];
    let lost = u64::from(victim.system_events) + u64::from(victim.device_events);
    assert_eq!(lost, 50);
    let total = summarise(&whole, None).events.device;
    for (name, damaged) in corpus(&bytes, victim.offset as usize) {
        let file = NtffFile::from_bytes(damaged).expect("opens");
        let summary = summarise(&file, None);
        assert_eq!(summary.events.lost_in_file, lost, "{name}: summary");
        assert_eq!(summary.events.device, total - lost, "{name}: the other chunks are read");
        assert!(!summary.file_problems.is_empty(), "{name}: the summary says what was lost");
        let text = to_text(&summary, "damaged.ntff");
        assert!(text.contains(&format!("{lost} in the file")) && text.contains("warning:"), "{name}: {text}");
        let json = serde_json::to_value(&summary).expect("json");
        assert_eq!(json["events"]["lost_in_file"], lost, "{name}");
        assert!(json["file_problems"].as_array().is_some_and(|p| !p.is_empty()), "{name}");

        let options = ExportOptions::default();
        let (_, exported) =
            export(std::slice::from_ref(&file), &options, Format::Perfetto, Vec::new(), &mut |_| {}).expect("exports");
        assert_eq!((exported.damaged_chunks, exported.damaged_chunk_events), (1, lost), "{name}: perfetto");
        assert!(!exported.problems().is_empty(), "{name}");
        assert_eq!(exported.device_slices, total - lost, "{name}");
        let (_, chrome) = export(std::slice::from_ref(&file), &options, Format::ChromeJson, Vec::new(), &mut |_| {})
            .expect("exports");
        assert_eq!((chrome.damaged_chunks, chrome.damaged_chunk_events), (1, lost), "{name}: chrome json");

        #[cfg(feature = "parquet")]
        {
            let dir = tempfile::tempdir().expect("tempdir");
            let options = ntff::tables::TablesOptions::default();
            let tables = ntff::tables::write_tables(&file, &options, dir.path(), &mut |_| {}).expect("tables");
            assert!(!tables.problems.is_empty(), "{name}: tables");
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 128, ..Default::default() })]

    /// Any damage inside one chunk (a flipped bit anywhere in its frame or payload, or its
    /// length set to any value with a matching checksum), with or without the index: the
    /// summary and the exports (Perfetto, Chrome JSON) count the same lost events, every event they read is one
    /// of the file's, and any that went missing is said in the file's problems.
    #[test]
    fn the_summary_and_the_exports_agree_on_any_damaged_chunk(
        victim in 0usize..6,
        flip in proptest::prelude::any::<bool>(),
        at in 4usize..100_000,
        bit in 0u8..8,
        length in 0u32..200_000,
        indexed in proptest::prelude::any::<bool>(),
    ) {
        let bytes = clean();
        let whole = NtffFile::from_bytes(bytes.clone()).expect("opens");
        let total = summarise(&whole, None).events.device;
        let info = whole.chunks()[victim];
        let offset = info.offset as usize;
        let stated = u32::from_le_bytes(bytes[offset + 8..offset + 12].try_into().expect("4 bytes")) as usize;
        let mut damaged = bytes.clone();
        if flip {
            // Past the sync word, so that the frame is still found where it was.
            damaged[offset + 4 + at % (FRAME_BYTES - 4 + stated)] ^= 1 << bit;
        } else {
            damaged[offset + 8..offset + 12].copy_from_slice(&length.to_le_bytes());
            let crc = crc32fast::hash(&damaged[offset + 4..offset + 16]);
            damaged[offset + 16..offset + 20].copy_from_slice(&crc.to_le_bytes());
        }
        if !indexed {
            damaged.truncate(damaged.len() - TRAILER_BYTES);
        }
        let file = NtffFile::from_bytes(damaged).expect("opens");
        let summary = summarise(&file, None);
        let options = ExportOptions::default();
        let (_, exported) = export(std::slice::from_ref(&file), &options, Format::Perfetto, Vec::new(), &mut |_| {})
            .expect("exports");
        proptest::prop_assert_eq!(summary.events.lost_in_file, exported.damaged_chunk_events);
        let (_, chrome) = export(std::slice::from_ref(&file), &options, Format::ChromeJson, Vec::new(), &mut |_| {})
            .expect("exports");
        proptest::prop_assert_eq!(summary.events.lost_in_file, chrome.damaged_chunk_events);
        // (Fewer lost events than went missing only where the frame header itself was
        // hit: its event count can no longer be trusted, and the problem line gives the
        // bytes lost instead.)
        proptest::prop_assert!(summary.events.device <= total);
        if summary.events.device < total {
            proptest::prop_assert!(!summary.file_problems.is_empty(), "events went missing without a word");
        }
        // Events the export reads but cannot place (their core's sync point was in the
        // damaged chunk) are counted and said too.
        proptest::prop_assert_eq!(exported.device_slices + exported.unaligned_device_events, summary.events.device);
    }
}
