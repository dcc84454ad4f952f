//! A vCPU's state at the PVH entry point: 32-bit protected mode, flat
//! segments from a GDT in guest memory, paging off, `ebx` the start info
//! (the PVH boot ABI), plus the CPUID, FPU and local APIC a Linux guest
//! expects.

use kvm_bindings::{kvm_fpu, kvm_segment, CpuId, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::{Cap, Kvm, VcpuFd};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::boot::Entry;
use super::layout;

#[derive(Debug, thiserror::Error)]
pub enum CpuError {
    #[error("cannot {what} of vCPU {index}: {source}")]
    Kvm {
        what: &'static str,
        index: u32,
        #[source]
        source: kvm_ioctls::Error,
    },
    #[error("cannot write the boot GDT into guest memory")]
    Gdt,
}

/// CR0.PE: protected mode.
const CR0_PE: u64 = 1;
/// CR0.ET: the FPU is a 387.
const CR0_ET: u64 = 1 << 4;

/// GDT entries: null, 32-bit code (0x08), data (0x10), TSS (0x18). The
/// 16-bit word is the access byte in bits 0–7 and the G, D/B, L, AVL
/// flags in bits 12–15.
const GDT_FLAGS: [u16; 4] = [0, 0xc09b, 0xc093, 0x008b];
pub const CODE_SELECTOR: u16 = 0x08;
pub const DATA_SELECTOR: u16 = 0x10;
const TSS_SELECTOR: u16 = 0x18;

/// A segment descriptor as the CPU reads it from the GDT.
fn gdt_entry(flags: u16, base: u32, limit: u32) -> u64 {
    let (flags, base, limit) = (u64::from(flags), u64::from(base), u64::from(limit));
    ((base & 0xff00_0000) << 32)
        | ((flags & 0xf0ff) << 40)
        | ((limit & 0xf_0000) << 32)
        | ((base & 0x00ff_ffff) << 16)
        | (limit & 0xffff)
}

/// The same descriptor as KVM takes it.
fn segment(flags: u16, selector: u16) -> kvm_segment {
    let g = (flags >> 15) & 1;
    kvm_segment {
        base: 0,
        limit: if g == 1 { 0xffff_ffff } else { 0xfffff },
        selector,
        type_: (flags & 0xf) as u8,
        present: ((flags >> 7) & 1) as u8,
        dpl: ((flags >> 5) & 3) as u8,
        db: ((flags >> 14) & 1) as u8,
        s: ((flags >> 4) & 1) as u8,
        l: ((flags >> 13) & 1) as u8,
        g: g as u8,
        avl: ((flags >> 12) & 1) as u8,
        unusable: 0,
        padding: 0,
    }
}

/// Writes the boot GDT (flat 4 GiB segments) into guest memory.
pub fn write_gdt(mem: &GuestMemoryMmap) -> Result<(), CpuError> {
    for (i, flags) in GDT_FLAGS.iter().enumerate() {
        let limit = if *flags == 0x008b { 0x67 } else { 0xfffff };
        mem.write_obj(
            gdt_entry(*flags, 0, limit),
            GuestAddress(layout::GDT + 8 * i as u64),
        )
        .map_err(|_| CpuError::Gdt)?;
    }
    Ok(())
}

fn kvm_error(what: &'static str, index: u32) -> impl FnOnce(kvm_ioctls::Error) -> CpuError {
    move |source| CpuError::Kvm {
        what,
        index,
        source,
    }
}

/// Sets vCPU `index` up to enter the kernel at its PVH entry point.
pub fn setup_pvh(vcpu: &VcpuFd, index: u32, entry: Entry) -> Result<(), CpuError> {
    let mut sregs = vcpu
        .get_sregs()
        .map_err(kvm_error("read the sregs", index))?;
    sregs.gdt.base = layout::GDT;
    sregs.gdt.limit = (8 * GDT_FLAGS.len() - 1) as u16;
    sregs.idt.base = 0;
    sregs.idt.limit = 0;
    sregs.cs = segment(GDT_FLAGS[1], CODE_SELECTOR);
    let data = segment(GDT_FLAGS[2], DATA_SELECTOR);
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    let mut tss = segment(GDT_FLAGS[3], TSS_SELECTOR);
    tss.limit = 0x67;
    sregs.tr = tss;
    sregs.cr0 = CR0_PE | CR0_ET;
    sregs.cr4 = 0;
    sregs.efer = 0;
    vcpu.set_sregs(&sregs)
        .map_err(kvm_error("set the sregs", index))?;
    let mut regs = vcpu
        .get_regs()
        .map_err(kvm_error("read the registers", index))?;
    regs.rflags = 2;
    regs.rip = entry.pvh_entry.0;
    regs.rbx = entry.start_info.0;
    vcpu.set_regs(&regs)
        .map_err(kvm_error("set the registers", index))?;
    let fpu = kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    };
    vcpu.set_fpu(&fpu)
        .map_err(kvm_error("set the FPU", index))?;
    Ok(())
}

