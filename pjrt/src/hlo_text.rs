//! An `HloModuleProto` as HLO text, the form the compiler reads (as XLA prints it:
//! called computations first, `ENTRY` last, attributes in XLA's text syntax, the
//! instructions' `metadata` kept so that profiles can name the framework's operations
//! and source lines).

use std::collections::HashMap;
use std::fmt::Write;

use crate::proto::{
    ConvolutionDimensionNumbers, HloComputationProto, HloInstructionProto, HloModuleProto, LiteralProto, OpMetadata,
    ShapeProto, Window, primitive,
};

/// The module's text, or what in it cannot be written as text.
pub(crate) fn module_text(module: &HloModuleProto) -> Result<String, String> {
    let computations: HashMap<i64, &str> = module.computations.iter().map(|c| (c.id, c.name.as_str())).collect();
    let entry = module
        .computations
        .iter()
        .position(|c| c.id == module.entry_computation_id)
        .or_else(|| module.computations.iter().position(|c| c.name == module.entry_computation_name))
        .or_else(|| module.computations.len().checked_sub(1))
        .ok_or("the module has no computations")?;
    let mut out = format!("HloModule {}\n", name_token(&module.name));
    // The sums the rewritten resize gradients reduce with, one per element type.
    let mut sums: Vec<&str> = module
        .computations
        .iter()
        .flat_map(|c| &c.instructions)
        .filter(|i| i.opcode == "custom-call" && i.custom_call_target == "ResizeNearestGrad")
        .filter_map(|i| primitive::name(i.shape.as_ref()?.element_type))
        .collect();
    sums.sort_unstable();
    sums.dedup();
    for element in sums {
        let _ = write!(
            out,
            "\n%{SUM}.{element} {{\n  %{SUM}.{element}.a = {element}[] parameter(0)\n  %{SUM}.{element}.b = {element}[] parameter(1)\n  ROOT %{SUM}.{element}.sum = {element}[] add(%{SUM}.{element}.a, %{SUM}.{element}.b)\n}}\n"
        );
    }
    for (index, computation) in module.computations.iter().enumerate() {
        if index != entry {
            out.push('\n');
            computation_text(&mut out, computation, false, &computations)?;
        }
    }
    out.push('\n');
    computation_text(&mut out, &module.computations[entry], true, &computations)?;
    Ok(out)
}

/// The name of the scalar sums [`resize_nearest`] reduces with (`neuron_sum.f32`, …).
const SUM: &str = "neuron_sum";

