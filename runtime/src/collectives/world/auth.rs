//! Who may join the job: every stream between the job's processes (a control
//! connection to the root, a data link between two processes) proves that both ends
//! belong to the job before either tells or gives the other anything.
//!
//! The proof is a challenge–response in both directions: each side sends the fixed
//! [`GREETING`], a fresh random nonce and a claim (its process index, or what the
//! stream's role puts there), then an HMAC-SHA256 over both nonces, both claims, its
//! own side and the stream's context, keyed by what the job's members share; each
//! checks the other's in constant time. No secret ever crosses the wire, a proof made
//! for one stream is worth nothing on another, and an opener's proof cannot be replayed
//! as an acceptor's.
//!
//! What the members share depends on the job ([`crate::config::JobAuth`]):
//! - a **job secret** (`NEURON_VIRT_JOB_SECRET`, or a private file named by
//!   `NEURON_VIRT_JOB_SECRET_FILE`) keys the control connections, and, with the session
//!   the root hands out to each member, the data links;
//! - with **no secret**, only processes of this user on this host may join: the kernel
//!   says which user holds the other end of a connection ([`peer_uid`]), and a
//!   connection from another host or user is refused; the data links are keyed by the
//!   random session the root hands out, to members only;
//! - on a **trusted network** (`NEURON_VIRT_TRUSTED_NETWORK=1`, no secret) nothing is
//!   checked but the protocol, as the user asked.
//!
//! Every read and write of the handshake has a deadline, and it reads only fixed-size
//! fields: a stranger's connection costs a bounded amount of time and memory.
//!
//! The streams are authenticated when they open, not encrypted or signed message by
//! message: an attacker able to inject into established TCP connections on the job's
//! network is out of scope (run such jobs on a private network).

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

use crate::config::{ENV_JOB_SECRET_FILE, JobAuth, JobSecret, MIN_JOB_SECRET_BYTES};
use crate::error::{NrtError, NrtResult};

/// First bytes of every stream, so that a stray client is told apart from a process
/// of the job (and two builds of different protocol versions refuse each other).
pub(crate) const GREETING: [u8; 8] = *b"NVRANKS8";

/// How long a stream may take to prove itself.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

const NONCE_BYTES: usize = 32;
/// The largest secret file read.
const MAX_SECRET_FILE_BYTES: u64 = 4096;
const PROOF_BYTES: usize = 32;

/// What the job's members share to prove themselves, in force for this process.
#[derive(Clone)]
pub(crate) enum Trust {
    /// A job secret every process was given.
    Secret(Vec<u8>),
    /// No secret: processes of this user on this host only.
    ThisUser,
    /// No secret, and the user said the network is trusted: anyone who speaks the
    /// protocol joins.
    Network,
}

impl std::fmt::Debug for Trust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Trust::Secret(_) => "Trust::Secret(..)",
            Trust::ThisUser => "Trust::ThisUser",
            Trust::Network => "Trust::Network",
        })
    }
}

impl Trust {
    /// What the configuration says, with a secret file read and checked.
    pub(crate) fn from_config(auth: &JobAuth) -> NrtResult<Trust> {
        match auth {
            JobAuth::ThisUser => Ok(Trust::ThisUser),
            JobAuth::TrustedNetwork => Ok(Trust::Network),
            JobAuth::Secret(JobSecret::Value(secret)) => Ok(Trust::Secret(secret.as_bytes().to_vec())),
            JobAuth::Secret(JobSecret::File(path)) => read_secret_file(path).map(Trust::Secret),
        }
    }

    /// The key of the control connections: the secret, or (without one) a public
    /// key, the kernel's word on the other end's user doing the work.
    pub(crate) fn control_key(&self) -> &[u8] {
        match self {
            Trust::Secret(secret) => secret,
            Trust::ThisUser | Trust::Network => b"",
        }
    }

    /// The key of the data links of the root's `session`: known to the processes the
    /// root welcomed, and, with a secret, to nobody without it.
    pub(crate) fn link_key(&self, session: &[u8; 32]) -> [u8; 32] {
        match self {
            Trust::Secret(secret) => derive(secret, "links", session),
            Trust::ThisUser | Trust::Network => derive(session, "links", session),
        }
    }

    /// Whether the other end of an authenticated control connection may join: with
    /// no secret, only a process of this user on this host.
    pub(crate) fn admits(&self, stream: &TcpStream) -> Result<(), Refused> {
        match self {
            Trust::ThisUser => check_same_user(stream),
            Trust::Secret(_) | Trust::Network => Ok(()),
        }
    }

