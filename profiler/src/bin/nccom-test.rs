//! `nccom-test`: the Neuron collectives benchmark's interface over virtual NeuronCores.
//!
//! Started on its own, it runs `-r` ranks as processes of this host (each a copy of
//! itself holding one NeuronCore, joined through `NEURON_RT_ROOT_COMM_ID`, or a free
//! loopback port when it is unset). Started by a launcher (`mpirun`, torchrun, Slurm),
//! each process is one rank of the job. Rank 0 prints one line per size: `size count
//! type time(us) algbw busbw`, the time being the slowest rank's mean per operation and
//! the bus bandwidth as NCCL defines it.

use std::net::TcpListener;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};
use neuron_profiler::init_logging;
use neuron_runtime::config::{Config, CoreRequest};
use neuron_runtime::isa::ReduceOp;
use neuron_runtime::launch::ENV_ROOT_COMM_ID;
use neuron_runtime::{Collective, CollectiveCall, Communicator, DType, Runtime, Tensor, TensorPlacement};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Set in the processes this one starts for its ranks: the rank, then the rank count.
const ENV_RANK: &str = "NCCOM_TEST_RANK";
/// The communicator's name in every rank.
const COMMUNICATOR: &str = "nccom-test";

#[derive(Parser)]
#[command(
    name = "nccom-test",
    version,
    about = "Benchmark collectives between ranks of virtual NeuronCores",
    long_about = "Benchmark collectives between ranks of virtual NeuronCores, as Neuron's nccom-test does.\n\n\
        Without a launcher, -r RANKS processes of this host run one rank each (one NeuronCore \
        each: the instance needs that many cores, e.g. NEURON_VIRT_INSTANCE_TYPE=trn1.32xlarge). \
        Under mpirun, torchrun or srun, each process is one rank, or with NEURON_RT_NUM_CORES=k \
        (or NEURON_RT_VISIBLE_CORES) k ranks on its k cores (process p holds ranks p·k to \
        p·k + k - 1). Rank 0 listens at NEURON_RT_ROOT_COMM_ID (a free loopback port by default).\n\n\
        Columns: size (bytes of the largest buffer: the output of an all-gather, the input of \
        a reduce-scatter), count (its elements), type, time(us) (the slowest rank's mean per \
        operation), algbw (size / time, GB/s) and busbw (algbw times 2(n-1)/n for all-reduce, \
        (n-1)/n for the others: NCCL's bus bandwidth)."
)]
struct Cli {
    /// The operation.
    operation: Operation,
    /// Ranks (workers) in all [default: under a launcher, the job's ranks; else 2].
    #[arg(short = 'r', long = "nworkers")]
    ranks: Option<u32>,
    /// Nodes: only 1 without a launcher (start the ranks of other hosts with mpirun or srun).
    #[arg(short = 'N', long = "nnodes", default_value_t = 1)]
    nodes: u32,
    /// The smallest size: bytes, or with K, M or G.
    #[arg(short = 'b', long, default_value = "8", value_parser = parse_bytes)]
    minbytes: u64,
    /// The largest size.
    #[arg(short = 'e', long, default_value = "64M", value_parser = parse_bytes)]
    maxbytes: u64,
    /// Each size is this many times the previous one.
    #[arg(short = 'f', long, default_value_t = 2)]
    stepfactor: u64,
    /// Element type; several, comma-separated (`fp32,bf16`), run one after the other,
    /// each with its own table.
    #[arg(short = 'd', long, value_enum, value_delimiter = ',', default_value = "fp32")]
    datatype: Vec<DataType>,
    /// Timed operations per size (after 5 untimed ones).
    #[arg(short = 'n', long, default_value_t = 20)]
    iters: u32,
    /// Compare every rank's result with the expected one, with inputs of `all_ones`
    /// (every element 1), `random` (small whole numbers drawn the same way in every
    /// run) or, given as a bare `--check`, `pattern` (rank + 1 + index mod 5): whole
    /// numbers, so that sums are exact in every type.
    #[arg(short = 'c', long, value_enum, num_args = 0..=1, default_missing_value = "pattern", value_name = "INPUTS")]
    check: Option<Check>,
}

