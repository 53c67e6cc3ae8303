//! Parsers of HLO attributes and literals (dimension lists, slices, padding, windows,
//! replica groups, comparison directions, element types and constants), each with a
//! message that names what was wrong.

use crate::dtype::{ArrayType, DType, DTypeClass};
use crate::hlo::{self, Shape};
use crate::isa::{CompareDirection, ConvDims, DilatedWindow, Op, Window};

pub(super) fn strip_percent(name: &str) -> &str {
    name.strip_prefix('%').unwrap_or(name)
}

pub(super) fn attr<'i>(inst: &'i hlo::Instruction, name: &str) -> Result<&'i str, String> {
    inst.attribute(name).ok_or_else(|| format!("`{}` needs the attribute `{name}`", inst.opcode))
}

/// `{1,0}` → `[1, 0]`; a missing optional attribute is an empty list.
pub(super) fn dim_list(inst: &hlo::Instruction, name: &str, optional: bool) -> Result<Vec<u32>, String> {
    let value = match inst.attribute(name) {
        Some(v) => v,
        None if optional => return Ok(Vec::new()),
        None => return Err(format!("`{}` needs the attribute `{name}`", inst.opcode)),
    };
    let inner = value
        .strip_prefix('{')
        .and_then(|v| v.strip_suffix('}'))
        .ok_or_else(|| format!("`{name}={value}` should be a list like {{0,1}}"))?;
    inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<u32>().map_err(|_| format!("`{name}={value}`: `{s}` is not a dimension index")))
        .collect()
}

/// `slice={[0:4:2], [1:5]}` → the slice operation.
pub(super) fn slice_op(value: &str) -> Result<Op, String> {
    let bad = || format!("`slice={value}` should look like {{[0:4:2], [1:5]}}");
    let inner = value.strip_prefix('{').and_then(|v| v.strip_suffix('}')).ok_or_else(bad)?;
    let (mut start, mut limit, mut stride) = (Vec::new(), Vec::new(), Vec::new());
    for part in inner.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let range = part.strip_prefix('[').and_then(|p| p.strip_suffix(']')).ok_or_else(bad)?;
        let numbers =
            range.split(':').map(|n| n.trim().parse::<u64>().map_err(|_| bad())).collect::<Result<Vec<_>, _>>()?;
        match numbers.as_slice() {
            [a, b] => (start.push(*a), limit.push(*b), stride.push(1)),
            [a, b, s] => (start.push(*a), limit.push(*b), stride.push(*s)),
            _ => return Err(bad()),
        };
    }
    Ok(Op::Slice { start, limit, stride })
}

/// A collective's replica groups: `{}` (one group of every rank, given as no groups),
/// `{{0,1},{2,3}}`, or the iota form `[G,S]<=[N]` (G groups of S consecutive ranks).
/// Which ranks exist is checked when the model is loaded.
pub(super) fn replica_groups(inst: &hlo::Instruction) -> Result<Vec<Vec<u32>>, String> {
    let text = inst.attribute("replica_groups").unwrap_or("{}").trim();
    let bad = || {
        format!(
            "replica_groups={text} is not understood (forms: {{}}, {{{{0,1}},{{2,3}}}}, or [2,2]<=[4] without a transpose)"
        )
    };
    if let Some(iota) = text.strip_prefix('[') {
        let (shape, rest) = iota.split_once("]<=[").ok_or_else(bad)?;
        let total: u32 = rest.strip_suffix(']').and_then(|n| n.trim().parse().ok()).ok_or_else(bad)?;
        let (groups, size) = shape.split_once(',').ok_or_else(bad)?;
        let (groups, size): (u32, u32) =
            (groups.trim().parse().map_err(|_| bad())?, size.trim().parse().map_err(|_| bad())?);
        if size == 0 || groups.checked_mul(size) != Some(total) {
            return Err(bad());
        }
        return Ok((0..groups).map(|g| (g * size..(g + 1) * size).collect()).collect());
    }
    let inner = text.strip_prefix('{').and_then(|t| t.strip_suffix('}')).ok_or_else(bad)?.trim();
    if inner.is_empty() {
        return Ok(Vec::new());
    }
    inner
        .split('}')
        .map(|g| g.trim_start_matches([',', ' ']).trim())
        .filter(|g| !g.is_empty())
        .map(|g| {
            let members = g.strip_prefix('{').ok_or_else(bad)?;
            members.split(',').map(|m| m.trim().parse::<u32>().map_err(|_| bad())).collect()
        })
        .collect()
}