    /// A communicator's id at the root, from its key: unpredictable without the job's
    /// secret (without one, only this user's processes reach the root anyway).
    pub(crate) fn communicator_id(&self, key: &str) -> u64 {
        let digest: [u8; 32] = match self {
            Trust::Secret(secret) => derive(secret, "communicator", key.as_bytes()),
            Trust::ThisUser | Trust::Network => Sha256::digest(key.as_bytes()).into(),
        };
        u64::from_le_bytes(digest[..8].try_into().unwrap_or_default())
    }

    /// How the job admits its processes, as the datastore records it for the tools.
    pub(crate) fn admission(&self) -> neuron_datastore::flight::JobAdmission {
        use neuron_datastore::flight::JobAdmission;
        match self {
            Trust::Secret(_) => JobAdmission::Secret,
            Trust::ThisUser => JobAdmission::ThisUser,
            Trust::Network => JobAdmission::TrustedNetwork,
        }
    }
}

/// The secret in `path`: a regular file of this user, readable by nobody else, of at
/// least [`MIN_JOB_SECRET_BYTES`] (a trailing newline left out).
fn read_secret_file(path: &Path) -> NrtResult<Vec<u8>> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let named = |why: String| NrtError::invalid(format!("{ENV_JOB_SECRET_FILE}={}: {why}", path.display()));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| named(format!("cannot open it: {e}")))?;
    let meta = file.metadata().map_err(|e| named(e.to_string()))?;
    if !meta.is_file() {
        return Err(named("not a regular file".into()));
    }
    if meta.uid() != nix::unistd::geteuid().as_raw() || meta.mode() & 0o077 != 0 {
        return Err(named(format!(
            "a job secret is private to its user: this file is uid {}'s with mode {:o}; chmod 600 it as its owner",
            meta.uid(),
            meta.mode() & 0o777
        )));
    }
    if meta.len() > MAX_SECRET_FILE_BYTES {
        return Err(named(format!("{} bytes is not a secret (at most {MAX_SECRET_FILE_BYTES})", meta.len())));
    }
    let mut secret = Vec::new();
    (&file).take(MAX_SECRET_FILE_BYTES).read_to_end(&mut secret).map_err(|e| named(e.to_string()))?;
    while secret.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        secret.pop();
    }
    if secret.len() < MIN_JOB_SECRET_BYTES {
        return Err(named(format!("{} bytes; a job secret is at least {MIN_JOB_SECRET_BYTES}", secret.len())));
    }
    Ok(secret)
}

/// Streams still proving themselves to one listener, at most [`MAX_HANDSHAKES`] at once
/// (a listener drops a connection beyond), and how many it refused.
#[derive(Debug)]
pub(crate) struct Admission {
    /// The listener, as its refusals are logged (`rank 0's bootstrap at 10.0.0.1:5000`).
    listener: String,
    proving: AtomicUsize,
    refused: AtomicU64,
}

/// Connections one listener lets prove themselves at once.
pub(crate) const MAX_HANDSHAKES: usize = 32;

/// A connection's place among those proving themselves, given back when dropped.
#[derive(Debug)]
pub(crate) struct Proving(Arc<Admission>);

impl Admission {
    pub(crate) fn new(listener: String) -> Arc<Admission> {
        Arc::new(Admission { listener, proving: AtomicUsize::new(0), refused: AtomicU64::new(0) })
    }

    /// A place for the connection from `peer` to prove itself, if there is one.
    pub(crate) fn enter(self: &Arc<Self>, peer: SocketAddr) -> Option<Proving> {
        let entered = self.proving.fetch_add(1, Ordering::SeqCst) < MAX_HANDSHAKES;
        let proving = Proving(Arc::clone(self));
        if entered {
            Some(proving)
        } else {
            drop(proving);
            self.refuse(peer, &Refused::Busy);
            None
        }
    }

    /// Connections refused so far.
    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Logs a refused connection: the first one at the error level, later ones at the
    /// debug level (a stranger may knock thousands of times).
    pub(crate) fn refuse(&self, peer: SocketAddr, why: &Refused) {
        let count = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
        let listener = &self.listener;
        if count == 1 {
            tracing::error!(
                "{listener} refused a connection from {peer}: {why} (later refusals are logged at the debug level)"
            );
        } else {
            tracing::debug!("{listener} refused connection {count}, from {peer}: {why}");
        }
    }
}

