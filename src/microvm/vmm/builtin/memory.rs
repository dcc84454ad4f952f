//! Guest memory: one memfd, sized from the VM's memory, mapped shared so
//! that it can later be snapshotted, shared with a virtio-fs server or
//! forked, laid out around the MMIO gap ([`super::layout::ram_ranges`]).

use std::fs::File;

use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap};

use super::layout;

#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error("guest memory of {0} MiB is not a size this host can map")]
    Size(u64),
    #[error("cannot create the guest memory's memfd: {0}")]
    Memfd(#[source] nix::Error),
    #[error("cannot size the guest memory's memfd to {size} bytes: {source}")]
    Resize {
        size: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot map guest memory: {0}")]
    Map(#[source] vm_memory::mmap::FromRangesError),
}

/// Guest memory and the memfd behind it.
pub struct Memory {
    pub guest: GuestMemoryMmap,
    pub memfd: File,
}

/// Creates `mib` MiB of guest memory backed by a memfd.
pub fn create(mib: u64) -> Result<Memory, MemoryError> {
    let size = mib
        .checked_mul(1 << 20)
        .filter(|s| *s > 0 && usize::try_from(*s).is_ok())
        .ok_or(MemoryError::Size(mib))?;
    let memfd: File = memfd_create(
        c"agentvm-guest",
        MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING,
    )
    .map_err(MemoryError::Memfd)?
    .into();
    memfd
        .set_len(size)
        .map_err(|source| MemoryError::Resize { size, source })?;
    let mut ranges = Vec::new();
    let mut offset = 0u64;
    for (start, len) in layout::ram_ranges(size) {
        let file = memfd
            .try_clone()
            .map_err(|source| MemoryError::Resize { size, source })?;
        // Each range fits a usize: the whole size did.
        ranges.push((
            GuestAddress(start),
            len as usize,
            Some(FileOffset::new(file, offset)),
        ));
        offset += len;
    }
    let guest = GuestMemoryMmap::from_ranges_with_files(ranges).map_err(MemoryError::Map)?;
    Ok(Memory { guest, memfd })
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestMemory};

    #[test]
    fn memory_is_the_memfd() {
        let m = create(2).unwrap();
        assert_eq!(m.guest.num_regions(), 1);
        assert_eq!(m.memfd.metadata().unwrap().len(), 2 << 20);
        m.guest.write_obj(0xfeed_u32, GuestAddress(0x1000)).unwrap();
        // The same bytes through the file: the mapping is shared.
        let mut word = [0u8; 4];
        std::os::unix::fs::FileExt::read_exact_at(&m.memfd, &mut word, 0x1000).unwrap();
        assert_eq!(u32::from_le_bytes(word), 0xfeed);
        assert!(m.guest.write_obj(0u8, GuestAddress(2 << 20)).is_err());
    }

    #[test]
    fn sizes_no_host_can_map_are_refused() {
        assert!(matches!(create(0), Err(MemoryError::Size(0))));
        assert!(matches!(create(u64::MAX), Err(MemoryError::Size(_))));
    }
}
