//! JAX's multi-device programs (Shardy, `xla.sdy`) as the program of one rank.
//!
//! `jax.jit(jax.shard_map(f, mesh=…))` lowers to an entry that takes the global arrays,
//! cuts them into each device's shard (`xla.sdy.GlobalToLocalShape`, whose
//! `xla.sdy.in_shardings` say how), calls `f` on the shards (the computation
//! `xla.sdy.manual_computation_body.N`, whose collectives name global device ids), and
//! joins the results (`xla.sdy.LocalToGlobalShape`, `xla.sdy.out_shardings`). A
//! NeuronCore runs one rank of that: [`localize`] rewrites the entry so that its
//! parameters and results are the rank's shards and it calls the body on them, which
//! then lowers as any other program. What sits outside the manual computation would
//! need XLA's automatic partitioner, so it is refused with the instruction named.
//!
//! The mesh comes from the module's `xla.sdy.meshes` attribute (`mesh =
//! #sdy.mesh<["dp"=4]>`), each value's sharding from `<@mesh, [{"dp"}, {}]>`: per
//! dimension, the mesh axes it is split over.

use std::collections::HashMap;
use std::fmt;

use crate::hlo::{Computation, HloModule, Instruction, Payload, Shape};

const GLOBAL_TO_LOCAL: &str = "xla.sdy.GlobalToLocalShape";
const LOCAL_TO_GLOBAL: &str = "xla.sdy.LocalToGlobalShape";
/// Marks a result's sharding; the value passes through.
const RESULT_SHARDING: &str = "xla.sdy.FuncResultSharding";

/// How a Shardy program splits its values over a mesh of devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sharding {
    /// The mesh's axes and their sizes, in order: `[("dp", 4)]`.
    pub mesh: Vec<(String, u64)>,
    /// Each entry parameter, in parameter order.
    pub inputs: Vec<ShardedValue>,
    /// Each result, in order.
    pub outputs: Vec<ShardedValue>,
}

impl Sharding {
    /// How many devices (ranks) the mesh has.
    pub fn devices(&self) -> u64 {
        self.mesh.iter().map(|(_, size)| size).product()
    }
}

/// One parameter or result: its global shape, the shard each rank holds, and the mesh
/// axes each dimension is split over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardedValue {
    pub global: String,
    pub local: String,
    /// Per dimension, the mesh axes it is split over (empty: whole).
    pub axes: Vec<Vec<String>>,
}

impl fmt::Display for ShardedValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dims: Vec<String> =
            self.axes.iter().map(|axes| if axes.is_empty() { "·".to_owned() } else { axes.join("×") }).collect();
        write!(f, "{} split [{}] → {} per rank", self.global, dims.join(", "), self.local)
    }
}

