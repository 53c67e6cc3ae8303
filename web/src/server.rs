//! The HTTP server: routes, the security rules, the event streams.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use neuron_datastore::config::ReaderConfig;
use neuron_datastore::topology::Topology;
use rust_embed::RustEmbed;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::broadcast;

use crate::index::RanksIndex;
use crate::profiles::{NOISE_MIN_TRACED, Profile, Profiles, compare, compare_bounds, spread};
use crate::{events, live};

/// The page and its scripts, built into the binary.
#[derive(RustEmbed)]
#[folder = "assets/"]
struct Assets;

/// The longest request line and query accepted.
const MAX_URI_BYTES: usize = 2048;
/// The largest request body accepted (the API takes none).
const MAX_BODY_BYTES: usize = 1024;
/// Perfetto exports running at once, at most (each reads and encodes a whole file).
const MAX_EXPORTS: usize = 2;

/// How the dashboard runs.
#[derive(Debug, Clone)]
pub struct Options {
    pub listen: SocketAddr,
    /// The NTFF files the profile viewer lists.
    pub profiles: Option<PathBuf>,
    /// Required on every request when set; required to listen beyond loopback.
    pub token: Option<String>,
    /// Where the runtimes' datastores are.
    pub datastore_dir: PathBuf,
    /// The instance shown while no runtime says which it runs on.
    pub topology: Topology,
    /// Time between two live updates (at least 100 ms: ten a second at most).
    pub interval: Duration,
    /// Event streams open at once, at most.
    pub max_streams: usize,
    /// A profile of `profiles` to index at once, before a page asks for it.
    pub preload: Option<String>,
}

impl Options {
    /// Defaults for `listen`: the datastores and instance type from the environment as
    /// every tool reads them, no profiles, no token, five updates a second.
    pub fn new(listen: SocketAddr) -> Result<Options> {
        let config = ReaderConfig::from_env()?;
        Ok(Options {
            listen,
            profiles: None,
            token: None,
            datastore_dir: config.datastore_dir,
            topology: config.instance_type.topology(),
            interval: Duration::from_millis(200),
            max_streams: 128,
            preload: None,
        })
    }
}

#[derive(Debug)]
struct AppState {
    token: Option<String>,
    profiles: Profiles,
    live: Arc<live::Live>,
    events: Arc<events::Feed>,
    streams: AtomicUsize,
    max_streams: usize,
    /// The cookie a token given in the address is kept in: one per port, as browsers
    /// share cookies between the ports of a host.
    cookie: String,
    exports: Arc<tokio::sync::Semaphore>,
    /// Where the runtimes' datastores are.
    datastore_dir: PathBuf,
}

type Shared = Arc<AppState>;

/// A running dashboard.
#[derive(Debug)]
pub struct Dashboard {
    addr: SocketAddr,
    thread: std::thread::JoinHandle<()>,
}

