//! The NEFF container (our NEFF v2): a checksummed header and a body holding the
//! lowered [`Program`]. The byte layout is specified in `runtime/FORMAT.md`.
//!
//! Decoding never panics: every malformed input (wrong magic, truncation, bit flips,
//! inconsistent programs) is an `NRT_INVALID` error that says what is wrong, and an
//! unknown version or feature bit is `NRT_UNSUPPORTED_NEFF_VERSION`.

use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::dtype::DType;
use crate::error::{NrtError, NrtResult, NrtStatus};
use crate::isa::{Op, Program};

/// First bytes of every NEFF file.
pub const MAGIC: [u8; 8] = *b"NEFF\x89\r\n\x1a";
pub const VERSION_MAJOR: u16 = 2;
pub const VERSION_MINOR: u16 = 0;

/// Every program uses this feature.
pub const FEATURE_BASE: u64 = 0x1;
/// Buffers of integer or predicate type.
pub const FEATURE_INTEGER_TYPES: u64 = 0x2;
/// Matrix products with batch dimensions.
pub const FEATURE_BATCHED_MATMUL: u64 = 0x4;
/// More than one output tensor.
pub const FEATURE_MULTI_OUTPUT: u64 = 0x8;
/// Buffers of 8-, 16- or 64-bit integers, unsigned integers, f16 or bf16.
pub const FEATURE_EXTENDED_TYPES: u64 = 0x10;
/// Rounding to narrower float formats: `RoundPrecision` and `ReduceRounded` instructions
/// (`--auto-cast`, reduced-precision accumulation, HLO `reduce-precision`).
pub const FEATURE_FLOAT_FORMATS: u64 = 0x20;
/// Reductions with a reducer computation (`ReduceRegion`: variadic reduce, arg-max)
/// and window operations (`SelectAndScatter`).
pub const FEATURE_REGIONS_AND_WINDOWS: u64 = 0x40;
/// Random number generation (`RngBitGenerator`, `RngUniform`).
pub const FEATURE_RANDOM: u64 = 0x80;
/// Collectives across the ranks a model is loaded on.
pub const FEATURE_COLLECTIVES: u64 = 0x100;
/// Loops and conditionals (`While`, `Conditional`), with nested programs.
pub const FEATURE_CONTROL_FLOW: u64 = 0x200;
/// Matrix products that round their operands themselves (`MatMulRounded`).
pub const FEATURE_ROUNDED_PRODUCTS: u64 = 0x400;
/// The feature bits this runtime executes.
pub const SUPPORTED_FEATURES: u64 = FEATURE_BASE
    | FEATURE_INTEGER_TYPES
    | FEATURE_BATCHED_MATMUL
    | FEATURE_MULTI_OUTPUT
    | FEATURE_EXTENDED_TYPES
    | FEATURE_FLOAT_FORMATS
    | FEATURE_REGIONS_AND_WINDOWS
    | FEATURE_RANDOM
    | FEATURE_COLLECTIVES
    | FEATURE_CONTROL_FLOW
    | FEATURE_ROUNDED_PRODUCTS;

/// Size of the header before the variable-length name.
const FIXED_HEADER_LEN: usize = 86;
/// Longest model name the header holds.
pub const MAX_NAME_LEN: usize = 255;

/// A decoded (or to-be-encoded) NEFF.
#[derive(Debug, Clone, PartialEq)]
pub struct Neff {
    pub name: String,
    pub uuid: Uuid,
    pub version: (u16, u16),
    pub features: u64,
    pub program: Program,
}

/// What [`Neff::decode`] verifies beyond the checksums.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DecodeOptions {
    /// Verify the SHA-256 body hash (`NEURON_RT_VALIDATE_HASH`).
    pub validate_hash: bool,
}

impl Neff {
    /// Wraps a program in a new NEFF with the features it uses. Its uuid is a digest
    /// of the name, version, features and program, so the same HLO compiled with the
    /// same options gives the same bytes.
    pub fn new(name: &str, program: Program) -> Neff {
        let mut neff = Neff {
            name: clamp_name(name).to_owned(),
            uuid: Uuid::nil(),
            version: (VERSION_MAJOR, VERSION_MINOR),
            features: features_of(&program),
            program,
        };
        neff.uuid = neff.content_uuid();
        neff
    }

