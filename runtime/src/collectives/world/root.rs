//! The root: rank 0's process listens at `NEURON_RT_ROOT_COMM_ID` and introduces the
//! job's processes to each other.
//!
//! Every process (the root's own included) connects and proves that it belongs to the
//! job (`auth.rs`: nothing is told or given before; at most
//! [`auth::MAX_HANDSHAKES`] connections prove themselves at once, each within
//! [`auth::HANDSHAKE_TIMEOUT`]), is welcomed with its index and the job's session (the
//! key of its data links), says who it is and where it accepts data links, and joins
//! ranks of communicators. Once every rank of a
//! communicator has joined, the root sends each of its processes the roster (which
//! process holds which rank, and how to reach it). When a process's connection closes,
//! the root tells every other process, so that none waits for a dead peer. It answers
//! each process's probes of the clocks at once, with its own (see `clock.rs`). Every
//! [`HEARTBEAT`](super::HEARTBEAT) it sends every process what each process said it was
//! doing last (so a rank waiting for another can say what that one is doing, on any
//! host, and how long ago it said so). A join that
//! contradicts an earlier one (another rank count, a rank taken by another process) is
//! refused to the process that sent it. Programs' communicators of one rank count that
//! are all incomplete and share no rank mean that the processes loaded different
//! NEFFs where they were to load one: the root says so to every process of them at once
//! ([`Control::Mismatch`]).

use std::collections::HashMap;
use std::io::{self, BufReader, BufWriter, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::auth::{self, Admission, Side, Trust};
use super::wire::{self, Control, Peer};
use neuron_datastore::flight::Heard;

/// The root's listener; dropping it stops accepting and closes every connection.
#[derive(Debug)]
pub(crate) struct Server {
    listener: TcpListener,
    state: Arc<Mutex<State>>,
    accepting: Option<JoinHandle<()>>,
    /// The connections proving themselves, and how many were refused.
    admission: Arc<Admission>,
    /// Passes on what the processes say; dropping the sender stops it.
    relaying: Option<(crossbeam_channel::Sender<()>, JoinHandle<()>)>,
}

/// How long a write to one process may wait for room (the root's other work waits too).
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Default)]
struct State {
    processes: Vec<Process>,
    comms: HashMap<u64, Comm>,
    closing: bool,
}

#[derive(Debug)]
struct Process {
    peer: Option<Peer>,
    /// What it said it was doing last, dated when it arrived here.
    said: Option<Heard>,
    writer: Option<BufWriter<TcpStream>>,
    stream: TcpStream,
}

#[derive(Debug)]
struct Comm {
    name: String,
    count: u32,
    /// A program's: its NEFF's hash (see [`Control::Join`]).
    program: Option<String>,
    /// Each rank's process, once joined.
    ranks: Vec<Option<u32>>,
}

impl Server {
    /// Listens at `addr` (an address of this host), admitting the processes `trust`
    /// admits.
    pub(crate) fn start(addr: SocketAddr, trust: Trust) -> io::Result<Server> {
        let listener = TcpListener::bind(addr)?;
        // The job's session, handed to each process the root admits: the data links' key
        // is derived from it.
        let session = auth::random_bytes()?;
        let state = Arc::new(Mutex::new(State::default()));
        let admission = Admission::new(format!("rank 0's bootstrap at {addr}"));
        let mut server = Server {
            listener: listener.try_clone()?,
            state,
            accepting: None,
            admission: Arc::clone(&admission),
            relaying: None,
        };
        // Each thread is in the server as soon as it runs: a failure to start the next
        // stops it (the server's drop).
        let state = Arc::clone(&server.state);
        server.accepting = Some(
            std::thread::Builder::new()
                .name("nrt-root".into())
                .spawn(move || accept(listener, state, (Arc::new(trust), session), admission))?,
        );
        let (stop, stopped) = crossbeam_channel::bounded::<()>(0);
        let state = Arc::clone(&server.state);
        let thread =
            std::thread::Builder::new().name("nrt-root-status".into()).spawn(move || relay(&state, &stopped))?;
        server.relaying = Some((stop, thread));
        Ok(server)
    }

    /// Connections refused so far.
    pub(crate) fn refused(&self) -> u64 {
        self.admission.refused()
    }
}

