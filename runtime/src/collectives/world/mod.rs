//! This process among the processes of a job: the bootstrap through rank 0's process,
//! the data links to the other processes, and the mailbox their messages land in.
//!
//! A [`World`] exists once per runtime whose communicators span processes. Its control
//! thread connects to the root at `NEURON_RT_ROOT_COMM_ID` (retrying, with Neuron's
//! `Connect to … failed - retrying`, until the execution timeout has passed), proves
//! that it belongs to the job and checks that the root does (`auth.rs`), says
//! where this process accepts data links, and sends the joins of this process's ranks;
//! the process that holds rank 0 also runs the root ([`root::Server`]). Once every rank
//! of a communicator has joined, each of its processes gets the roster and the process
//! of lower index opens the data link of each pair (`link.rs`: one per pair of
//! processes, whatever the number of communicators; through a shared-memory segment
//! between processes of one host, `shm.rs`, else TCP).
//!
//! Every data link proves itself with the key of the session the root handed out, and
//! never replaces a live one. A transfer that makes no progress for the execution
//! timeout fails, naming the link, rather than hanging: a link that comes back before
//! then goes on.
//!
//! Messages are delivered into one mailbox, keyed by communicator, unit, operation,
//! step and ranks ([`wire::Key`]); messages between ranks of this process go straight
//! into it. A receiver waits for its key, and fails as soon as the sending process is
//! known to be gone (its link or its control connection closed), when another rank of
//! the operation aborted it, or at the deadline.

pub(crate) mod auth;
pub(crate) mod clock;
pub(crate) mod lending;
mod link;
pub(crate) mod outbox;
mod root;
mod shm;
pub(crate) mod wire;

use std::collections::{HashMap, HashSet};
use std::io::{BufReader, BufWriter, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::{NrtError, NrtResult, NrtStatus};
use crate::launch::RootComm;
use crate::shared_memory::SharedPlace;
use auth::{Side, Trust};
use clock::{ClockOffset, Probe};
use link::{LinkOut, ReadProgress, accept_links, open_link};
use neuron_datastore::flight::Heard;
pub(crate) use outbox::Message;
use outbox::Outbox;
use shm::Segment;
pub(crate) use wire::{Arrival, Stamp};
use wire::{Body, Control, Envelope, Key, Peer};

/// How often each process tells the root what it is doing, and the root tells every
/// process what each said last.
pub(crate) const HEARTBEAT: Duration = Duration::from_secs(1);

/// How often a refused connection to the root is logged again while retrying.
const RETRY_LOG_INTERVAL: Duration = Duration::from_secs(5);
/// Pause between two attempts to reach the root.
const RETRY_PAUSE: Duration = Duration::from_millis(50);
/// How long one attempt to reach the root may take.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(200);
/// How long the root's word that the processes joined different programs may stand
/// before a wait for one of them fails: processes that load several programs in
/// different orders are apart that long at most.
const MISMATCH_GRACE: Duration = Duration::from_secs(5);
/// How long a wait on a process that is gone looks for its last word (an abort that
/// names the root cause) before it says the process is gone.
const GONE_GRACE: Duration = Duration::from_millis(50);

/// This process's membership in the job.
#[derive(Debug)]
pub(crate) struct World {
    root: SocketAddr,
    root_label: String,
    shared: Arc<Shared>,
    server: Mutex<Option<root::Server>>,
    control_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    /// Told (with `state`) only when the world closes: what waits for nothing else
    /// (the heartbeat between beats) is not woken by every message.
    closed: Condvar,
    /// The control connection's writing half, once connected.
    control: Mutex<Option<BufWriter<TcpStream>>>,
    closing: AtomicBool,
    /// Sockets to shut down when the world closes, and how: the control connection and
    /// the data listener entirely, the links for writing only (see [`Closing`]).
    sockets: Mutex<Vec<(OwnedFd, Closing)>>,
    /// The rings this process writes through shared memory, closed with the world.
    rings: Mutex<Vec<(Arc<Segment>, usize)>>,
    /// What processes of this host (one kernel, one network and pid namespace) share.
    host: String,
    /// Where large messages to processes of this host lie.
    outbox: Outbox,
    /// Set once a roster names another process of this host.
    neighbours: AtomicBool,
    /// What the runtime is told, and asked, by the world's threads.
    hooks: Hooks,
    /// The latest measure's offset and uncertainty (0 until measured), for the
    /// collectives to stamp their arrivals with without a lock.
    offset_ns: AtomicI64,
    uncertainty_ns: AtomicU64,
    /// The thread that measures it, once connected.
    clock_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Who may join the job.
    trust: Trust,
    /// The execution timeout: the longest a transfer may make no progress.
    timeout: Duration,
}

/// What the runtime is told, and asked, by the world's threads (none of them with a
/// lock of the world held).
pub(crate) struct Hooks {
    /// Told each new measure of this process's clock against the root's (the runtime
    /// records it in the trace).
    pub(crate) on_clock: Box<dyn Fn(ClockOffset) + Send + Sync>,
    /// Asked, every [`HEARTBEAT`], what this process is doing (the models it is
    /// executing, each with its instruction), to tell the others.
    pub(crate) doing: Box<DoingHook>,
    /// Told, every [`HEARTBEAT`], what another process said it was doing, dated by
    /// the root: `(process, heard)`.
    pub(crate) on_heard: Box<HeardHook>,
}

/// See [`Hooks::on_heard`].
pub(crate) type HeardHook = dyn Fn(u32, &Heard) + Send + Sync;

/// See [`Hooks::doing`].
pub(crate) type DoingHook = dyn Fn() -> Vec<(String, Option<String>)> + Send + Sync;

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hooks")
    }
}

