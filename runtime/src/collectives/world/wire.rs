//! What processes of a job say to each other, and how it is framed on a stream.
//!
//! Every stream opens with the handshake of `auth.rs`, which proves both ends belong to
//! the job. Then every frame is a little-endian `u32` header length, the header
//! (postcard), then the payload the header announces (data messages streamed through
//! the link only). Two streams exist between
//! processes: each process's **control** connection to the root (rank 0's process),
//! carrying [`Control`] messages, and one **data** link per pair of processes, carrying
//! [`Envelope`]s with the collectives' bytes.

use std::io::{self, Read, Write};
use std::net::SocketAddr;

use serde::{Deserialize, Serialize, de::DeserializeOwned};

use super::outbox::Place;
use crate::shared_memory::SharedPlace;
use neuron_datastore::flight::Heard;

/// A header longer than this is not ours: the stream is closed rather than trusted.
const MAX_HEADER_BYTES: u32 = 1 << 20;

/// A process of the job as the others name it in messages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Peer {
    pub(crate) pid: u32,
    pub(crate) host: String,
    /// Where its data links are accepted.
    pub(crate) data: SocketAddr,
    /// Its host as shared memory sees it: equal for processes that can share a segment.
    pub(crate) host_identity: String,
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {} on host {}", self.pid, self.host)
    }
}

/// Messages on a control connection (process ↔ root).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Control {
    /// Process → root, first: who it is.
    Hello(Peer),
    /// Root → process, first, once it proved it belongs to the job: its index among
    /// the job's processes, and the job's session (the data links' key derives from it).
    Welcome { process: u32, session: [u8; 32] },
    /// Process → root: it holds rank `rank` of `count` of communicator `comm` (a
    /// program's when `program` gives the hash of the NEFF whose ranks it joins).
    Join { comm: u64, name: String, count: u32, rank: u32, program: Option<String> },
    /// Root → every process of a communicator once all its ranks joined: each rank's
    /// process, and every process known so far (by index).
    Roster { comm: u64, rank_process: Vec<u32>, processes: Vec<Option<Peer>> },
    /// Root → a process whose join cannot be accepted.
    Refused { comm: u64, reason: String },
    /// Root → every process that joined one of `comms`: the job's processes joined
    /// those communicators of different programs, none complete, no rank in two (they
    /// loaded different NEFFs where they were to load one), as `text` says.
    Mismatch { comms: Vec<u64>, text: String },
    /// Root → every other process: process `process` closed its connection.
    Gone { process: u32, reason: String },
    /// Process → root: a probe of the clocks, sent at `sent` (the process's clock).
    ClockProbe { sent: u64 },
    /// Root → process: the probe sent at `sent`, received and answered at `received`
    /// and `replied` (the root's clock).
    ClockEcho { sent: u64, received: u64, replied: u64 },
    /// Process → root, every [`super::HEARTBEAT`]: what it is doing, as its models
    /// table says (the root dates it on arrival, on the job's one clock; see
    /// [`Heard::of`]).
    Status(Heard),
    /// Root → every process, every [`super::HEARTBEAT`]: what each process said last,
    /// by process.
    Statuses(Vec<(u32, Heard)>),
}

/// The header of one message on a data link.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Envelope {
    pub(crate) key: Key,
    pub(crate) stamp: Stamp,
    pub(crate) body: Body,
}

/// What a message of an operation says beside its bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Stamp {
    /// The sender's description of the operation; the receiver's must be the same.
    pub(crate) signature: String,
    /// When the ranks the sender knows of arrived at the operation: its own, and
    /// around a ring those its predecessors told it, so that every rank of the group
    /// learns every arrival with the data (the flight record, `flight.rs` in the
    /// datastore).
    pub(crate) arrivals: Vec<Arrival>,
}

impl Stamp {
    /// A stamp with no arrivals.
    pub(crate) fn of(signature: &str) -> Stamp {
        Stamp { signature: signature.to_owned(), arrivals: Vec::new() }
    }
}

