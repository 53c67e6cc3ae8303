//! A serialized executable (`PJRT_Executable_Serialize`, what torch-xla's persistent
//! cache keeps): the framework's program and compile options as it gave them, and the
//! NEFF compiled from them. Loading it back runs no compiler; the NEFF is checked as any
//! NEFF is (its hash), and a NEFF carries no machine code.

/// The first bytes of this plugin's serialized executables, with their version.
const MAGIC: &[u8] = b"neuron-pjrt executable 1\n";

/// The program, its compile options and its NEFF, in one buffer.
pub(crate) fn encode(program: &[u8], options: &[u8], neff: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(MAGIC.len() + 24 + program.len() + options.len() + neff.len());
    out.extend_from_slice(MAGIC);
    for section in [program, options, neff] {
        out.extend_from_slice(&(section.len() as u64).to_le_bytes());
        out.extend_from_slice(section);
    }
    out
}

/// The program, options and NEFF of a serialized executable, or why it is not one.
pub(crate) fn decode(bytes: &[u8]) -> Result<[&[u8]; 3], String> {
    let mut rest = bytes.strip_prefix(MAGIC).ok_or("not an executable serialized by this plugin (version 1)")?;
    let mut sections = [&[][..]; 3];
    for section in &mut sections {
        let (length, tail) = rest.split_at_checked(8).ok_or("the serialized executable is cut short")?;
        let length = u64::from_le_bytes(length.try_into().map_err(|_| "a bad length")?);
        let length = usize::try_from(length).map_err(|_| "a section too long")?;
        let (body, tail) = tail.split_at_checked(length).ok_or("the serialized executable is cut short")?;
        (*section, rest) = (body, tail);
    }
    if !rest.is_empty() {
        return Err("the serialized executable has bytes after its end".into());
    }
    Ok(sections)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_round_trip_and_damage_is_refused() {
        let bytes = encode(b"program", b"", b"neff bytes");
        assert_eq!(decode(&bytes), Ok([&b"program"[..], &b""[..], &b"neff bytes"[..]]));
        assert!(decode(&bytes[..bytes.len() - 1]).is_err_and(|e| e.contains("cut short")));
        assert!(decode(b"something else").is_err_and(|e| e.contains("not an executable")));
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode(&longer).is_err_and(|e| e.contains("after its end")));
    }
}