impl Dashboard {
    /// Checks the options, binds and starts serving on a thread of its own.
    pub fn start(options: Options) -> Result<Dashboard> {
        if !options.listen.ip().is_loopback() && options.token.is_none() {
            bail!(
                "refusing to listen on {} without --token: anyone who can reach this address could see every \
                 runtime on this host. Set a token (--token or NEURON_DASHBOARD_TOKEN), or listen on 127.0.0.1",
                options.listen
            );
        }
        if options.token.as_deref().is_some_and(|t| t.len() < 8) {
            bail!("--token: use at least 8 characters");
        }
        if let Some(dir) = &options.profiles
            && !dir.is_dir()
        {
            bail!("--profiles {}: not a directory", dir.display());
        }
        let listener = std::net::TcpListener::bind(options.listen)
            .with_context(|| format!("cannot listen on {}", options.listen))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let interval = options.interval.max(Duration::from_millis(100));
        let state = Arc::new(AppState {
            token: options.token.clone(),
            profiles: Profiles::new(options.profiles.clone()),
            live: live::start(options.datastore_dir.clone(), options.topology.clone(), interval)?,
            events: events::start(options.datastore_dir.clone())?,
            streams: AtomicUsize::new(0),
            max_streams: options.max_streams,
            cookie: format!("neuron_dashboard_token_{}", addr.port()),
            exports: Arc::new(tokio::sync::Semaphore::new(MAX_EXPORTS)),
            datastore_dir: options.datastore_dir.clone(),
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("dashboard-http")
            .enable_all()
            .build()?;
        let preload = options.preload.clone();
        let thread = std::thread::Builder::new().name("dashboard".into()).spawn(move || {
            runtime.block_on(async move {
                if let Some(name) = preload {
                    let state = Arc::clone(&state);
                    tokio::spawn(async move { state.profiles.get(&name).await });
                }
                let app = router(state);
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(listener) => {
                        if let Err(e) = axum::serve(listener, app).await {
                            eprintln!("neuron-dashboard: the server stopped: {e}");
                        }
                    }
                    Err(e) => eprintln!("neuron-dashboard: cannot start: {e}"),
                }
            });
        })?;
        Ok(Dashboard { addr, thread })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address to open, with `fragment` (a page of the dashboard) when given.
    pub fn url(&self, fragment: Option<&str>) -> String {
        let host = if self.addr.ip().is_unspecified() {
            "127.0.0.1".to_string()
        } else if self.addr.is_ipv6() {
            format!("[{}]", self.addr.ip())
        } else {
            self.addr.ip().to_string()
        };
        let fragment = fragment.map(|f| format!("#{f}")).unwrap_or_default();
        format!("http://{host}:{}/{fragment}", self.addr.port())
    }

    /// Serves until the process ends.
    pub fn wait(self) {
        let _ = self.thread.join();
    }
}

fn router(state: Shared) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/assets/{file}", get(asset))
        .route("/api/info", get(info))
        .route("/api/live", get(live_stream))
        .route("/api/events", get(event_stream))
        .route("/api/execution/{exec_id}", get(execution))
        .route("/api/profiles", get(list_profiles))
        .route("/api/profiles/{name}", get(profile_meta))
        .route("/api/profiles/{name}/view", get(profile_view))
        .route("/api/profiles/{name}/span", get(profile_span))
        .route("/api/profiles/{name}/hlo", get(profile_hlo))
        .route("/api/profiles/{name}/summary", get(profile_summary))
        .route("/api/profiles/{name}/perfetto", get(profile_perfetto))
        .route("/api/compare", get(compare_profiles))
        .route("/api/job", get(job_meta))
        .route("/api/job/view", get(job_view))
        .route("/api/job/span", get(job_span))
        .route("/api/job/hlo", get(job_hlo))
        .route("/api/job/perfetto", get(job_perfetto))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, axum::Json(json!({ "error": message.into() }))).into_response()
}

async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "not found")
}

/// Every request: size limits, the token, and headers that keep the page to itself.
async fn guard(State(state): State<Shared>, request: Request, next: Next) -> Response {
    let uri_len = request.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if uri_len > MAX_URI_BYTES {
        return error(StatusCode::URI_TOO_LONG, format!("request line over {MAX_URI_BYTES} bytes"));
    }
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES) {
        return error(StatusCode::PAYLOAD_TOO_LARGE, format!("request body over {MAX_BODY_BYTES} bytes"));
    }
    let mut set_cookie = None;
    match &state.token {
        Some(token) => {
            let from_query = query_token(request.uri().query());
            let mut presented = [bearer(request.headers()), from_query.clone()]
                .into_iter()
                .flatten()
                .chain(cookies(request.headers(), &state.cookie));
            if !presented.any(|p| same(p.as_bytes(), token.as_bytes())) {
                return error(
                    StatusCode::UNAUTHORIZED,
                    "this dashboard needs its token: open it with ?token=TOKEN, or send Authorization: Bearer TOKEN",
                );
            }
            if from_query.is_some_and(|q| same(q.as_bytes(), token.as_bytes())) {
                set_cookie = Some(format!("{}={token}; Path=/; HttpOnly; SameSite=Strict", state.cookie));
            }
        }
        // Without a token the dashboard is on loopback; a page elsewhere that points a
        // name of its own at 127.0.0.1 (DNS rebinding) is refused by its Host.
        None if !loopback_host(request.headers())
            || !request.uri().authority().is_none_or(|a| loopback_name(a.as_str())) =>
        {
            return error(
                StatusCode::FORBIDDEN,
                "only http://127.0.0.1, http://localhost or http://[::1] may ask this dashboard",
            );
        }
        None => {}
    }
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'self'; img-src 'self' data:; frame-ancestors 'none'"),
    );
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    if let Some(value) = set_cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
        headers.insert(header::SET_COOKIE, value);
    }
    response
}