/// The inputs `--check` compares results over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Check {
    /// Rank + 1 + the element's index mod 5.
    Pattern,
    /// Every element 1.
    #[value(name = "all_ones", alias = "all-ones")]
    AllOnes,
    /// Whole numbers from 0 to 7, drawn from the rank and the index (the same in
    /// every run).
    Random,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Operation {
    /// All-reduce (sum).
    Allr,
    /// All-gather.
    Allg,
    /// Reduce-scatter (sum).
    Redsc,
    /// All-to-all.
    Alltoall,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum DataType {
    Fp32,
    Fp16,
    Bf16,
    Int32,
    Uint8,
}

impl DataType {
    fn dtype(self) -> DType {
        match self {
            DataType::Fp32 => DType::F32,
            DataType::Fp16 => DType::F16,
            DataType::Bf16 => DType::BF16,
            DataType::Int32 => DType::S32,
            DataType::Uint8 => DType::U8,
        }
    }

    /// `value` (a small whole number) as one element's little-endian bytes.
    fn encode(self, value: u32, out: &mut Vec<u8>) {
        match self {
            DataType::Fp32 => out.extend_from_slice(&(value as f32).to_le_bytes()),
            DataType::Fp16 => out.extend_from_slice(&half::f16::from_f32(value as f32).to_le_bytes()),
            DataType::Bf16 => out.extend_from_slice(&half::bf16::from_f32(value as f32).to_le_bytes()),
            DataType::Int32 => out.extend_from_slice(&(value as i32).to_le_bytes()),
            DataType::Uint8 => out.push(value as u8),
        }
    }
}

fn parse_bytes(text: &str) -> Result<u64, String> {
    let (number, scale) = match text.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&text[..text.len() - 1], 1 << 10),
        Some('M') => (&text[..text.len() - 1], 1 << 20),
        Some('G') => (&text[..text.len() - 1], 1 << 30),
        _ => (text, 1),
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("`{text}` is not a size: bytes, or a number with K, M or G"))
}

/// `-r` when neither it nor a launcher says.
const DEFAULT_RANKS: u32 = 2;

impl Cli {
    /// The ranks in all: `-r`, once `run` has settled it.
    fn ranks(&self) -> u32 {
        self.ranks.unwrap_or(DEFAULT_RANKS)
    }
}