/// torch-xla's nearest-neighbour resize by whole factors (`F.interpolate(…,
/// mode="nearest")`, custom calls `ResizeNearest` and `ResizeNearestGrad` on NHWC
/// arrays) as what it is: each element repeated `k1 × k2` times (a broadcast then a
/// reshape), and its gradient the sum of each `k1 × k2` block (a reshape then a
/// reduce). The lines to put first and the instruction's own line; `None` for every
/// other instruction.
fn resize_nearest(
    inst: &HloInstructionProto,
    shapes: &HashMap<i64, &ShapeProto>,
    names: &HashMap<i64, &str>,
) -> Result<Option<(Vec<String>, String)>, String> {
    let grad = match (inst.opcode.as_str(), inst.custom_call_target.as_str()) {
        ("custom-call", "ResizeNearest") => false,
        ("custom-call", "ResizeNearestGrad") => true,
        _ => return Ok(None),
    };
    // `"00"`: align_corners, half_pixel_centers (which whole factors make no matter).
    let config = String::from_utf8_lossy(&inst.backend_config);
    if config.chars().find(char::is_ascii_digit) == Some('1') {
        return Err(format!("{} with align_corners=True is not supported", inst.custom_call_target));
    }
    let input_id = *inst.operand_ids.first().ok_or("no input")?;
    let input = shapes.get(&input_id).ok_or("the input's shape is unknown")?;
    let output = inst.shape.as_ref().ok_or("no shape")?;
    let (small, large) =
        if grad { (&output.dimensions, &input.dimensions) } else { (&input.dimensions, &output.dimensions) };
    let whole = |d: usize| small[d] > 0 && large[d] % small[d] == 0;
    if small.len() != 4 || large.len() != 4 || small[0] != large[0] || small[3] != large[3] || !whole(1) || !whole(2) {
        return Err(format!(
            "{} from {small:?} to {large:?}: only whole factors of the two middle (NHWC) dimensions are supported",
            inst.custom_call_target
        ));
    }
    let (k1, k2) = (large[1] / small[1], large[2] / small[2]);
    let element = primitive::name(output.element_type).ok_or("the element type is not supported")?;
    let blocks = format!("{element}[{},{},{k1},{},{k2},{}]", small[0], small[1], small[2], small[3]);
    let (name, input_name) =
        (name_token(&inst.name), names.get(&input_id).map(|n| name_token(n)).ok_or("the input is unknown")?);
    let metadata =
        inst.metadata.as_ref().and_then(metadata_text).map(|m| format!(", metadata={m}")).unwrap_or_default();
    let shape = shape_text(output)?;
    Ok(Some(if grad {
        (
            vec![
                format!("%{name}.blocks = {blocks} reshape(%{input_name})"),
                format!("%{name}.zero = {element}[] constant(0)"),
            ],
            format!(
                "%{name} = {shape} reduce(%{name}.blocks, %{name}.zero), dimensions={{2,4}}, to_apply=%{SUM}.{element}{metadata}"
            ),
        )
    } else {
        (
            vec![format!("%{name}.blocks = {blocks} broadcast(%{input_name}), dimensions={{0,1,3,5}}")],
            format!("%{name} = {shape} reshape(%{name}.blocks){metadata}"),
        )
    }))
}

/// The operand id standing for the cropped input of a rewritten convolution.
const CROPPED_OPERAND: i64 = -1;

/// A convolution whose window has negative padding (torch-xla's gradients of strided
/// convolutions crop the input that way) as an explicit dilation and padding of its
/// input (`pad`, interior padding for `lhs_dilate`), a `slice` that crops it, then the
/// convolution over that with no padding and no input dilation: the lines to put
/// first, the rewritten instruction (its input the operand [`CROPPED_OPERAND`]) and the
/// name of that operand; `None` for every other instruction.
fn crop_instead_of_negative_padding(
    inst: &HloInstructionProto,
    shapes: &HashMap<i64, &ShapeProto>,
    names: &HashMap<i64, &str>,
) -> Result<Option<(HloInstructionProto, Vec<String>, String)>, String> {
    let negative =
        inst.window.as_ref().is_some_and(|w| w.dimensions.iter().any(|d| d.padding_low < 0 || d.padding_high < 0));
    let (Some(window), Some(dims), true) = (&inst.window, &inst.convolution_dimension_numbers, negative) else {
        return Ok(None);
    };
    if inst.opcode != "convolution" {
        return Err("negative window padding is taken on convolutions only".into());
    }
    let input_id = *inst.operand_ids.first().ok_or("no input")?;
    let input = shapes.get(&input_id).ok_or("the input's shape is unknown")?;
    let input_name = names.get(&input_id).map(|n| name_token(n)).ok_or("the input is unknown")?;
    let element = primitive::name(input.element_type).ok_or("the input's element type is not supported")?;
    let mut dilated = input.dimensions.clone();
    let mut cropped = input.dimensions.clone();
    let mut padding: Vec<String> = input.dimensions.iter().map(|_| "0_0".to_owned()).collect();
    let mut slices: Vec<String> = input.dimensions.iter().map(|&n| format!("[0:{n}:1]")).collect();
    let mut window = window.clone();
    for (d, spatial) in window.dimensions.iter_mut().zip(&dims.input_spatial_dimensions) {
        let axis = *spatial as usize;
        let n = *input.dimensions.get(axis).ok_or("a spatial dimension is out of range")?;
        let base = d.base_dilation.max(1);
        let (low, high) = (d.padding_low, d.padding_high);
        dilated[axis] = (n - 1).max(0) * base + 1 + low.max(0) + high.max(0);
        cropped[axis] = dilated[axis] - (-low).max(0) - (-high).max(0);
        if cropped[axis] < 1 {
            return Err("the window's negative padding crops the whole input".into());
        }
        padding[axis] = format!("{}_{}_{}", low.max(0), high.max(0), base - 1);
        slices[axis] = format!("[{}:{}:1]", (-low).max(0), (-low).max(0) + cropped[axis]);
        (d.padding_low, d.padding_high, d.base_dilation) = (0, 0, 1);
    }
    let shape = |dims: &[i64]| format!("{element}[{}]", dims.iter().map(i64::to_string).collect::<Vec<_>>().join(","));
    let base = name_token(&inst.name);
    let cropped_name = format!("{base}.cropped");
    let lines = vec![
        format!("%{base}.zero = {element}[] constant(0)"),
        format!(
            "%{base}.dilated = {} pad(%{input_name}, %{base}.zero), padding={}",
            shape(&dilated),
            padding.join("x")
        ),
        format!("%{cropped_name} = {} slice(%{base}.dilated), slice={{{}}}", shape(&cropped), slices.join(", ")),
    ];
    let mut rewritten = inst.clone();
    rewritten.window = Some(window);
    rewritten.operand_ids[0] = CROPPED_OPERAND;
    Ok(Some((rewritten, lines, cropped_name)))
}