#[derive(Debug, Default)]
struct State {
    /// This process's index, once the root welcomed it.
    process: Option<u32>,
    /// The key of this job's data links, once the root welcomed this process.
    link_key: Option<[u8; 32]>,
    /// Joins made before the control connection was up.
    pending: Vec<Control>,
    rosters: HashMap<u64, Result<Arc<Roster>, String>>,
    /// Every process the rosters named, by index.
    peers: Vec<Option<Peer>>,
    links: HashMap<u32, Arc<Mutex<BufWriter<LinkOut>>>>,
    /// How far each link's reader is (to tell a link that stopped from a quiet peer).
    progress: HashMap<u32, Arc<ReadProgress>>,
    /// Processes known to be gone, with why.
    gone: HashMap<u32, String>,
    mailbox: HashMap<Key, Parcel>,
    /// Reasons operations (communicator, unit, index) were aborted by one of their ranks.
    aborts: HashMap<(u64, u64, u32), String>,
    /// Communicators an operation of which was aborted.
    failed: HashSet<u64>,
    /// What the root said of communicators of different programs the job's processes
    /// joined instead of one (see [`Control::Mismatch`]), and since when.
    mismatches: HashMap<u64, (String, Instant)>,
    /// Why the root cannot be reached (then nothing can be bootstrapped).
    lost: Option<NrtError>,
    /// The root's answers to this process's clock probes, not yet taken.
    clock_echoes: Vec<Probe>,
    /// The latest measure of this process's clock against the root's.
    clock: Option<ClockOffset>,
    /// What each other process said it was doing last.
    heard: HashMap<u32, Heard>,
}

/// The ranks of a communicator: each one's process, and the processes.
#[derive(Debug)]
pub(crate) struct Roster {
    pub(crate) rank_process: Vec<u32>,
    pub(crate) peers: Vec<Option<Peer>>,
    /// This process's index.
    pub(crate) process: u32,
}

impl Roster {
    /// Whether processes `a` and `b` are on one host (share memory).
    pub(crate) fn same_host(&self, a: u32, b: u32) -> bool {
        let host = |p: u32| self.peers.get(p as usize).and_then(Option::as_ref).map(|peer| &peer.host_identity);
        a == b || host(a).is_some_and(|identity| Some(identity) == host(b))
    }

    /// `rank 3 (pid 812 on host a)`.
    pub(crate) fn describe(&self, rank: u32) -> String {
        let peer = self.rank_process.get(rank as usize).and_then(|&p| self.peers.get(p as usize)?.as_ref());
        match peer {
            Some(peer) => format!("rank {rank} ({peer})"),
            None => format!("rank {rank}"),
        }
    }
}

/// How a socket is shut down when the world closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Closing {
    Both,
    /// A data link only stops sending: the peer still reads what was sent before (a
    /// socket closed with data it has not read resets the connection, and the peer
    /// loses what it had not read yet), and this side keeps reading until the peer
    /// closes its own.
    Write,
}

/// A delivered message: the sender's stamp and the bytes.
#[derive(Debug)]
pub(crate) struct Parcel {
    pub(crate) stamp: Stamp,
    pub(crate) data: Arc<Message>,
}

/// Why a message did not come.
#[derive(Debug)]
pub(crate) enum Missed {
    Timeout,
    /// The sending rank's process is gone.
    Gone(String),
    /// Another rank of the operation gave it up.
    Aborted(String),
    /// The link to the sending or receiving process moved nothing for the timeout.
    LinkDown(String),
}

