//! What a computation passed to an instruction does: a reducer (a plain operation or a
//! general region of element-wise steps), a scatter combiner or a select-and-scatter
//! comparison.

use std::collections::HashMap;

use super::MAX_CALL_DEPTH;
use super::attributes::{array_type, attr, comparison_direction, comparison_type, literal_element, strip_percent};
use super::operators::elementwise_op;
use crate::dtype::DType;
use crate::hlo::{Computation, HloModule, Payload, Shape};
use crate::isa::{CompareDirection, ReduceOp, Region, RegionStep, RegionValue, ScatterCombine};

/// How a scatter region combines: `(a, b) -> b` replaces, otherwise a reduction.
pub(super) fn scatter_combine(region: &Computation) -> Result<ScatterCombine, String> {
    let root = &region.instructions[region.root];
    if root.opcode == "parameter" {
        return match root.payload {
            Some(Payload::ParameterNumber(1)) => Ok(ScatterCombine::Replace),
            _ => {
                Err(format!("scatter computation `{}` returns its first parameter; nothing would change", region.name))
            }
        };
    }
    reduction_kind(region).map(ScatterCombine::Reduce)
}

/// Lowers a reducer computation whose parameters have the element types `params`.
/// Calls inside it (JAX wraps `jnp.where` and friends in them) are inlined.
pub(super) fn lower_region(module: &HloModule, region: &Computation, params: &[DType]) -> Result<Region, String> {
    let mut steps: Vec<RegionStep> = Vec::new();
    let args: Vec<Scalarish> =
        (0..params.len()).map(|p| Scalarish::Scalar(RegionValue::Parameter(p as u32), params[p])).collect();
    let results = match inline(module, region, &args, &mut steps, 0)? {
        Scalarish::Scalar(v, _) => vec![v],
        Scalarish::Tuple(parts) => parts
            .into_iter()
            .map(|p| match p {
                Scalarish::Scalar(v, _) => Ok(v),
                Scalarish::Tuple(_) => Err("a reducer result is a nested tuple".to_string()),
            })
            .collect::<Result<_, _>>()?,
    };
    let region = Region { params: params.to_vec(), steps, results };
    region.check().map_err(|e| e.to_string())?;
    Ok(region)
}

/// A value inside a reducer: a scalar and its element type, or a tuple of values.
#[derive(Debug, Clone)]
enum Scalarish {
    Scalar(RegionValue, DType),
    Tuple(Vec<Scalarish>),
}

/// Lowers `computation` with its parameters bound to `args`, appending its steps;
/// returns its root's value.
fn inline(
    module: &HloModule,
    computation: &Computation,
    args: &[Scalarish],
    steps: &mut Vec<RegionStep>,
    depth: usize,
) -> Result<Scalarish, String> {
    if depth > MAX_CALL_DEPTH {
        return Err(format!("calls nest deeper than {MAX_CALL_DEPTH} in a reducer"));
    }
    let mut values: HashMap<&str, Scalarish> = HashMap::new();
    for inst in &computation.instructions {
        let at = |e: String| format!("`{}` (line {}): {e}", inst.name, inst.line);
        let scalar = || -> Result<DType, String> {
            let ty = array_type(&inst.shape).map_err(at)?;
            if ty.rank() != 0 {
                return Err(at(format!("reducers work on scalars, not {ty}")));
            }
            Ok(ty.dtype)
        };
        let operands = || -> Result<Vec<Scalarish>, String> {
            inst.operands
                .iter()
                .map(|o| values.get(strip_percent(o)).cloned())
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| at("an operand is not defined before this instruction".into()))
        };
        let value = match inst.opcode.as_str() {
            "parameter" => {
                let Some(Payload::ParameterNumber(n)) = inst.payload else {
                    return Err(at("parameter without a number".into()));
                };
                let arg = args
                    .get(n as usize)
                    .cloned()
                    .ok_or_else(|| at(format!("parameter({n}) but the reducer takes {} parameters", args.len())))?;
                if let Scalarish::Scalar(_, expected) = arg
                    && scalar()? != expected
                {
                    return Err(at(format!("parameter({n}) must be a {expected} scalar")));
                }
                arg
            }
            "constant" => {
                let dtype = scalar()?;
                let Some(Payload::Literal(tokens)) = &inst.payload else {
                    return Err(at("constant without a literal".into()));
                };
                let [token] = tokens.as_slice() else {
                    return Err(at("a scalar constant holds one value".into()));
                };
                let bytes =
                    literal_element(dtype, token).ok_or_else(|| at(format!("`{token}` is not a valid {dtype}")))?;
                let mut word = [0u8; 8];
                word[..bytes.len()].copy_from_slice(&bytes);
                Scalarish::Scalar(RegionValue::Constant { dtype, bits: u64::from_le_bytes(word) }, dtype)
            }
            "tuple" => Scalarish::Tuple(operands()?),
            "get-tuple-element" => {
                let index: usize = attr(inst, "index").map_err(at)?.parse().map_err(|_| at("bad `index`".into()))?;
                match operands()?.into_iter().next() {
                    Some(Scalarish::Tuple(parts)) => {
                        parts.get(index).cloned().ok_or_else(|| at(format!("index {index} is out of range")))?
                    }
                    _ => return Err(at("get-tuple-element of a value that is not a tuple".into())),
                }
            }
            "call" => {
                let name = strip_percent(attr(inst, "to_apply").map_err(at)?);
                let callee =
                    module.computation(name).ok_or_else(|| at(format!("calls `{name}`, which is not defined")))?;
                inline(module, callee, &operands()?, steps, depth + 1)?
            }
            _ => {
                let mut scalars = Vec::new();
                let mut dtypes = Vec::new();
                for operand in operands()? {
                    match operand {
                        Scalarish::Scalar(v, d) => {
                            scalars.push(v);
                            dtypes.push(d);
                        }
                        Scalarish::Tuple(_) => return Err(at(format!("`{}` of a tuple", inst.opcode))),
                    }
                }
                let op = elementwise_op(inst, &dtypes).map_err(at)?.ok_or_else(|| {
                    at(format!("`{}` is not supported in a reducer (element-wise operations only)", inst.opcode))
                })?;
                let dtype = scalar()?;
                steps.push(RegionStep { op, operands: scalars, dtype });
                Scalarish::Scalar(RegionValue::Step(steps.len() as u32 - 1), dtype)
            }
        };
        values.insert(&inst.name, value);
    }
    let root = &computation.instructions[computation.root];
    values.remove(root.name.as_str()).ok_or_else(|| format!("reducer result `{}` is not a value", root.name))
}