/// `index_vector_dim=1` and similar single indices.
pub(super) fn index_attr(inst: &hlo::Instruction, name: &str) -> Result<u32, String> {
    attr(inst, name)?.trim().parse().map_err(|_| format!("`{name}` must be a non-negative integer"))
}

/// A small non-negative integer attribute (`exponent_bits=5`).
pub(super) fn small_attr(inst: &hlo::Instruction, name: &str) -> Result<u8, String> {
    attr(inst, name)?.trim().parse().map_err(|_| format!("`{name}` must be an integer from 0 to 255"))
}

/// `{2,3}` → `[2, 3]`, for sizes.
pub(super) fn u64_list(inst: &hlo::Instruction, name: &str) -> Result<Vec<u64>, String> {
    let value = attr(inst, name)?;
    let inner = value
        .strip_prefix('{')
        .and_then(|v| v.strip_suffix('}'))
        .ok_or_else(|| format!("`{name}={value}` should be a list like {{2,3}}"))?;
    inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<u64>().map_err(|_| format!("`{name}={value}`: `{s}` is not a size")))
        .collect()
}

/// `padding=0_0x1_2_1` (per dimension `low_high` or `low_high_interior`) → the pad op.
pub(super) fn pad_op(value: &str) -> Result<Op, String> {
    let bad = || format!("`padding={value}` should look like 0_0x1_2_1 (low_high[_interior] per dimension)");
    let (mut low, mut high, mut interior) = (Vec::new(), Vec::new(), Vec::new());
    for part in value.split('x').map(str::trim).filter(|p| !p.is_empty()) {
        let numbers: Vec<&str> = part.split('_').collect();
        let edge = |s: &str| s.parse::<i64>().map_err(|_| bad());
        match numbers.as_slice() {
            [l, h] => (low.push(edge(l)?), high.push(edge(h)?), interior.push(0)),
            [l, h, i] => (low.push(edge(l)?), high.push(edge(h)?), interior.push(i.parse::<u64>().map_err(|_| bad())?)),
            _ => return Err(bad()),
        };
    }
    Ok(Op::Pad { low, high, interior })
}

/// A `compare` instruction's `direction`.
pub(super) fn comparison_direction(name: &str) -> Result<CompareDirection, String> {
    Ok(match name {
        "EQ" => CompareDirection::Eq,
        "NE" => CompareDirection::Ne,
        "LT" => CompareDirection::Lt,
        "LE" => CompareDirection::Le,
        "GT" => CompareDirection::Gt,
        "GE" => CompareDirection::Ge,
        other => return Err(format!("unknown comparison direction `{other}`")),
    })
}

/// Whether a `compare` orders NaNs (`type=TOTALORDER`), after checking that its
/// `type`, if given, fits the operands: FLOAT or TOTALORDER for floats, SIGNED for
/// signed integers, UNSIGNED for unsigned integers and pred.
pub(super) fn comparison_type(inst: &hlo::Instruction, compared: DType) -> Result<bool, String> {
    let Some(kind) = inst.attribute("type") else {
        return Ok(false);
    };
    let fits = match kind {
        "FLOAT" | "TOTALORDER" => compared.is_float(),
        "SIGNED" => compared.class() == DTypeClass::Signed,
        "UNSIGNED" => matches!(compared.class(), DTypeClass::Unsigned | DTypeClass::Pred),
        other => {
            return Err(format!("unknown comparison type `{other}` (expected FLOAT, TOTALORDER, SIGNED or UNSIGNED)"));
        }
    };
    if !fits {
        return Err(format!("comparison type {kind} does not fit {compared} operands"));
    }
    Ok(kind == "TOTALORDER")
}

/// The array types an instruction declares: a tuple's elements, or its one array.
pub(super) fn result_types(shape: &Shape) -> Result<Vec<ArrayType>, String> {
    match shape {
        Shape::Tuple(parts) => parts.iter().map(array_type).collect(),
        array => Ok(vec![array_type(array)?]),
    }
}

