//! fp-backup helpers shared by the backup tests.

use fp_backup::ChunkSource;

/// A disk in the test's memory, for `fp_backup::backup`.
pub struct VecSource(pub Vec<u8>);

impl ChunkSource for VecSource {
    fn read(&mut self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let at = offset as usize;
        buf.copy_from_slice(&self.0[at..at + buf.len()]);
        Ok(())
    }
}
