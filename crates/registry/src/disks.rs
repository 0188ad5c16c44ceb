//! The registry's disks (`fp_bdev::Disk`: a bdev with statistics and events), for the iostat
//! and histogram methods.

use fp_bdev::Disk;

use crate::{Registry, RegistryError};

impl Registry {
    /// The disk of bdev `name` (its name or an alias).
    pub fn disk(&self, name: &str) -> Result<Disk, RegistryError> {
        let st = self.lock();
        st.entry(name)
            .map(|e| e.disk.clone())
            .ok_or_else(|| RegistryError::NotFound { kind: "bdev", name: name.into() })
    }

    /// Every bdev's disk, by name.
    pub fn disks(&self) -> Vec<(String, Disk)> {
        self.lock().bdevs.iter().map(|(n, e)| (n.clone(), e.disk.clone())).collect()
    }
}