/// The token of an `Authorization: Bearer TOKEN` header (the scheme's case does not
/// matter, as HTTP has it).
fn bearer(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim().to_string())
}

/// The values of cookie `name`.
fn cookies<'a>(headers: &'a HeaderMap, name: &'a str) -> impl Iterator<Item = String> + 'a {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(move |pair| pair.trim().strip_prefix(name)?.strip_prefix('=').map(str::to_string))
}

/// Whether the request has exactly one `Host` header, and it names a loopback host.
fn loopback_host(headers: &HeaderMap) -> bool {
    let mut hosts = headers.get_all(header::HOST).iter();
    match (hosts.next().and_then(|h| h.to_str().ok()), hosts.next()) {
        (Some(host), None) => loopback_name(host),
        _ => false,
    }
}

/// Whether `authority` is exactly a loopback name with an optional numeric port:
/// `localhost`, `127.0.0.1:3001`, `[::1]:3001` (not a list, nor anything around it).
fn loopback_name(authority: &str) -> bool {
    let (name, port) = match authority.strip_prefix('[') {
        Some(v6) => {
            let Some((address, rest)) = v6.split_once(']') else { return false };
            let port = match rest {
                "" => None,
                _ => match rest.strip_prefix(':') {
                    Some(port) => Some(port),
                    None => return false,
                },
            };
            (format!("[{address}]"), port)
        }
        None => match authority.split_once(':') {
            Some((name, port)) => (name.to_string(), Some(port)),
            None => (authority.to_string(), None),
        },
    };
    let port_ok = port.is_none_or(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    port_ok && matches!(name.to_ascii_lowercase().as_str(), "localhost" | "127.0.0.1" | "[::1]")
}

/// The `token` parameter of a query string, decoded.
fn query_token(query: Option<&str>) -> Option<String> {
    form_urlencoded::parse(query?.as_bytes()).find(|(key, _)| key == "token").map(|(_, value)| value.into_owned())
}

/// Compares in time independent of where the first difference is.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn page() -> Response {
    asset(Path("index.html".to_string())).await
}

async fn asset(Path(file): Path<String>) -> Response {
    // Plain names of the page's own files only.
    let plain = !file.starts_with('.') && file.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    let Some(content) = Assets::get(&file).filter(|_| plain) else { return not_found().await };
    let kind = match file.rsplit('.').next() {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        _ => "application/octet-stream",
    };
    ([(header::CONTENT_TYPE, kind), (header::CACHE_CONTROL, "no-cache")], Body::from(content.data.into_owned()))
        .into_response()
}

async fn info(State(state): State<Shared>) -> Response {
    axum::Json(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "profiles_dir": state.profiles.dir().map(|d| d.display().to_string()),
        "max_streams": state.max_streams,
    }))
    .into_response()
}

/// Counts an open event stream; the count goes down when the stream is dropped.
#[derive(Debug)]
struct StreamSlot(Shared);

impl StreamSlot {
    fn take(state: &Shared) -> Option<StreamSlot> {
        let taken = state
            .streams
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < state.max_streams).then_some(n + 1));
        taken.is_ok().then(|| StreamSlot(Arc::clone(state)))
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.streams.fetch_sub(1, Ordering::AcqRel);
    }
}

fn too_many(state: &Shared) -> Response {
    let mut response = error(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("{} event streams are open, the most this dashboard serves (--max-streams)", state.max_streams),
    );
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
    response
}

fn sse(stream: impl Stream<Item = Result<Event, Infallible>> + Send + 'static) -> Response {
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(10))).into_response()
}