/// The module with its entry rewritten to run one rank of a Shardy manual computation,
/// and how it shards; `None` when the module has no `xla.sdy.GlobalToLocalShape` (an
/// ordinary program). Errors name the instruction.
pub(crate) fn localize(module: &HloModule) -> Result<Option<(HloModule, Sharding)>, (usize, String)> {
    let entry = module.entry();
    let Some(split) = entry.instructions.iter().find(|i| target(i) == Some(GLOBAL_TO_LOCAL)) else {
        // Without a manual computation, values split over a mesh of several devices
        // would need XLA's automatic partitioner; replicated ones are one device's
        // program.
        return match automatically_sharded(module) {
            Some(inst) => Err((
                inst.line,
                format!(
                    "`{}` is split over the mesh by `jax.jit`'s shardings, which needs XLA's automatic SPMD \
                     partitioner; write the step with `jax.shard_map` so that each rank's program is explicit, \
                     or give it unsharded arrays to run on one core",
                    inst.name
                ),
            )),
            None => Ok(None),
        };
    };
    let fail = |inst: &Instruction, message: String| (inst.line, message);
    let mesh = mesh(module).ok_or_else(|| {
        fail(split, "the module has no `xla.sdy.meshes` attribute naming the mesh of its shardings".into())
    })?;
    // One operand gives its shard itself (as `jax.pmap` lowers), several a tuple.
    let local_shapes = match &split.shape {
        Shape::Tuple(parts) => parts.clone(),
        one => vec![one.clone()],
    };
    let in_axes = shardings(frontend_attribute(split, "xla.sdy.in_shardings").unwrap_or_default());
    let by_name: HashMap<&str, &Instruction> = entry.instructions.iter().map(|i| (i.name.as_str(), i)).collect();

    // Each parameter becomes its shard.
    let mut shapes: HashMap<String, Shape> = HashMap::new();
    let mut alias: HashMap<String, String> = HashMap::new();
    let mut instructions = Vec::new();
    let mut inputs = Vec::new();
    for (k, operand) in split.operands.iter().enumerate() {
        let parameter = by_name.get(operand.as_str()).filter(|p| p.opcode == "parameter").ok_or_else(|| {
            fail(split, format!("`{GLOBAL_TO_LOCAL}` takes `{operand}`, which is not a parameter of the entry"))
        })?;
        let local = local_shapes.get(k).cloned().ok_or_else(|| fail(split, "fewer shards than operands".into()))?;
        let number = match parameter.payload {
            Some(Payload::ParameterNumber(number)) => number,
            _ => k as u64,
        };
        inputs.push((
            number,
            ShardedValue {
                global: parameter.shape.to_string(),
                local: local.to_string(),
                axes: in_axes.get(k).cloned().unwrap_or_default(),
            },
        ));
        shapes.insert(parameter.name.clone(), local.clone());
        instructions.push(Instruction { shape: local, ..(*parameter).clone() });
    }
    // In parameter order, whatever the order of the shards.
    inputs.sort_by_key(|(number, _)| *number);
    let inputs: Vec<ShardedValue> = inputs.into_iter().map(|(_, value)| value).collect();
    if let Some(unused) =
        entry.instructions.iter().find(|i| i.opcode == "parameter" && !split.operands.contains(&i.name))
    {
        return Err(fail(
            unused,
            format!("parameter `{}` is not an input of the manual computation (`jax.shard_map`)", unused.name),
        ));
    }

    if !matches!(split.shape, Shape::Tuple(_)) {
        alias.insert(split.name.clone(), split.operands.first().cloned().unwrap_or_default());
    }
    let mut out_axes = Vec::new();
    for inst in &entry.instructions {
        let renamed = |name: &String| alias.get(name).cloned().unwrap_or_else(|| name.clone());
        let shape_of = |shapes: &HashMap<String, Shape>, name: &String| {
            shapes
                .get(name)
                .cloned()
                .ok_or_else(|| fail(inst, format!("`{}` reads `{name}`, defined after it", inst.name)))
        };
        match (inst.opcode.as_str(), target(inst)) {
            ("parameter", _) => {}
            (_, Some(GLOBAL_TO_LOCAL)) => {}
            ("get-tuple-element", _) if inst.operands.first() == Some(&split.name) => {
                let index =
                    tuple_index(inst).ok_or_else(|| fail(inst, "a `get-tuple-element` without an index".into()))?;
                let operand = split.operands.get(index).ok_or_else(|| fail(inst, format!("no shard {index}")))?;
                alias.insert(inst.name.clone(), operand.clone());
            }
            (_, Some(LOCAL_TO_GLOBAL)) => {
                out_axes = shardings(frontend_attribute(inst, "xla.sdy.out_shardings").unwrap_or_default());
                match inst.operands.as_slice() {
                    [one] => {
                        alias.insert(inst.name.clone(), renamed(one));
                    }
                    many => {
                        let operands: Vec<String> = many.iter().map(renamed).collect();
                        let parts = operands.iter().map(|o| shape_of(&shapes, o)).collect::<Result<_, _>>()?;
                        let shape = Shape::Tuple(parts);
                        shapes.insert(inst.name.clone(), shape.clone());
                        instructions.push(Instruction { shape, opcode: "tuple".into(), operands, ..inst.clone() });
                    }
                }
            }
            (_, Some(RESULT_SHARDING)) if inst.operands.len() == 1 => {
                alias.insert(inst.name.clone(), renamed(&inst.operands[0]));
            }
            ("call" | "tuple" | "get-tuple-element", None) => {
                let operands: Vec<String> = inst.operands.iter().map(renamed).collect();
                let shape = match inst.opcode.as_str() {
                    "call" => inst.shape.clone(),
                    "tuple" => Shape::Tuple(operands.iter().map(|o| shape_of(&shapes, o)).collect::<Result<_, _>>()?),
                    _ => match (&shape_of(&shapes, operands.first().unwrap_or(&inst.name))?, tuple_index(inst)) {
                        (Shape::Tuple(parts), Some(index)) if index < parts.len() => parts[index].clone(),
                        _ => return Err(fail(inst, format!("`{}` reads no element of a tuple", inst.name))),
                    },
                };
                if inst.opcode == "call"
                    && !called(inst).is_some_and(|c| c.starts_with("xla.sdy.manual_computation_body"))
                {
                    return Err(outside(inst));
                }
                shapes.insert(inst.name.clone(), shape.clone());
                instructions.push(Instruction { shape, operands, ..inst.clone() });
            }
            _ => return Err(outside(inst)),
        }
    }
    let root_name = &entry.instructions[entry.root].name;
    let root_name = alias.get(root_name).cloned().unwrap_or_else(|| root_name.clone());
    let root = instructions.iter().position(|i| i.name == root_name).ok_or_else(|| {
        fail(
            &entry.instructions[entry.root],
            "the entry returns a value that is not a result of the manual computation".into(),
        )
    })?;
    let result_shapes = match &instructions[root].shape {
        Shape::Tuple(parts) => parts.clone(),
        one => vec![one.clone()],
    };
    let outputs = result_shapes
        .iter()
        .enumerate()
        .map(|(k, local)| {
            let axes: Vec<Vec<String>> = out_axes.get(k).cloned().unwrap_or_default();
            ShardedValue { global: global_shape(local, &axes, &mesh).to_string(), local: local.to_string(), axes }
        })
        .collect();

    let mut localized = module.clone();
    localized.computations[module.entry] = Computation { instructions, root, ..entry.clone() };
    Ok(Some((localized, Sharding { mesh, inputs, outputs })))
}

