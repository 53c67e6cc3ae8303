//! The dashboard's security rules over real HTTP: loopback unless a token is set, the
//! token on every request, profile names only inside the profiles directory, a bounded
//! number of event streams, bounded requests.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use neuron_dashboard::{Dashboard, Options};

const TOKEN: &str = "s3cret-token-42";

fn options(dir: &std::path::Path) -> Options {
    let mut options = Options::new(SocketAddr::from(([127, 0, 0, 1], 0))).expect("options");
    options.datastore_dir = dir.join("datastores");
    options
}

/// A response: status, headers (lower-case names), and the body read so far.
#[derive(Debug)]
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// Sends `request` (a whole HTTP/1.1 request) and reads the response head, and the body
/// when it has a length.
fn send(addr: SocketAddr, request: &str) -> (Response, BufReader<TcpStream>) {
    let mut stream = TcpStream::connect(addr).expect("connects");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    stream.write_all(request.as_bytes()).expect("sends");
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).expect("status line");
    let status = line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{line:?}"));
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader.read_line(&mut line).expect("header");
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':').expect("a header");
        headers.push((name.to_ascii_lowercase(), value.trim().to_string()));
    }
    let mut response = Response { status, headers, body: String::new() };
    if let Some(length) = response.header("content-length").and_then(|l| l.parse::<usize>().ok()) {
        let mut body = vec![0; length];
        reader.read_exact(&mut body).expect("body");
        response.body = String::from_utf8_lossy(&body).into_owned();
    }
    (response, reader)
}

fn get(addr: SocketAddr, path: &str, extra: &str) -> Response {
    send(addr, &format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{extra}Connection: close\r\n\r\n")).0
}

#[test]
fn listening_beyond_loopback_needs_a_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut open = options(dir.path());
    open.listen = SocketAddr::from(([0, 0, 0, 0], 0));
    let refused = Dashboard::start(open.clone()).expect_err("refused without a token");
    assert!(format!("{refused:#}").contains("without --token"), "{refused:#}");
    open.token = Some("short".into());
    assert!(Dashboard::start(open.clone()).is_err(), "a token too short to be a secret");
    open.token = Some(TOKEN.into());
    let dashboard = Dashboard::start(open).expect("starts with a token");
    let addr = SocketAddr::from(([127, 0, 0, 1], dashboard.addr().port()));
    assert_eq!(get(addr, "/api/info", "").status, 401);
}

#[test]
fn every_request_needs_the_token_when_one_is_set() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut open = options(dir.path());
    open.token = Some(TOKEN.into());
    let dashboard = Dashboard::start(open).expect("starts");
    let addr = dashboard.addr();
    for path in ["/", "/assets/app.js", "/api/info", "/api/profiles", "/api/live", "/api/events", "/nothing"] {
        let response = get(addr, path, "");
        assert_eq!(response.status, 401, "{path} without the token");
        assert!(response.body.contains("token"), "{path}: {}", response.body);
        assert_eq!(get(addr, path, "Authorization: Bearer wrong-token-42\r\n").status, 401, "{path}");
    }
    assert_eq!(get(addr, "/api/info", &format!("Authorization: Bearer {TOKEN}\r\n")).status, 200);
    // The scheme's case does not matter.
    assert_eq!(get(addr, "/api/info", &format!("Authorization: bearer {TOKEN}\r\n")).status, 200);
    assert_eq!(get(addr, "/api/info", &format!("Authorization: BEARER {TOKEN}\r\n")).status, 200);
    assert_eq!(get(addr, &format!("/api/info?token={TOKEN}x"), "").status, 401);
    // The token in the address sets a cookie the page's later requests carry.
    let first = get(addr, &format!("/?token={TOKEN}"), "");
    assert_eq!(first.status, 200);
    let cookie = first.header("set-cookie").expect("a cookie").to_string();
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"), "{cookie}");
    let pair = cookie.split(';').next().expect("name=value");
    assert_eq!(get(addr, "/api/profiles", &format!("Cookie: theme=dark; {pair}\r\n")).status, 200);
    // A cookie left by an earlier token does not stand in the way of the right one.
    let (name, _) = pair.split_once('=').expect("name=value");
    let stale = format!("Cookie: {name}=an-old-token-123\r\n");
    assert_eq!(get(addr, "/api/profiles", &stale).status, 401);
    assert_eq!(get(addr, &format!("/api/profiles?token={TOKEN}"), &stale).status, 200);
}