    /// A version-8 uuid from the SHA-256 of what the NEFF holds.
    fn content_uuid(&self) -> Uuid {
        let body = postcard::to_stdvec(&self.program).expect("serialising a program into memory cannot fail");
        let mut hasher = Sha256::new();
        hasher.update(clamp_name(&self.name).as_bytes());
        hasher.update([0]);
        hasher.update(self.version.0.to_le_bytes());
        hasher.update(self.version.1.to_le_bytes());
        hasher.update(self.features.to_le_bytes());
        hasher.update(&body);
        let digest = hasher.finalize();
        let mut bytes = [0u8; 16];
        bytes.copy_from_slice(&digest[..16]);
        uuid::Builder::from_custom_bytes(bytes).into_uuid()
    }

    /// Serialises to the NEFF byte layout.
    pub fn encode(&self) -> Vec<u8> {
        let body = postcard::to_stdvec(&self.program).expect("serialising a program into memory cannot fail");
        let name = clamp_name(&self.name).as_bytes();
        let mut out = Vec::with_capacity(FIXED_HEADER_LEN + name.len() + 4 + body.len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&self.version.0.to_le_bytes());
        out.extend_from_slice(&self.version.1.to_le_bytes());
        out.extend_from_slice(&self.features.to_le_bytes());
        out.extend_from_slice(self.uuid.as_bytes());
        out.extend_from_slice(&((FIXED_HEADER_LEN + name.len() + 4) as u32).to_le_bytes());
        out.extend_from_slice(&(body.len() as u64).to_le_bytes());
        out.extend_from_slice(&Sha256::digest(&body));
        out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        debug_assert_eq!(out.len(), FIXED_HEADER_LEN);
        out.extend_from_slice(name);
        out.extend_from_slice(&crc32fast::hash(&out).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Parses and validates a NEFF.
    pub fn decode(bytes: &[u8], options: DecodeOptions) -> NrtResult<Neff> {
        if bytes.len() < MAGIC.len() || bytes[..MAGIC.len()] != MAGIC {
            let hint = if bytes.starts_with(b"HloModule") {
                "; this is HLO text: compile it first with `neuron-cc compile`"
            } else {
                ""
            };
            return Err(NrtError::invalid(format!(
                "not a NEFF: the file does not start with the NEFF magic bytes{hint}"
            )));
        }
        if bytes.len() < FIXED_HEADER_LEN {
            return Err(NrtError::invalid(format!(
                "NEFF is truncated: {} bytes is shorter than the {FIXED_HEADER_LEN}-byte header",
                bytes.len()
            )));
        }
        let mut r = Reader { bytes, pos: MAGIC.len() };
        let major = r.u16();
        let minor = r.u16();
        if major != VERSION_MAJOR {
            return Err(NrtError::new(
                NrtStatus::UnsupportedNeffVersion,
                format!(
                    "NEFF version {major}.{minor} is not supported by this runtime (supported: {VERSION_MAJOR}.0 - {VERSION_MAJOR}.x); recompile it with this release's neuron-cc"
                ),
            ));
        }
        let features = r.u64();
        let uuid = Uuid::from_bytes(r.array::<16>());
        let header_len = r.u32() as usize;
        let body_len = r.u64();
        let body_hash = r.array::<32>();
        let body_crc = r.u32();
        let name_len = r.u16() as usize;
        if name_len > MAX_NAME_LEN {
            return Err(NrtError::invalid(format!(
                "NEFF header is corrupt: a {name_len}-byte model name is longer than {MAX_NAME_LEN} bytes"
            )));
        }
        let name_end = FIXED_HEADER_LEN + name_len;
        if header_len != name_end + 4 {
            return Err(NrtError::invalid("NEFF header is corrupt: its length fields disagree"));
        }
        if bytes.len() < name_end + 4 {
            return Err(NrtError::invalid(format!(
                "NEFF is truncated: {} bytes is shorter than the {}-byte header",
                bytes.len(),
                name_end + 4
            )));
        }
        let stored_header_crc =
            u32::from_le_bytes([bytes[name_end], bytes[name_end + 1], bytes[name_end + 2], bytes[name_end + 3]]);
        if crc32fast::hash(&bytes[..name_end]) != stored_header_crc {
            return Err(NrtError::invalid(
                "NEFF header is corrupt (checksum mismatch); the file was damaged: recompile or copy it again",
            ));
        }
        if features & !SUPPORTED_FEATURES != 0 {
            return Err(NrtError::new(
                NrtStatus::UnsupportedNeffVersion,
                format!(
                    "NEFF version {major}.{minor} uses unsupported features: [{:#x}]. Neuron Runtime NEFF supported features map: [{SUPPORTED_FEATURES:#x}]",
                    features & !SUPPORTED_FEATURES
                ),
            ));
        }
        let name = std::str::from_utf8(&bytes[FIXED_HEADER_LEN..name_end])
            .map_err(|_| NrtError::invalid("NEFF header is corrupt: the model name is not UTF-8"))?
            .to_owned();
        let body = &bytes[header_len..];
        if (body.len() as u64) < body_len {
            return Err(NrtError::invalid(format!(
                "NEFF is truncated: the body should be {body_len} bytes but only {} are present",
                body.len()
            )));
        }
        if body.len() as u64 > body_len {
            return Err(NrtError::invalid(format!(
                "NEFF has {} unexpected bytes after its body",
                body.len() as u64 - body_len
            )));
        }
        if crc32fast::hash(body) != body_crc {
            return Err(NrtError::invalid(
                "NEFF body is corrupt (checksum mismatch); the file was damaged: recompile or copy it again",
            ));
        }
        if options.validate_hash && Sha256::digest(body).as_slice() != body_hash {
            return Err(NrtError::invalid(
                "NEFF body hash does not match its header (NEURON_RT_VALIDATE_HASH is on); the file was modified after compilation",
            ));
        }
        crate::isa::nesting_exceeded();
        let program: Program = postcard::from_bytes(body).map_err(|e| {
            let why = if crate::isa::nesting_exceeded() {
                format!("control flow nests deeper than {} levels", crate::isa::MAX_NESTING)
            } else {
                e.to_string()
            };
            NrtError::invalid(format!("NEFF body does not decode: {why}"))
        })?;
        program.validate().map_err(|e| NrtError::invalid(format!("NEFF program is inconsistent: {e}")))?;
        let used = features_of(&program);
        if used & !features != 0 {
            return Err(NrtError::invalid(format!(
                "NEFF program uses features [{:#x}] that its header does not declare",
                used & !features
            )));
        }
        Ok(Neff { name, uuid, version: (major, minor), features, program })
    }
}

/// The longest prefix of `name` that fits the header, cut at a character boundary.
fn clamp_name(name: &str) -> &str {
    let mut end = name.len().min(MAX_NAME_LEN);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

/// The feature bits a program needs.
pub fn features_of(program: &Program) -> u64 {
    let all = program.all_instructions();
    let buffers = std::iter::once(program)
        .chain(all.iter().flat_map(|i| i.op.nested_programs()))
        .flat_map(|p| p.buffers.iter())
        .collect::<Vec<_>>();
    let uses = |f: fn(&Op) -> bool| all.iter().any(|i| f(&i.op));
    let mut features = FEATURE_BASE;
    if buffers.iter().any(|b| b.ty.dtype != DType::F32) {
        features |= FEATURE_INTEGER_TYPES;
    }
    if buffers.iter().any(|b| !matches!(b.ty.dtype, DType::F32 | DType::S32 | DType::Pred)) {
        features |= FEATURE_EXTENDED_TYPES;
    }
    if uses(|op| matches!(op, Op::MatMul(d) | Op::MatMulRounded { dims: d, .. } if !d.lhs_batch.is_empty())) {
        features |= FEATURE_BATCHED_MATMUL;
    }
    if program.outputs.len() > 1 {
        features |= FEATURE_MULTI_OUTPUT;
    }
    if uses(|op| matches!(op, Op::RoundPrecision { .. } | Op::ReduceRounded { .. })) {
        features |= FEATURE_FLOAT_FORMATS;
    }
    if uses(|op| matches!(op, Op::MatMulRounded { .. })) {
        features |= FEATURE_FLOAT_FORMATS | FEATURE_ROUNDED_PRODUCTS;
    }
    if uses(|op| matches!(op, Op::ReduceRegion { .. } | Op::SelectAndScatter { .. })) {
        features |= FEATURE_REGIONS_AND_WINDOWS;
    }
    if uses(|op| matches!(op, Op::RngBitGenerator { .. } | Op::RngUniform)) {
        features |= FEATURE_RANDOM;
    }
    if uses(|op| matches!(op, Op::Collective(_) | Op::PartitionId)) {
        features |= FEATURE_COLLECTIVES;
    }
    if uses(|op| matches!(op, Op::While(_) | Op::Conditional(_))) {
        features |= FEATURE_CONTROL_FLOW;
    }
    features
}

/// Little-endian field reader over a slice whose length was checked up front.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        if let Some(src) = self.bytes.get(self.pos..self.pos + N) {
            out.copy_from_slice(src);
        }
        self.pos += N;
        out
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.array())
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.array())
    }

    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.array())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::{Target, compile_hlo};
    use crate::isa::BufferKind;

    fn sample() -> Neff {
        let program = compile_hlo(
            "HloModule m\nENTRY e {\n a = f32[4]{0} parameter(0)\n c = f32[4]{0} constant({1, 2, 3, 4})\n \
             ROOT s = f32[4]{0} add(a, c)\n}\n",
            Target::Trn1,
        )
        .expect("compiles");
        Neff::new("sample", program)
    }

    #[test]
    fn control_flow_nested_deeper_than_the_limit_is_a_decode_error() {
        use crate::isa::{Instruction, Loop, MAX_NESTING, Nested, Op};
        // Loops inside loops: each level's program is one While whose body is the level
        // below (the programs need not make sense: decoding stops first).
        let leaf = sample().program;
        let mut program = leaf.clone();
        for _ in 0..MAX_NESTING + 2 {
            let op = Op::While(Nested::new(Loop { condition: leaf.clone(), body: program.clone() }));
            program.streams[0].instructions = vec![Instruction { step: 0, op, operands: vec![0], output: 1, hlo: 0 }];
        }
        let err = Neff::decode(&Neff::new("deep", program).encode(), DecodeOptions::default()).expect_err("too deep");
        assert_eq!(err.status, NrtStatus::Invalid);
        assert!(err.message.contains("nests deeper than 64"), "{}", err.message);
    }

    #[test]
    fn round_trips() {
        let neff = sample();
        let decoded = Neff::decode(&neff.encode(), DecodeOptions { validate_hash: true }).expect("decodes");
        assert_eq!(decoded, neff);
    }

    #[test]
    fn every_truncation_is_a_typed_error() {
        let bytes = sample().encode();
        for len in 0..bytes.len() {
            let err = Neff::decode(&bytes[..len], DecodeOptions::default()).expect_err("truncated");
            assert_eq!(err.status, NrtStatus::Invalid, "length {len}: {err}");
        }
    }

    #[test]
    fn every_single_bit_flip_is_a_typed_error() {
        let bytes = sample().encode();
        for bit in 0..bytes.len() * 8 {
            let mut flipped = bytes.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            let err = Neff::decode(&flipped, DecodeOptions::default()).expect_err("corrupt");
            assert!(matches!(err.status, NrtStatus::Invalid | NrtStatus::UnsupportedNeffVersion), "bit {bit}: {err}");
        }
    }

    #[test]
    fn a_constant_bound_to_two_buffers_is_rejected() {
        let mut neff = sample();
        let constant = neff.program.buffers.iter().position(|b| matches!(b.kind, BufferKind::Constant { .. }));
        let constant = constant.expect("sample has a constant");
        let mut twin = neff.program.buffers[constant].clone();
        twin.ty.dims = vec![2, 2];
        neff.program.buffers.push(twin);
        let err = Neff::decode(&neff.encode(), DecodeOptions::default()).expect_err("shared constant");
        assert!(err.message.contains("more than one buffer"), "{err}");
    }

    #[test]
    fn unsupported_features_use_the_runtime_message() {
        let mut neff = sample();
        neff.features |= 0x100000;
        let err = Neff::decode(&neff.encode(), DecodeOptions::default()).expect_err("unsupported");
        assert_eq!(err.status, NrtStatus::UnsupportedNeffVersion);
        assert_eq!(
            err.message,
            format!(
                "NEFF version 2.0 uses unsupported features: [0x100000]. Neuron Runtime NEFF supported features map: [{SUPPORTED_FEATURES:#x}]"
            )
        );
    }

    #[test]
    fn hash_validation_catches_a_body_rewritten_with_a_fresh_checksum() {
        let bytes = sample().encode();
        let mut tampered = bytes.clone();
        let last = tampered.len() - 1;
        tampered[last] ^= 0x01;
        // Recompute the body crc so that only the hash can tell.
        let header_len = u32::from_le_bytes(tampered[36..40].try_into().expect("4 bytes")) as usize;
        let crc = crc32fast::hash(&tampered[header_len..]);
        tampered[80..84].copy_from_slice(&crc.to_le_bytes());
        let name_end = header_len - 4;
        let header_crc = crc32fast::hash(&tampered[..name_end]);
        tampered[name_end..header_len].copy_from_slice(&header_crc.to_le_bytes());
        let err = Neff::decode(&tampered, DecodeOptions { validate_hash: true }).expect_err("hash");
        assert!(err.message.contains("hash"), "{err}");
    }
}