/// The comparison of a `select-and-scatter` selector `(a, b) -> compare(a, b)`:
/// the element `a` selected so far is kept over candidate `b` while it holds.
pub(super) fn select_comparison(region: &Computation) -> Result<(CompareDirection, bool), String> {
    let root = &region.instructions[region.root];
    let param = |name: &str| {
        region.instructions.iter().find(|i| i.name == strip_percent(name)).and_then(|i| match i.payload {
            Some(Payload::ParameterNumber(n)) if i.opcode == "parameter" => Some(n),
            _ => None,
        })
    };
    let order: Vec<Option<u64>> = root.operands.iter().map(|o| param(o)).collect();
    let bad = || {
        format!(
            "select computation `{}` must be a comparison of its two parameters (such as GE for max pooling)",
            region.name
        )
    };
    if root.opcode != "compare" || region.instructions.len() != 3 {
        return Err(bad());
    }
    let direction = comparison_direction(attr(root, "direction")?)?;
    let direction = match order.as_slice() {
        [Some(0), Some(1)] => direction,
        // compare(b, a): the mirrored direction.
        [Some(1), Some(0)] => match direction {
            CompareDirection::Lt => CompareDirection::Gt,
            CompareDirection::Le => CompareDirection::Ge,
            CompareDirection::Gt => CompareDirection::Lt,
            CompareDirection::Ge => CompareDirection::Le,
            symmetric => symmetric,
        },
        _ => return Err(bad()),
    };
    let compared = region
        .instructions
        .iter()
        .find(|i| i.opcode == "parameter")
        .map(|p| array_type(&p.shape))
        .transpose()?
        .map_or(DType::F32, |t| t.dtype);
    Ok((direction, comparison_type(root, compared)?))
}

/// Recognises a reduction region `(a, b) -> op(a, b)`.
pub(super) fn reduction_kind(region: &Computation) -> Result<ReduceOp, String> {
    let root = &region.instructions[region.root];
    let params: Vec<&str> =
        region.instructions.iter().filter(|i| i.opcode == "parameter").map(|i| i.name.as_str()).collect();
    let operands: Vec<&str> = root.operands.iter().map(|o| strip_percent(o)).collect();
    let plain = region.instructions.len() == 3
        && params.len() == 2
        && operands.len() == 2
        && params.iter().all(|p| operands.contains(p));
    let on_pred = matches!(&root.shape, Shape::Array { element_type, .. } if element_type == "pred");
    let kind = match root.opcode.as_str() {
        "add" => Some(ReduceOp::Add),
        "multiply" => Some(ReduceOp::Multiply),
        "maximum" => Some(ReduceOp::Maximum),
        "minimum" => Some(ReduceOp::Minimum),
        // On pred, `or` is the maximum and `and` the minimum.
        "or" if on_pred => Some(ReduceOp::Maximum),
        "and" if on_pred => Some(ReduceOp::Minimum),
        _ => None,
    };
    match kind {
        Some(kind) if plain => Ok(kind),
        _ => Err(format!(
            "computation `{}` is not a plain add, multiply, maximum or minimum (or, on pred, `or` and `and`) of its two parameters",
            region.name
        )),
    }
}
