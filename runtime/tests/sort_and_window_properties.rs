//! Properties of the window operations (`reduce-window`, `convolution`), `topk`,
//! `sort` and an arg-max `reduce`, checked against plain reference implementations over random shapes and
//! parameters. Each case is compiled from HLO
//! text and executed by the runtime. Inputs are small integers stored as `f32`, so every
//! window sum is exact and results must match to the bit.

use neuron_runtime::{CompileOptions, Target};
use neuron_test_support::runtime::{Bench, f32_bytes, ints};
use proptest::prelude::*;

fn list(values: &[u64], separator: &str) -> String {
    values.iter().map(u64::to_string).collect::<Vec<_>>().join(separator)
}

fn f32_shape(dims: &[u64]) -> String {
    format!("f32[{}]", list(dims, ","))
}

/// One `reduce-window` problem: an array and a window over it.
#[derive(Debug, Clone)]
struct WindowProblem {
    dims: Vec<u64>,
    values: Vec<f32>,
    size: Vec<u64>,
    stride: Vec<u64>,
    pad: Vec<(u64, u64)>,
    base_dilation: Vec<u64>,
    window_dilation: Vec<u64>,
    max: bool,
}

impl WindowProblem {
    /// Windows along dimension `d`, as XLA counts them.
    fn count(&self, d: usize) -> u64 {
        let dilated = (self.dims[d] - 1) * self.base_dilation[d] + 1;
        let padded = dilated + self.pad[d].0 + self.pad[d].1;
        let extent = (self.size[d] - 1) * self.window_dilation[d] + 1;
        if padded >= extent { (padded - extent) / self.stride[d] + 1 } else { 0 }
    }

    fn out_dims(&self) -> Vec<u64> {
        (0..self.dims.len()).map(|d| self.count(d)).collect()
    }

    fn hlo(&self) -> String {
        let (op, init) = if self.max { ("maximum", "-inf") } else { ("add", "0") };
        let pad: Vec<String> = self.pad.iter().map(|(l, h)| format!("{l}_{h}")).collect();
        format!(
            "HloModule rw\nreducer {{\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT r = f32[] {op}(a, b)\n}}\n\
             ENTRY e {{\n  x = {} parameter(0)\n  init = f32[] constant({init})\n  \
             ROOT w = {} reduce-window(x, init), window={{size={} stride={} pad={} lhs_dilate={} rhs_dilate={}}}, to_apply=reducer\n}}\n",
            f32_shape(&self.dims),
            f32_shape(&self.out_dims()),
            list(&self.size, "x"),
            list(&self.stride, "x"),
            pad.join("x"),
            list(&self.base_dilation, "x"),
            list(&self.window_dilation, "x"),
        )
    }

    /// Every window reduced with plain index arithmetic: the initial value, then each
    /// window position in row-major order (the initial value where it falls outside
    /// the array or between its dilated elements).
    fn reference(&self) -> Vec<f32> {
        let rank = self.dims.len();
        let out_dims = self.out_dims();
        let init = if self.max { f32::NEG_INFINITY } else { 0.0 };
        let combine = |a: f32, b: f32| if self.max { a.max(b) } else { a + b };
        let outputs: u64 = out_dims.iter().product();
        let positions: u64 = self.size.iter().product();
        (0..outputs)
            .map(|flat| {
                let j = unravel(flat, &out_dims);
                (0..positions).fold(init, |acc, k| {
                    let k = unravel(k, &self.size);
                    let mut index = Vec::with_capacity(rank);
                    for d in 0..rank {
                        let at = (j[d] * self.stride[d] + k[d] * self.window_dilation[d]) as i64 - self.pad[d].0 as i64;
                        let base = self.base_dilation[d] as i64;
                        if at < 0 || at % base != 0 || at / base >= self.dims[d] as i64 {
                            return combine(acc, init);
                        }
                        index.push((at / base) as u64);
                    }
                    combine(acc, self.values[ravel(&index, &self.dims)])
                })
            })
            .collect()
    }
}

fn unravel(mut flat: u64, dims: &[u64]) -> Vec<u64> {
    let mut index = vec![0; dims.len()];
    for d in (0..dims.len()).rev() {
        index[d] = flat % dims[d];
        flat /= dims[d];
    }
    index
}

fn ravel(index: &[u64], dims: &[u64]) -> usize {
    index.iter().zip(dims).fold(0, |flat, (&i, &n)| flat * n + i) as usize
}

