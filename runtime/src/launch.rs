//! Where this process stands in a job of many processes, from the variables its
//! launcher set, and where the job's rank 0 waits for the others.
//!
//! Neuron jobs are launched by torchrun, by Neuron's PJRT plugin settings (JAX and
//! torch-xla), by Open MPI's `mpirun` or by Slurm's `srun`, one process per NeuronCore
//! or per device; each launcher says in its own variables which process this is and how
//! many there are ([`Launcher`]). They are read here in that order: the first launcher
//! whose index variable is set is the one that started this process (an index without
//! its count is taken for a stray variable: the process runs on its own, with a
//! warning). Inconsistent values are refused, naming the variables. Rank 0's address
//! for the bootstrap is `NEURON_RT_ROOT_COMM_ID` (`<ipv4>:<port>` or
//! `[<ipv6>]:<port>`), or, as torch-xla sets it under torchrun, `MASTER_ADDR` with port
//! [`DEFAULT_ROOT_PORT`].
//!
//! Like the rest of the configuration this reads variables only through the lookup
//! [`crate::config::Config::from_lookup`] hands it.

use std::net::SocketAddr;

use crate::error::{NrtError, NrtResult};

/// Rank 0's address for the bootstrap of communicators across processes.
pub const ENV_ROOT_COMM_ID: &str = "NEURON_RT_ROOT_COMM_ID";
/// torchrun's host of rank 0, taken when `NEURON_RT_ROOT_COMM_ID` is unset.
pub const ENV_MASTER_ADDR: &str = "MASTER_ADDR";
/// The port torch-xla puts beside `MASTER_ADDR`.
pub const DEFAULT_ROOT_PORT: u16 = 62182;
/// Cores per process, comma-separated, one number per process (JAX on Neuron).
pub const ENV_PJRT_PROCESSES_NUM_DEVICES: &str = "NEURON_PJRT_PROCESSES_NUM_DEVICES";

/// A launcher, by the variables it sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// `NEURON_PJRT_PROCESS_INDEX` with `NEURON_PJRT_WORLD_SIZE` or
    /// `NEURON_PJRT_PROCESSES_NUM_DEVICES`; `PJRT_LOCAL_PROCESS_RANK` and
    /// `PJRT_LOCAL_PROCESS_COUNT`.
    NeuronPjrt,
    /// `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`.
    Torchrun,
    /// `OMPI_COMM_WORLD_RANK`, `_SIZE`, `_LOCAL_RANK`, `_LOCAL_SIZE`.
    OpenMpi,
    /// `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`.
    Slurm,
}

/// The variables a launcher sets: the process's index and the process count, then the
/// index and count among the processes of this host (`None`: it sets no such variable).
struct Variables {
    index: &'static str,
    count: &'static str,
    local_index: &'static str,
    local_count: Option<&'static str>,
}

impl Launcher {
    /// In the order they are looked for.
    pub const ALL: [Launcher; 4] = [Launcher::NeuronPjrt, Launcher::Torchrun, Launcher::OpenMpi, Launcher::Slurm];

    /// `Neuron PJRT`, `torchrun`, `Open MPI` or `Slurm`.
    pub fn name(self) -> &'static str {
        match self {
            Launcher::NeuronPjrt => "Neuron PJRT",
            Launcher::Torchrun => "torchrun",
            Launcher::OpenMpi => "Open MPI",
            Launcher::Slurm => "Slurm",
        }
    }

    fn variables(self) -> Variables {
        match self {
            Launcher::NeuronPjrt => Variables {
                index: "NEURON_PJRT_PROCESS_INDEX",
                count: "NEURON_PJRT_WORLD_SIZE",
                local_index: "PJRT_LOCAL_PROCESS_RANK",
                local_count: Some("PJRT_LOCAL_PROCESS_COUNT"),
            },
            Launcher::Torchrun => Variables {
                index: "RANK",
                count: "WORLD_SIZE",
                local_index: "LOCAL_RANK",
                local_count: Some("LOCAL_WORLD_SIZE"),
            },
            Launcher::OpenMpi => Variables {
                index: "OMPI_COMM_WORLD_RANK",
                count: "OMPI_COMM_WORLD_SIZE",
                local_index: "OMPI_COMM_WORLD_LOCAL_RANK",
                local_count: Some("OMPI_COMM_WORLD_LOCAL_SIZE"),
            },
            // SLURM_NTASKS_PER_NODE may read `2(x3)`: the local count is left out.
            Launcher::Slurm => Variables {
                index: "SLURM_PROCID",
                count: "SLURM_NTASKS",
                local_index: "SLURM_LOCALID",
                local_count: None,
            },
        }
    }
}