#[test]
fn without_a_token_only_loopback_names_may_ask() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dashboard = Dashboard::start(options(dir.path())).expect("starts");
    let addr = dashboard.addr();
    let port = addr.port();
    for host in
        ["localhost".to_string(), format!("127.0.0.1:{port}"), format!("[::1]:{port}"), format!("LocalHost:{port}")]
    {
        let response = send(addr, &format!("GET /api/info HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")).0;
        assert_eq!(response.status, 200, "{host}");
    }
    // A name rebound to 127.0.0.1 by a page elsewhere, or a loopback name with more
    // around it.
    for host in [
        format!("evil.example:{port}"),
        "127.0.0.1.evil.example".to_string(),
        "localhost.example".to_string(),
        format!("127.0.0.1:{port}, evil.example"),
        format!("127.0.0.1:{port} evil.example"),
        "localhost:".to_string(),
        "[::1".to_string(),
    ] {
        let response = send(addr, &format!("GET /api/live HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")).0;
        assert_eq!(response.status, 403, "{host}");
    }
    // Two Host headers, or a request target that names another host.
    let two =
        format!("GET /api/info HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nHost: evil.example\r\nConnection: close\r\n\r\n");
    assert_ne!(send(addr, &two).0.status, 200, "two Host headers");
    let absolute = "GET http://evil.example/api/info HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    assert_eq!(send(addr, absolute).0.status, 403, "absolute-form target");
    let own =
        format!("GET http://127.0.0.1:{port}/api/info HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    assert_eq!(send(addr, &own).0.status, 200, "absolute-form target naming loopback");
}

#[test]
fn profile_names_resolve_only_inside_the_profiles_directory() {
    let root = tempfile::tempdir().expect("tempdir");
    let profiles = root.path().join("profiles");
    std::fs::create_dir(&profiles).expect("mkdir");
    std::fs::write(profiles.join("broken.ntff"), b"not a trace").expect("write");
    std::fs::write(root.path().join("secret.ntff"), b"outside").expect("write");
    std::os::unix::fs::symlink(root.path().join("secret.ntff"), profiles.join("link.ntff")).expect("symlink");
    let mut open = options(root.path());
    open.profiles = Some(profiles);
    let dashboard = Dashboard::start(open).expect("starts");
    let addr = dashboard.addr();
    // Inside: found, and refused for what it holds.
    let broken = get(addr, "/api/profiles/broken.ntff", "");
    assert_eq!(broken.status, 422, "{}", broken.body);
    assert!(broken.body.contains("not an NTFF file"), "{}", broken.body);
    let list = get(addr, "/api/profiles", "");
    assert!(list.body.contains("broken.ntff") && !list.body.contains("link.ntff"), "{}", list.body);
    for path in [
        "/api/profiles/..%2Fsecret.ntff",
        "/api/profiles/%2e%2e%2fsecret.ntff",
        "/api/profiles/..%2F..%2F..%2Fetc%2Fpasswd",
        "/api/profiles/link.ntff",
        "/api/profiles/link.ntff/summary",
        "/api/profiles/..%5Csecret.ntff/perfetto",
        "/api/profiles/.%2Fbroken.ntff",
        "/api/profiles/broken.ntff%00.ntff",
        "/api/profiles/../secret.ntff",
        "/api/profiles/../../etc/passwd",
        "/assets/..%2F..%2FCargo.toml",
        "/assets/../../Cargo.toml",
        "/api/compare?a=broken.ntff&b=..%2Fsecret.ntff",
    ] {
        let response = get(addr, path, "");
        assert_eq!(response.status, 404, "{path}: {}", response.body);
        assert!(!response.body.contains("outside"), "{path}");
    }
}

#[test]
fn event_streams_are_bounded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut open = options(dir.path());
    open.max_streams = 3;
    let dashboard = Dashboard::start(open).expect("starts");
    let addr = dashboard.addr();
    let request = "GET /api/live HTTP/1.1\r\nHost: localhost\r\n\r\n";
    let mut streams: Vec<_> = (0..3)
        .map(|k| {
            let path = if k == 0 { "/api/events" } else { "/api/live" };
            let (response, reader) = send(addr, &request.replace("/api/live", path));
            assert_eq!(response.status, 200);
            assert_eq!(response.header("content-type"), Some("text/event-stream"));
            reader
        })
        .collect();
    // An update arrives on an open stream.
    let mut line = String::new();
    while !line.starts_with("data:") {
        line.clear();
        streams[1].read_line(&mut line).expect("an update");
    }
    let update: serde_json::Value = serde_json::from_str(line.trim_start_matches("data:").trim()).expect("json");
    assert!(update["seq"].as_u64().is_some_and(|s| s >= 1), "{update}");
    let refused = send(addr, request).0;
    assert_eq!(refused.status, 503);
    assert_eq!(refused.header("retry-after"), Some("5"));
    assert_eq!(send(addr, &request.replace("/api/live", "/api/events")).0.status, 503);
    // Pages that go away free their place (noticed at the next update).
    drop(streams.pop());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = send(addr, request).0.status;
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the closed stream's place was not freed ({status})");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn requests_are_bounded_in_size_and_kind() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dashboard = Dashboard::start(options(dir.path())).expect("starts");
    let addr = dashboard.addr();
    let long = format!("/api/profiles?{}", "x".repeat(4096));
    assert_eq!(get(addr, &long, "").status, 414);
    let post = "POST /api/info HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100000\r\nConnection: close\r\n\r\n";
    assert_eq!(send(addr, post).0.status, 413);
    let small_post = "POST /api/info HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}";
    assert_eq!(send(addr, small_post).0.status, 405);
    let page = get(addr, "/", "");
    assert_eq!(page.status, 200);
    assert_eq!(page.header("x-content-type-options"), Some("nosniff"));
    assert!(page.header("content-security-policy").is_some_and(|c| c.contains("default-src 'self'")));
    assert!(page.body.contains("/assets/app.js"));
    assert_eq!(get(addr, "/api/profiles/a.ntff/view?t0=x", "").status, 400, "a malformed query");
    assert_eq!(get(addr, "/api/profiles/a.ntff/view?t0=0&t1=1&columns=9", "").status, 404, "no profiles directory");
}

