//! The batch-norm operators (`batch-norm-training`, `batch-norm-inference`), expanded
//! into reductions and element-wise arithmetic as XLA's `BatchNormExpander` does.

use super::*;

impl Lowering<'_> {
    /// The batch-norm operators, expanded into reductions and element-wise arithmetic
    /// as XLA's `BatchNormExpander` does. Every instruction keeps the batch-norm
    /// instruction's name, so profiles attribute the time to it.
    pub(super) fn batch_norm(&mut self, inst: &hlo::Instruction, operands: Vec<u32>) -> Result<Lowered, String> {
        let expected = if inst.opcode == "batch-norm-training" { 3 } else { 5 };
        if operands.len() != expected {
            return Err(format!("{} takes {expected} operands, got {}", inst.opcode, operands.len()));
        }
        let x_ty = self.buffers[operands[0] as usize].ty.clone();
        if !x_ty.dtype.is_float() {
            return Err(format!("{} needs a floating-point operand, got {x_ty}", inst.opcode));
        }
        let feature: u32 = index_attr(inst, "feature_index")?;
        if feature as usize >= x_ty.rank() {
            return Err(format!("feature_index {feature} is out of range for {x_ty}"));
        }
        let epsilon = match inst.attribute("epsilon") {
            Some(e) => parse_f64(e).ok_or_else(|| format!("`epsilon={e}` is not a number"))?,
            None => 0.0,
        };
        let channels = x_ty.dims[feature as usize];
        let feature_ty = ArrayType::new(x_ty.dtype, vec![channels]);
        for (k, &b) in operands.iter().enumerate().skip(1) {
            let ty = &self.buffers[b as usize].ty;
            let want = if inst.opcode == "batch-norm-grad" && k == 4 { &x_ty } else { &feature_ty };
            if ty != want {
                return Err(format!("{} operand {k} is {ty}; expected {want}", inst.opcode));
            }
        }
        let per_feature = x_ty.element_count().unwrap_or(0) / channels.max(1);
        let other_dims: Vec<u32> = (0..x_ty.rank() as u32).filter(|&d| d != feature).collect();
        let mut bn = Expander { lowering: self, hlo: &inst.name, x_ty: x_ty.clone(), feature_ty, feature };
        let eps = bn.constant_like_feature(epsilon)?;
        let results = match inst.opcode.as_str() {
            "batch-norm-inference" => {
                let [x, scale, offset, mean, var] = operands[..] else { unreachable!("checked above") };
                let var_eps = bn.feature(BinaryOp::Add, var, eps)?;
                let rsqrt = bn.feature_activation(ActivationFn::Rsqrt, var_eps)?;
                let true_scale = bn.feature(BinaryOp::Multiply, scale, rsqrt)?;
                let mean_scaled = bn.feature(BinaryOp::Multiply, mean, true_scale)?;
                let true_shift = bn.feature(BinaryOp::Subtract, offset, mean_scaled)?;
                let scale_b = bn.broadcast(true_scale)?;
                let shift_b = bn.broadcast(true_shift)?;
                let scaled = bn.full(BinaryOp::Multiply, x, scale_b)?;
                vec![bn.full(BinaryOp::Add, scaled, shift_b)?]
            }
            "batch-norm-training" => {
                let [x, scale, offset] = operands[..] else { unreachable!("checked above") };
                let count = bn.constant_like_feature(per_feature as f64)?;
                let sum = bn.sum(x, &other_dims)?;
                let squares = bn.full(BinaryOp::Multiply, x, x)?;
                let square_sum = bn.sum(squares, &other_dims)?;
                let mean = bn.feature(BinaryOp::Divide, sum, count)?;
                let square_mean = bn.feature(BinaryOp::Divide, square_sum, count)?;
                let mean_square = bn.feature(BinaryOp::Multiply, mean, mean)?;
                let var = bn.feature(BinaryOp::Subtract, square_mean, mean_square)?;
                let var_eps = bn.feature(BinaryOp::Add, var, eps)?;
                let rsqrt = bn.feature_activation(ActivationFn::Rsqrt, var_eps)?;
                let mean_b = bn.broadcast(mean)?;
                let centred = bn.full(BinaryOp::Subtract, x, mean_b)?;
                let rsqrt_b = bn.broadcast(rsqrt)?;
                let normalized = bn.full(BinaryOp::Multiply, centred, rsqrt_b)?;
                let scale_b = bn.broadcast(scale)?;
                let scaled = bn.full(BinaryOp::Multiply, normalized, scale_b)?;
                let offset_b = bn.broadcast(offset)?;
                vec![bn.full(BinaryOp::Add, scaled, offset_b)?, mean, var]
            }
            _ => {
                let [x, scale, mean, var, grad] = operands[..] else { unreachable!("checked above") };
                let var_eps = bn.feature(BinaryOp::Add, var, eps)?;
                let rsqrt = bn.feature_activation(ActivationFn::Rsqrt, var_eps)?;
                let mean_b = bn.broadcast(mean)?;
                let centred = bn.full(BinaryOp::Subtract, x, mean_b)?;
                let grad_centred = bn.full(BinaryOp::Multiply, grad, centred)?;
                let sum_grad_centred = bn.sum(grad_centred, &other_dims)?;
                let grad_offset = bn.sum(grad, &other_dims)?;
                let grad_scale = bn.feature(BinaryOp::Multiply, sum_grad_centred, rsqrt)?;
                // grad_x = scale * rsqrt(var + eps) / N * (N * grad - sum(grad)
                //          - (x - mean) * sum(grad * (x - mean)) / (var + eps))
                let i2 = bn.broadcast(grad_offset)?;
                let i3 = bn.broadcast(sum_grad_centred)?;
                let i4 = bn.full(BinaryOp::Multiply, centred, i3)?;
                let var_eps_b = bn.broadcast(var_eps)?;
                let i5 = bn.full(BinaryOp::Divide, i4, var_eps_b)?;
                let scale_b = bn.broadcast(scale)?;
                let rsqrt_b = bn.broadcast(rsqrt)?;
                let scale_rsqrt = bn.full(BinaryOp::Multiply, scale_b, rsqrt_b)?;
                let inverse_count = bn.constant_like_x(1.0 / per_feature.max(1) as f64)?;
                let scale_rsqrt = bn.full(BinaryOp::Multiply, scale_rsqrt, inverse_count)?;
                let count = bn.constant_like_x(per_feature as f64)?;
                let i1 = bn.full(BinaryOp::Multiply, grad, count)?;
                let i6 = bn.full(BinaryOp::Subtract, i1, i2)?;
                let i6 = bn.full(BinaryOp::Subtract, i6, i5)?;
                vec![bn.full(BinaryOp::Multiply, scale_rsqrt, i6)?, grad_scale, grad_offset]
            }
        };
        let produced: Vec<ArrayType> = results.iter().map(|&id| self.buffers[id as usize].ty.clone()).collect();
        if result_types(&inst.shape)? != produced {
            let produced: Vec<String> = produced.iter().map(ToString::to_string).collect();
            return Err(format!("{} produces ({}) but declares {}", inst.opcode, produced.join(", "), inst.shape));
        }
        Ok(lowered_results(inst, results))
    }
}

