//! `neuron-cc`: compiles HLO text (as JAX and PyTorch-XLA dump it) into a NEFF.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use neuron_profiler::thousands;
use neuron_runtime::compile::compile_hlo_sharded;
use neuron_runtime::compile::{SUPPORTED_OPERATORS, engine_of_operator};
use neuron_runtime::isa::DmaQueueKind;
use neuron_runtime::memory::HumanBytes;
use neuron_runtime::{AutoCast, AutoCastType, CompileOptions, Neff, OptLevel, Target};

#[derive(Parser)]
#[command(
    name = "neuron-cc",
    version,
    about = "Compile HLO text into a NEFF for virtual NeuronCores",
    long_about = "Compile HLO text into a NEFF for virtual NeuronCores.\n\n\
        Export HLO from JAX with `jax.jit(f).lower(*args).as_text(dialect=\"hlo\")`, or use a \
        PyTorch-XLA HLO dump. Every HLO instruction is lowered to an engine instruction (PE, ACT, \
        DVE or POOL) and parameters, constants and results to DMA transfers."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Compile an HLO text file into a NEFF.
    Compile {
        /// The HLO text file.
        model: PathBuf,
        /// Where to write the NEFF (default: the model path with a .neff extension).
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// The instance family to compile for: trn1, trn1n and inf2 (NeuronCore-v2) or trn2 (NeuronCore-v3).
        #[arg(long, default_value = "trn1")]
        target: Target,
        /// Name recorded in the NEFF (default: the file stem).
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        numerics: NumericsArgs,
    },
    /// List the HLO operators this compiler supports and the engine each runs on.
    ListOperators,
}

#[derive(clap::Args)]
struct NumericsArgs {
    /// Which f32 operations compute in the auto-cast type: `none` (f32 stays f32, as XLA:CPU
    /// computes), `matmult` (the operands of matrix products are rounded to it; products
    /// accumulate in f32) or `all` (every f32 value is rounded to it: parameters, constants
    /// and every result that computes new values).
    #[arg(long, value_name = "MODE", default_value = "matmult")]
    auto_cast: AutoCast,
    /// The narrower type of --auto-cast: bf16, fp16, tf32 (8-bit exponent, 10-bit mantissa)
    /// or fp8_e4m3 (OCP E4M3, largest value 448, no infinities).
    #[arg(long, value_name = "TYPE", default_value = "bf16")]
    auto_cast_type: AutoCastType,
    /// Reductions over bf16 or fp16 values (and over f32 values under --auto-cast all)
    /// accumulate in f32 and round once, instead of rounding every partial result.
    #[arg(long)]
    enable_mixed_precision_accumulation: bool,
    /// The roundings the compiler inserts give the largest finite value of the narrow type,
    /// instead of infinity, for values beyond its range and for infinities.
    #[arg(long)]
    enable_saturate_infinity: bool,
    /// 1: every HLO instruction as written, each intermediate in its own scratchpad space;
    /// 2: also compute values that depend on constants alone at compile time (broadcasts
    /// and iotas of constants stay instructions), let matrix products read transposed
    /// operands in place, drop instructions whose results are unused and reuse dead
    /// intermediates' space; 3: also drop copies that change nothing (copies, same-shape reshapes,
    /// identity transposes, sharding annotations).
    #[arg(long, value_name = "LEVEL", default_value = "2")]
    optlevel: OptLevel,
}

impl NumericsArgs {
    fn options(&self, target: Target) -> CompileOptions {
        CompileOptions {
            target,
            auto_cast: self.auto_cast,
            auto_cast_type: self.auto_cast_type,
            mixed_precision_accumulation: self.enable_mixed_precision_accumulation,
            saturate_infinity: self.enable_saturate_infinity,
            optlevel: self.optlevel,
        }
    }
}

