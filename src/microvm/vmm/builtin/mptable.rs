//! The Intel MultiProcessor Specification 1.4 table: how a guest without
//! ACPI (ours: `acpi=off` kernels, no firmware) learns its CPUs, its
//! IO-APIC and how the ISA interrupts reach it. Without it Linux boots one
//! CPU and routes every interrupt through the PIC.
//!
//! The floating pointer sits at the start of the last KiB of base memory
//! (`layout::MPTABLE`), one of the places Linux scans for `_MP_`, inside
//! the range the memory map reports as reserved. Entries: one processor
//! per vCPU (APIC id = index, the first the bootstrap processor), one ISA
//! bus, KVM's IO-APIC, an interrupt per IO-APIC pin (ISA IRQ 0 on pin 2,
//! as KVM's default routing sends GSI 0 there; pin 2 carries nothing else)
//! and the local APICs' LINT0 (ExtINT) and LINT1 (NMI).

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::layout;

#[derive(Debug, thiserror::Error)]
pub enum MpTableError {
    #[error("the MP table has room for at most {max} vCPUs, not {asked}")]
    TooManyCpus { asked: u32, max: u32 },
    #[error("cannot write the MP table into guest memory")]
    Write,
}

/// Where the local APICs and the IO-APIC are (KVM's defaults).
pub const LAPIC_ADDR: u32 = 0xfee0_0000;
pub const IOAPIC_ADDR: u32 = 0xfec0_0000;
/// IO-APIC pins (KVM's IO-APIC has 24).
pub const IOAPIC_PINS: u8 = 24;
/// APIC ids are 8 bits; the IO-APIC takes the id after the last CPU.
pub const MAX_CPUS: u32 = 254;

const SPEC_REV: u8 = 4;
const APIC_VERSION: u8 = 0x14;
const IOAPIC_VERSION: u8 = 0x11;
const CPU_ENABLED: u8 = 1;
const CPU_BSP: u8 = 2;
/// Family 6, model 0, stepping 0; features: FPU and APIC.
const CPU_SIGNATURE: u32 = 0x600;
const CPU_FEATURES: u32 = (1 << 0) | (1 << 9);
const ENTRY_PROCESSOR: u8 = 0;
const ENTRY_BUS: u8 = 1;
const ENTRY_IOAPIC: u8 = 2;
const ENTRY_IO_INTERRUPT: u8 = 3;
const ENTRY_LOCAL_INTERRUPT: u8 = 4;
const INT_TYPE_INT: u8 = 0;
const INT_TYPE_NMI: u8 = 1;
const INT_TYPE_EXTINT: u8 = 3;
const ISA_BUS: u8 = 0;
/// "All local APICs" as a destination.
const ALL_LAPICS: u8 = 0xff;
/// The floating pointer structure's length, and the configuration table
/// header's.
const FLOATING_LEN: usize = 16;
const HEADER_LEN: usize = 44;

/// A byte string with little-endian appenders.
#[derive(Default)]
struct Out(Vec<u8>);

impl Out {
    fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.0.extend_from_slice(v);
        self
    }
}

/// The byte that makes `data` sum to zero (mod 256).
fn checksum(data: &[u8]) -> u8 {
    data.iter()
        .fold(0u8, |a, b| a.wrapping_add(*b))
        .wrapping_neg()
}

