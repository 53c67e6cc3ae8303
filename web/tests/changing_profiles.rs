//! A profile re-captured or cut while the dashboard serves it: a Perfetto download in
//! progress completes from the version it started on when the profile is replaced as
//! the writers replace it (renamed into place), ends early when the file is cut in place
//! under it, and in neither case takes the dashboard down (a mapped file that shrinks
//! raised SIGBUS in the whole process).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use neuron_dashboard::{Dashboard, Options};
use ntff::{Descriptor, DeviceEvent, Metadata, SyncPoint, Writer};

/// Writes a profile of `events` device events on two cores to `path` the way captures
/// do (aside, then renamed into place); `pid` tells versions apart.
fn write_profile(path: &Path, events: u64, pid: u32) {
    let metadata = Metadata { runtime_version: "test".into(), pid, ..Metadata::default() };
    let mut w = Writer::create(path, &metadata).expect("create");
    for core in 0..2 {
        w.sync_point(core, SyncPoint { host_ns: 1_000_000, device_ns: 1_000_000 }).expect("sync");
    }
    let descriptors: Vec<_> = (0..4)
        .map(|k| {
            let d = Descriptor::Instruction {
                model_id: 1,
                engine: w.intern(["PE", "ACT", "DVE", "POOL"][k]),
                opcode: w.intern("MatMult"),
                hlo: w.intern(&format!("dot.{k}")),
                step: k as u32,
                flops: 1 << 20,
                bytes_read: 4096,
                bytes_written: 4096,
            };
            w.descriptor(&d)
        })
        .collect();
    for k in 0..events {
        let start_ns = 1_000_000 + k * 1_000;
        let event = DeviceEvent {
            core: (k % 2) as u32,
            id: k,
            exec_id: Some(1 + k / 1_000),
            start_ns,
            end_ns: start_ns + 800,
            descriptor: descriptors[(k % 4) as usize],
        };
        w.device(&event).expect("write");
    }
    let (file, _) = w.finish().expect("finish");
    file.place().expect("placed");
}

/// A dashboard on a directory holding one profile, `profiles/p.ntff`, of `events`
/// events: the directory (removed when dropped), the profile's path, the dashboard.
fn serving(events: u64) -> (tempfile::TempDir, std::path::PathBuf, Dashboard) {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("profiles")).expect("mkdir");
    let path = dir.path().join("profiles/p.ntff");
    write_profile(&path, events, 1);
    let mut options = Options::new(SocketAddr::from(([127, 0, 0, 1], 0))).expect("options");
    options.datastore_dir = dir.path().join("datastores");
    options.profiles = Some(dir.path().join("profiles"));
    (dir, path, Dashboard::start(options).expect("starts"))
}

/// Starts a Perfetto download of `name` and reads its head and the first bytes of its
/// body; the rest waits in the returned reader.
fn start_download(addr: SocketAddr, name: &str) -> BufReader<TcpStream> {
    let mut stream = TcpStream::connect(addr).expect("connects");
    stream.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
    let request = format!("GET /api/profiles/{name}/perfetto HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).expect("sends");
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).expect("status line");
    assert!(line.contains(" 200 "), "{line}");
    loop {
        line.clear();
        reader.read_line(&mut line).expect("header");
        if line.trim_end().is_empty() {
            break;
        }
        assert!(!line.to_ascii_lowercase().starts_with("content-length"), "streamed: {line}");
    }
    reader
}

/// The rest of a chunked body: its bytes, and whether it ended with the last chunk (a
/// complete download) rather than a cut connection.
fn finish_download(mut reader: BufReader<TcpStream>) -> (Vec<u8>, bool) {
    let mut body = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return (body, false);
        }
        let Ok(size) = usize::from_str_radix(line.trim_end(), 16) else { return (body, false) };
        if size == 0 {
            return (body, true);
        }
        let mut chunk = vec![0u8; size + 2];
        if reader.read_exact(&mut chunk).is_err() {
            return (body, false);
        }
        body.extend_from_slice(&chunk[..size]);
    }
}

fn get_status(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("connects");
    stream.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    write!(stream, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").expect("sends");
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    let status = response.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, response)
}

/// Events enough that the export outruns what the server buffers before the client
/// reads on (8 chunks of 1 MB and the sockets' buffers).
const EVENTS: u64 = 1_500_000;

#[test]
fn a_download_during_a_recapture_completes_from_the_version_it_started_on() {
    let (_dir, path, dashboard) = serving(EVENTS);
    let addr = dashboard.addr();
    let (whole, complete) = finish_download(start_download(addr, "p.ntff"));
    assert!(complete && whole.len() > 32 << 20, "{} bytes", whole.len());

    let paused = start_download(addr, "p.ntff");
    std::thread::sleep(Duration::from_millis(500));
    write_profile(&path, EVENTS / 2, 2);
    let (body, complete) = finish_download(paused);
    assert!(complete, "cut after {} of {} bytes", body.len(), whole.len());
    assert!(body == whole, "the version it started on: {} bytes, not {}", body.len(), whole.len());

    // The new version is what is listed and served now.
    let (status, list) = get_status(addr, "/api/profiles");
    assert_eq!(status, 200, "{list}");
    let (newer, complete) = finish_download(start_download(addr, "p.ntff"));
    assert!(complete && newer.len() < whole.len(), "{} bytes", newer.len());
}

#[test]
fn a_download_of_a_profile_cut_in_place_ends_and_the_dashboard_stays_up() {
    let (_dir, path, dashboard) = serving(EVENTS);
    let addr = dashboard.addr();
    let paused = start_download(addr, "p.ntff");
    std::thread::sleep(Duration::from_millis(500));
    // As a program that rewrites the file in place would: cut to its header.
    std::fs::OpenOptions::new().write(true).open(&path).expect("open").set_len(64).expect("truncate");
    let (body, complete) = finish_download(paused);
    assert!(
        !complete,
        "a download that lost what was cut ends with an error, not a short trace ({} bytes)",
        body.len()
    );
    let (status, body) = get_status(addr, "/api/profiles");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("p.ntff"), "{body}");
}

#[test]
fn the_profile_page_reports_a_damaged_chunk() {
    let (_dir, path, dashboard) = serving(200_000);
    let file = ntff::NtffFile::open(&path).expect("opens");
    let chunk = file.chunks()[1];
    let lost = u64::from(chunk.system_events) + u64::from(chunk.device_events);
    drop(file);
    let mut bytes = std::fs::read(&path).expect("read");
    bytes[chunk.offset as usize + 100] ^= 0x10;
    std::fs::write(&path, bytes).expect("write");
    let (status, response) = get_status(dashboard.addr(), "/api/profiles/p.ntff");
    assert_eq!(status, 200, "{response}");
    let body = &response[response.find("\r\n\r\n").expect("a body") + 4..];
    let json: serde_json::Value = serde_json::from_str(body).expect("JSON");
    assert_eq!(json["events_lost_in_file"], lost, "{json}");
    let problems = json["problems"].as_array().expect("problems");
    assert!(problems.iter().any(|p| p.as_str().is_some_and(|p| p.contains("could not be read"))), "{json}");
}