/// Small integers as f32: exact under addition at these sizes.
fn values(n: usize) -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec((-8i32..=8).prop_map(|v| v as f32), n)
}

/// Rows of floats where ties, signed zeros, infinities and NaNs of both signs are common.
fn special_rows() -> impl Strategy<Value = (u64, u64, Vec<f32>)> {
    let pool = [-2.0, -1.0, -0.0, 0.0, 1.0, 2.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -f32::NAN];
    (1u64..=3, 1u64..=40).prop_flat_map(move |(rows, n)| {
        let element = prop::sample::select(pool.to_vec());
        (Just(rows), Just(n), prop::collection::vec(element, (rows * n) as usize))
    })
}

/// JAX's comparator of floats for `jnp.sort` and `argsort`: -0 as 0, every NaN as one
/// NaN, then `<` (or `>`) in total order.
fn canonical_comparator(direction: &str) -> String {
    let canonical = |x: &str, p: u32| {
        format!(
            "  {x} = f32[] parameter({p})\n  {x}n = pred[] compare({x}, {x}), direction=NE\n  \
             {x}z = pred[] compare({x}, zero), direction=EQ\n  {x}a = f32[] select({x}z, zero, {x})\n  \
             {x}c = f32[] select({x}n, nan, {x}a)\n"
        )
    };
    format!(
        "less {{\n  zero = f32[] constant(0)\n  nan = f32[] constant(nan)\n{}{}  p = s32[] parameter(2)\n  \
         q = s32[] parameter(3)\n  ROOT r = pred[] compare(ac, bc), direction={direction}, type=TOTALORDER\n}}\n",
        canonical("a", 0),
        canonical("b", 1)
    )
}

fn window_problem() -> impl Strategy<Value = WindowProblem> {
    (1usize..=3)
        .prop_flat_map(|rank| {
            (
                prop::collection::vec(1u64..=6, rank),
                prop::collection::vec(1u64..=3, rank),
                prop::collection::vec(1u64..=3, rank),
                prop::collection::vec((0u64..=2, 0u64..=2), rank),
                prop::collection::vec(1u64..=2, rank),
                prop::collection::vec(1u64..=2, rank),
                any::<bool>(),
            )
        })
        .prop_flat_map(|(dims, size, stride, pad, base_dilation, window_dilation, max)| {
            let n = dims.iter().product::<u64>() as usize;
            values(n).prop_map(move |values| WindowProblem {
                dims: dims.clone(),
                values,
                size: size.clone(),
                stride: stride.clone(),
                pad: pad.clone(),
                base_dilation: base_dilation.clone(),
                window_dilation: window_dilation.clone(),
                max,
            })
        })
        .prop_filter("at least one window", |p| p.out_dims().iter().all(|&c| c > 0))
}

/// A cumulative sum or maximum along one dimension, as JAX lowers `cumsum` and
/// `cummax` (a window as long as the dimension, padded low by that less one), of
/// values whose sums round: the runtime's one-pass running reduction must give XLA's
/// order's bits.
fn cumulative_problem() -> impl Strategy<Value = WindowProblem> {
    (1usize..=3)
        .prop_flat_map(|rank| (prop::collection::vec(1u64..=40, rank), 0..rank, any::<bool>()))
        .prop_filter("a dimension to run along", |(dims, axis, _)| dims[*axis] > 1)
        .prop_flat_map(|(dims, axis, max)| {
            let n = dims.iter().product::<u64>() as usize;
            let rank = dims.len();
            let len = dims[axis];
            prop::collection::vec(-1.0e3f32..1.0e3, n).prop_map(move |values| WindowProblem {
                dims: dims.clone(),
                values,
                size: (0..rank).map(|d| if d == axis { len } else { 1 }).collect(),
                stride: vec![1; rank],
                pad: (0..rank).map(|d| if d == axis { (len - 1, 0) } else { (0, 0) }).collect(),
                base_dilation: vec![1; rank],
                window_dilation: vec![1; rank],
                max,
            })
        })
}

