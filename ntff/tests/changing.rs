//! Profiles that change under their reader: truncated or rewritten in place by another
//! program, or replaced by a new capture. A reader must never be killed (a mapped file
//! that shrinks raises SIGBUS), must report what it can no longer read, and a profile
//! replaced the way the writer does it (renamed into place) must read whole from the
//! version the reader opened.

mod common;

use ntff::export::{ExportOptions, Format, export};
use ntff::summary::summarise;
use ntff::{Metadata, NtffFile, Writer};
use proptest::prelude::*;

/// A finished profile from `ops`.
fn profile(ops: &[common::Op]) -> Vec<u8> {
    common::write(ops).0
}

/// Reads everything a viewer reads: every chunk, the summary and a Perfetto export.
/// Returns how many chunks could be read.
fn read_everything(file: &NtffFile) -> usize {
    let readable = file.chunks().iter().filter(|c| file.read_chunk(c).is_ok()).count();
    let _ = summarise(file, None);
    let _ = export(std::slice::from_ref(file), &ExportOptions::default(), Format::Perfetto, Vec::new(), &mut |_| {});
    readable
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Truncated in place to any length after it was opened: every chunk past the new
    /// end reads as an error, none kills the reader.
    #[test]
    fn a_profile_truncated_while_open_reads_as_errors(
        ops in prop::collection::vec(common::op(), 1..200),
        keep in 0.0f64..1.0,
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("p.ntff");
        let bytes = profile(&ops);
        std::fs::write(&path, &bytes).expect("write");
        let file = NtffFile::open(&path).expect("opens");
        let new_len = (bytes.len() as f64 * keep) as u64;
        std::fs::OpenOptions::new().write(true).open(&path).expect("open").set_len(new_len).expect("truncate");
        let readable = read_everything(&file);
        for c in file.chunks() {
            if c.offset >= new_len {
                let error = file.read_chunk(c).expect_err("past the new end");
                prop_assert!(error.to_string().contains("changed while it was read"), "{error}");
            }
        }
        prop_assert!(readable <= file.chunks().len());
    }

    /// Rewritten in place with another profile: records that no longer check out are
    /// errors, never a crash.
    #[test]
    fn a_profile_rewritten_in_place_while_open_reads_as_errors(
        ops in prop::collection::vec(common::op(), 1..200),
        other in prop::collection::vec(common::op(), 1..200),
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("p.ntff");
        std::fs::write(&path, profile(&ops)).expect("write");
        let file = NtffFile::open(&path).expect("opens");
        std::fs::write(&path, profile(&other)).expect("rewrite");
        read_everything(&file);
    }
}

/// A new capture of the same name while a reader has the old one open: the reader reads
/// the old profile whole, a new reader the new one; nothing is ever at the final name
/// half-written.
#[test]
fn a_profile_replaced_by_a_new_capture_reads_whole_from_the_version_opened() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("p.ntff");
    let metadata = |pid| Metadata { runtime_version: "test".into(), pid, ..Metadata::default() };
    let ops: Vec<common::Op> = sample_ops(300).collect();
    let (old, _) = common::write(&ops);
    std::fs::write(&path, &old).expect("write");
    let reader = NtffFile::open(&path).expect("opens");
    let chunks = reader.chunks().len();
    assert!(chunks > 1);

    let mut writer = Writer::create(&path, &metadata(7)).expect("create");
    writer.flush().expect("flush");
    assert!(dir.path().join("p.ntff.partial").exists(), "written aside");
    assert_eq!(std::fs::read(&path).expect("read"), old, "the old profile stays in place while the new one is written");
    let (file, _) = writer.finish().expect("finish");
    file.place().expect("placed");
    assert!(!dir.path().join("p.ntff.partial").exists());

    assert_eq!(read_everything(&reader), chunks, "the old version reads whole");
    assert!(reader.recovery().is_clean());
    let new = NtffFile::open(&path).expect("opens");
    assert_eq!(new.metadata().pid, 7);
    assert!(new.recovery().is_clean());
}

/// Device events on two cores, a chunk every 50.
fn sample_ops(n: u64) -> impl Iterator<Item = common::Op> {
    (0..n).map(|k| {
        if k % 50 == 49 {
            common::Op::Flush
        } else {
            common::Op::Device {
                core: (k % 2) as u32,
                descriptor: (false, 1, 0),
                fields: [k, k * 10, k * 10 + 5, 0],
                exec: Some(1),
            }
        }
    })
}

#[test]
fn only_regular_files_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("fifo.ntff");
    let status = std::process::Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(status.success());
    let error = NtffFile::open(&fifo).expect_err("a FIFO is not a profile");
    assert!(error.to_string().contains("not a regular file"), "{error}");
    let error = NtffFile::open(dir.path()).expect_err("a directory is not a profile");
    assert!(error.to_string().contains("not a regular file"), "{error}");
}