impl Drop for Proving {
    fn drop(&mut self) {
        self.0.proving.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Which end of a stream this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Opener,
    Acceptor,
}

impl Side {
    fn label(self) -> &'static [u8] {
        match self {
            Side::Opener => b"opener",
            Side::Acceptor => b"acceptor",
        }
    }

    fn other(self) -> Side {
        match self {
            Side::Opener => Side::Acceptor,
            Side::Acceptor => Side::Opener,
        }
    }
}

/// Why a stream was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refused {
    #[error("the other side does not speak this job's protocol")]
    NotOurs,
    #[error("the other side could not prove it belongs to the job (another job's or no secret)")]
    BadProof,
    #[error("the other side did not prove itself within {:.1} s", HANDSHAKE_TIMEOUT.as_secs_f64())]
    Slow,
    #[error("{0}")]
    Stranger(String),
    #[error("{MAX_HANDSHAKES} connections are already proving themselves")]
    Busy,
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// What both ends of a stream agreed on: the other's claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Proven {
    pub(crate) their_claim: u32,
}

/// Proves this side and checks the other's proof on `stream`, by `deadline`: `key`
/// keys the proofs, `context` is what the stream is for (bound into them), `claim`
/// what this side says it is.
pub(crate) fn handshake(
    stream: &mut TcpStream,
    side: Side,
    (key, context): (&[u8], &[u8]),
    claim: u32,
    deadline: Instant,
) -> Result<Proven, Refused> {
    let mut mine = [0u8; NONCE_BYTES];
    getrandom::fill(&mut mine).map_err(|e| io::Error::other(format!("no random numbers: {e}")))?;
    let mut hello = Vec::with_capacity(GREETING.len() + NONCE_BYTES + 4);
    hello.extend_from_slice(&GREETING);
    hello.extend_from_slice(&mine);
    hello.extend_from_slice(&claim.to_le_bytes());
    write_by(stream, &hello, deadline)?;
    let mut theirs = [0u8; GREETING.len() + NONCE_BYTES + 4];
    read_by(stream, &mut theirs, deadline)?;
    if theirs[..GREETING.len()] != GREETING {
        return Err(Refused::NotOurs);
    }
    let their_nonce = &theirs[GREETING.len()..GREETING.len() + NONCE_BYTES];
    let their_claim = u32::from_le_bytes(theirs[GREETING.len() + NONCE_BYTES..].try_into().unwrap_or_default());
    let mine_proof = proof(key, context, side, (claim, &mine), (their_claim, their_nonce));
    write_by(stream, &mine_proof, deadline)?;
    let mut their_proof = [0u8; PROOF_BYTES];
    read_by(stream, &mut their_proof, deadline)?;
    let mut expected = mac(key);
    feed(&mut expected, context, side.other(), (their_claim, their_nonce), (claim, &mine));
    expected.verify_slice(&their_proof).map_err(|_| Refused::BadProof)?;
    Ok(Proven { their_claim })
}

/// A key derived from `key` for `purpose` and `salt` (the data links' key from the job
/// secret and the session, a communicator's id from its name).
pub(crate) fn derive(key: &[u8], purpose: &str, salt: &[u8]) -> [u8; 32] {
    let mut mac = mac(key);
    mac.update(b"neuron-virt ");
    mac.update(purpose.as_bytes());
    mac.update(&[0]);
    mac.update(salt);
    mac.finalize().into_bytes().into()
}

/// Fresh random bytes (the root's session).
pub(crate) fn random_bytes<const N: usize>() -> io::Result<[u8; N]> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).map_err(|e| io::Error::other(format!("no random numbers: {e}")))?;
    Ok(bytes)
}

/// The user that holds the other end of `stream`, when that end is a socket of this
/// host (this network namespace) as the kernel lists them; `None` for another host.
pub(crate) fn peer_uid(stream: &TcpStream) -> io::Result<Option<u32>> {
    let (local, peer) = (stream.local_addr()?, stream.peer_addr()?);
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let listing = match std::fs::read_to_string(table) {
            Ok(listing) => listing,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        // The other end's socket is the one whose local address is our peer's and whose
        // remote address is ours.
        if let Some(uid) = listing.lines().skip(1).find_map(|line| owner_of(line, peer, local)) {
            return Ok(Some(uid));
        }
    }
    Ok(None)
}