async fn live_stream(State(state): State<Shared>) -> Response {
    let Some(slot) = StreamSlot::take(&state) else { return too_many(&state) };
    let mut rx = state.live.subscribe();
    rx.mark_unchanged();
    // The last minute first, marked as such, then each update as it comes.
    let history =
        state.live.history().into_iter().map(|update| {
            Ok::<_, Infallible>(Event::default().event("history").data(String::from_utf8_lossy(&update)))
        });
    let updates = futures_util::stream::unfold((rx, slot), |(mut rx, slot)| async move {
        rx.changed().await.ok()?;
        let update = rx.borrow_and_update().clone()?;
        let data = String::from_utf8_lossy(&update).into_owned();
        Some((Ok(Event::default().event("update").data(data)), (rx, slot)))
    });
    sse(futures_util::stream::iter(history).chain(updates))
}

async fn event_stream(State(state): State<Shared>) -> Response {
    let Some(slot) = StreamSlot::take(&state) else { return too_many(&state) };
    let rx = state.events.subscribe();
    // The first batch stands for what the feed kept up to the first live one, thinned
    // to one batch; live batches follow.
    let feed = Arc::clone(&state.events);
    let stream = futures_util::stream::unfold((rx, slot, Some(feed)), |(mut rx, slot, catching_up)| async move {
        loop {
            let event = match rx.recv().await {
                Ok((seq, batch)) => match &catching_up {
                    Some(feed) => {
                        let feed = Arc::clone(feed);
                        let first = tokio::task::spawn_blocking(move || feed.catch_up(seq))
                            .await
                            .ok()
                            .flatten()
                            .unwrap_or(batch);
                        Event::default().event("batch").data(String::from_utf8_lossy(&first))
                    }
                    None => Event::default().event("batch").data(String::from_utf8_lossy(&batch)),
                },
                // A page that reads too slowly misses batches, and is told how many.
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    if catching_up.is_some() {
                        continue;
                    }
                    Event::default().event("lagged").data(json!({ "missed_batches": n }).to_string())
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            };
            return Some((Ok(event), (rx, slot, None)));
        }
    });
    sse(stream)
}

