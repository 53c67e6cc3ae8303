//! Output type inference: [`infer_output`] derives each operation's result type from
//! its operands (or says why they do not fit), for the compiler and for validation.

use super::*;

/// Why an instruction's operands do not fit its operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TypeError(pub String);

/// Formats must have at least one exponent bit and fit in f32's widths.
fn check_format(format: FloatFormat) -> Result<(), String> {
    let (exponent, mantissa) = format.widths();
    if !(1..=8).contains(&exponent) || mantissa > 23 {
        return Err(format!("float format {} needs 1 to 8 exponent bits and at most 23 mantissa bits", format.name()));
    }
    Ok(())
}

/// Derives (and checks) the output type of `op` applied to `operands`; `declared` is
/// the output buffer's type, which supplies what the operation does not determine
/// (the target of `Convert`, the shape of `Reshape` and `Iota`, ...).
pub fn infer_output(op: &Op, operands: &[&ArrayType], declared: &ArrayType) -> Result<ArrayType, TypeError> {
    infer(op, operands, declared).map_err(TypeError)
}

fn infer(op: &Op, operands: &[&ArrayType], declared: &ArrayType) -> Result<ArrayType, String> {
    let arity = |n: usize| -> Result<(), String> {
        if operands.len() == n {
            Ok(())
        } else {
            Err(format!("{} takes {n} operand(s), got {}", op.opcode(), operands.len()))
        }
    };
    let check_dims = |dims: &[u32], rank: usize, what: &str| -> Result<(), String> {
        let mut seen = vec![false; rank];
        for &d in dims {
            let d = d as usize;
            if d >= rank || std::mem::replace(&mut seen[d], true) {
                return Err(format!("{what} {dims:?} is not a set of distinct dimensions below rank {rank}"));
            }
        }
        Ok(())
    };
    match op {
        Op::MatMulRounded { dims, format, .. } => {
            check_format(*format)?;
            if operands.iter().any(|t| t.dtype != DType::F32) {
                return Err(format!("{} rounds f32 operands, not {} and {}", op.opcode(), operands[0], operands[1]));
            }
            infer(&Op::MatMul(dims.clone()), operands, declared)
        }
        Op::MatMul(d) => {
            arity(2)?;
            let (lhs, rhs) = (operands[0], operands[1]);
            if lhs.dtype != rhs.dtype || lhs.dtype == DType::Pred {
                return Err(format!("dot of {lhs} and {rhs}: operands must share a numeric type"));
            }
            // The result may be wider than the operands (JAX's `preferred_element_type`),
            // within the same family: floats to floats, integers to integers.
            let same_family = lhs.dtype.is_float() == declared.dtype.is_float() && declared.dtype != DType::Pred;
            let out_dtype = if same_family { declared.dtype } else { lhs.dtype };
            if d.lhs_batch.len() != d.rhs_batch.len() || d.lhs_contracting.len() != d.rhs_contracting.len() {
                return Err("dot: batch and contracting dimension lists must pair up".into());
            }
            let lhs_all: Vec<u32> = d.lhs_batch.iter().chain(&d.lhs_contracting).copied().collect();
            let rhs_all: Vec<u32> = d.rhs_batch.iter().chain(&d.rhs_contracting).copied().collect();
            check_dims(&lhs_all, lhs.rank(), "dot lhs batch+contracting dims")?;
            check_dims(&rhs_all, rhs.rank(), "dot rhs batch+contracting dims")?;
            for (l, r) in lhs_all.iter().zip(&rhs_all) {
                if lhs.dims[*l as usize] != rhs.dims[*r as usize] {
                    return Err(format!(
                        "dot: lhs dimension {l} ({}) does not match rhs dimension {r} ({})",
                        lhs.dims[*l as usize], rhs.dims[*r as usize]
                    ));
                }
            }
            let mut dims: Vec<u64> = d.lhs_batch.iter().map(|&i| lhs.dims[i as usize]).collect();
            let free = |t: &ArrayType, used: &[u32]| -> Vec<u64> {
                (0..t.rank() as u32).filter(|i| !used.contains(i)).map(|i| t.dims[i as usize]).collect()
            };
            dims.extend(free(lhs, &lhs_all));
            dims.extend(free(rhs, &rhs_all));
            Ok(ArrayType::new(out_dtype, dims))
        }
        Op::Convolution(c) => {
            arity(2)?;
            super::conv::infer_convolution(c, operands[0], operands[1], declared)
        }
        Op::Activation(_) => {
            arity(1)?;
            if !operands[0].dtype.is_float() {
                return Err(format!("{} needs a floating-point operand, got {}", op.opcode(), operands[0]));
            }
            Ok(operands[0].clone())
        }
        Op::Unary(u) => {
            arity(1)?;
            let dtype = operands[0].dtype;
            let fits = match u {
                UnaryOp::Negate | UnaryOp::Abs | UnaryOp::Sign => dtype != DType::Pred,
                UnaryOp::Ceil | UnaryOp::Floor | UnaryOp::RoundNearestEven | UnaryOp::RoundNearestAfz => {
                    dtype.is_float()
                }
                UnaryOp::Not => !dtype.is_float(),
                UnaryOp::IsFinite => dtype.is_float(),
                UnaryOp::PopCount | UnaryOp::CountLeadingZeros => !dtype.is_float() && dtype != DType::Pred,
            };
            if !fits {
                return Err(format!("{} is not defined on {}", op.opcode(), operands[0]));
            }
            if *u == UnaryOp::IsFinite {
                return Ok(ArrayType::new(DType::Pred, operands[0].dims.clone()));
            }
            Ok(operands[0].clone())
        }
        Op::Binary(b) => {
            arity(2)?;
            if operands[0] != operands[1] {
                return Err(format!("{} of {} and {}: operand types differ", op.opcode(), operands[0], operands[1]));
            }
            let dtype = operands[0].dtype;
            let fits = match b {
                BinaryOp::Maximum | BinaryOp::Minimum => true,
                BinaryOp::Add
                | BinaryOp::Subtract
                | BinaryOp::Multiply
                | BinaryOp::Divide
                | BinaryOp::Power
                | BinaryOp::Remainder => dtype != DType::Pred,
                BinaryOp::Atan2 => dtype.is_float(),
                BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => !dtype.is_float(),
                BinaryOp::ShiftLeft | BinaryOp::ShiftRightLogical | BinaryOp::ShiftRightArithmetic => {
                    dtype.is_integer()
                }
            };
            if !fits {
                return Err(format!("{} is not defined on {}", op.opcode(), operands[0]));
            }
            Ok(operands[0].clone())
        }
        Op::Compare { .. } => {
            arity(2)?;
            if operands[0] != operands[1] {
                return Err(format!("compare of {} and {}: operand types differ", operands[0], operands[1]));
            }
            Ok(ArrayType::new(DType::Pred, operands[0].dims.clone()))
        }
        Op::Select => {
            arity(3)?;
            let (pred, a, b) = (operands[0], operands[1], operands[2]);
            if a != b {
                return Err(format!("select branches differ: {a} and {b}"));
            }
            if pred.dtype != DType::Pred || (pred.rank() != 0 && pred.dims != a.dims) {
                return Err(format!("select predicate {pred} must be pred of shape {:?} or a scalar", a.dims));
            }
            Ok(a.clone())
        }
        Op::Convert => {
            arity(1)?;
            Ok(ArrayType::new(declared.dtype, operands[0].dims.clone()))
        }
        Op::Broadcast { dims } => {
            arity(1)?;
            let operand = operands[0];
            if dims.len() != operand.rank() {
                return Err(format!("broadcast dimensions {dims:?} do not match operand rank {}", operand.rank()));
            }
            check_dims(dims, declared.rank(), "broadcast dimensions")?;
            for (i, &d) in dims.iter().enumerate() {
                let (from, to) = (operand.dims[i], declared.dims[d as usize]);
                if from != to && from != 1 {
                    return Err(format!("broadcast: operand dimension {i} ({from}) cannot become {to}"));
                }
            }
            Ok(ArrayType::new(operand.dtype, declared.dims.clone()))
        }
        Op::Reshape => {
            arity(1)?;
            if operands[0].element_count() != declared.element_count() {
                return Err(format!("reshape of {} to {declared} changes the element count", operands[0]));
            }
            Ok(ArrayType::new(operands[0].dtype, declared.dims.clone()))
        }
        Op::Transpose { perm } => {
            arity(1)?;
            let operand = operands[0];
            if perm.len() != operand.rank() {
                return Err(format!("transpose permutation {perm:?} does not match rank {}", operand.rank()));
            }
            check_dims(perm, operand.rank(), "transpose permutation")?;
            Ok(ArrayType::new(operand.dtype, perm.iter().map(|&p| operand.dims[p as usize]).collect()))
        }
        Op::ReduceRounded { op: reduce, dims, format, .. } => {
            check_format(*format)?;
            if !operands.first().is_some_and(|t| t.dtype.is_float()) {
                return Err("a reduction rounded to a narrower float format needs a floating-point operand".into());
            }
            infer(&Op::Reduce { op: *reduce, dims: dims.clone() }, operands, declared)
        }
        Op::RoundPrecision { format, .. } => {
            arity(1)?;
            check_format(*format)?;
            if !operands[0].dtype.is_float() {
                return Err(format!("{} needs a floating-point operand, got {}", op.opcode(), operands[0]));
            }
            Ok(operands[0].clone())
        }
        Op::Reduce { op: reduce, dims } => {
            arity(2)?;
            let (operand, init) = (operands[0], operands[1]);
            if init.rank() != 0 || init.dtype != operand.dtype {
                return Err(format!("reduce init value {init} must be a {} scalar", operand.dtype));
            }
            if operand.dtype == DType::Pred && matches!(reduce, ReduceOp::Add | ReduceOp::Multiply) {
                return Err("reduce with add or multiply is not defined on pred".into());
            }
            check_dims(dims, operand.rank(), "reduce dimensions")?;
            Ok(ArrayType::new(
                operand.dtype,
                (0..operand.rank() as u32).filter(|d| !dims.contains(d)).map(|d| operand.dims[d as usize]).collect(),
            ))
        }
        Op::Concatenate { dim } => {
            let first = operands.first().ok_or("concatenate needs at least one operand")?;
            let d = *dim as usize;
            if d >= first.rank() {
                return Err(format!("concatenate dimension {dim} is not below rank {}", first.rank()));
            }
            let mut dims = first.dims.clone();
            dims[d] = 0;
            for t in operands {
                let same_rest = t.rank() == first.rank()
                    && t.dtype == first.dtype
                    && t.dims.iter().zip(&first.dims).enumerate().all(|(i, (a, b))| i == d || a == b);
                if !same_rest {
                    return Err(format!("concatenate operands {first} and {t} differ outside dimension {dim}"));
                }
                dims[d] = dims[d].checked_add(t.dims[d]).ok_or("concatenate size overflows")?;
            }
            Ok(ArrayType::new(first.dtype, dims))
        }
        Op::Slice { start, limit, stride } => {
            arity(1)?;
            let operand = operands[0];
            let rank = operand.rank();
            if start.len() != rank || limit.len() != rank || stride.len() != rank {
                return Err(format!("slice bounds do not match rank {rank}"));
            }
            let mut dims = Vec::with_capacity(rank);
            for i in 0..rank {
                if stride[i] == 0 || stride[i] > i64::MAX as u64 || start[i] > limit[i] || limit[i] > operand.dims[i] {
                    return Err(format!(
                        "slice [{}:{}:{}] is out of bounds for dimension {i} of size {}",
                        start[i], limit[i], stride[i], operand.dims[i]
                    ));
                }
                dims.push((limit[i] - start[i]).div_ceil(stride[i]));
            }
            Ok(ArrayType::new(operand.dtype, dims))
        }
        Op::Iota { dim } => {
            arity(0)?;
            if *dim as usize >= declared.rank() || declared.dtype == DType::Pred {
                return Err(format!("iota dimension {dim} does not fit {declared}"));
            }
            Ok(declared.clone())
        }
        Op::Copy => {
            arity(1)?;
            Ok(operands[0].clone())
        }
        Op::Clamp => {
            arity(3)?;
            let (lo, x, hi) = (operands[0], operands[1], operands[2]);
            for bound in [lo, hi] {
                if bound.dtype != x.dtype || (bound.rank() != 0 && bound.dims != x.dims) {
                    return Err(format!("clamp bound {bound} must be a {} scalar or shaped like {x}", x.dtype));
                }
            }
            if x.dtype == DType::Pred {
                return Err(format!("Clamp is not defined on {x}"));
            }
            Ok(x.clone())
        }
        Op::Reverse { dims } => {
            arity(1)?;
            check_dims(dims, operands[0].rank(), "reverse dimensions")?;
            Ok(operands[0].clone())
        }
        Op::Pad { low, high, interior } => {
            arity(2)?;
            let (operand, value) = (operands[0], operands[1]);
            if value.rank() != 0 || value.dtype != operand.dtype {
                return Err(format!("pad value {value} must be a {} scalar", operand.dtype));
            }
            let rank = operand.rank();
            if low.len() != rank || high.len() != rank || interior.len() != rank {
                return Err(format!("padding does not match rank {rank}"));
            }
            let mut dims = Vec::with_capacity(rank);
            for i in 0..rank {
                let d = i128::from(operand.dims[i]);
                let stretched = if d == 0 { 0 } else { d + (d - 1) * i128::from(interior[i]) };
                let size = stretched + i128::from(low[i]) + i128::from(high[i]);
                let size = u64::try_from(size)
                    .map_err(|_| format!("padding {}_{} crops dimension {i} below zero", low[i], high[i]))?;
                dims.push(size);
            }
            Ok(ArrayType::new(operand.dtype, dims))
        }
        Op::DynamicSlice { sizes } => {
            let operand = operands.first().ok_or("DynamicSlice needs an operand")?;
            arity(1 + operand.rank())?;
            check_start_indices(&operands[1..])?;
            if sizes.len() != operand.rank() || sizes.iter().zip(&operand.dims).any(|(s, d)| s > d) {
                return Err(format!("dynamic slice sizes {sizes:?} do not fit {operand}"));
            }
            Ok(ArrayType::new(operand.dtype, sizes.clone()))
        }
        Op::DynamicUpdateSlice => {
            let operand = operands.first().ok_or("DynamicUpdateSlice needs an operand")?;
            arity(2 + operand.rank())?;
            let update = operands[1];
            check_start_indices(&operands[2..])?;
            if update.dtype != operand.dtype
                || update.rank() != operand.rank()
                || update.dims.iter().zip(&operand.dims).any(|(u, d)| u > d)
            {
                return Err(format!("update {update} does not fit in {operand}"));
            }
            Ok((*operand).clone())
        }
        Op::BitcastConvert => {
            // Between widths, the narrower side has one more dimension, of the ratio:
            // u32[n,2] <-> u64[n], the low-addressed (least significant) word first.
            arity(1)?;
            let operand = operands[0];
            let (from, to) = (operand.dtype.size_bytes(), declared.dtype.size_bytes());
            if operand.dtype == DType::Pred || declared.dtype == DType::Pred {
                return Err(format!("bitcast-convert of {operand} to {}: pred has no bit layout", declared.dtype));
            }
            let mut dims = operand.dims.clone();
            if from > to {
                dims.push(from / to);
            } else if from < to {
                if dims.last() != Some(&(to / from)) {
                    return Err(format!(
                        "bitcast-convert of {operand} to {}: the last dimension must be {}",
                        declared.dtype,
                        to / from
                    ));
                }
                dims.pop();
            }
            Ok(ArrayType::new(declared.dtype, dims))
        }
        Op::Gather(g) => {
            arity(2)?;
            gather_output(g, operands[0], operands[1])
        }
        Op::Scatter { dims, combine } => {
            arity(3)?;
            let (operand, indices, updates) = (operands[0], operands[1], operands[2]);
            if updates.dtype != operand.dtype {
                return Err(format!("scatter updates {updates} do not match {operand}"));
            }
            if operand.dtype == DType::Pred
                && matches!(combine, ScatterCombine::Reduce(ReduceOp::Add | ReduceOp::Multiply))
            {
                return Err("scatter with add or multiply is not defined on pred".into());
            }
            check_scatter(dims, operand, indices, updates)?;
            Ok((*operand).clone())
        }
        Op::ReduceRegion { dims, region, result } => {
            let n = operands.len() / 2;
            if n == 0 || !operands.len().is_multiple_of(2) {
                return Err(format!(
                    "reduce takes arrays and as many initial values, got {} operand(s)",
                    operands.len()
                ));
            }
            let (arrays, inits) = operands.split_at(n);
            for (array, init) in arrays.iter().zip(inits) {
                if array.dims != arrays[0].dims {
                    return Err(format!("reduce of {} and {}: arrays differ in shape", arrays[0], array));
                }
                if init.rank() != 0 || init.dtype != array.dtype {
                    return Err(format!("reduce init value {init} must be a {} scalar", array.dtype));
                }
            }
            let expected: Vec<DType> = arrays.iter().chain(arrays).map(|t| t.dtype).collect();
            if region.params != expected {
                return Err(format!("reducer parameters {:?} do not match the arrays ({expected:?})", region.params));
            }
            let results = region.step_types()?;
            if results != expected[..n] {
                return Err(format!("reducer results {results:?} do not match the arrays ({:?})", &expected[..n]));
            }
            let array = arrays.get(*result as usize).ok_or_else(|| format!("reduce has no result {result}"))?;
            check_dims(dims, array.rank(), "reduce dimensions")?;
            Ok(ArrayType::new(
                array.dtype,
                (0..array.rank() as u32).filter(|d| !dims.contains(d)).map(|d| array.dims[d as usize]).collect(),
            ))
        }
        Op::SelectAndScatter { window, combine, .. } => {
            arity(3)?;
            let (operand, source, init) = (operands[0], operands[1], operands[2]);
            if source.dtype != operand.dtype || init.dtype != operand.dtype || init.rank() != 0 {
                return Err(format!(
                    "select-and-scatter of {operand}: source {source} and initial value {init} must share its type"
                ));
            }
            if operand.dtype == DType::Pred
                && matches!(combine, ScatterCombine::Reduce(ReduceOp::Add | ReduceOp::Multiply))
            {
                return Err("select-and-scatter with add or multiply is not defined on pred".into());
            }
            let rank = operand.rank();
            if [&window.size, &window.stride, &window.pad_low, &window.pad_high].iter().any(|v| v.len() != rank) {
                return Err(format!("the window must give a size, stride and padding for each of {rank} dimension(s)"));
            }
            let counts = window.counts(&operand.dims).ok_or_else(|| {
                format!("window sizes {:?} and strides {:?} do not fit {operand}", window.size, window.stride)
            })?;
            if counts != source.dims {
                return Err(format!("source {source} must hold one element per window ({counts:?})"));
            }
            Ok(operand.clone())
        }
        Op::RngBitGenerator { algorithm, result, bits } => {
            arity(1)?;
            let state = operands[0];
            let words = match algorithm {
                RngAlgorithm::Philox => [2, 3].as_slice(),
                RngAlgorithm::ThreeFry => [2].as_slice(),
            };
            if state.dtype != DType::U64 || state.rank() != 1 || !words.contains(&state.dims[0]) {
                return Err(format!(
                    "rng-bit-generator state {state} must be u64[2]{}",
                    match algorithm {
                        RngAlgorithm::Philox => " or u64[3]",
                        RngAlgorithm::ThreeFry => "",
                    }
                ));
            }
            if !bits.dtype.is_integer() {
                return Err(format!("rng-bit-generator produces integers, not {}", bits.dtype));
            }
            match result {
                RngResult::State => Ok(state.clone()),
                RngResult::Bits => Ok(bits.clone()),
            }
        }
        Op::PartitionId => {
            arity(0)?;
            if declared.dtype != DType::U32 || declared.rank() != 0 {
                return Err(format!("partition-id produces u32[], not {declared}"));
            }
            Ok(declared.clone())
        }
        Op::RngUniform => {
            arity(2)?;
            let (a, b) = (operands[0], operands[1]);
            if a.rank() != 0 || b.rank() != 0 || a.dtype != b.dtype || a.dtype != declared.dtype {
                return Err(format!("rng bounds {a} and {b} must be scalars of the result's type {}", declared.dtype));
            }
            if declared.dtype == DType::Pred {
                return Err("rng does not produce pred".into());
            }
            Ok(declared.clone())
        }
        Op::While(_) | Op::Conditional(_) | Op::TopK { .. } | Op::ReduceWindow { .. } | Op::Sort { .. } => {
            Err(format!("{} has several results; check it with `check_results`", op.opcode()))
        }
        Op::Collective(c) => {
            arity(1)?;
            let x = operands[0];
            let dim = match c.kind {
                CollectiveKind::AllReduce(_) => {
                    if x.dtype == DType::Pred
                        && !matches!(c.kind, CollectiveKind::AllReduce(ReduceOp::Maximum | ReduceOp::Minimum))
                    {
                        return Err(format!("all-reduce of {x} must combine with or (maximum) or and (minimum)"));
                    }
                    return Ok(x.clone());
                }
                CollectiveKind::AllGather { dim }
                | CollectiveKind::ReduceScatter { dim, .. }
                | CollectiveKind::AllToAll { dim } => dim,
            };
            let d = dim as usize;
            if d >= x.rank() || declared.rank() != x.rank() || declared.dtype != x.dtype {
                return Err(format!("{} along dimension {dim} of {x} cannot give {declared}", c.kind.name()));
            }
            let other_dims_agree = (0..x.rank()).all(|i| i == d || x.dims[i] == declared.dims[i]);
            let (small, large) = match c.kind {
                CollectiveKind::AllGather { .. } => (x.dims[d], declared.dims[d]),
                CollectiveKind::ReduceScatter { .. } => (declared.dims[d], x.dims[d]),
                _ => (x.dims[d], declared.dims[d]),
            };
            let fits = small > 0
                && large >= small
                && large % small == 0
                && (!matches!(c.kind, CollectiveKind::AllToAll { .. }) || small == large);
            if !other_dims_agree || !fits {
                return Err(format!("{} along dimension {dim} of {x} cannot give {declared}", c.kind.name()));
            }
            if let Some(group) = c
                .groups
                .iter()
                .find(|g| g.len() as u64 != large / small && !matches!(c.kind, CollectiveKind::AllToAll { .. }))
            {
                return Err(format!(
                    "{} of {x} into {declared} needs groups of {} ranks, but group {} has {}",
                    c.kind.name(),
                    large / small,
                    format_groups(std::slice::from_ref(group)),
                    group.len()
                ));
            }
            Ok(declared.clone())
        }
    }
}