fn main() -> ExitCode {
    neuron_profiler::exit_quietly_on_closed_pipe();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Compile { model, output, target, name, numerics } => {
            compile(&model, output, &numerics.options(target), name)
        }
        Command::ListOperators => {
            list_operators();
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn compile(model: &Path, output: Option<PathBuf>, options: &CompileOptions, name: Option<String>) -> Result<()> {
    let target = options.target;
    let text = std::fs::read_to_string(model).with_context(|| format!("cannot read {}", model.display()))?;
    let (program, sharding) = compile_hlo_sharded(&text, options)
        .map_err(|e| anyhow::anyhow!("{}: {e}; no NEFF was written", model.display()))?;
    let name = name.unwrap_or_else(|| neuron_profiler::model_name(model));
    let neff = Neff::new(&name, program);
    let bytes = neff.encode();
    let output = output.unwrap_or_else(|| model.with_extension("neff"));
    write_atomically(&output, &bytes)?;

    let p = &neff.program;
    println!("compiled {} -> {} ({}, NeuronCore-{})", model.display(), output.display(), target.name(), p.target);
    let cast = match options.auto_cast {
        AutoCast::None => "none (f32 stays f32)".to_string(),
        AutoCast::MatMult => format!("matmult, {}", options.auto_cast_type.format().name()),
        AutoCast::All => format!("all, {}", options.auto_cast_type.format().name()),
    };
    let accumulation = if options.mixed_precision_accumulation { "f32" } else { "narrow type" };
    println!(
        "  auto-cast           {cast}; reductions accumulate in {accumulation}; optlevel {}",
        options.optlevel as u8 + 1
    );
    if let Some(sharding) = &sharding {
        let axes: Vec<String> = sharding.mesh.iter().map(|(axis, size)| format!("{axis}={size}")).collect();
        println!(
            "  mesh                {} ({} ranks; the NEFF is one rank's program: load it on {} cores as collectives ranks)",
            axes.join(", "),
            sharding.devices(),
            sharding.devices()
        );
        for (k, value) in sharding.inputs.iter().enumerate() {
            println!("  {:<20}{value}", format!("sharded input{k}"));
        }
        for (k, value) in sharding.outputs.iter().enumerate() {
            println!("  {:<20}{value}", format!("sharded output{k}"));
        }
    }
    for io in &p.inputs {
        println!("  input   {:<9} {:<20} {}", io.name, p.buffers[io.buffer as usize].ty.to_string(), io.hlo_name);
    }
    for io in &p.outputs {
        println!("  output  {:<9} {:<20} {}", io.name, p.buffers[io.buffer as usize].ty.to_string(), io.hlo_name);
    }
    let counts: Vec<String> =
        p.instruction_counts().into_iter().filter(|(_, n)| *n > 0).map(|(engine, n)| format!("{engine} {n}")).collect();
    let total: usize = p.instruction_counts().iter().map(|(_, n)| n).sum();
    match total {
        0 => println!("  instructions        0 (every output is an input or computed at compile time)"),
        _ => println!("  instructions        {total} ({})", counts.join(", ")),
    }
    let transfers = |kind| p.dma_queues.iter().filter(|q| q.kind == kind).map(|q| q.transfers.len()).sum::<usize>();
    println!(
        "  DMA transfers       {} input, {} weights, {} output",
        transfers(DmaQueueKind::Input),
        transfers(DmaQueueKind::Weights),
        transfers(DmaQueueKind::Output)
    );
    println!("  weights             {} in {} constants", HumanBytes(p.constant_bytes()), p.constants.len());
    println!("  FLOPs/execution     {}", thousands(p.flops_per_execution()));
    println!("  scratchpad          {}", HumanBytes(p.scratchpad_bytes));
    println!("  NEFF                {} (uuid {})", HumanBytes(bytes.len() as u64), neff.uuid);
    Ok(())
}

/// Writes through a temporary file and a rename, so a failed or interrupted compile
/// never leaves a partial NEFF behind.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut temp =
        tempfile::NamedTempFile::new_in(dir).with_context(|| format!("cannot write into {}", dir.display()))?;
    temp.write_all(bytes).with_context(|| format!("cannot write {}", path.display()))?;
    // Temporary files are private; a compiled model is as readable as any output file.
    temp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o644))
        .with_context(|| format!("cannot write {}", path.display()))?;
    temp.persist(path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

fn list_operators() {
    let width = SUPPORTED_OPERATORS.iter().map(|op| op.len()).max().unwrap_or(0);
    println!("{:<width$}  engine", "operator");
    for op in SUPPORTED_OPERATORS {
        let engine =
            engine_of_operator(op).map_or_else(|| "(resolved at compile time / DMA)".to_string(), |e| e.to_string());
        println!("{op:<width$}  {engine}");
    }
}