impl World {
    /// Starts this process's membership: connects to the root in the background.
    pub(crate) fn start(root: &RootComm, timeout: Duration, hooks: Hooks, trust: Trust) -> NrtResult<World> {
        let label = root.to_string();
        let addr =
            (root.host.as_str(), root.port).to_socket_addrs().ok().and_then(|mut a| a.next()).ok_or_else(|| {
                NrtError::invalid(format!(
                    "the root address {label} does not resolve to an IP address; set {}",
                    crate::launch::ENV_ROOT_COMM_ID
                ))
            })?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            closed: Condvar::new(),
            control: Mutex::new(None),
            closing: AtomicBool::new(false),
            sockets: Mutex::new(Vec::new()),
            rings: Mutex::new(Vec::new()),
            host: host_identity(),
            outbox: Outbox::default(),
            neighbours: AtomicBool::new(false),
            hooks,
            offset_ns: AtomicI64::new(0),
            uncertainty_ns: AtomicU64::new(0),
            clock_thread: Mutex::new(None),
            trust,
            timeout,
        });
        let thread = {
            let (shared, label) = (Arc::clone(&shared), label.clone());
            std::thread::Builder::new()
                .name("nrt-bootstrap".into())
                .spawn(move || control(shared, addr, label, timeout))
                .map_err(|e| NrtError::new(NrtStatus::Resource, format!("cannot start the bootstrap thread: {e}")))?
        };
        Ok(World {
            root: addr,
            root_label: label,
            shared,
            server: Mutex::new(None),
            control_thread: Mutex::new(Some(thread)),
        })
    }

    /// Runs the root here (this process holds rank 0); a second call does nothing.
    pub(crate) fn serve_root(&self) -> NrtResult<()> {
        let mut server = self.server.lock().unwrap_or_else(|e| e.into_inner());
        if server.is_none() {
            *server = Some(root::Server::start(self.root, self.shared.trust.clone()).map_err(|e| {
                NrtError::invalid(format!(
                    "rank 0 runs in this process, so it must listen at {} ({}): {e}; set {} to an address of this host and a free port",
                    self.root, self.root_label, crate::launch::ENV_ROOT_COMM_ID
                ))
            })?);
            let admits = self.shared.trust.admission().describe();
            tracing::info!(root = %self.root, "bootstrap root listening; the job {admits}");
        }
        Ok(())
    }

    /// The id of the communicator of key `key` at the root, the same in every process
    /// of the job.
    pub(crate) fn communicator_id(&self, key: &str) -> u64 {
        self.shared.trust.communicator_id(key)
    }

    /// Joins rank `rank` of `count` of communicator `comm`, a program's when
    /// `program` gives its NEFF's hash (sent once connected).
    pub(crate) fn join(&self, comm: u64, name: &str, (count, rank): (u32, u32), program: Option<String>) {
        let join = Control::Join { comm, name: name.to_owned(), count, rank, program };
        let mut control = lock(&self.shared.control);
        match control.as_mut() {
            // A failed write means a closed connection, which the control thread notices
            // and records.
            Some(writer) => drop(wire::write_header(writer, &join).and_then(|()| writer.flush())),
            None => lock(&self.shared.state).pending.push(join),
        }
    }

    /// The roster of `comm`, waiting for it until `deadline`.
    pub(crate) fn roster(&self, comm: u64, name: &str, deadline: Instant) -> NrtResult<Arc<Roster>> {
        let mut state = lock(&self.shared.state);
        loop {
            match state.rosters.get(&comm) {
                Some(Ok(roster)) => return Ok(Arc::clone(roster)),
                Some(Err(reason)) => {
                    return Err(NrtError::invalid(format!("rank 0 refused a rank of `{name}`: {reason}")));
                }
                None => {}
            }
            if let Some(lost) = &state.lost {
                return Err(lost.clone());
            }
            let now = Instant::now();
            let mismatch = state.mismatches.get(&comm).map(|(text, since)| (text.clone(), *since + MISMATCH_GRACE));
            if let Some((text, certain)) = &mismatch
                && now >= *certain
            {
                return Err(NrtError::new(
                    NrtStatus::Timeout,
                    format!("`{name}` cannot complete: {text}; load the same NEFF in every process of the job"),
                ));
            }
            if now >= deadline {
                // A process that left the job before joining likely held the ranks missing.
                let mut gone: Vec<&String> = state.gone.values().collect();
                gone.sort();
                let mut left = if gone.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; processes of the job that left before it completed: {}",
                        gone.iter().map(|r| r.as_str()).collect::<Vec<_>>().join("; ")
                    )
                };
                // A process given another secret, or none, knocked at this process's root.
                let refused = lock(&self.server).as_ref().map_or(0, root::Server::refused);
                if refused > 0 {
                    left.push_str(&format!(
                        "; rank 0 refused {refused} connection(s) that could not prove they belong to the job (the first is in its log): is every process given the same {}?",
                        crate::config::ENV_JOB_SECRET
                    ));
                }
                return Err(NrtError::new(
                    NrtStatus::Timeout,
                    format!(
                        "not every rank of `{name}` joined through rank 0 at {} in time; start every process of the job (and check {}){left}",
                        self.root_label,
                        crate::launch::ENV_ROOT_COMM_ID
                    ),
                ));
            }
            let until = mismatch.map_or(deadline, |(_, certain)| certain.min(deadline));
            state = self.shared.changed.wait_timeout(state, until - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// What process `process` said it was doing last, if it said anything here, and
    /// now on the root's clock (to tell how long ago).
    pub(crate) fn heard(&self, process: u32) -> Option<(Heard, u64)> {
        let state = lock(&self.shared.state);
        state.heard.get(&process).map(|heard| (heard.clone(), self.root_now().0))
    }

    /// The roster of `comm`, if the root has sent it.
    pub(crate) fn known_roster(&self, comm: u64) -> Option<Arc<Roster>> {
        lock(&self.shared.state).rosters.get(&comm)?.as_ref().ok().map(Arc::clone)
    }

    /// This process's clock against the root's, once measured.
    pub(crate) fn clock_offset(&self) -> Option<ClockOffset> {
        lock(&self.shared.state).clock
    }

    /// Now on the root's clock, and the most that may be off by (0 until this
    /// process has measured its clock against the root's).
    pub(crate) fn root_now(&self) -> (u64, u64) {
        root_now(&self.shared)
    }

    /// The outbox, when processes of this host are in the job (a message meant for
    /// them is best made there: see [`Message::for_peers`]).
    pub(crate) fn outbox(&self) -> Option<&Outbox> {
        self.shared.neighbours.load(Ordering::Relaxed).then_some(&self.shared.outbox)
    }

    /// Sends `data` (or an abort) to rank `key.to`, held by process `process`.
    pub(crate) fn send(
        &self,
        process: u32,
        key: Key,
        stamp: &Stamp,
        body: Result<Arc<Message>, String>,
        deadline: Instant,
    ) -> Result<(), Missed> {
        let mut state = lock(&self.shared.state);
        if state.process == Some(process) {
            deliver(&mut state, key, stamp.clone(), body);
            self.shared.changed.notify_all();
            return Ok(());
        }
        let link = self.wait(state, process, deadline, |state| state.links.get(&process).map(Arc::clone))?;
        let writer = lock(&link);
        // A large message to a process of this host lies in the outbox: made there, or
        // copied there (else it is streamed).
        let copied;
        let slot = match &body {
            Ok(data) if matches!(writer.get_ref(), LinkOut::Shm(_)) => match &**data {
                Message::Outbox(slot) => Some(slot),
                message if message.len() >= outbox::MIN_MESSAGE => {
                    copied = self.shared.outbox.slot(message.len()).map(|mut slot| {
                        slot.bytes_mut().copy_from_slice(message);
                        slot
                    });
                    copied.as_ref()
                }
                _ => None,
            },
            _ => None,
        };
        let (body, payload) = match (&body, slot) {
            (Ok(_), Some(slot)) => (Body::Shared { place: slot.read_by_one_more() }, &[][..]),
            (Ok(data), None) => (Body::Data { len: data.len() as u64 }, &data[..]),
            (Err(reason), _) => (Body::Abort { reason: reason.clone() }, &[][..]),
        };
        let envelope = Envelope { key, stamp: stamp.clone(), body };
        self.write(process, writer, &envelope, payload).inspect_err(|_| {
            if let Some(slot) = slot {
                slot.unread();
            }
        })
    }

    /// Sends rank `key.from`'s `input` to rank `key.to`, held by process `process`: as
    /// the places of its lent input and output tensors when that process maps this
    /// host's memory, and then `true` (the peer reads them where they lie until it
    /// says it is done); else as bytes, and `false`.
    pub(crate) fn send_lent(
        &self,
        process: u32,
        key: Key,
        stamp: &Stamp,
        (input, places): (&[u8], (SharedPlace, SharedPlace)),
        deadline: Instant,
    ) -> Result<bool, Missed> {
        let mut state = lock(&self.shared.state);
        if state.process == Some(process) {
            deliver(&mut state, key, stamp.clone(), Ok(Arc::new(Message::Heap(input.to_vec()))));
            self.shared.changed.notify_all();
            return Ok(false);
        }
        let link = self.wait(state, process, deadline, |state| state.links.get(&process).map(Arc::clone))?;
        let writer = lock(&link);
        let lent = matches!(writer.get_ref(), LinkOut::Shm(_));
        let (body, payload) = match lent {
            true => (Body::Lent { input: places.0, output: places.1 }, &[][..]),
            false => (Body::Data { len: input.len() as u64 }, input),
        };
        let envelope = Envelope { key, stamp: stamp.clone(), body };
        self.write(process, writer, &envelope, payload).map(|()| lent)
    }

    /// Writes one envelope and its payload to a link (a failure ends it).
    fn write(
        &self,
        process: u32,
        mut writer: MutexGuard<'_, BufWriter<LinkOut>>,
        envelope: &Envelope,
        payload: &[u8],
    ) -> Result<(), Missed> {
        let sent = wire::write_header(&mut *writer, envelope)
            .and_then(|()| writer.write_all(payload))
            .and_then(|()| writer.flush());
        drop(writer);
        sent.map_err(|e| {
            // Either way the link is unusable: a stalled one's stream is cut mid-frame.
            let stalled = matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut);
            let reason = match stalled {
                true => format!(
                    "TX, nothing could be sent for {:.1} s: the link is down or the host unreachable",
                    self.shared.timeout.as_secs_f64()
                ),
                false => format!("TX, connection to process {process} failed: {e}"),
            };
            self.mark_gone(process, reason.clone());
            if stalled { Missed::LinkDown(reason) } else { Missed::Gone(reason) }
        })
    }

    /// Waits for the message `key` from process `process` until `deadline`; a link
    /// stopped in the middle of a message by then is said down.
    pub(crate) fn receive(&self, process: u32, key: Key, deadline: Instant) -> Result<Parcel, Missed> {
        let state = lock(&self.shared.state);
        let received = self.wait(state, process, deadline, |state| {
            if let Some(parcel) = state.mailbox.remove(&key) {
                return Some(Ok(parcel));
            }
            let aborted = state.aborts.get(&(key.comm, key.unit, key.index));
            aborted.map(|reason| Err(Missed::Aborted(reason.clone())))
        });
        match received {
            Err(Missed::Timeout) => {
                let progress = lock(&self.shared.state).progress.get(&process).map(Arc::clone);
                Err(progress.and_then(|p| p.stalled()).map_or(Missed::Timeout, Missed::LinkDown))
            }
            received => received?,
        }
    }

    /// Waits until `ready` gives something, failing once process `process` is gone or
    /// at `deadline`.
    fn wait<T>(
        &self,
        mut state: MutexGuard<'_, State>,
        process: u32,
        deadline: Instant,
        mut ready: impl FnMut(&mut State) -> Option<T>,
    ) -> Result<T, Missed> {
        // Once the process is gone, until when its last word is looked for: a process
        // that ends right after failing tells its peers why first, but that word may come
        // on another of its links (or through the root) than the close seen here, and it
        // names the root cause, not the process that gave up and left.
        let mut gone_until: Option<Instant> = None;
        loop {
            if let Some(value) = ready(&mut state) {
                return Ok(value);
            }
            let now = Instant::now();
            let until = match state.gone.get(&process) {
                Some(reason) => {
                    let until = *gone_until.get_or_insert(now + GONE_GRACE);
                    if now >= until {
                        return Err(Missed::Gone(reason.clone()));
                    }
                    until
                }
                None if now >= deadline => return Err(Missed::Timeout),
                None => deadline,
            };
            state = self.shared.changed.wait_timeout(state, until - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Drops every message and abort of communicator `comm` (after it failed).
    pub(crate) fn forget(&self, comm: u64) {
        let mut state = lock(&self.shared.state);
        state.mailbox.retain(|key, _| key.comm != comm);
        state.aborts.retain(|key, _| key.0 != comm);
    }

    /// Whether a rank of communicator `comm` aborted an operation (in any process).
    pub(crate) fn has_failed(&self, comm: u64) -> bool {
        lock(&self.shared.state).failed.contains(&comm)
    }

    fn mark_gone(&self, process: u32, reason: String) {
        mark_gone(&self.shared, process, reason);
    }
}

impl Drop for World {
    fn drop(&mut self) {
        self.shared.closing.store(true, Ordering::SeqCst);
        for (segment, ring) in lock(&self.shared.rings).iter() {
            segment.writer(*ring).close();
        }
        for (socket, closing) in lock(&self.shared.sockets).iter() {
            let how = match closing {
                Closing::Both => nix::sys::socket::Shutdown::Both,
                Closing::Write => nix::sys::socket::Shutdown::Write,
            };
            let _ = nix::sys::socket::shutdown(socket.as_raw_fd(), how);
        }
        self.shared.changed.notify_all();
        // Under the lock, so that a waiter that has just seen the world open is waiting.
        drop(lock(&self.shared.state));
        self.shared.closed.notify_all();
        // The last handle may go on one of the world's own threads (the control thread,
        // telling the runtime what it heard): that one ends on its own.
        let join = |thread: Option<std::thread::JoinHandle<()>>| {
            if let Some(thread) = thread.filter(|t| t.thread().id() != std::thread::current().id()) {
                let _ = thread.join();
            }
        };
        join(lock(&self.control_thread).take());
        join(lock(&self.shared.clock_thread).take());
        drop(lock(&self.server).take());
    }
}

/// This host as processes that can share memory see it: the kernel's boot id, the
/// network namespace and the pid namespace (processes in other namespaces count as
/// other hosts: a receiver finds a sender's outbox through its pid).
fn host_identity() -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let namespace = |kind: &str| {
        std::fs::read_link(format!("/proc/self/ns/{kind}")).map(|l| l.display().to_string()).unwrap_or_default()
    };
    format!("{} {} {}", boot.trim(), namespace("net"), namespace("pid"))
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn deliver(state: &mut State, key: Key, stamp: Stamp, body: Result<Arc<Message>, String>) {
    match body {
        Ok(data) => {
            state.mailbox.insert(key, Parcel { stamp, data });
        }
        Err(reason) => {
            state.aborts.entry((key.comm, key.unit, key.index)).or_insert(reason);
            state.failed.insert(key.comm);
        }
    }
}

fn mark_gone(shared: &Shared, process: u32, reason: String) {
    let mut state = lock(&shared.state);
    state.gone.entry(process).or_insert(reason);
    state.links.remove(&process);
    state.progress.remove(&process);
    shared.changed.notify_all();
}

/// Keeps a handle on a socket to shut it down when the world closes (a duplicate, so
/// that the number stays this socket's whatever happens to the original).
fn remember(shared: &Shared, socket: &impl std::os::fd::AsFd, closing: Closing) {
    if let Ok(handle) = socket.as_fd().try_clone_to_owned() {
        lock(&shared.sockets).push((handle, closing));
    }
}

/// The control thread: reaches the root, introduces this process, then handles what
/// the root says until the connection closes.
fn control(shared: Arc<Shared>, root: SocketAddr, label: String, timeout: Duration) {
    let give_up = Instant::now() + timeout;
    let mut logged: Option<Instant> = None;
    let stream = loop {
        if shared.closing.load(Ordering::SeqCst) {
            return;
        }
        let attempt =
            TcpStream::connect_timeout(&root, CONNECT_TIMEOUT).map_err(auth::Refused::Io).and_then(|mut s| {
                let deadline = Instant::now() + auth::HANDSHAKE_TIMEOUT;
                auth::handshake(&mut s, Side::Opener, (shared.trust.control_key(), b"control"), 0, deadline)?;
                shared.trust.admits(&s)?;
                Ok(s)
            });
        match attempt {
            Ok(stream) => break stream,
            // Whoever listens there is not this job's rank 0: waiting will not change it.
            Err(e @ (auth::Refused::BadProof | auth::Refused::NotOurs | auth::Refused::Stranger(_))) => {
                let why = match e {
                    auth::Refused::Stranger(why) => format!("cannot join rank 0 at {label}: {why}"),
                    e => format!(
                        "rank 0 at {label} is not of this job: {e}; every process of a job needs the same {} (or none, on one host)",
                        crate::config::ENV_JOB_SECRET
                    ),
                };
                let error = NrtError::new(NrtStatus::NetworkProxyFailure, why);
                tracing::error!("{}", error.message);
                lock(&shared.state).lost = Some(error);
                shared.changed.notify_all();
                return;
            }
            Err(e) if Instant::now() < give_up => {
                if logged.is_none_or(|at| at.elapsed() >= RETRY_LOG_INTERVAL) {
                    tracing::warn!("Connect to {label} failed - retrying ({e})");
                    logged = Some(Instant::now());
                }
                std::thread::sleep(RETRY_PAUSE);
            }
            Err(e) => {
                let error = NrtError::new(
                    NrtStatus::Timeout,
                    format!(
                        "Connect to {label} failed: {e}; gave up after {:.1} s (NEURON_RT_EXEC_TIMEOUT): is the process of rank 0 running, and is {} its address?",
                        timeout.as_secs_f64(),
                        crate::launch::ENV_ROOT_COMM_ID
                    ),
                );
                tracing::error!("{}", error.message);
                lock(&shared.state).lost = Some(error);
                shared.changed.notify_all();
                return;
            }
        }
    };
    // Said in the tools' words; a trusted network also as a warning.
    let admits = shared.trust.admission().describe();
    tracing::info!("joined the job through rank 0 at {label}; the job {admits}");
    if matches!(shared.trust, Trust::Network) {
        tracing::warn!("this job {admits}; {}=1", crate::config::ENV_TRUSTED_NETWORK);
    }
    let configured = stream
        .set_nodelay(true)
        .and_then(|()| stream.set_read_timeout(None))
        .and_then(|()| stream.set_write_timeout(Some(shared.timeout)));
    if let Err(e) = configured {
        return lose(&shared, format!("cannot set up the connection to rank 0: {e}"));
    }
    remember(&shared, &stream, Closing::Both);
    if shared.closing.load(Ordering::SeqCst) {
        return;
    }
    let started = stream
        .local_addr()
        .and_then(|local| TcpListener::bind(SocketAddr::new(local.ip(), 0)))
        .and_then(|listener| Ok((listener.local_addr()?, listener)));
    let (data, listener) = match started {
        Ok(started) => started,
        Err(e) => return lose(&shared, format!("cannot accept data links: {e}")),
    };
    remember(&shared, &listener, Closing::Both);
    {
        let shared = Arc::clone(&shared);
        let _ = std::thread::Builder::new().name("nrt-links".into()).spawn(move || accept_links(shared, listener));
    }
    let host = nix::unistd::gethostname().map_or_else(|_| "?".into(), |h| h.to_string_lossy().into_owned());
    let hello = Control::Hello(Peer { pid: std::process::id(), host, data, host_identity: shared.host.clone() });
    let Ok(writer) = stream.try_clone() else { return lose(&shared, "cannot write to the root".into()) };
    {
        // The control writer's lock is taken before the state's, as `World::join` takes
        // them: a join either lands in `pending` before it is sent here, or finds the
        // writer in place.
        let mut control = lock(&shared.control);
        let mut writer = BufWriter::new(writer);
        let pending = std::mem::take(&mut lock(&shared.state).pending);
        let mut sent = wire::write_header(&mut writer, &hello);
        for join in &pending {
            sent = sent.and_then(|()| wire::write_header(&mut writer, join));
        }
        if sent.and_then(|()| writer.flush()).is_err() {
            drop(control);
            return lose(&shared, format!("the connection to rank 0 at {label} closed during the bootstrap"));
        }
        *control = Some(writer);
    }
    {
        let prober = Arc::clone(&shared);
        let thread = std::thread::Builder::new().name("nrt-clock".into()).spawn(move || probe_clock(&prober));
        *lock(&shared.clock_thread) = thread.ok();
    }
    let mut reader = BufReader::new(stream);
    let reason = loop {
        match wire::read_header::<Control>(&mut reader) {
            Ok(Some(message)) => on_control(&shared, message),
            Ok(None) => break "RX, connection closed by remote peer".to_owned(),
            Err(e) => break format!("RX, connection failed: {e}"),
        }
    };
    *lock(&shared.control) = None;
    if !shared.closing.load(Ordering::SeqCst) {
        lose(&shared, format!("{reason}: the connection to rank 0's process at {label} closed"));
    }
}

fn lose(shared: &Shared, reason: String) {
    tracing::info!("{reason}");
    // No communicator can be bootstrapped any more; those already running go on, their
    // peers watched through their own links (rank 0's process may end first).
    lock(&shared.state).lost = Some(NrtError::new(NrtStatus::NetworkProxyFailure, reason));
    shared.changed.notify_all();
}

/// Measures this process's clock against the root's (a round of probes now, then one
/// every [`clock::PERIOD`]: see `clock.rs`), and tells the root what this process is
/// doing every [`HEARTBEAT`], until the world closes.
fn probe_clock(shared: &Shared) {
    let mut next_probe = Instant::now();
    loop {
        if Instant::now() >= next_probe {
            if !measure_clock(shared) {
                return;
            }
            next_probe = Instant::now() + clock::PERIOD;
        }
        // Dated by the root on arrival, on the job's one clock.
        let status = Control::Status(Heard::of(0, &(shared.hooks.doing)()));
        {
            let mut control = lock(&shared.control);
            let Some(writer) = control.as_mut() else { return };
            if wire::write_header(writer, &status).and_then(|()| writer.flush()).is_err() {
                return;
            }
        }
        let next = Instant::now() + HEARTBEAT;
        let mut state = lock(&shared.state);
        while !shared.closing.load(Ordering::SeqCst) {
            let now = Instant::now();
            if now >= next {
                break;
            }
            state = shared.closed.wait_timeout(state, next - now).map_or_else(|e| e.into_inner().0, |r| r.0);
        }
        if shared.closing.load(Ordering::SeqCst) {
            return;
        }
    }
}

/// Now on the root's clock, and the most that may be off by.
fn root_now(shared: &Shared) -> (u64, u64) {
    let now = neuron_datastore::clock::monotonic_ns();
    let offset = shared.offset_ns.load(Ordering::Relaxed);
    (now.saturating_add_signed(offset), shared.uncertainty_ns.load(Ordering::Relaxed))
}

/// One round of probes of the root's clock; `false` once the connection is closed.
fn measure_clock(shared: &Shared) -> bool {
    let mut probes = Vec::with_capacity(clock::PROBES);
    for _ in 0..clock::PROBES {
        let sent = neuron_datastore::clock::monotonic_ns();
        {
            let mut control = lock(&shared.control);
            let Some(writer) = control.as_mut() else { return false };
            let probe = Control::ClockProbe { sent };
            if wire::write_header(writer, &probe).and_then(|()| writer.flush()).is_err() {
                return false;
            }
        }
        let deadline = Instant::now() + clock::PROBE_TIMEOUT;
        let mut state = lock(&shared.state);
        loop {
            if shared.closing.load(Ordering::SeqCst) {
                return false;
            }
            if let Some(at) = state.clock_echoes.iter().position(|p| p.sent == sent) {
                probes.push(state.clock_echoes.swap_remove(at));
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            state = shared.changed.wait_timeout(state, deadline - now).map_or_else(|e| e.into_inner().0, |r| r.0);
        }
        state.clock_echoes.clear();
    }
    if let Some(offset) = clock::estimate(&probes) {
        lock(&shared.state).clock = Some(offset);
        shared.offset_ns.store(offset.offset_ns, Ordering::Relaxed);
        shared.uncertainty_ns.store(offset.uncertainty_ns.max(1), Ordering::Relaxed);
        (shared.hooks.on_clock)(offset);
    }
    true
}

fn on_control(shared: &Arc<Shared>, message: Control) {
    let mut state = lock(&shared.state);
    match message {
        Control::Welcome { process, session } => {
            state.process = Some(process);
            state.link_key = Some(shared.trust.link_key(&session));
        }
        Control::Roster { comm, rank_process, processes } => {
            let Some(me) = state.process else { return };
            for (index, peer) in processes.iter().enumerate() {
                if index >= state.peers.len() {
                    state.peers.resize(index + 1, None);
                }
                if peer.is_some() {
                    state.peers[index].clone_from(peer);
                }
            }
            let neighbour = processes.iter().enumerate().any(|(index, peer)| {
                index as u32 != me && peer.as_ref().is_some_and(|p| p.host_identity == shared.host)
            });
            if neighbour {
                shared.neighbours.store(true, Ordering::Relaxed);
            }
            let roster = Roster { rank_process: rank_process.clone(), peers: processes, process: me };
            state.rosters.insert(comm, Ok(Arc::new(roster)));
            // The process of lower index opens each pair's link.
            let mut to_open: Vec<(u32, SocketAddr, bool)> = rank_process
                .iter()
                .filter(|&&p| p > me && !state.links.contains_key(&p) && !state.gone.contains_key(&p))
                .filter_map(|&p| {
                    let peer = state.peers.get(p as usize)?.as_ref()?;
                    Some((p, peer.data, peer.host_identity == shared.host))
                })
                .collect();
            to_open.sort_unstable();
            to_open.dedup();
            drop(state);
            for (process, addr, same_host) in to_open {
                if let Err(e) = open_link(shared, me, process, addr, same_host) {
                    mark_gone(shared, process, format!("cannot open a data link to process {process} at {addr}: {e}"));
                }
            }
            shared.changed.notify_all();
            return;
        }
        Control::Refused { comm, reason } => {
            state.rosters.insert(comm, Err(reason));
        }
        Control::Mismatch { comms, text } => {
            if comms.iter().any(|comm| state.mismatches.get(comm).is_none_or(|(said, _)| *said != text)) {
                tracing::error!("{text}");
            }
            let now = Instant::now();
            for comm in comms {
                let entry = state.mismatches.entry(comm).or_insert_with(|| (text.clone(), now));
                entry.0.clone_from(&text);
            }
        }
        // A process with a link is watched through it: its close comes after the data
        // sent before it, where the root's notice may overtake that data.
        Control::Gone { process, reason } if !state.links.contains_key(&process) => {
            state.gone.entry(process).or_insert(reason);
        }
        Control::Gone { .. } => {}
        Control::Statuses(said) => {
            let me = state.process;
            let heard: Vec<(u32, Heard)> = said.into_iter().filter(|(process, _)| Some(*process) != me).collect();
            for (process, said) in &heard {
                state.heard.insert(*process, said.clone());
            }
            // Nobody waits on this: no wake-up, and the runtime is told without the lock.
            drop(state);
            for (process, said) in &heard {
                (shared.hooks.on_heard)(*process, said);
            }
            return;
        }
        Control::ClockEcho { sent, received, replied } => {
            let back = neuron_datastore::clock::monotonic_ns();
            state.clock_echoes.push(Probe { sent, received, replied, back });
        }
        Control::Hello(_) | Control::Join { .. } | Control::ClockProbe { .. } | Control::Status { .. } => {}
    }
    shared.changed.notify_all();
}
