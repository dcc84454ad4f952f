//! The port-I/O and MMIO buses: which device answers a vCPU's access to
//! an address.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// A device on a bus; `offset` is from the start of its range.
pub trait BusDevice: Send {
    fn read(&mut self, offset: u64, data: &mut [u8]);
    fn write(&mut self, offset: u64, data: &[u8]);
}

#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("the range {base:#x}+{len:#x} is empty or wraps around")]
    BadRange { base: u64, len: u64 },
    #[error("the range {base:#x}+{len:#x} overlaps a device already there")]
    Overlap { base: u64, len: u64 },
}

struct Entry {
    len: u64,
    device: Arc<Mutex<dyn BusDevice>>,
}

/// Devices by address range; ranges never overlap. Shared by the vCPUs.
#[derive(Default)]
pub struct Bus {
    ranges: RwLock<BTreeMap<u64, Entry>>,
    /// Accesses that no device answered (reads of them return zeros).
    unhandled: AtomicU64,
}

impl Bus {
    pub fn new() -> Bus {
        Bus::default()
    }

    pub fn insert(
        &self,
        device: Arc<Mutex<dyn BusDevice>>,
        base: u64,
        len: u64,
    ) -> Result<(), BusError> {
        let end = base
            .checked_add(len)
            .filter(|_| len > 0)
            .ok_or(BusError::BadRange { base, len })?;
        let mut ranges = self.ranges.write().unwrap_or_else(|e| e.into_inner());
        let before = ranges.range(..end).next_back();
        if before.is_some_and(|(b, e)| b + e.len > base) {
            return Err(BusError::Overlap { base, len });
        }
        ranges.insert(base, Entry { len, device });
        Ok(())
    }

    /// The device whose range holds all of `[addr, addr + size)`.
    fn find(&self, addr: u64, size: usize) -> Option<(Arc<Mutex<dyn BusDevice>>, u64)> {
        let ranges = self.ranges.read().unwrap_or_else(|e| e.into_inner());
        let (base, entry) = ranges.range(..=addr).next_back()?;
        let offset = addr - base;
        let end = offset.checked_add(size as u64)?;
        (end <= entry.len).then(|| (entry.device.clone(), offset))
    }

    /// A vCPU's read: false when no device answered (`data` is zeroed).
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.find(addr, data.len()) {
            Some((device, offset)) => {
                lock(&device).read(offset, data);
                true
            }
            None => {
                data.fill(0);
                self.unhandled.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// A vCPU's write: false when no device took it.
    pub fn write(&self, addr: u64, data: &[u8]) -> bool {
        match self.find(addr, data.len()) {
            Some((device, offset)) => {
                lock(&device).write(offset, data);
                true
            }
            None => {
                self.unhandled.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Accesses no device answered.
    pub fn unhandled(&self) -> u64 {
        self.unhandled.load(Ordering::Relaxed)
    }
}

fn lock<T: ?Sized>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Recorder {
        writes: Vec<(u64, Vec<u8>)>,
    }

    impl BusDevice for Recorder {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8);
        }
        fn write(&mut self, offset: u64, data: &[u8]) {
            self.writes.push((offset, data.to_vec()));
        }
    }

    #[test]
    fn accesses_reach_the_device_whose_range_holds_them() {
        let a = Arc::new(Mutex::new(Recorder::default()));
        let b = Arc::new(Mutex::new(Recorder::default()));
        let bus = Bus::new();
        bus.insert(a.clone(), 0x1000, 0x100).unwrap();
        bus.insert(b.clone(), 0x1100, 0x100).unwrap();
        assert!(bus.write(0x1004, &[1, 2]));
        assert!(bus.write(0x1100, &[3]));
        let mut data = [0xffu8; 2];
        assert!(bus.read(0x10fe, &mut data));
        assert_eq!(data, [0xfe, 0xfe]);
        assert_eq!(a.lock().unwrap().writes, vec![(4, vec![1, 2])]);
        assert_eq!(b.lock().unwrap().writes, vec![(0, vec![3])]);
        // Outside every range, or straddling the end of one.
        assert!(!bus.write(0xfff, &[0]));
        assert!(!bus.write(0x11ff, &[0, 0]));
        assert!(!bus.read(0x1200, &mut data));
        assert_eq!(data, [0, 0]);
        assert_eq!(bus.unhandled(), 3);
    }

    #[test]
    fn overlapping_and_wrapping_ranges_are_refused() {
        let bus = Bus::new();
        let d = Arc::new(Mutex::new(Recorder::default()));
        bus.insert(d.clone(), 0x1000, 0x100).unwrap();
        assert!(matches!(
            bus.insert(d.clone(), 0x10ff, 1),
            Err(BusError::Overlap { .. })
        ));
        assert!(matches!(
            bus.insert(d.clone(), 0xf00, 0x101),
            Err(BusError::Overlap { .. })
        ));
        assert!(matches!(
            bus.insert(d.clone(), u64::MAX, 2),
            Err(BusError::BadRange { .. })
        ));
        assert!(matches!(
            bus.insert(d.clone(), 0x2000, 0),
            Err(BusError::BadRange { .. })
        ));
        bus.insert(d, 0xf00, 0x100).unwrap();
        assert!(!bus.write(u64::MAX, &[0, 0]));
    }
}