/// One convolution problem in NHWC layout by an HWIO kernel (`b01f_01io->b01f`) or an
/// HWOI one (`b01f_01oi->b01f`, as input gradients have it), 1 or 2 spatial
/// dimensions, with feature groups.
#[derive(Debug, Clone)]
struct ConvProblem {
    batch: u64,
    spatial: Vec<u64>,
    kernel: Vec<u64>,
    groups: u64,
    inputs: u64,
    outputs_per_group: u64,
    outputs_first: bool,
    stride: Vec<u64>,
    pad: Vec<(u64, u64)>,
    lhs_dilation: Vec<u64>,
    rhs_dilation: Vec<u64>,
    x: Vec<f32>,
    w: Vec<f32>,
}

impl ConvProblem {
    fn window(&self) -> WindowProblem {
        WindowProblem {
            dims: self.spatial.clone(),
            values: Vec::new(),
            size: self.kernel.clone(),
            stride: self.stride.clone(),
            pad: self.pad.clone(),
            base_dilation: self.lhs_dilation.clone(),
            window_dilation: self.rhs_dilation.clone(),
            max: false,
        }
    }

    fn dims(&self) -> (Vec<u64>, Vec<u64>, Vec<u64>) {
        let features = self.inputs * self.groups;
        let outputs = self.outputs_per_group * self.groups;
        let x = [vec![self.batch], self.spatial.clone(), vec![features]].concat();
        let w = if self.outputs_first {
            [self.kernel.clone(), vec![outputs, self.inputs]].concat()
        } else {
            [self.kernel.clone(), vec![self.inputs, outputs]].concat()
        };
        let y = [vec![self.batch], self.window().out_dims(), vec![outputs]].concat();
        (x, w, y)
    }

    fn hlo(&self) -> String {
        let (x, w, y) = self.dims();
        let digits: String = (0..self.spatial.len()).map(|d| d.to_string()).collect();
        let kernel = if self.outputs_first { "oi" } else { "io" };
        let pad: Vec<String> = self.pad.iter().map(|(l, h)| format!("{l}_{h}")).collect();
        format!(
            "HloModule c\nENTRY e {{\n  x = {} parameter(0)\n  w = {} parameter(1)\n  \
             ROOT y = {} convolution(x, w), window={{size={} stride={} pad={} lhs_dilate={} rhs_dilate={}}}, \
             dim_labels=b{digits}f_{digits}{kernel}->b{digits}f, feature_group_count={}\n}}\n",
            f32_shape(&x),
            f32_shape(&w),
            f32_shape(&y),
            list(&self.kernel, "x"),
            list(&self.stride, "x"),
            pad.join("x"),
            list(&self.lhs_dilation, "x"),
            list(&self.rhs_dilation, "x"),
            self.groups,
        )
    }

    /// Each output element summed with plain index arithmetic.
    fn reference(&self) -> Vec<f32> {
        let (xd, wd, yd) = self.dims();
        let rank = self.spatial.len();
        let per_group = self.outputs_per_group;
        let mut y = vec![0.0f32; yd.iter().product::<u64>() as usize];
        for (flat, out) in y.iter_mut().enumerate() {
            let j = unravel(flat as u64, &yd);
            let (b, o) = (j[0], j[rank + 1]);
            let group = o / per_group;
            let positions: u64 = self.kernel.iter().product();
            for k in 0..positions {
                let k = unravel(k, &self.kernel);
                let mut at = vec![b];
                for d in 0..rank {
                    let p = (j[1 + d] * self.stride[d] + k[d] * self.rhs_dilation[d]) as i64 - self.pad[d].0 as i64;
                    let base = self.lhs_dilation[d] as i64;
                    if p < 0 || p % base != 0 || p / base >= self.spatial[d] as i64 {
                        break;
                    }
                    at.push((p / base) as u64);
                }
                if at.len() != rank + 1 {
                    continue;
                }
                for i in 0..self.inputs {
                    let xi = [at.clone(), vec![group * self.inputs + i]].concat();
                    let wi =
                        if self.outputs_first { [k.clone(), vec![o, i]] } else { [k.clone(), vec![i, o]] }.concat();
                    *out += self.x[ravel(&xi, &xd)] * self.w[ravel(&wi, &wd)];
                }
            }
        }
        y
    }
}

