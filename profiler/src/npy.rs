//! NumPy `.npy` files as model inputs and outputs.
//!
//! Arrays are exchanged as an [`ArrayType`] plus little-endian row-major bytes, which
//! is what tensors hold. Supported element types: `float32` (`<f4`), `int32` (`<i4`)
//! and `bool` (`|b1`), in C order.

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};

use npyz::WriterBuilder;
use std::path::Path;

use anyhow::{Context, Result, bail};
use neuron_runtime::{ArrayType, DType};

/// Reads a `.npy` file into its type and little-endian bytes.
pub fn read(path: &Path) -> Result<(ArrayType, Vec<u8>)> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let npy = npyz::NpyFile::new(BufReader::new(file))
        .with_context(|| format!("{} is not a valid .npy file", path.display()))?;
    if npy.order() == npyz::Order::Fortran {
        bail!(
            "{} is stored in Fortran order; save it in C order (np.save(path, np.ascontiguousarray(a)))",
            path.display()
        );
    }
    let dims = npy.shape().to_vec();
    let descr = match npy.dtype() {
        npyz::DType::Plain(type_str) => type_str.to_string(),
        other => format!("{other:?}"),
    };
    let (dtype, bytes) = match descr.as_str() {
        "<f4" => {
            let data: Vec<f32> = npy.into_vec().with_context(|| format!("cannot read {}", path.display()))?;
            (DType::F32, data.iter().flat_map(|x| x.to_le_bytes()).collect())
        }
        "<i4" => {
            let data: Vec<i32> = npy.into_vec().with_context(|| format!("cannot read {}", path.display()))?;
            (DType::S32, data.iter().flat_map(|x| x.to_le_bytes()).collect())
        }
        "|b1" => {
            let data: Vec<bool> = npy.into_vec().with_context(|| format!("cannot read {}", path.display()))?;
            (DType::Pred, data.iter().map(|&b| u8::from(b)).collect())
        }
        other => bail!(
            "{} holds elements of NumPy type {other}; supported are float32 ('<f4'), int32 ('<i4') and bool ('|b1')",
            path.display()
        ),
    };
    Ok((ArrayType::new(dtype, dims), bytes))
}

/// Writes little-endian row-major `bytes` of type `ty` as a `.npy` file.
pub fn write(path: &Path, ty: &ArrayType, bytes: &[u8]) -> Result<()> {
    let file = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let mut out = BufWriter::new(file);
    let written = match ty.dtype {
        DType::F32 => {
            write_array(&mut out, &ty.dims, bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
        }
        DType::S32 => {
            write_array(&mut out, &ty.dims, bytes.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])))
        }
        DType::Pred => write_array(&mut out, &ty.dims, bytes.iter().map(|&b| b != 0)),
    };
    written.and_then(|()| out.flush()).with_context(|| format!("cannot write {}", path.display()))
}

fn write_array<T: npyz::AutoSerialize>(
    out: &mut impl Write,
    dims: &[u64],
    data: impl IntoIterator<Item = T>,
) -> std::io::Result<()> {
    let mut writer = npyz::WriteOptions::<T>::new().default_dtype().shape(dims).writer(out).begin_nd()?;
    writer.extend(data)?;
    writer.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_supported_type_round_trips() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cases = [
            (
                ArrayType::new(DType::F32, vec![2, 3]),
                [1.5f32, -2.0, 0.0, f32::INFINITY, 3.25, 7.0].iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>(),
            ),
            (ArrayType::new(DType::S32, vec![3]), [-1i32, 0, 42].iter().flat_map(|x| x.to_le_bytes()).collect()),
            (ArrayType::new(DType::Pred, vec![]), vec![1u8]),
        ];
        for (i, (ty, bytes)) in cases.iter().enumerate() {
            let path = dir.path().join(format!("a{i}.npy"));
            write(&path, ty, bytes).expect("write");
            let (read_ty, read_bytes) = read(&path).expect("read");
            assert_eq!(&read_ty, ty);
            assert_eq!(&read_bytes, bytes);
        }
    }
}
