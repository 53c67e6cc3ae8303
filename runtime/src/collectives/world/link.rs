//! The data links between this process and the others: one TCP connection per pair,
//! opened by the process of lower index once both ends proved themselves with the
//! session's key (`auth.rs`; the opener's index is part of its proof, and a link never
//! replaces a live one), which also offers a shared-memory segment
//! when both are on one host ([`shm`](super::shm)); the TCP connection then only tells
//! whether the peer is alive. Each link's reader thread delivers what arrives into the
//! world's mailbox and marks the peer gone when the link ends, after the data that
//! preceded the end; it records when bytes last arrived ([`ReadProgress`]), so that a
//! receiver whose deadline passes in the middle of a message can say the link stopped.
//! A send that finds no room for the execution timeout fails (TCP: the socket's send
//! timeout; shared memory: the ring's stall limit): a transfer that moves is no hang.

use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::auth::{self, Admission, Refused, Side};
use super::lending::PeerTensors;
use super::outbox::{Message, PeerAreas};
use super::shm::{self, Segment};
use super::wire::{self, Body, Envelope};
use super::{Closing, Shared, deliver, lock, mark_gone, remember};

/// How a link moves its data.
enum Transport {
    Tcp,
    /// Through a segment both processes mapped: this side writes ring `out` and reads
    /// ring `1 - out`.
    Shm {
        segment: Arc<Segment>,
        out: usize,
    },
}

/// A link's sending end.
#[derive(Debug)]
pub(super) enum LinkOut {
    /// A socket, and the longest a write may move nothing (its sends give up in short
    /// slices, retried until then: see `write`).
    Tcp {
        stream: TcpStream,
        stall_limit: Duration,
    },
    Shm(shm::RingWriter),
}

impl LinkOut {
    fn tcp(stream: TcpStream, stall_limit: Duration) -> io::Result<LinkOut> {
        // A send that moved some bytes before it gave up returns them at the end of
        // its slice, not when the link stopped: a short slice bounds that lag.
        stream.set_write_timeout(Some((stall_limit / 5).clamp(Duration::from_millis(10), Duration::from_secs(1))))?;
        Ok(LinkOut::Tcp { stream, stall_limit })
    }
}

impl Write for LinkOut {
    /// A TCP write fails (`TimedOut`) once it has moved nothing for the stall limit,
    /// give or take one slice: at the timeout, not a slice's partial send later.
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            LinkOut::Tcp { stream, stall_limit } => {
                let started = Instant::now();
                loop {
                    match stream.write(buf) {
                        Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                            if started.elapsed() >= *stall_limit {
                                return Err(io::Error::new(io::ErrorKind::TimedOut, e));
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        sent => return sent,
                    }
                }
            }
            LinkOut::Shm(ring) => ring.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            LinkOut::Tcp { stream, .. } => stream.flush(),
            LinkOut::Shm(ring) => ring.flush(),
        }
    }
}

/// A link's receiving end, recording its progress.
struct LinkIn {
    from: From,
    progress: Arc<ReadProgress>,
}

enum From {
    Tcp(TcpStream),
    Shm(shm::RingReader),
}

impl Read for LinkIn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = match &mut self.from {
            From::Tcp(stream) => stream.read(buf),
            From::Shm(ring) => ring.read(buf),
        }?;
        if n > 0 {
            self.progress.last_ns.store(neuron_datastore::clock::monotonic_ns(), Ordering::Relaxed);
        }
        Ok(n)
    }
}

/// How far a link's reader is: when bytes last came, and the message it is reading.
#[derive(Debug, Default)]
pub(super) struct ReadProgress {
    last_ns: AtomicU64,
    /// The payload bytes of the message being read (0: between messages).
    in_message: AtomicU64,
    /// Set when the reader has ended.
    ended: AtomicBool,
}

/// A link silent this long in the middle of a message is said stopped.
const STALLED: Duration = Duration::from_secs(1);

impl ReadProgress {
    /// Why the link seems down, when its reader is in the middle of a message and no
    /// byte came for [`STALLED`] or longer.
    pub(super) fn stalled(&self) -> Option<String> {
        let len = self.in_message.load(Ordering::Relaxed);
        if len == 0 || self.ended.load(Ordering::Relaxed) {
            return None;
        }
        let silent_ns = neuron_datastore::clock::monotonic_ns().saturating_sub(self.last_ns.load(Ordering::Relaxed));
        (silent_ns >= STALLED.as_nanos() as u64).then(|| {
            format!(
                "no data for {:.1} s in the middle of a {len}-byte message: the link is down or the host unreachable",
                silent_ns as f64 / 1e9
            )
        })
    }
}

/// What the opener says after its index: the transport it offers.
const OFFER_TCP: u8 = 0;
const OFFER_SHM: u8 = 1;