fn check_start_indices(indices: &[&ArrayType]) -> Result<(), String> {
    match indices.iter().find(|t| t.rank() != 0 || !t.dtype.is_integer()) {
        Some(t) => Err(format!("start index {t} must be an integer scalar")),
        None => Ok(()),
    }
}

/// Checks that `dims` are distinct and below `rank`, and that none is in `taken`.
fn disjoint_dims(dims: &[u32], taken: &[bool], what: &str) -> Result<(), String> {
    let mut seen = vec![false; taken.len()];
    for &d in dims {
        let d = d as usize;
        if d >= taken.len() || taken[d] || std::mem::replace(&mut seen[d], true) {
            return Err(format!("{what} {dims:?} are not distinct unused dimensions below rank {}", taken.len()));
        }
    }
    Ok(())
}

fn mark(taken: &mut [bool], dims: &[u32]) {
    for &d in dims {
        taken[d as usize] = true;
    }
}

/// The shape of `indices` without its index vector dimension, and the length of that
/// vector (1 when `index_vector_dim` is the rank: an implicit trailing dimension).
fn index_batch(indices: &ArrayType, index_vector_dim: u32) -> Result<(Vec<u64>, u64), String> {
    let ivd = index_vector_dim as usize;
    if !indices.dtype.is_integer() || ivd > indices.rank() {
        return Err(format!("indices {indices} must be integers with index_vector_dim={ivd} at most their rank"));
    }
    let batch = indices.dims.iter().enumerate().filter(|&(i, _)| i != ivd).map(|(_, &d)| d).collect();
    Ok((batch, indices.dims.get(ivd).copied().unwrap_or(1)))
}

