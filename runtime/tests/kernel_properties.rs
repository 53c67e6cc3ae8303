//! Properties of the layout and matrix kernels, checked against naive reference
//! implementations written with plain index arithmetic. Each case is compiled from HLO
//! text and executed by the runtime, so the compiler's shape inference and the
//! backend's kernels are both exercised. Inputs are small integers stored as `f32`, so
//! every sum is exact and results must match to the bit.

use neuron_runtime::{
    ArrayType, CompileOptions, DType, Neff, Runtime, Target, TensorPlacement, TensorSet, compile_hlo_with,
};
use proptest::prelude::*;

fn runtime() -> &'static Runtime {
    neuron_test_support::runtime::Bench::new().runtime()
}

fn shape(dims: &[u64]) -> String {
    let dims: Vec<String> = dims.iter().map(u64::to_string).collect();
    format!("f32[{}]", dims.join(","))
}

fn list(values: &[usize]) -> String {
    let values: Vec<String> = values.iter().map(usize::to_string).collect();
    format!("{{{}}}", values.join(","))
}

/// Compiles `hlo` (whose parameters are f32 arrays of `inputs`' dims), runs it, and
/// returns output 0.
fn run(hlo: &str, inputs: &[(&[u64], &[f32])]) -> Vec<f32> {
    let rt = runtime();
    let program = compile_hlo_with(hlo, &CompileOptions::exact(Target::Trn1)).unwrap_or_else(|e| panic!("{e}\n{hlo}"));
    let model = rt.load(&Neff::new("prop", program).encode(), None).expect("load");
    let mut bound = TensorSet::new();
    for (i, (dims, values)) in inputs.iter().enumerate() {
        let ty = ArrayType::new(DType::F32, dims.to_vec());
        let tensor = rt.allocate_tensor_for(TensorPlacement::Host, &ty, "in").expect("alloc");
        tensor.write(0, &values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>()).expect("write");
        bound.add(&format!("input{i}"), tensor);
    }
    let out_ty = model.tensor_type(&model.outputs()[0]).clone();
    let output = rt.allocate_tensor_for(TensorPlacement::Host, &out_ty, "out").expect("alloc");
    let mut outputs = TensorSet::new();
    outputs.add("output0", output.clone());
    rt.execute(&model, &bound, &outputs).expect("execute");
    rt.unload(&model).expect("unload");
    output.read_all().expect("read").chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn strides(dims: &[u64]) -> Vec<usize> {
    let mut strides = vec![1usize; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * dims[i + 1] as usize;
    }
    strides
}

fn unravel(mut flat: usize, dims: &[u64]) -> Vec<usize> {
    let mut index = vec![0; dims.len()];
    for i in (0..dims.len()).rev() {
        index[i] = flat % dims[i] as usize;
        flat /= dims[i] as usize;
    }
    index
}

fn ravel(index: &[usize], dims: &[u64]) -> usize {
    index.iter().zip(strides(dims)).map(|(i, s)| i * s).sum()
}

fn count(dims: &[u64]) -> usize {
    dims.iter().product::<u64>() as usize
}

/// Dimensions of rank `rank`, each 1 to 4.
fn dims(rank: std::ops::RangeInclusive<usize>) -> impl Strategy<Value = Vec<u64>> {
    prop::collection::vec(1u64..=4, rank)
}

/// Small integers as f32: exact under addition and multiplication at these sizes.
fn values(n: usize) -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec((-4i32..=4).prop_map(|v| v as f32), n)
}

fn with_values(dims: Vec<u64>) -> impl Strategy<Value = (Vec<u64>, Vec<f32>)> {
    let n = count(&dims);
    values(n).prop_map(move |v| (dims.clone(), v))
}

/// A dot problem: sizes of batch, lhs-free, rhs-free and contracting axes, and the
/// order in which each operand lays its axes out.
#[derive(Debug, Clone)]
struct Dot {
    batch: Vec<u64>,
    lhs_free: Vec<u64>,
    rhs_free: Vec<u64>,
    contracting: Vec<u64>,
    /// Position of each logical lhs axis (batch, free, contracting order) in the operand.
    lhs_order: Vec<usize>,
    rhs_order: Vec<usize>,
}

fn dot_problem() -> impl Strategy<Value = Dot> {
    (dims(0..=1), dims(0..=2), dims(0..=2), dims(0..=2))
        .prop_flat_map(|(batch, lhs_free, rhs_free, contracting)| {
            let lhs_rank = batch.len() + lhs_free.len() + contracting.len();
            let rhs_rank = batch.len() + rhs_free.len() + contracting.len();
            (
                Just((batch, lhs_free, rhs_free, contracting)),
                Just((0..lhs_rank).collect::<Vec<_>>()).prop_shuffle(),
                Just((0..rhs_rank).collect::<Vec<_>>()).prop_shuffle(),
            )
        })
        .prop_map(|((batch, lhs_free, rhs_free, contracting), lhs_order, rhs_order)| Dot {
            batch,
            lhs_free,
            rhs_free,
            contracting,
            lhs_order,
            rhs_order,
        })
}

