//! Loading the egress rules: Debian's `nft` reading a ruleset on stdin, in
//! the calling thread's network namespace.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use super::NFT_TABLE;

/// Where Debian installs nft; PATH is the fallback.
const NFT: &str = "/usr/sbin/nft";

#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error("cannot run {nft}: {source}")]
    Run {
        nft: &'static str,
        source: std::io::Error,
    },
    #[error("nft refused the egress rules: {0}")]
    Refused(String),
}

/// Loads `ruleset` (`nft -f -`).
pub fn apply(ruleset: &str) -> Result<(), NftError> {
    let nft = if Path::new(NFT).exists() { NFT } else { "nft" };
    let run = |source| NftError::Run { nft, source };
    let mut child = Command::new(nft)
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(run)?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(ruleset.as_bytes()).map_err(run)?;
    }
    let out = child.wait_with_output().map_err(run)?;
    if !out.status.success() {
        return Err(NftError::Refused(
            String::from_utf8_lossy(&out.stderr)
                .trim()
                .replace('\n', "; "),
        ));
    }
    Ok(())
}

/// Removes the egress rules' table (declaring it first, so a namespace
/// without it is no error).
pub fn remove() -> Result<(), NftError> {
    apply(&format!(
        "table inet {NFT_TABLE}\ndelete table inet {NFT_TABLE}\n"
    ))
}