fn gather_output(g: &GatherDims, operand: &ArrayType, indices: &ArrayType) -> Result<ArrayType, String> {
    let rank = operand.rank();
    let (batch, vector) = index_batch(indices, g.index_vector_dim)?;
    if g.slice_sizes.len() != rank || g.slice_sizes.iter().zip(&operand.dims).any(|(s, d)| s > d) {
        return Err(format!("gather slice sizes {:?} do not fit {operand}", g.slice_sizes));
    }
    if g.start_index_map.len() as u64 != vector {
        return Err(format!("gather start_index_map {:?} does not match index vectors of {vector}", g.start_index_map));
    }
    disjoint_dims(&g.start_index_map, &vec![false; rank], "gather start_index_map")?;
    let mut taken = vec![false; rank];
    disjoint_dims(&g.collapsed_slice_dims, &taken, "gather collapsed_slice_dims")?;
    mark(&mut taken, &g.collapsed_slice_dims);
    disjoint_dims(&g.operand_batching_dims, &taken, "gather operand_batching_dims")?;
    mark(&mut taken, &g.operand_batching_dims);
    if taken.iter().enumerate().any(|(d, &t)| t && g.slice_sizes[d] > 1) {
        return Err("gather collapses or batches a dimension whose slice size is not 1".into());
    }
    let mut indices_taken = vec![false; indices.rank()];
    if let Some(t) = indices_taken.get_mut(g.index_vector_dim as usize) {
        *t = true;
    }
    disjoint_dims(&g.start_indices_batching_dims, &indices_taken, "gather start_indices_batching_dims")?;
    if g.start_indices_batching_dims.len() != g.operand_batching_dims.len() {
        return Err("gather batching dimension lists must pair up".into());
    }
    let offsets: Vec<u64> = (0..rank).filter(|&d| !taken[d]).map(|d| g.slice_sizes[d]).collect();
    let out_rank = batch.len() + offsets.len();
    if g.offset_dims.len() != offsets.len() || g.offset_dims.windows(2).any(|w| w[0] >= w[1]) {
        return Err(format!(
            "gather offset_dims {:?} must list {} increasing dimensions",
            g.offset_dims,
            offsets.len()
        ));
    }
    disjoint_dims(&g.offset_dims, &vec![false; out_rank], "gather offset_dims")?;
    let (mut offsets, mut batch) = (offsets.into_iter(), batch.into_iter());
    let dims = (0..out_rank as u32)
        .map(|d| if g.offset_dims.contains(&d) { offsets.next() } else { batch.next() })
        .collect::<Option<Vec<u64>>>()
        .ok_or("gather dimensions do not add up")?;
    Ok(ArrayType::new(operand.dtype, dims))
}

