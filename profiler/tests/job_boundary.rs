//! The job's network boundary against clients that are not of the job, at a real job's
//! rank 0 (an `nccom-test` process that holds rank 0, started alone so that its root
//! waits for rank 1 while the strangers knock): a roster request and a rank squat with
//! a predicted communicator id, a link hijack, 1,000 silent connections, 1,000
//! oversize announcements, and (with no job secret) another user of this host. Each is
//! refused without a byte of the job's, rank 0's threads and memory stay bounded, and
//! then the real rank 1 joins and the job's results check.

use std::io::Write;
use std::net::TcpStream;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use neuron_test_support::process::{Sandbox, free_port, memory};

const SECRET: &str = "the job's own secret, 32 bytes..";
const STRANGER: &str = include_str!("stranger.py");
/// Connections rank 0's listeners let prove themselves at once (`auth::MAX_HANDSHAKES`).
const MAX_HANDSHAKES: u64 = 32;

/// One rank of a two-rank `nccom-test` job at `port`, in `sandbox`, with `secret`.
fn rank(sandbox: &Sandbox, port: u16, rank: u32, secret: Option<&str>) -> Child {
    let mut program = Command::new(env!("CARGO_BIN_EXE_nccom-test"));
    sandbox
        .env(&mut program)
        .env("NEURON_VIRT_INSTANCE_TYPE", "trn1.32xlarge")
        .env("NEURON_RT_ROOT_COMM_ID", format!("127.0.0.1:{port}"))
        .env("NEURON_RT_EXEC_TIMEOUT", "60")
        .env("NEURON_RT_LOG_LEVEL", "error")
        .envs([("RANK", rank.to_string()), ("WORLD_SIZE", "2".to_owned())])
        .args(["allr", "-b", "1M", "-e", "1M", "-n", "5", "--check"])
        .env_remove("NEURON_VIRT_JOB_SECRET");
    if let Some(secret) = secret {
        program.env("NEURON_VIRT_JOB_SECRET", secret);
    }
    program.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("nccom-test starts")
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// The sockets of `pid` listening on 127.0.0.1, by port, once there are `count` (the
/// root's and the data links'), as the kernel lists them: no connection is made.
fn listening_ports(pid: u32, count: usize) -> Vec<u16> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|fds| {
                fds.flatten()
                    .filter_map(|fd| std::fs::read_link(fd.path()).ok())
                    .filter_map(|l| Some(l.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned()))
                    .collect()
            })
            .unwrap_or_default();
        let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
        let ports: Vec<u16> = table
            .lines()
            .skip(1)
            .filter_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                // Listening (0A), on 127.0.0.1, one of the process's sockets.
                let (local, state, inode) = (fields.get(1)?, fields.get(3)?, fields.get(9)?);
                let (address, port) = local.split_once(':')?;
                (*state == "0A" && address == "0100007F" && inodes.iter().any(|i| i == inode))
                    .then(|| u16::from_str_radix(port, 16).ok())?
            })
            .collect();
        if ports.len() >= count {
            return ports;
        }
        assert!(Instant::now() < deadline, "pid {pid} listens on {ports:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn threads(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix("Threads:")?.trim().parse().ok()).unwrap_or(0)
}

/// What a stranger got: the other side's handshake, whether its proof held for the key
/// the stranger used, and the bytes that came after (a member's welcome).
#[derive(Debug)]
struct Verdict {
    their_proof_valid: bool,
    after: u64,
    closed: bool,
}

