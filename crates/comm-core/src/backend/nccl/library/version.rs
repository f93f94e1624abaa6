//! The version string a libnccl file carries: `NCCL version 2.30.7+cuda13.3`. NCCL writes it
//! into the library as one string "so that running `strings` on the lib can quickly reveal the
//! version" (its `src/init.cc`, `VERSION_STRING`: the version, `NCCL_SUFFIX`, the CUDA it was
//! built for). `ncclGetVersion` gives only the number; the string also names a fork, whose build
//! sets its own suffix (NCCLX's ends its version in `x-…`), so that a user who points
//! NCCL_LIBRARY at one sees which library runs.
//!
//! The string sits in the file's `.rodata` section (half a megabyte of a 250 MB library, whose
//! bulk is GPU code), so only that section is read: the ELF header says where it is.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// What the string starts with.
const PREFIX: &[u8] = b"NCCL version ";

/// A `.rodata` larger than this is not a libnccl's (NCCL 2.30's is under 1 MB).
const MOST_RODATA: u64 = 64 << 20;

/// The version string in the library file at `path`, or None when the file is no 64-bit ELF
/// library, has no `.rodata`, or carries no such string.
pub fn version_string(path: &Path) -> Option<String> {
    let mut file = File::open(path).ok()?;
    let (offset, size) = rodata(&mut file)?;
    if size > MOST_RODATA {
        return None;
    }
    let mut bytes = vec![0u8; size as usize];
    file.seek(SeekFrom::Start(offset)).ok()?;
    file.read_exact(&mut bytes).ok()?;
    version_string_in(&bytes)
}

