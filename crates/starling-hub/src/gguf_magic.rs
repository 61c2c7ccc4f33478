//! Recognising a GGUF file by its first four bytes.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use crate::HubError;

/// The four bytes every GGUF file starts with.
pub(crate) const GGUF_MAGIC: &[u8; 4] = b"GGUF";

/// True when the file starts with the GGUF magic (a shorter file is simply not GGUF).
pub(crate) fn has_gguf_magic(path: &Path) -> Result<bool, HubError> {
    let mut file = File::open(path).map_err(|e| HubError::io("open", path, e))?;
    let mut head = [0u8; 4];
    let mut filled = 0;
    while filled < head.len() {
        match file.read(&mut head[filled..]) {
            Ok(0) => return Ok(false),
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(HubError::io("read", path, e)),
        }
    }
    Ok(&head == GGUF_MAGIC)
}