fn conv_problem() -> impl Strategy<Value = ConvProblem> {
    (1usize..=2, 1u64..=2, 1u64..=2, 1u64..=3, 1u64..=3, any::<bool>())
        .prop_flat_map(|(rank, batch, groups, inputs, outputs_per_group, outputs_first)| {
            (
                Just((batch, groups, inputs, outputs_per_group, outputs_first)),
                prop::collection::vec(1u64..=6, rank),
                prop::collection::vec(1u64..=3, rank),
                prop::collection::vec(1u64..=2, rank),
                prop::collection::vec((0u64..=2, 0u64..=2), rank),
                prop::collection::vec(1u64..=2, rank),
                prop::collection::vec(1u64..=2, rank),
            )
        })
        .prop_flat_map(
            |((batch, groups, inputs, outputs_per_group, outputs_first), spatial, kernel, stride, pad, lhs, rhs)| {
                let p = ConvProblem {
                    batch,
                    spatial,
                    kernel,
                    groups,
                    inputs,
                    outputs_per_group,
                    outputs_first,
                    stride,
                    pad,
                    lhs_dilation: lhs,
                    rhs_dilation: rhs,
                    x: Vec::new(),
                    w: Vec::new(),
                };
                let (x, w, _) = p.dims();
                let (nx, nw) = (x.iter().product::<u64>() as usize, w.iter().product::<u64>() as usize);
                (values(nx), values(nw)).prop_map(move |(x, w)| ConvProblem { x, w, ..p.clone() })
            },
        )
        .prop_filter("at least one window", |p| p.window().out_dims().iter().all(|&c| c > 0))
}

/// The gradient of a stride-1 convolution by its kernel, as `jax.grad` writes it
/// (`f01b_i01o->01bf`): the input `x[n, h, w, b]` (its features are the forward batch,
/// its batch the forward features), the kernel `g[n, kh, kw, o]` (the forward output's
/// gradient), a window as large as `g`'s spatial dimensions, any padding.
#[derive(Debug, Clone)]
struct KernelGradient {
    x_dims: [u64; 4],
    g_dims: [u64; 4],
    pad: [(u64, u64); 2],
    x: Vec<f32>,
    g: Vec<f32>,
}

impl KernelGradient {
    fn out_dims(&self) -> [u64; 4] {
        let [_, h, w, b] = self.x_dims;
        let [_, kh, kw, o] = self.g_dims;
        let [(top, bottom), (left, right)] = self.pad;
        [h + top + bottom + 1 - kh, w + left + right + 1 - kw, b, o]
    }

    fn hlo(&self) -> String {
        let [_, kh, kw, _] = self.g_dims;
        let [(top, bottom), (left, right)] = self.pad;
        format!(
            "HloModule kg\nENTRY e {{\n  x = {} parameter(0)\n  g = {} parameter(1)\n  \
             ROOT y = {} convolution(x, g), window={{size={kh}x{kw} pad={top}_{bottom}x{left}_{right}}}, \
             dim_labels=f01b_i01o->01bf\n}}\n",
            f32_shape(&self.x_dims),
            f32_shape(&self.g_dims),
            f32_shape(&self.out_dims()),
        )
    }

    /// `y[oy, ox, b, o] = Σ x[i, oy + y - top, ox + x - left, b] · g[i, y, x, o]` over
    /// the elements inside `x`, in plain index arithmetic.
    fn reference(&self) -> Vec<f32> {
        let [n, h, w, _] = self.x_dims;
        let [_, kh, kw, _] = self.g_dims;
        let [(top, _), (left, _)] = self.pad;
        let out = self.out_dims();
        let mut y = vec![0.0f32; out.iter().product::<u64>() as usize];
        for (flat, sum) in y.iter_mut().enumerate() {
            let j = unravel(flat as u64, &out);
            for (i, dy, dx) in (0..n).flat_map(|i| (0..kh).flat_map(move |dy| (0..kw).map(move |dx| (i, dy, dx)))) {
                let (row, column) = ((j[0] + dy) as i64 - top as i64, (j[1] + dx) as i64 - left as i64);
                if row < 0 || column < 0 || row >= h as i64 || column >= w as i64 {
                    continue;
                }
                let xi = ravel(&[i, row as u64, column as u64, j[2]], &self.x_dims);
                *sum += self.x[xi] * self.g[ravel(&[i, dy, dx, j[3]], &self.g_dims)];
            }
        }
        y
    }

    fn run(&self) -> Vec<f32> {
        Bench::new().run_f32(&self.hlo(), &CompileOptions::exact(Target::Trn1), &[&self.x, &self.g])
    }
}

