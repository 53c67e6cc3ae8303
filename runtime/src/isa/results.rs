//! Instructions that write several buffers: loops and conditionals (their state or
//! their branch's results), `TopK` (values and positions), and `Sort` and
//! `ReduceWindow` of several arrays. Their results occupy the [`Op::result_count`]
//! consecutive buffers from `Instruction::output`, and [`check_results`] checks any
//! instruction against the types of all the buffers it writes.

use super::control::check_control;
use super::*;

impl Op {
    /// How many buffers the instruction writes, from its `output` on.
    pub fn result_count(&self) -> usize {
        match self {
            Op::While(l) => l.body.outputs.len(),
            Op::Conditional(c) => c.branches.first().map_or(0, |b| b.outputs.len()),
            Op::TopK { .. } => 2,
            Op::Sort { comparator, .. } => comparator.params.len() / 2,
            Op::ReduceWindow { region, .. } => region.results.len(),
            _ => 1,
        }
    }
}

/// Checks any instruction against its operand types and the types of the buffers it
/// writes: [`infer_output`] for single-result operations; for loops and conditionals,
/// the nested programs are valid, take the operands' types and return the results'.
pub fn check_results(op: &Op, operands: &[&ArrayType], results: &[&ArrayType]) -> Result<(), TypeError> {
    match op {
        Op::While(_) | Op::Conditional(_) => check_control(op, operands, results).map_err(TypeError),
        Op::TopK { k, .. } => check_top_k(*k, operands, results).map_err(TypeError),
        Op::Sort { dim, comparator } => check_sort(*dim, comparator, operands, results).map_err(TypeError),
        Op::ReduceWindow { window, region } => {
            check_reduce_window(window, region, operands, results).map_err(TypeError)
        }
        _ => {
            let [declared] = results else {
                return Err(TypeError(format!("{} writes one buffer, not {}", op.opcode(), results.len())));
            };
            let inferred = infer_output(op, operands, declared)?;
            if &inferred != *declared {
                return Err(TypeError(format!(
                    "{} produces {inferred} but its output buffer is {declared}",
                    op.opcode()
                )));
            }
            Ok(())
        }
    }
}

/// `Sort`: arrays of one shape with `dim` among their dimensions, a comparator of
/// two parameters per array that returns `pred`, and results of the arrays' types.
fn check_sort(dim: u32, comparator: &Region, operands: &[&ArrayType], results: &[&ArrayType]) -> Result<(), String> {
    let Some(first) = operands.first() else { return Err("sort takes at least one array".into()) };
    if dim as usize >= first.rank() || operands.iter().any(|a| a.dims != first.dims) {
        return Err(format!("sort along dimension {dim} needs arrays of one shape with that dimension, got {first}"));
    }
    let params: Vec<DType> = operands.iter().flat_map(|a| [a.dtype, a.dtype]).collect();
    if comparator.params != params || comparator.check().map_err(|e| e.0)? != [DType::Pred] {
        return Err("the comparator must take two elements of each array and return one pred".into());
    }
    if results != operands {
        return Err("a sort returns arrays of its operands' types".into());
    }
    Ok(())
}

/// `TopK`: one array of rank 1 or more whose last dimension holds at least `k`
/// elements; values of its type and `s32` positions, `k` per row.
fn check_top_k(k: u64, operands: &[&ArrayType], results: &[&ArrayType]) -> Result<(), String> {
    let [x] = operands else { return Err(format!("top-k takes one operand, got {}", operands.len())) };
    let Some(&n) = x.dims.last() else { return Err(format!("top-k of a scalar {x}")) };
    if k > n || x.dtype == DType::Pred {
        return Err(format!("top-{k} of {x}: needs a numeric array with at least {k} elements per row"));
    }
    let mut dims = x.dims.clone();
    if let Some(last) = dims.last_mut() {
        *last = k;
    }
    let expected = [ArrayType::new(x.dtype, dims.clone()), ArrayType::new(DType::S32, dims)];
    if results.len() != 2 || results.iter().zip(&expected).any(|(a, b)| *a != b) {
        return Err(format!("top-{k} of {x} gives ({}, {})", expected[0], expected[1]));
    }
    Ok(())
}

/// `ReduceWindow`: `n` arrays of one shape and their scalar initial values, a reducer
/// of `2n` parameters of their types, and `n` results of the windows' shape.
fn check_reduce_window(
    window: &DilatedWindow,
    region: &Region,
    operands: &[&ArrayType],
    results: &[&ArrayType],
) -> Result<(), String> {
    let n = operands.len() / 2;
    if n == 0 || operands.len() != 2 * n {
        return Err(format!(
            "reduce-window takes arrays and as many initial values, got {} operand(s)",
            operands.len()
        ));
    }
    let (arrays, inits) = operands.split_at(n);
    let dims = &arrays[0].dims;
    let rank = dims.len();
    let w = &window.window;
    if [w.size.len(), w.stride.len(), w.pad_low.len(), w.pad_high.len()]
        .into_iter()
        .chain([window.base_dilation.len(), window.window_dilation.len()])
        .any(|l| l != rank)
    {
        return Err(format!("the window has the wrong rank for {}", arrays[0]));
    }
    for (a, i) in arrays.iter().zip(inits) {
        if &a.dims != dims || i.rank() != 0 || i.dtype != a.dtype {
            return Err(format!(
                "reduce-window of {a} with initial value {i}: arrays must share a shape, and each initial value must be a scalar of its array's type"
            ));
        }
    }
    let params: Vec<DType> = arrays.iter().chain(arrays.iter()).map(|a| a.dtype).collect();
    if region.params != params {
        return Err("the reducer's parameters do not match the arrays".into());
    }
    let produced = region.check().map_err(|e| e.0)?;
    let counts = window.counts(dims).ok_or("a window size, stride or dilation is zero, or the windows overflow")?;
    let expected: Vec<ArrayType> = arrays.iter().map(|a| ArrayType::new(a.dtype, counts.clone())).collect();
    if produced.iter().zip(arrays).any(|(p, a)| *p != a.dtype) || produced.len() != n {
        return Err("the reducer must return one value of each array's type".into());
    }
    if results.len() != n || results.iter().zip(&expected).any(|(r, e)| *r != e) {
        let list = expected.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ");
        return Err(format!("reduce-window of {} gives ({list})", arrays[0]));
    }
    Ok(())
}