async fn list_profiles(State(state): State<Shared>) -> Response {
    match tokio::task::spawn_blocking(move || state.profiles.list()).await {
        Ok(Ok(entries)) => axum::Json(entries).into_response(),
        Ok(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, format!("cannot list the profiles: {e}")),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn profile(state: &Shared, name: &str) -> Result<Arc<Profile>, Response> {
    match state.profiles.get(name).await {
        None => Err(not_found().await),
        Some(Ok(profile)) => Ok(profile),
        Some(Err(e)) => Err(error(StatusCode::UNPROCESSABLE_ENTITY, e)),
    }
}

async fn profile_meta(State(state): State<Shared>, Path(name): Path<String>) -> Result<Response, Response> {
    let p = profile(&state, &name).await?;
    let index = &p.index;
    let meta = index.file().metadata();
    let tracks: Vec<_> = index
        .tracks
        .iter()
        .map(|t| json!({ "name": t.name, "core": t.core, "kind": t.kind, "spans": t.len(), "depth": t.depth() }))
        .collect();
    Ok(axum::Json(json!({
        "name": p.name,
        "duration_ns": index.end - index.origin,
        "events": index.events,
        "unplaced": index.unplaced,
        "tracks": tracks,
        "pid": meta.pid,
        "tag": meta.process_tag,
        "program": meta.program,
        "instance_type": meta.instance_type,
        "capture_kind": meta.capture_kind,
        "problems": index.problems,
        "events_lost_in_file": index.events_lost_in_file,
    }))
    .into_response())
}

#[derive(Debug, Deserialize)]
struct ViewQuery {
    t0: u64,
    t1: u64,
    columns: u32,
}

async fn profile_view(
    State(state): State<Shared>,
    Path(name): Path<String>,
    Query(q): Query<ViewQuery>,
) -> Result<Response, Response> {
    let p = profile(&state, &name).await?;
    let view = blocking(move || serde_json::to_vec(&p.index.view(q.t0, q.t1, q.columns))).await?;
    let json = view.map_err(|e| error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok(([(header::CONTENT_TYPE, "application/json")], json).into_response())
}

/// Runs `work` off the async threads; a panic in it is a 500.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Result<T, Response> {
    tokio::task::spawn_blocking(work).await.map_err(|e| error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}

#[derive(Debug, Deserialize)]
struct ExecutionQuery {
    pid: Option<u32>,
}

/// Where an execution is in the rings of this host's runtimes now (of process `pid`
/// only, with `?pid=`): what a metric's exemplar (`exec_id`) leads to.
async fn execution(
    State(state): State<Shared>,
    Path(exec_id): Path<u64>,
    Query(q): Query<ExecutionQuery>,
) -> Result<Response, Response> {
    // Reading every ring is heavy: as many at once as exports.
    let _turn = state
        .exports
        .clone()
        .acquire_owned()
        .await
        .map_err(|e| error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
    let dir = state.datastore_dir.clone();
    let found = blocking(move || events::find_execution(dir, exec_id, q.pid)).await?;
    Ok(axum::Json(found).into_response())
}

#[derive(Debug, Deserialize)]
struct SpanQuery {
    track: usize,
    index: usize,
}

async fn profile_span(
    State(state): State<Shared>,
    Path(name): Path<String>,
    Query(q): Query<SpanQuery>,
) -> Result<Response, Response> {
    let p = profile(&state, &name).await?;
    let details = p.index.details(q.track, q.index).ok_or_else(|| error(StatusCode::NOT_FOUND, "no such span"))?;
    Ok(axum::Json(details).into_response())
}

#[derive(Debug, Deserialize)]
struct HloQuery {
    name: String,
}

/// The longest span of an HLO instruction: where the roofline's points lead.
async fn profile_hlo(
    State(state): State<Shared>,
    Path(name): Path<String>,
    Query(q): Query<HloQuery>,
) -> Result<Response, Response> {
    let p = profile(&state, &name).await?;
    let found = blocking(move || {
        let (track, index) = p.index.longest_of_hlo(&q.name)?;
        let (start_ns, end_ns) = p.index.span_time(track, index)?;
        Some(json!({"track": track, "index": index, "start_ns": start_ns, "end_ns": end_ns}))
    })
    .await?;
    match found {
        Some(body) => Ok(axum::Json(body).into_response()),
        None => Err(error(StatusCode::NOT_FOUND, "no instruction of that HLO instruction in this profile")),
    }
}

async fn profile_summary(State(state): State<Shared>, Path(name): Path<String>) -> Result<Response, Response> {
    let p = profile(&state, &name).await?;
    let body = blocking(move || {
        let s = p.summary();
        json!({
            "summary": s,
            "text": ntff::summary::to_text(s, &p.name),
            "hlo_instructions": s.hlo_instructions,
        })
    })
    .await?;
    Ok(axum::Json(body).into_response())
}

async fn profile_perfetto(State(state): State<Shared>, Path(name): Path<String>) -> Response {
    let Some(path) = state.profiles.resolve(&name) else { return not_found().await };
    let file_name = format!("{}.perfetto-trace", name.trim_end_matches(".ntff"));
    perfetto_download(&state, vec![path], false, &file_name)
}

/// `paths` exported as one Perfetto trace, streamed as a download named `file_name`;
/// each file on its job's root clock with `root_clock`.
fn perfetto_download(state: &Shared, paths: Vec<PathBuf>, root_clock: bool, file_name: &str) -> Response {
    let Ok(permit) = Arc::clone(&state.exports).try_acquire_owned() else {
        let mut response =
            error(StatusCode::SERVICE_UNAVAILABLE, format!("{MAX_EXPORTS} exports are running; try again"));
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("10"));
        return response;
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(8);
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let writer = ChannelWriter { tx: tx.clone(), buffer: Vec::with_capacity(1 << 20) };
        let result = paths.iter().map(|p| ntff::NtffFile::open(p)).collect::<Result<Vec<_>, _>>().and_then(|files| {
            let opened: Vec<u64> = files.iter().map(|f| f.len()).collect();
            let options = ntff::export::ExportOptions { root_clock, ..Default::default() };
            let (writer, summary) =
                ntff::export::export(&files, &options, ntff::export::Format::Perfetto, writer, &mut |_| {})?;
            // Cut or rewritten in place while exported (a profile replaced by renaming
            // reads whole): end the download with an error rather than a trace that
            // silently lacks what could not be read.
            let now: Vec<u64> = paths.iter().map(|p| std::fs::metadata(p).map_or(0, |m| m.len())).collect();
            if summary.damaged_chunks > 0 && now != opened {
                let reason = format!(
                    "the profile changed while it was exported ({} bytes, now {}): download it again",
                    opened.iter().sum::<u64>(),
                    now.iter().sum::<u64>()
                );
                return Err(ntff::NtffError::Damaged { offset: 0, reason });
            }
            Ok((writer, summary))
        });
        if let Err(e) = result {
            let _ = tx.blocking_send(Err(std::io::Error::other(e.to_string())));
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) });
    let disposition = format!("attachment; filename=\"{}\"", file_name.replace(['"', '\\'], "_"));
    let mut response = Body::from_stream(stream).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    if let Ok(value) = HeaderValue::from_str(&disposition) {
        response.headers_mut().insert(header::CONTENT_DISPOSITION, value);
    }
    response
}

/// The timeline of the profiles directory's rank profiles.
async fn job(state: &Shared) -> Result<Arc<RanksIndex>, Response> {
    match state.profiles.job().await {
        None => Err(error(StatusCode::NOT_FOUND, "no profiles of a job's ranks (profile_rank_<id>.ntff) here")),
        Some(Ok(job)) => Ok(job),
        Some(Err(e)) => Err(error(StatusCode::UNPROCESSABLE_ENTITY, e)),
    }
}

async fn job_meta(State(state): State<Shared>) -> Result<Response, Response> {
    let job = job(&state).await?;
    let tracks: Vec<_> = job
        .track_names()
        .map(|(name, t)| json!({ "name": name, "core": t.core, "kind": t.kind, "spans": t.len(), "depth": t.depth() }))
        .collect();
    let ranks: Vec<_> = job
        .parts
        .iter()
        .map(|p| {
            json!({
                "rank": p.rank, "name": p.name, "host": p.host, "pid": p.pid,
                "offset_ns": p.clock.map(|c| c.0), "uncertainty_ns": p.clock.map(|c| c.1),
                "events": p.index.events, "tracks": p.index.tracks.len(),
            })
        })
        .collect();
    // What failed first: ranks whose recording never finished are not on the timeline.
    let problems: Vec<String> = state
        .profiles
        .unfinished_rank_files()
        .into_iter()
        .map(|name| {
            format!(
                "{name} was never finished: its process died, or its recording was stopped; that rank is not on \
                 this timeline"
            )
        })
        .chain(
            job.parts.iter().flat_map(|p| p.index.problems.iter().map(move |problem| format!("{}: {problem}", p.name))),
        )
        .collect();
    Ok(axum::Json(json!({
        "name": "job",
        "duration_ns": job.end - job.origin,
        "events": job.events(),
        "unplaced": job.parts.iter().map(|p| p.index.unplaced).sum::<u64>(),
        "tracks": tracks,
        "ranks": ranks,
        "collectives": job.collectives(),
        "groups": job.groups.iter().map(group_summary).collect::<Vec<_>>(),
        "problems": problems,
    }))
    .into_response())
}

/// Collectives of a job's group sent with its summary, the most skewed first, at most.
const GROUP_ROWS: usize = 200;

/// A communicator of the job for the page: its figures, the straggler named by the live
/// tools' rule, and its most skewed collectives.
fn group_summary(view: &neuron_datastore::ranks::GroupView) -> serde_json::Value {
    let mut rows: Vec<&neuron_datastore::ranks::CollectiveView> = view.collectives.iter().collect();
    rows.sort_by(|a, b| b.skew_ns.cmp(&a.skew_ns).then(a.position.cmp(&b.position)));
    let rows: Vec<serde_json::Value> = rows
        .iter()
        .take(GROUP_ROWS)
        .map(|c| {
            json!({
                "sequence": c.position.sequence, "index": c.position.index, "position": c.position.to_string(),
                "operation": c.operation, "algorithm": c.algorithm, "bytes": c.bytes,
                "complete": c.complete, "skew_ns": c.skew_ns, "last": c.last,
            })
        })
        .collect();
    json!({
        "id": view.id,
        "ranks": view.members.len(),
        "uncertainty_ns": view.uncertainty_ns,
        "collectives": view.collectives.len(),
        "complete": view.collectives.iter().filter(|c| c.complete).count(),
        "straggler": view.straggler.as_ref().map(|s| json!({"rank": s.rank, "text": s.text})),
        "rows": rows,
    })
}

async fn job_view(State(state): State<Shared>, Query(q): Query<ViewQuery>) -> Result<Response, Response> {
    let job = job(&state).await?;
    let view = blocking(move || serde_json::to_vec(&job.view(q.t0, q.t1, q.columns))).await?;
    let json = view.map_err(|e| error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok(([(header::CONTENT_TYPE, "application/json")], json).into_response())
}

async fn job_span(State(state): State<Shared>, Query(q): Query<SpanQuery>) -> Result<Response, Response> {
    let job = job(&state).await?;
    let details = job.details(q.track, q.index).ok_or_else(|| error(StatusCode::NOT_FOUND, "no such span"))?;
    Ok(axum::Json(details).into_response())
}

async fn job_hlo(State(state): State<Shared>, Query(q): Query<HloQuery>) -> Result<Response, Response> {
    let job = job(&state).await?;
    let found = blocking(move || {
        let (track, index) = job.longest_of_hlo(&q.name)?;
        let (start_ns, end_ns) = job.span_time(track, index)?;
        Some(json!({"track": track, "index": index, "start_ns": start_ns, "end_ns": end_ns}))
    })
    .await?;
    found
        .map(|body| axum::Json(body).into_response())
        .ok_or_else(|| error(StatusCode::NOT_FOUND, "no instruction of that HLO instruction in these profiles"))
}

async fn job_perfetto(State(state): State<Shared>) -> Response {
    let paths: Vec<PathBuf> = state.profiles.rank_files().into_iter().map(|(_, _, path)| path).collect();
    if paths.is_empty() {
        return not_found().await;
    }
    perfetto_download(&state, paths, true, "ranks.perfetto-trace")
}

/// Sends what is written to a response body, a megabyte at a time.
struct ChannelWriter {
    tx: tokio::sync::mpsc::Sender<std::io::Result<Bytes>>,
    buffer: Vec<u8>,
}

impl std::io::Write for ChannelWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.buffer.extend_from_slice(bytes);
        if self.buffer.len() >= 1 << 20 {
            self.flush()?;
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buffer, Vec::with_capacity(1 << 20)));
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the download was cancelled"))
    }
}