/// This process's place in a job of several processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// Whose variables said so.
    pub launcher: Launcher,
    /// The process's index among the job's processes, from 0.
    pub process: u32,
    /// How many processes the job has.
    pub processes: u32,
    /// Its index among the job's processes on this host, when the launcher says.
    pub local_process: Option<u32>,
    /// How many of the job's processes run on this host, when the launcher says.
    pub local_processes: Option<u32>,
    /// NeuronCores per process (`NEURON_PJRT_PROCESSES_NUM_DEVICES`), one per process.
    pub cores_per_process: Option<Vec<u32>>,
}

impl Launch {
    /// The global ranks of this process's `cores` NeuronCores, one rank per core in
    /// process order, and the job's rank count: from the cores per process the launcher
    /// listed, else taking every process to hold as many cores as this one.
    pub fn ranks(&self, cores: u32) -> NrtResult<(std::ops::Range<u32>, u32)> {
        match &self.cores_per_process {
            Some(listed) => {
                let mine = listed.get(self.process as usize).copied().unwrap_or_default();
                if mine != cores {
                    return Err(NrtError::invalid(format!(
                        "{ENV_PJRT_PROCESSES_NUM_DEVICES} gives process {} {mine} NeuronCores, but it holds {cores}",
                        self.process
                    )));
                }
                let first: u32 = listed[..self.process as usize].iter().sum();
                Ok((first..first + cores, listed.iter().sum()))
            }
            None => Ok((self.process * cores..(self.process + 1) * cores, self.processes * cores)),
        }
    }
}

/// Where rank 0 of a job waits for the others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootComm {
    /// An IP address, or (from `MASTER_ADDR`) a host name to resolve.
    pub host: String,
    pub port: u16,
    /// The variable it came from.
    pub from: &'static str,
}

impl std::fmt::Display for RootComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// The launch this process belongs to (`None`: no launcher variable is set, a process on
/// its own), from `get`, which gives a variable's value when it is set and not blank.
pub(crate) fn launch_from(
    get: &dyn Fn(&str) -> Option<String>,
    warnings: &mut Vec<String>,
) -> NrtResult<Option<Launch>> {
    let Some((launcher, index_text)) =
        Launcher::ALL.into_iter().find_map(|launcher| Some((launcher, get(launcher.variables().index)?)))
    else {
        return Ok(None);
    };
    let names = launcher.variables();
    let number = |name: &str, text: &str| {
        text.trim().parse::<u32>().map_err(|_| {
            NrtError::invalid(format!("{name}={text:?} is not valid: {} sets it to a whole number", launcher.name()))
        })
    };
    let process = number(names.index, &index_text)?;
    let cores_per_process = match (launcher, get(ENV_PJRT_PROCESSES_NUM_DEVICES)) {
        (Launcher::NeuronPjrt, Some(list)) => Some(
            list.split(',')
                .map(|n| n.trim().parse::<u32>().ok().filter(|&n| n > 0))
                .collect::<Option<Vec<u32>>>()
                .ok_or_else(|| {
                    NrtError::invalid(format!(
                        "{ENV_PJRT_PROCESSES_NUM_DEVICES}={list:?} is not valid: give the cores of each process, \
                         comma-separated, e.g. 2,2"
                    ))
                })?,
        ),
        _ => None,
    };
    let processes = match (get(names.count), &cores_per_process) {
        (Some(count), listed) => {
            let count = number(names.count, &count)?;
            if let Some(listed) = listed.as_ref().filter(|listed| listed.len() != count as usize) {
                return Err(NrtError::invalid(format!(
                    "{} is {count} but {ENV_PJRT_PROCESSES_NUM_DEVICES} lists {} processes",
                    names.count,
                    listed.len()
                )));
            }
            count
        }
        (None, Some(listed)) => listed.len() as u32,
        (None, None) => {
            // An index without a count is no launcher's doing (a variable left in a
            // shell, say): the process runs on its own, and says why.
            let also = if launcher == Launcher::NeuronPjrt {
                format!(" (or {ENV_PJRT_PROCESSES_NUM_DEVICES})")
            } else {
                String::new()
            };
            warnings.push(format!(
                "{}={process} is set but {}{also} is not, so this process runs on its own: {} sets both",
                names.index,
                names.count,
                launcher.name()
            ));
            return Ok(None);
        }
    };
    if process >= processes {
        return Err(NrtError::invalid(format!(
            "{}={process} is not below {}={processes}: processes are numbered from 0",
            names.index, names.count
        )));
    }
    let local_process = get(names.local_index).map(|text| number(names.local_index, &text)).transpose()?;
    let local_processes = match names.local_count.and_then(|name| Some((name, get(name)?))) {
        Some((name, text)) => Some(number(name, &text)?),
        None => None,
    };
    if let (Some(local), Some(count)) = (local_process, local_processes)
        && local >= count
    {
        return Err(NrtError::invalid(format!(
            "{}={local} is not below {}={count}",
            names.local_index,
            names.local_count.unwrap_or_default()
        )));
    }
    Ok(Some(Launch { launcher, process, processes, local_process, local_processes, cores_per_process }))
}