/// A collective over several arrays at once (torch-xla reduces all the gradients in
/// one `all-reduce`) as one collective per array: the lines to put before `line`, which
/// becomes the tuple of their results. Each array is reduced as it would be in the
/// combined collective.
fn split_collective(inst: &HloInstructionProto, line: &mut String) -> Vec<String> {
    let collective = matches!(inst.opcode.as_str(), "all-reduce" | "all-gather" | "reduce-scatter" | "all-to-all");
    let Some(shape) = inst.shape.as_ref().filter(|s| s.element_type == primitive::TUPLE) else { return Vec::new() };
    if !collective || inst.operand_ids.len() < 2 || shape.tuple_shapes.len() != inst.operand_ids.len() {
        return Vec::new();
    }
    // `%name = (shapes) opcode(%a, %b), attributes`
    let (head, rest) = line.split_once(&format!(" {}(", inst.opcode)).unwrap_or((line.as_str(), ""));
    let (operands, attributes) = rest.split_once(')').unwrap_or((rest, ""));
    let name = name_token(&inst.name);
    let mut parts = Vec::new();
    let mut names = Vec::new();
    for (k, (operand, part_shape)) in operands.split(", ").zip(&shape.tuple_shapes).enumerate() {
        let Ok(part_shape) = shape_text(part_shape) else { return Vec::new() };
        parts.push(format!("%{name}.part{k} = {part_shape} {}({operand}){attributes}", inst.opcode));
        names.push(format!("%{name}.part{k}"));
    }
    let tuple_head = head.to_owned();
    *line = format!("{tuple_head} tuple({})", names.join(", "));
    parts
}

/// A name as the text parser takes it (XLA's names are already of this alphabet).
pub(crate) fn name_token(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).collect()
}

