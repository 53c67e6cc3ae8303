//! `neuron-profile capture -r N`: a capture of a collectives program as a job of ranks,
//! as Neuron's capture runs one (`--collectives-workers-per-node`,
//! `--collectives-worker-count`, `--collectives-worker-start-id`,
//! `--collectives-profile-id`). This process starts one worker per rank of this host:
//! the same capture, launched as that rank (torchrun's variables, and rank 0's address),
//! each recording into `profile_rank_<rank>.ntff` beside the session file, or running
//! without recording when its rank is not the one profiled. Their output comes through
//! here, each line marked with its rank; when one fails, the others are stopped.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use neuron_datastore::config::ENV_INSTANCE_TYPE;
use neuron_datastore::topology::{DEFAULT_INSTANCE_TYPE, InstanceType};
use neuron_runtime::launch::ENV_ROOT_COMM_ID;

/// How a capture spreads over ranks.
#[derive(Debug, Clone, Args)]
pub(crate) struct WorkerArgs {
    /// Run the program as this many ranks on this host (one process and NeuronCore
    /// each), writing `profile_rank_<rank>.ntff` beside the session file.
    #[arg(short = 'r', long = "collectives-workers-per-node", value_name = "N")]
    pub(crate) workers_per_node: Option<u32>,
    /// Ranks of the whole job, over every host (default: this host's).
    #[arg(long = "collectives-worker-count", value_name = "N", requires = "workers_per_node")]
    worker_count: Option<u32>,
    /// The job's rank of this host's first worker (on a job of several hosts, each
    /// host's capture starts from its own).
    #[arg(
        long = "collectives-worker-start-id",
        value_name = "RANK",
        default_value_t = 0,
        requires = "workers_per_node"
    )]
    worker_start_id: u32,
    /// The rank whose profile is recorded, or `all`.
    #[arg(
        short = 'i',
        long = "collectives-profile-id",
        value_name = "RANK|all",
        default_value = "all",
        requires = "workers_per_node"
    )]
    profile_id: String,
}

/// How long the other workers have to end once one has failed.
const AFTER_A_FAILURE: Duration = Duration::from_secs(10);

/// A started worker.
struct Worker {
    rank: u32,
    child: Child,
}

impl Drop for Worker {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// Runs this capture as `args.workers_per_node` workers, each launched as its rank with
/// `arguments` (this command's, without the worker options); returns when all are done.
pub(crate) fn run(args: &WorkerArgs, arguments: &[String], session_dir: Option<&std::path::Path>) -> Result<()> {
    let per_node = args.workers_per_node.unwrap_or(1);
    let count = args.worker_count.unwrap_or(per_node);
    let start = args.worker_start_id;
    if per_node == 0 || start.checked_add(per_node).is_none_or(|end| end > count) {
        bail!(
            "--collectives-workers-per-node {per_node} from --collectives-worker-start-id {start} does not fit in \
             --collectives-worker-count {count}"
        );
    }
    let profiled = match args.profile_id.as_str() {
        "all" => None,
        id => Some(
            id.parse::<u32>()
                .ok()
                .filter(|r| *r < count)
                .with_context(|| format!("--collectives-profile-id {id}: give a rank below {count}, or all"))?,
        ),
    };
    let root = match std::env::var(ENV_ROOT_COMM_ID) {
        Ok(root) => root,
        Err(_) if count == per_node => {
            // Every rank here: rank 0's address on loopback, at a free port.
            let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
            format!("127.0.0.1:{port}")
        }
        Err(_) => bail!(
            "a job of {count} ranks over several hosts needs rank 0's address: set {ENV_ROOT_COMM_ID}=<host>:<port> \
             for the capture on every host"
        ),
    };
    let instance = instance_for(per_node)?;
    let exe = std::env::current_exe().context("cannot find this program to start its workers")?;
    eprintln!(
        "neuron-profile: running ranks {start}–{} of {count} here, rank 0 at {root}; profiling {}",
        start + per_node - 1,
        profiled.map_or_else(|| "every rank".to_string(), |r| format!("rank {r}"))
    );
    let mut workers = Vec::with_capacity(per_node as usize);
    let (lines, output) = std::sync::mpsc::channel::<String>();
    for local in 0..per_node {
        let rank = start + local;
        let mut command = Command::new(&exe);
        command
            .args(arguments)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", count.to_string())
            .env("LOCAL_RANK", local.to_string())
            .env("LOCAL_WORLD_SIZE", per_node.to_string())
            .env(ENV_ROOT_COMM_ID, &root)
            .envs(instance.map(|t| (ENV_INSTANCE_TYPE, t.name())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if profiled.is_some_and(|r| r != rank) {
            command.arg("--disable-profile");
        }
        let mut child = command.spawn().with_context(|| format!("cannot start the worker of rank {rank}"))?;
        for stream in [
            child.stdout.take().map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
            child.stderr.take().map(|s| Box::new(s) as _),
        ]
        .into_iter()
        .flatten()
        {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if lines.send(format!("[rank {rank}] {line}")).is_err() {
                        break;
                    }
                }
            });
        }
        workers.push(Worker { rank, child });
    }
    drop(lines);
    // Until every worker has ended. Once one has failed, the others get a while to end
    // on their own (their collectives fail as soon as they miss it, and they write their
    // profiles with the failure in them); those still running then are stopped.
    let mut failed: Option<(u32, std::process::ExitStatus, std::time::Instant)> = None;
    let mut done = vec![false; workers.len()];
    while done.iter().any(|d| !d) && failed.is_none_or(|(_, _, at)| at.elapsed() < AFTER_A_FAILURE) {
        match output.recv_timeout(Duration::from_millis(50)) {
            Ok(line) => eprintln!("{line}"),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            // Every output closed: the workers are ending.
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => std::thread::sleep(Duration::from_millis(50)),
        }
        for (worker, done) in workers.iter_mut().zip(done.iter_mut()).filter(|(_, done)| !**done) {
            if let Some(status) = worker.child.try_wait()? {
                *done = true;
                if !status.success() && failed.is_none() {
                    failed = Some((worker.rank, status, std::time::Instant::now()));
                    eprintln!(
                        "neuron-profile: the worker of rank {} failed ({status}); the others have {} s to end and \
                         write their profiles",
                        worker.rank,
                        AFTER_A_FAILURE.as_secs()
                    );
                }
            }
        }
    }
    let stopped: Vec<String> =
        workers.iter().zip(&done).filter(|(_, done)| !**done).map(|(w, _)| w.rank.to_string()).collect();
    drop(workers);
    while let Ok(line) = output.recv_timeout(Duration::from_millis(100)) {
        eprintln!("{line}");
    }
    if let Some((rank, status, _)) = failed {
        let stopped = match stopped.as_slice() {
            [] => "the others ended on their own".to_string(),
            ranks => {
                format!("rank {} did not end within {} s and was stopped", ranks.join(", "), AFTER_A_FAILURE.as_secs())
            }
        };
        let read = session_dir
            .map_or_else(String::new, |dir| format!("; what was recorded: neuron-profile view -d {}", dir.display()));
        bail!("the worker of rank {rank} failed ({status}); {stopped}{read}");
    }
    if let Some(dir) = session_dir {
        eprintln!("read the ranks together with: neuron-profile view -d {}", dir.display());
    }
    Ok(())
}