/// Checks that the other end of `stream` is a process of this user on this host
/// (what [`Trust::ThisUser`] admits); says what it is otherwise.
pub(crate) fn check_same_user(stream: &TcpStream) -> Result<(), Refused> {
    let me = nix::unistd::geteuid().as_raw();
    match peer_uid(stream)? {
        Some(uid) if uid == me => Ok(()),
        Some(uid) => Err(Refused::Stranger(format!("a process of another user (uid {uid}) is not of this job"))),
        None => Err(Refused::Stranger(format!(
            "{} is on another host, and this job has no secret: set {} (the same in every process) or {}=1 where the network is trusted",
            stream.peer_addr().map_or_else(|_| "the other side".to_owned(), |a| a.to_string()),
            crate::config::ENV_JOB_SECRET,
            crate::config::ENV_TRUSTED_NETWORK
        ))),
    }
}

fn mac(key: &[u8]) -> Hmac<Sha256> {
    // HMAC takes keys of any length.
    <Hmac<Sha256> as KeyInit>::new_from_slice(key).unwrap_or_else(|_| unreachable!("HMAC takes any key length"))
}

fn proof(key: &[u8], context: &[u8], side: Side, sender: (u32, &[u8]), receiver: (u32, &[u8])) -> [u8; PROOF_BYTES] {
    let mut mac = mac(key);
    feed(&mut mac, context, side, sender, receiver);
    mac.finalize().into_bytes().into()
}

fn feed(mac: &mut Hmac<Sha256>, context: &[u8], side: Side, sender: (u32, &[u8]), receiver: (u32, &[u8])) {
    mac.update(&GREETING);
    mac.update(side.label());
    mac.update(&(context.len() as u64).to_le_bytes());
    mac.update(context);
    mac.update(&sender.0.to_le_bytes());
    mac.update(&receiver.0.to_le_bytes());
    mac.update(sender.1);
    mac.update(receiver.1);
}