fn computation_text(
    out: &mut String,
    computation: &HloComputationProto,
    entry: bool,
    computations: &HashMap<i64, &str>,
) -> Result<(), String> {
    let names: HashMap<i64, &str> = computation.instructions.iter().map(|i| (i.id, i.name.as_str())).collect();
    let _ = writeln!(out, "{}%{} {{", if entry { "ENTRY " } else { "" }, name_token(&computation.name));
    let shapes: HashMap<i64, &ShapeProto> =
        computation.instructions.iter().filter_map(|i| Some((i.id, i.shape.as_ref()?))).collect();
    for inst in &computation.instructions {
        let root = if inst.id == computation.root_id { "ROOT " } else { "" };
        let failed =
            |e: String| format!("instruction `{}` ({}) of `{}`: {e}", inst.name, inst.opcode, computation.name);
        if let Some((before, line)) = resize_nearest(inst, &shapes, &names).map_err(failed)? {
            for part in before {
                let _ = writeln!(out, "  {part}");
            }
            let _ = writeln!(out, "  {root}{line}");
            continue;
        }
        let rewritten = crop_instead_of_negative_padding(inst, &shapes, &names).map_err(failed)?;
        let mut line = match &rewritten {
            Some((cropping, before, cropped)) => {
                for part in before {
                    let _ = writeln!(out, "  {part}");
                }
                let mut names = names.clone();
                names.insert(CROPPED_OPERAND, cropped.as_str());
                instruction_text(cropping, &names, computations).map_err(failed)?
            }
            None => instruction_text(inst, &names, computations).map_err(failed)?,
        };
        let inst = rewritten.as_ref().map_or(inst, |(cropping, _, _)| cropping);
        for part in split_collective(inst, &mut line) {
            let _ = writeln!(out, "  {part}");
        }
        let _ = writeln!(out, "  {root}{line}");
    }
    out.push_str("}\n");
    Ok(())
}