/// The first instruction whose Shardy sharding splits a dimension over a mesh of more
/// than one device, outside any manual computation.
fn automatically_sharded(module: &HloModule) -> Option<&Instruction> {
    let devices: u64 = mesh(module)?.iter().map(|(_, size)| size).product();
    if devices <= 1 {
        return None;
    }
    module.computations.iter().flat_map(|c| &c.instructions).find(|inst| {
        frontend_attribute(inst, "xla.sdy.sharding")
            .is_some_and(|text| shardings(text).iter().flatten().any(|axes| !axes.is_empty()))
    })
}

fn outside(inst: &Instruction) -> (usize, String) {
    (
        inst.line,
        format!(
            "`{}` ({}) runs on the global arrays outside the manual computation, which needs XLA's automatic \
             SPMD partitioner; write the whole step inside `jax.shard_map` so that each rank's program is explicit",
            inst.name, inst.opcode
        ),
    )
}

fn target(inst: &Instruction) -> Option<&str> {
    (inst.opcode == "custom-call").then(|| inst.attribute("custom_call_target").map(|t| t.trim_matches('"')))?
}

fn called(inst: &Instruction) -> Option<&str> {
    inst.attribute("to_apply").map(|name| name.trim_start_matches('%'))
}

fn tuple_index(inst: &Instruction) -> Option<usize> {
    inst.attribute("index")?.trim().parse().ok()
}

/// The value of `key` inside an instruction's `frontend_attributes={…}`, unquoted and
/// unescaped.
fn frontend_attribute(inst: &Instruction, key: &str) -> Option<String> {
    let text = inst.attribute("frontend_attributes")?;
    let start = text.find(&format!("{key}=\""))? + key.len() + 2;
    let mut value = String::new();
    let mut chars = text[start..].chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => value.extend(chars.next()),
            '"' => return Some(value),
            c => value.push(c),
        }
    }
    None
}

/// The mesh of the module's `xla.sdy.meshes`: its axes and their sizes.
fn mesh(module: &HloModule) -> Option<Vec<(String, u64)>> {
    let text = module.attribute("frontend_attributes")?;
    let start = text.find("#sdy.mesh<[")? + "#sdy.mesh<[".len();
    let end = start + text[start..].find("]>")?;
    text[start..end]
        .split(',')
        .map(|axis| {
            let (name, size) = axis.split_once('=')?;
            Some((name.trim().trim_matches(|c| c == '"' || c == '\\').to_owned(), size.trim().parse().ok()?))
        })
        .collect()
}

