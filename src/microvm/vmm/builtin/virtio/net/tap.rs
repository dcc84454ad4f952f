//! The tap's side of the header: a tap opened with `IFF_VNET_HDR` (as the
//! supervisor opens it, `src/router.rs`) prefixes each frame with a
//! `virtio_net_hdr` of the size it is told, and takes no offloads unless
//! it is told which.

use std::os::fd::{AsRawFd, BorrowedFd};

/// `TUNSETOFFLOAD`: _IOW('T', 208, unsigned int).
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
/// `TUNSETVNETHDRSZ`: _IOW('T', 216, int).
const TUNSETVNETHDRSZ: libc::c_ulong = 0x4004_54d8;

/// Makes the tap's header [`super::HDR_LEN`] bytes (virtio 1.x's) and
/// turns its offloads off, so that it hands the guest whole frames with
/// their checksums.
pub fn configure(tap: BorrowedFd) -> std::io::Result<()> {
    let size: libc::c_int = super::HDR_LEN as libc::c_int;
    // SAFETY: TUNSETVNETHDRSZ reads one int through the pointer, which
    // points at `size`, alive for the call; the fd is borrowed, open.
    if unsafe { libc::ioctl(tap.as_raw_fd(), TUNSETVNETHDRSZ, &size) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: TUNSETOFFLOAD takes its argument by value; no memory is
    // passed.
    if unsafe { libc::ioctl(tap.as_raw_fd(), TUNSETOFFLOAD, 0 as libc::c_ulong) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