fn instruction_text(
    inst: &HloInstructionProto,
    names: &HashMap<i64, &str>,
    computations: &HashMap<i64, &str>,
) -> Result<String, String> {
    let shape = inst.shape.as_ref().ok_or("no shape")?;
    let operand =
        |id: &i64| names.get(id).map(|n| format!("%{}", name_token(n))).ok_or(format!("operand id {id} is unknown"));
    let operands = match inst.opcode.as_str() {
        "parameter" => inst.parameter_number.to_string(),
        "constant" => literal_text(inst.literal.as_ref().ok_or("a constant without a literal")?)?,
        _ => inst.operand_ids.iter().map(operand).collect::<Result<Vec<_>, _>>()?.join(", "),
    };
    let mut line = format!("%{} = {} {}({operands})", name_token(&inst.name), shape_text(shape)?, inst.opcode);
    let mut attribute = |name: &str, value: String| {
        let _ = write!(line, ", {name}={value}");
    };
    let called = |index: usize| -> Result<String, String> {
        let id = inst.called_computation_ids.get(index).ok_or("a called computation is missing")?;
        computations.get(id).map(|n| format!("%{}", name_token(n))).ok_or(format!("computation id {id} is unknown"))
    };
    let op = inst.opcode.as_str();
    match op {
        "get-tuple-element" => attribute("index", inst.tuple_index.to_string()),
        "iota" => attribute("iota_dimension", inst.dimensions.first().copied().unwrap_or(0).to_string()),
        // These print their dimensions even when there are none.
        "broadcast" | "transpose" | "reduce" | "reverse" | "map" => attribute("dimensions", list(&inst.dimensions)),
        _ if !inst.dimensions.is_empty() => attribute("dimensions", list(&inst.dimensions)),
        _ => {}
    }
    if !inst.slice_dimensions.is_empty() {
        let parts: Vec<String> =
            inst.slice_dimensions.iter().map(|s| format!("[{}:{}:{}]", s.start, s.limit, s.stride.max(1))).collect();
        attribute("slice", format!("{{{}}}", parts.join(", ")));
    }
    if !inst.dynamic_slice_sizes.is_empty() {
        attribute("dynamic_slice_sizes", list(&inst.dynamic_slice_sizes));
    }
    if let Some(padding) = &inst.padding_config {
        let parts: Vec<String> = padding
            .dimensions
            .iter()
            .map(|d| match d.interior_padding {
                0 => format!("{}_{}", d.edge_padding_low, d.edge_padding_high),
                interior => format!("{}_{}_{interior}", d.edge_padding_low, d.edge_padding_high),
            })
            .collect();
        attribute("padding", parts.join("x"));
    }
    if let Some(window) = &inst.window
        && !window.dimensions.is_empty()
    {
        attribute("window", window_text(window));
    }
    if let Some(dims) = &inst.convolution_dimension_numbers {
        attribute("dim_labels", dim_labels(dims, shape.dimensions.len())?);
    }
    if op == "convolution" {
        if inst.feature_group_count > 1 {
            attribute("feature_group_count", inst.feature_group_count.to_string());
        }
        if inst.batch_group_count > 1 {
            attribute("batch_group_count", inst.batch_group_count.to_string());
        }
    }
    if let Some(dot) = &inst.dot_dimension_numbers {
        if !dot.lhs_batch_dimensions.is_empty() {
            attribute("lhs_batch_dims", list(&dot.lhs_batch_dimensions));
        }
        attribute("lhs_contracting_dims", list(&dot.lhs_contracting_dimensions));
        if !dot.rhs_batch_dimensions.is_empty() {
            attribute("rhs_batch_dims", list(&dot.rhs_batch_dimensions));
        }
        attribute("rhs_contracting_dims", list(&dot.rhs_contracting_dimensions));
    }
    if !inst.comparison_direction.is_empty() {
        attribute("direction", inst.comparison_direction.clone());
    }
    if !inst.comparison_type.is_empty() && inst.comparison_type != "NOTYPE" {
        attribute("type", inst.comparison_type.clone());
    }
    if let Some(gather) = &inst.gather_dimension_numbers {
        attribute("offset_dims", list(&gather.offset_dims));
        attribute("collapsed_slice_dims", list(&gather.collapsed_slice_dims));
        attribute("start_index_map", list(&gather.start_index_map));
        if !gather.operand_batching_dims.is_empty() {
            attribute("operand_batching_dims", list(&gather.operand_batching_dims));
            attribute("start_indices_batching_dims", list(&gather.start_indices_batching_dims));
        }
        attribute("index_vector_dim", gather.index_vector_dim.to_string());
        attribute("slice_sizes", list(&inst.gather_slice_sizes));
    }
    if let Some(scatter) = &inst.scatter_dimension_numbers {
        attribute("update_window_dims", list(&scatter.update_window_dims));
        attribute("inserted_window_dims", list(&scatter.inserted_window_dims));
        attribute("scatter_dims_to_operand_dims", list(&scatter.scatter_dims_to_operand_dims));
        if !scatter.input_batching_dims.is_empty() {
            attribute("input_batching_dims", list(&scatter.input_batching_dims));
            attribute("scatter_indices_batching_dims", list(&scatter.scatter_indices_batching_dims));
        }
        attribute("index_vector_dim", scatter.index_vector_dim.to_string());
    }
    if inst.indices_are_sorted {
        attribute("indices_are_sorted", "true".into());
    }
    if inst.unique_indices {
        attribute("unique_indices", "true".into());
    }
    if inst.is_stable {
        attribute("is_stable", "true".into());
    }
    match op {
        "all-reduce" | "all-gather" | "reduce-scatter" | "all-to-all" | "collective-permute" => {
            if let Some(groups) = replica_groups(inst) {
                attribute("replica_groups", groups);
            }
            if inst.channel_id > 0 {
                attribute("channel_id", inst.channel_id.to_string());
            }
            if inst.use_global_device_ids {
                attribute("use_global_device_ids", "true".into());
            }
            if !inst.source_target_pairs.is_empty() {
                let pairs: Vec<String> =
                    inst.source_target_pairs.iter().map(|p| format!("{{{},{}}}", p.source, p.target)).collect();
                attribute("source_target_pairs", format!("{{{}}}", pairs.join(",")));
            }
        }
        _ => {}
    }
    match op {
        "while" => {
            attribute("condition", called(1)?);
            attribute("body", called(0)?);
        }
        "conditional" => {
            let branches = (0..inst.called_computation_ids.len()).map(called).collect::<Result<Vec<_>, _>>()?;
            attribute("branch_computations", format!("{{{}}}", branches.join(", ")));
        }
        "select-and-scatter" => {
            attribute("select", called(0)?);
            attribute("scatter", called(1)?);
        }
        "fusion" => return Err("fused instructions are not taken; send the module before fusion".into()),
        _ if !inst.called_computation_ids.is_empty() => attribute("to_apply", called(0)?),
        _ => {}
    }
    match op {
        "rng" => attribute(
            "distribution",
            match inst.distribution {
                1 => "rng_uniform",
                2 => "rng_normal",
                other => return Err(format!("unknown random distribution {other}")),
            }
            .into(),
        ),
        "rng-bit-generator" => attribute(
            "algorithm",
            match inst.rng_algorithm {
                1 => "rng_three_fry",
                2 => "rng_philox",
                _ => "rng_default",
            }
            .into(),
        ),
        "reduce-precision" => {
            attribute("exponent_bits", inst.exponent_bits.to_string());
            attribute("mantissa_bits", inst.mantissa_bits.to_string());
        }
        "batch-norm-training" | "batch-norm-inference" | "batch-norm-grad" => {
            attribute("epsilon", format!("{:?}", inst.epsilon));
            attribute("feature_index", inst.feature_index.to_string());
        }
        "topk" => {
            attribute("k", inst.k.to_string());
            attribute("largest", inst.largest.to_string());
        }
        "custom-call" => {
            attribute("custom_call_target", quoted(&inst.custom_call_target));
            if !inst.backend_config.is_empty() {
                attribute("backend_config", quoted(&String::from_utf8_lossy(&inst.backend_config)));
            }
        }
        _ => {}
    }
    if let Some(metadata) = &inst.metadata
        && let Some(text) = metadata_text(metadata)
    {
        attribute("metadata", text);
    }
    Ok(line)
}