/// Parses a convolution's `dim_labels=b01f_01io->b01f` (input, kernel, output) and
/// its `window`, `feature_group_count` and `batch_group_count`.
pub(super) fn conv_dims(inst: &hlo::Instruction) -> Result<ConvDims, String> {
    let labels = attr(inst, "dim_labels")?;
    let bad = || format!("`dim_labels={labels}` must look like b01f_01io->b01f");
    let (operands, out) = labels.split_once("->").ok_or_else(bad)?;
    let (lhs, rhs) = operands.split_once('_').ok_or_else(bad)?;
    let spatial = lhs.len().checked_sub(2).ok_or_else(bad)?;
    // Position of each label in a dimension string: the two named ones, then 0, 1, ...
    let positions = |text: &str, named: [char; 2]| -> Result<(u32, u32, Vec<u32>), String> {
        let find = |c: char| text.chars().position(|x| x == c).map(|p| p as u32).ok_or_else(bad);
        if text.len() != spatial + 2 {
            return Err(bad());
        }
        let digits = (0..spatial)
            .map(|d| char::from_digit(d as u32, 10).ok_or_else(bad).and_then(find))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((find(named[0])?, find(named[1])?, digits))
    };
    let (lhs_batch, lhs_feature, lhs_spatial) = positions(lhs, ['b', 'f'])?;
    let (rhs_input, rhs_output, rhs_spatial) = positions(rhs, ['i', 'o'])?;
    let (out_batch, out_feature, out_spatial) = positions(out, ['b', 'f'])?;
    let window = match inst.attribute("window") {
        Some(w) => dilated_window_attr(w, spatial)?,
        None => DilatedWindow {
            window: Window {
                size: vec![1; spatial],
                stride: vec![1; spatial],
                pad_low: vec![0; spatial],
                pad_high: vec![0; spatial],
            },
            base_dilation: vec![1; spatial],
            window_dilation: vec![1; spatial],
        },
    };
    let count = |name: &str| -> Result<u64, String> {
        inst.attribute(name)
            .map_or(Ok(1), |v| v.parse().map_err(|_| format!("`{name}={v}` must be a positive integer")))
    };
    Ok(ConvDims {
        lhs_batch,
        lhs_feature,
        lhs_spatial,
        rhs_input,
        rhs_output,
        rhs_spatial,
        out_batch,
        out_feature,
        out_spatial,
        window,
        feature_groups: count("feature_group_count")?,
        batch_groups: count("batch_group_count")?,
    })
}

/// Parses `window={size=2x2 stride=2x2 pad=0_0x0_0}` for an array of `rank` dimensions
/// (`select-and-scatter`, which takes no dilation).
pub(super) fn window_attr(value: &str, rank: usize) -> Result<Window, String> {
    let dilated = dilated_window_attr(value, rank)?;
    if dilated.base_dilation.iter().chain(&dilated.window_dilation).any(|&d| d != 1) {
        return Err("window dilation (`lhs_dilate`, `rhs_dilate`) is not supported in select-and-scatter".into());
    }
    Ok(dilated.window)
}

/// Parses a window with its dilations: `lhs_dilate` (of the array, "base dilation")
/// and `rhs_dilate` (of the window).
pub(super) fn dilated_window_attr(value: &str, rank: usize) -> Result<DilatedWindow, String> {
    let mut base_dilation = vec![1; rank];
    let mut window_dilation = vec![1; rank];
    let inner = value.trim().trim_start_matches('{').trim_end_matches('}');
    let mut window =
        Window { size: vec![1; rank], stride: vec![1; rank], pad_low: vec![0; rank], pad_high: vec![0; rank] };
    let numbers = |key: &str, v: &str| -> Result<Vec<u64>, String> {
        let parsed: Vec<u64> = v
            .split('x')
            .map(|n| n.parse::<u64>())
            .collect::<Result<_, _>>()
            .map_err(|_| format!("window `{key}={v}` must be non-negative integers separated by `x`"))?;
        if parsed.len() != rank {
            return Err(format!("window `{key}={v}` gives {} dimension(s); the array has {rank}", parsed.len()));
        }
        Ok(parsed)
    };
    for part in inner.split_whitespace() {
        let (key, v) = part.split_once('=').ok_or_else(|| format!("window part `{part}` is not key=value"))?;
        match key {
            "size" => window.size = numbers(key, v)?,
            "stride" => window.stride = numbers(key, v)?,
            "pad" => {
                let pairs: Vec<&str> = v.split('x').collect();
                if pairs.len() != rank {
                    return Err(format!("window `pad={v}` gives {} dimension(s); the array has {rank}", pairs.len()));
                }
                for (d, pair) in pairs.iter().enumerate() {
                    let (lo, hi) = pair
                        .split_once('_')
                        .and_then(|(l, h)| Some((l.parse::<u64>().ok()?, h.parse::<u64>().ok()?)))
                        .ok_or_else(|| format!("window `pad={v}` must be low_high pairs of non-negative integers"))?;
                    (window.pad_low[d], window.pad_high[d]) = (lo, hi);
                }
            }
            "lhs_dilate" => base_dilation = numbers(key, v)?,
            "rhs_dilate" => window_dilation = numbers(key, v)?,
            "rhs_reversal" => return Err("window `rhs_reversal` is not supported".into()),
            other => return Err(format!("unknown window attribute `{other}`")),
        }
    }
    Ok(DilatedWindow { window, base_dilation, window_dilation })
}