fn kernel_gradient_problem() -> impl Strategy<Value = KernelGradient> {
    (1u64..=3, 1u64..=6, 1u64..=6, 1u64..=4, 1u64..=4, (0u64..=2, 0u64..=2), (0u64..=2, 0u64..=2))
        .prop_flat_map(|(n, h, w, b, o, vertical, horizontal)| {
            let (hp, wp) = (h + vertical.0 + vertical.1, w + horizontal.0 + horizontal.1);
            (Just((n, h, w, b, o, [vertical, horizontal])), 1..=hp, 1..=wp)
        })
        .prop_flat_map(|((n, h, w, b, o, pad), kh, kw)| {
            let (x_dims, g_dims) = ([n, h, w, b], [n, kh, kw, o]);
            (values((n * h * w * b) as usize), values((n * kh * kw * o) as usize))
                .prop_map(move |(x, g)| KernelGradient { x_dims, g_dims, pad, x, g })
        })
}

/// Rows of distinct-ish small integers (ties included) and a `k` that fits.
fn top_k_problem() -> impl Strategy<Value = (u64, u64, Vec<f32>, u64, bool)> {
    (1u64..=4, 1u64..=12)
        .prop_flat_map(|(rows, n)| (Just(rows), Just(n), values((rows * n) as usize), 1..=n, any::<bool>()))
}

