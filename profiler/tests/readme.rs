//! The README's shell blocks, as a reader runs them. Each block says what it is in an
//! HTML comment on the line before it, which GitHub does not show:
//!
//! - `<!-- readme: run -->`, optionally with `; expect "TEXT"` (any number): the block
//!   runs as written with `bash -eo pipefail` in a fresh directory holding the
//!   repository's `examples/`, with the workspace's tools first on `PATH`; it must
//!   succeed within `; within N s` (default 300) and print every `TEXT` the README
//!   claims next to it;
//! - `<!-- readme: synopsis -->`: usage lines; every `--flag` a line gives a tool is
//!   checked against that tool's (and subcommand's) `--help`;
//! - `<!-- readme: not run: WHY -->`: what cannot run in a test (a browser, a server
//!   of another project, a nightly toolchain, a command that runs until Ctrl-C), and why.
//!
//! A block with no comment fails the test: a new block must say which it is. The one
//! exception is the README's opening block, the newcomer's two commands (it builds the
//! release tools and runs the demo until Ctrl-C, which `profiler/tests/cli.rs` runs;
//! then the suite this test is part of), which nothing may precede.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use neuron_test_support::ci;

/// The workspace's command-line tools, as the README names them.
const TOOLS: &[&str] = &[
    "neuron-cc",
    "neuron-bench",
    "neuron-profile",
    "neuron-ls",
    "neuron-dashboard",
    "neuron-top",
    "neuron-monitor",
    "nccom-test",
];

#[derive(Debug)]
enum Kind {
    Run { expect: Vec<String>, within: Duration },
    Synopsis,
    NotRun,
}

#[derive(Debug)]
struct Block {
    line: usize,
    kind: Kind,
    text: String,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The README's shell blocks and what each says it is.
fn blocks() -> Vec<Block> {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let lines: Vec<&str> = readme.lines().collect();
    let mut blocks = Vec::new();
    let mut unmarked = Vec::new();
    let mut k = 0;
    while k < lines.len() {
        let fence = lines[k].trim_start();
        if !(fence == "```sh" || fence == "```bash") {
            k += 1;
            continue;
        }
        let end = (k + 1..lines.len()).find(|&j| lines[j].trim_start().starts_with("```")).expect("a closed block");
        let indent = lines[k].len() - fence.len();
        let text: Vec<&str> = lines[k + 1..end].iter().map(|l| l.get(indent..).unwrap_or(l.trim_start())).collect();
        let marker = k.checked_sub(1).map(|p| lines[p].trim()).unwrap_or_default();
        match marker.strip_prefix("<!-- readme: ").and_then(|m| m.strip_suffix(" -->")) {
            Some(what) => blocks.push(Block { line: k + 1, kind: kind(what, k + 1), text: text.join("\n") }),
            // The opening commands.
            None if blocks.is_empty() && unmarked.is_empty() && text.iter().any(|l| l.starts_with("cargo test")) => {
                blocks.push(Block { line: k + 1, kind: Kind::NotRun, text: text.join("\n") })
            }
            None => unmarked.push(k + 1),
        }
        k = end + 1;
    }
    assert!(
        unmarked.is_empty(),
        "README blocks at lines {unmarked:?} say nothing of themselves: put `<!-- readme: run -->`, \
         `<!-- readme: synopsis -->` or `<!-- readme: not run: WHY -->` on the line before each"
    );
    blocks
}

fn kind(what: &str, line: usize) -> Kind {
    let mut parts = what.split("; ");
    match parts.next() {
        Some("run") => {
            let (mut expect, mut within) = (Vec::new(), Duration::from_secs(300));
            for part in parts {
                if let Some(text) = part.strip_prefix("expect \"").and_then(|t| t.strip_suffix('"')) {
                    expect.push(text.to_owned());
                } else if let Some(seconds) = part.strip_prefix("within ").and_then(|t| t.strip_suffix(" s")) {
                    within = Duration::from_secs(seconds.parse().expect("seconds"));
                } else {
                    panic!("README line {line}: `{part}` is not `expect \"TEXT\"` or `within N s`");
                }
            }
            Kind::Run { expect, within }
        }
        Some("synopsis") => Kind::Synopsis,
        Some(not) if not.starts_with("not run: ") && not.len() > "not run: ".len() + 10 => Kind::NotRun,
        _ => panic!("README line {line}: `{what}` is not `run`, `synopsis` or `not run: WHY` (with a reason)"),
    }
}

/// A directory of links to the workspace's built tools, in this test's profile.
fn tools_dir(work: &Path) -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable");
    let built = exe.parent().and_then(Path::parent).expect("target/<profile>").to_path_buf();
    if TOOLS.iter().any(|t| !built.join(t).exists()) {
        // Built with the whole workspace (`cargo test --workspace`); otherwise now.
        let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
        cargo.args(["build", "--quiet", "--workspace", "--bins"]).current_dir(root());
        if !cfg!(debug_assertions) {
            cargo.arg("--release");
        }
        assert!(cargo.status().expect("runs cargo").success(), "cannot build the tools");
    }
    let bin = work.join("bin");
    std::fs::create_dir_all(&bin).expect("bin");
    for tool in TOOLS {
        std::os::unix::fs::symlink(built.join(tool), bin.join(tool)).expect("link");
    }
    bin
}