fn list(values: &[i64]) -> String {
    let parts: Vec<String> = values.iter().map(i64::to_string).collect();
    format!("{{{}}}", parts.join(","))
}

fn quoted(text: &str) -> String {
    format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
}

/// `f32[4,8]`, `(f32[4], s32[])`: layouts are left out (every array is read as
/// row-major, which is what its values mean whatever its layout).
pub(crate) fn shape_text(shape: &ShapeProto) -> Result<String, String> {
    if shape.element_type == primitive::TUPLE {
        let parts = shape.tuple_shapes.iter().map(shape_text).collect::<Result<Vec<_>, _>>()?;
        return Ok(format!("({})", parts.join(", ")));
    }
    let name = primitive::name(shape.element_type).ok_or_else(|| match shape.element_type {
        15 | 18 => format!(
            "complex element type ({}) is not supported on NeuronCores",
            if shape.element_type == 15 { "c64" } else { "c128" }
        ),
        other => format!("element type {other} (XLA PrimitiveType) is not supported on NeuronCores"),
    })?;
    let dims: Vec<String> = shape.dimensions.iter().map(i64::to_string).collect();
    Ok(format!("{name}[{}]", dims.join(",")))
}

fn window_text(window: &Window) -> String {
    let join = |f: &dyn Fn(&crate::proto::WindowDimension) -> String| -> String {
        window.dimensions.iter().map(f).collect::<Vec<_>>().join("x")
    };
    let mut text = format!("size={}", join(&|d| d.size.to_string()));
    if window.dimensions.iter().any(|d| d.stride > 1) {
        let _ = write!(text, " stride={}", join(&|d| d.stride.max(1).to_string()));
    }
    if window.dimensions.iter().any(|d| d.padding_low != 0 || d.padding_high != 0) {
        let _ = write!(text, " pad={}", join(&|d| format!("{}_{}", d.padding_low, d.padding_high)));
    }
    if window.dimensions.iter().any(|d| d.base_dilation > 1) {
        let _ = write!(text, " lhs_dilate={}", join(&|d| d.base_dilation.max(1).to_string()));
    }
    if window.dimensions.iter().any(|d| d.window_dilation > 1) {
        let _ = write!(text, " rhs_dilate={}", join(&|d| d.window_dilation.max(1).to_string()));
    }
    if window.dimensions.iter().any(|d| d.window_reversal) {
        let _ = write!(text, " rhs_reversal={}", join(&|d| u8::from(d.window_reversal).to_string()));
    }
    format!("{{{text}}}")
}

