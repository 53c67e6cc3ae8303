//! The data links between this process and the others: one TCP connection per pair,
//! opened by the process of lower index, which also offers a shared-memory segment
//! when both are on one host ([`shm`](super::shm)); the TCP connection then only tells
//! whether the peer is alive. Each link's reader thread delivers what arrives into the
//! world's mailbox and marks the peer gone when the link ends, after the data that
//! preceded the end.

use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
    Tcp(TcpStream),
    Shm(shm::RingWriter),
}

impl Write for LinkOut {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            LinkOut::Tcp(stream) => stream.write(buf),
            LinkOut::Shm(ring) => ring.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            LinkOut::Tcp(stream) => stream.flush(),
            LinkOut::Shm(ring) => ring.flush(),
        }
    }
}

/// A link's receiving end.
enum LinkIn {
    Tcp(TcpStream),
    Shm(shm::RingReader),
}

impl Read for LinkIn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            LinkIn::Tcp(stream) => stream.read(buf),
            LinkIn::Shm(ring) => ring.read(buf),
        }
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
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    wire::greet(&mut stream)?;
    stream.write_all(&me.to_le_bytes())?;
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
    for stream in listener.incoming() {
        if shared.closing.load(Ordering::SeqCst) {
            return;
        }
        let Ok(mut stream) = stream else { continue };
        let shared = Arc::clone(&shared);
        let _ = std::thread::Builder::new().name("nrt-link-hello".into()).spawn(move || {
            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
            let accepted = accept_hello(&mut stream);
            if let Ok((index, transport)) = accepted
                && stream.set_read_timeout(None).is_ok()
            {
                let _ = add_link(&shared, index, stream, transport);
            }
        });
    }
}

/// Reads an opener's hello: its index and the transport it offers (a segment is mapped
/// here if it can be, and the opener told).
fn accept_hello(stream: &mut TcpStream) -> io::Result<(u32, Transport)> {
    wire::greet(stream)?;
    let mut index = [0u8; 4];
    stream.read_exact(&mut index)?;
    let mut offer = [0u8; 1];
    stream.read_exact(&mut offer)?;
    if offer[0] != OFFER_SHM {
        return Ok((u32::from_le_bytes(index), Transport::Tcp));
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
    let transport = match segment {
        Some(segment) => Transport::Shm { segment, out: 1 },
        None => Transport::Tcp,
    };
    Ok((u32::from_le_bytes(index), transport))
}

/// Registers a link to `process` and starts delivering what it carries.
fn add_link(shared: &Arc<Shared>, process: u32, stream: TcpStream, transport: Transport) -> io::Result<()> {
    stream.set_nodelay(true)?;
    remember(shared, &stream, Closing::Write);
    let (writer, reader) = match &transport {
        Transport::Tcp => (LinkOut::Tcp(stream.try_clone()?), LinkIn::Tcp(stream.try_clone()?)),
        Transport::Shm { segment, out } => {
            lock(&shared.rings).push((Arc::clone(segment), *out));
            (LinkOut::Shm(segment.writer(*out)), LinkIn::Shm(segment.reader(1 - out)))
        }
    };
    let through = match &transport {
        Transport::Tcp => "TCP",
        Transport::Shm { .. } => "shared memory",
    };
    tracing::debug!("data link to process {process} through {through}");
    let writer = BufWriter::with_capacity(1 << 16, writer);
    lock(&shared.state).links.insert(process, Arc::new(Mutex::new(writer)));
    shared.changed.notify_all();
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
                    let mut data = crate::collectives::buffers::take(len as usize);
                    if let Err(e) = reader.read_exact(&mut data) {
                        break format!("RX, connection failed: {e}");
                    }
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