pub(super) fn open_link(
    shared: &Arc<Shared>,
    me: u32,
    process: u32,
    addr: SocketAddr,
    same_host: bool,
) -> io::Result<()> {
    let mut stream = TcpStream::connect_timeout(&addr, auth::HANDSHAKE_TIMEOUT)?;
    let key = lock(&shared.state).link_key.ok_or_else(|| io::Error::other("this process was not welcomed yet"))?;
    let deadline = Instant::now() + auth::HANDSHAKE_TIMEOUT;
    let proven = auth::handshake(&mut stream, Side::Opener, (&key, b"link"), me, deadline).map_err(io::Error::other)?;
    if proven.their_claim != process {
        return Err(io::Error::other(format!(
            "process {} answered at the address of process {process}",
            proven.their_claim
        )));
    }
    stream.set_read_timeout(Some(auth::HANDSHAKE_TIMEOUT))?;
    // Processes of one host share a segment; the TCP connection then only tells
    // whether the peer is alive.
    let segment = if same_host { Segment::create(process).ok() } else { None };
    let transport = match segment {
        Some((segment, file)) => {
            let name = file.path().to_string_lossy().into_owned();
            let mut offer = vec![OFFER_SHM];
            offer.extend_from_slice(&(name.len() as u16).to_le_bytes());
            offer.extend_from_slice(name.as_bytes());
            let mut mapped = [0u8; 1];
            let answered = stream.write_all(&offer).and_then(|()| stream.read_exact(&mut mapped));
            // Mapped or not, the file is not needed any more.
            drop(file);
            answered?;
            if mapped[0] == 1 { Transport::Shm { segment, out: 0 } } else { Transport::Tcp }
        }
        None => {
            stream.write_all(&[OFFER_TCP])?;
            Transport::Tcp
        }
    };
    add_link(shared, process, stream, transport)
}

pub(super) fn accept_links(shared: Arc<Shared>, listener: TcpListener) {
    let at = listener.local_addr().map_or_else(|e| e.to_string(), |a| a.to_string());
    let admission = Admission::new(format!("the data links' listener at {at}"));
    for stream in listener.incoming() {
        if shared.closing.load(Ordering::SeqCst) {
            return;
        }
        let Ok(mut stream) = stream else { continue };
        let Ok(peer) = stream.peer_addr() else { continue };
        // A connection beyond those proving themselves is closed at once.
        let Some(proving) = admission.enter(peer) else { continue };
        let (shared, admission) = (Arc::clone(&shared), Arc::clone(&admission));
        let _ = std::thread::Builder::new().name("nrt-link-hello".into()).spawn(move || {
            let deadline = Instant::now() + auth::HANDSHAKE_TIMEOUT;
            let accepted = prove_opener(&shared, &mut stream, deadline).and_then(|index| {
                stream.set_read_timeout(Some(auth::HANDSHAKE_TIMEOUT))?;
                let transport = accept_offer(&mut stream)?;
                stream.set_read_timeout(None)?;
                Ok((index, transport))
            });
            drop(proving);
            match accepted {
                Ok((index, transport)) => {
                    if let Err(why) = add_link(&shared, index, stream, transport) {
                        admission.refuse(peer, &Refused::Io(why));
                    }
                }
                Err(why) => admission.refuse(peer, &why),
            }
        });
    }
}

/// Checks that the opener of `stream` is a process of the job (of lower index than
/// this one's, which opens the links of higher ones): its index.
fn prove_opener(shared: &Shared, stream: &mut TcpStream, deadline: Instant) -> Result<u32, Refused> {
    // A link may come before this process has read its welcome (sent before the
    // roster that named it to the opener): it waits for it.
    let (me, key) = {
        let mut state = lock(&shared.state);
        loop {
            if let (Some(me), Some(key)) = (state.process, state.link_key) {
                break (me, key);
            }
            let now = Instant::now();
            if now >= deadline || shared.closing.load(Ordering::SeqCst) {
                return Err(Refused::Slow);
            }
            state = shared.changed.wait_timeout(state, deadline - now).map_or_else(|e| e.into_inner().0, |r| r.0);
        }
    };
    let proven = auth::handshake(stream, Side::Acceptor, (&key, b"link"), me, deadline)?;
    if proven.their_claim >= me {
        return Err(Refused::Stranger(format!(
            "process {} opened a link to process {me}, which opens its links to higher indices itself",
            proven.their_claim
        )));
    }
    Ok(proven.their_claim)
}

/// Reads the transport an opener offers (a segment is mapped here if it can be, and
/// the opener told).
fn accept_offer(stream: &mut TcpStream) -> io::Result<Transport> {
    let mut offer = [0u8; 1];
    stream.read_exact(&mut offer)?;
    if offer[0] != OFFER_SHM {
        return Ok(Transport::Tcp);
    }
    let mut len = [0u8; 2];
    stream.read_exact(&mut len)?;
    let mut name = vec![0u8; usize::from(u16::from_le_bytes(len))];
    stream.read_exact(&mut name)?;
    let path = String::from_utf8_lossy(&name).into_owned();
    let segment = Segment::open(Path::new(&path)).ok();
    if segment.is_some() {
        // Both sides have it mapped: the file goes at once, whatever happens next.
        let _ = std::fs::remove_file(&path);
    }
    stream.write_all(&[u8::from(segment.is_some())])?;
    Ok(match segment {
        Some(segment) => Transport::Shm { segment, out: 1 },
        None => Transport::Tcp,
    })
}

