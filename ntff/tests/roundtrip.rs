//! Every event written is read back identical, per stream and in order, with its
//! strings, descriptors, losses and sync points.

mod common;

use common::{NAMES, Op, Stream, Streams, op, read_all, write};
use ntff::{NtffFile, Sym};
use proptest::prelude::*;

/// Losses at the same position are one gap to a reader; merge them for comparing.
fn merged(streams: &Streams) -> Streams {
    let mut out = streams.clone();
    for stream in out.values_mut() {
        let mut losses: Vec<(bool, u64, u64)> = Vec::new();
        let mut sorted = stream.losses.clone();
        sorted.sort_by_key(|&(device, before, _)| (device, before));
        for (device, before, events) in sorted {
            match losses.last_mut() {
                Some(last) if last.0 == device && last.1 == before => last.2 += events,
                _ => losses.push((device, before, events)),
            }
        }
        stream.losses = losses;
    }
    out.retain(|_, s| *s != Stream::default());
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn every_event_written_is_read_back_identical(ops in prop::collection::vec(op(), 0..300)) {
        let (bytes, expected) = write(&ops);
        let file = NtffFile::from_bytes(bytes).expect("opens");
        prop_assert!(file.recovery().is_clean(), "{:?}", file.recovery());
        prop_assert_eq!(file.metadata().pid, 42);
        let read = read_all(&file);
        prop_assert_eq!(merged(&read), merged(&expected));
        // Names resolve to what was interned.
        for stream in read.values() {
            for e in &stream.system {
                let name = file.string(e.name).expect("name is in the table");
                prop_assert!(NAMES.contains(&name));
            }
            for e in &stream.device {
                prop_assert!(file.descriptor(e.descriptor).is_some());
            }
        }
    }
}

#[test]
fn large_streams_span_many_chunks_and_read_back_identical() {
    let mut ops = Vec::new();
    let mut t = 1_000_000_000u64;
    for k in 0..300_000u64 {
        t += 700 + k % 13;
        ops.push(Op::Device {
            core: (k % 2) as u32,
            descriptor: (true, (k % 5) as u32, 1),
            fields: [k, t, t + 650, 0],
            exec: Some(k / 100),
        });
        if k % 1000 == 0 {
            ops.push(Op::System {
                core: Some((k % 2) as u32),
                name: 0,
                phase: 0,
                device_clock: false,
                fields: [k, t, k, 7, k + 1, 4],
                args: vec![(0, 1, 3)],
            });
        }
    }
    let (bytes, expected) = write(&ops);
    let file = NtffFile::from_bytes(bytes).expect("opens");
    assert!(file.chunks().len() >= 4, "{} chunks", file.chunks().len());
    assert!(file.chunks().iter().all(|c| (c.system_events + c.device_events) as usize <= ntff::MAX_CHUNK_EVENTS));
    assert_eq!(merged(&read_all(&file)), merged(&expected));
    // The index seeks by core and by host time.
    let core1: Vec<_> = file.select(Some(&[1]), None).collect();
    assert!(!core1.is_empty() && core1.iter().all(|c| c.core == Some(1)));
    let early = file.select(None, Some(0..1_000_000_100)).count();
    assert!(early < file.chunks().len());
    let names: Vec<Sym> = read_all(&file).values().flat_map(|s| s.system.iter().map(|e| e.name)).collect();
    assert!(names.iter().all(|&n| file.string(n) == Some("nrt_execute")));
}

#[test]
fn the_traced_processs_communicators_read_back_the_last_recorded_even_from_a_cut_file() {
    let member = |rank: u32, pid: u32| ntff::CommunicatorMember {
        rank,
        pid,
        host: format!("host{rank}"),
        core: Some(rank),
        in_this_process: rank == 1,
    };
    let group = |ranks: u32| ntff::Communicator {
        id: 77,
        name: "world".into(),
        ranks,
        across_processes: true,
        members: (0..ranks).map(|r| member(r, 100 + r)).collect(),
    };
    let metadata = ntff::Metadata { runtime_version: "test".into(), ..ntff::Metadata::default() };
    let mut w = ntff::Writer::new(Vec::new(), &metadata).expect("header");
    w.communicators(&[group(2)]).expect("first");
    w.communicators(&[group(4)]).expect("replaced");
    let bytes = w.finish().expect("finish").0;
    let file = NtffFile::from_bytes(bytes.clone()).expect("opens");
    assert_eq!(file.communicators(), [group(4)]);
    assert!(file.recovery().describe().is_empty());
    // Without its index (a capture killed before the end), found by the scan.
    let cut = NtffFile::from_bytes(bytes[..bytes.len() - 40].to_vec()).expect("opens");
    assert_eq!(cut.communicators(), [group(4)]);
    // A file of no communicators has none.
    let plain = ntff::Writer::new(Vec::new(), &metadata).expect("header").finish().expect("finish").0;
    assert!(NtffFile::from_bytes(plain).expect("opens").communicators().is_empty());
}