/// Reads `buf` whole by `deadline` (each read waits at most what is left).
pub(crate) fn read_by(stream: &mut TcpStream, mut buf: &mut [u8], deadline: Instant) -> Result<(), Refused> {
    while !buf.is_empty() {
        stream.set_read_timeout(Some(left(deadline)?))?;
        match stream.read(buf) {
            Ok(0) => return Err(Refused::Io(io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => buf = &mut buf[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return Err(Refused::Slow);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn write_by(stream: &mut TcpStream, mut buf: &[u8], deadline: Instant) -> Result<(), Refused> {
    while !buf.is_empty() {
        stream.set_write_timeout(Some(left(deadline)?))?;
        match stream.write(buf) {
            Ok(0) => return Err(Refused::Io(io::ErrorKind::WriteZero.into())),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return Err(Refused::Slow);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn left(deadline: Instant) -> Result<Duration, Refused> {
    let left = deadline.saturating_duration_since(Instant::now());
    // A zero timeout means none to the socket.
    if left.is_zero() { Err(Refused::Slow) } else { Ok(left) }
}

/// The owner's uid in one line of `/proc/net/tcp{,6}`, when the line is the socket
/// whose local address is `local` and remote address `remote`.
fn owner_of(line: &str, local: SocketAddr, remote: SocketAddr) -> Option<u32> {
    let mut fields = line.split_whitespace();
    let _slot = fields.next()?;
    let line_local = parse_proc_address(fields.next()?)?;
    let line_remote = parse_proc_address(fields.next()?)?;
    if !same_address(line_local, local) || !same_address(line_remote, remote) {
        return None;
    }
    // state, queues, timer, retransmits, then the uid.
    fields.nth(4)?.parse().ok()
}

/// `0100007F:1F90` (IPv4) or 32 hex digits and a port (IPv6): each 32-bit word of the
/// address printed as the host's `u32`.
fn parse_proc_address(text: &str) -> Option<SocketAddr> {
    let (address, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        Some(u32::from_str_radix(address.get(i * 8..i * 8 + 8)?, 16).ok()?.to_ne_bytes())
    };
    let ip = match address.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut octets = [0u8; 16];
            for i in 0..4 {
                octets[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            IpAddr::V6(Ipv6Addr::from(octets))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// Equal addresses, an IPv4 address equal to its IPv6-mapped form.
fn same_address(a: SocketAddr, b: SocketAddr) -> bool {
    let canonical = |ip: IpAddr| match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    a.port() == b.port() && canonical(a.ip()) == canonical(b.ip())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let opener = TcpStream::connect(listener.local_addr().expect("bound")).expect("connects");
        let (acceptor, _) = listener.accept().expect("accepts");
        (opener, acceptor)
    }

    fn both(
        opener_key: &'static [u8],
        acceptor_key: &'static [u8],
    ) -> (Result<Proven, Refused>, Result<Proven, Refused>) {
        let (mut opener, mut acceptor) = pair();
        let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
        let accepting =
            std::thread::spawn(move || handshake(&mut acceptor, Side::Acceptor, (acceptor_key, b"link"), 9, deadline));
        let opened = handshake(&mut opener, Side::Opener, (opener_key, b"link"), 4, deadline);
        (opened, accepting.join().expect("no panic"))
    }

    #[test]
    fn both_sides_prove_themselves_with_the_same_key_and_learn_each_others_claim() {
        let (opened, accepted) = both(b"the job's secret", b"the job's secret");
        assert_eq!(opened.expect("proven").their_claim, 9);
        assert_eq!(accepted.expect("proven").their_claim, 4);
    }

    #[test]
    fn a_side_with_another_key_is_refused_by_both() {
        let (opened, accepted) = both(b"a guess", b"the job's secret");
        assert!(matches!(opened, Err(Refused::BadProof)), "{opened:?}");
        assert!(matches!(accepted, Err(Refused::BadProof)), "{accepted:?}");
    }

    #[test]
    fn a_proof_for_one_context_or_side_is_not_one_for_another() {
        let key = b"k";
        let (mine, theirs) = ((1, &[1u8; 32][..]), (2, &[2u8; 32][..]));
        let link = proof(key, b"link", Side::Opener, mine, theirs);
        assert_ne!(link, proof(key, b"control", Side::Opener, mine, theirs));
        assert_ne!(link, proof(key, b"link", Side::Acceptor, mine, theirs));
        assert_ne!(link, proof(key, b"link", Side::Opener, (3, mine.1), theirs));
    }

    #[test]
    fn a_silent_or_foreign_peer_is_refused_by_the_deadline() {
        let (mut silent, mut acceptor) = pair();
        let started = Instant::now();
        let refused = handshake(&mut acceptor, Side::Acceptor, (b"k", b""), 0, started + Duration::from_millis(200));
        assert!(matches!(refused, Err(Refused::Slow)), "{refused:?}");
        assert!(started.elapsed() < Duration::from_secs(2));
        // Garbage instead of the greeting.
        silent.write_all(&[b'x'; GREETING.len() + NONCE_BYTES + 4]).expect("written");
        let (mut foreign, mut acceptor) = pair();
        foreign.write_all(&[b'x'; GREETING.len() + NONCE_BYTES + 4]).expect("written");
        let refused = handshake(&mut acceptor, Side::Acceptor, (b"k", b""), 0, Instant::now() + HANDSHAKE_TIMEOUT);
        assert!(matches!(refused, Err(Refused::NotOurs)), "{refused:?}");
    }

    #[test]
    fn the_kernel_names_this_user_at_the_other_end_of_a_loopback_connection() {
        let (opener, acceptor) = pair();
        let me = nix::unistd::geteuid().as_raw();
        assert_eq!(peer_uid(&opener).expect("listed"), Some(me));
        assert_eq!(peer_uid(&acceptor).expect("listed"), Some(me));
        check_same_user(&acceptor).expect("this user");
    }

    #[test]
    fn proc_net_addresses_parse_in_both_families() {
        let v4 = parse_proc_address("0100007F:1F90").expect("parses");
        assert_eq!(v4, "127.0.0.1:8080".parse().expect("address"));
        let v6 = parse_proc_address("0000000000000000FFFF00000100007F:0050").expect("parses");
        assert!(same_address(v6, "127.0.0.1:80".parse().expect("address")));
        let line = "   3: 0100007F:1F90 0100007F:D2F0 01 00000000:00000000 00:00000000 00000000  1234        0 99 1";
        let (local, remote) = ("127.0.0.1:8080".parse().expect("a"), "127.0.0.1:54000".parse().expect("a"));
        assert_eq!(owner_of(line, local, remote), Some(1234));
        assert_eq!(owner_of(line, remote, local), None);
    }
}
