//! NumPy `.npy` files as model inputs and outputs.
//!
//! Arrays are exchanged as an [`ArrayType`] plus little-endian row-major bytes, which
//! is what tensors hold. Every element type the runtime executes has a NumPy type:
//!
//! | HLO  | NumPy            | descr  |
//! |------|------------------|--------|
//! | pred | `bool`           | `\|b1` |
//! | s8, s16, s32, s64 | `int8` ... `int64` | `\|i1`, `<i2`, `<i4`, `<i8` |
//! | u8, u16, u32, u64 | `uint8` ... `uint64` | `\|u1`, `<u2`, `<u4`, `<u8` |
//! | f16  | `float16`        | `<f2`  |
//! | f32  | `float32`        | `<f4`  |
//! | bf16 | `ml_dtypes.bfloat16` | `<V2` |
//!
//! NumPy has no bfloat16 of its own: an `ml_dtypes.bfloat16` array is saved as two raw
//! bytes per element (`<V2`), and that is how bf16 tensors are written and read. Load
//! one with `np.load(path).view(ml_dtypes.bfloat16)`. Big-endian files are read too;
//! files are always written little-endian. `float64` is refused with a hint to
//! convert, since no model takes it.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

use anyhow::{Context, Result, bail};
use neuron_runtime::{ArrayType, DType};
use npyz::WriterBuilder;

/// The NumPy type code (descr without its byte-order character) of an element type.
fn type_code(dtype: DType) -> &'static str {
    match dtype {
        DType::Pred => "b1",
        DType::S8 => "i1",
        DType::S16 => "i2",
        DType::S32 => "i4",
        DType::S64 => "i8",
        DType::U8 => "u1",
        DType::U16 => "u2",
        DType::U32 => "u4",
        DType::U64 => "u8",
        DType::F16 => "f2",
        DType::F32 => "f4",
        DType::BF16 => "V2",
    }
}

/// The descr written for an element type: `|` for single bytes, `<` otherwise.
fn descr(dtype: DType) -> String {
    let order = if dtype.size_bytes() == 1 { '|' } else { '<' };
    format!("{order}{}", type_code(dtype))
}

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
    let found = match npy.dtype() {
        npyz::DType::Plain(type_str) => type_str.to_string(),
        other => format!("{other:?}"),
    };
    let (order, code) = found.split_at(found.chars().next().map_or(0, char::len_utf8));
    let dtype = DType::ALL.into_iter().find(|&t| type_code(t) == code && ["<", ">", "|", "="].contains(&order));
    let Some(dtype) = dtype else {
        let hint = if code == "f8" { "; convert it with a.astype(np.float32)" } else { "" };
        let supported: Vec<String> = DType::ALL.iter().map(|&t| descr(t)).collect();
        bail!(
            "{} holds elements of NumPy type '{found}'{hint}; supported are {}",
            path.display(),
            supported.join(", ")
        );
    };
    let ty = ArrayType::new(dtype, dims);
    let size = ty.size_bytes().with_context(|| format!("{} declares a shape too large to load", path.display()))?;
    let mut bytes = Vec::new();
    let mut rest = npy.into_inner();
    (&mut rest).take(size).read_to_end(&mut bytes).with_context(|| format!("cannot read {}", path.display()))?;
    if bytes.len() as u64 != size {
        bail!("{} is truncated: {ty} needs {size} bytes of data, the file holds {}", path.display(), bytes.len());
    }
    let mut trailing = [0u8; 1];
    if rest.read(&mut trailing).with_context(|| format!("cannot read {}", path.display()))? > 0 {
        bail!(
            "{} holds more than its header declares ({ty}, {size} bytes of data): it is not one array; save one with np.save",
            path.display()
        );
    }
    if order == ">" {
        bytes.chunks_exact_mut(dtype.size_bytes() as usize).for_each(<[u8]>::reverse);
    }
    if dtype == DType::Pred {
        bytes.iter_mut().for_each(|b| *b = u8::from(*b != 0));
    }
    Ok((ty, bytes))
}

/// Writes little-endian row-major `bytes` of type `ty` as a `.npy` file.
pub fn write(path: &Path, ty: &ArrayType, bytes: &[u8]) -> Result<()> {
    let file = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let type_str: npyz::TypeStr = descr(ty.dtype).parse().context("element type descr")?;
    let written = npyz::WriteOptions::new_header_only()
        .dtype(npyz::DType::Plain(type_str))
        .shape(&ty.dims)
        .writer(BufWriter::new(file))
        .write_header_only()
        .and_then(|mut out| {
            out.write_all(bytes)?;
            out.flush()
        });
    written.with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_element_type_round_trips() {
        let dir = tempfile::tempdir().expect("tempdir");
        for (i, dtype) in DType::ALL.into_iter().enumerate() {
            let ty = ArrayType::new(dtype, vec![2, 3]);
            let size = ty.size_bytes().expect("size") as usize;
            let bytes: Vec<u8> = match dtype {
                DType::Pred => vec![1, 0, 0, 1, 1, 0],
                _ => (0..size).map(|b| (b * 37 + i) as u8).collect(),
            };
            let path = dir.path().join(format!("{dtype}.npy"));
            write(&path, &ty, &bytes).expect("write");
            let header = std::fs::read(&path).expect("file");
            let header = String::from_utf8_lossy(&header[..64]);
            assert!(header.contains(&format!("'descr': '{}'", descr(dtype))), "{dtype}: {header}");
            let (read_ty, read_bytes) = read(&path).expect("read");
            assert_eq!(read_ty, ty, "{dtype}");
            assert_eq!(read_bytes, bytes, "{dtype}");
        }
    }

    #[test]
    fn big_endian_files_are_read_and_float64_is_refused_with_a_hint() {
        let dir = tempfile::tempdir().expect("tempdir");
        let write_raw = |name: &str, descr: &str, data: &[u8]| {
            let path = dir.path().join(name);
            let type_str: npyz::TypeStr = descr.parse().expect("descr");
            let mut out = npyz::WriteOptions::new_header_only()
                .dtype(npyz::DType::Plain(type_str))
                .shape(&[2])
                .writer(File::create(&path).expect("create"))
                .write_header_only()
                .expect("header");
            out.write_all(data).expect("data");
            path
        };
        let big = write_raw("big.npy", ">i2", &[0x01, 0x02, 0xff, 0xfe]);
        let (ty, bytes) = read(&big).expect("read");
        assert_eq!(ty, ArrayType::new(DType::S16, vec![2]));
        assert_eq!(bytes, [0x02, 0x01, 0xfe, 0xff]);

        let doubles = write_raw("f8.npy", "<f8", &[0; 16]);
        let err = read(&doubles).expect_err("float64");
        assert!(err.to_string().contains("'<f8'; convert it with a.astype(np.float32)"), "{err}");

        let short = write_raw("short.npy", "<i4", &[0; 5]);
        let err = read(&short).expect_err("truncated");
        assert!(err.to_string().contains("is truncated: s32[2] needs 8 bytes of data, the file holds 5"), "{err}");

        let long = write_raw("long.npy", "<i4", &[0; 9]);
        let err = read(&long).expect_err("trailing bytes");
        assert!(err.to_string().contains("holds more than its header declares (s32[2], 8 bytes of data)"), "{err}");
    }
}