#[test]
fn every_readme_block_says_what_it_is_and_the_runnable_ones_run_as_written() {
    let blocks = blocks();
    let work = tempfile::tempdir().expect("tempdir");
    let bin = tools_dir(work.path());
    let (mut ran, mut skipped) = (0, 0);
    for block in &blocks {
        match &block.kind {
            Kind::Synopsis => check_synopsis(block, &bin),
            Kind::NotRun => {}
            Kind::Run { expect, within } => {
                if block.text.contains("mpirun") && Command::new("mpirun").arg("--version").output().is_err() {
                    ci::missing("no `mpirun` here", &format!("README line {}", block.line));
                    skipped += 1;
                    continue;
                }
                run(block, expect, *within, &bin);
                ran += 1;
            }
        }
    }
    eprintln!("{} README blocks: {ran} run, {skipped} skipped, the others checked or marked as not run", blocks.len());
    assert!(ran + skipped >= 3, "the README's runnable blocks: {blocks:#?}");
}

/// Runs `block` in a fresh directory as a reader would after cloning, with the tools on
/// `PATH` and a private lock and datastore directory.
fn run(block: &Block, expect: &[String], within: Duration, bin: &Path) {
    let dir = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::symlink(root().join("examples"), dir.path().join("examples")).expect("link examples");
    let datastores = dir.path().join(".datastores");
    std::fs::create_dir(&datastores).expect("datastores");
    std::fs::set_permissions(&datastores, std::os::unix::fs::PermissionsExt::from_mode(0o700)).expect("private");
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    // In a process group of its own, so that what it starts in the background goes too.
    let mut child = Command::new("bash")
        .process_group(0)
        .args(["-eo", "pipefail", "-c", &block.text])
        .current_dir(dir.path())
        .env("PATH", path)
        .env("NEURON_VIRT_LOCK_DIR", dir.path().join(".locks"))
        .env("NEURON_VIRT_DATASTORE_DIR", &datastores)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env_remove("NEURON_RT_VISIBLE_CORES")
        .env_remove("NEURON_RT_NUM_CORES")
        .env_remove("NEURON_VIRT_INSTANCE_TYPE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("bash");
    // Both pipes drained as the block writes, so that a long output does not stall it.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut text);
            }
            String::from_utf8_lossy(&text).into_owned()
        })
    };
    let out = drain(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let err = drain(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let group = format!("-{}", child.id());
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > within {
            let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
            let _ = child.wait();
            panic!("README line {}: still running after {within:?}:\n{}", block.line, block.text);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // What the block left running in the background ends with it.
    let _ = Command::new("kill").args(["-KILL", "--", &group]).stderr(Stdio::null()).status();
    let said = format!("{}{}", out.join().expect("stdout"), err.join().expect("stderr"));
    assert!(status.success(), "README line {} failed ({status}):\n{}\n---\n{said}", block.line, block.text);
    for text in expect {
        assert!(said.contains(text.as_str()), "README line {}: no `{text}` in what it printed:\n{said}", block.line);
    }
    eprintln!("README line {}: ran in {:.1} s", block.line, started.elapsed().as_secs_f64());
}

/// Every `--flag` a synopsis line gives one of the tools is in that tool's (and
/// subcommand's) `--help`.
fn check_synopsis(block: &Block, bin: &Path) {
    let mut current: Option<(String, Option<String>)> = None;
    let mut checked = 0;
    for line in block.text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some(first) = words.first() else { continue };
        if TOOLS.contains(first) {
            let sub =
                words.get(1).filter(|w| w.chars().all(|c| c.is_ascii_lowercase() || c == '-') && !w.starts_with('-'));
            current = Some((first.to_string(), sub.map(|s| s.to_string())));
        }
        let Some((tool, sub)) = &current else { continue };
        let mut help = Command::new(bin.join(tool));
        help.args(sub.iter()).arg("--help");
        let help = help.output().expect("--help");
        let help = String::from_utf8_lossy(&help.stdout).into_owned();
        let code = line.split('#').next().unwrap_or_default();
        for flag in code
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .filter(|w| w.starts_with("--") && w.len() > 2)
        {
            // The whole flag: `--json` is not `--json-output`.
            let whole = help
                .match_indices(flag)
                .any(|(at, _)| !help[at + flag.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '-'));
            assert!(
                whole,
                "README line {}: `{tool}{}` has no {flag} in its --help:\n{help}",
                block.line,
                sub.as_ref().map_or(String::new(), |s| format!(" {s}"))
            );
            checked += 1;
        }
    }
    assert!(checked > 0 || !block.text.contains("--"), "README line {}: no flag checked", block.line);
}
