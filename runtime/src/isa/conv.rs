//! The type rules of `Convolution`: which dimension is which, how groups split the
//! features and the batch, and how many windows fit along each spatial dimension.

use super::*;

/// The output type of a convolution of `lhs` by `rhs` (`declared` supplies the element
/// type when it is wider than the operands', as for `dot`).
pub(super) fn infer_convolution(
    c: &ConvDims,
    lhs: &ArrayType,
    rhs: &ArrayType,
    declared: &ArrayType,
) -> Result<ArrayType, String> {
    if lhs.dtype != rhs.dtype || lhs.dtype == DType::Pred {
        return Err(format!("convolution of {lhs} by {rhs}: operands must share a numeric type"));
    }
    let spatial = c.lhs_spatial.len();
    let rank = spatial + 2;
    let distinct = |dims: &[u32]| {
        let mut seen = vec![false; rank];
        dims.iter().all(|&d| (d as usize) < rank && !std::mem::replace(&mut seen[d as usize], true))
    };
    let lhs_dims: Vec<u32> = [c.lhs_batch, c.lhs_feature].into_iter().chain(c.lhs_spatial.iter().copied()).collect();
    let rhs_dims: Vec<u32> = [c.rhs_input, c.rhs_output].into_iter().chain(c.rhs_spatial.iter().copied()).collect();
    let out_dims: Vec<u32> = [c.out_batch, c.out_feature].into_iter().chain(c.out_spatial.iter().copied()).collect();
    let w = &c.window;
    let window_ranks = [w.window.size.len(), w.window.stride.len(), w.window.pad_low.len(), w.window.pad_high.len()]
        .into_iter()
        .chain([w.base_dilation.len(), w.window_dilation.len(), c.rhs_spatial.len(), c.out_spatial.len()]);
    if lhs.rank() != rank
        || rhs.rank() != rank
        || !distinct(&lhs_dims)
        || !distinct(&rhs_dims)
        || !distinct(&out_dims)
        || window_ranks.into_iter().any(|r| r != spatial)
    {
        return Err(format!("convolution of {lhs} by {rhs}: the dimension numbers do not fit arrays of rank {rank}"));
    }
    let (groups, batch_groups) = (c.feature_groups, c.batch_groups);
    if groups == 0 || batch_groups == 0 || (groups > 1 && batch_groups > 1) {
        return Err(format!(
            "convolution with feature_group_count={groups} and batch_group_count={batch_groups}: both must be at least 1, and one of them 1"
        ));
    }
    let (batch, features) = (lhs.dims[c.lhs_batch as usize], lhs.dims[c.lhs_feature as usize]);
    let (inputs, outputs) = (rhs.dims[c.rhs_input as usize], rhs.dims[c.rhs_output as usize]);
    let parts = groups.max(batch_groups);
    if features != inputs * groups || outputs % parts != 0 || batch % batch_groups != 0 {
        return Err(format!(
            "convolution of {lhs} by {rhs}: {features} input features must be {inputs} kernel inputs x {groups} groups, \
             {outputs} kernel outputs a multiple of {parts}, and batch {batch} a multiple of {batch_groups}"
        ));
    }
    let kernel: Vec<u64> = c.rhs_spatial.iter().map(|&d| rhs.dims[d as usize]).collect();
    if kernel != w.window.size {
        return Err(format!(
            "convolution window size {:?} does not match the kernel's spatial sizes {kernel:?}",
            w.window.size
        ));
    }
    let input: Vec<u64> = c.lhs_spatial.iter().map(|&d| lhs.dims[d as usize]).collect();
    let counts = w.counts(&input).ok_or("a convolution window stride or dilation is zero, or the windows overflow")?;
    let mut dims = vec![0; rank];
    dims[c.out_batch as usize] = batch / batch_groups;
    dims[c.out_feature as usize] = outputs;
    for (&d, &n) in c.out_spatial.iter().zip(&counts) {
        dims[d as usize] = n;
    }
    // The result may be wider than the operands, within the same family (as for `dot`).
    let same_family = lhs.dtype.is_float() == declared.dtype.is_float() && declared.dtype != DType::Pred;
    Ok(ArrayType::new(if same_family { declared.dtype } else { lhs.dtype }, dims))
}