/// `b01f_01io->b01f`: each operand's dimensions labelled in order (batch `b`, feature
/// `f`, input and output feature `i`/`o`, spatial dimensions by their number).
fn dim_labels(dims: &ConvolutionDimensionNumbers, rank: usize) -> Result<String, String> {
    let labels = |pairs: &[(i64, char)], spatial: &[i64]| -> Result<String, String> {
        let mut out = vec!['?'; rank];
        for &(dim, label) in pairs {
            *out.get_mut(dim as usize).ok_or("a convolution dimension is out of range")? = label;
        }
        for (index, &dim) in spatial.iter().enumerate() {
            let label = char::from_digit(index as u32, 10).ok_or("too many spatial dimensions")?;
            *out.get_mut(dim as usize).ok_or("a spatial dimension is out of range")? = label;
        }
        Ok(out.into_iter().collect())
    };
    Ok(format!(
        "{}_{}->{}",
        labels(
            &[(dims.input_batch_dimension, 'b'), (dims.input_feature_dimension, 'f')],
            &dims.input_spatial_dimensions
        )?,
        labels(
            &[(dims.kernel_input_feature_dimension, 'i'), (dims.kernel_output_feature_dimension, 'o')],
            &dims.kernel_spatial_dimensions
        )?,
        labels(
            &[(dims.output_batch_dimension, 'b'), (dims.output_feature_dimension, 'f')],
            &dims.output_spatial_dimensions
        )?,
    ))
}

/// `{{0,1},{2,3}}` from the explicit groups, or the iota form `[G,S]<=[N]`.
fn replica_groups(inst: &HloInstructionProto) -> Option<String> {
    let groups = |groups: &[crate::proto::ReplicaGroup]| {
        let parts: Vec<String> = groups.iter().map(|g| list(&g.replica_ids)).collect();
        format!("{{{}}}", parts.join(","))
    };
    if let Some(list) = &inst.collective_device_list {
        if let Some(iota) = &list.iota_replica_group_list {
            let dims: Vec<String> = iota.iota_reshape_dims.iter().map(i64::to_string).collect();
            return Some(format!("[{},{}]<=[{}]", iota.num_replica_groups, iota.num_devices_per_group, dims.join(",")));
        }
        return Some(groups(&list.replica_groups));
    }
    Some(groups(&inst.replica_groups))
}

fn metadata_text(metadata: &OpMetadata) -> Option<String> {
    let mut parts = Vec::new();
    if !metadata.op_type.is_empty() {
        parts.push(format!("op_type={}", quoted(&metadata.op_type)));
    }
    if !metadata.op_name.is_empty() {
        parts.push(format!("op_name={}", quoted(&metadata.op_name)));
    }
    if !metadata.source_file.is_empty() {
        parts.push(format!("source_file={}", quoted(&metadata.source_file)));
        parts.push(format!("source_line={}", metadata.source_line));
    }
    (!parts.is_empty()).then(|| format!("{{{}}}", parts.join(" ")))
}