pub(super) fn unsupported_element_type(name: &str) -> String {
    let supported: Vec<&str> = DType::ALL.iter().map(|t| t.hlo_name()).collect();
    let why = match name {
        "f64" => ": NeuronCores have no 64-bit floating point; export in f32 (in JAX, leave jax_enable_x64 off)",
        "c64" | "c128" => ": complex numbers are not supported",
        _ => "",
    };
    format!("element type `{name}` is not supported{why} (supported: {})", supported.join(", "))
}

pub(super) fn array_type(shape: &Shape) -> Result<ArrayType, String> {
    match shape {
        Shape::Array { element_type, dims } => {
            let dtype = DType::from_hlo_name(element_type).ok_or_else(|| unsupported_element_type(element_type))?;
            let ty = ArrayType::new(dtype, dims.clone());
            if !ty.is_addressable() || ty.size_bytes().is_none() {
                return Err(format!("shape {ty} is too large to address on this host"));
            }
            Ok(ty)
        }
        Shape::Tuple(_) => Err(format!("expected an array shape, found the tuple {shape}")),
    }
}

/// One literal element as little-endian bytes, or `None` if `token` is not a value of
/// `dtype` (out of range integers included).
pub(super) fn literal_element(dtype: DType, token: &str) -> Option<Vec<u8>> {
    let int = || token.parse::<i128>().ok();
    let bytes = match dtype {
        DType::Pred => vec![match token {
            "true" | "1" => 1,
            "false" | "0" => 0,
            _ => return None,
        }],
        DType::S8 => i8::try_from(int()?).ok()?.to_le_bytes().to_vec(),
        DType::S16 => i16::try_from(int()?).ok()?.to_le_bytes().to_vec(),
        DType::S32 => i32::try_from(int()?).ok()?.to_le_bytes().to_vec(),
        DType::S64 => i64::try_from(int()?).ok()?.to_le_bytes().to_vec(),
        DType::U8 => u8::try_from(int()?).ok()?.to_le_bytes().to_vec(),
        DType::U16 => u16::try_from(int()?).ok()?.to_le_bytes().to_vec(),
        DType::U32 => u32::try_from(int()?).ok()?.to_le_bytes().to_vec(),
        DType::U64 => u64::try_from(int()?).ok()?.to_le_bytes().to_vec(),
        DType::F32 => parse_f32(token)?.to_le_bytes().to_vec(),
        // Parsed in double precision so that the value is rounded once.
        DType::F16 => half::f16::from_f64(parse_f64(token)?).to_le_bytes().to_vec(),
        DType::BF16 => half::bf16::from_f64(parse_f64(token)?).to_le_bytes().to_vec(),
    };
    Some(bytes)
}

pub(super) fn parse_f64(token: &str) -> Option<f64> {
    match token {
        "inf" => Some(f64::INFINITY),
        "-inf" => Some(f64::NEG_INFINITY),
        "nan" | "-nan" => Some(f64::NAN),
        _ => token.parse::<f64>().ok(),
    }
}

pub(super) fn parse_f32(token: &str) -> Option<f32> {
    match token {
        "inf" => Some(f32::INFINITY),
        "-inf" => Some(f32::NEG_INFINITY),
        "nan" | "-nan" => Some(f32::NAN),
        _ => token.parse::<f32>().ok(),
    }
}