/// CPUID.1:ECX bit 31: the CPU is a hypervisor's guest. KVM leaves it
/// out of its supported list; without it Linux does not look at KVM's
/// leaves (0x4000_0000), boots "on bare hardware" without kvmclock, and
/// must calibrate the TSC against the PIT.
const CPUID_1_ECX_HYPERVISOR: u32 = 1 << 31;

/// CPUID.1:ECX bit 24: the local APIC timer has the TSC-deadline mode.
/// KVM emulates it (`KVM_CAP_TSC_DEADLINE_TIMER`) but leaves the bit out
/// of its supported list. Without it Linux calibrates the APIC timer
/// against the PIT; where that fails (measured in the test host: "APIC
/// timer disabled due to verification failure") every CPU but the first
/// is left waiting for the PIT's broadcast, and a `sleep 1` on the second
/// vCPU never returned.
const CPUID_1_ECX_TSC_DEADLINE: u32 = 1 << 24;

/// The VMM's changes to KVM's supported CPUID for vCPU `index`: its APIC
/// id (leaves 1 and 0xb), the hypervisor bit, and the TSC-deadline timer
/// when KVM emulates it.
pub fn adjust_cpuid(
    entries: &mut [kvm_bindings::kvm_cpuid_entry2],
    index: u32,
    tsc_deadline: bool,
) {
    for e in entries {
        match e.function {
            1 => {
                e.ebx = (e.ebx & 0x00ff_ffff) | (index << 24);
                e.ecx |= CPUID_1_ECX_HYPERVISOR;
                if tsc_deadline {
                    e.ecx |= CPUID_1_ECX_TSC_DEADLINE;
                }
            }
            0xb => e.edx = index,
            _ => {}
        }
    }
}

/// Gives vCPU `index` the host's supported CPUID, adjusted
/// ([`adjust_cpuid`]).
pub fn setup_cpuid(kvm: &Kvm, vcpu: &VcpuFd, index: u32) -> Result<(), CpuError> {
    let mut cpuid: CpuId = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(kvm_error("read the supported CPUID", index))?;
    let tsc_deadline = kvm.check_extension(Cap::TscDeadlineTimer);
    adjust_cpuid(cpuid.as_mut_slice(), index, tsc_deadline);
    vcpu.set_cpuid2(&cpuid)
        .map_err(kvm_error("set the CPUID", index))
}

/// Local APIC: LINT0 delivers the PIC's interrupts (ExtINT), LINT1 NMIs,
/// as a BIOS would leave them.
pub fn setup_lapic(vcpu: &VcpuFd, index: u32) -> Result<(), CpuError> {
    const LVT_LINT0: usize = 0x350;
    const LVT_LINT1: usize = 0x360;
    const EXTINT: u32 = 7;
    const NMI: u32 = 4;
    let mut lapic = vcpu
        .get_lapic()
        .map_err(kvm_error("read the LAPIC", index))?;
    for (reg, mode) in [(LVT_LINT0, EXTINT), (LVT_LINT1, NMI)] {
        let mut raw = [0u8; 4];
        for (i, b) in raw.iter_mut().enumerate() {
            *b = lapic.regs[reg + i] as u8;
        }
        let value = (u32::from_le_bytes(raw) & !0x700) | (mode << 8);
        for (i, b) in value.to_le_bytes().iter().enumerate() {
            lapic.regs[reg + i] = *b as _;
        }
    }
    vcpu.set_lapic(&lapic)
        .map_err(kvm_error("set the LAPIC", index))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gdt_entries_encode_flat_segments() {
        // The well-known encodings of flat 4 GiB code and data segments.
        assert_eq!(gdt_entry(0xc09b, 0, 0xfffff), 0x00cf_9b00_0000_ffff);
        assert_eq!(gdt_entry(0xc093, 0, 0xfffff), 0x00cf_9300_0000_ffff);
        let cs = segment(0xc09b, CODE_SELECTOR);
        assert_eq!(
            (cs.type_, cs.present, cs.db, cs.s, cs.l, cs.g),
            (0xb, 1, 1, 1, 0, 1)
        );
        assert_eq!(cs.limit, 0xffff_ffff);
    }

    #[test]
    fn cpuid_names_the_apic_id_and_the_hypervisor() {
        let leaf = |function, index| kvm_bindings::kvm_cpuid_entry2 {
            function,
            index,
            ebx: 0x0008_0800,
            ecx: 0x0000_0201,
            ..Default::default()
        };
        let mut entries = [leaf(1, 0), leaf(0xb, 0), leaf(0xb, 1), leaf(7, 0)];
        adjust_cpuid(&mut entries, 3, false);
        assert_eq!(entries[0].ebx, 0x0308_0800);
        assert_eq!(entries[0].ecx, 0x8000_0201);
        adjust_cpuid(&mut entries, 3, true);
        assert_eq!(entries[0].ecx, 0x8100_0201);
        assert_eq!((entries[1].edx, entries[2].edx), (3, 3));
        // Other leaves are KVM's.
        assert_eq!((entries[3].ebx, entries[3].ecx), (0x0008_0800, 0x0000_0201));
    }
}