/// Each value's axes per dimension, from `#sdy.sharding_per_value<[<@mesh, [{"dp"},
/// {}]>, …]>`.
fn shardings(text: String) -> Vec<Vec<Vec<String>>> {
    text.split("<@")
        .skip(1)
        .map(|value| {
            let dims = value.split_once('[').map_or("", |(_, rest)| rest);
            let dims = dims.split(']').next().unwrap_or("");
            dims.split('}')
                .filter_map(|dim| {
                    let axes = dim.split_once('{')?.1;
                    Some(
                        axes.split(',')
                            .map(|a| a.trim().trim_matches('"').to_owned())
                            .filter(|a| !a.is_empty() && !a.starts_with('?'))
                            .collect(),
                    )
                })
                .collect()
        })
        .collect()
}

/// The global shape of a shard split as `axes` says over `mesh`.
fn global_shape(local: &Shape, axes: &[Vec<String>], mesh: &[(String, u64)]) -> Shape {
    match local {
        Shape::Array { element_type, dims } => Shape::Array {
            element_type: element_type.clone(),
            dims: dims
                .iter()
                .enumerate()
                .map(|(d, &size)| {
                    let split: u64 = axes
                        .get(d)
                        .into_iter()
                        .flatten()
                        .map(|axis| mesh.iter().find(|(name, _)| name == axis).map_or(1, |(_, n)| *n))
                        .product();
                    size * split
                })
                .collect(),
        },
        tuple => tuple.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hlo::parse_module;

    /// A manual computation whose shards are taken in another order than the parameters.
    const SWAPPED: &str = r##"HloModule m, frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<["x"=2]>}}

xla.sdy.manual_computation_body.1 {
  a = f32[2]{0} parameter(0)
  b = f32[4]{0} parameter(1)
  ROOT r = f32[2]{0} slice(b), slice={[0:2]}
}

ENTRY e {
  p0 = f32[4]{0} parameter(0)
  p1 = f32[8]{0} parameter(1)
  s = (f32[4]{0}, f32[2]{0}) custom-call(p1, p0), custom_call_target="xla.sdy.GlobalToLocalShape", frontend_attributes={xla.sdy.in_shardings="#sdy.sharding_per_value<[<@mesh, [{\"x\"}]>, <@mesh, [{}]>]>"}
  b = f32[4]{0} get-tuple-element(s), index=0
  a = f32[2]{0} get-tuple-element(s), index=1
  c = f32[2]{0} call(a, b), to_apply=xla.sdy.manual_computation_body.1
  ROOT g = f32[4]{0} custom-call(c), custom_call_target="xla.sdy.LocalToGlobalShape", frontend_attributes={xla.sdy.out_shardings="#sdy.sharding_per_value<[<@mesh, [{\"x\"}]>]>"}
}
"##;

    #[test]
    fn inputs_are_described_in_parameter_order_with_their_own_splits() {
        let module = parse_module(SWAPPED).expect("parses");
        let (rank, sharding) = localize(&module).expect("localizes").expect("a Shardy module");
        assert_eq!(sharding.mesh, [("x".to_owned(), 2)]);
        let described: Vec<(&str, &str)> =
            sharding.inputs.iter().map(|v| (v.global.as_str(), v.local.as_str())).collect();
        assert_eq!(described, [("f32[4]", "f32[2]"), ("f32[8]", "f32[4]")]);
        assert_eq!(sharding.inputs[1].axes, [vec!["x".to_owned()]]);
        assert_eq!(sharding.inputs[0].axes, [Vec::<String>::new()]);
        // The output is split too: its global shape is twice the shard.
        assert_eq!((sharding.outputs[0].local.as_str(), sharding.outputs[0].global.as_str()), ("f32[2]", "f32[4]"));
        // The rank's entry takes the shards as its parameters, and returns the body's result.
        let entry = rank.entry();
        let parameters: Vec<String> =
            entry.instructions.iter().filter(|i| i.opcode == "parameter").map(|i| i.shape.to_string()).collect();
        assert_eq!(parameters, ["f32[4]", "f32[2]"]);
        assert_eq!(entry.instructions[entry.root].opcode, "call");
    }
}