#[test]
fn a_page_that_connects_gets_the_last_minute_first() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut open = options(dir.path());
    open.interval = Duration::from_millis(100);
    let dashboard = Dashboard::start(open).expect("starts");
    std::thread::sleep(Duration::from_millis(1500));
    let (response, mut reader) = send(dashboard.addr(), "GET /api/live HTTP/1.1\r\nHost: localhost\r\n\r\n");
    assert_eq!(response.status, 200);
    // (event name, seq) in the order they come, until two live updates.
    let mut events: Vec<(String, u64)> = Vec::new();
    let (mut event, mut line) = (String::new(), String::new());
    while events.iter().filter(|(e, _)| e == "update").count() < 2 {
        line.clear();
        reader.read_line(&mut line).expect("a line");
        if let Some(name) = line.strip_prefix("event:") {
            event = name.trim().to_string();
        } else if let Some(data) = line.strip_prefix("data:") {
            let update: serde_json::Value = serde_json::from_str(data.trim()).expect("json");
            events.push((event.clone(), update["seq"].as_u64().expect("seq")));
        }
    }
    let history: Vec<u64> = events.iter().filter(|(e, _)| e == "history").map(|(_, s)| *s).collect();
    assert!(history.len() >= 10, "{events:?}");
    assert_eq!(history[0], 1, "from the first look: {events:?}");
    assert!(history.windows(2).all(|w| w[1] == w[0] + 1), "in order: {events:?}");
    let first_live = events.iter().position(|(e, _)| e == "update").expect("live");
    assert!(events[..first_live].iter().all(|(e, _)| e == "history"), "history first: {events:?}");
    assert!(events[first_live].1 >= *history.last().expect("some"), "{events:?}");
}

/// The live timeline's feed keeps what it sent: a page that opens after another was
/// open gets it first, as one batch that stands for the kept ones, then live batches.
#[test]
fn a_timeline_page_that_opens_later_gets_what_was_kept_as_one_batch_first() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dashboard = Dashboard::start(options(dir.path())).expect("starts");
    let batches = |count: usize| {
        let (response, mut reader) = send(dashboard.addr(), "GET /api/events HTTP/1.1\r\nHost: localhost\r\n\r\n");
        assert_eq!(response.status, 200);
        let (mut batches, mut line) = (Vec::new(), String::new());
        while batches.len() < count {
            line.clear();
            reader.read_line(&mut line).expect("a line");
            if let Some(data) = line.strip_prefix("data:") {
                batches.push(serde_json::from_str::<serde_json::Value>(data.trim()).expect("json"));
            }
        }
        batches
    };
    let seqs =
        |batches: &[serde_json::Value]| batches.iter().map(|b| b["seq"].as_u64().expect("seq")).collect::<Vec<_>>();
    // The first page reads ten batches (a second of polls) and leaves.
    let first = seqs(&batches(10));
    assert!(first.windows(2).all(|w| w[1] == w[0] + 1), "in order: {first:?}");
    std::thread::sleep(Duration::from_millis(500));
    // The next one starts with one batch standing for every kept one, then live ones.
    let later = batches(5);
    let kept = later[0]["catch_up"]["batches"].as_u64().expect("a catch-up batch first");
    assert!(kept >= 10, "it stands for the kept batches: {}", later[0]);
    assert!(later[1..].iter().all(|b| b.get("catch_up").is_none()), "one catch-up batch");
    let later = seqs(&later);
    assert!(later[0] > *first.last().expect("some"), "{later:?} after {first:?}");
    assert!(later.windows(2).all(|w| w[1] == w[0] + 1), "then live ones, in order: {later:?}");
}