/// Emits the instructions of an expanded batch-norm operator.
struct Expander<'l, 'm> {
    lowering: &'l mut Lowering<'m>,
    hlo: &'l str,
    x_ty: ArrayType,
    feature_ty: ArrayType,
    feature: u32,
}

impl Expander<'_, '_> {
    /// A scalar constant of the operand's element type.
    fn scalar(&mut self, value: f64) -> Result<u32, String> {
        let dtype = self.x_ty.dtype;
        let bytes = literal_element(dtype, &format!("{value:e}"))
            .ok_or_else(|| format!("{value} is not representable as {dtype}"))?;
        let index = self.lowering.constants.len() as u32;
        self.lowering.constants.push(bytes);
        Ok(self.lowering.new_buffer(ArrayType::new(dtype, vec![]), BufferKind::Constant { index }))
    }

    /// A constant of type `ty` with every element `value`.
    fn constant(&mut self, value: f64, ty: ArrayType) -> Result<u32, String> {
        let scalar = self.scalar(value)?;
        self.lowering.emit_checked(Op::Broadcast { dims: vec![] }, vec![scalar], ty, self.hlo)
    }

    fn constant_like_feature(&mut self, value: f64) -> Result<u32, String> {
        self.constant(value, self.feature_ty.clone())
    }

    fn constant_like_x(&mut self, value: f64) -> Result<u32, String> {
        self.constant(value, self.x_ty.clone())
    }

    fn feature(&mut self, op: BinaryOp, a: u32, b: u32) -> Result<u32, String> {
        self.lowering.emit_checked(Op::Binary(op), vec![a, b], self.feature_ty.clone(), self.hlo)
    }

    fn feature_activation(&mut self, f: ActivationFn, a: u32) -> Result<u32, String> {
        self.lowering.emit_checked(Op::Activation(f), vec![a], self.feature_ty.clone(), self.hlo)
    }

    fn full(&mut self, op: BinaryOp, a: u32, b: u32) -> Result<u32, String> {
        self.lowering.emit_checked(Op::Binary(op), vec![a, b], self.x_ty.clone(), self.hlo)
    }

    fn broadcast(&mut self, a: u32) -> Result<u32, String> {
        self.lowering.emit_checked(Op::Broadcast { dims: vec![self.feature] }, vec![a], self.x_ty.clone(), self.hlo)
    }

    /// The per-feature sum of `a` over `dims`.
    fn sum(&mut self, a: u32, dims: &[u32]) -> Result<u32, String> {
        let zero = self.scalar(0.0)?;
        let op = self.lowering.plain_reduce(ReduceOp::Add, dims.to_vec(), self.x_ty.dtype);
        self.lowering.emit_checked(op, vec![a, zero], self.feature_ty.clone(), self.hlo)
    }
}