impl Drop for ChannelWriter {
    fn drop(&mut self) {
        let _ = std::io::Write::flush(self);
    }
}

#[derive(Debug, Deserialize)]
struct CompareQuery {
    a: String,
    b: String,
}

async fn compare_profiles(State(state): State<Shared>, Query(q): Query<CompareQuery>) -> Result<Response, Response> {
    // Both names are checked before either file is read.
    if state.profiles.resolve(&q.a).is_none() || state.profiles.resolve(&q.b).is_none() {
        return Err(not_found().await);
    }
    let a = profile(&state, &q.a).await?;
    let b = profile(&state, &q.b).await?;
    let body = blocking(move || {
        let (sa, sb) = (a.summary(), b.summary());
        json!({
            "a": { "name": a.name, "device_time_s": sa.device_time_s, "executions": sa.executions.count,
                   "device_traced": sa.executions.device_traced, "spread": spread(sa) },
            "b": { "name": b.name, "device_time_s": sb.device_time_s, "executions": sb.executions.count,
                   "device_traced": sb.executions.device_traced, "spread": spread(sb) },
            "noise_min_traced": NOISE_MIN_TRACED,
            "hlo_instructions": compare(sa, sb),
            "analysis": compare_bounds(sa, sb),
        })
    })
    .await?;
    Ok(axum::Json(body).into_response())
}