/// `stranger.py` against 127.0.0.1:`port` with `key`, claiming `claim`, for `context`
/// (`control` or `link`), as `user` (uid and gid; this one's when `None`); after its proof it
/// joins rank 1 of the communicator of the predicted id unless `mode` is `listen`.
fn stranger(port: u16, key: &[u8], claim: u32, (context, mode): (&str, &str), user: Option<(u32, u32)>) -> Verdict {
    use std::os::unix::process::CommandExt;
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    let mut python = Command::new("python3");
    python.args(["-c", STRANGER, "127.0.0.1", &port.to_string(), &hex, &claim.to_string(), context, mode]);
    if let Some((uid, gid)) = user {
        python.uid(uid).gid(gid).current_dir("/");
    }
    let output = python.output().expect("python3 runs");
    let out = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{out}{}", String::from_utf8_lossy(&output.stderr));
    let field =
        |name: &str| out.split(&format!("\"{name}\": ")).nth(1).and_then(|r| r.split([',', '}']).next()).map(str::trim);
    Verdict {
        their_proof_valid: field("their_proof_valid") == Some("true"),
        after: field("after").and_then(|n| n.parse().ok()).unwrap_or(u64::MAX),
        closed: field("closed") == Some("true"),
    }
}

/// Lets this process hold `wanted` more connections.
fn raise_open_files(wanted: u64) {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("limits");
    let _ = setrlimit(Resource::RLIMIT_NOFILE, (soft + wanted).min(hard), hard);
}

/// Finishes the job: rank 1 joins, and both ranks' results check.
fn finish(sandbox: &Sandbox, port: u16, rank0: Child, secret: Option<&str>) -> String {
    let rank1 = rank(sandbox, port, 1, secret);
    let outputs: Vec<Output> = [rank0, rank1].into_iter().map(|c| c.wait_with_output().expect("ends")).collect();
    let log: String = outputs.iter().map(text).collect();
    assert!(outputs.iter().all(|o| o.status.success()), "the job failed: {log}");
    let table = String::from_utf8_lossy(&outputs[0].stdout);
    let rows: Vec<&str> =
        table.lines().filter(|l| !l.starts_with('#') && !l.trim_start().starts_with("size")).collect();
    assert!(!rows.is_empty() && rows.iter().all(|row| row.ends_with(" ok")), "every result checked: {log}");
    String::from_utf8_lossy(&outputs[0].stderr).into_owned()
}

#[test]
fn strangers_get_nothing_from_the_root_or_the_links_cost_bounded_threads_and_memory_and_the_job_runs_on() {
    let sandbox = Sandbox::new();
    let port = free_port();
    let rank0 = rank(&sandbox, port, 0, Some(SECRET));
    let pid = rank0.id();
    let ports = listening_ports(pid, 2);
    let data_port = *ports.iter().find(|&&p| p != port).expect("the data links' listener");
    let (threads_before, (rss_before, _)) = (threads(pid), memory(pid));

    // A roster request and a rank squat: the handshake with a guessed key (and the
    // public one of jobs without a secret), then a join of rank 1 of the communicator
    // id predicted from its name.
    for key in [&b"a guess"[..], b""] {
        let verdict = stranger(port, key, 0, ("control", "join"), None);
        assert!(!verdict.their_proof_valid && verdict.after == 0 && verdict.closed, "{verdict:?}");
    }
    // A link hijack: a stranger claims to be process 0 at the data links' listener.
    let verdict = stranger(data_port, b"", 0, ("link", "join"), None);
    assert!(!verdict.their_proof_valid && verdict.after == 0 && verdict.closed, "{verdict:?}");

    // 1,000 silent connections, then 1,000 announcing a 1 MiB frame after a bad proof.
    raise_open_files(2100);
    let connect = || TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(2)).ok();
    let silent: Vec<TcpStream> = (0..1000).filter_map(|_| connect()).collect();
    let threads_silent = threads(pid);
    let mut announcement = b"NVRANKS8".to_vec();
    announcement.extend_from_slice(&[7u8; 36 + 32]);
    announcement.extend_from_slice(&(1u32 << 20).to_le_bytes());
    announcement.extend_from_slice(&[0x55; 64 << 10]);
    let loud: Vec<TcpStream> = (0..1000)
        .filter_map(|_| {
            let mut stream = connect()?;
            let _ = stream.set_write_timeout(Some(Duration::from_millis(200)));
            let _ = stream.write_all(&announcement);
            Some(stream)
        })
        .collect();
    let (threads_flooded, (rss_flooded, _)) = (threads(pid), memory(pid));
    eprintln!(
        "rank 0: {threads_before} threads and {} MiB before; {threads_silent} threads with {} silent connections; \
         {threads_flooded} threads and {} MiB with {} oversize announcements more",
        rss_before >> 20,
        silent.len(),
        rss_flooded >> 20,
        loud.len()
    );
    assert!(silent.len() >= 900 && loud.len() >= 900, "{} and {} connections made", silent.len(), loud.len());
    assert!(threads_silent <= threads_before + MAX_HANDSHAKES + 2, "{threads_before} -> {threads_silent} threads");
    assert!(threads_flooded <= threads_before + MAX_HANDSHAKES + 2, "{threads_before} -> {threads_flooded} threads");
    assert!(rss_flooded < rss_before + (64 << 20), "{} -> {} MiB", rss_before >> 20, rss_flooded >> 20);
    drop((silent, loud));

    // The real rank 1 joins (the silent connections' places free within the handshake's
    // deadline), and the job's results check.
    let log = finish(&sandbox, port, rank0, Some(SECRET));
    // Each listener (the root's, the data links') logs its first refusal, and no more.
    assert_eq!(log.matches("refused a connection").count(), 2, "{log}");
    assert!(!log.contains(SECRET), "{log}");
}