fn check_scatter(s: &ScatterDims, operand: &ArrayType, indices: &ArrayType, updates: &ArrayType) -> Result<(), String> {
    let rank = operand.rank();
    let (batch, vector) = index_batch(indices, s.index_vector_dim)?;
    if s.scatter_dims_to_operand_dims.len() as u64 != vector {
        return Err(format!(
            "scatter_dims_to_operand_dims {:?} does not match index vectors of {vector}",
            s.scatter_dims_to_operand_dims
        ));
    }
    disjoint_dims(&s.scatter_dims_to_operand_dims, &vec![false; rank], "scatter_dims_to_operand_dims")?;
    let mut taken = vec![false; rank];
    disjoint_dims(&s.inserted_window_dims, &taken, "scatter inserted_window_dims")?;
    mark(&mut taken, &s.inserted_window_dims);
    disjoint_dims(&s.input_batching_dims, &taken, "scatter input_batching_dims")?;
    mark(&mut taken, &s.input_batching_dims);
    let mut indices_taken = vec![false; indices.rank()];
    if let Some(t) = indices_taken.get_mut(s.index_vector_dim as usize) {
        *t = true;
    }
    disjoint_dims(&s.scatter_indices_batching_dims, &indices_taken, "scatter_indices_batching_dims")?;
    if s.scatter_indices_batching_dims.len() != s.input_batching_dims.len() {
        return Err("scatter batching dimension lists must pair up".into());
    }
    let window_operand_dims: Vec<usize> = (0..rank).filter(|&d| !taken[d]).collect();
    if s.update_window_dims.len() != window_operand_dims.len() || s.update_window_dims.windows(2).any(|w| w[0] >= w[1])
    {
        return Err(format!(
            "scatter update_window_dims {:?} must list {} increasing dimensions",
            s.update_window_dims,
            window_operand_dims.len()
        ));
    }
    if updates.rank() != batch.len() + window_operand_dims.len() {
        return Err(format!("scatter updates {updates} have the wrong rank"));
    }
    disjoint_dims(&s.update_window_dims, &vec![false; updates.rank()], "scatter update_window_dims")?;
    let mut window = window_operand_dims.iter();
    let mut batch = batch.iter();
    for (d, &size) in updates.dims.iter().enumerate() {
        let fits = if s.update_window_dims.contains(&(d as u32)) {
            window.next().is_some_and(|&o| size <= operand.dims[o])
        } else {
            batch.next() == Some(&size)
        };
        if !fits {
            return Err(format!("scatter updates {updates} do not fit {operand} and indices {indices}"));
        }
    }
    Ok(())
}