/// `<host name>:<port>` with a name this host resolves (torch-xla sets
/// `localhost:62182` when `MASTER_ADDR` is unset, and `MASTER_ADDR` may be a name).
fn resolve(text: &str) -> Result<SocketAddr, ()> {
    use std::net::ToSocketAddrs;
    let (host, port) = text.rsplit_once(':').ok_or(())?;
    let port = port.parse::<u16>().map_err(|_| ())?;
    if host.is_empty() || host.contains(':') {
        return Err(());
    }
    let addresses: Vec<SocketAddr> = (host, port).to_socket_addrs().map_err(|_| ())?.collect();
    addresses.iter().find(|a| a.is_ipv4()).or(addresses.first()).copied().ok_or(())
}

/// Rank 0's address: `NEURON_RT_ROOT_COMM_ID`, refused in Neuron's words unless it is
/// `<ipv4>:<port>`, `[<ipv6>]:<port>` or a host name this host resolves with a port; else `MASTER_ADDR` with [`DEFAULT_ROOT_PORT`];
/// `None` when neither is set.
pub(crate) fn root_from(get: &dyn Fn(&str) -> Option<String>) -> NrtResult<Option<RootComm>> {
    if let Some(text) = get(ENV_ROOT_COMM_ID) {
        return match text.trim().parse::<SocketAddr>().or_else(|_| resolve(text.trim())) {
            Ok(address) if address.port() != 0 => {
                Ok(Some(RootComm { host: address.ip().to_string(), port: address.port(), from: ENV_ROOT_COMM_ID }))
            }
            _ => Err(NrtError::invalid(format!(
                "{ENV_ROOT_COMM_ID}: Invalid NCCL_COMM_ID [{text}], please use format: <ipv4>:<port> or [<ipv6>]:<port>"
            ))),
        };
    }
    Ok(get(ENV_MASTER_ADDR).map(|host| {
        let host = host.trim();
        let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        RootComm { host: host.to_owned(), port: DEFAULT_ROOT_PORT, from: ENV_MASTER_ADDR }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |name| vars.get(name).cloned().filter(|v| !v.trim().is_empty())
    }

    fn launch(vars: &[(&str, &str)]) -> NrtResult<Option<Launch>> {
        launch_from(&lookup(vars), &mut Vec::new())
    }

    #[test]
    fn a_process_holds_the_ranks_of_its_cores_in_process_order() {
        let mpi =
            launch(&[("OMPI_COMM_WORLD_RANK", "2"), ("OMPI_COMM_WORLD_SIZE", "4")]).expect("valid").expect("a launch");
        assert_eq!(mpi.ranks(2), Ok((4..6, 8)));
        let jax = launch(&[("NEURON_PJRT_PROCESS_INDEX", "1"), (ENV_PJRT_PROCESSES_NUM_DEVICES, "2,1,3")])
            .expect("valid")
            .expect("a launch");
        assert_eq!(jax.ranks(1), Ok((2..3, 6)));
        let wrong = jax.ranks(2).expect_err("the list says 1 core");
        assert!(wrong.message.contains("gives process 1 1 NeuronCores, but it holds 2"), "{wrong}");
    }

    #[test]
    fn each_launcher_is_read_from_its_own_variables() {
        let torchrun = launch(&[("RANK", "3"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "2")]);
        assert_eq!(
            torchrun.expect("valid"),
            Some(Launch {
                launcher: Launcher::Torchrun,
                process: 3,
                processes: 8,
                local_process: Some(1),
                local_processes: Some(2),
                cores_per_process: None,
            })
        );
        let mpi = launch(&[
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
        ])
        .expect("valid")
        .expect("a launch");
        assert_eq!((mpi.launcher, mpi.process, mpi.processes, mpi.local_process), (Launcher::OpenMpi, 2, 4, Some(0)));
        let slurm = launch(&[("SLURM_PROCID", "5"), ("SLURM_NTASKS", "6"), ("SLURM_LOCALID", "1")])
            .expect("valid")
            .expect("a launch");
        assert_eq!(
            (slurm.launcher, slurm.process, slurm.processes, slurm.local_processes),
            (Launcher::Slurm, 5, 6, None)
        );
        // JAX's list of cores per process gives the count.
        let jax = launch(&[("NEURON_PJRT_PROCESS_INDEX", "1"), (ENV_PJRT_PROCESSES_NUM_DEVICES, "2, 2,4")])
            .expect("valid")
            .expect("a launch");
        assert_eq!((jax.process, jax.processes, jax.cores_per_process), (1, 3, Some(vec![2, 2, 4])));
        assert_eq!(launch(&[("LOCAL_RANK", "0")]).expect("valid"), None, "no index: a process on its own");
    }

    #[test]
    fn neuron_variables_win_over_the_launcher_that_set_them() {
        // torch-xla under torchrun sets both; Open MPI inside Slurm sets both.
        let both =
            [("NEURON_PJRT_PROCESS_INDEX", "1"), ("NEURON_PJRT_WORLD_SIZE", "2"), ("RANK", "1"), ("WORLD_SIZE", "2")];
        assert_eq!(launch(&both).expect("valid").expect("a launch").launcher, Launcher::NeuronPjrt);
        let nested = [
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("SLURM_PROCID", "7"),
            ("SLURM_NTASKS", "8"),
        ];
        assert_eq!(launch(&nested).expect("valid").expect("a launch").launcher, Launcher::OpenMpi);
    }

    #[test]
    fn inconsistent_launch_variables_are_refused_by_name() {
        let message = |vars: &[(&str, &str)]| launch(vars).expect_err("refused").message;
        // An index alone is a stray variable, not a launch: the process runs on its own,
        // and says so.
        let mut warnings = Vec::new();
        assert_eq!(launch_from(&lookup(&[("RANK", "1")]), &mut warnings).expect("valid"), None);
        assert!(warnings.iter().any(|w| w.contains("RANK=1 is set but WORLD_SIZE is not")), "{warnings:?}");
        assert!(message(&[("RANK", "4"), ("WORLD_SIZE", "4")]).contains("RANK=4 is not below WORLD_SIZE=4"));
        assert!(message(&[("RANK", "one"), ("WORLD_SIZE", "4")]).contains("RANK=\"one\""));
        assert!(
            message(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "2"), ("LOCAL_WORLD_SIZE", "2")])
                .contains("LOCAL_RANK=2")
        );
        let listed = [
            ("NEURON_PJRT_PROCESS_INDEX", "0"),
            ("NEURON_PJRT_WORLD_SIZE", "3"),
            (ENV_PJRT_PROCESSES_NUM_DEVICES, "1,1"),
        ];
        assert!(message(&listed).contains("lists 2 processes"));
        assert!(
            message(&[("NEURON_PJRT_PROCESS_INDEX", "0"), (ENV_PJRT_PROCESSES_NUM_DEVICES, "1,0")]).contains("2,2")
        );
    }

    #[test]
    fn the_root_is_an_ip_address_and_port_or_torchruns_master() {
        let root = |vars: &[(&str, &str)]| root_from(&lookup(vars));
        let v4 = root(&[(ENV_ROOT_COMM_ID, "10.0.0.1:41211")]).expect("valid").expect("a root");
        assert_eq!((v4.host.as_str(), v4.port, v4.to_string()), ("10.0.0.1", 41211, "10.0.0.1:41211".into()));
        let v6 =
            root(&[(ENV_ROOT_COMM_ID, "[fe80::1]:5000"), (ENV_MASTER_ADDR, "node0")]).expect("valid").expect("a root");
        assert_eq!((v6.to_string(), v6.from), ("[fe80::1]:5000".into(), ENV_ROOT_COMM_ID));
        let named = root(&[(ENV_ROOT_COMM_ID, "localhost:62182")]).expect("valid").expect("a root");
        assert_eq!(named.to_string(), "127.0.0.1:62182");
        for bad in ["no-such-host.invalid:41211", "10.0.0.1", "10.0.0.1:0", "fe80::1:5000", "10.0.0.1:99999"] {
            let error = root(&[(ENV_ROOT_COMM_ID, bad)]).expect_err(bad);
            assert_eq!(
                error.message,
                format!(
                    "NEURON_RT_ROOT_COMM_ID: Invalid NCCL_COMM_ID [{bad}], please use format: <ipv4>:<port> or [<ipv6>]:<port>"
                )
            );
        }
        let master = root(&[(ENV_MASTER_ADDR, "node0")]).expect("valid").expect("a root");
        assert_eq!((master.to_string(), master.from), ("node0:62182".into(), ENV_MASTER_ADDR));
        assert_eq!(root(&[]).expect("valid"), None);
    }
}