/// Registers a link to `process` and starts delivering what it carries; refused when
/// a link to `process` is live, or it is known gone.
fn add_link(shared: &Arc<Shared>, process: u32, stream: TcpStream, transport: Transport) -> io::Result<()> {
    stream.set_nodelay(true)?;
    // The reader waits for the next message as long as the link lives.
    stream.set_read_timeout(None)?;
    // A send that finds no room for the timeout fails instead of hanging.
    let (writer, from) = match &transport {
        Transport::Tcp => (LinkOut::tcp(stream.try_clone()?, shared.timeout)?, From::Tcp(stream.try_clone()?)),
        Transport::Shm { segment, out } => {
            (LinkOut::Shm(segment.writer(*out).bounded(shared.timeout)), From::Shm(segment.reader(1 - out)))
        }
    };
    let through = match &transport {
        Transport::Tcp => "TCP",
        Transport::Shm { .. } => "shared memory",
    };
    let progress = Arc::new(ReadProgress::default());
    {
        let mut state = lock(&shared.state);
        if state.links.contains_key(&process) || state.gone.contains_key(&process) {
            return Err(io::Error::other(format!(
                "a link to process {process} exists (or existed): it is not replaced"
            )));
        }
        let writer = BufWriter::with_capacity(1 << 16, writer);
        state.links.insert(process, Arc::new(Mutex::new(writer)));
        state.progress.insert(process, Arc::clone(&progress));
    }
    remember(shared, &stream, Closing::Write);
    if let Transport::Shm { segment, out } = &transport {
        lock(&shared.rings).push((Arc::clone(segment), *out));
    }
    tracing::debug!("data link to process {process} through {through}");
    shared.changed.notify_all();
    let reader = LinkIn { from, progress: Arc::clone(&progress) };
    let shares_memory = matches!(transport, Transport::Shm { .. });
    if let Transport::Shm { segment, .. } = transport {
        // The peer's death closes the TCP connection: the ring reader then ends after
        // what the peer wrote before it.
        let mut watched = stream.try_clone()?;
        std::thread::Builder::new().name("nrt-link-watch".into()).spawn(move || {
            let mut byte = [0u8; 1];
            while matches!(watched.read(&mut byte), Ok(n) if n > 0) {}
            segment.peer_closed();
        })?;
    }
    let shared = Arc::clone(shared);
    std::thread::Builder::new().name("nrt-link".into()).spawn(move || {
        let mut reader = BufReader::with_capacity(1 << 16, reader);
        let mut areas = PeerAreas::default();
        let mut tensors = PeerTensors::default();
        let reason = loop {
            let envelope = match wire::read_header::<Envelope>(&mut reader) {
                Ok(Some(envelope)) => envelope,
                Ok(None) => break "RX, connection closed by remote peer".to_owned(),
                Err(e) => break format!("RX, connection failed: {e}"),
            };
            tensors.let_go_of_freed();
            let body = match envelope.body {
                Body::Data { len } => {
                    progress.in_message.store(len.max(1), Ordering::Relaxed);
                    let mut data = crate::collectives::buffers::take(len as usize);
                    if let Err(e) = reader.read_exact(&mut data) {
                        break format!("RX, connection failed: {e}");
                    }
                    progress.in_message.store(0, Ordering::Relaxed);
                    Ok(Arc::new(Message::Heap(data)))
                }
                // Only a process of this host has an outbox this one can map.
                Body::Shared { .. } | Body::Lent { .. } if !shares_memory => {
                    break "RX, a message in shared memory came over a link between hosts".to_owned();
                }
                Body::Shared { place } => match areas.receive(place) {
                    Ok(received) => Ok(Arc::new(Message::Received(received))),
                    Err(e) => {
                        break format!(
                            "RX, cannot read a message in the outbox of pid {} (/proc/{}/fd/{}): {e}",
                            place.pid, place.pid, place.fd
                        );
                    }
                },
                Body::Lent { input, output } => match tensors.receive(input, output) {
                    Ok(lent) => Ok(Arc::new(Message::Lent(lent))),
                    Err(e) => {
                        break format!(
                            "RX, cannot read the tensors pid {} lent (/proc/{}/fd/{} and {}): {e}",
                            input.pid, input.pid, input.fd, output.fd
                        );
                    }
                },
                Body::Abort { reason } => Err(reason),
            };
            let mut state = lock(&shared.state);
            deliver(&mut state, envelope.key, envelope.stamp, body);
            shared.changed.notify_all();
        };
        progress.ended.store(true, Ordering::Relaxed);
        if !shared.closing.load(Ordering::SeqCst) {
            let who = lock(&shared.state)
                .peers
                .get(process as usize)
                .and_then(Option::as_ref)
                .map_or_else(|| format!("process {process}"), ToString::to_string);
            mark_gone(&shared, process, format!("{reason} ({who})"));
        }
        let _ = stream.shutdown(Shutdown::Both);
    })?;
    Ok(())
}
