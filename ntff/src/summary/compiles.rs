//! Graphs a framework compiled after the process's first executions (`graph_compile`
//! events with `executions_before` past [`RECOMPILED_AFTER`]): torch-xla's
//! recompilations, each a finding with what made the graph new and where.

use crate::{ArgValue, NtffFile, Sym, SystemEvent};

use super::Finding;

/// Executions after which a new graph is a recompilation, not one of the first steps'
/// graphs (torch-xla compiles a training loop's graphs over its first two or three
/// steps: the step, then the step with the optimizer's state).
pub const RECOMPILED_AFTER: u64 = 3;

/// What to do about recompilations.
const ADVICE: &str = "keep a step's input shapes fixed (pad the last batch or drop it: DataLoader(drop_last=True)) \
     and keep Python decisions on tensor values out of the step: each new shape or branch is a new graph to compile; \
     PT_XLA_DEBUG_LEVEL=2 makes torch-xla say why it compiles";

/// Gathers the recompilations of a file's system events.
pub(super) struct Gatherer {
    name: Option<Sym>,
    detail: Option<Sym>,
    before: Option<Sym>,
    compile: Option<Sym>,
    found: Vec<(String, u64, u64)>,
}

impl Gatherer {
    pub(super) fn new(file: &NtffFile) -> Gatherer {
        Gatherer {
            name: file.find_string("graph_compile"),
            detail: file.find_string("detail"),
            before: file.find_string("executions_before"),
            compile: file.find_string("compile_us"),
            found: Vec::new(),
        }
    }

    pub(super) fn system(&mut self, file: &NtffFile, e: &SystemEvent) {
        if self.name.is_none() || Some(e.name) != self.name {
            return;
        }
        let arg = |key: Option<Sym>| key.and_then(|k| e.args.iter().find(|a| a.key == k)).map(|a| a.value);
        let number = |key| match arg(key) {
            Some(ArgValue::U64(v)) => v,
            Some(ArgValue::I64(v)) => v.max(0) as u64,
            _ => 0,
        };
        let before = number(self.before);
        if before < RECOMPILED_AFTER {
            return;
        }
        let detail = match arg(self.detail) {
            Some(ArgValue::Str(sym)) => file.string_or_placeholder(sym).into_owned(),
            _ => String::new(),
        };
        self.found.push((detail, before, number(self.compile)));
    }

    /// A finding per recompilation; `total_s` is the profile's time, which their
    /// compile times are shares of.
    pub(super) fn findings(self, total_s: f64) -> Vec<Finding> {
        self.found
            .into_iter()
            .map(|(detail, before, compile_us)| {
                let graph = detail.strip_prefix("graph ").and_then(|d| d.split(' ').next()).unwrap_or("a graph");
                let saves_s = compile_us as f64 / 1e6;
                Finding {
                    kind: "recompilation".into(),
                    about: graph.to_owned(),
                    text: format!("graph recompiled after {before} executions: {detail}"),
                    evidence: if compile_us == 0 {
                        "taken from the compile cache".into()
                    } else {
                        format!("compiling it took {:.1} ms", saves_s * 1e3)
                    },
                    saves_s,
                    saves_percent: if total_s > 0.0 { (100.0 * saves_s / total_s).min(100.0) } else { 0.0 },
                    suggestion: Some(ADVICE.into()),
                }
            })
            .collect()
    }
}