fn main() -> ExitCode {
    let mut cli = Cli::parse();
    match run(&mut cli) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("nccom-test: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs this process's part; `Ok(false)` when a check or a rank failed.
fn run(cli: &mut Cli) -> Result<bool> {
    if cli.ranks == Some(0) || cli.iters == 0 || cli.stepfactor < 2 || cli.minbytes > cli.maxbytes {
        bail!("-r and --iters must be 1 or more, --stepfactor 2 or more, and --minbytes at most --maxbytes");
    }
    let config = Config::from_env().context("configuration")?;
    init_logging(config.log_level);
    if let Ok(rank) = std::env::var(ENV_RANK) {
        let rank: u32 = rank.parse().with_context(|| format!("{ENV_RANK}={rank}"))?;
        return process_main(cli, Config { cores: CoreRequest::Count(1), ..config }, rank..rank + 1);
    }
    if let Some(launch) = config.launch.clone() {
        // One core (one rank) per process unless the job gives each process its cores.
        let config = if std::env::var_os("NEURON_RT_NUM_CORES").is_some()
            || std::env::var_os("NEURON_RT_VISIBLE_CORES").is_some()
        {
            config
        } else {
            Config { cores: CoreRequest::Count(1), ..config }
        };
        let cores = match &config.cores {
            CoreRequest::Count(k) => *k,
            CoreRequest::Visible(set) => set.cores().len() as u32,
            _ => 1,
        };
        let (ranks, count) = launch.ranks(cores)?;
        match cli.ranks {
            Some(given) if given != count => bail!(
                "-r {given} but {} started {} processes of {cores} NeuronCore(s) each: {count} ranks (leave -r out to take the launcher's)",
                launch.launcher.name(),
                launch.processes
            ),
            _ => cli.ranks = Some(count),
        }
        return process_main(cli, config, ranks);
    }
    if cli.nodes != 1 {
        bail!("-N {} needs the ranks of the other hosts started there: run under mpirun or srun", cli.nodes);
    }
    let cores = config.instance_type.topology().core_count();
    if cli.ranks() > cores {
        bail!(
            "-r {} needs as many NeuronCores, one per rank, and this {} has {cores}: set NEURON_VIRT_INSTANCE_TYPE to a larger instance (trn1.32xlarge has 32)",
            cli.ranks(),
            config.instance_type
        );
    }
    spawn_ranks(cli)
}

/// Starts one process per rank (copies of this one) and waits for them.
fn spawn_ranks(cli: &Cli) -> Result<bool> {
    let root = match std::env::var(ENV_ROOT_COMM_ID) {
        Ok(root) => root,
        Err(_) => {
            let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
            format!("127.0.0.1:{port}")
        }
    };
    let exe = std::env::current_exe().context("this program's path")?;
    let mut children = Vec::new();
    for rank in 0..cli.ranks() {
        let child = Command::new(&exe)
            .args(std::env::args_os().skip(1))
            .env(ENV_RANK, rank.to_string())
            .env(ENV_ROOT_COMM_ID, &root)
            .env("NEURON_RT_NUM_CORES", "1")
            .env_remove("NEURON_RT_VISIBLE_CORES")
            .spawn()
            .with_context(|| format!("cannot start rank {rank}"))?;
        children.push(child);
    }
    let mut all_ok = true;
    for (rank, mut child) in children.into_iter().enumerate() {
        let status = child.wait().with_context(|| format!("rank {rank}"))?;
        if !status.success() {
            eprintln!("nccom-test: rank {rank} ended with {status}");
            all_ok = false;
        }
    }
    Ok(all_ok)
}

/// The sizes from --minbytes to --maxbytes, each a whole number of elements (for the
/// scattered operations, of `ranks` elements).
fn sizes(cli: &Cli, element: u64, ranks: u64) -> Vec<u64> {
    let unit = match cli.operation {
        Operation::Allr => element,
        _ => element * ranks,
    };
    let mut sizes = Vec::new();
    let mut size = cli.minbytes;
    while size <= cli.maxbytes {
        let rounded = size.div_ceil(unit) * unit;
        if sizes.last() != Some(&rounded) {
            sizes.push(rounded);
        }
        size = size.saturating_mul(cli.stepfactor);
    }
    sizes
}

/// This process's ranks: joins each on a core of its own, then runs every data type's
/// sizes with one thread per rank; rank 0 prints the tables.
fn process_main(cli: &Cli, config: Config, ranks: std::ops::Range<u32>) -> Result<bool> {
    let runtime = Runtime::start(config).context("runtime")?;
    let cores = runtime.cores()?.cores().to_vec();
    if cores.len() != ranks.len() {
        bail!("ranks {ranks:?} need {} NeuronCores, and this process holds {}", ranks.len(), cores.len());
    }
    let mut held = Vec::new();
    for (rank, &core) in ranks.clone().zip(&cores) {
        held.push((rank, core, runtime.join_communicator(COMMUNICATOR, core, rank, cli.ranks())?));
    }
    for (_, _, communicator) in &held {
        communicator.wait_for_ranks(Instant::now() + runtime.config().exec_timeout)?;
    }
    let mut all_ok = true;
    for &datatype in &cli.datatype {
        let results: Vec<Result<bool>> = std::thread::scope(|scope| {
            let threads: Vec<_> = held
                .iter()
                .map(|(rank, core, communicator)| {
                    let runtime = &runtime;
                    scope.spawn(move || rank_main(cli, datatype, runtime, communicator, *rank, *core))
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a rank panicked")))).collect()
        });
        for result in results {
            all_ok &= result?;
        }
    }
    runtime.close()?;
    Ok(all_ok)
}

/// One rank and data type: runs every size, and (rank 0) prints the table.
fn rank_main(
    cli: &Cli,
    datatype: DataType,
    runtime: &Runtime,
    communicator: &Communicator,
    rank: u32,
    core: u32,
) -> Result<bool> {
    let ranks = cli.ranks();
    let dtype = datatype.dtype();
    let element = dtype.size_bytes();
    let n = u64::from(ranks);
    let op = match cli.operation {
        Operation::Allr => Collective::AllReduce(ReduceOp::Add),
        Operation::Allg => Collective::AllGather,
        Operation::Redsc => Collective::ReduceScatter(ReduceOp::Add),
        Operation::Alltoall => Collective::AllToAll,
    };
    let call = CollectiveCall::new(op, dtype);
    let factor = match cli.operation {
        Operation::Allr => 2.0 * (n as f64 - 1.0) / n as f64,
        _ => (n as f64 - 1.0) / n as f64,
    };
    if rank == 0 {
        let name = datatype.to_possible_value().map_or_else(String::new, |v| v.get_name().to_owned());
        println!(
            "# nccom-test {} on {ranks} ranks, {name}, {} timed operations per size",
            operation_name(cli.operation),
            cli.iters
        );
        println!(
            "{:>12} {:>12} {:>6} {:>12} {:>12} {:>12}{}",
            "size(B)",
            "count",
            "type",
            "time(us)",
            "algbw(GB/s)",
            "busbw(GB/s)",
            if cli.check.is_some() { "  check" } else { "" }
        );
    }
    let mut all_ok = true;
    for size in sizes(cli, element, n) {
        let (input_bytes, output_bytes) = match cli.operation {
            Operation::Allr | Operation::Alltoall => (size, size),
            Operation::Allg => (size / n, size),
            Operation::Redsc => (size, size / n),
        };
        let input = runtime.allocate_tensor(TensorPlacement::Device { core }, input_bytes, "input")?;
        let inputs = cli.check.unwrap_or(Check::Pattern);
        input.write(0, &rank_input(inputs, datatype, rank, input_bytes / element))?;
        let output = runtime.allocate_tensor(TensorPlacement::Device { core }, output_bytes, "output")?;
        for _ in 0..5 {
            communicator.run(rank, &call, Some(&input), Some(&output))?;
        }
        let checked = cli.check.is_none()
            || output.read_all()? == expected(inputs, (cli.operation, datatype), rank, ranks, output_bytes / element);
        communicator.run(rank, &CollectiveCall::new(Collective::Barrier, DType::U8), None, None)?;
        let started = Instant::now();
        for _ in 0..cli.iters {
            communicator.run(rank, &call, Some(&input), Some(&output))?;
        }
        let mean = started.elapsed() / cli.iters;
        let (slowest, failed) = gather_results(runtime, communicator, rank, ranks, core, mean, checked)?;
        all_ok &= failed.is_empty();
        if rank == 0 {
            let seconds = slowest.as_secs_f64();
            let algbw = size as f64 / seconds / 1e9;
            let check = match (cli.check.is_some(), failed.is_empty()) {
                (false, _) => String::new(),
                (true, true) => "  ok".to_owned(),
                (true, false) => {
                    format!("  WRONG on rank {}", failed.iter().map(u32::to_string).collect::<Vec<_>>().join(", "))
                }
            };
            println!(
                "{size:>12} {:>12} {:>6} {:>12.1} {:>12.3} {:>12.3}{check}",
                size / element,
                dtype,
                seconds * 1e6,
                algbw,
                algbw * factor
            );
        }
    }
    Ok(all_ok)
}

fn operation_name(operation: Operation) -> &'static str {
    match operation {
        Operation::Allr => "all-reduce",
        Operation::Allg => "all-gather",
        Operation::Redsc => "reduce-scatter",
        Operation::Alltoall => "all-to-all",
    }
}

/// Element `i` of rank `rank`'s input: a small whole number, so that sums are exact in
/// every type.
fn value(inputs: Check, rank: u32, i: u64) -> u32 {
    match inputs {
        Check::Pattern => rank + 1 + (i % 5) as u32,
        Check::AllOnes => 1,
        // A SplitMix64 step of the rank and index: the same draw in every process.
        Check::Random => {
            let mut z = (u64::from(rank) << 40 ^ i).wrapping_add(0x9e37_79b9_7f4a_7c15);
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            ((z ^ (z >> 31)) % 8) as u32
        }
    }
}

fn rank_input(inputs: Check, datatype: DataType, rank: u32, count: u64) -> Vec<u8> {
    let mut bytes = Vec::new();
    for i in 0..count {
        datatype.encode(value(inputs, rank, i), &mut bytes);
    }
    bytes
}

/// What rank `rank`'s output of `count` elements must be.
fn expected(inputs: Check, (operation, datatype): (Operation, DataType), rank: u32, ranks: u32, count: u64) -> Vec<u8> {
    let n = u64::from(ranks);
    let value = |rank: u32, i: u64| value(inputs, rank, i);
    let mut bytes = Vec::new();
    for i in 0..count {
        let value = match operation {
            Operation::Allr => (0..ranks).map(|r| value(r, i)).sum(),
            // Part r of the output is rank r's input.
            Operation::Allg => value((i / (count / n)) as u32, i % (count / n)),
            // Part `rank` of every input, summed.
            Operation::Redsc => (0..ranks).map(|r| value(r, u64::from(rank) * count + i)).sum(),
            // Part j of the output is part `rank` of rank j's input.
            Operation::Alltoall => {
                let part = count / n;
                value((i / part) as u32, u64::from(rank) * part + i % part)
            }
        };
        datatype.encode(value, &mut bytes);
    }
    bytes
}

/// Every rank's mean time and check, gathered: the slowest time and the ranks whose
/// result was wrong.
fn gather_results(
    runtime: &Runtime,
    communicator: &Communicator,
    rank: u32,
    ranks: u32,
    core: u32,
    mean: Duration,
    checked: bool,
) -> Result<(Duration, Vec<u32>)> {
    let mine: Vec<u8> = [(mean.as_nanos() as u64).to_le_bytes(), u64::from(checked).to_le_bytes()].concat();
    let tensor = |bytes: usize, name: &str| -> Result<Tensor> {
        Ok(runtime.allocate_tensor(TensorPlacement::Device { core }, bytes as u64, name)?)
    };
    let input = tensor(mine.len(), "times")?;
    input.write(0, &mine)?;
    let output = tensor(mine.len() * ranks as usize, "all times")?;
    communicator.run(rank, &CollectiveCall::new(Collective::AllGather, DType::U8), Some(&input), Some(&output))?;
    let all = output.read_all()?;
    let mut slowest = Duration::ZERO;
    let mut failed = Vec::new();
    for (r, result) in all.chunks_exact(16).enumerate() {
        let word = |k: usize| u64::from_le_bytes(result[k * 8..k * 8 + 8].try_into().unwrap_or_default());
        slowest = slowest.max(Duration::from_nanos(word(0)));
        if word(1) == 0 {
            failed.push(r as u32);
        }
    }
    Ok((slowest, failed))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expected_ints(operation: Operation, rank: u32, ranks: u32, count: u64) -> Vec<i32> {
        ints(&expected(Check::Pattern, (operation, DataType::Int32), rank, ranks, count))
    }

    fn ints(bytes: &[u8]) -> Vec<i32> {
        bytes.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    }

    #[test]
    fn the_expected_results_are_the_operations_of_the_inputs() {
        // Rank r's element i is r + 1 + i mod 5: rank 0 holds 1 2 3 4 5 …, rank 1 2 3 4 5 6 ….
        assert_eq!(ints(&rank_input(Check::Pattern, DataType::Int32, 1, 4)), [2, 3, 4, 5]);
        assert_eq!(expected_ints(Operation::Allr, 0, 2, 3), [3, 5, 7]);
        assert_eq!(expected_ints(Operation::Allg, 1, 2, 4), [1, 2, 2, 3]);
        // Part 1 (elements 2 and 3) of both inputs, summed: 3 + 4, 4 + 5.
        assert_eq!(expected_ints(Operation::Redsc, 1, 2, 2), [7, 9]);
        // Part 1 of rank 0's input, then part 1 of rank 1's.
        assert_eq!(expected_ints(Operation::Alltoall, 1, 2, 4), [3, 4, 4, 5]);
        let types = Cli::parse_from(["nccom-test", "allr", "-d", "fp32,bf16,uint8"]).datatype;
        assert!(types == [DataType::Fp32, DataType::Bf16, DataType::Uint8]);
    }

    #[test]
    fn neurons_check_modes_give_inputs_whose_results_are_known() {
        let check = |args: &[&str]| Cli::parse_from([&["nccom-test", "allr"][..], args].concat()).check;
        assert_eq!(check(&[]), None);
        assert_eq!(check(&["--check"]), Some(Check::Pattern));
        assert_eq!(check(&["--check", "all_ones"]), Some(Check::AllOnes));
        assert_eq!(check(&["--check", "random", "-n", "3"]), Some(Check::Random));
        assert!(Cli::try_parse_from(["nccom-test", "allr", "--check", "zeros"]).is_err());
        // All ones: an all-reduce of 4 ranks gives 4 everywhere.
        let all_ones = expected(Check::AllOnes, (Operation::Allr, DataType::Int32), 0, 4, 3);
        assert_eq!(ints(&all_ones), [4, 4, 4]);
        // Random: whole numbers 0 to 7 that differ by rank and index, the same each time,
        // and the all-reduce is their sum.
        let draw = |rank| ints(&rank_input(Check::Random, DataType::Int32, rank, 64));
        assert_eq!(draw(0), draw(0));
        assert_ne!(draw(0), draw(1));
        assert!(draw(2).iter().all(|v| (0..8).contains(v)) && draw(2).iter().any(|&v| v != draw(2)[0]));
        let sums: Vec<i32> = (0..64).map(|i| (0..3).map(|r| draw(r)[i]).sum()).collect();
        assert_eq!(ints(&expected(Check::Random, (Operation::Allr, DataType::Int32), 1, 3, 64)), sums);
    }

    #[test]
    fn sizes_step_by_the_factor_in_whole_elements_of_every_part() {
        let cli = Cli::parse_from(["nccom-test", "allg", "-b", "8", "-e", "1K", "-f", "4"]);
        assert_eq!(sizes(&cli, 4, 3), [12, 36, 132, 516]);
        assert_eq!(parse_bytes("64M"), Ok(64 << 20));
        assert!(parse_bytes("0").is_err() && parse_bytes("1T").is_err());
    }
}