/// The first `NCCL version <digit>…` string in `bytes`, up to its NUL (NCCL's messages that
/// merely mention the version, as `NCCL version mismatch…`, are passed over).
pub fn version_string_in(bytes: &[u8]) -> Option<String> {
    let mut from = 0;
    while let Some(at) = find(&bytes[from..], PREFIX).map(|i| from + i) {
        let rest = &bytes[at..];
        let end = rest
            .iter()
            .position(|&b| b == 0 || !(b.is_ascii_graphic() || b == b' '))
            .unwrap_or(rest.len());
        if rest.get(PREFIX.len()).is_some_and(u8::is_ascii_digit) {
            return Some(String::from_utf8_lossy(&rest[..end]).into_owned());
        }
        from = at + PREFIX.len();
    }
    None
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// `.rodata`'s offset and size in a 64-bit little-endian ELF file, read from its section
/// headers and their names (`e_shoff`, `e_shnum`, `e_shstrndx`, as the ELF-64 format lays them
/// out).
fn rodata(file: &mut File) -> Option<(u64, u64)> {
    let mut header = [0u8; 64];
    file.read_exact(&mut header).ok()?;
    // "\x7fELF", 64-bit (class 2), little-endian (data 1): x86-64 and aarch64 Linux.
    if header[..4] != *b"\x7fELF" || header[4] != 2 || header[5] != 1 {
        return None;
    }
    let shoff = u64_at(&header, 0x28);
    let shentsize = u16_at(&header, 0x3a) as u64;
    let shnum = u16_at(&header, 0x3c) as u64;
    let shstrndx = u16_at(&header, 0x3e) as u64;
    if shentsize < 64 || shnum == 0 || shstrndx >= shnum || shnum > 4096 {
        return None;
    }
    let mut table = vec![0u8; (shentsize * shnum) as usize];
    file.seek(SeekFrom::Start(shoff)).ok()?;
    file.read_exact(&mut table).ok()?;
    let section = |i: u64| &table[(i * shentsize) as usize..((i + 1) * shentsize) as usize];
    // A section header: its name's offset in the names' section (0), its offset (24), size (32).
    let names_at = section(shstrndx);
    let (names_offset, names_size) = (u64_at(names_at, 24), u64_at(names_at, 32));
    if names_size > MOST_RODATA {
        return None;
    }
    let mut names = vec![0u8; names_size as usize];
    file.seek(SeekFrom::Start(names_offset)).ok()?;
    file.read_exact(&mut names).ok()?;
    (0..shnum).map(section).find_map(|s| {
        let name = names.get(u32_at(s, 0) as usize..)?;
        name.starts_with(b".rodata\0")
            .then(|| (u64_at(s, 24), u64_at(s, 32)))
    })
}

fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(bytes[at..at + 2].try_into().expect("2 bytes"))
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_string_is_found_and_mentions_of_the_version_are_not() {
        let rodata =
            b"\0NCCL version mismatch with remote peer %s\0NCCL version 2.27.7x-abc+cuda12.8\0\
                       NCCL version 2.30.7+cuda13.3\0";
        assert_eq!(
            version_string_in(rodata).as_deref(),
            Some("NCCL version 2.27.7x-abc+cuda12.8")
        );
        assert_eq!(version_string_in(b"NCCL version %s\0"), None);
        assert_eq!(version_string_in(b""), None);
        assert_eq!(
            version_string_in(b"NCCL version 2.21.5+cuda12.4").as_deref(),
            Some("NCCL version 2.21.5+cuda12.4"),
            "a string at the very end, without its NUL"
        );
    }

    /// A 64-bit ELF file with a `.text` section, a `.rodata` section holding `rodata`, and the
    /// section names: what [`rodata`] reads of a real library.
    fn elf_with(rodata: &[u8]) -> Vec<u8> {
        let text = b"\x90\x90NCCL version 9.9.9 in .text\0";
        let names = b"\0.text\0.rodata\0.shstrtab\0";
        let (text_at, rodata_at) = (64u64, 64 + text.len() as u64);
        let names_at = rodata_at + rodata.len() as u64;
        let headers_at = names_at + names.len() as u64;
        let mut file = vec![0u8; 64];
        file[..6].copy_from_slice(b"\x7fELF\x02\x01");
        file[0x28..0x30].copy_from_slice(&headers_at.to_le_bytes());
        file[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        file[0x3c..0x3e].copy_from_slice(&4u16.to_le_bytes());
        file[0x3e..0x40].copy_from_slice(&3u16.to_le_bytes());
        file.extend_from_slice(text);
        file.extend_from_slice(rodata);
        file.extend_from_slice(names);
        // The null section, then .text, .rodata and .shstrtab: (name, offset, size).
        for (name, at, size) in [
            (0u32, 0u64, 0u64),
            (1, text_at, text.len() as u64),
            (7, rodata_at, rodata.len() as u64),
            (15, names_at, names.len() as u64),
        ] {
            let mut header = [0u8; 64];
            header[..4].copy_from_slice(&name.to_le_bytes());
            header[24..32].copy_from_slice(&at.to_le_bytes());
            header[32..40].copy_from_slice(&size.to_le_bytes());
            file.extend_from_slice(&header);
        }
        file
    }

    #[test]
    fn only_the_rodata_section_of_an_elf_file_is_read() {
        let dir = std::env::temp_dir().join(format!("nccl-version-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let lib = dir.join("libnccl.so.2");
        std::fs::write(&lib, elf_with(b"x\0NCCL version 2.30.7+cuda13.3\0y")).unwrap();
        assert_eq!(
            version_string(&lib).as_deref(),
            Some("NCCL version 2.30.7+cuda13.3")
        );
        // No string in .rodata: none, though .text holds one.
        std::fs::write(&lib, elf_with(b"nothing here\0")).unwrap();
        assert_eq!(version_string(&lib), None);
        // Not an ELF file, a missing file.
        std::fs::write(&lib, b"NCCL version 2.30.7+cuda13.3\0").unwrap();
        assert_eq!(version_string(&lib), None);
        assert_eq!(version_string(&dir.join("missing")), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
