//! Where things are in the guest's physical address space (x86_64).

/// The PVH `hvm_start_info` structure.
pub const START_INFO: u64 = 0x6000;
/// The PVH memory map, after the start info.
pub const MEMMAP: u64 = 0x7000;
/// The initramfs module list entry.
pub const MODLIST: u64 = 0x7800;
/// The boot GDT (PVH enters in 32-bit protected mode with flat segments).
pub const GDT: u64 = 0x500;
/// The MP table (`mptable`): the last KiB of base memory, which Linux
/// scans for it; reserved in the memory map.
pub const MPTABLE: u64 = 0x9_fc00;
/// The kernel command line.
pub const CMDLINE: u64 = 0x20000;
/// Most bytes of command line, its NUL included (Linux's COMMAND_LINE_SIZE).
pub const CMDLINE_MAX: usize = 2048;
/// Where a kernel's high part may start (1 MiB).
pub const HIMEM_START: u64 = 0x10_0000;
/// Start of the gap below 4 GiB kept free of RAM for devices.
pub const MMIO_START: u64 = 0xd000_0000;
/// End of that gap.
pub const MMIO_END: u64 = 1 << 32;
/// KVM's TSS, in the last pages below the gap's end (Intel needs it).
pub const KVM_TSS: u64 = 0xfffb_d000;
/// First GSI of virtio-mmio devices (5 to 23 on the IO-APIC).
pub const FIRST_VIRTIO_IRQ: u32 = 5;
/// Last usable one.
pub const LAST_VIRTIO_IRQ: u32 = 23;

/// The RAM ranges of a guest of `size` bytes: below the MMIO gap, and the
/// rest above 4 GiB.
pub fn ram_ranges(size: u64) -> Vec<(u64, u64)> {
    if size <= MMIO_START {
        vec![(0, size)]
    } else {
        vec![(0, MMIO_START), (MMIO_END, size - MMIO_START)]
    }
}

/// The window and interrupt of virtio-mmio device `n`, and its
/// `virtio_mmio.device=` command-line entry.
pub fn virtio_slot(n: u32) -> Option<(u64, u32, String)> {
    let irq = FIRST_VIRTIO_IRQ
        .checked_add(n)
        .filter(|i| *i <= LAST_VIRTIO_IRQ)?;
    let base = MMIO_START + u64::from(n) * super::virtio::mmio::WINDOW;
    Some((base, irq, format!("virtio_mmio.device=4K@{base:#x}:{irq}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ram_skips_the_mmio_gap() {
        assert_eq!(ram_ranges(128 << 20), vec![(0, 128 << 20)]);
        assert_eq!(
            ram_ranges(4 << 30),
            vec![(0, MMIO_START), (MMIO_END, (4 << 30) - MMIO_START)]
        );
    }

    #[test]
    fn virtio_slots_name_their_window_and_irq() {
        assert_eq!(
            virtio_slot(0).unwrap().2,
            "virtio_mmio.device=4K@0xd0000000:5"
        );
        assert_eq!(virtio_slot(1).unwrap().0, 0xd000_1000);
        assert_eq!(virtio_slot(18).unwrap().1, 23);
        assert!(virtio_slot(19).is_none());
        assert!(virtio_slot(u32::MAX).is_none());
    }
}
