//! A disk's bitmap methods (`bdev_dirty_bitmap_*`): the named bitmaps in the disk's book, the
//! epoch that tells channels to pick up a new set, and the persistent ones' files. The bitmap
//! itself, a plain type, is `bitmaps.rs`.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::bitmaps::{BitmapError, DirtyBitmap};
use super::shared::Disk;
use crate::BlockDevice;

impl Disk {
    fn find_bitmap(
        book: &super::shared::Book,
        bdev: &str,
        name: &str,
    ) -> Result<Arc<DirtyBitmap>, BitmapError> {
        book.bitmaps
            .iter()
            .find(|b| b.name == name)
            .cloned()
            .ok_or_else(|| BitmapError::NotFound { bdev: bdev.to_string(), name: name.to_string() })
    }

    /// The bitmap `name`, refused when inconsistent (every use but listing and removal).
    pub fn dirty_bitmap(&self, name: &str) -> Result<Arc<DirtyBitmap>, BitmapError> {
        let b = Self::find_bitmap(&self.book(), &self.info().name, name)?;
        if b.inconsistent() {
            return Err(BitmapError::Inconsistent(name.to_string()));
        }
        Ok(b)
    }

    /// Adds `bitmap` (made by the caller at this disk's size); channels mark it from their
    /// next poll on.
    pub fn add_dirty_bitmap(&self, bitmap: DirtyBitmap) -> Result<Arc<DirtyBitmap>, BitmapError> {
        if !self.0.accounting {
            return Err(BitmapError::AccountingOff);
        }
        let mut book = self.book();
        if book.bitmaps.iter().any(|b| b.name == bitmap.name) {
            return Err(BitmapError::Exists { bdev: self.info().name.clone(), name: bitmap.name });
        }
        let bitmap = Arc::new(bitmap);
        book.bitmaps.push(bitmap.clone());
        self.publish_bitmaps(&mut book);
        Ok(bitmap)
    }

    /// Removes `name` (inconsistent or not); returns it. Refused while held (an export reads
    /// it, a backup job took it).
    pub fn remove_dirty_bitmap(&self, name: &str) -> Result<Arc<DirtyBitmap>, BitmapError> {
        let mut book = self.book();
        let b = Self::find_bitmap(&book, &self.info().name, name)?;
        b.change_unless_held(&self.info().name, |_| ())?;
        book.bitmaps.retain(|x| !Arc::ptr_eq(x, &b));
        self.publish_bitmaps(&mut book);
        Ok(b)
    }

    /// `clear`: every bit cleared. Refused while held: a backup job's next incremental would
    /// miss the writes since its take, an export's client would see its bits vanish.
    pub fn clear_dirty_bitmap(&self, name: &str) -> Result<(), BitmapError> {
        self.dirty_bitmap(name)?.change_unless_held(&self.info().name, |b| {
            b.take();
        })
    }

    /// Every bitmap of the disk, in the order they were added.
    pub fn dirty_bitmaps(&self) -> Vec<Arc<DirtyBitmap>> {
        self.book().bitmaps.clone()
    }

    /// `enable` / `disable`: whether completed writes mark it. Refused while held.
    pub fn set_dirty_bitmap_recording(&self, name: &str, on: bool) -> Result<(), BitmapError> {
        self.dirty_bitmap(name)?
            .change_unless_held(&self.info().name, |b| b.recording.store(on, Ordering::SeqCst))
    }

    /// `merge`: sets in `target` every bit of each of `sources`, which must have its
    /// granularity and size. Nothing changes when one is refused, held ones included (into a
    /// held target or from a held source, as QEMU refuses a busy bitmap either way).
    pub fn merge_dirty_bitmaps(&self, target: &str, sources: &[String]) -> Result<(), BitmapError> {
        let bdev = &self.info().name;
        let t = self.dirty_bitmap(target)?;
        t.change_unless_held(bdev, |_| ())?;
        let mut frozen = Vec::with_capacity(sources.len());
        for s in sources {
            let b = self.dirty_bitmap(s)?;
            if b.granularity() != t.granularity() || b.len != t.len {
                return Err(BitmapError::Invalid {
                    field: "bitmaps",
                    reason: format!(
                        "'{s}' ({} bytes in chunks of {}) differs from target '{target}' ({} in chunks of {})",
                        b.len,
                        b.granularity(),
                        t.len,
                        t.granularity()
                    ),
                });
            }
            // Each source's bits are read under its holders' lock: one held is refused.
            frozen.push(b.change_unless_held(bdev, DirtyBitmap::snapshot)?);
        }
        // The target checked again as it changes: a hold taken meanwhile wins.
        t.change_unless_held(bdev, |t| {
            for f in &frozen {
                t.merge_from(f);
            }
        })
    }

    /// Hands channels the current set (under the book's lock).
    fn publish_bitmaps(&self, book: &mut super::shared::Book) {
        book.bitmap_set = (!book.bitmaps.is_empty()).then(|| Arc::from(book.bitmaps.clone()));
        self.0.bitmap_epoch.fetch_add(1, Ordering::SeqCst);
    }
}
