//! Loading the guest kernel: an ELF `vmlinux` entered through its PVH
//! note (32-bit protected mode, `ebx` = the `hvm_start_info`), its command
//! line, and the initramfs as the first PVH module.

use std::fs::File;
use std::path::Path;

use linux_loader::configurator::pvh::PvhBootConfigurator;
use linux_loader::configurator::{BootConfigurator, BootParams};
use linux_loader::loader::elf::start_info::{
    hvm_memmap_table_entry, hvm_modlist_entry, hvm_start_info,
};
use linux_loader::loader::{Cmdline, Elf, KernelLoader, PvhBootCapability};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory, GuestMemoryMmap, GuestMemoryRegion};

use super::layout;

/// `XEN_HVM_START_MAGIC_VALUE`.
pub const START_MAGIC: u32 = 0x336e_c578;
/// E820 type of usable RAM.
const E820_RAM: u32 = 1;
/// E820 type of reserved memory.
const E820_RESERVED: u32 = 2;

#[derive(Debug, thiserror::Error)]
pub enum BootError {
    #[error("cannot open the guest kernel {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot load the guest kernel {path}: {source}")]
    Load {
        path: String,
        #[source]
        source: linux_loader::loader::Error,
    },
    #[error("the guest kernel {0} has no PVH entry point (build it with CONFIG_PVH)")]
    NoPvh(String),
    #[error("kernel command line: {0}")]
    Cmdline(#[source] linux_loader::cmdline::Error),
    #[error("cannot write the command line into guest memory: {0}")]
    WriteCmdline(#[source] linux_loader::loader::Error),
    #[error("the initramfs ({0} bytes) does not fit in guest memory above the kernel")]
    InitramfsTooBig(u64),
    #[error("cannot read the initramfs {path}: {source}")]
    Initramfs {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write the PVH boot structures: {0}")]
    StartInfo(#[source] linux_loader::configurator::Error),
}

/// Where the kernel starts and what it is handed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// The PVH entry point (32-bit protected mode).
    pub pvh_entry: GuestAddress,
    /// The `hvm_start_info` address, for `ebx`.
    pub start_info: GuestAddress,
}

/// Builds a command line from `text`, checked against Linux's limit.
pub fn cmdline(text: &str) -> Result<Cmdline, BootError> {
    let mut c = Cmdline::new(layout::CMDLINE_MAX).map_err(BootError::Cmdline)?;
    c.insert_str(text).map_err(BootError::Cmdline)?;
    Ok(c)
}

/// Loads `kernel` and `initramfs` (if any) into `mem` and writes the PVH
/// start info with `cmdline`.
pub fn load(
    mem: &GuestMemoryMmap,
    kernel: &Path,
    initramfs: Option<&Path>,
    cmdline: &Cmdline,
) -> Result<Entry, BootError> {
    let name = kernel.display().to_string();
    let mut file = File::open(kernel).map_err(|source| BootError::Open {
        path: name.clone(),
        source,
    })?;
    prefault(mem, &file);
    let loaded = Elf::load(
        mem,
        None,
        &mut file,
        Some(GuestAddress(layout::HIMEM_START)),
    )
    .map_err(|source| BootError::Load {
        path: name.clone(),
        source,
    })?;
    let PvhBootCapability::PvhEntryPresent(pvh_entry) = loaded.pvh_boot_cap else {
        return Err(BootError::NoPvh(name));
    };
    linux_loader::loader::load_cmdline(mem, GuestAddress(layout::CMDLINE), cmdline)
        .map_err(BootError::WriteCmdline)?;
    let module = match initramfs {
        Some(path) => Some(load_initramfs(mem, path, loaded.kernel_end)?),
        None => None,
    };
    write_start_info(mem, module)?;
    Ok(Entry {
        pvh_entry,
        start_info: GuestAddress(layout::START_INFO),
    })
}

/// The guest-physical ranges of an ELF64 file's `PT_LOAD` segments
/// (`p_paddr`, `p_memsz`), read from its program headers; none from a file
/// that is not such an ELF (the loader then says what is wrong with it).
pub fn load_ranges(file: &File) -> Vec<(u64, u64)> {
    use std::os::unix::fs::FileExt;
    const PT_LOAD: u32 = 1;
    let mut ehdr = [0u8; 64];
    if file.read_exact_at(&mut ehdr, 0).is_err() || &ehdr[..4] != b"\x7fELF" || ehdr[4] != 2 {
        return Vec::new();
    }
    let u16_at = |b: &[u8], at: usize| u16::from_le_bytes([b[at], b[at + 1]]);
    let u64_at = |b: &[u8], at: usize| {
        let mut v = [0u8; 8];
        v.copy_from_slice(&b[at..at + 8]);
        u64::from_le_bytes(v)
    };
    let phoff = u64_at(&ehdr, 32);
    let (entsize, count) = (u64::from(u16_at(&ehdr, 54)), u16_at(&ehdr, 56));
    if entsize < 56 {
        return Vec::new();
    }
    let mut ranges = Vec::new();
    let mut phdr = [0u8; 56];
    for i in 0..u64::from(count) {
        let Some(at) = i.checked_mul(entsize).and_then(|o| o.checked_add(phoff)) else {
            break;
        };
        if file.read_exact_at(&mut phdr, at).is_err() {
            break;
        }
        if u32::from_le_bytes([phdr[0], phdr[1], phdr[2], phdr[3]]) == PT_LOAD {
            ranges.push((u64_at(&phdr, 24), u64_at(&phdr, 40)));
        }
    }
    ranges
}

/// Makes the guest pages the kernel's segments will fill resident before
/// the loader copies them in: one `MADV_POPULATE_WRITE` per segment rather
/// than a page fault per 4 KiB page while copying (the guest touches every
/// one of them as it boots, its bss included, so nothing is populated that
/// would otherwise stay untouched). Best effort: a range outside guest
/// memory, or a kernel without `MADV_POPULATE_WRITE` (before 5.14), leaves
/// the pages to fault in as before.
fn prefault(mem: &GuestMemoryMmap, file: &File) {
    const PAGE: u64 = 4096;
    for (start, len) in load_ranges(file) {
        let Some(end) = start.checked_add(len) else {
            continue;
        };
        let first = start & !(PAGE - 1);
        let Some(last) = end.checked_add(PAGE - 1).map(|e| e & !(PAGE - 1)) else {
            continue;
        };
        let Ok(size) = usize::try_from(last - first) else {
            continue;
        };
        let Ok(slice) = mem.get_slice(GuestAddress(first), size) else {
            continue;
        };
        // SAFETY: `slice` is `size` bytes of guest memory that `mem` maps
        // and keeps mapped for this call; MADV_POPULATE_WRITE only faults
        // those pages in (writable, contents unchanged: zero in a fresh
        // memfd), and its failure changes nothing.
        unsafe {
            libc::madvise(
                slice.ptr_guard_mut().as_ptr().cast(),
                size,
                libc::MADV_POPULATE_WRITE,
            );
        }
    }
}

/// Puts the initramfs at the top of the low RAM, page-aligned, above the
/// kernel's end; returns its (address, size).
fn load_initramfs(
    mem: &GuestMemoryMmap,
    path: &Path,
    kernel_end: u64,
) -> Result<(u64, u64), BootError> {
    let name = path.display().to_string();
    let data = std::fs::read(path).map_err(|source| BootError::Initramfs {
        path: name.clone(),
        source,
    })?;
    let size = data.len() as u64;
    let low_end = mem
        .iter()
        .next()
        .map_or(0, |r| r.start_addr().raw_value() + r.len());
    let addr = low_end
        .checked_sub(size)
        .map(|a| a & !0xfff)
        .filter(|a| *a >= kernel_end)
        .ok_or(BootError::InitramfsTooBig(size))?;
    mem.write_slice(&data, GuestAddress(addr))
        .map_err(|source| BootError::Initramfs {
            path: name,
            source: std::io::Error::other(source),
        })?;
    Ok((addr, size))
}

fn write_start_info(mem: &GuestMemoryMmap, module: Option<(u64, u64)>) -> Result<(), BootError> {
    let mut memmap: Vec<hvm_memmap_table_entry> = Vec::new();
    // Base memory (the GDT, the boot structures and the command line
    // are in it) is RAM up to the MP table; from there to 1 MiB (the MP
    // table and the BIOS area a kernel expects) it is reserved.
    memmap.push(hvm_memmap_table_entry {
        addr: 0,
        size: layout::MPTABLE,
        type_: E820_RAM,
        reserved: 0,
    });
    memmap.push(hvm_memmap_table_entry {
        addr: layout::MPTABLE,
        size: layout::HIMEM_START - layout::MPTABLE,
        type_: E820_RESERVED,
        reserved: 0,
    });
    for region in mem.iter() {
        let start = region.start_addr().raw_value().max(layout::HIMEM_START);
        let end = region.start_addr().raw_value() + region.len();
        if end > start {
            memmap.push(hvm_memmap_table_entry {
                addr: start,
                size: end - start,
                type_: E820_RAM,
                reserved: 0,
            });
        }
    }
    let mut info = hvm_start_info {
        magic: START_MAGIC,
        version: 1,
        cmdline_paddr: layout::CMDLINE,
        memmap_paddr: layout::MEMMAP,
        memmap_entries: memmap.len() as u32,
        ..Default::default()
    };
    let mut params = BootParams::new(&info, GuestAddress(layout::START_INFO));
    if let Some((addr, size)) = module {
        info.nr_modules = 1;
        info.modlist_paddr = layout::MODLIST;
        params = BootParams::new(&info, GuestAddress(layout::START_INFO));
        params.set_modules(
            &[hvm_modlist_entry {
                paddr: addr,
                size,
                ..Default::default()
            }],
            GuestAddress(layout::MODLIST),
        );
    }
    params.set_sections(&memmap, GuestAddress(layout::MEMMAP));
    PvhBootConfigurator::write_bootparams::<GuestMemoryMmap>(&params, mem)
        .map_err(BootError::StartInfo)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// An ELF64 header and `segments` program headers (type, paddr,
    /// memsz), nothing else.
    fn elf(segments: &[(u32, u64, u64)]) -> File {
        let mut f = vec![0u8; 64];
        f[0..4].copy_from_slice(b"\x7fELF");
        f[4] = 2;
        f[5] = 1;
        f[32..40].copy_from_slice(&64u64.to_le_bytes());
        f[54..56].copy_from_slice(&56u16.to_le_bytes());
        f[56..58].copy_from_slice(&(segments.len() as u16).to_le_bytes());
        for (kind, paddr, memsz) in segments {
            let mut p = [0u8; 56];
            p[0..4].copy_from_slice(&kind.to_le_bytes());
            p[24..32].copy_from_slice(&paddr.to_le_bytes());
            p[40..48].copy_from_slice(&memsz.to_le_bytes());
            f.extend_from_slice(&p);
        }
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&f).unwrap();
        file
    }

    #[test]
    fn load_ranges_are_the_pt_load_segments() {
        let f = elf(&[(1, 16 << 20, 0x1234), (4, 0, 20), (1, 20 << 20, 4096)]);
        assert_eq!(load_ranges(&f), [(16 << 20, 0x1234), (20 << 20, 4096)]);
    }

    #[test]
    fn what_is_not_an_elf64_has_no_load_ranges() {
        let mut junk = tempfile::tempfile().unwrap();
        junk.write_all(b"MZ not an elf at all, but long enough to be read as a header....")
            .unwrap();
        assert!(load_ranges(&junk).is_empty());
        // Program headers past the end of the file: none read.
        let mut short = vec![0u8; 64];
        short[0..4].copy_from_slice(b"\x7fELF");
        short[4] = 2;
        short[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
        short[54..56].copy_from_slice(&56u16.to_le_bytes());
        short[56..58].copy_from_slice(&3u16.to_le_bytes());
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&short).unwrap();
        assert!(load_ranges(&f).is_empty());
    }

    fn resident_pages(mem: &GuestMemoryMmap, start: u64, len: usize) -> usize {
        let slice = mem.get_slice(GuestAddress(start), len).unwrap();
        let mut vec = vec![0u8; len.div_ceil(4096)];
        // SAFETY: the range is mapped guest memory, page-aligned; `vec`
        // has one byte per page of it.
        let rc =
            unsafe { libc::mincore(slice.ptr_guard_mut().as_ptr().cast(), len, vec.as_mut_ptr()) };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
        vec.iter().filter(|b| **b & 1 == 1).count()
    }

    #[test]
    fn the_kernel_s_segments_are_made_resident_before_the_copy_and_nothing_else() {
        let mem = super::super::memory::create(64).unwrap().guest;
        let (at, len) = (16u64 << 20, 1usize << 20);
        assert_eq!(resident_pages(&mem, at, len), 0);
        // A segment that ends mid-page, and one outside guest memory.
        prefault(&mem, &elf(&[(1, at, len as u64 - 100), (1, 1 << 40, 4096)]));
        assert_eq!(resident_pages(&mem, at, len), len / 4096);
        assert_eq!(resident_pages(&mem, at + len as u64, len), 0);
    }
}
