//! The live timeline's feed against a real workload: `neuron-bench demo` keeping two
//! NeuronCores busy. Every core, and every engine and DMA queue the models use, gets
//! spans, and a page that opens late gets no more in its first second than the feed's
//! budget, with its rows filled within two seconds.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use neuron_dashboard::{Dashboard, Options};
use neuron_test_support::process::{Sandbox, demo};
use serde_json::Value;

/// The feed's documented budget: a batch of at most 64 KB, ten a second.
const BATCH_BYTES: usize = 64 * 1024;

/// One page's view of the feed: each batch with when it arrived and its size in bytes.
struct Page {
    reader: BufReader<TcpStream>,
    opened: Instant,
}

impl Page {
    fn open(addr: std::net::SocketAddr) -> Page {
        let mut stream = TcpStream::connect(addr).expect("connects");
        stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        stream.write_all(b"GET /api/events HTTP/1.1\r\nHost: localhost\r\n\r\n").expect("sends");
        let opened = Instant::now();
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        // The response head.
        while line != "\r\n" {
            line.clear();
            reader.read_line(&mut line).expect("head");
        }
        Page { reader, opened }
    }

    /// The batches that arrive until `until` after the page opened.
    fn read_until(&mut self, until: Duration) -> Vec<(Duration, usize, Value)> {
        let mut batches = Vec::new();
        let mut line = String::new();
        while self.opened.elapsed() < until {
            line.clear();
            self.reader.read_line(&mut line).expect("a line");
            if let Some(data) = line.strip_prefix("data:") {
                let batch: Value = serde_json::from_str(data.trim()).expect("json");
                batches.push((self.opened.elapsed(), data.trim().len(), batch));
            }
        }
        batches
    }
}

/// Spans per (core, lane) in `batches`; device lanes are engines and DMA queues.
fn rows(batches: &[(Duration, usize, Value)]) -> BTreeMap<(u64, String), usize> {
    let mut rows = BTreeMap::new();
    for (_, _, batch) in batches {
        for span in batch["spans"].as_array().expect("spans") {
            let (Some(core), Some(lane)) = (span["core"].as_u64(), span["lane"].as_str()) else { continue };
            *rows.entry((core, lane.to_owned())).or_default() += 1;
        }
    }
    rows
}

#[test]
fn every_busy_core_and_engine_gets_spans_and_a_late_page_gets_no_more_than_the_budget() {
    let sandbox = Sandbox::new();
    let _workload = demo(&sandbox, &["--duration", "120s"], &[]);
    let mut options = Options::new(([127, 0, 0, 1], 0).into()).expect("options");
    options.datastore_dir = sandbox.path().join("datastores");
    let dashboard = Dashboard::start(options).expect("starts");

    // A first page watches until both cores run (the demo compiles its models first),
    // then three seconds more.
    let mut first = Page::open(dashboard.addr());
    let mut seen = Vec::new();
    while rows(&seen).keys().map(|(core, _)| *core).collect::<BTreeSet<u64>>().len() < 2 {
        assert!(first.opened.elapsed() < Duration::from_secs(60), "two busy cores: {:?}", rows(&seen));
        seen = first.read_until(first.opened.elapsed() + Duration::from_millis(500));
    }
    let running = first.opened.elapsed();
    let seen = first.read_until(running + Duration::from_secs(3));
    let cores: BTreeSet<u64> = rows(&seen).keys().map(|(core, _)| *core).collect();
    assert_eq!(cores, BTreeSet::from([0, 1]), "the demo runs on two cores: {:?}", rows(&seen));
    for (_, bytes, _) in &seen {
        assert!(*bytes <= BATCH_BYTES, "a batch of {bytes} bytes");
    }
    // Every core has spans on its runtime row and on every engine and DMA queue row
    // that any core has: thinning keeps whole executions, spread over the cores.
    let live = rows(&seen[seen.len() / 2..]);
    let lanes: BTreeSet<&String> = live.keys().map(|(_, lane)| lane).collect();
    assert!(lanes.iter().any(|l| l.as_str() == "PE") && lanes.iter().any(|l| l.starts_with("DMA")), "{live:?}");
    for core in &cores {
        for lane in &lanes {
            assert!(live.get(&(*core, (*lane).clone())).is_some_and(|&n| n > 0), "nc{core} {lane} is empty: {live:?}");
        }
    }

    // A page that opens now: its first second holds at most ten batches' worth (plus
    // the one a poll boundary may add), and its rows are full within two seconds.
    let mut late = Page::open(dashboard.addr());
    let batches = late.read_until(Duration::from_secs(2));
    let first_second: usize = batches.iter().filter(|(at, ..)| *at <= Duration::from_secs(1)).map(|(_, b, _)| b).sum();
    assert!(first_second <= 11 * BATCH_BYTES, "{first_second} bytes in the first second");
    assert!(batches.iter().all(|(_, bytes, _)| *bytes <= BATCH_BYTES));
    assert!(
        batches[0].2["catch_up"]["batches"].as_u64().is_some_and(|n| n >= 30),
        "the kept batches come first: {}",
        batches[0].2["catch_up"]
    );
    let filled = rows(&batches);
    for core in &cores {
        for lane in &lanes {
            assert!(
                filled.get(&(*core, (*lane).clone())).is_some_and(|&n| n > 0),
                "nc{core} {lane} is empty after 2 s: {filled:?}"
            );
        }
    }
    // The page's first batch reaches back over what the first page saw (three seconds
    // or more), not only the latest poll.
    let oldest = batches[0].2["spans"].as_array().expect("spans").iter().filter_map(|s| s["start_ns"].as_u64()).min();
    let newest = batches[0].2["spans"].as_array().expect("spans").iter().filter_map(|s| s["end_ns"].as_u64()).max();
    assert!(
        oldest.zip(newest).is_some_and(|(a, b)| b - a >= 1_000_000_000),
        "spans over the last seconds: {oldest:?} to {newest:?}"
    );
    drop(first);
}