/// The virtual instance the workers run on when the configured one has too few
/// NeuronCores for one each: none configured, the smallest of the default's device type
/// with enough (said once); one configured, an error.
fn instance_for(workers: u32) -> Result<Option<InstanceType>> {
    let cores = |t: InstanceType| t.topology().core_count();
    if let Ok(name) = std::env::var(ENV_INSTANCE_TYPE) {
        let configured: InstanceType = name.parse()?;
        if cores(configured) < workers {
            bail!("{ENV_INSTANCE_TYPE}={name} has {} NeuronCores; {workers} workers need one each", cores(configured));
        }
        return Ok(None);
    }
    if cores(DEFAULT_INSTANCE_TYPE) >= workers {
        return Ok(None);
    }
    let device = DEFAULT_INSTANCE_TYPE.topology().device_type;
    let larger = DEFAULT_INSTANCE_TYPE
        .smallest_with(workers)
        .with_context(|| format!("no virtual {device} instance has {workers} NeuronCores"))?;
    eprintln!(
        "neuron-profile: {} has {} NeuronCores; the {workers} workers run on {} ({} NeuronCores); {ENV_INSTANCE_TYPE} chooses another",
        DEFAULT_INSTANCE_TYPE.name(),
        cores(DEFAULT_INSTANCE_TYPE),
        larger.name(),
        cores(larger)
    );
    Ok(Some(larger))
}

/// This command's arguments without the worker options (and their values), for the
/// workers.
pub(crate) fn worker_arguments(arguments: impl Iterator<Item = String>) -> Vec<String> {
    const WITH_VALUE: [&str; 6] = [
        "-r",
        "--collectives-workers-per-node",
        "--collectives-worker-count",
        "--collectives-worker-start-id",
        "-i",
        "--collectives-profile-id",
    ];
    let mut kept = Vec::new();
    let mut arguments = arguments.peekable();
    while let Some(argument) = arguments.next() {
        if argument == "--" {
            kept.push(argument);
            kept.extend(arguments.by_ref());
            break;
        }
        if WITH_VALUE.contains(&argument.as_str()) {
            arguments.next();
            continue;
        }
        let joined = WITH_VALUE.iter().any(|flag| {
            if flag.starts_with("--") {
                argument.starts_with(&format!("{flag}="))
            } else {
                argument.starts_with(flag) && argument.len() > 2 && !argument.starts_with("--")
            }
        });
        if !joined {
            kept.push(argument);
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workers_get_the_capture_without_the_worker_options() {
        let given = "capture -n m.hlo -r 4 --collectives-worker-count=8 --collectives-worker-start-id 4 -i2 \
                     -s out/p.ntff --num-exec 5 x in.npy";
        let kept = worker_arguments(given.split_whitespace().map(str::to_owned));
        assert_eq!(kept.join(" "), "capture -n m.hlo -s out/p.ntff --num-exec 5 x in.npy");
    }
}