/// Every [`HEARTBEAT`](super::HEARTBEAT), sends every process what each process said
/// last, until `stopped` disconnects.
fn relay(state: &Mutex<State>, stopped: &crossbeam_channel::Receiver<()>) {
    while let Err(crossbeam_channel::RecvTimeoutError::Timeout) = stopped.recv_timeout(super::HEARTBEAT) {
        let mut state = lock(state);
        let said: Vec<(u32, Heard)> = (state.processes.iter().enumerate())
            .filter_map(|(process, p)| Some((process as u32, p.said.clone()?)))
            .collect();
        if said.is_empty() {
            continue;
        }
        // One frame, written to every process.
        let Ok(frame) = wire::frame(&Control::Statuses(said)) else { continue };
        for process in &mut state.processes {
            if let Some(writer) = process.writer.as_mut()
                && (writer.write_all(&frame).is_err() || writer.flush().is_err())
            {
                process.writer = None;
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let mut state = lock(&self.state);
        state.closing = true;
        for process in &state.processes {
            let _ = process.stream.shutdown(Shutdown::Both);
        }
        drop(state);
        if let Some((stop, thread)) = self.relaying.take() {
            drop(stop);
            let _ = thread.join();
        }
        // Wakes the blocked accept: shutdown of a listening socket makes it return.
        let _ = nix::sys::socket::shutdown(self.listener.as_raw_fd(), nix::sys::socket::Shutdown::Both);
        if let Some(accepting) = self.accepting.take() {
            let _ = accepting.join();
        }
    }
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

/// Accepts connections, each proving itself on a thread of its own (`trust` says who
/// may join, `session` is handed to those who do), until the server closes.
fn accept(
    listener: TcpListener,
    state: Arc<Mutex<State>>,
    (trust, session): (Arc<Trust>, [u8; 32]),
    admission: Arc<Admission>,
) {
    for stream in listener.incoming() {
        if lock(&state).closing {
            return;
        }
        let Ok(stream) = stream else { continue };
        let Ok(peer) = stream.peer_addr() else { continue };
        // A connection beyond those proving themselves is closed at once.
        let Some(proving) = admission.enter(peer) else { continue };
        let (state, trust, admission) = (Arc::clone(&state), Arc::clone(&trust), Arc::clone(&admission));
        let _ = std::thread::Builder::new().name("nrt-root-conn".into()).spawn(move || {
            let mut stream = stream;
            let deadline = Instant::now() + auth::HANDSHAKE_TIMEOUT;
            let proven = auth::handshake(&mut stream, Side::Acceptor, (trust.control_key(), b"control"), 0, deadline)
                .and_then(|_| trust.admits(&stream));
            drop(proving);
            match proven {
                Ok(()) => serve(stream, &state, session),
                Err(why) => admission.refuse(peer, &why),
            }
        });
    }
}

/// One member's connection: registers it, then handles its joins until it closes.
fn serve(stream: TcpStream, state: &Arc<Mutex<State>>, session: [u8; 32]) {
    let configured = stream
        .set_nodelay(true)
        .and_then(|()| stream.set_read_timeout(None))
        .and_then(|()| stream.set_write_timeout(Some(WRITE_TIMEOUT)));
    let (Ok(()), Ok(writer), Ok(whole)) = (configured, stream.try_clone(), stream.try_clone()) else { return };
    let index = {
        let mut state = lock(state);
        if state.closing {
            return;
        }
        let writer = Some(BufWriter::new(writer));
        state.processes.push(Process { peer: None, said: None, writer, stream: whole });
        let index = state.processes.len() as u32 - 1;
        send(&mut state, index, &Control::Welcome { process: index, session });
        index
    };
    let mut reader = BufReader::new(stream);
    let reason = loop {
        match wire::read_header::<Control>(&mut reader) {
            Ok(Some(message)) => handle(state, index, message),
            Ok(None) => break "RX, connection closed by remote peer".to_owned(),
            Err(e) => break format!("RX, connection failed: {e}"),
        }
    };
    let mut state = lock(state);
    let process = &mut state.processes[index as usize];
    process.writer = None;
    let who = process.peer.as_ref().map_or_else(|| format!("process {index}"), ToString::to_string);
    let gone = Control::Gone { process: index, reason: format!("{reason} ({who})") };
    for other in 0..state.processes.len() as u32 {
        if other != index {
            send(&mut state, other, &gone);
        }
    }
}

fn handle(state: &Mutex<State>, index: u32, message: Control) {
    let received = neuron_datastore::clock::monotonic_ns();
    let mut state = lock(state);
    match message {
        Control::ClockProbe { sent } => {
            let replied = neuron_datastore::clock::monotonic_ns();
            send(&mut state, index, &Control::ClockEcho { sent, received, replied });
        }
        Control::Hello(peer) => state.processes[index as usize].peer = Some(peer),
        Control::Join { comm, name, count, rank, program } => {
            join(&mut state, index, comm, (name, program), count, rank);
        }
        Control::Status(heard) => state.processes[index as usize].said = Some(Heard { at_ns: received, ..heard }),
        // Only the root sends the others.
        _ => {}
    }
}

fn join(state: &mut State, index: u32, comm: u64, (name, program): (String, Option<String>), count: u32, rank: u32) {
    let entry =
        state.comms.entry(comm).or_insert_with(|| Comm { name, count, program, ranks: vec![None; count as usize] });
    let refused = if entry.count != count {
        Some(format!(
            "communicator `{}` has {} ranks, but this process joined it as rank {rank} of {count}",
            entry.name, entry.count
        ))
    } else {
        match entry.ranks.get(rank as usize) {
            None => Some(format!("rank {rank} is not one of the {count} ranks of `{}`", entry.name)),
            Some(Some(holder)) if *holder != index => {
                Some(format!("rank {rank} of `{}` was already joined by process {holder}", entry.name))
            }
            Some(_) => None,
        }
    };
    if let Some(reason) = refused {
        send(state, index, &Control::Refused { comm, reason });
        return;
    }
    entry.ranks[rank as usize] = Some(index);
    if entry.ranks.iter().any(Option::is_none) {
        if let Some((comms, text)) = different_programs(state, comm) {
            let mut told: Vec<u32> =
                comms.iter().flat_map(|c| state.comms[c].ranks.iter().flatten().copied()).collect();
            told.sort_unstable();
            told.dedup();
            let mismatch = Control::Mismatch { comms, text };
            for process in told {
                send(state, process, &mismatch);
            }
        }
        return;
    }
    let rank_process: Vec<u32> = entry.ranks.iter().flatten().copied().collect();
    let processes = state.processes.iter().map(|p| p.peer.clone()).collect();
    let roster = Control::Roster { comm, rank_process: rank_process.clone(), processes };
    let mut members = rank_process;
    members.sort_unstable();
    members.dedup();
    for member in members {
        send(state, member, &roster);
    }
}

/// When program communicator `comm` is one of several of the same rank count, all
/// incomplete, no two sharing a joined rank: their ids and what to tell their processes
/// (`rank 0 (pid 812 on host a) loaded `allreduce`; ranks 1, 2, 3 (…) loaded `ar64``).
fn different_programs(state: &State, comm: u64) -> Option<(Vec<u64>, String)> {
    let this = state.comms.get(&comm).filter(|c| c.program.is_some())?;
    let joined = |c: &Comm| -> Vec<(u32, u32)> {
        c.ranks.iter().enumerate().filter_map(|(rank, p)| Some((rank as u32, (*p)?))).collect()
    };
    let mut programs: Vec<(u64, &Comm)> = (state.comms.iter())
        .filter(|(_, c)| c.program.is_some() && c.count == this.count && c.ranks.iter().any(Option::is_none))
        .map(|(&id, c)| (id, c))
        .collect();
    let mut ranks: Vec<u32> = programs.iter().flat_map(|(_, c)| joined(c)).map(|(rank, _)| rank).collect();
    let joined_ranks = ranks.len();
    ranks.sort_unstable();
    ranks.dedup();
    if programs.len() < 2 || ranks.len() != joined_ranks {
        return None;
    }
    programs.sort_by_key(|(_, c)| c.ranks.iter().position(Option::is_some));
    let who = |process: u32| {
        state
            .processes
            .get(process as usize)
            .and_then(|p| p.peer.as_ref())
            .map_or_else(|| format!("process {process}"), ToString::to_string)
    };
    let parts: Vec<String> = programs
        .iter()
        .map(|(_, c)| {
            let joined = joined(c);
            let ranks: Vec<String> = joined.iter().map(|(rank, _)| rank.to_string()).collect();
            let mut processes: Vec<u32> = joined.iter().map(|&(_, p)| p).collect();
            processes.dedup();
            let plural = if joined.len() == 1 { "rank" } else { "ranks" };
            let by: Vec<String> = processes.into_iter().map(who).collect();
            let hash = c.program.as_deref().unwrap_or_default();
            format!("{plural} {} ({}) loaded `{}` (NEFF {hash})", ranks.join(", "), by.join(", "), c.name)
        })
        .collect();
    let text = format!(
        "the job's processes loaded different programs of {} ranks, so none can complete: {}",
        this.count,
        parts.join("; ")
    );
    Some((programs.into_iter().map(|(id, _)| id).collect(), text))
}

/// Sends to one process; a process whose connection failed is left to its reader.
fn send(state: &mut State, index: u32, message: &Control) {
    if let Some(writer) = state.processes[index as usize].writer.as_mut()
        && (wire::write_header(writer, message).is_err() || writer.flush().is_err())
    {
        state.processes[index as usize].writer = None;
    }
}