impl Dot {
    /// Operand dims from logical group sizes laid out by `order`.
    fn operand_dims(&self, free: &[u64], order: &[usize]) -> Vec<u64> {
        let logical: Vec<u64> = self.batch.iter().chain(free).chain(&self.contracting).copied().collect();
        let mut dims = vec![0; logical.len()];
        for (axis, &position) in order.iter().enumerate() {
            dims[position] = logical[axis];
        }
        dims
    }

    fn positions(&self, order: &[usize], free_len: usize) -> (Vec<usize>, Vec<usize>, Vec<usize>) {
        let b = self.batch.len();
        (order[..b].to_vec(), order[b..b + free_len].to_vec(), order[b + free_len..].to_vec())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn dot_matches_a_naive_contraction(problem in dot_problem(), seed in any::<u64>()) {
        let lhs_dims = problem.operand_dims(&problem.lhs_free, &problem.lhs_order);
        let rhs_dims = problem.operand_dims(&problem.rhs_free, &problem.rhs_order);
        let (lb, mut lf, lc) = problem.positions(&problem.lhs_order, problem.lhs_free.len());
        let (rb, mut rf, rc) = problem.positions(&problem.rhs_order, problem.rhs_free.len());
        // XLA orders each operand's free dimensions in the result as they appear in it.
        lf.sort_unstable();
        rf.sort_unstable();
        let fill = |n: usize, salt: u64| -> Vec<f32> {
            (0..n).map(|i| ((seed.wrapping_add(salt).wrapping_mul(6364136223846793005).wrapping_add((i as u64).wrapping_mul(1442695040888963407)) >> 59) as i32 - 16) as f32 / 4.0).collect()
        };
        let lhs = fill(count(&lhs_dims), 1);
        let rhs = fill(count(&rhs_dims), 2);
        let out_dims: Vec<u64> = lb
            .iter()
            .chain(&lf)
            .map(|&p| lhs_dims[p])
            .chain(rf.iter().map(|&p| rhs_dims[p]))
            .collect();
        let hlo = format!(
            "HloModule dot\nENTRY e {{\n  a = {} parameter(0)\n  b = {} parameter(1)\n  ROOT d = {} dot(a, b), \
             lhs_batch_dims={}, lhs_contracting_dims={}, rhs_batch_dims={}, rhs_contracting_dims={}\n}}\n",
            shape(&lhs_dims), shape(&rhs_dims), shape(&out_dims), list(&lb), list(&lc), list(&rb), list(&rc)
        );
        let got = run(&hlo, &[(&lhs_dims, &lhs), (&rhs_dims, &rhs)]);

        let mut want = vec![0f32; count(&out_dims)];
        for (flat, slot) in want.iter_mut().enumerate() {
            let out = unravel(flat, &out_dims);
            let (b, rest) = out.split_at(lb.len());
            let (f, g) = rest.split_at(lf.len());
            for k in 0..count(&problem.contracting) {
                let k = unravel(k, &problem.contracting);
                let mut li = vec![0; lhs_dims.len()];
                let mut ri = vec![0; rhs_dims.len()];
                for (i, &p) in lb.iter().enumerate() { li[p] = b[i]; }
                for (i, &p) in lf.iter().enumerate() { li[p] = f[i]; }
                for (i, &p) in lc.iter().enumerate() { li[p] = k[i]; }
                for (i, &p) in rb.iter().enumerate() { ri[p] = b[i]; }
                for (i, &p) in rf.iter().enumerate() { ri[p] = g[i]; }
                for (i, &p) in rc.iter().enumerate() { ri[p] = k[i]; }
                *slot += lhs[ravel(&li, &lhs_dims)] * rhs[ravel(&ri, &rhs_dims)];
            }
        }
        prop_assert_eq!(got, want, "{}", hlo);
    }

    #[test]
    fn transpose_moves_every_element(
        (dims, x) in dims(1..=4).prop_flat_map(with_values),
        shuffle in any::<u64>(),
    ) {
        let rank = dims.len();
        let mut perm: Vec<usize> = (0..rank).collect();
        for i in (1..rank).rev() {
            perm.swap(i, (shuffle >> (i * 8)) as usize % (i + 1));
        }
        let out_dims: Vec<u64> = perm.iter().map(|&p| dims[p]).collect();
        let hlo = format!(
            "HloModule t\nENTRY e {{\n  x = {} parameter(0)\n  ROOT t = {} transpose(x), dimensions={}\n}}\n",
            shape(&dims), shape(&out_dims), list(&perm)
        );
        let got = run(&hlo, &[(&dims, &x)]);
        let want: Vec<f32> = (0..count(&out_dims))
            .map(|flat| {
                let out = unravel(flat, &out_dims);
                let mut index = vec![0; rank];
                for (i, &p) in perm.iter().enumerate() { index[p] = out[i]; }
                x[ravel(&index, &dims)]
            })
            .collect();
        prop_assert_eq!(got, want, "{}", hlo);
    }

    #[test]
    fn reduce_sums_and_maxes_the_chosen_axes(
        (dims, x) in dims(1..=4).prop_flat_map(with_values),
        mask in any::<u8>(),
        use_max in any::<bool>(),
    ) {
        let axes: Vec<usize> = (0..dims.len()).filter(|a| mask & (1 << a) != 0).collect();
        let kept: Vec<usize> = (0..dims.len()).filter(|a| !axes.contains(a)).collect();
        let out_dims: Vec<u64> = kept.iter().map(|&a| dims[a]).collect();
        let (op, init) = if use_max { ("maximum", "-inf") } else { ("add", "0") };
        let hlo = format!(
            "HloModule r\nregion {{\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT c = f32[] {op}(a, b)\n}}\n\
             ENTRY e {{\n  x = {} parameter(0)\n  i = f32[] constant({init})\n  \
             ROOT r = {} reduce(x, i), dimensions={}, to_apply=region\n}}\n",
            shape(&dims), shape(&out_dims), list(&axes)
        );
        let got = run(&hlo, &[(&dims, &x)]);
        let mut want = vec![if use_max { f32::NEG_INFINITY } else { 0.0 }; count(&out_dims)];
        for (flat, &v) in x.iter().enumerate() {
            let index = unravel(flat, &dims);
            let out: Vec<usize> = kept.iter().map(|&a| index[a]).collect();
            let slot = &mut want[ravel(&out, &out_dims)];
            *slot = if use_max { slot.max(v) } else { *slot + v };
        }
        prop_assert_eq!(got, want, "{}", hlo);
    }

    #[test]
    fn strided_slices_pick_the_right_elements(
        (dims, x) in dims(1..=3).prop_flat_map(with_values),
        picks in prop::collection::vec((any::<u8>(), any::<u8>(), 1u64..=3), 3),
    ) {
        let mut start = Vec::new();
        let mut limit = Vec::new();
        let mut stride = Vec::new();
        for (d, &(a, b, s)) in dims.iter().zip(&picks) {
            let (a, b) = (u64::from(a) % (d + 1), u64::from(b) % (d + 1));
            start.push(a.min(b));
            limit.push(a.max(b));
            stride.push(s);
        }
        let out_dims: Vec<u64> = (0..dims.len()).map(|i| (limit[i] - start[i]).div_ceil(stride[i])).collect();
        let bounds: Vec<String> = (0..dims.len()).map(|i| format!("[{}:{}:{}]", start[i], limit[i], stride[i])).collect();
        let hlo = format!(
            "HloModule s\nENTRY e {{\n  x = {} parameter(0)\n  ROOT s = {} slice(x), slice={{{}}}\n}}\n",
            shape(&dims), shape(&out_dims), bounds.join(", ")
        );
        let got = run(&hlo, &[(&dims, &x)]);
        let want: Vec<f32> = (0..count(&out_dims))
            .map(|flat| {
                let out = unravel(flat, &out_dims);
                let index: Vec<usize> = (0..dims.len()).map(|i| (start[i] + out[i] as u64 * stride[i]) as usize).collect();
                x[ravel(&index, &dims)]
            })
            .collect();
        prop_assert_eq!(got, want, "{}", hlo);
    }

    #[test]
    fn broadcast_repeats_the_operand_along_new_axes(
        out_dims in dims(1..=4),
        mask in any::<u8>(),
        seed in any::<u64>(),
    ) {
        let mapped: Vec<usize> = (0..out_dims.len()).filter(|a| mask & (1 << a) != 0).collect();
        let operand_dims: Vec<u64> = mapped.iter().map(|&a| out_dims[a]).collect();
        let x: Vec<f32> = (0..count(&operand_dims)).map(|i| ((seed >> (i % 60)) & 7) as f32 + i as f32).collect();
        let hlo = format!(
            "HloModule b\nENTRY e {{\n  x = {} parameter(0)\n  ROOT b = {} broadcast(x), dimensions={}\n}}\n",
            shape(&operand_dims), shape(&out_dims), list(&mapped)
        );
        let got = run(&hlo, &[(&operand_dims, &x)]);
        let want: Vec<f32> = (0..count(&out_dims))
            .map(|flat| {
                let out = unravel(flat, &out_dims);
                let index: Vec<usize> = mapped.iter().map(|&a| out[a]).collect();
                x[ravel(&index, &operand_dims)]
            })
            .collect();
        prop_assert_eq!(got, want, "{}", hlo);
    }
}