/// Rows of two keys of small integers (ties are common) and a row length that is not
/// always a power of two.
fn sort_problem() -> impl Strategy<Value = (u64, u64, Vec<f32>, Vec<f32>, bool)> {
    (1u64..=3, 1u64..=40).prop_flat_map(|(rows, n)| {
        let len = (rows * n) as usize;
        (Just(rows), Just(n), values(len), values(len), any::<bool>())
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn reduce_window_matches_a_plain_reference(problem in window_problem()) {
        let hlo = problem.hlo();
        let ours = Bench::new().run_f32(&hlo, &CompileOptions::exact(Target::Trn1), &[&problem.values]);
        prop_assert_eq!(ours, problem.reference(), "{}", hlo);
    }

    #[test]
    fn a_cumulative_reduction_gives_the_bits_of_xlas_order(problem in cumulative_problem()) {
        let hlo = problem.hlo();
        let ours = Bench::new().run_f32(&hlo, &CompileOptions::exact(Target::Trn1), &[&problem.values]);
        let expected = problem.reference();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        prop_assert_eq!(bits(&ours), bits(&expected), "{}", hlo);
    }

    #[test]
    fn convolution_matches_a_plain_reference(problem in conv_problem()) {
        let hlo = problem.hlo();
        let ours = Bench::new().run_f32(&hlo, &CompileOptions::exact(Target::Trn1), &[&problem.x, &problem.w]);
        prop_assert_eq!(ours, problem.reference(), "{}", hlo);
    }

    #[test]
    fn a_convolutions_kernel_gradient_matches_a_plain_reference(problem in kernel_gradient_problem()) {
        prop_assert_eq!(problem.run(), problem.reference(), "{}", problem.hlo());
    }

    #[test]
    fn top_k_matches_a_stable_sort_of_each_row((rows, n, values, k, largest) in top_k_problem()) {
        let hlo = format!(
            "HloModule tk\nENTRY e {{\n  x = f32[{rows},{n}] parameter(0)\n  \
             t = (f32[{rows},{k}], s32[{rows},{k}]) topk(x), k={k}, largest={largest}\n  \
             ROOT i = s32[{rows},{k}] get-tuple-element(t), index=1\n}}\n"
        );
        let ours = Bench::new().run(&hlo, &CompileOptions::exact(Target::Trn1), &[f32_bytes(&values)]);
        let ours = ints(&ours);
        let mut expected = Vec::new();
        for row in values.chunks(n as usize) {
            let mut order: Vec<usize> = (0..row.len()).collect();
            // A stable sort keeps equal elements in position order.
            order.sort_by(|&a, &b| if largest { row[b].total_cmp(&row[a]) } else { row[a].total_cmp(&row[b]) });
            expected.extend(order.iter().take(k as usize).map(|&i| i as i32));
        }
        prop_assert_eq!(ours, expected, "{}", hlo);
    }

    #[test]
    fn sort_by_two_keys_with_a_payload_matches_a_stable_sort(
        (rows, n, first, second, descending) in sort_problem()
    ) {
        // Lexicographic on (first, second); a comparator of several steps, so the
        // general (bitonic) path runs. The payload is each element's position.
        let direction = if descending { "GT" } else { "LT" };
        let ty = format!("f32[{rows},{n}]");
        let hlo = format!(
            "HloModule s\nless {{\n  a0 = f32[] parameter(0)\n  b0 = f32[] parameter(1)\n  a1 = f32[] parameter(2)\n  \
             b1 = f32[] parameter(3)\n  p = s32[] parameter(4)\n  q = s32[] parameter(5)\n  \
             lt0 = pred[] compare(a0, b0), direction={direction}, type=TOTALORDER\n  eq0 = pred[] compare(a0, b0), direction=EQ\n  \
             lt1 = pred[] compare(a1, b1), direction={direction}, type=TOTALORDER\n  tie = pred[] and(eq0, lt1)\n  \
             ROOT r = pred[] or(lt0, tie)\n}}\n\
             ENTRY e {{\n  x = {ty} parameter(0)\n  y = {ty} parameter(1)\n  i = s32[{rows},{n}] iota(), iota_dimension=1\n  \
             s = ({ty}, {ty}, s32[{rows},{n}]) sort(x, y, i), dimensions={{1}}, is_stable=true, to_apply=less\n  \
             ROOT o = s32[{rows},{n}] get-tuple-element(s), index=2\n}}\n"
        );
        let ours = Bench::new().run(&hlo, &CompileOptions::exact(Target::Trn1), &[f32_bytes(&first), f32_bytes(&second)]);
        let ours = ints(&ours);
        let mut expected = Vec::new();
        for (a, b) in first.chunks(n as usize).zip(second.chunks(n as usize)) {
            let mut order: Vec<usize> = (0..a.len()).collect();
            order.sort_by(|&i, &j| {
                let by = a[i].total_cmp(&a[j]).then(b[i].total_cmp(&b[j]));
                if descending { by.reverse() } else { by }
            });
            expected.extend(order.iter().map(|&i| i as i32));
        }
        prop_assert_eq!(ours, expected, "{}", hlo);
    }

    #[test]
    fn an_argsort_by_jaxs_comparator_matches_a_stable_sort_of_canonical_keys(
        (rows, n, values, descending) in special_rows().prop_flat_map(|p| (Just(p.0), Just(p.1), Just(p.2), any::<bool>()))
    ) {
        // The comparator maps each side's element through the same steps, so the
        // runtime sorts by keys, not by the network.
        let direction = if descending { "GT" } else { "LT" };
        let ty = format!("f32[{rows},{n}]");
        let hlo = format!(
            "HloModule s\n{}ENTRY e {{\n  x = {ty} parameter(0)\n  i = s32[{rows},{n}] iota(), iota_dimension=1\n  \
             s = ({ty}, s32[{rows},{n}]) sort(x, i), dimensions={{1}}, is_stable=true, to_apply=less\n  \
             ROOT o = s32[{rows},{n}] get-tuple-element(s), index=1\n}}\n",
            canonical_comparator(direction)
        );
        let bytes = f32_bytes(&values);
        let ours = Bench::new().run(&hlo, &CompileOptions::exact(Target::Trn1), &[bytes]);
        let ours = ints(&ours);
        let key = |x: f32| if x.is_nan() { f32::NAN } else if x == 0.0 { 0.0 } else { x };
        let mut expected = Vec::new();
        for row in values.chunks(n as usize) {
            let mut order: Vec<usize> = (0..row.len()).collect();
            order.sort_by(|&i, &j| {
                let by = key(row[i]).total_cmp(&key(row[j]));
                if descending { by.reverse() } else { by }
            });
            expected.extend(order.iter().map(|&i| i as i32));
        }
        prop_assert_eq!(ours, expected, "{}", hlo);
    }

    #[test]
    fn a_sort_by_ieee_order_puts_nans_after_every_number_without_failing(
        (rows, n, values, descending) in special_rows().prop_flat_map(|p| (Just(p.0), Just(p.1), Just(p.2), any::<bool>()))
    ) {
        // A single `<` without TOTALORDER: NaN compares with nothing, which an order
        // taking it as equal to everything would make inconsistent.
        let direction = if descending { "GT" } else { "LT" };
        let ty = format!("f32[{rows},{n}]");
        let hlo = format!(
            "HloModule s\nless {{\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  p = s32[] parameter(2)\n  \
             q = s32[] parameter(3)\n  ROOT r = pred[] compare(a, b), direction={direction}\n}}\n\
             ENTRY e {{\n  x = {ty} parameter(0)\n  i = s32[{rows},{n}] iota(), iota_dimension=1\n  \
             s = ({ty}, s32[{rows},{n}]) sort(x, i), dimensions={{1}}, is_stable=true, to_apply=less\n  \
             ROOT o = s32[{rows},{n}] get-tuple-element(s), index=1\n}}\n"
        );
        let bytes = f32_bytes(&values);
        let ours = Bench::new().run(&hlo, &CompileOptions::exact(Target::Trn1), &[bytes]);
        let ours = ints(&ours);
        let mut expected = Vec::new();
        for row in values.chunks(n as usize) {
            let mut order: Vec<usize> = (0..row.len()).collect();
            order.sort_by(|&i, &j| {
                let (x, y) = (row[i], row[j]);
                let by = x.partial_cmp(&y).unwrap_or_else(|| x.is_nan().cmp(&y.is_nan()));
                if descending { by.reverse() } else { by }
            });
            expected.extend(order.iter().map(|&i| i as i32));
        }
        prop_assert_eq!(ours, expected, "{}", hlo);
    }

    #[test]
    fn an_arg_max_reduce_gives_the_first_greatest_element_or_the_first_nan(
        (rows, n, values) in special_rows()
    ) {
        // JAX's arg-max reducer: the greater value, a NaN, or of equal values the lower index.
        let hlo = format!(
            "HloModule am\nbest {{\n  a = f32[] parameter(0)\n  i = s32[] parameter(1)\n  b = f32[] parameter(2)\n  \
             j = s32[] parameter(3)\n  gt = pred[] compare(a, b), direction=GT\n  nan = pred[] compare(a, a), direction=NE\n  \
             wins = pred[] or(gt, nan)\n  v = f32[] select(wins, a, b)\n  eq = pred[] compare(a, b), direction=EQ\n  \
             lower = pred[] compare(i, j), direction=LT\n  tie = pred[] and(eq, lower)\n  first = pred[] or(wins, tie)\n  \
             k = s32[] select(first, i, j)\n  ROOT t = (f32[], s32[]) tuple(v, k)\n}}\n\
             ENTRY e {{\n  x = f32[{rows},{n}] parameter(0)\n  i = s32[{rows},{n}] iota(), iota_dimension=1\n  \
             lo = f32[] constant(-inf)\n  zero = s32[] constant(0)\n  \
             r = (f32[{rows}], s32[{rows}]) reduce(x, i, lo, zero), dimensions={{1}}, to_apply=best\n  \
             ROOT k = s32[{rows}] get-tuple-element(r), index=1\n}}\n"
        );
        let bytes = f32_bytes(&values);
        let ours = Bench::new().run(&hlo, &CompileOptions::exact(Target::Trn1), &[bytes]);
        let ours = ints(&ours);
        let expected: Vec<i32> = values
            .chunks(n as usize)
            .map(|row| {
                let first_nan = row.iter().position(|x| x.is_nan());
                let greatest = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                first_nan.unwrap_or_else(|| row.iter().position(|&x| x == greatest).unwrap_or(0)) as i32
            })
            .collect();
        prop_assert_eq!(ours, expected, "{}", hlo);
    }
}

/// An infinity in the input of a kernel gradient reaches exactly the outputs whose sums
/// take it: none becomes NaN through the zeros that pad the kernel on the fast path.
#[test]
fn an_infinity_in_a_kernel_gradients_input_reaches_only_its_own_sums() {
    let (x_dims, g_dims) = ([2, 5, 6, 3], [2, 4, 4, 2]);
    let mut x: Vec<f32> = (0..x_dims.iter().product::<u64>()).map(|i| (i % 7) as f32 - 3.0).collect();
    x[ravel(&[1, 2, 3, 1], &x_dims)] = f32::INFINITY;
    let g = vec![1.0; g_dims.iter().product::<u64>() as usize];
    let problem = KernelGradient { x_dims, g_dims, pad: [(1, 1), (1, 0)], x, g };
    let (ours, expected) = (problem.run(), problem.reference());
    assert!(expected.iter().any(|y| y.is_infinite()) && expected.iter().all(|y| !y.is_nan()), "{expected:?}");
    assert_eq!(ours, expected, "{}", problem.hlo());
}
