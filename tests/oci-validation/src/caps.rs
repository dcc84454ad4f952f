//! Linux capability names, as config.json spells them, and their bit numbers.

/// Capability names in bit order (capability(7), linux/capability.h).
pub const NAMES: [&str; 41] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];

/// The bit number of a capability name, or `None` for an unknown name.
pub fn bit(name: &str) -> Option<u32> {
    NAMES
        .iter()
        .position(|n| *n == name)
        .and_then(|p| u32::try_from(p).ok())
}

/// The mask of a list of names; unknown names are returned as the error.
pub fn mask(names: &[&str]) -> Result<u64, String> {
    let mut m = 0u64;
    for n in names {
        let b = bit(n).ok_or_else(|| (*n).to_string())?;
        m |= 1u64 << b;
    }
    Ok(m)
}

/// The names of the bits set in `mask`, unknown bits as `bit N`.
pub fn names(mask: u64) -> Vec<String> {
    (0..64u32)
        .filter(|b| mask & (1u64 << b) != 0)
        .map(
            |b| match usize::try_from(b).ok().and_then(|i| NAMES.get(i)) {
                Some(n) => (*n).to_string(),
                None => format!("bit {b}"),
            },
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_match_kernel_numbers() {
        assert_eq!(bit("CAP_CHOWN"), Some(0));
        assert_eq!(bit("CAP_NET_BIND_SERVICE"), Some(10));
        assert_eq!(bit("CAP_SYS_ADMIN"), Some(21));
        assert_eq!(bit("CAP_AUDIT_WRITE"), Some(29));
        assert_eq!(bit("CAP_CHECKPOINT_RESTORE"), Some(40));
        assert_eq!(bit("CAP_NOPE"), None);
    }

    #[test]
    fn mask_and_names_round_trip() {
        let m = mask(&["CAP_KILL", "CAP_AUDIT_WRITE", "CAP_NET_BIND_SERVICE"]).unwrap();
        assert_eq!(m, 0x2000_0420);
        assert_eq!(
            names(m),
            vec!["CAP_KILL", "CAP_NET_BIND_SERVICE", "CAP_AUDIT_WRITE"]
        );
        assert_eq!(mask(&["CAP_NOPE"]), Err("CAP_NOPE".to_string()));
    }
}
