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