/// A rank's arrival at an operation, on the root's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Arrival {
    pub(crate) rank: u32,
    pub(crate) at_ns: u64,
    /// The most the rank's process's clock may be off the root's.
    pub(crate) uncertainty_ns: u64,
    /// What it did from its previous collective's end to this arrival (`None` at its
    /// first collective).
    pub(crate) before: Option<neuron_datastore::flight::Before>,
}

/// Where a message goes: communicator, unit, operation within the unit, step of the
/// algorithm, sending and receiving rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(crate) struct Key {
    pub(crate) comm: u64,
    pub(crate) unit: u64,
    pub(crate) index: u32,
    pub(crate) step: u32,
    pub(crate) from: u32,
    pub(crate) to: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Body {
    /// `len` payload bytes follow the header.
    Data { len: u64 },
    /// The bytes lie in the sender's outbox (a process of this host; see `outbox.rs`).
    Shared { place: Place },
    /// The bytes are the sender's input tensor, which it lends with its output tensor
    /// (a process of this host; see `lending.rs`).
    Lent { input: SharedPlace, output: SharedPlace },
    /// The sender's operation failed: the receiver's fails too, with this reason.
    Abort { reason: String },
}

/// Writes one header (and no payload).
pub(crate) fn write_header<T: Serialize>(out: &mut impl Write, header: &T) -> io::Result<()> {
    out.write_all(&frame(header)?)
}

/// One header as framed on a stream (to write the same to several).
pub(crate) fn frame<T: Serialize>(header: &T) -> io::Result<Vec<u8>> {
    let bytes = postcard::to_stdvec(header).map_err(io::Error::other)?;
    let len = u32::try_from(bytes.len()).map_err(io::Error::other)?;
    if len > MAX_HEADER_BYTES {
        return Err(io::Error::other(format!("a {len}-byte header is longer than a reader takes")));
    }
    let mut frame = Vec::with_capacity(4 + bytes.len());
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(&bytes);
    Ok(frame)
}

/// Reads one header; `Ok(None)` at a clean end of stream.
pub(crate) fn read_header<T: DeserializeOwned>(input: &mut impl Read) -> io::Result<Option<T>> {
    let mut len = [0u8; 4];
    match input.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len);
    if len > MAX_HEADER_BYTES {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("a {len}-byte header is not ours")));
    }
    // Grown as the bytes arrive, not allocated as announced.
    let mut bytes = Vec::new();
    input.take(u64::from(len)).read_to_end(&mut bytes)?;
    if bytes.len() != len as usize {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    postcard::from_bytes(&bytes).map(Some).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_a_clean_end_is_no_header() {
        let envelope = Envelope {
            key: Key { comm: 7, unit: 3, index: 1, step: 2, from: 0, to: 5 },
            stamp: Stamp {
                signature: "AllReduce(Add) of f32".into(),
                arrivals: vec![Arrival {
                    rank: 5,
                    at_ns: 1 << 40,
                    uncertainty_ns: 12,
                    before: Some(neuron_datastore::flight::Before {
                        since_ns: 900,
                        executing_ns: 800,
                        busiest: Some((neuron_datastore::Engine::Pe, 700)),
                    }),
                }],
            },
            body: Body::Data { len: 1 << 20 },
        };
        let control = Control::Statuses(vec![(3, Heard::of(5 << 30, &[("step".into(), Some("dot.3".into()))]))]);
        let mut stream = Vec::new();
        write_header(&mut stream, &envelope).expect("in memory");
        write_header(&mut stream, &control).expect("in memory");
        let mut input = stream.as_slice();
        assert_eq!(read_header::<Envelope>(&mut input).expect("in memory"), Some(envelope));
        assert_eq!(read_header::<Control>(&mut input).expect("in memory"), Some(control));
        assert_eq!(read_header::<Control>(&mut input).expect("in memory"), None);
        let oversized = (MAX_HEADER_BYTES + 1).to_le_bytes();
        assert!(read_header::<Control>(&mut oversized.as_slice()).is_err());
    }
}
