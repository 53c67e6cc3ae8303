//! `neuron-profile view`: reads NTFF files and prints a summary or exports the events.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::ranks;
use clap::{Args, ValueEnum};
use neuron_datastore::EventType;
use neuron_datastore::MAX_CORES;
use neuron_record::{to_device_event, to_system_event};
use neuron_runtime::CoreSet;
use ntff::NtffFile;
use ntff::export::{ExportOptions, Format, Progress};

use ntff::summary;

#[derive(Debug, Args)]
pub(crate) struct ViewArgs {
    /// The NTFF file to read.
    #[arg(short = 's', long = "session-file", value_name = "FILE.ntff", required_unless_present = "session_dir")]
    session_file: Option<PathBuf>,
    /// A directory of NTFF files (as `inspect` writes): each is summarised in turn, or
    /// all are exported as one trace with a process per file. A job's rank profiles
    /// (`profile_rank_<id>.ntff`) are also read together: their collectives on one
    /// clock, per collective and with the straggler finding (summary-text first;
    /// summary-json as `{"ranks": …, "files": [summaries]}`).
    #[arg(short = 'd', long = "session-dir", value_name = "DIR", conflicts_with = "session_file")]
    session_dir: Option<PathBuf>,
    /// What to print. Without it, the web dashboard opens on the profile (or on the
    /// directory's list of profiles) at http://127.0.0.1:PORT/.
    #[arg(long, value_enum)]
    output_format: Option<OutputFormat>,
    /// The dashboard's port on 127.0.0.1, when no --output-format is given. Without it,
    /// 3001, or a free port when 3001 is taken (a dashboard already running there).
    #[arg(long)]
    port: Option<u16>,
    /// Write there instead of stdout (parquet: the directory to write the tables in;
    /// with --session-dir, a directory per file under it, unless --parquet-layout hive).
    #[arg(long, value_name = "FILE")]
    output_file: Option<PathBuf>,
    /// How parquet output lays out its tables under --output-file DIR.
    #[arg(long, value_enum, default_value_t = ParquetLayout::Directory, value_name = "LAYOUT")]
    parquet_layout: ParquetLayout,
    /// Only these NeuronCores, e.g. "0,1" or "0-3".
    #[arg(long, value_name = "CORES")]
    system_trace_filter_neuron_core: Option<String>,
    /// Only these system event types, e.g. "nrt_execute,nrt_load"; device events are
    /// then left out (json, perfetto and chrome-json output).
    #[arg(long, value_name = "TYPES", value_delimiter = ',')]
    system_trace_filter_event_type: Option<Vec<String>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OutputFormat {
    /// Where the time went, FLOPs, DMA, latency, losses: for people.
    SummaryText,
    /// The same summary as one JSON object.
    SummaryJson,
    /// Every event as JSON, in the runtime's event shapes.
    Json,
    /// A Perfetto trace (protobuf) for ui.perfetto.dev or trace_processor: a process
    /// per file, tracks per core, engine and DMA queue, counters and flows.
    Perfetto,
    /// The same timeline in Chrome's JSON trace format, for small traces.
    ChromeJson,
    /// Apache Parquet tables for SQL (DuckDB, Polars, pandas, Spark): a directory per
    /// file, given by --output-file DIR, with events, executions, counters, losses,
    /// bounds and findings; columns in ntff/TABLES.md.
    Parquet,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ParquetLayout {
    /// DIR/TABLE.parquet for a file (DIR/FILE/TABLE.parquet with --session-dir), every
    /// row with its host, pid and session.
    Directory,
    /// DIR/TABLE/host=HOST/session=FILE/part-PID.parquet: hive partitions for a fleet.
    /// Every host can write into one shared DIR; spark.read.parquet("DIR/TABLE"),
    /// DuckDB's and Polars' hive_partitioning read host and session from the paths.
    Hive,
}

pub(crate) fn view(args: ViewArgs) -> Result<()> {
    for name in args.system_trace_filter_event_type.iter().flatten() {
        if EventType::from_name(name.trim()).is_none() {
            let known: Vec<&str> = EventType::ALL.iter().map(|t| t.name()).collect();
            bail!("--system-trace-filter-event-type: unknown event type {name:?} (known: {})", known.join(", "));
        }
    }
    let Some(format) = args.output_format else { return serve(&args) };
    let files = match (&args.session_file, &args.session_dir) {
        (Some(file), _) => vec![file.clone()],
        (None, Some(dir)) => ntff_files_in(dir)?,
        (None, None) => bail!("give a file with -s FILE.ntff or a directory with -d DIR"),
    };
    if matches!(format, OutputFormat::Perfetto | OutputFormat::ChromeJson) {
        return export(&args, format, &files);
    }
    if format == OutputFormat::Parquet {
        return tables(&args, &files);
    }
    let mut out: Box<dyn Write> = match &args.output_file {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    // A directory of a job's ranks: their collectives together first.
    let rank_files: Vec<&PathBuf> = files
        .iter()
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("profile_rank_")))
        .collect();
    let mut ranks_report = None;
    let summary = matches!(format, OutputFormat::SummaryText | OutputFormat::SummaryJson);
    if summary && args.session_dir.is_some() && !rank_files.is_empty() {
        let profiles: Vec<ranks::RankProfile> =
            rank_files.iter().map(|p| ranks::read(p)).collect::<Result<Vec<_>>>()?.into_iter().flatten().collect();
        let views = ranks::views(&profiles);
        // Several ranks, or one whose file says its group has more.
        let grouped = profiles.iter().flat_map(|p| &p.membership).any(|c| c.ranks > 1);
        if grouped || views.iter().any(|v| v.members.len() > 1) {
            let report = ranks::report(&profiles, &views, unfinished(args.session_dir.as_deref())?);
            if format == OutputFormat::SummaryText {
                writeln!(out, "{}", report.to_text())?;
            }
            ranks_report = Some(report);
        }
    }
    let mut summaries = Vec::new();
    for path in &files {
        let file = NtffFile::open(path).with_context(|| format!("cannot read {}", path.display()))?;
        let cores = core_filter(&args, &file)?;
        match format {
            OutputFormat::SummaryText => {
                let s = summary::summarise(&file, cores.as_deref());
                writeln!(out, "{}", summary::to_text(&s, &path.display().to_string()))?;
            }
            OutputFormat::SummaryJson => summaries.push(summary::summarise(&file, cores.as_deref())),
            OutputFormat::Json => {
                write_json(&file, cores.as_deref(), args.system_trace_filter_event_type.as_deref(), &mut out)?
            }
            OutputFormat::Perfetto | OutputFormat::ChromeJson | OutputFormat::Parquet => {
                unreachable!("exported above")
            }
        }
    }
    if format == OutputFormat::SummaryJson {
        if let Some(report) = ranks_report {
            // A job's ranks: their report beside each file's summary.
            serde_json::to_writer_pretty(&mut out, &serde_json::json!({"ranks": report, "files": summaries}))?;
        } else if summaries.len() == 1 {
            serde_json::to_writer_pretty(&mut out, &summaries[0])?;
        } else {
            serde_json::to_writer_pretty(&mut out, &summaries)?;
        }
        writeln!(out)?;
    }
    out.flush()?;
    Ok(())
}

/// The cores `--system-trace-filter-neuron-core` selects in `file`.
fn core_filter(args: &ViewArgs, file: &NtffFile) -> Result<Option<Vec<u32>>> {
    let Some(text) = &args.system_trace_filter_neuron_core else { return Ok(None) };
    let count = file
        .metadata()
        .topology
        .as_ref()
        .map(|t| t.device_count * t.cores_per_device)
        .filter(|&n| n > 0)
        .unwrap_or(MAX_CORES);
    let cores =
        CoreSet::parse(text, count).map_err(|e| anyhow::anyhow!("--system-trace-filter-neuron-core {text:?}: {e}"))?;
    Ok(Some(cores.cores().to_vec()))
}

/// Serves the dashboard opened on the file (or the directory's list) until Ctrl-C.
fn serve(args: &ViewArgs) -> Result<()> {
    let (dir, name) = match (&args.session_file, &args.session_dir) {
        (Some(file), _) => {
            let file = file.canonicalize().with_context(|| format!("cannot read {}", file.display()))?;
            // Opened first, so that a file that is not a profile is refused here.
            NtffFile::open(&file).with_context(|| format!("cannot read {}", file.display()))?;
            let name = file.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
            if !name.ends_with(".ntff") || name.starts_with('.') {
                bail!(
                    "{}: the dashboard opens files named *.ntff; rename it, or print it with --output-format summary-text",
                    file.display()
                );
            }
            let dir = file.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
            (dir, Some(name))
        }
        (None, Some(dir)) => (dir.clone(), None),
        (None, None) => bail!("give a file with -s FILE.ntff or a directory with -d DIR"),
    };
    let port = args.port.unwrap_or(DEFAULT_PORT);
    let mut options = neuron_dashboard::Options::new(std::net::SocketAddr::from(([127, 0, 0, 1], port)))?;
    options.profiles = Some(dir);
    // The file is indexed while the browser opens.
    options.preload = name.clone();
    let page = name.map_or_else(
        || "/profiles".to_string(),
        |n| format!("/profile/{}", percent_encoding::utf8_percent_encode(&n, FRAGMENT)),
    );
    let (dashboard, taken) = neuron_profiler::start_dashboard(options, args.port.is_none())
        .context("cannot serve the dashboard (another port: --port N; a summary: --output-format summary-text)")?;
    if taken.is_some() {
        eprintln!("neuron-profile: port {port} is taken, using {} instead", dashboard.addr().port());
    }
    eprintln!("neuron-profile: the dashboard is at {} (Ctrl-C to stop)", dashboard.url(Some(&page)));
    dashboard.wait();
    Ok(())
}

/// The dashboard's port unless `--port` says otherwise.
const DEFAULT_PORT: u16 = 3001;

/// What a file name keeps as it is in the page's address: letters, digits, `-._~`.
const FRAGMENT: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// Writes every file as one Perfetto or Chrome JSON trace, a process per file.
fn export(args: &ViewArgs, format: OutputFormat, paths: &[PathBuf]) -> Result<()> {
    let format = match format {
        OutputFormat::Perfetto => Format::Perfetto,
        _ => Format::ChromeJson,
    };
    if args.output_file.is_none() && std::io::stdout().is_terminal() {
        bail!(
            "this output is a file for a trace viewer: give --output-file FILE (e.g. trace.pftrace) or redirect stdout"
        );
    }
    let files = paths
        .iter()
        .map(|path| NtffFile::open(path).with_context(|| format!("cannot read {}", path.display())))
        .collect::<Result<Vec<_>>>()?;
    for (path, file) in paths.iter().zip(&files) {
        for problem in file.recovery().describe() {
            eprintln!("warning: {}: {problem}", path.display());
        }
    }
    let cores = match files.first() {
        Some(file) => core_filter(args, file)?,
        None => None,
    };
    // A directory's files are a job's ranks (or unrelated profiles, which have no clock
    // offsets and stay as they are): each on the root's clock.
    let options = ExportOptions {
        cores,
        system_types: args.system_trace_filter_event_type.clone(),
        root_clock: args.session_dir.is_some(),
    };
    let out: Box<dyn Write> = match &args.output_file {
        Some(path) => {
            Box::new(std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?)
        }
        None => Box::new(std::io::stdout().lock()),
    };
    let bar = progress_bar("exporting");
    let mut progress = |p: Progress| {
        bar.set_length(p.events_total);
        bar.set_position(p.events_done);
    };
    let (_, summary) = ntff::export::export(&files, &options, format, out, &mut progress)?;
    bar.finish_and_clear();
    let target = args.output_file.as_ref().map_or("stdout".to_string(), |p| p.display().to_string());
    eprintln!(
        "wrote {} slices ({} device), {} instants, {} counter values and {} flows on {} tracks of {} processes to {target}: {} bytes",
        summary.slices(),
        summary.device_slices,
        summary.instants,
        summary.counter_values,
        summary.flows,
        summary.tracks,
        summary.processes,
        summary.bytes
    );
    for (path, offset) in paths.iter().zip(&summary.root_clock_offsets) {
        if let Some((offset_ns, uncertainty_ns)) = offset {
            eprintln!(
                "{}: moved onto rank 0's clock by {} (± {}), its clock offset as measured",
                path.display(),
                signed_duration(*offset_ns),
                neuron_datastore::ranks::format_ns(*uncertainty_ns)
            );
        }
    }
    if summary.collective_flows > 0 {
        eprintln!(
            "{} parts of collectives joined across the ranks by a flow each collective",
            summary.collective_flows
        );
    }
    for problem in summary.problems() {
        eprintln!("note: {problem}");
    }
    Ok(())
}

/// Writes each file's Parquet tables: into --output-file DIR for one file, into a
/// directory per file (named as the file, without `.ntff`) under it for --session-dir;
/// in the hive layout, every file's into DIR's partitions.
fn tables(args: &ViewArgs, paths: &[PathBuf]) -> Result<()> {
    let Some(out) = &args.output_file else {
        bail!("parquet output is a directory of tables: give --output-file DIR");
    };
    if args.system_trace_filter_event_type.is_some() {
        bail!(
            "--system-trace-filter-event-type does not apply to parquet output: every event is written; filter with SQL"
        );
    }
    if out.is_file() {
        bail!("{} is a file: parquet output is a directory of tables", out.display());
    }
    let started = std::time::Instant::now();
    let (mut events, mut bytes) = (0u64, 0u64);
    for path in paths {
        let file = NtffFile::open(path).with_context(|| format!("cannot read {}", path.display()))?;
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("profile").to_string();
        let layout = match args.parquet_layout {
            ParquetLayout::Directory => ntff::tables::Layout::Directory,
            ParquetLayout::Hive => ntff::tables::Layout::Hive,
        };
        let per_file = args.session_dir.is_some() && layout == ntff::tables::Layout::Directory;
        let dir = if per_file { out.join(&stem) } else { out.clone() };
        let options = ntff::tables::TablesOptions { cores: core_filter(args, &file)?, session: stem, layout };
        let bar = progress_bar("writing tables:");
        let mut progress = |p: Progress| {
            bar.set_length(p.events_total);
            bar.set_position(p.events_done);
        };
        let written = ntff::tables::write_tables(&file, &options, &dir, &mut progress)
            .with_context(|| format!("cannot write the tables of {} into {}", path.display(), dir.display()))?;
        bar.finish_and_clear();
        eprintln!("{}: {} events into {}/", path.display(), written.events, dir.display());
        for (name, rows, size) in &written.tables {
            eprintln!("  {name:<18} {rows:>12} rows {size:>14} bytes");
        }
        for problem in &written.problems {
            eprintln!("note: {}: {problem}", path.display());
        }
        events += written.events;
        bytes += written.bytes();
    }
    if paths.len() > 1 {
        eprintln!(
            "wrote the tables of {} files ({events} events, {bytes} bytes) under {} in {:.1} s",
            paths.len(),
            out.display(),
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// A bar of events done, for an export that says what it is `doing`.
fn progress_bar(doing: &str) -> indicatif::ProgressBar {
    let template =
        format!("{{spinner}} {doing} {{human_pos}}/{{human_len}} events [{{elapsed_precise}}] {{wide_bar}} {{eta}}");
    indicatif::ProgressBar::new(0).with_style(
        indicatif::ProgressStyle::with_template(&template).unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    )
}

/// The profiles of `dir` whose recording did not finish (`*.ntff.partial`), by name.
fn unfinished(dir: Option<&Path>) -> Result<Vec<ranks::Unfinished>> {
    let Some(dir) = dir else { return Ok(Vec::new()) };
    let found = ntff::unfinished_profiles(dir).with_context(|| format!("cannot list {}", dir.display()))?;
    Ok(found.into_iter().map(|(file, bytes)| ranks::Unfinished { file, bytes }).collect())
}

/// The `.ntff` files of `dir`, by name.
fn ntff_files_in(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "ntff"))
        .collect();
    files.sort();
    if files.is_empty() {
        bail!("{} holds no .ntff files", dir.display());
    }
    Ok(files)
}

/// `{"metadata": …, "models": […], "events": [system and device events], "losses":
/// […], "file_problems": […]}`, streamed chunk by chunk.
fn write_json(file: &NtffFile, cores: Option<&[u32]>, types: Option<&[String]>, out: &mut dyn Write) -> Result<()> {
    let types: Option<Vec<ntff::Sym>> =
        types.map(|t| t.iter().filter_map(|name| file.find_string(name.trim())).collect());
    let meta = file.metadata();
    let metadata = serde_json::json!({
        "runtime_version": meta.runtime_version,
        "tool": meta.tool,
        "capture_kind": meta.capture_kind,
        "capture_unix_ns": meta.capture_unix_ns,
        "instance_type": meta.instance_type,
        "pid": meta.pid,
        "process_tag": meta.process_tag,
        "peak_flops_per_core": meta.peak_flops_per_core,
        "defined_pe_flops_per_core": meta.defined_pe_flops_per_core,
        "defined_vector_flops_per_core": meta.defined_vector_flops_per_core,
        "defined_peak_basis": meta.defined_peak_basis,
        "warmup_executions": meta.warmup_executions,
        "command": meta.command,
        "host": meta.host,
    });
    let models: Vec<serde_json::Value> = file
        .models()
        .iter()
        .map(|m| serde_json::json!({"model_id": m.model_id, "core": m.core, "name": m.name, "neff_sha256": m.neff_sha256, "flops_per_execution": m.flops_per_execution}))
        .collect();
    write!(out, "{{\"metadata\":{metadata},\"models\":{},\"events\":[", serde_json::Value::Array(models))?;
    let mut first = true;
    let mut losses = Vec::new();
    let mut unreadable = Vec::new();
    // Events whose name, arguments or descriptor were lost with a damaged table.
    let (mut unnamed_system, mut undescribed_device) = (0u64, 0u64);
    for info in file.select(cores, None) {
        let chunk = match file.read_chunk(info) {
            Ok(chunk) => chunk,
            Err(e) => {
                let problem = ntff::summary::unreadable_chunk(info, &e);
                eprintln!("warning: {problem}");
                unreadable.push(problem);
                continue;
            }
        };
        for e in &chunk.system {
            if types.as_ref().is_some_and(|t| !t.contains(&e.name)) {
                continue;
            }
            let Some(event) = to_system_event(file, e) else {
                unnamed_system += 1;
                continue;
            };
            if !first {
                out.write_all(b",")?;
            }
            first = false;
            serde_json::to_writer(&mut *out, &event)?;
        }
        if types.is_none() {
            for e in &chunk.device {
                let Some(event) = to_device_event(file, e) else {
                    undescribed_device += 1;
                    continue;
                };
                if !first {
                    out.write_all(b",")?;
                }
                first = false;
                serde_json::to_writer(&mut *out, &event)?;
            }
        }
        losses.extend(chunk.losses.iter().map(|l| {
            serde_json::json!({"nc_idx": chunk.core, "ring": if l.device { "device" } else { "system" }, "events": l.events})
        }));
    }
    if unnamed_system + undescribed_device > 0 {
        let problem = format!(
            "{unnamed_system} system events and {undescribed_device} device events were left out: what they are (their \
             name, arguments or descriptor) was lost with a damaged string or descriptor table"
        );
        eprintln!("warning: {problem}");
        unreadable.push(problem);
    }
    write!(
        out,
        "],\"losses\":{},\"file_problems\":{}}}",
        serde_json::Value::Array(losses),
        serde_json::to_string(&file.recovery().describe().into_iter().chain(unreadable).collect::<Vec<_>>())?
    )?;
    writeln!(out)?;
    Ok(())
}

/// `ns` as a duration with its sign.
fn signed_duration(ns: i64) -> String {
    let sign = if ns < 0 { "−" } else { "+" };
    format!("{sign}{}", neuron_datastore::ranks::format_ns(ns.unsigned_abs()))
}
