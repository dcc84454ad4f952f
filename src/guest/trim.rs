//! Giving guest RAM back to the host while the VM idles.
//!
//! Every page the guest ever touched stays resident on the host (the guest
//! RAM is a memfd) until the guest reports it free. The VMM gives every VM
//! a balloon with free page reporting; the kernel reports only free blocks
//! of at least `page_reporting_order` (2 MiB by default, which the pages an
//! idle guest frees seldom merge into), so the agent lowers it at boot.
//!
//! What an idle guest still holds that the host already has is page cache
//! of the share: the agent's own binary (it runs from the share) and what
//! the container's creation read. [`IDLE`] after the last request the
//! agent pages its binary out (`MADV_PAGEOUT`: clean file pages, re-read
//! from the host's page cache through virtio-fs when next needed) and
//! drops the clean page cache no process maps; free page reporting then
//! returns those pages to the host.
//!
//! The price is the next request's: under TCG the first `exec` after a
//! trim took 220-360 ms against 60-85 ms (the agent's code read back
//! through virtio-fs), so only a VM left alone for a while is trimmed.

use std::time::Duration;

/// How long the agent waits after its last request before trimming.
pub const IDLE: Duration = Duration::from_secs(10);

/// The kernel's free page reporting threshold (`mm/page_reporting.c`; the
/// balloon driver sets it when it registers, so it is written after boot).
const REPORTING_ORDER: &str = "/sys/module/page_reporting/parameters/page_reporting_order";

/// Smallest free block reported, as a power of two of pages: 0 reports
/// every free page (the host's cost is one discard per block, a few per
/// reporting pass every 2 s while the guest frees memory).
pub const ORDER: u32 = 0;

#[derive(Debug, thiserror::Error)]
pub enum TrimError {
    #[error("cannot set {REPORTING_ORDER}: {0}")]
    ReportingOrder(std::io::Error),
    #[error("cannot read /proc/self/maps: {0}")]
    Maps(std::io::Error),
}

/// Lowers the free page reporting order to [`ORDER`]. A kernel without
/// free page reporting (no balloon device, or not built in) has no such
/// parameter: nothing to do.
pub fn report_small_blocks() -> Result<(), TrimError> {
    match std::fs::write(REPORTING_ORDER, ORDER.to_string()) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other.map_err(TrimError::ReportingOrder),
    }
}

/// What one trim did, in KiB of the guest's page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trimmed {
    pub cached_before_kib: u64,
    pub cached_after_kib: u64,
}

/// Pages out this process's read-only file mappings and drops the clean,
/// unmapped page cache.
pub fn trim() -> Result<Trimmed, TrimError> {
    let cached_before_kib = cached_kib();
    let maps = std::fs::read_to_string("/proc/self/maps").map_err(TrimError::Maps)?;
    for (start, len) in file_text(&maps) {
        // SAFETY: MADV_PAGEOUT only reclaims pages; the range is one of
        // this process's mappings as /proc/self/maps lists it, and a
        // file-backed, non-writable mapping reads the same afterwards (the
        // kernel faults the pages back in from the file). An error (a
        // mapping that went away, an old kernel) changes nothing.
        unsafe {
            libc::madvise(start as *mut libc::c_void, len, libc::MADV_PAGEOUT);
        }
    }
    // 1: clean page cache only (not dentries and inodes). Best effort.
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "1");
    Ok(Trimmed {
        cached_before_kib,
        cached_after_kib: cached_kib(),
    })
}

/// The file-backed mappings of `maps` that are not writable, as (start,
/// length).
fn file_text(maps: &str) -> Vec<(usize, usize)> {
    maps.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let range = fields.next()?;
            let perms = fields.next()?;
            let _offset = fields.next()?;
            let _dev = fields.next()?;
            let inode = fields.next()?;
            let path = fields.next()?;
            if perms.contains('w') || inode == "0" || !path.starts_with('/') {
                return None;
            }
            let (start, end) = range.split_once('-')?;
            let start = usize::from_str_radix(start, 16).ok()?;
            let end = usize::from_str_radix(end, 16).ok()?;
            Some((start, end.checked_sub(start)?))
        })
        .filter(|&(_, len)| len > 0)
        .collect()
}

/// `Cached` of /proc/meminfo, in KiB (0 when unreadable).
fn cached_kib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines().find_map(|l| {
                l.strip_prefix("Cached:")?
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse()
                    .ok()
            })
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_read_only_file_mappings_are_paged_out() {
        let maps = "\
00400000-00452000 r-xp 00000000 00:1f 1234 /.agentvm/init
00651000-00652000 r--p 00051000 00:1f 1234 /.agentvm/init
00652000-00655000 rw-p 00052000 00:1f 1234 /.agentvm/init
01000000-01021000 rw-p 00000000 00:00 0 [heap]
7ffd0000-7ffd1000 r--p 00000000 00:00 0 [vvar]
7ffe0000-7ffe2000 r-xp 00000000 00:00 0 [vdso]
7fff0000-7fff1000 r--s 00000000 00:05 77 /dev/zero (deleted)
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0 [vsyscall]
garbage line
";
        assert_eq!(
            file_text(maps),
            vec![
                (0x400000, 0x52000),
                (0x651000, 0x1000),
                (0x7fff0000, 0x1000)
            ]
        );
    }
}
