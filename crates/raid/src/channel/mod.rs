//! The raid bdev's per-core channels, one file per level. (placeholder: io owns this folder)