/// A literal's values in row-major order, `{1, 2, 3}` (a scalar without braces).
fn literal_text(literal: &LiteralProto) -> Result<String, String> {
    let shape = literal.shape.as_ref().ok_or("a literal without a shape")?;
    let float = |v: f64| -> String {
        if v.is_nan() {
            "nan".into()
        } else if v.is_infinite() {
            if v > 0.0 { "inf".into() } else { "-inf".into() }
        } else {
            format!("{v:?}")
        }
    };
    let pairs = |bytes: &[u8]| bytes.chunks_exact(2).map(|c| [c[0], c[1]]).collect::<Vec<_>>();
    let values: Vec<String> = match shape.element_type {
        primitive::PRED => literal.preds.iter().map(|b| b.to_string()).collect(),
        primitive::S8 => literal.s8s.iter().map(|&b| (b as i8).to_string()).collect(),
        primitive::U8 => literal.u8s.iter().map(u8::to_string).collect(),
        primitive::S16 => pairs(&literal.s16s).into_iter().map(|b| i16::from_le_bytes(b).to_string()).collect(),
        primitive::U16 => pairs(&literal.u16s).into_iter().map(|b| u16::from_le_bytes(b).to_string()).collect(),
        primitive::S32 => literal.s32s.iter().map(i32::to_string).collect(),
        primitive::S64 => literal.s64s.iter().map(i64::to_string).collect(),
        primitive::U32 => literal.u32s.iter().map(u32::to_string).collect(),
        primitive::U64 => literal.u64s.iter().map(u64::to_string).collect(),
        // f32 printed as f32 (its shortest text reads back as the same f32).
        primitive::F32 => {
            literal.f32s.iter().map(|&v| if v.is_finite() { format!("{v:?}") } else { float(v.into()) }).collect()
        }
        primitive::F64 => literal.f64s.iter().map(|&v| float(v)).collect(),
        primitive::F16 => pairs(&literal.f16s).into_iter().map(|b| float(f16_to_f64(u16::from_le_bytes(b)))).collect(),
        primitive::BF16 => pairs(&literal.bf16s)
            .into_iter()
            .map(|b| float(f64::from(f32::from_bits(u32::from(u16::from_le_bytes(b)) << 16))))
            .collect(),
        other => return Err(format!("constants of element type {other} are not supported")),
    };
    let count: i64 = shape.dimensions.iter().product();
    if values.len() as i64 != count {
        return Err(format!("the literal has {} values for {} elements", values.len(), count));
    }
    Ok(if shape.dimensions.is_empty() { values.join("") } else { format!("{{{}}}", values.join(", ")) })
}

/// An IEEE half's value.
fn f16_to_f64(bits: u16) -> f64 {
    let sign = if bits & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exponent = i32::from((bits >> 10) & 0x1f);
    let mantissa = f64::from(bits & 0x3ff);
    sign * match exponent {
        0 => mantissa * 2f64.powi(-24),
        0x1f if mantissa == 0.0 => f64::INFINITY,
        0x1f => f64::NAN,
        e => (1.0 + mantissa / 1024.0) * 2f64.powi(e - 15),
    }
}

/// Where the instruction an error names came from in the framework's program:
/// `` `aten__fft_c2c` at train.py:12 `` from its metadata, or, for a parameter or
/// constant, from the first instruction that uses it.
pub(crate) fn origin_of_error(module: &HloModuleProto, error: &str) -> Option<String> {
    let name = error.split("instruction `").nth(1)?.split('`').next()?;
    let computation =
        module.computations.iter().find(|c| c.instructions.iter().any(|i| name_token(&i.name) == name))?;
    let inst = computation.instructions.iter().find(|i| name_token(&i.name) == name)?;
    framework_operation(inst).or_else(|| {
        computation.instructions.iter().filter(|user| user.operand_ids.contains(&inst.id)).find_map(framework_operation)
    })
}

/// The framework operation an instruction came from, `aten::addmm at train.py:12`
/// (torch-xla writes `aten::addmm` as `aten__addmm`), from its metadata; torch-xla's
/// own bookkeeping (`xla::device_data`, `prim::Constant`) is none.
pub(crate) fn framework_operation(inst: &HloInstructionProto) -> Option<String> {
    let metadata = inst.metadata.as_ref()?;
    let op = &metadata.op_type;
    if op.is_empty() || op.starts_with("xla__") || op.starts_with("prim__") {
        return None;
    }
    let operator = op.replacen("__", "::", 1);
    let file = metadata.source_file.rsplit('/').next().unwrap_or_default();
    Some(if file.is_empty() { operator } else { format!("{operator} at {file}:{}", metadata.source_line) })
}