/// The whole table (floating pointer, then the configuration table) for
/// `cpus` vCPUs, to be placed at guest address `at`.
pub fn build(cpus: u32, at: u32) -> Result<Vec<u8>, MpTableError> {
    if cpus == 0 || cpus > MAX_CPUS {
        return Err(MpTableError::TooManyCpus {
            asked: cpus,
            max: MAX_CPUS,
        });
    }
    let ioapic_id = cpus as u8;
    let mut entries = Out::default();
    let mut count: u16 = 0;
    for id in 0..cpus {
        let flags = CPU_ENABLED | if id == 0 { CPU_BSP } else { 0 };
        entries
            .u8(ENTRY_PROCESSOR)
            .u8(id as u8)
            .u8(APIC_VERSION)
            .u8(flags)
            .u32(CPU_SIGNATURE)
            .u32(CPU_FEATURES)
            .u32(0)
            .u32(0);
        count += 1;
    }
    entries.u8(ENTRY_BUS).u8(ISA_BUS).bytes(b"ISA   ");
    entries
        .u8(ENTRY_IOAPIC)
        .u8(ioapic_id)
        .u8(IOAPIC_VERSION)
        .u8(1)
        .u32(IOAPIC_ADDR);
    count += 2;
    for pin in 0..IOAPIC_PINS {
        // ISA IRQ 0 (the PIT) is wired to pin 2, as KVM routes GSI 0.
        let irq = match pin {
            0 => continue,
            2 => 0,
            p => p,
        };
        entries
            .u8(ENTRY_IO_INTERRUPT)
            .u8(INT_TYPE_INT)
            .u16(0) // polarity and trigger: those of the bus
            .u8(ISA_BUS)
            .u8(irq)
            .u8(ioapic_id)
            .u8(pin);
        count += 1;
    }
    for (kind, lint) in [(INT_TYPE_EXTINT, 0u8), (INT_TYPE_NMI, 1)] {
        entries
            .u8(ENTRY_LOCAL_INTERRUPT)
            .u8(kind)
            .u16(0)
            .u8(ISA_BUS)
            .u8(0)
            .u8(ALL_LAPICS)
            .u8(lint);
        count += 1;
    }
    let table_len = HEADER_LEN + entries.0.len();
    let mut header = Out::default();
    header
        .bytes(b"PCMP")
        .u16(table_len as u16)
        .u8(SPEC_REV)
        .u8(0) // checksum, below
        .bytes(b"AGENTVM ")
        .bytes(b"BUILTIN VMM ")
        .u32(0) // no OEM table
        .u16(0)
        .u16(count)
        .u32(LAPIC_ADDR)
        .u16(0) // no extended table
        .u8(0)
        .u8(0);
    debug_assert_eq!(header.0.len(), HEADER_LEN);
    let mut table = header.0;
    table.extend_from_slice(&entries.0);
    table[7] = checksum(&table);

    let mut floating = Out::default();
    floating
        .bytes(b"_MP_")
        .u32(at + FLOATING_LEN as u32) // the configuration table follows
        .u8(1) // length in 16-byte units
        .u8(SPEC_REV)
        .u8(0) // checksum, below
        .bytes(&[0; 5]); // feature bytes: the table above, no default config
    debug_assert_eq!(floating.0.len(), FLOATING_LEN);
    let mut all = floating.0;
    all[10] = checksum(&all);
    all.extend_from_slice(&table);
    Ok(all)
}

/// Writes the table for `cpus` vCPUs at `layout::MPTABLE`.
pub fn write(mem: &GuestMemoryMmap, cpus: u32) -> Result<(), MpTableError> {
    let table = build(cpus, layout::MPTABLE as u32)?;
    mem.write_slice(&table, GuestAddress(layout::MPTABLE))
        .map_err(|_| MpTableError::Write)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(data: &[u8]) -> u8 {
        data.iter().fold(0u8, |a, b| a.wrapping_add(*b))
    }

    #[test]
    fn the_table_parses_as_linux_reads_it() {
        let at = 0x9fc00u32;
        let all = build(2, at).unwrap();
        let (floating, table) = all.split_at(FLOATING_LEN);
        assert_eq!(&floating[..4], b"_MP_");
        assert_eq!(sum(floating), 0);
        assert_eq!(
            u32::from_le_bytes(floating[4..8].try_into().unwrap()),
            at + 16
        );
        assert_eq!(&table[..4], b"PCMP");
        let len = u16::from_le_bytes(table[4..6].try_into().unwrap()) as usize;
        assert_eq!(len, table.len());
        assert_eq!(sum(table), 0);
        assert_eq!(table[6], 4);
        assert_eq!(
            u32::from_le_bytes(table[36..40].try_into().unwrap()),
            LAPIC_ADDR
        );
        // Walk the entries by type, as Linux does.
        let count = u16::from_le_bytes(table[34..36].try_into().unwrap());
        let (mut at, mut seen, mut cpus, mut pins) = (HEADER_LEN, 0, Vec::new(), Vec::new());
        while at < len {
            let e = &table[at..];
            at += match e[0] {
                ENTRY_PROCESSOR => {
                    cpus.push((e[1], e[3]));
                    20
                }
                ENTRY_BUS => {
                    assert_eq!(&e[2..8], b"ISA   ");
                    8
                }
                ENTRY_IOAPIC => {
                    assert_eq!(e[1], 2, "the IO-APIC's id follows the CPUs'");
                    assert_eq!(u32::from_le_bytes(e[4..8].try_into().unwrap()), IOAPIC_ADDR);
                    8
                }
                ENTRY_IO_INTERRUPT => {
                    pins.push((e[5], e[7]));
                    8
                }
                ENTRY_LOCAL_INTERRUPT => 8,
                t => panic!("unknown entry type {t}"),
            };
            seen += 1;
        }
        assert_eq!(at, len);
        assert_eq!(seen, count);
        assert_eq!(cpus, vec![(0, CPU_ENABLED | CPU_BSP), (1, CPU_ENABLED)]);
        assert_eq!(pins.len(), 23);
        assert!(pins.contains(&(0, 2)), "the PIT's IRQ 0 is on pin 2");
        assert!(pins.contains(&(5, 5)) && pins.contains(&(23, 23)));
    }

    #[test]
    fn cpu_counts_outside_the_apic_ids_are_refused() {
        assert!(build(0, 0).is_err());
        assert!(build(MAX_CPUS, 0).is_ok());
        assert!(matches!(
            build(MAX_CPUS + 1, 0),
            Err(MpTableError::TooManyCpus { asked: 255, .. })
        ));
    }
}