#[test]
fn with_no_secret_another_user_of_this_host_is_refused_and_this_user_admitted() {
    if !nix::unistd::geteuid().is_root() {
        neuron_test_support::ci::missing("not root (a client as another user needs root)", "the other-user test");
        return;
    }
    let sandbox = Sandbox::new();
    let port = free_port();
    let rank0 = rank(&sandbox, port, 0, None);
    let ports = listening_ports(rank0.id(), 2);
    let data_port = *ports.iter().find(|&&p| p != port).expect("the data links' listener");
    let user = TemporaryUser::new();
    let other = Some((user.uid, user.gid));
    // The public key of the control connection proves nothing: the user is checked.
    let verdict = stranger(port, b"", 0, ("control", "join"), other);
    assert!(verdict.their_proof_valid && verdict.after == 0 && verdict.closed, "{verdict:?}");
    let verdict = stranger(data_port, b"", 0, ("link", "join"), other);
    assert!(!verdict.their_proof_valid && verdict.after == 0 && verdict.closed, "{verdict:?}");
    // The same client as this user is a process of the job: it is welcomed (and asks
    // for no rank, which the job's own rank 1 then takes).
    let verdict = stranger(port, b"", 0, ("control", "listen"), None);
    assert!(verdict.their_proof_valid && verdict.after > 0, "{verdict:?}");
    let log = finish(&sandbox, port, rank0, None);
    let refusal = format!("a process of another user (uid {}) is not of this job", user.uid);
    assert!(log.contains(&refusal), "{log}");
}

/// A system user made for one test and removed when it is dropped.
struct TemporaryUser {
    name: String,
    uid: u32,
    gid: u32,
}

impl TemporaryUser {
    fn new() -> TemporaryUser {
        let name = format!("nrt-stranger-{}", std::process::id());
        let made = Command::new("useradd")
            .args(["--system", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin", &name])
            .status()
            .expect("useradd runs (Debian's passwd package)");
        assert!(made.success(), "useradd {name}: {made}");
        // Made, it is removed even if what follows fails.
        let mut user = TemporaryUser { name, uid: 0, gid: 0 };
        let account = nix::unistd::User::from_name(&user.name).ok().flatten().expect("the new user is listed");
        assert!(!account.uid.is_root(), "{account:?}");
        (user.uid, user.gid) = (account.uid.as_raw(), account.gid.as_raw());
        user
    }
}

impl Drop for TemporaryUser {
    fn drop(&mut self) {
        let removed = Command::new("userdel").arg(&self.name).status();
        if !matches!(removed, Ok(status) if status.success()) {
            eprintln!("userdel {}: {removed:?}", self.name);
        }
    }
}
