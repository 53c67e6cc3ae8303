//! The graphs a framework compiled in this process, so that a graph compiled after the
//! first executions (torch-xla's recompilation: a new input shape, a changed Python
//! branch) can be said in the trace with what made it new and where it came from.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::hlo_text::framework_operation;
use crate::proto::{HloModuleProto, ProgramShapeProto};

/// One compiled graph: its name and its parameters' and result's shapes as text.
struct Seen {
    name: String,
    parameters: Vec<String>,
    result: String,
}

/// The process's executions and compiled graphs.
#[derive(Default)]
pub(crate) struct Graphs {
    executions: AtomicU64,
    seen: Mutex<Vec<Seen>>,
}

impl Graphs {
    /// Counts one execution.
    pub(crate) fn executed(&self) {
        self.executions.fetch_add(1, Ordering::Relaxed);
    }

    /// Notes a compiled graph; returns the executions run before it and what to say of
    /// it: its name and hash, and, after the first executions, what differs from the
    /// closest earlier graph (the same number of parameters, the fewest shapes apart)
    /// or that no earlier graph resembles it, with the framework's source of the
    /// difference.
    pub(crate) fn compiled(&self, module: &HloModuleProto, shape: &ProgramShapeProto, hash: &str) -> (u64, String) {
        let before = self.executions.load(Ordering::Relaxed);
        let text = |s: &crate::proto::ShapeProto| crate::hlo_text::shape_text(s).unwrap_or_else(|e| e);
        let parameters: Vec<String> = shape.parameters.iter().map(text).collect();
        let result = shape.result.as_ref().map(text).unwrap_or_default();
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let mut detail = format!("graph {} ({hash})", module.name);
        if before > 0 {
            let closest = seen
                .iter()
                .filter(|s| s.parameters.len() == parameters.len())
                .map(|s| (s, s.parameters.iter().zip(&parameters).filter(|(a, b)| a != b).count()))
                .min_by_key(|(_, differ)| *differ);
            match closest {
                Some((earlier, differ)) if differ > 0 => {
                    let changes: Vec<String> = earlier
                        .parameters
                        .iter()
                        .zip(&parameters)
                        .enumerate()
                        .filter(|(_, (a, b))| a != b)
                        .take(3)
                        .map(|(k, (a, b))| {
                            let origin = parameter_origin(module, k).map(|o| format!(" ({o})")).unwrap_or_default();
                            format!("parameter {k} {a} -> {b}{origin}")
                        })
                        .collect();
                    let more = if differ > 3 { format!(" and {} more", differ - 3) } else { String::new() };
                    detail.push_str(&format!(
                        ": input shapes differ from {}'s: {}{more}",
                        earlier.name,
                        changes.join(", ")
                    ));
                }
                Some((earlier, _)) if earlier.result != result => {
                    detail.push_str(&format!(
                        ": the same input shapes as {}, its result {} -> {result} (a shape made inside the step)",
                        earlier.name, earlier.result
                    ));
                }
                Some((earlier, _)) => {
                    detail.push_str(&format!(": the same input shapes as {}, other operations", earlier.name));
                }
                None => detail.push_str(&format!(": a new graph of {} parameters", parameters.len())),
            }
            if let Some(origin) = first_operation(module) {
                detail.push_str(&format!("; its first operation {origin}"));
            }
        }
        seen.push(Seen { name: module.name.clone(), parameters, result });
        (before, detail)
    }
}

/// The framework operation that uses parameter `k` of the entry.
fn parameter_origin(module: &HloModuleProto, k: usize) -> Option<String> {
    let entry = module.computations.iter().find(|c| c.id == module.entry_computation_id)?;
    let parameter = entry.instructions.iter().find(|i| i.opcode == "parameter" && i.parameter_number == k as i64)?;
    entry
        .instructions
        .iter()
        .filter(|i| i.operand_ids.contains(&parameter.id))
        .find_map(framework_operation)
        .map(|s| format!("used by {s}"))
}

/// The entry's first framework operation with a source line.
fn first_operation(module: &HloModuleProto) -> Option<String> {
    let entry = module.computations.iter().find(|c| c.id == module.entry_computation_id)?;
    entry
        .instructions
        .iter()
        .filter(|i| i.opcode != "parameter" && i.opcode != "constant")
        .find_map(framework_operation)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{HloComputationProto, HloInstructionProto, OpMetadata, ShapeProto, primitive};

    fn graph(name: &str, rows: i64) -> (HloModuleProto, ProgramShapeProto) {
        let shape =
            |dims: &[i64]| ShapeProto { element_type: primitive::F32, dimensions: dims.to_vec(), ..Default::default() };
        let parameter = HloInstructionProto {
            id: 1,
            name: "p0.1".into(),
            opcode: "parameter".into(),
            shape: Some(shape(&[rows, 64])),
            ..Default::default()
        };
        let user = HloInstructionProto {
            id: 2,
            name: "dot.2".into(),
            opcode: "dot".into(),
            operand_ids: vec![1, 1],
            metadata: Some(OpMetadata {
                op_type: "aten__mm".into(),
                op_name: "aten__mm".into(),
                source_file: "/home/me/train.py".into(),
                source_line: 12,
            }),
            ..Default::default()
        };
        let program = ProgramShapeProto { parameters: vec![shape(&[rows, 64]), shape(&[64])], ..Default::default() };
        let module = HloModuleProto {
            name: name.into(),
            computations: vec![HloComputationProto {
                id: 3,
                instructions: vec![parameter, user],
                ..Default::default()
            }],
            entry_computation_id: 3,
            ..Default::default()
        };
        (module, program)
    }

    #[test]
    fn a_graph_compiled_after_executions_says_which_input_shapes_changed_and_where() {
        let graphs = Graphs::default();
        let (first, first_shape) = graph("SyncTensorsGraph.10", 32);
        assert_eq!(
            graphs.compiled(&first, &first_shape, "aaaa0000"),
            (0, "graph SyncTensorsGraph.10 (aaaa0000)".into())
        );
        for _ in 0..5 {
            graphs.executed();
        }
        let (second, second_shape) = graph("SyncTensorsGraph.11", 16);
        let (before, detail) = graphs.compiled(&second, &second_shape, "bbbb1111");
        assert_eq!(before, 5);
        assert_eq!(
            detail,
            "graph SyncTensorsGraph.11 (bbbb1111): input shapes differ from SyncTensorsGraph.10's: \
             parameter 0 f32[32,64] -> f32[16,64] (used by aten::mm at train.py:12); \
             its first operation aten::mm at train.py:12"
        );
    }
}
